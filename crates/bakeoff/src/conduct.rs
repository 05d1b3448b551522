//! `vtism bakeoff conduct`, inside the emulated host (started by testbed/bakeoff-inner.sh): boots
//! the nested guest once, then runs the plan's workload under each manager in turn from the same
//! starting placement, sampling every second, and writes one [`RunRecord`] per manager.
//!
//! Each run: end the previous workload; put every guest frame back on the CXL nodes
//! (move_pages, frame i to CXL node i mod 2, as an interleave would); hold the DRAM the run must
//! not use (a hog on the other DRAM node, and on the VM's DRAM node all but the limit and the
//! kernel's high watermark); start the workload and wait for its ground truth; start the manager
//! and sample; stop the manager, release the hog.

use crate::damon_tiering::Recipe;
use crate::damon_watch;
use crate::hog::{self, Hog};
use crate::host_stats::{self, Counters};
use crate::managers::{
    self, Running, CXL_NODES, DRAM_NODE, DRAM_NODES, OTHER_DRAM_NODE, VM_CGROUP,
};
use crate::nested_guest::{loadavg, GuestConfig, NestedGuest};
use crate::plan::{GroundTruth, Manager, Plan, Shape};
use crate::record::{CpuRecord, HogRecord, RunRecord, RunSample};
use anyhow::{bail, Context};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use vtism_testbed::guest_console::GupsTruth;
use vtism_testbed::placement::GuestRam;

#[derive(clap::Args, Debug)]
pub struct ConductArgs {
    /// The plan (plan.json, written by `vtism bakeoff`).
    #[arg(long)]
    pub plan: PathBuf,
    /// Results directory (the virtfs share).
    #[arg(long)]
    pub out: PathBuf,
}

const WORK: &str = "/tmp/bakeoff";
const COUNTS: &str = "/dev/shm/vtism-access-counts";
/// The nested guest boots in about 100 s on an idle machine, several times that on a loaded one
/// (7 minutes seen at load 8).
const BOOT_LIMIT: Duration = Duration::from_secs(2400);
/// The workload populates its memory and prints its ground truth (redis loads its keys first):
/// a minute or two on an idle machine.
const READY_LIMIT: Duration = Duration::from_secs(1800);
/// Samples that fail in a row (a move_pages(2) query or a counter read refused) before the run
/// is given up; a single failed sample is a second without a sample, and a note.
const SAMPLE_FAILURES: u32 = 30;

fn say(s: &str) {
    println!("TB {s}");
}

fn mib(b: u64) -> f64 {
    b as f64 / (1u64 << 20) as f64
}

