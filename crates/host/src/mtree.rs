//! Guest-physical to host-virtual mapping from QEMU's monitor: `info mtree -f` (the flat view of
//! the `memory` address space) and `gpa2hva` (verified on QEMU 7.2; fixtures in
//! tests/fixtures/qemu-7.2).

use serde::Serialize;
use std::collections::BTreeSet;
use thiserror::Error;
use vtism_proto::{Gfn, GfnRange, Gpa, Hva, RamMap, FRAME_SIZE};

/// A memory map QEMU cannot have meant: the numbers overflow or contradict each other.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum MemoryMapError {
    #[error("RAM range {name} at {start:#x}: offset {offset:#x} overflows")]
    OffsetOverflow {
        name: String,
        start: u64,
        offset: u64,
    },
    #[error("RAM range {name}: host address {hva} is not page-aligned")]
    HvaUnaligned { name: String, hva: Hva },
    #[error("RAM range {name}: host address {hva} + {len:#x} bytes overflows")]
    HvaOverflow { name: String, hva: Hva, len: u64 },
    #[error("RAM ranges {a} and {b} share host memory at {hva} (aliased guest RAM)")]
    HvaAliased { a: String, b: String, hva: Hva },
    #[error("RAM map: {0}")]
    RamMap(#[from] vtism_proto::RamMapError),
}

/// One line of a flat view: `[start, end]` inclusive, as QEMU prints it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FlatRange {
    pub start: u64,
    pub end: u64,
    pub prio: i32,
    /// `ram`, `rom`, `romd`, `i/o`, ...
    pub kind: String,
    /// Memory region name (for RAM, the backend id or `pc.ram`).
    pub name: String,
    /// Offset inside the region (`@...`), 0 when absent.
    pub offset: u64,
}

/// Parses the ranges of the flat view that renders the `memory` address space (the system
/// memory the CPUs see). `None` if the output has no such view.
pub fn parse_memory_flatview(text: &str) -> Option<Vec<FlatRange>> {
    let mut in_view = false;
    let mut is_memory = false;
    let mut out = Vec::new();
    let mut found = false;
    for raw in text.lines() {
        let line = raw.trim_end_matches('\r');
        if line.starts_with("FlatView #") {
            if found {
                break;
            }
            in_view = true;
            is_memory = false;
            continue;
        }
        if !in_view {
            continue;
        }
        let t = line.trim_start();
        if t.starts_with("AS \"") {
            if t.starts_with("AS \"memory\"") {
                is_memory = true;
                found = true;
            }
            continue;
        }
        if !is_memory {
            continue;
        }
        if let Some(r) = parse_range_line(t) {
            out.push(r);
        }
    }
    found.then_some(out)
}

/// `0000000000100000-000000000fffffff (prio 0, ram): m0 @0000000000100000`
fn parse_range_line(t: &str) -> Option<FlatRange> {
    let (span, rest) = t.split_once(' ')?;
    let (a, b) = span.split_once('-')?;
    let start = u64::from_str_radix(a, 16).ok()?;
    let end = u64::from_str_radix(b, 16).ok()?;
    if end < start {
        return None;
    }
    let rest = rest.strip_prefix("(prio ")?;
    let (prio, rest) = rest.split_once(", ")?;
    let prio: i32 = prio.parse().ok()?;
    let (kind, rest) = rest.split_once("): ")?;
    let (name, offset) = match rest.rsplit_once(" @") {
        Some((n, o)) if o.len() == 16 && o.chars().all(|c| c.is_ascii_hexdigit()) => {
            (n, u64::from_str_radix(o, 16).ok()?)
        }
        _ => (rest, 0),
    };
    Some(FlatRange {
        start,
        end,
        prio,
        kind: kind.to_string(),
        name: name.trim().to_string(),
        offset,
    })
}

/// The answer to `gpa2hva <addr>`: `Host virtual address for 0x0 (m0) is 0x7fa6b3e00000`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Gpa2Hva {
    Mapped { gpa: Gpa, region: String, hva: Hva },
    NotMapped,
}

pub fn parse_gpa2hva(text: &str) -> Option<Gpa2Hva> {
    let t = text.trim();
    if t.starts_with("No memory is mapped") {
        return Some(Gpa2Hva::NotMapped);
    }
    let rest = t.strip_prefix("Host virtual address for ")?;
    let (gpa, rest) = rest.split_once(" (")?;
    let (region, rest) = rest.rsplit_once(") is ")?;
    let hex = |s: &str| u64::from_str_radix(s.trim().strip_prefix("0x")?, 16).ok();
    Some(Gpa2Hva::Mapped {
        gpa: Gpa(hex(gpa)?),
        region: region.to_string(),
        hva: Hva(hex(rest)?),
    })
}

