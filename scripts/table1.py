#!/usr/bin/env python3
"""Table I, decisive version: two pre-registered sub-studies over scripts/convergence.py.

Width study: sr, s3r, s3r + dx, s3r + two-way at C = 512, 8 seeds. Length study: bf16, rtne, sr
at C = 256 for 1600 steps (4x the tokens of the 400-step study), 8 seeds. Each is an ordinary
convergence.py study (lr sweep on seed 0, then the seeds at the best lr; run folders reused and
resumed); the width study also trains bf16 on seed 0 at sr's best lr (Table II's checkpoint).

The decision: 8 paired comparisons (a seed fixes the initial weights and the data order in every
configuration), each a two-sided paired t-test over seeds, one Holm family at family-wise alpha
0.05; W4 and W5 also as an equivalence test (TOST, margin +-0.03 nats, i.e. the 98.75% CI of the
paired mean difference inside the margin). The plan (sizes, power, budget) is printed by `plan`.

Subcommands: plan; run (train or resume); diag (s3r diag second-moment on each configuration's
seed-0 checkpoint, s3r diag grad-error on the bf16 checkpoint); report (convergence.py's report
per study, then OUT_ROOT/decision.md / .csv / .json, copied with the summaries to --docs);
all = run, diag, report. --part limits run, diag and each study's own report; the decision always
covers both studies (one Holm family), with whatever runs exist. A study with no finished run
under OUT_ROOT (another machine, a wiped results/) is decided from the committed record
(--record: docs/results/table1/decision.json, with diag/ beside it), which holds its per-seed
differences; its summaries in docs are left as they are.

Usage: scripts/table1.py [plan|run|diag|report|all] [--part width|length|both] [--out-root DIR]
                         [--docs DIR] [--s3r BIN] [--data DIR] [--jobs 2] [--threads 1]
"""
import argparse
import math
import os
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))
import convergence as cv  # noqa: E402
import study_stats as sst  # noqa: E402
from table1_plan import (ALPHA, CLAIMS, COMPARISONS, DELTA, EVAL_BATCH_COST, EXTRA, PLAN,  # noqa: E402,F401
                         PRIOR_DF_EACH, PRIOR_SDS, SEC_PER_STEP, SIGMA, TINY_PLAN)
from table1_report import copy_docs, load_json, write_outputs  # noqa: E402

def fail(msg):
    sys.exit(f"table1: error: {msg}")


def pooled_prior():
    """(pooled sd, df, one-sided 80% upper confidence bound) of the earlier study's paired sds."""
    df = PRIOR_DF_EACH * len(PRIOR_SDS)
    s = math.sqrt(sum(PRIOR_DF_EACH * x * x for x in PRIOR_SDS) / df)
    return s, df, s * math.sqrt(df / sst.chi2_quantile(0.20, df))


# ---------------------------------------------------------------------------------------------
# The studies.

class WidthStudy(cv.Study):
    """The width study plus bf16 on seed 0 at sr's best lr (planned once sr's sweep is done)."""

    def extra_runs(self):
        lr = self.best_lr("sr")
        return [] if lr is None else [cv.Run(self, "runs", EXTRA[1], lr, 0)]

    def planned(self):
        runs = super().planned()
        for r in self.extra_runs():
            runs[r.key()] = r
        return runs

    def total_runs(self):
        return super().total_runs() + 1


def study_argv(name, a):
    """convergence.py's arguments of sub-study NAME."""
    spec = (TINY_PLAN if a.tiny_plan_for_tests else PLAN)[name]
    return (["--out", os.path.join(a.out_root, name), "--configs", ",".join(spec["configs"])]
            + spec["options"] + ["--s3r", a.s3r, "--data", a.data, "--jobs", str(a.jobs),
                                 "--threads", str(a.threads)])


def make_studies(a):
    out = {}
    for name in PLAN:
        args = cv.parse_args(study_argv(name, a))
        out[name] = (WidthStudy if name == EXTRA[0] else cv.Study)(args)
    return out


def parts(a):
    return list(PLAN) if a.part == "both" else [a.part]


def seed_finals(study, config):
    """{seed: final loss (NaN: diverged)} of CONFIG's finished runs at its best lr."""
    return {r.seed: r.result()[0] for r in study.seed_runs(config) if r.done()}


# ---------------------------------------------------------------------------------------------
# plan

