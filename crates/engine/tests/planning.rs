//! Planner properties: quota, budget, VM bounds, convergence, no ping-pong.

mod common;

use common::*;
use proptest::prelude::*;
use vtism_engine::synth::GupsHotSet;
use vtism_engine::*;
use vtism_proto::{Gfn, HintEntry, PageType, FRAME_SIZE};

fn hot_in_fast(w: &World, g: &GupsHotSet) -> f64 {
    let hot: Vec<usize> = (g.hot_start..g.hot_start + g.hot_frames)
        .map(|o| o as usize)
        .collect();
    hot.iter().filter(|&&i| w.truth[i] == FAST).count() as f64 / hot.len() as f64
}

#[test]
fn gups_hot_set_reaches_fast_memory_when_it_fits() {
    // 1 GiB VM, hot set 100 MiB, quota 256 MiB, everything starts on the slow node except 256 MiB
    // of cold first-touch memory filling the quota: promotions must displace cold frames.
    let frames = 262_144;
    let params = EngineParams {
        round_budget_bytes: 64 << 20,
        ..Default::default()
    };
    let mut w = World::new(frames, 65_536, params, 65_536);
    let mut g = GupsHotSet::new(Gfn(0), frames, 25_600, 0.01, 7);
    g.move_hot_set(120_000);
    let mut reached = None;
    for round in 1..=40 {
        let hints = g.round();
        w.step(&hints);
        if reached.is_none() && hot_in_fast(&w, &g) >= 0.95 {
            reached = Some(round);
        }
    }
    let r = reached.expect("hot set never reached 95% in fast memory");
    // 100 MiB to promote and as much to demote at 64 MiB a round: a handful of rounds.
    assert!(r <= 8, "took {r} rounds");
    assert!(hot_in_fast(&w, &g) >= 0.99);
}

#[test]
fn steady_workload_converges_and_stops_moving() {
    let frames = 65_536;
    let mut w = World::new(frames, 16_384, EngineParams::default(), 16_384);
    let mut g = GupsHotSet::new(Gfn(0), frames, 8_000, 0.02, 11);
    g.move_hot_set(30_000);
    for _ in 0..15 {
        let h = g.round();
        w.step(&h);
    }
    // After convergence: rounds keep coming, nothing moves.
    let before: u32 = w.moves_per_frame.iter().sum();
    for _ in 0..30 {
        let h = g.round();
        let p = w.step(&h);
        assert!(
            p.moves.iter().all(|m| m.kind != MoveKind::Promote),
            "promoted after convergence: {:?}",
            p.stats
        );
    }
    let after: u32 = w.moves_per_frame.iter().sum();
    assert_eq!(before, after, "frames moved in steady state");
    // Nothing ping-ponged on the way either: no frame moved more than twice (one demotion of a
    // cold first-touch frame, or one promotion of a hot frame).
    assert!(
        w.moves_per_frame.iter().all(|&m| m <= 1),
        "a frame moved more than once"
    );
}

#[test]
fn lukewarm_frames_take_free_room_but_never_displace() {
    // Quota 2048 frames (512 of them the reserve): the hot set (1000 frames) leaves room that
    // lukewarm frames (count 2: score 8, below the hot-set mark of 16) fill. Other lukewarm frames
    // hinted later take what room is left and displace nothing; once they are hot, they do.
    let frames = 4_096;
    let mut w = World::new(frames, 2_048, EngineParams::default(), 0);
    let hint = |range: std::ops::Range<u64>, count: u32| {
        range.map(move |i| HintEntry::new(Gfn(i), count, false, PageType::Anon, false, true))
    };
    let fast =
        |w: &World, range: std::ops::Range<usize>| range.filter(|&i| w.truth[i] == FAST).count();
    for _ in 0..10 {
        let h: Vec<HintEntry> = hint(0..1000, 8).chain(hint(2000..2500, 2)).collect();
        w.step(&h);
    }
    assert_eq!(fast(&w, 0..1000), 1000);
    assert_eq!(fast(&w, 2000..2500), 500, "lukewarm frames fill free room");
    let room = 1536 - w.fast_frames() as usize;
    for _ in 0..30 {
        let h: Vec<HintEntry> = hint(0..1000, 8).chain(hint(3000..3500, 2)).collect();
        let p = w.step(&h);
        assert!(
            p.moves.iter().all(|m| m.kind != MoveKind::Demote),
            "a lukewarm frame displaced another: {:?}",
            p.stats
        );
    }
    assert_eq!(fast(&w, 2000..2500), 500);
    assert_eq!(fast(&w, 3000..3500), room, "only the free room was taken");
    for _ in 0..10 {
        let h: Vec<HintEntry> = hint(0..1000, 8).chain(hint(3000..3500, 8)).collect();
        w.step(&h);
    }
    assert_eq!(
        fast(&w, 3000..3500),
        500,
        "hot frames displace lukewarm ones"
    );
    assert_eq!(fast(&w, 0..1000), 1000);
}

