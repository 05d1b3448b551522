//! Ingesting a hint round: every entry updates its frames' states and moves them between slots of
//! the VM's level histogram.
//!
//! A round is millions of entries. A large one is sorted into buckets of guest frames first
//! (`buckets`), and the entries of a bucket wholly in one RAM range take a straight path
//! (`PlainRun`): the frame by its offset in the bucket, its state before and after by per-round
//! lookups (`DecayTable`, `RoundHints`), histogram moves counted in a round-local delta. In a
//! small round, the common entry (4 KiB, in the RAM range of the one before, outside any 2 MiB
//! unit) takes a straight path of its own (`step`). Everything else takes the general path, which
//! does what the channel spec says of every case.

use super::buckets::{self, Buckets, NoTally, Packed, Tally};
use super::frame_table::{prefetch_read, BucketFrames, FramesByOffset};
use super::{FrameCounts, Span, VmState, NODES};
use crate::hotness::{
    DecayTable, FrameState, RoundHints, Tables, COLD_SLOT, DECAY_CELLS, NODE_UNKNOWN,
};
use crate::policy::IngestStats;
use vtism_proto::{entry, CountMeaning, HintEntry, PageType, HUGE_FRAMES};

/// Hints are prefetched this many entries ahead: random (cold) hints miss every cache level.
const PREFETCH_AHEAD: usize = 128;
/// Rounds of at least this many entries are sorted by bucket first (`buckets::Buckets::sort`).
const BUCKETED_MIN: usize = 1 << 16;
/// Frames per bucket at least (512 KiB of frame state, half a core's L2 cache) when the VM's
/// entries come in long runs of one bucket (`LONG_RUNS`), as guests publish them (hottest first,
/// each level in address order): a bucket's frames are visited a level at a time, in order,
/// and larger buckets make longer runs for the sort ...
const BUCKET_FRAMES_LOG2: u32 = 17;
/// ... and (128 KiB) when they do not (a round in no order): a bucket's frames are visited at
/// random, and stay in L2 among the rest ...
const SHORT_RUN_BUCKET_FRAMES_LOG2: u32 = 15;
/// (Runs are long when they are this many entries on average.)
const LONG_RUNS: usize = 4;
/// ... and buckets at most, so that the sort's write streams stay few (but buckets are at most
/// `buckets::OFFSET_BITS` frames: guests past 4 TiB have more).
const BUCKETS_LOG2: u32 = 10;

/// Cells of a level-histogram delta: `cell(slot, class)`, the classes as in `VmState::hist` and
/// one more for frames whose node is unknown (they are not counted). Room for any `u8` slot and
/// class, so that indexes by them need no bounds check.
const CELLS: usize = 4096;
/// Cells per slot.
const SLOT_CELLS: usize = 8;
/// The class of frames whose node is unknown.
const UNCOUNTED: u8 = 4;
const _: () = assert!(255 * SLOT_CELLS + 255 < CELLS && (UNCOUNTED as usize) < SLOT_CELLS);

/// The delta cell of histogram slot `slot`, class `class`.
#[inline(always)]
fn cell(slot: u8, class: u8) -> usize {
    slot as usize * SLOT_CELLS + class as usize
}

/// Frame state bits 21-29 (page type, write, node) give a frame's histogram class ...
const CLASS_SHIFT: u32 = 21;
/// ... looked up by all the bits from there (`Cursor::classes`), which need no mask.
const CLASS_CELLS: usize = 1 << (u32::BITS - CLASS_SHIFT);

/// Histogram moves of one round, added to the VM's histogram when the round is in. Two copies,
/// which the small rounds' loop uses alternately so that consecutive entries moving frames
/// between the same slots do not wait on each other's counter (the buckets' loop measured no
/// better for it, and uses one).
/// Modulo 2^32: a cell goes below zero when frames leave it before others arrive, and every count
/// and its sum with the delta is below 2^32 (`EngineError::VmTooLarge`), so the sum is exact.
struct HistDelta(Box<[[u32; CELLS]; 2]>);

impl HistDelta {
    fn new() -> Self {
        HistDelta(Box::new([[0; CELLS]; 2]))
    }

    #[inline(always)]
    fn shift(&mut self, lane: usize, from: usize, to: usize) {
        self.shift_n(lane, from, to, 1);
    }

    /// `n` frames from cell `from` to cell `to`.
    #[inline(always)]
    fn shift_n(&mut self, lane: usize, from: usize, to: usize, n: u32) {
        let d = &mut self.0[lane % 2];
        d[from % CELLS] = d[from % CELLS].wrapping_sub(n);
        d[to % CELLS] = d[to % CELLS].wrapping_add(n);
    }

    /// `n` frames more in cell `at`.
    fn add(&mut self, at: usize, n: u32) {
        let d = &mut self.0[0][at % CELLS];
        *d = d.wrapping_add(n);
    }

    /// A frame less in cell `at`.
    #[inline(always)]
    fn leave(&mut self, at: usize) {
        let d = &mut self.0[0][at % CELLS];
        *d = d.wrapping_sub(1);
    }
}

/// The histogram class of a frame of a VM whose fast nodes are `is_fast` (`VmState::class_of`).
#[inline]
fn class_of(is_fast: &[bool; NODES], s: FrameState) -> u8 {
    match s.node_raw() {
        NODE_UNKNOWN => UNCOUNTED,
        n => is_fast[n as usize % NODES] as u8 * 2 + (s.page_type() == PageType::File) as u8,
    }
}

