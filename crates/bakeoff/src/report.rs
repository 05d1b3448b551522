//! docs/bakeoff.md, docs/bakeoff/results.json and the plots, from the runs' records: the
//! hand-written parts (crates/bakeoff/doc/head.md and tail.md) around generated tables, per
//! workload statements of where vtism wins and loses, the promotion-speed table, the kernel's and
//! DAMON's counters, and the simulator's cross-check.

use crate::metrics::{self, Outcome, PromoteSpeed};
use crate::plan::{GroundTruth, Manager, Plan};
use crate::record::RunRecord;
use crate::simcheck::{self, SimRow};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use vtism_sim::svg::{LineChart, Series};

const HEAD: &str = include_str!("../doc/head.md");
const TAIL: &str = include_str!("../doc/tail.md");
const MIB: f64 = (1u64 << 20) as f64;

/// One boot's results: the plan, its runs, how long the boot took and the machine's load
/// meanwhile.
pub struct WorkloadRuns {
    pub plan: Plan,
    pub records: Vec<RunRecord>,
    pub wall_s: Option<f64>,
    pub load: Option<Load>,
}

/// This machine's 1-minute load average while a workload ran (sampled every 30 s by the driver).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Load {
    pub mean: f64,
    pub max: f64,
    pub samples: usize,
}

impl Load {
    /// From the driver's `loadavg` file ("<s> <load>" per line).
    pub fn parse(text: &str) -> Option<Load> {
        let v: Vec<f64> = text
            .lines()
            .filter_map(|l| l.split_whitespace().nth(1)?.parse().ok())
            .collect();
        if v.is_empty() {
            return None;
        }
        Some(Load {
            mean: v.iter().sum::<f64>() / v.len() as f64,
            max: v.iter().copied().fold(f64::MIN, f64::max),
            samples: v.len(),
        })
    }

    /// Several workloads' loads as one, weighted by their samples.
    fn merge(loads: &[Load]) -> Option<Load> {
        let n: usize = loads.iter().map(|l| l.samples).sum();
        (n > 0).then(|| Load {
            mean: loads.iter().map(|l| l.mean * l.samples as f64).sum::<f64>() / n as f64,
            max: loads.iter().map(|l| l.max).fold(f64::MIN, f64::max),
            samples: n,
        })
    }
}

#[derive(Serialize)]
struct ResultsJson<'a> {
    generated_by: &'static str,
    runs: &'a [Outcome],
    promote_speed: &'a [PromoteSpeed],
    simulator: &'a [SimRow],
    /// Each workload's boot, seconds; "total" is their sum.
    wall_s: BTreeMap<String, f64>,
    /// This machine's 1-minute load average during each workload's boot.
    load: BTreeMap<String, Load>,
}

