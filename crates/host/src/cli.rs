//! `vtism host` (the vtismd daemon) and `vtism ctl` (its control client).

use crate::config::{Config, LogFormat};
use crate::daemon::Daemon;
use crate::serve::ctl_request;
use crate::topology::HostTopology;
use anyhow::Context;
use clap::{Args, Subcommand};
use std::path::PathBuf;

/// Options of `vtism host`.
#[derive(Args, Debug)]
pub struct HostArgs {
    /// Configuration file (TOML). A missing default file means all defaults.
    #[arg(long, short, default_value = "/etc/vtism/vtismd.toml")]
    pub config: PathBuf,
    /// Validate the configuration (and read the topology) and exit.
    #[arg(long)]
    pub check_config: bool,
    /// Print the NUMA topology as vtismd sees it (JSON) and exit.
    #[arg(long)]
    pub print_topology: bool,
    /// Take back what a vtismd that was killed left behind (its host kdamond, if still the one
    /// it recorded) and exit: the unit's ExecStopPost. A vtismd that stopped cleanly left
    /// nothing, and this does nothing.
    #[arg(long)]
    pub clean_up: bool,
}

/// Options of `vtism ctl`.
#[derive(Args, Debug)]
pub struct CtlArgs {
    /// The daemon's control socket.
    #[arg(long, default_value = "/run/vtism/vtismd.sock")]
    pub socket: PathBuf,
    #[command(subcommand)]
    pub command: CtlCommand,
}

#[derive(Subcommand, Debug)]
pub enum CtlCommand {
    /// A table per VM: quota, fast/slow bytes, hot set, last round.
    Status {
        /// The daemon's full status as JSON.
        #[arg(long)]
        json: bool,
    },
    /// The NUMA nodes as the daemon sees them.
    Nodes,
    /// Re-read the configuration file (same as SIGHUP, but reports errors).
    Reload,
    /// The Prometheus metrics text.
    Metrics,
}

fn load_config(args: &HostArgs) -> anyhow::Result<(Config, Option<PathBuf>)> {
    if !args.config.exists()
        && args.config.as_path() == std::path::Path::new("/etc/vtism/vtismd.toml")
    {
        return Ok((Config::default(), None));
    }
    let cfg = Config::load(&args.config)?;
    Ok((cfg, Some(args.config.clone())))
}

fn init_logging(cfg: &Config) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(&cfg.daemon.log_level))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colours only on a terminal: a log file or the journal gets plain `key=value` fields.
    let b = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    let _ = match cfg.daemon.log_format {
        LogFormat::Json => b.json().try_init(),
        LogFormat::Text => b.try_init(),
    };
}

pub fn host_main(args: HostArgs) -> anyhow::Result<()> {
    let (cfg, path) = load_config(&args)?;
    if args.check_config || args.print_topology {
        let topo = HostTopology::read(&cfg.daemon.sysfs_root, &cfg.topology).context("topology")?;
        let fast = topo.fast_capacity_bytes();
        let pool = cfg.pool_fast_bytes(fast)?;
        if args.print_topology {
            println!("{}", serde_json::to_string_pretty(&topo)?);
        } else {
            for w in cfg.warnings() {
                println!("warning: {w}");
            }
            println!(
                "configuration OK: {} node(s) ({} fast), {} [[vm]] entr{}; {}",
                topo.nodes.len(),
                topo.fast_nodes().len(),
                cfg.vms.len(),
                if cfg.vms.len() == 1 { "y" } else { "ies" },
                match cfg.pool.mode {
                    crate::config::PoolModeConfig::Island =>
                        "island mode (fixed quotas)".to_string(),
                    crate::config::PoolModeConfig::Pool => format!(
                        "pool mode, {} MiB of the fast nodes' {} MiB shared",
                        pool >> 20,
                        fast >> 20
                    ),
                }
            );
        }
        return Ok(());
    }
    init_logging(&cfg);
    if args.clean_up {
        let record = crate::host_tracking::record_path(&cfg.daemon.control_socket);
        crate::host_tracking::reclaim_left_behind(&cfg.host_tracking, &record);
        return Ok(());
    }
    for w in cfg.warnings() {
        tracing::warn!("configuration: {w}");
    }
    crate::sys::signals::install();
    let mut d = Daemon::new(cfg, path)?;
    d.run()
}

