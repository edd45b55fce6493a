#!/usr/bin/env python3
"""Data-parallel step time and communication (docs/DISTRIBUTED.md).

On this one machine, in interleaved rounds: `s3r train` of one preset as 1 rank x 1 thread,
2 ranks x 1 thread (mpirun), the same with --shard-optimizer, and 1 rank x all threads; the
median step time of each (steps after the warm-up ones, pooled over rounds), its spread, the
bytes rank 0 sent per step and the peak resident set of rank 0 (which gathers the moments for
the checkpoint under --shard-optimizer) and of the others. Then, for
R = 2, 4 and 8 ranks (oversubscribed, one step each: bytes only, the time is not meaningful),
the bytes per step, and the step time expected on R hosts linked at 10, 25 and 100 Gb/s:

    T(R, bw) = T_host / R + sent_bytes(R) * 8 / bw

where T_host is the measured step of one host (1 rank x all its threads). This assumes the
compute splits perfectly (the measured 2 ranks x 1 thread against 1 rank x 1 thread on one
machine shows how close it comes) and that communication does not overlap compute (s3r does
not overlap it); it ignores latency (a few dozen collectives per step). Prints the machine.

Usage: scripts/bench_dist.py [--preset small] [--steps 8] [--warmup 2] [--rounds 2]
                             [--data data/nlp-corpus] [--json results/bench_dist/PRESET.json]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
S3R = os.path.join(ROOT, "build/release/tools/s3r")
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_btl_vader_single_copy_mechanism": "none"}


def train(args, out, ranks, threads, steps, oversubscribe=False, extra=()):
    """Runs `s3r train`; returns (step lines of metrics.jsonl, the machine line, every rank's
    peak resident set in bytes)."""
    cmd = [S3R, "train", "--preset", args.preset, "--data", args.data, "--steps", str(steps),
           "--warmup", "1", "--eval-every", "0", "--eval-batches", "1", "--out", out, "--overwrite",
           *extra]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), **MPI_ENV)
    if ranks > 1:
        mpirun = shutil.which("mpirun")
        if not mpirun:
            sys.exit("bench_dist: no mpirun; install openmpi-bin (scripts/setup.sh does)")
        bind = "core" if not oversubscribe and ranks * threads <= (os.cpu_count() or 1) else "none"
        cmd = [mpirun, "-np", str(ranks), "--bind-to", bind,
               "-x", "OMP_NUM_THREADS"] + (["--oversubscribe"] if oversubscribe else []) + cmd
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        sys.exit(f"bench_dist: {' '.join(cmd)} failed:\n{p.stdout[-2000:]}")
    machine = next((l.split("machine", 1)[1].strip() for l in p.stdout.splitlines()
                    if l.strip().startswith("machine")), "?")
    peak = [float(x.split()[-2]) * 1e6 for l in p.stdout.splitlines() if l.startswith("peak memory:")
            for x in l[len("peak memory:"):].replace("(resident set)", "").split(",")]  # per rank
    with open(os.path.join(out, "metrics.jsonl")) as f:
        lines = [json.loads(l) for l in f]
    return [l for l in lines if "loss" in l], machine, peak


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="small")
    ap.add_argument("--steps", type=int, default=8, help="steps per run (default 8)")
    ap.add_argument("--warmup", type=int, default=2, help="first steps of each run not timed (default 2)")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds (default 2)")
    ap.add_argument("--data", default=os.path.join(ROOT, "data/nlp-corpus"))
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.steps <= args.warmup or args.warmup < 0 or args.rounds < 1:
        sys.exit("bench_dist: need --rounds >= 1 and --steps > --warmup >= 0")
    if not os.path.isfile(os.path.join(args.data, "train.bin")):
        sys.exit(f"bench_dist: no {args.data}/train.bin; run scripts/fetch_data.sh (or pass --data)")
    if not os.access(S3R, os.X_OK):
        sys.exit(f"bench_dist: no {S3R}; run scripts/setup.sh")
    cores = os.cpu_count() or 1
    configs = [("1 rank x 1 thread", 1, 1, ()), ("2 ranks x 1 thread", 2, 1, ()),
               ("2 ranks, sharded AdamW", 2, 1, ("--shard-optimizer",)),
               (f"1 rank x {cores} threads", 1, cores, ())]
    tmp = tempfile.mkdtemp(prefix="bench_dist.")
    times = {name: [] for name, *_ in configs}
    sent, sent_by, peak = {}, {}, {}
    machine = "?"
    try:
        for rnd in range(args.rounds):
            for name, ranks, threads, extra in configs:
                print(f"round {rnd + 1}/{args.rounds}: {name} ...", file=sys.stderr, flush=True)
                steps, machine, peak[name] = train(args, os.path.join(tmp, "run"), ranks, threads, args.steps,
                                                   extra=extra)
                times[name] += [s["ms"] for s in steps[args.warmup:]]
                sent_by[name] = steps[-1].get("sent_bytes", 0)
                if ranks > 1 and not extra:
                    sent[ranks] = steps[-1]["sent_bytes"]
        for ranks in (4, 8):
            print(f"bytes per step at {ranks} ranks (one step, oversubscribed) ...", file=sys.stderr, flush=True)
            steps, _, _ = train(args, os.path.join(tmp, "run"), ranks, 1, 1, oversubscribe=True)
            sent[ranks] = steps[-1]["sent_bytes"]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"s3r data parallel, preset {args.preset}, {args.steps} steps x {args.rounds} rounds "
          f"(first {args.warmup} of each run not timed)")
    print(f"machine: {machine}")
    print(f"{'configuration':<24} {'median ms':>10} {'min-max ms':>17} {'speed-up':>9} {'MB sent/step':>13} "
          f"{'peak MB rank 0':>15} {'others':>7}")
    base = med[configs[0][0]]
    for name, ranks, _, _ in configs:
        v = times[name]
        mb = f"{sent_by[name] / 1e6:.2f}" if ranks > 1 else "-"
        others = f"{max(peak[name][1:]) / 1e6:.0f}" if len(peak[name]) > 1 else "-"
        print(f"{name:<24} {med[name]:>10.1f} {min(v):>8.1f}-{max(v):<8.1f} {base / med[name]:>8.2f}x {mb:>13} "
              f"{peak[name][0] / 1e6:>15.0f} {others:>7}")
    host = med[configs[-1][0]]
    print(f"\nexpected step time on R hosts (T_host = {host:.1f} ms: 1 rank x {cores} threads), "
          "T_host / R + bytes * 8 / bandwidth:")
    print(f"{'R':>3} {'MB sent/step':>13} {'10 Gb/s':>16} {'25 Gb/s':>16} {'100 Gb/s':>16}")
    expected = {}
    for ranks in (2, 4, 8):
        row = []
        for gbps in (10, 25, 100):
            t = host / ranks + sent[ranks] * 8 / (gbps * 1e9) * 1e3
            expected[f"{ranks}@{gbps}"] = t
            row.append(f"{t:7.1f} ms {host / t:4.2f}x")
        print(f"{ranks:>3} {sent[ranks] / 1e6:>13.2f} " + " ".join(f"{c:>16}" for c in row))
    out = args.json or os.path.join(ROOT, "results/bench_dist", f"{args.preset}.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out + ".tmp", "w") as f:
        json.dump({"preset": args.preset, "machine": machine, "steps": args.steps, "warmup": args.warmup,
                   "rounds": args.rounds, "ms": times, "median_ms": med, "peak_rss_bytes": peak,
                   "sent_bytes_per_step_by_config": sent_by,
                   "sent_bytes_per_step": {str(k): v for k, v in sent.items()},
                   "expected_ms": expected}, f, indent=1)
    os.replace(out + ".tmp", out)
    print(f"\nJSON: {os.path.relpath(out, ROOT)}")


if __name__ == "__main__":
    main()