def run_seconds(a, config):
    """Predicted wall seconds of one run (SEC_PER_STEP, validation included); None if unmeasured."""
    per = SEC_PER_STEP.get(a.width, {}).get(config)
    return None if per is None else per * (a.steps + a.eval_batches * EVAL_BATCH_COST * (a.steps // a.eval_every))


def budget_lines(studies):
    lines, total = [], 0.0
    for name, st in studies.items():
        a = st.args
        runs = {c: len(a.lrs) + a.seeds - 1 for c in a.configs}
        runs.update({EXTRA[1]: runs.get(EXTRA[1], 0) + 1} if name == EXTRA[0] else {})
        if any(run_seconds(a, c) is None for c in runs):
            lines.append(f"- {name}: {st.total_runs()} runs; no measured speed at C={a.width}")
            continue
        sec = sum(k * run_seconds(a, c) for c, k in runs.items())
        total += sec / a.jobs
        lines.append(f"- {name}: {st.total_runs()} runs of {a.steps} steps at C={a.width} (runs x s/step: " + ", ".join(
            f"{c} {k} x {SEC_PER_STEP[a.width][c]:.2f}" for c, k in runs.items())
            + f"; validation {a.steps // a.eval_every} x {a.eval_batches} batches at {EVAL_BATCH_COST:.2f} step "
            f"each): {sec / 3600:.2f} run-hours, {sec / 3600 / a.jobs:.2f} h wall on {a.jobs} lanes")
    lines.append(f"- both: about {total / 3600:.1f} h wall")
    for name, st in studies.items():
        done = [r for r in st.planned().values() if r.done()]
        if done:
            wall = sum(r.result()[1] for r in done)
            pred = sum(run_seconds(st.args, r.config) or float("nan") for r in done)
            lines.append(f"- measured so far, {name}: {len(done)} of {st.total_runs()} runs done in "
                         f"{wall / 3600:.2f} run-hours (predicted {cv.fmt(pred / 3600, '.2f') or 'n/a'}), "
                         f"{wall / 3600 / st.args.jobs:.2f} h wall on {st.args.jobs} lanes")
    return lines


def plan_numbers(n_plan):
    """The plan's statistics: prior sd, power table, minimal detectable effect, TOST power."""
    s, df, upper = pooled_prior()
    al = ALPHA / len(COMPARISONS)
    return {"alpha": ALPHA, "alpha_per_test": al, "delta": DELTA, "sigma": SIGMA, "prior_sds": PRIOR_SDS,
            "pooled_sd": s, "pooled_df": df, "sigma_upper80": upper, "seeds": n_plan,
            "power": {n: [sst.power_paired(DELTA, x, n, al) for x in (SIGMA, upper)]
                      for n in range(min(5, n_plan), max(10, n_plan) + 1)},
            "mde80": [sst.mde(x, n_plan, al) for x in (SIGMA, upper)],
            "tost_power_at_0": [sst.tost_power(DELTA, x, n_plan, al) for x in (SIGMA, upper)],
            "method": "exact: integration over the chi distribution of the sample sd"}


def power_lines(p):
    n, al, up, (pw, pwu) = p["seeds"], p["alpha_per_test"], p["sigma_upper80"], p["power"][p["seeds"]]
    lines = [f"Planning sd of a paired difference: sigma = {SIGMA} (earlier 3-seed study, paired sds "
             f"{', '.join(f'{x:.3f}' for x in PRIOR_SDS)}: pooled {p['pooled_sd']:.4f} with {p['pooled_df']} df; "
             f"one-sided 80% upper confidence bound sigma sqrt(df / chi2(0.20, df)) = {up:.4f}).",
             f"Power of one comparison: two-sided paired t at level {ALPHA}/{len(COMPARISONS)} = {al:.5f} "
             f"(Bonferroni: a lower bound for Holm's), effect delta = {DELTA} nats; noncentral t, {p['method']}.", "",
             f"| seeds n | power at sigma {SIGMA} | power at sigma {up:.4f} (upper bound) |", "|---:|---:|---:|"]
    lines += [f"| {k}{' (plan)' if k == n else ''} | {a:.3f} | {b:.3f} |" for k, (a, b) in p["power"].items()]
    return lines + [
        "", f"Chosen n = {n}: power {pw:.3f} at sigma {SIGMA}, {pwu:.3f} at {up:.4f}. Minimal detectable effect at "
        f"80% power, n = {n}: {p['mde80'][0]:.4f} nats at sigma {SIGMA}, {p['mde80'][1]:.4f} at {up:.4f}.",
        f"Equivalence (W4, W5): TOST with margin +-{DELTA}, each one-sided test at {al:.5f}, i.e. the "
        f"{100 * (1 - 2 * al):.2f}% CI of the paired mean difference inside (-{DELTA}, +{DELTA}); power at a true "
        f"difference 0 ({p['method']}): {p['tost_power_at_0'][0]:.3f} at sigma {SIGMA}, "
        f"{p['tost_power_at_0'][1]:.3f} at {up:.4f}."]


def plan_text(a, studies, numbers):
    lines = ["# Table I, decisive version: the pre-registered plan", "",
             "Studies (scripts/convergence.py; lr sweep on seed 0, then the seeds at the best lr):", ""]
    here = str(REPO) + os.sep  # paths inside the repository shown relative to it
    shown = lambda argv: shlex.join(x[len(here):] if x.startswith(here) else x for x in argv)
    lines += [f"- {name}: `scripts/convergence.py {shown(study_argv(name, a))}`" for name in studies]
    lines += ["- plus bf16 at C=512, seed 0, at sr's best lr of the width study (Table II's checkpoint; in no "
              "comparison)", "", "Comparisons: two-sided paired t-tests over seeds of the final validation loss (a "
              "seed fixes the initial weights and the data order in every configuration); one Holm family of "
              f"{len(COMPARISONS)} at family-wise alpha {ALPHA}:", ""]
    for cid, study, x, y, claim, kind, sign, text in COMPARISONS:
        exp = {1: "> 0", -1: "< 0", 0: f"inside +-{DELTA} (TOST)"}[sign]
        lines.append(f"- {cid} ({study}, claim {claim}): {x} - {y}, expected {exp}: {text}")
    lines += ["", "Decision per comparison: reproduced = Holm-significant in the claimed direction (W4, W5: the "
              "98.75% CI inside the margin, whatever the test of a difference says); not reproduced = "
              "Holm-significant in the opposite direction (W4, W5: a significant positive difference); otherwise "
              "undecided at this scale.", ""]
    return "\n".join(lines + power_lines(numbers) + ["", "Compute budget:", ""] + budget_lines(studies)) + "\n"


def cmd_plan(a, studies, quiet=False):
    root = Path(a.out_root)
    root.mkdir(parents=True, exist_ok=True)
    numbers = plan_numbers(studies["width"].args.seeds)
    text = plan_text(a, studies, numbers)
    cv.write_atomic(root / "plan.md", text)
    fields = ("id", "study", "a", "b", "claim", "kind", "expected_sign", "statement")
    cv.write_atomic(root / "plan.json", cv.dumps(dict(numbers, studies={k: study_argv(k, a) for k in studies},
                                                      comparisons=[dict(zip(fields, c)) for c in COMPARISONS])))
    if not quiet:
        print(text + f"plan: {root / 'plan.md'}, {root / 'plan.json'}")


# ---------------------------------------------------------------------------------------------
# run and diag

def check_inputs(a):
    if not Path(a.s3r).is_file():
        fail(f"no s3r binary at {a.s3r} (run scripts/setup.sh)")
    for f in ("train.bin", "val.bin"):
        if not (Path(a.data) / f).is_file():
            fail(f"no {f} in {a.data} (run scripts/fetch_data.sh)")


def cmd_run(a, studies):
    check_inputs(a)
    for name in parts(a):
        studies[name].out.mkdir(parents=True, exist_ok=True)
        print(f"table1: {name} study", flush=True)
        studies[name].schedule()


def diag_jobs(a, studies):
    """(label, run, argv tail, json path) of every diagnostic of the selected parts."""
    out, jobs = Path(a.out_root) / "diag", []
    for name in parts(a):
        st = studies[name]
        for c in st.args.configs:
            lr = st.best_lr(c)
            run = cv.Run(st, "runs", c, lr, 0) if lr is not None else None
            jobs.append((f"second-moment {name} {c}", run, ["second-moment"], out / f"second-moment-{name}-{c}.json"))
        if name == EXTRA[0]:
            extra = st.extra_runs()
            jobs.append((f"grad-error {name} bf16", extra[0] if extra else None, ["grad-error"],
                         out / f"grad-error-{name}-bf16.json"))
    return jobs


def cmd_diag(a, studies):
    """Runs the diagnostics; returns the labels of those that failed."""
    check_inputs(a)
    (Path(a.out_root) / "diag").mkdir(parents=True, exist_ok=True)
    failed = []
    for label, run, sub, path in diag_jobs(a, studies):
        if run is None or not run.done() or not (run.dir / "checkpoint").is_dir():
            where = run.dir if run else "(its lr sweep is not finished)"
            print(f"diag: skip {label}: no finished run with a checkpoint at {where}", flush=True)
            continue
        if path.is_file() and path.stat().st_mtime > (run.dir / "done.json").stat().st_mtime:
            print(f"diag: {label}: up to date ({path})", flush=True)
            continue
        cmd = [a.s3r, "diag"] + sub + ["--checkpoint", str(run.dir), "--data", a.data,
                                      "--keys", "16", "--json", str(path)]
        txt = path.with_suffix(".txt")
        print(f"diag: {label}: {' '.join(cmd)}", flush=True)
        env = dict(os.environ, OMP_NUM_THREADS=str(a.jobs * a.threads))
        with open(txt.with_name(txt.name + ".tmp"), "w") as f:
            rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env).returncode
        os.replace(txt.with_name(txt.name + ".tmp"), txt)
        if rc != 0 or not path.is_file():
            print(f"diag: {label} failed (status {rc}); output: {txt}", flush=True)
            failed.append(label)
    return failed


# ---------------------------------------------------------------------------------------------
# report: statistics per comparison, Holm, decisions

def has_runs(study):
    return any(r.done() for r in study.planned().values())


def load_record(a, studies):
    """{study: {"comparisons": {id: row}, "configurations": [row]}} for each study without one
    finished run under OUT_ROOT that the committed record (--record: the decision.json of a
    report that had its runs) holds, so that the decision over both studies can be remade where
    only one study's runs are. Its per-seed differences are what the decision needs."""
    absent = [name for name, st in studies.items() if not has_runs(st)]  # a record of another plan is not used
    j = load_json(Path(a.record)) if absent and a.record and Path(a.record).is_file() else None
    out = {}
    for name in absent if isinstance(j, dict) else []:
        comps = {r["id"]: r for r in j.get("comparisons", []) if isinstance(r, dict) and r.get("study") == name}
        ids = [c[0] for c in COMPARISONS if c[1] == name]
        if all(isinstance(comps.get(i, {}).get("diffs"), list) and comps[i].get("n_plan") == studies[name].args.seeds
               for i in ids) and any(comps[i]["diffs"] for i in ids):
            out[name] = {"comparisons": comps,
                         "configurations": [c for c in j.get("configurations", []) if c.get("study") == name]}
    return out


def compare(studies, comp, record):
    """One comparison's pairs and paired statistics (no Holm yet), from the runs or the record."""
    cid, study, x, y, claim, kind, sign, text = comp
    st = studies[study]
    seeds = range(st.args.seeds)
    if study in record:
        src = record[study]["comparisons"][cid]
        d = [float(v) for v in src["diffs"]]
        missing, diverged = list(src.get("missing_seeds", [])), list(src.get("diverged_seeds", []))
        pairs = src.get("pair_seeds", [s for s in seeds if s not in missing and s not in diverged])
    else:
        fx, fy = seed_finals(st, x), seed_finals(st, y)
        missing = [s for s in seeds if s not in fx or s not in fy]
        diverged = [s for s in seeds if s not in missing and not (cv.finite(fx[s]) and cv.finite(fy[s]))]
        pairs = [s for s in seeds if s not in missing and s not in diverged]
        d = [fx[s] - fy[s] for s in pairs]
    r = {"id": cid, "study": study, "a": x, "b": y, "claim": claim, "kind": kind, "expected_sign": sign,
         "statement": text, "n": len(d), "n_plan": st.args.seeds, "missing_seeds": missing,
         "diverged_seeds": diverged, "pair_seeds": pairs, "diffs": d,
         "mean": statistics.fmean(d) if d else float("nan"),
         "sd": statistics.stdev(d) if len(d) > 1 else float("nan"), "tested": False,
         "source": "record" if study in record else "runs"}
    pr = sst.paired_diffs(d)
    if pr:
        _, _, t, df, p = pr
        half = sst.t_crit(ALPHA, df) * r["sd"] / math.sqrt(len(d))
        r.update(tested=True, t=t, df=df, p=p, ci95=[r["mean"] - half, r["mean"] + half])
    return r


def finish(rows):
    """Holm over the plan's whole family, a comparison not (yet) tested counting as p = 1: its
    result can only lower the others' adjusted p's, so an interim report is conservative. Power,
    equivalence CI and verdict for each tested one. Returns the number tested."""
    tested = [r for r in rows if r["tested"]]
    m = len(tested)
    adjusted = sst.holm([r["p"] if r["tested"] else 1.0 for r in rows])
    for r, ph in zip(rows, adjusted):
        if not r["tested"]:
            continue
        r["p_holm"] = ph
        r["power_observed_sd"] = sst.power_paired(DELTA, r["sd"], r["n"], ALPHA / len(COMPARISONS))
        if r["kind"] == "equivalence":
            half = sst.t_crit(2 * ALPHA / len(COMPARISONS), r["df"]) * r["sd"] / math.sqrt(r["n"])
            r["ci_equivalence"] = [r["mean"] - half, r["mean"] + half]
            r["inside_margin"] = -DELTA < r["mean"] - half and r["mean"] + half < DELTA
    for r in rows:
        r["verdict"], r["reason"] = verdict(r)
    return m


def verdict(r):
    """("reproduced" | "not reproduced" | "undecided at this scale", reason)."""
    if not r["tested"]:
        why = "all paired differences are equal" if r["n"] >= 2 else f"{r['n']} pair{'' if r['n'] == 1 else 's'}"
        return "undecided at this scale", f"{why}: no test yet (p = 1 in the Holm family)"
    sig = r["p_holm"] < ALPHA
    lo, hi = r["ci95"]
    sign = 1 if r["mean"] > 0 else -1
    if r["kind"] == "equivalence":
        elo, ehi = r["ci_equivalence"]
        if r["inside_margin"]:
            return "reproduced", f"98.75% CI [{elo:+.4f}, {ehi:+.4f}] inside +-{DELTA}"
        if sig and sign > 0:
            return "not reproduced", f"{r['a']} ends significantly above {r['b']} (Holm p {r['p_holm']:.3g})"
        n = sst.seeds_needed(lambda k: sst.tost_power(DELTA, r["sd"], k, ALPHA / len(COMPARISONS)))
        extra = (f"; it ends significantly below {r['b']} (better, Holm p {r['p_holm']:.3g})" if sig else "")
        return "undecided at this scale", (f"98.75% CI [{elo:+.4f}, {ehi:+.4f}] not inside +-{DELTA}{extra}; "
                                           f"80% TOST power at a true difference 0 would need about "
                                           f"{n or 'more than 1000'} seeds at the observed sd {r['sd']:.4f}")
    if sig:
        word = "reproduced" if sign == r["expected_sign"] else "not reproduced"
        return word, f"Holm p {r['p_holm']:.3g}, mean {r['mean']:+.4f}, 95% CI [{lo:+.4f}, {hi:+.4f}]"
    effect = r["expected_sign"] * DELTA
    n = sst.seeds_needed(lambda k: sst.power_paired(DELTA, r["sd"], k, ALPHA / len(COMPARISONS)))
    inc = "includes 0" if lo <= 0 <= hi else "excludes 0 but Holm p " + f"{r['p_holm']:.3g} >= {ALPHA}"
    inc += f" and the {DELTA} effect" if lo <= effect <= hi else ""
    if n is not None and n <= r["n"]:
        need = (f"the test had power {r['power_observed_sd']:.2f} for a {DELTA} effect at the observed sd "
                f"{r['sd']:.4f}: an effect that large is unlikely, a smaller one is not excluded")
    else:
        need = f"80% power would need about {n or 'more than 1000'} seeds at the observed sd {r['sd']:.4f}"
    return "undecided at this scale", f"95% CI [{lo:+.4f}, {hi:+.4f}] {inc}; {need}"


def claim_verdicts(rows):
    by = {r["id"]: r for r in rows}
    out = []
    for key, text, ids in CLAIMS:
        vs = [by[i]["verdict"] for i in ids]
        v = ("reproduced" if all(x == "reproduced" for x in vs) else
             "not reproduced" if "not reproduced" in vs else "undecided at this scale")
        out.append({"claim": key, "statement": text, "comparisons": ids, "verdict": v,
                    "reasons": {i: f"{by[i]['verdict']}: {by[i]['reason']}" for i in ids}})
    return out


def config_summary(studies, record):
    rows = []
    for name, st in studies.items():
        if name in record:
            rows += [dict(c, sweep={float(k): v for k, v in c["sweep"].items()}, source="record")
                     for c in record[name]["configurations"]]
            continue
        for c in st.args.configs:
            f = seed_finals(st, c)
            ok = [v for v in f.values() if cv.finite(v)]
            lr = st.best_lr(c)
            sweep = {r.lr: r.result()[0] for r in st.sweep_runs(c) if r.done()}
            edge = "" if lr is None or len(st.args.lrs) < 2 else (
                "lower edge" if lr == min(st.args.lrs) else "upper edge" if lr == max(st.args.lrs) else "")
            rows.append({"study": name, "configuration": c, "best_lr": lr, "edge": edge, "sweep": sweep,
                         "n": len(ok), "n_plan": st.args.seeds, "diverged": len(f) - len(ok),
                         "missing": st.args.seeds - len(f), "mean": statistics.fmean(ok) if ok else float("nan"),
                         "sd": statistics.stdev(ok) if len(ok) > 1 else float("nan"),
                         "seed_finals": {str(k): v for k, v in sorted(f.items())}, "source": "runs"})
    return rows


def cmd_report(a, studies):
    record = load_record(a, studies)
    for name in parts(a):
        if name in record:
            print(f"table1: {name} study: no finished run under {a.out_root}; decided from the record {a.record}",
                  flush=True)
            continue
        studies[name].out.mkdir(parents=True, exist_ok=True)
        print(f"table1: {name} study: convergence.py's report", flush=True)
        studies[name].report()
    cmd_plan(a, studies, quiet=True)
    rows = [compare(studies, c, record) for c in COMPARISONS]
    m = finish(rows)
    claims, configs = claim_verdicts(rows), config_summary(studies, record)
    write_outputs(a, rows, m, claims, configs, record)
    print((Path(a.out_root) / "decision.md").read_text())
    copy_docs(a, studies, record)
    root = Path(a.out_root)
    print(f"report: {root / 'decision.md'}, {root / 'decision.csv'}, {root / 'decision.json'}")


# ---------------------------------------------------------------------------------------------

def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("command", nargs="?", default="all", choices=["plan", "run", "diag", "report", "all"],
                   help="all = run, diag, report")
    p.add_argument("--part", default="both", choices=["width", "length", "both"],
                   help="sub-study of run, diag and the per-study report (the decision covers both)")
    p.add_argument("--out-root", default=str(REPO / "results" / "table1"), help="studies in OUT_ROOT/width, /length")
    p.add_argument("--docs", default=str(REPO / "docs" / "results" / "table1"),
                   help='where report copies the summaries ("": nowhere)')
    p.add_argument("--record", default=str(REPO / "docs" / "results" / "table1" / "decision.json"),
                   help="report: a study without one finished run under OUT_ROOT is decided from this committed "
                        'decision.json (and diag/ beside it) of a report that had its runs ("": never)')
    p.add_argument("--s3r", default=str(REPO / "build" / "release" / "tools" / "s3r"), help="the s3r binary")
    p.add_argument("--data", default=str(REPO / "data" / "nlp-corpus"), help="corpus folder (train.bin, val.bin)")
    p.add_argument("--jobs", type=int, default=2, help="runs at a time")
    p.add_argument("--threads", type=int, default=1, help="OpenMP threads per run")
    p.add_argument("--tiny-plan-for-tests", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.jobs < 1 or a.threads < 1:
        p.error("--jobs and --threads must be >= 1")
    # Absolute paths, exactly as given otherwise: they are part of the recorded train argv.
    a.out_root, a.s3r, a.data = (os.path.abspath(x) for x in (a.out_root, a.s3r, a.data))
    a.docs, a.record = (os.path.abspath(x) if x else "" for x in (a.docs, a.record))
    return a


def main(argv):
    a = parse_args(argv)
    studies = make_studies(a)
    failed = []
    try:
        if a.command == "plan":
            cmd_plan(a, studies)
        if a.command in ("run", "all"):
            cmd_run(a, studies)
        if a.command in ("diag", "all"):
            failed = cmd_diag(a, studies)
        if a.command in ("report", "all"):
            cmd_report(a, studies)
    except cv.StudyError as e:
        fail(str(e))
    if failed:
        fail(f"{len(failed)} diagnostic(s) failed: {', '.join(failed)}")


if __name__ == "__main__":
    main(sys.argv[1:])
