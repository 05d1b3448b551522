//! Memtis' page size determination (SOSP'23, section 4.3; the public code,
//! github.com/cosmoss-jigu/memtis, linux/mm/htmm_core.c and htmm_migrater.c): which huge pages
//! to split, and how many, from what the PEBS samples say.
//!
//! - A sample to a subpage adds 512 to its count, a sample to a huge page 1 to the page's:
//!   a huge page ranks by the mean of its subpages (`Memtis::pages`).
//! - Memtis estimates the hit ratio the fast tier would have with every page a base page
//!   (eHR: samples to subpages whose count is above the base-page hot threshold) against the
//!   real one (rHR: samples served by the fast tier), both halved at each cooling.
//! - At a cooling, once more samples came since the last decision than a quarter of the VM's
//!   pages (and than the fast tier's pages), it sets how many base pages to split:
//!   `(eHR - rHR) x sum_util / nr_records / avg_accesses_hp x (slow - fast) / fast x 512 x gamma`
//!   (`set_memcg_nr_split`), and splits the most skewed huge pages first: skewness is
//!   `sum(subpage count^2) / 11 / hot_subpages^2` on a log scale (`get_skew_idx`); a huge page
//!   with no hot subpage, or hot as a whole (bin 13 or more), has none.
//! - kmigrated splits at most 50 huge pages (100 MB) a pass (`deferred_split_scan_for_htmm`).
//! - If a split round did not raise rHR by 3%, splitting stops for good (`htmm_thres_split = 0`).
//!
//! The simulator computes each huge page's skewness at the cooling from its counts before they
//! are halved (Memtis computes it when the page is next sampled after the cooling, from the same
//! counts) and splits at kmigrated's passes rather than at the page's next sample.

/// Memtis' parameters (linux/mm/mempolicy.c sysfs defaults, htmm_core.c).
#[derive(Clone, Debug)]
pub struct SplitParams {
    /// `htmm_gamma`: 4, i.e. 0.4.
    pub gamma_tenths: u64,
    /// `htmm_split_period`: the samples between decisions exceed the VM's pages >> 2.
    pub period_shift: u32,
    /// Huge pages split per kmigrated pass (`nr_max` = 50, "max: 100MB").
    pub per_pass: usize,
    /// Samples between coolings (`htmm_cooling_period`, 2,000,000).
    pub cooling_period: u64,
    /// Idle latencies of the fast and the slow tier, ns. Memtis' code has its testbed's
    /// (`DRAM_ACCESS_LATENCY` 80, `CXL_ACCESS_LATENCY` 170, `NVM_ACCESS_LATENCY` 270); the
    /// simulator gives it the memory model's.
    pub fast_ns: u64,
    pub slow_ns: u64,
}

/// Subpages per huge page.
const HPAGE_NR: u64 = 512;
/// A huge page this hot as a whole is not split (`meta_page->idx >= 13`).
const VERY_HOT_BIN: usize = 13;

/// Memtis' `get_skew_idx`: 0, 1-3, 4-15, ... by powers of two below 1024, then 11 + one step
/// per 1024 up to 20.
pub fn skew_idx(num: u64) -> usize {
    if num >= 1024 {
        let mut tmp = num;
        let mut cnt = 0;
        while tmp > 1024 && cnt < 9 {
            tmp -= 1024;
            cnt += 1;
        }
        cnt + 11
    } else {
        (64 - num.leading_zeros()) as usize
    }
}

/// One VM's split state (the memcg's fields in Memtis).
#[derive(Clone, Debug)]
pub struct HugeSplits {
    /// Samples served by the fast tier, and those to subpages above the base-page threshold,
    /// since the last cooling, and their halved sums (`prev_dram_sampled`, `prev_max_...`).
    dram: u64,
    max_dram: u64,
    prev_dram: u64,
    prev_max_dram: u64,
    samples_for_split: u64,
    cooling_clock: u32,
    split_happen: bool,
    /// Each huge page's skewness index at the last cooling (0 for base pages).
    skew: Vec<u8>,
    /// Base pages still to split.
    pub nr_split: u64,
    /// Huge pages split so far.
    pub splits: u64,
}

