//! Move rate limits: token buckets per direction, global (which also bound each round's plan)
//! and per VM (which the round's allowances and the workers' pacing follow).

use std::collections::HashMap;
use std::time::{Duration, Instant};
use vtism_engine::{Allowances, Direction, VmId};

/// A token bucket in bytes. `rate == 0` is unlimited. Burst: one second of rate.
#[derive(Clone, Debug)]
pub struct TokenBucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    /// `mbps`: 10^6 bytes per second; 0 = unlimited.
    pub fn new(mbps: u64, now: Instant) -> TokenBucket {
        let rate = mbps as f64 * 1e6;
        TokenBucket {
            rate,
            burst: rate,
            tokens: rate,
            last: now,
        }
    }
    pub fn unlimited(&self) -> bool {
        self.rate == 0.0
    }
    fn refill(&mut self, now: Instant) {
        let dt = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + dt * self.rate).min(self.burst);
    }
    /// Bytes available now (u64::MAX when unlimited).
    pub fn available(&mut self, now: Instant) -> u64 {
        if self.unlimited() {
            return u64::MAX;
        }
        self.refill(now);
        self.tokens.max(0.0) as u64
    }
    /// Takes `bytes` and returns how long the caller must wait before using them: the bucket may
    /// go into debt, so a batch larger than the burst still goes through at the average rate.
    pub fn take(&mut self, bytes: u64, now: Instant) -> Duration {
        if self.unlimited() {
            return Duration::ZERO;
        }
        self.refill(now);
        self.tokens -= bytes as f64;
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / self.rate)
        }
    }
    /// How long a `take(bytes)` now would have to wait, without taking.
    pub fn wait_for(&mut self, bytes: u64, now: Instant) -> Duration {
        if self.unlimited() {
            return Duration::ZERO;
        }
        self.refill(now);
        let left = self.tokens - bytes as f64;
        if left >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-left / self.rate)
        }
    }
    pub fn set_rate(&mut self, mbps: u64, now: Instant) {
        self.refill(now);
        self.rate = mbps as f64 * 1e6;
        self.burst = self.rate;
        self.tokens = self.tokens.min(self.burst);
    }
}

/// Global and per-VM buckets, per direction.
pub struct Limits {
    global: [TokenBucket; 2],
    per_vm: HashMap<VmId, [TokenBucket; 2]>,
}

impl Limits {
    pub fn new(promote_mbps: u64, demote_mbps: u64, now: Instant) -> Limits {
        Limits {
            global: [
                TokenBucket::new(promote_mbps, now),
                TokenBucket::new(demote_mbps, now),
            ],
            per_vm: HashMap::new(),
        }
    }
    pub fn set_global(&mut self, promote_mbps: u64, demote_mbps: u64, now: Instant) {
        self.global[0].set_rate(promote_mbps, now);
        self.global[1].set_rate(demote_mbps, now);
    }
    pub fn set_vm(&mut self, vm: VmId, promote_mbps: u64, demote_mbps: u64, now: Instant) {
        match self.per_vm.get_mut(&vm) {
            Some(b) => {
                b[0].set_rate(promote_mbps, now);
                b[1].set_rate(demote_mbps, now);
            }
            None => {
                self.per_vm.insert(
                    vm,
                    [
                        TokenBucket::new(promote_mbps, now),
                        TokenBucket::new(demote_mbps, now),
                    ],
                );
            }
        }
    }
    pub fn remove_vm(&mut self, vm: VmId) {
        self.per_vm.remove(&vm);
    }
    /// Takes bytes from the global and the VM's bucket; returns the wait.
    pub fn take(&mut self, vm: VmId, dir: Direction, bytes: u64, now: Instant) -> Duration {
        let i = dir as usize;
        let g = self.global[i].take(bytes, now);
        let v = self
            .per_vm
            .get_mut(&vm)
            .map_or(Duration::ZERO, |b| b[i].take(bytes, now));
        g.max(v)
    }
    /// True if a VM's own bucket would make a batch wait now (the global buckets are shared,
    /// so waiting on them is fair to everyone).
    pub fn vm_throttled(&mut self, vm: VmId, dir: Direction, bytes: u64, now: Instant) -> bool {
        self.per_vm
            .get_mut(&vm)
            .is_some_and(|b| !b[dir as usize].wait_for(bytes, now).is_zero())
    }
    /// Bytes each VM with its own limits may move over `window` from now, per direction: the
    /// round cuts each VM's share of the plan to this.
    pub fn vm_allowances(&mut self, window: Duration, now: Instant) -> Allowances {
        let mut out = Allowances::new();
        for (vm, b) in self.per_vm.iter_mut() {
            for (i, dir) in Direction::ALL.into_iter().enumerate() {
                if !b[i].unlimited() {
                    let avail = b[i].available(now) as f64 + b[i].rate * window.as_secs_f64();
                    out.insert((*vm, dir), avail as u64);
                }
            }
        }
        out
    }
    /// Bytes the global buckets allow over `window` from now: the plan budget. `None` when both
    /// directions are unlimited.
    pub fn budget(&mut self, window: Duration, now: Instant) -> Option<u64> {
        let mut total = 0u64;
        for b in self.global.iter_mut() {
            if b.unlimited() {
                return None;
            }
            let avail = b.available(now) as f64 + b.rate * window.as_secs_f64();
            total = total.saturating_add(avail as u64);
        }
        Some(total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_rates_and_debt() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(1, t0); // 1 MB/s, burst 1 MB
        assert_eq!(b.available(t0), 1_000_000);
        assert_eq!(b.take(500_000, t0), Duration::ZERO);
        // 1.5 MB more: 1 MB of debt = 1 s wait.
        let w = b.take(1_500_000, t0);
        assert!((w.as_secs_f64() - 1.0).abs() < 1e-6, "{w:?}");
        let t1 = t0 + Duration::from_secs(3);
        // Refills to the burst, no further.
        assert_eq!(b.available(t1), 1_000_000);
        let mut u = TokenBucket::new(0, t0);
        assert_eq!(u.take(u64::MAX, t0), Duration::ZERO);
        assert_eq!(u.available(t0), u64::MAX);
    }

    #[test]
    fn limits_take_the_stricter_of_global_and_vm() {
        let t0 = Instant::now();
        let mut l = Limits::new(100, 0, t0);
        l.set_vm(VmId(1), 1, 0, t0);
        assert_eq!(
            l.take(VmId(1), Direction::Promote, 1_000_000, t0),
            Duration::ZERO
        );
        let w = l.take(VmId(1), Direction::Promote, 1_000_000, t0);
        assert!(w >= Duration::from_millis(999), "{w:?}");
        // Another VM only sees the global bucket (99 MB left).
        assert_eq!(
            l.take(VmId(2), Direction::Promote, 1_000_000, t0),
            Duration::ZERO
        );
        assert_eq!(
            l.budget(Duration::from_secs(1), t0),
            None,
            "demote unlimited"
        );
        let mut l2 = Limits::new(10, 10, t0);
        let b = l2.budget(Duration::from_secs(1), t0).unwrap();
        assert_eq!(b, 40_000_000);
        // The allowance of a VM with its own limit: what is left now plus one window of rate.
        let a = l.vm_allowances(Duration::from_secs(1), t0);
        assert_eq!(a.get(&(VmId(1), Direction::Promote)), Some(&1_000_000));
        assert_eq!(a.get(&(VmId(1), Direction::Demote)), None, "unlimited");
        assert_eq!(a.get(&(VmId(2), Direction::Promote)), None, "no own limit");
    }
}
