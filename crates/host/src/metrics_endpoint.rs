//! `GET /metrics` over HTTP on one thread: every client's socket is non-blocking and waited on
//! with poll(2), with `METRICS_DEADLINE` to send its request and again to take the answer. Up
//! to `METRICS_CLIENTS` are served at once; when a new one comes to a full table, the client
//! that has waited longest for its own request is closed to make room, so clients that are slow
//! or silent on purpose cannot keep a scraper out (issue 24: 4 slow clients made 6 of 10 scrapes
//! fail while each held one of 4 threads).

use crate::metrics::CONTENT_TYPE;
use crate::serve::Shared;
use crate::sys;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Clients served at once.
pub const METRICS_CLIENTS: usize = 64;
/// The time a metrics client has to send its request, and to take the answer, each.
pub const METRICS_DEADLINE: Duration = Duration::from_secs(2);
/// The longest request head read.
const REQUEST_BYTES: usize = 4096;
/// The longest the thread sleeps before looking at `stop` again.
const TICK: Duration = Duration::from_millis(50);

enum State {
    /// The request head so far.
    Reading(Vec<u8>),
    /// The answer, and how much of it went out.
    Writing(Vec<u8>, usize),
}

struct Client {
    stream: TcpStream,
    accepted: Instant,
    deadline: Instant,
    state: State,
}

/// Serves `GET /metrics` on `addr` until `stop`.
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
            let mut clients: Vec<Client> = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                let (listener_ready, ready) = match wait(&l, &clients) {
                    Ok(r) => r,
                    Err(e) => {
                        tracing::warn!(error = %e, "metrics endpoint: poll failed");
                        std::thread::sleep(TICK);
                        continue;
                    }
                };
                let now = Instant::now();
                clients = clients
                    .into_iter()
                    .zip(ready)
                    .filter_map(|(c, r)| if r { step(c, &shared) } else { Some(c) })
                    .filter(|c| c.deadline > now)
                    .collect();
                if listener_ready {
                    accept_all(&l, &mut clients);
                }
            }
        })?;
    Ok((h, local))
}

/// Takes every pending connection; a full table closes the client that has waited longest for
/// its own request (one still sending it), or failing that the oldest.
fn accept_all(l: &TcpListener, clients: &mut Vec<Client>) {
    while let Ok((stream, _)) = l.accept() {
        if stream.set_nonblocking(true).is_err() {
            continue;
        }
        if clients.len() >= METRICS_CLIENTS {
            let reading = |c: &Client| matches!(c.state, State::Reading(_));
            let victim = (0..clients.len())
                .min_by_key(|&i| (!reading(&clients[i]), clients[i].accepted))
                .unwrap_or(0);
            clients.swap_remove(victim);
        }
        let now = Instant::now();
        clients.push(Client {
            stream,
            accepted: now,
            deadline: now + METRICS_DEADLINE,
            state: State::Reading(Vec::new()),
        });
    }
}

/// Waits for the listener or a client to be ready, `TICK` at most.
fn wait(l: &TcpListener, clients: &[Client]) -> std::io::Result<(bool, Vec<bool>)> {
    let mut fds: Vec<libc::pollfd> = std::iter::once((l.as_raw_fd(), libc::POLLIN))
        .chain(clients.iter().map(|c| {
            let events = match c.state {
                State::Reading(_) => libc::POLLIN,
                State::Writing(..) => libc::POLLOUT,
            };
            (c.stream.as_raw_fd(), events)
        }))
        .map(|(fd, events)| libc::pollfd {
            fd,
            events,
            revents: 0,
        })
        .collect();
    let now = Instant::now();
    let first = clients.iter().map(|c| c.deadline).min();
    let timeout = first.map_or(TICK, |d| d.saturating_duration_since(now).min(TICK));
    sys::poll(&mut fds, timeout)?;
    Ok((
        fds[0].revents != 0,
        fds[1..].iter().map(|p| p.revents != 0).collect(),
    ))
}