/// Guest RAM ranges of the flat view: `ram` ranges whose region is a RAM backend (`ram_names`),
/// trimmed to whole 4 KiB frames. Device RAM (the ivshmem BAR, VGA memory) and ROM are left out.
/// Ranges at the very top of the address space are never RAM and are dropped; an offset that
/// overflows is a lie and fails the whole map.
pub fn ram_ranges(
    flat: &[FlatRange],
    ram_names: &BTreeSet<String>,
) -> Result<Vec<FlatRange>, MemoryMapError> {
    let mut out = Vec::new();
    for r in flat
        .iter()
        .filter(|r| r.kind == "ram" && ram_names.contains(&r.name))
    {
        let (Some(start), Some(end_excl)) =
            (r.start.checked_add(FRAME_SIZE - 1), r.end.checked_add(1))
        else {
            continue;
        };
        let (start, end_excl) = (start & !(FRAME_SIZE - 1), end_excl & !(FRAME_SIZE - 1));
        if end_excl <= start {
            continue;
        }
        let offset = r
            .offset
            .checked_add(start - r.start)
            .filter(|o| o.checked_add(end_excl - start).is_some())
            .ok_or_else(|| MemoryMapError::OffsetOverflow {
                name: r.name.clone(),
                start: r.start,
                offset: r.offset,
            })?;
        out.push(FlatRange {
            start,
            end: end_excl - 1,
            offset,
            ..r.clone()
        });
    }
    Ok(out)
}

/// A RAM range with its host-virtual base in QEMU.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MappedRange {
    pub gfns: GfnRange,
    pub hva: Hva,
    pub name: String,
}

impl MappedRange {
    /// Bytes of guest RAM in the range (saturating: a range so large is refused anyway).
    pub fn len_bytes(&self) -> u64 {
        (self.gfns.end.0.saturating_sub(self.gfns.start.0)).saturating_mul(FRAME_SIZE)
    }
}

/// The VM's guest RAM: ranges sorted by address with their HVAs, and the matching RamMap.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GuestMemory {
    pub ranges: Vec<MappedRange>,
    pub ram: RamMap,
}

impl GuestMemory {
    /// Checks what a lying QEMU could get wrong: guest ranges that overlap (RamMap), host
    /// addresses that are unaligned, run past the end of the address space, or serve two guest
    /// ranges at once (a page moved for one would silently move the other).
    pub fn new(mut ranges: Vec<MappedRange>) -> Result<GuestMemory, MemoryMapError> {
        ranges.sort_by_key(|r| r.gfns.start);
        let ram = RamMap::new(ranges.iter().map(|r| r.gfns).collect())?;
        let mut spans = Vec::with_capacity(ranges.len());
        for r in &ranges {
            if r.hva.0 % FRAME_SIZE != 0 {
                return Err(MemoryMapError::HvaUnaligned {
                    name: r.name.clone(),
                    hva: r.hva,
                });
            }
            let len = r.len_bytes();
            let end = r
                .hva
                .0
                .checked_add(len)
                .ok_or(MemoryMapError::HvaOverflow {
                    name: r.name.clone(),
                    hva: r.hva,
                    len,
                })?;
            spans.push((r.hva.0, end, &r.name));
        }
        spans.sort_unstable();
        for w in spans.windows(2) {
            if w[1].0 < w[0].1 {
                return Err(MemoryMapError::HvaAliased {
                    a: w[0].2.clone(),
                    b: w[1].2.clone(),
                    hva: Hva(w[1].0),
                });
            }
        }
        Ok(GuestMemory { ranges, ram })
    }

    pub fn bytes(&self) -> u64 {
        self.ram.frames() * FRAME_SIZE
    }

    /// Host-virtual address of a guest frame.
    pub fn hva(&self, gfn: Gfn) -> Option<Hva> {
        let k = self.ranges.partition_point(|r| r.gfns.start <= gfn);
        let r = self.ranges.get(k.checked_sub(1)?)?;
        if !r.gfns.contains(gfn) {
            return None;
        }
        // `new` checked that the whole range fits; checked anyway, a lie must not wrap.
        let off = (gfn.0 - r.gfns.start.0).checked_mul(FRAME_SIZE)?;
        r.hva.0.checked_add(off).map(Hva)
    }

