#!/bin/bash
# Structured output on a real model: the gateway and a supervised worker
# serving the qwen3 fixture on the CPU backend, driven by the official
# openai client, the replies checked by ajv (tests/node/serve_structured.mjs).
# The tool-call checks run on qwen35 too (the qwen3_xml format).  And
# usage's reasoning_tokens on the qwen35 fixture with the real Qwen3.5
# template, which opens the reasoning in the prompt: the tokens up to its
# end marker, counted from the response's own logprobs.
# Needs tests/node/node_modules (scripts/deps.sh installs it).
. "$(dirname "$0")/lib/serve.sh"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
FIX=$(cd "${MEMRA_FIXTURES:-$ROOT/../shared/fixtures}" && pwd)
for m in openai ajv ajv-formats; do
    if [ ! -d "$ROOT/tests/node/node_modules/$m" ]; then
        echo "FAIL: tests/node/node_modules/$m is missing (run make deps)"
        exit 1
    fi
done
TMPL35=$(jq -Rs . < "$FIX/templates/Qwen3.5-4B.jinja")
cat > "$T/tmpl.json" <<J
{"listen": "127.0.0.1:@PORT@", "supervise": true, "worker_bin": "@BIN@/memra-worker",
 "models": [
  {"name": "qwen3", "path": "$FIX/models/qwen3/model-BF16.gguf", "tokenizer": "gguf", "backend": "cpu",
   "context_length": 1024, "max_running": 8, "workers": [{"listen": "ipc://@T@/s0.sock"}]},
  {"name": "qwen35", "path": "$FIX/models/qwen35/model-BF16.gguf", "tokenizer": "gguf", "backend": "cpu",
   "chat_template": $TMPL35,
   "context_length": 1024, "max_running": 4, "workers": [{"listen": "ipc://@T@/s1.sock"}]}]}
J
start_gateway "$T/tmpl.json" "$T/gw.log"
check "workers loaded" wait_ready 60
check "structured output through the openai client, checked by ajv" timeout 300 node "$ROOT/tests/node/serve_structured.mjs" "$URL" qwen3 qwen35

# reasoning_tokens: every token up to and including </think> (every token
# returned when it never comes: a stop id ends the reply without being one)
for n in 3 12 40; do
    post /v1/chat/completions "{\"model\":\"qwen35\",\"messages\":[{\"role\":\"user\",\"content\":\"Think first.\"}],\"max_tokens\":$n,\"temperature\":0,\"logprobs\":true}"
    check "qwen35, $n tokens: reasoning_tokens = tokens through </think>" jqo '
      [.choices[0].logprobs.content[].token] as $t
      | (($t | index("</think>")) // null) as $i
      | .usage.completion_tokens_details.reasoning_tokens == (if $i == null then ($t | length) else $i + 1 end)'
done
post /v1/chat/completions '{"model":"qwen3","messages":[{"role":"user","content":"x"}],"max_tokens":4,"temperature":0,"enable_thinking":false}'
check "qwen3 with thinking off: reasoning_tokens 0" jqo '.usage.completion_tokens_details.reasoning_tokens == 0'
finish
