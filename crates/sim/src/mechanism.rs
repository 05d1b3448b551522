//! Tracking mechanisms: what each policy's tracker would see of the simulated accesses, and what
//! it costs. Each VM has its own tracker; it is told every epoch's accesses and feeds the policy
//! through `Policy::observe`.
//!
//! Units: the simulator places memory in units (default 2 MiB, host THP backing). Software
//! trackers (A-bit scans, hint faults) work on the guest's 4 KiB page tables; a unit's accesses
//! are spread evenly over its 4 KiB frames, and the tracker reports per unit what its frames
//! showed ("mean field": the fraction of a unit's frames whose A bit was set is
//! `1 - exp(-accesses per frame)`). PEBS samples are counted per unit, as HeMem and Memtis count
//! per 2 MiB page.

use crate::host_folios::HostBacking;
use crate::model::MemoryModel;
use crate::workload::{Profile, VmWorkload};
use std::collections::HashMap;
use std::sync::Arc;

/// Per-unit access counts accumulated lazily: while the profile stays the same only the VM's
/// total is added up, and spread over the units when the profile changes or the counts are read.
#[derive(Default)]
pub struct LazyCounts {
    pub acc: Vec<f32>,
    pub wacc: Vec<f32>,
    pending: Option<(Arc<Profile>, f64)>,
}

impl LazyCounts {
    pub fn new(units: usize) -> Self {
        LazyCounts {
            acc: vec![0.0; units],
            wacc: vec![0.0; units],
            pending: None,
        }
    }
    pub fn add(&mut self, p: &Arc<Profile>, n: f64) {
        match &mut self.pending {
            Some((q, m)) if Arc::ptr_eq(q, p) => *m += n,
            _ => {
                self.flush();
                self.pending = Some((p.clone(), n));
            }
        }
    }
    /// Spreads the pending total; after this `acc` and `wacc` are exact.
    pub fn flush(&mut self) {
        if let Some((p, n)) = self.pending.take() {
            for u in 0..self.acc.len() {
                self.acc[u] += (p.share(u) * n) as f32;
                self.wacc[u] += (p.write[u] as f64 * n) as f32;
            }
        }
    }
    pub fn clear(&mut self) {
        self.pending = None;
        self.acc.iter_mut().for_each(|x| *x = 0.0);
        self.wacc.iter_mut().for_each(|x| *x = 0.0);
    }
}
use vtism_engine::synth::Rng;
use vtism_engine::{FrameAccess, Nanos, Observation, Policy, VmId};
use vtism_proto::{Gfn, PageType, FRAME_SIZE, HUGE_FRAMES};

/// What a tracker may look at in one epoch of one VM.
pub struct EpochView<'a> {
    pub vm: VmId,
    pub wl: &'a VmWorkload,
    pub profile: &'a Arc<Profile>,
    /// Accesses the VM made in this epoch.
    pub accesses: f64,
    pub t0: f64,
    pub t1: f64,
    pub unit_bytes: u64,
    pub model: &'a MemoryModel,
    /// The VM's fast-memory quota now (what the guest learns from the host's feedback).
    pub quota_bytes: u64,
    /// The host's pages (`--host-pages`), for mechanisms that see them.
    pub host: Option<&'a HostBacking>,
}

impl EpochView<'_> {
    pub fn fpu(&self) -> u64 {
        (self.unit_bytes / FRAME_SIZE).max(1)
    }
    pub fn gfn(&self, unit: usize) -> Gfn {
        Gfn(unit as u64 * self.fpu())
    }
    pub fn dt(&self) -> f64 {
        self.t1 - self.t0
    }
}

/// Thread-time a tracker cost the VM, ns (charged to the next epoch).
#[derive(Clone, Copy, Debug, Default)]
pub struct TrackCost {
    pub stall_ns: f64,
}

