//! Ingesting a hint round: every entry updates its frames' states and moves them between slots of
//! the VM's level histogram.
//!
//! A round is millions of entries, so the common entry (4 KiB, in the RAM range of the one
//! before, outside any 2 MiB unit, on a frame not hinted yet in the round) takes a straight path:
//! per-round lookups (`RoundHints`), no range search, and histogram moves counted in a round-local
//! delta. Everything else takes the general path, which does what the channel spec says of every
//! case.

use super::{Span, VmState, NODES};
use crate::hotness::{FrameState, RoundHints, Tables, COLD_SLOT, NODE_UNKNOWN, RING};
use crate::policy::IngestStats;
use vtism_proto::{entry, CountMeaning, HintEntry, PageType, HUGE_FRAMES};

/// Hints are prefetched this many entries ahead: random (cold) hints miss every cache level.
const PREFETCH_AHEAD: usize = 128;
/// Rounds of at least this many entries are sorted by bucket first (`bucket_entries`).
const BUCKETED_MIN: usize = 1 << 16;
/// Frames per bucket at least (128 KiB of frame state) ...
const BUCKET_FRAMES_LOG2: u32 = 15;
/// ... and buckets at most, so that the sort's write streams stay few.
const BUCKETS_LOG2: u32 = 10;

/// Cells of a level-histogram delta: `slot * 4 + class` as in `VmState::hist`, and one for frames
/// whose node is unknown (they are not counted). A power of two, so indexes need no bounds check.
const CELLS: usize = 2048;
/// The class of frames whose node is unknown: their cells are past the histogram's.
const UNCOUNTED: usize = 1024;
const _: () = assert!((RING + 1) * 4 <= UNCOUNTED && UNCOUNTED + (RING + 1) * 4 <= CELLS);
/// Frame state bits 21-29 (page type, write, node) give a frame's histogram class.
const CLASS_SHIFT: u32 = 21;

/// Histogram moves of one round, added to the VM's histogram when the round is in. Two copies
/// used alternately, so that consecutive entries moving frames between the same slots (the usual
/// case: a guest publishes frames of one level together) do not wait on each other's counter.
/// Modulo 2^32: a cell goes below zero when frames leave it before others arrive, and every count
/// and its sum with the delta is below 2^32 (`EngineError::VmTooLarge`), so the sum is exact.
struct HistDelta(Box<[[u32; CELLS]; 2]>);

impl HistDelta {
    fn new() -> Self {
        HistDelta(Box::new([[0; CELLS]; 2]))
    }

    #[inline(always)]
    fn shift(&mut self, lane: usize, from: usize, to: usize) {
        let d = &mut self.0[lane % 2];
        d[from % CELLS] = d[from % CELLS].wrapping_sub(1);
        d[to % CELLS] = d[to % CELLS].wrapping_add(1);
    }
}

/// Where the entry loop is: the RAM range of the last entry.
struct Cursor {
    classes: [u16; 512],
    span: Span,
    prefetch_base: *const FrameState,
}

/// A 2 MiB unit hinted in this round (by its head's index): what its entries have merged into
/// every frame of the unit, and what later duplicates still owe. Duplicates merge as a maximum
/// and an OR, so a duplicate that adds nothing is skipped and the others are merged once when
/// the round is in: a guest repeating one unit a million times costs one entry each, not 512
/// frame updates each (docs/host.md, "Threat model").
#[derive(Clone, Copy, Debug)]
pub(super) struct UnitHint {
    /// Largest degree and write merged into every frame of the unit.
    applied: (u32, bool),
    /// Largest degree and write of the duplicates not merged yet.
    owed: (u32, bool),
    /// An entry of the unit had a known page type, so every frame's type is known.
    typed: bool,
}

/// A run of consecutive entries in one bucket, counted in a register: entries come in runs
/// (a guest publishes frames of one level in address order), and a counter in memory would make
/// each entry wait for the one before.
#[derive(Default)]
struct Run {
    bucket: usize,
    n: usize,
}

