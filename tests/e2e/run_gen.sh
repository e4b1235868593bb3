#!/bin/bash
# run-gen end to end on the fixtures: greedy ids against transformers'
# continuation, the logits dump against the reference logits, and one clear
# stderr line with a non-zero exit for each kind of bad input.
. "$(dirname "$0")/lib/gen.sh"
RUN="$BIN/run-gen"

for m in qwen3 qwen3moe; do
    ref_model "$m" || continue

    got=$("$RUN" "$model" --tokens "$p0" -n "$n_want" --backend cpu) || fail "$m: run-gen -n failed"
    [ "$got" = "$want" ] && echo "ok $m greedy: $got" || fail "$m greedy: got '$got' want '$want'"
    # without a GPU, the default backend (auto) is the CPU one and must give the same ids
    if ! command -v nvidia-smi >/dev/null 2>&1; then
        got=$("$RUN" "$model" --tokens "$p0" -n "$n_want") || fail "$m: run-gen --backend auto failed"
        [ "$got" = "$want" ] || fail "$m greedy (auto backend): got '$got' want '$want'"
    fi

    # logits of prompt 1: size, then every row within relative L2 1e-3 of transformers
    check_logits_prompt1 "$m"
    # the same rows with all but the first 3 ids run as decode steps (--feed)
    check_logits_prompt1 "$m" 3
    # and greedy after fed ids: prompt 0's first 2 ids, the rest fed, then
    # the continuation transformers gave for the whole prompt
    k0=$(echo "$p0" | cut -d, -f1-2) f0=$(echo "$p0" | cut -d, -f3-)
    got=$("$RUN" "$model" --tokens "$k0" --feed "$f0" -n "$n_want" --backend cpu) || fail "$m: run-gen --feed -n failed"
    [ "$got" = "$want" ] && echo "ok $m greedy after fed ids" || fail "$m greedy after fed ids: got '$got' want '$want'"
done

