#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# /init of the guest tracker benchmark (guest/tests/bench.sh); not a test.
# Prints on the serial console:
#   VTB snap <label> <name> <value>   a debugfs statistics snapshot
#   VTB tput <config> <run> ops=... secs=... ops_per_s=...   one throughput run
#   VTB info ...                      context
#   VTB done
# Parameters come from the kernel command line: vtism.bench=<mb>,<rounds>,<secs>,<reps>

export PATH=/bin:/sbin
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mkdir -p /tmp
mount -t tmpfs tmp /tmp
mount -t debugfs debugfs /sys/kernel/debug
echo 1 >/proc/sys/kernel/printk

S=/sys/kernel/vtism_guest
P=/sys/module/vtism_guest/parameters
W=/bin/vtism-workload
set -- $(sed -n 's/.*vtism.bench=\([^ ]*\).*/\1/p' /proc/cmdline | tr , ' ')
MB=${1:-512}; ROUNDS=${2:-5}; SECS=${3:-20}; REPS=${4:-3}
# part 3: <pairs>,<phase seconds>; the parts to run (default all): vtism.parts=prune,tput,ab
set -- $(sed -n 's/.*vtism.ab=\([^ ]*\).*/\1/p' /proc/cmdline | tr , ' ')
AB_PAIRS=${1:-12}; AB_SECS=${2:-20}
PARTS=$(sed -n 's/.*vtism.parts=\([^ ]*\).*/\1/p' /proc/cmdline)
PARTS=${PARTS:-prune,tput,ab}
part() { case ",$PARTS," in *",$1,"*) return 0 ;; esac; return 1; }
say() { echo "VTB $*"; }
rounds() { cat $S/rounds 2>/dev/null || echo 0; }
wait_rounds() {
	target=$(($(rounds) + $1)); t=0
	while [ "$(rounds)" -lt $target ]; do
		sleep 0.1; t=$((t + 1))
		[ $t -lt 3000 ] || { say "info wait_rounds timed out"; return 1; }
	done
}
snap() { sed "s/^/VTB snap $1 /" /sys/kernel/debug/vtism_guest/stats; }
wait_ready() {
	t=0
	until grep -q '^VTB ready' "$1"; do
		sleep 0.2; t=$((t + 1)); [ $t -lt 1500 ] || break
	done
}
say "info kernel=$(uname -r) cpus=$(nproc) mem_kb=$(sed -n 's/MemTotal: *\([0-9]*\).*/\1/p' /proc/meminfo) mb=$MB rounds=$ROUNDS secs=$SECS reps=$REPS"
say "info thp=$(cat /sys/kernel/mm/transparent_hugepage/enabled) parts=$PARTS ab_pairs=$AB_PAIRS ab_secs=$AB_SECS"

# ---- 1. pruning on vs off, per sparsity shape, at a fixed 1 s interval ----
# (fixed so both modes scan the same amount of workload activity per round)
if part prune; then
insmod /vtism_guest.ko interval_k=0 interval_kb=0 interval_base_ms=1000 || { say "info insmod failed"; say done; poweroff -f; }
wait_rounds 1
for shape in dense:64:512 mid:16:32 sparse:2:8; do
	name=${shape%%:*}; rest=${shape#*:}; h=${rest%%:*}; ppc=${rest#*:}
	$W shape --mb "$MB" --hot-chunks-per-64 "$h" --pages-per-chunk "$ppc" >/tmp/$name.log 2>&1 &
	WL=$!
	wait_ready /tmp/$name.log
	say "info shape $name $(head -n1 /tmp/$name.log)"
	j=0
	for pr in 1 0 1 0; do
		j=$((j + 1))
		echo $pr >$P/prune
		# two settling rounds: the first after a switch sees A bits of the previous mode
		wait_rounds 2
		snap "$name-p$pr-$j-a"
		wait_rounds "$ROUNDS"
		snap "$name-p$pr-$j-b"
	done
	kill $WL; wait $WL 2>/dev/null
	echo 1 >$P/prune
done
rmmod vtism_guest
fi

# ---- 2. workload slowdown, alternating configs in rotated order each repetition ----
#   none      module not loaded
#   adaptive  module defaults: T = (8*Ts + 50)*Ts + 2500 ms
#   fixed2500 T = Tbase = 2500 ms, i.e. the adaptive interval when scans take ~0 ms
#   fixed100  an aggressive fixed 100 ms interval
tput() {
	$W tput --mb 256 --secs "$SECS" >/tmp/tput.log 2>&1
	say "tput $1 $2 $(grep '^VTB tput' /tmp/tput.log | sed 's/^VTB tput //')"
}
run_cfg() {
	case $1 in
	none) tput none $2; return ;;
	adaptive) insmod /vtism_guest.ko ;;
	fixed2500) insmod /vtism_guest.ko interval_k=0 interval_kb=0 interval_base_ms=2500 ;;
	fixed100) insmod /vtism_guest.ko interval_k=0 interval_kb=0 interval_base_ms=100 ;;
	esac
	wait_rounds 1
	snap "$1$2-a"; tput "$1" "$2"; snap "$1$2-b"
	rmmod vtism_guest
}
i=0
part tput || REPS=0
while [ $i -lt "$REPS" ]; do
	i=$((i + 1))
	case $((i % 4)) in
	1) order="none adaptive fixed2500 fixed100" ;;
	2) order="fixed100 none adaptive fixed2500" ;;
	3) order="fixed2500 fixed100 none adaptive" ;;
	0) order="adaptive fixed2500 fixed100 none" ;;
	esac
	for c in $order; do run_cfg $c $i; done
done
# ---- 3. interleaved A/B in one workload process: tracking off (A) / module defaults (B) ----
# One GUPS-like process runs throughout and reports its ops every 500 ms, tagged with the phase
# in /tmp/phase; phases A1 B1 A2 B2 ... A<n+1> of AB_SECS each, the module loaded with its
# defaults (adaptive interval, capped by interval_max_ms) for the B phases and unloaded for the A phases.
# Slices that straddle an insmod/rmmod are dropped ("x"). The same process, the same frames,
# the same soft-TLB state: what remains is the host's load drifting, which bracketing each B
# phase by the A phases around it cancels to first order.
if part ab; then
	echo x >/tmp/phase
	$W tput --mb 256 --secs 0 --slice-ms 500 --phase-file /tmp/phase >/tmp/ab.log 2>&1 &
	WL=$!
	wait_ready /tmp/ab.log
	i=0
	while [ $i -le "$AB_PAIRS" ]; do
		i=$((i + 1))
		echo "A$i" >/tmp/phase
		sleep "$AB_SECS"
		echo x >/tmp/phase
		[ $i -le "$AB_PAIRS" ] || break
		insmod /vtism_guest.ko
		echo "B$i" >/tmp/phase
		snap "ab$i-a"
		sleep "$AB_SECS"
		snap "ab$i-b"
		echo x >/tmp/phase
		rmmod vtism_guest
	done
	sleep 1
	kill $WL; wait $WL 2>/dev/null
	sed -n 's/^VTB slice /VTB slice /p' /tmp/ab.log
fi

bad=$(dmesg | grep -E -c 'BUG:|WARNING:|Oops|soft lockup|RCU stall')
say "info dmesg_suspicious=$bad"
say done
sync
poweroff -f