impl FrameCounts<'_> {
    /// `merge` on the state `before` of `n` frames hinted this round, with their histogram move.
    #[inline(always)]
    fn merged(
        &self,
        t: &Tables,
        before: FrameState,
        n: u32,
        delta: &mut HistDelta,
        merge: impl FnOnce(&mut FrameState),
    ) -> FrameState {
        let mut after = before;
        merge(&mut after);
        let from = t.ring_slot(before, self.round).unwrap_or(COLD_SLOT) as u8;
        // A hinted frame has age 0: always live, at the level of its score.
        let to = t.ring_slot_fresh(after, self.round) as u8;
        let class = |s| class_of(self.is_fast, s);
        delta.shift_n(0, cell(from, class(before)), cell(to, class(after)), n);
        after
    }
}

/// A frame's histogram class, looked up in `classes` (`VmState::cell_classes`).
#[inline(always)]
fn class_in(classes: &[u8; CLASS_CELLS], s: FrameState) -> u8 {
    classes[(s.0 >> CLASS_SHIFT) as usize % CLASS_CELLS]
}

/// Where the entry loop is: the RAM range of the last entry.
struct Cursor {
    classes: [u8; CLASS_CELLS],
    span: Span,
}

/// A 2 MiB unit hinted in this round (by its head's index): what its entries have merged into
/// every frame of the unit, and what later duplicates still owe. Duplicates merge as a maximum
/// and an OR, so a duplicate that adds nothing is skipped and the others are merged once when
/// the round is in: a guest repeating one unit a million times costs one entry each, not 512
/// frame updates each (docs/host.md, "Threat model"). Degrees are below 32: a byte each, as a
/// round can hint every unit of the VM.
#[derive(Clone, Copy, Debug)]
pub(super) struct UnitHint {
    /// Largest degree and write merged into every frame of the unit.
    applied: (u8, bool),
    /// Largest degree and write of the duplicates not merged yet.
    owed: (u8, bool),
    /// An entry of the unit had a known page type, so every frame's type is known.
    typed: bool,
}

/// Entries per rate level of one rate-level round, 4 KiB ones and 2 MiB ones apart, in two copies
/// as in `HistDelta`. Indexed by an entry's bits 40-51 less write and page type (`RATE_INDEX`):
/// the level, and the 2 MiB bit as bit 11.
struct RateCounts(Box<[[u64; RATE_CELLS]; 2]>);

/// Bits of `entry >> COUNT_SHIFT` that index `RateCounts`: the count and the 2 MiB bit.
const RATE_INDEX: usize = 0x8ff;
const RATE_CELLS: usize = RATE_INDEX + 1;
const RATE_HUGE: usize = 0x800;
const _: () = assert!(entry::HUGE_BIT == (RATE_HUGE as u64) << entry::COUNT_SHIFT);

/// A large round's rates are counted while it is sorted, a run of one level at a time.
impl Tally for RateCounts {
    const BITS: u64 = (RATE_INDEX as u64) << entry::COUNT_SHIFT;
    #[inline(always)]
    fn tally(&mut self, w: u64, n: usize) {
        self.0[0][(w >> entry::COUNT_SHIFT) as usize & RATE_INDEX] += n as u64;
    }
}

impl RateCounts {
    fn new() -> Self {
        RateCounts(Box::new([[0; RATE_CELLS]; 2]))
    }

    #[inline(always)]
    fn count(&mut self, lane: usize, w: u64) {
        self.0[lane % 2][(w >> entry::COUNT_SHIFT) as usize & RATE_INDEX] += 1;
    }

    /// Frames at rate level `l`.
    fn frames(&self, l: usize) -> u64 {
        let entries = |at: usize| self.0[0][at] + self.0[1][at];
        entries(l) + entries(RATE_HUGE + l) * HUGE_FRAMES
    }
}

/// The straight path through one bucket's entries when the bucket lies wholly in one RAM range:
/// an entry's frame is its offset in the bucket (`buckets::Packed`), with no range lookup, and
/// its state before and after come from `DecayTable` and `RoundHints` lookups.
struct PlainRun<'a, 't> {
    rh: &'a RoundHints<'t>,
    decay: &'a [u16; DECAY_CELLS],
    classes: &'a [u8; CLASS_CELLS],
    /// The dense index of the bucket's first frame.
    first: usize,
    huge_map: &'a [u64],
    /// The VM's round, and what its counts mean.
    round: u64,
    counts: CountMeaning,
}

impl PlainRun<'_, '_> {
    /// Takes the first of the `n` first `entries`, all in the bucket, until one needs more than
    /// the straight path: a 2 MiB entry, one in a marked 2 MiB unit (`MARKED`: the VM has
    /// marks), or one whose frame has no state of its own (`frame_table`). Returns how many it
    /// took. `entries` goes on past the `n` by at least `PREFETCH_AHEAD` (`Buckets::bucket`), so
    /// that every entry prefetches.
    fn take<const RATE: bool>(
        &self,
        frames: BucketFrames<'_>,
        entries: &[Packed],
        n: usize,
        delta: &mut HistDelta,
        marked: bool,
    ) -> usize {
        match (frames, marked) {
            (BucketFrames::Flat(f), false) => self.take_in::<RATE, false>(f, entries, n, delta),
            (BucketFrames::Flat(f), true) => self.take_in::<RATE, true>(f, entries, n, delta),
            (BucketFrames::Chunked(f), false) => self.take_in::<RATE, false>(f, entries, n, delta),
            (BucketFrames::Chunked(f), true) => self.take_in::<RATE, true>(f, entries, n, delta),
        }
    }

