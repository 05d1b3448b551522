//! Small value types shared by the engine's model.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A NUMA node id as the kernel numbers it. The engine packs it in 6 bits, so ids are < 63.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct NodeId(pub u8);

impl NodeId {
    /// Largest node id the engine accepts (63 is its "placement unknown" marker).
    pub const MAX: u8 = 62;
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "node{}", self.0)
    }
}

/// Memory tier rank: 0 is the fastest tier (local DRAM); larger is slower.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Tier(pub u8);

impl Tier {
    pub const FAST: Tier = Tier(0);
    pub fn is_fast(self) -> bool {
        self == Tier::FAST
    }
}

/// A VM as the engine knows it: an opaque id chosen by the driver (daemon or simulator).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct VmId(pub u32);

impl fmt::Display for VmId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "vm{}", self.0)
    }
}

/// Time, passed in by the driver: nanoseconds since an epoch of its choosing. The engine never
/// reads a clock.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Nanos(pub u64);

impl Nanos {
    pub const fn from_secs(s: u64) -> Nanos {
        Nanos(s * 1_000_000_000)
    }
    pub const fn from_millis(ms: u64) -> Nanos {
        Nanos(ms * 1_000_000)
    }
    pub fn saturating_sub(self, o: Nanos) -> Nanos {
        Nanos(self.0.saturating_sub(o.0))
    }
    pub fn as_secs_f64(self) -> f64 {
        self.0 as f64 / 1e9
    }
}
