#!/bin/bash
# Builds memra-tiny in three steps (docs/MEMRA-TINY.md):
#
#   scripts/memra-tiny.sh data DIR      training text -> DIR/tokens.u16, plus the
#                                       trainer, sample prompts and tokenizer.json
#   (on a GPU machine, in DIR)          python3 train-memra-tiny.py --data tokens.u16 \
#                                         --out OUT --vocab tokenizer.json \
#                                         --prompts prompts.json --minutes 4.5 --compile
#   scripts/memra-tiny.sh pack OUT [GGUF]
#                                       shards -> GGUF (default conf/models/memra-tiny.gguf)
#
# The data step needs the Debian package debian-handbook (only for
# retraining; nothing else in the build or tests uses it) and build/bin.
set -euo pipefail
BIN=${MEMRA_BIN:-build/bin}
FIX=${MEMRA_FIXTURES:-../shared/fixtures}
VOCAB="$FIX/models/qwen3/model-BF16.gguf"
HANDBOOK=/usr/share/doc/debian-handbook/html/en-US

case "${1:-}" in
data)
    dir=${2:?usage: memra-tiny.sh data DIR}
    [ -d "$HANDBOOK" ] || { echo "install debian-handbook first (apt-get install debian-handbook)" >&2; exit 1; }
    mkdir -p "$dir"
    python3 scripts/memra-tiny-data.py "$HANDBOOK" >"$dir/chats.txt"
    # our tokenizer, control tokens (<|im_start|> ...) parsed as such
    "$BIN/tokenize" --model "$VOCAB" --file "$dir/chats.txt" >"$dir/ids.txt"
    python3 - "$dir/ids.txt" "$dir/tokens.u16" <<'EOF'
import array, sys
ids = array.array("H", (int(x) for x in open(sys.argv[1]).read().split()))
if sys.byteorder != "little":
    ids.byteswap()
open(sys.argv[2], "wb").write(ids.tobytes())
print("tokens:", len(ids))
EOF
    # greedy samples printed after training: chat prompts as run-gen gets them
    {
        printf '['
        sep=
        for q in "Tell me about the Debian project." "What is APT?" "Explain the Debian package system." \
            "Tell me about network configuration."; do
            ids=$("$BIN/tokenize" --model "$VOCAB" --text "<|im_start|>user
$q<|im_end|>
<|im_start|>assistant
<think>

</think>

" | tr ' ' ',')
            printf '%s[%s]' "$sep" "$ids"
            sep=,
        done
        printf ']\n'
    } >"$dir/prompts.json"
    cp scripts/train-memra-tiny.py "$dir/"
    cp "$FIX/models/_tokenizer/tokenizer.json" "$dir/"
    rm -f "$dir/ids.txt"
    ls -l "$dir"
    ;;
pack)
    out=${2:?usage: memra-tiny.sh pack OUT [GGUF]}
    gguf=${3:-conf/models/memra-tiny.gguf}
    mkdir -p "$(dirname "$gguf")"
    "$BIN/memra-pack-tiny" "$out" "$VOCAB" "$gguf" --type q8_0
    ls -l "$gguf"
    ;;
*)
    sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'
    exit 1
    ;;
esac
