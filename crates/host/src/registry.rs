//! The VMs vtismd manages, as QEMU shows them: identity (name, socket, pid), the QMP monitor,
//! guest RAM with its host addresses, the home node, the settings resolved from the
//! configuration; and, per VM, its QMP events, liveness and periodic re-read (hot-plug, reset,
//! vCPUs that moved). The re-read runs on a thread of its own under the exchange deadline, so a
//! slow monitor delays only its own VM; what it reads is checked against the QEMU process as at
//! admission. What a VM's watch finds is reported, never acted on here: the daemon lets the VM
//! go or registers it again with the tiering round.

use crate::admission::Rules;
use crate::backing::{self, RangeBacking};
use crate::config::{Config, VmSettings};
use crate::mtree::GuestMemory;
use crate::process::ProcessIdentity;
use crate::qmp::{Qmp, QmpError};
use crate::sys;
use crate::topology::HostTopology;
use crate::vm::{self, VmInfo};
use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};
use vtism_engine::{NodeId, VmId};
use vtism_proto::{Gfn, Hva, FRAME_SIZE};

/// A managed VM, QEMU's side of it.
pub struct ManagedVm {
    pub id: VmId,
    pub name: String,
    pub socket: PathBuf,
    pub pid: i32,
    /// The QEMU process as admitted: a pid that now names another process is not this VM.
    pub identity: ProcessIdentity,
    /// The monitor; away on the refresh thread while a re-read runs.
    qmp: Option<Qmp>,
    refresh: Option<mpsc::Receiver<Refreshing>>,
    /// A re-read that finished while a plan was in flight, waiting for the plan to end.
    refreshed: Option<anyhow::Result<VmInfo>>,
    /// Guest RAM with host addresses (shared with a plan in flight).
    pub memory: Arc<GuestMemory>,
    /// How the host backs the guest RAM, as of the last (re-)read, or why it is not known.
    pub backing: Result<Vec<RangeBacking>, String>,
    /// Host folios the engine was last told to place whole (`Daemon::place_folios`).
    pub folios: u64,
    /// Frames the engine was last told not to plan (`Daemon::place_folios`).
    pub pinned_frames: u64,
    /// THPs to split at the next re-read, each by a cold page of it (`Daemon::split_folios`).
    pub split_queue: Vec<Hva>,
    /// THPs split at the engine's request, in all.
    pub folio_splits: u64,
    /// Heads of the blocks split, and whether a re-read has seen them split since.
    pub split_heads: BTreeMap<Gfn, bool>,
    /// Split blocks seen mapped huge again (khugepaged collapsed them).
    pub folio_recollapses: u64,
    pub home: Option<NodeId>,
    /// A different home seen at every refresh since the instant given (`follow_home`).
    home_candidate: Option<(NodeId, Instant)>,
    pub attached: Instant,
    last_refresh: Instant,
    /// A reset or device event seen, its re-read not started yet (`resync_min_interval_ms`).
    resync_wanted: bool,
    /// When the last re-read for such events started.
    last_resync: Option<Instant>,
    /// A reset or device event seen when the refresh under way started.
    resync_pending: bool,
    /// RESET events seen, and re-reads done for reset or device events (several events
    /// within `resync_min_interval_ms` make one).
    pub resets: u64,
    pub resyncs: u64,
    /// Re-reads that found a different memory map (hot-plug), re-registering the VM.
    pub memory_map_changes: u64,
    /// Re-reads in a row the monitor did not answer in time.
    slow_refreshes: u32,
    pub settings: VmSettings,
}

/// A monitor that misses this many re-reads in a row is let go: one that misses fewer is busy
/// (a loaded host, a QEMU main loop held up), not dead, and the VM keeps what it had.
pub const SLOW_REFRESHES_MAX: u32 = 3;

/// What a VM's watch found.
pub enum Watch {
    Quiet,
    /// The VM went away (QMP closed, QEMU exited, a fatal QMP error): let it go.
    Gone(String),
    /// The re-read failed, not fatally; the next one tries again.
    RefreshFailed(anyhow::Error),
    /// Re-read from QEMU. `resync`: after a reset or a device event (the guest's channel
    /// restarts, and what the guest touched before is forgotten); `reregister`: the memory map
    /// changed, so the engine must relearn the VM; `rehomed`: only its home node changed (the
    /// engine keeps what it learnt).
    Refreshed {
        info: Box<VmInfo>,
        resync: bool,
        reregister: bool,
        rehomed: bool,
    },
}

