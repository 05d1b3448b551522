//! HMM-V's four-VM co-run (section 5.9) with vtism's pool against its island mode: the pool moves
//! fast memory from the VM that needs little (pagerank) to the others, within each VM's 75%..125%
//! limits, never oversubscribes, and is not worse than islands. The guest tracker is the proposed
//! short observation window (`--guest-window 500`): with the module's tracker every frame of these
//! VMs looks equally hot (docs/evaluation.md), so the pool has nothing to balance on.

use vtism_sim::cli::run_one;
use vtism_sim::model::MemoryModel;
use vtism_sim::sim::{RunResult, SimConfig};
use vtism_sim::workload;

const GIB: f64 = (1u64 << 30) as f64;

fn corun(policy: &str, window_ms: Option<f64>, duration_s: f64) -> RunResult {
    let mut c = SimConfig::new(MemoryModel::preset("cxl").unwrap());
    c.duration_s = duration_s;
    c.epoch_s = 0.125;
    c.sample_s = 5.0;
    // A quarter of HMM-V's sizes keeps the debug-build test short. Each frame is then touched four
    // times as often, so the window is a quarter of the 500 ms the evaluation uses.
    c.guest_window_ms = window_ms.map(|w| w / 4.0);
    let w = workload::scenario("mix-hmmv4", 0.25, c.duration_s, 1).unwrap();
    run_one(&c, &w, policy, None, None).unwrap()
}

/// Island and pool side by side (two threads: the debug build is slow).
fn both(window_ms: Option<f64>, duration_s: f64) -> (RunResult, RunResult) {
    std::thread::scope(|s| {
        let island = s.spawn(move || corun("vtism-island", window_ms, duration_s));
        let pool = corun("vtism-pool", window_ms, duration_s);
        (island.join().unwrap(), pool)
    })
}

#[test]
fn pool_moves_quota_within_limits_and_beats_islands() {
    let (island, pool) = both(Some(500.0), 120.0);
    let initial: Vec<u64> = island.vms.iter().map(|v| v.quota_bytes).collect();
    let total: u64 = initial.iter().sum();
    // Every sample: quotas within 75%..125% of the initial one, never above the pool in sum.
    for s in &pool.samples {
        assert!(
            s.quota.iter().sum::<u64>() <= total,
            "t={}: {:?}",
            s.t,
            s.quota
        );
        for (q, &i) in s.quota.iter().zip(&initial) {
            assert!(
                *q >= i / 4 * 3 && *q <= i / 4 * 5,
                "t={}: quota {q} outside the limits of {i}",
                s.t
            );
        }
    }
    // Islands never change a quota.
    for s in &island.samples {
        assert_eq!(s.quota, initial, "t={}", s.t);
    }
    // pagerank (1/19 of its memory hot) gives memory to the dense VM while the others want it
    // (when their estimates fall, spare memory is split by shares again).
    let names: Vec<&str> = pool.vms.iter().map(|v| v.name.as_str()).collect();
    let at = |n: &str| names.iter().position(|&x| x == n).unwrap();
    let (pr, fo) = (at("pagerank"), at("fotonik3d"));
    let moved = pool
        .samples
        .iter()
        .filter(|s| s.quota[pr] < initial[pr] && s.quota[fo] > initial[fo])
        .count();
    assert!(
        moved >= 2,
        "quota never moved from pagerank to fotonik3d: {:?}",
        pool.samples
            .iter()
            .map(|s| s
                .quota
                .iter()
                .map(|q| (*q as f64 / GIB * 100.0).round() / 100.0)
                .collect::<Vec<_>>())
            .collect::<Vec<_>>()
    );
    assert!(
        pool.accesses() > island.accesses(),
        "pool {:.4e} vs island {:.4e}",
        pool.accesses(),
        island.accesses()
    );
}

#[test]
fn without_a_demand_signal_the_pool_does_no_harm() {
    // The module's tracker (adaptive interval, 5 min cap): hot-set estimates cover whole VMs, all
    // want their maximum, and the split stays the share-based one.
    let (island, pool) = both(None, 60.0);
    let ratio = pool.accesses() / island.accesses();
    assert!(ratio > 0.98, "pool / island = {ratio:.3}");
}
