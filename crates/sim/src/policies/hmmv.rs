//! HMM-V (seed 000). Per monitoring window the PML scanner reports each page's A and D bits.
//! Multi-level queue: a page at level x > 0 has a do-not-disturb time of 2^(x-1) windows during
//! which it counts as accessed and its bits are not cleared; when the DND time ends the bits are
//! cleared, and if the page is accessed in the next window it goes up a level (max 7), else down.
//! After 8 windows: page-degree = 1*reads + 3*writes, bucket sort, hot set = the top pages that fit
//! the VM's DRAM; hot NVM pages are swapped with the same number of the coldest DRAM pages.
//! Pool mode (more than one VM): a VM's hot set size is the top 80% of its pages with degree above
//! 3, and its DRAM moves toward that size between 75% and 125% of its initial DRAM, taking only
//! what the pool has free.
//!
//! Units: counts are of 4 KiB frames; "accessed" for the queue means most of the unit's frames
//! were; the degree threshold of 3 applies to the unit's mean per-frame degree.

use super::{book_pos, each_unit, peer_common, VmBook};
use crate::sim::Setup;
use vtism_engine::{
    EngineError, IngestStats, MoveKind, Nanos, Observation, Phase, Plan, PlanContext, Policy,
    VmSpec,
};

struct VmHmmv {
    level: Vec<u8>,
    dnd: Vec<u16>,
    reads: Vec<u32>,
    writes: Vec<u32>,
    last_w: Vec<u32>,
    windows: u32,
    ready: bool,
    initial_units: usize,
}

pub struct HmmV {
    fpu: u64,
    books: Vec<VmBook>,
    st: Vec<VmHmmv>,
    pub windows: u32,
    pub max_level: u8,
    pub read_weight: u32,
    pub write_weight: u32,
    pub pool: bool,
    fast_total_units: usize,
}

impl HmmV {
    pub fn new(fpu: u64, setup: &Setup<'_>) -> Self {
        let unit = fpu * vtism_proto::FRAME_SIZE;
        HmmV {
            fpu,
            books: Vec::new(),
            st: Vec::new(),
            windows: 8,
            max_level: 7,
            read_weight: 1,
            write_weight: 3,
            pool: setup.specs.len() > 1,
            fast_total_units: setup
                .specs
                .iter()
                .map(|s| (s.fast_quota_bytes / unit) as usize)
                .sum(),
        }
    }
    fn add(&mut self, spec: &VmSpec) {
        let n = (spec.ram.frames() / self.fpu) as usize;
        self.st.push(VmHmmv {
            level: vec![0; n],
            dnd: vec![0; n],
            reads: vec![0; n],
            writes: vec![0; n],
            last_w: vec![0; n],
            windows: 0,
            ready: false,
            initial_units: (spec.fast_quota_bytes / (self.fpu * vtism_proto::FRAME_SIZE)) as usize,
        });
    }
    fn remove(&mut self, p: usize) {
        self.st.remove(p);
    }
}

/// HMM-V's published design (regular pages; its THP extension manages guest huge pages) does not
/// split host folios: its moves take whole folios, as the kernel moves them.
impl crate::host_folios::HostPagesAware for HmmV {}

impl Policy for HmmV {
    fn name(&self) -> &str {
        "hmmv"
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
        let fpu = self.fpu as u32;
        let st = each_unit(b, acc, |b, u, a| {
            b.ptype[u] = a.page_type;
            if s.dnd[u] > 0 {
                // Do not disturb: counted as accessed, bits left alone.
                s.dnd[u] -= 1;
                s.reads[u] += fpu;
                s.writes[u] += s.last_w[u];
                return;
            }
            s.reads[u] += a.reads;
            s.writes[u] += a.writes;
            s.last_w[u] = a.writes;
            if a.reads * 2 >= fpu {
                s.level[u] = (s.level[u] + 1).min(self.max_level);
                s.dnd[u] = 1 << (s.level[u] - 1);
            } else {
                s.level[u] = s.level[u].saturating_sub(1);
            }
        });
        s.windows += 1;
        if s.windows >= self.windows {
            s.windows = 0;
            s.ready = true;
        }
        Ok(st)
    }

