//! What DAMON sees on the emulated host, recorded beside the runs (docs/bakeoff.md, "DAMON"):
//!
//! - during the `damon` run, every region of both kdamonds with its `nr_accesses` and age at a
//!   few points of the run ([`Watcher`]), and how many of the workload's hot frames lie in
//!   regions DAMON saw accessed (host frames from the nested QEMU's pagemap);
//! - after the `none` run's samples, a probe ([`probe`]): one kdamond with the recipe's
//!   monitoring of the CXL nodes and only a `stat` scheme, first as the stage is, then with a
//!   process on the VM's CPU that sleeps for a millisecond at a time ([`tlb_flusher`]). DAMON's
//!   physical-address operations clear a page's Accessed bit through the rmap without flushing
//!   the TLB (x86 allows it: the bit is set again at the next page walk), and on hardware a TLB
//!   of a couple of thousand entries misses again within microseconds under GUPS. QEMU's TCG
//!   software TLB holds millions of entries and is emptied only on a CR3 write, which a vCPU
//!   thread running alone on its CPU does not make; each switch to another process does. The
//!   probe's two phases tell how much of the hot set DAMON sees in each case.

use crate::damon_tiering::{DamonObserver, DamonTiering, Nodes, Recipe, Snapshot};
use serde::{Deserialize, Serialize};
use std::io::{Read, Seek, SeekFrom};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use vtism_testbed::placement::GuestRam;

/// The nested QEMU's addresses of the given guest frames.
pub fn hvas(ram: &GuestRam, frames: &[usize]) -> Vec<u64> {
    frames
        .iter()
        .filter_map(|&i| ram.hva(i).map(|h| h.0))
        .collect()
}

/// The host physical addresses (sorted) of the nested QEMU's (`pid`) addresses `hvas`, from its
/// /proc/PID/pagemap (root: the emulated host's conductor is).
pub fn host_paddrs(pid: i32, hvas: &[u64]) -> anyhow::Result<Vec<u64>> {
    let mut f = std::fs::File::open(format!("/proc/{pid}/pagemap"))?;
    let mut out = Vec::with_capacity(hvas.len());
    let mut buf = [0u8; 8];
    for &hva in hvas {
        f.seek(SeekFrom::Start(hva / 4096 * 8))?;
        f.read_exact(&mut buf)?;
        let e = u64::from_le_bytes(buf);
        // bit 63: present; bits 0-54: the frame number
        if e >> 63 == 1 && e & ((1 << 55) - 1) != 0 {
            out.push((e & ((1 << 55) - 1)) * 4096);
        }
    }
    out.sort_unstable();
    Ok(out)
}

/// Takes snapshots of the kdamonds at given seconds of a run, from a thread of its own (reading
/// a thousand regions through sysfs takes seconds under TCG; the run's samples go on).
pub struct Watcher {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<Vec<Snapshot>>>,
}

impl Watcher {
    /// `hot` holds the nested QEMU's (`pid`) addresses of the workload's hot set (the caller
    /// replaces them when the hot set moves).
    pub fn start(
        observer: DamonObserver,
        recipe: Recipe,
        pid: i32,
        hot: Arc<Mutex<Vec<u64>>>,
        at_s: Vec<f64>,
        phase: String,
    ) -> Watcher {
        let stop = Arc::new(AtomicBool::new(false));
        let st = stop.clone();
        let thread = std::thread::spawn(move || {
            let t0 = Instant::now();
            let mut shots = Vec::new();
            for at in at_s {
                while t0.elapsed().as_secs_f64() < at {
                    if st.load(Ordering::Relaxed) {
                        return shots;
                    }
                    std::thread::sleep(Duration::from_millis(200));
                }
                let hot_now = hot.lock().map(|h| h.clone()).unwrap_or_default();
                for k in 0..observer.kdamonds() {
                    match observer.snapshot(k, &recipe) {
                        Ok(mut s) => {
                            s.t_s = t0.elapsed().as_secs_f64();
                            s.phase = phase.clone();
                            if let Ok(p) = host_paddrs(pid, &hot_now) {
                                s.count_hot(&p);
                            }
                            println!("TB   DAMON at {:.0} s: {}", s.t_s, s.summary());
                            shots.push(s);
                        }
                        Err(e) => println!("TB   DAMON's regions not read: {e:#} (pid {pid})"),
                    }
                }
            }
            shots
        });
        Watcher {
            stop,
            thread: Some(thread),
        }
    }

