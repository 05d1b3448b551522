//! Where pages move: a coordinator thread runs one plan at a time, phase by phase (promotions
//! that fit, demotions, promotions into the room they freed), over worker threads in lanes
//! (seed 002's queue pairs per node): promotions on a lane per destination and source node, on
//! the destination's CPUs, so that several source nodes promote at once; demotions on a lane per
//! source node, on its CPUs, at a lower priority (nice), so that guests and promotions come
//! first and demotions still advance. Workers pace each VM by its own rate limit and let a
//! throttled VM's batches wait behind the others'. A plan's promotions that needed demotions
//! which fell short are dropped, so no VM exceeds its quota.

use crate::batch::{
    execute_batch, make_batches, Batch, BatchResult, Batches, CallSettings, PageOutcome, VmTarget,
};
use crate::rate::Limits;
use crate::sys;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use vtism_engine::{trim_after_demote, Direction, Move, NodeId, Phase, PlacementRun, VmId};
use vtism_proto::FRAME_SIZE;

#[derive(Clone, Debug)]
pub struct MoverSettings {
    /// Pages per move_pages(2) call.
    pub batch_pages: usize,
    pub call: CallSettings,
    /// A promotion lane per source node (else one per destination: sources take turns).
    pub parallel_sources: bool,
    /// Nice levels the demotion workers run below the daemon.
    pub demote_nice: i32,
}

/// What one VM's moves did, per plan or summed over the daemon's life.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct VmMoveStats {
    pub promoted_bytes: u64,
    pub demoted_bytes: u64,
    /// Moved between slow nodes, nearer the VM's home (`MoveKind::NearSlow`): not a demotion.
    pub near_slow_bytes: u64,
    pub pages_by_outcome: BTreeMap<PageOutcome, u64>,
    /// PromoteAfterDemote frames skipped because demotions fell short.
    pub trimmed_frames: u64,
}

impl VmMoveStats {
    fn add(&mut self, o: &VmMoveStats) {
        self.promoted_bytes += o.promoted_bytes;
        self.demoted_bytes += o.demoted_bytes;
        self.near_slow_bytes += o.near_slow_bytes;
        for (k, c) in &o.pages_by_outcome {
            *self.pages_by_outcome.entry(*k).or_default() += c;
        }
        self.trimmed_frames += o.trimmed_frames;
    }
}

/// What one executed plan did.
#[derive(Clone, Debug, Default)]
pub struct JobReport {
    pub id: u64,
    pub per_vm: BTreeMap<VmId, VmMoveStats>,
    /// Pages that did not end where the plan said, and where they are (sorted by VM and frame,
    /// so they reach the engine in runs).
    pub facts: Vec<PlacementRun>,
    pub batches: u64,
    /// move_pages call latencies, seconds.
    pub latencies: Vec<f64>,
    pub elapsed: Duration,
    /// VMs whose process was gone (ESRCH).
    pub gone: Vec<VmId>,
    /// The batch that took longest from being queued to its end: what a slow plan waited for.
    pub slowest: Option<SlowestBatch>,
}

/// One batch of a plan, for the log line of a plan that took long.
#[derive(Clone, Debug, PartialEq)]
pub struct SlowestBatch {
    pub vm: VmId,
    pub dir: Direction,
    pub from: NodeId,
    pub to: NodeId,
    pub frames: u64,
    /// Seconds queued (the lane busy, the VM's rate limit).
    pub waited: f64,
    /// Seconds in move_pages.
    pub moving: f64,
}

impl SlowestBatch {
    fn of(r: &BatchResult) -> SlowestBatch {
        SlowestBatch {
            vm: r.vm,
            dir: r.dir,
            from: r.from,
            to: r.to,
            frames: r.outcomes.values().sum(),
            waited: r.waited,
            moving: r.latency,
        }
    }

    pub fn seconds(&self) -> f64 {
        self.waited + self.moving
    }
}

