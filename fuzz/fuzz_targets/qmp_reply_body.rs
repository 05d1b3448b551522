//! Feeds arbitrary bytes to what vtismd parses from a QEMU monitor. Chosen by the first byte:
//! 0. the bytes are everything a monitor sends (greeting, answers, events) and the daemon runs
//!    its whole attach-time inspect against them over a real socket: the QMP client, the
//!    ivshmem device walk, query-memdev, `info mtree -f`, gpa2hva, the backend checks;
//! 1. the answers alone, split at NUL bytes: query-memdev's JSON, the flat view, gpa2hva
//!    answers one per line, and a /proc/<pid>/maps the RAM is checked against.
//!
//! Whatever is accepted is re-checked here against what the daemon relies on: guest ranges
//! sorted and disjoint, host ranges disjoint and in range, every frame's host address inside its
//! range.
use std::collections::BTreeSet;
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::time::Duration;
use vtism_host::mtree::GuestMemory;
use vtism_host::process;
use vtism_host::qmp::Qmp;
use vtism_host::vm;
use vtism_proto::{Gfn, FRAME_SIZE};

fn check(m: &GuestMemory) {
    let mut spans: Vec<(u64, u64)> = Vec::new();
    let mut frames = 0u64;
    let mut prev_end = 0u64;
    for (i, r) in m.ranges.iter().enumerate() {
        assert!(r.gfns.start < r.gfns.end, "empty range {r:?}");
        assert!(i == 0 || r.gfns.start.0 >= prev_end, "guest ranges overlap");
        prev_end = r.gfns.end.0;
        let len = (r.gfns.end.0 - r.gfns.start.0) * FRAME_SIZE;
        let end = r.hva.0.checked_add(len).expect("host range wraps");
        assert_eq!(r.hva.0 % FRAME_SIZE, 0);
        spans.push((r.hva.0, end));
        frames += r.gfns.end.0 - r.gfns.start.0;
        let last = Gfn(r.gfns.end.0 - 1);
        assert_eq!(m.hva(r.gfns.start), Some(r.hva));
        assert_eq!(m.hva(last).map(|h| h.0), Some(end - FRAME_SIZE));
    }
    spans.sort_unstable();
    for w in spans.windows(2) {
        assert!(w[0].1 <= w[1].0, "host ranges overlap: {w:?}");
    }
    assert_eq!(m.ram.frames(), frames);
}

fn whole_monitor(data: &[u8]) {
    let Ok((client, mut server)) = UnixStream::pair() else {
        return;
    };
    // Inputs are small (-max_len) and fit the socket buffer; the daemon's writes too. The
    // monitor's side stays open for reading, so those writes never meet a closed socket.
    if server.write_all(data).is_err() || server.shutdown(std::net::Shutdown::Write).is_err() {
        return;
    }
    let Ok(mut q) = Qmp::handshake_until(
        client,
        Duration::from_secs(1),
        std::time::Instant::now() + Duration::from_secs(2),
        1 << 20,
    ) else {
        return;
    };
    if let Ok(info) = vm::inspect(&mut q) {
        check(&info.memory);
    }
    let _ = q.poll_events();
    drop(server);
}

fn answers(data: &[u8]) {
    let mut parts = data.split(|&b| b == 0);
    let memdevs = parts.next().unwrap_or_default();
    let mtree = String::from_utf8_lossy(parts.next().unwrap_or_default());
    let gpa2hva = String::from_utf8_lossy(parts.next().unwrap_or_default());
    let maps = String::from_utf8_lossy(parts.next().unwrap_or_default());
    let memdevs = serde_json::from_slice(memdevs).unwrap_or(serde_json::Value::Null);
    let mut lines = gpa2hva.lines();
    let exclude = BTreeSet::from(["vtism-chan".to_string()]);
    let Ok(m) = vm::memory_from_answers(&memdevs, &mtree, &exclude, |_| {
        Ok(lines.next().unwrap_or_default().to_string())
    }) else {
        return;
    };
    check(&m);
    if let Ok(vmas) = process::parse_maps(&maps) {
        if vm::check_mapped(&m, &vmas).is_ok() {
            for r in &m.ranges {
                let len = (r.gfns.end.0 - r.gfns.start.0) * FRAME_SIZE;
                assert!(process::covered_rw(&vmas, r.hva, len));
            }
        }
    }
}

/// One input.
pub fn run(data: &[u8]) {
    match data.split_first() {
        Some((0, rest)) => whole_monitor(rest),
        Some((_, rest)) => answers(rest),
        None => {}
    }
}
