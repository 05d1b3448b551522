//! The driver: prepares the images (testbed/prepare.sh), boots the emulated host under QEMU,
//! streams its progress lines, and reports from the probe's samples.

use crate::cli::HostThp;
use crate::emulated_host::{self, pick_accel};
use crate::report;
use crate::settings::Settings;
use anyhow::Context;
use std::path::PathBuf;
use std::time::Duration;

pub struct RunOptions {
    pub repo: PathBuf,
    pub out: PathBuf,
    pub settings: Settings,
    pub check: bool,
    pub accel: String,
    /// The probe records the guest's published levels (`--capture-levels`).
    pub capture_levels: bool,
    pub host_thp: HostThp,
}

pub fn run(o: RunOptions) -> anyhow::Result<bool> {
    o.settings.validate()?;
    std::fs::create_dir_all(&o.out).with_context(|| o.out.display().to_string())?;
    let out = o.out.canonicalize()?;
    println!("== preparing images (kernel, module, workload, initramfs) under build/testbed/");
    let images = emulated_host::prepare(&o.repo, &[])?;
    let bin = std::env::current_exe()?;
    let extra = [
        ("BIN", bin.display().to_string()),
        ("VMLINUZ", images.vmlinuz.clone()),
        ("GUEST_KERNEL", images.guest_kernel.clone()),
        ("GUEST_INITRD", images.guest_initrd.clone()),
        ("CAPTURE_LEVELS", u8::from(o.capture_levels).to_string()),
        ("HOST_THP", o.host_thp.env_value().to_string()),
    ];
    std::fs::write(out.join("testbed.env"), o.settings.to_env(&extra))?;
    let _ = std::fs::remove_file(out.join("samples.jsonl"));
    if o.accel == "auto" {
        println!("== checking whether KVM really works here (up to 15 s)");
    }
    let accel = pick_accel(&o.accel, &images.vmlinuz);
    let s = &o.settings;
    println!(
        "== booting the emulated host ({accel}; 2 sockets: DRAM nodes 0-1, CXL nodes 2-3; kernel {})",
        images.kver
    );
    println!(
        "   then a nested guest ({} MiB, GUPS {} MiB with a {} MiB hot set, DRAM quota {} MiB): \
         {} s without the tracker, then with it. Results: {}",
        s.guest_mib,
        s.work_mib,
        s.hot_mib,
        s.quota_mib,
        s.control_s,
        out.display()
    );
    let args = emulated_host::host_args(
        &accel,
        &images,
        &o.repo.join("testbed/inner.sh"),
        &o.repo,
        &out,
    );
    let finished = emulated_host::boot(&args, &out, Duration::from_secs(s.run_limit_s()))?;
    if !finished {
        eprintln!(
            "testbed: the run inside the emulated host did not finish; its console: {}",
            out.join("console.log").display()
        );
    }

    let samples = report::read_samples(&out.join("samples.jsonl")).unwrap_or_default();
    let summary = report::summary(s, &samples);
    let plots = report::plot(&samples, &out)?;
    let checks = report::checks(s, &samples);
    let mut md = format!("# vtism testbed run\n\n```\n{summary}```\n\n## Checks\n\n");
    for c in &checks {
        md.push_str(&format!(
            "- {} {}: {}\n",
            if c.ok { "PASS" } else { "FAIL" },
            c.name,
            c.detail
        ));
    }
    md.push('\n');
    for p in &plots {
        md.push_str(&format!("![{p}]({p})\n\n"));
    }
    std::fs::write(out.join("report.md"), md)?;
    println!("== summary\n{summary}");
    for c in &checks {
        println!(
            "{} {}: {}",
            if c.ok { "PASS" } else { "FAIL" },
            c.name,
            c.detail
        );
    }
    println!(
        "== report: {} (plots: {})",
        out.join("report.md").display(),
        plots.join(", ")
    );
    let ok = finished && checks.iter().all(|c| c.ok);
    if o.check {
        let passed = checks.iter().filter(|c| c.ok).count();
        println!(
            "{} passed, {} failed",
            passed,
            checks.len() - passed + usize::from(!finished)
        );
    }
    Ok(ok)
}
