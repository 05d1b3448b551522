//! Where hints enter: each VM's channel (the ivshmem backing file, mapped), the validating
//! reader that copies a round out of it against the VM's RAM map, and the feedback written back
//! to the guest (round taken, entry budget, interval floor, its fast quota, rejected rounds).
//! The guest is untrusted: every round is validated before the engine sees it, and a round far
//! over the budget is refused before it is copied.
//!
//! The host owns what it writes: a file is taken as a channel only if QEMU itself maps it as a
//! shared backend on tmpfs or hugetlbfs (`ChannelFile::open_backend`) and no other managed VM
//! uses it, and the feedback is written into it only once its header has been seen valid (as the
//! reader validates it). A file that is not a channel is never written to; one that a guest has
//! not initialised yet gets its feedback from its first valid header on.

use crate::channel_file::{Backend, ChannelFile, Fault, OpenError, Refusal};
use crate::config::ChannelConfig;
use crate::vm::{self, VmInfo};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;
use tracing::{debug, warn};
use vtism_engine::VmId;
use vtism_proto::layout::off;
use vtism_proto::{
    write_feedback, AccessError, ChannelReader, Feedback, HintRound, MmapRegion, RamMap,
    RejectReason, SharedRegion, TrackerReport, HOST_VERSION,
};

/// Label of the daemon's own reject reason: a round larger than `channel.max_entries`.
pub const OVER_BUDGET: &str = "over_budget";

/// A mapped channel file.
struct Mapped {
    file: ChannelFile,
    region: MmapRegion,
}

/// One VM's channel and what was read from it.
struct VmChannel {
    /// The VM's name, for logs.
    name: String,
    mapped: Option<Mapped>,
    /// The mapped file's header has been seen valid: it is a channel, and feedback is written.
    verified: bool,
    /// Why there is no channel (no ivshmem device, a refused file, ...).
    problem: Option<String>,
    reader: ChannelReader,
    over_budget: u64,
    last_round: u64,
    last_round_at: Option<Instant>,
    last_entries: u64,
    /// The channel minor version of the last accepted round (what its counts mean).
    minor: Option<u16>,
    /// What the guest's tracker reported with the last accepted round (v1.1 guests).
    tracker_report: Option<TrackerReport>,
    /// The VM's fast quota (the guest is told it to `QUOTA_STEPS` of its RAM).
    quota_bytes: u64,
    /// The VM's RAM, which sets the step of the quota the guest is told.
    ram_bytes: u64,
}

/// What `vtism ctl status` and the metrics show of a VM's channel.
#[derive(Clone, Debug, Default)]
pub struct ChannelStatus {
    pub path: Option<PathBuf>,
    /// The mapped file's header has been seen valid (feedback is written to it).
    pub verified: bool,
    pub problem: Option<String>,
    pub last_round: u64,
    pub last_round_age_s: Option<f64>,
    pub last_round_entries: u64,
    pub minor: Option<u16>,
    pub tracker_report: Option<TrackerReport>,
    pub rounds_accepted: u64,
    /// Every reject reason with its count (zeros included), `over_budget` last.
    pub rejected: Vec<(&'static str, u64)>,
}

#[derive(Default)]
pub struct Channels {
    by_vm: BTreeMap<VmId, VmChannel>,
    /// Files refused as channels, by reason (`Refusal::LABELS`).
    refused: BTreeMap<&'static str, u64>,
}

impl Channels {
    /// Opens a newly managed VM's channel (`configured`: the path from its `[[vm]]` entry) and,
    /// if it already holds a valid header, tells the guest its quota.
    pub fn attach(
        &mut self,
        vm: VmId,
        name: &str,
        info: &VmInfo,
        configured: Option<&Path>,
        cfg: &ChannelConfig,
        quota_bytes: u64,
    ) {
        let (mapped, problem) = self.open(vm, name, info, configured, cfg, None);
        let mut c = VmChannel {
            name: name.to_string(),
            mapped,
            verified: false,
            problem,
            reader: ChannelReader::new(),
            over_budget: 0,
            last_round: 0,
            last_round_at: None,
            last_entries: 0,
            minor: None,
            tracker_report: None,
            quota_bytes,
            ram_bytes: info.memory.bytes(),
        };
        feedback(cfg, &mut c);
        self.by_vm.insert(vm, c);
    }

