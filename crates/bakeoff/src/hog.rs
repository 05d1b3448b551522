//! A DRAM hog: anonymous memory bound to one node (mbind MPOL_BIND) and mlocked, so that the
//! kernel's own tiering sees only the free DRAM the bake-off grants (mlocked pages are never
//! reclaimed, so never demoted, and their bound VMA is never NUMA-balanced).

use std::io;

const MPOL_BIND: libc::c_long = 2;

/// Memory held on one node until dropped.
pub struct Hog {
    addr: *mut libc::c_void,
    len: usize,
    pub node: u32,
}

impl Hog {
    /// Holds `bytes` (rounded down to pages) of node `node`.
    pub fn hold(node: u32, bytes: u64) -> io::Result<Hog> {
        let len = (bytes as usize) & !4095;
        if len == 0 {
            return Ok(Hog {
                addr: std::ptr::null_mut(),
                len: 0,
                node,
            });
        }
        if node >= 64 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "node >= 64"));
        }
        // SAFETY: an anonymous private mapping at an address the kernel picks; nothing aliases it.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let hog = Hog { addr, len, node };
        let mask: u64 = 1 << node;
        // SAFETY: mbind on the mapping made above, with a one-word node mask that outlives the
        // call; the kernel reads `maxnode` bits of it.
        let r = unsafe {
            libc::syscall(
                libc::SYS_mbind,
                addr,
                len,
                MPOL_BIND,
                &mask as *const u64,
                64 as libc::c_ulong,
                0 as libc::c_uint,
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: mlock faults in and pins the pages of the mapping made above.
        if unsafe { libc::mlock(addr, len) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(hog)
    }

    pub fn bytes(&self) -> u64 {
        self.len as u64
    }
}

impl Drop for Hog {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: unmaps exactly the mapping this Hog made; nothing else refers to it.
            unsafe {
                libc::munmap(self.addr, self.len);
            }
        }
    }
}

/// A node's free memory and its high watermark (the free memory the kernel keeps back before it
/// promotes into the node), bytes, from sysfs and /proc/zoneinfo.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NodeMemory {
    pub total: u64,
    pub free: u64,
    pub high_watermark: u64,
}

pub fn node_memory(node: u32) -> io::Result<NodeMemory> {
    let meminfo = std::fs::read_to_string(format!("/sys/devices/system/node/node{node}/meminfo"))?;
    let zoneinfo = std::fs::read_to_string("/proc/zoneinfo")?;
    Ok(NodeMemory {
        total: meminfo_kib(&meminfo, "MemTotal") * 1024,
        free: meminfo_kib(&meminfo, "MemFree") * 1024,
        high_watermark: high_watermark_pages(&zoneinfo, node) * 4096,
    })
}

/// `Node 0 MemFree:   123 kB` -> 123.
fn meminfo_kib(text: &str, key: &str) -> u64 {
    text.lines()
        .find_map(|l| {
            let (_, rest) = l.split_once(&format!("{key}:"))?;
            rest.split_whitespace().next()?.parse().ok()
        })
        .unwrap_or(0)
}

/// Sum of the `high` watermarks of a node's zones.
fn high_watermark_pages(zoneinfo: &str, node: u32) -> u64 {
    let mut in_node = false;
    let mut sum = 0;
    for l in zoneinfo.lines() {
        if let Some(rest) = l.strip_prefix("Node ") {
            in_node = rest
                .split(',')
                .next()
                .and_then(|n| n.trim().parse::<u32>().ok())
                == Some(node);
        } else if in_node {
            let mut w = l.split_whitespace();
            if w.next() == Some("high") {
                sum += w.next().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
            }
        }
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_meminfo_and_zoneinfo() {
        let m = "Node 0 MemTotal:        1015804 kB\nNode 0 MemFree:          704516 kB\n";
        assert_eq!(meminfo_kib(m, "MemFree"), 704516);
        assert_eq!(meminfo_kib(m, "MemTotal"), 1015804);
        let z = "Node 0, zone      DMA\n  pages free     3840\n        min      44\n        low      55\n        high     66\n\
                 Node 0, zone    DMA32\n  pages free     1\n        min      100\n        low      200\n        high     300\n        promo    400\n\
                 Node 1, zone    DMA32\n        high     999\n";
        assert_eq!(high_watermark_pages(z, 0), 366);
        assert_eq!(high_watermark_pages(z, 1), 999);
        assert_eq!(high_watermark_pages(z, 2), 0);
    }

    #[test]
    fn an_empty_hog_holds_nothing() {
        let h = Hog::hold(0, 100).unwrap();
        assert_eq!(h.bytes(), 0);
    }
}
