#!/usr/bin/env python3
"""scripts/table1.py: its statistics (power of the paired t-test against G*Power and a seeded
Monte Carlo, t and chi-square quantiles, Holm's adjustment), the real plan's convergence.py
arguments, and the whole driver (plan, run, diag, report) over a stand-in `s3r` with planted
effects: the decisions come out as planted, a second `all` reruns nothing, and a diverged run and
missing runs are reported, not crashed on.

Usage: table1_test.py REPO WORK_DIR
"""
import csv
import json
import math
import random
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

repo, work = Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve()
sys.path.insert(0, str(repo / "scripts"))
import convergence as cv  # noqa: E402
import study_stats as sst  # noqa: E402
import table1 as t1  # noqa: E402

failures = []


def check(ok, what):
    if not ok:
        failures.append(what)
        print("FAIL:", what)


# 1. Statistics.
check(abs(sst.t_crit(0.05, 10) - 2.228) < 5e-4, f"t_crit(0.05, 10) = {sst.t_crit(0.05, 10)}")
check(abs(sst.chi2_quantile(0.20, 10) - 6.1791) < 1e-3, f"chi2_quantile(0.2, 10) = {sst.chi2_quantile(0.2, 10)}")
pw = sst.power_paired(1.0, 1.0, 10, 0.05)
check(abs(pw - 0.803) < 1e-3, f"power_paired(d=1, n=10, 0.05) = {pw} (G*Power: 0.803)")


def monte_carlo(delta, sigma, n, alpha, draws=20000):
    """Share of seeded paired samples whose two-sided t-test rejects at alpha."""
    rng, c, hits = random.Random(1), sst.t_crit(alpha, n - 1), 0
    for _ in range(draws):
        d = [rng.gauss(delta, sigma) for _ in range(n)]
        hits += abs(statistics.fmean(d) / (statistics.stdev(d) / math.sqrt(n))) > c
    return hits / draws


for delta, sigma, n, alpha in ((1.0, 1.0, 10, 0.05), (0.03, 0.015, 8, 0.05 / 8)):
    exact, mc = sst.power_paired(delta, sigma, n, alpha), monte_carlo(delta, sigma, n, alpha)
    tol = 4 * math.sqrt(exact * (1 - exact) / 20000)
    check(abs(exact - mc) < tol, f"power {exact:.4f} vs Monte Carlo {mc:.4f} (4 sd {tol:.4f}), n={n}")
check(abs(sst.power_paired(0.0, 1.0, 6, 0.05) - 0.05) < 1e-3, "power at delta 0 is alpha")
check(sst.tost_power(0.03, 0.015, 8, 0.05 / 8) > sst.tost_power(0.03, 0.03, 8, 0.05 / 8), "TOST power")
adj = sst.holm([0.01, 0.04, 0.03, 0.005])
check(all(abs(x - y) < 1e-12 for x, y in zip(adj, [0.03, 0.06, 0.06, 0.02])), f"holm {adj}")
ps = [random.Random(2).random() ** 3 for _ in range(9)] + [0.6, 0.9]
adj = sst.holm(ps)
order = sorted(range(len(ps)), key=lambda i: ps[i])
check(all(a >= p for a, p in zip(adj, ps)) and max(adj) <= 1.0
      and all(adj[order[i]] <= adj[order[i + 1]] for i in range(len(ps) - 1)), f"holm: monotone, capped {adj}")
check(sst.holm([0.5, 0.6])[1] == 1.0 or sst.holm([0.5, 0.6]) == [1.0, 1.0], "holm cap at 1")

# 2. The real plan's arguments are the running studies' (convergence.parse_args of the brief's lists).
a = t1.parse_args(["plan"])
st = t1.make_studies(a)
root = str(repo / "results" / "table1")
want = {"width": ["--out", root + "/width", "--configs", "sr,s3r,s3r+dx,s3r+two-way", "--width", "512",
                  "--lrs", "0.0001875,0.000375,0.00075,0.0015", "--seeds", "8", "--widths", ""],
        "length": ["--out", root + "/length", "--configs", "bf16,rtne,sr", "--width", "256", "--steps", "1600",
                   "--eval-every", "100", "--checkpoint-every", "200", "--seeds", "8", "--widths", ""]}
