//! The pool wiring (and the home node) end to end inside the daemon, without privileges: fake
//! QEMUs, each a child
//! process (this test binary re-run as `fake_qemu_process`) whose "guest RAM" is a buffer of its
//! own, so vtismd sees two VMs with two pids and queries and moves their pages with real
//! move_pages calls; real channel files; the captured sysfs of the emulated host. In pool mode
//! the quota moves to the VM whose hints show the larger hot set, within its maximum and never
//! below the other's minimum, and every change reaches the engine, the guest's feedback, the
//! status and the metrics with its reason; reloads clamp, switch modes, or are refused whole.

mod common;

use common::{daemon_sections, FakeQemu, RAM_FRAMES};
use serde_json::Value;
use std::path::Path;
use std::time::{Duration, Instant};
use vtism_host::channel_file::ChannelFile;
use vtism_host::config::Config;
use vtism_host::daemon::Daemon;
use vtism_proto::layout::off;
use vtism_proto::{
    ChannelVersion, ChannelWriter, Gfn, HintEntry, MmapRegion, PageType, RoundMeta, SharedRegion,
    Tracker, WriterConfig,
};

const MIB: u64 = 1 << 20;

/// Not a test of its own: the body of a fake QEMU child process (`common::spawn_qemu`).
#[test]
fn fake_qemu_process() {
    common::fake_qemu_process();
}

fn spawn_qemu(dir: &Path, name: &str) -> (FakeQemu, MmapRegion, ChannelFile) {
    common::spawn_qemu(dir, name, 1 << 20)
}

/// The fake QEMU's vCPU thread id.
fn vcpu_tid(dir: &Path, name: &str) -> i32 {
    let f = dir.join(format!("qmp/{name}.qmp.tid"));
    std::fs::read_to_string(f).unwrap().trim().parse().unwrap()
}

/// Confines a thread to one CPU, as `taskset`/libvirt's vcpupin do to QEMU's vCPU threads.
fn pin(tid: i32, cpu: usize) {
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        assert_eq!(
            libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set),
            0,
            "{}",
            std::io::Error::last_os_error()
        );
    }
}

fn config(dir: &Path, pool: &str, vms: &str) -> Config {
    Config::parse(&format!("{}\n{pool}\n{vms}\n", daemon_sections(dir, 60000))).unwrap()
}

const POOL: &str = r#"
[pool]
mode = "pool"
fast_mib = 4
rebalance_interval_ms = 100
max_step_percent = 25
hysteresis_percent = 1
headroom_percent = 10
"#;

/// Initial shares of 2 MiB each: HMM-V's limits make that 1.5 - 2.5 MiB.
const VMS: &str = r#"
[[vm]]
name = "big"
fast_quota_mib = 2
[[vm]]
name = "small"
fast_quota_mib = 2
"#;

fn vm(d: &Daemon, name: &str) -> Option<Value> {
    d.status()["vms"]
        .as_array()
        .and_then(|v| v.iter().find(|x| x["name"] == name).cloned())
}

fn quota(d: &Daemon, name: &str) -> u64 {
    vm(d, name).map_or(0, |v| v["quota_bytes"].as_u64().unwrap())
}

