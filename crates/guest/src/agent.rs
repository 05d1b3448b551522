//! The agent's loop: one DAMON aggregation per round, history, publication, adaptive pacing.

use crate::confirm::{self, Confirm};
use crate::damon::{Attrs, Kdamond};
use crate::history::History;
use crate::kpageflags::KpageFlags;
use crate::{iomem, pci};
use anyhow::{bail, Context, Result};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;
use vtism_proto::layout::{off, MAGIC};
use vtism_proto::{
    ChannelVersion, ChannelWriter, MmapRegion, RoundMeta, SharedRegion, Tracker, WriterConfig,
};

/// The adaptive interval, as the module computes it: T = (K·Ts + Kb)·Ts + Tbase ms with Ts the
/// round's cost in ms, in integer arithmetic on µs, then capped by `max_ms` (0 = no cap).
pub fn interval_ms(cost_us: u64, k: u64, kb: u64, base_ms: u64, max_ms: u64) -> u32 {
    let us = u128::from(cost_us);
    let t = (u128::from(k).saturating_mul(us).saturating_mul(us) / 1000)
        .saturating_add(u128::from(kb).saturating_mul(us))
        / 1000
        + u128::from(base_ms);
    let t = if max_ms > 0 {
        t.min(u128::from(max_ms))
    } else {
        t
    };
    t.min(u128::from(u32::MAX)) as u32
}

/// DAMON attributes for a round of `t_ms`: the aggregation interval is the round, split into
/// `samples` sampling intervals (at least 1 ms each); regions are re-split every aggregation.
pub fn attrs_for(t_ms: u32, samples: u32, min_regions: u64, max_regions: u64) -> Attrs {
    let aggr_us = u64::from(t_ms.max(1)) * 1000;
    let sample_us = (aggr_us / u64::from(samples.max(1))).max(1000).min(aggr_us);
    Attrs {
        sample_us,
        aggr_us,
        update_us: aggr_us,
        min_nr_regions: min_regions,
        max_nr_regions: max_regions,
    }
}

/// Everything the loop needs from the command line.
#[derive(Clone, Debug)]
pub struct Config {
    pub channel: Option<PathBuf>,
    pub pci_devices: PathBuf,
    pub damon_root: PathBuf,
    pub iomem: PathBuf,
    pub kpageflags: PathBuf,
    pub interval_k: u64,
    pub interval_kb: u64,
    pub interval_base_ms: u64,
    pub interval_max_ms: u64,
    pub samples: u32,
    pub min_nr_regions: u64,
    pub max_nr_regions: u64,
    pub history_rounds: u32,
    pub hot_threshold: u32,
    pub min_accesses: u32,
    pub max_entries: u64,
    /// At most this many frames (units) keep a history (the coldest are evicted).
    pub max_tracked: usize,
    /// At most this many frames get DAMON regions of their own (0 = no confirmation).
    pub confirm_frames: usize,
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
    pub last_cost_us: u64,
    pub last_interval_ms: u64,
    pub last_regions: u64,
    pub tracked: u64,
    pub max_tracked: u64,
    pub evicted: u64,
    pub confirmed: u64,
    pub confirm_cap: u64,
    pub confirm_commits: u64,
    pub overflow_rounds: u64,
}

