//! Shared file mappings that survive their file shrinking under them.
//!
//! A channel file is mapped shared, and QEMU's user (or a compromised QEMU) can truncate it at
//! any moment: the next access to a page past the new end raises SIGBUS, which kills the process.
//! A check of the file's size before each access cannot help (the truncate can come between the
//! check and the access), and copying with pread(2) would lose the atomic word accesses the
//! channel protocol is written for. So the fault itself is handled, as Wayland compositors do for
//! client pools (libwayland-server's `wl_shm_buffer_begin_access`): the handler finds the guarded
//! range holding the faulting address, maps anonymous zero pages over the whole range (the access
//! then completes, reading zeros) and marks the range faulted; the owner sees the mark after the
//! access and ends that VM's channel. A fault anywhere else goes to the handler that was there
//! before (Rust's stack-overflow handler), or to the default action.
//!
//! The handler only reads atomics and calls mmap(2), a plain system call.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;

/// Ranges guarded at once, at most (one per managed VM's channel).
pub const MAX_GUARDED: usize = 4096;

/// One guarded range under a sequence lock: odd `seq` while `start`/`len` change, so the handler
/// never acts on a torn pair.
struct Slot {
    seq: AtomicU64,
    start: AtomicUsize,
    len: AtomicUsize,
    faulted: AtomicBool,
    taken: AtomicBool,
}

#[allow(clippy::declare_interior_mutable_const)]
const FREE: Slot = Slot {
    seq: AtomicU64::new(0),
    start: AtomicUsize::new(0),
    len: AtomicUsize::new(0),
    faulted: AtomicBool::new(false),
    taken: AtomicBool::new(false),
};

static SLOTS: [Slot; MAX_GUARDED] = [FREE; MAX_GUARDED];

/// The SIGBUS disposition before ours, to pass other faults on to.
static PREVIOUS: OnceLock<Previous> = OnceLock::new();

struct Previous(libc::sigaction);
// SAFETY: a sigaction is plain data (a handler address, a mask, flags); it is written once,
// before the handler that reads it is installed, and never changed.
unsafe impl Sync for Previous {}
unsafe impl Send for Previous {}

/// A guarded range: `faulted` says whether the file shrank under it. Dropping it stops the
/// guard; unmap the range only after that.
pub struct Guard {
    slot: usize,
}

impl Guard {
    /// Guards `len` bytes at `start`, a shared file mapping of this process.
    pub fn new(start: usize, len: usize) -> io::Result<Guard> {
        install()?;
        let slot = SLOTS
            .iter()
            .position(|s| {
                s.taken
                    .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            })
            .ok_or_else(|| {
                io::Error::other(format!("more than {MAX_GUARDED} channel files mapped"))
            })?;
        let s = &SLOTS[slot];
        s.faulted.store(false, Ordering::Relaxed);
        write_range(s, start, len);
        Ok(Guard { slot })
    }

    /// True once an access to the range faulted: the file shrank, the range now reads zeros.
    pub fn faulted(&self) -> bool {
        SLOTS[self.slot].faulted.load(Ordering::Acquire)
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let s = &SLOTS[self.slot];
        write_range(s, 0, 0);
        s.taken.store(false, Ordering::Release);
    }
}

fn write_range(s: &Slot, start: usize, len: usize) {
    s.seq.fetch_add(1, Ordering::AcqRel);
    s.start.store(start, Ordering::Release);
    s.len.store(len, Ordering::Release);
    s.seq.fetch_add(1, Ordering::AcqRel);
}

/// Installs the handler once per process.
fn install() -> io::Result<()> {
    static INSTALLED: OnceLock<Result<(), i32>> = OnceLock::new();
    let r = INSTALLED.get_or_init(|| {
        // SAFETY: sigaction structs are plain data; zeroed is a valid empty one. The handler is
        // async-signal-safe (atomics and mmap only), and `PREVIOUS` is set before it is installed.
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut old) != 0 {
                return Err(io::Error::last_os_error().raw_os_error().unwrap_or(0));
            }
            let _ = PREVIOUS.set(Previous(old));
            let mut new: libc::sigaction = std::mem::zeroed();
            new.sa_sigaction = on_sigbus as *const () as usize;
            new.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut new.sa_mask);
            if libc::sigaction(libc::SIGBUS, &new, std::ptr::null_mut()) != 0 {
                return Err(io::Error::last_os_error().raw_os_error().unwrap_or(0));
            }
        }
        Ok(())
    });
    r.map_err(io::Error::from_raw_os_error)
}

/// The guarded range holding `addr`, read consistently: `(start, len, slot)`.
fn range_of(addr: usize) -> Option<(usize, usize, &'static Slot)> {
    SLOTS.iter().find_map(|s| {
        let s1 = s.seq.load(Ordering::Acquire);
        if s1 & 1 != 0 {
            return None;
        }
        let (start, len) = (
            s.start.load(Ordering::Acquire),
            s.len.load(Ordering::Acquire),
        );
        let inside = len != 0 && addr >= start && addr - start < len;
        (inside && s.seq.load(Ordering::Acquire) == s1).then_some((start, len, s))
    })
}

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler; errno is this thread's.
    let (addr, errno) = unsafe { ((*info).si_addr() as usize, *libc::__errno_location()) };
    if let Some((start, len, slot)) = range_of(addr) {
        // SAFETY: the range is a live mapping of this process (a consistent guarded range holding
        // the faulting address: the faulting access is to it, and a range is unguarded before it
        // is unmapped); replacing it with anonymous memory of the same size keeps every access
        // to it valid.
        let p = unsafe {
            libc::mmap(
                start as *mut libc::c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if p != libc::MAP_FAILED {
            slot.faulted.store(true, Ordering::Release);
            // SAFETY: restoring this thread's errno.
            unsafe { *libc::__errno_location() = errno };
            return;
        }
    }
    pass_on(sig, info, ctx);
}

/// A fault that is not ours: the previous handler, or the default action (the access faults
/// again on return and the process ends as it would have without us).
fn pass_on(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let Some(Previous(old)) = PREVIOUS.get() else {
        return reset_default(sig);
    };
    let h = old.sa_sigaction;
    if h == libc::SIG_DFL || h == libc::SIG_IGN {
        return reset_default(sig);
    }
    // SAFETY: `h` is the handler that was installed for this signal, called as it expects to be.
    unsafe {
        if old.sa_flags & libc::SA_SIGINFO != 0 {
            let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                std::mem::transmute(h);
            f(sig, info, ctx);
        } else {
            let f: extern "C" fn(libc::c_int) = std::mem::transmute(h);
            f(sig);
        }
    }
}

fn reset_default(sig: libc::c_int) {
    // SAFETY: signal(2) is async-signal-safe.
    unsafe { libc::signal(sig, libc::SIG_DFL) };
}
