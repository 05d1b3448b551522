//! The guest side in Rust (DAMON agent, simulator, test harnesses). Produces the same bytes as the
//! C helpers in `guest/module/vtism_channel.h`, which the shared vectors check.

use crate::entry::HintEntry;
use crate::layout::{self, off, ChannelVersion, Feedback, Tracker, TrackerReport, FLAG_OVERFLOW};
use crate::reader::read_feedback;
use crate::region::{AccessError, SharedRegion};
use std::sync::atomic::{fence, Ordering};
use thiserror::Error;

#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum WriterError {
    #[error("region of {region_size} bytes holds no entry")]
    RegionTooSmall { region_size: u64 },
    #[error("region_size {region_size} exceeds the {mapped} bytes available")]
    RegionSizeBeyondMapping { region_size: u64, mapped: u64 },
    #[error("entry {index} is invalid ({entry:?}): reserved bits or a misaligned 2 MiB unit")]
    InvalidEntry { index: usize, entry: HintEntry },
    #[error(transparent)]
    Access(#[from] AccessError),
}

/// How to initialise a channel (as `vtism_ch_init`'s arguments).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriterConfig {
    pub tracker: Tracker,
    /// The BAR size to declare; `None` = the whole region.
    pub region_size: Option<u64>,
    /// Keep the host's feedback block (a tracker reloading while the host runs).
    pub preserve_feedback: bool,
    /// The version written into the header. `V1_0` makes an old guest (counts are rounds seen,
    /// no tracker report); the default is the newest, v1.1.
    pub version: ChannelVersion,
}

/// Per-round values published with the entries.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RoundMeta {
    /// The guest itself dropped hot frames (the writer adds truncation on its own).
    pub overflow: bool,
    pub scan_interval_ms: u32,
    pub scan_duration_us: u32,
    pub tracked_bytes: u64,
    /// Hot 4 KiB frames found before any truncation.
    pub hot_frames: u64,
    pub publish_time_ns: u64,
    /// The tracker's windows and cost (v1.1 fields; a v1.0 writer leaves them zero).
    pub tracker_report: TrackerReport,
}

/// What a `publish` did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Published {
    pub round: u64,
    /// Entries written.
    pub count: u64,
    /// Entries were dropped to fit the capacity or the host's budget.
    pub truncated: bool,
    /// The OVERFLOW flag was set.
    pub overflow: bool,
}

/// Publishes rounds into a channel region it has initialised.
#[derive(Debug)]
pub struct ChannelWriter<R: SharedRegion> {
    region: R,
    capacity: u64,
    version: ChannelVersion,
    feedback: Option<Feedback>,
}

impl<R: SharedRegion> ChannelWriter<R> {
    /// Initialises the region for a tracker as a v1.1 writer, clearing the host's feedback.
    pub fn init(region: R, tracker: Tracker) -> Result<Self, WriterError> {
        Self::init_with(
            region,
            WriterConfig {
                tracker,
                ..WriterConfig::default()
            },
        )
    }

    /// Initialises the header page like `vtism_ch_init`: seq odd while the header is rewritten,
    /// magic last, then seq even with round 0 (a valid, empty channel).
    pub fn init_with(region: R, cfg: WriterConfig) -> Result<Self, WriterError> {
        let mapped = region.len() as u64;
        let region_size = cfg.region_size.unwrap_or(mapped);
        if region_size > mapped {
            return Err(WriterError::RegionSizeBeyondMapping {
                region_size,
                mapped,
            });
        }
        let capacity = layout::capacity_for(region_size);
        if capacity == 0 {
            return Err(WriterError::RegionTooSmall { region_size });
        }
        let seq = region.load_u64(off::SEQ)? | 1;
        region.store_u64(off::SEQ, seq)?;
        fence(Ordering::Release);
        let zeros = [0u64; off::SEQ / 8];
        region.store_words(0, &zeros)?;
        let after_seq = [0u64; (off::GUEST_END - off::ROUND) / 8];
        region.store_words(off::ROUND, &after_seq)?;
        if !cfg.preserve_feedback {
            let host = [0u64; (layout::HEADER_SIZE as usize - off::GUEST_END) / 8];
            region.store_words(off::GUEST_END, &host)?;
        }
        region.store_u32(
            off::VERSION_MAJOR,
            u32::from(layout::VERSION_MAJOR) | u32::from(cfg.version.minor()) << 16,
        )?;
        region.store_u32(off::HEADER_SIZE, layout::HEADER_SIZE)?;
        region.store_u64(off::REGION_SIZE, region_size)?;
        region.store_u32(off::ENTRIES_OFFSET, layout::ENTRIES_OFFSET)?;
        region.store_u32(off::ENTRY_SIZE, layout::ENTRY_SIZE)?;
        region.store_u64(off::CAPACITY, capacity)?;
        region.store_u32(off::TRACKER, cfg.tracker.raw())?;
        region.store_u32(off::PAGE_SHIFT, layout::PAGE_SHIFT)?;
        region.store_u64(off::MAGIC, layout::MAGIC)?;
        fence(Ordering::Release);
        region.store_u64(off::SEQ, seq.wrapping_add(1))?;
        Ok(ChannelWriter {
            region,
            capacity,
            version: cfg.version,
            feedback: None,
        })
    }

