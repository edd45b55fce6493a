#!/usr/bin/env python3
"""Runs the benchmark executables in groups and writes the tables of docs/BENCHMARKS.md
(dated ones: docs/journal.md).

Usage: bench/run_benchmarks.py [--out DIR] [--build DIR] [--runs R] [--reps N] [--min-time S]
                               [--max-foreign F] [--tries K] [--only GROUP ...]

Each group (GROUPS below) is one process of one executable with one --benchmark_filter, so
every ratio in a table (mode / rtne, avx512 / ref, 2 threads / 1 thread) is measured in a single
process, with its repetitions randomly interleaved. The whole set of groups is run R times
(DIR/run1 .. DIR/runR), one pass after the other, so that slow phases of a shared machine (other
virtual machines using the same L3 and memory) land in different runs. Per run: GROUP.json
(Google Benchmark JSON, every repetition plus the aggregates), GROUP.txt (console) and runs.json
(per group: command, wall time, interference). DIR/summary.md: bench/summarize.py over all runs
(medians of the per-run medians) plus the interference table.

Interference guard, for machines shared with other work: before a group the script waits until
the CPUs have been idle (other processes below 5% of one core) for a few seconds, and after it
it measures the CPU time that other processes used while it ran (busy time from /proc/stat minus
the benchmark's own CPU time). A group whose foreign load exceeds --max-foreign (in cores,
default 0.05) is run again, up to --tries times; the quietest attempt is kept and its foreign
load reported. Without /proc/stat (not Linux) groups simply run once.
"""
import argparse
import json
import os
import pathlib
import resource
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent

