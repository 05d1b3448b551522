#!/usr/bin/env bash
# make test's end-to-end suites of the guest trackers and of vtismd, overlapped where that costs
# nothing: the DAMON agent's e2e spends most of its 13-15 minutes waiting for DAMON's
# aggregations (a load of about 0.5 on this 2-core machine), so it runs in the background while
# the module's e2e (6.1, 6.12) and vtismd's host e2e run one after the other in the foreground.
# Prints each suite's output (the DAMON agent's last) and exits non-zero if any check failed or
# a suite did not finish.
#
# usage: scripts/e2e-suites.sh        (make test-e2e; make test runs it)
# env:   VTISM_E2E_OUT (default <repo>/build/e2e), and what the suites read themselves.
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
out=${VTISM_E2E_OUT:-$repo/build/e2e}
mkdir -p "$out"
damon_log=$out/damon-background.txt

echo "== the DAMON agent's e2e starts in the background (its output follows the other suites)"
# In a session of its own, so that an interrupted run ends the suite's monitor and QEMU with it.
setsid "$repo/guest/tests/run-damon-e2e.sh" >"$damon_log" 2>&1 &
damon=$!
trap 'kill -TERM -- -$damon 2>/dev/null' EXIT

rc=0
echo "== the module's e2e"
VTISM_E2E_DAMON=0 "$repo/guest/tests/run-e2e.sh" || rc=1
echo "== vtismd's host e2e"
"$repo/tests/host-e2e/run.sh" || rc=1

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
