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
        hysteresis in 0u32..16,
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
