#!/usr/bin/env bash
# `s3r export --format hf` read by an independent PyTorch reader of Hugging Face's Llama
# conventions (bench/peer/check_hf_export.py): its next-token log-probabilities match s3r's own
# f32 forward within 1e-4 (measured 1.3e-6), and exports with a deliberate bug (no q/k
# permutation for half-split RoPE; the attention output matrix not transposed) fail it. A NaN on
# either side fails it too, for that reason: an export with NaN weights (`--inject nan-weight`)
# and a null (s3r's NaN) in s3r's log-probabilities.
# The grouped-query model of cli.infer_smoke (RUN_DIR-gqa: 4 heads, 2 kv heads of 24; config.json
# num_key_value_heads 2, k_proj and v_proj (2 * HD, C)) must match to the same 1e-4 (measured
# 1.4e-6), and the reader with the wrong repeat_kv (query head h reading kv head h % 2 instead of
# h // 2: `check_hf_export.py --inject gqa-kv-modulo`; measured 0.7) must fail. The Qwen3 model
# of cli.infer_smoke (RUN_DIR-qwen3) likewise, and the reader without QK-norm must fail.
# Usage: hf_export_check.sh S3R_BINARY RUN_DIR DATA_DIR WORK_DIR REPO_ROOT
set -uo pipefail
s3r=$1; run=$2; data=$3; work=$4; root=$5
rm -rf "$work"; mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }
tok=(--tokenizer "$data/tokenizer.model")
gqa_run=$run-gqa  # trained by tests/tools/infer_smoke.sh beside RUN_DIR
[ -f "$gqa_run/checkpoint/meta.json" ] || fail "no grouped-query run $gqa_run (cli.infer_smoke trains it)"
qwen3_run=$run-qwen3  # likewise
[ -f "$qwen3_run/checkpoint/meta.json" ] || fail "no qwen3 run $qwen3_run (cli.infer_smoke trains it)"
logprobs() {  # RUN OUT
  "$s3r" generate --checkpoint "$1" "${tok[@]}" --prompt "the gradient rounds" --precision f32 --max-tokens 1 \
    --dump-logprobs "$2" > /dev/null 2> "$work/generate.err" || fail "generate $1: $(cat "$work/generate.err")"
}
logprobs "$run" "$work/logprobs.json"
logprobs "$gqa_run" "$work/logprobs-gqa.json"
logprobs "$qwen3_run" "$work/logprobs-qwen3.json"
check() {  # NAME EXPECTED_STATUS [EXPORT OPTIONS...]: the run $from, s3r's log-probabilities $lp, reader options $reader
  local name=$1 want=$2; shift 2  # out, rc: global, for a look after the call
  "$s3r" export --checkpoint "$from" "${tok[@]}" --format hf --out "$work/$name" "$@" > /dev/null || fail "export $name"
  # shellcheck disable=SC2086
  out=$(/usr/bin/python3 "$root/bench/peer/check_hf_export.py" --hf "$work/$name" --logprobs "$lp" $reader 2>&1)
  rc=$?
  echo "$name: $out"
  [ $rc = "$want" ] || fail "$name: exit status $rc, expected $want"
}
from=$run; lp=$work/logprobs.json; reader=
check hf 0
check bug-permute-qk 1 --inject permute-qk
check bug-transpose-o 1 --inject transpose-o
check bug-nan-weight 1 --inject nan-weight
grep -q "MISMATCH: non-finite" <<<"$out" || fail "bug-nan-weight: not reported as non-finite"
/usr/bin/python3 -c 'import json, sys
d = json.load(open(sys.argv[1])); d["logprobs"][2][5] = None; json.dump(d, open(sys.argv[2], "w"))' \
  "$work/logprobs.json" "$work/logprobs-null.json" || fail "cannot write logprobs-null.json"
out=$(/usr/bin/python3 "$root/bench/peer/check_hf_export.py" --hf "$work/hf" --logprobs "$work/logprobs-null.json" 2>&1)
rc=$?
echo "s3r NaN: $out"
[ $rc = 1 ] && grep -q "1 of .* s3r log-probabilities are not finite" <<<"$out" \
  || fail "a null s3r log-probability: exit status $rc, not reported as non-finite"
# Grouped-query attention.
from=$gqa_run; lp=$work/logprobs-gqa.json
check hf-gqa 0
/usr/bin/python3 -c 'import json, sys; c = json.load(open(sys.argv[1])); sys.exit(0 if (c["num_attention_heads"],
  c.get("num_key_value_heads"), c.get("head_dim")) == (4, 2, 24) else 1)' "$work/hf-gqa/config.json" \
  || fail "hf-gqa: config.json does not say 4 heads, 2 kv heads of 24: $(cat "$work/hf-gqa/config.json")"
reader="--inject gqa-kv-modulo"
check bug-gqa-reader-kv-modulo 1
# Qwen3: q_norm and k_norm (permuted with the rows of their head), and the reader without them.
from=$qwen3_run; lp=$work/logprobs-qwen3.json; reader=""
check hf-qwen3 0
reader="--inject qk-norm-skipped"
check bug-qwen3-reader-no-qk-norm 1
echo "hf export check: ok"
