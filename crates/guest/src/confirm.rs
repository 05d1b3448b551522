//! Frame-by-frame confirmation of DAMON's hot regions.
//!
//! DAMON samples one random address per region per sampling interval and reports a region
//! whole. A region that straddles hot and colder frames gives them all its share of young
//! windows, and its boundaries only converge on the edge over tens of aggregations (random
//! splits; merges of neighbours whose access counts differ by at most 10% of the samples).
//!
//! The agent therefore gives DAMON its own region boundaries: frames (or 2 MiB THP units) young
//! in at least half of their windows, or published at 1 Hz or more, whichever comes first
//! (`admit_share`, or the share of 1 Hz at the current window: at the window the loop keeps, about the
//! frames the host's quota holds) become target regions of their own (`state commit` of the
//! target's regions; DAMON keeps its adapted regions elsewhere). A region of one frame is
//! sampled at that frame only, so its share is the frame's own. Afterwards DAMON merges
//! neighbours only when their access counts are close, so a confirmed hot frame merges with hot
//! neighbours and a colder one with its like: the boundaries stay where behaviour changes.
//!
//! The set is sticky (a frame stays confirmed while it has a share, so a stable hot set means
//! no further commits) and bounded by `cap` frames (DAMON's region count must stay below
//! `max_nr_regions`, or DAMON merges with ever larger thresholds). When it is full, a newcomer
//! takes the place of a confirmed frame only if its share is higher by at least `REPLACE_MARGIN`.

use crate::frames::Frames;
use crate::iomem::PhysRange;
use std::collections::HashMap;
use vtism_proto::HUGE_FRAMES;

/// A newcomer replaces a confirmed frame only when its share is higher by this much.
pub const REPLACE_MARGIN: f64 = 0.25;
/// Frames young in at least this share of windows are confirmed.
pub const ADMIT_SHARE: f64 = 0.5;

/// The frames given regions of their own, and when to change them.
#[derive(Debug)]
pub struct Confirm {
    cap: usize,
    admit_share: f64,
    /// frame -> 2 MiB unit
    set: HashMap<u64, bool>,
    commits: u64,
}

impl Confirm {
    /// At most `cap` frames (0 = off), admitted at `admit_share`.
    pub fn new(cap: usize, admit_share: f64) -> Confirm {
        Confirm {
            cap,
            admit_share,
            set: HashMap::new(),
            commits: 0,
        }
    }

    /// Frames confirmed now.
    pub fn len(&self) -> usize {
        self.set.len()
    }

    pub fn is_empty(&self) -> bool {
        self.set.is_empty()
    }

    /// Layouts handed to DAMON so far.
    pub fn commits(&self) -> u64 {
        self.commits
    }

    /// Updates the set from the shares after an aggregation. Returns the sorted (frame, unit)
    /// list to commit when frames were admitted, `None` when DAMON's layout can stay.
    pub fn update(&mut self, f: &Frames) -> Option<Vec<(u64, bool)>> {
        if self.cap == 0 {
            return None;
        }
        // frames whose share ended leave; their one-frame regions stay with DAMON until the
        // next commit, which is harmless
        self.set.retain(|&g, _| f.share(g) > 0.0);
        // a frame published as hot is measured on its own from the next aggregation on: a
        // straddling region's share lifts its colder frames above 1 Hz for one round at most
        let admit = self
            .admit_share
            .min(crate::rate::share_of_rate(1.0, f.window_s()));
        let mut new: Vec<(f64, u64, bool)> = f
            .iter()
            .filter(|&(g, share, _)| share >= admit && !self.set.contains_key(&g))
            .map(|(g, share, huge)| (share, g, huge))
            .collect();
        if new.is_empty() {
            return None;
        }
        // highest shares first
        new.sort_unstable_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        let free = self.cap.saturating_sub(self.set.len());
        let mut admitted = 0;
        let mut rest = new.into_iter();
        for (_, g, huge) in rest.by_ref().take(free) {
            self.set.insert(g, huge);
            admitted += 1;
        }
        // full: a newcomer replaces the lowest confirmed frame when clearly higher
        let pending: Vec<(f64, u64, bool)> = rest.collect();
        if !pending.is_empty() {
            let mut victims: Vec<(f64, u64)> = self.set.keys().map(|&g| (f.share(g), g)).collect();
            victims.sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            for ((share, g, huge), (vs, vg)) in pending.into_iter().zip(victims) {
                if share < vs + REPLACE_MARGIN {
                    break;
                }
                self.set.remove(&vg);
                self.set.insert(g, huge);
                admitted += 1;
            }
        }
        if admitted == 0 {
            return None;
        }
        self.commits += 1;
        let mut v: Vec<(u64, bool)> = self.set.iter().map(|(&g, &u)| (g, u)).collect();
        v.sort_unstable();
        Some(v)
    }
}

