//! Per-frame hotness state, packed in 4 bytes, and the key frames are bucket-sorted by.
//!
//! Score: the HMM-V page degree (`read_weight * reads + write_weight * write`) accumulated with an
//! exponential decay per round. Recency: MGLRU-like generations from the rounds since the frame
//! was last hinted. Decay is lazy: a frame stores its score as of the round it was last hinted
//! and the effective score is `score * decay^age`, read from a table, so frames nobody hints cost
//! no writes.

use crate::params::EngineParams;
use crate::types::NodeId;
use vtism_proto::count::level_of_rate;
use vtism_proto::{CountMeaning, PageType};

/// Bit layout of a frame's `u32`:
/// `0..8` score, `8..16` stamp (round mod 256 of the last hint), `16..21` degree of the last
/// hint (to merge duplicates within a round), `21..23` page type, `23` write, `24..30` node
/// (63 = unknown), `30` head of a 2 MiB unit, `31` seen (stamp is meaningful). A frame not seen
/// has score, stamp, degree and write 0 (`NEW`, `forget`): `DecayTable` relies on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[repr(transparent)]
pub struct FrameState(pub u32);

const SCORE_MASK: u32 = 0xff;
const STAMP_SHIFT: u32 = 8;
const DEGREE_SHIFT: u32 = 16;
const DEGREE_MASK: u32 = 0x1f;
const TYPE_SHIFT: u32 = 21;
const WRITE_BIT: u32 = 1 << 23;
const NODE_SHIFT: u32 = 24;
const NODE_MASK: u32 = 0x3f;
const HUGE_BIT: u32 = 1 << 30;
const SEEN_BIT: u32 = 1 << 31;

/// The bits `FrameState::forget` clears.
const FORGOTTEN: u32 =
    SEEN_BIT | SCORE_MASK | (0xff << STAMP_SHIFT) | (DEGREE_MASK << DEGREE_SHIFT) | WRITE_BIT;

/// Node value for "placement unknown".
pub const NODE_UNKNOWN: u8 = 63;

/// Frames not hinted for this many rounds are forgotten (their stamp would otherwise wrap).
/// Their decayed score is long 0 by then.
pub const FORGET_AGE: u8 = 128;

impl FrameState {
    /// A frame never hinted, placement unknown.
    pub const NEW: FrameState = FrameState((NODE_UNKNOWN as u32) << NODE_SHIFT);

    pub fn score(self) -> u8 {
        (self.0 & SCORE_MASK) as u8
    }
    pub fn stamp(self) -> u8 {
        (self.0 >> STAMP_SHIFT) as u8
    }
    pub fn last_degree(self) -> u32 {
        (self.0 >> DEGREE_SHIFT) & DEGREE_MASK
    }
    pub fn page_type(self) -> PageType {
        PageType::from_bits((self.0 >> TYPE_SHIFT) as u8)
    }
    pub fn write(self) -> bool {
        self.0 & WRITE_BIT != 0
    }
    pub fn node_raw(self) -> u8 {
        ((self.0 >> NODE_SHIFT) & NODE_MASK) as u8
    }
    pub fn node(self) -> Option<NodeId> {
        match self.node_raw() {
            NODE_UNKNOWN => None,
            n => Some(NodeId(n)),
        }
    }
    pub fn huge_head(self) -> bool {
        self.0 & HUGE_BIT != 0
    }
    pub fn seen(self) -> bool {
        self.0 & SEEN_BIT != 0
    }

    pub fn set_node(&mut self, node: Option<NodeId>) {
        let raw = node.map_or(NODE_UNKNOWN as u32, |n| {
            (n.0 as u32).min(NodeId::MAX as u32)
        });
        self.0 = (self.0 & !(NODE_MASK << NODE_SHIFT)) | (raw << NODE_SHIFT);
    }
    pub fn set_huge_head(&mut self, huge: bool) {
        if huge {
            self.0 |= HUGE_BIT
        } else {
            self.0 &= !HUGE_BIT
        }
    }
    fn set_type(&mut self, t: PageType) {
        self.0 = (self.0 & !(3 << TYPE_SHIFT)) | ((t as u32) << TYPE_SHIFT);
    }

    /// Forget hotness (keep placement, page type and the 2 MiB marker).
    pub fn forget(&mut self) {
        self.0 &= !FORGOTTEN;
    }
}

/// Lookup tables derived from the parameters.
///
/// Levels: with exponential decay, a frame's effective score at round `R` is
/// `score * decay^(R - stamp)`, so `log(score) + stamp * log(1/decay)` orders frames the same way
/// at every round. The engine keeps that quantity, in units of `1/q` of a round of decay, as an
/// absolute level; the level relative to now is `logq[score] - q * age`. A histogram over absolute
/// levels only changes when a frame is hinted or moved, never because time passes: old levels just
/// fall out of a ring into a "cold" bucket. That is what makes a round O(hints), not O(frames).
#[derive(Clone, Debug)]
pub struct Tables {
    /// `decay[age]` = round(256 * decay^age).
    decay: [u16; 256],
    /// `logq[s]` = floor(q * log_{1/decay}(s)): the level of score `s`.
    logq: [u8; 256],
    /// Levels per round of decay.
    pub q: u32,
    /// Degree of a hint by count and write bit, per count meaning (`CountMeaning as usize`).
    degrees: [[[u8; 2]; 256]; 2],
    /// The score a frame hinted every round with a degree settles at (about degree / (1 -
    /// decay), with the score arithmetic's rounding).
    steady: [u8; DEGREE_MASK as usize + 1],
    /// Relative level a frame needs to be hot (the level of `min_hot_score`).
    pub min_hot_level: u8,
    /// Relative level a frame needs to count in the pool's hot-set size, per count meaning:
    /// `hot_set_min_score` for rounds seen, the steady score of a frame read at
    /// `hot_set_min_rate_hz` for rate levels.
    pub hot_set_level: [u8; 2],
    /// The rate level of `hot_set_min_rate_hz`: a rate-level hint at least this counts its frames
    /// in the pool's hot set.
    pub hot_rate_level: u8,
    /// Levels by which a frame must exceed another to displace it.
    pub hysteresis_levels: u8,
}

