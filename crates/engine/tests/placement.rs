//! Multi-socket placement: promotions follow the VM's node order (local DRAM, remote DRAM) and
//! demotions theirs (local slow, remote slow), falling back only when a node is full; when the
//! fast nodes are full, hot slow frames are exchanged with colder fast ones in the same plan.
//! Checked against a ground-truth world with real node capacities, move by move.

use proptest::prelude::*;
use vtism_engine::synth::GupsHotSet;
use vtism_engine::*;
use vtism_proto::{Gfn, HintEntry, PageType, RamMap, FRAME_SIZE};

/// Socket 0: DRAM node 0, CXL node 2. Socket 1: DRAM node 1, CXL node 3.
const LOCAL_DRAM: NodeId = NodeId(0);
const REMOTE_DRAM: NodeId = NodeId(1);
const LOCAL_SLOW: NodeId = NodeId(2);
const REMOTE_SLOW: NodeId = NodeId(3);
const NODES: [NodeId; 4] = [LOCAL_DRAM, REMOTE_DRAM, LOCAL_SLOW, REMOTE_SLOW];

fn two_sockets(cap_frames: [u64; 4]) -> Topology {
    let node = |i: usize, tier, socket, cpus: Vec<u32>| NodeSpec {
        id: NODES[i],
        tier: Tier(tier),
        capacity_bytes: cap_frames[i] * FRAME_SIZE,
        cpus,
        socket,
    };
    Topology::new(
        vec![
            node(0, 0, 0, vec![0]),
            node(1, 0, 1, vec![1]),
            node(2, 1, 0, vec![]),
            node(3, 1, 1, vec![]),
        ],
        // SLIT-like: remote DRAM 21, local CXL 14, remote CXL 24 (from DRAM nodes).
        Some(vec![
            vec![10, 21, 14, 24],
            vec![21, 10, 24, 14],
            vec![14, 24, 10, 26],
            vec![24, 14, 26, 10],
        ]),
    )
    .unwrap()
}

struct World {
    engine: VtismPolicy,
    vm: VmId,
    quota: u64,
    cap: [u64; 4],
    /// Frames used on each node by something else (other tenants, the host).
    other: [u64; 4],
    truth: Vec<NodeId>,
    /// The VM's frames per node, kept with `truth`.
    held: [u64; 4],
    now: Nanos,
    /// Free frames the driver keeps on each DRAM node (its floor for promotions, and the
    /// watermark below which the engine demotes to restore it).
    watermark: u64,
}

impl World {
    fn new(cap: [u64; 4], other: [u64; 4], quota: u64, placement: Vec<NodeId>) -> World {
        let mut engine = VtismPolicy::new(two_sockets(cap), EngineParams::default()).unwrap();
        let vm = VmId(1);
        let frames = placement.len() as u64;
        engine
            .add_vm(VmSpec {
                id: vm,
                ram: RamMap::contiguous(frames),
                fast_quota_bytes: quota * FRAME_SIZE,
                home_node: Some(LOCAL_DRAM),
            })
            .unwrap();
        for (i, &n) in placement.iter().enumerate() {
            engine.set_placement(vm, Gfn(i as u64), 1, Some(n)).unwrap();
        }
        let mut held = [0; 4];
        placement.iter().for_each(|n| held[n.0 as usize] += 1);
        World {
            engine,
            vm,
            quota,
            cap,
            other,
            held,
            truth: placement,
            now: Nanos(0),
            watermark: 0,
        }
    }

    fn used(&self, n: NodeId) -> u64 {
        self.other[n.0 as usize] + self.held[n.0 as usize]
    }
    fn free(&self, n: NodeId) -> u64 {
        self.cap[n.0 as usize].saturating_sub(self.used(n))
    }
    fn fast(&self) -> u64 {
        self.held[0] + self.held[1]
    }

