//! DAMON-based tiering on the emulated host, through Linux 6.12's DAMON sysfs interface, with the
//! recipe its authors published (peers.md, "DAMON tiering recipe"; the `mtier` sample of 6.16) as
//! far as 6.12 has its knobs:
//!
//! - one kdamond watches the CXL nodes' physical memory and promotes (DAMOS `migrate_hot`) to the
//!   VM's local DRAM node regions with an access rate of at least 5%, young pages only, at most
//!   200 MiB/s;
//! - one watches the DRAM node and demotes (`migrate_cold`) to its CXL node regions not accessed
//!   at all, young pages excluded, at most 200 MiB/s;
//! - sampling 5 ms, aggregation 100 ms, 10-1000 regions, schemes applied every second.
//!
//! 6.12 lacks two of the recipe's knobs: the quota goals' `node_mem_used_bp` (promote until the
//! DRAM node is 99.7% used) and `node_mem_free_bp` (demote while less than 0.5% is free) metrics,
//! which came in 6.16, and monitoring-interval auto-tuning (`intervals_goal`, 6.15). Without the
//! goals the quotas are their 200 MiB/s ceilings, as DAMON tiering ran on 6.11 when its authors
//! first published it; without auto-tuning the intervals stay at their starting values.
//!
//! The bake-off adds one thing to the recipe, a memcg filter, so the schemes touch the VM's
//! pages only (6.12 migrates on physical addresses; without it they would demote the host's own
//! processes' memory and hand the freed DRAM to the VM beyond its limit).
//!
//! Only kdamonds this code created are touched: it refuses to start if any kdamond exists.
//!
//! For the record, each kdamond also has a second scheme with action `stat` over every region
//! (DAMON only counts it; nothing is moved or filtered): its `tried_regions`, read a few times
//! per run, list every monitoring region with its `nr_accesses` and age, which the migration
//! schemes' own tried regions cannot (they list only regions that matched). [`DamonTiering::monitor`]
//! runs the same monitoring with only that scheme, to see what DAMON sees where nothing acts.

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

pub const ADMIN: &str = "/sys/kernel/mm/damon/admin/kdamonds";

/// One scheme's DAMOS statistics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SchemeStats {
    pub nr_tried: u64,
    pub sz_tried: u64,
    pub nr_applied: u64,
    pub sz_applied: u64,
    pub qt_exceeds: u64,
}

/// The recipe's parameters (peers.md), as 6.12's sysfs takes them.
#[derive(Clone, Debug, PartialEq)]
pub struct Recipe {
    pub sample_us: u64,
    pub aggr_us: u64,
    pub update_us: u64,
    pub min_regions: u64,
    pub max_regions: u64,
    /// Minimum access rate for promotion, percent of the samples in an aggregation.
    pub promote_min_access_pct: u64,
    pub quota_bytes: u64,
    pub quota_reset_ms: u64,
    pub apply_interval_us: u64,
}

impl Default for Recipe {
    fn default() -> Self {
        Recipe {
            sample_us: 5_000,
            aggr_us: 100_000,
            update_us: 60_000_000,
            min_regions: 10,
            max_regions: 1000,
            promote_min_access_pct: 5,
            quota_bytes: 200 << 20,
            quota_reset_ms: 1000,
            apply_interval_us: 1_000_000,
        }
    }
}

impl Recipe {
    /// Samples per aggregation: the largest `nr_accesses` a region can reach.
    pub fn max_nr_accesses(&self) -> u64 {
        (self.aggr_us / self.sample_us).max(1)
    }
    /// The promotion threshold as DAMON counts it (at least one sample).
    pub fn promote_min_nr_accesses(&self) -> u64 {
        (self.max_nr_accesses() * self.promote_min_access_pct)
            .div_ceil(100)
            .max(1)
    }
}

