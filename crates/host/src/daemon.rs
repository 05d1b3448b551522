//! The daemon's main loop: discover VMs, read their channels, reconcile placement, plan, hand
//! plans to the mover, publish metrics and status.

use crate::config::{Config, QuotaLimits};
use crate::mover::{Dir, Limits, Mover, MoverSettings, PageOutcome};
use crate::mtree::GuestMemory;
use crate::qmp::{Qmp, QmpError};
use crate::serve::{self, CtlRequest, Exposition, Histogram, Shared, Snapshot};
use crate::sys::{self, FileMapping};
use crate::topology::HostTopology;
use crate::vm::{self, VmInfo};
use anyhow::Context;
use serde_json::json;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};
use vtism_engine::{
    FastPool, Nanos, NodeId, Observation, PlanContext, Policy, QuotaChange, QuotaReason, VmId,
    VmSpec, VtismPolicy,
};
use vtism_proto::layout::off;
use vtism_proto::{
    write_feedback, ChannelReader, Feedback, Gfn, RejectReason, SharedRegion, FRAME_SIZE,
    HOST_VERSION,
};

/// Label of the daemon's own reject reason: a round larger than `channel.max_entries`.
pub const OVER_BUDGET: &str = "over_budget";

/// What an attach thread found on a socket.
type AttachResult = (PathBuf, anyhow::Result<(Qmp, VmInfo)>);

struct Channel {
    path: PathBuf,
    _map: FileMapping,
    region: vtism_proto::MmapRegion,
}

struct ManagedVm {
    id: VmId,
    name: String,
    socket: PathBuf,
    qmp: Qmp,
    pid: i32,
    memory: Arc<GuestMemory>,
    channel: Option<Channel>,
    channel_problem: Option<String>,
    reader: ChannelReader,
    over_budget: u64,
    quota: u64,
    /// Limits from the configuration (the pool gets them through `Config::engine_limits`).
    limits: QuotaLimits,
    /// An accepted hint round since the VM was (re-)registered with the engine: only then is
    /// its hot-set estimate demand (a VM without hints keeps the pool's last estimate).
    hinted: bool,
    /// The last quota change and the count of changes by reason.
    last_change: Option<QuotaChange>,
    quota_changes: BTreeMap<&'static str, u64>,
    home: Option<u8>,
    /// A different home seen at the last refresh (moved only when seen twice in a row).
    home_candidate: Option<u8>,
    attached: Instant,
    last_round: u64,
    last_round_at: Option<Instant>,
    last_entries: u64,
    /// The channel minor version of the last accepted round (what its counts mean).
    channel_minor: Option<u16>,
    /// What the guest's tracker reported with the last accepted round (v1.1 guests).
    tracker_report: Option<vtism_proto::TrackerReport>,
    last_refresh: Instant,
    /// Dense index where the next reconcile query starts; `full_sweeps` completed passes.
    cursor: u64,
    full_sweeps: u64,
    promoted_bytes: u64,
    demoted_bytes: u64,
    outcomes: BTreeMap<PageOutcome, u64>,
    corrections: u64,
    reconciled_changes: u64,
    /// Promotions dropped because the demotions they waited for fell short.
    trimmed_frames: u64,
}

/// Counters kept across reloads.
#[derive(Default)]
struct Totals {
    rounds: u64,
    plans: u64,
    last_round_seconds: f64,
    round_cpu_seconds: f64,
    planned_bytes: u64,
    vms_dropped: u64,
    discover_errors: u64,
    latency: Option<Histogram>,
    job_seconds: Option<Histogram>,
}

pub struct Daemon {
    cfg: Config,
    config_path: Option<PathBuf>,
    topo: HostTopology,
    engine: VtismPolicy,
    /// Fast-memory quotas across VMs (island: fixed shares; pool: by hot set).
    pool: FastPool,
    vms: BTreeMap<VmId, ManagedVm>,
    next_id: u32,
    mover: Mover,
    backoff: HashMap<PathBuf, Instant>,
    last_scan: Option<Instant>,
    epoch: Instant,
    /// Wall-clock time of `epoch`, for the timestamps of quota changes.
    epoch_unix: f64,
    totals: Totals,
    shared: Shared,
    ctl_rx: mpsc::Receiver<CtlRequest>,
    ctl_tx: mpsc::Sender<CtlRequest>,
    attach_tx: mpsc::Sender<AttachResult>,
    attach_rx: mpsc::Receiver<AttachResult>,
    /// Sockets with an attach in flight.
    attaching: HashSet<PathBuf>,
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
    pub metrics_addr: Option<std::net::SocketAddr>,
}

fn mover_settings(cfg: &Config) -> MoverSettings {
    MoverSettings {
        batch_pages: cfg.mover.batch_pages,
        busy_retries: cfg.mover.busy_retries,
        busy_retry_delay: Duration::from_millis(cfg.mover.busy_retry_delay_ms),
        move_all: cfg.mover.move_all,
        madvise_cold: cfg.mover.madvise_cold,
    }
}

fn start_mover(cfg: &Config, topo: &HostTopology) -> Mover {
    let nodes: Vec<(u8, Vec<u32>)> = topo
        .nodes
        .iter()
        .map(|n| {
            let cpus = topo
                .node(n.worker_node)
                .map(|w| w.cpus.clone())
                .unwrap_or_default();
            (n.id, cpus)
        })
        .collect();
    Mover::start(
        &nodes,
        mover_settings(cfg),
        Limits::new(
            cfg.mover.promote_mbps,
            cfg.mover.demote_mbps,
            Instant::now(),
        ),
    )
}

fn make_pool(cfg: &Config, topo: &HostTopology) -> anyhow::Result<FastPool> {
    let params = cfg.pool_params(topo.fast_capacity_bytes())?;
    Ok(FastPool::new(params)?)
}

/// The label of a quota change reason (its serde name: `initial`, `grow`, ...).
pub fn reason_label(r: QuotaReason) -> &'static str {
    match r {
        QuotaReason::Initial => "initial",
        QuotaReason::Config => "config",
        QuotaReason::Grow => "grow",
        QuotaReason::Shrink => "shrink",
        QuotaReason::Reclaim => "reclaim",
        QuotaReason::Clamp => "clamp",
    }
}

fn make_engine(cfg: &Config, topo: &HostTopology) -> anyhow::Result<VtismPolicy> {
    VtismPolicy::new(topo.engine.clone(), cfg.engine.clone())
        .map_err(|e| anyhow::anyhow!("engine.{}: {}", e.field, e.problem))
}

