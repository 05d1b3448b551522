//! The module's rate estimates, as guest/module/vtism_track.c computes them: a region's coarse
//! rate per coarse window, a frame's fine rate per burst with HMM-V's do-not-disturb levels, how
//! far frames follow their region when published, and the window loops' step. The arithmetic is
//! the module's own C ([`crate::rate`]); this file is its caller, ported line for line, and
//! names the C function each part comes from.
//!
//! The simulator knows a window's Accessed bit as a probability, not a bit (mean field, as it
//! models every tracker): a rate becomes the expectation, in Hz, of the rates the module would
//! store for each outcome of the bits, rounded to a code as the module rounds ([`expected`]).
//! A probability of 0 or 1 is the module's own path for that bit, exactly.

use crate::rate::{self, Decay, RC_MAX, RC_PER_OCTAVE};

/// A frame's rate follows its region's down at once, up by at most 2 doublings (VT_FOLLOW_UP_MAX).
const FOLLOW_UP_MAX: i64 = 2 * RC_PER_OCTAVE as i64;
/// HMM-V's do-not-disturb time unit: level x is left alone for 0.6 s * 2^(x-1).
const DND_UNIT_MS: u64 = 600;
/// Bursts a frame sits out at most (the 4-bit VT_F_SKIP field).
const SKIP_MAX: u64 = 15;
/// Burst young bits: bit j-1 = window j; the long window since the last burst.
pub const BY_LONG: u8 = 1 << 7;

/// What a region's table entry holds (struct vt_region) that the estimates use.
#[derive(Clone, Debug, Default)]
pub struct Region {
    /// Coarse rate code, and the code when its frames were last measured.
    pub code: u32,
    pub code_then: u32,
    /// Decayed exposure of its coarse windows (all, short only) and fine windows (all, short).
    pub ct_us: u32,
    pub cs_us: u32,
    pub ft_us: u32,
    pub fs_us: u32,
    pub last_read_ms: u32,
    pub last_burst_ms: u32,
    /// 4 KiB frames present at its last burst, or at the PTE read before its first.
    pub present: u32,
    /// Has had a coarse read (VT_R_READ), a fine burst (VT_R_MEASURED); young in its last short
    /// coarse window (VT_R_YOUNG); frames sat out its last burst with their bits set.
    pub read: bool,
    pub measured: bool,
    /// Has frame words (r->frames): read when first seen young before its first burst
    /// (vt_coarse_frames), or allocated by that burst.
    pub frames: bool,
    pub young: bool,
    pub uncleared: bool,
    /// Change detection's sums on `code` (vt_change_step), 1/1024 nat.
    pub cdown: u16,
    pub cup: u16,
}

/// A frame word (VT_F_*): rate code, do-not-disturb level, bursts still sat out.
#[derive(Clone, Copy, Debug, Default)]
pub struct Frame {
    pub code: u32,
    pub dnd: u8,
    pub skip: u8,
    pub present: bool,
    pub write: bool,
    /// Sat out the last burst: its Accessed bit was left set.
    pub uncleared: bool,
}

/// The arithmetic a window took, as shares of the region (for its cost): the young update
/// (vt_rate_add and the code conversions), and the idle step, computed (vt_idle_codes) or
/// shared with the previous region of the pass.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Arith {
    pub young: f64,
    pub idle: f64,
    pub idle_computed: bool,
    /// A short window's change-detection step (vt_change_step): probability it was young.
    pub change: Option<f64>,
    /// Probability that the step found the rate risen (an alarm upwards).
    pub risen: f64,
    /// Probability that it found the rate changed, either way.
    pub changed: f64,
}

/// The module's xorshift32 that dithers code rounding (vt_dither).
#[derive(Clone, Debug)]
pub struct Dither(u32);

impl Dither {
    pub fn new(seed: u64) -> Dither {
        Dither((seed as u32 ^ (seed >> 32) as u32) | 1)
    }
    pub fn next(&mut self) -> u32 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        self.0 = x;
        x
    }
}

/// The code of the expected rate over `outcomes` (probability, the code the module would store):
/// the outcome itself when it is certain.
pub fn expected(outcomes: impl IntoIterator<Item = (f64, u32)>, dither: &mut Dither) -> u32 {
    let mut hz = 0.0;
    for (p, code) in outcomes {
        if p >= 1.0 {
            return code;
        }
        hz += p * rate::hz_of_code(code) as f64;
    }
    rate::code_of_hz(hz.round() as u64, dither.next())
}

