# Helpers for the run-gen / run-spec end-to-end tests (sourced, not run):
# fixture paths, a scratch folder removed on exit, a failure count, reading
# prompts and the greedy continuation out of reference.json, and the check
# that bad input gives one stderr line and a non-zero exit.
set -u
BIN=${MEMRA_BIN:-build/bin}
FIX=${MEMRA_FIXTURES:-../shared/fixtures}
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

# ref_model M: sets dir, model (its BF16 file), ref (reference.json), p0
# (prompt 0 as "1,2,3"), want (the greedy continuation of prompt 0, space
# separated) and n_want; fails and returns 1 when reference.json gives none.
ref_model() {
    dir="$FIX/models/$1"
    model="$dir/model-BF16.gguf"
    ref="$dir/reference.json"
    p0=$(json_prompt "$ref" 0)
    want=$(json_list "$ref" greedy_continuation_of_prompt0 | tr ',' ' ')
    n_want=$(echo "$want" | wc -w)
    [ -n "$p0" ] && [ "$n_want" -gt 0 ] || { fail "$1: cannot read reference.json"; return 1; }
}

# check_logits_prompt1 M [K]: after ref_model M, run-gen's --logits-out of
# prompt 1 has n x 1024 floats and every row is within relative L2 1e-3 of
# transformers' (ref-logits-1.f32).  With K, the prompt is the first K ids
# and the rest go in by --feed, a decode step each (their rows follow).
check_logits_prompt1() {
    local m=$1 k=${2:-} p1 n1 out size worst how=""
    p1=$(json_prompt "$ref" 1)
    n1=$(echo "$p1" | tr ',' ' ' | wc -w)
    out="$tmp/$m.f32"
    local args=(--tokens "$p1")
    if [ -n "$k" ]; then
        args=(--tokens "$(echo "$p1" | cut -d, -f1-"$k")" --feed "$(echo "$p1" | cut -d, -f$((k + 1))-)")
        how=" ($k prompt ids, $((n1 - k)) fed)"
    fi
    "$BIN/run-gen" "$model" "${args[@]}" --logits-out "$out" --backend cpu >/dev/null ||
        fail "$m: --logits-out$how failed"
    size=$(stat -c %s "$out" 2>/dev/null || echo 0)
    [ "$size" -eq $((n1 * 1024 * 4)) ] || fail "$m logits: $size bytes, want $((n1 * 1024 * 4))"
    worst=$(paste <(od -An -v -w4 -f "$out") <(od -An -v -w4 -f "$dir/ref-logits-1.f32") | awk -v V=1024 '
        { d += ($1 - $2) ^ 2; s += $2 ^ 2; if (NR % V == 0) { e = sqrt(d / s); if (e > w) w = e; d = 0; s = 0 } }
        END { printf "%.3g", w }')
    awk -v w="$worst" 'BEGIN { exit !(w < 1e-3) }' && echo "ok $m logits$how: worst row error $worst" ||
        fail "$m logits$how: worst row relative L2 error $worst"
}

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

# finish NAME: the summary line, and the exit status of the script.
finish() {
    [ "$fails" -eq 0 ] && echo "$1: all passed" || echo "$1: $fails failed"
    [ "$fails" -eq 0 ]
}
