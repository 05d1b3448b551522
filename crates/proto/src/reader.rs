//! The host's validating reader (docs/channel.md, "Publication protocol" and "Validation").
//!
//! A round is copied out of shared memory under the guest's seqlock and only the copy is judged,
//! so what the reader returns cannot change under the caller. Everything is checked, nothing can
//! panic, and the copy is bounded by the mapped size whatever the header says.

use crate::count::CountMeaning;
use crate::entry::{HintEntry, GFN_MASK, HUGE_BIT, RESERVED_MASK};
use crate::layout::{self, off, Feedback, Micros, Reserved, Tracker, TrackerReport, FLAG_OVERFLOW};
use crate::ram_map::RamMap;
use crate::region::{AccessError, SharedRegion};
use crate::{Gfn, HUGE_FRAMES};
use serde::Serialize;
use std::fmt;
use std::sync::atomic::{fence, Ordering};
use thiserror::Error;

/// Words in the guest-written half of the header page (identity, publication, reserved).
const GUEST_WORDS: usize = off::GUEST_END / 8;

/// One validated round, copied out of the channel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HintRound {
    pub round: u64,
    /// The (even) sequence value the round was read under.
    pub seq: u64,
    pub version_minor: u16,
    pub tracker: Tracker,
    /// Raw publication flags; bits unknown to this reader are possible only when
    /// `version_minor > 1`.
    pub flags: u32,
    pub scan_interval_ms: u32,
    pub scan_duration_us: u32,
    pub tracked_bytes: u64,
    pub hot_frames: u64,
    pub publish_time_ns: u64,
    /// The tracker's windows and cost; `None` from a v1.0 writer, which has no such fields.
    pub tracker_report: Option<TrackerReport>,
    /// Entries in published order (hottest first), every one validated; duplicates are kept.
    pub entries: Vec<HintEntry>,
}

impl HintRound {
    /// The guest found more hot frames than it published.
    pub fn overflow(&self) -> bool {
        self.flags & FLAG_OVERFLOW != 0
    }
    /// What the entries' `count` means, fixed by the writer's minor version.
    pub fn counts(&self) -> CountMeaning {
        CountMeaning::for_minor(self.version_minor)
    }
}

/// The fields `BadLayout` can name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LayoutField {
    HeaderSize,
    EntrySize,
    PageShift,
    EntriesOffset,
}

impl fmt::Display for LayoutField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LayoutField::HeaderSize => "header_size",
            LayoutField::EntrySize => "entry_size",
            LayoutField::PageShift => "page_shift",
            LayoutField::EntriesOffset => "entries_offset",
        })
    }
}

/// Why a round was rejected: one variant per code in the spec's table.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum ChannelError {
    #[error("region too small: {mapped} bytes mapped, {needed} needed")]
    RegionTooSmall { mapped: u64, needed: u64 },
    #[error("bad magic {found:#018x}")]
    BadMagic { found: u64 },
    #[error("unsupported channel version {major}.{minor}")]
    UnsupportedVersion { major: u16, minor: u16 },
    #[error("bad layout: {field} = {value}")]
    BadLayout { field: LayoutField, value: u64 },
    #[error(
        "capacity {capacity} at offset {entries_offset} does not fit a {region_size}-byte region"
    )]
    CapacityBeyondRegion {
        entries_offset: u32,
        capacity: u64,
        region_size: u64,
    },
    #[error("count {count} exceeds capacity {capacity}")]
    CountBeyondCapacity { count: u64, capacity: u64 },
    #[error("guest is writing (seq {seq} is odd)")]
    WriteInProgress { seq: u64 },
    #[error("round torn: seq {before} became {after} during the copy")]
    TornRound { before: u64, after: u64 },
    #[error("reserved header bits set at offset {offset:#x}: {value:#x}")]
    ReservedHeaderBits { offset: u32, value: u64 },
    #[error("entry {index} has reserved bits set: {entry:#018x}")]
    ReservedEntryBits { index: u64, entry: u64 },
    #[error("entry {index}: {frames} frame(s) at {gfn} not all RAM")]
    GfnOutOfRange { index: u64, gfn: Gfn, frames: u64 },
    #[error("entry {index}: 2 MiB unit at {gfn} is not 512-aligned")]
    MisalignedHuge { index: u64, gfn: Gfn },
}

