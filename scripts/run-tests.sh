#!/bin/bash
# Runs every test: Check unit suites (ASan+UBSan builds), end-to-end scripts,
# and bounded libFuzzer runs.  Prints "N passed, N failed" last.
set -u
BUILD=${1:-build}
FIXTURES=${2:-../shared/fixtures}
FUZZ_SECONDS=${3:-30}
export MEMRA_FIXTURES="$FIXTURES"
export MEMRA_BIN="$BUILD/bin"
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export CK_FORK=yes

pass=0
fail=0
failed=()

run_one() {
    local name=$1
    shift
    echo "== $name"
    if "$@"; then
        pass=$((pass + 1))
    else
        fail=$((fail + 1))
        failed+=("$name")
        echo "!! FAILED: $name"
    fi
}

for t in "$BUILD"/tests/test_*; do
    [ -x "$t" ] || continue
    run_one "unit/$(basename "$t")" "$t"
done

for t in tests/e2e/*.sh; do
    [ -f "$t" ] || continue
    run_one "e2e/$(basename "$t" .sh)" bash "$t"
done

for f in "$BUILD"/fuzz/fuzz_*; do
    [ -x "$f" ] || continue
    name=$(basename "$f")
    corpus="$BUILD/fuzz-corpus/$name"
    mkdir -p "$corpus" "$BUILD/fuzz-artifacts"
    seeds="tests/fuzz/seeds/$name"
    run_one "fuzz/$name" bash -c "\"$f\" -max_total_time=$FUZZ_SECONDS -artifact_prefix=$BUILD/fuzz-artifacts/ -print_final_stats=0 \
        -timeout=10 -rss_limit_mb=2048 \"$corpus\" $( [ -d "$seeds" ] && echo "\"$seeds\"") \
        >\"$BUILD/fuzz-$name.log\" 2>&1 || { tail -40 \"$BUILD/fuzz-$name.log\"; exit 1; }"
done

echo
if [ "$fail" -ne 0 ]; then
    printf 'failed: %s\n' "${failed[@]}"
fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
