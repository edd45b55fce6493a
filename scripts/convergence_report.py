"""scripts/convergence.py's report: Table I (table1.md / .csv, with Welch's and the paired test
against sr), the learning-rate sweep, the width sweep and the validation curves (gnuplot), from
the study's finished runs. StudyReport is a mixin of convergence.Study, whose plan (collect,
machine, width_runs, width_lr, planned) it reads."""
import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

from convergence_common import (COLORS, CONFIGS, dumps, finite, fmt, fmt_loss, write_atomic,
                                write_csv)
from study_stats import paired, welch


class StudyReport:
    @staticmethod
    def compare_row(name, lr, vals, bf16, sr, by_seed, notes):
        """One configuration's markdown line and CSV row: mean, sd, the gap to bf16, Welch's test
        and the paired test against sr; what it leaves out goes to `notes`."""
        sr_seeds = by_seed.get("sr", {})
        # Diverged runs (NaN) are counted, shown as nan, and excluded from every statistic.
        ok = [v for v in vals if finite(v)]
        mode, corr = {n: (m, c) for n, m, c in CONFIGS}[name][0:2]
        mean = statistics.fmean(ok) if ok else float("nan")
        sd = statistics.stdev(ok) if len(ok) > 1 else float("nan")
        gap = mean - statistics.fmean(bf16) if ok and bf16 else float("nan")
        w = welch(ok, sr) if name != "sr" else None
        t, df, p = w if w else (float("nan"),) * 3
        div = len(vals) - len(ok)
        # Pair on the seeds both have and both finished with a finite loss.
        common = sorted(set(by_seed[name]) & set(sr_seeds))
        pairs = [k for k in common if finite(by_seed[name][k]) and finite(sr_seeds[k])]
        pr = None
        if name != "sr":
            pr = paired([by_seed[name][k] for k in pairs], [sr_seeds[k] for k in pairs])
        if div and not ok:
            notes.append(f"{name}: all {div} seeds diverged (final validation loss NaN): no mean, sd, "
                         f"gap or test")
        elif div:
            notes.append(f"{name}: {div} of {len(vals)} seeds diverged (final validation loss NaN); "
                         f"mean, sd, gap and Welch's test use the other {len(ok)}")
        if ok and name != "sr" and len(pairs) < len(common):
            notes.append(f"{name}: the paired test vs sr leaves out seed(s) "
                         f"{', '.join(str(k) for k in common if k not in pairs)} (diverged in {name} or sr)"
                         f"{'' if pr else '; too few pairs left for it'}")
        pd, psd, pt, _, pp = pr if pr else (float("nan"),) * 5
        loss_cell = ("no finished run" if not vals else "diverged (NaN)" if not ok
                     else f"{mean:.4f} +- {fmt(sd, '.4f') or 'n/a'}")
        line = (f"| {name} | {'sweep not finished' if lr is None else f'{lr:g}'} | {loss_cell} | "
                f"{len(ok)}{f' ({div} diverged, excluded)' if div else ''} | {fmt(gap, '+.4f')} | "
                f"{'' if name == 'sr' else fmt(t, '+.2f')} | {'' if name == 'sr' else fmt(df, '.1f')} | "
                f"{'' if name == 'sr' else fmt(p, '.3f')} | "
                f"{'' if not pr else f'{pd:+.4f} +- {psd:.4f}'} | {fmt(pt, '+.2f')} | {fmt(pp, '.3f')} |")
        row = [name, mode, corr, lr, fmt(mean, ".5f"), fmt(sd, ".5f"), len(ok), div,
               fmt(gap, "+.5f"), fmt(t, "+.3f"), fmt(df, ".2f"), fmt(p, ".4f"),
               fmt(pd, "+.5f"), fmt(psd, ".5f"), fmt(pt, "+.3f"), fmt(pp, ".4f"),
               " ".join(fmt_loss(v) for v in vals)]
        return line, row

    def report(self):
        a, out = self.args, self.out
        rows, curves, sweep_rows, by_seed = self.collect()
        finite_of = {name: [v for v in vals if finite(v)] for name, _, vals in rows}
        bf16, sr = finite_of.get("bf16", []), finite_of.get("sr", [])
        md = ["| configuration | best lr | final validation loss (mean +- sd) | seeds | gap to bf16 | "
              "Welch t vs sr | df | p | paired diff vs sr (mean +- sd) | paired t | paired p |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
        table = [["configuration", "mode", "correction", "best_lr", "mean", "sd", "n_seeds",
                  "diverged", "gap_to_bf16", "welch_t_vs_sr", "welch_df", "welch_p",
                  "paired_diff_vs_sr", "paired_sd", "paired_t", "paired_p", "values"]]
        notes = []
        for name, lr, vals in rows:
            line, row = self.compare_row(name, lr, vals, bf16, sr, by_seed, notes)
            md.append(line)
            table.append(row)
        if notes:
            md += [""] + [f"Note: {n}." for n in notes]
        header = self.header()
        write_atomic(out / "table1.md", header + "\n".join(md) + "\n")
        write_csv(out / "table1.csv", table)
        write_csv(out / "lr_sweep.csv", [["configuration", "lr", "final_val_loss_seed0", "diverged"]] + sweep_rows)
        width_md = self.width_report()
        self.plot(curves)
        study = {"argv": sys.argv, "machine": self.machine(), "options": {
            k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()},
            "runs": [dict(json.loads((r.dir / "done.json").read_text()), dir=str(r.dir))
                     for r in self.planned().values() if r.done()]}
        write_atomic(out / "study.json", dumps(study))
        print(header + "\n".join(md) + "\n")
        if width_md:
            print(width_md)
        print(f"report: {out / 'table1.md'}, {out / 'table1.csv'}, {out / 'lr_sweep.csv'}, "
              f"{out / 'width.md'}, {out / 'val_curves.png'}, {out / 'study.json'}")

    def header(self):
        a = self.args
        return (f"Final validation loss after {a.steps} steps (preset {a.preset}"
                f"{', S=' + str(a.seq_len) if a.seq_len else ''}{', B=' + str(a.batch) if a.batch else ''}"
                f", C={a.width}, F={a.width * a.ffn_ratio:g}; lr sweep {' '.join(f'{x:g}' for x in a.lrs)} "
                f"on seed 0, then {a.seeds} seeds at the best lr; validation on {a.eval_batches} fixed "
                f"batches). Machine: {self.machine()}.\n\n")

    def width_report(self):
        runs = [r for r in self.width_runs() if r.done()]
        if not runs:
            return ""
        by = {}
        for r in runs:
            by.setdefault(r.width or self.args.width, {})[r.config] = r.result()[0]
        md = [f"Width sweep: seed 0, lr {self.width_lr():g} for every run, F = {self.args.ffn_ratio:g} C.\n",
              "| width C | sr | s3r | s3r+dx | s3r - sr | s3r+dx - sr |", "|---|---|---|---|---|---|"]
        rows = [["width", "sr", "s3r", "s3r+dx", "s3r_minus_sr", "s3r_dx_minus_sr", "diverged"]]
        diverged_any = False
        for w in sorted(by):
            v = by[w]
            # A run not (yet) done is "" (missing); a diverged one is NaN, shown as such; a
            # difference with a diverged operand is left empty, never computed.
            sr, s, sd = (v.get(c) for c in ("sr", "s3r", "s3r+dx"))
            div = [c for c in ("sr", "s3r", "s3r+dx") if v.get(c) is not None and not finite(v[c])]
            diverged_any = diverged_any or bool(div)
            cell = lambda x: "" if x is None else ("diverged (NaN)" if not finite(x) else f"{x:.4f}")
            diff = lambda x, y: x - y if finite(x) and finite(y) else float("nan")
            md.append(f"| {w} | {cell(sr)} | {cell(s)} | {cell(sd)} | {fmt(diff(s, sr), '+.4f')} | "
                      f"{fmt(diff(sd, sr), '+.4f')} |")
            rows.append([w, fmt_loss(sr), fmt_loss(s), fmt_loss(sd), fmt(diff(s, sr), "+.5f"),
                         fmt(diff(sd, sr), "+.5f"), " ".join(div)])
        if diverged_any:
            md.append("\nNote: diverged runs (NaN) have no difference to sr.")
        text = "\n".join(md) + "\n"
        write_atomic(self.out / "width.md", text)
        write_csv(self.out / "width.csv", rows)
        return text

    def plot(self, curves):
        """val_curves.png: mean over seeds per configuration with a +-1 sd band (gnuplot).
        curves: name -> (curves of the runs with a finite final loss, number of runs)."""
        data = self.out / "plot"
        data.mkdir(exist_ok=True)
        series = []
        for name, (runs, total) in curves.items():
            diverged = total - len(runs)
            if not runs:
                if diverged:
                    print(f"plot: {name}: all {total} runs diverged (NaN); not drawn")
                continue
            steps = sorted(set.intersection(*[set(s for s, _ in c) for c in runs]))
            path = data / f"{name}.dat"
            gaps = []
            with open(path, "w") as f:
                for s in steps:
                    vs = [dict(c)[s] for c in runs]
                    if not all(finite(v) for v in vs):  # a NaN on the way: no point, not a mean
                        gaps.append(s)
                        continue
                    m = statistics.fmean(vs)
                    sd = statistics.stdev(vs) if len(vs) > 1 else 0.0
                    f.write(f"{s} {m} {m - sd} {m + sd}\n")
            if gaps:
                print(f"plot: {name}: no point at step(s) {', '.join(map(str, gaps))}: a validation loss "
                      f"there is NaN")
            title = name + (f" ({diverged} of {total} diverged, not drawn)" if diverged else "")
            if diverged:
                print(f"plot: {name}: {diverged} of {total} runs diverged (NaN); the curve is the mean "
                      f"of the other {len(runs)}")
            series.append((name, path, title))
        if not series or shutil.which("gnuplot") is None:
            print("plot: gnuplot not available or no finished runs; curve data in", data)
            return
        png = self.out / "val_curves.png"
        plots = []
        for name, path, title in series:
            color = COLORS[[c[0] for c in CONFIGS].index(name)]
            dash = 2 if name.startswith("s3r-bcast") else 1  # the per-example family dashed
            plots.append(f"'{path}' using 1:3:4 with filledcurves fs transparent solid 0.15 noborder "
                         f"lc rgb '{color}' notitle")
            plots.append(f"'{path}' using 1:2 with lines lw 2 dt {dash} lc rgb '{color}' title '{title}'")
        half = self.args.steps // 2
        script = (f"set terminal pngcairo size 1400,560; set output '{png}'; set multiplot layout 1,2; "
                  f"set grid; set xlabel 'step'; set ylabel 'validation loss (nats)'; set key top right; "
                  f"set title 'validation loss, mean +- sd over seeds'; plot {', '.join(plots)}; "
                  f"set title 'second half (zoom)'; set key bottom left; set xrange [{half}:*]; set autoscale y; "
                  f"plot {', '.join(plots)}; unset multiplot")
        rc = subprocess.run(["gnuplot", "-e", script], capture_output=True, text=True)
        if rc.returncode != 0:
            print("plot: gnuplot failed:", rc.stderr.strip())
