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
use vtism_proto::{CountMeaning, Gfn, HintEntry, PageType, RamMap, HUGE_FRAMES};

const BLOCK_SHIFT: u32 = HUGE_FRAMES.trailing_zeros();

/// The whole 2 MiB blocks of one RAM range, one bit each.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct RangeBlocks {
    /// Blocks `[first, end)` (guest frame number >> 9).
    first: u64,
    end: u64,
    bits: Vec<u64>,
    /// Folios before each word of `bits`, from the first of all ranges: a folio's index.
    ranks: Vec<u32>,
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

    /// The index of `block` among all the folios, if it is one of this range's.
    #[inline]
    fn folio_index(&self, block: u64) -> Option<usize> {
        let (w, b) = self.index(block)?;
        let word = self.bits[w];
        (word >> b & 1 != 0)
            .then(|| (self.ranks[w] + (word & ((1 << b) - 1)).count_ones()) as usize)
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
                    ranks: Vec::new(),
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
        let mut rank = 0;
        for r in &mut ranges {
            r.ranks = r
                .bits
                .iter()
                .map(|w| {
                    let before = rank;
                    rank += w.count_ones();
                    before
                })
                .collect();
        }
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

    /// The index of the folio holding `gfn` among all of them, in address order (that of
    /// `heads`), if the 2 MiB block holding it is one.
    #[inline]
    pub fn folio_index(&self, gfn: Gfn) -> Option<usize> {
        let block = gfn.0 >> BLOCK_SHIFT;
        self.ranges.iter().find_map(|r| r.folio_index(block))
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
            .map(|r| r.bits.capacity() * 8 + r.ranks.capacity() * 4)
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
/// in order, ahead of the folded ones (in address order). `scratch` holds what is added up per
/// folio.
///
/// Within a folio, a frame hinted twice counts once at its highest count; a 2 MiB entry for the
/// folio stands for all 512 frames at its count. Writes and youth are OR-ed, the page type is the
/// first known one by frame, then count (highest first), then the order entries come in. A folio
/// whose mean rounds to level 0 (no accesses) is left out, as a writer may leave out a level-0
/// entry. Entries are not validated here: one that is not a 2 MiB entry's head passes unchanged
/// for the engine to refuse.
///
/// With `hot_count` (`Tables::hot_count` of `counts`), folios with at least one frame hinted at
/// that count or more, but fewer than half of their frames, go to `sparse`.
///
/// Each entry is added to its folio's sums as it comes (`FolioFold`), with no copy of the round:
/// a frame's first count is added, and a frame hinted again can only count higher if its new
/// count is above the least its folio has had so far, which never happens in a round published
/// hottest first. Folios where it happens are added up again from their frames' highest counts
/// (`FoldScratch::recount`). Sums are exact (`FixedValues`), so the order entries come in does
/// not round them differently.
pub fn fold_into_folios(
    entries: &[HintEntry],
    folios: &HostFolios,
    counts: CountMeaning,
    hot_count: Option<u8>,
    scratch: &mut FoldScratch,
    out: &mut Vec<HintEntry>,
    sparse: &mut Vec<SparseFolio>,
) {
    out.clear();
    sparse.clear();
    let values = FixedValues::new(counts);
    let each = &mut scratch.folios;
    each.clear();
    each.resize(folios.len() as usize, FolioFold::NONE);
    scratch.unsettled.clear();
    for &e in entries {
        let misplaced_huge = e.huge() && e.gfn().0 % HUGE_FRAMES != 0;
        match folios.folio_index(e.gfn()).filter(|_| !misplaced_huge) {
            Some(k) => {
                if each[k].add(e, &values, hot_count) {
                    scratch.unsettled.push(k as u32);
                }
            }
            None => out.push(e),
        }
    }
    scratch.recount(entries, folios, &values, hot_count);
    for (f, head) in scratch.folios.iter().zip(folios.heads()) {
        if f.touched() {
            out.extend(f.entry(head, counts));
            sparse.extend(f.sparse(head));
        }
    }
}

/// What folding a round keeps per host folio, kept between rounds for its allocations (one per
/// engine, whatever the number of VMs).
#[derive(Default)]
pub struct FoldScratch {
    /// By folio index (`HostFolios::folio_index`).
    folios: Vec<FolioFold>,
    /// The folios to add up again (`FolioFold::unsettled`), by index.
    unsettled: Vec<u32>,
    /// By folio index: for an unsettled folio, where its hinted frames' highest counts start in
    /// a run of those of all the unsettled folios (`recount`); `NOT_UNSETTLED` for the others.
    starts: Vec<u32>,
    /// Highest counts of the hinted frames of a window of unsettled folios, in that run.
    counts: Vec<u8>,
}

const NOT_UNSETTLED: u32 = u32::MAX;

impl FoldScratch {
    /// Adds the unsettled folios up again from their hinted frames' highest counts, found in a
    /// pass over `entries` per window of folios: as many as have at most 64 hinted frames per
    /// folio of the VM (a byte each: an eighth of a byte per 4 KiB of guest RAM), so that a
    /// round takes at most nine passes, and one or two unless it hints most frames.
    fn recount(
        &mut self,
        entries: &[HintEntry],
        folios: &HostFolios,
        values: &FixedValues,
        hot_count: Option<u8>,
    ) {
        if self.unsettled.is_empty() {
            return;
        }
        self.starts.resize(self.folios.len(), NOT_UNSETTLED);
        let mut at = 0u32;
        for &k in &self.unsettled {
            self.starts[k as usize] = at;
            at += self.folios[k as usize].hinted();
        }
        let budget = (self.folios.len() * 64).max(HUGE_FRAMES as usize) as u32;
        let mut rest = &self.unsettled[..];
        while let Some(&first) = rest.first() {
            // The window: unsettled folios whose hinted frames fit the budget (one at least).
            let lo = self.starts[first as usize];
            let n = rest
                .iter()
                .skip(1)
                .position(|&k| {
                    self.starts[k as usize] + self.folios[k as usize].hinted() > lo + budget
                })
                .map_or(rest.len(), |p| p + 1);
            let (window, later) = rest.split_at(n);
            let last = window[n - 1] as usize;
            let hi = self.starts[last] + self.folios[last].hinted();
            // Exactly the window (a vector's doubling would hold twice the budget).
            self.counts.clear();
            self.counts.reserve_exact((hi - lo) as usize);
            self.counts.resize((hi - lo) as usize, 0);
            for e in entries.iter().filter(|e| !e.huge()) {
                let Some(k) = folios.folio_index(e.gfn()) else {
                    continue;
                };
                let start = self.starts[k];
                if start == NOT_UNSETTLED || start < lo || start >= hi {
                    continue;
                }
                let frame = (e.gfn().0 % HUGE_FRAMES) as usize;
                let c = &mut self.counts[(start - lo) as usize + self.folios[k].rank(frame)];
                *c = (*c).max(e.count());
            }
            for &k in window {
                let start = (self.starts[k as usize] - lo) as usize;
                let f = &mut self.folios[k as usize];
                let counts = &self.counts[start..start + f.hinted() as usize];
                f.settle(counts, values, hot_count);
            }
            rest = later;
        }
        for &k in &self.unsettled {
            self.starts[k as usize] = NOT_UNSETTLED;
        }
    }

    /// Heap bytes held.
    pub fn memory_bytes(&self) -> usize {
        self.folios.capacity() * std::mem::size_of::<FolioFold>()
            + (self.unsettled.capacity() + self.starts.capacity()) * 4
            + self.counts.capacity()
    }
}

/// A frame's rate (Hz) or count by its entry's count, in units of 2^-`FIXED_BITS`: every rate
/// level's rate (2^((level - 96) / 16) Hz, an `f64` with at most 53 significant bits, at least
/// 2^-6) is a whole number of those, so sums of them are exact whatever their order.
struct FixedValues([u128; 256]);

const FIXED_BITS: i32 = 58;

impl FixedValues {
    fn new(counts: CountMeaning) -> FixedValues {
        let unit = 2f64.powi(FIXED_BITS);
        FixedValues(std::array::from_fn(|c| match counts {
            CountMeaning::RateLevel if c == 0 => 0,
            CountMeaning::RateLevel => {
                let fixed = rate_hz(c as u8) * unit;
                debug_assert_eq!(fixed.fract(), 0.0, "level {c}");
                fixed as u128
            }
            CountMeaning::RoundsSeen => (c as u128) << FIXED_BITS,
        }))
    }

    #[inline]
    fn of(&self, count: u8) -> u128 {
        self.0[count as usize]
    }

    /// A sum of values, as a rate or count: rounded once.
    fn to_f64(sum: u128) -> f64 {
        sum as f64 * 2f64.powi(-FIXED_BITS)
    }
}

/// What a folio's entries add up to.
#[derive(Clone, Copy)]
struct FolioFold {
    /// Sum over its hinted 4 KiB frames of their rates (Hz) or counts (`FixedValues`).
    sum: u128,
    /// Its 4 KiB frames hinted.
    seen: [u64; 8],
    /// The count of a 2 MiB entry for the whole folio.
    whole: Option<u8>,
    /// The least count of its 4 KiB entries so far: a frame hinted again at no more than that
    /// is at no more than its first count.
    least: u8,
    /// A frame was hinted again at more than `least`: `sum` and `hot` may be short of its highest
    /// count (`FoldScratch::recount`).
    unsettled: bool,
    write: bool,
    young: bool,
    /// The page type, and its entry's rank: frame, then count (highest first).
    typed: Option<(u32, PageType)>,
    /// Distinct 4 KiB frames hinted at the hot count or more.
    hot: u16,
}

impl FolioFold {
    const NONE: FolioFold = FolioFold {
        sum: 0,
        seen: [0; 8],
        whole: None,
        least: u8::MAX,
        unsettled: false,
        write: false,
        young: false,
        typed: None,
        hot: 0,
    };

    /// Adds an entry of the folio. True when it makes the folio unsettled.
    #[inline]
    fn add(&mut self, e: HintEntry, values: &FixedValues, hot_count: Option<u8>) -> bool {
        let (frame, count) = ((e.gfn().0 % HUGE_FRAMES) as usize, e.count());
        let mut unsettles = false;
        if e.huge() {
            self.whole = self.whole.max(Some(count));
        } else {
            let (word, bit) = (frame / 64, 1u64 << (frame % 64));
            if self.seen[word] & bit == 0 {
                self.seen[word] |= bit;
                self.sum += values.of(count);
                self.hot += u16::from(hot_count.is_some_and(|h| count >= h));
            } else if count > self.least && !self.unsettled {
                self.unsettled = true;
                unsettles = true;
            }
            self.least = self.least.min(count);
        }
        self.write |= e.write();
        self.young |= e.young();
        if e.page_type() != PageType::Unknown {
            let rank = (frame as u32) << 8 | u32::from(u8::MAX - count);
            if self.typed.is_none_or(|(r, _)| rank < r) {
                self.typed = Some((rank, e.page_type()));
            }
        }
        unsettles
    }

    /// 4 KiB frames hinted.
    fn hinted(&self) -> u32 {
        self.seen.iter().map(|w| w.count_ones()).sum()
    }

    /// Where hinted frame `frame` is among the hinted ones.
    #[inline]
    fn rank(&self, frame: usize) -> usize {
        let (word, bit) = (frame / 64, frame % 64);
        let before: u32 = self.seen[..word].iter().map(|w| w.count_ones()).sum();
        (before + (self.seen[word] & ((1 << bit) - 1)).count_ones()) as usize
    }

    /// `sum` and `hot` from the highest count of each frame hinted (`counts`, in frame order).
    fn settle(&mut self, counts: &[u8], values: &FixedValues, hot_count: Option<u8>) {
        (self.sum, self.hot) = (0, 0);
        for &count in counts {
            self.sum += values.of(count);
            self.hot += u16::from(hot_count.is_some_and(|h| count >= h));
        }
    }

    fn touched(&self) -> bool {
        self.whole.is_some() || self.seen.iter().any(|&w| w != 0)
    }

    /// The folio as a candidate for splitting: hot frames, fewer than half, no 2 MiB entry
    /// saying all of it is accessed, and a frame not hinted (the first).
    fn sparse(&self, head: Gfn) -> Option<SparseFolio> {
        if self.whole.is_some() || self.hot == 0 || u64::from(self.hot) >= HUGE_FRAMES / 2 {
            return None;
        }
        let (word, w) = self.seen.iter().enumerate().find(|(_, &w)| w != u64::MAX)?;
        let cold = word as u64 * 64 + u64::from(w.trailing_ones());
        Some(SparseFolio {
            head,
            hot: u32::from(self.hot),
            cold: Gfn(head.0 + cold),
        })
    }

    /// The folio's entry, or `None` when its mean is level 0.
    fn entry(&self, head: Gfn, counts: CountMeaning) -> Option<HintEntry> {
        let mean = FixedValues::to_f64(self.sum) / HUGE_FRAMES as f64;
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
                self.typed.map_or(PageType::Unknown, |(_, t)| t),
                true,
                self.young,
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::Rng;
    use proptest::prelude::*;
    use vtism_proto::entry::GFN_MASK;
    use vtism_proto::GfnRange;

    /// The fold as it was first written: the round's entries inside folios copied and sorted by
    /// frame, then highest count first, and each folio's frames added up in address order. What
    /// `fold_into_folios` must equal. (The sort is stable, so that the page type of entries
    /// alike in frame and count is the first one's, as `fold_into_folios` has it.)
    fn fold_by_sorting(
        entries: &[HintEntry],
        folios: &HostFolios,
        counts: CountMeaning,
        hot_count: Option<u8>,
    ) -> (Vec<HintEntry>, Vec<SparseFolio>) {
        let (mut out, mut inside, mut sparse) = (Vec::new(), Vec::new(), Vec::new());
        for &e in entries {
            let misplaced_huge = e.huge() && e.gfn().0 % HUGE_FRAMES != 0;
            if !misplaced_huge && folios.holds(e.gfn()) {
                inside.push(e.0);
            } else {
                out.push(e);
            }
        }
        let count_of = |w: u64| HintEntry(w).count();
        inside.sort_by_key(|&w| (w & GFN_MASK, std::cmp::Reverse(count_of(w))));
        let mut i = 0;
        while i < inside.len() {
            let block = (inside[i] & GFN_MASK) >> BLOCK_SHIFT;
            let head = Gfn(block << BLOCK_SHIFT);
            let (mut sum, mut whole, mut write, mut young) = (0.0, None, false, false);
            let (mut page_type, mut hot, mut next, mut gap) = (None, 0u32, head.0, None);
            let mut last_small = None;
            while i < inside.len() && (inside[i] & GFN_MASK) >> BLOCK_SHIFT == block {
                let e = HintEntry(inside[i]);
                i += 1;
                write |= e.write();
                young |= e.young();
                if page_type.is_none() && e.page_type() != PageType::Unknown {
                    page_type = Some(e.page_type());
                }
                if e.huge() {
                    whole = whole.max(Some(e.count()));
                    continue;
                }
                if last_small == Some(e.gfn()) {
                    continue;
                }
                last_small = Some(e.gfn());
                sum += match counts {
                    CountMeaning::RateLevel if e.count() == 0 => 0.0,
                    CountMeaning::RateLevel => rate_hz(e.count()),
                    CountMeaning::RoundsSeen => f64::from(e.count()),
                };
                let g = e.gfn().0;
                if gap.is_none() && g > next {
                    gap = Some(next);
                }
                next = g + 1;
                hot += u32::from(hot_count.is_some_and(|h| e.count() >= h));
            }
            let mean = sum / HUGE_FRAMES as f64;
            let count = match counts {
                CountMeaning::RateLevel => level_of_rate(mean),
                CountMeaning::RoundsSeen => mean.round().min(255.0) as u8,
            }
            .max(whole.unwrap_or(0));
            if count > 0 {
                let t = page_type.unwrap_or(PageType::Unknown);
                out.push(HintEntry::new(head, count.into(), write, t, true, young));
            }
            let cold = gap.or((next < head.0 + HUGE_FRAMES).then_some(next));
            if let (None, true, Some(cold)) =
                (whole, hot > 0 && u64::from(hot) < HUGE_FRAMES / 2, cold)
            {
                sparse.push(SparseFolio {
                    head,
                    hot,
                    cold: Gfn(cold),
                });
            }
        }
        (out, sparse)
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, .. ProptestConfig::default() })]

        /// Folding entry by entry, with no copy of the round, gives what sorting the round gives:
        /// in rounds hottest first and in no order, with frames hinted again higher or lower,
        /// 2 MiB entries (some off their head), entries outside the folios and the RAM map, and
        /// so many folios unsettled that they are added up again in several windows.
        #[test]
        fn folding_entry_by_entry_equals_folding_sorted(
            seed in any::<u64>(),
            rate in any::<bool>(),
            hot_first in any::<bool>(),
            again in prop::sample::select(vec![0.0, 0.05, 0.5]),
        ) {
            let mut rng = Rng::new(seed);
            let ram = RamMap::new(vec![
                GfnRange::new(Gfn(0), Gfn(20 * 512)),
                GfnRange::new(Gfn(24 * 512 + 100), Gfn(40 * 512 + 3)),
            ])
            .unwrap();
            let heads = (0..41).filter(|_| rng.chance(0.8)).map(|b| Gfn(b * 512));
            let folios = HostFolios::new(&ram, heads);
            let counts = if rate { CountMeaning::RateLevel } else { CountMeaning::RoundsSeen };
            let hot_count = rng.chance(0.8).then(|| rng.below(256) as u8);
            let mut entries = Vec::new();
            let entry = |rng: &mut Rng, gfn: u64, huge: bool| {
                let t = PageType::from_bits(rng.below(4) as u8);
                let count = rng.below(256) as u32;
                HintEntry::new(Gfn(gfn), count, rng.chance(0.3), t, huge, rng.chance(0.5))
            };
            for _ in 0..rng.below(3000) {
                let gfn = rng.below(42 * 512);
                let huge = rng.chance(0.01);
                let gfn = if huge && rng.chance(0.9) { gfn & !511 } else { gfn };
                entries.push(entry(&mut rng, gfn, huge));
                if rng.chance(again) {
                    let e = entries[rng.below(entries.len() as u64) as usize];
                    entries.push(entry(&mut rng, e.gfn().0, e.huge()));
                }
            }
            if hot_first {
                entries.sort_by_key(|e| std::cmp::Reverse(e.count()));
            }
            let (mut scratch, mut out, mut sparse) = (FoldScratch::default(), Vec::new(), Vec::new());
            // Twice, as the engine keeps its scratch from round to round.
            for _ in 0..2 {
                fold_into_folios(&entries, &folios, counts, hot_count, &mut scratch, &mut out, &mut sparse);
                let (want, want_sparse) = fold_by_sorting(&entries, &folios, counts, hot_count);
                prop_assert_eq!(&out, &want);
                prop_assert_eq!(&sparse, &want_sparse);
            }
        }
    }

    #[test]
    fn every_rate_is_a_whole_number_of_fixed_units() {
        let unit = 2f64.powi(FIXED_BITS);
        for level in 1..=255u8 {
            let fixed = rate_hz(level) * unit;
            assert_eq!(fixed.fract(), 0.0, "level {level}");
            assert_eq!(FixedValues::to_f64(fixed as u128), rate_hz(level));
        }
        // 512 frames at the highest rate fit with room to spare.
        assert!((rate_hz(255) * unit) as u128 * 512 < 1 << 96);
    }

    #[test]
    fn a_frame_hinted_again_higher_counts_at_its_highest() {
        let f = HostFolios::new(&ram(), [Gfn(0)]);
        let hot = 96 + 16 * 9;
        // The frame first at 1 Hz, then (in no order) at 512 Hz: it counts at 512 Hz, so the
        // folio is at 1 Hz (level 96). Then lower again: no change.
        let entries = [e4k(3, 96), e4k(5, 0), e4k(3, hot), e4k(3, 10)];
        assert_eq!(fold(&entries, &f, CountMeaning::RateLevel)[0].count(), 96);
    }

    #[test]
    fn folio_indexes_count_folios_in_address_order() {
        let heads = [0, 512, 5 * 512, 6 * 512];
        let f = HostFolios::new(&ram(), heads.map(Gfn));
        for (k, h) in heads.iter().enumerate() {
            assert_eq!(f.folio_index(Gfn(h + 511)), Some(k));
        }
        assert_eq!(f.folio_index(Gfn(2 * 512)), None);
        assert_eq!(f.folio_index(Gfn(4 * 512 + 200)), None);
    }

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
        let (mut scratch, mut out) = (FoldScratch::default(), Vec::new());
        fold_into_folios(
            entries,
            f,
            counts,
            None,
            &mut scratch,
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