/// What backs a VM's guest RAM, when it is more than base pages: hugetlbfs, or THPs (and
/// whether vtismd knows which blocks they are).
fn backing_line(b: &serde_json::Value, problem: &serde_json::Value) -> Option<String> {
    if let Some(p) = problem.as_str() {
        return Some(format!("  backing: not known: {p}\n"));
    }
    let n = |k: &str| b[k].as_u64().unwrap_or(0);
    let mut parts = Vec::new();
    if n("hugetlb_bytes") > 0 {
        parts.push(format!(
            "hugetlbfs {} in {} pages",
            human(n("hugetlb_bytes")),
            human(n("hugetlb_page_bytes"))
        ));
    }
    if n("thp_bytes") > 0 {
        parts.push(match b["blocks_known"].as_bool() {
            Some(true) => format!(
                "THP {} ({} blocks of 2 MiB mapped huge)",
                human(n("thp_bytes")),
                n("huge_blocks")
            ),
            _ => format!(
                "THP {} (which blocks: not known, a kernel without PAGEMAP_SCAN)",
                human(n("thp_bytes"))
            ),
        });
    }
    if n("folio_blocks") > 0 {
        parts.push(format!("{} blocks placed whole", n("folio_blocks")));
    }
    if n("folio_splits") > 0 {
        parts.push(format!(
            "{} split ({} collapsed again)",
            n("folio_splits"),
            n("folio_recollapses")
        ));
    }
    if n("unmovable_bytes") > 0 {
        parts.push(format!(
            "{} not moved (hugetlbfs pages over 2 MiB)",
            human(n("unmovable_bytes"))
        ));
    }
    (!parts.is_empty()).then(|| format!("  backing: {}\n", parts.join(", ")))
}

fn human(b: u64) -> String {
    const U: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i < U.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{b}B")
    } else {
        format!("{v:.1}{}", U[i])
    }
}

