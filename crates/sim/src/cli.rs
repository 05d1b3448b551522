//! `vtism sim`: run one policy, or compare all of them, on workload and memory models.

use crate::model::{MemoryModel, PRESETS};
use crate::policies::{self, POLICIES};
use crate::report::{self, Row};
use crate::sim::{self, HostPages, RunResult, SimConfig, World};
use crate::trace::TraceWorkload;
use crate::workload::{self, Kind, VmWorkload, SUITE, WORKLOADS};
use clap::{Args, Subcommand};
use std::io::IsTerminal;
use std::path::PathBuf;

const AFTER: &str = "\
Memory models (--model): optane, cxl, remote-numa, or a TOML file (see docs/evaluation.md).
Workloads (--workload): gups-hotset, gups-hotset-move, kv-zipf, graph, seq-window, file-cache,
mix-hmmv4; the bake-off's (docs/bakeoff.md): bakeoff-gups, bakeoff-gups-move, bakeoff-kv; or
--trace FILE to replay a recorded hint stream.
Policies (--policy): all-fast, oracle, vtism, static, tpp, autonuma, hmmv, autotiering, memtis, hemem;
named only: vtism-no-split (with --host-pages thp: folio split requests never carried out).
--host-pages thp backs guest RAM with 2 MiB host folios: a move takes whole folios, a split
block's accesses cost 43.4 ns more (TLB reach), khugepaged collapses split blocks again; use it
with --unit 4k to give folios 4 KiB structure. --host-pages 4k: every access pays the 43.4 ns.
The model, the peers and their assumptions: docs/evaluation.md.";

#[derive(Subcommand, Debug)]
pub enum SimCommand {
    /// Run one policy on one workload; prints its row next to all-fast's.
    #[command(after_help = AFTER)]
    Run(RunArgs),
    /// Run every policy on one workload (or the standard suite) and compare them.
    #[command(after_help = AFTER)]
    Compare(CompareArgs),
    /// List the memory presets, workloads and policies.
    List,
}

