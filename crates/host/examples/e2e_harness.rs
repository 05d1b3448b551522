//! Test harness for vtismd's end-to-end test (tests/host-e2e/run.sh) and benchmarks. It plays
//! the guest (writes channel files with vtism-proto's ChannelWriter, or hostile bytes), checks
//! page placement independently of the daemon (move_pages queries on the QEMU process), and
//! captures QMP fixtures.
//!
//!   e2e-harness capture  <qmp-socket> <out-file>
//!   e2e-harness publish  <channel> <gfn-spec> <interval-ms> [<seconds>]
//!   e2e-harness hostile  <channel> <seconds> <ram-frames>
//!   e2e-harness wait     <qmp-socket> <channel> <hot-spec> <fast-node> <slow-node> <quota-mib> <timeout-s> [hot-only] [max-rounds=N] [max-round=N] [min-secs=N]
//!                        max-rounds bounds the guest rounds from the check's start, max-round the
//!                        guest's round number (rounds since its publisher started); min-secs fails
//!                        a convergence faster than a rate limit allows
//!   e2e-harness quota    <qmp-socket> <fast-nodes> <quota-mib> <seconds>
//!   e2e-harness placement <qmp-socket>
//!   e2e-harness fast     <qmp-socket> <fast-nodes> <min-mib> <max-mib> <timeout-s> [forbid=<node>]
//!                        waits until the VM has at least min-mib on the fast nodes; fails at once
//!                        if a sample shows more than max-mib there, or any page on `forbid`
//!   e2e-harness hot      <qmp-socket> <gfn-spec> <fast-nodes> <min-percent> <max-mib> <timeout-s>
//!                        waits until at least min-percent of the spec's frames are on the fast
//!                        nodes; fails at once if a sample shows more than max-mib there (0: no
//!                        bound; the most seen is printed)
//!   e2e-harness still    <qmp-socket> <seconds>
//!                        fails if the VM's pages per node change over <seconds>
//!   e2e-harness quotas   <ctl-socket> <seconds> <total-mib> <vm>=<lo-mib>:<hi-mib>... [until=<file>]
//!                        samples `vtism ctl status`: every listed VM's quota within [lo, hi] and
//!                        the quotas' sum within total at every sample, for <seconds> or until
//!                        <file> exists
//!   e2e-harness hog      <node> <keep-free-mib> [once]
//!                        allocates (and touches) memory on <node> until the node's free memory is
//!                        below keep-free-mib or the kernel places no more there, and keeps it so
//!                        for as long as it runs (with `once`: holds what it took, takes no more)
//!   e2e-harness bench    <mib> <from-node> <to-node> <batch,batch,...>
//!   e2e-harness get      <host:port> <path>
//!
//! gfn-spec: `start+count[,start+count...]` in hex or decimal frames.

use std::io::{Read, Write};
use std::path::Path;
use std::time::{Duration, Instant};
use vtism_host::channel_file::ChannelFile;
use vtism_host::qmp::Qmp;
use vtism_host::sys;
use vtism_proto::layout::off;
use vtism_proto::{
    read_feedback, ChannelVersion, ChannelWriter, Gfn, HintEntry, Hva, PageType, RoundMeta,
    SharedRegion, Tracker, WriterConfig,
};

type R<T> = Result<T, Box<dyn std::error::Error>>;

fn num(s: &str) -> R<u64> {
    Ok(match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16)?,
        None => s.parse()?,
    })
}

fn spans(spec: &str) -> R<Vec<(u64, u64)>> {
    spec.split(',')
        .filter(|s| !s.is_empty())
        .map(|p| {
            let (a, n) = p.split_once('+').ok_or("span is start+count")?;
            Ok((num(a)?, num(n)?))
        })
        .collect()
}

fn in_spans(spans: &[(u64, u64)], g: u64) -> bool {
    spans.iter().any(|&(a, n)| g >= a && g < a + n)
}

fn connect(sock: &str) -> R<Qmp> {
    Ok(Qmp::connect(Path::new(sock), Duration::from_secs(20))?)
}