/// The reject reasons without their context: stable codes and metric labels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
#[repr(u32)]
pub enum RejectReason {
    RegionTooSmall = 1,
    BadMagic = 2,
    UnsupportedVersion = 3,
    BadLayout = 4,
    CapacityBeyondRegion = 5,
    CountBeyondCapacity = 6,
    WriteInProgress = 7,
    TornRound = 8,
    ReservedHeaderBits = 9,
    ReservedEntryBits = 10,
    GfnOutOfRange = 11,
    MisalignedHuge = 12,
}

impl RejectReason {
    pub const ALL: [RejectReason; 12] = [
        RejectReason::RegionTooSmall,
        RejectReason::BadMagic,
        RejectReason::UnsupportedVersion,
        RejectReason::BadLayout,
        RejectReason::CapacityBeyondRegion,
        RejectReason::CountBeyondCapacity,
        RejectReason::WriteInProgress,
        RejectReason::TornRound,
        RejectReason::ReservedHeaderBits,
        RejectReason::ReservedEntryBits,
        RejectReason::GfnOutOfRange,
        RejectReason::MisalignedHuge,
    ];

    /// The stable code (docs/channel.md), as written to `last_status`.
    pub const fn code(self) -> u32 {
        self as u32
    }

    pub fn from_code(code: u32) -> Option<RejectReason> {
        Self::ALL.into_iter().find(|r| r.code() == code)
    }

    /// Short snake_case name for metrics labels and logs.
    pub const fn label(self) -> &'static str {
        match self {
            RejectReason::RegionTooSmall => "region_too_small",
            RejectReason::BadMagic => "bad_magic",
            RejectReason::UnsupportedVersion => "unsupported_version",
            RejectReason::BadLayout => "bad_layout",
            RejectReason::CapacityBeyondRegion => "capacity_beyond_region",
            RejectReason::CountBeyondCapacity => "count_beyond_capacity",
            RejectReason::WriteInProgress => "write_in_progress",
            RejectReason::TornRound => "torn_round",
            RejectReason::ReservedHeaderBits => "reserved_header_bits",
            RejectReason::ReservedEntryBits => "reserved_entry_bits",
            RejectReason::GfnOutOfRange => "gfn_out_of_range",
            RejectReason::MisalignedHuge => "misaligned_huge",
        }
    }

    const fn slot(self) -> usize {
        self as usize - 1
    }
}

impl ChannelError {
    pub const fn reason(&self) -> RejectReason {
        match self {
            ChannelError::RegionTooSmall { .. } => RejectReason::RegionTooSmall,
            ChannelError::BadMagic { .. } => RejectReason::BadMagic,
            ChannelError::UnsupportedVersion { .. } => RejectReason::UnsupportedVersion,
            ChannelError::BadLayout { .. } => RejectReason::BadLayout,
            ChannelError::CapacityBeyondRegion { .. } => RejectReason::CapacityBeyondRegion,
            ChannelError::CountBeyondCapacity { .. } => RejectReason::CountBeyondCapacity,
            ChannelError::WriteInProgress { .. } => RejectReason::WriteInProgress,
            ChannelError::TornRound { .. } => RejectReason::TornRound,
            ChannelError::ReservedHeaderBits { .. } => RejectReason::ReservedHeaderBits,
            ChannelError::ReservedEntryBits { .. } => RejectReason::ReservedEntryBits,
            ChannelError::GfnOutOfRange { .. } => RejectReason::GfnOutOfRange,
            ChannelError::MisalignedHuge { .. } => RejectReason::MisalignedHuge,
        }
    }
    /// The stable reject code (1-12).
    pub const fn code(&self) -> u32 {
        self.reason().code()
    }
    pub const fn label(&self) -> &'static str {
        self.reason().label()
    }
    /// The entry a per-entry error names.
    pub const fn entry_index(&self) -> Option<u64> {
        match self {
            ChannelError::ReservedEntryBits { index, .. }
            | ChannelError::GfnOutOfRange { index, .. }
            | ChannelError::MisalignedHuge { index, .. } => Some(*index),
            _ => None,
        }
    }
}

/// What the reader has seen, by outcome: one count per `read` call.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RejectCounters {
    accepted: u64,
    no_new_round: u64,
    rejected: [u64; 12],
}

