//! One engine round for a 32 GiB VM (8 Mi frames) with about 2 Mi hint entries: ingest + plan, in
//! the steady state. Target (issue 11): at most 10 ms on one idle core. Also reports engine memory
//! per GiB of guest.
//!
//! `VTISM_BENCH_ROUNDS=<group>/<shape>[:n]` skips Criterion: it sets the shape up, runs `n` rounds
//! (default 4) in `measured_rounds` and exits, for instruction counts that do not depend on the
//! machine's other load (`valgrind --tool=callgrind --collect-atstart=no
//! --toggle-collect='*measured_rounds*'`).

mod support {
    pub mod cpu_time;
    pub mod shapes;
}

use criterion::{BatchSize, Criterion, Throughput};
use support::cpu_time::ThreadCpuTime;
use support::shapes::{self, Mix, Shape, FRAMES, GIB, VM};
use vtism_engine::synth::GupsHotSet;
use vtism_engine::*;
use vtism_proto::{CountMeaning, Gfn, FRAME_SIZE};

/// The shapes benchmarked, by group and name.
fn shape(group: &str, name: &str) -> Option<Shape> {
    let counts = match group {
        "engine_32GiB_2Mi_hints" => {
            return (name == "round_ingest_plus_plan" || name == "ingest_only")
                .then(|| shapes::gups(1_835_008, 0.04))
        }
        "engine_32GiB_2Mi_sequential_hints" => return Some(shapes::gups(1_900_000, 0.0)),
        THPS => {
            return match name {
                "gups" => Some(shapes::gups(1_835_008, 0.04)),
                "v1.1_random_order" => Some(shapes::publication(
                    CountMeaning::RateLevel,
                    Mix::RandomOrder,
                )),
                _ => None,
            }
        }
        "engine_32GiB_round_v1.0" => CountMeaning::RoundsSeen,
        "engine_32GiB_round_v1.1" => CountMeaning::RateLevel,
        _ => return None,
    };
    let mix = match name {
        "hot_first_runs" => Mix::HotFirstRuns,
        "random_order" => Mix::RandomOrder,
        "huge_units" => Mix::HugeUnits,
        "duplicates" => Mix::Duplicates,
        _ => return None,
    };
    Some(shapes::publication(counts, mix))
}

const MIXES: [&str; 4] = ["hot_first_runs", "random_order", "huge_units", "duplicates"];

/// The group whose VM has every 2 MiB block a host THP.
const THPS: &str = "engine_32GiB_host_thps";

fn round(e: &mut VtismPolicy, s: &Shape, t: u64) -> Plan {
    e.observe(VM, s.observation(t), Nanos::from_secs(t))
        .unwrap();
    e.plan(&PlanContext::default(), Nanos::from_secs(t))
}

/// The engine for the GUPS shape, converged, with its memory printed; and the memory of another
/// with every 2 MiB block a host THP (its frame states kept per folio, its rounds folded into
/// per-folio sums).
fn converged_gups(gups: &Shape) -> VtismPolicy {
    let e = shapes::converged(gups);
    print_memory(&e, "4 KiB host pages");
    let thp = shapes::converged_on_thps(gups);
    print_memory(&thp, "every 2 MiB block a host THP");
    e
}

fn print_memory(e: &VtismPolicy, backing: &str) {
    eprintln!(
        "engine memory ({backing}): {:.2} MiB for a 32 GiB VM = {:.1} KiB per GiB of guest ({:.2} bytes per 4 KiB frame)",
        e.memory_bytes() as f64 / (1 << 20) as f64,
        e.memory_bytes() as f64 / 1024.0 / 32.0,
        e.memory_bytes() as f64 / FRAMES as f64
    );
}

