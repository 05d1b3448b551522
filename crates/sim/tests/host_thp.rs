//! Host huge pages in the simulator (`--host-pages`): what the kernel does with a folio when a
//! policy moves one of its frames, what a split costs, where khugepaged puts a block back, and
//! that runs stay deterministic. A scripted policy makes the moves and asks the splits.

use std::sync::{Arc, Mutex};
use vtism_engine::{
    EngineError, IngestStats, Move, MoveKind, Nanos, NodeId, Observation, Phase, Plan, PlanContext,
    Policy, VmId, VmSpec,
};
use vtism_proto::{Gfn, FRAME_SIZE};
use vtism_sim::cli::run_one;
use vtism_sim::host_folios::HostPagesAware;
use vtism_sim::mechanism::NoTracker;
use vtism_sim::model::MemoryModel;
use vtism_sim::sim::{self, HostPages, MoveMode, PolicyRun, RunResult, SimConfig, FAST, SLOW};
use vtism_sim::workload::{self, Kind, VmWorkload};

const MIB: u64 = 1 << 20;
const VM: VmId = VmId(1);

/// What the scripted policy heard from the simulator.
#[derive(Default)]
struct Heard {
    placements: Vec<(Gfn, u64, NodeId)>,
    folios: Vec<Vec<Gfn>>,
}

/// Plans `moves[k]` at its `k`-th plan and asks `splits` at its first chance.
struct Scripted {
    moves: Vec<Vec<Move>>,
    plans: usize,
    splits: Vec<Gfn>,
    heard: Arc<Mutex<Heard>>,
}

impl Policy for Scripted {
    fn name(&self) -> &str {
        "scripted"
    }
    fn add_vm(&mut self, _: VmSpec) -> Result<(), EngineError> {
        Ok(())
    }
    fn remove_vm(&mut self, _: VmId) -> Result<(), EngineError> {
        Ok(())
    }
    fn set_quota(&mut self, _: VmId, _: u64) -> Result<(), EngineError> {
        Ok(())
    }
    fn observe(
        &mut self,
        _: VmId,
        _: Observation<'_>,
        _: Nanos,
    ) -> Result<IngestStats, EngineError> {
        Ok(IngestStats::default())
    }
    fn set_placement(
        &mut self,
        _: VmId,
        gfn: Gfn,
        frames: u64,
        node: Option<NodeId>,
    ) -> Result<(), EngineError> {
        if let Some(n) = node {
            self.heard.lock().unwrap().placements.push((gfn, frames, n));
        }
        Ok(())
    }
    fn plan(&mut self, _: &PlanContext<'_>, _: Nanos) -> Plan {
        let moves = self.moves.get(self.plans).cloned().unwrap_or_default();
        self.plans += 1;
        Plan {
            moves,
            ..Plan::default()
        }
    }
}

impl HostPagesAware for Scripted {
    fn host_folios_changed(&mut self, _: VmId, heads: &[Gfn]) {
        self.heard.lock().unwrap().folios.push(heads.to_vec());
    }
    fn take_splits(&mut self, _: Nanos) -> Vec<(VmId, Gfn)> {
        std::mem::take(&mut self.splits)
            .into_iter()
            .map(|h| (VM, h))
            .collect()
    }
}

fn mv(gfn: u64, frames: u64, to: NodeId) -> Move {
    let (from, kind, phase) = if to == FAST {
        (SLOW, MoveKind::Promote, Phase::Promote)
    } else {
        (FAST, MoveKind::Demote, Phase::Demote)
    };
    Move {
        vm: VM,
        gfn: Gfn(gfn),
        frames,
        from,
        to,
        kind,
        phase,
    }
}

