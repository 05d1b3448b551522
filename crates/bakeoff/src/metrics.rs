//! From a run's samples to the bake-off's figures: steady-state share of accesses served from
//! DRAM, time to 90% of it, bytes migrated, DRAM use against the limit, the manager's CPU time,
//! and for the promotion-speed experiment MB promoted per second.

use crate::plan::Manager;
use crate::record::{RunRecord, RunSample};
use serde::Serialize;

/// The steady state is the last fifth of the run, as `vtism sim` defines it.
const STEADY_FRACTION: f64 = 0.2;
const MIB: f64 = (1u64 << 20) as f64;

/// One (workload, manager) row of results.json.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Outcome {
    pub workload: String,
    pub manager: String,
    /// Share of the workload's accesses served from DRAM over the steady state (0-1).
    pub dram_access_share: Option<f64>,
    /// Seconds from the manager's start to 90% of that steady state (None: never, or no steady
    /// state to reach).
    pub t90_s: Option<f64>,
    /// With a moving hot set: seconds from the move to 90% of the steady state again.
    pub t90_after_move_s: Option<f64>,
    /// The share just before the move (the first hot set's steady state).
    pub share_before_move: Option<f64>,
    pub migrated_bytes: u64,
    pub promoted_bytes: u64,
    pub demoted_bytes: u64,
    pub max_guest_dram_bytes: u64,
    pub limit_bytes: u64,
    pub max_dram_over_limit_bytes: u64,
    /// Free memory on the VM's DRAM node when the run started, and the kernel's high watermark
    /// there (the hog aims at limit + watermark).
    pub dram_free_at_start_bytes: u64,
    pub dram_high_watermark_bytes: u64,
    /// The manager's CPU seconds over the run (how: docs/bakeoff.md, "CPU time").
    pub manager_cpu_s: Option<f64>,
    /// How `manager_cpu_s` was taken.
    pub cpu_basis: String,
    pub run_s: f64,
    /// GUPS: share of the hot set on DRAM over the steady state.
    pub hot_set_dram_share: Option<f64>,
    /// Mean workload rate over the run (GUPS updates/s or key-value ops/s).
    pub mean_ops_per_s: Option<f64>,
    pub error: Option<String>,
}

/// One row of the promotion-speed experiment.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct PromoteSpeed {
    pub manager: String,
    /// MB (10^6 B) on DRAM when 90% of the most the run held there was reached, over the time
    /// it took.
    pub promote_mb_per_s: Option<f64>,
    /// The best 10-second rate of growth of the guest's DRAM, MB/s.
    pub peak_promote_mb_per_s: Option<f64>,
    /// The most of the guest on DRAM at any sample, and at the last one: they differ for a
    /// manager that demotes what it promoted (DAMON's two schemes).
    pub max_dram_mib: f64,
    pub end_dram_mib: f64,
    /// Seconds to 90% of the most.
    pub t90_s: Option<f64>,
    pub error: Option<String>,
}

fn steady(s: &[RunSample]) -> &[RunSample] {
    let n = ((s.len() as f64) * STEADY_FRACTION).ceil() as usize;
    &s[s.len().saturating_sub(n.max(1))..]
}

/// The steady-state share: access-weighted for the plugin's counts (a second with more
/// accesses counts more), a plain mean of the per-second shares otherwise.
pub fn steady_share(samples: &[RunSample]) -> Option<f64> {
    let st = steady(samples);
    let acc: u64 = st.iter().map(|x| x.plugin_accesses).sum();
    if acc > 0
        && st
            .iter()
            .all(|x| x.plugin_share.is_some() || x.plugin_accesses == 0)
    {
        let dram: u64 = st.iter().map(|x| x.plugin_dram_accesses).sum();
        return Some(dram as f64 / acc as f64);
    }
    mean(st.iter().filter_map(|x| x.dram_access_share))
}

fn mean(v: impl Iterator<Item = f64>) -> Option<f64> {
    let (s, n) = v.fold((0.0, 0usize), |(s, n), x| (s + x, n + 1));
    (n > 0).then(|| s / n as f64)
}

/// First time at or after `from` where the share reaches 90% of `target`, relative to `from`.
fn t90(samples: &[RunSample], target: f64, from: f64) -> Option<f64> {
    if target < 0.01 {
        return None;
    }
    samples
        .iter()
        .filter(|x| x.t_s >= from)
        .find(|x| x.dram_access_share.is_some_and(|v| v >= 0.9 * target))
        .map(|x| x.t_s - from)
}

