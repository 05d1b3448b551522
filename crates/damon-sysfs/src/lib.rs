//! One kdamond of our own through DAMON's sysfs interface (`/sys/kernel/mm/damon/admin`,
//! `Documentation/admin-guide/mm/damon/usage.rst`), and whether DAMON is free for one. Used by
//! the guest agent (`paddr`, one target: the guest's System RAM) and by vtismd (`fvaddr`, one
//! target per QEMU process: its guest RAM's host-virtual ranges).
//!
//! In Linux 6.12 (mm/damon/sysfs.c, core.c) a kdamond can be added only when no one else uses
//! DAMON: writing `kdamonds/nr_kdamonds` fails with EBUSY while any sysfs kdamond runs, and
//! otherwise removes *every* kdamond directory with its configuration before creating the
//! requested number afresh; a kdamond holds one context only (`nr_contexts` > 1 is EINVAL); and
//! DAMON_RECLAIM and DAMON_LRU_SORT start their kdamonds exclusively (`damon_start(.., true)`),
//! so no sysfs kdamond can start while one of them runs (EBUSY), nor they while a sysfs kdamond
//! runs. The owner therefore creates its kdamond only when `nr_kdamonds` is 0 and no exclusive
//! user is known to run ([`busy`]); when starting it is refused all the same, it removes its
//! own directory again. It never writes into a kdamond directory it did not create. On exit it
//! turns its kdamond off and writes `nr_kdamonds` back to 0 only if its kdamond is still the
//! only one and still configured as it left it.
//!
//! Virtual-address targets use `fvaddr`, not `vaddr`: `vaddr` replaces a target's regions with
//! the three biggest mapped areas of the process at every operations update (6.12
//! mm/damon/vaddr.c, `damon_va_update`), so it cannot be limited to guest RAM; `fvaddr` is the
//! same page-table access check over the regions as written.

use anyhow::{bail, Context, Result};
use std::fs;
use std::path::{Path, PathBuf};

pub const DEFAULT_ROOT: &str = "/sys/kernel/mm/damon/admin";
/// Where the in-kernel DAMON users' module parameters are.
pub const MODULES_ROOT: &str = "/sys/module";
/// In-kernel DAMON users of 6.12 that run a kdamond exclusively while `enabled`.
pub const EXCLUSIVE_MODULES: [&str; 2] = ["damon_reclaim", "damon_lru_sort"];

/// A byte range `[start, end)` of the monitored address space (physical for `paddr`, the
/// target process's virtual addresses for `fvaddr`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AddrRange {
    pub start: u64,
    pub end: u64,
}

/// DAMON operations set of the kdamond's context.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ops {
    /// Physical addresses; one target without a pid.
    Paddr,
    /// Fixed virtual-address ranges of target processes.
    Fvaddr,
}

impl Ops {
    pub fn label(self) -> &'static str {
        match self {
            Ops::Paddr => "paddr",
            Ops::Fvaddr => "fvaddr",
        }
    }
}

/// A monitoring target: a process (`fvaddr`) or none (`paddr`), and its regions (sorted,
/// disjoint).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub pid: Option<u32>,
    pub regions: Vec<AddrRange>,
}

/// Why the owner cannot have a kdamond now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Busy {
    /// Kdamond directories exist in the sysfs interface: someone else's (`running` of them on).
    SysfsKdamonds { nr: u64, running: u64 },
    /// An in-kernel DAMON user runs its kdamond exclusively.
    Module {
        name: String,
        kdamond_pid: Option<i64>,
    },
    /// DAMON refused to start ours (EBUSY): something runs DAMON exclusively.
    StartRefused,
}

impl std::fmt::Display for Busy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Busy::SysfsKdamonds { nr, running } => write!(
                f,
                "nr_kdamonds is {nr} ({running} running): DAMON's sysfs interface cannot add a \
                 kdamond beside them (writing nr_kdamonds deletes every kdamond directory with \
                 its configuration, and fails while one runs)"
            ),
            Busy::Module { name, kdamond_pid } => write!(
                f,
                "{name} runs (kdamond pid {}): it holds DAMON exclusively, no other kdamond can \
                 start while it is enabled",
                kdamond_pid.map_or("?".to_string(), |p| p.to_string())
            ),
            Busy::StartRefused => write!(
                f,
                "DAMON refused to start a kdamond (EBUSY): an in-kernel user runs DAMON \
                 exclusively"
            ),
        }
    }
}

