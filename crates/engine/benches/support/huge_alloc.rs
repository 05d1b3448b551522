//! A global allocator for drivers of the engine: large allocations (>= 2 MiB) are 2 MiB-aligned
//! and advised MADV_HUGEPAGE, so per-frame arrays live on transparent huge pages even when THP is
//! in `madvise` mode. Random hint ingestion is TLB-bound otherwise.

use std::alloc::{GlobalAlloc, Layout, System};

pub struct HugeAlloc;

const HUGE: usize = 2 << 20;

unsafe impl GlobalAlloc for HugeAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.size() < HUGE {
            return System.alloc(layout);
        }
        let Ok(l) = Layout::from_size_align(layout.size(), layout.align().max(HUGE)) else {
            return std::ptr::null_mut();
        };
        let p = System.alloc(l);
        if !p.is_null() {
            libc::madvise(p as *mut libc::c_void, l.size() & !(HUGE - 1), libc::MADV_HUGEPAGE);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if layout.size() < HUGE {
            return System.dealloc(ptr, layout);
        }
        let l = Layout::from_size_align_unchecked(layout.size(), layout.align().max(HUGE));
        System.dealloc(ptr, l)
    }
}
