//! The first step of attaching to a socket, for many sockets at once on one thread: connect,
//! check the peer before a word of QMP (`admission::Rules::check_peer`), and wait for QEMU's
//! greeting with poll(2). QEMU greets as soon as it accepts, so a socket whose listener never
//! greets costs this thread a descriptor until `discovery.qmp_timeout_ms`, never an attach
//! thread (issue 24: 100 silent sockets, and one more a second, kept a real VM unattached for
//! 150 s while each held an attach thread in turn). A socket that greeted goes on to the attach
//! threads, at most one per peer process at a time, so one process's many sockets cannot take
//! them all.

use crate::admission::{Refusal, Rules};
use crate::process::ProcessIdentity;
use crate::sys;
use std::collections::HashSet;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// Sockets waiting for a greeting at once; more wait in the queue.
pub const MAX_WAITING: usize = 1024;

/// How long the greeter waits on its sockets at most before taking new ones.
const TICK: Duration = Duration::from_millis(50);

/// A socket whose peer passed the checks and greeted: the attach thread goes on from here.
pub struct Greeted<S> {
    pub socket: PathBuf,
    pub stream: UnixStream,
    pub identity: ProcessIdentity,
    pub settings: S,
}

/// What became of a socket before its greeting.
pub enum NotGreeted {
    Refused(PathBuf, Refusal),
    Failed(PathBuf, anyhow::Error),
}

/// The peer processes with an attach under way: one at a time each. The attach thread removes
/// its peer when done (`InFlight::done`).
#[derive(Clone, Default)]
pub struct InFlight(Arc<Mutex<HashSet<i32>>>);

impl InFlight {
    fn claim(&self, pid: i32) -> bool {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).insert(pid)
    }

    pub fn done(&self, pid: i32) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&pid);
    }
}

/// What the greeter needs of each socket's settings.
pub trait GreetSettings: Send + 'static {
    fn rules(&self) -> &Rules;
    fn greeting_timeout(&self) -> Duration;
}

struct Waiting<S> {
    greeted: Greeted<S>,
    deadline: Instant,
}

/// Runs until `jobs` is closed and every socket it gave has an outcome: greeted sockets go to
/// `greeted`, the others to `failed` (which says false when no one listens any more).
pub fn run<S: GreetSettings>(
    jobs: &mpsc::Receiver<(PathBuf, S)>,
    greeted: &mpsc::Sender<Greeted<S>>,
    mut failed: impl FnMut(NotGreeted) -> bool,
    in_flight: &InFlight,
) {
    let mut waiting: Vec<Waiting<S>> = Vec::new();
    let mut open = true;
    while open || !waiting.is_empty() {
        // New sockets: block for one only while nothing else waits (an idle greeter sleeps).
        while open && waiting.len() < MAX_WAITING {
            let job = if waiting.is_empty() {
                jobs.recv().map_err(|_| mpsc::TryRecvError::Disconnected)
            } else {
                jobs.try_recv()
            };
            match job {
                Ok((socket, settings)) => match start(socket, settings) {
                    Ok(w) => waiting.push(w),
                    Err(n) => {
                        if !failed(n) {
                            return;
                        }
                    }
                },
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => open = false,
            }
        }
        if waiting.is_empty() {
            continue;
        }
        let ready = match wait_readable(&waiting) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "greeter: poll failed");
                std::thread::sleep(TICK);
                continue;
            }
        };
        let now = Instant::now();
        let mut still = Vec::with_capacity(waiting.len());
        for (w, ready) in waiting.into_iter().zip(ready) {
            let pid = w.greeted.identity.pid;
            let listened = if ready && in_flight.claim(pid) {
                greeted.send(w.greeted).is_ok()
            } else if ready {
                let why = anyhow::anyhow!("another socket of QEMU pid {pid} is being attached");
                failed(NotGreeted::Failed(w.greeted.socket, why))
            } else if now >= w.deadline {
                let t = w.greeted.settings.greeting_timeout();
                let why = anyhow::anyhow!("no QMP greeting within {t:?}");
                failed(NotGreeted::Failed(w.greeted.socket, why))
            } else {
                still.push(w);
                true
            };
            if !listened {
                return;
            }
        }
        waiting = still;
    }
}

/// Connects and checks the peer; the socket then waits for its greeting.
fn start<S: GreetSettings>(socket: PathBuf, settings: S) -> Result<Waiting<S>, NotGreeted> {
    let failed = |socket, e: std::io::Error, what: &str| {
        NotGreeted::Failed(socket, anyhow::Error::from(e).context(what.to_owned()))
    };
    let stream = match sys::connect_unix_now(&socket) {
        Ok(s) => s,
        Err(e) => return Err(failed(socket, e, "connect")),
    };
    let (pid, uid) = match sys::peer_cred(&stream) {
        Ok(c) => c,
        Err(e) => return Err(failed(socket, e, "SO_PEERCRED")),
    };
    let identity = match settings.rules().check_peer(pid, uid) {
        Ok(i) => i,
        Err(r) => return Err(NotGreeted::Refused(socket, r)),
    };
    Ok(Waiting {
        deadline: Instant::now() + settings.greeting_timeout(),
        greeted: Greeted {
            socket,
            stream,
            identity,
            settings,
        },
    })
}

/// Which of the waiting sockets have something to read (or hung up), waiting at most until the
/// first deadline or `TICK`.
fn wait_readable<S>(waiting: &[Waiting<S>]) -> std::io::Result<Vec<bool>> {
    let now = Instant::now();
    let first = waiting.iter().map(|w| w.deadline).min().unwrap_or(now);
    let timeout = first.saturating_duration_since(now).min(TICK);
    let mut fds: Vec<libc::pollfd> = waiting
        .iter()
        .map(|w| libc::pollfd {
            fd: w.greeted.stream.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    sys::poll(&mut fds, timeout)?;
    Ok(fds.iter().map(|p| p.revents != 0).collect())
}
