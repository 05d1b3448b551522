//! Where each VM's pages really are. The kernel moves pages too (NUMA balancing, reclaim and
//! demotion), so each VM's RAM is queried with move_pages(2) (no move) once per
//! `mover.reconcile_sweep_s`, a slice every round, and hinted frames whose node the engine does
//! not know yet are looked up as they are hinted. The answers are placement facts for the
//! tiering round, which tells the engine what differs from its belief.

use crate::config::MoverConfig;
use crate::registry::ManagedVm;
use crate::sys;
use crate::topology::HostTopology;
use std::collections::BTreeMap;
use tracing::debug;
use vtism_engine::{NodeId, PlacementRun, Tiering, VmId};
use vtism_proto::{Gfn, HintEntry, Hva};

/// Frames asked in one move_pages call.
const QUERY_FRAMES: usize = 65536;

/// How far a VM's sweep got.
#[derive(Clone, Copy, Debug, Default)]
struct Sweep {
    /// Dense index where the next query starts.
    cursor: u64,
    /// Completed passes over the VM's RAM.
    full_sweeps: u64,
}

#[derive(Default)]
pub struct Reconcile {
    by_vm: BTreeMap<VmId, Sweep>,
}

impl Reconcile {
    /// The VM's placement must be learned again from the start (new VM, new memory map, new
    /// engine): the first sweep runs at full speed.
    pub fn restart(&mut self, vm: VmId) {
        self.by_vm.insert(vm, Sweep::default());
    }

    pub fn remove(&mut self, vm: VmId) {
        self.by_vm.remove(&vm);
    }

    pub fn full_sweeps(&self, vm: VmId) -> u64 {
        self.by_vm.get(&vm).map_or(0, |s| s.full_sweeps)
    }

    /// This round's slice of the VM's RAM: `reconcile_max_pages_per_round` at most, enough to
    /// cover the RAM once per sweep period (`interval_ms` per round). Until the first sweep
    /// completes the engine cannot plan for frames of unknown placement, so that one runs at 16
    /// GiB per round.
    pub fn sweep(
        &mut self,
        tiering: &mut Tiering,
        vm: &ManagedVm,
        topo: &HostTopology,
        cfg: &MoverConfig,
        interval_ms: u64,
    ) {
        let ram = &vm.memory.ram;
        let total = ram.frames();
        if total == 0 {
            return;
        }
        let s = self.by_vm.entry(vm.id).or_default();
        let (sweep_ms, cap) = (
            cfg.reconcile_sweep_s * 1000,
            cfg.reconcile_max_pages_per_round,
        );
        let budget = if s.full_sweeps == 0 {
            cap.max(1 << 22)
        } else {
            (total.saturating_mul(interval_ms) / sweep_ms + 1).min(cap)
        };
        let mut left = budget.min(total);
        while left > 0 {
            let start = s.cursor % total;
            let n = left.min(total - start).min(QUERY_FRAMES as u64);
            let gfns: Vec<Gfn> = (start..start + n).filter_map(|i| ram.gfn_at(i)).collect();
            match query(vm, &gfns, topo) {
                Ok(facts) => {
                    tiering.learn(facts);
                }
                Err(e) => {
                    debug!(vm = %vm.name, error = %e, "placement query failed");
                    break;
                }
            }
            s.cursor = (start + n) % total;
            if s.cursor == 0 {
                s.full_sweeps += 1;
            }
            left -= n;
        }
    }
}

/// Hinted frames whose node the engine does not know yet (first touched after the last sweep)
/// are looked up now, so they can be planned this round rather than after the next sweep.
pub fn learn_hinted(
    tiering: &mut Tiering,
    vm: &ManagedVm,
    entries: &[HintEntry],
    topo: &HostTopology,
) {
    let mut gfns = Vec::new();
    'entries: for e in entries {
        for i in 0..e.frames() {
            let g = Gfn(e.gfn().0 + i);
            if matches!(tiering.engine().frame_node(vm.id, g), Ok(None)) {
                gfns.push(g);
                if gfns.len() >= QUERY_FRAMES {
                    break 'entries;
                }
            }
        }
    }
    if gfns.is_empty() {
        return;
    }
    match query(vm, &gfns, topo) {
        Ok(facts) => {
            tiering.learn(facts);
        }
        Err(e) => debug!(vm = %vm.name, error = %e, "placement query of hinted frames failed"),
    }
}

/// Where `gfns` are in QEMU's memory, one fact per frame with a host address: a node of the
/// topology, or `None` (not present, or a node vtismd does not use).
fn query(vm: &ManagedVm, gfns: &[Gfn], topo: &HostTopology) -> std::io::Result<Vec<PlacementRun>> {
    let (gfns, addrs): (Vec<Gfn>, Vec<Hva>) = gfns
        .iter()
        .filter_map(|&g| vm.memory.hva(g).map(|a| (g, a)))
        .unzip();
    let mut status = vec![0i32; addrs.len()];
    sys::move_pages(vm.pid, &addrs, None, &mut status, 0)?;
    Ok(gfns
        .iter()
        .zip(status)
        .map(|(&g, st)| {
            let node = u8::try_from(st)
                .ok()
                .map(NodeId)
                .filter(|n| topo.node(*n).is_some());
            PlacementRun::frame(vm.id, g, node)
        })
        .collect())
}
