#!/usr/bin/env bash
# Builds what the testbed boots, into build/testbed/ (idempotent; `vtism testbed` runs it):
# Debian's 6.12 kernel image and modules (scripts/guest-kernels.sh), vtism_guest.ko for it, the
# static GUPS workload, the nested guest's initramfs and the emulated host's initramfs.
# Prints KEY=VALUE lines for the driver on stdout; progress goes to stderr.
# With `--bakeoff VTISM_BIN` it also builds the bake-off's pieces (testbed/prepare-bakeoff.sh).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
out=$repo/build/testbed
mkdir -p "$out"
log() { echo "testbed: $*" >&2; }

for tool in qemu-system-x86_64 busybox cpio gcc python3 make; do
	command -v $tool >/dev/null || {
		log "missing $tool: run scripts/install-deps.sh demo (or make demo)"
		exit 1
	}
done
[ -f /usr/lib/x86_64-linux-gnu/libc.a ] || {
	log "missing the static C library: apt-get install libc6-dev"
	exit 1
}

if ! kenv=$("$repo"/scripts/guest-kernels.sh --print 6.12 2>/dev/null); then
	log "fetching Debian's 6.12 kernel and headers (apt-get download, about 100 MB)"
	"$repo"/scripts/guest-kernels.sh 6.12 >&2
	kenv=$("$repo"/scripts/guest-kernels.sh --print 6.12)
fi
eval "$kenv"

# Its own copy of the module build, so a concurrent `make test-module` does not race it.
ko=$out/module/6.12/vtism_guest.ko
if [ ! -f "$ko" ] || [ -n "$(find "$repo/guest/module" -newer "$ko" -name '*.[ch]' -o -newer "$ko" -name Kbuild)" ]; then
	log "building vtism_guest.ko for $KVER"
	make -s -C "$repo/guest/module" all-kernels SERIES=6.12 OUT="$out/module" >&2
fi

gups=$out/gups
if [ ! -x "$gups" ] || [ "$repo/testbed/gups.c" -nt "$gups" ]; then
	log "building the GUPS workload"
	gcc -O2 -Wall -Wextra -static -o "$gups" "$repo/testbed/gups.c"
fi

guest_initrd=$out/guest-initramfs.cpio.gz
if [ ! -f "$guest_initrd" ] || [ "$ko" -nt "$guest_initrd" ] || [ "$gups" -nt "$guest_initrd" ] ||
	[ "$repo/testbed/guest-init.sh" -nt "$guest_initrd" ]; then
	log "building the nested guest's initramfs"
	python3 "$repo/guest/tests/mkinitramfs.py" --init "$repo/testbed/guest-init.sh" --module "$ko" \
		--workload "$gups" -o "$guest_initrd"
fi

# The nested guests boot the same kernel unpacked, through QEMU's PVH entry: under TCG inside
# TCG the bzImage's own decompression takes minutes (docs/testbed.md, "Boot time").
guest_kernel=$out/vmlinux-$KVER
if [ ! -f "$guest_kernel" ] || [ "$VMLINUZ" -nt "$guest_kernel" ] ||
	[ "$repo/testbed/pvh-vmlinux.py" -nt "$guest_kernel" ]; then
	log "unpacking the kernel for the nested guest's PVH boot"
	python3 "$repo/testbed/pvh-vmlinux.py" "$VMLINUZ" "$guest_kernel" ||
		{ log "booting the nested guest from $VMLINUZ instead"; guest_kernel=$VMLINUZ; }
fi

host_initrd=$out/host-initramfs.cpio.gz
if [ ! -f "$host_initrd" ] || [ "$repo/tests/host-e2e/mkinitramfs.sh" -nt "$host_initrd" ]; then
	log "building the emulated host's initramfs"
	"$repo/tests/host-e2e/mkinitramfs.sh" "$MODDIR" "$host_initrd"
fi

if [ "${1:-}" = --bakeoff ]; then
	"$repo/testbed/prepare-bakeoff.sh" "${2:?--bakeoff needs the vtism binary}" "$ko" "$gups"
fi
echo "KVER=$KVER"
echo "VMLINUZ=$VMLINUZ"
echo "GUEST_KERNEL=$guest_kernel"
echo "HOST_INITRD=$host_initrd"
echo "GUEST_INITRD=$guest_initrd"
