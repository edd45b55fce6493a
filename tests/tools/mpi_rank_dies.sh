#!/usr/bin/env bash
# A rank that dies mid-run (kill -9, as the OOM killer or a lost host would) makes the other
# ranks stop instead of hanging in a collective, with a message naming the dead rank; the run's
# last checkpoint survives and resumes .
# Usage: mpi_rank_dies.sh S3R_BINARY DATA_DIR WORK_DIR MPIRUN
set -uo pipefail
s3r=$1; data=$2; work=$3; mpirun=$4
rm -rf "$work"; mkdir -p "$work"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
fail() { echo "FAIL: $*"; exit 1; }
common=(--preset tiny --vocab 300 --data "$data" --warmup 2 --batch 16 --eval-every 0 --eval-batches 1)
# Long enough never to finish by itself; a checkpoint every 5 steps.
"$mpirun" -np 2 --oversubscribe --bind-to none -x OMP_NUM_THREADS=1 "$s3r" train "${common[@]}" \
  --steps 1000000 --checkpoint-every 5 --out "$work/run" > "$work/run.log" 2>&1 &
launcher=$!
rank_pid() {  # the pid of the s3r process whose OMPI_COMM_WORLD_RANK is $1
  local p
  for p in $(pgrep -f -- "--out $work/run"); do
    [ "$p" = "$launcher" ] && continue
    tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$1" && { echo "$p"; return; }
  done
}
for _ in $(seq 1 600); do  # until 12 steps are done (a checkpoint exists), at most 60 s
  grep -q "step     12/" "$work/run.log" 2>/dev/null && break
  kill -0 $launcher 2>/dev/null || fail "the run ended before the kill: $(tail -5 "$work/run.log")"
  sleep 0.1
done
grep -q "step     12/" "$work/run.log" || fail "no 12 steps in 60 s: $(tail -5 "$work/run.log")"
victim=$(rank_pid 1)
[ -n "$victim" ] || fail "rank 1's process not found"
kill -9 "$victim"
# Rank 0 is blocked in a collective now; mpirun must end it (the test fails if it hangs 60 s).
for _ in $(seq 1 600); do kill -0 $launcher 2>/dev/null || break; sleep 0.1; done
if kill -0 $launcher 2>/dev/null; then
  pkill -9 -f -- "--out $work/run"; kill -9 $launcher
  fail "rank 0 still runs 60 s after rank 1 was killed: $(tail -3 "$work/run.log")"
fi
wait $launcher; rc=$?
[ $rc != 0 ] || fail "mpirun exited 0 after a rank died"
grep -qiE "rank 1 .*(signal 9|killed)" "$work/run.log" || fail "no message naming rank 1: $(tail -8 "$work/run.log")"
[ -z "$(pgrep -f -- "--out $work/run")" ] || fail "s3r processes left behind"
# Nothing lost but the steps since the last checkpoint: one process resumes the run.
# rank 0 may have been killed mid-save (between renames, or with a complete checkpoint.tmp):
# the resumed run must pick the newest complete checkpoint, of a step that is a multiple of 5
# and at least 10 (12 steps ran before the kill), and continue from there.
"$s3r" train "${common[@]}" --steps 1000000 --out "$work/run" --resume "$work/run" > "$work/resume.log" 2>&1 &
resumed=$!
for _ in $(seq 1 300); do grep -q "^step " "$work/resume.log" 2>/dev/null && break; sleep 0.1; done
kill -9 $resumed 2>/dev/null; wait $resumed 2>/dev/null
at=$(sed -n 's/^resumed from .* at step \([0-9]*\)$/\1/p' "$work/resume.log")
[ -n "$at" ] || fail "the run did not resume after the kill: $(tail -3 "$work/resume.log")"
[ $(( at % 5 )) = 0 ] && [ "$at" -ge 10 ] || fail "resumed at step $at, not at a checkpoint of step >= 10"
grep -q "^step *$((at + 1))/" "$work/resume.log" || fail "no step after resuming at $at: $(tail -3 "$work/resume.log")"
echo "ok: rank 1 killed with signal 9; mpirun ended rank 0 (exit $rc), and the run resumed"
