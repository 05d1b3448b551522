#!/bin/bash
# Runs inside the emulated host (chrooted into the real host's root over virtfs, see
# tests/host-e2e/mkinitramfs.sh) for `vtism bakeoff`: the conductor boots the nested guest and runs
# every manager of $OUT/plan.json in turn. Lines starting with "TB " are progress for the driver.
set -u
OUT=/mnt
. $OUT/bakeoff.env
exec 2>&1
ip link set lo up 2>/dev/null || busybox ip link set lo up
echo "TB emulated host up: kernel $(uname -r), nodes $(cat /sys/devices/system/node/online)"
for t in /sys/devices/virtual/memory_tiering/memory_tier*; do
	echo "TB   $(basename $t): nodes $(cat $t/nodelist)"
done
$BIN bakeoff conduct --plan $OUT/plan.json --out $OUT
echo "TB conductor exited with $?"
cp /tmp/bakeoff/qemu.stderr $OUT/ 2>/dev/null
echo "inner done"
