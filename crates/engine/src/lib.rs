//! vtism tiering engine: turns hint rounds into a placement plan.
//!
//! Pure and deterministic: no syscalls, no clock (time is an argument), no global state. The host
//! daemon and the simulator drive the same code through the [`Policy`] trait.
//!
//! - [`topology`]: nodes, tiers, capacities, distances.
//! - [`folio`]: host folios (2 MiB blocks the host maps huge) and the rule that folds 4 KiB
//!   observations into them.
//! - [`hotness`]: the 4-byte per-frame state and the bucket key.
//! - [`vtism`]: the vtism policy (ingest, classify in O(frames), plan).
//! - [`pool`]: fast-memory quotas across VMs (island or pool mode).
//! - [`round`]: one tiering round (pool, plan, rate allowances, placement facts), the same for
//!   the daemon and the simulator.
//! - [`split_asks`]: when to ask again for a host folio khugepaged collapsed to be split.
//! - [`allowance`]: a plan cut to per-VM rate allowances, quota-safe.
//! - [`limits`]: the round's cadence and move rate limits (token buckets on the caller's clock).
//! - [`placement`]: placement facts and the one coalescer that makes runs of them.
//! - [`plan`]: moves in a quota-safe execution order, with statistics.
//! - [`synth`]: seeded synthetic workloads for tests, benchmarks and the demo.

pub mod allowance;
pub mod folio;
pub mod hotness;
pub mod limits;
pub mod params;
pub mod placement;
pub mod plan;
pub mod policy;
pub mod pool;
pub mod recent_moves;
pub mod round;
pub mod split_asks;
pub mod synth;
pub mod topology;
pub mod types;
pub mod vtism;

pub use allowance::{cut_to_allowances, trim_after_demote, Allowances, Cut};
pub use folio::HostFolios;
pub use limits::{MoveLimits, RoundLimits, TokenBucket};
pub use params::{EngineParams, ParamError};
pub use placement::{coalesce, Coalescer, PlacementRun};
pub use plan::{Direction, Move, MoveKind, Phase, Plan, PlanStats, VmPlanStats};
pub use policy::{EngineError, FrameAccess, IngestStats, Observation, PlanContext, Policy, VmSpec};
pub use pool::{FastPool, PoolError, PoolMode, PoolParams, QuotaChange, QuotaReason, VmLimits};
pub use round::{demand_ready, RoundError, RoundOutcome, Tiering};
pub use topology::{NodeSpec, Topology, TopologyError};
pub use types::{Nanos, NodeId, Tier, VmId};
pub use vtism::{SplitRequest, VmSummary, VtismPolicy};