    /// Ends the watch; the snapshots taken.
    pub fn finish(mut self) -> Vec<Snapshot> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default()
    }
}

/// `vtism bakeoff tlb-flusher`: pinned to `cpu`, sleeps `period_us` at a time, forever. Each
/// wake-up switches the CPU from the VM's QEMU to this process and back: two CR3 writes, each of
/// which empties the emulator's software TLB of that CPU.
pub fn tlb_flusher(cpu: usize, period_us: u64) -> anyhow::Result<()> {
    // SAFETY: sched_setaffinity on the calling thread with a set built on the stack.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(std::io::Error::last_os_error().into());
        }
    }
    loop {
        std::thread::sleep(Duration::from_micros(period_us));
    }
}

/// The flusher process, while it runs.
struct Flusher(Child);

impl Flusher {
    fn start(bin: &std::path::Path, cpu: usize, period_us: u64) -> anyhow::Result<Flusher> {
        Ok(Flusher(
            Command::new(bin)
                .args([
                    "bakeoff",
                    "tlb-flusher",
                    "--cpu",
                    &cpu.to_string(),
                    "--period-us",
                    &period_us.to_string(),
                ])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()?,
        ))
    }

    /// Its context switches so far (voluntary: one per sleep).
    fn switches(&self) -> u64 {
        std::fs::read_to_string(format!("/proc/{}/status", self.0.id()))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
                    .and_then(|v| v.trim().parse().ok())
            })
            .unwrap_or(0)
    }
}

impl Drop for Flusher {
    fn drop(&mut self) {
        // SAFETY: kill(2) on the child this code started, by its pid, before it is reaped.
        unsafe {
            libc::kill(self.0.id() as i32, libc::SIGKILL);
        }
        let _ = self.0.wait();
    }
}

/// What the probe after the `none` run found.
pub struct Probe {
    pub snapshots: Vec<Snapshot>,
    pub trace: Vec<TraceStats>,
}

/// The probe after the `none` run: the recipe's monitoring of the CXL nodes with only a `stat`
/// scheme, `phase_s` seconds in each of three phases: the stage as it is; with the flusher on
/// `cpu` (the emulator's TLB emptied about every millisecond); with the recipe's intervals made
/// 20 times longer (sampling 100 ms, aggregation 2 s: the direction 6.15's interval auto-tuning
/// takes when DAMON sees fewer accesses than its 4% goal; 6.12 cannot tune them). Three
/// snapshots of the regions per phase, and the tracepoint's sums.
pub fn probe(
    bin: &std::path::Path,
    nodes: &Nodes,
    ram: &GuestRam,
    hot: &[usize],
    cpu: usize,
    phase_s: f64,
) -> anyhow::Result<Probe> {
    let recipe = Recipe::default();
    let hot = hvas(ram, hot);
    let spa = recipe.max_nr_accesses();
    let tracer = Tracer::start(
        nodes.slow_ranges.clone(),
        ram.pid,
        Arc::new(Mutex::new(hot.clone())),
        "probe: the stage as it is",
        spa,
        false,
    )
    .map_err(|e| println!("TB   DAMON probe: no trace: {e:#}"))
    .ok();
    let d = DamonTiering::monitor(&recipe, nodes)?;
    let obs = d.observer();
    let t0 = Instant::now();
    let mut shots = Vec::new();
    let shoot =
        |recipe: &Recipe, phase: &str, shots: &mut Vec<Snapshot>| match obs.snapshot(0, recipe) {
            Ok(mut s) => {
                s.t_s = t0.elapsed().as_secs_f64();
                s.phase = phase.to_string();
                if let Ok(p) = host_paddrs(ram.pid, &hot) {
                    s.count_hot(&p);
                }
                println!("TB   DAMON probe at {:.0} s: {}", s.t_s, s.summary());
                shots.push(s);
            }
            Err(e) => println!("TB   DAMON probe: regions not read: {e:#}"),
        };
    let result = (|| {
        for i in 1..=3 {
            std::thread::sleep(Duration::from_secs_f64(phase_s / 3.0));
            shoot(
                &recipe,
                &format!("probe: the stage as it is, {i}/3"),
                &mut shots,
            );
        }
        let f = Flusher::start(bin, cpu, 1000)?;
        let flushed = format!("probe: a process on CPU {cpu} waking every 1 ms");
        if let Some(t) = &tracer {
            t.phase(&flushed, spa);
        }
        let t = Instant::now();
        for i in 1..=3 {
            std::thread::sleep(Duration::from_secs_f64(phase_s / 3.0));
            let rate = f.switches() as f64 / t.elapsed().as_secs_f64();
            shoot(
                &recipe,
                &format!("{flushed} ({rate:.0} switches/s), {i}/3"),
                &mut shots,
            );
        }
        drop(f);
        let long = Recipe {
            sample_us: recipe.sample_us * 20,
            aggr_us: recipe.aggr_us * 20,
            ..recipe.clone()
        };
        d.set_intervals(0, long.sample_us, long.aggr_us)?;
        let slow = "probe: intervals 20x the recipe's (100 ms / 2 s)";
        if let Some(t) = &tracer {
            t.phase(slow, long.max_nr_accesses());
        }
        for i in 1..=3 {
            std::thread::sleep(Duration::from_secs_f64(phase_s / 3.0));
            shoot(&long, &format!("{slow}, {i}/3"), &mut shots);
        }
        anyhow::Ok(())
    })();
    let stopped = d.stop();
    let trace = tracer.map(|t| t.finish()).unwrap_or_default();
    for s in &trace {
        println!("TB   DAMON trace: {}", s.summary());
    }
    result?;
    stopped?;
    Ok(Probe {
        snapshots: shots,
        trace,
    })
}

