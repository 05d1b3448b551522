#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# /init of the DAMON-agent e2e guest (run-damon-e2e.sh): the same protocol lines as
# guest-init.sh (VTPHASE, VTGT, VTSTAT, VTRESULT, VTDONE), with `vtism guest` as the tracker.

export PATH=/bin:/sbin
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mkdir -p /mnt/ramfs /tmp
mount -t ramfs ramfs /mnt/ramfs
mount -t tmpfs tmp /tmp
echo 1 >/proc/sys/kernel/printk
echo 0 >/proc/sys/vm/compaction_proactiveness 2>/dev/null
echo 0 >/proc/sys/vm/compact_unevictable_allowed

D=/sys/kernel/mm/damon/admin/kdamonds
ARGS=$(sed -n 's/.*vtism.agent=\([^ ]*\).*/\1/p' /proc/cmdline | tr , ' ')
RF=/tmp/rounds

say() { echo "$*"; }
result() { say "VTRESULT $1 $2 $3"; }
rounds() { cat $RF 2>/dev/null || echo 0; }
phase() { say "VTPHASE $1 round=$(rounds)"; }
wait_rounds() {
	target=$(($(rounds) + $1)); t=0
	while [ "$(rounds)" -lt $target ]; do
		sleep 0.2; t=$((t + 1))
		[ $t -lt $((${2:-60} * 5)) ] || { say "VTLOG wait_rounds $1 timed out"; return 1; }
	done
}
# the agent's options as the checker's "parameters": --interval-k 1 -> param_interval_k 1
params() {
	set -- $ARGS
	while [ $# -ge 2 ]; do
		n=${1#--}; say "VTSTAT steady $(echo "param_$n" | tr - _) $2"; shift 2
	done
}
finish() {
	bad=$(dmesg | grep -E -c 'BUG:|WARNING:|Oops|general protection|Call Trace|Bad page|list_del corruption|soft lockup|hung_task|RCU stall')
	dmesg | grep -E 'damon|BUG:|WARNING:|Oops|Call Trace|RIP:|Bad page|corruption|lockup|stall' | tail -n 40 | sed 's/^/VTDMESG /'
	[ "$bad" -eq 0 ] && result dmesg-clean ok "" || result dmesg-clean fail "$bad suspicious kernel log lines"
	say VTDONE
	sync
	poweroff -f
}

say "VTBOOT $(uname -r) agent=$ARGS"
grep 'System RAM' /proc/iomem | sed 's/^ */VTRAM /'
[ -d $D ] || { result damon fail "no DAMON sysfs"; finish; }

# ---- a kdamond that is not ours: the agent must refuse and leave it untouched ----
echo 1 >$D/nr_kdamonds
echo 1 >$D/0/contexts/nr_contexts
echo vaddr >$D/0/contexts/0/operations
if /bin/vtism guest $ARGS --rounds 1 >/tmp/refuse.log 2>&1; then
	result refuses-foreign fail "the agent ran beside a foreign kdamond"
elif [ "$(cat $D/nr_kdamonds)" = 1 ] && [ "$(cat $D/0/contexts/nr_contexts)" = 1 ] &&
	[ "$(cat $D/0/contexts/0/operations)" = vaddr ] && [ "$(cat $D/0/state)" = off ]; then
	result refuses-foreign ok "$(tail -n 1 /tmp/refuse.log)"
else
	result refuses-foreign fail "the foreign kdamond's configuration changed"
fi
echo 0 >$D/nr_kdamonds

# ---- start the agent ----
/bin/vtism guest $ARGS --status-file $RF --stats-file /tmp/stats >/tmp/agent.log 2>&1 &
AG=$!
if wait_rounds 1 60; then
	result start ok "kdamond pid $(cat $D/0/pid), ops $(cat $D/0/contexts/0/operations), state $(cat $D/0/state)"
else
	cat /tmp/agent.log
	result start fail "no first round"
	finish
fi

/bin/vtism-workload run --hot-anon 1024 --hot-anon-ro 256 --hot-file 256 --hot-shmem 256 --thp 2 \
	--cold-anon 4096 --cold-period 5 --rounds-file $RF >/tmp/wl.log 2>&1 &
WL=$!
t=0
until grep -q '^VTGT ready' /tmp/wl.log; do
	sleep 0.2; t=$((t + 1))
	if [ $t -gt 300 ] || ! kill -0 $WL 2>/dev/null; then break; fi
done
cat /tmp/wl.log
grep -q '^VTGT ready' /tmp/wl.log && result workload ok "pid $WL" || result workload fail "no ground truth"

# DAMON's regions adapt to the access pattern over tens of aggregations: let them settle
wait_rounds 20 120
phase steady
params
wait_rounds 6
phase steady-end

# ---- host feedback ----
phase feedback-request
wait_rounds 2 60
phase feedback
wait_rounds 4 60
phase feedback-end
wait_rounds 5 60
phase fast

sed 's/^/VTAGENTSTAT /' /tmp/stats
kill $WL
wait $WL
tail -n 1 /tmp/wl.log

# ---- SIGTERM: the agent turns its kdamond off and removes it ----
kill -TERM $AG
wait $AG
rc=$?
cat /tmp/agent.log | tail -n 5 | sed 's/^/VTLOG agent: /'
if [ $rc -eq 0 ] && [ "$(cat $D/nr_kdamonds)" = 0 ]; then
	result agent-exit ok "exit 0, nr_kdamonds 0"
else
	result agent-exit fail "exit $rc, nr_kdamonds $(cat $D/nr_kdamonds)"
fi
phase exit
finish