/// Relative levels are below this (the level of score 255 is at most 79).
pub const MAX_LEVEL: usize = 80;
/// Absolute levels are kept in a ring this long: the live window plus one round's expiry.
pub const RING: usize = 128;

/// Bucket key of a frame: `(relative_level + 1) << 1 | not_file`, or `not_file` for a cold frame
/// (never hinted, forgotten, or decayed below score 1). Higher is hotter; at equal level guest
/// file cache sorts below anonymous memory, so it is demoted first.
pub type Key = u16;
pub const KEY_BUCKETS: usize = (MAX_LEVEL + 1) * 2;

/// The relative level of a key, `None` for cold.
pub const fn key_level(k: Key) -> Option<u16> {
    match k >> 1 {
        0 => None,
        l => Some(l - 1),
    }
}

pub const fn key_of(level: Option<u16>, not_file: bool) -> Key {
    let l = match level {
        Some(l) => l + 1,
        None => 0,
    };
    (l << 1) | not_file as u16
}

impl Tables {
    pub fn new(p: &EngineParams) -> Tables {
        let mut decay = [0u16; 256];
        let mut f = 1.0f64;
        for d in decay.iter_mut() {
            *d = (256.0 * f).round() as u16;
            f *= p.decay;
        }
        let rounds_255 = (255f64).ln() / (1.0 / p.decay).ln();
        let q = ((MAX_LEVEL - 1) as f64 / rounds_255)
            .floor()
            .clamp(1.0, 4.0) as u32;
        let mut logq = [0u8; 256];
        for (sc, l) in logq.iter_mut().enumerate().skip(1) {
            let v = (q as f64 * (sc as f64).ln() / (1.0 / p.decay).ln()).floor();
            *l = v.clamp(0.0, (MAX_LEVEL - 1) as f64) as u8;
        }
        let min_hot = p.min_hot_score.clamp(1, 255) as usize;
        let hyst = (q as f64 * p.hysteresis.max(1.0).ln() / (1.0 / p.decay).ln()).ceil();
        let mut degrees = [[[0u8; 2]; 256]; 2];
        for meaning in [CountMeaning::RoundsSeen, CountMeaning::RateLevel] {
            for count in 0..=255u8 {
                for write in [false, true] {
                    degrees[meaning as usize][count as usize][write as usize] =
                        degree(p, meaning, count, write) as u8;
                }
            }
        }
        // Where a frame hinted every round at the hot rate settles, with the score arithmetic's
        // rounding (about degree / (1 - decay)).
        let hot_rate_degree = degree(
            p,
            CountMeaning::RateLevel,
            level_of_rate(p.hot_set_min_rate_hz),
            false,
        );
        let mut steady = [0u8; DEGREE_MASK as usize + 1];
        for (d, st) in steady.iter_mut().enumerate() {
            let mut x = 0usize;
            for _ in 0..256 {
                x = (((x * decay[1] as usize) >> 8) + d).min(255);
            }
            *st = x as u8;
        }
        let hot_rate_score = steady[hot_rate_degree as usize] as usize;
        Tables {
            decay,
            logq,
            q,
            degrees,
            steady,
            hot_rate_level: level_of_rate(p.hot_set_min_rate_hz),
            min_hot_level: logq[min_hot],
            hot_set_level: [
                logq[p.hot_set_min_score.clamp(1, 255) as usize],
                logq[hot_rate_score.clamp(1, 255)],
            ],
            hysteresis_levels: hyst.clamp(0.0, MAX_LEVEL as f64) as u8,
        }
    }

    #[inline(always)]
    /// The least hint count that names a frame of the hot set (one the pool counts in the
    /// hot-set size when hinted so every round): the rate level of `hot_set_min_rate_hz`, or the
    /// rounds seen whose steady score reaches `hot_set_min_score`. 255 where none does.
    pub fn hot_count(&self, meaning: CountMeaning) -> u8 {
        match meaning {
            CountMeaning::RateLevel => self.hot_rate_level,
            CountMeaning::RoundsSeen => (1..=255u8)
                .find(|&c| {
                    let d = self.degree(meaning, c, false) as usize;
                    self.logq[self.steady[d.min(self.steady.len() - 1)].max(1) as usize]
                        >= self.hot_set_level[CountMeaning::RoundsSeen as usize]
                })
                .unwrap_or(255),
        }
    }

