//! `vtism testbed probe`, inside the emulated host: follows the nested guest's console for the
//! workload's ground truth, throughput and the tracker's load; samples where each guest frame
//! lives (QMP for guest-physical to host-virtual, move_pages(2) for the node) and what vtismd
//! reports (control socket). Writes one [`Sample`] per period and a "TB ..." progress line.

use crate::guest_console::{ConsoleTail, GupsTruth};
use crate::host_blocks;
use crate::placement::GuestRam;
use crate::report::{Phase, PublishedLevels, Sample};
use crate::settings::Settings;
use crate::vtismd;
use anyhow::{bail, Context};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug)]
pub struct ProbeArgs {
    /// The nested QEMU's QMP socket reserved for the probe.
    #[arg(long)]
    pub qmp: PathBuf,
    /// vtismd's control socket.
    #[arg(long)]
    pub control_socket: PathBuf,
    /// The nested guest's serial console log.
    #[arg(long)]
    pub console: PathBuf,
    /// Where the samples go (JSON lines).
    #[arg(long)]
    pub samples: PathBuf,
    /// The run's settings (testbed.env).
    #[arg(long)]
    pub settings: PathBuf,
    #[arg(long, value_delimiter = ',', default_value = "0,1")]
    pub dram_nodes: Vec<i32>,
    #[arg(long, value_delimiter = ',', default_value = "2,3")]
    pub slow_nodes: Vec<i32>,
    /// The VM's name in vtismd.
    #[arg(long, default_value = "guest")]
    pub vm: String,
    #[arg(long, default_value_t = 1000)]
    pub period_ms: u64,
    /// The guest's channel file: the published levels go into the samples (`levels`).
    #[arg(long)]
    pub channel: Option<PathBuf>,
}

/// What the guest said on its console so far.
#[derive(Default)]
struct Console {
    truth: GupsTruth,
    module_loaded: bool,
    error: Option<String>,
    booted: Option<String>,
}

impl Console {
    fn line(&mut self, line: &str) {
        if self.truth.feed(line) {
            return;
        }
        let tag = line.split_whitespace().next().unwrap_or("");
        match tag {
            "TBMOD" => self.module_loaded = true,
            "TBBOOT" => self.booted = Some(line[6..].trim().to_string()),
            "TBERR" => self.error = Some(line[5..].trim().to_string()),
            _ => {}
        }
    }
}

/// The guest's RAM, and which entries are the workload's hot and cold frames (the hot set in
/// force: after a move, the new one).
struct Layout {
    ram: GuestRam,
    hot: Vec<usize>,
    cold: Vec<usize>,
    next: Vec<usize>,
    /// The hot set before the last move.
    old_hot: Vec<usize>,
    generation: u32,
}

fn layout(qmp: &Path, c: &Console) -> anyhow::Result<Layout> {
    let ram = GuestRam::from_qmp(qmp)?;
    Ok(Layout {
        hot: ram.indices(&c.truth.hot)?,
        cold: ram.indices(&c.truth.cold)?,
        next: ram.indices(&c.truth.next)?,
        old_hot: Vec::new(),
        ram,
        generation: 0,
    })
}

impl Layout {
    /// The hot set moved: the new one is hot, every other frame of the workload cold.
    fn move_hot_set(&mut self) {
        let next: std::collections::BTreeSet<usize> = self.next.iter().copied().collect();
        let mut all: Vec<usize> = self.hot.iter().chain(&self.cold).copied().collect();
        all.sort_unstable();
        self.cold = all.into_iter().filter(|i| !next.contains(i)).collect();
        self.old_hot = std::mem::replace(&mut self.hot, std::mem::take(&mut self.next));
        self.generation += 1;
    }
}

