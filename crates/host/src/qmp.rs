//! A small synchronous QMP client: greeting, capabilities, commands with ids, buffered events,
//! the peer's pid from SO_PEERCRED. Every failure is an error value; nothing QEMU sends can panic.
//! A monitor is not trusted to be quick or brief: each command has a timeout, a whole exchange
//! (attach, refresh) can have a deadline, and a reply larger than a bound is refused unread.

use serde_json::{json, Value};
use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};
use thiserror::Error;

/// Longest reply accepted by default: QEMU 7.2's largest captured answer (`info mtree -f` of a
/// two-node machine with a DIMM and ivshmem) is 13 KB, so this leaves room for big machines.
pub const DEFAULT_MAX_REPLY_BYTES: usize = 1 << 20;

#[derive(Debug, Error)]
pub enum QmpError {
    #[error("QMP I/O: {0}")]
    Io(#[from] io::Error),
    #[error("QMP peer closed the connection")]
    Disconnected,
    #[error("QMP timed out")]
    Timeout,
    #[error("QMP reply longer than {0} bytes")]
    TooLong(usize),
    #[error("QMP protocol: {0}")]
    Protocol(String),
    #[error("QMP command {command} failed: {class}: {desc}")]
    Command {
        command: String,
        class: String,
        desc: String,
    },
}

impl QmpError {
    /// The connection is unusable (as opposed to one failed command).
    pub fn is_fatal(&self) -> bool {
        !matches!(self, QmpError::Command { .. })
    }
}

/// A QMP event.
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    pub name: String,
    pub data: Value,
}

/// Splits a byte stream into lines, keeping partial lines across reads.
#[derive(Default)]
struct LineBuf {
    buf: Vec<u8>,
}

impl LineBuf {
    fn take_line(&mut self) -> Option<Vec<u8>> {
        let pos = self.buf.iter().position(|&b| b == b'\n')?;
        let mut line: Vec<u8> = self.buf.drain(..=pos).collect();
        line.pop();
        if line.last() == Some(&b'\r') {
            line.pop();
        }
        Some(line)
    }
}

pub struct Qmp {
    stream: UnixStream,
    lines: LineBuf,
    events: VecDeque<Event>,
    next_id: u64,
    timeout: Duration,
    /// End of the exchange under way (`begin_exchange`): no command runs past it.
    exchange_deadline: Option<Instant>,
    max_reply: usize,
    pub pid: i32,
    /// The QEMU process's uid (SO_PEERCRED).
    pub uid: u32,
    /// `qemu` version triple from the greeting.
    pub version: (u64, u64, u64),
    /// When set, every line sent (`-> `) and received (`<- `) is appended: fixture capture.
    pub transcript: Option<Vec<String>>,
    /// The peer hung up; reported once the events read before it are handed out.
    eof: bool,
}

impl Qmp {
    /// Connects, reads the greeting, negotiates capabilities and reads the peer pid.
    pub fn connect(path: &Path, timeout: Duration) -> Result<Qmp, QmpError> {
        let stream = UnixStream::connect(path)?;
        Self::from_stream(stream, timeout)
    }

    pub fn from_stream(stream: UnixStream, timeout: Duration) -> Result<Qmp, QmpError> {
        Self::from_stream_recording(stream, timeout, false)
    }

    /// As `from_stream`, recording the whole exchange in `transcript` when `record` is set.
    pub fn from_stream_recording(
        stream: UnixStream,
        timeout: Duration,
        record: bool,
    ) -> Result<Qmp, QmpError> {
        let mut q = Self::unconnected(stream, timeout, None, DEFAULT_MAX_REPLY_BYTES)?;
        q.transcript = record.then(Vec::new);
        q.handshake()?;
        Ok(q)
    }

    fn unconnected(
        stream: UnixStream,
        timeout: Duration,
        exchange_deadline: Option<Instant>,
        max_reply: usize,
    ) -> Result<Qmp, QmpError> {
        let (pid, uid) = crate::sys::peer_cred(&stream)?;
        stream.set_write_timeout(Some(timeout))?;
        Ok(Qmp {
            stream,
            lines: LineBuf::default(),
            events: VecDeque::new(),
            next_id: 1,
            timeout,
            exchange_deadline,
            max_reply,
            pid,
            uid,
            version: (0, 0, 0),
            transcript: None,
            eof: false,
        })
    }

