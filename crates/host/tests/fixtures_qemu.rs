//! The daemon's QMP side against exchanges captured from real QEMU 7.2 (tests/fixtures/qemu-7.2,
//! captured with `e2e-harness capture` and by hand), replayed by a fake monitor: the client must
//! send exactly the recorded commands and make sense of exactly the recorded answers.

use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;
use vtism_host::mtree;
use vtism_host::qmp::{Qmp, QmpError};
use vtism_host::vm;
use vtism_proto::Gfn;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// `-> ` and `<- ` lines of a transcript.
fn transcript(name: &str) -> Vec<(bool, String)> {
    std::fs::read_to_string(fixture(name))
        .unwrap()
        .lines()
        .filter_map(|l| {
            if let Some(s) = l.strip_prefix("-> ") {
                Some((true, s.to_string()))
            } else {
                l.strip_prefix("<- ").map(|s| (false, s.to_string()))
            }
        })
        .collect()
}

fn strip_id(mut v: Value) -> Value {
    if let Some(o) = v.as_object_mut() {
        o.remove("id");
    }
    v
}

/// Replays a transcript strictly: each command the client sends must equal the next recorded one
/// (ids aside); the recorded answers follow with the client's id. Then the server hangs up.
fn replay(name: &str) -> (UnixStream, std::thread::JoinHandle<Result<(), String>>) {
    let t = transcript(name);
    let (client, server) = UnixStream::pair().unwrap();
    let h = std::thread::spawn(move || {
        let mut r = BufReader::new(server.try_clone().unwrap());
        let mut w = server;
        let mut i = 0;
        while i < t.len() {
            if !t[i].0 {
                writeln!(w, "{}", t[i].1).map_err(|e| e.to_string())?;
                i += 1;
                continue;
            }
            let mut line = String::new();
            if r.read_line(&mut line).map_err(|e| e.to_string())? == 0 {
                return Err(format!("client hung up before `{}`", t[i].1));
            }
            let got: Value = serde_json::from_str(&line).map_err(|e| e.to_string())?;
            let want: Value = serde_json::from_str(&t[i].1).unwrap();
            let id = got.get("id").cloned();
            if strip_id(got.clone()) != strip_id(want.clone()) {
                return Err(format!("client sent {got}, transcript has {want}"));
            }
            i += 1;
            while i < t.len() && !t[i].0 {
                let mut v: Value = serde_json::from_str(&t[i].1).unwrap();
                if v.get("id").is_some() {
                    v["id"] = id.clone().unwrap_or(Value::Null);
                }
                writeln!(w, "{v}").map_err(|e| e.to_string())?;
                i += 1;
            }
        }
        Ok(())
    });
    (client, h)
}

fn inspect_fixture(name: &str) -> vm::VmInfo {
    let (client, h) = replay(name);
    let mut q = Qmp::from_stream(client, Duration::from_secs(5)).unwrap();
    assert_eq!(q.version, (7, 2, 22));
    let info = vm::inspect(&mut q).unwrap();
    drop(q);
    h.join().unwrap().unwrap();
    info
}

