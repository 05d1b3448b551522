//! AutoTiering OPM-BD (seed 004). Every AutoNUMA scan of a page shifts its 8-bit access history
//! (bit set if the page faulted since its previous scan); pages sit in least-accessed-page lists
//! LAP[0..=8] by the number of set bits. On a hint fault of a slow page: promote at once into the
//! free reserve (4 pages for 2 MiB); when the reserve is empty, OPM: demote the least accessed
//! fast page if it is less accessed than the faulting page (file-backed pages first, the kernel's
//! inactive list), then promote. kdemoted refills the reserve in the background, least accessed
//! first, when it drops under its size. Single socket: CPM's "promote to remote DRAM" has no
//! remote DRAM to use.

use super::{book_pos, each_unit, peer_common, VmBook};
use vtism_engine::{
    EngineError, IngestStats, MoveKind, Nanos, Observation, Phase, Plan, PlanContext, Policy,
    VmSpec,
};
use vtism_proto::PageType;

struct VmAt {
    hist: Vec<u8>,
    faulted: Vec<bool>,
    requests: Vec<usize>,
}

pub struct AutoTiering {
    fpu: u64,
    books: Vec<VmBook>,
    st: Vec<VmAt>,
    /// Free fast pages kept for immediate promotion (16 for 4 KiB pages, 4 for 2 MiB).
    pub reserve: usize,
}

impl AutoTiering {
    pub fn new(fpu: u64) -> Self {
        AutoTiering {
            fpu,
            books: Vec::new(),
            st: Vec::new(),
            reserve: if fpu >= 512 { 4 } else { 16 },
        }
    }
    fn add(&mut self, spec: &VmSpec) {
        let n = (spec.ram.frames() / self.fpu) as usize;
        self.st.push(VmAt {
            hist: vec![0; n],
            faulted: vec![false; n],
            requests: Vec::new(),
        });
    }
    fn remove(&mut self, p: usize) {
        self.st.remove(p);
    }
}

/// LAP level, file-backed pages below anonymous ones at the same level.
fn lap_key(hist: u8, t: PageType) -> (u32, bool) {
    (hist.count_ones(), t != PageType::File)
}

/// AutoTiering promotes and demotes what faults; the kernel moves whole folios under it.
impl crate::host_folios::HostPagesAware for AutoTiering {}

impl Policy for AutoTiering {
    fn name(&self) -> &str {
        "autotiering"
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
        let st = each_unit(b, acc, |b, u, a| {
            b.ptype[u] = a.page_type;
            if a.reads + a.writes == 0 {
                // A scan window closes for this page: shift in whether it was accessed.
                s.hist[u] = (s.hist[u] << 1) | s.faulted[u] as u8;
                s.faulted[u] = false;
            } else {
                s.faulted[u] = true;
                if !b.fast[u] {
                    s.requests.push(u);
                }
            }
        });
        Ok(st)
    }

    fn plan(&mut self, _ctx: &PlanContext<'_>, _now: Nanos) -> Plan {
        let mut plan = Plan::default();
        for (b, s) in self.books.iter_mut().zip(self.st.iter_mut()) {
            let reqs = std::mem::take(&mut s.requests);
            if reqs.is_empty() && b.free_units() >= self.reserve.min(b.quota_units) {
                continue;
            }
            // LAP order of fast pages, least accessed first (built once per pass).
            let mut victims: Vec<usize> = (0..b.units).filter(|&u| b.fast[u]).collect();
            victims.sort_by_key(|&u| (lap_key(s.hist[u], b.ptype[u]), u));
            let mut vi = 0;
            for u in reqs {
                if b.fast[u] {
                    continue;
                }
                // The faulting page's level counts this fault.
                let level = (s.hist[u].count_ones() + 1).min(8);
                if b.free_units() > 0 {
                    plan.moves.push(b.mv(u, MoveKind::Promote, Phase::Promote));
                    continue;
                }
                while vi < victims.len() && !b.fast[victims[vi]] {
                    vi += 1;
                }
                let Some(&v) = victims.get(vi) else { continue };
                let (vl, _) = lap_key(s.hist[v], b.ptype[v]);
                if vl < level {
                    vi += 1;
                    plan.moves.push(b.mv(v, MoveKind::Demote, Phase::Demote));
                    plan.moves
                        .push(b.mv(u, MoveKind::Promote, Phase::PromoteAfterDemote));
                }
            }
            // kdemoted: refill the reserve in a batch.
            let target = self.reserve.min(b.quota_units);
            while b.free_units() < target {
                while vi < victims.len() && !b.fast[victims[vi]] {
                    vi += 1;
                }
                let Some(&v) = victims.get(vi) else { break };
                vi += 1;
                plan.moves.push(b.mv(v, MoveKind::Refill, Phase::Demote));
            }
        }
        plan.moves.sort_by_key(|m| m.phase);
        plan
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policies::testutil::*;

    #[test]
    fn reserve_serves_promotions_then_opm_exchanges_only_less_accessed_pages() {
        let mut a = AutoTiering::new(512);
        a.reserve = 1;
        setup(&mut a, 6, 3, 2); // units 0, 1 fast; one free unit = the reserve
                                // Scan windows: unit 1 accessed in every one, unit 0 in none; unit 4 and 5 faulting now.
        for _ in 0..4 {
            feed(&mut a, &[acc(1, 1, 0)], 0.0);
            feed(&mut a, &[acc(0, 0, 0), acc(1, 0, 0)], 0.0);
        }
        assert_eq!(a.st[0].hist[1].count_ones(), 4);
        feed(&mut a, &[acc(4, 1, 0), acc(5, 1, 0)], 1.0);
        let (p, d) = moved(&plan(&mut a, 1.0));
        // 4 takes the reserve at once; 5 (level 1) displaces unit 0 (level 0), never unit 1;
        // kdemoted then refills the reserve, least accessed first.
        assert_eq!(p, vec![4, 5]);
        assert!(d.contains(&0) && d.len() == 2, "{d:?}");
    }
}
