//! `vtism bakeoff`: vtism against Linux's own tiering (AutoNUMA, the memory-tiering mode) and
//! DAMON-based tiering, on the testbed's emulated DRAM+CXL host, with the same nested guest and
//! the same workloads for every manager (docs/bakeoff.md).
//!
//! The driver ([`driver`]) boots the emulated host once per workload; inside it the conductor
//! ([`conduct`]) runs the nested guest ([`nested_guest`]) and each manager ([`managers`], with the
//! host's DAMON tiering in [`damon_tiering`] and the DRAM every manager gets held by [`hog`]) in
//! turn, sampling into [`record`]s; [`metrics`], [`report`] and [`simcheck`] turn them into the
//! docs.

pub mod checks;
pub mod cli;
pub mod conduct;
pub mod damon_tiering;
pub mod damon_watch;
pub mod driver;
pub mod hog;
pub mod host_stats;
pub mod managers;
pub mod metrics;
pub mod nested_guest;
pub mod plan;
pub mod record;
pub mod report;
pub mod simcheck;
