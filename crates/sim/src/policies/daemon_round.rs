//! vtism as vtismd drives it, behind the simulator's `Policy` interface: the daemon's tiering
//! round (`vtism_engine::Tiering`: the pool's demand by the daemon's rule, rebalance, quota
//! changes into the engine, plan, the cut to per-VM allowances) once every `interval_ms` of
//! simulated time, its plan budget and allowances read from the daemon's move limits
//! (`MoveLimits`, at `RoundLimits`' defaults, as vtismd reads them). Between rounds nothing is
//! planned; hints are ingested as they come, as the daemon ingests them. A round's moves take
//! their bytes from the buckets when planned (vtismd's workers take them batch by batch as they
//! move; the allowances already keep a round within what the buckets give over the interval).
//!
//! Pool limits follow HMM-V's co-run (section 5.9): a guaranteed 75% and at most 125% of the
//! VM's initial quota, shares equal to the initial quota. Island mode (the `vtism` row) keeps
//! the initial quotas.
//!
//! Host folios (`--host-pages thp`) as vtismd handles them (docs/host.md, "Host huge pages"): the
//! backing is read at admission and re-read every `discovery.refresh_interval_ms`; the engine's
//! split requests are carried out just before a re-read, so the engine sees its splits at once
//! and khugepaged's collapses at the next re-read.

use crate::host_folios::HostPagesAware;
use std::collections::{BTreeMap, BTreeSet};
use vtism_engine::{
    EngineError, FastPool, IngestStats, MoveLimits, Nanos, NodeId, Observation, PlacementRun, Plan,
    PlanContext, Policy, PoolMode, PoolParams, QuotaChange, RoundError, RoundLimits, SplitRequest,
    Tiering, VmId, VmLimits, VmSpec, VtismPolicy,
};
use vtism_proto::Gfn;

/// vtismd's `discovery.refresh_interval_ms` default (crates/host/src/config.rs): how often it
/// re-reads a VM's memory map and backing.
const BACKING_REREAD: Nanos = Nanos(10_000_000_000);

/// What vtismd knows of each VM's host folios, and the splits it has yet to carry out.
#[derive(Default)]
struct BackingReads {
    next: Nanos,
    /// Read at admission.
    read: BTreeSet<VmId>,
    /// The backing the host has now, per VM, not read yet.
    unread: BTreeMap<VmId, Vec<Gfn>>,
    /// The engine's split requests, waiting for the next re-read.
    asked: Vec<SplitRequest>,
    /// Requests are dropped instead (`vtism-no-split`, for the comparison only).
    never_split: bool,
}

pub struct DaemonRound {
    name: &'static str,
    tiering: Tiering,
    cadence: RoundLimits,
    limits: MoveLimits,
    next_round: Nanos,
    backing: BackingReads,
    /// Every quota change, in order (for reports and tests).
    pub changes: Vec<QuotaChange>,
}

impl DaemonRound {
    /// `fast_bytes`: the fast memory the VMs share (the sum of their initial quotas).
    pub fn new(
        name: &'static str,
        engine: VtismPolicy,
        mode: PoolMode,
        fast_bytes: u64,
        cadence: RoundLimits,
    ) -> anyhow::Result<Self> {
        let pool = FastPool::new(PoolParams {
            mode,
            fast_bytes,
            ..Default::default()
        })?;
        anyhow::ensure!(cadence.interval_ms > 0, "interval_ms: must be at least 1");
        Ok(DaemonRound {
            name,
            tiering: Tiering::new(engine, pool),
            limits: MoveLimits::new(
                cadence.promote_mbps,
                cadence.demote_mbps,
                cadence.burst_s,
                Nanos(0),
            ),
            next_round: Nanos(0),
            cadence,
            backing: BackingReads::default(),
            changes: Vec::new(),
        })
    }

    /// The engine's split requests are never carried out: host folios stay whole (a comparison
    /// of the split rule, not a vtismd setting).
    pub fn never_split(mut self) -> Self {
        self.backing.never_split = true;
        self
    }

