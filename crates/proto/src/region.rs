//! How the channel touches shared memory.
//!
//! The guest can change any byte of the region at any moment, so no `&[u8]` or `&[u64]` is ever
//! formed over it: every access is an aligned atomic load or store of one word, and the reader
//! copies what it needs out before looking at it. The guest lives outside the Rust abstract
//! machine; atomics are used so the compiler neither tears, merges, re-reads nor elides an access
//! and so acquire/release become the right barriers. Nothing here assumes the guest follows the
//! protocol: the reader validates the copy.
//!
//! All values are little-endian on the wire; the methods convert, callers see native integers.

use std::fmt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use thiserror::Error;

/// An access outside the region or not naturally aligned.
#[derive(Clone, Copy, Debug, Error, PartialEq, Eq)]
#[error(
    "{size}-byte access at offset {offset:#x} outside or misaligned in a {region_len}-byte region"
)]
pub struct AccessError {
    pub offset: usize,
    pub size: usize,
    pub region_len: usize,
}

/// Word-granular access to a shared-memory region.
///
/// Offsets are in bytes and must be naturally aligned (4 for `u32`, 8 for `u64`); an access that
/// is misaligned or not wholly inside `len()` returns [`AccessError`] and touches nothing.
/// Implementations must be memory-safe for any argument: the reader trusts `len()` but nothing
/// else about the contents.
pub trait SharedRegion {
    /// Bytes in the region; always a multiple of 8.
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    fn load_u64(&self, offset: usize) -> Result<u64, AccessError>;
    fn load_u64_acquire(&self, offset: usize) -> Result<u64, AccessError>;
    fn load_u32(&self, offset: usize) -> Result<u32, AccessError>;
    fn load_u32_acquire(&self, offset: usize) -> Result<u32, AccessError>;
    fn store_u64(&self, offset: usize, value: u64) -> Result<(), AccessError>;
    fn store_u64_release(&self, offset: usize, value: u64) -> Result<(), AccessError>;
    fn store_u32(&self, offset: usize, value: u32) -> Result<(), AccessError>;
    /// Copies `out.len()` words starting at `offset` (relaxed loads, one per word).
    fn copy_words(&self, offset: usize, out: &mut [u64]) -> Result<(), AccessError>;
    /// Stores `words` starting at `offset` (relaxed stores, one per word).
    fn store_words(&self, offset: usize, words: &[u64]) -> Result<(), AccessError>;
}

/// Checks that an access of `size` bytes at `offset` is aligned and inside the region.
fn check(offset: usize, size: usize, region_len: usize) -> Result<(), AccessError> {
    let err = AccessError {
        offset,
        size,
        region_len,
    };
    if size == 0 || offset % size.min(8) != 0 {
        return Err(err);
    }
    match offset.checked_add(size) {
        Some(end) if end <= region_len => Ok(()),
        _ => Err(err),
    }
}

/// The word view shared by both implementations: loads, copies and u64 stores.
fn words_at(
    words: &[AtomicU64],
    len: usize,
    offset: usize,
    n: usize,
) -> Result<&[AtomicU64], AccessError> {
    let size = n.checked_mul(8).ok_or(AccessError {
        offset,
        size: usize::MAX,
        region_len: len,
    })?;
    if n == 0 {
        // An empty copy is valid anywhere up to the end, as long as it is aligned.
        return if offset % 8 == 0 && offset <= len {
            Ok(&[])
        } else {
            Err(AccessError {
                offset,
                size: 0,
                region_len: len,
            })
        };
    }
    check(offset, size, len)?;
    let first = offset / 8;
    words.get(first..first + n).ok_or(AccessError {
        offset,
        size,
        region_len: len,
    })
}

fn half_of(word: u64, offset: usize) -> u32 {
    // Little-endian: the u32 at byte 0 of a word is its low half.
    if offset % 8 == 0 {
        word as u32
    } else {
        (word >> 32) as u32
    }
}

fn load_u32_via_word(
    words: &[AtomicU64],
    len: usize,
    offset: usize,
    order: Ordering,
) -> Result<u32, AccessError> {
    check(offset, 4, len)?;
    let w = words.get(offset / 8).ok_or(AccessError {
        offset,
        size: 4,
        region_len: len,
    })?;
    Ok(half_of(u64::from_le(w.load(order)), offset))
}

fn copy_out(
    words: &[AtomicU64],
    len: usize,
    offset: usize,
    out: &mut [u64],
) -> Result<(), AccessError> {
    let src = words_at(words, len, offset, out.len())?;
    for (o, w) in out.iter_mut().zip(src) {
        *o = u64::from_le(w.load(Ordering::Relaxed));
    }
    Ok(())
}

