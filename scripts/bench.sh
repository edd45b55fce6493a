#!/usr/bin/env bash
# The paper's Table III on this CPU: builds (via setup.sh), then `s3r bench ffn` times forward +
# backward of one SwiGLU block for bf16 and every int8 configuration at the paper's shapes W1-W3,
# 2048 tokens, medians of 5 interleaved repeats, and writes data/bench_ffn.json. Under a minute
# on 2 cores with AMX, 3-4 minutes on an AVX2-only CPU (docs/BENCH_FFN.md).
# Extra arguments go to `s3r bench ffn` (e.g. --shapes W1 --repeats 3, or --breakdown).
# The kernel micro-benchmarks (random words/s, quantizer elements/s): bench/run_benchmarks.py.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
mkdir -p data
build/release/tools/s3r bench ffn --shapes W1,W2,W3 --json data/bench_ffn.json "$@"
