//! Guest RAM on host huge pages: the engine places host folios whole, ranks them by the folio
//! rule, and keeps the quota as the kernel really moves pages (move_pages(2) on one 4 KiB page of
//! a folio moves all 512).

mod common;

use common::*;
use vtism_engine::*;
use vtism_proto::{CountMeaning, Gfn, HintEntry, PageType, RamMap, FRAME_SIZE, HUGE_FRAMES};

const H: u64 = HUGE_FRAMES;

/// A VM and the kernel under it: `folio[b]` says whether block `b` is one host folio, and a move
/// of any of its frames moves the whole block, as move_pages does. Placement facts go back to
/// the engine the way vtismd's reconcile does (what the kernel says after the move).
struct Host {
    engine: VtismPolicy,
    vm: VmId,
    folio: Vec<bool>,
    truth: Vec<NodeId>,
    quota_frames: u64,
    now: Nanos,
    moved_frames: u64,
    /// The most frames on DRAM after any promotion.
    peak_fast: u64,
}

impl Host {
    fn new(blocks: u64, quota_frames: u64, folio: impl Fn(u64) -> bool) -> Host {
        let frames = blocks * H;
        let mut engine = VtismPolicy::new(topo(1 << 40, 1 << 40), EngineParams::default()).unwrap();
        let vm = VmId(1);
        engine
            .add_vm(VmSpec {
                id: vm,
                ram: RamMap::contiguous(frames),
                fast_quota_bytes: quota_frames * FRAME_SIZE,
                home_node: Some(FAST),
            })
            .unwrap();
        engine
            .set_placement(vm, Gfn(0), frames, Some(SLOW))
            .unwrap();
        Host {
            engine,
            vm,
            folio: (0..blocks).map(folio).collect(),
            truth: vec![SLOW; frames as usize],
            quota_frames,
            now: Nanos(0),
            moved_frames: 0,
            peak_fast: 0,
        }
    }

    fn tell_folios(&mut self) -> u64 {
        let heads: Vec<Gfn> = (0..self.folio.len() as u64)
            .filter(|&b| self.folio[b as usize])
            .map(|b| Gfn(b * H))
            .collect();
        self.engine.set_host_folios(self.vm, heads).unwrap()
    }

    /// The kernel splits the THPs the engine asked about (as MADV_COLD on one of their pages
    /// does), and the driver's next backing read tells the engine. Returns the blocks split.
    fn split_as_asked(&mut self) -> Vec<u64> {
        let blocks: Vec<u64> = self
            .engine
            .take_split_requests()
            .into_iter()
            .inspect(|r| {
                assert_eq!(r.vm, self.vm);
                assert_eq!(r.cold.0 / H, r.head.0 / H, "the cold frame is the folio's");
            })
            .map(|r| r.head.0 / H)
            .collect();
        for &b in &blocks {
            self.folio[b as usize] = false;
        }
        if !blocks.is_empty() {
            self.tell_folios();
        }
        blocks
    }

    fn fast(&self) -> u64 {
        self.truth.iter().filter(|&&n| n == FAST).count() as u64
    }

    /// One round: hints in, a plan, the kernel's moves, the facts back, the most frames on DRAM
    /// after any promotion kept in `peak_fast`. Returns the frames the kernel moved.
    fn round(&mut self, hints: &[HintEntry]) -> u64 {
        self.now = Nanos(self.now.0 + 1_000_000_000);
        let obs = Observation::Hints {
            entries: hints,
            overflow: false,
            counts: CountMeaning::RateLevel,
        };
        self.engine.observe(self.vm, obs, self.now).unwrap();
        let plan = self.engine.plan(&PlanContext::default(), self.now);
        let mut moved = 0;
        for m in &plan.moves {
            for g in m.gfn.0..m.gfn.0 + m.frames {
                let b = g / H;
                let span = if self.folio[b as usize] {
                    b * H..(b + 1) * H
                } else {
                    g..g + 1
                };
                for f in span.clone() {
                    if self.truth[f as usize] != m.to {
                        self.truth[f as usize] = m.to;
                        moved += 1;
                    }
                }
                // What a placement query after the move reports.
                self.engine
                    .set_placement(self.vm, Gfn(span.start), span.end - span.start, Some(m.to))
                    .unwrap();
            }
            if m.kind == MoveKind::Promote {
                self.peak_fast = self.peak_fast.max(self.fast());
            }
        }
        self.moved_frames += moved;
        moved
    }