impl RejectCounters {
    pub fn accepted(&self) -> u64 {
        self.accepted
    }
    /// Reads that found the round already taken (nothing new published).
    pub fn no_new_round(&self) -> u64 {
        self.no_new_round
    }
    pub fn rejected(&self, reason: RejectReason) -> u64 {
        self.rejected.get(reason.slot()).copied().unwrap_or(0)
    }
    pub fn total_rejected(&self) -> u64 {
        self.rejected.iter().fold(0u64, |a, &b| a.saturating_add(b))
    }
    /// Every reason with its count, in code order.
    pub fn iter_rejected(&self) -> impl Iterator<Item = (RejectReason, u64)> + '_ {
        RejectReason::ALL.into_iter().map(|r| (r, self.rejected(r)))
    }
    fn record(&mut self, reason: RejectReason) {
        if let Some(c) = self.rejected.get_mut(reason.slot()) {
            *c = c.saturating_add(1);
        }
    }
}

/// The header fields a round needs, parsed from the copied words.
struct Header {
    version_minor: u16,
    entries_offset: u32,
    capacity: u64,
    tracker: u32,
    round: u64,
    count: u64,
    flags: u32,
    scan_interval_ms: u32,
    scan_duration_us: u32,
    tracked_bytes: u64,
    hot_frames: u64,
    publish_time_ns: u64,
    tracker_report: Option<TrackerReport>,
}

fn w(words: &[u64; GUEST_WORDS], offset: usize) -> u64 {
    words.get(offset / 8).copied().unwrap_or(0)
}
fn lo(v: u64) -> u32 {
    v as u32
}
fn hi(v: u64) -> u32 {
    (v >> 32) as u32
}

/// Checks 2, 3, 4, 1 (region_size), 5, 6 and 9 on the copied header page, in that order. The
/// reserved space checked (9) is the writer's minor version's; a newer minor's is not checked.
fn validate_header(words: &[u64; GUEST_WORDS], mapped: u64) -> Result<Header, ChannelError> {
    let magic = w(words, off::MAGIC);
    if magic != layout::MAGIC {
        return Err(ChannelError::BadMagic { found: magic });
    }
    let ver = w(words, off::VERSION_MAJOR);
    let (major, minor) = (ver as u16, (ver >> 16) as u16);
    if major != layout::VERSION_MAJOR {
        return Err(ChannelError::UnsupportedVersion { major, minor });
    }
    let header_size = hi(ver);
    let ent = w(words, off::ENTRIES_OFFSET);
    let (entries_offset, entry_size) = (lo(ent), hi(ent));
    let trk = w(words, off::TRACKER);
    let (tracker, page_shift) = (lo(trk), hi(trk));
    let bad = |field, value: u32| {
        Err(ChannelError::BadLayout {
            field,
            value: u64::from(value),
        })
    };
    if header_size != layout::HEADER_SIZE {
        return bad(LayoutField::HeaderSize, header_size);
    }
    if entry_size != layout::ENTRY_SIZE {
        return bad(LayoutField::EntrySize, entry_size);
    }
    if page_shift != layout::PAGE_SHIFT {
        return bad(LayoutField::PageShift, page_shift);
    }
    if entries_offset < header_size || entries_offset % 8 != 0 {
        return bad(LayoutField::EntriesOffset, entries_offset);
    }
    let region_size = w(words, off::REGION_SIZE);
    if region_size > mapped {
        return Err(ChannelError::RegionTooSmall {
            mapped,
            needed: region_size,
        });
    }
    let capacity = w(words, off::CAPACITY);
    let end = capacity
        .checked_mul(u64::from(layout::ENTRY_SIZE))
        .and_then(|b| b.checked_add(u64::from(entries_offset)));
    if !matches!(end, Some(end) if end <= region_size) {
        return Err(ChannelError::CapacityBeyondRegion {
            entries_offset,
            capacity,
            region_size,
        });
    }
    let count = w(words, off::COUNT);
    if count > capacity {
        return Err(ChannelError::CountBeyondCapacity { count, capacity });
    }
    if let Some((offset, value)) =
        layout::reserved_header(minor).and_then(|r| reserved_set(words, r))
    {
        return Err(ChannelError::ReservedHeaderBits {
            offset: offset as u32,
            value,
        });
    }
    let fl = w(words, off::FLAGS);
    let sd = w(words, off::SCAN_DURATION_US);
    // A v1.M writer (M > 1) keeps the meaning of every v1.1 field.
    let tracker_report = (minor >= 1).then(|| {
        let wc = w(words, off::WINDOWS);
        TrackerReport {
            window: Micros(hi(sd)),
            coarse_window: Micros(lo(w(words, off::COARSE_WINDOW_US))),
            windows: lo(wc),
            tracker_cpu: Micros(hi(wc)),
            tracked_frames: w(words, off::TRACKED_FRAMES),
        }
    });
    Ok(Header {
        version_minor: minor,
        entries_offset,
        capacity,
        tracker,
        round: w(words, off::ROUND),
        count,
        flags: lo(fl),
        scan_interval_ms: hi(fl),
        scan_duration_us: lo(sd),
        tracked_bytes: w(words, off::TRACKED_BYTES),
        hot_frames: w(words, off::HOT_FRAMES),
        publish_time_ns: w(words, off::PUBLISH_TIME_NS),
        tracker_report,
    })
}

