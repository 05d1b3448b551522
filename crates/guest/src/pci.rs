//! The ivshmem-plain device's BAR2, mapped through sysfs.

use anyhow::{bail, Context, Result};
use std::fs::{self, OpenOptions};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use vtism_proto::MmapRegion;

pub const PCI_DEVICES: &str = "/sys/bus/pci/devices";
const VENDOR: &str = "0x1af4";
const DEVICE: &str = "0x1110";

/// The first ivshmem-plain device (by PCI address) under `devices`, as its directory.
pub fn find_ivshmem(devices: &Path) -> Result<PathBuf> {
    let mut found = Vec::new();
    for e in fs::read_dir(devices).with_context(|| format!("reading {}", devices.display()))? {
        let d = e?.path();
        let id = |f: &str| fs::read_to_string(d.join(f)).map(|s| s.trim().to_string());
        if id("vendor").ok().as_deref() == Some(VENDOR)
            && id("device").ok().as_deref() == Some(DEVICE)
        {
            found.push(d);
        }
    }
    found.sort();
    found.into_iter().next().with_context(|| {
        format!(
            "no ivshmem-plain device (1af4:1110) under {}",
            devices.display()
        )
    })
}

/// Enables the device's memory decoding (`enable`) if it is not yet.
pub fn enable(dev: &Path) -> Result<()> {
    let p = dev.join("enable");
    if fs::read_to_string(&p)
        .map(|s| s.trim() != "0")
        .unwrap_or(true)
    {
        return Ok(());
    }
    fs::write(&p, "1").with_context(|| format!("enabling {}", dev.display()))
}

/// Maps `resource2` (or any file) shared, read-write, for the life of the process.
///
/// `resourceN` is mapped uncached by the kernel: every store reaches the BAR in program order,
/// which the channel's seqlock relies on (on x86 a release fence is only a compiler barrier;
/// a write-combining mapping, `resourceN_wc`, would let stores pass each other).
pub fn map_bar(path: &Path) -> Result<MmapRegion> {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    let len = f.metadata()?.len();
    if len < 8192 || len > isize::MAX as u64 {
        bail!("{} is {len} bytes: not a channel BAR", path.display());
    }
    let len = len as usize;
    // SAFETY: a fresh shared mapping of a file we opened; no Rust object aliases it.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("mmap of {}", path.display()));
    }
    let ptr = NonNull::new(p.cast::<u8>()).context("mmap returned null")?;
    // SAFETY: `ptr .. ptr + len` is a shared mapping that is never unmapped: the process keeps
    // it until it exits (closing the file does not unmap it), so it stays valid for reads and
    // writes for as long as the region exists; this process only accesses it through the
    // returned `MmapRegion` (atomics). The host writes it concurrently, which the contract allows.
    // mmap returns page-aligned memory and `len` is a multiple of 8 (checked by `new`).
    Ok(unsafe { MmapRegion::new(ptr, len) }?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testdir::TestDir;
    use vtism_proto::SharedRegion;

    #[test]
    fn finds_first_ivshmem_and_enables_it() {
        let d = TestDir::new("pci");
        for (bdf, v, dev) in [
            ("0000:00:05.0", "0x1af4", "0x1110"),
            ("0000:00:04.0", "0x1af4", "0x1110"),
            ("0000:00:03.0", "0x1af4", "0x1000"),
            ("0000:00:02.0", "0x8086", "0x1110"),
        ] {
            d.write(&format!("{bdf}/vendor"), &format!("{v}\n"));
            d.write(&format!("{bdf}/device"), &format!("{dev}\n"));
            d.write(&format!("{bdf}/enable"), "0\n");
        }
        let dev = find_ivshmem(d.path()).unwrap();
        assert!(dev.ends_with("0000:00:04.0"));
        enable(&dev).unwrap();
        assert_eq!(fs::read_to_string(dev.join("enable")).unwrap(), "1");
        let none = TestDir::new("pci-none");
        assert!(find_ivshmem(none.path()).is_err());
    }

    #[test]
    fn maps_a_file() {
        let d = TestDir::new("bar");
        let p = d.path().join("resource2");
        fs::write(&p, vec![0u8; 64 * 1024]).unwrap();
        let r = map_bar(&p).unwrap();
        r.store_u64(8, 0x1234).unwrap();
        assert_eq!(r.load_u64(8).unwrap(), 0x1234);
        assert_eq!(fs::read(&p).unwrap()[8], 0x34);
        fs::write(d.path().join("small"), [0u8; 16]).unwrap();
        assert!(map_bar(&d.path().join("small")).is_err());
    }
}
