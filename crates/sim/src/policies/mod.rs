//! The policies the simulator compares. Peers implement `vtism_engine::Policy` here with their own
//! state, fed by the tracking mechanism each one really uses (see `mechanism`), and move whole
//! placement units. Every parameter is the published one (peers.md and the seeds); assumptions are
//! listed in docs/evaluation.md.

mod autotiering;
mod daemon_round;
mod hemem;
mod hmmv;
mod memtis;
mod memtis_split;
mod oracle;
mod tpp;

use crate::mechanism::{HintFaultScanner, NoTracker, OracleFeed, PebsSampler, PmlScanner, Tracker};
use crate::sim::{MoveMode, PolicyRun, Setup, Static, FAST, SLOW};
use vtism_engine::{
    EngineError, FrameAccess, IngestStats, Move, MoveKind, NodeId, Phase, RoundLimits, VmId,
    VmSpec, VtismPolicy,
};
use vtism_proto::{Gfn, PageType};

pub use autotiering::AutoTiering;
pub use daemon_round::DaemonRound;
pub use hemem::HeMem;
pub use hmmv::HmmV;
pub use memtis::Memtis;
pub use oracle::Oracle;
pub use tpp::{Tpp, TppMode};

/// Policy names, in table order, with a one-line description.
pub const POLICIES: &[(&str, &str)] = &[
    (
        "all-fast",
        "everything in fast memory: the upper bound (1.0 by definition)",
    ),
    (
        "oracle",
        "knows the next 10 s of accesses, pays migration costs: a mover's practical bound",
    ),
    (
        "vtism",
        "vtism as shipped: the guest module's tracker, vtismd's round every second within its move limits",
    ),
    (
        "vtism-island",
        "vtism, fixed per-VM quotas through the pool in island mode (several VMs)",
    ),
    (
        "vtism-pool",
        "vtism with the fast-memory pool: quotas follow hot sets within 75%..125% (several VMs)",
    ),
    (
        "static",
        "first-touch, no migration (Linux default, HMM-V's NUMA_B)",
    ),
    (
        "tpp",
        "Linux NUMA balancing tiering mode (numa_balancing=2) with TPP's demotion watermark",
    ),
    (
        "autonuma",
        "NUMA balancing for locality: promotes into free fast memory only, never demotes",
    ),
    (
        "hmmv",
        "HMM-V: PML-limited guest page-table scans, multi-level queue, bucket sort, pool",
    ),
    (
        "autotiering",
        "AutoTiering OPM-BD: 8-bit fault histories, LAP lists, background demotion",
    ),
    (
        "memtis",
        "Memtis: PEBS histogram, adaptive hot threshold, cooling, kmigrated every 500 ms",
    ),
    (
        "hemem",
        "HeMem: PEBS at 19,997, fixed thresholds 4/4, cooling at 10, policy every 10 ms",
    ),
];

pub fn names() -> Vec<&'static str> {
    POLICIES.iter().map(|p| p.0).collect()
}

/// Variants run only when named, for one comparison each: never rows of the default suite.
pub const VARIANTS: &[(&str, &str)] = &[(
    "vtism-no-split",
    "vtism whose folio split requests are never carried out (--host-pages thp): the split rule's baseline",
)];

/// A policy or a variant `build` knows.
pub fn known(name: &str) -> bool {
    POLICIES.iter().chain(VARIANTS).any(|p| p.0 == name)
}

/// Policies that only differ from `vtism` when several VMs share fast memory.
pub const MULTI_VM_ONLY: &[&str] = &["vtism-island", "vtism-pool"];

