//! The host's memory topology: NUMA nodes, their tier, capacity, CPUs, socket and distances.

use crate::types::{NodeId, Tier};
use serde::{Deserialize, Serialize};
use thiserror::Error;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeSpec {
    pub id: NodeId,
    pub tier: Tier,
    /// Bytes of memory on the node.
    pub capacity_bytes: u64,
    /// CPUs on the node (empty for a CPU-less node such as a CXL expander).
    #[serde(default)]
    pub cpus: Vec<u32>,
    /// Socket (package) the node belongs to or hangs off.
    #[serde(default)]
    pub socket: u32,
}

impl NodeSpec {
    pub fn has_cpus(&self) -> bool {
        !self.cpus.is_empty()
    }
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum TopologyError {
    #[error("topology has no nodes")]
    Empty,
    #[error("node id {0} is above the engine's limit of {max}", max = NodeId::MAX)]
    NodeIdTooLarge(u8),
    #[error("node {0} is listed twice")]
    DuplicateNode(NodeId),
    #[error("no node is in the fast tier (tier 0)")]
    NoFastTier,
    #[error("distance matrix is {rows}x? but there are {nodes} nodes")]
    DistanceShape { rows: usize, nodes: usize },
    #[error("distance from {from} to {to} is 0 (only a node to itself may be 0 or 10)")]
    ZeroDistance { from: NodeId, to: NodeId },
}

/// Nodes plus a distance matrix in the kernel's units (10 = local).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Topology {
    nodes: Vec<NodeSpec>,
    /// `distance[i][j]` between `nodes[i]` and `nodes[j]`.
    distance: Vec<Vec<u32>>,
}

impl Topology {
    pub fn new(
        mut nodes: Vec<NodeSpec>,
        distance: Option<Vec<Vec<u32>>>,
    ) -> Result<Self, TopologyError> {
        if nodes.is_empty() {
            return Err(TopologyError::Empty);
        }
        // Keep the caller's distance rows aligned with the sorted node order.
        let mut order: Vec<usize> = (0..nodes.len()).collect();
        order.sort_by_key(|&i| nodes[i].id);
        let distance: Vec<Vec<u32>> = match distance {
            Some(d) => {
                if d.len() != nodes.len() || d.iter().any(|r| r.len() != nodes.len()) {
                    return Err(TopologyError::DistanceShape {
                        rows: d.len(),
                        nodes: nodes.len(),
                    });
                }
                order
                    .iter()
                    .map(|&i| order.iter().map(|&j| d[i][j]).collect())
                    .collect()
            }
            None => {
                let n = nodes.len();
                // Without firmware distances: local 10, same tier 20, otherwise 20 + 10 per tier step.
                let sorted: Vec<&NodeSpec> = order.iter().map(|&i| &nodes[i]).collect();
                (0..n)
                    .map(|i| {
                        (0..n)
                            .map(|j| {
                                if i == j {
                                    10
                                } else {
                                    let (a, b) = (sorted[i].tier.0 as u32, sorted[j].tier.0 as u32);
                                    20 + 10 * a.abs_diff(b)
                                }
                            })
                            .collect()
                    })
                    .collect()
            }
        };
        let mut sorted_nodes = Vec::with_capacity(nodes.len());
        for &i in &order {
            sorted_nodes.push(std::mem::replace(
                &mut nodes[i],
                NodeSpec {
                    id: NodeId(0),
                    tier: Tier(0),
                    capacity_bytes: 0,
                    cpus: vec![],
                    socket: 0,
                },
            ));
        }
        let nodes = sorted_nodes;
        for (i, n) in nodes.iter().enumerate() {
            if n.id.0 > NodeId::MAX {
                return Err(TopologyError::NodeIdTooLarge(n.id.0));
            }
            if i > 0 && nodes[i - 1].id == n.id {
                return Err(TopologyError::DuplicateNode(n.id));
            }
        }
        if !nodes.iter().any(|n| n.tier.is_fast()) {
            return Err(TopologyError::NoFastTier);
        }
        for i in 0..nodes.len() {
            for j in 0..nodes.len() {
                if i != j && distance[i][j] == 0 {
                    return Err(TopologyError::ZeroDistance {
                        from: nodes[i].id,
                        to: nodes[j].id,
                    });
                }
            }
        }
        Ok(Topology { nodes, distance })
    }

