//! A large round's entries sorted by where their frames are, in buckets of guest frames whose
//! states fit a core's L2 cache, so that ingesting visits each part of the frame array once
//! instead of once per level (guests publish hottest first, each level in address order) or at
//! random.
//!
//! The sort is stable: every entry touching one frame or one 2 MiB unit lands in one bucket (a
//! bucket is at least a unit) in its order, so ingesting bucket by bucket gives what ingesting
//! in order gives. A bucket's entry is 4 bytes (`Packed`): the sort is bound by the memory it
//! writes. Entries past the last bucket are past the RAM map, where ingesting ignores them: they
//! are only counted (`past`).
//!
//! A VM's rounds look alike from one to the next, so each bucket gets room for a little more than
//! it held in the VM's last large round and the entries are copied there in one pass; the few
//! that do not fit (`overflow`) come after every bucket, which keeps each frame's entries in
//! order. Without that history, or when more than `OVERFLOW_MAX` of the entries do not fit, the
//! entries are counted per bucket first (two passes).

use vtism_proto::entry;

/// One pass gives up, for two, when more than this share (1 / 2^n) of the entries overflow.
const OVERFLOW_MAX_LOG2: u32 = 4;

/// A bucket's entry: its frame's offset in the bucket in the low `OFFSET_BITS`, and above them
/// the entry's bits 40-51 (count, write, page type, 2 MiB), all that ingesting reads of it.
pub(super) type Packed = u32;
/// Buckets are at most `1 << OFFSET_BITS` frames.
pub(super) const OFFSET_BITS: u32 = 20;
const PACKED_HINT_SHIFT: u32 = entry::COUNT_SHIFT - OFFSET_BITS;
const _: () = assert!(entry::HUGE_BIT >> PACKED_HINT_SHIFT == 1 << 31);

/// Entry `w` of a bucket whose frame offsets are `w & in_bucket`.
#[inline(always)]
fn pack(w: u64, in_bucket: u64) -> Packed {
    (((w >> PACKED_HINT_SHIFT) as Packed) & !((1 << OFFSET_BITS) - 1)) | (w & in_bucket) as Packed
}

/// The entry packed as `e` in the bucket starting at guest frame `start`, less its bits past 51.
#[inline(always)]
pub(super) fn unpack(e: Packed, start: u64) -> u64 {
    start
        | (e & ((1 << OFFSET_BITS) - 1)) as u64
        | ((e >> OFFSET_BITS) as u64) << entry::COUNT_SHIFT
}

/// The hint bits of a packed entry (count, write, page type: the entry's bits 40-50).
#[inline(always)]
pub(super) fn hint_bits(e: Packed) -> usize {
    (e >> OFFSET_BITS) as usize & 0x7ff
}

/// What is counted of every entry of a round while it is sorted, once each. Entries come in runs
/// alike in `BITS` (a guest publishes a level's frames together), so a run is counted at once
/// where it ends, which the sort finds with the same test that finds where a bucket's run ends:
/// per entry it costs nothing, where a counter per entry would make each entry wait for the one
/// before (and a pass of its own would read the round again).
pub(super) trait Tally {
    /// The bits of an entry that decide what is counted of it.
    const BITS: u64;
    /// Counts `n` entries alike with `w` in `BITS`.
    fn tally(&mut self, w: u64, n: usize);
}

/// Nothing to count.
pub(super) struct NoTally;

impl Tally for NoTally {
    const BITS: u64 = 0;
    #[inline(always)]
    fn tally(&mut self, _: u64, _: usize) {}
}

/// A round's entries by bucket, kept between rounds for its allocations.
#[derive(Default)]
pub(super) struct Buckets {
    /// Bucket `b`'s entries are `sorted[starts[b]..ends[b]]`. After the last bucket's room come
    /// `ahead` zeros, so that a loop reading `ahead` entries past its own finds entries.
    sorted: Vec<Packed>,
    /// Where each bucket's room starts, and one more: where the last one's ends.
    starts: Vec<usize>,
    ends: Vec<usize>,
    /// Entries that did not fit their bucket's room, in order.
    overflow: Vec<u64>,
    /// While copying in one pass: each bucket's next place and where its room ends.
    rooms: Vec<(usize, usize)>,
    /// Whether each bucket has a 2 MiB entry among the round's (those that overflowed
    /// included): the straight path through a bucket without one need not check each entry.
    huge: Vec<bool>,
    /// Entries past the last bucket.
    past: u64,
    /// Runs of entries of one bucket (and level) the sort worked, and of how many entries.
    runs: usize,
    runs_of: usize,
}

