#!/bin/bash
# memra-synth from the command line: a tiny preset is written and reported,
# with the fixture tokenizer when --vocab is given; bad input exits non-zero
# with one line on stderr.
set -euo pipefail
BIN=${MEMRA_BIN:-build/bin}
FIX=${MEMRA_FIXTURES:-../shared/fixtures}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$BIN/memra-synth" --list >"$tmp/list"
grep -q '^qwen3-30b-a3b-q4km ' "$tmp/list"
# the hybrid presets, with the size they will have before writing them
grep -Eq '^qwen3\.6-35b-a3b-iq4xs +qwen35moe +IQ4_XS +17\.[0-9]+ GiB +753 tensors +40 layers \+ MTP' "$tmp/list"
grep -Eq '^qwen3\.5-9b +qwen35 +Q8_0 +9\.[0-9]+ GiB +442 tensors +32 layers \+ MTP' "$tmp/list"
out=$("$BIN/memra-synth" tiny-qwen3moe "$tmp/m.gguf" --threads 2 --seed 3)
echo "$out"
[[ "$out" == *"27 tensors"*"GB/s"* ]]
[ -s "$tmp/m.gguf" ]
"$BIN/memra-synth" tiny-qwen3 "$tmp/v.gguf" --vocab "$FIX/models/qwen3/model-Q8_0.gguf" >/dev/null
grep -q '<|im_start|>' "$tmp/v.gguf"
out=$("$BIN/memra-synth" tiny-qwen35moe "$tmp/h.gguf" --vocab "$FIX/models/qwen35moe/model-BF16.gguf")
[[ "$out" == *"96 tensors"* ]]
grep -q 'qwen35moe.ssm.time_step_rank' "$tmp/h.gguf"
grep -q 'blk.4.nextn.eh_proj.weight' "$tmp/h.gguf"
out=$("$BIN/memra-synth" tiny-qwen35 "$tmp/d.gguf" --threads 1)
[[ "$out" == *"71 tensors"* ]]
# the first of its 2 layers (27 tensors less one layer's 12), which run-gen loads
out=$("$BIN/memra-synth" tiny-qwen3moe "$tmp/m1.gguf" --layers 1)
[[ "$out" == *"15 tensors"* ]]
"$BIN/run-gen" "$tmp/m1.gguf" --tokens 1,2,3 -n 2 --backend cpu >/dev/null
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
fails tiny-qwen3 "$tmp/x.gguf" --layers 0
fails tiny-qwen3 "$tmp/x.gguf" --layers 3
fails tiny-qwen3 "$tmp/x.gguf" --layers
fails tiny-qwen35 "$tmp/x.gguf" --layers 2
[ ! -e "$tmp/x.gguf" ]
echo "synth e2e ok"
