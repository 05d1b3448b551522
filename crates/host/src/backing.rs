//! How the host backs a VM's guest RAM: base pages, transparent huge pages, or hugetlbfs pages,
//! per 2 MiB block of host-virtual addresses. move_pages(2) moves a whole folio: one 4 KiB page
//! of a THP takes its 2 MiB with it, so the unit of placement is what this finds.
//!
//! Two sources, both readable with the ptrace access vtismd already has (no CAP_SYS_ADMIN, which
//! /proc/kpageflags and pagemap's frame numbers would need): /proc/PID/smaps per mapping
//! (hugetlbfs and its page size, THP bytes in use), and the `PAGEMAP_SCAN` ioctl on
//! /proc/PID/pagemap (Linux >= 6.7) for which 2 MiB blocks are mapped huge. On older kernels
//! only the smaps totals are known: where in the mapping the THPs are is not. Both see THPs
//! mapped by a PMD; a THP mapped by 4 KiB entries (after a partial munmap or mprotect of it) is
//! not seen.

use crate::batch::HugetlbSpan;
use crate::mtree::GuestMemory;
use crate::sys::{self, PageRegion, PAGE_IS_HUGE};
use serde::Serialize;
use std::io;
use vtism_proto::{Gfn, GfnRange, Hva, FRAME_SIZE, HUGE_FRAMES};

/// Bytes of a PMD-mapped THP, and of a block.
pub const BLOCK_BYTES: u64 = 2 << 20;

/// One mapping of /proc/PID/smaps, what backing needs of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SmapsVma {
    pub start: u64,
    pub end: u64,
    /// `KernelPageSize`: 4 KiB, or a hugetlbfs page size.
    pub kernel_page_bytes: u64,
    /// `AnonHugePages` + `ShmemPmdMapped` + `FilePmdMapped`: bytes mapped by THPs.
    pub thp_bytes: u64,
    /// `VmFlags` has `ht`: a hugetlbfs mapping.
    pub hugetlb: bool,
    /// `VmFlags` has `nh` (MADV_NOHUGEPAGE): no THP will be made here.
    pub no_huge: bool,
}

/// The mappings of /proc/PID/smaps text. A mapping's header line starts with its
/// `start-end` range; the fields that follow are `Name: value [kB]`. Lines that do not parse are
/// errors: the kernel writes this file.
pub fn parse_smaps(text: &str) -> Result<Vec<SmapsVma>, String> {
    let mut out: Vec<SmapsVma> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let bad = || {
            let shown: String = line.chars().take(80).collect();
            format!("smaps line {}: `{shown}`", i + 1)
        };
        let first = line.split_whitespace().next().ok_or_else(bad)?;
        if let Some((a, b)) = header_range(first) {
            if b <= a || out.last().is_some_and(|l| l.end > a) {
                return Err(bad());
            }
            out.push(SmapsVma {
                start: a,
                end: b,
                kernel_page_bytes: 4096,
                thp_bytes: 0,
                hugetlb: false,
                no_huge: false,
            });
            continue;
        }
        let vma = out.last_mut().ok_or_else(bad)?;
        let (name, value) = line.split_once(':').ok_or_else(bad)?;
        match name {
            "VmFlags" => {
                let flags: Vec<&str> = value.split_whitespace().collect();
                vma.hugetlb = flags.contains(&"ht");
                vma.no_huge = flags.contains(&"nh");
            }
            "KernelPageSize" => vma.kernel_page_bytes = kib(value).ok_or_else(bad)? << 10,
            "AnonHugePages" | "ShmemPmdMapped" | "FilePmdMapped" => {
                vma.thp_bytes += kib(value).ok_or_else(bad)? << 10
            }
            _ => {}
        }
    }
    Ok(out)
}

/// `start-end` in hex, as a mapping's header line begins.
fn header_range(word: &str) -> Option<(u64, u64)> {
    let (a, b) = word.split_once('-')?;
    Some((
        u64::from_str_radix(a, 16).ok()?,
        u64::from_str_radix(b, 16).ok()?,
    ))
}

/// `  1234 kB`.
fn kib(value: &str) -> Option<u64> {
    let mut f = value.split_whitespace();
    let n = f.next()?.parse().ok()?;
    (f.next() == Some("kB") && f.next().is_none()).then_some(n)
}

