//! Where a nested guest's RAM lives on the emulated host: guest frames as host addresses of the
//! nested QEMU (QMP `info mtree` + `gpa2hva`), each frame's node (a move_pages(2) query), and
//! moving frames to given nodes (the bake-off puts the guest back on the CXL nodes between runs).

use anyhow::Context;
use std::path::Path;
use std::time::Duration;
use vtism_host::{qmp::Qmp, sys, vm};
use vtism_proto::{Gfn, Hva};

/// move_pages(2) takes at most this many pages per call here (the kernel batches internally).
const CHUNK: usize = 65536;

/// The guest's RAM, one entry per 4 KiB frame in guest-physical order.
pub struct GuestRam {
    /// The nested QEMU's pid.
    pub pid: i32,
    hvas: Vec<Hva>,
    ram: vtism_proto::RamMap,
}

impl GuestRam {
    /// Asks the nested QEMU (its QMP socket `qmp`) for the guest's RAM map.
    pub fn from_qmp(qmp: &Path) -> anyhow::Result<GuestRam> {
        let mut q = Qmp::connect(qmp, Duration::from_secs(20))
            .with_context(|| format!("QMP {}", qmp.display()))?;
        let info = vm::inspect(&mut q).context("inspecting the nested QEMU")?;
        let mem = &info.memory;
        let mut hvas = Vec::with_capacity(mem.ram.frames() as usize);
        for r in &mem.ranges {
            for g in r.gfns.start.0..r.gfns.end.0 {
                hvas.push(mem.hva(Gfn(g)).context("gfn without hva")?);
            }
        }
        Ok(GuestRam {
            pid: info.pid,
            hvas,
            ram: mem.ram.clone(),
        })
    }

    /// The guest's RAM map, as vtismd validates hints against it.
    pub fn ram_map(&self) -> &vtism_proto::RamMap {
        &self.ram
    }

    pub fn frames(&self) -> usize {
        self.hvas.len()
    }

    /// The nested QEMU's address of frame `index` (the bake-off reads its host frame from the
    /// QEMU's pagemap).
    pub fn hva(&self, index: usize) -> Option<Hva> {
        self.hvas.get(index).copied()
    }

    pub fn gfn(&self, index: usize) -> Option<Gfn> {
        self.ram.gfn_at(index as u64)
    }

    /// The index of guest frame `gfn`, if it is guest RAM.
    pub fn index_of(&self, gfn: Gfn) -> Option<usize> {
        self.ram.index_of(gfn).map(|i| i as usize)
    }

    /// Indices of the frames in runs of (first gfn, frames), as the workloads print them.
    pub fn indices(&self, runs: &[(u64, u64)]) -> anyhow::Result<Vec<usize>> {
        let mut v = Vec::new();
        for &(g, n) in runs {
            for k in g..g + n {
                v.push(self.index_of(Gfn(k)).with_context(|| {
                    format!("the workload's frame {k:#x} is not guest RAM per QMP")
                })?);
            }
        }
        Ok(v)
    }

    /// The node of every frame (negative: an errno, e.g. a page the kernel has not mapped).
    pub fn nodes(&self) -> anyhow::Result<Vec<i32>> {
        let mut status = vec![0i32; self.hvas.len()];
        for (a, s) in self.hvas.chunks(CHUNK).zip(status.chunks_mut(CHUNK)) {
            sys::move_pages(self.pid, a, None, s, 0).context("move_pages query")?;
        }
        Ok(status)
    }

    /// Moves every frame whose node differs from `target(index)` there. Returns (frames asked to
    /// move, frames that did not move).
    pub fn move_to(
        &self,
        current: &[i32],
        target: impl Fn(usize) -> i32,
    ) -> anyhow::Result<(usize, usize)> {
        let (mut addrs, mut nodes) = (Vec::new(), Vec::new());
        for (i, &n) in current.iter().enumerate() {
            let t = target(i);
            if n != t {
                addrs.push(self.hvas[i]);
                nodes.push(t);
            }
        }
        let mut failed = 0;
        let mut status = vec![0i32; addrs.len()];
        for ((a, n), s) in addrs
            .chunks(CHUNK)
            .zip(nodes.chunks(CHUNK))
            .zip(status.chunks_mut(CHUNK))
        {
            sys::move_pages(self.pid, a, Some(n), s, sys::MPOL_MF_MOVE).context("move_pages")?;
            failed += s.iter().zip(n).filter(|(got, want)| got != want).count();
        }
        Ok((addrs.len(), failed))
    }
}
