//! What the daemon learns about one VM over QMP: name, pid, guest RAM with host addresses, the
//! channel's backing file, vCPU threads.

use crate::backing;
use crate::mtree::{self, Gpa2Hva, GuestMemory, MappedRange, MemoryMapError};
use crate::process::{self, Vma};
use crate::qmp::{Qmp, QmpError};
use serde::Serialize;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use thiserror::Error;
use vtism_engine::NodeId;
use vtism_proto::{Gfn, GfnRange, Hva, FRAME_SHIFT};

/// More RAM ranges than any real machine has (a PC with all 256 DIMM slots filled has a few
/// hundred); each costs a gpa2hva exchange, so a lying flat view cannot buy unbounded work.
pub const MAX_RAM_RANGES: usize = 1024;

#[derive(Debug, Error)]
pub enum InspectError {
    #[error(transparent)]
    Qmp(#[from] QmpError),
    #[error("`info mtree -f` has no flat view of the `memory` address space")]
    NoFlatView,
    #[error("no guest RAM found in the memory map")]
    NoRam,
    #[error("gpa2hva {gpa:#x}: unexpected answer `{answer}`")]
    Gpa2Hva { gpa: u64, answer: String },
    #[error("gpa2hva {gpa:#x} names region `{got}`, the memory map says `{want}`")]
    RegionMismatch { gpa: u64, got: String, want: String },
    #[error("memory map: {0}")]
    Map(#[from] MemoryMapError),
    #[error("{0} RAM ranges, more than the {MAX_RAM_RANGES} any machine has")]
    TooManyRanges(usize),
    #[error(
        "RAM backend {name}: range at offset {offset:#x} has host base {got}, another has {want}"
    )]
    BackendBase {
        name: String,
        offset: u64,
        got: Hva,
        want: Hva,
    },
    #[error("RAM backend {name}: range ends at offset {end:#x}, past its size {size:#x}")]
    BackendSize { name: String, end: u64, size: u64 },
    #[error("RAM range {name} ({hva} + {len:#x}) is not mapped read-write in the QEMU process")]
    NotMapped { name: String, hva: Hva, len: u64 },
}

impl InspectError {
    /// QEMU answered, and what it said cannot be true (as opposed to a monitor that failed).
    pub fn is_lie(&self) -> bool {
        matches!(
            self,
            InspectError::Gpa2Hva { .. }
                | InspectError::RegionMismatch { .. }
                | InspectError::Map(_)
                | InspectError::TooManyRanges(_)
                | InspectError::BackendBase { .. }
                | InspectError::BackendSize { .. }
                | InspectError::NotMapped { .. }
        )
    }
}

/// An ivshmem-plain device and its memory backend.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct IvshmemDevice {
    /// QOM path of the device.
    pub path: String,
    /// Device id (`-device ...,id=`), empty if anonymous.
    pub id: String,
    /// Backend object id (`/objects/<id>`).
    pub backend: String,
    /// Backing file, if the backend is a file.
    pub mem_path: Option<PathBuf>,
    pub size: Option<u64>,
}

#[derive(Clone, Debug)]
pub struct VmInfo {
    pub name: String,
    pub pid: i32,
    pub uid: u32,
    pub qemu_version: (u64, u64, u64),
    pub status: String,
    pub memory: GuestMemory,
    pub ivshmem: Vec<IvshmemDevice>,
    pub vcpu_threads: Vec<i32>,
    /// How the host backs the guest RAM (`read_backing`), or why it could not be read.
    pub backing: Result<Vec<backing::RangeBacking>, String>,
}

/// Reads how the host backs `info`'s guest RAM (smaps and pagemap of its QEMU; off the main
/// loop, after the memory map passed its checks), from `last` where it still applies.
pub fn read_backing(info: &mut VmInfo, last: Option<&[backing::RangeBacking]>) {
    let ranges: Vec<(Hva, u64)> = info
        .memory
        .ranges
        .iter()
        .map(|r| (r.hva, r.len_bytes()))
        .collect();
    info.backing = backing::read(info.pid, &ranges, last).map_err(|e| e.to_string());
}

fn as_list(v: &Value) -> &[Value] {
    v.as_array().map(Vec::as_slice).unwrap_or(&[])
}

