//! `vtism guest`: the DAMON agent (see docs/guest.md, "The DAMON agent").

use crate::agent::{self, Config};
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
    /// K in T = (K·Ts + Kb)·Ts + Tbase (Ts = the round's DAMON and agent CPU time, ms).
    #[arg(long, default_value_t = 8)]
    pub interval_k: u64,
    /// Kb in the interval formula.
    #[arg(long, default_value_t = 50)]
    pub interval_kb: u64,
    /// Tbase in the interval formula, ms.
    #[arg(long, default_value_t = 2500)]
    pub interval_base_ms: u64,
    /// Cap on T, ms (0 = none); the host's min_interval_ms still wins. Capped by default as the
    /// module is: the formula is quadratic in Ts (a 1 s round would mean 2.2 h).
    #[arg(long, default_value_t = 300_000)]
    pub interval_max_ms: u64,
    /// DAMON samples per round (sample interval = T / samples, at least 1 ms).
    #[arg(long, default_value_t = 20)]
    pub samples: u32,
    /// DAMON's minimum number of regions.
    #[arg(long, default_value_t = 1000)]
    pub min_nr_regions: u64,
    /// DAMON's maximum number of regions.
    #[arg(long, default_value_t = 10000)]
    pub max_nr_regions: u64,
    /// Rounds of per-frame history (1-32).
    #[arg(long, default_value_t = 8)]
    pub history_rounds: u32,
    /// Publish frames seen hot in at least this many rounds of the history (higher than the
    /// module's 2: a DAMON region straddling hot and cold frames is reported whole, and its
    /// boundaries move from round to round, so cold neighbours are hot in some rounds only).
    #[arg(long, default_value_t = 6)]
    pub hot_threshold: u32,
    /// A DAMON region is hot in a round when it was seen accessed in at least this many samples.
    #[arg(long, default_value_t = 1)]
    pub min_accesses: u32,
    /// Publish at most this many entries per round (0 = the channel's capacity / host budget).
    #[arg(long, default_value_t = 0)]
    pub max_entries: u64,
    /// At most this many frames (2 MiB units count one) keep a history; past that the coldest
    /// (fewest rounds hot, then least recently hot) are evicted, counted as `evicted`.
    #[arg(long, default_value_t = crate::history::DEFAULT_MAX_TRACKED)]
    pub max_tracked: usize,
    /// Frames seen hot in hot-threshold - 2 rounds (at least 1) get DAMON regions of their own,
    /// so their access counts are their own and not a straddling region's; at most this many
    /// (0 = off), and at most (max-nr-regions - RAM ranges - 16) / 2.
    #[arg(long, default_value_t = 4096)]
    pub confirm_frames: usize,
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

pub fn guest_main(args: GuestArgs) -> anyhow::Result<()> {
    agent::run(&Config {
        channel: args.channel,
        pci_devices: PathBuf::from(crate::pci::PCI_DEVICES),
        damon_root: args.damon_root,
        iomem: PathBuf::from("/proc/iomem"),
        kpageflags: PathBuf::from("/proc/kpageflags"),
        interval_k: args.interval_k,
        interval_kb: args.interval_kb,
        interval_base_ms: args.interval_base_ms,
        interval_max_ms: args.interval_max_ms,
        samples: args.samples,
        min_nr_regions: args.min_nr_regions,
        max_nr_regions: args.max_nr_regions,
        history_rounds: args.history_rounds,
        hot_threshold: args.hot_threshold,
        min_accesses: args.min_accesses,
        max_entries: args.max_entries,
        max_tracked: args.max_tracked,
        confirm_frames: args.confirm_frames,
        rounds: args.rounds,
        claim_any: args.claim_any,
        status_file: args.status_file,
        stats_file: args.stats_file,
    })
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
    fn interval_is_capped_by_default() {
        let c = Cmd::parse_from(["vtism-guest"]);
        assert_eq!(c.guest.interval_max_ms, 300_000);
        // a 1 s round: 2.2 h uncapped, 5 min by default
        let g = &c.guest;
        let t = agent::interval_ms(
            1_000_000,
            g.interval_k,
            g.interval_kb,
            g.interval_base_ms,
            g.interval_max_ms,
        );
        assert_eq!(t, 300_000);
        let c = Cmd::parse_from(["vtism-guest", "--interval-max-ms", "0"]);
        assert_eq!(c.guest.interval_max_ms, 0);
    }
}
