//! Finding VMs: QMP sockets under `discovery.scan_dirs` and in `[[vm]]` entries, connected and
//! inspected in background threads (a monitor that never answers holds up no other VM), and
//! tried again after `discovery.retry_backoff_ms` when that failed or the VM was not taken.

use crate::config::Config;
use crate::qmp::Qmp;
use crate::vm::{self, VmInfo};
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use tracing::warn;

/// A VM found on a socket: its monitor, connected, and what it says about the VM.
pub struct Found {
    pub socket: PathBuf,
    pub qmp: Qmp,
    pub info: VmInfo,
}

type Attached = (PathBuf, anyhow::Result<(Qmp, VmInfo)>);

pub struct Discovery {
    /// Sockets that failed or were not taken, and when.
    backoff: HashMap<PathBuf, Instant>,
    /// Sockets with an attach thread under way.
    attaching: HashSet<PathBuf>,
    last_scan: Option<Instant>,
    tx: mpsc::Sender<Attached>,
    rx: mpsc::Receiver<Attached>,
    /// Attaches that failed, since the start.
    pub errors: u64,
}

impl Default for Discovery {
    fn default() -> Self {
        let (tx, rx) = mpsc::channel();
        Discovery {
            backoff: HashMap::new(),
            attaching: HashSet::new(),
            last_scan: None,
            tx,
            rx,
            errors: 0,
        }
    }
}

impl Discovery {
    /// Starts an attach thread for each socket that is due (every `discovery.scan_interval_ms`),
    /// not managed already, not backing off and not being attached.
    pub fn scan(&mut self, cfg: &Config, managed: &HashSet<PathBuf>) {
        let interval = Duration::from_millis(cfg.discovery.scan_interval_ms);
        if self.last_scan.is_some_and(|t| t.elapsed() < interval) {
            return;
        }
        self.last_scan = Some(Instant::now());
        let backoff = Duration::from_millis(cfg.discovery.retry_backoff_ms);
        let timeout = Duration::from_millis(cfg.discovery.qmp_timeout_ms);
        for sock in candidate_sockets(cfg) {
            if managed.contains(&sock)
                || self.attaching.contains(&sock)
                || self
                    .backoff
                    .get(&sock)
                    .is_some_and(|t| t.elapsed() < backoff)
            {
                continue;
            }
            self.attaching.insert(sock.clone());
            let tx = self.tx.clone();
            let spawned = std::thread::Builder::new()
                .name("vtism-attach".into())
                .spawn(move || {
                    let r = Qmp::connect(&sock, timeout)
                        .map_err(anyhow::Error::from)
                        .and_then(|mut q| {
                            let info = vm::inspect(&mut q)?;
                            Ok((q, info))
                        });
                    let _ = tx.send((sock, r));
                });
            if let Err(e) = spawned {
                warn!(error = %e, "cannot start an attach thread");
            }
        }
    }

    /// The attaches that finished. A socket that failed backs off (and is logged); a VM found
    /// goes to the caller, which says with `taken` or `refused` what became of it.
    pub fn finished(&mut self) -> Vec<Found> {
        let mut out = Vec::new();
        while let Ok((socket, r)) = self.rx.try_recv() {
            self.attaching.remove(&socket);
            match r {
                Ok((qmp, info)) => out.push(Found { socket, qmp, info }),
                Err(e) => {
                    self.errors += 1;
                    warn!(socket = %socket.display(), error = %format!("{e:#}"), "cannot attach VM; will retry");
                    self.backoff.insert(socket, Instant::now());
                }
            }
        }
        out
    }

    /// The VM on `socket` is managed now.
    pub fn taken(&mut self, socket: &Path) {
        self.backoff.remove(socket);
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
}

/// Sockets named in `[[vm]]` entries and found under the scan directories.
fn candidate_sockets(cfg: &Config) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = cfg
        .vms
        .iter()
        .filter(|v| !v.ignore)
        .filter_map(|v| v.qmp_socket.clone())
        .collect();
    for dir in &cfg.discovery.scan_dirs {
        scan_dir(dir, 2, cfg.discovery.scan_any_socket, &mut out);
    }
    out.sort();
    out.dedup();
    out
}

/// Sockets under `dir` (up to `depth` levels) that look like QMP monitors for vtismd.
pub fn scan_dir(dir: &Path, depth: u32, any: bool, out: &mut Vec<PathBuf>) {
    use std::os::unix::fs::FileTypeExt;
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let Ok(ft) = e.file_type() else { continue };
        let p = e.path();
        if ft.is_dir() && depth > 1 {
            scan_dir(&p, depth - 1, any, out);
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
        scan_dir(&d, 2, false, &mut out);
        out.sort();
        assert_eq!(out, vec![d.join("a.qmp"), dom.join("vtism.sock")]);
        let mut any = Vec::new();
        scan_dir(&d, 2, true, &mut any);
        assert!(any.contains(&dom.join("other.sock")));
        assert!(!any.contains(&dom.join("monitor.sock")));
        let mut none = Vec::new();
        scan_dir(&d.join("missing"), 2, true, &mut none);
        assert!(none.is_empty());
        let _ = std::fs::remove_dir_all(&d);
    }
}