/// Reads or writes what the client is ready for; `None` when it is done or gone.
fn step(mut c: Client, shared: &Shared) -> Option<Client> {
    match &mut c.state {
        State::Reading(buf) => {
            let mut chunk = [0u8; 1024];
            match c.stream.read(&mut chunk) {
                Ok(0) => return None,
                Ok(k) => buf.extend_from_slice(&chunk[..k]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Some(c),
                Err(_) => return None,
            }
            if head_complete(buf) || buf.len() >= REQUEST_BYTES {
                let answer = answer(&String::from_utf8_lossy(buf), shared);
                c.state = State::Writing(answer.into_bytes(), 0);
                c.deadline = Instant::now() + METRICS_DEADLINE;
            }
            Some(c)
        }
        State::Writing(data, at) => {
            match c.stream.write(&data[*at..]) {
                Ok(0) => return None,
                Ok(k) => *at += k,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Some(c),
                Err(_) => return None,
            }
            (*at < data.len()).then_some(c)
        }
    }
}

fn head_complete(b: &[u8]) -> bool {
    b.windows(4).any(|w| w == b"\r\n\r\n") || b.windows(2).any(|w| w == b"\n\n")
}

/// The whole HTTP answer to a request head.
fn answer(req: &str, shared: &Shared) -> String {
    let path = req.split_whitespace().nth(1).unwrap_or("");
    let (code, ctype, body) =
        if req.starts_with("GET ") && (path == "/metrics" || path.starts_with("/metrics?")) {
            ("200 OK", CONTENT_TYPE, shared.metrics_text())
        } else {
            ("404 Not Found", "text/plain", "try /metrics\n".to_string())
        };
    format!(
        "HTTP/1.1 {code}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{MoverHistograms, Published, Status};

    fn get_metrics(addr: std::net::SocketAddr) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
        let mut body = String::new();
        let _ = s.read_to_string(&mut body);
        body
    }

    fn endpoint() -> (
        Shared,
        Arc<AtomicBool>,
        std::thread::JoinHandle<()>,
        std::net::SocketAddr,
    ) {
        let shared: Shared = Arc::new(Published::new(&MoverHistograms::default()));
        shared.publish(Status::default());
        let stop = Arc::new(AtomicBool::new(false));
        let (h, addr) = spawn_metrics("127.0.0.1:0", shared.clone(), stop.clone()).unwrap();
        (shared, stop, h, addr)
    }

    /// Issue 14: one slow local client held the endpoint for 14.5 s; issue 24: 4 slow clients
    /// made 6 of 10 scrapes fail. Now slow and silent clients, more than the table holds, cost
    /// a scraper nothing: 10 scrapes in a row are each answered at once, and a trickling client
    /// is cut off at its deadline.
    #[test]
    fn slow_or_silent_metrics_clients_do_not_hold_the_endpoint() {
        let (shared, stop, h, addr) = endpoint();
        let trickler = std::thread::spawn(move || {
            let mut s = TcpStream::connect(addr).unwrap();
            let t = Instant::now();
            for b in b"GET /metrics HTTP/1.0\r\n" {
                if s.write_all(&[*b]).is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(150));
            }
            let mut rest = String::new();
            let _ = s.read_to_string(&mut rest);
            t.elapsed()
        });
        // Silent clients, and slow readers that send a request and never read the answer.
        let mut held: Vec<TcpStream> = (0..2 * METRICS_CLIENTS)
            .map(|_| TcpStream::connect(addr).unwrap())
            .collect();
        for _ in 0..8 {
            let mut s = TcpStream::connect(addr).unwrap();
            s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
            held.push(s);
        }
        std::thread::sleep(Duration::from_millis(100));
        let mut slowest = Duration::ZERO;
        for i in 0..10 {
            let t = Instant::now();
            let body = get_metrics(addr);
            slowest = slowest.max(t.elapsed());
            assert!(body.starts_with("HTTP/1.1 200 OK"), "scrape {i}: {body:?}");
            assert!(body.ends_with(&shared.metrics_text()), "scrape {i}");
            // More silent clients keep coming.
            held.push(TcpStream::connect(addr).unwrap());
        }
        assert!(
            slowest < Duration::from_millis(500),
            "a scrape took {slowest:?}"
        );
        let trickled = trickler.join().unwrap();
        assert!(
            trickled < METRICS_DEADLINE + Duration::from_secs(1),
            "held for {trickled:?}"
        );
        // A request in two segments, as a slow but honest client sends it, is answered.
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(b"GET /metr").unwrap();
        std::thread::sleep(Duration::from_millis(30));
        s.write_all(b"ics HTTP/1.0\r\n\r\n").unwrap();
        let mut body = String::new();
        s.read_to_string(&mut body).unwrap();
        assert!(body.starts_with("HTTP/1.1 200 OK"), "{body}");
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(b"GET /other HTTP/1.0\r\n\r\n").unwrap();
        let mut body = String::new();
        s.read_to_string(&mut body).unwrap();
        assert!(body.starts_with("HTTP/1.1 404"), "{body}");
        drop(held);
        stop.store(true, Ordering::SeqCst);
        h.join().unwrap();
    }
}
