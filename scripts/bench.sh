#!/bin/bash
# Benchmarks (needs a CUDA device and ~25 GB of free disk for the synthetic
# models): matvec kernels against copy bandwidth, then tg128 / pp512 of the
# synthetic Qwen3-8B and Qwen3-30B-A3B Q4_K_M-shaped models, N=3, medians.
# Usage: scripts/bench.sh BUILD [WORKDIR]
set -u
BUILD=${1:-build}
WORK=${2:-${TMPDIR:-/tmp}/memra-bench}
BIN=$BUILD/bin
mkdir -p "$WORK"
echo "== kernels"
"$BIN/bench-kernels" 100 || exit 1
for preset in qwen3-8b-q4km qwen3-30b-a3b-q4km; do
    f="$WORK/$preset.gguf"
    if [ ! -f "$f" ]; then
        echo "== memra-synth $preset"
        /usr/bin/time -f "synth %e s" "$BIN/memra-synth" "$preset" "$f" || exit 1
    fi
    echo "== bench-model $preset (pp512, tg128, 3 runs)"
    "$BIN/bench-model" "$f" --backend cuda --runs 3 --pp 512 --tg 128 || exit 1
done
