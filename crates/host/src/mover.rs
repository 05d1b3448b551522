//! Executes plans with move_pages(2): per-destination-node worker threads pinned near their
//! node, promote queues served before demote queues, phases in order, token-bucket rate limits
//! (global and per VM, per direction), per-page status handling.
//!
//! The pure parts (rate limiting, batching, status classification, quota trimming) are separate
//! from the threads and the syscall so they are unit-tested without privileges.

use crate::sys;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use vtism_engine::{Move, MoveKind, NodeId, Phase, VmId};
use vtism_proto::{Gfn, FRAME_SIZE};

// ---------------------------------------------------------------------------------------------
// Rate limiting

/// A token bucket in bytes. `rate == 0` is unlimited. Burst: one second of rate.
#[derive(Clone, Debug)]
pub struct TokenBucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    /// `mbps`: 10^6 bytes per second; 0 = unlimited.
    pub fn new(mbps: u64, now: Instant) -> TokenBucket {
        let rate = mbps as f64 * 1e6;
        TokenBucket {
            rate,
            burst: rate,
            tokens: rate,
            last: now,
        }
    }
    pub fn unlimited(&self) -> bool {
        self.rate == 0.0
    }
    fn refill(&mut self, now: Instant) {
        let dt = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + dt * self.rate).min(self.burst);
    }
    /// Bytes available now (u64::MAX when unlimited).
    pub fn available(&mut self, now: Instant) -> u64 {
        if self.unlimited() {
            return u64::MAX;
        }
        self.refill(now);
        self.tokens.max(0.0) as u64
    }
    /// Takes `bytes` and returns how long the caller must wait before using them: the bucket may
    /// go into debt, so a batch larger than the burst still goes through at the average rate.
    pub fn take(&mut self, bytes: u64, now: Instant) -> Duration {
        if self.unlimited() {
            return Duration::ZERO;
        }
        self.refill(now);
        self.tokens -= bytes as f64;
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / self.rate)
        }
    }
    /// How long a `take(bytes)` now would have to wait, without taking.
    pub fn wait_for(&mut self, bytes: u64, now: Instant) -> Duration {
        if self.unlimited() {
            return Duration::ZERO;
        }
        self.refill(now);
        let left = self.tokens - bytes as f64;
        if left >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-left / self.rate)
        }
    }
    pub fn set_rate(&mut self, mbps: u64, now: Instant) {
        self.refill(now);
        self.rate = mbps as f64 * 1e6;
        self.burst = self.rate;
        self.tokens = self.tokens.min(self.burst);
    }
}

/// Direction of a move, for queues and limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Dir {
    Promote,
    Demote,
}

impl Dir {
    pub fn of(kind: MoveKind) -> Dir {
        match kind {
            MoveKind::Promote => Dir::Promote,
            MoveKind::Demote | MoveKind::Refill => Dir::Demote,
        }
    }
    pub fn label(self) -> &'static str {
        match self {
            Dir::Promote => "promote",
            Dir::Demote => "demote",
        }
    }
}

/// Global and per-VM buckets, per direction.
pub struct Limits {
    global: [TokenBucket; 2],
    per_vm: HashMap<VmId, [TokenBucket; 2]>,
}

impl Limits {
    pub fn new(promote_mbps: u64, demote_mbps: u64, now: Instant) -> Limits {
        Limits {
            global: [
                TokenBucket::new(promote_mbps, now),
                TokenBucket::new(demote_mbps, now),
            ],
            per_vm: HashMap::new(),
        }
    }
    pub fn set_global(&mut self, promote_mbps: u64, demote_mbps: u64, now: Instant) {
        self.global[0].set_rate(promote_mbps, now);
        self.global[1].set_rate(demote_mbps, now);
    }
    pub fn set_vm(&mut self, vm: VmId, promote_mbps: u64, demote_mbps: u64, now: Instant) {
        match self.per_vm.get_mut(&vm) {
            Some(b) => {
                b[0].set_rate(promote_mbps, now);
                b[1].set_rate(demote_mbps, now);
            }
            None => {
                self.per_vm.insert(
                    vm,
                    [
                        TokenBucket::new(promote_mbps, now),
                        TokenBucket::new(demote_mbps, now),
                    ],
                );
            }
        }
    }
    pub fn remove_vm(&mut self, vm: VmId) {
        self.per_vm.remove(&vm);
    }
    /// Takes bytes from the global and the VM's bucket; returns the wait.
    pub fn take(&mut self, vm: VmId, dir: Dir, bytes: u64, now: Instant) -> Duration {
        let i = dir as usize;
        let g = self.global[i].take(bytes, now);
        let v = self
            .per_vm
            .get_mut(&vm)
            .map_or(Duration::ZERO, |b| b[i].take(bytes, now));
        g.max(v)
    }
    /// True if a VM's own bucket would make a batch wait now (the global buckets are shared,
    /// so waiting on them is fair to everyone).
    pub fn vm_throttled(&mut self, vm: VmId, dir: Dir, bytes: u64, now: Instant) -> bool {
        self.per_vm
            .get_mut(&vm)
            .is_some_and(|b| !b[dir as usize].wait_for(bytes, now).is_zero())
    }
    /// Bytes each VM with its own limits may move over `window` from now, per direction.
    pub fn vm_allowance(&mut self, window: Duration, now: Instant) -> HashMap<(VmId, Dir), u64> {
        let mut out = HashMap::new();
        for (vm, b) in self.per_vm.iter_mut() {
            for (i, dir) in [Dir::Promote, Dir::Demote].into_iter().enumerate() {
                if !b[i].unlimited() {
                    let avail = b[i].available(now) as f64 + b[i].rate * window.as_secs_f64();
                    out.insert((*vm, dir), avail as u64);
                }
            }
        }
        out
    }
    /// Bytes the global buckets allow over `window` from now: the plan budget. `None` when both
    /// directions are unlimited.
    pub fn budget(&mut self, window: Duration, now: Instant) -> Option<u64> {
        let mut total = 0u64;
        for b in self.global.iter_mut() {
            if b.unlimited() {
                return None;
            }
            let avail = b.available(now) as f64 + b.rate * window.as_secs_f64();
            total = total.saturating_add(avail as u64);
        }
        Some(total)
    }
}

