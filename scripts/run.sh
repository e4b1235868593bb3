#!/bin/sh
# `make run`: for now, greedy generation on the qwen3 fixture with run-gen.
set -eu
BUILD=${1:-build}
FIXTURES=${2:-../shared/fixtures}
MODEL=${MODEL:-$FIXTURES/models/qwen3/model-Q8_0.gguf}
TOKENS=${TOKENS:-1,2,3,4,5,6,7}
echo "run-gen $MODEL --tokens $TOKENS -n 24"
exec "$BUILD/bin/run-gen" "$MODEL" --tokens "$TOKENS" -n 24 --backend "${BACKEND:-auto}"
