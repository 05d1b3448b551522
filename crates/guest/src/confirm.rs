//! Frame-by-frame confirmation of DAMON's hot regions.
//!
//! DAMON samples one random address per region per sampling interval and reports a region
//! whole. A region that straddles hot and cold frames is therefore reported hot with its cold
//! frames, and its boundaries only converge on the hot/cold edge over tens of aggregations
//! (random splits; merges of neighbours whose access counts differ by at most 10% of the
//! samples). How many cold frames get published thus depended on where the guest's allocator
//! had put them (precision 0.57 to 1.0 in the agent's e2e before this).
//!
//! The agent therefore gives DAMON its own region boundaries: the frames (or 2 MiB THP units)
//! seen hot in at least `min_count` rounds (`min_count_for`: 2 below the publication
//! threshold) become target regions of their own (`state commit`
//! of the target's regions; DAMON keeps its adapted regions elsewhere). A region of one frame is
//! sampled at that frame only, so its access count is the frame's own. Afterwards DAMON merges
//! neighbours only when their access counts are within 10% of the samples, so a confirmed hot
//! frame merges with hot neighbours and a cold one with cold neighbours: the boundaries stay
//! where the frames' behaviour changes. A cold frame that lay in a straddling region thus stops
//! gaining rounds once it is confirmed, and stays below the threshold.
//!
//! The set is sticky (a frame stays confirmed while it has a history, so a stable hot set means
//! no further commits) and bounded by `cap` frames (DAMON's region count must stay below
//! `max_nr_regions`, or DAMON merges with ever larger thresholds). When it is full, a newcomer
//! takes the place of a confirmed frame only if it has been hot in at least 2 more rounds.

use crate::history::History;
use crate::iomem::PhysRange;
use std::collections::HashMap;
use vtism_proto::HUGE_FRAMES;

/// The frames given regions of their own, and when to change them.
#[derive(Debug)]
pub struct Confirm {
    cap: usize,
    min_count: u32,
    /// frame -> 2 MiB unit
    set: HashMap<u64, bool>,
    commits: u64,
}

impl Confirm {
    /// At most `cap` frames (0 = off), admitted once hot in `min_count` rounds (>= 1).
    pub fn new(cap: usize, min_count: u32) -> Confirm {
        Confirm {
            cap,
            min_count: min_count.max(1),
            set: HashMap::new(),
            commits: 0,
        }
    }

    /// The admission count for a publication threshold: 2 rounds below it (at least 1). A
    /// frame admitted after round r is sampled on its own from round r + 1 on (the commit
    /// takes effect at the end of DAMON's current aggregation, before the next one the agent
    /// reads), so a cold frame's count stops at most at `threshold - 2`, one round of margin
    /// for DAMON's first merge after the commit. Admitting earlier would only add commits: in
    /// the e2e with 2, the 4096 cold pages touched every 5 rounds (count 2 at times) kept
    /// the set full and changing, 28 commits in 38 rounds, doubling the rounds' wall time.
    pub fn min_count_for(threshold: u32) -> u32 {
        threshold.saturating_sub(2).max(1)
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

    /// Updates the set from the history after a round. Returns the sorted (frame, unit) list to
    /// commit when frames were admitted, `None` when DAMON's layout can stay.
    pub fn update(&mut self, h: &History) -> Option<Vec<(u64, bool)>> {
        if self.cap == 0 {
            return None;
        }
        // frames whose history ended leave; their one-frame regions stay with DAMON until the
        // next commit, which is harmless
        self.set.retain(|&g, _| h.count(g) > 0);
        let mut new: Vec<(u32, bool, u64, bool)> = h
            .iter()
            .filter(|&(g, count, _, _)| count >= self.min_count && !self.set.contains_key(&g))
            .map(|(g, count, young, huge)| (count, young, g, huge))
            .collect();
        if new.is_empty() {
            return None;
        }
        // hottest newcomers first
        new.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(b.1.cmp(&a.1)).then(a.2.cmp(&b.2)));
        let free = self.cap.saturating_sub(self.set.len());
        let mut admitted = 0;
        let mut rest = new.into_iter();
        for (_, _, g, huge) in rest.by_ref().take(free) {
            self.set.insert(g, huge);
            admitted += 1;
        }
        // full: a newcomer replaces a confirmed frame hot in at least 2 rounds fewer
        let mut victims: Vec<(u32, u64)> = Vec::new();
        let mut pending: Vec<(u32, u64, bool)> = rest.map(|(c, _, g, u)| (c, g, u)).collect();
        if !pending.is_empty() {
            victims = self.set.keys().map(|&g| (h.count(g), g)).collect();
            victims.sort_unstable();
        }
        let mut vi = victims.into_iter();
        for (count, g, huge) in pending.drain(..) {
            match vi.next() {
                Some((vc, vg)) if vc + 2 <= count => {
                    self.set.remove(&vg);
                    self.set.insert(g, huge);
                    admitted += 1;
                }
                _ => break,
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

    fn region(first: u64, frames: u64) -> Region {
        Region {
            start: first << 12,
            end: (first + frames) << 12,
            nr_accesses: 1,
            age: 0,
        }
    }

    #[test]
    fn admits_after_min_count_sticky_bounded() {
        let mut f = BTreeMap::new();
        for p in 0..64 {
            f.insert(p, ANON | LRU);
        }
        let mut h = History::new(8, 6, 1, 1 << 20);
        let mut c = Confirm::new(8, 2);
        h.round(&[region(0, 4)], &f).unwrap();
        assert_eq!(c.update(&h), None, "one round: not yet");
        h.round(&[region(0, 4)], &f).unwrap();
        let v = c.update(&h).unwrap();
        assert_eq!(v, vec![(0, false), (1, false), (2, false), (3, false)]);
        h.round(&[region(0, 4)], &f).unwrap();
        assert_eq!(c.update(&h), None, "nothing new: no commit");
        // 10 more frames twice: 4 fit
        h.round(&[region(0, 4), region(10, 10)], &f).unwrap();
        h.round(&[region(0, 4), region(10, 10)], &f).unwrap();
        let v = c.update(&h).unwrap();
        assert_eq!(v.len(), 8);
        assert_eq!(c.update(&h), None);
        // the first 4 have 5 rounds, the newcomers 2: no replacement
        h.round(&[region(30, 2)], &f).unwrap();
        h.round(&[region(30, 2)], &f).unwrap();
        assert_eq!(c.update(&h), None, "full, newcomers not hotter by 2");
        assert_eq!(c.commits(), 2);
        // let the confirmed frames cool down: after 8 empty rounds their histories end
        for _ in 0..6 {
            h.round(&[region(30, 2)], &f).unwrap();
        }
        let v = c.update(&h).unwrap();
        assert!(
            v.contains(&(30, false)) && v.contains(&(31, false)),
            "{v:?}"
        );
        assert!(c.len() <= 8);
        assert_eq!(Confirm::min_count_for(6), 4);
        assert_eq!(Confirm::min_count_for(3), 1);
        assert_eq!(Confirm::min_count_for(2), 1);
        assert_eq!(Confirm::min_count_for(1), 1);
        assert_eq!(Confirm::new(0, 2).update(&h), None);
    }
}
