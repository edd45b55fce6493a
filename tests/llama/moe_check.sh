#!/usr/bin/env bash
# The tiny Qwen3-MoE model of cli.moe_smoke exported to GGUF (general.architecture qwen3moe: the
# router as ffn_gate_inp, the experts stacked as ffn_{gate,up,down}_exps, expert_count,
# expert_used_count, expert_feed_forward_length) and run in llama.cpp (node-llama-cpp, as
# llama_check.sh): f32 next-token log-probabilities within 1e-4 of `s3r generate --precision f32`
# and the same greedy tokens; the same export with the experts in reverse order (each expert
# paired with another's router column: --inject reverse-experts) or with Q and K not permuted
# for llama.cpp's half-split RoPE (--inject permute-qk) must fail that comparison.
# Usage: moe_check.sh S3R_BINARY RUN_DIR DATA_DIR WORK_DIR REPO_ROOT
set -uo pipefail
s3r=$1; run=$2; data=$3; work=$4; root=$5
rm -rf "$work"; mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }
[ -f "$run/checkpoint/meta.json" ] || fail "no qwen3moe run $run (cli.moe_smoke trains it)"
tok=(--tokenizer "$data/tokenizer.model")
export_gguf() {  # NAME [OPTIONS...]
  local name=$1; shift
  "$s3r" export --checkpoint "$run" --format gguf --out "$work/$name.gguf" "${tok[@]}" "$@" > "$work/$name.log" 2>&1 \
    || fail "export $name: $(cat "$work/$name.log")"
}
export_gguf f32
export_gguf bug-reverse-experts --inject reverse-experts
export_gguf bug-permute-qk --inject permute-qk
"$s3r" generate --checkpoint "$run" "${tok[@]}" --prompt "The expert, 'routes'" --precision f32 --temperature 0 \
  --max-tokens 12 --ignore-eos --print-ids --dump-logprobs "$work/logprobs.json" > "$work/gen.out" 2> "$work/gen.err" \
  || fail "generate: $(cat "$work/gen.err")"
ids=$(grep '^ids:' "$work/gen.err" | sed 's/.*| *//' | tr ' ' ',')
[ -n "$ids" ] || fail "no generated ids in $(cat "$work/gen.err")"
cd "$root/tests/llama" || fail "no $root/tests/llama"
node check_gguf.mjs "$work/logprobs.json" "$ids" \
  "$work/f32.gguf:1e-4:match:greedy" "$work/bug-reverse-experts.gguf:1e-4:mismatch" \
  "$work/bug-permute-qk.gguf:1e-4:mismatch" \
  || fail "llama.cpp check of the qwen3moe model (above)"
echo "llama.cpp check of qwen3moe: ok"
