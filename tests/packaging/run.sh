#!/usr/bin/env bash
# The packaging test: boots an emulated host (TCG, 3 NUMA nodes like tests/host-e2e: DRAM on two
# sockets and a CPU-less node HMAT marks slower) whose root is a Debian 12 system with systemd,
# libvirt, QEMU and dkms (tests/packaging/mkrootfs.sh, cached under build/packaging/, booted with
# -snapshot so it stays clean), and runs tests/packaging/inner.sh there: the vtismd and
# vtism-guest-dkms packages (build/deb/, `make deb`) installed with dpkg, the unit verified and
# started, a libvirt domain managed. Nothing is installed on this machine.
# Prints "N passed, M failed"; exits non-zero on any failure.
#
# Env: VTISM_PACKAGING_TIMEOUT (s, default 1500), VTISM_PACKAGING_KEEP=1 to keep the results.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
cd "$repo"
t0=$SECONDS
log() { echo "packaging: $*" >&2; }
die() {
	log "$*"
	echo "0 passed, 1 failed"
	exit 1
}

command -v qemu-system-x86_64 >/dev/null || die "missing qemu-system-x86_64 (scripts/install-deps.sh test)"
ls build/deb/vtismd_*_amd64.deb build/deb/vtism-guest-dkms_*_all.deb >/dev/null 2>&1 ||
	die "no packages in build/deb: run make deb"
eval "$(scripts/guest-kernels.sh 6.12 | grep '^KVER=')"
log "building the e2e harness (release)"
nice -n 10 cargo build --release -q -p vtism-host --example e2e-harness >&2
t=$SECONDS
eval "$(tests/packaging/mkrootfs.sh "$KVER" build/packaging | grep -E "^(IMAGE|KERNEL|INITRD)=")"
[ -n "${IMAGE:-}" ] || die "building the root filesystem failed (tests/packaging/mkrootfs.sh, above)"
log "root filesystem ready in $((SECONDS - t)) s: $IMAGE"

out=$(mktemp -d /tmp/vtism-packaging.XXXXXX)
chmod 755 "$out"
[ "${VTISM_PACKAGING_KEEP:-0}" = 1 ] || trap 'rm -rf "$out"' EXIT

# shellcheck source=tests/lib/emuhost.sh
. tests/lib/emuhost.sh

log "booting the emulated host (kernel $KVER, systemd)"
t=$SECONDS
set +e
timeout "${VTISM_PACKAGING_TIMEOUT:-1500}" nice -n 10 qemu-system-x86_64 \
	"${emuhost_machine[@]}" \
	-kernel "$KERNEL" -initrd "$INITRD" \
	-append "root=/dev/vda rw console=ttyS0 quiet panic=-1 vtism.repo=$repo vtism.run=$repo/tests/packaging/inner.sh" \
	-drive file="$IMAGE",if=virtio,format=raw,snapshot=on \
	-virtfs local,path="$repo",mount_tag=repo,readonly=on,security_model=none,multidevs=remap \
	-virtfs local,path="$out",mount_tag=results,security_model=none \
	-nographic -no-reboot -nodefaults -serial stdio >"$out/console.log" 2>&1
rc=$?
set -e
sed -e 's/\x1b\[[0-9;?]*[a-zA-Z]//g' "$out/console.log" | grep -vE '^\s*$|^(SeaBIOS|Booting)' >&2 || true
[ $rc -eq 0 ] || log "emulated host exited with $rc (124 = timeout)"
log "emulated host ran for $((SECONDS - t)) s"
if [ -n "${VTISM_PACKAGING_LOGS:-}" ]; then
	mkdir -p "$VTISM_PACKAGING_LOGS" && cp -r "$out"/. "$VTISM_PACKAGING_LOGS"/
fi
passed=$(grep -c '^PASS' "$out/results" 2>/dev/null || true)
failed=$(grep -c '^FAIL' "$out/results" 2>/dev/null || true)
passed=${passed:-0}
failed=${failed:-0}
if ! grep -q "== inner done" "$out/console.log"; then
	log "the test did not run to the end"
	failed=$((failed + 1))
fi
log "runtime $((SECONDS - t0)) s"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
