# PASS/FAIL lines for the scripts that run inside an emulated host (tests/host-e2e/inner.sh,
# tests/packaging/inner.sh): each goes to stdout and to $OUT/results, which run.sh counts.
pass() { echo "PASS $*" | tee -a "$OUT/results"; }
fail() { echo "FAIL $*" | tee -a "$OUT/results"; }
check() { # check NAME COMMAND...: PASS if the command succeeds, with its last line of output
	local name=$1
	shift
	local out
	if out=$("$@" 2>&1); then
		pass "$name${out:+: $(echo "$out" | tail -1)}"
	else
		fail "$name: $(echo "$out" | tail -4 | tr '\n' ' ')"
	fi
}
