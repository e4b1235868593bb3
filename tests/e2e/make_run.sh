#!/bin/bash
# scripts/run.sh (what `make run` runs) on a free port: it prints the URL,
# becomes ready, answers a chat request, and on SIGTERM drains and exits 0
# leaving no worker behind.
. "$(dirname "$0")/lib/serve.sh"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
FIX=$(cd "${MEMRA_FIXTURES:-$ROOT/../shared/fixtures}" && pwd)
M=$FIX/models/qwen3/model-Q8_0.gguf
[ -f "$M" ] || { echo "make_run: $M missing"; exit 1; }
PORT=$((20000 + RANDOM % 30000))
URL="http://127.0.0.1:$PORT"
# an explicit MODEL keeps the test independent of conf/models/ contents
(cd "$ROOT" && MODEL=$M NAME=tiny PORT=$PORT BACKEND=cpu exec scripts/run.sh "$(dirname "$BIN")" "$FIX") > "$T/gw-run.log" 2>&1 &
RP=$!
PIDS+=("$RP")
check "ready" wait_ready 60
check "prints the URL and a curl example" bash -c "grep -q 'at $URL' '$T/gw-run.log' && grep -q 'curl $URL/v1/chat/completions' '$T/gw-run.log'"
post /v1/chat/completions '{"model":"tiny","messages":[{"role":"user","content":"Hello"}],"max_tokens":4}'
jqq() { jq -e "$@" >/dev/null; }
check "chat request answered" jqq '.choices[0].message.role == "assistant" and .usage.completion_tokens >= 1' "$T/out"
GWP=$(pgrep -P "$RP" memra-gateway | head -1)
WKS=$(pgrep -P "${GWP:-0}" | tr '\n' ' ')
check "gateway with a supervised worker" [ -n "$GWP" -a -n "$WKS" ]
kill -TERM "$RP"
rc=0
for _ in $(seq 1 200); do kill -0 "$RP" 2>/dev/null || break; sleep 0.05; done
wait "$RP" || rc=$?
check "SIGTERM: clean exit (rc=$rc)" [ "$rc" = 0 ]
sleep 0.3
check "gateway and worker gone" bash -c "! kill -0 ${GWP:-0} $WKS 2>/dev/null"
finish