impl Stats {
    /// `name value` lines, one per counter.
    pub fn render(&self) -> String {
        let Stats {
            rounds,
            last_entries,
            last_hot_frames,
            last_cost_us,
            last_interval_ms,
            last_regions,
            tracked,
            max_tracked,
            evicted,
            confirmed,
            confirm_cap,
            confirm_commits,
            overflow_rounds,
        } = self;
        [
            ("rounds", rounds),
            ("last_entries", last_entries),
            ("last_hot_frames", last_hot_frames),
            ("last_cost_us", last_cost_us),
            ("last_interval_ms", last_interval_ms),
            ("last_regions", last_regions),
            ("tracked", tracked),
            ("max_tracked", max_tracked),
            ("evicted", evicted),
            ("confirmed", confirmed),
            ("confirm_cap", confirm_cap),
            ("confirm_commits", confirm_commits),
            ("overflow_rounds", overflow_rounds),
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

/// Writes `text` to `path` through a temporary file and a rename, so a reader never sees half.
fn write_atomic(path: &std::path::Path, text: &str) -> Result<()> {
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

/// CPU time (user + system) of a thread, µs, from `/proc/<pid>/stat`.
fn cpu_us(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // fields 14 and 15 of stat; `rest` starts at field 3
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf has no memory-safety preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let hz = if hz > 0 { hz as u64 } else { 100 };
    Some(ticks * 1_000_000 / hz)
}

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

pub fn run(cfg: &Config) -> Result<()> {
    let iomem_text = std::fs::read_to_string(&cfg.iomem)
        .with_context(|| format!("reading {}", cfg.iomem.display()))?;
    let ranges = iomem::system_ram(&iomem_text, 1 << 20);
    if ranges.is_empty() {
        bail!("no System RAM in {} (not root?)", cfg.iomem.display());
    }
    let tracked_bytes: u64 = ranges.iter().map(|r| r.end - r.start).sum();
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
            // Its counts are rounds seen (History), which is v1.0's meaning of `count`.
            version: ChannelVersion::V1_0,
        },
    )?;
    tracing::info!(bar = %bar.display(), capacity = w.capacity(), "channel initialised");
    install_signals()?;

    let min_regions = cfg.min_nr_regions.max(ranges.len() as u64).max(3);
    let max_regions = cfg.max_nr_regions.max(min_regions);
    let mut t_ms = w.next_interval_ms(interval_ms(
        0,
        cfg.interval_k,
        cfg.interval_kb,
        cfg.interval_base_ms,
        cfg.interval_max_ms,
    ));
    let mut attrs = attrs_for(t_ms, cfg.samples, min_regions, max_regions);
    let mut kd = Kdamond::create(&cfg.damon_root, &ranges, &attrs)?;
    let result = (|| -> Result<()> {
        kd.start()?;
        let pid = kd.pid();
        tracing::info!(
            kdamond = kd.index(),
            ?pid,
            ranges = ranges.len(),
            "DAMON started"
        );
        let mut history = History::new(
            cfg.history_rounds,
            cfg.hot_threshold,
            cfg.min_accesses,
            cfg.max_tracked,
        );
        let cap = confirm_cap(cfg.confirm_frames, max_regions, ranges.len());
        let mut confirm = Confirm::new(cap, Confirm::min_count_for(cfg.hot_threshold));
        let mut stats = Stats {
            max_tracked: cfg.max_tracked as u64,
            confirm_cap: cap as u64,
            ..Stats::default()
        };
        let mut cpu_last = pid.and_then(cpu_us).unwrap_or(0);
        let mut rounds = 0u64;
        while !STOP.load(Ordering::SeqCst) && (cfg.rounds == 0 || rounds < cfg.rounds) {
            let regions = match kd.tried_regions() {
                Ok(r) => r,
                Err(_) if STOP.load(Ordering::SeqCst) => break,
                Err(e) => return Err(e),
            };
            let t0 = Instant::now();
            let out = history.round(&regions, &flags)?;
            let mut entries = out.entries;
            let mut overflow = false;
            if cfg.max_entries > 0 && entries.len() as u64 > cfg.max_entries {
                entries.truncate(cfg.max_entries as usize);
                overflow = true;
            }
            let cpu_now = pid.and_then(cpu_us).unwrap_or(cpu_last);
            // the round's cost: the kdamond's CPU time since the last round (its sampling and
            // aggregation) plus the agent's own processing
            let cost_us = cpu_now.saturating_sub(cpu_last) + t0.elapsed().as_micros() as u64;
            cpu_last = cpu_now;
            let _ = w.read_feedback();
            let next = w.next_interval_ms(interval_ms(
                cost_us,
                cfg.interval_k,
                cfg.interval_kb,
                cfg.interval_base_ms,
                cfg.interval_max_ms,
            ));
            let p = w.publish(
                &entries,
                &RoundMeta {
                    overflow,
                    scan_interval_ms: next,
                    scan_duration_us: cost_us.min(u64::from(u32::MAX)) as u32,
                    tracked_bytes,
                    hot_frames: out.hot_frames,
                    publish_time_ns: monotonic_ns(),
                    ..RoundMeta::default()
                },
            )?;
            rounds += 1;
            // frames newly hot in min_count rounds get DAMON regions of their own, and DAMON
            // is re-paced when the interval moved by more than 1/16: one commit for both
            let mut commit = false;
            if let Some(units) = confirm.update(&history) {
                kd.write_regions(&confirm::layout(&ranges, &units))?;
                commit = true;
            }
            if next.abs_diff(t_ms) > t_ms / 16 {
                t_ms = next;
                attrs = attrs_for(t_ms, cfg.samples, min_regions, max_regions);
                kd.write_attrs(&attrs)?;
                commit = true;
            }
            if commit {
                match kd.commit() {
                    Ok(()) => {}
                    // a signal interrupts the blocking commit: stop as after a round
                    Err(_) if STOP.load(Ordering::SeqCst) => break,
                    Err(e) => return Err(e),
                }
            }
            stats.rounds = p.round;
            stats.last_entries = p.count;
            stats.last_hot_frames = out.hot_frames;
            stats.last_cost_us = cost_us;
            stats.last_interval_ms = u64::from(next);
            stats.last_regions = regions.len() as u64;
            stats.tracked = history.tracked() as u64;
            stats.evicted = history.evicted();
            stats.confirmed = confirm.len() as u64;
            stats.confirm_commits = confirm.commits();
            stats.overflow_rounds += u64::from(p.overflow);
            if let Some(f) = &cfg.stats_file {
                write_atomic(f, &stats.render())?;
            }
            if let Some(f) = &cfg.status_file {
                std::fs::write(f, format!("{}\n", p.round))
                    .with_context(|| format!("writing {}", f.display()))?;
            }
            tracing::debug!(
                round = p.round,
                entries = p.count,
                overflow = p.overflow,
                regions = regions.len(),
                accessed_bytes = out.accessed_bytes,
                tracked = history.tracked(),
                evicted = out.evicted,
                confirmed = confirm.len(),
                cost_us,
                next_ms = next,
                "published"
            );
        }
        Ok(())
    })();
    let removed = kd.remove();
    tracing::info!("DAMON stopped");
    result.and(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interval_formula_matches_the_module() {
        // docs/guest.md: with the defaults a 10 ms scan waits 3.8 s, 100 ms 87.5 s, 1 s 2.2 h
        assert_eq!(interval_ms(10_000, 8, 50, 2500, 0), 3800);
        assert_eq!(interval_ms(100_000, 8, 50, 2500, 0), 87_500);
        assert_eq!(interval_ms(1_000_000, 8, 50, 2500, 0), 8_052_500);
        assert_eq!(interval_ms(0, 8, 50, 2500, 0), 2500);
        assert_eq!(interval_ms(100_000, 8, 50, 2500, 3000), 3000);
        assert_eq!(interval_ms(u64::MAX, 8, 50, 2500, 0), u32::MAX);
    }

    #[test]
    fn the_hosts_floor_wins_over_the_cap() {
        let mut w = vtism_proto::ChannelWriter::init(
            vtism_proto::OwnedRegion::zeroed(64 * 1024),
            Tracker::Damon,
        )
        .unwrap();
        // a 1 s round under a 10 s cap
        let capped = interval_ms(1_000_000, 8, 50, 2500, 10_000);
        assert_eq!(w.next_interval_ms(capped), 10_000);
        let fb = vtism_proto::Feedback {
            ack_round: 0,
            entry_budget: 0,
            min_interval_ms: 20_000,
            last_status: 0,
            fast_quota_bytes: 0,
            rejected_rounds: 0,
            host_version: vtism_proto::HOST_VERSION,
        };
        vtism_proto::write_feedback(w.region(), &fb).unwrap();
        w.read_feedback().unwrap();
        assert_eq!(w.next_interval_ms(capped), 20_000);
        // a floor below the cap changes nothing
        vtism_proto::write_feedback(
            w.region(),
            &vtism_proto::Feedback {
                min_interval_ms: 2500,
                ..fb
            },
        )
        .unwrap();
        w.read_feedback().unwrap();
        assert_eq!(w.next_interval_ms(capped), 10_000);
    }

    #[test]
    fn attrs_split_the_round() {
        let a = attrs_for(2000, 20, 10, 1000);
        assert_eq!(
            (a.aggr_us, a.sample_us, a.update_us),
            (2_000_000, 100_000, 2_000_000)
        );
        let a = attrs_for(5, 20, 10, 1000);
        assert_eq!((a.aggr_us, a.sample_us), (5000, 1000));
        let a = attrs_for(0, 0, 10, 1000);
        assert_eq!((a.aggr_us, a.sample_us), (1000, 1000));
    }

    #[test]
    fn claim_check() {
        let d = crate::testdir::TestDir::new("claim");
        let p = d.path().join("bar");
        std::fs::write(&p, vec![0u8; 16384]).unwrap();
        let r = pci::map_bar(&p).unwrap();
        check_claim(&r).unwrap();
        r.store_u64(0x100, 7).unwrap();
        assert!(check_claim(&r).is_err());
        r.store_u64(off::MAGIC, MAGIC).unwrap();
        check_claim(&r).unwrap();
    }

    #[test]
    fn confirm_cap_keeps_damon_below_max_regions() {
        assert_eq!(confirm_cap(4096, 10_000, 2), 4096);
        assert_eq!(confirm_cap(8192, 10_000, 2), (10_000 - 18) / 2);
        assert_eq!(confirm_cap(4096, 10, 2), 0);
        assert_eq!(confirm_cap(0, 10_000, 2), 0);
    }

    #[test]
    fn stats_render_every_counter() {
        let s = Stats {
            rounds: 3,
            evicted: 7,
            confirm_cap: 4096,
            ..Stats::default()
        }
        .render();
        assert_eq!(s.lines().count(), 13);
        assert!(s.contains("rounds 3\n") && s.contains("evicted 7\n"));
        assert!(s.contains("confirm_cap 4096\n") && s.contains("tracked 0\n"));
    }
}
