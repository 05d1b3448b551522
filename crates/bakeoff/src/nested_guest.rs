//! The bake-off's nested guest, from inside the emulated host: its QEMU (pinned to the VM's
//! socket, in the VM's memory cgroup, guest RAM under no memory policy), its console, and the
//! command channel to its init (testbed/bakeoff-guest-init.sh) on its second serial port.

use anyhow::{bail, Context};
use std::io::Write;
use std::os::unix::io::AsRawFd;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use vtism_testbed::guest_console::ConsoleTail;

pub struct GuestConfig<'a> {
    pub ram_mib: u64,
    pub vmlinuz: &'a Path,
    pub initrd: &'a Path,
    /// The TCG plugin and its counts file, when the ground truth needs it.
    pub plugin: Option<(&'a Path, &'a Path)>,
    /// Work directory: sockets, console, channel file.
    pub dir: &'a Path,
    /// CPU the guest's QEMU runs on (the VM's socket).
    pub cpu: usize,
    /// `cgroup.procs` of the VM's memory cgroup.
    pub cgroup_procs: &'a Path,
}

pub struct NestedGuest {
    child: Child,
    pub pid: i32,
    pub console: ConsoleTail,
    pub console_path: PathBuf,
    /// QMP socket for the conductor; another one for vtismd sits in `qmp/`.
    pub qmp: PathBuf,
    ctl_path: PathBuf,
    ctl: Option<UnixStream>,
    seq: u64,
    /// Console lines read while waiting for an answer, for the caller.
    pub pending: Vec<String>,
}

/// The QMP directory vtismd scans.
pub fn qmp_dir(dir: &Path) -> PathBuf {
    dir.join("qmp")
}

