//! vtism's guest tracker as the module runs it (docs/guest.md, "How tracking works"), modelled
//! per placement unit with the unit's expected values (mean field, as the other A-bit trackers).
//!
//! Two kinds of observation window, both "clear the Accessed bits, flush the TLB, wait W, read
//! them", under one CPU budget:
//! - coarse: every `coarse_period`, the PMD entries (2 MiB regions) of the whole address space,
//!   window `W_c`: one bit per region, so a pass costs per region, not per page;
//! - fine: the 4 KiB entries of a rotating chunk of regions, in bursts of `burst` consecutive
//!   windows of `W_f` (one clearing pass then one read-and-clear pass per window), as much as the
//!   budget left after the coarse windows allows; regions seen young in every window of a burst
//!   are not cleared for 2^(level-1) bursts (HMM-V's do-not-disturb levels).
//!
//! Both windows adapt in a closed loop toward as many young regions (frames) per window as the
//! host's quota holds, so the hot threshold falls near the quota boundary. A region's rate is
//! `-ln(1 - p) / W` from the share `p` of windows it was young in (decayed average); a frame's
//! published rate is its fine estimate scaled by how its region's coarse rate changed since,
//! or its region's coarse rate shared evenly when it has no fine estimate yet. Rounds publish
//! every `round` the frames' rates as channel v1.1 rate levels, hottest first.
//!
//! Costs, per pass, from measured figures (`TrackingModel`): entries read, young entries cleared
//! or recorded, a full TLB flush on every vCPU per window, the scanner's own CPU time on one
//! vCPU, and the seed's quadratic slowdown `scan_slowdown_per_ms * Ts^2` for a pass of `Ts` ms
//! (passes are cut at `pass_max`, so it stays small).

use crate::mechanism::{EpochView, TrackCost, Tracker};
use crate::trace::TraceWriter;
use std::collections::VecDeque;
use std::fs::File;
use std::io::BufWriter;
use vtism_engine::{Nanos, Observation, Policy};
use vtism_proto::count::level_of_rate;
use vtism_proto::{CountMeaning, Gfn, HintEntry, FRAME_SIZE, HUGE_FRAMES};

/// The module's defaults (guest/module/vtism_main.c).
#[derive(Clone, Debug)]
pub struct WindowParams {
    /// CPU the tracker may use, as a share of one vCPU.
    pub cpu_budget: f64,
    /// Seconds between two coarse windows, and regions per coarse window's pass.
    pub coarse_period_s: f64,
    pub coarse_chunk: usize,
    /// Coarse window: initial, minimum and maximum, seconds.
    pub coarse_window_s: [f64; 3],
    /// Fine window: initial, minimum and maximum, seconds.
    pub fine_window_s: [f64; 3],
    /// Fine windows per burst.
    pub burst: u32,
    /// The seed's adaptive interval, T = (K*Ts + Kb)*Ts + Tbase ms for a scan of Ts ms, capped:
    /// the least time from the start of one fine sweep (the PTE-level coverage of everything)
    /// to the start of the next, Ts being the last sweep's CPU time.
    pub interval_k: f64,
    pub interval_kb: f64,
    pub interval_base_ms: f64,
    pub interval_max_ms: f64,
    /// Weight of one coarse window in a region's decayed share of young windows, when the
    /// window says more (up) and less (down) than the share: a region must stay hot for a while
    /// before it counts as hot (a moment's burst is over before its pages could move), and
    /// counts as cooled soon after it cools.
    pub coarse_weight_up: f64,
    pub coarse_weight_down: f64,
    /// Weight of one fine window in a frame's decayed share.
    pub fine_weight: f64,
    /// Seconds between two published rounds.
    pub round_s: f64,
    /// Highest do-not-disturb level (0: off) and the time one level stands for: a frame at level
    /// x is left alone for 2^(x-1) of it (HMM-V: up to 7 levels of 600 ms windows).
    pub dnd_max_level: u8,
    pub dnd_unit_s: f64,
    /// A pass yields after this much work, seconds.
    pub pass_max_s: f64,
    /// Entries a round can hold (a 16 MiB channel).
    pub capacity: usize,
}

