//! Pool properties: quotas never oversubscribe the pool, stay within each VM's limits whatever
//! the other VMs report (isolation), respect the rate bound, settle under constant or noisy
//! demand, and never follow demand in island mode.

use proptest::prelude::*;
use std::collections::BTreeMap;
use vtism_engine::*;

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

/// A driver's view of the quotas: every returned change is applied in order, and must start from
/// the quota it last saw.
struct Shadow {
    quotas: BTreeMap<VmId, u64>,
}

impl Shadow {
    fn apply(&mut self, pool: &FastPool, changes: &[QuotaChange]) -> Result<(), TestCaseError> {
        let fast = pool.params().fast_bytes;
        for c in changes {
            let q = self.quotas.entry(c.vm).or_insert(0);
            prop_assert_eq!(
                *q,
                c.from_bytes,
                "change {:?} does not start from the last quota",
                c
            );
            *q = c.to_bytes;
            // A grow never takes the running sum over the pool (a pool made smaller by
            // set_params is over it until its shrinks are applied, which come first).
            let sum: u64 = self.quotas.values().sum();
            if c.to_bytes > c.from_bytes {
                prop_assert!(sum <= fast, "after {:?}: {} > pool {}", c, sum, fast);
            }
        }
        prop_assert!(self.quotas.values().sum::<u64>() <= fast);
        for (vm, q) in &self.quotas {
            prop_assert_eq!(pool.quota(*vm), Some(*q));
        }
        Ok(())
    }
}

fn check_bounds(pool: &FastPool) -> Result<(), TestCaseError> {
    for vm in pool.vms() {
        let (q, l) = (pool.quota(vm).unwrap(), pool.limits(vm).unwrap());
        prop_assert!(
            q >= l.min_bytes && q <= l.max_bytes,
            "{vm}: quota {q} outside [{}, {}]",
            l.min_bytes,
            l.max_bytes
        );
    }
    prop_assert!(pool.allocated_bytes() <= pool.params().fast_bytes);
    Ok(())
}

#[derive(Clone, Debug)]
enum Op {
    Add(u32, u64, u64, u32),
    Limits(u32, u64, u64, u32),
    Remove(u32),
    Rebalance(Vec<(u32, u64)>, u64),
    Mode(bool, u64),
}

