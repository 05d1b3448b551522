//! vtismd's view of one VM, from its control socket (`status`).

use std::io::{BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

/// The `status` answer's entry for VM `name` (promoted_bytes, quota_bytes, rounds_accepted, ...),
/// or None when vtismd does not answer or does not know the VM.
pub fn status(sock: &Path, name: &str) -> Option<serde_json::Value> {
    status_and_mover(sock, name).0
}

/// Whether vtismd had a plan's moves in flight, and how many plans its mover had finished: two
/// equal answers with nothing in flight bracket a time in which no page moved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoverState {
    pub busy: bool,
    pub jobs: u64,
}

/// VM `name`'s `status` entry and the mover's state, from one answer.
pub fn status_and_mover(
    sock: &Path,
    name: &str,
) -> (Option<serde_json::Value>, Option<MoverState>) {
    let Some(v) = status_json(sock) else {
        return (None, None);
    };
    let mover = (|| {
        Some(MoverState {
            busy: v["daemon"]["mover_busy"].as_bool()?,
            jobs: v["daemon"]["mover_jobs"].as_u64()?,
        })
    })();
    let vm = v["vms"]
        .as_array()
        .and_then(|a| a.iter().find(|x| x["name"] == name).cloned());
    (vm, mover)
}

fn status_json(sock: &Path) -> Option<serde_json::Value> {
    let mut s = UnixStream::connect(sock).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(3))).ok()?;
    s.write_all(b"status\n").ok()?;
    let mut text = String::new();
    BufReader::new(s).read_to_string(&mut text).ok()?;
    serde_json::from_str(&text).ok()
}
