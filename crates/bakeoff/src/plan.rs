//! What a bake-off runs: the managers, the workloads with their DRAM limit and ground truth, and
//! the plan of one emulated-host boot (one workload, every manager in turn) that the driver
//! writes as JSON for the conductor inside the emulated host.

use anyhow::bail;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Who manages the guest's placement in a run.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    clap::ValueEnum,
)]
#[serde(rename_all = "kebab-case")]
pub enum Manager {
    /// Nothing moves pages: the guest stays where it started (first touch, the baseline).
    None,
    /// Linux NUMA balancing, `kernel.numa_balancing=1` (AutoNUMA, the seed's baseline).
    Autonuma,
    /// Linux memory tiering, `kernel.numa_balancing=2` with `demotion_enabled` (TPP upstream).
    Tiering,
    /// DAMON-based tiering on the host: DAMOS migrate_hot / migrate_cold (the published recipe).
    Damon,
    /// vtismd with the `vtism_guest` module in the guest.
    VtismModule,
    /// vtismd with the DAMON agent (`vtism guest`) in the guest.
    VtismDamon,
}

/// Every manager, in the order a boot runs them: NUMA balancing last, so that hint PTEs it leaves
/// behind (cleared by the conductor's restore, see conduct.rs) could touch no other manager's run.
pub const ALL_MANAGERS: [Manager; 6] = [
    Manager::None,
    Manager::Damon,
    Manager::VtismModule,
    Manager::VtismDamon,
    Manager::Autonuma,
    Manager::Tiering,
];

impl Manager {
    pub fn name(self) -> &'static str {
        match self {
            Manager::None => "none",
            Manager::Autonuma => "autonuma",
            Manager::Tiering => "tiering",
            Manager::Damon => "damon",
            Manager::VtismModule => "vtism-module",
            Manager::VtismDamon => "vtism-damon",
        }
    }

    pub fn is_vtism(self) -> bool {
        matches!(self, Manager::VtismModule | Manager::VtismDamon)
    }

    /// Whether it moves pages at all (the promotion-speed experiment runs these).
    pub fn promotes(self) -> bool {
        self != Manager::None
    }
}

/// The workload's shape in the nested guest.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Shape {
    /// testbed/gups.c: `hot_mib` of `mib` take the updates but `uniform_share`, which is spread
    /// over the whole region; the hot set moves after `move_after_s` (0: never).
    Gups {
        mib: u64,
        hot_mib: u64,
        uniform_share: f64,
        move_after_s: u64,
    },
    /// Debian's redis-server under testbed/kvload.c: `keys` values of `value_bytes`, zipfian key
    /// popularity `theta` (keys scrambled over the key space), `write_share` SETs (YCSB-A: 0.5).
    Redis {
        keys: u64,
        value_bytes: u64,
        theta: f64,
        write_share: f64,
    },
}

/// Where the share of accesses served from DRAM comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum GroundTruth {
    /// The workload's own map of its hot and cold frames and its update rates.
    WorkloadMap,
    /// Per-frame access counts taken by a QEMU TCG plugin on the nested guest.
    TcgPlugin,
    /// None needed: the promotion-speed experiment measures bytes on DRAM over time.
    DramBytes,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Workload {
    pub name: String,
    pub about: String,
    pub shape: Shape,
    /// The DRAM every manager gets for the guest: vtism's quota, the kernel's free DRAM.
    pub dram_limit_mib: u64,
    /// Seconds each manager runs once the workload is ready.
    pub run_s: u64,
    pub truth: GroundTruth,
    pub managers: Vec<Manager>,
}

impl Workload {
    /// The guest RAM the workload needs (its footprint and the guest kernel beside it).
    pub fn guest_mib(&self) -> u64 {
        match self.shape {
            Shape::Gups { mib, .. } => (mib + 96).max(256),
            Shape::Redis { .. } => 384,
        }
    }