    /// Connects within `deadline`, which then bounds every command until `end_exchange`;
    /// replies over `max_reply` bytes are refused.
    pub fn connect_until(
        path: &Path,
        timeout: Duration,
        deadline: Instant,
        max_reply: usize,
    ) -> Result<Qmp, QmpError> {
        let stream = UnixStream::connect(path)?;
        Self::handshake_until(stream, timeout, deadline, max_reply)
    }

    /// As `from_stream`, under a deadline for the whole exchange and a bound on replies.
    pub fn handshake_until(
        stream: UnixStream,
        timeout: Duration,
        deadline: Instant,
        max_reply: usize,
    ) -> Result<Qmp, QmpError> {
        let mut q = Self::unconnected(stream, timeout, Some(deadline), max_reply)?;
        q.handshake()?;
        Ok(q)
    }

    /// Starts an exchange that must end within `budget`: every command after this fails with
    /// `Timeout` once the deadline passes, however the monitor trickles its answers.
    pub fn begin_exchange(&mut self, budget: Duration) {
        self.exchange_deadline = Some(Instant::now() + budget);
    }

    pub fn end_exchange(&mut self) {
        self.exchange_deadline = None;
    }

    pub fn set_max_reply(&mut self, bytes: usize) {
        self.max_reply = bytes;
    }

    /// When the next command must be answered: its own timeout, or the exchange's deadline if
    /// that comes first.
    fn deadline(&self) -> Instant {
        let own = Instant::now() + self.timeout;
        self.exchange_deadline.map_or(own, |d| d.min(own))
    }

    fn handshake(&mut self) -> Result<(), QmpError> {
        let deadline = self.deadline();
        let greeting = self.read_value(deadline)?;
        let v = greeting
            .get("QMP")
            .ok_or_else(|| QmpError::Protocol(format!("no QMP greeting: {greeting}")))?;
        let qv = &v["version"]["qemu"];
        self.version = (
            qv["major"].as_u64().unwrap_or(0),
            qv["minor"].as_u64().unwrap_or(0),
            qv["micro"].as_u64().unwrap_or(0),
        );
        self.execute("qmp_capabilities", None)?;
        Ok(())
    }

