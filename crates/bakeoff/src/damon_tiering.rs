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

use anyhow::{bail, Context};
use std::path::{Path, PathBuf};

pub const ADMIN: &str = "/sys/kernel/mm/damon/admin/kdamonds";

/// One scheme's DAMOS statistics.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
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

/// The two kdamonds while they run.
pub struct DamonTiering {
    root: PathBuf,
}

fn put(path: &Path, v: impl ToString) -> anyhow::Result<()> {
    let v = v.to_string();
    std::fs::write(path, &v).with_context(|| format!("writing {v:?} to {}", path.display()))
}

fn get(path: &Path) -> anyhow::Result<String> {
    Ok(std::fs::read_to_string(path)
        .with_context(|| path.display().to_string())?
        .trim()
        .to_string())
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
        let root = PathBuf::from(ADMIN);
        let n: u64 = get(&root.join("nr_kdamonds"))?.parse().unwrap_or(0);
        if n != 0 {
            bail!("{n} kdamond(s) exist that the bake-off did not create; leaving them alone");
        }
        put(&root.join("nr_kdamonds"), 2)?;
        let d = DamonTiering { root };
        d.context(0, recipe, nodes, true)?;
        d.context(1, recipe, nodes, false)?;
        for k in 0..2 {
            put(&d.kdamond(k).join("state"), "on")?;
        }
        Ok(d)
    }

    fn kdamond(&self, k: usize) -> PathBuf {
        self.root.join(k.to_string())
    }

    fn scheme(&self, k: usize) -> PathBuf {
        self.kdamond(k).join("contexts/0/schemes/0")
    }

    fn context(&self, k: usize, r: &Recipe, n: &Nodes, promote: bool) -> anyhow::Result<()> {
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
        let ranges = if promote {
            &n.slow_ranges
        } else {
            &n.dram_ranges
        };
        let regions = c.join("targets/0/regions");
        put(&regions.join("nr_regions"), ranges.len())?;
        for (i, (s, e)) in ranges.iter().enumerate() {
            put(&regions.join(format!("{i}/start")), s)?;
            put(&regions.join(format!("{i}/end")), e)?;
        }
        put(&c.join("schemes/nr_schemes"), 1)?;
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
        let one = |k: usize| -> anyhow::Result<SchemeStats> {
            put(&self.kdamond(k).join("state"), "update_schemes_stats")?;
            let s = self.scheme(k).join("stats");
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

    /// The kdamonds' pids (for their CPU time).
    pub fn pids(&self) -> Vec<i32> {
        (0..2)
            .filter_map(|k| get(&self.kdamond(k).join("pid")).ok()?.parse().ok())
            .filter(|&p: &i32| p > 0)
            .collect()
    }

    /// Turns both kdamonds off and removes them.
    pub fn stop(self) -> anyhow::Result<()> {
        for k in 0..2 {
            let _ = put(&self.kdamond(k).join("state"), "off");
        }
        // A kdamond takes a moment to finish; nr_kdamonds cannot shrink while one runs.
        for _ in 0..100 {
            if (0..2).all(|k| get(&self.kdamond(k).join("state")).is_ok_and(|s| s == "off")) {
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
    fn the_recipe_in_damon_units() {
        let r = Recipe::default();
        assert_eq!(r.max_nr_accesses(), 20);
        // 5% of 20 samples: one sample in an aggregation
        assert_eq!(r.promote_min_nr_accesses(), 1);
        assert_eq!(r.quota_bytes, 200 << 20);
    }
}
