//! The interface every placement policy implements: the vtism engine, and the simulator's
//! peers (TPP, HMM-V, Memtis, ...). Same inputs, same output.

use crate::plan::Plan;
use crate::types::{Nanos, NodeId, VmId};
use serde::{Deserialize, Serialize};
use thiserror::Error;
use vtism_proto::{CountMeaning, Gfn, HintEntry, PageType, RamMap};

/// A VM as a policy sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmSpec {
    pub id: VmId,
    /// Guest RAM (from QEMU's memory map on a real host).
    pub ram: RamMap,
    /// Bytes of fast memory the VM may occupy.
    pub fast_quota_bytes: u64,
    /// The node its vCPUs run on, if known: promotions prefer fast nodes near it.
    pub home_node: Option<NodeId>,
}

/// Per-frame access counts as a host-side mechanism sees them over an interval (the simulator's
/// models of hint faults, PEBS sampling or host page-table scans).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameAccess {
    pub gfn: Gfn,
    pub reads: u32,
    pub writes: u32,
    pub page_type: PageType,
}

/// What a tracking mechanism reports about one VM.
#[derive(Clone, Copy, Debug)]
pub enum Observation<'a> {
    /// One validated hint round from the guest's channel.
    Hints {
        entries: &'a [HintEntry],
        overflow: bool,
        /// What the entries' `count` means (the writer's channel minor version).
        counts: CountMeaning,
    },
    /// Access counts observed on the host side.
    Accesses(&'a [FrameAccess]),
}

/// What the driver knows when it asks for a plan.
#[derive(Clone, Copy, Debug, Default)]
pub struct PlanContext<'a> {
    /// Bytes each node can take without falling under its watermark, as observed now. Nodes not
    /// listed are assumed to have their capacity minus what the policy's VMs hold there.
    pub node_free_bytes: &'a [(NodeId, u64)],
    /// Overrides the configured per-round budget (the daemon's rate limiter lowers it).
    pub budget_bytes: Option<u64>,
    /// Bytes to free on fast nodes whose free memory fell below the driver's watermark (others
    /// filled them): the policy demotes its VMs' coldest frames there first, at most this much.
    pub node_short_bytes: &'a [(NodeId, u64)],
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct IngestStats {
    pub entries: u64,
    /// Entries applied to a frame (duplicates included).
    pub applied: u64,
    /// Entries outside the VM's RAM map (the channel reader rejects these first; counted here as
    /// defence in depth, never acted on).
    pub ignored: u64,
    /// 4 KiB entries covered by a 2 MiB unit hinted in the same round.
    pub covered_by_huge: u64,
    /// 2 MiB entries of a unit already hinted in the same round (merged per unit, not per
    /// frame: a round of duplicate units costs what one of each costs).
    pub duplicate_units: u64,
    /// Passes over a 2 MiB unit's 512 frames: at most three per unit hinted in the round (its
    /// first entry, the first duplicate with a page type, the merge of the other duplicates).
    pub unit_passes: u64,
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum EngineError {
    #[error("{0} is not known to the engine")]
    UnknownVm(VmId),
    #[error("{0} is already known to the engine")]
    DuplicateVm(VmId),
    #[error("{vm} has {frames} frames; the engine handles at most 2^32 per VM (16 TiB)")]
    VmTooLarge { vm: VmId, frames: u64 },
    #[error("{vm}: frames {gfn}+{frames} are not all RAM of the VM")]
    OutOfMap { vm: VmId, gfn: Gfn, frames: u64 },
    #[error("{0} is not a node of the topology")]
    UnknownNode(NodeId),
    #[error("{vm}: the fast-memory pool refused: {problem}")]
    PoolRefused { vm: VmId, problem: String },
}

/// A placement policy. Drivers (the daemon, the simulator) feed it observations and placement
/// facts and execute the plans it returns; it performs no I/O and reads no clock.
pub trait Policy {
    fn name(&self) -> &str;
    fn add_vm(&mut self, spec: VmSpec) -> Result<(), EngineError>;
    fn remove_vm(&mut self, vm: VmId) -> Result<(), EngineError>;
    fn set_quota(&mut self, vm: VmId, fast_quota_bytes: u64) -> Result<(), EngineError>;
    fn observe(
        &mut self,
        vm: VmId,
        obs: Observation<'_>,
        now: Nanos,
    ) -> Result<IngestStats, EngineError>;
    /// Frames `[gfn, gfn + frames)` are on `node` (`None`: not present / unknown). The driver calls
    /// this for what it learns (reconciliation, failed moves); moves of a returned plan are
    /// assumed done and need no call.
    fn set_placement(
        &mut self,
        vm: VmId,
        gfn: Gfn,
        frames: u64,
        node: Option<NodeId>,
    ) -> Result<(), EngineError>;
    fn plan(&mut self, ctx: &PlanContext<'_>, now: Nanos) -> Plan;
    /// The VM's fast quota now, for reports (`None`: the policy does not track one).
    fn fast_quota(&self, _vm: VmId) -> Option<u64> {
        None
    }
}