// ---------------------------------------------------------------------------------------------
// Per-page status

/// What move_pages said about one page.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PageOutcome {
    /// On the target node now.
    Moved,
    /// On another node (the kernel would not move it there, or it moved since).
    OnOtherNode,
    /// Busy (locked, under writeback, pinned): retry later.
    Busy,
    /// Not mapped / not present (never touched, or the zero page): skip.
    NotPresent,
    /// The target node had no memory.
    NoMemory,
    /// Shared with another process and MOVE_ALL not allowed.
    Shared,
    /// Anything else.
    Failed,
}

impl PageOutcome {
    pub fn label(self) -> &'static str {
        match self {
            PageOutcome::Moved => "moved",
            PageOutcome::OnOtherNode => "on_other_node",
            PageOutcome::Busy => "busy",
            PageOutcome::NotPresent => "not_present",
            PageOutcome::NoMemory => "no_memory",
            PageOutcome::Shared => "shared",
            PageOutcome::Failed => "failed",
        }
    }
}

/// Classifies a move_pages status word for a page whose target was `target`.
pub fn classify(status: i32, target: i32) -> PageOutcome {
    if status == target {
        return PageOutcome::Moved;
    }
    if status >= 0 {
        return PageOutcome::OnOtherNode;
    }
    match -status {
        libc::EBUSY | libc::EAGAIN => PageOutcome::Busy,
        libc::ENOENT | libc::EFAULT => PageOutcome::NotPresent,
        libc::ENOMEM => PageOutcome::NoMemory,
        libc::EACCES | libc::EPERM => PageOutcome::Shared,
        _ => PageOutcome::Failed,
    }
}

// ---------------------------------------------------------------------------------------------
// Batches

/// Pages of one VM going to one node, one move_pages call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Batch {
    pub vm: VmId,
    pub pid: i32,
    pub to: NodeId,
    pub dir: Dir,
    /// `(gfn, hva, from)` per page.
    pub pages: Vec<(Gfn, u64, NodeId)>,
}

/// Splits moves into batches of at most `batch_pages`, grouped by (vm, destination, direction),
/// keeping the plan's order inside a group. Frames without an HVA are dropped (counted).
pub fn make_batches(
    moves: &[Move],
    batch_pages: usize,
    pid_of: impl Fn(VmId) -> Option<i32>,
    hva_of: impl Fn(VmId, Gfn) -> Option<u64>,
) -> (Vec<Batch>, u64) {
    type Key = (VmId, NodeId, Dir);
    let mut groups: BTreeMap<Key, Vec<(Gfn, u64, NodeId)>> = BTreeMap::new();
    let mut order: Vec<(VmId, NodeId, Dir)> = Vec::new();
    let mut pids: HashMap<VmId, i32> = HashMap::new();
    let mut dropped = 0u64;
    for m in moves {
        let pid = match pids.get(&m.vm) {
            Some(p) => *p,
            None => match pid_of(m.vm) {
                Some(p) => {
                    pids.insert(m.vm, p);
                    p
                }
                None => {
                    dropped += m.frames;
                    continue;
                }
            },
        };
        let _ = pid;
        let key = (m.vm, m.to, Dir::of(m.kind));
        let g = groups.entry(key).or_insert_with(|| {
            order.push(key);
            Vec::new()
        });
        for i in 0..m.frames {
            let gfn = Gfn(m.gfn.0 + i);
            match hva_of(m.vm, gfn) {
                Some(a) => g.push((gfn, a, m.from)),
                None => dropped += 1,
            }
        }
    }
    let mut out = Vec::new();
    for key in order {
        let pages = groups.remove(&key).unwrap_or_default();
        for chunk in pages.chunks(batch_pages.max(1)) {
            out.push(Batch {
                vm: key.0,
                pid: pids.get(&key.0).copied().unwrap_or(0),
                to: key.1,
                dir: key.2,
                pages: chunk.to_vec(),
            });
        }
    }
    (out, dropped)
}

/// After demotions fell short, drops PromoteAfterDemote moves of that VM (last first) until the
/// dropped frames cover the shortfall, so the VM never exceeds its fast quota. Returns the kept
/// moves and the dropped ones.
pub fn trim_after_demote(
    moves: Vec<Move>,
    shortfall: &HashMap<VmId, u64>,
) -> (Vec<Move>, Vec<Move>) {
    let mut need: HashMap<VmId, u64> = shortfall.clone();
    let mut keep_rev = Vec::new();
    let mut dropped = Vec::new();
    for m in moves.into_iter().rev() {
        match need.get_mut(&m.vm) {
            Some(n) if *n > 0 => {
                *n = n.saturating_sub(m.frames);
                dropped.push(m);
            }
            _ => keep_rev.push(m),
        }
    }
    keep_rev.reverse();
    (keep_rev, dropped)
}

