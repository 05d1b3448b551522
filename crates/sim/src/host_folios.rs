//! Host huge pages (`--host-pages thp`): each VM's RAM backed by 2 MiB host folios, as QEMU's
//! RAM is with THP `always` (docs/host.md, "Host huge pages"), every whole block huge at the
//! start. `--host-pages 4k` maps every block with 4 KiB pages (THP `never`): no folio, every
//! access pays the lost TLB reach.
//!
//! What the kernel does with them, and the simulator with it:
//! - **Moves.** move_pages(2) on any 4 KiB page of a PMD-mapped THP moves the whole folio
//!   (docs/peers.md, "Host huge pages and migration"): a move touching a huge block takes all of
//!   it, for every policy, at 2 MiB of migration. When the target node cannot take 2 MiB the
//!   kernel splits the folio and moves base pages instead (mm/migrate.c, `migrate_pages_batch`:
//!   a large folio that gets `-ENOMEM` is split and retried).
//! - **Splits.** A policy asks (`HostPagesAware::take_splits`); the block becomes 512 4 KiB
//!   pages where they are, and accesses to it lose the huge page's TLB reach
//!   (`HostPagesModel::split_access_ns`).
//! - **Collapses.** khugepaged walks the VMs' RAM in 2 MiB steps at its default pace and
//!   collapses a block mapped with 4 KiB pages that the guest touched, copying it onto the node
//!   holding most of its pages (`collapse_target`).

use crate::model::HostPagesModel;
use crate::sim::{FAST, SLOW};
use std::ops::Range;
use vtism_engine::{Nanos, NodeId, VmId};
use vtism_proto::{Gfn, FRAME_SIZE, HUGE_FRAMES};

/// What a policy hears from and asks of the host's huge pages, besides placement (which comes
/// through `Policy::set_placement`).
pub trait HostPagesAware {
    /// The blocks of `vm` the host maps huge changed (a split carried out, a collapse): their
    /// heads now. Called once at admission with every block.
    fn host_folios_changed(&mut self, _vm: VmId, _heads: &[Gfn]) {}
    /// Blocks the policy wants split now, by head. The simulator splits those still huge.
    fn take_splits(&mut self, _now: Nanos) -> Vec<(VmId, Gfn)> {
        Vec::new()
    }
}

/// Which 2 MiB blocks of one VM's RAM the host maps huge, in the simulator's placement units
/// (a unit never straddles two blocks: units are powers of two up to 2 MiB).
#[derive(Clone, Debug)]
pub struct HostBacking {
    units_per_block: usize,
    units: usize,
    huge: Vec<bool>,
    /// Blocks split and collapsed so far.
    pub splits: u64,
    pub collapses: u64,
}

impl HostBacking {
    /// Every block mapped with 4 KiB pages (THP `never`).
    pub fn all_base(units: usize, unit_bytes: u64) -> HostBacking {
        let mut h = HostBacking::all_huge(units, unit_bytes);
        h.huge.iter_mut().for_each(|x| *x = false);
        h
    }

    /// Every whole block huge; a block cut short by the end of RAM is mapped with 4 KiB pages.
    pub fn all_huge(units: usize, unit_bytes: u64) -> HostBacking {
        let units_per_block = ((HUGE_FRAMES * FRAME_SIZE) / unit_bytes).max(1) as usize;
        let blocks = units.div_ceil(units_per_block);
        let huge = (0..blocks)
            .map(|b| (b + 1) * units_per_block <= units)
            .collect();
        HostBacking {
            units_per_block,
            units,
            huge,
            splits: 0,
            collapses: 0,
        }
    }

    pub fn units_per_block(&self) -> usize {
        self.units_per_block
    }

    pub fn blocks(&self) -> usize {
        self.huge.len()
    }

    pub fn block_of(&self, unit: usize) -> usize {
        unit / self.units_per_block
    }

    pub fn units_of(&self, block: usize) -> Range<usize> {
        block * self.units_per_block..((block + 1) * self.units_per_block).min(self.units)
    }

    pub fn is_huge(&self, block: usize) -> bool {
        self.huge.get(block).copied().unwrap_or(false)
    }

    pub fn unit_is_huge(&self, unit: usize) -> bool {
        self.is_huge(self.block_of(unit))
    }

    /// Heads of the blocks mapped huge, in order.
    pub fn heads(&self) -> Vec<Gfn> {
        (0..self.huge.len())
            .filter(|&b| self.huge[b])
            .map(|b| Gfn(b as u64 * HUGE_FRAMES))
            .collect()
    }

    /// The block headed by `head`, if it is a block of this RAM.
    pub fn block_of_head(&self, head: Gfn) -> Option<usize> {
        let b = (head.0 / HUGE_FRAMES) as usize;
        (head.0.is_multiple_of(HUGE_FRAMES) && b < self.huge.len()).then_some(b)
    }

