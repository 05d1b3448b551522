//! Guest and host address types, in the spirit of rust-vmm's `vm-memory`: a frame number and an
//! address are different things, and so are guest-physical and host-virtual addresses.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Bytes in a guest frame (x86 base page).
pub const FRAME_SIZE: u64 = 4096;
/// log2 of [`FRAME_SIZE`].
pub const FRAME_SHIFT: u32 = 12;
/// 4 KiB frames in a 2 MiB unit.
pub const HUGE_FRAMES: u64 = 512;

/// Guest frame number: a guest-physical address shifted right by [`FRAME_SHIFT`].
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Gfn(pub u64);

/// Guest-physical address.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Gpa(pub u64);

/// Host-virtual address in the VMM (QEMU) process. Laid out as a `u64`, so a slice of them is
/// the address array move_pages(2) takes.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
#[repr(transparent)]
pub struct Hva(pub u64);

impl Gfn {
    pub const fn gpa(self) -> Gpa {
        Gpa(self.0 << FRAME_SHIFT)
    }
    /// The first frame of the 2 MiB unit holding this frame.
    pub const fn huge_head(self) -> Gfn {
        Gfn(self.0 & !(HUGE_FRAMES - 1))
    }
    pub const fn is_huge_aligned(self) -> bool {
        self.0 % HUGE_FRAMES == 0
    }
    pub const fn checked_add(self, frames: u64) -> Option<Gfn> {
        match self.0.checked_add(frames) {
            Some(v) => Some(Gfn(v)),
            None => None,
        }
    }
}

impl Hva {
    /// The address `bytes` further on.
    pub const fn offset(self, bytes: u64) -> Hva {
        Hva(self.0 + bytes)
    }
}

impl Gpa {
    pub const fn gfn(self) -> Gfn {
        Gfn(self.0 >> FRAME_SHIFT)
    }
}

impl fmt::Display for Gfn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "gfn:{:#x}", self.0)
    }
}
impl fmt::Display for Gpa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "gpa:{:#x}", self.0)
    }
}
impl fmt::Display for Hva {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "hva:{:#x}", self.0)
    }
}
