#!/usr/bin/env bash
# Data-parallel training is bit-identical for any number of ranks (SPEC section 6):
# every logged number (losses, gradient norms, validation losses) of `mpirun -np 2` and
# `mpirun -np 4` equals one process's without mpirun, in the default mode, two-way correction,
# sr and bf16, and with Qwen3's, Gemma 3's and Qwen3-MoE's blocks; and with --micro-batch, R = 1, 2, 4 agree with each other. Matching bits alone do
# not show that the ranks split the work, so mpi_work_split.py also checks each rank's tokens, its
# AdamW moments (whole, or a 1/R share with --shard-optimizer) and the bytes sent per step
# against docs/DISTRIBUTED.md's formula. Also: an error on one rank ends every rank with a
# message naming it.
# Usage: mpi_bit_identity.sh S3R_BINARY DATA_DIR WORK_DIR MPIRUN
set -uo pipefail
s3r=$1; data=$2; work=$3; mpirun=$4
rm -rf "$work"; mkdir -p "$work"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
common=(--preset tiny --vocab 300 --data "$data" --warmup 2 --batch 16 --eval-every 2 --eval-batches 1)
fail() { echo "FAIL: $*"; exit 1; }
numbers() {
  python3 - "$1" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    j = json.loads(line); j.pop("ms", None); j.pop("tokens_per_s", None); j.pop("sent_bytes", None)
    print(json.dumps(j, sort_keys=True))
PY
}
run() {  # run NAME RANKS ARGS...: RANKS 0 = no mpirun; 3 steps unless STEPS says otherwise
  local name=$1 ranks=$2; shift 2
  set -- --steps "${STEPS:-3}" "$@"
  if [ "$ranks" = 0 ]; then
    OMP_NUM_THREADS=2 "$s3r" train "${common[@]}" "$@" --out "$work/$name" > "$work/$name.log" 2>&1
  else
    "$mpirun" -np "$ranks" --oversubscribe --bind-to none -x OMP_NUM_THREADS=1 ${S3R_MAX_ISA:+-x S3R_MAX_ISA} \
      "$s3r" train "${common[@]}" "$@" --out "$work/$name" > "$work/$name.log" 2>&1
  fi || fail "$name failed:"$'\n'"$(tail -5 "$work/$name.log")"
  numbers "$work/$name/metrics.jsonl" > "$work/$name.txt"
}
work_split() {  # work_split NAME RANKS [--sharded]: the 3-step runs above (2 validations of 1 batch)
  local out
  out=$(python3 "$(dirname "$0")/mpi_work_split.py" "$work/$1.log" "$work/$1" "$2" 3 2 1 "${@:3}") \
    || fail "$1: the ranks did not split the work: $out"
  echo "$1: $out"
}
same() {  # the same logged numbers, and the same checkpoint bytes (weights, moments, meta.json)
  diff "$work/$1.txt" "$work/$2.txt" > /dev/null || fail "$2 logs other numbers than $1:"$'\n'"$(diff "$work/$1.txt" "$work/$2.txt" | head -4)"
  local f
  for f in model.safetensors optimizer.safetensors meta.json; do
    cmp -s "$work/$1/checkpoint/$f" "$work/$2/checkpoint/$f" || fail "$2's checkpoint/$f differs from $1's"
  done
}
for mode in "s3r --correction dx" "s3r --correction two-way" "sr --correction dx" "bf16 --correction none"; do
  m=${mode// /_}
  # shellcheck disable=SC2086
  { run "$m-1" 0 --mode $mode; run "$m-2" 2 --mode $mode; run "$m-4" 4 --mode $mode; }
  same "$m-1" "$m-2"; same "$m-1" "$m-4"
  case $m in *two-way*) ;; *) work_split "$m-2" 2; work_split "$m-4" 4 ;; esac  # two-way adds EC factors
