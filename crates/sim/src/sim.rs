//! The simulator's driver: ground-truth placement, the epoch loop, the throughput model, plan
//! execution with migration costs, and the measurements.
//!
//! Throughput model (docs/evaluation.md, "Model and limits"): a VM keeps `concurrency` memory
//! accesses in flight; each costs `cpu_ns` of compute plus the latency of the tier its unit is on,
//! at that tier's loaded latency. In an epoch of `dt` the VM has `concurrency * dt` of thread time,
//! less what tracking and migration stole, and makes `thread time / (cpu_ns + mean latency)`
//! accesses. Tier loads couple the VMs: latency depends on the bandwidth all VMs (and migrations)
//! use, so each epoch solves that fixed point. With the host's pages modelled (`--host-pages`,
//! `host_folios`) an access to a block the host maps with 4 KiB pages costs `split_access_ns`
//! more than one through a 2 MiB page.

use crate::host_folios::{HostBacking, HostPagesAware, Khugepaged};
use crate::mechanism::{EpochView, Tracker};
use crate::model::MemoryModel;
use crate::workload::{Profile, VmWorkload};
use serde::Serialize;
use std::collections::VecDeque;
use std::sync::Arc;
use vtism_engine::synth::Rng;
use vtism_engine::{
    coalesce, Direction, Move, Nanos, NodeId, NodeSpec, PlacementRun, PlanContext, Policy, Tier,
    Topology, VmId, VmSpec,
};
use vtism_proto::{Gfn, RamMap, FRAME_SIZE, HUGE_FRAMES};

pub const FAST: NodeId = NodeId(0);
pub const SLOW: NodeId = NodeId(1);
const LINE: f64 = 64.0;

#[derive(Clone, Debug)]
pub struct SimConfig {
    pub model: MemoryModel,
    /// Placement unit (default 2 MiB: guest RAM backed by host huge pages).
    pub unit_bytes: u64,
    pub epoch_s: f64,
    pub duration_s: f64,
    /// Slow bytes per fast byte of each VM's footprint ("fast:slow 1:4" is 4).
    pub slow_per_fast: f64,
    pub seed: u64,
    /// Timeline resolution.
    pub sample_s: f64,
    /// Address buckets of the hotness heatmap (first VM).
    pub heat_buckets: usize,
    /// vtism's engine parameters (the daemon's `[engine]`; defaults unless a test changes them).
    pub engine: vtism_engine::EngineParams,
    /// How the host backs each VM's RAM (`--host-pages`).
    pub host_pages: HostPages,
}

/// How the host backs guest RAM (`--host-pages`, `crate::host_folios`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HostPages {
    /// Not modelled, as before the option: moves take the frames they ask for and no access
    /// pays for TLB reach.
    #[default]
    NotModelled,
    /// 4 KiB pages (THP `never`): moves take the frames they ask for, every access pays the
    /// 4 KiB pages' TLB cost (`HostPagesModel::split_access_ns`), nothing is collapsed.
    Base,
    /// 2 MiB folios (THP `always`), every whole block huge at the start.
    Thp,
}

impl SimConfig {
    pub fn new(model: MemoryModel) -> Self {
        SimConfig {
            model,
            unit_bytes: 2 << 20,
            epoch_s: 0.1,
            duration_s: 600.0,
            slow_per_fast: 4.0,
            seed: 1,
            sample_s: 1.0,
            heat_buckets: 64,
            engine: vtism_engine::EngineParams::default(),
            host_pages: HostPages::NotModelled,
        }
    }
    pub fn fpu(&self) -> u64 {
        (self.unit_bytes / FRAME_SIZE).max(1)
    }
    pub fn validate(&self) -> anyhow::Result<()> {
        let f = self.unit_bytes / FRAME_SIZE;
        if !self.unit_bytes.is_multiple_of(FRAME_SIZE) || !f.is_power_of_two() || f > 512 {
            anyhow::bail!("--unit: must be a power of two between 4 KiB and 2 MiB");
        }
        if !(self.epoch_s > 0.0 && self.epoch_s <= 10.0) {
            anyhow::bail!("--epoch-ms: must be between 1 and 10000");
        }
        if self.duration_s.is_nan() || self.duration_s < self.epoch_s {
            anyhow::bail!("--duration: must be at least one epoch");
        }
        if !(self.slow_per_fast >= 0.0 && self.slow_per_fast.is_finite()) {
            anyhow::bail!("--ratio: slow per fast must be a non-negative number");
        }
        self.model.validate()
    }
}

/// How a policy's moves disturb the VM (see `Sim::execute`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MoveMode {
    /// Background `move_pages`: the page is unmapped while it is copied; accesses to it wait.
    Unmap,
    /// In the faulting thread (NUMA hint-fault promotion): that thread waits the whole migration,
    /// others touching the page wait for the copy.
    Sync,
    /// HMM-V: copy while mapped, PML catches pages dirtied during the copy; only the remap stalls.
    Pml,
    /// HeMem: write-protected during the copy; only writes wait.
    WriteProtect,
}

