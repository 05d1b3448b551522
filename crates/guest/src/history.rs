//! Hot regions to channel entries, with the module's history semantics: each 4 KiB frame (or
//! 2 MiB THP unit) keeps a window of rounds; bit i set = the frame lay in a region DAMON found
//! accessed (`nr_accesses >= min_accesses`) i rounds ago. `count` = rounds hot within the
//! window; frames with `count >= hot_threshold` are published, hottest first.
//!
//! Memory is bounded: at most `max_tracked` frames (units) keep a history; past that the
//! coldest (fewest rounds hot, then least recently hot) are evicted and counted.

use crate::damon::Region;
use crate::kpageflags::{self, FlagSource};
use std::collections::HashMap;
use std::io;
use vtism_proto::{Gfn, HintEntry, PageType, HUGE_FRAMES};

const CHUNK: u64 = 4096;

/// Default of `max_tracked`: 1 Mi frames or units (4 GiB of 4 KiB pages, far more with THPs),
/// about 32 MiB of map at most.
pub const DEFAULT_MAX_TRACKED: usize = 1 << 20;

#[derive(Clone, Copy, Debug)]
struct State {
    bits: u32,
    page_type: PageType,
    huge: bool,
}

impl State {
    /// Eviction order, coldest first: fewest rounds hot, then the longest since last hot.
    fn coldness(&self) -> (u32, std::cmp::Reverse<u32>) {
        (
            self.bits.count_ones(),
            std::cmp::Reverse(self.bits.trailing_zeros()),
        )
    }
}

/// What one round found.
#[derive(Debug, Default)]
pub struct RoundOutput {
    /// Hottest first: count descending, then young, then frame number.
    pub entries: Vec<HintEntry>,
    /// 4 KiB frames the entries stand for (512 per 2 MiB unit).
    pub hot_frames: u64,
    /// Bytes covered by the regions found accessed this round.
    pub accessed_bytes: u64,
    /// Frames (units) seen hot this round.
    pub young_units: u64,
    /// Histories evicted this round to stay within `max_tracked`.
    pub evicted: u64,
}

/// Per-frame history across rounds.
#[derive(Debug)]
pub struct History {
    window: u32,
    threshold: u32,
    min_accesses: u32,
    max_tracked: usize,
    states: HashMap<u64, State>,
    evicted: u64,
}

impl History {
    /// `window` rounds of history (1-32), publish at `threshold` rounds hot (>= 1), a region
    /// counts as accessed at `min_accesses` samples (>= 1); at most `max_tracked` (>= 1)
    /// histories.
    pub fn new(window: u32, threshold: u32, min_accesses: u32, max_tracked: usize) -> History {
        History {
            window: window.clamp(1, 32),
            threshold: threshold.max(1),
            min_accesses: min_accesses.max(1),
            max_tracked: max_tracked.max(1),
            states: HashMap::new(),
            evicted: 0,
        }
    }

    /// Frames (units) with a non-empty history.
    pub fn tracked(&self) -> usize {
        self.states.len()
    }

    /// Histories evicted since the start.
    pub fn evicted(&self) -> u64 {
        self.evicted
    }

    /// Rounds hot within the window, 0 for a frame without history.
    pub fn count(&self, gfn: u64) -> u32 {
        self.states.get(&gfn).map_or(0, |s| s.bits.count_ones())
    }

