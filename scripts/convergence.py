#!/usr/bin/env python3
"""Convergence study (the paper's Table I and Figure 3) at this machine's scale, over `s3r train`.

Protocol (the paper's): every configuration is trained at each learning rate of a small sweep on
seed 0; its best learning rate (lowest final validation loss) is then run on the other seeds. The
table reports the final validation loss as mean +- sample standard deviation over seeds, the gap
to bf16, and Welch's t-test against sr. A width sweep (sr, s3r, s3r + dx at several model widths,
one seed, one learning rate) shows how the cost of sharing a threshold moves with the width
(SPEC section 5, Proposition 1).

Every run is an ordinary `s3r train` run folder under OUT/runs or OUT/width. A finished run gets a
done.json and is reused when the study is started again; an interrupted run continues bit-exactly
from its last checkpoint (--resume). Runs are scheduled longest first on --jobs parallel lanes of
--threads OpenMP threads each.

Outputs in OUT: table1.md / table1.csv (Table I), lr_sweep.csv, width.md / width.csv,
val_curves.png (mean validation loss per configuration with a +-1 sd band over seeds), study.json
(plan, machine, every run's final loss and wall time).

Diverged runs: s3r train writes a non-finite loss into metrics.jsonl as JSON null (and stops a run
whose steps stay non-finite). Such a run's final validation loss is NaN: the tables and CSV files
show it as "nan" / "diverged" and count it in the `diverged` column, and it is excluded, with a
note saying so, from every mean, sd, gap, t-test and plotted curve; no statistic is ever taken
over a NaN. JSON outputs (done.json, study.json) write NaN as null, as s3r does.

Usage: scripts/convergence.py [--out results/convergence] [--jobs 2] [--dry-run] [--report-only]
"""
import argparse
import concurrent.futures
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

# fmt, write_csv: for scripts/table1*.py, as convergence.fmt and convergence.write_csv
from convergence_common import (CONFIGS, WIDTH_CONFIGS, as_loss, dumps, finite, fmt,  # noqa: F401
                                fmt_loss, write_atomic, write_csv)
from convergence_report import StudyReport
from study_stats import paired, t_two_sided_p, welch  # noqa: F401 (for the tests, as convergence.*)

REPO = Path(__file__).resolve().parent.parent
# What `s3r train` says when it stops a run after consecutive non-finite steps.
DIVERGED = "consecutive steps had a non-finite loss or gradient"


class StudyError(Exception):
    """A run failed for a reason other than divergence (bad input, a crash)."""


# ---------------------------------------------------------------------------------------------
# Runs.