/// DAMON target ranges: the RAM ranges cut so that each unit (`frame << 12`, 4 KiB or 2 MiB)
/// inside one of them is a range of its own. `units` sorted by frame; units that overlap an
/// earlier one or do not lie wholly inside a RAM range are left to DAMON.
pub fn layout(ram: &[PhysRange], units: &[(u64, bool)]) -> Vec<PhysRange> {
    let mut out = Vec::with_capacity(ram.len() + 2 * units.len());
    let mut ram: Vec<PhysRange> = ram.to_vec();
    ram.sort_by_key(|r| r.start);
    let mut u = units.iter().peekable();
    for r in ram {
        let mut cur = r.start;
        while let Some(&&(g, huge)) = u.peek() {
            let start = g << 12;
            let end = start + if huge { HUGE_FRAMES << 12 } else { 4096 };
            if start >= r.end {
                break;
            }
            u.next();
            if start < cur || end > r.end {
                continue;
            }
            if start > cur {
                out.push(PhysRange {
                    start: cur,
                    end: start,
                });
            }
            out.push(PhysRange { start, end });
            cur = end;
        }
        if cur < r.end {
            out.push(PhysRange {
                start: cur,
                end: r.end,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::damon::Region;
    use crate::frames::Frames;
    use crate::kpageflags::*;
    use std::collections::BTreeMap;

    fn pr(start: u64, end: u64) -> PhysRange {
        PhysRange { start, end }
    }

    #[test]
    fn layout_cuts_ram_at_units() {
        let ram = [pr(0x100000, 0x400000), pr(0x1000000, 0x1100000)];
        let units = [
            (0x80, false),  // below RAM: left out
            (0x100, false), // at the start of the first range
            (0x101, false), // adjacent
            (0x200, true),  // a 2 MiB unit
            (0x300, false), // inside that unit: overlaps, left out
            (0x3ff, true),  // runs past the range's end: left out
            (0x1010, false),
        ];
        let l = layout(&ram, &units);
        assert_eq!(
            l,
            vec![
                pr(0x100000, 0x101000),
                pr(0x101000, 0x102000),
                pr(0x102000, 0x200000),
                pr(0x200000, 0x400000),
                pr(0x1000000, 0x1010000),
                pr(0x1010000, 0x1011000),
                pr(0x1011000, 0x1100000),
            ]
        );
        // sorted, disjoint, covering the RAM exactly
        assert!(l.windows(2).all(|w| w[0].end <= w[1].start));
        let total: u64 = l.iter().map(|r| r.end - r.start).sum();
        assert_eq!(total, 0x300000 + 0x100000);
        assert_eq!(layout(&ram, &[]), ram.to_vec());
    }

    fn region(first: u64, frames: u64, nr: u32) -> Region {
        Region {
            start: first << 12,
            end: (first + frames) << 12,
            nr_accesses: nr,
            age: 0,
        }
    }

    #[test]
    fn admits_at_half_sticky_bounded() {
        let mut fl = BTreeMap::new();
        for p in 0..64 {
            fl.insert(p, ANON | LRU);
        }
        let mut f = Frames::new(2.0, 1 << 20);
        let mut c = Confirm::new(8, ADMIT_SHARE);
        let obs = |f: &mut Frames, r: &[Region]| f.observe(r, 12, &fl).unwrap();
        // windows of 2 s (1 Hz is a share of 0.86): admitted at half; young in every window of
        // an aggregation of 12: half way after 4 aggregations
        obs(&mut f, &[region(0, 4, 12)]);
        assert_eq!(c.update(&f), None, "one aggregation: not yet");
        for _ in 0..3 {
            obs(&mut f, &[region(0, 4, 12), region(10, 10, 1)]);
        }
        let v = c.update(&f).unwrap();
        assert_eq!(v, vec![(0, false), (1, false), (2, false), (3, false)]);
        obs(&mut f, &[region(0, 4, 12), region(10, 10, 1)]);
        assert_eq!(c.update(&f), None, "nothing new: no commit");
        // 10 more frames young in every window: 4 fit
        for _ in 0..5 {
            obs(&mut f, &[region(0, 4, 12), region(10, 10, 12)]);
        }
        let v = c.update(&f).unwrap();
        assert_eq!(v.len(), 8);
        assert_eq!(c.update(&f), None);
        // newcomers no higher than the confirmed: no replacement
        for _ in 0..5 {
            obs(
                &mut f,
                &[region(0, 4, 12), region(10, 10, 12), region(30, 2, 12)],
            );
        }
        assert_eq!(c.update(&f), None, "full, newcomers not clearly higher");
        assert_eq!(c.commits(), 2);
        // the confirmed frames cool down: their shares end and the newcomers take their places
        for _ in 0..30 {
            obs(&mut f, &[region(30, 2, 12)]);
        }
        let v = c.update(&f).unwrap();
        assert!(
            v.contains(&(30, false)) && v.contains(&(31, false)),
            "{v:?}"
        );
        assert_eq!(c.len(), 2);
        assert_eq!(Confirm::new(0, ADMIT_SHARE).update(&f), None);
        // windows of 100 ms: a frame young in 20% of them (2.2 Hz) is admitted below half
        let mut f = Frames::new(0.1, 1 << 20);
        let mut c = Confirm::new(8, ADMIT_SHARE);
        for _ in 0..15 {
            f.observe(&[region(40, 1, 1)], 5, &fl).unwrap();
        }
        assert!(f.share(40) < 0.5);
        assert_eq!(c.update(&f), Some(vec![(40, false)]));
    }
}