/// Builds a named policy with its trackers for the VMs of `setup`.
pub fn build(name: &str, setup: &Setup<'_>) -> anyhow::Result<PolicyRun> {
    let cfg = setup.cfg;
    let fpu = cfg.fpu();
    let per_vm = |f: &dyn Fn(usize) -> Box<dyn Tracker>| -> Vec<Box<dyn Tracker>> {
        (0..setup.specs.len()).map(f).collect()
    };
    let run = |name: &str,
               policy: Box<dyn crate::sim::SimPolicy>,
               trackers: Vec<Box<dyn Tracker>>,
               pm: MoveMode,
               dm: MoveMode| PolicyRun {
        name: name.to_string(),
        policy,
        trackers,
        promote_mode: pm,
        demote_mode: dm,
        mover_speedup: 1.0,
        all_fast: false,
    };
    // vtism's engine and its guest tracker, as the plain and the pooled variants run them.
    let vtism_engine = || {
        VtismPolicy::new(setup.topology.clone(), cfg.engine.clone())
            .map_err(|e| anyhow::anyhow!("{e}"))
    };
    let guest_scanner = |i: usize| -> Box<dyn Tracker> {
        Box::new(crate::window_tracker::WindowTracker::new(
            setup.units[i],
            cfg.unit_bytes,
            crate::window_tracker::WindowParams::default(),
            crate::window_tracker::seed_of(cfg.seed, i),
        ))
    };
    use MoveMode::*;
    Ok(match name {
        "all-fast" | "static" => {
            let mut r = run(
                name,
                Box::new(Static {
                    name: if name == "static" {
                        "static"
                    } else {
                        "all-fast"
                    },
                }),
                per_vm(&|_| Box::new(NoTracker)),
                Unmap,
                Unmap,
            );
            r.all_fast = name == "all-fast";
            r
        }
        // vtismd's round at its cadence and limits: every VM at its own quota (island mode),
        // or quotas following hot sets (pool mode).
        "vtism" | "vtism-island" | "vtism-pool" | "vtism-no-split" => {
            let fast: u64 = setup.specs.iter().map(|s| s.fast_quota_bytes).sum();
            let (label, mode) = match name {
                "vtism" => ("vtism", vtism_engine::PoolMode::Island),
                "vtism-pool" => ("vtism-pool", vtism_engine::PoolMode::Pool),
                "vtism-no-split" => ("vtism-no-split", vtism_engine::PoolMode::Island),
                _ => ("vtism-island", vtism_engine::PoolMode::Island),
            };
            let mut round =
                DaemonRound::new(label, vtism_engine()?, mode, fast, RoundLimits::DEFAULT)?;
            if name == "vtism-no-split" {
                round = round.never_split();
            }
            run(name, Box::new(round), per_vm(&guest_scanner), Unmap, Unmap)
        }
        "oracle" => run(
            name,
            Box::new(Oracle::new(setup)),
            per_vm(&|_| Box::new(OracleFeed::new())),
            Unmap,
            Unmap,
        ),
        "tpp" | "autonuma" => {
            let mode = if name == "tpp" {
                TppMode::Tiering
            } else {
                TppMode::Locality
            };
            run(
                name,
                Box::new(Tpp::new(mode, fpu)),
                per_vm(&|i| Box::new(HintFaultScanner::new(setup.units[i]))),
                Sync,
                Unmap,
            )
        }
        "autotiering" => run(
            name,
            Box::new(AutoTiering::new(fpu)),
            per_vm(&|i| Box::new(HintFaultScanner::new(setup.units[i]))),
            Sync,
            Unmap,
        ),
        "hmmv" => {
            let mut r = run(
                name,
                Box::new(HmmV::new(fpu, setup)),
                per_vm(&|i| Box::new(PmlScanner::new(setup.units[i]))),
                Pml,
                Pml,
            );
            // Published: PML-based migration about 2x Linux migration speed.
            r.mover_speedup = 2.0;
            r
        }
        "memtis" => run(
            name,
            Box::new(Memtis::new(
                fpu,
                cfg.model.fast.read_ns,
                cfg.model.slow.read_ns,
            )),
            per_vm(&|i| {
                Box::new(PebsSampler::new(
                    199.0,
                    100_003.0,
                    Some(0.03),
                    cfg.seed ^ ((i as u64 + 1) * 0x9e37),
                ))
            }),
            Unmap,
            Unmap,
        ),
        "hemem" => run(
            name,
            Box::new(HeMem::new(fpu)),
            per_vm(&|i| {
                Box::new(PebsSampler::new(
                    19_997.0,
                    19_997.0,
                    None,
                    cfg.seed ^ ((i as u64 + 1) * 0x5851),
                ))
            }),
            WriteProtect,
            WriteProtect,
        ),
        other => anyhow::bail!(
            "--policy: unknown policy {other:?}; one of: {}",
            names().join(", ")
        ),
    })
}