/// A policy as the simulator drives it: the engine's interface, and what the host's huge pages
/// tell it and it asks of them.
pub trait SimPolicy: Policy + HostPagesAware + Send {}

impl<T: Policy + HostPagesAware + Send> SimPolicy for T {}

/// A policy ready to run: the policy, one tracker per VM, how its moves execute.
pub struct PolicyRun {
    pub name: String,
    pub policy: Box<dyn SimPolicy>,
    pub trackers: Vec<Box<dyn Tracker>>,
    pub promote_mode: MoveMode,
    pub demote_mode: MoveMode,
    /// Mover speed relative to one `move_pages` thread (HMM-V: 2x, published).
    pub mover_speedup: f64,
    pub all_fast: bool,
}

/// What a policy constructor gets to know.
pub struct Setup<'a> {
    pub cfg: &'a SimConfig,
    pub topology: Topology,
    pub specs: Vec<VmSpec>,
    pub workloads: &'a [VmWorkload],
    pub units: Vec<usize>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct VmResult {
    pub name: String,
    pub accesses: f64,
    pub fast_accesses: f64,
    pub thread_ns: f64,
    pub tracking_ns: f64,
    pub migration_ns: f64,
    pub migrated_bytes: u64,
    pub quota_bytes: u64,
    /// Host folios split (asked by the policy, or by the kernel to fit a move) and collapsed
    /// again by khugepaged (`--host-pages thp`).
    pub splits: u64,
    pub collapses: u64,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Sample {
    pub t: f64,
    /// Accesses per second, per VM.
    pub tput: Vec<f64>,
    /// Bytes in the fast tier, per VM.
    pub fast_bytes: Vec<u64>,
    /// Fast-tier hit ratio over the sample, per VM.
    pub hit: Vec<f64>,
    /// The policy's fast quota at the end of the sample, per VM (its initial quota when the
    /// policy does not report one).
    pub quota: Vec<u64>,
    pub migrated_bytes: u64,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct RunResult {
    pub policy: String,
    pub vms: Vec<VmResult>,
    pub samples: Vec<Sample>,
    /// First VM: per sample, each address bucket's share of accesses (rows: samples).
    #[serde(skip)]
    pub heat: Vec<Vec<f32>>,
    /// First VM: per sample, each address bucket's fraction in fast memory.
    #[serde(skip)]
    pub heat_fast: Vec<Vec<f32>>,
    pub wall_secs: f64,
    pub engine_bytes: u64,
}

impl RunResult {
    pub fn accesses(&self) -> f64 {
        self.vms.iter().map(|v| v.accesses).sum()
    }
    pub fn fast_hit(&self) -> f64 {
        let a = self.accesses();
        if a > 0.0 {
            self.vms.iter().map(|v| v.fast_accesses).sum::<f64>() / a
        } else {
            0.0
        }
    }
    pub fn migrated_bytes(&self) -> u64 {
        self.vms.iter().map(|v| v.migrated_bytes).sum()
    }
    pub fn tracking_overhead(&self) -> f64 {
        let t: f64 = self.vms.iter().map(|v| v.thread_ns).sum();
        self.vms.iter().map(|v| v.tracking_ns).sum::<f64>() / t.max(1.0)
    }
    pub fn migration_overhead(&self) -> f64 {
        let t: f64 = self.vms.iter().map(|v| v.thread_ns).sum();
        self.vms.iter().map(|v| v.migration_ns).sum::<f64>() / t.max(1.0)
    }
    pub fn total_tput(&self, i: usize) -> f64 {
        self.samples[i].tput.iter().sum()
    }
}

struct VmState {
    id: VmId,
    wl: VmWorkload,
    units: usize,
    /// Frames of each unit in fast memory.
    fast: Vec<u32>,
    /// The host's pages (`--host-pages`): a huge block's units are all on one node.
    host: Option<HostBacking>,
    fast_frames: u64,
    phase: u64,
    profile: Arc<Profile>,
    /// Placement or profile changed since `sums` was computed.
    dirty: bool,
    pending_stall: f64,
    res: VmResult,
    queue: VecDeque<Move>,
    // Per-sample accumulators.
    s_acc: f64,
    s_fast: f64,
    heat_acc: Vec<f64>,
    /// Accesses made under the current profile not yet spread over `heat_acc` (first VM): the
    /// spread is one pass over the units, made when the profile changes or a sample ends.
    heat_pending: f64,
}

/// Everything about one simulation except the policy.
pub struct World<'a> {
    pub cfg: &'a SimConfig,
    pub workloads: &'a [VmWorkload],
    pub fast_capacity: u64,
    pub slow_capacity: u64,
    pub quotas: Vec<u64>,
    pub all_fast: bool,
}

impl<'a> World<'a> {
    pub fn new(cfg: &'a SimConfig, workloads: &'a [VmWorkload], all_fast: bool) -> World<'a> {
        // Fast memory of the run: each VM's footprint at the fast:slow ratio, split by the VMs'
        // weights (by default their footprints, i.e. each VM at the ratio).
        let fast_units: Vec<f64> = workloads
            .iter()
            .map(|w| w.units(cfg.unit_bytes) as f64 / (1.0 + cfg.slow_per_fast))
            .collect();
        let weights: Vec<f64> = workloads
            .iter()
            .zip(&fast_units)
            .map(|(w, &f)| w.fast_weight.unwrap_or(f))
            .collect();
        let (total, wsum) = (fast_units.iter().sum::<f64>(), weights.iter().sum::<f64>());
        let quotas: Vec<u64> = workloads
            .iter()
            .zip(&weights)
            .map(|(w, &wt)| {
                let units = w.units(cfg.unit_bytes) as u64;
                let q = if all_fast {
                    units
                } else {
                    ((total * wt / wsum.max(1e-12)).round() as u64).min(units)
                };
                q * cfg.unit_bytes
            })
            .collect();
        let total: u64 = workloads
            .iter()
            .map(|w| w.units(cfg.unit_bytes) as u64 * cfg.unit_bytes)
            .sum();
        World {
            cfg,
            workloads,
            fast_capacity: quotas.iter().sum(),
            slow_capacity: total,
            quotas,
            all_fast,
        }
    }

    pub fn topology(&self) -> Topology {
        Topology::new(
            vec![
                NodeSpec {
                    id: FAST,
                    tier: Tier(0),
                    capacity_bytes: self.fast_capacity.max(1),
                    cpus: vec![0],
                    socket: 0,
                },
                NodeSpec {
                    id: SLOW,
                    tier: Tier(1),
                    capacity_bytes: self.slow_capacity.max(1),
                    cpus: vec![],
                    socket: 0,
                },
            ],
            Some(vec![vec![10, 20], vec![20, 10]]),
        )
        .expect("two-node topology")
    }

    pub fn setup(&self) -> Setup<'_> {
        let fpu = self.cfg.fpu();
        let specs = self
            .workloads
            .iter()
            .enumerate()
            .map(|(i, w)| VmSpec {
                id: VmId(i as u32 + 1),
                ram: RamMap::contiguous(w.units(self.cfg.unit_bytes) as u64 * fpu),
                fast_quota_bytes: self.quotas[i],
                home_node: Some(FAST),
            })
            .collect();
        Setup {
            cfg: self.cfg,
            topology: self.topology(),
            specs,
            workloads: self.workloads,
            units: self
                .workloads
                .iter()
                .map(|w| w.units(self.cfg.unit_bytes))
                .collect(),
        }
    }
}

