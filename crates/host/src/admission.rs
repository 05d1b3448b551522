//! Who may be a VM: the peer of a discovered QMP socket must be a QEMU process (executable and
//! uid from the configuration), the RAM it claims must be mapped read-write in that process and
//! no larger than the host could hold, and the directories scanned for sockets should be
//! writable by the admins only. Refusals are counted by reason and logged at a bounded rate.

use crate::config::{AdmissionConfig, UnsafeDirPolicy};
use crate::process::{self, ProcessIdentity};
use crate::vm::{self, VmInfo};
use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use thiserror::Error;
use tracing::{debug, warn};

/// Why a socket was not taken as a VM.
#[derive(Debug, Error)]
pub enum Refusal {
    #[error("peer pid {pid} runs {exe}, not an allowed QEMU executable ({allowed})")]
    NotQemu {
        pid: i32,
        exe: String,
        allowed: String,
    },
    #[error("peer pid {pid} runs as uid {uid}, not one of admission.qemu_uids ({allowed:?})")]
    Uid {
        pid: i32,
        uid: u32,
        allowed: Vec<u32>,
    },
    #[error("peer pid {pid}: {what}")]
    Process { pid: i32, what: String },
    #[error(
        "QEMU pid {pid} claims {claimed_mib} MiB of RAM, more than the {limit_mib} MiB allowed"
    )]
    RamTooLarge {
        pid: i32,
        claimed_mib: u64,
        limit_mib: u64,
    },
    #[error(
        "QEMU pid {pid} claims {claimed_mib} MiB of RAM; with the {managed_mib} MiB of the VMs \
         managed that is more than admission.max_total_ram_gib allows ({limit_mib} MiB)"
    )]
    RamOverHost {
        pid: i32,
        claimed_mib: u64,
        managed_mib: u64,
        limit_mib: u64,
    },
    #[error("QEMU pid {pid}: {source}")]
    Memory { pid: i32, source: vm::InspectError },
    #[error("QEMU pid {pid} describes its memory inconsistently: {source}")]
    MemoryMap { pid: i32, source: vm::InspectError },
    #[error("QEMU pid {pid} exited or its pid was reused during the attach")]
    PidChanged { pid: i32 },
    #[error("QEMU pid {pid} matches the [[vm]] entry `{entry}`, which VM {holder} has: one live VM per entry")]
    EntryInUse {
        pid: i32,
        entry: String,
        holder: String,
    },
}

impl Refusal {
    /// Every reason's label, for metrics that show the zeros too.
    pub const LABELS: [&'static str; 9] = [
        "not_qemu",
        "uid",
        "process",
        "ram_too_large",
        "ram_over_host",
        "ram_not_mapped",
        "bad_memory_map",
        "pid_changed",
        "entry_in_use",
    ];

    /// The reason as a metric label.
    pub fn label(&self) -> &'static str {
        match self {
            Refusal::NotQemu { .. } => "not_qemu",
            Refusal::Uid { .. } => "uid",
            Refusal::Process { .. } => "process",
            Refusal::RamTooLarge { .. } => "ram_too_large",
            Refusal::RamOverHost { .. } => "ram_over_host",
            Refusal::Memory { .. } => "ram_not_mapped",
            Refusal::MemoryMap { .. } => "bad_memory_map",
            Refusal::PidChanged { .. } => "pid_changed",
            Refusal::EntryInUse { .. } => "entry_in_use",
        }
    }
}

/// The admission rules, resolved from the configuration, the host's RAM and /etc/passwd (the
/// attach and refresh threads get a copy).
#[derive(Clone, Debug)]
pub struct Rules {
    pub executables: Vec<String>,
    pub uids: Vec<u32>,
    pub max_ram_bytes: u64,
    /// The RAM of all managed VMs together (`admission.max_total_ram_gib`).
    pub max_total_ram_bytes: u64,
}

