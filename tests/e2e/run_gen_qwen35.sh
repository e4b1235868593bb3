#!/bin/bash
# run-gen end to end on the Qwen3.5 hybrid fixtures (qwen35, qwen35moe):
# greedy ids against transformers' continuation and the logits dump of
# prompt 1 against the reference logits.
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

for m in qwen35 qwen35moe; do
    dir="$FIX/models/$m"
    model="$dir/model-BF16.gguf"
    ref="$dir/reference.json"
    p0=$(json_prompt "$ref" 0)
    want=$(json_list "$ref" greedy_continuation_of_prompt0 | tr ',' ' ')
    n_want=$(echo "$want" | wc -w)
    [ -n "$p0" ] && [ "$n_want" -gt 0 ] || { fail "$m: cannot read reference.json"; continue; }

    got=$("$RUN" "$model" --tokens "$p0" -n "$n_want" --backend cpu) || fail "$m: run-gen -n failed"
    [ "$got" = "$want" ] && echo "ok $m greedy: $got" || fail "$m greedy: got '$got' want '$want'"

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

[ "$fails" -eq 0 ] && echo "run_gen_qwen35: all passed" || echo "run_gen_qwen35: $fails failed"
[ "$fails" -eq 0 ]
