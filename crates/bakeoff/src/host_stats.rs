//! What the emulated host's kernel counts: /proc/vmstat's migration, promotion, demotion and
//! NUMA-balancing counters, and the CPU time of processes and kernel threads from /proc.

use std::collections::BTreeMap;

/// The vmstat counters the bake-off reports (pages or events).
pub const VMSTAT_KEYS: &[&str] = &[
    "pgmigrate_success",
    "pgmigrate_fail",
    "numa_pte_updates",
    "numa_hint_faults",
    "numa_hint_faults_local",
    "numa_pages_migrated",
    "pgpromote_success",
    "pgpromote_candidate",
    "pgdemote_kswapd",
    "pgdemote_direct",
    "pgdemote_khugepaged",
    "pgsteal_kswapd",
    "pgscan_kswapd",
];

pub type Counters = BTreeMap<String, u64>;

pub fn vmstat() -> Counters {
    let text = std::fs::read_to_string("/proc/vmstat").unwrap_or_default();
    parse_vmstat(&text)
}

fn parse_vmstat(text: &str) -> Counters {
    text.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            VMSTAT_KEYS
                .contains(&k)
                .then(|| (k.to_string(), v.trim().parse().unwrap_or(0)))
        })
        .collect()
}

/// `after - before` per counter (counters missing from one side count as 0).
pub fn delta(before: &Counters, after: &Counters) -> Counters {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v.saturating_sub(*before.get(k).unwrap_or(&0))))
        .collect()
}

/// User and system CPU seconds of a process (all its threads), from /proc/<pid>/stat.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CpuTime {
    pub user_s: f64,
    pub system_s: f64,
}

impl CpuTime {
    pub fn total(&self) -> f64 {
        self.user_s + self.system_s
    }
    pub fn minus(&self, o: &CpuTime) -> CpuTime {
        CpuTime {
            user_s: self.user_s - o.user_s,
            system_s: self.system_s - o.system_s,
        }
    }
}

pub fn cpu_time(pid: i32) -> Option<CpuTime> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&text)
}

fn ticks_per_s() -> f64 {
    // SAFETY: sysconf only reads a configuration value.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// Fields 14 and 15 (utime, stime) after the parenthesised command name, which may hold spaces.
fn parse_stat(text: &str) -> Option<CpuTime> {
    let rest = &text[text.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let hz = ticks_per_s();
    Some(CpuTime {
        user_s: f.get(11)?.parse::<f64>().ok()? / hz,
        system_s: f.get(12)?.parse::<f64>().ok()? / hz,
    })
}

/// Pids of the processes whose command name satisfies `want` (e.g. the kswapd threads).
pub fn pids_named(want: impl Fn(&str) -> bool) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut v: Vec<i32> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| want(c.trim_end()))
        })
        .collect();
    v.sort_unstable();
    v
}

/// The summed CPU time of the kswapd threads (the kernel's demotion runs in them).
pub fn kswapd_cpu() -> CpuTime {
    pids_named(|c| c.starts_with("kswapd"))
        .into_iter()
        .filter_map(cpu_time)
        .fold(CpuTime::default(), |a, b| CpuTime {
            user_s: a.user_s + b.user_s,
            system_s: a.system_s + b.system_s,
        })
}

pub fn write_sysctl(path: &str, value: &str) -> anyhow::Result<()> {
    std::fs::write(path, value).map_err(|e| anyhow::anyhow!("writing {value:?} to {path}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_vmstat_and_stat() {
        let v = parse_vmstat("nr_free_pages 5\npgmigrate_success 42\npgpromote_success 7\nx 1\n");
        assert_eq!(v.get("pgmigrate_success"), Some(&42));
        assert_eq!(v.get("pgpromote_success"), Some(&7));
        assert!(!v.contains_key("nr_free_pages"));
        let mut a = v.clone();
        a.insert("pgmigrate_success".into(), 50);
        assert_eq!(delta(&v, &a)["pgmigrate_success"], 8);
        let stat = "195 (qemu-system-x86 x) S 1 195 1 0 -1 4194560 100 0 0 0 1200 300 0 0 20 0 3 0 100 0 0";
        let c = parse_stat(stat).unwrap();
        let hz = ticks_per_s();
        assert!((c.user_s - 1200.0 / hz).abs() < 1e-9 && (c.system_s - 300.0 / hz).abs() < 1e-9);
        assert!(cpu_time(std::process::id() as i32).is_some());
        assert!(!pids_named(|c| c.starts_with("vtism_bakeoff")).is_empty());
    }
}
