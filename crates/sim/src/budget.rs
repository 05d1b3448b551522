//! The guest module's CPU budget, its own C (guest/module/vtism_budget.c, compiled by build.rs),
//! behind a safe type: credit accrues with the clock at `cpu_budget_bp`, at most a bank of it is
//! saved (less the largest recent debt), and it pays for the thread's CPU. The simulator passes
//! its clocks in as the module passes ktime_get_ns() and sum_exec_runtime.
#![deny(clippy::undocumented_unsafe_blocks)]

mod ffi {
    /// `struct vt_budget` (vtism_guest.h), field for field.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default)]
    pub struct VtBudget {
        pub bp: u64,
        pub bank_ms: u64,
        pub credit_ns: i64,
        pub last_now: u64,
        pub last_cpu: u64,
        pub wake_ns: u64,
        pub overdraw_ns: u64,
        pub slept: bool,
    }

    extern "C" {
        pub fn vt_budget_start(b: *mut VtBudget, bp: u64, bank_ms: u64, now: u64, cpu: u64);
        pub fn vt_budget_account(b: *mut VtBudget, bp: u64, bank_ms: u64, now: u64, cpu: u64);
        pub fn vt_budget_bank(b: *const VtBudget) -> i64;
        pub fn vt_budget_when(b: *const VtBudget, need: i64) -> u64;
        pub fn vt_budget_round(b: *mut VtBudget);
        pub fn vt_budget_debt(b: *const VtBudget) -> u64;
    }
}

/// One tracker thread's budget. Times and CPU are ns; CPU is the thread's total.
#[derive(Clone, Debug)]
pub struct Budget {
    b: ffi::VtBudget,
    bp: u64,
    bank_ms: u64,
}

impl Budget {
    /// A full bank at `now`, the thread having used `cpu` so far (vt_thread's start).
    pub fn new(bp: u64, bank_ms: u64, now: u64, cpu: u64) -> Budget {
        let mut b = ffi::VtBudget::default();
        // SAFETY: `b` is a valid, exclusively borrowed vt_budget for the duration of the call.
        unsafe { ffi::vt_budget_start(&mut b, bp, bank_ms, now, cpu) };
        Budget { b, bp, bank_ms }
    }
    /// The clock reads `now` and the thread's CPU `cpu` (both never less than at the last
    /// call): the budget accrues and pays (vt_account).
    pub fn account(&mut self, now: u64, cpu: u64) {
        // SAFETY: as in `new`.
        unsafe { ffi::vt_budget_account(&mut self.b, self.bp, self.bank_ms, now, cpu) };
    }
    /// Credit left at the last account; below zero, a debt.
    pub fn credit(&self) -> i64 {
        self.b.credit_ns
    }
    /// The credit the thread may hold (vt_bank).
    pub fn bank(&self) -> i64 {
        // SAFETY: `self.b` is a valid vt_budget, only read.
        unsafe { ffi::vt_budget_bank(&self.b) }
    }
    /// When there will be `need` ns of credit (vt_when_credit), from the last account.
    pub fn when(&self, need: i64) -> u64 {
        // SAFETY: as in `bank`.
        unsafe { ffi::vt_budget_when(&self.b, need) }
    }
    /// A round was published: the largest recent debt decays.
    pub fn round(&mut self) {
        // SAFETY: as in `new`.
        unsafe { ffi::vt_budget_round(&mut self.b) }
    }
    /// CPU spent beyond the budget and not yet repaid.
    pub fn debt(&self) -> u64 {
        // SAFETY: as in `bank`.
        unsafe { ffi::vt_budget_debt(&self.b) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    /// 1% of a vCPU with a 1 s bank: 10 ms banked, earned at 10 µs per ms of clock.
    #[test]
    fn credit_accrues_to_the_bank_and_pays_for_cpu() {
        let mut b = Budget::new(100, 1000, 0, 0);
        assert_eq!(b.credit(), 10 * MS as i64);
        b.account(5000 * MS, 0);
        assert_eq!(b.credit(), 10 * MS as i64, "never more than the bank");
        b.account(5000 * MS, 4 * MS);
        assert_eq!(b.credit(), 6 * MS as i64);
        assert_eq!(b.when(1), 5000 * MS, "credit now");
        assert_eq!(b.debt(), 0);
    }

    /// A step that cost more than the credit leaves a debt: repaid by waiting, and kept out of
    /// the bank (at most half of it) until it decays.
    #[test]
    fn a_debt_is_repaid_by_waiting_and_shrinks_the_bank() {
        let mut b = Budget::new(100, 1000, 0, 0);
        b.account(0, 14 * MS);
        assert_eq!(b.debt(), 4 * MS);
        assert_eq!(b.bank(), 6 * MS as i64);
        // 4 ms of debt and 1 ms wanted at 1%: 500 ms of clock.
        assert_eq!(b.when(MS as i64), 500 * MS);
        b.account(500 * MS, 14 * MS);
        assert_eq!(b.credit(), MS as i64);
        assert_eq!(b.debt(), 0);
        // A debt larger than half the bank keeps half of it.
        b.account(500 * MS, 40 * MS);
        assert_eq!(b.bank(), 5 * MS as i64);
        for _ in 0..400 {
            b.round();
        }
        // (a sixteenth a round, in whole ns: what is left under 16 ns stays)
        assert!(
            b.bank() > 10 * MS as i64 - 16,
            "the debt decayed: {}",
            b.bank()
        );
    }
}
