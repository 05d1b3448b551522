//! Per-VM rate allowances: a plan cut to what each VM may move this round, keeping the engine's
//! quota guarantee (a VM never holds more fast memory than its quota between two moves).
//!
//! The cut moves are not done: the round tells the engine where their frames still are, so the
//! next plan proposes them again. A slow VM then moves a little every round instead of holding
//! the mover, and every other VM's placement, for many rounds.

use crate::plan::{Direction, Move, Phase};
use crate::types::VmId;
use std::collections::BTreeMap;
use vtism_proto::{Gfn, FRAME_SIZE};

/// Bytes a VM may move this round, per direction. A VM or a direction without an entry is
/// unlimited.
pub type Allowances = BTreeMap<(VmId, Direction), u64>;

/// A plan's moves after the cut: what runs now, and what waits for a later round.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Cut {
    /// In phase order, as planned.
    pub kept: Vec<Move>,
    /// Runs (or parts of runs) left where they are.
    pub deferred: Vec<Move>,
}

/// The end of the unit of placement holding a VM's frame: past the frame itself, or past its
/// host folio, which moves only whole.
pub type UnitEnd<'a> = &'a dyn Fn(VmId, Gfn) -> Gfn;

/// Cuts `moves` (in phase order) to the allowances. Demotions that are cut make the VM's
/// `PromoteAfterDemote` moves shrink by as many frames (dropped from the end), because those
/// promotions needed the room the demotions would have freed. A cut never falls inside a host
/// folio (`unit_end`): the part kept runs to the folio's end, over the allowance by less than a
/// folio, since a folio's part moves all of it (THP) or none (hugetlbfs by a tail address).
pub fn cut_to_allowances(moves: Vec<Move>, allowances: &Allowances, unit_end: UnitEnd<'_>) -> Cut {
    if allowances.is_empty() {
        return Cut {
            kept: moves,
            deferred: Vec::new(),
        };
    }
    let mut left: BTreeMap<(VmId, Direction), u64> = allowances
        .iter()
        .map(|(k, b)| (*k, b / FRAME_SIZE))
        .collect();
    let mut cut = Cut {
        kept: Vec::with_capacity(moves.len()),
        deferred: Vec::new(),
    };
    let mut shortfall: BTreeMap<VmId, u64> = BTreeMap::new();
    let mut after: Vec<Move> = Vec::new();
    for m in moves {
        if m.phase == Phase::PromoteAfterDemote {
            after.push(m);
            continue;
        }
        let key = (m.vm, m.kind.direction());
        let (k, d) = split_to(m, left.get_mut(&key), unit_end);
        if let Some(d) = d {
            if d.phase == Phase::Demote {
                *shortfall.entry(d.vm).or_default() += d.frames;
            }
            cut.deferred.push(d);
        }
        cut.kept.extend(k);
    }
    let (after, trimmed) = trim_after_demote(after, &shortfall);
    cut.deferred.extend(trimmed);
    for m in after {
        let (k, d) = split_to(m, left.get_mut(&(m.vm, Direction::Promote)), unit_end);
        cut.kept.extend(k);
        cut.deferred.extend(d);
    }
    cut
}

/// After demotions fell short (cut here, or failed when the mover ran them), drops the VM's
/// `PromoteAfterDemote` moves, last first, until the dropped frames cover the shortfall, so the
/// VM never exceeds its fast quota. Returns the kept moves and the dropped ones.
pub fn trim_after_demote(
    moves: Vec<Move>,
    shortfall: &BTreeMap<VmId, u64>,
) -> (Vec<Move>, Vec<Move>) {
    let mut need = shortfall.clone();
    let mut keep_rev = Vec::new();
    let mut dropped = Vec::new();
    for m in moves.into_iter().rev() {
        match need.get_mut(&m.vm) {
            Some(n) if *n > 0 => {
                *n = n.saturating_sub(m.frames);
                dropped.push(m);
            }
            _ => keep_rev.push(m),
        }
    }
    keep_rev.reverse();
    (keep_rev, dropped)
}

