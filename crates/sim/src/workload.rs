//! Workload models. A workload is a deterministic (seeded) function from time to an access
//! profile: each unit's share of the VM's reads and writes. The simulator turns shares into
//! per-epoch counts with the throughput the memory model allows, so a 600 s run costs one pass over
//! the units per epoch, not one step per access.

use crate::trace::TraceWorkload;
use vtism_engine::synth::Rng;
use vtism_proto::PageType;

/// Each unit's share of the VM's accesses (reads and writes sum to 1 over all units) and the page
/// type the guest sees there.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Profile {
    pub read: Vec<f32>,
    pub write: Vec<f32>,
    pub ptype: Vec<PageType>,
}

impl Profile {
    fn new(units: usize, t: PageType) -> Profile {
        Profile {
            read: vec![0.0; units],
            write: vec![0.0; units],
            ptype: vec![t; units],
        }
    }
    /// Spread `share` of all accesses evenly over `range`, `write_frac` of it as writes.
    fn spread(&mut self, range: std::ops::Range<usize>, share: f64, write_frac: f64) {
        if range.is_empty() {
            return;
        }
        let per = share / range.len() as f64;
        for i in range {
            self.read[i] += (per * (1.0 - write_frac)) as f32;
            self.write[i] += (per * write_frac) as f32;
        }
    }
    fn add(&mut self, i: usize, share: f64, write_frac: f64) {
        self.read[i] += (share * (1.0 - write_frac)) as f32;
        self.write[i] += (share * write_frac) as f32;
    }
    /// Rescale so shares sum to 1 (f32 rounding and empty workloads).
    pub fn normalise(&mut self) {
        let s: f64 = self
            .read
            .iter()
            .chain(self.write.iter())
            .map(|&x| x as f64)
            .sum();
        if s > 0.0 {
            let k = (1.0 / s) as f32;
            self.read.iter_mut().for_each(|x| *x *= k);
            self.write.iter_mut().for_each(|x| *x *= k);
        }
    }
    pub fn units(&self) -> usize {
        self.read.len()
    }
    pub fn share(&self, i: usize) -> f64 {
        self.read[i] as f64 + self.write[i] as f64
    }
}

/// The parameterised kinds of workload, as the CLI and the suite name them.
#[derive(Clone, Debug)]
pub enum Kind {
    /// HeMem/Demeter GUPS: `threads` slices, each with its hot chunk at the slice's start;
    /// `hot_frac` of updates to the hot set, the rest uniform over the slice (read-modify-write:
    /// one read and one write per update). `move_at`: the hot chunks jump to each slice's middle.
    Gups {
        hot_bytes: u64,
        hot_frac: f64,
        move_at: Option<f64>,
    },
    /// Key-value store: fixed-size values, zipfian key popularity (theta), keys hashed over the
    /// footprint, `write_frac` updates.
    KvZipf {
        value_bytes: u64,
        theta: f64,
        write_frac: f64,
    },
    /// PageRank-like power-law graph: vertex data (a quarter of the footprint) read at random with
    /// power-law popularity, edges streamed sequentially once per iteration, vertex writes.
    Graph { iteration_secs: f64, theta: f64 },
    /// HMM-V's sequential access: a hot window of `hot_frac` of the footprint swept sequentially
    /// (50% reads, 50% writes), jumping to the next window every `phase_secs`.
    SeqWindow { hot_frac: f64, phase_secs: f64 },
    /// A large guest page cache (read at boot, so it is touched first) plus hot anonymous data.
    FileCache { file_frac: f64, hot_anon_frac: f64 },
    /// Uniform, intensive access to the whole footprint (SPEC fotonik3d in HMM-V's co-run).
    Uniform { write_frac: f64 },
    /// Recorded hint stream replayed (see `trace`).
    Trace(std::sync::Arc<TraceWorkload>),
    /// The inner workload with all of its memory on the slow tier at the start and its fast
    /// share free, as the bake-off starts every manager (docs/bakeoff.md): a VM whose DRAM was
    /// taken while it ran elsewhere, rather than one whose first touches filled it.
    StartsOnSlow(Box<Kind>),
}

