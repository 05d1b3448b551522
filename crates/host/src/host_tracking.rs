//! Host-side tracking: DAMON on the host watches the guest RAM of VMs without a tracker (and,
//! if asked, of the others as a second signal), and its accessed regions become the engine's
//! host-side observations (`Observation::Accesses`).
//!
//! One kdamond of vtismd's own (crate `vtism-damon-sysfs`: created only while DAMON is free,
//! never touching others' kdamonds), one `fvaddr` context, one target per tracked QEMU process
//! with the VM's guest RAM host-virtual ranges as its regions. A thread owns the kdamond: DAMON's
//! sysfs waits for the kdamond's next aggregation, which the main loop must never do. The main
//! loop tells it which VMs to track and takes its latest regions per VM; turning them into guest
//! frames is bounded per VM per report (`max_frames_per_report`, hottest regions first).

use crate::config::HostTrackingConfig;
use crate::mtree::GuestMemory;
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tracing::{info, warn};
use vtism_damon_sysfs::{self as damon, AddrRange, Attrs, Kdamond, Ops, Region, Start, Target};
use vtism_engine::{FrameAccess, VmId};
use vtism_proto::{Gfn, Hva, PageType, FRAME_SIZE};

/// A VM to watch: its QEMU process and the host-virtual ranges of its guest RAM.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrackedVm {
    pub vm: VmId,
    pub pid: u32,
    /// `[start, end)` host-virtual byte ranges, sorted.
    pub ranges: Vec<(Hva, Hva)>,
}

impl TrackedVm {
    pub fn new(vm: VmId, pid: u32, memory: &GuestMemory) -> TrackedVm {
        let mut ranges: Vec<(Hva, Hva)> = memory
            .ranges
            .iter()
            .map(|r| (r.hva, Hva(r.hva.0.saturating_add(r.len_bytes()))))
            .filter(|(s, e)| e > s)
            .collect();
        ranges.sort();
        TrackedVm { vm, pid, ranges }
    }
}

/// What the kdamond is doing, for `ctl status` and the metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct KdamondStatus {
    /// `idle` (no VM to track), `waiting` (DAMON used by someone else), `running`, `failed`.
    pub state: &'static str,
    /// Why it waits or failed.
    pub reason: Option<String>,
    /// The kdamond's index in DAMON's sysfs and its thread's pid, while it runs.
    pub kdamond: Option<u64>,
    pub kdamond_pid: Option<u32>,
    /// Reports read from the kdamond (`tried_regions`).
    pub reports: u64,
}

/// What the thread and the main loop share.
#[derive(Default)]
struct Shared {
    targets: Vec<TrackedVm>,
    generation: u64,
    /// The latest accessed regions of each VM (host-virtual), replaced by every report.
    regions: BTreeMap<VmId, Vec<Region>>,
    status: KdamondStatus,
}

/// One VM's host-side observations so far.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct VmHostTracking {
    /// Reports fed to the engine.
    pub observations: u64,
    /// Guest frames they carried.
    pub frames: u64,
    /// Frames left out by `max_frames_per_report` (coldest regions first).
    pub frames_over_budget: u64,
    /// Why the VM is not tracked although its mode asks for it.
    pub problem: Option<String>,
}

pub struct HostTracking {
    /// Where the thread records the kdamond it runs (`reclaim_left_behind`).
    record: PathBuf,
    shared: Arc<Mutex<Shared>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    /// The configuration the thread runs with.
    cfg: HostTrackingConfig,
    per_vm: BTreeMap<VmId, VmHostTracking>,
    scratch: Vec<FrameAccess>,
}