/// Progress callback: fraction done.
pub type Progress<'p> = &'p mut dyn FnMut(f64);

pub fn run(
    cfg: &SimConfig,
    workloads: &[VmWorkload],
    mut pr: PolicyRun,
    progress: Progress<'_>,
) -> anyhow::Result<RunResult> {
    let started = std::time::Instant::now();
    let world = World::new(cfg, workloads, pr.all_fast);
    let fpu = cfg.fpu();
    let m = &cfg.model;
    let setup = world.setup();
    let mut vms: Vec<VmState> = Vec::new();
    for (i, spec) in setup.specs.iter().enumerate() {
        pr.policy.add_vm(spec.clone())?;
        let w = &workloads[i];
        let units = setup.units[i];
        let quota_units = (world.quotas[i] / cfg.unit_bytes) as usize;
        // First touch: the first `quota` units in touch order land in fast memory (none for a
        // VM that starts on the slow tier).
        let mut fast = vec![0u32; units];
        let first_fast = if w.starts_on_slow() && !pr.all_fast {
            0
        } else {
            quota_units
        };
        let host = match cfg.host_pages {
            HostPages::NotModelled => None,
            HostPages::Base => Some(HostBacking::all_base(units, cfg.unit_bytes)),
            HostPages::Thp => Some(HostBacking::all_huge(units, cfg.unit_bytes)),
        };
        match host.as_ref().filter(|_| cfg.host_pages == HostPages::Thp) {
            None => {
                for &u in w.touch_order(cfg.unit_bytes).iter().take(first_fast) {
                    fast[u as usize] = fpu as u32;
                }
            }
            Some(h) => first_touch_folios(
                h,
                &w.touch_order(cfg.unit_bytes),
                first_fast,
                fpu,
                &mut fast,
            ),
        }
        // Tell the policy, in runs.
        let units_placed = fast.iter().enumerate().map(|(u, &f)| PlacementRun {
            vm: spec.id,
            gfn: Gfn(u as u64 * fpu),
            frames: fpu,
            node: Some(if f > 0 { FAST } else { SLOW }),
        });
        for r in coalesce(units_placed, |_| true) {
            pr.policy.set_placement(r.vm, r.gfn, r.frames, r.node)?;
        }
        // vtismd learns the folios at admission.
        if let Some(h) = host.as_ref().filter(|_| cfg.host_pages == HostPages::Thp) {
            pr.policy.host_folios_changed(spec.id, &h.heads());
        }
        let phase = w.phase(0.0);
        vms.push(VmState {
            id: spec.id,
            wl: w.clone(),
            units,
            fast_frames: fast.iter().map(|&f| f as u64).sum(),
            fast,
            host,
            phase,
            profile: Arc::new(w.profile(phase, cfg.unit_bytes)),
            dirty: true,
            pending_stall: 0.0,
            res: VmResult {
                name: w.name.clone(),
                quota_bytes: world.quotas[i],
                ..Default::default()
            },
            queue: VecDeque::new(),
            s_acc: 0.0,
            s_fast: 0.0,
            heat_acc: vec![0.0; cfg.heat_buckets.max(1)],
            heat_pending: 0.0,
        });
    }
    let fast_cap_frames = world.fast_capacity / FRAME_SIZE;
    let epochs = (cfg.duration_s / cfg.epoch_s).round().max(1.0) as usize;
    let per_sample = ((cfg.sample_s / cfg.epoch_s).round() as usize).max(1);
    let dt = cfg.epoch_s;
    let mut out = RunResult {
        policy: pr.name.clone(),
        ..Default::default()
    };
    // Migration traffic of the previous epoch, bytes read from / written to (fast, slow).
    let mut mig_bytes = [0.0f64; 2];
    let mut s_migrated = 0u64;
    let mut sums = vec![[0.0f64; 4]; vms.len()];
    // Share of each VM's accesses to blocks the host maps with 4 KiB pages (`--host-pages`).
    let mut split_share = vec![0.0f64; vms.len()];
    let blocks: Vec<usize> = vms
        .iter()
        .map(|v| v.host.as_ref().map_or(0, |h| h.blocks()))
        .collect();
    let start = Rng::new(cfg.seed ^ 0x6b68_7567).below(blocks.iter().sum::<usize>().max(1) as u64);
    let mut khugepaged = Khugepaged::new(&m.host_pages, &blocks, start as usize);
    let mut n_acc = vec![0.0f64; vms.len()];
    let mut stall_now = vec![0.0f64; vms.len()];
    for e in 0..epochs {
        let t0 = e as f64 * dt;
        let t1 = t0 + dt;
        // Profiles and the placement-weighted shares: [fast reads, fast writes, slow r, slow w].
        for (k, v) in vms.iter_mut().enumerate() {
            let ph = v.wl.phase(t0);
            if ph != v.phase {
                spread_heat(v);
                v.phase = ph;
                v.profile = Arc::new(v.wl.profile(ph, cfg.unit_bytes));
                v.dirty = true;
            }
            if v.dirty {
                let mut s = [0.0f64; 4];
                for u in 0..v.units {
                    let f = v.fast[u] as f64 / fpu as f64;
                    let (r, w) = (v.profile.read[u] as f64, v.profile.write[u] as f64);
                    s[0] += r * f;
                    s[1] += w * f;
                    s[2] += r * (1.0 - f);
                    s[3] += w * (1.0 - f);
                }
                sums[k] = s;
                split_share[k] = v.host.as_ref().map_or(0.0, |h| {
                    (0..h.blocks())
                        .filter(|&b| !h.is_huge(b))
                        .flat_map(|b| h.units_of(b))
                        .map(|u| v.profile.share(u))
                        .sum()
                });
                v.dirty = false;
            }
            let thread_ns = v.wl.concurrency * dt * 1e9;
            let st = v.pending_stall.min(0.95 * thread_ns);
            v.pending_stall -= st;
            stall_now[k] = st;
        }
        // Fixed point: loaded latencies from tier utilisation.
        let mut u_fast = 0.0;
        let mut u_slow = 0.0;
        for _ in 0..12 {
            let (fr, fw) = m.fast.loaded(u_fast);
            let (sr, sw) = m.slow.loaded(u_slow);
            let over = |u: f64| if u > 1.0 { u } else { 1.0 };
            let (fr, fw) = (fr * over(u_fast), fw * over(u_fast));
            let (sr, sw) = (sr * over(u_slow), sw * over(u_slow));
            let mut bytes = [mig_bytes[0], 0.0, mig_bytes[1], 0.0];
            // bytes: fast read, fast write, slow read, slow write
            bytes[1] += 0.0;
            for (k, v) in vms.iter().enumerate() {
                let s = sums[k];
                let lat = s[0] * fr
                    + s[1] * fw
                    + s[2] * sr
                    + s[3] * sw
                    + split_share[k] * m.host_pages.split_access_ns;
                let thread_ns = v.wl.concurrency * dt * 1e9 - stall_now[k];
                let n = thread_ns / (v.wl.cpu_ns + lat);
                n_acc[k] = n;
                bytes[0] += n * s[0] * LINE;
                bytes[1] += n * s[1] * LINE;
                bytes[2] += n * s[2] * LINE;
                bytes[3] += n * s[3] * LINE;
            }
            let nf = m.fast.busy_secs(bytes[0], bytes[1]) / dt;
            let ns = m.slow.busy_secs(bytes[2], bytes[3]) / dt;
            u_fast = 0.5 * u_fast + 0.5 * nf;
            u_slow = 0.5 * u_slow + 0.5 * ns;
        }
        // Record.
        for (k, v) in vms.iter_mut().enumerate() {
            let n = n_acc[k];
            let s = sums[k];
            v.res.accesses += n;
            v.res.fast_accesses += n * (s[0] + s[1]);
            v.res.thread_ns += v.wl.concurrency * dt * 1e9;
            v.s_acc += n;
            v.s_fast += n * (s[0] + s[1]);
            if k == 0 {
                v.heat_pending += n;
            }
        }
        // Trackers observe, charge their cost to the next epoch.
        for (k, v) in vms.iter_mut().enumerate() {
            let view = EpochView {
                vm: v.id,
                wl: &v.wl,
                profile: &v.profile,
                accesses: n_acc[k],
                t0,
                t1,
                unit_bytes: cfg.unit_bytes,
                model: m,
                quota_bytes: pr.policy.fast_quota(v.id).unwrap_or(0),
                host: v.host.as_ref(),
            };
            let c = pr.trackers[k].epoch(&view, pr.policy.as_mut())?;
            v.pending_stall += c.stall_ns;
            v.res.tracking_ns += c.stall_ns;
        }
        // The host's huge pages change: splits the policy asked for, khugepaged's collapses.
        let mut host_mig = [0.0f64; 2];
        if cfg.host_pages == HostPages::Thp {
            let now = Nanos((t1 * 1e9).round() as u64);
            for (vm, head) in pr.policy.take_splits(now) {
                if let Some(v) = vms.iter_mut().find(|v| v.id == vm) {
                    split_folio(v, head, m, pr.policy.as_mut());
                }
            }
            for (k, block) in khugepaged.due(t1, &blocks) {
                let used: u64 = vms.iter().map(|v| v.fast_frames).sum();
                let moved = collapse_folio(
                    &mut vms[k],
                    block,
                    cfg,
                    fast_cap_frames.saturating_sub(used),
                    n_acc[k] / dt,
                    &mut host_mig,
                    pr.policy.as_mut(),
                )?;
                vms[k].res.migrated_bytes += moved;
                s_migrated += moved;
            }
        }
        // Plan and execute.
        let fast_used: u64 = vms.iter().map(|v| v.fast_frames).sum();
        let free = [
            (FAST, fast_cap_frames.saturating_sub(fast_used) * FRAME_SIZE),
            (SLOW, world.slow_capacity),
        ];
        let plan = pr.policy.plan(
            &PlanContext {
                node_free_bytes: &free,
                budget_bytes: None,
                node_short_bytes: &[],
            },
            Nanos(((t1) * 1e9).round() as u64),
        );
        let mut planned = vec![0u64; vms.len()];
        for mv in plan.moves {
            if let Some(k) = vms.iter().position(|v| v.id == mv.vm) {
                planned[k] += mv.bytes();
                vms[k].queue.push_back(mv);
            }
        }
        for (k, p) in planned.iter().enumerate() {
            pr.trackers[k].moved(*p);
        }
        mig_bytes = host_mig;
        let mut fast_used = fast_used;
        for (k, v) in vms.iter_mut().enumerate() {
            let moved = execute(
                v,
                &mut pr,
                cfg,
                n_acc[k] / dt,
                fast_cap_frames,
                &mut fast_used,
                &mut mig_bytes,
            )?;
            v.res.migrated_bytes += moved;
            s_migrated += moved;
        }
        // Timeline.
        if (e + 1) % per_sample == 0 || e + 1 == epochs {
            let span = ((e % per_sample) + 1) as f64 * dt;
            let mut s = Sample {
                t: t1,
                migrated_bytes: s_migrated,
                ..Default::default()
            };
            s_migrated = 0;
            for (k, v) in vms.iter_mut().enumerate() {
                s.tput.push(v.s_acc / span);
                s.fast_bytes.push(v.fast_frames * FRAME_SIZE);
                s.quota
                    .push(pr.policy.fast_quota(v.id).unwrap_or(v.res.quota_bytes));
                s.hit.push(if v.s_acc > 0.0 {
                    v.s_fast / v.s_acc
                } else {
                    0.0
                });
                v.s_acc = 0.0;
                v.s_fast = 0.0;
                if k == 0 {
                    spread_heat(v);
                    let tot: f64 = v.heat_acc.iter().sum();
                    out.heat.push(
                        v.heat_acc
                            .iter()
                            .map(|&x| (x / tot.max(1e-30)) as f32)
                            .collect(),
                    );
                    v.heat_acc.iter_mut().for_each(|x| *x = 0.0);
                    let b = v.heat_acc.len();
                    let mut fb = vec![0.0f64; b];
                    let mut cnt = vec![0.0f64; b];
                    for u in 0..v.units {
                        fb[u * b / v.units] += v.fast[u] as f64 / fpu as f64;
                        cnt[u * b / v.units] += 1.0;
                    }
                    out.heat_fast.push(
                        fb.iter()
                            .zip(&cnt)
                            .map(|(f, c)| (f / c.max(1.0)) as f32)
                            .collect(),
                    );
                }
            }
            out.samples.push(s);
            progress((e + 1) as f64 / epochs as f64);
        }
    }
    out.vms = vms
        .into_iter()
        .map(|v| {
            let (splits, collapses) = v.host.as_ref().map_or((0, 0), |h| (h.splits, h.collapses));
            VmResult {
                splits,
                collapses,
                ..v.res
            }
        })
        .collect();
    out.wall_secs = started.elapsed().as_secs_f64();
    Ok(out)
}

