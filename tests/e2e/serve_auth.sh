#!/bin/bash
# Keys, tenants, admission and exposure: the keyring CLI, 401/403, metrics
# behind a key, hot reload (and a broken rewrite keeping the old keys),
# per-key / per-tenant / per-model caps answered with 429 + Retry-After,
# and a public bind without keys refusing to start.
. "$(dirname "$0")/lib/serve.sh"

KR="$T/keys.json"
K1=$("$BIN/memra-gateway" keys add --keyring "$KR" --tenant acme 2>/dev/null)
K2=$("$BIN/memra-gateway" keys add --keyring "$KR" --tenant beta --max-concurrency 1 2>/dev/null)
K3=$("$BIN/memra-gateway" keys add --keyring "$KR" --tenant gamma 2>/dev/null)
check "keys add prints a new key once" bash -c "[[ '$K1' =~ ^mk-[0-9a-f]{48}$ ]] && [ '$K1' != '$K2' ]"
check "keyring holds no plaintext" bash -c "! grep -q '${K1#mk-}' '$KR'"
check "keyring hash is the SHA-256 of the key" grep -q "$(printf '%s' "$K1" | sha256sum | cut -c1-64)" "$KR"
check "keys list" bash -c "'$BIN/memra-gateway' keys list --keyring '$KR' | grep -q beta"
ID2=$(jq -r '.keys[] | select(.tenant=="beta") | .id' "$KR")

cat > "$T/tmpl.json" <<J
{"listen": "127.0.0.1:@PORT@", "supervise": true, "worker_bin": "@BIN@/memra-worker", "keyring": "$KR",
 "retry_after_s": 3, "tenants": {"acme": {"max_concurrency": 2}},
 "models": [
  {"name": "echo", "tokenizer": "bytes", "backend": "fake", "max_running": 2, "queue_max": 1,
   "workers": [{"listen": "ipc://@T@/a0.sock"}], "worker_args": ["--fake-delay-ms", "2"]}]}
J
start_gateway "$T/tmpl.json" "$T/gw.log"
A1=(-H "authorization: Bearer $K1")
A2=(-H "authorization: Bearer $K2")
A3=(-H "authorization: Bearer $K3")
# waits (up to 10 s) until /metrics shows the line (admission state, not timing, decides the tests)
wait_metric() {
    for _ in $(seq 1 200); do
        curl -s "${A1[@]}" "$URL/metrics" | grep -qx "$1" && return 0
        sleep 0.05
    done
    echo "metric never reached: $1"; return 1
}
post /v1/completions '{"model":"echo","prompt":"hi","max_tokens":2}'
check "missing key → 401 shape" bash -c "[ $CODE = 401 ] && jq -e '.error.type == \"authentication_error\"' '$T/out' >/dev/null"
post /v1/completions '{"model":"echo","prompt":"hi","max_tokens":2}' -H "authorization: Bearer mk-000"
check "wrong key → 401" [ "$CODE" = 401 ]
post /v1/completions '{"model":"echo","prompt":"hi","max_tokens":2}' "${A1[@]}"
check "valid key → 200" bash -c "[ $CODE = 200 ] && jq -e '.choices[0].text == \"hi\"' '$T/out' >/dev/null"
check "metrics without a key → 401" [ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/metrics")" = 401 ]
check "metrics with a key → 200" [ "$(curl -s -o /dev/null -w '%{http_code}' "${A1[@]}" "$URL/metrics")" = 200 ]
check "health needs no key" [ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/health")" = 200 ]
curl -s "${A1[@]}" "$URL/metrics" > "$T/m"
check "tenant from the key in metrics" grep -q '^memra_tenant_requests_total{tenant="acme"} 1$' "$T/m"

# per-key cap (beta: 1): a second concurrent request gets 429 + Retry-After
curl -sN "${A2[@]}" "$URL/v1/completions" -d '{"model":"echo","prompt":"ab","max_tokens":400,"stream":true}' > /dev/null &
BP=$!
wait_metric 'memra_tenant_running{tenant="beta"} 1'
CODE=$(curl -s -D "$T/h" -o "$T/out" -w '%{http_code}' "${A2[@]}" "$URL/v1/completions" -d '{"model":"echo","prompt":"x","max_tokens":1}')
check "per-key cap → 429 shape" bash -c "[ $CODE = 429 ] && jq -e '.error.type == \"rate_limit_error\"' '$T/out' >/dev/null"
check "429 carries Retry-After" grep -qi '^retry-after: 3' "$T/h"
wait "$BP"

