#!/usr/bin/env bash
# End-to-end test of vtismd in an emulated host: boots Debian's 6.12 kernel under QEMU (TCG) with
# four NUMA nodes (DRAM on two sockets + two CPU-less nodes HMAT marks as slower), shares the host
# root read-only over virtfs, and runs tests/host-e2e/inner.sh there against nested QEMUs.
# Prints "N passed, M failed"; exits non-zero on any failure.
#
# Needs: qemu-system-x86 and busybox-static (apt), the 6.12 guest kernel (scripts/guest-kernels.sh
# 6.12, run here if missing), release builds of `vtism` and the e2e harness (built here).
# Env: VTISM_E2E_TIMEOUT (s, default 600), VTISM_E2E_BENCH=0 to skip the mover benchmark,
#      VTISM_E2E_KEEP=1 to keep the results directory.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
cd "$repo"
t0=$SECONDS
log() { echo "host-e2e: $*" >&2; }

for tool in qemu-system-x86_64 busybox cpio; do
	command -v $tool >/dev/null || {
		log "missing $tool (apt-get install qemu-system-x86 busybox-static cpio)"
		echo "0 passed, 1 failed"
		exit 1
	}
done
if ! kenv=$(scripts/guest-kernels.sh --print 6.12 2>/dev/null); then
	log "fetching the 6.12 guest kernel"
	scripts/guest-kernels.sh 6.12 >&2
	kenv=$(scripts/guest-kernels.sh --print 6.12)
fi
eval "$kenv"

log "building (release)"
nice -n 10 cargo build --release -q -p vtism >&2
nice -n 10 cargo build --release -q -p vtism-host --example e2e-harness >&2

# The initramfs and the results directory are this run's own (another run may share the checkout).
mkdir -p build/host-e2e
initrd=$(mktemp build/host-e2e/initramfs.XXXXXX)
out=$(mktemp -d /tmp/vtism-host-e2e.XXXXXX)
chmod 755 "$out"
trap 'rm -f "$initrd"; [ "${VTISM_E2E_KEEP:-0}" = 1 ] || rm -rf "$out"' EXIT
tests/host-e2e/mkinitramfs.sh "$MODDIR" "$initrd"

# shellcheck source=tests/lib/emuhost.sh
EMUHOST_TWO_CXL=1 . tests/lib/emuhost.sh

log "booting the emulated host (kernel $KVER)"
set +e
timeout "${VTISM_E2E_TIMEOUT:-600}" nice -n 10 qemu-system-x86_64 \
	"${emuhost_machine[@]}" \
	-kernel "$VMLINUZ" -initrd "$initrd" \
	-append "console=ttyS0 quiet panic=-1 hugepagesz=1G hugepages=2:1 vtism.run=$repo/tests/host-e2e/inner.sh" \
	-virtfs local,path=/,mount_tag=hostroot,readonly=on,security_model=none,multidevs=remap \
	-virtfs local,path="$out",mount_tag=results,security_model=none \
	-nographic -no-reboot -nodefaults -serial stdio >"$out/console.log" 2>&1
rc=$?
set -e
grep -v '^\s*$' "$out/console.log" | sed -e 's/\x1b\[[0-9;?]*[a-zA-Z]//g' | grep -vE '^(c|SeaBIOS|Booting)' >&2 || true
[ $rc -eq 0 ] || log "emulated host exited with $rc (124 = timeout)"
if [ -n "${VTISM_E2E_LOGS:-}" ]; then
	mkdir -p "$VTISM_E2E_LOGS" && cp -r "$out"/. "$VTISM_E2E_LOGS"/
fi
passed=$(grep -c '^PASS' "$out/results" 2>/dev/null || true)
failed=$(grep -c '^FAIL' "$out/results" 2>/dev/null || true)
passed=${passed:-0}
failed=${failed:-0}
if ! grep -q "inner done" "$out/console.log"; then
	log "the test did not run to the end"
	failed=$((failed + 1))
fi
if [ "$failed" -gt 0 ]; then
	log "vtismd log tail:"
	tail -40 "$out/vtismd.log" 2>/dev/null | sed -e 's/\x1b\[[0-9;]*m//g' >&2 || true
fi
log "runtime $((SECONDS - t0))s"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
