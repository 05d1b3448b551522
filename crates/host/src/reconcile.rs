//! Where each VM's pages really are. The kernel moves pages too (NUMA balancing, reclaim and
//! demotion), so each VM's RAM is queried with move_pages(2) (no move) once per
//! `mover.reconcile_sweep_s`, a slice every round, and hinted frames whose node the engine does
//! not know yet are looked up as they are hinted. The answers are placement facts for the
//! tiering round, which tells the engine what differs from its belief.

use crate::config::MoverConfig;
use crate::registry::ManagedVm;
use crate::sys;
use crate::topology::HostTopology;
use std::collections::BTreeMap;
use tracing::debug;
use vtism_engine::{NodeId, PlacementRun, Tiering, VmId};
use vtism_proto::{Gfn, HintEntry, Hva, HUGE_FRAMES};

/// Frames asked in one move_pages call.
const QUERY_FRAMES: usize = 65536;

/// Frames queried per round by all first sweeps together (4 GiB): until a VM's first sweep ends
/// the engine plans only for the frames it learnt, so first sweeps go fast (the hinted frames
/// are looked up at once meanwhile: `learn_hinted`), but VMs attached together, or a flood of
/// fake RAM claims, share one round's worth instead of each taking 16 GiB (issue 24: 16 fake
/// 22 GiB VMs made rounds of 4.7-6.5 s). A 22 GiB VM alone is swept in 6 rounds.
pub const FIRST_SWEEP_ROUND_FRAMES: u64 = 1 << 20;

/// How far a VM's sweep got.
#[derive(Clone, Copy, Debug, Default)]
struct Sweep {
    /// Dense index where the next query starts.
    cursor: u64,
    /// Completed passes over the VM's RAM.
    full_sweeps: u64,
}

#[derive(Default)]
pub struct Reconcile {
    by_vm: BTreeMap<VmId, Sweep>,
}

impl Reconcile {
    /// The VM's placement must be learned again from the start (new VM, new memory map, new
    /// engine): the first sweep runs at full speed.
    pub fn restart(&mut self, vm: VmId) {
        self.by_vm.insert(vm, Sweep::default());
    }

    pub fn remove(&mut self, vm: VmId) {
        self.by_vm.remove(&vm);
    }

    pub fn full_sweeps(&self, vm: VmId) -> u64 {
        self.by_vm.get(&vm).map_or(0, |s| s.full_sweeps)
    }

    /// VMs whose first sweep has not ended: they share `FIRST_SWEEP_ROUND_FRAMES` a round.
    pub fn first_sweeps(&self, vms: impl Iterator<Item = VmId>) -> u64 {
        vms.filter(|v| self.full_sweeps(*v) == 0).count() as u64
    }

    /// This round's slice of the VM's RAM: `reconcile_max_pages_per_round` at most, enough to
    /// cover the RAM once per sweep period (`interval_ms` per round). Until the first sweep
    /// completes the engine cannot plan for frames of unknown placement, so that one runs at
    /// `FIRST_SWEEP_ROUND_FRAMES` a round, shared by the `first_sweeps` VMs in theirs.
    pub fn sweep(
        &mut self,
        tiering: &mut Tiering,
        vm: &ManagedVm,
        topo: &HostTopology,
        cfg: &MoverConfig,
        interval_ms: u64,
        first_sweeps: u64,
    ) {
        let ram = &vm.memory.ram;
        let total = ram.frames();
        if total == 0 {
            return;
        }
        let s = self.by_vm.entry(vm.id).or_default();
        let (sweep_ms, cap) = (
            cfg.reconcile_sweep_s * 1000,
            cfg.reconcile_max_pages_per_round,
        );
        let budget = if s.full_sweeps == 0 {
            (FIRST_SWEEP_ROUND_FRAMES / first_sweeps.max(1)).max(512)
        } else {
            (total.saturating_mul(interval_ms) / sweep_ms + 1).min(cap)
        };
        let mut left = budget.min(total);
        while left > 0 {
            let start = s.cursor % total;
            let n = left.min(total - start).min(QUERY_FRAMES as u64);
            match query_dense(vm, start, n, topo) {
                Ok(facts) => {
                    tiering.learn(facts);
                }
                Err(e) => {
                    debug!(vm = %vm.name, error = %e, "placement query failed");
                    break;
                }
            }
            s.cursor = (start + n) % total;
            if s.cursor == 0 {
                s.full_sweeps += 1;
            }
            left -= n;
        }
    }
}