/// How the backing of a range was learnt.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Method {
    /// smaps and `PAGEMAP_SCAN`: every 2 MiB block known.
    PagemapScan,
    /// smaps only (a kernel without `PAGEMAP_SCAN`): THP bytes known, not where they are.
    SmapsOnly,
}

/// The backing of one range of guest RAM `[hva, hva + len)`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RangeBacking {
    pub hva: Hva,
    pub len: u64,
    /// The hugetlbfs page size where the range is on hugetlbfs (the largest, if its mappings
    /// differ), else `None`.
    pub hugetlb_page_bytes: Option<u64>,
    /// Bytes of the range mapped by THPs (smaps; for mappings reaching past the range, their
    /// share by length).
    pub thp_bytes: u64,
    /// With `PagemapScan`: the range's 2 MiB blocks (by `hva >> 21`) mapped huge, in order.
    pub huge_blocks: Vec<u64>,
    pub method: Method,
}

impl RangeBacking {
    /// Whether the block holding `hva` is mapped huge: `None` where it is not known (smaps only,
    /// with THPs somewhere in the range).
    pub fn is_huge(&self, hva: Hva) -> Option<bool> {
        if self.hugetlb_page_bytes.is_some() {
            return Some(true);
        }
        match self.method {
            Method::PagemapScan => Some(self.huge_blocks.binary_search(&(hva.0 >> 21)).is_ok()),
            Method::SmapsOnly => (self.thp_bytes == 0).then_some(false),
        }
    }
}

/// What `ctl status` and the metrics say of a VM's backing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct BackingSummary {
    /// Guest RAM bytes in all.
    pub ram_bytes: u64,
    /// Bytes on hugetlbfs, and its (largest) page size.
    pub hugetlb_bytes: u64,
    pub hugetlb_page_bytes: u64,
    /// Bytes mapped by THPs (smaps).
    pub thp_bytes: u64,
    /// 2 MiB blocks known to be mapped huge (`PAGEMAP_SCAN`), and whether every range's blocks
    /// are known.
    pub huge_blocks: u64,
    pub blocks_known: bool,
    /// 2 MiB blocks the engine places whole as host folios (`folios`).
    pub folio_blocks: u64,
    /// Guest RAM vtismd does not move: on hugetlbfs pages larger than 2 MiB (`unmovable`).
    pub unmovable_bytes: u64,
    /// THPs split at the engine's request since admission (`Daemon::split_folios`).
    pub folio_splits: u64,
    /// Split blocks later seen mapped huge again (`Daemon::follow_splits`).
    pub folio_recollapses: u64,
}

pub fn summarize(ranges: &[RangeBacking]) -> BackingSummary {
    let mut s = BackingSummary {
        blocks_known: true,
        ..Default::default()
    };
    for r in ranges {
        s.ram_bytes += r.len;
        if let Some(p) = r.hugetlb_page_bytes {
            s.hugetlb_bytes += r.len;
            s.hugetlb_page_bytes = s.hugetlb_page_bytes.max(p);
        }
        if r.hugetlb_page_bytes.is_some_and(|p| p > BLOCK_BYTES) {
            s.unmovable_bytes += r.len;
        }
        s.thp_bytes += r.thp_bytes;
        s.huge_blocks += r.huge_blocks.len() as u64;
        s.blocks_known &= r.method == Method::PagemapScan || r.thp_bytes == 0;
    }
    s
}

/// The guest's 2 MiB blocks the host maps with one huge page each, by head frame: what the engine
/// places whole (`Tiering::set_host_folios`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Folios {
    pub heads: Vec<Gfn>,
    /// Blocks taken as folios because THPs are somewhere in their range and the kernel cannot
    /// say where (smaps only): placing one that is base pages whole moves its pages together,
    /// never more onto DRAM than the quota counts.
    pub assumed: u64,
    /// Bytes of THP or hugetlbfs backing in ranges whose host and guest addresses are not
    /// congruent modulo 2 MiB: a host folio there straddles two guest blocks, which the engine
    /// cannot place whole (QEMU aligns guest RAM, so this is not expected).
    pub misaligned_bytes: u64,
}

