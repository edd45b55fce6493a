#!/usr/bin/env python3
"""Markdown table of bench/gemm_bench.cpp runs: int8 against f32 and bf16, per layout and shape.

Usage: bench/gemm_table.py RUN.json [RUN.json ...] > table.md

Each RUN.json is one --benchmark_out file of s3r_bench_gemm run with --benchmark_repetitions=N
(its "median" aggregates are read). A rate is the median over the runs of each run's median; a
ratio is taken inside each run (two medians of the same process), then the median over the
runs. Rates are in G multiply-adds per second. "of limit" is the int8 rate divided by the
register-only vpmaddwd limit of the same process (peak/avx2_madd_s16, one core) times the
threads: the fraction of what exact int8 on AVX2 can reach.
"""
import json
import re
import statistics
import sys


def medians(path):
    data = json.load(open(path))
    med = {}
    for b in data["benchmarks"]:
        if b.get("run_type") == "aggregate" and b.get("aggregate_name") == "median" \
                and not b.get("error_occurred"):
            med[b["run_name"].removesuffix("/real_time")] = b["items_per_second"] / 1e9
    return med, data.get("context", {})


def main(paths):
    runs = [medians(p) for p in paths]
    print(f"machine: {runs[0][1].get('s3r_machine', '?')}")
    print(f"runs: {len(runs)} ({', '.join(paths)})")

    def rate(name):
        v = [r[name] for r, _ in runs if name in r]
        return statistics.median(v) if v else None

    def ratio(num, den, scale=lambda r: 1.0):
        v = [r[num] / (r[den] * scale(r)) for r, _ in runs if num in r and den in r]
        return statistics.median(v) if v else None

    fma, madd, sign = rate("peak/avx2_fma_f32"), rate("peak/avx2_madd_s16"), \
        rate("peak/avx2_maddubs_sign")
    if fma and madd:
        line = (f"\nregister-only limits, one core (G multiply-adds/s): f32 FMA {fma:.1f}, "
                f"vpmaddwd {madd:.1f} ({ratio('peak/avx2_madd_s16', 'peak/avx2_fma_f32'):.2f}x FMA)")
        if sign:
            line += (f", maddubs sign trick {sign:.1f} "
                     f"({ratio('peak/avx2_maddubs_sign', 'peak/avx2_fma_f32'):.2f}x)")
        print(line)
    print("\n| layout | N | K | threads | int8 (own) | f32 (oneDNN) | bf16 | int8 / f32 | "
          "int8 / bf16 | of limit |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    pat = re.compile(r"gemm/s8/(\w+)/M:4096/N:(\d+)/K:(\d+)/threads:(\d+)/(\w+)$")
    names = sorted({n for r, _ in runs for n in r})
    rows = []
    for name in names:
        m = pat.match(name)
        if not m or m.group(5) == "reference":
            continue
        layout, n, k, t, backend = m.groups()
        dims = f"{layout}/M:4096/N:{n}/K:{k}/threads:{t}"
        f32 = f"gemm/f32/{dims}/onednn"
        bf16 = next((f"gemm/bf16/{dims}/{b}" for b in ("onednn", "f32")
                     if rate(f"gemm/bf16/{dims}/{b}")), None)
        r_f32 = ratio(name, f32)
        r_bf16 = ratio(name, bf16) if bf16 else None
        limit = ratio(name, "peak/avx2_madd_s16", lambda r: int(t)) if backend == "avx2" else None
        rows.append((layout, int(n), int(k), int(t), f"{rate(name):.1f} ({backend})",
                     f"{rate(f32):.1f}" if rate(f32) else "-",
                     f"{rate(bf16):.1f} ({bf16.rsplit('/', 1)[1]})" if bf16 else "-",
                     f"{r_f32:.2f}x" if r_f32 else "-", f"{r_bf16:.2f}x" if r_bf16 else "-",
                     f"{limit:.0%}" if limit else "-"))
    order = {"xw": 0, "gwt": 1, "xtg": 2}
    for r in sorted(rows, key=lambda r: (order.get(r[0], 9), r[1], r[2], r[3])):
        print("| " + " | ".join(str(x) for x in r) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
