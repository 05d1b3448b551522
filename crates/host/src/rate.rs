//! vtismd's move rate limits: the engine's token buckets ([`MoveLimits`]) on the daemon's
//! monotonic clock, with waits as `Duration`s for the mover's workers. Global buckets also bound
//! each round's plan; per-VM ones cut each VM's share of it and pace its moves.

use std::time::{Duration, Instant};
use vtism_engine::{Allowances, Direction, MoveLimits, Nanos, QuotaChange, VmId};

/// The buckets, and the instant their clock counts from.
pub struct Limits {
    epoch: Instant,
    inner: MoveLimits,
}

impl Limits {
    pub fn new(promote_mbps: u64, demote_mbps: u64, burst_s: u64, now: Instant) -> Limits {
        Limits {
            epoch: now,
            inner: MoveLimits::new(promote_mbps, demote_mbps, burst_s, Nanos(0)),
        }
    }
    fn at(&self, t: Instant) -> Nanos {
        Nanos(t.saturating_duration_since(self.epoch).as_nanos() as u64)
    }
    pub fn set_burst_s(&mut self, burst_s: u64, now: Instant) {
        let now = self.at(now);
        self.inner.set_burst_s(burst_s, now);
    }
    pub fn set_global(&mut self, promote_mbps: u64, demote_mbps: u64, now: Instant) {
        let now = self.at(now);
        self.inner.set_global(promote_mbps, demote_mbps, now);
    }
    pub fn set_vm(&mut self, vm: VmId, promote_mbps: u64, demote_mbps: u64, now: Instant) {
        let now = self.at(now);
        self.inner.set_vm(vm, promote_mbps, demote_mbps, now);
    }
    /// Whether the VM's rates are its own ([`MoveLimits::set_own_rates`]).
    pub fn set_own_rates(&mut self, vm: VmId, own: bool, now: Instant) {
        let now = self.at(now);
        self.inner.set_own_rates(vm, own, now);
    }
    pub fn remove_vm(&mut self, vm: VmId) {
        self.inner.remove_vm(vm);
    }
    /// Each VM's buckets hold at least its quota ([`MoveLimits::follow_quotas`]).
    pub fn follow_quotas(&mut self, changes: &[QuotaChange], now: Instant) {
        let now = self.at(now);
        self.inner.follow_quotas(changes, now);
    }
    /// Takes bytes from the global and the VM's bucket; returns the wait.
    pub fn take(&mut self, vm: VmId, dir: Direction, bytes: u64, now: Instant) -> Duration {
        let now = self.at(now);
        Duration::from_nanos(self.inner.take(vm, dir, bytes, now).0)
    }
    /// True if a VM's own bucket would make a batch wait now.
    pub fn vm_throttled(&mut self, vm: VmId, dir: Direction, bytes: u64, now: Instant) -> bool {
        let now = self.at(now);
        self.inner.vm_throttled(vm, dir, bytes, now)
    }
    /// The round's plan budget and per-VM allowances over `window` from now
    /// ([`MoveLimits::round_inputs`]).
    pub fn round_inputs(&mut self, window: Duration, now: Instant) -> (Option<u64>, Allowances) {
        let now = self.at(now);
        let window = Nanos(window.as_nanos() as u64);
        self.inner.round_inputs(window, now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The daemon's clock reaches the engine's buckets: a VM's own limit makes it wait, and
    /// refills with time.
    #[test]
    fn waits_follow_the_daemon_clock() {
        let t0 = Instant::now();
        let mut l = Limits::new(100, 0, 1, t0);
        l.set_vm(VmId(1), 1, 0, t0);
        assert_eq!(
            l.take(VmId(1), Direction::Promote, 1_000_000, t0),
            Duration::ZERO
        );
        let w = l.take(VmId(1), Direction::Promote, 1_000_000, t0);
        assert!(w >= Duration::from_millis(999), "{w:?}");
        assert!(l.vm_throttled(VmId(1), Direction::Promote, 1, t0));
        let later = t0 + Duration::from_secs(3);
        assert!(!l.vm_throttled(VmId(1), Direction::Promote, 1, later));
        let (budget, a) = l.round_inputs(Duration::from_secs(1), later);
        assert_eq!(budget, None, "demote unlimited");
        assert_eq!(a.get(&(VmId(1), Direction::Promote)), Some(&2_000_000));
    }
}
