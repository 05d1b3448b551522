//! A fake QEMU monitor for the daemon-loop tests: answers shaped like QEMU 7.2's (captured in
//! tests/fixtures/qemu-7.2), a "guest RAM" of `RAM_FRAMES` frames at `hva` in the serving
//! process, an ivshmem channel backed by a real file.
#![allow(dead_code)] // each test file uses its part

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use vtism_host::channel_file::ChannelFile;
use vtism_proto::MmapRegion;

pub const RAM_FRAMES: u64 = 1024;

pub fn answer(cmd: &Value, name: &str, chan: &Path, hva: u64, vcpu_tid: i32) -> Value {
    answer_ram(cmd, name, chan, hva, vcpu_tid, RAM_FRAMES)
}

/// As `answer`, for a guest RAM of `ram_frames` frames at `hva`.
pub fn answer_ram(
    cmd: &Value,
    name: &str,
    chan: &Path,
    hva: u64,
    vcpu_tid: i32,
    ram_frames: u64,
) -> Value {
    let args = &cmd["arguments"];
    match cmd["execute"].as_str().unwrap_or("") {
        "qmp_capabilities" => json!({}),
        "query-name" => json!({ "name": name }),
        "query-status" => json!({"status": "running", "running": true}),
        "qom-list" if args["path"] == "/machine/peripheral" => {
            json!([{"name": "type", "type": "string"}, {"name": "vtism0", "type": "child<ivshmem-plain>"}])
        }
        "qom-list" => json!([{"name": "type", "type": "string"}]),
        "qom-get" => match args["property"].as_str().unwrap_or("") {
            "memdev" => json!("/objects/vtism-chan"),
            "mem-path" => json!(chan.to_string_lossy()),
            "size" => json!(1 << 20),
            _ => json!({"error": {"class": "GenericError", "desc": "no such property"}}),
        },
        "query-memdev" => json!([{"id": "ram0", "size": ram_frames * 4096}, {"id": "vtism-chan"}]),
        "query-cpus-fast" => json!([{"thread-id": vcpu_tid, "cpu-index": 0}]),
        "human-monitor-command" => {
            let c = args["command-line"].as_str().unwrap_or("");
            if c == "info mtree -f" {
                json!(format!(
                    "FlatView #0\r\n AS \"memory\", root: system\r\n Root memory region: system\r\n  \
                     0000000000000000-{:016x} (prio 0, ram): ram0\r\n  \
                     00000000fe000000-00000000fe0fffff (prio 1, ram): vtism-chan\r\n",
                    ram_frames * 4096 - 1
                ))
            } else if c.starts_with("gpa2hva 0x0") {
                json!(format!(
                    "Host virtual address for 0x0 (ram0) is {hva:#x}\r\n"
                ))
            } else {
                json!("unknown command\r\n")
            }
        }
        _ => json!({"error": {"class": "CommandNotFound", "desc": "nope"}}),
    }
}