impl Daemon {
    pub fn new(cfg: Config, config_path: Option<PathBuf>) -> anyhow::Result<Daemon> {
        let topo = HostTopology::read(&cfg.daemon.sysfs_root, &cfg.topology)
            .context("reading the NUMA topology")?;
        for n in &topo.nodes {
            info!(
                node = n.id,
                tier = n.tier,
                kernel_tier = ?n.kernel_tier,
                cpus = n.cpus.len(),
                mem_mib = n.mem_total_bytes >> 20,
                socket = n.socket,
                worker_node = n.worker_node,
                "numa node"
            );
        }
        let engine = make_engine(&cfg, &topo)?;
        let pool = make_pool(&cfg, &topo)?;
        match cfg.pool.mode {
            crate::config::PoolModeConfig::Pool => info!(
                fast_mib = pool.params().fast_bytes >> 20,
                fast_nodes_mib = topo.fast_capacity_bytes() >> 20,
                "fast memory: one pool, quotas follow each VM's hot set"
            ),
            crate::config::PoolModeConfig::Island => {
                info!("fast memory: island mode, fixed quotas")
            }
        }
        let mover = start_mover(&cfg, &topo);
        let (ctl_tx, ctl_rx) = mpsc::channel();
        let (attach_tx, attach_rx) = mpsc::channel();
        let mut d = Daemon {
            cfg,
            config_path,
            topo,
            engine,
            pool,
            vms: BTreeMap::new(),
            next_id: 1,
            mover,
            backoff: HashMap::new(),
            last_scan: None,
            epoch: Instant::now(),
            epoch_unix: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64()),
            totals: Totals {
                latency: Some(Histogram::new(&[
                    0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0,
                ])),
                job_seconds: Some(Histogram::new(&[0.001, 0.01, 0.1, 0.5, 1.0, 5.0, 30.0])),
                ..Default::default()
            },
            shared: Arc::new(Mutex::new(Snapshot::default())),
            ctl_rx,
            ctl_tx,
            attach_tx,
            attach_rx,
            attaching: HashSet::new(),
            stop: Arc::new(AtomicBool::new(false)),
            threads: Vec::new(),
            metrics_addr: None,
        };
        d.start_servers()?;
        Ok(d)
    }

    fn start_servers(&mut self) -> anyhow::Result<()> {
        if !self.cfg.daemon.metrics_listen.is_empty() {
            let (h, addr) = serve::spawn_metrics(
                &self.cfg.daemon.metrics_listen,
                self.shared.clone(),
                self.stop.clone(),
            )
            .with_context(|| {
                format!(
                    "daemon.metrics_listen: cannot listen on {}",
                    self.cfg.daemon.metrics_listen
                )
            })?;
            info!(%addr, "metrics on http://{addr}/metrics");
            self.metrics_addr = Some(addr);
            self.threads.push(h);
        }
        if !self.cfg.daemon.control_socket.as_os_str().is_empty() {
            let h = serve::spawn_control(
                &self.cfg.daemon.control_socket,
                self.shared.clone(),
                self.ctl_tx.clone(),
                self.stop.clone(),
            )
            .with_context(|| {
                format!(
                    "daemon.control_socket: cannot bind {}",
                    self.cfg.daemon.control_socket.display()
                )
            })?;
            self.threads.push(h);
        }
        Ok(())
    }

    fn now(&self) -> Nanos {
        Nanos(self.epoch.elapsed().as_nanos() as u64)
    }

    /// Runs until SIGTERM/SIGINT.
    pub fn run(&mut self) -> anyhow::Result<()> {
        let interval = Duration::from_millis(self.cfg.daemon.interval_ms);
        let mut next = Instant::now();
        while !sys::signals::term() {
            if sys::signals::take_hup() {
                match self.reload() {
                    Ok(()) => info!("configuration reloaded (SIGHUP)"),
                    Err(e) => warn!(error = %e, "reload failed; keeping the old configuration"),
                }
            }
            self.round();
            next += interval;
            let now = Instant::now();
            if next < now {
                next = now;
            }
            // Sleep in slices so control requests and signals are served promptly.
            while Instant::now() < next && !sys::signals::term() {
                self.serve_requests();
                std::thread::sleep((next - Instant::now()).min(Duration::from_millis(20)));
            }
        }
        info!("stopping");
        self.shutdown();
        Ok(())
    }

    fn serve_requests(&mut self) {
        while let Ok(req) = self.ctl_rx.try_recv() {
            match req {
                CtlRequest::Reload(ans) => {
                    let r = self.reload().map_err(|e| format!("{e:#}"));
                    if r.is_ok() {
                        info!("configuration reloaded (control socket)");
                    }
                    let _ = ans.send(r);
                }
            }
        }
    }

    pub fn shutdown(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.mover.shutdown();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }

    /// Re-reads the configuration file (and the topology). Servers keep their addresses.
    pub fn reload(&mut self) -> anyhow::Result<()> {
        let Some(path) = self.config_path.clone() else {
            anyhow::bail!("no configuration file to reload");
        };
        let cfg = Config::load(&path)?;
        self.apply_config(cfg)
    }

    pub fn apply_config(&mut self, cfg: Config) -> anyhow::Result<()> {
        let topo = HostTopology::read(&cfg.daemon.sysfs_root, &cfg.topology)?;
        // VMs the new configuration ignores are let go (below); they leave the pool first, so
        // their minimums do not count against the new limits.
        let ignored: Vec<VmId> = self
            .vms
            .values()
            .filter(|v| cfg.vm_entry(&v.name, &v.socket).is_some_and(|e| e.ignore))
            .map(|v| v.id)
            .collect();
        // The new pool is built on a copy: a pool whose minimums do not fit fails the reload
        // and changes nothing.
        let now_ns = self.now();
        let mut limits = BTreeMap::new();
        for v in self.vms.values().filter(|v| !ignored.contains(&v.id)) {
            let entry = cfg.vm_entry(&v.name, &v.socket);
            limits.insert(v.id, cfg.limits_for(entry, v.memory.bytes()));
        }
        let (pool, changes) = self.reconfigured_pool(&cfg, &topo, &ignored, &limits, now_ns)?;
        let topo_changed = topo.nodes != self.topo.nodes;
        if topo_changed || cfg.engine != self.cfg.engine || cfg.mover != self.cfg.mover {
            // The plan in flight is abandoned (its queued batches are dropped; a move_pages call
            // under way finishes): the new engine relearns placement by reconciling.
            let mut engine = make_engine(&cfg, &topo)?;
            for v in self.vms.values() {
                let home = v.home.filter(|h| topo.node(*h).is_some());
                engine
                    .add_vm(VmSpec {
                        id: v.id,
                        ram: v.memory.ram.clone(),
                        fast_quota_bytes: pool.quota(v.id).unwrap_or(v.quota),
                        home_node: home.map(NodeId),
                    })
                    .map_err(|e| anyhow::anyhow!("{e}"))?;
            }
            self.mover.shutdown();
            self.mover = start_mover(&cfg, &topo);
            for v in self.vms.values_mut() {
                v.cursor = 0;
                v.full_sweeps = 0;
                v.hinted = false;
            }
            self.engine = engine;
            self.topo = topo;
        }
        self.pool = pool;
        for (id, l) in limits {
            if let Some(v) = self.vms.get_mut(&id) {
                v.limits = l;
            }
        }
        for c in changes {
            self.apply_quota_change(c);
        }
        let now = Instant::now();
        {
            let mut l = self.mover.limits.lock().unwrap_or_else(|e| e.into_inner());
            l.set_global(cfg.mover.promote_mbps, cfg.mover.demote_mbps, now);
            for v in self.vms.values() {
                let e = cfg.vm_entry(&v.name, &v.socket);
                l.set_vm(
                    v.id,
                    e.and_then(|e| e.promote_mbps)
                        .unwrap_or(cfg.mover.vm_promote_mbps),
                    e.and_then(|e| e.demote_mbps)
                        .unwrap_or(cfg.mover.vm_demote_mbps),
                    now,
                );
            }
        }
        self.cfg = cfg;
        for id in ignored {
            self.drop_vm(id, "ignored by the configuration");
        }
        self.backoff.clear();
        self.last_scan = None;
        Ok(())
    }

    /// The pool under a new configuration, and the quota changes that gives (not applied yet).
    /// Parameters and limits are changed in whichever order is feasible: a pool shrinking under
    /// the old minimums needs the new limits first, limits raised beyond the old pool need the
    /// new size first.
    fn reconfigured_pool(
        &self,
        cfg: &Config,
        topo: &HostTopology,
        ignored: &[VmId],
        limits: &BTreeMap<VmId, QuotaLimits>,
        now: Nanos,
    ) -> anyhow::Result<(FastPool, Vec<QuotaChange>)> {
        let params = cfg.pool_params(topo.fast_capacity_bytes())?;
        let mut base = self.pool.clone();
        for id in ignored {
            base.remove_vm(*id);
        }
        let set_params = |p: &mut FastPool, out: &mut Vec<QuotaChange>| {
            if *p.params() != params {
                out.extend(p.set_params(params, now)?);
            }
            Ok::<(), vtism_engine::PoolError>(())
        };
        let set_limits = |p: &mut FastPool, out: &mut Vec<QuotaChange>| {
            for (id, l) in limits {
                let el = cfg.engine_limits(l);
                if p.limits(*id).is_some_and(|old| old != el) {
                    out.extend(p.set_limits(*id, el, now)?);
                }
            }
            Ok::<(), vtism_engine::PoolError>(())
        };
        let mut first_error = None;
        for params_first in [true, false] {
            let mut p = base.clone();
            let mut out = Vec::new();
            let r = if params_first {
                set_params(&mut p, &mut out).and_then(|_| set_limits(&mut p, &mut out))
            } else {
                set_limits(&mut p, &mut out).and_then(|_| set_params(&mut p, &mut out))
            };
            match r {
                Ok(()) => return Ok((p, out)),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        Err(anyhow::anyhow!(
            "{}",
            first_error.map_or_else(String::new, |e| e.to_string())
        ))
    }

    /// Applies a quota change from the pool: the engine plans with it from the next plan on (a
    /// smaller quota demotes the coldest fast frames), the guest sees it in its feedback.
    fn apply_quota_change(&mut self, c: QuotaChange) {
        let Some(v) = self.vms.get_mut(&c.vm) else {
            return;
        };
        if let Err(e) = self.engine.set_quota(c.vm, c.to_bytes) {
            warn!(vm = %v.name, error = %e, "cannot set the quota");
            return;
        }
        v.quota = c.to_bytes;
        feedback(&self.cfg.channel, v);
        let reason = reason_label(c.reason);
        *v.quota_changes.entry(reason).or_default() += 1;
        v.last_change = Some(c);
        if c.from_bytes != c.to_bytes {
            info!(
                vm = %v.name,
                from_mib = c.from_bytes as f64 / (1u64 << 20) as f64,
                to_mib = c.to_bytes as f64 / (1u64 << 20) as f64,
                reason,
                hot_set_mib = c.hot_set_bytes as f64 / (1u64 << 20) as f64,
                "quota changed"
            );
        }
    }

    /// Feeds each VM's hot-set estimate to the pool and applies the quota changes it makes.
    /// Runs just before planning, so a shrunk quota's demotions are in the same plan as the
    /// promotions the grown quota of another VM allows.
    fn rebalance_pool(&mut self) {
        let now = self.now();
        let hinted: Vec<VmId> = self
            .vms
            .values()
            .filter(|v| v.hinted)
            .map(|v| v.id)
            .collect();
        let demand = self
            .engine
            .pool_demands(&hinted, self.pool.params().fast_bytes);
        for c in self.pool.rebalance(&demand, now) {
            self.apply_quota_change(c);
        }
    }

    /// One round. Public so tests can step the daemon.
    pub fn round(&mut self) {
        let t0 = Instant::now();
        let cpu0 = sys::thread_cpu_seconds();
        self.totals.rounds += 1;
        self.serve_requests();
        let scan_due = self.last_scan.is_none_or(|t| {
            t.elapsed() >= Duration::from_millis(self.cfg.discovery.scan_interval_ms)
        });
        if scan_due {
            self.discover();
            self.last_scan = Some(Instant::now());
        }
        self.collect_attached();
        // The finished plan's report first: while a plan is in flight the periodic refresh of
        // each VM (memory map, home node) waits, and a plan submitted every round would
        // otherwise look in flight at every refresh and starve it.
        if let Some(r) = self.mover.poll() {
            self.apply_report(r);
        }
        self.watch_vms();
        self.read_channels();
        if !self.mover.busy() {
            self.reconcile();
            self.rebalance_pool();
            self.plan_and_submit();
        }
        self.totals.last_round_seconds = t0.elapsed().as_secs_f64();
        self.totals.round_cpu_seconds += sys::thread_cpu_seconds() - cpu0;
        self.publish();
    }

    // -----------------------------------------------------------------------------------------
    // Discovery

    fn candidate_sockets(&self) -> Vec<PathBuf> {
        let mut out: Vec<PathBuf> = self
            .cfg
            .vms
            .iter()
            .filter(|v| !v.ignore)
            .filter_map(|v| v.qmp_socket.clone())
            .collect();
        for dir in &self.cfg.discovery.scan_dirs {
            scan_dir(dir, 2, self.cfg.discovery.scan_any_socket, &mut out);
        }
        out.sort();
        out.dedup();
        out
    }

    fn discover(&mut self) {
        let managed: HashSet<PathBuf> = self.vms.values().map(|v| v.socket.clone()).collect();
        let backoff = Duration::from_millis(self.cfg.discovery.retry_backoff_ms);
        for sock in self.candidate_sockets() {
            if managed.contains(&sock) {
                continue;
            }
            if self
                .backoff
                .get(&sock)
                .is_some_and(|t| t.elapsed() < backoff)
            {
                continue;
            }
            if self.attaching.contains(&sock) {
                continue;
            }
            // Connecting and inspecting can block for the QMP timeout (a monitor held by someone
            // else never greets): do it off the main loop, which keeps serving the other VMs.
            self.attaching.insert(sock.clone());
            let tx = self.attach_tx.clone();
            let timeout = Duration::from_millis(self.cfg.discovery.qmp_timeout_ms);
            let spawned = std::thread::Builder::new()
                .name("vtism-attach".into())
                .spawn(move || {
                    let r = Qmp::connect(&sock, timeout)
                        .map_err(anyhow::Error::from)
                        .and_then(|mut q| {
                            let info = vm::inspect(&mut q)?;
                            Ok((q, info))
                        });
                    let _ = tx.send((sock, r));
                });
            if let Err(e) = spawned {
                warn!(error = %e, "cannot start an attach thread");
            }
        }
    }

    /// Registers the VMs whose attach finished.
    fn collect_attached(&mut self) {
        while let Ok((sock, r)) = self.attach_rx.try_recv() {
            self.attaching.remove(&sock);
            let r = r.and_then(|(q, info)| self.attach(&sock, q, info));
            match r {
                Ok(Some(id)) => {
                    self.backoff.remove(&sock);
                    debug!(vm = %id, socket = %sock.display(), "attached");
                }
                Ok(None) => {
                    self.backoff.insert(sock, Instant::now());
                }
                Err(e) => {
                    self.totals.discover_errors += 1;
                    warn!(socket = %sock.display(), error = %format!("{e:#}"), "cannot attach VM; will retry");
                    self.backoff.insert(sock, Instant::now());
                }
            }
        }
    }

    /// Starts managing a VM found on `sock`. `Ok(None)`: not ours to manage.
    fn attach(&mut self, sock: &Path, qmp: Qmp, info: VmInfo) -> anyhow::Result<Option<VmId>> {
        if self.vms.values().any(|v| v.pid == qmp.pid) {
            return Ok(None); // a second monitor of a VM already managed
        }
        let entry = self.cfg.vm_entry(&info.name, sock).cloned();
        if entry.as_ref().is_some_and(|e| e.ignore) {
            info!(vm = %info.name, "ignored by the configuration");
            return Ok(None);
        }
        if entry.is_none() && !self.cfg.defaults.manage_discovered {
            debug!(vm = %info.name, "no [[vm]] entry and defaults.manage_discovered = false");
            return Ok(None);
        }
        let id = VmId(self.next_id);
        let limits = self.cfg.limits_for(entry.as_ref(), info.memory.bytes());
        let home = entry
            .as_ref()
            .and_then(|e| e.home_node)
            .or_else(|| vm::home_node(info.pid, &info.vcpu_threads, |c| self.topo.node_of_cpu(c)))
            .filter(|h| self.topo.node(*h).is_some());
        // The pool admits the VM only if its guaranteed minimum fits beside the others'; if not,
        // the VM is left alone (retried later: another VM may go away).
        let now = self.now();
        let enforced = self.cfg.engine_limits(&limits);
        let initial = self
            .pool
            .add_vm(id, enforced, now)
            .map_err(|e| anyhow::anyhow!("fast-memory pool: {e}"))?;
        let quota = initial.to_bytes;
        if let Err(e) = self.engine.add_vm(VmSpec {
            id,
            ram: info.memory.ram.clone(),
            fast_quota_bytes: quota,
            home_node: home.map(NodeId),
        }) {
            self.pool.remove_vm(id);
            anyhow::bail!("engine: {e}");
        }
        self.next_id += 1;
        let name = if info.name.is_empty() {
            entry
                .as_ref()
                .map(|e| e.name.clone())
                .filter(|n| !n.is_empty())
                .unwrap_or_else(|| format!("pid{}", info.pid))
        } else {
            info.name.clone()
        };
        let (channel, channel_problem) = self.open_channel(&info, entry.as_ref());
        {
            let now = Instant::now();
            let mut l = self.mover.limits.lock().unwrap_or_else(|e| e.into_inner());
            l.set_vm(
                id,
                entry
                    .as_ref()
                    .and_then(|e| e.promote_mbps)
                    .unwrap_or(self.cfg.mover.vm_promote_mbps),
                entry
                    .as_ref()
                    .and_then(|e| e.demote_mbps)
                    .unwrap_or(self.cfg.mover.vm_demote_mbps),
                now,
            );
        }
        info!(
            vm = %name, id = %id, pid = info.pid, socket = %sock.display(),
            ram_mib = info.memory.bytes() >> 20, ranges = info.memory.ranges.len(),
            quota_mib = quota >> 20, min_mib = enforced.min_bytes >> 20,
            max_mib = enforced.max_bytes >> 20, shares = enforced.shares, home = ?home,
            channel = ?channel.as_ref().map(|c| c.path.display().to_string()),
            channel_problem = ?channel_problem,
            qemu = ?info.qemu_version,
            "managing VM"
        );
        let v = ManagedVm {
            id,
            name,
            socket: sock.to_path_buf(),
            pid: info.pid,
            qmp,
            memory: Arc::new(info.memory),
            channel,
            channel_problem,
            reader: ChannelReader::new(),
            over_budget: 0,
            quota,
            limits,
            hinted: false,
            last_change: Some(initial),
            quota_changes: [(reason_label(initial.reason), 1)].into(),
            home,
            home_candidate: None,
            attached: Instant::now(),
            last_round: 0,
            last_round_at: None,
            last_entries: 0,
            channel_minor: None,
            tracker_report: None,
            last_refresh: Instant::now(),
            cursor: 0,
            full_sweeps: 0,
            promoted_bytes: 0,
            demoted_bytes: 0,
            outcomes: BTreeMap::new(),
            corrections: 0,
            reconciled_changes: 0,
            trimmed_frames: 0,
        };
        self.write_feedback(&v);
        self.vms.insert(id, v);
        Ok(Some(id))
    }

    fn open_channel(
        &self,
        info: &VmInfo,
        entry: Option<&crate::config::VmConfig>,
    ) -> (Option<Channel>, Option<String>) {
        // A path from the operator's configuration is trusted; one reported by QEMU must be a
        // file QEMU's own user owns.
        let mut owner = Some(info.uid);
        let path = match entry.and_then(|e| e.channel.clone()) {
            Some(p) => {
                owner = None;
                p
            }
            None => match vm::pick_channel(&info.ivshmem, &self.cfg.channel.device_prefix) {
                Some(d) => match &d.mem_path {
                    Some(p) => p.clone(),
                    None => {
                        return (
                            None,
                            Some(format!("ivshmem backend `{}` has no mem-path", d.backend)),
                        )
                    }
                },
                None if info.ivshmem.is_empty() => {
                    return (None, Some("no ivshmem-plain device".into()))
                }
                None => {
                    return (
                        None,
                        Some(format!(
                            "{} ivshmem devices and none named `{}*`",
                            info.ivshmem.len(),
                            self.cfg.channel.device_prefix
                        )),
                    )
                }
            },
        };
        match FileMapping::open_owned_by(&path, self.cfg.channel.max_region_mib << 20, owner) {
            Ok(map) => {
                let region = map.region();
                (
                    Some(Channel {
                        path,
                        _map: map,
                        region,
                    }),
                    None,
                )
            }
            Err(e) => (None, Some(format!("{}: {e}", path.display()))),
        }
    }

    fn drop_vm(&mut self, id: VmId, why: &str) {
        if let Some(v) = self.vms.remove(&id) {
            info!(vm = %v.name, id = %id, reason = why, "no longer managing VM");
            let _ = self.engine.remove_vm(id);
            self.pool.remove_vm(id);
            self.mover
                .limits
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove_vm(id);
            self.totals.vms_dropped += 1;
        }
    }

    /// QMP events, liveness, and periodic refresh of each VM's memory map.
    fn watch_vms(&mut self) {
        let ids: Vec<VmId> = self.vms.keys().copied().collect();
        let refresh = Duration::from_millis(self.cfg.discovery.refresh_interval_ms);
        for id in ids {
            let Some(v) = self.vms.get_mut(&id) else {
                continue;
            };
            let mut resync = false;
            match v.qmp.poll_events() {
                Ok(events) => {
                    for e in events {
                        debug!(vm = %v.name, event = %e.name, "QMP event");
                        match e.name.as_str() {
                            "SHUTDOWN" if e.data["reason"] == "host-qmp-quit" => {}
                            "RESET" => resync = true,
                            "DEVICE_DELETED" | "ACPI_DEVICE_OST" | "MEMORY_DEVICE_SIZE_CHANGE" => {
                                resync = true
                            }
                            _ => {}
                        }
                    }
                }
                Err(e) => {
                    let why = format!("QMP: {e}");
                    self.drop_vm(id, &why);
                    continue;
                }
            }
            if !sys::process_alive(v.pid) {
                self.drop_vm(id, "QEMU process exited");
                continue;
            }
            let periodic = v.last_refresh.elapsed() >= refresh && !self.mover.busy();
            if resync || periodic {
                if let Err(e) = self.refresh_vm(id, resync) {
                    let fatal = e.downcast_ref::<QmpError>().is_some_and(QmpError::is_fatal)
                        || e.downcast_ref::<vm::InspectError>().is_some_and(
                            |ie| matches!(ie, vm::InspectError::Qmp(q) if q.is_fatal()),
                        );
                    if fatal {
                        self.drop_vm(id, &format!("{e:#}"));
                    } else {
                        warn!(vm = %id, error = %format!("{e:#}"), "refresh failed");
                    }
                }
            }
        }
    }

    /// Re-reads the memory map; a changed map (hot-plug, firmware remapping) re-registers the
    /// VM with the engine, which forgets its hotness and learns placement again.
    fn refresh_vm(&mut self, id: VmId, reset: bool) -> anyhow::Result<()> {
        // Never wait for the mover here: a rate-limited plan can run for many rounds, and the
        // channels must keep being read meanwhile. A plan in flight keeps its own copy of the
        // old map; moves it makes on memory that went away fail per page, harmlessly.
        let Some(v) = self.vms.get_mut(&id) else {
            return Ok(());
        };
        v.last_refresh = Instant::now();
        let info = vm::inspect(&mut v.qmp)?;
        let changed = !info.memory.same_as(&v.memory);
        if reset {
            // The guest restarted: its tracker re-initialises the channel from round 1.
            v.reader.reset();
        }
        if v.channel.is_none() {
            let entry = self.cfg.vm_entry(&v.name, &v.socket).cloned();
            let (c, p) = self.open_channel(&info, entry.as_ref());
            let v = self.vms.get_mut(&id).expect("present");
            v.channel = c;
            v.channel_problem = p;
        }
        let Some(v) = self.vms.get_mut(&id) else {
            return Ok(());
        };
        let entry = self.cfg.vm_entry(&v.name, &v.socket).cloned();
        // The home node follows the vCPU threads (unless the configuration names it); an answer
        // that differs from the current home moves it only when the next refresh agrees, so
        // vCPUs that merely wander for a moment do not make the engine relearn the VM.
        let mut home_moved = false;
        if entry.as_ref().and_then(|e| e.home_node).is_none() {
            let seen = vm::home_node(info.pid, &info.vcpu_threads, |c| self.topo.node_of_cpu(c))
                .filter(|h| self.topo.node(*h).is_some());
            if seen.is_some() && seen != v.home {
                if v.home_candidate == seen {
                    info!(vm = %v.name, from = ?v.home, to = ?seen, "home node changed (vCPU threads moved)");
                    v.home = seen;
                    v.home_candidate = None;
                    home_moved = true;
                } else {
                    v.home_candidate = seen;
                }
            } else {
                v.home_candidate = None;
            }
        }
        if changed || reset || home_moved {
            let limits = self.cfg.limits_for(entry.as_ref(), info.memory.bytes());
            if changed {
                info!(
                    vm = %v.name, ram_mib = info.memory.bytes() >> 20, ranges = info.memory.ranges.len(),
                    reset, "memory map changed; re-registering"
                );
            } else {
                info!(vm = %v.name, reset, home = ?v.home, "re-registering");
            }
            v.memory = Arc::new(info.memory);
            v.cursor = 0;
            v.full_sweeps = 0;
            v.hinted = false;
            // Limits in % of a share in % of RAM follow the new RAM size; limits the pool cannot
            // honour (the minimums no longer fit) keep the old ones.
            if limits != v.limits {
                let name = v.name.clone();
                match self
                    .pool
                    .set_limits(id, self.cfg.engine_limits(&limits), self.now())
                {
                    Ok(changes) => {
                        if let Some(v) = self.vms.get_mut(&id) {
                            v.limits = limits;
                        }
                        for c in changes {
                            self.apply_quota_change(c);
                        }
                    }
                    Err(e) => warn!(vm = %name, error = %e, "new limits not applied"),
                }
            }
            let Some(v) = self.vms.get_mut(&id) else {
                return Ok(());
            };
            v.quota = self.pool.quota(id).unwrap_or(v.quota);
            let _ = self.engine.remove_vm(id);
            self.engine
                .add_vm(VmSpec {
                    id,
                    ram: v.memory.ram.clone(),
                    fast_quota_bytes: v.quota,
                    home_node: v.home.map(NodeId),
                })
                .map_err(|e| anyhow::anyhow!("engine: {e}"))?;
        }
        Ok(())
    }

    // -----------------------------------------------------------------------------------------
    // Channels

    fn read_channels(&mut self) {
        let now = self.now();
        let max_entries = self.cfg.channel.max_entries;
        let ids: Vec<VmId> = self.vms.keys().copied().collect();
        for id in ids {
            let Some(mut v) = self.vms.remove(&id) else {
                continue;
            };
            if let Some(ch) = &v.channel {
                // A round far over the requested budget is refused before it is copied.
                let cap = ch.region.load_u64(off::CAPACITY).unwrap_or(0);
                let count = ch.region.load_u64(off::COUNT).unwrap_or(0);
                let round = ch.region.load_u64(off::ROUND).unwrap_or(0);
                if count <= cap && count > max_entries && round != v.reader.last_round() {
                    v.over_budget += 1;
                    debug!(vm = %v.name, count, max_entries, "round over budget rejected");
                } else {
                    match v.reader.read(&ch.region, &v.memory.ram) {
                        Ok(Some(round)) => {
                            v.hinted = true;
                            v.last_round = round.round;
                            v.last_round_at = Some(Instant::now());
                            v.last_entries = round.entries.len() as u64;
                            v.channel_minor = Some(round.version_minor);
                            v.tracker_report = round.tracker_report;
                            match self.engine.observe(
                                id,
                                Observation::Hints {
                                    entries: &round.entries,
                                    overflow: round.overflow(),
                                    counts: round.counts(),
                                },
                                now,
                            ) {
                                Ok(st) if st.ignored > 0 => {
                                    warn!(vm = %v.name, ignored = st.ignored, "engine ignored entries")
                                }
                                Ok(_) => {}
                                Err(e) => warn!(vm = %v.name, error = %e, "observe"),
                            }
                            // Hinted frames whose node the engine does not know yet (first
                            // touched after the last sweep) are looked up now, so they can be
                            // planned this round rather than after the next sweep.
                            if !self.mover.busy() {
                                self.learn_hinted(&v, &round.entries);
                            }
                            v.reader.recycle(round);
                        }
                        Ok(None) => {}
                        Err(e) => {
                            if e.reason() == RejectReason::WriteInProgress {
                                debug!(vm = %v.name, "guest mid-write");
                            } else {
                                debug!(vm = %v.name, reason = e.label(), error = %e, "round rejected");
                            }
                        }
                    }
                }
            }
            self.write_feedback(&v);
            self.vms.insert(id, v);
        }
    }

    fn learn_hinted(&mut self, v: &ManagedVm, entries: &[vtism_proto::HintEntry]) {
        const MAX: usize = 65536;
        let mut gfns = Vec::new();
        let mut addrs = Vec::new();
        'outer: for e in entries {
            for i in 0..e.frames() {
                let g = Gfn(e.gfn().0 + i);
                if matches!(self.engine.frame_node(v.id, g), Ok(None)) {
                    if let Some(a) = v.memory.hva(g) {
                        gfns.push(g);
                        addrs.push(a);
                        if gfns.len() >= MAX {
                            break 'outer;
                        }
                    }
                }
            }
        }
        if !gfns.is_empty() {
            if let Err(e) = query_and_learn(&mut self.engine, &self.topo, v, &gfns, &addrs) {
                debug!(vm = %v.name, error = %e, "placement query of hinted frames failed");
            }
        }
    }

    fn write_feedback(&self, v: &ManagedVm) {
        feedback(&self.cfg.channel, v);
    }

    // -----------------------------------------------------------------------------------------
    // Placement

    /// Queries where a budget of each VM's pages are and tells the engine what changed.
    fn reconcile(&mut self) {
        let m = &self.cfg.mover;
        let (sweep_ms, cap) = (m.reconcile_sweep_s * 1000, m.reconcile_max_pages_per_round);
        let interval = self.cfg.daemon.interval_ms;
        for v in self.vms.values_mut() {
            let total = v.memory.ram.frames();
            if total == 0 {
                continue;
            }
            // Until the first sweep completes the engine cannot plan for unknown frames: learn
            // the placement faster then (16 GiB per round).
            let budget = if v.full_sweeps == 0 {
                cap.max(1 << 22)
            } else {
                (total.saturating_mul(interval) / sweep_ms + 1).min(cap)
            };
            let mut left = budget.min(total);
            let mut changes = 0u64;
            while left > 0 {
                let start = v.cursor % total;
                let n = left.min(total - start).min(65536);
                let mut gfns = Vec::with_capacity(n as usize);
                let mut addrs = Vec::with_capacity(n as usize);
                for i in start..start + n {
                    if let Some(g) = v.memory.ram.gfn_at(i) {
                        if let Some(a) = v.memory.hva(g) {
                            gfns.push(g);
                            addrs.push(a);
                        }
                    }
                }
                match query_and_learn(&mut self.engine, &self.topo, v, &gfns, &addrs) {
                    Ok(c) => changes += c,
                    Err(e) => {
                        debug!(vm = %v.name, error = %e, "placement query failed");
                        break;
                    }
                }
                v.cursor = (start + n) % total;
                if v.cursor == 0 {
                    v.full_sweeps += 1;
                }
                left -= n;
            }
            v.reconciled_changes += changes;
        }
    }

    fn plan_and_submit(&mut self) {
        let free = self.topo.free_bytes();
        let window = Duration::from_millis(self.cfg.daemon.interval_ms);
        let budget = self
            .mover
            .limits
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .budget(window, Instant::now());
        let ctx = PlanContext {
            node_free_bytes: &free,
            budget_bytes: budget,
        };
        let now = self.now();
        let plan = self.engine.plan(&ctx, now);
        if plan.is_empty() {
            return;
        }
        self.totals.plans += 1;
        self.totals.planned_bytes += plan.moved_bytes();
        debug!(
            moves = plan.moves.len(),
            promote_mib = plan.stats.promote_bytes >> 20,
            demote_mib = plan.stats.demote_bytes >> 20,
            "plan"
        );
        let vms: HashMap<VmId, (i32, Arc<GuestMemory>)> = self
            .vms
            .values()
            .map(|v| (v.id, (v.pid, v.memory.clone())))
            .collect();
        // Per-VM rate limits cut each VM's share of the plan to what it may move this round, so
        // one slow VM never holds the mover (and every other VM's placement) for many rounds.
        let allowance = self
            .mover
            .limits
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .vm_allowance(window, Instant::now());
        let (moves, cut) = crate::mover::limit_per_vm(plan.moves, &allowance);
        for m in cut {
            // Those frames stay where they are; the engine plans them again next round.
            let _ = self
                .engine
                .set_placement(m.vm, m.gfn, m.frames, Some(m.from));
        }
        self.mover.submit(moves, vms, self.topo.fast_nodes());
    }

    fn apply_report(&mut self, r: crate::mover::JobReport) {
        if let Some(h) = self.totals.job_seconds.as_mut() {
            h.observe(r.elapsed.as_secs_f64());
        }
        if let Some(h) = self.totals.latency.as_mut() {
            for &l in &r.latencies {
                h.observe(l);
            }
        }
        for (vm, st) in &r.per_vm {
            if let Some(v) = self.vms.get_mut(vm) {
                v.promoted_bytes += st.promoted_bytes;
                v.demoted_bytes += st.demoted_bytes;
                for (o, c) in &st.pages_by_outcome {
                    *v.outcomes.entry(*o).or_default() += c;
                }
                v.trimmed_frames += st.trimmed_frames;
            }
        }
        // Frames that did not end where the plan said: tell the engine, in runs.
        let mut run: Option<(VmId, Gfn, u64, Option<NodeId>)> = None;
        let mut corrections = r.corrections;
        corrections.sort_by_key(|c| (c.vm, c.gfn));
        for c in corrections {
            if let Some(v) = self.vms.get_mut(&c.vm) {
                v.corrections += 1;
            } else {
                continue;
            }
            match &mut run {
                Some((vm, g, n, node)) if *vm == c.vm && *node == c.node && g.0 + *n == c.gfn.0 => {
                    let ok = self
                        .vms
                        .get(vm)
                        .is_some_and(|v| v.memory.ram.contains_span(*g, *n + 1));
                    if ok {
                        *n += 1;
                        continue;
                    }
                    let (vm0, g0, n0, node0) = run.take().expect("some");
                    let _ = self.engine.set_placement(vm0, g0, n0, node0);
                    run = Some((c.vm, c.gfn, 1, c.node));
                }
                _ => {
                    if let Some((vm0, g0, n0, node0)) = run.take() {
                        let _ = self.engine.set_placement(vm0, g0, n0, node0);
                    }
                    run = Some((c.vm, c.gfn, 1, c.node));
                }
            }
        }
        if let Some((vm0, g0, n0, node0)) = run.take() {
            let _ = self.engine.set_placement(vm0, g0, n0, node0);
        }
        for vm in r.gone {
            self.drop_vm(vm, "QEMU process gone during a move");
        }
    }

    // -----------------------------------------------------------------------------------------
    // Metrics and status

    fn publish(&mut self) {
        let now_ns = self.now();
        let mut e = Exposition::default();
        let mut vm_rows = Vec::new();
        let mut node_resident: BTreeMap<u8, u64> = BTreeMap::new();
        let fam = |e: &mut Exposition, n: &str, k: &str, h: &str| e.family(n, k, h);
        for v in self.vms.values() {
            let Ok(s) = self.engine.summary(v.id) else {
                continue;
            };
            for (n, c) in self.engine.node_frames(v.id).unwrap_or_default() {
                *node_resident.entry(n.0).or_default() += c * FRAME_SIZE;
            }
            let name = v.name.as_str();
            let l = [("vm", name)];
            // The hot set the engine estimates (the pool's demand), and the part of it the quota
            // allowed in the last plan.
            let hot_set = self.engine.hot_set_bytes(v.id).unwrap_or(0);
            let planned_hot = s.last_plan.hot_set_frames * FRAME_SIZE;
            let limits = self.pool.limits(v.id);
            fam(&mut e, "vtism_vm_ram_bytes", "gauge", "Guest RAM managed.");
            e.sample("vtism_vm_ram_bytes", &l, v.memory.bytes() as f64);
            fam(
                &mut e,
                "vtism_vm_fast_quota_bytes",
                "gauge",
                "Fast-memory quota.",
            );
            e.sample("vtism_vm_fast_quota_bytes", &l, v.quota as f64);
            fam(
                &mut e,
                "vtism_vm_resident_bytes",
                "gauge",
                "Guest RAM by memory tier, as the daemon knows it (reconciled).",
            );
            e.sample(
                "vtism_vm_resident_bytes",
                &[("vm", name), ("tier", "fast")],
                (s.fast_frames * FRAME_SIZE) as f64,
            );
            e.sample(
                "vtism_vm_resident_bytes",
                &[("vm", name), ("tier", "slow")],
                (s.slow_frames * FRAME_SIZE) as f64,
            );
            e.sample(
                "vtism_vm_resident_bytes",
                &[("vm", name), ("tier", "unknown")],
                (s.unknown_frames * FRAME_SIZE) as f64,
            );
            for (m, help, val) in [
                (
                    "vtism_vm_fast_quota_min_bytes",
                    "Guaranteed minimum quota (island mode: the fixed quota).",
                    limits.map(|l| l.min_bytes),
                ),
                (
                    "vtism_vm_fast_quota_max_bytes",
                    "Maximum quota (island mode: the fixed quota).",
                    limits.map(|l| l.max_bytes),
                ),
                (
                    "vtism_vm_fast_shares",
                    "Weight in the pool's share-based split.",
                    limits.map(|l| u64::from(l.shares)),
                ),
                (
                    "vtism_vm_fast_quota_share_bytes",
                    "Initial share from the configuration (island mode: the quota).",
                    Some(v.limits.share_bytes),
                ),
            ] {
                if let Some(val) = val {
                    fam(&mut e, m, "gauge", help);
                    e.sample(m, &l, val as f64);
                }
            }
            fam(
                &mut e,
                "vtism_vm_hot_set_bytes",
                "gauge",
                "Estimated hot set (the pool's demand): frames whose decayed score is at least the base score.",
            );
            e.sample("vtism_vm_hot_set_bytes", &l, hot_set as f64);
            fam(
                &mut e,
                "vtism_vm_planned_hot_bytes",
                "gauge",
                "Hot set the quota allows, from the last plan.",
            );
            e.sample("vtism_vm_planned_hot_bytes", &l, planned_hot as f64);
            fam(
                &mut e,
                "vtism_vm_quota_changes_total",
                "counter",
                "Quota changes by reason (initial, config, grow, shrink, reclaim, clamp).",
            );
            for (reason, n) in &v.quota_changes {
                e.sample(
                    "vtism_vm_quota_changes_total",
                    &[("vm", name), ("reason", reason)],
                    *n as f64,
                );
            }
            if let Some(c) = &v.last_change {
                fam(
                    &mut e,
                    "vtism_vm_quota_last_change_timestamp_seconds",
                    "gauge",
                    "Unix time of the last quota change, labelled with its reason.",
                );
                e.sample(
                    "vtism_vm_quota_last_change_timestamp_seconds",
                    &[("vm", name), ("reason", reason_label(c.reason))],
                    self.epoch_unix + c.at.0 as f64 / 1e9,
                );
            }
            fam(
                &mut e,
                "vtism_vm_moved_bytes_total",
                "counter",
                "Bytes moved by direction.",
            );
            e.sample(
                "vtism_vm_moved_bytes_total",
                &[("vm", name), ("dir", "promote")],
                v.promoted_bytes as f64,
            );
            e.sample(
                "vtism_vm_moved_bytes_total",
                &[("vm", name), ("dir", "demote")],
                v.demoted_bytes as f64,
            );
            fam(
                &mut e,
                "vtism_vm_promotions_skipped_frames_total",
                "counter",
                "Promotions dropped because the demotions before them fell short (quota kept).",
            );
            e.sample(
                "vtism_vm_promotions_skipped_frames_total",
                &l,
                v.trimmed_frames as f64,
            );
            fam(
                &mut e,
                "vtism_vm_pages_total",
                "counter",
                "Pages by move_pages outcome.",
            );
            for (o, c) in &v.outcomes {
                e.sample(
                    "vtism_vm_pages_total",
                    &[("vm", name), ("outcome", o.label())],
                    *c as f64,
                );
            }
            let c = v.reader.counters();
            fam(
                &mut e,
                "vtism_hint_rounds_accepted_total",
                "counter",
                "Hint rounds accepted.",
            );
            e.sample("vtism_hint_rounds_accepted_total", &l, c.accepted() as f64);
            fam(
                &mut e,
                "vtism_hint_rounds_rejected_total",
                "counter",
                "Hint rounds rejected, by reason.",
            );
            for (reason, n) in c.iter_rejected() {
                e.sample(
                    "vtism_hint_rounds_rejected_total",
                    &[("vm", name), ("reason", reason.label())],
                    n as f64,
                );
            }
            e.sample(
                "vtism_hint_rounds_rejected_total",
                &[("vm", name), ("reason", OVER_BUDGET)],
                v.over_budget as f64,
            );
            fam(
                &mut e,
                "vtism_vm_last_round",
                "gauge",
                "Last hint round accepted.",
            );
            e.sample("vtism_vm_last_round", &l, v.last_round as f64);
            if let Some(t) = &v.tracker_report {
                fam(
                    &mut e,
                    "vtism_vm_tracker_window_seconds",
                    "gauge",
                    "The guest tracker's observation windows (fine, coarse) at its last round.",
                );
                for (window, w) in [("fine", t.window), ("coarse", t.coarse_window)] {
                    e.sample(
                        "vtism_vm_tracker_window_seconds",
                        &[("vm", name), ("window", window)],
                        w.as_duration().as_secs_f64(),
                    );
                }
                fam(
                    &mut e,
                    "vtism_vm_tracker_cpu_seconds",
                    "gauge",
                    "CPU time the guest tracker reported for its last round.",
                );
                e.sample(
                    "vtism_vm_tracker_cpu_seconds",
                    &l,
                    t.tracker_cpu.as_duration().as_secs_f64(),
                );
            }
            fam(
                &mut e,
                "vtism_vm_channel_up",
                "gauge",
                "1 if the VM's channel is mapped.",
            );
            e.sample(
                "vtism_vm_channel_up",
                &l,
                f64::from(u8::from(v.channel.is_some())),
            );
            fam(
                &mut e,
                "vtism_vm_reconcile_sweeps_total",
                "counter",
                "Complete placement reconcile passes.",
            );
            e.sample("vtism_vm_reconcile_sweeps_total", &l, v.full_sweeps as f64);
            let rejected: BTreeMap<&str, u64> = c
                .iter_rejected()
                .filter(|(_, n)| *n > 0)
                .map(|(r, n)| (r.label(), n))
                .chain((v.over_budget > 0).then_some((OVER_BUDGET, v.over_budget)))
                .collect();
            vm_rows.push(json!({
                "id": v.id.0,
                "name": v.name,
                "pid": v.pid,
                "socket": v.socket,
                "ram_bytes": v.memory.bytes(),
                "quota_bytes": v.quota,
                "fast_bytes": s.fast_frames * FRAME_SIZE,
                "slow_bytes": s.slow_frames * FRAME_SIZE,
                "unknown_bytes": s.unknown_frames * FRAME_SIZE,
                "hot_set_bytes": hot_set,
                "planned_hot_bytes": planned_hot,
                "quota_share_bytes": v.limits.share_bytes,
                "quota_min_bytes": limits.map(|l| l.min_bytes),
                "quota_max_bytes": limits.map(|l| l.max_bytes),
                "shares": limits.map(|l| l.shares),
                "last_quota_change": v.last_change.map(|c| json!({
                    "from_bytes": c.from_bytes,
                    "to_bytes": c.to_bytes,
                    "hot_set_bytes": c.hot_set_bytes,
                    "reason": reason_label(c.reason),
                    "age_s": now_ns.0.saturating_sub(c.at.0) as f64 / 1e9,
                })),
                "quota_changes": v.quota_changes,
                "home_node": v.home,
                "channel": v.channel.as_ref().map(|c| c.path.clone()),
                "channel_problem": v.channel_problem,
                "last_round": v.last_round,
                "last_round_age_s": v.last_round_at.map(|t| t.elapsed().as_secs_f64()),
                "last_round_entries": v.last_entries,
                "channel_minor": v.channel_minor,
                "tracker_window_us": v.tracker_report.map(|t| t.window.0),
                "tracker_coarse_window_us": v.tracker_report.map(|t| t.coarse_window.0),
                "tracker_windows": v.tracker_report.map(|t| t.windows),
                "tracker_cpu_us": v.tracker_report.map(|t| t.tracker_cpu.0),
                "tracker_tracked_frames": v.tracker_report.map(|t| t.tracked_frames),
                "rounds_accepted": c.accepted(),
                "rounds_rejected": c.total_rejected() + v.over_budget,
                "rejected_by_reason": rejected,
                "promoted_bytes": v.promoted_bytes,
                "demoted_bytes": v.demoted_bytes,
                "reconcile_sweeps": v.full_sweeps,
                "attached_s": v.attached.elapsed().as_secs_f64(),
                "pages_by_outcome": v.outcomes.iter().map(|(o, c)| (o.label(), *c)).collect::<BTreeMap<_, _>>(),
            }));
        }
        let free: BTreeMap<u8, u64> = self
            .topo
            .free_bytes()
            .into_iter()
            .map(|(n, b)| (n.0, b))
            .collect();
        let queued = self
            .mover
            .gauges
            .queued
            .lock()
            .map(|q| q.clone())
            .unwrap_or_default();
        let executed = self
            .mover
            .gauges
            .executed_pages
            .lock()
            .map(|q| q.clone())
            .unwrap_or_default();
        let mut node_rows = Vec::new();
        for n in &self.topo.nodes {
            let id = n.id.to_string();
            let l = [("node", id.as_str())];
            fam(
                &mut e,
                "vtism_node_vm_resident_bytes",
                "gauge",
                "Bytes of managed guest RAM on the node.",
            );
            e.sample(
                "vtism_node_vm_resident_bytes",
                &l,
                *node_resident.get(&n.id).unwrap_or(&0) as f64,
            );
            fam(
                &mut e,
                "vtism_node_free_bytes",
                "gauge",
                "MemFree less the configured floor.",
            );
            e.sample(
                "vtism_node_free_bytes",
                &l,
                *free.get(&n.id).unwrap_or(&0) as f64,
            );
            fam(
                &mut e,
                "vtism_node_tier",
                "gauge",
                "Tier rank of the node (0 = fast).",
            );
            e.sample("vtism_node_tier", &l, f64::from(n.tier));
            for (m, kind, help, by_dir) in [
                (
                    "vtism_mover_queue_depth",
                    "gauge",
                    "Batches queued per destination node and direction.",
                    &queued,
                ),
                (
                    "vtism_mover_worker_pages_total",
                    "counter",
                    "Pages the node's mover worker handed to move_pages (batches to that node).",
                    &executed,
                ),
            ] {
                let (p, d) = by_dir.get(&n.id).copied().unwrap_or_default();
                fam(&mut e, m, kind, help);
                for (dir, v) in [(Dir::Promote, p), (Dir::Demote, d)] {
                    e.sample(m, &[("node", &id), ("dir", dir.label())], v as f64);
                }
            }
            node_rows.push(json!({
                "id": n.id, "tier": n.tier, "kernel_tier": n.kernel_tier, "cpus": n.cpus,
                "socket": n.socket, "mem_total_bytes": n.mem_total_bytes,
                "free_bytes": free.get(&n.id), "vm_resident_bytes": node_resident.get(&n.id).unwrap_or(&0),
                "worker_node": n.worker_node,
            }));
        }
        if let Some(h) = &self.totals.latency {
            h.expose(
                &mut e,
                "vtism_mover_batch_latency_seconds",
                "move_pages call latency per batch.",
            );
        }
        if let Some(h) = &self.totals.job_seconds {
            h.expose(
                &mut e,
                "vtism_mover_plan_seconds",
                "Time to execute one plan.",
            );
        }
        let cpu = sys::process_cpu_seconds();
        fam(
            &mut e,
            "vtism_process_cpu_seconds_total",
            "counter",
            "Daemon CPU time (user + system).",
        );
        e.sample("vtism_process_cpu_seconds_total", &[], cpu);
        fam(
            &mut e,
            "vtism_round_cpu_seconds_total",
            "counter",
            "Main-loop CPU time spent in rounds.",
        );
        e.sample(
            "vtism_round_cpu_seconds_total",
            &[],
            self.totals.round_cpu_seconds,
        );
        fam(&mut e, "vtism_rounds_total", "counter", "Rounds run.");
        e.sample("vtism_rounds_total", &[], self.totals.rounds as f64);
        fam(
            &mut e,
            "vtism_round_seconds",
            "gauge",
            "Wall time of the last round.",
        );
        e.sample("vtism_round_seconds", &[], self.totals.last_round_seconds);
        fam(
            &mut e,
            "vtism_plans_total",
            "counter",
            "Non-empty plans handed to the mover.",
        );
        e.sample("vtism_plans_total", &[], self.totals.plans as f64);
        fam(
            &mut e,
            "vtism_mover_busy",
            "gauge",
            "1 while a plan is being executed.",
        );
        e.sample(
            "vtism_mover_busy",
            &[],
            f64::from(u8::from(self.mover.busy())),
        );
        fam(&mut e, "vtism_vms", "gauge", "VMs managed.");
        e.sample("vtism_vms", &[], self.vms.len() as f64);
        fam(
            &mut e,
            "vtism_engine_memory_bytes",
            "gauge",
            "Heap held by the engine.",
        );
        e.sample(
            "vtism_engine_memory_bytes",
            &[],
            self.engine.memory_bytes() as f64,
        );
        let managed_gib: f64 = self
            .vms
            .values()
            .map(|v| v.memory.bytes() as f64)
            .sum::<f64>()
            / (1u64 << 30) as f64;
        let pool_mode = self.cfg.pool.mode.label();
        let pool_bytes = (self.cfg.pool.mode == crate::config::PoolModeConfig::Pool)
            .then(|| self.pool.params().fast_bytes);
        fam(
            &mut e,
            "vtism_pool_mode",
            "gauge",
            "1 for the mode quotas are set in (island: fixed; pool: by hot set).",
        );
        e.sample("vtism_pool_mode", &[("mode", pool_mode)], 1.0);
        if let Some(b) = pool_bytes {
            fam(
                &mut e,
                "vtism_pool_fast_bytes",
                "gauge",
                "Fast memory the pool hands out.",
            );
            e.sample("vtism_pool_fast_bytes", &[], b as f64);
        }
        fam(
            &mut e,
            "vtism_pool_allocated_bytes",
            "gauge",
            "Sum of the VMs' quotas.",
        );
        e.sample(
            "vtism_pool_allocated_bytes",
            &[],
            self.pool.allocated_bytes() as f64,
        );
        let status = json!({
            "daemon": {
                "pid": std::process::id(),
                "uptime_s": self.epoch.elapsed().as_secs_f64(),
                "rounds": self.totals.rounds,
                "plans": self.totals.plans,
                "planned_bytes": self.totals.planned_bytes,
                "cpu_seconds": cpu,
                "round_cpu_seconds": self.totals.round_cpu_seconds,
                "managed_gib": managed_gib,
                "mover_busy": self.mover.busy(),
                "mover_jobs": self.mover.gauges.jobs.load(Ordering::Relaxed),
                "vms_dropped": self.totals.vms_dropped,
                "interval_ms": self.cfg.daemon.interval_ms,
                "metrics": self.metrics_addr.map(|a| a.to_string()),
            },
            "pool": {
                "mode": pool_mode,
                "fast_bytes": pool_bytes,
                "allocated_bytes": self.pool.allocated_bytes(),
                "rebalance_interval_ms": self.cfg.pool.rebalance_interval_ms,
            },
            "vms": vm_rows,
            "nodes": node_rows,
        });
        if let Ok(mut s) = self.shared.lock() {
            s.metrics = e.finish();
            s.status = status;
        }
    }

    /// The status as `vtism ctl status` sees it (tests).
    pub fn status(&self) -> serde_json::Value {
        self.shared
            .lock()
            .map(|s| s.status.clone())
            .unwrap_or_default()
    }
}