/// Cuts a plan to what each VM's own rate limit allows this round (`allowance` in bytes per VM
/// and direction; VMs without an entry are unlimited), keeping it quota-safe: demotions that are
/// cut make the VM's PromoteAfterDemote moves shrink by as many frames (dropped from the end).
/// Moves are in phase order. Returns the kept moves and the dropped ones, whose frames stay where
/// they are. A slow VM then moves a little every round instead of holding the mover for many.
pub fn limit_per_vm(
    moves: Vec<Move>,
    allowance: &HashMap<(VmId, Dir), u64>,
) -> (Vec<Move>, Vec<Move>) {
    let mut left: HashMap<(VmId, Dir), u64> = allowance
        .iter()
        .map(|(k, b)| (*k, b / FRAME_SIZE))
        .collect();
    let mut kept = Vec::with_capacity(moves.len());
    let mut dropped = Vec::new();
    let mut shortfall: HashMap<VmId, u64> = HashMap::new();
    let mut after: Vec<Move> = Vec::new();
    for m in moves {
        if m.phase == Phase::PromoteAfterDemote {
            after.push(m);
            continue;
        }
        let key = (m.vm, Dir::of(m.kind));
        let (k, d) = split_to(m, left.get_mut(&key));
        if let Some(d) = d {
            if d.phase == Phase::Demote {
                *shortfall.entry(d.vm).or_default() += d.frames;
            }
            dropped.push(d);
        }
        kept.extend(k);
    }
    let (after, cut) = trim_after_demote(after, &shortfall);
    dropped.extend(cut);
    for m in after {
        let (k, d) = split_to(m, left.get_mut(&(m.vm, Dir::Promote)));
        kept.extend(k);
        dropped.extend(d);
    }
    (kept, dropped)
}

/// Splits a move (a run of frames) into the part `left` frames allow and the rest.
fn split_to(m: Move, left: Option<&mut u64>) -> (Option<Move>, Option<Move>) {
    let Some(l) = left else {
        return (Some(m), None);
    };
    let take = m.frames.min(*l);
    *l -= take;
    let kept = (take > 0).then_some(Move { frames: take, ..m });
    let rest = (take < m.frames).then_some(Move {
        gfn: Gfn(m.gfn.0 + take),
        frames: m.frames - take,
        ..m
    });
    (kept, rest)
}

// ---------------------------------------------------------------------------------------------
// Results

/// A page that did not end where the plan said: the engine must learn where it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Correction {
    pub vm: VmId,
    pub gfn: Gfn,
    /// Where it is now, as far as known (`None`: not present / unknown).
    pub node: Option<NodeId>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct VmMoveStats {
    pub promoted_bytes: u64,
    pub demoted_bytes: u64,
    pub pages_by_outcome: BTreeMap<PageOutcome, u64>,
    /// PromoteAfterDemote frames skipped because demotions fell short.
    pub trimmed_frames: u64,
}

/// What one executed plan did.
#[derive(Clone, Debug, Default)]
pub struct JobReport {
    pub id: u64,
    pub per_vm: BTreeMap<VmId, VmMoveStats>,
    pub corrections: Vec<Correction>,
    pub batches: u64,
    /// move_pages call latencies, seconds.
    pub latencies: Vec<f64>,
    pub elapsed: Duration,
    /// VMs whose process was gone (ESRCH).
    pub gone: Vec<VmId>,
}

// ---------------------------------------------------------------------------------------------
// Workers

#[derive(Clone, Debug)]
pub struct MoverSettings {
    pub batch_pages: usize,
    pub busy_retries: u32,
    pub busy_retry_delay: Duration,
    pub move_all: bool,
    pub madvise_cold: bool,
}

struct BatchResult {
    vm: VmId,
    dir: Dir,
    moved: u64,
    outcomes: BTreeMap<PageOutcome, u64>,
    corrections: Vec<Correction>,
    latency: f64,
    gone: bool,
    /// Frames that stayed on a fast node although the batch demoted them.
    not_demoted: u64,
}

struct Work {
    batch: Batch,
    done: Arc<Completion>,
}

/// Counts outstanding batches of a phase and collects their results.
struct Completion {
    state: Mutex<(usize, Vec<BatchResult>)>,
    cv: Condvar,
}

impl Completion {
    fn new(n: usize) -> Arc<Completion> {
        Arc::new(Completion {
            state: Mutex::new((n, Vec::with_capacity(n))),
            cv: Condvar::new(),
        })
    }
    fn finish(&self, r: BatchResult) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.0 = s.0.saturating_sub(1);
        s.1.push(r);
        self.cv.notify_all();
    }
    fn wait(&self) -> Vec<BatchResult> {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        while s.0 > 0 {
            s = self.cv.wait(s).unwrap_or_else(|e| e.into_inner());
        }
        std::mem::take(&mut s.1)
    }
}

#[derive(Default)]
struct Queues {
    promote: VecDeque<Work>,
    demote: VecDeque<Work>,
}

struct NodeWorker {
    queues: Mutex<Queues>,
    cv: Condvar,
}

/// Shared state the daemon reads for metrics.
#[derive(Default)]
pub struct MoverGauges {
    /// Batches queued, per destination node.
    pub queued: Mutex<BTreeMap<u8, (u64, u64)>>,
    /// Pages each node's worker handed to move_pages (promote, demote): a batch is only ever
    /// executed by the worker of its destination node.
    pub executed_pages: Mutex<BTreeMap<u8, (u64, u64)>>,
    pub busy: AtomicBool,
    pub jobs: AtomicU64,
}