    pub(crate) fn degree(&self, meaning: CountMeaning, count: u8, write: bool) -> u32 {
        self.degrees[meaning as usize][count as usize][write as usize] as u32
    }

    /// Merges hints of degree `deg` (writes if `write`) into a frame already hinted in `round`:
    /// what `hint` does with a duplicate whose page type is unknown. Merging is a maximum and an
    /// OR, so merging the largest degree once equals merging each duplicate in turn.
    #[inline]
    pub(crate) fn merge_degree(
        &self,
        s: &mut FrameState,
        meaning: CountMeaning,
        deg: u32,
        write: bool,
    ) {
        let last = s.last_degree();
        if deg > last {
            let score = if meaning == CountMeaning::RateLevel {
                self.steady[deg as usize] as u32
            } else {
                (s.score() as u32 + (deg - last)).min(255)
            };
            s.0 = (s.0 & !(SCORE_MASK | (DEGREE_MASK << DEGREE_SHIFT)))
                | score
                | (deg << DEGREE_SHIFT);
        }
        if write {
            s.0 |= WRITE_BIT;
        }
    }

    #[inline(always)]
    pub fn age(&self, s: FrameState, round: u8) -> u8 {
        round.wrapping_sub(s.stamp())
    }

    /// The score decayed to `round`.
    #[inline(always)]
    pub fn eff_score(&self, s: FrameState, round: u8) -> u8 {
        if !s.seen() {
            return 0;
        }
        let age = self.age(s, round) as usize;
        ((s.score() as u32 * self.decay[age] as u32) >> 8) as u8
    }

    /// The frame's level relative to `round`; `None` when cold.
    #[inline(always)]
    pub fn level(&self, s: FrameState, round: u8) -> Option<u16> {
        if !s.seen() {
            return None;
        }
        let l = self.logq[s.score() as usize] as i32 - (self.q * self.age(s, round) as u32) as i32;
        if l >= 0 {
            Some(l as u16)
        } else {
            None
        }
    }

    #[inline]
    pub fn key(&self, s: FrameState, round: u8) -> Key {
        key_of(self.level(s, round), s.page_type() != PageType::File)
    }

    /// Ring slot of the frame's absolute level at round `round` (the full round counter), `None`
    /// when cold.
    #[inline(always)]
    pub fn ring_slot(&self, s: FrameState, round: u64) -> Option<usize> {
        let rel = self.level(s, round as u8)? as u64;
        Some(((rel + self.q as u64 * round) % RING as u64) as usize)
    }

    /// Ring slot of a frame hinted in round `round` (age 0: its level is that of its score).
    #[inline(always)]
    pub fn ring_slot_fresh(&self, s: FrameState, round: u64) -> usize {
        ((self.logq[s.score() as usize] as u64 + self.q as u64 * round) % RING as u64) as usize
    }

    /// Apply one hint to a frame at `round`. Duplicates in the same round merge: the larger
    /// degree wins, the page type is the first known one.
    ///
    /// Rounds seen (v1.0) are single observations: the score accumulates them with the decay.
    /// A rate level (v1.1) is already the guest's average over many windows: the score becomes
    /// the steady score of its degree, so a changed rate is ranked as such in the next round
    /// rather than averaged in again over several.
    #[inline(always)]
    pub fn hint(
        &self,
        s: &mut FrameState,
        round: u8,
        meaning: CountMeaning,
        count: u8,
        write: bool,
        t: PageType,
    ) {
        let deg = self.degree(meaning, count, write);
        let rate = meaning == CountMeaning::RateLevel;
        if s.seen() && s.stamp() == round {
            self.merge_degree(s, meaning, deg, write);
            if s.page_type() == PageType::Unknown {
                s.set_type(t);
            }
            return;
        }
        let score = if rate {
            self.steady[deg as usize] as u32
        } else {
            (self.eff_score(*s, round) as u32 + deg).min(255)
        };
        let keep = s.0 & ((NODE_MASK << NODE_SHIFT) | HUGE_BIT | (3 << TYPE_SHIFT));
        let mut n = FrameState(
            keep | score | ((round as u32) << STAMP_SHIFT) | (deg << DEGREE_SHIFT) | SEEN_BIT,
        );
        if write {
            n.0 |= WRITE_BIT;
        }
        if t != PageType::Unknown {
            n.set_type(t);
        }
        *s = n;
    }

    /// Forget frames hinted so long ago that their stamp could soon wrap. They are cold long
    /// before (a level lasts at most 80 / q rounds), so forgetting never changes a key. Returns
    /// true if the state changed.
    #[inline]
    pub fn maintain(&self, s: &mut FrameState, round: u8) -> bool {
        if s.seen() && self.age(*s, round) >= FORGET_AGE {
            s.forget();
            true
        } else {
            false
        }
    }

    /// `maintain` on every frame of `frames`, in straight-line code the compiler makes vector
    /// instructions (a round visits a 32nd of a VM's frames).
    pub fn maintain_all(&self, frames: &mut [FrameState], round: u8) {
        const _: () = assert!(FORGET_AGE == 0x80 && SEEN_BIT == 1 << 31);
        for s in frames {
            let age = (round as u32).wrapping_sub(s.0 >> STAMP_SHIFT);
            // Seen, and the age (mod 256) at least `FORGET_AGE`: its bit 7.
            let old = (s.0 >> 31) & (age >> 7);
            s.0 &= !(old.wrapping_neg() & FORGOTTEN);
        }
    }
}