    /// Tries again to open a channel that could not be opened (the device or file came later).
    pub fn reopen_if_missing(
        &mut self,
        vm: VmId,
        info: &VmInfo,
        configured: Option<&Path>,
        cfg: &ChannelConfig,
    ) {
        let Some(c) = self.by_vm.get(&vm).filter(|c| c.mapped.is_none()) else {
            return;
        };
        let (name, before) = (c.name.clone(), c.problem.clone());
        let (mapped, problem) = self.open(vm, &name, info, configured, cfg, before.as_deref());
        if let Some(c) = self.by_vm.get_mut(&vm) {
            (c.mapped, c.problem, c.verified) = (mapped, problem, false);
        }
    }

    /// Files refused as channels so far, by reason.
    pub fn refused(&self) -> &BTreeMap<&'static str, u64> {
        &self.refused
    }

    /// Maps the VM's channel file: the configured path (any owner), else the backend file of its
    /// ivshmem device, which must be owned by QEMU's user. Either way a regular file with one
    /// link on tmpfs or hugetlbfs, not through a symbolic link, that the QEMU process maps
    /// shared and writable, and that no other managed VM has as its channel. A refusal is
    /// counted, and logged unless it is the VM's problem already (`before`).
    fn open(
        &mut self,
        vm: VmId,
        name: &str,
        info: &VmInfo,
        configured: Option<&Path>,
        cfg: &ChannelConfig,
        before: Option<&str>,
    ) -> (Option<Mapped>, Option<String>) {
        let path = match channel_path(info, configured, cfg) {
            Ok(p) => p,
            Err(problem) => return (None, Some(problem)),
        };
        let backend = Backend {
            owner: configured.is_none().then_some(info.uid),
            pid: info.pid,
        };
        let opened =
            ChannelFile::open_backend(&path, cfg.max_region_mib << 20, &backend).and_then(|file| {
                match self.user_of(vm, file.inode()) {
                    Some(other) => Err(Refusal::InUse(other.to_string()).into()),
                    None => Ok(file),
                }
            });
        match opened {
            Ok(file) => {
                let region = file.region();
                (Some(Mapped { file, region }), None)
            }
            Err(e) => {
                let problem = format!("{}: {e}", path.display());
                if let OpenError::Refused(r) = &e {
                    *self.refused.entry(r.label()).or_default() += 1;
                    if before != Some(problem.as_str()) {
                        warn!(vm = %name, path = %path.display(), reason = r.label(), error = %r,
                            "channel file refused; nothing is written to it");
                    }
                }
                (None, Some(problem))
            }
        }
    }

    /// The managed VM other than `vm` whose channel is the file `inode`.
    fn user_of(&self, vm: VmId, inode: (u64, u64)) -> Option<&str> {
        self.by_vm
            .iter()
            .find(|(id, c)| {
                **id != vm && c.mapped.as_ref().is_some_and(|m| m.file.inode() == inode)
            })
            .map(|(_, c)| c.name.as_str())
    }

    /// The guest restarted: its tracker starts again from round 1.
    pub fn restart(&mut self, vm: VmId) {
        if let Some(c) = self.by_vm.get_mut(&vm) {
            c.reader.reset();
        }
    }

    pub fn remove(&mut self, vm: VmId) {
        self.by_vm.remove(&vm);
    }

    /// Whether the VM's channel file is still the one mapped, whole (`ChannelFile::check`); a
    /// VM without a channel has nothing to check.
    pub fn check(&self, vm: VmId) -> Result<(), Fault> {
        match self.by_vm.get(&vm).and_then(|c| c.mapped.as_ref()) {
            Some(m) => m.file.check(),
            None => Ok(()),
        }
    }

