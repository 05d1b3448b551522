//! The whole daemon loop without privileges: a fake QEMU monitor (answers shaped like QEMU 7.2's)
//! whose "guest RAM" is a buffer in this test process, a real channel file, the captured sysfs of
//! the emulated host. Good rounds are accepted, hostile ones are counted, moves that the kernel
//! refuses (node 2 does not exist on this machine) are survived, and a VM whose monitor goes away
//! is dropped. Nothing here may panic.

use serde_json::Value;
use std::os::unix::net::UnixListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use vtism_host::channel_file::ChannelFile;
use vtism_host::config::Config;
use vtism_host::daemon::Daemon;
use vtism_proto::layout::off;
use vtism_proto::{
    ChannelWriter, Gfn, HintEntry, Micros, PageType, RoundMeta, SharedRegion, Tracker,
    TrackerReport,
};

mod common;
use common::{daemon_sections, fake_qemu, RAM_FRAMES};

fn vm_status(d: &Daemon) -> Option<Value> {
    d.status()["vms"]
        .as_array()
        .and_then(|v| v.iter().find(|x| x["name"] == "fake").cloned())
}

#[test]
fn daemon_rounds_against_a_fake_qemu() {
    let dir = common::shm_test_dir("daemon-loop");
    let chan = dir.join("fake.chan");
    std::fs::File::create(&chan)
        .unwrap()
        .set_len(1 << 20)
        .unwrap();
    // "Guest RAM": a page-aligned buffer of this process, touched so its pages exist.
    let mut ram = vec![7u8; (RAM_FRAMES as usize + 1) * 4096];
    let hva = (ram.as_mut_ptr() as u64 + 4095) & !4095;

    // A monitor that never greets (a socket whose owner never accepts, like libvirt's busy one):
    // trying it must not stall the rounds of the VMs already managed.
    let _stuck = UnixListener::bind(dir.join("qmp/stuck.qmp")).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let server = fake_qemu(
        dir.join("qmp/fake.qmp"),
        "fake",
        chan.clone(),
        hva,
        1,
        stop.clone(),
    );

    let cfg = Config::parse(&format!(
        "{}{}",
        daemon_sections(&dir, 200),
        r#"
[channel]
entry_budget = 100
max_entries = 100
[[vm]]
name = "fake"
fast_quota_mib = 1
"#
    ))
    .unwrap();
    let mut d = Daemon::new(cfg, None).unwrap();

    // The guest, a v1.1 tracker, publishes 64 frames accessed 16 times a second (level 160).
    let map = ChannelFile::open(&chan, 1 << 20, None).unwrap();
    let region = map.region();
    let mut w = ChannelWriter::init(&region, Tracker::Harness).unwrap();
    let hot: Vec<HintEntry> = (0..64)
        .map(|g| HintEntry::new(Gfn(g), 160, false, PageType::Anon, false, true))
        .collect();
    let meta = RoundMeta {
        tracker_report: TrackerReport {
            window: Micros(100_000),
            coarse_window: Micros(1_500),
            windows: 12,
            tracker_cpu: Micros(2_500),
            tracked_frames: RAM_FRAMES,
        },
        ..RoundMeta::default()
    };
    let mut slowest = Duration::ZERO;
    for _ in 0..10 {
        w.publish(&hot, &meta).unwrap();
        let t = std::time::Instant::now();
        d.round();
        slowest = slowest.max(t.elapsed());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        slowest < Duration::from_millis(1000),
        "a round took {slowest:?}: the stuck monitor blocked the main loop"
    );
    let v = vm_status(&d).expect("the fake VM is managed");
    assert_eq!(v["ram_bytes"], RAM_FRAMES * 4096);
    assert!(v["rounds_accepted"].as_u64().unwrap() >= 5, "{v}");
    assert_eq!(v["channel_problem"], Value::Null);
    // What the tracker reported is shown.
    assert_eq!(v["channel_minor"], 1, "{v}");
    assert_eq!(v["tracker_window_us"], 100_000);
    assert_eq!(v["tracker_coarse_window_us"], 1_500);
    assert_eq!(v["tracker_windows"], 12);
    assert_eq!(v["tracker_cpu_us"], 2_500);
    assert_eq!(v["tracker_tracked_frames"], RAM_FRAMES);
    let m = vtism_host::serve::ctl_request(&dir.join("ctl.sock"), "metrics").unwrap();
    let m = m["metrics"].as_str().unwrap();
    for line in [
        "vtism_vm_tracker_window_seconds{vm=\"fake\",window=\"fine\"} 0.1",
        "vtism_vm_tracker_window_seconds{vm=\"fake\",window=\"coarse\"} 0.0015",
        "vtism_vm_tracker_cpu_seconds{vm=\"fake\"} 0.0025",
    ] {
        assert!(m.lines().any(|l| l == line), "no `{line}` in\n{m}");
    }
    assert_eq!(v["quota_bytes"], 1 << 20);
    // The placement was learned from real move_pages queries on this process: every page is on
    // a node of this machine (node 0 is in the fast tier of the fixture topology).
    assert_eq!(v["unknown_bytes"], 0, "{v}");
    assert!(v["reconcile_sweeps"].as_u64().unwrap() >= 1);
    // Feedback carries the quota and the budget.
    assert_eq!(region.load_u64(off::FAST_QUOTA_BYTES).unwrap(), 1 << 20);
    assert_eq!(region.load_u64(off::ENTRY_BUDGET).unwrap(), 100);
    assert!(region.load_u64(off::ACK_ROUND).unwrap() >= 5);

    // Hostile rounds: out of range, garbage, a flood over max_entries.
    let bad = vec![HintEntry::new(
        Gfn(RAM_FRAMES + 5),
        8,
        false,
        PageType::Anon,
        false,
        true,
    )];
    w.publish(&bad, &RoundMeta::default()).unwrap();
    d.round();
    let flood: Vec<u64> = (0..500)
        .map(|g| HintEntry::new(Gfn(g % RAM_FRAMES), 1, false, PageType::Anon, false, true).0)
        .collect();
    let s = region.load_u64(off::SEQ).unwrap();
    region.store_u64(off::SEQ, s + 1).unwrap();
    region.store_words(4096, &flood).unwrap();
    region.store_u64(off::COUNT, 500).unwrap();
    region.store_u64(off::ROUND, 900).unwrap();
    region.store_u64(off::SEQ, s + 2).unwrap();
    d.round();
    region.store_u64(off::MAGIC, 0x1234).unwrap();
    region.store_u64(off::ROUND, 901).unwrap();
    d.round();
    // Random bytes all over the header.
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for round in 0..50 {
        for o in (0..4096).step_by(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if o < 0x800 {
                region.store_u64(o, x).unwrap();
            }
        }
        region.store_u64(off::SEQ, round * 2).unwrap();
        d.round();
    }
    let v = vm_status(&d).unwrap();
    let by = &v["rejected_by_reason"];
    assert!(by["gfn_out_of_range"].as_u64().unwrap_or(0) >= 1, "{v}");
    assert!(by["over_budget"].as_u64().unwrap_or(0) >= 1, "{v}");
    assert!(by["bad_magic"].as_u64().unwrap_or(0) >= 1, "{v}");
    assert!(region.load_u64(off::REJECTED_ROUNDS).unwrap() >= 3);

    // The monitor goes away: the VM is dropped, the daemon carries on.
    stop.store(true, Ordering::SeqCst);
    server.join().unwrap();
    for _ in 0..10 {
        d.round();
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(vm_status(&d).is_none(), "{}", d.status());
    d.shutdown();
    drop(ram);
    let _ = std::fs::remove_dir_all(&dir);
}