/// Splits a move (a run of frames) into the part `left` frames allow and the rest.
fn split_to(
    m: Move,
    left: Option<&mut u64>,
    unit_end: UnitEnd<'_>,
) -> (Option<Move>, Option<Move>) {
    let Some(l) = left else {
        return (Some(m), None);
    };
    let mut take = m.frames.min(*l);
    if take > 0 && take < m.frames {
        let end = unit_end(m.vm, Gfn(m.gfn.0 + take - 1));
        take = end.0.saturating_sub(m.gfn.0).clamp(take, m.frames);
    }
    *l = l.saturating_sub(take);
    let kept = (take > 0).then_some(Move { frames: take, ..m });
    let rest = (take < m.frames).then_some(Move {
        gfn: Gfn(m.gfn.0 + take),
        frames: m.frames - take,
        ..m
    });
    (kept, rest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::MoveKind;
    use crate::types::NodeId;

    fn frame_end(_: VmId, g: Gfn) -> Gfn {
        Gfn(g.0 + 1)
    }

    /// A cut inside a host folio moves to the folio's end: a hugetlbfs page cut in two would
    /// never move, and half a THP moves all of it anyway.
    #[test]
    fn cuts_never_split_a_host_folio() {
        let folio_end = |_: VmId, g: Gfn| {
            if g.0 >= 512 {
                Gfn((g.0 / 512 + 1) * 512)
            } else {
                Gfn(g.0 + 1)
            }
        };
        let moves = vec![
            mv(1, 500, 12 + 1024, 0, MoveKind::Promote, Phase::Promote),
            mv(2, 0, 100, 0, MoveKind::Promote, Phase::Promote),
        ];
        let allow: Allowances = [
            ((VmId(1), Direction::Promote), 100 * FRAME_SIZE),
            ((VmId(2), Direction::Promote), 10 * FRAME_SIZE),
        ]
        .into();
        let Cut { kept, deferred } = cut_to_allowances(moves, &allow, &folio_end);
        assert_eq!(
            kept.iter()
                .map(|m| (m.vm.0, m.gfn.0, m.frames))
                .collect::<Vec<_>>(),
            vec![(1, 500, 12 + 512), (2, 0, 10)]
        );
        assert_eq!(
            deferred
                .iter()
                .map(|m| (m.vm.0, m.gfn.0, m.frames))
                .collect::<Vec<_>>(),
            vec![(1, 1024, 512), (2, 10, 90)]
        );
    }

    fn mv(vm: u32, gfn: u64, frames: u64, to: u8, kind: MoveKind, phase: Phase) -> Move {
        Move {
            vm: VmId(vm),
            gfn: Gfn(gfn),
            frames,
            from: NodeId(if to == 0 { 2 } else { 0 }),
            to: NodeId(to),
            kind,
            phase,
        }
    }

    #[test]
    fn per_vm_limits_cut_plans_quota_safely() {
        let moves = vec![
            mv(1, 0, 4, 0, MoveKind::Promote, Phase::Promote),
            mv(2, 0, 100, 0, MoveKind::Promote, Phase::Promote),
            mv(1, 100, 4, 2, MoveKind::Demote, Phase::Demote),
            mv(1, 200, 4, 2, MoveKind::Demote, Phase::Demote),
            mv(1, 300, 4, 0, MoveKind::Promote, Phase::PromoteAfterDemote),
            mv(1, 400, 4, 0, MoveKind::Promote, Phase::PromoteAfterDemote),
        ];
        // VM 1 may promote 12 frames and demote 6 this round; VM 2 is unlimited.
        let allow: Allowances = [
            ((VmId(1), Direction::Promote), 12 * FRAME_SIZE),
            ((VmId(1), Direction::Demote), 6 * FRAME_SIZE),
        ]
        .into();
        let Cut { kept, deferred } = cut_to_allowances(moves, &allow, &frame_end);
        let k: Vec<(u32, u64, u64)> = kept.iter().map(|m| (m.vm.0, m.gfn.0, m.frames)).collect();
        // The second demotion is split (2 of 4 frames), so PromoteAfterDemote shrinks by at least
        // 2 frames (the whole last move) although the promote allowance would have covered it:
        // the quota must hold.
        assert_eq!(
            k,
            vec![
                (1, 0, 4),
                (2, 0, 100),
                (1, 100, 4),
                (1, 200, 2),
                (1, 300, 4)
            ]
        );
        let d: Vec<(u64, u64)> = deferred.iter().map(|m| (m.gfn.0, m.frames)).collect();
        assert_eq!(d, vec![(202, 2), (400, 4)]);
        let again = cut_to_allowances(kept, &Allowances::new(), &frame_end);
        assert_eq!((again.kept.len(), again.deferred.len()), (5, 0));
        // A long run is split to the allowance, not starved.
        let long = vec![mv(3, 0, 5000, 0, MoveKind::Promote, Phase::Promote)];
        let allow: Allowances = [((VmId(3), Direction::Promote), 600 * FRAME_SIZE)].into();
        let Cut { kept, deferred } = cut_to_allowances(long, &allow, &frame_end);
        assert_eq!((kept[0].gfn.0, kept[0].frames), (0, 600));
        assert_eq!((deferred[0].gfn.0, deferred[0].frames), (600, 4400));
    }

    #[test]
    fn trimming_covers_the_shortfall_from_the_end() {
        let moves = vec![
            mv(1, 0, 4, 0, MoveKind::Promote, Phase::PromoteAfterDemote),
            mv(2, 0, 4, 0, MoveKind::Promote, Phase::PromoteAfterDemote),
            mv(1, 8, 2, 0, MoveKind::Promote, Phase::PromoteAfterDemote),
            mv(1, 16, 2, 0, MoveKind::Promote, Phase::PromoteAfterDemote),
        ];
        let short: BTreeMap<VmId, u64> = [(VmId(1), 3)].into();
        let (keep, dropped) = trim_after_demote(moves, &short);
        assert_eq!(dropped.len(), 2);
        assert!(dropped.iter().all(|m| m.vm == VmId(1) && m.gfn.0 >= 8));
        assert_eq!(keep.len(), 2);
        let (keep, dropped) = trim_after_demote(keep, &BTreeMap::new());
        assert_eq!((keep.len(), dropped.len()), (2, 0));
    }
}