/// One VM of 8 MiB (four 2 MiB blocks) read uniformly, at 4 KiB units; `slow_per_fast` 1 puts
/// blocks 0 and 1 in fast memory at first touch.
fn setup(duration: f64) -> (SimConfig, Vec<VmWorkload>) {
    let mut m = MemoryModel::preset("cxl").unwrap();
    for t in [&mut m.fast, &mut m.slow] {
        t.read_gbps = 1e9;
        t.write_gbps = 1e9;
    }
    let mut c = SimConfig::new(m);
    c.unit_bytes = 4096;
    c.duration_s = duration;
    c.slow_per_fast = 1.0;
    c.host_pages = HostPages::Thp;
    let w = VmWorkload {
        name: "uniform".into(),
        kind: Kind::Uniform { write_frac: 0.0 },
        footprint_bytes: 8 * MIB,
        concurrency: 8.0,
        cpu_ns: 20.0,
        vcpus: 4,
        seed: 1,
        fast_weight: None,
    };
    (c, vec![w])
}

fn run(c: &SimConfig, w: &[VmWorkload], policy: Scripted) -> RunResult {
    let pr = PolicyRun {
        name: "scripted".into(),
        policy: Box::new(policy),
        trackers: vec![Box::new(NoTracker)],
        promote_mode: MoveMode::Unmap,
        demote_mode: MoveMode::Unmap,
        mover_speedup: 1.0,
        all_fast: false,
    };
    sim::run(c, w, pr, &mut |_| {}).unwrap()
}

fn scripted(moves: Vec<Vec<Move>>, splits: Vec<Gfn>) -> (Scripted, Arc<Mutex<Heard>>) {
    let heard = Arc::new(Mutex::new(Heard::default()));
    let p = Scripted {
        moves,
        plans: 0,
        splits,
        heard: heard.clone(),
    };
    (p, heard)
}

#[test]
fn a_move_of_one_frame_of_a_folio_moves_all_512() {
    let (c, w) = setup(1.0);
    // Demote one 4 KiB frame of block 0.
    let (p, heard) = scripted(vec![vec![mv(5, 1, SLOW)]], vec![]);
    let r = run(&c, &w, p);
    assert_eq!(r.migrated_bytes(), 2 * MIB, "the whole folio moved");
    let h = heard.lock().unwrap();
    assert_eq!(
        h.folios[0].len(),
        4,
        "the policy learnt four folios at admission"
    );
    assert!(
        h.placements.contains(&(Gfn(0), 512, SLOW)),
        "told the folio moved: {:?}",
        &h.placements[h.placements.len().saturating_sub(3)..]
    );
    // Half of the VM was fast and a quarter is now.
    let last = r.samples.last().unwrap();
    assert_eq!(last.fast_bytes[0], 2 * MIB);

    // Where the fast node cannot take 2 MiB, the kernel splits the folio and moves the frame
    // alone: fast is full at first touch (blocks 0 and 1), so free one frame's room first by
    // demoting a frame of a block split for the purpose.
    let (p, heard) = scripted(
        vec![vec![mv(700, 1, SLOW)], vec![mv(1030, 1, FAST)]],
        vec![Gfn(512)],
    );
    let r = run(&c, &w, p);
    assert_eq!(r.migrated_bytes(), 2 * FRAME_SIZE, "4 KiB each way");
    assert_eq!(
        r.vms[0].splits, 2,
        "the asked split, and the kernel's for block 2"
    );
    let h = heard.lock().unwrap();
    assert_eq!(h.folios.last().unwrap(), &vec![Gfn(0), Gfn(1536)]);
}

#[test]
fn a_split_block_costs_its_accesses_the_tlb_penalty() {
    let (c, w) = setup(3.0);
    let (whole, _) = scripted(vec![], vec![]);
    let (split, heard) = scripted(vec![], vec![Gfn(1024)]);
    let (a, b) = (run(&c, &w, whole), run(&c, &w, split));
    assert_eq!(b.vms[0].splits, 1);
    assert_eq!(heard.lock().unwrap().folios.last().unwrap().len(), 3);
    // A quarter of the accesses go to the split block, each 200.8 - 157.4 ns slower; the rest
    // is half on fast (80 ns) and half on slow (288 ns), with 20 ns of compute. The last
    // second has no stall of the split left in it.
    let per_access = 20.0 + 0.5 * 80.0 + 0.5 * 288.0;
    let penalty = c.model.host_pages.split_access_ns;
    assert!((penalty - 43.4).abs() < 1e-9);
    let want = per_access / (per_access + 0.25 * penalty);
    let got = b.samples[2].tput[0] / a.samples[2].tput[0];
    assert!((got - want).abs() < 1e-4, "{got} vs {want}");
    assert!(b.samples[0].tput[0] < a.samples[0].tput[0]);

    // On 4 KiB host pages every access pays it.
    let mut base = c.clone();
    base.host_pages = HostPages::Base;
    let (p, heard) = scripted(vec![], vec![]);
    let d = run(&base, &w, p);
    assert!(heard.lock().unwrap().folios.is_empty(), "no folio to tell");
    let want = per_access / (per_access + penalty);
    let got = d.samples[2].tput[0] / a.samples[2].tput[0];
    assert!((got - want).abs() < 1e-4, "{got} vs {want}");
}