done
# Qwen3's block (QK-norm: gains whose gradients are float partials summed per reduction leaf).
run qwen3-1 0 --arch qwen3; run qwen3-2 2 --arch qwen3; run qwen3-4 4 --arch qwen3
same qwen3-1 qwen3-2; same qwen3-1 qwen3-4
# Gemma 3's block: the tied head's gradient is reduced in its own slot and folded into the
# embedding's after the reduction (also after micro-batches); local layers with a window.
run gemma3-1 0 --arch gemma3; run gemma3-2 2 --arch gemma3; run gemma3-4 4 --arch gemma3
same gemma3-1 gemma3-2; same gemma3-1 gemma3-4
run gemma3-micro-1 0 --arch gemma3 --micro-batch 2; run gemma3-micro-4 4 --arch gemma3 --micro-batch 2
same gemma3-micro-1 gemma3-micro-4
# Qwen3-MoE: each rank routes its own tokens, so an expert can have no rows on a rank, which then
# still takes part in that expert's collectives (D's max, the int32 dW sums, two-way's factors);
# 64 experts of which each token picks 1 leave several empty per rank. The logged expert loads
# and balance losses are the whole batch's.
run moe-1 0 --arch qwen3moe; run moe-2 2 --arch qwen3moe; run moe-4 4 --arch qwen3moe
same moe-1 moe-2; same moe-1 moe-4
sparse=(--arch qwen3moe --experts 64 --experts-used 1 --mode s3r --correction two-way)
run moe-sparse-1 0 "${sparse[@]}"; run moe-sparse-4 4 "${sparse[@]}"
same moe-sparse-1 moe-sparse-4
python3 - "$work/moe-sparse-4/metrics.jsonl" <<'PY' || fail "no expert without rows on some rank: the test does not reach that path"
import json, sys
# 4 ranks x 4 examples of 32 tokens: an expert with fewer than 4 rows in the whole batch is empty on some rank.
loads = [b["min"] for line in open(sys.argv[1]) for b in json.loads(line).get("expert_load", [])]
sys.exit(0 if min(loads) < 4 else 1)
PY
# Its float modes: each rank's run of an expert's rows starts where it would in one process's
# products (the tile grid's row phase; AVX2's f32 kernels give a row at another place of a tile
# other bits), also with the kernels capped to AVX2.
moe_float=(--arch qwen3moe --experts 64 --experts-used 1 --mode bf16 --correction none)
run moe-bf16-1 0 "${moe_float[@]}"; run moe-bf16-4 4 "${moe_float[@]}"
same moe-bf16-1 moe-bf16-4
S3R_MAX_ISA=avx2 run moe-f32-avx2-1 0 "${moe_float[@]/bf16/f32}"
S3R_MAX_ISA=avx2 run moe-f32-avx2-4 4 "${moe_float[@]/bf16/f32}"
same moe-f32-avx2-1 moe-f32-avx2-4
grep -q "kernels avx2" "$work/moe-f32-avx2-4.log" || fail "the capped run does not say it runs the avx2 kernels"
# Resume with another R: 2 steps of the 3-step schedule in one process and the last under
# mpirun -np 2, or 2 steps under -np 4 and the last in one process: the straight run's numbers.
resume() {  # resume NAME RANKS_BEFORE RANKS_AFTER ARGS...
  local name=$1 before=$2 after=$3; shift 3
  STEPS=2 run "$name" "$before" --schedule-steps 3 "$@"
  run "$name" "$after" --resume "$work/$name" "$@"
  grep -q "resumed from" "$work/$name.log" || fail "$name did not resume"
}
resume resume-1to2 0 2; same s3r_--correction_dx-1 resume-1to2
resume resume-4to1 4 0; same s3r_--correction_dx-1 resume-4to1
# AdamW's moments sharded over the ranks: the same numbers and checkpoints; and a sharded run
# resumes under another R, sharded or not.
run shard-2 2 --shard-optimizer; same s3r_--correction_dx-1 shard-2
run shard-4 4 --shard-optimizer; same s3r_--correction_dx-1 shard-4
work_split shard-2 2 --sharded; work_split shard-4 4 --sharded
grep -q "AdamW moments sharded over the ranks" "$work/shard-4.log" || fail "the run does not say it shards"
resume resume-shard-4to2 4 2 --shard-optimizer; same s3r_--correction_dx-1 resume-shard-4to2
resume resume-shard-2to1 2 0 --shard-optimizer; same s3r_--correction_dx-1 resume-shard-2to1
grep -q "rank 1 .*thread" "$work/s3r_--correction_dx-2.log" || fail "the run does not print where rank 1 runs"
run micro-1 0 --micro-batch 2; run micro-2 2 --micro-batch 2; run micro-4 4 --micro-batch 2
same micro-1 micro-2; same micro-1 micro-4
work_split micro-2 2; work_split micro-4 4
resume resume-micro-2to1 2 0 --micro-batch 2; same micro-1 resume-micro-2to1
# The test can fail: a different micro-batch changes D, so the numbers must differ.
run micro4-1 0 --micro-batch 4
! diff -q "$work/micro-1.txt" "$work/micro4-1.txt" > /dev/null || fail "--micro-batch 4 and 2 log the same numbers"
# An error on every rank (an unusable --micro-batch) ends the run with one message naming a rank.
out=$("$mpirun" -np 2 --oversubscribe "$s3r" train "${common[@]}" --steps 3 --micro-batch 3 --out "$work/bad" 2>&1) \
  && fail "a bad --micro-batch under mpirun exited 0"
grep -q "error on rank [01] of 2: --micro-batch" <<<"$out" || fail "no message naming the rank:"$'\n'"$out"
echo "ok: 1, 2 and 4 ranks log the same numbers"