impl Default for WindowParams {
    fn default() -> Self {
        WindowParams {
            cpu_budget: 0.01,
            coarse_period_s: 0.2,
            coarse_chunk: 16384,
            coarse_window_s: [1e-3, 50e-6, 0.1],
            fine_window_s: [0.1, 1e-3, 10.0],
            burst: 4,
            interval_k: 8.0,
            interval_kb: 50.0,
            interval_base_ms: 2500.0,
            interval_max_ms: 300_000.0,
            coarse_weight_up: 1.0 / 24.0,
            coarse_weight_down: 1.0 / 4.0,
            fine_weight: 1.0 / 8.0,
            round_s: 1.0,
            dnd_max_level: 7,
            dnd_unit_s: 0.6,
            pass_max_s: 1e-3,
            capacity: 2_096_640,
        }
    }
}

/// Regions are 2 MiB (one PMD entry).
const REGION_FRAMES: u64 = HUGE_FRAMES;
/// Shares of young windows are kept below this, so a rate stays finite.
const P_MAX: f64 = 1.0 - 1.0 / 256.0;

fn rate_of_share(p: f64, w: f64) -> f64 {
    -(1.0 - p.clamp(0.0, P_MAX)).ln() / w
}

/// A fine burst whose result the tracker has once its windows have passed.
struct PendingBurst {
    ready: f64,
    unit: usize,
    share: f64,
    window: f64,
}

pub struct WindowTracker {
    pub p: WindowParams,
    fpu: u64,
    units_per_region: usize,
    /// Per region: decayed share of coarse windows it was young in, and when last cleared.
    region_share: Vec<f32>,
    coarse_w: f64,
    /// The window regions really had: `coarse_w` plus one chunk's pass.
    coarse_w_eff: f64,
    next_coarse: f64,
    /// Per unit: decayed share of young fine windows and the window it is a share of (a frame
    /// enters tracking at its first fine burst), the region rate when it was measured, the
    /// do-not-disturb level and bursts left undisturbed, last fine observation.
    fine_share: Vec<f32>,
    fine_window: Vec<f32>,
    fine_seen: Vec<bool>,
    rate_at_fine: Vec<f32>,
    dnd_level: Vec<u8>,
    dnd_until: Vec<f32>,
    /// Dirty seen by a fine pass: the module reads the Dirty bit and never clears it, so a frame
    /// once written stays written.
    written: Vec<bool>,
    last_fine: Vec<f32>,
    fine_w: f64,
    cursor: usize,
    /// Young and observed frames of the sweep in progress (the fine window adapts per sweep:
    /// one chunk is no sample of the whole).
    sweep_young: f64,
    sweep_frames: f64,
    /// CPU time of the sweep in progress, and when the next sweep may start.
    sweep_cpu: f64,
    sweep_start: f64,
    next_sweep: f64,
    pending: VecDeque<PendingBurst>,
    /// Seconds of CPU the budget still allows.
    credit: f64,
    next_round: f64,
    round_s: f64,
    pub rounds: u64,
    pub windows: u64,
    pub cpu_s: f64,
    /// Records every published round (`vtism sim run --record-trace`).
    pub trace: Option<TraceWriter<BufWriter<File>>>,
    entries: Vec<HintEntry>,
}

