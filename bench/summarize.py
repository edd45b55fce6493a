#!/usr/bin/env python3
"""Markdown tables of the medians in Google Benchmark JSON files (bench/README.md).

Usage: bench/summarize.py RUN [RUN ...] > tables.md

Each RUN is a directory of JSON files written by --benchmark_out=FILE --benchmark_out_format=json
(for example one run of bench/run_benchmarks.py), or a single such file. The benchmarks must have
been run with --benchmark_repetitions=N; this script reads their "median" aggregates.

- A rate is the median over the RUNs of each run's median (with one RUN: that run's median).
- A ratio (e.g. time of s3r / time of rtne) is taken within each run, between two benchmarks of
  the same JSON file, hence of the same process; then the median over the RUNs.
- Rates are in G items/s (words/s or elements/s) and GB/s, G = 1e9.
"""
import json
import pathlib
import re
import statistics
import sys


class Results:
    def __init__(self, run_args):
        self.runs = []  # per RUN: {name: (file, median run)}
        self.context = None
        for arg in run_args:
            path = pathlib.Path(arg)
            files = sorted(p for p in path.glob("*.json") if p.name != "runs.json") \
                if path.is_dir() else [path]
            run = {}
            for f in files:
                data = json.loads(f.read_text())
                self.context = self.context or data.get("context", {})
                for b in data.get("benchmarks", []):
                    if b.get("run_type") != "aggregate" or b.get("aggregate_name") != "median":
                        continue
                    if b.get("error_occurred"):
                        continue
                    run[b["run_name"].removesuffix("/real_time")] = (str(f), b)
            self.runs.append(run)

    def names(self):
        return sorted({n for run in self.runs for n in run})

    def values(self, name, key):
        out = []
        for run in self.runs:
            if name in run and key in run[name][1]:
                out.append(run[name][1][key] / 1e9)
        return out

    def rate(self, name, key="items_per_second"):
        v = self.values(name, key)
        return statistics.median(v) if v else None

    def ratio(self, name, base):
        """Median over runs of time(name) / time(base), both from the same file of a run."""
        out = []
        for run in self.runs:
            if name in run and base in run and run[name][0] == run[base][0]:
                out.append(run[name][1]["real_time"] / run[base][1]["real_time"])
        return statistics.median(out) if out else None


def fmt(x, digits=2):
    return "-" if x is None else f"{x:.{digits}f}"


def context_lines(res):
    ctx = res.context or {}
    keys = ["cpu_model", "num_cpus", "mhz_per_cpu", "s3r_active_isa", "s3r_cpu_has_avx512",
            "omp_max_threads", "omp_num_procs", "s3r_build_type", "compiler", "date"]
    out = [f"- {k}: {ctx[k]}" for k in keys if k in ctx]
    caches = ctx.get("caches", [])
    if caches:
        out.append("- caches (as reported): " + ", ".join(
            f"L{c['level']} {c['type']} {c['size'] // 1024} KiB" for c in caches))
    out.append(f"- runs summarized: {len(res.runs)}")
    return out


def rng_table(res):
    cols = [(16384, 1), (262144, 1), (262144, 2), (4194304, 1), (4194304, 2)]
    labels = {16384: "64 KiB", 262144: "1 MiB", 4194304: "16 MiB"}
    lines = ["G words/s; in parentheses: per thread.", "",
             "| generator | ISA | " + " | ".join(f"{labels[w]}, {t} thr" for w, t in cols) + " |",
             "|---|---|" + "---:|" * len(cols)]
    for gen in ("threefry", "philox"):
        for isa in ("avx512", "ref"):
            cells = []
            for w, t in cols:
                r = res.rate(f"rng/{gen}/{isa}/words:{w}/threads:{t}")
                cells.append(fmt(r, 3) if t == 1 or r is None else f"{r:.3f} ({r / t:.3f})")
            lines.append(f"| {gen} | {isa} | " + " | ".join(cells) + " |")
    return lines


def clock_lines(res):
    s, v = res.rate("clock/scalar_add_chain"), res.rate("clock/avx512_add_chain")
    if s is None and v is None:
        return []
    return [f"Effective clock (dependent add chains): scalar {fmt(s)} GHz, "
            f"AVX-512 {fmt(v)} GHz.", ""]


def bandwidth_table(res):
    threads = sorted({int(m.group(1)) for n in res.names()
                      if (m := re.match(r"bandwidth/.*/threads:(\d+)$", n))})
    lines = ["GB/s (copy counts read + write bytes).", "",
             "| kernel | " + " | ".join(f"{t} thr" for t in threads) + " |",
             "|---|" + "---:|" * len(threads)]
    for kind in ("read/16MiB", "read/64MiB", "read/1GiB", "write/64MiB", "copy/64MiB"):
        cells = [fmt(res.rate(f"bandwidth/{kind}/threads:{t}", "bytes_per_second"), 1)
                 for t in threads]
        lines.append(f"| {kind} | " + " | ".join(cells) + " |")
    return lines


MODES = ("rtne", "sr", "s3r", "s3r-bcast")