fn bench(c: &mut Criterion<ThreadCpuTime>) {
    let mut t = 100u64;
    // Engines are converged on first use, so that a filtered run only sets up what it measures.
    let gups = shapes::gups(1_835_008, 0.04);
    let mut converged = None;
    // A GUPS hot set (one contiguous range, counts are rounds seen) plus random cold touches.
    let mut g = c.benchmark_group("engine_32GiB_2Mi_hints");
    g.sample_size(20);
    g.throughput(Throughput::Elements(gups.entries()));
    g.bench_function("round_ingest_plus_plan", |b| {
        let e = converged.get_or_insert_with(|| converged_gups(&gups));
        b.iter(|| {
            t += 1;
            round(e, &gups, t)
        })
    });
    g.bench_function("ingest_only", |b| {
        let e = converged.get_or_insert_with(|| converged_gups(&gups));
        b.iter(|| {
            t += 1;
            e.observe(VM, gups.observation(t), Nanos::from_secs(t))
                .unwrap()
        })
    });
    g.bench_function("plan_only", |b| {
        let e = converged.get_or_insert_with(|| converged_gups(&gups));
        b.iter(|| {
            e.mark_all_dirty(); // a flag per VM: nothing to measure
            e.plan(&PlanContext::default(), Nanos::from_secs(t))
        })
    });
    g.finish();
    drop((converged, gups));
    // The same number of hints, all in one contiguous hot set: no random accesses.
    let seq = shapes::gups(1_900_000, 0.0);
    let mut converged = None;
    let mut g = c.benchmark_group("engine_32GiB_2Mi_sequential_hints");
    g.sample_size(20);
    g.throughput(Throughput::Elements(seq.entries()));
    g.bench_function("round_ingest_plus_plan", |b| {
        let e = converged.get_or_insert_with(|| shapes::converged(&seq));
        b.iter(|| {
            t += 1;
            round(e, &seq, t)
        })
    });
    g.finish();
    drop((converged, seq));
    // What guests publish: scattered hot sets, hottest first or not, 2 MiB units, duplicates; with
    // counts that are rounds seen (channel v1.0) and rate levels (v1.1).
    for group in ["engine_32GiB_round_v1.0", "engine_32GiB_round_v1.1"] {
        let mut g = c.benchmark_group(group);
        g.sample_size(20);
        for name in MIXES {
            let s = shape(group, name).expect("a benchmarked shape");
            let mut converged = None;
            g.throughput(Throughput::Elements(s.entries()));
            g.bench_function(name, |b| {
                let e = converged.get_or_insert_with(|| shapes::converged(&s));
                b.iter(|| {
                    t += 1;
                    round(e, &s, t)
                })
            });
        }
        g.finish();
    }
    // The same VM with every 2 MiB block a host THP: rounds fold into one entry per folio, frames
    // are kept per folio. GUPS, and the v1.1 publication in no order, whose frames hinted twice
    // fold in more than one pass (`folio::FoldScratch::recount`).
    let mut g = c.benchmark_group(THPS);
    g.sample_size(10);
    for name in ["gups", "v1.1_random_order"] {
        let s = shape(THPS, name).expect("a benchmarked shape");
        let mut converged = None;
        g.throughput(Throughput::Elements(s.entries()));
        g.bench_function(name, |b| {
            let e = converged.get_or_insert_with(|| shapes::converged_on_thps(&s));
            b.iter(|| {
                t += 1;
                round(e, &s, t)
            })
        });
    }
    g.finish();
    // A converging round: the hot set just moved, the plan is full (1 GiB budget).
    let mut g = c.benchmark_group("engine_32GiB_converging");
    g.sample_size(10);
    g.bench_function("round_after_hot_set_move", |b| {
        b.iter_batched(
            || {
                let e = shapes::converged(&shapes::gups(1_835_008, 0.04));
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
                    VM,
                    Observation::Hints {
                        entries: &hints,
                        overflow: false,
                        counts: CountMeaning::RoundsSeen,
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

/// The rounds an instruction count covers (`--toggle-collect='*measured_rounds*'`).
#[inline(never)]
fn measured_rounds(e: &mut VtismPolicy, s: &Shape, ingest_only: bool, n: u64) -> u64 {
    let mut moved = 0;
    for t in 1000..1000 + n {
        if ingest_only {
            e.observe(VM, s.observation(t), Nanos::from_secs(t))
                .unwrap();
        } else {
            moved += round(e, s, t).moves.len() as u64;
        }
    }
    moved
}

/// `VTISM_BENCH_ROUNDS=<group>/<shape>[:n]`: set up, run `n` rounds, exit.
fn count_rounds(spec: &str) {
    let (id, n) = match spec.split_once(':') {
        Some((id, n)) => (id, n.parse().expect("VTISM_BENCH_ROUNDS: rounds after ':'")),
        None => (spec, 4),
    };
    let (group, name) = id
        .split_once('/')
        .expect("VTISM_BENCH_ROUNDS=<group>/<shape>[:n]");
    let s =
        shape(group, name).unwrap_or_else(|| panic!("VTISM_BENCH_ROUNDS: no shape {group}/{name}"));
    let mut e = match group {
        THPS => shapes::converged_on_thps(&s),
        _ => shapes::converged(&s),
    };
    let moved = measured_rounds(&mut e, &s, name == "ingest_only", n);
    eprintln!("{id}: {n} rounds of {} entries, {moved} moves", s.entries());
}

fn main() {
    if let Ok(spec) = std::env::var("VTISM_BENCH_ROUNDS") {
        count_rounds(&spec);
        return;
    }
    let mut c = Criterion::default()
        .with_measurement(ThreadCpuTime)
        .configure_from_args();
    bench(&mut c);
    c.final_summary();
}