impl WindowTracker {
    pub fn new(units: usize, unit_bytes: u64, p: WindowParams) -> Self {
        let fpu = (unit_bytes / FRAME_SIZE).max(1);
        let units_per_region = (REGION_FRAMES / fpu).max(1) as usize;
        let regions = units.div_ceil(units_per_region);
        WindowTracker {
            fpu,
            units_per_region,
            region_share: vec![0.0; regions],
            coarse_w: p.coarse_window_s[0],
            coarse_w_eff: p.coarse_window_s[0],
            next_coarse: p.coarse_period_s,
            fine_share: vec![0.0; units],
            fine_window: vec![0.0; units],
            fine_seen: vec![false; units],
            rate_at_fine: vec![0.0; units],
            dnd_level: vec![0; units],
            dnd_until: vec![0.0; units],
            written: vec![false; units],
            last_fine: vec![0.0; units],
            fine_w: p.fine_window_s[0],
            cursor: 0,
            sweep_young: 0.0,
            sweep_frames: 0.0,
            sweep_cpu: 0.0,
            sweep_start: 0.0,
            next_sweep: 0.0,
            pending: VecDeque::new(),
            credit: 0.0,
            next_round: p.round_s,
            round_s: p.round_s,
            rounds: 0,
            windows: 0,
            cpu_s: 0.0,
            trace: None,
            entries: Vec::new(),
            p,
        }
    }

    fn region_of(&self, unit: usize) -> usize {
        unit / self.units_per_region
    }

    /// The share of regions (frames) the window loops aim to see young: what the quota holds.
    fn goal(v: &EpochView<'_>, frames: u64) -> f64 {
        let quota = v.quota_bytes as f64 / FRAME_SIZE as f64;
        (quota / frames.max(1) as f64).clamp(0.01, 0.5)
    }

    /// DAMON's interval auto-tuning step: scale toward the goal, at most halving or doubling.
    fn adapt(w: f64, seen: f64, goal: f64, bounds: [f64; 3]) -> f64 {
        let f = (goal / seen.max(1e-9)).sqrt().clamp(0.5, 2.0);
        (w * f).clamp(bounds[1], bounds[2])
    }

    fn region_rate(&self, r: usize) -> f64 {
        rate_of_share(self.region_share[r] as f64, self.coarse_w_eff)
    }
}

/// What passes cost the VM: the scanner's CPU, the slowdown of each pass, the flushes.
#[derive(Default)]
struct Bill {
    cpu_s: f64,
    stall_ns: f64,
}

impl Bill {
    /// A pass of `cpu_s` seconds, cut into passes of at most `pass_max` seconds.
    fn pass(&mut self, cpu_s: f64, v: &EpochView<'_>, pass_max: f64) {
        if cpu_s <= 0.0 {
            return;
        }
        let t = &v.model.tracking;
        let n = (cpu_s / pass_max).ceil();
        let ts_ms = cpu_s / n * 1e3;
        let slowdown_ms = n * t.scan_slowdown_per_ms * ts_ms * ts_ms;
        self.cpu_s += cpu_s;
        self.stall_ns += cpu_s * 1e9 + slowdown_ms * 1e6 * v.wl.concurrency;
    }
    /// Work that reads the tracker's own state and writes the channel (publication): the
    /// scanner's CPU only; it clears no Accessed bit and flushes nothing, so the seed's slowdown
    /// (measured for scans that do) does not apply.
    fn cpu(&mut self, cpu_s: f64) {
        self.cpu_s += cpu_s;
        self.stall_ns += cpu_s * 1e9;
    }
    /// A full TLB flush on every vCPU: the IPI (the simulator's shootdown cost) and the refill.
    fn flush(&mut self, v: &EpochView<'_>) {
        let per_vcpu_us = v.model.migration.per_page_us + v.model.tracking.tlb_refill_us;
        self.stall_ns += v.wl.vcpus.max(1) as f64 * per_vcpu_us * 1e3;
    }
}

