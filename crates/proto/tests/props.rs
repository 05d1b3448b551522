//! Property tests: writer -> reader roundtrip, truncation and budget rules, and that no bytes at all
//! can make the reader panic or accept something the spec forbids.

use proptest::prelude::*;
use vtism_proto::layout::off;
use vtism_proto::*;

/// 1-3 sorted ranges with gaps (possibly 0: adjacent ranges).
fn ram_map() -> impl Strategy<Value = RamMap> {
    (
        0u64..0x10_0000,
        prop::collection::vec((0u64..0x2000, 1u64..0x4_0000), 1..=3),
    )
        .prop_map(|(base, spans)| {
            let mut at = base;
            let ranges = spans
                .into_iter()
                .map(|(gap, len)| {
                    let r = GfnRange::new(Gfn(at + gap), Gfn(at + gap + len));
                    at = r.end.0;
                    r
                })
                .collect();
            RamMap::new(ranges).unwrap()
        })
}

/// An entry wholly inside `ram`: a frame, or a 2 MiB unit where one fits.
fn entry_in(ram: &RamMap, pick: u64, count: u32, flags: u8) -> HintEntry {
    let ranges = ram.ranges();
    let r = ranges[(pick % ranges.len() as u64) as usize];
    let gfn = r.start.0 + (pick >> 8) % r.frames();
    let t = PageType::from_bits(flags >> 2);
    let huge_head = Gfn(gfn).huge_head();
    if flags & 1 != 0 && ram.contains_frames(huge_head, HUGE_FRAMES) {
        HintEntry::new(huge_head, count, flags & 2 != 0, t, true, flags & 16 != 0)
    } else {
        HintEntry::new(Gfn(gfn), count, flags & 2 != 0, t, false, flags & 16 != 0)
    }
}

fn arb_report() -> impl Strategy<Value = TrackerReport> {
    (
        any::<u32>(),
        any::<u32>(),
        any::<u32>(),
        any::<u32>(),
        any::<u64>(),
    )
        .prop_map(|(w, c, n, cpu, f)| TrackerReport {
            window: Micros(w),
            coarse_window: Micros(c),
            windows: n,
            tracker_cpu: Micros(cpu),
            tracked_frames: f,
        })
}

fn arb_meta() -> impl Strategy<Value = RoundMeta> {
    (
        any::<bool>(),
        any::<u32>(),
        any::<u32>(),
        any::<u64>(),
        any::<u64>(),
        any::<u64>(),
        arb_report(),
    )
        .prop_map(|(o, i, d, t, h, p, r)| RoundMeta {
            overflow: o,
            scan_interval_ms: i,
            scan_duration_us: d,
            tracked_bytes: t,
            hot_frames: h,
            publish_time_ns: p,
            tracker_report: r,
        })
}

/// The reserved guest-header bytes of a v1.0 and a v1.1 writer, written out here from
/// docs/channel.md rather than taken from the crate: `(offset, len)`; `flags` apart.
fn reserved_spans(minor: u16) -> Option<&'static [(usize, usize)]> {
    match minor {
        0 => Some(&[(0x030, 16), (0x064, 4), (0x080, 0x780)]),
        1 => Some(&[(0x030, 16), (0x08C, 4), (0x098, 0x768)]),
        _ => None,
    }
}

/// The spec's promise about the header of an accepted round, checked on the (static) region.
fn assert_header_valid(region: &OwnedRegion, round: &HintRound) {
    let bytes = region.to_bytes();
    let minor = u16::from_le_bytes([bytes[0x0a], bytes[0x0b]]);
    assert_eq!(minor, round.version_minor);
    assert_eq!(round.counts(), CountMeaning::for_minor(minor));
    assert_eq!(round.tracker_report.is_some(), minor >= 1);
    if let Some(spans) = reserved_spans(minor) {
        for &(o, n) in spans {
            assert!(
                bytes[o..o + n].iter().all(|&b| b == 0),
                "reserved {o:#x} set"
            );
        }
        assert_eq!(
            round.flags & !1,
            0,
            "unknown flag accepted from a v1.{minor} writer"
        );
    }
}