/// The tracker-wide state of coarse estimates (struct vt_tracker: rng, cfast_*, idle_*).
#[derive(Clone, Debug)]
pub struct Coarse {
    pub dither: Dither,
    fast_period_ms: u64,
    fast_code: u32,
    idle_t: u64,
    idle_w: u64,
    idle_d: i64,
    change_w: u64,
    change_lw: i64,
}

impl Coarse {
    pub fn new(seed: u64) -> Coarse {
        Coarse {
            dither: Dither::new(seed),
            fast_period_ms: 0,
            fast_code: 0,
            idle_t: u64::MAX,
            idle_w: u64::MAX,
            idle_d: 0,
            change_w: 0,
            change_lw: 0,
        }
    }

    /// vt_coarse_fast_code: the rate fast for a coarse period.
    fn fast_code(&mut self, period_ms: u64) -> u32 {
        if period_ms != self.fast_period_ms {
            self.fast_period_ms = period_ms;
            self.fast_code = rate::fast_code(period_ms * 1000);
        }
        self.fast_code
    }

    /// vt_region_window: one coarse window of `w_us`, young with probability `p`, averaged into
    /// the region's rate; `long_w`: the one since the last read. A short window also feeds
    /// change detection: each outcome takes its own step of the sums from the same start (and
    /// its alarm moves that outcome's code), and the sums become their expectation, rounded as
    /// codes are.
    pub fn window(
        &mut self,
        r: &mut Region,
        period_ms: u64,
        w_us: u64,
        p: f64,
        long_w: bool,
    ) -> Arith {
        let fast = r.code >= self.fast_code(period_ms);
        let t = if fast { r.cs_us } else { r.ct_us } as u64;
        let dither = self.dither.next();
        let mut a = Arith::default();
        let (mut young_sums, mut idle_sums) = ((r.cdown, r.cup), (r.cdown, r.cup));
        let (mut young_change, mut idle_change) = (0, 0);
        if !long_w {
            if w_us != self.change_w {
                self.change_w = w_us;
                self.change_lw = rate::change_lw(w_us);
            }
            a.change = Some(p);
            let (lw, d) = (self.change_lw, self.dither.next());
            let (yd, yu) = &mut young_sums;
            young_change = rate::change_step(r.code, lw, true, d, yd, yu);
            let (id, iu) = &mut idle_sums;
            idle_change = rate::change_step(r.code, lw, false, d, id, iu);
        }
        // a fast region's young long window says nothing: the rate stays
        let young = if fast && long_w {
            r.code
        } else {
            a.young = p;
            let hz = rate::rate_add(rate::hz_of_code(r.code), t, w_us, true, Decay::COARSE);
            rate::code_of_hz(hz, dither)
        };
        let idle = if r.code == 0 || p >= 1.0 {
            0
        } else {
            a.idle = 1.0 - p;
            if t != self.idle_t || w_us != self.idle_w {
                self.idle_t = t;
                self.idle_w = w_us;
                self.idle_d = rate::idle_codes(t, w_us, Decay::COARSE);
                a.idle_computed = true;
            }
            rate::code_moved(r.code, self.idle_d, dither)
        };
        a.risen = p * (young_change > 0) as u8 as f64 + (1.0 - p) * (idle_change > 0) as u8 as f64;
        a.changed =
            p * (young_change != 0) as u8 as f64 + (1.0 - p) * (idle_change != 0) as u8 as f64;
        let young = self.changed(young, young_change);
        let idle = self.changed(idle, idle_change);
        r.code = expected([(p, young), (1.0 - p, idle)], &mut self.dither);
        if !long_w {
            r.cdown = self.expected_sum(p, young_sums.0, idle_sums.0);
            r.cup = self.expected_sum(p, young_sums.1, idle_sums.1);
        }
        r.ct_us = sat_u32(rate::exposure(r.ct_us as u64, w_us, Decay::COARSE));
        if !long_w {
            r.cs_us = sat_u32(rate::exposure(r.cs_us as u64, w_us, Decay::COARSE));
        }
        a
    }

    /// A code moved by a change alarm's factor (vt_region_window).
    fn changed(&mut self, code: u32, change: i32) -> u32 {
        if change == 0 {
            return code;
        }
        let d = change as i64 * (((rate::CHANGE_OCTAVES * RC_PER_OCTAVE) as i64) << 10);
        rate::code_moved(code, d, self.dither.next())
    }