impl WindowTracker {
    fn coarse_window(&mut self, v: &EpochView<'_>, unit_rate: &[f64], bill: &mut Bill) {
        let t = &v.model.tracking;
        let regions = self.region_share.len();
        // Per region: a clearing pass and, a window later, a test-and-clear pass over its PMD
        // entry. Regions go in chunks, each its own window, so a region's window is W_c plus
        // one chunk's pass, not the whole address space's. A pass costs per region an entry
        // read and, where the entry is young, its clear and bookkeeping.
        let chunk = regions.min(self.p.coarse_chunk).max(1);
        let lambdas: Vec<f64> = (0..regions)
            .map(|r| {
                unit_rate[r * self.units_per_region
                    ..((r + 1) * self.units_per_region).min(unit_rate.len())]
                    .iter()
                    .sum()
            })
            .collect();
        let young_ns = t.young_clear_ns() - t.pte_read_ns;
        let since = |l: f64| 1.0 - (-l * self.p.coarse_period_s).exp();
        let clear_pass_ns: f64 = lambdas
            .iter()
            .map(|&l| t.pte_read_ns + since(l) * young_ns)
            .sum::<f64>()
            * chunk as f64
            / regions as f64;
        let w_eff = self.coarse_w + clear_pass_ns * 1e-9;
        let mut young = 0.0;
        let mut cost_ns = 0.0;
        for (r, &lambda) in lambdas.iter().enumerate() {
            let p = 1.0 - (-lambda * w_eff).exp();
            cost_ns += 2.0 * t.pte_read_ns + (since(lambda) + p) * young_ns;
            let s = &mut self.region_share[r];
            let w = if p > *s as f64 {
                self.p.coarse_weight_up
            } else {
                self.p.coarse_weight_down
            };
            *s += (w * (p - *s as f64)) as f32;
            young += p;
        }
        self.coarse_w_eff = w_eff;
        bill.pass(cost_ns * 1e-9, v, self.p.pass_max_s);
        for _ in 0..regions.div_ceil(chunk) {
            bill.flush(v);
        }
        self.windows += 1;
        let goal = Self::goal(v, regions as u64 * REGION_FRAMES) * regions as f64;
        self.coarse_w = Self::adapt(self.coarse_w, young, goal, self.p.coarse_window_s);
    }

    /// Fine bursts over the next units, as far as `credit` goes.
    fn fine_bursts(&mut self, v: &EpochView<'_>, unit_rate: &[f64], bill: &mut Bill) {
        let t = &v.model.tracking;
        let n = self.fine_share.len();
        if n == 0 {
            return;
        }
        if self.cursor == 0 && v.t1 < self.next_sweep {
            return;
        }
        if self.cursor == 0 {
            self.sweep_start = v.t1;
        }
        let m = self.p.burst.max(1) as f64;
        let fpu = self.fpu as f64;
        let (mut spent, mut young, mut frames) = (0.0, 0.0, 0.0);
        for _ in 0..n {
            let u = self.cursor;
            let r = self.region_of(u);
            let lambda_r: f64 = unit_rate
                [r * self.units_per_region..((r + 1) * self.units_per_region).min(n)]
                .iter()
                .sum();
            let rate = unit_rate[u] / fpu;
            let p = 1.0 - (-rate * self.fine_w).exp();
            let since = (v.t1 - self.last_fine[u] as f64).max(self.fine_w);
            let y_long = 1.0 - (-rate * since).exp();
            let pmd_w = 1.0 - (-lambda_r * self.fine_w).exp();
            let pmd_long = 1.0 - (-lambda_r * since).exp();
            // Frames known hot are left alone (not cleared, not measured) for a while: their
            // published rate follows their region's coarse rate meanwhile.
            if (self.dnd_until[u] as f64) > v.t1 {
                self.cursor = (u + 1) % n;
                if self.cursor == 0 {
                    self.sweep_cpu += spent;
                    self.end_sweep(v, &mut young, &mut frames);
                    break;
                }
                continue;
            }
            // A clearing pass, then one test-and-clear pass per window; a pass reads the PTEs of
            // a table only if its PMD entry was used since the last pass.
            let visits = fpu * (pmd_long + m * pmd_w);
            let clears = fpu * (y_long + m * p);
            let cost =
                (visits * t.pte_read_ns + clears * (t.young_clear_ns() - t.pte_read_ns)) * 1e-9;
            if cost > self.credit - spent {
                break;
            }
            spent += cost;
            young += fpu * p;
            self.written[u] |= v.profile.write[u] > 0.0;
            frames += fpu;
            self.pending.push_back(PendingBurst {
                ready: v.t1 + m * self.fine_w,
                unit: u,
                share: p,
                window: self.fine_w,
            });
            self.last_fine[u] = v.t1 as f32;
            self.cursor = (u + 1) % n;
            if self.cursor == 0 {
                self.sweep_cpu += spent;
                self.end_sweep(v, &mut young, &mut frames);
                break;
            }
        }
        self.sweep_cpu += if self.cursor == 0 { 0.0 } else { spent };
        self.sweep_young += young;
        self.sweep_frames += frames;
        if spent == 0.0 {
            return;
        }
        self.credit -= spent;
        bill.pass(spent, v, self.p.pass_max_s);
        // One flush per window; a burst's windows are shared by the chunks in flight.
        let windows = (v.dt() / self.fine_w).clamp(1.0, m);
        for _ in 0..windows as u32 {
            bill.flush(v);
        }
        self.windows += windows as u64;
    }

