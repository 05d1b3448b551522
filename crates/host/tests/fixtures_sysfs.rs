//! Topology from sysfs trees captured on real machines (tests/fixtures/sysfs, made with
//! tests/fixtures/capture-sysfs.sh): the development box (one node) and the emulated host of the
//! e2e test (two DRAM nodes on two sockets, one CPU-less node that HMAT puts in a slower tier).

use std::path::{Path, PathBuf};
use vtism_engine::{NodeId, Tier};
use vtism_host::config::{Config, NodeOverride, TopologyConfig};
use vtism_host::topology::HostTopology;

fn root(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/sysfs")
        .join(name)
        .join("sys")
}

#[test]
fn emulated_host_three_nodes_with_hmat() {
    let t = HostTopology::read(&root("emuhost-3node"), &TopologyConfig::default()).unwrap();
    let ids: Vec<u8> = t.nodes.iter().map(|n| n.id.0).collect();
    assert_eq!(ids, vec![0, 1, 2]);
    let n2 = t.node(NodeId(2)).unwrap();
    assert!(n2.cpus.is_empty());
    assert_eq!(n2.kernel_tier, Some(180));
    assert_eq!(n2.tier, Tier(1), "HMAT made node 2 slower than DRAM");
    assert_eq!(t.node(NodeId(0)).unwrap().tier, Tier(0));
    assert_eq!(t.node(NodeId(1)).unwrap().tier, Tier(0));
    // Multi-socket: one socket per DRAM node; the CXL node hangs off the nearest socket.
    assert_eq!(t.node(NodeId(0)).unwrap().socket, 0);
    assert_eq!(t.node(NodeId(1)).unwrap().socket, 1);
    assert_eq!((n2.worker_node, n2.socket), (NodeId(0), 0));
    assert_eq!(t.distance[2], vec![24, 32, 10]);
    assert_eq!(t.node_of_cpu(1), Some(NodeId(1)));
    assert_eq!(t.fast_nodes(), vec![NodeId(0), NodeId(1)]);
    // The engine's view: promotions from a VM homed on node 1 prefer node 1.
    assert_eq!(
        t.engine.fast_nodes_near(Some(NodeId(1))),
        vec![NodeId(1), NodeId(0)]
    );
    assert_eq!(t.engine.slow_nodes_near(NodeId(0)), vec![NodeId(2)]);
    assert!(n2.mem_total_bytes > 900 << 20);
}

#[test]
fn overrides_beat_sysfs() {
    let cfg = TopologyConfig {
        node: vec![
            NodeOverride {
                id: 2,
                tier: Some(0),
                socket: Some(1),
                ignore: false,
            },
            NodeOverride {
                id: 1,
                ignore: true,
                ..Default::default()
            },
        ],
        ..Default::default()
    };
    let t = HostTopology::read(&root("emuhost-3node"), &cfg).unwrap();
    assert_eq!(
        t.nodes.iter().map(|n| n.id.0).collect::<Vec<_>>(),
        vec![0, 2]
    );
    let n2 = t.node(NodeId(2)).unwrap();
    assert_eq!((n2.tier, n2.socket), (Tier(0), 1));
    assert_eq!(t.distance, vec![vec![10, 24], vec![24, 10]]);
}

#[test]
fn cpu_less_node_without_tiers_is_slow_by_default() {
    // Same tree with the memory_tiering directory hidden: fall back to "no CPUs = slow".
    let tmp = std::env::temp_dir().join(format!("vtism-sysfs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    copy_dir(&root("emuhost-3node"), &tmp);
    std::fs::remove_dir_all(tmp.join("devices/virtual/memory_tiering")).unwrap();
    let t = HostTopology::read(&tmp, &TopologyConfig::default()).unwrap();
    assert_eq!(t.node(NodeId(2)).unwrap().tier, Tier(1));
    assert_eq!(t.node(NodeId(2)).unwrap().kernel_tier, None);
    let _ = std::fs::remove_dir_all(&tmp);
}

#[test]
fn single_node_box() {
    let t = HostTopology::read(&root("devbox-1node"), &TopologyConfig::default()).unwrap();
    assert_eq!(t.nodes.len(), 1);
    assert_eq!(t.nodes[0].tier, Tier(0));
    assert!(!t.nodes[0].cpus.is_empty());
    // Free memory comes from the captured meminfo.
    let free = t.free_bytes();
    assert_eq!(free.len(), 1);
    assert!(free[0].1 > 0);
}

#[test]
fn check_config_reads_the_fixture_root() {
    let text = format!(
        "[daemon]\nsysfs_root = \"{}\"\n[[topology.node]]\nid = 2\ntier = 1\n",
        root("emuhost-3node").display()
    );
    let c = Config::parse(&text).unwrap();
    let t = HostTopology::read(&c.daemon.sysfs_root, &c.topology).unwrap();
    assert_eq!(t.node(NodeId(2)).unwrap().tier, Tier(1));
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        let p = e.path();
        let q = to.join(e.file_name());
        if p.is_dir() {
            copy_dir(&p, &q);
        } else {
            std::fs::copy(&p, &q).unwrap();
        }
    }
}

#[test]
fn the_watermark_counts_free_pages_on_per_cpu_lists() {
    // proc/zoneinfo was captured in the emulated host just after vtismd's demotions from node 0:
    // 38 MiB of node 0's free pages sat on its two CPUs' lists, out of MemFree; those of the
    // node's own CPU count (CPU 0 for node 0, CPU 1 for node 1 in this tree).
    let cfg = TopologyConfig {
        min_free_mib: 1024,
        free_watermark_mib: 1024,
        ..Default::default()
    };
    let t = HostTopology::read(&root("emuhost-3node"), &cfg).unwrap();
    let m = t.node_memory();
    let kib = |k: u64| k << 10;
    let page = 4096;
    let short: std::collections::BTreeMap<u8, u64> =
        m.short.iter().map(|(n, b)| (n.0, *b)).collect();
    assert_eq!(
        short.get(&0),
        Some(&((1024 << 20) - kib(1_003_668) - (93 + 4083) * page))
    );
    assert_eq!(
        short.get(&1),
        Some(&((1024 << 20) - kib(938_688) - 852 * page))
    );
    assert_eq!(short.get(&2), None, "a slow node has no watermark");
    // Promotions see MemFree alone.
    let free: Vec<(u8, u64)> = m.free.iter().map(|(n, b)| (n.0, *b)).collect();
    assert_eq!(free[0], (0, 0), "MemFree is below min_free_mib");
}