    pub fn validate(&self) -> anyhow::Result<()> {
        match self.shape {
            Shape::Gups {
                mib,
                hot_mib,
                uniform_share,
                move_after_s,
            } => {
                if hot_mib == 0 || hot_mib > mib {
                    bail!("{}: hot_mib must be in (0, mib]", self.name);
                }
                if !(0.0..1.0).contains(&uniform_share) {
                    bail!("{}: uniform_share must be in [0, 1)", self.name);
                }
                if move_after_s > 0 && (2 * hot_mib > mib || move_after_s >= self.run_s) {
                    bail!(
                        "{}: a moving hot set needs 2 * hot_mib <= mib and a move within the run",
                        self.name
                    );
                }
            }
            Shape::Redis {
                keys,
                value_bytes,
                theta,
                write_share,
            } => {
                if keys == 0
                    || value_bytes == 0
                    || theta.is_nan()
                    || theta <= 0.0
                    || !(0.0..=1.0).contains(&write_share)
                {
                    bail!(
                        "{}: keys, value_bytes and theta must be positive, write_share in [0, 1]",
                        self.name
                    );
                }
            }
        }
        if self.dram_limit_mib == 0 || self.run_s < 30 || self.managers.is_empty() {
            bail!(
                "{}: needs a DRAM limit, at least 30 s per run and a manager",
                self.name
            );
        }
        Ok(())
    }

    /// The workload's command for the guest's control channel.
    pub fn guest_command(&self) -> String {
        match &self.shape {
            Shape::Gups {
                mib,
                hot_mib,
                uniform_share,
                move_after_s,
            } => {
                let mut c = format!(
                    "gups --mib {mib} --hot-mib {hot_mib} --cold-period 0 --uniform-share {uniform_share}"
                );
                if *move_after_s > 0 {
                    c.push_str(&format!(" --move-after {move_after_s}"));
                }
                c
            }
            Shape::Redis {
                keys,
                value_bytes,
                theta,
                write_share,
            } => format!(
                "redis --keys {keys} --value-bytes {value_bytes} --theta {theta} --write-share {write_share}"
            ),
        }
    }
}

/// The guest's uniform share for the bake-off's GUPS: each cold page is touched about every 2 s
/// at the nested guest's measured rate (about 1.2 M updates/s, docs/bakeoff.md), which is "cold
/// pages touched every few seconds" in HeMem's shape.
pub const GUPS_UNIFORM_SHARE: f64 = 0.01;

/// The standard bake-off.
pub fn standard() -> Vec<Workload> {
    let gups = |move_after_s| Shape::Gups {
        mib: 96,
        hot_mib: 16,
        uniform_share: GUPS_UNIFORM_SHARE,
        move_after_s,
    };
    vec![
        Workload {
            name: "gups-hotset".into(),
            about: "GUPS, 96 MiB region, 16 MiB hot set, a share of the updates spread uniformly \
                    over the region (HeMem's shape)"
                .into(),
            shape: gups(0),
            dram_limit_mib: 20,
            run_s: 150,
            truth: GroundTruth::WorkloadMap,
            managers: ALL_MANAGERS.to_vec(),
        },
        Workload {
            name: "gups-move".into(),
            about: "the same GUPS, its hot set jumps to the middle of the region after 90 s".into(),
            shape: gups(90),
            dram_limit_mib: 20,
            run_s: 180,
            truth: GroundTruth::WorkloadMap,
            managers: ALL_MANAGERS.to_vec(),
        },
        Workload {
            name: "redis-zipf".into(),
            about: "Debian's redis-server, 100k keys of 512 B, zipfian 0.99 keys (scrambled), 50% \
                    SETs (YCSB-A)"
                .into(),
            shape: Shape::Redis {
                keys: 100_000,
                value_bytes: 512,
                theta: 0.99,
                write_share: 0.5,
            },
            dram_limit_mib: 20,
            run_s: 150,
            truth: GroundTruth::TcgPlugin,
            managers: ALL_MANAGERS.to_vec(),
        },
        Workload {
            name: "promote-speed".into(),
            about: "the seed's promotion-speed experiment: 128 MiB on both CXL nodes, all of it \
                    written continuously from node 0's CPU, DRAM for all of it"
                .into(),
            shape: Shape::Gups {
                mib: 128,
                hot_mib: 128,
                uniform_share: 0.0,
                move_after_s: 0,
            },
            dram_limit_mib: 160,
            run_s: 90,
            truth: GroundTruth::DramBytes,
            managers: ALL_MANAGERS
                .iter()
                .copied()
                .filter(|m| m.promotes())
                .collect(),
        },
    ]
}

