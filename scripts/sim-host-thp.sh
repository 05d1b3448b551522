#!/usr/bin/env bash
# "Split or not" (issue 26): vtism on 2 MiB host folios as the engine decides, with its split
# requests never carried out (vtism-no-split), on 4 KiB host pages as the simulator modelled
# them before (no --host-pages: no TLB cost) and with their TLB cost (--host-pages 4k), and the
# peers on host folios; the standard workloads at 4 KiB units (so that a folio has 4 KiB
# structure), cxl 1:4, 600 s. One JSON line per run in $OUT/<workload>-s<seed>-<policy>.json
# (-4k, -4k-tlb for the 4 KiB runs); scripts/sim-host-thp-table.py tabulates them. SEEDS,
# WORKLOADS, PEERS, JOBS, DURATION and OUT may be set.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${VTISM_BIN:-target/release/vtism}
if [ -z "${VTISM_BIN:-}" ]; then
  nice -n 10 cargo build --release -q -p vtism
fi
OUT=${OUT:-/tmp/sim-host-thp}
SEEDS=${SEEDS:-"1 2"}
WORKLOADS=${WORKLOADS:-"kv-zipf graph gups-hotset gups-hotset-move seq-window file-cache"}
PEERS=${PEERS:-"memtis hmmv hemem tpp"}
JOBS=${JOBS:-2}
DURATION=${DURATION:-600}
mkdir -p "$OUT"
jobs_file=$(mktemp)
# vtism's three first, seed by seed, then the peers.
for seed in $SEEDS; do
  for w in $WORKLOADS; do
    for p in vtism vtism-no-split; do echo "$w $seed $p thp"; done
    echo "$w $seed vtism 4k"
    echo "$w $seed vtism 4k-tlb"
  done
  for w in $WORKLOADS; do
    for p in $PEERS; do echo "$w $seed $p thp"; done
  done
done > "$jobs_file"
run_job() {
  local w=$1 seed=$2 p=$3 backing=$4
  local name="$w-s$seed-$p" flag="--host-pages thp"
  case $backing in
    4k) name="$name-4k"; flag= ;;
    4k-tlb) name="$name-4k-tlb"; flag="--host-pages 4k" ;;
  esac
  [ -s "$OUT/$name.json" ] && return 0
  # shellcheck disable=SC2086 # $flag is empty or one option
  nice -n 10 "$BIN" sim run --policy "$p" --workload "$w" --model cxl --ratio 1:4 \
    --duration "$DURATION" --unit 4k --seed "$seed" --sample-s 2 $flag --json \
    > "$OUT/$name.json.part" 2> "$OUT/$name.err" && mv "$OUT/$name.json.part" "$OUT/$name.json"
}
export -f run_job
export BIN OUT DURATION
xargs -P "$JOBS" -L 1 bash -c 'run_job "$@"' _ < "$jobs_file"
rm -f "$jobs_file"
