#!/bin/sh
# /init of the bake-off's nested guest (busybox initramfs, testbed/prepare.sh --bakeoff). It runs
# what the conductor in the emulated host asks for, one command per line on the second serial
# port (ttyS1): "<seq> <command> <args>", one at a time in the order sent; it says
# "TBGOT <seq>" on the console (ttyS0) when it starts a command and "TBACK <seq> ok|fail <detail>"
# when the command is done, so the conductor can tell a guest busy with an earlier command (or
# slowed down by a loaded machine) from one that does not answer. Commands:
#   gups ARGS        start testbed/gups.c (its TB* ground-truth lines go to the console)
#   redis ARGS       start Debian's redis-server and testbed/kvload.c with ARGS
#   stop             end the workload
#   reset            end the workload and any tracker left from an earlier run (a run that failed
#                    half-way): the agent, the module, a kdamond
#   module PARAMS    insmod vtism_guest.ko PARAMS      module-stop   rmmod it
#   agent ARGS       start `vtism guest ARGS`          agent-stop    SIGTERM, wait for it to end
#   cpu              the tracker's CPU time: TBCPU <what> <clock ticks> (USER_HZ 100)
# Nothing here gives up on a process after a fixed time: a nested TCG guest on a loaded machine
# can be ten times slower than on an idle one, and the DAMON agent ends only after the DAMON
# command it is blocked in returns (up to two of its aggregations, minutes when its sampling
# interval has grown). The conductor decides how long is too long, and restarts the guest then.
export PATH=/bin:/sbin
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mkdir -p /tmp && mount -t tmpfs tmp /tmp
echo 1 >/proc/sys/kernel/printk
# The ground truth's frames must not move inside the guest.
echo 0 >/proc/sys/vm/compaction_proactiveness 2>/dev/null
echo 0 >/proc/sys/vm/compact_unevictable_allowed 2>/dev/null
echo never >/sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null
ip link set lo up 2>/dev/null
echo "TBBOOT $(uname -r) $(grep MemTotal /proc/meminfo | tr -s ' ')"

WL=
RS=
AG=
ticks() { [ -r /proc/$1/stat ] && sed 's/.*) //' /proc/$1/stat | awk '{print $12 + $13}'; }
# pids whose command name starts with $1 (busybox here has no pgrep), without a fork per process:
# under TCG inside TCG on a loaded machine a fork and exec costs a good part of a second
pids_named() {
	for d in /proc/[0-9]*; do
		c=
		read -r c <$d/comm 2>/dev/null
		case "$c" in "$1"*) echo "${d#/proc/}" ;; esac
	done
}

# The workload and redis-server are this shell's children: `wait` ends when they do.
stop_workload() {
	[ -n "$WL$RS" ] || return 0
	[ -z "$WL" ] || { kill $WL 2>/dev/null; wait $WL 2>/dev/null; }
	[ -z "$RS" ] || { kill $RS 2>/dev/null; wait $RS 2>/dev/null; }
	WL= RS=
}

