#!/bin/bash
# Without "supervise": workers are started on their own (as systemd's
# memra-worker@N.service does, from the same config) and the gateway
# connects, notices a dead worker, and reconnects when it is back.  Also
# checks the unit files with systemd-analyze verify.
. "$(dirname "$0")/lib/serve.sh"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)

if command -v systemd-analyze >/dev/null; then
    mkdir -p "$T/units"
    for f in memra-gateway.service memra-worker@.service; do
        sed "s|/usr/local/bin/|$BIN/|" "$ROOT/conf/$f" > "$T/units/$f"
    done
    cp "$T/units/memra-worker@.service" "$T/units/memra-worker@0.service"
    check "unit files pass systemd-analyze verify" \
        systemd-analyze verify "$T/units/memra-gateway.service" "$T/units/memra-worker@0.service"
else
    echo "skip: systemd-analyze not installed"
fi
check "example config parses" bash -c "'$BIN/memra-worker' --config '$ROOT/conf/memra.json' --instance 5 2>&1 | grep -q 'has no worker number 5'"

cat > "$T/tmpl.json" <<'J'
{"listen": "127.0.0.1:@PORT@", "supervise": false,
 "models": [{"name": "echo", "tokenizer": "bytes", "backend": "fake",
   "workers": [{"listen": "ipc://@T@/s0.sock"}], "worker_args": ["--fake-delay-ms", "3"]}]}
J
# the worker reads the same config the gateway does
PORT=0; sed "s|@T@|$T|g; s|@PORT@|1|g" "$T/tmpl.json" > "$T/wconf.json"
"$BIN/memra-worker" --config "$T/wconf.json" --instance 0 > "$T/w.log" 2>&1 &
W=$!; PIDS+=("$W")
start_gateway "$T/tmpl.json" "$T/gw.log"
post /v1/completions '{"model":"echo","prompt":"sys","max_tokens":4}'
check "served by a separately started worker" jqo '.choices[0].text == "syss"'
curl -sN "$URL/v1/completions" -d '{"model":"echo","prompt":"abc","max_tokens":3000,"stream":true}' > "$T/k" &
KP=$!
for _ in $(seq 1 200); do [ "$(grep -c '^data: {' "$T/k" 2>/dev/null)" -ge 1 ] && break; sleep 0.05; done
kill -9 "$W"
wait "$KP"
check "stream on the killed worker ends with an error event" bash -c "grep '^data: {' '$T/k' | tail -1 | grep -q worker_lost && tail -2 '$T/k' | grep -q DONE"
check "readyz 503 without a worker" [ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/readyz")" = 503 ]
post /v1/completions '{"model":"echo","prompt":"x","max_tokens":2}'
check "no live worker → 503 shape" bash -c "[ $CODE = 503 ] && jq -e '.error.code == \"worker_unavailable\"' '$T/out' >/dev/null"
"$BIN/memra-worker" --config "$T/wconf.json" --instance 0 > "$T/w2.log" 2>&1 &
PIDS+=($!)
check "gateway reconnects to the restarted worker" wait_ready 10
post /v1/completions '{"model":"echo","prompt":"again","max_tokens":5}'
check "served again" jqo '.choices[0].text == "again"'
finish
