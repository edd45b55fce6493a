#!/usr/bin/env bash
# The repository stands alone: no tracked file may refer to a path outside the checkout (the
# folder that once sat beside it, or the paper's text there). Usage: no_outside_paths.sh SOURCE_DIR
# Exit 0: clean; 1: references found (listed as file:line); 77 (CTest skip): not a git checkout,
# so there is no list of tracked files to check.
set -uo pipefail
src=${1:?usage: no_outside_paths.sh SOURCE_DIR}
if ! git -C "$src" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  echo "SKIP: $src is not a git checkout (no tracked files to check)"
  exit 77
fi
# Patterns are assembled from pieces so that this file does not match itself.
sib=shared
patterns=("\.\./$sib" "/work/$sib" "s3r-paper\.txt")
regex=$(IFS='|'; echo "${patterns[*]}")
cd "$(git -C "$src" rev-parse --show-toplevel)" || exit 1
# Tracked files present in the work tree (a file deleted but not yet committed is skipped).
hits=$(git ls-files -z | xargs -0 -r grep -n -I -s -E "$regex" -- || true)
if [ -n "$hits" ]; then
  echo "tracked files refer to paths outside the repository ($(echo "$hits" | wc -l) lines):"
  echo "$hits"
  exit 1
fi
echo "ok: $(git ls-files | wc -l) tracked files, none refers to a path outside the repository"