/// What keeps DAMON from taking a kdamond of ours, if anything: kdamonds in the sysfs
/// interface, or an exclusive in-kernel user that is enabled. Reads only.
pub fn busy(root: &Path, modules: &Path) -> Result<Option<Busy>> {
    let nr = read_u64(&root.join("kdamonds/nr_kdamonds"))
        .context("DAMON sysfs interface not available")?;
    if nr > 0 {
        let running = (0..nr)
            .filter(|i| read(&root.join(format!("kdamonds/{i}/state"))).is_ok_and(|s| s == "on"))
            .count() as u64;
        return Ok(Some(Busy::SysfsKdamonds { nr, running }));
    }
    for name in EXCLUSIVE_MODULES {
        let p = modules.join(name).join("parameters");
        if read(&p.join("enabled")).is_ok_and(|s| s == "Y" || s == "1") {
            let kdamond_pid = read(&p.join("kdamond_pid"))
                .ok()
                .and_then(|s| s.parse::<i64>().ok())
                .filter(|&p| p > 0);
            return Ok(Some(Busy::Module {
                name: name.to_string(),
                kdamond_pid,
            }));
        }
    }
    Ok(None)
}

/// The outcome of trying to start a kdamond of ours.
#[derive(Debug)]
pub enum Start {
    Running(Kdamond),
    Busy(Busy),
}

fn is_ebusy(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .and_then(|e| e.raw_os_error())
            == Some(libc::EBUSY)
    })
}

/// A tried region of the stat scheme: `[start, end)` bytes of the monitored address space with
/// its access frequency in the last aggregation interval (samples in which it was seen
/// accessed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Region {
    pub start: u64,
    pub end: u64,
    pub nr_accesses: u32,
    pub age: u32,
}

/// Monitoring attributes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attrs {
    pub sample_us: u64,
    pub aggr_us: u64,
    pub update_us: u64,
    pub min_nr_regions: u64,
    pub max_nr_regions: u64,
}

/// How long a sysfs access may keep failing with EBUSY before the failure counts.
const BUSY_RETRY: std::time::Duration = std::time::Duration::from_secs(2);

/// Runs `op` until it succeeds, fails otherwise than with EBUSY, or has failed with EBUSY for
/// `bound`. DAMON's sysfs files take `damon_sysfs_lock` with a trylock (EBUSY when taken), and
/// a running kdamond takes it in its callbacks every sampling interval (6.12 mm/damon/sysfs.c,
/// `damon_sysfs_cmd_request_callback`): a loaded guest sees EBUSY on its own kdamond's files.
fn retry_busy<T>(bound: std::time::Duration, mut op: impl FnMut() -> Result<T>) -> Result<T> {
    let start = std::time::Instant::now();
    let mut pause = std::time::Duration::from_millis(1);
    loop {
        match op() {
            Err(e) if is_ebusy(&e) && start.elapsed() < bound => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(std::time::Duration::from_millis(50));
            }
            r => return r,
        }
    }
}

fn write(path: &Path, value: &str) -> Result<()> {
    retry_busy(BUSY_RETRY, || {
        fs::write(path, value).with_context(|| format!("writing {value:?} to {}", path.display()))
    })
}

fn read(path: &Path) -> Result<String> {
    retry_busy(BUSY_RETRY, || {
        Ok(fs::read_to_string(path)
            .with_context(|| format!("reading {}", path.display()))?
            .trim()
            .to_string())
    })
}

fn read_u64(path: &Path) -> Result<u64> {
    let s = read(path)?;
    s.parse()
        .with_context(|| format!("{} holds {s:?}, not a number", path.display()))
}

/// Our kdamond.
#[derive(Debug)]
pub struct Kdamond {
    root: PathBuf,
    index: u64,
    dir: PathBuf,
    started: bool,
    ops: Ops,
    nr_targets: usize,
}

impl Kdamond {
    /// Creates kdamond 0 under `root` for physical-address monitoring of `ranges` with a
    /// stat-only scheme over every region accessed at least once, and starts it; or says why
    /// DAMON is busy, having changed nothing (or removed only its own new directory).
    pub fn start_new(root: &Path, ranges: &[AddrRange], attrs: &Attrs) -> Result<Start> {
        if ranges.is_empty() {
            bail!("no System RAM range to monitor");
        }
        let target = Target {
            pid: None,
            regions: ranges.to_vec(),
        };
        Self::start_targets(root, Ops::Paddr, &[target], attrs)
    }

    /// Like [`Kdamond::start_new`], for any operations set and targets.
    pub fn start_targets(
        root: &Path,
        ops: Ops,
        targets: &[Target],
        attrs: &Attrs,
    ) -> Result<Start> {
        if targets.is_empty() {
            bail!("no target to monitor");
        }
        let nr_path = root.join("kdamonds/nr_kdamonds");
        let nr = read_u64(&nr_path).context("DAMON sysfs interface not available")?;
        if nr != 0 {
            return Ok(Start::Busy(Busy::SysfsKdamonds { nr, running: 0 }));
        }
        match write(&nr_path, "1") {
            Ok(()) => {}
            // another sysfs user got there first and started one
            Err(e) if is_ebusy(&e) => {
                return Ok(Start::Busy(Busy::SysfsKdamonds { nr: 1, running: 1 }))
            }
            Err(e) => return Err(e),
        }
        let index = 0;
        let dir = root.join(format!("kdamonds/{index}"));
        let mut k = Kdamond {
            root: root.to_path_buf(),
            index,
            dir,
            started: false,
            ops,
            nr_targets: targets.len(),
        };
        if let Err(e) = k.configure(targets, attrs) {
            // the directory created a moment ago, half configured: still only ours
            if read_u64(&nr_path).is_ok_and(|n| n == 1) {
                let _ = write(&nr_path, "0");
            }
            return Err(e);
        }
        match write(&k.dir.join("state"), "on") {
            Ok(()) => {
                k.started = true;
                Ok(Start::Running(k))
            }
            Err(e) if is_ebusy(&e) => {
                k.remove()?;
                Ok(Start::Busy(Busy::StartRefused))
            }
            Err(e) => {
                let _ = k.remove();
                Err(e)
            }
        }
    }

