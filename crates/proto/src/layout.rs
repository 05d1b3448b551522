//! Channel v1.0 layout constants and the small types both sides share (docs/channel.md, "Layout").

use serde::{Deserialize, Serialize};

/// `VTISMCH1` read as a little-endian u64.
pub const MAGIC: u64 = 0x3148_434D_5349_5456;
pub const VERSION_MAJOR: u16 = 1;
pub const VERSION_MINOR: u16 = 0;
pub const HEADER_SIZE: u32 = 4096;
pub const ENTRIES_OFFSET: u32 = 4096;
pub const ENTRY_SIZE: u32 = 8;
pub const PAGE_SHIFT: u32 = 12;
/// What this crate's reader writes into `host_version`: `major << 16 | minor`.
pub const HOST_VERSION: u32 = (VERSION_MAJOR as u32) << 16 | VERSION_MINOR as u32;

/// Publication flag: the guest found more hot frames than it published.
pub const FLAG_OVERFLOW: u32 = 1;
/// Flags a v1.0 writer may set.
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
    pub const RESERVED0: usize = 0x030;
    pub const SEQ: usize = 0x040;
    pub const ROUND: usize = 0x048;
    pub const COUNT: usize = 0x050;
    pub const FLAGS: usize = 0x058;
    pub const SCAN_INTERVAL_MS: usize = 0x05C;
    pub const SCAN_DURATION_US: usize = 0x060;
    pub const RESERVED1: usize = 0x064;
    pub const TRACKED_BYTES: usize = 0x068;
    pub const HOT_FRAMES: usize = 0x070;
    pub const PUBLISH_TIME_NS: usize = 0x078;
    pub const RESERVED2: usize = 0x080;
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
