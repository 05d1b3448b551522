//! The tiering round both drivers share (`Tiering`): the cut to per-VM rate allowances and its
//! undo keep the engine's quota guarantee and leave the engine's belief equal to where frames
//! really are; placement facts through the one coalescer mean the same as the facts one by one;
//! the pool's demand follows one rule for rate levels and rounds seen.

mod common;

use common::{topo, FAST, SLOW};
use proptest::prelude::*;
use std::collections::BTreeMap;
use vtism_engine::*;
use vtism_proto::{CountMeaning, Gfn, GfnRange, HintEntry, PageType, RamMap, FRAME_SIZE};

const FRAMES: u64 = 1024;
/// Initial quota of each VM; the pool is their sum.
const SHARE: u64 = 256 * FRAME_SIZE;

fn tiering(mode: PoolMode, vms: u32) -> Tiering {
    let engine = VtismPolicy::new(topo(1 << 40, 1 << 40), EngineParams::default()).unwrap();
    let pool = FastPool::new(PoolParams {
        mode,
        fast_bytes: SHARE * vms as u64,
        rebalance_interval: Nanos::from_secs(1),
        max_step_fraction: 0.25,
        ..Default::default()
    })
    .unwrap();
    Tiering::new(engine, pool)
}

fn limits() -> VmLimits {
    VmLimits {
        min_bytes: SHARE / 4 * 3,
        max_bytes: SHARE / 4 * 5,
        shares: 1,
    }
}

fn spec(id: u32, ram: RamMap) -> VmSpec {
    VmSpec {
        id: VmId(id),
        ram,
        fast_quota_bytes: 0,
        home_node: Some(FAST),
    }
}

fn hints(frames: &[u64], count: u8) -> Vec<HintEntry> {
    frames
        .iter()
        .map(|&g| HintEntry::new(Gfn(g), count as u32, false, PageType::Anon, false, true))
        .collect()
}

/// One validated hint round of `frames` at `count`.
fn observe(t: &mut Tiering, vm: VmId, frames: &[u64], count: u8, counts: CountMeaning, now: Nanos) {
    let obs = Observation::Hints {
        entries: &hints(frames, count),
        overflow: false,
        counts,
    };
    t.observe(vm, obs, now).unwrap();
}

/// Ground truth of two VMs' frames, starting on the slow node.
struct Truth {
    node: BTreeMap<VmId, Vec<NodeId>>,
}

impl Truth {
    fn fast(&self, vm: VmId) -> u64 {
        self.node[&vm].iter().filter(|&&n| n == FAST).count() as u64
    }
}

#[derive(Clone, Debug)]
struct Step {
    /// Per VM: hot frames hinted this round, and their rate level.
    hot: Vec<(Vec<u64>, u8)>,
    /// Per VM and direction: frames the VM may move this round (`None`: unlimited).
    allowance: Vec<[Option<u64>; 2]>,
    budget_frames: Option<u64>,
}

