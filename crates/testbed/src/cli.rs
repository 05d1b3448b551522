//! `vtism testbed` arguments.

use crate::driver::{self, RunOptions};
use crate::emulated_host;
use crate::probe::{self, ProbeArgs};
use crate::settings::{Profile, Settings};
use std::path::PathBuf;

const AFTER_HELP: &str = "\
What it does: boots an emulated host under QEMU (TCG unless KVM really works here) with two \
sockets, each with a DRAM node and a CPU-less \"CXL\" node that HMAT marks as slower, running \
Debian's 6.12 kernel with this machine's root shared read-only (so the built binaries run \
unchanged). Inside it: vtismd, and a nested guest whose RAM starts on the CXL nodes, running a \
GUPS workload with a hot set that fits the guest's DRAM quota. The guest runs first without the \
tracker (control), then loads vtism_guest.ko; the probe samples, every second, where the \
workload's hot and cold frames are, the guest's DRAM use against its quota, vtismd's hint rounds \
and moves, and the workload's throughput.

Time: without KVM the nested guest takes about five minutes to boot and populate its workload \
(TCG inside TCG, idle 2-core machine); `--profile test` about 12 minutes in all, the demo longer.

Output: progress per sample, then a summary, the checks (PASS/FAIL) and report.md with \
placement.svg, memory.svg and activity.svg in the results directory.

Needs: qemu-system-x86, busybox-static, cpio, gcc + libc6-dev, python3 (scripts/install-deps.sh \
demo), root (the emulated host shares / over virtfs), about 5 GiB of RAM. Exit status: 0 when \
every check passed.";

#[derive(clap::Args, Debug)]
#[command(args_conflicts_with_subcommands = true, after_help = AFTER_HELP)]
pub struct TestbedArgs {
    #[command(subcommand)]
    pub command: Option<TestbedCommand>,
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(clap::Subcommand, Debug)]
pub enum TestbedCommand {
    /// Inside the emulated host: sample the run (started by testbed/inner.sh).
    #[command(hide = true)]
    Probe(ProbeArgs),
}

#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// Sizes and timings: `demo` (bigger, keeps running after convergence) or `test` (the
    /// full-stack test's smaller run).
    #[arg(long, value_enum, default_value_t = Profile::Demo)]
    pub profile: Profile,
    /// Results directory (default: build/testbed/runs/<profile>-<unix time>-<pid>).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// The vtism repository (default: the one this binary was built in).
    #[arg(long)]
    pub repo: Option<PathBuf>,
    /// Print "N passed, M failed" after the checks (the test's form); the exit status is
    /// non-zero on any failed check either way.
    #[arg(long)]
    pub check: bool,
    /// QEMU accelerator of the emulated host: auto (KVM only if a KVM guest really boots), tcg, kvm.
    #[arg(long, default_value = "auto", value_parser = ["auto", "tcg", "kvm"])]
    pub accel: String,
    /// Override the profile's DRAM quota of the guest (MiB).
    #[arg(long)]
    pub quota_mib: Option<u64>,
    /// Override the profile's control phase (seconds without the tracker).
    #[arg(long)]
    pub control_s: Option<u64>,
    /// The workload's shape: seconds between two round-robin touches of one cold page (the
    /// profiles' 2; 0 = none).
    #[arg(long, value_name = "S")]
    pub cold_period: Option<u64>,
    /// The workload's shape: share of the GUPS updates spread uniformly over the whole region,
    /// as in HeMem's GUPS (0 to below 1; the profiles' 0.1, as HeMem's; 0: every update goes
    /// to the hot set).
    #[arg(long, value_name = "F")]
    pub uniform_share: Option<f64>,
    /// The workload's shape: the hot set moves to the middle of the region this many seconds
    /// after the workload is ready (after the control phase); the new hot set then gets the
    /// tracking limit again. The profiles' 150; 0: it never moves.
    #[arg(long, value_name = "S")]
    pub move_after: Option<u64>,
    /// The workload's shape: the background of --cold-period and --uniform-share starts this
    /// many seconds after the workload is ready; until then every update goes to the hot set and
    /// each cold page is touched once a minute (the calm case). The profiles' 90; 0: from the
    /// start.
    #[arg(long, value_name = "S")]
    pub warm_after: Option<u64>,
    /// Read the guest's channel at every sample and record what it published (`levels` in
    /// samples.jsonl: the hot set's levels per 2 MiB, what else holds DRAM). A diagnostic: it
    /// costs the emulated host a channel read and decode a second.
    #[arg(long)]
    pub capture_levels: bool,
    /// Host transparent huge pages in the emulated host: `default` leaves the kernel's setting
    /// (Debian's: always) and QEMU's use of it; `never` backs guest RAM with 4 KiB host pages.
    #[arg(long, value_enum, default_value_t = HostThp::Never)]
    pub host_thp: HostThp,
}

/// What the emulated host does with transparent huge pages (`--host-thp`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum HostThp {
    /// The kernel's own setting.
    Default,
    /// `never`: guest RAM on 4 KiB host pages.
    Never,
}

impl HostThp {
    /// The value testbed/inner.sh reads (`HOST_THP`).
    pub fn env_value(self) -> &'static str {
        match self {
            HostThp::Default => "default",
            HostThp::Never => "never",
        }
    }
}

pub fn testbed_main(a: TestbedArgs) -> anyhow::Result<()> {
    if let Some(TestbedCommand::Probe(p)) = a.command {
        return probe::probe(p);
    }
    let r = a.run;
    let repo = emulated_host::find_repo(r.repo)?;
    let mut settings = Settings::for_profile(r.profile);
    if let Some(q) = r.quota_mib {
        settings.quota_mib = q;
    }
    if let Some(c) = r.control_s {
        settings.control_s = c;
    }
    if let Some(c) = r.cold_period {
        settings.cold_period_s = c;
    }
    if let Some(u) = r.uniform_share {
        settings.uniform_share = u;
    }
    if let Some(m) = r.move_after {
        settings.move_after_s = m;
    }
    if let Some(w) = r.warm_after {
        settings.warm_after_s = w;
    }
    settings.validate()?;
    let out = r.out.unwrap_or_else(|| {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let p = match r.profile {
            Profile::Demo => "demo",
            Profile::Test => "test",
        };
        // the pid too: two runs started in one second must not share a directory
        repo.join(format!("build/testbed/runs/{p}-{t}-{}", std::process::id()))
    });
    let ok = driver::run(RunOptions {
        repo,
        out,
        settings,
        check: r.check,
        accel: r.accel,
        capture_levels: r.capture_levels,
        host_thp: r.host_thp,
    })?;
    if ok {
        Ok(())
    } else {
        anyhow::bail!("the testbed run failed a check (see above)")
    }
}
