//! Units moved lately, so that one demoted lately does not take back the place of one promoted
//! lately on a rate that did not rise.
//!
//! The rate the guest publishes for a frame is one burst's measurement, refreshed once a sweep
//! (one to two minutes in the testbed's nested guest, minutes on a large one), and shifted with
//! its region's coarse rate, which steps a whole region 4x at a time as the workload speeds up or
//! slows down (docs/guest.md, "Publication", "Change detection"). So after a hot set moves, the
//! units of the old one, demoted for the new one, keep their old level until the sweep measures
//! them again, while a region of the new hot set, just promoted, dips 4x for a round: exchanging
//! the two trades hot data for stale data, and nothing trades it back until the sweep comes
//! (docs/testbed.md, "placement at the end"). Such a return needs the demoted unit's rate above
//! the lowest it was published at since its demotion by more than that step. Returns into free
//! room, and exchanges with units that have held their place a while, are not held.

use std::collections::HashMap;

use vtism_proto::count::LEVELS_PER_OCTAVE;

use crate::hotness::RATE_READS_MAX;
use crate::types::Nanos;

/// The tracker's region-wide step (4x: a change alarm, or a stale frame following its region up,
/// docs/guest.md) in degrees (`hotness::degree`: 255 rate levels onto `RATE_READS_MAX` reads),
/// rounded up, plus the one degree an exchange needs anyway (`EngineParams::hysteresis`).
pub const RISE_DEGREES: u32 = (2 * LEVELS_PER_OCTAVE * (RATE_READS_MAX - 1)).div_ceil(255) + 1;

/// How long a move counts as recent: the longest the tracker leaves a frame it keeps finding hot
/// without measuring it, HMM-V's do-not-disturb level 7 (0.6 s x 2^6; the module's default
/// `dnd_max_level`, docs/guest.md).
pub const REMEMBERED: Nanos = Nanos(38_400_000_000);

/// Moves remembered per VM at most (1 GiB of 4 KiB units); past it, new ones are not.
const MOST: usize = 1 << 18;

#[derive(Clone, Copy, Debug)]
enum Way {
    Promoted,
    /// With the lowest degree published for the unit since.
    Demoted {
        floor: u8,
    },
}

#[derive(Clone, Copy, Debug)]
struct Moved {
    way: Way,
    at: Nanos,
}

/// Units moved lately, by dense index.
#[derive(Clone, Debug, Default)]
pub struct RecentMoves {
    units: HashMap<u32, Moved>,
    /// The hint round `follow` last saw.
    round: u64,
}

impl RecentMoves {
    fn insert(&mut self, idx: u32, way: Way, at: Nanos) {
        if self.units.len() < MOST || self.units.contains_key(&idx) {
            self.units.insert(idx, Moved { way, at });
        }
    }

    /// A unit was promoted at `now`.
    pub fn promoted(&mut self, idx: u32, now: Nanos) {
        self.insert(idx, Way::Promoted, now);
    }

    /// A unit was demoted at `now` while its degree was `degree`.
    pub fn demoted(&mut self, idx: u32, degree: u32, now: Nanos) {
        let floor = degree.min(u8::MAX as u32) as u8;
        self.insert(idx, Way::Demoted { floor }, now);
    }

    /// Whether a unit was demoted lately and its degree now is not above its floor by
    /// `RISE_DEGREES`.
    pub fn returning(&self, idx: u32, degree: u32) -> bool {
        matches!(self.units.get(&idx),
            Some(Moved { way: Way::Demoted { floor }, .. }) if degree < *floor as u32 + RISE_DEGREES)
    }

    /// Whether a unit was promoted lately.
    pub fn just_promoted(&self, idx: u32) -> bool {
        matches!(
            self.units.get(&idx),
            Some(Moved {
                way: Way::Promoted,
                ..
            })
        )
    }

    /// Lowers the demoted units' floors to what hint round `round` published (`degree_of`: 0
    /// for a unit it did not name, below the guest's lowest published rate). Once per round.
    pub fn follow(&mut self, round: u64, degree_of: impl Fn(u32) -> u32) {
        if round == self.round {
            return;
        }
        self.round = round;
        for (&idx, m) in self.units.iter_mut() {
            if let Way::Demoted { floor } = &mut m.way {
                *floor = (*floor).min(degree_of(idx).min(u8::MAX as u32) as u8);
            }
        }
    }

    /// Forgets moves older than `REMEMBERED`.
    pub fn expire(&mut self, now: Nanos) {
        if !self.units.is_empty() {
            self.units
                .retain(|_, m| now.0.saturating_sub(m.at.0) < REMEMBERED.0);
        }
    }

    pub fn clear(&mut self) {
        self.units.clear();
    }

    pub fn memory_bytes(&self) -> usize {
        self.units.capacity() * (4 + std::mem::size_of::<Moved>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rise_is_the_trackers_4x_step_and_one_degree() {
        // 32 rate levels are 3.39 degrees.
        assert_eq!(RISE_DEGREES, 5);
    }

    #[test]
    fn a_demoted_unit_returns_once_it_rose_past_the_step_or_the_move_is_old() {
        let mut r = RecentMoves::default();
        assert!(!r.returning(7, 1));
        r.demoted(7, 17, Nanos(0));
        assert!(r.returning(7, 17));
        assert!(r.returning(7, 17 + RISE_DEGREES - 1));
        assert!(!r.returning(7, 17 + RISE_DEGREES));
        assert!(!r.returning(8, 17));
        r.expire(Nanos(REMEMBERED.0 - 1));
        assert!(r.returning(7, 17));
        r.expire(REMEMBERED);
        assert!(!r.returning(7, 17));
    }

    #[test]
    fn the_latest_move_of_a_unit_is_the_one_remembered() {
        let mut r = RecentMoves::default();
        r.demoted(7, 17, Nanos(0));
        r.promoted(7, Nanos(1));
        assert!(r.just_promoted(7));
        assert!(!r.returning(7, 0));
        r.demoted(7, 17, Nanos(2));
        assert!(!r.just_promoted(7));
        assert!(r.returning(7, 17));
    }

    #[test]
    fn a_unit_that_fell_after_its_demotion_returns_when_it_rises_again() {
        let mut r = RecentMoves::default();
        r.demoted(3, 17, Nanos(0));
        r.demoted(4, 17, Nanos(0));
        r.promoted(5, Nanos(0));
        // Unit 3 is stale (published at 17, then a region-wide step lower); unit 4 went
        // unpublished (measured cold) for a round.
        r.follow(1, |i| if i == 3 { 17 } else { 0 });
        r.follow(2, |i| if i == 3 { 14 } else { 17 });
        r.follow(2, |_| 0);
        assert!(r.returning(3, 17));
        assert!(!r.returning(3, 14 + RISE_DEGREES));
        assert!(!r.returning(4, 17));
        assert!(r.just_promoted(5));
    }
}
