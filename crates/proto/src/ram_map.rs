//! The VM's RAM map: which guest frames are RAM. Supplied by the host (from QEMU's memory tree),
//! never by the guest.

use crate::addr::{Gfn, HUGE_FRAMES};
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// A half-open range of guest frames `[start, end)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct GfnRange {
    pub start: Gfn,
    pub end: Gfn,
}

impl GfnRange {
    pub fn new(start: Gfn, end: Gfn) -> Self {
        GfnRange { start, end }
    }
    pub fn frames(&self) -> u64 {
        self.end.0.saturating_sub(self.start.0)
    }
    pub fn contains(&self, gfn: Gfn) -> bool {
        self.start <= gfn && gfn < self.end
    }
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum RamMapError {
    #[error("RAM range {index} is empty or reversed ({start} .. {end})")]
    EmptyRange { index: usize, start: Gfn, end: Gfn },
    #[error("RAM range {index} ({start} ..) overlaps or is not after the previous one")]
    Unsorted { index: usize, start: Gfn },
}

/// Sorted, non-overlapping guest-frame ranges, plus a dense index: frame `i` of the VM is the
/// `i`-th RAM frame in address order. Dense indexes let per-frame state live in flat arrays.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RamMap {
    ranges: Vec<GfnRange>,
    /// `first_index[k]` = dense index of `ranges[k].start`.
    first_index: Vec<u64>,
    total: u64,
}

impl RamMap {
    /// Builds a map from ranges in any order; adjacent ranges are kept separate (they may be
    /// different memory regions in QEMU), overlapping ones are an error.
    pub fn new(mut ranges: Vec<GfnRange>) -> Result<Self, RamMapError> {
        for (index, r) in ranges.iter().enumerate() {
            if r.end <= r.start {
                return Err(RamMapError::EmptyRange {
                    index,
                    start: r.start,
                    end: r.end,
                });
            }
        }
        ranges.sort_by_key(|r| r.start);
        let mut first_index = Vec::with_capacity(ranges.len());
        let mut total = 0u64;
        for (index, r) in ranges.iter().enumerate() {
            if index > 0 && r.start < ranges[index - 1].end {
                return Err(RamMapError::Unsorted {
                    index,
                    start: r.start,
                });
            }
            first_index.push(total);
            total += r.frames();
        }
        Ok(RamMap {
            ranges,
            first_index,
            total,
        })
    }

    /// One range `[0, frames)`: a guest with no holes (tests, simulator).
    pub fn contiguous(frames: u64) -> Self {
        Self::new(vec![GfnRange::new(Gfn(0), Gfn(frames.max(1)))]).expect("one non-empty range")
    }

    pub fn ranges(&self) -> &[GfnRange] {
        &self.ranges
    }
    /// Total RAM frames.
    pub fn frames(&self) -> u64 {
        self.total
    }

    fn range_of(&self, gfn: Gfn) -> Option<usize> {
        // Ranges are few (typically 1-3); partition_point is a binary search.
        let k = self.ranges.partition_point(|r| r.start <= gfn);
        if k == 0 {
            return None;
        }
        let k = k - 1;
        if self.ranges[k].contains(gfn) {
            Some(k)
        } else {
            None
        }
    }

    pub fn contains(&self, gfn: Gfn) -> bool {
        self.range_of(gfn).is_some()
    }

    /// True if all frames `[gfn, gfn + frames)` are RAM and in one range.
    pub fn contains_span(&self, gfn: Gfn, frames: u64) -> bool {
        match (self.range_of(gfn), gfn.checked_add(frames)) {
            (Some(k), Some(end)) => end <= self.ranges[k].end,
            _ => false,
        }
    }

    /// True if every frame of `[gfn, gfn + frames)` is RAM, even across adjacent ranges (the
    /// channel's rule: a 2 MiB unit may straddle two adjacent QEMU regions).
    pub fn contains_frames(&self, gfn: Gfn, frames: u64) -> bool {
        let (Some(mut k), Some(end)) = (self.range_of(gfn), gfn.checked_add(frames)) else {
            return false;
        };
        while let Some(r) = self.ranges.get(k) {
            if end <= r.end {
                return true;
            }
            match self.ranges.get(k + 1) {
                Some(next) if next.start == r.end => k += 1,
                _ => return false,
            }
        }
        false
    }