for name, argv in want.items():
    check(vars(st[name].args) == vars(cv.parse_args(argv)), f"{name}: {vars(st[name].args)}")
check(st["width"].total_runs() == 45 and st["length"].total_runs() == 30, "total runs 45 / 30")

# 3. The whole driver over a stand-in s3r.
if work.exists():
    shutil.rmtree(work)
work.mkdir(parents=True)
calls = work / "calls.log"
fake = work / "fake_s3r"
fake.write_text(r'''#!/usr/bin/env python3
# Stands in for `s3r train` and `s3r diag second-moment / grad-error`. Planted final losses
# (seed 0 at its best lr 1e-3): s3r = sr + 0.05, s3r+dx = s3r+two-way = sr, rtne = sr + 0.04,
# bf16 = sr - 0.03, each + noise(sd 0.001); s3r+two-way seed 2 ends NaN (diverged).
import json, os, random, sys
a = sys.argv[1:]
opt = lambda k: a[a.index(k) + 1]
with open(''' + repr(str(calls)) + r''', "a") as f:
    f.write(" ".join(a[:2]) + " " + (opt("--out") if a[0] == "train" else opt("--json")) + "\n")
if a[0] == "diag":
    stats = lambda s: {"coordinates": 100, "zero_v": 0, "median": s, "q90": 2 * s, "q99": 4 * s, "max": 9 * s,
                       "aggregate": 1.5 * s, "unknown_extra": [1]}
    if a[1] == "second-moment":
        rows = [{"configuration": c, "keys": 16, "all": stats(0.1 * (i + 1)),
                 "kinds": {k: stats(0.01 * (j + 1)) for j, k in enumerate(
                     ["attn.q", "attn.k", "attn.v", "attn.o", "ffn.gate", "ffn.up", "ffn.down"])},
                 "layers": [dict(stats(0.2), name="blocks.0.attn.q")]} for i, c in enumerate(["sr", "s3r", "s3r+dx"])]
        j = {"checkpoint": opt("--checkpoint"), "step": 12, "model": "tiny", "keys": 16, "beta2": 0.95, "clip": 1.0,
             "grad_norm": 0.5, "clip_factor": 1.0, "machine": "fake", "rows": rows, "new_field": {"x": 1}}
    else:
        q = lambda s: {"mean": s, "sd": s / 10, "error_of_key_mean": s / 4, "per_key": [s] * 16}
        j = {"checkpoint": opt("--checkpoint"), "step": 12, "model": "tiny", "keys": 16, "rows": [
            dict({k: q(0.1 * (i + 1)) for k in ("dx_first_block", "dx_last_block", "dw_first_block", "embedding")},
                 configuration=c) for i, c in enumerate(["rtne", "sr", "s3r"])]}
    print("fake diag", a[1])
    with open(opt("--json"), "w") as f:
        json.dump(j, f)
    sys.exit(0)
out, steps, every = opt("--out"), int(opt("--steps")), int(opt("--eval-every"))
mode, corr, seed, lr = opt("--mode"), opt("--correction"), int(opt("--seed")), float(opt("--lr"))
name = mode + ("" if corr == "none" else "+" + corr)
final = (5.0 + 0.01 * seed + 30 * abs(lr - 1e-3) + {"sr": 0, "s3r": 0.05, "s3r+dx": 0, "s3r+two-way": 0,
         "rtne": 0.04, "bf16": -0.03}[name] + random.Random(f"{name}/{seed}/{lr}").gauss(0, 0.001))
if name == "s3r+two-way" and seed == 2:
    final = None
print("  machine      fake CPU")
with open(out + "/metrics.jsonl", "w") as m:
    for s in range(steps):
        m.write(json.dumps({"step": s, "loss": 6.0 - 0.01 * s}) + "\n")
        if (s + 1) % every == 0 or s + 1 == steps:
            v = final if s + 1 == steps or final is None else final + 0.5 * (steps - s - 1) / steps
            m.write(json.dumps({"step": s, "val_loss": v}) + "\n")
os.makedirs(out + "/checkpoint", exist_ok=True)
''')
fake.chmod(0o755)
data = work / "data"
data.mkdir()
for f in ("train.bin", "val.bin"):
    (data / f).write_bytes(b"")
