//! Hint-stream traces: what guests published, recorded so it can be replayed in the simulator.
//!
//! Format (JSON lines, documented in docs/evaluation.md "Trace format"):
//!
//! ```text
//! {"vtism_trace":1,"vm":{"name":"redis","frames":4194304}}
//! {"t":2.5,"entries":["0x1f0000000200", ...]}
//! ```
//!
//! The first line is the header: format version and the VM (its RAM as a count of 4 KiB frames,
//! guest frame numbers `0..frames`). Every further line is one published round: `t`, seconds since
//! the start of the recording, and the round's 8-byte hint entries exactly as in the channel
//! (docs/channel.md "Entry"), as hex strings (JSON numbers lose bits past 2^53). Rounds are in time
//! order.
//!
//! An optional header field `"counts"` says what `count` means: `"rounds_seen"` (channel v1.0,
//! the default) or `"rate_level"` (v1.1, an access rate on a log scale).
//!
//! Replay: a round's entries say which frames the guest saw recently and how often (`count`,
//! `write`); the replayed workload spreads its accesses over those frames in proportion to
//! `count`, or to the rate a rate level stands for (writes get half of a written frame's share)
//! until the next round. Frames never hinted
//! get no accesses. This recovers where accesses went, not how many there were: the throughput
//! model supplies the rate.

use crate::workload::Profile;
use serde::{Deserialize, Serialize};
use std::io::{BufRead, Write};
use vtism_proto::count::rate_hz;
use vtism_proto::{CountMeaning, HintEntry, PageType, FRAME_SIZE};

#[derive(Serialize, Deserialize)]
struct Header {
    vtism_trace: u32,
    vm: VmHeader,
    /// What the entries' `count` means; traces without it are rounds seen (channel v1.0).
    #[serde(default)]
    counts: CountMeaning,
}

#[derive(Serialize, Deserialize)]
struct VmHeader {
    name: String,
    frames: u64,
}

#[derive(Serialize, Deserialize)]
struct Round {
    t: f64,
    entries: Vec<String>,
}

/// A recorded trace, loaded.
#[derive(Debug)]
pub struct TraceWorkload {
    pub name: String,
    pub frames: u64,
    pub counts: CountMeaning,
    pub rounds: Vec<(f64, Vec<HintEntry>)>,
}

impl TraceWorkload {
    pub fn read(r: impl BufRead) -> anyhow::Result<TraceWorkload> {
        let mut lines = r.lines();
        let first = lines
            .next()
            .ok_or_else(|| anyhow::anyhow!("trace: empty file (no header line)"))??;
        let h: Header = serde_json::from_str(&first)
            .map_err(|e| anyhow::anyhow!("trace: line 1 (header): {e}"))?;
        if h.vtism_trace != 1 {
            anyhow::bail!(
                "trace: vtism_trace: version {} not supported (1)",
                h.vtism_trace
            );
        }
        if h.vm.frames == 0 {
            anyhow::bail!("trace: vm.frames: must be at least 1");
        }
        let mut rounds = Vec::new();
        let mut last = f64::NEG_INFINITY;
        for (i, l) in lines.enumerate() {
            let l = l?;
            if l.trim().is_empty() {
                continue;
            }
            let r: Round = serde_json::from_str(&l)
                .map_err(|e| anyhow::anyhow!("trace: line {}: {e}", i + 2))?;
            if r.t.is_nan() || r.t < last {
                anyhow::bail!("trace: line {}: t: rounds must be in time order", i + 2);
            }
            last = r.t;
            let mut es = Vec::with_capacity(r.entries.len());
            for e in &r.entries {
                let w = u64::from_str_radix(e.trim_start_matches("0x"), 16).map_err(|_| {
                    anyhow::anyhow!("trace: line {}: entries: bad hex {e:?}", i + 2)
                })?;
                es.push(HintEntry(w));
            }
            rounds.push((r.t, es));
        }
        Ok(TraceWorkload {
            name: h.vm.name,
            frames: h.vm.frames,
            counts: h.counts,
            rounds,
        })
    }

    pub fn phase(&self, t: f64) -> u64 {
        self.rounds.partition_point(|r| r.0 <= t) as u64
    }

