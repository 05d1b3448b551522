//! What vtismd reports, as typed structs: `vtism ctl status` is their JSON, and the Prometheus
//! exposition (`GET /metrics`, `vtism ctl metrics`) is rendered from the same structs by the
//! prometheus-client crate, beside the mover's two histograms. The main loop publishes a
//! [`Status`] every round; the servers render it when asked.

use crate::backing::BackingSummary;
use crate::host_tracking::{KdamondStatus, VmHostTracking};
use crate::kernel_tiering::KernelTiering;
use crate::mover::JobReport;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use vtism_engine::{Direction, NodeId, QuotaReason, Tier};
use vtism_proto::TrackerReport;

/// The daemon's state as `vtism ctl status --json` shows it.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Status {
    pub daemon: DaemonStatus,
    pub pool: PoolStatus,
    pub vms: Vec<VmStatus>,
    pub nodes: Vec<NodeStatus>,
}

/// Bytes (or pages, or batches) per direction of a move.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PerDirection {
    pub promote: u64,
    pub demote: u64,
}

impl PerDirection {
    pub fn get(&self, d: Direction) -> u64 {
        match d {
            Direction::Promote => self.promote,
            Direction::Demote => self.demote,
        }
    }
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct DaemonStatus {
    pub pid: u32,
    pub uptime_s: f64,
    pub rounds: u64,
    /// Non-empty plans handed to the mover.
    pub plans: u64,
    pub planned_bytes: u64,
    /// Bytes of the plans by kind of move (`promote`, `demote`, `refill`, `home`).
    pub planned_by_kind: BTreeMap<&'static str, u64>,
    /// Bytes demoted to restore fast nodes' free watermark (`topology.free_watermark_mib`).
    pub watermark_bytes: u64,
    /// Daemon CPU time (user + system).
    pub cpu_seconds: f64,
    /// Main-loop CPU time spent in rounds.
    pub round_cpu_seconds: f64,
    /// Wall time of the last round.
    pub last_round_seconds: f64,
    pub managed_gib: f64,
    pub mover_busy: bool,
    /// Seconds the plan executing has been at it (0 when none is).
    pub mover_busy_s: f64,
    pub mover_jobs: u64,
    /// The most mover workers inside move_pages at once since the mover (re)started.
    pub mover_lanes_moving_peak: u64,
    pub vms_dropped: u64,
    /// VMs let go because their channel file was truncated, resized or replaced, by fault.
    pub channel_faults: BTreeMap<&'static str, u64>,
    /// Discovered sockets refused admission, by reason ("Threat model", "A compromised QEMU").
    pub admission_refused: BTreeMap<&'static str, u64>,
    /// Files refused as VMs' channels, by reason (nothing was written to them).
    pub channel_refused: BTreeMap<&'static str, u64>,
    /// Attaches that failed (no answer, bad QMP, a monitor that is not QEMU's).
    pub attach_failed: u64,
    /// Sockets left for a later scan (the attach queue full, or `max_vms` reached).
    pub sockets_deferred: u64,
    /// Scan directories found writable by others than the admins.
    pub unsafe_scan_dirs: u64,
    /// VMs dropped because their memory map stopped matching the process's mappings.
    pub vms_dropped_lying: u64,
    /// Re-reads of a VM that its monitor did not answer in time (a VM is dropped after three in a
    /// row).
    pub qmp_slow_refreshes: u64,
    pub interval_ms: u64,
    pub metrics: Option<String>,
    /// Heap held by the engine.
    pub engine_memory_bytes: u64,
    /// The global move rate limits (0 = none).
    pub move_limit_bytes_per_second: PerDirection,
    /// The host kdamond of host-side tracking.
    pub host_kdamond: KdamondStatus,
    /// The kernel's NUMA balancing and demotion settings (`kernel_tiering`).
    pub kernel_tiering: KernelTiering,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct PoolStatus {
    /// `island` or `pool`.
    pub mode: &'static str,
    /// Fast memory the pool hands out (pool mode).
    pub fast_bytes: Option<u64>,
    /// Sum of the quotas.
    pub allocated_bytes: u64,
    pub rebalance_interval_ms: u64,
}

/// A quota change with its reason.
#[derive(Clone, Debug, Default, Serialize)]
pub struct QuotaChangeStatus {
    pub from_bytes: u64,
    pub to_bytes: u64,
    /// The hot set the pool had accepted then.
    pub hot_set_bytes: u64,
    pub reason: &'static str,
    pub age_s: f64,
    /// Unix time of the change.
    pub at_unix_s: f64,
}

/// Hot-set bytes a plan left on slow memory, by reason (`VmPlanStats`). The testbed's samples
/// read it back from the status.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeftOut {
    /// The round's move budget ran out.
    pub budget_bytes: u64,
    /// No fast frame was colder by the hysteresis margin, or a lukewarm frame (below the hot-set
    /// mark) found no free room.
    pub hysteresis_bytes: u64,
    /// Demoted lately and not risen since, while the room it needs is held by units promoted
    /// lately (docs/engine.md, "A return needs a rise").
    pub return_bytes: u64,
    /// No fast node had free memory.
    pub capacity_bytes: u64,
}

impl LeftOut {
    pub fn of(s: &vtism_engine::VmPlanStats) -> LeftOut {
        let b = |f: u64| f * vtism_proto::FRAME_SIZE;
        LeftOut {
            budget_bytes: b(s.deferred_by_budget),
            hysteresis_bytes: b(s.held_by_hysteresis),
            return_bytes: b(s.held_as_return),
            capacity_bytes: b(s.blocked_by_capacity),
        }
    }