    /// The version this writer speaks.
    pub fn version(&self) -> ChannelVersion {
        self.version
    }

    /// Entries the array holds.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// The most entries the next round may carry: the capacity, clamped by the host's budget.
    pub fn entry_limit(&self) -> u64 {
        match self.feedback {
            Some(fb) if fb.entry_budget > 0 => fb.entry_budget.min(self.capacity),
            _ => self.capacity,
        }
    }

    /// Publishes one round of entries, hottest first. Keeps the first `entry_limit()` entries
    /// (refreshing the host's feedback first) and sets OVERFLOW if any were dropped. Invalid
    /// entries (reserved bits, misaligned 2 MiB units) are refused before anything is written.
    /// A v1.0 writer ignores `meta.tracker_report` (that space is reserved in v1.0).
    pub fn publish(
        &mut self,
        entries: &[HintEntry],
        meta: &RoundMeta,
    ) -> Result<Published, WriterError> {
        if let Some((index, &entry)) = entries
            .iter()
            .enumerate()
            .find(|(_, e)| e.reserved_bits() != 0 || (e.huge() && !e.gfn().is_huge_aligned()))
        {
            return Err(WriterError::InvalidEntry { index, entry });
        }
        self.read_feedback()?;
        let limit = usize::try_from(self.entry_limit()).unwrap_or(usize::MAX);
        let kept = entries.get(..limit).unwrap_or(entries);
        let truncated = kept.len() < entries.len();
        let overflow = meta.overflow || truncated;

        let r = &self.region;
        let seq = r.load_u64(off::SEQ)? | 1;
        r.store_u64(off::SEQ, seq)?;
        fence(Ordering::Release);
        r.store_words(layout::ENTRIES_OFFSET as usize, HintEntry::as_words(kept))?;
        let round = r.load_u64(off::ROUND)?.wrapping_add(1);
        r.store_u64(off::COUNT, kept.len() as u64)?;
        r.store_u64(off::ROUND, round)?;
        r.store_u32(off::FLAGS, if overflow { FLAG_OVERFLOW } else { 0 })?;
        r.store_u32(off::SCAN_INTERVAL_MS, meta.scan_interval_ms)?;
        r.store_u32(off::SCAN_DURATION_US, meta.scan_duration_us)?;
        r.store_u64(off::TRACKED_BYTES, meta.tracked_bytes)?;
        r.store_u64(off::HOT_FRAMES, meta.hot_frames)?;
        r.store_u64(off::PUBLISH_TIME_NS, meta.publish_time_ns)?;
        if self.version == ChannelVersion::V1_1 {
            let t = &meta.tracker_report;
            r.store_u32(off::WINDOW_US, t.window.0)?;
            r.store_u32(off::WINDOWS, t.windows)?;
            r.store_u32(off::TRACKER_CPU_US, t.tracker_cpu.0)?;
            r.store_u32(off::COARSE_WINDOW_US, t.coarse_window.0)?;
            r.store_u64(off::TRACKED_FRAMES, t.tracked_frames)?;
        }
        fence(Ordering::Release);
        r.store_u64(off::SEQ, seq.wrapping_add(1))?;
        Ok(Published {
            round,
            count: kept.len() as u64,
            truncated,
            overflow,
        })
    }

    /// Reads the host's feedback; keeps the last consistent copy when the host is mid-write.
    pub fn read_feedback(&mut self) -> Result<Option<Feedback>, AccessError> {
        if let Some(fb) = read_feedback(&self.region)? {
            self.feedback = Some(fb);
        }
        Ok(self.feedback)
    }

    /// The last feedback read consistently, if any.
    pub fn feedback(&self) -> Option<Feedback> {
        self.feedback
    }

    /// The interval to wait before the next scan: `desired`, but never below the host's floor.
    pub fn next_interval_ms(&self, desired: u32) -> u32 {
        self.feedback
            .map_or(desired, |fb| desired.max(fb.min_interval_ms))
    }

    pub fn region(&self) -> &R {
        &self.region
    }

    pub fn into_inner(self) -> R {
        self.region
    }
}
