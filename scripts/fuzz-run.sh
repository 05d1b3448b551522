#!/usr/bin/env bash
# Runs one cargo-fuzz target for a while and keeps what it found, so that runs accumulate over
# sessions: the working corpus fuzz/corpus/<target> (ignored by git, every feature the fuzzer
# found) starts from itself and the kept corpus fuzz/corpora/<target> (in git, replayed by make
# test through crates/host/tests/fuzz_corpora.rs); after the run the working corpus is minimised
# in place (cargo fuzz cmin), the kept one becomes the fewest inputs that cover every edge the
# working one covers (libFuzzer's -set_cover_merge on edges alone: hundreds of inputs, not
# thousands), and the run's executions go into fuzz/executions.tsv (docs/host.md, "Fuzzing",
# sums them per target). A crash stops the run; its input is in fuzz/artifacts/<target>.
# Usage: scripts/fuzz-run.sh TARGET SECONDS MAX_LEN   (one job, nice 19: the machine is shared)
set -euo pipefail
cd "$(dirname "$0")/.."
target=$1 secs=$2 max_len=$3
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
kept=fuzz/corpora/$target work=fuzz/corpus/$target
mkdir -p "$kept" "$work"
cp -n "$kept"/* "$work"/ 2>/dev/null || true
log=$(mktemp)
start=$SECONDS
(cd fuzz && nice -n 19 cargo +nightly fuzz run "$target" "corpus/$target" -- \
	-max_total_time="$secs" -max_len="$max_len" -timeout=10 -print_final_stats=1) 2>&1 | tee "$log" |
	grep -E "^#[0-9]+.*(pulse|DONE)|ERROR|panicked|SUMMARY" || true
ran=$((SECONDS - start))
execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
bin=$(ls fuzz/target/*/release/"$target" | head -1)
result=ok
grep -qE "ERROR: libFuzzer|panicked|SUMMARY: " "$log" && result=crash
# At nice 19 beside other work the fuzzer can be starved past its (wall-clock) timeout: an input
# that runs within it alone is recorded as such, not as a crash, and the run counts as ended.
unit=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -1)
if grep -q "ERROR: libFuzzer: timeout" "$log" && [ -f "$unit" ]; then
	result=timeout
	"$bin" -timeout=10 "$unit" >/dev/null 2>&1 && result=timeout-not-reproduced
fi
printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$(date -u +%Y-%m-%dT%H:%M)" "$target" "$ran" "${execs:-0}" "$result" \
	"$(uname -n | cut -c1-20), $(nproc) cpus" >>fuzz/executions.tsv
(cd fuzz && nice -n 19 cargo +nightly fuzz cmin "$target" "corpus/$target" -- -max_len="$max_len" -timeout=10) >/dev/null 2>&1 || true
min=$(mktemp -d)
nice -n 19 "$bin" -set_cover_merge=1 -use_counters=0 -max_len="$max_len" -timeout=10 "$min" "$work" >/dev/null 2>&1 || true
if [ -n "$(ls -A "$min")" ]; then
	rm -f "$kept"/*
	cp "$min"/* "$kept"/
fi
rm -rf "$min" "$log"
total=$(awk -F'\t' -v t="$target" '$2 == t { s += $4 } END { print s + 0 }' fuzz/executions.tsv)
echo "$target: ${execs:-0} executions in $ran s ($result), $total in all; kept corpus: $(ls "$kept" | wc -l) inputs"
[ "$result" = ok ] || [ "$result" = timeout-not-reproduced ]