    /// The next round of a VM's guest, validated against `ram`; `None` when there is nothing new
    /// (or the round was rejected, which is counted). Give the round back with `recycle`.
    pub fn read(&mut self, vm: VmId, ram: &RamMap, cfg: &ChannelConfig) -> Option<HintRound> {
        let c = self.by_vm.get_mut(&vm)?;
        let region = &c.mapped.as_ref()?.region;
        // A round far over the requested budget is refused before it is copied.
        let cap = region.load_u64(off::CAPACITY).unwrap_or(0);
        let count = region.load_u64(off::COUNT).unwrap_or(0);
        let round = region.load_u64(off::ROUND).unwrap_or(0);
        if count <= cap && count > cfg.max_entries && round != c.reader.last_round() {
            c.over_budget += 1;
            debug!(vm = %c.name, count, max_entries = cfg.max_entries, "round over budget rejected");
            return None;
        }
        match c.reader.read(region, ram) {
            Ok(Some(round)) => {
                c.last_round = round.round;
                c.last_round_at = Some(Instant::now());
                c.last_entries = round.entries.len() as u64;
                c.minor = Some(round.version_minor);
                c.tracker_report = round.tracker_report;
                Some(round)
            }
            Ok(None) => None,
            Err(e) if e.reason() == RejectReason::WriteInProgress => {
                debug!(vm = %c.name, "guest mid-write");
                None
            }
            Err(e) => {
                debug!(vm = %c.name, reason = e.label(), error = %e, "round rejected");
                None
            }
        }
    }

    /// Gives a round's buffers back to the VM's reader.
    pub fn recycle(&mut self, vm: VmId, round: HintRound) {
        if let Some(c) = self.by_vm.get_mut(&vm) {
            c.reader.recycle(round);
        }
    }

    /// A new fast quota for the VM: the guest sees it in its feedback.
    pub fn set_quota(&mut self, vm: VmId, quota_bytes: u64, cfg: &ChannelConfig) {
        if let Some(c) = self.by_vm.get_mut(&vm) {
            c.quota_bytes = quota_bytes;
            feedback(cfg, c);
        }
    }

    /// Writes the host's feedback into the VM's channel, once its header has been seen valid.
    pub fn feedback(&mut self, vm: VmId, cfg: &ChannelConfig) {
        if let Some(c) = self.by_vm.get_mut(&vm) {
            feedback(cfg, c);
        }
    }

    /// Whether the VM has a channel a guest tracker could publish in.
    pub fn is_mapped(&self, vm: VmId) -> bool {
        self.by_vm.get(&vm).is_some_and(|c| c.mapped.is_some())
    }

    pub fn status(&self, vm: VmId) -> ChannelStatus {
        let Some(c) = self.by_vm.get(&vm) else {
            return ChannelStatus::default();
        };
        let counters = c.reader.counters();
        ChannelStatus {
            path: c.mapped.as_ref().map(|m| m.file.path().to_path_buf()),
            verified: c.verified,
            problem: c.problem.clone(),
            last_round: c.last_round,
            last_round_age_s: c.last_round_at.map(|t| t.elapsed().as_secs_f64()),
            last_round_entries: c.last_entries,
            minor: c.minor,
            tracker_report: c.tracker_report,
            rounds_accepted: counters.accepted(),
            rejected: counters
                .iter_rejected()
                .map(|(r, n)| (r.label(), n))
                .chain([(OVER_BUDGET, c.over_budget)])
                .collect(),
        }
    }
}

/// The VM's channel path: the configured one, else the backend file of its ivshmem device (the
/// one named `device_prefix*` when there are several); `Err`: why there is none.
fn channel_path(
    info: &VmInfo,
    configured: Option<&Path>,
    cfg: &ChannelConfig,
) -> Result<PathBuf, String> {
    if let Some(p) = configured {
        return Ok(p.to_path_buf());
    }
    match vm::pick_channel(&info.ivshmem, &cfg.device_prefix) {
        Some(d) => d
            .mem_path
            .clone()
            .ok_or_else(|| format!("ivshmem backend `{}` has no mem-path", d.backend)),
        None if info.ivshmem.is_empty() => Err("no ivshmem-plain device".into()),
        None => Err(format!(
            "{} ivshmem devices and none named `{}*`",
            info.ivshmem.len(),
            cfg.device_prefix
        )),
    }
}

