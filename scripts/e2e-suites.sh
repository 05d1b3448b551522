#!/usr/bin/env bash
# make test's end-to-end suites of the guest trackers, of vtismd and of the packages, overlapped
# where that costs nothing: the DAMON agent's e2e spends most of its 13-15 minutes waiting for
# DAMON's aggregations (a load of about 0.5 on this 2-core machine), so it runs in the background
# while the module's e2e (6.1, 6.12), vtismd's host e2e and the packaging test (the packages of
# `make deb` in an emulated Debian host) run one after the other in the foreground: the packaging
# test used to start after the testbed, and the DAMON agent's last minutes now pass beside it.
# Prints each suite's output (the DAMON agent's last) and exits non-zero if any check failed or
# a suite did not finish.
#
# usage: scripts/e2e-suites.sh        (make test-e2e, after make build-release deb; make test runs it)
# env:   VTISM_E2E_OUT (default <repo>/build/e2e), VTISM_E2E_PACKAGING=0 to leave the packaging
#        test out, and what the suites read themselves.
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
out=${VTISM_E2E_OUT:-$repo/build/e2e}
mkdir -p "$out"
damon_log=$out/damon-background.txt

# The guest kernels first, alone: every suite below calls scripts/guest-kernels.sh, which on a
# cold cache (a fresh clone's `make test-e2e`) runs apt-get update, deletes the series' directory
# and extracts into it; two suites doing that at once would clobber each other. Cached: a no-op.
if ! "$repo/scripts/guest-kernels.sh" 6.1 6.12 >/dev/null; then
	echo "e2e-suites: scripts/guest-kernels.sh failed"
	exit 1
fi

echo "== the DAMON agent's e2e starts in the background (its output follows the other suites)"
# In a session of its own, so that an interrupted run ends the suite's monitor and QEMU with it.
setsid "$repo/guest/tests/run-damon-e2e.sh" >"$damon_log" 2>&1 &
damon=$!
trap 'kill -TERM -- -$damon 2>/dev/null; [ -z "${rootfs:-}" ] || kill -TERM -- -$rootfs 2>/dev/null' EXIT

# The packaging test's root filesystem (tests/packaging/mkrootfs.sh: apt downloads, dpkg unpacking,
# mkfs; about three minutes) is built beside them too, so that the packaging test, which comes
# last, finds it cached. Set VTISM_E2E_ROOTFS=0 to leave it to the packaging test.
packaging=${VTISM_E2E_PACKAGING:-1}
rootfs=
rootfs_log=$out/packaging-rootfs.txt
if [ "$packaging" = 1 ] && [ "${VTISM_E2E_ROOTFS:-1}" = 1 ]; then
	if kver=$("$repo/scripts/guest-kernels.sh" 6.12 2>/dev/null | sed -n 's/^KVER=//p') && [ -n "$kver" ]; then
		echo "== the packaging test's root filesystem is built in the background ($rootfs_log)"
		(cd "$repo" && exec setsid nice -n 5 tests/packaging/mkrootfs.sh "$kver" build/packaging) >"$rootfs_log" 2>&1 &
		rootfs=$!
	fi
fi

rc=0
echo "== the module's e2e"
# Their sessions: for its 1%-budget phase the module's e2e puts them off the host CPU it gives
# its guest's vCPU 0 (guest/tests/corepin.py).
VTISM_E2E_BESIDE="$damon $rootfs" VTISM_E2E_DAMON=0 "$repo/guest/tests/run-e2e.sh" || rc=1
echo "== vtismd's host e2e"
"$repo/tests/host-e2e/run.sh" || rc=1
if [ -n "$rootfs" ]; then
	# not this suite's failure: the packaging test builds it again and reports
	wait $rootfs || echo "e2e-suites: building the packaging root filesystem failed; the packaging test will try again ($rootfs_log)"
	rootfs=
fi
if [ "$packaging" = 1 ]; then
	echo "== the packages in an emulated Debian host"
	"$repo/tests/packaging/run.sh" || rc=1
fi

echo "== waiting for the DAMON agent's e2e"
wait $damon
damon_rc=$?
trap - EXIT
echo "== the DAMON agent's e2e (ran beside the suites above)"
grep -v '^VTGT ' "$damon_log"
if [ $damon_rc -ne 0 ] || ! grep -q '^[0-9]* passed, 0 failed$' "$damon_log"; then
	echo "e2e-suites: the DAMON agent's e2e failed or did not finish (exit $damon_rc; $damon_log)"
	rc=1
fi
exit $rc
