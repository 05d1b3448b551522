//! HeMem (SOSP'21). PEBS samples (period 19,997) counted per 2 MiB page, reads and writes apart.
//! A page is hot when its read count or its write count reaches 4; when any count passes 10 every
//! count is halved (cooling). The policy thread runs every 10 ms: each hot page on the slow tier
//! goes to free fast memory, or swaps with a cold fast page; when there is no cold fast page left
//! it stops. The simulator runs the policy once per epoch over that epoch's samples (the epoch is
//! its time resolution).

use super::{book_pos, each_unit, peer_common, VmBook};
use vtism_engine::{
    EngineError, IngestStats, MoveKind, Nanos, Observation, Phase, Plan, PlanContext, Policy,
    VmSpec,
};

struct VmHemem {
    reads: Vec<u32>,
    writes: Vec<u32>,
}

pub struct HeMem {
    fpu: u64,
    books: Vec<VmBook>,
    st: Vec<VmHemem>,
    pub hot_reads: u32,
    pub hot_writes: u32,
    pub cooling: u32,
}

impl HeMem {
    pub fn new(fpu: u64) -> Self {
        HeMem {
            fpu,
            books: Vec::new(),
            st: Vec::new(),
            hot_reads: 4,
            hot_writes: 4,
            cooling: 10,
        }
    }
    fn add(&mut self, spec: &VmSpec) {
        let n = (spec.ram.frames() / self.fpu) as usize;
        self.st.push(VmHemem {
            reads: vec![0; n],
            writes: vec![0; n],
        });
    }
    fn remove(&mut self, p: usize) {
        self.st.remove(p);
    }
    fn hot(&self, s: &VmHemem, u: usize) -> bool {
        s.reads[u] >= self.hot_reads || s.writes[u] >= self.hot_writes
    }
}

/// HeMem places the pages it sees; with host THP the kernel moves whole folios under it.
impl crate::host_folios::HostPagesAware for HeMem {}

impl Policy for HeMem {
    fn name(&self) -> &str {
        "hemem"
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
        let (b, s) = (&mut self.books[p], &mut self.st[p]);
        let mut cool = false;
        let st = each_unit(b, acc, |_, u, a| {
            s.reads[u] = s.reads[u].saturating_add(a.reads);
            s.writes[u] = s.writes[u].saturating_add(a.writes);
            cool |= s.reads[u] > self.cooling || s.writes[u] > self.cooling;
        });
        if cool {
            s.reads.iter_mut().for_each(|c| *c /= 2);
            s.writes.iter_mut().for_each(|c| *c /= 2);
        }
        Ok(st)
    }

    fn plan(&mut self, _ctx: &PlanContext<'_>, _now: Nanos) -> Plan {
        let mut plan = Plan::default();
        for p in 0..self.books.len() {
            let s = &self.st[p];
            let b = &self.books[p];
            let hot: Vec<usize> = (0..b.units)
                .filter(|&u| !b.fast[u] && self.hot(s, u))
                .collect();
            if hot.is_empty() {
                continue;
            }
            let cold: Vec<usize> = (0..b.units)
                .filter(|&u| b.fast[u] && !self.hot(s, u))
                .collect();
            let b = &mut self.books[p];
            let mut ci = 0;
            for u in hot {
                if b.free_units() > 0 {
                    plan.moves.push(b.mv(u, MoveKind::Promote, Phase::Promote));
                } else if ci < cold.len() {
                    plan.moves
                        .push(b.mv(cold[ci], MoveKind::Demote, Phase::Demote));
                    ci += 1;
                    plan.moves
                        .push(b.mv(u, MoveKind::Promote, Phase::PromoteAfterDemote));
                } else {
                    break;
                }
            }
        }
        plan.moves.sort_by_key(|m| m.phase);
        plan
    }
}
