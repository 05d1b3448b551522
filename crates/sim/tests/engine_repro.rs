//! Engine behaviour the simulator ran into, kept as regression tests.

use vtism_engine::*;
use vtism_proto::{Gfn, HintEntry, PageType, RamMap};

const FAST: NodeId = NodeId(0);
const SLOW: NodeId = NodeId(1);

fn topo() -> Topology {
    let n = |id, tier, cap: u64| NodeSpec {
        id: NodeId(id),
        tier: Tier(tier),
        capacity_bytes: cap,
        cpus: if tier == 0 { vec![0] } else { vec![] },
        socket: 0,
    };
    Topology::new(
        vec![n(0, 0, 1 << 40), n(1, 1, 1 << 40)],
        Some(vec![vec![10, 20], vec![20, 10]]),
    )
    .unwrap()
}

/// What the simulator's model of the v1.0 tracker (rounds seen, since replaced) published for GUPS
/// hot-set with a fixed 2.5 s scan interval:
/// 2 MiB units, every unit written, hot units seen in all 8 rounds of the window, cold units in 7
/// of them on average (`count` 8 vs 7). The quota fits the hot set; first touch filled fast memory
/// with cold units. Engine 5d80310 promoted the hot units; c364c30 ("time-invariant hotness
/// levels") made hysteresis a score ratio of 1.5 and left most of them on the slow tier in
/// `vtism sim run --policy vtism --workload gups-hotset --guest-interval 2500` (fast hit ratio
/// 86% -> 41%); a ratio of 1.07 (one level) restores it.
#[test]
fn hot_units_with_count_8_displace_cold_units_with_count_7() {
    let units = 64u64;
    let mut e = VtismPolicy::new(topo(), EngineParams::default()).unwrap();
    let vm = VmId(1);
    e.add_vm(VmSpec {
        id: vm,
        ram: RamMap::contiguous(units * 512),
        fast_quota_bytes: 16 * (2 << 20),
        home_node: Some(FAST),
    })
    .unwrap();
    e.set_placement(vm, Gfn(0), 16 * 512, Some(FAST)).unwrap();
    e.set_placement(vm, Gfn(16 * 512), (units - 16) * 512, Some(SLOW))
        .unwrap();
    let hot: Vec<u64> = (40..48).collect();
    let mut fast = vec![false; units as usize];
    fast[..16].iter_mut().for_each(|f| *f = true);
    for round in 1..=30u64 {
        let hints: Vec<HintEntry> = (0..units)
            .map(|u| {
                let count = if hot.contains(&u) { 8 } else { 7 };
                HintEntry::new(Gfn(u * 512), count, true, PageType::Anon, true, true)
            })
            .collect();
        let now = Nanos::from_millis(2500 * round);
        e.observe(
            vm,
            Observation::Hints {
                entries: &hints,
                overflow: false,
                counts: vtism_proto::CountMeaning::RoundsSeen,
            },
            now,
        )
        .unwrap();
        let plan = e.plan(&PlanContext::default(), now);
        for m in plan.moves {
            for f in m.gfn.0..m.gfn.0 + m.frames {
                fast[(f / 512) as usize] = m.to == FAST;
            }
        }
    }
    let hot_fast = hot.iter().filter(|&&u| fast[u as usize]).count();
    assert_eq!(
        hot_fast,
        hot.len(),
        "only {hot_fast} of 8 hot units in fast memory"
    );
}