/// Reads every `<dir>/<workload>/` with a plan.json.
pub fn read_runs(dir: &Path) -> anyhow::Result<Vec<WorkloadRuns>> {
    let mut out = Vec::new();
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| anyhow::anyhow!("{}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("plan.json").is_file())
        .collect();
    dirs.sort();
    for d in dirs {
        let plan: Plan = serde_json::from_str(&std::fs::read_to_string(d.join("plan.json"))?)?;
        let mut records = Vec::new();
        for m in &plan.workload.managers {
            let p = d.join(format!("{}.run.json", m.name()));
            if p.is_file() {
                records.push(RunRecord::read(&p)?);
            }
        }
        let wall_s = std::fs::read_to_string(d.join("wall_s"))
            .ok()
            .and_then(|t| t.trim().parse().ok());
        let load = std::fs::read_to_string(d.join("loadavg"))
            .ok()
            .and_then(|t| Load::parse(&t));
        out.push(WorkloadRuns {
            plan,
            records,
            wall_s,
            load,
        });
    }
    Ok(out)
}

fn pct(x: Option<f64>) -> String {
    x.map_or("-".into(), |v| format!("{:.1}%", 100.0 * v))
}

fn secs(x: Option<f64>) -> String {
    x.map_or("-".into(), |v| format!("{v:.0}"))
}

fn mib(b: u64) -> String {
    format!("{:.1}", b as f64 / MIB)
}

/// Order of rows and colours: the baseline, the kernel's peers, vtism.
fn ordered(records: &[RunRecord]) -> Vec<&RunRecord> {
    let mut v: Vec<&RunRecord> = records.iter().collect();
    v.sort_by_key(|r| r.manager);
    v
}

fn outcomes(w: &WorkloadRuns) -> Vec<Outcome> {
    let none = w.records.iter().find(|r| r.manager == Manager::None);
    ordered(&w.records)
        .into_iter()
        .map(|r| metrics::outcome(r, none))
        .collect()
}

/// Where vtism wins and where it loses on one workload, in numbers.
fn verdict(os: &[Outcome]) -> String {
    let mut s = String::new();
    let peers: Vec<&Outcome> = os
        .iter()
        .filter(|o| !o.manager.starts_with("vtism") && o.manager != "none" && o.error.is_none())
        .collect();
    let best = peers
        .iter()
        .filter(|o| o.dram_access_share.is_some())
        .max_by(|a, b| {
            a.dram_access_share
                .partial_cmp(&b.dram_access_share)
                .unwrap()
        });
    for v in os.iter().filter(|o| o.manager.starts_with("vtism")) {
        let Some(vs) = v.dram_access_share else {
            let _ = writeln!(
                s,
                "- **{}** did not run to the end: {}",
                v.manager,
                v.error.as_deref().unwrap_or("no samples")
            );
            continue;
        };
        let mut wins = Vec::new();
        let mut loses = Vec::new();
        for p in &peers {
            let Some(ps) = p.dram_access_share else {
                continue;
            };
            let d = vs - ps;
            let what = format!("{} ({:.1}% vs {:.1}%)", p.manager, 100.0 * vs, 100.0 * ps);
            if d > 0.01 {
                wins.push(what);
            } else if d < -0.01 {
                loses.push(what);
            }
        }
        let _ = write!(
            s,
            "- **{}**: {:.1}% of accesses from DRAM in the steady state",
            v.manager,
            100.0 * vs
        );
        if let Some(b) = best {
            let bs = b.dram_access_share.unwrap_or(0.0);
            if bs > 0.0 {
                let _ = write!(
                    s,
                    "; {:.2}x the best kernel peer's ({} {:.1}%)",
                    vs / bs,
                    b.manager,
                    100.0 * bs
                );
            } else {
                let names: Vec<&str> = peers.iter().map(|p| p.manager.as_str()).collect();
                let _ = write!(
                    s,
                    "; of the kernel peers that ran ({}), none moved any of it to DRAM",
                    names.join(", ")
                );
            }
        }
        let _ = writeln!(s, ".");
        if !wins.is_empty() {
            let _ = writeln!(s, "  Wins on placement against {}.", wins.join(", "));
        }
        if !loses.is_empty() {
            let _ = writeln!(s, "  Loses on placement against {}.", loses.join(", "));
        }
        let ties: Vec<&str> = peers
            .iter()
            .filter(|p| {
                p.dram_access_share
                    .is_some_and(|ps| (vs - ps).abs() <= 0.01)
            })
            .map(|p| p.manager.as_str())
            .collect();
        if !ties.is_empty() {
            let _ = writeln!(s, "  Within one point of {}.", ties.join(", "));
        }
        let faster: Vec<String> = peers
            .iter()
            .filter_map(|p| match (v.t90_s, p.t90_s) {
                (Some(a), Some(b)) if b < a => {
                    Some(format!("{} ({b:.0} s vs {a:.0} s)", p.manager))
                }
                _ => None,
            })
            .collect();
        if !faster.is_empty() {
            let _ = writeln!(
                s,
                "  Slower to 90% of its steady state than {}.",
                faster.join(", ")
            );
        }
        if v.max_dram_over_limit_bytes > 0 {
            let _ = writeln!(
                s,
                "  Exceeded the DRAM limit by {} MiB at most.",
                mib(v.max_dram_over_limit_bytes)
            );
        }
        let over: Vec<String> = peers
            .iter()
            .filter(|p| p.max_dram_over_limit_bytes > 0)
            .map(|p| format!("{} by {} MiB", p.manager, mib(p.max_dram_over_limit_bytes)))
            .collect();
        if !over.is_empty() {
            let _ = writeln!(s, "  Peers over the DRAM limit: {}.", over.join(", "));
        }
    }
    s
}

fn table(os: &[Outcome], moving: bool) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "| manager | DRAM access share | time to 90% (s) |{} hot set on DRAM | migrated (MiB) | max guest DRAM / limit (MiB) | over limit (MiB) | node 0 free at start (MiB) | manager CPU (s) | ops/s |",
        if moving { " before the move | time to 90% after the move (s) |" } else { "" }
    );
    let _ = writeln!(
        s,
        "| --- | --- | --- |{} --- | --- | --- | --- | --- | --- | --- |",
        if moving { " --- | --- |" } else { "" }
    );
    for o in os {
        if let Some(e) = &o.error {
            let _ = writeln!(s, "| {} | failed: {} |", o.manager, e.replace('|', "/"));
            continue;
        }
        let _ = writeln!(
            s,
            "| {} | {} | {} |{} {} | {} | {} / {} | {} | {} | {} | {} |",
            o.manager,
            pct(o.dram_access_share),
            secs(o.t90_s),
            if moving {
                format!(
                    " {} | {} |",
                    pct(o.share_before_move),
                    secs(o.t90_after_move_s)
                )
            } else {
                String::new()
            },
            pct(o.hot_set_dram_share),
            mib(o.migrated_bytes),
            mib(o.max_guest_dram_bytes),
            mib(o.limit_bytes),
            mib(o.max_dram_over_limit_bytes),
            mib(o.dram_free_at_start_bytes),
            o.manager_cpu_s.map_or("-".into(), |c| format!("{c:.2}")),
            o.mean_ops_per_s.map_or("-".into(), |r| format!("{r:.0}")),
        );
    }
    s
}

