//! vtism guest agent: a DAMON-based hot-page tracker that publishes through the ivshmem channel,
//! for guests where loading the vtism_guest module is not allowed.
//!
//! Pieces, each testable without root against fixture files: `iomem` (System RAM ranges),
//! `damon` (the DAMON sysfs interface: one kdamond of our own, when DAMON is free), `rate`
//! (shares of young windows to access rates), `frames` (per-frame shares, entries hottest
//! first), `intervals` (the sampling-interval loop), `confirm` (frame-by-frame confirmation of
//! DAMON's hot regions), `kpageflags` (page type and THP heads), `cpu` (the tracker's CPU
//! time), `pci` (the ivshmem BAR), `agent` (the loop).

pub mod agent;
pub mod cli;
pub mod confirm;
pub mod cpu;
pub mod damon;
pub mod frames;
pub mod intervals;
pub mod iomem;
pub mod kpageflags;
pub mod pci;
pub mod rate;

#[cfg(test)]
pub(crate) mod testdir {
    use std::path::{Path, PathBuf};
    use std::sync::atomic::{AtomicU32, Ordering};

    /// A scratch directory removed on drop.
    pub struct TestDir(pub PathBuf);
    impl TestDir {
        pub fn new(tag: &str) -> TestDir {
            static N: AtomicU32 = AtomicU32::new(0);
            let p = std::env::temp_dir().join(format!(
                "vtism-guest-{tag}-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            let _ = std::fs::remove_dir_all(&p);
            std::fs::create_dir_all(&p).unwrap();
            TestDir(p)
        }
        pub fn path(&self) -> &Path {
            &self.0
        }
        pub fn write(&self, rel: &str, content: &str) {
            let p = self.0.join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, content).unwrap();
        }
    }
    impl Drop for TestDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}