    pub fn nodes(&self) -> &[NodeSpec] {
        &self.nodes
    }

    fn pos(&self, id: NodeId) -> Option<usize> {
        self.nodes.binary_search_by_key(&id, |n| n.id).ok()
    }

    pub fn node(&self, id: NodeId) -> Option<&NodeSpec> {
        self.pos(id).map(|p| &self.nodes[p])
    }

    pub fn tier_of(&self, id: NodeId) -> Option<Tier> {
        self.node(id).map(|n| n.tier)
    }

    pub fn is_fast(&self, id: NodeId) -> bool {
        self.tier_of(id).is_some_and(Tier::is_fast)
    }

    /// Distance between two nodes; unknown nodes are infinitely far.
    pub fn distance(&self, a: NodeId, b: NodeId) -> u32 {
        match (self.pos(a), self.pos(b)) {
            (Some(i), Some(j)) => self.distance[i][j],
            _ => u32::MAX,
        }
    }

    /// Nodes of the fast tier, nearest to `from` first (ties by id).
    pub fn fast_nodes_near(&self, from: Option<NodeId>) -> Vec<NodeId> {
        let mut v: Vec<NodeId> = self
            .nodes
            .iter()
            .filter(|n| n.tier.is_fast())
            .map(|n| n.id)
            .collect();
        if let Some(f) = from {
            v.sort_by_key(|&n| (self.distance(f, n), n));
        }
        v
    }

    /// Slower-tier nodes, nearest to `from` first, then by tier (the fastest slow tier first).
    pub fn slow_nodes_near(&self, from: NodeId) -> Vec<NodeId> {
        let mut v: Vec<&NodeSpec> = self.nodes.iter().filter(|n| !n.tier.is_fast()).collect();
        v.sort_by_key(|n| (self.distance(from, n.id), n.tier, n.id));
        v.into_iter().map(|n| n.id).collect()
    }

    /// The nearest node that has CPUs (itself if it has some): where a worker for `id` should run.
    pub fn nearest_cpu_node(&self, id: NodeId) -> Option<NodeId> {
        self.nodes
            .iter()
            .filter(|n| n.has_cpus())
            .min_by_key(|n| (self.distance(id, n.id), n.id))
            .map(|n| n.id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn two_tier() -> Topology {
        Topology::new(
            vec![
                NodeSpec {
                    id: NodeId(1),
                    tier: Tier(1),
                    capacity_bytes: 8 << 30,
                    cpus: vec![],
                    socket: 0,
                },
                NodeSpec {
                    id: NodeId(0),
                    tier: Tier(0),
                    capacity_bytes: 2 << 30,
                    cpus: vec![0, 1],
                    socket: 0,
                },
            ],
            Some(vec![vec![10, 20], vec![20, 10]]),
        )
        .unwrap()
    }

    #[test]
    fn sorted_with_distances_permuted() {
        let t = two_tier();
        assert_eq!(t.nodes()[0].id, NodeId(0));
        assert_eq!(t.distance(NodeId(0), NodeId(1)), 20);
        assert_eq!(t.distance(NodeId(0), NodeId(0)), 10);
        assert_eq!(t.nearest_cpu_node(NodeId(1)), Some(NodeId(0)));
        assert_eq!(t.slow_nodes_near(NodeId(0)), vec![NodeId(1)]);
        assert!(t.is_fast(NodeId(0)) && !t.is_fast(NodeId(1)) && !t.is_fast(NodeId(9)));
    }

    #[test]
    fn errors_name_the_problem() {
        let n = |id, tier| NodeSpec {
            id: NodeId(id),
            tier: Tier(tier),
            capacity_bytes: 1,
            cpus: vec![],
            socket: 0,
        };
        assert_eq!(Topology::new(vec![], None), Err(TopologyError::Empty));
        assert_eq!(
            Topology::new(vec![n(0, 1)], None),
            Err(TopologyError::NoFastTier)
        );
        assert_eq!(
            Topology::new(vec![n(0, 0), n(0, 1)], None),
            Err(TopologyError::DuplicateNode(NodeId(0)))
        );
        assert_eq!(
            Topology::new(vec![n(63, 0)], None),
            Err(TopologyError::NodeIdTooLarge(63))
        );
        assert!(matches!(
            Topology::new(vec![n(0, 0)], Some(vec![vec![10, 20]])),
            Err(TopologyError::DistanceShape { .. })
        ));
    }
}