fn counters(w: &WorkloadRuns) -> String {
    let mut s = String::new();
    let keys = [
        "pgmigrate_success",
        "numa_pte_updates",
        "numa_hint_faults",
        "numa_pages_migrated",
        "pgpromote_candidate",
        "pgpromote_success",
        "pgdemote_kswapd",
        "pgdemote_direct",
    ];
    let _ = writeln!(
        s,
        "| manager | {} | DAMOS promote applied / tried (MiB) | DAMOS demote applied / tried (MiB) | CPU basis |",
        keys.join(" | ")
    );
    let _ = writeln!(s, "|{}", " --- |".repeat(keys.len() + 4));
    let none = w.records.iter().find(|r| r.manager == Manager::None);
    for r in ordered(&w.records) {
        let o = metrics::outcome(r, none);
        let vals: Vec<String> = keys
            .iter()
            .map(|k| r.vmstat.get(*k).copied().unwrap_or(0).to_string())
            .collect();
        let damos = |i: usize| {
            r.damos.as_ref().map_or("-".into(), |d| {
                let x = if i == 0 { d.0 } else { d.1 };
                format!("{} / {}", mib(x.sz_applied), mib(x.sz_tried))
            })
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} |",
            r.manager.name(),
            vals.join(" | "),
            damos(0),
            damos(1),
            o.cpu_basis
        );
    }
    s
}

