//! Channel v1.1 layout constants and the small types both sides share (docs/channel.md, "Layout").

use crate::count::CountMeaning;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::time::Duration;

/// `VTISMCH1` read as a little-endian u64.
pub const MAGIC: u64 = 0x3148_434D_5349_5456;
pub const VERSION_MAJOR: u16 = 1;
/// The newest minor version this crate reads and writes.
pub const VERSION_MINOR: u16 = 1;
pub const HEADER_SIZE: u32 = 4096;
pub const ENTRIES_OFFSET: u32 = 4096;
pub const ENTRY_SIZE: u32 = 8;
pub const PAGE_SHIFT: u32 = 12;
/// What this crate's reader writes into `host_version`: `major << 16 | minor`.
pub const HOST_VERSION: u32 = (VERSION_MAJOR as u32) << 16 | VERSION_MINOR as u32;

/// Publication flag: the guest found more hot frames than it published.
pub const FLAG_OVERFLOW: u32 = 1;
/// Flags a v1.0 or v1.1 writer may set.
pub const FLAGS_KNOWN: u32 = FLAG_OVERFLOW;

/// Byte offsets of the header fields.
pub mod off {
    pub const MAGIC: usize = 0x000;
    pub const VERSION_MAJOR: usize = 0x008;
    pub const VERSION_MINOR: usize = 0x00A;
    pub const HEADER_SIZE: usize = 0x00C;
    pub const REGION_SIZE: usize = 0x010;
    pub const ENTRIES_OFFSET: usize = 0x018;
    pub const ENTRY_SIZE: usize = 0x01C;
    pub const CAPACITY: usize = 0x020;
    pub const TRACKER: usize = 0x028;
    pub const PAGE_SHIFT: usize = 0x02C;
    /// 16 reserved bytes of the identity block.
    pub const RESERVED_IDENTITY: usize = 0x030;
    pub const SEQ: usize = 0x040;
    pub const ROUND: usize = 0x048;
    pub const COUNT: usize = 0x050;
    pub const FLAGS: usize = 0x058;
    pub const SCAN_INTERVAL_MS: usize = 0x05C;
    pub const SCAN_DURATION_US: usize = 0x060;
    /// v1.1 (reserved in v1.0).
    pub const WINDOW_US: usize = 0x064;
    pub const TRACKED_BYTES: usize = 0x068;
    pub const HOT_FRAMES: usize = 0x070;
    pub const PUBLISH_TIME_NS: usize = 0x078;
    /// v1.1 (0x080-0x097 were reserved in v1.0).
    pub const WINDOWS: usize = 0x080;
    pub const TRACKER_CPU_US: usize = 0x084;
    pub const COARSE_WINDOW_US: usize = 0x088;
    /// A reserved u32 of v1.1, keeping `tracked_frames` 8-aligned.
    pub const RESERVED_PUBLICATION: usize = 0x08C;
    pub const TRACKED_FRAMES: usize = 0x090;
    /// Reserved from here to `GUEST_END` in v1.1.
    pub const RESERVED_TAIL: usize = 0x098;
    /// End of the guest-written half of the header page.
    pub const GUEST_END: usize = 0x800;
    pub const HOST_SEQ: usize = 0x800;
    pub const ACK_ROUND: usize = 0x808;
    pub const ENTRY_BUDGET: usize = 0x810;
    pub const MIN_INTERVAL_MS: usize = 0x818;
    pub const LAST_STATUS: usize = 0x81C;
    pub const FAST_QUOTA_BYTES: usize = 0x820;
    pub const REJECTED_ROUNDS: usize = 0x828;
    pub const HOST_VERSION: usize = 0x830;
}

/// Guest-header bytes a writer must leave zero: `len` bytes at `offset`, or for a 4-byte item
/// the bits of `mask` (the unknown `flags` bits).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reserved {
    pub offset: usize,
    pub len: usize,
    pub mask: u32,
}

const fn span(offset: usize, end: usize) -> Reserved {
    Reserved {
        offset,
        len: end - offset,
        mask: u32::MAX,
    }
}

const UNKNOWN_FLAGS: Reserved = Reserved {
    offset: off::FLAGS,
    len: 4,
    mask: !FLAGS_KNOWN,
};

/// What a v1.0 writer leaves zero, in offset order.
const RESERVED_V1_0: [Reserved; 4] = [
    span(off::RESERVED_IDENTITY, off::SEQ),
    UNKNOWN_FLAGS,
    span(off::WINDOW_US, off::TRACKED_BYTES),
    span(off::WINDOWS, off::GUEST_END),
];

/// What a v1.1 writer leaves zero, in offset order.
const RESERVED_V1_1: [Reserved; 4] = [
    span(off::RESERVED_IDENTITY, off::SEQ),
    UNKNOWN_FLAGS,
    span(off::RESERVED_PUBLICATION, off::TRACKED_FRAMES),
    span(off::RESERVED_TAIL, off::GUEST_END),
];

/// The reserved guest-header space of a writer of `version_minor`, in offset order; `None` for a
/// minor newer than this crate knows (its fields are ignored, not checked).
pub const fn reserved_header(version_minor: u16) -> Option<&'static [Reserved]> {
    match version_minor {
        0 => Some(&RESERVED_V1_0),
        1 => Some(&RESERVED_V1_1),
        _ => None,
    }
}

