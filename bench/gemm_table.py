#!/usr/bin/env python3
"""Markdown table of a bench/gemm_bench.cpp run: int8 against f32 and bf16, per layout and shape.

Usage: bench/gemm_table.py RUN.json > table.md

RUN.json is one --benchmark_out file of s3r_bench_gemm run with --benchmark_repetitions=N (its
"median" aggregates are read), so every ratio below is between two medians of the same process.
Rates are in G multiply-adds per second. "of limit" is the int8 rate divided by the
register-only vpmaddwd limit of the same process (peak/avx2_madd_s16, one core) times the
threads: the fraction of what exact int8 on AVX2 can reach.
"""
import json
import re
import sys


def main(path):
    data = json.load(open(path))
    med = {}
    for b in data["benchmarks"]:
        if b.get("run_type") == "aggregate" and b.get("aggregate_name") == "median" \
                and not b.get("error_occurred"):
            med[b["run_name"].removesuffix("/real_time")] = b["items_per_second"] / 1e9
    ctx = data.get("context", {})
    print(f"machine: {ctx.get('s3r_machine', '?')}")
    fma, madd = med.get("peak/avx2_fma_f32"), med.get("peak/avx2_madd_s16")
    sign = med.get("peak/avx2_maddubs_sign")
    if fma and madd:
        print(f"\nregister-only limits, one core: f32 FMA {fma:.1f}, vpmaddwd {madd:.1f} "
              f"({madd / fma:.2f}x FMA)" + (f", maddubs sign trick {sign:.1f} ({sign / fma:.2f}x)"
                                             if sign else ""))
    print("\n| layout | N | K | threads | int8 (own) | f32 (oneDNN) | bf16 | int8 / f32 | "
          "int8 / bf16 | of limit |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    pat = re.compile(r"gemm/s8/(\w+)/M:4096/N:(\d+)/K:(\d+)/threads:(\d+)/(\w+)$")
    rows = []
    for name, rate in med.items():
        m = pat.match(name)
        if not m or m.group(5) == "reference":
            continue
        layout, n, k, t, backend = m.groups()
        dims = f"{layout}/M:4096/N:{n}/K:{k}/threads:{t}"
        f32 = med.get(f"gemm/f32/{dims}/onednn")
        bf16_name = next((f"gemm/bf16/{dims}/{b}" for b in ("onednn", "f32")
                          if f"gemm/bf16/{dims}/{b}" in med), None)
        bf16 = med.get(bf16_name) if bf16_name else None
        limit = f"{rate / (madd * int(t)):.0%}" if madd and backend == "avx2" else "-"
        rows.append((layout, int(n), int(k), int(t), f"{rate:.1f} ({backend})",
                     f"{f32:.1f}" if f32 else "-",
                     f"{bf16:.1f} ({bf16_name.rsplit('/', 1)[1]})" if bf16 else "-",
                     f"{rate / f32:.2f}x" if f32 else "-", f"{rate / bf16:.2f}x" if bf16 else "-",
                     limit))
    order = {"xw": 0, "gwt": 1, "xtg": 2}
    for r in sorted(rows, key=lambda r: (order.get(r[0], 9), r[1], r[2], r[3])):
        print("| " + " | ".join(str(x) for x in r) + " |")


if __name__ == "__main__":
    main(sys.argv[1])
