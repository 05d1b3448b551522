//! Measured inputs of the simulator's guest-tracker cost model (docs/evaluation.md, "Tracking
//! costs"): what the module's passes do to page-table memory, emulated in user space.
//!
//! - `pte_read`: one pass over page-table entries that are present and not young, as the read
//!   pass of a window sees most of them: a load and two bit tests per 8-byte entry, tables much
//!   larger than the last-level cache.
//! - `pte_clear`: the same with every entry young, cleared with an atomic and-not, as
//!   `test_and_clear_bit(_PAGE_BIT_ACCESSED)` does.
//! - `page_walk`: the cost of a TLB miss on this machine: random loads, one per 4 KiB page, over
//!   256 MiB in 4 KiB pages against the same 256 MiB in 2 MiB pages (same cache misses, far fewer
//!   TLB misses). The difference per load is one page walk (a 2D walk under a hypervisor).
//!
//! `cargo bench -p vtism-sim --bench tracker_costs`; the figures go to docs/performance.md.

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};

const PRESENT: u64 = 1;
const ACCESSED: u64 = 1 << 5;
/// 64 Mi entries = 512 MiB of page tables, the tables of 256 GiB of guest memory.
const ENTRIES: usize = 64 << 20;

fn tables(young: bool) -> Vec<AtomicU64> {
    let v = if young { PRESENT | ACCESSED } else { PRESENT };
    (0..ENTRIES)
        .map(|i| AtomicU64::new(v | ((i as u64) << 12)))
        .collect()
}

fn pte_passes(c: &mut Criterion) {
    let mut g = c.benchmark_group("pte");
    g.sample_size(10);
    g.throughput(Throughput::Elements(ENTRIES as u64));
    let idle = tables(false);
    g.bench_function("pte_read", |b| {
        b.iter(|| {
            let mut young = 0u64;
            for e in &idle {
                let v = e.load(Ordering::Relaxed);
                if v & PRESENT != 0 && v & ACCESSED != 0 {
                    young += 1;
                }
            }
            black_box(young)
        })
    });
    drop(idle);
    let hot = tables(true);
    g.bench_function("pte_clear", |b| {
        b.iter_batched(
            || {
                for e in &hot {
                    e.fetch_or(ACCESSED, Ordering::Relaxed);
                }
            },
            |()| {
                let mut young = 0u64;
                for e in &hot {
                    let v = e.load(Ordering::Relaxed);
                    if v & PRESENT != 0
                        && v & ACCESSED != 0
                        && e.fetch_and(!ACCESSED, Ordering::Relaxed) & ACCESSED != 0
                    {
                        young += 1;
                    }
                }
                black_box(young)
            },
            BatchSize::PerIteration,
        )
    });
    g.finish();
}

/// 256 MiB, mapped so that `huge` asks for transparent huge pages (madvise mode is enough).
fn region(huge: bool) -> &'static mut [u8] {
    const LEN: usize = 256 << 20;
    // SAFETY: an anonymous private mapping of LEN bytes; checked for failure, never unmapped
    // (leaked for the benchmark's lifetime), and only this function hands out the slice.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            LEN + (2 << 20),
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert_ne!(p, libc::MAP_FAILED);
        let a = ((p as usize + (2 << 20) - 1) & !((2 << 20) - 1)) as *mut u8;
        let advice = if huge {
            libc::MADV_HUGEPAGE
        } else {
            libc::MADV_NOHUGEPAGE
        };
        libc::madvise(a.cast(), LEN, advice);
        let s = std::slice::from_raw_parts_mut(a, LEN);
        s.iter_mut().step_by(4096).for_each(|b| *b = 1);
        s
    }
}

fn page_walk(c: &mut Criterion) {
    let mut g = c.benchmark_group("tlb");
    g.sample_size(10);
    const LOADS: usize = 1 << 20;
    g.throughput(Throughput::Elements(LOADS as u64));
    // A random permutation of the pages, the same for both mappings.
    let pages = (256usize << 20) / 4096;
    let mut order: Vec<u32> = (0..pages as u32).collect();
    let mut x = 0x9e3779b97f4a7c15u64;
    for i in (1..pages).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        order.swap(i, (x % (i as u64 + 1)) as usize);
    }
    for (name, huge) in [("load_4k_pages", false), ("load_2m_pages", true)] {
        let r = region(huge);
        g.bench_function(name, |b| {
            b.iter(|| {
                let mut s = 0u64;
                for k in 0..LOADS {
                    // Dependent loads: the next address waits for this one, so latencies add.
                    let p = order[(k + s as usize) % pages] as usize * 4096 + 64 * (k % 64);
                    s = s.wrapping_add(r[p] as u64 & 1);
                }
                black_box(s)
            })
        });
    }
    g.finish();
}

/// The L2 data TLB's 4 KiB entries (what a full flush can make the workload walk again).
fn print_tlb_size() {
    #[cfg(target_arch = "x86_64")]
    {
        let (max_ext, l2) = (
            std::arch::x86_64::__cpuid(0x8000_0000).eax,
            std::arch::x86_64::__cpuid(0x8000_0006),
        );
        if max_ext >= 0x8000_0006 {
            // AMD: EBX[15:12] associativity code, EBX[11:0] 4 KiB L2 DTLB entries.
            println!(
                "L2 DTLB 4 KiB entries (cpuid 0x80000006 EBX[11:0]): {}",
                l2.ebx & 0xfff
            );
        }
    }
}

fn all(c: &mut Criterion) {
    print_tlb_size();
    pte_passes(c);
    page_walk(c);
}

criterion_group!(benches, all);
criterion_main!(benches);
