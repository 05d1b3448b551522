//! Comparison tables, CSV timelines, SVG plots and the Markdown report.

use crate::sim::RunResult;
use crate::svg::{Heatmap, LineChart, Series};
use serde::Serialize;
use std::fmt::Write as _;
use std::path::Path;

/// One row of the comparison table.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub policy: String,
    /// Accesses over the run relative to all-fast.
    pub throughput: f64,
    /// Mean relative throughput over the last 20% of the run.
    pub steady: f64,
    pub fast_hit: f64,
    /// Seconds until the relative throughput first reaches 90% of its steady state.
    pub t90_s: Option<f64>,
    pub migrated_bytes: u64,
    /// Thread time lost to tracking and to migration, fraction.
    pub tracking_overhead: f64,
    pub migration_overhead: f64,
    pub wall_secs: f64,
}

/// Per-sample throughput relative to the reference run.
pub fn relative_series(r: &RunResult, reference: &RunResult) -> Vec<(f64, f64)> {
    r.samples
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let base = reference
                .samples
                .get(i)
                .map_or(0.0, |b| b.tput.iter().sum());
            let v: f64 = s.tput.iter().sum();
            (s.t, if base > 0.0 { v / base } else { 0.0 })
        })
        .collect()
}

pub fn row(r: &RunResult, reference: &RunResult) -> Row {
    let rel = relative_series(r, reference);
    let tail = (rel.len() / 5).max(1);
    let steady = rel[rel.len().saturating_sub(tail)..]
        .iter()
        .map(|p| p.1)
        .sum::<f64>()
        / tail as f64;
    let t90 = rel.iter().find(|p| p.1 >= 0.9 * steady).map(|p| p.0);
    let base = reference.accesses();
    Row {
        policy: r.policy.clone(),
        throughput: if base > 0.0 { r.accesses() / base } else { 0.0 },
        steady,
        fast_hit: r.fast_hit(),
        t90_s: t90,
        migrated_bytes: r.migrated_bytes(),
        tracking_overhead: r.tracking_overhead(),
        migration_overhead: r.migration_overhead(),
        wall_secs: r.wall_secs,
    }
}

fn gib(b: u64) -> f64 {
    b as f64 / (1u64 << 30) as f64
}

/// The comparison as a Markdown table (also readable as plain text).
pub fn table(rows: &[Row]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "| policy | throughput vs all-fast | steady state | fast hit ratio | time to 90% (s) | migrated (GiB) | tracking overhead | migration overhead |"
    );
    let _ = writeln!(
        s,
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    );
    for r in rows {
        let _ = writeln!(
            s,
            "| {} | {:.3} | {:.3} | {:.1}% | {} | {:.2} | {:.2}% | {:.2}% |",
            r.policy,
            r.throughput,
            r.steady,
            r.fast_hit * 100.0,
            r.t90_s.map_or("-".into(), |t| format!("{t:.0}")),
            gib(r.migrated_bytes),
            r.tracking_overhead * 100.0,
            r.migration_overhead * 100.0
        );
    }
    s
}

/// Per VM: accesses relative to the same VM under the reference (all-fast), their geometric mean
/// and the total, and each VM's fast quota at the end of the run.
pub fn per_vm_table(results: &[RunResult], reference: &RunResult) -> String {
    let mut s = String::new();
    let names: Vec<&str> = reference.vms.iter().map(|v| v.name.as_str()).collect();
    let _ = writeln!(
        s,
        "| policy | {} | geomean | total | {} |",
        names.join(" | "),
        names
            .iter()
            .map(|n| format!("{n} quota"))
            .collect::<Vec<_>>()
            .join(" | ")
    );
    let _ = writeln!(s, "| --- |{}", " ---: |".repeat(2 * names.len() + 2));
    let base = reference.accesses();
    for r in results {
        let rel: Vec<f64> = r
            .vms
            .iter()
            .zip(&reference.vms)
            .map(|(v, b)| {
                if b.accesses > 0.0 {
                    v.accesses / b.accesses
                } else {
                    0.0
                }
            })
            .collect();
        let geo = (rel.iter().map(|x| x.max(1e-12).ln()).sum::<f64>() / rel.len() as f64).exp();
        let quotas: Vec<String> = match r.samples.last() {
            Some(l) if !l.quota.is_empty() => {
                l.quota.iter().map(|&q| format!("{:.2}", gib(q))).collect()
            }
            _ => r
                .vms
                .iter()
                .map(|v| format!("{:.2}", gib(v.quota_bytes)))
                .collect(),
        };
        let _ = writeln!(
            s,
            "| {} | {} | {:.3} | {:.3} | {} |",
            r.policy,
            rel.iter()
                .map(|x| format!("{x:.3}"))
                .collect::<Vec<_>>()
                .join(" | "),
            geo,
            if base > 0.0 { r.accesses() / base } else { 0.0 },
            quotas.join(" | ")
        );
    }
    s
}