/// DAMON's view over time, from its `damon:damon_aggregated` tracepoint (every region at every
/// aggregation), per phase and side: what it takes to tell how often DAMON sees an access at all,
/// which four snapshots of the regions cannot.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TraceStats {
    /// The probe's phase, or the run.
    pub phase: String,
    /// "slow" (the CXL nodes: promotion's and the probe's kdamond) or "dram" (node 0: demotion's).
    pub side: String,
    /// Seconds (trace clock) the phase's events span.
    pub span_s: f64,
    /// Aggregations (each region event counts 1/nr_regions of one).
    pub aggregations: f64,
    /// Region events, and those with `nr_accesses` > 0.
    pub region_events: u64,
    pub accessed_events: u64,
    /// DAMON's access ratio as its interval auto-tuning (6.15) scores it: sum of region bytes x
    /// nr_accesses over sum of region bytes x samples per aggregation.
    pub access_ratio: f64,
    /// Events of regions holding one of the workload's hot frames, and of them with
    /// `nr_accesses` > 0.
    pub hot_region_events: u64,
    pub hot_accessed_events: u64,
    pub max_nr_accesses: u64,
    /// Samples per aggregation in this phase.
    pub samples_per_aggregation: u64,
    /// The migration scheme (scheme 0: `migrate_hot` on the slow side, `migrate_cold` on
    /// DRAM) tried on a region (`damos_before_apply`): how often, and those regions' bytes.
    #[serde(default)]
    pub tried_events: u64,
    #[serde(default)]
    pub tried_bytes: u64,
}

#[derive(Default)]
struct Acc {
    first: Option<f64>,
    last: f64,
    aggregations: f64,
    region_events: u64,
    accessed_events: u64,
    acc_bytes: f64,
    bytes: f64,
    hot_region_events: u64,
    hot_accessed_events: u64,
    max_nr_accesses: u64,
    tried_events: u64,
    tried_bytes: u64,
}

const TRACING: &str = "/sys/kernel/tracing";

fn tracing_write(f: &str, v: &str) -> anyhow::Result<()> {
    std::fs::write(format!("{TRACING}/{f}"), v)
        .map_err(|e| anyhow::anyhow!("writing {v:?} to {TRACING}/{f}: {e}"))
}

/// Follows `damon:damon_aggregated` in the emulated host's tracefs (mounted if it is not) from a
/// thread of its own, summing per phase (set with [`Tracer::phase`]) and side.
pub struct Tracer {
    stop: Arc<AtomicBool>,
    phase: Arc<Mutex<(String, u64)>>,
    thread: Option<std::thread::JoinHandle<Vec<TraceStats>>>,
}

