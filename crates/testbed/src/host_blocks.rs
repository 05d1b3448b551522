//! How a set of guest frames lies in 2 MiB host blocks, and so how much of it whole host huge
//! pages can put on DRAM: with THP-backed guest RAM vtismd places each block whole (docs/host.md,
//! "Host huge pages"), so a hot set spread over partly cold blocks cannot all fit a tight quota.
//! Guest RAM is mapped 2 MiB-aligned (QEMU aligns its RAM blocks to the THP size), so a frame's
//! host block is its GFN / 512.

use std::collections::BTreeMap;

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
    fn a_run_spanning_blocks_counts_in_each() {
        assert_eq!(per_block(&[(500, 1100)]), vec![512, 512, 64, 12]);
        assert!(describe("hot set", &[(0, 512), (1024, 256)], 1).contains("hold 66.7%"));
    }
}
