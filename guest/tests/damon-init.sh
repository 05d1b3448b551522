#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# /init of the DAMON-agent e2e guest (run-damon-e2e.sh). Protocol lines for damonmon.py:
# VTPHASE <name> round=<n>, VTGT (the workload's ground truth), VTSTAT <phase> <name> <value>
# (the agent's --stats-file), VTRESULT <check> ok|fail <detail>, VTDONE.
#
# 1. Coexistence, before any workload: a sysfs kdamond of this script's (configured, then
#    running) and DAMON_RECLAIM; the agent must never touch them and wait while they hold DAMON.
# 2. The warm workload (warm_workload.c) under the host's quota: the agent's rates, its
#    intervals loop, the host's feedback, a second quota.
# 3. SIGTERM, and DAMON_RECLAIM after the agent, with its parameters as before.

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
R=/sys/module/damon_reclaim/parameters
ARGS=$(sed -n 's/.*vtism.agent=\([^ ]*\).*/\1/p' /proc/cmdline | tr , ' ')
WL_ARGS=$(sed -n 's/.*vtism.workload=\([^ ]*\).*/\1/p' /proc/cmdline | tr , ' ')
RF=/tmp/rounds
ST=/tmp/stats

say() { echo "$*"; }
result() { say "VTRESULT $1 $2 $3"; }
# The round from the stats file, which the agent replaces whole (a rename) after each round: the
# status file ($RF) is rewritten in place, and read at that moment it is empty, which the numeric
# tests below take for false (a wait that ends early, a phase line without its round).
rounds() { r=$(stat_of rounds); echo "${r:-0}"; }
phase() { say "VTPHASE $1 round=$(rounds)"; }
stats() { [ -f $ST ] && sed "s/^/VTSTAT $1 /" $ST; }
stat_of() { sed -n "s/^$1 //p" $ST 2>/dev/null; }
# stat_in SNAPSHOT NAME: a value of a stats file read once (cat $ST), so values taken together
# come from one round
stat_in() { echo "$1" | sed -n "s/^$2 //p"; }
# wait_rounds N [seconds]: N more rounds published
wait_rounds() {
	target=$(($(rounds) + $1)); t=0
	while [ "$(rounds)" -lt $target ]; do
		sleep 0.5; t=$((t + 1))
		[ $t -lt $((${2:-120} * 2)) ] || { say "VTLOG wait_rounds $1 timed out"; return 1; }
	done
}
# wait_settled N [seconds]: the intervals loop made no commit for N rounds in a row (the commit
# count and the round from one stats snapshot: read apart, a commit of the round that just
# ended could be missed and that round counted as settled)
wait_settled() {
	t=0; s=$(cat $ST 2>/dev/null); c=$(stat_in "$s" attr_commits); r=$(stat_in "$s" rounds)
	since=${r:-0}; r=$since
	while [ $((r - since)) -lt $1 ]; do
		sleep 0.5; t=$((t + 1))
		s=$(cat $ST 2>/dev/null); n=$(stat_in "$s" attr_commits); r=$(stat_in "$s" rounds); r=${r:-0}
		[ "$n" = "$c" ] || { c=$n; since=$r; }
		[ $t -lt $((${2:-300} * 2)) ] || { say "VTLOG wait_settled $1 timed out"; return 1; }
	done
}
# wait_stat_changes NAME OLD [seconds]: until the stats say NAME is no longer OLD (what the host
# wrote on a phase line reached the agent: its serial poll may see the line late)
wait_stat_changes() {
	t=0
	while [ "$(stat_of $1)" = "$2" ]; do
		sleep 0.5; t=$((t + 1))
		[ $t -lt $((${3:-120} * 2)) ] || { say "VTLOG wait_stat_changes $1 timed out"; return 1; }
	done
}
# wait_stat_is NAME VALUE [seconds]: until a stats snapshot has NAME = VALUE; SNAP_ROUND is that
# snapshot's round
wait_stat_is() {
	t=0
	while :; do
		s=$(cat $ST 2>/dev/null)
		if [ "$(stat_in "$s" $1)" = "$2" ]; then
			SNAP_ROUND=$(stat_in "$s" rounds)
			return 0
		fi
		sleep 0.5; t=$((t + 1))
		[ $t -lt $((${3:-120} * 2)) ] || { say "VTLOG wait_stat_is $1 $2 timed out"; return 1; }
	done
}
# wait_round N [seconds]: until round N is published
wait_round() {
	t=0
	while [ "$(rounds)" -lt "$1" ]; do
		sleep 0.5; t=$((t + 1))
		[ $t -lt $((${2:-120} * 2)) ] || { say "VTLOG wait_round $1 timed out"; return 1; }
	done
}
# a DAMON sysfs file; reads fail (EBUSY) while a command holds DAMON's sysfs lock, which the
# agent's update_schemes_tried_regions does for up to two aggregations: retry for up to 60 s
damon_cat() {
	n=0
	while [ $n -lt 300 ]; do
		cat "$1" 2>/dev/null && return 0
		sleep 0.2; n=$((n + 1))
	done
	echo "?"
}
# damon_echo VALUE FILE: DAMON's sysfs writes fail (EBUSY) while its lock is taken, which a
# running kdamond does every sampling interval: retry for up to 60 s
damon_echo() {
	n=0
	while [ $n -lt 300 ]; do
		echo "$1" 2>/dev/null >"$2" && return 0
		sleep 0.2; n=$((n + 1))
	done
	say "VTLOG writing $1 to $2 failed: $(echo "$1" 2>&1 >"$2")"
	return 1
}
# the test's own sysfs kdamond 0 as text: everything the agent must leave alone
kdamond0() {
	c=$D/0/contexts/0
	echo "nr=$(damon_cat $D/nr_kdamonds) state=$(damon_cat $D/0/state) pid=$(damon_cat $D/0/pid)" \
		"ops=$(damon_cat $c/operations) sample=$(damon_cat $c/monitoring_attrs/intervals/sample_us)" \
		"aggr=$(damon_cat $c/monitoring_attrs/intervals/aggr_us)" \
		"regions=$(damon_cat $c/monitoring_attrs/nr_regions/min)-$(damon_cat $c/monitoring_attrs/nr_regions/max)" \
		"targets=$(damon_cat $c/targets/nr_targets) target=$(damon_cat $c/targets/0/pid_target)" \
		"schemes=$(damon_cat $c/schemes/nr_schemes)"
}
# DAMON_RECLAIM's parameters but enabled and kdamond_pid
reclaim_params() {
	for f in $R/*; do
		case ${f##*/} in enabled | kdamond_pid) ;; *) printf '%s=%s ' "${f##*/}" "$(cat $f)" ;; esac
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