def grad_tables(res):
    """One table per (dtype, ISA): rows mode x stats, columns (N, threads)."""
    pat = re.compile(r"grad_quant/(\w+)/([\w-]+)/stats:(\d)/N:(\d+)/threads:(\d+)/(\w+)$")
    keys = {}
    for name in res.names():
        if m := pat.match(name):
            dtype, _, _, n, t, isa = m.groups()
            keys.setdefault((dtype, isa), set()).add((int(n), int(t)))
    lines = []
    for dtype, isa in sorted(keys, key=lambda k: (k[1] != "avx512", k[0] != "f32", k)):
        cols = sorted(keys[(dtype, isa)])
        lines += [f"**G {dtype}, {isa}** (T = 2048, S = 512). Per cell: G elements/s / GB/s "
                  "moved / time relative to rtne without statistics (same N and threads, same "
                  "process).", "",
                  "| mode | stats | " + " | ".join(f"N={n}, {t} thr" for n, t in cols) + " |",
                  "|---|---|" + "---:|" * len(cols)]
        for mode in MODES:
            for stats in ("0", "1"):
                cells = []
                for n, t in cols:
                    name = f"grad_quant/{dtype}/{mode}/stats:{stats}/N:{n}/threads:{t}/{isa}"
                    base = f"grad_quant/{dtype}/rtne/stats:0/N:{n}/threads:{t}/{isa}"
                    r = res.rate(name)
                    cells.append("-" if r is None else
                                 f"{r:.2f} / {fmt(res.rate(name, 'bytes_per_second'), 1)} / "
                                 f"{fmt(res.ratio(name, base))}x")
                lines.append(f"| {mode} | {'yes' if stats == '1' else 'no'} | " +
                             " | ".join(cells) + " |")
        lines.append("")
    return lines


def grad_l2_table(res):
    pat = re.compile(r"grad_quant_l2/f32/[\w-]+/stats:\d/T:512/N:512/threads:(\d+)/avx512$")
    threads = sorted({int(m.group(1)) for n in res.names() if (m := pat.match(n))})
    lines = ["**Cache-resident G** (f32, T = N = 512: 1 MiB, AVX-512). Per cell: G elements/s / "
             "time relative to rtne without statistics.", "",
             "| mode | stats | " + " | ".join(f"{t} thr" for t in threads) + " |",
             "|---|---|" + "---:|" * len(threads)]
    for mode in MODES:
        for stats in ("0", "1"):
            cells = []
            for t in threads:
                name = f"grad_quant_l2/f32/{mode}/stats:{stats}/T:512/N:512/threads:{t}/avx512"
                base = f"grad_quant_l2/f32/rtne/stats:0/T:512/N:512/threads:{t}/avx512"
                r = res.rate(name)
                cells.append("-" if r is None else f"{r:.2f} / {fmt(res.ratio(name, base))}x")
            lines.append(f"| {mode} | {'yes' if stats == '1' else 'no'} | " +
                         " | ".join(cells) + " |")
    return lines


def fwd_table(res):
    pat = re.compile(r"fwd_quant/(\w+)/(\w+)/threads:(\d+)/(\w+)$")
    rows = sorted({m.groups() for n in res.names() if (m := pat.match(n))},
                  key=lambda g: (g[0], g[3] != "avx512", int(g[2])))
    lines = ["| quantizer | shape | ISA | threads | G elements/s | GB/s |",
             "|---|---|---|---:|---:|---:|"]
    for kind, shape, t, isa in rows:
        name = f"fwd_quant/{kind}/{shape}/threads:{t}/{isa}"
        lines.append(f"| {kind} | {shape} | {isa} | {t} | {fmt(res.rate(name))} | "
                     f"{fmt(res.rate(name, 'bytes_per_second'), 1)} |")
    return lines


def spread_lines(res, limit=0.10):
    """Benchmarks whose per-run medians differ by more than `limit` (relative to their median)."""
    out = []
    for name in res.names():
        key = "bytes_per_second" if name.startswith("bandwidth/") else "items_per_second"
        v = res.values(name, key)
        if len(v) >= 2 and (max(v) - min(v)) / statistics.median(v) > limit:
            out.append(f"- {name}: " + ", ".join(f"{x:.3g}" for x in v))
    return out


def main(args):
    res = Results(args)
    names = res.names()
    out = ["### Machine", ""] + context_lines(res) + [""]
    out += clock_lines(res)
    if any(n.startswith("rng/") for n in names):
        out += ["### Random words", ""] + rng_table(res) + [""]
    if any(n.startswith("bandwidth/") for n in names):
        out += ["### Memory bandwidth reference", ""] + bandwidth_table(res) + [""]
    if any(n.startswith("grad_quant/") for n in names):
        out += ["### Backward quantizer", ""] + grad_tables(res)
    if any(n.startswith("grad_quant_l2/") for n in names):
        out += grad_l2_table(res) + [""]
    if any(n.startswith("fwd_quant/") for n in names):
        out += ["### Forward quantizers", ""] + fwd_table(res) + [""]
    if len(res.runs) > 1:
        spread = spread_lines(res)
        out += ["### Run-to-run spread above 10% (per-run medians, G items/s or GB/s)", ""]
        out += spread or ["(none)"]
    print("\n".join(out))


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
