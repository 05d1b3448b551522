#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# /init of the vtism_guest e2e test guest (busybox initramfs built by mkinitramfs.py).
#
# Drives the scenario and prints machine-readable lines on the serial console, which the host
# side (chanmon.py) follows while it reads the channel file:
#   VTPHASE <name> round=<r>    a phase boundary; r = rounds the module has published
#   VTGT ...                    the workload's ground truth (see workload.c)
#   VTSTAT <phase> <name> <v>   the module's sysfs statistics
#   VTRESULT <name> ok|fail <detail>   a check done inside the guest
#   VTDMESG <line>              kernel log lines of interest
#   VTDONE                      end of scenario (the guest powers off next)
# The host (modmon.py) answers through the channel's feedback block on the phase markers
# (quota-hot, quota-wide: fast_quota_bytes; feedback-request/-end: entry_budget and
# min_interval_ms); the guest sees its effect in sysfs.

export PATH=/bin:/sbin
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mkdir -p /mnt/ramfs /tmp
mount -t ramfs ramfs /mnt/ramfs
mount -t tmpfs tmp /tmp
mount -t debugfs debugfs /sys/kernel/debug
# Kernel messages go to dmesg, not into our protocol lines.
echo 1 >/proc/sys/kernel/printk
# Frames of the ground truth must not move: no compaction of mlocked pages.
echo 0 >/proc/sys/vm/compaction_proactiveness 2>/dev/null
echo 0 >/proc/sys/vm/compact_unevictable_allowed

S=/sys/kernel/vtism_guest
P=/sys/module/vtism_guest/parameters
MODPARAMS=$(sed -n 's/.*vtism.params=\([^ ]*\).*/\1/p' /proc/cmdline | tr , ' ')