/// Per-VM move statistics over the daemon's life (a restarted mover keeps them).
#[derive(Debug, Default)]
pub struct MoveTotals {
    per_vm: BTreeMap<VmId, VmMoveStats>,
}

impl MoveTotals {
    pub fn record(&mut self, r: &JobReport) {
        for (vm, st) in &r.per_vm {
            self.per_vm.entry(*vm).or_default().add(st);
        }
    }
    pub fn vm(&self, vm: VmId) -> VmMoveStats {
        self.per_vm.get(&vm).cloned().unwrap_or_default()
    }
    pub fn remove_vm(&mut self, vm: VmId) {
        self.per_vm.remove(&vm);
    }
}

struct Work {
    batch: crate::batch::Batch,
    done: Arc<Completion>,
    queued_at: Instant,
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

/// The worker a batch runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Lane {
    /// Promotions into `to` (from `from`, when sources promote in parallel), on `to`'s CPUs.
    Promote { to: NodeId, from: Option<NodeId> },
    /// Demotions out of `from`, on its CPUs, at a lower priority.
    Demote { from: NodeId },
}

impl Lane {
    fn of(b: &Batch, parallel_sources: bool) -> Lane {
        match b.dir {
            Direction::Promote => Lane::Promote {
                to: b.to,
                from: parallel_sources.then_some(b.from),
            },
            Direction::Demote => Lane::Demote { from: b.from },
        }
    }

    /// The node whose CPUs run the lane, and whose worker its pages count for.
    pub fn node(self) -> NodeId {
        match self {
            Lane::Promote { to, .. } => to,
            Lane::Demote { from } => from,
        }
    }

    pub fn dir(self) -> Direction {
        match self {
            Lane::Promote { .. } => Direction::Promote,
            Lane::Demote { .. } => Direction::Demote,
        }
    }

    /// A thread name (15 bytes, what Linux keeps, up to node 99): `vtism-mv-p0-2` promotes
    /// from 2 into 0, `vtism-mv-d0` demotes out of 0.
    fn thread_name(self) -> String {
        match self {
            Lane::Promote { to, from: Some(f) } => format!("vtism-mv-p{}-{}", to.0, f.0),
            Lane::Promote { to, from: None } => format!("vtism-mv-p{}", to.0),
            Lane::Demote { from } => format!("vtism-mv-d{}", from.0),
        }
    }
}

struct LaneWorker {
    queue: Mutex<VecDeque<Work>>,
    cv: Condvar,
}

/// The lanes a mover has started, each with its thread; a lane starts with its first batch.
struct Lanes {
    /// CPUs near each node (its own, or the nearest node's for a CPU-less node).
    cpus: HashMap<NodeId, Vec<u32>>,
    settings: MoverSettings,
    lanes: HashMap<Lane, Arc<LaneWorker>>,
    threads: Vec<std::thread::JoinHandle<()>>,
    stop: Arc<AtomicBool>,
    limits: Arc<Mutex<Limits>>,
    gauges: Arc<MoverGauges>,
}

impl Lanes {
    /// The lane's worker, started now if it is the lane's first batch; `None` for a node the
    /// mover does not know (or a thread that cannot start).
    fn get(&mut self, lane: Lane) -> Option<Arc<LaneWorker>> {
        if let Some(w) = self.lanes.get(&lane) {
            return Some(w.clone());
        }
        let cpus = self.cpus.get(&lane.node())?.clone();
        let w = Arc::new(LaneWorker {
            queue: Mutex::new(VecDeque::new()),
            cv: Condvar::new(),
        });
        let (wc, stop, call, limits, gauges) = (
            w.clone(),
            self.stop.clone(),
            self.settings.call.clone(),
            self.limits.clone(),
            self.gauges.clone(),
        );
        let nice = match lane.dir() {
            Direction::Demote => self.settings.demote_nice,
            Direction::Promote => 0,
        };
        let spawned = std::thread::Builder::new()
            .name(lane.thread_name())
            .spawn(move || {
                if let Err(e) = sys::pin_current_thread(&cpus) {
                    tracing::warn!(lane = ?lane, error = %e, "cannot pin mover worker");
                }
                if nice > 0 {
                    if let Err(e) = sys::lower_current_thread_priority(nice) {
                        tracing::warn!(lane = ?lane, nice, error = %e, "cannot lower the demotion worker's priority");
                    }
                }
                worker_loop(lane, &wc, &stop, &call, &limits, &gauges)
            });
        match spawned {
            Ok(t) => self.threads.push(t),
            Err(e) => {
                tracing::warn!(lane = ?lane, error = %e, "cannot start a mover worker");
                return None;
            }
        }
        self.lanes.insert(lane, w.clone());
        Some(w)
    }

