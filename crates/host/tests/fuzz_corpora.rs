//! Replays the fuzz corpora kept in the repository (`fuzz/corpora/<target>`, minimised from the
//! runs recorded in docs/host.md, "Fuzzing") through the fuzz targets' own code
//! (`fuzz/fuzz_targets/<target>_body.rs`), on stable Rust and without libFuzzer: every input a
//! fuzzer ever found interesting, including those of past crashes, must still pass every check
//! of its target.

#[allow(dead_code)]
#[path = "../../../fuzz/fuzz_targets/channel_reader_body.rs"]
mod channel_reader;
#[allow(dead_code)]
#[path = "../../../fuzz/fuzz_targets/qmp_reply_body.rs"]
mod qmp_reply;

use std::path::PathBuf;

fn corpus(target: &str) -> Vec<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpora")
        .join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files
}

/// Runs `run` over every input of the target's corpus; a panic names the input.
fn replay(target: &str, run: fn(&[u8])) {
    let files = corpus(target);
    assert!(!files.is_empty(), "the {target} corpus is empty");
    for f in &files {
        let data = std::fs::read(f).unwrap();
        if std::panic::catch_unwind(|| run(&data)).is_err() {
            panic!("{target}: {} fails its checks", f.display());
        }
    }
    eprintln!("{target}: {} inputs replayed", files.len());
}

#[test]
fn the_channel_reader_corpus_passes() {
    replay("channel_reader", channel_reader::run);
}

#[test]
fn the_qmp_reply_corpus_passes() {
    replay("qmp_reply", qmp_reply::run);
}