/// The first reserved item (in offset order) that is not zero: its offset and value.
fn reserved_set(words: &[u64; GUEST_WORDS], reserved: &[Reserved]) -> Option<(usize, u64)> {
    reserved.iter().find_map(|r| {
        if r.len == 4 {
            let word = w(words, r.offset & !7);
            let half = if r.offset % 8 == 0 {
                lo(word)
            } else {
                hi(word)
            };
            let value = u64::from(half & r.mask);
            (value != 0).then_some((r.offset, value))
        } else {
            let first = r.offset / 8;
            let n = r.len / 8;
            words
                .iter()
                .enumerate()
                .skip(first)
                .take(n)
                .find(|&(_, &v)| v != 0)
                .map(|(i, &v)| (i * 8, v))
        }
    })
}

/// Entries copied and pre-checked per step: small enough to still be in L1 when checked.
const CHUNK: usize = 2048;

/// Checks 10, 11 and 12 on each entry in index order; the first failing entry decides.
pub fn validate_entries(entries: &[HintEntry], ram: &RamMap) -> Result<(), ChannelError> {
    let fast = FastCheck::new(ram);
    match entries.chunks(CHUNK).position(|c| !fast.chunk_ok(c)) {
        Some(i) => validate_entries_from(entries, i * CHUNK, ram),
        None => Ok(()),
    }
}

/// RAM as maximal runs of frames (adjacent ranges joined), so "every frame of the entry is RAM"
/// is "inside one run": a branch-free test when there are few runs, as in every real VM.
struct FastCheck {
    runs: [(u64, u64); 8],
    n: usize,
    avx2: bool,
}

impl FastCheck {
    fn new(ram: &RamMap) -> Self {
        // Padding runs contain nothing: start > any gfn, end 0.
        let mut runs = [(u64::MAX, 0u64); 8];
        let mut n = 0usize;
        for r in ram.ranges() {
            match n.checked_sub(1).and_then(|last| runs.get_mut(last)) {
                Some(prev) if prev.1 == r.start.0 => prev.1 = r.end.0,
                _ => {
                    if let Some(slot) = runs.get_mut(n) {
                        *slot = (r.start.0, r.end.0);
                    }
                    n = n.saturating_add(1);
                }
            }
        }
        #[cfg(target_arch = "x86_64")]
        let avx2 = std::arch::is_x86_feature_detected!("avx2");
        #[cfg(not(target_arch = "x86_64"))]
        let avx2 = false;
        FastCheck { runs, n, avx2 }
    }

    /// True if every entry certainly passes; false sends the chunk to the precise check.
    fn chunk_ok(&self, chunk: &[HintEntry]) -> bool {
        match self.n {
            0 => chunk.is_empty(),
            1 => self.chunk_ok_n::<1>(chunk),
            2 => self.chunk_ok_n::<2>(chunk),
            3 | 4 => self.chunk_ok_n::<4>(chunk),
            5..=8 => self.chunk_ok_n::<8>(chunk),
            _ => false,
        }
    }

    fn chunk_ok_n<const N: usize>(&self, chunk: &[HintEntry]) -> bool {
        let mut runs = [(u64::MAX, 0u64); N];
        runs.copy_from_slice(self.runs.get(..N).unwrap_or(&[(u64::MAX, 0); N]));
        #[cfg(target_arch = "x86_64")]
        if self.avx2 {
            // SAFETY: the CPU supports AVX2 (detected in `new`).
            return unsafe { chunk_ok_avx2(&runs, chunk) };
        }
        chunk_ok_scalar(&runs, chunk)
    }
}