impl Rules {
    /// `passwd` is the text of /etc/passwd, read only when `qemu_uids` is not set.
    pub fn new(
        cfg: &AdmissionConfig,
        host_ram_bytes: u64,
        passwd: impl FnOnce() -> String,
    ) -> Rules {
        Rules {
            executables: cfg.qemu_executables.clone(),
            uids: if cfg.qemu_uids.is_empty() {
                qemu_users(&passwd())
            } else {
                cfg.qemu_uids.clone()
            },
            max_ram_bytes: match cfg.max_vm_ram_gib {
                0 => host_ram_bytes,
                g => g << 30,
            },
            max_total_ram_bytes: match cfg.max_total_ram_gib {
                0 => host_ram_bytes,
                g => g << 30,
            },
        }
    }

    /// A VM claiming `bytes` of RAM beside `managed` bytes of the VMs managed already: each VM
    /// costs the daemon 4 bytes per frame and a placement sweep, so what all VMs claim together
    /// is bounded by what the host could hold.
    pub fn check_total(&self, pid: i32, bytes: u64, managed: u64) -> Result<(), Refusal> {
        if managed.saturating_add(bytes) > self.max_total_ram_bytes {
            return Err(Refusal::RamOverHost {
                pid,
                claimed_mib: bytes >> 20,
                managed_mib: managed >> 20,
                limit_mib: self.max_total_ram_bytes >> 20,
            });
        }
        Ok(())
    }

    /// The peer (pid and uid from SO_PEERCRED) before a word of QMP is exchanged with it.
    pub fn check_peer(&self, pid: i32, uid: u32) -> Result<ProcessIdentity, Refusal> {
        let gone = |e: std::io::Error| Refusal::Process {
            pid,
            what: e.to_string(),
        };
        let identity = ProcessIdentity::of(pid).map_err(gone)?;
        let exe = process::executable(pid).map_err(gone)?;
        let base = exe
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let full = exe.to_string_lossy();
        if !self.executables.iter().any(|p| {
            let name: &str = if p.starts_with('/') { &full } else { &base };
            process::glob_match(p, name)
        }) {
            return Err(Refusal::NotQemu {
                pid,
                exe: exe.display().to_string(),
                allowed: self.executables.join(", "),
            });
        }
        if !self.uids.contains(&uid) {
            return Err(Refusal::Uid {
                pid,
                uid,
                allowed: self.uids.clone(),
            });
        }
        Ok(identity)
    }

    /// What QEMU said about its RAM, against the process: the same process still (no pid
    /// reuse during the exchange), RAM within the bound, every range mapped read-write.
    pub fn check_memory(&self, id: &ProcessIdentity, info: &VmInfo) -> Result<(), Refusal> {
        let pid = id.pid;
        let bytes = info.memory.bytes();
        if bytes > self.max_ram_bytes {
            return Err(Refusal::RamTooLarge {
                pid,
                claimed_mib: bytes >> 20,
                limit_mib: self.max_ram_bytes >> 20,
            });
        }
        let vmas = process::read_maps(pid).map_err(|e| Refusal::Process {
            pid,
            what: format!("/proc/{pid}/maps: {e}"),
        })?;
        vm::check_mapped(&info.memory, &vmas).map_err(|source| Refusal::Memory { pid, source })?;
        if !id.is_current() {
            return Err(Refusal::PidChanged { pid });
        }
        Ok(())
    }
}

/// The rules in force: resolved when a configuration is applied, and again when /etc/passwd
/// changes while `admission.qemu_uids` is not set (libvirt installed after vtismd started), not
/// at every scan and refresh.
pub struct RulesInForce {
    cfg: AdmissionConfig,
    host_ram_bytes: u64,
    passwd: PathBuf,
    stamp: Option<FileStamp>,
    rules: Rules,
}

/// What tells a file changed without reading it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FileStamp {
    ino: u64,
    len: u64,
    mtime_ns: i128,
}

impl FileStamp {
    fn of(path: &Path) -> Option<FileStamp> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(path).ok()?;
        Some(FileStamp {
            ino: m.ino(),
            len: m.len(),
            mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
        })
    }
}

impl RulesInForce {
    pub fn new(cfg: &AdmissionConfig) -> RulesInForce {
        RulesInForce::with_passwd(cfg, host_ram_bytes(), PathBuf::from("/etc/passwd"))
    }