/// The mover: a coordinator thread executing plans phase by phase over per-node workers.
pub struct Mover {
    tx: Option<mpsc::Sender<Job>>,
    rx_done: mpsc::Receiver<JobReport>,
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
    pub gauges: Arc<MoverGauges>,
    pub limits: Arc<Mutex<Limits>>,
    next_id: u64,
    in_flight: Option<u64>,
}

/// One plan to execute: its moves plus how to reach each VM's memory.
pub struct Job {
    pub id: u64,
    pub moves: Vec<Move>,
    /// Per VM: pid and guest memory (for HVAs).
    pub vms: HashMap<VmId, (i32, Arc<crate::mtree::GuestMemory>)>,
    pub fast_nodes: Vec<u8>,
}

impl Mover {
    /// `nodes`: (node id, CPUs its worker is pinned to).
    pub fn start(nodes: &[(u8, Vec<u32>)], settings: MoverSettings, limits: Limits) -> Mover {
        let stop = Arc::new(AtomicBool::new(false));
        let gauges = Arc::new(MoverGauges::default());
        let limits = Arc::new(Mutex::new(limits));
        let mut threads = Vec::new();
        let mut workers: HashMap<u8, Arc<NodeWorker>> = HashMap::new();
        for (node, cpus) in nodes {
            let w = Arc::new(NodeWorker {
                queues: Mutex::new(Queues::default()),
                cv: Condvar::new(),
            });
            workers.insert(*node, w.clone());
            let (stop, settings, limits, cpus, gauges, node) = (
                stop.clone(),
                settings.clone(),
                limits.clone(),
                cpus.clone(),
                gauges.clone(),
                *node,
            );
            threads.push(
                std::thread::Builder::new()
                    .name(format!("vtism-mover-n{node}"))
                    .spawn(move || {
                        if let Err(e) = sys::pin_current_thread(&cpus) {
                            tracing::warn!(node, error = %e, "cannot pin mover worker");
                        }
                        worker_loop(node, &w, &stop, &settings, &limits, &gauges)
                    })
                    .expect("spawn mover worker"),
            );
        }
        let (tx, rx) = mpsc::channel::<Job>();
        let (tx_done, rx_done) = mpsc::channel::<JobReport>();
        {
            let (stop, gauges) = (stop.clone(), gauges.clone());
            threads.push(
                std::thread::Builder::new()
                    .name("vtism-mover".into())
                    .spawn(move || {
                        while let Ok(job) = rx.recv() {
                            if stop.load(Ordering::SeqCst) {
                                break;
                            }
                            gauges.busy.store(true, Ordering::SeqCst);
                            let r = run_job(job, &workers, &settings, &gauges);
                            gauges.busy.store(false, Ordering::SeqCst);
                            gauges.jobs.fetch_add(1, Ordering::Relaxed);
                            if tx_done.send(r).is_err() {
                                break;
                            }
                        }
                        for w in workers.values() {
                            w.cv.notify_all();
                        }
                    })
                    .expect("spawn mover"),
            );
        }
        Mover {
            tx: Some(tx),
            rx_done,
            stop,
            threads,
            gauges,
            limits,
            next_id: 1,
            in_flight: None,
        }
    }

    /// True while a plan is executing.
    pub fn busy(&self) -> bool {
        self.in_flight.is_some()
    }

    /// Submits a plan; only one runs at a time (the caller plans again once it is done).
    pub fn submit(
        &mut self,
        moves: Vec<Move>,
        vms: HashMap<VmId, (i32, Arc<crate::mtree::GuestMemory>)>,
        fast_nodes: Vec<u8>,
    ) -> Option<u64> {
        if self.in_flight.is_some() || moves.is_empty() {
            return None;
        }
        let id = self.next_id;
        self.next_id += 1;
        let tx = self.tx.as_ref()?;
        tx.send(Job {
            id,
            moves,
            vms,
            fast_nodes,
        })
        .ok()?;
        self.in_flight = Some(id);
        Some(id)
    }

    /// The report of the plan in flight, if it finished.
    pub fn poll(&mut self) -> Option<JobReport> {
        match self.rx_done.try_recv() {
            Ok(r) => {
                self.in_flight = None;
                Some(r)
            }
            Err(_) => None,
        }
    }

    /// Waits for the plan in flight (tests, benchmarks).
    pub fn wait(&mut self, timeout: Duration) -> Option<JobReport> {
        self.in_flight?;
        match self.rx_done.recv_timeout(timeout) {
            Ok(r) => {
                self.in_flight = None;
                Some(r)
            }
            Err(_) => None,
        }
    }

