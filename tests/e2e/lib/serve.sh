# Helpers for the serving end-to-end tests (sourced, not run).
# Every process started here is recorded and killed on exit, by pid.
set -u
BIN=${MEMRA_BIN:-build/bin}
BIN=$(cd "$BIN" && pwd)
T=$(mktemp -d /tmp/memra-e2e.XXXXXX)
PIDS=()
FAILS=0
cleanup() {
    for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; { wait "$p"; } 2>/dev/null; done
    # workers started by a supervising gateway die with it (PDEATHSIG); wait a moment for them
    sleep 0.2
    rm -rf "$T"
}
trap cleanup EXIT

fail() { echo "FAIL: $*"; FAILS=$((FAILS + 1)); }
ok() { echo "ok: $*"; }
check() { # check "description" command...
    local d=$1; shift
    if "$@"; then ok "$d"; else fail "$d"; fi
}
finish() {
    if [ "$FAILS" -ne 0 ]; then
        echo "$FAILS check(s) failed; gateway log:"; tail -30 "$T"/gw*.log 2>/dev/null
        exit 1
    fi
    exit 0
}

# start_gateway CONFIG LOG: starts it on a free port (PORT is set), waits for /readyz.
start_gateway() {
    local conf=$1 log=$2 tries=0
    while :; do
        PORT=$((20000 + RANDOM % 30000))
        sed "s/@PORT@/$PORT/g; s|@T@|$T|g; s|@BIN@|$BIN|g" "$conf" > "$T/conf.json"
        "$BIN/memra-gateway" --config "$T/conf.json" > "$log" 2>&1 &
        GW_PID=$!
        PIDS+=("$GW_PID")
        for _ in $(seq 1 100); do
            if curl -s -o /dev/null "http://127.0.0.1:$PORT/health"; then break; fi
            kill -0 "$GW_PID" 2>/dev/null || break
            sleep 0.05
        done
        if kill -0 "$GW_PID" 2>/dev/null; then break; fi
        tries=$((tries + 1))
        [ $tries -lt 5 ] || { echo "gateway does not start:"; cat "$log"; exit 1; }
    done
    URL="http://127.0.0.1:$PORT"
    wait_ready 20
}

wait_ready() { # seconds
    local n=$(( $1 * 20 ))
    for _ in $(seq 1 $n); do
        [ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/readyz")" = 200 ] && return 0
        sleep 0.05
    done
    return 1
}

# post PATH BODY [curl args...] -> body in $T/out, status in $CODE
post() {
    local p=$1 b=$2; shift 2
    CODE=$(curl -s -o "$T/out" -w '%{http_code}' -H 'content-type: application/json' "$@" --data-binary "$b" "$URL$p")
}
body() { cat "$T/out"; }
jqo() { jq -e "$@" "$T/out" >/dev/null 2>&1; }
# the OpenAI error shape, exactly: one key "error" with message/type/param/code
is_error_shape() {
    jq -e '(keys == ["error"]) and (.error | keys == ["code","message","param","type"]) and (.error.message|type=="string") and (.error.type|type=="string")' "$T/out" >/dev/null 2>&1
}
# SSE: every event is "data: ..." followed by a blank line, the last is [DONE]
sse_wellformed() {
    local f=$1
    awk 'BEGIN{ok=1; expect_blank=0}
         /^: /{next}
         { if (expect_blank) { if ($0 != "") ok=0; expect_blank=0; next }
           if ($0 == "") next
           if ($0 !~ /^data: /) ok=0; expect_blank=1; last=$0 }
         END{ if (last != "data: [DONE]") ok=0; exit !ok }' "$f"
}
sse_text() { # concatenated text/content of all chunks
    grep '^data: {' "$1" | sed 's/^data: //' | jq -j '.choices[0]? | (.text // .delta.content // "")'
}
