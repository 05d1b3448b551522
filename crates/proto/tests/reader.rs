//! Reader and writer behaviour the static vectors cannot show: torn rounds, concurrency,
//! feedback, counters and buffer reuse.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use vtism_proto::layout::{self, off};
use vtism_proto::*;

fn ram() -> RamMap {
    RamMap::new(vec![
        GfnRange::new(Gfn(0), Gfn(0x8_0000)),
        GfnRange::new(Gfn(0x10_0000), Gfn(0x14_0000)),
    ])
    .unwrap()
}

fn entry(gfn: u64) -> HintEntry {
    HintEntry::new(Gfn(gfn), 3, gfn % 2 == 0, PageType::Anon, false, true)
}

fn channel(len: usize) -> ChannelWriter<OwnedRegion> {
    ChannelWriter::init(OwnedRegion::zeroed(len), Tracker::Harness).unwrap()
}

#[test]
fn publish_then_read_roundtrips_every_field() {
    let mut w = channel(16384);
    let entries = vec![
        entry(1),
        entry(0x7_ffff),
        HintEntry::new(Gfn(0x10_0200), 255, true, PageType::Shmem, true, false),
    ];
    let meta = RoundMeta {
        overflow: false,
        scan_interval_ms: 250,
        scan_duration_us: 1234,
        tracked_bytes: 1 << 30,
        hot_frames: 515,
        publish_time_ns: 987_654_321,
        tracker_report: TrackerReport {
            window: Micros(100_000),
            coarse_window: Micros(800),
            windows: 41,
            tracker_cpu: Micros(9_500),
            tracked_frames: 1 << 18,
        },
    };
    let p = w.publish(&entries, &meta).unwrap();
    assert_eq!(
        p,
        Published {
            round: 1,
            count: 3,
            truncated: false,
            overflow: false
        }
    );
    let mut r = ChannelReader::new();
    let round = r.read(w.region(), &ram()).unwrap().expect("a new round");
    assert_eq!(round.round, 1);
    assert_eq!(round.seq, 4, "init leaves seq 2, one publish adds 2");
    assert_eq!(round.tracker, Tracker::Harness);
    assert_eq!(round.version_minor, 1);
    assert_eq!(round.counts(), CountMeaning::RateLevel);
    assert_eq!(round.tracker_report, Some(meta.tracker_report));
    assert!(!round.overflow());
    assert_eq!(
        (
            round.scan_interval_ms,
            round.scan_duration_us,
            round.tracked_bytes,
            round.hot_frames,
            round.publish_time_ns
        ),
        (250, 1234, 1 << 30, 515, 987_654_321)
    );
    assert_eq!(round.entries, entries);
    // Same round again: nothing new, and counted as such.
    assert_eq!(r.read(w.region(), &ram()), Ok(None));
    assert_eq!(r.counters().accepted(), 1);
    assert_eq!(r.counters().no_new_round(), 1);
    assert_eq!(r.counters().total_rejected(), 0);
    assert_eq!(r.last_round(), 1);
}

#[test]
fn fresh_channel_has_nothing_to_read() {
    let w = channel(8192);
    let mut r = ChannelReader::new();
    assert_eq!(r.read(w.region(), &ram()), Ok(None));
}

#[test]
fn stale_entries_past_count_are_not_read() {
    let mut w = channel(8192);
    w.publish(&[entry(1), entry(2), entry(3)], &RoundMeta::default())
        .unwrap();
    w.publish(&[entry(9)], &RoundMeta::default()).unwrap();
    // Garbage where round 1's third entry was: outside count, so harmless.
    w.region()
        .store_u64(layout::ENTRIES_OFFSET as usize + 16, u64::MAX)
        .unwrap();
    let round = ChannelReader::new()
        .read(w.region(), &ram())
        .unwrap()
        .unwrap();
    assert_eq!(round.round, 2);
    assert_eq!(round.entries, vec![entry(9)]);
}