/// Where the frames at dense indexes `[first, first + n)` are, as runs of one node.
fn query_dense(
    vm: &ManagedVm,
    first: u64,
    n: u64,
    topo: &HostTopology,
) -> std::io::Result<Vec<PlacementRun>> {
    let (gfns, addrs) = vm.memory.dense_frames(first, n);
    let mut status = vec![0i32; addrs.len()];
    sys::move_pages(vm.pid, &addrs, None, &mut status, 0)?;
    let mut runs: Vec<PlacementRun> = Vec::new();
    for (&g, st) in gfns.iter().zip(status) {
        let node = node_of(st, topo);
        match runs.last_mut() {
            Some(r) if r.node == node && r.gfn.0 + r.frames == g.0 => r.frames += 1,
            _ => runs.push(PlacementRun::frame(vm.id, g, node)),
        }
    }
    Ok(runs)
}

/// The node a move_pages status names, if it is one of the topology's.
fn node_of(status: i32, topo: &HostTopology) -> Option<NodeId> {
    u8::try_from(status)
        .ok()
        .map(NodeId)
        .filter(|n| topo.node(*n).is_some())
}

/// Hinted frames whose node the engine does not know yet (first touched after the last sweep)
/// are looked up now, so they can be planned this round rather than after the next sweep.
pub fn learn_hinted(
    tiering: &mut Tiering,
    vm: &ManagedVm,
    entries: &[HintEntry],
    topo: &HostTopology,
) {
    let gfns = unknown_hinted(tiering, vm.id, entries);
    if gfns.is_empty() {
        return;
    }
    match query(vm, &gfns, topo) {
        Ok(facts) => {
            tiering.learn(facts);
        }
        Err(e) => debug!(vm = %vm.name, error = %e, "placement query of hinted frames failed"),
    }
}

/// Frames `unknown_hinted` looks at per round at most (an entry it passes over counts one): the
/// guest decides what a round holds, so the look-up is bounded by this, not by the round. Frames
/// not looked at wait for the sweep.
pub const LEARN_EXAMINE_FRAMES: usize = QUERY_FRAMES;

/// Entries remembered to pass over repeats: a guest repeating a few units costs an entry each.
const RECENT_ENTRIES: usize = 8;

/// The hinted frames whose node the engine does not know, sorted and each once, from at most
/// `LEARN_EXAMINE_FRAMES` frames and entries looked at; an entry naming the frame of one of the
/// last few is passed over.
pub fn unknown_hinted(tiering: &Tiering, vm: VmId, entries: &[HintEntry]) -> Vec<Gfn> {
    let mut gfns = Vec::new();
    let mut examined = 0usize;
    let mut recent = [Gfn(u64::MAX); RECENT_ENTRIES];
    'entries: for (n, e) in entries.iter().enumerate() {
        examined += 1;
        if examined > LEARN_EXAMINE_FRAMES {
            break;
        }
        if recent.contains(&e.gfn()) {
            continue;
        }
        recent[n % RECENT_ENTRIES] = e.gfn();
        for i in 0..e.frames() {
            examined += usize::from(i > 0);
            if examined > LEARN_EXAMINE_FRAMES {
                break 'entries;
            }
            let g = Gfn(e.gfn().0 + i);
            if matches!(tiering.engine().frame_node(vm, g), Ok(None)) {
                gfns.push(g);
                if gfns.len() >= QUERY_FRAMES {
                    break 'entries;
                }
            }
        }
    }
    gfns.sort_unstable();
    gfns.dedup();
    gfns
}

/// Where the VM's host folios are, from their heads: a block mapped huge is one page on one node.
/// The kernel makes such pages by itself (khugepaged collapses a split block onto the node
/// holding most of it, its zero pages filled there), and learning that at the backing read that
/// finds the block huge, rather than when the sweep reaches it, lets the next round restore the
/// quota: with host THP on, the testbed's guest held 21.9 MiB of DRAM against its 20 MiB quota
/// for 32 s after a collapse, until the sweep came (docs/testbed.md, "2026-11-30").
pub fn learn_folios(tiering: &mut Tiering, vm: &ManagedVm, heads: &[Gfn], topo: &HostTopology) {
    let whole: Vec<Gfn> = heads
        .iter()
        .copied()
        .filter(|&h| vm.memory.ram.contains_span(h, HUGE_FRAMES))
        .collect();
    for chunk in whole.chunks(QUERY_FRAMES) {
        match query(vm, chunk, topo) {
            Ok(facts) => {
                tiering.learn(facts.into_iter().map(|f| PlacementRun {
                    frames: HUGE_FRAMES,
                    ..f
                }));
            }
            Err(e) => {
                debug!(vm = %vm.name, error = %e, "placement query of host folios failed");
                break;
            }
        }
    }
}

