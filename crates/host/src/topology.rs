//! The host's NUMA topology from sysfs: nodes, CPUs, distances, memory tiers, sockets, with the
//! configuration's overrides applied. Reads a sysfs root given as a path so tests run on captured
//! trees.

use crate::config::TopologyConfig;
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use thiserror::Error;
use vtism_engine::{NodeId, NodeSpec, Tier, Topology};

#[derive(Debug, Error)]
pub enum TopologyReadError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: cannot parse `{text}`")]
    Parse { path: PathBuf, text: String },
    #[error("no NUMA node with memory under {0}")]
    NoNodes(PathBuf),
    #[error("topology: {0}")]
    Engine(#[from] vtism_engine::TopologyError),
}

/// Parses a kernel cpulist/nodelist such as `0-3,8,10-11` (empty = none).
pub fn parse_list(s: &str) -> Option<Vec<u32>> {
    let s = s.trim();
    let mut out = Vec::new();
    if s.is_empty() {
        return Some(out);
    }
    for part in s.split(',') {
        let part = part.trim();
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u32, u32) = (a.parse().ok()?, b.parse().ok()?);
                if b < a || b - a > 1 << 16 {
                    return None;
                }
                out.extend(a..=b);
            }
            None => out.push(part.parse().ok()?),
        }
    }
    Some(out)
}

/// One node as the daemon sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct HostNode {
    pub id: NodeId,
    pub cpus: Vec<u32>,
    pub mem_total_bytes: u64,
    /// Tier rank used by the engine (0 = fast).
    pub tier: Tier,
    /// The kernel's memory tier id (memory_tierN), if it has one.
    pub kernel_tier: Option<u32>,
    pub socket: u32,
    /// Where this node's mover worker runs: the node itself or the nearest node with CPUs.
    pub worker_node: NodeId,
}

/// Every node's free memory as the engine's plan takes it (`HostTopology::node_memory`).
pub struct NodeMemory {
    /// Bytes each node can take now.
    pub free: Vec<(NodeId, u64)>,
    /// Bytes each fast node is below the free watermark (only those that are).
    pub short: Vec<(NodeId, u64)>,
}

#[derive(Clone, Debug, Serialize)]
pub struct HostTopology {
    pub nodes: Vec<HostNode>,
    /// `distance[i][j]` between `nodes[i]` and `nodes[j]`.
    pub distance: Vec<Vec<u32>>,
    #[serde(skip)]
    pub engine: Topology,
    #[serde(skip)]
    root: PathBuf,
    /// `/proc/zoneinfo`, or `proc/zoneinfo` beside a fixture's `sys`.
    #[serde(skip)]
    zoneinfo: PathBuf,
    #[serde(skip)]
    min_free_bytes: u64,
    #[serde(skip)]
    free_watermark_bytes: u64,
}

fn read(path: &Path) -> Result<String, TopologyReadError> {
    std::fs::read_to_string(path).map_err(|source| TopologyReadError::Io {
        path: path.to_path_buf(),
        source,
    })
}

fn read_list(path: &Path) -> Result<Vec<u32>, TopologyReadError> {
    let t = read(path)?;
    parse_list(&t).ok_or_else(|| TopologyReadError::Parse {
        path: path.to_path_buf(),
        text: t.trim().to_string(),
    })
}

/// A field of a node's meminfo (`Node 0 MemFree:  123 kB`), in bytes.
pub fn meminfo_field(text: &str, field: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let mut it = l.split_whitespace();
        // "Node" "<id>" "<Field>:" "<n>" "kB"
        let (_, _, f, n) = (it.next()?, it.next()?, it.next()?, it.next()?);
        if f.strip_suffix(':')? == field {
            n.parse::<u64>().ok().map(|kb| kb * 1024)
        } else {
            None
        }
    })
}

/// The kernel's base page (zoneinfo counts in it).
fn base_page_bytes() -> u64 {
    // SAFETY: sysconf reads a constant of the running kernel; no memory is passed.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(n).unwrap_or(4096)
}