/// The header as the reader sees it with its round number read as 0: the reader validates the
/// header page (magic, version, layout, sizes against the mapping, reserved bits) and, round 0
/// being "nothing published", copies no entries. Stores are refused.
struct HeaderOnly<'a>(&'a MmapRegion);

impl HeaderOnly<'_> {
    fn refuse(&self, offset: usize, size: usize) -> AccessError {
        AccessError {
            offset,
            size,
            region_len: self.0.len(),
        }
    }
}

impl SharedRegion for HeaderOnly<'_> {
    fn len(&self) -> usize {
        self.0.len()
    }
    fn load_u64(&self, offset: usize) -> Result<u64, AccessError> {
        let v = self.0.load_u64(offset)?;
        Ok(if offset == off::ROUND { 0 } else { v })
    }
    fn load_u64_acquire(&self, offset: usize) -> Result<u64, AccessError> {
        let v = self.0.load_u64_acquire(offset)?;
        Ok(if offset == off::ROUND { 0 } else { v })
    }
    fn load_u32(&self, offset: usize) -> Result<u32, AccessError> {
        let v = self.0.load_u32(offset)?;
        Ok(if offset & !7 == off::ROUND { 0 } else { v })
    }
    fn load_u32_acquire(&self, offset: usize) -> Result<u32, AccessError> {
        let v = self.0.load_u32_acquire(offset)?;
        Ok(if offset & !7 == off::ROUND { 0 } else { v })
    }
    fn store_u64(&self, offset: usize, _: u64) -> Result<(), AccessError> {
        Err(self.refuse(offset, 8))
    }
    fn store_u64_release(&self, offset: usize, _: u64) -> Result<(), AccessError> {
        Err(self.refuse(offset, 8))
    }
    fn store_u32(&self, offset: usize, _: u32) -> Result<(), AccessError> {
        Err(self.refuse(offset, 4))
    }
    fn copy_words(&self, offset: usize, out: &mut [u64]) -> Result<(), AccessError> {
        self.0.copy_words(offset, out)?;
        if let Some(w) = off::ROUND
            .checked_sub(offset)
            .filter(|d| d % 8 == 0)
            .and_then(|d| out.get_mut(d / 8))
        {
            *w = 0;
        }
        Ok(())
    }
    fn store_words(&self, offset: usize, words: &[u64]) -> Result<(), AccessError> {
        Err(self.refuse(offset, words.len().saturating_mul(8)))
    }
}

/// Whether the mapped file holds a valid channel header now, by the reader's own checks.
fn header_valid(region: &MmapRegion) -> bool {
    matches!(
        ChannelReader::new().read(&HeaderOnly(region), &RamMap::contiguous(1)),
        Ok(None)
    )
}

/// The quota a guest is told is rounded to 1/`QUOTA_STEPS` of its RAM.
pub const QUOTA_STEPS: u64 = 32;

/// The fast quota as the guest is told it: rounded to the nearest 1/32 of its RAM (at least one
/// step when there is a quota). In pool mode a quota follows the other VMs' demand, so telling it
/// exactly would tell a guest the others' hot-set sizes to the byte; the tracker only needs it
/// roughly (it sizes its window loops' target by it).
pub fn quota_told(quota_bytes: u64, ram_bytes: u64) -> u64 {
    let step = ((ram_bytes / QUOTA_STEPS) & !4095).max(4096);
    if quota_bytes == 0 {
        return 0;
    }
    let steps = quota_bytes.saturating_add(step / 2) / step;
    (steps.max(1) * step).min(ram_bytes.max(step))
}

