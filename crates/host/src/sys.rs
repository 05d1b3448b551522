//! Every system call the daemon makes, in one place, each behind a safe wrapper.
//!
//! Uses the `libc` crate directly: it has the syscall numbers and constants for every
//! architecture, and neither `nix` nor `rustix` wraps move_pages(2) or process_madvise(2).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use vtism_proto::Hva;

/// `MPOL_MF_MOVE`: move pages mapped only by this process.
pub const MPOL_MF_MOVE: i32 = 1 << 1;
/// `MPOL_MF_MOVE_ALL`: also pages shared with other processes (needs CAP_SYS_NICE).
pub const MPOL_MF_MOVE_ALL: i32 = 1 << 2;

/// Pid of the peer of a connected Unix socket (SO_PEERCRED): the QEMU pid.
pub fn peer_pid(sock: &UnixStream) -> io::Result<i32> {
    peer_cred(sock).map(|(pid, _)| pid)
}

/// Pid and uid of the peer of a connected Unix socket (SO_PEERCRED).
pub fn peer_cred(sock: &UnixStream) -> io::Result<(i32, u32)> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are valid for writes of the sizes passed.
    let r = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    if cred.pid <= 0 {
        return Err(io::Error::other(
            "SO_PEERCRED gave no pid (peer in another pid namespace?)",
        ));
    }
    Ok((cred.pid, cred.uid))
}

