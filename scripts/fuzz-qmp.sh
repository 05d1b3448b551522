#!/usr/bin/env bash
# Fuzzes what vtismd parses from a QEMU monitor (fuzz/fuzz_targets/qmp_reply.rs); the run is
# recorded in docs/host.md ("Threat model: compromised QEMU").
# Usage: scripts/fuzz-qmp.sh [seconds]   (default 600; one job, niced: the machine is shared)
# What it finds accumulates in fuzz/corpora/qmp_reply and fuzz/executions.tsv (scripts/fuzz-run.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-600}

# Seeds: what real QEMU 7.2 sent in the captured inspect exchanges (mode 0: the whole monitor
# side of the exchange), and the same answers split for mode 1.
corpus=fuzz/corpus/qmp_reply
mkdir -p "$corpus"
for f in crates/host/tests/fixtures/qemu-7.2/inspect-*.qmp.jsonl; do
    { printf '\x00'; sed -n 's/^<- //p' "$f"; } > "$corpus/seed-$(basename "$f" .qmp.jsonl)"
done
for f in crates/host/tests/fixtures/qemu-7.2/mtree-*.txt; do
    { printf '\x01[{"id": "m0", "size": 268435456}, {"id": "m1", "size": 268435456}, {"id": "mhp", "size": 268435456}]\x00'
      cat "$f"
      printf '\x00Host virtual address for 0x0 (m0) is 0x7f0000000000\n'
      printf '\x007f0000000000-7f0040000000 rw-p 00000000 00:00 0\n'
    } > "$corpus/seed-$(basename "$f" .txt)"
done

exec scripts/fuzz-run.sh qmp_reply "$secs" 65536