/// The manager's CPU time: vtism's daemon and its guest tracker; DAMON's kdamonds; for the
/// kernel's NUMA balancing the system time it adds to the QEMU process (scans and hint faults
/// run in the task's context) and to kswapd (demotion) over the `none` run of the same boot,
/// scaled to the run's length.
fn manager_cpu(r: &RunRecord, baseline: Option<&RunRecord>) -> (Option<f64>, String) {
    match r.manager {
        Manager::None => (Some(0.0), "nothing runs".into()),
        Manager::Damon => (r.cpu.kdamond_s, "the two kdamonds' CPU time".into()),
        Manager::VtismModule | Manager::VtismDamon => {
            let host = r.cpu.vtismd_s.unwrap_or(0.0);
            match r.cpu.guest_tracker_s {
                Some(guest) => (
                    r.cpu.vtismd_s.map(|_| host + guest),
                    format!("vtismd {host:.2} s + the guest's tracker {guest:.2} s"),
                ),
                None => (
                    r.cpu.vtismd_s,
                    format!(
                        "vtismd {host:.2} s; the guest's tracker not measured (the guest did not \
                         answer in time)"
                    ),
                ),
            }
        }
        Manager::Autonuma | Manager::Tiering => match baseline {
            Some(b) if b.run_s > 0.0 => {
                let k = r.run_s / b.run_s;
                let qemu = r.cpu.qemu.system_s - k * b.cpu.qemu.system_s;
                let kswapd = r.cpu.kswapd.total() - k * b.cpu.kswapd.total();
                (
                    Some((qemu + kswapd).max(0.0)),
                    format!(
                        "QEMU system time {:.2} s and kswapd {:.2} s over the none run's",
                        qemu, kswapd
                    ),
                )
            }
            _ => (
                Some(r.cpu.qemu.system_s + r.cpu.kswapd.total()),
                "QEMU system time and kswapd, all of it (no none run to subtract)".into(),
            ),
        },
    }
}

pub fn outcome(r: &RunRecord, baseline: Option<&RunRecord>) -> Outcome {
    let s = &r.samples;
    let share = steady_share(s);
    let move_t = s.iter().find(|x| x.hot_set_moves > 0).map(|x| x.t_s);
    let target = share.unwrap_or(0.0);
    let (cpu, basis) = manager_cpu(r, baseline);
    let max_dram = s.iter().map(|x| x.guest_dram_bytes).max().unwrap_or(0);
    let last = s.last();
    Outcome {
        workload: r.workload.clone(),
        manager: r.manager.name().into(),
        dram_access_share: share,
        t90_s: t90(s, target, 0.0),
        t90_after_move_s: move_t.and_then(|m| t90(s, target, m)),
        share_before_move: move_t.and_then(|m| {
            let before: Vec<RunSample> = s.iter().filter(|x| x.t_s < m).cloned().collect();
            steady_share(&before)
        }),
        migrated_bytes: last.map_or(0, |x| x.migrated_bytes),
        promoted_bytes: last.map_or(0, |x| x.promoted_bytes),
        demoted_bytes: last.map_or(0, |x| x.demoted_bytes),
        max_guest_dram_bytes: max_dram,
        limit_bytes: r.limit_bytes,
        max_dram_over_limit_bytes: max_dram.saturating_sub(r.limit_bytes),
        dram_free_at_start_bytes: r.hog.dram_node_free_bytes,
        dram_high_watermark_bytes: r.hog.dram_node_high_watermark_bytes,
        manager_cpu_s: cpu,
        cpu_basis: basis,
        run_s: r.run_s,
        hot_set_dram_share: mean(steady(s).iter().filter_map(|x| x.hot_dram_share)),
        mean_ops_per_s: mean(s.iter().filter_map(|x| x.ops_per_s.map(|v| v as f64))),
        error: r.error.clone(),
    }
}

