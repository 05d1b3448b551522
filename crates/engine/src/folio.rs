//! Host folios: the 2 MiB blocks of a VM's RAM that the host maps with one huge page (a THP, or
//! a hugetlbfs page), and the rule that turns 4 KiB observations into the folio's.
//!
//! move_pages(2) on one 4 KiB page of a host folio moves the whole folio, so the engine places
//! such a block as one unit (the planner's 2 MiB unit) and counts all of its frames against the
//! quota. The driver says which blocks are folios (`VtismPolicy::set_host_folios`); the guest
//! cannot see them and keeps hinting 4 KiB frames.
//!
//! **The rule: a folio is as hot as the mean rate of its 512 frames** (frames not hinted count as
//! not accessed). Fast memory is bought by the byte and pays back in accesses, so accesses per
//! byte ranks a 4 KiB frame and a 2 MiB folio on one scale: a folio holding one hot frame and
//! 511 cold ones earns about what that one frame would, spread over 512 times the room, and ranks
//! with lukewarm frames, not with the hot one. The hottest frame's rate would rank it with hot
//! frames and fill a quota with cold data; the sum would favour folios over 4 KiB frames holding
//! the same data.

//!
//! **Split or not.** A folio whose hot frames are fewer than half of it spends, whole, more DRAM
//! on cold data than on hot. When the VM's hot set does not fit its quota (the planner had to
//! leave hot frames out), such a folio is worth splitting: its hot frames then compete one by
//! one and its cold ones stay in slow memory. Memtis decides page size by the same measure, the
//! hot share of a huge page. Without that pressure every folio stays whole and the guest keeps
//! the huge page's TLB reach. The engine only asks (`SplitRequest`); the driver splits what the
//! kernel lets it (a THP, not a hugetlbfs page) and says so at its next backing read.

use vtism_proto::count::{level_of_rate, rate_hz};
use vtism_proto::entry::GFN_MASK;
use vtism_proto::{CountMeaning, Gfn, HintEntry, PageType, RamMap, HUGE_FRAMES};

const BLOCK_SHIFT: u32 = HUGE_FRAMES.trailing_zeros();

/// The whole 2 MiB blocks of one RAM range, one bit each.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct RangeBlocks {
    /// Blocks `[first, end)` (guest frame number >> 9).
    first: u64,
    end: u64,
    bits: Vec<u64>,
}

impl RangeBlocks {
    /// Bit index of `block` in this range, if the range holds it whole.
    fn index(&self, block: u64) -> Option<(usize, u64)> {
        (block >= self.first && block < self.end).then(|| {
            (
                ((block - self.first) / 64) as usize,
                (block - self.first) % 64,
            )
        })
    }

    fn has(&self, block: u64) -> bool {
        self.index(block)
            .is_some_and(|(w, b)| self.bits[w] >> b & 1 != 0)
    }
}

/// Which 2 MiB blocks of a VM's RAM are host folios.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostFolios {
    ranges: Vec<RangeBlocks>,
    count: u64,
    /// Folios only partly guest RAM (a hole such as the PC's 640 KiB - 1 MiB cuts them, or two
    /// RAM ranges meet inside them), by block, in order. The planner cannot move them as one
    /// unit, and moving one of their frames would take the rest along, uncounted: their frames
    /// are never promoted.
    partial: Vec<u64>,
}

impl HostFolios {
    /// The folios headed by `heads`: placed whole where a head is 2 MiB aligned and its block
    /// lies wholly in one RAM range of `ram`; kept as partial where the block is only partly RAM
    /// (or spans two ranges); dropped where it holds no RAM or the head is not aligned.
    pub fn new(ram: &RamMap, heads: impl IntoIterator<Item = Gfn>) -> HostFolios {
        let mut ranges: Vec<RangeBlocks> = ram
            .ranges()
            .iter()
            .map(|r| {
                let first = r.start.0.div_ceil(HUGE_FRAMES);
                let end = (r.end.0 >> BLOCK_SHIFT).max(first);
                RangeBlocks {
                    first,
                    end,
                    bits: vec![0; (end - first).div_ceil(64) as usize],
                }
            })
            .collect();
        let mut count = 0;
        let mut partial = Vec::new();
        for head in heads {
            if head.0 % HUGE_FRAMES != 0 {
                continue;
            }
            let block = head.0 >> BLOCK_SHIFT;
            if let Some((r, (w, b))) = ranges
                .iter_mut()
                .find_map(|r| r.index(block).map(|i| (r, i)))
            {
                if r.bits[w] >> b & 1 == 0 {
                    r.bits[w] |= 1 << b;
                    count += 1;
                }
            } else if ram
                .ranges()
                .iter()
                .any(|r| r.start.0 < head.0.saturating_add(HUGE_FRAMES) && head.0 < r.end.0)
            {
                partial.push(block);
            }
        }
        ranges.retain(|r| r.bits.iter().any(|&w| w != 0));
        partial.sort_unstable();
        partial.dedup();
        HostFolios {
            ranges,
            count,
            partial,
        }
    }

