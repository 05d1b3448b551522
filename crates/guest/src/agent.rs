//! The agent's loop: wait until DAMON is free, then per aggregation: shares, publication, the
//! intervals loop and confirmation.

use crate::confirm::{self, Confirm};
use crate::damon::{Attrs, Busy, Kdamond, Region, Start};
use crate::frames::Frames;
use crate::intervals::{self, CommitAllowance, Intervals, Limit, LoopParams, Observation};
use crate::kpageflags::KpageFlags;
use crate::{cpu, iomem, pci};
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use vtism_proto::layout::{off, MAGIC};
use vtism_proto::{
    ChannelVersion, ChannelWriter, Micros, MmapRegion, RoundMeta, SharedRegion, Tracker,
    TrackerReport, WriterConfig,
};

/// What to do while DAMON is in use by someone else.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum IfBusy {
    /// Wait (touching nothing) until DAMON is free, then start.
    Wait,
    /// Exit with an error.
    Exit,
}

/// Everything the loop needs from the command line.
#[derive(Clone, Debug)]
pub struct Config {
    pub channel: Option<PathBuf>,
    pub pci_devices: PathBuf,
    pub damon_root: PathBuf,
    pub modules_root: PathBuf,
    pub proc_root: PathBuf,
    pub iomem: PathBuf,
    pub kpageflags: PathBuf,
    pub loop_params: LoopParams,
    /// The first sampling interval, µs.
    pub sample_us: u64,
    pub min_nr_regions: u64,
    pub max_nr_regions: u64,
    pub max_entries: u64,
    /// At most this many frames (units) keep a share (the coldest are evicted).
    pub max_tracked: usize,
    /// At most this many frames get DAMON regions of their own (0 = no confirmation).
    pub confirm_frames: usize,
    pub if_busy: IfBusy,
    /// How often to look again whether DAMON is free, ms.
    pub busy_poll_ms: u64,
    pub rounds: u64,
    pub claim_any: bool,
    /// Written with the last published round number after each round.
    pub status_file: Option<PathBuf>,
    /// Written with the agent's statistics (`name value` lines) after each round.
    pub stats_file: Option<PathBuf>,
}

/// The agent's counters, written to `--stats-file` after each round.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Stats {
    pub rounds: u64,
    pub last_entries: u64,
    pub last_hot_frames: u64,
    pub sample_us: u64,
    pub aggr_us: u64,
    /// Access events of the last aggregation over those possible, and the goal, ppm.
    pub access_ppm: u64,
    pub goal_ppm: u64,
    /// What held the sampling interval: 0 the goal, 1 the CPU budget, 2 a bound.
    pub limit: u64,
    pub quota_bytes: u64,
    pub last_regions: u64,
    pub tracked: u64,
    pub max_tracked: u64,
    pub evicted: u64,
    pub confirmed: u64,
    pub confirm_cap: u64,
    pub confirm_commits: u64,
    pub attr_commits: u64,
    pub overflow_rounds: u64,
    /// Sampling intervals since DAMON started.
    pub windows: u64,
    /// CPU of the kdamond and of the agent since DAMON started, and the last round's, µs.
    pub kdamond_cpu_us: u64,
    pub agent_cpu_us: u64,
    pub last_tracker_cpu_us: u64,
    /// Time since DAMON started, µs.
    pub elapsed_us: u64,
    /// Time spent waiting for DAMON to be free, ms.
    pub waited_ms: u64,
    /// The agent's CPU since DAMON started by what it did, µs: reading DAMON's regions, turning
    /// them into frame rates (and ranking them), publishing, and committing DAMON's settings.
    pub regions_cpu_us: u64,
    pub observe_cpu_us: u64,
    pub publish_cpu_us: u64,
    pub commit_cpu_us: u64,
    /// Rounds in which confirming frames waited for the CPU budget (`CommitAllowance`).
    pub confirm_deferred: u64,
}