/// Where the schemes act.
#[derive(Clone, Debug, PartialEq)]
pub struct Nodes {
    /// Physical address ranges [start, end) of the slow nodes promotion watches.
    pub slow_ranges: Vec<(u64, u64)>,
    /// The DRAM node: promotion target, demotion source.
    pub dram_node: u32,
    pub dram_ranges: Vec<(u64, u64)>,
    /// Demotion target (the DRAM node's CXL node).
    pub demote_node: u32,
    /// The VM's memory cgroup, relative to the cgroup root (e.g. `/vtism-vm`).
    pub memcg_path: String,
}

/// The kdamonds while they run: promotion and demotion (tiering), or one that only monitors.
pub struct DamonTiering {
    root: PathBuf,
    kdamonds: usize,
    /// The kdamonds' pids, read once they run (their `pid` files answer EBUSY while a command
    /// is served).
    pids: Vec<i32>,
}

/// One monitoring region as DAMON's `tried_regions` lists it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Region {
    pub start: u64,
    pub end: u64,
    pub nr_accesses: u64,
    pub age: u64,
}

/// A kdamond's state and every region of its monitoring at one moment.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    /// Seconds since the manager (or the probe) started.
    pub t_s: f64,
    /// Which kdamond: "promote", "demote" or "monitor".
    pub kdamond: String,
    /// What else was going on (e.g. the probe's phase).
    pub phase: String,
    pub state: String,
    pub pid: i64,
    /// The largest `nr_accesses` a region can have (samples per aggregation).
    pub max_nr_accesses: u64,
    /// [start, end, nr_accesses, age] per region, in address order.
    pub regions: Vec<Region>,
    /// Of the workload's hot frames on the monitored nodes (host physical addresses from the
    /// nested QEMU's pagemap): how many, and how many lie in regions with `nr_accesses` > 0.
    pub hot_frames: u64,
    pub hot_frames_seen: u64,
    /// Regions holding a hot frame, and of them with `nr_accesses` > 0.
    pub hot_regions: u64,
    pub hot_regions_seen: u64,
    /// The CXL-side promotion threshold in `nr_accesses` (the recipe's 5%), for the summary.
    pub promote_min_nr_accesses: u64,
}

impl Snapshot {
    /// Regions with `nr_accesses` > 0 and their bytes.
    pub fn accessed(&self) -> (usize, u64) {
        let a = self.regions.iter().filter(|r| r.nr_accesses > 0);
        (a.clone().count(), a.map(|r| r.end - r.start).sum())
    }

    /// Regions at or above the promotion threshold and their bytes.
    pub fn promotable(&self) -> (usize, u64) {
        let a = self
            .regions
            .iter()
            .filter(|r| r.nr_accesses >= self.promote_min_nr_accesses.max(1));
        (a.clone().count(), a.map(|r| r.end - r.start).sum())
    }

    /// Counts the hot frames (sorted host physical addresses) against the regions.
    pub fn count_hot(&mut self, hot_paddrs: &[u64]) {
        let (mut frames, mut seen, mut regions, mut regions_seen) = (0, 0, 0, 0);
        for r in &self.regions {
            let lo = hot_paddrs.partition_point(|&a| a < r.start);
            let hi = hot_paddrs.partition_point(|&a| a < r.end);
            let n = (hi - lo) as u64;
            if n > 0 {
                frames += n;
                regions += 1;
                if r.nr_accesses > 0 {
                    seen += n;
                    regions_seen += 1;
                }
            }
        }
        self.hot_frames = frames;
        self.hot_frames_seen = seen;
        self.hot_regions = regions;
        self.hot_regions_seen = regions_seen;
    }

    /// One line for the conductor's log and the report.
    pub fn summary(&self) -> String {
        let (n, b) = self.accessed();
        let (pn, pb) = self.promotable();
        format!(
            "{} kdamond {} ({}): {} regions, {} with nr_accesses > 0 ({:.1} MiB), {} at >= {} ({:.1} MiB), max nr_accesses {} of {}; hot frames {} in {} regions, {} of them in {} regions seen accessed",
            self.kdamond,
            self.state,
            self.phase,
            self.regions.len(),
            n,
            b as f64 / (1u64 << 20) as f64,
            pn,
            self.promote_min_nr_accesses.max(1),
            pb as f64 / (1u64 << 20) as f64,
            self.regions.iter().map(|r| r.nr_accesses).max().unwrap_or(0),
            self.max_nr_accesses,
            self.hot_frames,
            self.hot_regions,
            self.hot_frames_seen,
            self.hot_regions_seen,
        )
    }
}

