//! Feeds arbitrary bytes to the channel reader as a region, with a RAM map derived from the input.
//!
//! Three shapes of region, chosen by the first byte, so the fuzzer reaches deep validation as well
//! as raw garbage:
//! 0. the input bytes are the region;
//! 1. a region a writer initialised and published into, then poked by the input;
//! 2. raw bytes that the "guest" keeps changing while the reader loads from them.
//!
//! Whatever the reader accepts is re-checked here against the spec, independently of the reader.
use std::cell::Cell;
use vtism_proto::layout::ENTRIES_OFFSET;
use vtism_proto::{
    AccessError, ChannelReader, ChannelVersion, ChannelWriter, CountMeaning, Gfn, GfnRange,
    HintEntry, HintRound, Micros, OwnedRegion, RamMap, RoundMeta, SharedRegion, Tracker,
    TrackerReport, WriterConfig, HUGE_FRAMES,
};

/// Reads little-endian integers off the input, yielding zeros once it runs out.
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn bytes<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        let n = N.min(self.0.len());
        out[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        out
    }
    fn u8(&mut self) -> u8 {
        self.bytes::<1>()[0]
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.bytes())
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.bytes())
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.bytes())
    }
}

/// 1-10 sorted ranges (the reader's fast path handles up to 8 runs); gaps of 0 make adjacent
/// ranges.
fn ram_map(inp: &mut Input) -> RamMap {
    let n = 1 + inp.u8() % 10;
    let mut ranges = Vec::new();
    let mut at = u64::from(inp.u32() & 0xf_ffff);
    for _ in 0..n {
        let gap = u64::from(inp.u16() % 4) * u64::from(inp.u16());
        let len = 1 + u64::from(inp.u32() & 0x3_ffff);
        let start = at + gap;
        ranges.push(GfnRange::new(Gfn(start), Gfn(start + len)));
        at = start + len;
    }
    RamMap::new(ranges).expect("sorted, non-empty ranges")
}

/// A gfn the map is likely to contain, or a raw one.
fn pick_gfn(inp: &mut Input, ram: &RamMap) -> u64 {
    let sel = inp.u8();
    let raw = inp.u64();
    let ranges = ram.ranges();
    match ranges.get(usize::from(sel) % (ranges.len() + 1)) {
        Some(r) if sel & 0x80 == 0 => {
            let g = r.start.0 + raw % r.frames().max(1);
            if sel & 0x40 != 0 {
                g & !(HUGE_FRAMES - 1)
            } else {
                g
            }
        }
        _ => raw,
    }
}

/// A region whose contents change as it is read: one scripted store before every load.
struct Mutating {
    inner: OwnedRegion,
    script: Vec<(usize, u64)>,
    next: Cell<usize>,
}

impl Mutating {
    fn step(&self) {
        let i = self.next.get();
        if let Some(&(o, v)) = self.script.get(i) {
            let _ = self.inner.store_u64(o, v);
            self.next.set(i + 1);
        }
    }
}

impl SharedRegion for Mutating {
    fn len(&self) -> usize {
        self.inner.len()
    }
    fn load_u64(&self, o: usize) -> Result<u64, AccessError> {
        self.step();
        self.inner.load_u64(o)
    }
    fn load_u64_acquire(&self, o: usize) -> Result<u64, AccessError> {
        self.step();
        self.inner.load_u64_acquire(o)
    }
    fn load_u32(&self, o: usize) -> Result<u32, AccessError> {
        self.step();
        self.inner.load_u32(o)
    }
    fn load_u32_acquire(&self, o: usize) -> Result<u32, AccessError> {
        self.step();
        self.inner.load_u32_acquire(o)
    }
    fn store_u64(&self, o: usize, v: u64) -> Result<(), AccessError> {
        self.inner.store_u64(o, v)
    }
    fn store_u64_release(&self, o: usize, v: u64) -> Result<(), AccessError> {
        self.inner.store_u64_release(o, v)
    }
    fn store_u32(&self, o: usize, v: u32) -> Result<(), AccessError> {
        self.inner.store_u32(o, v)
    }
    fn copy_words(&self, o: usize, out: &mut [u64]) -> Result<(), AccessError> {
        self.step();
        self.inner.copy_words(o, out)
    }
    fn store_words(&self, o: usize, w: &[u64]) -> Result<(), AccessError> {
        self.inner.store_words(o, w)
    }
}

/// What the spec promises about an accepted round, checked without the reader's code.
fn check_round<R: SharedRegion>(
    region: &R,
    ram: &RamMap,
    res: &Result<Option<vtism_proto::HintRound>, vtism_proto::ChannelError>,
) {
    match res {
        Ok(Some(round)) => {
            assert!(round.round != 0, "round 0 is never taken");
            assert_eq!(round.seq % 2, 0, "taken under an odd seq");
            assert!(
                round.entries.len() * 8 + ENTRIES_OFFSET as usize <= region.len(),
                "more entries than fit"
            );
            for e in &round.entries {
                assert_eq!(e.reserved_bits(), 0, "reserved bits accepted: {e:?}");
                assert!(
                    ram.contains_frames(e.gfn(), e.frames()),
                    "non-RAM frame accepted: {e:?}"
                );
                assert!(
                    !e.huge() || e.gfn().is_huge_aligned(),
                    "misaligned unit accepted: {e:?}"
                );
            }
            if round.version_minor <= 1 {
                assert_eq!(
                    round.flags & !1,
                    0,
                    "unknown flag accepted from a v1.{} writer",
                    round.version_minor
                );
            }
            assert_eq!(round.counts(), CountMeaning::for_minor(round.version_minor));
            assert_eq!(
                round.tracker_report.is_some(),
                round.version_minor >= 1,
                "tracker report and version disagree"
            );
        }
        Ok(None) => {}
        Err(e) => {
            assert!((1..=12).contains(&e.code()));
            assert!(!e.label().is_empty());
            assert!(!e.to_string().is_empty());
        }
    }
}

