//! The peer of a QMP socket as /proc shows it: which program it runs, when it started (so a
//! reused pid is told apart), and what memory it really maps. A monitor's claims are only as good
//! as the process behind it, so admission and every refresh check them against this.

use std::io;
use std::path::{Path, PathBuf};
use vtism_proto::Hva;

/// A process running a program: told apart from a later process with the same pid by its start
/// time (field 22 of /proc/<pid>/stat, clock ticks since boot), and from the same process after
/// an execve(2) by the device and inode of its executable (which an upgrade that deletes the
/// binary under it does not change).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcessIdentity {
    pub pid: i32,
    pub start_ticks: u64,
    pub exe_dev: u64,
    pub exe_ino: u64,
}

/// How a process differs from the one admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Changed {
    /// Exited, or its pid now names a newer process.
    Gone,
    /// The same process runs another program (it called execve).
    Exec,
}

impl std::fmt::Display for Changed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Changed::Gone => "QEMU process exited (or its pid now names another)",
            Changed::Exec => "the QEMU process now runs another program (execve)",
        })
    }
}

impl ProcessIdentity {
    /// The process now running under `pid`.
    pub fn of(pid: i32) -> io::Result<ProcessIdentity> {
        Self::of_under(Path::new("/proc"), pid)
    }

    fn of_under(proc_root: &Path, pid: i32) -> io::Result<ProcessIdentity> {
        use std::os::unix::fs::MetadataExt;
        let dir = proc_root.join(pid.to_string());
        let stat = std::fs::read_to_string(dir.join("stat"))?;
        let start_ticks = start_ticks_from_stat(&stat).ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidData, "unreadable /proc/<pid>/stat")
        })?;
        // stat(2) follows the magic link to the program's inode, deleted or not.
        let exe = std::fs::metadata(dir.join("exe"))?;
        Ok(ProcessIdentity {
            pid,
            start_ticks,
            exe_dev: exe.dev(),
            exe_ino: exe.ino(),
        })
    }

    /// Whether the same process still runs under this pid, running the same program: two
    /// reads of /proc, cheap enough for every round.
    pub fn check(&self) -> Result<(), Changed> {
        match Self::of(self.pid) {
            Ok(now) if now == *self => Ok(()),
            Ok(now) if now.start_ticks == self.start_ticks => Err(Changed::Exec),
            _ => Err(Changed::Gone),
        }
    }

    /// The same process still runs under this pid, running the same program.
    pub fn is_current(&self) -> bool {
        self.check().is_ok()
    }
}

/// Field 22 (`starttime`) of /proc/<pid>/stat. The command name may hold spaces and
/// parentheses, so fields are counted after the last `)`.
pub fn start_ticks_from_stat(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    // After ")": field 3 (state) is the first.
    rest.split_whitespace().nth(22 - 3)?.parse().ok()
}

/// The program a process runs (/proc/<pid>/exe). A binary replaced since it started (a package
/// upgrade under a running QEMU) reads as `<path> (deleted)`; the suffix is dropped.
pub fn executable(pid: i32) -> io::Result<PathBuf> {
    let link = std::fs::read_link(format!("/proc/{pid}/exe"))?;
    let s = link.to_string_lossy();
    Ok(match s.strip_suffix(" (deleted)") {
        Some(p) => PathBuf::from(p),
        None => link,
    })
}

/// `pattern` with `*` matching any run of characters (and nothing else special).
pub fn glob_match(pattern: &str, name: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or("");
    let Some(mut rest) = name.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        return rest.is_empty(); // no `*`: exact
    };
    for p in middle {
        match rest.find(p) {
            Some(i) => rest = &rest[i + p.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// One line of /proc/<pid>/maps: `[start, end)` and whether it is readable and writable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Vma {
    pub start: u64,
    pub end: u64,
    pub writable: bool,
}

/// The mappings of /proc/<pid>/maps text, in address order. Lines that do not parse are errors:
/// the kernel writes this file, so anything else means it is not what it claims to be.
pub fn parse_maps(text: &str) -> Result<Vec<Vma>, String> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let bad = || {
            let shown: String = line.chars().take(80).collect();
            format!("maps line {}: `{shown}`", i + 1)
        };
        let mut f = line.split_whitespace();
        let (span, perms) = (f.next().ok_or_else(bad)?, f.next().ok_or_else(bad)?);
        let (a, b) = span.split_once('-').ok_or_else(bad)?;
        let start = u64::from_str_radix(a, 16).map_err(|_| bad())?;
        let end = u64::from_str_radix(b, 16).map_err(|_| bad())?;
        if end <= start || out.last().is_some_and(|l: &Vma| l.end > start) {
            return Err(bad());
        }
        let p = perms.as_bytes();
        out.push(Vma {
            start,
            end,
            writable: p.first() == Some(&b'r') && p.get(1) == Some(&b'w'),
        });
    }
    Ok(out)
}

