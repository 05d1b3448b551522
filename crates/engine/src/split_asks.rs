//! When to ask again for a host folio to be split.
//!
//! A split the kernel made does not last: khugepaged collapses the block again once its scan
//! comes back to it (by default 4096 pages every 10 s: every few minutes on a small host, every
//! few days on a large one), and copies it onto the node that holds most of it. Asking for the
//! split again each time moves the block back and forth for as long as the workload runs. So a
//! block is asked at most once per back-off, and the back-off doubles with each ask, from
//! `FIRST` up to `LONGEST`: a block khugepaged leaves alone stays split after one ask, and one it
//! keeps collapsing is placed whole between asks, costing at most one 2 MiB copy an hour. A block
//! not asked for a whole back-off after it could have been (it stayed split, or the quota stopped
//! being short) starts again from `FIRST`.

use std::collections::HashMap;

use crate::types::Nanos;

/// The first back-off: the driver sees a split at its next backing read, well within a minute.
const FIRST: Nanos = Nanos(60_000_000_000);

/// The longest back-off (`FIRST` doubled six times, about an hour).
const LONGEST: Nanos = Nanos(FIRST.0 << 6);

#[derive(Clone, Copy, Debug)]
struct Asked {
    at: Nanos,
    back_off: Nanos,
}

impl Asked {
    fn since(&self, now: Nanos) -> u64 {
        now.0.saturating_sub(self.at.0)
    }

    /// Not asked for a whole back-off after it could have been.
    fn stale(&self, now: Nanos) -> bool {
        self.since(now) >= 2 * self.back_off.0
    }
}

/// The blocks (guest frame number >> 9) asked to be split, and when each may be asked again.
#[derive(Clone, Debug, Default)]
pub struct SplitAsks {
    asked: HashMap<u64, Asked>,
}

impl SplitAsks {
    /// Whether `block` may be asked now; if so, the ask is recorded.
    pub fn ask(&mut self, block: u64, now: Nanos) -> bool {
        let back_off = match self.asked.get(&block) {
            None => FIRST,
            Some(a) if a.since(now) < a.back_off.0 => return false,
            Some(a) if a.stale(now) => FIRST,
            Some(a) => Nanos((a.back_off.0 * 2).min(LONGEST.0)),
        };
        self.asked.insert(block, Asked { at: now, back_off });
        true
    }

    /// Drops the stale blocks (`ask` would start them again).
    pub fn expire(&mut self, now: Nanos) {
        self.asked.retain(|_, a| !a.stale(now));
    }

    pub fn clear(&mut self) {
        self.asked.clear();
    }

    pub fn memory_bytes(&self) -> usize {
        self.asked.capacity() * (8 + std::mem::size_of::<Asked>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: u64 = 60_000_000_000;

    /// Asks `block` every second for `secs`, from `start`; returns when it was let through.
    fn asks(s: &mut SplitAsks, block: u64, start: u64, secs: u64) -> Vec<u64> {
        (start..start + secs)
            .filter(|&t| s.ask(block, Nanos(t * 1_000_000_000)))
            .collect()
    }

    #[test]
    fn back_off_doubles_up_to_an_hour() {
        let mut s = SplitAsks::default();
        let got = asks(&mut s, 7, 0, 4 * 3600);
        let gaps: Vec<u64> = got.windows(2).map(|w| w[1] - w[0]).collect();
        assert_eq!(&gaps[..7], &[60, 120, 240, 480, 960, 1920, 3840]);
        assert!(gaps[7..].iter().all(|&g| g == 3840), "{gaps:?}");
        // Other blocks are not held back by it.
        assert!(s.ask(8, Nanos(4 * 3600 * 1_000_000_000)));
    }

    #[test]
    fn a_block_left_alone_starts_again() {
        let mut s = SplitAsks::default();
        assert!(s.ask(1, Nanos(0)));
        assert!(s.ask(1, Nanos(MIN)));
        // Its back-off is 2 min; not asked for 4 min after it could have been: from the start.
        assert!(s.ask(1, Nanos(MIN + 4 * MIN)));
        assert!(!s.ask(1, Nanos(MIN + 4 * MIN + MIN - 1)));
        assert!(s.ask(1, Nanos(MIN + 5 * MIN)));
        s.expire(Nanos(MIN + 5 * MIN + 4 * MIN));
        assert_eq!(s.asked.len(), 0);
    }
}
