#!/usr/bin/env bash
# Builds the root filesystem of the packaging test's emulated host: Debian 12 from the apt
# registry (mmdebstrap), with systemd as init, Debian's libvirt daemon and QEMU, dkms with the
# headers of the kernel it boots, and the kernel itself (linux-image-<KVER>, or its -unsigned
# build where the archive has that, so the rootfs boots its own kernel and initrd and has its modules). Nothing is installed on this machine: the tree
# lives under build/ and becomes an ext4 image that the test boots with -snapshot, so every run
# starts from the same clean system.
#
# Cached: the image's name carries a hash of its inputs (this script, the kernel version, the
# boot unit); an image with the right name is reused as is.
#
#   mkrootfs.sh KVER OUTDIR     prints the image path (and KERNEL=, INITRD= lines) on stdout
set -euo pipefail
kver=$1
out=$2
here=$(cd "$(dirname "$0")" && pwd)
log() { echo "packaging-rootfs: $*" >&2; }

# What an operator's KVM host has for vtism (libvirt, QEMU, systemd), what a guest needs for the
# DKMS package (dkms, a compiler, the running kernel's headers), man-db (systemd-analyze verify
# looks up the unit's man: documentation), and python3 for the checks.
# The kernel as scripts/guest-kernels.sh takes it: the -unsigned image where the archive has
# it (bookworm-security carries 6.12.118's only as -unsigned; the signed one is not there).
kimg=linux-image-$kver-unsigned
apt-cache show "$kimg" >/dev/null 2>&1 || kimg=linux-image-$kver
pkgs=(systemd-sysv dbus kmod iproute2 procps python3 udev man-db
	libvirt-daemon-system libvirt-clients libvirt-daemon-driver-qemu qemu-system-x86
	apparmor dkms make gcc-12 "$kimg" "linux-headers-$kver")

key=$(cat "$0" "$here/vtism-test.service" | sha256sum | cut -c1-16)
img=$out/rootfs-$kver-$key.ext4
emit() {
	echo "IMAGE=$img"
	echo "KERNEL=$out/rootfs-$kver-$key.vmlinuz"
	echo "INITRD=$out/rootfs-$kver-$key.initrd"
}
if [ -f "$img" ] && [ -f "$out/rootfs-$kver-$key.initrd" ]; then
	log "cached: $img"
	emit
	exit 0
fi
command -v mmdebstrap >/dev/null || {
	log "missing mmdebstrap (scripts/install-deps.sh test)"
	exit 1
}
mkdir -p "$out"
rm -rf "$out"/rootfs-* "$out"/.rootfs.*
tree=$(mktemp -d "$out/.rootfs.XXXXXX")
trap 'rm -rf "$tree"' EXIT
t0=$SECONDS
log "mmdebstrap bookworm (${pkgs[*]})"
# The boot unit runs the test named on the kernel command line; getty and the timers of a
# long-lived system only cost boot time here.
# man-db's index is not rebuilt on every package installation (minutes under TCG); `man` finds
# pages without it.
mmdebstrap --mode=root --variant=apt --include="${pkgs[*]}" \
	--aptopt='Acquire::Languages "none"' \
	--essential-hook='echo "man-db man-db/auto-update boolean false" | chroot "$1" debconf-set-selections' \
	--customize-hook="cp '$here/vtism-test.service' \"\$1/etc/systemd/system/\"" \
	--customize-hook='chroot "$1" systemctl enable vtism-test.service' \
	--customize-hook='chroot "$1" systemctl mask getty@tty1.service serial-getty@ttyS0.service apt-daily.timer apt-daily-upgrade.timer dpkg-db-backup.timer e2scrub_all.timer fstrim.timer systemd-timesyncd.service' \
	--customize-hook='echo vtism-host >"$1/etc/hostname"' \
	--customize-hook='echo "/dev/vda / ext4 defaults 0 1" >"$1/etc/fstab"' \
	--customize-hook='rm -f "$1"/var/cache/apt/archives/*.deb' \
	bookworm "$tree" >&2
[ -f "$tree/boot/vmlinuz-$kver" ] && [ -f "$tree/boot/initrd.img-$kver" ] || {
	log "the rootfs has no /boot/vmlinuz-$kver or initrd.img-$kver"
	exit 1
}
cp "$tree/boot/vmlinuz-$kver" "$out/rootfs-$kver-$key.vmlinuz"
cp "$tree/boot/initrd.img-$kver" "$out/rootfs-$kver-$key.initrd"
mb=$(du -sm "$tree" | cut -f1)
mkfs.ext4 -q -F -L vtism-root -d "$tree" "$img.tmp" "$((mb * 3 / 2 + 1024))M" >&2
mv "$img.tmp" "$img"
log "built $img (${mb} MiB of files) in $((SECONDS - t0)) s"
emit