/// The folios of `memory` as `backing` (read for the same ranges, in the same order) finds them.
/// Blocks of a hugetlbfs range are all folios; of a THP range, those `PAGEMAP_SCAN` found mapped
/// huge, or all of them where only smaps could be read and it counts THP bytes there. A block
/// only partly in a range (the PC's hole below 1 MiB cuts the first one) is listed too: the
/// engine keeps such a folio where it is.
pub fn folios(memory: &GuestMemory, backing: &[RangeBacking]) -> Folios {
    let mut out = Folios::default();
    let mut assumed = Vec::new();
    for (r, b) in memory.ranges.iter().zip(backing) {
        if r.hva != b.hva || r.len_bytes() != b.len {
            continue;
        }
        if (r.hva.0 / FRAME_SIZE).wrapping_sub(r.gfns.start.0) % HUGE_FRAMES != 0 {
            if b.hugetlb_page_bytes.is_some() || b.thp_bytes > 0 {
                out.misaligned_bytes += b.hugetlb_page_bytes.map_or(b.thp_bytes, |_| b.len);
            }
            continue;
        }
        let first = r.gfns.start.0 / HUGE_FRAMES * HUGE_FRAMES;
        for head in (first..r.gfns.end.0).step_by(HUGE_FRAMES as usize) {
            // The block's first byte, before the range's start for a block the range cuts.
            let off = (head as i128 - r.gfns.start.0 as i128) * FRAME_SIZE as i128;
            let hva = (r.hva.0 as i128 + off) as u64;
            match b.is_huge(Hva(hva)) {
                Some(true) => out.heads.push(Gfn(head)),
                Some(false) => {}
                None => assumed.push(Gfn(head)),
            }
        }
    }
    assumed.sort_unstable();
    assumed.dedup();
    out.assumed = assumed.len() as u64;
    out.heads.extend(assumed);
    out.heads.sort_unstable();
    out.heads.dedup();
    out
}

/// Guest RAM on hugetlbfs pages larger than the planner's 2 MiB unit (1 GiB pages): the kernel
/// moves such a page only whole, by its head, and only into a free page of the target node's
/// pool (mm/hugetlb.c never allocates a gigantic page for migration), so vtismd leaves it where
/// it is and the engine never plans it (`Tiering::set_pinned`).
pub fn unmovable(memory: &GuestMemory, backing: &[RangeBacking]) -> Vec<GfnRange> {
    memory
        .ranges
        .iter()
        .zip(backing)
        .filter(|(_, b)| b.hugetlb_page_bytes.is_some_and(|p| p > BLOCK_BYTES))
        .map(|(r, _)| r.gfns)
        .collect()
}

/// The guest RAM ranges on hugetlbfs, with their page size, for the mover (`HugetlbSpan`).
pub fn hugetlb_spans(memory: &GuestMemory, backing: &[RangeBacking]) -> Vec<HugetlbSpan> {
    memory
        .ranges
        .iter()
        .zip(backing)
        .filter(|(r, b)| r.hva == b.hva && r.len_bytes() == b.len)
        .filter_map(|(r, b)| {
            Some(HugetlbSpan {
                gfns: r.gfns,
                page_frames: b.hugetlb_page_bytes? / FRAME_SIZE,
            })
        })
        .collect()
}

