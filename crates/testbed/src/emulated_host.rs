//! The emulated DRAM+CXL host that `vtism testbed` and `vtism bakeoff` boot: the images
//! (testbed/prepare.sh), QEMU's arguments (two sockets, each a DRAM node and a CPU-less "CXL"
//! node that HMAT marks as slower; this machine's root over virtfs, read-only), and the boot that
//! streams the host script's "TB" progress lines.

use anyhow::{bail, Context};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The repository: `--repo`, else the one this binary was built in (target/<profile>/vtism),
/// else the current directory.
pub fn find_repo(explicit: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    let is_repo = |p: &Path| p.join("testbed/inner.sh").is_file();
    if let Some(p) = explicit {
        if is_repo(&p) {
            return Ok(p.canonicalize()?);
        }
        bail!(
            "{} is not a vtism repository (no testbed/inner.sh)",
            p.display()
        );
    }
    let exe = std::env::current_exe()?;
    for dir in exe.ancestors().chain(std::env::current_dir()?.ancestors()) {
        if is_repo(dir) {
            return Ok(dir.canonicalize()?);
        }
    }
    bail!("cannot find the vtism repository (testbed/inner.sh); run from it or pass --repo")
}

/// `kvm` only if /dev/kvm opens and a KVM guest really runs here (the kernel boots, panics
/// for want of an init and QEMU exits); TCG otherwise. Nested PVM hosts expose a /dev/kvm whose
/// guests hang, so its existence is not enough.
pub fn pick_accel(requested: &str, vmlinuz: &str) -> String {
    if requested != "auto" {
        return requested.to_string();
    }
    let opens = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .is_ok();
    let boots = || {
        Command::new("timeout")
            .args([
                "15",
                "qemu-system-x86_64",
                "-accel",
                "kvm",
                "-m",
                "256",
                "-kernel",
                vmlinuz,
            ])
            .args([
                "-append",
                "panic=-1 console=ttyS0",
                "-display",
                "none",
                "-nodefaults",
            ])
            .args(["-no-reboot", "-serial", "none"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if opens && boots() { "kvm" } else { "tcg" }.to_string()
}

/// What testbed/prepare.sh built: Debian's 6.12 kernel, the emulated host's and the nested
/// guest's initramfs.
#[derive(Clone, Debug)]
pub struct Images {
    pub kver: String,
    pub vmlinuz: String,
    /// The nested guest's kernel: the same one unpacked for QEMU's PVH boot where it can be.
    pub guest_kernel: String,
    pub host_initrd: String,
    pub guest_initrd: String,
    /// Every KEY=value line prepare.sh printed (the bake-off's extra images among them).
    pub all: Vec<(String, String)>,
}

impl Images {
    pub fn get(&self, k: &str) -> anyhow::Result<String> {
        self.all
            .iter()
            .find(|(a, _)| a == k)
            .map(|(_, v)| v.clone())
            .with_context(|| format!("testbed/prepare.sh did not print {k}"))
    }
}

/// Runs testbed/prepare.sh (idempotent) with `args` (e.g. `--bakeoff`).
pub fn prepare(repo: &Path, args: &[&str]) -> anyhow::Result<Images> {
    let all = prepare_env(repo, args)?;
    let mut images = Images {
        kver: String::new(),
        vmlinuz: String::new(),
        guest_kernel: String::new(),
        host_initrd: String::new(),
        guest_initrd: String::new(),
        all,
    };
    images.kver = images.get("KVER")?;
    images.vmlinuz = images.get("VMLINUZ")?;
    images.guest_kernel = images.get("GUEST_KERNEL")?;
    images.host_initrd = images.get("HOST_INITRD")?;
    images.guest_initrd = images.get("GUEST_INITRD")?;
    Ok(images)
}

fn prepare_env(repo: &Path, args: &[&str]) -> anyhow::Result<Vec<(String, String)>> {
    let out = Command::new(repo.join("testbed/prepare.sh"))
        .args(args)
        .stderr(Stdio::inherit())
        .output()
        .context("running testbed/prepare.sh")?;
    if !out.status.success() {
        bail!("testbed/prepare.sh failed ({})", out.status);
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect())
}

/// QEMU arguments of the emulated host: sockets 0 and 1 with a DRAM node each (nodes 0, 1) and a
/// CPU-less "CXL" node each (nodes 2, 3), which HMAT describes as slower.
pub fn host_args(accel: &str, images: &Images, run: &Path, repo: &Path, out: &Path) -> Vec<String> {
    let (vmlinuz, initrd) = (images.vmlinuz.as_str(), images.host_initrd.as_str());
    let mut a: Vec<String> = vec![
        "-accel".into(),
        if accel == "tcg" {
            "tcg,thread=multi".into()
        } else {
            accel.into()
        },
        "-machine".into(),
        "q35,hmat=on".into(),
        // No AVX: the nested QEMU's code generator uses AVX2 when the CPU has it, and under TCG
        // (QEMU 7.2) that corrupts the nested guest (it double-faults early in boot).
        "-cpu".into(),
        "max,avx=off,avx2=off".into(),
        "-smp".into(),
        "2,sockets=2".into(),
        "-m".into(),
        "4G".into(),
    ];
    for (i, cpus, init) in [
        (0, Some(0), None),
        (1, Some(1), None),
        (2, None, Some(0)),
        (3, None, Some(1)),
    ] {
        a.push("-object".into());
        a.push(format!("memory-backend-ram,size=1G,id=m{i}"));
        a.push("-numa".into());
        a.push(match (cpus, init) {
            (Some(c), _) => format!("node,nodeid={i},cpus={c},memdev=m{i}"),
            (None, Some(n)) => format!("node,nodeid={i},memdev=m{i},initiator={n}"),
            _ => unreachable!(),
        });
    }
    for (s, d, v) in [
        (0, 1, 21),
        (0, 2, 24),
        (0, 3, 34),
        (1, 2, 34),
        (1, 3, 24),
        (2, 3, 44),
    ] {
        a.push("-numa".into());
        a.push(format!("dist,src={s},dst={d},val={v}"));
    }
    // initiator, target, latency (ns), bandwidth
    let lb = [
        (0, 0, 10, "10G"),
        (0, 1, 20, "5G"),
        (0, 2, 80, "2G"),
        (0, 3, 110, "1G"),
        (1, 0, 20, "5G"),
        (1, 1, 10, "10G"),
        (1, 2, 110, "1G"),
        (1, 3, 80, "2G"),
    ];
    for (i, t, lat, bw) in lb {
        a.push("-numa".into());
        a.push(format!("hmat-lb,initiator={i},target={t},hierarchy=memory,data-type=access-latency,latency={lat}"));
        a.push("-numa".into());
        a.push(format!("hmat-lb,initiator={i},target={t},hierarchy=memory,data-type=access-bandwidth,bandwidth={bw}"));
    }
    a.extend(
        [
            "-kernel",
            vmlinuz,
            "-initrd",
            initrd,
            "-append",
            &format!(
                "console=ttyS0 quiet panic=-1 vtism.run={} vtism.repo={}",
                run.display(),
                repo.display()
            ),
            "-virtfs",
            "local,path=/,mount_tag=hostroot,readonly=on,security_model=none,multidevs=remap",
            "-virtfs",
            &format!(
                "local,path={},mount_tag=results,security_model=none",
                out.display()
            ),
            "-display",
            "none",
            "-monitor",
            "none",
            "-nodefaults",
            "-no-reboot",
            "-chardev",
            &format!("file,id=con,path={}", out.join("console.log").display()),
            "-serial",
            "chardev:con",
        ]
        .map(String::from),
    );
    a
}

/// Boots the emulated host and waits for it, printing its "TB" lines; kills it at `limit`.
fn boot_once(args: &[String], out: &Path, limit: Duration) -> anyhow::Result<bool> {
    let mut cmd = Command::new("qemu-system-x86_64");
    // SAFETY: prctl(PR_SET_PDEATHSIG) in the child between fork and exec only sets a flag of
    // the calling process; it allocates nothing and touches no shared state.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(|| {
            // The emulated host dies with the driver (a killed `make demo` leaves no QEMU).
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            Ok(())
        });
    }
    let mut child = cmd
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(out.join("qemu.stderr"))?)
        .spawn()
        .context("starting qemu-system-x86_64")?;
    let console = out.join("console.log");
    let start = Instant::now();
    let (mut offset, mut partial) = (0u64, String::new());
    let mut finished = false;
    loop {
        let exited = child.try_wait()?;
        if let Ok(mut f) = std::fs::File::open(&console) {
            f.seek(SeekFrom::Start(offset))?;
            let mut buf = Vec::new();
            f.read_to_end(&mut buf)?;
            offset += buf.len() as u64;
            partial.push_str(&String::from_utf8_lossy(&buf));
            while let Some(nl) = partial.find('\n') {
                let line: String = partial.drain(..=nl).collect();
                let line = line.trim_end();
                if let Some(p) = line.strip_prefix("TB ") {
                    println!("[{:4.0}s] {p}", start.elapsed().as_secs_f64());
                } else if line == "inner done" {
                    finished = true;
                }
            }
        }
        if let Some(st) = exited {
            if !st.success() {
                eprintln!(
                    "testbed: the emulated host's QEMU exited with {st}; see {}",
                    out.join("qemu.stderr").display()
                );
            }
            return Ok(finished);
        }
        if start.elapsed() > limit {
            eprintln!(
                "testbed: no end after {} s: stopping the emulated host",
                limit.as_secs()
            );
            let _ = child.kill();
            let _ = child.wait();
            return Ok(false);
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

const BOOT_ATTEMPTS: u32 = 3;

/// The emulated host's kernel panicked before its init started our script.
fn died_before_run(console: &str) -> bool {
    console.contains("Kernel panic") && !console.contains("init: running")
}

/// Boots the emulated host (QEMU `args`, console in `out`/console.log) and waits up to `limit`
/// for its script to print "inner done", streaming its "TB" lines. Under multi-threaded TCG the
/// emulated host's kernel occasionally dies while it patches its own text early in boot (an int3
/// oops in a static-key update, seen once in about ten boots); such a boot never reached our
/// script and is retried, up to three times. A failure after the script started is not.
pub fn boot(args: &[String], out: &Path, limit: Duration) -> anyhow::Result<bool> {
    let mut finished = false;
    for attempt in 1..=BOOT_ATTEMPTS {
        let _ = std::fs::remove_file(out.join("console.log"));
        finished = boot_once(args, out, limit)?;
        let console = std::fs::read_to_string(out.join("console.log")).unwrap_or_default();
        if finished || !died_before_run(&console) || attempt == BOOT_ATTEMPTS {
            break;
        }
        let _ = std::fs::copy(
            out.join("console.log"),
            out.join(format!("console-boot{attempt}.log")),
        );
        println!(
            "== the emulated host's kernel died during boot, before the run started (a TCG fault, \
             console-boot{attempt}.log); booting again ({} of {BOOT_ATTEMPTS})",
            attempt + 1
        );
    }
    Ok(finished)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_boot_that_never_ran_the_script_is_retried() {
        let early = "[    2.24] Oops: int3: 0000 [#2] PREEMPT SMP NOPTI\n[    2.24] Kernel panic - not syncing: Fatal exception in interrupt\n";
        assert!(died_before_run(early));
        let late = "init: running /r/testbed/inner.sh\nTB emulated host up\n[  90.1] Kernel panic - not syncing: x\n";
        assert!(!died_before_run(late));
        assert!(!died_before_run(
            "init: running /r/testbed/inner.sh\ninner done\n"
        ));
        assert!(!died_before_run(""));
    }
}