/// What DAMON saw: every snapshot of the kdamonds' regions (the `damon` run's, and the probe
/// after the `none` run), or None when no run took any.
fn damon_view(w: &WorkloadRuns) -> Option<String> {
    let shots: Vec<(&RunRecord, &crate::damon_tiering::Snapshot)> = ordered(&w.records)
        .into_iter()
        .flat_map(|r| r.damon.iter().map(move |s| (r, s)))
        .collect();
    if shots.is_empty() {
        return None;
    }
    let mut s = String::new();
    let _ = writeln!(
        s,
        "| run | phase | at (s) | kdamond | state | regions | with nr_accesses > 0 (MiB) | at the promotion threshold or above (MiB) | max nr_accesses (of) | hot frames in regions seen accessed |"
    );
    let _ = writeln!(s, "|{}", " --- |".repeat(10));
    for (r, x) in shots {
        let (n, b) = x.accessed();
        let (pn, pb) = x.promotable();
        let _ = writeln!(
            s,
            "| {} | {} | {:.0} | {} | {} | {} | {} ({}) | {} ({}) | {} ({}) | {} of {} (in {} of {} regions) |",
            r.manager.name(),
            x.phase,
            x.t_s,
            x.kdamond,
            x.state,
            x.regions.len(),
            n,
            mib(b),
            pn,
            mib(pb),
            x.regions.iter().map(|r| r.nr_accesses).max().unwrap_or(0),
            x.max_nr_accesses,
            x.hot_frames_seen,
            x.hot_frames,
            x.hot_regions_seen,
            x.hot_regions
        );
    }
    Some(s)
}

/// DAMON's tracepoint sums per phase and side, or None when no run traced it.
fn damon_trace_view(w: &WorkloadRuns) -> Option<String> {
    let rows: Vec<(&RunRecord, &crate::damon_watch::TraceStats)> = ordered(&w.records)
        .into_iter()
        .flat_map(|r| r.damon_trace.iter().map(move |t| (r, t)))
        .collect();
    if rows.is_empty() {
        return None;
    }
    let mut s = String::new();
    let _ = writeln!(
        s,
        "| run | phase | monitored | aggregations (s) | region-aggregations with nr_accesses > 0 | of regions holding hot frames | access ratio | max nr_accesses (of) | migration scheme tried (MiB) |"
    );
    let _ = writeln!(s, "|{}", " --- |".repeat(9));
    for (r, t) in rows {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {:.0} ({:.0}) | {} of {} | {} of {} | {:.3}% | {} ({}) | {} ({}) |",
            r.manager.name(),
            t.phase,
            if t.side == "slow" {
                "CXL nodes"
            } else {
                "DRAM node 0"
            },
            t.aggregations,
            t.span_s,
            t.accessed_events,
            t.region_events,
            t.hot_accessed_events,
            t.hot_region_events,
            100.0 * t.access_ratio,
            t.max_nr_accesses,
            t.samples_per_aggregation,
            t.tried_events,
            mib(t.tried_bytes)
        );
    }
    Some(s)
}

/// GUPS: the measured update rate and the period between two uniform updates of one page.
fn gups_rate_line(w: &crate::plan::Workload, os: &[Outcome]) -> Option<String> {
    let crate::plan::Shape::Gups {
        mib, uniform_share, ..
    } = w.shape
    else {
        return None;
    };
    let rates: Vec<f64> = os.iter().filter_map(|o| o.mean_ops_per_s).collect();
    if rates.is_empty() || uniform_share <= 0.0 {
        return None;
    }
    let lo = rates.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = rates.iter().copied().fold(0.0, f64::max);
    let pages = (mib * 256) as f64;
    Some(format!(
        "The nested guest's GUPS ran at {:.2} to {:.2} M updates/s (mean per run; TCG's speed, not \
         the placement's), so with {:.0}% of the updates uniform each page of the region got one \
         every {:.1} to {:.1} s.",
        lo / 1e6,
        hi / 1e6,
        100.0 * uniform_share,
        pages / (uniform_share * hi),
        pages / (uniform_share * lo)
    ))
}

fn colour(m: Manager) -> usize {
    m as usize
}

