//! CPU time of the tracker: the kdamond thread's and the agent's own.

use std::path::Path;

/// CPU time a thread has run, ns: `/proc/<pid>/schedstat` (ns, the scheduler's own count), else
/// user + system time from `/proc/<pid>/stat` (clock ticks).
pub fn thread_cpu_ns(proc_root: &Path, pid: u32) -> Option<u64> {
    let dir = proc_root.join(pid.to_string());
    if let Some(ns) = std::fs::read_to_string(dir.join("schedstat"))
        .ok()
        .and_then(|s| parse_schedstat(&s))
    {
        return Some(ns);
    }
    let stat = std::fs::read_to_string(dir.join("stat")).ok()?;
    // SAFETY: sysconf has no memory-safety preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    parse_stat_ticks(&stat).map(|t| t * 1_000_000_000 / if hz > 0 { hz as u64 } else { 100 })
}

/// The first field of `schedstat`: time on the CPU, ns.
pub fn parse_schedstat(s: &str) -> Option<u64> {
    s.split_whitespace().next()?.parse().ok()
}

/// utime + stime (fields 14 and 15) of a `stat` line, in clock ticks.
pub fn parse_stat_ticks(s: &str) -> Option<u64> {
    // the command name may hold spaces and parentheses: fields start after the last ')'
    let rest = s.get(s.rfind(')')? + 2..)?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

/// CPU time of this process (all its threads), ns.
pub fn own_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer; the clock id is a constant the kernel knows.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// CLOCK_MONOTONIC, ns.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_files() {
        assert_eq!(parse_schedstat("123456789 2000 17\n"), Some(123_456_789));
        assert_eq!(parse_schedstat(""), None);
        // kdamond's stat line (6.12), utime 3 and stime 4512
        let stat = "812 (kdamond.0) S 2 0 0 0 -1 2129984 0 0 0 0 3 4512 0 0 20 0 1 0 \
                    1543 0 0 18446744073709551615 0 0 0 0 0 0 0 2147483647 0 0 0 0 17 1 0 0";
        assert_eq!(parse_stat_ticks(stat), Some(4515));
        assert_eq!(
            parse_stat_ticks("1 (a) b) S 0 0 0 0 0 0 0 0 0 0 5 6"),
            Some(11)
        );
        assert_eq!(parse_stat_ticks("garbage"), None);
    }

    #[test]
    fn reads_a_fake_proc() {
        let d = crate::testdir::TestDir::new("cpu");
        d.write("42/schedstat", "5000 1 1\n");
        assert_eq!(thread_cpu_ns(d.path(), 42), Some(5000));
        d.write(
            "43/stat",
            "43 (x) S 2 0 0 0 -1 0 0 0 0 0 100 100 0 0 20 0 1 0",
        );
        assert!(thread_cpu_ns(d.path(), 43).unwrap() > 0);
        assert_eq!(thread_cpu_ns(d.path(), 44), None);
        let a = own_cpu_ns();
        let mut x = 0u64;
        for i in 0..200_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        assert!(x != 1 && own_cpu_ns() >= a);
    }
}