out, docs = work / "out", work / "docs"
cmd = [sys.executable, str(repo / "scripts" / "table1.py"), "all", "--tiny-plan-for-tests", "--s3r", str(fake),
       "--data", str(data), "--out-root", str(out), "--docs", str(docs), "--record", str(docs / "decision.json")]


def drive(argv, tag):
    r = subprocess.run(argv, capture_output=True, text=True)
    (work / f"{tag}.log").write_text(r.stdout + r.stderr)
    check(r.returncode == 0, f"{tag}: exit {r.returncode}:\n{(r.stdout + r.stderr)[-3000:]}")
    return r.stdout + r.stderr


log = drive(cmd, "all1")
dec = json.loads((out / "decision.json").read_text()) if (out / "decision.json").is_file() else {"comparisons": []}
by = {r["id"]: r for r in dec["comparisons"]}
check(by.get("W1", {}).get("verdict") == "reproduced", f"W1: {by.get('W1')}")
check(by.get("L1", {}).get("verdict") == "reproduced", f"L1: {by.get('L1')}")
check(by.get("W2", {}).get("verdict") == "reproduced", f"W2: {by.get('W2')}")
check(by.get("W4", {}).get("verdict") == "reproduced" and by["W4"].get("inside_margin") is True, f"W4: {by.get('W4')}")
check(by.get("W5", {}).get("n") == 2 and by["W5"].get("diverged_seeds") == [2]
      and by["W5"]["verdict"] != "reproduced", f"W5 (seed 2 diverged): {by.get('W5')}")
check(all(r["p_holm"] >= r["p"] for r in dec["comparisons"] if r.get("tested")), "Holm p >= raw p")
check(dec.get("holm_family_size") == 8, f"family size {dec.get('holm_family_size')}")
for f in ("decision.md", "decision.csv", "decision.json", "plan.md", "plan.json"):
    check((out / f).is_file(), f"{f} written")
rows = list(csv.DictReader(open(out / "decision.csv"))) if (out / "decision.csv").is_file() else []
check([r["id"] for r in rows] == [c[0] for c in t1.COMPARISONS], f"decision.csv ids {[r.get('id') for r in rows]}")
md = (out / "decision.md").read_text() if (out / "decision.md").is_file() else ""
check("diverged (NaN, excluded): seeds 2" in md and "attn.q" in md and "dX block 0" in md
      and "W5: 2 pairs, the plan's n = 3 is not reached" in md and "Note: W1" not in md, f"decision.md:\n{md}")
diag = out / "diag"
check(len(list(diag.glob("second-moment-*.json"))) == 7 and (diag / "grad-error-width-bf16.json").is_file()
      and len(list(diag.glob("*.txt"))) == 8, f"diag files {sorted(p.name for p in diag.glob('*'))}")
bf16 = list((out / "width" / "runs" / "bf16").glob("lr=*/seed=0/done.json"))
check(len(bf16) == 1 and "lr=0.001" in str(bf16[0]), f"width bf16 extra run {bf16}")
for f in ("decision.md", "plan.md", "width_table1.md", "length_lr_sweep.csv", "diag/grad-error-width-bf16.json"):
    check((docs / f).is_file(), f"docs/{f} copied")
