#!/usr/bin/env bash
# `s3r generate`, `s3r eval` and `s3r export` end to end on a tiny model trained here,
# and their errors, and the same on a grouped-query model (4 heads, 2 kv heads, head size 24) and a
# Qwen3 model. The runs (run, run-gqa, run-qwen3) and their data stay in WORK_DIR for tests/llama
# and tests/peer.
# Usage: infer_smoke.sh S3R_BINARY WORK_DIR
set -uo pipefail
s3r=$1; work=$2
rm -rf "$work"; mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }
words=(the quantized gradient rounds up down stochastic shared threshold token error mean layer
       model training loss correction example channel width)
for d in $(seq 1 300); do
  line=""
  for w in $(seq 1 40); do line+="${words[$(( (d * 7 + w * w * 3) % ${#words[@]} ))]} "; done
  printf '%s\n\n' "$line"
done > "$work/corpus.txt"
"$s3r" data prepare "$work/corpus.txt" --out "$work/data" --vocab 300 > "$work/prepare.log" || fail "prepare"
# The main job's mode (s3r + dx), tiny.
"$s3r" train --preset tiny --vocab 300 --data "$work/data" --steps 40 --warmup 3 --lr 3e-3 --eval-every 40 \
  --eval-batches 4 --out "$work/run" > "$work/train.log" || fail "train: $(tail -3 "$work/train.log")"
tok=(--tokenizer "$work/data/tokenizer.model")
# eval_near_logged NAME: `s3r eval` of run-NAME on the whole validation split within 10% of the
# run's last logged val_loss (a few batches of it).
eval_near_logged() {
  "$s3r" eval --checkpoint "$work/run-$1" --data "$work/data" > "$work/$1-eval.out" 2> "$work/$1-eval.err" \
    || fail "$1: eval: $(cat "$work/$1-eval.err")"
  local loss logged
  loss=$(sed -n 's/^loss \([0-9.]*\) nats.*/\1/p' "$work/$1-eval.out")
  logged=$(grep val_loss "$work/run-$1/metrics.jsonl" | tail -1 | sed 's/.*"val_loss":\([0-9.e+-]*\).*/\1/')
  echo "$1 eval: loss $loss (logged val_loss $logged)"
  python3 -c "import sys; a, b = float('$loss'), float('$logged'); sys.exit(0 if abs(a - b) <= 0.1 * b else 1)" \
    || fail "$1: eval loss $loss is far from the logged val_loss $logged"
}

expect_error() {  # PATTERN COMMAND...: exit status 1 and PATTERN on stderr
  local pattern=$1; shift
  local out rc
  out=$("$@" 2>&1 >/dev/null); rc=$?
  [ $rc = 1 ] || fail "'$*': exit $rc, expected 1: $out"
  grep -qE -- "$pattern" <<<"$out" || fail "'$*': no '$pattern' in: $out"
}

# generate: a continuation streamed to stdout, tokens/s on stderr; greedy is deterministic, and
# so is sampling with a seed.
"$s3r" generate --checkpoint "$work/run" "${tok[@]}" --prompt "the gradient" --max-tokens 10 --temperature 0 \
  --ignore-eos > "$work/g1.out" 2> "$work/g1.err" || fail "generate: $(cat "$work/g1.err")"
cat "$work/g1.out" "$work/g1.err"
grep -q "^the gradient." "$work/g1.out" || fail "no continuation of the prompt"
[ "$(wc -w < "$work/g1.out")" -gt 2 ] || fail "nothing generated: $(cat "$work/g1.out")"
grep -qE "10 new tokens in .* tokens/s" "$work/g1.err" || fail "no tokens/s line"
"$s3r" generate --checkpoint "$work/run" "${tok[@]}" --prompt "the gradient" --max-tokens 10 --temperature 0 \
  --ignore-eos > "$work/g2.out" 2>/dev/null
