//! A VM's frame states by dense index. A VM on 4 KiB host pages keeps them in one array. A VM
//! with host folios keeps them per chunk of 512 frames (a 2 MiB block's worth): a chunk whose
//! frames are all in one state but for the head of a 2 MiB unit, as a host folio's are, is kept as
//! those states (`Pieces`: 24 bytes with the chunk's tag, where 512 states take 2 KiB), so a VM
//! whose RAM is on host THPs holds next to no per-frame state; other chunks keep a state per
//! frame. Reads and writes go by frame as in an array: a write that breaks a chunk's uniformity
//! gives it a state per frame, and maintenance (`maintain`) keeps it as pieces again once its
//! frames are uniform again. Runs of alike frames take one update (`update`).
//!
//! 2 MiB blocks are aligned on guest frame numbers, chunks on dense indexes: where a RAM range's
//! dense index and guest frame number differ modulo 512 (the PC's hole at 640 KiB cuts 96
//! frames), a block's head sits inside a chunk and the chunk holds the tail of the block before
//! it, which is a third state (`Pieces`).

use crate::hotness::FrameState;
use std::ops::Range;

/// Frames per chunk.
pub(super) const CHUNK: usize = 512;

/// A uniform chunk: frames `0..cut` in state `below` (the tail of the block before), frame `cut`
/// in `at` (a block's head) and the rest in `above` (its tail).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Pieces {
    cut: u16,
    below: FrameState,
    at: FrameState,
    above: FrameState,
}

impl Pieces {
    fn all(cut: u16, s: FrameState) -> Pieces {
        Pieces {
            cut,
            below: s,
            at: s,
            above: s,
        }
    }

    #[inline(always)]
    fn get(&self, offset: usize) -> FrameState {
        let cut = self.cut as usize;
        if offset < cut {
            self.below
        } else if offset == cut {
            self.at
        } else {
            self.above
        }
    }

    /// The three pieces' offsets, within the chunk's first `valid` frames, and states.
    fn pieces(&self, valid: usize) -> [(Range<usize>, FrameState); 3] {
        let cut = (self.cut as usize).min(valid);
        let head_end = (cut + 1).min(valid);
        [
            (0..cut, self.below),
            (cut..head_end, self.at),
            (head_end..valid, self.above),
        ]
    }

    fn set_piece(&mut self, piece: usize, s: FrameState) {
        match piece {
            0 => self.below = s,
            1 => self.at = s,
            _ => self.above = s,
        }
    }

    fn frames(&self) -> Box<[FrameState; CHUNK]> {
        Box::new(std::array::from_fn(|o| self.get(o)))
    }
}

enum Chunk {
    /// A state per frame.
    Dense(Box<[FrameState; CHUNK]>),
    Uniform(Pieces),
}

enum Store {
    /// One array: a VM whose frames are hinted one by one takes the ingest's straight path on
    /// it, with no chunk to look up per entry.
    Flat(Vec<FrameState>),
    Chunked {
        chunks: Vec<Chunk>,
        /// Chunks with a state per frame.
        dense: usize,
    },
}

/// The states of a VM's frames by dense index.
pub(super) struct FrameTable {
    store: Store,
    len: usize,
    /// Per RAM span, in order: its first dense index and the offset of a 2 MiB block's head in
    /// its chunks (`Pieces::cut`).
    cuts: Vec<(usize, u16)>,
}

impl FrameTable {
    /// `len` frames in state `s`, kept per chunk; `spans` gives each RAM span's first dense
    /// index and first guest frame, in order.
    pub(super) fn new(
        len: usize,
        s: FrameState,
        spans: impl IntoIterator<Item = (usize, u64)>,
    ) -> FrameTable {
        let cuts: Vec<(usize, u16)> = spans
            .into_iter()
            .map(|(first, gfn)| {
                let block = CHUNK as u64;
                let cut = (first as u64 % block + block - gfn % block) % block;
                (first, cut as u16)
            })
            .collect();
        let mut t = FrameTable {
            store: Store::Flat(Vec::new()),
            len,
            cuts,
        };
        let chunks = (0..len.div_ceil(CHUNK))
            .map(|c| Chunk::Uniform(Pieces::all(t.cut_of(c), s)))
            .collect();
        t.store = Store::Chunked { chunks, dense: 0 };
        t
    }

