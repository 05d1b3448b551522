//! The shared channel vectors: their JSON schema and the generator that builds them.
//!
//! Shared by `examples/gen_vectors.rs` (writes tests/vectors/channel/) and `tests/vectors.rs`
//! (regenerates in memory and compares with the committed files, so the two cannot drift).
//! Each region is built the way a guest would build it (`write_feedback` for a host block, then
//! `ChannelWriter` init and publishes) and hostile cases are made by poking bytes afterwards; the
//! C test replays the same steps with the C helpers and must get the same bytes.
#![allow(dead_code)]

use serde::{Deserialize, Serialize};
use vtism_proto::layout::{self, off};
use vtism_proto::{
    write_feedback, ChannelWriter, Feedback, Gfn, HintEntry, OwnedRegion, PageType, RoundMeta,
    SharedRegion, Tracker, WriterConfig,
};

pub const FORMAT: &str = "vtism-channel-vectors";

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VectorFile {
    pub format: String,
    pub version: u32,
    pub notes: Vec<String>,
    pub vectors: Vec<Vector>,
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
    pub entries: Vec<EntryJson>,
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
    pub tracker: u32,
    pub flags: u32,
    pub overflow: bool,
    pub scan_interval_ms: u32,
    pub scan_duration_us: u32,
    pub tracked_bytes: u64,
    pub hot_frames: u64,
    pub publish_time_ns: u64,
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
    }
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
            entries: kept.iter().copied().map(EntryJson::from_entry).collect(),
        });
        self.offered.push(entries);
        self.metas.push(m);
        self
    }
    fn round(self, entries: Vec<HintEntry>) -> Self {
        let n = entries.len();
        let m = meta(n as u64);
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
            version_minor: 0,
            tracker: self.v.tracker,
            flags: last.flags,
            overflow: last.flags & 1 != 0,
            scan_interval_ms: last.scan_interval_ms,
            scan_duration_us: last.scan_duration_us,
            tracked_bytes: last.tracked_bytes,
            hot_frames: last.hot_frames,
            publish_time_ns: last.publish_time_ns,
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
        Case::new("ok_minor_version_1", "a v1.1 writer may use reserved header space and new flag bits")
            .round(vec![anon(7)])
            .poke32(off::VERSION_MINOR & !3, 1 << 16 | 1)
            .poke64(0x400, 0xdead)
            .poke32(off::RESERVED1, 9)
            .poke32(off::FLAGS, 0x11)
            .ok_with(|x| {
                x.version_minor = 1;
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
            .feedback(Feedback { ack_round: 9, last_status: 11, rejected_rounds: 4, ..Feedback::default() })
            .round(vec![anon(1)])
            .poke64(0x900, u64::MAX)
            .poke32(0x834, 5)
            .ok(),
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
        Case::new("err09_reserved0", "identity reserved word set").round(vec![anon(1)]).poke64(off::RESERVED0 + 8, 1).err(9, "reserved_header_bits"),
        Case::new("err09_reserved1", "publication reserved u32 set").round(vec![anon(1)]).poke32(off::RESERVED1, 1).err(9, "reserved_header_bits"),
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
            .poke64(off::RESERVED0, 1)
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

/// Every vector: its description and its bytes.
pub fn generate() -> (VectorFile, Vec<(String, Vec<u8>)>) {
    let cases = cases();
    let bins = cases
        .iter()
        .map(|c| (c.v.file.clone(), c.build()))
        .collect();
    let file = VectorFile {
        format: FORMAT.to_string(),
        version: 1,
        notes: vec![
            "Generated by `cargo run -p vtism-proto --example gen_vectors`; do not edit by hand.".to_string(),
            "Each .bin is the region as the host mapped it (file_len bytes). To rebuild one: zero \
             max(region_size, file_len) bytes, write the feedback block (if any) with host_seq as given, \
             init with region_size and tracker (preserving feedback if present), publish each round's \
             entries and metadata, apply the pokes, keep file_len bytes."
                .to_string(),
            "Expected results are for a fresh reader (last round taken = 0). TornRound (code 8) needs a region \
             that changes during the read, so it is covered by crates/proto/tests/reader.rs, not by a static file."
                .to_string(),
        ],
        vectors: cases.into_iter().map(|c| c.v).collect(),
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