cmp -s "$work/g1.out" "$work/g2.out" || fail "greedy generation is not deterministic"
for i in 1 2; do
  "$s3r" generate --checkpoint "$work/run/checkpoint" "${tok[@]}" --prompt "the" --max-tokens 40 --temperature 1 \
    --top-k 20 --top-p 0.9 --seed 5 > "$work/s$i.out" 2>/dev/null || fail "sampling"
done
cmp -s "$work/s1.out" "$work/s2.out" || fail "the same seed gave different text"
# Past the context of S = 32 positions: the cache keeps its second half and goes on.
"$s3r" generate --checkpoint "$work/run" "${tok[@]}" --prompt "the" --max-tokens 70 --ignore-eos --seed 1 \
  > /dev/null 2> "$work/long.err" || fail "generate past the context: $(cat "$work/long.err")"
grep -q " 70 new tokens" "$work/long.err" || fail "not 70 tokens past the context: $(cat "$work/long.err")"
# The trainer copied the data's tokenizer into the checkpoint: no --tokenizer needed, the same text.
cmp -s "$work/run/checkpoint/tokenizer.model" "$work/data/tokenizer.model" \
  || fail "the training checkpoint does not hold the data's tokenizer.model"
"$s3r" generate --checkpoint "$work/run" --prompt "the gradient" --max-tokens 10 --temperature 0 --ignore-eos \
  > "$work/g3.out" 2>/dev/null || fail "generate without --tokenizer on a training checkpoint"
cmp -s "$work/g1.out" "$work/g3.out" || fail "the checkpoint's tokenizer gives other text than --tokenizer"
# A run on data without a tokenizer.model has none in its checkpoints: generate says what to pass.
mkdir -p "$work/data-notok" && cp "$work/data/train.bin" "$work/data/val.bin" "$work/data-notok/"
"$s3r" train --preset tiny --vocab 300 --data "$work/data-notok" --steps 1 --warmup 1 --eval-batches 1 \
  --out "$work/run-notok" > "$work/train-notok.log" 2>&1 || fail "train without a tokenizer: $(tail -3 "$work/train-notok.log")"
[ ! -e "$work/run-notok/checkpoint/tokenizer.model" ] || fail "a tokenizer.model appeared from nowhere"
expect_error "generate: no tokenizer: .*pass --tokenizer" "$s3r" generate --checkpoint "$work/run-notok" --prompt x
# A data folder whose tokenizer.model is not one is refused before step 0, not at the first save.
mkdir -p "$work/data-badtok" && cp "$work/data/train.bin" "$work/data/val.bin" "$work/data-badtok/"
echo "not a model" > "$work/data-badtok/tokenizer.model"
expect_error "tokenizer '.*data-badtok/tokenizer.model' is not a SentencePiece model" "$s3r" train --preset tiny \
  --vocab 300 --data "$work/data-badtok" --steps 1 --warmup 1 --out "$work/run-badtok"
[ ! -e "$work/run-badtok/metrics.jsonl" ] || fail "a run with a broken tokenizer started training"
expect_error "no checkpoint at '/nonexistent/checkpoint/meta.json'" "$s3r" generate --checkpoint /nonexistent --prompt x
expect_error "--temperature must be >= 0" "$s3r" generate --checkpoint "$work/run" --prompt x --temperature -1
expect_error "unknown precision 'f8'" "$s3r" generate --checkpoint "$work/run" "${tok[@]}" --prompt x --precision f8
expect_error "more than the model's context of 32" "$s3r" generate --checkpoint "$work/run" "${tok[@]}" \
  --prompt "$(printf 'the gradient rounds %.0s' $(seq 1 20))"

# eval on the prepared validation shard: every window, the perplexity; its loss near the one the
# trainer logged on a sample of the same windows (within 10%: another sample, the same model).
"$s3r" eval --checkpoint "$work/run" --data "$work/data" > "$work/eval.out" 2> "$work/eval.err" \
  || fail "eval: $(cat "$work/eval.err")"