    fn configure(&mut self, targets: &[Target], attrs: &Attrs) -> Result<()> {
        let ctxs = self.dir.join("contexts");
        write(&ctxs.join("nr_contexts"), "1")?;
        let ctx = ctxs.join("0");
        let avail = read(&ctx.join("avail_operations")).unwrap_or_default();
        let ops = self.ops.label();
        if !avail.split_whitespace().any(|o| o == ops) {
            bail!("this kernel's DAMON has no {ops} operations (available: {avail:?})");
        }
        write(&ctx.join("operations"), ops)?;
        self.write_attrs(attrs)?;
        self.write_targets(targets)?;
        let schemes = ctx.join("schemes");
        write(&schemes.join("nr_schemes"), "1")?;
        let s = schemes.join("0");
        write(&s.join("action"), "stat")?;
        let ap = s.join("access_pattern");
        write(&ap.join("sz/min"), "0")?;
        write(&ap.join("sz/max"), &u64::MAX.to_string())?;
        write(&ap.join("nr_accesses/min"), "1")?;
        write(&ap.join("nr_accesses/max"), &u32::MAX.to_string())?;
        write(&ap.join("age/min"), "0")?;
        write(&ap.join("age/max"), &u32::MAX.to_string())?;
        Ok(())
    }

    fn ctx(&self) -> PathBuf {
        self.dir.join("contexts/0")
    }

    /// Writes the monitoring attributes (applied at `start` or `commit`).
    pub fn write_attrs(&self, a: &Attrs) -> Result<()> {
        let m = self.ctx().join("monitoring_attrs");
        // DAMON checks sample <= aggr at commit; write in an order valid from any previous state
        write(&m.join("intervals/sample_us"), &a.sample_us.to_string())?;
        write(&m.join("intervals/aggr_us"), &a.aggr_us.to_string())?;
        write(&m.join("intervals/update_us"), &a.update_us.to_string())?;
        write(&m.join("nr_regions/max"), &a.max_nr_regions.to_string())?;
        write(&m.join("nr_regions/min"), &a.min_nr_regions.to_string())?;
        Ok(())
    }

    /// Writes the targets, each with its pid and regions (applied at `start`).
    pub fn write_targets(&mut self, targets: &[Target]) -> Result<()> {
        let dir = self.ctx().join("targets");
        write(&dir.join("nr_targets"), &targets.len().to_string())?;
        self.nr_targets = targets.len();
        for (i, t) in targets.iter().enumerate() {
            if let Some(pid) = t.pid {
                write(&dir.join(format!("{i}/pid_target")), &pid.to_string())?;
            }
            self.write_target_regions(i, &t.regions)?;
        }
        Ok(())
    }

    /// Writes the first target's regions (sorted, disjoint; DAMON checks them at
    /// `start`/`commit`).
    pub fn write_regions(&self, ranges: &[AddrRange]) -> Result<()> {
        self.write_target_regions(0, ranges)
    }

    fn write_target_regions(&self, target: usize, ranges: &[AddrRange]) -> Result<()> {
        let regions = self.ctx().join(format!("targets/{target}/regions"));
        write(&regions.join("nr_regions"), &ranges.len().to_string())?;
        for (i, r) in ranges.iter().enumerate() {
            let d = regions.join(i.to_string());
            write(&d.join("start"), &r.start.to_string())?;
            write(&d.join("end"), &r.end.to_string())?;
        }
        Ok(())
    }

    pub fn index(&self) -> u64 {
        self.index
    }

    /// Whether the kdamond still runs (someone else may have turned it off).
    pub fn running(&self) -> bool {
        read(&self.dir.join("state")).is_ok_and(|s| s == "on")
    }