/// The channel versions a writer can speak (docs/channel.md, "Versions").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ChannelVersion {
    /// `count` is rounds seen; the v1.1 publication fields stay zero (an old guest).
    V1_0,
    /// `count` is a rate level; the tracker report is published.
    #[default]
    V1_1,
}

impl ChannelVersion {
    pub const fn minor(self) -> u16 {
        match self {
            ChannelVersion::V1_0 => 0,
            ChannelVersion::V1_1 => 1,
        }
    }
    /// What the entries' `count` means in rounds of this version.
    pub const fn counts(self) -> CountMeaning {
        CountMeaning::for_minor(self.minor())
    }
}

/// A span of time in microseconds, as the channel carries it (u32: at most about 71 minutes).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Micros(pub u32);

impl Micros {
    /// The duration in whole microseconds, saturating at `u32::MAX`.
    pub fn saturating_from(d: Duration) -> Micros {
        Micros(u32::try_from(d.as_micros()).unwrap_or(u32::MAX))
    }
    pub const fn as_duration(self) -> Duration {
        Duration::from_micros(self.0 as u64)
    }
}

impl fmt::Display for Micros {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} us", self.0)
    }
}

/// What a v1.1 tracker reports with each round about its observation windows and cost
/// (informational: never validated beyond the reserved-bits rules).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TrackerReport {
    /// The fine observation window W_f at publication (`window_us`).
    pub window: Micros,
    /// The coarse observation window W_c at publication (`coarse_window_us`).
    pub coarse_window: Micros,
    /// Observation windows, coarse and fine, completed since the last round.
    pub windows: u32,
    /// CPU time the tracker spent since the last round, publication included.
    pub tracker_cpu: Micros,
    /// Frames the tracker holds state for.
    pub tracked_frames: u64,
}

/// Entries a region of `region_size` bytes holds with the standard layout (as `vtism_ch_capacity_for`).
pub const fn capacity_for(region_size: u64) -> u64 {
    if region_size < ENTRIES_OFFSET as u64 {
        0
    } else {
        (region_size - ENTRIES_OFFSET as u64) / ENTRY_SIZE as u64
    }
}

/// Which guest component publishes (informational; never validated).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tracker {
    #[default]
    Unknown,
    Module,
    Damon,
    Harness,
    Other(u32),
}

impl Tracker {
    pub const fn from_raw(v: u32) -> Tracker {
        match v {
            0 => Tracker::Unknown,
            1 => Tracker::Module,
            2 => Tracker::Damon,
            3 => Tracker::Harness,
            v => Tracker::Other(v),
        }
    }
    pub const fn raw(self) -> u32 {
        match self {
            Tracker::Unknown => 0,
            Tracker::Module => 1,
            Tracker::Damon => 2,
            Tracker::Harness => 3,
            Tracker::Other(v) => v,
        }
    }
}

/// The host's feedback block. The guest treats it as advice and clamps it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Feedback {
    /// Last round the host accepted.
    pub ack_round: u64,
    /// Publish at most this many entries; 0 = no limit.
    pub entry_budget: u64,
    /// Do not scan more often than this; 0 = no floor.
    pub min_interval_ms: u32,
    /// 0 if the last round read was accepted, else its reject code.
    pub last_status: u32,
    pub fast_quota_bytes: u64,
    pub rejected_rounds: u64,
    /// `major << 16 | minor` of the host's reader.
    pub host_version: u32,
}

impl Default for Feedback {
    fn default() -> Self {
        Feedback {
            ack_round: 0,
            entry_budget: 0,
            min_interval_ms: 0,
            last_status: 0,
            fast_quota_bytes: 0,
            rejected_rounds: 0,
            host_version: HOST_VERSION,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reserved items are what the reader can check: u32s or whole words, in offset order,
    /// inside the guest half, clear of every field the version defines.
    #[test]
    fn reserved_space_is_well_formed() {
        let fields_v1_0 = [
            (off::MAGIC, 0x030),
            (off::SEQ, off::SCAN_DURATION_US + 4),
            (off::TRACKED_BYTES, off::WINDOWS),
        ];
        let fields_v1_1 = [
            (off::MAGIC, 0x030),
            (off::SEQ, off::RESERVED_PUBLICATION),
            (off::TRACKED_FRAMES, off::RESERVED_TAIL),
        ];
        for (minor, fields) in [(0u16, &fields_v1_0[..]), (1, &fields_v1_1[..])] {
            let items = reserved_header(minor).unwrap();
            let mut end = 0;
            let mut covered = 0;
            for r in items {
                assert!(r.offset >= end, "v1.{minor}: {r:?} out of order");
                assert!(r.len == 4 && r.offset % 4 == 0 || r.len % 8 == 0 && r.offset % 8 == 0);
                assert!(r.offset + r.len <= off::GUEST_END);
                end = r.offset + r.len;
                if r.offset != off::FLAGS {
                    covered += r.len;
                    for &(a, b) in fields {
                        assert!(r.offset + r.len <= a || r.offset >= b, "v1.{minor}: {r:?}");
                    }
                }
            }
            // Fields and reserved space together fill the guest half (flags is a field).
            let field_bytes: usize = fields.iter().map(|(a, b)| b - a).sum();
            assert_eq!(covered + field_bytes, off::GUEST_END, "v1.{minor}");
        }
        assert_eq!(reserved_header(2), None);
        assert_eq!(HOST_VERSION, 0x1_0001);
        assert_eq!(ChannelVersion::default().minor(), VERSION_MINOR);
    }
}
