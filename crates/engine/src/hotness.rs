//! Per-frame hotness state, packed in 4 bytes, and the key frames are bucket-sorted by.
//!
//! Score: the HMM-V page degree (`read_weight * reads + write_weight * write`) accumulated with an
//! exponential decay per round. Recency: MGLRU-like generations from the rounds since the frame
//! was last hinted. Decay is lazy: a frame stores its score as of the round it was last hinted
//! and the effective score is `score * decay^age`, read from a table, so frames nobody hints cost
//! no writes.

use crate::params::EngineParams;
use crate::types::NodeId;
use vtism_proto::PageType;

/// Bit layout of a frame's `u32`:
/// `0..8` score, `8..16` stamp (round mod 256 of the last hint), `16..21` degree of the last
/// hint (to merge duplicates within a round), `21..23` page type, `23` write, `24..30` node
/// (63 = unknown), `30` head of a 2 MiB unit, `31` seen (stamp is meaningful).
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
        self.0 &= !(SEEN_BIT
            | SCORE_MASK
            | (0xff << STAMP_SHIFT)
            | (DEGREE_MASK << DEGREE_SHIFT)
            | WRITE_BIT);
    }
}

/// Lookup tables derived from the parameters: decay by age and generation by age.
#[derive(Clone, Debug)]
pub struct Tables {
    /// `decay[age]` = round(256 * decay^age).
    decay: [u16; 256],
    /// Generation of a frame of a given age: 0 (youngest) to 3 (oldest), like MGLRU's four.
    gen: [u8; 256],
    read_weight: u32,
    write_weight: u32,
    count_cap: u32,
    pub min_hot_score: u8,
}

/// Bucket key of a frame: `eff_score << 3 | (3 - generation) << 1 | not_file`.
/// Higher is hotter. Score dominates, recency breaks ties, and at equal score and recency guest
/// file cache sorts below anonymous memory, so it is demoted first.
pub type Key = u16;
pub const KEY_BUCKETS: usize = 256 << 3;

pub const fn key_score(k: Key) -> u8 {
    (k >> 3) as u8
}

impl Tables {
    pub fn new(p: &EngineParams) -> Tables {
        let mut decay = [0u16; 256];
        let mut f = 1.0f64;
        for d in decay.iter_mut() {
            *d = (256.0 * f).round() as u16;
            f *= p.decay;
        }
        let mut gen = [3u8; 256];
        for (age, g) in gen.iter_mut().enumerate() {
            // age 0 -> 0, 1..=2 -> 1, 3..=6 -> 2, 7.. -> 3 (log2 buckets)
            *g = match age {
                0 => 0,
                1..=2 => 1,
                3..=6 => 2,
                _ => 3,
            };
        }
        Tables {
            decay,
            gen,
            read_weight: p.read_weight,
            write_weight: p.write_weight,
            count_cap: p.count_cap,
            min_hot_score: p.min_hot_score.min(255) as u8,
        }
    }

    fn degree(&self, count: u8, write: bool) -> u32 {
        let reads = (count as u32).clamp(1, self.count_cap);
        (self.read_weight * reads + if write { self.write_weight } else { 0 }).min(DEGREE_MASK)
    }

    #[inline]
    pub fn age(&self, s: FrameState, round: u8) -> u8 {
        round.wrapping_sub(s.stamp())
    }

    /// The score decayed to `round`.
    #[inline]
    pub fn eff_score(&self, s: FrameState, round: u8) -> u8 {
        if !s.seen() {
            return 0;
        }
        let age = self.age(s, round) as usize;
        ((s.score() as u32 * self.decay[age] as u32) >> 8) as u8
    }

    #[inline]
    pub fn key(&self, s: FrameState, round: u8) -> Key {
        let not_file = (s.page_type() != PageType::File) as u16;
        if !s.seen() {
            return not_file;
        }
        let age = self.age(s, round) as usize;
        let eff = (s.score() as u32 * self.decay[age] as u32) >> 8;
        ((eff as u16) << 3) | ((3 - self.gen[age] as u16) << 1) | not_file
    }