/// Writes the host's feedback into the VM's channel: the last round taken, the budget, the
/// interval floor, the VM's fast quota, the rejected rounds.
fn feedback(c: &crate::config::ChannelConfig, v: &ManagedVm) {
    let Some(ch) = &v.channel else { return };
    let fb = Feedback {
        ack_round: v.reader.last_round(),
        entry_budget: c.entry_budget,
        min_interval_ms: c.min_interval_ms,
        last_status: v.reader.last_status(),
        fast_quota_bytes: v.quota,
        rejected_rounds: v.reader.counters().total_rejected() + v.over_budget,
        host_version: HOST_VERSION,
    };
    if let Err(e) = write_feedback(&ch.region, &fb) {
        debug!(vm = %v.name, error = %e, "feedback");
    }
}

/// Queries where `gfns` (at `addrs` in QEMU) are and tells the engine what differs from its
/// belief, in runs. Returns the number of frames whose placement changed.
fn query_and_learn(
    engine: &mut VtismPolicy,
    topo: &HostTopology,
    v: &ManagedVm,
    gfns: &[Gfn],
    addrs: &[u64],
) -> std::io::Result<u64> {
    let mut status = vec![0i32; addrs.len()];
    sys::move_pages(v.pid, addrs, None, &mut status, 0)?;
    let mut changes = 0u64;
    // Runs of consecutive frames in one RAM range with the same new node.
    let mut run: Option<(Gfn, u64, Option<NodeId>)> = None;
    let flush = |run: &mut Option<(Gfn, u64, Option<NodeId>)>, engine: &mut VtismPolicy| {
        if let Some((g, n, node)) = run.take() {
            let _ = engine.set_placement(v.id, g, n, node);
        }
    };
    for (k, &g) in gfns.iter().enumerate() {
        let st = status[k];
        let node = (st >= 0 && topo.node(st as u8).is_some()).then_some(NodeId(st as u8));
        let believed = engine.frame_node(v.id, g).ok().flatten();
        if believed == node {
            flush(&mut run, engine);
            continue;
        }
        changes += 1;
        match &mut run {
            Some((rg, rn, rnode))
                if *rnode == node
                    && rg.0 + *rn == g.0
                    && v.memory.ram.contains_span(*rg, *rn + 1) =>
            {
                *rn += 1
            }
            _ => {
                flush(&mut run, engine);
                run = Some((g, 1, node));
            }
        }
    }
    flush(&mut run, engine);
    Ok(changes)
}

