#!/usr/bin/env bash
# --arch qwen3moe end to end on a tiny model: training in int8 (s3r + dx) gives the same bits for 1
# and 2 threads; a run resumed halfway ends with the bits of the run straight through; meta.json
# records the experts; eval's loss is the logged one; greedy generation is deterministic; bad
# expert options are one line and exit 1 before any work; diag grad-error gives block 0's dW
# error per expert.
# Usage: moe_smoke.sh S3R_BINARY WORK_DIR
set -uo pipefail
s3r=$1; work=$2
rm -rf "$work"; mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }
words=(the quantized gradient rounds up down stochastic shared threshold token error mean layer
       model training loss correction example channel width expert router)
for d in $(seq 1 200); do
  line=""
  for w in $(seq 1 40); do line+="${words[$(( (d * 7 + w * w * 3) % ${#words[@]} ))]} "; done
  printf '%s\n\n' "$line"
done > "$work/corpus.txt"
"$s3r" data prepare "$work/corpus.txt" --out "$work/data" --vocab 300 > "$work/prepare.log" || fail "prepare"
common=(--arch qwen3moe --preset tiny --vocab 300 --data "$work/data" --warmup 3 --lr 3e-3 --eval-batches 4)
train() {  # NAME THREADS ARGS...
  local name=$1 threads=$2; shift 2
  OMP_NUM_THREADS=$threads "$s3r" train "${common[@]}" "$@" --out "$work/$name" > "$work/$name.log" 2>&1 \
    || fail "train $name: $(tail -3 "$work/$name.log")"
}
train run 1 --steps 24 --eval-every 24
train run-2threads 2 --steps 24 --eval-every 24
cmp "$work/run/checkpoint/model.safetensors" "$work/run-2threads/checkpoint/model.safetensors" \
  || fail "1 and 2 threads give different weights"
train run-resumed 1 --steps 12 --schedule-steps 24 --eval-every 24
train run-resumed 1 --steps 24 --eval-every 24 --resume "$work/run-resumed"
for f in model.safetensors optimizer.safetensors; do
  cmp "$work/run/checkpoint/$f" "$work/run-resumed/checkpoint/$f" || fail "resumed run: $f differs"
done
echo "threads 1 = 2, resumed = straight: same bits"
python3 - "$work/run/checkpoint" <<'PY' || fail "qwen3moe in meta.json"
import json, struct, sys
m = json.load(open(sys.argv[1] + "/meta.json"))
c, a = m["config"], m["architecture"]
raw = open(sys.argv[1] + "/model.safetensors", "rb").read()
head = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
got = (c.get("arch"), c.get("experts"), c.get("experts_used"), a["ffn"]["type"], a["ffn"]["expert_ffn_width"],
       head["blocks.0.ffn.experts.gate"]["shape"], head["blocks.0.ffn.router"]["shape"])
print(f"qwen3moe meta.json and tensors: {got}")
sys.exit(0 if got == ("qwen3moe", 8, 2, "moe", 24, [8, 64, 24], [64, 8]) else 1)
PY
grep -q '"expert_load"' "$work/run/metrics.jsonl" || fail "metrics.jsonl has no expert_load"
"$s3r" eval --checkpoint "$work/run" --data "$work/data" > "$work/eval.out" 2> "$work/eval.err" \
  || fail "eval: $(cat "$work/eval.err")"
loss=$(sed -n 's/^loss \([0-9.]*\) nats.*/\1/p' "$work/eval.out")
logged=$(grep val_loss "$work/run/metrics.jsonl" | tail -1 | sed 's/.*"val_loss":\([0-9.e+-]*\).*/\1/')
python3 -c "import sys; a, b = float('$loss'), float('$logged'); sys.exit(0 if abs(a - b) <= 0.1 * b else 1)" \
  || fail "eval loss $loss is far from the logged val_loss $logged"
for i in 1 2; do
  "$s3r" generate --checkpoint "$work/run" --prompt "the expert" --max-tokens 8 --temperature 0 --ignore-eos \
    > "$work/gen-$i.out" 2> "$work/gen-$i.err" || fail "generate: $(cat "$work/gen-$i.err")"
done
cmp -s "$work/gen-1.out" "$work/gen-2.out" || fail "greedy generation is not deterministic"
# diag grad-error: block 0's dW error per expert, with the expert's rows (together the T k rows
# of the batch), and the telemetry per expert.
"$s3r" diag grad-error --checkpoint "$work/run" --data "$work/data" --keys 2 --configs sr,s3r+dx \
  --json "$work/diag.json" > "$work/diag.out" 2>&1 || fail "diag grad-error: $(tail -3 "$work/diag.out")"
python3 - "$work/diag.json" <<'PY' || fail "diag grad-error's per-expert rows are wrong"
import json, math, sys
j = json.load(open(sys.argv[1]))
tokens = next(t["tokens"] for t in j["telemetry"] if t["layer"] == "blocks.0.attn.q")
for row in j["rows"]:
    ex = row["dw_first_block_per_expert"]
    assert len(ex) == 8 and sum(e["rows"] for e in ex) == 2 * tokens, (row["configuration"], ex)
    assert all(math.isfinite(e["mean"]) and (e["mean"] > 0) == (e["rows"] > 0) for e in ex), ex
gate = [t for t in j["telemetry"] if t["layer"] == "blocks.0.ffn.gate"]
assert [t["expert"] for t in gate] == [e["expert"] for e in ex if e["rows"] > 0], gate
assert [t["tokens"] for t in gate] == [e["rows"] for e in ex if e["rows"] > 0], gate
PY
expect_error() {  # PATTERN COMMAND...: exit status 1, PATTERN on stderr, one line
  local pattern=$1; shift
  local out rc
  out=$("$@" 2>&1 >/dev/null); rc=$?
  [ $rc = 1 ] || fail "'$*': exit $rc, expected 1: $out"
  grep -qE -- "$pattern" <<< "$out" || fail "'$*': expected /$pattern/, got: $out"
  [ "$(wc -l <<< "$out")" -le 1 ] || fail "'$*': more than one line: $out"
}
expect_error "experts per token k = 9 must be in \[1, E = 8\]" \
  "$s3r" train "${common[@]}" --experts-used 9 --out "$work/none"
expect_error "--experts must be >= 1, got 0" "$s3r" train "${common[@]}" --experts 0 --out "$work/none"
expect_error "--ffn must be >= 1, got 0" "$s3r" train "${common[@]}" --ffn 0 --out "$work/none"
expect_error "the llama family has no mixture of experts" \
  "$s3r" train --preset tiny --vocab 300 --data "$work/data" --experts 4 --out "$work/none"
expect_error "--moe-aux-loss" "$s3r" train "${common[@]}" --moe-aux-loss -1 --out "$work/none"
expect_error "--moe-routing" "$s3r" train "${common[@]}" --moe-routing sinkhorn --out "$work/none"
[ ! -e "$work/none" ] || fail "a refused option left $work/none"
echo "moe smoke: ok"
