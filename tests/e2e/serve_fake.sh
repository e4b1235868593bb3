#!/bin/bash
# Gateway + supervised workers on the fake (echo) engine: the whole HTTP
# contract, SSE framing, errors, concurrency, a worker killed mid-stream,
# client disconnect, and drain.  The echo engine makes output token i equal
# to prompt token i mod n, and the byte codec makes tokens bytes, so every
# expected text below follows from the prompt by that rule.
. "$(dirname "$0")/lib/serve.sh"

cat > "$T/tmpl.json" <<'J'
{"listen": "127.0.0.1:@PORT@", "supervise": true, "worker_bin": "@BIN@/memra-worker",
 "max_body_bytes": 65536, "request_timeout_ms": 1000, "drain_timeout_ms": 10000,
 "restart_backoff_min_ms": 100, "retry_after_s": 2,
 "models": [
  {"name": "echo", "tokenizer": "bytes", "backend": "fake", "context_length": 4096, "max_tokens_default": 16,
   "workers": [{"listen": "ipc://@T@/w0.sock"}], "worker_args": ["--fake-delay-ms", "3"]},
  {"name": "echo2", "tokenizer": "bytes", "backend": "fake", "context_length": 64,
   "workers": [{"listen": "ipc://@T@/w1.sock"}], "worker_args": ["--fake-delay-ms", "3", "--fake-corrupt-token", "90"]}]}
J
start_gateway "$T/tmpl.json" "$T/gw.log"
check "ready" wait_ready 5
# waits until a stream file holds at least one data event (the request is running)
wait_stream() {
    for _ in $(seq 1 200); do
        [ "$(grep -c '^data: {' "$1" 2>/dev/null)" -ge 1 ] && return 0
        sleep 0.05
    done
    return 1
}

# --- blocking completions and chat ---
post /v1/completions '{"model":"echo","prompt":"hello ","max_tokens":12}'
check "completion 200" [ "$CODE" = 200 ]
check "completion text is the prompt echoed" jqo '.choices[0].text == "hello hello "'
check "completion usage" jqo '.usage.prompt_tokens == 6 and .usage.completion_tokens == 12 and .usage.total_tokens == 18'
check "completion finish length" jqo '.choices[0].finish_reason == "length" and .object == "text_completion"'
check "completion id" jqo '(.id | test("^cmpl-[0-9a-f]{32}$")) and (.created | type == "number")'
post /v1/completions '{"model":"echo","prompt":[104,105],"max_tokens":3}'
check "token-id prompt" jqo '.choices[0].text == "hih"'
post /v1/completions '{"model":"echo","prompt":"abc"}'
check "default max_tokens from config" jqo '.usage.completion_tokens == 16'
post /v1/completions '{"model":"echo","prompt":"abcabd","max_tokens":20,"stop":["ab","zz"]}'
check "stop string cuts, finish stop" jqo '.choices[0].text == "" and .choices[0].finish_reason == "stop"'
post /v1/completions '{"model":"echo","prompt":"xyzab","max_tokens":20,"stop":"ab"}'
check "stop string after text" jqo '.choices[0].text == "xyz" and .choices[0].finish_reason == "stop"'
post /v1/chat/completions '{"model":"echo","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":10}'
check "chat 200" [ "$CODE" = 200 ]
check "chat content echoes the ChatML prompt" jqo '.choices[0].message == {"role":"assistant","content":"<|im_start"}'
check "chat shape" jqo '.object == "chat.completion" and (.id | test("^chatcmpl-")) and .usage.prompt_tokens == 52'
post /v1/chat/completions '{"model":"echo","messages":[{"role":"user","content":"hi"}],"max_tokens":2,"logprobs":true,"top_logprobs":2}'
check "chat logprobs" jqo '.choices[0].logprobs.content | length == 2 and .[0].token == "<" and .[0].logprob == 0 and .[1].logprob == -0.25 and (.[0].top_logprobs | length == 2) and .[0].top_logprobs[1].token == "=" and .[0].top_logprobs[1].logprob == -1'
post /v1/completions '{"model":"echo","prompt":"ab","max_tokens":3,"logprobs":1}'
check "completion logprobs" jqo '.choices[0].logprobs.tokens == ["a","b","a"] and .choices[0].logprobs.token_logprobs == [0,-0.25,-0.5] and .choices[0].logprobs.text_offset == [0,1,2]'