/// One VM's workload.
#[derive(Clone, Debug)]
pub struct VmWorkload {
    pub name: String,
    pub kind: Kind,
    pub footprint_bytes: u64,
    /// Outstanding memory accesses the VM keeps in flight (threads x memory-level parallelism).
    pub concurrency: f64,
    /// Compute between two accesses of one thread, ns.
    pub cpu_ns: f64,
    /// vCPUs (threads); TLB shootdowns and per-thread overheads reach each of them.
    pub vcpus: u32,
    pub seed: u64,
    /// The VM's weight in splitting the fast memory of a run between VMs; `None`: its footprint
    /// (every VM gets the same fast:slow ratio). HMM-V's co-run gives every VM the same DRAM.
    pub fast_weight: Option<f64>,
}

impl VmWorkload {
    pub fn units(&self, unit_bytes: u64) -> usize {
        self.footprint_bytes.div_ceil(unit_bytes) as usize
    }

    /// Identifier of the access distribution in force at time `t` (seconds): profiles only change
    /// when this changes.
    pub fn phase(&self, t: f64) -> u64 {
        if let Kind::StartsOnSlow(inner) = &self.kind {
            return self.with_kind(inner).phase(t);
        }
        match &self.kind {
            Kind::Gups {
                move_at: Some(m), ..
            } => (t >= *m) as u64,
            Kind::Graph { iteration_secs, .. } => {
                // Edges streamed in steps of a tenth of an iteration.
                (t / (iteration_secs / 10.0)).floor() as u64
            }
            Kind::SeqWindow { phase_secs, .. } => (t / phase_secs).floor() as u64,
            Kind::Trace(tr) => tr.phase(t),
            _ => 0,
        }
    }

    /// Order in which units are first touched (allocation order: what first-touch placement
    /// fills the fast tier with).
    pub fn touch_order(&self, unit_bytes: u64) -> Vec<u32> {
        let n = self.units(unit_bytes);
        // Address order: the application initialises its memory front to back. A file cache is
        // read at boot, before the application allocates its anonymous memory.
        let mut order: Vec<u32> = (0..n as u32).collect();
        if let Kind::FileCache { file_frac, .. } = self.kind {
            let f = ((n as f64) * file_frac) as usize;
            order = (n - f..n).chain(0..n - f).map(|x| x as u32).collect();
        }
        order
    }

    /// Whether first touch places nothing in fast memory (see [`Kind::StartsOnSlow`]).
    pub fn starts_on_slow(&self) -> bool {
        matches!(self.kind, Kind::StartsOnSlow(_))
    }

    /// The same VM with another kind of workload.
    fn with_kind(&self, kind: &Kind) -> VmWorkload {
        VmWorkload {
            kind: kind.clone(),
            ..self.clone()
        }
    }