impl Buckets {
    /// Sorts `words` into buckets of `1 << shift` guest frames (at most `1 << OFFSET_BITS`),
    /// `last` being the last. `room` is each bucket's room, from the VM's last large round
    /// (empty if none); it becomes that of this round. `tally` counts each entry. `in_runs`:
    /// the entries are expected in runs of one bucket (`runs`), else in no order, one at a
    /// time. True if it took one pass.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn sort(
        &mut self,
        words: &[u64],
        shift: u32,
        last: usize,
        room: &mut Vec<u32>,
        ahead: usize,
        in_runs: bool,
        tally: &mut impl Tally,
    ) -> bool {
        assert!(shift <= OFFSET_BITS, "buckets of 2^{shift} frames");
        let bucket = Bucket::new(shift, last);
        self.overflow.clear();
        self.past = 0;
        self.runs = 0;
        self.runs_of = words.len();
        self.huge.clear();
        self.huge.resize(last + 1, false);
        let tallied = match (room.len() == last + 1, in_runs) {
            (true, true) => self.copy_into_room(words, bucket, room, ahead, tally),
            (true, false) => self.scatter_into_room(words, bucket, room, ahead, tally),
            (false, _) => Err(0),
        };
        let one_pass = tallied.is_ok();
        if let Err(tallied) = tallied {
            self.overflow.clear();
            self.past = 0;
            self.runs = 0;
            self.huge.fill(false);
            self.count_and_copy(words, bucket, ahead, tallied, tally);
        }
        // Room for the next round: this round's count and a sixteenth, and a few more.
        room.clear();
        room.extend(
            self.starts
                .iter()
                .zip(&self.ends)
                .map(|(s, e)| (e - s) as u32),
        );
        for &w in &self.overflow {
            room[bucket.of(w)] += 1;
        }
        for r in room.iter_mut() {
            *r += *r / 16 + 16;
        }
        one_pass
    }

    /// The entries of bucket `b`, and whatever follows them (at least `ahead` entries).
    pub(super) fn bucket(&self, b: usize) -> (&[Packed], usize) {
        (
            &self.sorted[self.starts[b]..],
            self.ends[b] - self.starts[b],
        )
    }

    /// Whether bucket `b` has a 2 MiB entry, in its room or among those that overflowed.
    pub(super) fn has_huge(&self, b: usize) -> bool {
        self.huge[b]
    }

    /// Buckets, including the last one.
    pub(super) fn len(&self) -> usize {
        self.ends.len()
    }

    /// The entries that did not fit their bucket, in order: they come after every bucket.
    pub(super) fn overflow(&self) -> &[u64] {
        &self.overflow
    }

    /// Entries past the last bucket (past the RAM map).
    pub(super) fn past(&self) -> u64 {
        self.past
    }

    /// Runs of entries of one bucket the last sort worked (in one pass, of one level too), or
    /// (an entry at a time) those among its first `RUNS_SAMPLE` entries: a round in no order
    /// has about one per entry, one published hottest first few.
    pub(super) fn runs(&self) -> usize {
        self.runs
    }

    /// Entries `runs` counts the runs of.
    pub(super) fn runs_of(&self) -> usize {
        self.runs_of
    }

    pub(super) fn memory_bytes(&self) -> usize {
        self.sorted.capacity() * std::mem::size_of::<Packed>()
            + self.overflow.capacity() * std::mem::size_of::<u64>()
            + (self.starts.capacity() + self.ends.capacity() + 2 * self.rooms.capacity())
                * std::mem::size_of::<usize>()
            + self.huge.capacity()
    }

    /// Makes `sorted` `len` entries long and `ahead` zeros more, keeping what earlier rounds left
    /// in the first `len`. It grows by an eighth more than it needs, not by doubling, so that
    /// what it holds stays about one round of entries.
    fn sized(&mut self, len: usize, ahead: usize) {
        let n = len + ahead;
        if self.sorted.capacity() < n {
            self.sorted.reserve_exact(n + n / 8 - self.sorted.len());
        }
        self.sorted.resize(n, 0);
        self.sorted[len..].fill(0);
    }

    /// Lays the buckets' rooms out (`starts`, `rooms`) as `room` says, for one pass.
    fn make_rooms(&mut self, room: &[u32], ahead: usize) {
        self.starts.clear();
        self.rooms.clear();
        let mut at = 0;
        for &r in room {
            self.starts.push(at);
            self.rooms.push((at, at + r as usize));
            at += r as usize;
        }
        self.starts.push(at);
        // Rooms' unused ends keep what earlier rounds left there: only the zeros at the end are
        // read past a bucket's entries from outside it.
        self.sized(at, ahead);
    }

    /// One pass, an entry at a time (a round in no order, where every run is an entry): each
    /// entry is copied to its bucket's room, or to `overflow` when the room is full. When too
    /// many overflow, stops, leaving things half done, and says how many entries it tallied.
    fn scatter_into_room<T: Tally>(
        &mut self,
        words: &[u64],
        bucket: Bucket,
        room: &[u32],
        ahead: usize,
        tally: &mut T,
    ) -> Result<(), usize> {
        self.make_rooms(room, ahead);
        let overflow_max = words.len() >> OVERFLOW_MAX_LOG2;
        let (sorted, rooms, overflow, huge) = (
            &mut self.sorted[..],
            &mut self.rooms[..],
            &mut self.overflow,
            &mut self.huge[..],
        );
        let (in_bucket, mut past) = (bucket.in_bucket(), 0);
        let mut it = words.iter();
        while let Some(&w) = it.next() {
            tally.tally(w, 1);
            let b = bucket.of(w);
            let Some((at, end)) = rooms.get_mut(b) else {
                past += 1;
                continue;
            };
            if w & entry::HUGE_BIT != 0 {
                huge[b] = true;
            }
            if *at < *end {
                sorted[*at] = pack(w, in_bucket);
                *at += 1;
            } else {
                if overflow.len() == overflow_max {
                    return Err(words.len() - it.len());
                }
                overflow.push(w);
            }
        }
        self.past = past;
        // Whether the entries still come in no order, by the first of them.
        let sample = &words[..words.len().min(RUNS_SAMPLE)];
        (self.runs, self.runs_of) = (runs_in(sample, bucket), sample.len());
        self.ends.clear();
        self.ends.extend(self.rooms.iter().map(|r| r.0));
        Ok(())
    }

    /// One pass, a run at a time: each entry is copied to its bucket's room, or to `overflow`
    /// when the room is full. When too many overflow, stops, leaving things half done, and says
    /// how many entries it tallied.
    fn copy_into_room<T: Tally>(
        &mut self,
        words: &[u64],
        bucket: Bucket,
        room: &[u32],
        ahead: usize,
        tally: &mut T,
    ) -> Result<(), usize> {
        self.make_rooms(room, ahead);
        let overflow_max = words.len() >> OVERFLOW_MAX_LOG2;
        let (sorted, rooms, overflow, huge) = (
            &mut self.sorted[..],
            &mut self.rooms[..],
            &mut self.overflow,
            &mut self.huge[..],
        );
        let bits = bucket.bits() | T::BITS | entry::HUGE_BIT;
        let mut tallied = 0;
        let mut rest = words;
        // A run of entries alike in `bits` at a time: copied as far as the bucket's room goes
        // while it is found, the rest of it after that.
        while let Some(&first) = rest.first() {
            let b = bucket.of(first);
            self.runs += 1;
            let n = match rooms.get_mut(b) {
                Some((at, end)) => {
                    if first & entry::HUGE_BIT != 0 {
                        huge[b] = true;
                    }
                    // A run of one (every run, in a round in no order) on its own.
                    let one = rest.get(1).is_none_or(|&w| (w ^ first) & bits != 0);
                    if one && *at < *end {
                        sorted[*at] = pack(first, bucket.in_bucket());
                        *at += 1;
                        tally.tally(first, 1);
                        tallied += 1;
                        rest = &rest[1..];
                        continue;
                    }
                    let room = &mut sorted[*at..*end];
                    let fit = copy_alike(room, rest, bits, bucket.in_bucket());
                    *at += fit;
                    let n = fit + run_len(&rest[fit..], first, bits);
                    if n > fit {
                        if overflow.len() + n - fit > overflow_max {
                            return Err(tallied);
                        }
                        overflow.extend_from_slice(&rest[fit..n]);
                    }
                    n
                }
                None => {
                    let n = run_len(rest, first, bits);
                    self.past += n as u64;
                    n
                }
            };
            tally.tally(first, n);
            tallied += n;
            rest = &rest[n..];
        }
        self.ends.clear();
        self.ends.extend(self.rooms.iter().map(|r| r.0));
        Ok(())
    }

    /// Two passes: the entries counted per bucket, then each copied to its place. The first
    /// `tallied` entries were tallied already.
    fn count_and_copy(
        &mut self,
        words: &[u64],
        bucket: Bucket,
        ahead: usize,
        tallied: usize,
        tally: &mut impl Tally,
    ) {
        let count = &mut self.ends;
        count.clear();
        count.resize(bucket.last + 1, 0);
        for run in runs(words, bucket.bits() | entry::HUGE_BIT) {
            let b = bucket.of(run[0]);
            self.runs += 1;
            match count.get_mut(b) {
                Some(c) => *c += run.len(),
                None => self.past += run.len() as u64,
            }
            if run[0] & entry::HUGE_BIT != 0 {
                if let Some(h) = self.huge.get_mut(b) {
                    *h = true;
                }
            }
        }
        self.starts.clear();
        let mut at = 0;
        for &c in count.iter() {
            self.starts.push(at);
            at += c;
        }
        self.starts.push(at);
        // Every entry's place is written below: no need to clear what the last round left.
        self.sized(at, ahead);
        // Each bucket's next place in `ends`: at the end, where each bucket ends.
        self.ends.copy_from_slice(&self.starts[..=bucket.last]);
        let (sorted, ends) = (&mut self.sorted[..], &mut self.ends[..]);
        for run in runs(words, bucket.bits()) {
            if let Some(at) = ends.get_mut(bucket.of(run[0])) {
                copy(&mut sorted[*at..*at + run.len()], run, bucket.in_bucket());
                *at += run.len();
            }
        }
        for run in runs(&words[tallied.min(words.len())..], tally_bits(tally)) {
            tally.tally(run[0], run.len());
        }
    }
}