/// Spreads the accesses made under the current profile over the heatmap's address buckets.
fn spread_heat(v: &mut VmState) {
    if v.heat_pending == 0.0 {
        return;
    }
    let b = v.heat_acc.len();
    for u in 0..v.units {
        v.heat_acc[u * b / v.units] += v.profile.share(u) * v.heat_pending;
    }
    v.heat_pending = 0.0;
}

/// Where a move lands: the frames it takes from each unit, how many page mappings it unmaps,
/// the units it spans, and the host folios the kernel split to make it fit.
struct Landing {
    need: Vec<(usize, u32)>,
    frames: u64,
    /// Page mappings unmapped (fractional with the host's pages not modelled: one per unit, as before).
    mappings: f64,
    units: std::ops::Range<usize>,
    /// The kernel took whole folios beyond the frames asked for.
    widened: bool,
    split: Vec<usize>,
}

/// What the kernel moves for `mv`, or `None` when the frames are not where the move says or the
/// target cannot take them. Without host folios: the frames asked for. With them: the whole of
/// every huge block the move touches; when the fast node cannot take that but can take the
/// frames asked for, the kernel splits the blocks it touches in part and moves those frames
/// (it then moves as many of the folio's other 4 KiB pages as fit, in address order; the
/// simulator moves only those asked for, in the policy's favour).
fn land(v: &VmState, mv: &Move, fpu: u64, fast_cap: u64, fast_used: u64) -> Option<Landing> {
    let u0 = (mv.gfn.0 / fpu) as usize;
    let u1 = ((mv.gfn.0 + mv.frames).div_ceil(fpu) as usize).min(v.units);
    if mv.from == mv.to || u0 >= u1 {
        return None;
    }
    let on_from = |u: usize| {
        if mv.from == FAST {
            v.fast[u]
        } else {
            fpu as u32 - v.fast[u]
        }
    };
    let mut need = Vec::with_capacity(u1 - u0);
    for u in u0..u1 {
        let a = mv.gfn.0.max(u as u64 * fpu);
        let b = (mv.gfn.0 + mv.frames).min((u as u64 + 1) * fpu);
        let k = (b - a) as u32;
        if on_from(u) < k {
            return None;
        }
        need.push((u, k));
    }
    let asked: u64 = need.iter().map(|&(_, k)| u64::from(k)).sum();
    let fits = |frames: u64| mv.to != FAST || fast_used + frames <= fast_cap;
    let Some(h) = &v.host else {
        return fits(asked).then(|| Landing {
            need,
            frames: asked,
            mappings: asked as f64 / fpu as f64,
            units: u0..u1,
            widened: false,
            split: Vec::new(),
        });
    };
    let (w0, w1) = h.widen(u0, u1);
    let asked_in = |u: usize| if u >= u0 && u < u1 { need[u - u0].1 } else { 0 };
    // A huge block is wholly on one node: asked frames of it on `from` mean all of it is.
    let whole: Vec<(usize, u32)> = (w0..w1)
        .map(|u| {
            let k = if h.unit_is_huge(u) {
                debug_assert!(on_from(u) == fpu as u32, "a huge block on two nodes");
                fpu as u32
            } else {
                asked_in(u)
            };
            (u, k)
        })
        .collect();
    let took: u64 = whole.iter().map(|&(_, k)| u64::from(k)).sum();
    if fits(took) {
        let mappings = h.mappings(w0, w1, |u| u64::from(whole[u - w0].1)) as f64;
        return Some(Landing {
            need: whole,
            frames: took,
            mappings,
            units: w0..w1,
            widened: took > asked,
            split: Vec::new(),
        });
    }
    if took == asked || !fits(asked) {
        return None;
    }
    // ENOMEM for a folio: the kernel splits the blocks asked for in part.
    let mut split: Vec<usize> = [h.block_of(u0), h.block_of(u1 - 1)]
        .into_iter()
        .filter(|&b| h.is_huge(b) && h.units_of(b).any(|u| asked_in(u) < fpu as u32))
        .collect();
    split.dedup();
    let mut after = h.clone();
    for &b in &split {
        after.split(b);
    }
    let mappings = after.mappings(u0, u1, |u| u64::from(need[u - u0].1)) as f64;
    Some(Landing {
        need,
        frames: asked,
        mappings,
        units: u0..u1,
        widened: false,
        split,
    })
}

