#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
#
# Benchmark of the guest tracker (vtism_guest.ko) in one TCG guest; NOT part of `make test`.
# Boots the kernel under QEMU TCG with an ivshmem-plain channel (as run-e2e.sh does), runs
# bench-init.sh in it, and prints the figures recorded in docs/performance.md ("Guest tracker"):
#   1. PTEs visited, subtrees skipped, scan time per GiB, prune=1 vs prune=0, per sparsity shape
#   2. throughput of a GUPS-like workload: no module / adaptive default interval / fixed 100 ms
#   3. the same workload as one process, tracking off and on (module defaults) in interleaved
#      phases A1 B1 A2 ... A<n+1>: paired ratios of each B phase to the A phases around it
# TCG timings are not hardware timings: only ratios measured within the one run mean anything.
#
# usage: guest/tests/bench.sh [6.12|6.1]       (default 6.12)
# env:   VTISM_BENCH_OUT  work dir (default <repo>/build/bench)
#        VTISM_BENCH_MB (512) VTISM_BENCH_ROUNDS (5) VTISM_BENCH_SECS (15) VTISM_BENCH_REPS (4)
#        VTISM_BENCH_PARTS (prune,tput,ab: which parts run)
#        VTISM_BENCH_AB_PAIRS (12) VTISM_BENCH_AB_SECS (20): part 3's B phases and their length
set -euo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
tests=$repo/guest/tests
out=${VTISM_BENCH_OUT:-$repo/build/bench}
s=${1:-6.12}
mb=${VTISM_BENCH_MB:-512}
rounds=${VTISM_BENCH_ROUNDS:-5}
secs=${VTISM_BENCH_SECS:-15}
reps=${VTISM_BENCH_REPS:-4}
parts=${VTISM_BENCH_PARTS:-prune,tput,ab}
ab_pairs=${VTISM_BENCH_AB_PAIRS:-12}
ab_secs=${VTISM_BENCH_AB_SECS:-20}
mkdir -p "$out/$s"
d=$out/$s

"$repo"/scripts/guest-kernels.sh "$s" >"$out/kernels.env"
# shellcheck disable=SC1090
. "$repo/build/guest-kernels/$s/env"
make -s -C "$repo/guest/module" all-kernels SERIES="$s" >"$d/build.log" 2>&1
gcc -static -O2 -Wall -Wextra -Werror -o "$out/bench-workload" "$tests/bench_workload.c"
python3 "$tests/mkinitramfs.py" --init "$tests/bench-init.sh" \
	--module "$repo/build/module/$s/vtism_guest.ko" --workload "$out/bench-workload" \
	-o "$d/initramfs.cpio.gz"

chan=/dev/shm/vtism-bench-$s-$$.chan
rm -f "$chan"
truncate -s 16M "$chan"
trap 'rm -f "$chan"; [ -n "${qpid:-}" ] && kill "$qpid" 2>/dev/null || true' EXIT
echo "bench: booting $KVER (TCG, 2 vCPUs, 2 GiB), serial log $d/serial.log"
t0=$(date +%s)
load0=$(cut -d' ' -f1-3 /proc/loadavg)
nice -n 10 qemu-system-x86_64 -accel tcg -cpu max -smp 2 -m 2G \
	-display none -monitor none -no-reboot -serial "file:$d/serial.log" \
	-kernel "$VMLINUZ" -initrd "$d/initramfs.cpio.gz" \
	-append "console=ttyS0 quiet panic=-1 vtism.bench=$mb,$rounds,$secs,$reps vtism.parts=$parts vtism.ab=$ab_pairs,$ab_secs" \
	-object "memory-backend-file,id=hmem,share=on,mem-path=$chan,size=16M" \
	-device ivshmem-plain,memdev=hmem &
qpid=$!
limit=$((600 + 12 * secs * reps + 3 * ab_secs * (2 * ab_pairs + 1)))
while kill -0 "$qpid" 2>/dev/null; do
	sleep 2
	if [ $(($(date +%s) - t0)) -gt $limit ]; then
		echo "bench: timeout after $limit s" >&2
		kill "$qpid"
		break
	fi
done
wait "$qpid" || true
qpid=
echo "bench: guest ran $(($(date +%s) - t0)) s; host load average at start/end: $load0 / $(cut -d' ' -f1-3 /proc/loadavg)"
grep -q '^VTB done' "$d/serial.log" || { echo "bench: guest did not finish" >&2; exit 1; }
tr -d '\r' <"$d/serial.log" | python3 "$tests/bench_report.py" | tee "$d/report.md"