impl Run {
    /// Counts an entry of bucket `b`, adding the run before to `count` when `b` starts a new one.
    #[inline(always)]
    fn add(&mut self, count: &mut [usize], b: usize) {
        if b != self.bucket {
            count[self.bucket] += self.n;
            (self.bucket, self.n) = (b, 0);
        }
        self.n += 1;
    }

    /// Adds the last run to `count`.
    fn flush(&mut self, count: &mut [usize]) {
        count[self.bucket] += self.n;
        self.n = 0;
    }

    /// The next place of bucket `b`, whose next places are in `count`.
    #[inline(always)]
    fn next(&mut self, count: &mut [usize], b: usize) -> usize {
        if b != self.bucket {
            count[self.bucket] = self.n;
            (self.bucket, self.n) = (b, count[b]);
        }
        self.n += 1;
        self.n - 1
    }
}

/// Entries per rate level of one rate-level round, 4 KiB ones and 2 MiB ones apart, in two copies
/// as in `HistDelta`.
struct RateCounts(Box<[[u64; 512]; 2]>);

impl RateCounts {
    fn new() -> Self {
        RateCounts(Box::new([[0; 512]; 2]))
    }

    #[inline(always)]
    fn count(&mut self, lane: usize, w: u64) {
        const _: () = assert!(entry::HUGE_BIT == 1 << (entry::COUNT_SHIFT + 11));
        let level = (w >> entry::COUNT_SHIFT) & 0xff;
        let huge = (w >> (entry::COUNT_SHIFT + 3)) & 0x100;
        self.0[lane % 2][(level | huge) as usize] += 1;
    }

    /// Frames at rate level `l`.
    fn frames(&self, l: usize) -> u64 {
        let entries = |at: usize| self.0[0][at] + self.0[1][at];
        entries(l) + entries(256 + l) * HUGE_FRAMES
    }
}

impl VmState {
    /// Ingests one round of entries. `scratch` holds a large round's entries sorted by where
    /// their frames are.
    pub(super) fn ingest(
        &mut self,
        t: &Tables,
        counts: CountMeaning,
        entries: &[HintEntry],
        scratch: &mut Vec<u64>,
    ) -> IngestStats {
        let bucketing = (entries.len() >= BUCKETED_MIN).then(|| self.bucket_shift());
        self.ingest_with(t, counts, entries, scratch, bucketing)
    }

    /// Guest frames per bucket, as a shift of the frame number: a bucket's frame states fit a
    /// core's L2 cache, and the buckets are few.
    fn bucket_shift(&self) -> u32 {
        let end = self.spans.last().map_or(0, |s| s.end);
        BUCKET_FRAMES_LOG2.max((u64::BITS - end.leading_zeros()).saturating_sub(BUCKETS_LOG2))
    }

    /// `ingest`, with the entries sorted into buckets of `1 << shift` frames first if
    /// `bucketing` is `Some(shift)`.
    fn ingest_with(
        &mut self,
        t: &Tables,
        counts: CountMeaning,
        entries: &[HintEntry],
        scratch: &mut Vec<u64>,
        bucketing: Option<u32>,
    ) -> IngestStats {
        let mut st = IngestStats {
            entries: entries.len() as u64,
            ..Default::default()
        };
        self.round += 1;
        self.counts = counts;
        self.hot_rate_frames = 0;
        self.expire(t);
        self.maintain_slice(t);
        let rh = t.round_hints(self.round, counts);
        let mut delta = HistDelta::new();
        let mut rates = RateCounts::new();
        let rate = counts == CountMeaning::RateLevel;
        let mut words = HintEntry::as_words(entries);
        let bucketed = bucketing.is_some();
        if let Some(shift) = bucketing {
            // The entries' frames, bucket by bucket; the rates are counted here.
            self.bucket_entries(words, shift, scratch, rate.then_some(&mut rates));
            words = scratch;
        }
        let loop_rates = (rate && !bucketed).then_some(&mut rates);
        self.unit_hints.clear();
        if rate {
            self.ingest_words::<true>(&rh, words, &mut delta, &mut st, loop_rates);
            for (l, n) in self.rate_frames.iter_mut().enumerate() {
                *n = rates.frames(l);
            }
            self.hot_rate_frames = self.rate_frames[t.hot_rate_level as usize..].iter().sum();
        } else {
            self.ingest_words::<false>(&rh, words, &mut delta, &mut st, None);
        }
        self.merge_owed(t, &mut delta, &mut st);
        self.add_to_histogram(&delta);
        st.applied = st.entries - st.ignored;
        self.dirty = true;
        st
    }

