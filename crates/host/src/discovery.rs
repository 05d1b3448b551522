//! Finding VMs: QMP sockets under `discovery.scan_dirs` and in `[[vm]]` entries, queued (at
//! most `admission.max_pending_sockets` at once) to the greeter, which checks each peer and
//! waits for the greetings of all of them on one thread (`greeter`), then to a fixed number of
//! attach threads, one per peer process at a time (a monitor that greets and then stalls holds
//! one thread until its exchange deadline, and holds up no VM already managed); admitted only if
//! the peer is a QEMU process whose RAM claims hold (`admission`), and tried again after
//! `discovery.retry_backoff_ms` when that failed or the VM was not taken.

use crate::admission::{self, Counts, Refusal, RefusalLog, Rules};
use crate::config::Config;
use crate::greeter::{self, GreetSettings, Greeted, InFlight, NotGreeted};
use crate::process::ProcessIdentity;
use crate::qmp::Qmp;
use crate::vm::{self, VmInfo};
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};
use tracing::warn;

/// Most sockets considered per scan: a directory stuffed with sockets costs bounded work.
pub const MAX_CANDIDATES: usize = 4096;

/// A VM found on a socket: its monitor, connected, what it says about the VM, and the process
/// it was checked against.
pub struct Found {
    pub socket: PathBuf,
    pub qmp: Qmp,
    pub info: VmInfo,
    pub identity: ProcessIdentity,
}

enum Outcome {
    Found(Box<Found>),
    Refused(PathBuf, Refusal),
    Failed(PathBuf, anyhow::Error),
}

/// What an attach needs, fixed when the socket is queued.
#[derive(Clone)]
struct AttachSettings {
    command_timeout: Duration,
    exchange_timeout: Duration,
    max_reply: usize,
    rules: Rules,
}

impl GreetSettings for AttachSettings {
    fn rules(&self) -> &Rules {
        &self.rules
    }
    /// QEMU greets as it accepts: a greeting gets the time of one command.
    fn greeting_timeout(&self) -> Duration {
        self.command_timeout.min(self.exchange_timeout)
    }
}

type Job = (PathBuf, AttachSettings);
type Jobs = Arc<Mutex<mpsc::Receiver<Greeted<AttachSettings>>>>;

/// The greeter's queue, with the attach thread count and queue length it was made for.
struct Queue {
    tx: mpsc::SyncSender<Job>,
    threads: usize,
    pending: usize,
}

pub struct Discovery {
    /// Sockets that failed or were not taken, and when.
    backoff: HashMap<PathBuf, Instant>,
    /// Sockets queued or with an attach under way.
    attaching: HashSet<PathBuf>,
    last_scan: Option<Instant>,
    /// The attach threads' queue, and how many threads serve it.
    jobs: Option<Queue>,
    tx: mpsc::Sender<Outcome>,
    rx: mpsc::Receiver<Outcome>,
    log: RefusalLog,
    warned_dirs: HashSet<PathBuf>,
    /// Refusals, failures and deferrals since the start.
    pub counts: Counts,
}

impl Default for Discovery {
    fn default() -> Self {
        let (tx, rx) = mpsc::channel();
        Discovery {
            backoff: HashMap::new(),
            attaching: HashSet::new(),
            last_scan: None,
            jobs: None,
            tx,
            rx,
            log: RefusalLog::default(),
            warned_dirs: HashSet::new(),
            counts: Counts::default(),
        }
    }
}