/// Connects to a Unix stream socket without waiting: a listener whose backlog is full (one that
/// never accepts) fails at once with `WouldBlock` instead of holding the caller.
pub fn connect_unix_now(path: &Path) -> io::Result<UnixStream> {
    use std::os::unix::ffi::OsStrExt;
    let bytes = path.as_os_str().as_bytes();
    // SAFETY: sockaddr_un is plain data; zeroed is a valid empty address.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "socket path too long",
        ));
    }
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    // SAFETY: plain syscall with integer arguments.
    let fd = unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            0,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a new fd that nothing else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    let len = (std::mem::size_of::<libc::sa_family_t>() + bytes.len()) as libc::socklen_t;
    // SAFETY: `addr` is a valid sockaddr_un and `len` covers only its initialised part.
    let r = unsafe {
        libc::connect(
            sock.as_raw_fd(),
            (&addr as *const libc::sockaddr_un).cast(),
            len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    let s = UnixStream::from(sock);
    s.set_nonblocking(false)?;
    Ok(s)
}

/// poll(2) over `fds` for at most `timeout`, retried on EINTR; sets each `revents`. Returns how
/// many descriptors are ready.
pub fn poll(fds: &mut [libc::pollfd], timeout: std::time::Duration) -> io::Result<usize> {
    let ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
    loop {
        // SAFETY: `fds` is a valid array of `fds.len()` pollfd structs that the kernel writes
        // only the `revents` of.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        if r >= 0 {
            return Ok(r as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// move_pages(2) on another process. `nodes = None` only queries where the pages are.
/// `status[i]` receives the node of page i, or a negative errno. Returns the syscall's result:
/// `Ok(n)` with n the number of pages not moved (>= 0), or the errno of a whole-call failure.
pub fn move_pages(
    pid: i32,
    pages: &[Hva],
    nodes: Option<&[i32]>,
    status: &mut [i32],
    flags: i32,
) -> io::Result<usize> {
    if status.len() < pages.len() || nodes.is_some_and(|n| n.len() < pages.len()) {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "short array"));
    }
    if pages.is_empty() {
        return Ok(0);
    }
    // SAFETY: the arrays hold `pages.len()` elements each (checked above), and `Hva` is a
    // transparent `u64`, the address array the kernel expects; the kernel only reads
    // `pages`/`nodes` and writes `status`. The addresses are in the other process and are never
    // dereferenced here.
    let r = unsafe {
        libc::syscall(
            libc::SYS_move_pages,
            pid as libc::c_long,
            pages.len() as libc::c_ulong,
            pages.as_ptr(),
            nodes.map_or(std::ptr::null(), |n| n.as_ptr()),
            status.as_mut_ptr(),
            flags as libc::c_long,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

/// A pidfd for a process (pidfd_open(2), Linux >= 5.3).
pub fn pidfd_open(pid: i32) -> io::Result<OwnedFd> {
    // SAFETY: plain syscall with integer arguments.
    let r = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::c_long, 0 as libc::c_long) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(r as RawFd) })
}

/// process_madvise(2) with MADV_COLD over `ranges` (address, length) of the process behind
/// `pidfd`. Returns bytes advised.
pub fn madvise_cold(pidfd: &OwnedFd, ranges: &[(Hva, u64)]) -> io::Result<usize> {
    let iov: Vec<libc::iovec> = ranges
        .iter()
        .map(|&(a, l)| libc::iovec {
            iov_base: a.0 as usize as *mut libc::c_void,
            iov_len: l as usize,
        })
        .collect();
    let mut done = 0usize;
    // UIO_MAXIOV is 1024.
    for chunk in iov.chunks(1024) {
        // SAFETY: `chunk` is a valid iovec array; the addresses are in the other process and the
        // kernel validates them; nothing in this process is written.
        let r = unsafe {
            libc::syscall(
                libc::SYS_process_madvise,
                pidfd.as_raw_fd() as libc::c_long,
                chunk.as_ptr(),
                chunk.len() as libc::c_ulong,
                libc::MADV_COLD as libc::c_long,
                0 as libc::c_ulong,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        done += r as usize;
    }
    Ok(done)
}

/// Pins the calling thread to `cpus` (sched_setaffinity(2)).
pub fn pin_current_thread(cpus: &[u32]) -> io::Result<()> {
    if cpus.is_empty() {
        return Ok(());
    }
    // SAFETY: cpu_set_t is plain data; zeroed is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cpus {
        if (c as usize) < libc::CPU_SETSIZE as usize {
            // SAFETY: index checked against CPU_SETSIZE.
            unsafe { libc::CPU_SET(c as usize, &mut set) };
        }
    }
    // SAFETY: `set` is a valid cpu_set_t of the size passed; 0 = the calling thread.
    let r = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Lowers the calling thread's priority by `by` nice levels, to at most 19 (Linux keeps a nice
/// value per thread, and `who` 0 is the calling one; lowering needs no privilege).
pub fn lower_current_thread_priority(by: i32) -> io::Result<()> {
    // SAFETY: plain integer arguments; who 0 is the calling thread.
    let now = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
    // SAFETY: as above.
    let r = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, (now + by).min(19)) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// True if the process exists (signal 0).
pub fn process_alive(pid: i32) -> bool {
    // SAFETY: signal 0 checks existence and permission only.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// CPU time (user + system) this process has used, in seconds.
pub fn process_cpu_seconds() -> f64 {
    // SAFETY: rusage is plain data and getrusage only writes it.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer to a rusage.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return 0.0;
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// CPU time of the calling thread, in seconds (CLOCK_THREAD_CPUTIME_ID).
pub fn thread_cpu_seconds() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid pointer to a timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

/// Signals the daemon reacts to, turned into flags by an async-signal-safe handler.
pub mod signals {
    use std::sync::atomic::{AtomicBool, Ordering};

    pub static HUP: AtomicBool = AtomicBool::new(false);
    pub static TERM: AtomicBool = AtomicBool::new(false);

    extern "C" fn on_hup(_: libc::c_int) {
        HUP.store(true, Ordering::SeqCst);
    }
    extern "C" fn on_term(_: libc::c_int) {
        TERM.store(true, Ordering::SeqCst);
    }

    /// Installs handlers for SIGHUP (reload) and SIGTERM/SIGINT (stop); ignores SIGPIPE.
    pub fn install() {
        // SAFETY: the handlers only store to atomics, which is async-signal-safe.
        unsafe {
            libc::signal(libc::SIGHUP, on_hup as *const () as usize);
            libc::signal(libc::SIGTERM, on_term as *const () as usize);
            libc::signal(libc::SIGINT, on_term as *const () as usize);
            libc::signal(libc::SIGPIPE, libc::SIG_IGN);
        }
    }

    pub fn take_hup() -> bool {
        HUP.swap(false, Ordering::SeqCst)
    }
    pub fn term() -> bool {
        TERM.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::channel_file::ChannelFile;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn channel_file_must_belong_to_qemus_user() {
        let p = std::env::temp_dir().join(format!("vtism-owner-{}.chan", std::process::id()));
        std::fs::File::create(&p).unwrap().set_len(8192).unwrap();
        let mine = std::fs::metadata(&p).unwrap().uid();
        let other = if mine == 4242 { 4243 } else { 4242 };
        let e = ChannelFile::open(&p, 1 << 20, Some(other)).err().unwrap();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
        let m = ChannelFile::open(&p, 1 << 20, Some(mine)).unwrap();
        assert_eq!(m.len(), 8192);
        // A root QEMU may name any file; no owner check for paths from the configuration.
        assert!(ChannelFile::open(&p, 1 << 20, Some(0)).is_ok());
        assert_eq!(ChannelFile::open(&p, 4096, None).unwrap().len(), 4096);
        std::fs::File::create(&p).unwrap().set_len(100).unwrap();
        assert!(
            ChannelFile::open(&p, 1 << 20, None).is_err(),
            "smaller than a header page"
        );
        let _ = std::fs::remove_file(&p);
        assert!(ChannelFile::open(Path::new("/proc/self/status"), 1 << 20, None).is_err());
    }

    /// IN_OPEN events on `path` while `f` runs: what the kernel saw opened for I/O (an O_PATH
    /// descriptor is no open in this sense: no driver or FIFO code runs).
    fn opens_during(path: &Path, f: impl FnOnce()) -> usize {
        use std::os::unix::ffi::OsStrExt;
        let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
        // SAFETY: plain syscalls; the buffer is valid for its length.
        unsafe {
            let fd = libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC);
            assert!(fd >= 0);
            let fd = OwnedFd::from_raw_fd(fd);
            assert!(libc::inotify_add_watch(fd.as_raw_fd(), c.as_ptr(), libc::IN_OPEN) >= 0);
            f();
            let mut buf = [0u8; 4096];
            let n = libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len());
            if n <= 0 {
                0
            } else {
                n as usize / std::mem::size_of::<libc::inotify_event>()
            }
        }
    }

    #[test]
    fn mem_path_is_checked_before_it_is_opened() {
        let dir = std::env::temp_dir().join(format!("vtism-mempath-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let real = dir.join("real.chan");
        std::fs::File::create(&real).unwrap().set_len(8192).unwrap();
        let mine = std::fs::metadata(&real).unwrap().uid();
        // A FIFO stands for a device: opening it for I/O is an effect in itself.
        let fifo = dir.join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid C string.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let opens = opens_during(&fifo, || {
            let e = ChannelFile::open(&fifo, 1 << 20, Some(mine)).err().unwrap();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
        });
        assert_eq!(opens, 0, "the FIFO was opened before its type was checked");
        // The check can see an open: a regular file's open is one.
        let opens = opens_during(&real, || {
            ChannelFile::open(&real, 1 << 20, Some(mine)).unwrap();
        });
        assert!(opens >= 1);
        // A symlink, even to an acceptable file, is not followed.
        let link = dir.join("link.chan");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let opens = opens_during(&real, || {
            assert!(ChannelFile::open(&link, 1 << 20, Some(mine)).is_err());
        });
        assert_eq!(opens, 0);
        assert!(ChannelFile::open(Path::new("/dev/null"), 1 << 20, Some(0)).is_err());
        // A file of another user is refused without being opened.
        let other = if mine == 4242 { 4243 } else { 4242 };
        let opens = opens_during(&real, || {
            assert!(ChannelFile::open(&real, 1 << 20, Some(other)).is_err());
        });
        assert_eq!(opens, 0);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn connecting_to_a_listener_that_never_accepts_does_not_wait() {
        let p = std::env::temp_dir().join(format!("vtism-backlog-{}.sock", std::process::id()));
        let _ = std::fs::remove_file(&p);
        let l = std::os::unix::net::UnixListener::bind(&p).unwrap();
        let t = std::time::Instant::now();
        let mut held = Vec::new();
        let e = loop {
            match connect_unix_now(&p) {
                Ok(s) => held.push(s),
                Err(e) => break e,
            }
            assert!(held.len() < 100_000, "the backlog never filled");
        };
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock, "{e}");
        assert!(t.elapsed() < std::time::Duration::from_secs(5));
        drop(l);
        let _ = std::fs::remove_file(&p);
        assert!(connect_unix_now(Path::new("/nonexistent/x.qmp")).is_err());
    }

    #[test]
    fn peer_credentials_of_a_socketpair() {
        let (a, _b) = UnixStream::pair().unwrap();
        let (pid, _uid) = peer_cred(&a).unwrap();
        assert_eq!(pid, std::process::id() as i32);
        assert!(process_alive(pid));
        assert!(process_cpu_seconds() >= 0.0);
    }
}

/// `PAGEMAP_SCAN` (Linux >= 6.7): `_IOWR('f', 16, struct pm_scan_arg)`.
const PAGEMAP_SCAN: libc::c_ulong = 0xC060_6610;
/// `PAGE_IS_HUGE`: mapped by a huge page table entry (a PMD-mapped THP, or hugetlbfs).
pub const PAGE_IS_HUGE: u64 = 1 << 6;

/// `struct pm_scan_arg` (include/uapi/linux/fs.h).
#[repr(C)]
struct PmScanArg {
    size: u64,
    flags: u64,
    start: u64,
    end: u64,
    walk_end: u64,
    vec: u64,
    vec_len: u64,
    max_pages: u64,
    category_inverted: u64,
    category_mask: u64,
    category_anyof_mask: u64,
    return_mask: u64,
}

/// `struct page_region`: `[start, end)` whose pages share `categories`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PageRegion {
    pub start: u64,
    pub end: u64,
    pub categories: u64,
}

/// One `PAGEMAP_SCAN` over `[start, end)` of the process whose `/proc/PID/pagemap` is
/// `pagemap`: the regions whose pages have every category of `required`, into `out` (as many as
/// it holds). Returns how many it filled and where the walk ended (`end` when it saw all of the
/// range). `ENOTTY` or `EINVAL` on kernels without the ioctl.
pub fn pagemap_scan(
    pagemap: &std::fs::File,
    start: u64,
    end: u64,
    required: u64,
    out: &mut [PageRegion],
) -> io::Result<(usize, u64)> {
    let mut arg = PmScanArg {
        size: std::mem::size_of::<PmScanArg>() as u64,
        flags: 0,
        start,
        end,
        walk_end: 0,
        vec: out.as_mut_ptr() as u64,
        vec_len: out.len() as u64,
        max_pages: 0,
        category_inverted: 0,
        category_mask: required,
        category_anyof_mask: 0,
        return_mask: required,
    };
    // SAFETY: `arg` is a `struct pm_scan_arg` of the size it says, live for the call; `vec`
    // points at `out.len()` writable `struct page_region`s, which is all the kernel writes; the
    // scanned addresses belong to the other process and are never dereferenced here.
    let r = unsafe { libc::ioctl(pagemap.as_raw_fd(), PAGEMAP_SCAN as _, &mut arg) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(((r as usize).min(out.len()), arg.walk_end))
}
