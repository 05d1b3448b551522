#!/bin/sh
# /init of the testbed's nested guest (busybox initramfs, see testbed/prepare.sh).
# Kernel command line: vtism.gups="<gups args>" (with + for spaces), vtism.control_s=N (run the
# workload N seconds without the tracker first: the control phase), vtism.params=a=1,b=2 (module
# parameters). Everything the host needs goes to the serial console as TB* lines.
export PATH=/bin:/sbin
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
echo 1 >/proc/sys/kernel/printk
# The ground truth's frames must not move inside the guest.
echo 0 >/proc/sys/vm/compaction_proactiveness 2>/dev/null
echo 0 >/proc/sys/vm/compact_unevictable_allowed 2>/dev/null

arg() { sed -n "s/.*vtism\.$1=\([^ ]*\).*/\1/p" /proc/cmdline; }
GUPS=$(arg gups | tr + ' ')
CONTROL=$(arg control_s)
PARAMS=$(arg params | tr , ' ')
echo "TBBOOT $(uname -r) $(grep MemTotal /proc/meminfo | tr -s ' ')"

mkdir -p /tmp && mount -t tmpfs tmp /tmp
/bin/vtism-workload $GUPS --ready-file /tmp/ready &
W=$!
# The control phase starts when the workload has printed its ground truth (TBREADY).
while [ ! -e /tmp/ready ] && kill -0 $W 2>/dev/null; do sleep 1; done
sleep "${CONTROL:-30}"
kill -0 $W 2>/dev/null || { echo "TBERR workload died"; poweroff -f; }
# Announced before insmod: the module publishes its first round during insmod, and the control
# phase must end before any round can exist.
echo "TBMOD loading"
if insmod /vtism_guest.ko $PARAMS; then
	echo "TBMOD loaded $(cat /sys/module/vtism_guest/parameters/interval_max_ms 2>/dev/null)"
	# the tracker's counters every 20 s (guest-console.log): what the host side cannot see, at
	# the cost of a few sysfs reads
	(while sleep 20; do
		l=TBSTAT
		for c in sweeps bursts changes coarse_stalls rate_rises rate_falls changed_bursted neighbours_flagged \
			coarse_windows coarse_young coarse_window_us coarse_window_eff_us; do
			l="$l $c=$(cat /sys/kernel/vtism_guest/$c 2>/dev/null)"
		done
		echo "$l"
	done) &
else
	echo "TBERR insmod failed"
	dmesg | tail -20 | sed 's/^/TBDMESG /'
fi
wait $W
echo "TBERR workload exited with $?"
poweroff -f