#[test]
fn plan_is_empty_when_placement_is_right() {
    let frames = 8_192;
    // Hot set (first 1000 frames) already fast, the rest slow; quota fits it.
    let mut w = World::new(frames, 2_048, EngineParams::default(), 1_000);
    let hints: Vec<HintEntry> = (0..1000)
        .map(|i| HintEntry::new(Gfn(i), 8, false, PageType::Anon, false, true))
        .collect();
    for _ in 0..5 {
        let p = w.step(&hints);
        assert!(p.is_empty(), "{:?}", p.moves.first());
    }
}

#[test]
fn quota_shrink_demotes_coldest_and_file_first() {
    let frames = 4_096;
    let mut w = World::new(frames, 4_096, EngineParams::default(), 4_096);
    // 0..1000 hot anon, 1000..2000 file with the same low score as 2000..3000 anon.
    let mut hints: Vec<HintEntry> = (0..1000)
        .map(|i| HintEntry::new(Gfn(i), 8, false, PageType::Anon, false, true))
        .collect();
    hints.extend(
        (1000..2000).map(|i| HintEntry::new(Gfn(i), 2, false, PageType::File, false, true)),
    );
    hints.extend(
        (2000..3000).map(|i| HintEntry::new(Gfn(i), 2, false, PageType::Anon, false, true)),
    );
    w.step(&hints);
    w.quota_frames = 2_600;
    w.engine.set_quota(w.vm, 2_600 * FRAME_SIZE).unwrap();
    let p = w.step(&hints);
    assert!(p.moves.iter().all(|m| m.kind == MoveKind::Refill));
    // Never-hinted frames go first, then file, and the hot anon stays.
    assert!((0..1000).all(|i| w.truth[i] == FAST));
    assert!((3000..4096).all(|i| w.truth[i] == SLOW));
    let file_fast = (1000..2000).filter(|&i| w.truth[i] == FAST).count();
    let anon_fast = (2000..3000).filter(|&i| w.truth[i] == FAST).count();
    assert!(file_fast < anon_fast, "file {file_fast} anon {anon_fast}");
    assert!(w.fast_frames() <= 2_600);
}

#[test]
fn huge_units_move_as_one() {
    let frames = 4_096;
    let mut w = World::new(frames, 2_048, EngineParams::default(), 0);
    let hints = vec![
        HintEntry::new(Gfn(1024), 8, true, PageType::Anon, true, true),
        HintEntry::new(Gfn(1030), 8, false, PageType::Anon, false, true),
    ];
    let p = w.step(&hints);
    let promos: Vec<_> = p
        .moves
        .iter()
        .filter(|m| m.kind == MoveKind::Promote)
        .collect();
    assert_eq!(promos.len(), 1, "{:?}", p.moves);
    assert_eq!((promos[0].gfn, promos[0].frames), (Gfn(1024), 512));
    assert!((1024..1536).all(|i| w.truth[i] == FAST));
}