/// Ring slot of cold frames in a level histogram (`Tables::ring_slot` is `None`).
pub const COLD_SLOT: usize = RING;

/// Hint bits of an entry (`HintEntry` bits 40-50: count, write, page type), which index the
/// per-round lookups of `RoundHints`.
pub const HINT_SHIFT: u32 = 40;
const HINT_BITS: usize = 1 << 11;

/// What ingesting one round needs per entry, looked up once per round: `Tables::hint` on a frame
/// not hinted yet in the round, and the frame's level-histogram slots before and after, in
/// straight-line code (a round is millions of entries). Indexed by an entry's hint bits.
pub struct RoundHints<'t> {
    tables: &'t Tables,
    /// Copies of the tables' lookups, next to the others.
    decay: [u16; 256],
    logq: [u8; 256],
    q: u32,
    /// Bits of the old state the new one keeps: node, 2 MiB mark, and the page type unless the
    /// entry has one.
    keep: [u32; HINT_BITS],
    /// Bits the new state gets: seen, this round's stamp, degree, write, page type, and (rate
    /// levels) the score.
    set: [u32; HINT_BITS],
    /// Rounds seen: the degree, added to the decayed score.
    add: [u8; HINT_BITS],
    /// Rate levels: the ring slot of the new score.
    slot: [u8; HINT_BITS],
    /// Rounds seen: the ring slot of a frame hinted this round, by its new score.
    score_slot: [u8; 256],
    /// The seen bit and this round's stamp: a frame whose state has them was hinted this round.
    stamp_now: u32,
    /// `q * round` modulo the ring, where this round's levels start.
    level_base: u32,
}

impl Tables {
    pub fn round_hints(&self, round: u64, meaning: CountMeaning) -> RoundHints<'_> {
        let stamp_now = SEEN_BIT | ((round as u8 as u32) << STAMP_SHIFT);
        let level_base = (self.q as u64 * round % RING as u64) as u32;
        let mut rh = RoundHints {
            tables: self,
            decay: self.decay,
            logq: self.logq,
            q: self.q,
            keep: [0; HINT_BITS],
            set: [0; HINT_BITS],
            add: [0; HINT_BITS],
            slot: [0; HINT_BITS],
            score_slot: [0; 256],
            stamp_now,
            level_base,
        };
        for (score, slot) in rh.score_slot.iter_mut().enumerate() {
            *slot = ((self.logq[score] as u32 + level_base) % RING as u32) as u8;
        }
        for h in 0..HINT_BITS {
            let e = vtism_proto::HintEntry((h as u64) << HINT_SHIFT);
            let deg = self.degree(meaning, e.count(), e.write());
            let t = e.page_type() as u32;
            rh.keep[h] =
                (NODE_MASK << NODE_SHIFT) | HUGE_BIT | if t == 0 { 3 << TYPE_SHIFT } else { 0 };
            rh.set[h] = stamp_now
                | (deg << DEGREE_SHIFT)
                | if e.write() { WRITE_BIT } else { 0 }
                | (t << TYPE_SHIFT);
            match meaning {
                CountMeaning::RoundsSeen => rh.add[h] = deg as u8,
                CountMeaning::RateLevel => {
                    let score = self.steady[deg as usize];
                    rh.set[h] |= score as u32;
                    rh.slot[h] =
                        ((self.logq[score as usize] as u32 + level_base) % RING as u32) as u8;
                }
            }
        }
        rh
    }
}