impl Tracer {
    /// `slow`: the CXL nodes' physical ranges; `hot`: the nested QEMU's (`pid`) addresses of the
    /// workload's hot set, located on the host every few seconds; `migration`: scheme 0 is a
    /// migration scheme whose tries are counted (the probe's only scheme is `stat`).
    pub fn start(
        slow: Vec<(u64, u64)>,
        pid: i32,
        hot: Arc<Mutex<Vec<u64>>>,
        phase: &str,
        samples_per_aggregation: u64,
        migration: bool,
    ) -> anyhow::Result<Tracer> {
        if !std::path::Path::new(TRACING).join("trace_pipe").exists() {
            let st = Command::new("mount")
                .args(["-t", "tracefs", "nodev", TRACING])
                .status()?;
            if !st.success() {
                anyhow::bail!("cannot mount tracefs on {TRACING}");
            }
        }
        tracing_write("tracing_on", "0")?;
        tracing_write("trace", "")?;
        tracing_write("buffer_size_kb", "8192")?;
        tracing_write("events/damon/damon_aggregated/enable", "1")?;
        tracing_write(
            "events/damon/damos_before_apply/enable",
            if migration { "1" } else { "0" },
        )?;
        tracing_write("tracing_on", "1")?;
        let stop = Arc::new(AtomicBool::new(false));
        let phase = Arc::new(Mutex::new((phase.to_string(), samples_per_aggregation)));
        let (st, ph) = (stop.clone(), phase.clone());
        let thread = std::thread::spawn(move || follow(st, ph, slow, pid, hot));
        Ok(Tracer {
            stop,
            phase,
            thread: Some(thread),
        })
    }

    /// Events from now on count for `phase` (with this many samples per aggregation).
    pub fn phase(&self, phase: &str, samples_per_aggregation: u64) {
        if let Ok(mut p) = self.phase.lock() {
            *p = (phase.to_string(), samples_per_aggregation);
        }
    }

    /// Stops tracing; the sums, per phase and side in the order first seen.
    pub fn finish(mut self) -> Vec<TraceStats> {
        // let the reader drain what is buffered
        std::thread::sleep(Duration::from_millis(1500));
        self.stop.store(true, Ordering::Relaxed);
        let out = self
            .thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default();
        let _ = tracing_write("events/damon/damon_aggregated/enable", "0");
        let _ = tracing_write("events/damon/damos_before_apply/enable", "0");
        let _ = tracing_write("tracing_on", "0");
        let _ = tracing_write("trace", "");
        out
    }
}

/// A DAMON trace line: the trace time (s) and the event.
#[derive(Debug, PartialEq)]
enum Event {
    /// `damon_aggregated`: nr_regions, start, end, nr_accesses.
    Aggregated(u64, u64, u64, u64),
    /// `damos_before_apply` of scheme 0: start, end.
    Tried(u64, u64),
}

fn parse_event(l: &str) -> Option<(f64, Event)> {
    let (head, name, rest) = if let Some((h, r)) = l.split_once(": damon_aggregated: ") {
        (h, "a", r)
    } else if let Some((h, r)) = l.split_once(": damos_before_apply: ") {
        (h, "t", r)
    } else {
        return None;
    };
    let t: f64 = head.rsplit(' ').next()?.parse().ok()?;
    let field = |k: &str| -> Option<u64> {
        rest.split_whitespace()
            .find_map(|w| w.strip_prefix(k))?
            .parse()
            .ok()
    };
    let range = rest.split_whitespace().find(|w| w.ends_with(':'))?;
    let (s, e) = range.trim_end_matches(':').split_once('-')?;
    let (s, e): (u64, u64) = (s.parse().ok()?, e.parse().ok()?);
    let nr_accesses: u64 = rest
        .split_once(": ")?
        .1
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some((
        t,
        if name == "a" {
            Event::Aggregated(field("nr_regions=")?, s, e, nr_accesses)
        } else {
            if field("scheme_idx=")? != 0 {
                return None;
            }
            Event::Tried(s, e)
        },
    ))
}

