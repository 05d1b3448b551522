//! vtism's guest tracker as the module is built (guest/module; docs/guest.md, "How tracking
//! works"), per placement unit: vtism_main.c's schedule, vtism_track.c's estimates
//! ([`estimate`]), and vtism_rate.c's arithmetic and vtism_budget.c's budget, linked
//! ([`crate::rate`], [`crate::budget`]).
//!
//! One thread, under a CPU budget that accrues with time, does the most urgent thing due:
//! - coarse windows, every `coarse_period_ms`, over every 2 MiB region's PMD entry in chunks of
//!   at most `coarse_chunk` regions: a clearing pass (whose bit is the window since the last
//!   read), a flush, W_c, a reading pass; W_c steps toward the goal share of young regions;
//! - fine bursts of `burst` windows of W_f over the next regions of a rotating cursor, as many
//!   as the budget left beyond the coarse windows' reserve pays for; frames young in half the
//!   windows sit out later bursts (HMM-V's do-not-disturb levels); W_f steps once per sweep,
//!   and a sweep starts no earlier than the seed's interval after the previous one;
//! - rounds, every `round_ms`, publishing every frame's fine rate shifted by how far its
//!   region's coarse rate moved since, as channel v1.1 levels, hottest first.
//!
//! What a window sees is a probability ([`observe`]): a unit's accesses are Poisson and spread
//! evenly over its frames, and the estimates take the expectation over the Accessed bits (mean
//! field, as the simulator's other trackers). A unit's frames are alike: one frame word stands
//! for all of them, in costs and counts, and a 2 MiB unit is published as one entry. What the
//! work costs the VM is in [`cost`].

mod cost;
mod estimate;
mod observe;
mod params;

pub use params::WindowParams;

use crate::budget::Budget;
use crate::mechanism::{EpochView, TrackCost, Tracker};
use crate::trace::TraceWriter;
use cost::{arith_ns, entry_ns, Bill};
use estimate::{Coarse, Dither, Frame, FrameSeen, Region};
use observe::{p_young, Accesses};
use std::fs::File;
use std::io::BufWriter;
use vtism_engine::synth::Rng;
use vtism_engine::{Nanos, Observation, Policy};
use vtism_proto::{CountMeaning, Gfn, HintEntry, FRAME_SIZE, HUGE_FRAMES};

/// Regions are 2 MiB (one PMD entry).
const REGION_FRAMES: u64 = HUGE_FRAMES;
/// Regions per fine burst at most (VT_BURST_REGIONS), windows per burst at most.
const BURST_REGIONS: usize = 64;
const BURST_MAX_WINDOWS: usize = 6;
/// The region-burst CPU the module assumes before it has measured one (vt_thread).
const REGION_BURST_NS: f64 = 20_000.0;
const MS: u64 = 1_000_000;
/// vt_flag_neighbours: neighbours measured this recently are not flagged again, and a region
/// needs this many frames for its changes to count.
const NEIGHBOUR_GAP_MS: u32 = 10_000;
const NEIGHBOUR_MIN_FRAMES: f64 = 64.0;

enum CoarseState {
    Idle,
    /// Cleared at `t_clear`, to be read from `read_due`.
    Open {
        t_clear: u64,
        read_due: u64,
    },
}

/// The fine burst in flight (struct vt_burst).
struct Burst {
    regions: Vec<usize>,
    m: usize,
    /// The next pass: 0 clears, 1..=m read.
    pass: usize,
    t_pass: [u64; BURST_MAX_WINDOWS + 1],
    /// When the next pass may run.
    due: u64,
    cpu_ns: f64,
    wraps: bool,
    /// What the passes saw of each unit's frames, region after region.
    seen: Vec<FrameSeen>,
}

pub struct WindowTracker {
    pub p: WindowParams,
    fpu: u64,
    units: usize,
    units_per_region: usize,
    regions: Vec<Region>,
    /// One frame word per unit: its frames are alike.
    frames: Vec<Frame>,
    /// Expected accesses when a bit was last cleared: a region's PMD bit by a coarse pass, by a
    /// fine pass; a unit's frames' PTE bits (the unit's accesses).
    coarse_mark: Vec<f64>,
    /// This burst of a sweep starts at the cursor (vt_tracker.cursor_turn).
    cursor_turn: bool,
    /// Probability that change detection has flagged the region changed since its last burst
    /// (VT_R_CHANGED); flagged at 1/2 or more, and how many are.
    changed: Vec<f64>,
    changed_pending: usize,
    fine_mark: Vec<f64>,
    frame_mark: Vec<f64>,
    coarse: Coarse,
    frame_dither: Dither,
    /// Draws whether a coarse reading pass found a region's PMD bit set, where that decides
    /// more than an expectation can: reading its frames before its first burst.
    young_draw: Dither,
    acc: Accesses,
    now: u64,
    /// The thread's CPU so far, ns.
    cpu_ns: f64,
    /// Credit and debt, by the module's own code.
    budget: Budget,
    cstate: CoarseState,
    /// The chunk being observed: [c_pos, c_end).
    c_pos: usize,
    c_end: usize,
    c_next: u64,
    c_period_start: u64,
    c_period_ns: f64,
    c_cost_ns: f64,
    wc_ns: u64,
    wf_ns: u64,
    goal_ppm: u64,
    tracked_frames: u64,
    burst: Option<Burst>,
    /// Next region of the sweep in progress; None between sweeps.
    cursor: Option<usize>,
    sweep_young: f64,
    sweep_seen: f64,
    sweep_cpu_ns: f64,
    sweep_start: Option<u64>,
    next_sweep: u64,
    sweep_gap_ms: u64,
    region_burst_ns: f64,
    round_next: u64,
    /// When the last round was published, and the regions change detection found risen since.
    round_last: u64,
    change_regions: f64,
    pub early_rounds: u64,
    pub rounds: u64,
    pub windows: u64,
    pub cpu_s: f64,
    /// Records every published round (`vtism sim run --record-trace`).
    pub trace: Option<TraceWriter<BufWriter<File>>>,
    entries: Vec<HintEntry>,
}

