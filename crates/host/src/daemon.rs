//! The daemon's main loop: it wires the parts, each of which owns its state. Every round:
//! discovery finds VMs and the registry watches the managed ones; the channels read each
//! guest's hints (where hints enter) into the tiering round; reconcile tells it where pages
//! really are; the round (`vtism_engine::Tiering`: pool, plan, rate allowances) decides; the
//! mover moves; the status and metrics are published. One VM's trouble (a dead monitor, a
//! hostile channel, a failed re-registration) lets that VM go and touches no other.

use crate::admission::{Refusal, RulesInForce};
use crate::backing;
use crate::batch::{CallSettings, VmTarget};
use crate::channels::Channels;
use crate::config::{Config, HostTrackingMode, NotManaged, PoolModeConfig};
use crate::discovery::{Discovery, Found};
use crate::host_tracking::{self, HostTracking, TrackedVm};
use crate::kernel_tiering::KernelTieringWatch;
use crate::metrics::{
    reason_label, DaemonStatus, LeftOut, MoverHistograms, NodeStatus, PerDirection, PoolStatus,
    Published, QuotaChangeStatus, Status, TrackerStatus, VmStatus,
};
use crate::mover::{MoveTotals, Mover, MoverGauges, MoverSettings, PerNodeDir};
use crate::rate::Limits;
use crate::reconcile::{self, Reconcile};
use crate::registry::{self, ManagedVm, Registry, Watch};
use crate::serve::{self, CtlRequest};
use crate::sys;
use crate::topology::HostTopology;
use crate::vm;
use anyhow::Context;
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};
use vtism_engine::{
    Direction, FastPool, MoveKind, Nanos, NodeId, Observation, PlanContext, QuotaChange,
    SplitRequest, Tiering, VmId, VmLimits, VmSpec, VtismPolicy,
};
use vtism_proto::{Gfn, FRAME_SIZE};

/// Counters kept across reloads.
#[derive(Default)]
struct Totals {
    rounds: u64,
    plans: u64,
    last_round_seconds: f64,
    round_cpu_seconds: f64,
    planned_bytes: u64,
    /// Bytes of the plans handed to the mover, by kind of move.
    planned_by_kind: BTreeMap<&'static str, u64>,
    /// Bytes demoted to restore fast nodes' free watermark.
    watermark_bytes: u64,
    /// VMs let go because their channel file changed under the daemon, by fault.
    channel_faults: BTreeMap<&'static str, u64>,
}

pub struct Daemon {
    cfg: Config,
    config_path: Option<PathBuf>,
    topo: HostTopology,
    /// The engine and the fast-memory pool: the tiering round the simulator runs too.
    tiering: Tiering,
    discovery: Discovery,
    /// Who may be a VM (admission), resolved per configuration.
    rules: RulesInForce,
    registry: Registry,
    channels: Channels,
    /// DAMON on the host, for VMs without a tracker.
    host_tracking: HostTracking,
    /// The kernel's NUMA balancing and demotion, which move guest pages too.
    kernel_tiering: KernelTieringWatch,
    reconcile: Reconcile,
    mover: Mover,
    moved: MoveTotals,
    histograms: MoverHistograms,
    /// Quota changes per VM, by reason.
    quota_changes: BTreeMap<VmId, BTreeMap<&'static str, u64>>,
    totals: Totals,
    epoch: Instant,
    /// Wall-clock time of `epoch`, for the timestamps of quota changes.
    epoch_unix: f64,
    published: Arc<Published>,
    ctl_rx: mpsc::Receiver<CtlRequest>,
    ctl_tx: mpsc::Sender<CtlRequest>,
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
    pub metrics_addr: Option<std::net::SocketAddr>,
}

fn start_mover(cfg: &Config, topo: &HostTopology) -> Mover {
    let nodes: Vec<(NodeId, Vec<u32>)> = topo
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
    let m = &cfg.mover;
    let settings = MoverSettings {
        batch_pages: m.batch_pages,
        call: CallSettings {
            busy_retries: m.busy_retries,
            busy_retry_delay: Duration::from_millis(m.busy_retry_delay_ms),
            move_all: m.move_all,
            madvise_cold: m.madvise_cold,
        },
        parallel_sources: m.parallel_sources,
        demote_nice: m.demote_nice,
    };
    Mover::start(
        &nodes,
        settings,
        Limits::new(m.promote_mbps, m.demote_mbps, m.burst_s, Instant::now()),
    )
}

fn make_engine(cfg: &Config, topo: &HostTopology) -> anyhow::Result<VtismPolicy> {
    VtismPolicy::new(topo.engine.clone(), cfg.engine.clone())
        .map_err(|e| anyhow::anyhow!("engine.{}: {}", e.field, e.problem))
}

/// A move kind as a metric label.
fn kind_label(k: MoveKind) -> &'static str {
    match k {
        MoveKind::Promote => "promote",
        MoveKind::Demote => "demote",
        MoveKind::Refill => "refill",
        MoveKind::Home => "home",
        MoveKind::NearSlow => "near_slow",
    }
}

fn mib(b: u64) -> f64 {
    b as f64 / (1u64 << 20) as f64
}