    /// A change-detection sum's expectation over the window's two outcomes, rounded up with
    /// probability its fraction (the module's sums are integers).
    fn expected_sum(&mut self, p: f64, young: u16, idle: u16) -> u16 {
        if p >= 1.0 {
            return young;
        }
        if p <= 0.0 {
            return idle;
        }
        let e = p * young as f64 + (1.0 - p) * idle as f64;
        let frac = (self.dither.next() & 1023) as f64 / 1024.0;
        (e + frac).floor().min(u16::MAX as f64) as u16
    }

    /// vt_coarse_observe, clearing pass: the window since the last read.
    pub fn observe_clear(&mut self, r: &mut Region, period_ms: u64, now_ms: u32, p: f64) -> Arith {
        if !r.read {
            return Arith::default();
        }
        let l = now_ms.wrapping_sub(r.last_read_ms);
        if l == 0 {
            return Arith::default();
        }
        self.window(r, period_ms, l as u64 * 1000, p, true)
    }

    /// vt_coarse_observe, reading pass: the short window of `wc_eff_us`. The region counts as
    /// young (VT_R_YOUNG) when more likely so than not.
    pub fn observe_read(
        &mut self,
        r: &mut Region,
        period_ms: u64,
        now_ms: u32,
        wc_eff_us: u64,
        p: f64,
    ) -> Arith {
        let a = self.window(r, period_ms, wc_eff_us.max(1), p, false);
        r.last_read_ms = now_ms;
        r.read = true;
        r.young = p >= 0.5;
        a
    }
}

fn sat_u32(x: u64) -> u32 {
    x.min(u32::MAX as u64) as u32
}

/// floor(sqrt(x)), the kernel's int_sqrt.
fn int_sqrt(x: u64) -> u64 {
    let mut s = (x as f64).sqrt() as u64;
    while s * s > x {
        s -= 1;
    }
    while (s + 1) * (s + 1) <= x {
        s += 1;
    }
    s
}

/// vt_adapt: DAMON's interval auto-tuning step toward `goal_ppm` young of `n`, at most halving
/// or doubling, within [lo, hi].
pub fn adapt(w: u64, n: u64, young: u64, goal_ppm: u64, lo: u64, hi: u64) -> u64 {
    if n == 0 {
        return w;
    }
    let goal_q16 = ((n * goal_ppm) << 16) / 1_000_000;
    // sqrt of goal / young in Q16 is the step in Q8; none young: double
    let f = goal_q16
        .checked_div(young)
        .map_or(512, |q| int_sqrt(q).clamp(128, 512));
    ((w * f) >> 8).clamp(lo, hi)
}

/// vt_update_goal: the share of frames (regions) the windows aim to see young, ppm.
pub fn goal_ppm(access_goal_bp: u64, fast_quota_bytes: u64, tracked_frames: u64) -> u64 {
    if access_goal_bp > 0 {
        access_goal_bp.min(10_000) * 100
    } else if fast_quota_bytes > 0 && tracked_frames > 0 {
        ((fast_quota_bytes >> 12) * 1_000_000 / tracked_frames).clamp(10_000, 500_000)
    } else {
        40_000
    }
}

/// vt_interval_ms: the seed's interval before the next fine sweep, for a sweep of `ts_us` CPU.
pub fn sweep_interval_ms(k: u64, kb: u64, base_ms: u64, cap_ms: u64, ts_us: u64) -> u64 {
    let t = match (
        k.checked_mul(ts_us).and_then(|a| a.checked_mul(ts_us)),
        kb.checked_mul(ts_us),
    ) {
        (Some(a), Some(b)) => (a / 1000 + b) / 1000 + base_ms,
        _ => u64::MAX,
    };
    if cap_ms > 0 {
        t.min(cap_ms)
    } else {
        t
    }
}

/// struct vt_burst_windows: the windows of one region's burst, the long one since its last
/// burst (if it had one) then `m` of `w_us`, and what they do to a rate that saw nothing.
#[derive(Clone, Debug)]
pub struct BurstWindows {
    pub m: usize,
    pub has_long: bool,
    pub long_us: u64,
    pub w_us: u64,
    /// Exposure before window i (0: the long one), and after the last.
    pub t: [u64; 8],
    pub idle: i64,
    pub fast_code: u32,
    pub s0: u64,
    pub s1: u64,
    pub s_end: u64,
    pub idle_fast: i64,
    pub interval_ms: u64,
    /// When its last pass started: the burst's end.
    pub end_ns: u64,
    /// Below it, a frame young in all `m` windows has risen (vt_rise_code).
    pub rise_code: u32,
    /// From it, a frame idle in all `m` windows has fallen (vt_fall_code).
    pub fall_code: u32,
}