    /// Copies the entries into `out` ordered by bucket (stable), a bucket being `1 << shift`
    /// guest frames (`bucket_shift`, at least a 2 MiB unit): the loop then visits each part of
    /// the frame array once instead of once per level or at random. All the entries touching one
    /// frame or one 2 MiB unit land in one bucket in their order, so the result is the same.
    /// Entries past the RAM map go to the last bucket, where the loop ignores them as it does
    /// those in its holes. `rates` counts every entry by level.
    fn bucket_entries(
        &self,
        words: &[u64],
        shift: u32,
        out: &mut Vec<u64>,
        mut rates: Option<&mut RateCounts>,
    ) {
        let shift = shift.max(HUGE_FRAMES.trailing_zeros());
        let last = (self.spans.last().map_or(0, |s| s.end) >> shift) as usize;
        let bucket = |w: u64| (((w & entry::GFN_MASK) >> shift) as usize).min(last);
        let mut count = vec![0usize; last + 1];
        let mut run = Run::default();
        for (i, &w) in words.iter().enumerate() {
            if let Some(r) = rates.as_deref_mut() {
                r.count(i, w);
            }
            run.add(&mut count, bucket(w));
        }
        run.flush(&mut count);
        let mut at = 0;
        for c in count.iter_mut() {
            (*c, at) = (at, at + *c);
        }
        // Every slot is written below: no need to clear what the last round left.
        out.resize(at, 0);
        let mut run = Run::default();
        for &w in words {
            out[run.next(&mut count, bucket(w))] = w;
        }
    }

    /// The entry loop. `RATE`: the counts are rate levels, counted per level in `rates`.
    fn ingest_words<const RATE: bool>(
        &mut self,
        rh: &RoundHints<'_>,
        words: &[u64],
        delta: &mut HistDelta,
        st: &mut IngestStats,
        mut rates: Option<&mut RateCounts>,
    ) {
        let span = self.spans.first().copied().unwrap_or(Span {
            start: 0,
            end: 0,
            first: 0,
        });
        let mut c = Cursor {
            classes: self.cell_classes(),
            span,
            prefetch_base: prefetch_base(&self.frames, span),
        };
        // Pairs of entries, the first on lane 0 and the second on lane 1 of the delta; the last
        // `PREFETCH_AHEAD` (and an odd one) without prefetching.
        let split = words.len().saturating_sub(PREFETCH_AHEAD) & !1;
        let (with_ahead, tail) = words.split_at(split);
        let ahead = &words[PREFETCH_AHEAD.min(words.len())..];
        for (w, a) in with_ahead.chunks_exact(2).zip(ahead.chunks_exact(2)) {
            // Where the frames are if they are in the same range (a prefetch never faults).
            prefetch_read(
                c.prefetch_base
                    .wrapping_add((a[0] & entry::GFN_MASK) as usize),
            );
            self.step::<RATE>(rh, &mut c, delta, st, rates.as_deref_mut(), 0, w[0]);
            prefetch_read(
                c.prefetch_base
                    .wrapping_add((a[1] & entry::GFN_MASK) as usize),
            );
            self.step::<RATE>(rh, &mut c, delta, st, rates.as_deref_mut(), 1, w[1]);
        }
        for (i, &w) in tail.iter().enumerate() {
            self.step::<RATE>(rh, &mut c, delta, st, rates.as_deref_mut(), i, w);
        }
    }

