#!/usr/bin/python3
"""s3r against its PyTorch peer, full training steps of one preset on this machine, in one
invocation: several rounds, each running the peer in f32, the peer in bf16 autocast (where the
CPU has native bf16) and `s3r bench step` over s3r's configurations, in a rotating order, each a
fresh process with its own warm-up; per-step times are pooled over the rounds. Prints one table:
tokens/s and median ms per step, spread (min-max and interquartile range), peak memory, and
every configuration's speed relative to the peer's fastest mode. Run by scripts/bench_peer.sh.
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import peer_env  # noqa: E402  (standard library only: no torch in this process)


def loadavg():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def busy_cpu_seconds():
    """CPU seconds spent busy (all but idle and iowait) by the whole machine since boot."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def children_cpu_seconds():
    import resource

    u = resource.getrusage(resource.RUSAGE_CHILDREN)
    return u.ru_utime + u.ru_stime


class OtherLoad:
    """CPU time that processes other than this benchmark used while it ran: the machine's busy
    time minus this process's and its children's (a share of the machine's CPUs)."""

    def __init__(self):
        self.t0, self.busy0, self.mine0 = time.time(), busy_cpu_seconds(), children_cpu_seconds() + time.process_time()

    def share(self):
        wall = time.time() - self.t0
        others = (busy_cpu_seconds() - self.busy0) - (children_cpu_seconds() + time.process_time() - self.mine0)
        return max(0.0, others) / (wall * os.cpu_count()) if wall > 0 else 0.0


# --cap: both sides behave as a lesser CPU of this one. s3r through S3R_MAX_ISA (its kernels, its
# GEMM backends and oneDNN); the peer through the same limits on each library it uses: oneDNN
# (ONEDNN_MAX_CPU_ISA, torch's bf16 products), ATen's own vectorized kernels
# (ATEN_CPU_CAPABILITY) and OpenBLAS's kernel set (OPENBLAS_CORETYPE, its f32 products). The
# peer's modes are those of such a CPU: bf16 autocast only where it has native bf16.
CAPS = {
    "avx2": ({"S3R_MAX_ISA": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2",
              "OPENBLAS_CORETYPE": "HASWELL"}, ["f32"], "AVX2 + FMA only, as AMD Zen 2/3"),
    "avx512": ({"S3R_MAX_ISA": "avx512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE", "ATEN_CPU_CAPABILITY": "avx512",
                "OPENBLAS_CORETYPE": "SKYLAKEX"}, ["f32"], "AVX-512 without VNNI/BF16/AMX, as Skylake-SP"),
    "avx512_bf16": ({"S3R_MAX_ISA": "avx512_bf16", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16",
                     "ATEN_CPU_CAPABILITY": "avx512", "OPENBLAS_CORETYPE": "COOPERLAKE"}, ["f32", "bf16"],
                    "AVX-512 with VNNI and BF16, no AMX, as AMD Zen 4/5"),
}


# Untimed steps the peer needs before its steps take their steady time: with torch 1.13 its 2nd and
# 3rd steps are slower (measured on AMD Zen 5, 2026-12-01: `small` bf16 2217, 533, 638 ms, then
# 530-553; `wide` bf16 step 2 3657 ms and step 3 2018, then 1829-1867; in interleaved runs step 2
# of `wide` took 2.1-2.6x the steady time). s3r's steps take their steady time from step 2 on.
PEER_WARMUP = 3


def run(cmd, log, env=None):
    """Runs cmd (with `env` added to this process's environment), its output appended to `log`;
    raises with the log's tail on failure."""
    t0 = time.time()
    with open(log, "a") as f:
        f.write("$ " + " ".join(f"{k}={v}" for k, v in (env or {}).items()) + (" " if env else "") +
                " ".join(cmd) + "\n")
        f.flush()
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT,
                            env={**os.environ, **env} if env else None).returncode
    if rc != 0:
        with open(log) as f:
            tail = "".join(f.readlines()[-15:])
        raise SystemExit(f"side_by_side: {' '.join(cmd)} failed (exit {rc}); end of {log}:\n{tail}")
    return time.time() - t0


