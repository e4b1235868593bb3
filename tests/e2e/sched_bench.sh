#!/bin/bash
# sched-bench end to end on the fixture models (CPU): every request finishes,
# a shared prompt prefix is served by the prefix cache, scheduled greedy ids
# equal solo runs (--check), bad options fail with one line.
set -u
BIN=${MEMRA_BIN:-build/bin}
FIX=${MEMRA_FIXTURES:-../shared/fixtures}
RUN="$BIN/sched-bench"
model="$FIX/models/qwen3/model-BF16.gguf"
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

out=$("$RUN" "$model" --backend cpu -c 4 -r 8 -p 40 -n 6 --shared-prefix 32 --chunk 16 2>&1)
rc=$?
echo "$out"
[ $rc -eq 0 ] || fail "shared prefix run exited $rc"
echo "$out" | grep -q "8 requests, concurrency 4" || fail "no summary line"
echo "$out" | grep -q "; 0 errors" || fail "errors reported"
# the first request computes the two shared 16-token blocks; the other 7 take
# them from the cache (the 3 admitted beside it wait for it to publish them)
echo "$out" | grep -q "prefix cache: 224 of 320 prompt tokens hit" || fail "expected 224 of 320 prompt tokens hit"

# greedy ids of every request equal its solo run, whatever the chunking
for chunk in 1 7 64; do
    out=$("$RUN" "$FIX/models/qwen3moe/model-BF16.gguf" --backend cpu -c 3 -r 6 -p 24 -n 6 --shared-prefix 16 \
        --chunk $chunk --check 2>&1)
    [ $? -eq 0 ] && echo "$out" | grep -q "check: 6 of 6 requests identical" || fail "check, chunk $chunk: $out"
done

out=$("$RUN" "$model" --backend cpu -c 2 -r 2 -p 8 -n 4 --temperature 80 2>&1)
[ $? -eq 0 ] || fail "sampling run: $out"

for bad in "-c 0" "-p x" "--bogus" "--check --temperature 50" ""; do
    # shellcheck disable=SC2086
    if [ -z "$bad" ]; then err=$("$RUN" 2>&1); else err=$("$RUN" "$model" $bad 2>&1); fi
    rc=$?
    [ $rc -ne 0 ] || fail "'$bad' did not fail"
    [ "$(echo "$err" | wc -l)" -eq 1 ] && echo "$err" | grep -q "^sched-bench: " || fail "'$bad': $err"
done

[ $fails -eq 0 ] && echo "sched_bench: all passed"
exit $((fails > 0))
