//! vtism hint channel v1: the format through which a guest tells the host which of its
//! guest-physical frames are hot (normative spec: docs/channel.md).
//!
//! The guest is untrusted: [`ChannelReader`] snapshots a round out of shared memory and validates
//! every field of the copy before anything else sees it.

pub mod addr;
pub mod entry;
pub mod ram_map;

pub use addr::{Gfn, Gpa, Hva, FRAME_SHIFT, FRAME_SIZE, HUGE_FRAMES};
pub use entry::{HintEntry, PageType};
pub use ram_map::{GfnRange, RamMap, RamMapError};