    pub fn shutdown(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.tx.take();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Mover {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn run_job(
    job: Job,
    workers: &HashMap<u8, Arc<NodeWorker>>,
    settings: &MoverSettings,
    gauges: &MoverGauges,
) -> JobReport {
    let start = Instant::now();
    let mut report = JobReport {
        id: job.id,
        ..Default::default()
    };
    let mut by_phase: BTreeMap<Phase, Vec<Move>> = BTreeMap::new();
    for m in job.moves {
        by_phase.entry(m.phase).or_default().push(m);
    }
    let mut shortfall: HashMap<VmId, u64> = HashMap::new();
    let mut gone: std::collections::HashSet<VmId> = Default::default();
    for phase in [Phase::Promote, Phase::Demote, Phase::PromoteAfterDemote] {
        let Some(mut moves) = by_phase.remove(&phase) else {
            continue;
        };
        moves.retain(|m| !gone.contains(&m.vm));
        if phase == Phase::PromoteAfterDemote {
            let (keep, dropped) = trim_after_demote(moves, &shortfall);
            for m in dropped {
                report.per_vm.entry(m.vm).or_default().trimmed_frames += m.frames;
                for i in 0..m.frames {
                    report.corrections.push(Correction {
                        vm: m.vm,
                        gfn: Gfn(m.gfn.0 + i),
                        node: Some(m.from),
                    });
                }
            }
            moves = keep;
        }
        let (batches, _dropped) = make_batches(
            &moves,
            settings.batch_pages,
            |vm| job.vms.get(&vm).map(|v| v.0),
            |vm, g| job.vms.get(&vm).and_then(|v| v.1.hva(g)),
        );
        let done = Completion::new(batches.len());
        let mut queued_now = 0usize;
        for b in batches {
            let Some(w) = workers.get(&b.to.0) else {
                done.finish(BatchResult {
                    vm: b.vm,
                    dir: b.dir,
                    moved: 0,
                    outcomes: [(PageOutcome::Failed, b.pages.len() as u64)].into(),
                    corrections: b
                        .pages
                        .iter()
                        .map(|&(gfn, _, from)| Correction {
                            vm: b.vm,
                            gfn,
                            node: Some(from),
                        })
                        .collect(),
                    latency: 0.0,
                    gone: false,
                    not_demoted: if b.dir == Dir::Demote {
                        b.pages.len() as u64
                    } else {
                        0
                    },
                });
                continue;
            };
            let node = b.to.0;
            let dir = b.dir;
            {
                let mut q = w.queues.lock().unwrap_or_else(|e| e.into_inner());
                let work = Work {
                    batch: b,
                    done: done.clone(),
                };
                match dir {
                    Dir::Promote => q.promote.push_back(work),
                    Dir::Demote => q.demote.push_back(work),
                }
            }
            {
                let mut g = gauges.queued.lock().unwrap_or_else(|e| e.into_inner());
                let e = g.entry(node).or_default();
                match dir {
                    Dir::Promote => e.0 += 1,
                    Dir::Demote => e.1 += 1,
                }
            }
            w.cv.notify_one();
            queued_now += 1;
        }
        let _ = queued_now;
        for r in done.wait() {
            report.batches += 1;
            report.latencies.push(r.latency);
            let st = report.per_vm.entry(r.vm).or_default();
            let bytes = r.moved * FRAME_SIZE;
            match r.dir {
                Dir::Promote => st.promoted_bytes += bytes,
                Dir::Demote => st.demoted_bytes += bytes,
            }
            for (o, c) in r.outcomes {
                *st.pages_by_outcome.entry(o).or_default() += c;
            }
            if r.gone {
                gone.insert(r.vm);
            }
            if phase == Phase::Demote {
                *shortfall.entry(r.vm).or_default() += r.not_demoted;
            }
            report.corrections.extend(r.corrections);
        }
        let _ = &job.fast_nodes;
    }
    report.gone = gone.into_iter().collect();
    report.elapsed = start.elapsed();
    report
}

fn worker_loop(
    node: u8,
    w: &NodeWorker,
    stop: &AtomicBool,
    settings: &MoverSettings,
    limits: &Mutex<Limits>,
    gauges: &MoverGauges,
) {
    loop {
        let work = {
            let mut q = w.queues.lock().unwrap_or_else(|e| e.into_inner());
            loop {
                if stop.load(Ordering::SeqCst) {
                    // Drop what is queued; the phases waiting on it are released.
                    let mut rest: Vec<Work> = q.promote.drain(..).collect();
                    rest.extend(q.demote.drain(..));
                    drop(q);
                    for wk in rest {
                        let b = &wk.batch;
                        wk.done.finish(BatchResult {
                            vm: b.vm,
                            dir: b.dir,
                            moved: 0,
                            outcomes: BTreeMap::new(),
                            corrections: Vec::new(),
                            latency: 0.0,
                            gone: false,
                            not_demoted: if b.dir == Dir::Demote {
                                b.pages.len() as u64
                            } else {
                                0
                            },
                        });
                    }
                    return;
                }
                // Promotions first: they are what the VM is waiting for. A batch whose VM is
                // over its own rate limit lets other VMs' batches go first.
                if let Some(i) = pick_ready(&q, limits) {
                    let np = q.promote.len();
                    let wk = if i < np {
                        q.promote.remove(i)
                    } else {
                        q.demote.remove(i - np)
                    };
                    if let Some(wk) = wk {
                        break wk;
                    }
                }
                if let Some(wk) = q.promote.pop_front() {
                    break wk;
                }
                if let Some(wk) = q.demote.pop_front() {
                    break wk;
                }
                q =
                    w.cv.wait_timeout(q, Duration::from_millis(200))
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
            }
        };
        {
            let mut g = gauges.queued.lock().unwrap_or_else(|e| e.into_inner());
            let e = g.entry(node).or_default();
            match work.batch.dir {
                Dir::Promote => e.0 = e.0.saturating_sub(1),
                Dir::Demote => e.1 = e.1.saturating_sub(1),
            }
        }
        let bytes = work.batch.pages.len() as u64 * FRAME_SIZE;
        let wait = limits.lock().unwrap_or_else(|e| e.into_inner()).take(
            work.batch.vm,
            work.batch.dir,
            bytes,
            Instant::now(),
        );
        if !wait.is_zero() {
            // Sleep in slices so a stop is honoured quickly.
            let until = Instant::now() + wait;
            while Instant::now() < until && !stop.load(Ordering::SeqCst) {
                std::thread::sleep((until - Instant::now()).min(Duration::from_millis(50)));
            }
        }
        let r = execute_batch(&work.batch, settings);
        {
            let n = work.batch.pages.len() as u64;
            let mut g = gauges
                .executed_pages
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let e = g.entry(node).or_default();
            match work.batch.dir {
                Dir::Promote => e.0 += n,
                Dir::Demote => e.1 += n,
            }
        }
        work.done.finish(r);
    }
}

/// Index (promote queue first, then demote) of the first batch whose VM is not held back by its
/// own rate limit.
fn pick_ready(q: &Queues, limits: &Mutex<Limits>) -> Option<usize> {
    let mut l = limits.lock().unwrap_or_else(|e| e.into_inner());
    let now = Instant::now();
    q.promote.iter().chain(q.demote.iter()).position(|wk| {
        let b = &wk.batch;
        !l.vm_throttled(b.vm, b.dir, b.pages.len() as u64 * FRAME_SIZE, now)
    })
}

/// Runs one batch: move_pages, then busy pages retried, then corrections for what did not move.
fn execute_batch(b: &Batch, s: &MoverSettings) -> BatchResult {
    let flags = if s.move_all {
        sys::MPOL_MF_MOVE_ALL
    } else {
        sys::MPOL_MF_MOVE
    };
    let target = b.to.0 as i32;
    let mut pending: Vec<usize> = (0..b.pages.len()).collect();
    let mut final_status = vec![-libc::EBUSY; b.pages.len()];
    let t0 = Instant::now();
    let mut gone = false;
    for attempt in 0..=s.busy_retries {
        if attempt > 0 {
            std::thread::sleep(s.busy_retry_delay);
        }
        let addrs: Vec<u64> = pending.iter().map(|&i| b.pages[i].1).collect();
        let nodes = vec![target; addrs.len()];
        let mut status = vec![0i32; addrs.len()];
        match sys::move_pages(b.pid, &addrs, Some(&nodes), &mut status, flags) {
            Ok(_) => {}
            Err(e) => {
                let errno = e.raw_os_error().unwrap_or(libc::EIO);
                if errno == libc::ESRCH {
                    gone = true;
                }
                // A whole-call failure (ESRCH, EPERM, ENOMEM...): nothing known about the pages.
                for &i in &pending {
                    final_status[i] = -errno;
                }
                break;
            }
        }
        let mut still = Vec::new();
        for (k, &i) in pending.iter().enumerate() {
            final_status[i] = status[k];
            if classify(status[k], target) == PageOutcome::Busy {
                still.push(i);
            }
        }
        pending = still;
        if pending.is_empty() {
            break;
        }
    }
    let latency = t0.elapsed().as_secs_f64();
    let mut outcomes: BTreeMap<PageOutcome, u64> = BTreeMap::new();
    let mut corrections = Vec::new();
    let mut moved = 0u64;
    let mut not_demoted = 0u64;
    let mut cold_ranges: Vec<(u64, u64)> = Vec::new();
    for (i, &(gfn, hva, from)) in b.pages.iter().enumerate() {
        let st = final_status[i];
        let o = if gone {
            PageOutcome::Failed
        } else {
            classify(st, target)
        };
        *outcomes.entry(o).or_default() += 1;
        match o {
            PageOutcome::Moved => {
                moved += 1;
                if b.dir == Dir::Demote && s.madvise_cold {
                    match cold_ranges.last_mut() {
                        Some((a, l)) if *a + *l == hva => *l += FRAME_SIZE,
                        _ => cold_ranges.push((hva, FRAME_SIZE)),
                    }
                }
            }
            PageOutcome::OnOtherNode => {
                corrections.push(Correction {
                    vm: b.vm,
                    gfn,
                    node: Some(NodeId(st as u8)),
                });
                if b.dir == Dir::Demote {
                    // Conservatively: a page not on the demotion target may still be fast.
                    not_demoted += 1;
                }
            }
            PageOutcome::NotPresent => corrections.push(Correction {
                vm: b.vm,
                gfn,
                node: None,
            }),
            _ => {
                corrections.push(Correction {
                    vm: b.vm,
                    gfn,
                    node: Some(from),
                });
                if b.dir == Dir::Demote {
                    not_demoted += 1;
                }
            }
        }
    }
    if !cold_ranges.is_empty() && !gone {
        match sys::pidfd_open(b.pid).and_then(|fd| sys::madvise_cold(&fd, &cold_ranges)) {
            Ok(_) => {}
            Err(e) => tracing::debug!(vm = %b.vm, error = %e, "process_madvise(MADV_COLD)"),
        }
    }
    BatchResult {
        vm: b.vm,
        dir: b.dir,
        moved,
        outcomes,
        corrections,
        latency,
        gone,
        not_demoted,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mv(vm: u32, gfn: u64, frames: u64, to: u8, kind: MoveKind, phase: Phase) -> Move {
        Move {
            vm: VmId(vm),
            gfn: Gfn(gfn),
            frames,
            from: NodeId(if to == 0 { 2 } else { 0 }),
            to: NodeId(to),
            kind,
            phase,
        }
    }

    #[test]
    fn bucket_rates_and_debt() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(1, t0); // 1 MB/s, burst 1 MB
        assert_eq!(b.available(t0), 1_000_000);
        assert_eq!(b.take(500_000, t0), Duration::ZERO);
        // 1.5 MB more: 1 MB of debt = 1 s wait.
        let w = b.take(1_500_000, t0);
        assert!((w.as_secs_f64() - 1.0).abs() < 1e-6, "{w:?}");
        let t1 = t0 + Duration::from_secs(3);
        // Refills to the burst, no further.
        assert_eq!(b.available(t1), 1_000_000);
        let mut u = TokenBucket::new(0, t0);
        assert_eq!(u.take(u64::MAX, t0), Duration::ZERO);
        assert_eq!(u.available(t0), u64::MAX);
    }

    #[test]
    fn limits_take_the_stricter_of_global_and_vm() {
        let t0 = Instant::now();
        let mut l = Limits::new(100, 0, t0);
        l.set_vm(VmId(1), 1, 0, t0);
        assert_eq!(l.take(VmId(1), Dir::Promote, 1_000_000, t0), Duration::ZERO);
        let w = l.take(VmId(1), Dir::Promote, 1_000_000, t0);
        assert!(w >= Duration::from_millis(999), "{w:?}");
        // Another VM only sees the global bucket (99 MB left).
        assert_eq!(l.take(VmId(2), Dir::Promote, 1_000_000, t0), Duration::ZERO);
        assert_eq!(
            l.budget(Duration::from_secs(1), t0),
            None,
            "demote unlimited"
        );
        let mut l2 = Limits::new(10, 10, t0);
        let b = l2.budget(Duration::from_secs(1), t0).unwrap();
        assert_eq!(b, 40_000_000);
    }

    #[test]
    fn a_throttled_vm_does_not_hold_back_others() {
        let t0 = Instant::now();
        let limits = Mutex::new(Limits::new(0, 0, t0));
        limits.lock().unwrap().set_vm(VmId(1), 1, 1, t0);
        // VM 1 spends its burst.
        let _ = limits
            .lock()
            .unwrap()
            .take(VmId(1), Dir::Promote, 2_000_000, t0);
        let done = Completion::new(2);
        let work = |vm: u32| Work {
            batch: Batch {
                vm: VmId(vm),
                pid: 1,
                to: NodeId(0),
                dir: Dir::Promote,
                pages: vec![(Gfn(0), 0, NodeId(2)); 16],
            },
            done: done.clone(),
        };
        let mut q = Queues::default();
        q.promote.push_back(work(1));
        q.promote.push_back(work(2));
        assert_eq!(pick_ready(&q, &limits), Some(1), "VM 2's batch goes first");
        q.promote.remove(1);
        assert_eq!(
            pick_ready(&q, &limits),
            None,
            "only the throttled VM is left"
        );
    }

    #[test]
    fn per_vm_limits_cut_plans_quota_safely() {
        let moves = vec![
            mv(1, 0, 4, 0, MoveKind::Promote, Phase::Promote),
            mv(2, 0, 100, 0, MoveKind::Promote, Phase::Promote),
            mv(1, 100, 4, 2, MoveKind::Demote, Phase::Demote),
            mv(1, 200, 4, 2, MoveKind::Demote, Phase::Demote),
            mv(1, 300, 4, 0, MoveKind::Promote, Phase::PromoteAfterDemote),
            mv(1, 400, 4, 0, MoveKind::Promote, Phase::PromoteAfterDemote),
        ];
        // VM 1 may promote 12 frames and demote 6 this round; VM 2 is unlimited.
        let allow: HashMap<(VmId, Dir), u64> = [
            ((VmId(1), Dir::Promote), 12 * FRAME_SIZE),
            ((VmId(1), Dir::Demote), 6 * FRAME_SIZE),
        ]
        .into();
        let (kept, dropped) = limit_per_vm(moves, &allow);
        let k: Vec<(u32, u64, u64)> = kept.iter().map(|m| (m.vm.0, m.gfn.0, m.frames)).collect();
        // The second demotion is split (2 of 4 frames), so PromoteAfterDemote shrinks by at least
        // 2 frames (the whole last move) although the promote allowance would have covered it:
        // the quota must hold.
        assert_eq!(
            k,
            vec![
                (1, 0, 4),
                (2, 0, 100),
                (1, 100, 4),
                (1, 200, 2),
                (1, 300, 4)
            ]
        );
        let d: Vec<(u64, u64)> = dropped.iter().map(|m| (m.gfn.0, m.frames)).collect();
        assert_eq!(d, vec![(202, 2), (400, 4)]);
        let (kept, dropped) = limit_per_vm(kept, &HashMap::new());
        assert_eq!((kept.len(), dropped.len()), (5, 0));
        // A long run is split to the allowance, not starved.
        let long = vec![mv(3, 0, 5000, 0, MoveKind::Promote, Phase::Promote)];
        let allow: HashMap<(VmId, Dir), u64> = [((VmId(3), Dir::Promote), 600 * FRAME_SIZE)].into();
        let (kept, dropped) = limit_per_vm(long, &allow);
        assert_eq!((kept[0].gfn.0, kept[0].frames), (0, 600));
        assert_eq!((dropped[0].gfn.0, dropped[0].frames), (600, 4400));
    }

    #[test]
    fn status_classes() {
        assert_eq!(classify(0, 0), PageOutcome::Moved);
        assert_eq!(classify(2, 0), PageOutcome::OnOtherNode);
        assert_eq!(classify(-libc::EBUSY, 0), PageOutcome::Busy);
        assert_eq!(classify(-libc::EAGAIN, 0), PageOutcome::Busy);
        assert_eq!(classify(-libc::ENOENT, 0), PageOutcome::NotPresent);
        assert_eq!(classify(-libc::EFAULT, 0), PageOutcome::NotPresent);
        assert_eq!(classify(-libc::ENOMEM, 0), PageOutcome::NoMemory);
        assert_eq!(classify(-libc::EACCES, 0), PageOutcome::Shared);
        assert_eq!(classify(-libc::EIO, 0), PageOutcome::Failed);
    }

    #[test]
    fn batches_group_and_split() {
        let moves = vec![
            mv(1, 0, 5, 0, MoveKind::Promote, Phase::Promote),
            mv(2, 100, 2, 0, MoveKind::Promote, Phase::Promote),
            mv(1, 10, 2, 0, MoveKind::Promote, Phase::Promote),
            mv(1, 20, 1, 2, MoveKind::Demote, Phase::Demote),
        ];
        let (b, dropped) = make_batches(
            &moves,
            4,
            |vm| (vm != VmId(2)).then_some(42),
            |_, g| (g.0 != 3).then_some(0x1000 * g.0),
        );
        assert_eq!(dropped, 2 + 1, "VM 2 unknown, frame 3 without HVA");
        assert_eq!(b.len(), 3);
        assert_eq!(b[0].pages.len(), 4);
        assert_eq!(b[0].pages[0], (Gfn(0), 0, NodeId(2)));
        assert_eq!(
            b[1].pages.iter().map(|p| p.0 .0).collect::<Vec<_>>(),
            vec![10, 11]
        );
        assert_eq!((b[2].to, b[2].dir, b[2].pid), (NodeId(2), Dir::Demote, 42));
    }

    #[test]
    fn trimming_covers_the_shortfall_from_the_end() {
        let moves = vec![
            mv(1, 0, 4, 0, MoveKind::Promote, Phase::PromoteAfterDemote),
            mv(2, 0, 4, 0, MoveKind::Promote, Phase::PromoteAfterDemote),
            mv(1, 8, 2, 0, MoveKind::Promote, Phase::PromoteAfterDemote),
            mv(1, 16, 2, 0, MoveKind::Promote, Phase::PromoteAfterDemote),
        ];
        let short: HashMap<VmId, u64> = [(VmId(1), 3)].into();
        let (keep, dropped) = trim_after_demote(moves, &short);
        assert_eq!(dropped.len(), 2);
        assert!(dropped.iter().all(|m| m.vm == VmId(1) && m.gfn.0 >= 8));
        assert_eq!(keep.len(), 2);
        let (keep, dropped) = trim_after_demote(keep, &HashMap::new());
        assert_eq!((keep.len(), dropped.len()), (2, 0));
    }

    /// Real move_pages on this process: moving to the node a page is on succeeds, an unmapped
    /// address is reported as not present, a bogus node is an error, never a panic.
    #[test]
    fn execute_batch_on_self() {
        let mut buf = vec![1u8; 8 * 4096];
        let base = (buf.as_mut_ptr() as u64 + 4095) & !4095;
        let pages: Vec<(Gfn, u64, NodeId)> = (0..4)
            .map(|i| (Gfn(i), base + i * 4096, NodeId(0)))
            .chain(std::iter::once((Gfn(9), 0x1000, NodeId(0))))
            .collect();
        let b = Batch {
            vm: VmId(1),
            pid: std::process::id() as i32,
            to: NodeId(0),
            dir: Dir::Promote,
            pages,
        };
        let s = MoverSettings {
            batch_pages: 16,
            busy_retries: 1,
            busy_retry_delay: Duration::from_millis(1),
            move_all: false,
            madvise_cold: false,
        };
        let r = execute_batch(&b, &s);
        assert_eq!(
            r.outcomes.get(&PageOutcome::Moved),
            Some(&4),
            "{:?}",
            r.outcomes
        );
        assert_eq!(r.outcomes.get(&PageOutcome::NotPresent), Some(&1));
        assert_eq!(
            r.corrections,
            vec![Correction {
                vm: VmId(1),
                gfn: Gfn(9),
                node: None
            }]
        );
        drop(buf);
    }

    /// A plan with moves to two nodes: each batch is executed by its destination node's worker
    /// (real threads and real move_pages calls on this process; node 1 may not exist here, which
    /// only fails those pages).
    #[test]
    fn batches_run_on_their_destination_nodes_worker() {
        use crate::mtree::{GuestMemory, MappedRange};
        use vtism_proto::GfnRange;
        let mut buf = vec![1u8; 17 * 4096];
        let base = (buf.as_mut_ptr() as u64 + 4095) & !4095;
        let mem = GuestMemory::new(vec![MappedRange {
            gfns: GfnRange::new(Gfn(0), Gfn(16)),
            hva: base,
            name: "ram".into(),
        }])
        .unwrap();
        let settings = MoverSettings {
            batch_pages: 4,
            busy_retries: 0,
            busy_retry_delay: Duration::from_millis(1),
            move_all: false,
            madvise_cold: false,
        };
        let mut m = Mover::start(
            &[(0, vec![0]), (1, vec![0]), (2, vec![0])],
            settings,
            Limits::new(0, 0, Instant::now()),
        );
        let moves = vec![
            mv(1, 0, 6, 1, MoveKind::Promote, Phase::Promote),
            mv(1, 6, 2, 0, MoveKind::Promote, Phase::Promote),
            mv(1, 8, 3, 2, MoveKind::Demote, Phase::Demote),
        ];
        let vms = [(VmId(1), (std::process::id() as i32, Arc::new(mem)))].into();
        m.submit(moves, vms, vec![0, 1]).unwrap();
        let r = m.wait(Duration::from_secs(30)).expect("the plan finishes");
        assert_eq!(r.batches, 4, "6 pages in batches of 4, 2 pages, 3 pages");
        let done = m.gauges.executed_pages.lock().unwrap().clone();
        assert_eq!(
            done,
            [(0, (2, 0)), (1, (6, 0)), (2, (0, 3))].into(),
            "pages per worker (promote, demote)"
        );
        m.shutdown();
        drop(buf);
    }
}