/// `words` in runs of entries alike in `bits`: entries come in runs of one bucket and one level
/// (a guest publishes a level's frames together, in address order), and the work per entry is
/// done once per run.
fn runs(words: &[u64], bits: u64) -> impl Iterator<Item = &[u64]> {
    // As `chunk_by`, but each entry compared with the run's first, which takes fewer
    // instructions per entry.
    let mut rest = words;
    std::iter::from_fn(move || {
        let (&first, tail) = rest.split_first()?;
        let alike = tail.iter().position(|&w| (w ^ first) & bits != 0);
        let (run, next) = rest.split_at(1 + alike.unwrap_or(tail.len()));
        rest = next;
        Some(run)
    })
}

/// Entries whose runs `scatter_into_room` counts, from the first.
const RUNS_SAMPLE: usize = 1 << 14;

/// Runs of entries of one bucket in `words`.
fn runs_in(words: &[u64], bucket: Bucket) -> usize {
    let changes = words
        .windows(2)
        .filter(|w| bucket.of(w[0]) != bucket.of(w[1]))
        .count();
    changes + !words.is_empty() as usize
}

/// How many of the first of `words` are alike with `first` in `bits`.
#[inline(always)]
fn run_len(words: &[u64], first: u64, bits: u64) -> usize {
    words
        .iter()
        .position(|&w| (w ^ first) & bits != 0)
        .unwrap_or(words.len())
}

