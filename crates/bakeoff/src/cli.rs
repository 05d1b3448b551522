//! `vtism bakeoff` arguments.

use crate::conduct::{self, ConductArgs};
use crate::driver::{self, RunOptions};
use crate::plan::{self, Manager};
use std::path::PathBuf;
use vtism_testbed::emulated_host;

const AFTER_HELP: &str = "\
What it does: boots the testbed's emulated host (two sockets, DRAM nodes 0-1, CPU-less CXL nodes \
2-3 in a lower memory tier via HMAT, Debian's 6.12 kernel) once per workload, with a nested guest \
whose RAM starts on the CXL nodes, and runs the workload under each manager in turn from the same \
starting placement: none, AutoNUMA (numa_balancing=1), the kernel's memory tiering \
(numa_balancing=2 + demotion), DAMON-based tiering on the host (DAMOS migrate_hot/cold, the \
published recipe), vtism with vtism_guest.ko and vtism with the DAMON agent. Every manager gets \
the same DRAM. Every second it samples where each guest frame is and the workload's ground truth; \
the report gives the share of accesses served from DRAM, time to 90% of the steady state, bytes \
migrated, DRAM use against the limit and the manager's CPU time, plus the seed's promotion-speed \
experiment and a cross-check with `vtism sim` (docs/bakeoff.md).

Workloads: gups-hotset, gups-move, redis-zipf (Debian's redis-server under a zipfian key load, \
ground truth from a QEMU TCG plugin), promote-speed.

Time: each workload boots the nested guest once (2 to 7 minutes under TCG inside TCG on 2 \
cores), then takes 3 to 6 minutes per manager (guest RAM back on CXL, DRAM held, the workload \
populating its memory, the run, the stop); measured on a shared 2-core machine, gups-hotset with \
six managers at 90 s each took 44 minutes under load, so the whole bake-off takes two to four hours and \
`--smoke` about 10 minutes.

Needs what `vtism testbed` needs (scripts/install-deps.sh demo, root, about 5 GiB of RAM) and \
network access to Debian's archive on first use (the QEMU source for the plugin header, redis).";

#[derive(clap::Args, Debug)]
#[command(args_conflicts_with_subcommands = true, after_help = AFTER_HELP)]
pub struct BakeoffArgs {
    #[command(subcommand)]
    pub command: Option<BakeoffCommand>,
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(clap::Subcommand, Debug)]
pub enum BakeoffCommand {
    /// Write docs/bakeoff.md, results.json and the plots again from a results directory.
    Report(ReportArgs),
    /// Inside the emulated host: run the plan (started by testbed/bakeoff-inner.sh).
    #[command(hide = true)]
    Conduct(ConductArgs),
    /// Inside the emulated host: a process that sleeps on a CPU a short time at a time (the
    /// DAMON probe's second phase, crate::damon_watch).
    #[command(hide = true)]
    TlbFlusher {
        #[arg(long)]
        cpu: usize,
        #[arg(long)]
        period_us: u64,
    },
}

#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// Only these workloads (default: all four).
    #[arg(long, value_delimiter = ',')]
    pub workloads: Vec<String>,
    /// Only these managers (default: every one the workload runs).
    #[arg(long, value_delimiter = ',', value_enum)]
    pub managers: Vec<Manager>,
    /// The smoke version: gups-hotset under the kernel's tiering and vtism with the module,
    /// 120 s each (what `make test` would run).
    #[arg(long)]
    pub smoke: bool,
    /// Check that every run went through and every manager acted, print "N passed, M failed"
    /// (the test's form) and fail on any failed check.
    #[arg(long)]
    pub check: bool,
    /// Seconds per manager instead of the workload's own.
    #[arg(long)]
    pub run_s: Option<u64>,
    /// Raw results (default: build/bakeoff/<unix time>).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// The report to write (default: docs/bakeoff.md of the repository; with --smoke or a
    /// selection of workloads or managers: <out>/bakeoff.md).
    #[arg(long)]
    pub docs: Option<PathBuf>,
    /// The vtism repository (default: the one this binary was built in).
    #[arg(long)]
    pub repo: Option<PathBuf>,
    /// QEMU accelerator of the emulated host: auto, tcg, kvm.
    #[arg(long, default_value = "auto", value_parser = ["auto", "tcg", "kvm"])]
    pub accel: String,
}

#[derive(clap::Args, Debug)]
pub struct ReportArgs {
    /// The results directory of a run (build/bakeoff/<time>).
    #[arg(long)]
    pub runs: PathBuf,
    /// The report to write (default: docs/bakeoff.md of the repository).
    #[arg(long)]
    pub docs: Option<PathBuf>,
}

pub fn bakeoff_main(a: BakeoffArgs) -> anyhow::Result<()> {
    match a.command {
        Some(BakeoffCommand::Conduct(c)) => return conduct::conduct(c),
        Some(BakeoffCommand::TlbFlusher { cpu, period_us }) => {
            return crate::damon_watch::tlb_flusher(cpu, period_us)
        }
        Some(BakeoffCommand::Report(r)) => {
            let md = match r.docs {
                Some(d) => d,
                None => emulated_host::find_repo(None)?.join("docs/bakeoff.md"),
            };
            return driver::write_docs(&r.runs, &md);
        }
        None => {}
    }
    let r = a.run;
    let repo = emulated_host::find_repo(r.repo)?;
    let mut workloads = if r.smoke {
        plan::smoke()
    } else {
        plan::standard()
    };
    let names: Vec<String> = workloads.iter().map(|w| w.name.clone()).collect();
    for w in &r.workloads {
        if !names.contains(w) {
            anyhow::bail!(
                "--workloads: unknown workload {w:?}; one of: {}",
                names.join(", ")
            );
        }
    }
    let partial = r.smoke || !r.workloads.is_empty() || !r.managers.is_empty() || r.run_s.is_some();
    if !r.workloads.is_empty() {
        workloads.retain(|w| r.workloads.contains(&w.name));
    }
    for w in &mut workloads {
        if !r.managers.is_empty() {
            w.managers.retain(|m| r.managers.contains(m));
        }
        if let Some(s) = r.run_s {
            w.run_s = s;
        }
    }
    workloads.retain(|w| !w.managers.is_empty());
    if workloads.is_empty() {
        anyhow::bail!("nothing to run: no workload runs any of the managers asked for");
    }
    let out = r.out.unwrap_or_else(|| {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        repo.join(format!(
            "build/bakeoff/{}{t}",
            if r.smoke { "smoke-" } else { "" }
        ))
    });
    let docs = match r.docs {
        Some(d) => d,
        None if partial => out.join("bakeoff.md"),
        None => repo.join("docs/bakeoff.md"),
    };
    driver::run(RunOptions {
        repo,
        out,
        docs: Some(docs),
        workloads,
        accel: r.accel,
        check: r.check,
    })
}