/// Serves one client at a time until `stop`; answers with `answer`.
pub fn fake_qemu(
    sock: PathBuf,
    name: &str,
    chan: PathBuf,
    hva: u64,
    vcpu_tid: i32,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<()> {
    let name = name.to_string();
    fake_qemu_with(sock, stop, move |cmd| {
        answer(cmd, &name, &chan, hva, vcpu_tid)
    })
}

/// As `fake_qemu`, answering each command with `reply` (which may wait, lie or ramble).
pub fn fake_qemu_with(
    sock: PathBuf,
    stop: Arc<AtomicBool>,
    reply: impl Fn(&Value) -> Value + Send + 'static,
) -> std::thread::JoinHandle<()> {
    fake_qemu_with_events(sock, stop, reply, Vec::new)
}

/// As `fake_qemu_with`, also sending what `events` returns (QMP event names) to a connected
/// client whenever no command came for 50 ms.
pub fn fake_qemu_with_events(
    sock: PathBuf,
    stop: Arc<AtomicBool>,
    reply: impl Fn(&Value) -> Value + Send + 'static,
    events: impl Fn() -> Vec<&'static str> + Send + 'static,
) -> std::thread::JoinHandle<()> {
    let l = UnixListener::bind(&sock).unwrap();
    l.set_nonblocking(true).unwrap();
    std::thread::spawn(move || {
        while !stop.load(Ordering::SeqCst) {
            let Ok((s, _)) = l.accept() else {
                std::thread::sleep(Duration::from_millis(10));
                continue;
            };
            s.set_nonblocking(false).unwrap();
            s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
            let mut w = s.try_clone().unwrap();
            let mut r = BufReader::new(s);
            let _ = writeln!(
                w,
                r#"{{"QMP": {{"version": {{"qemu": {{"micro": 0, "minor": 2, "major": 7}}, "package": ""}}, "capabilities": ["oob"]}}}}"#
            );
            let mut line = String::new();
            while !stop.load(Ordering::SeqCst) {
                match r.read_line(&mut line) {
                    Ok(0) => break,
                    Ok(_) => {
                        let cmd: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
                        let a = reply(&cmd);
                        let mut msg = if a.get("error").is_some() {
                            a
                        } else {
                            json!({"return": a})
                        };
                        msg["id"] = cmd["id"].clone();
                        let _ = writeln!(w, "{msg}");
                        line.clear();
                    }
                    Err(_) => {
                        // timeout: events, then check stop
                        for e in events() {
                            let t = json!({"seconds": 0, "microseconds": 0});
                            let _ = writeln!(w, "{}", json!({"event": e, "timestamp": t}));
                        }
                    }
                }
            }
            // Dropping the stream is QEMU going away.
        }
        let _ = std::fs::remove_file(&sock);
    })
}

/// The file name of this test binary: the fake monitors run in it, so admission must allow it
/// as the "QEMU" executable.
pub fn this_executable() -> String {
    std::env::current_exe()
        .unwrap()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned()
}

/// The `[daemon]`, `[discovery]`, `[admission]` and `[host_tracking]` sections of a test daemon:
/// fast rounds, the control socket and QMP scan directory under `dir`, no metrics listener, the
/// emulated host's captured sysfs, this test binary admitted as QEMU, and host tracking pointed
/// at a DAMON directory that does not exist, so no test creates a kdamond on the machine running
/// it (host tracking runs for real in the host e2e).
pub fn daemon_sections(dir: &Path, refresh_interval_ms: u64) -> String {
    let sysfs =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sysfs/emuhost-3node/sys");
    format!(
        r#"
[daemon]
interval_ms = 50
control_socket = "{ctl}"
metrics_listen = ""
sysfs_root = "{sysfs}"
[discovery]
scan_dirs = ["{qmp}"]
scan_interval_ms = 100
refresh_interval_ms = {refresh_interval_ms}
retry_backoff_ms = 100
qmp_timeout_ms = 2000
[admission]
qemu_executables = ["{exe}"]
qemu_uids = [{uid}]
[host_tracking]
damon_root = "{no_damon}"
"#,
        exe = this_executable(),
        // SAFETY: getuid(2) cannot fail and touches no memory.
        uid = unsafe { libc::getuid() },
        ctl = dir.join("ctl.sock").display(),
        sysfs = sysfs.display(),
        qmp = dir.join("qmp").display(),
        no_damon = dir.join("no-damon").display(),
    )
}

/// A fresh directory for one test, `tag`, with `qmp/` in it, on /dev/shm: vtismd takes only
/// channel files on tmpfs or hugetlbfs, as QEMU's shared-memory backends are.
pub fn shm_test_dir(tag: &str) -> PathBuf {
    let shm = Path::new("/dev/shm");
    // SAFETY: statfs is plain data; statfs(2) only writes it.
    let mut sf: libc::statfs = unsafe { std::mem::zeroed() };
    let c = std::ffi::CString::new("/dev/shm").unwrap();
    // SAFETY: a NUL-terminated path and a valid pointer.
    let ok = unsafe { libc::statfs(c.as_ptr(), &mut sf) } == 0;
    assert!(
        ok && sf.f_type as u32 == libc::TMPFS_MAGIC as u32,
        "these tests need /dev/shm on tmpfs"
    );
    let dir = shm.join(format!("vtism-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("qmp")).unwrap();
    dir
}

/// In a fake QEMU: maps `chan` shared and writable, as QEMU maps its ivshmem backend (vtismd
/// takes a channel file only if QEMU maps it). Keep the mapping for the process's life.
pub fn map_like_qemu(chan: &Path) -> ChannelFile {
    ChannelFile::open(chan, u64::MAX, None).unwrap()
}

/// A channel file of `bytes` at `path` whose guest has published one (empty) round, and the
/// test's mapping of it.
pub fn shm_channel(path: &Path, bytes: u64) -> ChannelFile {
    std::fs::File::create(path).unwrap().set_len(bytes).unwrap();
    let map = ChannelFile::open(path, bytes, None).unwrap();
    let region = map.region();
    let mut w = vtism_proto::ChannelWriter::init(&region, vtism_proto::Tracker::Harness).unwrap();
    w.publish(&[], &vtism_proto::RoundMeta::default()).unwrap();
    map
}

/// A child process (a fake QEMU, a spoofer); killed by its pid when dropped.
pub struct Kid(pub Child);

impl Drop for Kid {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A fake QEMU in a child process.
pub type FakeQemu = Kid;

/// In a fake QEMU child: serves until the parent kills it, or on its own for at most two
/// minutes once the parent went away.
pub fn serve_until_killed() {
    let parent = std::os::unix::process::parent_id();
    let end = Instant::now() + Duration::from_secs(120);
    while std::os::unix::process::parent_id() == parent && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The body of a well-behaved fake QEMU child process (see `spawn_qemu`): each test binary that
/// spawns them has a `#[test] fn fake_qemu_process` calling this. Without its environment it
/// returns at once.
pub fn fake_qemu_process() {
    let (Ok(sock), Ok(name), Ok(chan)) = (
        std::env::var("VTISM_FAKE_QEMU_SOCK"),
        std::env::var("VTISM_FAKE_QEMU_NAME"),
        std::env::var("VTISM_FAKE_QEMU_CHAN"),
    ) else {
        return;
    };
    let _backend = map_like_qemu(Path::new(&chan));
    let mut ram = vec![7u8; (RAM_FRAMES as usize + 1) * 4096];
    let hva = (ram.as_mut_ptr() as u64 + 4095) & !4095;
    // The "vCPU": a thread that only sleeps; its id goes to `<sock>.tid` for the parent, which
    // moves it between CPUs.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(unsafe { libc::gettid() });
        loop {
            std::thread::sleep(Duration::from_secs(1));
        }
    });
    let tid = rx.recv().unwrap();
    std::fs::write(format!("{sock}.tid"), tid.to_string()).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let _server = fake_qemu(
        PathBuf::from(sock),
        &name,
        PathBuf::from(chan),
        hva,
        tid,
        stop,
    );
    serve_until_killed();
    drop(ram);
}

/// A fake QEMU named `name` in a child process: this test binary re-run as its test `entry`,
/// told its socket (`<dir>/qmp/<name>.qmp`), name, channel file (`<dir>/<name>.chan`, created
/// here with `chan_bytes`) and `env`. Returns once it listens, with the channel mapped.
pub fn spawn_child(
    dir: &Path,
    name: &str,
    entry: &str,
    env: &[(&str, &str)],
    chan_bytes: u64,
) -> (Kid, PathBuf, ChannelFile) {
    let chan = dir.join(format!("{name}.chan"));
    std::fs::File::create(&chan)
        .unwrap()
        .set_len(chan_bytes)
        .unwrap();
    let sock = dir.join(format!("qmp/{name}.qmp"));
    let child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", entry, "--nocapture", "--test-threads=1"])
        .env("VTISM_FAKE_QEMU_SOCK", &sock)
        .env("VTISM_FAKE_QEMU_NAME", name)
        .env("VTISM_FAKE_QEMU_CHAN", &chan)
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let kid = Kid(child);
    let t = Instant::now();
    while !sock.exists() {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "the fake QEMU {name} did not start"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let map = ChannelFile::open(&chan, chan_bytes, None).unwrap();
    (kid, sock, map)
}

/// As `spawn_child` with a 1 MiB channel.
pub fn spawn_fake_child(
    dir: &Path,
    name: &str,
    entry: &str,
    env: &[(&str, &str)],
) -> (Kid, PathBuf, ChannelFile) {
    spawn_child(dir, name, entry, env, 1 << 20)
}

/// A well-behaved fake QEMU (`fake_qemu_process`) serving `qmp/<name>.qmp` under `dir`, with a
/// channel file of `chan_bytes` and a mapping of it for the test's guest side.
pub fn spawn_qemu(dir: &Path, name: &str, chan_bytes: u64) -> (FakeQemu, MmapRegion, ChannelFile) {
    let (kid, _sock, map) = spawn_child(dir, name, "fake_qemu_process", &[], chan_bytes);
    let region = map.region();
    (kid, region, map)
}
