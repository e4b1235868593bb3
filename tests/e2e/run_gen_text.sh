#!/bin/bash
# run-gen with text in and out, on the fixture models:
#  - --prompt TEXT gives the ids that --tokens gives with the ids of the
#    `tokenize` program for TEXT (BOS as the model says, specials parsed);
#  - --chat MESSAGE [--system TEXT] gives the ids that --tokens gives with
#    the prompt rendered by @huggingface/jinja from the vendor's template
#    (hf/tokenizer_config.json) and tokenized by `tokenize` (specials parsed);
#  - the printed text is what @lenml/tokenizers (a port of Hugging Face
#    tokenizers) decodes from the printed ids;
#  - generation stops after an end-of-generation id: a prompt whose
#    transformers argmax (ref-logits) is <|endoftext|> gives just that id,
#    and --ignore-eos goes on;
#  - bad input: one line on stderr, a non-zero exit, nothing on stdout.
. "$(dirname "$0")/lib/gen.sh"
RUN="$BIN/run-gen"
TJ="$FIX/models/_tokenizer/tokenizer.json"

if [ ! -d tests/node/node_modules/@lenml/tokenizers ]; then
    echo "FAIL: tests/node/node_modules missing (scripts/deps.sh installs it)"
    exit 1
fi

# Keeps run-gen output file $2 for the text check at the end: its text
# lines against the reference decoding of its last line (the ids), all
# decoded by one node run.
n_text=0
text_pairs=()
text_what=()
check_text() {
    local k=$n_text
    n_text=$((n_text + 1))
    text_what[$k]=$1
    tail -n 1 "$2" >"$tmp/ids-$k"
    head -n -1 "$2" >"$tmp/got-$k"
    text_pairs+=("$tmp/ids-$k" "$tmp/want-$k")
}

