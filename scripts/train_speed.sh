#!/usr/bin/env bash
# Training speed of `small` per mode: 12 steps each (no validation), the median tokens/s and
# ms/step of steps 3..12 from metrics.jsonl. About 3 minutes. Run folders under /tmp/tps.
cd "$(dirname "$0")/.."
mkdir -p /tmp/tps
for cfg in "bf16 none" "rtne none" "sr none" "s3r none" "s3r dx" "s3r two-way" "s3r-bcast none" "f32 none"; do
  set -- $cfg
  out=/tmp/tps/$1-$2; rm -rf $out
  build/release/tools/s3r train --preset small --mode $1 --correction $2 --steps 12 --eval-every 0 --out $out > $out.log 2>&1 || { echo "$cfg failed"; tail -3 $out.log; continue; }
  python3 - "$out/metrics.jsonl" "$1+$2" <<'PY'
import json,sys,statistics
rows=[json.loads(l) for l in open(sys.argv[1]) if '"tokens_per_s"' in l]
tps=[r["tokens_per_s"] for r in rows if r["step"]>=2]; ms=[r["ms"] for r in rows if r["step"]>=2]
print(f"{sys.argv[2]:16s} median {statistics.median(tps):8.0f} tokens/s  ({statistics.median(ms):7.1f} ms/step, {len(tps)} steps)")
PY
done