    /// Heads of the folios that are only partly guest RAM, in order.
    pub fn partial_heads(&self) -> impl Iterator<Item = Gfn> + '_ {
        self.partial.iter().map(|b| Gfn(b << BLOCK_SHIFT))
    }

    /// Number of folios.
    pub fn len(&self) -> u64 {
        self.count
    }

    /// No folio, whole or partial.
    pub fn is_empty(&self) -> bool {
        self.count == 0 && self.partial.is_empty()
    }

    /// True if the 2 MiB block holding `gfn` is a folio.
    #[inline]
    pub fn holds(&self, gfn: Gfn) -> bool {
        let block = gfn.0 >> BLOCK_SHIFT;
        self.ranges.iter().any(|r| r.has(block))
    }

    /// The folios' heads, in order.
    pub fn heads(&self) -> impl Iterator<Item = Gfn> + '_ {
        self.ranges.iter().flat_map(|r| {
            (r.first..r.end)
                .filter(|&b| r.has(b))
                .map(|b| Gfn(b << BLOCK_SHIFT))
        })
    }

    /// Heap bytes held.
    pub fn memory_bytes(&self) -> usize {
        self.ranges
            .iter()
            .map(|r| r.bits.capacity() * 8)
            .sum::<usize>()
            + self.ranges.capacity() * std::mem::size_of::<RangeBlocks>()
            + self.partial.capacity() * 8
    }
}

/// A folio fewer than half of whose frames are hot, with a frame its round did not hint: splitting
/// it where the quota is short lets its hot frames be placed alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SparseFolio {
    pub head: Gfn,
    /// Hot frames in it (hinted at `hot_count` or more).
    pub hot: u32,
    /// A frame the round did not hint: what a driver may advise cold to split the folio.
    pub cold: Gfn,
}

/// One round's entries with those inside host folios folded into one 2 MiB entry per folio, at
/// the folio's mean rate (the module docs' rule), into `out`. Entries elsewhere pass unchanged,
/// in order, ahead of the folded ones (in address order). `inside` is scratch.
///
/// Within a folio, a frame hinted twice counts once at its highest count; a 2 MiB entry for the
/// folio stands for all 512 frames at its count. Writes and youth are OR-ed, the page type is the
/// first known one. A folio whose mean rounds to level 0 (no accesses) is left out, as a writer
/// may leave out a level-0 entry. Entries are not validated here: one that is not a 2 MiB
/// entry's head passes unchanged for the engine to refuse.
///
/// With `hot_count` (`Tables::hot_count` of `counts`), folios with at least one frame hinted at
/// that count or more, but fewer than half of their frames, go to `sparse`.
pub fn fold_into_folios(
    entries: &[HintEntry],
    folios: &HostFolios,
    counts: CountMeaning,
    hot_count: Option<u8>,
    inside: &mut Vec<u64>,
    out: &mut Vec<HintEntry>,
    sparse: &mut Vec<SparseFolio>,
) {
    out.clear();
    inside.clear();
    sparse.clear();
    for &e in entries {
        let misplaced_huge = e.huge() && e.gfn().0 % HUGE_FRAMES != 0;
        if !misplaced_huge && folios.holds(e.gfn()) {
            inside.push(e.0);
        } else {
            out.push(e);
        }
    }
    // By frame, the highest count first: the first entry of each frame is the one that counts.
    let count_of = |w: u64| HintEntry(w).count();
    inside.sort_unstable_by_key(|&w| (w & GFN_MASK, std::cmp::Reverse(count_of(w))));
    let mut i = 0;
    while i < inside.len() {
        let block = (inside[i] & GFN_MASK) >> BLOCK_SHIFT;
        let head = Gfn(block << BLOCK_SHIFT);
        let mut fold = FolioFold {
            next: head.0,
            ..FolioFold::default()
        };
        let mut last_small = None;
        while i < inside.len() && (inside[i] & GFN_MASK) >> BLOCK_SHIFT == block {
            let e = HintEntry(inside[i]);
            if e.huge() {
                fold.add(e, counts);
            } else if last_small != Some(e.gfn()) {
                fold.add(e, counts);
                fold.count_frame(e, hot_count);
                last_small = Some(e.gfn());
            } else {
                fold.merge_flags(e);
            }
            i += 1;
        }
        out.extend(fold.entry(head, counts));
        sparse.extend(fold.sparse(head));
    }
}