pub fn read_maps(pid: i32) -> io::Result<Vec<Vma>> {
    // Mapping names are the process's to choose (memfd names), and need not be UTF-8.
    let bytes = std::fs::read(format!("/proc/{pid}/maps"))?;
    parse_maps(&String::from_utf8_lossy(&bytes))
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// Whether the process maps the file with device `major:minor` and inode `ino` shared and
/// writable (`rw-s` in /proc/<pid>/maps): what QEMU does with a `share=on` memory backend.
pub fn maps_file_shared(pid: i32, major: u32, minor: u32, ino: u64) -> io::Result<bool> {
    let bytes = std::fs::read(format!("/proc/{pid}/maps"))?;
    Ok(text_maps_file_shared(
        &String::from_utf8_lossy(&bytes),
        major,
        minor,
        ino,
    ))
}

/// `maps_file_shared` on the text of a maps file. Lines are `start-end perms offset MM:mm inode
/// [path]`; the path (the process's to choose, and ambiguous once deleted) is not looked at.
pub fn text_maps_file_shared(text: &str, major: u32, minor: u32, ino: u64) -> bool {
    text.lines().any(|line| {
        let mut f = line.split_whitespace();
        let (Some(_), Some(perms), Some(_), Some(dev), Some(inode)) =
            (f.next(), f.next(), f.next(), f.next(), f.next())
        else {
            return false;
        };
        let p = perms.as_bytes();
        let shared_rw = p.get(1) == Some(&b'w') && p.get(3) == Some(&b's');
        let same_dev = dev.split_once(':').is_some_and(|(a, b)| {
            u32::from_str_radix(a, 16).ok() == Some(major)
                && u32::from_str_radix(b, 16).ok() == Some(minor)
        });
        shared_rw && same_dev && inode.parse::<u64>().ok() == Some(ino)
    })
}

/// `[hva, hva + len)` lies wholly in readable-writable mappings with no gap (guest RAM is
/// always mapped read-write in QEMU, as one VMA or several adjacent ones).
pub fn covered_rw(vmas: &[Vma], hva: Hva, len: u64) -> bool {
    let Some(end) = hva.0.checked_add(len) else {
        return false;
    };
    let mut at = hva.0;
    let mut i = vmas.partition_point(|v| v.end <= at);
    while at < end {
        match vmas.get(i) {
            Some(v) if v.start <= at && v.writable => {
                at = v.end;
                i += 1;
            }
            _ => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_mapped_shared_and_writable_is_found_by_device_and_inode() {
        let maps = "\
7f0000000000-7f0000100000 rw-s 00000000 00:1a 4242                       /dev/shm/vtism-a.chan
7f0000100000-7f0000200000 r--s 00000000 00:1a 4343                       /dev/shm/ro
7f0000200000-7f0000300000 rw-p 00000000 00:1a 4444                       /dev/shm/private
7f0000300000-7f0000400000 rw-s 00000000 103:02 4545                      /dev/hugepages/x (deleted)
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]
";
        assert!(text_maps_file_shared(maps, 0, 0x1a, 4242));
        assert!(text_maps_file_shared(maps, 0x103, 2, 4545));
        assert!(!text_maps_file_shared(maps, 0, 0x1a, 4343), "read-only");
        assert!(!text_maps_file_shared(maps, 0, 0x1a, 4444), "private");
        assert!(
            !text_maps_file_shared(maps, 0, 0x1b, 4242),
            "another device"
        );
        assert!(!text_maps_file_shared(maps, 0, 0x1a, 42), "another inode");
        assert!(!text_maps_file_shared("garbage\n\n", 0, 0, 0));
    }

    #[test]
    fn start_time_of_this_process_and_a_stat_with_spaces() {
        let me = ProcessIdentity::of(std::process::id() as i32).unwrap();
        assert!(me.start_ticks > 0);
        assert!(me.is_current());
        let later = ProcessIdentity {
            start_ticks: me.start_ticks + 1,
            ..me
        };
        assert_eq!(
            later.check(),
            Err(Changed::Gone),
            "a pid reused by a newer process"
        );
        let exec = ProcessIdentity {
            exe_ino: me.exe_ino + 1,
            ..me
        };
        assert_eq!(
            exec.check(),
            Err(Changed::Exec),
            "the same process after execve"
        );
        use std::os::unix::fs::MetadataExt;
        let bin = std::fs::metadata(std::env::current_exe().unwrap()).unwrap();
        assert_eq!((me.exe_dev, me.exe_ino), (bin.dev(), bin.ino()));
        let stat = "8139 (CPU 0) /TCG) S 1 8139 8139 0 -1 4194624 95 0 0 0 12 3 0 0 20 0 4 0 \
                    3141 2143121408 20380";
        assert_eq!(start_ticks_from_stat(stat), Some(3141));
        assert_eq!(start_ticks_from_stat("1 (a) S 1 2"), None);
        assert!(ProcessIdentity::of(i32::MAX).is_err());
    }

    #[test]
    fn executable_patterns() {
        for (p, n, want) in [
            ("qemu-system-*", "qemu-system-x86_64", true),
            ("qemu-system-*", "qemu-system-", true),
            ("qemu-system-*", "sleep", false),
            ("qemu-system-*", "xqemu-system-x86_64", false),
            ("qemu-kvm", "qemu-kvm", true),
            ("qemu-kvm", "qemu-kvm2", false),
            ("*", "anything", true),
            ("a*b*c", "aXXbYYc", true),
            ("a*b*c", "aXXcYYb", false),
            ("a*a", "a", false),
        ] {
            assert_eq!(glob_match(p, n), want, "{p} vs {n}");
        }
        let exe = executable(std::process::id() as i32).unwrap();
        assert_eq!(exe, std::env::current_exe().unwrap());
    }

    #[test]
    fn maps_parse_and_cover() {
        let text = "7f0000000000-7f0000200000 rw-p 00000000 00:00 0 \n\
                    7f0000200000-7f0000400000 rw-s 00000000 00:05 42   /memfd:m0 (deleted)\n\
                    7f0000400000-7f0000401000 r--p 00000000 08:01 7    /usr/lib/x.so\n\
                    7f0000500000-7f0000600000 rw-p 00000000 00:00 0\n";
        let v = parse_maps(text).unwrap();
        assert_eq!(v.len(), 4);
        assert!(covered_rw(&v, Hva(0x7f00_0000_0000), 0x40_0000), "two VMAs");
        assert!(
            !covered_rw(&v, Hva(0x7f00_0000_0000), 0x40_1000),
            "read-only"
        );
        assert!(!covered_rw(&v, Hva(0x7f00_0040_1000), 0x1000), "a gap");
        assert!(
            !covered_rw(&v, Hva(0x7f00_0050_0000), 0x10_1000),
            "past the end"
        );
        assert!(!covered_rw(&v, Hva(u64::MAX - 10), 0x1000), "overflow");
        assert!(covered_rw(&v, Hva(0x7f00_0050_0000), 0));
        assert!(parse_maps("zz-10 rw-p").is_err());
        assert!(parse_maps("20-10 rw-p").is_err());
        assert!(parse_maps("0-20 rw-p\n10-30 rw-p").is_err(), "overlapping");
        // Found by the qmp_reply fuzz target: an error message cut inside a character.
        let e = parse_maps(&format!("{}\u{fffd}x", "z".repeat(78))).unwrap_err();
        assert!(e.contains('\u{fffd}'), "{e}");
        let x = vec![1u8; 1 << 20];
        let mine = read_maps(std::process::id() as i32).unwrap();
        let start = x.as_ptr() as u64;
        assert!(covered_rw(&mine, Hva(start), x.len() as u64));
    }
}
