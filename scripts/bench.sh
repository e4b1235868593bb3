#!/bin/bash
# Benchmarks (needs a CUDA device and ~20 GB of free disk: one synthetic
# model at a time): matvec kernels against copy bandwidth, then pp512 /
# tg128 (N=3, medians) of the synthetic models of the CUDA issue (Qwen3-8B
# and Qwen3-30B-A3B, Q4_K_M-shaped) and of the hybrid issue (Qwen3.6-35B-A3B
# IQ4_XS, Qwen3.5-9B Q8_0), and for the 35B-A3B shape tg128 after an
# 8,192-token prompt (DEPTHS="8192 65536" adds depths; each prompt costs
# its prefill time).  A model written here is deleted after its runs unless
# KEEP=1.
# Usage: scripts/bench.sh BUILD [WORKDIR]
set -u
BUILD=${1:-build}
WORK=${2:-${TMPDIR:-/tmp}/memra-bench}
DEPTHS=${DEPTHS:-8192}
KEEP=${KEEP:-0}
BIN=$BUILD/bin
mkdir -p "$WORK"
echo "== kernels"
"$BIN/bench-kernels" 100 || exit 1
for preset in qwen3-8b-q4km qwen3-30b-a3b-q4km qwen3.6-35b-a3b-iq4xs qwen3.5-9b; do
    f="$WORK/$preset.gguf"
    made=0
    if [ ! -f "$f" ]; then
        echo "== memra-synth $preset"
        /usr/bin/time -f "synth %e s" "$BIN/memra-synth" "$preset" "$f" || exit 1
        made=1
    fi
    echo "== bench-model $preset (pp512, tg128, 3 runs)"
    "$BIN/bench-model" "$f" --backend cuda --runs 3 --pp 512 --tg 128 || exit 1
    if [ "$preset" = qwen3.6-35b-a3b-iq4xs ]; then
        for d in $DEPTHS; do
            echo "== bench-model $preset (tg128 after a $d-token prompt, 1 run)"
            "$BIN/bench-model" "$f" --backend cuda --runs 1 --pp 0 --tg 128 --depth "$d" || exit 1
        done
    fi
    [ "$made" = 1 ] && [ "$KEEP" != 1 ] && rm -f "$f"
done
exit 0