    /// The range holding `gfn`, if it is RAM.
    pub fn range_containing(&self, gfn: Gfn) -> Option<GfnRange> {
        self.range_of(gfn).and_then(|k| self.ranges.get(k).copied())
    }

    /// True if the 2 MiB unit starting at `head` is wholly RAM.
    pub fn contains_huge(&self, head: Gfn) -> bool {
        head.is_huge_aligned() && self.contains_span(head, HUGE_FRAMES)
    }

    /// Dense index of a RAM frame.
    pub fn index_of(&self, gfn: Gfn) -> Option<u64> {
        self.range_of(gfn)
            .map(|k| self.first_index[k] + (gfn.0 - self.ranges[k].start.0))
    }

    /// The frame at a dense index.
    pub fn gfn_at(&self, index: u64) -> Option<Gfn> {
        if index >= self.total {
            return None;
        }
        let k = self.first_index.partition_point(|&f| f <= index) - 1;
        Some(Gfn(self.ranges[k].start.0 + (index - self.first_index[k])))
    }

    /// Dense index ranges `[first, end)` of each RAM range, in address order.
    pub fn index_spans(&self) -> impl Iterator<Item = (GfnRange, u64)> + '_ {
        self.ranges
            .iter()
            .copied()
            .zip(self.first_index.iter().copied())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_roundtrip_with_hole() {
        let m = RamMap::new(vec![
            GfnRange::new(Gfn(0x100000), Gfn(0x140000)),
            GfnRange::new(Gfn(0), Gfn(0x80000)),
        ])
        .unwrap();
        assert_eq!(m.frames(), 0x80000 + 0x40000);
        assert_eq!(m.index_of(Gfn(0x7ffff)), Some(0x7ffff));
        assert_eq!(m.index_of(Gfn(0x80000)), None);
        assert_eq!(m.index_of(Gfn(0x100000)), Some(0x80000));
        assert_eq!(m.gfn_at(0x80000), Some(Gfn(0x100000)));
        assert_eq!(m.gfn_at(m.frames()), None);
        assert!(m.contains_huge(Gfn(0x100000)));
        assert!(!m.contains_huge(Gfn(0x7fe01)));
        assert!(!m.contains_span(Gfn(0x7ff00), 512));
        assert!(!m.contains_frames(Gfn(0x7ff00), 512));
        assert!(m.contains_frames(Gfn(0x13fe00), 512));
        assert!(!m.contains_frames(Gfn(0x13fe01), 512));
        assert_eq!(
            m.range_containing(Gfn(0x100001)),
            Some(GfnRange::new(Gfn(0x100000), Gfn(0x140000)))
        );
        assert_eq!(m.range_containing(Gfn(0x80000)), None);
    }

    #[test]
    fn frames_may_cross_adjacent_ranges_only() {
        let m = RamMap::new(vec![
            GfnRange::new(Gfn(0), Gfn(0x100)),
            GfnRange::new(Gfn(0x100), Gfn(0x300)),
            GfnRange::new(Gfn(0x400), Gfn(0x600)),
        ])
        .unwrap();
        assert!(m.contains_frames(Gfn(0), 0x200));
        assert!(
            !m.contains_span(Gfn(0), 0x200),
            "contains_span keeps to one range"
        );
        assert!(m.contains_frames(Gfn(0xff), 0x201));
        assert!(
            !m.contains_frames(Gfn(0x200), 0x200),
            "hole at 0x300..0x400"
        );
        assert!(!m.contains_frames(Gfn(0x5ff), 2));
        assert!(!m.contains_frames(Gfn(u64::MAX), 2));
    }

    #[test]
    fn rejects_overlap_and_empty() {
        assert!(matches!(
            RamMap::new(vec![
                GfnRange::new(Gfn(0), Gfn(10)),
                GfnRange::new(Gfn(5), Gfn(20))
            ]),
            Err(RamMapError::Unsorted { .. })
        ));
        assert!(matches!(
            RamMap::new(vec![GfnRange::new(Gfn(5), Gfn(5))]),
            Err(RamMapError::EmptyRange { .. })
        ));
    }
}