/// Copies the first of `src` that are alike with the first in `bits` (a run), packed, to `dst`
/// as far as it goes; returns how many. Eight at a time while they are alike, which the compiler
/// makes vector instructions, then one at a time.
#[inline(always)]
fn copy_alike(dst: &mut [Packed], src: &[u64], bits: u64, in_bucket: u64) -> usize {
    let n = dst.len().min(src.len());
    let (dst, src) = (&mut dst[..n], &src[..n]);
    let Some(&first) = src.first() else {
        return 0;
    };
    let mut k = 0;
    for (d, s) in dst.chunks_exact_mut(8).zip(src.chunks_exact(8)) {
        if s.iter().fold(0, |x, &w| x | (w ^ first)) & bits != 0 {
            break;
        }
        for (d, &w) in d.iter_mut().zip(s) {
            *d = pack(w, in_bucket);
        }
        k += 8;
    }
    while k < n && (src[k] ^ first) & bits == 0 {
        dst[k] = pack(src[k], in_bucket);
        k += 1;
    }
    k
}

/// `T::BITS`, from a value.
fn tally_bits<T: Tally>(_: &T) -> u64 {
    T::BITS
}

/// `src` packed into `dst`.
#[inline(always)]
fn copy(dst: &mut [Packed], src: &[u64], in_bucket: u64) {
    for (d, &w) in dst.iter_mut().zip(src) {
        *d = pack(w, in_bucket);
    }
}