    /// The units a move of units `u0..u1` takes: widened to the whole of every huge block it
    /// touches (only the first and the last block can be touched in part).
    pub fn widen(&self, u0: usize, u1: usize) -> (usize, usize) {
        if u0 >= u1 {
            return (u0, u1);
        }
        let first = self.block_of(u0);
        let last = self.block_of(u1 - 1);
        let w0 = if self.is_huge(first) {
            self.units_of(first).start
        } else {
            u0
        };
        let w1 = if self.is_huge(last) {
            self.units_of(last).end
        } else {
            u1
        };
        (w0, w1)
    }

    /// Page mappings a move of `frames(u)` frames of each unit in `u0..u1` unmaps: one per huge
    /// block, one per 4 KiB frame elsewhere.
    pub fn mappings(&self, u0: usize, u1: usize, frames: impl Fn(usize) -> u64) -> u64 {
        let mut n = 0;
        let mut u = u0;
        while u < u1 {
            let b = self.block_of(u);
            let end = self.units_of(b).end.min(u1);
            n += if self.is_huge(b) {
                1
            } else {
                (u..end).map(&frames).sum()
            };
            u = end;
        }
        n
    }

    /// Maps block `block` with 4 KiB pages. False if it was not huge.
    pub fn split(&mut self, block: usize) -> bool {
        match self.huge.get_mut(block) {
            Some(h) if *h => {
                *h = false;
                self.splits += 1;
                true
            }
            _ => false,
        }
    }

    /// khugepaged's look at `block`, whose units hold `fast[u]` of their `fpu` frames in fast
    /// memory: a whole block mapped with 4 KiB pages that the guest `referenced` is collapsed
    /// onto `collapse_target`, which must have 2 MiB free (the new page is allocated before the
    /// old ones are freed); on a tie the other node may take it. Updates `fast`.
    pub fn try_collapse(
        &mut self,
        block: usize,
        fast: &mut [u32],
        fpu: u64,
        referenced: bool,
        free_frames: impl Fn(NodeId) -> u64,
    ) -> Option<Collapse> {
        let units = self.units_of(block);
        let whole = units.len() == self.units_per_block;
        if self.is_huge(block) || !whole || !referenced {
            return None;
        }
        let on_fast: u64 = fast[units.clone()].iter().map(|&f| u64::from(f)).sum();
        let on_slow = HUGE_FRAMES - on_fast;
        let first = collapse_target(on_fast, on_slow);
        let tie = on_fast == on_slow;
        let to = [first, if first == FAST { SLOW } else { FAST }]
            .into_iter()
            .take(if tie { 2 } else { 1 })
            .find(|&n| free_frames(n) >= HUGE_FRAMES)?;
        for u in units {
            fast[u] = if to == FAST { fpu as u32 } else { 0 };
        }
        self.huge[block] = true;
        self.collapses += 1;
        Some(Collapse {
            block,
            to,
            from_fast: on_fast,
            from_slow: on_slow,
        })
    }
}

/// A collapse khugepaged made: the block, where it put it, and where its 512 pages came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Collapse {
    pub block: usize,
    pub to: NodeId,
    pub from_fast: u64,
    pub from_slow: u64,
}

impl Collapse {
    /// Frames that crossed tiers.
    pub fn moved_frames(&self) -> u64 {
        if self.to == FAST {
            self.from_slow
        } else {
            self.from_fast
        }
    }
}

/// Where khugepaged allocates a collapsed block: the node holding most of its pages, the first
/// such node on a tie (mm/khugepaged.c, `hpage_collapse_find_target_node`: "find first node with
/// max normal pages hit"; the fast node is node 0 here).
pub fn collapse_target(on_fast: u64, on_slow: u64) -> NodeId {
    if on_fast >= on_slow {
        FAST
    } else {
        SLOW
    }
}

/// khugepaged's walk over every VM's RAM: it wakes every `khugepaged_scan_sleep_ms` and scans
/// `khugepaged_pages_to_scan` pages of progress, 512 per 2 MiB range whether it collapses it or
/// not (mm/khugepaged.c, `khugepaged_scan_mm_slot`), one VM (QEMU process) after the other.
/// Where its walk stands when the run starts is not known (a pass over 16 GiB takes hours): it
/// starts at a block drawn from the run's seed.
#[derive(Clone, Debug)]
pub struct Khugepaged {
    sleep_s: f64,
    ranges_per_wake: usize,
    next_wake: f64,
    vm: usize,
    block: usize,
}

impl Khugepaged {
    /// Starting at the `start`-th block of all VMs' blocks (`blocks[k]`: VM k's), in order.
    pub fn new(m: &HostPagesModel, blocks: &[usize], start: usize) -> Khugepaged {
        let (mut vm, mut block) = (0, start);
        while vm + 1 < blocks.len() && block >= blocks[vm] {
            block -= blocks[vm];
            vm += 1;
        }
        Khugepaged {
            sleep_s: m.khugepaged_scan_sleep_ms / 1e3,
            ranges_per_wake: m.khugepaged_pages_to_scan.div_ceil(HUGE_FRAMES).max(1) as usize,
            next_wake: m.khugepaged_scan_sleep_ms / 1e3,
            vm,
            block,
        }
    }

