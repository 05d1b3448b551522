#!/usr/bin/env bash
# Fails when docs/evaluation.md no longer describes HEAD: reruns vtism's row of every one-VM
# workload of the cxl 1:4 configuration (same seed, same results) and compares it, figure by
# figure as printed, with the row in docs/evaluation/cxl-1to4/table.txt, which
# scripts/gen-evaluation.sh generated with the rest. Any change to the engine, the guest tracker's
# code, the daemon's round or the simulator that moves vtism's placement shows here; regenerate
# the evaluation with it. Usage: scripts/check-evaluation.sh (VTISM_BIN may name the binary).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${VTISM_BIN:-target/release/vtism}
DIR=docs/evaluation
TABLE=$DIR/cxl-1to4/table.txt
duration=$(cat "$DIR/duration")
generated=$(cat "$DIR/commit")
workloads="gups-hotset gups-hotset-move kv-zipf graph seq-window file-cache"

stale=0
for w in $workloads; do
  # The vtism row of the workload's section (sections start with "<workload> on cxl at ...").
  want=$(awk -v w="$w" '$1 == w && $2 == "on" { s = 1; next } s && /^\| vtism \|/ { print; exit }' "$TABLE")
  if [ -z "$want" ]; then
    echo "check-evaluation: no vtism row for $w in $TABLE" >&2
    exit 1
  fi
  got=$("$BIN" sim run --policy vtism --workload "$w" --model cxl --ratio 1:4 \
    --duration "$duration" --sample-s 2 | grep '^| vtism |')
  if [ "$got" = "$want" ]; then
    echo "check-evaluation: $w: $got"
  else
    echo "check-evaluation: $w differs from docs/evaluation.md (generated at $generated):" >&2
    echo "  table: $want" >&2
    echo "  HEAD:  $got" >&2
    stale=1
  fi
done
if [ "$stale" = 1 ]; then
  echo "check-evaluation: docs/evaluation.md is stale; regenerate it: scripts/gen-evaluation.sh" >&2
  exit 1
fi
echo "check-evaluation: vtism's cxl 1:4 rows match docs/evaluation.md (generated at $generated)"
