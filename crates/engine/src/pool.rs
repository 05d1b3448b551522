//! One pool of fast memory shared by many VMs: per-VM quotas from limits, shares and hot-set
//! demand (HMM-V's DRAM pool, the Xen paper's share-based split), or fixed quotas ("island").
//!
//! Pure: no I/O, time is passed in. The driver (daemon, simulator) feeds each VM's estimated hot
//! set (`VtismPolicy::hot_set_bytes`) to [`FastPool::rebalance`] and applies every returned
//! [`QuotaChange`] with `Policy::set_quota`; a shrunk quota makes the engine demote.
//!
//! Invariants, whatever the calls: the quotas sum to at most `fast_bytes`; once settled (the
//! `rebalance` after an `add_vm`), every quota lies within its VM's `[min_bytes, max_bytes]`
//! (`add_vm` / `set_limits` / `set_params` reject limits whose minimums do not fit); one VM's
//! demand never takes another below its minimum nor itself above its maximum; demand-driven
//! changes of one VM are at least `rebalance_interval` apart and at most `max_step_fraction` of
//! the pool each.

use crate::types::{Nanos, VmId};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use thiserror::Error;
use vtism_proto::FRAME_SIZE;

/// How fast memory is split between VMs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PoolMode {
    /// Fixed quotas: the share-based split (Xen paper eq. 1, within each VM's limits), recomputed
    /// only when VMs come or go or limits change; demand is ignored.
    Island,
    /// Quotas follow each VM's hot set within its limits (HMM-V's pool).
    Pool,
}

/// A VM's fast-memory limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmLimits {
    /// Guaranteed: no other VM's demand takes the quota below this.
    pub min_bytes: u64,
    /// The quota never exceeds this, whatever the VM's demand.
    pub max_bytes: u64,
    /// Relative weight in the share-based split (at least 1).
    pub shares: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct PoolParams {
    pub mode: PoolMode,
    /// Fast memory the pool hands out; the sum of quotas never exceeds it.
    pub fast_bytes: u64,
    /// At least this long between two demand-driven changes of one VM's quota.
    pub rebalance_interval: Nanos,
    /// A VM's quota moves by at most this fraction of `fast_bytes` per demand-driven change.
    pub max_step_fraction: f64,
    /// Hot-set changes smaller than this fraction of the VM's quota are ignored, and so are
    /// quota corrections smaller than this fraction of the quota.
    pub hysteresis_fraction: f64,
    /// Wanted quota = hot set * (1 + headroom): room for the hot set to grow and for the engine's
    /// free reserve.
    pub headroom_fraction: f64,
}

impl Default for PoolParams {
    fn default() -> Self {
        PoolParams {
            mode: PoolMode::Island,
            fast_bytes: 0,
            rebalance_interval: Nanos::from_secs(5),
            max_step_fraction: 0.05,
            hysteresis_fraction: 0.1,
            headroom_fraction: 0.1,
        }
    }
}

/// Why a quota changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum QuotaReason {
    /// The VM joined (`add_vm`), or completes its initial quota once room was made.
    Initial,
    /// The pool's parameters changed (mode, size), or island mode re-split after VMs came or
    /// went or limits changed.
    Config,
    /// Its hot set needs more (pool mode).
    Grow,
    /// It does not use what it has (pool mode).
    Shrink,
    /// Taken back to give another VM its guaranteed minimum (or, in island mode, its share).
    Reclaim,
    /// Brought within its own new limits (`set_limits`).
    Clamp,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct QuotaChange {
    pub vm: VmId,
    pub from_bytes: u64,
    pub to_bytes: u64,
    /// The VM's hot set as the pool last accepted it (0 when none was reported yet).
    pub hot_set_bytes: u64,
    pub reason: QuotaReason,
    pub at: Nanos,
}

#[derive(Debug, Error, PartialEq)]
pub enum PoolError {
    #[error("pool.{field}: {problem}")]
    Param {
        field: &'static str,
        problem: String,
    },
    #[error("{vm}: limits.{field}: {problem}")]
    Limits {
        vm: VmId,
        field: &'static str,
        problem: String,
    },
    #[error(
        "pool.fast_bytes: the guaranteed minimums add up to {min_sum_bytes} bytes, more than the \
         pool's {fast_bytes}"
    )]
    Infeasible { min_sum_bytes: u64, fast_bytes: u64 },
    #[error("{0} is not in the pool")]
    UnknownVm(VmId),
    #[error("{0} is already in the pool")]
    DuplicateVm(VmId),
}