    pub fn with_passwd(cfg: &AdmissionConfig, host_ram_bytes: u64, passwd: PathBuf) -> Self {
        let stamp = FileStamp::of(&passwd);
        let rules = Rules::new(cfg, host_ram_bytes, || read_or_empty(&passwd));
        RulesInForce {
            cfg: cfg.clone(),
            host_ram_bytes,
            passwd,
            stamp,
            rules,
        }
    }

    /// A new configuration's rules.
    pub fn apply(&mut self, cfg: &AdmissionConfig) {
        *self = RulesInForce::with_passwd(cfg, self.host_ram_bytes, self.passwd.clone());
    }

    /// Resolves the default uids again if /etc/passwd changed since; returns whether it did.
    pub fn refresh(&mut self) -> bool {
        if !self.cfg.qemu_uids.is_empty() {
            return false;
        }
        let stamp = FileStamp::of(&self.passwd);
        if stamp == self.stamp {
            return false;
        }
        self.stamp = stamp;
        self.rules.uids = qemu_users(&read_or_empty(&self.passwd));
        debug!(uids = ?self.rules.uids, "admission: QEMU's users read again from {}", self.passwd.display());
        true
    }

    pub fn get(&self) -> &Rules {
        &self.rules
    }
}

fn read_or_empty(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// The users QEMU runs as where `admission.qemu_uids` is not set: root, and the accounts
/// libvirt's packages create for it (`libvirt-qemu` on Debian and Ubuntu, `qemu` on Fedora and
/// RHEL) found in `passwd` (the text of /etc/passwd).
pub fn qemu_users(passwd: &str) -> Vec<u32> {
    let mut uids = vec![0];
    for line in passwd.lines() {
        let mut f = line.split(':');
        let (Some(name), Some(_), Some(uid)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        if matches!(name, "libvirt-qemu" | "qemu") {
            if let Ok(u) = uid.parse::<u32>() {
                if !uids.contains(&u) {
                    uids.push(u);
                }
            }
        }
    }
    uids
}

/// The host's RAM (MemTotal of /proc/meminfo), the default bound of a VM's RAM claim.
pub fn host_ram_bytes() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(u64::MAX, |kib| kib << 10)
}

/// Why a scan directory is open to others than the admins (root and `admin_gids`), if it is.
pub fn dir_exposure(meta: &std::fs::Metadata, admin_gids: &[u32]) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let mode = meta.mode();
    if meta.uid() != 0 {
        return Some(format!("owned by uid {}", meta.uid()));
    }
    if mode & 0o002 != 0 {
        return Some("writable by everyone".into());
    }
    if mode & 0o020 != 0 && meta.gid() != 0 && !admin_gids.contains(&meta.gid()) {
        return Some(format!(
            "writable by group {} (not in admission.admin_gids)",
            meta.gid()
        ));
    }
    None
}

/// May `dir` be scanned? Exposed directories are logged once each; with `refuse` they are
/// skipped.
pub fn scan_allowed(
    dir: &Path,
    cfg: &AdmissionConfig,
    warned: &mut HashSet<PathBuf>,
    counts: &mut Counts,
) -> bool {
    let Ok(meta) = std::fs::metadata(dir) else {
        return true; // missing: nothing to scan
    };
    let Some(why) = dir_exposure(&meta, &cfg.admin_gids) else {
        return true;
    };
    let refuse = cfg.unsafe_scan_dir == UnsafeDirPolicy::Refuse;
    if warned.len() < 4096 && warned.insert(dir.to_path_buf()) {
        counts.unsafe_dirs += 1;
        warn!(
            dir = %dir.display(), problem = %why, refused = refuse,
            "scan directory is writable by others than the admins: anyone who can write there can offer a socket"
        );
    }
    !refuse
}

/// What admission refused, by reason, and the scan limits that held sockets back.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub refused: BTreeMap<&'static str, u64>,
    /// Attaches that failed (no answer, bad QMP, a monitor that is not QEMU's).
    pub failed: u64,
    /// Sockets left for a later scan: the queue was full or `max_vms` reached.
    pub deferred: u64,
    /// Scan directories found writable by others than the admins.
    pub unsafe_dirs: u64,
}

