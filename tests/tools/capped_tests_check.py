#!/usr/bin/env python3
"""Checks that every capped rerun (tests/CMakeLists.txt, s3r_add_capped_tests) really runs capped.

Usage: capped_tests_check.py CTEST BUILD_DIR

Reads `ctest --show-only=json-v1` of BUILD_DIR: each test named CAP.Suite.Test (CAP in avx2,
avx512, avx512_bf16, reference) must carry ENVIRONMENT S3R_TEST_CAP=CAP (tests/test_main.cpp) and the label `capped`, and there
must be such tests for each cap. Without this check a quoting slip in the CMake properties
turns the capped runs into silent copies of the plain ones (it happened once).
"""
import json
import subprocess
import sys

CAPS = ("avx2", "avx512", "avx512_bf16", "reference")


def main(ctest, build_dir):
    out = subprocess.run([ctest, "--test-dir", build_dir, "--show-only=json-v1"],
                         check=True, capture_output=True, text=True).stdout
    counts = {cap: 0 for cap in CAPS}
    bad = []
    for test in json.loads(out)["tests"]:
        cap = test["name"].split(".", 1)[0]
        if cap not in CAPS:
            continue
        counts[cap] += 1
        props = {p["name"]: p["value"] for p in test.get("properties", [])}
        env = props.get("ENVIRONMENT", [])
        if f"S3R_TEST_CAP={cap}" not in env or "capped" not in props.get("LABELS", []):
            bad.append(f"{test['name']}: ENVIRONMENT {env}, LABELS {props.get('LABELS')}")
    for line in bad[:10]:
        print("not capped:", line)
    missing = [cap for cap, n in counts.items() if n == 0]
    if missing:
        print("no capped tests for:", ", ".join(missing))
    if bad or missing:
        return 1
    print("capped reruns:", ", ".join(f"{cap} {n}" for cap, n in counts.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
