//! What one run (one workload under one manager) leaves behind: a sample per second
//! (`<manager>.jsonl`) and the run's record (`<manager>.run.json`), written by the conductor
//! inside the emulated host and read by the report.

use crate::damon_tiering::{SchemeStats, Snapshot};
use crate::damon_watch::TraceStats;
use crate::host_stats::{Counters, CpuTime};
use crate::plan::Manager;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// One sample of a run, taken every second after the manager started.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RunSample {
    /// Seconds since the manager started.
    pub t_s: f64,
    /// The share of the workload's accesses in the last second served from DRAM, by the
    /// workload's ground truth (its map, or the TCG plugin's counts).
    pub dram_access_share: Option<f64>,
    /// The same from the workload's map and from the plugin, where each exists.
    pub map_share: Option<f64>,
    pub plugin_share: Option<f64>,
    /// Guest data accesses the plugin counted in the last second, and of them on DRAM.
    pub plugin_accesses: u64,
    pub plugin_dram_accesses: u64,
    /// GUPS: the share of its hot set in force on DRAM, and its other frames on DRAM.
    pub hot_dram_share: Option<f64>,
    pub other_dram_frames: Option<u64>,
    pub hot_set_moves: u32,
    /// All of the guest's RAM on DRAM nodes, and the limit every manager gets.
    pub guest_dram_bytes: u64,
    pub limit_bytes: u64,
    /// Free memory of the VM's DRAM node.
    pub dram_node_free_bytes: u64,
    /// Pages the kernel migrated since the run started (vmstat pgmigrate_success), in bytes:
    /// every manager's moves are counted here alike.
    pub migrated_bytes: u64,
    /// The manager's own count of what it promoted and demoted, bytes.
    pub promoted_bytes: u64,
    pub demoted_bytes: u64,
    /// The workload's rate (GUPS updates or key-value operations per second).
    pub ops_per_s: Option<u64>,
}

/// The DRAM the hog left the run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HogRecord {
    pub dram_node_held_bytes: u64,
    pub other_dram_node_held_bytes: u64,
    pub dram_node_free_bytes: u64,
    pub dram_node_high_watermark_bytes: u64,
}

/// CPU time over the run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CpuRecord {
    /// The nested QEMU process (its system time holds NUMA balancing's scans and hint faults).
    pub qemu: CpuTime,
    /// The kswapd threads (demotion).
    pub kswapd: CpuTime,
    /// DAMON's kdamonds on the host.
    pub kdamond_s: Option<f64>,
    /// vtismd.
    pub vtismd_s: Option<f64>,
    /// The tracker inside the guest (module thread, or agent and its kdamond), guest seconds.
    pub guest_tracker_s: Option<f64>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    pub workload: String,
    pub manager: Manager,
    /// Empty when the run went through; else what failed.
    pub error: Option<String>,
    /// What went wrong after the run's samples were taken (they stand).
    #[serde(default)]
    pub notes: Vec<String>,
    pub limit_bytes: u64,
    pub guest_frames: u64,
    pub workload_frames: u64,
    /// Seconds the workload took to populate its memory (GUPS) or load its data (redis).
    pub workload_ready_s: f64,
    pub run_s: f64,
    pub hog: HogRecord,
    /// vmstat counters over the run.
    pub vmstat: Counters,
    /// DAMOS statistics of the promotion and the demotion scheme.
    pub damos: Option<(SchemeStats, SchemeStats)>,
    /// vtismd's last status of the VM.
    pub vtismd: Option<serde_json::Value>,
    pub cpu: CpuRecord,
    pub samples: Vec<RunSample>,
    /// DAMON's regions at a few points: the `damon` run's kdamonds, and the probe after the
    /// `none` run (crate::damon_watch).
    #[serde(default)]
    pub damon: Vec<Snapshot>,
    /// DAMON's tracepoints summed per phase: the `damon` run's, the probe's.
    #[serde(default)]
    pub damon_trace: Vec<TraceStats>,
}

impl RunRecord {
    pub fn write(&self, dir: &Path) -> anyhow::Result<()> {
        let p = dir.join(format!("{}.run.json", self.manager.name()));
        std::fs::write(&p, serde_json::to_string_pretty(self)?)
            .map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))
    }

    pub fn read(path: &Path) -> anyhow::Result<RunRecord> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
    }
}
