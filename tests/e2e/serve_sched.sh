#!/bin/bash
# The worker scheduler behind the real gateway (qwen3 fixture, CPU):
# - exactness: a greedy request gives the same text alone, among other
#   running requests, and with prefill chunks of 3 or 64 tokens (and the
#   transformers continuation for prompt 0);
# - isolation: the prefix cache serves a tenant's repeated prompt
#   (usage.prompt_tokens_details.cached_tokens) but never another tenant's,
#   nor the same tenant under another cache_salt; /metrics counts the hits;
# - admission: on a worker with a 256-token KV pool a request that can
#   never fit gets 429 + Retry-After at once while admitted ones (which
#   wait for each other's KV) finish.
. "$(dirname "$0")/lib/serve.sh"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
FIX=$(cd "${MEMRA_FIXTURES:-$ROOT/../shared/fixtures}" && pwd)
REF="$FIX/models/qwen3/reference.json"
M="$FIX/models/qwen3/model-BF16.gguf"
KR="$T/keys.json"
KA=$("$BIN/memra-gateway" keys add --keyring "$KR" --tenant acme 2>/dev/null)
KB=$("$BIN/memra-gateway" keys add --keyring "$KR" --tenant beta 2>/dev/null)
cat > "$T/tmpl.json" <<J
{"listen": "127.0.0.1:@PORT@", "supervise": true, "worker_bin": "@BIN@/memra-worker", "keyring": "$KR",
 "retry_after_s": 3,
 "models": [
  {"name": "c3", "path": "$M", "tokenizer": "gguf", "backend": "cpu", "context_length": 512, "max_running": 8,
   "workers": [{"listen": "ipc://@T@/c3.sock"}], "worker_args": ["--chunk", "3", "--kv-tokens", "4096"]},
  {"name": "c64", "path": "$M", "tokenizer": "gguf", "backend": "cpu", "context_length": 512, "max_running": 8,
   "workers": [{"listen": "ipc://@T@/c64.sock"}], "worker_args": ["--chunk", "64"]},
  {"name": "small", "path": "$M", "tokenizer": "gguf", "backend": "cpu", "context_length": 512, "max_running": 4,
   "queue_max": 4, "workers": [{"listen": "ipc://@T@/s.sock"}], "worker_args": ["--kv-tokens", "256", "--chunk", "16"]},
  {"name": "hyb", "path": "$FIX/models/qwen35/model-BF16.gguf", "tokenizer": "gguf", "backend": "cpu",
   "context_length": 512, "max_running": 4, "workers": [{"listen": "ipc://@T@/h.sock"}], "worker_args": ["--chunk", "16"]}]}
J
start_gateway "$T/tmpl.json" "$T/gw.log"
check "workers loaded" wait_ready 60
AA=(-H "authorization: Bearer $KA")
AB=(-H "authorization: Bearer $KB")

P0=$(jq -c '.prompts[0]' "$REF")
P1=$(jq -c '.prompts[1]' "$REF")
P2=$(jq -c '.prompts[2]' "$REF")
CONT=$(jq -c '.greedy_continuation_of_prompt0' "$REF")
post /detokenize "{\"model\":\"c3\",\"tokens\":$CONT}" "${AA[@]}"
WANT0=$(jq -r .prompt "$T/out")
text() { jq -r '.choices[0].text' "$T/out"; }
greedy() { # MODEL PROMPT_JSON [extra json fields] -> $T/out
    post /v1/completions "{\"model\":\"$1\",\"prompt\":$2,\"max_tokens\":24,\"temperature\":0${3:-}}" "${AA[@]}"
}

# ---- exactness ----
greedy c3 "$P0"
check "chunk 3: greedy = transformers continuation" [ "$(text)" = "$WANT0" ]
greedy c64 "$P0"
check "chunk 64: greedy = transformers continuation" [ "$(text)" = "$WANT0" ]
# prompt 2 (130 tokens) alone, with a salt nobody else uses (no cache hit)
greedy c64 "$P2" ',"cache_salt":"alone64"'
ALONE=$(text)
check "prompt 2 alone: 24 tokens, no cache hit" jqo '.usage.completion_tokens == 24 and .usage.prompt_tokens_details.cached_tokens == 0'
greedy c3 "$P2" ',"cache_salt":"alone3"'
check "prompt 2: chunk 3 = chunk 64" [ "$(text)" = "$ALONE" ]
# the same request while 6 sampled streams run on the same worker
BG=()
for i in 1 2 3 4 5 6; do
    curl -sN "${AA[@]}" "$URL/v1/completions" -d "{\"model\":\"c3\",\"prompt\":\"stream $i goes on\",\"max_tokens\":60,\"temperature\":0.9,\"seed\":$i,\"stream\":true}" > "$T/bg$i" &
    BG+=($!)