    /// khugepaged collapses block `b` again: it copies the block onto the node holding most of
    /// its frames (mm/khugepaged.c, `hpage_collapse_find_target_node`) and maps it huge.
    fn collapse(&mut self, b: u64) {
        let span = (b * H) as usize..((b + 1) * H) as usize;
        let fast = self.truth[span.clone()]
            .iter()
            .filter(|&&n| n == FAST)
            .count() as u64;
        let to = if 2 * fast > H { FAST } else { SLOW };
        self.truth[span].fill(to);
        self.engine
            .set_placement(self.vm, Gfn(b * H), H, Some(to))
            .unwrap();
        self.folio[b as usize] = true;
        self.tell_folios();
    }
}

fn hint(gfn: u64, level: u32) -> HintEntry {
    HintEntry::new(Gfn(gfn), level, false, PageType::Anon, false, true)
}

/// A guest's hot set spread as a tracker sees it on a THP-backed host: hot 4 KiB frames in every
/// block, a quarter of a block's frames in one block of eight, 16 to 64 in the others.
fn scattered(blocks: u64) -> Vec<HintEntry> {
    let mut out = Vec::new();
    for b in 0..blocks {
        // At 32 Hz (level 176): a folio's mean is 16 Hz in the dense blocks, 1 to 4 Hz in the rest.
        let hot = if b % 8 == 7 { 256 } else { (b % 4 + 1) * 16 };
        for k in 0..hot {
            out.push(hint(b * H + k * 3, 176));
        }
    }
    out
}

#[test]
fn with_its_folios_known_the_quota_holds_as_the_kernel_moves_pages() {
    // 64 MiB, every block a host folio, a 12 MiB quota: six folios.
    let mut h = Host::new(32, 6 * H, |_| true);
    assert_eq!(h.tell_folios(), 32);
    let hints = scattered(32);
    for _ in 0..30 {
        h.round(&hints);
    }
    assert!(
        h.peak_fast <= h.quota_frames,
        "peak {} frames on DRAM",
        h.peak_fast
    );
    assert!(h.fast() >= 5 * H, "fast {}", h.fast());
    // The dense blocks are the ones on DRAM.
    let dense_on_dram = (0..32)
        .filter(|b| b % 8 == 7)
        .filter(|&b| h.truth[(b * H) as usize] == FAST)
        .count();
    assert_eq!(dense_on_dram, 4, "the four densest folios");
    // Converged: nothing moves any more under the same workload.
    let before = h.moved_frames;
    for _ in 0..20 {
        h.round(&hints);
    }
    assert_eq!(h.moved_frames, before, "churn after convergence");
}

#[test]
fn without_them_the_kernel_overshoots_the_quota() {
    // The same VM and workload, the engine not told: it promotes 4 KiB frames and the kernel
    // takes whole folios along. This is what vtismd did before it learnt the backing.
    let mut h = Host::new(32, 6 * H, |_| true);
    let hints = scattered(32);
    for _ in 0..5 {
        h.round(&hints);
    }
    assert!(
        h.peak_fast > 2 * h.quota_frames,
        "peak {} frames on DRAM",
        h.peak_fast
    );
}

#[test]
fn a_folio_with_one_hot_frame_ranks_below_warm_base_pages() {
    // Blocks 0..8 are host folios, 8..16 base pages; room for about two blocks' worth.
    let mut h = Host::new(16, 2 * H, |b| b < 8);
    h.tell_folios();
    // One frame at ~1000 Hz in each folio (a folio's mean: 2 Hz), and 512 frames at 8 Hz in
    // blocks 8 and 9.
    let mut hints: Vec<HintEntry> = (0..8).map(|b| hint(b * H + 5, 255)).collect();
    hints.extend((8 * H..10 * H).step_by(2).map(|g| hint(g, 144)));
    for _ in 0..10 {
        h.round(&hints);
    }
    let folio_frames_fast = (0..8 * H).filter(|&g| h.truth[g as usize] == FAST).count();
    let warm_fast = (8 * H..10 * H)
        .step_by(2)
        .filter(|&g| h.truth[g as usize] == FAST)
        .count();
    assert!(h.peak_fast <= h.quota_frames);
    assert_eq!(folio_frames_fast, 0);
    assert!(
        warm_fast >= 400,
        "warm base pages on DRAM: {warm_fast} of 512"
    );
}

