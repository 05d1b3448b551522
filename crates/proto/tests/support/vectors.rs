//! The shared channel vectors: their JSON schema and the generator that builds them.
//!
//! Shared by `examples/gen_vectors.rs` (writes tests/vectors/channel/) and `tests/vectors.rs`
//! (regenerates in memory and compares with the committed files, so the two cannot drift).
//! Each region is built the way a guest would build it (`write_feedback` for a host block, then
//! `ChannelWriter` init and publishes) and hostile cases are made by poking bytes afterwards; the
//! C test replays the same steps with the C helpers and must get the same bytes.
#![allow(dead_code)]

use serde::{Deserialize, Serialize};
use vtism_proto::count::{level_of_rate, rate_of_young_share};
use vtism_proto::layout::{self, off};
use vtism_proto::{
    write_feedback, ChannelVersion, ChannelWriter, CountMeaning, Feedback, Gfn, HintEntry, Micros,
    OwnedRegion, PageType, RoundMeta, SharedRegion, Tracker, TrackerReport, WriterConfig,
};

pub const FORMAT: &str = "vtism-channel-vectors";

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VectorFile {
    pub format: String,
    pub version: u32,
    pub notes: Vec<String>,
    pub vectors: Vec<Vector>,
    /// `level_of_rate(rate / 2^shift)`: what `vtism_ch_level_of_rate` must return.
    pub rate_levels: Vec<RateLevel>,
    /// `level_of_rate(rate_of_young_share(share / 2^share_bits, window_us / 10^6))`: what
    /// `vtism_ch_level_of_share` must return.
    pub share_levels: Vec<ShareLevel>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RateLevel {
    pub rate: u64,
    pub shift: u32,
    pub level: u8,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShareLevel {
    pub share: u64,
    pub share_bits: u32,
    pub window_us: u32,
    pub level: u8,
}

/// One region and what a fresh reader must make of it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Vector {
    pub name: String,
    pub file: String,
    pub description: String,
    /// `region_size` given to init (the BAR size the guest declares).
    pub region_size: u64,
    /// Bytes in the .bin file: what the host mapped.
    pub file_len: u64,
    pub tracker: u32,
    /// The writer's minor version (0: an old guest; 1: the tracker report is published).
    pub version_minor: u16,
    /// Guest-frame ranges `[start, end)` the reader validates against.
    pub ram_map: Vec<[u64; 2]>,
    /// Host block written before init (init then preserves it).
    pub feedback: Option<FeedbackJson>,
    /// Rounds as written, in order (entries after any truncation).
    pub rounds: Vec<RoundJson>,
    /// Raw little-endian stores applied after the rounds.
    pub pokes: Vec<Poke>,
    pub expect: Expect,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FeedbackJson {
    pub host_seq: u64,
    pub ack_round: u64,
    pub entry_budget: u64,
    pub min_interval_ms: u32,
    pub last_status: u32,
    pub fast_quota_bytes: u64,
    pub rejected_rounds: u64,
    pub host_version: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoundJson {
    /// Entries the guest offered; `entries` holds those kept.
    pub offered: u64,
    pub flags: u32,
    pub scan_interval_ms: u32,
    pub scan_duration_us: u32,
    pub tracked_bytes: u64,
    pub hot_frames: u64,
    pub publish_time_ns: u64,
    /// Written by a v1.1 writer; `null` for a v1.0 writer.
    pub tracker_report: Option<TrackerReportJson>,
    pub entries: Vec<EntryJson>,
}

/// The v1.1 publication fields under their wire names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrackerReportJson {
    pub window_us: u32,
    pub windows: u32,
    pub tracker_cpu_us: u32,
    pub coarse_window_us: u32,
    pub tracked_frames: u64,
}

impl TrackerReportJson {
    pub fn from_report(t: TrackerReport) -> Self {
        TrackerReportJson {
            window_us: t.window.0,
            windows: t.windows,
            tracker_cpu_us: t.tracker_cpu.0,
            coarse_window_us: t.coarse_window.0,
            tracked_frames: t.tracked_frames,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EntryJson {
    pub gfn: u64,
    pub count: u32,
    pub write: bool,
    #[serde(rename = "type")]
    pub page_type: PageType,
    pub huge: bool,
    pub young: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Poke {
    pub offset: u64,
    /// 4 or 8 bytes.
    pub size: u32,
    /// Hex, so every u64 survives JSON parsers that use doubles.
    pub value: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "lowercase")]
pub enum Expect {
    /// A fresh reader takes this round.
    Ok(ExpectRound),
    /// A fresh reader finds nothing new (round 0).
    None,
    /// A fresh reader rejects the region.
    Error {
        code: u32,
        label: String,
        entry_index: Option<u64>,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExpectRound {
    pub seq: u64,
    pub round: u64,
    pub version_minor: u16,
    /// What `count` means: `rounds_seen` (v1.0) or `rate_level` (v1.1 and later).
    pub counts: CountMeaning,
    pub tracker: u32,
    pub flags: u32,
    pub overflow: bool,
    pub scan_interval_ms: u32,
    pub scan_duration_us: u32,
    pub tracked_bytes: u64,
    pub hot_frames: u64,
    pub publish_time_ns: u64,
    /// `null` for a v1.0 writer.
    pub tracker_report: Option<TrackerReportJson>,
    pub entries: Vec<EntryJson>,
}

impl EntryJson {
    pub fn from_entry(e: HintEntry) -> Self {
        EntryJson {
            gfn: e.gfn().0,
            count: u32::from(e.count()),
            write: e.write(),
            page_type: e.page_type(),
            huge: e.huge(),
            young: e.young(),
        }
    }
    pub fn to_entry(self) -> HintEntry {
        HintEntry::new(
            Gfn(self.gfn),
            self.count,
            self.write,
            self.page_type,
            self.huge,
            self.young,
        )
    }
}

impl Poke {
    pub fn value(&self) -> u64 {
        u64::from_str_radix(self.value.trim_start_matches("0x"), 16).expect("hex poke value")
    }
}

/// Builds a vector the way the spec says a guest and a host would, then pokes.
pub struct Case {
    v: Vector,
    offered: Vec<Vec<HintEntry>>,
    metas: Vec<RoundMeta>,
}

fn e(gfn: u64, count: u32, write: bool, t: PageType, huge: bool, young: bool) -> HintEntry {
    HintEntry::new(Gfn(gfn), count, write, t, huge, young)
}
fn anon(gfn: u64) -> HintEntry {
    e(gfn, 1, false, PageType::Anon, false, true)
}
fn huge(gfn: u64) -> HintEntry {
    e(gfn, 2, false, PageType::Anon, true, true)
}

const RAM_2G: [u64; 2] = [0, 0x8_0000];
/// `host_version` of a v1.0 host: the v1.0 vectors keep their bytes.
const V1_0_HOST: u32 = 1 << 16;
/// Low memory with the VGA/BIOS hole, RAM below 2 GiB, and 1 GiB above 4 GiB.
const RAM_HOLES: [[u64; 2]; 3] = [[0, 0xa0], [0x100, 0x8_0000], [0x10_0000, 0x14_0000]];

fn meta(n: u64) -> RoundMeta {
    RoundMeta {
        overflow: false,
        scan_interval_ms: 1000,
        scan_duration_us: 1500 + n as u32,
        tracked_bytes: 0x4000_0000,
        hot_frames: n,
        publish_time_ns: 1_000_000_000 + n,
        tracker_report: TrackerReport::default(),
    }
}

/// A v1.1 round's metadata: a 1 GiB guest, W_f 100 ms, W_c 1 ms, 37 windows, 8.1 ms of CPU.
fn meta11(n: u64) -> RoundMeta {
    RoundMeta {
        tracker_report: TrackerReport {
            window: Micros(100_000),
            coarse_window: Micros(1_000),
            windows: 37,
            tracker_cpu: Micros(8_123),
            tracked_frames: 262_144,
        },
        ..meta(n)
    }
}

/// A v1.1 entry: `level` is a rate level (96 = 1 Hz).
fn rated(gfn: u64, level: u32, write: bool, huge: bool) -> HintEntry {
    e(gfn, level, write, PageType::Anon, huge, true)
}

impl Case {
    fn new(name: &str, description: &str) -> Case {
        Case {
            v: Vector {
                name: name.to_string(),
                file: format!("{name}.bin"),
                description: description.to_string(),
                region_size: 8192,
                file_len: 8192,
                tracker: Tracker::Harness.raw(),
                version_minor: 0,
                ram_map: vec![RAM_2G],
                feedback: None,
                rounds: Vec::new(),
                pokes: Vec::new(),
                expect: Expect::None,
            },
            offered: Vec::new(),
            metas: Vec::new(),
        }
    }
    fn ram(mut self, ranges: &[[u64; 2]]) -> Self {
        self.v.ram_map = ranges.to_vec();
        self
    }
    fn sizes(mut self, region_size: u64, file_len: u64) -> Self {
        self.v.region_size = region_size;
        self.v.file_len = file_len;
        self
    }
    fn tracker(mut self, t: Tracker) -> Self {
        self.v.tracker = t.raw();
        self
    }
    /// Written by a v1.1 writer (cases are v1.0 writers unless they say so).
    fn v1_1(mut self) -> Self {
        self.v.version_minor = 1;
        self
    }
    fn writer_version(&self) -> ChannelVersion {
        match self.v.version_minor {
            0 => ChannelVersion::V1_0,
            _ => ChannelVersion::V1_1,
        }
    }
    fn feedback(mut self, fb: Feedback) -> Self {
        self.v.feedback = Some(FeedbackJson {
            host_seq: 2, // one write_feedback from zero: 0 -> 1 -> 2
            ack_round: fb.ack_round,
            entry_budget: fb.entry_budget,
            min_interval_ms: fb.min_interval_ms,
            last_status: fb.last_status,
            fast_quota_bytes: fb.fast_quota_bytes,
            rejected_rounds: fb.rejected_rounds,
            host_version: fb.host_version,
        });
        self
    }
    /// A round offering `entries` of which the writer must keep the first `keep`.
    fn round_keep(mut self, entries: Vec<HintEntry>, m: RoundMeta, keep: usize) -> Self {
        let kept = &entries[..keep];
        self.v.rounds.push(RoundJson {
            offered: entries.len() as u64,
            flags: u32::from(m.overflow || keep < entries.len()),
            scan_interval_ms: m.scan_interval_ms,
            scan_duration_us: m.scan_duration_us,
            tracked_bytes: m.tracked_bytes,
            hot_frames: m.hot_frames,
            publish_time_ns: m.publish_time_ns,
            tracker_report: (self.v.version_minor > 0)
                .then(|| TrackerReportJson::from_report(m.tracker_report)),
            entries: kept.iter().copied().map(EntryJson::from_entry).collect(),
        });
        self.offered.push(entries);
        self.metas.push(m);
        self
    }
    fn round(self, entries: Vec<HintEntry>) -> Self {
        let n = entries.len();
        let m = if self.v.version_minor > 0 {
            meta11(n as u64)
        } else {
            meta(n as u64)
        };
        self.round_keep(entries, m, n)
    }
    fn poke64(mut self, offset: usize, value: u64) -> Self {
        self.v.pokes.push(Poke {
            offset: offset as u64,
            size: 8,
            value: format!("{value:#x}"),
        });
        self
    }
    fn poke32(mut self, offset: usize, value: u32) -> Self {
        self.v.pokes.push(Poke {
            offset: offset as u64,
            size: 4,
            value: format!("{value:#x}"),
        });
        self
    }
    fn poke_entry(self, index: usize, word: u64) -> Self {
        self.poke64(layout::ENTRIES_OFFSET as usize + 8 * index, word)
    }
    /// The reader takes the last round exactly as written.
    fn ok(self) -> Self {
        self.ok_with(|_| {})
    }
    fn ok_with(mut self, adjust: impl FnOnce(&mut ExpectRound)) -> Self {
        let last = self.v.rounds.last().cloned().expect("a round to take");
        let mut x = ExpectRound {
            seq: 2 + 2 * self.v.rounds.len() as u64,
            round: self.v.rounds.len() as u64,
            version_minor: self.v.version_minor,
            counts: CountMeaning::for_minor(self.v.version_minor),
            tracker: self.v.tracker,
            flags: last.flags,
            overflow: last.flags & 1 != 0,
            scan_interval_ms: last.scan_interval_ms,
            scan_duration_us: last.scan_duration_us,
            tracked_bytes: last.tracked_bytes,
            hot_frames: last.hot_frames,
            publish_time_ns: last.publish_time_ns,
            tracker_report: last.tracker_report,
            entries: last.entries,
        };
        adjust(&mut x);
        self.v.expect = Expect::Ok(x);
        self
    }
    fn none(mut self) -> Self {
        self.v.expect = Expect::None;
        self
    }
    fn err(mut self, code: u32, label: &str) -> Self {
        self.v.expect = Expect::Error {
            code,
            label: label.to_string(),
            entry_index: None,
        };
        self
    }
    fn err_at(mut self, code: u32, label: &str, index: u64) -> Self {
        self.v.expect = Expect::Error {
            code,
            label: label.to_string(),
            entry_index: Some(index),
        };
        self
    }

    /// The region bytes: host block, init, rounds, pokes, cut to `file_len`.
    fn build(&self) -> Vec<u8> {
        let v = &self.v;
        let region = OwnedRegion::zeroed(v.region_size.max(v.file_len) as usize);
        if let Some(fb) = &v.feedback {
            let f = Feedback {
                ack_round: fb.ack_round,
                entry_budget: fb.entry_budget,
                min_interval_ms: fb.min_interval_ms,
                last_status: fb.last_status,
                fast_quota_bytes: fb.fast_quota_bytes,
                rejected_rounds: fb.rejected_rounds,
                host_version: fb.host_version,
            };
            write_feedback(&region, &f).unwrap();
        }
        let cfg = WriterConfig {
            tracker: Tracker::from_raw(v.tracker),
            region_size: Some(v.region_size),
            preserve_feedback: v.feedback.is_some(),
            version: self.writer_version(),
        };
        let mut w = ChannelWriter::init_with(&region, cfg).unwrap();
        for (entries, m) in self.offered.iter().zip(&self.metas) {
            w.publish(entries, m).unwrap();
        }
        for p in &v.pokes {
            match p.size {
                8 => region.store_u64(p.offset as usize, p.value()).unwrap(),
                4 => region
                    .store_u32(p.offset as usize, p.value() as u32)
                    .unwrap(),
                s => panic!("poke size {s}"),
            }
        }
        let mut bytes = region.to_bytes();
        bytes.truncate(v.file_len as usize);
        bytes
    }
}

fn cases() -> Vec<Case> {
    use PageType::*;
    let four = || vec![anon(1), anon(2), anon(3), anon(4)];
    let mut all_types = Vec::new();
    for (i, t) in [Unknown, Anon, File, Shmem].into_iter().enumerate() {
        for bits in 0..4u64 {
            let gfn = 0x1000 + 4 * i as u64 + bits;
            all_types.push(e(
                gfn,
                (gfn % 7) as u32,
                bits & 1 != 0,
                t,
                false,
                bits & 2 != 0,
            ));
        }
    }
    vec![
        // ---- valid ----
        Case::new("ok_initialised_only", "init, no round yet: round 0 means nothing to take").none(),
        Case::new("ok_empty_round", "a published round with no entries").round(vec![]).ok(),
        Case::new("ok_single", "one 4 KiB entry").round(vec![e(0x1234, 3, true, Anon, false, true)]).ok(),
        Case::new(
            "ok_duplicates",
            "the same frame three times and a 4 KiB frame inside a 2 MiB unit: legal, kept as published",
        )
        .round(vec![
            e(0x100, 1, false, Unknown, false, false),
            e(0x100, 5, true, File, false, true),
            huge(0x400),
            e(0x401, 9, true, Anon, false, true),
            e(0x100, 2, false, Anon, false, true),
        ])
        .ok(),
        Case::new("ok_huge_units", "2 MiB units, the last ending exactly at the end of RAM")
            .round(vec![huge(0), huge(0x200), e(0x4_0000, 255, true, Shmem, true, false), huge(0x7_fe00)])
            .ok(),
        Case::new("ok_page_types", "every page type with every write/young combination").round(all_types).ok(),
        Case::new("ok_overflow_flag", "the guest itself found more hot frames than it published")
            .round_keep(vec![anon(10), anon(11)], RoundMeta { overflow: true, hot_frames: 100_000, ..meta(2) }, 2)
            .ok(),
        Case::new("ok_budget_truncated", "host entry_budget 3: the writer keeps the 3 hottest and sets OVERFLOW")
            .feedback(Feedback {
                ack_round: 0,
                entry_budget: 3,
                min_interval_ms: 200,
                fast_quota_bytes: 1 << 30,
                host_version: V1_0_HOST,
                ..Feedback::default()
            })
            .round_keep((20..25).map(anon).collect(), meta(5), 3)
            .ok(),
        Case::new("ok_capacity_full", "count == capacity (8): 10 offered, 8 kept, OVERFLOW set")
            .sizes(4096 + 64, 4096 + 64)
            .round_keep((100..110).map(anon).collect(), meta(10), 8)
            .ok(),
        Case::new("ok_field_maxima", "highest gfn of a 40-bit space, count 255, every flag bit, last 2 MiB unit")
            .ram(&[RAM_2G, [0xff_ffff_0000, 0x100_0000_0000]])
            .round(vec![
                e(0xff_ffff_ffff, 255, true, Shmem, false, true),
                e(0xff_ffff_fe00, 255, true, Shmem, true, true),
                e(0x7_ffff, 0, false, Unknown, false, false),
            ])
            .ok(),
        Case::new("ok_multi_range_hole", "three RAM ranges with holes; entries on every range boundary")
            .ram(&RAM_HOLES)
            .round(vec![anon(0), anon(0x9f), anon(0x100), anon(0x7_ffff), anon(0x10_0000), anon(0x13_ffff), huge(0x13_fe00)])
            .ok(),
        Case::new("ok_huge_across_adjacent_ranges", "a 2 MiB unit spanning two adjacent RAM ranges is all RAM")
            .ram(&[[0, 0x100], [0x100, 0x400]])
            .round(vec![huge(0), huge(0x200)])
            .ok(),
        Case::new("ok_stale_tail", "round 2 is shorter than round 1; garbage past count is never read")
            .round((0..6).map(anon).collect())
            .round(vec![anon(50), anon(51)])
            .poke_entry(4, u64::MAX)
            .ok(),
        Case::new("ok_three_rounds", "the third of three rounds").round(vec![anon(1)]).round(vec![anon(2)]).round(vec![anon(3), anon(4)]).ok(),
        Case::new(
            "ok_minor_version_2",
            "a v1.2 writer: its fields in v1.1 reserved space and new flag bits are ignored, the v1.1 fields read",
        )
        .v1_1()
        .round(vec![rated(7, 120, false, false)])
        .poke32(off::VERSION_MINOR & !3, 2 << 16 | 1)
        .poke32(off::RESERVED_PUBLICATION, 9)
        .poke64(off::RESERVED_TAIL, 0xdead)
        .poke64(0x400, 0xbeef)
        .poke32(off::FLAGS, 0x11)
        .ok_with(|x| {
            x.version_minor = 2;
            x.flags = 0x11;
            x.overflow = true;
        }),
        Case::new("ok_mapped_beyond_region", "the host mapped more than region_size").sizes(8192, 12288).round(vec![anon(1)]).ok(),
        Case::new("ok_entries_offset_8192", "entries_offset 8192: the reader honours it")
            .sizes(16384, 16384)
            .round(vec![anon(1), anon(2)])
            .poke32(off::ENTRIES_OFFSET, 8192)
            .poke64(off::CAPACITY, 1024)
            .poke64(8192, anon(0x300).0)
            .poke64(8200, huge(0x600).0)
            .ok_with(|x| x.entries = vec![EntryJson::from_entry(anon(0x300)), EntryJson::from_entry(huge(0x600))]),
        Case::new("ok_host_block_scribbled", "host feedback and host-reserved bytes are not the guest's to validate")
            .tracker(Tracker::Damon)
            .feedback(Feedback { ack_round: 9, last_status: 11, rejected_rounds: 4, host_version: V1_0_HOST, ..Feedback::default() })
            .round(vec![anon(1)])
            .poke64(0x900, u64::MAX)
            .poke32(0x834, 5)
            .ok(),
        // ---- v1.1 writers ----
        Case::new("ok_v1_1_initialised_only", "a v1.1 init, no round yet").v1_1().none(),
        Case::new(
            "ok_v1_1_round",
            "a v1.1 round: rate levels (255 = ~980 Hz, 112 = 2 Hz, 96 = 1 Hz, 1) and the tracker report",
        )
        .v1_1()
        .round(vec![
            rated(0x200, 255, true, true),
            rated(0x1234, 160, true, false),
            e(0x2000, 112, false, File, false, false),
            e(0x3000, 96, false, Shmem, false, true),
            rated(0x4000, 1, false, false),
        ])
        .ok(),
        Case::new("ok_v1_1_empty_report", "a v1.1 round whose tracker report is all zero (informational)")
            .v1_1()
            .round_keep(vec![rated(9, 100, false, false)], meta(1), 1)
            .ok(),
        Case::new("ok_v1_1_field_maxima", "every v1.1 field at its maximum")
            .v1_1()
            .round_keep(
                vec![rated(0x7_ffff, 255, true, false)],
                RoundMeta {
                    tracker_report: TrackerReport {
                        window: Micros(u32::MAX),
                        coarse_window: Micros(u32::MAX),
                        windows: u32::MAX,
                        tracker_cpu: Micros(u32::MAX),
                        tracked_frames: u64::MAX,
                    },
                    ..meta(1)
                },
                1,
            )
            .ok(),
        Case::new("ok_v1_1_budget_truncated", "a v1.1 writer under a host entry_budget of 2 (fast_quota_bytes set)")
            .v1_1()
            .feedback(Feedback {
                entry_budget: 2,
                fast_quota_bytes: 256 << 20,
                ..Feedback::default()
            })
            .round_keep((30..34).map(|g| rated(g, 200 - g as u32, false, false)).collect(), meta11(4), 2)
            .ok(),
        Case::new("err09_v1_1_reserved_identity", "a v1.1 writer with the identity reserved word set")
            .v1_1()
            .round(vec![anon(1)])
            .poke64(off::RESERVED_IDENTITY + 8, 1)
            .err(9, "reserved_header_bits"),
        Case::new("err09_v1_1_flags_bit", "unknown flag bit 1 from a v1.1 writer")
            .v1_1()
            .round(vec![anon(1)])
            .poke32(off::FLAGS, 3)
            .err(9, "reserved_header_bits"),
        Case::new("err09_v1_1_reserved_08c", "a v1.1 writer with the reserved u32 at 0x08C set")
            .v1_1()
            .round(vec![anon(1)])
            .poke32(off::RESERVED_PUBLICATION, 1)
            .err(9, "reserved_header_bits"),
        Case::new("err09_v1_1_reserved_tail_first", "a v1.1 writer with the first reserved word (0x098) set")
            .v1_1()
            .round(vec![anon(1)])
            .poke64(off::RESERVED_TAIL, 1)
            .err(9, "reserved_header_bits"),
        Case::new("err09_v1_1_reserved_tail_last", "a v1.1 writer with the last reserved word of the guest half set")
            .v1_1()
            .round(vec![anon(1)])
            .poke64(0x7f8, 1 << 63)
            .err(9, "reserved_header_bits"),
        Case::new("err09_v1_0_window_fields", "a v1.0 writer with a v1.1 field (windows, 0x080) set: reserved in v1.0")
            .round(vec![anon(1)])
            .poke32(off::WINDOWS, 5)
            .err(9, "reserved_header_bits"),
        Case::new("err09_v1_0_tracked_frames", "a v1.0 writer with tracked_frames (0x090) set")
            .round(vec![anon(1)])
            .poke64(off::TRACKED_FRAMES, 1 << 20)
            .err(9, "reserved_header_bits"),
        Case::new(
            "err09_v1_1_unknown_fields",
            "what a v1.0 reader took from a v1.1 writer (the former ok_minor_version_1: 0x064, 0x400 and flag \
             bit 4 set) is checked by a v1.1 reader: the unknown flag bit is reported first",
        )
        .round(vec![anon(7)])
        .poke32(off::VERSION_MINOR & !3, 1 << 16 | 1)
        .poke64(0x400, 0xdead)
        .poke32(off::WINDOW_US, 9)
        .poke32(off::FLAGS, 0x11)
        .err(9, "reserved_header_bits"),
        Case::new("order_v1_1_count_before_reserved", "a v1.1 writer: count beyond capacity and 0x08C set")
            .v1_1()
            .round(vec![anon(1)])
            .poke64(off::COUNT, 600)
            .poke32(off::RESERVED_PUBLICATION, 1)
            .err(6, "count_beyond_capacity"),
        Case::new("order_v1_1_header_before_entries", "a v1.1 writer: a reserved tail word and an entry outside RAM")
            .v1_1()
            .round(vec![anon(0x9_0000)])
            .poke64(0x100, 1)
            .err(9, "reserved_header_bits"),
        // ---- one per reject code ----
        Case::new("err01_mapped_below_header", "the host mapped less than the header page")
            .sizes(8192, 2048)
            .round(vec![anon(1)])
            .err(1, "region_too_small"),
        Case::new("err01_region_size_beyond_mapping", "region_size larger than what the host mapped")
            .round(vec![anon(1)])
            .poke64(off::REGION_SIZE, 16384)
            .err(1, "region_too_small"),
        Case::new("err02_bad_magic", "magic VTISMCH0").round(vec![anon(1)]).poke64(off::MAGIC, 0x3048_434D_5349_5456).err(2, "bad_magic"),
        Case::new("err03_version_2", "version_major 2").round(vec![anon(1)]).poke32(off::VERSION_MAJOR, 2).err(3, "unsupported_version"),
        Case::new("err04_header_size", "header_size 2048").round(vec![anon(1)]).poke32(off::HEADER_SIZE, 2048).err(4, "bad_layout"),
        Case::new("err04_entry_size", "entry_size 16").round(vec![anon(1)]).poke32(off::ENTRY_SIZE, 16).err(4, "bad_layout"),
        Case::new("err04_page_shift", "page_shift 21").round(vec![anon(1)]).poke32(off::PAGE_SHIFT, 21).err(4, "bad_layout"),
        Case::new("err04_entries_offset_unaligned", "entries_offset 4100")
            .round(vec![anon(1)])
            .poke32(off::ENTRIES_OFFSET, 4100)
            .err(4, "bad_layout"),
        Case::new("err04_entries_offset_in_header", "entries_offset 2048, inside the header page")
            .round(vec![anon(1)])
            .poke32(off::ENTRIES_OFFSET, 2048)
            .err(4, "bad_layout"),
        Case::new("err05_capacity_beyond_region", "capacity 513 in an 8 KiB region")
            .round(vec![anon(1)])
            .poke64(off::CAPACITY, 513)
            .err(5, "capacity_beyond_region"),
        Case::new("err05_capacity_overflows", "capacity * 8 overflows 64 bits")
            .round(vec![anon(1)])
            .poke64(off::CAPACITY, 1 << 61)
            .err(5, "capacity_beyond_region"),
        Case::new("err06_count_beyond_capacity", "count 513 with capacity 512")
            .round(vec![anon(1)])
            .poke64(off::COUNT, 513)
            .err(6, "count_beyond_capacity"),
        Case::new("err07_write_in_progress", "seq odd: the guest is writing").round(vec![anon(1)]).poke64(off::SEQ, 5).err(7, "write_in_progress"),
        Case::new("err09_reserved0", "identity reserved word set").round(vec![anon(1)]).poke64(off::RESERVED_IDENTITY + 8, 1).err(9, "reserved_header_bits"),
        Case::new("err09_reserved1", "publication reserved u32 set").round(vec![anon(1)]).poke32(off::WINDOW_US, 1).err(9, "reserved_header_bits"),
        Case::new("err09_reserved2_last_word", "last reserved word of the guest half set")
            .round(vec![anon(1)])
            .poke64(0x7f8, 1 << 63)
            .err(9, "reserved_header_bits"),
        Case::new("err09_flags_bit", "unknown flag bit 1 from a v1.0 writer").round(vec![anon(1)]).poke32(off::FLAGS, 2).err(9, "reserved_header_bits"),
        Case::new("err10_reserved_entry_bits", "entry 2 has bit 53 set")
            .round(four())
            .poke_entry(2, anon(3).0 | 1 << 53)
            .err_at(10, "reserved_entry_bits", 2),
        Case::new("err11_gfn_in_hole", "entry 1 in the hole below 4 GiB")
            .ram(&RAM_HOLES)
            .round(vec![anon(5), anon(0x8_0000)])
            .err_at(11, "gfn_out_of_range", 1),
        Case::new("err11_gfn_past_end", "entry 0 one past the end of RAM").round(vec![anon(0x8_0000)]).err_at(11, "gfn_out_of_range", 0),
        Case::new("err11_gfn_in_low_hole", "entry in the VGA hole").ram(&RAM_HOLES).round(vec![anon(0xa0)]).err_at(11, "gfn_out_of_range", 0),
        Case::new("err11_huge_tail_past_end", "a 2 MiB unit whose head is RAM but whose tail is not")
            .ram(&[[0, 0x7_ff00]])
            .round(vec![anon(1), huge(0x7_fe00)])
            .err_at(11, "gfn_out_of_range", 1),
        Case::new("err11_huge_over_hole", "a 2 MiB unit over the low hole")
            .ram(&RAM_HOLES)
            .round(vec![huge(0)])
            .err_at(11, "gfn_out_of_range", 0),
        Case::new("err12_misaligned_huge", "a 2 MiB unit at gfn 0x201")
            .round(four())
            .poke_entry(3, huge(0x200).0 | 1)
            .err_at(12, "misaligned_huge", 3),
        // ---- check order ----
        Case::new("order_seq_before_magic", "odd seq and bad magic: the seqlock is read first")
            .round(vec![anon(1)])
            .poke64(off::SEQ, 7)
            .poke64(off::MAGIC, 0)
            .err(7, "write_in_progress"),
        Case::new("order_version_before_region_size", "major 2 and a huge region_size: the version decides")
            .round(vec![anon(1)])
            .poke32(off::VERSION_MAJOR, 2)
            .poke64(off::REGION_SIZE, u64::MAX)
            .err(3, "unsupported_version"),
        Case::new("order_count_before_reserved", "count beyond capacity and a reserved word set")
            .round(vec![anon(1)])
            .poke64(off::COUNT, 600)
            .poke64(off::RESERVED_IDENTITY, 1)
            .err(6, "count_beyond_capacity"),
        Case::new("order_header_before_entries", "a reserved header word and a bad entry")
            .round(vec![anon(0x9_0000)])
            .poke64(0x100, 1)
            .err(9, "reserved_header_bits"),
        Case::new("order_first_bad_entry_wins", "entry 0 misaligned huge, entry 1 reserved bits: entries are judged in order")
            .round(four())
            .poke_entry(0, huge(0x200).0 | 3)
            .poke_entry(1, anon(2).0 | 1 << 63)
            .err_at(12, "misaligned_huge", 0),
        Case::new("order_range_before_alignment", "a misaligned 2 MiB unit that is also outside RAM")
            .round(vec![anon(1)])
            .poke_entry(0, huge(0x7_fe00).0 | 0x100)
            .err_at(11, "gfn_out_of_range", 0),
    ]
}

/// False if `hz`'s unrounded level `16 log2(hz) + 96` lies within `margin` of a boundary between
/// two levels: such a case would test the f64 reference's rounding, not the implementation.
fn clear_of_boundary(hz: f64, margin: f64) -> bool {
    if hz <= 0.0 {
        return true;
    }
    let x = hz.log2() * 16.0 + 96.0;
    (x - x.floor() - 0.5).abs() > margin
}

struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// `a * a` for a little-endian multi-limb number.
fn square(a: &[u64]) -> Vec<u64> {
    let mut out = vec![0u64; 2 * a.len()];
    for (i, &x) in a.iter().enumerate() {
        let mut carry = 0u128;
        for (j, &y) in a.iter().enumerate() {
            let t = u128::from(out[i + j]) + u128::from(x) * u128::from(y) + carry;
            out[i + j] = t as u64;
            carry = t >> 64;
        }
        out[i + a.len()] = carry as u64;
    }
    out
}

/// `floor(32 log2 m)`, exactly: the bit length of `m^32` less one.
fn floor_32_log2(m: u64) -> u32 {
    let mut n = vec![m];
    for _ in 0..5 {
        n = square(&n);
    }
    let top = n.iter().rposition(|&l| l != 0).expect("m > 0");
    top as u32 * 64 + 63 - n[top].leading_zeros()
}

/// The level of `rate / 2^shift` Hz in integers only, as a second reference beside the f64
/// `level_of_rate`: with the mantissa `m = rate << (63 - msb)`, `16 log2(m / 2^63)` rounds to
/// `floor((floor(32 log2 m) - 2015) / 2)` (never a tie: `2^(k/32)` is irrational unless 32 | k).
fn exact_level(rate: u64, shift: u32) -> u8 {
    if rate == 0 {
        return 0;
    }
    let msb = 63 - rate.leading_zeros();
    let sixteenths = (floor_32_log2(rate << (63 - msb)) - 2015) / 2;
    (16 * (i64::from(msb) - i64::from(shift)) + 96 + i64::from(sixteenths)).clamp(0, 255) as u8
}

/// The least 64-bit mantissa that rounds to `j` sixteenths of an octave (1 <= j <= 16).
fn level_step(j: u32) -> u64 {
    let (mut lo, mut hi) = (1u64 << 63, u64::MAX);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if floor_32_log2(mid) >= 2015 + 2 * j {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    lo
}

/// Rates for `vtism_ch_level_of_rate`, which is exact: zero, the extremes, every power of two,
/// both sides of every boundary between two levels, and pseudo-random rates. The f64 reference
/// and the integer one must agree on each; the 64-bit mantissas on either side of a boundary,
/// which f64 cannot tell apart, have the integer reference's level.
fn rate_levels() -> Vec<RateLevel> {
    let mut cases = std::collections::BTreeSet::new();
    for c in [
        (0, 0),
        (0, 32),
        (1, 0),
        (3, 1),
        (1, 63),
        (1, 127),
        (u64::MAX, 0),
        (u64::MAX, 63),
    ] {
        cases.insert(c);
    }
    for shift in [0, 16, 32] {
        for e in 0..64 {
            cases.insert((1u64 << e, shift));
        }
    }
    // Rates of 2^-16 Hz steps around 2^((l - 96.5) / 16) Hz, where level l begins.
    for l in 1..=255u32 {
        let t = ((f64::from(l) - 96.5) / 16.0 + 16.0).exp2().floor() as u64;
        for r in t.saturating_sub(1)..=t + 2 {
            cases.insert((r, 16));
        }
    }
    let mut x = XorShift(0x5eed_1e7e_15ba_d5e7);
    for _ in 0..256 {
        let v = x.next();
        cases.insert((v >> (v % 64), (x.next() % 48) as u32));
    }
    let mut out: Vec<RateLevel> = cases
        .into_iter()
        .filter_map(|(rate, shift)| {
            let hz = rate as f64 / f64::from(shift).exp2();
            let level = level_of_rate(hz);
            clear_of_boundary(hz, 1e-9).then(|| {
                assert_eq!(level, exact_level(rate, shift), "{rate} / 2^{shift} Hz");
                RateLevel { rate, shift, level }
            })
        })
        .collect();
    for j in 1..=16 {
        let step = level_step(j);
        for (rate, shift) in [(step - 1, 63), (step, 63), (step - 1, 60), (step, 60)] {
            out.push(RateLevel {
                rate,
                shift,
                level: exact_level(rate, shift),
            });
        }
    }
    out
}

/// The unrounded level of a young share (of 2^32) of windows of `window_us`.
fn share_x(share: u64, window_us: u32) -> f64 {
    let hz = rate_of_young_share(share as f64 / 2f64.powi(32), f64::from(window_us) / 1e6);
    hz.log2() * 16.0 + 96.0
}

/// Shares (of 2^32) whose level lies 1.5e-4 to 1e-3 of a level below and above each boundary
/// between levels, for 1 ms and 1 s windows: an implementation whose rate is off by more than
/// about 1e-5 (relative) gets some of them wrong.
fn near_boundary_shares() -> Vec<(u64, u32)> {
    let mut out = Vec::new();
    for window_us in [1_000u32, 1_000_000] {
        for l in 1..=255u32 {
            let edge = f64::from(l) - 0.5;
            let max = 1u64 << 32;
            if share_x(1, window_us) >= edge || share_x(max - (max >> 8), window_us) <= edge {
                continue;
            }
            // The least share at or above the boundary.
            let (mut lo, mut hi) = (1u64, max - (max >> 8));
            while lo < hi {
                let mid = lo + (hi - lo) / 2;
                if share_x(mid, window_us) >= edge {
                    hi = mid;
                } else {
                    lo = mid + 1;
                }
            }
            let slope = (share_x(lo + 1000, window_us) - share_x(lo, window_us)) / 1000.0;
            let k = (1.5e-4 / slope).ceil() as u64;
            for share in [lo.saturating_sub(k), lo + k] {
                let d = (share_x(share, window_us) - edge).abs();
                if (1e-4..1e-3).contains(&d) {
                    out.push((share, window_us));
                }
            }
        }
    }
    out
}

/// Young shares for `vtism_ch_level_of_share`, whose rate is within 1e-6 of the exact one: cases
/// within 1e-4 of a level of a boundary are left out.
fn share_levels() -> Vec<ShareLevel> {
    let mut cases = std::collections::BTreeSet::new();
    let mut x = XorShift(0x0bad_cafe_f00d_d00d);
    for bits in [8u32, 16, 32] {
        let one = 1u64 << bits;
        let mut shares = vec![0, 1, 2, 3, one / 2, one - one / 256, one - 1, one, one + 5];
        if bits >= 10 {
            // Around 2^-10, where the C helper switches from its series to its logarithm.
            let k = one >> 10;
            shares.extend([k - 1, k, k + 1]);
        }
        for _ in 0..8 {
            shares.push(x.next() % (one + 1));
        }
        for share in shares {
            for window_us in [1, 50, 1_000, 100_000, 10_000_000, u32::MAX] {
                cases.insert((share, bits, window_us));
            }
            cases.insert((share, bits, (x.next() % 1_000_000) as u32 + 1));
        }
    }
    for (share, window_us) in near_boundary_shares() {
        cases.insert((share, 32, window_us));
    }
    cases
        .into_iter()
        .filter_map(|(share, share_bits, window_us)| {
            let hz = rate_of_young_share(
                share as f64 / f64::from(share_bits).exp2(),
                f64::from(window_us) / 1e6,
            );
            clear_of_boundary(hz, 1e-4).then(|| ShareLevel {
                share,
                share_bits,
                window_us,
                level: level_of_rate(hz),
            })
        })
        .collect()
}

/// Every vector: its description and its bytes.
pub fn generate() -> (VectorFile, Vec<(String, Vec<u8>)>) {
    let cases = cases();
    let bins = cases
        .iter()
        .map(|c| (c.v.file.clone(), c.build()))
        .collect();
    let file = VectorFile {
        format: FORMAT.to_string(),
        version: 2,
        notes: vec![
            "Generated by `cargo run -p vtism-proto --example gen_vectors`; do not edit by hand.".to_string(),
            "Each .bin is the region as the host mapped it (file_len bytes). To rebuild one: zero \
             max(region_size, file_len) bytes, write the feedback block (if any) with host_seq as given, \
             init with region_size, tracker and version_minor (preserving feedback if present), publish \
             each round's entries and metadata (with its tracker_report when not null), apply the pokes, \
             keep file_len bytes."
                .to_string(),
            "Expected results are for a fresh reader (last round taken = 0). TornRound (code 8) needs a region \
             that changes during the read, so it is covered by crates/proto/tests/reader.rs, not by a static file."
                .to_string(),
            "rate_levels and share_levels are the v1.1 rate-level scale (vtism_proto::count) as the C \
             helpers vtism_ch_level_of_rate and vtism_ch_level_of_share must compute it."
                .to_string(),
        ],
        vectors: cases.into_iter().map(|c| c.v).collect(),
        rate_levels: rate_levels(),
        share_levels: share_levels(),
    };
    (file, bins)
}

/// The JSON text exactly as committed.
pub fn to_json(file: &VectorFile) -> String {
    let mut s = serde_json::to_string_pretty(file).expect("serialisable");
    s.push('\n');
    s
}

pub fn vectors_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/vectors/channel")
}
