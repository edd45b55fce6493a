#!/usr/bin/env bash
# Faults a user or a machine inflicts on `s3r train`, end to end (issue 10). Each case checks that
# the error is one clear line with exit status 1 and that every earlier run and checkpoint is
# intact, or that the run continues bit for bit.
# Usage: train_faults.sh S3R_BINARY DATA_DIR WORK_DIR CASE
#   CASE: kill_resume | busy_folder | reused_folder | bad_options | null_losses | threads
set -uo pipefail
s3r=$1; data=$2; work=$3; case=$4
rm -rf "$work"; mkdir -p "$work"
common=(--preset tiny --vocab 300 --data "$data" --warmup 2)
fail() { echo "FAIL ($case): $*"; exit 1; }

# The logged numbers of a run (steps and validations), without the timings.
numbers() {
  python3 - "$1" <<'EOF'
import json, sys
for line in open(sys.argv[1]):
    j = json.loads(line)
    j.pop("ms", None); j.pop("tokens_per_s", None)
    print(json.dumps(j, sort_keys=True))
EOF
}

# expect RC REGEX -- COMMAND...: exit status RC and output matching REGEX.
expect() {
  local rc=$1 regex=$2; shift 3
  local out; out=$("$@" 2>&1); local got=$?
  [ "$got" = "$rc" ] || fail "exit status $got, expected $rc: $*"$'\n'"$out"
  grep -Eq -- "$regex" <<<"$out" || fail "output does not match /$regex/: $*"$'\n'"$out"
}

tree_sum() { (cd "$1" && find . -type f ! -name .lock -print0 | sort -z | xargs -0 md5sum); }

case $case in
kill_resume)
  # kill -9 at random moments of a run that checkpoints every 2 steps (inside steps, inside
  # checkpoint writes, inside evaluations), resume each time; the logged numbers equal those of
  # an uninterrupted run, bit for bit. Kill points are chosen by progress (lines in
  # metrics.jsonl) plus a random delay, so the test is bounded on slow and fast machines alike.
  steps=40
  args=("${common[@]}" --steps $steps --eval-every 5 --checkpoint-every 2)
  "$s3r" train "${args[@]}" --out "$work/straight" > /dev/null || fail "straight run failed"
  RANDOM=10  # a fixed sequence of kill points
  run="$work/killed"
  for kill in 1 2 3 4 5 6 7 8; do
    target=$(( (kill * steps) / 10 + RANDOM % 4 ))
    extra=""
    if [ -e "$run/checkpoint" ] || [ -e "$run/checkpoint.tmp" ] || [ -e "$run/checkpoint.old" ]; then
      extra="--resume $run"
    elif [ -e "$run" ]; then
      extra="--overwrite"
    fi
    # shellcheck disable=SC2086
    "$s3r" train "${args[@]}" --out "$run" $extra > "$work/kill$kill.log" 2>&1 &
    pid=$!
    for _ in $(seq 1 3000); do  # at most 30 s
      lines=$( (wc -l < "$run/metrics.jsonl") 2>/dev/null || echo 0)
      [ "$lines" -ge "$target" ] && break
      kill -0 $pid 2>/dev/null || break
      sleep 0.01
    done
    sleep "0.0$(( RANDOM % 10 ))"
    kill -9 $pid 2>/dev/null
    wait $pid 2>/dev/null
    echo "kill $kill: at about metrics line $target; left: $(ls "$run" | tr '\n' ' ')"
  done
  out=$("$s3r" train "${args[@]}" --out "$run" --resume "$run" 2>&1); rc=$?
  if [ $rc != 0 ]; then grep -q "already finished" <<<"$out" || fail "final resume failed: $out"; fi
  diff <(numbers "$work/straight/metrics.jsonl") <(numbers "$run/metrics.jsonl") \
    || fail "the killed and resumed run logged other numbers than the straight one"
  cmp "$work/straight/checkpoint/model.safetensors" "$run/checkpoint/model.safetensors" \
    || fail "final weights differ"
  ;;
busy_folder)
  # A second trainer on a folder in use is refused; the first finishes undisturbed.
  "$s3r" train "${common[@]}" --steps 400 --eval-every 0 --out "$work/run" > "$work/first.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 3000); do [ -s "$work/run/metrics.jsonl" ] && break; sleep 0.01; done
  expect 1 "'$work/run' is in use by another s3r process \\(pid $pid\\)" -- \
    "$s3r" train "${common[@]}" --steps 4 --out "$work/run" --overwrite
  expect 1 "in use by another s3r process" -- "$s3r" train "${common[@]}" --steps 4 --out "$work/run" --resume "$work/run"
  wait $pid || fail "the first trainer failed: $(cat "$work/first.log")"
  test "$(grep -c '"loss"' "$work/run/metrics.jsonl")" = 400 || fail "the first trainer's metrics were disturbed"
  ;;