#[test]
fn rejects_are_counted_by_reason_and_set_last_status() {
    let mut w = channel(8192);
    w.publish(&[entry(1), entry(0x9_0000)], &RoundMeta::default())
        .unwrap();
    let mut r = ChannelReader::new();
    let e = r.read(w.region(), &ram()).unwrap_err();
    assert_eq!(
        e,
        ChannelError::GfnOutOfRange {
            index: 1,
            gfn: Gfn(0x9_0000),
            frames: 1
        }
    );
    assert_eq!(
        (e.code(), e.label(), e.entry_index()),
        (11, "gfn_out_of_range", Some(1))
    );
    assert_eq!(r.last_status(), 11);
    assert_eq!(r.counters().rejected(RejectReason::GfnOutOfRange), 1);
    w.region().store_u64(off::SEQ, 7).unwrap();
    assert!(matches!(
        r.read(w.region(), &ram()),
        Err(ChannelError::WriteInProgress { seq: 7 })
    ));
    assert_eq!(r.last_status(), 7);
    assert_eq!(r.counters().total_rejected(), 2);
    let by_reason: Vec<_> = r
        .counters()
        .iter_rejected()
        .filter(|&(_, n)| n > 0)
        .collect();
    assert_eq!(
        by_reason,
        vec![
            (RejectReason::WriteInProgress, 1),
            (RejectReason::GfnOutOfRange, 1)
        ]
    );
    assert_eq!(r.last_round(), 0, "nothing was taken");
}

#[test]
fn codes_and_labels_are_stable_and_distinct() {
    let labels: Vec<_> = RejectReason::ALL.iter().map(|r| r.label()).collect();
    let mut uniq = labels.clone();
    uniq.sort();
    uniq.dedup();
    assert_eq!(uniq.len(), 12);
    for (i, r) in RejectReason::ALL.iter().enumerate() {
        assert_eq!(r.code() as usize, i + 1);
        assert_eq!(RejectReason::from_code(r.code()), Some(*r));
    }
    assert_eq!(RejectReason::from_code(0), None);
    assert_eq!(RejectReason::from_code(13), None);
}

#[test]
fn hostile_capacity_cannot_make_the_reader_allocate() {
    let w = channel(8192);
    // A header claiming 2^40 entries in a region that declares itself huge: rejected on the
    // mapped size before any allocation.
    w.region().store_u64(off::REGION_SIZE, 1 << 45).unwrap();
    w.region().store_u64(off::CAPACITY, 1 << 40).unwrap();
    w.region().store_u64(off::COUNT, 1 << 40).unwrap();
    w.region().store_u64(off::ROUND, 1).unwrap();
    let e = ChannelReader::new().read(w.region(), &ram()).unwrap_err();
    assert_eq!(
        e,
        ChannelError::RegionTooSmall {
            mapped: 8192,
            needed: 1 << 45
        }
    );
}

/// A region whose `seq` reads differently on each load: the guest republishing mid-copy.
struct ChangingSeq<R> {
    inner: R,
    loads: Cell<u64>,
    values: Vec<u64>,
}

impl<R: SharedRegion> SharedRegion for ChangingSeq<R> {
    fn len(&self) -> usize {
        self.inner.len()
    }
    fn load_u64(&self, o: usize) -> Result<u64, AccessError> {
        if o == off::SEQ {
            let n = self.loads.get();
            self.loads.set(n + 1);
            return Ok(self.values.get(n as usize).copied().unwrap_or(u64::MAX));
        }
        self.inner.load_u64(o)
    }
    fn load_u64_acquire(&self, o: usize) -> Result<u64, AccessError> {
        self.load_u64(o)
    }
    fn load_u32(&self, o: usize) -> Result<u32, AccessError> {
        self.inner.load_u32(o)
    }
    fn load_u32_acquire(&self, o: usize) -> Result<u32, AccessError> {
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
        self.inner.copy_words(o, out)
    }
    fn store_words(&self, o: usize, w: &[u64]) -> Result<(), AccessError> {
        self.inner.store_words(o, w)
    }
}

#[test]
fn seq_change_during_copy_is_a_torn_round() {
    let mut w = channel(8192);
    w.publish(&[entry(1)], &RoundMeta::default()).unwrap();
    let region = ChangingSeq {
        inner: w.into_inner(),
        loads: Cell::new(0),
        values: vec![4, 6],
    };
    let mut r = ChannelReader::new();
    assert_eq!(
        r.read(&region, &ram()),
        Err(ChannelError::TornRound {
            before: 4,
            after: 6
        })
    );
    assert_eq!(r.counters().rejected(RejectReason::TornRound), 1);
    // Stable again: the same round is taken.
    let region = ChangingSeq {
        values: vec![4, 4],
        loads: Cell::new(0),
        ..region
    };
    assert_eq!(
        r.read(&region, &ram()).unwrap().unwrap().entries,
        vec![entry(1)]
    );
}