/// Steps the daemon until `done` or the timeout, checking the pool's promises after every round:
/// the quotas sum to at most the pool, each within its VM's limits `lim` (name, min, max).
fn run_until(
    d: &mut Daemon,
    publish: &mut dyn FnMut(),
    lim: &[(&str, u64, u64)],
    pool: u64,
    done: &mut dyn FnMut(&Daemon) -> bool,
) -> bool {
    let end = Instant::now() + Duration::from_secs(20);
    while Instant::now() < end {
        publish();
        d.round();
        let st = d.status();
        let sum: u64 = st["vms"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["quota_bytes"].as_u64().unwrap())
            .sum();
        assert!(sum <= pool, "quotas add up to {sum} > {pool}: {st}");
        for (name, min, max) in lim {
            if let Some(v) = vm(d, name) {
                let q = v["quota_bytes"].as_u64().unwrap();
                assert!(
                    (*min..=*max).contains(&q),
                    "{name}: quota {q} outside [{min}, {max}]: {v}"
                );
            }
        }
        if done(d) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

fn hints(frames: u64) -> Vec<HintEntry> {
    (0..frames)
        .map(|g| HintEntry::new(Gfn(g), 8, false, PageType::Anon, false, true))
        .collect()
}

#[test]
fn pool_moves_quota_to_the_vm_with_the_larger_hot_set() {
    let dir = common::shm_test_dir("pool-loop");
    let (_qb, rb, _mb) = spawn_qemu(&dir, "big");
    let (_qs, rs, _ms) = spawn_qemu(&dir, "small");
    let mut d = Daemon::new(config(&dir, POOL, VMS), None).unwrap();
    let lim = [
        ("big", 3 * MIB / 2, 5 * MIB / 2),
        ("small", 3 * MIB / 2, 5 * MIB / 2),
    ];

    // Both VMs join before any hints: the pool splits by shares (equal), 2 MiB each.
    let both = |d: &Daemon| quota(d, "big") == 2 * MIB && quota(d, "small") == 2 * MIB;
    assert!(
        run_until(&mut d, &mut || {}, &lim, 4 * MIB, &mut { both }),
        "no even split: {}",
        d.status()
    );

    // big's guest reports RAM_FRAMES hot frames (4 MiB), small's 16 (64 KiB).
    // Guests that still speak v1.0 (counts are rounds seen) are pooled as before.
    let old_guest = WriterConfig {
        tracker: Tracker::Harness,
        version: ChannelVersion::V1_0,
        ..WriterConfig::default()
    };
    let mut wb = ChannelWriter::init_with(&rb, old_guest).unwrap();
    let mut ws = ChannelWriter::init_with(&rs, old_guest).unwrap();
    let (hb, hs) = (hints(RAM_FRAMES), hints(16));
    let mut publish = || {
        wb.publish(&hb, &RoundMeta::default()).unwrap();
        ws.publish(&hs, &RoundMeta::default()).unwrap();
    };
    let moved = |d: &Daemon| quota(d, "big") == 5 * MIB / 2 && quota(d, "small") == 3 * MIB / 2;
    assert!(
        run_until(&mut d, &mut publish, &lim, 4 * MIB, &mut { moved }),
        "the quota did not move to big: {}",
        d.status()
    );
    let big = vm(&d, "big").unwrap();
    let small = vm(&d, "small").unwrap();
    assert_eq!(big["last_quota_change"]["reason"], "grow", "{big}");
    assert_eq!(big["last_quota_change"]["to_bytes"], 5 * MIB / 2);
    assert!(
        big["last_quota_change"]["hot_set_bytes"].as_u64().unwrap() > 5 * MIB / 2,
        "{big}"
    );
    assert!(
        big["hot_set_bytes"].as_u64().unwrap() > 5 * MIB / 2,
        "{big}"
    );
    assert_eq!(small["last_quota_change"]["reason"], "shrink", "{small}");
    assert!(
        small["hot_set_bytes"].as_u64().unwrap() <= 64 << 10,
        "{small}"
    );
    assert_eq!(
        (
            big["quota_min_bytes"].as_u64(),
            big["quota_max_bytes"].as_u64()
        ),
        (Some(3 * MIB / 2), Some(5 * MIB / 2))
    );
    assert_eq!(
        big["shares"], 2,
        "shares default to the initial share in MiB"
    );
    // The guests are told their quotas.
    assert_eq!(rb.load_u64(off::FAST_QUOTA_BYTES).unwrap(), 5 * MIB / 2);
    assert_eq!(rs.load_u64(off::FAST_QUOTA_BYTES).unwrap(), 3 * MIB / 2);
    assert_eq!(d.status()["pool"]["mode"], "pool");
    assert_eq!(d.status()["pool"]["fast_bytes"], 4 * MIB);
    // The metrics, as `vtism ctl metrics` gets them.
    let m = vtism_host::serve::ctl_request(&dir.join("ctl.sock"), "metrics").unwrap();
    let m = m["metrics"].as_str().unwrap();
    for line in [
        "vtism_vm_fast_quota_bytes{vm=\"big\"} 2621440",
        "vtism_vm_fast_quota_min_bytes{vm=\"small\"} 1572864",
        "vtism_vm_fast_quota_max_bytes{vm=\"small\"} 2621440",
        "vtism_pool_fast_bytes 4194304",
        "vtism_pool_mode{mode=\"pool\"} 1",
    ] {
        assert!(m.lines().any(|l| l == line), "no `{line}` in\n{m}");
    }
    for series in [
        "vtism_vm_quota_changes_total{vm=\"big\",reason=\"grow\"}",
        "vtism_vm_quota_changes_total{vm=\"small\",reason=\"shrink\"}",
        "vtism_vm_quota_last_change_timestamp_seconds{vm=\"big\",reason=\"grow\"}",
    ] {
        assert!(
            m.lines().any(|l| l.starts_with(series)),
            "no {series} in\n{m}"
        );
    }

    // Reload: a lower maximum for big clamps it at once.
    let vms2 = VMS.replace(
        "name = \"big\"\nfast_quota_mib = 2",
        "name = \"big\"\nfast_quota_mib = 2\nquota_max_mib = 2",
    );
    d.apply_config(config(&dir, POOL, &vms2)).unwrap();
    d.round(); // publishes the status
    let big = vm(&d, "big").unwrap();
    assert_eq!(big["quota_bytes"], 2 * MIB, "{big}");
    assert_eq!(big["last_quota_change"]["reason"], "clamp", "{big}");
    assert_eq!(rb.load_u64(off::FAST_QUOTA_BYTES).unwrap(), 2 * MIB);
    // The room big gave back goes to small, at the pool's pace (a round may or may not be due):
    // nothing is left idle. Settled first, so the refused reload below is all that could change.
    let settled = |d: &Daemon| quota(d, "big") == 2 * MIB && quota(d, "small") == 2 * MIB;
    assert!(
        run_until(&mut d, &mut || {}, &lim, 4 * MIB, &mut { settled }),
        "small did not take the room big gave back: {}",
        d.status()
    );

    // A reload whose minimums do not fit (small: 100% of a 75%-of-RAM share = 3 MiB, beside
    // big's 1.5 MiB, in a 4 MiB pool) is refused and changes nothing.
    let before = (quota(&d, "big"), quota(&d, "small"));
    let vms3 = vms2.replace(
        "name = \"small\"\nfast_quota_mib = 2",
        "name = \"small\"\nfast_quota_percent = 75\nquota_min_percent = 100",
    );
    let e = d.apply_config(config(&dir, POOL, &vms3)).unwrap_err();
    assert!(format!("{e:#}").contains("minimums"), "{e:#}");
    d.round();
    assert_eq!((quota(&d, "big"), quota(&d, "small")), before);
    assert_eq!(d.status()["pool"]["mode"], "pool");

    // Island mode: every VM back to its fixed share, whatever the hints say.
    d.apply_config(config(&dir, "", VMS)).unwrap();
    let island = [("big", 2 * MIB, 2 * MIB), ("small", 2 * MIB, 2 * MIB)];
    let mut rounds = 0;
    assert!(run_until(
        &mut d,
        &mut publish,
        &island,
        u64::MAX,
        &mut |_| {
            rounds += 1;
            rounds > 20
        }
    ));
    let st = d.status();
    assert_eq!(st["pool"]["mode"], "island");
    assert_eq!(st["pool"]["fast_bytes"], Value::Null);
    d.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
}

/// The home node follows the vCPU threads: at attach from their affinity, later when they are
/// confined elsewhere (seen at two refreshes in a row). CPUs 0 and 1 are nodes 0 and 1 in the
/// captured emulated-host topology the daemon reads.
#[test]
fn home_node_follows_the_vcpu_threads() {
    if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        eprintln!("skipped: needs CPUs 0 and 1");
        return;
    }
    let dir = common::shm_test_dir("home-loop");
    let (_q, _r, _m) = spawn_qemu(&dir, "roamer");
    let tid = vcpu_tid(&dir, "roamer");
    pin(tid, 1);
    let cfg = Config::parse(&format!(
        "{}\n[[vm]]\nname = \"roamer\"\nfast_quota_mib = 1\n",
        daemon_sections(&dir, 100)
    ))
    .unwrap();
    let mut d = Daemon::new(cfg, None).unwrap();
    let home = |d: &Daemon| vm(d, "roamer").map(|v| v["home_node"].clone());
    let step_until = |d: &mut Daemon, want: u64| {
        let end = Instant::now() + Duration::from_secs(20);
        while Instant::now() < end {
            d.round();
            if home(d) == Some(Value::from(want)) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    };
    assert!(step_until(&mut d, 1), "home at attach: {:?}", home(&d));
    pin(tid, 0);
    assert!(step_until(&mut d, 0), "home after the move: {:?}", home(&d));
    d.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
}