#[test]
fn huge_unit_across_adjacent_ranges_is_one_unit_moved_per_region() {
    use vtism_proto::{GfnRange, RamMap};
    // Two adjacent QEMU regions meeting mid-unit (frame 1280 is inside the unit 1024..1536).
    let ram = RamMap::new(vec![
        GfnRange::new(Gfn(0), Gfn(1280)),
        GfnRange::new(Gfn(1280), Gfn(4096)),
    ])
    .unwrap();
    let mut e = VtismPolicy::new(topo(1 << 30, 1 << 30), EngineParams::default()).unwrap();
    let vm = VmId(3);
    e.add_vm(VmSpec {
        id: vm,
        ram,
        fast_quota_bytes: 2048 * FRAME_SIZE,
        home_node: None,
    })
    .unwrap();
    e.set_placement(vm, Gfn(0), 1280, Some(SLOW)).unwrap();
    e.set_placement(vm, Gfn(1280), 4096 - 1280, Some(SLOW))
        .unwrap();
    let hints = [HintEntry::new(
        Gfn(1024),
        8,
        false,
        PageType::Anon,
        true,
        true,
    )];
    let st = e
        .observe(
            vm,
            Observation::Hints {
                entries: &hints,
                overflow: false,
                counts: vtism_proto::CountMeaning::RoundsSeen,
            },
            Nanos(1),
        )
        .unwrap();
    assert_eq!(st.ignored, 0);
    let p = e.plan(&PlanContext::default(), Nanos(1));
    let spans: Vec<(u64, u64)> = p.moves.iter().map(|m| (m.gfn.0, m.frames)).collect();
    assert_eq!(spans, vec![(1024, 256), (1280, 256)], "one move per region");
}

#[test]
fn hints_outside_the_vm_are_ignored_and_counted() {
    let mut w = World::new(1_024, 512, EngineParams::default(), 0);
    let hints = vec![
        HintEntry::new(Gfn(5000), 8, false, PageType::Anon, false, true),
        HintEntry::new(Gfn(512), 8, false, PageType::Anon, true, true), // unit past the end
        HintEntry::new(Gfn(3), 8, false, PageType::Anon, false, true),
    ];
    let st = w
        .engine
        .observe(
            w.vm,
            Observation::Hints {
                entries: &hints,
                overflow: false,
                counts: vtism_proto::CountMeaning::RoundsSeen,
            },
            Nanos(1),
        )
        .unwrap();
    assert_eq!((st.entries, st.applied, st.ignored), (3, 2, 1));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, .. ProptestConfig::default() })]

    /// Arbitrary hint streams (including out-of-range and huge entries), quotas, budgets and
    /// starting placements: every plan respects quota, budget and VM bounds, and its "from" nodes
    /// match where frames really are (checked inside World::step).
    #[test]
    fn plans_respect_quota_budget_and_bounds(
        frames in 1u64..6_000,
        quota_pct in 0u64..=100,
        start_pct in 0u64..=100,
        budget_frames in 1u64..4_000,
        hysteresis in 1.0f64..4.0,
        rounds in prop::collection::vec(
            prop::collection::vec((0u64..7_000, 0u32..20, any::<bool>(), 0u8..4, prop::bool::weighted(0.05)), 0..300),
            1..8),
    ) {
        let quota = frames * quota_pct / 100;
        let start = (frames * start_pct / 100).min(quota);
        let params = EngineParams { round_budget_bytes: budget_frames * FRAME_SIZE, hysteresis, ..Default::default() };
        let mut w = World::new(frames, quota, params, start);
        for r in rounds {
            let hints: Vec<HintEntry> = r.into_iter().map(|(g, c, wr, t, huge)| {
                let g = if huge { g & !511 } else { g };
                HintEntry::new(Gfn(g), c, wr, PageType::from_bits(t), huge, true)
            }).collect();
            w.step(&hints);
            // The engine's belief matches the truth.
            for (node, n) in w.engine.node_frames(w.vm).unwrap() {
                let truth = w.truth.iter().filter(|&&t| t == node).count() as u64;
                prop_assert_eq!(n, truth);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, .. ProptestConfig::default() })]

    /// GUPS hot set that fits the quota, noisy guest reports (hot hints dropped or undercounted at
    /// random, cold frames touched at random): >= 95% of the hot set reaches fast memory within
    /// the rounds the budget allows, and once there nothing ping-pongs.
    #[test]
    fn gups_converges_within_budget_rounds_and_does_not_ping_pong(
        seed in any::<u64>(),
        frames in 8_192u64..40_000,
        hot_pct in 3u64..30,
        spare_pct in 5u64..60,
        cold_touch in 0.0f64..0.05,
        drop_pct in 0u64..15,
        budget_frames in 2_048u64..16_384,
        start_filled in any::<bool>(),
    ) {
        let hot = frames * hot_pct / 100;
        // Quota: the hot set plus the reserve plus some spare room.
        let quota = (hot + hot * spare_pct / 100).max(hot + 600);
        let quota = quota.min(frames);
        let params = EngineParams { round_budget_bytes: budget_frames * FRAME_SIZE, ..Default::default() };
        let start = if start_filled { quota } else { 0 };
        let mut w = World::new(frames, quota, params, start);
        let mut g = GupsHotSet::new(Gfn(0), frames, hot, cold_touch, seed);
        g.move_hot_set(frames - hot);
        let mut noise = vtism_engine::synth::Rng::new(seed ^ 0xabc);
        let mut noisy = |g: &mut GupsHotSet| -> Vec<HintEntry> {
            let mut out = Vec::new();
            for e in g.round() {
                if noise.below(100) < drop_pct {
                    continue;
                }
                let c = e.count() as u64;
                let c = if c > 1 { c - noise.below(c / 2 + 1) } else { c };
                out.push(HintEntry::new(e.gfn(), c as u32, e.write(), e.page_type(), false, true));
            }
            out
        };
        // Promotions and the demotions making room share the budget.
        let bound = (2 * hot).div_ceil(budget_frames) + 4;
        let mut reached = None;
        for round in 1..=bound + 10 {
            let h = noisy(&mut g);
            w.step(&h);
            if reached.is_none() && hot_in_fast(&w, &g) >= 0.95 {
                reached = Some(round);
            }
        }
        let r = reached.ok_or_else(|| TestCaseError::fail(format!("never reached 95% (bound {bound})")))?;
        prop_assert!(r <= bound, "took {} rounds, bound {}", r, bound);
        // Steady state: count moves over 20 more rounds; a frame moving twice is a ping-pong.
        w.moves_per_frame.iter_mut().for_each(|m| *m = 0);
        for _ in 0..20 {
            let h = noisy(&mut g);
            w.step(&h);
        }
        let pingpong = w.moves_per_frame.iter().filter(|&&m| m >= 2).count();
        prop_assert_eq!(pingpong, 0, "{} frames moved back and forth", pingpong);
        prop_assert!(hot_in_fast(&w, &g) >= 0.95);
    }
}

