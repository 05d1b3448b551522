//! Move rate limits on the caller's clock: token buckets in bytes per direction, global (they
//! bound each round's plan) and per VM (they cut each VM's share of a round, and pace its
//! moves). vtismd and the simulator keep the same buckets and read a round's inputs from them
//! the same way ([`MoveLimits::round_inputs`]).

use crate::allowance::Allowances;
use crate::plan::Direction;
use crate::pool::QuotaChange;
use crate::types::{Nanos, VmId};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// The daemon's round cadence and move limits, with their defaults: what `vtismd` runs unless
/// its configuration says otherwise, and what `vtism sim` runs vtism with.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RoundLimits {
    /// A tiering round every this many ms.
    pub interval_ms: u64,
    /// Global limits, MB/s (10^6 bytes) per direction; 0 = unlimited.
    pub promote_mbps: u64,
    pub demote_mbps: u64,
    /// Each VM's own limits, MB/s per direction; 0 = unlimited. A quarter of the global ones.
    pub vm_promote_mbps: u64,
    pub vm_demote_mbps: u64,
    /// Seconds of its rate a bucket holds: a hot set that moves now and then (a phase change)
    /// moves at once, while a guest that keeps flipping is held to the rate once its burst is
    /// spent.
    pub burst_s: u64,
}

impl RoundLimits {
    pub const DEFAULT: RoundLimits = RoundLimits {
        interval_ms: 1000,
        promote_mbps: 1024,
        demote_mbps: 1024,
        vm_promote_mbps: 256,
        vm_demote_mbps: 256,
        burst_s: 8,
    };
}

impl Default for RoundLimits {
    fn default() -> Self {
        RoundLimits::DEFAULT
    }
}

/// A token bucket in bytes. A rate of 0 is unlimited.
#[derive(Clone, Debug)]
pub struct TokenBucket {
    rate: f64,
    burst_s: f64,
    /// Bytes the bucket holds at least, whatever its rate (a VM's quota: see
    /// [`MoveLimits::follow_quotas`]).
    min_burst: f64,
    tokens: f64,
    last: Nanos,
}

impl TokenBucket {
    /// `mbps`: 10^6 bytes per second, 0 = unlimited; `burst_s`: seconds of that rate it holds
    /// (at least one). Starts full.
    pub fn new(mbps: u64, burst_s: u64, now: Nanos) -> TokenBucket {
        let rate = mbps as f64 * 1e6;
        let burst_s = burst_s.max(1) as f64;
        TokenBucket {
            rate,
            burst_s,
            min_burst: 0.0,
            tokens: rate * burst_s,
            last: now,
        }
    }
    fn burst(&self) -> f64 {
        (self.rate * self.burst_s).max(self.min_burst)
    }
    pub fn unlimited(&self) -> bool {
        self.rate == 0.0
    }
    /// Bytes per second.
    pub fn rate(&self) -> f64 {
        self.rate
    }
    fn refill(&mut self, now: Nanos) {
        let dt = now.saturating_sub(self.last).as_secs_f64();
        self.last = self.last.max(now);
        self.tokens = (self.tokens + dt * self.rate).min(self.burst());
    }
    /// Bytes available now (u64::MAX when unlimited).
    pub fn available(&mut self, now: Nanos) -> u64 {
        if self.unlimited() {
            return u64::MAX;
        }
        self.refill(now);
        self.tokens.max(0.0) as u64
    }
    /// Takes `bytes` and returns how long the caller must wait before using them: the bucket may
    /// go into debt, so a batch larger than the burst still goes through at the average rate.
    pub fn take(&mut self, bytes: u64, now: Nanos) -> Nanos {
        if self.unlimited() {
            return Nanos(0);
        }
        self.refill(now);
        self.tokens -= bytes as f64;
        self.debt_wait(self.tokens)
    }
    /// How long a `take(bytes)` now would have to wait, without taking.
    pub fn wait_for(&mut self, bytes: u64, now: Nanos) -> Nanos {
        if self.unlimited() {
            return Nanos(0);
        }
        self.refill(now);
        self.debt_wait(self.tokens - bytes as f64)
    }
    fn debt_wait(&self, left: f64) -> Nanos {
        if left >= 0.0 {
            Nanos(0)
        } else {
            Nanos((-left / self.rate * 1e9).ceil() as u64)
        }
    }
    pub fn set_rate(&mut self, mbps: u64, now: Nanos) {
        self.refill(now);
        self.rate = mbps as f64 * 1e6;
        self.tokens = self.tokens.min(self.burst());
    }
    pub fn set_burst_s(&mut self, burst_s: u64, now: Nanos) {
        self.refill(now);
        self.burst_s = burst_s.max(1) as f64;
        self.tokens = self.tokens.min(self.burst());
    }
    /// Holds at least `bytes` from now on; a bucket that was full stays full, one that was not
    /// earns the difference at its rate.
    pub fn set_min_burst(&mut self, bytes: u64, now: Nanos) {
        self.refill(now);
        let full = self.tokens >= self.burst();
        self.min_burst = bytes as f64;
        self.tokens = match full {
            true => self.burst(),
            false => self.tokens.min(self.burst()),
        };
    }
    /// Bytes it allows over `window` from now: what it holds plus what it earns meanwhile.
    fn over(&mut self, window: Nanos, now: Nanos) -> u64 {
        let avail = self.available(now) as f64 + self.rate * window.as_secs_f64();
        avail as u64
    }
}

