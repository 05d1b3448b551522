//! One tiering round, driven identically by the daemon (`vtism host`) and the simulator
//! (`vtism sim`, its `vtism`, `vtism-island` and `vtism-pool` policies): the engine and the
//! fast-memory pool behind one set of calls, with no I/O. Both read a round's budget and
//! allowances from the same move limits ([`crate::limits`]).
//!
//! The driver gathers facts and carries out moves; [`Tiering`] decides:
//! - VMs come and go ([`Tiering::add_vm`], [`Tiering::remove_vm`], [`Tiering::reregister_vm`]),
//!   admitted by the pool (their guaranteed minimum must fit) and then by the engine;
//! - observations go to the engine ([`Tiering::observe`]), placement facts through one
//!   coalescer ([`Tiering::learn`]);
//! - each round ([`Tiering::round`]): the pool's demand by one rule ([`Tiering::demands`]),
//!   rebalance, the quota changes applied to the engine, a plan, the plan cut to each VM's rate
//!   allowance and the cut undone in the engine. Out come the moves to run now and the quota
//!   changes the driver reports (channels, logs, status).

use crate::allowance::{cut_to_allowances, Allowances, Cut};
use crate::placement::{Coalescer, PlacementRun};
use crate::plan::{Move, Plan};
use crate::policy::{EngineError, IngestStats, Observation, PlanContext, Policy, VmSpec};
use crate::pool::{FastPool, PoolError, PoolParams, QuotaChange, VmLimits};
use crate::types::{Nanos, NodeId, VmId};
use crate::vtism::SplitRequest;
use crate::vtism::{VmSummary, VtismPolicy};
use std::collections::BTreeMap;
use thiserror::Error;
use vtism_proto::CountMeaning;

#[derive(Debug, Error, PartialEq)]
pub enum RoundError {
    #[error("fast-memory pool: {0}")]
    Pool(#[from] PoolError),
    #[error("engine: {0}")]
    Engine(#[from] EngineError),
}

/// What one round decided.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RoundOutcome {
    /// Quota changes made this round, in the order they were applied (shrinks first). The
    /// engine plans with them already; the driver tells the guests and reports them.
    pub quota_changes: Vec<QuotaChange>,
    /// The moves to run now, in phase order, and the planner's statistics (which count the whole
    /// plan, cut or not).
    pub plan: Plan,
    /// Moves cut by the rate allowances: their frames are where they were, as the engine now
    /// knows, so the next plan proposes them again.
    pub deferred: Vec<Move>,
    /// Host folios the engine would place better as base pages (`folio`, "Split or not"): the
    /// driver splits those the kernel lets it.
    pub splits: Vec<SplitRequest>,
}

impl RoundOutcome {
    /// Bytes the planner decided to move, before the cut.
    pub fn planned_bytes(&self) -> u64 {
        self.plan.stats.promote_bytes + self.plan.stats.demote_bytes
    }
}

/// True once a VM's hot-set estimate is worth giving the pool. A rate level (channel v1.1) is
/// already an average over many windows: from its first round. A count of rounds seen (v1.0,
/// and host-side access counts) keeps rising until the VM has a full history window
/// (`count_cap` rounds): before that it would shrink a quota for lack of data.
pub fn demand_ready(s: &VmSummary, count_cap: u64) -> bool {
    match s.counts {
        CountMeaning::RateLevel => s.rounds > 0,
        CountMeaning::RoundsSeen => s.rounds >= count_cap,
    }
}

/// The engine and the pool, and what the round keeps of each VM.
pub struct Tiering {
    engine: VtismPolicy,
    pool: FastPool,
    /// Each VM as registered (its quota is the pool's, kept in the engine).
    specs: BTreeMap<VmId, VmSpec>,
}

impl Tiering {
    pub fn new(engine: VtismPolicy, pool: FastPool) -> Tiering {
        Tiering {
            engine,
            pool,
            specs: BTreeMap::new(),
        }
    }

    pub fn engine(&self) -> &VtismPolicy {
        &self.engine
    }

    pub fn pool(&self) -> &FastPool {
        &self.pool
    }

    pub fn vms(&self) -> impl Iterator<Item = VmId> + '_ {
        self.specs.keys().copied()
    }

    /// Admits a VM: its minimum must fit the pool beside the others', and the engine must take
    /// its RAM map and home node. Its quota is the pool's initial one (`spec.fast_quota_bytes`
    /// is not used); the next round makes the rest of its room. Nothing changes on an error.
    pub fn add_vm(
        &mut self,
        mut spec: VmSpec,
        limits: VmLimits,
        now: Nanos,
    ) -> Result<QuotaChange, RoundError> {
        let initial = self.pool.add_vm(spec.id, limits, now)?;
        spec.fast_quota_bytes = initial.to_bytes;
        if let Err(e) = self.engine.add_vm(spec.clone()) {
            self.pool.remove_vm(spec.id);
            return Err(e.into());
        }
        self.specs.insert(spec.id, spec);
        Ok(initial)
    }

