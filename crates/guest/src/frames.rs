//! Per-frame access shares from DAMON's regions, and the channel entries they rank.
//!
//! Each 4 KiB frame (or 2 MiB THP unit) that lay in a region DAMON saw accessed keeps a decayed
//! share of young windows ([`crate::rate`]); a frame in no accessed region this aggregation
//! counts as young in none of its windows. The published count is the rate level of the share.
//!
//! Memory is bounded: frames whose share is below level 0 are dropped, and at most
//! `max_tracked` frames (units) keep a share; past that the coldest are evicted and counted.

use crate::damon::Region;
use crate::kpageflags::{self, FlagSource};
use crate::rate;
use rustc_hash::FxHashMap;
use std::io;
use vtism_proto::count::{level_of_rate, LEVEL_1HZ};
use vtism_proto::{Gfn, HintEntry, PageType, HUGE_FRAMES};

const CHUNK: u64 = 4096;

/// Default of `max_tracked`: 1 Mi frames or units (4 GiB of 4 KiB pages, far more with THPs),
/// about 40 MiB of map at most.
pub const DEFAULT_MAX_TRACKED: usize = 1 << 20;

#[derive(Clone, Copy, Debug)]
struct State {
    share: f32,
    /// This aggregation's share of young windows, when `stamp` is this aggregation's.
    observed: f32,
    stamp: u32,
    page_type: PageType,
    huge: bool,
    saturated: bool,
}

impl State {
    /// The share once this aggregation is averaged in.
    fn next_share(&self, stamp: u32, windows: f64) -> f64 {
        let o = if self.stamp == stamp {
            self.observed as f64
        } else {
            0.0
        };
        rate::blend(self.share as f64, o, windows)
    }
}

/// What one aggregation did to the map.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Observed {
    /// Bytes of the regions seen accessed.
    pub accessed_bytes: u64,
    /// Frames (units) in them.
    pub units: u64,
    /// Shares evicted to stay within `max_tracked`.
    pub evicted: u64,
}

/// Entries to publish, hottest first.
#[derive(Debug, Default)]
pub struct Ranked {
    pub entries: Vec<HintEntry>,
    /// 4 KiB frames at level 96 (1 Hz) or above, 512 per 2 MiB unit.
    pub hot_frames: u64,
}

/// The kpageflags of a run of frames read in one go. A read covers at most what the region
/// being marked still needs (up to `CHUNK`): DAMON keeps 1,000 or more regions, most far
/// smaller than a chunk, and a whole chunk read at each one's start had the kernel compute the
/// flags of some 4 million frames a round for a guest of 100 thousand.
#[derive(Default)]
struct FlagWindow {
    buf: Vec<u64>,
    base: u64,
}

impl FlagWindow {
    fn holds(&self, pfn: u64) -> bool {
        pfn >= self.base && pfn - self.base < self.buf.len() as u64
    }

    fn get(&self, pfn: u64) -> u64 {
        self.buf[(pfn - self.base) as usize]
    }

    /// The flags of `pfn` up to `end` (exclusive, > pfn), at most `CHUNK` of them.
    fn read(&mut self, pfn: u64, end: u64, flags: &dyn FlagSource) -> io::Result<()> {
        let n = (end - pfn).min(CHUNK) as usize;
        self.buf.resize(n, 0);
        self.base = pfn;
        flags.flags(pfn, &mut self.buf)
    }
}

/// Per-frame shares.
#[derive(Debug)]
pub struct Frames {
    window_s: f64,
    max_tracked: usize,
    /// By frame number: the agent's own guest's frames, not keys anyone chooses, so a fast hash
    /// with no defence against chosen keys will do (every frame of every accessed region is
    /// looked up at each aggregation).
    states: FxHashMap<u64, State>,
    stamp: u32,
    evicted: u64,
    /// Asked between reads of the flags: true abandons the aggregation (`Interrupted`).
    stop: fn() -> bool,
}

