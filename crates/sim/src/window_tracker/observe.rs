//! What the module's windows see, per placement unit: accesses are Poisson at the unit's rate in
//! the epoch, spread evenly over its 4 KiB frames, so a region's PMD Accessed bit (or a frame's
//! PTE bit) is set after a window with probability `1 - exp(-accesses in it)`.

use crate::workload::Profile;

/// Expected accesses since the start of the run, per unit and per region, at any time of the
/// epoch being observed (piecewise linear: each epoch has its own rates).
pub struct Accesses {
    units_per_region: usize,
    unit0: Vec<f64>,
    unit_rate: Vec<f64>,
    region0: Vec<f64>,
    region_rate: Vec<f64>,
    t0_ns: u64,
}

impl Accesses {
    pub fn new(units: usize, units_per_region: usize) -> Accesses {
        let regions = units.div_ceil(units_per_region);
        Accesses {
            units_per_region,
            unit0: vec![0.0; units],
            unit_rate: vec![0.0; units],
            region0: vec![0.0; regions],
            region_rate: vec![0.0; regions],
            t0_ns: 0,
        }
    }

    /// The epoch from `t0_ns` to `t1_ns` in which the VM made `accesses` spread as `profile`.
    pub fn begin(&mut self, profile: &Profile, accesses: f64, t0_ns: u64, t1_ns: u64) {
        let per_s = accesses / ((t1_ns - t0_ns) as f64 * 1e-9).max(1e-9);
        self.t0_ns = t0_ns;
        self.region_rate.iter_mut().for_each(|x| *x = 0.0);
        for (u, r) in self.unit_rate.iter_mut().enumerate() {
            *r = profile.share(u) * per_s;
            self.region_rate[u / self.units_per_region] += *r;
        }
    }

    /// The epoch is over at `t1_ns`: its accesses become the base of the next.
    pub fn end(&mut self, t1_ns: u64) {
        let dt = (t1_ns - self.t0_ns) as f64 * 1e-9;
        for (a, r) in self.unit0.iter_mut().zip(&self.unit_rate) {
            *a += r * dt;
        }
        for (a, r) in self.region0.iter_mut().zip(&self.region_rate) {
            *a += r * dt;
        }
    }

    fn since_t0(&self, t_ns: u64) -> f64 {
        t_ns.saturating_sub(self.t0_ns) as f64 * 1e-9
    }
    pub fn unit(&self, u: usize, t_ns: u64) -> f64 {
        self.unit0[u] + self.unit_rate[u] * self.since_t0(t_ns)
    }
    pub fn region(&self, r: usize, t_ns: u64) -> f64 {
        self.region0[r] + self.region_rate[r] * self.since_t0(t_ns)
    }
}

/// Probability that a Poisson process with `n` expected events in a window had one.
pub fn p_young(n: f64) -> f64 {
    1.0 - (-n.max(0.0)).exp()
}
