//! One engine round for a 32 GiB VM (8 Mi frames) with 2 Mi hint entries: ingest + plan.
//! Target (issue): <= 20 ms on one core. Also reports engine memory per GiB of guest.

mod support {
    pub mod cpu_time;
}

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use support::cpu_time::ThreadCpuTime;
use vtism_engine::synth::GupsHotSet;
use vtism_engine::*;
use vtism_proto::{Gfn, HintEntry, RamMap, FRAME_SIZE};

const GIB: u64 = 1 << 30;
const VM_BYTES: u64 = 32 * GIB;
const FRAMES: u64 = VM_BYTES / FRAME_SIZE;

fn setup() -> (VtismPolicy, Vec<Vec<HintEntry>>) {
    setup_shape(1_835_008, 0.04)
}

/// `hot` frames hinted every round plus random cold touches (`cold_touch` of the rest a round).
fn setup_shape(hot: u64, cold_touch: f64) -> (VtismPolicy, Vec<Vec<HintEntry>>) {
    let topo = Topology::new(
        vec![
            NodeSpec {
                id: NodeId(0),
                tier: Tier(0),
                capacity_bytes: 64 * GIB,
                cpus: vec![0, 1],
                socket: 0,
            },
            NodeSpec {
                id: NodeId(1),
                tier: Tier(1),
                capacity_bytes: 256 * GIB,
                cpus: vec![],
                socket: 0,
            },
        ],
        None,
    )
    .unwrap();
    let mut e = VtismPolicy::new(
        topo,
        EngineParams {
            round_budget_bytes: 1 << 30,
            ..Default::default()
        },
    )
    .unwrap();
    // RAM map shaped like a real q35 guest: 2 GiB below the PCI hole, the rest above 4 GiB.
    let low = (2 * GIB) / FRAME_SIZE;
    let ram = RamMap::new(vec![
        vtism_proto::GfnRange::new(Gfn(0), Gfn(low)),
        vtism_proto::GfnRange::new(
            Gfn((4 * GIB) / FRAME_SIZE),
            Gfn((4 * GIB) / FRAME_SIZE + FRAMES - low),
        ),
    ])
    .unwrap();
    let vm = VmId(1);
    e.add_vm(VmSpec {
        id: vm,
        ram,
        fast_quota_bytes: 8 * GIB,
        home_node: Some(NodeId(0)),
    })
    .unwrap();
    e.set_placement(vm, Gfn(0), low, Some(NodeId(0))).unwrap();
    e.set_placement(
        vm,
        Gfn((4 * GIB) / FRAME_SIZE),
        FRAMES - low,
        Some(NodeId(1)),
    )
    .unwrap();
    // Default shape: 1.75 Mi hot frames (7 GiB) every round + ~0.25 Mi cold touches = ~2 Mi.
    let mut g = GupsHotSet::new(
        Gfn((4 * GIB) / FRAME_SIZE),
        FRAMES - low,
        hot,
        cold_touch,
        3,
    );
    g.move_hot_set(2_000_000);
    let rounds: Vec<Vec<HintEntry>> = (0..4).map(|_| g.round()).collect();
    assert!(rounds[0].len() >= 1_900_000, "{} entries", rounds[0].len());
    // Converge first: the steady state is what a host lives in.
    let mut last = None;
    for r in 0..40 {
        e.observe(
            vm,
            Observation::Hints {
                entries: &rounds[r % 4],
                overflow: false,
                counts: vtism_proto::CountMeaning::RoundsSeen,
            },
            Nanos::from_secs(r as u64),
        )
        .unwrap();
        last = Some(e.plan(&PlanContext::default(), Nanos::from_secs(r as u64)));
    }
    let s = &last.expect("40 rounds").stats.vms[0];
    eprintln!(
        "steady state: {} hot frames ({} fast), hot set {}, last round moved {} frames",
        s.hot_frames,
        s.hot_fast_frames,
        s.hot_set_frames,
        s.promote_frames + s.demote_frames + s.refill_frames
    );
    (e, rounds)
}