/// ivshmem-plain devices under /machine/peripheral and /machine/peripheral-anon.
pub fn ivshmem_devices(q: &mut Qmp) -> Result<Vec<IvshmemDevice>, QmpError> {
    let mut out = Vec::new();
    for base in ["/machine/peripheral", "/machine/peripheral-anon"] {
        let children = match q.execute("qom-list", Some(serde_json::json!({ "path": base }))) {
            Ok(v) => v,
            Err(e) if !e.is_fatal() => continue,
            Err(e) => return Err(e),
        };
        for c in as_list(&children) {
            let (Some(name), Some(ty)) = (c["name"].as_str(), c["type"].as_str()) else {
                continue;
            };
            if ty != "child<ivshmem-plain>" {
                continue;
            }
            let path = format!("{base}/{name}");
            let memdev = match q.qom_get(&path, "memdev") {
                Ok(v) => v.as_str().unwrap_or_default().to_string(),
                Err(e) if !e.is_fatal() => continue,
                Err(e) => return Err(e),
            };
            let backend = memdev
                .strip_prefix("/objects/")
                .unwrap_or(&memdev)
                .to_string();
            if backend.is_empty() {
                continue;
            }
            let obj = format!("/objects/{backend}");
            let mem_path = match q.qom_get(&obj, "mem-path") {
                Ok(v) => v.as_str().map(PathBuf::from),
                Err(e) if !e.is_fatal() => None,
                Err(e) => return Err(e),
            };
            let size = match q.qom_get(&obj, "size") {
                Ok(v) => v.as_u64(),
                Err(e) if !e.is_fatal() => None,
                Err(e) => return Err(e),
            };
            out.push(IvshmemDevice {
                path,
                id: if base == "/machine/peripheral" {
                    name.to_string()
                } else {
                    String::new()
                },
                backend,
                mem_path,
                size,
            });
        }
    }
    Ok(out)
}

/// Picks the channel device: ids or backend ids starting with `prefix`, else the only device.
pub fn pick_channel<'a>(devs: &'a [IvshmemDevice], prefix: &str) -> Option<&'a IvshmemDevice> {
    if !prefix.is_empty() {
        if let Some(d) = devs
            .iter()
            .find(|d| d.id.starts_with(prefix) || d.backend.starts_with(prefix))
        {
            return Some(d);
        }
    }
    match devs {
        [only] => Some(only),
        _ => None,
    }
}

/// Guest RAM with host addresses: the `memory` flat view's RAM ranges (backends from
/// query-memdev, less ivshmem backends), one gpa2hva per range.
pub fn guest_memory(q: &mut Qmp, exclude: &BTreeSet<String>) -> Result<GuestMemory, InspectError> {
    let memdevs = q.execute("query-memdev", None)?;
    let text = q.hmp("info mtree -f")?;
    memory_from_answers(&memdevs, &text, exclude, |gpa| {
        q.hmp(&format!("gpa2hva {gpa:#x}"))
    })
}

/// Guest RAM from a monitor's answers (`query-memdev`, `info mtree -f`, and `gpa2hva` asked
/// per range), believed only as far as they agree with each other: every piece of one backend
/// at one host base, inside the backend's size, no host memory serving two guest ranges.
pub fn memory_from_answers(
    memdevs: &Value,
    mtree_text: &str,
    exclude: &BTreeSet<String>,
    mut gpa2hva: impl FnMut(u64) -> Result<String, QmpError>,
) -> Result<GuestMemory, InspectError> {
    let sizes: BTreeMap<String, Option<u64>> = as_list(memdevs)
        .iter()
        .filter_map(|m| Some((m["id"].as_str()?.to_string(), m["size"].as_u64())))
        .collect();
    let mut names: BTreeSet<String> = sizes.keys().cloned().collect();
    // Machines whose RAM is not a -object backend still call it pc.ram.
    names.insert("pc.ram".to_string());
    for e in exclude {
        names.remove(e);
    }
    let flat = mtree::parse_memory_flatview(mtree_text).ok_or(InspectError::NoFlatView)?;
    let ram = mtree::ram_ranges(&flat, &names)?;
    if ram.is_empty() {
        return Err(InspectError::NoRam);
    }
    if ram.len() > MAX_RAM_RANGES {
        return Err(InspectError::TooManyRanges(ram.len()));
    }
    let mut bases: BTreeMap<&str, Hva> = BTreeMap::new();
    let mut ranges = Vec::with_capacity(ram.len());
    for r in &ram {
        let answer = gpa2hva(r.start)?;
        let hva = match mtree::parse_gpa2hva(&answer) {
            Some(Gpa2Hva::Mapped { gpa, region, hva }) if gpa.0 == r.start => {
                if region != r.name {
                    return Err(InspectError::RegionMismatch {
                        gpa: gpa.0,
                        got: region,
                        want: r.name.clone(),
                    });
                }
                hva
            }
            _ => {
                return Err(InspectError::Gpa2Hva {
                    gpa: r.start,
                    answer: answer.trim().chars().take(200).collect(),
                })
            }
        };
        check_backend(r, hva, sizes.get(&r.name).copied().flatten(), &mut bases)?;
        ranges.push(MappedRange {
            gfns: GfnRange::new(Gfn(r.start >> FRAME_SHIFT), Gfn((r.end >> FRAME_SHIFT) + 1)),
            hva,
            name: r.name.clone(),
        });
    }
    Ok(GuestMemory::new(ranges)?)
}