/// Renders the status JSON as the `vtism ctl status` table.
pub fn status_table(v: &serde_json::Value) -> String {
    let mut out = String::new();
    let d = &v["daemon"];
    let p = &v["pool"];
    let pool = match (p["mode"].as_str(), p["fast_bytes"].as_u64()) {
        (Some("pool"), Some(b)) => format!(
            "  pool {} ({} allocated)",
            human(b),
            human(p["allocated_bytes"].as_u64().unwrap_or(0))
        ),
        (Some(m), _) => format!("  {m} mode"),
        _ => String::new(),
    };
    out.push_str(&format!(
        "vtismd pid {}  up {:.0}s  rounds {}  plans {}  cpu {:.2}s  vms {}{pool}\n",
        d["pid"],
        d["uptime_s"].as_f64().unwrap_or(0.0),
        d["rounds"],
        d["plans"],
        d["cpu_seconds"].as_f64().unwrap_or(0.0),
        v["vms"].as_array().map_or(0, Vec::len),
    ));
    out.push_str(&format!(
        "{:<16} {:>7} {:>10} {:>10} {:>10} {:>10} {:>10} {:>9} {:>8} {:>9}\n",
        "VM", "PID", "RAM", "QUOTA", "FAST", "SLOW", "HOT SET", "ROUND", "AGE", "REJECTED"
    ));
    for vm in v["vms"].as_array().into_iter().flatten() {
        let b = |k: &str| human(vm[k].as_u64().unwrap_or(0));
        let age = vm["last_round_age_s"]
            .as_f64()
            .map_or("-".to_string(), |a| format!("{a:.1}s"));
        out.push_str(&format!(
            "{:<16} {:>7} {:>10} {:>10} {:>10} {:>10} {:>10} {:>9} {:>8} {:>9}\n",
            vm["name"].as_str().unwrap_or("?"),
            vm["pid"].to_string(),
            b("ram_bytes"),
            b("quota_bytes"),
            b("fast_bytes"),
            b("slow_bytes"),
            b("hot_set_bytes"),
            vm["last_round"].to_string(),
            age,
            vm["rounds_rejected"].to_string(),
        ));
        if let Some(p) = vm["channel_problem"].as_str() {
            out.push_str(&format!("  channel: {p}\n"));
        } else if vm["channel_verified"].as_bool() == Some(false) {
            if let Some(p) = vm["channel"].as_str() {
                out.push_str(&format!(
                    "  channel: {p}: no valid channel header yet (nothing written to it)\n"
                ));
            }
        }
        let h = &vm["host_tracking"];
        if let Some(p) = h["problem"].as_str() {
            out.push_str(&format!("  host tracking: not tracked: {p}\n"));
        } else if !h.is_null() {
            out.push_str(&format!(
                "  host tracking: {} DAMON reports, {} frames observed\n",
                h["observations"], h["frames"]
            ));
        }
        if vm["no_signal"].as_bool() == Some(true) {
            out.push_str("  no signal yet (no hints, no host tracking): its pages are not moved\n");
        }
        if let Some(line) = backing_line(&vm["backing"], &vm["backing_problem"]) {
            out.push_str(&line);
        }
    }
    let k = &d["host_kdamond"];
    if let Some(state) = k["state"].as_str().filter(|s| *s != "idle") {
        out.push_str(&format!(
            "host kdamond: {state}{}{}\n",
            k["kdamond_pid"]
                .as_u64()
                .map_or(String::new(), |p| format!(" (pid {p})")),
            k["reason"]
                .as_str()
                .map_or(String::new(), |r| format!(": {r}"))
        ));
    }
    let kt = &d["kernel_tiering"];
    if let Some(mode) = kt["numa_balancing"].as_u64().filter(|&m| m != 0) {
        out.push_str(&format!(
            "kernel NUMA balancing: on (kernel.numa_balancing={mode}): it moves guest pages too, \
             against vtismd's placement; set it to 0\n"
        ));
    }
    let vms: Vec<&serde_json::Value> = v["vms"].as_array().into_iter().flatten().collect();
    if vms.iter().any(|vm| !vm["quota_min_bytes"].is_null()) {
        out.push_str(&format!(
            "{:<16} {:>10} {:>10} {:>10} {:>7} {:>10}  LAST QUOTA CHANGE\n",
            "VM", "QUOTA", "MIN", "MAX", "SHARES", "HOT SET"
        ));
        for vm in vms {
            let b = |k: &str| vm[k].as_u64().map_or_else(|| "-".to_string(), human);
            out.push_str(&format!(
                "{:<16} {:>10} {:>10} {:>10} {:>7} {:>10}  {}\n",
                vm["name"].as_str().unwrap_or("?"),
                b("quota_bytes"),
                b("quota_min_bytes"),
                b("quota_max_bytes"),
                vm["shares"].to_string(),
                b("hot_set_bytes"),
                quota_change(&vm["last_quota_change"]),
            ));
        }
    }
    out
}

/// `grow 24.0MiB -> 30.0MiB 3.2s ago (hot set 32.0MiB)`, or `-`.
fn quota_change(c: &serde_json::Value) -> String {
    let Some(reason) = c["reason"].as_str() else {
        return "-".into();
    };
    let b = |k: &str| human(c[k].as_u64().unwrap_or(0));
    format!(
        "{reason} {} -> {} {:.1}s ago (hot set {})",
        b("from_bytes"),
        b("to_bytes"),
        c["age_s"].as_f64().unwrap_or(0.0),
        b("hot_set_bytes")
    )
}

