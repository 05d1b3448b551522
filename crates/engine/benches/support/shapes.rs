//! The engine bench's VM and hint rounds: a 32 GiB guest shaped like a q35 machine, and rounds of
//! about 2 Mi entries in the orders and mixes guests publish, for both count meanings.

use vtism_engine::synth::{GupsHotSet, Rng};
use vtism_engine::*;
use vtism_proto::{CountMeaning, Gfn, GfnRange, HintEntry, PageType, RamMap, FRAME_SIZE};

pub const GIB: u64 = 1 << 30;
pub const VM_BYTES: u64 = 32 * GIB;
pub const FRAMES: u64 = VM_BYTES / FRAME_SIZE;
pub const VM: VmId = VmId(1);
/// 2 GiB below the PCI hole, the rest above 4 GiB.
const LOW_FRAMES: u64 = (2 * GIB) / FRAME_SIZE;
const HIGH_BASE: u64 = (4 * GIB) / FRAME_SIZE;
const HOT_FRAMES: u64 = 1_835_008; // 7 GiB: the hot set of an 8 GiB quota
const UNIT: u64 = 512;

/// Hint rounds of one shape, replayed in rotation.
pub struct Shape {
    pub counts: CountMeaning,
    pub quota_bytes: u64,
    pub rounds: Vec<Vec<HintEntry>>,
}

impl Shape {
    pub fn entries(&self) -> u64 {
        self.rounds[0].len() as u64
    }
    pub fn observation(&self, t: u64) -> Observation<'_> {
        Observation::Hints {
            entries: &self.rounds[(t % self.rounds.len() as u64) as usize],
            overflow: false,
            counts: self.counts,
        }
    }
}

fn ram() -> RamMap {
    RamMap::new(vec![
        GfnRange::new(Gfn(0), Gfn(LOW_FRAMES)),
        GfnRange::new(Gfn(HIGH_BASE), Gfn(HIGH_BASE + FRAMES - LOW_FRAMES)),
    ])
    .unwrap()
}

/// Every 2 MiB block of the VM's RAM: guest RAM all on host THPs, QEMU's default where the host
/// leaves THP at `always` or `madvise` (docs/host.md, "Host huge pages").
pub fn thp_heads() -> Vec<Gfn> {
    ram()
        .ranges()
        .iter()
        .flat_map(|r| (r.start.0..r.end.0).step_by(UNIT as usize).map(Gfn))
        .collect()
}

/// A DRAM + CXL host with one 32 GiB VM, its fast quota, low RAM on DRAM and the rest on CXL.
fn engine(quota_bytes: u64) -> VtismPolicy {
    let node = |id, tier, gib, cpus| NodeSpec {
        id: NodeId(id),
        tier: Tier(tier),
        capacity_bytes: gib * GIB,
        cpus,
        socket: 0,
    };
    let topo = Topology::new(
        vec![node(0, 0, 64, vec![0, 1]), node(1, 1, 256, vec![])],
        None,
    )
    .unwrap();
    let mut e = VtismPolicy::new(
        topo,
        EngineParams {
            round_budget_bytes: GIB,
            ..Default::default()
        },
    )
    .unwrap();
    e.add_vm(VmSpec {
        id: VM,
        ram: ram(),
        fast_quota_bytes: quota_bytes,
        home_node: Some(NodeId(0)),
    })
    .unwrap();
    e.set_placement(VM, Gfn(0), LOW_FRAMES, Some(NodeId(0)))
        .unwrap();
    e.set_placement(VM, Gfn(HIGH_BASE), FRAMES - LOW_FRAMES, Some(NodeId(1)))
        .unwrap();
    e
}

/// The engine for `shape`, after rounds enough to bring the hot set to fast memory: the steady
/// state a host lives in.
pub fn converged(shape: &Shape) -> VtismPolicy {
    converge(engine(shape.quota_bytes), shape)
}

/// `converged` for a VM whose every 2 MiB block is a host THP from the start, as vtismd learns
/// at admission: its rounds fold into one entry per folio from the first.
pub fn converged_on_thps(shape: &Shape) -> VtismPolicy {
    let mut e = engine(shape.quota_bytes);
    e.set_host_folios(VM, thp_heads()).unwrap();
    converge(e, shape)
}

fn converge(mut e: VtismPolicy, shape: &Shape) -> VtismPolicy {
    let mut last = None;
    for r in 0..40 {
        e.observe(VM, shape.observation(r), Nanos::from_secs(r))
            .unwrap();
        last = Some(e.plan(&PlanContext::default(), Nanos::from_secs(r)));
    }
    let s = &last.expect("40 rounds").stats.vms[0];
    eprintln!(
        "{} entries ({:?}); steady state: {} hot frames ({} fast), hot set {}, last round moved {} frames",
        shape.entries(),
        shape.counts,
        s.hot_frames,
        s.hot_fast_frames,
        s.hot_set_frames,
        s.promote_frames + s.demote_frames + s.refill_frames
    );
    e
}

/// A GUPS hot set as one contiguous range hinted every round (counts are rounds seen), plus
/// `cold_touch` of the other frames at random; `hot` frames in all.
pub fn gups(hot: u64, cold_touch: f64) -> Shape {
    let mut g = GupsHotSet::new(Gfn(HIGH_BASE), FRAMES - LOW_FRAMES, hot, cold_touch, 3);
    g.move_hot_set(2_000_000);
    Shape {
        counts: CountMeaning::RoundsSeen,
        quota_bytes: 8 * GIB,
        rounds: (0..4).map(|_| g.round()).collect(),
    }
}