#[test]
fn a_split_folio_goes_back_to_base_pages() {
    let mut h = Host::new(8, 2 * H, |_| true);
    h.tell_folios();
    // One dense folio's worth of hot frames in block 3: promoted whole.
    let hints: Vec<HintEntry> = (3 * H..4 * H).map(|g| hint(g, 176)).collect();
    for _ in 0..5 {
        h.round(&hints);
    }
    assert!((3 * H..4 * H).all(|g| h.truth[g as usize] == FAST));
    assert!(h.peak_fast <= h.quota_frames);
    // The host splits every folio (khugepaged's reverse: memory pressure): the engine is told,
    // and from then on hot 4 KiB frames of block 5 move alone.
    h.folio = vec![false; 8];
    assert_eq!(h.tell_folios(), 0);
    let hints: Vec<HintEntry> = (5 * H..5 * H + 64).map(|g| hint(g, 240)).collect();
    for _ in 0..5 {
        h.round(&hints);
    }
    assert!((5 * H..5 * H + 64).all(|g| h.truth[g as usize] == FAST));
    assert!((5 * H + 64..6 * H).all(|g| h.truth[g as usize] == SLOW));
    assert_eq!(h.engine.summary(h.vm).unwrap().host_folios, 0);
}

#[test]
fn a_folio_cut_by_a_hole_in_guest_ram_is_never_promoted() {
    use vtism_proto::GfnRange;
    // The PC's layout: RAM below 640 KiB and above 1 MiB, one host THP over the first 2 MiB.
    let ram = RamMap::new(vec![
        GfnRange::new(Gfn(0), Gfn(0xa0)),
        GfnRange::new(Gfn(0x100), Gfn(4 * H)),
    ])
    .unwrap();
    let mut e = VtismPolicy::new(topo(1 << 40, 1 << 40), EngineParams::default()).unwrap();
    let vm = VmId(1);
    e.add_vm(VmSpec {
        id: vm,
        ram,
        fast_quota_bytes: 4 * H * FRAME_SIZE,
        home_node: Some(FAST),
    })
    .unwrap();
    e.set_placement(vm, Gfn(0), 0xa0, Some(SLOW)).unwrap();
    e.set_placement(vm, Gfn(0x100), 4 * H - 0x100, Some(SLOW))
        .unwrap();
    assert_eq!(
        e.set_host_folios(vm, (0..4).map(|b| Gfn(b * H))).unwrap(),
        3
    );
    // Everything hot, the first block's frames hottest.
    let mut hints: Vec<HintEntry> = (0..0xa0).chain(0x100..H).map(|g| hint(g, 250)).collect();
    hints.extend((H..4 * H).map(|g| hint(g, 200)));
    for s in 1..4 {
        let obs = Observation::Hints {
            entries: &hints,
            overflow: false,
            counts: CountMeaning::RateLevel,
        };
        e.observe(vm, obs, Nanos(s * 1_000_000_000)).unwrap();
        let plan = e.plan(&PlanContext::default(), Nanos(s * 1_000_000_000));
        for m in &plan.moves {
            assert!(m.gfn.0 >= H, "a frame of the cut folio moved: {m:?}");
            assert_eq!(
                (m.gfn.0 % H, m.frames % H),
                (0, 0),
                "not whole folios: {m:?}"
            );
        }
    }
    assert_eq!(e.frame_node(vm, Gfn(0x150)).unwrap(), Some(SLOW));
    assert_eq!(e.frame_node(vm, Gfn(H)).unwrap(), Some(FAST));
}

/// Guest RAM on 1 GiB hugetlbfs pages (here: the first half of the VM) is never planned, in
/// either direction: hot there, it is not promoted; on DRAM there, it is not demoted, counts
/// against the quota, and the other frames make room.
#[test]
fn pinned_frames_are_never_planned() {
    use vtism_proto::GfnRange;
    let mut h = Host::new(8, 4 * H, |_| true);
    h.tell_folios();
    let pinned = GfnRange::new(Gfn(0), Gfn(4 * H));
    assert_eq!(h.engine.set_pinned(h.vm, [pinned]).unwrap(), 4 * H);
    // Two pinned blocks already on DRAM, the hottest frames everywhere.
    for f in 0..2 * H {
        h.truth[f as usize] = FAST;
    }
    h.engine
        .set_placement(h.vm, Gfn(0), 2 * H, Some(FAST))
        .unwrap();
    let hints: Vec<HintEntry> = (0..8 * H)
        .map(|g| hint(g, if g < 4 * H { 250 } else { 200 }))
        .collect();
    for _ in 0..6 {
        let plan_before = h.truth.clone();
        h.round(&hints);
        for g in 0..4 * H {
            assert_eq!(
                h.truth[g as usize], plan_before[g as usize],
                "pinned frame {g} moved"
            );
        }
    }
    // The movable half got the quota's room the pinned blocks leave: two blocks, less the reserve.
    let fast_movable = (4 * H..8 * H)
        .filter(|&g| h.truth[g as usize] == FAST)
        .count() as u64;
    assert!(
        (H..=2 * H).contains(&fast_movable),
        "{fast_movable} movable frames on DRAM"
    );
    assert!(
        h.peak_fast <= 4 * H,
        "quota overshot: {} frames on DRAM",
        h.peak_fast
    );
}