fn step(vms: usize) -> impl Strategy<Value = Step> {
    let hot = (proptest::collection::vec(0..FRAMES, 0..400), 100u8..200);
    let allow = proptest::option::of(0u64..200);
    (
        proptest::collection::vec(hot, vms),
        proptest::collection::vec([allow.clone(), allow], vms),
        proptest::option::of(64u64..2048),
    )
        .prop_map(|(hot, allowance, budget_frames)| Step {
            hot,
            allowance,
            budget_frames,
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Rounds with random hints, budgets and rate allowances, executed phase by phase against a
    /// ground truth: every move starts where the frames really are (so the cut was undone in the
    /// engine), no VM ever holds more fast memory than its quota (or, while shrinking to a
    /// smaller one, than it held), cut moves did not happen, and after each round the engine
    /// believes exactly what is true.
    #[test]
    fn the_cut_and_its_undo_keep_the_quota_and_the_truth(
        steps in proptest::collection::vec(step(2), 1..24),
        pool_mode in any::<bool>(),
    ) {
        let mode = if pool_mode { PoolMode::Pool } else { PoolMode::Island };
        let mut t = tiering(mode, 2);
        let mut truth = Truth { node: BTreeMap::new() };
        for id in [1, 2] {
            t.add_vm(spec(id, RamMap::contiguous(FRAMES)), limits(), Nanos(0)).unwrap();
            t.learn([PlacementRun { vm: VmId(id), gfn: Gfn(0), frames: FRAMES, node: Some(SLOW) }]);
            truth.node.insert(VmId(id), vec![SLOW; FRAMES as usize]);
        }
        for (k, s) in steps.iter().enumerate() {
            let now = Nanos::from_secs(k as u64 + 1);
            let mut allowances = Allowances::new();
            for (i, (hot, level)) in s.hot.iter().enumerate() {
                let vm = VmId(i as u32 + 1);
                t.observe(vm, Observation::Hints {
                    entries: &hints(hot, *level),
                    overflow: false,
                    counts: CountMeaning::RateLevel,
                }, now).unwrap();
                for (dir, a) in Direction::ALL.into_iter().zip(s.allowance[i]) {
                    if let Some(frames) = a {
                        allowances.insert((vm, dir), frames * FRAME_SIZE);
                    }
                }
            }
            let start: BTreeMap<VmId, u64> = t.vms().map(|vm| (vm, truth.fast(vm))).collect();
            let ctx = PlanContext {
                budget_bytes: s.budget_frames.map(|f| f * FRAME_SIZE),
                ..Default::default()
            };
            let out = t.round(&ctx, &allowances, now);
            // What each VM moved, per direction, stays within its allowance.
            let mut moved: BTreeMap<(VmId, Direction), u64> = BTreeMap::new();
            for m in &out.plan.moves {
                *moved.entry((m.vm, m.kind.direction())).or_default() += m.bytes();
            }
            for (key, bytes) in &moved {
                if let Some(a) = allowances.get(key) {
                    prop_assert!(bytes <= a, "{:?} moved {} over its allowance {}", key, bytes, a);
                }
            }
            for m in &out.deferred {
                let nodes = &truth.node[&m.vm];
                for g in m.gfn.0..m.gfn.0 + m.frames {
                    prop_assert_eq!(nodes[g as usize], m.from, "deferred {:?} is not where it was", m);
                    prop_assert_eq!(t.engine().frame_node(m.vm, Gfn(g)).unwrap(), Some(m.from));
                }
            }
            for m in &out.plan.moves {
                let nodes = truth.node.get_mut(&m.vm).unwrap();
                for g in m.gfn.0..m.gfn.0 + m.frames {
                    prop_assert_eq!(nodes[g as usize], m.from, "{:?} does not start where frame {} is", m, g);
                    nodes[g as usize] = m.to;
                }
                let quota = t.pool().quota(m.vm).unwrap() / FRAME_SIZE;
                let fast = truth.fast(m.vm);
                prop_assert!(
                    fast <= quota.max(start[&m.vm]),
                    "after {:?}: {} fast frames, quota {}, {} at the start", m, fast, quota, start[&m.vm]
                );
            }
            for vm in t.vms().collect::<Vec<_>>() {
                for (g, n) in truth.node[&vm].iter().enumerate() {
                    prop_assert_eq!(t.engine().frame_node(vm, Gfn(g as u64)).unwrap(), Some(*n));
                }
                t.engine().check_histogram(vm).map_err(TestCaseError::fail)?;
            }
            prop_assert!(t.pool().allocated_bytes() <= t.pool().params().fast_bytes);
        }
    }

    /// Facts through `Tiering::learn`, in any order, with duplicates, holes, unknown VMs and
    /// nodes, leave the engine where the same facts applied one frame at a time do, and count
    /// the frames whose placement changed.
    #[test]
    fn facts_in_runs_mean_what_they_mean_one_by_one(
        facts in proptest::collection::vec((1u32..4, 0u64..3100, 1u64..40, proptest::option::of(0u8..3)), 0..200),
    ) {
        // Two adjacent QEMU regions and one after a hole: a run may cross none of the gaps.
        let ram = RamMap::new(vec![
            GfnRange::new(Gfn(0), Gfn(1000)),
            GfnRange::new(Gfn(1000), Gfn(2000)),
            GfnRange::new(Gfn(3000), Gfn(3064)),
        ]).unwrap();
        let mut t = tiering(PoolMode::Island, 2);
        let mut one_by_one = VtismPolicy::new(topo(1 << 40, 1 << 40), EngineParams::default()).unwrap();
        for id in [1, 2] {
            t.add_vm(spec(id, ram.clone()), limits(), Nanos(0)).unwrap();
            one_by_one.add_vm(VmSpec { fast_quota_bytes: SHARE, ..spec(id, ram.clone()) }).unwrap();
        }
        let facts: Vec<PlacementRun> = facts
            .into_iter()
            .map(|(vm, g, n, node)| PlacementRun { vm: VmId(vm), gfn: Gfn(g), frames: n, node: node.map(NodeId) })
            .collect();
        let mut expect_changed = 0u64;
        for f in &facts {
            for g in f.gfn.0..f.gfn.0 + f.frames {
                let before = one_by_one.frame_node(f.vm, Gfn(g));
                if one_by_one.set_placement(f.vm, Gfn(g), 1, f.node).is_ok() && before != Ok(f.node) {
                    expect_changed += 1;
                }
            }
        }
        let changed = t.learn(facts.iter().copied());
        for id in [1, 2] {
            let vm = VmId(id);
            for r in ram.ranges() {
                for g in r.start.0..r.end.0 {
                    prop_assert_eq!(t.engine().frame_node(vm, Gfn(g)), one_by_one.frame_node(vm, Gfn(g)), "frame {}", g);
                }
            }
            t.engine().check_histogram(vm).map_err(TestCaseError::fail)?;
        }
        // Facts naming node 2, which the topology lacks, count as changes but change nothing.
        let unknown_node: u64 = facts
            .iter()
            .filter(|f| f.node == Some(NodeId(2)) && f.vm.0 <= 2)
            .count() as u64;
        if unknown_node == 0 {
            prop_assert_eq!(changed, expect_changed);
        }
    }
}

/// Sorted single-frame facts reach the engine as one run per node and RAM range: four facts
/// about frames 990..1010 across the boundary at 1000 are two runs, seen as two changes of the
/// engine's histogram class at most.
#[test]
fn sorted_facts_make_one_run_per_range() {
    let ram = RamMap::new(vec![
        GfnRange::new(Gfn(0), Gfn(1000)),
        GfnRange::new(Gfn(1000), Gfn(2000)),
    ])
    .unwrap();
    let mut t = tiering(PoolMode::Island, 1);
    t.add_vm(spec(1, ram), limits(), Nanos(0)).unwrap();
    let facts: Vec<PlacementRun> = (990..1010)
        .map(|g| PlacementRun::frame(VmId(1), Gfn(g), Some(SLOW)))
        .collect();
    let runs = coalesce(facts.iter().copied(), |r| {
        t.engine()
            .ram(r.vm)
            .is_ok_and(|m| m.contains_span(r.gfn, r.frames))
    });
    assert_eq!(
        runs.iter().map(|r| (r.gfn.0, r.frames)).collect::<Vec<_>>(),
        vec![(990, 10), (1000, 10)]
    );
    assert_eq!(t.learn(facts.iter().copied()), 20);
    // Learned once, the same facts change nothing.
    assert_eq!(t.learn(facts), 0);
}

/// One demand rule: a rate-level VM (v1.1) asks the pool from its first round; a rounds-seen
/// VM (v1.0, host-side counts) only once its history window (`count_cap` rounds) is full, and
/// until then is not shrunk for what its young estimate says.
#[test]
fn demand_waits_for_a_full_history_of_rounds_seen_but_not_for_rates() {
    let mut t = tiering(PoolMode::Pool, 2);
    for id in [1, 2] {
        t.add_vm(spec(id, RamMap::contiguous(FRAMES)), limits(), Nanos(0))
            .unwrap();
        t.learn([PlacementRun {
            vm: VmId(id),
            gfn: Gfn(0),
            frames: FRAMES,
            node: Some(SLOW),
        }]);
    }
    let hot: Vec<u64> = (0..16).collect();
    let cap = u64::from(t.engine().params().count_cap);
    for round in 1..=cap {
        let now = Nanos::from_secs(round);
        observe(&mut t, VmId(1), &hot, 160, CountMeaning::RateLevel, now);
        observe(&mut t, VmId(2), &hot, 4, CountMeaning::RoundsSeen, now);
        let asked: Vec<VmId> = t.demands().into_iter().map(|(vm, _)| vm).collect();
        if round < cap {
            assert_eq!(asked, vec![VmId(1)], "round {round}");
        } else {
            assert_eq!(asked, vec![VmId(1), VmId(2)], "round {round}");
        }
        let out = t.round(&PlanContext::default(), &Allowances::new(), now);
        // VM 2's young estimate (16 frames) would shrink it: it has none yet, so it only grows
        // into what VM 1 gives back.
        if round < cap {
            assert!(
                out.quota_changes
                    .iter()
                    .all(|c| c.vm == VmId(1) || c.reason != QuotaReason::Shrink),
                "round {round}: {:?}",
                out.quota_changes
            );
        }
    }
    // Re-registered (a reset): the engine forgets, the rule starts again, the quota stays.
    let quota = t.pool().quota(VmId(2));
    t.reregister_vm(spec(2, RamMap::contiguous(FRAMES)))
        .unwrap();
    assert_eq!(
        t.demands()
            .into_iter()
            .map(|(vm, _)| vm)
            .collect::<Vec<_>>(),
        vec![VmId(1)]
    );
    assert_eq!(t.pool().quota(VmId(2)), quota);
    assert_eq!(t.engine().fast_quota(VmId(2)), quota);
}

/// Admission is all or nothing: a VM whose minimum does not fit, or whose RAM the engine
/// refuses, leaves neither the pool nor the engine changed; a reconfiguration that does not fit
/// changes nothing either.
#[test]
fn admission_and_reconfiguration_change_nothing_when_refused() {
    let mut t = tiering(PoolMode::Pool, 2);
    t.add_vm(spec(1, RamMap::contiguous(FRAMES)), limits(), Nanos(0))
        .unwrap();
    let greedy = VmLimits {
        min_bytes: SHARE * 2,
        max_bytes: SHARE * 2,
        shares: 1,
    };
    let e = t
        .add_vm(spec(2, RamMap::contiguous(FRAMES)), greedy, Nanos(0))
        .unwrap_err();
    assert!(
        matches!(e, RoundError::Pool(PoolError::Infeasible { .. })),
        "{e}"
    );
    assert!(t.engine().ram(VmId(2)).is_err());
    let homeless = VmSpec {
        home_node: Some(NodeId(9)),
        ..spec(3, RamMap::contiguous(FRAMES))
    };
    let e = t.add_vm(homeless, limits(), Nanos(0)).unwrap_err();
    assert_eq!(e, RoundError::Engine(EngineError::UnknownNode(NodeId(9))));
    assert_eq!(t.pool().vms().collect::<Vec<_>>(), vec![VmId(1)]);
    let before = t.pool().quota(VmId(1));
    let tiny = PoolParams {
        fast_bytes: SHARE / 2,
        ..*t.pool().params()
    };
    assert!(t
        .reconfigure(tiny, &BTreeMap::new(), &[], None, Nanos(1))
        .is_err());
    assert_eq!(t.pool().quota(VmId(1)), before);
    // Leaving VM 1 out makes the same pool fit.
    let changes = t
        .reconfigure(tiny, &BTreeMap::new(), &[VmId(1)], None, Nanos(1))
        .unwrap();
    assert!(changes.is_empty(), "{changes:?}");
    assert_eq!(t.vms().count(), 0);
    assert!(t.engine().ram(VmId(1)).is_err());
}

/// A VM whose vCPUs move to another node keeps what the engine learnt: the hot frames it
/// promoted stay where they are, no frame's placement becomes unknown, and the next round with
/// the same hints moves nothing (a reset would have to relearn both). A node the topology
/// lacks is refused and changes nothing.
#[test]
fn a_new_home_keeps_hotness_and_placement() {
    let mut t = tiering(PoolMode::Island, 1);
    let vm = VmId(1);
    t.add_vm(spec(1, RamMap::contiguous(FRAMES)), limits(), Nanos(0))
        .unwrap();
    t.learn([PlacementRun {
        vm,
        gfn: Gfn(0),
        frames: FRAMES,
        node: Some(SLOW),
    }]);
    let hot: Vec<u64> = (100..164).collect();
    let round = |t: &mut Tiering, s: u64| {
        let now = Nanos::from_secs(s);
        observe(t, vm, &hot, 160, CountMeaning::RateLevel, now);
        t.round(&PlanContext::default(), &Allowances::new(), now)
    };
    let mut promoted = 0;
    for s in 1..=4 {
        promoted += round(&mut t, s)
            .plan
            .moves
            .iter()
            .filter(|m| m.to == FAST)
            .map(|m| m.frames)
            .sum::<u64>();
    }
    assert_eq!(promoted, hot.len() as u64, "the hot frames were promoted");
    let before = t.engine().summary(vm).unwrap();

    assert!(t.set_home(vm, Some(NodeId(7))).is_err());
    t.set_home(vm, Some(SLOW)).unwrap();
    let after = t.engine().summary(vm).unwrap();
    assert_eq!(
        (after.fast_frames, after.unknown_frames, after.rounds),
        (before.fast_frames, 0, before.rounds)
    );
    let out = round(&mut t, 5);
    assert!(out.plan.is_empty(), "{:?}", out.plan.moves);
}