/// The same loop compiled for AVX2, where 64-bit compares vectorise.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn chunk_ok_avx2<const N: usize>(runs: &[(u64, u64); N], chunk: &[HintEntry]) -> bool {
    chunk_ok_scalar(runs, chunk)
}

#[inline(always)]
fn chunk_ok_scalar<const N: usize>(runs: &[(u64, u64); N], chunk: &[HintEntry]) -> bool {
    let mut bad = 0u64;
    for e in chunk {
        let w = e.0;
        let gfn = w & GFN_MASK;
        let huge = (w & HUGE_BIT) >> HUGE_BIT.trailing_zeros();
        // gfn < 2^40: no overflow.
        let end = gfn + 1 + huge * (HUGE_FRAMES - 1);
        let mut inside = 0u64;
        for &(start, stop) in runs {
            inside |= u64::from((gfn >= start) & (end <= stop));
        }
        bad |= (w & RESERVED_MASK) | (inside ^ 1) | (huge & u64::from(gfn % HUGE_FRAMES != 0));
    }
    bad == 0
}

/// The precise checks from entry `start` on; indexes in errors are absolute.
fn validate_entries_from(
    entries: &[HintEntry],
    start: usize,
    ram: &RamMap,
) -> Result<(), ChannelError> {
    // The last range an entry fell in: entries cluster, so most checks are two compares.
    let (mut lo_gfn, mut hi_gfn) = (1u64, 0u64);
    for (index, e) in entries.iter().enumerate().skip(start) {
        let word = e.0;
        let index = index as u64;
        if word & RESERVED_MASK != 0 {
            return Err(ChannelError::ReservedEntryBits { index, entry: word });
        }
        let gfn = word & GFN_MASK;
        let huge = word & HUGE_BIT != 0;
        let frames = if huge { HUGE_FRAMES } else { 1 };
        // gfn < 2^40, so the sum cannot overflow.
        if gfn < lo_gfn || gfn + frames > hi_gfn {
            if !ram.contains_frames(Gfn(gfn), frames) {
                return Err(ChannelError::GfnOutOfRange {
                    index,
                    gfn: Gfn(gfn),
                    frames,
                });
            }
            if let Some(r) = ram.range_containing(Gfn(gfn)) {
                (lo_gfn, hi_gfn) = (r.start.0, r.end.0);
            }
        }
        if huge && gfn % HUGE_FRAMES != 0 {
            return Err(ChannelError::MisalignedHuge {
                index,
                gfn: Gfn(gfn),
            });
        }
    }
    Ok(())
}

/// Reads rounds from one channel. Keeps the last round taken, counters and a reusable buffer.
#[derive(Debug, Default)]
pub struct ChannelReader {
    last_round: u64,
    last_status: u32,
    counters: RejectCounters,
    spare: Vec<HintEntry>,
}

fn too_small(mapped: usize, e: AccessError) -> ChannelError {
    let needed = e.offset.saturating_add(e.size);
    ChannelError::RegionTooSmall {
        mapped: mapped as u64,
        needed: needed as u64,
    }
}

impl ChannelReader {
    pub fn new() -> Self {
        Self::default()
    }

    /// Reads the current round: `Ok(None)` if it is the round last taken (or round 0, nothing
    /// published yet), `Err` if rejected. Every outcome is counted.
    pub fn read<R: SharedRegion + ?Sized>(
        &mut self,
        region: &R,
        ram: &RamMap,
    ) -> Result<Option<HintRound>, ChannelError> {
        match self.read_inner(region, ram) {
            Ok(Some(round)) => {
                self.counters.accepted = self.counters.accepted.saturating_add(1);
                self.last_round = round.round;
                self.last_status = 0;
                Ok(Some(round))
            }
            Ok(None) => {
                self.counters.no_new_round = self.counters.no_new_round.saturating_add(1);
                Ok(None)
            }
            Err(e) => {
                self.counters.record(e.reason());
                self.last_status = e.code();
                Err(e)
            }
        }
    }