fn plots(w: &WorkloadRuns, dir: &Path) -> anyhow::Result<Vec<String>> {
    let name = &w.plan.workload.name;
    let mut files = Vec::new();
    let series = |f: &dyn Fn(&crate::record::RunSample) -> Option<f64>| -> Vec<Series> {
        let mut v: Vec<(usize, Series)> = w
            .records
            .iter()
            .map(|r| {
                (
                    colour(r.manager),
                    Series {
                        name: r.manager.name().into(),
                        points: r
                            .samples
                            .iter()
                            .filter_map(|x| f(x).map(|y| (x.t_s, y)))
                            .collect(),
                    },
                )
            })
            .collect();
        v.sort_by_key(|x| x.0);
        v.into_iter().map(|x| x.1).collect()
    };
    let promote = w.plan.workload.truth == GroundTruth::DramBytes;
    if !promote {
        let file = format!("{name}-share.svg");
        let chart = LineChart {
            title: &format!("{name}: share of the workload's accesses served from DRAM"),
            x_label: "seconds since the manager started",
            y_label: "%",
            series: series(&|x| x.dram_access_share.map(|v| 100.0 * v)),
            y_min: Some(0.0),
            y_max: Some(105.0),
            width: 900.0,
            height: 380.0,
        };
        std::fs::write(dir.join(&file), chart.render())?;
        files.push(file);
    }
    let file = format!("{name}-dram.svg");
    let mut s = series(&|x| Some(x.guest_dram_bytes as f64 / MIB));
    let end = w
        .records
        .iter()
        .filter_map(|r| r.samples.last().map(|x| x.t_s))
        .fold(0.0, f64::max);
    s.push(Series {
        name: "limit".into(),
        points: vec![
            (0.0, (w.plan.workload.dram_limit_mib) as f64),
            (end, w.plan.workload.dram_limit_mib as f64),
        ],
    });
    let chart = LineChart {
        title: &format!("{name}: the guest's RAM on DRAM"),
        x_label: "seconds since the manager started",
        y_label: "MiB",
        series: s,
        y_min: Some(0.0),
        y_max: None,
        width: 900.0,
        height: 380.0,
    };
    std::fs::write(dir.join(&file), chart.render())?;
    files.push(file);
    Ok(files)
}

fn sim_table(w: &WorkloadRuns, os: &[Outcome], rows: &[SimRow]) -> String {
    let mut s = String::new();
    let rank = |v: &[(String, f64)], who: &str| -> String {
        let mut sorted: Vec<f64> = v.iter().map(|x| x.1).collect();
        sorted.sort_by(|a, b| b.partial_cmp(a).unwrap());
        v.iter().find(|x| x.0 == who).map_or("-".into(), |x| {
            (sorted
                .iter()
                .position(|y| (y - x.1).abs() < 0.005)
                .unwrap_or(0)
                + 1)
            .to_string()
        })
    };
    let real: Vec<(String, f64)> = os
        .iter()
        .filter(|o| simcheck::sim_policy(manager_of(&o.manager)).is_some())
        .filter_map(|o| Some((o.manager.clone(), o.dram_access_share?)))
        .collect();
    let sim: Vec<(String, f64)> = real
        .iter()
        .filter_map(|(m, _)| {
            let p = simcheck::sim_policy(manager_of(m))?;
            Some((m.clone(), rows.iter().find(|r| r.policy == p)?.fast_hit))
        })
        .collect();
    let _ = writeln!(
        s,
        "| manager | sim policy | bake-off share | rank | sim fast hit ratio | rank | bake-off t90 (s) | sim t90 (s) |"
    );
    let _ = writeln!(s, "| --- | --- | --- | --- | --- | --- | --- | --- |");
    for (m, share) in &real {
        let p = simcheck::sim_policy(manager_of(m)).unwrap_or("-");
        let r = rows.iter().find(|r| r.policy == p);
        let o = os.iter().find(|o| &o.manager == m);
        let _ = writeln!(
            s,
            "| {m} | {p} | {:.1}% | {} | {} | {} | {} | {} |",
            100.0 * share,
            rank(&real, m),
            r.map_or("-".into(), |r| format!("{:.1}%", 100.0 * r.fast_hit)),
            rank(&sim, m),
            secs(o.and_then(|o| o.t90_s)),
            secs(r.and_then(|r| r.t90_s)),
        );
    }
    let _ = writeln!(
        s,
        "\nSimulated: `vtism sim compare --workload {} --model cxl --unit 4k --ratio {}:{} --duration {} --policies {}`.",
        rows.first().map_or("-", |r| r.scenario.as_str()),
        w.plan.workload.dram_limit_mib,
        match w.plan.workload.shape {
            crate::plan::Shape::Gups { mib, .. } => mib.saturating_sub(w.plan.workload.dram_limit_mib),
            crate::plan::Shape::Redis { .. } => 64u64.saturating_sub(w.plan.workload.dram_limit_mib),
        },
        w.plan.workload.run_s,
        rows.iter().map(|r| r.policy.as_str()).collect::<Vec<_>>().join(",")
    );
    s
}

