//! vtism simulator: runs placement policies (vtism's engine and its peers') against memory and
//! workload models. The model and its limits are documented in docs/evaluation.md.
//!
//! - [`model`]: memory tiers (presets and TOML), migration and tracking costs.
//! - [`host_folios`]: the host's pages (`--host-pages`): whole-folio moves, splits, khugepaged.
//! - [`workload`]: seeded workload generators, as per-unit access shares over time.
//! - [`trace`]: the recorded hint-stream format and its replay.
//! - [`mechanism`]: what each tracking mechanism sees and costs.
//! - [`rate`]: the guest module's rate arithmetic, its own C (guest/module/vtism_rate.c).
//! - [`budget`]: the guest module's CPU budget, its own C (guest/module/vtism_budget.c).
//! - [`window_tracker`]: vtism's guest module as built, per placement unit.
//! - [`policies`]: vtism, the bounds and the peers.
//! - [`sim`]: the epoch loop, throughput model and plan execution.
//! - [`report`]: comparison tables, CSV timelines, SVG plots and the Markdown report.

pub mod budget;
pub mod cli;
pub mod host_folios;
pub mod mechanism;
pub mod model;
pub mod policies;
pub mod rate;
pub mod report;
pub mod sim;
pub mod svg;
pub mod trace;
pub mod window_tracker;
pub mod workload;