/// One backend is one host mapping: each of its pieces sits at `base + offset`, and no piece
/// runs past the backend's size (when query-memdev gives one).
fn check_backend<'a>(
    r: &'a mtree::FlatRange,
    hva: Hva,
    size: Option<u64>,
    bases: &mut BTreeMap<&'a str, Hva>,
) -> Result<(), InspectError> {
    let len = r.end - r.start + 1; // ram_ranges keeps start <= end < u64::MAX
    let end = r
        .offset
        .checked_add(len)
        .ok_or(MemoryMapError::OffsetOverflow {
            name: r.name.clone(),
            start: r.start,
            offset: r.offset,
        })?;
    if let Some(size) = size.filter(|&s| end > s) {
        return Err(InspectError::BackendSize {
            name: r.name.clone(),
            end,
            size,
        });
    }
    let base = hva.0.checked_sub(r.offset).map(Hva);
    let want = *bases
        .entry(&r.name)
        .or_insert(base.unwrap_or(Hva(u64::MAX)));
    if base != Some(want) {
        return Err(InspectError::BackendBase {
            name: r.name.clone(),
            offset: r.offset,
            got: hva,
            want: Hva(want.0.wrapping_add(r.offset)),
        });
    }
    Ok(())
}

/// Every RAM range lies in read-write mappings of the QEMU process: gpa2hva cannot point the
/// mover at memory the process does not have.
pub fn check_mapped(memory: &GuestMemory, vmas: &[Vma]) -> Result<(), InspectError> {
    for r in &memory.ranges {
        let len = r.len_bytes();
        if !process::covered_rw(vmas, r.hva, len) {
            return Err(InspectError::NotMapped {
                name: r.name.clone(),
                hva: r.hva,
                len,
            });
        }
    }
    Ok(())
}

/// Longest VM name kept, in bytes: names go into every log line, status and metrics series of
/// the VM (a 900 KiB name made 36 MB of metrics).
pub const NAME_MAX_BYTES: usize = 128;

/// The name QEMU reports, as vtismd shows it: at most `NAME_MAX_BYTES` (cut at a character
/// boundary, `...` appended), control characters written as `\u{..}` so that a name cannot
/// forge log lines.
pub fn vm_label(raw: &str) -> String {
    let mut out = String::new();
    for c in raw.chars() {
        let piece = if c.is_control() {
            format!("\\u{{{:x}}}", c as u32)
        } else {
            c.to_string()
        };
        if out.len() + piece.len() > NAME_MAX_BYTES {
            out.push_str("...");
            break;
        }
        out.push_str(&piece);
    }
    out
}

/// At most this many vCPU threads are believed (KVM's largest `KVM_MAX_VCPUS` on x86).
pub const VCPUS_MAX: usize = 4096;

/// The vCPU thread ids of a `query-cpus-fast` answer, each once and at most `VCPUS_MAX`: a list
/// repeating one thread 25,000 times cost the main loop 0.7 s at attach and at every refresh.
pub fn vcpu_thread_ids(answer: &serde_json::Value) -> Vec<i32> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for c in as_list(answer) {
        if out.len() >= VCPUS_MAX {
            break;
        }
        if let Some(t) = c["thread-id"].as_i64().and_then(|t| i32::try_from(t).ok()) {
            if t > 0 && seen.insert(t) {
                out.push(t);
            }
        }
    }
    out
}