/// Executes queued moves of one VM within one epoch of mover time; charges their stalls.
fn execute(
    v: &mut VmState,
    pr: &mut PolicyRun,
    cfg: &SimConfig,
    rate: f64,
    fast_cap: u64,
    fast_used: &mut u64,
    mig_bytes: &mut [f64; 2],
) -> anyhow::Result<u64> {
    let m = &cfg.model;
    let fpu = cfg.fpu();
    let mut budget = cfg.epoch_s;
    let mut moved = 0u64;
    let conc = v.wl.concurrency;
    let vcpus = v.wl.vcpus as f64;
    let unit = cfg.unit_bytes as f64;
    while let Some(mv) = v.queue.front().copied() {
        let landing = land(v, &mv, fpu, fast_cap, *fast_used);
        let bytes = landing
            .as_ref()
            .map_or(mv.bytes(), |l| l.frames * FRAME_SIZE) as f64;
        let secs = match (&v.host, &landing) {
            (Some(_), Some(l)) => {
                bytes / (m.migration.copy_gbps * 1e9 * pr.mover_speedup)
                    + l.mappings * m.unmap_secs(unit)
            }
            _ => m.migration_secs(bytes, unit, pr.mover_speedup),
        };
        if secs > budget && budget < cfg.epoch_s {
            break;
        }
        v.queue.pop_front();
        let to_fast = mv.to == FAST;
        let Some(l) = landing else {
            // Tell the policy where the frames really are.
            let u0 = (mv.gfn.0 / fpu) as usize;
            let u1 = ((mv.gfn.0 + mv.frames).div_ceil(fpu) as usize).min(v.units);
            for u in u0..u1.max(u0) {
                if u >= v.units {
                    break;
                }
                let node = if v.fast[u] * 2 >= fpu as u32 {
                    FAST
                } else {
                    SLOW
                };
                pr.policy
                    .set_placement(v.id, Gfn(u as u64 * fpu), fpu, Some(node))?;
            }
            continue;
        };
        budget -= secs;
        v.dirty = true;
        if let Some(h) = &mut v.host {
            for &b in &l.split {
                h.split(b);
            }
        }
        for &(u, k) in &l.need {
            if to_fast {
                v.fast[u] += k;
            } else {
                v.fast[u] -= k;
            }
        }
        if to_fast {
            *fast_used += l.frames;
            v.fast_frames += l.frames;
        } else {
            *fast_used -= l.frames;
            v.fast_frames -= l.frames;
        }
        moved += l.frames * FRAME_SIZE;
        mig_bytes[0] += bytes;
        mig_bytes[1] += bytes;
        // The kernel moved whole folios or split some: the policy is told what it did.
        if l.widened {
            let (a, b) = (l.units.start as u64 * fpu, l.units.end as u64 * fpu);
            pr.policy.set_placement(v.id, Gfn(a), b - a, Some(mv.to))?;
        }
        if !l.split.is_empty() {
            if let Some(h) = &v.host {
                pr.policy.host_folios_changed(v.id, &h.heads());
            }
        }
        // Stall.
        let mode = if mv.kind.direction() == Direction::Promote {
            pr.promote_mode
        } else {
            pr.demote_mode
        };
        let copy = bytes / (m.migration.copy_gbps * 1e9 * pr.mover_speedup);
        let pages = if v.host.is_some() {
            l.mappings
        } else {
            bytes / unit
        }
        .max(1.0);
        let unmap = vcpus * pages * m.unmap_secs(unit);
        let share: f64 = l.units.clone().map(|u| v.profile.share(u)).sum();
        let wshare: f64 = l.units.clone().map(|u| v.profile.write[u] as f64).sum();
        let waiters = |r: f64| (r * copy).min(conc);
        let stall = match mode {
            MoveMode::Unmap => unmap + waiters(rate * share) * copy / 2.0,
            MoveMode::Sync => secs + unmap + waiters(rate * share) * copy / 2.0,
            MoveMode::Pml => unmap,
            MoveMode::WriteProtect => unmap + waiters(rate * wshare) * copy / 2.0,
        };
        v.pending_stall += stall * 1e9;
        v.res.migration_ns += stall * 1e9;
    }
    Ok(moved)
}

