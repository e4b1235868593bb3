#!/bin/bash
# memra-synth from the command line: a tiny preset is written and reported,
# with the fixture tokenizer when --vocab is given; bad input exits non-zero
# with one line on stderr.
set -euo pipefail
BIN=${MEMRA_BIN:-build/bin}
FIX=${MEMRA_FIXTURES:-../shared/fixtures}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$BIN/memra-synth" --list | grep -q '^qwen3-30b-a3b-q4km '
out=$("$BIN/memra-synth" tiny-qwen3moe "$tmp/m.gguf" --threads 2 --seed 3)
echo "$out"
[[ "$out" == *"27 tensors"*"GB/s"* ]]
[ -s "$tmp/m.gguf" ]
"$BIN/memra-synth" tiny-qwen3 "$tmp/v.gguf" --vocab "$FIX/models/qwen3/model-Q8_0.gguf" >/dev/null
grep -q '<|im_start|>' "$tmp/v.gguf"
ls "$tmp" | grep -q tmp && { echo "temporary file left behind"; exit 1; }

fails() {
    if "$BIN/memra-synth" "$@" 2>"$tmp/err"; then
        echo "accepted: $*"
        exit 1
    fi
    [ "$(wc -l <"$tmp/err")" -ge 1 ]
    grep -q '^memra-synth: ' "$tmp/err" || grep -q '^usage' "$tmp/err"
}
fails no-such-preset "$tmp/x.gguf"
fails tiny-qwen3 "$tmp/x.gguf" --threads many
fails tiny-qwen3 "$tmp/x.gguf" --vocab "$tmp/missing.gguf"
fails tiny-qwen3 "$tmp/x.gguf" --vocab "$FIX/vocab/qwen3-vocab.gguf"
fails tiny-qwen3 "$tmp/no/such/dir/x.gguf"
fails tiny-qwen3
[ ! -e "$tmp/x.gguf" ]
echo "synth e2e ok"