# --- streaming ---
curl -sN "$URL/v1/completions" -d '{"model":"echo","prompt":"abc","max_tokens":7,"stream":true,"stream_options":{"include_usage":true}}' > "$T/s1"
check "SSE framing" sse_wellformed "$T/s1"
check "SSE text" [ "$(sse_text "$T/s1")" = "abcabca" ]
check "SSE usage chunk" bash -c "grep '^data: {' '$T/s1' | sed 's/^data: //' | jq -se '.[-1].choices == [] and .[-1].usage.completion_tokens == 7 and .[-2].choices[0].finish_reason == \"length\"' >/dev/null"
curl -sN "$URL/v1/completions" -d '{"model":"echo","prompt":"abc","max_tokens":7,"stream":true}' > "$T/s2"
check "no usage without include_usage" bash -c "! grep -q usage '$T/s2'"
curl -sN "$URL/v1/chat/completions" -d '{"model":"echo","messages":[{"role":"user","content":"x"}],"max_tokens":5,"stream":true}' > "$T/s3"
check "chat SSE framing" sse_wellformed "$T/s3"
check "chat SSE first delta has the role" bash -c "grep -m1 '^data: {' '$T/s3' | sed 's/^data: //' | jq -e '.choices[0].delta.role == \"assistant\" and .object == \"chat.completion.chunk\"' >/dev/null"
check "chat SSE text" [ "$(sse_text "$T/s3")" = "<|im_" ]
curl -sN "$URL/v1/completions" -d '{"model":"echo","prompt":"hello </s>","max_tokens":40,"stream":true,"stop":"</s>"}' > "$T/s4"
check "stream cut at the stop string" [ "$(sse_text "$T/s4")" = "hello " ]
check "streamed text never shows a partial stop" bash -c "! grep '^data: {' '$T/s4' | sed 's/^data: //' | jq -r '.choices[0].text' | grep -q '<'"
check "stop in stream ends with finish stop" grep -q '"finish_reason":"stop"' "$T/s4"

# --- other routes ---
CODE=$(curl -s -o "$T/out" -w '%{http_code}' "$URL/v1/models")
check "models" jqo '.object == "list" and (.data | map(.id) == ["echo","echo2"]) and .data[1].context_length == 64 and (.data[0].supported_parameters | index("seed"))'
post /tokenize '{"model":"echo","prompt":"hi"}'
check "tokenize" jqo '.tokens == [104,105] and .count == 2'
post /detokenize '{"model":"echo","tokens":[104,105]}'
check "detokenize" jqo '.prompt == "hi"'
CODE=$(curl -s -o "$T/out" -w '%{http_code}' "$URL/health")
check "health" jqo '.status == "ok"'

# --- errors: each its status and the OpenAI shape ---
expect_err() { # status param-or-null description body [path] [curl args]
    local st=$1 param=$2 d=$3 b=$4 p=${5:-/v1/completions}
    shift 5 2>/dev/null || shift $#
    post "$p" "$b" "$@"
    if [ "$CODE" = "$st" ] && is_error_shape && jqo ".error.param == $param"; then ok "$d"; else fail "$d: $CODE $(body)"; fi
}
expect_err 400 null "invalid JSON" '{"model":'
expect_err 400 null "not an object" '[1,2]'
expect_err 400 '"model"' "missing model" '{"prompt":"x"}'
expect_err 400 '"temperature"' "wrong type" '{"model":"echo","prompt":"x","temperature":"warm"}'
expect_err 400 '"top_p"' "out of range" '{"model":"echo","prompt":"x","top_p":1.5}'
expect_err 400 '"n"' "n=2 names n" '{"model":"echo","prompt":"x","n":2}'
expect_err 400 '"max_tokens"' "max_tokens 0" '{"model":"echo","prompt":"x","max_tokens":0}'
expect_err 400 '"messages"' "bad role" '{"model":"echo","messages":[{"role":"bot","content":"x"}]}' /v1/chat/completions
expect_err 404 '"model"' "unknown model" '{"model":"nope","prompt":"x"}'
check "unknown model code" jqo '.error.code == "model_not_found"'
expect_err 400 '"prompt"' "token id outside vocabulary" '{"model":"echo","prompt":[300]}'
expect_err 400 '"max_tokens"' "context length" '{"model":"echo2","prompt":"0123456789","max_tokens":60}'
check "context length code" jqo '.error.code == "context_length_exceeded"'
printf '{"model":"echo","prompt":"\xff\xfe"}' > "$T/bad-utf8"
CODE=$(curl -s -o "$T/out" -w '%{http_code}' --data-binary @"$T/bad-utf8" "$URL/v1/completions")
check "invalid UTF-8 → 400 shape" bash -c "[ $CODE = 400 ] && jq -e '.error.type == \"invalid_request_error\"' '$T/out' >/dev/null"
head -c 200000 /dev/zero | tr '\0' 'a' > "$T/big"
CODE=$(curl -s -o "$T/out" -w '%{http_code}' --data-binary @"$T/big" "$URL/v1/completions")
check "huge body → 413 in the OpenAI shape" bash -c "[ $CODE = 413 ] && jq -e '.error.message' '$T/out' >/dev/null"
CODE=$(curl -s -o "$T/out" -w '%{http_code}' -H 'transfer-encoding: chunked' --data-binary @"$T/big" "$URL/v1/completions")
check "huge chunked body → 413" [ "$CODE" = 413 ]
CODE=$(curl -s -o "$T/out" -w '%{http_code}' "$URL/v1/completions")
check "GET on a POST route → 405 shape" bash -c "[ $CODE = 405 ] && jq -e .error '$T/out' >/dev/null"
CODE=$(curl -s -o "$T/out" -w '%{http_code}' "$URL/v2/nothing")
check "unknown route → 404 shape" bash -c "[ $CODE = 404 ] && jq -e .error '$T/out' >/dev/null"