/// The bucket of an entry.
#[derive(Clone, Copy)]
struct Bucket {
    shift: u32,
    last: usize,
}

impl Bucket {
    const HINT_BITS: u32 = u64::BITS - entry::GFN_BITS;

    fn new(shift: u32, last: usize) -> Self {
        Bucket { shift, last }
    }

    /// The bucket of an entry (past `last` if the entry is past the last bucket).
    #[inline(always)]
    fn of(self, w: u64) -> usize {
        ((w << Self::HINT_BITS) >> (Self::HINT_BITS + self.shift)) as usize
    }

    /// The bits of an entry that make its bucket.
    fn bits(self) -> u64 {
        entry::GFN_MASK & !self.in_bucket()
    }

    /// The bits of an entry that make its frame's offset in the bucket.
    fn in_bucket(self) -> u64 {
        (1 << self.shift) - 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const AHEAD: usize = 8;

    /// Entries tallied by their count bits (40-47).
    #[derive(Default)]
    struct Tallied(std::collections::BTreeMap<u64, usize>);

    impl Tally for Tallied {
        const BITS: u64 = 0xff << entry::COUNT_SHIFT;
        fn tally(&mut self, w: u64, n: usize) {
            if n > 0 {
                *self.0.entry(w & Self::BITS).or_default() += n;
            }
        }
    }

    impl Tallied {
        /// Each of `words` was tallied once.
        fn check(&mut self, words: &[u64]) -> Result<(), TestCaseError> {
            let mut want = std::collections::BTreeMap::new();
            for &w in words {
                *want.entry(w & Self::BITS).or_default() += 1;
            }
            prop_assert_eq!(std::mem::take(&mut self.0), want);
            Ok(())
        }
    }

    /// Each bucket's entries as a straightforward filter of the round gives them, and how many
    /// are past the last bucket.
    fn by_bucket(words: &[u64], bucket: Bucket) -> (Vec<Vec<u64>>, u64) {
        let mut out = vec![Vec::new(); bucket.last + 1];
        let mut past = 0;
        for &w in words {
            match out.get_mut(bucket.of(w)) {
                Some(b) => b.push(w),
                None => past += 1,
            }
        }
        (out, past)
    }

    /// What packing keeps of an entry: bits 0-51.
    fn kept(w: u64) -> u64 {
        w & ((entry::HUGE_BIT << 1) - 1)
    }

    /// Every bucket holds its entries in their order, then those that overflowed, in theirs;
    /// those past the last bucket are counted; the zeros after the rooms are there; the room
    /// for the next round fits this round.
    fn check(
        bk: &Buckets,
        words: &[u64],
        bucket: Bucket,
        room: &[u32],
    ) -> Result<(), TestCaseError> {
        let (want, past) = by_bucket(words, bucket);
        prop_assert_eq!(bk.len(), bucket.last + 1);
        prop_assert_eq!(bk.past(), past);
        // A run is of one bucket (at least), and as long as a round at most, among the first
        // entries counted.
        let counted = &words[..bk.runs_of()];
        let changes = counted
            .windows(2)
            .filter(|w| bucket.of(w[0]) != bucket.of(w[1]))
            .count();
        prop_assert!(bk.runs() <= counted.len());
        prop_assert!(bk.runs() >= changes + !counted.is_empty() as usize);
        for (b, want) in want.iter().enumerate() {
            let (entries, n) = bk.bucket(b);
            let start = (b as u64) << bucket.shift;
            let mut got: Vec<u64> = entries[..n].iter().map(|&e| unpack(e, start)).collect();
            prop_assert!(
                entries[n..].len() >= AHEAD,
                "bucket {}: no room to read ahead",
                b
            );
            got.extend(
                bk.overflow()
                    .iter()
                    .filter(|&&w| bucket.of(w) == b)
                    .map(|&w| kept(w)),
            );
            let want: Vec<u64> = want.iter().map(|&w| kept(w)).collect();
            prop_assert_eq!(&got, &want, "bucket {}", b);
            prop_assert_eq!(
                bk.has_huge(b),
                want.iter().any(|&w| w & entry::HUGE_BIT != 0),
                "bucket {}: 2 MiB entries",
                b
            );
            prop_assert!(
                room[b] as usize >= want.len() + want.len() / 16,
                "bucket {}",
                b
            );
        }
        prop_assert!(bk.sorted[bk.sorted.len() - AHEAD..].iter().all(|&w| w == 0));
        Ok(())
    }

    /// Rounds of runs of entries (some past the last bucket, a fifth 2 MiB, with hint bits), in
    /// order or shuffled.
    fn round(seed: u64, frames: u64) -> Vec<u64> {
        let mut rng = crate::synth::Rng::new(seed);
        let mut out = Vec::new();
        for _ in 0..rng.below(60) {
            let start = rng.below(frames + frames / 8);
            let mut hint = rng.below(1 << 13) << entry::COUNT_SHIFT;
            // Most runs 4 KiB, so that some buckets have no 2 MiB entry.
            if rng.chance(0.8) {
                hint &= !entry::HUGE_BIT;
            }
            for g in start..start + 1 + rng.below(200) {
                out.push(g | hint);
            }
        }
        if rng.chance(0.5) {
            for k in (1..out.len()).rev() {
                out.swap(k, rng.below(k as u64 + 1) as usize);
            }
        }
        out
    }

    proptest! {
        /// Round after round, with room from the last round (in one pass unless too many
        /// overflow), without (two passes), and with too little (overflow), the buckets hold
        /// each bucket's entries in order.
        #[test]
        fn buckets_keep_each_buckets_entries_in_order(
            seed in any::<u64>(),
            shift in 9u32..12,
            frames in 1u64..40_000,
            in_runs in any::<bool>(),
        ) {
            let bucket = Bucket::new(shift, (frames >> shift) as usize);
            let mut bk = Buckets::default();
            let mut room = Vec::new();
            let mut tally = Tallied::default();
            for r in 0..4 {
                let words = round(seed.wrapping_add(r), frames);
                // What does not fit the room of the round before.
                let over: usize = by_bucket(&words, bucket)
                    .0
                    .iter()
                    .zip(&room)
                    .map(|(b, &r)| b.len().saturating_sub(r as usize))
                    .sum();
                let one_pass = bk.sort(&words, shift, bucket.last, &mut room, AHEAD, in_runs, &mut tally);
                prop_assert_eq!(one_pass, r > 0 && over <= words.len() / 16);
                prop_assert_eq!(bk.overflow().len(), if one_pass { over } else { 0 });
                check(&bk, &words, bucket, &room)?;
                tally.check(&words)?;
            }
            // The same round twice: the second time in one pass, with nothing over.
            let words = round(seed, frames);
            bk.sort(&words, shift, bucket.last, &mut room, AHEAD, in_runs, &mut tally);
            prop_assert!(bk.sort(&words, shift, bucket.last, &mut room, AHEAD, in_runs, &mut tally));
            prop_assert!(bk.overflow().is_empty());
            check(&bk, &words, bucket, &room)?;
            tally.0.clear();
            // Then with a few entries too many for the fullest bucket's room, spread over the
            // round: they overflow, in one pass if few enough.
            let (counts, _) = by_bucket(&words, bucket);
            let (full, n) = counts.iter().enumerate().map(|(b, c)| (b, c.len())).max_by_key(|c| c.1).unwrap();
            let extra = room[full] as usize - n + 3;
            let mut more = words.clone();
            for i in 0..extra {
                let w = ((full as u64) << shift) | (i as u64 % (1 << shift));
                more.insert(i * more.len() / extra, w);
            }
            let one_pass = bk.sort(&more, shift, bucket.last, &mut room, AHEAD, in_runs, &mut tally);
            prop_assert_eq!(one_pass, 3 <= more.len() / 16);
            if one_pass {
                prop_assert_eq!(bk.overflow().len(), 3);
            }
            check(&bk, &more, bucket, &room)?;
            tally.check(&more)?;
        }
    }
}