/// Timeline CSV: one line per policy, sample and VM.
pub fn timeline_csv(results: &[RunResult], reference: &RunResult) -> String {
    let mut s = String::from("policy,t_s,vm,accesses_per_s,relative_total,fast_bytes,fast_hit\n");
    for r in results {
        let rel = relative_series(r, reference);
        for (i, smp) in r.samples.iter().enumerate() {
            for (k, vm) in r.vms.iter().enumerate() {
                let _ = writeln!(
                    s,
                    "{},{:.3},{},{:.0},{:.5},{},{:.5}",
                    r.policy, smp.t, vm.name, smp.tput[k], rel[i].1, smp.fast_bytes[k], smp.hit[k]
                );
            }
        }
    }
    s
}

/// Averages groups of columns so a heatmap has at most `max` columns.
pub fn downsample(cols: &[Vec<f32>], max: usize) -> Vec<Vec<f32>> {
    let g = cols.len().div_ceil(max.max(1)).max(1);
    cols.chunks(g)
        .map(|ch| {
            let mut acc = vec![0f32; ch[0].len()];
            for c in ch {
                for (a, &v) in acc.iter_mut().zip(c) {
                    *a += v / ch.len() as f32;
                }
            }
            acc
        })
        .collect()
}

/// Throughput vs all-fast of every policy (rows) on every workload (columns).
pub fn summary(results: &[(String, Vec<Row>)]) -> String {
    let mut s = String::from("| policy |");
    for (w, _) in results {
        let _ = write!(s, " {w} |");
    }
    s.push_str("\n| --- |");
    for _ in results {
        s.push_str(" ---: |");
    }
    s.push('\n');
    // Rows by policy name, in first-seen order: workloads need not run the same policies (the
    // pool variants only run where several VMs share fast memory).
    let mut policies: Vec<&str> = Vec::new();
    for (_, rows) in results {
        for r in rows {
            if !policies.contains(&r.policy.as_str()) {
                policies.push(&r.policy);
            }
        }
    }
    for p in policies {
        let _ = write!(s, "| {p} |");
        for (_, rows) in results {
            match rows.iter().find(|x| x.policy == p) {
                Some(x) => {
                    let _ = write!(s, " {:.3} |", x.throughput);
                }
                None => s.push_str(" - |"),
            }
        }
        s.push('\n');
    }
    s
}

/// Files written for one workload's comparison, relative to the output directory.
pub struct Written {
    pub throughput_svg: String,
    pub occupancy_svg: String,
    pub heatmap_svg: String,
    pub placement_svg: Option<String>,
    pub csv: String,
}