    pub fn profile(&self, phase: u64, units: usize, unit_bytes: u64) -> Profile {
        let mut p = Profile {
            read: vec![0.0; units],
            write: vec![0.0; units],
            ptype: vec![PageType::Anon; units],
        };
        let fpu = (unit_bytes / FRAME_SIZE).max(1);
        // Before the first round, nothing is known: spread evenly.
        let Some(idx) = (phase as usize).checked_sub(1) else {
            p.read.iter_mut().for_each(|x| *x = 1.0);
            p.normalise();
            return p;
        };
        for e in &self.rounds[idx].1 {
            let g = e.gfn().0;
            if g >= self.frames {
                continue;
            }
            let frames = e.frames().min(self.frames - g);
            let per_frame = match self.counts {
                CountMeaning::RoundsSeen => e.count().max(1) as f64,
                CountMeaning::RateLevel => rate_hz(e.count()),
            };
            let w = per_frame * frames as f64;
            let u = ((g / fpu) as usize).min(units - 1);
            let (r, wr) = if e.write() { (0.5, 0.5) } else { (1.0, 0.0) };
            p.read[u] += (w * r) as f32;
            p.write[u] += (w * wr) as f32;
            if e.page_type() != PageType::Unknown {
                p.ptype[u] = e.page_type();
            }
        }
        p.normalise();
        p
    }
}

/// Writes a trace as the simulator's guest-tracker model publishes rounds.
pub struct TraceWriter<W: Write> {
    out: W,
}

impl<W: Write> TraceWriter<W> {
    pub fn new(mut out: W, name: &str, frames: u64, counts: CountMeaning) -> anyhow::Result<Self> {
        let h = Header {
            vtism_trace: 1,
            vm: VmHeader {
                name: name.into(),
                frames,
            },
            counts,
        };
        writeln!(out, "{}", serde_json::to_string(&h)?)?;
        Ok(TraceWriter { out })
    }
    pub fn round(&mut self, t: f64, entries: &[HintEntry]) -> anyhow::Result<()> {
        let r = Round {
            t,
            entries: entries.iter().map(|e| format!("{:#x}", e.0)).collect(),
        };
        writeln!(self.out, "{}", serde_json::to_string(&r)?)?;
        Ok(())
    }
    pub fn finish(mut self) -> anyhow::Result<W> {
        self.out.flush()?;
        Ok(self.out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vtism_proto::Gfn;

    #[test]
    fn roundtrip_and_replay_follows_counts() {
        let mut w = TraceWriter::new(Vec::new(), "t", 2048, CountMeaning::RoundsSeen).unwrap();
        let a = HintEntry::new(Gfn(0), 8, false, PageType::Anon, true, true);
        let b = HintEntry::new(Gfn(1024), 2, true, PageType::File, false, true);
        w.round(1.0, &[a, b]).unwrap();
        w.round(2.0, &[b]).unwrap();
        let buf = w.finish().unwrap();
        let t = TraceWorkload::read(&buf[..]).unwrap();
        assert_eq!(t.frames, 2048);
        assert_eq!(t.rounds.len(), 2);
        assert_eq!(t.rounds[0].1, vec![a, b]);
        assert_eq!((t.phase(0.5), t.phase(1.0), t.phase(9.0)), (0, 1, 2));
        // 2 MiB units: unit 0 gets 8*512, unit 2 gets 2*1 (half writes).
        let p = t.profile(1, 4, 2 << 20);
        assert!(p.share(0) > 0.99 && p.share(1) == 0.0 && p.share(2) > 0.0);
        assert_eq!(p.ptype[2], PageType::File);
        assert!(p.write[2] > 0.0 && p.write[0] == 0.0);
        let p = t.profile(2, 4, 2 << 20);
        assert!((p.share(2) - 1.0).abs() < 1e-6);
    }

    #[test]
    fn errors_name_the_line_and_field() {
        let e =
            TraceWorkload::read(&b"{\"vtism_trace\":2,\"vm\":{\"name\":\"x\",\"frames\":1}}\n"[..])
                .unwrap_err();
        assert!(e.to_string().contains("vtism_trace"), "{e}");
        let e = TraceWorkload::read(
            &b"{\"vtism_trace\":1,\"vm\":{\"name\":\"x\",\"frames\":1}}\n{\"t\":1,\"entries\":[\"zz\"]}\n"[..],
        )
        .unwrap_err();
        assert!(e.to_string().contains("line 2"), "{e}");
    }
}
