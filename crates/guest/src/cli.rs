//! `vtism guest`: the DAMON agent (see docs/guest.md, "The DAMON agent").

use crate::agent::{self, Config, IfBusy};
use crate::intervals::LoopParams;
use clap::Args;
use std::path::PathBuf;

/// Options of `vtism guest`. Must run as root inside the guest: it writes DAMON's sysfs, maps
/// the PCI BAR and reads /proc/kpageflags and /proc/iomem.
#[derive(Args, Debug)]
pub struct GuestArgs {
    /// The ivshmem device's BAR2 (`/sys/bus/pci/devices/<bdf>/resource2`); found automatically
    /// (first 1af4:1110 device) when omitted.
    #[arg(long)]
    pub channel: Option<PathBuf>,
    /// CPU the kdamond and the agent may use together, in basis points of one CPU (100 = 1%):
    /// the sampling interval and the round period stay long enough to keep within it.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub cpu_budget_bp: u64,
    /// The share of access events DAMON should see per aggregation, basis points (0 = the
    /// host's fast_quota_bytes over the guest's RAM, 4% while the host gives none).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=10_000))]
    pub access_goal_bp: u64,
    /// The first sampling interval, µs.
    #[arg(long, default_value_t = 100_000)]
    pub sample_us: u64,
    /// Bounds of the sampling interval, µs (DAMON's recommendation: 5 ms to 10 s).
    #[arg(long, default_value_t = 5_000)]
    pub sample_min_us: u64,
    #[arg(long, default_value_t = 10_000_000)]
    pub sample_max_us: u64,
    /// At least this many samples per aggregation (a round is two aggregations in 6.12). DAMON
    /// merges neighbouring regions whose counts differ by at most a tenth of the samples: with
    /// 20, a region used in 2 or 3 samples no longer merges with idle ones.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub aggr_samples_min: u64,
    /// Rounds (aggregations) last at least this long, ms; the host's min_interval_ms and the
    /// CPU budget may lengthen them.
    #[arg(long, default_value_t = 1000)]
    pub round_ms: u64,
    /// DAMON's minimum number of regions.
    #[arg(long, default_value_t = 1000)]
    pub min_nr_regions: u64,
    /// DAMON's maximum number of regions.
    #[arg(long, default_value_t = 10000)]
    pub max_nr_regions: u64,
    /// Publish at most this many entries per round (0 = the channel's capacity / host budget).
    #[arg(long, default_value_t = 0)]
    pub max_entries: u64,
    /// At most this many frames (2 MiB units count one) keep a share; past that the coldest
    /// are evicted, counted as `evicted`.
    #[arg(long, default_value_t = crate::frames::DEFAULT_MAX_TRACKED)]
    pub max_tracked: usize,
    /// Frames young in at least half their windows get DAMON regions of their own, so their
    /// shares are their own and not a straddling region's; at most this many (0 = off), and at
    /// most (max-nr-regions - RAM ranges - 16) / 2.
    #[arg(long, default_value_t = 4096)]
    pub confirm_frames: usize,
    /// While someone else uses DAMON (kdamonds in its sysfs interface, DAMON_RECLAIM or
    /// DAMON_LRU_SORT enabled): wait, touching nothing, until it is free; or exit with an error.
    #[arg(long, value_enum, default_value_t = IfBusy::Wait)]
    pub if_busy: IfBusy,
    /// How often to look again whether DAMON is free, ms.
    #[arg(long, default_value_t = 2000)]
    pub busy_poll_ms: u64,
    /// Stop after this many rounds (0 = run until SIGINT/SIGTERM).
    #[arg(long, default_value_t = 0)]
    pub rounds: u64,
    /// Use an ivshmem region that holds something other than a vtism channel.
    #[arg(long)]
    pub claim_any: bool,
    /// After each round, write the round number published to this file (for scripts).
    #[arg(long)]
    pub status_file: Option<PathBuf>,
    /// After each round, write the agent's statistics here (`name value` lines).
    #[arg(long)]
    pub stats_file: Option<PathBuf>,
    /// DAMON's sysfs admin directory.
    #[arg(long, default_value = crate::damon::DEFAULT_ROOT, hide = true)]
    pub damon_root: PathBuf,
}