    /// Lets a VM go; its quota returns to the pool. False if it was not there.
    pub fn remove_vm(&mut self, vm: VmId) -> bool {
        let had = self.specs.remove(&vm).is_some();
        if had {
            self.pool.remove_vm(vm);
            let _ = self.engine.remove_vm(vm);
        }
        had
    }

    /// Registers a VM again with a new RAM map or home node (hot-plug, reset, vCPUs moved): the
    /// engine forgets its hotness and placement, the pool keeps its quota and limits. On an
    /// error the VM is let go entirely.
    pub fn reregister_vm(&mut self, mut spec: VmSpec) -> Result<(), RoundError> {
        let Some(quota) = self.pool.quota(spec.id) else {
            return Err(EngineError::UnknownVm(spec.id).into());
        };
        spec.fast_quota_bytes = quota;
        let _ = self.engine.remove_vm(spec.id);
        if let Err(e) = self.engine.add_vm(spec.clone()) {
            self.remove_vm(spec.id);
            return Err(e.into());
        }
        self.specs.insert(spec.id, spec);
        Ok(())
    }

    /// A VM's vCPUs moved to another node: it keeps its hotness, placement and quota; only where
    /// later plans promote and demote to changes. Nothing changes on an error.
    pub fn set_home(&mut self, vm: VmId, home: Option<NodeId>) -> Result<(), RoundError> {
        let Some(spec) = self.specs.get_mut(&vm) else {
            return Err(EngineError::UnknownVm(vm).into());
        };
        self.engine.set_home_node(vm, home)?;
        spec.home_node = home;
        Ok(())
    }

    /// A VM's guest restarted on the same memory map: its hotness is forgotten, its placement,
    /// quota and limits kept (`VtismPolicy::forget_hotness`). Returns the frames that had been
    /// hinted.
    pub fn forget_hotness(&mut self, vm: VmId) -> Result<u64, EngineError> {
        self.engine.forget_hotness(vm)
    }

    /// New limits for a VM (its quota is brought within them at once). Nothing changes on an
    /// error.
    pub fn set_limits(
        &mut self,
        vm: VmId,
        limits: VmLimits,
        now: Nanos,
    ) -> Result<Vec<QuotaChange>, RoundError> {
        let changes = self.pool.set_limits(vm, limits, now)?;
        self.apply(&changes);
        Ok(changes)
    }

    /// A new configuration, all or nothing: VMs in `removed` leave, the pool takes `params` and
    /// each listed VM's `limits` (in whichever order is feasible: a pool shrinking under the old
    /// minimums needs the new limits first, limits raised beyond the old pool need the new size
    /// first), and with `engine` every remaining VM moves to a new engine (which relearns
    /// hotness and placement; a home node its topology lacks is dropped).
    pub fn reconfigure(
        &mut self,
        params: PoolParams,
        limits: &BTreeMap<VmId, VmLimits>,
        removed: &[VmId],
        engine: Option<VtismPolicy>,
        now: Nanos,
    ) -> Result<Vec<QuotaChange>, RoundError> {
        let mut base = self.pool.clone();
        for vm in removed {
            base.remove_vm(*vm);
        }
        let (pool, changes) = reconfigured(base, params, limits, now)?;
        let kept: Vec<VmId> = self
            .specs
            .keys()
            .copied()
            .filter(|vm| !removed.contains(vm))
            .collect();
        let engine = match engine {
            Some(mut e) => {
                for vm in &kept {
                    let mut spec = self.specs[vm].clone();
                    spec.fast_quota_bytes = pool.quota(*vm).unwrap_or(spec.fast_quota_bytes);
                    spec.home_node = spec.home_node.filter(|h| e.topology().node(*h).is_some());
                    e.add_vm(spec)?;
                }
                Some(e)
            }
            None => None,
        };
        for vm in removed {
            if self.specs.remove(vm).is_some() {
                let _ = self.engine.remove_vm(*vm);
            }
        }
        if let Some(e) = engine {
            self.engine = e;
        }
        self.pool = pool;
        self.apply(&changes);
        Ok(changes)
    }

    /// Which 2 MiB blocks of a VM's RAM the host maps huge: each is placed whole and its frames'
    /// observations fold into one by the folio rule (`VtismPolicy::set_host_folios`). Returns
    /// the number of folios kept.
    pub fn set_host_folios(
        &mut self,
        vm: VmId,
        heads: impl IntoIterator<Item = vtism_proto::Gfn>,
    ) -> Result<u64, EngineError> {
        self.engine.set_host_folios(vm, heads)
    }

    /// Frames of a VM the host cannot move in the planner's units: never planned
    /// (`VtismPolicy::set_pinned`). Returns the frames pinned.
    pub fn set_pinned(
        &mut self,
        vm: VmId,
        ranges: impl IntoIterator<Item = vtism_proto::GfnRange>,
    ) -> Result<u64, EngineError> {
        self.engine.set_pinned(vm, ranges)
    }

