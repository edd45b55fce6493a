#!/usr/bin/env bash
# Full-step speed (the paper's Table IV) for `small` and for `wide` (GEMM-bound): medians of
# interleaved repeats per configuration, speed relative to bf16 and to sr, peak memory per
# configuration. Tables on stdout, JSON in results/bench_step/. About 8 minutes on 2 cores; run
# it on an otherwise idle machine.
# Usage: scripts/bench_step.sh [extra `s3r bench step` options, e.g. --repeats 9]
set -euo pipefail
cd "$(dirname "$0")/.."
s3r=build/release/tools/s3r
[ -x "$s3r" ] || { echo "bench_step: no $s3r; run scripts/setup.sh first" >&2; exit 1; }
mkdir -p results/bench_step
for preset in small wide; do
  "$s3r" bench step --preset "$preset" --json "results/bench_step/$preset.json" "$@"
  echo
done
