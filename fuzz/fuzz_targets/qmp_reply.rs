//! cargo-fuzz target: `qmp_reply_body.rs` is what it runs (make test replays the kept corpus,
//! `fuzz/corpora/qmp_reply`, through the same file).
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "qmp_reply_body.rs"]
mod body;

fuzz_target!(|data: &[u8]| body::run(data));