#[test]
fn khugepaged_collapses_a_split_block_onto_the_node_holding_most_of_it() {
    let (c, w) = setup(11.0);
    // Split blocks 2 and 3 (slow), empty the fast node, then bring 300 frames of block 2 and
    // 100 of block 3 to it. khugepaged (8 ranges every 10 s: all four blocks by t = 10 s)
    // collapses block 2 onto the fast node and block 3 onto the slow one.
    let moves = vec![vec![
        mv(0, 512, SLOW),
        mv(512, 512, SLOW),
        mv(1024, 300, FAST),
        mv(1536, 100, FAST),
    ]];
    let (p, heard) = scripted(moves, vec![Gfn(1024), Gfn(1536)]);
    let r = run(&c, &w, p);
    assert_eq!((r.vms[0].splits, r.vms[0].collapses), (2, 2));
    let before = r.samples[8].fast_bytes[0];
    assert_eq!(before, 400 * FRAME_SIZE);
    let after = r.samples.last().unwrap().fast_bytes[0];
    assert_eq!(
        after,
        512 * FRAME_SIZE,
        "block 2 whole on fast, block 3 whole on slow"
    );
    // Moved: 2 x 2 MiB and 400 frames by the policy, 212 + 100 frames across by khugepaged.
    assert_eq!(r.migrated_bytes(), 4 * MIB + (400 + 212 + 100) * FRAME_SIZE);
    let h = heard.lock().unwrap();
    assert!(h.placements.contains(&(Gfn(1024), 512, FAST)));
    assert!(h.placements.contains(&(Gfn(1536), 512, SLOW)));
    assert_eq!(
        h.folios.last().unwrap(),
        &vec![Gfn(0), Gfn(512), Gfn(1024), Gfn(1536)]
    );
}

#[test]
fn host_thp_runs_with_the_same_seed_give_the_same_results() {
    let mut c = SimConfig::new(MemoryModel::preset("cxl").unwrap());
    c.unit_bytes = 4096;
    c.duration_s = 20.0;
    c.host_pages = HostPages::Thp;
    let w = workload::scenario("kv-zipf", 1.0 / 64.0, c.duration_s, 2).unwrap();
    for p in ["vtism", "memtis", "tpp"] {
        let a = run_one(&c, &w, p, None, None).unwrap();
        let b = run_one(&c, &w, p, None, None).unwrap();
        assert_eq!(a.accesses(), b.accesses(), "{p}");
        assert_eq!(a.migrated_bytes(), b.migrated_bytes(), "{p}");
        assert_eq!(
            (a.vms[0].splits, a.vms[0].collapses),
            (b.vms[0].splits, b.vms[0].collapses),
            "{p}"
        );
        let t = |r: &RunResult| r.samples.iter().map(|s| s.tput[0]).collect::<Vec<_>>();
        assert_eq!(t(&a), t(&b), "{p}");
    }
    // Host folios change the run: a 4 KiB move takes 2 MiB with them.
    let mut plain = c.clone();
    plain.host_pages = HostPages::NotModelled;
    let a = run_one(&c, &w, "tpp", None, None).unwrap();
    let b = run_one(&plain, &w, "tpp", None, None).unwrap();
    assert_ne!(a.migrated_bytes(), b.migrated_bytes());
}