# (name, executable, filter). Keep each group small enough to find a quiet window for it.
GROUPS = [
    ("rng_1thread", "s3r_bench_rng", r"^(rng/.*/threads:1/|clock/)"),
    ("rng_2threads", "s3r_bench_rng", r"^rng/.*/threads:2/"),
    ("bandwidth", "s3r_bench_quant", r"^(bandwidth|clock)/"),
    ("grad_f32_n2048", "s3r_bench_quant", r"^grad_quant/f32/.*/N:2048/.*/avx512"),
    ("grad_f32_n8192", "s3r_bench_quant", r"^grad_quant/f32/.*/N:8192/.*/avx512"),
    ("grad_bf16_n2048", "s3r_bench_quant", r"^grad_quant/bf16/.*/N:2048/.*/avx512"),
    ("grad_bf16_n8192", "s3r_bench_quant", r"^grad_quant/bf16/.*/N:8192/.*/avx512"),
    ("grad_l2", "s3r_bench_quant", r"^grad_quant_l2/"),
    ("grad_ref", "s3r_bench_quant", r"^grad_quant/f32/.*/ref"),
    ("fwd", "s3r_bench_quant", r"^fwd_quant/"),
]

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_times():
    """(busy, steal) CPU seconds of the whole machine since boot, or None."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    v = [int(x) for x in fields[1:]]
    busy = v[0] + v[1] + v[2] + v[5] + v[6]  # user nice system irq softirq
    steal = v[7] if len(v) > 7 else 0
    return busy / CLK_TCK, steal / CLK_TCK


def wait_idle(seconds, limit, threshold=0.05):
    """Waits until the machine's busy time stayed below `threshold` cores for `seconds` seconds
    in a row (at most `limit` seconds). Returns the seconds waited."""
    start = time.time()
    quiet = 0.0
    prev = cpu_times()
    if prev is None:
        return 0.0
    while quiet < seconds and time.time() - start < limit:
        time.sleep(1.0)
        cur = cpu_times()
        quiet = quiet + 1.0 if cur[0] - prev[0] < threshold else 0.0
        prev = cur
    return time.time() - start


def children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_group(args, name, exe, flt, out_dir):
    json_path = out_dir / f"{name}.json"
    cmd = [str(args.build / "bench" / exe), f"--benchmark_filter={flt}",
           f"--benchmark_repetitions={args.reps}", "--benchmark_enable_random_interleaving=true",
           "--benchmark_display_aggregates_only=true", f"--benchmark_min_time={args.min_time}",
           "--benchmark_min_warmup_time=0.05", f"--benchmark_out={json_path}",
           "--benchmark_out_format=json"]
    best = None
    for attempt in range(1, args.tries + 1):
        waited = wait_idle(args.idle_seconds, args.idle_limit)
        t0, own0, m0 = time.time(), children_cpu(), cpu_times()
        with open(out_dir / f"{name}.txt.tmp", "w") as console:
            rc = subprocess.run(cmd, stdout=console, stderr=subprocess.STDOUT).returncode
        wall, own, m1 = time.time() - t0, children_cpu() - own0, cpu_times()
        if (rc != 0 or not json_path.exists()
                or not json.loads(json_path.read_text()).get("benchmarks")):
            sys.exit(f"{name}: {exe} exited with {rc} or ran no benchmark; "
                     f"see {out_dir / (name + '.txt.tmp')}")
        foreign = steal = None
        if m0 is not None:
            foreign = max(0.0, (m1[0] - m0[0]) - own) / wall
            steal = (m1[1] - m0[1]) / wall
        loadavg = (pathlib.Path("/proc/loadavg").read_text().split()[:3]
                   if os.path.exists("/proc/loadavg") else None)
        rec = {"group": name, "attempt": attempt, "command": " ".join(cmd),
               "wall_s": round(wall, 1), "waited_for_idle_s": round(waited, 1),
               "foreign_cores": foreign, "steal_cores": steal, "loadavg_after": loadavg}
        print(f"[{out_dir.name}] {name}: attempt {attempt}, {wall:.0f} s, foreign load "
              f"{'?' if foreign is None else f'{foreign:.3f}'} cores", flush=True)
        if best is None or (foreign or 0) < (best["foreign_cores"] or 0):
            best = rec
            os.replace(json_path, out_dir / f"{name}.best.json")
            os.replace(out_dir / f"{name}.txt.tmp", out_dir / f"{name}.txt")
        if foreign is None or foreign <= args.max_foreign:
            break
    os.replace(out_dir / f"{name}.best.json", json_path)
    if (out_dir / f"{name}.txt.tmp").exists():
        os.remove(out_dir / f"{name}.txt.tmp")
    return best


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", type=pathlib.Path, default=ROOT / "data" / "bench")
    p.add_argument("--build", type=pathlib.Path, default=ROOT / "build" / "release")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--min-time", type=float, default=0.15)
    p.add_argument("--max-foreign", type=float, default=0.05)
    p.add_argument("--tries", type=int, default=4)
    p.add_argument("--idle-seconds", type=float, default=5.0)
    p.add_argument("--idle-limit", type=float, default=300.0)
    p.add_argument("--only", nargs="*", help="group names (default: all)")
    args = p.parse_args()
    run_dirs = [args.out / f"run{i}" for i in range(1, args.runs + 1)]
    for run_dir in run_dirs:
        run_dir.mkdir(parents=True, exist_ok=True)
        runs_path = run_dir / "runs.json"
        runs = json.loads(runs_path.read_text()) if runs_path.exists() else {}
        for name, exe, flt in GROUPS:
            if args.only and name not in args.only:
                continue
            runs[name] = run_group(args, name, exe, flt, run_dir)
            runs_path.write_text(json.dumps(runs, indent=1))
    summary = subprocess.run([sys.executable, str(ROOT / "bench" / "summarize.py"),
                              *map(str, run_dirs)],
                             capture_output=True, text=True, check=True).stdout
    lines = ["", "### Runs (one process per group)", "",
             "| run | group | wall s | attempt | foreign load (cores) | steal (cores) | "
             "load avg after |", "|---|---|---:|---:|---:|---:|---|"]
    for run_dir in run_dirs:
        runs_path = run_dir / "runs.json"
        runs = json.loads(runs_path.read_text()) if runs_path.exists() else {}
        for name, _, _ in GROUPS:
            if r := runs.get(name):
                f = "?" if r["foreign_cores"] is None else f"{r['foreign_cores']:.3f}"
                st = "?" if r["steal_cores"] is None else f"{r['steal_cores']:.3f}"
                lines.append(f"| {run_dir.name} | {name} | {r['wall_s']} | {r['attempt']} | {f} | "
                             f"{st} | {' '.join(r['loadavg_after'] or [])} |")
    (args.out / "summary.md").write_text(summary + "\n".join(lines) + "\n")
    print(f"wrote {args.out / 'summary.md'}")


if __name__ == "__main__":
    main()