impl PoolParams {
    pub fn validate(&self) -> Result<(), PoolError> {
        let err = |field, problem: &str| {
            Err(PoolError::Param {
                field,
                problem: problem.to_string(),
            })
        };
        if !(self.max_step_fraction > 0.0 && self.max_step_fraction <= 1.0) {
            return err("max_step_fraction", "must be above 0 and at most 1");
        }
        if !(0.0..1.0).contains(&self.hysteresis_fraction) {
            return err("hysteresis_fraction", "must be at least 0 and below 1");
        }
        if !(0.0..=10.0).contains(&self.headroom_fraction) {
            return err("headroom_fraction", "must be between 0 and 10");
        }
        Ok(())
    }
}

impl VmLimits {
    fn validate(&self, vm: VmId) -> Result<(), PoolError> {
        let err = |field, problem: &str| {
            Err(PoolError::Limits {
                vm,
                field,
                problem: problem.to_string(),
            })
        };
        if self.shares == 0 {
            return err("shares", "must be at least 1");
        }
        if self.min_bytes > self.max_bytes {
            return err("min_bytes", "must not be above max_bytes");
        }
        Ok(())
    }
}

#[derive(Clone, Copy, Debug)]
struct PoolVm {
    limits: VmLimits,
    quota: u64,
    /// The hot set as last accepted (changes within the hysteresis band are ignored).
    demand: Option<u64>,
    last: Option<QuotaChange>,
    /// Time of the last demand-driven change (the rate limit counts from it).
    paced_at: Option<Nanos>,
    /// Pool mode: the target the VM is moving toward; a new target replaces it only when it
    /// differs by more than the hysteresis band, so small shifts of the split are not chased.
    goal: Option<u64>,
}

/// The fast-memory pool: quotas per VM.
#[derive(Clone, Debug)]
pub struct FastPool {
    params: PoolParams,
    vms: BTreeMap<VmId, PoolVm>,
    /// Island mode: VMs came or went since quotas were last split.
    resplit: bool,
}

impl FastPool {
    pub fn new(params: PoolParams) -> Result<Self, PoolError> {
        params.validate()?;
        Ok(FastPool {
            params,
            vms: BTreeMap::new(),
            resplit: false,
        })
    }

    pub fn params(&self) -> &PoolParams {
        &self.params
    }

