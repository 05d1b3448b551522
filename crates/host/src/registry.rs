//! The VMs vtismd manages, as QEMU shows them: identity (name, socket, pid), the QMP monitor,
//! guest RAM with its host addresses, the home node, the settings resolved from the
//! configuration; and, per VM, its QMP events, liveness and periodic re-read (hot-plug, reset,
//! vCPUs that moved). What a VM's watch finds is reported, never acted on here: the daemon lets
//! the VM go or registers it again with the tiering round.

use crate::config::VmSettings;
use crate::mtree::GuestMemory;
use crate::qmp::Qmp;
use crate::sys;
use crate::topology::HostTopology;
use crate::vm::{self, VmInfo};
use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::{debug, info};
use vtism_engine::{NodeId, VmId};

/// A managed VM, QEMU's side of it.
pub struct ManagedVm {
    pub id: VmId,
    pub name: String,
    pub socket: PathBuf,
    pub pid: i32,
    qmp: Qmp,
    /// Guest RAM with host addresses (shared with a plan in flight).
    pub memory: Arc<GuestMemory>,
    pub home: Option<NodeId>,
    /// A different home seen at the last refresh (moved only when seen twice in a row).
    home_candidate: Option<NodeId>,
    pub attached: Instant,
    last_refresh: Instant,
    pub settings: VmSettings,
}

/// What a VM's watch found.
pub enum Watch {
    Quiet,
    /// The VM went away (QMP closed, QEMU exited, a fatal QMP error): let it go.
    Gone(String),
    /// The re-read failed, not fatally; the next one tries again.
    RefreshFailed(anyhow::Error),
    /// Re-read from QEMU. `resync`: a reset or a device event (the guest's channel restarts);
    /// `reregister`: the memory map or home changed, or a resync, so the engine must relearn
    /// the VM.
    Refreshed {
        info: VmInfo,
        resync: bool,
        reregister: bool,
    },
}

#[derive(Default)]
pub struct Registry {
    vms: BTreeMap<VmId, ManagedVm>,
    next_id: u32,
    /// VMs let go since the start.
    pub dropped: u64,
}

impl Registry {
    /// The id the next VM will get.
    pub fn next_id(&self) -> VmId {
        VmId(self.next_id.max(1))
    }

    /// Starts keeping a VM found by discovery, under `next_id()`.
    pub fn insert(
        &mut self,
        name: String,
        socket: PathBuf,
        qmp: Qmp,
        info: VmInfo,
        home: Option<NodeId>,
        settings: VmSettings,
    ) -> VmId {
        let id = self.next_id();
        self.next_id = id.0 + 1;
        let now = Instant::now();
        self.vms.insert(
            id,
            ManagedVm {
                id,
                name,
                socket,
                pid: info.pid,
                qmp,
                memory: Arc::new(info.memory),
                home,
                home_candidate: None,
                attached: now,
                last_refresh: now,
                settings,
            },
        );
        id
    }

    pub fn remove(&mut self, id: VmId) -> Option<ManagedVm> {
        let v = self.vms.remove(&id);
        self.dropped += u64::from(v.is_some());
        v
    }

    pub fn get(&self, id: VmId) -> Option<&ManagedVm> {
        self.vms.get(&id)
    }

    pub fn get_mut(&mut self, id: VmId) -> Option<&mut ManagedVm> {
        self.vms.get_mut(&id)
    }

    pub fn iter(&self) -> impl Iterator<Item = &ManagedVm> {
        self.vms.values()
    }

    pub fn ids(&self) -> Vec<VmId> {
        self.vms.keys().copied().collect()
    }

    pub fn len(&self) -> usize {
        self.vms.len()
    }

    pub fn is_empty(&self) -> bool {
        self.vms.is_empty()
    }

    /// A VM of this QEMU process is managed already (a second monitor of it).
    pub fn has_pid(&self, pid: i32) -> bool {
        self.vms.values().any(|v| v.pid == pid)
    }

    pub fn sockets(&self) -> HashSet<PathBuf> {
        self.vms.values().map(|v| v.socket.clone()).collect()
    }

    /// One VM's QMP events and liveness, and its re-read when an event asks for one or
    /// `refresh_every` passed (`may_refresh`: not while a plan is in flight, whose moves use
    /// the old map).
    pub fn watch(
        &mut self,
        id: VmId,
        refresh_every: Duration,
        may_refresh: bool,
        topo: &HostTopology,
    ) -> Watch {
        let Some(v) = self.vms.get_mut(&id) else {
            return Watch::Quiet;
        };
        let mut resync = false;
        match v.qmp.poll_events() {
            Ok(events) => {
                for e in events {
                    debug!(vm = %v.name, event = %e.name, "QMP event");
                    resync |= matches!(
                        e.name.as_str(),
                        "RESET"
                            | "DEVICE_DELETED"
                            | "ACPI_DEVICE_OST"
                            | "MEMORY_DEVICE_SIZE_CHANGE"
                    );
                }
            }
            Err(e) => return Watch::Gone(format!("QMP: {e}")),
        }
        if !sys::process_alive(v.pid) {
            return Watch::Gone("QEMU process exited".into());
        }
        let periodic = v.last_refresh.elapsed() >= refresh_every && may_refresh;
        if !(resync || periodic) {
            return Watch::Quiet;
        }
        // Never wait for the mover here: a rate-limited plan can run for many rounds, and the
        // channels must keep being read meanwhile. A plan in flight keeps its own copy of the
        // old map; moves it makes on memory that went away fail per page, harmlessly.
        v.last_refresh = Instant::now();
        let info = match vm::inspect(&mut v.qmp) {
            Ok(i) => i,
            Err(e) => {
                let fatal = matches!(&e, vm::InspectError::Qmp(q) if q.is_fatal());
                let e = anyhow::Error::from(e);
                return if fatal {
                    Watch::Gone(format!("{e:#}"))
                } else {
                    Watch::RefreshFailed(e)
                };
            }
        };
        let changed = !info.memory.same_as(&v.memory);
        let home_moved = v.follow_home(&info, topo);
        if changed {
            info!(
                vm = %v.name, ram_mib = info.memory.bytes() >> 20, ranges = info.memory.ranges.len(),
                reset = resync, "memory map changed; re-registering"
            );
            v.memory = Arc::new(info.memory.clone());
        } else if resync || home_moved {
            info!(vm = %v.name, reset = resync, home = ?v.home.map(|h| h.0), "re-registering");
        }
        Watch::Refreshed {
            info,
            resync,
            reregister: changed || resync || home_moved,
        }
    }
}

impl ManagedVm {
    /// The home node follows the vCPU threads (unless the configuration names it); an answer
    /// that differs from the current home moves it only when the next refresh agrees, so vCPUs
    /// that merely wander for a moment do not make the engine relearn the VM. True if it moved.
    fn follow_home(&mut self, info: &VmInfo, topo: &HostTopology) -> bool {
        if self.settings.home_node.is_some() {
            return false;
        }
        let seen = vm::home_node(info.pid, &info.vcpu_threads, |c| topo.node_of_cpu(c))
            .filter(|h| topo.node(*h).is_some());
        if seen.is_none() || seen == self.home {
            self.home_candidate = None;
            return false;
        }
        if self.home_candidate != seen {
            self.home_candidate = seen;
            return false;
        }
        info!(vm = %self.name, from = ?self.home.map(|h| h.0), to = ?seen.map(|h| h.0), "home node changed (vCPU threads moved)");
        self.home = seen;
        self.home_candidate = None;
        true
    }
}