pub fn conduct(a: ConductArgs) -> anyhow::Result<()> {
    let plan: Plan = serde_json::from_str(
        &std::fs::read_to_string(&a.plan).with_context(|| a.plan.display().to_string())?,
    )
    .context("plan.json")?;
    plan.workload.validate()?;
    let dir = PathBuf::from(WORK);
    say(&format!("conductor: load {}", loadavg()));
    std::fs::create_dir_all(&dir)?;
    host_setup()?;
    // The conductor keeps off the VM's CPU.
    pin_self(1);
    let procs = Path::new("/sys/fs/cgroup")
        .join(VM_CGROUP.trim_start_matches('/'))
        .join("cgroup.procs");
    let plugin = match (plan.workload.truth, &plan.plugin) {
        (GroundTruth::TcgPlugin, Some(p)) => Some((p.as_path(), Path::new(COUNTS))),
        (GroundTruth::TcgPlugin, None) => bail!("the workload's ground truth needs the TCG plugin"),
        _ => None,
    };
    let ram_mib = plan.workload.guest_mib();
    let cfg = GuestConfig {
        ram_mib,
        kernel: &plan.guest_kernel,
        initrd: &plan.guest_initrd,
        plugin,
        dir: &dir,
        cpu: 0,
        cgroup_procs: &procs,
    };
    let (mut guest, mut ram) = boot_guest(&cfg, &a.out, 0)?;
    let mut boots = 1;
    let mut hogs = Vec::new();
    let managers = &plan.workload.managers;
    for (i, &m) in managers.iter().enumerate() {
        // A run that failed may have left the guest hung or dead: the next manager gets a fresh
        // one rather than losing its run too.
        if guest.hung || !guest.alive() {
            say(&format!(
                "the nested guest {}: restarting it for {}",
                if guest.hung {
                    "stopped answering"
                } else {
                    "died"
                },
                m.name()
            ));
            guest.kill();
            save_console(&guest, &a.out, boots);
            match boot_guest(&cfg, &a.out, boots) {
                Ok((g, r)) => {
                    (guest, ram) = (g, r);
                    boots += 1;
                }
                Err(e) => {
                    say(&format!("restarting the nested guest failed: {e:#}"));
                    for &m in &managers[i..] {
                        failed_record(
                            &plan,
                            m,
                            &ram,
                            format!("the nested guest could not be restarted: {e:#}"),
                        )
                        .write(&a.out)?;
                    }
                    return Err(e);
                }
            }
        }
        say(&format!("== {} under {}", plan.workload.name, m.name()));
        let t = Instant::now();
        let rec = run_one(&plan, m, &mut hogs, &mut guest, &ram, &dir, &a.out);
        let mut rec = match rec {
            Ok(r) => r,
            Err(e) => {
                say(&format!("{} failed: {e:#}", m.name()));
                let _ = managers::kernel_tiering_off();
                failed_record(&plan, m, &ram, format!("{e:#}"))
            }
        };
        if boots > 1 {
            rec.notes.push(format!(
                "ran in the nested guest's boot {boots} (an earlier run left the first one hung or dead)"
            ));
        }
        say(&format!(
            "{} done in {:.0} s (load {})",
            m.name(),
            t.elapsed().as_secs_f64(),
            loadavg()
        ));
        rec.write(&a.out)?;
    }
    if !guest.hung {
        let _ = guest.command("reset", Duration::from_secs(60));
    }
    guest.kill();
    save_console(&guest, &a.out, boots);
    Ok(())
}

/// Boots the nested guest and reads its RAM map.
fn boot_guest(cfg: &GuestConfig, out: &Path, boot: u32) -> anyhow::Result<(NestedGuest, GuestRam)> {
    let mut guest = NestedGuest::start(cfg)?;
    say(&format!(
        "nested guest started (pid {}, {} MiB, pinned to CPU 0 / node 0{}); it boots under TCG inside TCG",
        guest.pid,
        cfg.ram_mib,
        if cfg.plugin.is_some() { ", with the page-count TCG plugin" } else { "" }
    ));
    let mut last = 0;
    let booted = guest.wait_ready(BOOT_LIMIT, &mut |s| {
        if s >= last + 30 {
            last = s;
            say(&format!(
                "waiting for the nested guest: {s} s (load {})",
                loadavg()
            ));
        }
    });
    let booted = match booted {
        Ok(b) => b,
        Err(e) => {
            guest.kill();
            save_console(&guest, out, boot + 1);
            return Err(e);
        }
    };
    say(&format!("nested guest up: {booted}"));
    let ram = GuestRam::from_qmp(&guest.qmp)?;
    Ok((guest, ram))
}

/// The nested guest's console into the results: guest-console.log, or guest-console-N.log for
/// the N-th boot after the first.
fn save_console(guest: &NestedGuest, out: &Path, boot: u32) {
    let name = if boot <= 1 {
        "guest-console.log".to_string()
    } else {
        format!("guest-console-{boot}.log")
    };
    let _ = std::fs::copy(&guest.console_path, out.join(name));
}

fn failed_record(plan: &Plan, m: Manager, ram: &GuestRam, error: String) -> RunRecord {
    RunRecord {
        workload: plan.workload.name.clone(),
        manager: m,
        error: Some(error),
        notes: Vec::new(),
        limit_bytes: plan.workload.dram_limit_mib << 20,
        guest_frames: ram.frames() as u64,
        workload_frames: 0,
        workload_ready_s: 0.0,
        run_s: 0.0,
        hog: HogRecord::default(),
        vmstat: Counters::new(),
        damos: None,
        vtismd: None,
        cpu: CpuRecord::default(),
        samples: Vec::new(),
        damon: Vec::new(),
        damon_trace: Vec::new(),
    }
}