fn store_in(
    words: &[AtomicU64],
    len: usize,
    offset: usize,
    data: &[u64],
) -> Result<(), AccessError> {
    let dst = words_at(words, len, offset, data.len())?;
    for (w, &v) in dst.iter().zip(data) {
        w.store(v.to_le(), Ordering::Relaxed);
    }
    Ok(())
}

fn word(words: &[AtomicU64], len: usize, offset: usize) -> Result<&AtomicU64, AccessError> {
    words_at(words, len, offset, 1)?.first().ok_or(AccessError {
        offset,
        size: 8,
        region_len: len,
    })
}

/// A region of memory mapped by someone else (the ivshmem BAR file the daemon maps, or the BAR in
/// the guest). Does not own the mapping.
pub struct MmapRegion {
    ptr: NonNull<AtomicU64>,
    len: usize,
}

// SAFETY: every access goes through atomics, so sharing the handle between threads cannot cause a
// data race in this process; the memory's validity is the `new` caller's obligation.
unsafe impl Send for MmapRegion {}
unsafe impl Sync for MmapRegion {}

/// Why a pointer cannot be used as a region.
#[derive(Clone, Copy, Debug, Error, PartialEq, Eq)]
pub enum RegionError {
    #[error("region pointer {0:#x} is not 8-byte aligned")]
    Misaligned(usize),
    #[error("region length {0} is not a multiple of 8")]
    BadLength(usize),
}

impl MmapRegion {
    /// Wraps `len` bytes at `ptr`.
    ///
    /// # Safety
    ///
    /// For as long as the returned value (or anything borrowing it) lives, `ptr .. ptr + len` must
    /// be valid for reads and writes, mapped, and not unmapped or remapped; other parties may
    /// write it concurrently, but this process must touch it only through this handle or through
    /// atomics (never through ordinary references). Alignment and length are checked here.
    pub unsafe fn new(ptr: NonNull<u8>, len: usize) -> Result<Self, RegionError> {
        if ptr.as_ptr() as usize % 8 != 0 {
            return Err(RegionError::Misaligned(ptr.as_ptr() as usize));
        }
        if len % 8 != 0 {
            return Err(RegionError::BadLength(len));
        }
        Ok(MmapRegion {
            ptr: ptr.cast(),
            len,
        })
    }

    fn words(&self) -> &[AtomicU64] {
        // SAFETY: `new`'s contract: the memory is valid, 8-aligned and live for `self`'s lifetime;
        // `AtomicU64` has interior mutability, so a shared slice of it over memory that others
        // write concurrently is allowed, and `len` is a multiple of 8.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len / 8) }
    }

    fn atomic_u32(&self, offset: usize) -> Result<&AtomicU32, AccessError> {
        check(offset, 4, self.len)?;
        // SAFETY: `check` proved `offset .. offset + 4` is inside the mapping and 4-aligned (the
        // base is 8-aligned); the memory is valid for `self`'s lifetime by `new`'s contract.
        Ok(
            unsafe {
                AtomicU32::from_ptr(self.ptr.as_ptr().cast::<u8>().add(offset).cast::<u32>())
            },
        )
    }
}

impl fmt::Debug for MmapRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MmapRegion")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .finish()
    }
}

impl SharedRegion for MmapRegion {
    fn len(&self) -> usize {
        self.len
    }
    fn load_u64(&self, offset: usize) -> Result<u64, AccessError> {
        Ok(u64::from_le(
            word(self.words(), self.len, offset)?.load(Ordering::Relaxed),
        ))
    }
    fn load_u64_acquire(&self, offset: usize) -> Result<u64, AccessError> {
        Ok(u64::from_le(
            word(self.words(), self.len, offset)?.load(Ordering::Acquire),
        ))
    }
    fn load_u32(&self, offset: usize) -> Result<u32, AccessError> {
        Ok(u32::from_le(
            self.atomic_u32(offset)?.load(Ordering::Relaxed),
        ))
    }
    fn load_u32_acquire(&self, offset: usize) -> Result<u32, AccessError> {
        Ok(u32::from_le(
            self.atomic_u32(offset)?.load(Ordering::Acquire),
        ))
    }
    fn store_u64(&self, offset: usize, value: u64) -> Result<(), AccessError> {
        word(self.words(), self.len, offset)?.store(value.to_le(), Ordering::Relaxed);
        Ok(())
    }
    fn store_u64_release(&self, offset: usize, value: u64) -> Result<(), AccessError> {
        word(self.words(), self.len, offset)?.store(value.to_le(), Ordering::Release);
        Ok(())
    }
    fn store_u32(&self, offset: usize, value: u32) -> Result<(), AccessError> {
        self.atomic_u32(offset)?
            .store(value.to_le(), Ordering::Relaxed);
        Ok(())
    }
    fn copy_words(&self, offset: usize, out: &mut [u64]) -> Result<(), AccessError> {
        copy_out(self.words(), self.len, offset, out)
    }
    fn store_words(&self, offset: usize, words: &[u64]) -> Result<(), AccessError> {
        store_in(self.words(), self.len, offset, words)
    }
}

