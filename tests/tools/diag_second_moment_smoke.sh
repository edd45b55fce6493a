#!/usr/bin/env bash
# `s3r diag second-moment` on the tiny checkpoint of train_smoke.sh: every recipe's row covers
# every projection coordinate, rtne needs one key (its rounding is deterministic), the two-way
# correction lowers the rounding's share below s3r's, and the AdamW settings enter exactly as
# defined (s3r/nn/rounding_variance.hpp): the shares scale with c^2 = (clip / ||g_exact||)^2 when
# clipping acts and with 1 - beta2^t.
# Usage: diag_second_moment_smoke.sh S3R_BINARY TRAIN_SMOKE_DIR
set -euo pipefail
s3r=$1; work=$2
out="$work/second-moment"
rm -rf "$out"
"$s3r" diag second-moment --checkpoint "$work/run" --data "$work/data" --keys 8 --json "$out/all.json" > "$out.log"
grep -q "share of v_hat added by the rounding" "$out.log"
"$s3r" diag second-moment --checkpoint "$work/run" --data "$work/data" --configs rtne --clip 1e-3 --beta2 0.5 \
  --json "$out/rtne.json" > /dev/null
python3 - "$out/all.json" "$out/rtne.json" "$work/run/checkpoint/meta.json" <<'PY'
import json, sys
d, r, meta = (json.load(open(p)) for p in sys.argv[1:4])
def check(ok, what):
    if not ok:
        sys.exit(f"FAIL: {what}")
rows = {x["configuration"]: x for x in d["rows"]}
check(list(rows) == ["sr", "s3r", "s3r+dx", "s3r+two-way", "rtne"], f"rows {list(rows)}")
cfg = meta["config"]
L, C, F = cfg["layers"], cfg["width"], cfg["ffn_width"]
kv = C // cfg["heads"] * cfg.get("kv_heads", cfg["heads"])
sizes = {"attn.q": C * C, "attn.k": C * kv, "attn.v": C * kv, "attn.o": C * C,
         "ffn.gate": C * F, "ffn.up": C * F, "ffn.down": F * C}
for name, row in rows.items():
    check(row["keys"] == (1 if name == "rtne" else 8), f"{name} keys {row['keys']}")
    check(len(row["layers"]) == 7 * L, f"{name}: {len(row['layers'])} layers")
    for kind, n in sizes.items():
        s = row["kinds"][kind]
        check(s["coordinates"] + s["zero_v"] == L * n, f"{name} {kind}: {s['coordinates']} + {s['zero_v']} != {L * n}")
        check(0 <= s["median"] <= s["q90"] <= s["q99"] <= s["max"] and s["aggregate"] > 0, f"{name} {kind}: {s}")
check(rows["s3r+two-way"]["all"]["aggregate"] < rows["s3r"]["all"]["aggregate"], "two-way lowers the share")
# Same rtne deviations, other AdamW settings: shares scale by c^2 and by 1 - beta2^t exactly.
t = d["step"]
check(r["clip_factor"] < 1, f"--clip 1e-3 clips ||g_exact|| = {r['grad_norm']}")
want = (r["clip_factor"] / d["clip_factor"]) ** 2 * (1 - r["beta2"] ** t) / (1 - d["beta2"] ** t)
got = r["rows"][0]["all"]["aggregate"] / rows["rtne"]["all"]["aggregate"]
check(abs(got / want - 1) < 1e-9, f"rtne aggregate ratio {got} vs {want}")
print("diag second-moment smoke: ok")
PY
