//! vtism tiering engine: turns hint rounds into a placement plan.
//!
//! Pure and deterministic: no syscalls, no clock (time is an argument), no global state. The host
//! daemon and the simulator drive the same code through the [`Policy`] trait.
//!
//! - [`topology`]: nodes, tiers, capacities, distances.
//! - [`hotness`]: the 4-byte per-frame state and the bucket key.
//! - [`vtism`]: the vtism policy (ingest, classify in O(frames), plan).
//! - [`pool`]: fast-memory quotas across VMs (island or pool mode).
//! - [`plan`]: moves in a quota-safe execution order, with statistics.
//! - [`synth`]: seeded synthetic workloads for tests, benchmarks and the demo.

pub mod hotness;
pub mod params;
pub mod plan;
pub mod policy;
pub mod pool;
pub mod synth;
pub mod topology;
pub mod types;
pub mod vtism;

pub use params::{EngineParams, ParamError};
pub use plan::{Move, MoveKind, Phase, Plan, PlanStats, VmPlanStats};
pub use policy::{EngineError, FrameAccess, IngestStats, Observation, PlanContext, Policy, VmSpec};
pub use pool::{FastPool, PoolError, PoolMode, PoolParams, QuotaChange, QuotaReason, VmLimits};
pub use topology::{NodeSpec, Topology, TopologyError};
pub use types::{Nanos, NodeId, Tier, VmId};
pub use vtism::{VmSummary, VtismPolicy};