impl Stats {
    /// `name value` lines, one per counter.
    pub fn render(&self) -> String {
        let Stats {
            rounds,
            last_entries,
            last_hot_frames,
            sample_us,
            aggr_us,
            access_ppm,
            goal_ppm,
            limit,
            quota_bytes,
            last_regions,
            tracked,
            max_tracked,
            evicted,
            confirmed,
            confirm_cap,
            confirm_commits,
            attr_commits,
            overflow_rounds,
            windows,
            kdamond_cpu_us,
            agent_cpu_us,
            last_tracker_cpu_us,
            elapsed_us,
            waited_ms,
            regions_cpu_us,
            observe_cpu_us,
            publish_cpu_us,
            commit_cpu_us,
            confirm_deferred,
        } = self;
        [
            ("rounds", rounds),
            ("last_entries", last_entries),
            ("last_hot_frames", last_hot_frames),
            ("sample_us", sample_us),
            ("aggr_us", aggr_us),
            ("access_ppm", access_ppm),
            ("goal_ppm", goal_ppm),
            ("limit", limit),
            ("quota_bytes", quota_bytes),
            ("last_regions", last_regions),
            ("tracked", tracked),
            ("max_tracked", max_tracked),
            ("evicted", evicted),
            ("confirmed", confirmed),
            ("confirm_cap", confirm_cap),
            ("confirm_commits", confirm_commits),
            ("attr_commits", attr_commits),
            ("overflow_rounds", overflow_rounds),
            ("windows", windows),
            ("kdamond_cpu_us", kdamond_cpu_us),
            ("agent_cpu_us", agent_cpu_us),
            ("last_tracker_cpu_us", last_tracker_cpu_us),
            ("elapsed_us", elapsed_us),
            ("waited_ms", waited_ms),
            ("regions_cpu_us", regions_cpu_us),
            ("observe_cpu_us", observe_cpu_us),
            ("publish_cpu_us", publish_cpu_us),
            ("commit_cpu_us", commit_cpu_us),
            ("confirm_deferred", confirm_deferred),
        ]
        .iter()
        .map(|(n, v)| format!("{n} {v}\n"))
        .collect()
    }
}

/// Frames that can get regions of their own: DAMON's region count must stay at most
/// `max_regions` after a commit (each frame adds at most two ranges to the RAM ranges), or its
/// merging raises its threshold until hot and cold regions merge.
pub fn confirm_cap(wanted: usize, max_regions: u64, ram_ranges: usize) -> usize {
    let room = max_regions.saturating_sub(ram_ranges as u64 + 16) / 2;
    wanted.min(usize::try_from(room).unwrap_or(usize::MAX))
}

/// DAMON attributes for intervals: regions are re-checked (paddr has nothing to update) once
/// per aggregation.
pub fn attrs_for(iv: Intervals, min_regions: u64, max_regions: u64) -> Attrs {
    Attrs {
        sample_us: iv.sample_us,
        aggr_us: iv.aggr_us,
        update_us: iv.aggr_us,
        min_nr_regions: min_regions,
        max_nr_regions: max_regions,
    }
}

/// The intervals to start with: `sample_us` within the bounds, an aggregation of at least its
/// share of a round and `aggr_samples_min` samples.
pub fn first_intervals(p: &LoopParams, sample_us: u64) -> Intervals {
    let s = sample_us.clamp(p.sample_min_us.max(1), p.sample_max_us.max(p.sample_min_us));
    let n = (p.round_min_us / intervals::AGGREGATIONS_PER_ROUND)
        .div_ceil(s)
        .max(p.aggr_samples_min)
        .max(1);
    Intervals {
        sample_us: s,
        aggr_us: n * s,
    }
}

/// Access events over those possible in an aggregation: bytes times samples found young, over
/// all monitored bytes times the samples (DAMON's `intervals_goal` score, size-weighted).
pub fn access_share(regions: &[Region], samples: u64, monitored_bytes: u64) -> f64 {
    if monitored_bytes == 0 || samples == 0 {
        return 0.0;
    }
    let events: f64 = regions
        .iter()
        .map(|r| (r.end - r.start) as f64 * u64::from(r.nr_accesses).min(samples) as f64)
        .sum();
    events / (monitored_bytes as f64 * samples as f64)
}

fn sat_u32(x: u64) -> u32 {
    u32::try_from(x).unwrap_or(u32::MAX)
}

/// The v1.1 tracker report. DAMON has one kind of window: every sampling interval is a window
/// of every region, so the sampling interval is both the fine and the coarse window, and
/// `windows` counts sampling intervals. `tracked` counts frames and 2 MiB units with a share.
pub fn tracker_report(iv: Intervals, windows: u64, cpu_us: u64, tracked: usize) -> TrackerReport {
    let w = Micros(sat_u32(iv.sample_us));
    TrackerReport {
        window: w,
        coarse_window: w,
        windows: sat_u32(windows),
        tracker_cpu: Micros(sat_u32(cpu_us)),
        tracked_frames: tracked as u64,
    }
}

/// Writes `text` to `path` through a temporary file and a rename, so a reader never sees half.
fn write_atomic(path: &Path, text: &str) -> Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display()))
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

