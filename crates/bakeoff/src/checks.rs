//! What the smoke run asserts (`vtism bakeoff --smoke --check`, for `make test`): that the
//! machinery works, not who wins. Each run went through with a sample every second; each manager
//! really acted (the kernel's counters, DAMOS' stats, vtismd's moves); vtism kept its quota; and
//! the ground truth was seen (the workload's map covers its region).

use crate::plan::Manager;
use crate::record::RunRecord;

#[derive(Clone, Debug, PartialEq)]
pub struct Check {
    pub name: String,
    pub ok: bool,
    pub detail: String,
}

fn check(name: String, ok: bool, detail: String) -> Check {
    Check { name, ok, detail }
}

pub fn checks(records: &[RunRecord], managers: &[Manager], run_s: u64) -> Vec<Check> {
    let mut out = Vec::new();
    for &m in managers {
        let n = m.name();
        let Some(r) = records.iter().find(|r| r.manager == m) else {
            out.push(check(format!("{n}: ran"), false, "no record".into()));
            continue;
        };
        if let Some(e) = &r.error {
            out.push(check(format!("{n}: ran"), false, e.clone()));
            continue;
        }
        // One sample a second, a few lost to a loaded machine at most.
        let want = (run_s as f64 * 0.8) as usize;
        out.push(check(
            format!("{n}: sampled the whole run"),
            r.samples.len() >= want && r.samples.iter().all(|x| x.dram_access_share.is_some()),
            format!(
                "{} samples over {:.0} s (want >= {want})",
                r.samples.len(),
                r.run_s
            ),
        ));
        out.push(check(
            format!("{n}: the ground truth covers the workload"),
            r.workload_frames > 0 && r.samples.iter().all(|x| x.hot_dram_share.is_some()),
            format!(
                "{} workload frames of {} guest frames",
                r.workload_frames, r.guest_frames
            ),
        ));
        let v = |k: &str| r.vmstat.get(k).copied().unwrap_or(0);
        let last = r.samples.last();
        let (acted, detail) = match m {
            Manager::None => (true, "nothing to do".into()),
            Manager::Autonuma => (
                v("numa_hint_faults") > 0 && v("numa_pages_migrated") > 0,
                format!(
                    "numa_hint_faults {}, numa_pages_migrated {}",
                    v("numa_hint_faults"),
                    v("numa_pages_migrated")
                ),
            ),
            Manager::Tiering => (
                v("numa_hint_faults") > 0 && v("pgpromote_success") > 0,
                format!(
                    "numa_hint_faults {}, pgpromote_candidate {}, pgpromote_success {}, pgdemote_kswapd {}",
                    v("numa_hint_faults"),
                    v("pgpromote_candidate"),
                    v("pgpromote_success"),
                    v("pgdemote_kswapd")
                ),
            ),
            Manager::Damon => match &r.damos {
                Some((p, d)) => (
                    p.nr_tried > 0 && p.sz_applied > 0,
                    format!(
                        "DAMOS promote tried {} applied {} B, demote tried {} applied {} B",
                        p.nr_tried, p.sz_applied, d.nr_tried, d.sz_applied
                    ),
                ),
                None => (false, "no DAMOS statistics".into()),
            },
            Manager::VtismModule | Manager::VtismDamon => {
                let rounds = r
                    .vtismd
                    .as_ref()
                    .and_then(|s| s["rounds_accepted"].as_u64())
                    .unwrap_or(0);
                let promoted = last.map_or(0, |x| x.promoted_bytes);
                (
                    rounds > 0 && promoted > 0,
                    format!("hint rounds accepted {rounds}, promoted {promoted} B"),
                )
            }
        };
        out.push(check(format!("{n}: the manager acted"), acted, detail));
        if m.is_vtism() {
            let worst = r
                .samples
                .iter()
                .map(|x| x.guest_dram_bytes)
                .max()
                .unwrap_or(0);
            out.push(check(
                format!("{n}: the guest's DRAM stays within the quota"),
                worst <= r.limit_bytes,
                format!(
                    "max {:.1} MiB against {:.0} MiB",
                    worst as f64 / (1u64 << 20) as f64,
                    r.limit_bytes as f64 / (1u64 << 20) as f64
                ),
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{CpuRecord, HogRecord, RunSample};

    fn rec(m: Manager) -> RunRecord {
        let mut vmstat = crate::host_stats::Counters::new();
        vmstat.insert("numa_hint_faults".into(), 100);
        vmstat.insert("pgpromote_success".into(), 10);
        RunRecord {
            workload: "gups-hotset".into(),
            manager: m,
            error: None,
            notes: Vec::new(),
            limit_bytes: 20 << 20,
            guest_frames: 65536,
            workload_frames: 24576,
            workload_ready_s: 10.0,
            run_s: 60.0,
            hog: HogRecord::default(),
            vmstat,
            damos: None,
            vtismd: Some(serde_json::json!({"rounds_accepted": 5})),
            cpu: CpuRecord::default(),
            samples: (0..60)
                .map(|i| RunSample {
                    t_s: i as f64,
                    dram_access_share: Some(0.5),
                    hot_dram_share: Some(0.5),
                    guest_dram_bytes: 10 << 20,
                    promoted_bytes: 10 << 20,
                    ..Default::default()
                })
                .collect(),
            damon: Vec::new(),
            damon_trace: Vec::new(),
        }
    }

    #[test]
    fn a_good_smoke_passes_and_failures_are_caught() {
        let ms = [Manager::Tiering, Manager::VtismModule];
        let good = vec![rec(Manager::Tiering), rec(Manager::VtismModule)];
        let c = checks(&good, &ms, 60);
        assert!(c.iter().all(|c| c.ok), "{c:#?}");
        assert_eq!(c.len(), 7);
        let mut bad = good.clone();
        bad[0].vmstat.insert("pgpromote_success".into(), 0);
        bad[1].samples[30].guest_dram_bytes = (20 << 20) + 4096;
        bad[1].samples.truncate(20);
        let failed: Vec<String> = checks(&bad, &ms, 60)
            .into_iter()
            .filter(|c| !c.ok)
            .map(|c| c.name)
            .collect();
        assert_eq!(
            failed,
            vec![
                "tiering: the manager acted",
                "vtism-module: sampled the whole run",
            ]
        );
        let c = checks(&good[..1], &ms, 60);
        assert!(c.iter().any(|c| !c.ok && c.name == "vtism-module: ran"));
    }
}