    /// Replaces the targets of the kdamond: turned off, rewritten, turned on again. (`commit`
    /// handles changed targets differently across kernels; a restart is the same everywhere,
    /// and costs only the regions DAMON had adapted.) If DAMON refuses the restart (EBUSY:
    /// an exclusive user took DAMON while ours was off), the kdamond is removed and the busy
    /// reason returned; a kdamond that is no longer as we left it is not touched.
    pub fn restart_with(&mut self, targets: &[Target]) -> Result<Option<Busy>> {
        if !self.looks_ours() {
            bail!("kdamond {} was reconfigured by someone else", self.index);
        }
        if self.started && self.running() {
            write(&self.dir.join("state"), "off")?;
        }
        self.started = false;
        self.write_targets(targets)?;
        match write(&self.dir.join("state"), "on") {
            Ok(()) => {
                self.started = true;
                Ok(None)
            }
            Err(e) if is_ebusy(&e) => {
                self.remove()?;
                Ok(Some(Busy::StartRefused))
            }
            Err(e) => Err(e),
        }
    }

    /// Still configured as its owner left it: its operations, its number of targets, one stat
    /// scheme.
    pub fn looks_ours(&self) -> bool {
        let ctx = self.ctx();
        read(&self.dir.join("contexts/nr_contexts")).is_ok_and(|s| s == "1")
            && read(&ctx.join("operations")).is_ok_and(|s| s == self.ops.label())
            && read(&ctx.join("targets/nr_targets")).is_ok_and(|s| s == self.nr_targets.to_string())
            && read(&ctx.join("schemes/nr_schemes")).is_ok_and(|s| s == "1")
            && read(&ctx.join("schemes/0/action")).is_ok_and(|s| s == "stat")
    }

    /// Applies what was written since to the running kdamond (`state commit`, which blocks
    /// until the kdamond's next aggregation): for the target's regions DAMON keeps its own
    /// regions that lie inside them, cuts those that cross their boundaries and fills the gaps.
    pub fn commit(&mut self) -> Result<()> {
        if self.started {
            write(&self.dir.join("state"), "commit")?;
        }
        Ok(())
    }

    /// The kdamond thread's pid, if it runs.
    pub fn pid(&self) -> Option<u32> {
        read(&self.dir.join("pid"))
            .ok()?
            .parse()
            .ok()
            .filter(|&p| p > 0)
    }

    /// Asks DAMON to refill `tried_regions` (blocks until the kdamond's next aggregation has
    /// applied the scheme), then reads them, in address order.
    pub fn tried_regions(&self) -> Result<Vec<Region>> {
        let mut r = self.tried_regions_in_target_order()?;
        r.sort_by_key(|r| r.start);
        Ok(r)
    }

    /// Like [`Kdamond::tried_regions`], in the order DAMON lists them: target by target, each
    /// target's regions in address order (6.12 mm/damon/sysfs-schemes.c adds them walking the
    /// context's targets). Regions of different targets may overlap.
    pub fn tried_regions_in_target_order(&self) -> Result<Vec<Region>> {
        write(&self.dir.join("state"), "update_schemes_tried_regions")?;
        read_tried_regions_unsorted(&self.ctx().join("schemes/0/tried_regions"))
    }

    /// Turns the kdamond off if its owner started it and it still runs, and removes its
    /// directory if it is the only one and still configured as its owner left it. A kdamond
    /// someone else turned off is left as it is.
    pub fn remove(&mut self) -> Result<()> {
        let state = self.dir.join("state");
        if self.started {
            if !self.running() {
                tracing::warn!(
                    "kdamond {} was turned off by someone else: leaving it as it is",
                    self.index
                );
                self.started = false;
                return Ok(());
            }
            write(&state, "off")?;
            self.started = false;
        }
        let nr_path = self.root.join("kdamonds/nr_kdamonds");
        let nr = read_u64(&nr_path)?;
        if nr == self.index + 1 && self.index == 0 && self.looks_ours() {
            write(&nr_path, "0")?;
        } else {
            tracing::warn!(
                nr_kdamonds = nr,
                "the kdamond directories changed meanwhile: leaving kdamond {} off, not removed",
                self.index
            );
        }
        Ok(())
    }
}

impl Kdamond {
    /// Like [`Kdamond::remove`], for an owner whose kdamond stops by itself: a virtual-address
    /// kdamond stops when every target process has exited (6.12 mm/damon/core.c,
    /// `kdamond_need_stop`), so being off does not mean someone else turned it off. The
    /// directory is removed if it is the only one and still configured as its owner left it.
    pub fn remove_even_if_stopped(&mut self) -> Result<()> {
        if self.started && !self.running() {
            self.started = false;
        }
        self.remove()
    }
}

/// What [`reclaim`] did with a kdamond a previous owner recorded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reclaimed {
    /// Turned off (if it ran) and its directory removed.
    Removed,
    /// Not touched: no longer the kdamond that was recorded, and why.
    NotOurs(String),
}