impl Discovery {
    /// Queues each socket that is due (every `discovery.scan_interval_ms`), not managed
    /// already, not backing off and not queued; sockets named in `[[vm]]` entries first. A full
    /// queue or `admission.max_vms` leaves the rest for a later scan.
    pub fn scan(&mut self, cfg: &Config, rules: &Rules, managed: &HashSet<PathBuf>) {
        let interval = Duration::from_millis(cfg.discovery.scan_interval_ms);
        if self.last_scan.is_some_and(|t| t.elapsed() < interval) {
            return;
        }
        self.last_scan = Some(Instant::now());
        let backoff = Duration::from_millis(cfg.discovery.retry_backoff_ms);
        let (mut candidates, configured) =
            candidate_sockets(cfg, &mut self.warned_dirs, &mut self.counts);
        let present: HashSet<PathBuf> = candidates.iter().cloned().collect();
        self.backoff.retain(|p, _| present.contains(p));
        self.log.retain(&present);
        attach_order(&mut candidates, configured, &self.backoff);
        let a = &cfg.admission;
        let settings = AttachSettings {
            command_timeout: Duration::from_millis(cfg.discovery.qmp_timeout_ms),
            exchange_timeout: Duration::from_millis(a.qmp_exchange_timeout_ms),
            max_reply: usize::try_from(a.qmp_max_reply_kib << 10).unwrap_or(usize::MAX),
            rules: rules.clone(),
        };
        let queue = self.queue(a.attach_threads, a.max_pending_sockets);
        for sock in candidates {
            if self.attaching.len() >= a.max_pending_sockets {
                self.counts.deferred += 1;
                continue;
            }
            if managed.contains(&sock)
                || self.attaching.contains(&sock)
                || self
                    .backoff
                    .get(&sock)
                    .is_some_and(|t| t.elapsed() < backoff)
            {
                continue;
            }
            if managed.len() + self.attaching.len() >= a.max_vms {
                self.counts.deferred += 1;
                continue;
            }
            match queue.try_send((sock.clone(), settings.clone())) {
                Ok(()) => {
                    self.attaching.insert(sock);
                }
                Err(_) => self.counts.deferred += 1,
            }
        }
    }

    /// The greeter's queue, with the greeter and the attach threads started (again, if their
    /// number or the queue's length changed: the old threads finish their sockets and end).
    fn queue(&mut self, threads: usize, pending: usize) -> mpsc::SyncSender<Job> {
        if let Some(q) = self
            .jobs
            .as_ref()
            .filter(|q| (q.threads, q.pending) == (threads, pending))
        {
            return q.tx.clone();
        }
        let (q, jobs) = mpsc::sync_channel(pending);
        let (to_attach, greeted) = mpsc::channel();
        let greeted: Jobs = Arc::new(Mutex::new(greeted));
        let in_flight = InFlight::default();
        let (tx, flight) = (self.tx.clone(), in_flight.clone());
        let spawned = std::thread::Builder::new()
            .name("vtism-greeter".into())
            .spawn(move || greet_worker(&jobs, &to_attach, &tx, &flight));
        if let Err(e) = spawned {
            warn!(error = %e, "cannot start the greeter thread");
        }
        for _ in 0..threads {
            let (jobs, tx, flight) = (greeted.clone(), self.tx.clone(), in_flight.clone());
            let spawned = std::thread::Builder::new()
                .name("vtism-attach".into())
                .spawn(move || attach_worker(&jobs, &tx, &flight));
            if let Err(e) = spawned {
                warn!(error = %e, "cannot start an attach thread");
            }
        }
        self.jobs = Some(Queue {
            tx: q.clone(),
            threads,
            pending,
        });
        q
    }

    /// The attaches that finished. A socket that failed or was refused backs off (logged once
    /// per socket and reason, at a bounded rate, and counted); a VM found goes to the caller,
    /// which says with `taken` or `refused` what became of it.
    pub fn finished(&mut self) -> Vec<Found> {
        let mut out = Vec::new();
        while let Ok(o) = self.rx.try_recv() {
            match o {
                Outcome::Found(f) => {
                    self.attaching.remove(&f.socket);
                    out.push(*f);
                }
                Outcome::Refused(socket, r) => {
                    self.attaching.remove(&socket);
                    self.refuse(socket, &r);
                }
                Outcome::Failed(socket, e) => {
                    self.attaching.remove(&socket);
                    self.counts.failed += 1;
                    self.log.log(&socket, "attach_failed", &format!("{e:#}"));
                    self.backoff.insert(socket, Instant::now());
                }
            }
        }
        out
    }

    /// The VM on `socket` is managed now.
    pub fn taken(&mut self, socket: &Path) {
        self.backoff.remove(socket);
        self.log.forget(socket);
    }

    /// The VM on `socket` is refused (by admission, or by the daemon: an entry in use): counted,
    /// logged once per socket and reason at a bounded rate, tried again after the back-off.
    pub fn refuse(&mut self, socket: PathBuf, r: &Refusal) {
        *self.counts.refused.entry(r.label()).or_default() += 1;
        self.log.log(&socket, r.label(), &r.to_string());
        self.backoff.insert(socket, Instant::now());
    }

