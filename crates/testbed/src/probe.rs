//! `vtism testbed probe`, inside the emulated host: follows the nested guest's console for the
//! workload's ground truth, throughput and the tracker's load; samples where each guest frame
//! lives (QMP for guest-physical to host-virtual, move_pages(2) for the node) and what vtismd
//! reports (control socket). Writes one [`Sample`] per period and a "TB ..." progress line.

use crate::report::{Phase, Sample};
use crate::settings::Settings;
use anyhow::{bail, Context};
use std::io::{BufReader, Read, Seek, SeekFrom, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use vtism_host::{qmp::Qmp, sys, vm};
use vtism_proto::{Gfn, Hva};

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
}

/// What the guest said on its console so far.
#[derive(Default)]
struct Console {
    offset: u64,
    partial: String,
    hot: Vec<(u64, u64)>,
    cold: Vec<(u64, u64)>,
    ready: bool,
    module_loaded: bool,
    updates_per_s: Option<u64>,
    error: Option<String>,
    booted: Option<String>,
    /// The last kernel or init line, to show where a slow boot is.
    last_other: String,
}

impl Console {
    fn poll(&mut self, path: &Path) -> anyhow::Result<()> {
        let mut f = match std::fs::File::open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e).context(path.display().to_string()),
        };
        f.seek(SeekFrom::Start(self.offset))?;
        let mut buf = Vec::new();
        f.read_to_end(&mut buf)?;
        self.offset += buf.len() as u64;
        self.partial.push_str(&String::from_utf8_lossy(&buf));
        while let Some(nl) = self.partial.find('\n') {
            let line: String = self.partial.drain(..=nl).collect();
            self.line(line.trim_end_matches(['\r', '\n']));
        }
        Ok(())
    }

    fn line(&mut self, line: &str) {
        let mut w = line.split_whitespace();
        let tag = w.next().unwrap_or("");
        let mut run =
            || -> Option<(u64, u64)> { Some((w.next()?.parse().ok()?, w.next()?.parse().ok()?)) };
        match tag {
            "TBHOT" if !self.ready => self.hot.extend(run()),
            "TBCOLD" if !self.ready => self.cold.extend(run()),
            "TBREADY" => self.ready = true,
            "TBMOD" => self.module_loaded = true,
            "TBTPUT" => self.updates_per_s = run().map(|(_, u)| u),
            "TBBOOT" => self.booted = Some(line[6..].trim().to_string()),
            "TBERR" => self.error = Some(line[5..].trim().to_string()),
            t if !t.starts_with("TB") && !line.trim().is_empty() => {
                self.last_other = line.trim().chars().take(100).collect()
            }
            _ => {}
        }
    }
}

/// The guest's RAM as host addresses, and which entries are the workload's hot and cold frames.
struct Layout {
    pid: i32,
    hvas: Vec<Hva>,
    hot: Vec<usize>,
    cold: Vec<usize>,
}

fn layout(qmp: &Path, c: &Console) -> anyhow::Result<Layout> {
    let mut q = Qmp::connect(qmp, Duration::from_secs(20)).context("probe QMP")?;
    let info = vm::inspect(&mut q).context("inspecting the nested QEMU")?;
    let mem = &info.memory;
    let mut hvas = Vec::with_capacity(mem.ram.frames() as usize);
    for r in &mem.ranges {
        for g in r.gfns.start.0..r.gfns.end.0 {
            hvas.push(mem.hva(Gfn(g)).context("gfn without hva")?);
        }
    }
    let index = |runs: &[(u64, u64)]| -> anyhow::Result<Vec<usize>> {
        let mut v = Vec::new();
        for &(g, n) in runs {
            for k in g..g + n {
                v.push(mem.ram.index_of(Gfn(k)).with_context(|| {
                    format!("the workload's frame {k:#x} is not guest RAM per QMP")
                })? as usize);
            }
        }
        Ok(v)
    };
    Ok(Layout {
        pid: info.pid,
        hvas,
        hot: index(&c.hot)?,
        cold: index(&c.cold)?,
    })
}

fn nodes_of(l: &Layout) -> anyhow::Result<Vec<i32>> {
    let mut status = vec![0i32; l.hvas.len()];
    for (a, s) in l.hvas.chunks(65536).zip(status.chunks_mut(65536)) {
        sys::move_pages(l.pid, a, None, s, 0).context("move_pages query")?;
    }
    Ok(status)
}

