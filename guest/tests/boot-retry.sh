# Sourced by run-e2e.sh and run-damon-e2e.sh. A TCG guest sometimes hangs in early boot, before
# its init ran (no VTBOOT line: nothing of ours started); its monitor ends it and exits 3
# (chanmon.py, BOOT_LIMIT_S). Such a guest is booted again, once. A product check is never retried.
#
# boot_retrying LABEL DIR CHANNEL -- MONITOR ARGS...: runs the monitor with its stdout in
# DIR/checks.txt (stderr: DIR/monitor.err), keeps a hung boot's console as DIR/serial-hungN.log,
# empties the channel before the second boot, and sets `rc` to the monitor's exit status.
boot_retrying() {
	local label=$1 dir=$2 chan=$3 attempt
	shift 4
	for attempt in 1 2; do
		"$@" >"$dir/checks.txt" 2>"$dir/monitor.err"
		rc=$?
		[ $rc -eq 3 ] && [ $attempt -eq 1 ] || return 0
		mv "$dir/serial.log" "$dir/serial-hung$attempt.log"
		cat "$dir/checks.txt"
		echo "e2e: $label: the guest hung in early boot (serial-hung$attempt.log); booting it again"
		truncate -s 0 "$chan" && truncate -s 16M "$chan"
	done
}
