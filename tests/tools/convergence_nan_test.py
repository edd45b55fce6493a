#!/usr/bin/env python3
"""scripts/convergence.py with diverged runs: a stand-in for `s3r train` writes metrics.jsonl the
way s3r does when losses are not finite ("loss": null, "val_loss": null), and the whole driver
(runs, done.json, tables, CSV, plot data, study.json) must handle them: no crash, the diverged runs
shown as nan / diverged and counted, and no statistic taken over a NaN.

Usage: convergence_nan_test.py REPO WORK_DIR
"""
import csv
import json
import math
import os
import stat
import subprocess
import sys
from pathlib import Path

repo, work = Path(sys.argv[1]), Path(sys.argv[2])
sys.path.insert(0, str(repo / "scripts"))
import convergence as c  # noqa: E402

DIVERGED = c.DIVERGED
work.mkdir(parents=True, exist_ok=True)
failures = []


def check(ok, what):
    if not ok:
        failures.append(what)
        print("FAIL:", what)


def strict_json(path):
    """Parses PATH refusing NaN / Infinity literals (not JSON; jq and nlohmann reject them)."""
    def refuse(x):
        raise ValueError(f"{path}: non-JSON constant {x}")
    return json.loads(Path(path).read_text(), parse_constant=refuse)


# 1. The reader: null losses become NaN; a null training loss line is not a validation point.
metrics = work / "metrics.jsonl"
metrics.write_text("\n".join([
    '{"step": 0, "loss": 5.5}',
    '{"step": 1, "loss": null, "skipped": true}',
    '{"step": 1, "val_loss": 5.0}',
    '{"step": 3, "loss": null}',
    '{"step": 3, "val_loss": null}',
    'not json',
]) + "\n")
curve = c.read_val_curve(metrics)
check(len(curve) == 2 and curve[0] == (2, 5.0) and curve[1][0] == 4 and math.isnan(curve[1][1]),
      f"read_val_curve: {curve}")

# 2. The whole driver over a fake `s3r train` (the same command line, run folders and exit codes).
fake = work / "fake_s3r"
fake.write_text(r'''#!/usr/bin/env python3
# Stands in for `s3r train`: writes metrics.jsonl as s3r does, with null for non-finite losses.
#  rtne: every run diverges; s3r train stops it (status 1, its message last).
#  s3r+dx seed 1, and s3r at C=32: finish (status 0) with a NaN final validation loss.
#  sr at lr 0.003: a NaN validation loss at step 6, finite again at the end.
import json, sys
a = sys.argv[1:]
opt = lambda k: a[a.index(k) + 1]
out, steps, every = opt("--out"), int(opt("--steps")), int(opt("--eval-every"))
mode, corr, seed, lr, width = opt("--mode"), opt("--correction"), int(opt("--seed")), float(opt("--lr")), int(opt("--width"))
name = mode + ("" if corr == "none" else "+" + corr)
print("  machine      fake CPU")
with open(out + "/metrics.jsonl", "w") as m:
    for s in range(steps):
        bad = name == "rtne" and s >= 3
        m.write(json.dumps({"step": s, "loss": None if bad else 5.0 - 0.1 * s}) + "\n")
        if (s + 1) % every == 0 or s + 1 == steps:
            v = 5.0 - 0.1 * s - 100 * lr - 0.01 * seed - 0.001 * width / 64
            if bad or (name == "sr" and lr == 0.003 and s + 1 == 6):
                v = None
            if s + 1 == steps and ((name == "s3r+dx" and seed == 1) or (name == "s3r" and width == 32)):
                v = None
            m.write(json.dumps({"step": s, "val_loss": v}) + "\n")
        if bad and s >= 5:
            print("s3r: error: step 6: 3 " + "''' + DIVERGED + r'''")
            sys.exit(1)
''')
fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
data = work / "data"
data.mkdir(exist_ok=True)
for f in ("train.bin", "val.bin"):
    (data / f).write_bytes(b"")
out = work / "study"
args = [sys.executable, str(repo / "scripts" / "convergence.py"), "--s3r", str(fake), "--out", str(out),
        "--data", str(data), "--preset", "tiny", "--seq-len", "0", "--batch", "0", "--width", "64",
        "--steps", "12", "--warmup", "2", "--lrs", "1e-3,3e-3", "--seeds", "2",
        "--configs", "bf16,rtne,sr,s3r+dx", "--widths", "32,64", "--eval-every", "6",
        "--eval-batches", "2", "--checkpoint-every", "6", "--jobs", "2"]