fn daemon_status(sock: &Path, name: &str) -> Option<serde_json::Value> {
    let mut s = UnixStream::connect(sock).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(3))).ok()?;
    s.write_all(b"status\n").ok()?;
    let mut text = String::new();
    BufReader::new(s).read_to_string(&mut text).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    v["vms"]
        .as_array()?
        .iter()
        .find(|x| x["name"] == name)
        .cloned()
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
    let mut con = Console::default();
    let start = Instant::now();
    let mut ready_at: Option<Instant> = None;
    let mut loaded_at: Option<f64> = None;
    let mut reached_at: Option<f64> = None;
    let mut layout_: Option<Layout> = None;
    let mut last_note = 0u64;
    let period = Duration::from_millis(a.period_ms);
    loop {
        std::thread::sleep(period);
        con.poll(&a.console)?;
        if let Some(e) = &con.error {
            bail!("the guest reported: {e}");
        }
        let Some(t0) = ready_at else {
            let waited = start.elapsed().as_secs();
            if con.ready {
                println!(
                    "TB nested guest up after {waited} s ({}); workload ready: {} hot + {} cold frames; control phase ({} s, no tracker)",
                    con.booted.as_deref().unwrap_or("?"),
                    con.hot.iter().map(|r| r.1).sum::<u64>(),
                    con.cold.iter().map(|r| r.1).sum::<u64>(),
                    settings.control_s
                );
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
        if con.module_loaded && loaded_at.is_none() {
            loaded_at = Some(t);
            println!("TB tracker module loaded at {t:.0} s: tracking phase");
        }
        let l = layout_.as_ref().expect("layout is set with ready_at");
        let nodes = nodes_of(l)?;
        let on = |set: &[i32], i: usize| set.contains(&nodes[i]);
        let st = daemon_status(&a.control_socket, &a.vm);
        let field = |k: &str| st.as_ref().and_then(|v| v[k].as_u64()).unwrap_or(0);
        let s = Sample {
            t_s: t,
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
            updates_per_s: con.updates_per_s,
        };
        writeln!(out, "{}", serde_json::to_string(&s)?)?;
        println!(
            "TB [{t:5.0}s] {:<8} round {:>4}  hints {:>6}  promoted {:>6.1} MiB  demoted {:>6.1} MiB  hot set in DRAM {:>5.1}%  DRAM {:>5.1}/{:.0} MiB  GUPS {}",
            if s.phase == Phase::Tracking { "tracking" } else { "control" },
            s.last_round,
            s.hint_entries,
            mib(s.promoted_bytes),
            mib(s.demoted_bytes),
            100.0 * s.hot_dram_share(),
            mib(s.guest_dram_bytes),
            mib(s.quota_bytes),
            s.updates_per_s.map_or("-".into(), |u| format!("{:.2} M/s", u as f64 / 1e6)),
        );
        if let Some(lt) = loaded_at {
            if reached_at.is_none() && s.hot_dram_share() >= settings.target_share {
                reached_at = Some(t);
                println!(
                    "TB {:.0}% of the hot set is in DRAM, {:.0} s after the tracker loaded; holding {} s",
                    100.0 * settings.target_share,
                    t - lt,
                    settings.hold_s
                );
            }
            if reached_at.is_some_and(|r| t - r >= settings.hold_s as f64) {
                return Ok(());
            }
            if t - lt >= (settings.track_limit_s + settings.hold_s) as f64 {
                println!("TB tracking limit reached ({} s)", settings.track_limit_s);
                return Ok(());
            }
        } else if t >= (settings.control_s + 300) as f64 {
            bail!("the tracker module was not loaded {t:.0} s into the run");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn console_lines_split_across_reads() {
        let dir = std::env::temp_dir().join(format!("vtism-probe-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("console.log");
        let mut c = Console::default();
        std::fs::write(&p, "TBBOOT 6.12 x\r\nTBHOT 100 4\nTBCOLD 200 8\nTBHO").unwrap();
        c.poll(&p).unwrap();
        assert_eq!(
            (c.hot.clone(), c.cold.clone()),
            (vec![(100, 4)], vec![(200, 8)])
        );
        let mut f = std::fs::OpenOptions::new().append(true).open(&p).unwrap();
        f.write_all(
            b"T 104 2\nTBREADY hot=6 cold=8\nTBHOT 1 1\nTBTPUT 1000 5000\nTBMOD loaded 3000\n",
        )
        .unwrap();
        c.poll(&p).unwrap();
        assert_eq!(
            c.hot,
            vec![(100, 4), (104, 2)],
            "a run after TBREADY is ignored"
        );
        assert!(c.ready && c.module_loaded);
        assert_eq!(c.updates_per_s, Some(5000));
        assert_eq!(c.booted.as_deref(), Some("6.12 x"));
        std::fs::write(&p, "").unwrap();
        let mut c = Console::default();
        std::fs::write(&p, "TBERR insmod failed\n").unwrap();
        c.poll(&p).unwrap();
        assert_eq!(c.error.as_deref(), Some("insmod failed"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
