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
use vtism_proto::{Gfn, Hva, FRAME_SIZE};

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
}

/// Pages of one VM going to one node, one move_pages call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Batch {
    pub vm: VmId,
    pub pid: i32,
    pub to: NodeId,
    pub dir: Direction,
    /// `(gfn, hva, from)` per page.
    pub pages: Vec<(Gfn, Hva, NodeId)>,
}

impl Batch {
    pub fn bytes(&self) -> u64 {
        self.pages.len() as u64 * FRAME_SIZE
    }
}

/// Splits moves into batches of at most `batch_pages`, grouped by (vm, destination, direction),
/// keeping the plan's order inside a group. Frames of unknown VMs or without an HVA are dropped
/// (counted).
pub fn make_batches(
    moves: &[Move],
    batch_pages: usize,
    vms: &HashMap<VmId, VmTarget>,
) -> (Vec<Batch>, u64) {
    type Key = (VmId, NodeId, Direction);
    let mut groups: BTreeMap<Key, Vec<(Gfn, Hva, NodeId)>> = BTreeMap::new();
    let mut order: Vec<Key> = Vec::new();
    let mut dropped = 0u64;
    for m in moves {
        let Some(vm) = vms.get(&m.vm) else {
            dropped += m.frames;
            continue;
        };
        let key = (m.vm, m.to, m.kind.direction());
        let g = groups.entry(key).or_insert_with(|| {
            order.push(key);
            Vec::new()
        });
        for i in 0..m.frames {
            let gfn = Gfn(m.gfn.0 + i);
            match vm.memory.hva(gfn) {
                Some(a) => g.push((gfn, a, m.from)),
                None => dropped += 1,
            }
        }
    }
    let mut out = Vec::new();
    for key in order {
        let pages = groups.remove(&key).unwrap_or_default();
        let pid = vms.get(&key.0).map_or(0, |v| v.pid);
        for chunk in pages.chunks(batch_pages.max(1)) {
            out.push(Batch {
                vm: key.0,
                pid,
                to: key.1,
                dir: key.2,
                pages: chunk.to_vec(),
            });
        }
    }
    (out, dropped)
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
    pub moved: u64,
    pub outcomes: BTreeMap<PageOutcome, u64>,
    /// Pages that did not end where the plan said, and where they are.
    pub facts: Vec<PlacementRun>,
    /// Seconds spent in move_pages, retries included.
    pub latency: f64,
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
            moved: 0,
            outcomes: if failed {
                [(PageOutcome::Failed, b.pages.len() as u64)].into()
            } else {
                BTreeMap::new()
            },
            facts: if failed {
                b.pages
                    .iter()
                    .map(|&(gfn, _, from)| PlacementRun::frame(b.vm, gfn, Some(from)))
                    .collect()
            } else {
                Vec::new()
            },
            latency: 0.0,
            gone: false,
            not_demoted: if b.dir == Direction::Demote {
                b.pages.len() as u64
            } else {
                0
            },
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
        let addrs: Vec<Hva> = pending.iter().map(|&i| b.pages[i].1).collect();
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
        moved: 0,
        outcomes: BTreeMap::new(),
        facts: Vec::new(),
        latency,
        gone,
        not_demoted: 0,
    };
    let mut cold_ranges: Vec<(Hva, u64)> = Vec::new();
    for (i, &(gfn, hva, from)) in b.pages.iter().enumerate() {
        let st = final_status[i];
        let o = if gone {
            PageOutcome::Failed
        } else {
            classify(st, target)
        };
        *r.outcomes.entry(o).or_default() += 1;
        let node = match o {
            PageOutcome::Moved => {
                r.moved += 1;
                if b.dir == Direction::Demote && s.madvise_cold {
                    match cold_ranges.last_mut() {
                        Some((a, l)) if a.offset(*l) == hva => *l += FRAME_SIZE,
                        _ => cold_ranges.push((hva, FRAME_SIZE)),
                    }
                }
                continue;
            }
            // A node the engine cannot name (above NodeId::MAX) is an unknown placement, not
            // the node its low byte would alias.
            PageOutcome::OnOtherNode => u8::try_from(st).ok().map(NodeId),
            PageOutcome::NotPresent => None,
            _ => Some(from),
        };
        r.facts.push(PlacementRun::frame(b.vm, gfn, node));
        // Conservatively: a page not on the demotion target may still be fast.
        if b.dir == Direction::Demote && o != PageOutcome::NotPresent {
            r.not_demoted += 1;
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
            },
        )]
        .into();
        let (b, dropped) = make_batches(&moves, 4, &vms);
        assert_eq!(dropped, 2 + 1, "VM 2 unknown, frame 3 without HVA");
        assert_eq!(b.len(), 3);
        assert_eq!(b[0].pages.len(), 4);
        assert_eq!(b[0].pages[0], (Gfn(0), Hva(0), NodeId(2)));
        assert_eq!(
            b[1].pages.iter().map(|p| p.0 .0).collect::<Vec<_>>(),
            vec![10, 11]
        );
        assert_eq!(
            (b[2].to, b[2].dir, b[2].pid),
            (NodeId(2), Direction::Demote, 42)
        );
    }

    /// Real move_pages on this process: moving to the node a page is on succeeds, an unmapped
    /// address is reported as not present, a bogus node is an error, never a panic.
    #[test]
    fn execute_batch_on_self() {
        let mut buf = vec![1u8; 8 * 4096];
        let base = (buf.as_mut_ptr() as u64 + 4095) & !4095;
        let pages: Vec<(Gfn, Hva, NodeId)> = (0..4)
            .map(|i| (Gfn(i), Hva(base + i * 4096), NodeId(0)))
            .chain(std::iter::once((Gfn(9), Hva(0x1000), NodeId(0))))
            .collect();
        let b = Batch {
            vm: VmId(1),
            pid: std::process::id() as i32,
            to: NodeId(0),
            dir: Direction::Promote,
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