fn manager_of(name: &str) -> Manager {
    crate::plan::ALL_MANAGERS
        .iter()
        .copied()
        .find(|m| m.name() == name)
        .unwrap_or(Manager::None)
}

/// Writes docs/bakeoff.md (`md`), results.json and the plots (`assets`, the md's sibling
/// directory of the same stem).
pub fn write(runs: &[WorkloadRuns], md_path: &Path) -> anyhow::Result<()> {
    let assets = md_path.with_extension("");
    std::fs::create_dir_all(&assets)?;
    let rel = assets
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("bakeoff")
        .to_string();
    let mut md = String::from(HEAD);
    let mut all = Vec::new();
    let mut promote = Vec::new();
    let mut sims = Vec::new();
    let mut walls = BTreeMap::new();
    let mut loads = BTreeMap::new();
    let _ = writeln!(md, "\n## Results\n");
    let timed: Vec<(&str, f64)> = runs
        .iter()
        .filter_map(|w| Some((w.plan.workload.name.as_str(), w.wall_s?)))
        .collect();
    if !timed.is_empty() {
        let total: f64 = timed.iter().map(|t| t.1).sum();
        let load = Load::merge(&runs.iter().filter_map(|w| w.load).collect::<Vec<_>>());
        let _ = writeln!(
            md,
            "The run these results come from took {:.0} minutes on the 2-core machine in all, the \
             sum of its workloads' boots of the emulated host ({}){}; each workload's line below \
             says how long each manager ran.\n",
            total / 60.0,
            timed
                .iter()
                .map(|(n, t)| format!("{n} {:.0} min", t / 60.0))
                .collect::<Vec<_>>()
                .join(", "),
            load.map_or(String::new(), |l| format!(
                ", with the machine's 1-minute load average at {:.1} on average and {:.1} at most \
                 (sampled every 30 s)",
                l.mean, l.max
            ))
        );
        walls.insert("total".to_string(), total);
    }
    for w in runs {
        let wl = &w.plan.workload;
        if let Some(t) = w.wall_s {
            walls.insert(wl.name.clone(), t);
        }
        if let Some(l) = w.load {
            loads.insert(wl.name.clone(), l);
        }
        let files = plots(w, &assets)?;
        let _ = writeln!(md, "### {}\n\n{}.", wl.name, wl.about);
        let _ = writeln!(
            md,
            "DRAM limit {} MiB for every manager; {} s per manager; ground truth: {}{}.\n",
            wl.dram_limit_mib,
            wl.run_s,
            match wl.truth {
                GroundTruth::WorkloadMap =>
                    "the workload's own map of its hot frames and its update rates",
                GroundTruth::TcgPlugin => "per-frame access counts from the QEMU TCG plugin",
                GroundTruth::DramBytes => "the guest's bytes on DRAM",
            },
            w.wall_s.map_or(String::new(), |t| format!(
                "; this boot took {:.0} min{}",
                t / 60.0,
                w.load.map_or(String::new(), |l| format!(
                    " at a load of {:.1} on average ({:.1} at most)",
                    l.mean, l.max
                ))
            ))
        );
        if wl.truth == GroundTruth::DramBytes {
            let rows: Vec<PromoteSpeed> = ordered(&w.records)
                .into_iter()
                .map(metrics::promote_speed)
                .collect();
            let _ = writeln!(md, "| manager | promoted MB/s (to 90%) | peak MB/s (10 s) | time to 90% of the most (s) | most on DRAM (MiB) | on DRAM at the end (MiB) |");
            let _ = writeln!(md, "| --- | --- | --- | --- | --- | --- |");
            for p in &rows {
                if let Some(e) = &p.error {
                    let _ = writeln!(md, "| {} | failed: {} |", p.manager, e.replace('|', "/"));
                    continue;
                }
                let _ = writeln!(
                    md,
                    "| {} | {} | {} | {} | {:.1} | {:.1} |",
                    p.manager,
                    p.promote_mb_per_s.map_or("-".into(), |v| format!("{v:.1}")),
                    p.peak_promote_mb_per_s
                        .map_or("-".into(), |v| format!("{v:.1}")),
                    secs(p.t90_s),
                    p.max_dram_mib,
                    p.end_dram_mib
                );
            }
            promote.extend(rows);
        } else {
            let os = outcomes(w);
            let moving = os
                .iter()
                .any(|o| o.t90_after_move_s.is_some() || o.share_before_move.is_some());
            md.push_str(&table(&os, moving));
            if let Some(line) = gups_rate_line(wl, &os) {
                let _ = writeln!(md, "\n{line}");
            }
            let _ = writeln!(md, "\n{}", verdict(&os));
            for r in ordered(&w.records) {
                for n in &r.notes {
                    let _ = writeln!(md, "Note, {}: {n}\n", r.manager.name());
                }
            }
            if let Some(rows) = simcheck::run(wl)? {
                let _ = writeln!(
                    md,
                    "Cross-check with the simulator:\n\n{}",
                    sim_table(w, &os, &rows)
                );
                sims.extend(rows);
            }
            all.extend(os);
        }
        let _ = writeln!(md, "Counters over each run (pages, from the emulated host's /proc/vmstat; DAMOS from its sysfs stats):\n\n{}", counters(w));
        if let Some(v) = damon_trace_view(w) {
            let _ = writeln!(
                md,
                "DAMON's view over time, from its tracepoints (`damon_aggregated`: every region \
                 at every aggregation; `damos_before_apply`: every region the migration scheme \
                 was tried on); the access ratio is what 6.15's interval auto-tuning scores \
                 against its 4% goal:\n\n{v}"
            );
        }
        if let Some(v) = damon_view(w) {
            let _ = writeln!(
                md,
                "What DAMON saw (every monitoring region through a `stat` scheme's tried regions; \
                 the workload's hot frames located by the nested QEMU's pagemap; the probe ran \
                 after the `none` run's samples, nothing acting):\n\n{v}"
            );
        }
        for f in files {
            let _ = writeln!(md, "![{f}]({rel}/{f})\n");
        }
    }
    md.push_str(TAIL);
    std::fs::write(md_path, md)?;
    let json = ResultsJson {
        generated_by: "vtism bakeoff (make bakeoff)",
        runs: &all,
        promote_speed: &promote,
        simulator: &sims,
        wall_s: walls,
        load: loads,
    };
    std::fs::write(
        assets.join("results.json"),
        serde_json::to_string_pretty(&json)? + "\n",
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{self, VtismSettings};
    use crate::record::{CpuRecord, HogRecord, RunSample};

    fn rec(m: Manager, share: f64, over: u64) -> RunRecord {
        RunRecord {
            workload: "gups-hotset".into(),
            manager: m,
            error: None,
            notes: Vec::new(),
            limit_bytes: 20 << 20,
            guest_frames: 65536,
            workload_frames: 24576,
            workload_ready_s: 10.0,
            run_s: 30.0,
            hog: HogRecord::default(),
            vmstat: Default::default(),
            damos: None,
            vtismd: None,
            cpu: CpuRecord::default(),
            samples: (1..=30)
                .map(|i| RunSample {
                    t_s: i as f64,
                    dram_access_share: Some(share * (i as f64 / 10.0).min(1.0)),
                    hot_dram_share: Some(share),
                    guest_dram_bytes: (16 << 20) + over,
                    limit_bytes: 20 << 20,
                    ..Default::default()
                })
                .collect(),
            damon: Vec::new(),
            damon_trace: Vec::new(),
        }
    }

    #[test]
    fn load_samples_are_averaged_and_merged() {
        assert_eq!(Load::parse(""), None);
        let a = Load::parse("0 2.0\n30 4.0\nnonsense\n").unwrap();
        assert_eq!((a.mean, a.max, a.samples), (3.0, 4.0, 2));
        let b = Load::parse("0 9.0\n").unwrap();
        let m = Load::merge(&[a, b]).unwrap();
        assert_eq!((m.mean, m.max, m.samples), (5.0, 9.0, 3));
    }

    #[test]
    fn the_report_says_where_vtism_wins_and_loses() {
        let mut w = plan::standard().remove(0);
        w.run_s = 30;
        w.managers = vec![
            Manager::None,
            Manager::Tiering,
            Manager::Damon,
            Manager::VtismModule,
        ];
        let runs = vec![WorkloadRuns {
            plan: Plan {
                workload: w,
                vtism: VtismSettings::default(),
                bin: "/x/vtism".into(),
                guest_kernel: "/x/vmlinux".into(),
                guest_initrd: "/x/initrd".into(),
                plugin: None,
                sample_ms: 1000,
            },
            records: vec![
                rec(Manager::None, 0.0, 0),
                rec(Manager::Tiering, 0.5, 8 << 20),
                rec(Manager::Damon, 0.95, 0),
                rec(Manager::VtismModule, 0.8, 0),
            ],
            wall_s: Some(3600.0),
            load: Load::parse("0 2.5\n30 3.5\n"),
        }];
        let dir = std::env::temp_dir().join(format!("vtism-bakeoff-report-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let md_path = dir.join("bakeoff.md");
        write(&runs, &md_path).unwrap();
        let md = std::fs::read_to_string(&md_path).unwrap();
        assert!(md.contains("### gups-hotset"), "{md}");
        assert!(md.contains("| vtism-module | 80.0% |"), "{md}");
        assert!(
            md.contains("Wins on placement against tiering (80.0% vs 50.0%)"),
            "{md}"
        );
        assert!(
            md.contains("Loses on placement against damon (80.0% vs 95.0%)"),
            "{md}"
        );
        assert!(
            md.contains("Peers over the DRAM limit: tiering by 4.0 MiB"),
            "{md}"
        );
        assert!(
            md.contains("took 60 minutes on the 2-core machine in all"),
            "{md}"
        );
        assert!(
            md.contains("load average at 3.0 on average and 3.5 at most"),
            "{md}"
        );
        assert!(md.contains("Cross-check with the simulator"), "{md}");
        let json: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(dir.join("bakeoff/results.json")).unwrap(),
        )
        .unwrap();
        let runs = json["runs"].as_array().unwrap();
        assert_eq!(runs.len(), 4);
        for k in [
            "workload",
            "manager",
            "dram_access_share",
            "t90_s",
            "migrated_bytes",
            "max_dram_over_limit_bytes",
            "manager_cpu_s",
        ] {
            assert!(runs[0].get(k).is_some(), "{k}");
        }
        assert_eq!(runs[1]["max_dram_over_limit_bytes"], 4 << 20);
        assert!(!json["simulator"].as_array().unwrap().is_empty());
        for f in ["gups-hotset-share.svg", "gups-hotset-dram.svg"] {
            assert!(std::fs::read_to_string(dir.join("bakeoff").join(f))
                .unwrap()
                .starts_with("<svg"));
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