    fn read_value(&mut self, deadline: Instant) -> Result<Value, QmpError> {
        loop {
            if let Some(line) = self.lines.take_line() {
                if line.iter().all(|b| b.is_ascii_whitespace()) {
                    continue;
                }
                if let Some(t) = self.transcript.as_mut() {
                    t.push(format!("<- {}", String::from_utf8_lossy(&line)));
                }
                return serde_json::from_slice(&line).map_err(|e| {
                    QmpError::Protocol(format!(
                        "bad JSON ({e}): {}",
                        String::from_utf8_lossy(&line[..line.len().min(200)])
                    ))
                });
            }
            if self.lines.buf.len() > self.max_reply {
                return Err(QmpError::TooLong(self.max_reply));
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(QmpError::Timeout);
            }
            self.stream.set_read_timeout(Some(deadline - now))?;
            let mut chunk = [0u8; 65536];
            // Never more than one byte past the bound, so the buffer stays bounded.
            let want = (self.max_reply + 1 - self.lines.buf.len()).min(chunk.len());
            match self.stream.read(&mut chunk[..want]) {
                Ok(0) => return Err(QmpError::Disconnected),
                Ok(n) => self.lines.buf.extend_from_slice(&chunk[..n]),
                Err(e)
                    if e.kind() == io::ErrorKind::WouldBlock
                        || e.kind() == io::ErrorKind::TimedOut =>
                {
                    return Err(QmpError::Timeout)
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {
                    return Err(QmpError::Disconnected)
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    fn take_event_line(&mut self, line: &[u8]) {
        if let Some(t) = self.transcript.as_mut() {
            t.push(format!("<- {}", String::from_utf8_lossy(line)));
        }
        if let Ok(v) = serde_json::from_slice::<Value>(line) {
            self.push_event(&v);
        }
    }

    fn push_event(&mut self, v: &Value) {
        if let Some(name) = v.get("event").and_then(Value::as_str) {
            // Bounded: a VM that floods events cannot grow memory without limit.
            if self.events.len() >= 1024 {
                self.events.pop_front();
            }
            self.events.push_back(Event {
                name: name.to_string(),
                data: v.get("data").cloned().unwrap_or(Value::Null),
            });
        }
    }

    /// Runs a command and returns its `return` value.
    pub fn execute(&mut self, command: &str, args: Option<Value>) -> Result<Value, QmpError> {
        let id = self.next_id;
        self.next_id += 1;
        let mut msg = json!({ "execute": command, "id": id });
        if let Some(a) = args {
            msg["arguments"] = a;
        }
        let mut line = msg.to_string();
        if let Some(t) = self.transcript.as_mut() {
            t.push(format!("-> {line}"));
        }
        line.push('\n');
        let deadline = self.deadline();
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(QmpError::Timeout);
        }
        self.stream.set_write_timeout(Some(left))?;
        self.stream.write_all(line.as_bytes()).map_err(|e| {
            if e.kind() == io::ErrorKind::BrokenPipe {
                QmpError::Disconnected
            } else if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) {
                QmpError::Timeout
            } else {
                e.into()
            }
        })?;
        loop {
            let v = self.read_value(deadline)?;
            if v.get("event").is_some() {
                self.push_event(&v);
                continue;
            }
            if v.get("id").and_then(Value::as_u64).is_some_and(|i| i != id) {
                continue; // an answer to a command that timed out earlier
            }
            if let Some(r) = v.get("return") {
                return Ok(r.clone());
            }
            if let Some(e) = v.get("error") {
                return Err(QmpError::Command {
                    command: command.to_string(),
                    class: e["class"].as_str().unwrap_or("?").to_string(),
                    desc: e["desc"].as_str().unwrap_or("?").to_string(),
                });
            }
            return Err(QmpError::Protocol(format!("unexpected message: {v}")));
        }
    }

    /// A human monitor command; returns its text output.
    pub fn hmp(&mut self, command_line: &str) -> Result<String, QmpError> {
        let r = self.execute(
            "human-monitor-command",
            Some(json!({ "command-line": command_line })),
        )?;
        r.as_str()
            .map(str::to_string)
            .ok_or_else(|| QmpError::Protocol("human-monitor-command returned no string".into()))
    }

    /// `qom-get`.
    pub fn qom_get(&mut self, path: &str, property: &str) -> Result<Value, QmpError> {
        self.execute(
            "qom-get",
            Some(json!({ "path": path, "property": property })),
        )
    }

    /// Collects events that arrived without blocking. `Err(Disconnected)` when QEMU went away.
    pub fn poll_events(&mut self) -> Result<Vec<Event>, QmpError> {
        if self.eof {
            return Err(QmpError::Disconnected);
        }
        self.stream.set_nonblocking(true)?;
        let mut result = Ok(());
        // A monitor that floods events is read for at most this much per call: the rest waits.
        let mut budget = self.max_reply;
        while budget > 0 {
            let mut chunk = [0u8; 65536];
            match self.stream.read(&mut chunk) {
                Ok(0) => {
                    result = Err(QmpError::Disconnected);
                    break;
                }
                Ok(n) => {
                    budget = budget.saturating_sub(n);
                    self.lines.buf.extend_from_slice(&chunk[..n]);
                    // Whole lines are consumed below; only a partial one may be left here.
                    while let Some(line) = self.lines.take_line() {
                        self.take_event_line(&line);
                    }
                    if self.lines.buf.len() > self.max_reply {
                        result = Err(QmpError::TooLong(self.max_reply));
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    result = Err(e.into());
                    break;
                }
            }
        }
        let _ = self.stream.set_nonblocking(false);
        // Lines read along with an earlier command's answer.
        while let Some(line) = self.lines.take_line() {
            self.take_event_line(&line);
        }
        if let Err(e) = result {
            if matches!(e, QmpError::Disconnected) && !self.events.is_empty() {
                // Hand out what arrived before the hang-up; report it on the next call.
                self.eof = true;
            } else {
                return Err(e);
            }
        }
        Ok(self.events.drain(..).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linebuf_keeps_partial_lines() {
        let mut l = LineBuf::default();
        l.buf.extend_from_slice(b"{\"a\":1}\r\n{\"b\"");
        assert_eq!(l.take_line().unwrap(), b"{\"a\":1}");
        assert!(l.take_line().is_none());
        l.buf.extend_from_slice(b":2}\n");
        assert_eq!(l.take_line().unwrap(), b"{\"b\":2}");
    }

    const GREETING: &str = r#"{"QMP": {"version": {"qemu": {"micro": 0, "minor": 2, "major": 7}}, "capabilities": []}}"#;

    /// A monitor on the other end of a socketpair: greets, then answers every command with
    /// `reply(id)` after `delay`, written `chunk` bytes at a time.
    fn monitor(
        delay: Duration,
        chunk: usize,
        reply: impl Fn(&Value) -> String + Send + 'static,
    ) -> UnixStream {
        use std::io::BufRead;
        let (client, server) = UnixStream::pair().unwrap();
        std::thread::spawn(move || {
            let mut r = io::BufReader::new(server.try_clone().unwrap());
            let mut w = server;
            writeln!(w, "{GREETING}").unwrap();
            let mut line = String::new();
            while r.read_line(&mut line).unwrap_or(0) > 0 {
                let cmd: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
                line.clear();
                let out = if cmd["execute"] == "qmp_capabilities" {
                    format!("{}\n", json!({"return": {}, "id": cmd["id"]}))
                } else {
                    std::thread::sleep(delay);
                    reply(&cmd["id"])
                };
                for piece in out.as_bytes().chunks(chunk) {
                    if w.write_all(piece).is_err() {
                        return;
                    }
                }
            }
        });
        client
    }

    #[test]
    fn a_huge_reply_is_refused_with_bounded_memory() {
        let s = monitor(Duration::ZERO, 1 << 16, |id| {
            format!("{}\n", json!({"return": "x".repeat(64 << 20), "id": id}))
        });
        let mut q = Qmp::from_stream(s, Duration::from_secs(10)).unwrap();
        let e = q.execute("query-name", None).unwrap_err();
        assert!(
            matches!(e, QmpError::TooLong(DEFAULT_MAX_REPLY_BYTES)),
            "{e}"
        );
        assert!(e.is_fatal());
        assert!(q.lines.buf.len() <= DEFAULT_MAX_REPLY_BYTES + 1);
        assert!(q.lines.buf.capacity() <= 2 * DEFAULT_MAX_REPLY_BYTES + (64 << 10));
    }

    #[test]
    fn a_trickling_monitor_is_cut_off_at_the_exchange_deadline() {
        // Every answer comes well within the per-command timeout, after 100 ms, a byte a write.
        let s = monitor(Duration::from_millis(100), 1, |id| {
            format!("{}\n", json!({"return": {"name": "slow"}, "id": id}))
        });
        let mut q = Qmp::from_stream(s, Duration::from_secs(2)).unwrap();
        q.execute("query-name", None).unwrap();
        let budget = Duration::from_millis(500);
        q.begin_exchange(budget);
        let t = Instant::now();
        let e = loop {
            if let Err(e) = q.execute("query-name", None) {
                break e;
            }
            assert!(t.elapsed() < Duration::from_secs(5), "no deadline");
        };
        assert!(matches!(e, QmpError::Timeout), "{e}");
        let took = t.elapsed();
        assert!(
            took >= budget && took < budget + Duration::from_millis(300),
            "the exchange took {took:?}"
        );
        q.end_exchange();
    }

    #[test]
    fn a_silent_monitor_times_out_at_the_handshake_deadline() {
        let (client, _server) = UnixStream::pair().unwrap();
        let t = Instant::now();
        let deadline = t + Duration::from_millis(200);
        let e = Qmp::handshake_until(client, Duration::from_secs(30), deadline, 1 << 20)
            .err()
            .unwrap();
        assert!(matches!(e, QmpError::Timeout), "{e}");
        assert!(t.elapsed() < Duration::from_millis(600));
    }

    #[test]
    fn an_event_flood_is_read_in_bounded_slices() {
        let (client, server) = UnixStream::pair().unwrap();
        let mut w = server.try_clone().unwrap();
        let flood = std::thread::spawn(move || {
            writeln!(w, "{GREETING}").unwrap();
            let ev = format!(
                "{}\n",
                json!({"event": "RTC_CHANGE", "data": {"offset": 0}})
            );
            let lots = ev.repeat(4096);
            while w.write_all(lots.as_bytes()).is_ok() {}
        });
        let mut q = Qmp::unconnected(client, Duration::from_secs(2), None, 64 << 10).unwrap();
        let deadline = q.deadline();
        q.read_value(deadline).unwrap();
        for _ in 0..20 {
            let t = Instant::now();
            let ev = q.poll_events().unwrap();
            assert!(ev.len() <= 1024, "events are bounded");
            assert!(
                t.elapsed() < Duration::from_millis(500),
                "{:?}",
                t.elapsed()
            );
        }
        drop(q);
        drop(server);
        flood.join().unwrap();
    }
}
