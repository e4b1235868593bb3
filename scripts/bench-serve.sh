#!/bin/bash
# Serving benchmark (a benchmark, not a test): the real gateway with one
# worker for MODEL, driven by tests/node/bench-serve.mjs.
#   1. concurrency sweep: PROMPT-token prompts (512), GEN output tokens (128),
#      C in CONCURRENCY ("1 4 16 64 256"), 2C requests (at least 8) per point;
#   2. the shared-prefix shape: SP_PROMPT-token prompts (4860) of which
#      SP_SHARED (4096) are shared, C = SP_C (16), SP_REQUESTS (64) requests,
#      with the prefix cache on, then again on a fresh worker with it off;
#   3. with OVERLOAD=N (a concurrency the worker can hold: its max_running is
#      set to N and the gateway queue to OVERLOAD_QUEUE, default 0): N clients,
#      then 4N clients, 4N requests each time: admitted requests' TTFT p99 at
#      4x against the capacity point, and how fast the others get 429.
# One JSON line per run (see bench-serve.mjs), then a table.  Needs node
# (18 or later) and nothing else beside the build.
#
# Usage: scripts/bench-serve.sh BUILD MODEL [BACKEND]      (BACKEND: auto)
# Environment: CONCURRENCY, PROMPT, GEN, VOCAB (1000: prompt ids are drawn
# below it), CTX (8192), MAX_RUNNING (256), QUEUE_MAX (1024), SP_PROMPT,
# SP_SHARED, SP_C, SP_REQUESTS, SHARED_PREFIX (1; 0 skips part 2),
# WORKER_ARGS (extra worker flags, e.g. "--chunk 512").
set -u
BUILD=${1:?usage: scripts/bench-serve.sh BUILD MODEL [BACKEND]}
MODEL=${2:?usage: scripts/bench-serve.sh BUILD MODEL [BACKEND]}
BACKEND=${3:-auto}
CONCURRENCY=${CONCURRENCY:-1 4 16 64 256}
PROMPT=${PROMPT:-512}
GEN=${GEN:-128}
VOCAB=${VOCAB:-1000}
CTX=${CTX:-8192}
MAX_RUNNING=${MAX_RUNNING:-256}
QUEUE_MAX=${QUEUE_MAX:-1024}
SP_PROMPT=${SP_PROMPT:-4860}
SP_SHARED=${SP_SHARED:-4096}
SP_C=${SP_C:-16}
SP_REQUESTS=${SP_REQUESTS:-64}
SHARED_PREFIX=${SHARED_PREFIX:-1}
OVERLOAD=${OVERLOAD:-0}
OVERLOAD_QUEUE=${OVERLOAD_QUEUE:-0}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=$(cd "$BUILD/bin" && pwd)
MODEL=$(cd "$(dirname "$MODEL")" && pwd)/$(basename "$MODEL")
DRIVER="$ROOT/tests/node/bench-serve.mjs"
T=$(mktemp -d /tmp/memra-bench-serve.XXXXXX)
GW=
stop() {
    [ -n "$GW" ] && kill -TERM "$GW" 2>/dev/null && wait "$GW" 2>/dev/null
    GW=
}
trap 'stop; rm -rf "$T"' EXIT

