#!/bin/bash
# Every chat template in the fixtures, rendered for every conversation of
# tests/e2e/templates-corpus.json (x add_generation_prompt x enable_thinking),
# must come out of build/bin/chat-template byte for byte as the reference
# renderer @huggingface/jinja renders it (tests/node/render.mjs).  Where the
# reference raises (a template refusing a conversation), ours must fail too.
# First, the expectations of the engine's unit cases are checked against the
# reference as well.
set -u
BIN=${MEMRA_BIN:-build/bin}
FIX=${MEMRA_FIXTURES:-../shared/fixtures}
CORPUS=tests/e2e/templates-corpus.json
if [ ! -d tests/node/node_modules/@huggingface/jinja ]; then
    echo "templates: tests/node/node_modules missing (run make deps)" >&2
    exit 1
fi
# the unit suite's expected texts are the reference's
node tests/node/render.mjs --cases tests/unit/jinja-cases.json || exit 1

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
node tests/node/render.mjs --batch "$FIX/templates" "$CORPUS" "$tmp" || exit 1
ncases=$(ls "$tmp"/ctx | wc -l)

bad=0 total_same=0 total_fail=0
for t in "$FIX"/templates/*.jinja; do
    name=$(basename "$t" .jinja)
    exp="$tmp/exp/$name" got="$tmp/got/$name"
    mkdir -p "$got"
    if ! "$BIN/chat-template" --template "$t" --batch "$tmp/ctx" "$got"; then
        echo "MISMATCH $name: chat-template --batch failed"
        bad=$((bad + 1))
        continue
    fi
    # outcomes (rendered / refused) must agree case by case ...
    (cd "$exp" && ls) | sed 's/\.err$/ refused/; s/\.txt$/ rendered/' >"$tmp/exp.list"
    (cd "$got" && ls) | sed 's/\.err$/ refused/; s/\.txt$/ rendered/' >"$tmp/got.list"
    if ! diff "$tmp/exp.list" "$tmp/got.list" >"$tmp/d"; then
        echo "MISMATCH $name: outcomes differ (< reference, > ours):"
        head -20 "$tmp/d" | sed 's/^/  /'
        for f in $(grep '^>.*refused' "$tmp/d" | awk '{print $2}' | head -5); do
            echo "  ours refused $f: $(cat "$got/$f.err")"
        done
        bad=$((bad + 1))
    fi
    # ... and every rendering must be identical
    if ! diff -rq -x '*.err' "$exp" "$got" >"$tmp/d"; then
        grep '^Files' "$tmp/d" | head -5 | while read -r _ a _ b _; do
            echo "MISMATCH $name: $(basename "$a")"
            diff "$a" "$b" | head -8 | sed 's/^/  /'
        done
        n=$(grep -c '^Files' "$tmp/d")
        [ "$n" -gt 0 ] && bad=$((bad + 1))
    fi
    nsame=$(ls "$got" | grep -c '\.txt$')
    nfail=$(ls "$got" | grep -c '\.err$')
    echo "$name: $nsame rendered, $nfail refused (of $ncases)"
    total_same=$((total_same + nsame))
    total_fail=$((total_fail + nfail))
done
echo "templates: $total_same renderings identical to the reference, $total_fail refused by both; $bad templates mismatched"
[ "$bad" -eq 0 ] && [ "$total_same" -gt 0 ]