fn follow(
    stop: Arc<AtomicBool>,
    phase: Arc<Mutex<(String, u64)>>,
    slow: Vec<(u64, u64)>,
    pid: i32,
    hot: Arc<Mutex<Vec<u64>>>,
) -> Vec<TraceStats> {
    use std::io::BufRead;
    use std::os::unix::fs::OpenOptionsExt;
    let mut order: Vec<(String, String, u64)> = Vec::new();
    let mut accs: std::collections::HashMap<(String, String), Acc> = Default::default();
    let Ok(f) = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(format!("{TRACING}/trace_pipe"))
    else {
        return Vec::new();
    };
    let mut r = std::io::BufReader::with_capacity(1 << 20, f);
    let mut hot_paddrs: Vec<u64> = Vec::new();
    let mut located = Instant::now() - Duration::from_secs(60);
    let mut line = String::new();
    loop {
        if located.elapsed() > Duration::from_secs(5) {
            located = Instant::now();
            let h = hot.lock().map(|h| h.clone()).unwrap_or_default();
            hot_paddrs = host_paddrs(pid, &h).unwrap_or_default();
        }
        line.clear();
        match r.read_line(&mut line) {
            Ok(0) => {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
            Err(_) => break,
        }
        if !line.ends_with('\n') {
            // a partial line: the rest comes with the next read
            let mut more = String::new();
            std::thread::sleep(Duration::from_millis(20));
            let _ = r.read_line(&mut more);
            line.push_str(&more);
        }
        let Some((t, ev)) = parse_event(line.trim_end()) else {
            continue;
        };
        let (ph, spa) = phase.lock().map(|p| p.clone()).unwrap_or_default();
        let start = match ev {
            Event::Aggregated(_, s, _, _) | Event::Tried(s, _) => s,
        };
        let side = if slow.iter().any(|&(s, e)| s <= start && start < e) {
            "slow"
        } else {
            "dram"
        };
        let key = (ph.clone(), side.to_string());
        if !accs.contains_key(&key) {
            order.push((ph, side.to_string(), spa));
        }
        let a = accs.entry(key).or_default();
        a.first.get_or_insert(t);
        a.last = t;
        let (nr_regions, start, end, nr) = match ev {
            Event::Tried(s, e) => {
                a.tried_events += 1;
                a.tried_bytes += e.saturating_sub(s);
                continue;
            }
            Event::Aggregated(n, s, e, nr) => (n, s, e, nr),
        };
        a.aggregations += 1.0 / nr_regions.max(1) as f64;
        a.region_events += 1;
        let sz = end.saturating_sub(start) as f64;
        a.bytes += sz * spa.max(1) as f64;
        a.acc_bytes += sz * nr as f64;
        a.max_nr_accesses = a.max_nr_accesses.max(nr);
        let has_hot =
            hot_paddrs.partition_point(|&x| x < start) < hot_paddrs.partition_point(|&x| x < end);
        if nr > 0 {
            a.accessed_events += 1;
        }
        if has_hot {
            a.hot_region_events += 1;
            if nr > 0 {
                a.hot_accessed_events += 1;
            }
        }
    }
    order
        .into_iter()
        .filter_map(|(phase, side, spa)| {
            let a = accs.remove(&(phase.clone(), side.clone()))?;
            Some(TraceStats {
                span_s: a.last - a.first.unwrap_or(a.last),
                aggregations: a.aggregations,
                region_events: a.region_events,
                accessed_events: a.accessed_events,
                access_ratio: if a.bytes > 0.0 {
                    a.acc_bytes / a.bytes
                } else {
                    0.0
                },
                hot_region_events: a.hot_region_events,
                hot_accessed_events: a.hot_accessed_events,
                max_nr_accesses: a.max_nr_accesses,
                samples_per_aggregation: spa,
                tried_events: a.tried_events,
                tried_bytes: a.tried_bytes,
                phase,
                side,
            })
        })
        .collect()
}

impl TraceStats {
    pub fn summary(&self) -> String {
        format!(
            "{} ({} side): {:.0} aggregations over {:.0} s, {} of {} region-aggregations with nr_accesses > 0 (of those holding hot frames: {} of {}), access ratio {:.4}%, max nr_accesses {} of {}; migration scheme tried {} times on {:.1} MiB",
            self.phase,
            self.side,
            self.aggregations,
            self.span_s,
            self.accessed_events,
            self.region_events,
            self.hot_accessed_events,
            self.hot_region_events,
            100.0 * self.access_ratio,
            self.max_nr_accesses,
            self.samples_per_aggregation,
            self.tried_events,
            self.tried_bytes as f64 / (1u64 << 20) as f64
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn damon_trace_lines_are_read() {
        let a = "       kdamond.0-212     [001] ..... 4093.103829: damon_aggregated: target_id=0 nr_regions=11 4294967296-4496293888: 3 15";
        assert_eq!(
            parse_event(a),
            Some((
                4093.103829,
                Event::Aggregated(11, 4294967296, 4496293888, 3)
            ))
        );
        let t = "       kdamond.0-212     [001] ..... 4093.2: damos_before_apply: ctx_idx=0 scheme_idx=0 target_idx=0 nr_regions=11 4294967296-4496293888: 1 2";
        assert_eq!(
            parse_event(t),
            Some((4093.2, Event::Tried(4294967296, 4496293888)))
        );
        // the stat scheme's applications are not the migration scheme's tries
        assert_eq!(
            parse_event(&t.replace("scheme_idx=0", "scheme_idx=1")),
            None
        );
        assert_eq!(parse_event("# tracer: nop"), None);
    }
}