/// The emulated host as every run starts: 4 KiB pages, no tiering, a memory cgroup for the VM.
fn host_setup() -> anyhow::Result<()> {
    host_stats::write_sysctl("/sys/kernel/mm/transparent_hugepage/enabled", "never")?;
    managers::kernel_tiering_off()?;
    let cg = Path::new("/sys/fs/cgroup");
    if !cg.join("cgroup.controllers").exists() {
        let st = std::process::Command::new("mount")
            .args(["-t", "cgroup2", "none", "/sys/fs/cgroup"])
            .status()?;
        if !st.success() {
            bail!("cannot mount cgroup2 on /sys/fs/cgroup");
        }
    }
    host_stats::write_sysctl("/sys/fs/cgroup/cgroup.subtree_control", "+memory")?;
    std::fs::create_dir_all(cg.join(VM_CGROUP.trim_start_matches('/')))?;
    Ok(())
}

fn pin_self(cpu: usize) {
    // SAFETY: sched_setaffinity on the calling thread with a set built on the stack.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// Every guest frame back on a CXL node (frame i on CXL node i mod 2), by way of the other CXL
/// node: NUMA balancing leaves PROT_NONE hint PTEs behind when it is switched off, and the next
/// access to such a page still migrates it (do_numa_page does not look at the sysctl), which would
/// promote pages during the next manager's run. A migration installs a fresh PTE, so moving every
/// frame once clears them.
fn restore_placement(ram: &GuestRam) -> anyhow::Result<usize> {
    let target = |i: usize| CXL_NODES[i % 2];
    let other = |i: usize| CXL_NODES[(i + 1) % 2];
    let nodes = ram.nodes()?;
    ram.move_to(&nodes, other)?;
    let mut left = 0;
    for _ in 0..5 {
        let nodes = ram.nodes()?;
        let (asked, failed) = ram.move_to(&nodes, target)?;
        left = failed;
        if asked == 0 || failed == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let on_dram = ram
        .nodes()?
        .iter()
        .filter(|n| DRAM_NODES.contains(n))
        .count();
    if on_dram > 0 {
        bail!("{on_dram} guest frames stay on DRAM after restoring the placement ({left} moves failed)");
    }
    Ok(ram.frames())
}

/// Holds all DRAM but `limit` plus the kernel's high watermark on the VM's node, and the other
/// DRAM node down to its watermark. Free memory is read after folding the per-CPU counters
/// (vm.stat_refresh), and the hold corrected until it is within 1 MiB of the target. The hogs
/// carry over from run to run (mlocking 1.7 GiB under TCG takes tens of seconds); each run
/// corrects them to the free memory it finds.
fn hold_dram(hogs: &mut Vec<Hog>, limit: u64) -> anyhow::Result<HogRecord> {
    if !hogs.iter().any(|h| h.node == OTHER_DRAM_NODE) {
        let other = fresh_node_memory(OTHER_DRAM_NODE)?;
        hogs.push(Hog::hold(
            OTHER_DRAM_NODE,
            other.free.saturating_sub(other.high_watermark),
        )?);
    }
    // Approach the target from above in shrinking steps: a large hold costs the kernel page
    // tables and more, and free memory reads lag (pages freed to the per-CPU lists are not
    // counted until drained), so take all but 8 MiB first, then half the rest at a time; when
    // too much is held (the kernel took memory meanwhile), give back the smallest piece.
    let mut m = fresh_node_memory(DRAM_NODE)?;
    for _ in 0..16 {
        let want = limit + m.high_watermark;
        if m.free + (1 << 20) < want {
            let smallest = hogs
                .iter()
                .enumerate()
                .filter(|(_, h)| h.node == DRAM_NODE)
                .min_by_key(|(_, h)| h.bytes())
                .map(|(i, _)| i);
            let Some(i) = smallest else { break };
            drop(hogs.remove(i));
        } else if m.free > want + (1 << 20) {
            let extra = m.free - want;
            let piece = if extra > 16 << 20 {
                extra - (8 << 20)
            } else {
                (extra / 2).max(512 << 10)
            };
            hogs.push(Hog::hold(DRAM_NODE, piece)?);
        } else {
            break;
        }
        m = fresh_node_memory(DRAM_NODE)?;
    }
    let held = |n: u32| hogs.iter().filter(|h| h.node == n).map(|h| h.bytes()).sum();
    Ok(HogRecord {
        dram_node_held_bytes: held(DRAM_NODE),
        other_dram_node_held_bytes: held(OTHER_DRAM_NODE),
        dram_node_free_bytes: m.free,
        dram_node_high_watermark_bytes: m.high_watermark,
    })
}

/// A node's memory with the per-CPU counters folded in first (they lag by up to a second).
fn fresh_node_memory(node: u32) -> anyhow::Result<hog::NodeMemory> {
    let _ = std::fs::write("/proc/sys/vm/stat_refresh", "1");
    Ok(hog::node_memory(node)?)
}

/// The workload's ground truth, as far as the conductor keeps it.
struct Truth {
    gups: GupsTruth,
    hot: Vec<usize>,
    other: Vec<usize>,
    next: Vec<usize>,
    moves: u32,
    /// The workload's frames (hot and cold), for the share of its uniform updates.
    frames: usize,
    rate: Option<u64>,
    plugin_last: Option<Vec<u64>>,
}

fn wait_workload(plan: &Plan, guest: &mut NestedGuest, ram: &GuestRam) -> anyhow::Result<Truth> {
    let start = Instant::now();
    let mut gups = GupsTruth::default();
    let redis = matches!(plan.workload.shape, Shape::Redis { .. });
    let mut next_report = 120;
    loop {
        for l in guest.lines()? {
            if let Some(e) = l.strip_prefix("TBERR ") {
                bail!("the guest: {e}");
            }
            if l.starts_with("kvload:") || l.starts_with("gups:") {
                bail!("the workload failed: {l}");
            }
            gups.feed(&l);
        }
        if gups.ready {
            break;
        }
        if start.elapsed() > READY_LIMIT {
            bail!(
                "the workload was not ready within {} s (load {})",
                READY_LIMIT.as_secs(),
                loadavg()
            );
        }
        if !guest.alive() {
            bail!("the nested QEMU exited while the workload started");
        }
        if start.elapsed().as_secs() >= next_report {
            next_report += 60;
            say(&format!(
                "waiting for the workload's ground truth: {:.0} s (load {})",
                start.elapsed().as_secs_f64(),
                loadavg()
            ));
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let (hot, other, next) = if redis {
        (Vec::new(), Vec::new(), Vec::new())
    } else {
        (
            ram.indices(&gups.hot)?,
            ram.indices(&gups.cold)?,
            ram.indices(&gups.next)?,
        )
    };
    Ok(Truth {
        frames: hot.len() + other.len(),
        gups,
        hot,
        other,
        next,
        moves: 0,
        rate: None,
        plugin_last: None,
    })
}

fn read_counts(frames: usize) -> Option<Vec<u64>> {
    let bytes = std::fs::read(COUNTS).ok()?;
    if bytes.len() < frames * 8 {
        return None;
    }
    Some(
        bytes
            .chunks_exact(8)
            .take(frames)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect(),
    )
}

impl Truth {
    fn feed(&mut self, lines: Vec<String>) {
        for l in lines {
            if l.starts_with("TBTPUT") {
                let n: Vec<u64> = l
                    .split_whitespace()
                    .skip(1)
                    .filter_map(|x| x.parse().ok())
                    .collect();
                self.rate = n.get(1).copied();
            }
            self.gups.feed(&l);
        }
        if self.gups.moved_at_ms.is_some() && self.moves == 0 && !self.next.is_empty() {
            let next: std::collections::BTreeSet<usize> = self.next.iter().copied().collect();
            let mut all: Vec<usize> = self.hot.iter().chain(&self.other).copied().collect();
            all.sort_unstable();
            self.other = all.into_iter().filter(|i| !next.contains(i)).collect();
            self.hot = std::mem::take(&mut self.next);
            self.moves = 1;
        }
    }

    /// The share of the GUPS updates in the last second served from DRAM, from its map and its
    /// rates: hot frames take the hot updates evenly, every frame of the region the uniform ones.
    fn map_share(
        &self,
        on_dram: &dyn Fn(usize) -> bool,
        uniform_share: f64,
    ) -> Option<(f64, f64, u64)> {
        if self.hot.is_empty() {
            return None;
        }
        let hot_dram = self.hot.iter().filter(|&&i| on_dram(i)).count();
        let other_dram = self.other.iter().filter(|&&i| on_dram(i)).count();
        let (u, v) = match self.gups.rate {
            Some(r) if r.updates_per_s > 0 => (
                r.updates_per_s as f64,
                r.uniform_per_s as f64 + r.cold_touches_per_s as f64,
            ),
            _ => (1.0, uniform_share),
        };
        let hot_share = hot_dram as f64 / self.hot.len() as f64;
        let all_share = (hot_dram + other_dram) as f64 / self.frames.max(1) as f64;
        let share = ((u - v).max(0.0) * hot_share + v * all_share) / u;
        Some((share, hot_share, other_dram as u64))
    }
}

fn run_one(
    plan: &Plan,
    m: Manager,
    hogs: &mut Vec<Hog>,
    guest: &mut NestedGuest,
    ram: &GuestRam,
    dir: &Path,
    out: &Path,
) -> anyhow::Result<RunRecord> {
    let w = &plan.workload;
    let limit = w.dram_limit_mib << 20;
    // From a clean guest whatever the run before left: no workload, no tracker.
    guest.command("reset", Duration::from_secs(120))?;
    let _ = guest.lines()?;
    let t = Instant::now();
    restore_placement(ram)?;
    say(&format!(
        "guest RAM back on the CXL nodes in {:.1} s",
        t.elapsed().as_secs_f64()
    ));
    let hog_rec = hold_dram(hogs, limit)?;
    say(&format!(
        "DRAM held: {:.0} MiB on node {DRAM_NODE}, {:.0} MiB on node {OTHER_DRAM_NODE}; node {DRAM_NODE} has {:.1} MiB free (limit {:.0} + high watermark {:.1})",
        mib(hog_rec.dram_node_held_bytes),
        mib(hog_rec.other_dram_node_held_bytes),
        mib(hog_rec.dram_node_free_bytes),
        mib(limit),
        mib(hog_rec.dram_node_high_watermark_bytes)
    ));
    let t = Instant::now();
    guest.command(&w.guest_command(), Duration::from_secs(120))?;
    let mut truth = wait_workload(plan, guest, ram)?;
    let workload_ready_s = t.elapsed().as_secs_f64();
    say(&format!(
        "workload ready after {workload_ready_s:.0} s ({} hot + {} other frames)",
        truth.hot.len(),
        truth.other.len()
    ));
    let uniform_share = match w.shape {
        Shape::Gups { uniform_share, .. } => uniform_share,
        Shape::Redis { .. } => 0.0,
    };
    let plugin = w.truth == GroundTruth::TcgPlugin;
    let frames = ram.frames();
    if plugin {
        truth.plugin_last = read_counts(ram.gfn(frames - 1).map_or(0, |g| g.0 as usize + 1));
    }
    let vm0 = host_stats::vmstat();
    let qemu0 = host_stats::cpu_time(guest.pid).unwrap_or_default();
    let kswapd0 = host_stats::kswapd_cpu();
    let running = managers::start(m, plan, guest, dir, out)?;
    let t0 = Instant::now();
    // DAMON's regions at a few points of its run (docs/bakeoff.md, "DAMON").
    let hot_hvas = Arc::new(Mutex::new(damon_watch::hvas(ram, &truth.hot)));
    let watcher = running.damon().map(|d| {
        let r = w.run_s as f64;
        damon_watch::Watcher::start(
            d.observer(),
            Recipe::default(),
            ram.pid,
            hot_hvas.clone(),
            vec![10.0, 30.0, r / 2.0, r - 15.0],
            "the damon run".into(),
        )
    });
    let tracer = if m == Manager::Damon {
        managers::damon_nodes()
            .and_then(|n| {
                damon_watch::Tracer::start(
                    n.slow_ranges,
                    ram.pid,
                    hot_hvas.clone(),
                    "the damon run",
                    Recipe::default().max_nr_accesses(),
                    true,
                )
            })
            .map_err(|e| say(&format!("DAMON's tracepoints not followed: {e:#}")))
            .ok()
    } else {
        None
    };
    let mut moves_seen = 0;
    let mut samples = Vec::new();
    let mut next = Duration::from_millis(plan.sample_ms);
    let mut result = Ok(());
    let (mut failures_in_row, mut failed_samples) = (0, 0);
    let mut last_sample_error = None;
    while t0.elapsed() < Duration::from_secs(w.run_s) {
        let wait = next.saturating_sub(t0.elapsed());
        std::thread::sleep(wait);
        next += Duration::from_millis(plan.sample_ms);
        match sample(
            plan,
            m,
            &running,
            guest,
            ram,
            &mut truth,
            t0,
            vm0.clone(),
            uniform_share,
            plugin,
        ) {
            Ok(s) => {
                if samples.len() % 15 == 0 {
                    say(&format!(
                        "[{:4.0}s] {:<12} DRAM share {:>5}  guest on DRAM {:5.1}/{:.0} MiB  migrated {:6.1} MiB  ops/s {}",
                        s.t_s,
                        m.name(),
                        s.dram_access_share.map_or("-".into(), |x| format!("{:.3}", x)),
                        mib(s.guest_dram_bytes),
                        mib(limit),
                        mib(s.migrated_bytes),
                        s.ops_per_s.map_or("-".into(), |x| x.to_string())
                    ));
                }
                samples.push(s);
                failures_in_row = 0;
                if truth.moves != moves_seen {
                    moves_seen = truth.moves;
                    if let Ok(mut h) = hot_hvas.lock() {
                        *h = damon_watch::hvas(ram, &truth.hot);
                    }
                }
            }
            // The guest's own error or its death ends the run; anything else costs a sample.
            Err(e)
                if failures_in_row + 1 < SAMPLE_FAILURES
                    && guest.alive()
                    && !is_guest_error(&e) =>
            {
                failures_in_row += 1;
                failed_samples += 1;
                if failed_samples <= 3 {
                    say(&format!("a sample failed (skipped): {e:#}"));
                }
                last_sample_error = Some(format!("{e:#}"));
            }
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    let run_s = t0.elapsed().as_secs_f64();
    let guest_tracker_s = if m.is_vtism() {
        // Reading /proc in a nested guest on a loaded machine can take more than a minute.
        guest
            .command("cpu", Duration::from_secs(120))
            .map_err(|e| say(&format!("the guest's tracker CPU time: {e:#}")))
            .ok()
            .map(|lines| {
                lines
                    .iter()
                    .filter_map(|l| l.split_whitespace().nth(2)?.parse::<f64>().ok())
                    .sum::<f64>()
                    / 100.0
            })
    } else {
        None
    };
    let cpu = CpuRecord {
        qemu: host_stats::cpu_time(guest.pid)
            .unwrap_or_default()
            .minus(&qemu0),
        kswapd: host_stats::kswapd_cpu().minus(&kswapd0),
        kdamond_s: if m == Manager::Damon {
            running.host_cpu_s()
        } else {
            None
        },
        vtismd_s: if m.is_vtism() {
            running.host_cpu_s()
        } else {
            None
        },
        guest_tracker_s,
    };
    let damos = running.damos();
    let vtismd = running.vtismd_status();
    let vmstat = host_stats::delta(&vm0, &host_stats::vmstat());
    let mut damon = watcher.map(|w| w.finish()).unwrap_or_default();
    let mut damon_trace = tracer.map(|t| t.finish()).unwrap_or_default();
    for s in &damon_trace {
        say(&format!("DAMON trace: {}", s.summary()));
    }
    // What DAMON's monitoring sees on this stage where nothing acts, after the baseline's
    // samples (and its CPU times) are taken.
    if m == Manager::None && w.managers.contains(&Manager::Damon) && !truth.hot.is_empty() {
        say("DAMON probe: the recipe's monitoring of the CXL nodes, a stat scheme only: 30 s as the stage is, 30 s with a process on CPU 0 waking every millisecond, 30 s with 20x longer intervals");
        match managers::damon_nodes()
            .and_then(|n| damon_watch::probe(&plan.bin, &n, ram, &truth.hot, 0, 30.0))
        {
            Ok(p) => {
                damon = p.snapshots;
                damon_trace = p.trace;
            }
            Err(e) => say(&format!("DAMON probe failed: {e:#}")),
        }
    }
    // The samples stand even when ending the manager or the workload fails afterwards (a
    // loaded nested guest can take minutes to end its tracker): the failure is a note.
    let mut notes = Vec::new();
    if failed_samples > 0 {
        notes.push(format!(
            "{failed_samples} sample(s) failed and were skipped; the last: {}",
            last_sample_error.unwrap_or_default()
        ));
    }
    if let Err(e) = running.stop(guest) {
        notes.push(format!("stopping the manager: {e:#}"));
    }
    if let Err(e) = guest.command("stop", Duration::from_secs(120)) {
        notes.push(format!("ending the workload: {e:#}"));
    }
    result?;
    Ok(RunRecord {
        workload: w.name.clone(),
        manager: m,
        error: None,
        notes,
        limit_bytes: limit,
        guest_frames: frames as u64,
        workload_frames: truth.frames as u64,
        workload_ready_s,
        run_s,
        hog: hog_rec,
        vmstat,
        damos,
        vtismd,
        cpu,
        samples,
        damon,
        damon_trace,
    })
}

/// The guest reported an error of its own (a `TBERR` line): the run cannot go on.
fn is_guest_error(e: &anyhow::Error) -> bool {
    e.to_string().starts_with("the guest: ")
}

#[allow(clippy::too_many_arguments)]
fn sample(
    plan: &Plan,
    m: Manager,
    running: &Running,
    guest: &mut NestedGuest,
    ram: &GuestRam,
    truth: &mut Truth,
    t0: Instant,
    vm0: Counters,
    uniform_share: f64,
    plugin: bool,
) -> anyhow::Result<RunSample> {
    let lines = guest.lines()?;
    if let Some(e) = lines.iter().find_map(|l| l.strip_prefix("TBERR ")) {
        bail!("the guest: {e}");
    }
    truth.feed(lines);
    let nodes = ram.nodes()?;
    let on_dram = |i: usize| DRAM_NODES.contains(&nodes[i]);
    let guest_dram_bytes = (0..nodes.len()).filter(|&i| on_dram(i)).count() as u64 * 4096;
    let map = truth.map_share(&on_dram, uniform_share);
    let (mut plugin_share, mut acc, mut acc_dram) = (None, 0, 0);
    if plugin {
        let frames = ram.frames();
        let top = ram.gfn(frames - 1).map_or(0, |g| g.0 as usize + 1);
        if let (Some(now), Some(prev)) = (read_counts(top), truth.plugin_last.as_ref()) {
            for i in 0..frames {
                let g = ram.gfn(i).map_or(0, |g| g.0 as usize);
                let d = now[g].saturating_sub(prev[g]);
                acc += d;
                if on_dram(i) {
                    acc_dram += d;
                }
            }
            if acc > 0 {
                plugin_share = Some(acc_dram as f64 / acc as f64);
            }
            truth.plugin_last = Some(now);
        }
    }
    let vm_delta = host_stats::delta(&vm0, &host_stats::vmstat());
    let (promoted_bytes, demoted_bytes) = running.moved(m, &vm_delta)?;
    let dram_share_from_bytes = (plan.workload.truth == GroundTruth::DramBytes && truth.frames > 0)
        .then(|| {
            let work_dram = truth
                .hot
                .iter()
                .chain(&truth.other)
                .filter(|&&i| on_dram(i))
                .count();
            work_dram as f64 / truth.frames as f64
        });
    Ok(RunSample {
        t_s: t0.elapsed().as_secs_f64(),
        dram_access_share: match plan.workload.truth {
            GroundTruth::WorkloadMap => map.map(|x| x.0),
            GroundTruth::TcgPlugin => plugin_share,
            GroundTruth::DramBytes => dram_share_from_bytes,
        },
        map_share: map.map(|x| x.0),
        plugin_share,
        plugin_accesses: acc,
        plugin_dram_accesses: acc_dram,
        hot_dram_share: map.map(|x| x.1),
        other_dram_frames: map.map(|x| x.2),
        hot_set_moves: truth.moves,
        guest_dram_bytes,
        limit_bytes: plan.workload.dram_limit_mib << 20,
        dram_node_free_bytes: hog::node_memory(DRAM_NODE).map_or(0, |n| n.free),
        migrated_bytes: vm_delta.get("pgmigrate_success").copied().unwrap_or(0) * 4096,
        promoted_bytes,
        demoted_bytes,
        ops_per_s: truth.rate,
    })
}
