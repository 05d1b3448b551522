//! A VM's channel file: opened so that a path QEMU (or the configuration) names cannot make the
//! daemon open anything but QEMU's own ivshmem backend, mapped so that shrinking it cannot kill
//! the daemon, and checked every round so that a resized or replaced file ends the VM's channel.
//!
//! The path is opened with O_PATH | O_NOFOLLOW (no symlink as the last component; opening an
//! O_PATH descriptor has no side effects, even on a device), and on that descriptor it is
//! checked to be a regular file of QEMU's user with one link, on tmpfs or hugetlbfs, that the
//! QEMU process itself maps shared and writable (`open_backend`): the daemon then writes only
//! into a file QEMU writes anyway, not into whatever QEMU's user may open (another VM's disk
//! image or RAM file, which sVirt/AppArmor keep from that QEMU but not from a root daemon).
//! Only then is the same inode opened for reading and writing through /proc/self/fd, and
//! checked again. The mapping is guarded against SIGBUS (`sigbus`).

use crate::sigbus::Guard;
use std::ffi::CString;
use std::fmt;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use thiserror::Error;
use vtism_proto::MmapRegion;

/// What identifies the file that was mapped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Identity {
    dev: u64,
    ino: u64,
    size: u64,
}

/// Why a channel file can no longer be used: the VM is let go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The file shrank: an access past its end faulted, or its size is below the one mapped.
    Truncated,
    /// The file grew (it was mapped at `mapped` bytes).
    Resized { mapped: u64, now: u64 },
    /// The path names another file now.
    Replaced,
}

impl Fault {
    /// Every fault's label, for metrics that show the zeros too.
    pub const LABELS: [&'static str; 3] =
        ["channel_truncated", "channel_resized", "channel_replaced"];

    /// The metric label.
    pub const fn label(&self) -> &'static str {
        match self {
            Fault::Truncated => "channel_truncated",
            Fault::Resized { .. } => "channel_resized",
            Fault::Replaced => "channel_replaced",
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::Truncated => f.write_str("channel file truncated under its mapping"),
            Fault::Resized { mapped, now } => {
                write!(f, "channel file resized from {mapped} to {now} bytes")
            }
            Fault::Replaced => f.write_str("channel file replaced at its path"),
        }
    }
}

/// Why a file named as a VM's channel is not taken: nothing is read from or written to it.
#[derive(Debug, Error)]
pub enum Refusal {
    #[error("channel is not a regular file: {0}")]
    NotRegular(&'static str),
    #[error("channel file is owned by uid {file}, QEMU runs as uid {qemu}")]
    Owner { file: u32, qemu: u32 },
    #[error("channel file is on a filesystem of type {0:#x}, not tmpfs or hugetlbfs")]
    Filesystem(u64),
    #[error("channel file has {0} links, not 1")]
    Links(u64),
    #[error(
        "QEMU pid {pid} does not map the channel file shared and writable: not its ivshmem backend"
    )]
    NotMapped { pid: i32 },
    #[error("channel file is already the channel of VM {0}")]
    InUse(String),
}

impl Refusal {
    /// Every reason's label, for metrics that show the zeros too.
    pub const LABELS: [&'static str; 6] = [
        "not_regular",
        "owner",
        "filesystem",
        "links",
        "not_mapped",
        "in_use",
    ];

    /// The metric label.
    pub const fn label(&self) -> &'static str {
        match self {
            Refusal::NotRegular(_) => "not_regular",
            Refusal::Owner { .. } => "owner",
            Refusal::Filesystem(_) => "filesystem",
            Refusal::Links(_) => "links",
            Refusal::NotMapped { .. } => "not_mapped",
            Refusal::InUse(_) => "in_use",
        }
    }

    fn into_io(self) -> io::Error {
        let kind = match self {
            Refusal::Owner { .. } => io::ErrorKind::PermissionDenied,
            _ => io::ErrorKind::InvalidInput,
        };
        io::Error::new(kind, self.to_string())
    }
}