/// One log line per socket and reason, and at most `per_minute` lines a minute in all: a
/// directory of a thousand silent sockets gives a few lines and a count, not a flood.
pub struct RefusalLog {
    seen: BTreeMap<PathBuf, String>,
    window_start: Instant,
    in_window: u32,
    suppressed: u64,
    per_minute: u32,
}

impl Default for RefusalLog {
    fn default() -> Self {
        RefusalLog {
            seen: BTreeMap::new(),
            window_start: Instant::now(),
            in_window: 0,
            suppressed: 0,
            per_minute: 20,
        }
    }
}

impl RefusalLog {
    /// Logs `what` for `socket` unless it was the last thing logged for it or the minute's
    /// lines are used up. True if a line was written.
    pub fn log(&mut self, socket: &Path, label: &str, what: &str) -> bool {
        if self.seen.get(socket).is_some_and(|l| l == label) {
            debug!(socket = %socket.display(), reason = label, error = %what, "socket refused again");
            return false;
        }
        if self.seen.len() >= 65536 {
            self.seen.clear();
        }
        self.seen.insert(socket.to_path_buf(), label.to_string());
        if self.window_start.elapsed() >= Duration::from_secs(60) {
            if self.suppressed > 0 {
                warn!(
                    count = self.suppressed,
                    "more sockets refused in the last minute (not logged one by one)"
                );
            }
            self.window_start = Instant::now();
            self.in_window = 0;
            self.suppressed = 0;
        }
        if self.in_window >= self.per_minute {
            self.suppressed += 1;
            return false;
        }
        self.in_window += 1;
        warn!(socket = %socket.display(), reason = label, error = %what, "socket not taken as a VM; will retry");
        true
    }

    /// The socket is gone or managed: a later refusal is news again.
    pub fn forget(&mut self, socket: &Path) {
        self.seen.remove(socket);
    }