pub fn promote_speed(r: &RunRecord) -> PromoteSpeed {
    let s = &r.samples;
    let most = s.iter().map(|x| x.guest_dram_bytes).max().unwrap_or(0) as f64;
    let end = s.last().map_or(0, |x| x.guest_dram_bytes) as f64;
    let start = s.first().map_or(0, |x| x.guest_dram_bytes) as f64;
    let reached = s
        .iter()
        .find(|x| most > start && x.guest_dram_bytes as f64 >= start + 0.9 * (most - start));
    let peak = s
        .windows(11)
        .map(|w| {
            let (a, b) = (&w[0], &w[10]);
            (b.guest_dram_bytes as f64 - a.guest_dram_bytes as f64) / (b.t_s - a.t_s).max(1e-9)
        })
        .fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x))));
    PromoteSpeed {
        manager: r.manager.name().into(),
        promote_mb_per_s: reached
            .filter(|x| x.t_s > 0.0)
            .map(|x| (x.guest_dram_bytes as f64 - start) / 1e6 / x.t_s),
        peak_promote_mb_per_s: peak.map(|p| p.max(0.0) / 1e6),
        max_dram_mib: most / MIB,
        end_dram_mib: end / MIB,
        t90_s: reached.map(|x| x.t_s),
        error: r.error.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{CpuRecord, HogRecord};

    fn rec(m: Manager, shares: &[f64]) -> RunRecord {
        RunRecord {
            workload: "w".into(),
            manager: m,
            error: None,
            notes: Vec::new(),
            limit_bytes: 20 << 20,
            guest_frames: 65536,
            workload_frames: 24576,
            workload_ready_s: 10.0,
            run_s: shares.len() as f64,
            hog: HogRecord::default(),
            vmstat: Default::default(),
            damos: None,
            vtismd: None,
            cpu: CpuRecord::default(),
            samples: shares
                .iter()
                .enumerate()
                .map(|(i, &v)| RunSample {
                    t_s: (i + 1) as f64,
                    dram_access_share: Some(v),
                    guest_dram_bytes: (v * 22.0 * MIB) as u64,
                    migrated_bytes: i as u64 * 4096,
                    ..Default::default()
                })
                .collect(),
            damon: Vec::new(),
            damon_trace: Vec::new(),
        }
    }

    #[test]
    fn steady_state_time_to_90_and_limit() {
        let shares: Vec<f64> = (0..100).map(|i| (i as f64 / 20.0).min(1.0)).collect();
        let o = outcome(&rec(Manager::VtismModule, &shares), None);
        assert!((o.dram_access_share.unwrap() - 1.0).abs() < 1e-9);
        assert_eq!(
            o.t90_s,
            Some(19.0),
            "0.9 is reached at the 19th sample: {o:?}"
        );
        assert_eq!(o.migrated_bytes, 99 * 4096);
        assert_eq!(o.max_dram_over_limit_bytes, 2 << 20);
        let none = outcome(&rec(Manager::None, &[0.0; 50]), None);
        assert_eq!((none.t90_s, none.manager_cpu_s), (None, Some(0.0)));
    }

    #[test]
    fn kernel_cpu_is_counted_over_the_none_run() {
        let mut none = rec(Manager::None, &[0.0; 100]);
        none.cpu.qemu.system_s = 2.0;
        let mut t = rec(Manager::Tiering, &[0.5; 200]);
        t.cpu.qemu.system_s = 10.0;
        t.cpu.kswapd.system_s = 1.0;
        let o = outcome(&t, Some(&none));
        assert!((o.manager_cpu_s.unwrap() - 7.0).abs() < 1e-9, "{o:?}");
    }

    #[test]
    fn promotion_speed() {
        let mut r = rec(Manager::Tiering, &[0.0; 40]);
        for (i, s) in r.samples.iter_mut().enumerate() {
            s.guest_dram_bytes = ((i as u64).min(20)) * 4_000_000;
        }
        let p = promote_speed(&r);
        // 90% of 80 MB at t = 19 s (72 MB reached at sample index 18)
        assert_eq!(p.t90_s, Some(19.0));
        assert!((p.promote_mb_per_s.unwrap() - 72.0 / 19.0).abs() < 1e-9);
        assert!((p.peak_promote_mb_per_s.unwrap() - 4.0).abs() < 1e-9);
        assert_eq!(p.max_dram_mib, p.end_dram_mib);
    }

    #[test]
    fn a_manager_that_demotes_what_it_promoted_ends_below_its_most() {
        let mut r = rec(Manager::Damon, &[0.0; 30]);
        for (i, s) in r.samples.iter_mut().enumerate() {
            let mib = if i < 10 { i as u64 * 10 } else { 60 };
            s.guest_dram_bytes = mib << 20;
        }
        let p = promote_speed(&r);
        assert_eq!(p.max_dram_mib, 90.0);
        assert_eq!(p.end_dram_mib, 60.0);
    }
}
