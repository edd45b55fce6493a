#!/usr/bin/env bash
# The library's folders point one way: a file of folder A may include a header of folder B only
# when B sits on a lower layer than A (or B is A). The layers, lowest first (docs/ARCHITECTURE.md
# states the same order):
#   0 core
#   1 kernels          (and the spec headers it implements, below)
#   2 rng dist io
#   3 quant gemm data
#   4 nn optim
#   5 model
#   6 ckpt             (checkpoint format, read by training and inference alike)
#   7 train infer      (neither includes the other)
# The spec headers are the contracts the kernels implement, header-only definitions with no
# includes of their own above core: s3r/rng/threefry.hpp, s3r/rng/philox.hpp,
# s3r/quant/thresholds.hpp and s3r/quant/grad_rounding.hpp; any folder may include them.
# Reads every tracked .cpp/.hpp under src/ and include/s3r/; prints each edge that points up or
# sideways and exits 1, or exits 0 with a summary. Usage: include_direction.sh REPO_ROOT
set -uo pipefail
root=${1:?usage: include_direction.sh REPO_ROOT}
cd "$root" || exit 1
git rev-parse --is-inside-work-tree > /dev/null 2>&1 || { echo "not a git checkout: skipped"; exit 77; }
declare -A layer=([core]=0 [kernels]=1 [rng]=2 [dist]=2 [io]=2 [quant]=3 [gemm]=3 [data]=3 [nn]=4 [optim]=4
                  [model]=5 [ckpt]=6 [train]=7 [infer]=7)
spec=" s3r/rng/threefry.hpp s3r/rng/philox.hpp s3r/quant/thresholds.hpp s3r/quant/grad_rounding.hpp "
bad=0; edges=0
while IFS= read -r file; do
  case $file in
    src/*) from=${file#src/} ;;
    include/s3r/*) from=${file#include/s3r/} ;;
    *) continue ;;
  esac
  from=${from%%/*}
  [ -n "${layer[$from]+x}" ] || { echo "FAIL: $file: folder '$from' has no layer in this test"; bad=1; continue; }
  while IFS= read -r inc; do
    [[ $spec == *" $inc "* ]] && continue
    to=${inc#s3r/}; to=${to%%/*}
    [ "$to" = "$from" ] && continue
    [ -n "${layer[$to]+x}" ] || continue  # a header of another library
    edges=$((edges + 1))
    if [ "${layer[$to]}" -ge "${layer[$from]}" ]; then
      echo "FAIL: $file includes \"$inc\": $from (layer ${layer[$from]}) may include only lower layers, not $to (layer ${layer[$to]})"
      bad=1
    fi
  done < <(sed -nE 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"([^"]+)".*/\1/p' "$file")
done < <(git ls-files 'src/*.cpp' 'src/*.hpp' 'include/s3r/*.hpp')
[ $bad = 0 ] || exit 1
echo "include direction: ok ($edges edges between folders, all downward)"