/// The backing of the guest RAM ranges `(hva, len)` of process `pid`. With `last`, what an
/// earlier read found for the same ranges by `PAGEMAP_SCAN`, only the scan runs again: reading
/// smaps walks every page table of the process (tens of milliseconds for a 32 GiB VM on 4 KiB
/// pages), the scan only the ranges' and a step per huge block, and hugetlbfs does not come
/// and go under a mapping.
pub fn read(
    pid: i32,
    ranges: &[(Hva, u64)],
    last: Option<&[RangeBacking]>,
) -> io::Result<Vec<RangeBacking>> {
    if let Some(last) = last.filter(|l| {
        l.len() == ranges.len()
            && l.iter().zip(ranges).all(|(b, &(hva, len))| {
                b.hva == hva && b.len == len && b.method == Method::PagemapScan
            })
    }) {
        let pagemap = std::fs::File::open(format!("/proc/{pid}/pagemap"))?;
        return last
            .iter()
            .map(|b| {
                let mut b = b.clone();
                if b.hugetlb_page_bytes.is_none() {
                    b.huge_blocks = huge_blocks(&pagemap, b.hva.0, b.hva.0.saturating_add(b.len))?;
                    // What smaps counts as THP bytes: those mapped by a PMD, as the scan sees.
                    b.thp_bytes = b.huge_blocks.len() as u64 * BLOCK_BYTES;
                }
                Ok(b)
            })
            .collect();
    }
    let smaps = std::fs::read(format!("/proc/{pid}/smaps"))?;
    let vmas = parse_smaps(&String::from_utf8_lossy(&smaps))
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    let pagemap = std::fs::File::open(format!("/proc/{pid}/pagemap"))?;
    // Whether this kernel has the ioctl, on the first page of guest RAM.
    let scan_works = match ranges.first() {
        Some(&(hva, _)) => match huge_blocks(&pagemap, hva.0, hva.0.saturating_add(4096)) {
            Ok(_) => true,
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTTY | libc::EINVAL)) => false,
            Err(e) => return Err(e),
        },
        None => false,
    };
    let mut out = Vec::with_capacity(ranges.len());
    for &(hva, len) in ranges {
        let mut r = from_smaps(&vmas, hva, len);
        if scan_works {
            // Where smaps finds no THP, or all of it is huge (hugetlbfs), there is nothing to
            // find; the blocks are known all the same.
            if r.hugetlb_page_bytes.is_none() && r.thp_bytes > 0 {
                r.huge_blocks = huge_blocks(&pagemap, hva.0, hva.0.saturating_add(len))?;
            }
            r.method = Method::PagemapScan;
        }
        out.push(r);
    }
    Ok(out)
}

/// A range's backing as smaps tells it, before any scan.
fn from_smaps(vmas: &[SmapsVma], hva: Hva, len: u64) -> RangeBacking {
    let end = hva.0.saturating_add(len);
    let mut r = RangeBacking {
        hva,
        len,
        hugetlb_page_bytes: None,
        thp_bytes: 0,
        huge_blocks: Vec::new(),
        method: Method::SmapsOnly,
    };
    let first = vmas.partition_point(|v| v.end <= hva.0);
    for v in vmas[first..].iter().take_while(|v| v.start < end) {
        if v.hugetlb {
            r.hugetlb_page_bytes = r.hugetlb_page_bytes.max(Some(v.kernel_page_bytes));
        }
        let overlap = v.end.min(end) - v.start.max(hva.0);
        let vma_len = v.end - v.start;
        // A mapping larger than the range: its THP bytes by the share of it in the range.
        r.thp_bytes += (v.thp_bytes as u128 * overlap as u128 / vma_len as u128) as u64;
    }
    r
}