/// Reserved guest-header bytes of a v1.0 and a v1.1 writer, `[start, end)`, written out from
/// docs/channel.md (flags apart); `None` for newer minors, whose use of them is ignored.
fn reserved_spans(minor: u16) -> Option<&'static [(usize, usize)]> {
    match minor {
        0 => Some(&[(0x030, 0x040), (0x064, 0x068), (0x080, 0x800)]),
        1 => Some(&[(0x030, 0x040), (0x08C, 0x090), (0x098, 0x800)]),
        _ => None,
    }
}

/// On a region nobody writes, an accepted round's header is as the spec says, byte for byte.
fn check_header<R: SharedRegion>(region: &R, round: &HintRound) {
    let u32_at = |o: usize| region.load_u32(o).expect("header is mapped");
    let u64_at = |o: usize| region.load_u64(o).expect("header is mapped");
    let minor = (u32_at(0x008) >> 16) as u16;
    assert_eq!(minor, round.version_minor);
    if let Some(spans) = reserved_spans(minor) {
        for &(start, end) in spans {
            for o in (start..end).step_by(4) {
                assert_eq!(
                    u32_at(o),
                    0,
                    "reserved header bytes at {o:#x} accepted from a v1.{minor} writer"
                );
            }
        }
    }
    if minor >= 1 {
        let want = TrackerReport {
            window: Micros(u32_at(0x064)),
            windows: u32_at(0x080),
            tracker_cpu: Micros(u32_at(0x084)),
            coarse_window: Micros(u32_at(0x088)),
            tracked_frames: u64_at(0x090),
        };
        assert_eq!(round.tracker_report, Some(want));
    }
}

fn read_static<R: SharedRegion>(region: &R, ram: &RamMap) {
    let mut reader = ChannelReader::new();
    let first = reader.read(region, ram);
    check_round(region, ram, &first);
    if let Ok(Some(round)) = &first {
        check_header(region, round);
    }
    if let Err(e) = &first {
        assert_ne!(e.code(), 8, "a region nobody writes cannot tear");
    }
    // Deterministic: a fresh reader decides the same; the same reader finds nothing new.
    assert_eq!(ChannelReader::new().read(region, ram), first);
    let again = reader.read(region, ram);
    match &first {
        Ok(Some(_)) => assert_eq!(again, Ok(None)),
        other => assert_eq!(&again, other),
    }
}

/// One input.
pub fn run(data: &[u8]) {
    let mut inp = Input(data);
    let mode = inp.u8() % 3;
    let ram = ram_map(&mut inp);
    match mode {
        0 => read_static(&OwnedRegion::from_bytes(inp.0), &ram),
        1 => {
            let cap = u64::from(inp.u16() % 1024) + 1;
            let region =
                OwnedRegion::zeroed(4096 + 8 * cap as usize + 8 * usize::from(inp.u8() % 4));
            let flags = inp.u8();
            let cfg = WriterConfig {
                tracker: Tracker::from_raw(u32::from(inp.u8())),
                version: if flags & 1 == 0 {
                    ChannelVersion::V1_1
                } else {
                    ChannelVersion::V1_0
                },
                ..WriterConfig::default()
            };
            let Ok(mut w) = ChannelWriter::init_with(&region, cfg) else {
                return;
            };
            for _ in 0..1 + inp.u8() % 3 {
                let n = usize::from(inp.u16()) % (cap as usize + 8);
                let entries: Vec<HintEntry> = (0..n)
                    .map(|_| {
                        let bits = inp.u64() & !0xff_ffff_ffff & ((1 << 53) - 1);
                        let e = HintEntry(bits | (pick_gfn(&mut inp, &ram) & 0xff_ffff_ffff));
                        if e.huge() && !e.gfn().is_huge_aligned() {
                            HintEntry(e.0 & !(HUGE_FRAMES - 1))
                        } else {
                            e
                        }
                    })
                    .collect();
                let overflow = inp.u8() & 1 != 0;
                let hot_frames = inp.u64();
                let tracker_report = TrackerReport {
                    window: Micros(inp.u32()),
                    coarse_window: Micros(inp.u32()),
                    windows: inp.u32(),
                    tracker_cpu: Micros(inp.u32()),
                    tracked_frames: inp.u64(),
                };
                let meta = RoundMeta {
                    overflow,
                    hot_frames,
                    tracker_report,
                    ..RoundMeta::default()
                };
                w.publish(&entries, &meta)
                    .expect("writer accepts valid entries");
            }
            // Then the hostile guest pokes: header words or entry words.
            for _ in 0..inp.u8() % 8 {
                let o = (usize::from(inp.u16()) * 8) % region.len();
                let v = if inp.u8() & 1 == 0 {
                    inp.u64()
                } else {
                    pick_gfn(&mut inp, &ram)
                };
                let _ = region.store_u64(o, v);
            }
            read_static(&region, &ram);
        }
        _ => {
            let len = 4096 + usize::from(inp.u16() % 4096) * 8;
            let mut script = Vec::new();
            for _ in 0..inp.u8() % 16 {
                let o = (usize::from(inp.u16()) * 8) % len;
                script.push((o, inp.u64()));
            }
            let mut bytes = inp.0.to_vec();
            bytes.resize(len, 0);
            let region = Mutating {
                inner: OwnedRegion::from_bytes(&bytes),
                script,
                next: Cell::new(0),
            };
            let mut reader = ChannelReader::new();
            for _ in 0..3 {
                let res = reader.read(&region, &ram);
                check_round(&region, &ram, &res);
            }
        }
    }
}