/// The smoke version for `make test`: one workload, vtism and one kernel peer, shorter.
pub fn smoke() -> Vec<Workload> {
    let mut w = standard().remove(0);
    w.managers = vec![Manager::VtismModule, Manager::Tiering];
    w.run_s = 120;
    vec![w]
}

/// vtism's settings in the bake-off: the testbed's (docs/testbed.md), whose tracker intervals are
/// scaled for a scan inside TCG inside TCG.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VtismSettings {
    pub module_params: String,
    pub agent_args: String,
    pub daemon_interval_ms: u64,
}

impl Default for VtismSettings {
    fn default() -> Self {
        VtismSettings {
            module_params: "cpu_budget_bp=2000 interval_k=1 interval_kb=10 interval_base_ms=1000 interval_max_ms=3000"
                .into(),
            // The agent's own loop sets its intervals; only its CPU budget needs the module's
            // TCG scaling (the DAMON e2e runs it at 20% for the same reason).
            agent_args: "--cpu-budget-bp 2000".into(),
            daemon_interval_ms: 1000,
        }
    }
}

/// One boot of the emulated host: one workload, its managers in turn.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    pub workload: Workload,
    pub vtism: VtismSettings,
    /// The vtism binary (this machine's, over virtfs).
    pub bin: PathBuf,
    /// The nested guest's kernel (unpacked for PVH boot where it can be; testbed/prepare.sh).
    pub guest_kernel: PathBuf,
    pub guest_initrd: PathBuf,
    /// The TCG plugin, when the workload's ground truth needs it.
    pub plugin: Option<PathBuf>,
    pub sample_ms: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The trackers' settings are ones they take: the agent's arguments parse with its own
    /// command line, and every module parameter is one the module declares. (A refused argument
    /// ends the agent in the nested guest, where the run would only show a tracker that never
    /// published.)
    #[test]
    fn vtism_settings_name_real_options() {
        use clap::Parser;
        #[derive(Parser)]
        struct Agent {
            #[command(flatten)]
            guest: vtism_guest::cli::GuestArgs,
        }
        let s = VtismSettings::default();
        let args = std::iter::once("guest").chain(s.agent_args.split_whitespace());
        if let Err(e) = Agent::try_parse_from(args) {
            panic!("agent_args `{}`: {e}", s.agent_args);
        }
        let source = include_str!("../../../guest/module/vtism_main.c");
        for p in s.module_params.split_whitespace() {
            let name = p.split('=').next().unwrap();
            assert!(
                source.contains(&format!("VT_PARAM({name},"))
                    || source.contains(&format!("module_param_named({name},")),
                "module parameter {name} is not declared in vtism_main.c"
            );
        }
    }

    #[test]
    fn the_standard_bakeoff_is_valid() {
        for w in standard().iter().chain(smoke().iter()) {
            w.validate().unwrap();
            assert!(w.guest_mib() >= 256);
        }
        let s = standard();
        assert_eq!(
            s[1].guest_command(),
            "gups --mib 96 --hot-mib 16 --cold-period 0 --uniform-share 0.01 --move-after 90"
        );
        assert!(s[2].guest_command().starts_with("redis --keys 100000"));
        assert!(!s[3].managers.contains(&Manager::None));
        let smoke = smoke();
        assert_eq!(smoke.len(), 1);
        assert!(smoke[0].managers.iter().any(|m| m.is_vtism()));
        assert!(smoke[0].managers.iter().any(|m| !m.is_vtism()));
    }

    #[test]
    fn bad_workloads_are_refused() {
        let mut w = standard().remove(1);
        w.run_s = 80;
        assert!(w
            .validate()
            .unwrap_err()
            .to_string()
            .contains("moving hot set"));
        let mut w = standard().remove(0);
        w.shape = Shape::Gups {
            mib: 8,
            hot_mib: 16,
            uniform_share: 0.0,
            move_after_s: 0,
        };
        assert!(w.validate().is_err());
    }
}
