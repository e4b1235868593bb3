#!/bin/bash
# scripts/bench-serve.sh end to end, shrunk to the qwen3 fixture on the CPU:
# every run completes all its requests without errors, the shared-prefix run
# is served from the prefix cache when it is on and never when it is off,
# the overload run (8 clients for 2 places, no queue) gets 429s and still
# completes every request, and the table is printed.
. "$(dirname "$0")/lib/gen.sh"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
FIX=$(cd "$FIX" && pwd)
out=$(OVERLOAD=2 CONCURRENCY="1 3" PROMPT=24 GEN=4 CTX=512 MAX_RUNNING=8 SP_PROMPT=48 SP_SHARED=32 SP_C=2 SP_REQUESTS=6 \
      bash "$ROOT/scripts/bench-serve.sh" "$BIN/.." "$FIX/models/qwen3/model-BF16.gguf" cpu 2>&1)
rc=$?
echo "$out"
[ $rc -eq 0 ] || fail "bench-serve exited $rc"
json=$(echo "$out" | grep '^{')
[ "$(echo "$json" | wc -l)" -eq 6 ] || fail "expected 6 result lines"
echo "$json" | jq -e -s 'all(.completed == .requests and .errors == 0 and .output_tokens > 0)' > /dev/null ||
    fail "a run did not complete every request"
sweep_hits=$(echo "$json" | jq -s '[.[] | select(.label == "sweep") | .cached_prompt_tokens] | add')
[ "$sweep_hits" -eq 0 ] || fail "sweep points share prompts ($sweep_hits cached tokens)"
on=$(echo "$json" | jq -s '[.[] | select(.label == "shared prefix, cache on")][0].cached_prompt_tokens')
off=$(echo "$json" | jq -s '[.[] | select(.label == "shared prefix, cache off")][0].cached_prompt_tokens')
[ "${on:-0}" -ge 32 ] || fail "cache on: $on cached prompt tokens (expected at least one 32-token hit)"
[ "${off:--1}" -eq 0 ] || fail "cache off: $off cached prompt tokens (expected 0)"
refused=$(echo "$json" | jq -s '[.[] | select(.label == "overload 4x")][0].refused_429')
[ "${refused:-0}" -gt 0 ] || fail "overload: no 429 ($refused)"
echo "$out" | grep -q '^| shared prefix, cache off | 2 | 6 |' || fail "no table"
finish "bench-serve e2e"
