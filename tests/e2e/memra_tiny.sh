#!/bin/bash
# memra-tiny: the packer (memra-pack-tiny) on a small random model in the
# trainer's shard format, loaded and run by run-gen; its refusals of bad
# input; and, once conf/models/memra-tiny.gguf is committed, a greedy chat
# answer from it on the CPU that must read as English.
set -u
BIN=${MEMRA_BIN:-build/bin}
FIX=${MEMRA_FIXTURES:-../shared/fixtures}
VOCAB="$FIX/models/qwen3/model-BF16.gguf"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# A 2-layer model in the trainer's layout: index.json + float16 shards of at
# most 64 KiB (so several shards are read back to back), random weights made
# as half-float bit patterns (perl-base is part of every Debian system):
# matrices +-[2^-4, 2^-2), norm weights [1, 2).
mkdir -p "$tmp/w"
perl - "$tmp/w" <<'EOF' || fail "cannot write the random shards"
use strict;
my $out = shift;
srand(7);
my ($E, $Q, $KV, $H, $F, $V) = (64, 128, 64, 32, 96, 1024);
my @t = (["token_embd.weight", $V, $E]);
for my $i (0, 1) {
    my $p = "blk.$i.";
    push @t, ["${p}attn_norm.weight", 0, $E], ["${p}attn_q.weight", $Q, $E],
        ["${p}attn_k.weight", $KV, $E], ["${p}attn_v.weight", $KV, $E],
        ["${p}attn_output.weight", $E, $Q], ["${p}attn_q_norm.weight", 0, $H],
        ["${p}attn_k_norm.weight", 0, $H], ["${p}ffn_norm.weight", 0, $E],
        ["${p}ffn_gate.weight", $F, $E], ["${p}ffn_up.weight", $F, $E],
        ["${p}ffn_down.weight", $E, $F];
}
push @t, ["output_norm.weight", 0, $E], ["output.weight", $V, $E];
my ($blob, @json) = ("");
for my $x (@t) {
    my ($name, $r, $c) = @$x;
    my $n = ($r || 1) * $c;
    my $shape = $r ? "[$r, $c]" : "[$c]";
    push @json, sprintf('{"name": "%s", "shape": %s, "offset": %d, "nbytes": %d}',
                        $name, $shape, length($blob), 2 * $n);
    for (1 .. $n) {
        my $bits = $r ? (int(rand(2)) << 15) | ((11 + int(rand(2))) << 10) | int(rand(1024))
                      : (15 << 10) | int(rand(1024));
        $blob .= pack("v", $bits);
    }
}
my @shards;
for (my $o = 0; $o < length($blob); $o += 65536) {
    my $nm = sprintf("shard-%02d.bin", scalar @shards);
    open(my $f, ">:raw", "$out/$nm") or die;
    print $f substr($blob, $o, 65536);
    close $f;
    push @shards, "\"$nm\"";
}
open(my $j, ">", "$out/index.json") or die;
printf $j '{"config": {"n_vocab": %d, "n_embd": %d, "n_layer": 2, "n_head": 4, "n_head_kv": 2, '
    . '"head_dim": %d, "n_ff": %d, "n_ctx": 256, "rope_theta": 1000000.0, "rms_eps": 1e-06}, '
    . '"dtype": "f16", "total_bytes": %d, "shards": [%s], "tensors": [%s]}' . "\n",
    $V, $E, $H, $F, length($blob), join(", ", @shards), join(", ", @json);
close $j;
EOF

