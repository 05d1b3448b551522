#!/usr/bin/env bash
# Simulator benchmark (docs/performance.md, "Simulator"): wall time and peak memory of
#  1. one 32 GiB VM (GUPS hot-set scaled to 32 GiB) for 600 simulated seconds, vtism and the
#     slowest peer, each after its all-fast reference run;
#  2. 64 VMs x 32 GiB under vtism, 600 simulated seconds (SIM_BENCH_MANY_S to change).
# Release build. Usage: scripts/bench-sim.sh [--skip-many]
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${VTISM_BIN:-target/release/vtism}
if [ -z "${VTISM_BIN:-}" ]; then
  nice -n 10 cargo build --release -q -p vtism
fi
# gups-hotset is 14 GiB at scale 1: 32/14 makes it 32 GiB (16384 units of 2 MiB).
SCALE=2.2857142857142856
MANY_S=${SIM_BENCH_MANY_S:-600}

measure() { # label, command...
  local label=$1
  shift
  local t0 t1 rss
  t0=$(date +%s.%N)
  /usr/bin/time -f '%M' -o /tmp/bench-sim.rss "$@" > /tmp/bench-sim.out
  t1=$(date +%s.%N)
  rss=$(cat /tmp/bench-sim.rss)
  awk -v l="$label" -v a="$t0" -v b="$t1" -v r="$rss" \
    'BEGIN { printf "%-48s wall %7.1f s   peak RSS %7.0f MiB\n", l, b - a, r / 1024 }'
}

echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores"
for p in vtism memtis tpp hmmv; do
  measure "1 VM x 32 GiB, 600 s, $p (+ all-fast)" \
    "$BIN" sim run --policy "$p" --workload gups-hotset --scale "$SCALE" --duration 600 --json
done
if [ "${1:-}" != "--skip-many" ]; then
  measure "64 VMs x 32 GiB, ${MANY_S} s, vtism (+ all-fast)" \
    "$BIN" sim run --policy vtism --workload gups-hotset --scale "$SCALE" --vms 64 \
      --duration "$MANY_S" --json
fi
