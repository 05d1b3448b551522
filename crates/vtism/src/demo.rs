//! `vtism demo`: the engine on a built-in synthetic workload, end to end through the channel.
//!
//! A synthetic guest (GUPS hot set, HeMem's shape: a hot set touched every round, the rest
//! rarely) publishes each round through a real channel region with the guest-side writer; the
//! host-side reader takes and validates it against the VM's RAM map; the engine plans; the plan is
//! applied to a model of the host's placement. One round is deliberately hostile (a frame outside
//! the VM) to show it being rejected and counted. The testbed runs the same engine on real QEMU.

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::Serialize;
use vtism_engine::synth::GupsHotSet;
use vtism_engine::*;
use vtism_proto::{
    ChannelReader, ChannelVersion, ChannelWriter, Gfn, HintEntry, OwnedRegion, PageType, RamMap,
    RoundMeta, Tracker, WriterConfig, FRAME_SIZE,
};

const MIB: u64 = 1 << 20;

#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Guest memory in MiB.
    #[arg(long, default_value_t = 4096)]
    pub vm_mib: u64,
    /// Fast-memory quota of the VM in MiB.
    #[arg(long, default_value_t = 1024)]
    pub quota_mib: u64,
    /// Hot set of the workload in MiB (it fits the quota by default).
    #[arg(long, default_value_t = 512)]
    pub hot_mib: u64,
    /// Cold memory already in fast memory at the start (first touch), in MiB.
    #[arg(long, default_value_t = 1024)]
    pub cold_fast_mib: u64,
    /// Hint rounds to run.
    #[arg(long, default_value_t = 24)]
    pub rounds: u32,
    /// Round at which the hot set jumps elsewhere (0: never).
    #[arg(long, default_value_t = 12)]
    pub move_at: u32,
    /// Migration budget per round in MiB.
    #[arg(long, default_value_t = 256)]
    pub budget_mib: u64,
    /// Seed of the synthetic workload.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Print one JSON object per round and a summary, instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
struct RoundLine {
    round: u32,
    verdict: String,
    hints: usize,
    promoted_mib: f64,
    demoted_mib: f64,
    fast_mib: f64,
    quota_mib: u64,
    hot_in_fast_pct: f64,
}

#[derive(Serialize)]
struct Summary {
    rounds: u32,
    accepted_rounds: u64,
    rejected_rounds: u64,
    rejected_by_reason: Vec<(String, u64)>,
    rounds_to_90pct: Option<u32>,
    rounds_to_90pct_after_move: Option<u32>,
    final_hot_in_fast_pct: f64,
    max_fast_mib: f64,
    migrated_mib: f64,
    engine_memory_kib: u64,
}

