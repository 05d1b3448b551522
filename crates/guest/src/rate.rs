//! From DAMON's samples to access rates (docs/guest.md, "Rates from DAMON's samples").
//!
//! Every sampling interval S DAMON checks, per region, whether the page at one random address of
//! the region was used since the previous check: one observation window of length S per region
//! and sample. A region's `nr_accesses` out of the aggregation's samples is therefore a share of
//! young windows, and for Poisson accesses at rate λ a window is young with probability
//! `1 - exp(-λ·S)`: λ = `-ln(1 - share) / S`. The agent keeps, per frame, a decayed share of the
//! windows of the regions it lay in, with the tracker's time constants (docs/guest.md).

/// Shares are kept below this, so a rate stays finite: at most `ln 256 / S` (5.5 / S).
pub const SHARE_MAX: f64 = 1.0 - 1.0 / 256.0;

/// The weight of one observation window, up and down alike. The design's coarse rule (1/24
/// up, 1/4 down) ranks hot regions, but applied to a frame's windows it biases the rate of a
/// frame used at an intermediate rate far down: in the e2e, warm pages used at 0.5 Hz were
/// published at a median of 0.12 Hz (level 47 instead of 80). Symmetric, a frame's share is an
/// average of about the last 127 windows. A frame's windows are its region's samples, so the
/// frames of a region cross a threshold together: at 1/24 (about 47 windows, one aggregation in
/// the e2e) 1% of 0.5 Hz pages showed 1 Hz or more on average, but a whole warm region at a
/// time, and the DAMON e2e's precision fell to 0.84-0.87 in some rounds (2026-11-27). At 1/64 the
/// share's deviation is 0.030 instead of 0.050 at the e2e's window (1 Hz is 4 deviations above
/// 0.5 Hz instead of 2.4); a frame that turns hot crosses 1 Hz after about 17 windows instead
/// of 7 (docs/guest.md, "Rates from DAMON's samples").
const WEIGHT: f64 = 1.0 / 64.0;

/// Frames per 2 MiB unit.
pub const UNIT_FRAMES: f64 = 512.0;

/// A 2 MiB unit young in at least this share of windows is reported at the 4 KiB rate of its
/// share (see [`frame_rate`]); it goes back to the per-frame share of the unit's rate below
/// [`SATURATION_LEAVE`] (hysteresis: the two readings are 512 times apart).
pub const SATURATION_ENTER: f64 = 0.9;
pub const SATURATION_LEAVE: f64 = 0.75;

/// `x > 0`, false for NaN.
pub fn positive(x: f64) -> bool {
    x > 0.0
}

/// Accesses per second of a page young in `share` of windows of `window_s` seconds.
pub fn rate_of_share(share: f64, window_s: f64) -> f64 {
    if !positive(share) || !positive(window_s) {
        return 0.0;
    }
    -(1.0 - share.min(SHARE_MAX)).ln() / window_s
}

/// The share of young windows of `window_s` of a page used at `rate` per second.
pub fn share_of_rate(rate: f64, window_s: f64) -> f64 {
    1.0 - (-rate.max(0.0) * window_s.max(0.0)).exp()
}

/// The share a page young in `share` of windows of `from_s` has in windows of `to_s`: for
/// Poisson accesses `1 - share` is `exp(-λ·W)`, so it scales as a power of the window.
pub fn rescale_share(share: f64, from_s: f64, to_s: f64) -> f64 {
    if !positive(share) || !positive(from_s) || !positive(to_s) {
        return 0.0;
    }
    1.0 - (1.0 - share.min(SHARE_MAX)).powf(to_s / from_s)
}

/// The share after `observed` (the share of young windows among `windows` windows) is averaged
/// in, one window at a time.
pub fn blend(share: f64, observed: f64, windows: f64) -> f64 {
    let w = 1.0 - (1.0 - WEIGHT).powf(windows.max(0.0));
    share + w * (observed - share)
}

/// The rate per 4 KiB frame published for a unit young in `share` of windows of `window_s`.
///
/// For a 4 KiB frame, the rate of its share. For a 2 MiB THP, DAMON's sample reads the unit's
/// one PMD Accessed bit, so the share's rate is the unit's, and the rate per frame is that over
/// 512 (accesses spread over its frames), as long as the bit can still tell: a unit young in
/// nearly every window (`saturated`) has a unit rate of at least 5.5 / S, and a 512th of that
/// bound would rank a THP used every millisecond below a 4 KiB page used once a second. Such a
/// unit is reported at the rate of a 4 KiB frame with the same share.
pub fn frame_rate(share: f64, window_s: f64, huge: bool, saturated: bool) -> f64 {
    let r = rate_of_share(share, window_s);
    if huge && !saturated {
        r / UNIT_FRAMES
    } else {
        r
    }
}

/// The saturation state of a 2 MiB unit after its share moved to `share`.
pub fn saturated(was: bool, share: f64) -> bool {
    if was {
        share >= SATURATION_LEAVE
    } else {
        share >= SATURATION_ENTER
    }
}

