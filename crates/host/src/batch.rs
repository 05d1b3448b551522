//! One move_pages(2) call and what it says: a plan's moves grouped into batches (one VM, one
//! destination node, one direction), a batch executed with busy pages retried, and each page's
//! status classified. Pages that did not end where the plan said come back as placement facts.

use crate::mtree::GuestMemory;
use crate::sys;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};
use vtism_engine::{Direction, Move, NodeId, PlacementRun, VmId};
use vtism_proto::{Gfn, GfnRange, Hva, FRAME_SIZE};

/// What move_pages said about one page.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PageOutcome {
    /// On the target node now.
    Moved,
    /// On another node (the kernel would not move it there, or it moved since).
    OnOtherNode,
    /// Busy (locked, under writeback, pinned): retry later.
    Busy,
    /// Not mapped / not present (never touched, or the zero page): skip.
    NotPresent,
    /// The target node had no memory.
    NoMemory,
    /// Shared with another process and MOVE_ALL not allowed.
    Shared,
    /// Anything else.
    Failed,
    /// Part of a hugetlbfs page the move did not cover whole: not handed to move_pages.
    Unmovable,
}

impl PageOutcome {
    pub fn label(self) -> &'static str {
        match self {
            PageOutcome::Moved => "moved",
            PageOutcome::OnOtherNode => "on_other_node",
            PageOutcome::Busy => "busy",
            PageOutcome::NotPresent => "not_present",
            PageOutcome::NoMemory => "no_memory",
            PageOutcome::Shared => "shared",
            PageOutcome::Failed => "failed",
            PageOutcome::Unmovable => "unmovable",
        }
    }
}

/// Classifies a move_pages status word for a page whose target was `target`.
pub fn classify(status: i32, target: i32) -> PageOutcome {
    if status == target {
        return PageOutcome::Moved;
    }
    if status >= 0 {
        return PageOutcome::OnOtherNode;
    }
    match -status {
        libc::EBUSY | libc::EAGAIN => PageOutcome::Busy,
        libc::ENOENT | libc::EFAULT => PageOutcome::NotPresent,
        libc::ENOMEM => PageOutcome::NoMemory,
        libc::EACCES | libc::EPERM => PageOutcome::Shared,
        _ => PageOutcome::Failed,
    }
}

/// A VM's process and guest memory, as a plan in flight sees them.
#[derive(Clone, Debug)]
pub struct VmTarget {
    pub pid: i32,
    pub memory: Arc<GuestMemory>,
    /// Guest RAM on hugetlbfs pages (`backing::hugetlb_spans`).
    pub hugetlb: Vec<HugetlbSpan>,
}

/// Guest frames on hugetlbfs pages of `page_frames` frames each. move_pages moves such a page
/// only whole and, on 6.1, only by its head address: any other answers -EACCES and moves nothing
/// (mm/migrate.c, add_page_for_migration); 6.12 answers -EBUSY for a second address of a page it
/// already took. So a page is handed over once, by its head, and stands for all its frames.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HugetlbSpan {
    pub gfns: GfnRange,
    pub page_frames: u64,
}

impl VmTarget {
    fn hugetlb_at(&self, gfn: Gfn) -> Option<&HugetlbSpan> {
        self.hugetlb.iter().find(|s| s.gfns.contains(gfn))
    }
}

/// One address given to move_pages and the guest frames it moves: a 4 KiB page, or a hugetlbfs
/// page by its head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchPage {
    pub gfn: Gfn,
    pub hva: Hva,
    /// Where the plan found it.
    pub from: NodeId,
    pub frames: u64,
}

impl BatchPage {
    /// The page did not move: it is on `node`.
    fn stayed(&self, vm: VmId, node: Option<NodeId>) -> PlacementRun {
        PlacementRun {
            vm,
            gfn: self.gfn,
            frames: self.frames,
            node,
        }
    }
}

/// Pages of one VM going from one node to another, one move_pages call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Batch {
    pub vm: VmId,
    pub pid: i32,
    /// Where the plan found every page of it.
    pub from: NodeId,
    pub to: NodeId,
    pub dir: Direction,
    /// Its pages leave fast memory (`MoveKind::frees_fast`): MADV_COLD once moved, and those
    /// that stay count against the promotions that needed their room.
    pub frees_fast: bool,
    pub pages: Vec<BatchPage>,
}