/// Split or not: the hot set lies in more folios than the quota holds whole, a few frames in
/// each. The engine asks for the sparse folios to be split, and once they are, every hot frame
/// reaches DRAM within the quota, which whole folios could not do.
#[test]
fn sparse_folios_are_split_when_the_quota_cannot_hold_them_whole() {
    // Eight folios with 48 hot frames each (384 in all); room for three folios' worth.
    let mut h = Host::new(8, 3 * H, |_| true);
    h.tell_folios();
    let hot: Vec<u64> = (0..8)
        .flat_map(|b| (0..48).map(move |k| b * H + k * 7))
        .collect();
    let hints: Vec<HintEntry> = hot.iter().map(|&g| hint(g, 200)).collect();
    let mut split = Vec::new();
    for _ in 0..20 {
        h.round(&hints);
        split.extend(h.split_as_asked());
    }
    split.sort_unstable();
    split.dedup();
    assert_eq!(
        split,
        (0..8).collect::<Vec<_>>(),
        "every sparse folio split"
    );
    let hot_fast = hot.iter().filter(|&&g| h.truth[g as usize] == FAST).count();
    assert_eq!(hot_fast, hot.len(), "hot frames on DRAM");
    assert!(h.peak_fast <= h.quota_frames, "peak {} frames", h.peak_fast);
    // And then it holds still.
    let before = h.moved_frames;
    for _ in 0..10 {
        h.round(&hints);
        assert!(h.split_as_asked().is_empty());
    }
    assert_eq!(h.moved_frames, before);
}

/// khugepaged collapses a split block again (here 30 s after each split; in the testbed's
/// emulated host within a minute or three), onto the node holding most of it: slow memory, for a
/// sparse folio. The engine asks for it to be split again ever less often (`split_asks`), and
/// places it whole in between, so the block's copies fall to about one an hour, not one a minute.
#[test]
fn a_block_khugepaged_keeps_collapsing_is_asked_ever_less_often() {
    // Room for every hot frame, but not for them and one whole folio: the quota stays short
    // whenever a block is whole.
    let mut h = Host::new(8, 3 * H / 2, |_| true);
    h.tell_folios();
    let hints: Vec<HintEntry> = (0..8)
        .flat_map(|b| (0..48).map(move |k| hint(b * H + k * 7, 200)))
        .collect();
    let mut split_at = [None; 8];
    let mut asks = vec![Vec::new(); 8];
    let mut moved_at_2100 = 0;
    for t in 0..2400u64 {
        if t == 2100 {
            moved_at_2100 = h.moved_frames;
        }
        h.round(&hints);
        for b in h.split_as_asked() {
            asks[b as usize].push(t);
            split_at[b as usize] = Some(t);
        }
        for (b, at) in split_at.iter_mut().enumerate() {
            if at.is_some_and(|s| t >= s + 30) {
                *at = None;
                h.collapse(b as u64);
            }
        }
    }
    for (b, a) in asks.iter().enumerate() {
        let gaps: Vec<u64> = a.windows(2).map(|w| w[1] - w[0]).collect();
        assert_eq!(gaps, [60, 120, 240, 480, 960], "block {b} asked at {a:?}");
    }
    // Between asks the blocks are placed whole, and placement holds still.
    assert_eq!(h.moved_frames, moved_at_2100, "moves between asks");
    assert!(h.peak_fast <= h.quota_frames, "peak {} frames", h.peak_fast);
}

/// Where the quota holds every folio with hot data whole, folios stay whole (the guest keeps
/// their TLB reach), however few of their frames are hot.
#[test]
fn folios_stay_whole_without_pressure() {
    let mut h = Host::new(8, 8 * H, |_| true);
    h.tell_folios();
    // 100 frames at 64 Hz in each of four folios: a mean of 12.5 Hz, hot whole.
    let hints: Vec<HintEntry> = (0..4)
        .flat_map(|b| (0..100).map(move |k| hint(b * H + k * 5, 192)))
        .collect();
    for _ in 0..10 {
        h.round(&hints);
        assert_eq!(h.split_as_asked(), Vec::<u64>::new());
    }
    assert_eq!(h.fast(), 4 * H, "the four folios on DRAM whole");
}
