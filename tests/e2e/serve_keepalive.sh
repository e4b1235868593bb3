#!/bin/bash
# A stream that sends nothing for stream_keepalive_ms (a long prefill, a
# wait in the queue) gets SSE comment lines, so that clients and proxies
# with an idle timeout keep the connection; clients skip them, so the
# stream's events and text are what they would be without them.  The fake
# engine takes 600 ms a step here; the keep-alive is 200 ms.
. "$(dirname "$0")/lib/serve.sh"

conf() { # KEEPALIVE_MS
    cat > "$T/tmpl.json" <<J
{"listen": "127.0.0.1:@PORT@", "supervise": true, "worker_bin": "@BIN@/memra-worker",
 "stream_keepalive_ms": $1,
 "models": [{"name": "echo", "tokenizer": "bytes", "backend": "fake", "context_length": 4096,
   "workers": [{"listen": "ipc://@T@/w$1.sock"}], "worker_args": ["--fake-delay-ms", "600"]}]}
J
}
stream() { # FILE
    curl -sN "$URL/v1/completions" -d '{"model":"echo","prompt":"ab","max_tokens":3,"stream":true}' > "$1"
}

conf 200
start_gateway "$T/tmpl.json" "$T/gw1.log"
check "ready" wait_ready 5
stream "$T/k1"
check "keep-alive comments while the steps take 600 ms" [ "$(grep -c '^: keep-alive$' "$T/k1")" -ge 2 ]
check "the stream stays well formed" sse_wellformed "$T/k1"
check "its text is unchanged" [ "$(sse_text "$T/k1")" = "aba" ]
post /v1/completions '{"model":"echo","prompt":"ab","max_tokens":3}'
check "a blocking response has no comments" jqo '.choices[0].text == "aba"'
kill -TERM "$GW_PID"; wait "$GW_PID" 2>/dev/null

conf 0
start_gateway "$T/tmpl.json" "$T/gw2.log"
check "ready (keep-alive off)" wait_ready 5
stream "$T/k2"
check "no keep-alive comments when off" [ "$(grep -c '^: keep-alive$' "$T/k2")" -eq 0 ]
check "the same text when off" [ "$(sse_text "$T/k2")" = "aba" ]
finish