fn op() -> impl Strategy<Value = Op> {
    let limits = (0u64..12, 0u64..20, 1u32..5);
    prop_oneof![
        (0u32..6, limits.clone()).prop_map(|(v, (a, b, s))| Op::Add(
            v,
            a * GIB / 2,
            (a + b) * GIB / 2,
            s
        )),
        (0u32..6, limits).prop_map(|(v, (a, b, s))| Op::Limits(
            v,
            a * GIB / 2,
            (a + b) * GIB / 2,
            s
        )),
        (0u32..6).prop_map(Op::Remove),
        // Demand includes hostile values (far above any limit).
        (
            prop::collection::vec((0u32..6, prop_oneof![0u64..40 * GIB, Just(u64::MAX)]), 0..6),
            0u64..20
        )
            .prop_map(|(d, dt)| Op::Rebalance(d, dt)),
        (any::<bool>(), 8u64..48).prop_map(|(p, f)| Op::Mode(p, f * GIB)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    /// Whatever the calls: the sum of quotas never exceeds the pool (also between the changes of
    /// one call), every change starts where the driver last saw the quota, infeasible limits are
    /// rejected without effect, and after a rebalance every quota is within its VM's limits.
    #[test]
    fn quotas_fit_the_pool_and_the_limits(ops in prop::collection::vec(op(), 1..60)) {
        let mut pool = FastPool::new(PoolParams {
            mode: PoolMode::Pool,
            fast_bytes: 32 * GIB,
            ..Default::default()
        }).unwrap();
        let mut shadow = Shadow { quotas: BTreeMap::new() };
        let mut now = Nanos(0);
        for op in ops {
            now = Nanos(now.0 + 1);
            match op {
                Op::Add(v, min, max, shares) => {
                    let mins: u64 = pool.vms().map(|x| pool.limits(x).unwrap().min_bytes).sum();
                    let known = pool.quota(VmId(v)).is_some();
                    let r = pool.add_vm(VmId(v), VmLimits { min_bytes: min, max_bytes: max, shares }, now);
                    match r {
                        Ok(c) => {
                            prop_assert!(!known);
                            prop_assert!(mins + min <= pool.params().fast_bytes);
                            shadow.apply(&pool, &[c])?;
                        }
                        Err(PoolError::Infeasible { .. }) => {
                            prop_assert!(mins + min > pool.params().fast_bytes);
                            prop_assert!(pool.quota(VmId(v)).is_none());
                        }
                        Err(PoolError::DuplicateVm(_)) => prop_assert!(known),
                        Err(e) => return Err(TestCaseError::fail(format!("unexpected {e}"))),
                    }
                }
                Op::Limits(v, min, max, shares) => {
                    let before = pool.limits(VmId(v));
                    match pool.set_limits(VmId(v), VmLimits { min_bytes: min, max_bytes: max, shares }, now) {
                        Ok(ch) => {
                            shadow.apply(&pool, &ch)?;
                            let q = pool.quota(VmId(v)).unwrap();
                            prop_assert!(q >= min && q <= max, "set_limits left {q} outside [{min}, {max}]");
                        }
                        Err(PoolError::Infeasible { .. }) => prop_assert_eq!(pool.limits(VmId(v)), before),
                        Err(PoolError::UnknownVm(_)) => prop_assert!(before.is_none()),
                        Err(e) => return Err(TestCaseError::fail(format!("unexpected {e}"))),
                    }
                }
                Op::Remove(v) => {
                    let had = pool.remove_vm(VmId(v));
                    prop_assert_eq!(had, shadow.quotas.remove(&VmId(v)).is_some());
                }
                Op::Rebalance(d, dt) => {
                    now = Nanos(now.0 + dt * 1_000_000_000);
                    let d: Vec<(VmId, u64)> = d.into_iter().map(|(v, b)| (VmId(v), b)).collect();
                    let ch = pool.rebalance(&d, now);
                    shadow.apply(&pool, &ch)?;
                    check_bounds(&pool)?;
                }
                Op::Mode(p, fast) => {
                    let params = PoolParams {
                        mode: if p { PoolMode::Pool } else { PoolMode::Island },
                        fast_bytes: fast,
                        ..*pool.params()
                    };
                    let mins: u64 = pool.vms().map(|x| pool.limits(x).unwrap().min_bytes).sum();
                    match pool.set_params(params, now) {
                        Ok(ch) => {
                            prop_assert!(mins <= fast);
                            shadow.apply(&pool, &ch)?;
                            check_bounds(&pool)?;
                        }
                        Err(PoolError::Infeasible { .. }) => prop_assert!(mins > fast),
                        Err(e) => return Err(TestCaseError::fail(format!("unexpected {e}"))),
                    }
                }
            }
        }
    }

    /// Isolation and pacing: whatever the VMs report (hostile values included), each stays within
    /// its own limits; demand-driven changes of one VM are at least the interval apart and at
    /// most one step each.
    #[test]
    fn demand_is_isolated_and_rate_bounded(
        limits in prop::collection::vec((1u64..8, 0u64..8, 1u32..4), 2..6),
        demand in prop::collection::vec(prop::collection::vec(prop_oneof![0u64..30 * GIB, Just(u64::MAX)], 6), 1..80),
        interval_s in 1u64..10,
    ) {
        let params = PoolParams {
            mode: PoolMode::Pool,
            fast_bytes: 48 * GIB,
            rebalance_interval: Nanos::from_secs(interval_s),
            ..Default::default()
        };
        let step = (params.fast_bytes as f64 * params.max_step_fraction) as u64;
        let mut pool = FastPool::new(params).unwrap();
        let mut shadow = Shadow { quotas: BTreeMap::new() };
        for (i, &(min, extra, shares)) in limits.iter().enumerate() {
            let l = VmLimits { min_bytes: min * GIB, max_bytes: (min + extra) * GIB, shares };
            let c = pool.add_vm(VmId(i as u32), l, Nanos(0)).unwrap();
            shadow.apply(&pool, &[c])?;
        }
        let mut paced: BTreeMap<VmId, Nanos> = BTreeMap::new();
        for (round, d) in demand.iter().enumerate() {
            let now = Nanos::from_secs(round as u64);
            let d: Vec<(VmId, u64)> = (0..limits.len()).map(|i| (VmId(i as u32), d[i])).collect();
            let ch = pool.rebalance(&d, now);
            shadow.apply(&pool, &ch)?;
            check_bounds(&pool)?;
            for c in ch.iter().filter(|c| matches!(c.reason, QuotaReason::Grow | QuotaReason::Shrink)) {
                prop_assert!(c.from_bytes.abs_diff(c.to_bytes) <= step, "{:?} exceeds the step {}", c, step);
                if let Some(t) = paced.insert(c.vm, now) {
                    prop_assert!(now.saturating_sub(t) >= params.rebalance_interval, "{:?} too soon after {:?}", c, t);
                }
            }
        }
    }

    /// Constant or noisy demand (within the hysteresis band): quotas settle in a bounded number
    /// of changes and then stay put.
    #[test]
    fn constant_or_noisy_demand_settles(
        hot in prop::collection::vec(0u64..16 * 1024, 2..6),
        noise_seed in any::<u64>(),
        noise_percent in 0u64..4,
    ) {
        let params = PoolParams {
            mode: PoolMode::Pool,
            fast_bytes: 32 * GIB,
            rebalance_interval: Nanos::from_secs(1),
            ..Default::default()
        };
        let mut pool = FastPool::new(params).unwrap();
        let n = hot.len() as u64;
        for i in 0..n {
            let share = 32 * GIB / n;
            let l = VmLimits { min_bytes: share * 3 / 4, max_bytes: share * 5 / 4, shares: 1 };
            pool.add_vm(VmId(i as u32), l, Nanos(0)).unwrap();
        }
        let mut rng = noise_seed | 1;
        let mut changes_per_vm: BTreeMap<VmId, u32> = BTreeMap::new();
        let steps_to_cross = (1.0 / params.max_step_fraction).ceil() as u32;
        for round in 0..400u64 {
            let d: Vec<(VmId, u64)> = hot
                .iter()
                .enumerate()
                .map(|(i, &h)| {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    let base = h * MIB;
                    let jitter = base / 100 * noise_percent;
                    let noisy = if jitter == 0 { base } else { base - jitter + rng % (2 * jitter + 1) };
                    (VmId(i as u32), noisy)
                })
                .collect();
            let ch = pool.rebalance(&d, Nanos::from_secs(round));
            for c in &ch {
                *changes_per_vm.entry(c.vm).or_default() += 1;
            }
            if round >= 200 {
                prop_assert!(ch.is_empty(), "round {round}: still changing: {:?}", ch);
            }
        }
        for (vm, &c) in &changes_per_vm {
            prop_assert!(c <= steps_to_cross + 3, "{vm} changed {c} times");
        }
    }

    /// Island mode: once the VMs are settled, demand never changes a quota.
    #[test]
    fn island_never_follows_demand(
        n in 1usize..6,
        demand in prop::collection::vec(prop::collection::vec(any::<u64>(), 6), 1..40),
    ) {
        let mut pool = FastPool::new(PoolParams { fast_bytes: 24 * GIB, ..Default::default() }).unwrap();
        for i in 0..n {
            pool.add_vm(VmId(i as u32), VmLimits { min_bytes: GIB, max_bytes: 12 * GIB, shares: 1 + i as u32 }, Nanos(0)).unwrap();
        }
        pool.rebalance(&[], Nanos(0));
        check_bounds(&pool)?;
        let quotas: Vec<_> = pool.vms().map(|v| pool.quota(v)).collect();
        for (r, d) in demand.iter().enumerate() {
            let d: Vec<(VmId, u64)> = (0..n).map(|i| (VmId(i as u32), d[i])).collect();
            prop_assert!(pool.rebalance(&d, Nanos::from_secs(r as u64 * 100)).is_empty());
        }
        let after: Vec<_> = pool.vms().map(|v| pool.quota(v)).collect();
        prop_assert_eq!(quotas, after);
    }
}

/// Shares split the pool as eq. 1 says, within the limits.
#[test]
fn island_split_follows_shares_within_limits() {
    let mut pool = FastPool::new(PoolParams {
        fast_bytes: 12 * GIB,
        ..Default::default()
    })
    .unwrap();
    for (i, s) in [1u32, 2, 3].into_iter().enumerate() {
        pool.add_vm(
            VmId(i as u32),
            VmLimits {
                min_bytes: 0,
                max_bytes: 100 * GIB,
                shares: s,
            },
            Nanos(0),
        )
        .unwrap();
    }
    pool.rebalance(&[], Nanos(1));
    assert_eq!(pool.quota(VmId(0)), Some(2 * GIB));
    assert_eq!(pool.quota(VmId(1)), Some(4 * GIB));
    assert_eq!(pool.quota(VmId(2)), Some(6 * GIB));
    // A maximum caps a VM; the others share what it cannot take.
    pool.set_limits(
        VmId(2),
        VmLimits {
            min_bytes: 0,
            max_bytes: 3 * GIB,
            shares: 3,
        },
        Nanos(2),
    )
    .unwrap();
    assert_eq!(pool.quota(VmId(2)), Some(3 * GIB));
    assert_eq!(pool.quota(VmId(0)), Some(3 * GIB));
    assert_eq!(pool.quota(VmId(1)), Some(6 * GIB));
}