#[test]
fn hot_set_estimate_follows_the_workload_and_a_pool_shrink_demotes() {
    // 256 MiB VM, 40 MiB hot set touched every round, cold frames touched once in ~50 rounds.
    let frames = 65_536;
    let mut w = World::new(frames, 32_768, EngineParams::default(), 32_768);
    let mut g = GupsHotSet::new(Gfn(0), frames, 10_240, 0.02, 5);
    for _ in 0..12 {
        let h = g.round();
        w.step(&h);
    }
    let hot = w.engine.hot_set_bytes(w.vm).unwrap();
    let hot_bytes = 10_240 * FRAME_SIZE;
    // The frames above the base score: the hot set; the rare cold touches stay below it.
    assert!(
        hot >= hot_bytes && hot <= hot_bytes * 21 / 20,
        "estimate {hot} for a hot set of {hot_bytes}"
    );
    // The pool lowers the quota to the hot set with headroom: the engine demotes down to it and
    // keeps the hot set in fast memory.
    let mut pool = FastPool::new(PoolParams {
        mode: PoolMode::Pool,
        fast_bytes: 1 << 30,
        max_step_fraction: 1.0,
        ..Default::default()
    })
    .unwrap();
    let c = pool
        .add_vm(
            w.vm,
            VmLimits {
                min_bytes: 0,
                max_bytes: 128 << 20,
                shares: 1,
            },
            Nanos(0),
        )
        .unwrap();
    assert_eq!(c.to_bytes, 128 << 20);
    // Another VM takes most of the pool, so this one's target is its want.
    pool.add_vm(
        VmId(9),
        VmLimits {
            min_bytes: 0,
            max_bytes: 1 << 30,
            shares: 1,
        },
        Nanos(0),
    )
    .unwrap();
    let ch = pool.rebalance(&[(w.vm, hot), (VmId(9), 1 << 30)], Nanos::from_secs(10));
    let mine = ch.iter().find(|c| c.vm == w.vm).expect("quota moved");
    assert_eq!(mine.reason, QuotaReason::Shrink);
    assert!(mine.to_bytes < 32_768 * FRAME_SIZE);
    w.engine.set_quota(w.vm, mine.to_bytes).unwrap();
    w.quota_frames = mine.to_bytes / FRAME_SIZE;
    for _ in 0..6 {
        let h = g.round();
        w.step(&h);
    }
    assert!(w.fast_frames() <= mine.to_bytes / FRAME_SIZE);
    assert!(hot_in_fast(&w, &g) >= 0.99);
}