    /// Keeps the frames in one array, for a VM whose frames are all 4 KiB pages on the host.
    pub(super) fn flatten(&mut self) {
        if let Store::Chunked { .. } = self.store {
            let frames = (0..self.len).map(|i| self.get(i)).collect();
            self.store = Store::Flat(frames);
        }
    }

    /// Keeps the frames per chunk, as pieces where they fit (`compact`), for a VM with host
    /// folios.
    pub(super) fn chunk_up(&mut self) {
        let Store::Flat(frames) = &self.store else {
            return;
        };
        let chunks = frames
            .chunks(CHUNK)
            .map(|f| {
                let mut dense = Box::new([FrameState::NEW; CHUNK]);
                dense[..f.len()].copy_from_slice(f);
                Chunk::Dense(dense)
            })
            .collect();
        self.store = Store::Chunked {
            dense: self.len.div_ceil(CHUNK),
            chunks,
        };
        for c in 0..self.len.div_ceil(CHUNK) {
            self.compact(c);
        }
    }

    /// Where a 2 MiB block's head is in chunk `c`: as in the RAM span of its first frame.
    fn cut_of(&self, c: usize) -> u16 {
        let at = self.cuts.partition_point(|&(first, _)| first <= c * CHUNK);
        at.checked_sub(1).map_or(0, |k| self.cuts[k].1)
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Frames in chunk `c` (the last one may be short).
    fn valid(&self, c: usize) -> usize {
        (self.len - c * CHUNK).min(CHUNK)
    }

    /// The frames as one array, if they are kept so.
    pub(super) fn as_slice(&self) -> Option<&[FrameState]> {
        match &self.store {
            Store::Flat(f) => Some(f),
            Store::Chunked { .. } => None,
        }
    }

    /// The frames of `range` as a slice, if they are stored one by one and together: the
    /// whole table kept as one array, or one chunk with a state per frame.
    pub(super) fn slice_mut(&mut self, range: Range<usize>) -> Option<&mut [FrameState]> {
        if range.end > self.len {
            return None;
        }
        match &mut self.store {
            Store::Flat(f) => f.get_mut(range),
            Store::Chunked { chunks, .. } => {
                let c = range.start / CHUNK;
                let base = c * CHUNK;
                match chunks.get_mut(c)? {
                    Chunk::Dense(f) if range.end <= base + CHUNK => {
                        f.get_mut(range.start - base..range.end - base)
                    }
                    _ => None,
                }
            }
        }
    }

    #[inline]
    pub(super) fn get(&self, i: usize) -> FrameState {
        debug_assert!(i < self.len, "frame {i} of {}", self.len);
        match &self.store {
            Store::Flat(f) => f[i],
            Store::Chunked { chunks, .. } => match &chunks[i / CHUNK] {
                Chunk::Dense(f) => f[i % CHUNK],
                Chunk::Uniform(p) => p.get(i % CHUNK),
            },
        }
    }

    /// Frame `i` to write, its chunk given a state per frame; `None` past the last frame.
    #[inline]
    pub(super) fn get_mut(&mut self, i: usize) -> Option<&mut FrameState> {
        match &mut self.store {
            Store::Flat(f) => f.get_mut(i),
            Store::Chunked { chunks, dense } => chunked_get_mut(chunks, dense, self.len, i),
        }
    }

    /// Sets frame `i`, keeping its chunk uniform where the state does not change or the frame
    /// is a piece of its own (a block's head).
    pub(super) fn set(&mut self, i: usize, s: FrameState) {
        self.update(i..i + 1, |_, _| s);
    }

    /// Calls `f(first, state, n)` for the frames of `range` in order: once per piece of a uniform
    /// chunk (`n` frames alike), once per frame of the others (`n` = 1).
    pub(super) fn for_each_run(
        &self,
        range: Range<usize>,
        mut f: impl FnMut(usize, FrameState, u32),
    ) {
        let end = range.end.min(self.len);
        let chunks = match &self.store {
            Store::Flat(fr) => {
                for (i, &s) in fr.iter().enumerate().take(end).skip(range.start) {
                    f(i, s, 1);
                }
                return;
            }
            Store::Chunked { chunks, .. } => chunks,
        };
        let mut i = range.start;
        while i < end {
            let c = i / CHUNK;
            let base = c * CHUNK;
            let (lo, hi) = (i - base, (end - base).min(CHUNK));
            match &chunks[c] {
                Chunk::Dense(fr) => {
                    for (o, &s) in fr[lo..hi].iter().enumerate() {
                        f(base + lo + o, s, 1);
                    }
                }
                Chunk::Uniform(p) => {
                    for (r, s) in p.pieces(self.valid(c)) {
                        let (a, b) = (r.start.max(lo), r.end.min(hi));
                        if a < b {
                            f(base + a, s, (b - a) as u32);
                        }
                    }
                }
            }
            i = base + hi;
        }
    }

    /// Replaces the state `s` of the frames of `range` by `f(s, n)`: called once per piece of a
    /// uniform chunk it meets (standing for its `n` frames in `range`), once per frame of the
    /// others (`n` = 1). A chunk stays uniform unless only part of a piece changes.
    pub(super) fn update(
        &mut self,
        range: Range<usize>,
        mut f: impl FnMut(FrameState, u32) -> FrameState,
    ) {
        let (len, end) = (self.len, range.end.min(self.len));
        let valid = |c: usize| (len - c * CHUNK).min(CHUNK);
        let (chunks, dense) = match &mut self.store {
            Store::Flat(fr) => {
                for s in &mut fr[range.start.min(end)..end] {
                    *s = f(*s, 1);
                }
                return;
            }
            Store::Chunked { chunks, dense } => (chunks, dense),
        };
        let mut i = range.start;
        while i < end {
            let c = i / CHUNK;
            let base = c * CHUNK;
            let (lo, hi) = (i - base, (end - base).min(CHUNK));
            i = base + hi;
            let p = match &mut chunks[c] {
                Chunk::Dense(fr) => {
                    for s in &mut fr[lo..hi] {
                        *s = f(*s, 1);
                    }
                    continue;
                }
                Chunk::Uniform(p) => *p,
            };
            let mut whole = p;
            let mut parts: [Option<(Range<usize>, FrameState)>; 3] = Default::default();
            for (k, (r, s)) in p.pieces(valid(c)).into_iter().enumerate() {
                let (a, b) = (r.start.max(lo), r.end.min(hi));
                if a >= b {
                    continue;
                }
                let new = f(s, (b - a) as u32);
                if new == s {
                    continue;
                }
                if (a, b) == (r.start, r.end) {
                    whole.set_piece(k, new);
                } else {
                    parts[k] = Some((a..b, new));
                }
            }
            chunks[c] = Chunk::Uniform(whole);
            if parts.iter().any(Option::is_some) {
                let fr = dense_chunk(chunks, dense, c);
                for (r, new) in parts.into_iter().flatten() {
                    fr[r].fill(new);
                }
            }
        }
    }

    /// Maintenance of the frames of `range`: `dense` on those of each chunk with a state per
    /// frame, `one` on each piece of the uniform ones (as `update`). Then each chunk met that has
    /// a state per frame and fits pieces again is kept so (`compact`).
    pub(super) fn maintain(
        &mut self,
        range: Range<usize>,
        mut dense: impl FnMut(&mut [FrameState]),
        mut one: impl FnMut(FrameState) -> FrameState,
    ) {
        let end = range.end.min(self.len);
        let mut i = range.start;
        while i < end {
            let c = i / CHUNK;
            let base = c * CHUNK;
            let hi = (end - base).min(CHUNK);
            match &mut self.store {
                Store::Flat(fr) => {
                    dense(&mut fr[i..end]);
                    return;
                }
                Store::Chunked { chunks, .. } => match &mut chunks[c] {
                    Chunk::Dense(fr) => {
                        dense(&mut fr[i - base..hi]);
                        self.compact(c);
                    }
                    Chunk::Uniform(_) => self.update(i..base + hi, |s, _| one(s)),
                },
            }
            i = base + hi;
        }
    }

    /// Keeps chunk `c` as pieces if its frames fit them: all alike, or alike but for a 2 MiB
    /// unit's head at the cut and the tail of the block before. A chunk of 4 KiB pages hinted
    /// one by one seldom does, so ingesting does not keep giving it its frames again.
    fn compact(&mut self, c: usize) {
        let (valid, cut) = (self.valid(c), self.cut_of(c));
        let Store::Chunked { chunks, dense } = &mut self.store else {
            return;
        };
        let Chunk::Dense(fr) = &chunks[c] else {
            return;
        };
        let fr = &fr[..valid];
        let alike = |s: &[FrameState]| s.iter().all(|&x| x == s[0]);
        let pieces = match fr.get(cut as usize) {
            None if alike(fr) => Pieces::all(cut, fr[0]),
            Some(&at) => {
                let (below, above) = fr.split_at(cut as usize);
                let above = &above[1..];
                let first = |s: &[FrameState]| s.first().copied();
                let (b, a) = (first(below).unwrap_or(at), first(above).unwrap_or(at));
                let unit = at.huge_head() || (b == at && a == at);
                if !unit || !alike(below) || !alike(above) {
                    return;
                }
                Pieces {
                    cut,
                    below: b,
                    at,
                    above: a,
                }
            }
            None => return,
        };
        chunks[c] = Chunk::Uniform(pieces);
        *dense -= 1;
    }

    /// Frames `first..first + frames`, for a loop that takes those with a state of their own.
    pub(super) fn bucket(&mut self, first: usize, frames: usize) -> BucketFrames<'_> {
        debug_assert!(first + frames <= self.len);
        match &mut self.store {
            Store::Flat(f) => BucketFrames::Flat(&mut f[first..first + frames]),
            Store::Chunked { chunks, .. } => BucketFrames::Chunked(ChunkedBucket {
                chunks: &mut chunks[first / CHUNK..(first + frames).div_ceil(CHUNK)],
                skew: first % CHUNK,
                frames,
            }),
        }
    }

