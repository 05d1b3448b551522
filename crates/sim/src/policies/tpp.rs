//! Linux NUMA balancing: tiering mode (`numa_balancing=2`, with TPP's demotion watermark) and the
//! classic locality mode (AutoNUMA).
//!
//! Tiering mode, as upstream (kernel/sched/fair.c, mm/memory.c): a hint fault on a slow-tier page
//! promotes it unconditionally while the fast node has free space above its high watermark;
//! otherwise only if the fault latency (fault time - scan time) is under the hot threshold
//! (1000 ms), which `numa_promotion_adjust_threshold` moves by 1/8 of the default per period (up to
//! 2x) so that candidates track `numa_balancing_promote_rate_limit_MBps` (65536). Promotion
//! allocates without reclaim, so it needs free fast memory; kswapd demotes the least recently used
//! fast pages when free memory falls under TPP's demotion watermark (2% of the node) until it is
//! back above twice that. Recency is what the kernel's LRU sees; here the time of each page's last
//! hint fault (every page is scanned once per scan cycle).
//!
//! Locality mode: promote on fault only into free fast memory; never demote.

use super::{book_pos, each_unit, peer_common, VmBook};
use vtism_engine::{
    EngineError, FrameAccess, IngestStats, MoveKind, Nanos, Observation, Phase, Plan, PlanContext,
    Policy, VmSpec,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TppMode {
    Tiering,
    Locality,
}

struct VmTpp {
    unmapped: Vec<f64>,
    last_ref: Vec<f64>,
    /// Units that faulted on the slow tier since the last plan, with their fault latency (s).
    faults: Vec<(f64, usize)>,
}

pub struct Tpp {
    mode: TppMode,
    fpu: u64,
    books: Vec<VmBook>,
    st: Vec<VmTpp>,
    /// Hot threshold, seconds (default 1 s), and its adjustment state.
    threshold: f64,
    pub rate_limit_bytes_s: f64,
    window_start: f64,
    window_cand_bytes: f64,
    /// TPP's demotion watermark, fraction of the fast node.
    pub demote_wmark: f64,
}

impl Tpp {
    pub fn new(mode: TppMode, fpu: u64) -> Tpp {
        Tpp {
            mode,
            fpu,
            books: Vec::new(),
            st: Vec::new(),
            threshold: 1.0,
            rate_limit_bytes_s: 65536.0 * (1u64 << 20) as f64,
            window_start: 0.0,
            window_cand_bytes: 0.0,
            demote_wmark: 0.02,
        }
    }
    fn add(&mut self, spec: &VmSpec) {
        let units = (spec.ram.frames() / self.fpu) as usize;
        self.st.push(VmTpp {
            unmapped: vec![f64::NAN; units],
            last_ref: vec![f64::NEG_INFINITY; units],
            faults: Vec::new(),
        });
    }
    fn remove(&mut self, p: usize) {
        self.st.remove(p);
    }
    pub fn threshold_s(&self) -> f64 {
        self.threshold
    }
}

/// NUMA balancing on a PMD-mapped THP faults and migrates the whole folio (the simulator's
/// moves do that); it never splits one to place its pages apart.
impl crate::host_folios::HostPagesAware for Tpp {}

impl Policy for Tpp {
    fn name(&self) -> &str {
        match self.mode {
            TppMode::Tiering => "tpp",
            TppMode::Locality => "autonuma",
        }
    }
    peer_common!();

    fn observe(
        &mut self,
        vm: vtism_engine::VmId,
        obs: Observation<'_>,
        now: Nanos,
    ) -> Result<IngestStats, EngineError> {
        let p = book_pos(&self.books, vm)?;
        let t = now.as_secs_f64();
        let Observation::Accesses(acc) = obs else {
            return Ok(IngestStats::default());
        };
        let b = &mut self.books[p];
        let s = &mut self.st[p];
        let st = each_unit(b, acc, |b, u, a| {
            let FrameAccess {
                reads,
                writes,
                page_type,
                ..
            } = *a;
            b.ptype[u] = page_type;
            if reads + writes == 0 {
                s.unmapped[u] = t; // scanner armed it
                return;
            }
            s.last_ref[u] = t;
            let lat = if s.unmapped[u].is_nan() {
                f64::INFINITY
            } else {
                t - s.unmapped[u]
            };
            s.unmapped[u] = f64::NAN;
            if !b.fast[u] {
                s.faults.push((lat, u));
            }
        });
        Ok(st)
    }

    fn plan(&mut self, _ctx: &PlanContext<'_>, now: Nanos) -> Plan {
        let t = now.as_secs_f64();
        let unit_bytes = (self.fpu * vtism_proto::FRAME_SIZE) as f64;
        let mut plan = Plan::default();
        for (b, s) in self.books.iter_mut().zip(self.st.iter_mut()) {
            let high = ((b.quota_units as f64 * self.demote_wmark).ceil() as usize).max(1);
            let mut faults = std::mem::take(&mut s.faults);
            faults.sort_by(|x, y| x.0.total_cmp(&y.0).then(x.1.cmp(&y.1)));
            for (lat, u) in faults {
                if b.fast[u] || b.free_units() == 0 {
                    continue;
                }
                let promote = match self.mode {
                    TppMode::Locality => true,
                    TppMode::Tiering => {
                        if b.free_units() > high {
                            true // free space above the high watermark: no threshold
                        } else if lat < self.threshold {
                            self.window_cand_bytes += unit_bytes;
                            true
                        } else {
                            false
                        }
                    }
                };
                if promote {
                    plan.moves.push(b.mv(u, MoveKind::Promote, Phase::Promote));
                }
            }
            if self.mode == TppMode::Tiering && b.free_units() < high {
                // kswapd: demote the least recently referenced fast units up to 2x the watermark.
                let want = (2 * high).min(b.quota_units) - b.free_units();
                let mut fast: Vec<usize> = (0..b.units).filter(|&u| b.fast[u]).collect();
                fast.sort_by(|&x, &y| s.last_ref[x].total_cmp(&s.last_ref[y]).then(x.cmp(&y)));
                for &u in fast.iter().take(want) {
                    plan.moves.push(b.mv(u, MoveKind::Refill, Phase::Demote));
                }
            }
        }
        // numa_promotion_adjust_threshold: once per threshold period.
        if self.mode == TppMode::Tiering && t - self.window_start >= 1.0 {
            let period = t - self.window_start;
            let reference = self.rate_limit_bytes_s * period;
            let unit_th = 1.0 * 2.0 / 16.0;
            if self.window_cand_bytes > reference * 1.1 {
                self.threshold = (self.threshold - unit_th).max(unit_th);
            } else if self.window_cand_bytes < reference * 0.9 {
                self.threshold = (self.threshold + unit_th).min(2.0);
            }
            self.window_start = t;
            self.window_cand_bytes = 0.0;
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
    fn promotes_under_the_hot_threshold_and_reclaims_to_the_watermark() {
        let mut t = Tpp::new(TppMode::Tiering, 512);
        setup(&mut t, 200, 100, 100); // fast full
                                      // Units 150 and 151 armed at t=0; 150 faults after 0.3 s, 151 after 1.5 s.
        feed(&mut t, &[acc(150, 0, 0), acc(151, 0, 0)], 0.0);
        feed(&mut t, &[acc(150, 1, 0)], 0.3);
        feed(&mut t, &[acc(151, 1, 0)], 1.5);
        let (p, d) = moved(&plan(&mut t, 1.5));
        // No free fast memory: nothing can be promoted yet; kswapd frees 2x the 2% watermark.
        assert!(p.is_empty());
        assert_eq!(d.len(), 4);
        // Four free units now, two of them above the high watermark (2% of 100 = 2 units).
        feed(
            &mut t,
            &[
                acc(150, 0, 0),
                acc(151, 0, 0),
                acc(152, 0, 0),
                acc(153, 0, 0),
            ],
            2.0,
        );
        feed(&mut t, &[acc(152, 1, 0)], 2.2);
        feed(&mut t, &[acc(153, 1, 0)], 2.25);
        feed(&mut t, &[acc(150, 1, 0)], 2.3);
        feed(&mut t, &[acc(151, 1, 0)], 3.5);
        // The threshold grew by 1/8 s per second (candidates far under the rate limit).
        assert!(t.threshold_s() > 1.0 && t.threshold_s() < 1.5);
        let (p, d) = moved(&plan(&mut t, 3.5));
        // Lowest latency first: 152 and 153 while free memory is above the high watermark, then
        // 150 under the threshold; 151 (1.5 s) is not hot enough. kswapd refills afterwards.
        assert_eq!(p, vec![152, 153, 150]);
        assert_eq!(d.len(), 3);
    }

    #[test]
    fn autonuma_only_fills_free_memory() {
        let mut t = Tpp::new(TppMode::Locality, 512);
        setup(&mut t, 10, 5, 4);
        feed(&mut t, &[acc(7, 0, 0), acc(8, 0, 0)], 0.0);
        feed(&mut t, &[acc(7, 1, 0), acc(8, 1, 0)], 5.0);
        let (p, d) = moved(&plan(&mut t, 5.0));
        assert_eq!((p.len(), d.len()), (1, 0));
    }
}