class Run:
    """One `s3r train` invocation and its run folder."""

    def __init__(self, study, group, config, lr, seed, width=None):
        self.study, self.group, self.config, self.lr, self.seed, self.width = (
            study, group, config, lr, seed, width)
        mode, corr = {n: (m, c) for n, m, c in CONFIGS}[config]
        self.mode, self.correction = mode, corr
        sub = f"C={width}/" if width else ""
        self.dir = study.out / group / config / f"{sub}lr={lr:.10g}" / f"seed={seed}"

    def key(self):
        return (self.group, self.config, self.width, self.lr, self.seed)

    def cost(self):
        """Relative wall time, for longest-first scheduling."""
        w = (self.width or self.study.args.width) / 256.0
        return w * w * (1.6 if self.mode == "bf16" else 1.0)

    def label(self):
        w = f" C={self.width}" if self.width else ""
        return f"{self.config}{w} lr={self.lr:g} seed={self.seed}"

    def done(self):
        """Finished with these options; a finished run made with other options stops the study."""
        path = self.dir / "done.json"
        if not path.is_file():
            return False
        recorded = json.loads(path.read_text()).get("argv", [])
        if options_of(recorded) != options_of(self.argv()):
            raise StudyError(f"{self.dir} was trained with other options ({' '.join(recorded[1:])}); "
                             f"use another --out or delete that folder")
        return True

    def result(self):
        """(final validation loss or NaN if the run diverged, wall seconds, validation curve
        [(step, loss or NaN)])."""
        info = json.loads((self.dir / "done.json").read_text())
        return (as_loss(info["final_val_loss"]), info["wall_s"],
                [(int(s), as_loss(v)) for s, v in info["val_curve"]])

    def argv(self):
        a = self.study.args
        cmd = [str(a.s3r), "train", "--preset", a.preset] + (["--arch", a.arch] if a.arch != "llama" else []) + [
               "--data", str(a.data), "--mode", self.mode,
               "--correction", self.correction, "--seed", str(self.seed), "--steps", str(a.steps),
               "--lr", f"{self.lr:.10g}", "--min-lr", f"{self.lr * a.min_lr_ratio:.10g}",
               "--warmup", str(a.warmup), "--eval-every", str(a.eval_every),
               "--eval-batches", str(a.eval_batches), "--checkpoint-every", str(a.checkpoint_every),
               "--out", str(self.dir)]
        for flag, value in (("--seq-len", a.seq_len), ("--batch", a.batch), ("--layers", a.layers),
                            ("--heads", a.heads), ("--vocab", a.vocab)):
            if value:
                cmd += [flag, str(value)]
        width = self.width or a.width
        cmd += ["--width", str(width), "--ffn", f"{width * a.ffn_ratio:g}"]
        return cmd

    def execute(self):
        """Runs (or resumes) the training; writes done.json. Returns the final validation loss."""
        cmd = self.argv()
        # A crash during a save can leave the newest checkpoint in checkpoint.tmp/ or .old/;
        # s3r train --resume finds it there.
        if any((self.dir / name).exists() for name in ("checkpoint", "checkpoint.tmp", "checkpoint.old")):
            cmd += ["--resume", str(self.dir)]
        elif self.dir.exists():
            shutil.rmtree(self.dir)  # started but never checkpointed: start over
        self.dir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, OMP_NUM_THREADS=str(self.study.args.threads))
        start = time.monotonic()
        with open(self.dir / "train.log", "a") as log:
            log.write("$ " + " ".join(cmd) + "\n")
            log.flush()
            rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env).returncode
        wall = time.monotonic() - start
        curve = read_val_curve(self.dir / "metrics.jsonl")
        final = curve[-1][1] if rc == 0 and curve and curve[-1][0] == self.study.args.steps else float("nan")
        if rc == 0 and math.isnan(final) and not (curve and curve[-1][0] == self.study.args.steps):
            raise StudyError(f"{self.label()}: s3r train finished but {self.dir / 'metrics.jsonl'} has no "
                             f"validation loss at step {self.study.args.steps}")
        if rc != 0:
            tail = " ".join((self.dir / "train.log").read_text().strip().splitlines()[-1:])
            if DIVERGED not in tail:  # bad input or a crash: not a result; stop the study
                raise StudyError(f"{self.label()}: s3r train exited with status {rc}: {tail} "
                                 f"(log: {self.dir / 'train.log'})")
            print(f"  {self.label()}: diverged: {tail}", flush=True)
        elif math.isnan(final):
            print(f"  {self.label()}: diverged: the final validation loss is NaN", flush=True)
        info = {"config": self.config, "mode": self.mode, "correction": self.correction,
                "lr": self.lr, "seed": self.seed, "width": self.width, "exit_status": rc,
                "final_val_loss": final, "wall_s": wall, "val_curve": curve, "argv": cmd}
        write_atomic(self.dir / "done.json", dumps(info))
        return final


def options_of(argv):
    """A train command line without the binary and without --resume DIR: the run's options."""
    out, skip = [], False
    for i, x in enumerate(argv[1:]):
        if skip:
            skip = False
        elif x == "--resume":
            skip = True
        else:
            out.append(x)
    return out


def read_val_curve(metrics):
    """[(step (1-based), validation loss or NaN)] from a run's metrics.jsonl (null: NaN)."""
    curve = []
    if metrics.is_file():
        for line in metrics.read_text().splitlines():
            try:
                j = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(j, dict) and "val_loss" in j and isinstance(j.get("step"), int):
                curve.append((j["step"] + 1, as_loss(j["val_loss"])))
    return curve



# ---------------------------------------------------------------------------------------------
# The study: plan and schedule (its report: convergence_report.py).