#[test]
fn header_garbage_seen_during_a_rewrite_is_reported_as_torn() {
    let w = channel(8192);
    // The guest is re-initialising: magic is cleared, and seq moved on while we copied.
    w.region().store_u64(off::MAGIC, 0).unwrap();
    let region = ChangingSeq {
        inner: w.into_inner(),
        loads: Cell::new(0),
        values: vec![2, 3],
    };
    assert_eq!(
        ChannelReader::new().read(&region, &ram()),
        Err(ChannelError::TornRound {
            before: 2,
            after: 3
        })
    );
    // The same garbage with a stable seq is what it is.
    let region = ChangingSeq {
        values: vec![2, 2],
        loads: Cell::new(0),
        ..region
    };
    assert_eq!(
        ChannelReader::new().read(&region, &ram()),
        Err(ChannelError::BadMagic { found: 0 })
    );
}

/// A real writer thread publishing as fast as it can while the reader polls: every round the
/// reader accepts must be exactly what was published under that round number.
#[test]
fn concurrent_reader_never_sees_a_mixed_round() {
    fn round_entries(round: u64) -> Vec<HintEntry> {
        let n = (round % 97) as usize + 1;
        (0..n as u64)
            .map(|i| entry((round * 131 + i) % 0x8_0000))
            .collect()
    }
    let region = Arc::new(OwnedRegion::zeroed(8192));
    let mut w = ChannelWriter::init(Arc::clone(&region), Tracker::Harness).unwrap();
    const ROUNDS: u64 = 5_000;
    let done = Arc::new(AtomicBool::new(false));
    let writer = {
        let done = Arc::clone(&done);
        std::thread::spawn(move || {
            for round in 1..=ROUNDS {
                let meta = RoundMeta {
                    hot_frames: round,
                    ..RoundMeta::default()
                };
                w.publish(&round_entries(round), &meta).unwrap();
                if round % 8 == 0 {
                    std::thread::yield_now();
                }
            }
            done.store(true, Ordering::Release);
        })
    };
    let mut r = ChannelReader::new();
    let ram = ram();
    let check = |round: &HintRound| {
        assert_eq!(round.hot_frames, round.round, "metadata from another round");
        assert_eq!(
            round.entries,
            round_entries(round.round),
            "entries from another round"
        );
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !done.load(Ordering::Acquire) && std::time::Instant::now() < deadline {
        if let Ok(Some(round)) = r.read(&*region, &ram) {
            check(&round);
        }
    }
    writer.join().unwrap();
    // The writer is done, so the region is stable and the last round must be taken now.
    if let Some(round) = r.read(&*region, &ram).unwrap() {
        check(&round);
    }
    assert_eq!(r.last_round(), ROUNDS);
    let c = r.counters();
    // Only the seqlock reasons can occur with an honest writer.
    for (reason, n) in c.iter_rejected() {
        if !matches!(
            reason,
            RejectReason::WriteInProgress | RejectReason::TornRound
        ) {
            assert_eq!(n, 0, "{reason:?}");
        }
    }
}

#[test]
fn feedback_roundtrips_and_limits_the_writer() {
    let region = OwnedRegion::zeroed(8192);
    let fb = Feedback {
        ack_round: 41,
        entry_budget: 2,
        min_interval_ms: 500,
        last_status: 11,
        fast_quota_bytes: 1 << 33,
        rejected_rounds: 3,
        ..Feedback::default()
    };
    write_feedback(&region, &fb).unwrap();
    assert_eq!(region.load_u64(off::HOST_SEQ).unwrap(), 2);
    assert_eq!(read_feedback(&region).unwrap(), Some(fb));
    assert_eq!(fb.host_version, HOST_VERSION);
    // A guest re-attaching keeps the host's advice only when asked to.
    let cfg = WriterConfig {
        tracker: Tracker::Damon,
        preserve_feedback: true,
        ..WriterConfig::default()
    };
    let mut w = ChannelWriter::init_with(&region, cfg).unwrap();
    let p = w
        .publish(&[entry(1), entry(2), entry(3)], &RoundMeta::default())
        .unwrap();
    assert_eq!(
        p,
        Published {
            round: 1,
            count: 2,
            truncated: true,
            overflow: true
        }
    );
    assert_eq!(w.feedback(), Some(fb));
    assert_eq!(w.next_interval_ms(100), 500);
    assert_eq!(w.next_interval_ms(900), 900);
    let round = ChannelReader::new().read(&region, &ram()).unwrap().unwrap();
    assert!(round.overflow());
    assert_eq!(round.entries, vec![entry(1), entry(2)]);
    // The host mid-write: the guest keeps its last consistent copy.
    region.store_u64(off::HOST_SEQ, 3).unwrap();
    assert_eq!(read_feedback(&region).unwrap(), None);
    assert_eq!(w.read_feedback().unwrap(), Some(fb));
    // Without preserve, init clears the host block.
    let w2 = ChannelWriter::init(&region, Tracker::Damon).unwrap();
    assert_eq!(
        read_feedback(w2.region()).unwrap(),
        Some(Feedback {
            host_version: 0,
            ..Feedback::default()
        })
    );
}

#[test]
fn writer_refuses_invalid_entries_and_small_regions() {
    let mut w = channel(8192);
    let bad = HintEntry(entry(1).0 | 1 << 60);
    assert_eq!(
        w.publish(&[entry(1), bad], &RoundMeta::default()),
        Err(WriterError::InvalidEntry {
            index: 1,
            entry: bad
        })
    );
    let misaligned = HintEntry::new(Gfn(513), 1, false, PageType::Anon, true, true);
    assert!(matches!(
        w.publish(&[misaligned], &RoundMeta::default()),
        Err(WriterError::InvalidEntry { index: 0, .. })
    ));
    assert_eq!(
        w.region().load_u64(off::ROUND).unwrap(),
        0,
        "nothing was published"
    );
    assert_eq!(
        ChannelWriter::init(OwnedRegion::zeroed(4096), Tracker::Module).unwrap_err(),
        WriterError::RegionTooSmall { region_size: 4096 }
    );
    let cfg = WriterConfig {
        region_size: Some(16384),
        ..WriterConfig::default()
    };
    assert_eq!(
        ChannelWriter::init_with(OwnedRegion::zeroed(8192), cfg).unwrap_err(),
        WriterError::RegionSizeBeyondMapping {
            region_size: 16384,
            mapped: 8192
        }
    );
}

#[test]
fn recycled_buffer_is_reused() {
    let mut w = channel(16384);
    let entries: Vec<_> = (0..1000).map(entry).collect();
    let mut r = ChannelReader::new();
    w.publish(&entries, &RoundMeta::default()).unwrap();
    let round = r.read(w.region(), &ram()).unwrap().unwrap();
    let ptr = round.entries.as_ptr();
    r.recycle(round);
    w.publish(&entries[..10], &RoundMeta::default()).unwrap();
    let round = r.read(w.region(), &ram()).unwrap().unwrap();
    assert_eq!(round.entries.as_ptr(), ptr);
    assert_eq!(round.entries, entries[..10]);
}

#[test]
fn round_zero_is_never_taken_even_after_other_rounds() {
    let mut w = channel(8192);
    w.publish(&[entry(5)], &RoundMeta::default()).unwrap();
    let mut r = ChannelReader::new();
    assert_eq!(r.read(w.region(), &ram()).unwrap().unwrap().round, 1);
    // A guest rewrites the published round's number to 0 (seq stays even: a stable round).
    w.region().store_u64(layout::off::ROUND, 0).unwrap();
    assert_eq!(r.read(w.region(), &ram()), Ok(None));
    assert_eq!(r.last_round(), 1);
}

#[test]
fn reset_takes_the_current_round_again() {
    let mut w = channel(8192);
    w.publish(&[entry(5)], &RoundMeta::default()).unwrap();
    let mut r = ChannelReader::new();
    assert!(r.read(w.region(), &ram()).unwrap().is_some());
    assert_eq!(r.read(w.region(), &ram()), Ok(None));
    r.reset();
    assert_eq!(r.read(w.region(), &ram()).unwrap().unwrap().round, 1);
}

#[test]
fn mmap_region_reads_what_owned_writer_wrote() {
    let mut backing = vec![0u64; 2048];
    let ptr = std::ptr::NonNull::new(backing.as_mut_ptr().cast::<u8>()).unwrap();
    // SAFETY: `backing` outlives the region and is only accessed through it meanwhile.
    let region = unsafe { MmapRegion::new(ptr, 16384) }.unwrap();
    let mut w = ChannelWriter::init(&region, Tracker::Module).unwrap();
    w.publish(&[entry(7), entry(8)], &RoundMeta::default())
        .unwrap();
    let round = ChannelReader::new().read(&region, &ram()).unwrap().unwrap();
    assert_eq!(round.entries, vec![entry(7), entry(8)]);
    assert_eq!(round.tracker, Tracker::Module);
}

/// A writer configured as an old guest writes v1.0: no tracker report, counts are rounds seen.
#[test]
fn v1_0_writer_leaves_the_v1_1_fields_zero() {
    let cfg = WriterConfig {
        tracker: Tracker::Harness,
        version: ChannelVersion::V1_0,
        ..WriterConfig::default()
    };
    let mut w = ChannelWriter::init_with(OwnedRegion::zeroed(8192), cfg).unwrap();
    assert_eq!(w.version(), ChannelVersion::V1_0);
    let meta = RoundMeta {
        tracker_report: TrackerReport {
            window: Micros(1),
            coarse_window: Micros(2),
            windows: 3,
            tracker_cpu: Micros(4),
            tracked_frames: 5,
        },
        ..RoundMeta::default()
    };
    w.publish(&[entry(1)], &meta).unwrap();
    let bytes = w.region().to_bytes();
    assert!(bytes[0x064..0x068].iter().all(|&b| b == 0));
    assert!(bytes[0x080..0x800].iter().all(|&b| b == 0));
    let round = ChannelReader::new()
        .read(w.region(), &ram())
        .unwrap()
        .unwrap();
    assert_eq!(round.version_minor, 0);
    assert_eq!(round.counts(), CountMeaning::RoundsSeen);
    assert_eq!(round.tracker_report, None);
}

/// Each reserved item of a v1.0 and of a v1.1 writer is rejected with its own offset, the lowest
/// offset first; a v1.2 writer's use of the same space is ignored.
#[test]
fn reserved_header_space_follows_the_writer_version() {
    fn reject_offset(minor: u16, pokes: &[(usize, u32)]) -> Option<u32> {
        let mut w = channel(8192);
        w.publish(&[entry(1)], &RoundMeta::default()).unwrap();
        let r = w.region();
        r.store_u32(off::VERSION_MAJOR, 1 | u32::from(minor) << 16)
            .unwrap();
        // Clear what a v1.1 writer published, so only the pokes are set.
        for o in [
            off::WINDOW_US,
            off::WINDOWS,
            off::TRACKER_CPU_US,
            off::COARSE_WINDOW_US,
        ] {
            r.store_u32(o, 0).unwrap();
        }
        r.store_u64(off::TRACKED_FRAMES, 0).unwrap();
        for &(o, v) in pokes {
            r.store_u32(o, v).unwrap();
        }
        match ChannelReader::new().read(r, &ram()) {
            Ok(Some(_)) => None,
            Err(ChannelError::ReservedHeaderBits { offset, .. }) => Some(offset),
            other => panic!("v1.{minor} {pokes:x?}: {other:?}"),
        }
    }
    let v1_0 = [
        0x030, 0x03c, 0x058, 0x064, 0x080, 0x084, 0x088, 0x08c, 0x090, 0x094, 0x098, 0x7fc,
    ];
    let v1_1 = [0x030, 0x03c, 0x058, 0x08c, 0x098, 0x400, 0x7fc];
    let v1_1_fields = [0x064, 0x080, 0x084, 0x088, 0x090, 0x094];
    for (minor, reserved) in [(0u16, &v1_0[..]), (1, &v1_1[..])] {
        assert_eq!(reject_offset(minor, &[]), None);
        for &o in reserved {
            // At 0x058 only the unknown flag bits are reserved.
            let v = if o == off::FLAGS { 2 } else { 0x100 };
            let at = (o & !7) as u32;
            let want = if o == off::FLAGS || o % 8 != 0 && reserved_u32(minor, o) {
                o as u32
            } else {
                at
            };
            assert_eq!(
                reject_offset(minor, &[(o, v)]),
                Some(want),
                "v1.{minor} at {o:#x}"
            );
            // Together with anything later, the lowest offset is reported.
            assert_eq!(reject_offset(minor, &[(0x7fc, 1), (o, v)]), Some(want));
        }
    }
    for &o in &v1_1_fields {
        assert_eq!(reject_offset(1, &[(o, 7)]), None, "v1.1 field {o:#x}");
    }
    for o in v1_0.into_iter().chain(v1_1) {
        let v = if o == off::FLAGS { 0x11 } else { 0x100 };
        assert_eq!(reject_offset(2, &[(o, v)]), None, "v1.2 at {o:#x}");
    }
}

/// Reserved u32 items are reported at their own offset; reserved words at the word's.
fn reserved_u32(minor: u16, offset: usize) -> bool {
    matches!((minor, offset), (0, 0x064) | (1, 0x08c))
}