/// vt_shift: what a burst's windows say about a frame's rate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shift {
    Steady,
    Risen,
    Fallen,
}

/// vt_short_idle: codes an unseen rate moves by through `m` short windows from exposure `t`.
fn short_idle(t: &mut u64, w_us: u64, m: usize, mut idle: i64) -> i64 {
    for _ in 0..m {
        let d = rate::idle_codes(*t, w_us, Decay::FINE);
        idle = if d == i64::MIN || idle == i64::MIN {
            i64::MIN
        } else {
            idle + d
        };
        *t = rate::exposure(*t, w_us, Decay::FINE);
    }
    idle
}

impl BurstWindows {
    /// vt_burst_windows_init, for a burst whose passes started at `t_pass_ns[0..=m]`. The
    /// module takes off the windows what its thread ran meanwhile (vt_burst_window_us): the
    /// simulated workload loses no time to the tracker, so nothing is taken off here.
    pub fn new(t_pass_ns: &[u64], r: &Region, sweep_gap_ms: u64) -> BurstWindows {
        let m = t_pass_ns.len() - 1;
        let w_us = ((t_pass_ns[m] - t_pass_ns[0]) / (m as u64 * 1000)).max(1);
        let has_long = r.measured;
        let long_us = if has_long {
            ((t_pass_ns[0] / 1_000_000) as u32).wrapping_sub(r.last_burst_ms) as u64 * 1000
        } else {
            0
        };
        let ft = r.ft_us as u64;
        let fs = r.fs_us as u64;
        let mut t = [0u64; 8];
        t[0] = ft;
        t[1] = if has_long {
            rate::exposure(ft, long_us, Decay::FINE)
        } else {
            ft
        };
        let idle0 = if has_long {
            rate::idle_codes(ft, long_us, Decay::FINE)
        } else {
            0
        };
        let mut tt = t[1];
        let idle = short_idle(&mut tt, w_us, m, idle0);
        for j in 1..m {
            t[j + 1] = rate::exposure(t[j], w_us, Decay::FINE);
        }
        t[m + 1] = tt;
        let s1 = if has_long {
            rate::exposure(fs, long_us, Decay::FINE)
        } else {
            fs
        };
        let mut ts = s1;
        let idle_fast = short_idle(
            &mut ts,
            w_us,
            m,
            if has_long {
                rate::idle_codes(fs, long_us, Decay::FINE)
            } else {
                0
            },
        );
        let mut s_end = fs;
        for _ in 0..m {
            s_end = rate::exposure(s_end, w_us, Decay::FINE);
        }
        BurstWindows {
            m,
            has_long,
            long_us,
            w_us,
            t,
            idle,
            fast_code: if has_long {
                rate::fast_code(long_us)
            } else {
                RC_MAX + 1
            },
            s0: fs,
            s1,
            s_end,
            idle_fast,
            interval_ms: if has_long {
                long_us / 1000
            } else {
                sweep_gap_ms
            },
            end_ns: t_pass_ns[m],
            rise_code: rate::rise_code(w_us, m as u32),
            fall_code: rate::fall_code(w_us, m as u32),
        }
    }

    /// vt_frame_shift: young in every short window, or idle in every one, which its rate says
    /// is improbable.
    fn shift(&self, code: u32, y: u8) -> Shift {
        let all = ((1u32 << self.m) - 1) as u8;
        if code < self.rise_code && y & all == all {
            Shift::Risen
        } else if code >= self.fall_code && y & all == 0 {
            Shift::Fallen
        } else {
            Shift::Steady
        }
    }

    /// vt_frame_rate: a frame's rate code through the burst's windows; `y`: its young bits. A
    /// frame whose rate changed starts over: a risen one from the short windows, a fallen one
    /// from the long window too.
    pub fn frame_rate(&self, code: u32, y: u8, first: bool, long_valid: bool, dither: u32) -> u32 {
        let m = self.m;
        let shift = if first {
            Shift::Steady
        } else {
            self.shift(code, y)
        };
        let restart = first || shift != Shift::Steady;
        let fast = !restart && code >= self.fast_code;
        let y = y & (((1u32 << m) - 1) as u8 | BY_LONG);
        if !restart && y == 0 {
            return rate::code_moved(code, if fast { self.idle_fast } else { self.idle }, dither);
        }
        let mut hz = if restart { 0 } else { rate::hz_of_code(code) };
        let mut t = if restart {
            0
        } else if fast {
            self.s0
        } else {
            self.t[0]
        };
        // a bit left set by do-not-disturb says nothing about the long window, nor does a young
        // one to a fast rate
        if (!restart || shift == Shift::Fallen)
            && self.has_long
            && long_valid
            && !(fast && y & BY_LONG != 0)
        {
            hz = rate::rate_add(hz, t, self.long_us, y & BY_LONG != 0, Decay::FINE);
            t = if restart {
                rate::exposure(0, self.long_us, Decay::FINE)
            } else if fast {
                self.s1
            } else {
                self.t[1]
            };
        }
        for j in 0..m {
            hz = rate::rate_add(hz, t, self.w_us, y & (1 << j) != 0, Decay::FINE);
            t = rate::exposure(t, self.w_us, Decay::FINE);
        }
        rate::code_of_hz(hz, dither)
    }