class Study(StudyReport):
    def __init__(self, args):
        self.args = args
        self.out = args.out
        self.lock = threading.Lock()

    def sweep_runs(self, config):
        return [Run(self, "runs", config, lr, 0) for lr in self.args.lrs]

    def best_lr(self, config):
        """The sweep's best learning rate (lowest final loss on seed 0); None until all are done."""
        runs = self.sweep_runs(config)
        if not all(r.done() for r in runs):
            return None
        scored = [(r.result()[0], r.lr) for r in runs]
        ok = [s for s in scored if finite(s[0])]
        return min(ok)[1] if ok else min(r.lr for r in runs)

    def seed_runs(self, config):
        lr = self.best_lr(config)
        if lr is None:
            return []
        return [Run(self, "runs", config, lr, s) for s in range(self.args.seeds)]

    def width_lr(self):
        """One learning rate for the whole width sweep: sr's best at the base width."""
        return self.args.width_lr or self.best_lr("sr")

    def width_runs(self):
        lr = self.width_lr()
        if lr is None or not self.args.widths:
            return []
        base = self.args.width
        runs = []
        for w in self.args.widths:
            for c in WIDTH_CONFIGS:
                # The base width is the main study's seed-0 run at that learning rate.
                runs.append(Run(self, "runs", c, lr, 0) if w == base else Run(self, "width", c, lr, 0, w))
        return runs

    def planned(self):
        """Every run that can be named now (seed and width runs appear once their sweep is done)."""
        runs = {}
        for name in self.args.configs:
            for r in self.sweep_runs(name) + self.seed_runs(name):
                runs[r.key()] = r
        for r in self.width_runs():
            runs[r.key()] = r
        return runs

    def total_runs(self):
        n_cfg = len(self.args.configs)
        n = n_cfg * len(self.args.lrs) + n_cfg * (self.args.seeds - 1)
        base = self.args.width
        n += len([w for w in self.args.widths if w != base]) * len(WIDTH_CONFIGS)
        if base in self.args.widths:  # base-width runs of configurations outside the main study
            n += len([c for c in WIDTH_CONFIGS if c not in self.args.configs])
        return n

    def schedule(self):
        """Runs everything not yet done, longest first, on --jobs lanes; new runs become ready
        as sweeps finish."""
        started, finished, t0 = set(), [], time.monotonic()
        total = self.total_runs()
        already = sum(1 for r in self.planned().values() if r.done())
        print(f"study: {total} runs planned ({already} already done, reused); "
              f"{self.args.jobs} lanes x {self.args.threads} thread(s); out {self.out}", flush=True)
        with concurrent.futures.ThreadPoolExecutor(self.args.jobs) as pool:
            running = {}
            while True:
                ready = [r for r in self.planned().values() if not r.done() and r.key() not in started]
                ready.sort(key=lambda r: -r.cost())
                while ready and len(running) < self.args.jobs:
                    r = ready.pop(0)
                    started.add(r.key())
                    print(f"[{time.strftime('%H:%M:%S')}] start {r.label()}", flush=True)
                    running[pool.submit(r.execute)] = (r, time.monotonic())
                if not running:
                    break
                done, _ = concurrent.futures.wait(running, return_when=concurrent.futures.FIRST_COMPLETED)
                for fut in done:
                    r, s = running.pop(fut)
                    final = fut.result()
                    finished.append(time.monotonic() - s)
                    left = total - sum(1 for x in self.planned().values() if x.done())
                    left = max(left, 0)
                    eta = statistics.fmean(finished) * left / self.args.jobs
                    print(f"[{time.strftime('%H:%M:%S')}] done  {r.label()}: final validation loss "
                          f"{final:.4f}{' (diverged)' if math.isnan(final) else ''} in {finished[-1]:.0f} s; {left} runs left, "
                          f"eta {eta / 60:.0f} min", flush=True)
        print(f"study: ran {len(finished)} runs in {(time.monotonic() - t0) / 60:.1f} min", flush=True)

    # -- report ----------------------------------------------------------------------------------

    def machine(self):
        for r in self.planned().values():
            log = r.dir / "train.log"
            if log.is_file():
                for line in log.read_text().splitlines():
                    if line.strip().startswith("machine"):
                        return line.strip()[len("machine"):].strip()
        return "unknown"

    def collect(self):
        """The finished runs: (configuration, best lr, final losses of its seeds) rows, the
        validation curves to plot, the sweep's rows, and each configuration's losses by seed."""
        rows, curves, sweep_rows, by_seed = [], {}, [], {}
        for name in self.args.configs:
            for r in self.sweep_runs(name):
                if r.done():
                    v = r.result()[0]
                    sweep_rows.append([name, f"{r.lr:.10g}", fmt_loss(v), int(not finite(v))])
            runs = [r for r in self.seed_runs(name) if r.done()]
            vals = [r.result()[0] for r in runs]
            by_seed[name] = {r.seed: r.result()[0] for r in runs}
            # Curves of diverged runs are left out of the plot (and its title says how many).
            curves[name] = ([r.result()[2] for r in runs if finite(r.result()[0])], len(runs))
            rows.append((name, self.best_lr(name), vals))
        return rows, curves, sweep_rows, by_seed