/// A heap-backed region: tests, vectors, fuzzing and the simulator. `Sync`, so a writer thread and
/// a reader thread can share it through an `Arc`.
pub struct OwnedRegion {
    words: Box<[AtomicU64]>,
}

impl OwnedRegion {
    /// A zeroed region of `len` bytes, rounded up to a multiple of 8.
    pub fn zeroed(len: usize) -> Self {
        let n = len.div_ceil(8);
        OwnedRegion {
            words: (0..n).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// A region holding `bytes`, zero-padded to a multiple of 8.
    pub fn from_bytes(bytes: &[u8]) -> Self {
        OwnedRegion {
            words: bytes
                .chunks(8)
                .map(|c| {
                    let mut w = [0u8; 8];
                    w[..c.len()].copy_from_slice(c);
                    AtomicU64::new(u64::from_ne_bytes(w))
                })
                .collect(),
        }
    }

    /// A snapshot of the bytes (little-endian, as on the wire).
    pub fn to_bytes(&self) -> Vec<u8> {
        self.words
            .iter()
            .flat_map(|w| w.load(Ordering::Relaxed).to_ne_bytes())
            .collect()
    }
}

impl fmt::Debug for OwnedRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OwnedRegion")
            .field("len", &self.len())
            .finish()
    }
}

impl SharedRegion for OwnedRegion {
    fn len(&self) -> usize {
        self.words.len() * 8
    }
    fn load_u64(&self, offset: usize) -> Result<u64, AccessError> {
        Ok(u64::from_le(
            word(&self.words, self.len(), offset)?.load(Ordering::Relaxed),
        ))
    }
    fn load_u64_acquire(&self, offset: usize) -> Result<u64, AccessError> {
        Ok(u64::from_le(
            word(&self.words, self.len(), offset)?.load(Ordering::Acquire),
        ))
    }
    fn load_u32(&self, offset: usize) -> Result<u32, AccessError> {
        load_u32_via_word(&self.words, self.len(), offset, Ordering::Relaxed)
    }
    fn load_u32_acquire(&self, offset: usize) -> Result<u32, AccessError> {
        load_u32_via_word(&self.words, self.len(), offset, Ordering::Acquire)
    }
    fn store_u64(&self, offset: usize, value: u64) -> Result<(), AccessError> {
        word(&self.words, self.len(), offset)?.store(value.to_le(), Ordering::Relaxed);
        Ok(())
    }
    fn store_u64_release(&self, offset: usize, value: u64) -> Result<(), AccessError> {
        word(&self.words, self.len(), offset)?.store(value.to_le(), Ordering::Release);
        Ok(())
    }
    fn store_u32(&self, offset: usize, value: u32) -> Result<(), AccessError> {
        check(offset, 4, self.len())?;
        let w = word(&self.words, self.len(), offset & !7)?;
        // Each word has one owner (guest or host) in this process, so the update cannot livelock.
        let shift = if offset % 8 == 0 { 0 } else { 32 };
        let mask = !(0xffff_ffffu64 << shift);
        let _ = w.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
            let native = u64::from_le(old);
            Some(((native & mask) | (u64::from(value) << shift)).to_le())
        });
        Ok(())
    }
    fn copy_words(&self, offset: usize, out: &mut [u64]) -> Result<(), AccessError> {
        copy_out(&self.words, self.len(), offset, out)
    }
    fn store_words(&self, offset: usize, words: &[u64]) -> Result<(), AccessError> {
        store_in(&self.words, self.len(), offset, words)
    }
}

