//! The vtism policy: guest hints -> hotness -> hot set per quota -> a phased plan.

mod buckets;
mod frame_table;
mod ingest;

use frame_table::FrameTable;

use crate::folio::{fold_into_folios, FoldScratch, HostFolios, SparseFolio};
use crate::hotness::{
    key_level, key_of, FrameState, Key, Tables, COLD_SLOT, KEY_BUCKETS, NODE_UNKNOWN, RING,
};
use crate::params::EngineParams;
use crate::plan::{Direction, Move, MoveKind, Phase, Plan, PlanStats, VmPlanStats};
use crate::policy::{EngineError, IngestStats, Observation, PlanContext, Policy, VmSpec};
use crate::recent_moves::RecentMoves;
use crate::split_asks::SplitAsks;
use crate::topology::Topology;
use crate::types::{Nanos, NodeId, VmId};
use std::collections::HashMap;
use vtism_proto::{
    CountMeaning, Gfn, GfnRange, HintEntry, PageType, RamMap, FRAME_SIZE, HUGE_FRAMES,
};

/// Every frame is visited for maintenance once in this many hint rounds (a slice each round), so
/// stamps never wrap.
const MAINTAIN_EVERY: u64 = 32;
/// Histogram slot of cold frames (never hinted, forgotten, or decayed below score 1).
const COLD: usize = COLD_SLOT;
const NODES: usize = 64;

/// A RAM range with its dense index, for lookups that remember the last range used: hints come
/// in long runs within one range, so most lookups are one comparison.
#[derive(Clone, Copy, Debug)]
struct Span {
    start: u64,
    end: u64,
    first: u64,
}

/// Per-VM state: a packed `u32` per 4 KiB frame (per 2 MiB where its frames are alike,
/// `frame_table`) plus a few counters.
struct VmState {
    spec: VmSpec,
    spans: Vec<Span>,
    /// One bit per 512 dense frames: set where a 2 MiB unit's head is marked. Lets a 4 KiB hint
    /// check for an enclosing unit without touching another cache line of `frames`.
    huge_map: Vec<u64>,
    /// Bits set in `huge_map`: while there are none, 4 KiB hints need not look.
    huge_marks: u64,
    /// The 2 MiB blocks the host maps huge (`VtismPolicy::set_host_folios`): marked as units,
    /// and their 4 KiB observations folded into one per folio (`folio`).
    host_folios: HostFolios,
    /// Dense frames of partial host folios (`HostFolios::partial_heads`), in order: never
    /// promoted.
    held: Vec<std::ops::Range<usize>>,
    /// Dense frames the host cannot move as the planner would (`VtismPolicy::set_pinned`), in
    /// order: never planned.
    pinned: Vec<std::ops::Range<usize>>,
    /// The last plan could not fit the VM's hot set in its quota less the reserve.
    pressed: bool,
    /// Folios asked to be split, and when each may be asked again.
    split_asks: SplitAsks,
    /// Units moved lately: one demoted does not push out one promoted unless clearly hotter
    /// (`recent_moves`).
    recent: RecentMoves,
    frames: FrameTable,
    /// Hint rounds ingested; its low byte is the stamp clock.
    round: u64,
    /// What the counts of the last round meant.
    counts: CountMeaning,
    /// The last round was host-side tracking's (DAMON's accesses within one aggregation), whose
    /// counts say how often, not for how many rounds, a frame was seen.
    host_observed: bool,
    /// Frames the last rate-level round said were read at least `hot_set_min_rate_hz`, and its
    /// frames per rate level.
    hot_rate_frames: u64,
    rate_frames: Box<[u64; 256]>,
    /// Next frame the rolling maintenance visits.
    maint_cursor: usize,
    /// Frames (with a known node) per absolute level slot, `RING` is cold; per class
    /// `fast * 2 + file`. Changes only when a frame is hinted or moved, and when a round passes
    /// (the oldest slots turn cold): planning reads it instead of visiting every frame.
    hist: Vec<[u64; 4]>,
    is_fast: [bool; NODES],
    /// Frames per node, kept exact on every placement change.
    node_frames: [u64; NODES],
    dirty: bool,
    /// The first hint round at which the slow tier's locality pass may look again
    /// (`bring_near_slow`).
    near_slow_round: u64,
    last_observed: Option<Nanos>,
    last_stats: VmPlanStats,
    /// The 2 MiB units hinted in the round being ingested (`ingest::UnitHint`), by head index.
    unit_hints: HashMap<u32, ingest::UnitHint>,
    /// Entries each bucket has room for in the next large round (`buckets::Buckets::sort`).
    bucket_room: Vec<u32>,
    /// The last large round's entries came in long runs of one bucket, or there was none yet
    /// (`ingest::VmState::bucket_shift`).
    long_runs: bool,
}

impl VmState {
    /// Asks for the sparse folios to be split while the VM's hot set does not fit its quota (the
    /// rule: `folio`); each block at most once per back-off (`split_asks`).
    fn ask_splits(&mut self, sparse: &[SparseFolio], now: Nanos, out: &mut Vec<SplitRequest>) {
        if sparse.is_empty() || !self.pressed {
            return;
        }
        self.split_asks.expire(now);
        let mut asked = 0;
        for f in sparse {
            if asked == SPLITS_PER_ROUND {
                break;
            }
            if !self.split_asks.ask(f.head.0 / HUGE_FRAMES, now) {
                continue;
            }
            out.push(SplitRequest {
                vm: self.spec.id,
                head: f.head,
                cold: f.cold,
            });
            asked += 1;
        }
    }

    /// Histogram slot and class of a frame, `None` when its node is unknown (not counted).
    #[inline]
    fn hist_pos(&self, t: &Tables, s: FrameState) -> Option<(usize, usize)> {
        hist_pos(&self.is_fast, self.round, t, s)
    }

    /// The frame table, and what counts its frames, to change together.
    fn split(&mut self) -> (&mut FrameTable, FrameCounts<'_>) {
        let counts = FrameCounts {
            hist: &mut self.hist,
            node_frames: &mut self.node_frames,
            is_fast: &self.is_fast,
            round: self.round,
        };
        (&mut self.frames, counts)
    }

    /// The round advanced from `round - 1`: levels of the previous round's lowest slots are now
    /// below score 1. Move them to the cold slot.
    fn expire(&mut self, t: &Tables) {
        let q = t.q as u64;
        for lvl in q * (self.round - 1)..q * self.round {
            let k = (lvl % RING as u64) as usize;
            let slot = std::mem::take(&mut self.hist[k]);
            for (cold, n) in self.hist[COLD].iter_mut().zip(slot) {
                *cold += n;
            }
        }
    }

    /// Visit the next slice of frames and forget the ones whose stamp could soon wrap (they are
    /// long cold, so the histogram does not change).
    fn maintain_slice(&mut self, t: &Tables) {
        let n = self.frames.len();
        if n == 0 {
            return;
        }
        let slice = n.div_ceil(MAINTAIN_EVERY as usize);
        let r = self.round as u8;
        let start = self.maint_cursor.min(n);
        let end = (start + slice).min(n);
        self.frames.maintain(
            start..end,
            |frames| t.maintain_all(frames, r),
            |mut s| {
                t.maintain(&mut s, r);
                s
            },
        );
        self.maint_cursor = if end >= n { 0 } else { end };
    }

    /// The frames `range` are on `node` now.
    fn place(&mut self, t: &Tables, range: std::ops::Range<usize>, node: Option<NodeId>) {
        let new = node.map_or(NODE_UNKNOWN, |n| n.0);
        let (frames, mut counts) = self.split();
        frames.update(range, |s, n| {
            let old = s.node_raw();
            if old == new {
                return s;
            }
            counts.uncount(t, s, n);
            if old != NODE_UNKNOWN {
                counts.node_frames[old as usize] -= n as u64;
            }
            if new != NODE_UNKNOWN {
                counts.node_frames[new as usize] += n as u64;
            }
            let mut after = s;
            after.set_node(node);
            counts.count(t, after, n);
            after
        });
    }

    /// Keeps the frame table per chunk where host folios can keep chunks uniform, as one array
    /// (the ingest's fastest path) where there are none. Each conversion is O(frames), and
    /// happens when the host's folios come or go.
    fn fit_frame_table(&mut self) {
        if self.host_folios.is_empty() {
            self.frames.flatten();
        } else {
            self.frames.chunk_up();
        }
    }

    /// Dense index range of `[gfn, gfn + frames)` if it is all RAM in one range.
    fn span(&self, gfn: Gfn, frames: u64) -> Option<std::ops::Range<usize>> {
        if frames == 0 || !self.spec.ram.contains_span(gfn, frames) {
            return None;
        }
        let start = self.spec.ram.index_of(gfn)? as usize;
        Some(start..start + frames as usize)
    }
}