    /// Bytes by reason, as the metric labels them.
    pub fn by_reason(&self) -> [(&'static str, u64); 4] {
        [
            ("budget", self.budget_bytes),
            ("hysteresis", self.hysteresis_bytes),
            ("return", self.return_bytes),
            ("capacity", self.capacity_bytes),
        ]
    }
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct VmStatus {
    pub id: u32,
    pub name: String,
    pub pid: i32,
    pub socket: PathBuf,
    pub ram_bytes: u64,
    pub quota_bytes: u64,
    /// Where the VM's memory is, as the daemon knows it (reconciled with the kernel).
    pub fast_bytes: u64,
    pub slow_bytes: u64,
    pub unknown_bytes: u64,
    /// The engine's hot-set estimate (the pool's demand).
    pub hot_set_bytes: u64,
    /// The part of it the quota allowed in the last plan.
    pub planned_hot_bytes: u64,
    /// Hot-set bytes the last plan left on slow memory, and why.
    pub left_out: LeftOut,
    /// Initial share from the configuration (island mode: the quota).
    pub quota_share_bytes: u64,
    /// Limits the pool enforces (island mode: min = max = the quota).
    pub quota_min_bytes: Option<u64>,
    pub quota_max_bytes: Option<u64>,
    pub shares: Option<u32>,
    pub last_quota_change: Option<QuotaChangeStatus>,
    /// Quota changes by reason.
    pub quota_changes: BTreeMap<&'static str, u64>,
    pub home_node: Option<NodeId>,
    pub channel: Option<PathBuf>,
    /// The channel file's header has been seen valid: feedback is written to it (until then
    /// nothing is: it may not be a channel).
    pub channel_verified: bool,
    pub channel_problem: Option<String>,
    /// The last hint round accepted, its age and size.
    pub last_round: u64,
    pub last_round_age_s: Option<f64>,
    pub last_round_entries: u64,
    /// The channel minor version of the last accepted round (what its counts mean).
    pub channel_minor: Option<u16>,
    /// What a v1.1 guest's tracker reported with its last round (`tracker_*` in the JSON, null
    /// for a v1.0 guest).
    #[serde(flatten, serialize_with = "tracker_fields")]
    pub tracker: Option<TrackerStatus>,
    pub rounds_accepted: u64,
    pub rounds_rejected: u64,
    /// Rejected rounds by reason (every reason counted; the JSON lists those above zero).
    #[serde(rename = "rejected_by_reason", serialize_with = "above_zero")]
    pub rejected: Vec<(&'static str, u64)>,
    pub promoted_bytes: u64,
    pub demoted_bytes: u64,
    /// Moved between slow nodes, nearer the VM's home (`engine.near_slow`).
    pub near_slow_bytes: u64,
    /// Promotions dropped because the demotions before them fell short (the quota is kept).
    pub promotions_skipped_frames: u64,
    /// move_pages results by outcome.
    pub pages_by_outcome: BTreeMap<&'static str, u64>,
    /// Complete placement reconcile passes.
    pub reconcile_sweeps: u64,
    /// QMP RESET events seen, and re-reads done for reset or device events (at most one per
    /// `discovery.resync_min_interval_ms`).
    pub resets: u64,
    pub resyncs: u64,
    /// Re-reads that found a different memory map (the VM was re-registered).
    pub memory_map_changes: u64,
    pub attached_s: f64,
    /// The VM's own move rate limits (0 = none).
    pub move_limit_bytes_per_second: PerDirection,
    /// `host_tracking` mode (`off`, `auto`, `on`) and, if DAMON on the host watches the VM (or
    /// should and cannot), what it fed the engine.
    pub host_tracking_mode: &'static str,
    pub host_tracking: Option<VmHostTracking>,
    /// No observation yet (no hints, no host-side accesses): the engine moves none of its
    /// pages (the no-signal rule, docs/engine.md).
    pub no_signal: bool,
    /// How the host backs the guest RAM (THPs, hugetlbfs), or why that is not known.
    pub backing: Option<BackingSummary>,
    pub backing_problem: Option<String>,
}

/// A v1.1 tracker's report: its observation windows and CPU time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TrackerStatus {
    pub window_us: u32,
    pub coarse_window_us: u32,
    pub windows: u32,
    pub cpu_us: u32,
    pub tracked_frames: u64,
}

/// The report as `tracker_*` fields of the VM's status, each null without one.
fn tracker_fields<S: serde::Serializer>(
    t: &Option<TrackerStatus>,
    s: S,
) -> Result<S::Ok, S::Error> {
    #[derive(Serialize)]
    struct Fields {
        tracker_window_us: Option<u32>,
        tracker_coarse_window_us: Option<u32>,
        tracker_windows: Option<u32>,
        tracker_cpu_us: Option<u32>,
        tracker_tracked_frames: Option<u64>,
    }
    Fields {
        tracker_window_us: t.map(|t| t.window_us),
        tracker_coarse_window_us: t.map(|t| t.coarse_window_us),
        tracker_windows: t.map(|t| t.windows),
        tracker_cpu_us: t.map(|t| t.cpu_us),
        tracker_tracked_frames: t.map(|t| t.tracked_frames),
    }
    .serialize(s)
}

impl From<TrackerReport> for TrackerStatus {
    fn from(t: TrackerReport) -> TrackerStatus {
        TrackerStatus {
            window_us: t.window.0,
            coarse_window_us: t.coarse_window.0,
            windows: t.windows,
            cpu_us: t.tracker_cpu.0,
            tracked_frames: t.tracked_frames,
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct NodeStatus {
    pub id: NodeId,
    pub tier: Tier,
    pub kernel_tier: Option<u32>,
    pub cpus: Vec<u32>,
    pub socket: u32,
    pub mem_total_bytes: u64,
    /// MemFree less `topology.min_free_mib`.
    pub free_bytes: Option<u64>,
    /// Managed guest RAM on the node.
    pub vm_resident_bytes: u64,
    pub worker_node: NodeId,
    /// Batches queued for the node's mover worker.
    pub mover_queued_batches: PerDirection,
    /// Pages the node's mover worker handed to move_pages.
    pub mover_worker_pages: PerDirection,
}

fn above_zero<S: serde::Serializer>(v: &[(&'static str, u64)], s: S) -> Result<S::Ok, S::Error> {
    s.collect_map(v.iter().filter(|(_, n)| *n > 0).map(|(k, n)| (*k, *n)))
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

/// The mover's latency histograms, observed as plans finish.
#[derive(Clone, Debug)]
pub struct MoverHistograms {
    /// One move_pages call.
    pub batch_latency: Histogram,
    /// One plan, all phases.
    pub plan_seconds: Histogram,
}

impl Default for MoverHistograms {
    fn default() -> Self {
        MoverHistograms {
            batch_latency: Histogram::new([
                0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0,
            ]),
            plan_seconds: Histogram::new([0.001, 0.01, 0.1, 0.5, 1.0, 5.0, 30.0]),
        }
    }
}

impl MoverHistograms {
    pub fn record(&self, r: &JobReport) {
        self.plan_seconds.observe(r.elapsed.as_secs_f64());
        for &l in &r.latencies {
            self.batch_latency.observe(l);
        }
    }
}

/// The latest status and the registry that renders it: shared by the main loop (which
/// publishes) and the servers (which render).
pub struct Published {
    latest: Arc<Latest>,
    registry: Registry,
}

#[derive(Debug, Default)]
struct Latest(Mutex<Arc<Status>>);

impl Published {
    pub fn new(histograms: &MoverHistograms) -> Published {
        let latest = Arc::new(Latest::default());
        let mut registry = Registry::default();
        registry.register(
            "vtism_mover_batch_latency_seconds",
            "move_pages call latency per batch",
            histograms.batch_latency.clone(),
        );
        registry.register(
            "vtism_mover_plan_seconds",
            "Time to execute one plan",
            histograms.plan_seconds.clone(),
        );
        registry.register_collector(Box::new(latest.clone()));
        Published { latest, registry }
    }

    pub fn publish(&self, s: Status) {
        *self.latest.0.lock().unwrap_or_else(|e| e.into_inner()) = Arc::new(s);
    }

    pub fn status(&self) -> Arc<Status> {
        self.latest
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn status_json(&self) -> serde_json::Value {
        serde_json::to_value(&*self.status()).unwrap_or_default()
    }

    /// The Prometheus text exposition (format 0.0.4).
    pub fn metrics_text(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry);
        out
    }
}

/// The `Content-Type` of [`Published::metrics_text`].
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

impl Collector for Latest {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let s = self.0.lock().unwrap_or_else(|e| e.into_inner()).clone();
        for f in s.families() {
            f.encode(&mut enc)?;
        }
        Ok(())
    }
}

/// A sample's value.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Num {
    Int(u64),
    Float(f64),
}

impl From<u64> for Num {
    fn from(v: u64) -> Num {
        Num::Int(v)
    }
}

impl From<f64> for Num {
    fn from(v: f64) -> Num {
        Num::Float(v)
    }
}

type Labels<'a> = Vec<(&'static str, Cow<'a, str>)>;

/// One metric family and its samples.
struct Family<'a> {
    name: &'static str,
    help: &'static str,
    kind: MetricType,
    samples: Vec<(Labels<'a>, Num)>,
}

impl Family<'_> {
    fn encode(&self, enc: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut m = enc.encode_descriptor(self.name, self.help, None, self.kind)?;
        for (labels, v) in &self.samples {
            // An empty label set writes no braces.
            let e = m.encode_family(labels)?;
            match (self.kind, *v) {
                (MetricType::Counter, Num::Int(x)) => ConstCounter::new(x).encode(e)?,
                (MetricType::Counter, Num::Float(x)) => ConstCounter::new(x).encode(e)?,
                (_, Num::Int(x)) => ConstGauge::new(x).encode(e)?,
                (_, Num::Float(x)) => ConstGauge::new(x).encode(e)?,
            }
        }
        Ok(())
    }
}

/// Families in the order they are declared, samples gathered per family.
#[derive(Default)]
struct Families<'a>(Vec<Family<'a>>);

impl<'a> Families<'a> {
    fn add(
        &mut self,
        name: &'static str,
        kind: MetricType,
        help: &'static str,
        labels: Labels<'a>,
        v: impl Into<Num>,
    ) {
        let i = match self.0.iter().position(|f| f.name == name) {
            Some(i) => i,
            None => {
                self.0.push(Family {
                    name,
                    help,
                    kind,
                    samples: Vec::new(),
                });
                self.0.len() - 1
            }
        };
        self.0[i].samples.push((labels, v.into()));
    }
    fn gauge(&mut self, name: &'static str, help: &'static str, l: Labels<'a>, v: impl Into<Num>) {
        self.add(name, MetricType::Gauge, help, l, v)
    }
    fn counter(
        &mut self,
        name: &'static str,
        help: &'static str,
        l: Labels<'a>,
        v: impl Into<Num>,
    ) {
        self.add(name, MetricType::Counter, help, l, v)
    }
}

const DIRS: [Direction; 2] = Direction::ALL;

impl Status {
    /// Every metric family, from the typed status. Counter names get their `_total` from the
    /// encoder.
    fn families(&self) -> Vec<Family<'_>> {
        let mut f = Families::default();
        for v in &self.vms {
            v.families(&mut f);
        }
        for n in &self.nodes {
            n.families(&mut f);
        }
        self.daemon.families(&mut f);
        f.gauge("vtism_vms", "VMs managed.", vec![], self.vms.len() as u64);
        self.pool.families(&mut f);
        f.0
    }
}

impl VmStatus {
    fn families<'a>(&'a self, f: &mut Families<'a>) {
        let vm = || vec![("vm", Cow::from(self.name.as_str()))];
        let with = |k: &'static str, v: &'a str| {
            vec![("vm", Cow::from(self.name.as_str())), (k, Cow::from(v))]
        };
        f.gauge(
            "vtism_vm_ram_bytes",
            "Guest RAM managed.",
            vm(),
            self.ram_bytes,
        );
        f.gauge(
            "vtism_vm_fast_quota_bytes",
            "Fast-memory quota.",
            vm(),
            self.quota_bytes,
        );
        for (tier, b) in [
            ("fast", self.fast_bytes),
            ("slow", self.slow_bytes),
            ("unknown", self.unknown_bytes),
        ] {
            f.gauge(
                "vtism_vm_resident_bytes",
                "Guest RAM by memory tier, as the daemon knows it (reconciled).",
                with("tier", tier),
                b,
            );
        }
        if let Some(b) = self.quota_min_bytes {
            f.gauge(
                "vtism_vm_fast_quota_min_bytes",
                "Guaranteed minimum quota (island mode: the fixed quota).",
                vm(),
                b,
            );
        }
        if let Some(b) = self.quota_max_bytes {
            f.gauge(
                "vtism_vm_fast_quota_max_bytes",
                "Maximum quota (island mode: the fixed quota).",
                vm(),
                b,
            );
        }
        if let Some(s) = self.shares {
            f.gauge(
                "vtism_vm_fast_shares",
                "Weight in the pool's share-based split.",
                vm(),
                u64::from(s),
            );
        }
        f.gauge(
            "vtism_vm_fast_quota_share_bytes",
            "Initial share from the configuration (island mode: the quota).",
            vm(),
            self.quota_share_bytes,
        );
        f.gauge(
            "vtism_vm_hot_set_bytes",
            "Estimated hot set (the pool's demand): frames whose decayed score is at least the base score.",
            vm(),
            self.hot_set_bytes,
        );
        f.gauge(
            "vtism_vm_planned_hot_bytes",
            "Hot set the quota allows, from the last plan.",
            vm(),
            self.planned_hot_bytes,
        );
        for (reason, bytes) in self.left_out.by_reason() {
            f.gauge(
                "vtism_vm_planned_left_out_bytes",
                "Hot-set bytes the last plan left on slow memory, by reason (budget, hysteresis, return, capacity).",
                with("reason", reason),
                bytes,
            );
        }
        for (reason, n) in &self.quota_changes {
            f.counter(
                "vtism_vm_quota_changes",
                "Quota changes by reason (initial, config, grow, shrink, reclaim, clamp).",
                with("reason", reason),
                *n,
            );
        }
        if let Some(c) = &self.last_quota_change {
            f.gauge(
                "vtism_vm_quota_last_change_timestamp_seconds",
                "Unix time of the last quota change, labelled with its reason.",
                with("reason", c.reason),
                c.at_unix_s,
            );
        }
        for d in DIRS {
            let moved = match d {
                Direction::Promote => self.promoted_bytes,
                Direction::Demote => self.demoted_bytes,
            };
            f.counter(
                "vtism_vm_moved_bytes",
                "Bytes moved by direction.",
                with("dir", d.label()),
                moved,
            );
        }
        for d in DIRS {
            f.gauge(
                "vtism_vm_move_limit_bytes_per_second",
                "The VM's move rate limit by direction (mover.vm_*_mbps or its [[vm]] entry; 0 = none).",
                with("dir", d.label()),
                self.move_limit_bytes_per_second.get(d),
            );
        }
        f.counter(
            "vtism_vm_near_slow_moved_bytes",
            "Bytes moved between slow nodes, to the one nearest the VM's home (engine.near_slow).",
            vm(),
            self.near_slow_bytes,
        );
        f.counter(
            "vtism_vm_promotions_skipped_frames",
            "Promotions dropped because the demotions before them fell short (quota kept).",
            vm(),
            self.promotions_skipped_frames,
        );
        for (o, n) in &self.pages_by_outcome {
            f.counter(
                "vtism_vm_pages",
                "Pages by move_pages outcome.",
                with("outcome", o),
                *n,
            );
        }
        f.counter(
            "vtism_hint_rounds_accepted",
            "Hint rounds accepted.",
            vm(),
            self.rounds_accepted,
        );
        for (reason, n) in &self.rejected {
            f.counter(
                "vtism_hint_rounds_rejected",
                "Hint rounds rejected, by reason.",
                with("reason", reason),
                *n,
            );
        }
        f.gauge(
            "vtism_vm_last_round",
            "Last hint round accepted.",
            vm(),
            self.last_round,
        );
        if let Some(t) = &self.tracker {
            for (window, us) in [("fine", t.window_us), ("coarse", t.coarse_window_us)] {
                f.gauge(
                    "vtism_vm_tracker_window_seconds",
                    "The guest tracker's observation windows (fine, coarse) at its last round.",
                    with("window", window),
                    f64::from(us) / 1e6,
                );
            }
            f.gauge(
                "vtism_vm_tracker_cpu_seconds",
                "CPU time the guest tracker reported for its last round.",
                vm(),
                f64::from(t.cpu_us) / 1e6,
            );
        }
        f.gauge(
            "vtism_vm_channel_up",
            "1 if the VM's channel is mapped.",
            vm(),
            u64::from(self.channel.is_some()),
        );
        f.counter(
            "vtism_vm_reconcile_sweeps",
            "Complete placement reconcile passes.",
            vm(),
            self.reconcile_sweeps,
        );
        f.counter(
            "vtism_vm_resets",
            "QMP RESET events of the VM (reboots).",
            vm(),
            self.resets,
        );
        f.counter(
            "vtism_vm_resyncs",
            "Re-reads of the VM for reset or device events, at most one per \
             discovery.resync_min_interval_ms.",
            vm(),
            self.resyncs,
        );
        f.counter(
            "vtism_vm_memory_map_changes",
            "Re-reads that found a different memory map (hot-plug): the VM's placement is learnt again.",
            vm(),
            self.memory_map_changes,
        );
        self.host_families(f);
    }

    fn host_families<'a>(&'a self, f: &mut Families<'a>) {
        let vm = || vec![("vm", Cow::from(self.name.as_str()))];
        let h = self.host_tracking.as_ref();
        f.gauge(
            "vtism_vm_host_tracked",
            "1 if DAMON on the host watches the VM (host_tracking).",
            vm(),
            u64::from(h.is_some_and(|h| h.problem.is_none())),
        );
        f.counter(
            "vtism_vm_host_observations",
            "Host-side DAMON reports fed to the engine.",
            vm(),
            h.map_or(0, |h| h.observations),
        );
        f.counter(
            "vtism_vm_host_observed_frames",
            "Guest frames in those reports.",
            vm(),
            h.map_or(0, |h| h.frames),
        );
        f.counter(
            "vtism_vm_host_frames_over_budget",
            "Guest frames left out of host-side reports by host_tracking.max_frames_per_report.",
            vm(),
            h.map_or(0, |h| h.frames_over_budget),
        );
        f.gauge(
            "vtism_vm_no_signal",
            "1 while the VM has had no observation (its pages are not moved).",
            vm(),
            u64::from(self.no_signal),
        );
        if let Some(b) = &self.backing {
            f.gauge(
                "vtism_vm_thp_bytes",
                "Guest RAM the host maps with transparent huge pages (smaps).",
                vm(),
                b.thp_bytes,
            );
            f.gauge(
                "vtism_vm_hugetlb_bytes",
                "Guest RAM on hugetlbfs.",
                vm(),
                b.hugetlb_bytes,
            );
            f.gauge(
                "vtism_vm_huge_blocks",
                "2 MiB blocks of guest RAM the host maps huge (PAGEMAP_SCAN, Linux >= 6.7).",
                vm(),
                b.huge_blocks,
            );
            f.gauge(
                "vtism_vm_folio_blocks",
                "2 MiB blocks of guest RAM placed whole as host folios (THP or hugetlbfs).",
                vm(),
                b.folio_blocks,
            );
            f.counter(
                "vtism_vm_folio_splits",
                "THPs split (a page advised cold): fewer than half their frames hot, and the quota short.",
                vm(),
                b.folio_splits,
            );
            f.counter(
                "vtism_vm_folio_recollapses",
                "Split THPs later seen mapped huge again (khugepaged collapsed them).",
                vm(),
                b.folio_recollapses,
            );
            f.gauge(
                "vtism_vm_unmovable_bytes",
                "Guest RAM vtismd leaves where it is: on hugetlbfs pages larger than 2 MiB.",
                vm(),
                b.unmovable_bytes,
            );
            f.gauge(
                "vtism_vm_backing_blocks_known",
                "1 if every 2 MiB block's backing is known (0: THPs in use, where not known).",
                vm(),
                u64::from(b.blocks_known),
            );
        }
    }
}

impl NodeStatus {
    fn families(&self, f: &mut Families<'_>) {
        let id = self.id.0.to_string();
        let node = || vec![("node", Cow::from(id.clone()))];
        f.gauge(
            "vtism_node_vm_resident_bytes",
            "Bytes of managed guest RAM on the node.",
            node(),
            self.vm_resident_bytes,
        );
        f.gauge(
            "vtism_node_free_bytes",
            "MemFree less the configured floor.",
            node(),
            self.free_bytes.unwrap_or(0),
        );
        f.gauge(
            "vtism_node_tier",
            "Tier rank of the node (0 = fast).",
            node(),
            u64::from(self.tier.0),
        );
        for d in DIRS {
            f.gauge(
                "vtism_mover_queue_depth",
                "Batches queued per node and direction (promotions into the node, demotions out of it).",
                vec![("node", Cow::from(id.clone())), ("dir", d.label().into())],
                self.mover_queued_batches.get(d),
            );
        }
        for d in DIRS {
            f.counter(
                "vtism_mover_worker_pages",
                "Pages the node's mover workers handed to move_pages (promotions into the node, demotions out of it).",
                vec![("node", Cow::from(id.clone())), ("dir", d.label().into())],
                self.mover_worker_pages.get(d),
            );
        }
    }
}

impl DaemonStatus {
    fn families<'a>(&'a self, f: &mut Families<'a>) {
        for state in ["idle", "waiting", "running", "failed"] {
            f.gauge(
                "vtism_host_kdamond_state",
                "1 for the host kdamond's state (idle: no VM to watch; waiting: DAMON used by others).",
                vec![("state", Cow::from(state))],
                u64::from(self.host_kdamond.state == state),
            );
        }
        f.counter(
            "vtism_host_kdamond_reports",
            "Reports read from the host kdamond.",
            vec![],
            self.host_kdamond.reports,
        );
        if let Some(mode) = self.kernel_tiering.numa_balancing {
            f.gauge(
                "vtism_host_numa_balancing",
                "kernel.numa_balancing (0: off; other values move guest pages against vtismd's placement).",
                vec![],
                u64::from(mode),
            );
        }
        if let Some(on) = self.kernel_tiering.demotion_enabled {
            f.gauge(
                "vtism_host_kernel_demotion_enabled",
                "1 if reclaim demotes pages to slower nodes (/sys/kernel/mm/numa/demotion_enabled).",
                vec![],
                u64::from(on),
            );
        }
        f.counter(
            "vtism_process_cpu_seconds",
            "Daemon CPU time (user + system).",
            vec![],
            self.cpu_seconds,
        );
        f.counter(
            "vtism_round_cpu_seconds",
            "Main-loop CPU time spent in rounds.",
            vec![],
            self.round_cpu_seconds,
        );
        f.counter("vtism_rounds", "Rounds run.", vec![], self.rounds);
        for fault in crate::channel_file::Fault::LABELS {
            f.counter(
                "vtism_channel_faults",
                "VMs let go because their channel file was truncated, resized or replaced.",
                vec![("fault", Cow::Borrowed(fault))],
                self.channel_faults.get(fault).copied().unwrap_or(0),
            );
        }
        for reason in crate::channel_file::Refusal::LABELS {
            f.counter(
                "vtism_channel_refused",
                "Files refused as a VM's channel (not QEMU's shared tmpfs/hugetlbfs backend, links, owner, another VM's); nothing was written to them.",
                vec![("reason", Cow::Borrowed(reason))],
                self.channel_refused.get(reason).copied().unwrap_or(0),
            );
        }
        for reason in crate::admission::Refusal::LABELS {
            f.counter(
                "vtism_admission_refused",
                "Discovered sockets refused admission (not a QEMU process, wrong user, RAM claims).",
                vec![("reason", Cow::Borrowed(reason))],
                self.admission_refused.get(reason).copied().unwrap_or(0),
            );
        }
        f.counter(
            "vtism_attach_failed",
            "Attaches to a discovered socket that failed (no answer, bad QMP, deadline).",
            vec![],
            self.attach_failed,
        );
        f.counter(
            "vtism_sockets_deferred",
            "Discovered sockets left for a later scan (attach queue full or max_vms reached).",
            vec![],
            self.sockets_deferred,
        );
        f.counter(
            "vtism_unsafe_scan_dirs",
            "Scan directories found writable by others than the admins.",
            vec![],
            self.unsafe_scan_dirs,
        );
        f.counter(
            "vtism_vms_dropped_lying",
            "VMs dropped because their memory map no longer matched the process's mappings.",
            vec![],
            self.vms_dropped_lying,
        );
        f.counter(
            "vtism_qmp_slow_refreshes",
            "Re-reads of a VM its QEMU monitor did not answer in time (dropped after three in a row).",
            vec![],
            self.qmp_slow_refreshes,
        );
        f.gauge(
            "vtism_round_seconds",
            "Wall time of the last round.",
            vec![],
            self.last_round_seconds,
        );
        f.counter(
            "vtism_plans",
            "Non-empty plans handed to the mover.",
            vec![],
            self.plans,
        );
        for (kind, bytes) in &self.planned_by_kind {
            f.counter(
                "vtism_planned_bytes",
                "Bytes of the plans handed to the mover, by kind of move (home: to the fast node nearest the VM's home).",
                vec![("kind", Cow::from(*kind))],
                *bytes,
            );
        }
        f.counter(
            "vtism_watermark_demoted_bytes",
            "Bytes planned for demotion to restore fast nodes' free watermark (topology.free_watermark_mib).",
            vec![],
            self.watermark_bytes,
        );
        f.gauge(
            "vtism_mover_busy",
            "1 while a plan is being executed.",
            vec![],
            u64::from(self.mover_busy),
        );
        f.gauge(
            "vtism_mover_lanes_moving_peak",
            "The most mover workers inside move_pages at once (promotions from several source nodes run in parallel).",
            vec![],
            self.mover_lanes_moving_peak,
        );
        for d in DIRS {
            f.gauge(
                "vtism_mover_limit_bytes_per_second",
                "The global move rate limit by direction (mover.promote_mbps, demote_mbps; 0 = none).",
                vec![("dir", d.label().into())],
                self.move_limit_bytes_per_second.get(d),
            );
        }
        f.gauge(
            "vtism_engine_memory_bytes",
            "Heap held by the engine.",
            vec![],
            self.engine_memory_bytes,
        );
    }
}

impl PoolStatus {
    fn families<'a>(&'a self, f: &mut Families<'a>) {
        f.gauge(
            "vtism_pool_mode",
            "1 for the mode quotas are set in (island: fixed; pool: by hot set).",
            vec![("mode", self.mode.into())],
            1u64,
        );
        if let Some(b) = self.fast_bytes {
            f.gauge(
                "vtism_pool_fast_bytes",
                "Fast memory the pool hands out.",
                vec![],
                b,
            );
        }
        f.gauge(
            "vtism_pool_allocated_bytes",
            "Sum of the VMs' quotas.",
            vec![],
            self.allocated_bytes,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn status() -> Status {
        Status {
            daemon: DaemonStatus {
                rounds: 7,
                cpu_seconds: 0.25,
                mover_busy: true,
                planned_by_kind: [("home", 4096)].into(),
                watermark_bytes: 8192,
                mover_lanes_moving_peak: 2,
                kernel_tiering: KernelTiering {
                    numa_balancing: Some(2),
                    demotion_enabled: None,
                },
                ..Default::default()
            },
            pool: PoolStatus {
                mode: "pool",
                fast_bytes: Some(4 << 20),
                allocated_bytes: 3 << 20,
                rebalance_interval_ms: 1000,
            },
            vms: vec![VmStatus {
                name: "a\"b".into(),
                quota_bytes: 3 << 20,
                quota_min_bytes: Some(1 << 20),
                rejected: vec![("bad_magic", 2), ("torn_round", 0)],
                quota_changes: [("grow", 1)].into(),
                ..Default::default()
            }],
            nodes: vec![NodeStatus {
                id: NodeId(2),
                tier: Tier(1),
                kernel_tier: None,
                cpus: vec![],
                socket: 0,
                mem_total_bytes: 8 << 20,
                free_bytes: None,
                vm_resident_bytes: 0,
                worker_node: NodeId(0),
                mover_queued_batches: PerDirection::default(),
                mover_worker_pages: PerDirection {
                    promote: 0,
                    demote: 9,
                },
            }],
        }
    }

    #[test]
    fn exposition_from_the_typed_status() {
        let h = MoverHistograms::default();
        let p = Published::new(&h);
        p.publish(status());
        h.batch_latency.observe(0.0003);
        h.plan_seconds
            .observe(Duration::from_millis(20).as_secs_f64());
        let t = p.metrics_text();
        // One HELP and TYPE per family, counters named with `_total`, integers as integers,
        // label values escaped.
        assert_eq!(
            t.matches("# TYPE vtism_vm_ram_bytes gauge").count(),
            1,
            "{t}"
        );
        assert!(
            t.contains("# TYPE vtism_rounds_total counter\nvtism_rounds_total 7\n"),
            "{t}"
        );
        assert!(
            t.contains("vtism_vm_fast_quota_bytes{vm=\"a\\\"b\"} 3145728\n"),
            "{t}"
        );
        assert!(
            t.contains("vtism_vm_fast_quota_min_bytes{vm=\"a\\\"b\"} 1048576\n"),
            "{t}"
        );
        assert!(
            !t.contains("vtism_vm_fast_quota_max_bytes{"),
            "no limit, no sample: {t}"
        );
        assert!(
            t.contains("vtism_hint_rounds_rejected_total{vm=\"a\\\"b\",reason=\"torn_round\"} 0\n"),
            "{t}"
        );
        assert!(
            t.contains("vtism_vm_quota_changes_total{vm=\"a\\\"b\",reason=\"grow\"} 1\n"),
            "{t}"
        );
        assert!(t.contains("vtism_process_cpu_seconds_total 0.25\n"), "{t}");
        assert!(t.contains("vtism_mover_busy 1\n"), "{t}");
        assert!(
            t.contains("vtism_planned_bytes_total{kind=\"home\"} 4096\n"),
            "{t}"
        );
        assert!(
            t.contains("vtism_watermark_demoted_bytes_total 8192\n"),
            "{t}"
        );
        assert!(t.contains("vtism_mover_lanes_moving_peak 2\n"), "{t}");
        assert!(t.contains("vtism_host_numa_balancing 2\n"), "{t}");
        assert!(
            !t.contains("vtism_host_kernel_demotion_enabled"),
            "not readable, no sample: {t}"
        );
        assert!(t.contains("vtism_pool_mode{mode=\"pool\"} 1\n"), "{t}");
        assert!(t.contains("vtism_node_tier{node=\"2\"} 1\n"), "{t}");
        assert!(
            t.contains("vtism_mover_worker_pages_total{node=\"2\",dir=\"demote\"} 9\n"),
            "{t}"
        );
        assert!(
            t.contains("vtism_mover_batch_latency_seconds_bucket{le=\"0.0001\"} 0\n"),
            "{t}"
        );
        assert!(
            t.contains("vtism_mover_batch_latency_seconds_bucket{le=\"0.0005\"} 1\n"),
            "{t}"
        );
        assert!(
            t.contains("vtism_mover_batch_latency_seconds_bucket{le=\"+Inf\"} 1\n"),
            "{t}"
        );
        assert!(t.contains("vtism_mover_plan_seconds_count 1\n"), "{t}");
        assert!(
            !t.contains("# EOF"),
            "Prometheus text, not OpenMetrics: {t}"
        );
        // The JSON of the same status lists rejected rounds above zero only.
        let j = p.status_json();
        assert_eq!(
            j["vms"][0]["rejected_by_reason"],
            serde_json::json!({"bad_magic": 2})
        );
        assert_eq!(j["nodes"][0]["id"], 2);
        // No tracker report (a v1.0 guest): the fields are there, null.
        assert_eq!(j["vms"][0]["tracker_window_us"], serde_json::Value::Null);
        assert!(
            j["vms"][0]
                .as_object()
                .unwrap()
                .contains_key("tracker_cpu_us"),
            "{j}"
        );
        assert!(!t.contains("vtism_vm_tracker_cpu_seconds{"), "{t}");
        assert_eq!(j["pool"]["fast_bytes"], 4 << 20);
    }
}
