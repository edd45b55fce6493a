#!/usr/bin/env bash
# `s3r diag grad-error` on the tiny checkpoint of train_smoke.sh, and the properties its table
# must show whatever the checkpoint: rtne is deterministic (no spread over keys, averaging keys
# does not shrink its error: a bias); sr is unbiased (averaging 8 keys shrinks its error, about
# 1/sqrt(8) for pure noise); the S3R-EC corrections reduce the errors they target.
# Usage: diag_smoke.sh S3R_BINARY TRAIN_SMOKE_DIR
set -euo pipefail
s3r=$1; work=$2
# --json into a folder that does not exist yet: created before the work, written at the end.
rm -rf "$work/diag"
"$s3r" diag grad-error --checkpoint "$work/run" --data "$work/data" --keys 8 --json "$work/diag/table2.json" \
  > "$work/diag.log"
grep -q "rounding telemetry per layer" "$work/diag.log"
test ! -e "$work/diag/table2.json.tmp"
python3 - "$work/diag/table2.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
rows = {r["configuration"]: r for r in d["rows"]}
def check(ok, what):
    if not ok:
        sys.exit(f"FAIL: {what}")
want = ["rtne", "sr", "s3r", "s3r+dx", "s3r+two-way", "s3r-bcast", "s3r-bcast+dx", "s3r-bcast+two-way",
        "dX=s3r/dW=bcast", "dX=bcast/dW=s3r"]
check(sorted(rows) == sorted(want), f"configurations {sorted(rows)}")
for q in ("dx_first_block", "dx_last_block", "dw_first_block", "embedding"):
    r = rows["rtne"][q]
    check(len(set(r["per_key"])) == 1 and abs(r["error_of_key_mean"] - r["mean"]) < 1e-6 * r["mean"], f"rtne {q} deterministic: {r}")
    s = rows["sr"][q]
    check(0 < s["error_of_key_mean"] < 0.6 * s["mean"], f"sr {q}: key-mean error {s['error_of_key_mean']} vs {s['mean']}")
check(rows["s3r+dx"]["dx_first_block"]["mean"] < rows["s3r"]["dx_first_block"]["mean"], "dx correction lowers dX error")
check(rows["s3r+two-way"]["dw_first_block"]["mean"] < rows["s3r"]["dw_first_block"]["mean"], "two-way lowers dW error")
# The ablation rows take dX from one mode and dW from the other.
check(rows["dX=s3r/dW=bcast"]["dx_first_block"]["mean"] == rows["s3r"]["dx_first_block"]["mean"], "ablation dX = s3r's")
check(rows["dX=bcast/dW=s3r"]["dx_first_block"]["mean"] == rows["s3r-bcast"]["dx_first_block"]["mean"], "ablation dX = bcast's")
t = d["telemetry"]
check(len(t) == 7 * 2 and all(0.0 <= x["share_below_half_step"] <= 1.0 and x["step"] > 0 for x in t), "telemetry")
print("diag smoke: ok")
PY