/// Histogram slot and class of a frame of a VM in round `round` whose fast nodes are `is_fast`,
/// `None` when its node is unknown (not counted).
#[inline]
fn hist_pos(
    is_fast: &[bool; NODES],
    round: u64,
    t: &Tables,
    s: FrameState,
) -> Option<(usize, usize)> {
    let node = s.node_raw();
    if node == NODE_UNKNOWN {
        return None;
    }
    let class = is_fast[node as usize & (NODES - 1)] as usize * 2
        + (s.page_type() == PageType::File) as usize;
    Some((t.ring_slot(s, round).unwrap_or(COLD), class))
}

/// What counts a VM's frames (`VmState`'s histogram and frames per node), borrowed apart from
/// its frame table (`VmState::split`) to change with it.
struct FrameCounts<'a> {
    hist: &'a mut Vec<[u64; 4]>,
    node_frames: &'a mut [u64; NODES],
    is_fast: &'a [bool; NODES],
    round: u64,
}

impl FrameCounts<'_> {
    /// `n` frames in state `s` more in the histogram.
    #[inline]
    fn count(&mut self, t: &Tables, s: FrameState, n: u32) {
        if let Some((k, c)) = hist_pos(self.is_fast, self.round, t, s) {
            self.hist[k][c] += n as u64;
        }
    }

    /// `n` frames in state `s` fewer in the histogram.
    #[inline]
    fn uncount(&mut self, t: &Tables, s: FrameState, n: u32) {
        if let Some((k, c)) = hist_pos(self.is_fast, self.round, t, s) {
            debug_assert!(
                self.hist[k][c] >= n as u64,
                "histogram underflow at slot {k} class {c}"
            );
            self.hist[k][c] = self.hist[k][c].saturating_sub(n as u64);
        }
    }
}

/// Public summary of a VM for status displays and metrics.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct VmSummary {
    pub vm: VmId,
    pub frames: u64,
    pub quota_frames: u64,
    pub fast_frames: u64,
    pub slow_frames: u64,
    pub unknown_frames: u64,
    pub rounds: u64,
    /// What the counts of the last round meant.
    pub counts: CountMeaning,
    pub last_observed: Option<Nanos>,
    pub last_plan: VmPlanStats,
    /// 2 MiB blocks placed whole because the host maps them huge.
    pub host_folios: u64,
}

/// A unit for planning: a 4 KiB frame or a 2 MiB unit, by dense index. `frames` is how many of
/// its frames would change tier (a unit's frames can sit on different nodes), which is what the
/// move costs and what it does to the quota; `span` is its size.
#[derive(Clone, Copy, Debug)]
struct Unit {
    idx: u32,
    key: Key,
    frames: u32,
    span: u32,
    /// Hinted in the last `FORGET_AGE` rounds (`FrameState::seen`).
    seen: bool,
}

/// Pass 2 of a VM's plan: promotion candidates (slow units) and victims (fast units) under
/// per-key caps, in address order.
struct UnitPass<'a> {
    tables: &'a Tables,
    /// The VM's round (its low byte).
    r: u8,
    is_fast: &'a [bool; NODES],
    /// Per key, frames still to collect: slow units, fast units.
    caps: [&'a mut Vec<u64>; 2],
    units: [&'a mut Vec<Unit>; 2],
}

impl UnitPass<'_> {
    /// Collects the VM's units, its frames read with `get` (a plain array's own indexing where
    /// the table is one).
    fn collect(self, v: &VmState, get: impl Fn(usize) -> FrameState) {
        let UnitPass {
            tables,
            r,
            is_fast,
            caps,
            units,
        } = self;
        let n = v.frames.len();
        // Cold fast units seen lately are collected under caps of their own, as many again: a
        // lukewarm candidate may displace only the unseen ones, which must not be crowded out.
        let mut seen_cold = [caps[1][0], caps[1][1]];
        let mut i = 0;
        let mut held = v.held.iter().peekable();
        let mut pinned = v.pinned.iter().peekable();
        while i < n {
            let s = get(i);
            let w = if s.huge_head() {
                HUGE_FRAMES as usize
            } else {
                1
            };
            let node = s.node_raw();
            while held.next_if(|h| h.end <= i).is_some() {}
            while pinned.next_if(|h| h.end <= i).is_some() {}
            let never_promoted = held.peek().is_some_and(|h| h.start <= i);
            let never_moved = pinned.peek().is_some_and(|h| h.start < i + w);
            if node != NODE_UNKNOWN && !never_moved && (!never_promoted || is_fast[node as usize]) {
                let k = tables.key(s, r) as usize;
                let head_fast = is_fast[node as usize];
                let cap = if head_fast && key_level(k as Key).is_none() && s.seen() {
                    &mut seen_cold[k]
                } else {
                    &mut caps[head_fast as usize][k]
                };
                if *cap > 0 {
                    *cap = cap.saturating_sub(w as u64);
                    let mut moving = 0;
                    if w == 1 {
                        moving = 1;
                    } else {
                        v.frames.for_each_run(i..i + w, |_, f, n| {
                            let node = f.node_raw();
                            if node != NODE_UNKNOWN && is_fast[node as usize] == head_fast {
                                moving += n;
                            }
                        });
                    }
                    units[head_fast as usize].push(Unit {
                        idx: i as u32,
                        key: k as Key,
                        frames: moving,
                        span: w as u32,
                        seen: s.seen(),
                    });
                }
            }
            i += w;
        }
    }
}

pub struct VtismPolicy {
    topology: Topology,
    params: EngineParams,
    tables: Tables,
    vms: Vec<VmState>,
    /// Rotates which VM plans first when fast memory is contended.
    plans: u64,
    is_fast: [bool; NODES],
    /// Demotion targets per source node, nearest first.
    slow_order: Vec<Vec<NodeId>>,
    hist_fast: Vec<u64>,
    hist_slow: Vec<u64>,
    /// A large hint round's entries sorted by where their frames are.
    ingest_scratch: ingest::IngestScratch,
    /// A round's entries with those in host folios folded (`folio::fold_into_folios`).
    folded: Vec<HintEntry>,
    fold_scratch: FoldScratch,
    sparse: Vec<SparseFolio>,
    /// Folios the engine asks the driver to split (`take_split_requests`).
    split_requests: Vec<SplitRequest>,
}

/// A host folio the engine would place better split into base pages (the rule: `folio`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SplitRequest {
    pub vm: VmId,
    pub head: Gfn,
    /// A frame of it the guest did not hint this round: advising it cold splits a THP.
    pub cold: Gfn,
}

/// Folios asked per VM and round, at most: Memtis splits at most 100 MB per pass
/// (docs/peers.md).
const SPLITS_PER_ROUND: usize = 50;

/// The slow tier's locality moves take at most this share (1/n) of what a round's budget still
/// holds, and after a pass that found nothing wait this many hint rounds (`bring_near_slow`).
const NEAR_SLOW_BUDGET_SHARE: u64 = 8;
const NEAR_SLOW_IDLE_ROUNDS: u64 = 8;

impl VtismPolicy {
    pub fn new(
        topology: Topology,
        params: EngineParams,
    ) -> Result<Self, crate::params::ParamError> {
        params.validate()?;
        let mut is_fast = [false; NODES];
        for n in topology.nodes() {
            is_fast[n.id.0 as usize] = n.tier.is_fast();
        }
        let slow_order = (0..NODES)
            .map(|n| topology.slow_nodes_near(NodeId(n as u8)))
            .collect();
        Ok(VtismPolicy {
            slow_order,
            tables: Tables::new(&params),
            topology,
            params,
            vms: Vec::new(),
            plans: 0,
            is_fast,
            hist_fast: vec![0; KEY_BUCKETS],
            hist_slow: vec![0; KEY_BUCKETS],
            ingest_scratch: Default::default(),
            folded: Vec::new(),
            fold_scratch: FoldScratch::default(),
            sparse: Vec::new(),
            split_requests: Vec::new(),
        })
    }

    pub fn params(&self) -> &EngineParams {
        &self.params
    }
    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// The VM's vCPUs now run near `home`: later plans promote to the fast nodes nearest it and
    /// demote to the slow nodes nearest it. Hotness and placement are kept: where the vCPUs run
    /// says nothing about which frames are hot or where they are.
    pub fn set_home_node(&mut self, vm: VmId, home: Option<NodeId>) -> Result<(), EngineError> {
        self.check_home(home)?;
        let p = self.vm_pos(vm)?;
        let v = &mut self.vms[p];
        if v.spec.home_node != home {
            v.spec.home_node = home;
            v.dirty = true;
        }
        Ok(())
    }