impl Batch {
    pub fn frames(&self) -> u64 {
        self.pages.iter().map(|p| p.frames).sum()
    }

    pub fn bytes(&self) -> u64 {
        self.frames() * FRAME_SIZE
    }
}

/// A plan's moves as move_pages calls.
#[derive(Debug, Default)]
pub struct Batches {
    pub batches: Vec<Batch>,
    /// Frames of unknown VMs or without an HVA.
    pub dropped: u64,
    /// Frames of hugetlbfs pages a move covers only in part (a 1 GiB page under a 2 MiB unit):
    /// they stay where they are, and the engine is told so.
    pub unmovable: Vec<PlacementRun>,
}

/// Splits moves into batches of at most `batch_pages` frames (a hugetlbfs page bigger than that
/// makes a batch of its own), grouped by (vm, destination, direction, source, whether they leave
/// fast memory), keeping the plan's order inside a group.
pub fn make_batches(moves: &[Move], batch_pages: usize, vms: &HashMap<VmId, VmTarget>) -> Batches {
    type Key = (VmId, NodeId, Direction, NodeId, bool);
    let mut groups: BTreeMap<Key, Vec<BatchPage>> = BTreeMap::new();
    let mut order: Vec<Key> = Vec::new();
    let mut out = Batches::default();
    for m in moves {
        let Some(vm) = vms.get(&m.vm) else {
            out.dropped += m.frames;
            continue;
        };
        let key = (m.vm, m.to, m.kind.direction(), m.from, m.kind.frees_fast());
        let g = groups.entry(key).or_insert_with(|| {
            order.push(key);
            Vec::new()
        });
        let end = m.gfn.0 + m.frames;
        let mut gfn = m.gfn.0;
        while gfn < end {
            let Some(hva) = vm.memory.hva(Gfn(gfn)) else {
                out.dropped += 1;
                gfn += 1;
                continue;
            };
            let page = BatchPage {
                gfn: Gfn(gfn),
                hva,
                from: m.from,
                frames: 1,
            };
            let Some(span) = vm.hugetlb_at(Gfn(gfn)) else {
                g.push(page);
                gfn += 1;
                continue;
            };
            let into = (hva.0 / FRAME_SIZE) % span.page_frames.max(1);
            let page_end = (gfn - into.min(gfn)).saturating_add(span.page_frames);
            if into == 0 && page_end <= end.min(span.gfns.end.0) {
                g.push(BatchPage {
                    frames: span.page_frames,
                    ..page
                });
                gfn = page_end;
            } else {
                let frames = page_end.min(end).max(gfn + 1) - gfn;
                out.unmovable.push(PlacementRun {
                    vm: m.vm,
                    gfn: Gfn(gfn),
                    frames,
                    node: Some(m.from),
                });
                gfn += frames;
            }
        }
    }
    let limit = batch_pages.max(1) as u64;
    for key in order {
        let pages = groups.remove(&key).unwrap_or_default();
        let pid = vms.get(&key.0).map_or(0, |v| v.pid);
        let batch = |pages: Vec<BatchPage>| Batch {
            vm: key.0,
            pid,
            from: key.3,
            to: key.1,
            dir: key.2,
            frees_fast: key.4,
            pages,
        };
        let (mut chunk, mut frames) = (Vec::new(), 0);
        for p in pages {
            if frames > 0 && frames + p.frames > limit {
                out.batches.push(batch(std::mem::take(&mut chunk)));
                frames = 0;
            }
            frames += p.frames;
            chunk.push(p);
        }
        if !chunk.is_empty() {
            out.batches.push(batch(chunk));
        }
    }
    out
}

/// How a batch's move_pages calls are made.
#[derive(Clone, Debug)]
pub struct CallSettings {
    /// Times busy pages are retried within the batch.
    pub busy_retries: u32,
    pub busy_retry_delay: Duration,
    /// MPOL_MF_MOVE_ALL: also pages shared with other processes.
    pub move_all: bool,
    /// process_madvise(MADV_COLD) on demoted pages.
    pub madvise_cold: bool,
}