/// DAMON's sysfs takes one command (a write to a kdamond's `state` that the kdamond must serve)
/// at a time and answers another writer with EBUSY meanwhile: the run's samples (scheme stats)
/// and the region watcher take turns.
static STATE_CMD: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Writes a command to a kdamond's `state`, in turn with the other writers of this process.
fn state_cmd(kdamond: &Path, cmd: &str) -> anyhow::Result<()> {
    let _turn = STATE_CMD.lock().unwrap_or_else(|e| e.into_inner());
    let mut tries = 0;
    loop {
        match std::fs::write(kdamond.join("state"), cmd) {
            Ok(()) => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && tries < 100 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            Err(e) => {
                return Err(e).with_context(|| {
                    format!("writing {cmd:?} to {}", kdamond.join("state").display())
                })
            }
        }
    }
}

/// DAMON's sysfs files answer EBUSY while another writer holds its lock (it only tries the
/// lock): such a read or write is tried again, for up to 10 s.
fn retry_busy<T>(mut f: impl FnMut() -> std::io::Result<T>) -> std::io::Result<T> {
    let mut tries = 0;
    loop {
        match f() {
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && tries < 100 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            r => return r,
        }
    }
}

fn put(path: &Path, v: impl ToString) -> anyhow::Result<()> {
    let v = v.to_string();
    retry_busy(|| std::fs::write(path, &v))
        .with_context(|| format!("writing {v:?} to {}", path.display()))
}

fn get(path: &Path) -> anyhow::Result<String> {
    Ok(retry_busy(|| std::fs::read_to_string(path))
        .with_context(|| path.display().to_string())?
        .trim()
        .to_string())
}

/// Reads the bake-off's kdamonds' regions through their `stat` scheme.
#[derive(Clone, Debug)]
pub struct DamonObserver {
    root: PathBuf,
    kdamonds: usize,
}

impl DamonObserver {
    pub fn kdamonds(&self) -> usize {
        self.kdamonds
    }

    /// Statistics of the promotion and the demotion scheme (scheme 0 of kdamonds 0 and 1). The
    /// command returns when each kdamond next serves its callbacks: seconds while it migrates.
    pub fn stats(&self) -> anyhow::Result<(SchemeStats, SchemeStats)> {
        let one = |k: usize| -> anyhow::Result<SchemeStats> {
            let kd = self.root.join(k.to_string());
            state_cmd(&kd, "update_schemes_stats")?;
            let s = kd.join("contexts/0/schemes/0/stats");
            let n = |f: &str| -> anyhow::Result<u64> { Ok(get(&s.join(f))?.parse().unwrap_or(0)) };
            Ok(SchemeStats {
                nr_tried: n("nr_tried")?,
                sz_tried: n("sz_tried")?,
                nr_applied: n("nr_applied")?,
                sz_applied: n("sz_applied")?,
                qt_exceeds: n("qt_exceeds")?,
            })
        };
        Ok((one(0)?, one(1)?))
    }