    /// vt_frame_land: a measured frame's new rate and do-not-disturb level. `p[0]`: the
    /// probability that its long window saw it young, `p[j]`: its window j; the new code is the
    /// expectation over the young bits of what vt_frame_rate() stores, and the level goes up
    /// when young in at least half the windows is the likelier case. Returns the expected young
    /// windows, the probability that the full rate update ran (not only a code move) and the
    /// probability that the frame started over (its rate risen or fallen).
    pub fn land(
        &self,
        f: &mut Frame,
        p: &[f64],
        first: bool,
        dither: &mut Dither,
        dnd_max: u8,
    ) -> (f64, f64, f64) {
        let m = self.m;
        let max = dnd_max.min(7);
        let d = dither.next();
        let mut outcomes = Vec::with_capacity(1 << (m + 1));
        let (mut p_up, mut p_none, mut p_shift) = (0.0, 0.0, 0.0);
        for bits in 0..1u32 << (m + 1) {
            let prob = (0..=m).fold(1.0, |q, j| {
                // bit m of the pattern is the long window
                let w = if j == m { 0 } else { j + 1 };
                if bits & (1 << j) != 0 {
                    q * p[w]
                } else {
                    q * (1.0 - p[w])
                }
            });
            if prob == 0.0 {
                continue;
            }
            let short = (bits & ((1 << m) - 1)) as u8;
            let y = short | if bits & (1 << m) != 0 { BY_LONG } else { 0 };
            outcomes.push((prob, self.frame_rate(f.code, y, first, !f.uncleared, d)));
            if 2 * short.count_ones() as usize >= m {
                p_up += prob;
            }
            if y == 0 {
                p_none += prob;
            }
            if !first && self.shift(f.code, y) != Shift::Steady {
                p_shift += prob;
            }
        }
        let mut dnd = f.dnd;
        let mut skip = 0;
        if max > 0 && p_up >= 0.5 {
            dnd = (dnd + 1).min(max);
            skip = (DND_UNIT_MS << (dnd - 1))
                .checked_div(self.interval_ms)
                .map_or(0, |s| s.min(SKIP_MAX) as u8);
        } else {
            dnd = dnd.saturating_sub(1);
        }
        f.code = expected(outcomes, dither);
        f.dnd = dnd;
        f.skip = skip;
        f.uncleared = false;
        let young_w = p[1..=m].iter().sum();
        (young_w, if first { 1.0 } else { 1.0 - p_none }, p_shift)
    }
}

/// vt_follow: how far a region's frames follow it since they were measured, in codes; None
/// when the region's rate is nil (its frames are not published).
pub fn follow(r: &Region) -> Option<i64> {
    if r.code == 0 {
        return None;
    }
    if r.code_then == 0 {
        return Some(FOLLOW_UP_MAX);
    }
    Some((r.code as i64 - r.code_then as i64).min(FOLLOW_UP_MAX))
}

/// The channel level a measured frame of rate `code` is published at (vt_pub_pass,
/// vt_published_code, vt_pub_one): moved by `follow`, at most its region's `region_code` while
/// that is below `wc_fast` (the rate fast for W_c), at least the region's `share`; 0 when not
/// published.
pub fn published_level(code: u32, follow: i64, region_code: u32, wc_fast: u32, share: i64) -> u8 {
    level(rate::published_code(
        code,
        follow,
        region_code,
        wc_fast,
        share,
    ))
}

/// The level of a code (vt_pub_one): 0 for none.
pub fn level(code: i64) -> u8 {
    if code > 0 {
        rate::level_of_code(code)
    } else {
        0
    }
}

