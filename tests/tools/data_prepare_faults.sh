#!/usr/bin/env bash
# `s3r data prepare` faults through the tool (issue 10). Usage: data_prepare_faults.sh S3R_BINARY WORK_DIR
#  - kill -9 at several moments of a prepare into an existing dataset leaves either the old
#    dataset or the complete new one (byte-identical), never a mix, and the next prepare cleans
#    up what the killed one left beside it;
#  - unknown files in an input folder are skipped with a warning on stderr;
#  - a truncated .gz, a binary file under a text name and a vocabulary too large for the text
#    are one-line errors naming the file or option, with no SentencePiece internals.
set -euo pipefail
s3r=$1; work=$2
rm -rf "$work"; mkdir -p "$work/in"
cd "$work"
fail() { echo "FAIL: $*"; exit 1; }
awk 'BEGIN { srand(1); n = split("the quantized gradient rounds up down stochastic shared threshold token error mean layer model training loss correction example channel width", w, " ");
             for (d = 0; d < 3000; d++) { line = ""; for (i = 0; i < 40; i++) line = line w[int(rand() * n) + 1] " "; print line; print "" } }' > in/corpus.txt
printf '\x89PNG\r\n\x1a\n\0\0\0' > in/photo.png

# The old dataset, and the new one a complete run writes (prepare is deterministic).
"$s3r" data prepare in --out data --vocab 300 > prepare.log 2> prepare.err
grep -q "^s3r: warning: skipping 'in/photo.png'" prepare.err || fail "no warning for in/photo.png: $(cat prepare.err)"
[ "$(grep -cv '^s3r: warning' prepare.err || true)" = 0 ] || fail "unexpected stderr: $(cat prepare.err)"
cp -a data old
start=$(date +%s.%N)
"$s3r" data prepare in --out ref --vocab 400 > /dev/null 2>&1
full=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
diff -rq old ref > /dev/null && fail "the two vocabularies give the same dataset"
seen_old=0; seen_new=0
for frac in 0.1 0.3 0.5 0.7 0.85 0.95 1.1; do
  "$s3r" data prepare in --out data --vocab 400 > /dev/null 2>&1 &
  pid=$!
  sleep "$(awk -v a="$full" -v f="$frac" 'BEGIN { printf "%.3f", a * f }')"
  kill -9 "$pid" 2> /dev/null || true
  wait "$pid" 2> /dev/null || true
  if diff -r data old > /dev/null 2>&1; then
    seen_old=$((seen_old + 1))
  elif diff -r data ref > /dev/null 2>&1; then
    seen_new=$((seen_new + 1))
    rm -rf data; cp -a old data
  else
    ls -la data || true
    fail "after kill -9 at $frac of a run, 'data' is neither the old nor the new dataset"
  fi
  for left in data.*; do
    [ -e "$left" ] || continue
    [ "$left" = "data.tmp-$pid" ] || fail "unexpected leftover $left (the killed process was $pid)"
  done
done
echo "kills: $seen_old left the old dataset, $seen_new the new one (a full run takes $full s)"
[ "$seen_old" -ge 1 ] || fail "no kill landed before the swap"
"$s3r" data prepare in --out data --vocab 400 > final.log 2>&1
diff -r data ref > /dev/null || fail "the run after the kills did not write the new dataset"
for left in data.*; do [ -e "$left" ] && fail "leftover $left after a complete run"; done

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
