#!/bin/bash
# run-gen end to end on the Qwen3.5 hybrid fixtures (qwen35, qwen35moe):
# greedy ids against transformers' continuation and the logits dump of
# prompt 1 against the reference logits, whole and with all but its first 3
# ids fed as decode steps (the recurrent state's one-token path).
. "$(dirname "$0")/lib/gen.sh"
RUN="$BIN/run-gen"

for m in qwen35 qwen35moe; do
    ref_model "$m" || continue

    got=$("$RUN" "$model" --tokens "$p0" -n "$n_want" --backend cpu) || fail "$m: run-gen -n failed"
    [ "$got" = "$want" ] && echo "ok $m greedy: $got" || fail "$m greedy: got '$got' want '$want'"

    check_logits_prompt1 "$m"
    check_logits_prompt1 "$m" 3
done

finish run_gen_qwen35