impl<'t> RoundHints<'t> {
    pub fn tables(&self) -> &'t Tables {
        self.tables
    }

    /// What a hint with hint bits `h` (an entry's bits 40-50) does to a frame not hinted in the
    /// round yet, as `fresh` does it: the bits of the frame's state it keeps, the bits it sets,
    /// and (rounds seen) the degree it adds to the decayed score or (rate levels) the frame's
    /// ring slot after it.
    pub fn per_hint(&self, h: usize) -> (u32, u32, u8, u8) {
        let h = h % HINT_BITS;
        (self.keep[h], self.set[h], self.add[h], self.slot[h])
    }

    /// Rounds seen: the ring slot of a frame hinted this round, by its new score.
    pub fn score_slots(&self) -> &[u8; 256] {
        &self.score_slot
    }

    /// An entry's hint on a frame (the entry's frame or one of its 2 MiB unit), as `Tables::hint`
    /// does it, with the frame's ring slot before (`COLD_SLOT` when cold) and after. `None` for a
    /// frame already hinted this round, whose duplicates merge in `Tables::hint`. `RATE`: the
    /// round's counts are rate levels.
    #[inline(always)]
    pub fn fresh<const RATE: bool>(
        &self,
        s: FrameState,
        entry: u64,
    ) -> Option<(FrameState, u8, u8)> {
        let s = s.0;
        if s & (SEEN_BIT | (0xff << STAMP_SHIFT)) == self.stamp_now {
            return None;
        }
        let h = (entry >> HINT_SHIFT) as usize % HINT_BITS;
        // A frame never hinted (or forgotten) has no score: mask it by the seen bit.
        let score = s & SCORE_MASK & ((s as i32 >> 31) as u32);
        let stamp = (s >> STAMP_SHIFT) & 0xff;
        let age = (self.stamp_now >> STAMP_SHIFT).wrapping_sub(stamp) & 0xff;
        let lq = self.logq[score as usize] as u32;
        let decayed = self.q * age;
        // Live: seen, and not decayed below score 1 (`Tables::level` is not negative).
        let live = lq + (s >> 31) > decayed;
        let mask = (live as usize).wrapping_neg();
        let slot = (lq.wrapping_sub(decayed).wrapping_add(self.level_base) % RING as u32) as usize;
        let before = ((slot & mask) | (COLD_SLOT & !mask)) as u8;
        let kept = (s & self.keep[h]) | self.set[h];
        if RATE {
            return Some((FrameState(kept), before, self.slot[h]));
        }
        let eff = (score * self.decay[age as usize] as u32) >> 8;
        let new_score = (eff + self.add[h] as u32).min(255);
        Some((
            FrameState(kept | new_score),
            before,
            self.score_slot[new_score as usize % 256],
        ))
    }

    /// Fills `d` for this round: per stamp and score of a seen frame, the ring slot (`COLD_SLOT`
    /// when cold, `HINTED_NOW` when hinted this round) in the low byte and the score decayed to
    /// this round in the high one, as `fresh` computes them. The cell of score and stamp 0 is
    /// also where every frame not seen is (`decay_index`): cold with no score, what that seen
    /// frame is, but in the one round in 256 whose stamp is 0 it marks them hinted, so that they
    /// take `Tables::hint`, which tells them apart.
    pub fn fill_decay_table(&self, d: &mut DecayTable) {
        let now = (self.stamp_now >> STAMP_SHIFT) as u8;
        for stamp in 0..=255u8 {
            let age = now.wrapping_sub(stamp) as u32;
            let decayed = self.q * age;
            for score in 0..=255u8 {
                let lq = self.logq[score as usize] as u32;
                let slot = if age == 0 {
                    HINTED_NOW
                } else if lq >= decayed {
                    ((lq - decayed + self.level_base) % RING as u32) as u16
                } else {
                    COLD_SLOT as u16
                };
                let eff = (score as u32 * self.decay[age as usize] as u32) >> 8;
                let at = decay_index(FrameState(
                    SEEN_BIT | ((stamp as u32) << STAMP_SHIFT) | score as u32,
                ));
                d.0[at] = slot | (eff as u16) << 8;
            }
        }
    }

    /// `fresh`, with the frame's slot and decayed score looked up in this round's `d`, for an
    /// entry whose hint bits (40-50) are `hint`.
    #[inline(always)]
    pub fn fresh_looked_up<const RATE: bool>(
        &self,
        d: &[u16; DECAY_CELLS],
        s: FrameState,
        hint: usize,
    ) -> Option<(FrameState, u8, u8)> {
        let cell = d[decay_index(s)];
        let before = cell as u8;
        if before == HINTED_NOW as u8 {
            return None;
        }
        let h = hint % HINT_BITS;
        let kept = (s.0 & self.keep[h]) | self.set[h];
        if RATE {
            return Some((FrameState(kept), before, self.slot[h]));
        }
        let new_score = ((cell >> 8) as u32 + self.add[h] as u32).min(255);
        let slot = self.score_slot[new_score as usize % 256];
        Some((FrameState(kept | new_score), before, slot))
    }

    /// A hint with hint bits `hint` on a frame hinted this round already, where `fresh_looked_up`
    /// gives `None`: the hints merge as in `Tables::hint`, with the frame's ring slots before and
    /// after (a frame hinted this round is at the level of its score). `None` for a frame not
    /// seen (what `fresh_looked_up` also says of one in the round in 256 whose stamp is 0).
    #[inline(always)]
    pub fn merge_looked_up<const RATE: bool>(
        &self,
        s: FrameState,
        hint: usize,
    ) -> Option<(FrameState, u8, u8)> {
        if !s.seen() {
            return None;
        }
        debug_assert_eq!(s.0 & (SEEN_BIT | (0xff << STAMP_SHIFT)), self.stamp_now);
        let set = self.set[hint % HINT_BITS];
        let (deg, last) = ((set >> DEGREE_SHIFT) & DEGREE_MASK, s.last_degree());
        let mut n = s.0;
        if deg > last {
            // Rate levels: `set` has the steady score of the degree.
            let score = match RATE {
                true => set & SCORE_MASK,
                false => (s.score() as u32 + (deg - last)).min(255),
            };
            n = (n & !(SCORE_MASK | (DEGREE_MASK << DEGREE_SHIFT))) | score | (deg << DEGREE_SHIFT);
        }
        n |= set & WRITE_BIT;
        if n & (3 << TYPE_SHIFT) == 0 {
            n |= set & (3 << TYPE_SHIFT);
        }
        let after = FrameState(n);
        let slot = |s: FrameState| self.score_slot[s.score() as usize];
        Some((after, slot(s), slot(after)))
    }
}

/// A frame's ring slot and decayed score as of one round, by its score and stamp
/// (`decay_index`): what `RoundHints::fresh` computes from them, looked up instead. Built once per
/// large round (`RoundHints::fill_decay_table`): 64 Ki cells, of which a round touches the few
/// rows of the stamps its frames carry.
pub struct DecayTable([u16; DECAY_CELLS]);

