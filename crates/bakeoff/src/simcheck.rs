//! The simulator as the bake-off's second judge: `vtism sim` on workload models shaped like the
//! bake-off's (sizes, hot shares, move time, DRAM limit, run length, starting on slow memory),
//! with the policies that model the bake-off's managers.

use crate::plan::{Manager, Shape, Workload};
use serde::Serialize;
use vtism_sim::{cli, model::MemoryModel, sim::SimConfig, workload};

/// The simulator's policy standing for a bake-off manager (DAMON-based tiering has no model).
pub fn sim_policy(m: Manager) -> Option<&'static str> {
    match m {
        Manager::None => Some("static"),
        Manager::Autonuma => Some("autonuma"),
        Manager::Tiering => Some("tpp"),
        Manager::Damon => None,
        // Both trackers are modelled by the module's A-bit scan with the adaptive interval.
        Manager::VtismModule | Manager::VtismDamon => Some("vtism"),
    }
}

/// The simulator's model of a bake-off workload.
pub fn sim_scenario(w: &Workload) -> Option<&'static str> {
    match w.shape {
        Shape::Gups { hot_mib, mib, .. } if hot_mib == mib => None,
        Shape::Gups { move_after_s, .. } if move_after_s > 0 => Some("bakeoff-gups-move"),
        Shape::Gups { .. } => Some("bakeoff-gups"),
        Shape::Redis { .. } => Some("bakeoff-kv"),
    }
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SimRow {
    pub workload: String,
    pub scenario: String,
    pub policy: String,
    /// Share of accesses served from the fast tier over the last fifth of the run.
    pub fast_hit: f64,
    pub t90_s: Option<f64>,
    pub migrated_bytes: u64,
    pub tracking_overhead: f64,
}

/// Runs the simulator's policies for the workload's managers; None if it has no model.
pub fn run(w: &Workload) -> anyhow::Result<Option<Vec<SimRow>>> {
    let Some(scenario) = sim_scenario(w) else {
        return Ok(None);
    };
    let mut cfg = SimConfig::new(MemoryModel::preset("cxl").expect("the cxl preset"));
    cfg.unit_bytes = 4096;
    cfg.duration_s = w.run_s as f64;
    let wls = workload::scenario(scenario, 1.0, cfg.duration_s, cfg.seed)?;
    let footprint = wls.iter().map(|v| v.footprint_bytes).sum::<u64>() as f64;
    let fast = (w.dram_limit_mib << 20) as f64;
    cfg.slow_per_fast = ((footprint - fast) / fast).max(0.0);
    cfg.validate()?;
    let mut policies: Vec<&str> = w.managers.iter().filter_map(|&m| sim_policy(m)).collect();
    policies.dedup();
    let mut rows = Vec::new();
    for p in policies {
        let r = cli::run_one(&cfg, &wls, p, None, None)?;
        let hits: Vec<(f64, f64)> = r
            .samples
            .iter()
            .map(|s| (s.t, s.hit.first().copied().unwrap_or(0.0)))
            .collect();
        let tail = (hits.len() / 5).max(1);
        let steady = hits[hits.len().saturating_sub(tail)..]
            .iter()
            .map(|h| h.1)
            .sum::<f64>()
            / tail as f64;
        rows.push(SimRow {
            workload: w.name.clone(),
            scenario: scenario.into(),
            policy: p.into(),
            fast_hit: steady,
            t90_s: (steady >= 0.01)
                .then(|| hits.iter().find(|h| h.1 >= 0.9 * steady).map(|h| h.0))
                .flatten(),
            migrated_bytes: r.migrated_bytes(),
            tracking_overhead: r.tracking_overhead(),
        });
    }
    Ok(Some(rows))
}