/// Node of every guest frame: (gfn, status) over the whole RAM.
fn placement(q: &mut Qmp) -> R<(i32, Vec<(u64, i32)>)> {
    let info = vtism_host::vm::inspect(q)?;
    let mut out = Vec::new();
    for r in &info.memory.ranges {
        let gfns: Vec<u64> = (r.gfns.start.0..r.gfns.end.0).collect();
        for chunk in gfns.chunks(65536) {
            let addrs: Vec<Hva> = chunk
                .iter()
                .map(|&g| info.memory.hva(Gfn(g)).unwrap_or_default())
                .collect();
            let mut st = vec![0i32; addrs.len()];
            sys::move_pages(info.pid, &addrs, None, &mut st, 0)?;
            out.extend(chunk.iter().copied().zip(st));
        }
    }
    Ok((info.pid, out))
}

fn open_channel(path: &str) -> R<(ChannelFile, vtism_proto::MmapRegion)> {
    let m = ChannelFile::open(Path::new(path), 1 << 30, None)?;
    let r = m.region();
    Ok((m, r))
}

fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

fn publish(chan: &str, spec: &str, interval_ms: u64, seconds: Option<u64>) -> R<()> {
    let (_m, region) = open_channel(chan)?;
    // Counts of 8 are "seen in 8 rounds": a v1.0 guest.
    let cfg = WriterConfig {
        tracker: Tracker::Harness,
        version: ChannelVersion::V1_0,
        ..WriterConfig::default()
    };
    let mut w = ChannelWriter::init_with(region, cfg)?;
    let sp = spans(spec)?;
    let entries: Vec<HintEntry> = sp
        .iter()
        .flat_map(|&(a, n)| a..a + n)
        .map(|g| HintEntry::new(Gfn(g), 8, g % 3 == 0, PageType::Anon, false, true))
        .collect();
    let end = seconds.map(|s| Instant::now() + Duration::from_secs(s));
    let spec_file = format!("{chan}.spec");
    let mut current = spec.to_string();
    let mut entries = entries;
    loop {
        // The hot set can be changed while running: write a new spec into <channel>.spec.
        if let Ok(s) = std::fs::read_to_string(&spec_file) {
            let s = s.trim().to_string();
            if !s.is_empty() && s != current {
                if let Ok(sp) = spans(&s) {
                    entries = sp
                        .iter()
                        .flat_map(|&(a, n)| a..a + n)
                        .map(|g| HintEntry::new(Gfn(g), 8, false, PageType::Anon, false, true))
                        .collect();
                    current = s;
                }
            }
        }
        let p = w.publish(
            &entries,
            &RoundMeta {
                overflow: false,
                scan_interval_ms: interval_ms as u32,
                scan_duration_us: 100,
                tracked_bytes: entries.len() as u64 * 4096,
                hot_frames: entries.len() as u64,
                publish_time_ns: now_ns(),
                ..RoundMeta::default()
            },
        )?;
        if p.round % 10 == 1 {
            eprintln!("publish: round {} entries {}", p.round, p.count);
        }
        if end.is_some_and(|e| Instant::now() >= e) {
            return Ok(());
        }
        let wait = w.next_interval_ms(interval_ms as u32);
        std::thread::sleep(Duration::from_millis(wait as u64));
    }
}

