#!/usr/bin/env bash
# The vector tiers' attention kernels still prefetch once compiled. GCC 12 takes a function whose
# only effect is __builtin_prefetch (_mm_prefetch) for pure and drops the calls to it: every
# prefetch of kernels/attention_rows.hpp once compiled to nothing, silently (results do not
# change, only the time). The tiers now prefetch by volatile asm; this check fails if a prefetch
# helper goes back to a form the compiler may drop. Usage: prefetches_compiled.sh LIBRARY (the
# static libs3r.a); prints the prefetches per tier object, exits 1 if a tier built into the
# library has none, 77 (skipped) without objdump.
set -uo pipefail
lib=$(realpath "${1:?usage: prefetches_compiled.sh LIBRARY}") || exit 1
command -v objdump > /dev/null || { echo "objdump not found: skipped"; exit 77; }
members=$(ar t "$lib") || exit 1
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
bad=0; tiers=0
for obj in attention_avx2.cpp.o attention_avx512.cpp.o; do
  grep -qx "$obj" <<< "$members" || continue  # this build has no such tier
  tiers=$((tiers + 1))
  (cd "$tmp" && ar x "$lib" "$obj") || exit 1  # only this member: the sanitizer build's library is large
  n=$(objdump -d "$tmp/$obj" | grep -c 'prefetcht[0-2]')
  echo "$obj: $n prefetch instructions"
  [ "$n" -gt 0 ] || { echo "  none: the compiler dropped the attention prefetches"; bad=1; }
done
[ "$tiers" -gt 0 ] || { echo "no vector attention tier in $lib: skipped"; exit 77; }
exit $bad