say "VTBOOT $(uname -r) agent=$ARGS workload=$WL_ARGS"
grep 'System RAM' /proc/iomem | sed 's/^ */VTRAM /'
[ -d $D ] && [ -d $R ] || { result damon fail "no DAMON sysfs or DAMON_RECLAIM"; finish; }

# ---- 1a. a configured sysfs kdamond that is not the agent's: --if-busy exit refuses ----
sleep 100000 &
TARGET=$!
damon_echo 1 $D/nr_kdamonds
damon_echo 1 $D/0/contexts/nr_contexts
c=$D/0/contexts/0
damon_echo vaddr $c/operations
damon_echo 1 $c/targets/nr_targets
damon_echo $TARGET $c/targets/0/pid_target
damon_echo 7000 $c/monitoring_attrs/intervals/sample_us
damon_echo 140000 $c/monitoring_attrs/intervals/aggr_us
before=$(kdamond0)
if /bin/vtism guest $ARGS --if-busy exit --rounds 1 >/tmp/refuse.log 2>&1; then
	result busy-exit fail "the agent ran beside a foreign kdamond"
elif [ "$(kdamond0)" = "$before" ]; then
	result busy-exit ok "$(tail -n 1 /tmp/refuse.log | cut -c1-300)"
else
	result busy-exit fail "the foreign kdamond changed: $before -> $(kdamond0)"