    /// The VM's guest restarted on the same memory map (a reset): what it touched before says
    /// nothing of what it will touch, so every frame's hotness is forgotten; where each frame is
    /// stays true and is kept, as are the host's folios and pinned frames. O(frames), no
    /// allocation. Returns the frames that had been hinted.
    pub fn forget_hotness(&mut self, vm: VmId) -> Result<u64, EngineError> {
        let p = self.vm_pos(vm)?;
        let t = &self.tables;
        let v = &mut self.vms[p];
        let mut hinted = 0u64;
        let (frames, mut counts) = v.split();
        frames.update(0..frames.len(), |s, n| {
            if !s.seen() {
                return s;
            }
            hinted += n as u64;
            counts.uncount(t, s, n);
            let mut after = s;
            after.forget();
            counts.count(t, after, n);
            after
        });
        v.hot_rate_frames = 0;
        v.rate_frames.fill(0);
        v.unit_hints.clear();
        v.split_asks.clear();
        v.recent.clear();
        v.pressed = false;
        v.dirty = true;
        Ok(hinted)
    }

    /// A home node must be a node of the topology.
    fn check_home(&self, home: Option<NodeId>) -> Result<(), EngineError> {
        match home {
            Some(h) if self.topology.node(h).is_none() => Err(EngineError::UnknownNode(h)),
            _ => Ok(()),
        }
    }

    fn vm_pos(&self, vm: VmId) -> Result<usize, EngineError> {
        self.vms
            .binary_search_by_key(&vm, |v| v.spec.id)
            .map_err(|_| EngineError::UnknownVm(vm))
    }