    /// The VM on `socket` is not managed (ignored, not listed, or refused): try again later.
    pub fn refused(&mut self, socket: PathBuf) {
        self.backoff.insert(socket, Instant::now());
    }

    /// A new configuration: every socket is tried again at once.
    pub fn restart(&mut self) {
        self.backoff.clear();
        self.last_scan = None;
    }

    /// Sockets queued or being attached.
    pub fn pending(&self) -> usize {
        self.attaching.len()
    }
}

/// The greeter (`greeter::run`), its sockets that did not greet reported as outcomes.
fn greet_worker(
    jobs: &mpsc::Receiver<Job>,
    to_attach: &mpsc::Sender<Greeted<AttachSettings>>,
    tx: &mpsc::Sender<Outcome>,
    in_flight: &InFlight,
) {
    let failed = |n| {
        let o = match n {
            NotGreeted::Refused(s, r) => Outcome::Refused(s, r),
            NotGreeted::Failed(s, e) => Outcome::Failed(s, e),
        };
        tx.send(o).is_ok()
    };
    greeter::run(jobs, to_attach, failed, in_flight);
}

fn attach_worker(jobs: &Jobs, tx: &mpsc::Sender<Outcome>, in_flight: &InFlight) {
    loop {
        let job = match jobs.lock() {
            Ok(rx) => rx.recv(),
            Err(_) => return,
        };
        let Ok(g) = job else {
            return; // the greeter ended: the queue was replaced or discovery dropped
        };
        let pid = g.identity.pid;
        let outcome = attach(g);
        in_flight.done(pid);
        if tx.send(outcome).is_err() {
            return;
        }
    }
}

/// From a socket whose peer was checked and greeted (`greeter`): inspects the VM within the
/// exchange deadline and checks its RAM claims against the process.
fn attach(g: Greeted<AttachSettings>) -> Outcome {
    let Greeted {
        socket,
        stream,
        identity,
        settings: s,
    } = g;
    let pid = identity.pid;
    let deadline = Instant::now() + s.exchange_timeout;
    let inspected = Qmp::handshake_until(stream, s.command_timeout, deadline, s.max_reply)
        .map_err(vm::InspectError::from)
        .and_then(|mut q| vm::inspect(&mut q).map(|i| (q, i)));
    let (mut qmp, mut info) = match inspected {
        Ok(x) => x,
        Err(e) if e.is_lie() => {
            return Outcome::Refused(socket, Refusal::MemoryMap { pid, source: e })
        }
        Err(e) => return Outcome::Failed(socket, e.into()),
    };
    qmp.end_exchange();
    if let Err(r) = s.rules.check_memory(&identity, &info) {
        return Outcome::Refused(socket, r);
    }
    vm::read_backing(&mut info, None);
    Outcome::Found(Box::new(Found {
        socket,
        qmp,
        info,
        identity,
    }))
}

/// The order sockets are queued in: the first `configured` (from `[[vm]]` entries) as they
/// are, then those never tried, then those that failed, longest ago first. A directory full of
/// sockets that never answer cannot keep a new VM's socket out of the queue for long.
fn attach_order(sockets: &mut [PathBuf], configured: usize, failed: &HashMap<PathBuf, Instant>) {
    let configured = configured.min(sockets.len());
    sockets[configured..].sort_by_key(|p| failed.get(p).copied());
}

/// Sockets named in `[[vm]]` entries (how many: the second value), then those found under the
/// scan directories the admission rules let be scanned; at most `MAX_CANDIDATES`.
fn candidate_sockets(
    cfg: &Config,
    warned: &mut HashSet<PathBuf>,
    counts: &mut Counts,
) -> (Vec<PathBuf>, usize) {
    let mut out: Vec<PathBuf> = cfg
        .vms
        .iter()
        .filter(|v| !v.ignore)
        .filter_map(|v| v.qmp_socket.clone())
        .collect();
    let mut scanned = Vec::new();
    for dir in &cfg.discovery.scan_dirs {
        let mut allow = |d: &Path| admission::scan_allowed(d, &cfg.admission, warned, counts);
        scan_dir(
            dir,
            2,
            cfg.discovery.scan_any_socket,
            &mut allow,
            &mut scanned,
        );
    }
    scanned.sort();
    let mut seen: HashSet<PathBuf> = HashSet::new();
    out.retain(|p| seen.insert(p.clone()));
    let configured = out.len();
    out.extend(scanned.into_iter().filter(|p| seen.insert(p.clone())));
    out.truncate(MAX_CANDIDATES);
    (out, configured.min(MAX_CANDIDATES))
}