/// The no-signal rule: a VM that has never been observed keeps its placement, even far over its
/// quota; once host-side accesses arrive it is planned like any other, and its accessed frames
/// are the ones kept in fast memory.
#[test]
fn a_vm_without_signal_is_never_demoted_and_host_accesses_lift_the_hold() {
    let frames = 16_384; // 64 MiB
    let mut engine = VtismPolicy::new(topo(1 << 40, 1 << 40), EngineParams::default()).unwrap();
    let vm = VmId(7);
    engine
        .add_vm(VmSpec {
            id: vm,
            ram: vtism_proto::RamMap::contiguous(frames),
            fast_quota_bytes: 4_096 * FRAME_SIZE,
            home_node: Some(FAST),
        })
        .unwrap();
    // All 64 MiB on fast memory against a 16 MiB quota.
    engine
        .set_placement(vm, Gfn(0), frames, Some(FAST))
        .unwrap();
    let ctx = PlanContext::default();
    for round in 0..20u64 {
        let plan = engine.plan(&ctx, Nanos(round * 1_000_000_000));
        assert!(plan.moves.is_empty(), "round {round}: {:?}", plan.moves);
        if let Some(s) = plan.stats.vms.first() {
            assert!(s.no_signal);
            assert_eq!(s.fast_frames, frames);
        }
        engine.mark_all_dirty();
    }
    assert!(engine.summary(vm).unwrap().last_plan.no_signal);
    // Host-side accesses on frames 8192..10240 (8 MiB): the VM is planned, the quota is
    // restored by demoting unaccessed frames, the accessed ones stay fast.
    let hot: Vec<FrameAccess> = (8_192..10_240)
        .map(|g| FrameAccess {
            gfn: Gfn(g),
            reads: 5,
            writes: 0,
            page_type: PageType::Anon,
        })
        .collect();
    let mut fast_at = vec![true; frames as usize];
    for round in 20..40u64 {
        let now = Nanos(round * 1_000_000_000);
        engine
            .observe(vm, Observation::Accesses(&hot), now)
            .unwrap();
        for m in engine.plan(&ctx, now).moves {
            for g in m.gfn.0..m.gfn.0 + m.frames {
                fast_at[g as usize] = m.to == FAST;
            }
        }
    }
    let s = engine.summary(vm).unwrap();
    assert!(!s.last_plan.no_signal);
    assert!(
        s.fast_frames <= 4_096,
        "over quota: {} fast frames",
        s.fast_frames
    );
    assert!(
        (8_192..10_240).all(|g| fast_at[g]),
        "an accessed frame was demoted"
    );
}