/// What a peer knows about one VM's placement, per unit.
pub(crate) struct VmBook {
    pub id: VmId,
    pub units: usize,
    pub fpu: u64,
    pub quota_units: usize,
    pub fast: Vec<bool>,
    pub fast_units: usize,
    pub ptype: Vec<PageType>,
}

impl VmBook {
    pub fn new(spec: &VmSpec, fpu: u64) -> VmBook {
        let units = (spec.ram.frames() / fpu) as usize;
        VmBook {
            id: spec.id,
            units,
            fpu,
            quota_units: (spec.fast_quota_bytes / (fpu * vtism_proto::FRAME_SIZE)) as usize,
            fast: vec![false; units],
            fast_units: 0,
            ptype: vec![PageType::Anon; units],
        }
    }
    pub fn unit(&self, gfn: Gfn) -> Option<usize> {
        let u = (gfn.0 / self.fpu) as usize;
        (u < self.units).then_some(u)
    }
    pub fn free_units(&self) -> usize {
        self.quota_units.saturating_sub(self.fast_units)
    }
    pub fn place(
        &mut self,
        gfn: Gfn,
        frames: u64,
        node: Option<NodeId>,
    ) -> Result<(), EngineError> {
        let u0 = (gfn.0 / self.fpu) as usize;
        let u1 = ((gfn.0 + frames).div_ceil(self.fpu) as usize).min(self.units);
        if u0 >= self.units {
            return Err(EngineError::OutOfMap {
                vm: self.id,
                gfn,
                frames,
            });
        }
        for u in u0..u1 {
            let f = node == Some(FAST);
            if self.fast[u] != f {
                self.fast[u] = f;
                if f {
                    self.fast_units += 1
                } else {
                    self.fast_units -= 1
                }
            }
        }
        Ok(())
    }
    /// A move of units `u..u + n`, all on one tier, to the other; updates the book.
    pub fn mv_units(&mut self, u: usize, n: usize, kind: MoveKind, phase: Phase) -> Move {
        let mut m = self.mv(u, kind, phase);
        for x in u + 1..u + n {
            self.mv(x, kind, phase);
        }
        m.frames = n as u64 * self.fpu;
        m
    }
    /// A move of unit `u` to the other tier; updates the book.
    pub fn mv(&mut self, u: usize, kind: MoveKind, phase: Phase) -> Move {
        let to_fast = !self.fast[u];
        self.fast[u] = to_fast;
        if to_fast {
            self.fast_units += 1
        } else {
            self.fast_units -= 1
        }
        Move {
            vm: self.id,
            gfn: Gfn(u as u64 * self.fpu),
            frames: self.fpu,
            from: if to_fast { SLOW } else { FAST },
            to: if to_fast { FAST } else { SLOW },
            kind,
            phase,
        }
    }
}

/// Resolves each access to its unit and counts it (entries, applied, and ignored for frames
/// outside the VM); `f` handles each access that hit a unit.
pub(crate) fn each_unit(
    b: &mut VmBook,
    acc: &[FrameAccess],
    mut f: impl FnMut(&mut VmBook, usize, &FrameAccess),
) -> IngestStats {
    let mut st = IngestStats::default();
    for a in acc {
        st.entries += 1;
        let Some(u) = b.unit(a.gfn) else {
            st.ignored += 1;
            continue;
        };
        st.applied += 1;
        f(b, u, a);
    }
    st
}