    pub fn vms(&self) -> impl Iterator<Item = VmId> + '_ {
        self.vms.iter().map(|v| v.spec.id)
    }

    /// A VM's frames with a known placement in fast and in slow memory.
    fn tier_frames(&self, v: &VmState) -> (u64, u64) {
        let (mut fast, mut slow) = (0, 0);
        for (n, &c) in v.node_frames.iter().enumerate() {
            if self.is_fast[n] {
                fast += c
            } else {
                slow += c
            }
        }
        (fast, slow)
    }

    pub fn summary(&self, vm: VmId) -> Result<VmSummary, EngineError> {
        let v = &self.vms[self.vm_pos(vm)?];
        let (fast, slow) = self.tier_frames(v);
        Ok(VmSummary {
            vm,
            frames: v.frames.len() as u64,
            quota_frames: v.spec.fast_quota_bytes / FRAME_SIZE,
            fast_frames: fast,
            slow_frames: slow,
            unknown_frames: v.frames.len() as u64 - fast - slow,
            rounds: v.round,
            counts: v.counts,
            last_observed: v.last_observed,
            last_plan: v.last_stats.clone(),
            host_folios: v.host_folios.len(),
        })
    }

    /// Frames per node of one VM, as the engine believes them.
    pub fn node_frames(&self, vm: VmId) -> Result<Vec<(NodeId, u64)>, EngineError> {
        let v = &self.vms[self.vm_pos(vm)?];
        Ok(v.node_frames
            .iter()
            .enumerate()
            .filter(|(_, &c)| c > 0)
            .map(|(n, &c)| (NodeId(n as u8), c))
            .collect())
    }

    /// Where the engine believes a frame is.
    pub fn frame_node(&self, vm: VmId, gfn: Gfn) -> Result<Option<NodeId>, EngineError> {
        let v = &self.vms[self.vm_pos(vm)?];
        let idx = v
            .spec
            .ram
            .index_of(gfn)
            .ok_or(EngineError::OutOfMap { vm, gfn, frames: 1 })?;
        Ok(v.frames.get(idx as usize).node())
    }

    /// Decayed score of a frame now (0 for frames never hinted).
    pub fn frame_score(&self, vm: VmId, gfn: Gfn) -> Result<u8, EngineError> {
        let v = &self.vms[self.vm_pos(vm)?];
        let idx = v
            .spec
            .ram
            .index_of(gfn)
            .ok_or(EngineError::OutOfMap { vm, gfn, frames: 1 })?;
        Ok(self
            .tables
            .eff_score(v.frames.get(idx as usize), v.round as u8))
    }

    /// Estimated hot-set size of a VM for pool balancing, HMM-V style: the frames whose decayed
    /// score is at least `hot_set_min_score` (HMM-V's base threshold keeps a VM with many barely
    /// touched frames from claiming a large hot set). HMM-V then keeps the top 80% of them; we
    /// keep all and let the pool add headroom, since the 80% cut leaves a fifth of a hot set
    /// whose frames are all hot (GUPS) outside the quota. O(levels), from the level histogram.
    pub fn hot_set_bytes(&self, vm: VmId) -> Result<u64, EngineError> {
        let v = &self.vms[self.vm_pos(vm)?];
        // Rates are already averages over many windows: the last round's count of frames at the
        // hot rate is the estimate, whatever was written (the write weight orders, it does not
        // make a frame hot).
        if v.counts == CountMeaning::RateLevel {
            return Ok(v.hot_rate_frames.min(v.frames.len() as u64) * FRAME_SIZE);
        }
        let base = (self.tables.q as u64 * v.round % RING as u64) as usize;
        let min_level = self.tables.hot_set_level[v.counts as usize] as usize;
        let hot: u64 = v
            .hist
            .iter()
            .take(RING)
            .enumerate()
            .filter(|(k, _)| (k + RING - base) % RING >= min_level)
            .map(|(_, slot)| slot.iter().sum::<u64>())
            .sum();
        Ok(hot * FRAME_SIZE)
    }

    /// What each VM should ask of a fast-memory pool of `fast_bytes` (`FastPool::rebalance`):
    /// for VMs whose guests report access rates, the frames at or above one rate level common to
    /// all of them, the highest at which those frames fill the pool (so fast memory goes where a
    /// frame is read most often, whichever VM it belongs to), and never below
    /// `hot_set_min_rate_hz`; for VMs whose guests report rounds seen, `hot_set_bytes`. VMs with
    /// no round yet are left out (the pool keeps their quota).
    pub fn pool_demands(&self, vms: &[VmId], fast_bytes: u64) -> Vec<(VmId, u64)> {
        let known: Vec<&VmState> = vms
            .iter()
            .filter_map(|&vm| self.vm_pos(vm).ok().map(|p| &self.vms[p]))
            .filter(|v| v.round > 0)
            .collect();
        let by_rate = |v: &VmState| v.counts == CountMeaning::RateLevel;
        let fixed: u64 = known
            .iter()
            .filter(|v| !by_rate(v))
            .filter_map(|v| self.hot_set_bytes(v.spec.id).ok())
            .sum();
        let mut room = fast_bytes.saturating_sub(fixed) / FRAME_SIZE;
        let mut level = 0usize;
        for l in (0..256).rev() {
            let at: u64 = known
                .iter()
                .filter(|v| by_rate(v))
                .map(|v| v.rate_frames[l])
                .sum();
            if at > room {
                level = l + 1;
                break;
            }
            room -= at;
        }
        let level = level.max(self.tables.hot_rate_level as usize);
        known
            .iter()
            .map(|v| {
                let bytes = if by_rate(v) {
                    v.rate_frames[level.min(256)..].iter().sum::<u64>() * FRAME_SIZE
                } else {
                    self.hot_set_bytes(v.spec.id).unwrap_or(0)
                };
                (v.spec.id, bytes)
            })
            .collect()
    }

    /// Heap bytes the policy holds (per-frame state and scratch).
    pub fn memory_bytes(&self) -> usize {
        let frames: usize = self
            .vms
            .iter()
            .map(|v| {
                v.frames.memory_bytes()
                    + v.huge_map.capacity() * 8
                    + v.spans.capacity() * std::mem::size_of::<Span>()
                    + v.hist.capacity() * 32
                    + v.bucket_room.capacity() * 4
                    + v.host_folios.memory_bytes()
                    + (v.held.capacity() + v.pinned.capacity()) * 16
                    + v.split_asks.memory_bytes()
                    + v.recent.memory_bytes()
                    + hash_map_bytes(&v.unit_hints)
                    + std::mem::size_of_val(&*v.rate_frames)
                    + std::mem::size_of::<VmState>()
            })
            .sum();
        frames
            + (self.hist_fast.capacity() + self.hist_slow.capacity()) * 8
            + self.ingest_scratch.memory_bytes()
            + self.folded.capacity() * std::mem::size_of::<HintEntry>()
            + self.fold_scratch.memory_bytes()
            + self.sparse.capacity() * std::mem::size_of::<SparseFolio>()
            + self.split_requests.capacity() * std::mem::size_of::<SplitRequest>()
    }

    /// The host maps the 2 MiB blocks headed by `heads` with one huge page each (and no others):
    /// the planner moves each as one unit, and their frames' observations fold into one per
    /// folio by the folio rule (`folio`). Blocks that stopped being folios (split on the host)
    /// go back to 4 KiB placement; their frames keep the folio's hotness until hinted again.
    /// Heads that are not whole 2 MiB blocks of one RAM range are dropped. Returns the number of
    /// folios.
    pub fn set_host_folios(
        &mut self,
        vm: VmId,
        heads: impl IntoIterator<Item = Gfn>,
    ) -> Result<u64, EngineError> {
        let p = self.vm_pos(vm)?;
        let v = &mut self.vms[p];
        let new = HostFolios::new(&v.spec.ram, heads);
        let old = std::mem::take(&mut v.host_folios);
        let gone: Vec<Gfn> = old.heads().filter(|h| !new.holds(*h)).collect();
        let came: Vec<Gfn> = new.heads().filter(|h| !old.holds(*h)).collect();
        for (heads, on) in [(gone, false), (came, true)] {
            for head in heads {
                if let Some(idx) = v.spec.ram.index_of(head) {
                    v.set_huge(idx as usize, on);
                }
            }
        }
        let ram = &v.spec.ram;
        v.held = new
            .partial_heads()
            .flat_map(|head| dense_ranges(ram, GfnRange::new(head, Gfn(head.0 + HUGE_FRAMES))))
            .collect();
        v.host_folios = new;
        v.dirty = true;
        Ok(v.host_folios.len())
    }

    /// The folios the engine asked to have split since the last call (`folio`, "Split or not").
    pub fn take_split_requests(&mut self) -> Vec<SplitRequest> {
        std::mem::take(&mut self.split_requests)
    }

    /// The end of the unit of placement holding `gfn`: its host folio's, or the frame's own.
    pub fn unit_end(&self, vm: VmId, gfn: Gfn) -> Gfn {
        match self.vm_pos(vm) {
            Ok(p) if self.vms[p].host_folios.holds(gfn) => {
                Gfn((gfn.0 / HUGE_FRAMES + 1) * HUGE_FRAMES)
            }
            _ => Gfn(gfn.0 + 1),
        }
    }

    /// Frames of a VM the host cannot move in the planner's units (guest RAM on hugetlbfs pages
    /// larger than 2 MiB, which move_pages moves only whole): never planned in either direction,
    /// so nothing is tried again every round. They count against the quota where they are.
    /// Replaces what was set before; returns the frames pinned.
    pub fn set_pinned(
        &mut self,
        vm: VmId,
        ranges: impl IntoIterator<Item = GfnRange>,
    ) -> Result<u64, EngineError> {
        let p = self.vm_pos(vm)?;
        let v = &mut self.vms[p];
        let ram = &v.spec.ram;
        let mut pinned: Vec<std::ops::Range<usize>> = ranges
            .into_iter()
            .flat_map(|g| dense_ranges(ram, g))
            .collect();
        pinned.sort_by_key(|r| r.start);
        let frames = pinned.iter().map(|r| r.len() as u64).sum();
        v.pinned = pinned;
        v.dirty = true;
        Ok(frames)
    }

    /// Free frames per node for this plan: observed, or capacity minus what our VMs hold.
    fn node_free_frames(&self, ctx: &PlanContext<'_>) -> [i64; NODES] {
        let mut free = [0i64; NODES];
        for n in self.topology.nodes() {
            let used: u64 = self
                .vms
                .iter()
                .map(|v| v.node_frames[n.id.0 as usize])
                .sum();
            free[n.id.0 as usize] = (n.capacity_bytes / FRAME_SIZE) as i64 - used as i64;
        }
        for &(n, bytes) in ctx.node_free_bytes {
            if (n.0 as usize) < NODES && self.topology.node(n).is_some() {
                free[n.0 as usize] = (bytes / FRAME_SIZE) as i64;
            }
        }
        free
    }

    /// Fast nodes below the driver's free watermark: the coldest units of this engine's VMs there,
    /// whichever VM they are of, go to slow memory (each to the slow node nearest its VM's home)
    /// until the shortfall is covered or the budget spent. What they free is the watermark's, not
    /// room for this plan's promotions. VMs with no signal yet are not touched (`no_signal`).
    /// Returns the frames demoted.
    fn restore_watermarks(
        &mut self,
        ctx: &PlanContext<'_>,
        free: &mut NodeFree,
        budget: &mut u64,
        out: &mut Vec<Move>,
        demoted_from: &mut [bool],
        now: Nanos,
    ) -> u64 {
        let mut done = 0;
        for &(node, bytes) in ctx.node_short_bytes {
            let n = node.0 as usize;
            if n >= NODES || !self.is_fast[n] || self.topology.node(node).is_none() {
                continue;
            }
            let mut need = bytes.div_ceil(FRAME_SIZE);
            let mut coldest: Vec<(Key, usize, Unit)> = Vec::new();
            for (vi, v) in self.vms.iter().enumerate() {
                if v.node_frames[n] > 0 && v.last_observed.is_some() {
                    let units = coldest_units_on(v, &self.tables, n as u8, need);
                    coldest.extend(units.into_iter().map(|u| (u.key, vi, u)));
                }
            }
            coldest.sort_by_key(|c| c.0);
            let mut decided = vec![Vec::new(); self.vms.len()];
            for (_, vi, u) in coldest {
                let f = u.frames as u64;
                if need == 0 || f > *budget {
                    break;
                }
                let near = self.vms[vi].spec.home_node.unwrap_or(node);
                let Some(to) = self.slow_order[near.0 as usize]
                    .iter()
                    .copied()
                    .find(|&s| free.avail_now(s) >= f as i64)
                else {
                    break;
                };
                free.take_now(to, f as i64);
                *budget -= f;
                need = need.saturating_sub(f);
                done += f;
                decided[vi].push((u, node, to, MoveKind::Refill, Phase::Demote));
            }
            for (vi, d) in decided.into_iter().enumerate() {
                if !d.is_empty() {
                    let v = &mut self.vms[vi];
                    record(v, &self.tables, &self.is_fast, d, out, now);
                    v.dirty = true;
                    demoted_from[vi] = true;
                }
            }
        }
        done
    }

    /// `again`: the VM was planned earlier in this round, and the engine's belief already has
    /// those moves done; its promotions then wait for every demotion of the round
    /// (`PromoteAfterDemote`), or one of them could run before the demotion it counted on.
    fn plan_vm(
        &mut self,
        vi: usize,
        free: &mut NodeFree,
        budget: &mut u64,
        out: &mut Vec<Move>,
        again: bool,
        now: Nanos,
    ) -> VmPlanStats {
        let tables = &self.tables;
        let is_fast = &self.is_fast;
        let v = &mut self.vms[vi];
        let r = v.round as u8;
        let hf = &mut self.hist_fast;
        let hs = &mut self.hist_slow;
        hf.iter_mut().for_each(|c| *c = 0);
        hs.iter_mut().for_each(|c| *c = 0);

        let mut stats = VmPlanStats {
            vm: Some(v.spec.id),
            ..Default::default()
        };
        let min_hot_key: Key = key_of(Some(tables.min_hot_level as u16), false);

        // Key histogram by tier, from the VM's level histogram: O(levels), not O(frames).
        let base = (tables.q as u64 * v.round % RING as u64) as usize;
        for (k, slot) in v.hist.iter().enumerate() {
            let level = if k == COLD {
                None
            } else {
                Some(((k + RING - base) % RING) as u16)
            };
            for (class, &n) in slot.iter().enumerate() {
                if n == 0 {
                    continue;
                }
                let key = key_of(level, class & 1 == 0) as usize;
                if class >= 2 {
                    hf[key] += n;
                } else {
                    hs[key] += n;
                }
                if key as Key >= min_hot_key {
                    stats.hot_frames += n;
                    if class >= 2 {
                        stats.hot_fast_frames += n;
                    }
                }
            }
        }
        let n = v.frames.len();
        for (node, &c) in v.node_frames.iter().enumerate() {
            if is_fast[node] {
                stats.fast_frames += c
            } else {
                stats.slow_frames += c
            }
        }
        stats.unknown_frames = n as u64 - stats.fast_frames - stats.slow_frames;
        let pinned_fast = take_out_pinned(v, |s| tables.key(s, r), is_fast, hf, hs);

        let q = v.spec.fast_quota_bytes / FRAME_SIZE;
        let reserve = ((q as f64 * self.params.reserve_fraction) as u64)
            .max(self.params.reserve_min_bytes / FRAME_SIZE)
            .min(q / 4);
        stats.quota_frames = q;
        stats.reserve_frames = reserve;
        let home = v.spec.home_node;
        let fast_order = self.topology.fast_nodes_near(home);
        // The hot set is what the VM can hold: its quota less the reserve, and no more than the
        // fast nodes can take. When they are full, hot slow frames are exchanged with colder fast
        // ones (AutoTiering OPM's exchange) instead of waiting for room that never comes.
        let fast_room: u64 = fast_order
            .iter()
            .map(|&f| free.avail_now(f).max(0) as u64)
            .sum();
        let hot_cap = (q - reserve).min(stats.fast_frames + fast_room);
        stats.capped_by_nodes = (q - reserve).saturating_sub(hot_cap);
        // Pinned frames on DRAM hold their share of it whatever their rank.
        let movable_cap = hot_cap.saturating_sub(pinned_fast);

        // Hot threshold: the lowest key whose frames (with all hotter ones) still fit the quota
        // less the reserve. `t_room` is how much of bucket T belongs to the hot set; fast frames in
        // T keep their place first, so equal keys never swap.
        let mut cum = 0u64;
        let mut t: usize = min_hot_key as usize;
        let mut t_room = u64::MAX;
        for k in (min_hot_key as usize..KEY_BUCKETS).rev() {
            let b = hf[k] + hs[k];
            if cum + b > movable_cap {
                t = k;
                t_room = movable_cap - cum;
                cum = movable_cap;
                break;
            }
            cum += b;
        }
        stats.hot_set_frames = cum;
        v.pressed = t_room != u64::MAX;
        stats.threshold_key = t as Key;
        let t_slow_room = if t_room == u64::MAX {
            u64::MAX
        } else {
            t_room.saturating_sub(hf[t])
        };

        let fast_used = stats.fast_frames as i64;
        let mut slack = hot_cap as i64 - fast_used;
        let mut room_now = if again { 0 } else { q as i64 - fast_used };
        let refill_need = (-slack).max(0) as u64;

        // How many promotion candidates exist, hottest first, within the budget.
        let mut prom_caps = vec![0u64; KEY_BUCKETS];
        let mut want = *budget;
        let mut candidates = 0u64;
        for k in (t..KEY_BUCKETS).rev() {
            let avail = if k == t {
                hs[k].min(t_slow_room)
            } else {
                hs[k]
            };
            candidates += avail;
            let take = avail.min(want);
            prom_caps[k] = take;
            want -= take;
        }
        // Victims: fast frames outside the hot set, coldest first, as many as could be needed.
        let mut vict_caps = vec![0u64; KEY_BUCKETS];
        let mut need = candidates.min(*budget) + refill_need;
        for k in 0..=t.min(KEY_BUCKETS - 1) {
            if need == 0 {
                break;
            }
            let avail = if k == t {
                hf[k].saturating_sub(t_room.min(hf[k]))
            } else {
                hf[k]
            };
            let take = avail.min(need);
            vict_caps[k] = take;
            need -= take;
        }

        // Pass 2: collect units under the per-bucket caps (address order inside a bucket).
        let mut proms: Vec<Unit> = Vec::new();
        let mut victs: Vec<Unit> = Vec::new();
        if prom_caps.iter().any(|&c| c > 0) || vict_caps.iter().any(|&c| c > 0) {
            let pass = UnitPass {
                tables,
                r,
                is_fast,
                caps: [&mut prom_caps, &mut vict_caps],
                units: [&mut proms, &mut victs],
            };
            match v.frames.as_slice() {
                Some(frames) => pass.collect(v, |i| frames[i]),
                None => pass.collect(v, |i| v.frames.get(i)),
            }
        }
        // Bucket order: stable counting sort by key (hottest first / coldest first).
        counting_sort(&mut proms, true);
        counting_sort(&mut victs, false);
        // Among cold victims, those not seen lately first: a lukewarm candidate may take only them.
        let files = victs.partition_point(|u| u.key == key_of(None, false));
        let cold = victs.partition_point(|u| key_level(u.key).is_none());
        unseen_first(&mut victs[..files]);
        unseen_first(&mut victs[files..cold]);

        v.recent.expire(now);
        let (frames, round) = (&v.frames, v.round);
        v.recent.follow(round, |i| {
            let s = frames.get(i as usize);
            if s.seen() && s.stamp() == round as u8 {
                s.last_degree()
            } else {
                0
            }
        });
        let mut decided: Vec<(Unit, NodeId, NodeId, MoveKind, Phase)> = Vec::new();
        let mut vn = 0usize;

        // Demotions go to the slow nodes nearest the VM's home (local, then remote: AutoTiering's
        // CPM order), or nearest the source when the home is unknown.
        let slow_order = &self.slow_order;
        let demote = |u: Unit, from: NodeId, free: &mut NodeFree| -> Option<NodeId> {
            let near = home.unwrap_or(from);
            let to = slow_order[near.0 as usize]
                .iter()
                .copied()
                .find(|&s| free.avail_now(s) >= u.frames as i64)?;
            free.take_now(to, u.frames as i64);
            free.give_later(from, u.frames as i64);
            Some(to)
        };

        // Background demotion first: restore the free reserve (coldest first, no hysteresis).
        let mut refilled = 0u64;
        while refilled < refill_need && *budget > 0 {
            let Some(&u) = victs.get(vn) else { break };
            vn += 1;
            if (u.frames as u64) > *budget {
                continue;
            }
            let from = v.frames.get(u.idx as usize).node().unwrap_or(NodeId(0));
            if let Some(to) = demote(u, from, free) {
                decided.push((u, from, to, MoveKind::Refill, Phase::Demote));
                *budget -= u.frames as u64;
                refilled += u.frames as u64;
                slack += u.frames as i64;
                stats.refill_frames += u.frames as u64;
            }
        }

        let hyst = tables.hysteresis_levels as u16;
        // Below the hot-set mark a unit is lukewarm: it may take free room or the place of memory
        // the guest has not touched lately (first touch), never a place the guest's accesses
        // earned (HMM-V exchanges hot pages only). Lukewarm levels are noise-dominated (DAMON's
        // region edges, a page touched every 30 s) and would otherwise trade places forever.
        let hot_mark = tables.hot_set_level[v.counts as usize] as u16;
        // A guest's count of rounds seen is itself persistence: a unit it saw in half its last
        // windows (HMM-V's degree above 3) is hot now, whatever its score has had time to reach.
        let hot_now_degree =
            (v.counts == CountMeaning::RoundsSeen && !v.host_observed).then(|| {
                let c = tables.hot_count(CountMeaning::RoundsSeen);
                tables.degree(CountMeaning::RoundsSeen, c, false)
            });
        let mut pi = proms.into_iter();
        while let Some(p) = pi.next() {
            let pf = p.frames as u64;
            if pf > *budget {
                stats.deferred_by_budget += pf;
                continue;
            }
            // A unit demoted lately and no hotter since does not take back the place of one
            // promoted lately (`recent_moves`); colder candidates may still take victims.
            if slack < pf as i64
                && v.recent.returning(p.idx, unit_degree(v, &p))
                && would_displace_just_promoted(&victs[vn..], pf as i64 - slack, &v.recent)
            {
                stats.held_as_return += pf;
                continue;
            }
            let from = v.frames.get(p.idx as usize).node().unwrap_or(NodeId(0));
            // Victims to make room within the quota less the reserve, each colder by the margin.
            let mut picked: Vec<(Unit, NodeId, NodeId)> = Vec::new();
            let mut freed = 0i64;
            let mut held = false;
            let lukewarm = !matches!(key_level(p.key), Some(l) if l >= hot_mark)
                && !hot_now_degree.is_some_and(|d| {
                    let s = v.frames.get(p.idx as usize);
                    s.seen() && s.stamp() == r && s.last_degree() >= d
                });
            while slack + freed < pf as i64 {
                let Some(&vu) = victs.get(vn) else {
                    held = true;
                    break;
                };
                if lukewarm && vu.seen {
                    held = true;
                    break;
                }
                let level = |k: Key| key_level(k).map_or(-1, |l| l as i32);
                if level(vu.key) + hyst as i32 > level(p.key) || vu.key >= p.key {
                    held = true;
                    break;
                }
                if pf + freed as u64 + vu.frames as u64 > *budget {
                    break;
                }
                vn += 1;
                let vfrom = v.frames.get(vu.idx as usize).node().unwrap_or(NodeId(0));
                match demote(vu, vfrom, free) {
                    Some(to) => {
                        picked.push((vu, vfrom, to));
                        freed += vu.frames as i64;
                    }
                    None => {
                        stats.blocked_by_capacity += vu.frames as u64;
                    }
                }
            }
            if slack + freed < pf as i64 {
                // Could not make room: give back what was taken for this unit and stop, since
                // every later candidate is colder.
                for (vu, vfrom, to) in picked {
                    free.take_now(to, -(vu.frames as i64));
                    free.give_later(vfrom, -(vu.frames as i64));
                }
                let rest: u64 = pf + pi.map(|u| u.frames as u64).sum::<u64>();
                if held {
                    stats.held_by_hysteresis += rest;
                } else {
                    stats.deferred_by_budget += rest;
                }
                break;
            }
            // Destination: phase A if the quota and a fast node have room now, else after demotions.
            let phase_a = room_now >= pf as i64;
            let dest = fast_order.iter().copied().find(|&f| {
                if phase_a {
                    free.avail_now(f) >= pf as i64
                } else {
                    free.avail_later(f) >= pf as i64
                }
            });
            let (dest, phase) = match dest {
                Some(d) => (
                    d,
                    if phase_a {
                        Phase::Promote
                    } else {
                        Phase::PromoteAfterDemote
                    },
                ),
                None => match fast_order
                    .iter()
                    .copied()
                    .find(|&f| free.avail_later(f) >= pf as i64)
                {
                    Some(d) => (d, Phase::PromoteAfterDemote),
                    None => {
                        for (vu, vfrom, to) in picked {
                            free.take_now(to, -(vu.frames as i64));
                            free.give_later(vfrom, -(vu.frames as i64));
                        }
                        stats.blocked_by_capacity += pf;
                        continue;
                    }
                },
            };
            if phase == Phase::Promote {
                room_now -= pf as i64;
                free.take_now(dest, pf as i64);
            } else {
                free.take_later(dest, pf as i64);
            }
            for (vu, vfrom, to) in picked {
                decided.push((vu, vfrom, to, MoveKind::Demote, Phase::Demote));
                *budget -= vu.frames as u64;
                stats.demote_frames += vu.frames as u64;
            }
            slack += freed - pf as i64;
            decided.push((p, from, dest, MoveKind::Promote, phase));
            *budget -= pf;
            stats.promote_frames += pf;
        }
        if let Some(h) = home {
            bring_home(
                v,
                &fast_order,
                is_fast,
                tables,
                free,
                budget,
                &mut decided,
                &mut stats,
            );
            if self.params.near_slow {
                bring_near_slow(
                    v,
                    &slow_order[h.0 as usize],
                    is_fast,
                    tables,
                    free,
                    budget,
                    &mut decided,
                    &mut stats,
                );
            }
        }

        record(v, tables, is_fast, decided, out, now);
        // Work the budget cut short continues in the next plan, without waiting for new hints.
        v.dirty = stats.deferred_by_budget > 0 || *budget == 0;
        v.last_stats = stats.clone();
        stats
    }
}