fn install_signals() -> Result<()> {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: a zeroed sigaction with a handler that only stores to an atomic
        // (async-signal-safe); no SA_RESTART, so a blocking sysfs write or sleep returns EINTR.
        let rc = unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut())
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error()).context("sigaction");
        }
    }
    Ok(())
}

fn stopped() -> bool {
    STOP.load(Ordering::SeqCst)
}

/// Sleeps `ms`, returning early (false) when asked to stop.
fn sleep_unless_stopped(ms: u64) -> bool {
    let end = std::time::Instant::now() + std::time::Duration::from_millis(ms);
    while !stopped() {
        let now = std::time::Instant::now();
        if now >= end {
            return true;
        }
        std::thread::sleep((end - now).min(std::time::Duration::from_millis(100)));
    }
    false
}

/// Refuses a region whose guest half is neither all zero nor a vtism channel, as the module
/// does, so the agent never scribbles over an ivshmem region used for something else.
fn check_claim(r: &MmapRegion) -> Result<()> {
    if r.load_u64(off::MAGIC)? == MAGIC {
        return Ok(());
    }
    for o in (0..off::GUEST_END).step_by(8) {
        if r.load_u64(o)? != 0 {
            bail!("the ivshmem region holds something that is not a vtism channel (--claim-any overrides)");
        }
    }
    Ok(())
}

/// Starts a kdamond of our own once DAMON is free; `None` if asked to stop meanwhile. Never
/// writes anything while someone else uses DAMON.
fn wait_for_damon(
    cfg: &Config,
    ranges: &[iomem::PhysRange],
    attrs: &Attrs,
) -> Result<Option<Kdamond>> {
    let mut last: Option<Busy> = None;
    loop {
        if stopped() {
            return Ok(None);
        }
        let busy = match crate::damon::busy(&cfg.damon_root, &cfg.modules_root)? {
            Some(b) => Some(b),
            None => match Kdamond::start_new(&cfg.damon_root, ranges, attrs)? {
                Start::Running(k) => return Ok(Some(k)),
                Start::Busy(b) => Some(b),
            },
        };
        if let Some(b) = busy {
            if cfg.if_busy == IfBusy::Exit {
                bail!(
                    "DAMON is in use: {b}. The agent touches nothing that is not its own; it \
                     starts once DAMON is free (without --if-busy exit), or track this guest with \
                     the vtism_guest module (docs/guest.md, \"Coexistence with other DAMON users\")"
                );
            }
            if last.as_ref() != Some(&b) {
                tracing::warn!("DAMON is in use: {b}; waiting until it is free, touching nothing");
                last = Some(b);
            }
            if !sleep_unless_stopped(cfg.busy_poll_ms.max(10)) {
                return Ok(None);
            }
        }
    }
}

pub fn run(cfg: &Config) -> Result<()> {
    let iomem_text = std::fs::read_to_string(&cfg.iomem)
        .with_context(|| format!("reading {}", cfg.iomem.display()))?;
    let ranges = iomem::system_ram(&iomem_text, 1 << 20);
    if ranges.is_empty() {
        bail!("no System RAM in {} (not root?)", cfg.iomem.display());
    }
    let monitored: u64 = ranges.iter().map(|r| r.end - r.start).sum();
    let flags = KpageFlags::open(&cfg.kpageflags)
        .with_context(|| format!("opening {}", cfg.kpageflags.display()))?;

    let bar = match &cfg.channel {
        Some(p) => p.clone(),
        None => {
            let dev = pci::find_ivshmem(&cfg.pci_devices)?;
            pci::enable(&dev)?;
            dev.join("resource2")
        }
    };
    let region = pci::map_bar(&bar)?;
    if !cfg.claim_any {
        check_claim(&region)?;
    }
    let mut w = ChannelWriter::init_with(
        region,
        WriterConfig {
            tracker: Tracker::Damon,
            region_size: None,
            preserve_feedback: true,
            // counts are rate levels
            version: ChannelVersion::V1_1,
        },
    )?;
    tracing::info!(bar = %bar.display(), capacity = w.capacity(), "channel initialised");
    install_signals()?;

    let p = cfg.loop_params;
    let min_regions = cfg.min_nr_regions.max(ranges.len() as u64).max(3);
    let max_regions = cfg.max_nr_regions.max(min_regions);
    let mut iv = first_intervals(&p, cfg.sample_us);
    let waited = std::time::Instant::now();
    let Some(mut kd) = wait_for_damon(cfg, &ranges, &attrs_for(iv, min_regions, max_regions))?
    else {
        tracing::info!("stopped while waiting for DAMON");
        return Ok(());
    };
    let waited_ms = waited.elapsed().as_millis() as u64;
    let result = track(
        cfg, &mut kd, &mut w, &flags, &ranges, monitored, &mut iv, waited_ms,
    );
    let removed = kd.remove();
    tracing::info!("DAMON stopped");
    result.and(removed)
}