    /// Starts loading frame `i` into the cache, if it has a state of its own (a prefetch).
    #[inline(always)]
    pub(super) fn prefetch(&self, i: usize) {
        match &self.store {
            Store::Flat(f) => prefetch_read(f.as_ptr().wrapping_add(i)),
            Store::Chunked { chunks, .. } => {
                if let Some(Chunk::Dense(f)) = chunks.get(i / CHUNK) {
                    prefetch_read(f.as_ptr().wrapping_add(i % CHUNK));
                }
            }
        }
    }

    /// Chunks with a state per frame.
    #[cfg(test)]
    pub(super) fn dense_chunks(&self) -> usize {
        match self.store {
            Store::Flat(_) => self.len.div_ceil(CHUNK),
            Store::Chunked { dense, .. } => dense,
        }
    }

    /// Heap bytes held.
    pub(super) fn memory_bytes(&self) -> usize {
        let store = match &self.store {
            Store::Flat(f) => f.capacity() * std::mem::size_of::<FrameState>(),
            Store::Chunked { chunks, dense } => {
                chunks.capacity() * std::mem::size_of::<Chunk>()
                    + dense * std::mem::size_of::<[FrameState; CHUNK]>()
            }
        };
        store + self.cuts.capacity() * std::mem::size_of::<(usize, u16)>()
    }
}