/// Fast-memory and node capacity bookkeeping during one plan. `now` is what nodes can take
/// before any demotion of this plan runs; `later` adds what demotions free.
struct NodeFree {
    now: [i64; NODES],
    later: [i64; NODES],
}

impl NodeFree {
    fn avail_now(&self, n: NodeId) -> i64 {
        self.now[n.0 as usize]
    }
    fn avail_later(&self, n: NodeId) -> i64 {
        self.now[n.0 as usize] + self.later[n.0 as usize]
    }
    fn take_now(&mut self, n: NodeId, f: i64) {
        self.now[n.0 as usize] -= f;
    }
    fn take_later(&mut self, n: NodeId, f: i64) {
        // Consume freed room first, then free room.
        let l = &mut self.later[n.0 as usize];
        let from_later = f.min(*l).max(0);
        *l -= from_later;
        self.now[n.0 as usize] -= f - from_later;
    }
    fn give_later(&mut self, n: NodeId, f: i64) {
        self.later[n.0 as usize] += f;
    }
}

/// Heap bytes a hash map holds, about: its table of entries and a control byte per slot, as
/// hashbrown lays it out (a power of two of slots, at most 7/8 full).
fn hash_map_bytes<K, V>(map: &HashMap<K, V>) -> usize {
    let slots = match map.capacity() {
        0 => return 0,
        c if c < 8 => (c + 1).next_power_of_two(),
        c => (c * 8 / 7).next_power_of_two(),
    };
    slots * (std::mem::size_of::<(K, V)>() + 1) + 16
}