/// Where every guest frame is, read while vtismd moves no page when it can be: its several
/// move_pages(2) calls are one moment only then. Up to `TRIES` reads, each bracketed by two
/// answers of vtismd's status (nothing in flight, the same plans done); the last read's status
/// and whether it was settled. The status is what vtismd published at the end of its last
/// round, after submitting that round's plan: only a read ending between a submission and its
/// status being published (well under a millisecond) passes for settled while pages move.
fn settled_placement(
    l: &Layout,
    sock: &Path,
    vm: &str,
) -> anyhow::Result<(Vec<i32>, Option<serde_json::Value>, bool)> {
    const TRIES: u32 = 5;
    let mut tries = 0;
    loop {
        tries += 1;
        let (_, before) = vtismd::status_and_mover(sock, vm);
        let nodes = l.ram.nodes()?;
        let (st, after) = vtismd::status_and_mover(sock, vm);
        let settled = before.is_some_and(|b| !b.busy && Some(b) == after);
        if settled || tries == TRIES {
            return Ok((nodes, st, settled));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn mib(b: u64) -> f64 {
    b as f64 / (1u64 << 20) as f64
}

pub fn probe(a: ProbeArgs) -> anyhow::Result<()> {
    let settings = Settings::from_env(
        &std::fs::read_to_string(&a.settings).with_context(|| a.settings.display().to_string())?,
    )?;
    let mut out =
        std::fs::File::create(&a.samples).with_context(|| a.samples.display().to_string())?;
    let mut tail = ConsoleTail::new(&a.console);
    let mut con = Console::default();
    let start = Instant::now();
    let mut ready_at: Option<Instant> = None;
    let mut loaded_at: Option<f64> = None;
    let mut reached_at: Option<f64> = None;
    let mut moved_at: Option<f64> = None;
    // The same two moments on the workload's clock (Sample::clock_s).
    let (mut loaded_at_clock, mut moved_at_clock): (Option<f64>, Option<f64>) = (None, None);
    let mut warm_noted = false;
    let mut layout_: Option<Layout> = None;
    let mut last_note = 0u64;
    // The workload's last report (its clock, ms) and when it came (the probe's clock, s).
    let mut last_report: (Option<u64>, f64) = (None, 0.0);
    // frames on DRAM per host block at the last sample with levels (--capture-levels)
    let mut blocks_before = std::collections::BTreeMap::new();
    let period = Duration::from_millis(a.period_ms);
    loop {
        std::thread::sleep(period);
        for line in tail.poll()? {
            con.line(&line);
        }
        if let Some(e) = &con.error {
            bail!("the guest reported: {e}");
        }
        let Some(t0) = ready_at else {
            let waited = start.elapsed().as_secs();
            if con.truth.ready {
                println!(
                    "TB nested guest up after {waited} s ({}); workload ready: {} hot + {} cold frames; control phase ({} s, no tracker)",
                    con.booted.as_deref().unwrap_or("?"),
                    GupsTruth::frames(&con.truth.hot),
                    GupsTruth::frames(&con.truth.cold),
                    settings.control_s
                );
                let room = (settings.quota_mib / 2).saturating_sub(1) as usize;
                println!(
                    "TB {}",
                    host_blocks::describe("hot set", &con.truth.hot, room)
                );
                if !con.truth.next.is_empty() {
                    let next =
                        host_blocks::describe("the hot set after the move", &con.truth.next, room);
                    println!("TB {next}");
                }
                layout_ = Some(layout(&a.qmp, &con)?);
                ready_at = Some(Instant::now());
            } else if waited >= settings.boot_limit_s {
                bail!("the nested guest did not get its workload ready within {waited} s");
            } else if waited >= last_note + 15 {
                last_note = waited;
                println!(
                    "TB waiting for the nested guest: {waited} s{}",
                    if con.booted.is_some() {
                        " (kernel up, workload populating its memory)"
                    } else {
                        ""
                    }
                );
            }
            continue;
        };
        let t = t0.elapsed().as_secs_f64();
        let l = layout_.as_mut().expect("layout is set with ready_at");
        if con.truth.moved_at_ms.is_some() && moved_at.is_none() {
            l.move_hot_set();
            moved_at = Some(t);
            reached_at = None;
            println!("TB the workload's hot set moved at {t:.0} s");
        }
        if con.truth.warm_at_ms.is_some() && !warm_noted {
            warm_noted = true;
            println!("TB the workload's warm background started at {t:.0} s");
        }
        let (nodes, st, settled) = settled_placement(l, &a.control_socket, &a.vm)?;
        let on = |set: &[i32], i: usize| set.contains(&nodes[i]);
        // The guest announces the module before insmod, whose first round vtismd may take
        // while this sample is read: the console is read again after the status, so that a
        // sample holding that round is the tracking phase's, not the control phase's.
        for line in tail.poll()? {
            con.line(&line);
        }
        if con.module_loaded && loaded_at.is_none() {
            loaded_at = Some(t);
            println!("TB tracker module loaded at {t:.0} s: tracking phase");
        }
        let known = |k: &str| st.as_ref().and_then(|v| v[k].as_u64());
        let field = |k: &str| known(k).unwrap_or(0);
        let s = Sample {
            t_s: t,
            workload_s: con.truth.rate.map(|r| r.ms as f64 / 1e3),
            phase: if loaded_at.is_some() {
                Phase::Tracking
            } else {
                Phase::Control
            },
            rounds_accepted: field("rounds_accepted"),
            last_round: field("last_round"),
            hint_entries: field("last_round_entries"),
            promoted_bytes: field("promoted_bytes"),
            demoted_bytes: field("demoted_bytes"),
            hot_frames: l.hot.len() as u64,
            hot_dram_frames: l.hot.iter().filter(|&&i| on(&a.dram_nodes, i)).count() as u64,
            cold_frames: l.cold.len() as u64,
            cold_slow_frames: l.cold.iter().filter(|&&i| on(&a.slow_nodes, i)).count() as u64,
            guest_dram_bytes: nodes.iter().filter(|n| a.dram_nodes.contains(n)).count() as u64
                * 4096,
            quota_bytes: if st.is_some() {
                field("quota_bytes")
            } else {
                settings.quota_mib << 20
            },
            updates_per_s: con.truth.rate.map(|r| r.updates_per_s),
            hot_set_moves: l.generation,
            warm: settings.warm_after_s == 0 || con.truth.warm_at_ms.is_some(),
            hot_dram_by_2mib: l
                .hot
                .chunks(512)
                .map(|c| c.iter().filter(|&&i| on(&a.dram_nodes, i)).count() as u16)
                .collect(),
            tracker_window_us: known("tracker_window_us"),
            tracker_coarse_window_us: known("tracker_coarse_window_us"),
            tracker_cpu_us: known("tracker_cpu_us"),
            levels: a
                .channel
                .as_deref()
                .and_then(|c| published_levels(c, l, &nodes, &a.dram_nodes, &mut blocks_before)),
            placement_settled: Some(settled),
            left_out: st
                .as_ref()
                .and_then(|v| serde_json::from_value(v["left_out"].clone()).ok()),
        };
        writeln!(out, "{}", serde_json::to_string(&s)?)?;
        println!(
            "TB [{t:5.0}s] {:<8} round {:>4}  hints {:>6}  promoted {:>6.1} MiB  demoted {:>6.1} MiB  hot set in DRAM {:>5.1}%  DRAM {:>5.1}/{:.0} MiB{}  GUPS {}{}",
            if s.phase == Phase::Tracking { "tracking" } else { "control" },
            s.last_round,
            s.hint_entries,
            mib(s.promoted_bytes),
            mib(s.demoted_bytes),
            100.0 * s.hot_dram_share(),
            mib(s.guest_dram_bytes),
            mib(s.quota_bytes),
            if settled { "" } else { " (pages moving)" },
            s.updates_per_s.map_or("-".into(), |u| format!("{:.2} M/s", u as f64 / 1e6)),
            left_out_note(s.left_out.as_ref()),
        );
        if loaded_at_clock.is_none() && loaded_at.is_some() {
            loaded_at_clock = Some(s.clock_s());
        }
        if moved_at_clock.is_none() && moved_at.is_some() {
            moved_at_clock = Some(s.clock_s());
        }
        if let Some(lc) = loaded_at_clock {
            // The hot set still to move keeps the run going; after the move the new hot set gets
            // the tracking limit again, on the workload's clock as the checks count it.
            let move_pending = settings.move_after_s > 0 && moved_at.is_none();
            let since_clock = moved_at_clock.map_or(lc, |m| m.max(lc));
            if reached_at.is_none() && s.hot_dram_share() >= settings.target_share {
                reached_at = Some(t);
                println!(
                    "TB {:.0}% of the hot set is in DRAM, {:.0} s of the workload's clock after \
                     the {}; holding {} s",
                    100.0 * settings.target_share,
                    s.clock_s() - since_clock,
                    if moved_at.is_some() {
                        "move"
                    } else {
                        "tracker loaded"
                    },
                    settings.hold_s
                );
            }
            if !move_pending && reached_at.is_some_and(|r| t - r >= settings.hold_s as f64) {
                return Ok(());
            }
            if !move_pending
                && s.clock_s() - since_clock >= (settings.track_limit_s + settings.hold_s) as f64
            {
                println!("TB tracking limit reached ({} s)", settings.track_limit_s);
                return Ok(());
            }
            let workload_ms = con.truth.rate.map(|r| r.ms);
            if settings.warm_after_s > 0
                && con.truth.warm_at_ms.is_none()
                && overdue(workload_ms, settings.warm_after_s)
            {
                bail!(
                    "the workload's warm background did not start {:.0} s into its run (due at {} s)",
                    workload_ms.unwrap_or(0) as f64 / 1e3,
                    settings.warm_after_s
                );
            }
            if move_pending && overdue(workload_ms, settings.move_after_s) {
                bail!(
                    "the workload's hot set did not move {:.0} s into its run (due at {} s)",
                    workload_ms.unwrap_or(0) as f64 / 1e3,
                    settings.move_after_s
                );
            }
            if workload_ms != last_report.0 {
                last_report = (workload_ms, t);
            } else if t - last_report.1 >= WORKLOAD_SILENT_S {
                bail!(
                    "the workload has reported nothing for {WORKLOAD_SILENT_S:.0} s (its last report: {:.0} s into its run)",
                    workload_ms.unwrap_or(0) as f64 / 1e3
                );
            }
        } else if t >= (settings.control_s + 300) as f64 {
            bail!("the tracker module was not loaded {t:.0} s into the run");
        }
    }
}

/// The published level of every guest frame in the channel's current round (0: not published),
/// or None when the channel holds no valid round.
fn frame_levels(channel: &Path, ram: &GuestRam) -> Option<(u64, Vec<u8>)> {
    let bytes = std::fs::read(channel).ok()?;
    let region = vtism_proto::OwnedRegion::from_bytes(&bytes);
    let round = vtism_proto::ChannelReader::new()
        .read(&region, ram.ram_map())
        .ok()??;
    let mut lv = vec![0u8; ram.frames()];
    for e in &round.entries {
        let Some(first) = ram.index_of(e.gfn()) else {
            continue;
        };
        for i in first..(first + e.frames() as usize).min(lv.len()) {
            lv[i] = lv[i].max(e.count());
        }
    }
    Some((round.round, lv))
}

fn median(mut v: Vec<u8>) -> u8 {
    if v.is_empty() {
        return 0;
    }
    v.sort_unstable();
    v[v.len() / 2]
}

/// What the guest published, as the engine sees it: the hot set's levels per 2 MiB of its range,
/// and which frames hold the rest of the DRAM at what levels.
fn published_levels(
    channel: &Path,
    l: &Layout,
    nodes: &[i32],
    dram: &[i32],
    blocks_before: &mut std::collections::BTreeMap<u64, u16>,
) -> Option<PublishedLevels> {
    let (round, lv) = frame_levels(channel, &l.ram)?;
    let hot: std::collections::HashSet<usize> = l.hot.iter().copied().collect();
    let on_dram = |i: usize| dram.contains(&nodes[i]);
    let (blocks_now, moved_blocks) = host_blocks::moved_blocks(
        lv.len(),
        |i| l.ram.hva(i).map(|h| h.0),
        on_dram,
        &lv,
        &hot,
        blocks_before,
    );
    *blocks_before = blocks_now;
    let old: std::collections::HashSet<usize> = l.old_hot.iter().copied().collect();
    let others: Vec<usize> = (0..lv.len())
        .filter(|&i| on_dram(i) && !hot.contains(&i))
        .collect();
    let mut outside: Vec<u8> = (0..lv.len())
        .filter(|&i| !on_dram(i) && !hot.contains(&i))
        .map(|i| lv[i])
        .collect();
    outside.sort_unstable_by(|a, b| b.cmp(a));
    let per_2mib = |frames: &[usize]| -> Vec<u8> {
        frames
            .chunks(512)
            .map(|c| median(c.iter().map(|&i| lv[i]).collect()))
            .collect()
    };
    Some(PublishedLevels {
        round,
        hot_by_2mib: per_2mib(&l.hot),
        old_hot_by_2mib: per_2mib(&l.old_hot),
        hot_off_dram: median(
            l.hot
                .iter()
                .filter(|&&i| !on_dram(i))
                .map(|&i| lv[i])
                .collect(),
        ),
        dram_others: others.len() as u64,
        dram_others_old_hot: others.iter().filter(|i| old.contains(i)).count() as u64,
        dram_others_median: median(others.iter().map(|&i| lv[i]).collect()),
        off_dram_top512: outside.get(511).copied().unwrap_or(0),
        moved_blocks,
    })
}

/// The workload reports its clock once a second (TBTPUT); silent this long, it has stopped.
const WORKLOAD_SILENT_S: f64 = 120.0;

/// Whether the workload's clock (ms since it was ready, its last report) is a minute past `due_s`:
/// it should have acted by then. Deadlines on the workload's own clock: the nested guest's clock
/// counts instructions, and on a loaded host it runs at half the wall clock's speed or less
/// (a control phase of 45 s lasted 85 s), so a wall-clock deadline failed runs that were fine.
fn overdue(workload_ms: Option<u64>, due_s: u64) -> bool {
    workload_ms.is_some_and(|ms| ms >= (due_s + 60) * 1000)
}

/// What vtismd's last plan held back from DRAM, when it held anything.
fn left_out_note(l: Option<&vtism_host::metrics::LeftOut>) -> String {
    let parts: Vec<String> = l
        .map(|l| l.by_reason())
        .into_iter()
        .flatten()
        .filter(|(_, b)| *b > 0)
        .map(|(r, b)| format!("{r} {:.1}", mib(b)))
        .collect();
    if parts.is_empty() {
        String::new()
    } else {
        format!("  left out (MiB): {}", parts.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn console_lines() {
        let mut c = Console::default();
        for l in [
            "TBBOOT 6.12 x",
            "TBHOT 100 4",
            "TBREADY hot=4 cold=0",
            "TBMOD loaded 3000",
        ] {
            c.line(l);
        }
        assert!(c.truth.ready && c.module_loaded);
        assert_eq!(c.booted.as_deref(), Some("6.12 x"));
        let mut c = Console::default();
        c.line("TBERR insmod failed");
        assert_eq!(c.error.as_deref(), Some("insmod failed"));
    }

    #[test]
    fn deadlines_run_on_the_workloads_clock() {
        // Due at 90 s: not overdue until the workload's own clock is a minute past it, however
        // long the wall clock has run.
        assert!(!overdue(None, 90));
        assert!(!overdue(Some(149_999), 90));
        assert!(overdue(Some(150_000), 90));
    }
}