/// First touch with host folios: a block is allocated whole, on the fast node while it has room
/// for 2 MiB, on the slow node after that (a THP fault allocates on one node); its place is
/// decided by its first unit in touch order.
fn first_touch_folios(
    h: &HostBacking,
    order: &[u32],
    fast_units: usize,
    fpu: u64,
    fast: &mut [u32],
) {
    let mut room = fast_units;
    let mut decided = vec![None; h.blocks()];
    for &u in order {
        let b = h.block_of(u as usize);
        let on_fast = *decided[b].get_or_insert_with(|| {
            let n = h.units_of(b).len();
            let fits = n <= room;
            if fits {
                room -= n;
            }
            fits
        });
        if on_fast {
            fast[u as usize] = fpu as u32;
        }
    }
}

/// Splits the host folio headed by `head` as its policy asked: it stays where it is, mapped with
/// 4 KiB pages. The PMD is replaced by a page table: one TLB shootdown on every vCPU, charged
/// at the migration model's per-mapping cost. The policy learns the new backing.
fn split_folio(v: &mut VmState, head: Gfn, m: &MemoryModel, policy: &mut dyn SimPolicy) {
    let Some(h) = &mut v.host else {
        return;
    };
    let Some(b) = h.block_of_head(head) else {
        return;
    };
    if !h.split(b) {
        return;
    }
    v.dirty = true;
    let stall = v.wl.vcpus as f64 * m.migration.per_page_us * 1e3;
    v.pending_stall += stall;
    v.res.migration_ns += stall;
    policy.host_folios_changed(v.id, &h.heads());
}