/// Writes the feedback block, if the mapped file is a channel: its header was seen valid, now or
/// before on this mapping (a guest that garbles its header later is still told why its rounds
/// are rejected). Nothing is ever written into a file whose header never validated.
fn feedback(cfg: &ChannelConfig, c: &mut VmChannel) {
    let Some(m) = &c.mapped else { return };
    if !c.verified {
        if !header_valid(&m.region) {
            return;
        }
        c.verified = true;
        debug!(vm = %c.name, "channel header valid: feedback from now on");
    }
    let fb = Feedback {
        ack_round: c.reader.last_round(),
        entry_budget: cfg.entry_budget,
        min_interval_ms: cfg.min_interval_ms,
        last_status: c.reader.last_status(),
        fast_quota_bytes: quota_told(c.quota_bytes, c.ram_bytes),
        rejected_rounds: c.reader.counters().total_rejected() + c.over_budget,
        host_version: HOST_VERSION,
    };
    if let Err(e) = write_feedback(&m.region, &fb) {
        debug!(vm = %c.name, error = %e, "feedback");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vtism_proto::{ChannelWriter, RoundMeta, Tracker};

    /// The header check is the reader's, on the header only, and writes nothing: not into an
    /// all-zero file, a file of 0xAA, a channel mid-write, nor a valid one.
    #[test]
    fn the_header_check_is_the_readers_and_writes_nothing() {
        let d = std::env::temp_dir().join(format!("vtism-header-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let p = d.join("c");
        let bytes = |b: u8| vec![b; 64 << 10];
        for (content, valid) in [(bytes(0), false), (bytes(0xAA), false)] {
            std::fs::write(&p, &content).unwrap();
            let f = ChannelFile::open(&p, 1 << 20, None).unwrap();
            assert_eq!(header_valid(&f.region()), valid);
            drop(f);
            assert!(std::fs::read(&p).unwrap() == content, "written to");
        }
        std::fs::write(&p, bytes(0)).unwrap();
        let f = ChannelFile::open(&p, 1 << 20, None).unwrap();
        let region = f.region();
        let mut w = ChannelWriter::init(&region, Tracker::Harness).unwrap();
        assert!(header_valid(&region), "initialised, nothing published");
        w.publish(&[], &RoundMeta::default()).unwrap();
        let before = std::fs::read(&p).unwrap();
        assert!(header_valid(&region), "a round published");
        assert!(std::fs::read(&p).unwrap() == before, "written to");
        let seq = region.load_u64(off::SEQ).unwrap();
        region.store_u64(off::SEQ, seq | 1).unwrap();
        assert!(!header_valid(&region), "mid-write: not now");
        region.store_u64(off::SEQ, (seq | 1) + 1).unwrap();
        region.store_u64(off::MAGIC, 0x1234).unwrap();
        assert!(!header_valid(&region));
        drop(f);
        let _ = std::fs::remove_dir_all(&d);
    }

    /// What the pool's other VMs want moves a guest's quota, but the guest sees it only in steps
    /// of 1/32 of its RAM: demand changes of the others below a step are invisible to it.
    #[test]
    fn the_quota_told_is_coarse() {
        let gib = 1u64 << 30;
        let ram = 16 * gib;
        let step = ram / QUOTA_STEPS;
        assert_eq!(quota_told(0, ram), 0);
        assert_eq!(quota_told(1, ram), step, "a quota is never told as none");
        assert_eq!(quota_told(4 * gib, ram), 4 * gib);
        // Two other VMs' hot sets 200 MiB apart leave this VM's quota 200 MiB apart: the same
        // told quota.
        assert_eq!(quota_told(4 * gib + (100 << 20), ram), 4 * gib);
        assert_eq!(quota_told(4 * gib - (100 << 20), ram), 4 * gib);
        assert_eq!(quota_told(4 * gib + step / 2, ram), 4 * gib + step);
        assert_eq!(quota_told(20 * gib, ram), ram, "never more than the RAM");
        // Small VMs: steps of 4 KiB at least, so a quota told is a page multiple.
        assert_eq!(quota_told(5 << 19, 4 << 20), 5 << 19);
        assert_eq!(quota_told(5000, 64 << 10), 4096);
    }
}