/// Takes back a kdamond that an owner recorded (`index`, its thread's `pid` while it ran, its
/// `ops`) and did not remove, because it was killed: if it is still that kdamond (the only one,
/// configured as an owner leaves it, and running as `pid` or off), it is turned off and
/// `nr_kdamonds` written back to 0. Anything else is someone's since, and left alone.
pub fn reclaim(root: &Path, index: u64, pid: u32, ops: Ops) -> Result<Reclaimed> {
    let nr_path = root.join("kdamonds/nr_kdamonds");
    let nr = read_u64(&nr_path)?;
    if index != 0 || nr != 1 {
        return Ok(Reclaimed::NotOurs(format!(
            "nr_kdamonds is {nr}, the record names kdamond {index}"
        )));
    }
    let dir = root.join("kdamonds/0");
    let ctx = dir.join("contexts/0");
    let shaped = read(&dir.join("contexts/nr_contexts")).is_ok_and(|s| s == "1")
        && read(&ctx.join("operations")).is_ok_and(|s| s == ops.label())
        && read(&ctx.join("schemes/nr_schemes")).is_ok_and(|s| s == "1")
        && read(&ctx.join("schemes/0/action")).is_ok_and(|s| s == "stat");
    if !shaped {
        return Ok(Reclaimed::NotOurs("configured otherwise".into()));
    }
    let on = read(&dir.join("state")).is_ok_and(|s| s == "on");
    if on {
        let now: Option<u32> = read(&dir.join("pid")).ok().and_then(|p| p.parse().ok());
        if now != Some(pid) {
            return Ok(Reclaimed::NotOurs(format!(
                "running as pid {now:?}, the record says {pid}"
            )));
        }
        write(&dir.join("state"), "off")?;
    }
    write(&nr_path, "0")?;
    Ok(Reclaimed::Removed)
}

/// Reads a `tried_regions` directory: numbered subdirectories with `start`, `end`,
/// `nr_accesses`, `age`, in address order.
pub fn read_tried_regions(dir: &Path) -> Result<Vec<Region>> {
    let mut out = read_tried_regions_unsorted(dir)?;
    out.sort_by_key(|r| r.start);
    Ok(out)
}

/// Reads a `tried_regions` directory in the order of its numbered subdirectories (DAMON's
/// order), empty regions left out.
pub fn read_tried_regions_unsorted(dir: &Path) -> Result<Vec<Region>> {
    let mut out: Vec<(u64, Region)> = Vec::new();
    let rd = fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))?;
    for e in rd {
        let e = e?;
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        let Ok(index) = name.parse::<u64>() else {
            continue; // total_bytes and the like
        };
        let d = e.path();
        out.push((
            index,
            Region {
                start: read_u64(&d.join("start"))?,
                end: read_u64(&d.join("end"))?,
                nr_accesses: read_u64(&d.join("nr_accesses"))?.min(u32::MAX as u64) as u32,
                age: read_u64(&d.join("age"))?.min(u32::MAX as u64) as u32,
            },
        ));
    }
    out.sort_by_key(|(i, _)| *i);
    Ok(out
        .into_iter()
        .map(|(_, r)| r)
        .filter(|r| r.end > r.start)
        .collect())
}

#[cfg(test)]
mod testdir {
    use std::path::{Path, PathBuf};
    use std::sync::atomic::{AtomicU32, Ordering};

    /// A scratch directory removed on drop.
    pub struct TestDir(pub PathBuf);
    impl TestDir {
        pub fn new(tag: &str) -> TestDir {
            static N: AtomicU32 = AtomicU32::new(0);
            let p = std::env::temp_dir().join(format!(
                "vtism-damon-sysfs-{tag}-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            let _ = std::fs::remove_dir_all(&p);
            std::fs::create_dir_all(&p).unwrap();
            TestDir(p)
        }
        pub fn path(&self) -> &Path {
            &self.0
        }
        pub fn write(&self, rel: &str, content: &str) {
            let p = self.0.join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, content).unwrap();
        }
    }
    impl Drop for TestDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testdir::TestDir;
    type PhysRange = AddrRange;

    /// A kdamond its recorded owner left running is turned off and removed; one that runs as
    /// another pid, or is configured otherwise, is not touched.
    #[test]
    fn a_recorded_kdamond_is_reclaimed_only_if_still_the_one_recorded() {
        let d = fake(1);
        d.write("kdamonds/0/contexts/nr_contexts", "1\n");
        d.write("kdamonds/0/contexts/0/operations", "fvaddr\n");
        d.write("kdamonds/0/contexts/0/schemes/nr_schemes", "1\n");
        d.write("kdamonds/0/contexts/0/schemes/0/action", "stat\n");
        d.write("kdamonds/0/state", "on\n");
        d.write("kdamonds/0/pid", "4242\n");
        let nr = || std::fs::read_to_string(d.path().join("kdamonds/nr_kdamonds")).unwrap();
        let state = || std::fs::read_to_string(d.path().join("kdamonds/0/state")).unwrap();
        assert!(matches!(
            reclaim(d.path(), 0, 4243, Ops::Fvaddr).unwrap(),
            Reclaimed::NotOurs(_)
        ));
        assert!(matches!(
            reclaim(d.path(), 0, 4242, Ops::Paddr).unwrap(),
            Reclaimed::NotOurs(_)
        ));
        assert_eq!((nr().trim(), state().trim()), ("1", "on"));
        assert_eq!(
            reclaim(d.path(), 0, 4242, Ops::Fvaddr).unwrap(),
            Reclaimed::Removed
        );
        assert_eq!((nr().trim(), state().trim()), ("0", "off"));
    }