# a client that sends half a request and stalls: the gateway keeps serving, then drops it
exec 7<>/dev/tcp/127.0.0.1/$PORT
printf 'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"model":' >&7
post /v1/completions '{"model":"echo","prompt":"ok","max_tokens":2}'
check "serving while a client stalls" jqo '.choices[0].text == "ok"'
sleep 1.5
check "stalled connection closed by the request timeout" timeout 2 cat <&7 >/dev/null
exec 7>&- 7<&-

# a worker that sends a malformed message about a request: that request
# ends with an error, the gateway and the worker keep serving
curl -sN "$URL/v1/completions" -d '{"model":"echo2","prompt":"abZ","max_tokens":20,"stream":true}' > "$T/z1"
check "malformed worker message: stream keeps the text before it" [ "$(sse_text "$T/z1")" = ab ]
check "malformed worker message ends that stream with an error" bash -c "grep -q bad_message '$T/z1' && tail -2 '$T/z1' | grep -q DONE"
post /v1/completions '{"model":"echo2","prompt":"abZ","max_tokens":20}'
check "malformed worker message → 500 shape" bash -c "[ $CODE = 500 ] && jq -e '.error.code == \"bad_message\"' '$T/out' >/dev/null"
post /v1/completions '{"model":"echo2","prompt":"fine","max_tokens":4}'
check "and the next request is served" jqo '.choices[0].text == "fine"'

# --- 32 concurrent streams, and greedy determinism among them ---
CPIDS=()
for i in $(seq 1 32); do
    curl -sN "$URL/v1/completions" -d "{\"model\":\"echo\",\"prompt\":\"s$i-\",\"max_tokens\":24,\"stream\":true,\"temperature\":0}" > "$T/c$i" &
    CPIDS+=($!)