/// Finds a VM's book by id.
pub(crate) fn book_pos(books: &[VmBook], vm: VmId) -> Result<usize, EngineError> {
    books
        .iter()
        .position(|b| b.id == vm)
        .ok_or(EngineError::UnknownVm(vm))
}

/// Implements the bookkeeping methods of `Policy` for a peer with a `books: Vec<VmBook>` field and
/// an `add(&mut self, &VmSpec)` hook for its own per-VM state.
macro_rules! peer_common {
    () => {
        fn add_vm(&mut self, spec: vtism_engine::VmSpec) -> Result<(), vtism_engine::EngineError> {
            if self.books.iter().any(|b| b.id == spec.id) {
                return Err(vtism_engine::EngineError::DuplicateVm(spec.id));
            }
            self.add(&spec);
            self.books
                .push(crate::policies::VmBook::new(&spec, self.fpu));
            Ok(())
        }
        fn remove_vm(&mut self, vm: vtism_engine::VmId) -> Result<(), vtism_engine::EngineError> {
            let p = crate::policies::book_pos(&self.books, vm)?;
            self.books.remove(p);
            self.remove(p);
            Ok(())
        }
        fn set_quota(
            &mut self,
            vm: vtism_engine::VmId,
            bytes: u64,
        ) -> Result<(), vtism_engine::EngineError> {
            let p = crate::policies::book_pos(&self.books, vm)?;
            let b = &mut self.books[p];
            b.quota_units = (bytes / (b.fpu * vtism_proto::FRAME_SIZE)) as usize;
            Ok(())
        }
        fn set_placement(
            &mut self,
            vm: vtism_engine::VmId,
            gfn: vtism_proto::Gfn,
            frames: u64,
            node: Option<vtism_engine::NodeId>,
        ) -> Result<(), vtism_engine::EngineError> {
            let p = crate::policies::book_pos(&self.books, vm)?;
            self.books[p].place(gfn, frames, node)
        }
    };
}
pub(crate) use peer_common;

#[cfg(test)]
pub(crate) mod testutil {
    use vtism_engine::{FrameAccess, Nanos, Observation, Plan, PlanContext, Policy, VmId, VmSpec};
    use vtism_proto::{Gfn, PageType, RamMap};

    pub const VM: VmId = VmId(1);

    /// A VM of `units` 2 MiB units, `quota` of them fast; units `0..fast` start fast.
    pub fn setup(p: &mut dyn Policy, units: u64, quota: u64, fast: u64) {
        p.add_vm(VmSpec {
            id: VM,
            ram: RamMap::contiguous(units * 512),
            fast_quota_bytes: quota * (2 << 20),
            home_node: None,
        })
        .unwrap();
        p.set_placement(VM, Gfn(0), units * 512, Some(super::SLOW))
            .unwrap();
        if fast > 0 {
            p.set_placement(VM, Gfn(0), fast * 512, Some(super::FAST))
                .unwrap();
        }
    }

    pub fn acc(unit: u64, reads: u32, writes: u32) -> FrameAccess {
        FrameAccess {
            gfn: Gfn(unit * 512),
            reads,
            writes,
            page_type: PageType::Anon,
        }
    }

    pub fn feed(p: &mut dyn Policy, a: &[FrameAccess], t: f64) {
        p.observe(VM, Observation::Accesses(a), Nanos((t * 1e9) as u64))
            .unwrap();
    }

    pub fn plan(p: &mut dyn Policy, t: f64) -> Plan {
        p.plan(&PlanContext::default(), Nanos((t * 1e9) as u64))
    }

    /// (promoted units, demoted units) of a plan.
    pub fn moved(pl: &Plan) -> (Vec<u64>, Vec<u64>) {
        let mut p = Vec::new();
        let mut d = Vec::new();
        for m in &pl.moves {
            if m.to == super::FAST {
                p.push(m.gfn.0 / 512)
            } else {
                d.push(m.gfn.0 / 512)
            }
        }
        (p, d)
    }
}