impl GuestArgs {
    fn config(self) -> anyhow::Result<Config> {
        if self.sample_min_us == 0 || self.sample_min_us > self.sample_max_us {
            anyhow::bail!(
                "--sample-min-us ({}) must be at least 1 and at most --sample-max-us ({})",
                self.sample_min_us,
                self.sample_max_us
            );
        }
        Ok(Config {
            channel: self.channel,
            pci_devices: PathBuf::from(crate::pci::PCI_DEVICES),
            damon_root: self.damon_root,
            modules_root: PathBuf::from(crate::damon::MODULES_ROOT),
            proc_root: PathBuf::from("/proc"),
            iomem: PathBuf::from("/proc/iomem"),
            kpageflags: PathBuf::from("/proc/kpageflags"),
            loop_params: LoopParams {
                sample_min_us: self.sample_min_us,
                sample_max_us: self.sample_max_us,
                aggr_samples_min: self.aggr_samples_min,
                round_min_us: self.round_ms.saturating_mul(1000),
                cpu_budget: self.cpu_budget_bp as f64 / 10_000.0,
                goal_override: (self.access_goal_bp > 0)
                    .then(|| self.access_goal_bp as f64 / 10_000.0),
            },
            sample_us: self.sample_us,
            min_nr_regions: self.min_nr_regions,
            max_nr_regions: self.max_nr_regions,
            max_entries: self.max_entries,
            max_tracked: self.max_tracked,
            confirm_frames: self.confirm_frames,
            if_busy: self.if_busy,
            busy_poll_ms: self.busy_poll_ms,
            rounds: self.rounds,
            claim_any: self.claim_any,
            status_file: self.status_file,
            stats_file: self.stats_file,
        })
    }
}

pub fn guest_main(args: GuestArgs) -> anyhow::Result<()> {
    agent::run(&args.config()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cmd {
        #[command(flatten)]
        guest: GuestArgs,
    }

    #[test]
    fn defaults_follow_the_design() {
        let c = Cmd::parse_from(["vtism-guest"]).guest.config().unwrap();
        let p = c.loop_params;
        assert_eq!(p.cpu_budget, 0.01);
        assert_eq!(p.goal_override, None);
        assert_eq!((p.sample_min_us, p.sample_max_us), (5_000, 10_000_000));
        assert_eq!(c.if_busy, IfBusy::Wait);
        let first = agent::first_intervals(&p, c.sample_us);
        assert_eq!((first.sample_us, first.aggr_us), (100_000, 2_000_000));
        let fast = agent::first_intervals(&p, 10_000);
        assert_eq!((fast.sample_us, fast.aggr_us), (10_000, 500_000));
        let c = Cmd::parse_from([
            "vtism-guest",
            "--access-goal-bp",
            "250",
            "--if-busy",
            "exit",
        ])
        .guest
        .config()
        .unwrap();
        assert_eq!(c.loop_params.goal_override, Some(0.025));
        assert_eq!(c.if_busy, IfBusy::Exit);
    }

    #[test]
    fn bad_options_are_named() {
        assert!(Cmd::try_parse_from(["vtism-guest", "--cpu-budget-bp", "0"]).is_err());
        assert!(Cmd::try_parse_from(["vtism-guest", "--if-busy", "steal"]).is_err());
        let e = Cmd::parse_from([
            "vtism-guest",
            "--sample-min-us",
            "20",
            "--sample-max-us",
            "10",
        ])
        .guest
        .config()
        .unwrap_err();
        assert!(e.to_string().contains("--sample-min-us"), "{e}");
    }
}