fn lock(m: &Mutex<Shared>) -> std::sync::MutexGuard<'_, Shared> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl HostTracking {
    /// `record`: the file naming the kdamond while it runs, so that a vtismd started after this
    /// one was killed can take it back (`reclaim_left_behind`).
    pub fn new(cfg: &HostTrackingConfig, record: PathBuf) -> HostTracking {
        HostTracking {
            record,
            shared: Arc::new(Mutex::new(Shared {
                status: KdamondStatus {
                    state: "idle",
                    ..Default::default()
                },
                ..Default::default()
            })),
            stop: Arc::new(AtomicBool::new(false)),
            thread: None,
            cfg: cfg.clone(),
            per_vm: BTreeMap::new(),
            scratch: Vec::new(),
        }
    }

    /// The VMs to track now. VMs whose guest RAM addresses overlap an earlier one's are left
    /// out (DAMON's tried regions do not say which target they belong to). The kdamond follows
    /// when the set changes; the thread starts with the first VM.
    pub fn set_targets(&mut self, mut wanted: Vec<TrackedVm>, cfg: &HostTrackingConfig) {
        if *cfg != self.cfg {
            // New attributes: a new kdamond (the old one is removed by its thread).
            self.shutdown();
            let per_vm = std::mem::take(&mut self.per_vm);
            *self = HostTracking::new(cfg, self.record.clone());
            self.per_vm = per_vm;
        }
        wanted.sort_by_key(|t| t.vm);
        let mut taken: Vec<(Hva, Hva)> = Vec::new();
        let mut targets = Vec::new();
        for t in wanted {
            let overlaps = t
                .ranges
                .iter()
                .any(|&(s, e)| taken.iter().any(|&(ts, te)| s < te && ts < e));
            let entry = self.per_vm.entry(t.vm).or_default();
            if overlaps {
                entry.problem = Some(
                    "its guest RAM's host addresses overlap another tracked VM's (DAMON's regions \
                     would not say whose they are)"
                        .into(),
                );
                continue;
            }
            entry.problem = None;
            taken.extend(&t.ranges);
            targets.push(t);
        }
        let ids: Vec<VmId> = targets.iter().map(|t| t.vm).collect();
        self.per_vm
            .retain(|vm, s| ids.contains(vm) || s.problem.is_some());
        {
            let mut sh = lock(&self.shared);
            if sh.targets == targets {
                return;
            }
            sh.targets = targets;
            sh.generation += 1;
            sh.regions.retain(|vm, _| ids.contains(vm));
        }
        if self.thread.is_none() && !ids.is_empty() {
            let (shared, stop, cfg) = (self.shared.clone(), self.stop.clone(), self.cfg.clone());
            let record = self.record.clone();
            match std::thread::Builder::new()
                .name("vtism-damon".into())
                .spawn(move || run(&shared, &stop, &cfg, &record))
            {
                Ok(h) => self.thread = Some(h),
                Err(e) => {
                    lock(&self.shared).status = KdamondStatus {
                        state: "failed",
                        reason: Some(format!("cannot start the DAMON thread: {e}")),
                        ..Default::default()
                    }
                }
            }
        }
    }

    /// A VM no longer managed.
    pub fn remove(&mut self, vm: VmId) {
        self.per_vm.remove(&vm);
        lock(&self.shared).regions.remove(&vm);
    }

    /// The VM's accesses since the last call, as guest frames (`None`: no new report). At most
    /// `max_frames_per_report` frames, from the regions accessed most.
    pub fn take_accesses(&mut self, vm: VmId, memory: &GuestMemory) -> Option<&[FrameAccess]> {
        let regions = lock(&self.shared).regions.remove(&vm)?;
        let over = frames_of(
            &regions,
            memory,
            self.cfg.max_frames_per_report,
            &mut self.scratch,
        );
        let s = self.per_vm.entry(vm).or_default();
        s.observations += 1;
        s.frames += self.scratch.len() as u64;
        s.frames_over_budget += over;
        Some(&self.scratch)
    }

    /// The VM's host tracking, if it is tracked (or should be and cannot).
    pub fn vm_status(&self, vm: VmId) -> Option<VmHostTracking> {
        self.per_vm.get(&vm).cloned()
    }

    pub fn status(&self) -> KdamondStatus {
        lock(&self.shared).status.clone()
    }

    /// Stops the thread, which turns its kdamond off and removes it if it is still its own.
    pub fn shutdown(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for HostTracking {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Guest frames of `regions` (host-virtual) in `memory`, hottest regions first, at most `max`;
/// returns the frames left out.
pub fn frames_of(
    regions: &[Region],
    memory: &GuestMemory,
    max: u64,
    out: &mut Vec<FrameAccess>,
) -> u64 {
    out.clear();
    let mut by_heat: Vec<&Region> = regions.iter().collect();
    by_heat.sort_by(|a, b| {
        b.nr_accesses
            .cmp(&a.nr_accesses)
            .then(a.start.cmp(&b.start))
    });
    let mut over = 0u64;
    for r in by_heat {
        for m in &memory.ranges {
            let (h, len) = (m.hva.0, m.len_bytes());
            let (s, e) = (r.start.max(h), r.end.min(h.saturating_add(len)));
            if s >= e {
                continue;
            }
            let first = (s - h) / FRAME_SIZE;
            let end = (e - h).div_ceil(FRAME_SIZE);
            // what is over the budget is counted, not visited: a region may span terabytes
            let take = (end - first).min(max.saturating_sub(out.len() as u64));
            over += end - first - take;
            out.extend((first..first + take).map(|f| FrameAccess {
                gfn: Gfn(m.gfns.start.0 + f),
                reads: r.nr_accesses.max(1),
                writes: 0,
                page_type: PageType::Unknown,
            }));
        }
    }
    over
}

/// Which tracked VM each region is of: the one whose guest RAM holds its start (the targets'
/// ranges do not overlap). Regions of no VM are dropped.
fn split_by_vm(regions: Vec<Region>, targets: &[TrackedVm]) -> BTreeMap<VmId, Vec<Region>> {
    let mut index: Vec<(u64, u64, VmId)> = targets
        .iter()
        .flat_map(|t| t.ranges.iter().map(|&(s, e)| (s.0, e.0, t.vm)))
        .collect();
    index.sort();
    let mut out: BTreeMap<VmId, Vec<Region>> = targets.iter().map(|t| (t.vm, vec![])).collect();
    for r in regions {
        let k = index.partition_point(|&(s, _, _)| s <= r.start);
        if let Some(&(_, e, vm)) = k.checked_sub(1).and_then(|k| index.get(k)) {
            if r.start < e {
                out.entry(vm).or_default().push(r);
            }
        }
    }
    out
}

fn damon_targets(targets: &[TrackedVm]) -> Vec<Target> {
    targets
        .iter()
        .map(|t| Target {
            pid: Some(t.pid),
            regions: t
                .ranges
                .iter()
                .map(|&(s, e)| AddrRange {
                    start: s.0,
                    end: e.0,
                })
                .collect(),
        })
        .collect()
}

fn attrs(cfg: &HostTrackingConfig) -> Attrs {
    Attrs {
        sample_us: cfg.sample_us,
        aggr_us: cfg.aggr_us,
        update_us: cfg.update_us,
        min_nr_regions: cfg.min_nr_regions,
        max_nr_regions: cfg.max_nr_regions,
    }
}

fn set_status(shared: &Mutex<Shared>, state: &'static str, reason: Option<String>) {
    let mut sh = lock(shared);
    if sh.status.state != state || sh.status.reason != reason {
        match (&reason, state) {
            (Some(r), "waiting") => warn!("host tracking waits: {r}; touching nothing"),
            (Some(r), _) => warn!("host tracking {state}: {r}"),
            (None, _) => info!("host tracking {state}"),
        }
    }
    sh.status.state = state;
    sh.status.reason = reason;
    if state != "running" {
        sh.status.kdamond = None;
        sh.status.kdamond_pid = None;
    }
}

/// Sleeps `d` in slices; false if asked to stop meanwhile.
fn pause(stop: &AtomicBool, d: Duration) -> bool {
    let end = Instant::now() + d;
    while Instant::now() < end {
        if stop.load(Ordering::SeqCst) {
            return false;
        }
        std::thread::sleep((end - Instant::now()).min(Duration::from_millis(50)));
    }
    !stop.load(Ordering::SeqCst)
}

/// Where vtismd records the kdamond it runs: `host-kdamond` next to its control socket.
pub fn record_path(control_socket: &Path) -> PathBuf {
    control_socket.with_file_name("host-kdamond")
}

/// Takes back the kdamond a vtismd killed before it could remove it left running (its record
/// says which), at start: otherwise DAMON stays busy with it and host tracking waits forever.
/// A kdamond that is no longer the one recorded is someone else's and left alone.
pub fn reclaim_left_behind(cfg: &HostTrackingConfig, record: &Path) {
    let Ok(text) = std::fs::read_to_string(record) else {
        return;
    };
    let mut it = text.split_whitespace().map(str::parse::<u64>);
    match (it.next(), it.next()) {
        (Some(Ok(index)), Some(Ok(pid))) => {
            match damon::reclaim(&cfg.damon_root, index, pid as u32, Ops::Fvaddr) {
                Ok(damon::Reclaimed::Removed) => info!(
                    kdamond = index,
                    pid, "took back the host kdamond a killed vtismd left behind: off and removed"
                ),
                Ok(damon::Reclaimed::NotOurs(why)) => info!(
                    kdamond = index, pid, why = %why,
                    "the host kdamond recorded by a previous vtismd is gone: left alone"
                ),
                Err(e) => warn!(error = %format!("{e:#}"), "taking back the host kdamond"),
            }
        }
        _ => warn!(path = %record.display(), "unreadable host kdamond record: ignored"),
    }
    forget(record);
}

/// Records the running kdamond (`reclaim_left_behind`).
fn remember(record: &Path, k: &Kdamond) {
    let text = format!("{} {}\n", k.index(), k.pid().unwrap_or(0));
    if let Err(e) = std::fs::write(record, text) {
        warn!(path = %record.display(), error = %e, "cannot record the host kdamond");
    }
}

fn forget(record: &Path) {
    match std::fs::remove_file(record) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            warn!(path = %record.display(), error = %e, "cannot remove the host kdamond record")
        }
    }
}