texts=("Hello, world" "  naïve café: 你好 🦙 123
second line" "<|im_start|>user
What is 2+2?<|im_end|>
<|im_start|>assistant
")
for m in qwen3 qwen3moe; do
    model="$FIX/models/$m/model-BF16.gguf"
    for i in "${!texts[@]}"; do
        t=${texts[$i]}
        ids=$("$BIN/tokenize" --model "$model" --add-special --text "$t" | tr ' ' ',')
        [ -n "$ids" ] || { fail "$m text $i: tokenize gave nothing"; continue; }
        want=$("$RUN" "$model" --tokens "$ids" -n 16 --backend cpu) || { fail "$m text $i: --tokens failed"; continue; }
        [ "$i" -eq 0 ] && want0=$want
        "$RUN" "$model" --prompt "$t" -n 16 --backend cpu >"$tmp/out" || { fail "$m text $i: --prompt failed"; continue; }
        got=$(tail -n 1 "$tmp/out")
        [ "$got" = "$want" ] && echo "ok $m --prompt text $i: $got" || fail "$m --prompt text $i: got '$got' want '$want'"
        check_text "$m --prompt text $i" "$tmp/out"
    done
    # --no-print-text: the ids line alone; --print-text with --tokens: the text too
    "$RUN" "$model" --prompt "${texts[0]}" -n 16 --backend cpu --no-print-text >"$tmp/ids"
    [ "$(wc -l <"$tmp/ids")" -eq 1 ] && [ "$(cat "$tmp/ids")" = "$want0" ] ||
        fail "$m --no-print-text: '$(head -c 200 "$tmp/ids")' want '$want0'"
    p0=$(tr -d ' \n\t' <"$FIX/models/$m/reference.json" | sed -n 's/.*"prompts":\[\[\([0-9,]*\)\].*/\1/p')
    "$RUN" "$model" --tokens "$p0" -n 24 --backend cpu --print-text >"$tmp/out" || fail "$m --tokens --print-text failed"
    check_text "$m --tokens --print-text" "$tmp/out"
done

# --chat against the reference renderer: the same conversation rendered by
# @huggingface/jinja with the template the model was converted from.
for m in qwen3 qwen3moe; do
    model="$FIX/models/$m/model-BF16.gguf"
    for sys in "" "You are a terse assistant. Réponds en français."; do
        user="What is 2+2? Think 🤔 step by step."
        node -e '
            const fs = require("fs");
            const [cfgPath, dir, sys, user] = process.argv.slice(1);
            const cfg = JSON.parse(fs.readFileSync(cfgPath, "utf8"));
            const messages = [];
            if (sys !== "") messages.push({ role: "system", content: sys });
            messages.push({ role: "user", content: user });
            fs.writeFileSync(dir + "/chat.jinja", cfg.chat_template);
            fs.writeFileSync(dir + "/chat.json", JSON.stringify({
                messages, add_generation_prompt: true,
                bos_token: cfg.bos_token ?? "", eos_token: cfg.eos_token ?? "" }));' \
            "$FIX/models/$m/hf/tokenizer_config.json" "$tmp" "$sys" "$user"
        what="$m --chat${sys:+ --system}"
        if ! node tests/node/render.mjs "$tmp/chat.jinja" "$tmp/chat.json" >"$tmp/chat.txt"; then
            fail "$what: the reference renderer failed"
            continue
        fi
        ids=$("$BIN/tokenize" --model "$model" --file "$tmp/chat.txt" | tr ' ' ',')
        want=$("$RUN" "$model" --tokens "$ids" -n 16 --backend cpu) || { fail "$what: --tokens failed"; continue; }
        if [ -n "$sys" ]; then
            "$RUN" "$model" --chat "$user" --system "$sys" -n 16 --backend cpu >"$tmp/out"
        else
            "$RUN" "$model" --chat "$user" -n 16 --backend cpu >"$tmp/out"
        fi || { fail "$what failed"; continue; }
        got=$(tail -n 1 "$tmp/out")
        [ "$got" = "$want" ] && echo "ok $what: $got" || fail "$what: got '$got' want '$want'"
        check_text "$what" "$tmp/out"
    done
done

if node tests/node/detok-ref.mjs "$TJ" "${text_pairs[@]}"; then
    for ((k = 0; k < n_text; k++)); do
        if cmp -s "$tmp/want-$k" "$tmp/got-$k"; then
            echo "ok ${text_what[$k]}: text = @lenml/tokenizers"
        else
            fail "${text_what[$k]}: text differs from @lenml/tokenizers: got '$(head -c 200 "$tmp/got-$k")' want '$(head -c 200 "$tmp/want-$k")'"
        fi
    done
else
    fail "the reference decoder failed"
fi

# End of generation.  Prompt 2 of qwen3 cut after position 88, where the
# transformers logits pick <|endoftext|> by a wide margin.
model="$FIX/models/qwen3/model-BF16.gguf"
ref="$FIX/models/qwen3/reference.json"
p2=$(tr -d ' \n\t' <"$ref" | sed -n 's/.*"prompts":\[\[[0-9,]*\],\[[0-9,]*\],\[\([0-9,]*\)\]\].*/\1/p')
cut=$(echo "$p2" | cut -d, -f1-89)
ref_next=$(od -An -v -w4 -f -j $((88 * 1024 * 4)) -N $((1024 * 4)) "$FIX/models/qwen3/ref-logits-2.f32" |
    awk 'NR == 1 || $1 > b { b = $1; i = NR - 1 } END { print i }')
eot=$("$BIN/tokenize" --model "$model" --text "<|endoftext|>")
if [ "$ref_next" != "$eot" ]; then
    fail "eog: expected the reference argmax $ref_next to be <|endoftext|> ($eot)"
else
    got=$("$RUN" "$model" --tokens "$cut" -n 8 --backend cpu)
    [ "$got" = "$eot" ] && echo "ok stops at <|endoftext|>: $got" || fail "eog: got '$got' want '$eot'"
    got=$("$RUN" "$model" --tokens "$cut" -n 8 --backend cpu --print-text)
    [ "$got" = "$eot" ] || fail "eog --print-text: got '$got' want just '$eot'"
    got=$("$RUN" "$model" --tokens "$cut" -n 8 --backend cpu --ignore-eos)
    [ "$(echo "$got" | wc -w)" -eq 8 ] && [ "${got%% *}" = "$eot" ] && echo "ok --ignore-eos: $got" ||
        fail "--ignore-eos: got '$got'"
fi

# Bad input: a non-zero exit and exactly one line on stderr, nothing on stdout.
expect_error "--tokens with --prompt" "$RUN" "$model" --tokens 1,2 --prompt hi --backend cpu
expect_error "empty --prompt" "$RUN" "$model" --prompt "" --backend cpu
expect_error "--chat with --prompt" "$RUN" "$model" --chat hi --prompt hi --backend cpu
expect_error "--system without --chat" "$RUN" "$model" --prompt hi --system "be nice" --backend cpu
# the same file with the template key renamed: no chat template; then a
# template broken at the same length: a parse error with its position
LC_ALL=C sed 's/tokenizer\.chat_template/tokenizer.chat_templatX/' "$model" >"$tmp/notmpl.gguf"
expect_error "--chat without a chat template" "$RUN" "$tmp/notmpl.gguf" --chat hi --backend cpu
grep -q "no chat template" "$tmp/err" || fail "no chat template: message '$(cat "$tmp/err")'"
LC_ALL=C sed 's/{%- if tools %}/{%- if tools }}/' "$model" >"$tmp/badtmpl.gguf"
expect_error "--chat with a broken template" "$RUN" "$tmp/badtmpl.gguf" --chat hi --backend cpu
grep -q "line 1" "$tmp/err" || fail "broken template: message '$(cat "$tmp/err")'"
"$RUN" "$tmp/notmpl.gguf" --prompt hi -n 2 --backend cpu >/dev/null || fail "--prompt needs no chat template"
# the same file with its token list renamed (same length): no tokenizer
LC_ALL=C sed 's/tokenizer\.ggml\.tokens/tokenizer.ggml.tokenz/' "$model" >"$tmp/notok.gguf"
expect_error "--prompt without tokenizer" "$RUN" "$tmp/notok.gguf" --prompt hi --backend cpu
grep -q "no usable tokenizer" "$tmp/err" || fail "no tokenizer: message '$(cat "$tmp/err")'"
expect_error "--chat without tokenizer" "$RUN" "$tmp/notok.gguf" --chat hi --backend cpu
expect_error "--print-text without tokenizer" "$RUN" "$tmp/notok.gguf" --tokens 1,2 --print-text --backend cpu
# ids in, ids out still works there
got=$("$RUN" "$tmp/notok.gguf" --tokens 1,2,3 -n 4 --backend cpu) &&
    [ "$got" = "$("$RUN" "$model" --tokens 1,2,3 -n 4 --backend cpu)" ] || fail "--tokens without tokenizer: '$got'"

finish run_gen_text
