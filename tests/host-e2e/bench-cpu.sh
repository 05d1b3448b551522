#!/usr/bin/env bash
# Daemon CPU per round per GiB managed, natively on this machine: one QEMU (no OS, RAM
# preallocated) of SIZE MiB, a harness guest publishing HOT frames every 200 ms, vtismd with a
# 200 ms round. Measures the main loop's CPU (CLOCK_THREAD_CPUTIME_ID summed over rounds) and the
# whole process's CPU over SECONDS of steady state. Nothing is moved on a one-node machine, so this
# is the cost of reading, validating, reconciling, planning and publishing.
#   bench-cpu.sh [SIZE_MIB=1024] [HOT_FRAMES=16384] [SECONDS=20]
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
size=${1:-1024}
hot=${2:-16384}
secs=${3:-20}
V=$repo/target/release/vtism
H=$repo/target/release/examples/e2e-harness
[ -x "$V" ] && [ -x "$H" ] || {
	nice -n 10 cargo build --release -q -p vtism
	nice -n 10 cargo build --release -q -p vtism-host --example e2e-harness
}
w=$(mktemp -d /tmp/vtism-bench-cpu.XXXXXX)
chan=/dev/shm/vtism-bench-$$.chan
cleanup() {
	for p in "$w"/*.pid; do [ -f "$p" ] && kill "$(cat "$p")" 2>/dev/null || true; done
	rm -rf "$w" "$chan" "$chan.spec"
}
trap cleanup EXIT
mkdir -p "$w/qmp"
truncate -s 1M "$chan"
nice -n 10 qemu-system-x86_64 -accel tcg,tb-size=8 -machine q35 -m ${size}M -display none -S -nodefaults \
	-name bench -object memory-backend-ram,id=ram0,size=${size}M,prealloc=on -numa node,nodeid=0,memdev=ram0 \
	-object memory-backend-file,id=vtism-chan,mem-path=$chan,size=1M,share=on \
	-device ivshmem-plain,memdev=vtism-chan,id=vtism0 \
	-qmp unix:$w/qmp/bench.qmp,server=on,wait=off -daemonize -pidfile "$w/qemu.pid"
cat >"$w/cfg.toml" <<CFG
[daemon]
interval_ms = 200
control_socket = "$w/ctl.sock"
metrics_listen = ""
[discovery]
scan_dirs = ["$w/qmp"]
scan_interval_ms = 500
[channel]
entry_budget = 0
[defaults]
# All RAM fits the quota: on a one-node machine there is nowhere to demote to, and an over-quota
# VM would measure the engine's search for demotion victims instead of the steady state.
fast_quota_percent = ${VTISM_BENCH_QUOTA_PERCENT:-100}
CFG
"$H" publish "$chan" "0x100+$hot" 200 >/dev/null 2>&1 &
echo $! >"$w/pub.pid"
"$V" host -c "$w/cfg.toml" >"$w/d.log" 2>&1 &
echo $! >"$w/d.pid"
snap() { "$V" ctl --socket "$w/ctl.sock" status --json | python3 -c "import json,sys; d=json.load(sys.stdin)['daemon']; print(d['round_cpu_seconds'], d['rounds'], d['cpu_seconds'], d['managed_gib'])"; }
for _ in $(seq 50); do snap >/dev/null 2>&1 && break; sleep 0.2; done
sleep 5 # first sweep and warm-up
a=$(snap)
sleep "$secs"
b=$(snap)
python3 - "$a" "$b" "$hot" <<'PY'
import sys
a = [float(x) for x in sys.argv[1].split()]; b = [float(x) for x in sys.argv[2].split()]
r = b[1] - a[1]; gib = b[3]
print(f"{gib:.2f} GiB managed, {int(sys.argv[3])} hints/round, {r:.0f} rounds: main loop "
      f"{1e3*(b[0]-a[0])/r:.2f} ms/round = {1e3*(b[0]-a[0])/r/gib:.2f} ms/round/GiB; "
      f"whole process {1e3*(b[2]-a[2])/r:.2f} ms/round = {1e3*(b[2]-a[2])/r/gib:.2f} ms/round/GiB")
PY
