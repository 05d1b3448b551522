//! Memtis (SOSP'23). PEBS samples (loads at period 199, stores at 100,003, adapted by the sampler
//! to stay under 3% of a CPU) are counted per page. Pages sit in a 16-bin log2 histogram of
//! their counts. The hot threshold is the lowest bin whose cumulative size (hottest bins first)
//! fits the fast tier less a 3% watermark; the bin below it is warm and fills spare room. The
//! threshold is re-adapted every 100,000 samples; cooling halves every count every 2,000,000
//! samples. kmigrated runs every 500 ms: it demotes cold pages (below the warm bin, coldest first)
//! while free fast memory is under the watermark or room is needed, and promotes hot pages (then
//! warm ones into spare room) from the slow tier.
//!
//! Pages are the simulator's units, or with host huge pages (`--host-pages thp`) Memtis' own mix: a
//! huge page counts the samples of all its subpages and ranks by their mean (a subpage's sample
//! adds 512, a huge page's 1), is placed whole, and is split by Memtis' page size determination
//! (`memtis_split`) when its subpages are skewed. At 2 MiB units a unit is a huge page and there
//! are no subpage counts: nothing is split.

use super::memtis_split::{HugeCounts, HugeSplits, SplitParams};
use super::{book_pos, each_unit, peer_common, VmBook};
use crate::host_folios::HostPagesAware;
use vtism_engine::{
    EngineError, IngestStats, MoveKind, Nanos, Observation, Phase, Plan, PlanContext, Policy, VmId,
    VmSpec,
};
use vtism_proto::{Gfn, HUGE_FRAMES};

const BINS: usize = 16;

/// The host's huge pages of a VM as Memtis sees them (it runs in the kernel that maps them).
struct HugeView {
    /// Units per huge page.
    upb: usize,
    huge: Vec<bool>,
    splits: HugeSplits,
    /// The base-page hot threshold (`bp_active_threshold`): the bin above which every unit,
    /// counted as base pages, fits the fast tier.
    bp_bin: usize,
}

struct VmMemtis {
    count: Vec<u32>,
    hot_bin: usize,
    since_adapt: u64,
    since_cool: u64,
    huge: Option<HugeView>,
}

/// One page as kmigrated sees it: its units and its count on Memtis' scale.
#[derive(Clone, Copy)]
struct Page {
    unit: usize,
    units: usize,
    count: u64,
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
    split: SplitParams,
    /// `htmm_thres_split`: cleared for good when a split round did not help (all VMs).
    split_enabled: bool,
    /// Splits decided, for the simulator to carry out.
    to_split: Vec<(VmId, Gfn)>,
}

fn bin(c: u32) -> usize {
    if c == 0 {
        0
    } else {
        ((32 - c.leading_zeros()) as usize).min(BINS - 1)
    }
}

/// The bin of a page's count (a huge page's sum may pass `u32::MAX`; the top bin starts far
/// below it).
fn page_bin(c: u64) -> usize {
    bin(c.min(u64::from(u32::MAX)) as u32)
}

impl Memtis {
    /// `fast_ns`, `slow_ns`: the tiers' idle latencies, for the split decision.
    pub fn new(fpu: u64, fast_ns: f64, slow_ns: f64) -> Self {
        Memtis {
            fpu,
            books: Vec::new(),
            st: Vec::new(),
            adapt_samples: 100_000,
            cool_samples: 2_000_000,
            watermark: 0.03,
            period_s: 0.5,
            next_run: 0.0,
            split: SplitParams {
                gamma_tenths: 4,
                period_shift: 2,
                per_pass: 50,
                cooling_period: 2_000_000,
                fast_ns: fast_ns.round() as u64,
                slow_ns: slow_ns.round() as u64,
            },
            split_enabled: true,
            to_split: Vec::new(),
        }
    }
    fn add(&mut self, spec: &VmSpec) {
        let n = (spec.ram.frames() / self.fpu) as usize;
        self.st.push(VmMemtis {
            count: vec![0; n],
            hot_bin: BINS,
            since_adapt: 0,
            since_cool: 0,
            huge: None,
        });
    }
    fn remove(&mut self, p: usize) {
        self.st.remove(p);
    }
}

