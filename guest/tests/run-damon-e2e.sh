#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
#
# End-to-end test of the DAMON agent (`vtism guest`) in a TCG guest running Debian's 6.12 kernel
# (DAMON with paddr operations and the sysfs interface). The release `vtism` binary and the
# libraries it links go into a busybox initramfs with the static workload; damon-init.sh runs the
# scenario and chanmon.py --tracker damon reads the channel file from the host side.
# Prints PASS/FAIL per check and "N passed, M failed"; exits non-zero if anything failed.
#
# usage: guest/tests/run-damon-e2e.sh
# env:   VTISM_E2E_OUT (default <repo>/build/e2e), VTISM_E2E_TIMEOUT (default 600 s)
set -uo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
tests=$repo/guest/tests
out=${VTISM_E2E_OUT:-$repo/build/e2e}
timeout=${VTISM_E2E_TIMEOUT:-600}
s=6.12
d=$out/damon-$s
# the agent's options in the scenario: a short Tbase and a cap, as for the module; 6 of 8
# rounds (the agent's default) keeps precision >= 0.9 despite DAMON's coarse region boundaries
agent=${VTISM_DAMON_AGENT:---interval-k,1,--interval-kb,10,--interval-base-ms,400,--interval-max-ms,3000,--history-rounds,8,--hot-threshold,6}

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
gcc -static -O2 -Wall -Wextra -Werror -o "$d/vtism-workload" "$tests/workload.c" ||
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
python3 "$tests/chanmon.py" --tracker damon --channel "$chan" --serial "$d/serial.log" \
	--label "damon-$s" --timeout "$timeout" -- \
	nice -n 5 qemu-system-x86_64 -accel tcg -cpu max -smp 2 -m 1G \
	-display none -monitor none -no-reboot -serial "file:$d/serial.log" \
	-kernel "$VMLINUZ" -initrd "$d/initramfs.cpio.gz" \
	-append "console=ttyS0 quiet panic=-1 vtism.agent=$agent" \
	-object "memory-backend-file,id=hmem,share=on,mem-path=$chan,size=16M" \
	-device ivshmem-plain,memdev=hmem >"$d/checks.txt" 2>"$d/chanmon.err"
rc=$?
rm -f "$chan"
grep -m1 '^VTBOOT' "$d/serial.log" | sed 's/^/e2e: /'
# the agent's statistics at the end of the scenario (--stats-file), on one line
echo "e2e: agent stats: $(sed -n 's/^VTAGENTSTAT //p' "$d/serial.log" | tr '\n' ' ')"
cat "$d/checks.txt"
p=$(grep -c '^PASS ' "$d/checks.txt")
f=$(grep -c '^FAIL ' "$d/checks.txt")
passed=$((passed + p))
failed=$((failed + f))
if [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then
	cat "$d/chanmon.err"
	echo "FAIL damon-$s/monitor: chanmon.py exited $rc"
	failed=$((failed + 1))
fi
echo "e2e: damon-$s took $(($(date +%s) - ts)) s, total $(($(date +%s) - t0)) s"
summary
[ $failed -eq 0 ] && [ $passed -gt 0 ]
