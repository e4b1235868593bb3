#!/bin/bash
# Tokenizer against references no one here wrote:
#  1. every upstream vocabulary test (ggml-vocab-*.gguf with .inp/.out) and the
#     Qwen3 vocabulary (ids from Hugging Face tokenizers): the ids printed by
#     `tokenize --ggml-vocab-test` equal the .out file (upstream's .out put a
#     space before each id; only that is normalized);
#  2. the fixture models' tokenizer: ids equal to those of @lenml/tokenizers
#     (a port of Hugging Face tokenizers) loading its tokenizer.json, over all
#     test strings;
#  3. the --text / --ids command-line round trip.
set -u
BIN=${MEMRA_BIN:-build/bin}
FIX=${MEMRA_FIXTURES:-../shared/fixtures}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fail=0
checked=0

for inp in "$FIX"/vocab/*.gguf.inp; do
    model=${inp%.inp}
    out=$model.out
    [ -f "$out" ] || continue
    name=$(basename "$model")
    if ! "$BIN/tokenize" --model "$model" --ggml-vocab-test "$inp" > "$TMP/got" 2> "$TMP/err"; then
        echo "FAIL $name: $(head -c 300 "$TMP/err")"
        fail=1
        continue
    fi
    if ! diff <(sed 's/^ //' "$out") "$TMP/got" > "$TMP/diff"; then
        echo "FAIL $name: ids differ from $(basename "$out") (expected <, got >):"
        head -c 1500 "$TMP/diff"
        echo
        fail=1
        continue
    fi
    echo "ok   $name ($(wc -l < "$out") strings)"
    checked=$((checked + 1))
done
if [ "$checked" -lt 10 ]; then
    echo "FAIL: only $checked vocabularies checked (fixtures missing?)"
    fail=1
fi

# The models' tokenizer beside its tokenizer.json through @lenml/tokenizers.
# The real Qwen2/Qwen3 tokenizers normalize to NFC and so does our qwen2
# pre-tokenizer; this small fixture tokenizer has no normalizer, so the
# reference runs with NFC added.
TJ="$FIX/models/_tokenizer/tokenizer.json"
if [ ! -d tests/node/node_modules/@lenml/tokenizers ]; then
    echo "FAIL: tests/node/node_modules missing (scripts/deps.sh installs it)"
    fail=1
else
    mkdir -p "$TMP/tj"
    node -e '
        const fs = require("fs");
        const j = JSON.parse(fs.readFileSync(process.argv[1], "utf8"));
        if (j.normalizer === null) j.normalizer = { type: "NFC" };
        fs.writeFileSync(process.argv[2] + "/tokenizer.json", JSON.stringify(j));
        fs.copyFileSync(process.argv[1].replace(/tokenizer\.json$/, "tokenizer_config.json"),
                        process.argv[2] + "/tokenizer_config.json");' "$TJ" "$TMP/tj"
    cat "$FIX"/vocab/*.inp > "$TMP/all.inp"
    for m in qwen3 gemma3; do
        gguf=$(ls "$FIX/models/$m"/model-*.gguf 2>/dev/null | head -1)
        [ -n "$gguf" ] || continue
        if ! "$BIN/tokenize" --model "$gguf" --ggml-vocab-test "$TMP/all.inp" > "$TMP/ours" 2> "$TMP/err"; then
            echo "FAIL $m tokenizer: $(head -c 300 "$TMP/err")"
            fail=1
            continue
        fi
        node tests/node/tokenize-ref.mjs "$TMP/tj/tokenizer.json" "$TMP/all.inp" > "$TMP/ref"
        if ! diff "$TMP/ref" "$TMP/ours" > "$TMP/diff"; then
            echo "FAIL $m tokenizer ($(basename "$gguf")) differs from @lenml/tokenizers:"
            head -c 1500 "$TMP/diff"
            fail=1
        else
            echo "ok   $m tokenizer = @lenml/tokenizers ($(wc -l < "$TMP/ref") strings)"
        fi
    done
fi

# Command line: text -> ids -> text
V="$FIX/vocab/qwen3-vocab.gguf"
text='Hello, world! 你好 🦙 <|im_start|>'
ids=$("$BIN/tokenize" --model "$V" --text "$text")
back=$("$BIN/tokenize" --model "$V" --ids "$ids")
if [ "$back" != "$text" ]; then
    echo "FAIL --text/--ids round trip: '$text' -> '$ids' -> '$back'"
    fail=1
fi
if "$BIN/tokenize" --model "$V" --ids "1 2 999999999" > /dev/null 2>&1; then
    echo "FAIL --ids accepted an id out of range"
    fail=1
fi
if "$BIN/tokenize" --model "$FIX/vocab/ggml-vocab-gpt-2.gguf.inp" --text x > /dev/null 2>&1; then
    echo "FAIL a non-GGUF model file was accepted"
    fail=1
fi
exit $fail