/// Writes the CSV timeline and the three plots for one workload under `dir` with `prefix`.
pub fn write_plots(
    dir: &Path,
    prefix: &str,
    title: &str,
    results: &[RunResult],
    reference: &RunResult,
) -> anyhow::Result<Written> {
    std::fs::create_dir_all(dir)?;
    let csv = format!("{prefix}-timeline.csv");
    std::fs::write(dir.join(&csv), timeline_csv(results, reference))?;

    let tp = format!("{prefix}-throughput.svg");
    let series = results
        .iter()
        .map(|r| Series {
            name: r.policy.clone(),
            points: relative_series(r, reference),
        })
        .collect();
    let chart = LineChart {
        title: &format!("{title}: throughput relative to all-fast"),
        x_label: "time (s)",
        y_label: "throughput / all-fast",
        series,
        y_min: Some(0.0),
        y_max: Some(1.1),
        width: 900.0,
        height: 420.0,
    };
    std::fs::write(dir.join(&tp), chart.render())?;

    // Fast-tier occupancy per VM: one line per (policy, VM) for multi-VM runs, per policy otherwise.
    let oc = format!("{prefix}-occupancy.svg");
    let multi = reference.vms.len() > 1;
    let mut series = Vec::new();
    for r in results {
        if multi && !matches!(r.policy.as_str(), "vtism" | "hmmv" | "tpp") {
            continue;
        }
        for (k, vm) in r.vms.iter().enumerate() {
            series.push(Series {
                name: if multi {
                    format!("{} {}", r.policy, vm.name)
                } else {
                    r.policy.clone()
                },
                points: r
                    .samples
                    .iter()
                    .map(|s| (s.t, gib(s.fast_bytes[k])))
                    .collect(),
            });
        }
    }
    let chart = LineChart {
        title: &format!("{title}: fast-tier occupancy per VM"),
        x_label: "time (s)",
        y_label: "fast memory (GiB)",
        series,
        y_min: Some(0.0),
        y_max: None,
        width: 900.0,
        height: 420.0,
    };
    std::fs::write(dir.join(&oc), chart.render())?;

    let hm = format!("{prefix}-heatmap.svg");
    let heat = Heatmap {
        title: &format!(
            "{title}: hotness of {} (share of accesses)",
            reference.vms[0].name
        ),
        x_label: "time (s)",
        y_label: "guest address",
        x_max: reference.samples.last().map_or(1.0, |s| s.t),
        cols: &downsample(&reference.heat, 150),
        width: 900.0,
        height: 320.0,
        hot: (214, 39, 40),
    };
    std::fs::write(dir.join(&hm), heat.render())?;

    let placement_svg = results.iter().find(|r| r.policy == "vtism").map(|r| {
        let name = format!("{prefix}-vtism-placement.svg");
        let h = Heatmap {
            title: &format!("{title}: vtism, fraction of each address range in fast memory"),
            x_label: "time (s)",
            y_label: "guest address",
            x_max: r.samples.last().map_or(1.0, |s| s.t),
            cols: &downsample(&r.heat_fast, 150),
            width: 900.0,
            height: 320.0,
            hot: (31, 119, 180),
        };
        (name, h.render())
    });
    let placement_svg = match placement_svg {
        Some((n, body)) => {
            std::fs::write(dir.join(&n), body)?;
            Some(n)
        }
        None => None,
    };
    Ok(Written {
        throughput_svg: tp,
        occupancy_svg: oc,
        heatmap_svg: hm,
        placement_svg,
        csv,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(policy: &str, throughput: f64) -> Row {
        Row {
            policy: policy.into(),
            throughput,
            steady: throughput,
            fast_hit: 0.0,
            t90_s: None,
            migrated_bytes: 0,
            tracking_overhead: 0.0,
            migration_overhead: 0.0,
            wall_secs: 0.0,
        }
    }

    #[test]
    fn summary_matches_rows_by_policy_when_workloads_run_different_policies() {
        let one = vec![row("all-fast", 1.0), row("vtism", 0.5), row("static", 0.4)];
        let many = vec![
            row("all-fast", 1.0),
            row("vtism", 0.6),
            row("vtism-pool", 0.7),
            row("static", 0.3),
        ];
        let t = summary(&[("a".into(), one), ("b".into(), many)]);
        assert!(t.contains("| static | 0.400 | 0.300 |"), "{t}");
        assert!(t.contains("| vtism-pool | - | 0.700 |"), "{t}");
    }
}