/// What one batch did.
#[derive(Debug)]
pub struct BatchResult {
    pub vm: VmId,
    pub dir: Direction,
    pub from: NodeId,
    pub to: NodeId,
    /// As the batch's (`Batch::frees_fast`): a demotion, or a move within the slow tier.
    pub frees_fast: bool,
    pub moved: u64,
    pub outcomes: BTreeMap<PageOutcome, u64>,
    /// Pages that did not end where the plan said, and where they are.
    pub facts: Vec<PlacementRun>,
    /// Seconds spent in move_pages, retries included.
    pub latency: f64,
    /// Seconds from being queued to its first move_pages call: the lane's queue and the VM's
    /// rate limit (set by the mover's worker).
    pub waited: f64,
    /// The process was gone (ESRCH).
    pub gone: bool,
    /// Frames that stayed on a fast node although the batch demoted them.
    pub not_demoted: u64,
}

impl BatchResult {
    /// A batch that was not run: its pages stay where they were. `failed`: counted as failed
    /// pages, with facts saying so (no worker for the node); otherwise dropped unseen (the mover
    /// is stopping, and the engine relearns placement).
    pub fn not_run(b: &Batch, failed: bool) -> BatchResult {
        BatchResult {
            vm: b.vm,
            dir: b.dir,
            from: b.from,
            to: b.to,
            frees_fast: b.frees_fast,
            moved: 0,
            outcomes: if failed {
                [(PageOutcome::Failed, b.frames())].into()
            } else {
                BTreeMap::new()
            },
            facts: if failed {
                b.pages
                    .iter()
                    .map(|p| p.stayed(b.vm, Some(p.from)))
                    .collect()
            } else {
                Vec::new()
            },
            latency: 0.0,
            waited: 0.0,
            gone: false,
            not_demoted: if b.frees_fast { b.frames() } else { 0 },
        }
    }
}