    fn plan(&mut self, _ctx: &PlanContext<'_>, _now: Nanos) -> Plan {
        let mut plan = Plan::default();
        let mut pool_used: usize = self.books.iter().map(|b| b.quota_units).sum();
        for (b, s) in self.books.iter_mut().zip(self.st.iter_mut()) {
            if !s.ready {
                continue;
            }
            s.ready = false;
            let (rw, ww) = (self.read_weight, self.write_weight);
            let degree: Vec<u64> = (0..b.units)
                .map(|u| rw as u64 * s.reads[u] as u64 + ww as u64 * s.writes[u] as u64)
                .collect();
            s.reads.iter_mut().for_each(|x| *x = 0);
            s.writes.iter_mut().for_each(|x| *x = 0);
            // Bucket sort (stable, hottest first).
            let mut order: Vec<usize> = (0..b.units).collect();
            order.sort_by(|&x, &y| degree[y].cmp(&degree[x]).then(x.cmp(&y)));
            if self.pool {
                let warm = order.iter().filter(|&&u| degree[u] > 3 * self.fpu).count();
                let hss = (warm as f64 * 0.8).round() as usize;
                let lo = (s.initial_units as f64 * 0.75) as usize;
                let hi = (s.initial_units as f64 * 1.25) as usize;
                let want = hss.clamp(lo, hi).min(b.units);
                let free_pool = self.fast_total_units.saturating_sub(pool_used);
                let new = if want > b.quota_units {
                    b.quota_units + (want - b.quota_units).min(free_pool)
                } else {
                    want
                };
                pool_used = pool_used + new - b.quota_units;
                b.quota_units = new;
            }
            let hot = b.quota_units.min(b.units);
            let mut in_hot = vec![false; b.units];
            for &u in &order[..hot] {
                in_hot[u] = true;
            }
            // Over the (possibly shrunk) size: release the coldest DRAM pages to the pool.
            let mut cold_fast: Vec<usize> = order
                .iter()
                .rev()
                .copied()
                .filter(|&u| b.fast[u] && !in_hot[u])
                .collect();
            let mut ci = 0;
            while b.fast_units > b.quota_units && ci < cold_fast.len() {
                plan.moves
                    .push(b.mv(cold_fast[ci], MoveKind::Refill, Phase::Demote));
                ci += 1;
            }
            cold_fast.drain(..ci);
            let mut ci = 0;
            let cand: Vec<usize> = order[..hot]
                .iter()
                .copied()
                .filter(|&u| !b.fast[u] && degree[u] > 0)
                .collect();
            for u in cand {
                if b.free_units() > 0 {
                    plan.moves.push(b.mv(u, MoveKind::Promote, Phase::Promote));
                } else if ci < cold_fast.len() && degree[u] > degree[cold_fast[ci]] {
                    plan.moves
                        .push(b.mv(cold_fast[ci], MoveKind::Demote, Phase::Demote));
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policies::testutil::*;

    fn hmmv() -> HmmV {
        HmmV {
            fpu: 512,
            books: Vec::new(),
            st: Vec::new(),
            windows: 8,
            max_level: 7,
            read_weight: 1,
            write_weight: 3,
            pool: false,
            fast_total_units: 2,
        }
    }

    #[test]
    fn eight_windows_then_hot_slow_units_swap_with_the_coldest_fast() {
        let mut h = hmmv();
        setup(&mut h, 4, 2, 2); // units 0, 1 fast
        for w in 0..8 {
            assert!(plan(&mut h, w as f64).is_empty());
            // Unit 3 fully accessed every window, unit 0 a little, the rest never.
            feed(
                &mut h,
                &[acc(3, 512, 0), acc(0, 10, 0), acc(1, 0, 0), acc(2, 0, 0)],
                w as f64,
            );
        }
        let (p, d) = moved(&plan(&mut h, 8.0));
        assert_eq!((p, d), (vec![3], vec![1]));
        // Unit 3 climbed the queue: levels 1, 2, 3 with DND 1, 2, 4 windows.
        assert!(h.st[0].level[3] >= 3, "level {}", h.st[0].level[3]);
        assert!(plan(&mut h, 9.0).is_empty());
    }

    #[test]
    fn dnd_windows_count_as_accessed() {
        let mut h = hmmv();
        setup(&mut h, 2, 1, 0);
        feed(&mut h, &[acc(0, 512, 0)], 0.0); // level 1, DND 1 window
        assert_eq!((h.st[0].level[0], h.st[0].dnd[0]), (1, 1));
        feed(&mut h, &[acc(0, 0, 0)], 1.0); // in DND: counted as accessed anyway
        assert_eq!(h.st[0].reads[0], 1024);
        feed(&mut h, &[acc(0, 0, 0)], 2.0); // bits cleared, not accessed: down a level
        assert_eq!(h.st[0].level[0], 0);
    }
}
