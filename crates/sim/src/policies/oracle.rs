//! The oracle: told every second how many reads and writes each unit will get until its next
//! decision (1 s) and over the next 10 s (`OracleFeed`), it keeps the units with the most to gain
//! in the coming second in fast memory, and swaps a unit in only when what it saves over the 10 s
//! horizon exceeds what the two moves cost the VM (the same stall model the simulator charges). It pays no tracking cost. It sees future accesses at
//! the current rate and idle latencies, so it ignores bandwidth loading (a Colloid-style policy that
//! leaves hot data on a less loaded slow tier could beat it when the fast tier saturates).

use super::{book_pos, each_unit, peer_common, VmBook};
use crate::model::MemoryModel;
use crate::sim::Setup;
use vtism_engine::{
    EngineError, IngestStats, MoveKind, Nanos, Observation, Phase, Plan, PlanContext, Policy,
    VmSpec,
};

struct VmOracle {
    /// Thread-ns saved by having the unit in fast memory until the next decision, and over the
    /// horizon.
    near: Vec<f64>,
    gain: Vec<f64>,
    /// The next observation is the horizon one.
    got_near: bool,
    fresh: bool,
    concurrency: f64,
    vcpus: f64,
}

pub struct Oracle {
    fpu: u64,
    books: Vec<VmBook>,
    st: Vec<VmOracle>,
    model: MemoryModel,
    workload_conc: Vec<(f64, f64)>,
    /// Mover time one plan may use, s (the feed comes every second).
    pub plan_secs: f64,
}

impl Oracle {
    pub fn new(setup: &Setup<'_>) -> Self {
        Oracle {
            fpu: setup.cfg.fpu(),
            books: Vec::new(),
            st: Vec::new(),
            model: setup.cfg.model.clone(),
            workload_conc: setup
                .workloads
                .iter()
                .map(|w| (w.concurrency, w.vcpus as f64))
                .collect(),
            plan_secs: 1.0,
        }
    }
    fn add(&mut self, spec: &VmSpec) {
        let n = (spec.ram.frames() / self.fpu) as usize;
        let (c, v) = self
            .workload_conc
            .get(self.st.len())
            .copied()
            .unwrap_or((8.0, 8.0));
        self.st.push(VmOracle {
            near: vec![0.0; n],
            gain: vec![0.0; n],
            got_near: false,
            fresh: false,
            concurrency: c,
            vcpus: v,
        });
    }
    fn remove(&mut self, p: usize) {
        self.st.remove(p);
    }
}

/// The oracle does not split host folios; its moves take whole folios.
impl crate::host_folios::HostPagesAware for Oracle {}

impl Policy for Oracle {
    fn name(&self) -> &str {
        "oracle"
    }
    peer_common!();

    fn observe(
        &mut self,
        vm: vtism_engine::VmId,
        obs: Observation<'_>,
        _now: Nanos,
    ) -> Result<IngestStats, EngineError> {
        let p = book_pos(&self.books, vm)?;
        let Observation::Accesses(acc) = obs else {
            return Ok(IngestStats::default());
        };
        let m = &self.model;
        let (dr, dw) = (
            m.slow.read_ns - m.fast.read_ns,
            m.slow.write_ns - m.fast.write_ns,
        );
        let (b, s) = (&mut self.books[p], &mut self.st[p]);
        let st = each_unit(b, acc, |_, u, a| {
            let g = a.reads as f64 * dr + a.writes as f64 * dw;
            if s.got_near {
                s.gain[u] = g;
            } else {
                s.near[u] = g;
            }
        });
        s.fresh = s.got_near;
        s.got_near = !s.got_near;
        Ok(st)
    }

    fn plan(&mut self, _ctx: &PlanContext<'_>, _now: Nanos) -> Plan {
        let mut plan = Plan::default();
        let m = &self.model;
        let unit = (self.fpu * vtism_proto::FRAME_SIZE) as f64;
        let copy = unit / (m.migration.copy_gbps * 1e9);
        let secs = m.migration_secs(unit, unit, 1.0);
        for (b, s) in self.books.iter_mut().zip(self.st.iter_mut()) {
            if !s.fresh {
                continue;
            }
            s.fresh = false;
            let horizon_rate = 10.0; // the feed's horizon, s
                                     // Stall a move costs (as the simulator charges `Unmap` moves), thread-ns.
            let cost = |gain: f64| {
                let rate =
                    gain.max(0.0) / ((m.slow.read_ns - m.fast.read_ns).max(1.0)) / horizon_rate;
                (s.vcpus * m.unmap_secs(unit) + (rate * copy).min(s.concurrency) * copy / 2.0) * 1e9
            };
            let mut order: Vec<usize> = (0..b.units).collect();
            order.sort_by(|&x, &y| {
                s.near[y]
                    .total_cmp(&s.near[x])
                    .then(s.gain[y].total_cmp(&s.gain[x]))
                    .then(x.cmp(&y))
            });
            let mut cold: Vec<usize> = order.iter().rev().copied().filter(|&u| b.fast[u]).collect();
            let mut ci = 0;
            let mut budget = self.plan_secs;
            // Every slow unit in order of the coming second's gain: one that is not worth its move
            // does not hold a place that a unit further down could use.
            for &u in order.iter() {
                if b.fast[u] {
                    continue;
                }
                let g = s.gain[u];
                if budget < secs {
                    break;
                }
                if b.free_units() > 0 {
                    if g > cost(g) {
                        budget -= secs;
                        plan.moves.push(b.mv(u, MoveKind::Promote, Phase::Promote));
                    }
                    continue;
                }
                while ci < cold.len() && !b.fast[cold[ci]] {
                    ci += 1;
                }
                let Some(&v) = cold.get(ci) else { break };
                let gv = s.gain[v];
                if s.near[u] <= s.near[v] || budget < 2.0 * secs {
                    break; // later candidates gain even less in the coming second
                }
                if g - gv > cost(g) + cost(gv) {
                    budget -= 2.0 * secs;
                    ci += 1;
                    plan.moves.push(b.mv(v, MoveKind::Demote, Phase::Demote));
                    plan.moves
                        .push(b.mv(u, MoveKind::Promote, Phase::PromoteAfterDemote));
                }
            }
            cold.clear();
        }
        plan.moves.sort_by_key(|m| m.phase);
        plan
    }
}