    /// Every region of kdamond `k` now (through its `stat` scheme's tried regions: the write to
    /// `state` returns once DAMON has applied its schemes at the end of an aggregation).
    pub fn snapshot(&self, k: usize, recipe: &Recipe) -> anyhow::Result<Snapshot> {
        let kd = self.root.join(k.to_string());
        state_cmd(&kd, "update_schemes_tried_regions")?;
        let dir = kd.join(format!(
            "contexts/0/schemes/{}/tried_regions",
            if self.kdamonds == 1 { 0 } else { 1 }
        ));
        let mut regions = Vec::new();
        for e in std::fs::read_dir(&dir).with_context(|| dir.display().to_string())? {
            let p = e?.path();
            if !p.is_dir() {
                continue;
            }
            let n = |f: &str| -> anyhow::Result<u64> {
                get(&p.join(f))?
                    .parse()
                    .with_context(|| format!("{}/{f}", p.display()))
            };
            regions.push(Region {
                start: n("start")?,
                end: n("end")?,
                nr_accesses: n("nr_accesses")?,
                age: n("age")?,
            });
        }
        regions.sort_by_key(|r| r.start);
        Ok(Snapshot {
            kdamond: match (self.kdamonds, k) {
                (1, _) => "monitor",
                (_, 0) => "promote",
                _ => "demote",
            }
            .into(),
            state: get(&kd.join("state")).unwrap_or_default(),
            pid: get(&kd.join("pid"))
                .ok()
                .and_then(|p| p.parse().ok())
                .unwrap_or(-1),
            max_nr_accesses: recipe.max_nr_accesses(),
            promote_min_nr_accesses: recipe.promote_min_nr_accesses(),
            regions,
            ..Snapshot::default()
        })
    }
}

/// The `stat` scheme that only counts: every region (any size, access rate and age), no quota,
/// no filter, applied every aggregation.
fn stat_scheme(s: &Path) -> anyhow::Result<()> {
    put(&s.join("action"), "stat")?;
    put(&s.join("apply_interval_us"), 0)?;
    let p = s.join("access_pattern");
    put(&p.join("sz/min"), 0)?;
    put(&p.join("sz/max"), u64::MAX)?;
    put(&p.join("nr_accesses/min"), 0)?;
    put(&p.join("nr_accesses/max"), u32::MAX)?;
    put(&p.join("age/min"), 0)?;
    put(&p.join("age/max"), u32::MAX)?;
    let q = s.join("quotas");
    put(&q.join("ms"), 0)?;
    put(&q.join("bytes"), 0)?;
    put(&q.join("goals/nr_goals"), 0)?;
    put(&s.join("watermarks/metric"), "none")?;
    put(&s.join("filters/nr_filters"), 0)
}

/// The physical address ranges of a node's memory blocks (sysfs memory block devices).
pub fn node_ranges(node: u32) -> anyhow::Result<Vec<(u64, u64)>> {
    let block = u64::from_str_radix(
        get(Path::new("/sys/devices/system/memory/block_size_bytes"))?.trim_start_matches("0x"),
        16,
    )
    .context("block_size_bytes")?;
    let mut idx: Vec<u64> = std::fs::read_dir(format!("/sys/devices/system/node/node{node}"))?
        .filter_map(|e| {
            e.ok()?
                .file_name()
                .to_str()?
                .strip_prefix("memory")?
                .parse()
                .ok()
        })
        .collect();
    idx.sort_unstable();
    let mut ranges: Vec<(u64, u64)> = Vec::new();
    for i in idx {
        let (s, e) = (i * block, (i + 1) * block);
        match ranges.last_mut() {
            Some(last) if last.1 == s => last.1 = e,
            _ => ranges.push((s, e)),
        }
    }
    if ranges.is_empty() {
        bail!("node {node} has no memory blocks in sysfs");
    }
    Ok(ranges)
}

impl DamonTiering {
    pub fn start(recipe: &Recipe, nodes: &Nodes) -> anyhow::Result<DamonTiering> {
        Self::launch(recipe, nodes, &[Some(true), Some(false)])
    }

    /// One kdamond with the recipe's monitoring of the slow nodes and only the `stat` scheme:
    /// what DAMON sees there, where nothing acts on it.
    pub fn monitor(recipe: &Recipe, nodes: &Nodes) -> anyhow::Result<DamonTiering> {
        Self::launch(recipe, nodes, &[None])
    }

