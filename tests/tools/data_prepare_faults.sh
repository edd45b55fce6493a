#!/usr/bin/env bash
# `s3r data prepare` faults through the tool. Usage: data_prepare_faults.sh S3R_BINARY WORK_DIR
#  - kill -9 at each named moment of a prepare into an existing dataset (while it writes, before
#    the swap, between the renames, after the swap) leaves either the old dataset or the
#    complete new one (byte-identical), never a mix, and the next prepare cleans up what the
#    killed one left beside it;
#  - unknown files in an input folder are skipped with a warning on stderr;
#  - a truncated .gz, a binary file under a text name and a vocabulary too large for the text
#    are one-line errors naming the file or option, with no SentencePiece internals.
set -euo pipefail
s3r=$1; work=$2
fail() { echo "FAIL: $*"; exit 1; }
unset S3R_TEST_PAUSE_AT S3R_TEST_PAUSE_FILE  # only kill_at arms the pause hook
# shellcheck source-path=SCRIPTDIR source=kill_at.sh
source "$(dirname "$0")/kill_at.sh"
rm -rf "$work"; mkdir -p "$work/in"
cd "$work"
awk 'BEGIN { srand(1); n = split("the quantized gradient rounds up down stochastic shared threshold token error mean layer model training loss correction example channel width", w, " ");
             for (d = 0; d < 3000; d++) { line = ""; for (i = 0; i < 40; i++) line = line w[int(rand() * n) + 1] " "; print line; print "" } }' > in/corpus.txt
printf '\x89PNG\r\n\x1a\n\0\0\0' > in/photo.png

# The old dataset, and the new one a complete run writes (prepare is deterministic).
"$s3r" data prepare in --out data --vocab 300 > prepare.log 2> prepare.err
grep -q "^s3r: warning: skipping 'in/photo.png'" prepare.err || fail "no warning for in/photo.png: $(cat prepare.err)"
[ "$(grep -cv '^s3r: warning' prepare.err || true)" = 0 ] || fail "unexpected stderr: $(cat prepare.err)"
cp -a data old
"$s3r" data prepare in --out ref --vocab 400 > /dev/null 2>&1
diff -rq old ref > /dev/null && fail "the two vocabularies give the same dataset"

# kill -9 at each named moment of a prepare of the new dataset into 'data' (kill_at proves it
# landed there), then checks of what it left: 'data' is the old or the new dataset, never a mix,
# or (between the two renames of the fallback swap) absent with the old one under data.old-<pid>;
# the next prepare puts back or removes every leftover of a killed one.
same() { diff -r "$1" "$2" > /dev/null 2>&1; }
leftovers() { local l; for l in data.*; do [ -e "$l" ] && echo "$l"; done; true; }
prepare_new=("$s3r" data prepare in --out data --vocab 400)
# Shards written, info.json not: the old dataset in place, the partial new one beside it.
kill_at prepare-write kill1.log -- "${prepare_new[@]}"
same data old || fail "prepare-write: 'data' is not the old dataset"
[ "$(leftovers)" = "data.tmp-$killed_pid" ] || fail "prepare-write: leftovers $(leftovers)"
if [ ! -f "data.tmp-$killed_pid/train.bin" ] || [ -e "data.tmp-$killed_pid/info.json" ]; then
  fail "prepare-write: data.tmp-$killed_pid is not the partial new dataset"
fi
pid1=$killed_pid
# Between the two renames (arming this point makes prepare take the two-rename path): 'data' is
# missing, the old dataset is data.old-<pid>. The next prepare cleans the earlier leftovers.
kill_at prepare-swap-renames kill2.log -- "${prepare_new[@]}"
grep -q "removed '.*/data.tmp-$pid1', left by a killed prepare" kill2.log \
  || fail "prepare-swap-renames: data.tmp-$pid1 was not removed: $(cat kill2.log)"
[ ! -e data ] || fail "prepare-swap-renames: 'data' still exists"
if ! same "data.old-$killed_pid" old || ! same "data.tmp-$killed_pid" ref; then
  fail "prepare-swap-renames: data.old-$killed_pid / data.tmp-$killed_pid are not the old / new dataset"
fi
[ "$(leftovers | wc -l)" = 2 ] || fail "prepare-swap-renames: leftovers $(leftovers)"
pid2=$killed_pid
# The new dataset complete and verified, nothing replaced yet: the old dataset, put back first.
kill_at prepare-before-swap kill3.log -- "${prepare_new[@]}"
grep -q "restored '.*/data' from '.*/data.old-$pid2', left by a killed prepare" kill3.log \
  || fail "prepare-before-swap: the old dataset was not restored: $(cat kill3.log)"
same data old || fail "prepare-before-swap: 'data' is not the old dataset"
same "data.tmp-$killed_pid" ref || fail "prepare-before-swap: data.tmp-$killed_pid is not the new dataset"
[ "$(leftovers)" = "data.tmp-$killed_pid" ] || fail "prepare-before-swap: leftovers $(leftovers)"
# Swapped, the old dataset not yet removed (under data.tmp-<pid> after an exchange, or
# data.old-<pid> after two renames): the new dataset in place.
kill_at prepare-swapped kill4.log -- "${prepare_new[@]}"
same data ref || fail "prepare-swapped: 'data' is not the new dataset"
if [ "$(leftovers | wc -l)" != 1 ] || ! same "$(leftovers)" old; then
  fail "prepare-swapped: the leftovers $(leftovers) are not the old dataset alone"
fi
echo "kills at prepare-write, -swap-renames, -before-swap, -swapped: each left the old or the new dataset"
# Back to the old dataset; a complete prepare removes the last leftover and swaps the new one in.
rm -rf data; cp -a old data
"$s3r" data prepare in --out data --vocab 400 > final.log 2>&1
diff -r data ref > /dev/null || fail "the run after the kills did not write the new dataset"
[ -z "$(leftovers)" ] || fail "leftovers $(leftovers) after a complete run"

# One-line errors naming what is wrong.
expect_error() {  # REGEX COMMAND...
  local regex=$1; shift
  local out rc=0
  out=$("$@" 2>&1) || rc=$?
  [ "$rc" = 1 ] || fail "exit status $rc, expected 1: $* -> $out"
  grep -Eq -- "^s3r: error: $regex" <<<"$out" || fail "output does not match /$regex/: $* -> $out"
  if grep -Eq 'internal error|\.cc\(|LOG\(' <<<"$out"; then fail "internals in the output: $out"; fi
}
mkdir -p bad
head -c 20000 in/corpus.txt | gzip -c | head -c 3000 > bad/cut.txt.gz
expect_error "data prepare: 'bad/cut.txt.gz' is a truncated or corrupt gzip file" \
  "$s3r" data prepare bad/cut.txt.gz --out data --vocab 400
printf 'text\0binary\n' > bad/blob.txt
expect_error "data prepare: 'bad/blob.txt' holds a NUL byte" "$s3r" data prepare in bad/blob.txt --out data --vocab 400
expect_error "data prepare: --vocab 100000 is too large for this text: .*hint: use --vocab [0-9]+ or less" \
  "$s3r" data prepare in --out data --vocab 100000
expect_error "data prepare: --vocab 100 is out of range" "$s3r" data prepare in --out data --vocab 100
expect_error "data prepare: --out 'in' holds '" "$s3r" data prepare in --out in
diff -r data ref > /dev/null || fail "a failed prepare changed the dataset"
for left in data.*; do [ -e "$left" ] && fail "leftover $left after a failed run"; done
echo "data prepare faults: ok"
