//! What the module's work costs, from measured parts (`TrackingModel`): page-table entries read
//! and cleared (`cargo bench -p vtism-sim --bench tracker_costs`), the rate arithmetic per
//! region and frame (`guest/tests/bench_rate.c`), a full TLB flush on every vCPU per clearing
//! pass, and the seed's quadratic slowdown of the VM's threads per pass that clears Accessed
//! bits.

use super::estimate::Arith;
use crate::mechanism::EpochView;
use crate::model::TrackingModel;

/// CPU of a coarse window's rate arithmetic, ns.
pub fn arith_ns(t: &TrackingModel, a: Arith) -> f64 {
    let idle = if a.idle_computed {
        t.coarse_idle_ns
    } else {
        t.code_move_ns
    };
    let change = a.change.map_or(0.0, |p| {
        p * t.change_young_ns + (1.0 - p) * t.change_idle_ns
    });
    a.young * t.coarse_young_ns + a.idle * idle + change
}

/// An entry read, and cleared with probability `p_young` (an atomic and-not, read included).
pub fn entry_ns(t: &TrackingModel, p_young: f64) -> f64 {
    t.pte_read_ns + p_young * (t.pte_clear_ns - t.pte_read_ns)
}

/// What the tracker cost the VM in one epoch: the scanner's CPU, the slowdown of each pass, the
/// flushes.
#[derive(Default)]
pub struct Bill {
    pub cpu_s: f64,
    pub stall_ns: f64,
}

impl Bill {
    /// A pass of `cpu_ns` that clears Accessed bits, yielding every `pass_max_ns`: its CPU on
    /// one vCPU, and the seed's slowdown `scan_slowdown_per_ms * Ts^2` ms per slice of Ts ms on
    /// every thread.
    pub fn pass(&mut self, cpu_ns: f64, v: &EpochView<'_>, pass_max_ns: f64) {
        if cpu_ns <= 0.0 {
            return;
        }
        let n = (cpu_ns / pass_max_ns).ceil();
        let ts_ms = cpu_ns / n * 1e-6;
        let slowdown_ms = n * v.model.tracking.scan_slowdown_per_ms * ts_ms * ts_ms;
        self.cpu_s += cpu_ns * 1e-9;
        self.stall_ns += cpu_ns + slowdown_ms * 1e6 * v.wl.concurrency;
    }
    /// Work that reads the tracker's own state and writes the channel (publication): its CPU
    /// only; it clears no Accessed bit and flushes nothing, so the seed's slowdown (measured for
    /// scans that do) does not apply.
    pub fn cpu(&mut self, cpu_ns: f64) {
        self.cpu_s += cpu_ns * 1e-9;
        self.stall_ns += cpu_ns;
    }
    /// A full TLB flush on every vCPU: the IPI (the simulator's shootdown cost) and the refill.
    pub fn flush(&mut self, v: &EpochView<'_>) {
        let per_vcpu_us = v.model.migration.per_page_us + v.model.tracking.tlb_refill_us;
        self.stall_ns += v.wl.vcpus.max(1) as f64 * per_vcpu_us * 1e3;
    }
}