if out.exists():
    import shutil
    shutil.rmtree(out)
r = subprocess.run(args, capture_output=True, text=True)
log = r.stdout + r.stderr
(work / "study.log").write_text(log)
check(r.returncode == 0, f"the driver exited with {r.returncode}:\n{log[-3000:]}")
if r.returncode == 0:
    rows = {row["configuration"]: row for row in csv.DictReader(open(out / "table1.csv"))}
    # rtne: every seed diverged: no mean, counted, values nan.
    t = rows["rtne"]
    check(t["n_seeds"] == "0" and t["diverged"] == "2" and t["mean"] == "" and t["gap_to_bf16"] == ""
          and t["values"] == "nan nan", f"rtne row {t}")
    # s3r+dx: seed 1 diverged (NaN at the end, status 0): excluded from the mean, which is seed 0's.
    t = rows["s3r+dx"]
    vals = t["values"].split()
    check(t["n_seeds"] == "1" and t["diverged"] == "1" and vals[1] == "nan" and math.isfinite(float(t["mean"]))
          and abs(float(t["mean"]) - float(vals[0])) < 1e-9 and t["sd"] == "", f"s3r+dx row {t}")
    check(t["paired_t"] == "" and t["welch_t_vs_sr"] == "", f"s3r+dx: a test over 1 finite seed {t}")
    # sr: a NaN validation point mid-run, finite at the end: a normal result.
    t = rows["sr"]
    check(t["n_seeds"] == "2" and t["diverged"] == "0" and "nan" not in t["values"], f"sr row {t}")
    md = (out / "table1.md").read_text()
    check("diverged (NaN)" in md and "2 diverged, excluded" in md and "Note: s3r+dx: 1 of 2 seeds diverged" in md,
          f"table1.md does not say which runs diverged:\n{md}")
    check("nan +- " not in md and "+nan" not in md, f"table1.md shows a statistic of NaN:\n{md}")
    sweep = list(csv.DictReader(open(out / "lr_sweep.csv")))
    check([s["final_val_loss_seed0"] for s in sweep if s["configuration"] == "rtne"] == ["nan", "nan"]
          and all(s["diverged"] == ("1" if s["configuration"] == "rtne" else "0") for s in sweep),
          f"lr_sweep.csv {sweep}")
    width = {w["width"]: w for w in csv.DictReader(open(out / "width.csv"))}
    check(width["32"]["s3r"] == "nan" and width["32"]["s3r_minus_sr"] == "" and width["32"]["diverged"] == "s3r"
          and math.isfinite(float(width["32"]["s3r_dx_minus_sr"])), f"width.csv {width}")
    check("diverged (NaN)" in (out / "width.md").read_text(), "width.md")
    # JSON outputs stay strict JSON: NaN as null.
    study = strict_json(out / "study.json")
    nulls = [run for run in study["runs"] if run["final_val_loss"] is None]
    # rtne: both sweep runs and seed 1; s3r+dx seed 1; s3r at C=32.
    check(len(nulls) == 3 + 1 + 1, f"study.json: {len(nulls)} runs with a null final loss")
    for d in out.rglob("done.json"):
        strict_json(d)
    # Plot data: no NaN point, no mean over a NaN; the sr curve skips step 6.
    for dat in (out / "plot").glob("*.dat"):
        text = dat.read_text()
        check("nan" not in text.lower(), f"{dat} holds a NaN:\n{text}")
    sr_steps = [int(line.split()[0]) for line in (out / "plot" / "sr.dat").read_text().splitlines()]
    check(6 not in sr_steps and 12 in sr_steps, f"sr.dat steps {sr_steps}")
    check(not (out / "plot" / "rtne.dat").exists(), "rtne (all diverged) has a curve")
    check("plot: rtne: all 2 runs diverged" in log and "plot: s3r+dx: 1 of 2 runs diverged" in log
          and "plot: sr: no point at step(s) 6" in log, f"the plot notes are missing:\n{log}")
    # A second invocation reuses the runs, NaN results included.
    r2 = subprocess.run(args, capture_output=True, text=True)
    check(r2.returncode == 0 and "ran 0 runs" in r2.stdout, f"rerun: {r2.returncode} {r2.stdout[-500:]} {r2.stderr[-500:]}")

if failures:
    sys.exit(f"convergence NaN test: {len(failures)} failure(s)")
print("convergence NaN test: ok")