    /// One round: hints, a plan with the nodes' real free memory, executed phase by phase, move by
    /// move. Checks capacity, quota, the "from" node, and the node order of every move.
    fn step(&mut self, hints: &[vtism_proto::HintEntry]) -> Result<Plan, TestCaseError> {
        self.now = Nanos(self.now.0 + 1_000_000_000);
        self.engine
            .observe(
                self.vm,
                Observation::Hints {
                    entries: hints,
                    overflow: false,
                    counts: vtism_proto::CountMeaning::RoundsSeen,
                },
                self.now,
            )
            .unwrap();
        let floor = |n: NodeId| if n.0 < 2 { self.watermark } else { 0 };
        let free: Vec<(NodeId, u64)> = NODES
            .iter()
            .map(|&n| (n, self.free(n).saturating_sub(floor(n)) * FRAME_SIZE))
            .collect();
        let short: Vec<(NodeId, u64)> = NODES
            .iter()
            .filter(|&&n| self.free(n) < floor(n))
            .map(|&n| (n, (floor(n) - self.free(n)) * FRAME_SIZE))
            .collect();
        let plan = self.engine.plan(
            &PlanContext {
                node_free_bytes: &free,
                budget_bytes: None,
                node_short_bytes: &short,
            },
            self.now,
        );
        let start_fast = self.fast();
        let phases = Phase::ALL;
        for phase in phases {
            let moves: Vec<&Move> = plan.phase(phase).collect();
            for m in &moves {
                for i in m.gfn.0..m.gfn.0 + m.frames {
                    prop_assert_eq!(self.truth[i as usize], m.from, "{:?}: wrong source", m);
                    self.truth[i as usize] = m.to;
                }
                self.held[m.from.0 as usize] -= m.frames;
                self.held[m.to.0 as usize] += m.frames;
                prop_assert!(
                    self.used(m.to) <= self.cap[m.to.0 as usize],
                    "{:?} overfills {}",
                    m,
                    m.to
                );
                if m.kind == MoveKind::Promote {
                    prop_assert!(
                        self.fast() <= self.quota.max(start_fast),
                        "{:?} exceeds the quota",
                        m
                    );
                }
            }
            // Node order: after the phase, a move that went to a less preferred node left no room
            // for it on a preferred one (the planner packs the preferred nodes first).
            for m in &moves {
                let order: &[NodeId] = match m.kind {
                    MoveKind::Promote => &[LOCAL_DRAM, REMOTE_DRAM],
                    MoveKind::Home => &[LOCAL_DRAM],
                    MoveKind::NearSlow => &[LOCAL_SLOW],
                    MoveKind::Demote | MoveKind::Refill => &[LOCAL_SLOW, REMOTE_SLOW],
                };
                let pos = order.iter().position(|&n| n == m.to);
                prop_assert!(pos.is_some(), "{:?} goes to the wrong tier", m);
                for &better in &order[..pos.unwrap()] {
                    prop_assert!(
                        self.free(better) < m.frames,
                        "{:?} skipped {} which has {} free frames after {:?}",
                        m,
                        better,
                        self.free(better),
                        phase
                    );
                }
            }
        }
        Ok(plan)
    }

    fn hot_in_fast(&self, g: &GupsHotSet) -> f64 {
        let hot = g.hot_start..g.hot_start + g.hot_frames;
        let fast = hot
            .clone()
            .filter(|&i| matches!(self.truth[i as usize], LOCAL_DRAM | REMOTE_DRAM))
            .count();
        fast as f64 / g.hot_frames as f64
    }
}

/// Local DRAM with room for 1000 frames (another tenant holds 3000), remote DRAM for plenty, and
/// a VM whose 3000 hot frames start on remote CXL.
fn local_dram_nearly_full() -> (World, GupsHotSet) {
    let frames = 8192;
    let w = World::new(
        [4000, 16_384, 16_384, 16_384],
        [3000, 0, 0, 0],
        4096,
        vec![REMOTE_SLOW; frames],
    );
    (w, GupsHotSet::new(Gfn(0), frames as u64, 3000, 0.0, 3))
}

#[test]
fn promotions_fall_back_to_remote_dram_and_demotions_go_local_first() {
    let (mut w, mut g) = local_dram_nearly_full();
    let mut to_local = 0;
    let mut to_remote = 0;
    for _ in 0..4 {
        let h = g.round();
        let plan = w.step(&h).unwrap();
        for m in plan.moves.iter().filter(|m| m.kind == MoveKind::Promote) {
            match m.to {
                LOCAL_DRAM => to_local += m.frames,
                REMOTE_DRAM => to_remote += m.frames,
                _ => unreachable!(),
            }
        }
    }
    assert_eq!(to_local, 1000, "local DRAM filled first");
    assert_eq!(to_remote, 2000, "the rest on remote DRAM, not left on CXL");
    assert!(w.hot_in_fast(&g) >= 0.999);
}

