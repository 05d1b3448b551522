//! System RAM ranges from `/proc/iomem` (root sees real addresses; others see zeros).

/// A guest-physical byte range `[start, end)` (what the agent's `paddr` kdamond monitors).
pub use vtism_damon_sysfs::AddrRange as PhysRange;

/// Top-level `System RAM` lines of `/proc/iomem`, as half-open ranges, in file order. Ranges
/// shorter than `min_bytes` (the legacy low 640 KiB, for example) are dropped; so are lines
/// that read `00000000-00000000` (an unprivileged reader).
pub fn system_ram(iomem: &str, min_bytes: u64) -> Vec<PhysRange> {
    let mut out = Vec::new();
    for line in iomem.lines() {
        // nested resources are indented; only top-level ones are RAM ranges
        if line.starts_with(' ') {
            continue;
        }
        let Some((range, name)) = line.split_once(" : ") else {
            continue;
        };
        if name.trim() != "System RAM" {
            continue;
        }
        let Some((a, b)) = range.trim().split_once('-') else {
            continue;
        };
        let (Ok(a), Ok(b)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)) else {
            continue;
        };
        if b <= a {
            continue;
        }
        let r = PhysRange {
            start: a,
            end: b + 1,
        };
        if r.end - r.start >= min_bytes {
            out.push(r);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const IOMEM: &str = "\
00000000-00000fff : Reserved
00001000-0009fbff : System RAM
0009fc00-0009ffff : Reserved
000f0000-000fffff : Reserved
  000f0000-000fffff : System ROM
00100000-3ffdffff : System RAM
  1c000000-1d001fff : Kernel code
  1d200000-1dbfffff : Kernel rodata
3ffe0000-3fffffff : Reserved
fe000000-fe003fff : 0000:00:03.0
  fe000000-fe003fff : System RAM
100000000-13fffffff : System RAM
";

    #[test]
    fn top_level_ram_only() {
        let r = system_ram(IOMEM, 0);
        assert_eq!(
            r,
            vec![
                PhysRange {
                    start: 0x1000,
                    end: 0x9fc00
                },
                PhysRange {
                    start: 0x100000,
                    end: 0x3ffe0000
                },
                PhysRange {
                    start: 0x1_0000_0000,
                    end: 0x1_4000_0000
                },
            ]
        );
    }

    #[test]
    fn small_and_unprivileged_ranges_dropped() {
        let r = system_ram(IOMEM, 1 << 20);
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].start, 0x100000);
        let zeros = "00000000-00000000 : System RAM\n00000000-00000000 : System RAM\n";
        assert!(system_ram(zeros, 0).is_empty());
    }
}
