//! The host kernel's own tiering beside vtismd (docs/host.md, "The kernel's own tiering").
//!
//! NUMA balancing (`kernel.numa_balancing`) moves the pages of every process it scans, QEMU's
//! guest RAM included (its hint faults reach KVM guests through the MMU notifiers): mode 1 moves a
//! page to the node of the CPU that touched it, which for a page on a CPU-less CXL node is a
//! promotion; mode 2 (memory tiering) promotes pages of slower tiers it finds hot; 3 is both. Either
//! undoes vtismd's placement and its quotas, and vtismd, seeing the pages move at its placement
//! sweep, moves them back: the two fight. Reclaim's demotion (`/sys/kernel/mm/numa/demotion_enabled`)
//! only moves pages off a DRAM node that runs short, to slower memory instead of swap: it agrees
//! with vtismd, which learns where the pages went at its sweep. vtismd changes neither setting
//! (they are the operator's); it says what it found, at start and when it changes.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;
use tracing::{info, warn};

/// How often the settings are read again.
const REREAD: Duration = Duration::from_secs(10);

/// The two settings, as last read (`None`: not readable, as on a kernel built without them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct KernelTiering {
    /// `kernel.numa_balancing`: 0 off, bit 0 normal balancing, bit 1 memory tiering.
    pub numa_balancing: Option<u32>,
    pub demotion_enabled: Option<bool>,
}

impl KernelTiering {
    /// Reads the settings under `root` (`/` on a host; a directory tree in tests).
    pub fn read(root: &Path) -> KernelTiering {
        let text = |p: &str| std::fs::read_to_string(root.join(p)).ok();
        KernelTiering {
            numa_balancing: text("proc/sys/kernel/numa_balancing")
                .and_then(|t| t.trim().parse().ok()),
            demotion_enabled: text("sys/kernel/mm/numa/demotion_enabled").and_then(|t| {
                match t.trim() {
                    "true" | "1" => Some(true),
                    "false" | "0" => Some(false),
                    _ => None,
                }
            }),
        }
    }

    /// NUMA balancing is on: the kernel moves guest pages too, against vtismd's placement.
    pub fn conflicts(&self) -> bool {
        self.numa_balancing.is_some_and(|m| m != 0)
    }

    fn balancing_label(&self) -> &'static str {
        match self.numa_balancing {
            None => "unknown",
            Some(0) => "off",
            Some(1) => "normal",
            Some(2) => "memory tiering",
            Some(_) => "normal and memory tiering",
        }
    }
}

/// The settings, read again every `REREAD` from the main loop, with a log line when they change.
pub struct KernelTieringWatch {
    root: PathBuf,
    now: KernelTiering,
    next: Instant,
}

impl KernelTieringWatch {
    /// Reads the settings under `root` and says what it found.
    pub fn start(root: PathBuf) -> KernelTieringWatch {
        let now = KernelTiering::read(&root);
        report(None, &now);
        KernelTieringWatch {
            root,
            now,
            next: Instant::now() + REREAD,
        }
    }

    /// Reads them again if due.
    pub fn refresh(&mut self, at: Instant) {
        if at < self.next {
            return;
        }
        self.next = at + REREAD;
        let read = KernelTiering::read(&self.root);
        if read != self.now {
            report(Some(&self.now), &read);
            self.now = read;
        }
    }

    pub fn get(&self) -> KernelTiering {
        self.now
    }
}

fn report(before: Option<&KernelTiering>, now: &KernelTiering) {
    let what = if before.is_some() {
        "the kernel's tiering settings changed"
    } else {
        "the kernel's tiering settings"
    };
    if now.conflicts() {
        warn!(
            numa_balancing = now.numa_balancing,
            mode = now.balancing_label(),
            demotion_enabled = now.demotion_enabled,
            "{what}: NUMA balancing is on and moves guest pages too, against vtismd's placement \
             and quotas (vtismd moves them back at its placement sweep; guest RAM bound to \
             nodes is not scanned); set kernel.numa_balancing=0 on hosts where vtismd places \
             guest memory"
        );
    } else {
        info!(
            numa_balancing = now.numa_balancing,
            mode = now.balancing_label(),
            demotion_enabled = now.demotion_enabled,
            "{what}: no NUMA balancing beside vtismd"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory tree with the two files (absent where `None`), removed when dropped.
    struct Tree(PathBuf);

    impl Tree {
        fn new(balancing: Option<&str>, demotion: Option<&str>) -> Tree {
            use std::sync::atomic::{AtomicU64, Ordering};
            static N: AtomicU64 = AtomicU64::new(0);
            let dir = std::env::temp_dir().join(format!(
                "vtism-kt-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            for (p, v) in [
                ("proc/sys/kernel/numa_balancing", balancing),
                ("sys/kernel/mm/numa/demotion_enabled", demotion),
            ] {
                let f = dir.join(p);
                std::fs::create_dir_all(f.parent().unwrap()).unwrap();
                if let Some(v) = v {
                    std::fs::write(f, v).unwrap();
                }
            }
            Tree(dir)
        }
        fn read(&self) -> KernelTiering {
            KernelTiering::read(&self.0)
        }
    }

    impl Drop for Tree {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn settings_as_the_kernel_writes_them() {
        let t = Tree::new(Some("2\n"), Some("true\n")).read();
        assert_eq!(t.numa_balancing, Some(2));
        assert_eq!(t.demotion_enabled, Some(true));
        assert!(t.conflicts());
        assert_eq!(t.balancing_label(), "memory tiering");
        let t = Tree::new(Some("0\n"), Some("false\n")).read();
        assert!(!t.conflicts());
        assert_eq!(t.demotion_enabled, Some(false));
        assert!(Tree::new(Some("1\n"), None).read().conflicts());
    }

    #[test]
    fn missing_or_garbled_settings_are_unknown_and_no_conflict() {
        let t = Tree::new(None, Some("maybe")).read();
        assert_eq!(t, KernelTiering::default());
        assert!(!t.conflicts());
        assert_eq!(t.balancing_label(), "unknown");
    }

    #[test]
    fn a_change_is_seen_at_the_next_reread() {
        let tree = Tree::new(Some("0\n"), Some("true\n"));
        let mut w = KernelTieringWatch::start(tree.0.clone());
        assert!(!w.get().conflicts());
        std::fs::write(tree.0.join("proc/sys/kernel/numa_balancing"), "3\n").unwrap();
        let t0 = Instant::now();
        w.refresh(t0);
        assert!(!w.get().conflicts(), "not due yet");
        w.refresh(t0 + REREAD + REREAD);
        assert_eq!(w.get().numa_balancing, Some(3));
        assert!(w.get().conflicts());
    }
}
