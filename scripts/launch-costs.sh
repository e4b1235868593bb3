#!/bin/bash
# What each kind of launch costs inside a decode step's graph (a benchmark,
# not a test; needs a CUDA device).  For each PATTERN, tg with
# MEMRA_CUDA_TWICE=PATTERN (every launch whose first op matches runs twice:
# timing only, the results are wrong; the syntax is cu_autograph.cu's
# twice_parse, NAME[@ROWS[xCOLS]][/OPS]) against the plain step, the two
# alternating (base, pattern, base, pattern, ..., base), so that a pattern's
# extra time a token, against the mean of the bases either side of it, is
# that launch's cost with its overlap.  A lower bound for products whose
# weights fit in L2: the second copy finds them there.
#
# Usage: scripts/launch-costs.sh BUILD MODEL [PATTERN ...]
#   default patterns: one a kind of op (add_rmsnorm qk_norm_rope_kv attention
#   matmul matmul_id moe_route moe_combine argmax); shapes pick one launch,
#   e.g. for the 8B matmul@4096/3 (q/k/v), matmul@4096x4096/1 (o),
#   matmul@12288/3 (gate/up + SwiGLU), matmul@4096x12288/1 (down).
# Environment: RUNS (3: medians of that many runs), TG (128), DEPTH (0).
# Prints a table: base and pattern ms a token, the difference, launches a
# token (those made twice inside graph captures over the captures: each
# capture is one decode step) and us each.
set -u
BUILD=${1:?usage: scripts/launch-costs.sh BUILD MODEL [PATTERN ...]}
MODEL=${2:?usage: scripts/launch-costs.sh BUILD MODEL [PATTERN ...]}
shift 2
PATTERNS=("$@")
[ ${#PATTERNS[@]} -eq 0 ] &&
    PATTERNS=(add_rmsnorm qk_norm_rope_kv attention matmul matmul_id moe_route moe_combine argmax)
RUNS=${RUNS:-3}
TG=${TG:-128}
DEPTH=${DEPTH:-0}
BENCH="$BUILD/bin/bench-model"
[ -x "$BENCH" ] || { echo "launch-costs: no $BENCH" >&2; exit 2; }
T=$(mktemp -d /tmp/memra-launch-costs.XXXXXX)
trap 'rm -rf "$T"' EXIT

# one run: prints "MS_A_TOKEN LAUNCHES_A_TOKEN" (launches 0 for the base)
one() {
    local out="$T/out" err="$T/err"
    if [ -n "$1" ]; then
        MEMRA_CUDA_TWICE="$1" "$BENCH" "$MODEL" --backend cuda --runs "$RUNS" --pp 0 --tg "$TG" --depth "$DEPTH" \
            > "$out" 2> "$err"
    else
        env -u MEMRA_CUDA_TWICE "$BENCH" "$MODEL" --backend cuda --runs "$RUNS" --pp 0 --tg "$TG" --depth "$DEPTH" \
            > "$out" 2> "$err"
    fi || { echo "launch-costs: bench-model failed (${1:-base}):" >&2; tail -3 "$err" >&2; return 1; }
    local ms twice caps
    ms=$(sed -n 's/.*(\([0-9.]*\) ms\/token).*/\1/p' "$out" | tail -1)
    twice=$(sed -n 's/^MEMRA_CUDA_TWICE: [0-9]* launches made twice, \([0-9]*\) of them in [0-9]* graph.*/\1/p' "$err" | tail -1)
    caps=$(sed -n 's/^MEMRA_CUDA_TWICE: .* of them in \([0-9]*\) graph captures.*/\1/p' "$err" | tail -1)
    [ -n "$ms" ] || { echo "launch-costs: no ms/token line (${1:-base})" >&2; return 1; }
    awk -v t="${twice:-0}" -v c="${caps:-0}" -v ms="$ms" \
        'BEGIN { printf "%s %.1f\n", ms, (c > 0 ? t / c : 0) }'
}

echo "== launch costs: $MODEL, tg$TG at depth $DEPTH, medians of $RUNS, $(date -u '+%Y-%m-%d %H:%M UTC')"
read -r prev _ < <(one "") || exit 1
echo "| pattern | base ms a token | with it | more | launches a token | us each |"
echo "|---|---|---|---|---|---|"
for p in "${PATTERNS[@]}"; do
    read -r with n < <(one "$p") || exit 1
    read -r next _ < <(one "") || exit 1
    awk -v p="$p" -v a="$prev" -v b="$next" -v w="$with" -v n="$n" 'BEGIN {
        base = (a + b) / 2; more = w - base
        printf "| %s | %.3f | %.3f | %+.3f | %s | %s |\n", p, base, w, more, n,
               (n > 0 ? sprintf("%.1f", 1000 * more / n) : "-")
    }'
    prev=$next
done