#[test]
fn numa_memdevs_with_dimm_after_firmware() {
    let info = inspect_fixture("qemu-7.2/inspect-numa2-dimm-running.qmp.jsonl");
    assert_eq!(info.name, "vm-a");
    assert_eq!(info.status, "running");
    let names: Vec<(&str, u64, u64)> = info
        .memory
        .ranges
        .iter()
        .map(|r| (r.name.as_str(), r.gfns.start.0, r.gfns.end.0))
        .collect();
    // The firmware's PAM setup splits m0 below 1 MiB; ROM-mapped parts, the ivshmem BAR and the
    // MMIO hole are not RAM. m1 follows m0, the hot-plugged DIMM sits at 4 GiB.
    assert_eq!(names.first(), Some(&("m0", 0, 0xa0)), "{names:?}");
    assert!(names.contains(&("m0", 0xcb, 0xce)), "{names:?}");
    assert!(names.contains(&("m0", 0x100, 0x10000)), "{names:?}");
    assert!(names.contains(&("m1", 0x10000, 0x20000)), "{names:?}");
    assert!(names.contains(&("mhp", 0x100000, 0x110000)), "{names:?}");
    assert!(names.iter().all(|n| n.0 != "vtism-chan"));
    // HVAs: m0's pieces share one base (gpa2hva answers are consistent with the @offsets).
    let m0: Vec<_> = info
        .memory
        .ranges
        .iter()
        .filter(|r| r.name == "m0")
        .collect();
    let base = m0[0].hva;
    for r in &m0 {
        assert_eq!(r.hva.0 - base.0, r.gfns.start.0 * 4096, "{r:?}");
    }
    assert_eq!(
        info.memory.hva(Gfn(0x10001)).unwrap(),
        info.memory
            .ranges
            .iter()
            .find(|r| r.name == "m1")
            .unwrap()
            .hva
            .offset(4096)
    );
    assert!(
        !info.memory.ram.contains(Gfn(0xc3)),
        "ROM-mapped PAM window"
    );
    assert!(!info.memory.ram.contains(Gfn(0xa0)), "VGA window");
    assert!(!info.memory.ram.contains(Gfn(0x20000)), "above m1");
    assert_eq!(info.ivshmem.len(), 1);
    let d = vm::pick_channel(&info.ivshmem, "vtism").unwrap();
    assert_eq!(d.id, "vtism0");
    assert_eq!(
        d.mem_path.as_deref(),
        Some(Path::new("/dev/shm/vtism-fixture-a.chan"))
    );
    assert_eq!(d.size, Some(1 << 20));
    assert_eq!(info.vcpu_threads.len(), 2);
}

#[test]
fn pc_ram_with_vga_and_anonymous_ivshmem_prelaunch() {
    let info = inspect_fixture("qemu-7.2/inspect-pcram-vga-prelaunch.qmp.jsonl");
    assert_eq!(info.status, "prelaunch");
    assert!(info.memory.ranges.iter().all(|r| r.name == "pc.ram"));
    // VGA RAM is `ram` in the flat view but no memory backend: not guest RAM.
    assert_eq!(info.memory.bytes(), (256 << 20) - (384 << 10));
    let d = vm::pick_channel(&info.ivshmem, "vtism").expect("the only ivshmem device");
    assert_eq!(d.path, "/machine/peripheral-anon/device[0]");
    assert_eq!(d.backend, "shm");
}

#[test]
fn ram_above_4g_without_ivshmem() {
    let info = inspect_fixture("qemu-7.2/inspect-3g-split-noivshmem.qmp.jsonl");
    assert_eq!(info.name, "");
    assert!(info.ivshmem.is_empty());
    let hi = info
        .memory
        .ranges
        .iter()
        .find(|r| r.gfns.start.0 == 0x100000)
        .expect("RAM above 4 GiB");
    assert_eq!(hi.name, "pc.ram");
    // One backend, two windows: the HVA above 4 GiB continues where the low window stops.
    let lo = info
        .memory
        .ranges
        .iter()
        .find(|r| r.gfns.start.0 == 0x100)
        .unwrap();
    assert_eq!(hi.hva.0 - lo.hva.0, (lo.gfns.end.0 - 0x100) * 4096);
    assert_eq!(info.memory.bytes(), (3u64 << 30) - (384 << 10));
}