/// Everything about a VM the daemon needs.
pub fn inspect(q: &mut Qmp) -> Result<VmInfo, InspectError> {
    let name = match q.execute("query-name", None) {
        Ok(v) => vm_label(v["name"].as_str().unwrap_or_default()),
        Err(e) if !e.is_fatal() => String::new(),
        Err(e) => return Err(e.into()),
    };
    let status = q.execute("query-status", None)?["status"]
        .as_str()
        .unwrap_or("unknown")
        .to_string();
    let ivshmem = ivshmem_devices(q)?;
    let exclude: BTreeSet<String> = ivshmem.iter().map(|d| d.backend.clone()).collect();
    let memory = guest_memory(q, &exclude)?;
    let vcpu_threads = match q.execute("query-cpus-fast", None) {
        Ok(v) => vcpu_thread_ids(&v),
        Err(e) if !e.is_fatal() => Vec::new(),
        Err(e) => return Err(e.into()),
    };
    Ok(VmInfo {
        name,
        pid: q.pid,
        uid: q.uid,
        qemu_version: q.version,
        status,
        memory,
        ivshmem,
        vcpu_threads,
        backing: Err("not read yet".into()),
    })
}

/// The CPUs a thread may run on and the CPU it last ran on, from /proc.
pub fn thread_cpus(pid: i32, tid: i32) -> (Option<Vec<u32>>, Option<u32>) {
    let base = Path::new("/proc")
        .join(pid.to_string())
        .join("task")
        .join(tid.to_string());
    let allowed = std::fs::read_to_string(base.join("status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                .and_then(crate::topology::parse_list)
        });
    let last = std::fs::read_to_string(base.join("stat"))
        .ok()
        .and_then(|s| last_cpu_from_stat(&s));
    (allowed, last)
}

/// Field 39 (`processor`) of /proc/<pid>/task/<tid>/stat; the command name may hold spaces and
/// parentheses, so fields are counted after the last `)`.
pub fn last_cpu_from_stat(stat: &str) -> Option<u32> {
    let rest = &stat[stat.rfind(')')? + 1..];
    // After ")": field 3 (state) is the first; processor is field 39.
    rest.split_whitespace().nth(39 - 3)?.parse().ok()
}

/// Why a node is a VM's home.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HomeBasis {
    /// Every vCPU thread may run only there (pinned: libvirt `<vcpupin>`, taskset).
    Confined,
    /// Most vCPU threads last ran there (the scheduler may move them again).
    LastRan,
}

/// The VM's home node: the one node all vCPUs are confined to, else the node most vCPUs last
/// ran on.
pub fn home_node(
    pid: i32,
    vcpus: &[i32],
    node_of_cpu: impl Fn(u32) -> Option<NodeId>,
) -> Option<NodeId> {
    home_node_and_basis(pid, vcpus, node_of_cpu).map(|(n, _)| n)
}

