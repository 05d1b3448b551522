//! A small synchronous QMP client: greeting, capabilities, commands with ids, buffered events,
//! the peer's pid from SO_PEERCRED. Every failure is an error value; nothing QEMU sends can panic.

use serde_json::{json, Value};
use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};
use thiserror::Error;

/// Longest line accepted from QEMU (an `info mtree` answer is tens of KiB).
const MAX_LINE: usize = 16 << 20;

#[derive(Debug, Error)]
pub enum QmpError {
    #[error("QMP I/O: {0}")]
    Io(#[from] io::Error),
    #[error("QMP peer closed the connection")]
    Disconnected,
    #[error("QMP timed out")]
    Timeout,
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
        let (pid, uid) = crate::sys::peer_cred(&stream)?;
        stream.set_write_timeout(Some(timeout))?;
        let mut q = Qmp {
            stream,
            lines: LineBuf::default(),
            events: VecDeque::new(),
            next_id: 1,
            timeout,
            pid,
            uid,
            version: (0, 0, 0),
            transcript: record.then(Vec::new),
            eof: false,
        };
        let deadline = Instant::now() + timeout;
        let greeting = q.read_value(deadline)?;
        let v = greeting
            .get("QMP")
            .ok_or_else(|| QmpError::Protocol(format!("no QMP greeting: {greeting}")))?;
        let qv = &v["version"]["qemu"];
        q.version = (
            qv["major"].as_u64().unwrap_or(0),
            qv["minor"].as_u64().unwrap_or(0),
            qv["micro"].as_u64().unwrap_or(0),
        );
        q.execute("qmp_capabilities", None)?;
        Ok(q)
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
            if self.lines.buf.len() > MAX_LINE {
                return Err(QmpError::Protocol("line too long".into()));
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(QmpError::Timeout);
            }
            self.stream.set_read_timeout(Some(deadline - now))?;
            let mut chunk = [0u8; 65536];
            match self.stream.read(&mut chunk) {
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
        self.stream.write_all(line.as_bytes()).map_err(|e| {
            if e.kind() == io::ErrorKind::BrokenPipe {
                QmpError::Disconnected
            } else {
                e.into()
            }
        })?;
        let deadline = Instant::now() + self.timeout;
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
        loop {
            let mut chunk = [0u8; 65536];
            match self.stream.read(&mut chunk) {
                Ok(0) => {
                    result = Err(QmpError::Disconnected);
                    break;
                }
                Ok(n) => {
                    self.lines.buf.extend_from_slice(&chunk[..n]);
                    if self.lines.buf.len() > MAX_LINE {
                        result = Err(QmpError::Protocol("line too long".into()));
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
        while let Some(line) = self.lines.take_line() {
            if let Some(t) = self.transcript.as_mut() {
                t.push(format!("<- {}", String::from_utf8_lossy(&line)));
            }
            if let Ok(v) = serde_json::from_slice::<Value>(&line) {
                self.push_event(&v);
            }
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
}