/// CPU and time at the end of a round.
#[derive(Clone, Copy)]
struct Clock {
    now_ns: u64,
    kdamond_ns: u64,
    own_ns: u64,
}

impl Clock {
    fn read(cfg: &Config, pid: Option<u32>, last: Option<Clock>) -> Clock {
        let kdamond_ns = pid
            .and_then(|p| cpu::thread_cpu_ns(&cfg.proc_root, p))
            .or(last.map(|c| c.kdamond_ns))
            .unwrap_or(0);
        Clock {
            now_ns: cpu::monotonic_ns(),
            kdamond_ns,
            own_ns: cpu::own_cpu_ns(),
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn track<R: SharedRegion>(
    cfg: &Config,
    kd: &mut Kdamond,
    w: &mut ChannelWriter<R>,
    flags: &KpageFlags,
    ranges: &[iomem::PhysRange],
    monitored: u64,
    iv: &mut Intervals,
    waited_ms: u64,
) -> Result<()> {
    let p = cfg.loop_params;
    let min_regions = cfg.min_nr_regions.max(ranges.len() as u64).max(3);
    let max_regions = cfg.max_nr_regions.max(min_regions);
    let pid = kd.pid();
    tracing::info!(
        kdamond = kd.index(),
        ?pid,
        ranges = ranges.len(),
        ?iv,
        "DAMON started"
    );
    let mut frames = Frames::new(iv.sample_us as f64 / 1e6, cfg.max_tracked);
    frames.set_stop(stopped);
    let cap = confirm_cap(cfg.confirm_frames, max_regions, ranges.len());
    let mut confirm = Confirm::new(cap, confirm::ADMIT_SHARE);
    let mut stats = Stats {
        max_tracked: cfg.max_tracked as u64,
        confirm_cap: cap as u64,
        waited_ms,
        ..Stats::default()
    };
    let start = Clock::read(cfg, pid, None);
    let mut last = start;
    // kdamond CPU per sample, smoothed over rounds
    let mut per_sample_us = 0.0f64;
    let mut allowance = CommitAllowance::default();
    let mut rounds = 0u64;
    while !stopped() && (cfg.rounds == 0 || rounds < cfg.rounds) {
        let regions_start = cpu::own_cpu_ns();
        let regions = match kd.tried_regions() {
            Ok(r) => r,
            Err(_) if stopped() => break,
            Err(e) if !kd.running() => {
                return Err(e.context("the kdamond was turned off by someone else"))
            }
            Err(e) => return Err(e),
        };
        let round_start_own = cpu::own_cpu_ns();
        stats.regions_cpu_us += round_start_own.saturating_sub(regions_start) / 1000;
        let samples = iv.samples();
        let observed = match frames.observe(&regions, samples as u32, flags) {
            Ok(o) => o,
            Err(_) if stopped() => break,
            Err(e) => return Err(e.into()),
        };
        let share = access_share(&regions, samples, monitored);
        let fb = w.read_feedback().ok().flatten();
        let quota = fb.map_or(0, |f| f.fast_quota_bytes);
        let goal = intervals::access_goal(quota, monitored, p.goal_override);
        let ranked = frames.ranked();
        let mut entries = ranked.entries;
        let mut overflow = false;
        if cfg.max_entries > 0 && entries.len() as u64 > cfg.max_entries {
            entries.truncate(cfg.max_entries as usize);
            overflow = true;
        }
        let publish_start = cpu::own_cpu_ns();
        stats.observe_cpu_us += publish_start.saturating_sub(round_start_own) / 1000;
        let now = Clock::read(cfg, pid, Some(last));
        let elapsed_us = now.now_ns.saturating_sub(last.now_ns) / 1000;
        let kd_us = now.kdamond_ns.saturating_sub(last.kdamond_ns) / 1000;
        let own_us = now.own_ns.saturating_sub(last.own_ns) / 1000;
        let windows = elapsed_us / iv.sample_us.max(1);
        let published = w.publish(
            &entries,
            &RoundMeta {
                overflow,
                scan_interval_ms: sat_u32(elapsed_us / 1000),
                scan_duration_us: sat_u32(kd_us + own_us),
                tracked_bytes: monitored,
                hot_frames: ranked.hot_frames,
                publish_time_ns: cpu::monotonic_ns(),
                tracker_report: tracker_report(*iv, windows, kd_us + own_us, frames.tracked()),
            },
        )?;
        let commit_start = cpu::own_cpu_ns();
        stats.publish_cpu_us += commit_start.saturating_sub(publish_start) / 1000;
        let round_own_us = commit_start.saturating_sub(round_start_own) / 1000;
        rounds += 1;

        if windows > 0 {
            let x = kd_us as f64 / windows as f64;
            per_sample_us = if per_sample_us == 0.0 {
                x
            } else {
                0.5 * (per_sample_us + x)
            };
        }
        let host_floor_us = fb.map_or(0, |f| u64::from(f.min_interval_ms) * 1000);
        let (next, limit) = intervals::next(
            &p,
            *iv,
            &Observation {
                access_share: share,
                goal,
                kdamond_us_per_sample: per_sample_us,
                agent_us_per_round: round_own_us as f64,
                host_floor_us,
            },
        );
        let mut commit = false;
        allowance.round(p.cpu_budget, elapsed_us, kd_us + own_us);
        let confirm_units = match allowance.allows() {
            true => confirm.update(&frames),
            false => {
                stats.confirm_deferred += 1;
                None
            }
        };
        if let Some(units) = &confirm_units {
            kd.write_regions(&confirm::layout(ranges, units))?;
            commit = true;
        }
        // the host's floor is honoured at once; other moves when worth the delay, or when the
        // goal is missed by more than the band (DAMON's steps above the goal are small)
        let off_goal = limit == Limit::Goal && goal > 0.0 && intervals::off_goal(share / goal);
        if next != *iv
            && (off_goal || intervals::worth_commit(*iv, next) || iv.aggr_us < host_floor_us)
        {
            *iv = next;
            kd.write_attrs(&attrs_for(*iv, min_regions, max_regions))?;
            frames.set_window(iv.sample_us as f64 / 1e6);
            stats.attr_commits += 1;
            commit = true;
        }
        if commit {
            match kd.commit() {
                Ok(()) => {}
                // a signal interrupts the blocking commit: stop as after a round
                Err(_) if stopped() => break,
                Err(e) => return Err(e),
            }
        }
        let commit_us = cpu::own_cpu_ns().saturating_sub(commit_start) / 1000;
        stats.commit_cpu_us += commit_us;
        if confirm_units.is_some() {
            allowance.committed(commit_us);
        }
        let total = Clock::read(cfg, pid, Some(now));
        stats.rounds = published.round;
        stats.last_entries = published.count;
        stats.last_hot_frames = ranked.hot_frames;
        stats.sample_us = iv.sample_us;
        stats.aggr_us = iv.aggr_us;
        stats.access_ppm = (share * 1e6).round() as u64;
        stats.goal_ppm = (goal * 1e6).round() as u64;
        stats.limit = match limit {
            Limit::Goal => 0,
            Limit::Budget => 1,
            Limit::Bound => 2,
        };
        stats.quota_bytes = quota;
        stats.last_regions = regions.len() as u64;
        stats.tracked = frames.tracked() as u64;
        stats.evicted = frames.evicted();
        stats.confirmed = confirm.len() as u64;
        stats.confirm_commits = confirm.commits();
        stats.overflow_rounds += u64::from(published.overflow);
        stats.windows += windows;
        stats.kdamond_cpu_us = total.kdamond_ns.saturating_sub(start.kdamond_ns) / 1000;
        stats.agent_cpu_us = total.own_ns.saturating_sub(start.own_ns) / 1000;
        stats.last_tracker_cpu_us = kd_us + own_us;
        stats.elapsed_us = total.now_ns.saturating_sub(start.now_ns) / 1000;
        if let Some(f) = &cfg.stats_file {
            write_atomic(f, &stats.render())?;
        }
        if let Some(f) = &cfg.status_file {
            // replaced whole: rewritten in place, it reads empty to whoever reads it meanwhile
            write_atomic(f, &format!("{}\n", published.round))?;
        }
        tracing::debug!(
            round = published.round,
            entries = published.count,
            overflow = published.overflow,
            regions = regions.len(),
            accessed_bytes = observed.accessed_bytes,
            tracked = frames.tracked(),
            evicted = observed.evicted,
            confirmed = confirm.len(),
            access_share = share,
            goal,
            sample_us = iv.sample_us,
            aggr_us = iv.aggr_us,
            kd_us,
            own_us,
            "published"
        );
        last = now;
    }
    Ok(())
}