#[test]
fn frames_on_remote_dram_come_home_once_local_dram_has_room() {
    // As above, 2000 of the hot frames go to remote DRAM. Then the other tenant leaves local
    // DRAM: they move home, hottest first, and the VM's fast memory does not change.
    let (mut w, mut g) = local_dram_nearly_full();
    for _ in 0..4 {
        let plan = w.step(&g.round()).unwrap();
        assert!(plan.moves.iter().all(|m| m.kind != MoveKind::Home));
    }
    assert_eq!(w.held[REMOTE_DRAM.0 as usize], 2000);
    let fast = w.fast();
    w.other[LOCAL_DRAM.0 as usize] = 1500;
    let mut home = 0;
    for _ in 0..3 {
        let plan = w.step(&g.round()).unwrap();
        for m in plan.moves.iter().filter(|m| m.kind == MoveKind::Home) {
            assert_eq!((m.from, m.to), (REMOTE_DRAM, LOCAL_DRAM), "{m:?}");
            home += m.frames;
        }
        assert_eq!(
            plan.stats.promote_bytes,
            plan.stats.vms[0].home_frames * FRAME_SIZE
        );
    }
    assert_eq!(home, 1500, "as many as local DRAM has room for");
    assert_eq!(w.held[LOCAL_DRAM.0 as usize], 2500);
    assert_eq!(
        w.fast(),
        fast,
        "locality moves leave the VM's fast memory as it was"
    );
    assert!(w.hot_in_fast(&g) >= 0.999);
}

#[test]
fn a_dram_node_filled_by_others_gets_its_watermark_back_from_the_coldest_frames() {
    // The VM holds 3000 frames on local DRAM, 1000 of them hot; remote DRAM is full. Another
    // tenant then takes local DRAM down to 200 free frames against a watermark of 1000: the
    // engine demotes 800 of the VM's cold frames there, no hot one, and nothing takes the room back.
    let mut placement = vec![LOCAL_SLOW; 8192];
    placement[..3000].iter_mut().for_each(|n| *n = LOCAL_DRAM);
    let mut w = World::new(
        [4000, 4000, 16_384, 16_384],
        [0, 4000, 0, 0],
        4096,
        placement,
    );
    w.watermark = 1000;
    let hot: Vec<HintEntry> = (0..1000)
        .map(|i| HintEntry::new(Gfn(i), 8, false, PageType::Anon, false, true))
        .collect();
    for _ in 0..3 {
        let plan = w.step(&hot).unwrap();
        assert_eq!(plan.stats.watermark_bytes, 0);
    }
    w.other[LOCAL_DRAM.0 as usize] = 800;
    let plan = w.step(&hot).unwrap();
    assert_eq!(plan.stats.watermark_bytes, 800 * FRAME_SIZE);
    assert!(plan
        .moves
        .iter()
        .all(|m| m.kind == MoveKind::Refill && m.from == LOCAL_DRAM && m.gfn.0 >= 1000));
    assert_eq!(w.free(LOCAL_DRAM), 1000);
    assert!(
        (0..1000).all(|i| w.truth[i] == LOCAL_DRAM),
        "the hot frames stay"
    );
    for _ in 0..3 {
        let plan = w.step(&hot).unwrap();
        assert!(plan.moves.is_empty(), "{:?}", plan.moves.first());
    }
}

