//! cargo-fuzz target: `channel_reader_body.rs` is what it runs (make test replays the kept corpus,
//! `fuzz/corpora/channel_reader`, through the same file).
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "channel_reader_body.rs"]
mod body;

fuzz_target!(|data: &[u8]| body::run(data));
