//! vtismd's configuration: one TOML file, every field optional with a documented default
//! (docs/host.md has the reference). Unknown fields are errors; every error names its field.

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use thiserror::Error;
use vtism_engine::EngineParams;

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub daemon: DaemonConfig,
    pub discovery: DiscoveryConfig,
    pub channel: ChannelConfig,
    pub mover: MoverConfig,
    pub topology: TopologyConfig,
    pub defaults: VmDefaults,
    #[serde(rename = "vm")]
    pub vms: Vec<VmConfig>,
    pub engine: EngineParams,
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
            interval_ms: 1000,
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
            qmp_timeout_ms: 3000,
            retry_backoff_ms: 10000,
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

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MoverConfig {
    /// Pages per move_pages(2) call.
    pub batch_pages: usize,
    /// Global rate limits in MB/s (10^6 bytes) per direction; 0 = unlimited.
    pub promote_mbps: u64,
    pub demote_mbps: u64,
    /// Per-VM rate limits in MB/s; 0 = unlimited.
    pub vm_promote_mbps: u64,
    pub vm_demote_mbps: u64,
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
}

impl Default for MoverConfig {
    fn default() -> Self {
        MoverConfig {
            batch_pages: 4096,
            promote_mbps: 1024,
            demote_mbps: 1024,
            vm_promote_mbps: 0,
            vm_demote_mbps: 0,
            busy_retries: 2,
            busy_retry_delay_ms: 5,
            move_all: false,
            madvise_cold: false,
            reconcile_sweep_s: 60,
            reconcile_max_pages_per_round: 262_144,
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
}

impl Default for VmDefaults {
    fn default() -> Self {
        VmDefaults {
            fast_quota_percent: 25.0,
            manage_discovered: true,
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct VmConfig {
    /// Matched against QEMU's `-name` (QMP query-name); also the VM's label.
    pub name: String,
    /// QMP socket; optional when discovery finds it.
    pub qmp_socket: Option<PathBuf>,
    /// Channel file; default: the ivshmem backend's `mem-path`.
    pub channel: Option<PathBuf>,
    pub fast_quota_mib: Option<u64>,
    pub fast_quota_percent: Option<f64>,
    /// NUMA node of the VM's vCPUs; default: from the vCPU threads' affinity.
    pub home_node: Option<u8>,
    /// Per-VM rate limits in MB/s, overriding mover.vm_*_mbps.
    pub promote_mbps: Option<u64>,
    pub demote_mbps: Option<u64>,
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
        for (f, v, lo) in [
            ("discovery.scan_interval_ms", s.scan_interval_ms, 100),
            ("discovery.refresh_interval_ms", s.refresh_interval_ms, 100),
            ("discovery.qmp_timeout_ms", s.qmp_timeout_ms, 50),
        ] {
            if v < lo {
                return Err(invalid(f, format!("must be at least {lo}")));
            }
        }
        let c = &self.channel;
        if c.max_entries == 0 {
            return Err(invalid("channel.max_entries", "must be at least 1"));
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
        let m = &self.mover;
        if !(1..=1 << 20).contains(&m.batch_pages) {
            return Err(invalid(
                "mover.batch_pages",
                "must be between 1 and 1048576",
            ));
        }
        if m.busy_retries > 100 {
            return Err(invalid("mover.busy_retries", "must be at most 100"));
        }
        if m.reconcile_sweep_s == 0 {
            return Err(invalid("mover.reconcile_sweep_s", "must be at least 1"));
        }
        if m.reconcile_max_pages_per_round == 0 {
            return Err(invalid(
                "mover.reconcile_max_pages_per_round",
                "must be at least 1",
            ));
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
        let mut names = std::collections::BTreeSet::new();
        for (i, v) in self.vms.iter().enumerate() {
            if v.name.is_empty() && v.qmp_socket.is_none() {
                return Err(invalid(
                    format!("vm[{i}].name"),
                    "a [[vm]] needs a name or a qmp_socket",
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
        }
        self.engine
            .validate()
            .map_err(|e| invalid(format!("engine.{}", e.field), e.problem))?;
        Ok(())
    }

    /// The [[vm]] entry for a VM, by name or by socket.
    pub fn vm_entry(&self, name: &str, socket: &Path) -> Option<&VmConfig> {
        self.vms
            .iter()
            .find(|v| !v.name.is_empty() && v.name == name)
            .or_else(|| {
                self.vms
                    .iter()
                    .find(|v| v.qmp_socket.as_deref() == Some(socket))
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

fn check_percent(field: &str, p: f64) -> Result<(), ConfigError> {
    if !(0.0..=100.0).contains(&p) {
        return Err(invalid(field, "must be between 0 and 100"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_file_is_all_defaults() {
        let c = Config::parse("").unwrap();
        assert_eq!(c, Config::default());
        assert_eq!(c.daemon.interval_ms, 1000);
    }

    #[test]
    fn example_config_in_packaging_parses() {
        let text = include_str!("../../../packaging/vtismd.toml");
        let c = Config::parse(text).unwrap();
        assert!(!c.vms.is_empty());
    }

    #[test]
    fn errors_name_the_field() {
        let cases = [
            ("[daemon]\ninterval_ms = 0\n", "daemon.interval_ms"),
            ("[mover]\nbatch_pages = 0\n", "mover.batch_pages"),
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
}
