#!/usr/bin/env bash
# Reproduces the channel-reader fuzz run recorded in docs/channel.md ("Fuzzing").
# Usage: scripts/fuzz-channel.sh [seconds]   (default 600; one job, niced: the machine is shared)
# What it finds accumulates in fuzz/corpora/channel_reader and fuzz/executions.tsv
# (scripts/fuzz-run.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-600}

# Seed the corpus with the shared vectors, as mode 0 (raw region) with the RAM map [0, 0x80000):
# mode 0, one range starting at 0, no gap, length 0x7ffff + 1.
corpus=fuzz/corpus/channel_reader
mkdir -p "$corpus"
for f in tests/vectors/channel/*.bin; do
    { printf '\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\xff\xff\x07\x00'; cat "$f"; } \
        > "$corpus/seed-$(basename "$f" .bin)"
done

exec scripts/fuzz-run.sh channel_reader "$secs" 16500
