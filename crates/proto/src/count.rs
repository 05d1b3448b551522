//! What an entry's `count` means (docs/channel.md, "Entry"): rounds seen for a v1.0 writer, an
//! access-rate level for v1.1 and later.

use serde::{Deserialize, Serialize};

/// The meaning of `count`, fixed by the writer's `version_minor`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CountMeaning {
    /// v1.0: rounds, out of the tracker's history window, in which the frame was accessed.
    #[default]
    RoundsSeen,
    /// v1.1: the frame's estimated access rate on a logarithmic scale, [`rate_hz`].
    RateLevel,
}

impl CountMeaning {
    pub const fn for_minor(version_minor: u16) -> CountMeaning {
        if version_minor == 0 {
            CountMeaning::RoundsSeen
        } else {
            CountMeaning::RateLevel
        }
    }
}

/// Rate levels per doubling of the access rate.
pub const LEVELS_PER_OCTAVE: u32 = 16;
/// The level of one access per second; level 0 is one access per 64 s, 255 about 980 per second.
pub const LEVEL_1HZ: u32 = 96;

/// Accesses per second a v1.1 `count` stands for: `2^(level / 16 - 6)`.
pub fn rate_hz(level: u8) -> f64 {
    ((level as f64 - LEVEL_1HZ as f64) / LEVELS_PER_OCTAVE as f64).exp2()
}

/// The level of a rate, rounded to the nearest level and clamped to 0..=255 (0 also for no
/// accesses at all).
pub fn level_of_rate(hz: f64) -> u8 {
    if hz.is_nan() || hz <= 0.0 {
        return 0;
    }
    (hz.log2() * LEVELS_PER_OCTAVE as f64 + LEVEL_1HZ as f64)
        .round()
        .clamp(0.0, 255.0) as u8
}

/// The largest young share a rate is taken from: a frame young in every window has no finite
/// estimate, so the share is capped (the tracker design's `s < 1 - 1/256`).
pub const SHARE_MAX: f64 = 1.0 - 1.0 / 256.0;

/// Accesses per second of a frame accessed as a Poisson process and found young in a share
/// `share` of observation windows of `window_s` seconds: `-ln(1 - share) / window_s`, the share
/// clamped to `0..=SHARE_MAX`; 0 for a window that is not positive.
/// (`vtism_ch_rate_of_share` in guest/module/vtism_channel.h is the kernel's fixed-point twin.)
pub fn rate_of_young_share(share: f64, window_s: f64) -> f64 {
    if window_s.is_nan() || window_s <= 0.0 || share.is_nan() {
        return 0.0;
    }
    -(1.0 - share.clamp(0.0, SHARE_MAX)).ln() / window_s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scale_points() {
        assert_eq!(level_of_rate(1.0), 96);
        assert_eq!(level_of_rate(1.0 / 64.0), 0);
        assert_eq!(level_of_rate(2.0), 112);
        assert_eq!(level_of_rate(1e9), 255);
        assert_eq!(level_of_rate(0.0), 0);
        assert!((rate_hz(96) - 1.0).abs() < 1e-12);
        assert!((rate_hz(255) - 980.4).abs() < 0.5);
        for l in 0..=255u8 {
            assert_eq!(level_of_rate(rate_hz(l)), l);
        }
    }

    #[test]
    fn young_share_rates() {
        assert_eq!(rate_of_young_share(0.0, 0.1), 0.0);
        assert_eq!(rate_of_young_share(0.5, 0.0), 0.0);
        // Young in half of the 1 s windows: ln 2 accesses per second.
        assert!((rate_of_young_share(0.5, 1.0) - std::f64::consts::LN_2).abs() < 1e-12);
        // Capped: always young in 1 ms windows is 256 ln 2 / 1 ms, not infinite.
        let cap = rate_of_young_share(1.0, 1e-3);
        assert!(
            (cap - 8.0 * std::f64::consts::LN_2 * 1e3).abs() < 1e-6,
            "{cap}"
        );
        assert_eq!(rate_of_young_share(2.0, 1e-3), cap);
    }

    #[test]
    fn meaning_follows_the_minor_version() {
        assert_eq!(CountMeaning::for_minor(0), CountMeaning::RoundsSeen);
        assert_eq!(CountMeaning::for_minor(1), CountMeaning::RateLevel);
        assert_eq!(CountMeaning::for_minor(7), CountMeaning::RateLevel);
    }
}