    fn read_inner<R: SharedRegion + ?Sized>(
        &mut self,
        region: &R,
        ram: &RamMap,
    ) -> Result<Option<HintRound>, ChannelError> {
        let mapped = region.len();
        if mapped < layout::HEADER_SIZE as usize {
            return Err(ChannelError::RegionTooSmall {
                mapped: mapped as u64,
                needed: u64::from(layout::HEADER_SIZE),
            });
        }
        let s1 = region
            .load_u64_acquire(off::SEQ)
            .map_err(|e| too_small(mapped, e))?;
        if s1 & 1 != 0 {
            return Err(ChannelError::WriteInProgress { seq: s1 });
        }
        let mut words = [0u64; GUEST_WORDS];
        region
            .copy_words(0, &mut words)
            .map_err(|e| too_small(mapped, e))?;
        // A header copied while the guest rewrote it can fail any check: report the tear, not
        // the artefact.
        let h =
            validate_header(&words, mapped as u64).map_err(|e| Self::unless_torn(region, s1, e))?;
        // Round 0 means nothing published (the spec numbers rounds from 1), also after rounds
        // were taken: a guest that writes it gets nothing through.
        if h.round == 0 || h.round == self.last_round {
            return Ok(None);
        }
        // count <= capacity and entries_offset + capacity * 8 <= region_size <= mapped: the copy
        // and the allocation are bounded by what the host mapped.
        let count = usize::try_from(h.count).map_err(|_| ChannelError::CountBeyondCapacity {
            count: h.count,
            capacity: h.capacity,
        })?;
        let mut entries = std::mem::take(&mut self.spare);
        entries.truncate(count);
        entries.resize(count, HintEntry(0));
        // Copy in chunks and pre-check each while it is in cache; the verdict on the entries
        // waits for the seq re-check, since a torn copy decides nothing.
        let fast = FastCheck::new(ram);
        let mut first_bad_chunk = None;
        let mut copied = Ok(());
        let mut at = h.entries_offset as usize;
        for (i, chunk) in entries.chunks_mut(CHUNK).enumerate() {
            if let Err(e) = region.copy_words(at, HintEntry::as_words_mut(chunk)) {
                copied = Err(too_small(mapped, e));
                break;
            }
            at = at.saturating_add(chunk.len() * 8);
            if first_bad_chunk.is_none() && !fast.chunk_ok(chunk) {
                first_bad_chunk = Some(i);
            }
        }
        let result = copied
            .and_then(|()| {
                fence(Ordering::Acquire);
                region.load_u64(off::SEQ).map_err(|e| too_small(mapped, e))
            })
            .and_then(|s2| match first_bad_chunk {
                _ if s2 != s1 => Err(ChannelError::TornRound {
                    before: s1,
                    after: s2,
                }),
                Some(i) => validate_entries_from(&entries, i * CHUNK, ram),
                None => Ok(()),
            });
        if let Err(e) = result {
            self.spare = entries;
            return Err(e);
        }
        Ok(Some(HintRound {
            round: h.round,
            seq: s1,
            version_minor: h.version_minor,
            tracker: Tracker::from_raw(h.tracker),
            flags: h.flags,
            scan_interval_ms: h.scan_interval_ms,
            scan_duration_us: h.scan_duration_us,
            tracked_bytes: h.tracked_bytes,
            hot_frames: h.hot_frames,
            publish_time_ns: h.publish_time_ns,
            tracker_report: h.tracker_report,
            entries,
        }))
    }

    fn unless_torn<R: SharedRegion + ?Sized>(region: &R, s1: u64, e: ChannelError) -> ChannelError {
        fence(Ordering::Acquire);
        match region.load_u64(off::SEQ) {
            Ok(s2) if s2 != s1 => ChannelError::TornRound {
                before: s1,
                after: s2,
            },
            _ => e,
        }
    }

    /// Gives a round's buffer back so the next read reuses its allocation.
    pub fn recycle(&mut self, round: HintRound) {
        if round.entries.capacity() > self.spare.capacity() {
            self.spare = round.entries;
        }
    }

    /// Forgets the last round taken (the guest re-attached, or a benchmark re-reads one round).
    pub fn reset(&mut self) {
        self.last_round = 0;
    }

    /// The last round accepted, 0 if none.
    pub fn last_round(&self) -> u64 {
        self.last_round
    }
    /// 0 if the last round judged was accepted, else its reject code (for `last_status`).
    pub fn last_status(&self) -> u32 {
        self.last_status
    }
    pub fn counters(&self) -> &RejectCounters {
        &self.counters
    }
}