def spread(ms):
    q = statistics.quantiles(ms, n=4, method="inclusive") if len(ms) > 1 else [ms[0]] * 3
    return {"median_ms": statistics.median(ms), "min_ms": min(ms), "max_ms": max(ms), "q1_ms": q[0], "q3_ms": q[2],
            "n": len(ms)}


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="small", choices=("tiny", "small", "wide"))
    ap.add_argument("--arch", choices=("llama", "qwen3", "gemma3", "qwen3moe"), default="llama",
                    help="model family of both models (the peer's presets follow s3r's for each; qwen3moe: E, k "
                         "and the experts' width from the preset on both sides)")
    ap.add_argument("--kv-heads", type=int, help="key/value heads of both models (grouped-query attention; must "
                                                  "divide the preset's heads; default: the heads)")
    ap.add_argument("--rounds", type=int, default=4, help="rounds of (peer f32, peer bf16, s3r)")
    ap.add_argument("--repeats", type=int, default=3, help="timed steps per configuration per round")
    ap.add_argument("--warmup", type=int, default=3,
                    help="untimed steps per configuration per process (default 3: the peer's second and third "
                         "steps are still slow, see bench/peer/README.md)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--configs", default="bf16,rtne,sr,s3r,s3r+dx,f32", help="s3r bench step configurations")
    ap.add_argument("--s3r", default=os.path.join(HERE, "..", "..", "build", "release", "tools", "s3r"))
    ap.add_argument("--peer-modes", default="auto", help="auto (f32, and bf16 where the CPU has native bf16), "
                                                          "or a list such as f32,bf16")
    ap.add_argument("--work", default=None, help="folder for the per-process JSON files and the log")
    ap.add_argument("--retries", type=int, default=2,
                    help="reruns of a disturbed job (other processes took > 10%% of the CPUs, or the core check "
                         "read below --min-core-check); default 2")
    ap.add_argument("--min-core-check", type=float, default=0.9,
                    help="a job before or after which `s3r bench cores` reads below this ran while another thread "
                         "shared the cores (a VM's co-tenant) and runs again; 0: no core check (default 0.9)")
    ap.add_argument("--core-wait", type=float, default=60,
                    help="seconds a job waits in all (before its first run and its reruns) for the core check to "
                         "reach --min-core-check (default 60)")
    ap.add_argument("--json", help="write the pooled results as JSON")
    ap.add_argument("--cap", choices=sorted(CAPS), help="both sides behave as this lesser CPU: "
                    + "; ".join(f"{k}: {v[2]}" for k, v in sorted(CAPS.items())))
    args = ap.parse_args()
    if min(args.rounds, args.repeats, args.threads) < 1 or min(args.warmup, args.retries) < 0:
        ap.error("--rounds, --repeats and --threads must be >= 1, --warmup and --retries >= 0")
    if args.core_wait < 0:
        ap.error(f"--core-wait must be >= 0, got {args.core_wait}")
    if not 0 <= args.min_core_check < 1:
        ap.error(f"--min-core-check must be in [0, 1), got {args.min_core_check}")
    if args.kv_heads is not None and args.kv_heads < 1:
        ap.error("--kv-heads must be >= 1")
    if args.warmup < PEER_WARMUP:
        print(f"side_by_side: warning: --warmup {args.warmup} < {PEER_WARMUP}: the peer's first timed steps include "
              "its slow early steps (its 2nd and 3rd steps take up to 2x its steady time), so the ratios favour s3r",
              file=sys.stderr)
    return args


def peer_modes(args, flags):
    """The peer's modes: those of the capped CPU, f32 and bf16 where this CPU has native bf16, or
    --peer-modes."""
    if args.peer_modes == "auto" and args.cap:
        return CAPS[args.cap][1]
    if args.peer_modes == "auto":
        return ["f32"] + (["bf16"] if peer_env.native_bf16(flags) else [])
    return [m for m in args.peer_modes.split(",") if m]


def commands(args):
    """The peer's and s3r's benchmark commands, the same model shape on both sides."""
    peer = [sys.executable, os.path.join(HERE, "llama_peer.py"), "bench", "--preset", args.preset,
            "--threads", str(args.threads), "--warmup", str(args.warmup), "--repeats", str(args.repeats)]
    s3r = [args.s3r, "bench", "step", "--preset", args.preset, "--configs", args.configs, "--threads",
           str(args.threads), "--warmup", str(args.warmup), "--repeats", str(args.repeats)]
    peer += ["--arch", args.arch]
    s3r += ["--arch", args.arch]
    if args.kv_heads is not None:
        peer += ["--kv-heads", str(args.kv_heads)]
        s3r += ["--kv-heads", str(args.kv_heads)]
    return peer, s3r


