//! Placement facts and the one coalescer that turns them into runs.
//!
//! Drivers learn where frames are a frame at a time (a move_pages query, a page that did not
//! move) or a run at a time (a move cut from a plan, a first-touch layout); the engine takes
//! runs (`Policy::set_placement`). The coalescer merges facts, in the order they come, into the
//! longest runs allowed: one VM, one node, adjacent frames, and whatever the driver's `fits`
//! says (the tiering round keeps a run inside one RAM range, which is what the engine accepts).

use crate::types::{NodeId, VmId};
use vtism_proto::Gfn;

/// Frames `[gfn, gfn + frames)` of `vm` are on `node` (`None`: not present, or not known).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlacementRun {
    pub vm: VmId,
    pub gfn: Gfn,
    pub frames: u64,
    pub node: Option<NodeId>,
}

impl PlacementRun {
    /// One frame.
    pub fn frame(vm: VmId, gfn: Gfn, node: Option<NodeId>) -> PlacementRun {
        PlacementRun {
            vm,
            gfn,
            frames: 1,
            node,
        }
    }

    /// True if `next` starts where this run ends, on the same VM and node.
    fn continued_by(&self, next: &PlacementRun) -> bool {
        self.vm == next.vm
            && self.node == next.node
            && self.gfn.checked_add(self.frames) == Some(next.gfn)
    }
}

/// Merges facts into runs as they come. A run ends where the next fact does not continue it, or
/// where the longer run would not `fit`.
pub struct Coalescer<F: FnMut(&PlacementRun) -> bool> {
    run: Option<PlacementRun>,
    fits: F,
}

impl<F: FnMut(&PlacementRun) -> bool> Coalescer<F> {
    pub fn new(fits: F) -> Self {
        Coalescer { run: None, fits }
    }

    /// True if `fact` would extend the open run (it may still not fit).
    pub fn continues(&self, fact: &PlacementRun) -> bool {
        self.run.is_some_and(|r| r.continued_by(fact))
    }

    /// Adds a fact; returns the run it ended, if any.
    pub fn push(&mut self, fact: PlacementRun) -> Option<PlacementRun> {
        if fact.frames == 0 {
            return None;
        }
        if let Some(run) = &mut self.run {
            if run.continued_by(&fact) {
                let longer = PlacementRun {
                    frames: run.frames + fact.frames,
                    ..*run
                };
                if (self.fits)(&longer) {
                    *run = longer;
                    return None;
                }
            }
        }
        self.run.replace(fact)
    }

    /// The run still open.
    pub fn finish(&mut self) -> Option<PlacementRun> {
        self.run.take()
    }
}

/// The runs of `facts`, merged in order.
pub fn coalesce(
    facts: impl IntoIterator<Item = PlacementRun>,
    fits: impl FnMut(&PlacementRun) -> bool,
) -> Vec<PlacementRun> {
    let mut c = Coalescer::new(fits);
    let mut out: Vec<PlacementRun> = facts.into_iter().filter_map(|f| c.push(f)).collect();
    out.extend(c.finish());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(vm: u32, gfn: u64, node: Option<u8>) -> PlacementRun {
        PlacementRun::frame(VmId(vm), Gfn(gfn), node.map(NodeId))
    }

    #[test]
    fn adjacent_frames_of_one_vm_and_node_merge() {
        let facts = [
            f(1, 10, Some(0)),
            f(1, 11, Some(0)),
            f(1, 12, Some(2)),
            f(1, 13, Some(2)),
            f(1, 15, Some(2)), // a gap
            f(2, 16, Some(2)), // another VM
            f(2, 17, None),    // another node
        ];
        let runs: Vec<(u32, u64, u64, Option<NodeId>)> = coalesce(facts, |_| true)
            .into_iter()
            .map(|r| (r.vm.0, r.gfn.0, r.frames, r.node))
            .collect();
        assert_eq!(
            runs,
            vec![
                (1, 10, 2, Some(NodeId(0))),
                (1, 12, 2, Some(NodeId(2))),
                (1, 15, 1, Some(NodeId(2))),
                (2, 16, 1, Some(NodeId(2))),
                (2, 17, 1, None),
            ]
        );
    }

    #[test]
    fn runs_stop_where_they_would_not_fit() {
        // A RAM range boundary at frame 8: a run never crosses it, even between adjacent frames.
        let facts = (4..12).map(|g| f(1, g, Some(0)));
        let runs = coalesce(facts, |r| r.gfn.0 >= 8 || r.gfn.0 + r.frames <= 8);
        assert_eq!(
            runs.iter().map(|r| (r.gfn.0, r.frames)).collect::<Vec<_>>(),
            vec![(4, 4), (8, 4)]
        );
        // Runs as facts merge too, and empty facts vanish.
        let runs = coalesce(
            [
                PlacementRun {
                    frames: 3,
                    ..f(1, 0, Some(1))
                },
                PlacementRun {
                    frames: 0,
                    ..f(1, 3, Some(1))
                },
                PlacementRun {
                    frames: 5,
                    ..f(1, 3, Some(1))
                },
            ],
            |_| true,
        );
        assert_eq!(runs.len(), 1);
        assert_eq!((runs[0].gfn.0, runs[0].frames), (0, 8));
    }
}
