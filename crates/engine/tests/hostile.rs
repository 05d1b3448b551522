//! Rounds a hostile guest can publish legally: the engine's work stays bounded by the VM's own
//! frames and the round's entries (docs/host.md, "Threat model"), and odd but legal RAM maps do
//! not trip its arithmetic.

mod common;

use common::{topo, FAST, SLOW};
use std::time::Instant;
use vtism_engine::*;
use vtism_proto::{CountMeaning, Gfn, GfnRange, HintEntry, PageType, RamMap, FRAME_SIZE};

fn engine_with(ram: RamMap) -> VtismPolicy {
    let mut e = VtismPolicy::new(topo(1 << 40, 1 << 40), EngineParams::default()).unwrap();
    e.add_vm(VmSpec {
        id: VmId(1),
        ram: ram.clone(),
        fast_quota_bytes: ram.frames() * FRAME_SIZE / 4,
        home_node: Some(FAST),
    })
    .unwrap();
    for r in ram.ranges() {
        e.set_placement(VmId(1), r.start, r.end.0 - r.start.0, Some(SLOW))
            .unwrap();
    }
    e
}

fn unit(gfn: u64, count: u32, write: bool, t: PageType) -> HintEntry {
    HintEntry::new(Gfn(gfn), count, write, t, true, true)
}

fn observe(e: &mut VtismPolicy, entries: &[HintEntry], counts: CountMeaning) -> IngestStats {
    let obs = Observation::Hints {
        entries,
        overflow: false,
        counts,
    };
    e.observe(VmId(1), obs, Nanos::from_secs(1)).unwrap()
}

/// The flood of issue 14: a legal round of 1 Mi entries naming the same few 2 MiB units (with
/// rising counts, so every duplicate raises the merged degree) used to update 512 frames per
/// entry, 512 Mi frame updates a round. Now each unit's frames are gone over at most three
/// times, whatever the number of duplicates.
#[test]
fn a_flood_of_duplicate_units_costs_a_pass_per_unit() {
    let frames = 1u64 << 20; // a 4 GiB guest
    let mut e = engine_with(RamMap::contiguous(frames));
    let heads = [0u64, 512, 4096, frames - 512];
    let flood: Vec<HintEntry> = (0..1u64 << 20)
        .map(|i| {
            let t = if i < 8 {
                PageType::Unknown
            } else {
                PageType::Anon
            };
            unit(heads[i as usize % 4], (i / 4 % 256) as u32, i % 3 == 0, t)
        })
        .collect();
    for counts in [CountMeaning::RateLevel, CountMeaning::RoundsSeen] {
        let t = Instant::now();
        let st = observe(&mut e, &flood, counts);
        let took = t.elapsed();
        eprintln!("{counts:?}: 1 Mi duplicate units ingested in {took:?}: {st:?}");
        assert_eq!(st.entries, flood.len() as u64);
        assert_eq!(st.duplicate_units, flood.len() as u64 - heads.len() as u64);
        assert!(
            st.unit_passes <= 3 * heads.len() as u64,
            "{} passes over 2 MiB units for {} units",
            st.unit_passes,
            heads.len()
        );
        assert_eq!(e.summary(VmId(1)).unwrap().unknown_frames, 0);
        e.check_histogram(VmId(1)).unwrap();
        // From the frames' merged scores (the rate-level estimate counts entries, as the
        // reference ingest does, and is capped at the VM's size).
        if counts == CountMeaning::RoundsSeen {
            assert_eq!(
                e.hot_set_bytes(VmId(1)).unwrap() / FRAME_SIZE,
                512 * heads.len() as u64,
                "the hot set is the four units"
            );
        }
    }
}