    /// The fine window adapts once per sweep, on the sweep's young and observed frames.
    fn end_sweep(&mut self, v: &EpochView<'_>, young: &mut f64, frames: &mut f64) {
        let n = self.fine_share.len() as u64;
        let goal = Self::goal(v, n * self.fpu) * (self.sweep_frames + *frames);
        if self.sweep_frames + *frames > 0.0 {
            self.fine_w = Self::adapt(
                self.fine_w,
                self.sweep_young + *young,
                goal,
                self.p.fine_window_s,
            );
        }
        (self.sweep_young, self.sweep_frames, *young, *frames) = (0.0, 0.0, 0.0, 0.0);
        let ts = self.sweep_cpu * 1e3;
        let interval = ((self.p.interval_k * ts + self.p.interval_kb) * ts
            + self.p.interval_base_ms)
            .min(self.p.interval_max_ms);
        self.next_sweep = self.sweep_start + interval / 1e3;
        self.sweep_cpu = 0.0;
    }

    fn land_bursts(&mut self, now: f64) {
        let w = 1.0 - (1.0 - self.p.fine_weight).powi(self.p.burst.max(1) as i32);
        while self.pending.front().is_some_and(|b| b.ready <= now) {
            let b = self.pending.pop_front().expect("front checked");
            let u = b.unit;
            // The old share, as it would have been with this burst's window (Poisson accesses:
            // 1 - p scales as a power of the window), then the burst averaged in.
            let old = if self.fine_seen[u] {
                let p = (self.fine_share[u] as f64).clamp(0.0, P_MAX);
                1.0 - (1.0 - p).powf(b.window / self.fine_window[u] as f64)
            } else {
                b.share
            };
            self.fine_share[u] = (old + w * (b.share - old)) as f32;
            self.fine_window[u] = b.window as f32;
            self.fine_seen[u] = true;
            self.rate_at_fine[u] = self.region_rate(self.region_of(u)) as f32;
            // HMM-V's levels: up when young again after the quiet time, down when not.
            if b.share >= 0.5 && self.p.dnd_max_level > 0 {
                let l = (self.dnd_level[u] + 1).min(self.p.dnd_max_level);
                self.dnd_level[u] = l;
                self.dnd_until[u] = (now + self.p.dnd_unit_s * (1u32 << (l - 1)) as f64) as f32;
            } else {
                self.dnd_level[u] = self.dnd_level[u].saturating_sub(1);
            }
        }
    }

