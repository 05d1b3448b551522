#!/usr/bin/env bash
# Builds the emulated host's initramfs: busybox-static plus the 9p/virtio modules of the guest
# kernel. Its /init mounts the host's root over virtfs (read-only), a writable results share,
# then chroots into the host root and runs the command named on the kernel command line
# (vtism.run=PATH; vtism.repo=DIR names the repository if PATH is not under tests/host-e2e), so the binaries built in target/ run unchanged.
#   mkinitramfs.sh MODDIR OUT.cpio.gz
set -euo pipefail
moddir=$1
out=$2
busybox=$(command -v busybox)
file -L "$busybox" 2>/dev/null | grep -q "statically linked" || {
	echo "mkinitramfs: $busybox is not static (apt-get install busybox-static)" >&2
	exit 1
}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work"/{bin,proc,sys,dev,mnt/host,mnt/out,lib/modules}
cp "$busybox" "$work/bin/busybox"
for m in fs/netfs/netfs net/9p/9pnet net/9p/9pnet_virtio fs/9p/9p; do
	src=$(ls "$moddir/kernel/$m.ko"* | head -1)
	case $src in
	*.xz) xz -dc "$src" >"$work/lib/modules/$(basename "$m").ko" ;;
	*.zst) zstd -dcq "$src" >"$work/lib/modules/$(basename "$m").ko" ;;
	*) cp "$src" "$work/lib/modules/$(basename "$m").ko" ;;
	esac
done
cat >"$work/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs dev /dev
for m in netfs 9pnet 9pnet_virtio 9p; do insmod /lib/modules/$m.ko || echo "init: insmod $m failed"; done
run=$(sed -n 's/.*vtism\.run=\([^ ]*\).*/\1/p' /proc/cmdline)
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144,cache=loose hostroot /mnt/host || echo "init: no hostroot"
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 results /mnt/host/mnt 2>/dev/null ||
	mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 results /mnt/out || echo "init: no results share"
h=/mnt/host
mount -t proc proc $h/proc
mount -t sysfs sysfs $h/sys
mount -t devtmpfs dev $h/dev
mkdir -p $h/dev/shm 2>/dev/null
# The scratch tmpfs mounts below would hide a repository checked out under one of them (a CI
# clone in /tmp): keep it visible by binding it aside first and back afterwards.
repo=$(sed -n 's/.*vtism\.repo=\([^ ]*\).*/\1/p' /proc/cmdline)
[ -n "$repo" ] || repo=${run%/tests/host-e2e/*}
keep=
case "$repo" in /tmp/* | /run/* | /root/* | /dev/shm/*)
	keep=1
	mkdir -p /mnt/repo
	mount -o bind "$h$repo" /mnt/repo || keep=
	;;
esac
mount -t tmpfs tmp $h/dev/shm
mount -t tmpfs tmp $h/tmp
mount -t tmpfs tmp $h/run
mount -t tmpfs tmp $h/root 2>/dev/null || true
if [ -n "$keep" ]; then
	mkdir -p "$h$repo"
	mount -o bind /mnt/repo "$h$repo" || echo "init: cannot re-expose $repo"
fi
echo "init: running $run"
chroot $h /bin/sh -c "cd /; $run" 2>&1
echo "init: $run exited with $?"
sync
poweroff -f
INIT
chmod +x "$work/init"
(cd "$work" && find . | cpio -o -H newc --quiet | gzip -1) >"$out"
