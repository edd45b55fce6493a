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
# of cli.infer_smoke (RUN_DIR-qwen3) likewise, and the reader without QK-norm must fail. So does
# the Gemma 3 model of cli.infer_smoke (RUN_DIR-gemma3: two sliding layers, window 16; read as a
# Gemma3ForCausalLM) on a prompt of 27 tokens, longer than the window, and a 6-layer Gemma 3
# trained here (layer 5 attends globally with RoPE base 1e6): the reader with norms as w instead
# of 1 + w, without the sliding window, with the global RoPE base in the sliding layers or without
# QK-norm must fail, and so must an export without the q/k permutation.
# A Qwen3-MoE model trained here (--arch qwen3moe, tiny: 2 layers, 8 experts of width 24, 2 per
# token), read as a Qwen3MoeForCausalLM (config.json num_experts 8, num_experts_per_tok 2,
# moe_intermediate_size 24, norm_topk_prob true, decoder_sparse_step 1, mlp_only_layers [];
# mlp.gate.weight (8, C), mlp.experts.e.{gate,up,down}_proj.weight), must match to the same 1e-4
# (measured 9.6e-7; the smallest gap between a token's 2nd and 3rd routing probability is 6.0e-5,
# far above f32's error), and must fail: an export with the experts in reverse order (`s3r export
# --inject reverse-experts`: each expert paired with another's router row; measured 0.72), the
# reader without the renormalization over the top k (`--inject moe-no-renorm`; 0.47), routing to
# the k least probable experts (`moe-topk-last`; 0.85) or without QK-norm (0.97), and the export's
# config.json edited to norm_topk_prob false (the reader follows it; 0.47). The reader refuses
# (exit status 2) a config.json with a shared expert, and (its Model on the config alone)
# decoder_sparse_step 2, mlp_only_layers [1], use_sliding_window true or k > E.
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
gemma3_run=$run-gemma3  # likewise
[ -f "$gemma3_run/checkpoint/meta.json" ] || fail "no gemma3 run $gemma3_run (cli.infer_smoke trains it)"
gemma3_6_run=$work/run-gemma3-6  # six layers: five sliding, one global
"$s3r" train --arch gemma3 --preset tiny --layers 6 --vocab 300 --data "$data" --steps 20 --warmup 3 \
  --eval-every 20 --eval-batches 2 --out "$gemma3_6_run" > "$work/train-gemma3-6.log" 2>&1 \
  || fail "train gemma3 (6 layers): $(tail -3 "$work/train-gemma3-6.log")"
qwen3moe_run=$work/run-qwen3moe  # 8 experts of width 24, 2 per token, in each of 2 blocks
"$s3r" train --arch qwen3moe --preset tiny --vocab 300 --data "$data" --steps 20 --warmup 3 \
  --eval-every 20 --eval-batches 2 --out "$qwen3moe_run" > "$work/train-qwen3moe.log" 2>&1 \
  || fail "train qwen3moe: $(tail -3 "$work/train-qwen3moe.log")"
logprobs() {  # RUN OUT [PROMPT]
  "$s3r" generate --checkpoint "$1" "${tok[@]}" --prompt "${3:-the gradient rounds}" --precision f32 --max-tokens 1 \
    --dump-logprobs "$2" > /dev/null 2> "$work/generate.err" || fail "generate $1: $(cat "$work/generate.err")"
}
logprobs "$run" "$work/logprobs.json"
logprobs "$gqa_run" "$work/logprobs-gqa.json"
logprobs "$qwen3_run" "$work/logprobs-qwen3.json"
long_prompt="the gradient rounds the shared error"  # 27 tokens: more than the window of 16 (S = 32)
logprobs "$gemma3_run" "$work/logprobs-gemma3.json" "$long_prompt"
logprobs "$gemma3_6_run" "$work/logprobs-gemma3-6.json" "$long_prompt"
logprobs "$qwen3moe_run" "$work/logprobs-qwen3moe.json"
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
# Gemma 3: a Gemma3ForCausalLM with a tied head, the window and the local RoPE base in config.json.
from=$gemma3_run; lp=$work/logprobs-gemma3.json; reader=""
check hf-gemma3 0
grep -q "prompt of 27 tokens" <<<"$out" || fail "hf-gemma3: the prompt is not the 27 tokens that outrun the window"
/usr/bin/python3 -c 'import json, sys; c = json.load(open(sys.argv[1])); sys.exit(0 if (c["architectures"],
  c["model_type"], c["sliding_window"], c["query_pre_attn_scalar"], c["tie_word_embeddings"],
  c["rope_local_base_freq"], c["rope_theta"]) == (["Gemma3ForCausalLM"], "gemma3_text", 16, c["head_dim"], True,
  10000, 1000000) else 1)' "$work/hf-gemma3/config.json" \
  || fail "hf-gemma3: config.json is not Gemma 3's: $(cat "$work/hf-gemma3/config.json")"
check bug-gemma3-permute-qk 1 --inject permute-qk
for bug in gemma-norm-offset-skipped window-ignored qk-norm-skipped; do
  reader="--inject $bug"
  check "bug-gemma3-reader-$bug" 1