run() {
	case $1 in
	gups)
		shift
		stop_workload
		/bin/vtism-workload "$@" >/dev/console 2>&1 &
		WL=$!
		;;
	redis)
		shift
		stop_workload
		/bin/redis-server --port 6379 --bind 127.0.0.1 --save "" --appendonly no \
			--protected-mode no --daemonize no --loglevel warning >/tmp/redis.log 2>&1 &
		RS=$!
		/bin/kvload "$@" >/dev/console 2>&1 &
		WL=$!
		;;
	stop) stop_workload ;;
	reset)
		stop_workload
		run agent-stop
		[ ! -d /sys/module/vtism_guest ] || rmmod vtism_guest || return 1
		k=/sys/kernel/mm/damon/admin/kdamonds
		if [ -r $k/nr_kdamonds ] && [ "$(cat $k/nr_kdamonds)" != 0 ]; then
			for d in $k/[0-9]*; do echo off >$d/state 2>/dev/null; done
			echo 0 >$k/nr_kdamonds || return 1
			echo "removed a kdamond left behind"
		fi
		;;
	module)
		shift
		insmod /vtism_guest.ko "$@" || return 1
		;;
	module-stop) rmmod vtism_guest ;;
	agent)
		shift
		rm -f /tmp/agent.stats
		/bin/vtism guest "$@" --stats-file /tmp/agent.stats </dev/null >/tmp/agent.log 2>&1 &
		AG=$!
		# a refused argument ends it within a second or two, even inside TCG inside TCG
		sleep 5
		kill -0 $AG 2>/dev/null || { tail -3 /tmp/agent.log; AG=; return 1; }
		;;
	agent-stop)
		[ -n "$AG" ] || return 0
		# what it is blocked in: a round waits for DAMON's next two aggregations, whose length
		# follows the agent's CPU per round (crates/guest/src/intervals.rs): where that CPU went
		[ -r /tmp/agent.stats ] &&
			echo "TBAGENT $(grep -E '^(rounds|sample_us|aggr_us|last_hot_frames|last_regions|tracked|kdamond_cpu_us|agent_cpu_us|regions_cpu_us|observe_cpu_us|publish_cpu_us|commit_cpu_us|elapsed_us) ' /tmp/agent.stats | tr '\n' ' ') utime/stime_ticks $(cut -d' ' -f14,15 /proc/$AG/stat 2>/dev/null)" >/dev/console
		# no round yet: where it is, and what it said (it logs to /tmp/agent.log)
		[ -r /tmp/agent.stats ] || {
			echo "TBAGENTLOG no round written; state $(cut -d' ' -f3 /proc/$AG/stat 2>/dev/null) utime/stime $(cut -d' ' -f14,15 /proc/$AG/stat 2>/dev/null) wchan $(cat /proc/$AG/wchan 2>/dev/null) syscall $(cat /proc/$AG/syscall 2>/dev/null)"
			sed 's/^/TBAGENTLOG stack /' /proc/$AG/stack 2>/dev/null
			echo "TBAGENTLOG memory $(grep -E '^(VmRSS|VmHWM):' /proc/$AG/status | tr -s ' \n' ' ') guest $(grep -E '^(MemFree|MemAvailable|Shmem|Unevictable):' /proc/meminfo | tr -s ' \n' ' ')"
			echo "TBAGENTLOG vmstat $(grep -E '^(pgfault|pgmajfault|allocstall_normal|pgscan_direct|pgsteal_direct|oom_kill) ' /proc/vmstat | tr '\n' ' ')"
			tail -n 5 /tmp/agent.log | sed 's/^/TBAGENTLOG /'
		} >/dev/console
		kill -TERM $AG
		wait $AG
		rc=$?
		AG=
		# 143: it ended by SIGTERM itself (the signal came before its handler was set, or while
		# it was not running its loop); the conductor only needs it gone
		[ $rc -eq 0 ] || [ $rc -eq 143 ] || { tail -n 3 /tmp/agent.log; return 1; }
		[ $rc -eq 0 ] || echo "the agent ended by SIGTERM's default action (exit $rc)"
		;;
	cpu)
		for p in $(pids_named vtism_scan) $(pids_named kdamond) $AG; do
			echo "TBCPU $(cat /proc/$p/comm) $(ticks $p)"
		done
		;;
	*) return 2 ;;
	esac
}

# The command port is opened (and set raw) before "TBCMD ready" and stays open: opening a
# serial port starts its UART afresh, which drops what the host sent before, so a command sent as
# soon as the conductor read "ready" was lost when the port was opened after it.
exec 3</dev/ttyS1
stty raw -echo <&3 2>/dev/null
echo "TBCMD ready"
# `run` in this shell, not a subshell: the workload and the agent stay its children, and their
# output goes to the console directly (a command substitution would wait for them).
while read -r seq cmd <&3; do
	echo "TBGOT $seq"
	if run $cmd >/tmp/out 2>&1; then
		cat /tmp/out
		echo "TBACK $seq ok"
	else
		echo "TBACK $seq fail $(tail -n 2 /tmp/out | tr '\n' ' ')"
	fi
done
echo "TBERR the control channel closed"
poweroff -f