/// The 2 MiB blocks (`hva >> 21`) of `[start, end)` mapped huge, by `PAGEMAP_SCAN`.
fn huge_blocks(pagemap: &std::fs::File, start: u64, end: u64) -> io::Result<Vec<u64>> {
    let mut out = Vec::new();
    let mut regions = vec![PageRegion::default(); 512];
    let mut at = start;
    while at < end {
        let (n, walk_end) = sys::pagemap_scan(pagemap, at, end, PAGE_IS_HUGE, &mut regions)?;
        for r in &regions[..n] {
            // A huge mapping covers whole blocks; a region cut by the range's ends counts only
            // for the blocks it starts in.
            let mut b = r.start >> 21;
            while b << 21 < r.end {
                if out.last() != Some(&b) {
                    out.push(b);
                }
                b += 1;
            }
        }
        if walk_end <= at {
            break;
        }
        at = walk_end;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Captured from a process on Linux 6.18 (the test below maps such a region): an 8 MiB
    /// anonymous mapping with MADV_HUGEPAGE, 6 MiB of it in THPs, and one with MADV_NOHUGEPAGE.
    const SMAPS: &str = include_str!("../tests/fixtures/smaps/thp-6.18.txt");

    #[test]
    fn smaps_mappings_and_their_huge_pages_are_read() {
        let vmas = parse_smaps(SMAPS).unwrap();
        let huge: Vec<&SmapsVma> = vmas.iter().filter(|v| v.thp_bytes > 0).collect();
        assert_eq!(huge.len(), 1, "{vmas:#?}");
        assert_eq!(huge[0].end - huge[0].start, 8 << 20);
        assert_eq!(huge[0].thp_bytes, 6 << 20);
        assert_eq!(huge[0].kernel_page_bytes, 4096);
        assert!(!huge[0].hugetlb && !huge[0].no_huge);
        assert!(vmas.iter().any(|v| v.no_huge && v.end - v.start == 4 << 20));
        let r = from_smaps(&vmas, Hva(huge[0].start + (2 << 20)), 4 << 20);
        assert_eq!(r.thp_bytes, 3 << 20, "half of the mapping's THP bytes");
        assert_eq!(
            r.is_huge(Hva(huge[0].start)),
            None,
            "smaps alone does not say where"
        );
    }

    #[test]
    fn smaps_that_is_not_smaps_is_an_error() {
        assert!(
            parse_smaps("Rss: 4 kB\n").is_err(),
            "a field before any mapping"
        );
        assert!(parse_smaps("1000-2000 rw-p 0 0:0 0\nAnonHugePages: four kB\n").is_err());
        assert!(parse_smaps("2000-1000 rw-p 0 0:0 0\n").is_err());
        assert!(parse_smaps("1000-3000 rw-p 0 0:0 0\n2000-4000 rw-p 0 0:0 0\n").is_err());
    }

    /// A hugetlbfs mapping as smaps shows one (KernelPageSize, the `ht` flag), written by hand:
    /// the machine the fixture above comes from has no huge pages reserved.
    #[test]
    fn hugetlb_mappings_are_huge_throughout() {
        let text = "7f0000000000-7f0040000000 rw-s 00000000 00:10 1234 /dev/hugepages/vm\n\
                    Size:            1048576 kB\nKernelPageSize:     2048 kB\n\
                    AnonHugePages:         0 kB\nVmFlags: rd wr sh mr mw me ms de ht sd\n";
        let vmas = parse_smaps(text).unwrap();
        let r = from_smaps(&vmas, Hva(0x7f00_0000_0000), 1 << 30);
        assert_eq!(r.hugetlb_page_bytes, Some(2 << 20));
        assert_eq!(r.is_huge(Hva(0x7f00_0010_0000)), Some(true));
        let s = summarize(&[r]);
        assert_eq!((s.hugetlb_bytes, s.hugetlb_page_bytes), (1 << 30, 2 << 20));
    }

    /// Aligned anonymous memory of this process, `len` bytes, with `advice`, every page written.
    fn mapped(len: usize, advice: libc::c_int) -> (*mut u8, usize) {
        let span = len + BLOCK_BYTES as usize;
        // SAFETY: a fresh private anonymous mapping; nothing else refers to it.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                span,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        let a = (p as usize).next_multiple_of(BLOCK_BYTES as usize) as *mut u8;
        // SAFETY: `[a, a + len)` lies in the mapping made above (it has a block to spare);
        // advising and writing it touches nothing else.
        unsafe {
            libc::madvise(a.cast(), len, advice);
            for i in (0..len).step_by(4096) {
                a.add(i).write_volatile(1);
            }
        }
        (a, len)
    }

    /// THPs of this process found where they are, on the machine the test runs on: as many 2 MiB
    /// blocks mapped huge as smaps counts THP bytes, none where MADV_NOHUGEPAGE forbids them.
    #[test]
    fn this_process_thps_are_found_by_block() {
        let (huge, len) = mapped(8 << 20, libc::MADV_HUGEPAGE);
        let (plain, plain_len) = mapped(4 << 20, libc::MADV_NOHUGEPAGE);
        let ranges = [
            (Hva(huge as u64), len as u64),
            (Hva(plain as u64), plain_len as u64),
        ];
        let pid = std::process::id() as i32;
        let got = read(pid, &ranges, None).unwrap();
        assert_eq!(got[1].thp_bytes, 0);
        assert_eq!(got[1].is_huge(Hva(plain as u64)), Some(false));
        let r = &got[0];
        if r.method == Method::PagemapScan {
            assert_eq!(
                r.huge_blocks.len() as u64 * BLOCK_BYTES,
                r.thp_bytes,
                "{r:?}"
            );
            for &b in &r.huge_blocks {
                assert!(b << 21 >= huge as u64 && b << 21 < huge as u64 + len as u64);
            }
        }
        // Again from the first read: the scan alone finds the same.
        assert_eq!(read(pid, &ranges, Some(&got)).unwrap(), got);
        let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
            .unwrap_or_default();
        eprintln!("THP {}: {r:?}", thp.trim());
    }

    fn range(name: &str, gfn: u64, frames: u64, hva: u64) -> crate::mtree::MappedRange {
        crate::mtree::MappedRange {
            gfns: vtism_proto::GfnRange::new(Gfn(gfn), Gfn(gfn + frames)),
            hva: Hva(hva),
            name: name.into(),
        }
    }

    fn backing(hva: u64, len: u64, method: Method, thp: u64, blocks: Vec<u64>) -> RangeBacking {
        RangeBacking {
            hva: Hva(hva),
            len,
            hugetlb_page_bytes: None,
            thp_bytes: thp,
            huge_blocks: blocks,
            method,
        }
    }

    #[test]
    fn folios_are_the_guest_blocks_the_host_maps_huge() {
        const G: u64 = 1 << 30;
        let mem = GuestMemory::new(vec![
            // 3 GiB below the hole at 0x7f00_0000_0000, 1 GiB above 4 GiB right after it.
            range("pc.ram", 0, 3 * G / 4096, 0x7f00_0000_0000),
            range(
                "pc.ram-high",
                4 * G / 4096,
                G / 4096,
                0x7f00_0000_0000 + 3 * G,
            ),
        ])
        .unwrap();
        let high = 0x7f00_0000_0000 + 3 * G;
        // Scanned: two blocks of the low range, one of the high one.
        let scanned = [
            backing(
                0x7f00_0000_0000,
                3 * G,
                Method::PagemapScan,
                6 << 20,
                vec![0x7f00_0000_0000 >> 21, (0x7f00_0000_0000 >> 21) + 5],
            ),
            backing(
                high,
                G,
                Method::PagemapScan,
                2 << 20,
                vec![(high >> 21) + 1],
            ),
        ];
        let f = folios(&mem, &scanned);
        assert_eq!(f.heads, vec![Gfn(0), Gfn(5 * 512), Gfn(4 * G / 4096 + 512)]);
        assert_eq!((f.assumed, f.misaligned_bytes), (0, 0));
        // smaps only: THPs somewhere in the low range, none in the high one.
        let smaps_only = [
            backing(0x7f00_0000_0000, 3 * G, Method::SmapsOnly, 6 << 20, vec![]),
            backing(high, G, Method::SmapsOnly, 0, vec![]),
        ];
        let f = folios(&mem, &smaps_only);
        assert_eq!(
            (f.heads.len() as u64, f.assumed),
            ((3 * G) >> 21, (3 * G) >> 21)
        );
        // hugetlbfs: every block.
        let mut tlb = scanned.clone();
        tlb[1].hugetlb_page_bytes = Some(2 << 20);
        assert_eq!(folios(&mem, &tlb).heads.len(), 2 + (G >> 21) as usize);
        // Host and guest addresses 4 KiB off modulo 2 MiB: no block can be placed whole.
        let off = GuestMemory::new(vec![range("pc.ram", 0, 1024, 0x7f00_0000_1000)]).unwrap();
        let b = [backing(
            0x7f00_0000_1000,
            4 << 20,
            Method::PagemapScan,
            2 << 20,
            vec![],
        )];
        let f = folios(&off, &b);
        assert_eq!((f.heads.len(), f.misaligned_bytes), (0, 2 << 20));
        // The PC's hole at 640 KiB - 1 MiB: the THP over the first 2 MiB is listed once, from
        // either range, for the engine to keep in place.
        let pc = GuestMemory::new(vec![
            range("low", 0, 0xa0, 0x7f00_0000_0000),
            range("high", 0x100, 1024 - 0x100, 0x7f00_0010_0000),
        ])
        .unwrap();
        let b = [
            backing(0x7f00_0000_0000, 0xa0 << 12, Method::PagemapScan, 0, vec![]),
            backing(
                0x7f00_0010_0000,
                (1024 - 0x100) << 12,
                Method::PagemapScan,
                4 << 20,
                vec![0x7f00_0000_0000 >> 21, (0x7f00_0000_0000 >> 21) + 1],
            ),
        ];
        assert_eq!(folios(&pc, &b).heads, vec![Gfn(0), Gfn(512)]);
        // A backing read for other ranges (a refresh raced a memory map change) says nothing.
        assert!(folios(&off, &scanned).heads.is_empty());
    }
}