pub fn run(a: DemoArgs) -> Result<()> {
    if a.vm_mib < 4 || a.vm_mib > 1 << 20 {
        bail!("--vm-mib must be between 4 and 1048576");
    }
    if a.quota_mib > a.vm_mib {
        bail!(
            "--quota-mib ({}) is larger than the VM ({} MiB)",
            a.quota_mib,
            a.vm_mib
        );
    }
    if a.hot_mib == 0 || a.hot_mib > a.vm_mib / 2 {
        bail!(
            "--hot-mib must be between 1 and half the VM ({} MiB)",
            a.vm_mib / 2
        );
    }
    if a.cold_fast_mib > a.quota_mib {
        bail!(
            "--cold-fast-mib ({}) cannot exceed --quota-mib ({})",
            a.cold_fast_mib,
            a.quota_mib
        );
    }
    let frames = a.vm_mib * MIB / FRAME_SIZE;
    let hot = a.hot_mib * MIB / FRAME_SIZE;
    let cold_fast = a.cold_fast_mib * MIB / FRAME_SIZE;

    let (fast, slow) = (NodeId(0), NodeId(1));
    let topo = Topology::new(
        vec![
            NodeSpec {
                id: fast,
                tier: Tier(0),
                capacity_bytes: 2 * a.vm_mib * MIB,
                cpus: vec![0, 1],
                socket: 0,
            },
            NodeSpec {
                id: slow,
                tier: Tier(1),
                capacity_bytes: 4 * a.vm_mib * MIB,
                cpus: vec![],
                socket: 0,
            },
        ],
        Some(vec![vec![10, 24], vec![24, 10]]),
    )?;
    let params = EngineParams {
        round_budget_bytes: a.budget_mib * MIB,
        ..Default::default()
    };
    let mut engine = VtismPolicy::new(topo, params)?;
    let vm = VmId(1);
    let ram = RamMap::contiguous(frames);
    engine.add_vm(VmSpec {
        id: vm,
        ram: ram.clone(),
        fast_quota_bytes: a.quota_mib * MIB,
        home_node: Some(fast),
    })?;
    // Start: cold first-touch memory fills the front of fast memory, the rest (hot set included)
    // is on the slow node.
    let mut truth = vec![slow; frames as usize];
    truth[..cold_fast as usize]
        .iter_mut()
        .for_each(|n| *n = fast);
    engine
        .set_placement(vm, Gfn(0), cold_fast.max(1).min(frames), Some(fast))
        .ok();
    if cold_fast == 0 {
        engine.set_placement(vm, Gfn(0), frames, Some(slow))?;
    } else if frames > cold_fast {
        engine.set_placement(vm, Gfn(cold_fast), frames - cold_fast, Some(slow))?;
    }

    let mut guest = GupsHotSet::new(Gfn(0), frames, hot, 0.005, a.seed);
    // The hot set starts past the cold first-touch region, on slow memory.
    guest.move_hot_set(frames / 2);
    let region_bytes = (hot as usize * 2 * 8 + 4096)
        .next_power_of_two()
        .max(1 << 20);
    // The synthetic guest's counts are rounds seen: it speaks v1.0.
    let cfg = WriterConfig {
        tracker: Tracker::Harness,
        version: ChannelVersion::V1_0,
        ..WriterConfig::default()
    };
    let mut writer = ChannelWriter::init_with(OwnedRegion::zeroed(region_bytes), cfg)
        .context("initialising the channel region")?;
    let mut reader = ChannelReader::new();

    if !a.json {
        println!(
            "vtism demo: {} MiB VM, fast quota {} MiB, GUPS hot set {} MiB starting on the slow node, {} MiB of cold \
             first-touch memory in fast memory, budget {} MiB/round{}",
            a.vm_mib,
            a.quota_mib,
            a.hot_mib,
            a.cold_fast_mib,
            a.budget_mib,
            if a.move_at > 0 { format!(", hot set moves at round {}", a.move_at) } else { String::new() }
        );
        println!(
            "{:>5}  {:<26} {:>8} {:>10} {:>10} {:>10} {:>12}",
            "round", "channel", "hints", "promoted", "demoted", "fast", "hot in fast"
        );
    }
    let mut migrated = 0u64;
    let mut max_fast = cold_fast;
    let mut to90 = None;
    let mut to90_after = None;
    let mut last_hot_pct = 0.0;
    for round in 1..=a.rounds {
        if a.move_at > 0 && round == a.move_at {
            guest.move_hot_set(frames - hot - frames / 16); // far from the old one, on slow memory
        }
        let mut hints = guest.round();
        if round == 5 {
            // A hostile round: one frame far outside the VM's RAM.
            hints.push(HintEntry::new(
                Gfn(frames + 12_345),
                255,
                true,
                PageType::Anon,
                false,
                true,
            ));
        }
        let meta = RoundMeta {
            scan_interval_ms: 2500,
            hot_frames: hints.len() as u64,
            ..Default::default()
        };
        writer
            .publish(&hints, &meta)
            .context("publishing a round")?;
        let (verdict, promoted, demoted) = match reader.read(writer.region(), &ram) {
            Ok(Some(r)) => {
                let now = Nanos::from_millis(round as u64 * 2500);
                engine.observe(
                    vm,
                    Observation::Hints {
                        entries: &r.entries,
                        overflow: r.overflow(),
                        counts: r.counts(),
                    },
                    now,
                )?;
                let plan = engine.plan(&PlanContext::default(), now);
                let (mut p, mut d) = (0, 0);
                for m in &plan.moves {
                    let start = ram
                        .index_of(m.gfn)
                        .context("plan names a frame outside the VM")?
                        as usize;
                    for n in &mut truth[start..start + m.frames as usize] {
                        if *n != m.from {
                            bail!(
                                "plan moves {:?} from {} but the frame is on {}",
                                m,
                                m.from,
                                n
                            );
                        }
                        *n = m.to;
                    }
                    if m.kind == MoveKind::Promote {
                        p += m.bytes()
                    } else {
                        d += m.bytes()
                    }
                }
                migrated += p + d;
                (format!("round {} accepted", r.round), p, d)
            }
            Ok(None) => ("no new round".to_string(), 0, 0),
            Err(e) => (format!("REJECTED: {}", e.label()), 0, 0),
        };
        let fast_frames = truth.iter().filter(|&&n| n == fast).count() as u64;
        max_fast = max_fast.max(fast_frames);
        let hot_fast = (guest.hot_start..guest.hot_start + guest.hot_frames)
            .filter(|&i| truth[i as usize] == fast)
            .count();
        let hot_pct = 100.0 * hot_fast as f64 / guest.hot_frames as f64;
        last_hot_pct = hot_pct;
        if hot_pct >= 90.0 {
            if a.move_at == 0 || round < a.move_at {
                to90.get_or_insert(round);
            } else {
                to90_after.get_or_insert(round - a.move_at + 1);
            }
        }
        let line = RoundLine {
            round,
            verdict,
            hints: hints.len(),
            promoted_mib: promoted as f64 / MIB as f64,
            demoted_mib: demoted as f64 / MIB as f64,
            fast_mib: (fast_frames * FRAME_SIZE) as f64 / MIB as f64,
            quota_mib: a.quota_mib,
            hot_in_fast_pct: hot_pct,
        };
        if a.json {
            println!("{}", serde_json::to_string(&line)?);
        } else {
            println!(
                "{:>5}  {:<26} {:>8} {:>7.0} MiB {:>6.0} MiB {:>6.0} MiB {:>11.1}%",
                line.round,
                line.verdict,
                line.hints,
                line.promoted_mib,
                line.demoted_mib,
                line.fast_mib,
                line.hot_in_fast_pct
            );
        }
    }
    let c = reader.counters();
    let summary = Summary {
        rounds: a.rounds,
        accepted_rounds: c.accepted(),
        rejected_rounds: c.total_rejected(),
        rejected_by_reason: c
            .iter_rejected()
            .filter(|(_, n)| *n > 0)
            .map(|(r, n)| (format!("{r:?}"), n))
            .collect(),
        rounds_to_90pct: to90,
        rounds_to_90pct_after_move: to90_after,
        final_hot_in_fast_pct: last_hot_pct,
        max_fast_mib: (max_fast * FRAME_SIZE) as f64 / MIB as f64,
        migrated_mib: migrated as f64 / MIB as f64,
        engine_memory_kib: engine.memory_bytes() as u64 / 1024,
    };
    if a.json {
        println!("{}", serde_json::to_string(&summary)?);
    } else {
        println!();
        println!("summary");
        println!(
            "  rounds accepted / rejected: {} / {} {:?}",
            summary.accepted_rounds, summary.rejected_rounds, summary.rejected_by_reason
        );
        println!(
            "  rounds until 90% of the hot set was in fast memory: {}",
            fmt_rounds(summary.rounds_to_90pct)
        );
        if a.move_at > 0 {
            println!(
                "  rounds until 90% again after the hot set moved: {}",
                fmt_rounds(summary.rounds_to_90pct_after_move)
            );
        }
        println!(
            "  hot set in fast memory at the end: {:.1}%",
            summary.final_hot_in_fast_pct
        );
        println!(
            "  most fast memory used: {:.0} MiB of a {} MiB quota",
            summary.max_fast_mib, a.quota_mib
        );
        println!("  migrated in total: {:.0} MiB", summary.migrated_mib);
        println!(
            "  engine memory: {} KiB for {} MiB of guest memory",
            summary.engine_memory_kib, a.vm_mib
        );
    }
    if max_fast * FRAME_SIZE > a.quota_mib * MIB {
        bail!(
            "the fast quota was exceeded: {} MiB",
            max_fast * FRAME_SIZE / MIB
        );
    }
    Ok(())
}

fn fmt_rounds(r: Option<u32>) -> String {
    r.map_or("not reached".to_string(), |r| r.to_string())
}