pub fn ctl_main(args: CtlArgs) -> anyhow::Result<()> {
    match args.command {
        CtlCommand::Status { json } => {
            let v = ctl_request(&args.socket, "status")?;
            if json {
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                print!("{}", status_table(&v));
            }
        }
        CtlCommand::Nodes => {
            let v = ctl_request(&args.socket, "status")?;
            println!(
                "{:<5} {:>5} {:>7} {:>12} {:>12} {:>12}  CPUS",
                "NODE", "TIER", "SOCKET", "TOTAL", "FREE", "VM RESIDENT"
            );
            for n in v["nodes"].as_array().into_iter().flatten() {
                let cpus = n["cpus"].as_array().map_or(0, Vec::len);
                println!(
                    "{:<5} {:>5} {:>7} {:>12} {:>12} {:>12}  {}",
                    n["id"],
                    n["tier"],
                    n["socket"],
                    human(n["mem_total_bytes"].as_u64().unwrap_or(0)),
                    human(n["free_bytes"].as_u64().unwrap_or(0)),
                    human(n["vm_resident_bytes"].as_u64().unwrap_or(0)),
                    if cpus == 0 {
                        "none".to_string()
                    } else {
                        cpus.to_string()
                    }
                );
            }
        }
        CtlCommand::Reload => {
            ctl_request(&args.socket, "reload")?;
            println!("reloaded");
        }
        CtlCommand::Metrics => {
            let v = ctl_request(&args.socket, "metrics")?;
            print!("{}", v["metrics"].as_str().unwrap_or(""));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_renders_rows() {
        let v = serde_json::json!({
            "daemon": {"pid": 7, "uptime_s": 3.0, "rounds": 5, "plans": 2, "cpu_seconds": 0.5},
            "vms": [{"name": "web1", "pid": 99, "ram_bytes": 268435456u64, "quota_bytes": 67108864,
                     "fast_bytes": 16777216, "slow_bytes": 251658240u64, "hot_set_bytes": 16777216,
                     "last_round": 12, "last_round_age_s": 0.4, "rounds_rejected": 0,
                     "channel_problem": null}]
        });
        let t = status_table(&v);
        assert!(t.contains("web1"));
        assert!(
            t.contains("256.0MiB") && t.contains("64.0MiB") && t.contains("16.0MiB"),
            "{t}"
        );
        assert!(t.lines().count() == 3);
        // Numbers from the JSON are right-aligned like the rest (a JSON value ignores widths).
        let (head, row) = (t.lines().nth(1).unwrap(), t.lines().nth(2).unwrap());
        let pid_end = head.find("PID").unwrap() + 3;
        assert_eq!(&row[pid_end - 2..pid_end], "99", "{t}");
        assert_eq!(head.len(), row.len(), "{t}");
    }

    #[test]
    fn table_shows_quota_limits_and_why_it_changed() {
        let v = serde_json::json!({
            "daemon": {"pid": 7, "uptime_s": 3.0, "rounds": 5, "plans": 2, "cpu_seconds": 0.5},
            "pool": {"mode": "pool", "fast_bytes": 50331648u64, "allocated_bytes": 50331648u64},
            "vms": [{"name": "p1", "pid": 99, "ram_bytes": 67108864u64, "quota_bytes": 31457280u64,
                     "quota_min_bytes": 18874368u64, "quota_max_bytes": 31457280u64, "shares": 24,
                     "hot_set_bytes": 33554432u64, "fast_bytes": 0, "slow_bytes": 0,
                     "last_round": 3, "last_round_age_s": 0.1, "rounds_rejected": 0,
                     "last_quota_change": {"from_bytes": 25165824u64, "to_bytes": 31457280u64,
                        "hot_set_bytes": 33554432u64, "reason": "grow", "age_s": 3.25}},
                    {"name": "p2", "pid": 98, "ram_bytes": 67108864u64, "quota_bytes": 18874368u64,
                     "quota_min_bytes": 18874368u64, "quota_max_bytes": 31457280u64, "shares": 24,
                     "hot_set_bytes": 0, "last_quota_change": null}]
        });
        let t = status_table(&v);
        assert!(
            t.lines()
                .next()
                .unwrap()
                .ends_with("pool 48.0MiB (48.0MiB allocated)"),
            "{t}"
        );
        let p1 = t
            .lines()
            .filter(|l| l.starts_with("p1 "))
            .nth(1)
            .expect("quota row");
        assert!(
            p1.contains("30.0MiB") && p1.contains("18.0MiB") && p1.contains(" 24 "),
            "{p1}"
        );
        assert!(
            p1.ends_with("grow 24.0MiB -> 30.0MiB 3.2s ago (hot set 32.0MiB)"),
            "{p1}"
        );
        let p2 = t
            .lines()
            .filter(|l| l.starts_with("p2 "))
            .nth(1)
            .expect("quota row");
        assert!(p2.ends_with(" -"), "{p2}");
        // Without pool data (an older daemon) there is no quota table.
        let old = serde_json::json!({"daemon": {}, "vms": [{"name": "a"}]});
        assert!(!status_table(&old).contains("LAST QUOTA CHANGE"));
    }
}