/// The largest round the reader lets through (every frame of the VM hinted, as 2 MiB units and
/// as 4 KiB entries) costs one pass over the VM's frames per kind of entry.
#[test]
fn a_maximum_round_costs_a_pass_over_the_frames() {
    let frames = 1u64 << 18;
    let mut e = engine_with(RamMap::contiguous(frames));
    let mut round: Vec<HintEntry> = (0..frames)
        .step_by(512)
        .map(|g| unit(g, 200, false, PageType::Anon))
        .collect();
    round.extend(
        (0..frames).map(|g| HintEntry::new(Gfn(g), 100, true, PageType::Anon, false, true)),
    );
    let st = observe(&mut e, &round, CountMeaning::RateLevel);
    assert_eq!(st.unit_passes, frames / 512);
    assert_eq!(st.covered_by_huge, frames);
    assert_eq!(st.duplicate_units, 0);
}

/// A PC guest's RAM starts again at 1 MiB after the legacy hole: the 2 MiB unit holding frames
/// 0x100-0x1ff starts below the range. 4 KiB hints there, next to units hinted as such, with the
/// units marked from the round before, must neither overflow nor be taken for a unit.
#[test]
fn pc_guest_hints_in_the_first_two_mib() {
    let ram = RamMap::new(vec![
        GfnRange::new(Gfn(0), Gfn(0xa0)),
        GfnRange::new(Gfn(0x100), Gfn(0x8_0000)),
    ])
    .unwrap();
    let mut e = engine_with(ram);
    for round in 0..4u64 {
        let mut entries = vec![
            unit(0x200, 220, false, PageType::Anon),
            unit(0x400, 220, true, PageType::Anon),
        ];
        // The unit at 0 is not all RAM: ignored, never expanded.
        entries.push(unit(0, 250, false, PageType::Anon));
        entries.extend((0x100..0x200).chain(0..0xa0).chain(0x3f0..0x410).map(|g| {
            HintEntry::new(
                Gfn(g),
                180 + round as u32,
                false,
                PageType::Anon,
                false,
                true,
            )
        }));
        if round % 2 == 1 {
            entries.reverse();
        }
        let st = observe(&mut e, &entries, CountMeaning::RateLevel);
        assert_eq!(st.ignored, 1, "round {round}: {st:?}");
        let plan = e.plan(&PlanContext::default(), Nanos::from_secs(2 + round));
        for m in &plan.moves {
            assert!(
                m.gfn.0 >= 0x100 || m.gfn.0 + m.frames <= 0xa0,
                "a move in the legacy hole: {m:?}"
            );
        }
        e.check_histogram(VmId(1)).unwrap();
    }
}

/// A guest that resets in a loop (issue 24: each reset re-registered the VM, whose placement
/// sweep then started over on the main loop): a reset forgets the hotness in one pass over the
/// frames and keeps where every frame is, so nothing needs to be learnt again.
#[test]
fn a_reset_forgets_hotness_and_keeps_placement() {
    let frames = 1u64 << 16;
    let mut e = engine_with(RamMap::contiguous(frames));
    let hot: Vec<HintEntry> = (0..64)
        .map(|u| unit(u * 512, 200, true, PageType::Anon))
        .collect();
    for _ in 0..8 {
        observe(&mut e, &hot, CountMeaning::RoundsSeen);
    }
    e.set_placement(VmId(1), Gfn(0), 512, Some(FAST)).unwrap();
    assert!(e.hot_set_bytes(VmId(1)).unwrap() > 0);
    let placed = e.node_frames(VmId(1)).unwrap();
    assert_eq!(e.forget_hotness(VmId(1)).unwrap(), frames / 2);
    assert_eq!(e.hot_set_bytes(VmId(1)).unwrap(), 0);
    assert_eq!(e.frame_score(VmId(1), Gfn(0)).unwrap(), 0);
    assert_eq!(e.node_frames(VmId(1)).unwrap(), placed);
    assert_eq!(e.summary(VmId(1)).unwrap().unknown_frames, 0);
    e.check_histogram(VmId(1)).unwrap();
    // Forgetting again finds nothing hinted; the next round's hints count afresh.
    assert_eq!(e.forget_hotness(VmId(1)).unwrap(), 0);
    for _ in 0..8 {
        observe(&mut e, &hot[..1], CountMeaning::RoundsSeen);
    }
    assert_eq!(e.hot_set_bytes(VmId(1)).unwrap(), 512 * FRAME_SIZE);
    e.check_histogram(VmId(1)).unwrap();
}