pub const DECAY_CELLS: usize = 1 << 16;
/// The slot byte of a cell whose frames were hinted this round already (their hints merge).
const HINTED_NOW: u16 = 0xff;
const _: () = assert!(COLD_SLOT < HINTED_NOW as usize);

/// Where a frame's state is in a `DecayTable`: its score and stamp. The seen bit is not needed:
/// a frame not seen has neither (`FrameState::NEW`, `FrameState::forget`), which is what a seen
/// frame with neither has when it is cold, at any age but 0.
#[inline(always)]
fn decay_index(s: FrameState) -> usize {
    debug_assert!(s.seen() || s.0 & 0xffff == 0, "{s:?}: not seen but scored");
    s.0 as usize % DECAY_CELLS
}

impl DecayTable {
    pub fn new() -> Self {
        DecayTable([0; DECAY_CELLS])
    }

    pub fn cells(&self) -> &[u16; DECAY_CELLS] {
        &self.0
    }

    /// A frame's ring slot (`COLD_SLOT` when cold) and score decayed to the table's round, before
    /// a hint in that round, as `RoundHints::fresh` has them; `None` where `fresh_looked_up` is
    /// `None` (a frame hinted in the round already).
    #[inline(always)]
    pub fn before(&self, s: FrameState) -> Option<(u8, u8)> {
        let cell = self.0[decay_index(s)];
        (cell as u8 != HINTED_NOW as u8).then_some((cell as u8, (cell >> 8) as u8))
    }

    pub const fn memory_bytes() -> usize {
        DECAY_CELLS * 2
    }
}

impl Default for DecayTable {
    fn default() -> Self {
        Self::new()
    }
}

/// Reads a rate-level hint counts for at most: the 256 levels (16 octaves) map onto this many
/// degrees, about 0.6 octave each, leaving room for the write weight under the 5-bit degree.
pub const RATE_READS_MAX: u32 = 28;