/// The least share whose rate is above level 0 (one access per 64 s) at windows of `window_s`:
/// frames below it are not published and need no state.
pub fn min_share(window_s: f64) -> f64 {
    1.0 - (-window_s.max(0.0) / 64.0).exp()
}

#[cfg(test)]
mod tests {
    use super::*;
    use vtism_proto::count::level_of_rate;

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol * b.abs().max(1e-12)
    }

    #[test]
    fn rate_inverts_the_young_probability() {
        for &(rate, w) in &[(0.5f64, 0.1f64), (2.0, 0.05), (50.0, 0.01), (0.1, 2.0)] {
            let p = 1.0 - (-rate * w).exp();
            assert!(close(rate_of_share(p, w), rate, 1e-9), "{rate} {w}");
        }
        assert_eq!(rate_of_share(0.0, 0.1), 0.0);
        assert_eq!(rate_of_share(0.5, 0.0), 0.0);
        assert_eq!(rate_of_share(f64::NAN, 0.1), 0.0);
        // capped: a page young in every window is at most ln 256 / S
        assert!(close(rate_of_share(1.0, 0.1), 256f64.ln() / 0.1, 1e-12));
        // the scale: 1 Hz is level 96, 1 access per 2 s is level 80
        assert_eq!(level_of_rate(rate_of_share(1.0 - (-0.1f64).exp(), 0.1)), 96);
        assert_eq!(
            level_of_rate(rate_of_share(1.0 - (-0.05f64).exp(), 0.1)),
            80
        );
    }

    #[test]
    fn rescaled_shares_keep_the_rate() {
        let p = 1.0 - (-3.0f64 * 0.02).exp();
        let q = rescale_share(p, 0.02, 0.5);
        assert!(close(rate_of_share(q, 0.5), 3.0, 1e-9));
        assert!(close(rescale_share(q, 0.5, 0.02), p, 1e-9));
        assert_eq!(rescale_share(0.0, 0.1, 0.2), 0.0);
        assert!(rescale_share(1.0, 0.1, 0.2) <= 1.0);
    }

    #[test]
    fn blend_averages_about_127_windows() {
        // one window moves the share by 1/64, up and down
        assert!(close(blend(0.0, 1.0, 1.0), 1.0 / 64.0, 1e-12));
        assert!(close(blend(1.0, 0.0, 1.0), 63.0 / 64.0, 1e-12));
        // an aggregation of 5 samples is five windows
        let mut s = 0.0;
        for _ in 0..5 {
            s = blend(s, 1.0, 1.0);
        }
        assert!(close(blend(0.0, 1.0, 5.0), s, 1e-12));
        // young in every window: half way after 45 windows, and back below half after 45
        let mut s = 0.0;
        let mut n = 0;
        while s < 0.5 {
            s = blend(s, 1.0, 1.0);
            n += 1;
        }
        assert_eq!(n, 45);
        let mut n = 0;
        while s >= 0.25 {
            s = blend(s, 0.0, 1.0);
            n += 1;
        }
        assert_eq!(n, 45);
        assert_eq!(blend(0.3, 0.3, 10.0), 0.3);
        // unbiased: a frame young in 13.5% of windows (0.5 Hz at 0.29 s) averages to 13.5%
        let mut s = 0.0;
        let mut sum = 0.0;
        for i in 0..10_000u32 {
            // 27 young windows in every 200, spread evenly
            let young = (i % 200) * 27 / 200 != ((i + 1) % 200) * 27 / 200;
            s = blend(s, if young { 1.0 } else { 0.0 }, 1.0);
            if i >= 1000 {
                sum += s;
            }
        }
        assert!(close(sum / 9000.0, 0.135, 0.05), "{}", sum / 9000.0);
    }

    #[test]
    fn thp_rates_per_frame_until_saturated() {
        let w = 0.1;
        // a unit young in 30% of 100 ms windows: 3.6 Hz as a unit, 7 mHz per frame
        let r = frame_rate(0.3, w, true, false);
        assert!(close(r * UNIT_FRAMES, rate_of_share(0.3, w), 1e-12));
        assert_eq!(frame_rate(0.3, w, false, false), rate_of_share(0.3, w));
        // saturated: the rate of a 4 KiB frame with the same share
        assert_eq!(frame_rate(0.95, w, true, true), rate_of_share(0.95, w));
        // hysteresis
        assert!(!saturated(false, 0.85));
        assert!(saturated(false, 0.9));
        assert!(saturated(true, 0.8));
        assert!(!saturated(true, 0.7));
    }

    #[test]
    fn min_share_is_level_zero() {
        for w in [0.005, 0.1, 1.0, 10.0] {
            let s = min_share(w);
            assert!(close(rate_of_share(s, w), 1.0 / 64.0, 1e-9));
            assert_eq!(level_of_rate(rate_of_share(s * 0.9, w)), 0);
        }
    }
}
