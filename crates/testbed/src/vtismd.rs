//! vtismd's view of one VM, from its control socket (`status`).

use std::io::{BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

/// The `status` answer's entry for VM `name` (promoted_bytes, quota_bytes, rounds_accepted, ...),
/// or None when vtismd does not answer or does not know the VM.
pub fn status(sock: &Path, name: &str) -> Option<serde_json::Value> {
    let mut s = UnixStream::connect(sock).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(3))).ok()?;
    s.write_all(b"status\n").ok()?;
    let mut text = String::new();
    BufReader::new(s).read_to_string(&mut text).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    v["vms"]
        .as_array()?
        .iter()
        .find(|x| x["name"] == name)
        .cloned()
}