    /// One kdamond per entry of `roles` (`context`'s promote / demote / monitor-only), created
    /// only while DAMON has none, configured, then turned on; on any failure nothing of ours
    /// stays behind for the next manager's run.
    fn launch(
        recipe: &Recipe,
        nodes: &Nodes,
        roles: &[Option<bool>],
    ) -> anyhow::Result<DamonTiering> {
        let root = PathBuf::from(ADMIN);
        let n: u64 = get(&root.join("nr_kdamonds"))?.parse().unwrap_or(0);
        if n != 0 {
            bail!("{n} kdamond(s) exist that the bake-off did not create; leaving them alone");
        }
        put(&root.join("nr_kdamonds"), roles.len())?;
        let mut d = DamonTiering {
            root,
            kdamonds: roles.len(),
            pids: Vec::new(),
        };
        let started = (|| {
            for (k, &role) in roles.iter().enumerate() {
                d.context(k, recipe, nodes, role)?;
            }
            for k in 0..roles.len() {
                put(&d.kdamond(k).join("state"), "on")?;
            }
            anyhow::Ok(())
        })();
        match started {
            Ok(()) => {
                d.read_pids();
                Ok(d)
            }
            Err(e) => {
                let _ = d.stop();
                Err(e)
            }
        }
    }

    fn read_pids(&mut self) {
        self.pids = (0..self.kdamonds)
            .filter_map(|k| get(&self.kdamond(k).join("pid")).ok()?.parse().ok())
            .filter(|&p: &i32| p > 0)
            .collect();
    }

    fn kdamond(&self, k: usize) -> PathBuf {
        self.root.join(k.to_string())
    }

    /// New sampling and aggregation intervals for kdamond `k`, committed to it while it runs.
    pub fn set_intervals(&self, k: usize, sample_us: u64, aggr_us: u64) -> anyhow::Result<()> {
        let a = self
            .kdamond(k)
            .join("contexts/0/monitoring_attrs/intervals");
        put(&a.join("sample_us"), sample_us)?;
        put(&a.join("aggr_us"), aggr_us)?;
        state_cmd(&self.kdamond(k), "commit")
    }

    /// A handle that reads the kdamonds' regions (from another thread while they run).
    pub fn observer(&self) -> DamonObserver {
        DamonObserver {
            root: self.root.clone(),
            kdamonds: self.kdamonds,
        }
    }

    /// Kdamond `k`'s context: promotion (`Some(true)`: the slow nodes, `migrate_hot`), demotion
    /// (`Some(false)`: the DRAM node, `migrate_cold`), each followed by the `stat` scheme, or
    /// monitoring of the slow nodes with the `stat` scheme alone (`None`).
    fn context(&self, k: usize, r: &Recipe, n: &Nodes, role: Option<bool>) -> anyhow::Result<()> {
        let kd = self.kdamond(k);
        put(&kd.join("contexts/nr_contexts"), 1)?;
        let c = kd.join("contexts/0");
        put(&c.join("operations"), "paddr")?;
        let a = c.join("monitoring_attrs");
        put(&a.join("intervals/sample_us"), r.sample_us)?;
        put(&a.join("intervals/aggr_us"), r.aggr_us)?;
        put(&a.join("intervals/update_us"), r.update_us)?;
        put(&a.join("nr_regions/min"), r.min_regions)?;
        put(&a.join("nr_regions/max"), r.max_regions)?;
        put(&c.join("targets/nr_targets"), 1)?;
        let ranges = if role == Some(false) {
            &n.dram_ranges
        } else {
            &n.slow_ranges
        };
        let regions = c.join("targets/0/regions");
        put(&regions.join("nr_regions"), ranges.len())?;
        for (i, (s, e)) in ranges.iter().enumerate() {
            put(&regions.join(format!("{i}/start")), s)?;
            put(&regions.join(format!("{i}/end")), e)?;
        }
        let Some(promote) = role else {
            put(&c.join("schemes/nr_schemes"), 1)?;
            return stat_scheme(&c.join("schemes/0"));
        };
        put(&c.join("schemes/nr_schemes"), 2)?;
        stat_scheme(&c.join("schemes/1"))?;
        let s = c.join("schemes/0");
        put(
            &s.join("action"),
            if promote {
                "migrate_hot"
            } else {
                "migrate_cold"
            },
        )?;
        put(
            &s.join("target_nid"),
            if promote { n.dram_node } else { n.demote_node },
        )?;
        put(&s.join("apply_interval_us"), r.apply_interval_us)?;
        let p = s.join("access_pattern");
        put(&p.join("sz/min"), 4096)?;
        put(&p.join("sz/max"), u64::MAX)?;
        let (amin, amax) = if promote {
            (r.promote_min_nr_accesses(), r.max_nr_accesses())
        } else {
            (0, 0)
        };
        put(&p.join("nr_accesses/min"), amin)?;
        put(&p.join("nr_accesses/max"), amax)?;
        put(&p.join("age/min"), 0)?;
        put(&p.join("age/max"), u32::MAX)?;
        let q = s.join("quotas");
        put(&q.join("ms"), 0)?;
        put(&q.join("bytes"), r.quota_bytes)?;
        put(&q.join("reset_interval_ms"), r.quota_reset_ms)?;
        put(&q.join("weights/sz_permil"), 0)?;
        put(&q.join("weights/nr_accesses_permil"), 100)?;
        put(&q.join("weights/age_permil"), 100)?;
        put(&q.join("goals/nr_goals"), 0)?;
        put(&s.join("watermarks/metric"), "none")?;
        let f = s.join("filters");
        put(&f.join("nr_filters"), 2)?;
        // filter out pages of other cgroups (6.12 filters exclude what matches `matching`)
        put(&f.join("0/type"), "memcg")?;
        put(&f.join("0/memcg_path"), &n.memcg_path)?;
        put(&f.join("0/matching"), "N")?;
        // promotion: young pages only; demotion: young pages rejected
        put(&f.join("1/type"), "young")?;
        put(&f.join("1/matching"), if promote { "N" } else { "Y" })?;
        Ok(())
    }