    /// One observation of a VM (a validated hint round, or host-side access counts).
    pub fn observe(
        &mut self,
        vm: VmId,
        obs: Observation<'_>,
        now: Nanos,
    ) -> Result<IngestStats, EngineError> {
        self.engine.observe(vm, obs, now)
    }

    /// Placement facts (reconcile queries, pages that did not move, cut moves), in order: a fact
    /// says where frames are now, so a later fact about a frame wins. Frames already placed as
    /// the engine believes are skipped, the rest go to the engine in runs through one coalescer
    /// (facts sorted by VM and frame give the longest runs). Facts about unknown VMs or frames
    /// outside a VM's RAM are dropped. Returns the frames whose placement changed.
    pub fn learn(&mut self, facts: impl IntoIterator<Item = PlacementRun>) -> u64 {
        let Tiering { engine, specs, .. } = self;
        let mut changed = 0u64;
        let mut runs = Coalescer::new(|r: &PlacementRun| {
            specs
                .get(&r.vm)
                .is_some_and(|s| s.ram.contains_span(r.gfn, r.frames))
        });
        let set = |engine: &mut VtismPolicy, r: Option<PlacementRun>| {
            if let Some(r) = r {
                let _ = engine.set_placement(r.vm, r.gfn, r.frames, r.node);
            }
        };
        for fact in facts {
            for i in 0..fact.frames {
                let Some(gfn) = fact.gfn.checked_add(i) else {
                    break;
                };
                let f = PlacementRun::frame(fact.vm, gfn, fact.node);
                // The engine's belief about this frame must include every earlier fact.
                if !runs.continues(&f) {
                    set(engine, runs.finish());
                }
                match engine.frame_node(f.vm, gfn) {
                    Ok(believed) if believed != f.node => {
                        changed += 1;
                        set(engine, runs.push(f));
                    }
                    _ => set(engine, runs.finish()),
                }
            }
        }
        set(engine, runs.finish());
        changed
    }

    /// The pool's demand now, by one rule for every driver: `VtismPolicy::pool_demands` over
    /// the VMs whose estimate is ready (`demand_ready`). VMs left out keep the pool's last
    /// estimate: a VM without a tracker, or just registered, is not shrunk for lack of data.
    pub fn demands(&self) -> Vec<(VmId, u64)> {
        let count_cap = u64::from(self.engine.params().count_cap);
        let ready: Vec<VmId> = self
            .specs
            .keys()
            .copied()
            .filter(|&vm| {
                self.engine
                    .summary(vm)
                    .is_ok_and(|s| demand_ready(&s, count_cap))
            })
            .collect();
        self.engine
            .pool_demands(&ready, self.pool.params().fast_bytes)
    }

    /// One round: rebalance the pool by demand and apply its changes, plan, cut the plan to the
    /// rate allowances and undo the cut in the engine.
    pub fn round(
        &mut self,
        ctx: &PlanContext<'_>,
        allowances: &Allowances,
        now: Nanos,
    ) -> RoundOutcome {
        let demand = self.demands();
        let quota_changes = self.pool.rebalance(&demand, now);
        self.apply(&quota_changes);
        let plan = self.engine.plan(ctx, now);
        let engine = &self.engine;
        let unit_end = |vm, gfn| engine.unit_end(vm, gfn);
        let Cut { kept, deferred } = cut_to_allowances(plan.moves, allowances, &unit_end);
        self.learn(deferred.iter().map(|m| PlacementRun {
            vm: m.vm,
            gfn: m.gfn,
            frames: m.frames,
            node: Some(m.from),
        }));
        RoundOutcome {
            quota_changes,
            plan: Plan {
                moves: kept,
                stats: plan.stats,
            },
            deferred,
            splits: self.engine.take_split_requests(),
        }
    }

    /// The engine plans with the pool's quotas.
    fn apply(&mut self, changes: &[QuotaChange]) {
        for c in changes {
            if let Some(s) = self.specs.get_mut(&c.vm) {
                s.fast_quota_bytes = c.to_bytes;
                let _ = self.engine.set_quota(c.vm, c.to_bytes);
            }
        }
    }
}

/// `base` under new parameters and limits, trying both orders; the first error if neither works.
fn reconfigured(
    base: FastPool,
    params: PoolParams,
    limits: &BTreeMap<VmId, VmLimits>,
    now: Nanos,
) -> Result<(FastPool, Vec<QuotaChange>), PoolError> {
    let set_params = |p: &mut FastPool, out: &mut Vec<QuotaChange>| {
        if *p.params() != params {
            out.extend(p.set_params(params, now)?);
        }
        Ok::<(), PoolError>(())
    };
    let set_limits = |p: &mut FastPool, out: &mut Vec<QuotaChange>| {
        for (vm, l) in limits {
            if p.limits(*vm).is_some_and(|old| old != *l) {
                out.extend(p.set_limits(*vm, *l, now)?);
            }
        }
        Ok::<(), PoolError>(())
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
    Err(first_error.expect("two attempts, both failed"))
}
