#!/bin/bash
# Runs inside the emulated host (chrooted into the real host's root over virtfs, see
# tests/host-e2e/mkinitramfs.sh): vtismd, a nested guest with the ivshmem channel, the tracker
# module and the GUPS workload, and `vtism testbed probe`, which samples the run into
# $OUT/samples.jsonl. Settings come from $OUT/testbed.env (written by `vtism testbed`).
# Lines starting with "TB " are progress for the driver; everything else is the console log.
set -u
OUT=/mnt
. $OUT/testbed.env
# Logs live on the emulated host's tmpfs and are copied to $OUT (virtfs) at the end: a serial
# console written byte by byte through 9p slows the nested guest's boot several times over.
W=/tmp/testbed
mkdir -p $W/qmp
exec 2>&1
ip link set lo up 2>/dev/null || busybox ip link set lo up
say() { echo "TB $*"; }

say "emulated host up: kernel $(uname -r), nodes $(cat /sys/devices/system/node/online)"
for t in /sys/devices/virtual/memory_tiering/memory_tier*; do
	say "  $(basename $t): nodes $(cat $t/nodelist)"
done
# Only vtismd moves pages here: the kernel's NUMA balancing (and tiering mode 2) stays off so the
# control phase shows what vtism does and does not do.
echo 0 >/proc/sys/kernel/numa_balancing 2>/dev/null
# Guest RAM in 4 KiB host pages. vtismd places host THPs whole and splits sparse ones while the
# quota is short (docs/host.md, "Host huge pages"), but here khugepaged collapses a split block
# again within a minute, onto the node holding most of it (CXL), hot frames included: with THPs
# the warm check dipped to 86.8-88.4% (docs/testbed.md, "host huge pages on", "split"). vtismd
# now asks again only after a back-off (1 min doubling to 1 h), which this 3-minute run cannot
# reach, and passed 2 of 2 but churned 12-16 MiB a minute ("back-off"). At 48d9198 it passed 1
# of 3 (the hot set's 12 blocks leave 2.6 points above 90%, and the guest's levels put warm blocks
# above hot ones: "host THP on, the hot set's blocks counted"), so the testbed measures placement
# on base pages; `--host-thp default` (HOST_THP) leaves the kernel's setting.
[ "${HOST_THP:-never}" = never ] && echo never >/sys/kernel/mm/transparent_hugepage/enabled
say "  host THP: $(cat /sys/kernel/mm/transparent_hugepage/enabled)"

cat >$W/vtismd.toml <<EOF
[daemon]
interval_ms = $DAEMON_INTERVAL_MS
control_socket = "$W/ctl.sock"
metrics_listen = "127.0.0.1:9464"
[discovery]
scan_dirs = ["$W/qmp"]
scan_interval_ms = 500
[channel]
min_interval_ms = $CHANNEL_MIN_INTERVAL_MS
[mover]
promote_mbps = $RATE_MBPS
demote_mbps = $RATE_MBPS
[[vm]]
name = "guest"
fast_quota_mib = $QUOTA_MIB
EOF
$BIN host -c $W/vtismd.toml --log info >$W/vtismd.log 2>&1 &
VTISMD=$!

truncate -s 1M /dev/shm/vtism-guest.chan
# No CMPXCHG16B: SLUB's cmpxchg16b double-faults the 6.12 guest early in boot under TCG inside
# TCG (QEMU 7.2); without the feature SLUB takes its lock-based path.
# Guest RAM preallocated and interleaved over the two CXL nodes: the workload starts on slow
# memory, as a VM does once its DRAM share is gone.
# -icount: the guest's clock counts its own instructions (2^shift ns each), so that TCG's swings
# in speed are not swings in every rate the guest measures; align=on: and it never runs ahead of
# wall time (docs/testbed.md, "The nested guest's clock").
qemu-system-x86_64 -accel tcg,tb-size=64 -icount shift=$NESTED_ICOUNT_SHIFT,align=on,sleep=on -machine q35 -cpu qemu64,cx16=off -smp 1 -m ${GUEST_MIB}M \
	-name guest -display none -nodefaults -no-reboot \
	-object memory-backend-ram,id=ram0,size=${GUEST_MIB}M,prealloc=on,host-nodes=2-3,policy=interleave \
	-numa node,nodeid=0,memdev=ram0 \
	-object memory-backend-file,id=vtism-chan,mem-path=/dev/shm/vtism-guest.chan,size=1M,share=on \
	-device ivshmem-plain,memdev=vtism-chan,id=vtism0 \
	-kernel "$GUEST_KERNEL" -initrd "$GUEST_INITRD" \
	-append "console=ttyS0 panic=-1 vtism.gups=$GUPS_ARGS vtism.control_s=$CONTROL_S vtism.params=$MODULE_PARAMS" \
	-serial file:$W/guest-console.log \
	-qmp unix:$W/qmp/guest.qmp,server=on,wait=off \
	-qmp unix:$W/probe.qmp,server=on,wait=off \
	-daemonize -pidfile $W/guest.pid
if [ -s $W/guest.pid ]; then
	say "nested guest started (pid $(cat $W/guest.pid), ${GUEST_MIB} MiB on nodes 2-3); it boots Debian $(basename "$VMLINUZ" | sed 's/vmlinuz-//') under TCG inside TCG"
	capture=()
	[ "${CAPTURE_LEVELS:-0}" = 1 ] && capture=(--channel /dev/shm/vtism-guest.chan)
	$BIN testbed probe --qmp $W/probe.qmp --control-socket $W/ctl.sock \
		--console $W/guest-console.log --samples $OUT/samples.jsonl \
		--dram-nodes 0,1 --slow-nodes 2,3 --settings $OUT/testbed.env "${capture[@]}"
	say "probe exited with $?"
else
	say "nested guest did not start"
fi
[ -s $W/guest.pid ] && kill "$(cat $W/guest.pid)" 2>/dev/null
kill $VTISMD 2>/dev/null
wait $VTISMD 2>/dev/null
cp $W/vtismd.toml $W/vtismd.log $W/guest-console.log $OUT/ 2>/dev/null
echo "inner done"