/// The dense frame indices of `g`'s RAM, one range per RAM range it meets.
fn dense_ranges(ram: &RamMap, g: GfnRange) -> impl Iterator<Item = std::ops::Range<usize>> + '_ {
    ram.index_spans().filter_map(move |(r, first)| {
        let (a, b) = (r.start.0.max(g.start.0), r.end.0.min(g.end.0));
        (a < b).then(|| {
            let at = (first + (a - r.start.0)) as usize;
            at..at + (b - a) as usize
        })
    })
}

/// Whether the victims that would make `need` frames of room, coldest first, include a unit
/// promoted lately.
fn would_displace_just_promoted(victs: &[Unit], need: i64, recent: &RecentMoves) -> bool {
    let mut freed = 0i64;
    for vu in victs {
        if freed >= need {
            break;
        }
        if recent.just_promoted(vu.idx) {
            return true;
        }
        freed += vu.frames as i64;
    }
    false
}

/// Records a VM's decisions: one move per run of frames that change node (adjacent runs with the
/// same nodes coalesced), the new placement, and the moves `recent_moves` remembers.
fn record(
    v: &mut VmState,
    tables: &Tables,
    is_fast: &[bool; NODES],
    mut decided: Vec<(Unit, NodeId, NodeId, MoveKind, Phase)>,
    out: &mut Vec<Move>,
    now: Nanos,
) {
    let spec_id = v.spec.id;
    let rates = v.counts == CountMeaning::RateLevel;
    decided.sort_by_key(|d| d.4);
    for &(u, _, _, kind, _) in &decided {
        match kind {
            _ if !rates => {}
            MoveKind::Promote => v.recent.promoted(u.idx, now),
            MoveKind::Home | MoveKind::NearSlow => {}
            MoveKind::Demote | MoveKind::Refill => v.recent.demoted(u.idx, unit_degree(v, &u), now),
        }
    }
    // Runs of the unit's frames alike (a uniform chunk's pieces), placed a run at a time.
    let mut runs: Vec<(usize, u32, u8)> = Vec::new();
    for (u, _, to, kind, phase) in decided {
        let to_fast = is_fast[to.0 as usize];
        runs.clear();
        let unit = u.idx as usize..(u.idx + u.span) as usize;
        v.frames
            .for_each_run(unit, |i, s, n| runs.push((i, n, s.node_raw())));
        for &(first, n, node) in &runs {
            let moves = match kind {
                MoveKind::Home => node != to.0 && is_fast[node as usize],
                MoveKind::NearSlow => node != to.0 && !is_fast[node as usize],
                _ => is_fast[node as usize] != to_fast,
            };
            if node == NODE_UNKNOWN || !moves {
                continue;
            }
            let from = NodeId(node);
            let run = first..first + n as usize;
            for i in run.clone() {
                let gfn = v.spec.ram.gfn_at(i as u64).unwrap_or(Gfn(0));
                match out.last_mut() {
                    Some(m)
                        if m.vm == spec_id
                            && m.from == from
                            && m.to == to
                            && m.kind == kind
                            && m.phase == phase
                            && m.gfn.0 + m.frames == gfn.0
                            && v.spec.ram.contains_span(m.gfn, m.frames + 1) =>
                    {
                        m.frames += 1
                    }
                    _ => out.push(Move {
                        vm: spec_id,
                        gfn,
                        frames: 1,
                        from,
                        to,
                        kind,
                        phase,
                    }),
                }
            }
            v.place(tables, run, Some(to));
        }
    }
}

/// Locality within the fast tier (AutoTiering's CPM): once the fast node nearest the VM's home
/// has room left after this plan's promotions, the VM's frames on farther fast nodes move there,
/// hottest first, within the round's budget. Only when such frames exist (`node_frames`, exact),
/// so a plan with none pays nothing.
#[allow(clippy::too_many_arguments)]
fn bring_home(
    v: &VmState,
    fast_order: &[NodeId],
    is_fast: &[bool; NODES],
    tables: &Tables,
    free: &mut NodeFree,
    budget: &mut u64,
    decided: &mut Vec<(Unit, NodeId, NodeId, MoveKind, Phase)>,
    stats: &mut VmPlanStats,
) {
    let Some((&near, farther)) = fast_order.split_first() else {
        return;
    };
    let away: u64 = farther.iter().map(|f| v.node_frames[f.0 as usize]).sum();
    if away == 0 || free.avail_now(near) <= 0 || *budget == 0 {
        return;
    }
    let mut units = Vec::new();
    units_on(
        v,
        tables,
        |n| n != near.0 && is_fast[n as usize],
        |u| units.push(u),
    );
    let moved = move_warmest_to(v, units, near, *budget, free, decided, MoveKind::Home);
    *budget -= moved;
    stats.home_frames += moved;
}

/// Decides `units` onto `near`, warmest first, while each fits both `limit` and `near`'s free
/// room; returns the frames decided.
fn move_warmest_to(
    v: &VmState,
    mut units: Vec<Unit>,
    near: NodeId,
    limit: u64,
    free: &mut NodeFree,
    decided: &mut Vec<(Unit, NodeId, NodeId, MoveKind, Phase)>,
    kind: MoveKind,
) -> u64 {
    let phase = match kind {
        MoveKind::NearSlow => Phase::Background,
        _ => Phase::Promote,
    };
    counting_sort(&mut units, true);
    let mut moved = 0;
    for u in units {
        let f = u.frames as u64;
        if moved + f > limit || f as i64 > free.avail_now(near) {
            break;
        }
        let from = v.frames.get(u.idx as usize).node().unwrap_or(near);
        free.take_now(near, f as i64);
        free.give_later(from, f as i64);
        moved += f;
        decided.push((u, from, near, kind, phase));
    }
    moved
}