/// What a refresh thread hands back: the monitor, and what it read or why it could not.
type Refreshing = (Qmp, Result<VmInfo, RefreshError>);

enum RefreshError {
    /// The monitor is unusable (closed, garbled, lying): the VM goes.
    Fatal(String),
    /// The monitor did not answer within the exchange's deadline; a late answer is skipped by
    /// its id, so the connection stays usable.
    Slow(QmpError),
    Failed(anyhow::Error),
}

#[derive(Default)]
pub struct Registry {
    vms: BTreeMap<VmId, ManagedVm>,
    next_id: u32,
    /// VMs let go since the start.
    pub dropped: u64,
    /// VMs let go because a refresh found QEMU lying about its memory.
    pub dropped_lying: u64,
    /// Re-reads a monitor did not answer in time.
    pub slow_refreshes: u64,
}

impl Registry {
    /// Guest RAM of the managed VMs, together, leaving out `except`.
    pub fn ram_bytes(&self, except: Option<VmId>) -> u64 {
        self.vms
            .values()
            .filter(|v| Some(v.id) != except)
            .map(|v| v.memory.bytes())
            .sum()
    }

    /// The id the next VM will get.
    pub fn next_id(&self) -> VmId {
        VmId(self.next_id.max(1))
    }

    /// Starts keeping a VM found by discovery, under `next_id()`.
    #[allow(clippy::too_many_arguments)]
    pub fn insert(
        &mut self,
        name: String,
        socket: PathBuf,
        qmp: Qmp,
        info: VmInfo,
        identity: ProcessIdentity,
        home: Option<NodeId>,
        settings: VmSettings,
    ) -> VmId {
        let id = self.next_id();
        self.next_id = id.0 + 1;
        let now = Instant::now();
        log_backing(&name, None, &info.backing);
        self.vms.insert(
            id,
            ManagedVm {
                id,
                name,
                socket,
                pid: info.pid,
                identity,
                qmp: Some(qmp),
                refresh: None,
                refreshed: None,
                backing: info.backing,
                folios: 0,
                pinned_frames: 0,
                split_queue: Vec::new(),
                folio_splits: 0,
                split_heads: BTreeMap::new(),
                folio_recollapses: 0,
                memory: Arc::new(info.memory),
                home,
                home_candidate: None,
                attached: now,
                last_refresh: now,
                resync_wanted: false,
                last_resync: None,
                resync_pending: false,
                resets: 0,
                resyncs: 0,
                memory_map_changes: 0,
                slow_refreshes: 0,
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
    /// `discovery.refresh_interval_ms` passed. The re-read runs on its own thread; its result is
    /// taken in a later watch, and applied only when `may_refresh` (not while a plan is in
    /// flight, whose moves use the old map).
    pub fn watch(
        &mut self,
        id: VmId,
        cfg: &Config,
        may_refresh: bool,
        topo: &HostTopology,
        rules: &Rules,
    ) -> Watch {
        let Some(v) = self.vms.get_mut(&id) else {
            return Watch::Quiet;
        };
        // Every round: a QEMU that exec'd another program is let go now, not at the next
        // re-read (issue 24: a python3 had 687,934 page moves issued against it meanwhile).
        if let Err(c) = v.identity.check() {
            return Watch::Gone(c.to_string());
        }
        if let Some(rx) = &v.refresh {
            match rx.try_recv() {
                Err(mpsc::TryRecvError::Empty) => return Watch::Quiet,
                Err(mpsc::TryRecvError::Disconnected) => {
                    return Watch::Gone("the refresh thread ended without an answer".into())
                }
                Ok((qmp, r)) => {
                    v.refresh = None;
                    v.qmp = Some(qmp);
                    if !matches!(r, Err(RefreshError::Slow(_))) {
                        v.slow_refreshes = 0;
                    }
                    match r {
                        Ok(info) => v.refreshed = Some(Ok(info)),
                        Err(RefreshError::Failed(e)) => return Watch::RefreshFailed(e),
                        Err(RefreshError::Slow(q)) => {
                            self.slow_refreshes += 1;
                            v.slow_refreshes += 1;
                            if v.slow_refreshes >= SLOW_REFRESHES_MAX {
                                return Watch::Gone(format!(
                                    "QMP: {q} in {} re-reads in a row",
                                    v.slow_refreshes
                                ));
                            }
                            return Watch::RefreshFailed(anyhow::anyhow!(
                                "QMP: {q} ({} of {SLOW_REFRESHES_MAX} re-reads in a row); kept",
                                v.slow_refreshes
                            ));
                        }
                        Err(RefreshError::Fatal(why)) => {
                            if why.starts_with(LIE) {
                                self.dropped_lying += 1;
                            }
                            return Watch::Gone(why);
                        }
                    }
                }
            }
        }
        let Some(qmp) = v.qmp.as_mut() else {
            return Watch::Gone("no monitor".into());
        };
        match qmp.poll_events() {
            Ok(events) => {
                for e in events {
                    debug!(vm = %v.name, event = %e.name, "QMP event");
                    v.resets += u64::from(e.name == "RESET");
                    v.resync_wanted |= matches!(
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
        if let Some(done) = v.refreshed.take() {
            if !may_refresh {
                v.refreshed = Some(done);
                return Watch::Quiet;
            }
            return match done {
                Ok(info) => v.apply_refresh(info, topo),
                Err(e) => Watch::RefreshFailed(e),
            };
        }
        let now = Instant::now();
        let refresh_every = Duration::from_millis(cfg.discovery.refresh_interval_ms);
        let resync_every = Duration::from_millis(cfg.discovery.resync_min_interval_ms);
        let periodic = now.duration_since(v.last_refresh) >= refresh_every && may_refresh;
        // A guest resetting in a loop gets one re-read per `resync_every`, whatever it sends.
        let resync_due = v.resync_wanted
            && v.last_resync
                .is_none_or(|t| now.duration_since(t) >= resync_every);
        if resync_due || periodic {
            // Never wait for the mover here: a rate-limited plan can run for many rounds, and
            // the channels must keep being read meanwhile. A plan in flight keeps its own copy
            // of the old map; moves it makes on memory that went away fail per page, harmlessly.
            let resync = std::mem::take(&mut v.resync_wanted);
            if resync {
                v.last_resync = Some(now);
            }
            v.last_refresh = now;
            v.start_refresh(cfg, rules.clone(), resync);
        }
        Watch::Quiet
    }
}

/// Says what the host backs a VM's guest RAM with when it is first known and when that changes
/// in kind (hugetlbfs, THPs where or not where, or an error), not at every re-read: khugepaged
/// changes THP bytes all the time.
fn log_backing(
    vm: &str,
    was: Option<&Result<Vec<RangeBacking>, String>>,
    now: &Result<Vec<RangeBacking>, String>,
) {
    let kind = |b: &Result<Vec<RangeBacking>, String>| match b {
        Ok(r) => {
            let s = backing::summarize(r);
            Ok((s.hugetlb_page_bytes, s.thp_bytes > 0, s.blocks_known))
        }
        Err(e) => Err(e.clone()),
    };
    if was.map(kind) == Some(kind(now)) {
        return;
    }
    match now {
        Ok(r) => {
            let s = backing::summarize(r);
            info!(
                vm,
                ram_mib = s.ram_bytes >> 20,
                hugetlb_mib = s.hugetlb_bytes >> 20,
                hugetlb_page_kib = s.hugetlb_page_bytes >> 10,
                thp_mib = s.thp_bytes >> 20,
                huge_blocks = s.huge_blocks,
                blocks_known = s.blocks_known,
                "guest RAM backing"
            );
        }
        Err(e) => warn!(vm, error = %e, "guest RAM backing not known"),
    }
}

/// Follows the blocks vtismd split (`split_heads`: head, seen split since) through a backing
/// read that finds `heads` (sorted) mapped huge: a block seen split is marked so; one mapped huge
/// again after that was collapsed again and is forgotten, as is one still huge at the first read
/// after its split (the kernel declined it). Returns the blocks collapsed again.
pub fn follow_splits(split_heads: &mut BTreeMap<Gfn, bool>, heads: &[Gfn]) -> u64 {
    let mut again = 0;
    split_heads.retain(|head, seen_split| {
        let huge = heads.binary_search(head).is_ok();
        if !huge {
            *seen_split = true;
        } else if *seen_split {
            again += 1;
        }
        !huge
    });
    again
}

/// Splits THPs of process `pid`, each by MADV_COLD on one of its 4 KiB pages: the kernel splits
/// a PMD-mapped THP that an advice covers only in part (mm/madvise.c,
/// madvise_cold_or_pageout_pte_range, Linux 6.1 and 6.12, anonymous and shmem alike), and the
/// page advised is one the guest did not name hot. The other 511 stay where they are.
fn split_thps(vm: &str, pid: i32, pages: &[Hva]) {
    if pages.is_empty() {
        return;
    }
    let ranges: Vec<(Hva, u64)> = pages.iter().map(|&a| (a, FRAME_SIZE)).collect();
    match sys::pidfd_open(pid).and_then(|fd| sys::madvise_cold(&fd, &ranges)) {
        Ok(_) => debug!(vm, folios = pages.len(), "host folios split"),
        Err(e) => warn!(vm, error = %e, folios = pages.len(), "host folios not split"),
    }
}

/// How a refresh that found QEMU lying about its memory is reported.
const LIE: &str = "QEMU lies about its memory";

impl ManagedVm {
    /// Hands the monitor to a refresh thread. A reset or device event seen now is kept for
    /// when the result comes back.
    fn start_refresh(&mut self, cfg: &Config, rules: Rules, resync: bool) {
        let Some(mut qmp) = self.qmp.take() else {
            return;
        };
        let budget = Duration::from_millis(cfg.admission.qmp_exchange_timeout_ms);
        let identity = self.identity;
        let last = self.backing.as_ref().ok().cloned();
        let splits = std::mem::take(&mut self.split_queue);
        let name = self.name.clone();
        let (tx, rx) = mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name("vtism-refresh".into())
            .spawn(move || {
                qmp.begin_exchange(budget);
                let r = vm::inspect(&mut qmp);
                qmp.end_exchange();
                // A QEMU that exec'd another program keeps its pid and start time: its
                // executable is checked again, as at admission.
                let r = match (r, rules.check_peer(identity.pid, qmp.uid)) {
                    (Ok(_), Err(e)) => Err(RefreshError::Fatal(format!(
                        "the QEMU process changed: {e}"
                    ))),
                    (Ok(mut info), Ok(_)) => match rules.check_memory(&identity, &info) {
                        Ok(()) => {
                            // Before the read, so that it sees the folios split.
                            split_thps(&name, identity.pid, &splits);
                            vm::read_backing(&mut info, last.as_deref());
                            Ok(info)
                        }
                        Err(e) => Err(RefreshError::Fatal(format!("{LIE}: {e}"))),
                    },
                    (Err(e), _) if e.is_lie() => Err(RefreshError::Fatal(format!("{LIE}: {e}"))),
                    (Err(vm::InspectError::Qmp(q @ QmpError::Timeout)), _) => {
                        Err(RefreshError::Slow(q))
                    }
                    (Err(vm::InspectError::Qmp(q)), _) if q.is_fatal() => {
                        Err(RefreshError::Fatal(format!("QMP: {q}")))
                    }
                    (Err(e), _) => Err(RefreshError::Failed(e.into())),
                };
                let _ = tx.send((qmp, r));
            });
        match spawned {
            Ok(_) => {
                self.refresh = Some(rx);
                self.resync_pending |= resync;
            }
            Err(e) => {
                // The closure (and the monitor in it) is gone with the failed spawn.
                self.refreshed = Some(Err(anyhow::anyhow!("cannot start a refresh thread: {e}")));
            }
        }
    }

    /// A re-read that came back, compared with what the VM had.
    fn apply_refresh(&mut self, info: VmInfo, topo: &HostTopology) -> Watch {
        let resync = std::mem::take(&mut self.resync_pending);
        self.resyncs += u64::from(resync);
        let changed = !info.memory.same_as(&self.memory);
        log_backing(&self.name, Some(&self.backing), &info.backing);
        self.backing = info.backing.clone();
        let home_moved = self.follow_home(&info, topo);
        if changed {
            self.memory_map_changes += 1;
            info!(
                vm = %self.name, ram_mib = info.memory.bytes() >> 20, ranges = info.memory.ranges.len(),
                reset = resync, "memory map changed; re-registering"
            );
            self.memory = Arc::new(info.memory.clone());
        } else if resync {
            info!(vm = %self.name, resyncs = self.resyncs, resets = self.resets, "guest reset or device event: channel restarted, hotness forgotten, placement kept");
        }
        Watch::Refreshed {
            info: Box::new(info),
            resync,
            reregister: changed,
            rehomed: home_moved,
        }
    }

    /// The home node follows the vCPU threads (unless the configuration names it). Threads
    /// pinned to a new node move it when the next refresh agrees; threads the scheduler merely
    /// ran elsewhere move it only once every refresh for `WANDERING_HOME_SETTLE` has agreed, since
    /// a new home brings the VM's fast memory along: an unpinned VM the scheduler moves between
    /// sockets every minute would otherwise carry its DRAM across each time (the testbed's did,
    /// 18 MiB a minute). True if it moved.
    fn follow_home(&mut self, info: &VmInfo, topo: &HostTopology) -> bool {
        if self.settings.home_node.is_some() {
            return false;
        }
        let seen = vm::home_node_and_basis(info.pid, &info.vcpu_threads, |c| topo.node_of_cpu(c))
            .filter(|(h, _)| topo.node(*h).is_some());
        let now = Instant::now();
        let Some(moved) = next_home(self.home, &mut self.home_candidate, seen, now) else {
            return false;
        };
        info!(vm = %self.name, from = ?self.home.map(|h| h.0), to = moved.0, "home node changed (vCPU threads moved)");
        self.home = Some(moved);
        true
    }
}

/// How long an unpinned VM's vCPU threads must keep to a new node before it is their home.
pub const WANDERING_HOME_SETTLE: Duration = Duration::from_secs(300);

/// The home after a refresh that found `seen`: a pinned one when two refreshes in a row agree, a
/// wandering one when every refresh for `WANDERING_HOME_SETTLE` has; `None` while it stays.
fn next_home(
    home: Option<NodeId>,
    candidate: &mut Option<(NodeId, Instant)>,
    seen: Option<(NodeId, vm::HomeBasis)>,
    now: Instant,
) -> Option<NodeId> {
    let Some((node, basis)) = seen.filter(|(n, _)| Some(*n) != home) else {
        *candidate = None;
        return None;
    };
    let since = match *candidate {
        Some((c, since)) if c == node => since,
        _ => {
            *candidate = Some((node, now));
            return None;
        }
    };
    let settled = match basis {
        vm::HomeBasis::Confined => true,
        vm::HomeBasis::LastRan => now.duration_since(since) >= WANDERING_HOME_SETTLE,
    };
    if settled {
        *candidate = None;
        Some(node)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mtree::MappedRange;

    #[test]
    fn a_pinned_home_moves_at_once_a_wandering_one_once_it_has_settled() {
        use vm::HomeBasis::{Confined, LastRan};
        let t0 = Instant::now();
        let (n0, n1) = (NodeId(0), NodeId(1));
        let mut c = None;
        // Pinned to node 1: the second refresh that agrees moves the home.
        assert_eq!(next_home(Some(n0), &mut c, Some((n1, Confined)), t0), None);
        assert_eq!(
            next_home(
                Some(n0),
                &mut c,
                Some((n1, Confined)),
                t0 + Duration::from_secs(10)
            ),
            Some(n1)
        );
        // Last ran on node 1: not for a minute, nor after a refresh back on node 0.
        let mut c = None;
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert_eq!(
            next_home(Some(n0), &mut c, Some((n1, LastRan)), at(0)),
            None
        );
        assert_eq!(
            next_home(Some(n0), &mut c, Some((n1, LastRan)), at(60)),
            None
        );
        assert_eq!(
            next_home(Some(n0), &mut c, Some((n0, LastRan)), at(70)),
            None
        );
        assert_eq!(c, None, "back home: the count starts over");
        assert_eq!(
            next_home(Some(n0), &mut c, Some((n1, LastRan)), at(80)),
            None
        );
        assert_eq!(
            next_home(Some(n0), &mut c, Some((n1, LastRan)), at(370)),
            None
        );
        assert_eq!(
            next_home(Some(n0), &mut c, Some((n1, LastRan)), at(380)),
            Some(n1),
            "five minutes on node 1"
        );
        // No answer (threads unreadable) keeps the home and forgets the candidate.
        let mut c = Some((n1, t0));
        assert_eq!(next_home(Some(n0), &mut c, None, at(400)), None);
        assert_eq!(c, None);
    }

    /// A split block seen split, then huge again, counts once; one the kernel never split is
    /// forgotten without counting.
    #[test]
    fn splits_followed_through_backing_reads() {
        let mut split: BTreeMap<Gfn, bool> = [(Gfn(512), false), (Gfn(1024), false)].into();
        // The read after the splits: 512 split, 1024 still huge (declined).
        assert_eq!(follow_splits(&mut split, &[Gfn(0), Gfn(1024)]), 0);
        assert_eq!(split, [(Gfn(512), true)].into());
        assert_eq!(follow_splits(&mut split, &[Gfn(0)]), 0);
        // khugepaged collapses 512 again.
        assert_eq!(follow_splits(&mut split, &[Gfn(0), Gfn(512)]), 1);
        assert!(split.is_empty());
    }
    use std::io::{BufRead, BufReader, Write};
    use std::os::unix::net::UnixStream;
    use std::path::Path;
    use vtism_proto::{Gfn, GfnRange, Hva};

    /// A monitor that greets, accepts capabilities and then says nothing.
    fn quiet_monitor() -> Qmp {
        let (client, server) = UnixStream::pair().unwrap();
        std::thread::spawn(move || {
            let mut r = BufReader::new(server.try_clone().unwrap());
            let mut w = server;
            let _ = writeln!(
                w,
                r#"{{"QMP": {{"version": {{"qemu": {{"micro": 0, "minor": 2, "major": 7}}}}, "capabilities": []}}}}"#
            );
            let mut line = String::new();
            while r.read_line(&mut line).unwrap_or(0) > 0 {
                let id = serde_json::from_str::<serde_json::Value>(&line).unwrap()["id"].clone();
                let _ = writeln!(w, "{}", serde_json::json!({"return": {}, "id": id}));
                line.clear();
            }
        });
        Qmp::from_stream(client, Duration::from_secs(2)).unwrap()
    }

    #[test]
    fn a_pid_that_names_another_process_drops_the_vm() {
        let cfg = Config::default();
        let sysfs = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/sysfs/emuhost-3node/sys");
        let topo = HostTopology::read(&sysfs, &cfg.topology).unwrap();
        let me = ProcessIdentity::of(std::process::id() as i32).unwrap();
        let memory = GuestMemory::new(vec![MappedRange {
            gfns: GfnRange::new(Gfn(0), Gfn(16)),
            hva: Hva(0x7000_0000_0000),
            name: "m".into(),
        }])
        .unwrap();
        let info = |pid| VmInfo {
            name: "vm".into(),
            pid,
            uid: 0,
            qemu_version: (7, 2, 0),
            status: "running".into(),
            memory: memory.clone(),
            ivshmem: Vec::new(),
            vcpu_threads: Vec::new(),
            backing: Err("not read".into()),
        };
        let mut reg = Registry::default();
        let settings = cfg.vm_settings("vm", Path::new("/x.qmp"), memory.bytes());
        let same = reg.insert(
            "same".into(),
            "/a.qmp".into(),
            quiet_monitor(),
            info(me.pid),
            me,
            None,
            settings.clone(),
        );
        // The process under this pid started at another time: not the QEMU admitted.
        let reused = ProcessIdentity {
            start_ticks: me.start_ticks + 1,
            ..me
        };
        let other = reg.insert(
            "reused".into(),
            "/b.qmp".into(),
            quiet_monitor(),
            info(me.pid),
            reused,
            None,
            settings,
        );
        let rules = Rules::new(&cfg.admission, 1 << 30, String::new);
        assert!(matches!(
            reg.watch(same, &cfg, true, &topo, &rules),
            Watch::Quiet
        ));
        match reg.watch(other, &cfg, true, &topo, &rules) {
            Watch::Gone(why) => assert!(why.contains("pid"), "{why}"),
            _ => panic!("a reused pid was not noticed"),
        }
    }
}