def core_check(args, work):
    """The median of `s3r bench cores` now: about 1 while this machine's cores are its own, lower
    while another thread shares them (a VM's co-tenant on the cores' other hyperthreads, which
    /proc/stat does not show and which slows s3r's load-heavy kernels more than the peer's: see
    s3r/gemm/roofline.hpp). None where the CPU has no core check (no AVX2) or --min-core-check
    is 0."""
    if args.min_core_check <= 0:
        return None
    out = os.path.join(work, "cores.json")
    r = subprocess.run([args.s3r, "bench", "cores", "--threads", str(args.threads), "--json", out],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"side_by_side: {args.s3r} bench cores failed (exit {r.returncode}): {r.stderr.strip()}")
    with open(out) as f:
        return json.load(f)["median"]


def wait_for_cores(args, work, label, deadline):
    """The core check before a job, after waiting (polling every 2 s, until `deadline`) for it to
    read at least --min-core-check: a co-tenant's busy spells last minutes."""
    cores, said = core_check(args, work), False
    while cores is not None and cores < args.min_core_check and time.time() < deadline:
        if not said:
            print(f"{label}: the core check reads {cores:.2f}; waiting up to {deadline - time.time():.0f} s "
                  "for the cores")
            sys.stdout.flush()
            said = True
        time.sleep(2.0)
        cores = core_check(args, work)
    return cores


def disturbance(share, cores, args):
    """How disturbed a job was, 1 at the limits: other processes' share of the CPUs over 10%, and
    the core check's shortfall from 1 over 1 - --min-core-check."""
    d = share / 0.10
    if cores is not None:
        d = max(d, (1.0 - cores) / (1.0 - args.min_core_check))
    return d


def run_job(cmd, out, log, cap_env, args, work, label):
    """Runs one job; a disturbed job (other processes took more than 10% of the CPUs, or the core
    check before or after it read below --min-core-check) is run again (at most --retries times)
    and the least disturbed run is kept. Returns (share of the CPUs others took, the core check
    (the lower of before and after, or None), its JSON result, seconds, reruns)."""
    best, reruns = None, 0
    deadline = time.time() + args.core_wait  # for all of the job's attempts
    for attempt in range(args.retries + 1):
        before = wait_for_cores(args, work, label, deadline)
        job_load = OtherLoad()
        secs = run(cmd, log, cap_env)
        share = job_load.share()
        after = core_check(args, work)
        cores = min(before, after) if before is not None and after is not None else None
        with open(out) as f:
            result = json.load(f)
        d = disturbance(share, cores, args)
        if best is None or d < best[0]:
            best = (d, share, cores, result, secs)
        if d <= 1.0:
            break
        if attempt < args.retries:
            reruns += 1
            why = [f"other processes took {100 * share:.0f}% of the CPUs"] if share > 0.10 else []
            if cores is not None and cores < args.min_core_check:
                why.append(f"the core check read {cores:.2f}: another thread shared the cores")
            print(f"{label} disturbed ({'; '.join(why)}): again")
    return best[1:] + (reruns,)


def run_rounds(args, modes, peer, s3r, work, log, cap_env):
    """The rounds of jobs, in a rotating order (no job always first). Returns the peer's results
    per mode, s3r's results, and the number of disturbed jobs run again."""
    jobs = [("peer", m) for m in modes] + [("s3r", None)]
    peer_runs = {m: [] for m in modes}
    s3r_runs = []
    reruns = 0
    for r in range(args.rounds):
        for kind, mode in jobs[r % len(jobs):] + jobs[:r % len(jobs)]:
            if kind == "peer":
                out = os.path.join(work, f"peer-{mode}-{r}.json")
                cmd = peer + ["--mode", mode, "--json", out]
            else:
                out = os.path.join(work, f"s3r-{r}.json")
                # Peak memory (one child process per configuration) once, in the first round.
                cmd = s3r + ["--json", out] + ([] if r == 0 else ["--no-memory"])
            label = f"round {r + 1}/{args.rounds}: {kind}{' ' + mode if mode else ''}"
            share, cores, result, secs, again = run_job(cmd, out, log, cap_env, args, work, label)
            reruns += again
            result["core_check"] = cores
            (peer_runs[mode] if kind == "peer" else s3r_runs).append(result)
            print(f"{label} done ({secs:.0f} s{f', others took {100 * share:.0f}% of the CPUs' if share > 0.02 else ''}"
                  f"{f', core check {cores:.2f}' if cores is not None else ''})")
            sys.stdout.flush()
    return peer_runs, s3r_runs, reruns