done
for _ in $(seq 1 100); do [ "$(grep -c '^data: {' "$T/bg1" 2>/dev/null)" -ge 3 ] && break; sleep 0.05; done
greedy c3 "$P2" ',"cache_salt":"busy"'
check "prompt 2 among 6 running streams = alone" [ "$(text)" = "$ALONE" ]
wait "${BG[@]}"
good=0
for i in 1 2 3 4 5 6; do sse_wellformed "$T/bg$i" && good=$((good + 1)); done
check "the 6 streams complete ($good/6)" [ $good = 6 ]

# ---- isolation: the prefix cache is scoped by tenant and cache_salt ----
greedy c64 "$P2" ',"cache_salt":"iso"'
check "tenant acme, first: no cache hit" jqo '.usage.prompt_tokens == 130 and .usage.prompt_tokens_details.cached_tokens == 0'
greedy c64 "$P2" ',"cache_salt":"iso"'
check "tenant acme, again: 128 of 130 prompt tokens from the cache" jqo '.usage.prompt_tokens_details.cached_tokens == 128'
check "a cache hit changes nothing in the output" [ "$(text)" = "$ALONE" ]
post /v1/completions "{\"model\":\"c64\",\"prompt\":$P2,\"max_tokens\":24,\"temperature\":0,\"cache_salt\":\"iso\"}" "${AB[@]}"
check "tenant beta, same prompt and salt: no cache hit" jqo '.usage.prompt_tokens_details.cached_tokens == 0'
check "tenant beta gets the same text" [ "$(text)" = "$ALONE" ]
greedy c64 "$P2" ',"cache_salt":"other"'
check "tenant acme, another salt: no cache hit" jqo '.usage.prompt_tokens_details.cached_tokens == 0'
# session reuse: a follow-up turn whose prompt extends the conversation
# (turn 1's prompt + its answer + more) reuses the KV of prompt and answer.
# Turn 1 is prompt 0 (7 tokens), whose greedy answer is the transformers
# continuation (24 ids): 7 + 23 tokens went through the model, one full
# block, 9 tokens of it from the answer (the prompt alone fills no block).
post /v1/completions "{\"model\":\"c64\",\"prompt\":$P0,\"max_tokens\":24,\"temperature\":0,\"user\":\"u1\",\"cache_salt\":\"conv\"}" "${AA[@]}"
check "turn 1: no cache hit" jqo '.usage.prompt_tokens_details.cached_tokens == 0'
TURN2=$(jq -cn --argjson a "$P0" --argjson b "$CONT" --argjson c "$P1" '$a + $b + $c')
post /v1/completions "{\"model\":\"c64\",\"prompt\":$TURN2,\"max_tokens\":4,\"temperature\":0,\"user\":\"u1\",\"cache_salt\":\"conv\"}" "${AA[@]}"
check "turn 2 reuses the KV of turn 1's prompt and answer (16 cached tokens)" jqo '.usage.prompt_tokens == 64 and .usage.prompt_tokens_details.cached_tokens == 16'
# metrics: the gateway's count of cached prompt tokens, and the worker's report
metric() { curl -s "${AA[@]}" "$URL/metrics" | awk -v k="$1" '$1 == k {print $2}'; }
check "metrics: cached prompt tokens counted" bash -c "[ '$(metric 'memra_cached_prompt_tokens_total{model="c64"}')' -ge 144 ]"
hits=0
for _ in $(seq 1 60); do
    hits=$(metric 'memra_prefix_cache_hit_tokens_total{model="c64",worker="0"}')
    [ "${hits:-0}" -ge 144 ] && break
    sleep 0.05
done
check "metrics: worker reports prefix-cache hits ($hits)" [ "${hits:-0}" -ge 144 ]
check "metrics: worker reports prompt tokens" bash -c "[ '$(metric 'memra_prefix_cache_prompt_tokens_total{model="c64",worker="0"}')' -ge 700 ]"
check "metrics: cache occupancy" bash -c "[ '$(metric 'memra_prefix_cache_blocks{model="c64",worker="0"}')' -ge 9 ]"
check "metrics: evictions exported" bash -c "[ -n '$(metric 'memra_prefix_cache_evictions_total{model="c64",worker="0"}')' ]"

