#!/bin/sh
# `make run`: the gateway in supervise mode with one worker (backend auto)
# from conf/memra.json, serving the default model:
#   conf/models/memra-tiny.gguf when it exists, else the qwen3 fixture,
#   else MODEL=/path/to/model.gguf must be given.
# Environment: MODEL (GGUF path), NAME (model name), PORT (default 8080),
# HOST (default 127.0.0.1), BACKEND (default auto), CONF (default conf/memra.json).
# Runs in the foreground; Ctrl-C / SIGTERM drain the gateway and stop it.
set -eu
BUILD=${1:-build}
FIXTURES=${2:-../shared/fixtures}
CONF=${CONF:-conf/memra.json}
PORT=${PORT:-8080}
HOST=${HOST:-127.0.0.1}
BACKEND=${BACKEND:-auto}
if [ -z "${MODEL:-}" ]; then
    if [ -f conf/models/memra-tiny.gguf ]; then
        MODEL=conf/models/memra-tiny.gguf
        NAME=${NAME:-memra-tiny}
    elif [ -f "$FIXTURES/models/qwen3/model-Q8_0.gguf" ]; then
        MODEL=$FIXTURES/models/qwen3/model-Q8_0.gguf
        NAME=${NAME:-qwen3-tiny}
    else
        echo "make run: no model found. Put a GGUF at conf/models/memra-tiny.gguf," >&2
        echo "or run: MODEL=/path/to/model.gguf make run" >&2
        exit 1
    fi
fi
[ -f "$MODEL" ] || { echo "make run: MODEL=$MODEL does not exist" >&2; exit 1; }
NAME=${NAME:-$(basename "$MODEL" .gguf)}
MODEL=$(cd "$(dirname "$MODEL")" && pwd)/$(basename "$MODEL")
BIN=$(cd "$BUILD/bin" && pwd)
RUN=$(mktemp -d /tmp/memra-run.XXXXXX)
# the first model entry of the config, pointed at this model, with one worker
jq --arg listen "$HOST:$PORT" --arg bin "$BIN/memra-worker" --arg path "$MODEL" --arg name "$NAME" \
   --arg backend "$BACKEND" --arg sock "ipc://$RUN/worker-0.sock" \
   '.listen = $listen | .supervise = true | .worker_bin = $bin
    | .models = [.models[0] | .name = $name | .path = $path | .backend = $backend
                 | .workers = [{"device": 0, "listen": $sock}]]' "$CONF" > "$RUN/memra.json"
echo "memra: serving $NAME ($MODEL, backend $BACKEND) at http://$HOST:$PORT"
echo "  curl http://$HOST:$PORT/v1/chat/completions -H 'content-type: application/json' \\"
echo "    -d '{\"model\":\"$NAME\",\"messages\":[{\"role\":\"user\",\"content\":\"Hello\"}],\"max_tokens\":32}'"
"$BIN/memra-gateway" --config "$RUN/memra.json" &
GW=$!
# forward Ctrl-C / SIGTERM to the gateway (it drains), then wait for it
trap 'kill -TERM $GW 2>/dev/null' INT TERM
rc=0
wait $GW || rc=$?
# a trapped signal ends the first wait early: wait for the gateway's own exit
while kill -0 $GW 2>/dev/null; do rc=0; wait $GW || rc=$?; done
rm -rf "$RUN"
exit $rc
