//! The bake-off's nested guest, from inside the emulated host: its QEMU (pinned to the VM's
//! socket, in the VM's memory cgroup, guest RAM under no memory policy), its console, and the
//! command channel to its init (testbed/bakeoff-guest-init.sh) on its second serial port.
//!
//! The init runs one command at a time, in the order sent, and says when it starts one (`TBGOT`)
//! and when it is done (`TBACK`). A command is waited for until it is answered: under TCG inside
//! TCG on a loaded machine a nested guest is many times slower than on an idle one, and the DAMON
//! agent ends only when the DAMON command it is blocked in returns, minutes later. Giving up on a
//! command after a fixed time lost runs that were only slow (the next command queued behind the
//! unanswered one and timed out in turn, taking the next managers' runs with it). The guest counts
//! as hung only when it has neither started nor finished a command for [`HUNG_AFTER`]; the
//! conductor then restarts it.

use anyhow::{bail, Context};
use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::io::AsRawFd;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use vtism_testbed::guest_console::ConsoleTail;

/// A guest whose init has neither started nor finished a command for this long is hung. Its
/// commands do not take a fixed time: stopping the DAMON agent waits for up to two of its DAMON
/// aggregations (its sampling interval may grow to 10 s, 20 samples each), and a loaded machine
/// makes everything several times slower; the longest seen answered after about 10 minutes.
pub const HUNG_AFTER: Duration = Duration::from_secs(1800);
/// A command the init has not started after this long, with nothing before it, is sent again if
/// running it twice does no harm.
const RESEND_AFTER: Duration = Duration::from_secs(180);
const RESENDABLE: [&str; 3] = ["reset", "stop", "cpu"];
/// How often a slow command is reported while it is waited for.
const SLOW_REPORT: Duration = Duration::from_secs(60);