    /// Statistics of the promotion and the demotion scheme.
    pub fn stats(&self) -> anyhow::Result<(SchemeStats, SchemeStats)> {
        self.observer().stats()
    }

    /// The kdamonds' pids (for their CPU time), as read when they started.
    pub fn pids(&self) -> Vec<i32> {
        self.pids.clone()
    }

    /// Turns the kdamonds off and removes them.
    pub fn stop(self) -> anyhow::Result<()> {
        for k in 0..self.kdamonds {
            let _ = state_cmd(&self.kdamond(k), "off");
        }
        // A kdamond takes a moment to finish (longer while it migrates under TCG);
        // nr_kdamonds cannot shrink while one runs.
        for _ in 0..600 {
            if (0..self.kdamonds)
                .all(|k| get(&self.kdamond(k).join("state")).is_ok_and(|s| s == "off"))
            {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        put(&self.root.join("nr_kdamonds"), 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_counts_the_hot_frames_in_regions_seen_accessed() {
        let r = |start: u64, end: u64, nr_accesses| Region {
            start,
            end,
            nr_accesses,
            age: 0,
        };
        let mut s = Snapshot {
            regions: vec![r(0, 100, 0), r(100, 200, 3), r(200, 300, 1), r(300, 400, 0)],
            max_nr_accesses: 20,
            promote_min_nr_accesses: 2,
            ..Snapshot::default()
        };
        // hot frames at 50 and 60 (unseen region), 150 (seen), 450 (outside every region)
        s.count_hot(&[50, 60, 150, 450]);
        assert_eq!((s.hot_frames, s.hot_frames_seen), (3, 1));
        assert_eq!((s.hot_regions, s.hot_regions_seen), (2, 1));
        assert_eq!(s.accessed(), (2, 200));
        assert_eq!(s.promotable(), (1, 100));
        assert!(
            s.summary().contains("4 regions, 2 with nr_accesses > 0"),
            "{}",
            s.summary()
        );
    }

    #[test]
    fn the_recipe_in_damon_units() {
        let r = Recipe::default();
        assert_eq!(r.max_nr_accesses(), 20);
        // 5% of 20 samples: one sample in an aggregation
        assert_eq!(r.promote_min_nr_accesses(), 1);
        assert_eq!(r.quota_bytes, 200 << 20);
    }
}