/// `FrameTable::get_mut` of a table of `len` frames kept per chunk (out of line: a flat table's
/// is one bounds check).
#[inline(never)]
fn chunked_get_mut<'a>(
    chunks: &'a mut [Chunk],
    dense: &mut usize,
    len: usize,
    i: usize,
) -> Option<&'a mut FrameState> {
    (i < len).then(|| &mut dense_chunk(chunks, dense, i / CHUNK)[i % CHUNK])
}

/// Chunk `c` of `chunks`, given a state per frame if it had none (`dense` counts those).
fn dense_chunk<'a>(
    chunks: &'a mut [Chunk],
    dense: &mut usize,
    c: usize,
) -> &'a mut [FrameState; CHUNK] {
    if let Chunk::Uniform(p) = chunks[c] {
        chunks[c] = Chunk::Dense(p.frames());
        *dense += 1;
    }
    match &mut chunks[c] {
        Chunk::Dense(f) => f,
        Chunk::Uniform(_) => unreachable!("chunk {c} was just given its frames"),
    }
}

/// Consecutive frames of a `FrameTable` (an ingest bucket's) by their offset from the first.
pub(super) enum BucketFrames<'a> {
    Flat(&'a mut [FrameState]),
    Chunked(ChunkedBucket<'a>),
}

/// Frames by offset as the ingest's checked loop (`PlainRun`) takes them.
pub(super) trait FramesByOffset {
    fn len(&self) -> usize;
    /// Frame `offset`, if it is one of these and has a state of its own.
    fn get_mut(&mut self, offset: usize) -> Option<&mut FrameState>;
    /// Starts loading frame `offset` into the cache (some frame near, if it is not one of these:
    /// a prefetch never faults).
    fn prefetch(&self, offset: usize);
}

impl FramesByOffset for &mut [FrameState] {
    fn len(&self) -> usize {
        <[FrameState]>::len(self)
    }
    #[inline(always)]
    fn get_mut(&mut self, offset: usize) -> Option<&mut FrameState> {
        <[FrameState]>::get_mut(self, offset)
    }
    #[inline(always)]
    fn prefetch(&self, offset: usize) {
        prefetch_read(self.as_ptr().wrapping_add(offset));
    }
}

/// The frames of a bucket in a table kept per chunk.
pub(super) struct ChunkedBucket<'a> {
    chunks: &'a mut [Chunk],
    /// The first frame's offset in its chunk.
    skew: usize,
    frames: usize,
}