#[derive(Args, Debug, Clone)]
pub struct Common {
    /// Workload name (see `vtism sim list`).
    #[arg(long, short, default_value = "gups-hotset")]
    pub workload: String,
    /// Replay a recorded hint trace instead of a named workload (format in docs/evaluation.md).
    #[arg(long, conflicts_with = "workload")]
    pub trace: Option<PathBuf>,
    /// Memory model: a preset name or a TOML file.
    #[arg(long, short, default_value = "cxl")]
    pub model: String,
    /// Fast:slow capacity ratio of each VM's footprint, e.g. 1:4 or 1:8.
    #[arg(long, default_value = "1:4")]
    pub ratio: String,
    /// Simulated seconds.
    #[arg(long, default_value_t = 600.0)]
    pub duration: f64,
    /// Epoch length, ms: the simulator's time step.
    #[arg(long, default_value_t = 100)]
    pub epoch_ms: u64,
    /// Placement unit: 4k, 64k, 2m (a power of two from 4 KiB to 2 MiB).
    #[arg(long, default_value = "2m")]
    pub unit: String,
    /// How the host backs guest RAM: `thp`, 2 MiB folios (THP `always`, all huge at the start:
    /// a move of any frame takes the whole folio, a split block's accesses cost TLB reach,
    /// khugepaged collapses again), or `4k` (THP `never`: every access pays that cost). Not
    /// given: not modelled (no TLB cost, moves take what they ask for).
    #[arg(long, value_name = "thp|4k")]
    pub host_pages: Option<String>,
    /// Multiplies every workload footprint (0.25 = a quarter of the size).
    #[arg(long, default_value_t = 1.0)]
    pub scale: f64,
    /// Run this many copies of the workload's VMs side by side (seeds differ).
    #[arg(long, default_value_t = 1)]
    pub vms: u32,
    /// Timeline resolution, seconds (CSV, plots, time to 90%).
    #[arg(long, default_value_t = 1.0)]
    pub sample_s: f64,
    /// Random seed: same seed, same results.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Write CSV timelines, SVG plots and a Markdown report to this directory.
    #[arg(long, short)]
    pub out: Option<PathBuf>,
    /// Print results as JSON instead of a table (one object per workload and line).
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct RunArgs {
    /// Policy to run (see `vtism sim list`).
    #[arg(long, short, default_value = "vtism")]
    pub policy: String,
    /// Write the hint rounds vtism's guest-tracker model publishes to this trace file
    /// (`--policy vtism`, one VM).
    #[arg(long)]
    pub record_trace: Option<PathBuf>,
    #[command(flatten)]
    pub common: Common,
}

#[derive(Args, Debug)]
pub struct CompareArgs {
    /// Policies to compare, comma-separated (default: all).
    #[arg(long, value_delimiter = ',')]
    pub policies: Vec<String>,
    /// Run the standard suite (every workload) instead of one workload.
    #[arg(long)]
    pub suite: bool,
    /// Parallel runs (default: available cores).
    #[arg(long)]
    pub jobs: Option<usize>,
    #[command(flatten)]
    pub common: Common,
}

pub fn sim_main(cmd: SimCommand) -> anyhow::Result<()> {
    match cmd {
        SimCommand::List => {
            println!("memory presets: {}", PRESETS.join(", "));
            println!("\nworkloads:");
            for (n, d) in WORKLOADS {
                println!("  {n:<18} {d}");
            }
            println!("\npolicies:");
            for (n, d) in POLICIES {
                println!("  {n:<12} {d}");
            }
            println!("\nvariants (only when named):");
            for (n, d) in policies::VARIANTS {
                println!("  {n:<14} {d}");
            }
            Ok(())
        }
        SimCommand::Run(a) => run_cmd(a),
        SimCommand::Compare(a) => compare_cmd(a),
    }
}

/// Parses "1:4" into slow bytes per fast byte.
pub fn parse_ratio(s: &str) -> anyhow::Result<f64> {
    let bad = || anyhow::anyhow!("--ratio: expected FAST:SLOW such as 1:4, got {s:?}");
    let (a, b) = s.split_once(':').ok_or_else(bad)?;
    let a: f64 = a.trim().parse().map_err(|_| bad())?;
    let b: f64 = b.trim().parse().map_err(|_| bad())?;
    if !(a > 0.0 && b >= 0.0 && a.is_finite() && b.is_finite()) {
        return Err(bad());
    }
    Ok(b / a)
}

pub fn parse_unit(s: &str) -> anyhow::Result<u64> {
    let l = s.trim().to_ascii_lowercase();
    let (num, mul) = if let Some(n) = l.strip_suffix('k') {
        (n, 1u64 << 10)
    } else if let Some(n) = l.strip_suffix('m') {
        (n, 1 << 20)
    } else {
        (l.as_str(), 1)
    };
    let v: u64 = num
        .parse()
        .map_err(|_| anyhow::anyhow!("--unit: expected a size such as 4k or 2m, got {s:?}"))?;
    Ok(v * mul)
}

pub fn load_model(s: &str) -> anyhow::Result<MemoryModel> {
    if let Some(m) = MemoryModel::preset(s) {
        return Ok(m);
    }
    let p = std::path::Path::new(s);
    if p.exists() {
        let text = std::fs::read_to_string(p)?;
        return MemoryModel::from_toml(&text).map_err(|e| anyhow::anyhow!("--model {s}: {e}"));
    }
    anyhow::bail!(
        "--model: {s:?} is neither a preset ({}) nor a TOML file",
        PRESETS.join(", ")
    )
}

pub fn config(c: &Common) -> anyhow::Result<SimConfig> {
    let mut cfg = SimConfig::new(load_model(&c.model)?);
    cfg.unit_bytes = parse_unit(&c.unit)?;
    cfg.epoch_s = c.epoch_ms as f64 / 1000.0;
    cfg.duration_s = c.duration;
    cfg.slow_per_fast = parse_ratio(&c.ratio)?;
    cfg.seed = c.seed;
    cfg.host_pages = match c.host_pages.as_deref() {
        None => HostPages::NotModelled,
        Some("thp") => HostPages::Thp,
        Some("4k") => HostPages::Base,
        Some(other) => anyhow::bail!("--host-pages: expected thp or 4k, got {other:?}"),
    };
    if c.sample_s.is_nan() || c.sample_s < cfg.epoch_s {
        anyhow::bail!("--sample-s: must be at least one epoch");
    }
    cfg.sample_s = c.sample_s;
    if !(c.scale > 0.0 && c.scale.is_finite()) {
        anyhow::bail!("--scale: must be a positive number");
    }
    if c.vms == 0 {
        anyhow::bail!("--vms: must be at least 1");
    }
    cfg.validate()?;
    Ok(cfg)
}

/// The VMs of the run: a named scenario (or a trace), repeated `--vms` times.
pub fn workloads(c: &Common, cfg: &SimConfig, name: &str) -> anyhow::Result<Vec<VmWorkload>> {
    let mut base = if let Some(t) = &c.trace {
        let f =
            std::fs::File::open(t).map_err(|e| anyhow::anyhow!("--trace {}: {e}", t.display()))?;
        let tr = TraceWorkload::read(std::io::BufReader::new(f))
            .map_err(|e| anyhow::anyhow!("--trace {}: {e}", t.display()))?;
        vec![VmWorkload {
            name: tr.name.clone(),
            footprint_bytes: tr.frames * vtism_proto::FRAME_SIZE,
            kind: Kind::Trace(std::sync::Arc::new(tr)),
            concurrency: 8.0,
            cpu_ns: 20.0,
            vcpus: 8,
            seed: cfg.seed,
            fast_weight: None,
        }]
    } else {
        workload::scenario(name, c.scale, cfg.duration_s, cfg.seed)?
    };
    if c.vms > 1 {
        let one = base.clone();
        base.clear();
        for k in 0..c.vms {
            for w in &one {
                let mut w = w.clone();
                w.name = format!("{}-{k}", w.name);
                w.seed = w.seed.wrapping_add(1000 * k as u64);
                base.push(w);
            }
        }
    }
    Ok(base)
}

fn progress_bar(label: &str, quiet: bool) -> indicatif::ProgressBar {
    if quiet || !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let pb = indicatif::ProgressBar::new(1000);
    pb.set_style(
        indicatif::ProgressStyle::with_template("{prefix:>22} [{bar:40}] {percent:>3}% {elapsed}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    pb.set_prefix(label.to_string());
    pb
}

/// Runs one policy.
pub fn run_one(
    cfg: &SimConfig,
    wls: &[VmWorkload],
    policy: &str,
    pb: Option<&indicatif::ProgressBar>,
    record: Option<&std::path::Path>,
) -> anyhow::Result<RunResult> {
    let world = World::new(cfg, wls, policy == "all-fast");
    let setup = world.setup();
    let mut pr = policies::build(policy, &setup)?;
    if let Some(path) = record {
        if policy != "vtism" || wls.len() != 1 {
            anyhow::bail!("--record-trace: needs --policy vtism and a one-VM workload");
        }
        let f = std::fs::File::create(path)
            .map_err(|e| anyhow::anyhow!("--record-trace {}: {e}", path.display()))?;
        let w = crate::trace::TraceWriter::new(
            std::io::BufWriter::new(f),
            &wls[0].name,
            setup.specs[0].ram.frames(),
            vtism_proto::CountMeaning::RateLevel,
        )?;
        let mut tracker = crate::window_tracker::WindowTracker::new(
            setup.units[0],
            cfg.unit_bytes,
            crate::window_tracker::WindowParams::default(),
            crate::window_tracker::seed_of(cfg.seed, 0),
        );
        tracker.trace = Some(w);
        pr.trackers[0] = Box::new(tracker);
    }
    let mut cb = |f: f64| {
        if let Some(pb) = pb {
            pb.set_position((f * 1000.0) as u64)
        }
    };
    sim::run(cfg, wls, pr, &mut cb)
}

fn run_cmd(a: RunArgs) -> anyhow::Result<()> {
    let cfg = config(&a.common)?;
    let wls = workloads(&a.common, &cfg, &a.common.workload)?;
    if !policies::known(&a.policy) {
        anyhow::bail!(
            "--policy: unknown policy {:?}; one of: {}",
            a.policy,
            policies::names().join(", ")
        );
    }
    let pb = progress_bar(&a.policy, a.common.json);
    let reference = run_one(&cfg, &wls, "all-fast", None, None)?;
    let r = run_one(&cfg, &wls, &a.policy, Some(&pb), a.record_trace.as_deref())?;
    pb.finish_and_clear();
    let rows = vec![
        report::row(&reference, &reference),
        report::row(&r, &reference),
    ];
    let title = workload_title(&a.common);
    emit(
        &a.common,
        &cfg,
        &title,
        &rows,
        &[reference.clone(), r],
        &reference,
    )?;
    Ok(())
}

fn workload_title(c: &Common) -> String {
    match &c.trace {
        Some(t) => format!("trace {}", t.display()),
        None => c.workload.clone(),
    }
}

fn compare_cmd(a: CompareArgs) -> anyhow::Result<()> {
    let cfg = config(&a.common)?;
    let explicit = !a.policies.is_empty();
    let pols: Vec<String> = if explicit {
        a.policies.clone()
    } else {
        policies::names().iter().map(|s| s.to_string()).collect()
    };
    for p in &pols {
        if !policies::known(p) {
            anyhow::bail!(
                "--policies: unknown policy {p:?}; one of: {}",
                policies::names().join(", ")
            );
        }
    }
    let workloads_list: Vec<String> = if a.suite {
        SUITE.iter().map(|s| s.to_string()).collect()
    } else {
        vec![a.common.workload.clone()]
    };
    let jobs = a
        .jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1);
    let mut all = Vec::new();
    for wname in &workloads_list {
        let mut common = a.common.clone();
        common.workload = wname.clone();
        let wls = workloads(&common, &cfg, wname)?;
        let mp = indicatif::MultiProgress::new();
        if a.common.json || !std::io::stderr().is_terminal() {
            mp.set_draw_target(indicatif::ProgressDrawTarget::hidden());
        }
        // With one VM the pool variants are vtism itself: run them only when asked for.
        let pols: Vec<String> = pols
            .iter()
            .filter(|p| explicit || wls.len() > 1 || !policies::MULTI_VM_ONLY.contains(&p.as_str()))
            .cloned()
            .collect();
        let reference = run_one(&cfg, &wls, "all-fast", None, None)?;
        // The reference is all-fast's run: reuse it rather than run it twice.
        let others: Vec<String> = pols.iter().filter(|p| *p != "all-fast").cloned().collect();
        let mut rest = run_parallel(&cfg, &wls, &others, jobs, &mp, wname)?.into_iter();
        let results: Vec<RunResult> = pols
            .iter()
            .map(|p| {
                if p == "all-fast" {
                    reference.clone()
                } else {
                    rest.next().expect("one result per policy")
                }
            })
            .collect();
        let rows: Vec<Row> = results.iter().map(|r| report::row(r, &reference)).collect();
        let title = workload_title(&common);
        let md = emit(&common, &cfg, &title, &rows, &results, &reference)?;
        all.push((wname.clone(), rows, md));
    }
    if a.suite {
        let summary: Vec<(String, Vec<Row>)> =
            all.iter().map(|(w, r, _)| (w.clone(), r.clone())).collect();
        let table = report::summary(&summary);
        if !a.common.json {
            println!("\nsuite: throughput relative to all-fast\n\n{table}");
        }
        if let Some(dir) = &a.common.out {
            let mut md = format!(
                "## {} at fast:slow {}\n\n{} simulated seconds per run, seed {}, unit {} KiB.\n\n\
                 Throughput relative to all-fast:\n\n{table}\n",
                cfg.model.name,
                a.common.ratio,
                cfg.duration_s,
                cfg.seed,
                cfg.unit_bytes >> 10
            );
            for (_, _, m) in &all {
                if let Some(m) = m {
                    md.push_str(m);
                }
            }
            std::fs::write(dir.join("suite.md"), md)?;
        }
    }
    Ok(())
}

fn run_parallel(
    cfg: &SimConfig,
    wls: &[VmWorkload],
    pols: &[String],
    jobs: usize,
    mp: &indicatif::MultiProgress,
    wname: &str,
) -> anyhow::Result<Vec<RunResult>> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let slots: Vec<std::sync::Mutex<Option<anyhow::Result<RunResult>>>> =
        pols.iter().map(|_| std::sync::Mutex::new(None)).collect();
    std::thread::scope(|s| {
        for _ in 0..jobs.min(pols.len()) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                if i >= pols.len() {
                    break;
                }
                let pb = mp.add(progress_bar(&format!("{wname} {}", pols[i]), false));
                let r = run_one(cfg, wls, &pols[i], Some(&pb), None);
                pb.finish_and_clear();
                *slots[i].lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
            });
        }
    });
    slots
        .into_iter()
        .map(|m| {
            m.into_inner()
                .unwrap_or_else(|e| e.into_inner())
                .unwrap_or_else(|| Err(anyhow::anyhow!("run did not finish")))
        })
        .collect()
}