/// How the entries of a round are laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mix {
    /// Hottest first by level, each level in address order (how the module and the simulator's
    /// tracker publish): sorted runs.
    HotFirstRuns,
    /// The same entries in random order.
    RandomOrder,
    /// A seventh of the hot set in 2 MiB units (one entry each), the rest as in `HotFirstRuns`.
    HugeUnits,
    /// A tenth of the hot frames published twice (mapped by two processes), the second time up
    /// to four levels lower, so the two entries are far apart.
    Duplicates,
}

/// A hot frame run: `len` frames from dense index `start` at one level (or one 2 MiB unit).
struct Run {
    start: u64,
    len: u64,
    level: u8,
    huge: bool,
}

/// Rounds of about 2 Mi entries for the 32 GiB VM, laid out as `mix` says: a 7 GiB hot set
/// scattered over the guest's RAM in runs of 1-64 frames, at levels that vary by run and jitter
/// by round, and the rest cold frames. With rounds seen (v1.0) the cold ones are random frames
/// touched once in the round; with rate levels (v1.1) the guest publishes the rate of every frame
/// it tracks, so they are the same frames every round, at rates from 0.03 to 0.6 Hz.
/// Everything published fits the quota (10 GiB): the steady state plans no moves.
pub fn publication(counts: CountMeaning, mix: Mix) -> Shape {
    let ram = ram();
    let mut rng = Rng::new(11);
    let v11 = counts == CountMeaning::RateLevel;
    // Rounds seen of 8 (mostly every round), or rate levels (16 per octave, 96 = 1 Hz): hot
    // frames from 1.4 to 16 Hz.
    let hot_level = |r: &mut Rng| match counts {
        CountMeaning::RoundsSeen if r.chance(0.7) => 8,
        CountMeaning::RoundsSeen => 5 + r.below(3) as u8,
        CountMeaning::RateLevel => 104 + r.below(57) as u8,
    };
    let jitter = if v11 { 2 } else { 1 };
    let huge_units = if mix == Mix::HugeUnits { 512 } else { 0 };
    let is_huge_unit = |idx: u64| huge_units > 0 && (idx / UNIT) % 32 == 5;
    let dup_share = if mix == Mix::Duplicates { 0.1 } else { 0.0 };
    // Hot 4 KiB frames: the hot set less its units and duplicates.
    let hot_4k = ((HOT_FRAMES - huge_units * UNIT) as f64 / (1.0 + dup_share)) as u64;
    let density = hot_4k as f64 / (FRAMES - huge_units * UNIT) as f64;
    let mut runs = Vec::new();
    let mut idx = 0u64;
    while idx < FRAMES {
        if is_huge_unit(idx) {
            let level = hot_level(&mut rng);
            runs.push(Run {
                start: idx,
                len: UNIT,
                level,
                huge: true,
            });
            idx += UNIT;
            continue;
        }
        let len = (1 + rng.below(64)).min(UNIT - idx % UNIT);
        let gap = rng.below((65.0 * (1.0 / density - 1.0)) as u64);
        let level = hot_level(&mut rng);
        runs.push(Run {
            start: idx,
            len,
            level,
            huge: false,
        });
        idx += len + gap;
        // Runs never reach into a 2 MiB unit hinted as one.
        if is_huge_unit(idx) {
            idx = idx / UNIT * UNIT;
        }
    }
    let hot: u64 = runs.iter().filter(|r| !r.huge).map(|r| r.len).sum();
    let cold = 2 * 1024 * 1024 - hot - (hot as f64 * dup_share) as u64 - huge_units;
    let cold_rates: Vec<(u64, u8)> = (0..cold)
        .map(|_| (rng.below(FRAMES), 8 + rng.below(77) as u8))
        .collect();
    let gfn = |i: u64| ram.gfn_at(i).expect("dense index inside the RAM map");
    let entry = |i: u64, level: u8, write: bool, huge: bool| {
        (
            level,
            HintEntry::new(gfn(i), level as u32, write, PageType::Anon, huge, true),
        )
    };
    let rounds = (0..4)
        .map(|_| {
            let mut keyed: Vec<(u8, HintEntry)> = Vec::with_capacity(2 * 1024 * 1024 + 4096);
            for run in &runs {
                let level = run.level.saturating_sub(rng.below(jitter + 1) as u8).max(1);
                if run.huge {
                    keyed.push(entry(run.start, level, rng.chance(0.5), true));
                    continue;
                }
                for i in run.start..run.start + run.len {
                    keyed.push(entry(i, level, rng.chance(0.5), false));
                    if dup_share > 0.0 && rng.chance(dup_share) {
                        let l = level.saturating_sub(rng.below(5) as u8).max(1);
                        keyed.push(entry(i, l, false, false));
                    }
                }
            }
            for &(i, level) in &cold_rates {
                keyed.push(if v11 {
                    entry(
                        i,
                        level.saturating_sub(rng.below(jitter + 1) as u8),
                        false,
                        false,
                    )
                } else {
                    entry(rng.below(FRAMES), 1, false, false)
                });
            }
            match mix {
                Mix::RandomOrder => {
                    for k in (1..keyed.len()).rev() {
                        keyed.swap(k, rng.below(k as u64 + 1) as usize);
                    }
                }
                _ => keyed.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.gfn().cmp(&b.1.gfn()))),
            }
            keyed.into_iter().map(|(_, e)| e).collect()
        })
        .collect();
    Shape {
        counts,
        quota_bytes: 10 * GIB,
        rounds,
    }
}