/// The thread: owns the kdamond from creation to removal.
fn run(shared: &Mutex<Shared>, stop: &AtomicBool, cfg: &HostTrackingConfig, record: &Path) {
    let root = cfg.damon_root.as_path();
    let retry = Duration::from_millis(cfg.busy_retry_ms);
    let report = Duration::from_millis(cfg.report_interval_ms);
    let mut kd: Option<Kdamond> = None;
    let mut applied = 0u64;
    while !stop.load(Ordering::SeqCst) {
        let (targets, generation) = {
            let sh = lock(shared);
            (sh.targets.clone(), sh.generation)
        };
        if targets.is_empty() {
            if let Some(mut k) = kd.take() {
                if let Err(e) = k.remove_even_if_stopped() {
                    warn!(error = %format!("{e:#}"), "removing the host kdamond");
                }
                forget(record);
            }
            set_status(shared, "idle", None);
            pause(stop, Duration::from_millis(100));
            continue;
        }
        let Some(k) = kd.as_mut() else {
            match start(root, &targets, cfg) {
                Ok(k) => {
                    applied = generation;
                    remember(record, &k);
                    let mut sh = lock(shared);
                    sh.status.kdamond = Some(k.index());
                    sh.status.kdamond_pid = k.pid();
                    drop(sh);
                    set_status(shared, "running", None);
                    kd = Some(k);
                }
                Err((state, why)) => {
                    set_status(shared, state, Some(why));
                    pause(stop, retry);
                }
            }
            continue;
        };
        if generation != applied || !k.running() {
            match k.restart_with(&damon_targets(&targets)) {
                Ok(None) => {
                    applied = generation;
                    remember(record, k);
                    lock(shared).status.kdamond_pid = k.pid();
                }
                Ok(Some(busy)) => {
                    kd = None;
                    forget(record);
                    set_status(shared, "waiting", Some(busy.to_string()));
                    pause(stop, retry);
                    continue;
                }
                // DAMON refused the targets (a QEMU exited before the main loop let its VM
                // go): still ours, tried again with the next targets.
                Err(e) if k.looks_ours() => {
                    set_status(shared, "failed", Some(format!("{e:#}")));
                    pause(stop, retry);
                    continue;
                }
                Err(e) => {
                    // No longer as we left it: not ours to touch again.
                    kd = None;
                    forget(record);
                    set_status(
                        shared,
                        "waiting",
                        Some(format!("lost the host kdamond: {e:#}")),
                    );
                    pause(stop, retry);
                    continue;
                }
            }
        }
        let t0 = Instant::now();
        match k.tried_regions_in_target_order() {
            Ok(regions) => {
                let split = split_by_vm(regions, &targets);
                let mut sh = lock(shared);
                if sh.generation == generation {
                    sh.regions.extend(split);
                }
                sh.status.reports += 1;
            }
            // a target's process exited and stopped the kdamond: restarted above next time
            Err(e) if !k.running() => {
                info!(error = %format!("{e:#}"), "host kdamond stopped (its targets exited?)")
            }
            Err(e) => warn!(error = %format!("{e:#}"), "reading the host kdamond's regions"),
        }
        pause(stop, report.saturating_sub(t0.elapsed()));
    }
    if let Some(mut k) = kd {
        if let Err(e) = k.remove_even_if_stopped() {
            warn!(error = %format!("{e:#}"), "removing the host kdamond");
        }
        forget(record);
    }
}