/// The seed of VM `vm`'s tracker in a run of seed `run_seed`: the same run, the same codes.
pub fn seed_of(run_seed: u64, vm: usize) -> u64 {
    Rng::new(run_seed ^ (vm as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)).next_u64()
}

fn ns(t_s: f64) -> u64 {
    (t_s * 1e9).round() as u64
}

impl WindowTracker {
    /// The tracker of one VM of `units` placement units of `unit_bytes`; `seed` seeds the
    /// module's dither of rate codes.
    pub fn new(units: usize, unit_bytes: u64, p: WindowParams, seed: u64) -> Self {
        let fpu = (unit_bytes / FRAME_SIZE).max(1);
        let units_per_region = (REGION_FRAMES / fpu).max(1) as usize;
        let regions = units.div_ceil(units_per_region);
        let clamp = |w: [u64; 3]| w[0].clamp(w[1], w[2]) * 1000;
        WindowTracker {
            fpu,
            units,
            units_per_region,
            regions: vec![Region::default(); regions],
            frames: vec![Frame::default(); units],
            coarse_mark: vec![0.0; regions],
            cursor_turn: false,
            changed: vec![0.0; regions],
            changed_pending: 0,
            fine_mark: vec![0.0; regions],
            frame_mark: vec![0.0; units],
            coarse: Coarse::new(seed ^ 0x5bd1_e995),
            frame_dither: Dither::new(seed ^ 0x2545_f491),
            young_draw: Dither::new(seed ^ 0x9e37_79b9),
            acc: Accesses::new(units, units_per_region),
            now: 0,
            cpu_ns: 0.0,
            budget: Budget::new(p.cpu_budget_bp, p.credit_bank_ms, 0, 0),
            cstate: CoarseState::Idle,
            c_pos: 0,
            c_end: 0,
            c_next: 0,
            c_period_start: 0,
            c_period_ns: 0.0,
            c_cost_ns: 0.0,
            wc_ns: clamp(p.coarse_window_us),
            wf_ns: clamp(p.fine_window_us),
            goal_ppm: 40_000,
            tracked_frames: 0,
            burst: None,
            cursor: None,
            sweep_young: 0.0,
            sweep_seen: 0.0,
            sweep_cpu_ns: 0.0,
            sweep_start: None,
            next_sweep: 0,
            sweep_gap_ms: 0,
            region_burst_ns: REGION_BURST_NS,
            round_next: p.round_ms * MS,
            round_last: 0,
            change_regions: 0.0,
            early_rounds: 0,
            rounds: 0,
            windows: 0,
            cpu_s: 0.0,
            trace: None,
            entries: Vec::new(),
            p,
        }
    }

    /// Change detection alarmed on region `r` with probability `p` (vt_region_window): the
    /// probability that it is flagged changed (either way).
    fn flag_changed(&mut self, r: usize, p: f64) {
        if p <= 0.0 {
            return;
        }
        let was = self.changed[r] >= 0.5;
        self.changed[r] = 1.0 - (1.0 - self.changed[r]) * (1.0 - p);
        if !was && self.changed[r] >= 0.5 {
            self.changed_pending += 1;
        }
    }
    /// The bank less the largest recent debt, at most half of it (vt_bank).
    fn bank(&self) -> f64 {
        self.budget.bank() as f64
    }
    fn credit(&self) -> f64 {
        self.budget.credit() as f64
    }
    fn bp(&self) -> f64 {
        self.p.cpu_budget_bp.clamp(1, 10_000) as f64
    }

    /// Time passes: the budget accrues.
    fn advance(&mut self, t: u64) {
        if t > self.now {
            self.now = t;
            self.budget.account(self.now, self.cpu_ns as u64);
        }
    }
    /// The thread works for `cpu_ns`: time passes and the budget pays.
    fn spend(&mut self, cpu_ns: f64) {
        self.cpu_ns += cpu_ns;
        self.now += cpu_ns.ceil() as u64;
        self.budget.account(self.now, self.cpu_ns as u64);
    }
    /// When there will be `need` ns of credit (vt_when_credit; the module also waits for four
    /// wake-ups' CPU, which the simulator does not charge: its wake-up cost stays 0).
    fn when_credit(&self, need: f64) -> u64 {
        self.budget.when(need.ceil() as i64)
    }
    /// Credit a burst leaves for the next coarse window (vt_coarse_reserve).
    fn coarse_reserve(&self) -> f64 {
        self.c_cost_ns.min(self.bank() / 2.0)
    }
    /// When a burst can start (vt_burst_when).
    fn burst_when(&self) -> u64 {
        if self.regions.is_empty() {
            return u64::MAX;
        }
        let mut t = self.now;
        if self.cursor.is_none() && self.changed_pending == 0 {
            t = t.max(self.next_sweep);
        }
        // never more than three quarters of the bank, or a costly region's burst never starts
        t.max(self.when_credit(
            (self.coarse_reserve() + self.region_burst_ns).min(self.bank() / 4.0 * 3.0),
        ))
    }