fi

# ---- 1b. the same kdamond running: the agent waits, touching nothing, and stops on SIGTERM ----
damon_echo on $D/0/state
before=$(kdamond0)
/bin/vtism guest $ARGS --status-file /tmp/rounds-1b >/tmp/wait.log 2>&1 &
AG=$!
# 8 s from when it says it waits: its start-up takes what this TCG guest gets of a loaded
# machine, and a SIGTERM before it has its handler would end it with 143
t=0
until grep -q 'waiting until it is free' /tmp/wait.log || ! kill -0 $AG 2>/dev/null || [ $t -ge 600 ]; do
	sleep 0.2; t=$((t + 1))
done
sleep 8
mid=$(kdamond0)
kill -TERM $AG
wait $AG
rc=$?
after=$(kdamond0)
if [ -f /tmp/rounds-1b ]; then
	result waits-beside-sysfs fail "the agent published beside a running foreign kdamond"
elif [ "$mid" != "$before" ] || [ "$after" != "$before" ]; then
	result waits-beside-sysfs fail "the foreign kdamond changed: $before -> $mid -> $after"
elif [ $rc -ne 0 ] || ! grep -q 'waiting until it is free' /tmp/wait.log; then
	result waits-beside-sysfs fail "exit $rc: $(tail -n 2 /tmp/wait.log)"
else
	result waits-beside-sysfs ok "8 s beside it, exit 0 on SIGTERM, unchanged: $after"
fi
damon_echo off $D/0/state
damon_echo 0 $D/nr_kdamonds
kill $TARGET

# ---- 1c. DAMON_RECLAIM (exclusive): the agent waits, then starts once it is disabled ----
if echo Y 2>/tmp/reclaim.err >$R/enabled && [ "$(cat $R/kdamond_pid)" -gt 0 ]; then
	rpid=$(cat $R/kdamond_pid)
	rparams=$(reclaim_params)
	/bin/vtism guest $ARGS --busy-poll-ms 1000 --status-file $RF --stats-file $ST \
		>/tmp/agent.log 2>&1 &
	AG=$!
	sleep 8
	if [ -f $RF ] || [ "$(damon_cat $D/nr_kdamonds)" != 0 ] || [ "$(cat $R/kdamond_pid)" != "$rpid" ] ||
		[ "$(reclaim_params)" != "$rparams" ] || ! kill -0 $AG; then
		result waits-beside-reclaim fail "rounds $(rounds), nr_kdamonds $(damon_cat $D/nr_kdamonds), reclaim pid $rpid -> $(cat $R/kdamond_pid), $(tail -n 2 /tmp/agent.log)"
	else
		result waits-beside-reclaim ok "8 s, no kdamond directory, DAMON_RECLAIM pid $rpid and parameters unchanged"
	fi
	echo N >$R/enabled
else
	result waits-beside-reclaim fail "DAMON_RECLAIM did not start: enabled=$(cat $R/enabled) pid=$(cat $R/kdamond_pid) $(cat /tmp/reclaim.err), nr_kdamonds $(damon_cat $D/nr_kdamonds)"
	/bin/vtism guest $ARGS --status-file $RF --stats-file $ST >/tmp/agent.log 2>&1 &
	AG=$!
fi
if wait_rounds 1 60 && [ "$(damon_cat $D/0/state)" = on ]; then
	result start ok "after DAMON_RECLAIM stopped: kdamond pid $(damon_cat $D/0/pid), ops $(damon_cat $D/0/contexts/0/operations), state on"
else
	cat /tmp/agent.log
	result start fail "no first round"
	finish