# per-model bound: 2 running + 1 queued; the 4th is shed at once with 429
P=()
for i in 1 2 3; do
    curl -sN "${A3[@]}" "$URL/v1/completions" -d '{"model":"echo","prompt":"ab","max_tokens":400,"stream":true}' > "$T/q$i" &
    P+=($!)
done
wait_metric 'memra_queue_depth{model="echo"} 1'
CODE=$(curl -s -D "$T/h" -o "$T/out" -w '%{http_code}' "${A3[@]}" "$URL/v1/completions" -d '{"model":"echo","prompt":"x","max_tokens":1}')
check "model queue full → 429 overloaded" bash -c "[ $CODE = 429 ] && jq -e '.error.message | test(\"overloaded\")' '$T/out' >/dev/null"
check "shed 429 carries Retry-After" grep -qi '^retry-after: 3' "$T/h"
wait "${P[@]}"
check "admitted requests (running and queued) all completed" bash -c "for i in 1 2 3; do grep -q '\"finish_reason\":\"length\"' '$T/q'\$i || exit 1; done"

# per-tenant cap (acme: 2)
P=()
for i in 1 2; do
    curl -sN "${A1[@]}" "$URL/v1/completions" -d '{"model":"echo","prompt":"ab","max_tokens":400,"stream":true}' > /dev/null &
    P+=($!)
done
wait_metric 'memra_tenant_running{tenant="acme"} 2'
CODE=$(curl -s -o "$T/out" -w '%{http_code}' "${A1[@]}" "$URL/v1/completions" -d '{"model":"echo","prompt":"x","max_tokens":1}')
check "tenant cap (acme: 2) → 429" bash -c "[ $CODE = 429 ] && jq -e '.error.message | test(\"tenant\")' '$T/out' >/dev/null"
wait "${P[@]}"

# disable a key: the running gateway reloads the ring
"$BIN/memra-gateway" keys disable --keyring "$KR" "$ID2"
sleep 1.2
post /v1/completions '{"model":"echo","prompt":"hi","max_tokens":2}' "${A2[@]}"
check "disabled key → 403" bash -c "[ $CODE = 403 ] && jq -e '.error.code == \"api_key_disabled\"' '$T/out' >/dev/null"
# a broken rewrite keeps the previous ring (never fails open)
echo '{"keys": [ broken' > "$KR.new" && mv "$KR.new" "$KR"
sleep 1.2
post /v1/completions '{"model":"echo","prompt":"hi","max_tokens":2}' "${A1[@]}"
check "broken keyring: old keys still work" [ "$CODE" = 200 ]
post /v1/completions '{"model":"echo","prompt":"hi","max_tokens":2}' "${A2[@]}"
check "broken keyring: disabled key stays disabled" [ "$CODE" = 403 ]
post /v1/completions '{"model":"echo","prompt":"hi","max_tokens":2}'
check "broken keyring: no key still refused" [ "$CODE" = 401 ]
kill -TERM "$GW_PID"; wait "$GW_PID"

# exposure: a public bind without keys refuses to start, saying why
cat > "$T/pub.json" <<J
{"listen": "0.0.0.0:1", "models": [{"name": "e", "tokenizer": "bytes", "workers": [{"listen": "ipc://$T/p.sock"}]}]}
J
"$BIN/memra-gateway" --config "$T/pub.json" > "$T/pub.log" 2>&1
rc=$?
check "public bind without keys refuses" bash -c "[ $rc != 0 ] && grep -q 'not a loopback address and no keyring' '$T/pub.log'"
# and a config error names the field
echo '{"models":[{"name":"e","tokenizer":"bytes","workers":[{"listen":"http://x"}]}]}' > "$T/bad.json"
"$BIN/memra-gateway" --config "$T/bad.json" > "$T/bad.log" 2>&1
check "config errors name the field" grep -q 'models\[0\].workers\[0\].listen' "$T/bad.log"
finish