    /// A fake admin tree with `nr_kdamonds` and, for kdamond 0, the files the agent writes.
    fn fake(nr: u64) -> TestDir {
        let d = TestDir::new("damon");
        d.write("kdamonds/nr_kdamonds", &format!("{nr}\n"));
        for f in [
            "state",
            "pid",
            "contexts/nr_contexts",
            "contexts/0/operations",
            "contexts/0/targets/nr_targets",
            "contexts/0/targets/0/regions/nr_regions",
            "contexts/0/schemes/nr_schemes",
        ] {
            d.write(&format!("kdamonds/0/{f}"), "");
        }
        d.write("kdamonds/0/state", "off\n");
        d.write(
            "kdamonds/0/contexts/0/avail_operations",
            "vaddr fvaddr paddr\n",
        );
        d
    }

    /// The directories the kernel would create for `targets` targets of `regions` regions, a
    /// scheme and the monitoring attributes (the fake lacks them).
    fn kernel_dirs(d: &TestDir, targets: usize, regions: usize) {
        let ctx = d.path().join("kdamonds/0/contexts/0");
        let mut dirs: Vec<String> = (0..targets)
            .flat_map(|t| (0..regions).map(move |r| format!("targets/{t}/regions/{r}")))
            .collect();
        dirs.extend(["sz", "nr_accesses", "age"].map(|p| format!("schemes/0/access_pattern/{p}")));
        dirs.extend(["intervals", "nr_regions"].map(|p| format!("monitoring_attrs/{p}")));
        for dir in dirs {
            std::fs::create_dir_all(ctx.join(dir)).unwrap();
        }
    }

    fn attrs() -> Attrs {
        Attrs {
            sample_us: 5000,
            aggr_us: 100_000,
            update_us: 1_000_000,
            min_nr_regions: 10,
            max_nr_regions: 1000,
        }
    }

    fn get(d: &TestDir, rel: &str) -> String {
        std::fs::read_to_string(d.path().join("kdamonds/0").join(rel))
            .unwrap()
            .trim()
            .to_string()
    }

    #[test]
    fn creates_configures_and_removes_its_own() {
        let d = fake(0);
        let ranges = [
            PhysRange {
                start: 0x100000,
                end: 0x3ffe0000,
            },
            PhysRange {
                start: 0x1_0000_0000,
                end: 0x1_4000_0000,
            },
        ];
        kernel_dirs(&d, 1, 2);
        let Start::Running(mut k) = Kdamond::start_new(d.path(), &ranges, &attrs()).unwrap() else {
            panic!("busy")
        };
        assert_eq!(k.index(), 0);
        assert_eq!(get(&d, "state"), "on");
        assert_eq!(
            std::fs::read_to_string(d.path().join("kdamonds/nr_kdamonds")).unwrap(),
            "1"
        );
        assert_eq!(get(&d, "contexts/0/operations"), "paddr");
        assert_eq!(get(&d, "contexts/0/targets/0/regions/nr_regions"), "2");
        assert_eq!(
            get(&d, "contexts/0/targets/0/regions/1/start"),
            "4294967296"
        );
        assert_eq!(get(&d, "contexts/0/targets/0/regions/1/end"), "5368709120");
        assert_eq!(get(&d, "contexts/0/schemes/0/action"), "stat");
        assert_eq!(
            get(&d, "contexts/0/schemes/0/access_pattern/nr_accesses/min"),
            "1"
        );
        assert_eq!(
            get(&d, "contexts/0/monitoring_attrs/intervals/aggr_us"),
            "100000"
        );
        assert_eq!(
            get(&d, "contexts/0/monitoring_attrs/nr_regions/max"),
            "1000"
        );
        let mut a = attrs();
        a.aggr_us = 400_000;
        k.write_attrs(&a).unwrap();
        k.commit().unwrap();
        assert_eq!(get(&d, "state"), "commit");
        assert_eq!(
            get(&d, "contexts/0/monitoring_attrs/intervals/aggr_us"),
            "400000"
        );
        let cut = [
            PhysRange {
                start: 0x100000,
                end: 0x200000,
            },
            PhysRange {
                start: 0x200000,
                end: 0x201000,
            },
            PhysRange {
                start: 0x201000,
                end: 0x3ffe0000,
            },
        ];
        std::fs::write(d.path().join("kdamonds/0/state"), "on\n").unwrap();
        for i in 0..3 {
            std::fs::create_dir_all(
                d.path()
                    .join(format!("kdamonds/0/contexts/0/targets/0/regions/{i}")),
            )
            .unwrap();
        }
        k.write_regions(&cut).unwrap();
        k.commit().unwrap();
        assert_eq!(get(&d, "state"), "commit");
        assert_eq!(get(&d, "contexts/0/targets/0/regions/nr_regions"), "3");
        assert_eq!(get(&d, "contexts/0/targets/0/regions/1/start"), "2097152");
        assert_eq!(get(&d, "contexts/0/targets/0/regions/1/end"), "2101248");
        std::fs::write(d.path().join("kdamonds/0/state"), "on\n").unwrap();
        assert!(k.running());
        k.remove().unwrap();
        assert_eq!(get(&d, "state"), "off");
        assert_eq!(
            std::fs::read_to_string(d.path().join("kdamonds/nr_kdamonds")).unwrap(),
            "0"
        );
    }