#[derive(Clone, Debug)]
pub struct GuestConfig<'a> {
    pub ram_mib: u64,
    pub kernel: &'a Path,
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
    /// Commands sent and not answered yet, by sequence number.
    sent: BTreeMap<u64, String>,
    /// Answers not collected yet: sequence number, `ok` or `fail <detail>`.
    answers: BTreeMap<u64, String>,
    /// The command the init said it started last (`TBGOT`).
    started: u64,
    /// The last time the init started or finished a command (or a command was sent to an idle
    /// one).
    last_progress: Instant,
    /// Set when a command went unanswered with no progress for [`HUNG_AFTER`]: nothing more is
    /// sent, the guest must be restarted.
    pub hung: bool,
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
            c.kernel.display().to_string(),
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
            sent: BTreeMap::new(),
            answers: BTreeMap::new(),
            started: 0,
            last_progress: Instant::now(),
            hung: false,
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
    /// The wait has no fixed limit: past `slow` it is reported every minute, and it ends in an
    /// error only when the guest fails the command, its QEMU exits, or it makes no progress for
    /// [`HUNG_AFTER`] (then [`NestedGuest::hung`] is set).
    pub fn command(&mut self, cmd: &str, slow: Duration) -> anyhow::Result<Vec<String>> {
        if self.hung {
            bail!("not sent `{cmd}`: the guest stopped answering earlier");
        }
        if self.ctl.is_none() {
            self.ctl = Some(UnixStream::connect(&self.ctl_path).with_context(|| {
                format!("the guest's control socket {}", self.ctl_path.display())
            })?);
        }
        // An idle init starts on this command now: its wait for progress starts here.
        self.poll_progress()?;
        if self.sent.is_empty() {
            self.last_progress = Instant::now();
        }
        self.seq += 1;
        let seq = self.seq;
        let ctl = self.ctl.as_mut().expect("connected above");
        ctl.write_all(format!("{seq} {cmd}\n").as_bytes())
            .context("writing to the guest's control channel")?;
        self.sent.insert(seq, cmd.to_string());
        let start = Instant::now();
        let mut said = Vec::new();
        let mut next_report = slow;
        let mut next_resend = RESEND_AFTER;
        loop {
            said.extend(self.poll_progress()?);
            // A command the init never started while it had nothing else to do was lost on the
            // way (the serial port drops what arrives while it is closed): a command that may run
            // twice is sent again.
            if self.started < seq
                && self.sent.len() == 1
                && start.elapsed() > next_resend
                && RESENDABLE.contains(&cmd.split_whitespace().next().unwrap_or(""))
            {
                next_resend += RESEND_AFTER;
                println!(
                    "TB   the guest has not started `{cmd}` after {:.0} s while idle: sending it again",
                    start.elapsed().as_secs_f64()
                );
                let ctl = self.ctl.as_mut().expect("connected above");
                ctl.write_all(format!("{seq} {cmd}\n").as_bytes())
                    .context("writing to the guest's control channel")?;
            }
            if let Some(rest) = self.answers.remove(&seq) {
                if start.elapsed() > slow {
                    println!(
                        "TB   the guest answered `{cmd}` after {:.0} s",
                        start.elapsed().as_secs_f64()
                    );
                }
                if rest.starts_with("ok") {
                    return Ok(said);
                }
                bail!("the guest failed `{cmd}`: {rest}");
            }
            if !self.alive() {
                bail!("the nested QEMU exited during `{cmd}`");
            }
            let busy = match self.sent.range(..=self.started).next_back() {
                Some((&s, c)) if s == self.started => c.clone(),
                _ => "nothing (between commands)".into(),
            };
            if self.last_progress.elapsed() > HUNG_AFTER {
                self.hung = true;
                bail!(
                    "the guest did not answer `{cmd}`: no command started or finished for {} s (busy with {busy}; load {})",
                    HUNG_AFTER.as_secs(),
                    loadavg()
                );
            }
            if start.elapsed() > next_report {
                next_report += SLOW_REPORT;
                println!(
                    "TB   waiting for the guest's answer to `{cmd}`: {:.0} s (it is on `{busy}`; load {})",
                    start.elapsed().as_secs_f64(),
                    loadavg()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Reads the console for the init's progress (`TBGOT`, `TBACK`); returns the `TBCPU` lines
    /// and keeps the rest for [`NestedGuest::lines`].
    fn poll_progress(&mut self) -> anyhow::Result<Vec<String>> {
        let mut said = Vec::new();
        for l in self.console.poll()? {
            match self.progress(&l) {
                Line::Progress => {}
                Line::Said => said.push(l),
                Line::Other => {
                    if l.starts_with("TBAGENT ") {
                        println!("TB   guest: {l}");
                    }
                    self.pending.push(l);
                }
            }
        }
        Ok(said)
    }

    /// Books one console line of the init's protocol.
    fn progress(&mut self, l: &str) -> Line {
        if let Some(n) = l.strip_prefix("TBGOT ") {
            if let Ok(n) = n.trim().parse() {
                self.started = n;
                self.last_progress = Instant::now();
                return Line::Progress;
            }
        } else if let Some((n, rest)) = l.strip_prefix("TBACK ").and_then(|r| r.split_once(' ')) {
            if let Ok(n) = n.parse::<u64>() {
                self.sent.remove(&n);
                self.answers.insert(n, rest.to_string());
                self.last_progress = Instant::now();
                return Line::Progress;
            }
        } else if l.starts_with("TBCPU ") {
            return Line::Said;
        }
        Line::Other
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What a console line is to the command channel.
#[derive(Debug, PartialEq)]
enum Line {
    /// The init started or finished a command.
    Progress,
    /// Output of the command (`TBCPU`).
    Said,
    Other,
}

/// The emulated host's load averages, for the conductor's messages.
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_init_s_progress_is_booked_and_other_lines_kept() {
        // A guest process that is only a placeholder: `true` exits at once.
        let child = Command::new("true").spawn().unwrap();
        let dir = std::env::temp_dir().join(format!("vtism-bakeoff-ng-{}", std::process::id()));
        let mut g = NestedGuest {
            pid: child.id() as i32,
            child,
            console: ConsoleTail::new(&dir.join("console")),
            console_path: dir.join("console"),
            qmp: dir.join("qmp"),
            ctl_path: dir.join("ctl"),
            ctl: None,
            seq: 2,
            sent: [(1, "stop".to_string()), (2, "cpu".to_string())].into(),
            answers: BTreeMap::new(),
            started: 0,
            last_progress: Instant::now() - Duration::from_secs(100),
            hung: false,
            pending: Vec::new(),
        };
        assert_eq!(g.progress("TBGOT 1"), Line::Progress);
        assert_eq!(g.started, 1);
        assert!(g.last_progress.elapsed() < Duration::from_secs(10));
        assert_eq!(g.progress("TBACK 1 ok"), Line::Progress);
        assert_eq!(g.answers.get(&1).map(String::as_str), Some("ok"));
        assert!(!g.sent.contains_key(&1));
        assert_eq!(g.progress("TBCPU vtism_scan 12"), Line::Said);
        assert_eq!(
            g.progress("TBACK 2 fail rmmod: no such module"),
            Line::Progress
        );
        assert_eq!(
            g.answers.get(&2).map(String::as_str),
            Some("fail rmmod: no such module")
        );
        assert_eq!(g.progress("TBTPUT 1000 5 0 0"), Line::Other);
        assert_eq!(g.progress("TBGOT x"), Line::Other);
        g.kill();
    }
}