impl NestedGuest {
    pub fn start(c: &GuestConfig) -> anyhow::Result<NestedGuest> {
        std::fs::create_dir_all(qmp_dir(c.dir))?;
        let console_path = c.dir.join("guest-console.log");
        let chan = Path::new("/dev/shm/vtism-guest.chan");
        std::fs::File::create(chan)?.set_len(1 << 20)?;
        let ctl_path = c.dir.join("guest-ctl.sock");
        let qmp = c.dir.join("conductor.qmp");
        let m = c.ram_mib;
        let mut args: Vec<String> = vec![
            "-accel".into(),
            "tcg,tb-size=64".into(),
            "-machine".into(),
            "q35".into(),
            // No CMPXCHG16B: SLUB's cmpxchg16b double-faults the 6.12 guest early in boot under
            // TCG inside TCG (QEMU 7.2), as in the testbed.
            "-cpu".into(),
            "qemu64,cx16=off".into(),
            "-smp".into(),
            "1".into(),
            "-m".into(),
            format!("{m}M"),
            "-name".into(),
            "guest".into(),
            "-display".into(),
            "none".into(),
            "-nodefaults".into(),
            "-no-reboot".into(),
            // Guest RAM under no memory policy: an interleave or bind policy on it would keep
            // NUMA balancing from ever scanning or promoting it (6.12 skips VMAs whose policy
            // lacks MPOL_F_MOF in task_numa_work, and mpol_misplaced bails on them). The
            // conductor moves it onto the CXL nodes before each run.
            "-object".into(),
            format!("memory-backend-ram,id=ram0,size={m}M,prealloc=on"),
            "-numa".into(),
            "node,nodeid=0,memdev=ram0".into(),
            "-object".into(),
            format!(
                "memory-backend-file,id=vtism-chan,mem-path={},size=1M,share=on",
                chan.display()
            ),
            "-device".into(),
            "ivshmem-plain,memdev=vtism-chan,id=vtism0".into(),
            "-kernel".into(),
            c.vmlinuz.display().to_string(),
            "-initrd".into(),
            c.initrd.display().to_string(),
            "-append".into(),
            "console=ttyS0 panic=-1".into(),
            "-serial".into(),
            format!("file:{}", console_path.display()),
            "-chardev".into(),
            format!(
                "socket,id=ctl,path={},server=on,wait=off",
                ctl_path.display()
            ),
            "-serial".into(),
            "chardev:ctl".into(),
            "-qmp".into(),
            format!(
                "unix:{},server=on,wait=off",
                qmp_dir(c.dir).join("guest.qmp").display()
            ),
            "-qmp".into(),
            format!("unix:{},server=on,wait=off", qmp.display()),
        ];
        if let Some((plugin, counts)) = c.plugin {
            args.push("-plugin".into());
            args.push(format!(
                "{},counts={},frames={}",
                plugin.display(),
                counts.display(),
                m * 256
            ));
        }
        let procs = std::fs::OpenOptions::new()
            .write(true)
            .open(c.cgroup_procs)
            .with_context(|| c.cgroup_procs.display().to_string())?;
        let procs_fd = procs.as_raw_fd();
        let cpu = c.cpu;
        let mut cmd = Command::new("qemu-system-x86_64");
        cmd.args(&args)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(c.dir.join("qemu.log"))?)
            .stderr(std::fs::File::create(c.dir.join("qemu.stderr"))?);
        // SAFETY: between fork and exec the child only makes syscalls (sched_setaffinity, write
        // to an fd opened before the fork, prctl) on stack data; nothing is allocated.
        unsafe {
            cmd.pre_exec(move || {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(cpu, &mut set);
                if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // "0": the writing process joins the cgroup, before QEMU allocates guest RAM, so
                // the RAM is charged to it (DAMON's memcg filter sees the VM's pages only).
                if libc::write(procs_fd, b"0\n".as_ptr().cast(), 2) != 2 {
                    return Err(std::io::Error::last_os_error());
                }
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .context("starting the nested qemu-system-x86_64")?;
        drop(procs);
        Ok(NestedGuest {
            pid: child.id() as i32,
            child,
            console: ConsoleTail::new(&console_path),
            console_path,
            qmp,
            ctl_path,
            ctl: None,
            seq: 0,
            pending: Vec::new(),
        })
    }

    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// New console lines (the ones read while waiting for a command's answer first).
    pub fn lines(&mut self) -> anyhow::Result<Vec<String>> {
        let mut v = std::mem::take(&mut self.pending);
        v.extend(self.console.poll()?);
        Ok(v)
    }

    /// Waits until the guest's init listens for commands (`TBCMD ready`).
    pub fn wait_ready(
        &mut self,
        limit: Duration,
        progress: &mut dyn FnMut(u64),
    ) -> anyhow::Result<String> {
        let start = Instant::now();
        let mut booted = String::new();
        loop {
            for l in self.console.poll()? {
                if let Some(b) = l.strip_prefix("TBBOOT ") {
                    booted = b.to_string();
                }
                if l.starts_with("TBCMD ready") {
                    return Ok(booted);
                }
            }
            if !self.alive() {
                bail!("the nested QEMU exited during boot (see qemu.stderr)");
            }
            if start.elapsed() > limit {
                bail!("the nested guest did not boot within {} s", limit.as_secs());
            }
            progress(start.elapsed().as_secs());
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// Sends a command to the guest's init and waits for its answer; returns the lines the
    /// command printed (e.g. TBCPU). Other console lines are kept for [`NestedGuest::lines`].
    pub fn command(&mut self, cmd: &str, limit: Duration) -> anyhow::Result<Vec<String>> {
        if self.ctl.is_none() {
            self.ctl = Some(UnixStream::connect(&self.ctl_path).with_context(|| {
                format!("the guest's control socket {}", self.ctl_path.display())
            })?);
        }
        self.seq += 1;
        let seq = self.seq;
        let ctl = self.ctl.as_mut().expect("connected above");
        ctl.write_all(format!("{seq} {cmd}\n").as_bytes())
            .context("writing to the guest's control channel")?;
        let ack = format!("TBACK {seq} ");
        let start = Instant::now();
        let mut said = Vec::new();
        loop {
            for l in self.console.poll()? {
                if let Some(rest) = l.strip_prefix(&ack) {
                    if rest.starts_with("ok") {
                        return Ok(said);
                    }
                    bail!("the guest failed `{cmd}`: {rest}");
                }
                if l.starts_with("TBCPU ") {
                    said.push(l);
                } else {
                    self.pending.push(l);
                }
            }
            if !self.alive() {
                bail!("the nested QEMU exited during `{cmd}`");
            }
            if start.elapsed() > limit {
                bail!(
                    "the guest did not answer `{cmd}` within {} s",
                    limit.as_secs()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