    #[inline(never)]
    fn take_in<const RATE: bool, const MARKED: bool>(
        &self,
        mut frames: impl FramesByOffset,
        entries: &[Packed],
        n: usize,
        delta: &mut HistDelta,
    ) -> usize {
        // The frame's offset in the bucket, or past it for a 2 MiB entry.
        let in_bucket = frames.len() as Packed - 1;
        let offset =
            in_bucket | (entry::HUGE_BIT >> (entry::COUNT_SHIFT - buckets::OFFSET_BITS)) as Packed;
        let ahead = &entries[PREFETCH_AHEAD..PREFETCH_AHEAD + n];
        for (k, (&e, &a)) in entries[..n].iter().zip(ahead).enumerate() {
            let Some(slot) = frames.get_mut((e & offset) as usize) else {
                return k;
            };
            let off = (e & in_bucket) as usize;
            if MARKED
                && huge_bit(
                    self.huge_map,
                    self.first + (off & !(HUGE_FRAMES as usize - 1)),
                )
            {
                return k;
            }
            let before = *slot;
            let class = |s| class_in(self.classes, s);
            let hint = buckets::hint_bits(e);
            match self.rh.fresh_looked_up::<RATE>(self.decay, before, hint) {
                Some((after, from, to)) => {
                    *slot = after;
                    // One lane: two, alternating, measured slower.
                    delta.shift(0, cell(from, class(before)), cell(to, class(after)));
                }
                None => {
                    let (rh, classes) = (self.rh, self.classes);
                    merge_hinted::<RATE>(rh, classes, self.round, self.counts, slot, hint, delta);
                }
            }
            // The frame of an entry further on, if it is in this bucket; if not, some frame of
            // it. (Once done with this entry's frame, which holds `frames`.)
            frames.prefetch((a & in_bucket) as usize);
        }
        n
    }
}

/// Rows of `Straight`'s lookups by hint: a packed entry's bits from `buckets::OFFSET_BITS` up
/// (hint bits and the 2 MiB bit), so that an entry's row needs no mask. Rows with the 2 MiB bit
/// repeat those without (the entries that use these lookups are 4 KiB ones).
const PACKED_HINTS: usize = 1 << (Packed::BITS - buckets::OFFSET_BITS);
/// Cells of `Straight`'s lookups by hint and class: `PACKED_HINTS` rows of `SLOT_CELLS`, and room
/// for any `u8` class.
const HINT_CLASS_CELLS: usize = PACKED_HINTS * SLOT_CELLS + 256;

/// What the straight path through a bucket without a 2 MiB entry or unit (`StraightRun`) looks
/// up, filled once per large round, behind one pointer: `DecayTable`, `RoundHints`' lookups per
/// hint, and where a hint takes a frame of each histogram class.
struct Straight {
    decay: DecayTable,
    /// Per packed hint: the bits of a frame's state a fresh hint keeps and those it sets
    /// (`RoundHints::per_hint`).
    kept: [[u32; 2]; PACKED_HINTS],
    /// Rounds seen: per packed hint, the degree added to the decayed score.
    add: [u8; PACKED_HINTS],
    /// Rate levels: at `h * SLOT_CELLS + class`, the delta cell a hint with packed hint bits `h`
    /// takes a frame of histogram class `class` to (its slot is the hint's, its class the
    /// frame's after the hint).
    to_cell: [u16; HINT_CLASS_CELLS],
    /// Rate levels: frames a hint took to `to_cell[at]`, by `at`, counted there instead of in
    /// the delta (which takes one lookup less per entry) until `flush`.
    hinted: [u32; HINT_CLASS_CELLS],
    /// Rounds seen: at `h * SLOT_CELLS + class`, the class after the hint (the slot depends on
    /// the frame's decayed score).
    class_after: [u8; HINT_CLASS_CELLS],
    /// Rounds seen: ring slot of a hinted frame by its new score (`RoundHints::score_slots`).
    score_slot: [u8; 256],
    /// Rounds seen: frames hinted to each score and class, at `cell(score, class)` (room for
    /// any `u8` class), until `flush`.
    scored: [u32; 256 * SLOT_CELLS + 256],
    /// The VM's classes (`VmState::cell_classes`).
    classes: [u8; CLASS_CELLS],
}

impl Straight {
    fn new() -> Box<Self> {
        Box::new(Straight {
            decay: DecayTable::new(),
            kept: [[0; 2]; PACKED_HINTS],
            add: [0; PACKED_HINTS],
            to_cell: [0; HINT_CLASS_CELLS],
            hinted: [0; HINT_CLASS_CELLS],
            class_after: [0; HINT_CLASS_CELLS],
            score_slot: [0; 256],
            scored: [0; 256 * SLOT_CELLS + 256],
            classes: [0; CLASS_CELLS],
        })
    }

    /// The lookups of the round of `rh` for a VM whose classes are `classes`, rate levels if
    /// `rate`.
    fn fill(&mut self, rh: &RoundHints<'_>, classes: &[u8; CLASS_CELLS], rate: bool) {
        rh.fill_decay_table(&mut self.decay);
        for p in 0..PACKED_HINTS {
            let h = p % (1 << 11);
            let (keep, set, add, slot) = rh.per_hint(h);
            self.kept[p] = [keep, set];
            self.add[p] = add;
            let page_type = HintEntry((h as u64) << entry::COUNT_SHIFT).page_type();
            for class in 0..SLOT_CELLS as u8 {
                let at = p * SLOT_CELLS + class as usize;
                let after = class_after(class, page_type);
                if rate {
                    self.to_cell[at] = cell(slot, after) as u16;
                } else {
                    self.class_after[at] = after;
                }
            }
        }
        self.score_slot = *rh.score_slots();
        self.classes = *classes;
    }

    /// Adds the frames counted in `hinted` or `scored` to `delta`, and clears them.
    fn flush<const RATE: bool>(&mut self, delta: &mut HistDelta) {
        if RATE {
            for (n, &to) in self.hinted.iter_mut().zip(&self.to_cell) {
                delta.add(to as usize, std::mem::take(n));
            }
        } else {
            debug_assert!(self.scored[256 * SLOT_CELLS..].iter().all(|&n| n == 0));
            for (at, n) in self.scored[..256 * SLOT_CELLS].iter_mut().enumerate() {
                let (score, class) = (at / SLOT_CELLS, at % SLOT_CELLS);
                let to = cell(self.score_slot[score], class as u8);
                delta.add(to, std::mem::take(n));
            }
        }
    }
}