/// What the spec promises about anything the reader accepts.
fn assert_valid(round: &HintRound, ram: &RamMap) {
    assert_ne!(round.round, 0);
    for e in &round.entries {
        assert_eq!(e.reserved_bits(), 0);
        assert!(ram.contains_frames(e.gfn(), e.frames()), "{e:?}");
        assert!(!e.huge() || e.gfn().is_huge_aligned(), "{e:?}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn writer_reader_roundtrip(
        ram in ram_map(),
        raw in prop::collection::vec((any::<u64>(), any::<u32>(), any::<u8>()), 0..300),
        cap in 1usize..256,
        budget in prop::option::of(0u64..300),
        metas in prop::collection::vec(arb_meta(), 1..4),
        tracker in any::<u32>(),
        old_guest in any::<bool>(),
    ) {
        let entries: Vec<HintEntry> = raw.iter().map(|&(p, c, f)| entry_in(&ram, p, c, f)).collect();
        let region = OwnedRegion::zeroed(4096 + cap * 8);
        if let Some(b) = budget {
            write_feedback(&region, &Feedback { entry_budget: b, ..Feedback::default() }).unwrap();
        }
        let version = if old_guest { ChannelVersion::V1_0 } else { ChannelVersion::V1_1 };
        let cfg = WriterConfig { tracker: Tracker::from_raw(tracker), preserve_feedback: true, version, ..WriterConfig::default() };
        let mut w = ChannelWriter::init_with(&region, cfg).unwrap();
        let mut reader = ChannelReader::new();
        for (i, meta) in metas.iter().enumerate() {
            // Each round publishes a different prefix, so stale entries stay behind in the array.
            let these = &entries[..entries.len() * (i + 1) / metas.len()];
            let p = w.publish(these, meta).unwrap();
            let round = reader.read(&region, &ram).unwrap().expect("a new round");
            assert_valid(&round, &ram);
            assert_header_valid(&region, &round);
            prop_assert_eq!(round.version_minor, version.minor());
            prop_assert_eq!(round.counts(), version.counts());
            prop_assert_eq!(round.tracker_report, (!old_guest).then_some(meta.tracker_report));
            let limit = match budget { Some(b) if b > 0 => (b as usize).min(cap), _ => cap };
            let kept = these.len().min(limit);
            prop_assert_eq!(&round.entries[..], &these[..kept]);
            prop_assert_eq!(p.count as usize, kept);
            prop_assert_eq!(round.overflow(), meta.overflow || kept < these.len());
            prop_assert_eq!(round.round, i as u64 + 1);
            prop_assert_eq!(round.tracker, Tracker::from_raw(tracker));
            prop_assert_eq!(
                (round.scan_interval_ms, round.scan_duration_us, round.tracked_bytes, round.hot_frames, round.publish_time_ns),
                (meta.scan_interval_ms, meta.scan_duration_us, meta.tracked_bytes, meta.hot_frames, meta.publish_time_ns)
            );
            prop_assert_eq!(reader.read(&region, &ram), Ok(None));
            reader.recycle(round);
        }
    }

    #[test]
    fn truncation_keeps_the_hottest_prefix(
        n in 0usize..600,
        cap in 1usize..300,
        budget in 0u64..400,
        guest_overflow in any::<bool>(),
    ) {
        let entries: Vec<HintEntry> = (0..n as u64).map(|g| HintEntry::new(Gfn(g), 1, false, PageType::Anon, false, true)).collect();
        let region = OwnedRegion::zeroed(4096 + cap * 8);
        write_feedback(&region, &Feedback { entry_budget: budget, ..Feedback::default() }).unwrap();
        let cfg = WriterConfig { preserve_feedback: true, ..WriterConfig::default() };
        let mut w = ChannelWriter::init_with(&region, cfg).unwrap();
        let p = w.publish(&entries, &RoundMeta { overflow: guest_overflow, ..RoundMeta::default() }).unwrap();
        // Budget 0 = no limit; a budget above capacity is clamped to it.
        let limit = if budget == 0 { cap } else { (budget as usize).min(cap) };
        prop_assert_eq!(w.entry_limit() as usize, limit);
        prop_assert_eq!(p.count as usize, n.min(limit));
        prop_assert_eq!(p.truncated, n > limit);
        prop_assert_eq!(p.overflow, guest_overflow || n > limit);
        let round = ChannelReader::new().read(&region, &RamMap::contiguous(1 << 20)).unwrap().unwrap();
        prop_assert_eq!(&round.entries[..], &entries[..n.min(limit)]);
    }

    /// Any bytes at all: a typed verdict, never a panic, never an invalid round.
    #[test]
    fn arbitrary_region_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..12_288), ram in ram_map()) {
        let region = OwnedRegion::from_bytes(&bytes);
        let mut reader = ChannelReader::new();
        match reader.read(&region, &ram) {
            Ok(Some(round)) => {
                assert_valid(&round, &ram);
                assert_header_valid(&region, &round);
            }
            Ok(None) => {}
            Err(e) => prop_assert!((1..=12).contains(&e.code()) && e.code() != 8),
        }
    }

    /// A valid channel with hostile words poked anywhere in the header page or the entries: the
    /// reader still only accepts rounds the spec allows.
    #[test]
    fn poked_channel_never_yields_invalid_rounds(
        ram in ram_map(),
        raw in prop::collection::vec((any::<u64>(), any::<u32>(), any::<u8>()), 1..64),
        pokes in prop::collection::vec((0usize..(4096 + 64 * 8) / 8, any::<u64>(), any::<bool>()), 1..6),
        old_guest in any::<bool>(),
        meta in arb_meta(),
    ) {
        let entries: Vec<HintEntry> = raw.iter().map(|&(p, c, f)| entry_in(&ram, p, c, f)).collect();
        let region = OwnedRegion::zeroed(4096 + 64 * 8);
        let version = if old_guest { ChannelVersion::V1_0 } else { ChannelVersion::V1_1 };
        let cfg = WriterConfig { tracker: Tracker::Harness, version, ..WriterConfig::default() };
        let mut w = ChannelWriter::init_with(&region, cfg).unwrap();
        w.publish(&entries, &meta).unwrap();
        for &(word, value, small) in &pokes {
            // Small values hit the interesting boundaries (counts, offsets, versions) more often.
            let v = if small { value % 0x2000 } else { value };
            region.store_u64(word * 8, v).unwrap();
        }
        let seq_odd = region.load_u64(off::SEQ).unwrap() & 1 == 1;
        match ChannelReader::new().read(&region, &ram) {
            Ok(Some(round)) => {
                assert_valid(&round, &ram);
                assert_header_valid(&region, &round);
                prop_assert!(!seq_odd);
            }
            Ok(None) => {}
            Err(e) => {
                prop_assert_ne!(e.code(), 8);
                prop_assert_eq!(e.code() == 7, seq_odd);
            }
        }
    }
}