/// Starts a kdamond for `targets` if DAMON is free; else the state and why.
fn start(
    root: &Path,
    targets: &[TrackedVm],
    cfg: &HostTrackingConfig,
) -> Result<Kdamond, (&'static str, String)> {
    let modules = Path::new(damon::MODULES_ROOT);
    match damon::busy(root, modules) {
        Err(e) => return Err(("failed", format!("{e:#}"))),
        Ok(Some(b)) => return Err(("waiting", b.to_string())),
        Ok(None) => {}
    }
    match Kdamond::start_targets(root, Ops::Fvaddr, &damon_targets(targets), &attrs(cfg)) {
        Ok(Start::Running(k)) => Ok(k),
        Ok(Start::Busy(b)) => Err(("waiting", b.to_string())),
        Err(e) => Err(("failed", format!("{e:#}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mtree::MappedRange;
    use vtism_proto::GfnRange;

    fn memory() -> GuestMemory {
        // 16 MiB at GPA 0 and 16 MiB at GPA 4 GiB, mapped apart in the host.
        GuestMemory::new(vec![
            MappedRange {
                gfns: GfnRange {
                    start: Gfn(0),
                    end: Gfn(4096),
                },
                hva: Hva(0x7f00_0000_0000),
                name: "pc.ram".into(),
            },
            MappedRange {
                gfns: GfnRange {
                    start: Gfn(0x100000),
                    end: Gfn(0x100000 + 4096),
                },
                hva: Hva(0x7e00_0000_0000),
                name: "pc.ram high".into(),
            },
        ])
        .unwrap()
    }

    fn region(start: u64, end: u64, nr_accesses: u32) -> Region {
        Region {
            start,
            end,
            nr_accesses,
            age: 0,
        }
    }

    #[test]
    fn regions_become_guest_frames_through_the_ram_map() {
        let m = memory();
        let mut out = Vec::new();
        let regions = [
            // 8 KiB of the high range, 2 pages partly covered at each end
            region(0x7e00_0000_1800, 0x7e00_0000_3800, 3),
            // the last 4 KiB of the low range and past it (outside guest RAM): clipped
            region(0x7f00_00ff_f000, 0x7f00_0200_0000, 9),
        ];
        assert_eq!(frames_of(&regions, &m, 100, &mut out), 0);
        let gfns: Vec<(u64, u32)> = out.iter().map(|a| (a.gfn.0, a.reads)).collect();
        // hottest region first
        assert_eq!(
            gfns,
            vec![(4095, 9), (0x100001, 3), (0x100002, 3), (0x100003, 3)]
        );
    }

    #[test]
    fn a_huge_region_is_cut_to_the_budget_hottest_first() {
        let m = memory();
        let mut out = Vec::new();
        let regions = [
            region(0x7f00_0000_0000, 0x7f00_0100_0000, 1), // all 16 MiB, barely accessed
            region(0x7e00_0000_0000, 0x7e00_0000_4000, 20), // 4 frames, hot
        ];
        let over = frames_of(&regions, &m, 10, &mut out);
        assert_eq!(out.len(), 10);
        assert_eq!(over, 4096 + 4 - 10);
        assert!(out[..4]
            .iter()
            .all(|a| a.reads == 20 && a.gfn.0 >= 0x100000));
        // a 1 TiB guest accessed everywhere: cut to the budget without visiting the rest
        let huge = GuestMemory::new(vec![MappedRange {
            gfns: GfnRange {
                start: Gfn(0),
                end: Gfn(1 << 28),
            },
            hva: Hva(0x1000_0000_0000),
            name: "pc.ram".into(),
        }])
        .unwrap();
        let t0 = Instant::now();
        let all = [region(0x1000_0000_0000, 0x1100_0000_0000, 1)];
        assert_eq!(frames_of(&all, &huge, 1000, &mut out), (1 << 28) - 1000);
        assert_eq!(out.len(), 1000);
        assert!(t0.elapsed() < Duration::from_secs(1));
    }

    #[test]
    fn regions_go_to_the_vm_whose_ram_holds_them() {
        let a = TrackedVm::new(VmId(1), 100, &memory());
        let b = TrackedVm {
            vm: VmId(2),
            pid: 200,
            ranges: vec![(Hva(0x5000_0000), Hva(0x6000_0000))],
        };
        let split = split_by_vm(
            vec![
                region(0x7f00_0000_0000, 0x7f00_0000_1000, 1),
                region(0x5000_1000, 0x5000_2000, 2),
                region(0x1000, 0x2000, 3), // nobody's
            ],
            &[a, b],
        );
        assert_eq!(split[&VmId(1)].len(), 1);
        assert_eq!(split[&VmId(2)][0].nr_accesses, 2);
        assert_eq!(split.values().map(Vec::len).sum::<usize>(), 2);
    }

    #[test]
    fn overlapping_vms_are_not_tracked_together() {
        let cfg = HostTrackingConfig {
            damon_root: std::env::temp_dir().join("vtism-no-damon-here"),
            busy_retry_ms: 100,
            ..Default::default()
        };
        let mut h = HostTracking::new(
            &cfg,
            std::env::temp_dir().join(format!("vtism-test-kdamond-{}", std::process::id())),
        );
        let a = TrackedVm::new(VmId(1), 100, &memory());
        let b = TrackedVm::new(VmId(2), 200, &memory());
        h.set_targets(vec![a, b], &cfg);
        assert!(h.vm_status(VmId(1)).unwrap().problem.is_none());
        assert!(h
            .vm_status(VmId(2))
            .unwrap()
            .problem
            .unwrap()
            .contains("overlap"));
        // no DAMON under that root: the thread says so, and nothing is fed
        let end = Instant::now() + Duration::from_secs(5);
        while h.status().state != "failed" && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(20));
        }
        let s = h.status();
        assert_eq!(s.state, "failed");
        assert!(s
            .reason
            .unwrap()
            .contains("DAMON sysfs interface not available"));
        assert!(h.take_accesses(VmId(1), &memory()).is_none());
        h.shutdown();
    }
}
