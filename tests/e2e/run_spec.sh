#!/bin/bash
# run-spec end to end on the hybrid fixtures: for k = 1..8 (qwen35; 1, 4, 8
# for qwen35moe) the ids on its last line equal transformers' greedy
# continuation (what run-gen prints), and bad arguments give one stderr line
# and a non-zero exit; memra-synth's tiny hybrids give run-gen's ids too.
. "$(dirname "$0")/lib/gen.sh"
RUN="$BIN/run-spec"

for m in qwen35 qwen35moe; do
    ref_model "$m" || continue
    ks="1 2 3 4 5 6 7 8"
    [ "$m" = qwen35 ] || ks="1 4 8" # every k on one model keeps the script short
    for k in $ks; do
        out=$("$RUN" "$model" --tokens "$p0" -n "$n_want" --k "$k" --backend cpu) ||
            { fail "$m k=$k: run-spec failed"; continue; }
        got=$(echo "$out" | tail -1)
        [ "$got" = "$want" ] && echo "ok $m k=$k: $(echo "$out" | head -1)" ||
            fail "$m k=$k: got '$got' want '$want'"
    done
done

# synthetic hybrids (memra-synth: quantized, the real tensor layout, random
# weights) give run-gen's ids with speculation too
for p in tiny-qwen35 tiny-qwen35moe; do
    "$BIN/memra-synth" "$p" "$tmp/$p.gguf" --threads 1 >/dev/null || { fail "$p: memra-synth failed"; continue; }
    want=$("$BIN/run-gen" "$tmp/$p.gguf" --tokens 1,2,3,4,5 -n 12 --backend cpu) || fail "$p: run-gen failed"
    got=$("$RUN" "$tmp/$p.gguf" --tokens 1,2,3,4,5 -n 12 --k 4 --backend cpu | tail -1) || fail "$p: run-spec failed"
    [ -n "$want" ] && [ "$got" = "$want" ] && echo "ok $p: run-spec = run-gen: $got" ||
        fail "$p: run-spec '$got', run-gen '$want'"
    rm -f "$tmp/$p.gguf"
done

model="$FIX/models/qwen35/model-BF16.gguf"
expect_error "k = 0" "$RUN" "$model" --tokens 1,2 -n 2 --k 0 --backend cpu
expect_error "k = 9" "$RUN" "$model" --tokens 1,2 -n 2 --k 9 --backend cpu
expect_error "no MTP block" "$RUN" "$FIX/models/qwen3/model-BF16.gguf" --tokens 1,2 -n 2 --k 2 --backend cpu
expect_error "token out of range" "$RUN" "$model" --tokens 1,1024 -n 2 --backend cpu
expect_error "no --tokens" "$RUN" "$model" -n 2

finish run_spec