    /// A re-read of every VM's backing is due at `now`.
    fn reread_due(&self, now: Nanos) -> bool {
        now >= self.backing.next
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

    /// Quota changes reach the move limits (each VM's burst holds its quota) and the record.
    fn record(&mut self, changes: Vec<QuotaChange>, now: Nanos) {
        self.limits.follow_quotas(&changes, now);
        self.changes.extend(changes);
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

impl Policy for DaemonRound {
    fn name(&self) -> &str {
        self.name
    }

    fn add_vm(&mut self, spec: VmSpec) -> Result<(), EngineError> {
        let (vm, limits) = (spec.id, Self::limits_for(spec.fast_quota_bytes));
        let c = self
            .tiering
            .add_vm(spec, limits, Nanos(0))
            .map_err(|e| engine_error(vm, e))?;
        let r = &self.cadence;
        self.limits
            .set_vm(vm, r.vm_promote_mbps, r.vm_demote_mbps, Nanos(0));
        self.record(vec![c], Nanos(0));
        Ok(())
    }

    fn remove_vm(&mut self, vm: VmId) -> Result<(), EngineError> {
        self.limits.remove_vm(vm);
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
        self.record(changes, Nanos(0));
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
        if self.reread_due(now) {
            self.backing.next = Nanos(now.0 + BACKING_REREAD.0);
            for (vm, heads) in std::mem::take(&mut self.backing.unread) {
                let _ = self.tiering.set_host_folios(vm, heads);
            }
        }
        if now < self.next_round {
            return Plan::default();
        }
        let window = Nanos::from_millis(self.cadence.interval_ms);
        self.next_round = Nanos(now.0 + window.0);
        let (budget, allowances) = self.limits.round_inputs(window, now);
        let ctx = PlanContext {
            node_free_bytes: ctx.node_free_bytes,
            budget_bytes: match (ctx.budget_bytes, budget) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            },
            node_short_bytes: ctx.node_short_bytes,
        };
        let out = self.tiering.round(&ctx, &allowances, now);
        for m in &out.plan.moves {
            self.limits.take(m.vm, m.kind.direction(), m.bytes(), now);
        }
        self.record(out.quota_changes, now);
        if !self.backing.never_split {
            self.backing.asked.extend(out.splits);
        }
        out.plan
    }

    fn fast_quota(&self, vm: VmId) -> Option<u64> {
        self.tiering.pool().quota(vm)
    }
}

impl HostPagesAware for DaemonRound {
    /// Read at once at admission, else at the next re-read.
    fn host_folios_changed(&mut self, vm: VmId, heads: &[Gfn]) {
        if self.backing.read.insert(vm) {
            let _ = self.tiering.set_host_folios(vm, heads.iter().copied());
        } else {
            self.backing.unread.insert(vm, heads.to_vec());
        }
    }

    /// The requests held since the last re-read, when one is due.
    fn take_splits(&mut self, now: Nanos) -> Vec<(VmId, Gfn)> {
        if !self.reread_due(now) {
            return Vec::new();
        }
        std::mem::take(&mut self.backing.asked)
            .into_iter()
            .map(|r| (r.vm, r.head))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vtism_engine::{NodeSpec, Tier, Topology};
    use vtism_proto::{CountMeaning, GfnRange, HintEntry, PageType, RamMap, HUGE_FRAMES};

    const FAST: NodeId = NodeId(0);
    const SLOW: NodeId = NodeId(1);

    /// One hint round of `entries`, counts as rate levels, as the tracker publishes them.
    fn observe_levels(r: &mut DaemonRound, vm: VmId, entries: &[HintEntry], now: Nanos) {
        let obs = Observation::Hints {
            entries,
            overflow: false,
            counts: CountMeaning::RateLevel,
        };
        r.observe(vm, obs, now).unwrap();
    }

    /// Host folios as vtismd handles them: eight folios with 48 hot frames each against a quota
    /// of three folios (the engine's own test of the rule). The engine asks to split them at
    /// its first rounds; vtismd carries the requests out at its next re-read of the backing,
    /// 10 s after the first, and the engine then places the split blocks' frames alone. The
    /// comparison's `never_split` drops the requests.
    #[test]
    fn split_requests_are_carried_out_at_the_next_backing_read() {
        let h = HUGE_FRAMES;
        for never in [false, true] {
            let topo = Topology::new(
                vec![node(FAST, 0, vec![0]), node(SLOW, 1, vec![])],
                Some(vec![vec![10, 20], vec![20, 10]]),
            )
            .unwrap();
            let engine = VtismPolicy::new(topo, Default::default()).unwrap();
            let quota = 3 * h * vtism_proto::FRAME_SIZE;
            let mut r = DaemonRound::new(
                "vtism",
                engine,
                PoolMode::Island,
                quota,
                RoundLimits::DEFAULT,
            )
            .unwrap();
            if never {
                r = r.never_split();
            }
            let vm = VmId(1);
            r.add_vm(VmSpec {
                id: vm,
                ram: RamMap::contiguous(8 * h),
                fast_quota_bytes: quota,
                home_node: Some(FAST),
            })
            .unwrap();
            r.set_placement(vm, Gfn(0), 8 * h, Some(SLOW)).unwrap();
            let mut huge: Vec<Gfn> = (0..8).map(|b| Gfn(b * h)).collect();
            r.host_folios_changed(vm, &huge);
            let hints: Vec<HintEntry> = (0..8)
                .flat_map(|b| (0..48).map(move |k| b * h + k * 7))
                .map(|g| HintEntry::new(Gfn(g), 200, false, PageType::Anon, false, true))
                .collect();
            let mut split_at = Vec::new();
            for epoch in 0..250u64 {
                let now = Nanos::from_millis(epoch * 100);
                observe_levels(&mut r, vm, &hints, now);
                let asked = r.take_splits(now);
                if !asked.is_empty() {
                    split_at.push((epoch, asked.len()));
                    huge.retain(|g| !asked.iter().any(|&(_, head)| head == *g));
                    r.host_folios_changed(vm, &huge);
                }
                r.plan(&PlanContext::default(), now);
            }
            if never {
                assert!(split_at.is_empty(), "{split_at:?}");
            } else {
                assert_eq!(split_at, vec![(100, 8)], "all eight at the re-read at 10 s");
                assert!(huge.is_empty());
                let s = r.tiering.engine().summary(vm).unwrap();
                assert_eq!(s.host_folios, 0, "the engine read the splits");
            }
        }
    }

    fn node(id: NodeId, tier: u8, cpus: Vec<u32>) -> NodeSpec {
        NodeSpec {
            id,
            tier: Tier(tier),
            capacity_bytes: 1 << 40,
            cpus,
            socket: 0,
        }
    }

    /// A guest whose hot set (1 GiB, all on slow memory) fits its quota: vtismd plans once a
    /// second, and the VM's moves stay within its own limit and its burst (by the end of round
    /// k, at most k + 1 + `burst_s` seconds of it: the allowance looks one interval ahead; a cut
    /// runs to the end of a 2 MiB folio). The limit here is 64 MB/s, so that the burst and the
    /// rate both bind within the engine's round budget.
    #[test]
    fn rounds_come_every_interval_within_the_vm_limit() {
        let topo = Topology::new(
            vec![node(FAST, 0, vec![0, 1]), node(SLOW, 1, vec![])],
            Some(vec![vec![10, 20], vec![20, 10]]),
        )
        .unwrap();
        let params = vtism_engine::EngineParams::default();
        let round_budget = params.round_budget_bytes;
        let engine = VtismPolicy::new(topo, params).unwrap();
        let frames: u64 = 1 << 20; // 4 GiB
        let quota = 1u64 << 30;
        let limits = RoundLimits {
            vm_promote_mbps: 64,
            ..RoundLimits::DEFAULT
        };
        let mut r =
            DaemonRound::new("vtism", engine, PoolMode::Island, quota, limits.clone()).unwrap();
        let vm = VmId(1);
        r.add_vm(VmSpec {
            id: vm,
            ram: RamMap::new(vec![GfnRange::new(Gfn(0), Gfn(frames))]).unwrap(),
            fast_quota_bytes: quota,
            home_node: Some(FAST),
        })
        .unwrap();
        r.set_placement(vm, Gfn(0), frames, Some(SLOW)).unwrap();
        let half = frames / 4;
        let flip = |second: u64| -> Vec<HintEntry> {
            (0..2 * half)
                .map(|g| {
                    let hot = (g < half) == second.is_multiple_of(2);
                    let level = if hot { 200 } else { 40 };
                    HintEntry::new(Gfn(g), level, false, PageType::Anon, false, true)
                })
                .collect()
        };
        let vm_limit = 64_000_000;
        let mut planned = Vec::new();
        for epoch in 0..30u64 {
            let now = Nanos::from_millis(epoch * 100);
            observe_levels(&mut r, vm, &flip(epoch / 10), now);
            let plan = r.plan(&PlanContext::default(), now);
            let promoted: u64 = plan
                .moves
                .iter()
                .filter(|m| m.kind.direction() == vtism_engine::Direction::Promote)
                .map(|m| m.bytes())
                .sum();
            if !plan.moves.is_empty() {
                planned.push((epoch, promoted));
            }
        }
        let epochs: Vec<u64> = planned.iter().map(|p| p.0).collect();
        assert_eq!(epochs, vec![0, 10, 20], "a round a second: {planned:?}");
        assert!(
            planned[0].1 > vm_limit * (limits.burst_s + 1) + (2 << 20),
            "the first round moves more than burst_s of the rate allows: {planned:?}"
        );
        let mut total = 0;
        for (k, &(_, bytes)) in planned.iter().enumerate() {
            assert!(bytes > 0 && bytes <= round_budget, "{planned:?}");
            total += bytes;
            let seconds = k as u64 + 1;
            assert!(
                total <= quota + (vm_limit + (2 << 20)) * seconds,
                "{planned:?}"
            );
        }
    }
}