strict = lambda p: json.loads(p.read_text(), parse_constant=lambda x: (_ for _ in ()).throw(ValueError(x)))
if (out / "decision.json").is_file():
    strict(out / "decision.json")

# A second `all` reuses every run and every diagnostic.
n_calls = len(calls.read_text().splitlines())
log = drive(cmd, "all2")
check(len(calls.read_text().splitlines()) == n_calls and log.count("ran 0 runs") == 2
      and log.count("up to date") == 8, f"second all reran something:\n{log[-2000:]}")

# Missing runs: length bf16 seeds 1 and 2 gone: L2 and L3 have 1 pair, leave the family; no crash.
for s in (1, 2):
    for d in (out / "length" / "runs" / "bf16").glob(f"lr=*/seed={s}"):
        (d / "done.json").unlink()
drive(cmd[:2] + ["report"] + cmd[3:], "report-missing")
dec = json.loads((out / "decision.json").read_text())
by = {r["id"]: r for r in dec["comparisons"]}
check(dec["holm_family_size"] == 8 and dec["tested"] == 6 and by["L2"]["n"] == 1 and not by["L2"]["tested"]
      and by["L3"]["missing_seeds"] == [1, 2] and by["L3"]["verdict"] == "undecided at this scale",
      f"missing runs: family {dec['holm_family_size']}, tested {dec['tested']}, L2 {by['L2']}")
# The untested count as p = 1 in the family of 8: the smallest p is multiplied by 8, not 6.
low = min((r for r in dec["comparisons"] if r["tested"]), key=lambda r: r["p"])
check(abs(low["p_holm"] - min(1.0, 8 * low["p"])) < 1e-12, f"Holm over 8: {low['p']} -> {low['p_holm']}")
md = (out / "decision.md").read_text()
check("2 not tested yet" in md and "seeds not (yet) run: 1, 2" in md, f"decision.md (missing):\n{md}")

# The record: with the width runs gone, report decides the width study from docs/decision.json
# (the per-seed differences give the same statistics) and keeps its diagnostics from docs/diag;
# with --record "" the width comparisons are untested.
before = {r["id"]: r for r in json.loads((docs / "decision.json").read_text())["comparisons"]}
(out / "width").rename(work / "width.away")
shutil.rmtree(out / "diag")
drive(cmd[:2] + ["report"] + cmd[3:], "report-record")
dec = json.loads((out / "decision.json").read_text())
by = {r["id"]: r for r in dec["comparisons"]}
same = lambda i: all(by[i][k] == before[i][k] for k in ("diffs", "n", "t", "p", "verdict")) and by[i]["source"] == "record"
check(all(same(i) for i in ("W1", "W2", "W3", "W4", "W5")) and by["L1"]["source"] == "runs"
      and by["W1"]["p_holm"] == before["W1"]["p_holm"], f"record: {by.get('W1')} vs {before.get('W1')}")
md = (out / "decision.md").read_text()
check("width study's runs are not under" in md and "grad-error-width-bf16" in md and "| width (record) | sr |" in md,
      f"decision.md (record):\n{md}")
check((docs / "width_table1.md").is_file() and "second-moment-width-sr.json" in dec["diag"], "record: docs kept")
drive(cmd[:2] + ["report"] + cmd[3:-2] + ["--record", ""], "report-no-record")
dec = json.loads((out / "decision.json").read_text())
check(not any(r["tested"] for r in dec["comparisons"] if r["study"] == "width"), "--record '': width untested")
shutil.rmtree(out / "width", ignore_errors=True)
(work / "width.away").rename(out / "width")

# plan works without a binary.
drive([sys.executable, str(repo / "scripts" / "table1.py"), "plan", "--tiny-plan-for-tests", "--out-root",
       str(work / "plan-only"), "--s3r", str(work / "absent")], "plan")

if failures:
    sys.exit(f"table1 test: {len(failures)} failure(s)")
print("table1 test: ok")