    /// The frames at dense indexes `[first, first + n)` (`RamMap` order) with their host
    /// addresses, in one pass over the ranges: no search per frame (a placement sweep asks for
    /// millions).
    pub fn dense_frames(&self, first: u64, n: u64) -> (Vec<Gfn>, Vec<Hva>) {
        let end = first.saturating_add(n).min(self.ram.frames());
        let cap = end.saturating_sub(first) as usize;
        let (mut gfns, mut hvas) = (Vec::with_capacity(cap), Vec::with_capacity(cap));
        // `ram` has one range per mapped range, in the same (address) order.
        for ((span, at), m) in self.ram.index_spans().zip(&self.ranges) {
            let (lo, hi) = (first.max(at), end.min(at + span.frames()));
            for i in lo..hi {
                let off = i - at;
                gfns.push(Gfn(span.start.0 + off));
                hvas.push(Hva(m.hva.0 + off * FRAME_SIZE));
            }
        }
        (gfns, hvas)
    }

    /// Same backing memory at the same addresses: a refresh that changed nothing.
    pub fn same_as(&self, o: &GuestMemory) -> bool {
        self.ranges == o.ranges
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_line_forms() {
        let r = parse_range_line(
            "0000000000100000-000000000fffffff (prio 0, ram): m0 @0000000000100000",
        )
        .unwrap();
        assert_eq!((r.start, r.end, r.offset), (0x100000, 0xfffffff, 0x100000));
        assert_eq!((r.kind.as_str(), r.name.as_str(), r.prio), ("ram", "m0", 0));
        let r = parse_range_line("00000000fee00000-00000000feefffff (prio 4096, i/o): apic-msi")
            .unwrap();
        assert_eq!(
            (r.kind.as_str(), r.name.as_str(), r.offset),
            ("i/o", "apic-msi", 0)
        );
        assert!(parse_range_line("garbage").is_none());
        assert!(parse_range_line("0010-0000 (prio 0, ram): x").is_none());
    }

    #[test]
    fn gpa2hva_forms() {
        assert_eq!(
            parse_gpa2hva("Host virtual address for 0x10000000 (m1) is 0x7fa6a3c00000\r\n"),
            Some(Gpa2Hva::Mapped {
                gpa: Gpa(0x10000000),
                region: "m1".into(),
                hva: Hva(0x7fa6a3c00000)
            })
        );
        assert_eq!(
            parse_gpa2hva("No memory is mapped at address 0x80000000\r\n"),
            Some(Gpa2Hva::NotMapped)
        );
        assert_eq!(parse_gpa2hva("unknown command: 'gpa2hva'"), None);
    }

    #[test]
    fn unaligned_ranges_are_trimmed() {
        let names: BTreeSet<String> = ["m".to_string()].into();
        let flat = vec![FlatRange {
            start: 0x800,
            end: 0x2fff,
            prio: 0,
            kind: "ram".into(),
            name: "m".into(),
            offset: 0x800,
        }];
        let r = ram_ranges(&flat, &names).unwrap();
        assert_eq!(
            (r[0].start, r[0].end, r[0].offset),
            (0x1000, 0x2fff, 0x1000)
        );
        let tiny = vec![FlatRange {
            start: 0x800,
            end: 0x8ff,
            ..flat[0].clone()
        }];
        assert!(ram_ranges(&tiny, &names).unwrap().is_empty());
    }

    #[test]
    fn hva_lookup() {
        let m = GuestMemory::new(vec![
            MappedRange {
                gfns: GfnRange::new(Gfn(0x100), Gfn(0x200)),
                hva: Hva(0x7000_0010_0000),
                name: "m0".into(),
            },
            MappedRange {
                gfns: GfnRange::new(Gfn(0), Gfn(0xa0)),
                hva: Hva(0x7000_0000_0000),
                name: "m0".into(),
            },
        ])
        .unwrap();
        assert_eq!(m.hva(Gfn(1)), Some(Hva(0x7000_0000_1000)));
        assert_eq!(m.hva(Gfn(0x100)), Some(Hva(0x7000_0010_0000)));
        assert_eq!(m.hva(Gfn(0xa0)), None);
        assert_eq!(m.hva(Gfn(0x200)), None);
        assert_eq!(m.bytes(), (0x100 + 0xa0) * 4096);
    }

    fn range(start: u64, end: u64, hva: u64, name: &str) -> MappedRange {
        MappedRange {
            gfns: GfnRange::new(Gfn(start), Gfn(end)),
            hva: Hva(hva),
            name: name.into(),
        }
    }

    #[test]
    fn lying_offsets_are_refused_not_wrapped() {
        let names: BTreeSet<String> = ["m".to_string()].into();
        let near_top = |start, end, offset| FlatRange {
            start,
            end,
            prio: 0,
            kind: "ram".into(),
            name: "m".into(),
            offset,
        };
        // mtree.rs used to add the trim to the offset unchecked: a panic in debug builds.
        let e = ram_ranges(&[near_top(0x800, 0x2fff, u64::MAX - 0x10)], &names).unwrap_err();
        assert!(matches!(e, MemoryMapError::OffsetOverflow { .. }), "{e}");
        let e = ram_ranges(&[near_top(0, 0xffff, u64::MAX - 0xfff)], &names).unwrap_err();
        assert!(matches!(e, MemoryMapError::OffsetOverflow { .. }), "{e}");
        // A range ending at the top of the address space is not RAM; it is dropped, not wrapped.
        let top = ram_ranges(&[near_top(u64::MAX - 0xffff, u64::MAX, 0)], &names).unwrap();
        assert!(top.is_empty());
    }

    /// The sweep's look-up gives what a search per frame gives, across holes and backends.
    #[test]
    fn dense_frames_match_the_frame_by_frame_lookup() {
        let m = GuestMemory::new(vec![
            range(0x100000, 0x100040, 0x7100_0000_0000, "b"),
            range(0, 0xa0, 0x7000_0000_0000, "a"),
            range(0x100, 0x180, 0x7000_0010_0000, "c"),
        ])
        .unwrap();
        let total = m.ram.frames();
        for (first, n) in [
            (0, total),
            (0x9e, 4),
            (0x11f, 3),
            (total - 1, 5),
            (total, 1),
        ] {
            let (gfns, hvas) = m.dense_frames(first, n);
            let want: Vec<Gfn> = (first..(first + n).min(total))
                .map(|i| m.ram.gfn_at(i).unwrap())
                .collect();
            assert_eq!(gfns, want, "[{first}, +{n})");
            let by_frame: Vec<Hva> = want.iter().map(|&g| m.hva(g).unwrap()).collect();
            assert_eq!(hvas, by_frame, "[{first}, +{n})");
        }
    }

    #[test]
    fn lying_host_addresses_are_refused() {
        let e = GuestMemory::new(vec![range(0, 0x10, 0x7000_0000_0800, "m")]).unwrap_err();
        assert!(matches!(e, MemoryMapError::HvaUnaligned { .. }), "{e}");
        let e = GuestMemory::new(vec![range(0, 0x10, u64::MAX - 0xfff - 0x7000, "m")]).unwrap_err();
        assert!(matches!(e, MemoryMapError::HvaOverflow { .. }), "{e}");
        let e = GuestMemory::new(vec![range(0, u64::MAX >> 8, 0x1000, "m")]).unwrap_err();
        assert!(matches!(e, MemoryMapError::HvaOverflow { .. }), "{e}");
        // Two guest ranges on the same host pages: one move would move both.
        let e = GuestMemory::new(vec![
            range(0, 0x100, 0x7000_0000_0000, "a"),
            range(0x100000, 0x100010, 0x7000_0000_0000 + 0xff000, "b"),
        ])
        .unwrap_err();
        assert!(matches!(e, MemoryMapError::HvaAliased { .. }), "{e}");
        // Overlapping guest ranges.
        let e = GuestMemory::new(vec![
            range(0, 0x100, 0x7000_0000_0000, "a"),
            range(0x80, 0x180, 0x7100_0000_0000, "b"),
        ])
        .unwrap_err();
        assert!(matches!(e, MemoryMapError::RamMap(_)), "{e}");
        // Adjacent host ranges are fine, and the last frame below the top of the address
        // space resolves without wrapping.
        let m = GuestMemory::new(vec![
            range(0, 0x100, 0x7000_0000_0000, "a"),
            range(0x100, 0x200, 0x7000_0010_0000, "b"),
            range(0x1000, 0x100f, u64::MAX - 0xffff, "c"),
        ])
        .unwrap();
        assert_eq!(m.hva(Gfn(0x100e)), Some(Hva(u64::MAX - 0x1fff)));
        assert_eq!(m.hva(Gfn(0x100f)), None);
    }
}