    /// Apply one hint to a frame at `round`. Duplicates in the same round merge: the larger
    /// degree wins, the page type is the first known one.
    #[inline]
    pub fn hint(&self, s: &mut FrameState, round: u8, count: u8, write: bool, t: PageType) {
        let deg = self.degree(count, write);
        if s.seen() && s.stamp() == round {
            let last = s.last_degree();
            if deg > last {
                let score = (s.score() as u32 + (deg - last)).min(255);
                s.0 = (s.0 & !(SCORE_MASK | (DEGREE_MASK << DEGREE_SHIFT)))
                    | score
                    | (deg << DEGREE_SHIFT);
            }
            if write {
                s.0 |= WRITE_BIT;
            }
            if s.page_type() == PageType::Unknown {
                s.set_type(t);
            }
            return;
        }
        let base = self.eff_score(*s, round) as u32;
        let score = (base + deg).min(255);
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

    /// The key of a frame, and the frame's state after [`Tables::maintain`] if that changes it:
    /// one age and decay lookup for both (the classification pass's inner loop).
    #[inline(always)]
    pub fn key_and_maintain(&self, s: FrameState, round: u8) -> (Key, Option<FrameState>) {
        let not_file = (((s.0 >> TYPE_SHIFT) & 3) != PageType::File as u32) as u16;
        if !s.seen() {
            return (not_file, None);
        }
        let age = round.wrapping_sub(s.stamp()) as usize;
        let eff = (s.score() as u32 * self.decay[age] as u32) >> 8;
        let g = self.gen[age] as u16;
        if age >= FORGET_AGE as usize || (g == 3 && eff == 0) {
            let mut f = s;
            f.forget();
            return (not_file, Some(f));
        }
        (((eff as u16) << 3) | ((3 - g) << 1) | not_file, None)
    }

    /// Forget a frame's history once that cannot change its key (decayed score 0, oldest
    /// generation), and always before its stamp could wrap. Forgotten frames of one node and type
    /// have identical states, so the planner's pass over them runs at memory speed. Returns true
    /// if the state changed.
    #[inline]
    pub fn maintain(&self, s: &mut FrameState, round: u8) -> bool {
        if !s.seen() {
            return false;
        }
        let age = self.age(*s, round);
        if age >= FORGET_AGE || (self.gen[age as usize] == 3 && self.eff_score(*s, round) == 0) {
            s.forget();
            true
        } else {
            false
        }
    }
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
        assert_eq!(t.degree(0, false), 1); // a hinted frame was accessed at least once
        assert_eq!(t.degree(5, true), 5 + 3);
        assert_eq!(t.degree(200, true), 8 + 3);
    }

    #[test]
    fn packing_keeps_fields_apart() {
        let mut s = FrameState::NEW;
        assert_eq!(s.node(), None);
        s.set_node(Some(NodeId(5)));
        s.set_huge_head(true);
        t().hint(&mut s, 7, 3, true, PageType::File);
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
            t.hint(&mut s, r, 8, false, PageType::Anon);
        }
        // 8 / (1 - 0.75) = 32, with rounding down along the way.
        assert!((28..=32).contains(&s.score()), "{}", s.score());
    }

    #[test]
    fn duplicates_in_a_round_merge_not_add() {
        let t = t();
        let mut a = FrameState::NEW;
        t.hint(&mut a, 1, 4, false, PageType::Unknown);
        t.hint(&mut a, 1, 2, false, PageType::Anon);
        t.hint(&mut a, 1, 6, false, PageType::File);
        assert_eq!(a.score(), 6);
        assert_eq!(a.page_type(), PageType::Anon);
    }

    #[test]
    fn key_orders_score_then_recency_then_anon_over_file() {
        let t = t();
        let mut hot = FrameState::NEW;
        let mut warm = FrameState::NEW;
        t.hint(&mut hot, 10, 8, false, PageType::Anon);
        t.hint(&mut warm, 10, 2, false, PageType::Anon);
        assert!(t.key(hot, 10) > t.key(warm, 10));
        // Equal score and age: file below anon.
        let mut file = FrameState::NEW;
        t.hint(&mut file, 10, 2, false, PageType::File);
        assert!(t.key(file, 10) < t.key(warm, 10));
        // Decay: an old hot frame falls below a fresh warm one.
        assert!(t.key(hot, 20) < t.key(warm, 10));
        assert_eq!(t.key(FrameState::NEW, 3), 1);
        assert_eq!(t.eff_score(hot, 10 + 40), 0);
    }

    #[test]
    fn stamps_do_not_wrap_into_youth() {
        let t = t();
        let mut s = FrameState::NEW;
        t.hint(&mut s, 0, 8, false, PageType::Anon);
        let mut far = s;
        assert!(t.maintain(&mut far, FORGET_AGE));
        assert!(!far.seen());
        assert_eq!(t.key(far, 0), 1);
    }

    #[test]
    fn fused_key_matches_key_then_maintain() {
        let t = t();
        for count in [1u8, 2, 8, 100] {
            for ty in [PageType::Anon, PageType::File] {
                let mut s = FrameState::NEW;
                s.set_node(Some(NodeId(2)));
                t.hint(&mut s, 3, count, count > 50, ty);
                for round in 0..=255u8 {
                    let (k, m) = t.key_and_maintain(s, round);
                    let mut m2 = s;
                    let changed = t.maintain(&mut m2, round);
                    assert_eq!(k, t.key(m2, round));
                    assert_eq!(m, if changed { Some(m2) } else { None });
                }
            }
        }
    }

    #[test]
    fn forgetting_never_changes_a_key() {
        let t = t();
        for score_count in [1u8, 3, 8, 200] {
            for write in [false, true] {
                for ty in [PageType::Anon, PageType::File, PageType::Unknown] {
                    let mut s = FrameState::NEW;
                    t.hint(&mut s, 0, score_count, write, ty);
                    for round in 0..=255u8 {
                        let mut m = s;
                        let before = t.key(s, round);
                        if t.maintain(&mut m, round) && (round as u16) < FORGET_AGE as u16 {
                            assert_eq!(
                                t.key(m, round),
                                before,
                                "count {score_count} round {round}"
                            );
                        }
                    }
                }
            }
        }
    }
}