    /// Wakes every worker (to see the stop) and waits for them.
    fn join(&mut self) {
        for w in self.lanes.values() {
            w.cv.notify_all();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Pages or batches per node and direction.
pub type PerNodeDir = BTreeMap<(NodeId, Direction), u64>;

/// Shared state the daemon reads for metrics.
#[derive(Default)]
pub struct MoverGauges {
    /// Batches queued, per node (promotions into it, demotions out of it).
    pub queued: Mutex<PerNodeDir>,
    /// Pages each node's workers handed to move_pages: promotions count for their destination
    /// node, demotions for their source node.
    pub executed_pages: Mutex<PerNodeDir>,
    pub busy: AtomicBool,
    pub jobs: AtomicU64,
    /// Workers inside move_pages now, and the most there were at once.
    pub lanes_moving: AtomicU64,
    pub lanes_moving_peak: AtomicU64,
}

impl MoverGauges {
    fn add(map: &Mutex<PerNodeDir>, node: NodeId, dir: Direction, n: i64) {
        let mut g = map.lock().unwrap_or_else(|e| e.into_inner());
        let e = g.entry((node, dir)).or_default();
        *e = e.saturating_add_signed(n);
    }
    pub fn snapshot(map: &Mutex<PerNodeDir>) -> PerNodeDir {
        map.lock().map(|m| m.clone()).unwrap_or_default()
    }
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
    /// The plan executing, and since when.
    in_flight: Option<(u64, Instant)>,
}

/// One plan to execute: its moves plus how to reach each VM's memory.
pub struct Job {
    pub id: u64,
    pub moves: Vec<Move>,
    pub vms: HashMap<VmId, VmTarget>,
}

impl Mover {
    /// `nodes`: (node id, the CPUs near it, where its lanes run).
    pub fn start(nodes: &[(NodeId, Vec<u32>)], settings: MoverSettings, limits: Limits) -> Mover {
        let stop = Arc::new(AtomicBool::new(false));
        let gauges = Arc::new(MoverGauges::default());
        let limits = Arc::new(Mutex::new(limits));
        let mut lanes = Lanes {
            cpus: nodes.iter().cloned().collect(),
            settings,
            lanes: HashMap::new(),
            threads: Vec::new(),
            stop: stop.clone(),
            limits: limits.clone(),
            gauges: gauges.clone(),
        };
        let (tx, rx) = mpsc::channel::<Job>();
        let (tx_done, rx_done) = mpsc::channel::<JobReport>();
        let coordinator = {
            let (stop, gauges) = (stop.clone(), gauges.clone());
            std::thread::Builder::new()
                .name("vtism-mover".into())
                .spawn(move || {
                    while let Ok(job) = rx.recv() {
                        if stop.load(Ordering::SeqCst) {
                            break;
                        }
                        gauges.busy.store(true, Ordering::SeqCst);
                        let r = run_job(job, &mut lanes, &gauges);
                        gauges.busy.store(false, Ordering::SeqCst);
                        gauges.jobs.fetch_add(1, Ordering::Relaxed);
                        if tx_done.send(r).is_err() {
                            break;
                        }
                    }
                    lanes.join();
                })
                .expect("spawn mover")
        };
        Mover {
            tx: Some(tx),
            rx_done,
            stop,
            threads: vec![coordinator],
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

    /// How long the plan executing has been at it.
    pub fn busy_for(&self) -> Option<Duration> {
        self.in_flight.map(|(_, since)| since.elapsed())
    }

    /// Submits a plan; only one runs at a time (the caller plans again once it is done).
    pub fn submit(&mut self, moves: Vec<Move>, vms: HashMap<VmId, VmTarget>) -> Option<u64> {
        if self.in_flight.is_some() || moves.is_empty() {
            return None;
        }
        let id = self.next_id;
        self.next_id += 1;
        let tx = self.tx.as_ref()?;
        tx.send(Job { id, moves, vms }).ok()?;
        self.in_flight = Some((id, Instant::now()));
        Some(id)
    }

    /// The report of the plan in flight, if it finished.
    pub fn poll(&mut self) -> Option<JobReport> {
        let r = self.rx_done.try_recv().ok()?;
        self.in_flight = None;
        Some(r)
    }

    /// Waits for the plan in flight (tests, benchmarks).
    pub fn wait(&mut self, timeout: Duration) -> Option<JobReport> {
        self.in_flight?;
        let r = self.rx_done.recv_timeout(timeout).ok()?;
        self.in_flight = None;
        Some(r)
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

fn run_job(job: Job, lanes: &mut Lanes, gauges: &MoverGauges) -> JobReport {
    let start = Instant::now();
    let mut report = JobReport {
        id: job.id,
        ..Default::default()
    };
    let mut by_phase: BTreeMap<Phase, Vec<Move>> = BTreeMap::new();
    for m in job.moves {
        by_phase.entry(m.phase).or_default().push(m);
    }
    let mut shortfall: BTreeMap<VmId, u64> = BTreeMap::new();
    let mut gone: HashSet<VmId> = HashSet::new();
    for phase in Phase::ALL {
        let Some(mut moves) = by_phase.remove(&phase) else {
            continue;
        };
        moves.retain(|m| !gone.contains(&m.vm));
        if phase == Phase::PromoteAfterDemote {
            let (keep, dropped) = trim_after_demote(moves, &shortfall);
            for m in dropped {
                report.per_vm.entry(m.vm).or_default().trimmed_frames += m.frames;
                report.facts.push(PlacementRun {
                    vm: m.vm,
                    gfn: m.gfn,
                    frames: m.frames,
                    node: Some(m.from),
                });
            }
            moves = keep;
        }
        let Batches {
            batches, unmovable, ..
        } = make_batches(&moves, lanes.settings.batch_pages, &job.vms);
        for f in unmovable {
            let st = report.per_vm.entry(f.vm).or_default();
            *st.pages_by_outcome
                .entry(PageOutcome::Unmovable)
                .or_default() += f.frames;
            if phase == Phase::Demote {
                *shortfall.entry(f.vm).or_default() += f.frames;
            }
            report.facts.push(f);
        }
        let done = Completion::new(batches.len());
        for b in batches {
            let lane = Lane::of(&b, lanes.settings.parallel_sources);
            let Some(w) = lanes.get(lane) else {
                done.finish(BatchResult::not_run(&b, true));
                continue;
            };
            w.queue
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push_back(Work {
                    batch: b,
                    done: done.clone(),
                    queued_at: Instant::now(),
                });
            MoverGauges::add(&gauges.queued, lane.node(), lane.dir(), 1);
            w.cv.notify_one();
        }
        for r in done.wait() {
            report.batches += 1;
            if report
                .slowest
                .as_ref()
                .is_none_or(|s| r.waited + r.latency > s.seconds())
            {
                report.slowest = Some(SlowestBatch::of(&r));
            }
            report.latencies.push(r.latency);
            let st = report.per_vm.entry(r.vm).or_default();
            let bytes = r.moved * FRAME_SIZE;
            match r.dir {
                Direction::Promote => st.promoted_bytes += bytes,
                Direction::Demote if r.frees_fast => st.demoted_bytes += bytes,
                Direction::Demote => st.near_slow_bytes += bytes,
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
            report.facts.extend(r.facts);
        }
    }
    report.facts.sort_by_key(|f| (f.vm, f.gfn));
    report.gone = gone.into_iter().collect();
    report.elapsed = start.elapsed();
    report
}

fn worker_loop(
    lane: Lane,
    w: &LaneWorker,
    stop: &AtomicBool,
    call: &CallSettings,
    limits: &Mutex<Limits>,
    gauges: &MoverGauges,
) {
    let (node, dir) = (lane.node(), lane.dir());
    while let Some(work) = next_work(w, stop, limits) {
        let bytes = work.batch.bytes();
        MoverGauges::add(&gauges.queued, node, dir, -1);
        let wait = limits.lock().unwrap_or_else(|e| e.into_inner()).take(
            work.batch.vm,
            dir,
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
        let waited = work.queued_at.elapsed().as_secs_f64();
        let now = gauges.lanes_moving.fetch_add(1, Ordering::SeqCst) + 1;
        gauges.lanes_moving_peak.fetch_max(now, Ordering::SeqCst);
        let mut r = execute_batch(&work.batch, call);
        r.waited = waited;
        gauges.lanes_moving.fetch_sub(1, Ordering::SeqCst);
        MoverGauges::add(
            &gauges.executed_pages,
            node,
            dir,
            work.batch.frames() as i64,
        );
        work.done.finish(r);
    }
}

/// The next batch for a worker, waiting for one; `None` once the mover stops (what is queued
/// then is dropped, and the phases waiting on it are released).
fn next_work(w: &LaneWorker, stop: &AtomicBool, limits: &Mutex<Limits>) -> Option<Work> {
    let mut q = w.queue.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        if stop.load(Ordering::SeqCst) {
            let rest: Vec<Work> = q.drain(..).collect();
            drop(q);
            for wk in rest {
                wk.done.finish(BatchResult::not_run(&wk.batch, false));
            }
            return None;
        }
        // A batch whose VM is over its own rate limit lets other VMs' batches go first.
        if let Some(wk) = pick_ready(&q, limits).and_then(|i| q.remove(i)) {
            return Some(wk);
        }
        if let Some(wk) = q.pop_front() {
            return Some(wk);
        }
        q =
            w.cv.wait_timeout(q, Duration::from_millis(200))
                .unwrap_or_else(|e| e.into_inner())
                .0;
    }
}

/// Index of the first batch whose VM is not held back by its own rate limit.
fn pick_ready(q: &VecDeque<Work>, limits: &Mutex<Limits>) -> Option<usize> {
    let mut l = limits.lock().unwrap_or_else(|e| e.into_inner());
    let now = Instant::now();
    q.iter().position(|wk| {
        let b = &wk.batch;
        !l.vm_throttled(b.vm, b.dir, b.bytes(), now)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::{Batch, BatchPage};
    use crate::mtree::{GuestMemory, MappedRange};
    use vtism_engine::MoveKind;
    use vtism_proto::{Gfn, GfnRange, Hva};

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
    fn a_throttled_vm_does_not_hold_back_others() {
        let t0 = Instant::now();
        let limits = Mutex::new(Limits::new(0, 0, 1, t0));
        limits.lock().unwrap().set_vm(VmId(1), 1, 1, t0);
        // VM 1 spends its burst.
        let _ = limits
            .lock()
            .unwrap()
            .take(VmId(1), Direction::Promote, 2_000_000, t0);
        let done = Completion::new(2);
        let work = |vm: u32| Work {
            batch: Batch {
                vm: VmId(vm),
                pid: 1,
                from: NodeId(2),
                to: NodeId(0),
                dir: Direction::Promote,
                frees_fast: false,
                pages: vec![
                    BatchPage {
                        gfn: Gfn(0),
                        hva: Hva(0),
                        from: NodeId(2),
                        frames: 1,
                    };
                    16
                ],
            },
            done: done.clone(),
            queued_at: t0,
        };
        let mut q = VecDeque::new();
        q.push_back(work(1));
        q.push_back(work(2));
        assert_eq!(pick_ready(&q, &limits), Some(1), "VM 2's batch goes first");
        q.remove(1);
        assert_eq!(
            pick_ready(&q, &limits),
            None,
            "only the throttled VM is left"
        );
    }

    /// Batches of 4 pages, no retries, a worker per source, demotions 10 nice levels down.
    fn small_batches() -> MoverSettings {
        MoverSettings {
            batch_pages: 4,
            call: CallSettings {
                busy_retries: 0,
                busy_retry_delay: Duration::from_millis(1),
                move_all: false,
                madvise_cold: false,
            },
            parallel_sources: true,
            demote_nice: 10,
        }
    }

    /// A plan whose one VM waits on its rate limit: the report names that VM's batch as the
    /// slowest, with the wait as queued time (the daemon's warning for a long plan says so).
    #[test]
    fn the_report_names_the_batch_a_plan_waited_for() {
        let mut buf = vec![1u8; 9 * 4096];
        let base = (buf.as_mut_ptr() as u64 + 4095) & !4095;
        let target = |first: u64| VmTarget {
            pid: std::process::id() as i32,
            memory: Arc::new(
                GuestMemory::new(vec![MappedRange {
                    gfns: GfnRange::new(Gfn(0), Gfn(4)),
                    hva: Hva(base + first * 4096),
                    name: "ram".into(),
                }])
                .unwrap(),
            ),
            hugetlb: Vec::new(),
        };
        let t0 = Instant::now();
        let mut limits = Limits::new(0, 0, 1, t0);
        limits.set_vm(VmId(2), 1, 1, t0);
        // VM 2 spent its 1 MB burst and 0.3 MB more: its next batch waits about 0.3 s.
        let _ = limits.take(VmId(2), Direction::Promote, 1_300_000, t0);
        let mut m = Mover::start(&[(NodeId(0), vec![0])], small_batches(), limits);
        let moves = vec![
            mv(1, 0, 4, 0, MoveKind::Promote, Phase::Promote),
            mv(2, 0, 4, 0, MoveKind::Promote, Phase::Promote),
        ];
        m.submit(moves, [(VmId(1), target(0)), (VmId(2), target(4))].into())
            .unwrap();
        assert!(m.busy_for().is_some(), "a plan in flight has an age");
        let r = m.wait(Duration::from_secs(30)).expect("the plan finishes");
        assert!(m.busy_for().is_none());
        let s = r.slowest.expect("a plan with batches has a slowest");
        assert_eq!(
            (s.vm, s.dir, s.to, s.frames),
            (VmId(2), Direction::Promote, NodeId(0), 4)
        );
        assert!(s.waited >= 0.2, "queued behind its rate limit: {s:?}");
        assert!(r.elapsed.as_secs_f64() >= s.waited, "{:?} {s:?}", r.elapsed);
        m.shutdown();
        drop(buf);
    }

    /// A thread's nice value, from its stat (the 19th field; the 2nd, its name, is in parens).
    fn nice_of(stat: &str) -> i32 {
        let s = std::fs::read_to_string(stat).unwrap();
        let after = &s[s.rfind(')').unwrap() + 2..];
        after.split(' ').nth(16).unwrap().parse().unwrap()
    }

    fn batch(from: u8, to: u8, dir: Direction) -> Batch {
        Batch {
            vm: VmId(1),
            pid: 1,
            from: NodeId(from),
            to: NodeId(to),
            dir,
            frees_fast: dir == Direction::Demote,
            pages: Vec::new(),
        }
    }

    #[test]
    fn promotions_queue_by_destination_and_source_demotions_by_source() {
        let p = |to, from| Lane::Promote {
            to: NodeId(to),
            from,
        };
        let b = batch(2, 0, Direction::Promote);
        assert_eq!(Lane::of(&b, true), p(0, Some(NodeId(2))));
        assert_eq!(Lane::of(&b, false), p(0, None), "sources take turns");
        let c = batch(3, 0, Direction::Promote);
        assert_ne!(
            Lane::of(&b, true),
            Lane::of(&c, true),
            "two sources, two lanes"
        );
        assert_eq!(
            Lane::of(&b, true).node(),
            NodeId(0),
            "on the destination's CPUs"
        );
        let d = batch(0, 2, Direction::Demote);
        assert_eq!(Lane::of(&d, true), Lane::Demote { from: NodeId(0) });
        assert_eq!(Lane::of(&d, true).node(), NodeId(0), "on the source's CPUs");
        for l in [Lane::of(&b, true), Lane::of(&b, false), Lane::of(&d, true)] {
            assert!(l.thread_name().len() <= 15, "{}", l.thread_name());
        }
        assert_eq!(p(10, Some(NodeId(11))).thread_name(), "vtism-mv-p10-11");
    }

    /// A plan with moves to two nodes: each promotion is executed by its destination node's
    /// lane, each demotion by its source node's (real threads and real move_pages calls on this
    /// process; node 1 may not exist here, which only fails those pages).
    #[test]
    fn batches_run_on_their_lanes() {
        let mut buf = vec![1u8; 17 * 4096];
        let base = (buf.as_mut_ptr() as u64 + 4095) & !4095;
        let mem = GuestMemory::new(vec![MappedRange {
            gfns: GfnRange::new(Gfn(0), Gfn(16)),
            hva: Hva(base),
            name: "ram".into(),
        }])
        .unwrap();
        let mut m = Mover::start(
            &[
                (NodeId(0), vec![0]),
                (NodeId(1), vec![0]),
                (NodeId(2), vec![0]),
            ],
            small_batches(),
            Limits::new(0, 0, 1, Instant::now()),
        );
        let moves = vec![
            mv(1, 0, 6, 1, MoveKind::Promote, Phase::Promote),
            mv(1, 6, 2, 0, MoveKind::Promote, Phase::Promote),
            mv(1, 8, 3, 2, MoveKind::Demote, Phase::Demote),
        ];
        let vms = [(
            VmId(1),
            VmTarget {
                pid: std::process::id() as i32,
                memory: Arc::new(mem),
                hugetlb: Vec::new(),
            },
        )]
        .into();
        m.submit(moves, vms).unwrap();
        let r = m.wait(Duration::from_secs(30)).expect("the plan finishes");
        assert_eq!(r.batches, 4, "6 pages in batches of 4, 2 pages, 3 pages");
        let done = MoverGauges::snapshot(&m.gauges.executed_pages);
        assert_eq!(
            done,
            [
                ((NodeId(0), Direction::Promote), 2),
                ((NodeId(0), Direction::Demote), 3),
                ((NodeId(1), Direction::Promote), 6),
            ]
            .into(),
            "pages per worker and direction: demotions out of node 0 on node 0's lane"
        );
        assert!(m.gauges.lanes_moving_peak.load(Ordering::SeqCst) >= 1);
        assert_eq!(m.gauges.lanes_moving.load(Ordering::SeqCst), 0);
        let own = nice_of("/proc/thread-self/stat");
        let demoting = std::fs::read_dir("/proc/self/task")
            .unwrap()
            .flatten()
            .find(|t| {
                std::fs::read_to_string(t.path().join("comm")).unwrap_or_default()
                    == "vtism-mv-d0\n"
            })
            .expect("node 0's demotion worker");
        assert_eq!(
            nice_of(&demoting.path().join("stat").to_string_lossy()),
            (own + 10).min(19),
            "the demotion worker runs 10 nice levels below"
        );
        m.shutdown();
        drop(buf);
    }
}