    /// The (VM, block) ranges scanned by time `t`, in scan order; `blocks[k]` is VM k's count.
    pub fn due(&mut self, t: f64, blocks: &[usize]) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        let total: usize = blocks.iter().sum();
        while self.next_wake <= t + 1e-9 {
            self.next_wake += self.sleep_s;
            if total == 0 {
                continue;
            }
            for _ in 0..self.ranges_per_wake.min(total) {
                while self.block >= blocks[self.vm] {
                    self.block = 0;
                    self.vm = (self.vm + 1) % blocks.len();
                }
                out.push((self.vm, self.block));
                self.block += 1;
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UNIT_4K: u64 = 4096;

    #[test]
    fn a_move_of_one_frame_of_a_folio_widens_to_its_512_frames() {
        // 3 blocks at 4 KiB units, the middle one split.
        let mut h = HostBacking::all_huge(3 * 512, UNIT_4K);
        assert!(h.split(1));
        assert!(!h.split(1), "a split block cannot be split again");
        assert_eq!(h.widen(700, 701), (700, 701), "4 KiB pages move alone");
        assert_eq!(h.widen(7, 8), (0, 512));
        assert_eq!(h.widen(511, 513), (0, 513));
        assert_eq!(h.widen(1023, 1025), (1023, 1536));
        // One mapping per huge block, one per 4 KiB frame elsewhere.
        assert_eq!(h.mappings(0, 1536, |_| 1), 1 + 512 + 1);
        assert_eq!(h.heads(), vec![Gfn(0), Gfn(1024)]);
        assert_eq!(h.splits, 1);
    }

    #[test]
    fn only_whole_blocks_start_huge() {
        let h = HostBacking::all_huge(2 * 512 + 3, UNIT_4K);
        assert_eq!(h.blocks(), 3);
        assert!(h.is_huge(0) && h.is_huge(1) && !h.is_huge(2));
        // At 2 MiB units every unit is a block.
        let h = HostBacking::all_huge(5, 2 << 20);
        assert_eq!((h.units_per_block(), h.heads().len()), (1, 5));
        assert_eq!(h.block_of_head(Gfn(1024)), Some(2));
        assert_eq!(h.block_of_head(Gfn(1000)), None);
    }

    #[test]
    fn a_collapse_lands_on_the_node_holding_most_of_the_block() {
        let mut h = HostBacking::all_huge(2 * 512, UNIT_4K);
        h.split(0);
        h.split(1);
        let mut fast = vec![0u32; 1024];
        // Block 0: 300 frames fast; block 1: 100 fast.
        fast[..300].iter_mut().for_each(|f| *f = 1);
        fast[512..612].iter_mut().for_each(|f| *f = 1);
        let room = |_: NodeId| 1 << 20;
        let c = h.try_collapse(0, &mut fast, 1, true, room).unwrap();
        assert_eq!((c.to, c.moved_frames()), (FAST, 212));
        assert!(fast[..512].iter().all(|&f| f == 1) && h.is_huge(0));
        let c = h.try_collapse(1, &mut fast, 1, true, room).unwrap();
        assert_eq!((c.to, c.moved_frames()), (SLOW, 100));
        assert!(fast[512..].iter().all(|&f| f == 0));
        assert_eq!(h.collapses, 2);
        // A huge block, an unreferenced one, or no room on the majority node: nothing.
        assert!(h.try_collapse(0, &mut fast, 1, true, room).is_none());
        h.split(1);
        assert!(h.try_collapse(1, &mut fast, 1, false, room).is_none());
        fast[512..1000].iter_mut().for_each(|f| *f = 1);
        let no_fast_room = |n: NodeId| if n == FAST { 511 } else { 1 << 20 };
        assert!(h
            .try_collapse(1, &mut fast, 1, true, no_fast_room)
            .is_none());
        // A tie goes to the fast node first, the slow one when the fast one is full.
        fast[512..1024]
            .iter_mut()
            .enumerate()
            .for_each(|(i, f)| *f = (i < 256) as u32);
        let c = h.try_collapse(1, &mut fast, 1, true, no_fast_room).unwrap();
        assert_eq!((c.to, collapse_target(256, 256)), (SLOW, FAST));
    }

    #[test]
    fn khugepaged_walks_eight_ranges_every_ten_seconds_vm_after_vm() {
        let mut k = Khugepaged::new(&HostPagesModel::default(), &[5, 6], 0);
        assert!(k.due(9.9, &[5, 6]).is_empty());
        let first = k.due(10.0, &[5, 6]);
        let want: Vec<(usize, usize)> = (0..5)
            .map(|b| (0, b))
            .chain((0..3).map(|b| (1, b)))
            .collect();
        assert_eq!(first, want);
        // Two wakes by t = 30 s: 16 more ranges, wrapping round both VMs.
        let next = k.due(30.0, &[5, 6]);
        assert_eq!(next.len(), 16);
        assert_eq!(&next[..4], &[(1, 3), (1, 4), (1, 5), (0, 0)]);
        // Started at the 7th block of all: VM 1's second.
        let mut k = Khugepaged::new(&HostPagesModel::default(), &[5, 6], 6);
        assert_eq!(k.due(10.0, &[5, 6])[0], (1, 1));
    }
}