/// What a folio's entries add up to.
#[derive(Default)]
struct FolioFold {
    /// Sum over its 4 KiB frames of their rates (Hz) or counts.
    sum: f64,
    /// The count of a 2 MiB entry for the whole folio.
    whole: Option<u8>,
    write: bool,
    young: bool,
    page_type: Option<PageType>,
    /// Distinct 4 KiB frames hinted at the hot count or more.
    hot: u32,
    /// The frame after the last one seen (frames come in order), and the first one not hinted.
    next: u64,
    gap: Option<u64>,
}

impl FolioFold {
    /// A distinct 4 KiB frame of the folio, in address order.
    fn count_frame(&mut self, e: HintEntry, hot_count: Option<u8>) {
        let g = e.gfn().0;
        if self.gap.is_none() && g > self.next {
            self.gap = Some(self.next);
        }
        self.next = g + 1;
        if hot_count.is_some_and(|h| e.count() >= h) {
            self.hot += 1;
        }
    }

    /// The folio as a candidate for splitting: hot frames, fewer than half, and no 2 MiB entry
    /// saying all of it is accessed.
    fn sparse(&self, head: Gfn) -> Option<SparseFolio> {
        if self.whole.is_some() || self.hot == 0 || u64::from(self.hot) >= HUGE_FRAMES / 2 {
            return None;
        }
        let cold = self
            .gap
            .or((self.next < head.0 + HUGE_FRAMES).then_some(self.next))?;
        Some(SparseFolio {
            head,
            hot: self.hot,
            cold: Gfn(cold),
        })
    }

    fn add(&mut self, e: HintEntry, counts: CountMeaning) {
        if e.huge() {
            self.whole = self.whole.max(Some(e.count()));
        } else {
            self.sum += match counts {
                CountMeaning::RateLevel if e.count() == 0 => 0.0,
                CountMeaning::RateLevel => rate_hz(e.count()),
                CountMeaning::RoundsSeen => f64::from(e.count()),
            };
        }
        self.merge_flags(e);
    }

    fn merge_flags(&mut self, e: HintEntry) {
        self.write |= e.write();
        self.young |= e.young();
        if self.page_type.is_none() && e.page_type() != PageType::Unknown {
            self.page_type = Some(e.page_type());
        }
    }