def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--out", type=Path, default=REPO / "results" / "convergence")
    p.add_argument("--s3r", type=Path, default=REPO / "build" / "release" / "tools" / "s3r")
    p.add_argument("--data", type=Path, default=REPO / "data" / "nlp-corpus")
    p.add_argument("--preset", default="small")
    p.add_argument("--arch", default="llama", help="model family (s3r train --arch; llama adds nothing to the argv)")
    p.add_argument("--seq-len", type=int, default=128, help="S (0: the preset's)")
    p.add_argument("--batch", type=int, default=8, help="B (0: the preset's)")
    p.add_argument("--layers", type=int, default=0, help="L (0: the preset's)")
    p.add_argument("--heads", type=int, default=0, help="attention heads (0: the preset's)")
    p.add_argument("--vocab", type=int, default=0, help="V (0: the preset's; must match the data)")
    p.add_argument("--width", type=int, default=256, help="base width C (small's); F = --ffn-ratio x C")
    p.add_argument("--ffn-ratio", type=float, default=3,
                   help="F = ratio x C (small: 768 = 3 x 256; qwen3moe's experts: 0.375, 96 at C = 256)")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--lrs", type=lambda s: [float(x) for x in s.split(",")], default=[7.5e-4, 1.5e-3, 3e-3],
                   help="learning-rate sweep on seed 0")
    p.add_argument("--min-lr-ratio", type=float, default=0.1, help="cosine floor as a fraction of the lr")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--configs", type=lambda s: s.split(","), default=[c[0] for c in CONFIGS])
    p.add_argument("--widths", type=lambda s: [int(x) for x in s.split(",")] if s else [],
                   default=[128, 256, 512], help="width sweep (empty: none)")
    p.add_argument("--width-lr", type=float, default=0.0, help="lr of the width sweep (0: sr's best)")
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--eval-batches", type=int, default=16)
    p.add_argument("--checkpoint-every", type=int, default=100)
    p.add_argument("--jobs", type=int, default=2, help="runs at a time")
    p.add_argument("--threads", type=int, default=1, help="OpenMP threads per run")
    p.add_argument("--dry-run", action="store_true", help="print the plan and the first commands")
    p.add_argument("--report-only", action="store_true", help="only rebuild the tables and the plot")
    a = p.parse_args(argv)
    known = [c[0] for c in CONFIGS]
    for c in a.configs:
        if c not in known:
            p.error(f"--configs: unknown configuration '{c}'; expected some of {','.join(known)}")
    if "sr" not in a.configs and a.widths and not a.width_lr:
        p.error("the width sweep takes sr's best lr: include sr in --configs or give --width-lr")
    for name in ("width", "steps", "seeds", "jobs", "threads", "eval_every", "eval_batches", "checkpoint_every"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(a, name)}")
    if not (a.ffn_ratio > 0) or any(w * a.ffn_ratio != int(w * a.ffn_ratio) for w in [a.width] + a.widths):
        p.error(f"--ffn-ratio must be > 0 and give a whole F for every width, got {a.ffn_ratio:g}")
    if not a.lrs or any(not (x > 0) for x in a.lrs):
        p.error("--lrs: learning rates must be positive")
    if any(w < 1 for w in a.widths):
        p.error("--widths: widths must be >= 1")
    a.lrs = sorted(set(a.lrs))
    a.widths = sorted(set(a.widths))
    return a


def main(argv):
    a = parse_args(argv)
    if not a.report_only:
        if not a.s3r.is_file():
            sys.exit(f"convergence: error: no s3r binary at {a.s3r} (run scripts/setup.sh)")
        for f in ("train.bin", "val.bin"):
            if not (a.data / f).is_file():
                sys.exit(f"convergence: error: no {f} in {a.data} (run scripts/fetch_data.sh)")
    a.out.mkdir(parents=True, exist_ok=True)
    study = Study(a)
    if a.dry_run:
        print(f"study: {study.total_runs()} runs; first commands:")
        for r in list(study.planned().values())[:3]:
            print("  " + " ".join(r.argv()))
        return
    if not a.report_only:
        try:
            study.schedule()
        except StudyError as e:
            sys.exit(f"convergence: error: {e}")
    study.report()


if __name__ == "__main__":
    main(sys.argv[1:])