# start EXTRA_WORKER_ARGS...: a gateway on a free port with one worker
start() {
    local extra="" a
    for a in $WORKER_ARGS_ALL "$@"; do extra="$extra, \"$a\""; done
    extra=${extra#, }
    PORT=$((20000 + RANDOM % 30000))
    cat > "$T/conf.json" <<J
{"listen": "127.0.0.1:$PORT", "supervise": true, "worker_bin": "$BIN/memra-worker", "retry_after_s": 1,
 "tenants": {"*": {"max_concurrency": 4096}},
 "models": [{"name": "bench", "path": "$MODEL", "tokenizer": "gguf", "backend": "$BACKEND",
   "context_length": $CTX, "max_running": $MAX_RUNNING, "queue_max": $QUEUE_MAX,
   "workers": [{"device": 0, "listen": "ipc://$T/w.sock"}], "worker_args": [$extra]}]}
J
    "$BIN/memra-gateway" --config "$T/conf.json" > "$T/gw.log" 2>&1 &
    GW=$!
    URL="http://127.0.0.1:$PORT"
    for _ in $(seq 1 1200); do
        node -e 'fetch(process.argv[1]).then(r => process.exit(r.status === 200 ? 0 : 1), () => process.exit(1))' \
            "$URL/readyz" && return 0
        kill -0 "$GW" 2>/dev/null || break
        sleep 0.1
    done
    echo "bench-serve: the gateway did not get ready:" >&2
    tail -20 "$T/gw.log" >&2
    exit 1
}

RUN_SEED=0
run() { # label, then driver flags; each sweep point gets its own prompts (no
        # prefix-cache hits from an earlier run), the shared-prefix runs
        # the same ones (cache on and off compare like with like)
    local label=$1; shift
    case "$label" in shared*) seed=1000 ;; *) RUN_SEED=$((RUN_SEED + 1)); seed=$RUN_SEED ;; esac
    node "$DRIVER" "$URL" bench --vocab "$VOCAB" --seed "$seed" --label "$label" "$@" | tee -a "$T/results.jsonl"
}

WORKER_ARGS_ALL=${WORKER_ARGS:-}
echo "== bench-serve: $MODEL, backend $BACKEND, $(date -u '+%Y-%m-%d %H:%M UTC')"
start
for c in $CONCURRENCY; do
    r=$((2 * c)); [ $r -lt 8 ] && r=8
    run "sweep" -c "$c" -r "$r" -p "$PROMPT" -n "$GEN" || echo "bench-serve: sweep c=$c had errors" >&2
done
if [ "$SHARED_PREFIX" = 1 ]; then
    run "shared prefix, cache on" -c "$SP_C" -r "$SP_REQUESTS" -p "$SP_PROMPT" -n "$GEN" --shared "$SP_SHARED"
    stop
    start --prefix-blocks -1
    run "shared prefix, cache off" -c "$SP_C" -r "$SP_REQUESTS" -p "$SP_PROMPT" -n "$GEN" --shared "$SP_SHARED"
fi
if [ "$OVERLOAD" -gt 0 ]; then
    stop
    MAX_RUNNING=$OVERLOAD QUEUE_MAX=$OVERLOAD_QUEUE start
    run "capacity" -c "$OVERLOAD" -r $((4 * OVERLOAD)) -p "$PROMPT" -n "$GEN"
    run "overload 4x" -c $((4 * OVERLOAD)) -r $((4 * OVERLOAD)) -p "$PROMPT" -n "$GEN"
fi
stop
echo
node -e '
const rows = require("fs").readFileSync(process.argv[1], "utf8").trim().split("\n").map(JSON.parse);
console.log("| run | C | done | 429 (p99 s) | out tok/s | req/s | TTFT p50 / p99 s | ITL p50 / p99 ms | latency p50 / p99 s | cached / prompt tokens |");
console.log("|---|---|---|---|---|---|---|---|---|---|");
const ms = (v) => v === null ? "-" : (1000 * v).toFixed(1);
for (const r of rows)
  console.log(`| ${r.label} | ${r.c} | ${r.completed} | ${r.refused_429}${r.refused_p99 === null ? "" : ` (${r.refused_p99})`} | ${r.output_tok_s} | ${r.req_s} | ` +
              `${r.ttft_p50} / ${r.ttft_p99} | ${ms(r.itl_p50)} / ${ms(r.itl_p99)} | ${r.latency_p50} / ${r.latency_p99} | ` +
              `${r.cached_prompt_tokens} / ${r.prompt_tokens} |`);
' "$T/results.jsonl"