fi
# while the agent runs, DAMON_RECLAIM cannot start (the kernel says EBUSY), and the agent goes on
r0=$(rounds)
if echo Y >$R/enabled 2>/tmp/reclaim.err; then
	result exclusive-while-running fail "DAMON_RECLAIM started beside the agent (pid $(cat $R/kdamond_pid))"
	echo N >$R/enabled
elif wait_rounds 2 60 && [ "$(cat $R/enabled)" = N ] && [ "$(damon_cat $D/0/state)" = on ]; then
	result exclusive-while-running ok "enabling DAMON_RECLAIM: $(cut -d: -f2- /tmp/reclaim.err); the agent went on (rounds $r0 -> $(rounds))"
else
	result exclusive-while-running fail "enabled=$(cat $R/enabled), state $(damon_cat $D/0/state), rounds $r0 -> $(rounds)"
fi

# ---- 2. the warm workload ----
/bin/vtism-workload $WL_ARGS >/tmp/wl.log 2>&1 &
WL=$!
t=0
until grep -q '^VTGT ready' /tmp/wl.log; do
	sleep 0.2; t=$((t + 1))
	if [ $t -gt 300 ] || ! kill -0 $WL 2>/dev/null; then break; fi
done
cat /tmp/wl.log
grep -q '^VTGT ready' /tmp/wl.log && result workload ok "pid $WL" || result workload fail "no ground truth"
# the host writes its first quota now
q0=$(stat_of quota_bytes)
phase quota-1
wait_stat_changes quota_bytes "$q0" 120
wait_rounds 3 120
wait_settled 4 300
wait_rounds 2 120
phase steady
stats steady-start
wait_rounds 8 300
stats steady
phase steady-end

# host feedback: an entry budget and a floor on the round period above the rounds' own. The
# budget is in force from the first round that publishes 64 entries (the hot set has thousands);
# the agent reads the floor earlier in a round than the budget, so that round may have missed
# it: the rounds after the next one have both, whenever the host's serial poll saw the marker
phase feedback-request
wait_stat_is last_entries 64 180 && wait_round $((SNAP_ROUND + 1)) 120
phase feedback
wait_rounds 3 180
phase feedback-end
# the check reads the first round after the one in flight at the reset
wait_rounds 2 180

# a larger quota: longer windows (the boundary moves into the warm pages)
q0=$(stat_of quota_bytes)
phase quota-2
wait_stat_changes quota_bytes "$q0" 120
wait_rounds 2 120
wait_settled 3 300
phase quota-2-steady
stats quota-2-start
wait_rounds 3 300
stats quota-2
phase quota-2-end

grep '^VTGT rate' /tmp/wl.log | tail -n 1
kill $WL
wait $WL
tail -n 1 /tmp/wl.log

# ---- 3. SIGTERM: the agent turns its kdamond off and removes it ----
kill -TERM $AG
wait $AG
rc=$?
tail -n 5 /tmp/agent.log | sed 's/^/VTLOG agent: /'
if [ $rc -eq 0 ] && [ "$(damon_cat $D/nr_kdamonds)" = 0 ]; then
	result agent-exit ok "exit 0, nr_kdamonds 0"
else
	result agent-exit fail "exit $rc, nr_kdamonds $(damon_cat $D/nr_kdamonds)"
fi
phase exit
# DAMON_RECLAIM again, as it was before the agent ran
if [ -n "${rparams:-}" ] && echo Y >$R/enabled && [ "$(cat $R/kdamond_pid)" -gt 0 ] &&
	[ "$(reclaim_params)" = "$rparams" ]; then
	result reclaim-after ok "enabled again (kdamond pid $(cat $R/kdamond_pid)), parameters as before"
else
	result reclaim-after fail "enabled=$(cat $R/enabled) pid=$(cat $R/kdamond_pid) params $(reclaim_params)"
fi
echo N >$R/enabled
finish