reused_folder)
  # A finished run's folder given again without --resume: refused, left byte for byte.
  "$s3r" train "${common[@]}" --steps 3 --out "$work/run" > /dev/null || fail "first run failed"
  before=$(tree_sum "$work/run")
  expect 1 "already holds a run .*--resume .*--overwrite" -- "$s3r" train "${common[@]}" --steps 3 --out "$work/run"
  [ "$(tree_sum "$work/run")" = "$before" ] || fail "the refused run changed the folder"
  expect 1 "already finished at step 3" -- "$s3r" train "${common[@]}" --steps 3 --out "$work/run" --resume "$work/run"
  expect 0 "removed the earlier run" -- "$s3r" train "${common[@]}" --steps 2 --out "$work/run" --overwrite
  test "$(grep -c '"loss"' "$work/run/metrics.jsonl")" = 2 || fail "--overwrite kept old metrics"
  ;;
bad_options)
  # Non-finite and out-of-range numbers, and a validation shard shorter than one window: one
  # line, exit 1, before any step (no run folder is created).
  expect 1 "train: --lr must be a finite number, got 'nan'" -- "$s3r" train "${common[@]}" --lr nan --out "$work/r1"
  expect 1 "train: --lr must be <= 1, got 1e30" -- "$s3r" train "${common[@]}" --lr 1e30 --out "$work/r1"
  expect 1 "--lr must be a number in \\(0, 1\\], got 0" -- "$s3r" train "${common[@]}" --lr 0 --out "$work/r1"
  expect 1 "--min-lr must be a number in \\[0, --lr\\]" -- "$s3r" train "${common[@]}" --min-lr 0.5 --out "$work/r1"
  expect 1 "train: --steps must be an integer, got '1e3'" -- "$s3r" train "${common[@]}" --steps 1e3 --out "$work/r1"
  expect 1 "--clip must be a finite number" -- "$s3r" train "${common[@]}" --clip inf --out "$work/r1"
  expect 1 "--eval-batches must be >= 1" -- "$s3r" train "${common[@]}" --eval-batches 0 --out "$work/r1"
  expect 1 "--schedule-steps must be >= 0" -- "$s3r" train "${common[@]}" --schedule-steps -5 --out "$work/r1"
  expect 1 "the validation shard holds .* tokens, fewer than one window" -- \
    "$s3r" train "${common[@]}" --seq-len 4000 --heads 4 --batch 1 --out "$work/r1"
  [ ! -e "$work/r1" ] || fail "a refused run created its folder"
  ;;
null_losses)
  # Non-finite losses are null in metrics.jsonl; the loss plot leaves them out instead of failing.
  "$s3r" train "${common[@]}" --steps 4 --schedule-steps 6 --out "$work/run" > /dev/null || fail "run failed"
  # Lines of step 3 (0-based; covered by the checkpoint, so a resume keeps them).
  printf '%s\n' '{"step":3,"val_loss":null}' '{"step":3,"loss":null,"skipped":false}' >> "$work/run/metrics.jsonl"
  expect 0 "summary: final validation loss" -- "$s3r" train "${common[@]}" --steps 6 --out "$work/run" --resume "$work/run"
  grep -q '"val_loss":null' "$work/run/metrics.jsonl" || fail "the null validation line was lost"
  ;;
threads)
  # Every logged number is the same for 1, 2 and 3 threads, in an int8, the bf16 and the f32 mode.
  # The shape (C = 256, F = 768, T = 1024) is one where oneDNN's bf16 kernels split the dW sums
  # over T by thread count on AVX-512 BF16 CPUs (s3r/gemm/matmul.cpp runs those in fixed tiles).
  for mode in "s3r --correction dx" "bf16 --correction none" "f32 --correction none"; do
    for t in 1 2 3; do
      # shellcheck disable=SC2086
      OMP_NUM_THREADS=$t "$s3r" train "${common[@]}" --layers 1 --width 256 --heads 4 --ffn 768 --seq-len 128 \
        --batch 8 --steps 3 --eval-every 2 --eval-batches 1 --mode $mode --out "$work/${mode%% *}-$t" > /dev/null \
        || fail "$mode with $t threads failed"
      numbers "$work/${mode%% *}-$t/metrics.jsonl" > "$work/${mode%% *}-$t.txt"
    done
    for t in 2 3; do
      diff "$work/${mode%% *}-1.txt" "$work/${mode%% *}-$t.txt" > /dev/null \
        || fail "mode ${mode%% *}: $t threads log other numbers than 1 thread"$'\n'"$(diff "$work/${mode%% *}-1.txt" "$work/${mode%% *}-$t.txt" | head -4)"
    done
  done
  ;;
*) fail "unknown case" ;;
esac
echo "ok: $case"
