//! vtismd's configuration: one TOML file, every field optional with a documented default
//! (docs/host.md has the reference). Unknown fields are errors; every error names its field.

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use thiserror::Error;
use vtism_engine::{EngineParams, Nanos, NodeId, PoolMode, PoolParams, RoundLimits, VmLimits};

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub daemon: DaemonConfig,
    pub discovery: DiscoveryConfig,
    pub admission: AdmissionConfig,
    pub channel: ChannelConfig,
    pub mover: MoverConfig,
    pub topology: TopologyConfig,
    pub defaults: VmDefaults,
    #[serde(rename = "vm")]
    pub vms: Vec<VmConfig>,
    pub engine: EngineParams,
    pub pool: PoolConfig,
    pub host_tracking: HostTrackingConfig,
}

/// Which VMs DAMON on the host watches (`[host_tracking] mode`, `[[vm]] host_tracking`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HostTrackingMode {
    /// Never.
    Off,
    /// VMs without a mapped vtism channel (no guest tracker can publish).
    #[default]
    Auto,
    /// Always, also beside a guest tracker (a second signal).
    On,
}

impl HostTrackingMode {
    pub fn label(self) -> &'static str {
        match self {
            HostTrackingMode::Off => "off",
            HostTrackingMode::Auto => "auto",
            HostTrackingMode::On => "on",
        }
    }
}

/// `[host_tracking]`: DAMON on the host over each tracked QEMU's guest RAM (one kdamond of
/// vtismd's own, `fvaddr` operations, one target per QEMU process). The monitoring attributes'
/// defaults are DAMON's own (Documentation/admin-guide/mm/damon/usage.rst: sampling 5 ms,
/// aggregation 100 ms, operations update 1 s, 10 - 1000 regions).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HostTrackingConfig {
    pub mode: HostTrackingMode,
    pub sample_us: u64,
    pub aggr_us: u64,
    pub update_us: u64,
    pub min_nr_regions: u64,
    pub max_nr_regions: u64,
    /// How often the kdamond's accessed regions are read and fed to the engine.
    pub report_interval_ms: u64,
    /// Most guest frames one report gives the engine per VM (hottest regions first).
    pub max_frames_per_report: u64,
    /// How often to look again while DAMON is used by someone else.
    pub busy_retry_ms: u64,
    /// DAMON's sysfs admin directory (tests point it at a fake tree).
    pub damon_root: PathBuf,
}

impl Default for HostTrackingConfig {
    fn default() -> Self {
        HostTrackingConfig {
            mode: HostTrackingMode::Auto,
            sample_us: 5_000,
            aggr_us: 100_000,
            update_us: 1_000_000,
            min_nr_regions: 10,
            max_nr_regions: 1_000,
            report_interval_ms: 1_000,
            max_frames_per_report: 262_144,
            busy_retry_ms: 5_000,
            damon_root: PathBuf::from("/sys/kernel/mm/damon/admin"),
        }
    }
}

/// How fast memory is divided among the VMs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PoolModeConfig {
    /// Fixed quotas: each VM keeps its initial share (`fast_quota_mib`/`_percent`).
    #[default]
    Island,
    /// One pool of fast memory: quotas follow each VM's hot set, within its limits.
    Pool,
}

impl PoolModeConfig {
    pub fn label(self) -> &'static str {
        match self {
            PoolModeConfig::Island => "island",
            PoolModeConfig::Pool => "pool",
        }
    }
}

/// `[pool]`: one pool of fast memory shared by the VMs (HMM-V's pool mode).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PoolConfig {
    pub mode: PoolModeConfig,
    /// Fast memory the pool hands out; 0 = the fast nodes' capacity less the reserve.
    pub fast_mib: u64,
    /// Share of the fast nodes' capacity kept back for the host when `fast_mib` is 0.
    pub reserve_percent: f64,
    /// How often quotas are rebalanced.
    pub rebalance_interval_ms: u64,
    /// A quota moves at most this share of the pool per rebalance.
    pub max_step_percent: f64,
    /// Quota changes smaller than this share of the VM's quota are not made.
    pub hysteresis_percent: f64,
    /// Fast memory a VM is given above its hot set, as a share of the hot set.
    pub headroom_percent: f64,
}