/// The histogram class (`VmState::class_of`) of a frame of class `class` after a hint whose page
/// type is `hinted`: the hint keeps the node, and sets the page type if it has one.
fn class_after(class: u8, hinted: PageType) -> u8 {
    match (class, hinted) {
        (UNCOUNTED, _) | (_, PageType::Unknown) => class,
        (c, t) => (c & 2) | (t == PageType::File) as u8,
    }
}

/// The straight path through a bucket that lies wholly in one RAM range and has no 2 MiB entry
/// and no marked 2 MiB unit: every entry takes it, with no check. The frame is the entry's
/// offset in the bucket, its state before and after and its histogram cells before and after
/// come from `Straight`'s lookups.
struct StraightRun<'a, 't> {
    rh: &'a RoundHints<'t>,
    tabs: &'a mut Straight,
    /// The bucket's frames: a power of two.
    frames: &'a mut [FrameState],
    /// The VM's round, and what its counts mean.
    round: u64,
    counts: CountMeaning,
}

impl StraightRun<'_, '_> {
    /// Takes the `n` first `entries`, all in the bucket and 4 KiB. `entries` goes on past the
    /// `n` by at least `PREFETCH_AHEAD` (`Buckets::bucket`), so that every entry prefetches.
    #[inline(never)]
    fn take<const RATE: bool>(self, entries: &[Packed], n: usize, delta: &mut HistDelta) {
        let in_bucket = self.frames.len() - 1;
        debug_assert!(self.frames.len().is_power_of_two());
        let frames = &mut self.frames[..=in_bucket];
        let base = frames.as_ptr();
        let t = self.tabs;
        let ahead = &entries[PREFETCH_AHEAD..PREFETCH_AHEAD + n];
        for (&e, &a) in entries[..n].iter().zip(ahead) {
            prefetch_read(base.wrapping_add(a as usize & in_bucket));
            let slot = &mut frames[e as usize & in_bucket];
            let before = *slot;
            // The hint bits, and the 2 MiB bit (clear).
            let h = (e >> buckets::OFFSET_BITS) as usize;
            let Some((from, decayed)) = t.decay.before(before) else {
                let hint = buckets::hint_bits(e);
                merge_hinted::<RATE>(
                    self.rh,
                    &t.classes,
                    self.round,
                    self.counts,
                    slot,
                    hint,
                    delta,
                );
                continue;
            };
            let [keep, set] = t.kept[h];
            let class = class_in(&t.classes, before);
            let after = (before.0 & keep) | set;
            let at = h * SLOT_CELLS + class as usize;
            let after = if RATE {
                t.hinted[at] += 1;
                after
            } else {
                let score = (decayed as u32 + t.add[h] as u32).min(255);
                t.scored[cell(score as u8, t.class_after[at])] += 1;
                after | score
            };
            *slot = FrameState(after);
            delta.leave(cell(from, class));
        }
    }
}

/// A hint (hint bits `hint`) on a frame hinted this round already (`slot`), on the straight path
/// of the VM in `round` whose counts mean `counts`: the hints merge. Apart from the fresh hint's
/// path, which is shorter without a join.
#[inline(always)]
fn merge_hinted<const RATE: bool>(
    rh: &RoundHints<'_>,
    classes: &[u8; CLASS_CELLS],
    round: u64,
    counts: CountMeaning,
    slot: &mut FrameState,
    hint: usize,
    delta: &mut HistDelta,
) {
    let before = *slot;
    let Some((after, from, to)) = rh.merge_looked_up::<RATE>(before, hint) else {
        let w = (hint as u64) << entry::COUNT_SHIFT;
        merge_duplicate(rh.tables(), round, counts, classes, slot, w, delta);
        return;
    };
    *slot = after;
    let class = |s| class_in(classes, s);
    delta.shift(0, cell(from, class(before)), cell(to, class(after)));
}

/// A hint on a frame not seen that `RoundHints::fresh_looked_up` takes for one hinted this round
/// already (in the round in 256 whose stamp is 0, see `RoundHints::fill_decay_table`):
/// `Tables::hint` tells them apart, and the frame moves in the histogram as
/// `VmState::merge_frame` moves it.
#[cold]
fn merge_duplicate(
    t: &Tables,
    round: u64,
    counts: CountMeaning,
    classes: &[u8; CLASS_CELLS],
    slot: &mut FrameState,
    w: u64,
    delta: &mut HistDelta,
) {
    let e = HintEntry(w);
    let before = *slot;
    let mut after = before;
    t.hint(
        &mut after,
        round as u8,
        counts,
        e.count(),
        e.write(),
        e.page_type(),
    );
    *slot = after;
    let from = t.ring_slot(before, round).unwrap_or(COLD_SLOT) as u8;
    let to = t.ring_slot_fresh(after, round) as u8;
    let class = |s| class_in(classes, s);
    delta.shift(0, cell(from, class(before)), cell(to, class(after)));
}

/// What ingesting a large round needs besides the VM, kept between rounds for its allocations
/// (one per engine, whatever the number of VMs).
#[derive(Default)]
pub(super) struct IngestScratch {
    buckets: Buckets,
    /// This round's lookups for the straight path (`DecayTable` among them).
    straight: Option<Box<Straight>>,
    /// A bucket's entries unpacked, for the general path.
    unpacked: Vec<u64>,
}

impl IngestScratch {
    pub(super) fn memory_bytes(&self) -> usize {
        self.buckets.memory_bytes()
            + self
                .straight
                .as_ref()
                .map_or(0, |_| std::mem::size_of::<Straight>())
            + self.unpacked.capacity() * std::mem::size_of::<u64>()
    }
}