/// Locality within the slow tier (AutoTiering's CPMX): the VM's units the guest or the host saw
/// accessed lately (they hold a level) that sit on a slow node farther from its home than the
/// nearest one move there, hottest first, once it has room. Memory nobody touches stays where it
/// is: its distance costs nothing, and moving it would spend bandwidth for no access. A
/// background correction, so it takes at most `1 / NEAR_SLOW_BUDGET_SHARE` of what the round's
/// budget still holds (the rest stays for the next round's promotions and their demotions), runs
/// after every other move of the plan, and, finding nothing to move, waits `NEAR_SLOW_IDLE_ROUNDS` rounds
/// before its next pass over the VM's frames.
#[allow(clippy::too_many_arguments)]
fn bring_near_slow(
    v: &mut VmState,
    slow_order: &[NodeId],
    is_fast: &[bool; NODES],
    tables: &Tables,
    free: &mut NodeFree,
    budget: &mut u64,
    decided: &mut Vec<(Unit, NodeId, NodeId, MoveKind, Phase)>,
    stats: &mut VmPlanStats,
) {
    let Some((&near, farther)) = slow_order.split_first() else {
        return;
    };
    let away: u64 = farther.iter().map(|f| v.node_frames[f.0 as usize]).sum();
    let share = *budget / NEAR_SLOW_BUDGET_SHARE;
    if away == 0 || v.round < v.near_slow_round || free.avail_now(near) <= 0 || share == 0 {
        return;
    }
    let mut taken: Vec<u32> = decided.iter().map(|d| d.0.idx).collect();
    taken.sort_unstable();
    let mut units = Vec::new();
    units_on(
        v,
        tables,
        |n| n != near.0 && !is_fast[n as usize],
        |u| {
            if key_level(u.key).is_some() && taken.binary_search(&u.idx).is_err() {
                units.push(u)
            }
        },
    );
    let moved = move_warmest_to(v, units, near, share, free, decided, MoveKind::NearSlow);
    *budget -= moved;
    stats.near_slow_frames += moved;
    if moved == 0 {
        v.near_slow_round = v.round + NEAR_SLOW_IDLE_ROUNDS;
    }
}

/// The VM's units with frames on nodes `on` accepts (pinned ones left out), each counting those
/// frames, in address order, to `each`.
fn units_on(v: &VmState, tables: &Tables, on: impl Fn(u8) -> bool, mut each: impl FnMut(Unit)) {
    let r = v.round as u8;
    let mut pinned = v.pinned.iter().peekable();
    let (n, mut i) = (v.frames.len(), 0);
    while i < n {
        let s = v.frames.get(i);
        let w = if s.huge_head() {
            HUGE_FRAMES as usize
        } else {
            1
        };
        while pinned.next_if(|h| h.end <= i).is_some() {}
        let never_moved = pinned.peek().is_some_and(|h| h.start < i + w);
        let node = s.node_raw();
        if node != NODE_UNKNOWN && on(node) && !never_moved {
            let mut frames = 0;
            v.frames.for_each_run(i..i + w, |_, f, k| {
                let f = f.node_raw();
                if f != NODE_UNKNOWN && on(f) {
                    frames += k;
                }
            });
            each(Unit {
                idx: i as u32,
                key: tables.key(s, r),
                frames,
                span: w as u32,
                seen: s.seen(),
            });
        }
        i += w;
    }
}

/// The VM's coldest units on `node`, coldest first, holding `need` frames there (or all it
/// has): two passes, so that memory follows `need` and not the VM's size.
fn coldest_units_on(v: &VmState, tables: &Tables, node: u8, need: u64) -> Vec<Unit> {
    let mut frames_by_key = vec![0u64; KEY_BUCKETS];
    units_on(
        v,
        tables,
        |n| n == node,
        |u| frames_by_key[u.key as usize] += u.frames as u64,
    );
    // Every unit of the keys below `last`, and of `last` as many as `room` takes.
    let (mut last, mut room) = (KEY_BUCKETS - 1, need);
    for (k, &f) in frames_by_key.iter().enumerate() {
        if f >= room {
            last = k;
            break;
        }
        room -= f;
    }
    let mut units = Vec::new();
    units_on(
        v,
        tables,
        |n| n == node,
        |u| {
            let k = u.key as usize;
            if k < last || (k == last && room > 0) {
                if k == last {
                    room = room.saturating_sub(u.frames as u64);
                }
                units.push(u)
            }
        },
    );
    counting_sort(&mut units, false);
    units
}

/// Stable partition, in O(n): units not seen lately, then the others.
fn unseen_first(units: &mut [Unit]) {
    let mut seen = Vec::new();
    let mut w = 0;
    for i in 0..units.len() {
        let u = units[i];
        if u.seen {
            seen.push(u);
        } else {
            units[w] = u;
            w += 1;
        }
    }
    units[w..].copy_from_slice(&seen);
}

/// The degree of a unit's last hint (its head's: a 2 MiB unit is hinted as one).
fn unit_degree(v: &VmState, u: &Unit) -> u32 {
    v.frames.get(u.idx as usize).last_degree()
}

/// Takes the VM's pinned frames out of the key histograms (`hf` fast, `hs` slow): the planner
/// never moves them, so they are neither candidates nor victims. Returns those on fast nodes,
/// which hold quota all the same.
fn take_out_pinned(
    v: &VmState,
    key: impl Fn(FrameState) -> Key,
    is_fast: &[bool],
    hf: &mut [u64],
    hs: &mut [u64],
) -> u64 {
    let mut fast = 0;
    for range in &v.pinned {
        v.frames.for_each_run(range.clone(), |_, s, n| {
            let node = s.node_raw();
            if node == NODE_UNKNOWN {
                return;
            }
            let (k, n) = (key(s) as usize, n as u64);
            if is_fast[node as usize] {
                hf[k] = hf[k].saturating_sub(n);
                fast += n;
            } else {
                hs[k] = hs[k].saturating_sub(n);
            }
        });
    }
    fast
}

fn counting_sort(units: &mut Vec<Unit>, descending: bool) {
    if units.len() < 2 {
        return;
    }
    let mut count = vec![0usize; KEY_BUCKETS + 1];
    for u in units.iter() {
        let k = if descending {
            KEY_BUCKETS - 1 - u.key as usize
        } else {
            u.key as usize
        };
        count[k + 1] += 1;
    }
    for k in 1..count.len() {
        count[k] += count[k - 1];
    }
    let mut out = vec![
        Unit {
            idx: 0,
            key: 0,
            frames: 0,
            span: 0,
            seen: false,
        };
        units.len()
    ];
    for u in units.iter() {
        let k = if descending {
            KEY_BUCKETS - 1 - u.key as usize
        } else {
            u.key as usize
        };
        out[count[k]] = *u;
        count[k] += 1;
    }
    *units = out;
}

impl Policy for VtismPolicy {
    fn name(&self) -> &str {
        "vtism"
    }

    fn add_vm(&mut self, spec: VmSpec) -> Result<(), EngineError> {
        let frames = spec.ram.frames();
        if frames > u32::MAX as u64 - HUGE_FRAMES {
            return Err(EngineError::VmTooLarge {
                vm: spec.id,
                frames,
            });
        }
        self.check_home(spec.home_node)?;
        let pos = match self.vms.binary_search_by_key(&spec.id, |v| v.spec.id) {
            Ok(_) => return Err(EngineError::DuplicateVm(spec.id)),
            Err(p) => p,
        };
        // Adjacent RAM ranges have consecutive dense indexes: merge them, so a 2 MiB unit that
        // straddles two QEMU regions (legal on the channel) is one span here. Moves still split at
        // region boundaries (see plan_vm), where host addresses may not be contiguous.
        let mut spans: Vec<Span> = Vec::new();
        for (r, first) in spec.ram.index_spans() {
            match spans.last_mut() {
                Some(l) if l.end == r.start.0 => l.end = r.end.0,
                _ => spans.push(Span {
                    start: r.start.0,
                    end: r.end.0,
                    first,
                }),
            }
        }
        let table = FrameTable::new(
            frames as usize,
            FrameState::NEW,
            spans.iter().map(|s| (s.first as usize, s.start)),
        );
        let st = VmState {
            huge_map: vec![0; (frames as usize / HUGE_FRAMES as usize) / 64 + 1],
            huge_marks: 0,
            host_folios: HostFolios::default(),
            held: Vec::new(),
            pinned: Vec::new(),
            pressed: false,
            split_asks: SplitAsks::default(),
            recent: RecentMoves::default(),
            spans,
            frames: table,
            spec,
            round: 0,
            counts: CountMeaning::RoundsSeen,
            host_observed: false,
            hot_rate_frames: 0,
            rate_frames: Box::new([0; 256]),
            maint_cursor: 0,
            hist: vec![[0; 4]; RING + 1],
            is_fast: self.is_fast,
            node_frames: [0; NODES],
            dirty: true,
            near_slow_round: 0,
            last_observed: None,
            last_stats: VmPlanStats::default(),
            unit_hints: HashMap::new(),
            bucket_room: Vec::new(),
            long_runs: true,
        };
        self.vms.insert(pos, st);
        Ok(())
    }

