#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
#
# End-to-end test of the DAMON agent (`vtism guest`) in a TCG guest running Debian's 6.12 kernel
# (DAMON with paddr operations, the sysfs interface and DAMON_RECLAIM). The release `vtism`
# binary and the libraries it links go into a busybox initramfs with the static warm workload
# (warm_workload.c); damon-init.sh runs the scenario (coexistence with a sysfs kdamond and with
# DAMON_RECLAIM, then the warm workload under the host's quota) and damonmon.py reads the channel
# file and plays the host. Prints PASS/FAIL per check and "N passed, M failed"; exits non-zero
# if anything failed.
#
# usage: guest/tests/run-damon-e2e.sh
# env:   VTISM_E2E_OUT (default <repo>/build/e2e), VTISM_E2E_TIMEOUT (default 1500 s: the scenario takes 13-15 min, most of it the intervals loop settling twice),
#        VTISM_DAMON_AGENT (the agent's options, comma-separated),
#        VTISM_DAMON_WORKLOAD (the workload's options, comma-separated)
set -uo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
tests=$repo/guest/tests
. "$tests/boot-retry.sh"
out=${VTISM_E2E_OUT:-$repo/build/e2e}
timeout=${VTISM_E2E_TIMEOUT:-1500}
s=6.12
d=$out/damon-$s
# the agent's options: the CPU budget is 20% of a vCPU because TCG runs guest code about 20 times
# slower than the hardware does (docs/guest.md, "End-to-end test of the agent"), so this is the
# default 1% on hardware
budget_bp=2000
agent=${VTISM_DAMON_AGENT:---cpu-budget-bp,$budget_bp}
budget_bp=$(echo "$agent" | sed -n 's/.*--cpu-budget-bp,\([0-9]*\).*/\1/p')
budget_bp=${budget_bp:-100}
# hot: 1024 anon + 256 file + 256 shmem + 2 THPs touched every 20 ms; 4096 warm pages updated
# about every 2 s each by uniform updates over the anon region; 2048 idle pages
workload=${VTISM_DAMON_WORKLOAD:---hot-anon,1024,--hot-file,256,--hot-shmem,256,--thp,2,--warm,4096,--warm-period-ms,2000,--idle,2048}
passed=0
failed=0
summary() { echo "$passed passed, $failed failed"; }
setup_fail() {
	echo "FAIL damon-$s/$1: $2"
	failed=$((failed + 1))
	summary
	exit 1
}

mkdir -p "$d"
t0=$(date +%s)
"$repo"/scripts/guest-kernels.sh $s >"$d/kernels.env" || setup_fail setup "scripts/guest-kernels.sh failed"
# shellcheck disable=SC1091
. "$repo/build/guest-kernels/$s/env"
gcc -static -O2 -Wall -Wextra -Werror -o "$d/vtism-workload" "$tests/warm_workload.c" ||
	setup_fail setup "workload does not build"
(cd "$repo" && nice -n 10 cargo build --release -q -p vtism) || setup_fail setup "vtism does not build"
bin=$repo/target/release/vtism
adds=(--add "$bin=/bin/vtism")
for lib in $(ldd "$bin" | grep -o '/[^ ]*'); do
	adds+=(--add "$lib=$lib")
done
python3 "$tests/mkinitramfs.py" --init "$tests/damon-init.sh" --workload "$d/vtism-workload" \
	"${adds[@]}" -o "$d/initramfs.cpio.gz" || setup_fail initramfs "mkinitramfs.py failed"

chan=/dev/shm/vtism-e2e-damon-$$.chan
rm -f "$chan"
truncate -s 16M "$chan"
echo "e2e: booting $KVER (TCG) with the DAMON agent, serial log $d/serial.log"
ts=$(date +%s)
# Not niced, as the module's e2e guest (run-e2e.sh): no steal time under TCG.
# A guest that hangs in early boot under TCG is booted again, once (boot-retry.sh).
boot_retrying "damon-$s" "$d" "$chan" -- \
	python3 "$tests/damonmon.py" --channel "$chan" --serial "$d/serial.log" \
	--label "damon-$s" --timeout "$timeout" --budget-bp "$budget_bp" -- \
	qemu-system-x86_64 -accel tcg -cpu max -smp 2 -m 1G \
	-display none -monitor none -no-reboot -serial "file:$d/serial.log" \
	-kernel "$VMLINUZ" -initrd "$d/initramfs.cpio.gz" \
	-append "console=ttyS0 quiet panic=-1 vtism.agent=$agent vtism.workload=$workload" \
	-object "memory-backend-file,id=hmem,share=on,mem-path=$chan,size=16M" \
	-device ivshmem-plain,memdev=hmem
rm -f "$chan"
grep -m1 '^VTBOOT' "$d/serial.log" | sed 's/^/e2e: /'
# the agent's statistics at the end of the steady window (--stats-file), on one line
echo "e2e: agent stats: $(sed -n 's/^VTSTAT steady //p' "$d/serial.log" | tr '\n' ' ')"
cat "$d/checks.txt"
p=$(grep -c '^PASS ' "$d/checks.txt")
f=$(grep -c '^FAIL ' "$d/checks.txt")
passed=$((passed + p))
failed=$((failed + f))
if [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then
	cat "$d/monitor.err"
	echo "FAIL damon-$s/monitor: damonmon.py exited $rc"
	failed=$((failed + 1))
fi
echo "e2e: damon-$s took $(($(date +%s) - ts)) s, total $(($(date +%s) - t0)) s"
summary
[ $failed -eq 0 ] && [ $passed -gt 0 ]