/// A large round sorted into buckets, with what the straight path looks up.
struct Sorted<'a> {
    buckets: &'a Buckets,
    /// Frames per bucket, as a shift.
    shift: u32,
    straight: &'a mut Straight,
}

/// The frames of a bucket that lies wholly in one RAM range.
#[derive(Clone, Copy)]
struct PlainBucket {
    /// Its first guest frame.
    start: u64,
    /// The dense index of that frame.
    first: usize,
    frames: usize,
}

impl VmState {
    /// Ingests one round of entries. `scratch` holds a large round's entries sorted by where
    /// their frames are.
    pub(super) fn ingest(
        &mut self,
        t: &Tables,
        counts: CountMeaning,
        entries: &[HintEntry],
        scratch: &mut IngestScratch,
    ) -> IngestStats {
        let bucketing = (entries.len() >= BUCKETED_MIN).then(|| self.bucket_shift());
        self.ingest_with(t, counts, entries, scratch, bucketing)
    }

    /// Guest frames per bucket, as a shift of the frame number: a bucket's frame states fit a
    /// core's L2 cache, and the buckets are few. By the VM's last large round: entries in long
    /// runs (or no such round yet) take larger buckets than entries in no order.
    fn bucket_shift(&self) -> u32 {
        let end = self.spans.last().map_or(0, |s| s.end);
        let least = match self.long_runs {
            true => BUCKET_FRAMES_LOG2,
            false => SHORT_RUN_BUCKET_FRAMES_LOG2,
        };
        least
            .max((u64::BITS - end.leading_zeros()).saturating_sub(BUCKETS_LOG2))
            .min(buckets::OFFSET_BITS)
    }

    /// `ingest`, with the entries sorted into buckets of `1 << shift` frames first if
    /// `bucketing` is `Some(shift)`.
    fn ingest_with(
        &mut self,
        t: &Tables,
        counts: CountMeaning,
        entries: &[HintEntry],
        scratch: &mut IngestScratch,
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
        let words = HintEntry::as_words(entries);
        self.unit_hints.clear();
        match (bucketing, rate) {
            (Some(shift), rate) => {
                // At least a 2 MiB unit per bucket, so that a unit's entries share one.
                let shift = shift.max(HUGE_FRAMES.trailing_zeros());
                let last = (self.spans.last().map_or(0, |s| s.end) >> shift) as usize;
                let buckets = &mut scratch.buckets;
                let room = &mut self.bucket_room;
                let (ahead, in_runs) = (PREFETCH_AHEAD, self.long_runs);
                if rate {
                    buckets.sort(words, shift, last, room, ahead, in_runs, &mut rates);
                } else {
                    buckets.sort(words, shift, last, room, ahead, in_runs, &mut NoTally);
                }
                st.ignored += buckets.past();
                self.long_runs = buckets.runs() * LONG_RUNS <= buckets.runs_of();
                let straight = scratch.straight.get_or_insert_with(Straight::new);
                straight.fill(&rh, &self.cell_classes(), rate);
                let sorted = Sorted {
                    buckets,
                    shift,
                    straight,
                };
                let unpacked = &mut scratch.unpacked;
                if rate {
                    self.ingest_buckets::<true>(&rh, sorted, unpacked, &mut delta, &mut st);
                } else {
                    self.ingest_buckets::<false>(&rh, sorted, unpacked, &mut delta, &mut st);
                }
            }
            (None, true) => {
                let mut c = self.cursor();
                self.ingest_words::<true>(
                    &rh,
                    &mut c,
                    words,
                    &mut delta,
                    &mut st,
                    Some(&mut rates),
                );
            }
            (None, false) => {
                let mut c = self.cursor();
                self.ingest_words::<false>(&rh, &mut c, words, &mut delta, &mut st, None);
            }
        }
        if rate {
            for (l, n) in self.rate_frames.iter_mut().enumerate() {
                *n = rates.frames(l);
            }
            self.hot_rate_frames = self.rate_frames[t.hot_rate_level as usize..].iter().sum();
        }
        self.merge_owed(t, &mut delta, &mut st);
        self.add_to_histogram(&delta);
        st.applied = st.entries - st.ignored;
        self.dirty = true;
        st
    }

    /// The entry loop over sorted entries, bucket by bucket (then those that overflowed their
    /// bucket): a bucket wholly in one RAM range takes the straight path without range lookups
    /// (`ingest_plain`), others take `step` (their entries unpacked into `unpacked`).
    fn ingest_buckets<const RATE: bool>(
        &mut self,
        rh: &RoundHints<'_>,
        sorted: Sorted<'_>,
        unpacked: &mut Vec<u64>,
        delta: &mut HistDelta,
        st: &mut IngestStats,
    ) {
        let mut c = self.cursor();
        let mut span = 0;
        let shift = sorted.shift;
        for b in 0..sorted.buckets.len() {
            let (entries, n) = sorted.buckets.bucket(b);
            let start = (b as u64) << shift;
            let stop = start + (1 << shift);
            while span + 1 < self.spans.len() && self.spans[span].end <= start {
                span += 1;
            }
            let plain = self
                .spans
                .get(span)
                .filter(|s| s.start <= start && stop <= s.end)
                .map(|s| PlainBucket {
                    start,
                    first: (s.first + (start - s.start)) as usize,
                    frames: 1 << shift,
                });
            let tabs = &mut *sorted.straight;
            match plain {
                Some(bucket) => {
                    let straight = !sorted.buckets.has_huge(b) && !self.marks_in(bucket);
                    let bucket = (bucket, entries, n);
                    self.ingest_plain::<RATE>(rh, tabs, straight, &mut c, bucket, delta, st)
                }
                None => {
                    unpacked.clear();
                    unpacked.extend(entries[..n].iter().map(|&e| buckets::unpack(e, start)));
                    self.ingest_words::<RATE>(rh, &mut c, unpacked, delta, st, None);
                }
            }
        }
        sorted.straight.flush::<RATE>(delta);
        self.ingest_words::<RATE>(rh, &mut c, sorted.buckets.overflow(), delta, st, None);
    }

