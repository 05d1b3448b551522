//! The guest module's fixed-point rate arithmetic, its own C (guest/module/vtism_rate.c,
//! compiled by build.rs), behind safe functions. Codes, Hz in Q32, windows and exposures in µs
//! mean what they mean there: a rate code is 64 per doubling, [`RC_1HZ`] = 1 Hz, 0 = none.
#![deny(clippy::undocumented_unsafe_blocks)]

use std::num::NonZeroU32;

/// Codes per doubling of the rate, the code of 1 Hz and the highest code (vtism_guest.h).
pub const RC_PER_OCTAVE: u32 = 64;
pub const RC_1HZ: u32 = 2048;
pub const RC_MAX: u32 = RC_1HZ + 16 * RC_PER_OCTAVE;

mod ffi {
    extern "C" {
        pub fn vt_hz_of_code(code: u32) -> u64;
        pub fn vt_code_of_hz(hz: u64, dither: u32) -> u32;
        pub fn vt_exposure(t_us: u64, w_us: u64, div: u32) -> u64;
        pub fn vt_rate_add(hz: u64, t_us: u64, w_us: u64, young: bool, div: u32) -> u64;
        pub fn vt_fast_code(w_us: u64) -> u32;
        pub fn vt_rise_code(w_us: u64, m: u32) -> u32;
        pub fn vt_fall_code(w_us: u64, m: u32) -> u32;
        pub fn vt_idle_codes(t_us: u64, w_us: u64, div: u32) -> i64;
        pub fn vt_code_moved(code: u32, d: i64, dither: u32) -> u32;
        pub fn vt_level_of_code(code: i64) -> u32;
        pub fn vt_share_code(region_code: u32, present: u32) -> u32;
        pub fn vt_published_code(
            code: u32,
            follow: i64,
            region_code: u32,
            wc_fast_code: u32,
            share: i64,
        ) -> i64;
        pub fn vt_change_lw(w_us: u64) -> i64;
        pub fn vt_change_step(
            code: u32,
            lw: i64,
            young: bool,
            dither: u32,
            down: *mut u16,
            up: *mut u16,
        ) -> i32;
    }
}

/// What came before weighs (div-1)/div less per window: the module's decay divisors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decay(NonZeroU32);

impl Decay {
    /// Coarse windows: two per period, 1/48 each (vtism_track.c VT_COARSE_DIV).
    pub const COARSE: Decay = Decay::new(48);
    /// Fine windows (VT_FINE_DIV).
    pub const FINE: Decay = Decay::new(8);
    const fn new(div: u32) -> Decay {
        match NonZeroU32::new(div) {
            Some(d) => Decay(d),
            None => panic!("a decay divisor is not zero"),
        }
    }
    fn get(self) -> u32 {
        self.0.get()
    }
}

/// Hz in Q32 of a rate code.
pub fn hz_of_code(code: u32) -> u64 {
    // SAFETY: pure integer arithmetic on its argument and static tables; every `unsigned int`
    // is valid input (codes above the scale saturate).
    unsafe { ffi::vt_hz_of_code(code) }
}

/// Rate code of Hz in Q32, rounded up with probability (fraction + dither % 1024) / 1024.
pub fn code_of_hz(hz: u64, dither: u32) -> u32 {
    // SAFETY: pure integer arithmetic; hz = 0 is handled before the logarithm.
    unsafe { ffi::vt_code_of_hz(hz, dither) }
}

/// The exposure after one more window of `w_us`.
pub fn exposure(t_us: u64, w_us: u64, div: Decay) -> u64 {
    // SAFETY: pure integer arithmetic; the only division is by `div`, which is not zero.
    unsafe { ffi::vt_exposure(t_us, w_us, div.get()) }
}