macro_rules! forward_region {
    ($($t:ty),*) => {$(
        impl<T: SharedRegion + ?Sized> SharedRegion for $t {
            fn len(&self) -> usize { (**self).len() }
            fn load_u64(&self, o: usize) -> Result<u64, AccessError> { (**self).load_u64(o) }
            fn load_u64_acquire(&self, o: usize) -> Result<u64, AccessError> { (**self).load_u64_acquire(o) }
            fn load_u32(&self, o: usize) -> Result<u32, AccessError> { (**self).load_u32(o) }
            fn load_u32_acquire(&self, o: usize) -> Result<u32, AccessError> { (**self).load_u32_acquire(o) }
            fn store_u64(&self, o: usize, v: u64) -> Result<(), AccessError> { (**self).store_u64(o, v) }
            fn store_u64_release(&self, o: usize, v: u64) -> Result<(), AccessError> { (**self).store_u64_release(o, v) }
            fn store_u32(&self, o: usize, v: u32) -> Result<(), AccessError> { (**self).store_u32(o, v) }
            fn copy_words(&self, o: usize, out: &mut [u64]) -> Result<(), AccessError> { (**self).copy_words(o, out) }
            fn store_words(&self, o: usize, w: &[u64]) -> Result<(), AccessError> { (**self).store_words(o, w) }
        }
    )*};
}
forward_region!(&T, Box<T>, std::sync::Arc<T>);

#[cfg(test)]
mod tests {
    use super::*;

    fn exercise(r: &dyn SharedRegion) {
        assert_eq!(r.len(), 64);
        r.store_u64(8, 0x1122_3344_5566_7788).unwrap();
        assert_eq!(r.load_u64(8).unwrap(), 0x1122_3344_5566_7788);
        assert_eq!(r.load_u32(8).unwrap(), 0x5566_7788);
        assert_eq!(r.load_u32_acquire(12).unwrap(), 0x1122_3344);
        r.store_u32(12, 0xdead_beef).unwrap();
        assert_eq!(r.load_u64_acquire(8).unwrap(), 0xdead_beef_5566_7788);
        r.store_u64_release(56, 7).unwrap();
        r.store_words(16, &[1, 2, 3]).unwrap();
        let mut out = [0u64; 4];
        r.copy_words(16, &mut out).unwrap();
        assert_eq!(out, [1, 2, 3, 0]);
        let mut one = [0u64; 1];
        r.copy_words(56, &mut one).unwrap();
        assert_eq!(one, [7]);
        // Bounds and alignment are errors, never panics or partial accesses.
        assert!(r.load_u64(60).is_err());
        assert!(r.load_u64(64).is_err());
        assert!(r.load_u64(4).is_err());
        assert!(r.load_u32(62).is_err());
        assert!(r.load_u32(2).is_err());
        assert!(r.store_u64(usize::MAX - 3, 1).is_err());
        assert!(r.copy_words(56, &mut [0u64; 2]).is_err());
        assert!(r.copy_words(usize::MAX & !7, &mut [0u64; 1]).is_err());
        assert!(r.store_words(48, &[9, 9, 9]).is_err());
        assert_eq!(
            r.load_u64(48).unwrap(),
            0,
            "a failed bulk store wrote nothing"
        );
        assert!(r.copy_words(64, &mut []).is_ok());
        assert!(r.copy_words(72, &mut []).is_err());
    }

    #[test]
    fn owned_region_access() {
        exercise(&OwnedRegion::zeroed(64));
    }

    #[test]
    fn mmap_region_access_over_foreign_buffer() {
        let mut backing = vec![0u64; 8];
        let ptr = NonNull::new(backing.as_mut_ptr().cast::<u8>()).unwrap();
        // SAFETY: `backing` outlives `r` and is touched only through `r` meanwhile.
        {
            let r = unsafe { MmapRegion::new(ptr, 64) }.unwrap();
            exercise(&r);
        }
        assert_eq!(backing[1], u64::from_le(0xdead_beef_5566_7788));
    }

    #[test]
    fn mmap_region_rejects_misaligned_or_odd_length() {
        let mut backing = vec![0u64; 4];
        let base = backing.as_mut_ptr().cast::<u8>();
        // SAFETY: only alignment/length validation runs; nothing is accessed.
        unsafe {
            let p = NonNull::new(base.add(4)).unwrap();
            assert!(matches!(
                MmapRegion::new(p, 16),
                Err(RegionError::Misaligned(_))
            ));
            let p = NonNull::new(base).unwrap();
            assert_eq!(
                MmapRegion::new(p, 12).unwrap_err(),
                RegionError::BadLength(12)
            );
        }
    }

    #[test]
    fn owned_bytes_roundtrip_pads() {
        let r = OwnedRegion::from_bytes(&[1, 2, 3, 4, 5, 6, 7, 8, 9]);
        assert_eq!(r.len(), 16);
        assert_eq!(r.load_u64(0).unwrap(), 0x0807_0605_0403_0201);
        assert_eq!(r.load_u64(8).unwrap(), 9);
        assert_eq!(&r.to_bytes()[..9], &[1, 2, 3, 4, 5, 6, 7, 8, 9]);
    }
}
