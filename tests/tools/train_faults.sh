#!/usr/bin/env bash
# Faults a user or a machine inflicts on `s3r train`, end to end. Each case checks that
# the error is one clear line with exit status 1 and that every earlier run and checkpoint is
# intact, or that the run continues bit for bit.
# Usage: train_faults.sh S3R_BINARY DATA_DIR WORK_DIR CASE
#   CASE: kill_resume | busy_folder | reused_folder | bad_options | null_losses | threads
set -uo pipefail
s3r=$1; data=$2; work=$3; case=$4
rm -rf "$work"; mkdir -p "$work"
common=(--preset tiny --vocab 300 --data "$data" --warmup 2)
fail() { echo "FAIL ($case): $*"; exit 1; }
unset S3R_TEST_PAUSE_AT S3R_TEST_PAUSE_FILE  # only kill_at arms the pause hook
# shellcheck source-path=SCRIPTDIR source=kill_at.sh
source "$(dirname "$0")/kill_at.sh"

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

# The checkpoints in run folder $1: NAME(STEP) for a complete one (its meta.json written, STEP
# 0-based), NAME(partial) for one without meta.json; in the order checkpoint, .tmp, .old.
checkpoints() {
  local name list=()
  for name in checkpoint checkpoint.tmp checkpoint.old; do
    [ -e "$1/$name" ] || continue
    if [ -f "$1/$name/meta.json" ]; then
      list+=("$name($(sed -n 's/^  "step": \([0-9]*\),$/\1/p' "$1/$name/meta.json"))")
    else
      list+=("$name(partial)")
    fi
  done
  echo "${list[*]}"
}

tree_sum() { (cd "$1" && find . -type f ! -name .lock -print0 | sort -z | xargs -0 md5sum); }

case $case in
kill_resume)
  # kill -9 at named moments of a run that checkpoints every 2 steps and validates every 5:
  # inside a step, inside each stage of a checkpoint write, inside evaluations (the final one
  # too), resuming each time. Each kill is proven to land where it says (kill_at), and the
  # checkpoints it leaves and the step the next run resumes at are checked. In the end the
  # logged numbers and the weights equal those of an uninterrupted run, bit for bit.
  steps=40
  args=("${common[@]}" --steps "$steps" --eval-every 5 --checkpoint-every 2)
  "$s3r" train "${args[@]}" --out "$work/straight" > /dev/null || fail "straight run failed"
  run="$work/killed"
  # POINT:N (the Nth arrival in that process), the step the run resumes at (- for a fresh run),
  # steps done when killed (its last progress line), the checkpoints left: NAME(last step, 0-based).
  kills=(
    "train-step:3              -  2  checkpoint(1)"
    "checkpoint-write:2        2  6  checkpoint(3) checkpoint.tmp(partial)"
    "eval-batch:3              4  5  checkpoint(3)"
    "checkpoint-before-swap:1  4  6  checkpoint(3) checkpoint.tmp(5)"
    "checkpoint-swap-renames:2 6  10 checkpoint.tmp(9) checkpoint.old(7)"
    "checkpoint-swapped:1      10 12 checkpoint(11) checkpoint.old(9)"
    "train-step:5              12 16 checkpoint(15)"
    "eval-batch:36             16 40 checkpoint(39)"  # the final evaluation (4 * 8 batches before it)
  )
  k=0
  for row in "${kills[@]}"; do
    k=$((k + 1))
    read -r at resumed after want <<<"$row"
    extra=(); [ "$resumed" = - ] || extra=(--resume "$run")
    kill_at "$at" "$work/kill$k.log" -- "$s3r" train "${args[@]}" --out "$run" "${extra[@]}"
    log=$(cat "$work/kill$k.log")
    if [ "$resumed" != - ]; then
      grep -q "^resumed from .* at step $resumed\$" <<<"$log" \
        || fail "kill $k: expected a resume at step $resumed: $(grep -E '^(run folder|resumed|s3r: error)' <<<"$log")"
    fi
    got=$(grep -oE '^step +[0-9]+/' <<<"$log" | tail -1 | tr -dc 0-9)
    [ "$got" = "$after" ] || fail "kill $k at $at: killed after ${got:-no} steps, expected $after"
    [ "$(checkpoints "$run")" = "$want" ] || fail "kill $k at $at: left '$(checkpoints "$run")', expected '$want'"
    echo "kill $k at $at (after $after steps): left $want"
  done
  out=$("$s3r" train "${args[@]}" --out "$run" --resume "$run" 2>&1) || fail "final resume failed: $out"
  grep -q "^resumed from .* at step $steps\$" <<<"$out" || fail "the final resume did not start at step $steps: $out"
  diff <(numbers "$work/straight/metrics.jsonl") <(numbers "$run/metrics.jsonl") \
    || fail "the killed and resumed run logged other numbers than the straight one"
  cmp "$work/straight/checkpoint/model.safetensors" "$run/checkpoint/model.safetensors" \
    || fail "final weights differ"
  [ "$(checkpoints "$run")" = "checkpoint(39)" ] || fail "leftovers after the final resume: $(checkpoints "$run")"
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
  # Capped as AVX-512 VNNI without AMX, the int8 mode runs s3r's VNNI GEMM: skipped (77) on a CPU
  # without AVX-512 VNNI, where the cap could not reach it.
  if [ "${S3R_MAX_ISA:-}" = avx512_bf16 ] && ! grep -qw avx512_vnni /proc/cpuinfo; then
    echo "skip ($case): this CPU has no AVX-512 VNNI, so S3R_MAX_ISA=avx512_bf16 cannot run s3r's VNNI GEMM"
    exit 77
  fi
  for mode in "s3r --correction dx" "bf16 --correction none" "f32 --correction none"; do
    for t in 1 2 3; do
      # shellcheck disable=SC2086
      OMP_NUM_THREADS=$t "$s3r" train "${common[@]}" --layers 1 --width 256 --heads 4 --ffn 768 --seq-len 128 \
        --batch 8 --steps 3 --eval-every 2 --eval-batches 1 --mode $mode --out "$work/${mode%% *}-$t" \
        > "$work/${mode%% *}-$t.log" 2>&1 || fail "$mode with $t threads failed: $(tail -3 "$work/${mode%% *}-$t.log")"
      # Capped (S3R_MAX_ISA): the run must say it used that tier's kernels (avx512_bf16: the
      # avx512 tier) and, as AVX-512 VNNI without AMX, s3r's VNNI GEMM.
      if [ -n "${S3R_MAX_ISA:-}" ]; then
        grep -q "kernels ${S3R_MAX_ISA%_bf16};" "$work/${mode%% *}-$t.log" \
          || fail "S3R_MAX_ISA=$S3R_MAX_ISA but the run's machine line says: $(grep machine "$work/${mode%% *}-$t.log")"
        [ "$S3R_MAX_ISA" != avx512_bf16 ] || grep -q "GEMM int8 vnni" "$work/${mode%% *}-$t.log" \
          || fail "S3R_MAX_ISA=avx512_bf16 but the int8 GEMM is not s3r's VNNI one: $(grep machine "$work/${mode%% *}-$t.log")"
      fi
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