prompt=$("$BIN/tokenize" --model "$VOCAB" --text "<|im_start|>user
Tell me about Debian.<|im_end|>
<|im_start|>assistant
" | tr ' ' ',')
[ -n "$prompt" ] || fail "cannot tokenize the chat prompt"
for t in f32 q8_0 bf16; do
    if "$BIN/memra-pack-tiny" "$tmp/w" "$VOCAB" "$tmp/m-$t.gguf" --type "$t" 2>"$tmp/err"; then
        ids=$("$BIN/run-gen" "$tmp/m-$t.gguf" --tokens "$prompt" -n 8 --backend cpu) ||
            fail "run-gen cannot run the packed $t model"
        n=$(echo "$ids" | wc -w)
        bad=$(echo "$ids" | tr ' ' '\n' | awk '$1 < 0 || $1 >= 1024' | wc -l)
        [ "$n" -ge 1 ] && [ "$bad" -eq 0 ] && echo "ok packed $t model generates: $ids" ||
            fail "packed $t model: ids '$ids'"
        [ "$t" = f32 ] && ids_f32=$ids
        [ "$t" = bf16 ] && ids_bf16=$ids
    else
        fail "memra-pack-tiny --type $t: $(cat "$tmp/err")"
    fi
done
# The tokenizer metadata (and with it the chat template) travels unchanged.
tpl_a=$("$BIN/chat-template" --model "$VOCAB" --print-template 2>&1)
tpl_b=$("$BIN/chat-template" --model "$tmp/m-f32.gguf" --print-template 2>&1)
[ -n "$tpl_a" ] && [ "$tpl_a" = "$tpl_b" ] && echo "ok chat template copied" ||
    fail "chat template differs after packing"
# f16 weights are exact in f32, so the f32 pack must decode like the shards:
# greedy ids of the f32 and bf16 packs may differ only after a near-tie;
# require the first id to agree (bf16 keeps 8 bits of mantissa).
[ "${ids_f32%% *}" = "${ids_bf16%% *}" ] && echo "ok f32 and bf16 packs agree on the first id" ||
    fail "f32 and bf16 packs disagree: '${ids_f32:-}' vs '${ids_bf16:-}'"

# Refusals: one clear line and exit 1 each.
refuse() { # name, sed expression applied to index.json
    mkdir -p "$tmp/bad"
    cp "$tmp"/w/* "$tmp/bad/"
    sed -i "$2" "$tmp/bad/index.json"
    if "$BIN/memra-pack-tiny" "$tmp/bad" "$VOCAB" "$tmp/bad.gguf" 2>"$tmp/err"; then
        fail "$1: accepted"
    elif [ "$(wc -l <"$tmp/err")" -ne 1 ]; then
        fail "$1: expected one line on stderr, got: $(cat "$tmp/err")"
    else
        echo "ok refuses $1: $(cat "$tmp/err")"
    fi
    rm -rf "$tmp/bad"
}
refuse "a wrong shape" 's/"shape": \[1024, 64\]/"shape": [1000, 64]/'
refuse "a wrong vocabulary size" 's/"n_vocab": 1024/"n_vocab": 1000/'
refuse "an unknown tensor" 's/"output.weight"/"lm_head.weight"/'
refuse "a short shard list" 's/"shard-00.bin", //'
refuse "a shard path" 's/"shard-00.bin"/"..\/shard-00.bin"/'
refuse "a bad dtype" 's/"dtype": "f16"/"dtype": "f32"/'
refuse "broken JSON" 's/{/[/'

# The committed model: a greedy answer on the CPU that reads as English.
MODEL=conf/models/memra-tiny.gguf
if [ -f "$MODEL" ]; then
    p=$("$BIN/tokenize" --model "$MODEL" --text "<|im_start|>user
Tell me about the Debian project.<|im_end|>
<|im_start|>assistant
<think>

</think>

" | tr ' ' ',')
    ids=$("$BIN/run-gen" "$MODEL" --tokens "$p" -n 48 --backend cpu) || fail "run-gen $MODEL"
    text=$("$BIN/tokenize" --model "$MODEL" --ids "$ids")
    echo "memra-tiny says: $text"
    letters=$(printf '%s' "$text" | tr -cd 'A-Za-z ' | wc -c)
    total=$(printf '%s' "$text" | wc -c)
    common=$(printf '%s' "$text" | tr 'A-Z' 'a-z' | tr -cs 'a-z' '\n' |
        grep -cxE 'the|a|an|of|to|and|is|in|it|for|that|on|with|as|this|are|be|by|or|can|from')
    [ "$total" -ge 40 ] && [ $((letters * 100)) -ge $((total * 85)) ] && [ "$common" -ge 4 ] &&
        echo "ok memra-tiny answers in English ($letters/$total letters or spaces, $common common words)" ||
        fail "memra-tiny answer does not read as English: '$text'"
else
    echo "skip: $MODEL is not committed yet (see docs/MEMRA-TINY.md)"
fi

[ "$fails" -eq 0 ] || { echo "$fails failure(s)"; exit 1; }
echo "memra_tiny: all ok"
