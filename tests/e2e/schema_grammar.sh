#!/bin/bash
# JSON Schema grammars (gateway/jsonschema.h) against a real validator:
# tests/node/schema_check.mjs drives build/bin/schema-grammar over the
# corpus tests/node/schemas.json and checks sampled sentences, valid and
# invalid instances and refusals with ajv.  Skipped only without node.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${MEMRA_BIN:-$ROOT/build/bin}
if ! command -v node >/dev/null 2>&1; then
    echo "schema_grammar: node not found, skipped"
    exit 0
fi
for m in ajv ajv-formats; do
    if [ ! -d "$ROOT/tests/node/node_modules/$m" ]; then
        echo "FAIL: tests/node/node_modules/$m is missing (run make deps)"
        exit 1
    fi
done
SG=$(cd "$BIN" 2>/dev/null && pwd)/schema-grammar
if [ ! -x "$SG" ]; then
    echo "FAIL: $BIN/schema-grammar is missing"
    exit 1
fi
node "$ROOT/tests/node/schema_check.mjs" "$SG"