    /// Sockets no longer present are forgotten, so the log's memory follows the directory.
    pub fn retain(&mut self, present: &HashSet<PathBuf>) {
        self.seen.retain(|p, _| present.contains(p));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn this_test_binary_is_not_qemu() {
        let me = std::process::id() as i32;
        let uid = std::fs::metadata("/proc/self").map_or(0, |m| {
            use std::os::unix::fs::MetadataExt;
            m.uid()
        });
        let rules = Rules::new(&AdmissionConfig::default(), 1 << 30, String::new);
        let e = rules.check_peer(me, uid).unwrap_err();
        assert_eq!(e.label(), "not_qemu", "{e}");
        let path = std::env::current_exe().unwrap();
        let name = path.file_name().unwrap().to_string_lossy();
        let allowed = Rules {
            executables: vec![name.into_owned()],
            uids: vec![uid],
            ..rules.clone()
        };
        assert!(allowed.check_peer(me, uid).is_ok());
        // A full path pins the program's place, not only its name.
        let dir = path.parent().unwrap().display();
        for (pattern, ok) in [
            (format!("{}", path.display()), true),
            (format!("{dir}/*"), true),
            ("/usr/bin/vtism*".to_string(), false),
            (format!("{dir}x/*"), false),
        ] {
            let r = Rules {
                executables: vec![pattern.clone()],
                ..allowed.clone()
            };
            assert_eq!(r.check_peer(me, uid).is_ok(), ok, "{pattern}");
        }
        let other_uid = Rules {
            uids: vec![uid + 1],
            ..allowed.clone()
        };
        assert_eq!(other_uid.check_peer(me, uid).unwrap_err().label(), "uid");
        assert_eq!(
            allowed.check_peer(i32::MAX, uid).unwrap_err().label(),
            "process"
        );
    }

    #[test]
    fn qemu_runs_as_root_or_its_packages_user_by_default() {
        let passwd = "root:x:0:0:root:/root:/bin/bash\n\
                      daemon:x:1:1::/usr/sbin:/usr/sbin/nologin\n\
                      libvirt-qemu:x:64055:108:Libvirt Qemu,,,:/var/lib/libvirt:/usr/sbin/nologin\n\
                      user:x:1000:1000::/home/user:/bin/bash\n\
                      garbage\n";
        assert_eq!(qemu_users(passwd), vec![0, 64055]);
        assert_eq!(
            qemu_users("qemu:x:107:107::/:/sbin/nologin\n"),
            vec![0, 107]
        );
        assert_eq!(qemu_users(""), vec![0]);
        let e = Refusal::Uid {
            pid: 1,
            uid: 1000,
            allowed: qemu_users(passwd),
        };
        assert!(e.to_string().contains("[0, 64055]"), "{e}");
    }

    #[test]
    fn default_uids_follow_etc_passwd_without_reading_it_each_time() {
        let d = std::env::temp_dir().join(format!("vtism-passwd-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let passwd = d.join("passwd");
        std::fs::write(&passwd, "root:x:0:0::/root:/bin/sh\n").unwrap();
        let mut r = RulesInForce::with_passwd(&AdmissionConfig::default(), 1 << 30, passwd.clone());
        assert_eq!(r.get().uids, vec![0]);
        assert!(!r.refresh(), "unchanged: not read again");
        // libvirt's package adds its user after vtismd started
        std::fs::write(
            &passwd,
            "root:x:0:0::/root:/bin/sh\nlibvirt-qemu:x:64055:108::/:/usr/sbin/nologin\n",
        )
        .unwrap();
        assert!(r.refresh());
        assert_eq!(r.get().uids, vec![0, 64055]);
        // configured uids are the configuration's, whatever /etc/passwd says
        let cfg = AdmissionConfig {
            qemu_uids: vec![107],
            ..AdmissionConfig::default()
        };
        r.apply(&cfg);
        std::fs::write(&passwd, "qemu:x:108:108::/:/sbin/nologin\n").unwrap();
        assert!(!r.refresh());
        assert_eq!(r.get().uids, vec![107]);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn scan_directory_exposure() {
        let d = std::env::temp_dir().join(format!("vtism-admission-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let set = |m: u32| std::fs::set_permissions(&d, std::fs::Permissions::from_mode(m));
        let meta = || std::fs::metadata(&d).unwrap();
        let owned_by_root = {
            use std::os::unix::fs::MetadataExt;
            meta().uid() == 0
        };
        set(0o755).unwrap();
        if owned_by_root {
            assert_eq!(dir_exposure(&meta(), &[]), None);
            set(0o777).unwrap();
            assert_eq!(
                dir_exposure(&meta(), &[]).as_deref(),
                Some("writable by everyone")
            );
            let mut cfg = AdmissionConfig::default();
            let mut warned = HashSet::new();
            let mut counts = Counts::default();
            assert!(scan_allowed(&d, &cfg, &mut warned, &mut counts), "warn");
            assert!(scan_allowed(&d, &cfg, &mut warned, &mut counts));
            assert_eq!(counts.unsafe_dirs, 1, "logged once");
            cfg.unsafe_scan_dir = UnsafeDirPolicy::Refuse;
            assert!(!scan_allowed(&d, &cfg, &mut warned, &mut counts));
        } else {
            assert!(dir_exposure(&meta(), &[]).is_some(), "not root's");
        }
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn the_ram_of_all_vms_is_bounded() {
        use crate::config::Config;
        let host = 24u64 << 30;
        let by_default = Rules::new(&Config::parse("").unwrap().admission, host, String::new);
        assert_eq!(by_default.max_total_ram_bytes, host);
        // 16 claims of 22 GiB (issue 24): the first fits, the second does not.
        assert!(by_default.check_total(1, 22 << 30, 0).is_ok());
        let r = by_default.check_total(2, 22 << 30, 22 << 30).unwrap_err();
        assert_eq!(r.label(), "ram_over_host");
        assert!(r.to_string().contains("admission.max_total_ram_gib"), "{r}");
        assert!(by_default.check_total(3, 2 << 30, 22 << 30).is_ok());
        // An overcommitting host says so; a huge claim does not wrap the sum.
        let cfg = Config::parse("[admission]\nmax_total_ram_gib = 96\n").unwrap();
        let rules = Rules::new(&cfg.admission, host, String::new);
        assert!(rules.check_total(4, 22 << 30, 66 << 30).is_ok());
        assert!(rules.check_total(5, u64::MAX, 1).is_err());
        let bad = Config::parse("[admission]\nmax_total_ram_gib = 99999999\n").unwrap_err();
        assert!(
            format!("{bad:#}").contains("admission.max_total_ram_gib"),
            "{bad:#}"
        );
    }

    #[test]
    fn admission_settings_are_bounded_and_named_when_wrong() {
        use crate::config::Config;
        let cfg = Config::parse("").unwrap();
        assert_eq!(cfg.admission, AdmissionConfig::default());
        let ok = Config::parse(
            "[admission]\nqemu_executables = [\"qemu-system-x86_64\"]\nqemu_uids = [64055]\n\
             unsafe_scan_dir = \"refuse\"\nmax_vm_ram_gib = 512\n",
        )
        .unwrap();
        assert_eq!(ok.admission.unsafe_scan_dir, UnsafeDirPolicy::Refuse);
        assert_eq!(
            Rules::new(&ok.admission, 1 << 30, String::new).max_ram_bytes,
            512 << 30
        );
        assert_eq!(
            Rules::new(&cfg.admission, 1 << 30, String::new).max_ram_bytes,
            1 << 30
        );
        for (text, field) in [
            (
                "qemu_executables = [\"usr/bin/qemu\"]",
                "admission.qemu_executables",
            ),
            (
                "qemu_executables = [\"/usr/*/qemu\"]",
                "admission.qemu_executables",
            ),
            (
                "qemu_executables = [\"/usr/bin/*\"]",
                "admission.qemu_executables",
            ),
            (
                "qemu_executables = [\"/usr/bin/\"]",
                "admission.qemu_executables",
            ),
            ("qemu_executables = [\"\"]", "admission.qemu_executables"),
            ("qemu_executables = []", "admission.qemu_executables"),
            ("qemu_executables = [\"*\"]", "admission.qemu_executables"),
            (
                "qemu_executables = [\"qemu-kvm\", \"?*\"]",
                "admission.qemu_executables",
            ),
            ("max_vms = 0", "admission.max_vms"),
            ("attach_threads = 1000", "admission.attach_threads"),
            ("max_pending_sockets = 0", "admission.max_pending_sockets"),
            ("qmp_max_reply_kib = 1", "admission.qmp_max_reply_kib"),
            (
                "qmp_exchange_timeout_ms = 100",
                "admission.qmp_exchange_timeout_ms",
            ),
            ("max_vm_ram_gib = 99999999", "admission.max_vm_ram_gib"),
        ] {
            let e = Config::parse(&format!("[admission]\n{text}\n")).unwrap_err();
            assert_eq!(e.field(), Some(field), "{text}: {e}");
        }
        assert!(Config::parse("[admission]\nunsafe_scan_dir = \"maybe\"\n").is_err());
        let full =
            "[admission]\nqemu_executables = [\"/opt/qemu/bin/qemu-system-*\", \"qemu-kvm\"]\n";
        assert!(Config::parse(full).is_ok());
    }

    #[test]
    fn refusals_are_logged_once_each_and_at_a_bounded_rate() {
        let mut log = RefusalLog::default();
        let a = Path::new("/run/x/a.qmp");
        assert!(log.log(a, "not_qemu", "sleep"));
        assert!(!log.log(a, "not_qemu", "sleep"), "same socket, same reason");
        assert!(log.log(a, "qmp", "timed out"), "a new reason is news");
        let written = (0..1000)
            .filter(|i| log.log(Path::new(&format!("/run/x/{i}.qmp")), "qmp", "silent"))
            .count();
        assert_eq!(written, 18, "20 lines a minute in all");
        assert_eq!(log.suppressed, 982);
        log.retain(&HashSet::new());
        assert!(log.seen.is_empty());
    }
}
