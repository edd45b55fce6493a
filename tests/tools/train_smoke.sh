#!/usr/bin/env bash
# End to end through the `s3r` tool: prepare a small corpus, train the tiny model, stop and
# resume, and check the run folder. Usage: train_smoke.sh S3R_BINARY WORK_DIR
set -euo pipefail
s3r=$1; work=$2
rm -rf "$work"; mkdir -p "$work"
words=(the quantized gradient rounds up down stochastic shared threshold token error mean layer
       model training loss correction example channel width)
for d in $(seq 1 300); do
  line=""
  for w in $(seq 1 40); do line+="${words[$(( (d * 7 + w * w * 3) % ${#words[@]} ))]} "; done
  printf '%s\n\n' "$line"
done > "$work/corpus.txt"
"$s3r" data prepare "$work/corpus.txt" --out "$work/data" --vocab 300 > "$work/prepare.log"
grep -q "wrote .* training and .* validation tokens" "$work/prepare.log"
common=(--preset tiny --vocab 300 --data "$work/data" --eval-every 5 --warmup 2 --lr 3e-3)
"$s3r" train "${common[@]}" --steps 12 --out "$work/run" > "$work/full.log"
grep -q "summary: final validation loss" "$work/full.log"
grep -q "unigram entropy" "$work/full.log"
test -f "$work/run/checkpoint/model.safetensors"
test -f "$work/run/checkpoint/optimizer.safetensors"
test "$(grep -c '"loss"' "$work/run/metrics.jsonl")" = 12
# 6 steps (of a 12-step schedule), then resume to 12: the same final validation loss.
"$s3r" train "${common[@]}" --steps 6 --schedule-steps 12 --out "$work/resumed" > /dev/null
"$s3r" train "${common[@]}" --steps 12 --out "$work/resumed" --resume "$work/resumed" > "$work/resumed.log"
grep -q "resumed from" "$work/resumed.log"
a=$(grep "summary" "$work/full.log" | awk '{print $5}')
b=$(grep "summary" "$work/resumed.log" | awk '{print $5}')
[ "$a" = "$b" ] || { echo "resumed final loss $b differs from straight $a"; exit 1; }
if command -v gnuplot >/dev/null; then test -f "$work/run/loss.png"; fi
echo "train smoke: ok (final validation loss $a)"