/// What landing a region's burst did: frame-windows young and seen (for W_f's loop), and how
/// many frames took the full rate update or only a code move (for the cost), expected.
#[derive(Clone, Copy, Debug, Default)]
pub struct Landing {
    pub young_w: f64,
    pub seen_w: f64,
    pub rated: f64,
    pub moved: f64,
    /// Frames (units) that started over, risen or fallen, expected.
    pub shifted: f64,
}

/// What a burst's passes saw of a frame: the probability that each window found it young
/// (0: the long window since its last burst), whether it sat the burst out, Dirty.
#[derive(Clone, Copy, Debug, Default)]
pub struct FrameSeen {
    pub p: [f64; 8],
    pub dnd: bool,
    pub dirty: bool,
}

impl BurstWindows {
    /// vt_burst_land_region for a region of PTEs whose frames are all present: average the
    /// burst's windows into their rates, move their do-not-disturb levels.
    pub fn land_region(
        &self,
        r: &mut Region,
        frames: &mut [Frame],
        seen: &[FrameSeen],
        present: u32,
        dither: &mut Dither,
        dnd_max: u8,
    ) -> Landing {
        let bw = self;
        let m = bw.m as f64;
        let mut l = Landing::default();
        let mut uncleared = false;
        let measured = r.measured;
        for (f, o) in frames.iter_mut().zip(seen) {
            // frames read before the first burst (vt_coarse_frames) have no rate yet
            let first = !f.present || !measured;
            if first {
                // a frame read before the first burst keeps the Dirty it showed
                *f = Frame {
                    write: f.write,
                    ..Frame::default()
                };
            }
            f.present = true;
            // Dirty is read, never cleared: sticky
            f.write |= o.dirty;
            if o.dnd {
                // sat this burst out: counts as young in every window
                f.skip = f.skip.saturating_sub(1);
                f.uncleared = true;
                uncleared = true;
                l.young_w += m;
            } else {
                let (young_w, rated, shifted) = bw.land(f, &o.p[..=bw.m], first, dither, dnd_max);
                l.shifted += shifted;
                l.young_w += young_w;
                l.rated += rated;
                l.moved += 1.0 - rated;
            }
            l.seen_w += m;
        }
        r.uncleared = uncleared;
        r.ft_us = sat_u32(bw.t[bw.m + 1]);
        r.fs_us = sat_u32(bw.s_end);
        r.present = present;
        r.code_then = r.code;
        r.last_burst_ms = (bw.end_ns / 1_000_000) as u32;
        r.measured = true;
        l
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rate::{hz, RC_1HZ};
    use vtism_engine::synth::Rng;

    const PERIOD_MS: u64 = 200;

    /// One coarse period of the module: the window since the last read (198 ms), then W_c (2 ms);
    /// `hz`: the region's accesses per second.
    fn period(c: &mut Coarse, r: &mut Region, now_ms: &mut u32, rate_hz: f64) {
        let p = |w_s: f64| 1.0 - (-rate_hz * w_s).exp();
        *now_ms += 198;
        c.observe_clear(r, PERIOD_MS, *now_ms, p(0.198));
        *now_ms += 2;
        c.observe_read(r, PERIOD_MS, *now_ms, 2000, p(0.002));
    }

    #[test]
    fn a_region_that_stops_being_used_cools_with_a_half_life_of_about_3_3_s() {
        // Exposure decays by 1/48 per window, two windows per 200 ms period: a memory of 4.8 s,
        // so an idle period scales a rate by about 4.7 / 4.9 (docs/guest.md, "Rates"). The
        // design's share of young windows fell by 1/4 a window instead: cooled within a second.
        let mut c = Coarse::new(7);
        let mut r = Region::default();
        let mut now = 0;
        for _ in 0..600 {
            period(&mut c, &mut r, &mut now, 2.0);
        }
        let before = r.code;
        assert!((hz(before) / 2.0).log2().abs() < 0.25, "{} Hz", hz(before));
        let mut periods = 0;
        while r.code > before - RC_PER_OCTAVE {
            period(&mut c, &mut r, &mut now, 0.0);
            periods += 1;
        }
        let half_life_s = periods as f64 * 0.2;
        assert!((3.0..=3.7).contains(&half_life_s), "{half_life_s} s");
    }

    #[test]
    fn a_fast_regions_young_long_window_is_left_out_and_an_idle_one_counts() {
        let mut c = Coarse::new(1);
        let mut r = Region::default();
        let mut now = 0;
        for _ in 0..300 {
            period(&mut c, &mut r, &mut now, 200.0);
        }
        assert!(r.code >= rate::fast_code(PERIOD_MS * 1000));
        let code = r.code;
        now += 198;
        assert_eq!(
            c.observe_clear(&mut r, PERIOD_MS, now, 1.0),
            Arith::default()
        );
        assert_eq!(r.code, code);
        now += 198;
        let a = c.observe_clear(&mut r, PERIOD_MS, now, 0.0);
        assert_eq!(a.idle, 1.0);
        // its prior is the short windows' exposure only: 198 ms idle against ~96 ms of them
        assert!(r.code + RC_PER_OCTAVE < code, "{} -> {}", code, r.code);
    }

    #[test]
    fn an_expected_bit_lands_between_the_modules_two_outcomes() {
        let run = |p: f64| {
            let mut c = Coarse::new(3);
            let mut r = Region {
                code: RC_1HZ,
                ct_us: 4_800_000,
                cs_us: 96_000,
                read: true,
                ..Region::default()
            };
            c.observe_read(&mut r, PERIOD_MS, 200, 50_000, p);
            r.code
        };
        let (idle, young, half) = (run(0.0), run(1.0), run(0.5));
        assert!(idle < RC_1HZ && young > RC_1HZ, "{idle} {young}");
        assert!(half > idle && half < young, "{idle} {half} {young}");
        // a whole bit is the module's path: the same code whatever the rounding draws
        assert_eq!(run(1.0), young);
    }

    /// A region's bursts: windows of `w_ms` after gaps of `gap_ms` since the last one ended.
    struct Bursts {
        r: Region,
        f: Frame,
        dither: Dither,
        end_ms: u64,
    }

    impl Bursts {
        fn new() -> Bursts {
            Bursts {
                r: Region::default(),
                f: Frame::default(),
                dither: Dither::new(11),
                end_ms: 0,
            }
        }
        fn burst(&mut self, gap_ms: u64, w_ms: u64, p: [f64; 5]) -> Landing {
            let t0 = self.end_ms + gap_ms;
            let t_pass: Vec<u64> = (0..5).map(|j| (t0 + j * w_ms) * 1_000_000).collect();
            self.end_ms = t0 + 4 * w_ms;
            let bw = BurstWindows::new(&t_pass, &self.r, 0);
            let mut seen = FrameSeen::default();
            seen.p[..5].copy_from_slice(&p);
            let mut f = [self.f];
            let l = bw.land_region(&mut self.r, &mut f, &[seen], 512, &mut self.dither, 7);
            self.f = f[0];
            l
        }
    }

    #[test]
    fn a_frames_first_young_window_is_one_access_over_its_decayed_exposure() {
        // One access in the first of four 30 ms windows: counted 1, decayed by 7/8 per later
        // window, over exposure t' = 7/8 t + 30 ms.
        let mut b = Bursts::new();
        let l = b.burst(0, 30, [0.0, 1.0, 0.0, 0.0, 0.0]);
        let (mut t, mut acc) = (0.0, 0.0);
        for j in 0..4 {
            acc = acc * 7.0 / 8.0 + if j == 0 { 1.0 } else { 0.0 };
            t = t * 7.0 / 8.0 + 0.03;
        }
        let want = acc / t;
        assert!(
            (hz(b.f.code) / want - 1.0).abs() < 0.02,
            "{} vs {want}",
            hz(b.f.code)
        );
        assert_eq!((l.young_w, l.seen_w, l.rated), (1.0, 4.0, 1.0));
        assert_eq!(b.f.dnd, 0);
    }

    #[test]
    fn a_frame_young_in_half_its_windows_goes_up_a_level_and_sits_out_bursts() {
        let mut b = Bursts::new();
        b.burst(0, 30, [0.0, 1.0, 1.0, 0.0, 0.0]);
        assert_eq!((b.f.dnd, b.f.skip), (1, 0)); // no gap known yet: sits out nothing
        b.burst(100, 30, [1.0, 1.0, 1.0, 1.0, 1.0]);
        // level 2: 1.2 s undisturbed, bursts 100 ms apart: 12 of them
        assert_eq!((b.f.dnd, b.f.skip), (2, 12));
        b.burst(100, 30, [0.0, 1.0, 0.0, 0.0, 0.0]);
        assert_eq!((b.f.dnd, b.f.skip), (1, 0));
    }

    #[test]
    fn a_frame_idle_in_every_window_where_its_rate_expects_accesses_starts_over() {
        // Young in every 437 ms window for a while: several Hz at least. Then a burst that sees
        // it only in the 1 s before: it falls to about that access over the burst's time.
        let mut b = Bursts::new();
        for _ in 0..20 {
            b.burst(1000, 437, [1.0; 5]);
        }
        assert!(hz(b.f.code) > 4.0, "{}", hz(b.f.code));
        b.burst(1000, 437, [1.0, 0.0, 0.0, 0.0, 0.0]);
        assert!(hz(b.f.code) < 1.0, "{}", hz(b.f.code));
    }

    /// vtism_rate_test.c's moved(): a page settled at `from_hz` under bursts of a young long
    /// window of `gap_s` and four of 40 ms, then at `true_hz` for `bursts`; its rate after them.
    fn moved(from_hz: f64, true_hz: f64, gap_s: f64, bursts: usize, seed: u64) -> f64 {
        let mut rng = Rng::new(seed);
        let mut b = Bursts::new();
        for i in 0..200 + bursts {
            let r = if i < 200 { from_hz } else { true_hz };
            let mut p = [1.0; 5];
            for x in &mut p[1..] {
                *x = rng.chance(1.0 - (-r * 0.04).exp()) as u8 as f64;
            }
            b.burst((gap_s * 1000.0) as u64, 40, p);
        }
        hz(b.f.code)
    }

    #[test]
    fn old_and_new_hot_frames_cross_within_five_bursts_under_a_warm_background() {
        // The C test's expectations, through this port of vt_frame_rate and the burst's
        // exposures: geometric means of 20 seeds.
        for gap_s in [5.0, 30.0] {
            let mean = |from, to, seed0: u64| {
                (0..20u64)
                    .map(|k| moved(from, to, gap_s, 5, seed0 + k).log2())
                    .sum::<f64>()
                    / 20.0
            };
            let (down, up) = (mean(60.0, 2.0, 100).exp2(), mean(2.0, 60.0, 200).exp2());
            assert!(down < up, "gap {gap_s}: old {down} new {up}");
            assert!(up > 20.0, "gap {gap_s}: new {up}");
        }
    }

    #[test]
    fn the_window_step_at_most_halves_or_doubles_within_bounds() {
        // goal 20% of 100: 20 young; 80 young: sqrt(1/4) = 0.5; none young: doubles
        assert_eq!(adapt(1000, 100, 80, 200_000, 10, 10_000), 500);
        assert_eq!(adapt(1000, 100, 0, 200_000, 10, 10_000), 2000);
        assert_eq!(adapt(1000, 100, 20, 200_000, 10, 10_000), 1000);
        assert_eq!(adapt(1000, 100, 100, 200_000, 900, 10_000), 900);
        assert_eq!(adapt(1000, 0, 0, 200_000, 10, 10_000), 1000);
    }

    #[test]
    fn the_goal_is_the_quota_share_of_tracked_frames_and_the_seed_bounds_sweeps() {
        assert_eq!(goal_ppm(0, 1 << 30, 1 << 20), 250_000);
        assert_eq!(goal_ppm(0, 1 << 30, 1 << 30), 10_000);
        assert_eq!(goal_ppm(0, 0, 1 << 20), 40_000);
        assert_eq!(goal_ppm(300, 1 << 30, 1 << 20), 30_000);
        // docs/guest.md "Cost": a sweep of 330 ms CPU, (8 * 330 + 50) * 330 + 2500 ms, capped
        assert_eq!(sweep_interval_ms(8, 50, 2500, 0, 330_000), 890_200);
        assert_eq!(sweep_interval_ms(8, 50, 2500, 300_000, 330_000), 300_000);
    }

    #[test]
    fn frames_follow_their_region_down_at_once_and_up_by_at_most_4x() {
        let r = |code, then| Region {
            code,
            code_then: then,
            ..Region::default()
        };
        assert_eq!(follow(&r(2000, 2300)), Some(-300));
        assert_eq!(follow(&r(2500, 2100)), Some(128));
        assert_eq!(follow(&r(2500, 0)), Some(128));
        assert_eq!(follow(&r(0, 2100)), None);
        let fast = rate::fast_code(2000);
        assert_eq!(published_level(RC_1HZ, 0, fast, fast, 0), 96);
        assert_eq!(published_level(RC_1HZ, 64, fast, fast, 0), 112);
        assert_eq!(published_level(0, 64, fast, fast, 0), 0);
        // at most the region's rate while W_c tells it, at least its share
        assert_eq!(published_level(RC_1HZ, 64, RC_1HZ + 32, fast, 0), 104);
        assert_eq!(published_level(0, 64, fast, fast, RC_1HZ as i64), 96);
    }
}