impl Frames {
    /// Shares of windows of `window_s` seconds, at most `max_tracked` (>= 1) of them.
    pub fn new(window_s: f64, max_tracked: usize) -> Frames {
        Frames {
            window_s,
            max_tracked: max_tracked.max(1),
            states: FxHashMap::default(),
            stamp: 0,
            evicted: 0,
            stop: || false,
        }
    }

    /// `stop` is asked before each read of the flags; once it says true, [`Frames::observe`]
    /// gives up with `ErrorKind::Interrupted`, no share updated. A whole
    /// aggregation can take minutes of CPU in a slow guest, and SIGTERM must not wait for it.
    pub fn set_stop(&mut self, stop: fn() -> bool) {
        self.stop = stop;
    }

    /// Frames (units) with a share.
    pub fn tracked(&self) -> usize {
        self.states.len()
    }

    /// Shares evicted since the start.
    pub fn evicted(&self) -> u64 {
        self.evicted
    }

    pub fn window_s(&self) -> f64 {
        self.window_s
    }

    /// A frame's share, 0 without one.
    pub fn share(&self, gfn: u64) -> f64 {
        self.states.get(&gfn).map_or(0.0, |s| s.share as f64)
    }

    /// (frame, share, 2 MiB unit) of every frame with a share, in no order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, f64, bool)> + '_ {
        self.states
            .iter()
            .map(|(&g, s)| (g, s.share as f64, s.huge))
    }

    /// The sampling interval changed: every share becomes the share of the new window with the
    /// same rate.
    pub fn set_window(&mut self, window_s: f64) {
        if window_s == self.window_s || !rate::positive(window_s) {
            return;
        }
        for s in self.states.values_mut() {
            s.share = rate::rescale_share(s.share as f64, self.window_s, window_s) as f32;
        }
        self.window_s = window_s;
    }

    /// Averages in one aggregation of `samples` windows whose accessed regions are `regions`,
    /// each with `nr_accesses` out of `samples`.
    pub fn observe(
        &mut self,
        regions: &[Region],
        samples: u32,
        flags: &dyn FlagSource,
    ) -> io::Result<Observed> {
        let windows = f64::from(samples.max(1));
        self.stamp = self.stamp.wrapping_add(1);
        let evicted_before = self.evicted;
        let (accessed_bytes, units, heads) = self.mark(regions, samples.max(1), flags)?;
        // a 4 KiB share under a unit that became a THP is covered by the unit's
        for h in heads {
            for g in h + 1..h + HUGE_FRAMES {
                self.states.remove(&g);
            }
        }
        let stamp = self.stamp;
        let floor = rate::min_share(self.window_s);
        self.states.retain(|_, s| {
            let share = s.next_share(stamp, windows);
            s.share = share as f32;
            if s.huge {
                s.saturated = rate::saturated(s.saturated, share);
            }
            share >= floor
        });
        self.evict_to(self.max_tracked, windows);
        Ok(Observed {
            accessed_bytes,
            units,
            evicted: self.evicted - evicted_before,
        })
    }

    /// Records this aggregation's share of the frames in the accessed regions: user pages only
    /// (per kpageflags), THPs as one unit at their 512-aligned head. Keeps the map within
    /// `max_tracked` (plus 1/8 of slack between evictions) while it goes.
    fn mark(
        &mut self,
        regions: &[Region],
        samples: u32,
        flags: &dyn FlagSource,
    ) -> io::Result<(u64, u64, Vec<u64>)> {
        let windows = f64::from(samples);
        let mut bytes = 0;
        let mut units = 0;
        let mut heads = Vec::new();
        let slack = self.max_tracked + self.max_tracked / 8;
        let mut win = FlagWindow::default();
        for r in regions.iter().filter(|r| r.nr_accesses > 0) {
            let p = (r.nr_accesses.min(samples) as f64 / samples as f64) as f32;
            bytes += r.end - r.start;
            let end = r.end.div_ceil(4096);
            let mut pfn = r.start >> 12;
            while pfn < end {
                if !win.holds(pfn) {
                    if (self.stop)() {
                        return Err(io::Error::new(io::ErrorKind::Interrupted, "asked to stop"));
                    }
                    win.read(pfn, end, flags)?;
                    if self.states.len() > slack {
                        self.evict_to(self.max_tracked, windows);
                    }
                }
                let f = win.get(pfn);
                if f & kpageflags::THP != 0
                    && (kpageflags::is_thp_head(f) || kpageflags::is_tail(f))
                {
                    let head = pfn & !(HUGE_FRAMES - 1);
                    let hf = if win.holds(head) {
                        win.get(head)
                    } else {
                        let mut one = [0u64; 1];
                        flags.flags(head, &mut one)?;
                        one[0]
                    };
                    if kpageflags::is_thp_head(hf) {
                        self.record(head, p, kpageflags::page_type(hf), true);
                        heads.push(head);
                        units += 1;
                        pfn = head + HUGE_FRAMES;
                        continue;
                    }
                }
                if kpageflags::is_user_page(f) {
                    self.record(pfn, p, kpageflags::page_type(f), false);
                    units += 1;
                }
                pfn += 1;
            }
        }
        Ok((bytes, units, heads))
    }

    fn record(&mut self, gfn: u64, p: f32, page_type: PageType, huge: bool) {
        let stamp = self.stamp;
        let s = self.states.entry(gfn).or_insert(State {
            share: 0.0,
            observed: 0.0,
            stamp: stamp.wrapping_sub(1),
            page_type,
            huge,
            saturated: false,
        });
        // a unit split across two regions: the higher of their shares
        s.observed = if s.stamp == stamp {
            s.observed.max(p)
        } else {
            p
        };
        s.stamp = stamp;
        if s.huge != huge {
            s.huge = huge;
            s.saturated = false;
        }
        if page_type != PageType::Unknown {
            s.page_type = page_type;
        }
    }

    /// Drops the frames with the lowest shares (after this aggregation) until at most `keep`
    /// remain.
    fn evict_to(&mut self, keep: usize, windows: f64) {
        let n = self.states.len();
        if n <= keep {
            return;
        }
        let k = n - keep;
        let stamp = self.stamp;
        let mut v: Vec<(f64, u64)> = self
            .states
            .iter()
            .map(|(&g, s)| (s.next_share(stamp, windows), g))
            .collect();
        v.select_nth_unstable_by(k - 1, |a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        for &(_, g) in &v[..k] {
            self.states.remove(&g);
        }
        self.evicted += k as u64;
    }

    /// The entries to publish: every frame whose rate level is above 0, hottest first (level,
    /// then young in the last aggregation, then frame number).
    pub fn ranked(&self) -> Ranked {
        let w = self.window_s;
        let stamp = self.stamp;
        let mut v: Vec<(u8, bool, u64, &State)> = self
            .states
            .iter()
            .filter_map(|(&g, s)| {
                let level = level_of_rate(rate::frame_rate(s.share as f64, w, s.huge, s.saturated));
                (level > 0).then_some((level, s.stamp == stamp, g, s))
            })
            .collect();
        v.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(b.1.cmp(&a.1)).then(a.2.cmp(&b.2)));
        let hot_frames = v
            .iter()
            .filter(|x| x.0 as u32 >= LEVEL_1HZ)
            .map(|x| if x.3.huge { HUGE_FRAMES } else { 1 })
            .sum();
        let entries = v
            .iter()
            .map(|&(level, young, g, s)| {
                // DAMON does not tell writes: the write bit is always 0
                HintEntry::new(Gfn(g), level as u32, false, s.page_type, s.huge, young)
            })
            .collect();
        Ranked {
            entries,
            hot_frames,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kpageflags::*;
    use std::collections::BTreeMap;
    use vtism_proto::count::rate_hz;

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
        for p in 2000..3000 {
            m.insert(p, ANON | LRU);
        }
        m
    }

    fn by_gfn(r: &Ranked) -> BTreeMap<u64, HintEntry> {
        r.entries.iter().map(|e| (e.gfn().0, *e)).collect()
    }

    #[test]
    fn types_thp_and_free_frames() {
        let f = flags();
        let mut fr = Frames::new(0.1, 1 << 20);
        // the region starts mid-THP: the unit is reported once, at its head
        for _ in 0..40 {
            fr.observe(
                &[
                    region(100, 20, 10),
                    region(1300, 300, 20),
                    region(5000, 10, 0),
                ],
                20,
                &f,
            )
            .unwrap();
        }
        let r = fr.ranked();
        let by = by_gfn(&r);
        assert_eq!(by.len(), 13, "{by:?}");
        assert_eq!(by[&100].page_type(), PageType::Anon);
        assert_eq!(by[&110].page_type(), PageType::File);
        assert_eq!(by[&111].page_type(), PageType::Shmem);
        assert!(!by.contains_key(&112) && !by.contains_key(&113));
        assert!(by[&1024].huge());
        assert!(by.values().all(|e| !e.write() && e.young()));
        // young in every window: saturated, the 4 KiB rate of the share (ln 256 / 100 ms)
        let top = rate::rate_of_share(rate::SHARE_MAX, 0.1);
        assert_eq!(by[&1024].count(), level_of_rate(top));
        // half the windows of 100 ms: 6.9 Hz
        assert_eq!(by[&100].count(), level_of_rate(2f64.ln() / 0.1));
        // hottest first, and hot_frames counts 4 KiB frames at 1 Hz or more
        assert_eq!(r.entries[0].gfn().0, 1024);
        assert_eq!(r.hot_frames, 12 + 512);
    }

    #[test]
    fn rates_follow_the_share_and_decay() {
        let f = flags();
        let mut fr = Frames::new(0.05, 1 << 20);
        // frames 2000..2100 young in 40% of 50 ms windows: 10.2 Hz; 2100..2400 in 2.5%: 0.5 Hz
        for _ in 0..30 {
            fr.observe(&[region(2000, 100, 8), region(2100, 300, 0)], 20, &f)
                .unwrap();
            fr.observe(&[region(2000, 100, 8), region(2100, 300, 1)], 20, &f)
                .unwrap();
        }
        let by = by_gfn(&fr.ranked());
        let hz = |g: u64| rate_hz(by[&g].count());
        assert!((hz(2000) / 10.2 - 1.0).abs() < 0.1, "{}", hz(2000));
        // 1 sample in 20 every other aggregation (0.5 Hz on average); the last aggregation
        // weighs 27% (20 windows at 1/64), and it was the one with the sample
        assert!(hz(2200) > 0.35 && hz(2200) < 0.75, "{}", hz(2200));
        assert!(hz(2000) > 10.0 * hz(2200));
        // nothing for a while: dropped once below level 0
        for _ in 0..40 {
            fr.observe(&[], 20, &f).unwrap();
        }
        assert_eq!(fr.tracked(), 0);
        assert!(fr.ranked().entries.is_empty());
    }

    #[test]
    fn a_new_window_keeps_the_rates() {
        let f = flags();
        let mut fr = Frames::new(0.05, 1 << 20);
        for _ in 0..40 {
            fr.observe(&[region(2000, 10, 8)], 20, &f).unwrap();
        }
        let before = fr.ranked().entries[0].count();
        fr.set_window(0.4);
        assert!(fr.share(2000) > 0.9);
        let after = fr.ranked().entries[0].count();
        assert!(before.abs_diff(after) <= 1, "{before} {after}");
    }

    #[test]
    fn thp_unit_rate_is_per_frame_until_saturated() {
        let f = flags();
        let mut fr = Frames::new(0.005, 1 << 20);
        for _ in 0..30 {
            fr.observe(&[region(1024, 512, 6), region(2000, 1, 6)], 20, &f)
                .unwrap();
        }
        let by = by_gfn(&fr.ranked());
        // the same share of 5 ms windows: 71 Hz for the unit, 0.14 Hz per frame of it
        let unit = rate_hz(by[&1024].count());
        let page = rate_hz(by[&2000].count());
        assert!((page / unit / 512.0 - 1.0).abs() < 0.05, "{unit} {page}");
    }

    #[test]
    fn memory_is_bounded_coldest_evicted_first() {
        let f = flags();
        let mut fr = Frames::new(0.1, 10);
        for _ in 0..5 {
            fr.observe(&[region(2000, 5, 20)], 20, &f).unwrap();
        }
        assert_eq!((fr.tracked(), fr.evicted()), (5, 0));
        // 500 frames at 1 sample in 20: the map stays at 10 and the hot ones stay
        let o = fr
            .observe(&[region(2000, 5, 20), region(2100, 500, 1)], 20, &f)
            .unwrap();
        assert_eq!(fr.tracked(), 10);
        assert_eq!(o.evicted, 495);
        assert_eq!(o.units, 505);
        for g in 2000..2005 {
            assert!(fr.share(g) > 0.5, "frame {g}");
        }
        assert!(fr.ranked().entries.len() <= 10);
    }

    /// Counts the frames whose flags were asked for.
    struct Counting<'a>(&'a BTreeMap<u64, u64>, std::cell::Cell<u64>);

    impl FlagSource for Counting<'_> {
        fn flags(&self, first: u64, out: &mut [u64]) -> io::Result<()> {
            self.1.set(self.1.get() + out.len() as u64);
            self.0.flags(first, out)
        }
    }

    #[test]
    fn flags_are_read_for_the_regions_frames_only() {
        let mut f = flags();
        for p in 4000..20_000 {
            f.insert(p, ANON | LRU);
        }
        let counting = Counting(&f, Default::default());
        // 1,000 small regions as DAMON keeps them, every one accessed, a THP among them
        let mut regions: Vec<Region> = (0..1000).map(|i| region(4000 + 16 * i, 8, 5)).collect();
        regions.insert(0, region(1100, 100, 5));
        let mut fr = Frames::new(0.1, 1 << 20);
        let o = fr.observe(&regions, 20, &counting).unwrap();
        assert_eq!(o.units, 1 + 8000);
        // the regions' 8,100 frames and the THP's head, not a chunk of 4,096 per region
        assert_eq!(counting.1.get(), 8000 + 100 + 1);
        // a region inside frames already read reads nothing more
        counting.1.set(0);
        fr.observe(&[region(2000, 100, 5), region(2050, 10, 5)], 20, &counting)
            .unwrap();
        assert_eq!(counting.1.get(), 100);
    }

    static STOP_ASKED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

    #[test]
    fn a_stop_abandons_the_aggregation() {
        let f = flags();
        let mut fr = Frames::new(0.1, 1 << 20);
        fr.observe(&[region(2000, 100, 10)], 20, &f).unwrap();
        let before = fr.share(2000);
        fr.set_stop(|| STOP_ASKED.load(std::sync::atomic::Ordering::SeqCst));
        STOP_ASKED.store(true, std::sync::atomic::Ordering::SeqCst);
        let e = fr.observe(&[region(2000, 100, 20)], 20, &f).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::Interrupted);
        assert_eq!(fr.share(2000), before);
    }

    #[test]
    fn entries_are_valid_for_the_writer() {
        let f = flags();
        let mut fr = Frames::new(0.1, 1 << 20);
        fr.observe(&[region(0, 3000, 20)], 20, &f).unwrap();
        let r = fr.ranked();
        let mut w = vtism_proto::ChannelWriter::init(
            vtism_proto::OwnedRegion::zeroed(64 * 1024),
            vtism_proto::Tracker::Damon,
        )
        .unwrap();
        let p = w.publish(&r.entries, &Default::default()).unwrap();
        assert_eq!(p.count, r.entries.len() as u64);
        assert!(p.count > 1000);
    }
}