#[derive(serde::Serialize)]
struct JsonOut<'a> {
    workload: &'a str,
    model: &'a str,
    ratio: &'a str,
    duration_s: f64,
    unit_bytes: u64,
    host_pages: HostPages,
    seed: u64,
    rows: &'a [Row],
    /// Each row's accesses over the run: relative throughputs of runs with different references
    /// (all-fast on 4 KiB host pages pays their TLB cost) can be put on one scale.
    accesses: Vec<f64>,
    /// With `--host-pages thp`: per policy, the host folios split and collapsed again.
    #[serde(skip_serializing_if = "Option::is_none")]
    host_folios: Option<Vec<FolioCounts>>,
}

#[derive(serde::Serialize)]
struct FolioCounts {
    policy: String,
    splits: u64,
    collapses: u64,
}

fn folio_counts(results: &[RunResult]) -> Vec<FolioCounts> {
    results
        .iter()
        .map(|r| FolioCounts {
            policy: r.policy.clone(),
            splits: r.vms.iter().map(|v| v.splits).sum(),
            collapses: r.vms.iter().map(|v| v.collapses).sum(),
        })
        .collect()
}

fn emit(
    c: &Common,
    cfg: &SimConfig,
    title: &str,
    rows: &[Row],
    results: &[RunResult],
    reference: &RunResult,
) -> anyhow::Result<Option<String>> {
    if c.json {
        let j = JsonOut {
            workload: title,
            model: &cfg.model.name,
            ratio: &c.ratio,
            duration_s: cfg.duration_s,
            unit_bytes: cfg.unit_bytes,
            host_pages: cfg.host_pages,
            seed: cfg.seed,
            rows,
            accesses: results.iter().map(|r| r.accesses()).collect(),
            host_folios: (cfg.host_pages == HostPages::Thp).then(|| folio_counts(results)),
        };
        println!("{}", serde_json::to_string(&j)?);
    } else {
        println!(
            "\n{title} on {} at fast:slow {}, {} s, seed {}{}\n",
            cfg.model.name,
            c.ratio,
            cfg.duration_s,
            cfg.seed,
            match cfg.host_pages {
                HostPages::NotModelled => "",
                HostPages::Base => ", 4 KiB host pages",
                HostPages::Thp => ", host THP",
            }
        );
        print!("{}", report::table(rows));
        if cfg.host_pages == HostPages::Thp {
            println!();
            for f in folio_counts(results) {
                println!(
                    "{}: {} host folios split, {} collapsed again",
                    f.policy, f.splits, f.collapses
                );
            }
        }
        if reference.vms.len() > 1 {
            print!("\nper VM:\n\n{}", report::per_vm_table(results, reference));
        }
    }
    let Some(dir) = &c.out else {
        return Ok(None);
    };
    let prefix = title.replace(['/', ' '], "_");
    let w = report::write_plots(dir, &prefix, title, results, reference)?;
    let desc = WORKLOADS
        .iter()
        .find(|x| x.0 == title)
        .map_or(String::new(), |x| format!("{}.\n\n", x.1));
    let mut md = format!(
        "### {title} ({}, fast:slow {})\n\n{desc}{}\n",
        cfg.model.name,
        c.ratio,
        report::table(rows)
    );
    if reference.vms.len() > 1 {
        md.push_str(&format!(
            "Per VM: throughput relative to the same VM under all-fast (overall: geometric mean \
             and total), and the fast quota at the end of the run (GiB):\n\n{}\n",
            report::per_vm_table(results, reference)
        ));
    }
    md.push_str(&format!(
        "\n![throughput over time]({})\n\n![fast-tier occupancy]({})\n\n![hotness]({})\n",
        w.throughput_svg, w.occupancy_svg, w.heatmap_svg
    ));
    if let Some(p) = &w.placement_svg {
        md.push_str(&format!("\n![vtism placement]({p})\n"));
    }
    md.push_str(&format!("\nTimeline: [{}]({})\n\n", w.csv, w.csv));
    let path = dir.join(format!("{prefix}-report.md"));
    std::fs::write(&path, format!("#{md}"))?;
    if !c.json {
        println!("\nreport: {}", path.display());
    }
    Ok(Some(md))
}