done
# A reader bug that cannot show is refused (exit 2), not passed: no window on a prompt within it.
logprobs "$gemma3_run" "$work/logprobs-gemma3-short.json"  # 16 tokens
out=$(/usr/bin/python3 "$root/bench/peer/check_hf_export.py" --hf "$work/hf-gemma3" \
  --logprobs "$work/logprobs-gemma3-short.json" --inject window-ignored 2>&1); rc=$?
[ $rc = 2 ] && grep -q "needs a sliding layer and a prompt longer than sliding_window" <<<"$out" \
  || fail "window-ignored on a prompt within the window: exit status $rc: $out"
from=$gemma3_6_run; lp=$work/logprobs-gemma3-6.json; reader=""
check hf-gemma3-6 0
grep -q "5 sliding layers of 6" <<<"$out" || fail "hf-gemma3-6: not five sliding layers of six"
for bug in local-rope-global-base window-ignored; do
  reader="--inject $bug"
  check "bug-gemma3-6-reader-$bug" 1
done
# Qwen3-MoE: a Qwen3MoeForCausalLM with one tensor per expert; routing softmax, top 2 of 8, renormalized.
from=$qwen3moe_run; lp=$work/logprobs-qwen3moe.json; reader=""
check hf-qwen3moe 0
grep -q "Qwen3MoeForCausalLM, 2 sparse layers of 2, 8 experts of width 24, 2 per token, norm_topk_prob true" \
  <<<"$out" || fail "hf-qwen3moe: not read as 2 sparse layers of 8 experts of 24, 2 per token, renormalized"
/usr/bin/python3 -c 'import json, sys; c = json.load(open(sys.argv[1])); sys.exit(0 if (c["architectures"],
  c["model_type"], c["num_experts"], c["num_experts_per_tok"], c["moe_intermediate_size"], c["norm_topk_prob"],
  c["decoder_sparse_step"], c["mlp_only_layers"]) == (["Qwen3MoeForCausalLM"], "qwen3_moe", 8, 2, 24, True, 1, [])
  else 1)' "$work/hf-qwen3moe/config.json" \
  || fail "hf-qwen3moe: config.json is not Qwen3-MoE's: $(cat "$work/hf-qwen3moe/config.json")"
check bug-qwen3moe-reverse-experts 1 --inject reverse-experts
for bug in moe-no-renorm moe-topk-last qk-norm-skipped; do
  reader="--inject $bug"
  check "bug-qwen3moe-reader-$bug" 1
done
# config.json edited: norm_topk_prob false must be followed (a mismatch); what the reader does not
# implement must be refused (exit status 2), not computed as something else.
edited() {  # NAME STATUS MESSAGE PYTHON: the export hf-qwen3moe with config.json changed by PYTHON (on c)
  local name=$1 want=$2 message=$3
  cp -r "$work/hf-qwen3moe" "$work/$name" || fail "$name: cannot copy hf-qwen3moe"  # WORK_DIR is new
  /usr/bin/python3 -c 'import json, sys; f = sys.argv[1]; c = json.load(open(f)); exec(sys.argv[2])
json.dump(c, open(f, "w"), indent=2)' "$work/$name/config.json" "$4" || fail "$name: cannot edit config.json"
  out=$(/usr/bin/python3 "$root/bench/peer/check_hf_export.py" --hf "$work/$name" --logprobs "$lp" 2>&1); rc=$?
  echo "$name: $out"
  [ $rc = "$want" ] && grep -q "$message" <<<"$out" || fail "$name: exit status $rc, expected $want and '$message'"
}
edited qwen3moe-no-norm-topk 1 "norm_topk_prob false" 'c["norm_topk_prob"] = False'
edited qwen3moe-shared-expert 2 "asks for a shared expert" 'c["shared_expert_intermediate_size"] = 48'
# The reader's other refusals, on config.json alone (its Model, in one process: no torch to load).
/usr/bin/python3 - "$root/bench/peer" "$work/hf-qwen3moe/config.json" <<'PY' \
  || fail "qwen3moe: a config.json that the reader does not implement was not refused as such"
import json, sys
sys.path.insert(0, sys.argv[1])
from check_hf_export import Model
base = json.load(open(sys.argv[2]))
Model(base)
wrong = 0
for change, message in (({"num_shared_experts": 1}, "asks for a shared expert"),
                        ({"decoder_sparse_step": 2}, "decoder_sparse_step 2"),
                        ({"mlp_only_layers": [1]}, "mlp_only_layers [1]"),
                        ({"use_sliding_window": True}, "use_sliding_window true"),
                        ({"num_experts_per_tok": 9}, "need 1 <= k <= E")):
    try:
        Model(dict(base, **change))
        print(f"config.json with {change}: accepted")
        wrong += 1
    except ValueError as e:
        print(f"config.json with {change}: refused: {e}")
        wrong += message not in str(e)
sys.exit(1 if wrong else 0)
PY
echo "hf export check: ok"