# --router-out: the prompt call's router logits, float32 [layers][tokens][experts]
# (2 layers, 4 experts in the qwen3moe fixture), all finite; a token's rows
# depend on the tokens up to it only, so prompt 1 and prompt 1 with its last
# token changed agree on every row but the last one's, and differ there
if ref_model qwen3moe; then
    fails0=$fails
    p1=$(json_prompt "$ref" 1)
    n1=$(echo "$p1" | tr ',' ' ' | wc -w)
    p1b="${p1%,*},$(((${p1##*,} + 1) % 1024))"
    for v in a b; do
        pp=$p1; [ $v = b ] && pp=$p1b
        "$RUN" "$model" --tokens "$pp" --logits-out "$tmp/l.f32" --router-out "$tmp/r$v.f32" --backend cpu >/dev/null ||
            fail "qwen3moe: --router-out failed"
    done
    row=$((4 * 4)) size=$(stat -c %s "$tmp/ra.f32" 2>/dev/null || echo 0)
    [ "$size" -eq $((2 * n1 * row)) ] || fail "qwen3moe router dump: $size bytes, want $((2 * n1 * row))"
    od -An -v -f "$tmp/ra.f32" | tr -s ' ' '\n' | grep -qiE 'nan|inf' && fail "qwen3moe router dump: not finite"
    for l in 0 1; do
        off=$((l * n1 * row)) keep=$(((n1 - 1) * row))
        cmp -s <(tail -c +$((off + 1)) "$tmp/ra.f32" | head -c $keep) <(tail -c +$((off + 1)) "$tmp/rb.f32" | head -c $keep) ||
            fail "qwen3moe router dump: layer $l rows before the changed token differ"
        cmp -s <(tail -c +$((off + keep + 1)) "$tmp/ra.f32" | head -c $row) \
            <(tail -c +$((off + keep + 1)) "$tmp/rb.f32" | head -c $row) &&
            fail "qwen3moe router dump: layer $l row of the changed token unchanged"
    done
    [ "$fails" -eq "$fails0" ] && echo "ok qwen3moe router dump: 2 layers x $n1 tokens x 4 experts, causal rows"
    # with --feed the dump goes on through the fed ids: the prompt's
    # [layers][k][experts], then each fed id's [layers][1][experts]; the
    # same rows as prompt 1 run whole, put in that order (relative L2 1e-4)
    fails0=$fails k=$((n1 - 3))
    "$RUN" "$model" --tokens "$(echo "$p1" | cut -d, -f1-$k)" --feed "$(echo "$p1" | cut -d, -f$((k + 1))-)" \
        --router-out "$tmp/rf.f32" --backend cpu >/dev/null || fail "qwen3moe: --router-out with --feed failed"
    : >"$tmp/rw.f32"
    for l in 0 1; do tail -c +$((l * n1 * row + 1)) "$tmp/ra.f32" | head -c $((k * row)) >>"$tmp/rw.f32"; done
    for t in $(seq $k $((n1 - 1))); do
        for l in 0 1; do tail -c +$(((l * n1 + t) * row + 1)) "$tmp/ra.f32" | head -c $row >>"$tmp/rw.f32"; done
    done
    size=$(stat -c %s "$tmp/rf.f32" 2>/dev/null || echo 0)
    [ "$size" -eq $((2 * n1 * row)) ] || fail "qwen3moe router dump with --feed: $size bytes, want $((2 * n1 * row))"
    worst=$(paste <(od -An -v -w4 -f "$tmp/rf.f32") <(od -An -v -w4 -f "$tmp/rw.f32") | awk '
        { d += ($1 - $2) ^ 2; s += $2 ^ 2; if (NR % 4 == 0) { e = sqrt(d / s); if (e > w) w = e; d = 0; s = 0 } }
        END { printf "%.3g", w + 0 }')
    awk -v w="$worst" 'BEGIN { exit !(w < 1e-4) }' || fail "qwen3moe router dump with --feed: worst row $worst"
    [ "$fails" -eq "$fails0" ] && echo "ok qwen3moe router dump with 3 fed ids: prompt then fed rows, worst row $worst"
fi
"$RUN" "$FIX/models/qwen3/model-BF16.gguf" --tokens 1,2,3 --logits-out "$tmp/l.f32" --router-out "$tmp/rd.f32" \
    --backend cpu >/dev/null || fail "qwen3: --router-out failed"
[ -f "$tmp/rd.f32" ] && [ ! -s "$tmp/rd.f32" ] && echo "ok qwen3 router dump: empty (dense)" ||
    fail "qwen3 router dump: not an empty file"
expect_error "unwritable router file" "$RUN" "$FIX/models/qwen3moe/model-BF16.gguf" --tokens 1 --router-out \
    "$tmp/no/such/dir/r.f32" --backend cpu

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
for bad in "" "1,,2" "x" "1,1024"; do
    expect_error "malformed --feed '$bad'" "$RUN" "$model" --tokens 1,2 --feed "$bad" -n 2 --backend cpu
done
expect_error "no --tokens" "$RUN" "$model" -n 2
expect_error "bad -n" "$RUN" "$model" --tokens 1 -n x
expect_error "unknown backend" "$RUN" "$model" --tokens 1 --backend tpu
expect_error "unknown K/V type" "$RUN" "$model" --tokens 1 --kv-dtype f64 --backend cpu
expect_error "float16 K/V on the CPU backend" "$RUN" "$model" --tokens 1 --kv-dtype f16 --backend cpu
grep -q "float32 only" "$tmp/err" || fail "float16 K/V on the CPU backend: message '$(cat "$tmp/err")'"
out=$("$RUN" "$model" --tokens 1,2,3 -n 4 --kv-dtype f32 --backend cpu) || fail "--kv-dtype f32: run-gen failed"
[ "$out" = "$("$RUN" "$model" --tokens 1,2,3 -n 4 --backend cpu)" ] || fail "--kv-dtype f32 is not the default's output"
expect_error "unwritable logits file" "$RUN" "$model" --tokens 1 --logits-out "$tmp/no/such/dir/x.f32" --backend cpu

finish run_gen