#[test]
fn full_fast_nodes_exchange_hot_slow_frames_with_cold_fast_ones() {
    // Both DRAM nodes full (the VM holds 2000 cold frames there, others the rest), quota ample:
    // waiting for free room would never end; the engine must swap.
    let frames = 8192usize;
    let mut placement = vec![LOCAL_SLOW; frames];
    // Cold frames 0..2000 on local DRAM; the hot set (2000..3500) on slow memory.
    placement[..2000].iter_mut().for_each(|n| *n = LOCAL_DRAM);
    let mut w = World::new(
        [4000, 4000, 16_384, 16_384],
        [2000, 4000, 0, 0],
        6000,
        placement,
    );
    let mut g = GupsHotSet::new(Gfn(0), frames as u64, 1500, 0.0, 9);
    g.move_hot_set(2000);
    let mut exchanged = false;
    for _ in 0..6 {
        let h = g.round();
        let plan = w.step(&h).unwrap();
        let p: u64 = plan
            .moves
            .iter()
            .filter(|m| m.kind == MoveKind::Promote)
            .map(|m| m.frames)
            .sum();
        let d: u64 = plan
            .moves
            .iter()
            .filter(|m| m.kind == MoveKind::Demote)
            .map(|m| m.frames)
            .sum();
        if p > 0 {
            assert_eq!(p, d, "an exchange promotes what it demotes");
            assert!(plan
                .moves
                .iter()
                .filter(|m| m.kind == MoveKind::Promote)
                .all(|m| m.phase == Phase::PromoteAfterDemote));
            exchanged = true;
        }
    }
    assert!(exchanged);
    assert!(w.hot_in_fast(&g) >= 0.999, "{}", w.hot_in_fast(&g));
    assert_eq!(
        w.fast(),
        2000,
        "the VM's fast memory did not grow: nodes were full"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Arbitrary capacities, other tenants and starting placements: every move respects node
    /// capacity, the quota and the node order; and whenever the VM can hold its hot set in the
    /// fast memory it has or can get, the hot set ends up there (exchanging if the nodes are
    /// full).
    #[test]
    fn node_order_capacity_and_exchange(
        dram in (500u64..6000, 500u64..6000),
        other in (0u64..6000, 0u64..6000, 0u64..4000, 0u64..4000),
        quota in 500u64..8000,
        hot in 100u64..3000,
        hot_start in 0u64..4000,
        seed in any::<u64>(),
        start in prop::collection::vec(0usize..4, 16),
    ) {
        let frames = 8192u64;
        let cap = [dram.0, dram.1, 12_000, 12_000];
        // Others never hold more than the node has.
        let other = [other.0.min(cap[0]), other.1.min(cap[1]), other.2, other.3];
        // The VM's frames start in 16 chunks on arbitrary nodes, as long as they fit.
        let mut placement = Vec::with_capacity(frames as usize);
        let mut used = other;
        for &c in &start {
            for _ in 0..frames / 16 {
                let n = (0..4).map(|k| (c + k) % 4).find(|&n| used[n] < cap[n]).unwrap();
                used[n] += 1;
                placement.push(NODES[n]);
            }
        }
        let mut w = World::new(cap, other, quota, placement);
        let mut g = GupsHotSet::new(Gfn(0), frames, hot, 0.002, seed);
        g.move_hot_set(hot_start);
        for _ in 0..24 {
            let h = g.round();
            w.step(&h)?;
        }
        let fast_now = w.fast();
        let reserve = 512; // reserve_min_bytes (2 MiB)
        let can_hold = fast_now.max(quota.saturating_sub(reserve));
        if hot + 64 <= can_hold.min(fast_now + w.free(LOCAL_DRAM) + w.free(REMOTE_DRAM)) {
            prop_assert!(w.hot_in_fast(&g) >= 0.95, "hot in fast {}", w.hot_in_fast(&g));
        }
    }
}

#[test]
fn frames_accessed_on_remote_slow_memory_move_to_local_slow_memory_once_it_has_room() {
    // 8192 frames on remote CXL, a quota of 1400 (1050 less the reserve): the 1000 hot ones go
    // to local DRAM, 2000 warm ones (seen in 3 and 2 rounds of 8) mostly stay slow, the rest is
    // never touched. Local CXL is full at first; when 1500 frames of it free up, the warm frames
    // move there, warmer first, and the untouched ones stay where they are.
    let mut w = World::new(
        [4000, 16_384, 16_384, 16_384],
        [0, 0, 16_384, 0],
        1400,
        vec![REMOTE_SLOW; 8192],
    );
    let hint = |i: u64, count| HintEntry::new(Gfn(i), count, false, PageType::Anon, false, true);
    let hints: Vec<HintEntry> = (0..1000)
        .map(|i| hint(i, 8))
        .chain((1000..2000).map(|i| hint(i, 3)))
        .chain((2000..3000).map(|i| hint(i, 2)))
        .collect();
    for _ in 0..4 {
        let plan = w.step(&hints).unwrap();
        assert!(plan.moves.iter().all(|m| m.kind != MoveKind::NearSlow));
    }
    assert!((0..1000).all(|i| w.truth[i] == LOCAL_DRAM));
    let fast = w.fast();
    w.other[LOCAL_SLOW.0 as usize] = 16_384 - 1500;
    let mut near = 0;
    for _ in 0..12 {
        let plan = w.step(&hints).unwrap();
        for m in plan.moves.iter().filter(|m| m.kind == MoveKind::NearSlow) {
            assert_eq!(
                (m.from, m.to, m.phase),
                (REMOTE_SLOW, LOCAL_SLOW, Phase::Background)
            );
            near += m.frames;
        }
        assert_eq!(
            plan.moves
                .iter()
                .filter(|m| m.kind == MoveKind::NearSlow)
                .map(|m| m.frames)
                .sum::<u64>(),
            plan.stats.vms[0].near_slow_frames
        );
    }
    assert_eq!(near, 1500, "as many as local CXL has room for");
    assert!(
        (1000..2000).all(|i| w.truth[i] != REMOTE_SLOW),
        "the warmer ones first"
    );
    assert!(
        (3000..8192).all(|i| w.truth[i] == REMOTE_SLOW),
        "untouched memory stays"
    );
    assert_eq!(w.fast(), fast, "the VM's fast memory is as it was");
}