#[test]
fn a_wrong_answer_is_an_error_not_a_panic() {
    // A monitor that answers gpa2hva with something else.
    let (client, server) = UnixStream::pair().unwrap();
    let h = std::thread::spawn(move || {
        let mut r = BufReader::new(server.try_clone().unwrap());
        let mut w = server;
        writeln!(w, r#"{{"QMP": {{"version": {{"qemu": {{"micro": 0, "minor": 2, "major": 7}}}}, "capabilities": []}}}}"#).unwrap();
        let mut line = String::new();
        while r.read_line(&mut line).unwrap_or(0) > 0 {
            let v: Value = serde_json::from_str(&line).unwrap();
            let id = v["id"].clone();
            let ret: Value = match v["execute"].as_str().unwrap() {
                "query-memdev" => serde_json::json!([{"id": "m0"}]),
                "human-monitor-command" => {
                    if v["arguments"]["command-line"] == "info mtree -f" {
                        Value::String("FlatView #0\n AS \"memory\", root: system\n Root memory region: system\n  0000000000000000-000000000fffffff (prio 0, ram): m0\n".into())
                    } else {
                        Value::String("Host virtual address for 0x0 (other) is 0x1000\r\n".into())
                    }
                }
                "qom-list" => serde_json::json!([]),
                _ => serde_json::json!({}),
            };
            writeln!(w, "{}", serde_json::json!({"return": ret, "id": id})).unwrap();
            line.clear();
        }
    });
    let mut q = Qmp::from_stream(client, Duration::from_secs(5)).unwrap();
    let e = vm::inspect(&mut q).unwrap_err();
    assert!(matches!(e, vm::InspectError::RegionMismatch { .. }), "{e}");
    drop(q);
    h.join().unwrap();
}

#[test]
fn events_are_collected_and_a_hangup_is_reported() {
    // The numa2 session's events (RESUME, STOP, RESET, SHUTDOWN) arrive unsolicited.
    let events: Vec<String> = transcript("qemu-7.2/numa2-ivshmem-hotplug.qmp.jsonl")
        .into_iter()
        .filter(|(send, l)| !send && l.contains("\"event\""))
        .map(|(_, l)| l)
        .collect();
    assert!(events.len() >= 5);
    let (client, server) = UnixStream::pair().unwrap();
    let greeting = transcript("qemu-7.2/numa2-ivshmem-hotplug.qmp.jsonl")[0]
        .1
        .clone();
    let h = std::thread::spawn(move || {
        let mut r = BufReader::new(server.try_clone().unwrap());
        let mut w = server;
        writeln!(w, "{greeting}").unwrap();
        let mut line = String::new();
        r.read_line(&mut line).unwrap(); // qmp_capabilities
        let id: Value = serde_json::from_str::<Value>(&line).unwrap()["id"].clone();
        writeln!(w, "{}", serde_json::json!({"return": {}, "id": id})).unwrap();
        for e in &events {
            writeln!(w, "{e}").unwrap();
        }
        // QEMU quits.
    });
    let mut q = Qmp::from_stream(client, Duration::from_secs(5)).unwrap();
    h.join().unwrap();
    let mut names = Vec::new();
    let mut end = None;
    for _ in 0..3 {
        match q.poll_events() {
            Ok(ev) => names.extend(ev.into_iter().map(|e| e.name)),
            Err(e) => {
                end = Some(e);
                break;
            }
        }
    }
    assert!(matches!(end, Some(QmpError::Disconnected)), "{end:?}");
    // Events read together with the hang-up are not lost: poll again.
    names.extend(
        q.poll_events()
            .unwrap_or_default()
            .into_iter()
            .map(|e| e.name),
    );
    for want in ["RESUME", "STOP", "RESET", "SHUTDOWN"] {
        assert!(
            names.iter().any(|n| n == want),
            "{want} missing from {names:?}"
        );
    }
}

#[test]
fn mtree_dumps_from_qemu() {
    let text = std::fs::read_to_string(fixture("qemu-7.2/mtree-numa2-hotplug.txt")).unwrap();
    let flat = mtree::parse_memory_flatview(&text).unwrap();
    // The `memory` AS is FlatView #4 in this dump, not the first one.
    assert!(flat
        .iter()
        .any(|r| r.name == "mhp" && r.start == 0x1_0000_0000));
    let names = ["m0", "m1", "mhp"].iter().map(|s| s.to_string()).collect();
    let ram = mtree::ram_ranges(&flat, &names).unwrap();
    let total: u64 = ram.iter().map(|r| r.end + 1 - r.start).sum();
    assert_eq!(total, (768 << 20) - 0x25000 - 0x10000);
    let pre = std::fs::read_to_string(fixture("qemu-7.2/mtree-numa2-prelaunch.txt")).unwrap();
    let flat = mtree::parse_memory_flatview(&pre).unwrap();
    assert_eq!(flat.iter().filter(|r| r.kind == "ram").count(), 3);
    assert!(mtree::parse_memory_flatview("FlatView #0\n AS \"I/O\", root: io\n").is_none());
}
