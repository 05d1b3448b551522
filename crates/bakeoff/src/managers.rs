//! Starting and stopping each manager inside the emulated host, and what it says it did.

use crate::damon_tiering::{self, DamonTiering, Nodes, Recipe, SchemeStats};
use crate::host_stats::{self, Counters};
use crate::nested_guest::{self, NestedGuest};
use crate::plan::{Manager, Plan};
use anyhow::{bail, Context};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const NUMA_BALANCING: &str = "/proc/sys/kernel/numa_balancing";
const DEMOTION: &str = "/sys/kernel/mm/numa/demotion_enabled";

/// The emulated host's nodes as the bake-off uses them: the VM runs on socket 0.
pub const DRAM_NODE: u32 = 0;
pub const OTHER_DRAM_NODE: u32 = 1;
pub const CXL_NODES: [i32; 2] = [2, 3];
pub const DRAM_NODES: [i32; 2] = [0, 1];
/// How long vtismd may take to find the guest and read its memory map.
const VTISMD_UP: Duration = Duration::from_secs(300);
/// The cgroup the VM runs in (DAMON's memcg filter names it).
pub const VM_CGROUP: &str = "/vtism-vm";

/// Nothing of the kernel's own tiering runs between runs.
pub fn kernel_tiering_off() -> anyhow::Result<()> {
    host_stats::write_sysctl(NUMA_BALANCING, "0")?;
    host_stats::write_sysctl(DEMOTION, "false")
}

/// Where DAMON tiering acts on this stage: it promotes from the CXL nodes to the VM's DRAM
/// node and demotes from there to that socket's CXL node, on the VM's cgroup's pages.
pub fn damon_nodes() -> anyhow::Result<Nodes> {
    Ok(Nodes {
        slow_ranges: CXL_NODES
            .iter()
            .map(|&n| damon_tiering::node_ranges(n as u32))
            .collect::<anyhow::Result<Vec<_>>>()?
            .concat(),
        dram_node: DRAM_NODE,
        dram_ranges: damon_tiering::node_ranges(DRAM_NODE)?,
        demote_node: CXL_NODES[0] as u32,
        memcg_path: VM_CGROUP.into(),
    })
}

/// DAMON tiering while it runs, with its DAMOS statistics read from a thread of their own: the
/// command that refreshes them returns only when the kdamond next serves its callbacks, which
/// it does not while it migrates a region (tens of seconds under TCG); read in the sampling
/// loop, they held the run's samples up for a minute.
pub struct DamonRun {
    pub d: DamonTiering,
    latest: Arc<Mutex<Option<(SchemeStats, SchemeStats)>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl DamonRun {
    fn start(d: DamonTiering) -> DamonRun {
        let latest = Arc::new(Mutex::new(None));
        let stop = Arc::new(AtomicBool::new(false));
        let (obs, l, st) = (d.observer(), latest.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !st.load(Ordering::Relaxed) {
                if let Ok(x) = obs.stats() {
                    if let Ok(mut g) = l.lock() {
                        *g = Some(x);
                    }
                }
                std::thread::sleep(Duration::from_secs(1));
            }
        });
        DamonRun {
            d,
            latest,
            stop,
            thread: Some(thread),
        }
    }

    /// The statistics last read (zero before the first read).
    fn latest(&self) -> (SchemeStats, SchemeStats) {
        self.latest.lock().ok().and_then(|g| *g).unwrap_or_default()
    }

    fn end(mut self) -> anyhow::Result<()> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.d.stop()
    }
}

/// A manager while it runs.
pub enum Running {
    Nothing,
    Kernel,
    Damon(DamonRun),
    Vtism {
        daemon: Child,
        socket: PathBuf,
        in_guest: &'static str,
    },
}

pub fn start(
    m: Manager,
    plan: &Plan,
    guest: &mut NestedGuest,
    dir: &Path,
    out: &Path,
) -> anyhow::Result<Running> {
    Ok(match m {
        Manager::None => Running::Nothing,
        Manager::Autonuma => {
            host_stats::write_sysctl(NUMA_BALANCING, "1")?;
            Running::Kernel
        }
        Manager::Tiering => {
            host_stats::write_sysctl(DEMOTION, "true")?;
            host_stats::write_sysctl(NUMA_BALANCING, "2")?;
            Running::Kernel
        }
        Manager::Damon => Running::Damon(DamonRun::start(DamonTiering::start(
            &Recipe::default(),
            &damon_nodes()?,
        )?)),
        Manager::VtismModule | Manager::VtismDamon => {
            let (mut daemon, socket) = start_vtismd(plan, dir, out)?;
            let (start, in_guest) = if m == Manager::VtismModule {
                (
                    format!("module {}", plan.vtism.module_params),
                    "module-stop",
                )
            } else {
                (format!("agent {}", plan.vtism.agent_args), "agent-stop")
            };
            if let Err(e) = guest.command(&start, Duration::from_secs(120)) {
                // vtismd must not go on managing the guest in the next manager's run.
                end_daemon(&mut daemon);
                return Err(e);
            }
            Running::Vtism {
                daemon,
                socket,
                in_guest,
            }
        }
    })
}