impl VmMemtis {
    /// A unit's count as a base page: Memtis adds 512 per sample to a subpage, 1 to a huge page.
    fn base_count(&self, u: usize) -> u64 {
        let upb = self.huge.as_ref().map_or(1, |h| h.upb) as u64;
        u64::from(self.count[u]) * upb
    }

    /// The VM's pages in address order: its units, or with host huge pages each huge block as
    /// one page counting all its units' samples.
    fn pages(&self, units: usize) -> Vec<Page> {
        let Some(h) = &self.huge else {
            return (0..units)
                .map(|u| Page {
                    unit: u,
                    units: 1,
                    count: u64::from(self.count[u]),
                })
                .collect();
        };
        let mut out = Vec::with_capacity(units);
        let mut u = 0;
        while u < units {
            let b = u / h.upb;
            if h.huge.get(b).copied().unwrap_or(false) {
                let end = ((b + 1) * h.upb).min(units);
                let count = self.count[u..end].iter().map(|&c| u64::from(c)).sum();
                out.push(Page {
                    unit: u,
                    units: end - u,
                    count,
                });
                u = end;
            } else {
                out.push(Page {
                    unit: u,
                    units: 1,
                    count: self.base_count(u),
                });
                u += 1;
            }
        }
        out
    }
}

/// The lowest bin whose cumulative size, hottest bins first, fits `cap` units (`BINS` if none).
fn fitting_bin(hist: &[usize; BINS], cap: usize) -> usize {
    let mut cum = 0;
    let mut hot = BINS;
    for k in (1..BINS).rev() {
        if cum + hist[k] > cap {
            break;
        }
        cum += hist[k];
        hot = k;
    }
    hot
}

