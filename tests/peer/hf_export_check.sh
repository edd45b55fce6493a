#!/usr/bin/env bash
# `s3r export --format hf` read by an independent PyTorch reader of Hugging Face's Llama
# conventions (bench/peer/check_hf_export.py): its next-token log-probabilities match s3r's own
# f32 forward within 1e-4 (measured 1.3e-6), and exports with a deliberate bug (no q/k
# permutation for half-split RoPE; the attention output matrix not transposed) fail it. A NaN on
# either side fails it too, for that reason: an export with NaN weights (`--inject nan-weight`)
# and a null (s3r's NaN) in s3r's log-probabilities.
# Usage: hf_export_check.sh S3R_BINARY RUN_DIR DATA_DIR WORK_DIR REPO_ROOT
set -uo pipefail
s3r=$1; run=$2; data=$3; work=$4; root=$5
rm -rf "$work"; mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }
tok=(--tokenizer "$data/tokenizer.model")
"$s3r" generate --checkpoint "$run" "${tok[@]}" --prompt "the gradient rounds" --precision f32 --max-tokens 1 \
  --dump-logprobs "$work/logprobs.json" > /dev/null 2> "$work/generate.err" || fail "generate: $(cat "$work/generate.err")"
check() {  # NAME EXPECTED_STATUS [EXPORT OPTIONS...]
  local name=$1 want=$2; shift 2  # out, rc: global, for a look after the call
  "$s3r" export --checkpoint "$run" "${tok[@]}" --format hf --out "$work/$name" "$@" > /dev/null || fail "export $name"
  out=$(/usr/bin/python3 "$root/bench/peer/check_hf_export.py" --hf "$work/$name" --logprobs "$work/logprobs.json" 2>&1)
  rc=$?
  echo "$name: $out"
  [ $rc = "$want" ] || fail "$name: exit status $rc, expected $want"
}
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
echo "hf export check: ok"
