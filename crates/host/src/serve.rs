//! The daemon's two small servers: `GET /metrics` over HTTP (`metrics_endpoint`; the text comes
//! from `metrics::Published`) and the control socket (a Unix socket, one request line, one JSON
//! answer).

use crate::metrics::Published;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What the main loop publishes for the servers to hand out.
pub type Shared = Arc<Published>;

/// Requests the control socket forwards to the main loop.
#[derive(Debug)]
pub enum CtlRequest {
    Reload(mpsc::Sender<Result<(), String>>),
}

pub use crate::metrics_endpoint::spawn_metrics;

/// Reads from `s` into `buf` until `done` says the request is whole, the buffer is full or
/// `deadline` passes, whichever comes first. Returns the bytes read.
fn read_until(
    s: &mut impl ReadTimeout,
    buf: &mut [u8],
    deadline: Instant,
    done: impl Fn(&[u8]) -> bool,
) -> usize {
    let mut n = 0;
    while n < buf.len() && !done(&buf[..n]) {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || s.set_timeout(left).is_err() {
            break;
        }
        match s.read(&mut buf[n..]) {
            Ok(0) | Err(_) => break,
            Ok(k) => n += k,
        }
    }
    n
}

/// Writes all of `data` unless `deadline` passes first.
fn write_within(s: &mut impl ReadTimeout, data: &[u8], deadline: Instant) {
    let mut at = 0;
    while at < data.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || s.set_write_timeout_to(left).is_err() {
            return;
        }
        match s.write(&data[at..]) {
            Ok(0) | Err(_) => return,
            Ok(k) => at += k,
        }
    }
}

/// The streams the control socket reads with a timeout.
trait ReadTimeout: Read + Write {
    fn set_timeout(&self, t: Duration) -> std::io::Result<()>;
    fn set_write_timeout_to(&self, t: Duration) -> std::io::Result<()>;
}

impl ReadTimeout for UnixStream {
    fn set_timeout(&self, t: Duration) -> std::io::Result<()> {
        self.set_read_timeout(Some(t))
    }
    fn set_write_timeout_to(&self, t: Duration) -> std::io::Result<()> {
        self.set_write_timeout(Some(t))
    }
}

/// Serves the control socket until `stop`. Requests: `status`, `metrics`, `reload`, `ping`.
pub fn spawn_control(
    path: &Path,
    shared: Shared,
    requests: mpsc::Sender<CtlRequest>,
    stop: Arc<AtomicBool>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    remove_stale_socket(path)?;
    let l = UnixListener::bind(path)?;
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660));
    }
    l.set_nonblocking(true)?;
    let owned: PathBuf = path.to_path_buf();
    std::thread::Builder::new()
        .name("vtism-control".into())
        .spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                match l.accept() {
                    Ok((s, _)) => handle_ctl(s, &shared, &requests),
                    Err(_) => std::thread::sleep(Duration::from_millis(50)),
                }
            }
            let _ = std::fs::remove_file(&owned);
        })
}

/// What may be at the control socket's path before vtismd binds it: nothing, or a stale socket
/// of its own user that nobody answers on (a vtismd that died), which is removed. Anything else
/// (a file, a directory, a live socket, another user's socket) is left alone and is an error.
fn remove_stale_socket(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    let refuse = |why: String| Err(std::io::Error::new(std::io::ErrorKind::AlreadyExists, why));
    if !meta.file_type().is_socket() {
        return refuse(format!(
            "{} exists and is not a socket; not removing it",
            path.display()
        ));
    }
    // SAFETY: geteuid has no failure mode.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != me {
        return refuse(format!(
            "{} is a socket of uid {}, not vtismd's (uid {me}); not removing it",
            path.display(),
            meta.uid()
        ));
    }
    if UnixStream::connect(path).is_ok() {
        return refuse(format!("{} is in use (another vtismd?)", path.display()));
    }
    std::fs::remove_file(path)
}

/// The time a control client has to send its request line, and to take the answer, each.
const CTL_DEADLINE: Duration = Duration::from_secs(2);

fn handle_ctl(mut s: UnixStream, shared: &Shared, requests: &mpsc::Sender<CtlRequest>) {
    let _ = s.set_nonblocking(false);
    let mut buf = [0u8; 4096];
    let n = read_until(&mut s, &mut buf, Instant::now() + CTL_DEADLINE, |b| {
        b.contains(&b'\n')
    });
    let line = String::from_utf8_lossy(&buf[..n]);
    let line = line.lines().next().unwrap_or("");
    // Accept `status` or `{"cmd":"status"}`.
    let cmd = serde_json::from_str::<serde_json::Value>(line.trim())
        .ok()
        .and_then(|v| v["cmd"].as_str().map(str::to_string))
        .unwrap_or_else(|| line.trim().to_string());
    let answer = match cmd.as_str() {
        "status" => shared.status_json(),
        "metrics" => serde_json::json!({ "metrics": shared.metrics_text() }),
        "ping" => serde_json::json!({ "ok": true }),
        "reload" => {
            let (tx, rx) = mpsc::channel();
            if requests.send(CtlRequest::Reload(tx)).is_err() {
                serde_json::json!({ "error": "daemon is stopping" })
            } else {
                match rx.recv_timeout(Duration::from_secs(10)) {
                    Ok(Ok(())) => serde_json::json!({ "ok": true }),
                    Ok(Err(e)) => serde_json::json!({ "error": e }),
                    Err(_) => serde_json::json!({ "error": "no answer from the main loop" }),
                }
            }
        }
        other => serde_json::json!({ "error": format!("unknown command `{other}`") }),
    };
    write_within(
        &mut s,
        format!("{answer}\n").as_bytes(),
        Instant::now() + CTL_DEADLINE,
    );
}