    /// One entry, counted on `lane` of the deltas.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn step<const RATE: bool>(
        &mut self,
        rh: &RoundHints<'_>,
        c: &mut Cursor,
        delta: &mut HistDelta,
        st: &mut IngestStats,
        rates: Option<&mut RateCounts>,
        lane: usize,
        w: u64,
    ) {
        if let (true, Some(r)) = (RATE, rates) {
            r.count(lane, w);
        }
        // A 2 MiB entry is never in range here.
        let span = c.span;
        let off = (w & (entry::GFN_MASK | entry::HUGE_BIT)).wrapping_sub(span.start);
        if off < span.end - span.start
            && (self.huge_marks == 0 || !self.huge_bit_near(span.first + off, w & entry::GFN_MASK))
        {
            self.hint_frame::<RATE>(rh, &c.classes, (span.first + off) as usize, w, delta, lane);
            return;
        }
        self.ingest_entry::<RATE>(rh, c, w, delta, st, lane);
        c.prefetch_base = prefetch_base(&self.frames, c.span);
    }

    /// Histogram cell offset by frame state bits 21-29 (page type, write, node): the class
    /// `fast * 2 + file`, or `UNCOUNTED` for a frame whose node is unknown.
    fn cell_classes(&self) -> [u16; 512] {
        let mut c = [0u16; 512];
        for (bits, class) in c.iter_mut().enumerate() {
            let s = FrameState((bits as u32) << CLASS_SHIFT);
            *class = match s.node_raw() {
                NODE_UNKNOWN => UNCOUNTED as u16,
                n => {
                    (self.is_fast[n as usize % NODES] as u16) * 2
                        + (s.page_type() == PageType::File) as u16
                }
            };
        }
        c
    }

    /// An entry off the straight path: in another RAM range or none, a 2 MiB unit, or a 4 KiB
    /// entry near a marked unit.
    #[inline(never)]
    fn ingest_entry<const RATE: bool>(
        &mut self,
        rh: &RoundHints<'_>,
        c: &mut Cursor,
        w: u64,
        delta: &mut HistDelta,
        st: &mut IngestStats,
        lane: usize,
    ) {
        let (classes, span) = (&c.classes, &mut c.span);
        let e = HintEntry(w);
        let gfn = e.gfn().0;
        let Some(idx) = self.locate(gfn, span) else {
            st.ignored += 1;
            return;
        };
        let idx = idx as usize;
        let head = gfn & !(HUGE_FRAMES - 1);
        // The 2 MiB unit holding this frame lies wholly in the frame's range.
        let unit_in_range = head >= span.start && head + HUGE_FRAMES <= span.end;
        if e.huge() {
            if gfn != head || !unit_in_range {
                st.ignored += 1;
                return;
            }
            let deg = rh.tables().degree(self.counts, e.count(), e.write());
            let typed = e.page_type() != PageType::Unknown;
            let hs = self.frames[idx];
            let hinted = hs.huge_head() && hs.seen() && hs.stamp() == self.round as u8;
            if let Some(u) = self.unit_hints.get_mut(&idx).filter(|_| hinted) {
                st.duplicate_units += 1;
                if !typed || u.typed {
                    u.owed = (u.owed.0.max(deg), u.owed.1 | e.write());
                    return;
                }
                // The first known page type of the unit: the frames take it now, in order.
                (u.applied, u.typed) = ((u.applied.0.max(deg), u.applied.1 | e.write()), true);
                st.unit_passes += 1;
                for i in idx..idx + HUGE_FRAMES as usize {
                    self.merge_hint(rh.tables(), i, w, delta);
                }
                return;
            }
            // Every frame of the unit carries the unit's hotness (so counts stay per frame); the
            // head's mark makes the planner move the unit as one.
            self.set_huge(idx, true);
            st.unit_passes += 1;
            for i in idx..idx + HUGE_FRAMES as usize {
                self.hint_frame::<RATE>(rh, classes, i, w, delta, i);
            }
            let applied = (deg, e.write());
            self.unit_hints.insert(
                idx,
                UnitHint {
                    applied,
                    owed: (0, false),
                    typed,
                },
            );
            return;
        }
        let head_idx = idx.wrapping_sub((gfn - head) as usize);
        if unit_in_range && self.huge_bit(head_idx) {
            let hs = self.frames[head_idx];
            if hs.huge_head() {
                if hs.seen() && hs.stamp() == self.round as u8 {
                    // The unit was hinted this round: the 4 KiB hint is part of it.
                    self.hint_frame::<RATE>(rh, classes, idx, w, delta, lane);
                    st.covered_by_huge += 1;
                    return;
                }
                // A 4 KiB hint inside a unit not hinted as huge this round: it was split.
                self.set_huge(head_idx, false);
            }
        }
        self.hint_frame::<RATE>(rh, classes, idx, w, delta, lane);
    }

    /// One hint on one frame, with its histogram move.
    #[inline(always)]
    fn hint_frame<const RATE: bool>(
        &mut self,
        rh: &RoundHints<'_>,
        classes: &[u16; 512],
        idx: usize,
        w: u64,
        delta: &mut HistDelta,
        lane: usize,
    ) {
        let Some(slot) = self.frames.get_mut(idx) else {
            return;
        };
        let before = *slot;
        let Some((after, from, to)) = rh.fresh::<RATE>(before, w) else {
            self.merge_hint(rh.tables(), idx, w, delta);
            return;
        };
        *slot = after;
        let class = |s: FrameState| classes[(s.0 >> CLASS_SHIFT) as usize % 512] as usize;
        delta.shift(lane, from * 4 + class(before), to * 4 + class(after));
    }

    /// A hint on a frame already hinted this round: the duplicates merge (`Tables::hint`).
    #[inline(never)]
    fn merge_hint(&mut self, t: &Tables, idx: usize, w: u64, delta: &mut HistDelta) {
        let e = HintEntry(w);
        let (round, counts) = (self.round as u8, self.counts);
        self.merge_frame(t, idx, delta, |s| {
            t.hint(s, round, counts, e.count(), e.write(), e.page_type())
        });
    }

    /// What the units' duplicates owe, merged into each unit's frames once.
    fn merge_owed(&mut self, t: &Tables, delta: &mut HistDelta, st: &mut IngestStats) {
        let counts = self.counts;
        let units = std::mem::take(&mut self.unit_hints);
        for (&head, u) in &units {
            let (deg, write) = u.owed;
            if deg <= u.applied.0 && (!write || u.applied.1) {
                continue;
            }
            st.unit_passes += 1;
            for i in head..head + HUGE_FRAMES as usize {
                self.merge_frame(t, i, delta, |s| t.merge_degree(s, counts, deg, write));
            }
        }
        // Kept for its allocation.
        self.unit_hints = units;
    }

    /// Merges into frame `idx` (hinted this round) with `merge`, moving it in the histogram.
    #[inline(always)]
    fn merge_frame(
        &mut self,
        t: &Tables,
        idx: usize,
        delta: &mut HistDelta,
        merge: impl FnOnce(&mut FrameState),
    ) {
        let before = self.frames[idx];
        let mut after = before;
        merge(&mut after);
        self.frames[idx] = after;
        let node = before.node_raw();
        if node == NODE_UNKNOWN {
            return;
        }
        let base = self.is_fast[node as usize % NODES] as usize * 2;
        let file = |s: FrameState| (s.page_type() == PageType::File) as usize;
        let from = t.ring_slot(before, self.round).unwrap_or(COLD_SLOT);
        // A hinted frame has age 0: always live, at the level of its score.
        let to = t.ring_slot_fresh(after, self.round);
        delta.shift(
            0,
            from * 4 + base + file(before),
            to * 4 + base + file(after),
        );
    }

    /// Adds a round's histogram moves to the histogram.
    fn add_to_histogram(&mut self, delta: &HistDelta) {
        let frames = self.frames.len() as u64;
        for (slot, counts) in self.hist.iter_mut().enumerate() {
            for (class, n) in counts.iter_mut().enumerate() {
                let cell = slot * 4 + class;
                let sum = (*n as u32)
                    .wrapping_add(delta.0[0][cell])
                    .wrapping_add(delta.0[1][cell]) as u64;
                debug_assert!(
                    sum <= frames,
                    "histogram underflow at slot {slot} class {class}"
                );
                *n = if sum <= frames { sum } else { 0 };
            }
        }
    }

    /// Dense index of a frame, searching the RAM ranges when it is not in `span` (then the range
    /// found becomes `span`).
    #[inline]
    fn locate(&self, gfn: u64, span: &mut Span) -> Option<u64> {
        if gfn >= span.start && gfn < span.end {
            return Some(span.first + (gfn - span.start));
        }
        let k = self
            .spans
            .partition_point(|s| s.start <= gfn)
            .checked_sub(1)?;
        let sp = self.spans[k];
        if gfn < sp.end {
            *span = sp;
            Some(sp.first + (gfn - sp.start))
        } else {
            None
        }
    }

    /// Whether the mark of the 2 MiB unit holding dense frame `idx` (guest frame `gfn`) may be
    /// set: a cheap filter before `ingest_entry` looks at the unit itself.
    #[inline(always)]
    fn huge_bit_near(&self, idx: u64, gfn: u64) -> bool {
        self.huge_bit((idx.wrapping_sub(gfn % HUGE_FRAMES)) as usize)
    }

    #[inline]
    fn huge_bit(&self, head_idx: usize) -> bool {
        let b = head_idx / HUGE_FRAMES as usize;
        self.huge_map
            .get(b / 64)
            .is_some_and(|w| w >> (b % 64) & 1 != 0)
    }

    fn set_huge(&mut self, head_idx: usize, on: bool) {
        self.frames[head_idx].set_huge_head(on);
        let b = head_idx / HUGE_FRAMES as usize;
        if let Some(w) = self.huge_map.get_mut(b / 64) {
            let was = *w >> (b % 64) & 1 != 0;
            if on {
                *w |= 1 << (b % 64)
            } else {
                *w &= !(1 << (b % 64))
            }
            match (was, on) {
                (false, true) => self.huge_marks += 1,
                (true, false) => self.huge_marks -= 1,
                _ => {}
            }
        }
    }
}