    /// When a round may come before its period (vt_round_early_when): once change detection
    /// has found a quarter of the regions the quota holds (at least one) risen since the last
    /// round, round_ms after it and with credit beyond the coarse reserve.
    fn round_early_when(&self, quota_bytes: u64) -> u64 {
        let mut q = quota_bytes / (REGION_FRAMES * FRAME_SIZE);
        if q == 0 {
            q = self.tracked_frames / REGION_FRAMES;
        }
        if self.change_regions <= 0.0 || self.change_regions < (q / 4).max(1) as f64 {
            return u64::MAX;
        }
        (self.round_last + self.p.round_ms * MS).max(self.when_credit(self.coarse_reserve() + 1.0))
    }

    /// vt_step until the end of the epoch: the most urgent thing due, else a sleep until the next.
    fn run_until(
        &mut self,
        t1: u64,
        v: &EpochView<'_>,
        policy: &mut dyn Policy,
        bill: &mut Bill,
    ) -> anyhow::Result<()> {
        while self.now < t1 {
            let paid = self.credit() > 0.0;
            let coarse_due =
                matches!(self.cstate, CoarseState::Open { read_due, .. } if self.now >= read_due);
            let fine_due = self.burst.as_ref().is_some_and(|b| self.now >= b.due);
            if paid && coarse_due {
                self.coarse_read(v, bill);
            } else if paid && fine_due {
                self.fine_pass(v, bill);
            } else if self.now >= self.round_next
                || self.round_early_when(v.quota_bytes) <= self.now
            {
                self.round(v, policy, bill)?;
            } else if matches!(self.cstate, CoarseState::Idle) && self.now >= self.c_next && paid {
                self.coarse_clear(v, bill);
            } else if self.burst.is_none() && self.burst_when() <= self.now {
                self.burst_start(v, bill);
            } else {
                let mut due = self.round_next.min(self.round_early_when(v.quota_bytes));
                match self.cstate {
                    CoarseState::Open { read_due, .. } if !coarse_due => due = due.min(read_due),
                    CoarseState::Idle => due = due.min(self.c_next.max(self.when_credit(1.0))),
                    _ => {}
                }
                match &self.burst {
                    Some(b) if !fine_due => due = due.min(b.due),
                    None => due = due.min(self.burst_when()),
                    _ => {}
                }
                if coarse_due || fine_due {
                    due = due.min(self.when_credit(1.0));
                }
                self.advance(due.clamp(self.now + 1, t1));
            }
        }
        Ok(())
    }

    fn region_units(&self, r: usize) -> std::ops::Range<usize> {
        r * self.units_per_region..((r + 1) * self.units_per_region).min(self.units)
    }
}

impl WindowTracker {
    /// vt_coarse_start and its clearing pass over the next chunk; a new period when the last
    /// chunk ended.
    fn coarse_clear(&mut self, v: &EpochView<'_>, bill: &mut Bill) {
        if self.c_pos == 0 {
            self.c_period_start = self.now;
            self.c_cost_ns = self.c_period_ns;
            self.c_period_ns = 0.0;
        }
        let t = &v.model.tracking;
        let end = (self.c_pos + self.p.coarse_chunk.max(1)).min(self.regions.len());
        let now_ms = (self.now / MS) as u32;
        let mut cost = 0.0;
        for r in self.c_pos..end {
            let a = self.acc.region(r, self.now);
            let young = p_young(a - self.coarse_mark[r]);
            self.coarse_mark[r] = a;
            let arith = self.coarse.observe_clear(
                &mut self.regions[r],
                self.p.coarse_period_ms,
                now_ms,
                young,
            );
            cost += entry_ns(t, young) + arith_ns(t, arith);
        }
        self.c_end = end;
        let t_clear = self.now;
        self.spend(cost);
        self.c_period_ns += cost;
        bill.pass(cost, v, self.p.pass_max_us as f64 * 1e3);
        bill.flush(v);
        self.cstate = CoarseState::Open {
            t_clear,
            read_due: self.now + self.wc_ns,
        };
    }

    /// vt_coarse_frames: a region's frames read once before its first burst, rates 0 (every
    /// unit of the simulator is mapped); returns its CPU, one PTE table read.
    fn read_frames(&mut self, r: usize, v: &EpochView<'_>) -> f64 {
        for u in self.region_units(r) {
            self.frames[u] = Frame {
                present: true,
                write: v.profile.write[u] > 0.0,
                ..Frame::default()
            };
        }
        let present = (self.region_units(r).len() as u64 * self.fpu) as u32;
        let region = &mut self.regions[r];
        region.frames = true;
        region.present = present;
        REGION_FRAMES as f64 * v.model.tracking.pte_read_ns
    }

