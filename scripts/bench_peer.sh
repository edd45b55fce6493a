#!/usr/bin/env bash
# s3r against its PyTorch peer (bench/peer): full training steps of one preset, in one invocation
# on this machine, interleaved rounds of peer f32, peer bf16 autocast (where the CPU has native
# bf16) and `s3r bench step`, pooled into one table (tokens/s, median ms, spread, peak memory,
# speed relative to the peer's fastest mode). About 4-5 minutes for `small` on 2 cores with the
# defaults; run it on an otherwise idle machine. Per-process JSON and the log in
# results/bench_peer/PRESET/ (PRESET-qwen3/, PRESET-gemma3/, PRESET-qwen3moe/ with --arch, PRESET-kvN/ with
# --kv-heads N, PRESET-CAP/ under --cap).
# Usage: scripts/bench_peer.sh [--preset small] [--arch llama|qwen3|gemma3|qwen3moe] [--kv-heads N] [--repeats N]
#                              [--rounds R] [--warmup W] [--threads T] [--configs LIST] [--retries K] [--json OUT]
#                              [--min-core-check X] [--core-wait S] [--cap avx2|avx512|avx512_bf16] [--no-build]
#   --arch qwen3moe: both sides the preset's mixture of experts (E 8 at tiny and wide, 32 at small; k 2;
#          experts of width 3 C / 8), the peer's experts looped over with index_select / index_add_
#   --kv-heads: grouped-query attention in both models (s3r train --kv-heads; default: the heads)
#   --repeats: timed steps per configuration per round (default 3; pooled over the 4 rounds)
#   --retries: a disturbed process runs again (default 2): other processes took > 10% of the CPUs, or
#          `s3r bench cores` before or after it read below --min-core-check (default 0.9; 0: no check):
#          another thread shared the cores, e.g. a VM's co-tenant on their other hyperthreads, unseen in
#          /proc/stat; a job waits up to --core-wait seconds in all (default 60) for the check
#   --cap: both sides behave as a lesser CPU than this one (s3r: S3R_MAX_ISA; the peer: oneDNN,
#          ATen and OpenBLAS kernel limits), e.g. avx512_bf16 (Zen 4/5, no AMX) or avx2 (Zen 3)
#   --no-build: time build/release/tools/s3r as it is (no `cmake --build` first, e.g. while another
#          build of the tree is under way)
set -euo pipefail
cd "$(dirname "$0")/.."
preset=small
args=()
build=1
while (($#)); do
  case $1 in
    --preset) preset=$2; args+=("$1" "$2"); shift 2 ;;
    --repeats|--rounds|--warmup|--retries|--threads|--configs|--json|--cap|--kv-heads|--arch|--min-core-check|--core-wait)
      args+=("$1" "$2"); shift 2 ;;
    --no-build) build=0; shift ;;
    -h|--help) awk 'NR > 1 && !/^#/ {exit} NR > 1' "$0"; exit 0 ;;
    *) echo "bench_peer: unknown option '$1' (see --help)" >&2; exit 1 ;;
  esac
done
if [ ! -x build/release/tools/s3r ] || ! /usr/bin/python3 -c "import torch" 2>/dev/null; then
  scripts/setup.sh  # installs python3-torch and OpenBLAS, builds build/release
elif ((build)); then
  cmake --build --preset release > /dev/null  # a stale binary would time old code (no-op if current)
fi
threads_given=0
for a in "${args[@]}"; do [ "$a" = --threads ] && threads_given=1; done
((threads_given)) || args+=(--threads "$(nproc)")
exec /usr/bin/python3 bench/peer/side_by_side.py --s3r build/release/tools/s3r \
  "${args[@]}"