impl Default for PoolConfig {
    fn default() -> Self {
        // The engine's defaults (PoolParams), in the file's units.
        let p = PoolParams::default();
        PoolConfig {
            mode: PoolModeConfig::Island,
            fast_mib: 0,
            reserve_percent: 10.0,
            rebalance_interval_ms: p.rebalance_interval.0 / 1_000_000,
            max_step_percent: p.max_step_fraction * 100.0,
            hysteresis_percent: p.hysteresis_fraction * 100.0,
            headroom_percent: p.headroom_fraction * 100.0,
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DaemonConfig {
    /// Round interval: read channels, plan, move.
    pub interval_ms: u64,
    /// Control socket (`vtism ctl`); empty = none.
    pub control_socket: PathBuf,
    /// Prometheus `/metrics` listen address; empty = none.
    pub metrics_listen: String,
    pub log_format: LogFormat,
    /// tracing filter (e.g. `info`, `vtism_host=debug`); RUST_LOG overrides it.
    pub log_level: String,
    /// Root of sysfs (tests point it at a captured tree).
    pub sysfs_root: PathBuf,
}

impl Default for DaemonConfig {
    fn default() -> Self {
        DaemonConfig {
            interval_ms: RoundLimits::DEFAULT.interval_ms,
            control_socket: PathBuf::from("/run/vtism/vtismd.sock"),
            metrics_listen: "127.0.0.1:9464".into(),
            log_format: LogFormat::Text,
            log_level: "info".into(),
            sysfs_root: PathBuf::from("/sys"),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DiscoveryConfig {
    /// Directories searched (two levels deep) for QMP sockets: `*.qmp`, `*.qmp.sock`, and
    /// `vtism.sock`/`qmp.sock` files (libvirt keeps per-domain directories under
    /// /var/lib/libvirt/qemu; its own `monitor.sock` is held by libvirtd and is never used).
    pub scan_dirs: Vec<PathBuf>,
    /// Also try every other socket found in `scan_dirs` (off: only the names above).
    pub scan_any_socket: bool,
    /// How often to look for new sockets.
    pub scan_interval_ms: u64,
    /// How often to re-read each VM's memory map (hot-plug, reboot).
    pub refresh_interval_ms: u64,
    /// A reset or device event re-reads the VM at once, but at most once per this: a guest
    /// that resets in a loop costs one re-read per interval, not one per reset.
    pub resync_min_interval_ms: u64,
    /// Timeout of one QMP exchange.
    pub qmp_timeout_ms: u64,
    /// Wait at least this long before retrying a socket that failed.
    pub retry_backoff_ms: u64,
}

impl Default for DiscoveryConfig {
    fn default() -> Self {
        DiscoveryConfig {
            scan_dirs: vec![
                PathBuf::from("/var/lib/libvirt/qemu"),
                PathBuf::from("/run/vtism"),
            ],
            scan_any_socket: false,
            scan_interval_ms: 5000,
            refresh_interval_ms: 10000,
            resync_min_interval_ms: 2000,
            qmp_timeout_ms: 3000,
            retry_backoff_ms: 10000,
        }
    }
}

/// What a scan directory writable by others than the admins makes discovery do.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UnsafeDirPolicy {
    /// Log it once and scan it anyway (the peer checks still apply to its sockets).
    #[default]
    Warn,
    /// Do not scan it.
    Refuse,
}

/// QEMU's programs where distributions install them: Debian and Ubuntu's `qemu-system-*`,
/// Fedora and RHEL's `qemu-kvm`. Full paths, so that a program of another name or place that
/// calls itself QEMU is not one.
pub const DEFAULT_QEMU_EXECUTABLES: [&str; 3] = [
    "/usr/bin/qemu-system-*",
    "/usr/libexec/qemu-kvm",
    "/usr/bin/qemu-kvm",
];

/// `[admission]`: who may be a VM. A socket's peer must run an allowed executable as an allowed
/// user, its RAM claims must be mapped in the process, and discovery's threads, queue and VM
/// count are bounded.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdmissionConfig {
    /// Programs allowed as QEMU: full paths of /proc/<pid>/exe, or bare file names matched
    /// against its basename (`*` in the file name matches any run of characters).
    pub qemu_executables: Vec<String>,
    /// uids (SO_PEERCRED) allowed as QEMU; empty = the QEMU users: root and, where they
    /// exist, `libvirt-qemu` (Debian, Ubuntu) and `qemu` (Fedora, RHEL).
    pub qemu_uids: Vec<u32>,
    /// Groups, besides root, that may write to a scan directory.
    pub admin_gids: Vec<u32>,
    pub unsafe_scan_dir: UnsafeDirPolicy,
    /// Largest guest RAM a VM may claim, in GiB; 0 = the host's MemTotal.
    pub max_vm_ram_gib: u64,
    /// Largest guest RAM of all managed VMs together, in GiB; 0 = the host's MemTotal (a host
    /// that overcommits memory sets it higher).
    pub max_total_ram_gib: u64,
    /// Most VMs managed at once.
    pub max_vms: usize,
    /// Threads that talk to new monitors.
    pub attach_threads: usize,
    /// Sockets waiting for an attach thread; more wait for a later scan.
    pub max_pending_sockets: usize,
    /// Deadline of a whole exchange with a monitor (attach, refresh), however it trickles.
    pub qmp_exchange_timeout_ms: u64,
    /// Longest QMP reply read, in KiB.
    pub qmp_max_reply_kib: u64,
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        AdmissionConfig {
            qemu_executables: DEFAULT_QEMU_EXECUTABLES.map(String::from).to_vec(),
            qemu_uids: Vec::new(),
            admin_gids: Vec::new(),
            unsafe_scan_dir: UnsafeDirPolicy::Warn,
            max_vm_ram_gib: 0,
            max_total_ram_gib: 0,
            max_vms: 256,
            attach_threads: 2,
            max_pending_sockets: 64,
            qmp_exchange_timeout_ms: 10_000,
            qmp_max_reply_kib: 1024,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ChannelConfig {
    /// Entries per round asked of every guest (feedback `entry_budget`); 0 = no limit.
    pub entry_budget: u64,
    /// Rounds with more entries than this are rejected unread (`over_budget`): a guest that
    /// ignores the budget cannot make the daemon copy a huge round every interval.
    pub max_entries: u64,
    /// Interval floor asked of guests (feedback `min_interval_ms`).
    pub min_interval_ms: u32,
    /// Largest channel file mapped.
    pub max_region_mib: u64,
    /// Only use ivshmem devices whose id (or backend id) starts with this; empty = the only
    /// ivshmem-plain device of the VM, if there is exactly one.
    pub device_prefix: String,
}

impl Default for ChannelConfig {
    fn default() -> Self {
        ChannelConfig {
            entry_budget: 262_144,
            max_entries: 1 << 20,
            min_interval_ms: 500,
            max_region_mib: 64,
            device_prefix: "vtism".into(),
        }
    }
}

/// Upper bounds of the numeric fields without a natural one: far above any real setting, low
/// enough that no arithmetic on them overflows and no wait they set stalls the daemon.
mod bound {
    /// Any size in MiB (1 PiB).
    pub const MIB: u64 = 1 << 30;
    /// A rate limit in MB/s (1 TB/s).
    pub const MBPS: u64 = 1_000_000;
    /// An hour of a limit's rate at once.
    pub const BURST_S: u64 = 3_600;
    /// An interval or back-off, ms (one hour).
    pub const INTERVAL_MS: u64 = 3_600_000;
    /// A wait inside a round, ms: the QMP timeout (one minute), a busy-page retry (one second).
    pub const QMP_TIMEOUT_MS: u64 = 60_000;
    pub const RETRY_DELAY_MS: u64 = 1_000;
    /// Entries of one round: the capacity of the largest channel region (4 GiB of entries).
    pub const ENTRIES: u64 = 1 << 29;
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MoverConfig {
    /// Pages per move_pages(2) call.
    pub batch_pages: usize,
    /// Global rate limits in MB/s (10^6 bytes) per direction; 0 = unlimited.
    pub promote_mbps: u64,
    pub demote_mbps: u64,
    /// Per-VM rate limits in MB/s; 0 = unlimited. By default a quarter of the global limits:
    /// a guest that flips its hot set every round takes at most a quarter of each round's moves.
    pub vm_promote_mbps: u64,
    pub vm_demote_mbps: u64,
    /// Seconds of its rate each limit lets through at once (`RoundLimits::burst_s`).
    pub burst_s: u64,
    /// Times a busy page (EBUSY/EAGAIN) is retried within a round before it is left for later.
    pub busy_retries: u32,
    /// Pause before retrying busy pages.
    pub busy_retry_delay_ms: u64,
    /// Use MPOL_MF_MOVE_ALL (also moves pages shared with other processes; needs CAP_SYS_NICE).
    pub move_all: bool,
    /// process_madvise(MADV_COLD) on demoted pages, so host reclaim takes them first.
    pub madvise_cold: bool,
    /// Placement reconcile: every VM's pages are queried (move_pages status) once per this many
    /// seconds, spread over the rounds; the kernel moves pages too (NUMA balancing, reclaim).
    pub reconcile_sweep_s: u64,
    /// Upper bound of pages queried per VM per round (after the first sweep, which is faster).
    pub reconcile_max_pages_per_round: u64,
    /// A promotion worker per destination and source node, so that sources promote at once
    /// (else one per destination node).
    pub parallel_sources: bool,
    /// Nice levels the demotion workers run below the daemon (0-19; 0 = the same priority):
    /// guests and promotions come first, and a demotion still advances on a busy CPU.
    pub demote_nice: i32,
}

impl Default for MoverConfig {
    fn default() -> Self {
        MoverConfig {
            batch_pages: 4096,
            promote_mbps: RoundLimits::DEFAULT.promote_mbps,
            demote_mbps: RoundLimits::DEFAULT.demote_mbps,
            vm_promote_mbps: RoundLimits::DEFAULT.vm_promote_mbps,
            vm_demote_mbps: RoundLimits::DEFAULT.vm_demote_mbps,
            burst_s: RoundLimits::DEFAULT.burst_s,
            busy_retries: 2,
            busy_retry_delay_ms: 5,
            move_all: false,
            madvise_cold: false,
            reconcile_sweep_s: 60,
            reconcile_max_pages_per_round: 262_144,
            parallel_sources: true,
            demote_nice: 10,
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TopologyConfig {
    /// Per-node overrides (tier, socket, whether to use the node at all).
    pub node: Vec<NodeOverride>,
    /// Free memory kept on every node: plans never fill a node below this.
    pub min_free_mib: u64,
    /// When others fill a fast node below this much free memory, vtismd demotes the coldest
    /// frames of its own VMs there until it is back (never anything else). 0: off. At most
    /// `min_free_mib`, so that promotions never take back what it freed.
    pub free_watermark_mib: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NodeOverride {
    pub id: u8,
    /// Tier rank: 0 = fast (DRAM), larger = slower. Overrides sysfs memory tiers.
    pub tier: Option<u8>,
    /// Socket the node belongs to (for CPU-less nodes, where sysfs cannot say).
    pub socket: Option<u32>,
    /// Leave the node out entirely.
    pub ignore: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct VmDefaults {
    /// Fast quota of a VM without its own setting, as a percentage of its RAM.
    pub fast_quota_percent: f64,
    /// Manage VMs found by discovery that have no [[vm]] entry.
    pub manage_discovered: bool,
    /// Pool mode: guaranteed minimum and maximum quota, % of the VM's initial share (HMM-V: 75
    /// and 125).
    pub quota_min_percent: f64,
    pub quota_max_percent: f64,
}

impl Default for VmDefaults {
    fn default() -> Self {
        VmDefaults {
            fast_quota_percent: 25.0,
            manage_discovered: true,
            quota_min_percent: 75.0,
            quota_max_percent: 125.0,
        }
    }
}

/// A VM's fast-memory limits in bytes (4 KiB multiples): its initial share (the island-mode
/// quota) and, for pool mode, the guaranteed minimum, the maximum and the weight.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct QuotaLimits {
    pub share_bytes: u64,
    pub min_bytes: u64,
    pub max_bytes: u64,
    pub shares: u32,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct VmConfig {
    /// The entry's name. Without `qmp_socket`, matched against QEMU's `-name` (QMP
    /// query-name); with one, only a label.
    pub name: String,
    /// QMP socket: the entry is the VM's on this socket, whatever name it reports. Optional
    /// when discovery finds the socket and the entry matches by name.
    pub qmp_socket: Option<PathBuf>,
    /// Channel file; default: the ivshmem backend's `mem-path`.
    pub channel: Option<PathBuf>,
    /// Initial share of fast memory (island mode: the fixed quota), in MiB or % of the VM's RAM.
    pub fast_quota_mib: Option<u64>,
    pub fast_quota_percent: Option<f64>,
    /// Pool mode: guaranteed minimum quota, in MiB or % of the initial share.
    pub quota_min_mib: Option<u64>,
    pub quota_min_percent: Option<f64>,
    /// Pool mode: maximum quota, in MiB or % of the initial share.
    pub quota_max_mib: Option<u64>,
    pub quota_max_percent: Option<f64>,
    /// Pool mode: weight in the share-based split of the pool; default: the initial share in
    /// MiB, so quotas without demand are in proportion to the configured shares.
    pub shares: Option<u32>,
    /// NUMA node of the VM's vCPUs; default: from the vCPU threads' affinity.
    pub home_node: Option<u8>,
    /// Per-VM rate limits in MB/s, overriding mover.vm_*_mbps.
    pub promote_mbps: Option<u64>,
    pub demote_mbps: Option<u64>,
    /// DAMON on the host for this VM, overriding host_tracking.mode.
    pub host_tracking: Option<HostTrackingMode>,
    /// Leave this VM alone.
    pub ignore: bool,
}

/// A configuration problem, naming the field as written in the file.
#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("{field}: {problem}")]
    Invalid { field: String, problem: String },
}

impl ConfigError {
    /// The field named, for `Invalid`.
    pub fn field(&self) -> Option<&str> {
        match self {
            ConfigError::Invalid { field, .. } => Some(field),
            _ => None,
        }
    }
}

fn invalid(field: impl Into<String>, problem: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        field: field.into(),
        problem: problem.into(),
    }
}

impl Config {
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text).map_err(|e| match e {
            ConfigError::Parse { message, .. } => ConfigError::Parse {
                path: path.to_path_buf(),
                message,
            },
            e => e,
        })
    }

    /// Parses and validates.
    pub fn parse(text: &str) -> Result<Config, ConfigError> {
        let cfg: Config = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: PathBuf::from("<config>"),
            message: e.to_string().trim_end().to_string(),
        })?;
        cfg.validate()?;
        Ok(cfg)
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let d = &self.daemon;
        if !(10..=600_000).contains(&d.interval_ms) {
            return Err(invalid(
                "daemon.interval_ms",
                "must be between 10 and 600000",
            ));
        }
        if !d.metrics_listen.is_empty() && d.metrics_listen.parse::<std::net::SocketAddr>().is_err()
        {
            return Err(invalid(
                "daemon.metrics_listen",
                format!("`{}` is not an address:port", d.metrics_listen),
            ));
        }
        if tracing_subscriber::EnvFilter::try_new(&d.log_level).is_err() {
            return Err(invalid("daemon.log_level", "not a valid tracing filter"));
        }
        let s = &self.discovery;
        let (c, m) = (&self.channel, &self.mover);
        for (f, v, lo, hi) in [
            (
                "discovery.scan_interval_ms",
                s.scan_interval_ms,
                100,
                bound::INTERVAL_MS,
            ),
            (
                "discovery.refresh_interval_ms",
                s.refresh_interval_ms,
                100,
                bound::INTERVAL_MS,
            ),
            (
                "discovery.resync_min_interval_ms",
                s.resync_min_interval_ms,
                100,
                bound::INTERVAL_MS,
            ),
            (
                "discovery.qmp_timeout_ms",
                s.qmp_timeout_ms,
                50,
                bound::QMP_TIMEOUT_MS,
            ),
            (
                "discovery.retry_backoff_ms",
                s.retry_backoff_ms,
                0,
                bound::INTERVAL_MS,
            ),
            ("channel.max_entries", c.max_entries, 1, bound::ENTRIES),
            (
                "channel.min_interval_ms",
                u64::from(c.min_interval_ms),
                0,
                bound::INTERVAL_MS,
            ),
            ("mover.promote_mbps", m.promote_mbps, 0, bound::MBPS),
            ("mover.demote_mbps", m.demote_mbps, 0, bound::MBPS),
            ("mover.vm_promote_mbps", m.vm_promote_mbps, 0, bound::MBPS),
            ("mover.vm_demote_mbps", m.vm_demote_mbps, 0, bound::MBPS),
            ("mover.burst_s", m.burst_s, 1, bound::BURST_S),
            (
                "mover.busy_retry_delay_ms",
                m.busy_retry_delay_ms,
                0,
                bound::RETRY_DELAY_MS,
            ),
            (
                "mover.reconcile_sweep_s",
                m.reconcile_sweep_s,
                1,
                bound::INTERVAL_MS / 1000,
            ),
            (
                "mover.reconcile_max_pages_per_round",
                m.reconcile_max_pages_per_round,
                1,
                1 << 30,
            ),
            (
                "topology.min_free_mib",
                self.topology.min_free_mib,
                0,
                bound::MIB,
            ),
            (
                "topology.free_watermark_mib",
                self.topology.free_watermark_mib,
                0,
                self.topology.min_free_mib,
            ),
            ("pool.fast_mib", self.pool.fast_mib, 0, bound::MIB),
        ] {
            if !(lo..=hi).contains(&v) {
                return Err(invalid(f, format!("must be between {lo} and {hi}")));
            }
        }
        if c.entry_budget > c.max_entries {
            return Err(invalid(
                "channel.entry_budget",
                "must not exceed channel.max_entries",
            ));
        }
        if !(1..=4096).contains(&c.max_region_mib) {
            return Err(invalid(
                "channel.max_region_mib",
                "must be between 1 and 4096",
            ));
        }
        if !(1..=1 << 20).contains(&m.batch_pages) {
            return Err(invalid(
                "mover.batch_pages",
                "must be between 1 and 1048576",
            ));
        }
        if !(0..=19).contains(&m.demote_nice) {
            return Err(invalid("mover.demote_nice", "must be between 0 and 19"));
        }
        if m.busy_retries > 100 {
            return Err(invalid("mover.busy_retries", "must be at most 100"));
        }
        let mut seen = std::collections::BTreeSet::new();
        for (i, n) in self.topology.node.iter().enumerate() {
            if n.id > vtism_engine::NodeId::MAX {
                return Err(invalid(
                    format!("topology.node[{i}].id"),
                    format!("must be at most {}", vtism_engine::NodeId::MAX),
                ));
            }
            if !seen.insert(n.id) {
                return Err(invalid(
                    format!("topology.node[{i}].id"),
                    format!("node {} is listed twice", n.id),
                ));
            }
            if n.tier.is_some_and(|t| t > 15) {
                return Err(invalid(
                    format!("topology.node[{i}].tier"),
                    "must be at most 15",
                ));
            }
        }
        check_percent(
            "defaults.fast_quota_percent",
            self.defaults.fast_quota_percent,
        )?;
        check_min_percent(
            "defaults.quota_min_percent",
            self.defaults.quota_min_percent,
        )?;
        check_max_percent(
            "defaults.quota_max_percent",
            self.defaults.quota_max_percent,
        )?;
        self.validate_paths()?;
        self.validate_pool()?;
        self.validate_admission()?;
        self.validate_host_tracking()?;
        let mut names = std::collections::BTreeSet::new();
        let mut sockets = std::collections::BTreeMap::new();
        let mut channels = std::collections::BTreeMap::new();
        for (i, v) in self.vms.iter().enumerate() {
            // Two entries for one socket or one channel file would be one VM managed twice, or
            // one VM's hints read as another's.
            for (field, path, seen) in [
                ("qmp_socket", &v.qmp_socket, &mut sockets),
                ("channel", &v.channel, &mut channels),
            ] {
                if let Some(p) = path {
                    if let Some(j) = seen.insert(p.clone(), i) {
                        return Err(invalid(
                            format!("vm[{i}].{field}"),
                            format!("`{}` is also vm[{j}]'s", p.display()),
                        ));
                    }
                }
            }
            if v.name.is_empty() && v.qmp_socket.is_none() {
                return Err(invalid(
                    format!("vm[{i}].name"),
                    "a [[vm]] needs a name or a qmp_socket",
                ));
            }
            if v.name.len() > crate::vm::NAME_MAX_BYTES || v.name.chars().any(char::is_control) {
                return Err(invalid(
                    format!("vm[{i}].name"),
                    format!(
                        "at most {} bytes and no control characters (the names vtismd keeps of \
                         what QEMU reports)",
                        crate::vm::NAME_MAX_BYTES
                    ),
                ));
            }
            if !v.name.is_empty() && !names.insert(v.name.clone()) {
                return Err(invalid(
                    format!("vm[{i}].name"),
                    format!("`{}` is listed twice", v.name),
                ));
            }
            if let Some(p) = v.fast_quota_percent {
                check_percent(&format!("vm[{i}].fast_quota_percent"), p)?;
            }
            if v.fast_quota_mib.is_some() && v.fast_quota_percent.is_some() {
                return Err(invalid(
                    format!("vm[{i}].fast_quota_mib"),
                    "set fast_quota_mib or fast_quota_percent, not both",
                ));
            }
            if v.home_node.is_some_and(|h| h > vtism_engine::NodeId::MAX) {
                return Err(invalid(format!("vm[{i}].home_node"), "not a node id"));
            }
            validate_vm_limits(i, v)?;
        }
        if self.pool.mode == PoolModeConfig::Pool && self.pool.fast_mib > 0 {
            // Minimums known from the file alone (MiB, or % of a share given in MiB) must fit.
            let mins: u64 = self
                .vms
                .iter()
                .filter(|v| !v.ignore)
                .filter_map(
                    |v| match (v.quota_min_mib, v.quota_min_percent, v.fast_quota_mib) {
                        (Some(m), _, _) => Some(m),
                        (None, p, Some(share)) => {
                            Some(pct(share, p.unwrap_or(self.defaults.quota_min_percent)))
                        }
                        _ => None,
                    },
                )
                .sum();
            if mins > self.pool.fast_mib {
                return Err(invalid(
                    "pool.fast_mib",
                    format!(
                        "the [[vm]] minimums add up to {mins} MiB, more than the pool's {} MiB",
                        self.pool.fast_mib
                    ),
                ));
            }
        }
        self.engine
            .validate()
            .map_err(|e| invalid(format!("engine.{}", e.field), e.problem))?;
        Ok(())
    }

    /// Paths are absolute: relative ones would be resolved against whatever directory vtismd
    /// was started in (`/` under systemd), not the configuration file's.
    fn validate_paths(&self) -> Result<(), ConfigError> {
        let mut paths: Vec<(String, &Path)> = vec![
            ("daemon.control_socket".into(), &self.daemon.control_socket),
            ("daemon.sysfs_root".into(), &self.daemon.sysfs_root),
        ];
        for (i, d) in self.discovery.scan_dirs.iter().enumerate() {
            paths.push((format!("discovery.scan_dirs[{i}]"), d));
        }
        for (i, v) in self.vms.iter().enumerate() {
            if let Some(q) = &v.qmp_socket {
                paths.push((format!("vm[{i}].qmp_socket"), q));
            }
            if let Some(c) = &v.channel {
                paths.push((format!("vm[{i}].channel"), c));
            }
        }
        for (field, p) in paths {
            if !p.as_os_str().is_empty() && !p.is_absolute() {
                return Err(invalid(
                    field,
                    format!(
                        "`{}` is relative; give an absolute path (vtismd's working directory is \
                         not the configuration file's)",
                        p.display()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Settings that are valid but worth a second look, one line each: printed by
    /// `--check-config` and logged when the daemon starts.
    pub fn warnings(&self) -> Vec<String> {
        let mut w = Vec::new();
        if let Ok(a) = self.daemon.metrics_listen.parse::<std::net::SocketAddr>() {
            if a.ip().is_unspecified() {
                w.push(format!(
                    "daemon.metrics_listen: `{a}` serves the metrics (VM names, quotas, page \
                     counts) on every interface, without authentication; name one address, or \
                     keep 127.0.0.1 behind a proxy"
                ));
            }
        }
        w
    }

    fn validate_admission(&self) -> Result<(), ConfigError> {
        let a = &self.admission;
        // A pattern is a full path with `*` in its file name only, or a bare file name.
        let file_name = |p: &str| match p.rsplit_once('/') {
            Some((dir, name)) if p.starts_with('/') && !dir.contains('*') => Some(name.to_owned()),
            Some(_) => None,
            None => Some(p.to_owned()),
        };
        if let Some(p) = a
            .qemu_executables
            .iter()
            .find(|p| file_name(p).is_none_or(|n| n.is_empty()))
        {
            return Err(invalid(
                "admission.qemu_executables",
                format!(
                    "`{p}` is neither a full path (with `*` in the file name only) nor a file \
                     name"
                ),
            ));
        }
        if a.qemu_executables.is_empty() {
            return Err(invalid(
                "admission.qemu_executables",
                format!(
                    "lists nothing, so no QEMU would ever be managed (the default is {:?})",
                    DEFAULT_QEMU_EXECUTABLES
                ),
            ));
        }
        if let Some(p) = a
            .qemu_executables
            .iter()
            .find(|p| file_name(p).is_some_and(|n| n.chars().all(|c| c == '*' || c == '?')))
        {
            return Err(invalid(
                "admission.qemu_executables",
                format!(
                    "`{p}` matches any program, which vtismd (root) would then move pages for; \
                     name QEMU's executables (e.g. \"qemu-system-*\")"
                ),
            ));
        }
        for (f, v, lo, hi) in [
            ("admission.max_vms", a.max_vms as u64, 1, 4096),
            ("admission.attach_threads", a.attach_threads as u64, 1, 64),
            (
                "admission.max_pending_sockets",
                a.max_pending_sockets as u64,
                1,
                65536,
            ),
            (
                "admission.qmp_max_reply_kib",
                a.qmp_max_reply_kib,
                64,
                65536,
            ),
            ("admission.max_vm_ram_gib", a.max_vm_ram_gib, 0, 1 << 20),
            (
                "admission.max_total_ram_gib",
                a.max_total_ram_gib,
                0,
                1 << 24,
            ),
        ] {
            if !(lo..=hi).contains(&v) {
                return Err(invalid(f, format!("must be between {lo} and {hi}")));
            }
        }
        let t = a.qmp_exchange_timeout_ms;
        if !(self.discovery.qmp_timeout_ms..=600_000).contains(&t) {
            return Err(invalid(
                "admission.qmp_exchange_timeout_ms",
                "must be between discovery.qmp_timeout_ms and 600000",
            ));
        }
        Ok(())
    }

    fn validate_host_tracking(&self) -> Result<(), ConfigError> {
        let h = &self.host_tracking;
        // DAMON's own checks (6.12 mm/damon/core.c, damon_set_attrs): sample <= aggr, and
        // 3 <= min_nr_regions <= max_nr_regions.
        for (f, v, lo, hi) in [
            ("host_tracking.sample_us", h.sample_us, 100, 10_000_000),
            ("host_tracking.aggr_us", h.aggr_us, 100, 100_000_000),
            ("host_tracking.update_us", h.update_us, 100, 1_000_000_000),
            ("host_tracking.min_nr_regions", h.min_nr_regions, 3, 100_000),
            ("host_tracking.max_nr_regions", h.max_nr_regions, 3, 100_000),
            (
                "host_tracking.report_interval_ms",
                h.report_interval_ms,
                10,
                bound::INTERVAL_MS,
            ),
            (
                "host_tracking.max_frames_per_report",
                h.max_frames_per_report,
                1,
                1 << 28,
            ),
            (
                "host_tracking.busy_retry_ms",
                h.busy_retry_ms,
                100,
                bound::INTERVAL_MS,
            ),
        ] {
            if !(lo..=hi).contains(&v) {
                return Err(invalid(f, format!("must be between {lo} and {hi}")));
            }
        }
        if h.aggr_us < h.sample_us {
            return Err(invalid(
                "host_tracking.aggr_us",
                "must be at least host_tracking.sample_us (DAMON refuses it otherwise)",
            ));
        }
        if h.max_nr_regions < h.min_nr_regions {
            return Err(invalid(
                "host_tracking.max_nr_regions",
                "must be at least host_tracking.min_nr_regions",
            ));
        }
        if h.damon_root.as_os_str().is_empty() {
            return Err(invalid("host_tracking.damon_root", "must not be empty"));
        }
        Ok(())
    }

    fn validate_pool(&self) -> Result<(), ConfigError> {
        let p = &self.pool;
        let checks = [
            (
                "pool.reserve_percent",
                (0.0..100.0).contains(&p.reserve_percent),
                "must be at least 0 and below 100",
            ),
            (
                "pool.rebalance_interval_ms",
                (100..=3_600_000).contains(&p.rebalance_interval_ms),
                "must be between 100 and 3600000",
            ),
            (
                "pool.max_step_percent",
                p.max_step_percent > 0.0 && p.max_step_percent <= 100.0,
                "must be above 0 and at most 100",
            ),
            (
                "pool.hysteresis_percent",
                (0.0..100.0).contains(&p.hysteresis_percent),
                "must be at least 0 and below 100",
            ),
            (
                "pool.headroom_percent",
                (0.0..=1000.0).contains(&p.headroom_percent),
                "must be between 0 and 1000",
            ),
        ];
        match checks.into_iter().find(|c| !c.1) {
            Some((field, _, problem)) => Err(invalid(field, problem)),
            None => Ok(()),
        }
    }

    /// Fast memory the pool hands out, given the fast nodes' total capacity: `pool.fast_mib`, or
    /// the capacity less `pool.reserve_percent`. Errors name `pool.fast_mib`.
    pub fn pool_fast_bytes(&self, fast_capacity_bytes: u64) -> Result<u64, ConfigError> {
        if self.pool.fast_mib > 0 {
            let b = self.pool.fast_mib.saturating_mul(1 << 20);
            if b > fast_capacity_bytes {
                return Err(invalid(
                    "pool.fast_mib",
                    format!(
                        "{} MiB is more than the fast nodes hold ({} MiB)",
                        self.pool.fast_mib,
                        fast_capacity_bytes >> 20
                    ),
                ));
            }
            return Ok(b);
        }
        let keep = 1.0 - self.pool.reserve_percent / 100.0;
        Ok(((fast_capacity_bytes as f64 * keep) as u64) & !4095)
    }

    /// A VM's limits: its initial share (`quota_for`), and minimum and maximum from MiB or from
    /// percentages of that share, clamped so that min <= share <= max <= RAM.
    pub fn limits_for(&self, entry: Option<&VmConfig>, ram_bytes: u64) -> QuotaLimits {
        let share = self.quota_for(entry, ram_bytes);
        let d = &self.defaults;
        let bytes = |mib: Option<u64>, p: Option<f64>, default_p: f64| match mib {
            Some(m) => m.saturating_mul(1 << 20),
            None => (share as f64 * p.unwrap_or(default_p) / 100.0) as u64,
        };
        let min = bytes(
            entry.and_then(|e| e.quota_min_mib),
            entry.and_then(|e| e.quota_min_percent),
            d.quota_min_percent,
        );
        let max = bytes(
            entry.and_then(|e| e.quota_max_mib),
            entry.and_then(|e| e.quota_max_percent),
            d.quota_max_percent,
        );
        let max = max.max(share).min(ram_bytes) & !4095;
        let min = min.min(share) & !4095;
        QuotaLimits {
            share_bytes: share,
            min_bytes: min,
            max_bytes: max,
            shares: entry
                .and_then(|e| e.shares)
                .unwrap_or_else(|| (share >> 20).clamp(1, u64::from(u32::MAX)) as u32),
        }
    }

    /// The engine's pool parameters. Island mode keeps every VM at its initial share whatever
    /// the sum (as before pools existed), so its pool is unbounded; pool mode hands out
    /// `pool_fast_bytes`.
    pub fn pool_params(&self, fast_capacity_bytes: u64) -> Result<PoolParams, ConfigError> {
        let p = &self.pool;
        let (mode, fast_bytes) = match p.mode {
            PoolModeConfig::Island => (PoolMode::Island, ISLAND_POOL_BYTES),
            PoolModeConfig::Pool => (PoolMode::Pool, self.pool_fast_bytes(fast_capacity_bytes)?),
        };
        Ok(PoolParams {
            mode,
            fast_bytes,
            rebalance_interval: Nanos(p.rebalance_interval_ms.saturating_mul(1_000_000)),
            max_step_fraction: p.max_step_percent / 100.0,
            hysteresis_fraction: p.hysteresis_percent / 100.0,
            headroom_fraction: p.headroom_percent / 100.0,
        })
    }

    /// The limits the engine's pool gets for a VM: in island mode its share exactly (a fixed
    /// quota), in pool mode its minimum, maximum and shares.
    pub fn engine_limits(&self, l: &QuotaLimits) -> VmLimits {
        match self.pool.mode {
            PoolModeConfig::Island => VmLimits {
                min_bytes: l.share_bytes,
                max_bytes: l.share_bytes,
                shares: 1,
            },
            PoolModeConfig::Pool => VmLimits {
                min_bytes: l.min_bytes,
                max_bytes: l.max_bytes,
                shares: l.shares,
            },
        }
    }

    /// The [[vm]] entry for a VM found on `socket` that calls itself `name`: the entry naming
    /// that socket, else an entry without a socket whose name is `name`. An entry with a
    /// `qmp_socket` is pinned to it: another process reporting its name never gets it (the
    /// name QEMU reports is a label, not a key to trusted settings).
    pub fn vm_entry(&self, name: &str, socket: &Path) -> Option<&VmConfig> {
        self.vm_entry_index(name, socket).map(|i| &self.vms[i])
    }

    /// The index in `vms` of `vm_entry`'s entry.
    pub fn vm_entry_index(&self, name: &str, socket: &Path) -> Option<usize> {
        self.vms
            .iter()
            .position(|v| v.qmp_socket.as_deref() == Some(socket))
            .or_else(|| {
                self.vms
                    .iter()
                    .position(|v| v.qmp_socket.is_none() && !v.name.is_empty() && v.name == name)
            })
    }

    /// Fast quota in bytes for a VM with `ram_bytes` of RAM, rounded down to 4 KiB frames.
    pub fn quota_for(&self, entry: Option<&VmConfig>, ram_bytes: u64) -> u64 {
        let q = match entry {
            Some(VmConfig {
                fast_quota_mib: Some(m),
                ..
            }) => m.saturating_mul(1 << 20),
            Some(VmConfig {
                fast_quota_percent: Some(p),
                ..
            }) => (ram_bytes as f64 * p / 100.0) as u64,
            _ => (ram_bytes as f64 * self.defaults.fast_quota_percent / 100.0) as u64,
        };
        q.min(ram_bytes) & !4095
    }
}

/// One VM's settings, resolved once from its `[[vm]]` entry (by socket, else by name for
/// entries without a socket) and the defaults: when it is attached, when its RAM changes, and at
/// every reload.
#[derive(Clone, Debug, PartialEq)]
pub struct VmSettings {
    /// Its `[[vm]]` entry (the index in `Config::vms`), if it has one: one live VM per entry.
    pub entry: Option<usize>,
    /// Its `[[vm]]` entry's name, if it has an entry.
    pub entry_name: Option<String>,
    /// The entry says to leave the VM alone.
    pub ignore: bool,
    /// Channel file from the entry (any owner, the other checks of a channel file still apply);
    /// `None`: QEMU's ivshmem backend.
    pub channel: Option<PathBuf>,
    /// Home node from the entry; `None`: from the vCPU threads.
    pub home_node: Option<NodeId>,
    /// Initial share, minimum, maximum, shares, in bytes.
    pub limits: QuotaLimits,
    /// What the pool enforces: the share exactly in island mode, the limits in pool mode.
    pub pool_limits: VmLimits,
    /// The VM's move rate limits, MB/s (0 = none).
    pub promote_mbps: u64,
    pub demote_mbps: u64,
    /// Whether its `[[vm]]` entry sets them: then they bind as set, their burst never
    /// following the quota (`MoveLimits::set_own_rates`).
    pub own_rates: bool,
    /// Whether DAMON on the host watches the VM (`auto`: when it has no channel).
    pub host_tracking: HostTrackingMode,
}

impl Config {
    /// The settings of a VM named `name` found on `socket`, with `ram_bytes` of RAM.
    pub fn vm_settings(&self, name: &str, socket: &Path, ram_bytes: u64) -> VmSettings {
        let index = self.vm_entry_index(name, socket);
        let entry = index.map(|i| &self.vms[i]);
        let limits = self.limits_for(entry, ram_bytes);
        VmSettings {
            entry: index,
            entry_name: entry.map(|e| e.name.clone()).filter(|n| !n.is_empty()),
            ignore: entry.is_some_and(|e| e.ignore),
            channel: entry.and_then(|e| e.channel.clone()),
            home_node: entry.and_then(|e| e.home_node).map(NodeId),
            pool_limits: self.engine_limits(&limits),
            limits,
            promote_mbps: entry
                .and_then(|e| e.promote_mbps)
                .unwrap_or(self.mover.vm_promote_mbps),
            demote_mbps: entry
                .and_then(|e| e.demote_mbps)
                .unwrap_or(self.mover.vm_demote_mbps),
            own_rates: entry.is_some_and(|e| e.promote_mbps.is_some() || e.demote_mbps.is_some()),
            host_tracking: entry
                .and_then(|e| e.host_tracking)
                .unwrap_or(self.host_tracking.mode),
        }
    }

    /// Whether a VM found by discovery is managed: not ignored, and listed unless
    /// `defaults.manage_discovered`.
    pub fn manages(&self, name: &str, socket: &Path) -> Result<(), NotManaged> {
        match self.vm_entry(name, socket) {
            Some(e) if e.ignore => Err(NotManaged::Ignored),
            None if !self.defaults.manage_discovered => Err(NotManaged::NotListed),
            _ => Ok(()),
        }
    }
}

/// Why a VM found by discovery is left alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NotManaged {
    /// Its `[[vm]]` entry says `ignore = true`.
    Ignored,
    /// No `[[vm]]` entry, and `defaults.manage_discovered = false`.
    NotListed,
}

/// Island mode's pool: large enough that fixed quotas always fit (their sum is not checked,
/// as before pools existed), small enough that sums of quotas cannot overflow.
pub const ISLAND_POOL_BYTES: u64 = u64::MAX >> 8;

fn pct(mib: u64, percent: f64) -> u64 {
    (mib as f64 * percent / 100.0) as u64
}

/// A minimum in % of the initial share: 0 - 100.
fn check_min_percent(field: &str, p: f64) -> Result<(), ConfigError> {
    check_between(field, p, 0.0, 100.0, " (% of the initial share)")
}

/// A maximum in % of the initial share: 100 - 10000.
fn check_max_percent(field: &str, p: f64) -> Result<(), ConfigError> {
    check_between(field, p, 100.0, 10000.0, " (% of the initial share)")
}

fn check_between(field: &str, p: f64, lo: f64, hi: f64, unit: &str) -> Result<(), ConfigError> {
    if !(lo..=hi).contains(&p) {
        return Err(invalid(
            field,
            format!("must be between {lo} and {hi}{unit}"),
        ));
    }
    Ok(())
}

fn check_shares(field: &str, s: u32) -> Result<(), ConfigError> {
    if s == 0 {
        return Err(invalid(field, "must be at least 1"));
    }
    Ok(())
}

/// Per-VM limits: one form each for min and max, min <= share <= max where the file says so.
fn validate_vm_limits(i: usize, v: &VmConfig) -> Result<(), ConfigError> {
    for (field, mib) in [
        ("fast_quota_mib", v.fast_quota_mib),
        ("quota_min_mib", v.quota_min_mib),
        ("quota_max_mib", v.quota_max_mib),
    ] {
        if mib.is_some_and(|m| m > bound::MIB) {
            return Err(invalid(
                format!("vm[{i}].{field}"),
                format!("must be at most {}", bound::MIB),
            ));
        }
    }
    for (field, mbps) in [
        ("promote_mbps", v.promote_mbps),
        ("demote_mbps", v.demote_mbps),
    ] {
        if mbps.is_some_and(|m| m > bound::MBPS) {
            return Err(invalid(
                format!("vm[{i}].{field}"),
                format!("must be at most {}", bound::MBPS),
            ));
        }
    }
    if let Some(p) = v.quota_min_percent {
        check_min_percent(&format!("vm[{i}].quota_min_percent"), p)?;
    }
    if let Some(p) = v.quota_max_percent {
        check_max_percent(&format!("vm[{i}].quota_max_percent"), p)?;
    }
    if let Some(s) = v.shares {
        check_shares(&format!("vm[{i}].shares"), s)?;
    }
    if v.quota_min_mib.is_some() && v.quota_min_percent.is_some() {
        return Err(invalid(
            format!("vm[{i}].quota_min_mib"),
            "set quota_min_mib or quota_min_percent, not both",
        ));
    }
    if v.quota_max_mib.is_some() && v.quota_max_percent.is_some() {
        return Err(invalid(
            format!("vm[{i}].quota_max_mib"),
            "set quota_max_mib or quota_max_percent, not both",
        ));
    }
    if let (Some(lo), Some(hi)) = (v.quota_min_mib, v.quota_max_mib) {
        if lo > hi {
            return Err(invalid(
                format!("vm[{i}].quota_min_mib"),
                format!("{lo} MiB is above quota_max_mib ({hi} MiB)"),
            ));
        }
    }
    if let Some(share) = v.fast_quota_mib {
        if v.quota_min_mib.is_some_and(|m| m > share) {
            return Err(invalid(
                format!("vm[{i}].quota_min_mib"),
                format!("must not exceed the initial share (fast_quota_mib = {share})"),
            ));
        }
        if v.quota_max_mib.is_some_and(|m| m < share) {
            return Err(invalid(
                format!("vm[{i}].quota_max_mib"),
                format!("must not be below the initial share (fast_quota_mib = {share})"),
            ));
        }
    }
    Ok(())
}

fn check_percent(field: &str, p: f64) -> Result<(), ConfigError> {
    check_between(field, p, 0.0, 100.0, "")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An entry with a socket is that socket's, whatever name the VM on it reports; an entry
    #[test]
    fn relative_paths_are_refused_with_their_field() {
        for (text, field) in [
            (
                "[daemon]\ncontrol_socket = \"vtismd.sock\"\n",
                "daemon.control_socket",
            ),
            ("[daemon]\nsysfs_root = \"sys\"\n", "daemon.sysfs_root"),
            (
                "[discovery]\nscan_dirs = [\"/run/vtism\", \"qmp\"]\n",
                "discovery.scan_dirs[1]",
            ),
            (
                "[[vm]]\nname = \"a\"\nqmp_socket = \"a.qmp\"\n",
                "vm[0].qmp_socket",
            ),
            (
                "[[vm]]\nname = \"a\"\nchannel = \"./a.chan\"\n",
                "vm[0].channel",
            ),
        ] {
            let e = Config::parse(text).unwrap_err();
            assert_eq!(e.field(), Some(field), "{text}: {e}");
            assert!(e.to_string().contains("absolute"), "{e}");
        }
        assert!(Config::parse("[[vm]]\nname = \"a\"\nchannel = \"/dev/shm/a\"\n").is_ok());
    }

    #[test]
    fn vm_names_are_ones_vtismd_can_keep() {
        for name in [
            "a\\nb".to_string(),
            "x".repeat(crate::vm::NAME_MAX_BYTES + 1),
        ] {
            let e = Config::parse(&format!("[[vm]]\nname = \"{name}\"\n")).unwrap_err();
            assert_eq!(e.field(), Some("vm[0].name"), "{e}");
        }
        let max = "x".repeat(crate::vm::NAME_MAX_BYTES);
        assert!(Config::parse(&format!("[[vm]]\nname = \"{max}\"\n")).is_ok());
    }

    #[test]
    fn metrics_on_every_interface_are_a_warning() {
        let c = Config::parse("").unwrap();
        assert_eq!(c.warnings(), Vec::<String>::new());
        for addr in ["0.0.0.0:9464", "[::]:9464"] {
            let c = Config::parse(&format!("[daemon]\nmetrics_listen = \"{addr}\"\n")).unwrap();
            let w = c.warnings();
            assert_eq!(w.len(), 1, "{addr}");
            assert!(w[0].starts_with("daemon.metrics_listen"), "{w:?}");
        }
        let c = Config::parse("[daemon]\nmetrics_listen = \"10.0.0.5:9464\"\n").unwrap();
        assert!(c.warnings().is_empty());
    }

    /// without one matches by name; a name never reaches an entry pinned to a socket.
    #[test]
    fn entries_with_a_socket_match_by_socket_only() {
        let c = Config::parse(
            "[[vm]]\nname = \"db1\"\nqmp_socket = \"/run/vtism/qmp/db1.qmp\"\nfast_quota_mib = 64\n\
             [[vm]]\nname = \"web1\"\nfast_quota_mib = 32\n",
        )
        .unwrap();
        let (db1, other) = (
            Path::new("/run/vtism/qmp/db1.qmp"),
            Path::new("/run/vtism/x.qmp"),
        );
        assert_eq!(c.vm_entry_index("db1", db1), Some(0));
        assert_eq!(
            c.vm_entry_index("renamed", db1),
            Some(0),
            "the socket decides"
        );
        assert_eq!(c.vm_entry_index("db1", other), None, "an impostor's name");
        assert_eq!(
            c.vm_entry_index("web1", other),
            Some(1),
            "no socket: by name"
        );
        assert_eq!(
            c.vm_entry_index("web1", db1),
            Some(0),
            "the socket before a name"
        );
        assert_eq!(c.vm_settings("db1", other, 1 << 30).entry, None);
        assert_eq!(c.vm_settings("db1", other, 1 << 30).channel, None);
        let mut strict = c.clone();
        strict.defaults.manage_discovered = false;
        assert_eq!(strict.manages("db1", other), Err(NotManaged::NotListed));
        assert_eq!(strict.manages("db1", db1), Ok(()));
    }

    #[test]
    fn host_tracking_section_and_its_errors() {
        let c = Config::parse(
            "[host_tracking]\nmode = \"on\"\naggr_us = 200000\n[[vm]]\nname = \"a\"\nhost_tracking = \"off\"\n",
        )
        .unwrap();
        assert_eq!(c.host_tracking.mode, HostTrackingMode::On);
        assert_eq!(c.host_tracking.aggr_us, 200_000);
        let p = Path::new("/x");
        assert_eq!(
            c.vm_settings("a", p, 1 << 30).host_tracking,
            HostTrackingMode::Off
        );
        assert_eq!(
            c.vm_settings("b", p, 1 << 30).host_tracking,
            HostTrackingMode::On
        );
        assert_eq!(
            Config::parse("").unwrap().host_tracking.mode,
            HostTrackingMode::Auto
        );
        for (text, field) in [
            ("[host_tracking]\nmode = \"sometimes\"", "mode"),
            ("[host_tracking]\nsample_us = 0", "host_tracking.sample_us"),
            (
                "[host_tracking]\nsample_us = 200000\naggr_us = 100000",
                "host_tracking.aggr_us",
            ),
            (
                "[host_tracking]\nmin_nr_regions = 500\nmax_nr_regions = 100",
                "host_tracking.max_nr_regions",
            ),
            (
                "[host_tracking]\nmax_frames_per_report = 0",
                "host_tracking.max_frames_per_report",
            ),
            (
                "[[vm]]\nname = \"a\"\nhost_tracking = \"yes\"",
                "host_tracking",
            ),
        ] {
            let e = Config::parse(text).unwrap_err().to_string();
            assert!(e.contains(field), "{text}: {e}");
        }
    }

    #[test]
    fn empty_file_is_all_defaults() {
        let c = Config::parse("").unwrap();
        assert_eq!(c, Config::default());
        assert_eq!(c.daemon.interval_ms, 1000);
    }

    #[test]
    fn example_config_in_packaging_parses() {
        let text = include_str!("../../../packaging/vtismd.toml");
        // As shipped (the package's /etc/vtism/vtismd.toml): the defaults, no example entries.
        let c = Config::parse(text).unwrap();
        assert!(c.vms.is_empty() && c.topology.node.is_empty());
        // Its commented-out examples (`#key`, no space) are valid too.
        let examples: String = text
            .lines()
            .map(|l| match l.strip_prefix('#') {
                Some(rest) if !rest.starts_with([' ', '#']) && !rest.is_empty() => rest,
                _ => l,
            })
            .map(|l| format!("{l}\n"))
            .collect();
        let c = Config::parse(&examples).unwrap();
        assert_eq!(c.vms.len(), 1);
        assert_eq!(c.topology.node.len(), 1);
    }

    #[test]
    fn errors_name_the_field() {
        let cases = [
            ("[daemon]\ninterval_ms = 0\n", "daemon.interval_ms"),
            ("[mover]\nbatch_pages = 0\n", "mover.batch_pages"),
            ("[mover]\ndemote_nice = 20\n", "mover.demote_nice"),
            ("[mover]\ndemote_nice = -1\n", "mover.demote_nice"),
            ("[engine]\ndecay = 2.0\n", "engine.decay"),
            (
                "[[vm]]\nname = \"a\"\nfast_quota_percent = 150\n",
                "vm[0].fast_quota_percent",
            ),
            ("[[vm]]\nname = \"a\"\n[[vm]]\nname = \"a\"\n", "vm[1].name"),
            ("[[topology.node]]\nid = 70\n", "topology.node[0].id"),
            (
                "[daemon]\nmetrics_listen = \"nope\"\n",
                "daemon.metrics_listen",
            ),
            (
                "[channel]\nentry_budget = 10\nmax_entries = 5\n",
                "channel.entry_budget",
            ),
        ];
        for (text, field) in cases {
            let e = Config::parse(text).unwrap_err();
            assert_eq!(e.field(), Some(field), "{text}: {e}");
            assert!(e.to_string().starts_with(field), "{e}");
        }
    }

    /// A VM without limits of its own gets the per-VM default, a quarter of the global limit:
    /// a guest flipping its hot set every round cannot take every round's moves.
    #[test]
    fn vms_have_a_move_limit_by_default() {
        let c = Config::default();
        let s = c.vm_settings("x", Path::new("/run/x.qmp"), 1 << 30);
        assert_eq!((s.promote_mbps, s.demote_mbps), (256, 256));
        assert_eq!(c.mover.promote_mbps, 4 * s.promote_mbps);
        let shipped = Config::parse(include_str!("../../../packaging/vtismd.toml")).unwrap();
        assert_eq!(shipped.mover, c.mover);
        assert!(!s.own_rates, "the defaults' burst follows the quota");
        let own = Config::parse("[[vm]]\nname = \"x\"\npromote_mbps = 0\n").unwrap();
        let s = own.vm_settings("x", Path::new("/r"), 1 << 30);
        assert_eq!((s.promote_mbps, s.own_rates), (0, true));
    }

    /// Every numeric field has an upper bound (issue 14: unbounded `max_entries`, `entry_budget`
    /// and retry delays were accepted), and one socket or channel file is one VM's.
    #[test]
    fn numbers_are_bounded_and_sockets_unique() {
        let cases = [
            ("[channel]\nmax_entries = 1000000000000\n", "channel.max_entries"),
            (
                "[channel]\nmax_entries = 1000000000000\nentry_budget = 1000000000000\n",
                "channel.max_entries",
            ),
            ("[channel]\nmin_interval_ms = 4000000\n", "channel.min_interval_ms"),
            ("[discovery]\nretry_backoff_ms = 99999999999\n", "discovery.retry_backoff_ms"),
            ("[discovery]\nqmp_timeout_ms = 600000\n", "discovery.qmp_timeout_ms"),
            ("[discovery]\nscan_interval_ms = 99999999999\n", "discovery.scan_interval_ms"),
            ("[mover]\nbusy_retry_delay_ms = 60000\n", "mover.busy_retry_delay_ms"),
            ("[mover]\npromote_mbps = 9223372036854775807\n", "mover.promote_mbps"),
            ("[mover]\nvm_demote_mbps = 2000000\n", "mover.vm_demote_mbps"),
            ("[mover]\nreconcile_sweep_s = 0\n", "mover.reconcile_sweep_s"),
            ("[mover]\nburst_s = 0\n", "mover.burst_s"),
            ("[mover]\nburst_s = 3601\n", "mover.burst_s"),
            ("[topology]\nmin_free_mib = 9223372036854775807\n", "topology.min_free_mib"),
            (
                "[topology]\nmin_free_mib = 64\nfree_watermark_mib = 65\n",
                "topology.free_watermark_mib",
            ),
            ("[pool]\nfast_mib = 9223372036854775807\n", "pool.fast_mib"),
            (
                "[[vm]]\nname = \"a\"\nfast_quota_mib = 9223372036854775807\n",
                "vm[0].fast_quota_mib",
            ),
            ("[[vm]]\nname = \"a\"\npromote_mbps = 5000000\n", "vm[0].promote_mbps"),
            (
                "[[vm]]\nqmp_socket = \"/run/a.qmp\"\n[[vm]]\nname = \"b\"\nqmp_socket = \"/run/a.qmp\"\n",
                "vm[1].qmp_socket",
            ),
            (
                "[[vm]]\nname = \"a\"\nchannel = \"/dev/shm/c\"\n[[vm]]\nname = \"b\"\nchannel = \"/dev/shm/c\"\n",
                "vm[1].channel",
            ),
        ];
        for (text, field) in cases {
            let e = Config::parse(text).unwrap_err();
            assert_eq!(e.field(), Some(field), "{text}: {e}");
            assert!(e.to_string().starts_with(field), "{e}");
        }
    }

    #[test]
    fn parse_errors_show_the_key() {
        let e = Config::parse("[mover]\nbatch_pagez = 3\n").unwrap_err();
        assert!(e.to_string().contains("batch_pagez"), "{e}");
        let e = Config::parse("[mover]\nbatch_pages = \"many\"\n").unwrap_err();
        assert!(e.to_string().contains("batch_pages"), "{e}");
        let e = Config::parse("[engine]\nbogus = 1\n").unwrap_err();
        assert!(e.to_string().contains("bogus"), "{e}");
    }

    #[test]
    fn quota_rules() {
        let c = Config::parse(
            "[defaults]\nfast_quota_percent = 50\n[[vm]]\nname = \"a\"\nfast_quota_mib = 64\n",
        )
        .unwrap();
        let ram = 256 << 20;
        assert_eq!(c.quota_for(c.vm_entry("a", Path::new("/x")), ram), 64 << 20);
        assert_eq!(c.quota_for(None, ram), 128 << 20);
        let big = Config::parse("[[vm]]\nname = \"a\"\nfast_quota_mib = 999999\n").unwrap();
        assert_eq!(big.quota_for(big.vms.first(), ram), ram);
    }

    #[test]
    fn pool_section_and_vm_limits_parse() {
        let c = Config::parse(
            r#"
[pool]
mode = "pool"
fast_mib = 96
rebalance_interval_ms = 1000
max_step_percent = 25
hysteresis_percent = 2
headroom_percent = 20
[defaults]
quota_min_percent = 50
[[vm]]
name = "a"
fast_quota_mib = 40
quota_max_mib = 60
shares = 300
[[vm]]
name = "b"
fast_quota_mib = 40
quota_min_mib = 10
quota_max_percent = 150
"#,
        )
        .unwrap();
        assert_eq!(c.pool.mode, PoolModeConfig::Pool);
        assert_eq!(c.pool.rebalance_interval_ms, 1000);
        let ram = 256 << 20;
        let a = c.limits_for(c.vm_entry("a", Path::new("/x")), ram);
        assert_eq!(
            a,
            QuotaLimits {
                share_bytes: 40 << 20,
                min_bytes: 20 << 20, // defaults.quota_min_percent of the share
                max_bytes: 60 << 20,
                shares: 300,
            }
        );
        let b = c.limits_for(c.vm_entry("b", Path::new("/x")), ram);
        assert_eq!(
            (b.min_bytes, b.max_bytes, b.shares),
            (10 << 20, 60 << 20, 40) // shares default to the share in MiB
        );
        // A VM without an entry: HMM-V's 75% / 125% of a share of 25% of its RAM, 4 KiB frames.
        let d = Config::default().limits_for(None, 100 << 20);
        assert_eq!(d.share_bytes, (25 << 20) & !4095);
        assert_eq!(d.min_bytes, ((25u64 << 20) * 3 / 4) & !4095);
        assert_eq!(d.max_bytes, ((25u64 << 20) * 5 / 4) & !4095);
        // The maximum never exceeds the VM's RAM, the minimum never exceeds the share.
        let e = Config::parse(
            "[[vm]]\nname = \"e\"\nfast_quota_percent = 90\nquota_max_percent = 400\nquota_min_mib = 500\n",
        )
        .unwrap();
        let l = e.limits_for(e.vms.first(), 64 << 20);
        assert_eq!(l.max_bytes, 64 << 20);
        assert_eq!(l.min_bytes, l.share_bytes);
        assert_eq!(Config::default().pool.mode, PoolModeConfig::Island);
    }

    #[test]
    fn pool_errors_name_the_field() {
        let cases = [
            ("[pool]\nmode = \"shared\"\n", "mode"),
            ("[pool]\nreserve_percent = 100\n", "pool.reserve_percent"),
            ("[pool]\nrebalance_interval_ms = 5\n", "pool.rebalance_interval_ms"),
            ("[pool]\nmax_step_percent = 0\n", "pool.max_step_percent"),
            ("[pool]\nhysteresis_percent = nan\n", "pool.hysteresis_percent"),
            ("[pool]\nheadroom_percent = -1\n", "pool.headroom_percent"),
            ("[defaults]\nquota_min_percent = 101\n", "defaults.quota_min_percent"),
            ("[defaults]\nquota_max_percent = 99\n", "defaults.quota_max_percent"),
            ("[[vm]]\nname = \"a\"\nshares = 0\n", "vm[0].shares"),
            (
                "[[vm]]\nname = \"a\"\nquota_min_mib = 1\nquota_min_percent = 50\n",
                "vm[0].quota_min_mib",
            ),
            (
                "[[vm]]\nname = \"a\"\nquota_max_mib = 1\nquota_max_percent = 150\n",
                "vm[0].quota_max_mib",
            ),
            (
                "[[vm]]\nname = \"a\"\nquota_min_mib = 8\nquota_max_mib = 4\n",
                "vm[0].quota_min_mib",
            ),
            (
                "[[vm]]\nname = \"a\"\nfast_quota_mib = 16\nquota_max_mib = 8\n",
                "vm[0].quota_max_mib",
            ),
            (
                "[[vm]]\nname = \"a\"\nfast_quota_mib = 16\nquota_min_mib = 32\n",
                "vm[0].quota_min_mib",
            ),
            (
                "[[vm]]\nname = \"a\"\nquota_max_percent = 50\n",
                "vm[0].quota_max_percent",
            ),
            (
                "[pool]\nmode = \"pool\"\nfast_mib = 32\n[[vm]]\nname = \"a\"\nfast_quota_mib = 32\n[[vm]]\nname = \"b\"\nquota_min_mib = 9\n",
                "pool.fast_mib",
            ),
        ];
        for (text, field) in cases {
            let e = Config::parse(text).unwrap_err();
            assert!(e.to_string().contains(field), "{text}: {e}");
            if field.contains('.') {
                assert_eq!(e.field(), Some(field), "{text}: {e}");
            }
        }
        // The same minimums fit a pool of 33 MiB (24 MiB = 75% of 32, plus 9).
        Config::parse(
            "[pool]\nmode = \"pool\"\nfast_mib = 33\n[[vm]]\nname = \"a\"\nfast_quota_mib = 32\n[[vm]]\nname = \"b\"\nquota_min_mib = 9\n",
        )
        .unwrap();
        // Island mode does not check minimums against the pool.
        Config::parse("[pool]\nfast_mib = 1\n[[vm]]\nname = \"a\"\nfast_quota_mib = 32\n").unwrap();
    }

    #[test]
    fn pool_size_from_the_fast_nodes() {
        let gib = 1u64 << 30;
        let c = Config::default();
        // 10% kept back, rounded down to frames.
        assert_eq!(
            c.pool_fast_bytes(2 * gib).unwrap(),
            (2 * gib * 9 / 10) & !4095
        );
        let c = Config::parse("[pool]\nreserve_percent = 0\n").unwrap();
        assert_eq!(c.pool_fast_bytes(2 * gib).unwrap(), 2 * gib);
        let c = Config::parse("[pool]\nfast_mib = 512\n").unwrap();
        assert_eq!(c.pool_fast_bytes(2 * gib).unwrap(), 512 << 20);
        let e = c.pool_fast_bytes(256 << 20).unwrap_err();
        assert_eq!(e.field(), Some("pool.fast_mib"), "{e}");
    }
}
