//! Memtis (SOSP'23). PEBS samples (loads at period 199, stores at 100,003, adapted by the sampler
//! to stay under 3% of a CPU) are counted per huge page. Pages sit in a 16-bin log2 histogram of
//! their counts. The hot threshold is the lowest bin whose cumulative size (hottest bins first)
//! fits the fast tier less a 3% watermark; the bin below it is warm and fills spare room. The
//! threshold is re-adapted every 100,000 samples; cooling halves every count every 2,000,000
//! samples. kmigrated runs every 500 ms: it demotes cold pages (below the warm bin, coldest first)
//! while free fast memory is under the watermark or room is needed, and promotes hot pages (then
//! warm ones into spare room) from the slow tier. Memtis also splits huge pages with skewed
//! sub-page access; the simulator spreads a unit's accesses evenly, so there is nothing to split.

use super::{book_pos, each_unit, peer_common, VmBook};
use vtism_engine::{
    EngineError, IngestStats, MoveKind, Nanos, Observation, Phase, Plan, PlanContext, Policy,
    VmSpec,
};

const BINS: usize = 16;

struct VmMemtis {
    count: Vec<u32>,
    hot_bin: usize,
    since_adapt: u64,
    since_cool: u64,
}

pub struct Memtis {
    fpu: u64,
    books: Vec<VmBook>,
    st: Vec<VmMemtis>,
    pub adapt_samples: u64,
    pub cool_samples: u64,
    pub watermark: f64,
    pub period_s: f64,
    next_run: f64,
}

fn bin(c: u32) -> usize {
    if c == 0 {
        0
    } else {
        ((32 - c.leading_zeros()) as usize).min(BINS - 1)
    }
}

impl Memtis {
    pub fn new(fpu: u64) -> Self {
        Memtis {
            fpu,
            books: Vec::new(),
            st: Vec::new(),
            adapt_samples: 100_000,
            cool_samples: 2_000_000,
            watermark: 0.03,
            period_s: 0.5,
            next_run: 0.0,
        }
    }
    fn add(&mut self, spec: &VmSpec) {
        let n = (spec.ram.frames() / self.fpu) as usize;
        self.st.push(VmMemtis {
            count: vec![0; n],
            hot_bin: BINS,
            since_adapt: 0,
            since_cool: 0,
        });
    }
    fn remove(&mut self, p: usize) {
        self.st.remove(p);
    }
}

fn adapt(b: &VmBook, s: &mut VmMemtis, watermark: f64) {
    let mut hist = [0usize; BINS];
    for &c in &s.count {
        hist[bin(c)] += 1;
    }
    let cap = (b.quota_units as f64 * (1.0 - watermark)) as usize;
    let mut cum = 0;
    let mut hot = BINS;
    for k in (1..BINS).rev() {
        if cum + hist[k] > cap {
            break;
        }
        cum += hist[k];
        hot = k;
    }
    s.hot_bin = hot;
}

impl Policy for Memtis {
    fn name(&self) -> &str {
        "memtis"
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
        let st = each_unit(b, acc, |_, u, a| {
            let n = a.reads + a.writes;
            s.count[u] = s.count[u].saturating_add(n);
            s.since_adapt += n as u64;
            s.since_cool += n as u64;
            if s.since_cool >= self.cool_samples {
                s.since_cool = 0;
                s.count.iter_mut().for_each(|c| *c /= 2);
            }
        });
        if s.since_adapt >= self.adapt_samples || s.hot_bin == BINS {
            s.since_adapt = 0;
            adapt(b, s, self.watermark);
        }
        Ok(st)
    }

    fn plan(&mut self, _ctx: &PlanContext<'_>, now: Nanos) -> Plan {
        let mut plan = Plan::default();
        let t = now.as_secs_f64();
        if t + 1e-9 < self.next_run {
            return plan;
        }
        self.next_run = t + self.period_s;
        for (b, s) in self.books.iter_mut().zip(self.st.iter_mut()) {
            if s.hot_bin >= BINS {
                continue;
            }
            let hot = s.hot_bin;
            let warm = hot.saturating_sub(1).max(1);
            let wmark = ((b.quota_units as f64 * self.watermark).ceil() as usize).max(1);
            let mut prom: Vec<usize> = (0..b.units)
                .filter(|&u| !b.fast[u] && bin(s.count[u]) >= warm)
                .collect();
            prom.sort_by(|&x, &y| s.count[y].cmp(&s.count[x]).then(x.cmp(&y)));
            let mut cold: Vec<usize> = (0..b.units)
                .filter(|&u| b.fast[u] && bin(s.count[u]) < warm)
                .collect();
            cold.sort_by(|&x, &y| s.count[x].cmp(&s.count[y]).then(x.cmp(&y)));
            let mut ci = 0;
            // Keep the watermark free.
            while b.free_units() < wmark && ci < cold.len() {
                plan.moves
                    .push(b.mv(cold[ci], MoveKind::Refill, Phase::Demote));
                ci += 1;
            }
            for u in prom {
                let is_hot = bin(s.count[u]) >= hot;
                if b.free_units() > wmark {
                    plan.moves.push(b.mv(u, MoveKind::Promote, Phase::Promote));
                } else if is_hot && ci < cold.len() {
                    plan.moves
                        .push(b.mv(cold[ci], MoveKind::Demote, Phase::Demote));
                    ci += 1;
                    plan.moves
                        .push(b.mv(u, MoveKind::Promote, Phase::PromoteAfterDemote));
                }
            }
        }
        plan.moves.sort_by_key(|m| m.phase);
        plan
    }
}

impl crate::host_folios::HostPagesAware for Memtis {}

#[cfg(test)]
mod tests {
    use super::bin;

    #[test]
    fn log2_bins() {
        assert_eq!([bin(0), bin(1), bin(2), bin(3), bin(4)], [0, 1, 2, 2, 3]);
        assert_eq!(bin(u32::MAX), 15);
    }
}
