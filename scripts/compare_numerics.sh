#!/usr/bin/env bash
# Nothing numerical changed: trains the tiny model for 12 steps in every recipe with this
# checkout's `s3r` and with a build of another commit (default: HEAD, i.e. the working tree's
# changes against the last commit), in every kernel tier this CPU has, and compares the
# checkpoints byte for byte and the logged numbers (without timings).
# A refactoring tool, not part of the suite: it builds a second copy of s3r (a few minutes).
#
# Usage: scripts/compare_numerics.sh [--base REV] [--caps "native avx2 reference"] [--keep]
#   --base REV   the commit to compare against (default HEAD)
#   --caps LIST  S3R_MAX_ISA values to run under ("native": no cap; default: native, avx2 and
#                reference, each only where the CPU has it)
# Exit 0 when every run matches; 1 with the differing runs named.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
base=HEAD; caps="native avx2 reference"; keep=0
while [ $# -gt 0 ]; do
  case $1 in
    --base) base=${2:?--base needs a commit}; shift 2 ;;
    --caps) caps=${2:?--caps needs a list}; shift 2 ;;
    --keep) keep=1; shift ;;
    *) echo "compare_numerics.sh: unknown argument '$1' (--base REV, --caps LIST, --keep)" >&2; exit 1 ;;
  esac
done
rev=$(git rev-parse --verify --quiet "$base^{commit}") || { echo "compare_numerics.sh: '$base' is not a commit" >&2; exit 1; }
short=${rev:0:10}
new=$root/build/release/tools/s3r
[ -x "$new" ] || { echo "compare_numerics.sh: build this checkout first (scripts/setup.sh)" >&2; exit 1; }

# The base commit's s3r, built once per commit in build/compare/<rev> from a worktree.
src=$root/build/compare/src-$short bin=$root/build/compare/$short
if [ ! -x "$bin/tools/s3r" ]; then
  echo "building $short in $bin (s3r only)"
  rm -rf "$src"; mkdir -p "$root/build/compare"
  git worktree add --detach -f "$src" "$rev" > /dev/null
  cmake -S "$src" -B "$bin" -DCMAKE_BUILD_TYPE=Release -DS3R_BUILD_TESTS=OFF -DS3R_BUILD_BENCH=OFF > "$bin.configure.log"
  cmake --build "$bin" --target s3r_cli -j"$(nproc)" > "$bin.build.log" 2>&1 || { tail -20 "$bin.build.log"; exit 1; }
  git worktree remove --force "$src"
fi
old=$bin/tools/s3r

work=$(mktemp -d)
[ $keep = 1 ] || trap 'rm -rf "$work"' EXIT
words=(the quantized gradient rounds up down stochastic shared threshold token error mean layer model training)
for d in $(seq 1 300); do
  line=""
  for w in $(seq 1 40); do line+="${words[$(( (d * 7 + w * w * 3) % ${#words[@]} ))]} "; done
  printf '%s\n\n' "$line"
done > "$work/corpus.txt"
"$new" data prepare "$work/corpus.txt" --out "$work/data" --vocab 300 > /dev/null

numbers() {
  python3 -c '
import json, sys
for line in open(sys.argv[1]):
    j = json.loads(line); j.pop("ms", None); j.pop("tokens_per_s", None); print(json.dumps(j, sort_keys=True))' "$1"
}
# (mode, correction, head) as both builds spell them.
recipes=("f32 none default" "bf16 none default" "rtne none default" "sr none default" "s3r none default"
         "s3r dx default" "s3r two-way default" "s3r-bcast none default" "sr dx default" "s3r dx int8")
have() {  # have CAP: whether this CPU runs the tier
  case $1 in
    native|reference) return 0 ;;
    avx2) grep -qw avx2 /proc/cpuinfo ;;
    *) grep -qw avx512f /proc/cpuinfo ;;
  esac
}
bad=0; runs=0
for cap in $caps; do
  have "$cap" || { echo "$cap: not on this CPU, left out"; continue; }
  for r in "${recipes[@]}"; do
    read -r mode corr head <<<"$r"
    name="$cap-$mode-$corr-$head"
    for side in old new; do
      bin_side=$old; [ $side = new ] && bin_side=$new
      env_cap=(); [ "$cap" = native ] || env_cap=(S3R_MAX_ISA="$cap")
      env -u S3R_ISA -u S3R_GEMM_INT8 -u S3R_GEMM_BF16 "${env_cap[@]}" OMP_NUM_THREADS=2 \
        "$bin_side" train --preset tiny --vocab 300 --data "$work/data" --steps 12 --warmup 2 --eval-every 4 \
        --mode "$mode" --correction "$corr" --head "$head" --out "$work/$name-$side" > "$work/$name-$side.log" 2>&1 \
        || { echo "$name: the $side build failed: $(tail -2 "$work/$name-$side.log")"; bad=1; continue 2; }
    done
    runs=$((runs + 1))
    same=1
    for f in model.safetensors optimizer.safetensors; do
      cmp -s "$work/$name-old/checkpoint/$f" "$work/$name-new/checkpoint/$f" || { echo "$name: checkpoint/$f differs"; same=0; }
    done
    diff <(numbers "$work/$name-old/metrics.jsonl") <(numbers "$work/$name-new/metrics.jsonl") > /dev/null \
      || { echo "$name: metrics.jsonl differs"; same=0; }
    [ $same = 1 ] && echo "$name: same bytes and numbers" || bad=1
  done
done
[ $bad = 0 ] && echo "compare_numerics: $runs runs, every checkpoint and logged number the same as $short's" \
             || { echo "compare_numerics: differences against $short"; exit 1; }
