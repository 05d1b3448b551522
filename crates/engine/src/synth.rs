//! Seeded synthetic workloads that speak the hint format: for tests, benchmarks and the demo.
//! Deterministic: the same seed gives the same stream.

use vtism_proto::{Gfn, HintEntry, PageType};

/// splitmix64: tiny, fast, good enough to scatter accesses; no dependency.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9E37_79B9_7F4A_7C15)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `[0, n)` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }
    pub fn chance(&mut self, p: f64) -> bool {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }
}

/// GUPS hot-set as the guest tracker would report it: a contiguous hot set touched every round,
/// the rest of the region touched rarely (each cold frame with probability `cold_touch` a round).
/// The guest's `count` is its recent-window count, so hot frames report high counts.
#[derive(Clone, Debug)]
pub struct GupsHotSet {
    pub base: Gfn,
    pub frames: u64,
    pub hot_start: u64,
    pub hot_frames: u64,
    pub cold_touch: f64,
    pub write_fraction: f64,
    rng: Rng,
    /// Rounds since each cold frame was last touched is not kept: counts for cold frames are 1.
    round: u64,
}

impl GupsHotSet {
    pub fn new(base: Gfn, frames: u64, hot_frames: u64, cold_touch: f64, seed: u64) -> Self {
        GupsHotSet {
            base,
            frames,
            hot_start: 0,
            hot_frames: hot_frames.min(frames),
            cold_touch,
            write_fraction: 0.5,
            rng: Rng::new(seed),
            round: 0,
        }
    }

    /// Moves the hot set (HeMem's hot-set-move variant).
    pub fn move_hot_set(&mut self, hot_start: u64) {
        self.hot_start = hot_start.min(self.frames - self.hot_frames);
    }

    pub fn is_hot(&self, gfn: Gfn) -> bool {
        let off = gfn.0.wrapping_sub(self.base.0);
        off >= self.hot_start && off < self.hot_start + self.hot_frames
    }

    /// The next round's hints: hot frames first (hottest first, as a guest publishes), then the
    /// cold frames touched this round.
    pub fn round(&mut self) -> Vec<HintEntry> {
        self.round += 1;
        let window = self.round.min(8) as u32;
        let mut out = Vec::with_capacity(
            self.hot_frames as usize + (self.frames as f64 * self.cold_touch) as usize + 16,
        );
        for off in self.hot_start..self.hot_start + self.hot_frames {
            let write = self.rng.chance(self.write_fraction);
            out.push(HintEntry::new(
                Gfn(self.base.0 + off),
                window,
                write,
                PageType::Anon,
                false,
                true,
            ));
        }
        let cold = self.frames - self.hot_frames;
        if cold > 0 && self.cold_touch > 0.0 {
            let touches = (cold as f64 * self.cold_touch).round() as u64;
            for _ in 0..touches {
                let mut off = self.rng.below(cold);
                if off >= self.hot_start {
                    off += self.hot_frames;
                }
                out.push(HintEntry::new(
                    Gfn(self.base.0 + off),
                    1,
                    false,
                    PageType::Anon,
                    false,
                    true,
                ));
            }
        }
        out
    }
}