cat "$work/eval.out"
grep -qE "perplexity [0-9.]+, bits per byte [0-9.]+" "$work/eval.out" || fail "no perplexity / bits per byte"
loss=$(sed -n 's/^loss \([0-9.]*\) nats.*/\1/p' "$work/eval.out")
logged=$(grep val_loss "$work/run/metrics.jsonl" | tail -1 | sed 's/.*"val_loss":\([0-9.e+-]*\).*/\1/')
python3 -c "import sys; a, b = float('$loss'), float('$logged'); sys.exit(0 if abs(a - b) <= 0.1 * b else 1)" \
  || fail "eval loss $loss is far from the logged val_loss $logged"
# eval on a text file: bytes counted from the pieces are the text's bytes (within 3%: the
# tokenizer's leading space per document, the tail after the last window).
head -n 120 "$work/corpus.txt" > "$work/some.txt"  # 60 documents
"$s3r" eval --checkpoint "$work/run" "${tok[@]}" --text "$work/some.txt" --batch 3 --json "$work/eval.json" \
  > "$work/eval_text.out" 2>&1 || fail "eval --text: $(cat "$work/eval_text.out")"
python3 - "$work/eval.json" "$work/some.txt" <<'PY' || fail "eval --text bytes"
import json, sys
r = json.load(open(sys.argv[1]))
text = open(sys.argv[2], "rb").read()
body = sum(len(p.strip()) for p in text.split(b"\n\n") if p.strip())
ratio = r["bytes"] / body
print(f"eval --text: {r['bytes']} bytes counted, {body} in the documents (ratio {ratio:.4f}); bpb {r['bits_per_byte']:.4f}")
sys.exit(0 if 0.97 <= ratio <= 1.03 and r["windows"] == (r["stream_tokens"] - 1) // r["seq_len"] else 1)
PY
expect_error "eval: give either --data DIR .* or --text FILE" "$s3r" eval --checkpoint "$work/run"
expect_error "--batch must be >= 1" "$s3r" eval --checkpoint "$work/run" --data "$work/data" --batch 0

# export: GGUF and a Hugging Face folder; bad formats and types are named.
"$s3r" export --checkpoint "$work/run" "${tok[@]}" --format gguf --out "$work/tiny.gguf" > /dev/null || fail "export gguf"
head -c 4 "$work/tiny.gguf" | grep -q GGUF || fail "not a GGUF file"
"$s3r" export --checkpoint "$work/run" "${tok[@]}" --format hf --out "$work/hf" > /dev/null || fail "export hf"
for f in config.json model.safetensors tokenizer.model tokenizer_config.json; do
  test -f "$work/hf/$f" || fail "hf export lacks $f"
done
expect_error "unknown --format 'onnx'; expected gguf or hf" "$s3r" export --checkpoint "$work/run" --format onnx --out x
expect_error "unknown weight type 'q4'" "$s3r" export --checkpoint "$work/run" "${tok[@]}" --format gguf --type q4 --out x
# Grouped-query attention (4 heads, 2 kv heads) with an explicit head size (24, not C / heads =
# 16: Q is 96 wide, K and V 48): meta.json's config has kv_heads and head_size only then (the
# architecture always); generation (greedy deterministic, past the context: the KV cache of 2
# heads), eval and both exports. run-gqa stays for tests/llama and tests/peer.
"$s3r" train --preset tiny --heads 4 --kv-heads 2 --head-size 24 --vocab 300 --data "$work/data" --steps 40 --warmup 3 --lr 3e-3 \
  --eval-every 40 --eval-batches 4 --out "$work/run-gqa" > "$work/train-gqa.log" 2>&1 \
  || fail "train --kv-heads 2: $(tail -3 "$work/train-gqa.log")"
python3 - "$work/run/checkpoint/meta.json" "$work/run-gqa/checkpoint/meta.json" <<'PY' || fail "kv_heads in meta.json"
import json, sys
mha, gqa = (json.load(open(p)) for p in sys.argv[1:])
got = (mha["config"].get("kv_heads"), mha["architecture"]["kv_heads"], gqa["config"].get("kv_heads"),
       gqa["architecture"]["kv_heads"], mha["config"].get("head_size"), mha["architecture"]["head_dim"],
       gqa["config"].get("head_size"), gqa["architecture"]["head_dim"])
print(f"kv_heads, head size in meta.json: MHA config {got[0]}, {got[4]}; architecture {got[1]}, {got[5]}; "
      f"GQA config {got[2]}, {got[6]}; architecture {got[3]}, {got[7]}")
sys.exit(0 if got == (None, 4, 2, 2, None, 16, 24, 24) else 1)
PY
for i in 1 2; do
  "$s3r" generate --checkpoint "$work/run-gqa" --prompt "the gradient" --max-tokens 10 --temperature 0 --ignore-eos \
    > "$work/gqa$i.out" 2> "$work/gqa$i.err" || fail "generate (GQA): $(cat "$work/gqa$i.err")"
done
cat "$work/gqa1.out"
grep -q "^the gradient." "$work/gqa1.out" && [ "$(wc -w < "$work/gqa1.out")" -gt 2 ] \
  || fail "GQA: no continuation of the prompt: $(cat "$work/gqa1.out")"
cmp -s "$work/gqa1.out" "$work/gqa2.out" || fail "GQA: greedy generation is not deterministic"
"$s3r" generate --checkpoint "$work/run-gqa" --prompt "the" --max-tokens 70 --ignore-eos --seed 1 \
  > /dev/null 2> "$work/gqa-long.err" || fail "GQA: generate past the context: $(cat "$work/gqa-long.err")"
grep -q " 70 new tokens" "$work/gqa-long.err" || fail "GQA: not 70 tokens past the context: $(cat "$work/gqa-long.err")"
eval_near_logged gqa
"$s3r" export --checkpoint "$work/run-gqa" "${tok[@]}" --format gguf --out "$work/tiny-gqa.gguf" > /dev/null || fail "GQA: export gguf"
"$s3r" export --checkpoint "$work/run-gqa" "${tok[@]}" --format hf --out "$work/hf-gqa" > /dev/null || fail "GQA: export hf"
python3 -c 'import json, sys; c = json.load(open(sys.argv[1])); sys.exit(0 if (c["num_attention_heads"],
  c["num_key_value_heads"]) == (4, 2) else 1)' "$work/hf-gqa/config.json" \
  || fail "GQA: hf config.json: $(cat "$work/hf-gqa/config.json")"