    /// Whether a 2 MiB unit whose head is among `bucket`'s frames is marked.
    fn marks_in(&self, bucket: PlainBucket) -> bool {
        let unit = HUGE_FRAMES as usize;
        self.huge_marks > 0
            && (bucket.first..bucket.first + bucket.frames)
                .step_by(unit)
                .any(|head| self.huge_bit(head))
    }

    /// The first `n` of a bucket's `entries`, all in `bucket`'s part of the guest frames:
    /// `StraightRun::take` (`straight`: the bucket has no 2 MiB entry and no marked unit) or
    /// `PlainRun::take` takes them until one needs more, which takes the general path.
    #[allow(clippy::too_many_arguments)]
    fn ingest_plain<const RATE: bool>(
        &mut self,
        rh: &RoundHints<'_>,
        tabs: &mut Straight,
        straight: bool,
        c: &mut Cursor,
        (bucket, entries, n): (PlainBucket, &[Packed], usize),
        delta: &mut HistDelta,
        st: &mut IngestStats,
    ) {
        let mut i = 0;
        while i < n {
            let frames = self.frames.bucket(bucket.first, bucket.frames);
            let (round, counts) = (self.round, self.counts);
            let rest = &entries[i..];
            // A table kept per chunk (a VM with host folios) takes `PlainRun`, which finds frames
            // with no state of their own (`frame_table`).
            i += match frames {
                BucketFrames::Flat(frames) if straight => {
                    let run = StraightRun {
                        rh,
                        tabs,
                        frames,
                        round,
                        counts,
                    };
                    run.take::<RATE>(rest, n - i, delta);
                    n - i
                }
                frames => {
                    let run = PlainRun {
                        rh,
                        decay: tabs.decay.cells(),
                        classes: &c.classes,
                        first: bucket.first,
                        huge_map: &self.huge_map,
                        round,
                        counts,
                    };
                    let marked = self.huge_marks > 0;
                    run.take::<RATE>(frames, rest, n - i, delta, marked)
                }
            };
            if i == n {
                break;
            }
            let w = buckets::unpack(entries[i], bucket.start);
            self.ingest_entry::<RATE>(rh, c, w, delta, st, 0);
            i += 1;
        }
    }

    /// A cursor at the first RAM range.
    fn cursor(&self) -> Cursor {
        let span = self.spans.first().copied().unwrap_or(Span {
            start: 0,
            end: 0,
            first: 0,
        });
        Cursor {
            classes: self.cell_classes(),
            span,
        }
    }

