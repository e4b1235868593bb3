#!/bin/bash
# Decode speed of settings against each other (a benchmark, not a test):
# bench-model's tg (medians of RUNS runs) for each SETTING in turn, ROUNDS
# times, the order reversed every other round so that neither side always
# runs first on a card that warms or throttles.  A SETTING is a list of
# environment assignments ("MEMRA_CUDA_L2PF=2 MEMRA_CUDA_L2PF_MB=12"), or
# "-" for the defaults.  Prints each run's tok/s, then a table: per setting
# the rounds, their mean and the mean's change against the first setting.
#
# Usage: scripts/ab-decode.sh BUILD MODEL SETTING [SETTING ...]
# Environment: ROUNDS (2), RUNS (3), TG (128), DEPTH (0), BACKEND (cuda).
# Example: scripts/ab-decode.sh build 8b.gguf - MEMRA_CUDA_L2PF=1 MEMRA_CUDA_L2PF=2
set -u
usage="usage: scripts/ab-decode.sh BUILD MODEL SETTING [SETTING ...]"
BUILD=${1:?$usage}
MODEL=${2:?$usage}
shift 2
[ $# -ge 1 ] || { echo "$usage" >&2; exit 2; }
SETTINGS=("$@")
ROUNDS=${ROUNDS:-2}
RUNS=${RUNS:-3}
TG=${TG:-128}
DEPTH=${DEPTH:-0}
BACKEND=${BACKEND:-cuda}
BENCH="$BUILD/bin/bench-model"
[ -x "$BENCH" ] || { echo "ab-decode: no $BENCH" >&2; exit 2; }
[ -f "$MODEL" ] || { echo "ab-decode: no model $MODEL" >&2; exit 2; }
for s in "${SETTINGS[@]}"; do
    [ "$s" = - ] && continue
    for kv in $s; do
        [[ "$kv" =~ ^[A-Za-z_][A-Za-z0-9_]*=.*$ ]] ||
            { echo "ab-decode: '$kv' of setting '$s' is not NAME=VALUE" >&2; exit 2; }
    done
done
T=$(mktemp -d /tmp/memra-ab-decode.XXXXXX)
trap 'rm -rf "$T"' EXIT

# one run of setting $1: prints tok/s
one() {
    local -a envs=()
    [ "$1" != - ] && read -r -a envs <<< "$1"
    env "${envs[@]}" "$BENCH" "$MODEL" --backend "$BACKEND" --runs "$RUNS" --pp 0 --tg "$TG" --depth "$DEPTH" \
        > "$T/out" 2> "$T/err" || { echo "ab-decode: bench-model failed ($1):" >&2; tail -3 "$T/err" >&2; return 1; }
    local v
    v=$(sed -n "s/^median of .*, tg$TG[^0-9]* \([0-9.]*\) tok\/s.*/\1/p" "$T/out" | tail -1)
    [ -n "$v" ] || { echo "ab-decode: no median line ($1)" >&2; return 1; }
    echo "$v"
}

echo "== ab-decode: $MODEL, tg$TG at depth $DEPTH on $BACKEND, medians of $RUNS, $ROUNDS rounds, $(date -u '+%Y-%m-%d %H:%M UTC')"
n=${#SETTINGS[@]}
declare -A got
for ((r = 0; r < ROUNDS; r++)); do
    for ((k = 0; k < n; k++)); do
        i=$k
        [ $((r % 2)) = 1 ] && i=$((n - 1 - k))
        v=$(one "${SETTINGS[$i]}") || exit 1
        got[$i,$r]=$v
        echo "round $((r + 1)) ${SETTINGS[$i]}: $v tok/s"
    done
done
echo "| setting | tok/s by round | mean | against the first |"
echo "|---|---|---|---|"
for ((i = 0; i < n; i++)); do
    row=""
    for ((r = 0; r < ROUNDS; r++)); do row="$row ${got[$i,$r]}"; done
    first=""
    for ((r = 0; r < ROUNDS; r++)); do first="$first ${got[0,$r]}"; done
    awk -v s="${SETTINGS[$i]}" -v row="$row" -v first="$first" -v i="$i" 'BEGIN {
        n = split(row, a, " "); split(first, b, " ")
        m = 0; f = 0; list = ""
        for (k = 1; k <= n; k++) { m += a[k]; f += b[k]; list = list (k > 1 ? " / " : "") a[k] }
        m /= n; f /= n
        printf "| %s | %s | %.1f | %s |\n", (s == "-" ? "defaults" : s), list, m,
               (i == 0 ? "-" : sprintf("%+.1f%%", 100 * (m / f - 1)))
    }'
done