# Qwen3 (--arch qwen3: QK-norm, 2 kv heads of 32): meta.json names the family; generation is
# deterministic; eval; the exports name qwen3. run-qwen3 stays for tests/llama and tests/peer.
"$s3r" train --arch qwen3 --preset tiny --vocab 300 --data "$work/data" --steps 40 --warmup 3 --lr 3e-3 \
  --eval-every 40 --eval-batches 4 --out "$work/run-qwen3" > "$work/train-qwen3.log" 2>&1 \
  || fail "train --arch qwen3: $(tail -3 "$work/train-qwen3.log")"
python3 - "$work/run-qwen3/checkpoint/meta.json" <<'PY' || fail "qwen3 in meta.json"
import json, sys
m = json.load(open(sys.argv[1]))
c, a = m["config"], m["architecture"]
got = (c.get("arch"), a["family"], "qk_norm" in a, c["kv_heads"], c["head_size"], c["rope_theta"])
print(f"qwen3 meta.json: arch {got[0]}, family {got[1]}, qk_norm {got[2]}, kv_heads {got[3]}, head_size {got[4]}, "
      f"theta {got[5]}")
sys.exit(0 if got == ("qwen3", "qwen3", True, 2, 32, 1e6) else 1)
PY
for i in 1 2; do
  "$s3r" generate --checkpoint "$work/run-qwen3" --prompt "the gradient" --max-tokens 10 --temperature 0 --ignore-eos \
    > "$work/qwen3-$i.out" 2> "$work/qwen3-$i.err" || fail "generate (qwen3): $(cat "$work/qwen3-$i.err")"
