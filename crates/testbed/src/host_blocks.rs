//! How a set of guest frames lies in 2 MiB host blocks, and so how much of it whole host huge
//! pages can put on DRAM: with THP-backed guest RAM vtismd places each block whole (docs/host.md,
//! "Host huge pages"), so a hot set spread over partly cold blocks cannot all fit a tight quota.
//! Guest RAM is mapped 2 MiB-aligned (QEMU aligns its RAM blocks to the THP size), so a frame's
//! host block is its GFN / 512.

use std::collections::{BTreeMap, HashSet};

use serde::{Deserialize, Serialize};
use vtism_proto::count::{level_of_rate, rate_hz};

/// Frames of one 2 MiB block.
const BLOCK_FRAMES: u64 = 512;

/// Frames of the set per block, fullest first.
pub fn per_block(runs: &[(u64, u64)]) -> Vec<u64> {
    let mut by: BTreeMap<u64, u64> = BTreeMap::new();
    for &(first, n) in runs {
        let mut g = first;
        let end = first + n;
        while g < end {
            let block_end = (g / BLOCK_FRAMES + 1) * BLOCK_FRAMES;
            let take = block_end.min(end) - g;
            *by.entry(g / BLOCK_FRAMES).or_default() += take;
            g += take;
        }
    }
    let mut v: Vec<u64> = by.into_values().collect();
    v.sort_unstable_by(|a, b| b.cmp(a));
    v
}

/// The share of the set that the `blocks` fullest blocks hold (1.0 for an empty set).
pub fn best_share(per_block: &[u64], blocks: usize) -> f64 {
    let total: u64 = per_block.iter().sum();
    if total == 0 {
        return 1.0;
    }
    per_block.iter().take(blocks).sum::<u64>() as f64 / total as f64
}

/// One line for the run's log: the blocks and what whole blocks can hold within `room_blocks`.
pub fn describe(name: &str, runs: &[(u64, u64)], room_blocks: usize) -> String {
    let v = per_block(runs);
    format!(
        "{name} in {} host 2 MiB blocks ({}); as whole host huge pages the fullest {room_blocks} \
         (the quota less vtismd's 2 MiB reserve) hold {:.1}% of it",
        v.len(),
        v.iter().map(u64::to_string).collect::<Vec<_>>().join(" "),
        100.0 * best_share(&v, room_blocks)
    )
}

/// A host block that changed tier between two samples, with what the guest published for it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MovedBlock {
    /// The block's first host address.
    pub hva: u64,
    pub to_dram: bool,
    /// Frames of the workload's hot set in it.
    pub hot: u16,
    /// The level of its frames' mean rate: how vtismd ranks a host folio (docs/host.md).
    pub level: u8,
    /// Median level of its frames outside the hot set, and how many of those are at 1 Hz or more.
    pub others_median: u8,
    pub others_1hz: u16,
}

/// Per host block (by host address): frames on DRAM, hot-set frames, sum of rates, and the
/// other frames' levels.
#[derive(Default)]
struct Block {
    on_dram: u16,
    hot: u16,
    rate_sum: f64,
    others: Vec<u8>,
}

/// Frames on DRAM per host block now (kept for the next call), and the blocks that gained or lost
/// half a block or more on DRAM since `before` (the last call's), with their published levels.
/// `hva(i)`, `on_dram(i)`, `levels[i]`: frame i's host address, tier and published level.
pub fn moved_blocks(
    frames: usize,
    hva: impl Fn(usize) -> Option<u64>,
    on_dram: impl Fn(usize) -> bool,
    levels: &[u8],
    hot: &HashSet<usize>,
    before: &BTreeMap<u64, u16>,
) -> (BTreeMap<u64, u16>, Vec<MovedBlock>) {
    let mut blocks: BTreeMap<u64, Block> = BTreeMap::new();
    for i in 0..frames {
        let Some(a) = hva(i) else { continue };
        let b = blocks.entry(a & !(BLOCK_FRAMES * 4096 - 1)).or_default();
        b.on_dram += u16::from(on_dram(i));
        let lv = levels.get(i).copied().unwrap_or(0);
        if lv > 0 {
            b.rate_sum += rate_hz(lv);
        }
        if hot.contains(&i) {
            b.hot += 1;
        } else {
            b.others.push(lv);
        }
    }
    let now: BTreeMap<u64, u16> = blocks.iter().map(|(&a, b)| (a, b.on_dram)).collect();
    let half = (BLOCK_FRAMES / 2) as i32;
    let moved = blocks
        .into_iter()
        .filter_map(|(a, mut b)| {
            let was = i32::from(*before.get(&a)?);
            let change = i32::from(b.on_dram) - was;
            (change.abs() >= half).then(|| {
                b.others.sort_unstable();
                MovedBlock {
                    hva: a,
                    to_dram: change > 0,
                    hot: b.hot,
                    level: level_of_rate(b.rate_sum / BLOCK_FRAMES as f64),
                    others_median: b.others.get(b.others.len() / 2).copied().unwrap_or(0),
                    others_1hz: b.others.iter().filter(|&&l| u32::from(l) >= 96).count() as u16,
                }
            })
        })
        .collect();
    (now, moved)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_are_cut_at_block_boundaries_and_blocks_ranked_fullest_first() {
        // 100 frames ending block 0, a full block 1, 12 frames of block 1023.
        let runs = [(412, 100), (512, 512), (1023 * 512 + 3, 12)];
        assert_eq!(per_block(&runs), vec![512, 100, 12]);
        let v = per_block(&runs);
        assert!((best_share(&v, 2) - 612.0 / 624.0).abs() < 1e-12);
        assert_eq!(best_share(&v, 3), 1.0);
        assert_eq!(best_share(&[], 2), 1.0);
    }

    #[test]
    fn blocks_that_changed_tier_are_reported_with_their_levels() {
        // Two blocks of 512 frames at 0x200000 and 0x400000; block 1 moves to DRAM.
        let hva = |i: usize| Some(0x20_0000 + i as u64 * 4096);
        let mut levels = vec![0u8; 1024];
        levels[512..612].fill(96 + 32); // 100 hot frames at 4 Hz
        levels[612..].fill(96); // the rest at 1 Hz
        let hot: HashSet<usize> = (512..612).collect();
        let (before, moved) = moved_blocks(1024, hva, |_| false, &levels, &hot, &BTreeMap::new());
        assert!(moved.is_empty(), "no earlier sample: nothing moved");
        assert_eq!(before.values().copied().collect::<Vec<_>>(), vec![0, 0]);
        let (_, moved) = moved_blocks(1024, hva, |i| i >= 512, &levels, &hot, &before);
        assert_eq!(moved.len(), 1);
        let m = &moved[0];
        assert_eq!((m.hva, m.to_dram, m.hot), (0x40_0000, true, 100));
        assert_eq!((m.others_median, m.others_1hz), (96, 412));
        // mean rate (100 x 4 + 412 x 1) / 512 = 1.59 Hz
        assert_eq!(m.level, level_of_rate(812.0 / 512.0));
    }

    #[test]
    fn a_run_spanning_blocks_counts_in_each() {
        assert_eq!(per_block(&[(500, 1100)]), vec![512, 512, 64, 12]);
        assert!(describe("hot set", &[(0, 512), (1024, 256)], 1).contains("hold 66.7%"));
    }
}