/// Sockets under `dir` (up to `depth` levels) that look like QMP monitors for vtismd, in the
/// directories `allow` lets be scanned; no more than `MAX_CANDIDATES`.
pub fn scan_dir(
    dir: &Path,
    depth: u32,
    any: bool,
    allow: &mut dyn FnMut(&Path) -> bool,
    out: &mut Vec<PathBuf>,
) {
    use std::os::unix::fs::FileTypeExt;
    if !allow(dir) {
        return;
    }
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        if out.len() >= MAX_CANDIDATES {
            return;
        }
        let Ok(ft) = e.file_type() else { continue };
        let p = e.path();
        if ft.is_dir() && depth > 1 {
            scan_dir(&p, depth - 1, any, allow, out);
        } else if ft.is_socket() {
            let name = e.file_name().to_string_lossy().to_string();
            let wanted = name.ends_with(".qmp")
                || name.ends_with(".qmp.sock")
                || name == "vtism.sock"
                || name == "qmp.sock";
            // libvirt's own monitor is exclusive to libvirtd: never steal it.
            if name == "monitor.sock" {
                continue;
            }
            if wanted || any {
                out.push(p);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    #[test]
    fn sockets_never_tried_go_before_those_that_failed() {
        let p = |s: &str| PathBuf::from(s);
        let t0 = Instant::now();
        let failed: HashMap<PathBuf, Instant> = [
            (p("/q/a.qmp"), t0 + Duration::from_secs(2)),
            (p("/q/b.qmp"), t0),
            (p("/cfg.qmp"), t0),
        ]
        .into();
        let mut order = vec![p("/cfg.qmp"), p("/q/a.qmp"), p("/q/b.qmp"), p("/q/new.qmp")];
        attach_order(&mut order, 1, &failed);
        assert_eq!(
            order,
            [p("/cfg.qmp"), p("/q/new.qmp"), p("/q/b.qmp"), p("/q/a.qmp")]
        );
        attach_order(&mut order, 10, &failed);
        assert_eq!(order[0], p("/cfg.qmp"));
    }

    #[test]
    fn scan_finds_qmp_sockets_but_never_libvirts_monitor() {
        let d = std::env::temp_dir().join(format!("vtism-scan-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let dom = d.join("domain-3-web1");
        std::fs::create_dir_all(dom.join("deeper/still")).unwrap();
        let _l: Vec<UnixListener> = [
            d.join("a.qmp"),
            dom.join("monitor.sock"),
            dom.join("vtism.sock"),
            dom.join("other.sock"),
            dom.join("deeper/still/far.qmp"),
        ]
        .iter()
        .map(|p| UnixListener::bind(p).unwrap())
        .collect();
        std::fs::write(d.join("b.qmp"), b"not a socket").unwrap();
        let mut out = Vec::new();
        scan_dir(&d, 2, false, &mut |_| true, &mut out);
        out.sort();
        assert_eq!(out, vec![d.join("a.qmp"), dom.join("vtism.sock")]);
        let mut any = Vec::new();
        scan_dir(&d, 2, true, &mut |_| true, &mut any);
        assert!(any.contains(&dom.join("other.sock")));
        assert!(!any.contains(&dom.join("monitor.sock")));
        let mut none = Vec::new();
        scan_dir(&d.join("missing"), 2, true, &mut |_| true, &mut none);
        assert!(none.is_empty());
        let mut not_there = Vec::new();
        scan_dir(&d, 2, true, &mut |p| p != dom, &mut not_there);
        assert_eq!(
            not_there,
            vec![d.join("a.qmp")],
            "a refused directory is not entered"
        );
        let _ = std::fs::remove_dir_all(&d);
    }
}