/// `home_node`, and why.
pub fn home_node_and_basis(
    pid: i32,
    vcpus: &[i32],
    node_of_cpu: impl Fn(u32) -> Option<NodeId>,
) -> Option<(NodeId, HomeBasis)> {
    let mut confined: Option<BTreeSet<NodeId>> = Some(BTreeSet::new());
    let mut votes = std::collections::BTreeMap::<NodeId, u32>::new();
    for &t in vcpus {
        let (allowed, last) = thread_cpus(pid, t);
        match (allowed, confined.as_mut()) {
            (Some(a), Some(set)) => set.extend(a.iter().filter_map(|&c| node_of_cpu(c))),
            _ => confined = None,
        }
        if let Some(n) = last.and_then(&node_of_cpu) {
            *votes.entry(n).or_default() += 1;
        }
    }
    if let Some(set) = confined {
        if set.len() == 1 {
            return set.into_iter().next().map(|n| (n, HomeBasis::Confined));
        }
    }
    votes
        .into_iter()
        .max_by_key(|&(n, c)| (c, std::cmp::Reverse(n)))
        .map(|(n, _)| (n, HomeBasis::LastRan))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_bounded_and_cannot_forge_log_lines() {
        assert_eq!(vm_label("web-1"), "web-1");
        assert_eq!(vm_label("a\nERROR forged"), "a\\u{a}ERROR forged");
        assert_eq!(vm_label("tab\there\u{1b}[31m"), "tab\\u{9}here\\u{1b}[31m");
        let long = vm_label(&"é".repeat(900 * 1024));
        assert!(
            long.len() <= NAME_MAX_BYTES + 3 && long.ends_with("..."),
            "{}",
            long.len()
        );
        assert!(long.starts_with("éé"));
        assert_eq!(vm_label(&"x".repeat(NAME_MAX_BYTES)).len(), NAME_MAX_BYTES);
    }

    #[test]
    fn vcpu_threads_are_each_counted_once_and_capped() {
        let same: Vec<_> = (0..25_000)
            .map(|_| serde_json::json!({"thread-id": 4242}))
            .collect();
        assert_eq!(vcpu_thread_ids(&serde_json::json!(same)), vec![4242]);
        let many: Vec<_> = (1..20_000)
            .map(|t| serde_json::json!({"thread-id": t}))
            .collect();
        assert_eq!(vcpu_thread_ids(&serde_json::json!(many)).len(), VCPUS_MAX);
        let odd = serde_json::json!([
            {"thread-id": 7}, {"thread-id": -1}, {"thread-id": 0}, {"thread-id": 1u64 << 40},
            {"thread-id": "8"}, {}, {"thread-id": 9}
        ]);
        assert_eq!(vcpu_thread_ids(&odd), vec![7, 9]);
    }

    #[test]
    fn stat_processor_field() {
        let stat = "8139 (CPU 0/TCG) S 1 8139 8139 0 -1 4194624 95 0 0 0 12 3 0 0 20 0 4 0 \
                    3141 2143121408 20380 18446744073709551615 1 1 0 0 0 0 0 4096 1260 0 0 0 \
                    -1 1 0 0 0 0 0 0 0 0 0 0 0 0 0";
        assert_eq!(last_cpu_from_stat(stat), Some(1));
        assert_eq!(last_cpu_from_stat("garbage"), None);
        assert_eq!(last_cpu_from_stat("1 (a) S"), None);
    }

    #[test]
    fn channel_pick() {
        let d = |id: &str, backend: &str| IvshmemDevice {
            path: String::new(),
            id: id.into(),
            backend: backend.into(),
            mem_path: None,
            size: None,
        };
        let one = [d("", "shm0")];
        assert_eq!(pick_channel(&one, "vtism").unwrap().backend, "shm0");
        let two = [d("other", "x"), d("", "vtism-chan")];
        assert_eq!(pick_channel(&two, "vtism").unwrap().backend, "vtism-chan");
        let ambiguous = [d("a", "x"), d("b", "y")];
        assert!(pick_channel(&ambiguous, "vtism").is_none());
        assert!(pick_channel(&[], "vtism").is_none());
    }

    fn flat(lines: &[&str]) -> String {
        let mut t = String::from(
            "FlatView #0\n AS \"memory\", root: system\n Root memory region: system\n",
        );
        for l in lines {
            t += &format!("  {l}\n");
        }
        t
    }

    /// The answers of a monitor: `memdevs`, the flat view, and gpa2hva per address.
    fn answers(
        memdevs: Value,
        mtree: &str,
        hvas: &[(u64, &str, u64)],
    ) -> Result<GuestMemory, InspectError> {
        let hvas: BTreeMap<u64, String> = hvas
            .iter()
            .map(|&(gpa, name, hva)| {
                (
                    gpa,
                    format!("Host virtual address for {gpa:#x} ({name}) is {hva:#x}\r\n"),
                )
            })
            .collect();
        memory_from_answers(&memdevs, mtree, &BTreeSet::new(), |gpa| {
            Ok(hvas.get(&gpa).cloned().unwrap_or_default())
        })
    }

    const BASE: u64 = 0x7f00_0000_0000;

    #[test]
    fn consistent_answers_are_believed() {
        let mtree = flat(&[
            "0000000000000000-000000000009ffff (prio 0, ram): m0",
            "0000000000100000-000000000fffffff (prio 0, ram): m0 @0000000000100000",
        ]);
        let m = answers(
            serde_json::json!([{"id": "m0", "size": 256 << 20}]),
            &mtree,
            &[(0, "m0", BASE), (0x100000, "m0", BASE + 0x100000)],
        )
        .unwrap();
        assert_eq!(m.ranges.len(), 2);
        let maps = [Vma {
            start: BASE,
            end: BASE + (256 << 20),
            writable: true,
        }];
        check_mapped(&m, &maps).unwrap();
    }

    #[test]
    fn lying_answers_are_refused() {
        let memdevs = serde_json::json!([{"id": "m0", "size": 256 << 20}]);
        let two = flat(&[
            "0000000000000000-000000000009ffff (prio 0, ram): m0",
            "0000000000100000-000000000fffffff (prio 0, ram): m0 @0000000000100000",
        ]);
        // gpa2hva puts the second piece of m0 somewhere else than its offset says.
        let e = answers(
            memdevs.clone(),
            &two,
            &[(0, "m0", BASE), (0x100000, "m0", BASE + 0x900000)],
        )
        .unwrap_err();
        assert!(
            matches!(e, InspectError::BackendBase { .. }) && e.is_lie(),
            "{e}"
        );
        // An offset before the mapping's start (hva - offset underflows).
        let e = answers(
            memdevs.clone(),
            &two,
            &[(0, "m0", BASE), (0x100000, "m0", 0x1000)],
        )
        .unwrap_err();
        assert!(matches!(e, InspectError::BackendBase { .. }), "{e}");
        // A piece past the backend's size.
        let past = flat(&["0000000000000000-000000001fffffff (prio 0, ram): m0"]);
        let e = answers(memdevs.clone(), &past, &[(0, "m0", BASE)]).unwrap_err();
        assert!(matches!(e, InspectError::BackendSize { .. }), "{e}");
        // An overflowing offset in the flat view.
        let wrap = flat(&["0000000000000000-000000000fffffff (prio 0, ram): m0 @fffffffffffff000"]);
        let e = answers(memdevs.clone(), &wrap, &[(0, "m0", BASE)]).unwrap_err();
        assert!(matches!(e, InspectError::Map(_)), "{e}");
        // Two backends on the same host memory.
        let aliased = flat(&[
            "0000000000000000-000000000fffffff (prio 0, ram): m0",
            "0000000010000000-000000001fffffff (prio 0, ram): m1",
        ]);
        let e = answers(
            serde_json::json!([{"id": "m0", "size": 256 << 20}, {"id": "m1", "size": 256 << 20}]),
            &aliased,
            &[(0, "m0", BASE), (0x10000000, "m1", BASE + 0x1000)],
        )
        .unwrap_err();
        assert!(
            matches!(e, InspectError::Map(MemoryMapError::HvaAliased { .. })),
            "{e}"
        );
        // A flat view with more RAM ranges than any machine.
        let many: Vec<String> = (0..2000u64)
            .map(|i| {
                format!(
                    "{:016x}-{:016x} (prio 0, ram): m0 @{:016x}",
                    i << 13,
                    (i << 13) + 0xfff,
                    i << 13
                )
            })
            .collect();
        let many = flat(&many.iter().map(String::as_str).collect::<Vec<_>>());
        let e = answers(memdevs.clone(), &many, &[]).unwrap_err();
        assert!(matches!(e, InspectError::TooManyRanges(2000)), "{e}");
        // gpa2hva answering for another address.
        let one = flat(&["0000000000000000-000000000009ffff (prio 0, ram): m0"]);
        let e = answers(memdevs, &one, &[]).unwrap_err();
        assert!(matches!(e, InspectError::Gpa2Hva { .. }), "{e}");
    }

    #[test]
    fn ram_outside_the_process_mappings_is_refused() {
        let m = GuestMemory::new(vec![MappedRange {
            gfns: GfnRange::new(Gfn(0), Gfn(0x100)),
            hva: Hva(BASE),
            name: "m0".into(),
        }])
        .unwrap();
        let rw = |start, end, writable| Vma {
            start,
            end,
            writable,
        };
        check_mapped(&m, &[rw(BASE, BASE + 0x100000, true)]).unwrap();
        for maps in [
            vec![],
            vec![rw(BASE, BASE + 0xff000, true)],
            vec![rw(BASE, BASE + 0x100000, false)],
            vec![
                rw(BASE, BASE + 0x80000, true),
                rw(BASE + 0x81000, BASE + 0x100000, true),
            ],
        ] {
            let e = check_mapped(&m, &maps).unwrap_err();
            assert!(
                matches!(e, InspectError::NotMapped { .. }) && e.is_lie(),
                "{maps:?}"
            );
        }
    }
}
