//! A plan: the moves one round decided, in an order that is safe to execute.

use crate::types::{NodeId, VmId};
use serde::Serialize;
use vtism_proto::Gfn;

/// Why a move is in the plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MoveKind {
    /// Hot frames from a slow node to a fast one.
    Promote,
    /// Cold frames out of fast memory to make room for hotter ones.
    Demote,
    /// Cold frames out of fast memory to restore the free reserve (background demotion).
    Refill,
    /// Frames on a farther fast node to the fast node nearest the VM's home, once it has room
    /// (AutoTiering's CPM: locality within a tier). The VM's fast memory does not change.
    Home,
    /// Frames accessed lately on a farther slow node to the slow node nearest the VM's home, once
    /// it has room (AutoTiering's CPMX: locality within the slow tier). The VM's fast memory does
    /// not change; a background move, run with the demotions.
    NearSlow,
}

impl MoveKind {
    /// Which way the move goes, for rate limits and queues.
    pub fn direction(self) -> Direction {
        match self {
            MoveKind::Promote | MoveKind::Home => Direction::Promote,
            MoveKind::Demote | MoveKind::Refill | MoveKind::NearSlow => Direction::Demote,
        }
    }

    /// Whether the move takes frames out of fast memory: if it does not happen, the VM holds
    /// them still (its `PromoteAfterDemote` moves shrink by as many frames).
    pub fn frees_fast(self) -> bool {
        matches!(self, MoveKind::Demote | MoveKind::Refill)
    }
}

/// Which way frames move: into fast memory or out of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    Promote,
    Demote,
}

impl Direction {
    pub const ALL: [Direction; 2] = [Direction::Promote, Direction::Demote];
    pub fn label(self) -> &'static str {
        match self {
            Direction::Promote => "promote",
            Direction::Demote => "demote",
        }
    }
}

/// Execution phase. Phases run in order; moves inside a phase may run in parallel.
/// Executing phase by phase never puts a VM above its fast quota at any moment:
/// `Promote` only fills quota that is free now, `Demote` frees, `PromoteAfterDemote` fills what
/// `Demote` freed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Promote,
    Demote,
    PromoteAfterDemote,
    /// Moves within a tier that neither take nor free fast memory (`MoveKind::NearSlow`): last,
    /// so that nothing in the plan waits for them.
    Background,
}

impl Phase {
    /// In the order they run.
    pub const ALL: [Phase; 4] = [
        Phase::Promote,
        Phase::Demote,
        Phase::PromoteAfterDemote,
        Phase::Background,
    ];
}

/// Move `frames` guest frames starting at `gfn` of `vm` from node `from` to node `to`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Move {
    pub vm: VmId,
    pub gfn: Gfn,
    pub frames: u64,
    pub from: NodeId,
    pub to: NodeId,
    pub kind: MoveKind,
    pub phase: Phase,
}

impl Move {
    pub fn bytes(&self) -> u64 {
        self.frames * vtism_proto::FRAME_SIZE
    }
}

/// What the planner saw and decided for one VM.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct VmPlanStats {
    pub vm: Option<VmId>,
    /// Frames the VM may have in fast memory.
    pub quota_frames: u64,
    /// Free frames the planner keeps in reserve.
    pub reserve_frames: u64,
    /// Frames with a known placement in fast / slow memory, and with no known placement.
    pub fast_frames: u64,
    pub slow_frames: u64,
    pub unknown_frames: u64,
    /// Frames whose decayed score is at least `min_hot_score`.
    pub hot_frames: u64,
    /// Hot frames that are in fast memory.
    pub hot_fast_frames: u64,
    /// The hot set the quota allows (frames at or above the threshold key).
    pub hot_set_frames: u64,
    /// Threshold key of the hot set (see `hotness::Key`).
    pub threshold_key: u16,
    pub promote_frames: u64,
    pub demote_frames: u64,
    pub refill_frames: u64,
    /// Fast frames moved to the fast node nearest the VM's home (`MoveKind::Home`).
    pub home_frames: u64,
    /// Slow frames moved to the slow node nearest the VM's home (`MoveKind::NearSlow`).
    pub near_slow_frames: u64,
    /// Hot-set frames left on slow memory because the round's budget ran out.
    pub deferred_by_budget: u64,
    /// Hot-set frames left on slow memory because no fast frame was colder by the hysteresis
    /// margin, or because they are below the hot-set mark and the quota has no free room.
    pub held_by_hysteresis: u64,
    /// Hot-set frames left on slow memory because they were demoted lately, have not risen
    /// since, and the room they need is held by units promoted lately (`recent_moves`).
    pub held_as_return: u64,
    /// Hot-set frames left on slow memory because no fast node had free memory.
    pub blocked_by_capacity: u64,
    /// Frames by which full fast nodes made the hot set smaller than the quota allows (hot slow
    /// frames are then exchanged with colder fast ones).
    pub capped_by_nodes: u64,
    /// The VM has had no observation since it was added (no hints, no host-side accesses): the
    /// planner moves none of its frames, whatever its quota (`VtismPolicy::plan`).
    pub no_signal: bool,
}

impl VmPlanStats {
    /// The same VM planned again in the same round, with what the other VMs left of the
    /// budget: its moves add up, and the later outcome says what is still left undone. The
    /// state it saw (tiers, hot set, threshold) is the first pass's, before either moved.
    pub fn continued_by(&mut self, later: &VmPlanStats) {
        self.promote_frames += later.promote_frames;
        self.demote_frames += later.demote_frames;
        self.refill_frames += later.refill_frames;
        self.home_frames += later.home_frames;
        self.near_slow_frames += later.near_slow_frames;
        self.deferred_by_budget = later.deferred_by_budget;
        self.held_by_hysteresis = later.held_by_hysteresis;
        self.held_as_return = later.held_as_return;
        self.blocked_by_capacity = later.blocked_by_capacity;
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PlanStats {
    pub vms: Vec<VmPlanStats>,
    /// Bytes demoted to bring fast nodes back to the driver's free watermark
    /// (`PlanContext::node_short_bytes`), whichever VMs they were of.
    pub watermark_bytes: u64,
    pub promote_bytes: u64,
    pub demote_bytes: u64,
    pub budget_bytes: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Plan {
    /// Moves sorted by phase; within a phase, hottest promotions and coldest demotions first.
    pub moves: Vec<Move>,
    pub stats: PlanStats,
}

impl Plan {
    pub fn is_empty(&self) -> bool {
        self.moves.is_empty()
    }
    pub fn moved_bytes(&self) -> u64 {
        self.moves.iter().map(Move::bytes).sum()
    }
    pub fn phase(&self, p: Phase) -> impl Iterator<Item = &Move> {
        self.moves.iter().filter(move |m| m.phase == p)
    }
}