    /// The entry loop. `RATE`: the counts are rate levels, counted per level in `rates` if
    /// given.
    fn ingest_words<const RATE: bool>(
        &mut self,
        rh: &RoundHints<'_>,
        c: &mut Cursor,
        words: &[u64],
        delta: &mut HistDelta,
        st: &mut IngestStats,
        mut rates: Option<&mut RateCounts>,
    ) {
        // Pairs of entries, the first on lane 0 and the second on lane 1 of the delta; the last
        // `PREFETCH_AHEAD` (and an odd one) without prefetching.
        let split = words.len().saturating_sub(PREFETCH_AHEAD) & !1;
        let (with_ahead, tail) = words.split_at(split);
        let ahead = &words[PREFETCH_AHEAD.min(words.len())..];
        for (w, a) in with_ahead.chunks_exact(2).zip(ahead.chunks_exact(2)) {
            // Where the frames are if they are in the same range.
            self.prefetch(c.span, a[0]);
            self.step::<RATE>(rh, c, delta, st, rates.as_deref_mut(), 0, w[0]);
            self.prefetch(c.span, a[1]);
            self.step::<RATE>(rh, c, delta, st, rates.as_deref_mut(), 1, w[1]);
        }
        for (i, &w) in tail.iter().enumerate() {
            self.step::<RATE>(rh, c, delta, st, rates.as_deref_mut(), i, w);
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
    }

    /// Prefetches the frame of entry `w` if it is in `span`.
    #[inline(always)]
    fn prefetch(&self, span: Span, w: u64) {
        let off = (w & entry::GFN_MASK).wrapping_sub(span.start);
        if off < span.end - span.start {
            self.frames.prefetch((span.first + off) as usize);
        }
    }

    /// Histogram class by frame state bits 21-31 (page type, write, node, ...): `fast * 2 +
    /// file`, or `UNCOUNTED` for a frame whose node is unknown.
    fn cell_classes(&self) -> [u8; CLASS_CELLS] {
        let mut c = [0u8; CLASS_CELLS];
        for (bits, class) in c.iter_mut().enumerate() {
            *class = self.class_of(FrameState((bits as u32) << CLASS_SHIFT));
        }
        c
    }

    /// A frame's histogram class: `fast * 2 + file`, or `UNCOUNTED` when its node is unknown.
    #[inline]
    fn class_of(&self, s: FrameState) -> u8 {
        class_of(&self.is_fast, s)
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
            let deg = rh.tables().degree(self.counts, e.count(), e.write()) as u8;
            let typed = e.page_type() != PageType::Unknown;
            let hs = self.frames.get(idx);
            let hinted = hs.huge_head() && hs.seen() && hs.stamp() == self.round as u8;
            if let Some(u) = self.unit_hints.get_mut(&(idx as u32)).filter(|_| hinted) {
                st.duplicate_units += 1;
                if !typed || u.typed {
                    u.owed = (u.owed.0.max(deg), u.owed.1 | e.write());
                    return;
                }
                // The first known page type of the unit: the frames take it now, in order.
                (u.applied, u.typed) = ((u.applied.0.max(deg), u.applied.1 | e.write()), true);
                st.unit_passes += 1;
                self.merge_hints(rh.tables(), idx..idx + HUGE_FRAMES as usize, w, delta);
                return;
            }
            // Every frame of the unit carries the unit's hotness (so counts stay per frame); the
            // head's mark makes the planner move the unit as one.
            self.set_huge(idx, true);
            st.unit_passes += 1;
            self.hint_unit::<RATE>(rh, classes, idx..idx + HUGE_FRAMES as usize, w, delta);
            let applied = (deg, e.write());
            self.unit_hints.insert(
                idx as u32,
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
            let hs = self.frames.get(head_idx);
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
        classes: &[u8; CLASS_CELLS],
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
        let class = |s| class_in(classes, s);
        delta.shift(lane, cell(from, class(before)), cell(to, class(after)));
    }

    /// A hint with entry `w` on frame `idx`, hinted this round already: `merge_hints` on one
    /// frame, out of the hot path.
    #[inline(never)]
    fn merge_hint(&mut self, t: &Tables, idx: usize, w: u64, delta: &mut HistDelta) {
        let merge = self.merge_of(t, w);
        let (frames, counts) = self.split();
        if let Some(s) = frames.get_mut(idx) {
            *s = counts.merged(t, *s, 1, delta, merge);
        }
    }

    /// A 2 MiB entry on the frames of its unit, `unit`, as `hint_frame` on each: frames kept
    /// alike (`frame_table`) take it once.
    fn hint_unit<const RATE: bool>(
        &mut self,
        rh: &RoundHints<'_>,
        classes: &[u8; CLASS_CELLS],
        unit: std::ops::Range<usize>,
        w: u64,
        delta: &mut HistDelta,
    ) {
        let merge = self.merge_of(rh.tables(), w);
        let (frames, counts) = self.split();
        let hint = |before, n, lane, delta: &mut HistDelta| {
            let Some((after, from, to)) = rh.fresh::<RATE>(before, w) else {
                return counts.merged(rh.tables(), before, n, delta, merge);
            };
            let class = |s| class_in(classes, s);
            delta.shift_n(lane, cell(from, class(before)), cell(to, class(after)), n);
            after
        };
        // Frames one by one, in a loop of their own (the compiler leaves a closure `update`
        // calls from three places out of line), take the delta's lanes in turn, as
        // `hint_frame`'s callers do.
        if let Some(frames) = frames.slice_mut(unit.clone()) {
            for (lane, s) in frames.iter_mut().enumerate() {
                *s = hint(*s, 1, lane, delta);
            }
            return;
        }
        frames.update(unit, |before, n| hint(before, n, 0, delta));
    }

    /// Hints with entry `w` on frames already hinted this round: the duplicates merge
    /// (`Tables::hint`).
    #[inline(never)]
    fn merge_hints(
        &mut self,
        t: &Tables,
        range: std::ops::Range<usize>,
        w: u64,
        delta: &mut HistDelta,
    ) {
        let merge = self.merge_of(t, w);
        self.merge_frames(t, range, delta, merge);
    }

    /// What entry `w` does to a frame already hinted this round.
    fn merge_of<'t>(&self, t: &'t Tables, w: u64) -> impl Fn(&mut FrameState) + Copy + 't {
        let e = HintEntry(w);
        let (round, counts) = (self.round as u8, self.counts);
        move |s| t.hint(s, round, counts, e.count(), e.write(), e.page_type())
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
            let unit = head as usize..head as usize + HUGE_FRAMES as usize;
            let deg = u32::from(deg);
            self.merge_frames(t, unit, delta, |s| t.merge_degree(s, counts, deg, write));
        }
        // Kept for its allocation.
        self.unit_hints = units;
    }

    /// Merges into the frames `range` (hinted this round) with `merge`, moving them in the
    /// histogram.
    fn merge_frames(
        &mut self,
        t: &Tables,
        range: std::ops::Range<usize>,
        delta: &mut HistDelta,
        merge: impl Fn(&mut FrameState) + Copy,
    ) {
        let (frames, counts) = self.split();
        // Frames one by one in a loop of their own, as in `hint_unit`.
        if let Some(frames) = frames.slice_mut(range.clone()) {
            for s in frames {
                *s = counts.merged(t, *s, 1, delta, merge);
            }
            return;
        }
        frames.update(range, |s, n| counts.merged(t, s, n, delta, merge));
    }

    /// Adds a round's histogram moves to the histogram.
    fn add_to_histogram(&mut self, delta: &HistDelta) {
        let frames = self.frames.len() as u64;
        for (slot, counts) in self.hist.iter_mut().enumerate() {
            for (class, n) in counts.iter_mut().enumerate() {
                let at = cell(slot as u8, class as u8);
                let sum = (*n as u32)
                    .wrapping_add(delta.0[0][at])
                    .wrapping_add(delta.0[1][at]) as u64;
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
        huge_bit(&self.huge_map, head_idx)
    }

    pub(super) fn set_huge(&mut self, head_idx: usize, on: bool) {
        let mut head = self.frames.get(head_idx);
        head.set_huge_head(on);
        self.frames.set(head_idx, head);
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

/// Whether `huge_map` marks the 2 MiB unit whose head is dense frame `head_idx`.
#[inline(always)]
fn huge_bit(huge_map: &[u64], head_idx: usize) -> bool {
    let b = head_idx / HUGE_FRAMES as usize;
    huge_map.get(b / 64).is_some_and(|w| w >> (b % 64) & 1 != 0)
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
                    let hs = self.frames.get(idx);
                    if hs.huge_head() && hs.seen() && hs.stamp() == r {
                        st.duplicate_units += 1;
                    }
                    self.set_huge(idx, true);
                    for i in idx..idx + HUGE_FRAMES as usize {
                        self.hint_reference(t, i, e);
                    }
                } else if unit_in_range && self.frames.get(head_idx).huge_head() {
                    let hs = self.frames.get(head_idx);
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
            let before = self.frames.get(idx);
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
            let (frames, mut counts) = self.split();
            counts.uncount(t, before, 1);
            frames.set(idx, after);
            counts.count(t, after, 1);
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
        let (fa, fb) = (&a.frames, &b.frames);
        assert_eq!(fa.len(), fb.len(), "{what}: frames");
        if let Some(i) = (0..fa.len()).find(|&i| fa.get(i) != fb.get(i)) {
            panic!("{what}: frame {i}: {:?} vs {:?}", fa.get(i), fb.get(i));
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

    /// A large round in no order makes the next one take the smaller buckets; one in runs (as
    /// guests publish) the larger ones.
    #[test]
    fn rounds_in_no_order_take_smaller_buckets() {
        let frames = 1u64 << 18;
        let node = NodeSpec {
            id: NodeId(0),
            tier: Tier(0),
            capacity_bytes: 4 << 30,
            cpus: vec![0],
            socket: 0,
        };
        let topo = Topology::new(vec![node], None).unwrap();
        let mut e = VtismPolicy::new(topo, EngineParams::default()).unwrap();
        let ram = RamMap::new(vec![GfnRange::new(Gfn(0), Gfn(frames))]).unwrap();
        e.add_vm(VmSpec {
            id: VmId(1),
            ram,
            fast_quota_bytes: 1 << 30,
            home_node: Some(NodeId(0)),
        })
        .unwrap();
        let t = e.tables.clone();
        let mut scratch = IngestScratch::default();
        let hint = |g: u64| HintEntry::new(Gfn(g), 8, false, PageType::Anon, false, true);
        let ordered: Vec<HintEntry> = (0..BUCKETED_MIN as u64).map(|i| hint(i * 3)).collect();
        let mut rng = Rng::new(9);
        let shuffled: Vec<HintEntry> = (0..BUCKETED_MIN).map(|_| hint(rng.below(frames))).collect();
        let v = &mut e.vms[0];
        assert_eq!(v.bucket_shift(), BUCKET_FRAMES_LOG2);
        v.ingest(&t, CountMeaning::RoundsSeen, &shuffled, &mut scratch);
        assert_eq!(v.bucket_shift(), SHORT_RUN_BUCKET_FRAMES_LOG2);
        v.ingest(&t, CountMeaning::RoundsSeen, &shuffled, &mut scratch);
        assert_eq!(v.bucket_shift(), SHORT_RUN_BUCKET_FRAMES_LOG2);
        v.ingest(&t, CountMeaning::RoundsSeen, &ordered, &mut scratch);
        assert_eq!(v.bucket_shift(), BUCKET_FRAMES_LOG2);
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
            let mut reference = engine(&params, &mut Rng::new(seed ^ 1));
            // The fast ingest entry by entry and bucketed, on a frame table in one array (a VM of
            // 4 KiB pages) and on one kept per chunk (a VM with host folios).
            let mut fast = [(true, None), (true, Some(shift)), (false, None), (false, Some(shift))]
                .map(|(flat, bucketing)| {
                    let mut e = engine(&params, &mut Rng::new(seed ^ 1));
                    if flat {
                        e.vms[0].frames.flatten();
                    }
                    (e, flat, bucketing)
                });
            let mut regroup = Rng::new(seed ^ 2);
            let t = reference.tables.clone();
            let mut scratch = IngestScratch::default();
            let mut entries = Vec::new();
            for r in 0..12 {
                let counts = if rng.chance(0.5) { CountMeaning::RateLevel } else { CountMeaning::RoundsSeen };
                // A new round, or the last one again with some entries changed and more of
                // them (as a steady guest publishes: the buckets' room from the last round fits
                // most of it, and what does not overflows).
                entries = if entries.is_empty() || rng.chance(0.5) {
                    round(&mut rng, huge_share)
                } else {
                    let mut again = entries;
                    let more = round(&mut rng, huge_share);
                    for e in more.iter().take(rng.below(again.len() as u64 / 8 + 1) as usize) {
                        let at = rng.below(again.len() as u64) as usize;
                        if rng.chance(0.5) {
                            again[at] = *e;
                        } else {
                            again.insert(at, *e);
                        }
                    }
                    again
                };
                let want = reference.vms[0].ingest_reference(&t, counts, &entries);
                // Each unit's frames are gone over at most three times, however often it repeats.
                let units: std::collections::BTreeSet<u64> =
                    entries.iter().filter(|e| e.huge()).map(|e| e.gfn().0).collect();
                let passes = |s: IngestStats| IngestStats { unit_passes: 0, ..s };
                let mut unit_passes = None;
                for (e, flat, bucketing) in &mut fast {
                    let what = format!("round {r}, flat {flat}, buckets {bucketing:?}");
                    if !*flat && regroup.chance(0.2) {
                        // Chunks made uniform by the last rounds taken as such at once.
                        e.vms[0].frames.flatten();
                        e.vms[0].frames.chunk_up();
                    }
                    let got = e.vms[0].ingest_with(&t, counts, &entries, &mut scratch, *bucketing);
                    prop_assert!(got.unit_passes <= 3 * units.len() as u64);
                    prop_assert_eq!(*unit_passes.get_or_insert(got.unit_passes), got.unit_passes);
                    prop_assert_eq!(passes(got), want, "{}", what);
                    assert_same(&reference.vms[0], &e.vms[0], &what);
                    e.check_histogram(VmId(1)).map_err(TestCaseError::fail)?;
                }
                reference.check_histogram(VmId(1)).map_err(TestCaseError::fail)?;
            }
        }
    }
}