    /// VMs in the pool, by id.
    pub fn vms(&self) -> impl Iterator<Item = VmId> + '_ {
        self.vms.keys().copied()
    }

    /// Sum of all quotas (never above `fast_bytes`).
    pub fn allocated_bytes(&self) -> u64 {
        self.vms.values().map(|v| v.quota).sum()
    }

    /// The hot set the pool last accepted for a VM.
    pub fn hot_set(&self, vm: VmId) -> Option<u64> {
        self.vms.get(&vm).and_then(|v| v.demand)
    }

    /// Replace the parameters. A new mode or size re-splits at once (returned, reason `Config`),
    /// and minimums not yet honoured are; fails, changing nothing, if the VMs' minimums do not
    /// fit the new size.
    pub fn set_params(
        &mut self,
        params: PoolParams,
        now: Nanos,
    ) -> Result<Vec<QuotaChange>, PoolError> {
        params.validate()?;
        self.check_feasible(params.fast_bytes, None)?;
        let resplit =
            params.mode != self.params.mode || params.fast_bytes != self.params.fast_bytes;
        self.params = params;
        let targets = self.targets();
        if !resplit {
            return Ok(self.honour_minimums(&targets, now));
        }
        Ok(self.settle(&targets, QuotaReason::Config, QuotaReason::Config, now))
    }

    /// Add a VM. Its initial quota is its share-based target, as far as unallocated fast memory
    /// allows now; the next `rebalance` makes the rest of the room (other VMs shrink, reason
    /// `Reclaim`), so the sum of quotas never exceeds the pool in between.
    pub fn add_vm(
        &mut self,
        vm: VmId,
        limits: VmLimits,
        now: Nanos,
    ) -> Result<QuotaChange, PoolError> {
        limits.validate(vm)?;
        if self.vms.contains_key(&vm) {
            return Err(PoolError::DuplicateVm(vm));
        }
        self.check_feasible(self.params.fast_bytes, Some((vm, limits)))?;
        self.vms.insert(
            vm,
            PoolVm {
                limits,
                quota: 0,
                demand: None,
                last: None,
                paced_at: None,
                goal: None,
            },
        );
        let target = self.targets().get(&vm).copied().unwrap_or(0);
        let free = self.free();
        let c = self.change(vm, target.min(free), QuotaReason::Initial, now);
        self.resplit = true;
        Ok(c)
    }

    /// New limits for a VM. Its quota is brought within them at once (reason `Clamp`; room for a
    /// raised minimum comes from unallocated memory, then from other VMs above their own
    /// minimums, reason `Reclaim`). In island mode every VM is re-split to the new shares.
    pub fn set_limits(
        &mut self,
        vm: VmId,
        limits: VmLimits,
        now: Nanos,
    ) -> Result<Vec<QuotaChange>, PoolError> {
        limits.validate(vm)?;
        if !self.vms.contains_key(&vm) {
            return Err(PoolError::UnknownVm(vm));
        }
        self.check_feasible(self.params.fast_bytes, Some((vm, limits)))?;
        let mut out = Vec::new();
        let v = self.vms.get_mut(&vm).expect("checked above");
        v.limits = limits;
        let q = v.quota;
        if q > limits.max_bytes {
            out.push(self.change(vm, limits.max_bytes, QuotaReason::Clamp, now));
        } else if q < limits.min_bytes {
            let targets = self.targets();
            out.extend(self.reclaim_for(vm, limits.min_bytes - q, &targets, now));
            let to = (q + self.free()).min(limits.min_bytes);
            out.push(self.change(vm, to, QuotaReason::Clamp, now));
        }
        if self.params.mode == PoolMode::Island {
            let targets = self.targets();
            out.extend(self.settle(&targets, QuotaReason::Reclaim, QuotaReason::Config, now));
        }
        Ok(out)
    }

    /// Remove a VM; its quota returns to the pool. False if it was not there.
    pub fn remove_vm(&mut self, vm: VmId) -> bool {
        let had = self.vms.remove(&vm).is_some();
        self.resplit |= had;
        had
    }

    pub fn quota(&self, vm: VmId) -> Option<u64> {
        self.vms.get(&vm).map(|v| v.quota)
    }

    pub fn limits(&self, vm: VmId) -> Option<VmLimits> {
        self.vms.get(&vm).map(|v| v.limits)
    }

    pub fn last_change(&self, vm: VmId) -> Option<QuotaChange> {
        self.vms.get(&vm).and_then(|v| v.last)
    }

    /// `demand`: per VM its estimated hot-set bytes (VMs not listed keep their last estimate).
    /// Returns the quota changes made now, shrinks before grows. In island mode demand is ignored:
    /// only a VM that joined or left (or a minimum not yet honoured) changes quotas.
    pub fn rebalance(&mut self, demand: &[(VmId, u64)], now: Nanos) -> Vec<QuotaChange> {
        let band = self.params.hysteresis_fraction;
        for &(vm, hot) in demand {
            if let Some(v) = self.vms.get_mut(&vm) {
                v.demand = match v.demand {
                    Some(d) if (hot.abs_diff(d) as f64) <= band * v.quota as f64 => Some(d),
                    _ => Some(hot),
                };
            }
        }
        let targets = self.targets();
        let mut out = self.honour_minimums(&targets, now);
        match self.params.mode {
            PoolMode::Island => {
                if self.resplit {
                    out.extend(self.settle(
                        &targets,
                        QuotaReason::Reclaim,
                        QuotaReason::Initial,
                        now,
                    ));
                    self.resplit = false;
                }
            }
            PoolMode::Pool => {
                self.resplit = false;
                out.extend(self.pace(&targets, now));
            }
        }
        out
    }

    /// Guaranteed minimums first (a VM that joined without room): not rate-limited.
    fn honour_minimums(&mut self, targets: &BTreeMap<VmId, u64>, now: Nanos) -> Vec<QuotaChange> {
        let short: Vec<(VmId, u64)> = self
            .vms
            .iter()
            .filter(|(_, v)| v.quota < v.limits.min_bytes)
            .map(|(&id, v)| (id, v.limits.min_bytes - v.quota))
            .collect();
        let mut out = Vec::new();
        for (vm, need) in short {
            out.extend(self.reclaim_for(vm, need, targets, now));
            let q = self.vms[&vm].quota;
            let to = (q + self.free()).min(self.vms[&vm].limits.min_bytes);
            out.push(self.change(vm, to, QuotaReason::Initial, now));
        }
        out
    }

    fn free(&self) -> u64 {
        self.params
            .fast_bytes
            .saturating_sub(self.allocated_bytes())
    }

    fn check_feasible(
        &self,
        fast_bytes: u64,
        replace: Option<(VmId, VmLimits)>,
    ) -> Result<(), PoolError> {
        let mut sum: u64 = self
            .vms
            .iter()
            .filter(|(id, _)| Some(**id) != replace.map(|r| r.0))
            .map(|(_, v)| v.limits.min_bytes)
            .fold(0u64, |a, b| a.saturating_add(b));
        if let Some((_, l)) = replace {
            sum = sum.saturating_add(l.min_bytes);
        }
        if sum > fast_bytes {
            return Err(PoolError::Infeasible {
                min_sum_bytes: sum,
                fast_bytes,
            });
        }
        Ok(())
    }

    fn change(&mut self, vm: VmId, to: u64, reason: QuotaReason, now: Nanos) -> QuotaChange {
        let v = self.vms.get_mut(&vm).expect("caller checked the VM");
        let c = QuotaChange {
            vm,
            from_bytes: v.quota,
            to_bytes: to,
            hot_set_bytes: v.demand.unwrap_or(0),
            reason,
            at: now,
        };
        v.quota = to;
        v.last = Some(c);
        if matches!(reason, QuotaReason::Grow | QuotaReason::Shrink) {
            v.paced_at = Some(now);
        }
        c
    }

    /// What each VM wants: its hot set with headroom within its limits; unlimited (its maximum)
    /// in island mode or before it reported a hot set.
    fn want(&self, v: &PoolVm) -> u64 {
        let l = v.limits;
        match (self.params.mode, v.demand) {
            (PoolMode::Pool, Some(d)) => {
                let w = (d as f64 * (1.0 + self.params.headroom_fraction)).ceil();
                (w.min(u64::MAX as f64) as u64).clamp(l.min_bytes, l.max_bytes)
            }
            _ => l.max_bytes,
        }
    }

    /// Target quota per VM. If all wants fit, each VM gets its want and the rest is split by
    /// shares up to the maximums; otherwise each VM gets its want or its share of the pool,
    /// whichever is smaller, but never less than its minimum (water-filling either way).
    fn targets(&self) -> BTreeMap<VmId, u64> {
        let total = self.params.fast_bytes;
        let wants: Vec<u64> = self.vms.values().map(|v| self.want(v)).collect();
        let sum_wants = wants.iter().fold(0u64, |a, &b| a.saturating_add(b));
        let items: Vec<(u64, u64, f64)> = self
            .vms
            .values()
            .zip(&wants)
            .map(|(v, &w)| {
                let s = v.limits.shares as f64;
                if sum_wants <= total {
                    (w, v.limits.max_bytes, s)
                } else {
                    (v.limits.min_bytes, w, s)
                }
            })
            .collect();
        let q = water_fill(&items, total);
        self.vms.keys().copied().zip(q).collect()
    }

    /// Take `need` bytes for `vm` beyond what is unallocated: from other VMs above their target
    /// first (largest surplus first), then from those above their minimum.
    fn reclaim_for(
        &mut self,
        vm: VmId,
        need: u64,
        targets: &BTreeMap<VmId, u64>,
        now: Nanos,
    ) -> Vec<QuotaChange> {
        let mut out = Vec::new();
        let mut need = need.saturating_sub(self.free());
        for floor_at_target in [true, false] {
            let mut donors: Vec<(VmId, u64)> = self
                .vms
                .iter()
                .filter(|(&id, _)| id != vm)
                .map(|(&id, v)| {
                    let floor = if floor_at_target {
                        targets
                            .get(&id)
                            .copied()
                            .unwrap_or(0)
                            .max(v.limits.min_bytes)
                    } else {
                        v.limits.min_bytes
                    };
                    (id, v.quota.saturating_sub(floor))
                })
                .filter(|&(_, s)| s > 0)
                .collect();
            donors.sort_by_key(|&(id, s)| (std::cmp::Reverse(s), id));
            for (id, surplus) in donors {
                if need == 0 {
                    return out;
                }
                let take = surplus.min(need);
                let q = self.vms[&id].quota;
                out.push(self.change(id, q - take, QuotaReason::Reclaim, now));
                need -= take;
            }
        }
        out
    }

    /// Move every VM to its target now: shrinks, then grows (which then fit).
    fn settle(
        &mut self,
        targets: &BTreeMap<VmId, u64>,
        shrink: QuotaReason,
        grow: QuotaReason,
        now: Nanos,
    ) -> Vec<QuotaChange> {
        let mut out = Vec::new();
        for (&vm, &t) in targets {
            if self.vms[&vm].quota > t {
                out.push(self.change(vm, t, shrink, now));
            }
        }
        for (&vm, &t) in targets {
            let q = self.vms[&vm].quota;
            if q < t {
                let to = t.min(q + self.free());
                out.push(self.change(vm, to, grow, now));
            }
        }
        out
    }

    /// Pool mode: move each VM toward its goal (its target, with hysteresis; none for growing
    /// while memory is unallocated), at most one step per interval; shrinks first, then the
    /// largest deficits grow into what is unallocated.
    fn pace(&mut self, targets: &BTreeMap<VmId, u64>, now: Nanos) -> Vec<QuotaChange> {
        let p = self.params;
        let step = ((p.fast_bytes as f64 * p.max_step_fraction) as u64).max(FRAME_SIZE);
        // Growing into unallocated memory takes nothing from anyone: no band for that.
        let unallocated = self.free() >= FRAME_SIZE;
        for (id, v) in self.vms.iter_mut() {
            let t = targets[id];
            let band = p.hysteresis_fraction * v.quota.max(t) as f64;
            let g = match v.goal {
                Some(g) if (g.abs_diff(t) as f64) <= band && !(unallocated && t > g) => g,
                _ => t,
            };
            v.goal = Some(g.clamp(v.limits.min_bytes, v.limits.max_bytes));
        }
        // Goals kept by hysteresis must not hold room another VM's target needs.
        let goals: u64 = self.vms.values().filter_map(|v| v.goal).sum();
        if goals > p.fast_bytes {
            for (id, v) in self.vms.iter_mut() {
                v.goal = v.goal.map(|g| g.min(targets[id]));
            }
        }
        let due = |v: &PoolVm| {
            v.paced_at
                .is_none_or(|t| now.saturating_sub(t) >= p.rebalance_interval)
        };
        let goal = |v: &PoolVm| v.goal.unwrap_or(v.quota);
        let mut out = Vec::new();
        let shrinking: Vec<(VmId, u64)> = self
            .vms
            .iter()
            .filter(|(_, v)| v.quota >= goal(v) + FRAME_SIZE && due(v))
            .map(|(&id, v)| (id, goal(v).max(v.quota.saturating_sub(step))))
            .collect();
        for (vm, to) in shrinking {
            out.push(self.change(vm, to, QuotaReason::Shrink, now));
        }
        let mut growing: Vec<(VmId, u64)> = self
            .vms
            .iter()
            .filter(|(_, v)| v.quota + FRAME_SIZE <= goal(v) && due(v))
            .map(|(&id, v)| (id, goal(v) - v.quota))
            .collect();
        growing.sort_by_key(|&(id, d)| (std::cmp::Reverse(d), id));
        for (vm, deficit) in growing {
            let add = deficit.min(step).min(self.free());
            if add < FRAME_SIZE {
                continue;
            }
            let q = self.vms[&vm].quota;
            out.push(self.change(vm, q + add, QuotaReason::Grow, now));
        }
        out
    }
}