/// khugepaged's look at one block of a VM (`HostBacking::try_collapse`). A collapse copies all
/// 512 pages into the new huge page with the range unmapped: the VM's accesses to it wait as for
/// a background move of 2 MiB. The policy is told where the block is now and the new backing.
/// Returns the bytes that crossed tiers.
fn collapse_folio(
    v: &mut VmState,
    block: usize,
    cfg: &SimConfig,
    fast_free_frames: u64,
    rate: f64,
    mig_bytes: &mut [f64; 2],
    policy: &mut dyn SimPolicy,
) -> anyhow::Result<u64> {
    let fpu = cfg.fpu();
    let m = &cfg.model;
    let Some(h) = &mut v.host else {
        return Ok(0);
    };
    let units = h.units_of(block);
    // khugepaged needs a young page in the range (`SCAN_LACK_REFERENCED_PAGE` otherwise).
    let referenced = units.clone().any(|u| v.profile.share(u) > 0.0);
    let free = |n: NodeId| {
        if n == FAST {
            fast_free_frames
        } else {
            u64::MAX
        }
    };
    let Some(c) = h.try_collapse(block, &mut v.fast, fpu, referenced, free) else {
        return Ok(0);
    };
    let heads = h.heads();
    v.dirty = true;
    if c.to == FAST {
        v.fast_frames += c.from_slow;
    } else {
        v.fast_frames -= c.from_fast;
    }
    // Traffic: the 512 pages read where they were, the new huge page written on its node.
    let block_bytes = (HUGE_FRAMES * FRAME_SIZE) as f64;
    mig_bytes[0] += (c.from_fast * FRAME_SIZE) as f64;
    mig_bytes[1] += (c.from_slow * FRAME_SIZE) as f64;
    mig_bytes[if c.to == FAST { 0 } else { 1 }] += block_bytes;
    let copy = block_bytes / (m.migration.copy_gbps * 1e9);
    let share: f64 = units.clone().map(|u| v.profile.share(u)).sum();
    let unmap = v.wl.vcpus as f64 * m.unmap_secs(block_bytes);
    let stall = unmap + (rate * share * copy).min(v.wl.concurrency) * copy / 2.0;
    v.pending_stall += stall * 1e9;
    v.res.migration_ns += stall * 1e9;
    let head = Gfn(units.start as u64 * fpu);
    policy.set_placement(v.id, head, units.len() as u64 * fpu, Some(c.to))?;
    policy.host_folios_changed(v.id, &heads);
    Ok(c.moved_frames() * FRAME_SIZE)
}

/// A policy that never moves anything (static first-touch, and all-fast).
pub struct Static {
    pub name: &'static str,
}

impl HostPagesAware for Static {}

impl Policy for Static {
    fn name(&self) -> &str {
        self.name
    }
    fn add_vm(&mut self, _: VmSpec) -> Result<(), vtism_engine::EngineError> {
        Ok(())
    }
    fn remove_vm(&mut self, _: VmId) -> Result<(), vtism_engine::EngineError> {
        Ok(())
    }
    fn set_quota(&mut self, _: VmId, _: u64) -> Result<(), vtism_engine::EngineError> {
        Ok(())
    }
    fn observe(
        &mut self,
        _: VmId,
        _: vtism_engine::Observation<'_>,
        _: Nanos,
    ) -> Result<vtism_engine::IngestStats, vtism_engine::EngineError> {
        Ok(Default::default())
    }
    fn set_placement(
        &mut self,
        _: VmId,
        _: Gfn,
        _: u64,
        _: Option<NodeId>,
    ) -> Result<(), vtism_engine::EngineError> {
        Ok(())
    }
    fn plan(&mut self, _: &PlanContext<'_>, _: Nanos) -> vtism_engine::Plan {
        Default::default()
    }
}
