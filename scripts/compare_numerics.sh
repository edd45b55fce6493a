#!/usr/bin/env bash
# Nothing numerical changed: trains the tiny model for 12 steps in every recipe with this
# checkout's `s3r` and with a build of another commit (default: HEAD, i.e. the working tree's
# changes against the last commit), in every kernel tier this CPU has, and compares the
# checkpoints byte for byte, meta.json (but for a "recipe" key the other build may lack) and the
# logged numbers (without timings). This checkout's `s3r` runs each recipe twice, spelled as
# --mode/--correction/--head and as --recipe NAME, and both runs must match the other build's.
# A refactoring tool, not part of the suite: it builds a second copy of s3r (a few minutes;
# rebuild build/release first, the script uses it as it is).
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

# The base commit's s3r, built once per commit in build/compare/<rev> from an export of its tree
# (git archive: nothing in .git changes, and a failed build leaves nothing registered).
src=$root/build/compare/src-$short bin=$root/build/compare/$short
if [ ! -x "$bin/tools/s3r" ]; then
  echo "building $short in $bin (s3r only)"
  rm -rf "$src"; mkdir -p "$src"
  git archive "$rev" | tar -x -C "$src"
  cmake -S "$src" -B "$bin" -DCMAKE_BUILD_TYPE=Release -DS3R_BUILD_TESTS=OFF -DS3R_BUILD_BENCH=OFF > "$bin.configure.log" 2>&1 \
    || { tail -20 "$bin.configure.log"; exit 1; }
  cmake --build "$bin" --target s3r_cli -j"$(nproc)" > "$bin.build.log" 2>&1 || { tail -20 "$bin.build.log"; exit 1; }
  rm -rf "$src"
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
meta() {  # meta.json without config.recipe, which a build before Recipe does not write
  python3 -c '
import json, sys
j = json.load(open(sys.argv[1])); j["config"].pop("recipe", None); print(json.dumps(j, sort_keys=True, indent=1))' "$1"
}
# (mode, correction, head) as both builds spell them.
recipes=("f32 none default" "bf16 none default" "rtne none default" "sr none default" "s3r none default"
         "s3r dx default" "s3r two-way default" "s3r-bcast none default" "sr dx default" "s3r dx int8")
have() {  # have CAP: whether this CPU runs the tier
  case $1 in
    native|reference) return 0 ;;
    avx2) grep -qw avx2 /proc/cpuinfo ;;
    avx512_bf16) grep -qw avx512_bf16 /proc/cpuinfo ;;
    *) grep -qw avx512f /proc/cpuinfo ;;
  esac
}
train() {  # train CAP BINARY OUT RECIPE-OPTIONS...: the 12-step run, capped at CAP
  local cap=$1 bin=$2 out=$3; shift 3
  local env_cap=(); [ "$cap" = native ] || env_cap=(S3R_MAX_ISA="$cap")
  env -u S3R_ISA -u S3R_GEMM_INT8 -u S3R_GEMM_BF16 "${env_cap[@]}" OMP_NUM_THREADS=2 \
    "$bin" train --preset tiny --vocab 300 --data "$work/data" --steps 12 --warmup 2 --eval-every 4 \
    "$@" --out "$out" > "$out.log" 2>&1
}
same_run() {  # same_run NAME A B: whether runs A and B left the same bytes and numbers
  local same=0 f
  for f in model.safetensors optimizer.safetensors; do
    cmp -s "$2/checkpoint/$f" "$3/checkpoint/$f" || { echo "$1: checkpoint/$f differs"; same=1; }
  done
  diff <(meta "$2/checkpoint/meta.json") <(meta "$3/checkpoint/meta.json") > /dev/null \
    || { echo "$1: checkpoint/meta.json differs"; same=1; }
  diff <(numbers "$2/metrics.jsonl") <(numbers "$3/metrics.jsonl") > /dev/null \
    || { echo "$1: metrics.jsonl differs"; same=1; }
  return $same
}
bad=0; runs=0
for cap in $caps; do
  have "$cap" || { echo "$cap: not on this CPU, left out"; continue; }
  for r in "${recipes[@]}"; do
    read -r mode corr head <<<"$r"
    name="$cap-$mode-$corr-$head"
    recipe=$mode; [ "$corr" = none ] || recipe+="+$corr"; [ "$head" = default ] || recipe+="/head-int8"
    options=(--mode "$mode" --correction "$corr" --head "$head")
    train "$cap" "$old" "$work/$name-old" "${options[@]}" \
      || { echo "$name: the old build failed: $(tail -2 "$work/$name-old.log")"; bad=1; continue; }
    train "$cap" "$new" "$work/$name-new" "${options[@]}" \
      || { echo "$name: the new build failed: $(tail -2 "$work/$name-new.log")"; bad=1; continue; }
    train "$cap" "$new" "$work/$name-recipe" --recipe "$recipe" \
      || { echo "$name: the new build failed with --recipe $recipe: $(tail -2 "$work/$name-recipe.log")"; bad=1; continue; }
    runs=$((runs + 1))
    same=1
    same_run "$name" "$work/$name-old" "$work/$name-new" || same=0
    same_run "$name (--recipe $recipe)" "$work/$name-old" "$work/$name-recipe" || same=0
    [ $same = 1 ] && echo "$name: same bytes and numbers (also as --recipe $recipe)" || bad=1
  done
done
[ $bad = 0 ] && echo "compare_numerics: $runs runs, every checkpoint and logged number the same as $short's" \
             || { echo "compare_numerics: differences against $short"; exit 1; }