/// One window of `w_us`, young or not, averaged into a rate (Hz, Q32) seen through `t_us`.
pub fn rate_add(hz: u64, t_us: u64, w_us: u64, young: bool, div: Decay) -> u64 {
    // SAFETY: pure integer arithmetic; divisions are by `div` (not zero), by 10^6, by
    // max(td + w, 1) and by vt_share_of_x() of an x >= 2^-20, which is > 0.
    unsafe { ffi::vt_rate_add(hz, t_us, w_us, young, div.get()) }
}

/// The lowest rate code that is fast for a window of `w_us` (at least 4 accesses in it).
pub fn fast_code(w_us: u64) -> u32 {
    // SAFETY: pure integer arithmetic; the window is clamped to at least 1 µs before dividing.
    unsafe { ffi::vt_fast_code(w_us) }
}

/// The code below which a page young in all `m` windows of `w_us` has risen (under 1% of
/// bursts at that rate would see it so): it starts over from those windows.
pub fn rise_code(w_us: u64, m: u32) -> u32 {
    // SAFETY: pure integer arithmetic; the window is clamped to at least 1 µs before dividing
    // and `m` to the table's 1..=6.
    unsafe { ffi::vt_rise_code(w_us, m) }
}

/// The code from which a page idle in all `m` windows of `w_us` has fallen (under 1% of bursts
/// at that rate would see it so): it starts over from those windows and the long one.
pub fn fall_code(w_us: u64, m: u32) -> u32 {
    // SAFETY: pure integer arithmetic; the window and `m` are clamped to at least 1 before
    // dividing by their product.
    unsafe { ffi::vt_fall_code(w_us, m) }
}

/// What an idle window of `w_us` after `t_us` of exposure does to a code, in 1/1024 codes;
/// `i64::MIN` when nothing came before.
pub fn idle_codes(t_us: u64, w_us: u64, div: Decay) -> i64 {
    // SAFETY: pure integer arithmetic; the logarithms are of td + w and td, both > 0 there.
    unsafe { ffi::vt_idle_codes(t_us, w_us, div.get()) }
}

/// A code moved by `d` / 1024 codes (sums of [`idle_codes`]), rounded as [`code_of_hz`].
pub fn code_moved(code: u32, d: i64, dither: u32) -> u32 {
    // SAFETY: pure integer arithmetic; `d = i64::MIN` is tested before any sum.
    unsafe { ffi::vt_code_moved(code, d, dither) }
}

/// Channel v1.1 rate level of a code (16 per doubling, 96 = 1 Hz).
pub fn level_of_code(code: i64) -> u8 {
    // SAFETY: pure integer arithmetic on its argument.
    let l = unsafe { ffi::vt_level_of_code(code) };
    l.min(255) as u8
}

/// A region's rate code shared evenly among its `present` frames (rate / present): what its
/// frames are published at before their first burst; 0 when idle or none present.
pub fn share_code(region_code: u32, present: u32) -> u32 {
    // SAFETY: pure integer arithmetic; the logarithm is taken only of present > 0.
    unsafe { ffi::vt_share_code(region_code, present) }
}

/// The code a measured frame is published at: its `code` moved by `follow`, at most
/// `region_code` while that is below `wc_fast_code` (the rate fast for W_c), at least `share`
/// (the region's rate shared among its frames, [`share_code`]).
pub fn published_code(
    code: u32,
    follow: i64,
    region_code: u32,
    wc_fast_code: u32,
    share: i64,
) -> i64 {
    // SAFETY: pure integer arithmetic on its arguments; the callers' codes and follow are at
    // most a few thousand, far from overflowing.
    unsafe { ffi::vt_published_code(code, follow, region_code, wc_fast_code, share) }
}

/// Octaves a change alarm moves a rate by (VT_CHANGE_OCTAVES).
pub const CHANGE_OCTAVES: u32 = 2;

/// log2 of a window of `w_us` in seconds, Q16: [`change_step`]'s `lw`.
pub fn change_lw(w_us: u64) -> i64 {
    // SAFETY: pure integer arithmetic; the window is clamped to at least 1 µs before the
    // logarithm.
    unsafe { ffi::vt_change_lw(w_us) }
}