done
cmp -s "$work/qwen3-1.out" "$work/qwen3-2.out" || fail "qwen3: greedy generation is not deterministic"
# Resuming it as another family is refused before any work; its checkpoint stays at step 40.
expect_error "the checkpoint's configuration \\(qwen3 L=2 .*\\) differs from this run's \\(L=2 " \
  "$s3r" train --preset tiny --vocab 300 --data "$work/data" --steps 50 --resume "$work/run-qwen3" --out "$work/run-qwen3"
grep -q '"step": 39' "$work/run-qwen3/checkpoint/meta.json" || fail "qwen3: the refused resume changed the checkpoint"
expect_error "unknown architecture 'gemma9'; expected one of: llama, qwen3, gemma3, qwen3moe" \
  "$s3r" train --arch gemma9 --preset tiny --data "$work/data"
"$s3r" eval --checkpoint "$work/run-qwen3" --data "$work/data" > "$work/qwen3-eval.out" 2>&1 \
  || fail "qwen3: eval: $(cat "$work/qwen3-eval.out")"
"$s3r" export --checkpoint "$work/run-qwen3" "${tok[@]}" --format hf --out "$work/hf-qwen3" > /dev/null || fail "qwen3: export hf"
python3 -c 'import json, sys; c = json.load(open(sys.argv[1])); sys.exit(0 if (c["architectures"], c["model_type"],
  c["head_dim"]) == (["Qwen3ForCausalLM"], "qwen3", 32) else 1)' "$work/hf-qwen3/config.json" \
  || fail "qwen3: hf config.json: $(cat "$work/hf-qwen3/config.json")"
# Gemma 3 (--arch gemma3: 1 + w gains, post-norms, GeGLU, embeddings times sqrt(C), tied head,
# local layers with a window of S / 2 = 16): meta.json names them; no lm_head tensor is saved;
# generation is deterministic; eval's loss is the logged one; --window is checked before any work.
"$s3r" train --arch gemma3 --preset tiny --vocab 300 --data "$work/data" --steps 40 --warmup 3 --lr 3e-3 \
  --eval-every 40 --eval-batches 4 --out "$work/run-gemma3" > "$work/train-gemma3.log" 2>&1 \
  || fail "train --arch gemma3: $(tail -3 "$work/train-gemma3.log")"
python3 - "$work/run-gemma3/checkpoint" <<'PY' || fail "gemma3 in meta.json"
import json, struct, sys
m = json.load(open(sys.argv[1] + "/meta.json"))
c, a = m["config"], m["architecture"]
raw = open(sys.argv[1] + "/model.safetensors", "rb").read()
names = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]]).keys()
got = (c.get("arch"), c.get("window"), c["kv_heads"], a["embedding"].get("tied"), a["embedding"].get("scale"),
       a["ffn"]["type"], a["attention"].get("sliding_window"), "post_norms" in a, "lm_head" in names,
       "blocks.0.attn_post_norm" in names)
print(f"gemma3 meta.json: arch, window, kv_heads, tied, scale, ffn, sliding_window, post_norms: {got[:8]}; "
      f"lm_head saved {got[8]}, post-norm saved {got[9]}")
sys.exit(0 if got == ("gemma3", 16, 2, True, "sqrt(width)", "geglu", 16, True, False, True) else 1)
PY
for i in 1 2; do
  "$s3r" generate --checkpoint "$work/run-gemma3" --prompt "the gradient" --max-tokens 10 --temperature 0 --ignore-eos \
    > "$work/gemma3-$i.out" 2> "$work/gemma3-$i.err" || fail "generate (gemma3): $(cat "$work/gemma3-$i.err")"
done
cmp -s "$work/gemma3-1.out" "$work/gemma3-2.out" || fail "gemma3: greedy generation is not deterministic"
eval_near_logged gemma3
expect_error "--window 32 must be below --seq-len 32 " \
  "$s3r" train --arch gemma3 --preset tiny --window 32 --data "$work/data" --out "$work/none"
expect_error "--window 8: the llama family has no local layers" \
  "$s3r" train --preset tiny --window 8 --data "$work/data" --out "$work/none"
[ ! -e "$work/none" ] || fail "a refused --window left $work/none"
echo "infer smoke: ok"