    /// The reading pass of the open chunk, W_c's step, and when the next chunk or period starts.
    fn coarse_read(&mut self, v: &EpochView<'_>, bill: &mut Bill) {
        let CoarseState::Open { t_clear, .. } = self.cstate else {
            return;
        };
        let t = &v.model.tracking;
        let wc_eff_us = (self.now - t_clear) / 1000;
        let now_ms = (self.now / MS) as u32;
        let (mut cost, mut young_n) = (0.0, 0.0);
        for r in self.c_pos..self.c_end {
            let a = self.acc.region(r, self.now);
            let young = p_young(a - self.coarse_mark[r]);
            self.coarse_mark[r] = a;
            let arith = self.coarse.observe_read(
                &mut self.regions[r],
                self.p.coarse_period_ms,
                now_ms,
                wc_eff_us,
                young,
            );
            cost += entry_ns(t, young) + arith_ns(t, arith);
            self.change_regions += arith.risen;
            self.flag_changed(r, arith.changed);
            young_n += young;
            // used and not measured yet: its frames, so that it is published from now on
            let region = &self.regions[r];
            if !region.measured
                && !region.frames
                && (self.young_draw.next() as f64) < young * 4_294_967_296.0
            {
                cost += self.read_frames(r, v);
            }
        }
        self.spend(cost);
        self.c_period_ns += cost;
        bill.pass(cost, v, self.p.pass_max_us as f64 * 1e3);
        self.windows += 1;
        let [_, lo, hi] = self.p.coarse_window_us;
        self.wc_ns = estimate::adapt(
            self.wc_ns,
            (self.c_end - self.c_pos) as u64,
            young_n.round() as u64,
            self.goal_ppm,
            lo * 1000,
            hi * 1000,
        );
        self.cstate = CoarseState::Idle;
        if self.c_end < self.regions.len() {
            self.c_pos = self.c_end;
            self.c_next = self.now;
        } else {
            // coarse windows use at most 3/4 of the budget: bursts are never starved
            self.c_pos = 0;
            let period = (self.p.coarse_period_ms * MS)
                .max((self.c_period_ns * 4.0 * 1e4 / (3.0 * self.bp())) as u64);
            self.c_next = (self.c_period_start + period).max(self.now);
        }
    }
}

impl WindowTracker {
    /// vt_burst_select: the regions change detection flagged changed, then from the cursor on, as
    /// many as the budget pays for (between sweeps the flagged ones only); then the burst's
    /// clearing pass.
    fn burst_start(&mut self, v: &EpochView<'_>, bill: &mut Bill) {
        let afford = self.credit() - self.coarse_reserve();
        // while a sweep is under way every other burst starts at the cursor
        let sweeping = self.cursor.is_some() || self.now >= self.next_sweep;
        if sweeping {
            self.cursor_turn = !self.cursor_turn;
        }
        let cursor_first = sweeping && self.cursor_turn;
        let mut regions = Vec::new();
        if self.changed_pending > 0 && !cursor_first {
            self.select_changed(&mut regions, afford, v, bill);
        }
        if !sweeping || !self.burst_room(regions.len(), afford) {
            self.burst_begin(regions, false, v, bill);
            return;
        }
        let start = match self.cursor {
            Some(c) => c,
            None => {
                if let Some(s) = self.sweep_start {
                    self.sweep_gap_ms = (self.now - s) / MS;
                }
                self.sweep_start = Some(self.now);
                self.sweep_cpu_ns = 0.0;
                0
            }
        };
        let (mut wraps, mut idx) = (false, start);
        while regions.len() < BURST_REGIONS {
            if idx >= self.regions.len() {
                wraps = true;
                break;
            }
            if !self.burst_room(regions.len(), afford) {
                break;
            }
            if !regions.contains(&idx) {
                self.changed[idx] = 0.0;
                regions.push(idx);
            }
            idx += 1;
        }
        self.cursor = Some(idx);
        if self.changed_pending > 0 && cursor_first && self.burst_room(regions.len(), afford) {
            self.select_changed(&mut regions, afford, v, bill);
        }
        self.burst_begin(regions, wraps, v, bill);
    }

    /// vt_burst_room: room in a burst of `n` regions for one more that `afford` pays for (the
    /// first always).
    fn burst_room(&self, n: usize, afford: f64) -> bool {
        n < BURST_REGIONS && (n == 0 || (n + 1) as f64 * self.region_burst_ns <= afford)
    }

    /// vt_burst_select_changed: the flagged regions into `regions` while the budget pays
    /// (the first always), the rest left flagged; the whole-table scan reads a word per region,
    /// costed as a PTE read.
    fn select_changed(
        &mut self,
        regions: &mut Vec<usize>,
        afford: f64,
        v: &EpochView<'_>,
        bill: &mut Bill,
    ) {
        let scan = self.regions.len() as f64 * v.model.tracking.pte_read_ns;
        self.spend(scan);
        bill.cpu(scan);
        let mut left = 0;
        for r in 0..self.regions.len() {
            if self.changed[r] < 0.5 || regions.contains(&r) {
                continue;
            }
            if self.burst_room(regions.len(), afford) {
                self.changed[r] = 0.0;
                regions.push(r);
            } else {
                left += 1;
            }
        }
        self.changed_pending = left;
    }

    /// The burst over `regions` starts with its clearing pass (or ends at once when empty).
    fn burst_begin(
        &mut self,
        regions: Vec<usize>,
        wraps: bool,
        v: &EpochView<'_>,
        bill: &mut Bill,
    ) {
        self.burst = Some(Burst {
            seen: vec![FrameSeen::default(); regions.len() * self.units_per_region],
            regions,
            m: self.p.burst.clamp(1, BURST_MAX_WINDOWS),
            pass: 0,
            t_pass: [0; BURST_MAX_WINDOWS + 1],
            due: self.now,
            cpu_ns: 0.0,
            wraps,
        });
        if self.burst.as_ref().is_some_and(|b| b.regions.is_empty()) {
            self.burst_end(); // nothing left in this sweep
        } else {
            self.fine_pass(v, bill);
        }
    }