/// Client side: sends one request, returns the JSON answer.
pub fn ctl_request(path: &Path, cmd: &str) -> anyhow::Result<serde_json::Value> {
    use anyhow::Context;
    let mut s = UnixStream::connect(path)
        .with_context(|| format!("cannot connect to {} (is vtismd running?)", path.display()))?;
    s.set_read_timeout(Some(Duration::from_secs(15)))?;
    writeln!(s, "{cmd}")?;
    let mut out = String::new();
    BufReader::new(s).read_line(&mut out)?;
    let v: serde_json::Value =
        serde_json::from_str(out.trim()).context("bad answer from the control socket")?;
    if let Some(e) = v.get("error").and_then(|e| e.as_str()) {
        anyhow::bail!("vtismd: {e}");
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{MoverHistograms, Status};

    #[test]
    fn control_and_metrics_roundtrip() {
        let dir = std::env::temp_dir().join(format!("vtism-serve-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let sock = dir.join("ctl.sock");
        let shared: Shared = Arc::new(Published::new(&MoverHistograms::default()));
        shared.publish(Status::default());
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel();
        let h = spawn_control(&sock, shared.clone(), tx, stop.clone()).unwrap();
        let (hm, addr) = spawn_metrics("127.0.0.1:0", shared.clone(), stop.clone()).unwrap();
        assert_eq!(
            ctl_request(&sock, "status").unwrap()["vms"],
            serde_json::json!([])
        );
        assert!(ctl_request(&sock, "bogus").is_err());
        // Reload is answered by the main loop.
        let t = std::thread::spawn(move || {
            if let Ok(CtlRequest::Reload(ans)) = rx.recv() {
                ans.send(Err("bad field".into())).unwrap();
            }
        });
        let e = ctl_request(&sock, "{\"cmd\":\"reload\"}").unwrap_err();
        assert!(e.to_string().contains("bad field"));
        t.join().unwrap();
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        // The request head in two segments, as a slow client sends it.
        s.write_all(b"GET /metr").unwrap();
        s.flush().unwrap();
        std::thread::sleep(Duration::from_millis(30));
        s.write_all(b"ics HTTP/1.0\r\n\r\n").unwrap();
        let mut body = String::new();
        s.read_to_string(&mut body).unwrap();
        assert!(body.starts_with("HTTP/1.1 200 OK"), "{body}");
        assert!(body.contains("\r\n\r\n# HELP "), "{body}");
        assert!(body.ends_with(&shared.metrics_text()), "{body}");
        stop.store(true, Ordering::SeqCst);
        h.join().unwrap();
        hm.join().unwrap();
        assert!(!sock.exists(), "socket removed on stop");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The control socket's path is never cleared unless it holds vtismd's own stale socket.
    #[test]
    fn only_a_stale_socket_of_ours_is_replaced() {
        use std::os::unix::fs::MetadataExt;
        let dir = std::env::temp_dir().join(format!("vtism-serve-stale-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let shared: Shared = Arc::new(Published::new(&MoverHistograms::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let spawn = |p: &Path| {
            let (tx, _rx) = mpsc::channel();
            spawn_control(p, shared.clone(), tx, stop.clone())
        };
        let file = dir.join("file.sock");
        std::fs::write(&file, "precious").unwrap();
        let e = spawn(&file).unwrap_err();
        assert!(e.to_string().contains("not a socket"), "{e}");
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "precious");
        std::fs::create_dir(dir.join("dir.sock")).unwrap();
        assert!(spawn(&dir.join("dir.sock")).is_err());
        assert!(dir.join("dir.sock").is_dir());

        // A live socket is someone's: refused. A stale one of ours: replaced.
        let live = dir.join("live.sock");
        let _l = UnixListener::bind(&live).unwrap();
        assert!(spawn(&live).unwrap_err().to_string().contains("in use"));
        let stale = dir.join("stale.sock");
        drop(UnixListener::bind(&stale).unwrap());
        let h = spawn(&stale).unwrap();
        assert!(ctl_request(&stale, "ping").is_ok());
        // Another user's stale socket (needs root to make one).
        let theirs = dir.join("theirs.sock");
        drop(UnixListener::bind(&theirs).unwrap());
        let c = std::ffi::CString::new(theirs.to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path.
        if unsafe { libc::lchown(c.as_ptr(), 4242, 4242) } == 0 {
            assert!(spawn(&theirs).unwrap_err().to_string().contains("uid 4242"));
            assert_eq!(std::fs::symlink_metadata(&theirs).unwrap().uid(), 4242);
        }
        stop.store(true, Ordering::SeqCst);
        h.join().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }
}
