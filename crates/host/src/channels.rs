//! Where hints enter: each VM's channel (the ivshmem backing file, mapped), the validating
//! reader that copies a round out of it against the VM's RAM map, and the feedback written back
//! to the guest (round taken, entry budget, interval floor, its fast quota, rejected rounds).
//! The guest is untrusted: every round is validated before the engine sees it, and a round far
//! over the budget is refused before it is copied.

use crate::channel_file::{ChannelFile, Fault};
use crate::config::ChannelConfig;
use crate::vm::{self, VmInfo};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;
use tracing::debug;
use vtism_engine::VmId;
use vtism_proto::layout::off;
use vtism_proto::{
    write_feedback, ChannelReader, Feedback, HintRound, MmapRegion, RamMap, RejectReason,
    SharedRegion, TrackerReport, HOST_VERSION,
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
    /// Why there is no channel (no ivshmem device, an unsafe file, ...).
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
}

impl Channels {
    /// Opens a newly managed VM's channel (`configured`: the path from its `[[vm]]` entry) and
    /// tells the guest its quota.
    pub fn attach(
        &mut self,
        vm: VmId,
        name: &str,
        info: &VmInfo,
        configured: Option<&Path>,
        cfg: &ChannelConfig,
        quota_bytes: u64,
    ) {
        let (mapped, problem) = open(info, configured, cfg);
        let c = VmChannel {
            name: name.to_string(),
            mapped,
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
        feedback(cfg, &c);
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
        if let Some(c) = self.by_vm.get_mut(&vm).filter(|c| c.mapped.is_none()) {
            (c.mapped, c.problem) = open(info, configured, cfg);
        }
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

    /// Writes the host's feedback into the VM's channel.
    pub fn feedback(&self, vm: VmId, cfg: &ChannelConfig) {
        if let Some(c) = self.by_vm.get(&vm) {
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

/// Maps the VM's channel file: the configured path (any owner), else the backing file of its
/// ivshmem device, which must be owned by QEMU's user (a compromised QEMU cannot point the daemon
/// at a file it does not own). Either way a regular file, not through a symbolic link.
fn open(
    info: &VmInfo,
    configured: Option<&Path>,
    cfg: &ChannelConfig,
) -> (Option<Mapped>, Option<String>) {
    let (path, owner) = match configured {
        Some(p) => (p.to_path_buf(), None),
        None => match vm::pick_channel(&info.ivshmem, &cfg.device_prefix) {
            Some(d) => match &d.mem_path {
                Some(p) => (p.clone(), Some(info.uid)),
                None => {
                    return (
                        None,
                        Some(format!("ivshmem backend `{}` has no mem-path", d.backend)),
                    )
                }
            },
            None if info.ivshmem.is_empty() => {
                return (None, Some("no ivshmem-plain device".into()))
            }
            None => {
                return (
                    None,
                    Some(format!(
                        "{} ivshmem devices and none named `{}*`",
                        info.ivshmem.len(),
                        cfg.device_prefix
                    )),
                )
            }
        },
    };
    match ChannelFile::open(&path, cfg.max_region_mib << 20, owner) {
        Ok(file) => {
            let region = file.region();
            (Some(Mapped { file, region }), None)
        }
        Err(e) => (None, Some(format!("{}: {e}", path.display()))),
    }
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

fn feedback(cfg: &ChannelConfig, c: &VmChannel) {
    let Some(m) = &c.mapped else { return };
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