impl Daemon {
    pub fn new(cfg: Config, config_path: Option<PathBuf>) -> anyhow::Result<Daemon> {
        let topo = HostTopology::read(&cfg.daemon.sysfs_root, &cfg.topology)
            .context("reading the NUMA topology")?;
        for n in &topo.nodes {
            info!(
                node = n.id.0,
                tier = n.tier.0,
                kernel_tier = ?n.kernel_tier,
                cpus = n.cpus.len(),
                mem_mib = n.mem_total_bytes >> 20,
                socket = n.socket,
                worker_node = n.worker_node.0,
                "numa node"
            );
        }
        let engine = make_engine(&cfg, &topo)?;
        let pool = FastPool::new(cfg.pool_params(topo.fast_capacity_bytes())?)?;
        match cfg.pool.mode {
            PoolModeConfig::Pool => info!(
                fast_mib = pool.params().fast_bytes >> 20,
                fast_nodes_mib = topo.fast_capacity_bytes() >> 20,
                "fast memory: one pool, quotas follow each VM's hot set"
            ),
            PoolModeConfig::Island => info!("fast memory: island mode, fixed quotas"),
        }
        let mover = start_mover(&cfg, &topo);
        let histograms = MoverHistograms::default();
        let (ctl_tx, ctl_rx) = mpsc::channel();
        // Next to the control socket, in vtismd's own runtime directory.
        let kdamond_record = host_tracking::record_path(&cfg.daemon.control_socket);
        host_tracking::reclaim_left_behind(&cfg.host_tracking, &kdamond_record);
        let host_tracking = HostTracking::new(&cfg.host_tracking, kdamond_record);
        let rules = RulesInForce::new(&cfg.admission);
        let mut d = Daemon {
            tiering: Tiering::new(engine, pool),
            cfg,
            config_path,
            topo,
            discovery: Discovery::default(),
            rules,
            registry: Registry::default(),
            channels: Channels::default(),
            host_tracking,
            kernel_tiering: KernelTieringWatch::start(PathBuf::from("/")),
            reconcile: Reconcile::default(),
            mover,
            moved: MoveTotals::default(),
            published: Arc::new(Published::new(&histograms)),
            histograms,
            quota_changes: BTreeMap::new(),
            totals: Totals::default(),
            epoch: Instant::now(),
            epoch_unix: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64()),
            ctl_rx,
            ctl_tx,
            stop: Arc::new(AtomicBool::new(false)),
            threads: Vec::new(),
            metrics_addr: None,
        };
        d.start_servers()?;
        Ok(d)
    }

    fn start_servers(&mut self) -> anyhow::Result<()> {
        let listen = &self.cfg.daemon.metrics_listen;
        if !listen.is_empty() {
            let (h, addr) = serve::spawn_metrics(listen, self.published.clone(), self.stop.clone())
                .with_context(|| format!("daemon.metrics_listen: cannot listen on {listen}"))?;
            info!(%addr, "metrics on http://{addr}/metrics");
            if !addr.ip().is_loopback() {
                warn!(%addr, "the metrics endpoint is reachable from other hosts (VM names, counts)");
            }
            self.metrics_addr = Some(addr);
            self.threads.push(h);
        }
        let sock = &self.cfg.daemon.control_socket;
        if !sock.as_os_str().is_empty() {
            let h = serve::spawn_control(
                sock,
                self.published.clone(),
                self.ctl_tx.clone(),
                self.stop.clone(),
            )
            .with_context(|| format!("daemon.control_socket: cannot bind {}", sock.display()))?;
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
        self.host_tracking.shutdown();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }

    /// One round. Public so tests can step the daemon.
    pub fn round(&mut self) {
        let t0 = Instant::now();
        let cpu0 = sys::thread_cpu_seconds();
        self.totals.rounds += 1;
        self.serve_requests();
        self.rules.refresh();
        self.kernel_tiering.refresh(t0);
        self.discovery
            .scan(&self.cfg, self.rules.get(), &self.registry.sockets());
        for found in self.discovery.finished() {
            self.attach(found);
        }
        // The finished plan's report first: while a plan is in flight the periodic refresh of
        // each VM (memory map, home node) waits, and a plan submitted every round would
        // otherwise look in flight at every refresh and starve it.
        if let Some(r) = self.mover.poll() {
            self.plan_done(r);
        }
        self.watch_vms();
        self.read_channels();
        self.track_on_host();
        if !self.mover.busy() {
            self.reconcile_placement();
            self.plan_and_submit();
        }
        self.totals.last_round_seconds = t0.elapsed().as_secs_f64();
        self.totals.round_cpu_seconds += sys::thread_cpu_seconds() - cpu0;
        self.published.publish(self.snapshot());
    }

    /// The status as `vtism ctl status` sees it (tests).
    pub fn status(&self) -> serde_json::Value {
        self.published.status_json()
    }

    /// Sockets discovery refused or could not attach, and VMs dropped for lying about their
    /// memory (also in the status and the metrics).
    pub fn admission_counts(&self) -> (&crate::admission::Counts, u64) {
        (&self.discovery.counts, self.registry.dropped_lying)
    }

    // VMs come and go.

    /// Starts managing a VM discovery found, if the configuration and the pool take it.
    fn attach(&mut self, f: Found) {
        let socket = f.socket.clone();
        match self.admit(f) {
            Ok(Some(id)) => {
                self.discovery.taken(&socket);
                debug!(vm = %id, socket = %socket.display(), "attached");
            }
            Ok(None) => self.discovery.refused(socket),
            Err(e) => {
                self.discovery.counts.failed += 1;
                warn!(socket = %socket.display(), error = %format!("{e:#}"), "cannot attach VM; will retry");
                self.discovery.refused(socket);
            }
        }
    }

    /// `Ok(None)`: not ours to manage.
    fn admit(&mut self, f: Found) -> anyhow::Result<Option<VmId>> {
        let Found {
            socket,
            qmp,
            info,
            identity,
        } = f;
        if self.registry.has_pid(qmp.pid) {
            return Ok(None); // a second monitor of a VM already managed
        }
        match self.cfg.manages(&info.name, &socket) {
            Ok(()) => {}
            Err(NotManaged::Ignored) => {
                info!(vm = %info.name, "ignored by the configuration");
                return Ok(None);
            }
            Err(NotManaged::NotListed) => {
                debug!(vm = %info.name, "no [[vm]] entry and defaults.manage_discovered = false");
                return Ok(None);
            }
        }
        let settings = self
            .cfg
            .vm_settings(&info.name, &socket, info.memory.bytes());
        // One live VM per [[vm]] entry: a second process claiming an entry (by name, for an
        // entry without a socket) gets neither its channel nor its quota.
        if let Some((i, holder)) = settings.entry.and_then(|i| {
            let v = self.registry.iter().find(|v| v.settings.entry == Some(i))?;
            Some((i, v))
        }) {
            let r = Refusal::EntryInUse {
                pid: qmp.pid,
                entry: settings
                    .entry_name
                    .clone()
                    .unwrap_or_else(|| format!("vm[{i}]")),
                holder: holder.name.clone(),
            };
            self.discovery.refuse(socket, &r);
            return Ok(None);
        }
        let managed = self.registry.ram_bytes(None);
        if let Err(r) = self
            .rules
            .get()
            .check_total(qmp.pid, info.memory.bytes(), managed)
        {
            self.discovery.refuse(socket, &r);
            return Ok(None);
        }
        let topo = &self.topo;
        let home = settings
            .home_node
            .or_else(|| vm::home_node(info.pid, &info.vcpu_threads, |c| topo.node_of_cpu(c)))
            .filter(|h| topo.node(*h).is_some());
        // The pool admits the VM only if its guaranteed minimum fits beside the others'; if
        // not, the VM is left alone (retried later: another VM may go away).
        let id = self.registry.next_id();
        let initial = self.tiering.add_vm(
            VmSpec {
                id,
                ram: info.memory.ram.clone(),
                fast_quota_bytes: 0,
                home_node: home,
            },
            settings.pool_limits,
            self.now(),
        )?;
        let name = if info.name.is_empty() {
            settings
                .entry_name
                .clone()
                .unwrap_or_else(|| format!("pid{}", info.pid))
        } else {
            info.name.clone()
        };
        self.channels.attach(
            id,
            &name,
            &info,
            settings.channel.as_deref(),
            &self.cfg.channel,
            initial.to_bytes,
        );
        {
            let now = Instant::now();
            let mut l = self.mover.limits.lock().unwrap_or_else(|e| e.into_inner());
            l.set_vm(id, settings.promote_mbps, settings.demote_mbps, now);
            l.set_own_rates(id, settings.own_rates, now);
            l.follow_quotas(std::slice::from_ref(&initial), now);
        }
        self.reconcile.restart(id);
        self.count_quota_change(&initial);
        let l = settings.pool_limits;
        let status = self.channels.status(id);
        info!(
            vm = %name, id = %id, pid = info.pid, socket = %socket.display(),
            ram_mib = info.memory.bytes() >> 20, ranges = info.memory.ranges.len(),
            quota_mib = initial.to_bytes >> 20, min_mib = l.min_bytes >> 20,
            max_mib = l.max_bytes >> 20, shares = l.shares, home = ?home.map(|h| h.0),
            channel = ?status.path.map(|p| p.display().to_string()),
            channel_problem = ?status.problem,
            qemu = ?info.qemu_version,
            "managing VM"
        );
        self.registry
            .insert(name, socket, qmp, info, identity, home, settings);
        self.place_folios(id);
        Ok(Some(id))
    }

    /// Lets a VM go, everywhere.
    fn drop_vm(&mut self, id: VmId, why: &str) {
        let Some(v) = self.registry.remove(id) else {
            return;
        };
        info!(vm = %v.name, id = %id, reason = why, "no longer managing VM");
        self.tiering.remove_vm(id);
        self.channels.remove(id);
        self.host_tracking.remove(id);
        self.reconcile.remove(id);
        self.moved.remove_vm(id);
        self.quota_changes.remove(&id);
        self.mover
            .limits
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove_vm(id);
    }

    /// QMP events, liveness, and the periodic re-read of each VM.
    fn watch_vms(&mut self) {
        for id in self.registry.ids() {
            match self.registry.watch(
                id,
                &self.cfg,
                !self.mover.busy(),
                &self.topo,
                self.rules.get(),
            ) {
                Watch::Quiet => {}
                Watch::Gone(why) => self.drop_vm(id, &why),
                Watch::RefreshFailed(e) => {
                    warn!(vm = %id, error = %format!("{e:#}"), "refresh failed")
                }
                Watch::Refreshed {
                    info,
                    resync,
                    reregister,
                    rehomed,
                } => {
                    if resync {
                        // The guest restarted: its tracker re-initialises the channel.
                        self.channels.restart(id);
                    }
                    if let Some(v) = self.registry.get(id) {
                        let configured = v.settings.channel.clone();
                        self.channels.reopen_if_missing(
                            id,
                            &info,
                            configured.as_deref(),
                            &self.cfg.channel,
                        );
                    }
                    if reregister {
                        self.reregister(id);
                    } else {
                        if resync {
                            self.forget_hotness(id);
                        }
                        if rehomed {
                            self.rehome(id);
                        }
                    }
                    self.place_folios(id);
                }
            }
        }
    }

    /// The engine places the VM's host folios whole (a move of one page of a THP or hugetlbfs
    /// page moves all of it), as the last read of its backing found them. While the backing
    /// cannot be read, the engine keeps what it was told last.
    fn place_folios(&mut self, id: VmId) {
        let Some(v) = self.registry.get(id) else {
            return;
        };
        let Ok(b) = &v.backing else {
            return;
        };
        let f = backing::folios(&v.memory, b);
        let pinned = backing::unmovable(&v.memory, b);
        let name = v.name.clone();
        let last = v.folios;
        let last_pinned = v.pinned_frames;
        self.follow_splits(id, &f.heads);
        if f.assumed == 0 {
            if let Some(v) = self.registry.get(id) {
                reconcile::learn_folios(&mut self.tiering, v, &f.heads, &self.topo);
            }
        }
        match self.tiering.set_pinned(id, pinned) {
            Ok(n) if n != last_pinned => {
                if n > 0 {
                    warn!(
                        vm = %name, mib = n >> 8,
                        "guest RAM on hugetlbfs pages larger than 2 MiB: left where it is (the \
                         kernel moves such a page only whole, into a free page of the target \
                         node's pool)"
                    );
                }
                if let Some(v) = self.registry.get_mut(id) {
                    v.pinned_frames = n;
                }
            }
            Ok(_) => {}
            Err(e) => warn!(vm = %name, error = %e, "unmovable guest RAM not set"),
        }
        match self.tiering.set_host_folios(id, f.heads) {
            Ok(n) if n != last => {
                info!(
                    vm = %name, folios = n, from = last, assumed = f.assumed,
                    "host folios: 2 MiB blocks placed whole"
                );
                if f.misaligned_bytes > 0 {
                    warn!(
                        vm = %name, mib = f.misaligned_bytes >> 20,
                        "guest RAM on huge pages at host addresses not aligned with the guest's: \
                         its moves can take more than the quota counts"
                    );
                }
                if let Some(v) = self.registry.get_mut(id) {
                    v.folios = n;
                }
            }
            Ok(_) => {}
            Err(e) => warn!(vm = %name, error = %e, "host folios not set"),
        }
    }

    /// A VM whose vCPUs moved to another node: promotions and demotions go near the new home;
    /// hotness and placement are kept (vCPU threads that the scheduler moves between sockets
    /// every minute must not make the engine relearn the VM each time).
    fn rehome(&mut self, id: VmId) {
        let Some(v) = self.registry.get(id) else {
            return;
        };
        if let Err(e) = self.tiering.set_home(id, v.home) {
            // The old home stays in effect (a node the engine's topology lacks).
            warn!(vm = %v.name, error = %e, "home node not changed");
        }
    }

    /// A VM whose guest restarted on the same memory map: the engine forgets its hotness and
    /// keeps where its pages are (they did not move), so no placement sweep starts over.
    fn forget_hotness(&mut self, id: VmId) {
        if let Err(e) = self.tiering.forget_hotness(id) {
            warn!(vm = %id, error = %e, "hotness not forgotten");
        }
    }

    /// A VM whose memory map changed: its limits follow its RAM, and the engine forgets its
    /// hotness and learns its placement again.
    fn reregister(&mut self, id: VmId) {
        let Some(v) = self.registry.get(id) else {
            return;
        };
        // A map that grew past what all VMs may claim together lets the VM go (counted as at
        // attach, where it is refused until the others leave room).
        let others = self.registry.ram_bytes(Some(id));
        if let Err(r) = self
            .rules
            .get()
            .check_total(v.pid, v.memory.bytes(), others)
        {
            let socket = v.socket.clone();
            self.drop_vm(id, &r.to_string());
            self.discovery.refuse(socket, &r);
            return;
        }
        let settings = self.cfg.vm_settings(&v.name, &v.socket, v.memory.bytes());
        // Limits in % of a share in % of RAM follow the new RAM size; limits the pool cannot
        // honour (the minimums no longer fit) keep the old ones.
        if settings.limits != v.settings.limits {
            let name = v.name.clone();
            match self
                .tiering
                .set_limits(id, settings.pool_limits, self.now())
            {
                Ok(changes) => {
                    if let Some(v) = self.registry.get_mut(id) {
                        v.settings = settings;
                    }
                    self.report_quota_changes(&changes);
                }
                Err(e) => warn!(vm = %name, error = %e, "new limits not applied"),
            }
        }
        let Some(v) = self.registry.get(id) else {
            return;
        };
        let spec = VmSpec {
            id,
            ram: v.memory.ram.clone(),
            fast_quota_bytes: 0,
            home_node: v.home,
        };
        match self.tiering.reregister_vm(spec) {
            Ok(()) => self.reconcile.restart(id),
            Err(e) => self.drop_vm(id, &e.to_string()),
        }
    }

    // Facts in.

    /// Each guest's next hint round, validated, goes to the engine; the guest gets its feedback.
    /// A VM whose channel file was truncated, resized or replaced is let go (and not taken again
    /// before discovery's back-off).
    fn read_channels(&mut self) {
        let now = self.now();
        let mut faulted = Vec::new();
        for v in self.registry.iter() {
            if let Err(f) = self.channels.check(v.id) {
                faulted.push((v.id, v.socket.clone(), f));
                continue;
            }
            if let Some(round) = self.channels.read(v.id, &v.memory.ram, &self.cfg.channel) {
                let obs = Observation::Hints {
                    entries: &round.entries,
                    overflow: round.overflow(),
                    counts: round.counts(),
                };
                match self.tiering.observe(v.id, obs, now) {
                    Ok(st) if st.ignored > 0 => {
                        warn!(vm = %v.name, ignored = st.ignored, "engine ignored entries")
                    }
                    Ok(_) => {}
                    Err(e) => warn!(vm = %v.name, error = %e, "observe"),
                }
                if !self.mover.busy() {
                    reconcile::learn_hinted(&mut self.tiering, v, &round.entries, &self.topo);
                }
                self.channels.recycle(v.id, round);
            }
            self.channels.feedback(v.id, &self.cfg.channel);
        }
        for (id, socket, f) in faulted {
            warn!(vm = %id, fault = %f, "channel file tampered with; letting the VM go");
            *self.totals.channel_faults.entry(f.label()).or_default() += 1;
            self.drop_vm(id, &f.to_string());
            self.discovery.refused(socket);
        }
    }

    /// DAMON on the host: the VMs it should watch (by their `host_tracking` mode: `auto` means
    /// without a channel), and what it saw since the last round as host-side observations.
    fn track_on_host(&mut self) {
        let wanted: Vec<TrackedVm> = self
            .registry
            .iter()
            .filter(|v| match v.settings.host_tracking {
                HostTrackingMode::Off => false,
                HostTrackingMode::On => true,
                HostTrackingMode::Auto => !self.channels.is_mapped(v.id),
            })
            .filter_map(|v| Some(TrackedVm::new(v.id, u32::try_from(v.pid).ok()?, &v.memory)))
            .collect();
        self.host_tracking
            .set_targets(wanted, &self.cfg.host_tracking);
        let now = self.now();
        for v in self.registry.iter() {
            let Some(acc) = self.host_tracking.take_accesses(v.id, &v.memory) else {
                continue;
            };
            // An empty report is a signal too: DAMON watched and saw no access.
            if let Err(e) = self.tiering.observe(v.id, Observation::Accesses(acc), now) {
                warn!(vm = %v.name, error = %e, "host-side observation");
            }
        }
    }

    /// This round's slice of every VM's placement, from the kernel.
    fn reconcile_placement(&mut self) {
        let first = self
            .reconcile
            .first_sweeps(self.registry.iter().map(|v| v.id));
        for v in self.registry.iter() {
            self.reconcile.sweep(
                &mut self.tiering,
                v,
                &self.topo,
                &self.cfg.mover,
                self.cfg.daemon.interval_ms,
                first,
            );
        }
    }

    /// A finished plan: its statistics, and where the pages that did not move are.
    fn plan_done(&mut self, r: crate::mover::JobReport) {
        self.warn_if_slow(&r);
        self.histograms.record(&r);
        self.moved.record(&r);
        self.tiering.learn(r.facts);
        for vm in r.gone {
            self.drop_vm(vm, "QEMU process gone during a move");
        }
    }

    // Decisions and moves out.

    /// The tiering round: quota changes to the guests, the moves to the mover.
    fn plan_and_submit(&mut self) {
        let crate::topology::NodeMemory { free, short } = self.topo.node_memory();
        let window = Duration::from_millis(self.cfg.daemon.interval_ms);
        let (budget, allowances) = {
            let mut l = self.mover.limits.lock().unwrap_or_else(|e| e.into_inner());
            l.round_inputs(window, Instant::now())
        };
        let ctx = PlanContext {
            node_free_bytes: &free,
            budget_bytes: budget,
            node_short_bytes: &short,
        };
        let out = self.tiering.round(&ctx, &allowances, self.now());
        self.report_quota_changes(&out.quota_changes);
        self.split_folios(&out.splits);
        if out.plan.is_empty() && out.deferred.is_empty() {
            return;
        }
        self.totals.plans += 1;
        self.totals.planned_bytes += out.planned_bytes();
        self.totals.watermark_bytes += out.plan.stats.watermark_bytes;
        for m in &out.plan.moves {
            *self
                .totals
                .planned_by_kind
                .entry(kind_label(m.kind))
                .or_default() += m.frames * FRAME_SIZE;
        }
        debug!(
            moves = out.plan.moves.len(),
            deferred = out.deferred.len(),
            promote_mib = out.plan.stats.promote_bytes >> 20,
            demote_mib = out.plan.stats.demote_bytes >> 20,
            "plan"
        );
        if out.plan.stats.watermark_bytes > 0 {
            info!(
                demote_kib = out.plan.stats.watermark_bytes >> 10,
                nodes = ?short.iter().map(|s| s.0 .0).collect::<Vec<_>>(),
                "fast node below its free watermark (topology.free_watermark_mib): demoting the coldest frames of managed VMs there"
            );
        }
        self.log_small_plan(&out.plan.moves);
        let vms: HashMap<VmId, VmTarget> = self
            .registry
            .iter()
            .map(|v| {
                let t = VmTarget {
                    pid: v.pid,
                    memory: v.memory.clone(),
                    hugetlb: v
                        .backing
                        .as_ref()
                        .map_or_else(|_| Vec::new(), |b| backing::hugetlb_spans(&v.memory, b)),
                };
                (v.id, t)
            })
            .collect();
        self.mover.submit(out.plan.moves, vms);
    }

    /// A plan that ran long held every VM's next plan back (one plan executes at a time): the
    /// log says how long and which batch it waited for.
    fn warn_if_slow(&self, r: &crate::mover::JobReport) {
        const SLOW: Duration = Duration::from_secs(10);
        if r.elapsed < SLOW {
            return;
        }
        let Some(b) = &r.slowest else {
            return;
        };
        let name = self.registry.get(b.vm).map_or("?", |v| v.name.as_str());
        warn!(
            seconds = format_args!("{:.1}", r.elapsed.as_secs_f64()),
            batches = r.batches,
            slowest_vm = %name,
            slowest_dir = ?b.dir,
            slowest_from = b.from.0,
            slowest_to = b.to.0,
            slowest_kib = (b.frames * FRAME_SIZE) >> 10,
            slowest_queued_s = format_args!("{:.1}", b.waited),
            slowest_moving_s = format_args!("{:.1}", b.moving),
            "a plan took long; no VM's next plan could start meanwhile"
        );
    }

    /// Each move of a plan of a few (a converged host moves little, and then each move says
    /// something: a churn check that fails shows which frames went where, and why).
    fn log_small_plan(&self, moves: &[vtism_engine::Move]) {
        const FEW: usize = 16;
        if moves.len() > FEW || !tracing::enabled!(tracing::Level::DEBUG) {
            return;
        }
        for m in moves {
            let name = self.registry.get(m.vm).map_or("?", |v| v.name.as_str());
            debug!(
                vm = %name, gfn = %format_args!("{:#x}", m.gfn.0), kib = m.bytes() >> 10,
                from = m.from.0, to = m.to.0, kind = ?m.kind, "move"
            );
        }
    }

    /// What became of the blocks vtismd split, as a backing read finds them: seen split, or
    /// mapped huge again once they were (khugepaged collapsed them: counted and logged, and the
    /// engine may ask again). A block still huge at the first read after its split was not
    /// split (the kernel declined): forgotten.
    fn follow_splits(&mut self, id: VmId, heads: &[Gfn]) {
        let Some(v) = self.registry.get_mut(id) else {
            return;
        };
        let again = registry::follow_splits(&mut v.split_heads, heads);
        if again > 0 {
            v.folio_recollapses += again;
            info!(
                vm = %v.name, blocks = again, total = v.folio_recollapses,
                "split host folios mapped huge again (khugepaged collapsed them)"
            );
        }
    }

    /// Folios the engine would place better split: each THP vtismd knows to be one (its block
    /// mapped huge by `PAGEMAP_SCAN`) is queued for the VM's next re-read, which splits it and
    /// then reads the backing (`registry::split_thps`). A hugetlbfs page cannot be split, and on
    /// a kernel without `PAGEMAP_SCAN` a split could not be seen: those are left whole.
    fn split_folios(&mut self, requests: &[SplitRequest]) {
        for r in requests {
            let Some(v) = self.registry.get_mut(r.vm) else {
                continue;
            };
            let Ok(backing) = &v.backing else {
                continue;
            };
            let (Some(head), Some(cold)) = (v.memory.hva(r.head), v.memory.hva(r.cold)) else {
                continue;
            };
            let is_thp = v.memory.ranges.iter().zip(backing).any(|(m, b)| {
                m.hva == b.hva
                    && m.gfns.contains(r.head)
                    && b.hugetlb_page_bytes.is_none()
                    && b.method == backing::Method::PagemapScan
                    && b.is_huge(head) == Some(true)
            });
            if is_thp && !v.split_queue.contains(&cold) {
                v.split_queue.push(cold);
                v.split_heads.insert(r.head, false);
                v.folio_splits += 1;
            }
        }
    }

    /// Quota changes the round made: the guests are told, the log and the status say why.
    fn report_quota_changes(&mut self, changes: &[QuotaChange]) {
        self.mover
            .limits
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .follow_quotas(changes, Instant::now());
        for c in changes {
            let Some(v) = self.registry.get(c.vm) else {
                continue;
            };
            self.channels.set_quota(c.vm, c.to_bytes, &self.cfg.channel);
            if c.from_bytes != c.to_bytes {
                info!(
                    vm = %v.name,
                    from_mib = mib(c.from_bytes),
                    to_mib = mib(c.to_bytes),
                    reason = reason_label(c.reason),
                    hot_set_mib = mib(c.hot_set_bytes),
                    "quota changed"
                );
            }
            self.count_quota_change(c);
        }
    }

    fn count_quota_change(&mut self, c: &QuotaChange) {
        *self
            .quota_changes
            .entry(c.vm)
            .or_default()
            .entry(reason_label(c.reason))
            .or_default() += 1;
    }

    // Configuration.

    /// Re-reads the configuration file (and the topology). Servers keep their addresses.
    pub fn reload(&mut self) -> anyhow::Result<()> {
        let Some(path) = self.config_path.clone() else {
            anyhow::bail!("no configuration file to reload");
        };
        let cfg = Config::load(&path)?;
        self.apply_config(cfg)
    }

    /// A new configuration, all or nothing: a pool whose minimums do not fit, or an engine that
    /// cannot be built, fails the reload and changes nothing.
    pub fn apply_config(&mut self, cfg: Config) -> anyhow::Result<()> {
        let topo = HostTopology::read(&cfg.daemon.sysfs_root, &cfg.topology)?;
        let mut settings = BTreeMap::new();
        // VMs the new configuration ignores are let go; they leave the pool first, so their
        // minimums do not count against the new limits.
        // So are VMs whose entry another VM (attached earlier) has now: one live VM per entry.
        let mut ignored = Vec::new();
        let mut entry_in_use = Vec::new();
        let mut holders = std::collections::BTreeSet::new();
        for v in self.registry.iter() {
            let s = cfg.vm_settings(&v.name, &v.socket, v.memory.bytes());
            if s.ignore {
                ignored.push(v.id);
            } else if s.entry.is_some_and(|i| !holders.insert(i)) {
                entry_in_use.push(v.id);
            } else {
                settings.insert(v.id, s);
            }
        }
        let leaving: Vec<VmId> = ignored.iter().chain(&entry_in_use).copied().collect();
        let limits: BTreeMap<VmId, VmLimits> = settings
            .iter()
            .map(|(id, s)| (*id, s.pool_limits))
            .collect();
        let params = cfg.pool_params(topo.fast_capacity_bytes())?;
        // The plan in flight is abandoned when the mover restarts (its queued batches are
        // dropped; a move_pages call under way finishes): the new engine relearns placement.
        let restart = topo.nodes != self.topo.nodes
            || cfg.engine != self.cfg.engine
            || cfg.mover != self.cfg.mover;
        let engine = if restart {
            Some(make_engine(&cfg, &topo)?)
        } else {
            None
        };
        let changes = self
            .tiering
            .reconfigure(params, &limits, &leaving, engine, self.now())
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        if restart {
            self.mover.shutdown();
            self.mover = start_mover(&cfg, &topo);
            self.topo = topo;
            for id in self.registry.ids() {
                self.reconcile.restart(id);
                // The new engine knows no folio yet.
                self.place_folios(id);
            }
        } else {
            self.topo.set_free_floors(&cfg.topology);
        }
        {
            let now = Instant::now();
            let mut l = self.mover.limits.lock().unwrap_or_else(|e| e.into_inner());
            l.set_burst_s(cfg.mover.burst_s, now);
            l.set_global(cfg.mover.promote_mbps, cfg.mover.demote_mbps, now);
            for (id, s) in &settings {
                l.set_vm(*id, s.promote_mbps, s.demote_mbps, now);
                l.set_own_rates(*id, s.own_rates, now);
            }
        }
        for (id, s) in settings {
            if let Some(v) = self.registry.get_mut(id) {
                v.settings = s;
            }
        }
        self.rules.apply(&cfg.admission);
        self.cfg = cfg;
        self.report_quota_changes(&changes);
        for id in ignored {
            self.drop_vm(id, "ignored by the configuration");
        }
        for id in entry_in_use {
            self.drop_vm(id, "another VM has its [[vm]] entry");
        }
        self.discovery.restart();
        Ok(())
    }

    // Status and metrics.

    fn snapshot(&self) -> Status {
        let vms: Vec<VmStatus> = self
            .registry
            .iter()
            .filter_map(|v| self.vm_status(v))
            .collect();
        let pool = self.tiering.pool();
        let in_pool = self.cfg.pool.mode == PoolModeConfig::Pool;
        Status {
            daemon: self.daemon_status(),
            pool: PoolStatus {
                mode: self.cfg.pool.mode.label(),
                fast_bytes: in_pool.then(|| pool.params().fast_bytes),
                allocated_bytes: pool.allocated_bytes(),
                rebalance_interval_ms: self.cfg.pool.rebalance_interval_ms,
            },
            vms,
            nodes: self.node_statuses(),
        }
    }

    /// A managed VM's row: the engine's view, the pool's, its channel's and its moves.
    fn vm_status(&self, v: &ManagedVm) -> Option<VmStatus> {
        let now = self.now();
        let engine = self.tiering.engine();
        let pool = self.tiering.pool();
        let s = engine.summary(v.id).ok()?;
        let ch = self.channels.status(v.id);
        let moved = self.moved.vm(v.id);
        let limits = pool.limits(v.id);
        let rounds_rejected = ch.rejected.iter().map(|(_, n)| n).sum();
        Some(VmStatus {
            id: v.id.0,
            name: v.name.clone(),
            pid: v.pid,
            socket: v.socket.clone(),
            ram_bytes: v.memory.bytes(),
            quota_bytes: pool.quota(v.id).unwrap_or(0),
            fast_bytes: s.fast_frames * FRAME_SIZE,
            slow_bytes: s.slow_frames * FRAME_SIZE,
            unknown_bytes: s.unknown_frames * FRAME_SIZE,
            hot_set_bytes: engine.hot_set_bytes(v.id).unwrap_or(0),
            planned_hot_bytes: s.last_plan.hot_set_frames * FRAME_SIZE,
            left_out: LeftOut::of(&s.last_plan),
            quota_share_bytes: v.settings.limits.share_bytes,
            quota_min_bytes: limits.map(|l| l.min_bytes),
            quota_max_bytes: limits.map(|l| l.max_bytes),
            shares: limits.map(|l| l.shares),
            last_quota_change: pool.last_change(v.id).map(|c| QuotaChangeStatus {
                from_bytes: c.from_bytes,
                to_bytes: c.to_bytes,
                hot_set_bytes: c.hot_set_bytes,
                reason: reason_label(c.reason),
                age_s: now.saturating_sub(c.at).as_secs_f64(),
                at_unix_s: self.epoch_unix + c.at.as_secs_f64(),
            }),
            quota_changes: self.quota_changes.get(&v.id).cloned().unwrap_or_default(),
            home_node: v.home,
            channel: ch.path,
            channel_verified: ch.verified,
            channel_problem: ch.problem,
            last_round: ch.last_round,
            last_round_age_s: ch.last_round_age_s,
            last_round_entries: ch.last_round_entries,
            channel_minor: ch.minor,
            tracker: ch.tracker_report.map(TrackerStatus::from),
            rounds_accepted: ch.rounds_accepted,
            rounds_rejected,
            rejected: ch.rejected,
            promoted_bytes: moved.promoted_bytes,
            demoted_bytes: moved.demoted_bytes,
            near_slow_bytes: moved.near_slow_bytes,
            promotions_skipped_frames: moved.trimmed_frames,
            pages_by_outcome: moved
                .pages_by_outcome
                .iter()
                .map(|(o, c)| (o.label(), *c))
                .collect(),
            reconcile_sweeps: self.reconcile.full_sweeps(v.id),
            resets: v.resets,
            resyncs: v.resyncs,
            memory_map_changes: v.memory_map_changes,
            attached_s: v.attached.elapsed().as_secs_f64(),
            move_limit_bytes_per_second: per_second(
                v.settings.promote_mbps,
                v.settings.demote_mbps,
            ),
            host_tracking_mode: v.settings.host_tracking.label(),
            host_tracking: self.host_tracking.vm_status(v.id),
            no_signal: s.last_observed.is_none(),
            backing: v.backing.as_ref().ok().map(|r| backing::BackingSummary {
                folio_blocks: s.host_folios,
                folio_splits: v.folio_splits,
                folio_recollapses: v.folio_recollapses,
                ..backing::summarize(r)
            }),
            backing_problem: v.backing.as_ref().err().cloned(),
        })
    }

    /// Each node: its place in the topology, free memory, the managed guest RAM on it as the
    /// engine knows it, and its mover worker's gauges.
    fn node_statuses(&self) -> Vec<NodeStatus> {
        let engine = self.tiering.engine();
        let mut resident: BTreeMap<NodeId, u64> = BTreeMap::new();
        for v in self.registry.iter() {
            for (n, c) in engine.node_frames(v.id).unwrap_or_default() {
                *resident.entry(n).or_default() += c * FRAME_SIZE;
            }
        }
        let free: BTreeMap<NodeId, u64> = self.topo.free_bytes().into_iter().collect();
        let queued = MoverGauges::snapshot(&self.mover.gauges.queued);
        let pages = MoverGauges::snapshot(&self.mover.gauges.executed_pages);
        let per_dir = |m: &PerNodeDir, n: NodeId| PerDirection {
            promote: m.get(&(n, Direction::Promote)).copied().unwrap_or(0),
            demote: m.get(&(n, Direction::Demote)).copied().unwrap_or(0),
        };
        self.topo
            .nodes
            .iter()
            .map(|n| NodeStatus {
                id: n.id,
                tier: n.tier,
                kernel_tier: n.kernel_tier,
                cpus: n.cpus.clone(),
                socket: n.socket,
                mem_total_bytes: n.mem_total_bytes,
                free_bytes: free.get(&n.id).copied(),
                vm_resident_bytes: resident.get(&n.id).copied().unwrap_or(0),
                worker_node: n.worker_node,
                mover_queued_batches: per_dir(&queued, n.id),
                mover_worker_pages: per_dir(&pages, n.id),
            })
            .collect()
    }

    fn daemon_status(&self) -> DaemonStatus {
        DaemonStatus {
            pid: std::process::id(),
            uptime_s: self.epoch.elapsed().as_secs_f64(),
            rounds: self.totals.rounds,
            plans: self.totals.plans,
            planned_bytes: self.totals.planned_bytes,
            planned_by_kind: self.totals.planned_by_kind.clone(),
            watermark_bytes: self.totals.watermark_bytes,
            cpu_seconds: sys::process_cpu_seconds(),
            round_cpu_seconds: self.totals.round_cpu_seconds,
            last_round_seconds: self.totals.last_round_seconds,
            managed_gib: self
                .registry
                .iter()
                .map(|v| v.memory.bytes() as f64)
                .sum::<f64>()
                / (1u64 << 30) as f64,
            mover_busy: self.mover.busy(),
            mover_busy_s: self.mover.busy_for().map_or(0.0, |d| d.as_secs_f64()),
            mover_jobs: self.mover.gauges.jobs.load(Ordering::Relaxed),
            mover_lanes_moving_peak: self.mover.gauges.lanes_moving_peak.load(Ordering::Relaxed),
            vms_dropped: self.registry.dropped,
            channel_faults: self.totals.channel_faults.clone(),
            admission_refused: self.discovery.counts.refused.clone(),
            channel_refused: self.channels.refused().clone(),
            attach_failed: self.discovery.counts.failed,
            sockets_deferred: self.discovery.counts.deferred,
            unsafe_scan_dirs: self.discovery.counts.unsafe_dirs,
            vms_dropped_lying: self.registry.dropped_lying,
            qmp_slow_refreshes: self.registry.slow_refreshes,
            interval_ms: self.cfg.daemon.interval_ms,
            metrics: self.metrics_addr.map(|a| a.to_string()),
            engine_memory_bytes: self.tiering.engine().memory_bytes() as u64,
            move_limit_bytes_per_second: per_second(
                self.cfg.mover.promote_mbps,
                self.cfg.mover.demote_mbps,
            ),
            host_kdamond: self.host_tracking.status(),
            kernel_tiering: self.kernel_tiering.get(),
        }
    }
}

/// Rate limits in MB/s as bytes per second.
fn per_second(promote_mbps: u64, demote_mbps: u64) -> PerDirection {
    PerDirection {
        promote: promote_mbps.saturating_mul(1_000_000),
        demote: demote_mbps.saturating_mul(1_000_000),
    }
}