# a hybrid model (qwen35): its cached prefix carries a checkpoint of the
# recurrent state at its last block (128 of the 130 prompt tokens)
greedy hyb "$P2" ',"cache_salt":"h"'
H1=$(text)
check "hybrid: first request, no cache hit" jqo '.usage.prompt_tokens == 130 and .usage.prompt_tokens_details.cached_tokens == 0'
greedy hyb "$P2" ',"cache_salt":"h"'
check "hybrid: the same prompt again, 128 tokens from the cache, same text" bash -c "jq -e '.usage.prompt_tokens_details.cached_tokens == 128' '$T/out' >/dev/null && [ \"\$(jq -r '.choices[0].text' '$T/out')\" = \"\$1\" ]" _ "$H1"
greedy hyb "$P2" ',"cache_salt":"other"'
check "hybrid: another salt, no cache hit, same text" bash -c "jq -e '.usage.prompt_tokens_details.cached_tokens == 0' '$T/out' >/dev/null && [ \"\$(jq -r '.choices[0].text' '$T/out')\" = \"\$1\" ]" _ "$H1"
for _ in $(seq 1 40); do [ "$(metric 'memra_worker_kv_block_tokens{model="hyb",worker="0"}')" = 16 ] && break; sleep 0.05; done
check "hybrid: worker reports a prefix cache" [ "$(metric 'memra_prefix_cache_capacity_blocks{model="hyb",worker="0"}')" -gt 0 ]

# ---- admission on a 256-token KV pool ----
for _ in $(seq 1 60); do [ "$(metric 'memra_worker_kv_total_blocks{model="small",worker="0"}')" = 16 ] && break; sleep 0.05; done
check "small worker reports 16 KV blocks of 16 tokens" [ "$(metric 'memra_worker_kv_total_blocks{model="small",worker="0"}')" = 16 ]
# two requests of 130 + 20 tokens (10 blocks each): one runs, the other waits for its KV
for i in 1 2; do
    P=$([ $i = 1 ] && echo "$P2" || jq -c '.prompts[2] | reverse' "$REF")
    curl -s "${AA[@]}" -o "$T/adm$i" -w '%{http_code}' "$URL/v1/completions" -d "{\"model\":\"small\",\"prompt\":$P,\"max_tokens\":20,\"temperature\":0}" > "$T/adm$i.code" &
    BG+=($!)
done
sleep 0.1
t0=$(date +%s%N)
post /v1/completions "{\"model\":\"small\",\"prompt\":$P2,\"max_tokens\":200,\"temperature\":0}" "${AA[@]}" -D "$T/hdr"
t1=$(date +%s%N)
check "a request whose KV never fits → 429 in under 1 s ($(( (t1 - t0) / 1000000 )) ms)" bash -c "[ $CODE = 429 ] && [ $(( (t1 - t0) / 1000000 )) -lt 1000 ]"
check "429 has Retry-After and the OpenAI error shape" bash -c "grep -qi '^retry-after: 3' '$T/hdr' && jq -e '.error.code == \"capacity\"' '$T/out' >/dev/null"
curl -sN "${AA[@]}" "$URL/v1/completions" -d "{\"model\":\"small\",\"prompt\":$P2,\"max_tokens\":300,\"stream\":true}" -o "$T/big.sse" -w '%{http_code}' > "$T/big.code"
check "the same as a stream → 429 before any event" [ "$(cat "$T/big.code")" = 429 ]
wait "${BG[@]}"
check "admitted requests finish (200, 20 tokens each)" bash -c "[ \$(cat '$T/adm1.code') = 200 ] && [ \$(cat '$T/adm2.code') = 200 ] && jq -e '.usage.completion_tokens == 20' '$T/adm1' >/dev/null && jq -e '.usage.completion_tokens == 20' '$T/adm2' >/dev/null"
post /v1/completions "{\"model\":\"c64\",\"prompt\":$P2,\"max_tokens\":20,\"temperature\":0,\"cache_salt\":\"a20\"}" "${AA[@]}"
check "admitted on the small pool = alone elsewhere" [ "$(jq -r '.choices[0].text' "$T/adm1")" = "$(text)" ]
greedy small "$P0"
check "small worker still serving, same greedy output" [ "$(text)" = "$WANT0" ]
finish