say() { echo "$*"; }
result() { say "VTRESULT $1 $2 $3"; }
rounds() { cat $S/rounds 2>/dev/null || echo 0; }
phase() { say "VTPHASE $1 round=$(rounds)"; }
# stats NAME [SNAPSHOT]: one consistent snapshot of all counters (debugfs, read now unless
# given), and the parameters
stats() {
	printf '%s\n' "${2:-$(cat /sys/kernel/debug/vtism_guest/stats)}" | sed "s/^/VTSTAT $1 /"
	for f in $P/*; do say "VTSTAT $1 param_${f##*/} $(cat "$f")"; done
}
# stats_repaid NAME: a snapshot at a round where the tracker owed no CPU (debt_us 0), taken
# within 40 rounds. A step is paid before its cost is known (under TCG a host preemption inside
# one is charged to it), and the debt is repaid by sleeping: cpu-budget compares a phase's CPU
# with its budget once the budget has settled.
stats_repaid() {
	n=0
	while snap=$(cat /sys/kernel/debug/vtism_guest/stats); \
		! printf '%s\n' "$snap" | grep -qx 'debt_us 0' && [ $n -lt 40 ]; do
		wait_rounds 1 60 || break
		n=$((n + 1))
	done
	[ $n = 0 ] || say "VTLOG $1: $n rounds until the tracker's CPU debt was repaid"
	stats "$1" "$snap"
}
# wait_rounds N [timeout_s]: until the module has published N more rounds
wait_rounds() {
	target=$(($(rounds) + $1)); t=0
	while [ "$(rounds)" -lt $target ]; do
		sleep 0.2; t=$((t + 1))
		[ $t -lt $((${2:-60} * 5)) ] || { say "VTLOG wait_rounds $1 timed out"; return 1; }
	done
}
# wait_stat NAME VALUE [timeout_s]
wait_stat() {
	t=0
	while [ "$(cat $S/$1 2>/dev/null)" != "$2" ]; do
		sleep 0.2; t=$((t + 1))
		[ $t -lt $((${3:-60} * 5)) ] || return 1
	done
}
# wait_stat_nonzero NAME [timeout_s], wait_stat_changes NAME OLD [timeout_s]
wait_stat_nonzero() {
	t=0
	while [ "$(cat $S/$1 2>/dev/null || echo 0)" = 0 ]; do
		sleep 0.2; t=$((t + 1))
		[ $t -lt $((${2:-60} * 5)) ] || return 1
	done
}
wait_stat_changes() {
	t=0
	while [ "$(cat $S/$1 2>/dev/null)" = "$2" ]; do
		sleep 0.2; t=$((t + 1))
		[ $t -lt $((${3:-60} * 5)) ] || return 1
	done
}
# wait_snap NAME VALUE [timeout_s]: until one consistent snapshot of the counters (debugfs) has
# NAME = VALUE, so that a round counted after it came later. Each sysfs file is read on its own:
# NAME there can be seen new while rounds, written after it in the same round, is still old.
wait_snap() {
	t=0
	until [ "$(sed -n "s/^$1 //p" /sys/kernel/debug/vtism_guest/stats 2>/dev/null)" = "$2" ]; do
		sleep 0.2; t=$((t + 1))
		[ $t -lt $((${3:-60} * 5)) ] || return 1
	done
}
# tracker_cpus MASK: the CPUs the tracker thread may run on (hex, as taskset takes them)
tracker_cpus() {
	for c in /proc/[0-9]*/comm; do
		[ "$(cat "$c" 2>/dev/null)" = vtism_scan ] || continue
		c=${c#/proc/}
		taskset -p "$1" "${c%/comm}" >/dev/null && say "VTLOG tracker thread ${c%/comm} on CPUs $1" ||
			say "VTLOG taskset $1 of the tracker thread failed"
	done
}
rand_ms() { echo $(($(od -An -N2 -tu2 /dev/urandom) % $1)); }
msleep() { usleep $(($1 * 1000)); }

# Busy tracking for the lifetime tests: the whole vCPU as budget, sweeps back to back, short
# windows and periods: the thread is (almost) always inside a pass or a window.
FAST="cpu_budget_bp=10000 interval_k=0 interval_kb=0 interval_base_ms=0 coarse_period_ms=1 coarse_window_max_us=200 fine_window_max_us=2000 round_ms=200"
fast() { for kv in $FAST; do echo "${kv#*=}" >"$P/${kv%%=*}"; done; }

flag() { grep -m1 '^flags' /proc/cpuinfo | grep -q -w "$1" && echo 1 || echo 0; }
say "VTBOOT $(uname -r) params=$MODPARAMS la57=$(flag la57) pti=$(flag pti) $(grep -m1 vendor_id /proc/cpuinfo | tr -d '\t ')"
grep 'System RAM' /proc/iomem | sed 's/^ */VTRAM /'

# ---- load ----
if insmod /vtism_guest.ko $MODPARAMS && wait_rounds 1 30; then
	result load ok "$(ls /sys/bus/pci/drivers/vtism_guest | grep :)"
else
	result load fail "insmod or first round failed"
	dmesg | sed 's/^/VTDMESG /'
	say VTDONE
	poweroff -f
fi

# ---- workload: a hot set, a warm background (its cold set touched every 2 s), idle frames ----
/bin/vtism-workload run --hot-anon 1024 --hot-anon-ro 256 --hot-file 256 --hot-shmem 256 --thp 2 \
	--cold-anon 4096 --cold-every-ms 2000 >/tmp/wl.log 2>&1 &
WL=$!
t=0
until grep -q '^VTGT ready' /tmp/wl.log; do
	sleep 0.2; t=$((t + 1))
	if [ $t -gt 300 ] || ! kill -0 $WL 2>/dev/null; then break; fi
done
cat /tmp/wl.log
grep -q '^VTGT ready' /tmp/wl.log && result workload ok "pid $WL" || result workload fail "no ground truth"

# The host gives the guest a fast-memory quota of the hot set's size; the window loops aim at it.
phase quota-hot
wait_stat_nonzero feedback_fast_quota_bytes 60 || say "VTLOG no quota from the host"
# Warm-up: the coarse rates build up over ~24 windows, the fine sweeps need a few passes over
# every region before the frames' rates settle.
wait_rounds 24 120
phase steady
stats steady-start
wait_rounds 8 60
phase steady-end
stats_repaid steady

# ---- the windows follow the host's quota: 8 times the hot set ----
q0=$(cat $S/feedback_fast_quota_bytes)
phase quota-wide
wait_stat_changes feedback_fast_quota_bytes "$q0" 60 || say "VTLOG no new quota from the host"
stats quota-wide-start
wait_rounds 16 90
stats_repaid quota-wide
q0=$(cat $S/feedback_fast_quota_bytes)
phase quota-hot
wait_stat_changes feedback_fast_quota_bytes "$q0" 60 || say "VTLOG no new quota from the host"
wait_rounds 12 90

# ---- the same with every PTE table read: pruning must not lose hot frames ----
echo 0 >$P/prune
wait_rounds 3 60
phase noprune
stats noprune-start
wait_rounds 6 60
phase noprune-end
stats_repaid noprune
echo 1 >$P/prune

# ---- the bias of clearing Accessed bits without a TLB flush (measured, the default flushes) ----
echo 0 >$P/tlb_flush
wait_rounds 6 60
phase notlb
stats notlb-start
wait_rounds 6 60
phase notlb-end
stats notlb
echo 1 >$P/tlb_flush
wait_rounds 8 60

# ---- the default budget (1% of a vCPU), which binds under TCG: the tracker must stay in it ----
# The tracker on vCPU 0, which the host gives a CPU of its own on this marker (corepin.py): with
# no steal time here, a host preemption mid-step would be charged to the tracker as CPU.
tracker_cpus 1
phase budget1
b0=$(cat $P/cpu_budget_bp)
echo 100 >$P/cpu_budget_bp
wait_rounds 3 60
stats budget1-start
wait_rounds 10 60
stats_repaid budget1
phase budget1-end
tracker_cpus $(printf %x $(((1 << $(grep -c ^processor /proc/cpuinfo)) - 1)))
echo "$b0" >$P/cpu_budget_bp
wait_rounds 3 60

# ---- a bank (credit_bank_ms of budget) smaller than one region's burst, as a slow or contended
# vCPU makes any bank: fine bursts must go on, their passes paid as credit comes ----
echo 1 >$P/credit_bank_ms
wait_rounds 1 60
stats bank-tiny-start
sleep 15
wait_rounds 1 60
stats bank-tiny
echo 1000 >$P/credit_bank_ms
wait_rounds 2 60

# ---- host feedback: the host sets entry_budget and min_interval_ms on this marker ----
# (the module reads them at the start of a round and reports them with that round's count, so
# every round after the snapshot that shows them publishes with them)
phase feedback-request
if wait_snap feedback_entry_budget 64 60; then
	phase feedback
	wait_rounds 4 60
	phase feedback-end
	wait_stat feedback_entry_budget 0 60 && result feedback-seen ok "budget 64 then 0" ||
		result feedback-seen fail "host did not clear its feedback"
else
	result feedback-seen fail "no entry_budget from the host"
fi
wait_rounds 3
stats feedback

# ---- processes exiting while being scanned ----
# busy from here: the tracker is nearly always inside some address space
phase fast
fast
/bin/vtism-workload churn --size 256 --max-ms 500 --procs 3 >/tmp/churn.log 2>&1 &
CH=$!
phase churn
before=$(cat $S/mm_released)
r0=$(rounds)
t0=$(date +%s)
n=0
# until at least one process died while scanned (5 s minimum, 60 s at most)
while [ $n -lt 300 ]; do
	sleep 0.2
	n=$((n + 1))
	[ "$(cat $S/mm_released)" -gt "$before" ] && [ $n -ge 25 ] && break
done
phase churn-end
after=$(cat $S/mm_released)
stats churn
if [ "$after" -gt "$before" ]; then
	result exit-mid-scan ok "$((after - before)) address spaces released by the scanner in $(($(date +%s) - t0)) s, $(($(rounds) - r0)) rounds"
else
	result exit-mid-scan fail "no process exited while scanned in $(($(date +%s) - t0)) s, $(($(rounds) - r0)) rounds"
fi

# ---- unload and reload at random moments (churn still running) ----
fails=0; i=0; mid=0
while [ $i -lt 40 ]; do
	i=$((i + 1))
	msleep $(rand_ms 1200)
	rmmod vtism_guest || fails=$((fails + 1))
	insmod /vtism_guest.ko $MODPARAMS $FAST || fails=$((fails + 1))
	mid=$(dmesg | grep -c 'stopped in the middle of a')
	[ $i -ge 20 ] && [ "$mid" -ge 3 ] && break
done
msleep $(rand_ms 300)
if [ $fails -eq 0 ] && [ "$mid" -ge 1 ]; then
	result unload ok "$i reloads, $mid stopped mid-scan"
else
	result unload fail "$i reloads, $fails rmmod/insmod failures, $mid stopped mid-scan"
fi
kill $CH
wait $CH
cat /tmp/churn.log
wait_rounds 3 60 && result reload ok "publishing after reload" || result reload fail "no rounds after reload"
phase reload

# ---- the workload's frames must not have moved; then SIGKILL big processes mid-scan ----
kill $WL
wait $WL
tail -n 1 /tmp/wl.log
i=0; hit=0; ok=1
while [ $i -lt 5 ]; do
	i=$((i + 1))
	/bin/vtism-workload run --hot-anon 8192 --cold-anon 8192 --thp 2 >/dev/null 2>&1 &
	KP=$!
	wait_rounds 2
	before=$(cat $S/mm_released)
	msleep $(rand_ms 300)
	kill -9 $KP
	wait $KP 2>/dev/null
	wait_rounds 2 60 || { ok=0; break; }
	[ "$(cat $S/mm_released)" -gt "$before" ] && hit=$((hit + 1))
done
# mm_released counts any process (busybox helpers too) that died while scanned: a hint only.
if [ $ok = 1 ]; then
	result kill-mid-scan ok "$i SIGKILLs, rounds go on; $hit with an mm released by the scanner"
else
	result kill-mid-scan fail "no rounds after SIGKILL $i"
fi
phase exit
stats final

# ---- unload, kernel log ----
rmmod vtism_guest && result final-unload ok "" || result final-unload fail "rmmod failed"
bad=$(dmesg | grep -E -c 'BUG:|WARNING:|Oops|general protection|Call Trace|bad p[mu4g]d|Bad page|list_del corruption|soft lockup|hung_task|RCU stall|rcu_sched self-detected')
dmesg | grep -E 'vtism|BUG:|WARNING:|Oops|general protection|Call Trace|RIP:|bad p[mu4g]d|Bad page|corruption|lockup|stall' |
	grep -v -e 'stopped in the middle' -e 'channel of' | tail -n 60 | sed 's/^/VTDMESG /'
[ "$bad" -eq 0 ] && result dmesg-clean ok "" || result dmesg-clean fail "$bad suspicious kernel log lines"
say VTDONE
sync
poweroff -f
