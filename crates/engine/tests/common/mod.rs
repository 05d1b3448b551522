//! A tiny "world" for engine tests: ground-truth placement that executes plans phase by phase
//! and checks the invariants at every step.

#![allow(dead_code)]

use vtism_engine::*;
use vtism_proto::{Gfn, RamMap, FRAME_SIZE};

pub const FAST: NodeId = NodeId(0);
pub const SLOW: NodeId = NodeId(1);

pub fn topo(fast_bytes: u64, slow_bytes: u64) -> Topology {
    Topology::new(
        vec![
            NodeSpec {
                id: FAST,
                tier: Tier(0),
                capacity_bytes: fast_bytes,
                cpus: vec![0, 1],
                socket: 0,
            },
            NodeSpec {
                id: SLOW,
                tier: Tier(1),
                capacity_bytes: slow_bytes,
                cpus: vec![],
                socket: 0,
            },
        ],
        Some(vec![vec![10, 20], vec![20, 10]]),
    )
    .unwrap()
}

pub struct World {
    pub engine: VtismPolicy,
    pub ram: RamMap,
    pub vm: VmId,
    pub quota_frames: u64,
    /// Ground truth: node of every dense frame.
    pub truth: Vec<NodeId>,
    pub now: Nanos,
    pub moves_per_frame: Vec<u32>,
    fast: u64,
}

impl World {
    pub fn new(frames: u64, quota_frames: u64, params: EngineParams, start_fast: u64) -> World {
        let ram = RamMap::contiguous(frames);
        let mut engine = VtismPolicy::new(topo(1 << 40, 1 << 40), params).unwrap();
        let vm = VmId(1);
        engine
            .add_vm(VmSpec {
                id: vm,
                ram: ram.clone(),
                fast_quota_bytes: quota_frames * FRAME_SIZE,
                home_node: Some(FAST),
            })
            .unwrap();
        let start_fast = start_fast.min(frames);
        if start_fast > 0 {
            engine
                .set_placement(vm, Gfn(0), start_fast, Some(FAST))
                .unwrap();
        }
        if frames > start_fast {
            engine
                .set_placement(vm, Gfn(start_fast), frames - start_fast, Some(SLOW))
                .unwrap();
        }
        let mut truth = vec![SLOW; frames as usize];
        truth[..start_fast as usize]
            .iter_mut()
            .for_each(|n| *n = FAST);
        World {
            engine,
            ram,
            vm,
            quota_frames,
            truth,
            now: Nanos(0),
            moves_per_frame: vec![0; frames as usize],
            fast: start_fast,
        }
    }

    pub fn fast_frames(&self) -> u64 {
        self.fast
    }

    /// Feed one round of hints, plan, execute phase by phase; check quota, budget, VM bounds and
    /// that "from" matches the ground truth. Returns the plan.
    pub fn step(&mut self, hints: &[vtism_proto::HintEntry]) -> Plan {
        self.step_counting(hints, vtism_proto::CountMeaning::RoundsSeen)
    }

    /// `step` for a round whose counts mean `counts`.
    pub fn step_counting(
        &mut self,
        hints: &[vtism_proto::HintEntry],
        counts: vtism_proto::CountMeaning,
    ) -> Plan {
        self.now = Nanos(self.now.0 + 1_000_000_000);
        self.engine
            .observe(
                self.vm,
                Observation::Hints {
                    entries: hints,
                    overflow: false,
                    counts,
                },
                self.now,
            )
            .unwrap();
        let plan = self.engine.plan(&PlanContext::default(), self.now);
        let budget = self.engine.params().round_budget_bytes;
        assert!(
            plan.moved_bytes() <= budget,
            "plan moves {} bytes over budget {}",
            plan.moved_bytes(),
            budget
        );
        // A VM over its quota (the quota just shrank) may only shrink.
        let start_fast = self.fast_frames();
        let mut last_phase = None;
        for m in &plan.moves {
            if last_phase != Some(m.phase) {
                // Phase boundary: the VM is within its quota (or only shrinking towards it).
                let f = self.fast_frames();
                assert!(
                    f <= self.quota_frames.max(start_fast),
                    "fast {f} > quota {} at {:?}",
                    self.quota_frames,
                    m.phase
                );
                last_phase = Some(m.phase);
            }
            assert_eq!(m.vm, self.vm);
            assert!(
                self.ram.contains_span(m.gfn, m.frames),
                "move outside VM: {:?}",
                m
            );
            let start = self.ram.index_of(m.gfn).unwrap() as usize;
            for i in start..start + m.frames as usize {
                assert_eq!(
                    self.truth[i], m.from,
                    "move {:?} says from {} but frame {} is on {}",
                    m, m.from, i, self.truth[i]
                );
                assert_ne!(m.from, m.to);
                if m.to == FAST {
                    self.fast += 1;
                } else if m.from == FAST {
                    self.fast -= 1;
                }
                self.truth[i] = m.to;
                self.moves_per_frame[i] += 1;
            }
            if m.kind == MoveKind::Promote {
                let f = self.fast_frames();
                assert!(
                    f <= self.quota_frames.max(start_fast),
                    "fast {f} > quota {} after {:?}",
                    self.quota_frames,
                    m
                );
            }
        }
        let f = self.fast_frames();
        assert!(
            f <= self.quota_frames.max(start_fast),
            "fast {f} > quota {} after plan",
            self.quota_frames
        );
        assert_eq!(f, self.truth.iter().filter(|&&n| n == FAST).count() as u64);
        self.engine
            .check_histogram(self.vm)
            .expect("incremental histogram drifted");
        plan
    }
}