def pooled_rows(modes, peer_runs, s3r_runs, tokens):
    """One row per configuration, its steps pooled over the rounds, with its speed relative to the
    peer's fastest mode; returns (rows, that mode's row or None)."""
    rows = []
    for m in modes:
        ms = [t for run_ in peer_runs[m] for t in run_["ms"]]
        rows.append({"configuration": f"peer {m}" + (" autocast" if m == "bf16" else ""), "implementation": "pytorch",
                     "mode": m, "ms": ms, **spread(ms),
                     "peak_rss_bytes": max(x["peak_rss_bytes"] for x in peer_runs[m])})
    names = [row["configuration"] for row in s3r_runs[0]["rows"]]
    for name in names:
        ms = [t for run_ in s3r_runs for row in run_["rows"] if row["configuration"] == name for t in row["ms"]]
        mem = next((row.get("peak_rss_bytes") for row in s3r_runs[0]["rows"] if row["configuration"] == name), None)
        rows.append({"configuration": f"s3r {name}", "implementation": "s3r", "mode": name, "ms": ms, **spread(ms),
                     "peak_rss_bytes": mem})
    for row in rows:
        row["tokens_per_s"] = tokens / (row["median_ms"] / 1e3)
    peer_rows = [row for row in rows if row["implementation"] == "pytorch"]
    best = max(peer_rows, key=lambda row: row["tokens_per_s"]) if peer_rows else None
    for row in rows:
        row["vs_peer_best"] = row["tokens_per_s"] / best["tokens_per_s"] if best else None
    return rows, best


def print_table(args, rows, best):
    hdr = f"{'configuration':<20} {'tokens/s':>9} {'median ms':>10} {'min-max ms':>15} {'IQR ms':>15} " \
          f"{'peak MB':>8} {'vs peer best':>13}"
    print(hdr)
    print("-" * len(hdr))
    for row in rows:
        mem = f"{row['peak_rss_bytes'] / 1e6:.0f}" if row.get("peak_rss_bytes") else "-"
        vs = f"{row['vs_peer_best']:.2f}x" if row["vs_peer_best"] else "-"
        print(f"{row['configuration']:<20} {row['tokens_per_s']:>9.0f} {row['median_ms']:>10.1f} "
              f"{row['min_ms']:>7.0f}-{row['max_ms']:<7.0f} {row['q1_ms']:>7.0f}-{row['q3_ms']:<7.0f} {mem:>8} {vs:>13}")
    n = rows[0]["n"] if rows else 0
    print(f"(per configuration {n} timed steps: {args.rounds} rounds x {args.repeats}, each process after {args.warmup} "
          f"warm-up steps; peer: full step forward, backward, clip, AdamW, zero_grad on a fixed random batch;\n"
          f" s3r: `s3r bench step`, the same step in s3r. vs peer best: tokens/s over the peer's fastest mode"
          f"{' (' + best['configuration'] + ')' if best else ''}. peak MB: peak resident set of a process running "
          f"that configuration alone\n (peer: Python + torch included; s3r: one child per configuration))")


def core_summary(peer_runs, s3r_runs):
    """Per side, the median and range of its jobs' core checks (None where there are none)."""
    out = {}
    for side, runs in (("peer", [r for m in peer_runs.values() for r in m]), ("s3r", s3r_runs)):
        c = [r["core_check"] for r in runs if r.get("core_check") is not None]
        out[side] = {"median": statistics.median(c), "min": min(c), "max": max(c), "jobs": c} if c else None
    return out


def write_json(path, result):
    tmp = path + ".tmp"
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(tmp, "w") as f:
        json.dump(result, f, indent=1)
    os.replace(tmp, path)
    print(f"json: {path}")