fn bench(c: &mut Criterion<ThreadCpuTime>) {
    let (mut e, rounds) = setup();
    let vm = VmId(1);
    eprintln!(
        "engine memory: {:.2} MiB for a 32 GiB VM = {:.1} KiB per GiB of guest ({:.2} bytes per 4 KiB frame)",
        e.memory_bytes() as f64 / (1 << 20) as f64,
        e.memory_bytes() as f64 / 1024.0 / 32.0,
        e.memory_bytes() as f64 / FRAMES as f64
    );
    let mut g = c.benchmark_group("engine_32GiB_2Mi_hints");
    g.sample_size(20);
    g.throughput(Throughput::Elements(rounds[0].len() as u64));
    let mut t = 100u64;
    g.bench_function("round_ingest_plus_plan", |b| {
        b.iter(|| {
            t += 1;
            let r = &rounds[(t % 4) as usize];
            e.observe(
                vm,
                Observation::Hints {
                    entries: r,
                    overflow: false,
                    counts: vtism_proto::CountMeaning::RoundsSeen,
                },
                Nanos::from_secs(t),
            )
            .unwrap();
            e.plan(&PlanContext::default(), Nanos::from_secs(t))
        })
    });
    g.bench_function("ingest_only", |b| {
        b.iter(|| {
            t += 1;
            let r = &rounds[(t % 4) as usize];
            e.observe(
                vm,
                Observation::Hints {
                    entries: r,
                    overflow: false,
                    counts: vtism_proto::CountMeaning::RoundsSeen,
                },
                Nanos::from_secs(t),
            )
            .unwrap()
        })
    });
    g.bench_function("plan_only", |b| {
        b.iter(|| {
            e.mark_all_dirty(); // a flag per VM: nothing to measure
            e.plan(&PlanContext::default(), Nanos::from_secs(t))
        })
    });
    g.finish();
    // The same number of hints, all in one contiguous hot set: no random accesses.
    let (mut e2, seq) = setup_shape(1_900_000, 0.0);
    let mut g = c.benchmark_group("engine_32GiB_2Mi_sequential_hints");
    g.sample_size(20);
    g.throughput(Throughput::Elements(seq[0].len() as u64));
    g.bench_function("round_ingest_plus_plan", |b| {
        b.iter(|| {
            t += 1;
            let r = &seq[(t % 4) as usize];
            e2.observe(
                vm,
                Observation::Hints {
                    entries: r,
                    overflow: false,
                    counts: vtism_proto::CountMeaning::RoundsSeen,
                },
                Nanos::from_secs(t),
            )
            .unwrap();
            e2.plan(&PlanContext::default(), Nanos::from_secs(t))
        })
    });
    g.finish();
    // A converging round: the hot set just moved, the plan is full (1 GiB budget).
    let mut g = c.benchmark_group("engine_32GiB_converging");
    g.sample_size(10);
    g.bench_function("round_after_hot_set_move", |b| {
        b.iter_batched(
            || {
                let (e, _) = setup();
                let mut gen = GupsHotSet::new(
                    Gfn((4 * GIB) / FRAME_SIZE),
                    FRAMES - (2 * GIB) / FRAME_SIZE,
                    1_835_008,
                    0.04,
                    9,
                );
                gen.move_hot_set(4_500_000);
                (e, gen.round())
            },
            |(mut e, hints)| {
                e.observe(
                    vm,
                    Observation::Hints {
                        entries: &hints,
                        overflow: false,
                        counts: vtism_proto::CountMeaning::RoundsSeen,
                    },
                    Nanos::from_secs(1000),
                )
                .unwrap();
                e.plan(&PlanContext::default(), Nanos::from_secs(1000))
            },
            BatchSize::PerIteration,
        )
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().with_measurement(ThreadCpuTime);
    targets = bench
}
criterion_main!(benches);