    fn remove_vm(&mut self, vm: VmId) -> Result<(), EngineError> {
        let p = self.vm_pos(vm)?;
        self.vms.remove(p);
        Ok(())
    }

    fn set_quota(&mut self, vm: VmId, fast_quota_bytes: u64) -> Result<(), EngineError> {
        let p = self.vm_pos(vm)?;
        let v = &mut self.vms[p];
        if v.spec.fast_quota_bytes != fast_quota_bytes {
            v.spec.fast_quota_bytes = fast_quota_bytes;
            v.dirty = true;
        }
        Ok(())
    }

    fn observe(
        &mut self,
        vm: VmId,
        obs: Observation<'_>,
        now: Nanos,
    ) -> Result<IngestStats, EngineError> {
        let p = self.vm_pos(vm)?;
        let tables = &self.tables;
        let scratch = &mut self.ingest_scratch;
        let v = &mut self.vms[p];
        v.last_observed = Some(now);
        v.host_observed = matches!(obs, Observation::Accesses(_));
        v.fit_frame_table();
        let access_entries: Vec<HintEntry>;
        let (entries, counts) = match obs {
            Observation::Hints {
                entries, counts, ..
            } => (entries, counts),
            Observation::Accesses(acc) => {
                access_entries = acc
                    .iter()
                    .filter(|a| a.reads + a.writes > 0)
                    .map(|a| {
                        HintEntry::new(
                            a.gfn,
                            a.reads.saturating_add(a.writes),
                            a.writes > 0,
                            a.page_type,
                            false,
                            true,
                        )
                    })
                    .collect();
                (&access_entries[..], CountMeaning::RoundsSeen)
            }
        };
        if v.host_folios.is_empty() {
            return Ok(v.ingest(tables, counts, entries, scratch));
        }
        let (folded, folds) = (&mut self.folded, &mut self.fold_scratch);
        let hot_count = Some(tables.hot_count(counts));
        let sparse = &mut self.sparse;
        fold_into_folios(
            entries,
            &v.host_folios,
            counts,
            hot_count,
            folds,
            folded,
            sparse,
        );
        v.ask_splits(sparse, now, &mut self.split_requests);
        let mut st = v.ingest(tables, counts, folded, scratch);
        // The guest's entries, as it sent them; the folios' entries are counted as applied.
        st.entries = entries.len() as u64;
        Ok(st)
    }

    fn set_placement(
        &mut self,
        vm: VmId,
        gfn: Gfn,
        frames: u64,
        node: Option<NodeId>,
    ) -> Result<(), EngineError> {
        if let Some(n) = node {
            if self.topology.node(n).is_none() {
                return Err(EngineError::UnknownNode(n));
            }
        }
        let p = self.vm_pos(vm)?;
        let v = &mut self.vms[p];
        let span = v
            .span(gfn, frames)
            .ok_or(EngineError::OutOfMap { vm, gfn, frames })?;
        v.place(&self.tables, span, node);
        v.dirty = true;
        Ok(())
    }

    fn fast_quota(&self, vm: VmId) -> Option<u64> {
        let p = self.vm_pos(vm).ok()?;
        Some(self.vms[p].spec.fast_quota_bytes)
    }

    fn plan(&mut self, ctx: &PlanContext<'_>, now: Nanos) -> Plan {
        let budget_bytes = ctx
            .budget_bytes
            .unwrap_or(self.params.round_budget_bytes)
            .min(self.params.round_budget_bytes);
        let mut budget = budget_bytes / FRAME_SIZE;
        let mut free = NodeFree {
            now: self.node_free_frames(ctx),
            later: [0; NODES],
        };
        let mut moves = Vec::new();
        let mut stats = PlanStats {
            budget_bytes,
            ..Default::default()
        };
        // VMs the watermark demoted from plan their promotions after the round's demotions, so
        // that a unit it took is never promoted before it has left.
        let mut demoted_from = vec![false; self.vms.len()];
        stats.watermark_bytes = self.restore_watermarks(
            ctx,
            &mut free,
            &mut budget,
            &mut moves,
            &mut demoted_from,
            now,
        ) * FRAME_SIZE;
        let n = self.vms.len();
        let start = if n == 0 {
            0
        } else {
            (self.plans % n as u64) as usize
        };
        self.plans += 1;
        // Each VM first within its share of the budget; then, in the same order, those the
        // share cut short with what the others left. One VM to plan takes it all at once.
        let planned = self
            .vms
            .iter()
            .filter(|v| v.dirty && v.last_observed.is_some())
            .count();
        let share = if planned > 1 {
            ((budget as f64 * self.params.vm_round_share) as u64).max(1)
        } else {
            budget
        };
        let mut wanting_more = Vec::new();
        for j in 0..n {
            let vi = (start + j) % n;
            if !self.vms[vi].dirty {
                continue;
            }
            if self.vms[vi].last_observed.is_none() {
                stats.vms.push(self.hold_without_signal(vi));
                continue;
            }
            let mut claim = budget.min(share);
            let before = claim;
            let again = demoted_from[vi];
            let s = self.plan_vm(vi, &mut free, &mut claim, &mut moves, again, now);
            budget -= before - claim;
            // (a claim used up, or a unit larger than what was left of it)
            if (claim == 0 || s.deferred_by_budget > 0) && budget > 0 {
                wanting_more.push((vi, stats.vms.len()));
            }
            stats.vms.push(s);
        }
        for (vi, at) in wanting_more {
            if budget == 0 {
                break;
            }
            let s = self.plan_vm(vi, &mut free, &mut budget, &mut moves, true, now);
            stats.vms[at].continued_by(&s);
            self.vms[vi].last_stats = stats.vms[at].clone();
        }
        // Execution order across VMs: by phase, stable.
        moves.sort_by_key(|m| m.phase);
        for m in &moves {
            match m.kind.direction() {
                Direction::Promote => stats.promote_bytes += m.bytes(),
                Direction::Demote => stats.demote_bytes += m.bytes(),
            }
        }
        Plan { moves, stats }
    }
}

impl VtismPolicy {
    /// The no-signal rule: a VM never observed (no hints, no host-side accesses) has nothing to
    /// rank its frames by, so any demotion would be blind (address order) and could leave it
    /// worse off than doing nothing. It keeps its placement, even over its quota, until its
    /// first observation.
    fn hold_without_signal(&mut self, vi: usize) -> VmPlanStats {
        let (fast, slow) = self.tier_frames(&self.vms[vi]);
        let v = &mut self.vms[vi];
        let stats = VmPlanStats {
            vm: Some(v.spec.id),
            quota_frames: v.spec.fast_quota_bytes / FRAME_SIZE,
            fast_frames: fast,
            slow_frames: slow,
            unknown_frames: v.frames.len() as u64 - fast - slow,
            no_signal: true,
            ..Default::default()
        };
        v.dirty = false;
        v.last_stats = stats.clone();
        stats
    }

    /// Mark every VM for planning (after a topology or parameter change, or a reconcile).
    pub fn mark_all_dirty(&mut self) {
        self.vms.iter_mut().for_each(|v| v.dirty = true);
    }

    /// Recount a VM's level histogram from its frames and compare with the one kept
    /// incrementally. O(frames): for tests and debugging.
    pub fn check_histogram(&self, vm: VmId) -> Result<(), String> {
        let v = &self.vms[self.vm_pos(vm).map_err(|e| e.to_string())?];
        let mut fresh = vec![[0u64; 4]; RING + 1];
        v.frames.for_each_run(0..v.frames.len(), |_, s, n| {
            if let Some((k, c)) = v.hist_pos(&self.tables, s) {
                fresh[k][c] += n as u64;
            }
        });
        match fresh.iter().zip(&v.hist).position(|(a, b)| a != b) {
            None => Ok(()),
            Some(k) => Err(format!(
                "slot {k}: recounted {:?}, kept {:?}",
                fresh[k], v.hist[k]
            )),
        }
    }

    /// Page type the engine last heard for a frame.
    pub fn frame_type(&self, vm: VmId, gfn: Gfn) -> Result<PageType, EngineError> {
        let v = &self.vms[self.vm_pos(vm)?];
        let idx = v
            .spec
            .ram
            .index_of(gfn)
            .ok_or(EngineError::OutOfMap { vm, gfn, frames: 1 })?;
        Ok(v.frames.get(idx as usize).page_type())
    }

    /// The VM's RAM map.
    pub fn ram(&self, vm: VmId) -> Result<&RamMap, EngineError> {
        Ok(&self.vms[self.vm_pos(vm)?].spec.ram)
    }
}