    /// One fine pass over the burst's regions (vt_fine_pass): pass 0 clears, 1..=m read; the
    /// last lands each region's windows.
    fn fine_pass(&mut self, v: &EpochView<'_>, bill: &mut Bill) {
        let Some(mut b) = self.burst.take() else {
            return;
        };
        let t = &v.model.tracking;
        let k = b.pass;
        let last = k == b.m;
        b.t_pass[k] = self.now;
        let fpu = self.fpu as f64;
        let mut cost = 0.0;
        for (i, &r) in b.regions.iter().enumerate() {
            // The PMD entry: whether the PTE table was used since the last fine pass, so read.
            let ra = self.acc.region(r, self.now);
            let used = p_young(ra - self.fine_mark[r]);
            self.fine_mark[r] = ra;
            cost += entry_ns(t, used);
            let read = if !self.p.prune || last || (k == 0 && self.regions[r].uncleared) {
                1.0
            } else {
                used
            };
            for (j, u) in self.region_units(r).enumerate() {
                let o = &mut b.seen[i * self.units_per_region + j];
                if k == 0 {
                    self.regions[r].frames = true; // vt_region_frames
                    let f = &self.frames[u];
                    // known hot: left alone this burst
                    o.dnd = f.present && f.skip > 0;
                }
                if o.dnd {
                    cost += read * fpu * t.pte_read_ns;
                    continue;
                }
                let ua = self.acc.unit(u, self.now);
                o.p[k] = p_young((ua - self.frame_mark[u]) / fpu);
                self.frame_mark[u] = ua;
                // a young frame's table was read: its region was used
                cost += fpu * (read * t.pte_read_ns + o.p[k] * (t.pte_clear_ns - t.pte_read_ns));
            }
            if last {
                cost += self.land(&b, i, r, v);
            }
        }
        self.spend(cost);
        b.cpu_ns += cost;
        bill.pass(cost, v, self.p.pass_max_us as f64 * 1e3);
        if last {
            self.burst = Some(b);
            self.burst_end();
            return;
        }
        if k > 0 {
            self.windows += 1;
        }
        bill.flush(v);
        b.pass += 1;
        b.due = self.now + self.wf_ns;
        self.burst = Some(b);
    }

    /// vt_burst_land_region for region `r`, the `i`-th of burst `b`; returns its CPU, ns.
    fn land(&mut self, b: &Burst, i: usize, r: usize, v: &EpochView<'_>) -> f64 {
        let t = &v.model.tracking;
        let units = self.region_units(r);
        let upr = self.units_per_region;
        let mut seen = b.seen[i * upr..i * upr + units.len()].to_vec();
        for (o, u) in seen.iter_mut().zip(units.clone()) {
            o.dirty = v.profile.write[u] > 0.0;
        }
        let present = (units.len() as u64 * self.fpu) as u32;
        // counted only once measured (vt_pub_pass)
        let old_present = if self.regions[r].measured {
            self.regions[r].present as u64
        } else {
            0
        };
        let bw =
            estimate::BurstWindows::new(&b.t_pass[..=b.m], &self.regions[r], self.sweep_gap_ms);
        let l = bw.land_region(
            &mut self.regions[r],
            &mut self.frames[units],
            &seen,
            present,
            &mut self.frame_dither,
            self.p.dnd_max_level,
        );
        self.tracked_frames = (self.tracked_frames + present as u64).saturating_sub(old_present);
        self.flag_neighbours(b, r, present as f64, l.shifted * self.fpu as f64);
        let fpu = self.fpu as f64;
        self.sweep_young += l.young_w * fpu;
        self.sweep_seen += l.seen_w * fpu;
        fpu * (l.rated * t.burst_young_ns + l.moved * t.code_move_ns)
    }

    /// vt_flag_neighbours: a region where a quarter of its frames or more started over has its
    /// neighbours burst next (hot sets are mostly contiguous), unless measured in the last 10 s.
    fn flag_neighbours(&mut self, b: &Burst, r: usize, present: f64, shifted: f64) {
        if present < NEIGHBOUR_MIN_FRAMES || shifted * 4.0 < present {
            return;
        }
        let now_ms = (self.now / MS) as u32;
        for n in [r.checked_sub(1), Some(r + 1)].into_iter().flatten() {
            let Some(g) = self.regions.get(n) else {
                continue;
            };
            if self.changed[n] >= 0.5 || b.regions.contains(&n) {
                continue;
            }
            if g.measured && now_ms.wrapping_sub(g.last_burst_ms) < NEIGHBOUR_GAP_MS {
                continue;
            }
            self.flag_changed(n, 1.0);
        }
    }