done
wait "${CPIDS[@]}"
good=0
for i in $(seq 1 32); do
    p="s$i-"; want=""; while [ ${#want} -lt 24 ]; do want="$want$p"; done; want=${want:0:24}
    if sse_wellformed "$T/c$i" && [ "$(sse_text "$T/c$i")" = "$want" ]; then good=$((good + 1)); fi
done
check "32 concurrent streams all complete correctly ($good/32)" [ $good = 32 ]

# --- client disconnect cancels on the worker ---
curl -sN "$URL/v1/completions" -d '{"model":"echo","prompt":"abc","max_tokens":3000,"stream":true}' > "$T/dc" &
CP=$!
wait_stream "$T/dc"
kill "$CP" 2>/dev/null; wait "$CP" 2>/dev/null
cancelled=0
for _ in $(seq 1 20); do
    curl -s -H "" "$URL/metrics" > "$T/m"
    if grep -q '^memra_running_requests{model="echo"} 0$' "$T/m"; then cancelled=1; break; fi
    sleep 0.05
done
check "client disconnect ends the request on the worker (< 1 s)" [ $cancelled = 1 ]
curl -s -m 0.3 "$URL/v1/completions" -d '{"model":"echo","prompt":"abc","max_tokens":3000}' > /dev/null
cancelled=0
for _ in $(seq 1 20); do
    curl -s "$URL/metrics" > "$T/m"
    if grep -q '^memra_running_requests{model="echo"} 0$' "$T/m"; then cancelled=1; break; fi
    sleep 0.05
done
check "blocking client disconnect ends the request too" [ $cancelled = 1 ]

# --- kill -9 a worker mid-stream ---
W0=$(pgrep -P "$GW_PID" -f "w0.sock" | head -1)
curl -sN "$URL/v1/completions" -d '{"model":"echo","prompt":"abc","max_tokens":3000,"stream":true}' > "$T/k1" &
KP=$!
curl -sN "$URL/v1/completions" -d '{"model":"echo2","prompt":"xyz","max_tokens":40,"stream":true}' > "$T/k2" &
K2=$!
wait_stream "$T/k1"
kill -9 "$W0"
wait "$KP" "$K2"
check "killed stream: error event then [DONE]" bash -c "sse_wellformed() { :; }; grep '^data: {' '$T/k1' | tail -1 | sed 's/^data: //' | jq -e '.error.code == \"worker_lost\"' >/dev/null && tail -2 '$T/k1' | grep -q '^data: \[DONE\]'"
check "killed stream still well-formed SSE" sse_wellformed "$T/k1"
check "the other model's stream is unaffected" [ "$(sse_text "$T/k2")" = "xyzxyzxyzxyzxyzxyzxyzxyzxyzxyzxyzxyzxyzx" ]
check "worker comes back" wait_ready 10
post /v1/completions '{"model":"echo","prompt":"back","max_tokens":4}'
check "next request succeeds" jqo '.choices[0].text == "back"'
curl -s "$URL/metrics" > "$T/m"
check "restart counted in metrics" grep -q '^memra_worker_restarts_total{model="echo",worker="0"} 1$' "$T/m"
check "metrics: requests by route and status" grep -q '^memra_http_requests_total{route="/v1/completions",status="200"}' "$T/m"
check "metrics: ttft histogram" grep -q '^memra_time_to_first_token_seconds_bucket{model="echo",le="+Inf"}' "$T/m"
check "metrics: tenant counters" grep -q '^memra_tenant_requests_total{tenant="default"}' "$T/m"

# --- a non-streaming request on a dying worker gets a 503 JSON ---
W0=$(pgrep -P "$GW_PID" -f "w0.sock" | head -1)
( for _ in $(seq 1 200); do
      curl -s "$URL/metrics" | grep -qx 'memra_running_requests{model="echo"} 1' && break
      sleep 0.05
  done
  kill -9 "$W0" ) &
KILLER=$!
post /v1/completions '{"model":"echo","prompt":"abc","max_tokens":3000}'
check "non-stream on a killed worker → 503 shape" bash -c "[ $CODE = 503 ] && jq -e '.error.code == \"worker_lost\"' '$T/out' >/dev/null"
wait "$KILLER"
wait_ready 10

# --- drain: SIGTERM finishes running requests, refuses new ones, exits ---
curl -sN "$URL/v1/completions" -d '{"model":"echo","prompt":"drain","max_tokens":400,"stream":true}' > "$T/d1" &
DP=$!
wait_stream "$T/d1"
kill -TERM "$GW_PID"
drain_seen() {
    for _ in $(seq 1 40); do
        [ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/readyz")" = 503 ] && return 0
        sleep 0.05
    done
    return 1
}
check "readyz 503 while draining" drain_seen
post /v1/completions '{"model":"echo","prompt":"x","max_tokens":2}'
check "new request 503 draining" bash -c "[ $CODE = 503 ] && jq -e '.error.code == \"draining\"' '$T/out' >/dev/null"
wait "$DP"
check "running stream finished during drain" bash -c "grep -q '\"finish_reason\":\"length\"' '$T/d1' && tail -2 '$T/d1' | grep -q DONE"
for _ in $(seq 1 100); do kill -0 "$GW_PID" 2>/dev/null || break; sleep 0.05; done
check "gateway exited" bash -c "! kill -0 $GW_PID 2>/dev/null"
wait "$GW_PID"; rc=$?
check "gateway exit status 0" [ $rc = 0 ]
check "workers exited" bash -c "! pgrep -f '$T/w[01].sock' >/dev/null"
finish