pub trait Tracker: Send {
    fn epoch(&mut self, v: &EpochView<'_>, policy: &mut dyn Policy) -> anyhow::Result<TrackCost>;
    /// Bytes the policy's last plan moved for this VM (HMM-V's clock switch uses it).
    fn moved(&mut self, _bytes: u64) {}
}

/// No tracking (static, all-fast).
pub struct NoTracker;
impl Tracker for NoTracker {
    fn epoch(&mut self, _: &EpochView<'_>, _: &mut dyn Policy) -> anyhow::Result<TrackCost> {
        Ok(TrackCost::default())
    }
}

fn nanos(t: f64) -> Nanos {
    Nanos((t * 1e9).round() as u64)
}

/// Fraction of a unit's 4 KiB frames touched by `acc` accesses spread evenly over them.
fn touched(acc: f64, fpu: u64) -> f64 {
    1.0 - (-acc / fpu as f64).exp()
}

/// NUMA hint faults (Linux NUMA balancing, used by TPP, AutoNUMA and AutoTiering): every scan
/// period the scanner makes the next 256 MiB of the address space PROT_NONE; the next access to
/// each 4 KiB page faults. Reports to the policy, as `Observation::Accesses`:
/// - at the unmap time, the unmapped units with zero counts (so the policy knows when it armed
///   them; the fault latency is the time from then to the fault);
/// - at each unit's fault time (when half its frames have faulted: the median frame), the unit
///   with `reads`/`writes` = 4 KiB frames expected to fault before the range is scanned again.
pub struct HintFaultScanner {
    pub period_s: f64,
    pub scan_bytes: u64,
    next_scan: f64,
    pos: usize,
    /// Unmap time of each armed unit, or NaN.
    armed: Vec<f64>,
    pub faults: f64,
}

impl HintFaultScanner {
    pub fn new(units: usize) -> Self {
        HintFaultScanner {
            period_s: 1.0,
            scan_bytes: 256 << 20,
            next_scan: 0.0,
            pos: 0,
            armed: vec![f64::NAN; units],
            faults: 0.0,
        }
    }
}

impl Tracker for HintFaultScanner {
    fn epoch(&mut self, v: &EpochView<'_>, policy: &mut dyn Policy) -> anyhow::Result<TrackCost> {
        let n = self.armed.len();
        let fpu = v.fpu() as f64;
        let per_scan = ((self.scan_bytes / v.unit_bytes) as usize).clamp(1, n);
        let cycle = self.period_s * n as f64 / per_scan as f64;
        let mut cost = 0.0;
        let mut events: Vec<(f64, FrameAccess)> = Vec::new();
        // Faults of units armed earlier (or in this epoch, at their unmap time).
        let mut scans: Vec<(f64, Vec<usize>)> = Vec::new();
        while self.next_scan < v.t1 {
            let t = self.next_scan.max(v.t0);
            let mut batch = Vec::with_capacity(per_scan);
            for _ in 0..per_scan {
                batch.push(self.pos);
                self.armed[self.pos] = t;
                self.pos = (self.pos + 1) % n;
            }
            scans.push((t, batch));
            self.next_scan += self.period_s;
        }
        for (t, batch) in &scans {
            let zero: Vec<FrameAccess> = batch
                .iter()
                .map(|&u| FrameAccess {
                    gfn: v.gfn(u),
                    reads: 0,
                    writes: 0,
                    page_type: v.profile.ptype[u],
                })
                .collect();
            policy.observe(v.vm, Observation::Accesses(&zero), nanos(*t))?;
        }
        for u in 0..n {
            let armed = self.armed[u];
            if armed.is_nan() {
                continue;
            }
            let rate = v.profile.share(u) * v.accesses / v.dt();
            if rate <= 0.0 {
                continue;
            }
            let lf = rate / fpu;
            let t = armed + std::f64::consts::LN_2 / lf;
            if t >= v.t1 {
                continue;
            }
            self.armed[u] = f64::NAN;
            let frames = fpu * touched(lf * cycle, 1);
            let wfrac = v.profile.write[u] as f64 / v.profile.share(u);
            // A PMD-mapped host folio takes one hint fault for its 512 frames
            // (mm/huge_memory.c, `do_huge_pmd_numa_page`): each frame's fault is a 512th of it.
            let faults = if v.host.is_some_and(|h| h.unit_is_huge(u)) {
                frames / HUGE_FRAMES as f64
            } else {
                frames
            };
            self.faults += faults;
            cost += faults * v.model.tracking.hint_fault_us * 1e3;
            let w = (frames * wfrac).round() as u32;
            events.push((
                t.max(v.t0),
                FrameAccess {
                    gfn: v.gfn(u),
                    reads: (frames.round() as u32).saturating_sub(w).max(1),
                    writes: w,
                    page_type: v.profile.ptype[u],
                },
            ));
        }
        events.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.gfn.cmp(&b.1.gfn)));
        // Deliver in batches of faults within the same millisecond.
        let mut i = 0;
        let mut buf = Vec::new();
        while i < events.len() {
            let ms = (events[i].0 * 1e3).floor();
            buf.clear();
            let t = events[i].0;
            while i < events.len() && (events[i].0 * 1e3).floor() == ms {
                buf.push(events[i].1);
                i += 1;
            }
            policy.observe(v.vm, Observation::Accesses(&buf), nanos(t))?;
        }
        Ok(TrackCost { stall_ns: cost })
    }
}