/// Sockets under `dir` (up to `depth` levels) that look like QMP monitors for vtismd.
pub fn scan_dir(dir: &Path, depth: u32, any: bool, out: &mut Vec<PathBuf>) {
    use std::os::unix::fs::FileTypeExt;
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let Ok(ft) = e.file_type() else { continue };
        let p = e.path();
        if ft.is_dir() && depth > 1 {
            scan_dir(&p, depth - 1, any, out);
        } else if ft.is_socket() {
            let name = e.file_name().to_string_lossy().to_string();
            let wanted = name.ends_with(".qmp")
                || name.ends_with(".qmp.sock")
                || name == "vtism.sock"
                || name == "qmp.sock";
            // libvirt's own monitor is exclusive to libvirtd: never steal it.
            if name == "monitor.sock" {
                continue;
            }
            if wanted || any {
                out.push(p);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    #[test]
    fn scan_finds_qmp_sockets_but_never_libvirts_monitor() {
        let d = std::env::temp_dir().join(format!("vtism-scan-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let dom = d.join("domain-3-web1");
        std::fs::create_dir_all(dom.join("deeper/still")).unwrap();
        let _l: Vec<UnixListener> = [
            d.join("a.qmp"),
            dom.join("monitor.sock"),
            dom.join("vtism.sock"),
            dom.join("other.sock"),
            dom.join("deeper/still/far.qmp"),
        ]
        .iter()
        .map(|p| UnixListener::bind(p).unwrap())
        .collect();
        std::fs::write(d.join("b.qmp"), b"not a socket").unwrap();
        let mut out = Vec::new();
        scan_dir(&d, 2, false, &mut out);
        out.sort();
        assert_eq!(out, vec![d.join("a.qmp"), dom.join("vtism.sock")]);
        let mut any = Vec::new();
        scan_dir(&d, 2, true, &mut any);
        assert!(any.contains(&dom.join("other.sock")));
        assert!(!any.contains(&dom.join("monitor.sock")));
        let mut none = Vec::new();
        scan_dir(&d.join("missing"), 2, true, &mut none);
        assert!(none.is_empty());
        let _ = std::fs::remove_dir_all(&d);
    }
}