/// A hostile guest: cycles through every kind of bad round, forever or for `seconds`.
fn hostile(chan: &str, seconds: u64, ram_frames: u64) -> R<()> {
    let (_m, region) = open_channel(chan)?;
    let end = Instant::now() + Duration::from_secs(seconds);
    let mut phase = 0u64;
    while Instant::now() < end {
        let mut w = ChannelWriter::init(&region, Tracker::Harness)?;
        // Keep round numbers moving across re-initialisations, so each bad round is new.
        region.store_u64(off::ROUND, 100 + phase * 10)?;
        let good = |g| HintEntry::new(Gfn(g), 8, false, PageType::Anon, false, true);
        let meta = RoundMeta::default();
        match phase % 5 {
            0 => {
                // Frames outside the VM's RAM.
                let e = vec![good(1), good(ram_frames + 0x100000), good(2)];
                w.publish(&e, &meta)?;
            }
            1 => {
                // Garbage header.
                region.store_u64(off::MAGIC, 0xdead_beef_dead_beef)?;
                region.store_u64(off::ROUND, phase + 1000)?;
            }
            2 => {
                // Torn rounds: the sequence counter moves all the time, sometimes held odd.
                w.publish(&[good(3)], &meta)?;
                let t = Instant::now() + Duration::from_millis(900);
                while Instant::now() < t {
                    let s = region.load_u64(off::SEQ)?;
                    region.store_u64(off::SEQ, s.wrapping_add(1))?;
                    region.store_u64(off::ROUND, s)?;
                }
            }
            3 => {
                // A flood: every slot filled with valid entries, ignoring the host's budget.
                let cap = w.capacity();
                let e: Vec<HintEntry> = (0..cap).map(|i| good(i % ram_frames.max(1))).collect();
                // Bypass the writer's budget clamp by writing the words directly.
                let words: Vec<u64> = e.iter().map(|x| x.0).collect();
                let s = region.load_u64(off::SEQ)?;
                region.store_u64(off::SEQ, s | 1)?;
                region.store_words(4096, &words)?;
                region.store_u64(off::COUNT, cap)?;
                region.store_u64(off::ROUND, phase + 5000)?;
                region.store_u64(off::SEQ, (s | 1) + 1)?;
            }
            _ => {
                // Reserved entry bits and a misaligned 2 MiB unit.
                let words = [
                    good(1).0 | (1 << 60),
                    HintEntry::new(Gfn(3), 1, false, PageType::Anon, true, true).0,
                ];
                let s = region.load_u64(off::SEQ)?;
                region.store_u64(off::SEQ, s | 1)?;
                region.store_words(4096, &words)?;
                region.store_u64(off::COUNT, 2)?;
                region.store_u64(off::ROUND, phase + 9000)?;
                region.store_u64(off::SEQ, (s | 1) + 1)?;
            }
        }
        phase += 1;
        std::thread::sleep(Duration::from_millis(600));
    }
    Ok(())
}

fn ack_round(chan: &str) -> u64 {
    open_channel(chan)
        .ok()
        .and_then(|(_m, r)| read_feedback(&r).ok().flatten())
        .map_or(0, |f| f.ack_round)
}