    #[test]
    fn busy_when_other_kdamonds_exist_and_touches_nothing() {
        let d = fake(2);
        d.write("kdamonds/1/state", "on\n");
        let ranges = [PhysRange {
            start: 0,
            end: 1 << 30,
        }];
        let m = TestDir::new("modules");
        assert_eq!(
            busy(d.path(), m.path()).unwrap(),
            Some(Busy::SysfsKdamonds { nr: 2, running: 1 })
        );
        let Start::Busy(b) = Kdamond::start_new(d.path(), &ranges, &attrs()).unwrap() else {
            panic!("started beside other kdamonds")
        };
        assert!(b.to_string().contains("cannot add a kdamond"), "{b}");
        assert_eq!(
            std::fs::read_to_string(d.path().join("kdamonds/nr_kdamonds")).unwrap(),
            "2\n"
        );
        assert_eq!(get(&d, "state"), "off");
        assert_eq!(get(&d, "contexts/0/operations"), "");
    }

    #[test]
    fn busy_while_an_exclusive_module_runs() {
        let d = fake(0);
        let m = TestDir::new("modules");
        m.write("damon_reclaim/parameters/enabled", "N\n");
        m.write("damon_reclaim/parameters/kdamond_pid", "-1\n");
        m.write("damon_lru_sort/parameters/enabled", "N\n");
        assert_eq!(busy(d.path(), m.path()).unwrap(), None);
        m.write("damon_lru_sort/parameters/enabled", "Y\n");
        m.write("damon_lru_sort/parameters/kdamond_pid", "77\n");
        let b = busy(d.path(), m.path()).unwrap().unwrap();
        assert_eq!(
            b,
            Busy::Module {
                name: "damon_lru_sort".into(),
                kdamond_pid: Some(77)
            }
        );
        assert!(b.to_string().contains("exclusively"), "{b}");
        // no DAMON at all
        let none = TestDir::new("nodamon");
        assert!(busy(none.path(), m.path()).is_err());
    }

    #[test]
    fn leaves_others_when_more_appeared() {
        let d = fake(0);
        let mut k = Kdamond {
            root: d.path().to_path_buf(),
            index: 0,
            dir: d.path().join("kdamonds/0"),
            started: true,
            ops: Ops::Paddr,
            nr_targets: 1,
        };
        std::fs::write(d.path().join("kdamonds/0/state"), "on\n").unwrap();
        std::fs::write(d.path().join("kdamonds/nr_kdamonds"), "2\n").unwrap();
        k.remove().unwrap();
        assert_eq!(get(&d, "state"), "off");
        assert_eq!(
            std::fs::read_to_string(d.path().join("kdamonds/nr_kdamonds")).unwrap(),
            "2\n"
        );
    }

    #[test]
    fn leaves_a_kdamond_someone_else_turned_off() {
        let d = fake(1);
        let mut k = Kdamond {
            root: d.path().to_path_buf(),
            index: 0,
            dir: d.path().join("kdamonds/0"),
            started: true,
            ops: Ops::Paddr,
            nr_targets: 1,
        };
        assert!(!k.running());
        k.remove().unwrap();
        assert_eq!(
            std::fs::read_to_string(d.path().join("kdamonds/nr_kdamonds")).unwrap(),
            "1\n"
        );
        // off, but reconfigured by someone else (vaddr): not removed either
        let mut k = Kdamond {
            started: false,
            ..k
        };
        d.write("kdamonds/0/contexts/0/operations", "vaddr\n");
        k.remove().unwrap();
        assert_eq!(
            std::fs::read_to_string(d.path().join("kdamonds/nr_kdamonds")).unwrap(),
            "1\n"
        );
    }

    #[test]
    fn refuses_without_paddr() {
        let d = fake(0);
        d.write("kdamonds/0/contexts/0/avail_operations", "vaddr fvaddr\n");
        let ranges = [PhysRange {
            start: 0,
            end: 1 << 30,
        }];
        let e = Kdamond::start_new(d.path(), &ranges, &attrs()).unwrap_err();
        assert!(format!("{e:#}").contains("no paddr"), "{e:#}");
        // cleaned up after itself
        assert_eq!(
            std::fs::read_to_string(d.path().join("kdamonds/nr_kdamonds")).unwrap(),
            "0"
        );
    }

