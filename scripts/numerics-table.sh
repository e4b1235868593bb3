#!/bin/bash
# Prints a markdown table of the CPU path's error against the transformers
# float32 logits: for each qwen3/qwen3moe/qwen35/qwen35moe fixture file, the median and worst
# per-row relative L2 error over every position of prompt 2 (run-gen
# --logits-out on the CPU backend).
#   scripts/numerics-table.sh [BUILD] [FIXTURES]
set -eu
BUILD=${1:-build}
FIX=${2:-../shared/fixtures}
RUN="$BUILD/bin/run-gen"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# prompt N of reference.json's "prompts": [[...],[...],[...]] as "1,2,3"
json_prompt() {
    tr -d ' \n\t' <"$1" | sed -n 's/.*"prompts":\[\[\([]0-9,[]*\)\]\].*/\1/p' | sed 's/\],\[/\n/g' |
        sed -n "$(($2 + 1))p"
}

echo "| model | file | rows | median row error | worst row error |"
echo "|---|---|---|---|---|"
for m in qwen3 qwen3moe qwen35 qwen35moe; do
    dir="$FIX/models/$m"
    prompt=$(json_prompt "$dir/reference.json" 2)
    vocab=$(($(stat -c %s "$dir/ref-logits-2.f32") / 4 / $(echo "$prompt" | tr ',' ' ' | wc -w)))
    for q in BF16 Q8_0 Q4_K_M IQ4_XS Q4_0; do
        f="$dir/model-$q.gguf"
        [ -f "$f" ] || continue
        if ! "$RUN" "$f" --tokens "$prompt" --logits-out "$tmp/out.f32" --backend cpu >/dev/null 2>"$tmp/err"; then
            echo "| $m | $q | - | error: $(cat "$tmp/err") | |"
            continue
        fi
        paste <(od -An -v -w4 -f "$tmp/out.f32") <(od -An -v -w4 -f "$dir/ref-logits-2.f32") |
            awk -v V="$vocab" '{ d += ($1 - $2) ^ 2; s += $2 ^ 2
                                 if (NR % V == 0) { printf "%.9g\n", sqrt(d / s); d = 0; s = 0 } }' |
            sort -g | awk '{ e[++n] = $1 }
                END { med = (n % 2) ? e[(n + 1) / 2] : (e[n / 2] + e[n / 2 + 1]) / 2
                      printf "%d %.2g %.2g\n", n, med, e[n] }' >"$tmp/stats"
        read -r rows med worst <"$tmp/stats"
        echo "| $m | $q | $rows | $med | $worst |"
    done
done