    /// (frame, count, young, 2 MiB unit) of every frame with a history, in no order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, u32, bool, bool)> + '_ {
        self.states
            .iter()
            .map(|(&g, s)| (g, s.bits.count_ones(), s.bits & 1 != 0, s.huge))
    }

    /// Drops the coldest histories until at most `keep` remain; returns how many went.
    fn evict_to(&mut self, keep: usize) -> u64 {
        let n = self.states.len();
        if n <= keep {
            return 0;
        }
        let k = n - keep;
        let mut v: Vec<_> = self
            .states
            .iter()
            .map(|(&g, s)| (s.coldness(), g))
            .collect();
        v.select_nth_unstable(k - 1);
        for &(_, g) in &v[..k] {
            self.states.remove(&g);
        }
        self.evicted += k as u64;
        k as u64
    }

    /// Marks a unit hot this round.
    fn mark(&mut self, gfn: u64, page_type: PageType, huge: bool) {
        let s = self.states.entry(gfn).or_insert(State {
            bits: 0,
            page_type,
            huge,
        });
        s.bits |= 1;
        s.huge = huge;
        if page_type != PageType::Unknown {
            s.page_type = page_type;
        }
    }

    /// Marks the units of the accessed regions hot: user pages only (per kpageflags), THPs as
    /// one unit at their 512-aligned head. Keeps the map within `max_tracked` (plus 1/8 of
    /// slack between evictions) while it goes. Returns the bytes of the accessed regions, the
    /// units marked and the THP heads among them.
    fn mark_young(
        &mut self,
        regions: &[Region],
        flags: &dyn FlagSource,
    ) -> io::Result<(u64, u64, Vec<u64>)> {
        let mut bytes = 0;
        let mut marked = 0;
        let mut heads = Vec::new();
        let slack = self.max_tracked + self.max_tracked / 8;
        let mut buf = vec![0u64; CHUNK as usize];
        let min_accesses = self.min_accesses;
        for r in regions.iter().filter(|r| r.nr_accesses >= min_accesses) {
            bytes += r.end - r.start;
            let first = r.start >> 12;
            let end = r.end.div_ceil(4096);
            let mut base = u64::MAX; // first pfn in buf
            let mut pfn = first;
            while pfn < end {
                if pfn < base || pfn >= base + CHUNK {
                    base = pfn;
                    flags.flags(base, &mut buf)?;
                    if self.states.len() > slack {
                        self.evict_to(self.max_tracked);
                    }
                }
                let f = buf[(pfn - base) as usize];
                if f & kpageflags::THP != 0
                    && (kpageflags::is_thp_head(f) || kpageflags::is_tail(f))
                {
                    let head = pfn & !(HUGE_FRAMES - 1);
                    let hf = if head >= base {
                        buf[(head - base) as usize]
                    } else {
                        let mut one = [0u64; 1];
                        flags.flags(head, &mut one)?;
                        one[0]
                    };
                    if kpageflags::is_thp_head(hf) {
                        self.mark(head, kpageflags::page_type(hf), true);
                        heads.push(head);
                        marked += 1;
                        pfn = head + HUGE_FRAMES;
                        continue;
                    }
                }
                if kpageflags::is_user_page(f) {
                    self.mark(pfn, kpageflags::page_type(f), false);
                    marked += 1;
                }
                pfn += 1;
            }
        }
        Ok((bytes, marked, heads))
    }

    /// Ages every history by one round, records this round's accessed regions and returns the
    /// frames to publish.
    pub fn round(&mut self, regions: &[Region], flags: &dyn FlagSource) -> io::Result<RoundOutput> {
        let mask = if self.window == 32 {
            u32::MAX
        } else {
            (1u32 << self.window) - 1
        };
        for s in self.states.values_mut() {
            s.bits = (s.bits << 1) & mask;
        }
        self.states.retain(|_, s| s.bits != 0);
        let evicted_before = self.evicted;
        let (accessed_bytes, young_units, heads) = self.mark_young(regions, flags)?;
        // a 4 KiB history under a unit that became a THP is covered by the unit: drop it
        for h in heads {
            for g in h + 1..h + HUGE_FRAMES {
                self.states.remove(&g);
            }
        }
        self.evict_to(self.max_tracked);

        let mut hot: Vec<(u32, bool, u64, State)> = self
            .states
            .iter()
            .map(|(&g, s)| (s.bits.count_ones(), s.bits & 1 != 0, g, *s))
            .filter(|h| h.0 >= self.threshold)
            .collect();
        hot.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(b.1.cmp(&a.1)).then(a.2.cmp(&b.2)));
        let hot_frames = hot
            .iter()
            .map(|h| if h.3.huge { HUGE_FRAMES } else { 1 })
            .sum();
        let entries = hot
            .iter()
            .map(|&(count, young, g, s)| {
                // the write bit is unknown to DAMON: always false
                HintEntry::new(Gfn(g), count, false, s.page_type, s.huge, young)
            })
            .collect();
        Ok(RoundOutput {
            entries,
            hot_frames,
            accessed_bytes,
            young_units,
            evicted: self.evicted - evicted_before,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kpageflags::*;
    use std::collections::BTreeMap;

    fn region(first: u64, frames: u64, nr: u32) -> Region {
        Region {
            start: first << 12,
            end: (first + frames) << 12,
            nr_accesses: nr,
            age: 0,
        }
    }

    fn flags() -> BTreeMap<u64, u64> {
        let mut m = BTreeMap::new();
        for p in 100..110 {
            m.insert(p, ANON | LRU | SWAPBACKED);
        }
        m.insert(110, LRU | MMAP); // file
        m.insert(111, LRU | MMAP | SWAPBACKED); // shmem
        m.insert(112, SLAB); // kernel page: never reported
                             // 113.. free (BUDDY in the fake)
        m.insert(1024, THP | COMPOUND_HEAD | ANON | LRU);
        for p in 1025..1536 {
            m.insert(p, THP | COMPOUND_TAIL | ANON);
        }
        m
    }

    #[test]
    fn conversion_types_thp_and_free_frames() {
        let f = flags();
        let mut h = History::new(8, 1, 1, 1 << 20);
        // the region starts mid-THP: the unit is reported once at its head
        let out = h
            .round(
                &[
                    region(100, 20, 3),
                    region(1300, 300, 1),
                    region(5000, 10, 0),
                ],
                &f,
            )
            .unwrap();
        let by: BTreeMap<u64, HintEntry> = out.entries.iter().map(|e| (e.gfn().0, *e)).collect();
        assert_eq!(by.len(), 13, "{by:?}");
        assert_eq!(by[&100].page_type(), PageType::Anon);
        assert_eq!(by[&110].page_type(), PageType::File);
        assert_eq!(by[&111].page_type(), PageType::Shmem);
        assert!(!by.contains_key(&112));
        assert!(!by.contains_key(&113));
        assert!(by[&1024].huge());
        assert_eq!(by[&1024].page_type(), PageType::Anon);
        assert!(by
            .values()
            .all(|e| !e.write() && e.young() && e.count() == 1));
        assert_eq!(out.hot_frames, 12 + 512);
        assert_eq!(out.accessed_bytes, (20 + 300) * 4096);
    }

    #[test]
    fn history_counts_rounds_and_threshold() {
        let f = flags();
        let mut h = History::new(4, 2, 1, 1 << 20);
        let hot = region(100, 5, 2); // 100..105 every round
        let cold = region(105, 5, 1); // 105..110 in round 1 only
        let out = h.round(&[hot, cold], &f).unwrap();
        assert!(out.entries.is_empty(), "one round is below the threshold");
        let out = h.round(&[hot], &f).unwrap();
        assert_eq!(out.entries.len(), 5);
        assert!(out.entries.iter().all(|e| e.count() == 2 && e.young()));
        for _ in 0..5 {
            h.round(&[hot], &f).unwrap();
        }
        let out = h.round(&[hot, cold], &f).unwrap();
        // window 4 caps the count; the cold frames have 1 round in the window
        assert!(out.entries.iter().all(|e| e.count() == 4));
        assert_eq!(out.entries.len(), 5);
        let out = h.round(&[cold], &f).unwrap();
        // hottest first: cold now has 2 young (count 2, young), hot 3 (not young)
        let counts: Vec<(u8, bool)> = out.entries.iter().map(|e| (e.count(), e.young())).collect();
        assert_eq!(counts[..5], [(3, false); 5]);
        assert_eq!(counts[5..], [(2, true); 5]);
        for _ in 0..4 {
            h.round(&[], &f).unwrap();
        }
        assert_eq!(h.tracked(), 0, "empty histories are dropped");
    }

    #[test]
    fn min_accesses_filters_regions() {
        let f = flags();
        let mut h = History::new(8, 1, 3, 1 << 20);
        let out = h
            .round(&[region(100, 5, 2), region(105, 5, 3)], &f)
            .unwrap();
        let g: Vec<u64> = out.entries.iter().map(|e| e.gfn().0).collect();
        assert_eq!(g, vec![105, 106, 107, 108, 109]);
    }

    #[test]
    fn entries_are_valid_for_the_writer() {
        let f = flags();
        let mut h = History::new(8, 1, 1, 1 << 20);
        let out = h.round(&[region(0, 2048, 1)], &f).unwrap();
        let mut w = vtism_proto::ChannelWriter::init(
            vtism_proto::OwnedRegion::zeroed(64 * 1024),
            vtism_proto::Tracker::Damon,
        )
        .unwrap();
        let p = w.publish(&out.entries, &Default::default()).unwrap();
        assert_eq!(p.count, out.entries.len() as u64);
    }

    #[test]
    fn memory_is_bounded_coldest_evicted_first() {
        let mut f = BTreeMap::new();
        for p in 0..100 {
            f.insert(p, ANON | LRU);
        }
        let mut h = History::new(8, 1, 1, 10);
        // frames 0..5 hot in every round
        for _ in 0..3 {
            h.round(&[region(0, 5, 5)], &f).unwrap();
        }
        // 20..25 once, long ago
        h.round(&[region(0, 5, 5), region(20, 5, 1)], &f).unwrap();
        h.round(&[region(0, 5, 5)], &f).unwrap();
        assert_eq!((h.tracked(), h.evicted()), (10, 0));
        // 50 new frames at once: the map stays at 10, the hot ones survive, the stale ones
        // (20..25, hot once two rounds ago) go before this round's newcomers
        let out = h.round(&[region(0, 5, 5), region(40, 50, 1)], &f).unwrap();
        assert_eq!(h.tracked(), 10);
        assert_eq!(out.evicted, 50);
        assert_eq!(h.evicted(), 50);
        for g in 0..5 {
            assert_eq!(h.count(g), 6, "frame {g}");
        }
        for g in 20..25 {
            assert_eq!(h.count(g), 0, "frame {g}");
        }
        assert_eq!((40..90).filter(|&g| h.count(g) == 1).count(), 5);
        // the published entries come from what is tracked
        assert!(out.entries.len() <= 10);
    }
}