fn adapt(b: &VmBook, s: &mut VmMemtis, watermark: f64) {
    let cap = (b.quota_units as f64 * (1.0 - watermark)) as usize;
    let mut hist = [0usize; BINS];
    for p in s.pages(b.units) {
        hist[page_bin(p.count)] += p.units;
    }
    s.hot_bin = fitting_bin(&hist, cap);
    if s.huge.is_some() {
        let mut base = [0usize; BINS];
        for u in 0..b.units {
            base[page_bin(s.base_count(u))] += 1;
        }
        // `htmm_thres_hot` = 1 is the lowest threshold.
        let bp = fitting_bin(&base, cap).max(1);
        if let Some(h) = &mut s.huge {
            h.bp_bin = bp;
        }
    }
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
        let st = each_unit(b, acc, |b, u, a| {
            let n = a.reads + a.writes;
            if let Some(h) = &s.huge {
                let may_hot = page_bin(s.base_count(u)) >= h.bp_bin;
                let on_fast = b.fast[u];
                if let Some(h) = &mut s.huge {
                    h.splits.sample(u64::from(n), on_fast, may_hot);
                }
            }
            s.count[u] = s.count[u].saturating_add(n);
            s.since_adapt += n as u64;
            s.since_cool += n as u64;
            if s.since_cool >= self.cool_samples {
                s.since_cool = 0;
                if self.split_enabled {
                    self.split_enabled = decide_splits(b, s, &self.split);
                }
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
            if let Some(h) = &mut s.huge {
                for blk in h
                    .splits
                    .due(|x| h.huge.get(x).copied().unwrap_or(false), &self.split)
                {
                    h.huge[blk] = false;
                    self.to_split.push((b.id, Gfn(blk as u64 * HUGE_FRAMES)));
                }
            }
            if s.hot_bin >= BINS {
                continue;
            }
            let hot = s.hot_bin;
            let warm = hot.saturating_sub(1).max(1);
            let wmark = ((b.quota_units as f64 * self.watermark).ceil() as usize).max(1);
            let pages = s.pages(b.units);
            let mut prom: Vec<Page> = pages
                .iter()
                .copied()
                .filter(|p| !b.fast[p.unit] && page_bin(p.count) >= warm)
                .collect();
            prom.sort_by(|x, y| y.count.cmp(&x.count).then(x.unit.cmp(&y.unit)));
            let mut cold: Vec<Page> = pages
                .iter()
                .copied()
                .filter(|p| b.fast[p.unit] && page_bin(p.count) < warm)
                .collect();
            cold.sort_by(|x, y| x.count.cmp(&y.count).then(x.unit.cmp(&y.unit)));
            let cold_units: usize = cold.iter().map(|p| p.units).sum();
            let mut ci = 0;
            let mut demoted = 0;
            let mv =
                |b: &mut VmBook, p: &Page, kind, phase| b.mv_units(p.unit, p.units, kind, phase);
            // Keep the watermark free.
            while b.free_units() < wmark && ci < cold.len() {
                plan.moves
                    .push(mv(b, &cold[ci], MoveKind::Refill, Phase::Demote));
                demoted += cold[ci].units;
                ci += 1;
            }
            for p in prom {
                let is_hot = page_bin(p.count) >= hot;
                if b.free_units() >= wmark + p.units {
                    plan.moves
                        .push(mv(b, &p, MoveKind::Promote, Phase::Promote));
                } else if is_hot && cold_units - demoted >= p.units {
                    // Swap: demote the coldest pages until they free as much as it takes.
                    let mut freed = 0;
                    while freed < p.units {
                        plan.moves
                            .push(mv(b, &cold[ci], MoveKind::Demote, Phase::Demote));
                        freed += cold[ci].units;
                        demoted += cold[ci].units;
                        ci += 1;
                    }
                    plan.moves
                        .push(mv(b, &p, MoveKind::Promote, Phase::PromoteAfterDemote));
                }
            }
        }
        plan.moves.sort_by_key(|m| m.phase);
        plan
    }
}

/// At a cooling: Memtis' split decision from the counts before they are halved. False when
/// splitting should stop for good.
fn decide_splits(b: &VmBook, s: &mut VmMemtis, p: &SplitParams) -> bool {
    let Some(h) = &s.huge else {
        return true;
    };
    if h.upb < 2 {
        return true;
    }
    let hot_bin = s.hot_bin.min(h.bp_bin);
    let upb = h.upb as u64;
    let subpages: Vec<(usize, Vec<u64>, usize)> = (0..h.huge.len())
        .filter(|&blk| h.huge[blk])
        .map(|blk| {
            let r = blk * h.upb..((blk + 1) * h.upb).min(b.units);
            let sub: Vec<u64> = s.count[r].iter().map(|&c| u64::from(c) * upb).collect();
            let whole = page_bin(sub.iter().sum::<u64>() / upb);
            (blk, sub, whole)
        })
        .collect();
    let pages = b.units as u64 * b.fpu;
    let fast_pages = b.quota_units as u64 * b.fpu;
    let Some(h) = &mut s.huge else {
        return true;
    };
    h.splits.cool(
        subpages.iter().map(|(blk, sub, whole)| HugeCounts {
            block: *blk,
            subpage: sub,
            bin: *whole,
        }),
        hot_bin,
        page_bin,
        pages,
        fast_pages,
        p,
    )
}

impl HostPagesAware for Memtis {
    fn host_folios_changed(&mut self, vm: VmId, heads: &[Gfn]) {
        let Ok(p) = book_pos(&self.books, vm) else {
            return;
        };
        let (b, s) = (&self.books[p], &mut self.st[p]);
        let upb = (HUGE_FRAMES / b.fpu).max(1) as usize;
        let blocks = b.units.div_ceil(upb);
        let h = s.huge.get_or_insert_with(|| HugeView {
            upb,
            huge: vec![false; blocks],
            splits: HugeSplits::new(blocks),
            bp_bin: BINS,
        });
        h.huge.iter_mut().for_each(|x| *x = false);
        for head in heads {
            if let Some(x) = h.huge.get_mut((head.0 / HUGE_FRAMES) as usize) {
                *x = true;
            }
        }
    }

    fn take_splits(&mut self, _now: Nanos) -> Vec<(VmId, Gfn)> {
        std::mem::take(&mut self.to_split)
    }
}

#[cfg(test)]
mod tests {
    use super::bin;

    #[test]
    fn log2_bins() {
        assert_eq!([bin(0), bin(1), bin(2), bin(3), bin(4)], [0, 1, 2, 2, 3]);
        assert_eq!(bin(u32::MAX), 15);
    }
}
