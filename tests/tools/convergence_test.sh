#!/usr/bin/env bash
# scripts/convergence.py end to end on the tiny model and the train_smoke.sh corpus: a small
# study (2 learning rates, 2 seeds, 3 configurations, a width sweep: 13 runs), its tables and plot, then
# a second invocation that must reuse every run, an interrupted run that must resume bit-exactly,
# options that must not reuse runs made with others; plus the t-tests against known values.
# Usage: convergence_test.sh S3R_BINARY TRAIN_SMOKE_DIR REPO
set -euo pipefail
s3r=$1; work=$2; repo=$3
out="$work/study"
rm -rf "$out"
args=(--s3r "$s3r" --out "$out" --data "$work/data" --preset tiny --vocab 300 --seq-len 0 --batch 0
      --width 64 --steps 12 --warmup 2 --lrs 1e-3,3e-3 --seeds 2 --configs bf16,sr,s3r+dx --widths 32,64
      --eval-every 6 --eval-batches 2 --checkpoint-every 6 --jobs 2)
python3 "$repo/scripts/convergence.py" "${args[@]}" > "$work/study1.log"
grep -q "study: 13 runs planned (0 already done" "$work/study1.log"
for f in table1.md table1.csv lr_sweep.csv width.md width.csv study.json; do test -s "$out/$f"; done
if command -v gnuplot >/dev/null; then test -s "$out/val_curves.png"; fi
python3 "$repo/scripts/convergence.py" "${args[@]}" > "$work/study2.log"
grep -q "study: 13 runs planned (13 already done, reused)" "$work/study2.log"
grep -q "ran 0 runs" "$work/study2.log"
# An interrupted run resumes from its checkpoint and ends bit-exactly where it ended straight.
python3 - "$out/runs/sr/lr=0.003/seed=0" <<'PY'
import json, shutil, subprocess, sys
run = sys.argv[1]
done = json.load(open(run + "/done.json"))
argv = done["argv"]
argv[argv.index("--steps") + 1] = "6"  # stopped after 6 of its 12 steps, with a checkpoint
argv += ["--schedule-steps", "12"]
shutil.rmtree(run)
subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
json.dump(done["final_val_loss"], open(run + ".want", "w"))
PY
python3 "$repo/scripts/convergence.py" "${args[@]}" > "$work/study3.log"
grep -q "ran 1 runs" "$work/study3.log"
grep -q "resumed from" "$out/runs/sr/lr=0.003/seed=0/train.log"
python3 -c "import json,sys; r='$out/runs/sr/lr=0.003/seed=0'; w=json.load(open(r+'.want')); g=json.load(open(r+'/done.json'))['final_val_loss']; sys.exit(0 if g == w else f'resumed {g} != straight {w}')"
# Finished runs made with other options are not silently reused.
if python3 "$repo/scripts/convergence.py" "${args[@]}" --warmup 3 > "$work/other.log" 2>&1; then
  echo "FAIL: runs of other options were reused"; exit 1
fi
grep -q "was trained with other options" "$work/other.log"
# --arch reaches s3r train (a family's run of one step; llama's argv has no --arch, so the
# studies above, and any made before the option, are reused).
python3 "$repo/scripts/convergence.py" "${args[@]}" --arch gemma3 --steps 1 --eval-every 1 --checkpoint-every 1 \
  --configs sr --widths "" --lrs 1e-3 --seeds 1 --out "$work/gemma3" > "$work/gemma3.log"
grep -q "train --preset tiny --arch gemma3 " "$work/gemma3/runs/sr/lr=0.001/seed=0/train.log"
grep -q '"arch": "gemma3"' "$work/gemma3/runs/sr/lr=0.001/seed=0/checkpoint/meta.json"
! grep -q -- "--arch" "$out/runs/sr/lr=0.003/seed=0/train.log"
# A bad input stops the study with the trainer's message (not recorded as a divergence).
if python3 "$repo/scripts/convergence.py" "${args[@]/300/256}" --out "$work/bad" > "$work/bad.log" 2>&1; then
  echo "FAIL: a vocabulary mismatch did not stop the study"; exit 1
fi
grep -q "differs from the model's V" "$work/bad.log"
python3 - "$repo/scripts" "$out" <<'PY'
import csv, math, sys
sys.path.insert(0, sys.argv[1])
import convergence as c
# Student t two-sided p-values (R: 2 * pt(-|t|, df)) and a Welch test worked by hand.
for t, df, p in ((2.0, 10, 0.073388), (2.776445, 4, 0.05), (12.706205, 1, 0.05), (0.0, 3, 1.0)):
    assert abs(c.t_two_sided_p(t, df) - p) < 2e-6, (t, df, c.t_two_sided_p(t, df))
t, df, p = c.welch([1, 2, 3], [4, 5, 7])
assert abs(t + 3.162278) < 1e-6 and abs(df - 3.448276) < 1e-6 and abs(p - 0.041915) < 2e-5, (t, df, p)
assert c.welch([1.0], [2.0, 3.0]) is None
# Paired: differences 1, 2, 3 -> mean 2, sd 1, t = 2 sqrt(3), df 2.
m, sd, t, df, p = c.paired([2, 4, 6], [1, 2, 3])
assert (m, sd, df) == (2.0, 1.0, 2) and abs(t - 2 * 3 ** 0.5) < 1e-12 and abs(p - c.t_two_sided_p(t, 2)) < 1e-15
rows = list(csv.DictReader(open(sys.argv[2] + "/table1.csv")))
assert [r["configuration"] for r in rows] == ["bf16", "sr", "s3r+dx"], rows
for r in rows:
    assert r["n_seeds"] == "2" and math.isfinite(float(r["mean"])), r
assert rows[0]["gap_to_bf16"] == "+0.00000" and rows[1]["welch_t_vs_sr"] == ""
print("convergence test: ok")
PY
