#!/bin/bash
# run-gen end to end on the fixtures: greedy ids against transformers'
# continuation, the logits dump against the reference logits, and one clear
# stderr line with a non-zero exit for each kind of bad input.
set -u
BIN=${MEMRA_BIN:-build/bin}
FIX=${MEMRA_FIXTURES:-../shared/fixtures}
RUN="$BIN/run-gen"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# "key": [1, 2, 3] of reference.json as "1,2,3" (whitespace-insensitive).
json_list() { tr -d ' \n\t' <"$1" | sed -n "s/.*\"$2\":\[\([0-9,]*\)\].*/\1/p"; }
# prompt N of "prompts": [[...],[...],[...]]
json_prompt() {
    tr -d ' \n\t' <"$1" | sed -n 's/.*"prompts":\[\[\([]0-9,[]*\)\]\].*/\1/p' | sed 's/\],\[/\n/g' |
        sed -n "$(($2 + 1))p"
}

for m in qwen3 qwen3moe; do
    dir="$FIX/models/$m"
    model="$dir/model-BF16.gguf"
    ref="$dir/reference.json"
    p0=$(json_prompt "$ref" 0)
    want=$(json_list "$ref" greedy_continuation_of_prompt0 | tr ',' ' ')
    n_want=$(echo "$want" | wc -w)
    [ -n "$p0" ] && [ "$n_want" -gt 0 ] || { fail "$m: cannot read reference.json"; continue; }

    got=$("$RUN" "$model" --tokens "$p0" -n "$n_want" --backend cpu) || fail "$m: run-gen -n failed"
    [ "$got" = "$want" ] && echo "ok $m greedy: $got" || fail "$m greedy: got '$got' want '$want'"
    # without a GPU, the default backend (auto) is the CPU one and must give the same ids
    if ! command -v nvidia-smi >/dev/null 2>&1; then
        got=$("$RUN" "$model" --tokens "$p0" -n "$n_want") || fail "$m: run-gen --backend auto failed"
        [ "$got" = "$want" ] || fail "$m greedy (auto backend): got '$got' want '$want'"
    fi

    # logits of prompt 1: size, then every row within relative L2 1e-3 of transformers
    p1=$(json_prompt "$ref" 1)
    n1=$(echo "$p1" | tr ',' ' ' | wc -w)
    out="$tmp/$m.f32"
    "$RUN" "$model" --tokens "$p1" --logits-out "$out" --backend cpu >/dev/null || fail "$m: --logits-out failed"
    size=$(stat -c %s "$out" 2>/dev/null || echo 0)
    [ "$size" -eq $((n1 * 1024 * 4)) ] || fail "$m logits: $size bytes, want $((n1 * 1024 * 4))"
    worst=$(paste <(od -An -v -w4 -f "$out") <(od -An -v -w4 -f "$dir/ref-logits-1.f32") | awk -v V=1024 '
        { d += ($1 - $2) ^ 2; s += $2 ^ 2; if (NR % V == 0) { e = sqrt(d / s); if (e > w) w = e; d = 0; s = 0 } }
        END { printf "%.3g", w }')
    awk -v w="$worst" 'BEGIN { exit !(w < 1e-3) }' && echo "ok $m logits: worst row error $worst" ||
        fail "$m logits: worst row relative L2 error $worst"
done

# Bad input: a non-zero exit and exactly one line on stderr, nothing on stdout.
expect_error() {
    local what=$1
    shift
    "$@" >"$tmp/out" 2>"$tmp/err"
    local rc=$?
    local lines
    lines=$(wc -l <"$tmp/err")
    if [ "$rc" -eq 0 ] || [ "$lines" -ne 1 ] || [ -s "$tmp/out" ]; then
        fail "$what: rc=$rc, $lines stderr lines: $(head -c 300 "$tmp/err")"
    else
        echo "ok $what: $(cat "$tmp/err")"
    fi
}

model="$FIX/models/qwen3/model-BF16.gguf"
expect_error "missing file" "$RUN" "$tmp/nope.gguf" --tokens 1,2,3 -n 2 --backend cpu
head -c 100 "$model" >"$tmp/trunc-header.gguf"
expect_error "truncated header" "$RUN" "$tmp/trunc-header.gguf" --tokens 1,2,3 -n 2 --backend cpu
head -c $(($(stat -c %s "$model") / 2)) "$model" >"$tmp/trunc-data.gguf"
expect_error "truncated data" "$RUN" "$tmp/trunc-data.gguf" --tokens 1,2,3 -n 2 --backend cpu
# same length, so the file stays a valid GGUF with an architecture nobody knows
LC_ALL=C sed 's/qwen3/qwex9/g' "$model" >"$tmp/arch.gguf"
expect_error "unknown architecture" "$RUN" "$tmp/arch.gguf" --tokens 1,2,3 -n 2 --backend cpu
grep -q "unknown architecture 'qwex9'" "$tmp/err" || fail "unknown architecture: message '$(cat "$tmp/err")'"
expect_error "token out of range" "$RUN" "$model" --tokens 1,1024,3 -n 2 --backend cpu
expect_error "negative token" "$RUN" "$model" --tokens 1,-2 -n 2 --backend cpu
for bad in "" "1,,2" "1,2," "a" "1;2" "99999999999"; do
    expect_error "malformed --tokens '$bad'" "$RUN" "$model" --tokens "$bad" -n 2 --backend cpu
done
expect_error "no --tokens" "$RUN" "$model" -n 2
expect_error "bad -n" "$RUN" "$model" --tokens 1 -n x
expect_error "unknown backend" "$RUN" "$model" --tokens 1 --backend tpu
expect_error "unwritable logits file" "$RUN" "$model" --tokens 1 --logits-out "$tmp/no/such/dir/x.f32" --backend cpu

[ "$fails" -eq 0 ] && echo "run_gen: all passed" || echo "run_gen: $fails failed"
[ "$fails" -eq 0 ]