/// Why a channel file could not be opened: refused by a check, or an I/O error (not there yet,
/// too small, ...).
#[derive(Debug, Error)]
pub enum OpenError {
    #[error(transparent)]
    Refused(#[from] Refusal),
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// What a file must be to be taken as a VM's channel (`ChannelFile::open_backend`).
#[derive(Clone, Copy, Debug)]
pub struct Backend {
    /// QEMU's uid: the file's owner must be it, unless it is 0 (a root QEMU may name any file
    /// of its own) or `None` (a path from the configuration).
    pub owner: Option<u32>,
    /// The QEMU process, which must map the file shared and writable.
    pub pid: i32,
}

/// A mapped channel file. Unmapped on drop.
pub struct ChannelFile {
    path: PathBuf,
    file: OwnedFd,
    identity: Identity,
    ptr: NonNull<u8>,
    len: usize,
    /// `None` only while dropping.
    guard: Option<Guard>,
}

// SAFETY: the mapping is only handed out as a `MmapRegion`, whose accesses are all atomic; the
// pointer itself is just an address.
unsafe impl Send for ChannelFile {}
unsafe impl Sync for ChannelFile {}

fn invalid(kind: io::ErrorKind, msg: impl Into<String>) -> io::Error {
    io::Error::new(kind, msg.into())
}

fn fstat(fd: &OwnedFd) -> io::Result<libc::stat> {
    // SAFETY: stat is plain data; fstat only writes it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a valid descriptor and a valid pointer.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

fn open_fd(path: &CString, flags: i32) -> io::Result<OwnedFd> {
    // SAFETY: a NUL-terminated path; the descriptor returned is new and owned by nobody else.
    let fd = unsafe { libc::open(path.as_ptr(), flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Regular, and owned by `owner` if given (uid 0 owns nothing special: a root QEMU may name any
/// file of its own).
fn check_file(st: &libc::stat, owner: Option<u32>) -> Result<(), Refusal> {
    let kind = match st.st_mode & libc::S_IFMT {
        libc::S_IFREG => None,
        libc::S_IFLNK => Some("a symbolic link"),
        libc::S_IFDIR => Some("a directory"),
        libc::S_IFIFO => Some("a FIFO"),
        libc::S_IFSOCK => Some("a socket"),
        libc::S_IFCHR | libc::S_IFBLK => Some("a device"),
        _ => Some("of an unknown type"),
    };
    if let Some(kind) = kind {
        return Err(Refusal::NotRegular(kind));
    }
    if let Some(uid) = owner {
        if uid != 0 && st.st_uid != uid {
            return Err(Refusal::Owner {
                file: st.st_uid,
                qemu: uid,
            });
        }
    }
    Ok(())
}

/// One link: the file is not another name of a file that lives elsewhere too.
fn check_links(st: &libc::stat) -> Result<(), Refusal> {
    #[allow(clippy::unnecessary_cast)] // nlink_t is 32-bit on some architectures
    match st.st_nlink as u64 {
        1 => Ok(()),
        n => Err(Refusal::Links(n)),
    }
}

/// On tmpfs or hugetlbfs, where QEMU's shared-memory backends live (`/dev/shm`, libvirt's
/// `<shmem>`, `/dev/hugepages`), not on a disk.
fn check_filesystem(fd: &OwnedFd) -> Result<(), OpenError> {
    // SAFETY: statfs is plain data; fstatfs only writes it.
    let mut sf: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid descriptor (O_PATH descriptors allow fstatfs) and a valid pointer.
    if unsafe { libc::fstatfs(fd.as_raw_fd(), &mut sf) } != 0 {
        return Err(io::Error::last_os_error().into());
    }
    // f_type is a long or an int by architecture; the magics are 32-bit.
    let magic = sf.f_type as u32;
    if magic == libc::TMPFS_MAGIC as u32 || magic == libc::HUGETLBFS_MAGIC as u32 {
        Ok(())
    } else {
        Err(Refusal::Filesystem(u64::from(magic)).into())
    }
}

impl ChannelFile {
    /// Opens and maps `path` shared read-write: a regular file, owned by `owner` when given (the
    /// QEMU process's uid, for a path QEMU named), its size rounded down to 8 bytes and capped at
    /// `max_len`. No other check: for the guest's side of a channel (tests, the e2e harness);
    /// the daemon opens VMs' channels with `open_backend`.
    pub fn open(path: &Path, max_len: u64, owner: Option<u32>) -> io::Result<ChannelFile> {
        Self::open_inner(path, max_len, owner, None).map_err(|e| match e {
            OpenError::Refused(r) => r.into_io(),
            OpenError::Io(e) => e,
        })
    }

    /// As `open`, for a VM's channel: the file must also have one link, be on tmpfs or
    /// hugetlbfs, and be mapped shared and writable by the QEMU process (its ivshmem backend),
    /// all checked on the O_PATH descriptor before the file is opened for writing.
    pub fn open_backend(
        path: &Path,
        max_len: u64,
        backend: &Backend,
    ) -> Result<ChannelFile, OpenError> {
        Self::open_inner(path, max_len, backend.owner, Some(backend.pid))
    }

    fn open_inner(
        path: &Path,
        max_len: u64,
        owner: Option<u32>,
        qemu_pid: Option<i32>,
    ) -> Result<ChannelFile, OpenError> {
        let c = CString::new(path.as_os_str().as_bytes())
            .map_err(|_| invalid(io::ErrorKind::InvalidInput, "NUL in the channel path"))?;
        // With O_PATH, O_NOFOLLOW opens a final symbolic link itself: its type is refused below.
        let handle = open_fd(&c, libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC)?;
        let st = fstat(&handle)?;
        check_file(&st, owner)?;
        if let Some(pid) = qemu_pid {
            check_links(&st)?;
            check_filesystem(&handle)?;
            let (major, minor) = (libc::major(st.st_dev), libc::minor(st.st_dev));
            if !crate::process::maps_file_shared(pid, major, minor, st.st_ino)? {
                return Err(Refusal::NotMapped { pid }.into());
            }
        }
        // The inode just checked, opened for reading and writing: never the path again.
        let proc_path = CString::new(format!("/proc/self/fd/{}", handle.as_raw_fd()))
            .map_err(|_| io::Error::other("descriptor path"))?;
        let file = open_fd(
            &proc_path,
            libc::O_RDWR | libc::O_NOCTTY | libc::O_NONBLOCK | libc::O_CLOEXEC,
        )?;
        let st2 = fstat(&file)?;
        check_file(&st2, owner)?;
        if qemu_pid.is_some() {
            check_links(&st2)?;
        }
        if (st2.st_dev, st2.st_ino) != (st.st_dev, st.st_ino) {
            return Err(invalid(
                io::ErrorKind::InvalidInput,
                "channel file changed while it was opened",
            )
            .into());
        }
        let size = st2.st_size as u64;
        let len = (size.min(max_len) & !7) as usize;
        if len < 4096 {
            return Err(invalid(
                io::ErrorKind::InvalidData,
                format!("channel file is {size} bytes, less than a header page"),
            )
            .into());
        }
        // SAFETY: mapping a regular file opened read-write, no longer than the file; accesses
        // past a later end of the file are handled by the guard below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error().into());
        }
        let ptr = NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap gave NULL"))?;
        let guard = match Guard::new(p as usize, len) {
            Ok(g) => g,
            Err(e) => {
                // SAFETY: unmapping what was just mapped, never handed out.
                unsafe { libc::munmap(p, len) };
                return Err(e.into());
            }
        };
        Ok(ChannelFile {
            path: path.to_path_buf(),
            file,
            identity: Identity {
                dev: st2.st_dev,
                ino: st2.st_ino,
                size,
            },
            ptr,
            len,
            guard: Some(guard),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file's device and inode: what names it whatever path it is reached by.
    pub fn inode(&self) -> (u64, u64) {
        (self.identity.dev, self.identity.ino)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The mapping as a channel region. The region borrows nothing: keep `self` alive as long as
    /// the region.
    pub fn region(&self) -> MmapRegion {
        // SAFETY: the mapping is page-aligned, `len` a multiple of 8, and it stays mapped (the
        // file's pages, or zero pages once it shrank) until `self` is dropped.
        unsafe { MmapRegion::new(self.ptr, self.len) }
            .expect("page-aligned mapping with a length rounded to 8")
    }

    /// Whether the file is still the one mapped, at the size mapped: `Err` once it was truncated
    /// (a fault was caught, or its size is not the one mapped) or the path names another file.
    /// Checked before each round is read; a truncate between the check and the read is caught
    /// by the guard and reported by the next check.
    pub fn check(&self) -> Result<(), Fault> {
        if self.guard.as_ref().is_some_and(Guard::faulted) {
            return Err(Fault::Truncated);
        }
        let Ok(st) = fstat(&self.file) else {
            return Err(Fault::Replaced);
        };
        let now = st.st_size as u64;
        if now < self.identity.size {
            return Err(Fault::Truncated);
        }
        if now != self.identity.size {
            return Err(Fault::Resized {
                mapped: self.identity.size,
                now,
            });
        }
        let c = CString::new(self.path.as_os_str().as_bytes()).map_err(|_| Fault::Replaced)?;
        // SAFETY: stat is plain data; lstat only writes it.
        let mut at: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: a NUL-terminated path and a valid pointer.
        let found = unsafe { libc::lstat(c.as_ptr(), &mut at) } == 0;
        if found && (at.st_dev, at.st_ino) != (self.identity.dev, self.identity.ino) {
            return Err(Fault::Replaced);
        }
        Ok(())
    }
}

impl Drop for ChannelFile {
    fn drop(&mut self) {
        // The guard must never name an unmapped range: it goes first.
        drop(self.guard.take());
        // SAFETY: unmapping exactly what `open` mapped (or the zero pages that replaced it).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};
    use vtism_proto::layout::off;
    use vtism_proto::{ChannelReader, ChannelWriter, Gfn, HintEntry, PageType, RamMap};
    use vtism_proto::{RoundMeta, SharedRegion, Tracker};

    fn temp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("vtism-chanfile-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn file(p: &Path, len: u64) {
        std::fs::File::create(p).unwrap().set_len(len).unwrap();
    }

    /// The file is truncated while the reader reads rounds from it and the writer publishes: no
    /// SIGBUS reaches the process, the reads see zeros, and `check` reports the truncation.
    #[test]
    fn truncation_under_a_running_reader_ends_the_channel_not_the_process() {
        let d = temp("trunc");
        let p = d.join("c");
        file(&p, 1 << 20);
        let ram = RamMap::contiguous(1 << 16);
        let f = ChannelFile::open(&p, 1 << 20, None).unwrap();
        let region = f.region();
        let mut w = ChannelWriter::init(&region, Tracker::Harness).unwrap();
        let hot: Vec<HintEntry> = (0..20_000)
            .map(|g| HintEntry::new(Gfn(g), 100, false, PageType::Anon, false, true))
            .collect();
        w.publish(&hot, &RoundMeta::default()).unwrap();
        let mut reader = ChannelReader::new();
        assert_eq!(
            reader.read(&region, &ram).unwrap().unwrap().entries.len(),
            20_000
        );
        assert_eq!(f.check(), Ok(()));

        // Another party shrinks and regrows the file over and over while rounds are read.
        let stop = Arc::new(AtomicBool::new(false));
        let truncator = {
            let (p, stop) = (p.clone(), stop.clone());
            std::thread::spawn(move || {
                let h = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
                while !stop.load(Ordering::Relaxed) {
                    h.set_len(4096).unwrap();
                    std::thread::sleep(Duration::from_micros(200));
                    h.set_len(1 << 20).unwrap();
                }
            })
        };
        let t = Instant::now();
        // Until an access faulted (a size check alone also says Truncated, without a fault).
        while !f.guard.as_ref().is_some_and(Guard::faulted) {
            reader.reset();
            let _ = reader.read(&region, &ram);
            let _ = region.store_u64(off::ACK_ROUND, 1);
            assert!(t.elapsed() < Duration::from_secs(20), "no fault caught");
        }
        stop.store(true, Ordering::Relaxed);
        truncator.join().unwrap();
        assert_eq!(f.check(), Err(Fault::Truncated));
        // The range reads zeros now, whatever the file holds.
        assert_eq!(region.load_u64(off::MAGIC).unwrap(), 0);
        drop(f);
        // A new mapping of the same file is guarded afresh.
        let g = ChannelFile::open(&p, 1 << 20, None).unwrap();
        assert_eq!(g.check(), Ok(()));
        let _ = std::fs::remove_dir_all(&d);
    }

    /// A SIGBUS outside every guarded mapping is not swallowed: the process still dies of it
    /// (run in a child process: this test binary again, with `VTISM_SIGBUS_CHILD` set).
    #[test]
    fn an_unguarded_sigbus_still_ends_the_process() {
        use std::os::unix::process::ExitStatusExt;
        if let Ok(dir) = std::env::var("VTISM_SIGBUS_CHILD") {
            let d = PathBuf::from(dir);
            let (guarded, plain) = (d.join("guarded"), d.join("plain"));
            file(&guarded, 8192);
            file(&plain, 8192);
            let _g = ChannelFile::open(&guarded, 8192, None).unwrap();
            let f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&plain)
                .unwrap();
            // SAFETY: a shared mapping of a file this process made; it is touched after the
            // file is truncated, on purpose.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    8192,
                    libc::PROT_READ,
                    libc::MAP_SHARED,
                    f.as_raw_fd(),
                    0,
                )
            };
            assert_ne!(p, libc::MAP_FAILED);
            f.set_len(0).unwrap();
            // SAFETY: see above: this read raises SIGBUS.
            let v = unsafe { std::ptr::read_volatile(p.cast::<u64>().add(600)) };
            println!("survived with {v}");
            std::process::exit(0);
        }
        let d = temp("unguarded");
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "channel_file::tests::an_unguarded_sigbus_still_ends_the_process",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("VTISM_SIGBUS_CHILD", &d)
            .output()
            .unwrap();
        let _ = std::fs::remove_dir_all(&d);
        assert_eq!(
            out.status.signal(),
            Some(libc::SIGBUS),
            "{:?}: {}",
            out.status,
            String::from_utf8_lossy(&out.stdout)
        );
    }

    #[test]
    fn resized_or_replaced_files_are_reported() {
        let d = temp("resize");
        let p = d.join("c");
        file(&p, 1 << 16);
        let f = ChannelFile::open(&p, 1 << 20, None).unwrap();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&p)
            .unwrap()
            .set_len(1 << 17)
            .unwrap();
        assert_eq!(
            f.check(),
            Err(Fault::Resized {
                mapped: 1 << 16,
                now: 1 << 17
            })
        );
        let g = ChannelFile::open(&p, 1 << 20, None).unwrap();
        assert_eq!(g.check(), Ok(()));
        file(&d.join("new"), 1 << 17);
        std::fs::rename(d.join("new"), &p).unwrap();
        assert_eq!(g.check(), Err(Fault::Replaced));
        assert_eq!(g.check().unwrap_err().label(), "channel_replaced");
        let _ = std::fs::remove_dir_all(&d);
    }

    /// Only a regular file, never through a symbolic link, owned by QEMU's user when the path
    /// came from QEMU; a FIFO or a device is refused before anything is read or written (and
    /// opening a FIFO does not block).
    #[test]
    fn only_regular_files_of_qemus_user_are_opened() {
        let d = temp("kinds");
        let p = d.join("c");
        file(&p, 8192);
        let mine = std::fs::metadata(&p).unwrap().uid();
        let other = if mine == 4242 { 4243 } else { 4242 };
        let e = ChannelFile::open(&p, 1 << 20, Some(other)).err().unwrap();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
        assert_eq!(
            ChannelFile::open(&p, 1 << 20, Some(mine)).unwrap().len(),
            8192
        );
        assert!(ChannelFile::open(&p, 1 << 20, Some(0)).is_ok());
        assert_eq!(ChannelFile::open(&p, 4096, None).unwrap().len(), 4096);

        std::os::unix::fs::symlink(&p, d.join("link")).unwrap();
        let e = ChannelFile::open(&d.join("link"), 1 << 20, None)
            .err()
            .unwrap();
        assert!(e.to_string().contains("symbolic link"), "{e}");

        let fifo = CString::new(d.join("fifo").as_os_str().as_bytes()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        for bad in [d.join("fifo"), d.clone(), PathBuf::from("/dev/null")] {
            let e = ChannelFile::open(&bad, 1 << 20, None).err().unwrap();
            assert!(
                e.to_string().contains("not a regular file"),
                "{}: {e}",
                bad.display()
            );
        }
        file(&p, 100);
        assert!(
            ChannelFile::open(&p, 1 << 20, None).is_err(),
            "smaller than a header page"
        );
        let _ = std::fs::remove_dir_all(&d);
    }
}
