//! What the daemon learns about one VM over QMP: name, pid, guest RAM with host addresses, the
//! channel's backing file, vCPU threads.

use crate::mtree::{self, Gpa2Hva, GuestMemory, MappedRange};
use crate::qmp::{Qmp, QmpError};
use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use thiserror::Error;
use vtism_engine::NodeId;
use vtism_proto::{Gfn, GfnRange, FRAME_SHIFT};

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
    #[error("RAM map: {0}")]
    RamMap(#[from] vtism_proto::RamMapError),
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
    let mut names: BTreeSet<String> = as_list(&memdevs)
        .iter()
        .filter_map(|m| m["id"].as_str().map(str::to_string))
        .collect();
    // Machines whose RAM is not a -object backend still call it pc.ram.
    names.insert("pc.ram".to_string());
    for e in exclude {
        names.remove(e);
    }
    let text = q.hmp("info mtree -f")?;
    let flat = mtree::parse_memory_flatview(&text).ok_or(InspectError::NoFlatView)?;
    let ram = mtree::ram_ranges(&flat, &names);
    if ram.is_empty() {
        return Err(InspectError::NoRam);
    }
    let mut ranges = Vec::with_capacity(ram.len());
    for r in &ram {
        let answer = q.hmp(&format!("gpa2hva {:#x}", r.start))?;
        match mtree::parse_gpa2hva(&answer) {
            Some(Gpa2Hva::Mapped { gpa, region, hva }) if gpa.0 == r.start => {
                if region != r.name {
                    return Err(InspectError::RegionMismatch {
                        gpa: gpa.0,
                        got: region,
                        want: r.name.clone(),
                    });
                }
                ranges.push(MappedRange {
                    gfns: GfnRange::new(
                        Gfn(r.start >> FRAME_SHIFT),
                        Gfn((r.end + 1) >> FRAME_SHIFT),
                    ),
                    hva,
                    name: r.name.clone(),
                });
            }
            _ => {
                return Err(InspectError::Gpa2Hva {
                    gpa: r.start,
                    answer: answer.trim().to_string(),
                })
            }
        }
    }
    Ok(GuestMemory::new(ranges)?)
}

/// Everything about a VM the daemon needs.
pub fn inspect(q: &mut Qmp) -> Result<VmInfo, InspectError> {
    let name = match q.execute("query-name", None) {
        Ok(v) => v["name"].as_str().unwrap_or_default().to_string(),
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
        Ok(v) => as_list(&v)
            .iter()
            .filter_map(|c| c["thread-id"].as_i64().map(|t| t as i32))
            .collect(),
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

/// The VM's home node: the one node all vCPUs are confined to, else the node most vCPUs last
/// ran on.
pub fn home_node(
    pid: i32,
    vcpus: &[i32],
    node_of_cpu: impl Fn(u32) -> Option<NodeId>,
) -> Option<NodeId> {
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
            return set.into_iter().next();
        }
    }
    votes
        .into_iter()
        .max_by_key(|&(n, c)| (c, std::cmp::Reverse(n)))
        .map(|(n, _)| n)
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