    /// The frame rate of a unit as the module publishes it: its region's coarse rate, shared
    /// among the region's frames in proportion to their fine rates at their last burst (so a
    /// region's rate is always fresh, and its frames are told apart by the fine passes). A unit
    /// has no skew inside it here, so its frames' proportions are equal: the simulator measures
    /// what the coarse windows do and what the fine passes cost, not what they add within a
    /// region (the guest e2e's precision and recall do).
    fn frame_rate(&self, u: usize) -> f64 {
        let frames = (self.units_per_region as u64 * self.fpu).min(REGION_FRAMES);
        self.region_rate(self.region_of(u)) / frames as f64
    }

    fn publish(
        &mut self,
        v: &EpochView<'_>,
        policy: &mut dyn Policy,
        bill: &mut Bill,
    ) -> anyhow::Result<()> {
        let huge = self.fpu == HUGE_FRAMES;
        let mut ranked: Vec<(u8, usize)> = (0..self.fine_share.len())
            .filter_map(|u| {
                let l = level_of_rate(self.frame_rate(u));
                (l > 0).then_some((l, u))
            })
            .collect();
        ranked.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        self.entries.clear();
        for &(level, u) in &ranked {
            let written = self.written[u];
            let t = v.profile.ptype[u];
            let young = self.region_share[self.region_of(u)] >= 0.5;
            let gfn = v.gfn(u);
            if huge {
                self.entries
                    .push(HintEntry::new(gfn, level as u32, written, t, true, young));
            } else {
                for f in 0..self.fpu {
                    self.entries.push(HintEntry::new(
                        Gfn(gfn.0 + f),
                        level as u32,
                        written,
                        t,
                        false,
                        young,
                    ));
                }
            }
            if self.entries.len() >= self.p.capacity {
                self.entries.truncate(self.p.capacity);
                break;
            }
        }
        // Publication reads each published frame's entry (or state) and writes its hint.
        let published = ranked.len() as f64 * self.fpu as f64;
        let cost = published * 2.0 * v.model.tracking.pte_read_ns * 1e-9;
        bill.cpu(cost);
        // Rounds come no more often than publishing within a quarter of the budget allows.
        self.round_s = self.p.round_s.max(cost / (0.25 * self.p.cpu_budget));
        if let Some(tw) = self.trace.as_mut() {
            tw.round(v.t1, &self.entries)?;
        }
        policy.observe(
            v.vm,
            Observation::Hints {
                entries: &self.entries,
                overflow: false,
                counts: CountMeaning::RateLevel,
            },
            Nanos((v.t1 * 1e9).round() as u64),
        )?;
        self.rounds += 1;
        Ok(())
    }
}

impl Tracker for WindowTracker {
    fn epoch(&mut self, v: &EpochView<'_>, policy: &mut dyn Policy) -> anyhow::Result<TrackCost> {
        let dt = v.dt();
        let total = v.accesses / dt.max(1e-9);
        let unit_rate: Vec<f64> = (0..self.fine_share.len())
            .map(|u| v.profile.share(u) * total)
            .collect();
        let mut bill = Bill::default();
        self.credit = (self.credit + self.p.cpu_budget * dt).min(self.p.cpu_budget);
        while self.next_coarse <= v.t1 {
            let before = bill.cpu_s;
            self.coarse_window(v, &unit_rate, &mut bill);
            self.credit -= bill.cpu_s - before;
            self.next_coarse += self.p.coarse_period_s;
        }
        if self.credit > 0.0 {
            self.fine_bursts(v, &unit_rate, &mut bill);
        }
        self.land_bursts(v.t1);
        if v.t1 >= self.next_round {
            let before = bill.cpu_s;
            self.publish(v, policy, &mut bill)?;
            self.credit -= bill.cpu_s - before;
            self.next_round += self.round_s;
        }
        self.cpu_s += bill.cpu_s;
        Ok(TrackCost {
            stall_ns: bill.stall_ns,
        })
    }
}