    #[test]
    fn tried_regions_tree() {
        let d = TestDir::new("tried");
        d.write("total_bytes", "12288\n");
        for (i, (s, e, n, a)) in [
            (0x20000u64, 0x22000u64, 3u32, 1u32),
            (0x1000, 0x2000, 7, 4),
            (0x5000, 0x5000, 1, 0),
        ]
        .iter()
        .enumerate()
        {
            d.write(&format!("{i}/start"), &format!("{s}\n"));
            d.write(&format!("{i}/end"), &format!("{e}\n"));
            d.write(&format!("{i}/nr_accesses"), &format!("{n}\n"));
            d.write(&format!("{i}/age"), &format!("{a}\n"));
        }
        let r = read_tried_regions(d.path()).unwrap();
        assert_eq!(
            r,
            vec![
                Region {
                    start: 0x1000,
                    end: 0x2000,
                    nr_accesses: 7,
                    age: 4
                },
                Region {
                    start: 0x20000,
                    end: 0x22000,
                    nr_accesses: 3,
                    age: 1
                },
            ]
        );
        d.write("3/start", "x\n");
        assert!(read_tried_regions(d.path()).is_err());
    }

    #[test]
    fn fvaddr_targets_written_with_pids_and_replaced_by_a_restart() {
        let d = fake(0);
        kernel_dirs(&d, 2, 2);
        let qemu = |pid, start| Target {
            pid: Some(pid),
            regions: vec![AddrRange {
                start,
                end: start + (64 << 20),
            }],
        };
        let two = [qemu(100, 0x7f00_0000_0000), qemu(200, 0x7e00_0000_0000)];
        let Start::Running(mut k) =
            Kdamond::start_targets(d.path(), Ops::Fvaddr, &two, &attrs()).unwrap()
        else {
            panic!("busy")
        };
        assert_eq!(get(&d, "contexts/0/operations"), "fvaddr");
        assert_eq!(get(&d, "contexts/0/targets/nr_targets"), "2");
        assert_eq!(get(&d, "contexts/0/targets/1/pid_target"), "200");
        assert_eq!(
            get(&d, "contexts/0/targets/1/regions/0/start"),
            (0x7e00_0000_0000u64).to_string()
        );
        assert!(k.looks_ours());
        // one VM went away: off, rewritten, on
        assert_eq!(k.restart_with(&two[1..]).unwrap(), None);
        assert_eq!(get(&d, "state"), "on");
        assert_eq!(get(&d, "contexts/0/targets/nr_targets"), "1");
        assert_eq!(get(&d, "contexts/0/targets/0/pid_target"), "200");
        assert!(k.looks_ours());
        // someone else reconfigured it: not touched
        d.write("kdamonds/0/contexts/0/operations", "paddr\n");
        assert!(k.restart_with(&two).is_err());
        assert_eq!(get(&d, "contexts/0/targets/nr_targets"), "1");
        assert_eq!(get(&d, "state"), "on", "someone else's kdamond turned off");
    }

    #[test]
    fn tried_regions_in_damons_order() {
        let d = TestDir::new("tried-order");
        // target 0's regions, then target 1's (lower addresses): listed as DAMON wrote them
        for (i, (s, e)) in [(0x9000u64, 0xa000u64), (0xb000, 0xc000), (0x1000, 0x2000)]
            .iter()
            .enumerate()
        {
            d.write(&format!("{i}/start"), &format!("{s}\n"));
            d.write(&format!("{i}/end"), &format!("{e}\n"));
            d.write(&format!("{i}/nr_accesses"), "1\n");
            d.write(&format!("{i}/age"), "0\n");
        }
        let starts: Vec<u64> = read_tried_regions_unsorted(d.path())
            .unwrap()
            .iter()
            .map(|r| r.start)
            .collect();
        assert_eq!(starts, vec![0x9000, 0xb000, 0x1000]);
    }

    fn ebusy() -> anyhow::Error {
        anyhow::Error::new(std::io::Error::from_raw_os_error(libc::EBUSY)).context("writing")
    }

    #[test]
    fn a_passing_ebusy_is_retried() {
        let mut tries = 0;
        let r = retry_busy(std::time::Duration::from_secs(2), || {
            tries += 1;
            if tries < 4 {
                Err(ebusy())
            } else {
                Ok(tries)
            }
        });
        assert_eq!(r.unwrap(), 4);
    }

    #[test]
    fn a_lasting_ebusy_fails_after_the_bound_and_other_errors_at_once() {
        let start = std::time::Instant::now();
        let r: Result<()> = retry_busy(std::time::Duration::from_millis(100), || Err(ebusy()));
        assert!(is_ebusy(&r.unwrap_err()));
        assert!(start.elapsed() >= std::time::Duration::from_millis(100));
        let mut tries = 0;
        let r: Result<()> = retry_busy(std::time::Duration::from_secs(2), || {
            tries += 1;
            bail!("EINVAL")
        });
        assert!(r.is_err());
        assert_eq!(tries, 1);
    }
}
