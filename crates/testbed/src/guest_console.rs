//! The nested guest's serial console as the emulated host sees it (a file QEMU appends to): new
//! complete lines since the last look, and the GUPS workload's ground truth in them
//! (testbed/gups.c: TBHOT, TBCOLD, TBNEXT, TBREADY, TBWARM, TBMOVE, TBTPUT).

use anyhow::Context;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// Follows a growing log file line by line; a line split across two reads is kept until its end.
pub struct ConsoleTail {
    path: PathBuf,
    offset: u64,
    partial: String,
}

impl ConsoleTail {
    pub fn new(path: &Path) -> ConsoleTail {
        ConsoleTail {
            path: path.to_path_buf(),
            offset: 0,
            partial: String::new(),
        }
    }

    /// The complete lines written since the last call (without line ends). A missing file has
    /// no lines yet.
    pub fn poll(&mut self) -> anyhow::Result<Vec<String>> {
        let mut f = match std::fs::File::open(&self.path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e).context(self.path.display().to_string()),
        };
        f.seek(SeekFrom::Start(self.offset))?;
        let mut buf = Vec::new();
        f.read_to_end(&mut buf)?;
        self.offset += buf.len() as u64;
        self.partial.push_str(&String::from_utf8_lossy(&buf));
        let mut lines = Vec::new();
        while let Some(nl) = self.partial.find('\n') {
            let line: String = self.partial.drain(..=nl).collect();
            lines.push(line.trim_end_matches(['\r', '\n']).to_string());
        }
        Ok(lines)
    }
}

/// One TBTPUT line: the workload's rates over the last second.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct GupsRate {
    pub ms: u64,
    /// GUPS updates per second, the uniform ones included.
    pub updates_per_s: u64,
    /// Updates per second spread uniformly over the whole region.
    pub uniform_per_s: u64,
    /// Round-robin touches of cold pages per second.
    pub cold_touches_per_s: u64,
}

/// What the GUPS workload said about its frames: runs of (first gfn, frames).
#[derive(Clone, Debug, Default)]
pub struct GupsTruth {
    pub hot: Vec<(u64, u64)>,
    pub cold: Vec<(u64, u64)>,
    /// The hot set after the move (with --move-after).
    pub next: Vec<(u64, u64)>,
    pub ready: bool,
    /// When the hot set moved, ms after the workload was ready.
    pub moved_at_ms: Option<u64>,
    /// When the warm background started (with --warm-after), ms after the workload was ready.
    pub warm_at_ms: Option<u64>,
    pub rate: Option<GupsRate>,
}

impl GupsTruth {
    /// Takes one console line; false if it is not the workload's.
    pub fn feed(&mut self, line: &str) -> bool {
        let mut w = line.split_whitespace();
        let tag = w.next().unwrap_or("");
        let nums: Vec<u64> = w.filter_map(|x| x.parse().ok()).collect();
        let run = || (nums.len() >= 2).then(|| (nums[0], nums[1]));
        match tag {
            // A run printed after TBREADY belongs to no ground truth (a second workload's).
            "TBHOT" if !self.ready => self.hot.extend(run()),
            "TBCOLD" if !self.ready => self.cold.extend(run()),
            "TBNEXT" if !self.ready => self.next.extend(run()),
            "TBHOT" | "TBCOLD" | "TBNEXT" => {}
            "TBREADY" => self.ready = true,
            "TBMOVE" => self.moved_at_ms = nums.first().copied().or(Some(0)),
            "TBWARM" => self.warm_at_ms = nums.first().copied().or(Some(0)),
            "TBTPUT" => {
                if let Some(&ms) = nums.first() {
                    self.rate = Some(GupsRate {
                        ms,
                        updates_per_s: nums.get(1).copied().unwrap_or(0),
                        uniform_per_s: nums.get(2).copied().unwrap_or(0),
                        cold_touches_per_s: nums.get(3).copied().unwrap_or(0),
                    });
                }
            }
            _ => return false,
        }
        true
    }

    pub fn frames(runs: &[(u64, u64)]) -> u64 {
        runs.iter().map(|r| r.1).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn lines_split_across_reads_and_the_ground_truth() {
        let dir = std::env::temp_dir().join(format!("vtism-console-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("console.log");
        let mut tail = ConsoleTail::new(&p);
        assert!(tail.poll().unwrap().is_empty(), "no file yet: no lines");
        std::fs::write(&p, "TBHOT 100 4\r\nTBCOLD 200 8\nTBNEXT 300 4\nTBHO").unwrap();
        let mut g = GupsTruth::default();
        for l in tail.poll().unwrap() {
            assert!(g.feed(&l));
        }
        let mut f = std::fs::OpenOptions::new().append(true).open(&p).unwrap();
        f.write_all(b"T 104 2\nTBREADY hot=6 cold=8\nTBHOT 1 1\nTBTPUT 1000 5000 500 30\nTBMOVE 7000\nother\n")
            .unwrap();
        let lines = tail.poll().unwrap();
        assert_eq!(lines.len(), 6);
        let fed: Vec<bool> = lines.iter().map(|l| g.feed(l)).collect();
        assert_eq!(fed, vec![true, true, true, true, true, false]);
        assert_eq!(
            g.hot,
            vec![(100, 4), (104, 2)],
            "a run after TBREADY is ignored"
        );
        assert_eq!(
            (g.cold.clone(), g.next.clone()),
            (vec![(200, 8)], vec![(300, 4)])
        );
        assert_eq!(GupsTruth::frames(&g.hot), 6);
        assert_eq!(g.moved_at_ms, Some(7000));
        assert_eq!(
            g.rate,
            Some(GupsRate {
                ms: 1000,
                updates_per_s: 5000,
                uniform_per_s: 500,
                cold_touches_per_s: 30
            })
        );
        // The old two-field form still parses.
        g.feed("TBTPUT 2000 7000");
        assert_eq!(g.rate.unwrap().updates_per_s, 7000);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
