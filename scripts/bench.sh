#!/usr/bin/env bash
# The main job until the trainer exists: builds (via setup.sh) and runs the numerical core's
# benchmarks: random words/s (Threefry vs Philox, scalar vs AVX-512, 1 and 2 threads) and the
# backward quantizer's elements/s per mode. Medians of 5 repetitions; the header names the machine.
# Extra arguments go to both benchmark binaries (e.g. --benchmark_filter=s3r).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
common=(--benchmark_repetitions=5 --benchmark_report_aggregates_only=true
        --benchmark_min_time=0.1 "$@")
echo "== random words per second"
build/release/bench/s3r_bench_rng "${common[@]}"
echo "== backward quantizer elements per second"
build/release/bench/s3r_bench_quant "${common[@]}"