def main():
    args = parse_args()
    flags = peer_env.cpu_flags()
    cap_env = CAPS[args.cap][0] if args.cap else {}
    modes = peer_modes(args, flags)
    work = args.work or os.path.join(HERE, "..", "..", "results", "bench_peer",
                                     args.preset + (f"-{args.arch}" if args.arch != "llama" else "") +
                                     (f"-kv{args.kv_heads}" if args.kv_heads else "") +
                                     (f"-{args.cap}" if args.cap else ""))
    os.makedirs(work, exist_ok=True)
    log = os.path.join(work, "log.txt")
    open(log, "w").close()
    peer, s3r = commands(args)
    start = datetime.datetime.now(datetime.timezone.utc)
    load_start = loadavg()
    print(f"side by side: preset {args.preset}{f' ({args.arch})' if args.arch != 'llama' else ''}"
          f"{f' with {args.kv_heads} kv heads' if args.kv_heads else ''}, {args.rounds} rounds x {args.repeats} timed steps per configuration "
          f"(+{args.warmup} warm-up per process), {args.threads} threads; peer modes {','.join(modes)}; "
          f"s3r configs {args.configs}")
    if args.cap:
        print(f"capped: both sides as {CAPS[args.cap][2]} (" + " ".join(f"{k}={v}" for k, v in cap_env.items()) + ")")
    probe = OtherLoad()
    time.sleep(2.0)
    idle_share = probe.share()
    if idle_share > 0.1:
        print(f"WARNING: other processes use {100 * idle_share:.0f}% of the CPUs before the start; timings will be noisy")
    cores_start = core_check(args, work)
    if cores_start is not None and cores_start < args.min_core_check:
        print(f"WARNING: the core check reads {cores_start:.2f} before the start: another thread shares the cores "
              f"(a VM's co-tenant?); jobs that see it run again, at most {args.retries} times each")
    print(f"log: {log}")
    sys.stdout.flush()

    others = OtherLoad()
    peer_runs, s3r_runs, reruns = run_rounds(args, modes, peer, s3r, work, log, cap_env)
    load_end = loadavg()
    other_share = others.share()

    tokens = (peer_runs[modes[0]][0]["tokens_per_step"] if modes else s3r_runs[0]["tokens_per_step"])
    rows, best = pooled_rows(modes, peer_runs, s3r_runs, tokens)
    p0 = peer_runs[modes[0]][0] if modes else {}
    machine = f"{peer_env.cpu_model()}, {os.cpu_count()} CPUs ({peer_env.isa_tiers(flags)})" + (
        f", CAPPED as {CAPS[args.cap][2]}: not that CPU" if args.cap else "")
    print()
    print(f"machine: {machine}")
    print(f"s3r:     {s3r_runs[0].get('machine', '?')}")
    if p0:
        print(f"peer:    torch {p0['torch']}, {p0['threads']} threads, f32 products: {p0['blas']}")
        bf = peer_runs.get("bf16")
        if bf:
            print(f"         bf16 products: oneDNN {bf[0].get('onednn_bf16_matmul', '?')}")
        for n in p0.get("env_notes", []):
            print(f"         {n}")
    print(f"model:   {args.preset} ({s3r_runs[0].get('model', '')}), {tokens} tokens per step; {args.threads} threads "
          f"for both; {start:%Y-%m-%d %H:%M} UTC")
    print(f"load:    other processes used {100 * other_share:.1f}% of the CPUs during the runs "
          f"({100 * idle_share:.1f}% just before; {reruns} disturbed jobs run again); load average "
          f"{load_start:.2f} before, {load_end:.2f} after")
    cores = core_summary(peer_runs, s3r_runs)
    if cores["s3r"] or cores["peer"]:
        print("cores:   the core check before and after each job (the lower kept; about 1 on cores of their own): " +
              ", ".join(f"{side} {c['median']:.2f} ({c['min']:.2f}-{c['max']:.2f})" for side, c in cores.items() if c))
    print()
    print_table(args, rows, best)
    if other_share > 0.05:
        print(f"WARNING: the machine was not idle (other processes took {100 * other_share:.0f}% of the CPUs); "
              "rerun on an idle machine for numbers to quote")
    if args.json:
        write_json(args.json, {
            "preset": args.preset, "arch": args.arch, "kv_heads": args.kv_heads, "cap": args.cap, "cap_env": cap_env,
            "threads": args.threads, "rounds": args.rounds, "repeats": args.repeats, "warmup": args.warmup,
            "tokens_per_step": tokens, "machine": machine, "s3r_machine": s3r_runs[0].get("machine"),
            "peer_env": {k: p0.get(k) for k in (
                "torch", "blas", "blas_libraries", "env_notes", "torch_build", "malloc")} if p0 else {},
            "onednn_bf16_matmul": peer_runs["bf16"][0].get("onednn_bf16_matmul") if "bf16" in peer_runs else None,
            "start_utc": start.isoformat(), "load_average": [load_start, load_end],
            "other_processes_cpu_share": other_share, "disturbed_reruns": reruns,
            "min_core_check": args.min_core_check, "core_check": cores, "rows": rows})


if __name__ == "__main__":
    main()