/// Runs one batch: move_pages, then busy pages retried, then facts for what did not move.
pub fn execute_batch(b: &Batch, s: &CallSettings) -> BatchResult {
    let flags = if s.move_all {
        sys::MPOL_MF_MOVE_ALL
    } else {
        sys::MPOL_MF_MOVE
    };
    let target = i32::from(b.to.0);
    let mut pending: Vec<usize> = (0..b.pages.len()).collect();
    let mut final_status = vec![-libc::EBUSY; b.pages.len()];
    let t0 = Instant::now();
    let mut gone = false;
    for attempt in 0..=s.busy_retries {
        if attempt > 0 {
            std::thread::sleep(s.busy_retry_delay);
        }
        let addrs: Vec<Hva> = pending.iter().map(|&i| b.pages[i].hva).collect();
        let nodes = vec![target; addrs.len()];
        let mut status = vec![0i32; addrs.len()];
        if let Err(e) = sys::move_pages(b.pid, &addrs, Some(&nodes), &mut status, flags) {
            let errno = e.raw_os_error().unwrap_or(libc::EIO);
            gone = errno == libc::ESRCH;
            // A whole-call failure (ESRCH, EPERM, ENOMEM...): nothing known about the pages.
            for &i in &pending {
                final_status[i] = -errno;
            }
            break;
        }
        let mut still = Vec::new();
        for (k, &i) in pending.iter().enumerate() {
            final_status[i] = status[k];
            if classify(status[k], target) == PageOutcome::Busy {
                still.push(i);
            }
        }
        pending = still;
        if pending.is_empty() {
            break;
        }
    }
    let latency = t0.elapsed().as_secs_f64();
    let mut r = BatchResult {
        vm: b.vm,
        dir: b.dir,
        from: b.from,
        to: b.to,
        frees_fast: b.frees_fast,
        moved: 0,
        outcomes: BTreeMap::new(),
        facts: Vec::new(),
        latency,
        waited: 0.0,
        gone,
        not_demoted: 0,
    };
    let mut cold_ranges: Vec<(Hva, u64)> = Vec::new();
    for (i, p) in b.pages.iter().enumerate() {
        let st = final_status[i];
        let o = if gone {
            PageOutcome::Failed
        } else {
            classify(st, target)
        };
        *r.outcomes.entry(o).or_default() += p.frames;
        let node = match o {
            PageOutcome::Moved => {
                r.moved += p.frames;
                // MADV_COLD refuses hugetlbfs (EINVAL), and would fail the call's other ranges.
                if b.frees_fast && s.madvise_cold && p.frames == 1 {
                    match cold_ranges.last_mut() {
                        Some((a, l)) if a.offset(*l) == p.hva => *l += FRAME_SIZE,
                        _ => cold_ranges.push((p.hva, FRAME_SIZE)),
                    }
                }
                continue;
            }
            // A node the engine cannot name (above NodeId::MAX) is an unknown placement, not
            // the node its low byte would alias.
            PageOutcome::OnOtherNode => u8::try_from(st).ok().map(NodeId),
            PageOutcome::NotPresent => None,
            _ => Some(p.from),
        };
        r.facts.push(p.stayed(b.vm, node));
        // Conservatively: a page not on the demotion target may still be fast.
        if b.frees_fast && o != PageOutcome::NotPresent {
            r.not_demoted += p.frames;
        }
    }
    if !cold_ranges.is_empty() && !gone {
        if let Err(e) = sys::pidfd_open(b.pid).and_then(|fd| sys::madvise_cold(&fd, &cold_ranges)) {
            tracing::debug!(vm = %b.vm, error = %e, "process_madvise(MADV_COLD)");
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mtree::MappedRange;
    use vtism_engine::{MoveKind, Phase};
    use vtism_proto::GfnRange;

    fn mv(vm: u32, gfn: u64, frames: u64, to: u8, kind: MoveKind) -> Move {
        Move {
            vm: VmId(vm),
            gfn: Gfn(gfn),
            frames,
            from: NodeId(if to == 0 { 2 } else { 0 }),
            to: NodeId(to),
            kind,
            phase: Phase::Promote,
        }
    }

    #[test]
    fn status_classes() {
        assert_eq!(classify(0, 0), PageOutcome::Moved);
        assert_eq!(classify(2, 0), PageOutcome::OnOtherNode);
        assert_eq!(classify(-libc::EBUSY, 0), PageOutcome::Busy);
        assert_eq!(classify(-libc::EAGAIN, 0), PageOutcome::Busy);
        assert_eq!(classify(-libc::ENOENT, 0), PageOutcome::NotPresent);
        assert_eq!(classify(-libc::EFAULT, 0), PageOutcome::NotPresent);
        assert_eq!(classify(-libc::ENOMEM, 0), PageOutcome::NoMemory);
        assert_eq!(classify(-libc::EACCES, 0), PageOutcome::Shared);
        assert_eq!(classify(-libc::EIO, 0), PageOutcome::Failed);
    }

    #[test]
    fn batches_group_and_split() {
        let moves = vec![
            mv(1, 0, 5, 0, MoveKind::Promote),
            mv(2, 100, 2, 0, MoveKind::Promote),
            mv(1, 10, 2, 0, MoveKind::Promote),
            mv(1, 20, 1, 2, MoveKind::Demote),
        ];
        // VM 1's RAM has a hole at frame 3 (no HVA); VM 2 is unknown.
        let memory = GuestMemory::new(vec![
            MappedRange {
                gfns: GfnRange::new(Gfn(0), Gfn(3)),
                hva: Hva(0),
                name: "m".into(),
            },
            MappedRange {
                gfns: GfnRange::new(Gfn(4), Gfn(64)),
                hva: Hva(0x4000),
                name: "m".into(),
            },
        ])
        .unwrap();
        let vms: HashMap<VmId, VmTarget> = [(
            VmId(1),
            VmTarget {
                pid: 42,
                memory: Arc::new(memory),
                hugetlb: Vec::new(),
            },
        )]
        .into();
        let Batches {
            batches: b,
            dropped,
            unmovable,
        } = make_batches(&moves, 4, &vms);
        assert_eq!(dropped, 2 + 1, "VM 2 unknown, frame 3 without HVA");
        assert!(unmovable.is_empty());
        assert_eq!(b.len(), 3);
        assert_eq!(b[0].pages.len(), 4);
        assert_eq!(
            b[0].pages[0],
            BatchPage {
                gfn: Gfn(0),
                hva: Hva(0),
                from: NodeId(2),
                frames: 1
            }
        );
        assert_eq!(
            b[1].pages.iter().map(|p| p.gfn.0).collect::<Vec<_>>(),
            vec![10, 11]
        );
        assert_eq!(
            (b[2].to, b[2].dir, b[2].pid),
            (NodeId(2), Direction::Demote, 42)
        );
    }

    /// A VM whose RAM above 1 MiB is on hugetlbfs: 2 MiB pages go by their head, one address
    /// each, and count all their frames; a 1 GiB page under a 2 MiB move is not handed over at
    /// all, and the engine learns its frames stayed.
    fn hugetlb_vm(page_frames: u64) -> HashMap<VmId, VmTarget> {
        let ram = GfnRange::new(Gfn(256), Gfn(256 + 4 * 512));
        let memory = GuestMemory::new(vec![MappedRange {
            gfns: ram,
            // Guest frame 512 at a host address aligned to the page.
            hva: Hva((1 << 30) - 256 * FRAME_SIZE),
            name: "pc.ram".into(),
        }])
        .unwrap();
        let hugetlb = vec![HugetlbSpan {
            gfns: ram,
            page_frames,
        }];
        [(
            VmId(1),
            VmTarget {
                pid: 42,
                memory: Arc::new(memory),
                hugetlb,
            },
        )]
        .into()
    }

    #[test]
    fn hugetlb_pages_go_by_their_head() {
        let vms = hugetlb_vm(512);
        // Two whole pages, then a move cut short of a page's end, then one starting inside
        // one, then the block the range's start cuts (frames 256..512).
        let moves = vec![
            mv(1, 512, 1024, 0, MoveKind::Promote),
            mv(1, 1536, 100, 0, MoveKind::Promote),
            mv(1, 2048 + 10, 502, 0, MoveKind::Promote),
            mv(1, 256, 256, 0, MoveKind::Promote),
        ];
        let out = make_batches(&moves, 4096, &vms);
        assert_eq!(out.dropped, 0);
        let pages: Vec<_> = out.batches.iter().flat_map(|b| b.pages.clone()).collect();
        assert_eq!(
            pages
                .iter()
                .map(|p| (p.gfn.0, p.frames))
                .collect::<Vec<_>>(),
            vec![(512, 512), (1024, 512)]
        );
        assert_eq!(pages[0].hva.0 % (2 << 20), 0, "the head's address");
        assert_eq!(
            out.unmovable
                .iter()
                .map(|f| (f.gfn.0, f.frames, f.node))
                .collect::<Vec<_>>(),
            vec![
                (1536, 100, Some(NodeId(2))),
                (2058, 502, Some(NodeId(2))),
                (256, 256, Some(NodeId(2)))
            ]
        );
        // Batches hold at most batch_pages frames; a bigger page makes one of its own.
        let out = make_batches(&moves[..1], 100, &vms);
        assert_eq!(out.batches.len(), 2);
        assert!(out.batches.iter().all(|b| b.frames() == 512));
    }

    #[test]
    fn gigantic_pages_are_not_moved_by_a_block() {
        let vms = hugetlb_vm(1 << 18);
        let out = make_batches(&[mv(1, 512, 512, 0, MoveKind::Promote)], 4096, &vms);
        assert!(out.batches.is_empty());
        assert_eq!(
            out.unmovable,
            vec![PlacementRun {
                vm: VmId(1),
                gfn: Gfn(512),
                frames: 512,
                node: Some(NodeId(2))
            }]
        );
    }

    /// Real move_pages on this process: moving to the node a page is on succeeds, an unmapped
    /// address is reported as not present, a bogus node is an error, never a panic.
    #[test]
    fn execute_batch_on_self() {
        let mut buf = vec![1u8; 8 * 4096];
        let base = (buf.as_mut_ptr() as u64 + 4095) & !4095;
        let page = |gfn, hva| BatchPage {
            gfn: Gfn(gfn),
            hva: Hva(hva),
            from: NodeId(0),
            frames: 1,
        };
        let pages: Vec<BatchPage> = (0..4)
            .map(|i| page(i, base + i * 4096))
            .chain(std::iter::once(page(9, 0x1000)))
            .collect();
        let b = Batch {
            vm: VmId(1),
            pid: std::process::id() as i32,
            from: NodeId(0),
            to: NodeId(0),
            dir: Direction::Promote,
            frees_fast: false,
            pages,
        };
        let s = CallSettings {
            busy_retries: 1,
            busy_retry_delay: Duration::from_millis(1),
            move_all: false,
            madvise_cold: false,
        };
        let r = execute_batch(&b, &s);
        assert_eq!(
            r.outcomes.get(&PageOutcome::Moved),
            Some(&4),
            "{:?}",
            r.outcomes
        );
        assert_eq!(r.outcomes.get(&PageOutcome::NotPresent), Some(&1));
        assert_eq!(r.facts, vec![PlacementRun::frame(VmId(1), Gfn(9), None)]);
        drop(buf);
    }
}