    /// vt_burst_end: the CPU per region per burst learnt; at the end of a sweep W_f's step and
    /// the seed's interval before the next.
    fn burst_end(&mut self) {
        let Some(b) = self.burst.take() else {
            return;
        };
        if !b.regions.is_empty() {
            let per = b.cpu_ns / b.regions.len() as f64;
            self.region_burst_ns = (3.0 * self.region_burst_ns + per) / 4.0;
        }
        self.sweep_cpu_ns += b.cpu_ns;
        if !b.wraps {
            return;
        }
        let [_, lo, hi] = self.p.fine_window_us;
        self.wf_ns = estimate::adapt(
            self.wf_ns,
            self.sweep_seen.round() as u64,
            self.sweep_young.round() as u64,
            self.goal_ppm,
            lo * 1000,
            hi * 1000,
        );
        self.sweep_young = 0.0;
        self.sweep_seen = 0.0;
        self.cursor = None;
        let bound_ms = estimate::sweep_interval_ms(
            self.p.interval_k,
            self.p.interval_kb,
            self.p.interval_base_ms,
            self.p.interval_max_ms,
            (self.sweep_cpu_ns / 1000.0) as u64,
        );
        self.next_sweep = self.sweep_start.unwrap_or(self.now) + bound_ms.saturating_mul(MS);
    }
}

impl WindowTracker {
    /// A round (vt_round): the goal from the host's quota, publication, the next round.
    fn round(
        &mut self,
        v: &EpochView<'_>,
        policy: &mut dyn Policy,
        bill: &mut Bill,
    ) -> anyhow::Result<()> {
        self.goal_ppm =
            estimate::goal_ppm(self.p.access_goal_bp, v.quota_bytes, self.tracked_frames);
        let at = self.now;
        if at < self.round_next {
            self.early_rounds += 1;
        }
        self.change_regions = 0.0;
        let (cost, overflow) = self.publish(v);
        self.spend(cost);
        self.budget.round();
        bill.cpu(cost);
        // rounds no more often than publishing within a quarter of the budget allows
        let period_ms = self
            .p
            .round_ms
            .max((cost * 4.0 * 1e4 / (self.bp() * 1e6)) as u64);
        self.round_next = self.now + period_ms * MS;
        self.round_last = self.now;
        if let Some(tw) = self.trace.as_mut() {
            tw.round(at as f64 * 1e-9, &self.entries)?;
        }
        policy.observe(
            v.vm,
            Observation::Hints {
                entries: &self.entries,
                overflow,
                counts: CountMeaning::RateLevel,
            },
            Nanos(at),
        )?;
        self.rounds += 1;
        Ok(())
    }

    /// vt_publish: every measured region's frames at their fine rate shifted by how far the
    /// region's coarse rate moved since (vt_follow), at most that rate while W_c tells it and at
    /// least its share among them (vt_published_code); the frames read of a region not yet measured at its coarse rate
    /// shared among them (vt_pub_unmeasured); hottest first, at most `capacity` frames. Returns
    /// its CPU (the two passes as vt_pub_frames runs them) and whether
    /// frames were left out.
    fn publish(&mut self, v: &EpochView<'_>) -> (f64, bool) {
        let t = &v.model.tracking;
        let huge = self.fpu == REGION_FRAMES;
        let wc_fast = crate::rate::fast_code(self.wc_ns / 1000);
        let (mut tracked, mut walked, mut slots) = (0u64, 0u64, 0u64);
        let mut ranked: Vec<(u8, usize)> = Vec::new();
        for (r, region) in self.regions.iter().enumerate() {
            if !region.measured {
                let share = crate::rate::share_code(region.code, region.present);
                if !region.frames || share == 0 {
                    continue;
                }
                walked += region.present as u64;
                let l = estimate::level(share as i64);
                for u in self.region_units(r) {
                    if self.frames[u].present && l > 0 {
                        ranked.push((l, u));
                    }
                }
                continue;
            }
            tracked += region.present as u64;
            let Some(follow) = estimate::follow(region) else {
                continue;
            };
            // its frames together are at least the region: each at least its share
            let share = crate::rate::share_code(region.code, region.present) as i64;
            slots += REGION_FRAMES;
            for u in self.region_units(r) {
                let f = &self.frames[u];
                if f.present {
                    let l = estimate::published_level(f.code, follow, region.code, wc_fast, share);
                    if l > 0 {
                        ranked.push((l, u));
                    }
                }
            }
        }
        self.tracked_frames = tracked;
        ranked.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        let candidates = ranked.len() as u64 * self.fpu;
        self.entries.clear();
        let mut written = 0u64;
        for &(level, u) in &ranked {
            if written >= self.p.capacity {
                break;
            }
            let write = self.frames[u].write;
            let young = self.regions[u / self.units_per_region].young;
            let ptype = v.profile.ptype[u];
            let gfn = v.gfn(u);
            if huge {
                self.entries
                    .push(HintEntry::new(gfn, level as u32, write, ptype, true, young));
            } else {
                for f in 0..self.fpu {
                    self.entries.push(HintEntry::new(
                        Gfn(gfn.0 + f),
                        level as u32,
                        write,
                        ptype,
                        false,
                        young,
                    ));
                }
            }
            written += self.fpu;
        }
        // the first pass reads every frame word and computes and keeps its level; the second
        // reads the kept levels of measured regions and the words of the others, and reads the
        // word and stores the entry of each frame it writes
        let count = (slots + walked) as f64 * t.pub_count_ns;
        let write = slots as f64 * t.pub_check_ns
            + walked as f64 * t.pte_read_ns
            + written as f64 * t.pub_write_ns;
        let cost = count + write;
        (cost, candidates > written)
    }
}