/// PEBS sampling (HeMem, Memtis): one sample every `load_period` memory loads and every
/// `store_period` stores, counted per unit. Memtis adapts its periods to keep the sampler under
/// `cpu_limit` of one CPU; HeMem uses fixed periods (`cpu_limit` = None).
pub struct PebsSampler {
    pub load_period: f64,
    pub store_period: f64,
    base_load: f64,
    base_store: f64,
    pub cpu_limit: Option<f64>,
    rng: Rng,
    pub samples: f64,
    buf: Vec<FrameAccess>,
}

impl PebsSampler {
    pub fn new(load_period: f64, store_period: f64, cpu_limit: Option<f64>, seed: u64) -> Self {
        PebsSampler {
            load_period,
            store_period,
            base_load: load_period,
            base_store: store_period,
            cpu_limit,
            rng: Rng::new(seed),
            samples: 0.0,
            buf: Vec::new(),
        }
    }
}

/// A Poisson sample with mean `m` (normal approximation above 30).
pub fn poisson(rng: &mut Rng, m: f64) -> u32 {
    if m <= 0.0 {
        return 0;
    }
    if m > 30.0 {
        // Box-Muller.
        let u1 = ((rng.next_u64() >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
        let u2 = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
        return (m + z * m.sqrt()).round().max(0.0) as u32;
    }
    let l = (-m).exp();
    let mut k = 0u32;
    let mut p = 1.0;
    loop {
        p *= (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        if p <= l {
            return k;
        }
        k += 1;
    }
}

impl Tracker for PebsSampler {
    fn epoch(&mut self, v: &EpochView<'_>, policy: &mut dyn Policy) -> anyhow::Result<TrackCost> {
        self.buf.clear();
        let mut total = 0u64;
        for u in 0..v.profile.units() {
            let r = poisson(
                &mut self.rng,
                v.profile.read[u] as f64 * v.accesses / self.load_period,
            );
            let w = poisson(
                &mut self.rng,
                v.profile.write[u] as f64 * v.accesses / self.store_period,
            );
            if r + w > 0 {
                total += (r + w) as u64;
                self.buf.push(FrameAccess {
                    gfn: v.gfn(u),
                    reads: r,
                    writes: w,
                    page_type: v.profile.ptype[u],
                });
            }
        }
        self.samples += total as f64;
        policy.observe(v.vm, Observation::Accesses(&self.buf), nanos(v.t1))?;
        let cpu_ns = total as f64 * v.model.tracking.pebs_sample_ns;
        if let Some(limit) = self.cpu_limit {
            // Memtis: raise the periods while the sampler uses more than its CPU budget, lower them
            // back towards the base when well under.
            let frac = cpu_ns / (v.dt() * 1e9);
            if frac > limit {
                self.load_period *= 2.0;
                self.store_period *= 2.0;
            } else if frac < limit / 4.0 && self.load_period > self.base_load {
                self.load_period = (self.load_period / 2.0).max(self.base_load);
                self.store_period = (self.store_period / 2.0).max(self.base_store);
            }
        }
        Ok(TrackCost { stall_ns: cpu_ns })
    }
}

/// HMM-V's PML-based guest page-table scanner: monitoring windows of `mws` seconds; per window it
/// reports each unit's frames with the A bit set (`reads`) and the D bit set (`writes`). Tracking
/// runs `windows` windows and is switched on every `clock_s` seconds, skipped while the migrations
/// it led to stay under 256 MiB (a counter up to 3). While on it slows the VM by the published
/// tracking slowdown.
pub struct PmlScanner {
    pub mws: f64,
    pub windows: u32,
    pub clock_s: f64,
    next_switch: f64,
    on_until: f64,
    window_end: f64,
    counter: u32,
    awaiting_feedback: bool,
    counts: LazyCounts,
    buf: Vec<FrameAccess>,
    pub tracking_secs: f64,
}

impl PmlScanner {
    pub fn new(units: usize) -> Self {
        PmlScanner {
            mws: 0.6,
            windows: 8,
            clock_s: 60.0,
            next_switch: 0.0,
            on_until: f64::NEG_INFINITY,
            window_end: 0.0,
            counter: 0,
            awaiting_feedback: false,
            counts: LazyCounts::new(units),
            buf: Vec::new(),
            tracking_secs: 0.0,
        }
    }
}

impl Tracker for PmlScanner {
    fn epoch(&mut self, v: &EpochView<'_>, policy: &mut dyn Policy) -> anyhow::Result<TrackCost> {
        if v.t0 >= self.next_switch - 1e-9 && v.t0 >= self.on_until - 1e-9 {
            self.next_switch += self.clock_s;
            if self.counter == 0 {
                self.on_until = v.t0 + self.mws * self.windows as f64;
                self.window_end = v.t0 + self.mws;
                self.counts.clear();
                self.awaiting_feedback = true;
            } else {
                self.counter -= 1;
            }
        }
        if v.t0 >= self.on_until - 1e-9 {
            return Ok(TrackCost::default());
        }
        self.counts.add(v.profile, v.accesses);
        let on = v.t1.min(self.on_until) - v.t0;
        self.tracking_secs += on;
        while v.t1 >= self.window_end - 1e-9 && self.window_end <= self.on_until + 1e-9 {
            let fpu = v.fpu();
            self.buf.clear();
            self.counts.flush();
            for u in 0..self.counts.acc.len() {
                let c = &self.counts;
                let r = (touched(c.acc[u] as f64, fpu) * fpu as f64).round() as u32;
                let w = (touched(c.wacc[u] as f64, fpu) * fpu as f64).round() as u32;
                self.buf.push(FrameAccess {
                    gfn: v.gfn(u),
                    reads: r,
                    writes: w,
                    page_type: v.profile.ptype[u],
                });
            }
            self.counts.clear();
            policy.observe(
                v.vm,
                Observation::Accesses(&self.buf),
                nanos(self.window_end),
            )?;
            self.window_end += self.mws;
        }
        Ok(TrackCost {
            stall_ns: v.model.tracking.pml_scan_slowdown * on * 1e9 * v.wl.concurrency,
        })
    }

    fn moved(&mut self, bytes: u64) {
        // The feedback of HMM-V's clock switch: small migrations mean placement is right.
        if self.awaiting_feedback && bytes > 0 {
            self.awaiting_feedback = false;
            if bytes < 256 << 20 {
                self.counter = (self.counter + 1).min(3);
            }
        }
    }
}

/// The oracle's feed: every second, the accesses each unit will get at the current rate, read from
/// the workload's future profiles, sent as two observations at the same time: first over the next
/// `every_s` (until the oracle's next decision), then over the next `horizon_s` (what a move has to
/// pay for itself over). Costs nothing.
pub struct OracleFeed {
    pub horizon_s: f64,
    pub every_s: f64,
    next: f64,
    cache: HashMap<u64, Profile>,
    buf: Vec<FrameAccess>,
}

impl OracleFeed {
    pub fn new() -> Self {
        OracleFeed {
            horizon_s: 10.0,
            every_s: 1.0,
            next: 0.0,
            cache: HashMap::new(),
            buf: Vec::new(),
        }
    }
}

impl Default for OracleFeed {
    fn default() -> Self {
        Self::new()
    }
}

impl Tracker for OracleFeed {
    fn epoch(&mut self, v: &EpochView<'_>, policy: &mut dyn Policy) -> anyhow::Result<TrackCost> {
        if v.t1 < self.next - 1e-9 {
            return Ok(TrackCost::default());
        }
        self.next = v.t1 + self.every_s;
        let rate = v.accesses / v.dt();
        let n = v.profile.units();
        let mut r = vec![0.0f64; n];
        let mut w = vec![0.0f64; n];
        // Walk the horizon at epoch resolution, adding each constant-profile stretch at once.
        let steps = (self.horizon_s / v.dt()).round().max(1.0) as usize;
        let near = ((self.every_s / v.dt()).round().max(1.0) as usize).min(steps);
        let first = v.wl.phase(v.t1);
        self.cache.retain(|&k, _| k >= first);
        let mut k = 0;
        while k < steps {
            let ph = v.wl.phase(v.t1 + k as f64 * v.dt());
            let end = if k < near { near } else { steps };
            let mut e = k + 1;
            while e < end && v.wl.phase(v.t1 + e as f64 * v.dt()) == ph {
                e += 1;
            }
            let p = self
                .cache
                .entry(ph)
                .or_insert_with(|| v.wl.profile(ph, v.unit_bytes));
            let acc = rate * v.dt() * (e - k) as f64;
            for u in 0..n {
                r[u] += p.read[u] as f64 * acc;
                w[u] += p.write[u] as f64 * acc;
            }
            k = e;
            if k == near {
                self.send(v, policy, &r, &w)?;
            }
        }
        self.send(v, policy, &r, &w)?;
        Ok(TrackCost::default())
    }
}

impl OracleFeed {
    fn send(
        &mut self,
        v: &EpochView<'_>,
        policy: &mut dyn Policy,
        r: &[f64],
        w: &[f64],
    ) -> anyhow::Result<()> {
        self.buf.clear();
        for u in 0..r.len() {
            self.buf.push(FrameAccess {
                gfn: v.gfn(u),
                reads: r[u].min(u32::MAX as f64) as u32,
                writes: w[u].min(u32::MAX as f64) as u32,
                page_type: v.profile.ptype[u],
            });
        }
        policy.observe(v.vm, Observation::Accesses(&self.buf), nanos(v.t1))?;
        Ok(())
    }
}

/// Page type of a unit as `PageType` bits (shared by peers).
pub fn is_file(t: PageType) -> bool {
    t == PageType::File
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poisson_mean_is_right() {
        let mut rng = Rng::new(3);
        for m in [0.2, 3.0, 80.0] {
            let n = 20_000;
            let s: u64 = (0..n).map(|_| poisson(&mut rng, m) as u64).sum();
            let mean = s as f64 / n as f64;
            assert!((mean - m).abs() < 0.05 * m + 0.02, "{m}: {mean}");
        }
    }

    #[test]
    fn touched_fraction_saturates() {
        assert_eq!(touched(0.0, 512), 0.0);
        assert!(touched(512.0 * 10.0, 512) > 0.9999);
        assert!((touched(512.0, 512) - (1.0 - (-1.0f64).exp())).abs() < 1e-12);
    }
}