impl FramesByOffset for ChunkedBucket<'_> {
    fn len(&self) -> usize {
        self.frames
    }

    #[inline(always)]
    fn get_mut(&mut self, offset: usize) -> Option<&mut FrameState> {
        if offset >= self.frames {
            return None;
        }
        let i = offset + self.skew;
        match self.chunks.get_mut(i / CHUNK) {
            Some(Chunk::Dense(f)) => Some(&mut f[i % CHUNK]),
            _ => None,
        }
    }

    #[inline(always)]
    fn prefetch(&self, offset: usize) {
        let i = offset + self.skew;
        if let Some(Chunk::Dense(f)) = self.chunks.get(i / CHUNK) {
            prefetch_read(f.as_ptr().wrapping_add(i % CHUNK));
        }
    }
}

#[inline(always)]
pub(super) fn prefetch_read(p: *const FrameState) {
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
    use crate::synth::Rng;
    use proptest::prelude::*;

    fn head(s: FrameState) -> FrameState {
        let mut h = s;
        h.set_huge_head(true);
        h
    }

    /// A table and the plain array it stands for, changed alike.
    struct Model {
        table: FrameTable,
        frames: Vec<FrameState>,
    }

    impl Model {
        fn check(&self) {
            assert_eq!(self.table.len(), self.frames.len());
            for (i, &s) in self.frames.iter().enumerate() {
                assert_eq!(self.table.get(i), s, "frame {i}");
            }
            let mut runs = Vec::new();
            self.table
                .for_each_run(0..self.frames.len(), |i, s, n| runs.push((i, s, n)));
            let mut at = 0;
            for (i, s, n) in runs {
                assert_eq!(i, at);
                assert!(self.frames[i..i + n as usize].iter().all(|&x| x == s));
                at += n as usize;
            }
            assert_eq!(at, self.frames.len());
        }
    }

    /// Flips a bit of every frame `f` has a state of its own for, and of the same in `frames`.
    fn flip(f: &mut impl FramesByOffset, frames: &mut [FrameState]) {
        for (o, s) in frames.iter_mut().enumerate() {
            f.prefetch(o);
            if let Some(x) = f.get_mut(o) {
                x.0 ^= 1 << 9;
                s.0 ^= 1 << 9;
            }
        }
        assert!(f.get_mut(frames.len()).is_none());
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, .. ProptestConfig::default() })]

        /// Whatever is written, by frame, by run or by maintenance, the table reads as the plain
        /// array does, and unit-shaped chunks go back to pieces when maintained.
        #[test]
        fn a_table_reads_as_the_array_it_stands_for(seed in any::<u64>(), skew in 0u64..512) {
            let mut rng = Rng::new(seed);
            let len = 3 * CHUNK + rng.below(CHUNK as u64) as usize;
            // Two spans, the second one's blocks off the chunks by `skew`.
            let second = CHUNK + rng.below(CHUNK as u64) as usize;
            let spans = [(0, 0), (second, (1 << 20) + skew + second as u64)];
            let mut m = Model {
                table: FrameTable::new(len, FrameState::NEW, spans),
                frames: vec![FrameState::NEW; len],
            };
            m.check();
            let state = |rng: &mut Rng| FrameState(rng.below(8) as u32 * 0x0101_0101);
            for _ in 0..200 {
                let a = rng.below(len as u64) as usize;
                let b = (a + rng.below(2 * CHUNK as u64) as usize).min(len);
                match rng.below(6) {
                    0 => {
                        let s = state(&mut rng);
                        m.table.set(a, s);
                        m.frames[a] = s;
                    }
                    1 => {
                        // Every frame to one state, the head of each block to its own.
                        let s = state(&mut rng);
                        m.table.update(a..b, |_, _| s);
                        m.frames[a..b].fill(s);
                        for i in a..b {
                            let block_head = i % CHUNK == m.table.cut_of(i / CHUNK) as usize;
                            if block_head {
                                m.table.set(i, head(s));
                                m.frames[i] = head(s);
                            }
                        }
                    }
                    2 => {
                        let add = rng.below(3) as u32;
                        let mut seen = 0;
                        if let Some(frames) = m.table.slice_mut(a..b) {
                            frames.iter_mut().for_each(|s| s.0 = s.0.wrapping_add(add));
                            seen = frames.len();
                        } else {
                            m.table.update(a..b, |s, n| {
                                seen += n as usize;
                                FrameState(s.0.wrapping_add(add))
                            });
                        }
                        prop_assert_eq!(seen, b - a);
                        for s in &mut m.frames[a..b] {
                            s.0 = s.0.wrapping_add(add);
                        }
                    }
                    3 => {
                        let bit = 1 << rng.below(8);
                        m.table.maintain(a..b, |fr| fr.iter_mut().for_each(|s| s.0 &= !bit), |s| FrameState(s.0 & !bit));
                        for s in &mut m.frames[a..b] {
                            s.0 &= !bit;
                        }
                    }
                    4 => {
                        let frames = &mut m.frames[a..b];
                        match m.table.bucket(a, b - a) {
                            BucketFrames::Flat(mut f) => flip(&mut f, frames),
                            BucketFrames::Chunked(mut f) => flip(&mut f, frames),
                        }
                    }
                    _ if rng.chance(0.5) => m.table.flatten(),
                    _ => m.table.chunk_up(),
                }
                m.check();
            }
            // Every block as a unit: maintenance keeps every chunk as pieces again.
            m.table.chunk_up();
            let s = state(&mut rng);
            m.table.update(0..len, |_, _| s);
            m.frames.fill(s);
            for c in 0..len.div_ceil(CHUNK) {
                let at = c * CHUNK + m.table.cut_of(c) as usize;
                if at < len {
                    m.table.set(at, head(s));
                    m.frames[at] = head(s);
                }
            }
            m.table.maintain(0..len, |_| {}, |s| s);
            // (A short last chunk may hold no head to tell a unit by.)
            let headless = (0..len.div_ceil(CHUNK))
                .filter(|&c| m.table.cut_of(c) as usize >= m.table.valid(c))
                .count();
            prop_assert!(m.table.dense_chunks() <= headless);
            m.check();
        }
    }

    #[test]
    fn a_unit_hint_keeps_a_folio_chunk_uniform_and_small() {
        let mut t = FrameTable::new(4 * CHUNK, FrameState::NEW, [(0, 0)]);
        for c in 0..4 {
            t.set(c * CHUNK, head(FrameState::NEW));
        }
        t.update(CHUNK..2 * CHUNK, |s, _| FrameState(s.0 | 5));
        assert_eq!(t.dense_chunks(), 0);
        assert_eq!(t.get(CHUNK + 7), FrameState(FrameState::NEW.0 | 5));
        assert!(t.get(CHUNK).huge_head());
        // One frame of it written on its own: the chunk gets its frames, until maintained.
        t.set(CHUNK + 9, FrameState::NEW);
        assert_eq!(t.dense_chunks(), 1);
        t.maintain(0..4 * CHUNK, |_| {}, |s| s);
        assert_eq!(t.dense_chunks(), 1);
        t.set(CHUNK + 9, FrameState(FrameState::NEW.0 | 5));
        t.maintain(CHUNK + 100..CHUNK + 101, |_| {}, |s| s);
        assert_eq!(t.dense_chunks(), 0);
        let chunk = std::mem::size_of::<Chunk>();
        assert!(t.memory_bytes() <= 4 * chunk + 64, "{}", t.memory_bytes());
    }
}