impl Tracker for WindowTracker {
    fn epoch(&mut self, v: &EpochView<'_>, policy: &mut dyn Policy) -> anyhow::Result<TrackCost> {
        let (t0, t1) = (ns(v.t0), ns(v.t1));
        self.acc.begin(v.profile, v.accesses, t0, t1);
        let mut bill = Bill::default();
        self.run_until(t1, v, policy, &mut bill)?;
        self.acc.end(t1);
        self.cpu_s += bill.cpu_s;
        Ok(TrackCost {
            stall_ns: bill.stall_ns,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::MemoryModel;
    use crate::workload::{self, Profile};
    use std::sync::Arc;
    use vtism_engine::{EngineError, IngestStats, NodeId, Plan, PlanContext, VmId, VmSpec};
    use vtism_proto::entry::{PageType, GFN_MASK};

    /// Records the rounds the tracker publishes: when, and each unit's level.
    #[derive(Default)]
    struct Rounds(Vec<(f64, Vec<(usize, u8)>)>);

    impl Policy for Rounds {
        fn name(&self) -> &str {
            "rounds"
        }
        fn add_vm(&mut self, _: VmSpec) -> Result<(), EngineError> {
            Ok(())
        }
        fn remove_vm(&mut self, _: VmId) -> Result<(), EngineError> {
            Ok(())
        }
        fn set_quota(&mut self, _: VmId, _: u64) -> Result<(), EngineError> {
            Ok(())
        }
        fn observe(
            &mut self,
            _: VmId,
            obs: Observation<'_>,
            now: Nanos,
        ) -> Result<IngestStats, EngineError> {
            if let Observation::Hints { entries, .. } = obs {
                let units = entries
                    .iter()
                    .map(|e| (((e.0 & GFN_MASK) / HUGE_FRAMES) as usize, (e.0 >> 40) as u8))
                    .collect();
                self.0.push((now.0 as f64 * 1e-9, units));
            }
            Ok(IngestStats::default())
        }
        fn set_placement(
            &mut self,
            _: VmId,
            _: Gfn,
            _: u64,
            _: Option<NodeId>,
        ) -> Result<(), EngineError> {
            Ok(())
        }
        fn plan(&mut self, _: &PlanContext<'_>, _: Nanos) -> Plan {
            Plan::default()
        }
    }

    /// `units` 2 MiB units of which those in `hot` take `hot_share` of `per_s` accesses a
    /// second, the rest spread over the others, tracked for `seconds` with a fast quota of
    /// `quota` units.
    fn track(
        units: usize,
        hot: std::ops::Range<usize>,
        hot_share: f64,
        per_s: f64,
        seconds: f64,
        quota: u64,
    ) -> (WindowTracker, Rounds) {
        let profile = hot_profile(units, hot, hot_share);
        track_with(units, per_s, seconds, quota, |_| profile.clone())
    }

    /// `hot` takes `hot_share` of the accesses, the rest spread over the other units.
    fn hot_profile(units: usize, hot: std::ops::Range<usize>, hot_share: f64) -> Arc<Profile> {
        let n = hot.len();
        let mut read = vec![((1.0 - hot_share) / (units - n) as f64) as f32; units];
        read[hot].fill((hot_share / n as f64) as f32);
        Arc::new(Profile {
            read,
            write: vec![0.0; units],
            ptype: vec![PageType::Anon; units],
        })
    }

    /// `track` with the profile of each epoch given by its start time.
    fn track_with(
        units: usize,
        per_s: f64,
        seconds: f64,
        quota: u64,
        profile_at: impl Fn(f64) -> Arc<Profile>,
    ) -> (WindowTracker, Rounds) {
        let wl = &workload::scenario("gups-hotset", 1.0 / 32.0, seconds, 1).unwrap()[0];
        let model = MemoryModel::preset("cxl").unwrap();
        let mut tracker =
            WindowTracker::new(units, 2 << 20, WindowParams::default(), seed_of(1, 0));
        let mut rounds = Rounds::default();
        let mut t = 0.0;
        while t < seconds {
            let profile = profile_at(t);
            let v = EpochView {
                vm: VmId(0),
                wl,
                profile: &profile,
                accesses: per_s * 0.1,
                t0: t,
                t1: t + 0.1,
                unit_bytes: 2 << 20,
                model: &model,
                quota_bytes: quota * (2 << 20),
                host: None,
            };
            tracker.epoch(&v, &mut rounds).unwrap();
            t += 0.1;
        }
        (tracker, rounds)
    }

    #[test]
    fn a_hot_set_is_published_above_the_rest() {
        // 32 hot units of 256 at about 110 Hz a frame, the rest at about 1.7 Hz
        let (_, rounds) = track(256, 0..32, 0.9, 2e6, 60.0, 48);
        let (_, last) = rounds.0.last().unwrap();
        let hot: Vec<u8> = last.iter().filter(|e| e.0 < 32).map(|e| e.1).collect();
        let cold_max = last
            .iter()
            .filter(|e| e.0 >= 32)
            .map(|e| e.1)
            .max()
            .unwrap_or(0);
        assert_eq!(hot.len(), 32);
        assert!(
            hot.iter().all(|&l| l > cold_max + 16),
            "hot {hot:?}, cold up to {cold_max}"
        );
        // ~1.7 Hz: level 16 log2(1.7) + 96 = 108, within 2x
        assert!((92..=124).contains(&cold_max), "{cold_max}");
    }

    #[test]
    fn a_region_whose_frames_changed_flags_its_neighbours_unless_they_were_just_measured() {
        let (mut tracker, _) = track(256, 0..32, 0.9, 2e6, 5.0, 48);
        let burst = |regions: Vec<usize>| Burst {
            regions,
            m: 4,
            pass: 0,
            t_pass: [0; BURST_MAX_WINDOWS + 1],
            due: 0,
            cpu_ns: 0.0,
            wraps: false,
            seen: Vec::new(),
        };
        tracker.changed.iter_mut().for_each(|c| *c = 0.0);
        tracker.changed_pending = 0;
        let now_ms = (tracker.now / MS) as u32;
        for g in &mut tracker.regions {
            g.measured = true;
            g.last_burst_ms = now_ms.wrapping_sub(60_000);
        }
        // a fifth of 512 frames started over: no evidence of a moved hot set
        tracker.flag_neighbours(&burst(vec![10]), 10, 512.0, 100.0);
        assert_eq!(tracker.changed_pending, 0);
        // half of them: both neighbours, but not the one measured 2 s ago
        tracker.regions[9].last_burst_ms = now_ms.wrapping_sub(2_000);
        tracker.flag_neighbours(&burst(vec![10]), 10, 512.0, 256.0);
        assert_eq!(tracker.changed_pending, 1);
        assert!(tracker.changed[11] >= 0.5 && tracker.changed[9] < 0.5);
        // the first region has one neighbour; a sparse region is no evidence
        tracker.flag_neighbours(&burst(vec![0]), 0, 512.0, 512.0);
        assert!(tracker.changed[1] >= 0.5);
        tracker.flag_neighbours(&burst(vec![20]), 20, 32.0, 32.0);
        assert!(tracker.changed[21] < 0.5 && tracker.changed[19] < 0.5);
    }

    #[test]
    fn a_hot_set_that_moves_is_published_above_the_old_one_within_seconds() {
        // 16 GiB, a hot fifth (all of the quota) jumping to the next fifth at 60 s, the
        // background touching every frame a few times a second (seq-window's shape): rounds
        // are seconds apart, so the new hot set must come in an early round after change
        // detection found its regions risen, and outrank the old one there (15 s after the move
        // without change detection).
        let (units, w) = (8192, 1638);
        let before = hot_profile(units, 0..w, 0.95);
        let after = hot_profile(units, w..2 * w, 0.95);
        let (tracker, rounds) = track_with(units, 2.3e8, 70.0, w as u64, |t| {
            if t < 60.0 {
                before.clone()
            } else {
                after.clone()
            }
        });
        let median = |levels: &[(usize, u8)], r: std::ops::Range<usize>| {
            let mut l: Vec<u8> = levels
                .iter()
                .filter(|e| r.contains(&e.0))
                .map(|e| e.1)
                .collect();
            l.sort_unstable();
            l.get(l.len() / 2).copied().unwrap_or(0)
        };
        let crossed = rounds
            .0
            .iter()
            .find(|(t, l)| *t >= 60.0 && median(l, w..2 * w) > median(l, 0..w))
            .map(|(t, _)| t - 60.0);
        assert!(
            crossed.is_some_and(|s| s <= 6.0),
            "new hot set above the old one {crossed:?} s after the move"
        );
        assert!(
            tracker.early_rounds >= 1,
            "{} early rounds",
            tracker.early_rounds
        );
    }

    #[test]
    fn its_cpu_stays_within_the_budget_and_rounds_stretch_to_a_quarter_of_it() {
        // 32 GiB, every frame used a few times a second: its first sweep alone (~60 us a region)
        // is more work than 1% of a vCPU pays for in a minute.
        let secs = 60.0;
        let (tracker, rounds) = track(16384, 0..2048, 0.5, 8e7, secs, 3200);
        let budget = 0.01 * secs;
        // at most 10 ms banked and the last publication (~57 ms) beyond the budget
        let cpu = tracker.cpu_s;
        assert!(
            cpu <= budget + 0.07 && cpu >= 0.9 * budget,
            "{cpu} s of {budget}"
        );
        // publishing ~8 Mi frames costs ~57 ms (8 Mi slots counted and checked, 2 Mi entries
        // written): rounds stretch to seconds apart, so that publishing takes a quarter of the
        // budget at most (~23 s)
        let n = rounds.0.len();
        let gap = rounds.0[n - 1].0 - rounds.0[n - 2].0;
        assert!((3.0..=30.0).contains(&gap), "{gap} s between rounds");
    }

    #[test]
    fn a_region_is_published_from_its_coarse_rate_before_its_first_fine_burst() {
        // Every unit is used, but a busy region's first burst costs ~60 us of the budget: after
        // 20 s the cursor has measured only part of 16 GiB. The rest, the hot set at its end
        // among it, is published at its region's coarse rate shared among its frames, the hot
        // set above the others.
        let (tracker, rounds) = track(8192, 7168..8192, 0.5, 4e7, 20.0, 1600);
        let measured = tracker.regions.iter().filter(|r| r.measured).count();
        let (_, last) = rounds.0.last().unwrap();
        assert!(measured < 8192 / 2, "{measured} regions measured");
        let regions = &tracker.regions;
        let unmeasured = |hot: bool| {
            last.iter()
                .filter(move |&&(u, _)| !regions[u].measured && (u >= 7168) == hot)
                .map(|&(_, l)| l)
        };
        let (hot_min, hot_n) = (unmeasured(true).min(), unmeasured(true).count());
        let cold_max = unmeasured(false).max().unwrap_or(0);
        assert_eq!(
            hot_n, 1024,
            "every hot unit is published, none measured yet"
        );
        assert!(
            hot_min > Some(cold_max),
            "hot {hot_min:?}, cold up to {cold_max}"
        );
    }
}