/// Waits until every hot frame is on `fast` and every other frame on `slow`, checking the fast
/// quota at every sample. Prints the rounds it took (from the host's ack_round).
#[allow(clippy::too_many_arguments)]
fn wait(
    sock: &str,
    chan: &str,
    hot: &str,
    fast: i32,
    slow: i32,
    quota_mib: u64,
    timeout_s: u64,
    strict: bool,
    max_rounds: u64,
    max_round: u64,
    min_secs: f64,
) -> R<()> {
    let hot = spans(hot)?;
    let mut q = connect(sock)?;
    // The guest's own round counter: monotonic, unlike the host's ack, which a restarted
    // daemon resets.
    let start_round = open_channel(chan)?.1.load_u64(off::ROUND)?;
    let t0 = Instant::now();
    let mut samples = 0;
    let fast_nodes: Vec<i32> = vec![0, 1]; // the emulated host's DRAM nodes
    loop {
        let (_pid, pl) = placement(&mut q)?;
        samples += 1;
        let fast_pages = pl.iter().filter(|(_, s)| fast_nodes.contains(s)).count() as u64;
        if fast_pages * 4096 > quota_mib << 20 {
            return Err(format!(
                "quota exceeded: {} MiB fast > {} MiB quota",
                (fast_pages * 4096) >> 20,
                quota_mib
            )
            .into());
        }
        let hot_total = pl.iter().filter(|(g, _)| in_spans(&hot, *g)).count();
        let want: u64 = hot.iter().map(|s| s.1).sum();
        if hot_total as u64 != want {
            return Err(
                format!("hot set names {want} frames but {hot_total} are guest RAM").into(),
            );
        }
        let hot_ok = pl
            .iter()
            .filter(|(g, s)| in_spans(&hot, *g) && *s == fast)
            .count();
        let cold_bad = pl
            .iter()
            .filter(|(g, s)| !in_spans(&hot, *g) && *s != slow && *s >= 0)
            .count();
        if hot_ok == hot_total && (cold_bad == 0 || !strict) {
            let acked = ack_round(chan);
            let rounds = acked.saturating_sub(start_round);
            if rounds > max_rounds {
                return Err(format!(
                    "converged only after {rounds} guest rounds (bound {max_rounds})"
                )
                .into());
            }
            if t0.elapsed().as_secs_f64() < min_secs {
                return Err(format!(
                    "converged in {:.1}s, faster than the rate limit allows ({min_secs}s)",
                    t0.elapsed().as_secs_f64()
                )
                .into());
            }
            if acked > max_round {
                return Err(
                    format!("converged only at guest round {acked} (bound {max_round})").into(),
                );
            }
            println!(
                "converged: {hot_ok} hot frames on node {fast}, {cold_bad} other frames off node {slow}, \
                 fast {} MiB <= quota {quota_mib} MiB, {:.1}s, {rounds} guest rounds ({acked} since the guest started), {samples} samples",
                (fast_pages * 4096) >> 20,
                t0.elapsed().as_secs_f64()
            );
            return Ok(());
        }
        if t0.elapsed() > Duration::from_secs(timeout_s) {
            return Err(format!(
                "not converged after {timeout_s}s: {hot_ok}/{hot_total} hot frames on node {fast}, \
                 {cold_bad} other frames not on node {slow}"
            )
            .into());
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Samples a VM's fast pages for `seconds`; fails the moment they exceed the quota.
fn quota(sock: &str, fast: &str, quota_mib: u64, seconds: u64) -> R<()> {
    let fast: Vec<i32> = fast
        .split(',')
        .map(|s| s.parse())
        .collect::<Result<_, _>>()?;
    let mut q = connect(sock)?;
    let end = Instant::now() + Duration::from_secs(seconds);
    let (mut samples, mut max) = (0u64, 0u64);
    while Instant::now() < end {
        let (_pid, pl) = placement(&mut q)?;
        let f = pl.iter().filter(|(_, s)| fast.contains(s)).count() as u64 * 4096;
        max = max.max(f);
        samples += 1;
        if f > quota_mib << 20 {
            return Err(format!("quota exceeded: {} KiB > {quota_mib} MiB", f >> 10).into());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    println!(
        "quota held: max {} MiB fast <= {quota_mib} MiB over {samples} samples",
        max >> 20
    );
    Ok(())
}

fn print_placement(sock: &str) -> R<()> {
    let mut q = connect(sock)?;
    let (pid, pl) = placement(&mut q)?;
    println!("pid {pid}: {:?} (node or -errno: pages)", by_node(&pl));
    Ok(())
}

/// Pages per node (or -errno) of a VM, printed compactly.
fn by_node(pl: &[(u64, i32)]) -> std::collections::BTreeMap<i32, u64> {
    let mut by = std::collections::BTreeMap::new();
    for (_, s) in pl {
        *by.entry(*s).or_default() += 1;
    }
    by
}

/// Waits until the VM holds at least `min_mib` on `fast` nodes; fails the moment a sample shows
/// more than `max_mib` there, or a page on `forbid`.
fn fast(
    sock: &str,
    fast: &str,
    min_mib: u64,
    max_mib: u64,
    timeout_s: u64,
    forbid: Option<i32>,
) -> R<()> {
    let fast: Vec<i32> = fast
        .split(',')
        .map(|s| s.parse())
        .collect::<Result<_, _>>()?;
    let mut q = connect(sock)?;
    let t0 = Instant::now();
    let mut samples = 0u64;
    loop {
        let (_pid, pl) = placement(&mut q)?;
        samples += 1;
        let by = by_node(&pl);
        let f: u64 = fast
            .iter()
            .map(|n| by.get(n).copied().unwrap_or(0))
            .sum::<u64>()
            * 4096;
        if f > max_mib << 20 {
            return Err(format!("{} KiB on fast nodes > {max_mib} MiB: {by:?}", f >> 10).into());
        }
        if let Some(n) = forbid {
            if let Some(c) = by.get(&n).filter(|c| **c > 0) {
                return Err(format!("{c} pages on node {n}: {by:?}").into());
            }
        }
        if f >= min_mib << 20 {
            println!(
                "{} MiB on nodes {fast:?} (>= {min_mib}, <= {max_mib}) after {:.1}s, {samples} samples; pages by node {by:?}",
                f >> 20,
                t0.elapsed().as_secs_f64()
            );
            return Ok(());
        }
        if t0.elapsed() > Duration::from_secs(timeout_s) {
            return Err(format!(
                "after {timeout_s}s only {} KiB on nodes {fast:?} (want {min_mib} MiB): {by:?}",
                f >> 10
            )
            .into());
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Waits until `min_percent` of the frames in `spec` are on `fast` nodes, the VM never holding
/// more than `max_mib` there at any sample.
fn hot(
    sock: &str,
    spec: &str,
    fast: &str,
    min_percent: u64,
    max_mib: u64,
    timeout_s: u64,
) -> R<()> {
    let fast: Vec<i32> = fast
        .split(',')
        .map(|s| s.parse())
        .collect::<Result<_, _>>()?;
    let sp = spans(spec)?;
    let want: u64 = sp.iter().map(|&(_, n)| n).sum();
    let mut q = connect(sock)?;
    let t0 = Instant::now();
    let mut samples = 0u64;
    let mut max_seen = 0u64;
    loop {
        let (_pid, pl) = placement(&mut q)?;
        samples += 1;
        let on_fast = |s: i32| fast.contains(&s);
        let all_fast = pl.iter().filter(|(_, s)| on_fast(*s)).count() as u64;
        let hot_fast = pl
            .iter()
            .filter(|(g, s)| in_spans(&sp, *g) && on_fast(*s))
            .count() as u64;
        max_seen = max_seen.max(all_fast);
        if max_mib > 0 && all_fast * 4096 > max_mib << 20 {
            return Err(format!(
                "{} KiB on fast nodes > {max_mib} MiB: {:?}",
                all_fast * 4,
                by_node(&pl)
            )
            .into());
        }
        if hot_fast * 100 >= want * min_percent {
            println!(
                "{hot_fast} of {want} hot frames ({}%) on nodes {fast:?} after {:.1}s, {samples} samples, {} KiB fast in all (at most {} KiB); pages by node {:?}",
                hot_fast * 100 / want,
                t0.elapsed().as_secs_f64(),
                all_fast * 4,
                max_seen * 4,
                by_node(&pl)
            );
            return Ok(());
        }
        if t0.elapsed() > Duration::from_secs(timeout_s) {
            return Err(format!(
                "after {timeout_s}s {hot_fast} of {want} hot frames on nodes {fast:?} (want {min_percent}%): {:?}",
                by_node(&pl)
            )
            .into());
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Fails if the VM's pages per node change within `seconds`.
fn still(sock: &str, seconds: u64) -> R<()> {
    let mut q = connect(sock)?;
    let (_pid, pl) = placement(&mut q)?;
    let first = by_node(&pl);
    let t0 = Instant::now();
    let mut samples = 1u64;
    while t0.elapsed() < Duration::from_secs(seconds) {
        std::thread::sleep(Duration::from_millis(500));
        let (_pid, pl) = placement(&mut q)?;
        samples += 1;
        let now = by_node(&pl);
        if now != first {
            return Err(format!(
                "placement changed after {:.1}s: {first:?} -> {now:?}",
                t0.elapsed().as_secs_f64()
            )
            .into());
        }
    }
    println!("pages by node {first:?} unchanged over {seconds}s ({samples} samples)");
    Ok(())
}

/// Samples the daemon's status: each listed VM's quota within its bounds, the sum within
/// `total_mib`, at every sample (a VM not managed yet is skipped until it appears).
fn quotas(ctl: &str, seconds: u64, total_mib: u64, bounds: &[&str]) -> R<()> {
    let mut want = Vec::new();
    let mut until = None;
    for b in bounds {
        if let Some(f) = b.strip_prefix("until=") {
            until = Some(Path::new(f));
            continue;
        }
        let (vm, r) = b.split_once('=').ok_or("bounds are vm=lo:hi")?;
        let (lo, hi) = r.split_once(':').ok_or("bounds are vm=lo:hi")?;
        want.push((vm.to_string(), num(lo)? << 20, num(hi)? << 20));
    }
    let end = Instant::now() + Duration::from_secs(seconds);
    let mut samples = 0u64;
    let mut seen: std::collections::BTreeMap<String, (u64, u64)> = Default::default();
    while Instant::now() < end && !until.is_some_and(|f| f.exists()) {
        let st = vtism_host::serve::ctl_request(Path::new(ctl), "status")?;
        let vms = st["vms"].as_array().cloned().unwrap_or_default();
        let mut sum = 0u64;
        for v in &vms {
            sum += v["quota_bytes"].as_u64().unwrap_or(0);
        }
        if sum > total_mib << 20 {
            return Err(format!("quotas add up to {} KiB > {total_mib} MiB", sum >> 10).into());
        }
        for (name, lo, hi) in &want {
            let Some(v) = vms.iter().find(|v| v["name"] == name.as_str()) else {
                continue;
            };
            let q = v["quota_bytes"].as_u64().ok_or("no quota_bytes")?;
            if q < *lo || q > *hi {
                return Err(format!(
                    "{name}: quota {} KiB outside [{}, {}] MiB (last change {})",
                    q >> 10,
                    lo >> 20,
                    hi >> 20,
                    v["last_quota_change"]
                )
                .into());
            }
            let e = seen.entry(name.clone()).or_insert((q, q));
            *e = (e.0.min(q), e.1.max(q));
        }
        samples += 1;
        std::thread::sleep(Duration::from_millis(200));
    }
    let ranges: Vec<String> = seen
        .iter()
        .map(|(n, (a, b))| format!("{n} {}-{} KiB", a >> 10, b >> 10))
        .collect();
    println!(
        "quotas within bounds over {samples} samples: {}",
        ranges.join(", ")
    );
    Ok(())
}

/// The node's free memory as vtismd's watermark counts it: MemFree and the free pages on its own
/// CPUs' lists (tens of MiB after a migration).
fn node_free(node: u32) -> R<u64> {
    let dir = format!("/sys/devices/system/node/node{node}");
    let t = std::fs::read_to_string(format!("{dir}/meminfo"))?;
    let mem_free = vtism_host::topology::meminfo_field(&t, "MemFree")
        .ok_or("no MemFree in the node's meminfo")?;
    let cpus =
        vtism_host::topology::parse_list(&std::fs::read_to_string(format!("{dir}/cpulist"))?)
            .ok_or("the node's cpulist does not parse")?;
    let z = std::fs::read_to_string("/proc/zoneinfo")?;
    let per_cpu = vtism_host::topology::per_cpu_free_bytes(&z);
    let listed: u64 = cpus.iter().filter_map(|&c| per_cpu.get(&(node, c))).sum();
    Ok(mem_free + listed)
}

/// Fills `node` with this process's memory until its free memory is below `keep_mib`, and keeps it
/// there (memory other processes free on the node is taken again) until killed. The memory policy
/// prefers the node rather than binding to it, so the kernel never OOM-kills anyone for it: when
/// the node is at its watermark the kernel places a chunk elsewhere, which this sees (move_pages
/// query), gives back at once, and counts as the node being full.
fn hog(node: u32, keep_mib: u64, once: bool) -> R<()> {
    const CHUNK: usize = 2 << 20;
    const MPOL_PREFERRED: libc::c_long = 1;
    let mask: [libc::c_ulong; 1] = [1 << node];
    let r = unsafe {
        libc::syscall(
            libc::SYS_set_mempolicy,
            MPOL_PREFERRED,
            mask.as_ptr(),
            (mask.len() * 64) as libc::c_ulong,
        )
    };
    if r != 0 {
        return Err(format!("set_mempolicy: {}", std::io::Error::last_os_error()).into());
    }
    let pid = std::process::id() as i32;
    let mut held: Vec<Vec<u8>> = Vec::new();
    let mut reported = false;
    loop {
        let free = node_free(node)?;
        let mut full = reported && once || free <= (keep_mib << 20) + CHUNK as u64;
        if !full {
            // Touch every page so it is allocated now, then check where the kernel put it.
            let v = vec![0x5au8; CHUNK];
            let base = (v.as_ptr() as u64 + 4095) & !4095;
            let addrs: Vec<Hva> = (0..CHUNK as u64 / 4096 - 1)
                .map(|i| Hva(base + i * 4096))
                .collect();
            let mut st = vec![0i32; addrs.len()];
            sys::move_pages(pid, &addrs, None, &mut st, 0)?;
            if st.iter().all(|&s| s == node as i32) {
                held.push(v);
                continue;
            }
            full = true; // the node is at its watermark: `v` is given back here
        }
        if full && !reported {
            println!(
                "hog: node {node} free {} MiB, holding {} MiB",
                node_free(node)? >> 20,
                (held.len() * CHUNK) >> 20
            );
            std::io::stdout().flush()?;
            reported = true;
        }
        std::thread::sleep(Duration::from_millis(if full { 500 } else { 100 }));
    }
}

fn capture(sock: &str, out: &str) -> R<()> {
    let s = std::os::unix::net::UnixStream::connect(sock)?;
    let mut q = Qmp::from_stream_recording(s, Duration::from_secs(20), true)?;
    let info = vtism_host::vm::inspect(&mut q)?;
    eprintln!(
        "captured: {} ranges, {} MiB, ivshmem {:?}",
        info.memory.ranges.len(),
        info.memory.bytes() >> 20,
        info.ivshmem
    );
    let mut f = std::fs::File::create(out)?;
    for l in q.transcript.take().unwrap_or_default() {
        writeln!(f, "{l}")?;
    }
    Ok(())
}

/// Mover throughput: move_pages of an anonymous buffer between two nodes, by batch size, next
/// to a memcpy of the same bytes.
fn bench(mib: u64, from: i32, to: i32, batches: &str) -> R<()> {
    let len = (mib << 20) as usize;
    let pages = len / 4096;
    let mut src = vec![1u8; len + 4096];
    let base = (src.as_mut_ptr() as usize + 4095) & !4095;
    let addrs: Vec<Hva> = (0..pages).map(|i| Hva((base + i * 4096) as u64)).collect();
    let pid = std::process::id() as i32;
    let mut st = vec![0i32; pages];
    let move_all = |node: i32, batch: usize, st: &mut [i32]| -> R<f64> {
        let t = Instant::now();
        for (c, s) in addrs.chunks(batch).zip(st.chunks_mut(batch)) {
            let nodes = vec![node; c.len()];
            sys::move_pages(pid, c, Some(&nodes), s, sys::MPOL_MF_MOVE)?;
        }
        Ok(t.elapsed().as_secs_f64())
    };
    // memcpy of the same bytes (source and destination both touched first).
    let mut dst = vec![0u8; len];
    dst.copy_from_slice(&src[..len]);
    let t = Instant::now();
    for _ in 0..3 {
        dst.copy_from_slice(&src[..len]);
        std::hint::black_box(&dst);
    }
    let memcpy = t.elapsed().as_secs_f64() / 3.0;
    println!(
        "memcpy {mib} MiB: {:.1} ms, {:.0} pages/s, {:.0} MB/s",
        memcpy * 1e3,
        pages as f64 / memcpy,
        len as f64 / memcpy / 1e6
    );
    println!("batch_pages,pages_per_s,mb_per_s,ratio_to_memcpy");
    for b in batches.split(',') {
        let b: usize = b.parse()?;
        move_all(from, 4096, &mut st)?;
        let secs = move_all(to, b, &mut st)?;
        let moved = st.iter().filter(|&&s| s == to).count();
        if moved * 10 < pages * 9 {
            return Err(format!("only {moved}/{pages} pages reached node {to}").into());
        }
        println!(
            "{b},{:.0},{:.0},{:.3}",
            moved as f64 / secs,
            (moved * 4096) as f64 / secs / 1e6,
            memcpy / secs * moved as f64 / pages as f64
        );
    }
    Ok(())
}

fn get(addr: &str, path: &str) -> R<()> {
    let mut s = std::net::TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.write_all(format!("GET {path} HTTP/1.0\r\n\r\n").as_bytes())?;
    let mut b = String::new();
    s.read_to_string(&mut b)?;
    let body = b.split_once("\r\n\r\n").map_or("", |x| x.1);
    print!("{body}");
    Ok(())
}

fn main() {
    let a: Vec<String> = std::env::args().skip(1).collect();
    let s: Vec<&str> = a.iter().map(String::as_str).collect();
    let r = match s.as_slice() {
        ["capture", sock, out] => capture(sock, out),
        ["publish", chan, spec, iv] => num(iv).and_then(|iv| publish(chan, spec, iv, None)),
        ["publish", chan, spec, iv, secs] => (|| publish(chan, spec, num(iv)?, Some(num(secs)?)))(),
        ["hostile", chan, secs, frames] => (|| hostile(chan, num(secs)?, num(frames)?))(),
        ["wait", sock, chan, hot, f, sl, q, t, rest @ ..] => (|| {
            let strict = !rest.contains(&"hot-only");
            let max_rounds = match rest.iter().find_map(|r| r.strip_prefix("max-rounds=")) {
                Some(n) => num(n)?,
                None => u64::MAX,
            };
            let max_round = match rest.iter().find_map(|r| r.strip_prefix("max-round=")) {
                Some(n) => num(n)?,
                None => u64::MAX,
            };
            let min_secs = match rest.iter().find_map(|r| r.strip_prefix("min-secs=")) {
                Some(n) => num(n)? as f64,
                None => 0.0,
            };
            let (f, sl) = (num(f)? as i32, num(sl)? as i32);
            wait(
                sock,
                chan,
                hot,
                f,
                sl,
                num(q)?,
                num(t)?,
                strict,
                max_rounds,
                max_round,
                min_secs,
            )
        })(),
        ["quota", sock, fast, q, secs] => (|| quota(sock, fast, num(q)?, num(secs)?))(),
        ["placement", sock] => print_placement(sock),
        ["fast", sock, nodes, lo, hi, t, rest @ ..] => (|| {
            let forbid = match rest.iter().find_map(|r| r.strip_prefix("forbid=")) {
                Some(n) => Some(num(n)? as i32),
                None => None,
            };
            fast(sock, nodes, num(lo)?, num(hi)?, num(t)?, forbid)
        })(),
        ["hot", sock, spec, nodes, pct, max, t] => {
            (|| hot(sock, spec, nodes, num(pct)?, num(max)?, num(t)?))()
        }
        ["still", sock, secs] => (|| still(sock, num(secs)?))(),
        ["quotas", ctl, secs, total, bounds @ ..] => {
            (|| quotas(ctl, num(secs)?, num(total)?, bounds))()
        }
        ["hog", node, keep] => (|| hog(num(node)? as u32, num(keep)?, false))(),
        ["hog", node, keep, "once"] => (|| hog(num(node)? as u32, num(keep)?, true))(),
        ["bench", mib, from, to, batches] => {
            (|| bench(num(mib)?, num(from)? as i32, num(to)? as i32, batches))()
        }
        ["get", addr, path] => get(addr, path),
        _ => Err("usage: see the top of crates/host/examples/e2e_harness.rs".into()),
    };
    if let Err(e) = r {
        eprintln!("e2e-harness: {e}");
        std::process::exit(1);
    }
}