/// Two VMs whose hot sets sit on slow memory, one of them far larger than a round can move (a
/// guest flipping its hot set every round): the small one gets its moves in the first round
/// whichever VM is planned first, the large one what the other leaves, and a VM alone the whole
/// budget (issue 24: one tenant cannot take every round's moves).
#[test]
fn a_round_is_shared_among_the_vms_that_need_it() {
    use vtism_proto::{CountMeaning, RamMap};
    let frames = 4096;
    let budget = 400;
    let hot = |n: u64| -> Vec<HintEntry> {
        (0..n)
            .map(|g| HintEntry::new(Gfn(g), 200, false, PageType::Anon, false, true))
            .collect()
    };
    let promoted = |plan: &Plan, vm: VmId| -> u64 {
        plan.moves
            .iter()
            .filter(|m| m.vm == vm && m.kind == MoveKind::Promote)
            .map(|m| m.frames)
            .sum()
    };
    for (first, vms) in [(1u32, vec![1u32, 2]), (2, vec![1, 2]), (1, vec![1])] {
        let params = EngineParams {
            round_budget_bytes: budget * FRAME_SIZE,
            ..Default::default()
        };
        let mut e = VtismPolicy::new(topo(1 << 40, 1 << 40), params).unwrap();
        for &id in &vms {
            e.add_vm(VmSpec {
                id: VmId(id),
                ram: RamMap::contiguous(frames),
                fast_quota_bytes: 2048 * FRAME_SIZE,
                home_node: Some(FAST),
            })
            .unwrap();
            e.set_placement(VmId(id), Gfn(0), frames, Some(SLOW))
                .unwrap();
            let n = if id == 1 { 2000 } else { 100 };
            let obs = Observation::Hints {
                entries: &hot(n),
                overflow: false,
                counts: CountMeaning::RateLevel,
            };
            e.observe(VmId(id), obs, Nanos(1)).unwrap();
        }
        // The planner starts with a different VM each plan: an empty plan turns it.
        if first == 2 {
            e.plan(
                &PlanContext {
                    budget_bytes: Some(0),
                    ..Default::default()
                },
                Nanos(1),
            );
        }
        let plan = e.plan(&PlanContext::default(), Nanos(2));
        let (big, small) = (promoted(&plan, VmId(1)), promoted(&plan, VmId(2)));
        if vms.len() == 2 {
            assert_eq!(
                small, 100,
                "first {first}: the small hot set waited ({big} for the big one)"
            );
            assert_eq!(big, budget - 100, "first {first}: what the other left");
        } else {
            assert_eq!(big, budget, "alone, the whole round");
        }
    }
}

/// Rate-level hints (channel v1.1), written: `level` for every frame of each range.
fn rate_round(ranges: &[(std::ops::Range<u64>, u32)]) -> Vec<HintEntry> {
    ranges
        .iter()
        .flat_map(|(r, level)| {
            r.clone()
                .map(move |g| HintEntry::new(Gfn(g), *level, true, PageType::Anon, false, true))
        })
        .collect()
}

#[test]
fn a_stale_demoted_unit_does_not_push_out_a_just_promoted_one_that_dipped() {
    use vtism_proto::CountMeaning::RateLevel;
    // 16 MiB VM, 8 MiB quota (6 MiB after the 2 MiB reserve); the old hot set A, 6 MiB, on DRAM.
    let (a, b) = (0..1536u64, 2048..3584u64);
    let on_fast =
        |w: &World, r: &std::ops::Range<u64>| r.clone().all(|i| w.truth[i as usize] == FAST);
    let mut w = World::new(4096, 2048, EngineParams::default(), 1536);
    for _ in 0..3 {
        w.step_counting(&rate_round(&[(a.clone(), 150), (b.clone(), 96)]), RateLevel);
    }
    assert!(on_fast(&w, &a));
    // The hot set moves to B, measured at once 2 octaves up; A keeps its level (the tracker
    // leaves it alone), then B settles there too: B in, A out, and then nothing moves.
    for _ in 0..3 {
        w.step_counting(
            &rate_round(&[(a.clone(), 150), (b.clone(), 182)]),
            RateLevel,
        );
    }
    for _ in 0..3 {
        w.step_counting(
            &rate_round(&[(a.clone(), 150), (b.clone(), 150)]),
            RateLevel,
        );
    }
    assert!(on_fast(&w, &b), "the new hot set on DRAM");
    // A region of B dips 4x for a round (a change alarm): A's stale units do not take its place.
    let (b1, b2) = (2048..2560u64, 2560..3584u64);
    let p = w.step_counting(
        &rate_round(&[(a.clone(), 150), (b1.clone(), 118), (b2.clone(), 150)]),
        RateLevel,
    );
    assert!(p.moves.is_empty(), "exchanged on a dip: {:?}", p.stats);
    let held: u64 = p.stats.vms.iter().map(|v| v.held_as_return).sum();
    assert!(held > 0, "the hold is counted as a return's: {:?}", p.stats);
    let p = w.step_counting(
        &rate_round(&[(a.clone(), 150), (b.clone(), 150)]),
        RateLevel,
    );
    assert!(p.moves.is_empty());
    // A measured again (cold: unpublished for a round), then hot again as B cools: it comes back.
    w.step_counting(&rate_round(&[(b.clone(), 150)]), RateLevel);
    for _ in 0..3 {
        w.step_counting(&rate_round(&[(a.clone(), 182), (b.clone(), 96)]), RateLevel);
    }
    assert!(on_fast(&w, &a), "the old hot set back once hot again");
}
