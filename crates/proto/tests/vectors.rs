//! The shared vectors in tests/vectors/channel/: the committed files are exactly what the
//! generator produces, and a fresh reader decodes each one as vectors.json says.

#[path = "support/vectors.rs"]
mod vectors;

use std::collections::BTreeSet;
use std::fs;
use vectors::{EntryJson, Expect, ExpectRound, TrackerReportJson, VectorFile};
use vtism_proto::{ChannelReader, Gfn, GfnRange, OwnedRegion, RamMap};

fn committed() -> VectorFile {
    let text =
        fs::read_to_string(vectors::vectors_dir().join("vectors.json")).expect("vectors.json");
    serde_json::from_str(&text).expect("vectors.json parses")
}

#[test]
fn committed_files_match_the_generator() {
    let dir = vectors::vectors_dir();
    let (file, bins) = vectors::generate();
    let json = fs::read_to_string(dir.join("vectors.json")).expect("vectors.json");
    assert!(
        json == vectors::to_json(&file),
        "vectors.json is stale: run `cargo run -p vtism-proto --example gen_vectors`"
    );
    for (name, bytes) in &bins {
        let on_disk = fs::read(dir.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(
            &on_disk == bytes,
            "{name} differs from the generator's output"
        );
    }
    let generated: BTreeSet<_> = bins.iter().map(|(n, _)| n.clone()).collect();
    let present: BTreeSet<_> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".bin"))
        .collect();
    assert_eq!(present, generated, "stray or missing .bin files");
}

#[test]
fn every_vector_decodes_as_described() {
    let file = committed();
    assert_eq!(file.format, vectors::FORMAT);
    assert!(file.vectors.len() >= 40, "vector list truncated?");
    let mut failures = Vec::new();
    let mut seen_codes = BTreeSet::new();
    for v in &file.vectors {
        let bytes = fs::read(vectors::vectors_dir().join(&v.file)).expect("vector file");
        assert_eq!(bytes.len() as u64, v.file_len, "{}: file_len", v.name);
        let ram = RamMap::new(
            v.ram_map
                .iter()
                .map(|&[s, e]| GfnRange::new(Gfn(s), Gfn(e)))
                .collect(),
        )
        .expect("valid RAM map");
        let mut reader = ChannelReader::new();
        let got = match reader.read(&OwnedRegion::from_bytes(&bytes), &ram) {
            Ok(Some(r)) => Expect::Ok(ExpectRound {
                seq: r.seq,
                round: r.round,
                version_minor: r.version_minor,
                counts: r.counts(),
                tracker: r.tracker.raw(),
                flags: r.flags,
                overflow: r.overflow(),
                scan_interval_ms: r.scan_interval_ms,
                scan_duration_us: r.scan_duration_us,
                tracked_bytes: r.tracked_bytes,
                hot_frames: r.hot_frames,
                publish_time_ns: r.publish_time_ns,
                tracker_report: r.tracker_report.map(TrackerReportJson::from_report),
                entries: r
                    .entries
                    .iter()
                    .copied()
                    .map(EntryJson::from_entry)
                    .collect(),
            }),
            Ok(None) => Expect::None,
            Err(e) => {
                seen_codes.insert(e.code());
                Expect::Error {
                    code: e.code(),
                    label: e.label().to_string(),
                    entry_index: e.entry_index(),
                }
            }
        };
        if got != v.expect {
            failures.push(format!(
                "{}:\n  expected {:?}\n  got      {:?}",
                v.name, v.expect, got
            ));
        }
        // Counters agree with the verdict.
        let c = reader.counters();
        assert_eq!(
            c.accepted() + c.no_new_round() + c.total_rejected(),
            1,
            "{}",
            v.name
        );
    }
    assert!(
        failures.is_empty(),
        "{} vector(s) failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
    let missing: Vec<_> = (1..=12)
        .filter(|c| *c != 8 && !seen_codes.contains(c))
        .collect();
    assert!(missing.is_empty(), "no vector for reject codes {missing:?}");
}

#[test]
fn level_tables_cover_the_scale() {
    let file = committed();
    let rate_levels: BTreeSet<u8> = file.rate_levels.iter().map(|c| c.level).collect();
    assert_eq!(rate_levels.len(), 256, "every level 0-255 has a rate case");
    // Both sides of each boundary: some rate case of level l - 1 and one of l at shift 16,
    // one 2^-16 Hz apart.
    for l in 1..=255u8 {
        let has = |level: u8| {
            file.rate_levels.iter().any(|c| {
                c.shift == 16 && c.level == level && {
                    let next = file
                        .rate_levels
                        .iter()
                        .find(|d| d.shift == 16 && d.rate == c.rate + 1);
                    next.is_some_and(|d| d.level == l)
                }
            })
        };
        assert!(
            has(l - 1),
            "no adjacent rates straddle the boundary below level {l}"
        );
    }
    let share_levels: BTreeSet<u8> = file.share_levels.iter().map(|c| c.level).collect();
    assert!(
        share_levels.len() > 100 && share_levels.contains(&0) && share_levels.contains(&255),
        "share cases reach {} levels",
        share_levels.len()
    );
}
