#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
#
# End-to-end test of vtism_guest.ko in TCG guests running Debian's 6.1 and 6.12 kernels.
#
# For each kernel: build the module against its headers, build an initramfs (busybox, the
# module, a static workload with a known hot set, warm background and idle frames), boot it
# under QEMU with an ivshmem-plain device backed by a file in /dev/shm, and let modmon.py (with
# chanmon.py's reader) read that file as the host would while the guest runs its scenario
# (guest-init.sh). Prints INFO lines (measurements), PASS/FAIL per check and
# "N passed, M failed"; exits non-zero if anything failed.
#
# usage: guest/tests/run-e2e.sh [6.1] [6.12]     (default: both)
# env:   VTISM_E2E_OUT   work dir (default <repo>/build/e2e)
#        VTISM_E2E_TIMEOUT  per-guest timeout in seconds (default 600)
#        VTISM_E2E_DAMON=0  skip the DAMON agent scenario (run with 6.12; run-damon-e2e.sh)
#        VTISM_E2E_BESIDE   session ids of suites run beside it (corepin.py moves them)
set -uo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
tests=$repo/guest/tests
. "$tests/boot-retry.sh"
out=${VTISM_E2E_OUT:-$repo/build/e2e}
timeout=${VTISM_E2E_TIMEOUT:-600}
series=("$@")
[ ${#series[@]} -gt 0 ] || series=(6.1 6.12)
# Guest CPUs: together the two runs cover 4- and 5-level paging, with and without PTI (with
# PTI user space runs on a copy of the PGD page, see docs/guest.md).
cpu_6_1=${VTISM_E2E_CPU_6_1:-max,vendor=GenuineIntel,la57=off}
cpu_6_12=${VTISM_E2E_CPU_6_12:-max}
# Module parameters of the scenario (VTISM_E2E_PARAMS overrides). Under TCG every page-table
# access is emulated: a pass costs some 20-50 times what it does on hardware (docs/guest.md,
# "End-to-end test"), so the CPU budget is 20% of a vCPU instead of the default 1%, and the
# seed's sweep interval gets a smaller K and Kb, whose quadratic term would otherwise turn one
# slow TCG sweep into minutes of waiting (the cap bounds it at 3 s).
params=${VTISM_E2E_PARAMS:-cpu_budget_bp=2000,interval_k=1,interval_kb=10,interval_base_ms=1000,interval_max_ms=3000}

passed=0
failed=0
summary() {
	echo "$passed passed, $failed failed"
}
setup_fail() {
	echo "FAIL $1: $2"
	failed=$((failed + 1))
}

need=()
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
[ -x /bin/busybox ] && ! file -L /bin/busybox 2>/dev/null | grep -q dynamic || need+=(busybox-static)
command -v gcc >/dev/null || need+=(gcc libc6-dev)
[ -f /usr/lib/x86_64-linux-gnu/libc.a ] || need+=(libc6-dev)
command -v file >/dev/null || need+=(file)
if [ ${#need[@]} -gt 0 ]; then
	echo "e2e: installing ${need[*]}"
	if ! { apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null 2>&1 ||
		{ apt-get update -qq && apt-get install -y -qq --no-install-recommends "${need[@]}"; }; }; then
		setup_fail setup "cannot install ${need[*]}"
		summary
		exit 1
	fi
fi

mkdir -p "$out"
t0=$(date +%s)
if ! "$repo"/scripts/guest-kernels.sh "${series[@]}" >"$out/kernels.env"; then
	setup_fail setup "scripts/guest-kernels.sh failed"
	summary
	exit 1
fi
if ! gcc -static -O2 -Wall -Wextra -Werror -o "$out/vtism-workload" "$tests/workload.c"; then
	setup_fail setup "workload does not build"
	summary
	exit 1
fi

for s in "${series[@]}"; do
	d=$out/$s
	mkdir -p "$d"
	# shellcheck disable=SC1090
	. "$repo/build/guest-kernels/$s/env"
	if ! make -s -C "$repo/guest/module" all-kernels SERIES="$s" >"$d/build.log" 2>&1 ||
		grep -q 'warning:' "$d/build.log"; then
		cat "$d/build.log"
		setup_fail "$s/build" "module does not build cleanly against $KDIR"
		continue
	fi
	echo "PASS $s/build: vtism_guest.ko built warning-free (W=1) against $KVER"
	passed=$((passed + 1))
	if ! python3 "$tests/mkinitramfs.py" --init "$tests/guest-init.sh" \
		--module "$repo/build/module/$s/vtism_guest.ko" --workload "$out/vtism-workload" \
		-o "$d/initramfs.cpio.gz"; then
		setup_fail "$s/initramfs" "mkinitramfs.py failed"
		continue
	fi
	chan=/dev/shm/vtism-e2e-$s-$$.chan
	rm -f "$chan"
	truncate -s 16M "$chan"
	cpuvar=cpu_${s//./_}
	cpu=${!cpuvar}
	echo "e2e: booting $KVER (TCG, -cpu $cpu), serial log $d/serial.log"
	ts=$(date +%s)
	# Not niced: under TCG a guest has no steal time, so the time the host keeps a vCPU waiting
	# is charged to whatever the guest was running (the tracker's 1% budget), and a guest niced
	# below a load beside it waits three times as long (cpu-budget, budget-progress). Named
	# threads: for budget-progress, modmon gives "CPU 0/TCG" a host CPU of its own (corepin.py).
	# A guest that hangs in early boot under TCG is booted again, once (boot-retry.sh).
	boot_retrying "$s" "$d" "$chan" -- \
		python3 "$tests/modmon.py" --channel "$chan" --serial "$d/serial.log" --label "$s" \
		--timeout "$timeout" -- \
		qemu-system-x86_64 -accel tcg -cpu "$cpu" -smp 2 -m 1G -name "vtism-e2e-$s,debug-threads=on" \
		-display none -monitor none -no-reboot -serial "file:$d/serial.log" \
		-kernel "$VMLINUZ" -initrd "$d/initramfs.cpio.gz" \
		-append "console=ttyS0 quiet panic=-1 vtism.params=$params" \
		-object "memory-backend-file,id=hmem,share=on,mem-path=$chan,size=16M" \
		-device ivshmem-plain,memdev=hmem
	rm -f "$chan"
	grep -m1 '^VTBOOT' "$d/serial.log" | sed 's/^/e2e: /'
	cat "$d/checks.txt"
	grep '^VTSTAT steady ' "$d/serial.log" | tr -d '\r' >"$d/stats-steady.txt"
	p=$(grep -c '^PASS ' "$d/checks.txt")
	f=$(grep -c '^FAIL ' "$d/checks.txt")
	passed=$((passed + p))
	failed=$((failed + f))
	if [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then
		cat "$d/monitor.err"
		setup_fail "$s/monitor" "modmon.py exited $rc"
	fi
	echo "e2e: $s took $(($(date +%s) - ts)) s"
done

# The DAMON agent (`vtism guest`) on 6.12, the same channel checks with the kernel's DAMON as the
# tracker (guest/tests/run-damon-e2e.sh); VTISM_E2E_DAMON=0 skips it.
if [[ " ${series[*]} " == *" 6.12 "* ]] && [ "${VTISM_E2E_DAMON:-1}" != 0 ]; then
	"$tests/run-damon-e2e.sh" | tee "$out/damon.txt" | grep -v -e '^[0-9]* passed, [0-9]* failed$' -e '^VTGT '
	p=$(grep -c '^PASS ' "$out/damon.txt")
	f=$(grep -c '^FAIL ' "$out/damon.txt")
	passed=$((passed + p))
	failed=$((failed + f))
	grep -q '^[0-9]* passed, 0 failed$' "$out/damon.txt" || [ "$f" -gt 0 ] ||
		setup_fail damon "run-damon-e2e.sh did not finish"
fi

echo "e2e: total $(($(date +%s) - t0)) s"
summary
[ $failed -eq 0 ] && [ $passed -gt 0 ]
