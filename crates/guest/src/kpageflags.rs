//! `/proc/kpageflags`: one u64 of flags per page frame (`Documentation/admin-guide/mm/pagemap.rst`).

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use vtism_proto::PageType;

pub const LRU: u64 = 1 << 5;
pub const SLAB: u64 = 1 << 7;
pub const BUDDY: u64 = 1 << 10;
pub const MMAP: u64 = 1 << 11;
pub const ANON: u64 = 1 << 12;
pub const SWAPBACKED: u64 = 1 << 14;
pub const COMPOUND_HEAD: u64 = 1 << 15;
pub const COMPOUND_TAIL: u64 = 1 << 16;
pub const HUGE: u64 = 1 << 17;
pub const UNEVICTABLE: u64 = 1 << 18;
pub const NOPAGE: u64 = 1 << 20;
pub const THP: u64 = 1 << 22;
pub const OFFLINE: u64 = 1 << 23;
pub const ZERO_PAGE: u64 = 1 << 24;
pub const PGTABLE: u64 = 1 << 26;

/// Page type of a frame: anonymous, else shmem (swap-backed, not anonymous), else file (on an
/// LRU or mapped), else unknown.
pub fn page_type(flags: u64) -> PageType {
    if flags & ANON != 0 {
        PageType::Anon
    } else if flags & SWAPBACKED != 0 {
        PageType::Shmem
    } else if flags & (LRU | MMAP) != 0 {
        PageType::File
    } else {
        PageType::Unknown
    }
}

/// A frame worth reporting: user memory (on an LRU list, mapped, anonymous, or unevictable),
/// not free, not a kernel page (slab, page table, hugetlb), not the shared zero page.
pub fn is_user_page(flags: u64) -> bool {
    flags & (NOPAGE | BUDDY | SLAB | PGTABLE | OFFLINE | ZERO_PAGE | HUGE) == 0
        && flags & (LRU | MMAP | ANON | UNEVICTABLE) != 0
}

/// The head of a transparent huge page.
pub fn is_thp_head(flags: u64) -> bool {
    flags & (THP | COMPOUND_HEAD) == THP | COMPOUND_HEAD
}

/// A tail page of a compound page.
pub fn is_tail(flags: u64) -> bool {
    flags & COMPOUND_TAIL != 0
}

/// A source of page flags by frame number.
pub trait FlagSource {
    /// Flags of frames `first .. first + out.len()`; frames past the end read as `NOPAGE`.
    fn flags(&self, first: u64, out: &mut [u64]) -> io::Result<()>;
}

/// `/proc/kpageflags` (needs CAP_SYS_ADMIN).
pub struct KpageFlags(File);

impl KpageFlags {
    pub fn open(path: &Path) -> io::Result<KpageFlags> {
        File::open(path).map(KpageFlags)
    }
}

impl FlagSource for KpageFlags {
    fn flags(&self, first: u64, out: &mut [u64]) -> io::Result<()> {
        let mut buf = vec![0u8; out.len() * 8];
        let mut done = 0;
        while done < buf.len() {
            let n = self.0.read_at(&mut buf[done..], first * 8 + done as u64)?;
            if n == 0 {
                break;
            }
            done += n;
        }
        for (i, o) in out.iter_mut().enumerate() {
            *o = if (i + 1) * 8 <= done {
                u64::from_le_bytes(buf[i * 8..i * 8 + 8].try_into().unwrap())
            } else {
                NOPAGE
            };
        }
        Ok(())
    }
}

impl FlagSource for std::collections::BTreeMap<u64, u64> {
    fn flags(&self, first: u64, out: &mut [u64]) -> io::Result<()> {
        for (i, o) in out.iter_mut().enumerate() {
            *o = self.get(&(first + i as u64)).copied().unwrap_or(BUDDY);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types() {
        assert_eq!(page_type(ANON | SWAPBACKED | LRU | MMAP), PageType::Anon);
        assert_eq!(page_type(SWAPBACKED | LRU | MMAP), PageType::Shmem);
        assert_eq!(page_type(LRU | MMAP), PageType::File);
        assert_eq!(page_type(LRU), PageType::File);
        assert_eq!(page_type(SLAB), PageType::Unknown);
    }

    #[test]
    fn user_pages() {
        assert!(is_user_page(ANON | LRU));
        assert!(is_user_page(UNEVICTABLE | MMAP));
        assert!(!is_user_page(BUDDY));
        assert!(!is_user_page(NOPAGE));
        assert!(!is_user_page(SLAB));
        assert!(!is_user_page(PGTABLE));
        assert!(!is_user_page(ZERO_PAGE | MMAP));
        assert!(!is_user_page(HUGE | COMPOUND_HEAD | MMAP)); // hugetlbfs
        assert!(!is_user_page(0)); // kernel allocation
    }

    #[test]
    fn thp() {
        assert!(is_thp_head(THP | COMPOUND_HEAD | ANON));
        assert!(!is_thp_head(THP | COMPOUND_TAIL | ANON));
        assert!(!is_thp_head(COMPOUND_HEAD | ANON)); // a large folio that is not a THP
        assert!(is_tail(THP | COMPOUND_TAIL));
    }

    #[test]
    fn file_source_reads_little_endian_words() {
        let d = crate::testdir::TestDir::new("kpf");
        let p = d.path().join("kpageflags");
        let mut bytes = Vec::new();
        for v in [ANON, LRU | MMAP, THP | COMPOUND_HEAD] {
            bytes.extend_from_slice(&u64::to_le_bytes(v));
        }
        std::fs::write(&p, bytes).unwrap();
        let k = KpageFlags::open(&p).unwrap();
        let mut out = [0u64; 4];
        k.flags(0, &mut out).unwrap();
        assert_eq!(out, [ANON, LRU | MMAP, THP | COMPOUND_HEAD, NOPAGE]);
        let mut one = [0u64; 1];
        k.flags(2, &mut one).unwrap();
        assert_eq!(one, [THP | COMPOUND_HEAD]);
    }
}
