//! vtism with its fast-memory pool: the daemon's own tiering round (`vtism_engine::Tiering`)
//! behind the simulator's `Policy` interface. Each plan is one round: the pool's demand by the
//! daemon's rule, rebalance, quota changes into the engine, plan (no per-VM rate allowances in
//! the simulator).
//!
//! Limits follow HMM-V's co-run (section 5.9): a guaranteed 75% and at most 125% of the VM's
//! initial quota, shares equal to the initial quota. Island mode keeps the initial quotas.

use vtism_engine::{
    Allowances, EngineError, FastPool, IngestStats, Nanos, NodeId, Observation, PlacementRun, Plan,
    PlanContext, Policy, PoolMode, PoolParams, QuotaChange, RoundError, Tiering, VmId, VmLimits,
    VmSpec, VtismPolicy,
};
use vtism_proto::Gfn;

pub struct PooledVtism {
    name: &'static str,
    tiering: Tiering,
    /// Every quota change, in order (for reports and tests).
    pub changes: Vec<QuotaChange>,
}

impl PooledVtism {
    /// `fast_bytes`: the fast memory the VMs share (the sum of their initial quotas).
    pub fn new(
        name: &'static str,
        engine: VtismPolicy,
        mode: PoolMode,
        fast_bytes: u64,
    ) -> anyhow::Result<Self> {
        let pool = FastPool::new(PoolParams {
            mode,
            fast_bytes,
            ..Default::default()
        })?;
        Ok(PooledVtism {
            name,
            tiering: Tiering::new(engine, pool),
            changes: Vec::new(),
        })
    }

    /// HMM-V's limits around an initial quota.
    pub fn limits_for(initial: u64) -> VmLimits {
        VmLimits {
            min_bytes: initial / 4 * 3,
            max_bytes: initial / 4 * 5,
            shares: (initial >> 20).clamp(1, u32::MAX as u64) as u32,
        }
    }

    pub fn pool(&self) -> &FastPool {
        self.tiering.pool()
    }
}

fn engine_error(vm: VmId, e: RoundError) -> EngineError {
    match e {
        RoundError::Engine(e) => e,
        RoundError::Pool(e) => EngineError::PoolRefused {
            vm,
            problem: e.to_string(),
        },
    }
}

impl Policy for PooledVtism {
    fn name(&self) -> &str {
        self.name
    }

    fn add_vm(&mut self, spec: VmSpec) -> Result<(), EngineError> {
        let (vm, limits) = (spec.id, Self::limits_for(spec.fast_quota_bytes));
        let c = self
            .tiering
            .add_vm(spec, limits, Nanos(0))
            .map_err(|e| engine_error(vm, e))?;
        self.changes.push(c);
        Ok(())
    }

    fn remove_vm(&mut self, vm: VmId) -> Result<(), EngineError> {
        match self.tiering.remove_vm(vm) {
            true => Ok(()),
            false => Err(EngineError::UnknownVm(vm)),
        }
    }

    /// An operator's fixed quota: the pool holds the VM at it (minimum = maximum).
    fn set_quota(&mut self, vm: VmId, fast_quota_bytes: u64) -> Result<(), EngineError> {
        let shares = self
            .tiering
            .pool()
            .limits(vm)
            .ok_or(EngineError::UnknownVm(vm))?
            .shares;
        let fixed = VmLimits {
            min_bytes: fast_quota_bytes,
            max_bytes: fast_quota_bytes,
            shares,
        };
        let changes = self
            .tiering
            .set_limits(vm, fixed, Nanos(0))
            .map_err(|e| engine_error(vm, e))?;
        self.changes.extend(changes);
        Ok(())
    }

    fn observe(
        &mut self,
        vm: VmId,
        obs: Observation<'_>,
        now: Nanos,
    ) -> Result<IngestStats, EngineError> {
        self.tiering.observe(vm, obs, now)
    }

    fn set_placement(
        &mut self,
        vm: VmId,
        gfn: Gfn,
        frames: u64,
        node: Option<NodeId>,
    ) -> Result<(), EngineError> {
        self.tiering.engine().ram(vm)?;
        self.tiering.learn([PlacementRun {
            vm,
            gfn,
            frames,
            node,
        }]);
        Ok(())
    }

    fn plan(&mut self, ctx: &PlanContext<'_>, now: Nanos) -> Plan {
        let out = self.tiering.round(ctx, &Allowances::new(), now);
        self.changes.extend(out.quota_changes);
        out.plan
    }

    fn fast_quota(&self, vm: VmId) -> Option<u64> {
        self.tiering.pool().quota(vm)
    }
}
