//! `vtism bakeoff` on this machine: prepares the images, boots the emulated host once per
//! workload (its conductor runs every manager in turn), then writes the report.

use crate::plan::{Plan, VtismSettings, Workload};
use crate::report;
use anyhow::Context;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use vtism_testbed::emulated_host;

pub struct RunOptions {
    pub repo: PathBuf,
    /// Raw results: one directory per workload.
    pub out: PathBuf,
    /// docs/bakeoff.md to write (None: leave the docs alone).
    pub docs: Option<PathBuf>,
    pub workloads: Vec<Workload>,
    pub accel: String,
    /// Assert the smoke checks (crate::checks) on every workload's runs.
    pub check: bool,
}

/// Seconds to allow one boot, a backstop only (the conductor inside decides when its nested
/// guest is hung and restarts it): the nested guest's boot, then per manager the workload's setup,
/// the run and the ending, each several times slower on a loaded machine, and room for one
/// restart of the nested guest.
fn boot_limit(w: &Workload) -> Duration {
    Duration::from_secs(3600 + w.managers.len() as u64 * (w.run_s + 2400))
}

/// Samples this machine's 1-minute load average every 30 s into `path` (one "<s> <load>" line
/// each) until `stop` is set: the report states the load each workload ran under.
fn sample_load(
    path: PathBuf,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        use std::io::Write as _;
        let start = Instant::now();
        let Ok(mut f) = std::fs::File::create(&path) else {
            return;
        };
        let mut next = Duration::ZERO;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            if start.elapsed() >= next {
                next += Duration::from_secs(30);
                if let Some(l) = std::fs::read_to_string("/proc/loadavg")
                    .ok()
                    .and_then(|s| s.split_whitespace().next().map(str::to_string))
                {
                    let _ = writeln!(f, "{:.0} {l}", start.elapsed().as_secs_f64());
                }
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    })
}

pub fn run(o: RunOptions) -> anyhow::Result<()> {
    std::fs::create_dir_all(&o.out).with_context(|| o.out.display().to_string())?;
    let out = o.out.canonicalize()?;
    let bin = std::env::current_exe()?;
    println!("== preparing images (kernel, module, GUPS, redis, the TCG plugin, initramfs) under build/testbed/");
    let images = emulated_host::prepare(&o.repo, &["--bakeoff", &bin.display().to_string()])?;
    if o.accel == "auto" {
        println!("== checking whether KVM really works here (up to 15 s)");
    }
    let accel = emulated_host::pick_accel(&o.accel, &images.vmlinuz);
    let mut failed = Vec::new();
    for w in &o.workloads {
        w.validate()?;
        let dir = out.join(&w.name);
        std::fs::create_dir_all(&dir)?;
        for e in std::fs::read_dir(&dir)? {
            let p = e?.path();
            if p.extension().is_some_and(|x| x == "json") {
                std::fs::remove_file(p)?;
            }
        }
        let plan = Plan {
            workload: w.clone(),
            vtism: VtismSettings::default(),
            bin: bin.clone(),
            guest_kernel: images.guest_kernel.clone().into(),
            guest_initrd: images.get("BAKEOFF_GUEST_INITRD")?.into(),
            plugin: Some(images.get("PLUGIN")?.into()),
            sample_ms: 1000,
        };
        std::fs::write(dir.join("plan.json"), serde_json::to_string_pretty(&plan)?)?;
        std::fs::write(dir.join("bakeoff.env"), format!("BIN={}\n", bin.display()))?;
        println!(
            "== {}: booting the emulated host ({accel}, kernel {}), then the nested guest once; managers in turn: {}",
            w.name,
            images.kver,
            w.managers.iter().map(|m| m.name()).collect::<Vec<_>>().join(", ")
        );
        let args = emulated_host::host_args(
            &accel,
            &images,
            &o.repo.join("testbed/bakeoff-inner.sh"),
            &o.repo,
            &dir,
        );
        let t = Instant::now();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let sampler = sample_load(dir.join("loadavg"), stop.clone());
        let finished = emulated_host::boot(&args, &dir, boot_limit(w));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let _ = sampler.join();
        let finished = finished?;
        let wall = t.elapsed().as_secs_f64();
        std::fs::write(dir.join("wall_s"), format!("{wall:.0}\n"))?;
        println!(
            "== {}: {:.0} s{}",
            w.name,
            wall,
            if finished { "" } else { " (did not finish)" }
        );
        if !finished {
            failed.push(w.name.clone());
        }
    }
    // The whole bake-off's time is the sum of its workloads' (report::read_runs), which may have
    // run in separate invocations into the same results directory.
    if let Some(md) = &o.docs {
        write_docs(&out, md)?;
    }
    if o.check {
        let (mut passed, mut failures) = (0, failed.len());
        for w in &o.workloads {
            let records: Vec<_> = w
                .managers
                .iter()
                .filter_map(|m| {
                    crate::record::RunRecord::read(
                        &out.join(&w.name).join(format!("{}.run.json", m.name())),
                    )
                    .ok()
                })
                .collect();
            for c in crate::checks::checks(&records, &w.managers, w.run_s) {
                println!(
                    "{} {}/{}: {}",
                    if c.ok { "PASS" } else { "FAIL" },
                    w.name,
                    c.name,
                    c.detail
                );
                if c.ok {
                    passed += 1;
                } else {
                    failures += 1;
                }
            }
        }
        println!("{passed} passed, {failures} failed");
        if failures > 0 {
            anyhow::bail!("the bake-off's checks failed (see above)");
        }
    }
    if !failed.is_empty() {
        anyhow::bail!("the emulated host did not finish: {}", failed.join(", "));
    }
    Ok(())
}

/// Writes docs/bakeoff.md, results.json and plots from a results directory.
pub fn write_docs(runs_dir: &Path, md: &Path) -> anyhow::Result<()> {
    let runs = report::read_runs(runs_dir)?;
    if runs.is_empty() {
        anyhow::bail!(
            "{}: no workload results (plan.json) found",
            runs_dir.display()
        );
    }
    report::write(&runs, md)?;
    println!(
        "== report: {} (results.json and plots in {})",
        md.display(),
        md.with_extension("").display()
    );
    Ok(())
}
