//! Decode + validate throughput of a full 16 MiB channel (docs/performance.md, "Channel decode").
//!
//! One read = seqlock, header copy and checks, copy of every entry out of the region, and the
//! per-entry checks against a 2-range RAM map. Entries alternate between the ranges in a
//! pseudo-random order (hotness order, not address order), so the reader's range cache misses
//! often; about 1 in 16 is a 2 MiB unit.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::ptr::NonNull;
use std::time::Duration;
use vtism_proto::*;

const REGION: usize = 16 << 20;

fn ram() -> RamMap {
    // 2 GiB below the PCI hole and 8 GiB above 4 GiB.
    RamMap::new(vec![
        GfnRange::new(Gfn(0), Gfn(0x8_0000)),
        GfnRange::new(Gfn(0x10_0000), Gfn(0x30_0000)),
    ])
    .unwrap()
}

fn entries(n: usize) -> Vec<HintEntry> {
    let mut x = 0x2545_f491_4f6c_dd1du64;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let (base, frames) = if x & 1 == 0 {
                (0, 0x8_0000)
            } else {
                (0x10_0000, 0x20_0000)
            };
            let gfn = base + (x >> 8) % frames;
            let t = PageType::from_bits((x >> 3) as u8);
            if x & 0xf0 == 0 {
                HintEntry::new(
                    Gfn(gfn).huge_head(),
                    (x >> 40) as u32,
                    x & 4 != 0,
                    t,
                    true,
                    true,
                )
            } else {
                HintEntry::new(Gfn(gfn), (x >> 40) as u32, x & 4 != 0, t, false, x & 2 != 0)
            }
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let ram = ram();
    let mut g = c.benchmark_group("channel_decode");
    g.throughput(Throughput::Bytes(REGION as u64));
    g.sample_size(30).measurement_time(Duration::from_secs(8));

    // The production path: a region reached through a raw mapping.
    let mut backing = vec![0u64; REGION / 8];
    let ptr = NonNull::new(backing.as_mut_ptr().cast::<u8>()).unwrap();
    // SAFETY: `backing` outlives `region` and is only accessed through it while the bench runs.
    let region = unsafe { MmapRegion::new(ptr, REGION) }.unwrap();
    let mut w = ChannelWriter::init(&region, Tracker::Harness).unwrap();
    let all = entries(w.capacity() as usize);
    let p = w.publish(&all, &RoundMeta::default()).unwrap();
    assert_eq!(p.count, 2_096_640);

    let mut reader = ChannelReader::new();
    g.bench_function("mmap_16MiB_2M_entries", |b| {
        b.iter(|| {
            reader.reset();
            let round = reader.read(&region, &ram).unwrap().unwrap();
            assert_eq!(round.entries.len(), 2_096_640);
            reader.recycle(round);
        })
    });

    let owned = OwnedRegion::zeroed(REGION);
    ChannelWriter::init(&owned, Tracker::Harness)
        .unwrap()
        .publish(&all, &RoundMeta::default())
        .unwrap();
    g.bench_function("owned_16MiB_2M_entries", |b| {
        b.iter(|| {
            reader.reset();
            let round = reader.read(&owned, &ram).unwrap().unwrap();
            reader.recycle(round);
        })
    });

    // The per-entry checks alone, on an already copied round.
    g.bench_function("validate_only_2M_entries", |b| {
        b.iter(|| validate_entries(&all, &ram).unwrap())
    });
    g.finish();
    // `region` is dropped before `backing` (reverse declaration order), as its contract requires.
}

criterion_group!(benches, bench);
criterion_main!(benches);