/// Largest water level `L` such that `sum(clamp(L * weight, lo, hi)) <= total`, and the
/// resulting amounts (rounded down to whole frames, never below `lo`). The caller guarantees
/// `sum(lo) <= total`.
fn water_fill(items: &[(u64, u64, f64)], total: u64) -> Vec<u64> {
    let at = |l: f64| -> Vec<u64> {
        items
            .iter()
            .map(|&(lo, hi, w)| {
                let x = (l * w).min(hi as f64);
                let x = (x.max(0.0) as u64) / FRAME_SIZE * FRAME_SIZE;
                x.clamp(lo, hi.max(lo))
            })
            .collect()
    };
    let sum = |v: &[u64]| v.iter().fold(0u64, |a, &b| a.saturating_add(b));
    let top = items
        .iter()
        .map(|&(_, hi, w)| hi as f64 / w)
        .fold(0.0f64, f64::max);
    let full = at(top);
    if sum(&full) <= total {
        return full;
    }
    let (mut lo, mut hi) = (0.0f64, top);
    for _ in 0..100 {
        let mid = (lo + hi) / 2.0;
        if sum(&at(mid)) <= total {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    at(lo)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn lim(min: u64, max: u64, shares: u32) -> VmLimits {
        VmLimits {
            min_bytes: min,
            max_bytes: max,
            shares,
        }
    }

    fn pool(mode: PoolMode, fast: u64) -> FastPool {
        FastPool::new(PoolParams {
            mode,
            fast_bytes: fast,
            ..Default::default()
        })
        .unwrap()
    }

    #[test]
    fn island_splits_by_shares_and_ignores_demand() {
        let mut p = pool(PoolMode::Island, 32 * GIB);
        for i in 0..4 {
            p.add_vm(VmId(i), lim(6 * GIB, 10 * GIB, 1), Nanos(0))
                .unwrap();
        }
        let settle = p.rebalance(&[], Nanos(1));
        assert!(!settle.is_empty());
        for i in 0..4 {
            assert_eq!(p.quota(VmId(i)), Some(8 * GIB));
        }
        let demand: Vec<_> = (0..4)
            .map(|i| (VmId(i), (i as u64 + 1) * 3 * GIB))
            .collect();
        for t in 2..100 {
            assert!(p.rebalance(&demand, Nanos::from_secs(t)).is_empty());
        }
    }

    #[test]
    fn pool_moves_quota_to_the_vm_that_needs_it_within_limits() {
        let mut p = pool(PoolMode::Pool, 32 * GIB);
        for i in 0..4 {
            p.add_vm(VmId(i), lim(6 * GIB, 10 * GIB, 1), Nanos(0))
                .unwrap();
        }
        let even: Vec<_> = (0..4).map(|i| (VmId(i), 5 * GIB)).collect();
        for t in 0..100 {
            p.rebalance(&even, Nanos::from_secs(t));
        }
        assert_eq!(p.quota(VmId(0)), Some(8 * GIB), "spare split by shares");
        let demand = [
            (VmId(0), 12 * GIB),
            (VmId(1), 5 * GIB),
            (VmId(2), 6 * GIB),
            (VmId(3), GIB),
        ];
        for t in 100..300 {
            p.rebalance(&demand, Nanos::from_secs(t));
        }
        assert_eq!(p.quota(VmId(0)), Some(10 * GIB), "capped at its maximum");
        assert!(p.quota(VmId(3)).unwrap() >= 6 * GIB, "kept its minimum");
        assert!(p.allocated_bytes() <= 32 * GIB);
        let c = p.last_change(VmId(0)).unwrap();
        assert_eq!(c.reason, QuotaReason::Grow);
    }

    #[test]
    fn infeasible_minimums_are_rejected_naming_the_problem() {
        let mut p = pool(PoolMode::Pool, 10 * GIB);
        p.add_vm(VmId(1), lim(6 * GIB, 8 * GIB, 1), Nanos(0))
            .unwrap();
        let e = p
            .add_vm(VmId(2), lim(6 * GIB, 8 * GIB, 1), Nanos(0))
            .unwrap_err();
        assert!(matches!(e, PoolError::Infeasible { .. }), "{e}");
        assert!(e.to_string().contains("minimums"));
        let e = p.add_vm(VmId(3), lim(2, 1, 1), Nanos(0)).unwrap_err();
        assert!(e.to_string().contains("limits.min_bytes"), "{e}");
        let e = FastPool::new(PoolParams {
            max_step_fraction: 0.0,
            ..Default::default()
        })
        .unwrap_err();
        assert!(e.to_string().starts_with("pool.max_step_fraction"), "{e}");
    }

    #[test]
    fn a_joining_vm_gets_its_minimum_from_others() {
        let mut p = pool(PoolMode::Pool, 16 * GIB);
        p.add_vm(VmId(1), lim(GIB, 16 * GIB, 1), Nanos(0)).unwrap();
        p.rebalance(&[(VmId(1), 20 * GIB)], Nanos(0));
        assert_eq!(p.quota(VmId(1)), Some(16 * GIB));
        let c = p
            .add_vm(VmId(2), lim(4 * GIB, 8 * GIB, 1), Nanos(1))
            .unwrap();
        assert_eq!(c.to_bytes, 0, "nothing unallocated yet");
        let ch = p.rebalance(&[], Nanos(2));
        assert!(ch
            .iter()
            .any(|c| c.vm == VmId(1) && c.reason == QuotaReason::Reclaim));
        assert!(p.quota(VmId(2)).unwrap() >= 4 * GIB);
        assert!(p.allocated_bytes() <= 16 * GIB);
    }
}