/// Free pages of each node on each CPU's lists (`/proc/zoneinfo`'s `pagesets` counts), in
/// bytes, by (node, CPU). MemFree leaves them out, and they are many: since Linux 6.7 a CPU that
/// frees pages in bulk (the mover's own migrations) keeps up to an eighth of the zone on its
/// lists, drained lazily.
pub fn per_cpu_free_bytes(zoneinfo: &str) -> BTreeMap<(u32, u32), u64> {
    let mut out = BTreeMap::new();
    let page = base_page_bytes();
    let (mut node, mut cpu) = (None, None);
    for l in zoneinfo.lines() {
        let t = l.trim_start();
        if let Some(rest) = l.strip_prefix("Node ") {
            node = rest
                .split(',')
                .next()
                .and_then(|n| n.trim().parse::<u32>().ok());
            cpu = None;
        } else if let Some(c) = t.strip_prefix("cpu:") {
            cpu = c.trim().parse::<u32>().ok();
        } else if let (Some(n), Some(c), Some(count)) = (node, cpu, t.strip_prefix("count:")) {
            if let Ok(pages) = count.trim().parse::<u64>() {
                *out.entry((n, c)).or_default() += pages * page;
            }
        }
    }
    out
}

impl HostTopology {
    /// Reads `<root>/devices/system/node` and `<root>/devices/virtual/memory_tiering`.
    pub fn read(root: &Path, cfg: &TopologyConfig) -> Result<HostTopology, TopologyReadError> {
        let node_dir = root.join("devices/system/node");
        let online = read_list(&node_dir.join("online"))?;
        // Kernel tiers: memory_tierN/nodelist.
        let mut kernel_tier: BTreeMap<u32, u32> = BTreeMap::new();
        let tier_dir = root.join("devices/virtual/memory_tiering");
        if let Ok(rd) = std::fs::read_dir(&tier_dir) {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().to_string();
                let Some(t) = name
                    .strip_prefix("memory_tier")
                    .and_then(|n| n.parse::<u32>().ok())
                else {
                    continue;
                };
                if let Ok(list) = read_list(&e.path().join("nodelist")) {
                    for n in list {
                        kernel_tier.insert(n, t);
                    }
                }
            }
        }
        let mut raw = Vec::new();
        for (pos, &n) in online.iter().enumerate() {
            let d = node_dir.join(format!("node{n}"));
            let mem = meminfo_field(&read(&d.join("meminfo"))?, "MemTotal").unwrap_or(0);
            let cpus = read_list(&d.join("cpulist")).unwrap_or_default();
            let dist_text = read(&d.join("distance")).unwrap_or_default();
            let dist: Vec<u32> = dist_text
                .split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect();
            raw.push((pos, n, mem, cpus, dist));
        }
        // Distances are listed over online nodes in order; keep the rows of nodes we use.
        let overrides: BTreeMap<NodeId, &crate::config::NodeOverride> =
            cfg.node.iter().map(|o| (NodeId(o.id), o)).collect();
        let used: Vec<usize> = raw
            .iter()
            .enumerate()
            .filter(|(_, r)| r.2 > 0 && r.1 <= NodeId::MAX as u32)
            .filter(|(_, r)| !overrides.get(&NodeId(r.1 as u8)).is_some_and(|o| o.ignore))
            .map(|(i, _)| i)
            .collect();
        if used.is_empty() {
            return Err(TopologyReadError::NoNodes(node_dir));
        }
        let n_online = online.len();
        let distance: Vec<Vec<u32>> = used
            .iter()
            .map(|&i| {
                let row = &raw[i].4;
                used.iter()
                    .map(|&j| {
                        if row.len() == n_online {
                            row[raw[j].0]
                        } else if i == j {
                            10
                        } else {
                            20
                        }
                    })
                    .collect()
            })
            .collect();
        // Tier ranks: kernel tiers in ascending id order (lower id = lower abstract distance =
        // faster); without memory tiers, CPU nodes are fast and CPU-less nodes slow.
        let ktiers: Vec<u32> = {
            let mut v: Vec<u32> = used
                .iter()
                .filter_map(|&i| kernel_tier.get(&raw[i].1).copied())
                .collect();
            v.sort_unstable();
            v.dedup();
            v
        };
        let socket_of_cpu = |cpu: u32| -> Option<u32> {
            read(&root.join(format!(
                "devices/system/cpu/cpu{cpu}/topology/physical_package_id"
            )))
            .ok()
            .and_then(|t| t.trim().parse().ok())
        };
        let mut nodes: Vec<HostNode> = used
            .iter()
            .map(|&i| {
                let (_, id, mem, cpus, _) = &raw[i];
                let kt = kernel_tier.get(id).copied();
                let tier = match kt {
                    Some(t) if !ktiers.is_empty() => {
                        Tier(ktiers.iter().position(|&x| x == t).unwrap_or(0) as u8)
                    }
                    _ => Tier(u8::from(cpus.is_empty())),
                };
                HostNode {
                    id: NodeId(*id as u8),
                    socket: cpus.first().and_then(|&c| socket_of_cpu(c)).unwrap_or(0),
                    cpus: cpus.clone(),
                    mem_total_bytes: *mem,
                    tier,
                    kernel_tier: kt,
                    worker_node: NodeId(*id as u8),
                }
            })
            .collect();
        // CPU-less nodes: the nearest CPU node gives the worker placement and the socket.
        for a in 0..nodes.len() {
            if !nodes[a].cpus.is_empty() {
                continue;
            }
            let near = (0..nodes.len())
                .filter(|&b| !nodes[b].cpus.is_empty())
                .min_by_key(|&b| (distance[a][b], nodes[b].id));
            if let Some(b) = near {
                nodes[a].worker_node = nodes[b].id;
                nodes[a].socket = nodes[b].socket;
            }
        }
        for n in nodes.iter_mut() {
            if let Some(o) = overrides.get(&n.id) {
                if let Some(t) = o.tier {
                    n.tier = Tier(t);
                }
                if let Some(s) = o.socket {
                    n.socket = s;
                }
            }
        }
        let specs = nodes
            .iter()
            .map(|n| NodeSpec {
                id: n.id,
                tier: n.tier,
                capacity_bytes: n.mem_total_bytes,
                cpus: n.cpus.clone(),
                socket: n.socket,
            })
            .collect();
        let engine = Topology::new(specs, Some(distance.clone()))?;
        Ok(HostTopology {
            nodes,
            distance,
            engine,
            root: root.to_path_buf(),
            zoneinfo: root
                .parent()
                .unwrap_or(Path::new("/"))
                .join("proc/zoneinfo"),
            min_free_bytes: cfg.min_free_mib << 20,
            free_watermark_bytes: cfg.free_watermark_mib << 20,
        })
    }

    pub fn node(&self, id: NodeId) -> Option<&HostNode> {
        self.nodes.iter().find(|n| n.id == id)
    }

    /// The node a CPU belongs to.
    pub fn node_of_cpu(&self, cpu: u32) -> Option<NodeId> {
        self.nodes
            .iter()
            .find(|n| n.cpus.contains(&cpu))
            .map(|n| n.id)
    }

    /// The configured free-memory floors again (a reload that keeps the nodes).
    pub fn set_free_floors(&mut self, cfg: &TopologyConfig) {
        self.min_free_bytes = cfg.min_free_mib << 20;
        self.free_watermark_bytes = cfg.free_watermark_mib << 20;
    }

    /// Bytes each node can take now: MemFree less the configured floor.
    pub fn free_bytes(&self) -> Vec<(NodeId, u64)> {
        self.node_memory().free
    }

    /// From one read of every node's MemFree: what each node can take now (MemFree less
    /// `topology.min_free_mib`), and how far each fast node is below `topology.free_watermark_mib`
    /// (only those that are). Promotions see MemFree alone (a page on a CPU's list is that CPU's);
    /// the watermark also counts the lists of the node's own CPUs, which allocations there take
    /// first and where the node's demotion workers free their source pages: by MemFree alone
    /// every demotion would look like too little and call for more.
    pub fn node_memory(&self) -> NodeMemory {
        let mem_free: Vec<(&HostNode, u64)> = self
            .nodes
            .iter()
            .filter_map(|n| {
                let p = self
                    .root
                    .join(format!("devices/system/node/node{}/meminfo", n.id.0));
                let m = std::fs::read_to_string(p).ok()?;
                Some((n, meminfo_field(&m, "MemFree")?))
            })
            .collect();
        let free = mem_free
            .iter()
            .map(|&(n, f)| (n.id, f.saturating_sub(self.min_free_bytes)))
            .collect();
        // zoneinfo (a few lines per zone and CPU) only when a fast node looks short by MemFree.
        let below = |n: &HostNode, f: u64| n.tier.is_fast() && f < self.free_watermark_bytes;
        if !mem_free.iter().any(|&(n, f)| below(n, f)) {
            return NodeMemory {
                free,
                short: Vec::new(),
            };
        }
        let per_cpu = std::fs::read_to_string(&self.zoneinfo)
            .map(|z| per_cpu_free_bytes(&z))
            .unwrap_or_default();
        let short = mem_free
            .iter()
            .filter(|&&(n, f)| below(n, f))
            .filter_map(|&(n, f)| {
                // The lists of the node's own CPUs: what allocations there take first.
                let listed: u64 = n
                    .cpus
                    .iter()
                    .filter_map(|&c| per_cpu.get(&(u32::from(n.id.0), c)))
                    .sum();
                let missing = self.free_watermark_bytes.checked_sub(f + listed)?;
                (missing > 0).then_some((n.id, missing))
            })
            .collect();
        NodeMemory { free, short }
    }

    /// Total memory of the fast-tier nodes (what a pool of fast memory is carved from).
    pub fn fast_capacity_bytes(&self) -> u64 {
        self.nodes
            .iter()
            .filter(|n| n.tier.is_fast())
            .map(|n| n.mem_total_bytes)
            .sum()
    }

    /// Ids of fast-tier nodes.
    pub fn fast_nodes(&self) -> Vec<NodeId> {
        self.nodes
            .iter()
            .filter(|n| n.tier.is_fast())
            .map(|n| n.id)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists() {
        assert_eq!(
            parse_list("0-3,8,10-11\n"),
            Some(vec![0, 1, 2, 3, 8, 10, 11])
        );
        assert_eq!(parse_list(""), Some(vec![]));
        assert_eq!(parse_list("\n"), Some(vec![]));
        assert_eq!(parse_list("3-1"), None);
        assert_eq!(parse_list("x"), None);
        assert_eq!(parse_list("0-4294967295"), None);
    }

    #[test]
    fn meminfo() {
        let t = "Node 2 MemTotal:        1048576 kB\nNode 2 MemFree:          524288 kB\n";
        assert_eq!(meminfo_field(t, "MemTotal"), Some(1 << 30));
        assert_eq!(meminfo_field(t, "MemFree"), Some(512 << 20));
        assert_eq!(meminfo_field(t, "MemUsed"), None);
        assert_eq!(meminfo_field("garbage", "MemFree"), None);
    }

    #[test]
    fn per_cpu_lists() {
        let z = "Node 0, zone      DMA\n  pages free     3840\n  pagesets\n    cpu: 0\n              count: 93\n              high:  107\n    cpu: 1\n              count: 0\nNode 0, zone    DMA32\n  pagesets\n    cpu: 0\n              count: 4083\nNode 2, zone   Normal\n  pagesets\n    cpu: 1\n              count: 7168\n              count: junk\n";
        let b = per_cpu_free_bytes(z);
        assert_eq!(b.get(&(0, 0)), Some(&((93 + 4083) * base_page_bytes())));
        assert_eq!(b.get(&(0, 1)), Some(&0));
        assert_eq!(b.get(&(1, 0)), None);
        assert_eq!(b.get(&(2, 1)), Some(&(7168 * base_page_bytes())));
        assert!(per_cpu_free_bytes("").is_empty());
    }
}
