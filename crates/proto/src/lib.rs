//! vtism hint channel v1: the format through which a guest tells the host which of its
//! guest-physical frames are hot (normative spec: docs/channel.md).
//!
//! The guest is untrusted: [`ChannelReader`] snapshots a round out of shared memory and validates
//! every field of the copy before anything else sees it. [`ChannelWriter`] is the guest side.

pub mod addr;
pub mod count;
pub mod entry;
pub mod layout;
pub mod ram_map;
pub mod reader;
pub mod region;
pub mod writer;

pub use addr::{Gfn, Gpa, Hva, FRAME_SHIFT, FRAME_SIZE, HUGE_FRAMES};
pub use count::CountMeaning;
pub use entry::{HintEntry, PageType};
pub use layout::{ChannelVersion, Feedback, Micros, Tracker, TrackerReport, HOST_VERSION};
pub use ram_map::{GfnRange, RamMap, RamMapError};
pub use reader::{
    read_feedback, validate_entries, write_feedback, ChannelError, ChannelReader, HintRound,
    LayoutField, RejectCounters, RejectReason,
};
pub use region::{AccessError, MmapRegion, OwnedRegion, RegionError, SharedRegion};
pub use writer::{ChannelWriter, Published, RoundMeta, WriterConfig, WriterError};
