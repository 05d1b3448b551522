//! vtism with its fast-memory pool: the engine plus `FastPool`, driven as the daemon drives them.
//! Before each plan every VM's hot-set estimate goes to the pool and the quota changes it returns
//! go to the engine (`set_quota`; a shrunk quota makes the engine demote).
//!
//! Limits follow HMM-V's co-run (section 5.9): a guaranteed 75% and at most 125% of the VM's
//! initial quota, shares equal to the initial quota. Island mode keeps the initial quotas.

use vtism_engine::{
    EngineError, FastPool, IngestStats, Nanos, NodeId, Observation, Plan, PlanContext, Policy,
    PoolMode, PoolParams, QuotaChange, VmId, VmLimits, VmSpec, VtismPolicy,
};
use vtism_proto::{CountMeaning, Gfn};

pub struct PooledVtism {
    name: &'static str,
    engine: VtismPolicy,
    pool: FastPool,
    fast_bytes: u64,
    vms: Vec<VmId>,
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
            engine,
            pool,
            fast_bytes,
            vms: Vec::new(),
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
        &self.pool
    }

    fn apply(&mut self, changes: Vec<QuotaChange>) -> Result<(), EngineError> {
        for c in changes {
            self.engine.set_quota(c.vm, c.to_bytes)?;
            self.changes.push(c);
        }
        Ok(())
    }
}

impl Policy for PooledVtism {
    fn name(&self) -> &str {
        self.name
    }

    fn add_vm(&mut self, spec: VmSpec) -> Result<(), EngineError> {
        let (id, initial) = (spec.id, spec.fast_quota_bytes);
        self.engine.add_vm(spec)?;
        // The engine accepted the VM, so the pool has not seen it either; the minimums are 75% of
        // initial quotas that sum to the pool's size, so they always fit.
        let c = self
            .pool
            .add_vm(id, Self::limits_for(initial), Nanos(0))
            .expect("a new VM whose minimum fits the pool");
        self.vms.push(id);
        self.apply(vec![c])
    }

    fn remove_vm(&mut self, vm: VmId) -> Result<(), EngineError> {
        self.pool.remove_vm(vm);
        self.vms.retain(|&v| v != vm);
        self.engine.remove_vm(vm)
    }

    fn set_quota(&mut self, vm: VmId, fast_quota_bytes: u64) -> Result<(), EngineError> {
        self.engine.set_quota(vm, fast_quota_bytes)
    }

    fn observe(
        &mut self,
        vm: VmId,
        obs: Observation<'_>,
        now: Nanos,
    ) -> Result<IngestStats, EngineError> {
        self.engine.observe(vm, obs, now)
    }

    fn set_placement(
        &mut self,
        vm: VmId,
        gfn: Gfn,
        frames: u64,
        node: Option<NodeId>,
    ) -> Result<(), EngineError> {
        self.engine.set_placement(vm, gfn, frames, node)
    }

    fn plan(&mut self, ctx: &PlanContext<'_>, now: Nanos) -> Plan {
        // A rounds-seen estimate only means something once its history is full; a rate-level
        // one from the first round.
        let window = self.engine.params().count_cap as u64;
        let ready: Vec<VmId> = self
            .vms
            .iter()
            .copied()
            .filter(|&vm| {
                self.engine.summary(vm).is_ok_and(|s| {
                    s.rounds >= window || (s.rounds > 0 && s.counts == CountMeaning::RateLevel)
                })
            })
            .collect();
        let demand = self.engine.pool_demands(&ready, self.fast_bytes);
        let changes = self.pool.rebalance(&demand, now);
        // The VMs are the engine's own: set_quota cannot fail for them.
        let _ = self.apply(changes);
        self.engine.plan(ctx, now)
    }

    fn fast_quota(&self, vm: VmId) -> Option<u64> {
        self.pool.quota(vm)
    }
}