    pub fn profile(&self, phase: u64, unit_bytes: u64) -> Profile {
        if let Kind::StartsOnSlow(inner) = &self.kind {
            return self.with_kind(inner).profile(phase, unit_bytes);
        }
        let n = self.units(unit_bytes);
        let mut p = Profile::new(n, PageType::Anon);
        match &self.kind {
            Kind::Gups {
                hot_bytes,
                hot_frac,
                ..
            } => {
                // threads = vcpus; each thread updates its own slice.
                let t = self.vcpus.max(1) as usize;
                let slice = (n / t).max(1);
                let hot = ((*hot_bytes / unit_bytes) as usize / t).clamp(1, slice);
                for k in 0..t {
                    let s0 = k * slice;
                    let s1 = if k == t - 1 { n } else { (s0 + slice).min(n) };
                    if s0 >= s1 {
                        continue;
                    }
                    let h0 = if phase == 1 {
                        s0 + (s1 - s0 - hot) / 2
                    } else {
                        s0
                    };
                    let share = 1.0 / t as f64;
                    p.spread(s0..s1, share * (1.0 - hot_frac), 0.5);
                    p.spread(h0..(h0 + hot).min(s1), share * hot_frac, 0.5);
                }
            }
            Kind::KvZipf {
                value_bytes,
                theta,
                write_frac,
            } => {
                let keys = (self.footprint_bytes / value_bytes).max(1);
                let per_unit = (unit_bytes / value_bytes).max(1);
                let mut rng = Rng::new(self.seed ^ 0x6b76);
                // Keys land in slots by hash; unit = slot / keys per unit.
                let h: f64 = (1..=keys).map(|r| (r as f64).powf(-theta)).sum();
                for r in 1..=keys {
                    let slot = rng.below(keys);
                    let u = ((slot / per_unit) as usize).min(n - 1);
                    p.add(u, (r as f64).powf(-theta) / h, *write_frac);
                }
            }
            Kind::Graph {
                iteration_secs: _,
                theta,
            } => {
                let vunits = (n / 4).max(1);
                let eunits = n - vunits;
                // Vertex popularity: power law over vertex units in a seeded order.
                let mut order: Vec<usize> = (0..vunits).collect();
                let mut rng = Rng::new(self.seed ^ 0x67);
                for i in (1..order.len()).rev() {
                    let j = rng.below(i as u64 + 1) as usize;
                    order.swap(i, j);
                }
                let h: f64 = (1..=vunits).map(|r| (r as f64).powf(-theta)).sum();
                for (r, &u) in order.iter().enumerate() {
                    p.add(u, 0.5 * ((r + 1) as f64).powf(-theta) / h, 0.0);
                }
                // Vertex writes: each vertex's new rank, sequentially over the iteration.
                let step = (phase % 10) as usize;
                let vw = vunits.div_ceil(10);
                p.spread(
                    (step * vw).min(vunits)..((step + 1) * vw).min(vunits),
                    0.1,
                    1.0,
                );
                if eunits > 0 {
                    let ew = eunits.div_ceil(10);
                    let a = vunits + (step * ew).min(eunits);
                    let b = vunits + ((step + 1) * ew).min(eunits);
                    p.spread(a..b, 0.4, 0.0);
                } else {
                    p.spread(0..vunits, 0.4, 0.0);
                }
            }
            Kind::SeqWindow { hot_frac, .. } => {
                let w = ((n as f64 * hot_frac) as usize).clamp(1, n);
                let windows = (n / w).max(1) as u64;
                let a = (phase % windows) as usize * w;
                let b = (a + w).min(n);
                p.spread(0..n, 0.05, 0.5);
                p.spread(a..b, 0.95, 0.5);
            }
            Kind::FileCache {
                file_frac,
                hot_anon_frac,
            } => {
                let f = ((n as f64) * file_frac) as usize;
                let anon = n - f;
                let hot = ((n as f64 * hot_anon_frac) as usize).clamp(1, anon.max(1));
                for t in p.ptype[anon..].iter_mut() {
                    *t = PageType::File;
                }
                p.spread(0..hot.min(anon), 0.90, 0.3);
                p.spread(hot.min(anon)..anon, 0.05, 0.3);
                p.spread(anon..n, 0.05, 0.0);
            }
            Kind::Uniform { write_frac } => p.spread(0..n, 1.0, *write_frac),
            Kind::Trace(tr) => return tr.profile(phase, n, unit_bytes),
            Kind::StartsOnSlow(_) => unreachable!("handled above"),
        }
        p.normalise();
        p
    }
}

const GIB: u64 = 1 << 30;

/// Names the CLI accepts for `--workload`.
pub const WORKLOADS: &[(&str, &str)] = &[
    (
        "gups-hotset",
        "GUPS, 14 GiB region, 1 GiB hot set, 90% of updates to it (Demeter/HeMem)",
    ),
    (
        "gups-hotset-move",
        "GUPS hot-set whose hot set jumps at half time (HeMem)",
    ),
    (
        "kv-zipf",
        "key-value store, 16 GiB, 4 KiB values, zipf 0.99, 50% updates (YCSB-A)",
    ),
    (
        "graph",
        "PageRank-like power-law graph, 16 GiB (vertices 1/4, edges streamed)",
    ),
    (
        "seq-window",
        "HMM-V sequential access: 16 GiB, 20% hot window moving every 60 s",
    ),
    (
        "file-cache",
        "12 GiB guest page cache read at boot plus 4 GiB anonymous data, 1.6 GiB hot",
    ),
    (
        "mix-hmmv4",
        "HMM-V's four-VM co-run: fotonik3d-like, graph500, redis, pagerank",
    ),
    (
        "bakeoff-gups",
        "the bake-off's GUPS: one thread, 96 MiB, 16 MiB hot, 1% of updates uniform, all on slow memory at the start",
    ),
    (
        "bakeoff-gups-move",
        "bakeoff-gups whose hot set jumps to the middle of the region at 90 s",
    ),
    (
        "bakeoff-kv",
        "the bake-off's redis: 64 MiB, 512 B values, zipf 0.99 (scrambled), 50% writes, one client",
    ),
];

