//! `vtism testbed`: boots an emulated host with two DRAM nodes and two CPU-less "CXL" nodes
//! (QEMU, HMAT), runs vtismd and a nested guest with the tracker module and a GUPS workload in
//! it, and reports from data whether the guest's hints moved its hot set into DRAM.
//!
//! Three parts: the driver (`run`: prepares, boots, streams progress, reports), the probe (runs
//! inside the emulated host and samples page placement and the daemon's status) and the report
//! (summary, checks, plots), which share the [`Sample`] record. The emulated host, the nested
//! guest's console and the placement query are shared with `vtism bakeoff`.

pub mod cli;
mod driver;
pub mod emulated_host;
pub mod guest_console;
mod host_blocks;
pub mod placement;
mod probe;
mod report;
mod settings;
pub mod vtismd;

pub use report::{Check, Phase, Sample};
pub use settings::{Profile, Settings};