/// Where `gfns` are in QEMU's memory, one fact per frame with a host address: a node of the
/// topology, or `None` (not present, or a node vtismd does not use).
fn query(vm: &ManagedVm, gfns: &[Gfn], topo: &HostTopology) -> std::io::Result<Vec<PlacementRun>> {
    let (gfns, addrs): (Vec<Gfn>, Vec<Hva>) = gfns
        .iter()
        .filter_map(|&g| vm.memory.hva(g).map(|a| (g, a)))
        .unzip();
    let mut status = vec![0i32; addrs.len()];
    sys::move_pages(vm.pid, &addrs, None, &mut status, 0)?;
    Ok(gfns
        .iter()
        .zip(status)
        .map(|(&g, st)| PlacementRun::frame(vm.id, g, node_of(st, topo)))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;
    use vtism_engine::{
        EngineParams, FastPool, Nanos, NodeSpec, PoolParams, Tier, Topology, VmLimits, VmSpec,
        VtismPolicy,
    };
    use vtism_proto::{PageType, RamMap};

    fn tiering(frames: u64) -> Tiering {
        let node = |id, tier| NodeSpec {
            id: NodeId(id),
            tier: Tier(tier),
            capacity_bytes: 1 << 40,
            cpus: vec![0],
            socket: 0,
        };
        let topo = Topology::new(vec![node(0, 0), node(1, 1)], None).unwrap();
        let engine = VtismPolicy::new(topo, EngineParams::default()).unwrap();
        let pool = FastPool::new(PoolParams {
            fast_bytes: 1 << 30,
            ..Default::default()
        })
        .unwrap();
        let mut t = Tiering::new(engine, pool);
        let ram = RamMap::contiguous(frames);
        let spec = VmSpec {
            id: VmId(1),
            ram,
            fast_quota_bytes: 0,
            home_node: Some(NodeId(0)),
        };
        let limits = VmLimits {
            min_bytes: 0,
            max_bytes: 1 << 30,
            shares: 1,
        };
        t.add_vm(spec, limits, Nanos(0)).unwrap();
        t
    }

    fn unit(gfn: u64) -> HintEntry {
        HintEntry::new(Gfn(gfn), 200, false, PageType::Anon, true, true)
    }

    /// Issue 14's flood: 1 Mi entries naming 2 MiB units over and over. The look-up stops after
    /// `LEARN_EXAMINE_FRAMES` frames, whatever the round holds, and still finds unknown frames.
    #[test]
    fn learning_hinted_frames_is_bounded() {
        let frames = 1u64 << 20;
        let mut t = tiering(frames);
        // Placement known everywhere but in the last unit.
        t.learn([PlacementRun {
            vm: VmId(1),
            gfn: Gfn(0),
            frames: frames - 512,
            node: Some(NodeId(1)),
        }]);
        let heads = [0u64, 512, 1024, frames - 512];
        let flood: Vec<HintEntry> = (0..1usize << 20).map(|i| unit(heads[i % 4])).collect();
        let t0 = Instant::now();
        let found = unknown_hinted(&t, VmId(1), &flood);
        eprintln!("1 Mi duplicate units looked over in {:?}", t0.elapsed());
        assert_eq!(found.len(), 512, "the last unit's frames");
        assert!(found.iter().all(|g| g.0 >= frames - 512));
        // Every frame known: the look-up gives up after the bound, not after 512 Mi frames.
        t.learn([PlacementRun {
            vm: VmId(1),
            gfn: Gfn(frames - 512),
            frames: 512,
            node: Some(NodeId(0)),
        }]);
        let same: Vec<HintEntry> = vec![unit(0); 1 << 20];
        assert!(unknown_hinted(&t, VmId(1), &same).is_empty());
        assert!(unknown_hinted(&t, VmId(1), &flood).is_empty());
        // 4 KiB entries for unknown frames are found in order, up to one query's worth.
        let mut t = tiering(frames);
        let small: Vec<HintEntry> = (0..frames)
            .map(|g| HintEntry::new(Gfn(g), 9, false, PageType::Anon, false, true))
            .collect();
        let found = unknown_hinted(&t, VmId(1), &small);
        assert_eq!(found.len(), LEARN_EXAMINE_FRAMES);
        assert_eq!(found[..3], [Gfn(0), Gfn(1), Gfn(2)]);
        // Units repeated in an order the recent entries do not catch: bounded all the same.
        let many: Vec<HintEntry> = (0..1u64 << 20).map(|i| unit(i % 64 * 512)).collect();
        assert_eq!(unknown_hinted(&t, VmId(1), &many).len(), 64 * 512);
        t.learn([PlacementRun::frame(VmId(1), Gfn(5), Some(NodeId(0)))]);
        assert!(!unknown_hinted(&t, VmId(1), &small).contains(&Gfn(5)));
    }
}