/// Ends vtismd (SIGTERM to the daemon this code started, by its pid) and reaps it.
fn end_daemon(daemon: &mut Child) {
    // SAFETY: kill(2) on the child this code started, by its pid; it is not reaped yet, so the
    // pid is still its own.
    unsafe {
        libc::kill(daemon.id() as i32, libc::SIGTERM);
    }
    let _ = daemon.wait();
}

fn start_vtismd(plan: &Plan, dir: &Path, out: &Path) -> anyhow::Result<(Child, PathBuf)> {
    let socket = dir.join("vtismd.sock");
    let _ = std::fs::remove_file(&socket);
    let cfg = dir.join("vtismd.toml");
    std::fs::write(
        &cfg,
        format!(
            "[daemon]\ninterval_ms = {}\ncontrol_socket = \"{}\"\nmetrics_listen = \"\"\n\
             [discovery]\nscan_dirs = [\"{}\"]\nscan_interval_ms = 500\n\
             [[vm]]\nname = \"guest\"\nfast_quota_mib = {}\n",
            plan.vtism.daemon_interval_ms,
            socket.display(),
            nested_guest::qmp_dir(dir).display(),
            plan.workload.dram_limit_mib
        ),
    )?;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(out.join("vtismd.log"))?;
    let daemon = Command::new(&plan.bin)
        .args(["host", "-c"])
        .arg(&cfg)
        .args(["--log", "info"])
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .context("starting vtismd")?;
    // Up when it knows the VM (it found the QMP socket and read the guest's memory map).
    // A busy nested QEMU answers QMP slowly on a loaded machine.
    let mut daemon = daemon;
    let start = Instant::now();
    while start.elapsed() < VTISMD_UP {
        if vtism_testbed::vtismd::status(&socket, "guest").is_some() {
            return Ok((daemon, socket));
        }
        if let Ok(Some(st)) = daemon.try_wait() {
            bail!("vtismd exited with {st} before it picked up the guest (see vtismd.log)");
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    end_daemon(&mut daemon);
    bail!(
        "vtismd did not pick up the guest within {} s (see vtismd.log)",
        VTISMD_UP.as_secs()
    )
}

impl Running {
    /// (promoted, demoted) bytes by the manager's own count; vmstat counters since the start
    /// for the kernel's tiering.
    pub fn moved(&self, m: Manager, vmstat_delta: &Counters) -> anyhow::Result<(u64, u64)> {
        let page = |k: &str| vmstat_delta.get(k).copied().unwrap_or(0) * 4096;
        Ok(match self {
            Running::Nothing => (0, 0),
            Running::Kernel => (
                if m == Manager::Autonuma {
                    page("numa_pages_migrated")
                } else {
                    page("pgpromote_success")
                },
                page("pgdemote_kswapd") + page("pgdemote_direct"),
            ),
            Running::Damon(d) => {
                let (p, dm) = d.latest();
                (p.sz_applied, dm.sz_applied)
            }
            Running::Vtism { socket, .. } => {
                let st = vtism_testbed::vtismd::status(socket, "guest");
                let f = |k: &str| st.as_ref().and_then(|v| v[k].as_u64()).unwrap_or(0);
                (f("promoted_bytes"), f("demoted_bytes"))
            }
        })
    }

    /// The DAMON tiering's kdamonds, for watching their regions.
    pub fn damon(&self) -> Option<&DamonTiering> {
        match self {
            Running::Damon(d) => Some(&d.d),
            _ => None,
        }
    }

    /// The DAMOS statistics at the end of the run (read afresh; the last read if that fails).
    pub fn damos(&self) -> Option<(SchemeStats, SchemeStats)> {
        match self {
            Running::Damon(d) => Some(d.d.stats().unwrap_or_else(|_| d.latest())),
            _ => None,
        }
    }

    pub fn vtismd_status(&self) -> Option<serde_json::Value> {
        match self {
            Running::Vtism { socket, .. } => vtism_testbed::vtismd::status(socket, "guest"),
            _ => None,
        }
    }

    /// CPU seconds of the host-side manager process or threads so far.
    pub fn host_cpu_s(&self) -> Option<f64> {
        match self {
            Running::Damon(d) => Some(
                d.d.pids()
                    .into_iter()
                    .filter_map(host_stats::cpu_time)
                    .map(|c| c.total())
                    .sum(),
            ),
            Running::Vtism { daemon, .. } => {
                host_stats::cpu_time(daemon.id() as i32).map(|c| c.total())
            }
            _ => None,
        }
    }

    /// Stops the manager: the kernel's tiering off, kdamonds removed, the guest's tracker and
    /// vtismd ended.
    pub fn stop(self, guest: &mut NestedGuest) -> anyhow::Result<()> {
        match self {
            Running::Nothing => Ok(()),
            Running::Kernel => kernel_tiering_off(),
            Running::Damon(d) => d.end(),
            Running::Vtism {
                mut daemon,
                in_guest,
                ..
            } => {
                // The agent ends its round and removes its kdamond first: slow under nested TCG.
                let r = guest.command(in_guest, Duration::from_secs(300));
                end_daemon(&mut daemon);
                r.map(|_| ())
            }
        }
    }
}