/// Global and per-VM buckets, per direction ([`Direction`] order).
#[derive(Clone, Debug)]
pub struct MoveLimits {
    global: [TokenBucket; 2],
    per_vm: BTreeMap<VmId, [TokenBucket; 2]>,
    /// VMs whose rates the operator set for them: their bursts stay `burst_s` of those rates.
    own_rates: BTreeSet<VmId>,
    /// Each VM's quota as [`MoveLimits::follow_quotas`] last heard it, own rates or not, so that
    /// a VM whose own rates are removed holds its quota again at once.
    quotas: BTreeMap<VmId, u64>,
    burst_s: u64,
}

fn pair(promote_mbps: u64, demote_mbps: u64, burst_s: u64, now: Nanos) -> [TokenBucket; 2] {
    [
        TokenBucket::new(promote_mbps, burst_s, now),
        TokenBucket::new(demote_mbps, burst_s, now),
    ]
}

impl MoveLimits {
    /// Global limits in MB/s per direction (0 = unlimited); every bucket, the VMs' too, holds
    /// `burst_s` seconds of its rate.
    pub fn new(promote_mbps: u64, demote_mbps: u64, burst_s: u64, now: Nanos) -> MoveLimits {
        MoveLimits {
            global: pair(promote_mbps, demote_mbps, burst_s, now),
            per_vm: BTreeMap::new(),
            own_rates: BTreeSet::new(),
            quotas: BTreeMap::new(),
            burst_s,
        }
    }
    /// Every bucket's burst, the VMs' too (a reload).
    pub fn set_burst_s(&mut self, burst_s: u64, now: Nanos) {
        self.burst_s = burst_s;
        let vms = self.per_vm.values_mut().flatten();
        for b in self.global.iter_mut().chain(vms) {
            b.set_burst_s(burst_s, now);
        }
    }
    pub fn set_global(&mut self, promote_mbps: u64, demote_mbps: u64, now: Nanos) {
        self.global[0].set_rate(promote_mbps, now);
        self.global[1].set_rate(demote_mbps, now);
    }
    pub fn set_vm(&mut self, vm: VmId, promote_mbps: u64, demote_mbps: u64, now: Nanos) {
        match self.per_vm.get_mut(&vm) {
            Some(b) => {
                b[0].set_rate(promote_mbps, now);
                b[1].set_rate(demote_mbps, now);
            }
            None => {
                let b = pair(promote_mbps, demote_mbps, self.burst_s, now);
                self.per_vm.insert(vm, b);
            }
        }
    }
    pub fn remove_vm(&mut self, vm: VmId) {
        self.per_vm.remove(&vm);
        self.own_rates.remove(&vm);
        self.quotas.remove(&vm);
    }
    /// Whether the VM's rates are its own (set for it by the operator): an own rate is a bound
    /// the operator chose, so its burst is `burst_s` of it and never follows the quota. A VM
    /// whose rates stop being its own holds its last quota again (`follow_quotas`).
    pub fn set_own_rates(&mut self, vm: VmId, own: bool, now: Nanos) {
        let floor = match own {
            true => {
                self.own_rates.insert(vm);
                0
            }
            false if self.own_rates.remove(&vm) => self.quotas.get(&vm).copied().unwrap_or(0),
            false => return,
        };
        if let Some(b) = self.per_vm.get_mut(&vm) {
            b.iter_mut().for_each(|b| b.set_min_burst(floor, now));
        }
    }
    /// Each VM's buckets hold at least its fast quota, both ways: a VM whose hot set moves
    /// (a phase change) can exchange the whole of it at once, as the burst is meant to allow,
    /// however large its quota is against `burst_s` seconds of its rate; one that keeps
    /// flipping is still held to its rate once that is spent. Called with every quota change,
    /// a VM's first included; VMs with their own rates are passed over.
    pub fn follow_quotas(&mut self, changes: &[QuotaChange], now: Nanos) {
        for c in changes {
            self.quotas.insert(c.vm, c.to_bytes);
        }
        for c in changes.iter().filter(|c| !self.own_rates.contains(&c.vm)) {
            if let Some(b) = self.per_vm.get_mut(&c.vm) {
                b.iter_mut().for_each(|b| b.set_min_burst(c.to_bytes, now));
            }
        }
    }
    /// Takes bytes from the global and the VM's bucket; returns the wait.
    pub fn take(&mut self, vm: VmId, dir: Direction, bytes: u64, now: Nanos) -> Nanos {
        let i = dir as usize;
        let g = self.global[i].take(bytes, now);
        let v = self
            .per_vm
            .get_mut(&vm)
            .map_or(Nanos(0), |b| b[i].take(bytes, now));
        g.max(v)
    }
    /// True if a VM's own bucket would make a batch wait now (the global buckets are shared,
    /// so waiting on them is fair to everyone).
    pub fn vm_throttled(&mut self, vm: VmId, dir: Direction, bytes: u64, now: Nanos) -> bool {
        self.per_vm
            .get_mut(&vm)
            .is_some_and(|b| b[dir as usize].wait_for(bytes, now) > Nanos(0))
    }
    /// Bytes each VM with its own limits may move over `window` from now, per direction: the
    /// round cuts each VM's share of the plan to this.
    pub fn vm_allowances(&mut self, window: Nanos, now: Nanos) -> Allowances {
        let mut out = Allowances::new();
        for (vm, b) in self.per_vm.iter_mut() {
            for (i, dir) in Direction::ALL.into_iter().enumerate() {
                if !b[i].unlimited() {
                    out.insert((*vm, dir), b[i].over(window, now));
                }
            }
        }
        out
    }
    /// Bytes the global buckets allow over `window` from now: the plan budget. `None` when both
    /// directions are unlimited.
    pub fn budget(&mut self, window: Nanos, now: Nanos) -> Option<u64> {
        let mut total = 0u64;
        for b in self.global.iter_mut() {
            if b.unlimited() {
                return None;
            }
            total = total.saturating_add(b.over(window, now));
        }
        Some(total)
    }
    /// A round's inputs over the `window` until the next one: the plan budget and the per-VM
    /// allowances.
    pub fn round_inputs(&mut self, window: Nanos, now: Nanos) -> (Option<u64>, Allowances) {
        (self.budget(window, now), self.vm_allowances(window, now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn bucket_rates_and_debt() {
        let t0 = Nanos(5 * S);
        let mut b = TokenBucket::new(1, 1, t0); // 1 MB/s, burst 1 MB
        assert_eq!(b.available(t0), 1_000_000);
        assert_eq!(b.take(500_000, t0), Nanos(0));
        // 1.5 MB more: 1 MB of debt = 1 s wait.
        assert_eq!(b.take(1_500_000, t0), Nanos(S));
        // Refills to the burst, no further.
        assert_eq!(b.available(Nanos(8 * S)), 1_000_000);
        // A clock read earlier than the last one earns nothing and loses nothing.
        assert_eq!(b.available(Nanos(7 * S)), 1_000_000);
        let mut u = TokenBucket::new(0, 8, t0);
        assert_eq!(u.take(u64::MAX, t0), Nanos(0));
        assert_eq!(u.available(t0), u64::MAX);
    }

    #[test]
    fn limits_take_the_stricter_of_global_and_vm() {
        let t0 = Nanos(0);
        let mut l = MoveLimits::new(100, 0, 1, t0);
        l.set_vm(VmId(1), 1, 0, t0);
        assert_eq!(l.take(VmId(1), Direction::Promote, 1_000_000, t0), Nanos(0));
        let w = l.take(VmId(1), Direction::Promote, 1_000_000, t0);
        assert!(w >= Nanos(999_000_000), "{w:?}");
        assert!(l.vm_throttled(VmId(1), Direction::Promote, 1, t0));
        // Another VM only sees the global bucket (98 MB left).
        assert_eq!(l.take(VmId(2), Direction::Promote, 1_000_000, t0), Nanos(0));
        assert!(!l.vm_throttled(VmId(2), Direction::Promote, 1, t0));
        assert_eq!(l.budget(Nanos(S), t0), None, "demote unlimited");
        let mut l2 = MoveLimits::new(10, 10, 1, t0);
        assert_eq!(l2.budget(Nanos(S), t0), Some(40_000_000));
        // The allowance of a VM with its own limit: what is left now plus one window of rate.
        let (_, a) = l.round_inputs(Nanos(S), t0);
        assert_eq!(a.get(&(VmId(1), Direction::Promote)), Some(&1_000_000));
        assert_eq!(a.get(&(VmId(1), Direction::Demote)), None, "unlimited");
        assert_eq!(a.get(&(VmId(2), Direction::Promote)), None, "no own limit");
    }

    /// A bucket holding `burst_s` seconds lets a batch that size through at once, and a VM that
    /// keeps moving is held to the rate once that is spent.
    #[test]
    fn a_burst_moves_at_once_and_the_rate_holds_over_time() {
        let t0 = Nanos(0);
        let mut l = MoveLimits::new(0, 0, 8, t0);
        l.set_vm(VmId(1), 1, 1, t0);
        assert_eq!(l.take(VmId(1), Direction::Promote, 8_000_000, t0), Nanos(0));
        assert!(l.vm_throttled(VmId(1), Direction::Promote, 1, t0));
        // Moving on at 2 MB a second: after 100 s the wait says it ran at 1 MB/s since the burst.
        let mut wait = Nanos(0);
        for s in 1..=100 {
            wait = l.take(VmId(1), Direction::Promote, 2_000_000, Nanos(s * S));
        }
        assert_eq!(wait, Nanos(100 * S));
        // Idle long enough, it holds a whole burst again and no more.
        let later = Nanos(1000 * S);
        let (_, a) = l.round_inputs(Nanos(S), later);
        assert_eq!(a.get(&(VmId(1), Direction::Promote)), Some(&9_000_000));
    }

    fn quota(vm: u32, to_bytes: u64) -> QuotaChange {
        QuotaChange {
            vm: VmId(vm),
            from_bytes: 0,
            to_bytes,
            hot_set_bytes: 0,
            reason: crate::pool::QuotaReason::Initial,
            at: Nanos(0),
        }
    }

    /// A VM whose quota is larger than its burst exchanges the whole quota at once (a phase
    /// change), and is then held to its rate; its quota shrinking brings the burst back down.
    #[test]
    fn a_vm_burst_holds_its_quota() {
        let t0 = Nanos(0);
        let mut l = MoveLimits::new(0, 0, 8, t0);
        l.set_vm(VmId(1), 1, 1, t0);
        l.set_vm(VmId(2), 1, 1, t0);
        l.follow_quotas(
            &[quota(1, 20_000_000), quota(2, 4_000_000), quota(3, 1 << 30)],
            t0,
        );
        let (_, a) = l.round_inputs(Nanos(0), t0);
        assert_eq!(a.get(&(VmId(1), Direction::Promote)), Some(&20_000_000));
        assert_eq!(a.get(&(VmId(1), Direction::Demote)), Some(&20_000_000));
        assert_eq!(
            a.get(&(VmId(2), Direction::Promote)),
            Some(&8_000_000),
            "rate x burst_s"
        );
        assert_eq!(a.get(&(VmId(3), Direction::Promote)), None, "no own limit");
        assert_eq!(
            l.take(VmId(1), Direction::Promote, 20_000_000, t0),
            Nanos(0)
        );
        assert!(l.vm_throttled(VmId(1), Direction::Promote, 1, t0));
        // Refills at its rate: 5 s earn 5 MB.
        let (_, a) = l.round_inputs(Nanos(0), Nanos(5 * S));
        assert_eq!(a.get(&(VmId(1), Direction::Promote)), Some(&5_000_000));
        l.follow_quotas(&[quota(1, 2_000_000)], Nanos(100 * S));
        let (_, a) = l.round_inputs(Nanos(0), Nanos(100 * S));
        assert_eq!(a.get(&(VmId(1), Direction::Promote)), Some(&8_000_000));
    }

    /// Rates the operator set for a VM bind as set: its burst stays `burst_s` of them whatever
    /// its quota, and turning them into its own drops a floor it had.
    #[test]
    fn own_rates_keep_their_burst() {
        let t0 = Nanos(0);
        let mut l = MoveLimits::new(0, 0, 1, t0);
        l.set_vm(VmId(1), 2, 2, t0);
        l.set_own_rates(VmId(1), true, t0);
        l.set_vm(VmId(2), 2, 2, t0);
        l.follow_quotas(&[quota(1, 48 << 20), quota(2, 48 << 20)], t0);
        let (_, a) = l.round_inputs(Nanos(0), t0);
        assert_eq!(a.get(&(VmId(1), Direction::Promote)), Some(&2_000_000));
        assert_eq!(a.get(&(VmId(2), Direction::Promote)), Some(&(48 << 20)));
        l.set_own_rates(VmId(2), true, t0);
        let (_, a) = l.round_inputs(Nanos(0), t0);
        assert_eq!(a.get(&(VmId(2), Direction::Demote)), Some(&2_000_000));
        // A reload removes VM 1's own rates: it holds its quota again, with no quota change;
        // the quota it heard while its rates were its own is the one it holds.
        l.follow_quotas(&[quota(1, 40 << 20)], t0);
        l.set_own_rates(VmId(1), false, t0);
        let (_, a) = l.round_inputs(Nanos(0), t0);
        assert_eq!(a.get(&(VmId(1), Direction::Promote)), Some(&(40 << 20)));
        // Telling a VM that follows its quota so again changes nothing.
        l.set_own_rates(VmId(1), false, t0);
        let (_, a) = l.round_inputs(Nanos(0), t0);
        assert_eq!(a.get(&(VmId(1), Direction::Demote)), Some(&(40 << 20)));
    }
}