    /// The folio's entry, or `None` when its mean is level 0.
    fn entry(&self, head: Gfn, counts: CountMeaning) -> Option<HintEntry> {
        let mean = self.sum / HUGE_FRAMES as f64;
        let count = match counts {
            CountMeaning::RateLevel => level_of_rate(mean),
            CountMeaning::RoundsSeen => mean.round().min(255.0) as u8,
        }
        .max(self.whole.unwrap_or(0));
        (count > 0).then(|| {
            HintEntry::new(
                head,
                u32::from(count),
                self.write,
                self.page_type.unwrap_or(PageType::Unknown),
                true,
                self.young,
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vtism_proto::GfnRange;

    fn ram() -> RamMap {
        // 0..6 MiB, then a range that starts and ends off a 2 MiB boundary.
        RamMap::new(vec![
            GfnRange::new(Gfn(0), Gfn(3 * 512)),
            GfnRange::new(Gfn(4 * 512 + 100), Gfn(7 * 512 + 3)),
        ])
        .unwrap()
    }

    fn e4k(gfn: u64, level: u32) -> HintEntry {
        HintEntry::new(Gfn(gfn), level, false, PageType::Anon, false, true)
    }

    fn fold(entries: &[HintEntry], f: &HostFolios, counts: CountMeaning) -> Vec<HintEntry> {
        let (mut inside, mut out) = (Vec::new(), Vec::new());
        fold_into_folios(
            entries,
            f,
            counts,
            None,
            &mut inside,
            &mut out,
            &mut Vec::new(),
        );
        out
    }

    #[test]
    fn only_whole_aligned_blocks_of_one_range_are_folios() {
        let heads = [0, 512, 700, 3 * 512, 4 * 512, 5 * 512, 6 * 512, 512];
        let f = HostFolios::new(&ram(), heads.map(Gfn));
        // 700: not aligned; 3*512: not RAM; 4*512: a block cut by the range's start, partial
        // (7*512 is cut by its end); 512 twice counts once.
        let heads_kept = vec![0, 512, 5 * 512, 6 * 512];
        assert_eq!(f.heads().map(|g| g.0).collect::<Vec<_>>(), heads_kept);
        assert_eq!(f.len(), 4);
        assert_eq!(f.partial_heads().collect::<Vec<_>>(), vec![Gfn(4 * 512)]);
        let tail = HostFolios::new(&ram(), [Gfn(7 * 512)]);
        assert_eq!((tail.len(), tail.partial_heads().count()), (0, 1));
        assert!(HostFolios::new(&ram(), [Gfn(3 * 512), Gfn(8 * 512)]).is_empty());
        assert!(f.holds(Gfn(511)) && f.holds(Gfn(1023)) && f.holds(Gfn(5 * 512 + 7)));
        assert!(!f.holds(Gfn(2 * 512)) && !f.holds(Gfn(4 * 512 + 200)) && !f.holds(Gfn(1 << 39)));
        assert!(HostFolios::new(&ram(), []).is_empty());
    }

    #[test]
    fn a_folio_is_as_hot_as_the_mean_rate_of_its_frames() {
        let f = HostFolios::new(&ram(), [Gfn(0), Gfn(512)]);
        let one_hot = 96 + 16 * 9; // 512 Hz: 1 Hz over the folio's 512 frames.
        let all = (512..1024).map(|g| e4k(g, 200));
        let mut entries: Vec<HintEntry> = vec![e4k(7, one_hot), e4k(2 * 512 + 1, 150)];
        entries.extend(all);
        let out = fold(&entries, &f, CountMeaning::RateLevel);
        // The 4 KiB entry outside the folios first and unchanged, then one entry per folio.
        assert_eq!(out[0], e4k(2 * 512 + 1, 150));
        assert_eq!(out.len(), 3);
        let (a, b) = (out[1], out[2]);
        assert!(a.huge() && b.huge() && a.young() && a.page_type() == PageType::Anon);
        assert_eq!((a.gfn(), a.count()), (Gfn(0), 96));
        assert_eq!((b.gfn(), b.count()), (Gfn(512), 200));
    }

    #[test]
    fn duplicates_count_once_and_cold_folios_are_left_out() {
        let f = HostFolios::new(&ram(), [Gfn(0)]);
        let hot = 96 + 16 * 9;
        // The same frame a thousand times is still one frame.
        let dup: Vec<HintEntry> = std::iter::repeat_n(e4k(3, hot), 1000).collect();
        assert_eq!(fold(&dup, &f, CountMeaning::RateLevel)[0].count(), 96);
        // One frame at 1 Hz in 512: far below level 0, so no entry.
        assert!(fold(&[e4k(3, 96)], &f, CountMeaning::RateLevel).is_empty());
        // A write anywhere makes the folio written; a 2 MiB entry is a floor for all frames.
        let w = HintEntry::new(Gfn(9), hot, true, PageType::Anon, false, true);
        let whole = HintEntry::new(Gfn(0), 120, false, PageType::Unknown, true, false);
        let out = fold(&[e4k(3, hot), w, whole], &f, CountMeaning::RateLevel);
        assert_eq!(out.len(), 1);
        assert!(out[0].write());
        assert_eq!(out[0].count(), 120);
    }

    #[test]
    fn a_2mib_entry_does_not_hide_its_head_frames_4kib_rate() {
        let f = HostFolios::new(&ram(), [Gfn(0)]);
        // The head frame at 512 Hz (1 Hz over the folio) beside a 2 MiB entry at 0.5 Hz, in
        // either order: the folio is at 1 Hz (level 96).
        let whole = HintEntry::new(Gfn(0), 80, false, PageType::Anon, true, true);
        let head = e4k(0, 96 + 16 * 9);
        for entries in [[whole, head], [head, whole]] {
            assert_eq!(fold(&entries, &f, CountMeaning::RateLevel)[0].count(), 96);
        }
    }

    #[test]
    fn rounds_seen_counts_are_averaged_too() {
        let f = HostFolios::new(&ram(), [Gfn(0)]);
        let entries: Vec<HintEntry> = (0..256).map(|g| e4k(g, 8)).collect();
        let out = fold(&entries, &f, CountMeaning::RoundsSeen);
        assert_eq!((out.len(), out[0].count()), (1, 4));
    }

    #[test]
    fn a_huge_entry_off_its_head_passes_for_the_engine_to_refuse() {
        let f = HostFolios::new(&ram(), [Gfn(0)]);
        let bad = HintEntry::new(Gfn(5), 200, false, PageType::Anon, true, true);
        assert_eq!(fold(&[bad], &f, CountMeaning::RateLevel), vec![bad]);
    }
}
