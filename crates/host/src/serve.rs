//! The daemon's two small servers: `GET /metrics` over HTTP (one endpoint on std::net; the text
//! comes from `metrics::Published`) and the control socket (a Unix socket, one request line, one
//! JSON answer).

use crate::metrics::{Published, CONTENT_TYPE};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

/// What the main loop publishes for the servers to hand out.
pub type Shared = Arc<Published>;

/// Requests the control socket forwards to the main loop.
#[derive(Debug)]
pub enum CtlRequest {
    Reload(mpsc::Sender<Result<(), String>>),
}

/// Serves `GET /metrics` until `stop`.
pub fn spawn_metrics(
    addr: &str,
    shared: Shared,
    stop: Arc<AtomicBool>,
) -> std::io::Result<(std::thread::JoinHandle<()>, std::net::SocketAddr)> {
    let l = TcpListener::bind(addr)?;
    let local = l.local_addr()?;
    l.set_nonblocking(true)?;
    let h = std::thread::Builder::new()
        .name("vtism-metrics".into())
        .spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                match l.accept() {
                    Ok((mut s, _)) => {
                        let _ = s.set_nonblocking(false);
                        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
                        let _ = s.set_write_timeout(Some(Duration::from_secs(2)));
                        // Read the request head, which may come in several segments.
                        let mut buf = [0u8; 4096];
                        let mut n = 0;
                        while n < buf.len() {
                            match s.read(&mut buf[n..]) {
                                Ok(0) | Err(_) => break,
                                Ok(k) => n += k,
                            }
                            if buf[..n].windows(4).any(|w| w == b"\r\n\r\n")
                                || buf[..n].windows(2).any(|w| w == b"\n\n")
                            {
                                break;
                            }
                        }
                        let req = String::from_utf8_lossy(&buf[..n]);
                        let path = req.split_whitespace().nth(1).unwrap_or("");
                        let (code, ctype, body) = if req.starts_with("GET ")
                            && (path == "/metrics" || path.starts_with("/metrics?"))
                        {
                            ("200 OK", CONTENT_TYPE, shared.metrics_text())
                        } else {
                            ("404 Not Found", "text/plain", "try /metrics\n".to_string())
                        };
                        let _ = write!(
                            s,
                            "HTTP/1.1 {code}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                            body.len()
                        );
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(50))
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(50)),
                }
            }
        })?;
    Ok((h, local))
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
    // A stale socket from a daemon that died: remove it only if nobody answers on it.
    if path.exists() && UnixStream::connect(path).is_err() {
        let _ = std::fs::remove_file(path);
    }
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

fn handle_ctl(s: UnixStream, shared: &Shared, requests: &mpsc::Sender<CtlRequest>) {
    let _ = s.set_nonblocking(false);
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let _ = s.set_write_timeout(Some(Duration::from_secs(5)));
    let mut line = String::new();
    let mut r = BufReader::new(s.take(4096));
    if r.read_line(&mut line).is_err() {
        return;
    }
    let mut s = r.into_inner().into_inner();
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
    let _ = writeln!(s, "{answer}");
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
}
