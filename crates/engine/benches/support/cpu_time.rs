//! Criterion measurement of this thread's CPU time (CLOCK_THREAD_CPUTIME_ID). The development
//! and CI machines have 2 cores shared with other work: wall time there measures the neighbours
//! as much as the code. CPU time still feels cache interference, but not time slicing.

use criterion::measurement::{Measurement, ValueFormatter};
use criterion::Throughput;

pub struct ThreadCpuTime;

fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes a timespec we own; the clock id is a constant Linux supports.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

impl Measurement for ThreadCpuTime {
    type Intermediate = u64;
    type Value = u64;
    fn start(&self) -> u64 {
        now_ns()
    }
    fn end(&self, i: u64) -> u64 {
        now_ns() - i
    }
    fn add(&self, a: &u64, b: &u64) -> u64 {
        a + b
    }
    fn zero(&self) -> u64 {
        0
    }
    fn to_f64(&self, v: &u64) -> f64 {
        *v as f64
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        &CpuFormatter
    }
}

struct CpuFormatter;

impl ValueFormatter for CpuFormatter {
    fn scale_values(&self, typical: f64, values: &mut [f64]) -> &'static str {
        let (div, unit) = if typical >= 1e9 {
            (1e9, "s cpu")
        } else if typical >= 1e6 {
            (1e6, "ms cpu")
        } else if typical >= 1e3 {
            (1e3, "µs cpu")
        } else {
            (1.0, "ns cpu")
        };
        values.iter_mut().for_each(|v| *v /= div);
        unit
    }
    fn scale_throughputs(&self, typical: f64, t: &Throughput, values: &mut [f64]) -> &'static str {
        match *t {
            Throughput::Bytes(b) | Throughput::BytesDecimal(b) => {
                values
                    .iter_mut()
                    .for_each(|v| *v = b as f64 / (*v / 1e9) / 1e9);
                "GB/s cpu"
            }
            Throughput::Elements(e) => {
                let _ = typical;
                values
                    .iter_mut()
                    .for_each(|v| *v = e as f64 / (*v / 1e9) / 1e6);
                "Melem/s cpu"
            }
        }
    }
    fn scale_for_machines(&self, values: &mut [f64]) -> &'static str {
        let _ = values;
        "ns cpu"
    }
}