/// Writes the host's feedback block under `host_seq` (the guest reads it as advice).
pub fn write_feedback<R: SharedRegion + ?Sized>(
    region: &R,
    fb: &Feedback,
) -> Result<(), AccessError> {
    let s = region.load_u64(off::HOST_SEQ)? | 1;
    region.store_u64(off::HOST_SEQ, s)?;
    fence(Ordering::Release);
    region.store_u64(off::ACK_ROUND, fb.ack_round)?;
    region.store_u64(off::ENTRY_BUDGET, fb.entry_budget)?;
    region.store_u32(off::MIN_INTERVAL_MS, fb.min_interval_ms)?;
    region.store_u32(off::LAST_STATUS, fb.last_status)?;
    region.store_u64(off::FAST_QUOTA_BYTES, fb.fast_quota_bytes)?;
    region.store_u64(off::REJECTED_ROUNDS, fb.rejected_rounds)?;
    region.store_u32(off::HOST_VERSION, fb.host_version)?;
    region.store_u64_release(off::HOST_SEQ, s.wrapping_add(1))
}

/// Reads the host's feedback block; `None` while the host is writing it.
pub fn read_feedback<R: SharedRegion + ?Sized>(
    region: &R,
) -> Result<Option<Feedback>, AccessError> {
    let s1 = region.load_u64_acquire(off::HOST_SEQ)?;
    if s1 & 1 != 0 {
        return Ok(None);
    }
    let fb = Feedback {
        ack_round: region.load_u64(off::ACK_ROUND)?,
        entry_budget: region.load_u64(off::ENTRY_BUDGET)?,
        min_interval_ms: region.load_u32(off::MIN_INTERVAL_MS)?,
        last_status: region.load_u32(off::LAST_STATUS)?,
        fast_quota_bytes: region.load_u64(off::FAST_QUOTA_BYTES)?,
        rejected_rounds: region.load_u64(off::REJECTED_ROUNDS)?,
        host_version: region.load_u32(off::HOST_VERSION)?,
    };
    fence(Ordering::Acquire);
    Ok((region.load_u64(off::HOST_SEQ)? == s1).then_some(fb))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ram_map::GfnRange;

    /// The branch-free pre-check never passes a chunk the precise check would reject, and
    /// `validate_entries` reports the same first error as a plain entry-by-entry scan.
    #[test]
    fn fast_check_agrees_with_precise_check() {
        // One range; two adjacent ranges (one run); then 2, 3, 6 and 12 runs: every arm of
        // `chunk_ok`, the last one past the fast path.
        let runs = |n: u64| -> Vec<GfnRange> {
            (0..n)
                .map(|k| GfnRange::new(Gfn(k * 0x500), Gfn(k * 0x500 + 0x480)))
                .collect()
        };
        let maps = [
            (vec![GfnRange::new(Gfn(0), Gfn(0x1000))], 1),
            (
                vec![
                    GfnRange::new(Gfn(0x10), Gfn(0x400)),
                    GfnRange::new(Gfn(0x400), Gfn(0x900)),
                ],
                1,
            ),
            (runs(2), 2),
            (runs(3), 3),
            (runs(6), 6),
            (runs(12), 12),
        ];
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let (mut passed, mut sent_on) = (0, 0);
        for (ranges, n_runs) in maps {
            let ram = RamMap::new(ranges).unwrap();
            let fast = FastCheck::new(&ram);
            assert_eq!(fast.n, n_runs);
            for _ in 0..4000 {
                let mut chunk = Vec::new();
                for _ in 0..(x % 7) {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    // Mostly small gfns and rarely reserved bits, so both verdicts occur.
                    let mut w = x & (GFN_MASK & 0x3fff | 0xff << 40 | 0x1f << 48);
                    if x >> 58 == 0 {
                        w |= 1 << 60;
                    }
                    chunk.push(HintEntry(w));
                }
                let precise = validate_entries_from(&chunk, 0, &ram);
                let scalar = FastCheck {
                    avx2: false,
                    ..FastCheck::new(&ram)
                };
                assert_eq!(scalar.chunk_ok(&chunk), fast.chunk_ok(&chunk));
                if fast.chunk_ok(&chunk) {
                    assert_eq!(precise, Ok(()), "{chunk:?}");
                    passed += 1;
                } else {
                    sent_on += 1;
                }
                assert_eq!(validate_entries(&chunk, &ram), precise);
            }
        }
        assert!(
            passed > 1000 && sent_on > 1000,
            "{passed} passed, {sent_on} sent on"
        );
    }
}
