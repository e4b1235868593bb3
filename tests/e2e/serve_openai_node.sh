#!/bin/bash
# The official `openai` npm client against the gateway (fake echo worker):
# chat and completions, blocking and streaming, usage, stop, seed, logprobs,
# errors.  Needs tests/node/node_modules (scripts/deps.sh installs it).
. "$(dirname "$0")/lib/serve.sh"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
if [ ! -d "$ROOT/tests/node/node_modules/openai" ]; then
    echo "FAIL: tests/node/node_modules/openai is missing (run make deps)"
    exit 1
fi
cat > "$T/tmpl.json" <<'J'
{"listen": "127.0.0.1:@PORT@", "supervise": true, "worker_bin": "@BIN@/memra-worker",
 "models": [{"name": "echo", "tokenizer": "bytes", "backend": "fake",
   "workers": [{"listen": "ipc://@T@/n0.sock"}], "worker_args": ["--fake-delay-ms", "1"]}]}
J
start_gateway "$T/tmpl.json" "$T/gw.log"
check "openai npm client" timeout 60 node "$ROOT/tests/node/serve_openai.mjs" "$URL" echo
finish