/// A huge page's subpage counts (in base-page units: 512 per sample) as the cooling sees them.
pub struct HugeCounts<'a> {
    pub block: usize,
    pub subpage: &'a [u64],
    /// The huge page's own bin.
    pub bin: usize,
}

impl HugeSplits {
    pub fn new(blocks: usize) -> HugeSplits {
        HugeSplits {
            dram: 0,
            max_dram: 0,
            prev_dram: 0,
            prev_max_dram: 0,
            samples_for_split: 0,
            cooling_clock: 0,
            split_happen: false,
            skew: vec![0; blocks],
            nr_split: 0,
            splits: 0,
        }
    }

    /// `n` samples to a page on the fast tier or not, whose subpage was above the base-page hot
    /// threshold (`may_hot`) or not.
    pub fn sample(&mut self, n: u64, on_fast: bool, may_hot: bool) {
        self.samples_for_split += n;
        if on_fast {
            self.dram += n;
        }
        if may_hot {
            self.max_dram += n;
        }
    }

    /// A cooling: skewness of every huge page from its counts before halving, the hit ratios
    /// halved, and, when enough samples came, a new number of base pages to split. `hot_bin`:
    /// the subpage hot threshold (`min(active, bp_active)`); `bin` maps a count to its bin.
    /// `pages` and `fast_pages`: the VM's pages and the fast tier's, in 4 KiB pages. Returns
    /// false when splitting should stop for good (a split round that did not help).
    pub fn cool<'a>(
        &mut self,
        huge: impl Iterator<Item = HugeCounts<'a>>,
        hot_bin: usize,
        bin: impl Fn(u64) -> usize,
        pages: u64,
        fast_pages: u64,
        p: &SplitParams,
    ) -> bool {
        let (mut sum_util, mut num_util) = (0u64, 0u64);
        self.skew.iter_mut().for_each(|s| *s = 0);
        for h in huge {
            let mut hot = 0u64;
            let mut refs = 0u64;
            let mut squares = 0u64;
            for &c in h.subpage {
                if bin(c) >= hot_bin {
                    hot += 1;
                    refs += c;
                }
                squares = squares.saturating_add(c.saturating_mul(c));
            }
            let skew = if hot == 0 || h.bin >= VERY_HOT_BIN {
                0
            } else {
                skew_idx(squares / 11 / hot / hot)
            };
            self.skew[h.block] = skew as u8;
            if hot > 0 {
                sum_util += refs / HPAGE_NR;
                num_util += 1;
            }
        }
        let last_rhr = self.prev_dram;
        self.prev_dram = self.prev_dram / 2 + self.dram;
        self.prev_max_dram = self.prev_max_dram / 2 + self.max_dram;
        self.dram = 0;
        self.max_dram = 0;
        self.cooling_clock += 1;
        let due = (pages >> p.period_shift).max(fast_pages);
        if self.samples_for_split <= due {
            return true;
        }
        if self.split_happen && self.prev_dram < last_rhr * 103 / 100 {
            return false;
        }
        self.split_happen = false;
        self.samples_for_split = 0;
        self.nr_split = self.nr_split_now(sum_util, num_util, p);
        true
    }

    /// `set_memcg_nr_split`, in Memtis' integer arithmetic and order.
    fn nr_split_now(&self, sum_util: u64, num_util: u64, p: &SplitParams) -> u64 {
        let ehr = self.prev_max_dram * 95 / 100;
        let rhr = self.prev_dram;
        if ehr <= rhr || num_util == 0 {
            return 0;
        }
        let avg = sum_util / num_util;
        if avg == 0 {
            return 0;
        }
        let shift = self.cooling_clock.saturating_sub(1).min(63);
        let records = (p.cooling_period << 1) - (p.cooling_period >> shift);
        let mut n = (ehr - rhr) * sum_util / records.max(1);
        n /= avg;
        n *= p.slow_ns.saturating_sub(p.fast_ns);
        n /= p.fast_ns.max(1);
        n *= HPAGE_NR;
        n * p.gamma_tenths / 10
    }

    /// The huge pages to split in this kmigrated pass: the most skewed first, at most
    /// `per_pass`, while base pages remain to split (a split is allowed while any remain).
    pub fn due(&mut self, is_huge: impl Fn(usize) -> bool, p: &SplitParams) -> Vec<usize> {
        if self.nr_split == 0 {
            return Vec::new();
        }
        let mut cand: Vec<usize> = (0..self.skew.len())
            .filter(|&b| self.skew[b] > 0 && is_huge(b))
            .collect();
        cand.sort_by(|&a, &b| self.skew[b].cmp(&self.skew[a]).then(a.cmp(&b)));
        let mut out = Vec::new();
        for b in cand {
            if out.len() == p.per_pass || self.nr_split == 0 {
                break;
            }
            self.nr_split = self.nr_split.saturating_sub(HPAGE_NR);
            self.skew[b] = 0;
            out.push(b);
        }
        if !out.is_empty() {
            self.split_happen = true;
            self.splits += out.len() as u64;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params() -> SplitParams {
        SplitParams {
            gamma_tenths: 4,
            period_shift: 2,
            per_pass: 50,
            cooling_period: 2_000_000,
            fast_ns: 80,
            slow_ns: 288,
        }
    }

    #[test]
    fn skew_index_follows_memtis_scale() {
        let got: Vec<usize> = [0, 1, 3, 4, 15, 16, 1023, 1024, 2049, 100_000]
            .map(skew_idx)
            .to_vec();
        assert_eq!(got, vec![0, 1, 2, 3, 4, 5, 10, 11, 13, 20]);
    }

    /// One huge page with 4 hot subpages among 508 cold ones, one with all 512 alike: when the
    /// estimated hit ratio beats the real one, the skewed page is split and the uniform one not.
    #[test]
    fn the_skewed_huge_page_is_split_first() {
        let p = params();
        let mut s = HugeSplits::new(2);
        let skewed: Vec<u64> = (0..512).map(|i| if i < 4 { 512 * 40 } else { 0 }).collect();
        let uniform = vec![512 * 2; 512];
        let bin = |c: u64| (64 - c.leading_zeros()) as usize;
        // Samples: 8M, of which 7/8 would hit fast with base pages, 1/4 do.
        s.sample(2_000_000, true, true);
        s.sample(5_000_000, false, true);
        s.sample(1_000_000, false, false);
        let huge = [
            HugeCounts {
                block: 0,
                subpage: &skewed,
                bin: 8,
            },
            HugeCounts {
                block: 1,
                subpage: &uniform,
                bin: 10,
            },
        ];
        assert!(s.cool(huge.into_iter(), 12, bin, 4096, 1024, &p));
        assert!(s.nr_split > 0, "eHR above rHR asks for splits");
        assert_eq!(s.due(|_| true, &p), vec![0]);
        assert_eq!(s.splits, 1);
        // Nothing left that is skewed.
        assert!(s.due(|_| true, &p).is_empty());
    }

    #[test]
    fn no_split_while_the_real_hit_ratio_is_as_good() {
        let p = params();
        let mut s = HugeSplits::new(1);
        s.sample(1_000_000, true, true);
        let skewed: Vec<u64> = (0..512)
            .map(|i| if i == 0 { 512 * 40 } else { 0 })
            .collect();
        let huge = [HugeCounts {
            block: 0,
            subpage: &skewed,
            bin: 5,
        }];
        let bin = |c: u64| (64 - c.leading_zeros()) as usize;
        assert!(s.cool(huge.into_iter(), 12, bin, 4096, 1024, &p));
        assert_eq!(s.nr_split, 0);
        assert!(s.due(|_| true, &p).is_empty());
    }
}
