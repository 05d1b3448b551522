//! The 8-byte hint entry (docs/channel.md, "Entry").

use crate::addr::Gfn;
use serde::{Deserialize, Serialize};

pub const GFN_BITS: u32 = 40;
pub const GFN_MASK: u64 = (1 << GFN_BITS) - 1;
pub const COUNT_SHIFT: u32 = 40;
pub const WRITE_BIT: u64 = 1 << 48;
pub const TYPE_SHIFT: u32 = 49;
pub const HUGE_BIT: u64 = 1 << 51;
pub const YOUNG_BIT: u64 = 1 << 52;
pub const RESERVED_MASK: u64 = !((1u64 << 53) - 1);

/// What kind of guest page a frame holds, as the guest knows it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[repr(u8)]
pub enum PageType {
    #[default]
    Unknown = 0,
    Anon = 1,
    File = 2,
    Shmem = 3,
}

impl PageType {
    pub const fn from_bits(bits: u8) -> PageType {
        match bits & 3 {
            1 => PageType::Anon,
            2 => PageType::File,
            3 => PageType::Shmem,
            _ => PageType::Unknown,
        }
    }
}

/// One hint: a frame (or 2 MiB unit) and what the guest saw of it. A newtype over the wire word, so
/// a validated round is just the copied words.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(transparent)]
pub struct HintEntry(pub u64);

impl HintEntry {
    /// Builds an entry; out-of-range values are masked (count saturates at 255).
    pub fn new(
        gfn: Gfn,
        count: u32,
        write: bool,
        page_type: PageType,
        huge: bool,
        young: bool,
    ) -> Self {
        let mut e = gfn.0 & GFN_MASK;
        e |= (count.min(255) as u64) << COUNT_SHIFT;
        if write {
            e |= WRITE_BIT;
        }
        e |= (page_type as u64) << TYPE_SHIFT;
        if huge {
            e |= HUGE_BIT;
        }
        if young {
            e |= YOUNG_BIT;
        }
        HintEntry(e)
    }
    pub const fn gfn(self) -> Gfn {
        Gfn(self.0 & GFN_MASK)
    }
    pub const fn count(self) -> u8 {
        (self.0 >> COUNT_SHIFT) as u8
    }
    pub const fn write(self) -> bool {
        self.0 & WRITE_BIT != 0
    }
    pub const fn page_type(self) -> PageType {
        PageType::from_bits((self.0 >> TYPE_SHIFT) as u8)
    }
    pub const fn huge(self) -> bool {
        self.0 & HUGE_BIT != 0
    }
    pub const fn young(self) -> bool {
        self.0 & YOUNG_BIT != 0
    }
    pub const fn reserved_bits(self) -> u64 {
        self.0 & RESERVED_MASK
    }
    /// The wire words under a slice of entries, so a round is copied straight into its entries.
    pub fn as_words_mut(entries: &mut [HintEntry]) -> &mut [u64] {
        // SAFETY: `HintEntry` is `repr(transparent)` over `u64`, so the slices have the same
        // layout, length and validity; the borrow is carried over unchanged.
        unsafe { std::slice::from_raw_parts_mut(entries.as_mut_ptr().cast::<u64>(), entries.len()) }
    }
    /// The wire words under a slice of entries.
    pub fn as_words(entries: &[HintEntry]) -> &[u64] {
        // SAFETY: as in `as_words_mut`.
        unsafe { std::slice::from_raw_parts(entries.as_ptr().cast::<u64>(), entries.len()) }
    }
    /// 4 KiB frames this entry covers.
    pub const fn frames(self) -> u64 {
        if self.huge() {
            crate::addr::HUGE_FRAMES
        } else {
            1
        }
    }
}

impl std::fmt::Debug for HintEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HintEntry")
            .field("gfn", &format_args!("{:#x}", self.gfn().0))
            .field("count", &self.count())
            .field("write", &self.write())
            .field("type", &self.page_type())
            .field("huge", &self.huge())
            .field("young", &self.young())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_roundtrip_and_do_not_bleed() {
        let e = HintEntry::new(Gfn(GFN_MASK), 999, true, PageType::Shmem, true, true);
        assert_eq!(e.gfn(), Gfn(GFN_MASK));
        assert_eq!(e.count(), 255);
        assert!(e.write() && e.huge() && e.young());
        assert_eq!(e.page_type(), PageType::Shmem);
        assert_eq!(e.reserved_bits(), 0);
        let e = HintEntry::new(Gfn(u64::MAX), 0, false, PageType::Unknown, false, false);
        assert_eq!(e.0, GFN_MASK);
    }
}