/// HMM-V's page degree of one hint, `read_weight * reads + write_weight * write` clipped to 31,
/// where `reads` is the guest's count clipped to `count_cap` (rounds seen; a hinted frame was read
/// at least once), or the rate level mapped linearly onto 1..=`RATE_READS_MAX` (so degrees
/// order like rates: log scale, about 1.5x per degree).
fn degree(p: &EngineParams, meaning: CountMeaning, count: u8, write: bool) -> u32 {
    let reads = match meaning {
        CountMeaning::RoundsSeen => (count as u32).clamp(1, p.count_cap),
        CountMeaning::RateLevel => 1 + (count as u32 * (RATE_READS_MAX - 1) + 127) / 255,
    };
    (p.read_weight * reads + if write { p.write_weight } else { 0 }).min(DEGREE_MASK)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t() -> Tables {
        Tables::new(&EngineParams::default())
    }

    #[test]
    fn degree_is_hmmv_page_degree_clipped() {
        let t = t();
        let r = CountMeaning::RoundsSeen;
        assert_eq!(t.degree(r, 0, false), 1); // a hinted frame was accessed at least once
        assert_eq!(t.degree(r, 5, true), 5 + 3);
        assert_eq!(t.degree(r, 200, true), 8 + 3);
    }

    #[test]
    fn rate_levels_map_monotonically_onto_all_read_degrees() {
        let t = t();
        let r = CountMeaning::RateLevel;
        assert_eq!(t.degree(r, 0, false), 1);
        assert_eq!(t.degree(r, 255, false), RATE_READS_MAX);
        assert_eq!(t.degree(r, 255, true), RATE_READS_MAX + 3);
        for c in 1..=255u8 {
            assert!(t.degree(r, c, false) >= t.degree(r, c - 1, false));
        }
        // 1 Hz (level 96) lands mid-scale.
        assert_eq!(t.degree(r, 96, false), 11);
    }

    #[test]
    fn a_rate_level_sets_the_score_instead_of_accumulating() {
        let t = t();
        let mut s = FrameState::NEW;
        for r in 0..10u8 {
            t.hint(
                &mut s,
                r,
                CountMeaning::RateLevel,
                255,
                false,
                PageType::Anon,
            );
        }
        let hot = s.score();
        assert_eq!(hot, t.steady[RATE_READS_MAX as usize]);
        // The rate fell: the next round ranks the frame at its new rate at once.
        t.hint(
            &mut s,
            10,
            CountMeaning::RateLevel,
            96,
            false,
            PageType::Anon,
        );
        assert_eq!(s.score(), t.steady[11]);
        // Duplicates in a round: the larger wins.
        t.hint(
            &mut s,
            10,
            CountMeaning::RateLevel,
            200,
            false,
            PageType::Anon,
        );
        t.hint(
            &mut s,
            10,
            CountMeaning::RateLevel,
            50,
            false,
            PageType::Anon,
        );
        assert_eq!(
            s.score(),
            t.steady[t.degree(CountMeaning::RateLevel, 200, false) as usize]
        );
    }

    #[test]
    fn hot_set_level_by_rate_is_the_steady_level_of_the_hot_rate() {
        let t = t();
        let mut at = FrameState::NEW;
        let mut below = FrameState::NEW;
        for r in 0..40u8 {
            t.hint(
                &mut at,
                r,
                CountMeaning::RateLevel,
                96,
                false,
                PageType::Anon,
            );
            t.hint(
                &mut below,
                r,
                CountMeaning::RateLevel,
                60,
                false,
                PageType::Anon,
            );
        }
        let hot = t.hot_set_level[CountMeaning::RateLevel as usize] as u16;
        assert!(t.level(at, 39).unwrap() >= hot);
        assert!(t.level(below, 39).unwrap() < hot);
    }

    /// A hot frame by its hint: at the hot-set rate, or (rounds seen) one whose steady score
    /// reaches hot_set_min_score (16): degree 4 settles just under it with the score
    /// arithmetic's rounding, so 5 rounds of 8.
    #[test]
    fn hot_counts() {
        let p = EngineParams::default();
        let t = Tables::new(&p);
        assert_eq!(
            t.hot_count(CountMeaning::RateLevel),
            level_of_rate(p.hot_set_min_rate_hz)
        );
        assert_eq!(t.hot_count(CountMeaning::RoundsSeen), 5);
    }

    #[test]
    fn round_hints_and_decay_tables_do_what_hint_and_ring_slots_do() {
        let mut rng = crate::synth::Rng::new(7);
        let params = [
            EngineParams::default(),
            EngineParams {
                read_weight: 0,
                decay: 0.5,
                ..Default::default()
            },
            EngineParams {
                decay: 0.93,
                write_weight: 9,
                ..Default::default()
            },
        ];
        let mut decay = DecayTable::new();
        for p in &params {
            let t = Tables::new(p);
            for meaning in [CountMeaning::RoundsSeen, CountMeaning::RateLevel] {
                for round in [0u64, 1, 5, 200, 255, 256, 1000, 70_001] {
                    let rh = t.round_hints(round, meaning);
                    rh.fill_decay_table(&mut decay);
                    let r = round as u8;
                    for _ in 0..20_000 {
                        let mut s = FrameState(rng.next_u64() as u32);
                        if !s.seen() {
                            s.forget();
                        }
                        if s.seen() && rng.chance(0.2) {
                            // Recently hinted frames: small ages, this round included.
                            s.0 = (s.0 & !(0xff << STAMP_SHIFT))
                                | ((r.wrapping_sub(rng.below(4) as u8) as u32) << STAMP_SHIFT);
                        }
                        let e = rng.next_u64() & ((1 << 53) - 1);
                        let he = vtism_proto::HintEntry(e);
                        let mut want = s;
                        t.hint(
                            &mut want,
                            r,
                            meaning,
                            he.count(),
                            he.write(),
                            he.page_type(),
                        );
                        let got = if meaning == CountMeaning::RateLevel {
                            rh.fresh::<true>(s, e)
                        } else {
                            rh.fresh::<false>(s, e)
                        };
                        // The same, looked up in the round's decay table: but a frame not seen
                        // is taken for one hinted, and merged, in the round whose stamp is 0.
                        let hint = (e >> HINT_SHIFT) as usize;
                        let looked_up = if meaning == CountMeaning::RateLevel {
                            rh.fresh_looked_up::<true>(decay.cells(), s, hint)
                        } else {
                            rh.fresh_looked_up::<false>(decay.cells(), s, hint)
                        };
                        assert_eq!(
                            decay.before(s).map(|(slot, _)| slot),
                            looked_up.map(|(_, from, _)| from),
                            "{s:?} round {round}"
                        );
                        if !s.seen() && r == 0 {
                            assert_eq!(looked_up, None, "{s:?} round {round}");
                        } else {
                            assert_eq!(looked_up, got, "{s:?} {e:#x} round {round} {meaning:?}");
                        }
                        if s.seen() && s.stamp() == r {
                            assert_eq!(got, None, "{s:?} hinted this round");
                            let merged = if meaning == CountMeaning::RateLevel {
                                rh.merge_looked_up::<true>(s, (e >> HINT_SHIFT) as usize)
                            } else {
                                rh.merge_looked_up::<false>(s, (e >> HINT_SHIFT) as usize)
                            };
                            let (after, from, to) = merged.expect("a frame seen");
                            assert_eq!(after, want, "{s:?} {e:#x} round {round} {meaning:?}");
                            assert_eq!(from as usize, t.ring_slot(s, round).unwrap(), "{s:?}");
                            assert_eq!(to as usize, t.ring_slot_fresh(want, round), "{want:?}");
                            continue;
                        }
                        let (after, from, to) = got.expect("a frame not hinted this round");
                        assert_eq!(after, want, "{s:?} {e:#x} round {round} {meaning:?}");
                        assert_eq!(
                            from as usize,
                            t.ring_slot(s, round).unwrap_or(COLD_SLOT),
                            "{s:?}"
                        );
                        assert_eq!(to as usize, t.ring_slot_fresh(want, round), "{want:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn packing_keeps_fields_apart() {
        let mut s = FrameState::NEW;
        assert_eq!(s.node(), None);
        s.set_node(Some(NodeId(5)));
        s.set_huge_head(true);
        t().hint(&mut s, 7, CountMeaning::RoundsSeen, 3, true, PageType::File);
        assert_eq!(s.node(), Some(NodeId(5)));
        assert!(s.huge_head() && s.seen() && s.write());
        assert_eq!(s.page_type(), PageType::File);
        assert_eq!(s.stamp(), 7);
        assert_eq!(s.score(), 3 + 3);
        s.forget();
        assert_eq!(s.node(), Some(NodeId(5)));
        assert!(!s.seen() && s.huge_head());
    }

    #[test]
    fn steady_hinting_settles_near_degree_over_one_minus_decay() {
        let t = t();
        let mut s = FrameState::NEW;
        for r in 0..50u8 {
            t.hint(
                &mut s,
                r,
                CountMeaning::RoundsSeen,
                8,
                false,
                PageType::Anon,
            );
        }
        // 8 / (1 - 0.75) = 32, with rounding down along the way.
        assert!((28..=32).contains(&s.score()), "{}", s.score());
    }

    #[test]
    fn duplicates_in_a_round_merge_not_add() {
        let t = t();
        let mut a = FrameState::NEW;
        t.hint(
            &mut a,
            1,
            CountMeaning::RoundsSeen,
            4,
            false,
            PageType::Unknown,
        );
        t.hint(
            &mut a,
            1,
            CountMeaning::RoundsSeen,
            2,
            false,
            PageType::Anon,
        );
        t.hint(
            &mut a,
            1,
            CountMeaning::RoundsSeen,
            6,
            false,
            PageType::File,
        );
        assert_eq!(a.score(), 6);
        assert_eq!(a.page_type(), PageType::Anon);
    }

    #[test]
    fn keys_order_by_decayed_score_then_anon_over_file() {
        let t = t();
        let mut hot = FrameState::NEW;
        let mut warm = FrameState::NEW;
        t.hint(
            &mut hot,
            10,
            CountMeaning::RoundsSeen,
            8,
            false,
            PageType::Anon,
        );
        t.hint(
            &mut warm,
            10,
            CountMeaning::RoundsSeen,
            2,
            false,
            PageType::Anon,
        );
        assert!(t.key(hot, 10) > t.key(warm, 10));
        let mut file = FrameState::NEW;
        t.hint(
            &mut file,
            10,
            CountMeaning::RoundsSeen,
            2,
            false,
            PageType::File,
        );
        assert!(t.key(file, 10) < t.key(warm, 10));
        // Decay: a hot frame not hinted for a while falls below a fresh warm one.
        let mut fresh = FrameState::NEW;
        t.hint(
            &mut fresh,
            16,
            CountMeaning::RoundsSeen,
            2,
            false,
            PageType::Anon,
        );
        assert!(t.key(hot, 16) < t.key(fresh, 16));
        assert_eq!(t.key(FrameState::NEW, 3), 1);
        assert_eq!(t.level(hot, 10 + 40), None);
    }

    #[test]
    fn levels_order_like_effective_scores() {
        // Wherever two frames' effective scores differ by more than the quantisation, their
        // levels order the same way.
        let t = t();
        let mut frames = Vec::new();
        for (count, round) in [(1u8, 0u8), (2, 3), (8, 1), (8, 5), (3, 6), (1, 6)] {
            let mut s = FrameState::NEW;
            for r in 0..=round {
                if r % 2 == 0 || r == round {
                    t.hint(
                        &mut s,
                        r,
                        CountMeaning::RoundsSeen,
                        count,
                        false,
                        PageType::Anon,
                    );
                }
            }
            frames.push(s);
        }
        for now in 6..20u8 {
            for a in &frames {
                for b in &frames {
                    let (ea, eb) = (t.eff_score(*a, now) as f64, t.eff_score(*b, now) as f64);
                    if ea >= 1.0 && eb >= 1.0 && ea > eb * 1.6 {
                        assert!(
                            t.level(*a, now) > t.level(*b, now),
                            "now {now}: {ea} vs {eb}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn absolute_levels_do_not_move_with_time() {
        let t = t();
        let mut s = FrameState::NEW;
        t.hint(&mut s, 5, CountMeaning::RoundsSeen, 8, true, PageType::Anon);
        let slot = t.ring_slot(s, 5).unwrap();
        assert_eq!(t.ring_slot_fresh(s, 5), slot);
        for now in 5..40u64 {
            match t.ring_slot(s, now) {
                Some(k) => assert_eq!(k, slot, "round {now}"),
                None => assert!(t.level(s, now as u8).is_none()),
            }
        }
    }

    #[test]
    fn stamps_do_not_wrap_into_youth() {
        let t = t();
        let mut s = FrameState::NEW;
        t.hint(
            &mut s,
            0,
            CountMeaning::RoundsSeen,
            8,
            false,
            PageType::Anon,
        );
        assert!(!t.maintain(&mut s, 100));
        let mut far = s;
        assert!(t.maintain(&mut far, FORGET_AGE));
        assert!(!far.seen());
        assert_eq!(t.key(far, 0), 1);
        // Over many frames at once, the same.
        let mut rng = crate::synth::Rng::new(3);
        let mut frames: Vec<FrameState> = (0..4096)
            .map(|_| FrameState(rng.next_u64() as u32))
            .collect();
        for round in [0u8, 1, 100, 127, 128, 200, 255] {
            let mut want = frames.clone();
            for s in &mut want {
                t.maintain(s, round);
            }
            t.maintain_all(&mut frames, round);
            assert_eq!(frames, want, "round {round}");
        }
        assert_eq!(t.key(s, FORGET_AGE), 1, "cold long before it is forgotten");
    }
}