/// Where frame `gfn` of `span` is: `prefetch_base(..).wrapping_add(gfn)`.
fn prefetch_base(frames: &[FrameState], span: Span) -> *const FrameState {
    frames
        .as_ptr()
        .wrapping_add(span.first as usize)
        .wrapping_sub(span.start as usize)
}

#[inline(always)]
fn prefetch_read(p: *const FrameState) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: prefetch is a hint; it never faults, whatever the address.
    unsafe {
        core::arch::x86_64::_mm_prefetch(p as *const i8, core::arch::x86_64::_MM_HINT_T0)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::EngineParams;
    use crate::policy::{Policy, VmSpec};
    use crate::synth::Rng;
    use crate::topology::{NodeSpec, Topology};
    use crate::types::{NodeId, Tier, VmId};
    use crate::vtism::VtismPolicy;
    use proptest::prelude::*;
    use vtism_proto::{Gfn, GfnRange, RamMap};

    impl VmState {
        /// Ingesting a round the straightforward way, entry by entry with `Tables::hint` and
        /// the histogram moved through `uncount`/`count`: what `ingest` must equal.
        fn ingest_reference(
            &mut self,
            t: &Tables,
            counts: CountMeaning,
            entries: &[HintEntry],
        ) -> IngestStats {
            let mut st = IngestStats::default();
            self.round += 1;
            self.counts = counts;
            self.hot_rate_frames = 0;
            if counts == CountMeaning::RateLevel {
                self.rate_frames.fill(0);
            }
            self.expire(t);
            self.maintain_slice(t);
            let r = self.round as u8;
            for &e in entries {
                st.entries += 1;
                if counts == CountMeaning::RateLevel {
                    self.rate_frames[e.count() as usize] += e.frames();
                    if e.count() >= t.hot_rate_level {
                        self.hot_rate_frames += e.frames();
                    }
                }
                let gfn = e.gfn().0;
                let Some(k) = self
                    .spans
                    .iter()
                    .position(|s| s.start <= gfn && gfn < s.end)
                else {
                    st.ignored += 1;
                    continue;
                };
                let span = self.spans[k];
                let idx = (span.first + gfn - span.start) as usize;
                let head = gfn & !(HUGE_FRAMES - 1);
                let unit_in_range = head >= span.start && head + HUGE_FRAMES <= span.end;
                let head_idx = idx.wrapping_sub((gfn - head) as usize);
                if e.huge() {
                    if gfn != head || !unit_in_range {
                        st.ignored += 1;
                        continue;
                    }
                    let hs = self.frames[idx];
                    if hs.huge_head() && hs.seen() && hs.stamp() == r {
                        st.duplicate_units += 1;
                    }
                    self.set_huge(idx, true);
                    for i in idx..idx + HUGE_FRAMES as usize {
                        self.hint_reference(t, i, e);
                    }
                } else if unit_in_range && self.frames[head_idx].huge_head() {
                    let hs = self.frames[head_idx];
                    if hs.seen() && hs.stamp() == r {
                        st.covered_by_huge += 1;
                    } else {
                        self.set_huge(head_idx, false);
                    }
                    self.hint_reference(t, idx, e);
                } else {
                    self.hint_reference(t, idx, e);
                }
                st.applied += 1;
            }
            self.dirty = true;
            st
        }

        fn hint_reference(&mut self, t: &Tables, idx: usize, e: HintEntry) {
            let before = self.frames[idx];
            self.uncount(t, before);
            let mut after = before;
            let r = self.round as u8;
            t.hint(
                &mut after,
                r,
                self.counts,
                e.count(),
                e.write(),
                e.page_type(),
            );
            self.frames[idx] = after;
            self.count(t, after);
        }
    }

    /// RAM ranges of the test VM: the second and third are not 2 MiB aligned, so some units
    /// straddle a range's edge.
    fn ram() -> RamMap {
        RamMap::new(vec![
            GfnRange::new(Gfn(0), Gfn(3 * 512)),
            GfnRange::new(Gfn(4096 + 100), Gfn(4096 + 100 + 9000)),
            GfnRange::new(Gfn(20_000), Gfn(21_700)),
        ])
        .unwrap()
    }

    fn engine(params: &EngineParams, rng: &mut Rng) -> VtismPolicy {
        let node = |id, tier, cpus| NodeSpec {
            id: NodeId(id),
            tier: Tier(tier),
            capacity_bytes: 1 << 30,
            cpus,
            socket: 0,
        };
        let topo = Topology::new(vec![node(0, 0, vec![0]), node(1, 1, vec![])], None).unwrap();
        let mut e = VtismPolicy::new(topo, params.clone()).unwrap();
        e.add_vm(VmSpec {
            id: VmId(1),
            ram: ram(),
            fast_quota_bytes: 16 << 20,
            home_node: Some(NodeId(0)),
        })
        .unwrap();
        // Runs of frames on either node, and some whose node is unknown (never placed).
        for r in ram().ranges() {
            let mut g = r.start.0;
            while g < r.end.0 {
                let n = (1 + rng.below(700)).min(r.end.0 - g);
                let node = match rng.below(3) {
                    0 => None,
                    k => Some(NodeId(k as u8 - 1)),
                };
                if node.is_some() {
                    e.set_placement(VmId(1), Gfn(g), n, node).unwrap();
                }
                g += n;
            }
        }
        e
    }

    /// A round: runs of 4 KiB entries, 2 MiB units (some not whole units of the map), entries
    /// outside the map, and duplicates, in a random order or in runs.
    fn round(rng: &mut Rng, huge_share: f64) -> Vec<HintEntry> {
        let mut out = Vec::new();
        let len = 50 + rng.below(3000);
        let entry = |rng: &mut Rng, gfn: u64, huge: bool| {
            HintEntry::new(
                Gfn(gfn),
                rng.below(256) as u32,
                rng.chance(0.3),
                PageType::from_bits(rng.below(4) as u8),
                huge,
                true,
            )
        };
        while (out.len() as u64) < len {
            // Now and then far past the map (a guest's hints are not trusted).
            let past = rng.chance(0.02);
            let gfn = rng.below(if past { 1 << 20 } else { 22_000 });
            if rng.chance(huge_share) {
                let head = if rng.chance(0.9) { gfn & !511 } else { gfn };
                out.push(entry(rng, head, true));
                continue;
            }
            for g in gfn..gfn + 1 + rng.below(40) {
                out.push(entry(rng, g, false));
            }
            if rng.chance(0.2) && !out.is_empty() {
                let e = out[rng.below(out.len() as u64) as usize];
                out.push(entry(rng, e.gfn().0, e.huge()));
            }
        }
        // Units repeated with other counts, writes and types (merged once per unit).
        let units: Vec<HintEntry> = out.iter().copied().filter(|e| e.huge()).collect();
        if !units.is_empty() && rng.chance(0.5) {
            for _ in 0..rng.below(200) {
                let e = units[rng.below(units.len() as u64) as usize];
                out.push(entry(rng, e.gfn().0, true));
            }
        }
        if rng.chance(0.5) {
            for k in (1..out.len()).rev() {
                out.swap(k, rng.below(k as u64 + 1) as usize);
            }
        }
        out
    }

    fn assert_same(a: &VmState, b: &VmState, what: &str) {
        assert_eq!(a.round, b.round, "{what}: round");
        assert_eq!(a.counts, b.counts, "{what}: counts");
        if let Some(i) = (0..a.frames.len()).find(|&i| a.frames[i] != b.frames[i]) {
            panic!("{what}: frame {i}: {:?} vs {:?}", a.frames[i], b.frames[i]);
        }
        assert_eq!(a.hist, b.hist, "{what}: histogram");
        assert_eq!(a.huge_map, b.huge_map, "{what}: unit marks");
        let marks: u64 = a.huge_map.iter().map(|w| w.count_ones() as u64).sum();
        assert_eq!(b.huge_marks, marks, "{what}: marks counted");
        assert_eq!(
            a.rate_frames, b.rate_frames,
            "{what}: frames per rate level"
        );
        assert_eq!(
            a.hot_rate_frames, b.hot_rate_frames,
            "{what}: hot rate frames"
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 32, .. ProptestConfig::default() })]

        /// The fast ingest (straight path, per-round lookups, histogram deltas, and bucketing by
        /// frame) leaves every frame, the histogram, the unit marks, the rate counts and the
        /// statistics as the straightforward one does, round after round.
        #[test]
        fn fast_ingest_equals_the_straightforward_one(
            seed in any::<u64>(),
            decay in prop::sample::select(vec![0.5, 0.75, 0.93]),
            write_weight in 0u32..10,
            shift in 0u32..12,
            huge_share in prop::sample::select(vec![0.0, 0.02, 0.2]),
        ) {
            let mut rng = Rng::new(seed);
            let params = EngineParams { decay, write_weight, ..Default::default() };
            let reference = engine(&params, &mut Rng::new(seed ^ 1));
            let mut engines = [reference, engine(&params, &mut Rng::new(seed ^ 1)),
                engine(&params, &mut Rng::new(seed ^ 1))];
            let t = engines[0].tables.clone();
            let mut scratch = Vec::new();
            for r in 0..12 {
                let counts = if rng.chance(0.5) { CountMeaning::RateLevel } else { CountMeaning::RoundsSeen };
                let entries = round(&mut rng, huge_share);
                let [a, b, c] = &mut engines;
                let want = a.vms[0].ingest_reference(&t, counts, &entries);
                let straight = b.vms[0].ingest_with(&t, counts, &entries, &mut scratch, None);
                let bucketed = c.vms[0].ingest_with(&t, counts, &entries, &mut scratch, Some(shift));
                // Each unit's frames are gone over at most three times, however often it repeats.
                let units: std::collections::BTreeSet<u64> =
                    entries.iter().filter(|e| e.huge()).map(|e| e.gfn().0).collect();
                prop_assert!(straight.unit_passes <= 3 * units.len() as u64);
                prop_assert_eq!(straight.unit_passes, bucketed.unit_passes);
                let passes = |s: IngestStats| IngestStats { unit_passes: 0, ..s };
                prop_assert_eq!(passes(straight), want, "round {}", r);
                prop_assert_eq!(passes(bucketed), want, "round {}", r);
                assert_same(&a.vms[0], &b.vms[0], &format!("round {r}, straight"));
                assert_same(&a.vms[0], &c.vms[0], &format!("round {r}, bucketed"));
                a.check_histogram(VmId(1)).map_err(TestCaseError::fail)?;
            }
        }
    }
}