/// Change detection on a rate of `code` (vt_change_step): one window of `lw` ([`change_lw`]),
/// young or not, into the CUSUM sums `down` and `up` (1/1024 nat); -1 on a drop, +1 on a rise
/// (both sums cleared), else 0.
pub fn change_step(
    code: u32,
    lw: i64,
    young: bool,
    dither: u32,
    down: &mut u16,
    up: &mut u16,
) -> i32 {
    // SAFETY: pure integer arithmetic on its arguments; `down` and `up` are valid, exclusive
    // references for the call, which writes each once and keeps no pointer.
    unsafe { ffi::vt_change_step(code, lw, young, dither, down, up) }
}

/// Hz of a rate code, as a float (for tests and reports).
pub fn hz(code: u32) -> f64 {
    hz_of_code(code) as f64 / (1u64 << 32) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    // The expectations of guest/module/vtism_rate_test.c, on the code the simulator links.

    #[test]
    fn codes_round_trip_and_one_hz_is_level_96() {
        for c in 1408..=RC_MAX {
            assert_eq!(code_of_hz(hz_of_code(c), 512), c);
        }
        assert_eq!(level_of_code(RC_1HZ as i64), 96);
        assert_eq!(level_of_code((RC_1HZ - 6 * 64) as i64), 0);
        assert_eq!(code_of_hz(0, 512), 0);
        assert!((hz(RC_1HZ + 64) - 2.0).abs() < 1e-3);
    }

    #[test]
    fn a_first_young_window_is_one_access_in_it() {
        let c = code_of_hz(rate_add(0, 0, 30_000, true, Decay::FINE), 512);
        assert!((hz(c) - 1.0 / 0.03).abs() < 1.0, "{}", hz(c));
    }

    #[test]
    fn idle_windows_in_the_code_domain_match_the_update_within_one_code() {
        for c in (1500..=RC_MAX).step_by(5) {
            let (t, w) = (2_500_000, 300_000);
            let exact = code_of_hz(rate_add(hz_of_code(c), t, w, false, Decay::FINE), 512);
            let moved = code_moved(c, idle_codes(t, w, Decay::FINE), 512);
            assert!(
                (moved as i64 - exact as i64).abs() <= 1,
                "{c}: {moved} vs {exact}"
            );
        }
        assert_eq!(code_moved(3000, idle_codes(0, 30_000, Decay::FINE), 512), 0);
    }

    #[test]
    fn a_regions_rate_is_shared_among_its_present_frames() {
        let c = RC_1HZ + 5 * RC_PER_OCTAVE; // 32 Hz
        assert_eq!(share_code(c, 512), c - 9 * RC_PER_OCTAVE);
        assert_eq!(share_code(c, 1), c);
        assert!((hz(share_code(c, 100)) * 100.0 / hz(c) - 1.0).abs() < 0.02);
        assert_eq!(share_code(0, 512), 0);
        assert_eq!(share_code(c, 0), 0);
    }

    #[test]
    fn a_frame_is_published_within_its_regions_bounds() {
        let fast = fast_code(2000);
        assert_eq!(published_code(2300, 0, 2100, fast, 0), 2100);
        assert_eq!(published_code(2300, -300, 2100, fast, 0), 2000);
        assert_eq!(published_code(2300, 0, fast, fast, 0), 2300);
        // and no lower than its share of the region
        assert_eq!(published_code(1800, 128, 2900, fast, 2324), 2324);
        assert_eq!(published_code(2400, 0, 2900, fast, 2324), 2400);
    }

    #[test]
    fn a_rate_is_fast_for_a_window_from_four_accesses_in_it() {
        // 4 accesses in 200 ms: 20 Hz
        let c = fast_code(200_000);
        assert!((hz(c) / 20.0 - 1.0).abs() < 0.02, "{}", hz(c));
    }
}