/// The bake-off's GUPS rate inside the nested guest, about 1.1 M updates/s with its memory on
/// the emulated CXL nodes (docs/bakeoff.md): one thread with one access in flight and this
/// much compute per access puts the model's rate there (2 accesses per update, the cxl preset's
/// 288 ns slow-tier latency): 1 / (162 + 288 ns) = 2.2 M accesses/s.
const BAKEOFF_GUPS_CPU_NS: f64 = 162.0;
/// The bake-off's key-value load, about 1,000 operations/s in the nested guest (docs/bakeoff.md),
/// each a few memory accesses: one client, one request in flight.
const BAKEOFF_KV_CPU_NS: f64 = 100_000.0;

/// Suite run by `compare --suite` and scripts/gen-evaluation.sh.
pub const SUITE: &[&str] = &[
    "gups-hotset",
    "gups-hotset-move",
    "kv-zipf",
    "graph",
    "seq-window",
    "file-cache",
    "mix-hmmv4",
];

/// Builds a named scenario (one workload per VM). `scale` multiplies every footprint, `duration`
/// places the hot-set move of `gups-hotset-move`.
pub fn scenario(
    name: &str,
    scale: f64,
    duration: f64,
    seed: u64,
) -> anyhow::Result<Vec<VmWorkload>> {
    let sz = |gib: f64| ((gib * scale * GIB as f64) as u64).max(4 << 20);
    let vm = |name: &str, kind: Kind, gib: f64, conc: f64, cpu: f64, s: u64| VmWorkload {
        name: name.into(),
        kind,
        footprint_bytes: sz(gib),
        concurrency: conc,
        cpu_ns: cpu,
        vcpus: 8,
        seed: seed.wrapping_add(s),
        fast_weight: None,
    };
    let gups = |m| Kind::Gups {
        hot_bytes: sz(1.0),
        hot_frac: 0.9,
        move_at: m,
    };
    Ok(match name {
        "gups-hotset" => vec![vm("gups", gups(None), 14.0, 8.0, 5.0, 0)],
        "gups-hotset-move" => vec![vm("gups", gups(Some(duration / 2.0)), 14.0, 8.0, 5.0, 0)],
        "kv-zipf" => vec![vm(
            "kv",
            Kind::KvZipf {
                value_bytes: 4096,
                theta: 0.99,
                write_frac: 0.5,
            },
            16.0,
            8.0,
            100.0,
            0,
        )],
        "graph" => vec![vm(
            "graph",
            Kind::Graph {
                iteration_secs: 10.0,
                theta: 0.8,
            },
            16.0,
            8.0,
            20.0,
            0,
        )],
        "seq-window" => vec![vm(
            "seq",
            Kind::SeqWindow {
                hot_frac: 0.2,
                phase_secs: 60.0,
            },
            16.0,
            32.0,
            5.0,
            0,
        )],
        "file-cache" => vec![vm(
            "filecache",
            Kind::FileCache {
                file_frac: 0.75,
                hot_anon_frac: 0.1,
            },
            16.0,
            8.0,
            50.0,
            0,
        )],
        // HMM-V §5.9.1: four VMs; RSS 10 GB fotonik3d, 19 GB graph500, 32 GB redis (20% hot),
        // 19 GB pagerank (hot <= 1 GB at the top of its address space, modelled by a small hot set).
        // Every VM starts with the same DRAM (HMM-V: 8 GB each).
        "mix-hmmv4" => {
            let mut v = vec![
                vm(
                    "fotonik3d",
                    Kind::Uniform { write_frac: 0.3 },
                    10.0,
                    8.0,
                    5.0,
                    1,
                ),
                vm(
                    "graph500",
                    Kind::Graph {
                        iteration_secs: 10.0,
                        theta: 0.8,
                    },
                    19.0,
                    8.0,
                    20.0,
                    2,
                ),
                vm(
                    "redis",
                    Kind::Gups {
                        hot_bytes: sz(6.4),
                        hot_frac: 0.8,
                        move_at: None,
                    },
                    32.0,
                    8.0,
                    100.0,
                    3,
                ),
                vm(
                    "pagerank",
                    Kind::Gups {
                        hot_bytes: sz(1.0),
                        hot_frac: 0.9,
                        move_at: None,
                    },
                    19.0,
                    8.0,
                    20.0,
                    4,
                ),
            ];
            v.iter_mut().for_each(|w| w.fast_weight = Some(1.0));
            v
        }
        // The bake-off's workloads at their own sizes (`scale` 1 = the bake-off's); see
        // docs/bakeoff.md, "Cross-check with the simulator".
        "bakeoff-gups" | "bakeoff-gups-move" => {
            let mib = |m: f64| ((m * scale * (1u64 << 20) as f64) as u64).max(4 << 20);
            let gups = Kind::Gups {
                hot_bytes: mib(16.0),
                hot_frac: 0.99,
                move_at: (name == "bakeoff-gups-move").then_some(90.0),
            };
            vec![VmWorkload {
                name: "gups".into(),
                kind: Kind::StartsOnSlow(Box::new(gups)),
                footprint_bytes: mib(96.0),
                concurrency: 1.0,
                cpu_ns: BAKEOFF_GUPS_CPU_NS,
                vcpus: 1,
                seed,
                fast_weight: None,
            }]
        }
        "bakeoff-kv" => vec![VmWorkload {
            name: "redis".into(),
            kind: Kind::StartsOnSlow(Box::new(Kind::KvZipf {
                value_bytes: 512,
                theta: 0.99,
                write_frac: 0.5,
            })),
            footprint_bytes: ((64.0 * scale * (1u64 << 20) as f64) as u64).max(4 << 20),
            concurrency: 1.0,
            cpu_ns: BAKEOFF_KV_CPU_NS,
            vcpus: 1,
            seed,
            fast_weight: None,
        }],
        other => anyhow::bail!(
            "--workload: unknown workload {other:?}; one of: {}",
            WORKLOADS.iter().map(|w| w.0).collect::<Vec<_>>().join(", ")
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB2: u64 = 2 << 20;

    #[test]
    fn every_named_workload_builds_normalised_profiles() {
        for (name, _) in WORKLOADS {
            for w in scenario(name, 1.0 / 16.0, 60.0, 1).unwrap() {
                for t in [0.0, 31.0, 59.0] {
                    let p = w.profile(w.phase(t), MIB2);
                    let s: f64 = (0..p.units()).map(|i| p.share(i)).sum();
                    assert!((s - 1.0).abs() < 1e-3, "{name} sums to {s}");
                    assert_eq!(p.units(), w.units(MIB2));
                }
                assert_eq!(w.touch_order(MIB2).len(), w.units(MIB2));
            }
        }
        assert!(scenario("nope", 1.0, 1.0, 1)
            .unwrap_err()
            .to_string()
            .contains("--workload"));
    }

    #[test]
    fn gups_hot_set_gets_its_share_and_moves() {
        let w = &scenario("gups-hotset-move", 1.0, 100.0, 1).unwrap()[0];
        let before = w.profile(w.phase(10.0), MIB2);
        let after = w.profile(w.phase(60.0), MIB2);
        assert_ne!(before, after);
        // Hot units: 512 of 7168 (1 GiB of 14), carrying 90% + their uniform part.
        let mut s: Vec<f64> = (0..before.units()).map(|i| before.share(i)).collect();
        s.sort_by(|a, b| b.partial_cmp(a).unwrap());
        let top: f64 = s[..512].iter().sum();
        assert!((top - (0.9 + 0.1 * 512.0 / 7168.0)).abs() < 1e-3, "{top}");
    }

    #[test]
    fn bakeoff_gups_starts_with_its_hot_set_on_slow_memory() {
        let w = &scenario("bakeoff-gups-move", 1.0, 180.0, 1).unwrap()[0];
        const K4: u64 = 4096;
        assert!(w.starts_on_slow());
        assert!(!scenario("gups-hotset", 1.0, 240.0, 1).unwrap()[0].starts_on_slow());
        let before = w.profile(w.phase(10.0), K4);
        let after = w.profile(w.phase(100.0), K4);
        let hot = |p: &Profile, r: std::ops::Range<usize>| r.map(|i| p.share(i)).sum::<f64>();
        // 99% of the updates plus the hot set's part of the uniform 1%
        let want = 0.99 + 0.01 * 16.0 / 96.0;
        assert!((hot(&before, 0..4096) - want).abs() < 1e-3);
        assert!((hot(&after, 40 * 256..56 * 256) - want).abs() < 1e-3);
    }

    #[test]
    fn profiles_are_deterministic_per_seed() {
        let a = &scenario("kv-zipf", 1.0 / 16.0, 10.0, 7).unwrap()[0];
        let b = &scenario("kv-zipf", 1.0 / 16.0, 10.0, 7).unwrap()[0];
        let c = &scenario("kv-zipf", 1.0 / 16.0, 10.0, 8).unwrap()[0];
        assert_eq!(a.profile(0, MIB2), b.profile(0, MIB2));
        assert_ne!(a.profile(0, MIB2), c.profile(0, MIB2));
    }
}
