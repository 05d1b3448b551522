#!/bin/sh
# /init of the bake-off's nested guest (busybox initramfs, testbed/prepare.sh --bakeoff). It runs
# what the conductor in the emulated host asks for, one command per line on the second serial
# port (ttyS1): "<seq> <command> <args>", and answers on the console (ttyS0) with
# "TBACK <seq> ok|fail <detail>". Commands:
#   gups ARGS        start testbed/gups.c (its TB* ground-truth lines go to the console)
#   redis ARGS       start Debian's redis-server and testbed/kvload.c with ARGS
#   stop             end the workload
#   module PARAMS    insmod vtism_guest.ko PARAMS      module-stop   rmmod it
#   agent ARGS       start `vtism guest ARGS`          agent-stop    SIGTERM, wait for it
#   cpu              the tracker's CPU time: TBCPU <what> <clock ticks> (USER_HZ 100)
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
AG=
ticks() { [ -r /proc/$1/stat ] && sed 's/.*) //' /proc/$1/stat | awk '{print $12 + $13}'; }
# pids whose command name starts with $1 (busybox here has no pgrep)
pids_named() {
	for d in /proc/[0-9]*; do
		case "$(cat $d/comm 2>/dev/null)" in "$1"*) echo "${d#/proc/}" ;; esac
	done
}
# wait up to $2 s for pid $1 to end; 1 if it did not
wait_gone() {
	n=0
	while kill -0 $1 2>/dev/null; do
		[ $n -lt $(($2 * 5)) ] || return 1
		sleep 0.2
		n=$((n + 1))
	done
}

stop_workload() {
	[ -n "$WL" ] || return 0
	kill $WL 2>/dev/null
	wait $WL 2>/dev/null
	for p in $(pids_named redis-server); do
		kill $p
		wait_gone $p 60 || kill -9 $p
	done
	WL=
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
		/bin/kvload "$@" >/dev/console 2>&1 &
		WL=$!
		;;
	stop) stop_workload ;;
	module)
		shift
		insmod /vtism_guest.ko "$@" || return 1
		;;
	module-stop) rmmod vtism_guest ;;
	agent)
		shift
		/bin/vtism guest "$@" </dev/null >/tmp/agent.log 2>&1 &
		AG=$!
		sleep 1
		kill -0 $AG 2>/dev/null || { tail -3 /tmp/agent.log; return 1; }
		;;
	agent-stop)
		[ -n "$AG" ] || return 0
		kill -TERM $AG
		if ! wait_gone $AG 240; then
			tail -n 3 /tmp/agent.log
			kill -9 $AG
			echo "the agent did not end within 240 s of SIGTERM; killed"
			AG=
			return 1
		fi
		wait $AG
		AG=
		;;
	cpu)
		for p in $(pids_named vtism_scan) $(pids_named kdamond) $AG; do
			echo "TBCPU $(cat /proc/$p/comm) $(ticks $p)"
		done
		;;
	*) return 2 ;;
	esac
}

stty -F /dev/ttyS1 raw -echo 2>/dev/null
echo "TBCMD ready"
# `run` in this shell, not a subshell: the workload and the agent stay its children, and their
# output goes to the console directly (a command substitution would wait for them).
while read -r seq cmd <&3; do
	if run $cmd >/tmp/out 2>&1; then
		cat /tmp/out
		echo "TBACK $seq ok"
	else
		echo "TBACK $seq fail $(tail -n 2 /tmp/out | tr '\n' ' ')"
	fi
done 3</dev/ttyS1
echo "TBERR the control channel closed"
poweroff -f
