#!/usr/bin/python3
"""Independent check of `s3r export --format hf`: reads the exported folder as a Hugging Face
LlamaForCausalLM (config.json, model.safetensors) and computes its forward in PyTorch (float64)
following transformers' Llama conventions, written from them and not from s3r: weights (out, in)
applied as x W^T, RoPE on half-split pairs (rotate_half: (x[i], x[i + HD/2]) with inv_freq
theta^(-2i/HD)), RMSNorm x / sqrt(mean(x^2) + eps) * w, MLP down(silu(gate(x)) * up(x)), untied
lm_head; grouped-query attention with num_key_value_heads NKV < num_attention_heads NH
(k_proj, v_proj (NKV * HD, C); repeat_kv: query head h attends with kv head h // (NH / NKV)); a
Qwen3ForCausalLM is the same with q_norm and k_norm (RMSNorm over each head's head_dim elements
of q and k, before RoPE). Its next-token log-probabilities after every prompt token are compared
with s3r's own (`s3r generate --precision f32 --dump-logprobs FILE`).

  /usr/bin/python3 bench/peer/check_hf_export.py --hf DIR --logprobs FILE [--tolerance 1e-4]
                                                  [--inject gqa-kv-modulo|qk-norm-skipped]

Tolerance: s3r's forward in f32 against this one in float64; measured 2e-6 on a tiny model. An
export without the q/k permutation (half-split RoPE applied to adjacent-pair weights) or with
a matrix left untransposed is off by 1e-2 or more (tests/peer/hf_export_check.sh); so is this
reader with `--inject gqa-kv-modulo` (query head h reading kv head h % NKV: the wrong repeat_kv)
on a grouped-query export.
A non-finite number on either side (NaN or infinity here; NaN, infinity or null, JSON's stand-in
for NaN, in s3r's dump) is a mismatch: a NaN difference compares false with the tolerance and
would otherwise pass.
Exit status: 0 within the tolerance, 1 on a mismatch (MISMATCH), 2 on unusable inputs.
"""
import argparse
import json
import math
import os
import sys

import peer_env


def main():
    peer_env.ensure(2, malloc_tuning=False)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hf", required=True, help="folder written by s3r export --format hf")
    ap.add_argument("--logprobs", required=True, help="JSON of s3r generate --dump-logprobs")
    ap.add_argument("--tolerance", type=float, default=1e-4)
    ap.add_argument("--inject", choices=("gqa-kv-modulo", "qk-norm-skipped"),
                    help="a deliberate bug in this reader (the check must then fail): gqa-kv-modulo, query head h "
                         "reads kv head h %% NKV instead of h // (NH / NKV) (grouped-query exports only); "
                         "qk-norm-skipped, Qwen3's q_norm and k_norm left out")
    args = ap.parse_args()
    import torch
    import s3r_files

    try:
        with open(os.path.join(args.hf, "config.json")) as f:
            cfg = json.load(f)
        with open(args.logprobs) as f:
            dump = json.load(f)
        w = {k: torch.from_numpy(v.copy()).double()
             for k, v in s3r_files.read_safetensors(os.path.join(args.hf, "model.safetensors")).items()}
    except (OSError, ValueError, KeyError, s3r_files.FormatError) as e:
        print(f"check_hf_export: cannot read the inputs: {e}", file=sys.stderr)
        return 2
    families = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM"}
    if cfg.get("architectures") != [families.get(cfg.get("model_type"))]:
        print(f"check_hf_export: config.json is neither a LlamaForCausalLM nor a Qwen3ForCausalLM: "
              f"{cfg.get('architectures')}, model_type {cfg.get('model_type')}", file=sys.stderr)
        return 2
    qk_norm = cfg["model_type"] == "qwen3"  # Qwen3Attention: q_norm, k_norm over head_dim before RoPE
    L, C, NH = cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_attention_heads"]
    HD = cfg.get("head_dim", C // NH)
    NKV = cfg.get("num_key_value_heads", NH)  # transformers' default: multi-head attention
    if not isinstance(NKV, int) or NKV < 1 or NH % NKV != 0:
        print(f"check_hf_export: num_key_value_heads {NKV!r} does not divide num_attention_heads {NH}",
              file=sys.stderr)
        return 2
    if args.inject == "gqa-kv-modulo" and NKV in (1, NH):
        print(f"check_hf_export: --inject gqa-kv-modulo needs 1 < num_key_value_heads < num_attention_heads "
              f"(here {NKV} and {NH})", file=sys.stderr)
        return 2
    eps, theta = cfg["rms_norm_eps"], cfg["rope_theta"]
    ids = torch.tensor(dump["prompt_ids"])
    S = len(ids)

    def rmsnorm(x, g):
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * g

    def rotate_half(x):
        return torch.cat([-x[..., HD // 2:], x[..., :HD // 2]], dim=-1)

    inv_freq = 1.0 / (theta ** (torch.arange(0, HD, 2, dtype=torch.float64) / HD))
    freqs = torch.outer(torch.arange(S, dtype=torch.float64), inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)
    cos, sin = emb.cos()[:, None, :], emb.sin()[:, None, :]  # (S, 1, HD)
    mask = torch.full((S, S), float("-inf"), dtype=torch.float64).triu(1)

    def repeat_kv(t):  # (S, NKV, HD) -> (S, NH, HD): kv head j serves query heads j*G .. j*G + G-1
        if args.inject == "gqa-kv-modulo":
            return t.repeat(1, NH // NKV, 1)
        return t.repeat_interleave(NH // NKV, dim=1)

    for l in range(L):  # Hugging Face's shapes (out, in): a wrong one is an export bug, not a traceback
        p = f"model.layers.{l}.self_attn."
        for name, shape in (("q_proj", (NH * HD, C)), ("k_proj", (NKV * HD, C)), ("v_proj", (NKV * HD, C)),
                            ("o_proj", (C, NH * HD))):
            got = tuple(w[p + name + ".weight"].shape) if p + name + ".weight" in w else None
            if got != shape:
                print(f"MISMATCH: {p}{name}.weight has shape {got}, expected {shape} "
                      f"({NH} heads, {NKV} kv heads of {HD})")
                return 1
    x = w["model.embed_tokens.weight"][ids]  # (S, C)
    for l in range(L):
        p = f"model.layers.{l}."
        h = rmsnorm(x, w[p + "input_layernorm.weight"])
        q = (h @ w[p + "self_attn.q_proj.weight"].T).view(S, NH, HD)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).view(S, NKV, HD)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).view(S, NKV, HD)
        if qk_norm and args.inject != "qk-norm-skipped":
            q, k = rmsnorm(q, w[p + "self_attn.q_norm.weight"]), rmsnorm(k, w[p + "self_attn.k_norm.weight"])
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = repeat_kv(k), repeat_kv(v)
        scores = torch.einsum("snd,tnd->nst", q, k) / math.sqrt(HD) + mask
        att = torch.einsum("nst,tnd->snd", scores.softmax(-1), v).reshape(S, NH * HD)
        x = x + att @ w[p + "self_attn.o_proj.weight"].T
        h = rmsnorm(x, w[p + "post_attention_layernorm.weight"])
        gate, up = h @ w[p + "mlp.gate_proj.weight"].T, h @ w[p + "mlp.up_proj.weight"].T
        x = x + (torch.nn.functional.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
    logp = (rmsnorm(x, w["model.norm.weight"]) @ w["lm_head.weight"].T).log_softmax(-1)
    try:  # s3r writes a NaN as null
        s3r = torch.tensor([[math.nan if v is None else v for v in row] for row in dump["logprobs"]],
                           dtype=torch.float64)
    except (TypeError, ValueError) as e:
        print(f"check_hf_export: {args.logprobs} holds no (positions, tokens) log-probabilities: {e}", file=sys.stderr)
        return 2
    if s3r.shape != logp.shape:
        print(f"MISMATCH: shapes {tuple(s3r.shape)} (s3r) and {tuple(logp.shape)} (Hugging Face)")
        return 1
    finite = True
    for side, t in (("Hugging Face", logp), ("s3r", s3r)):
        bad = ~torch.isfinite(t)
        if bad.any():
            pos, tok = divmod(int(bad.reshape(-1).nonzero()[0]), t.shape[1])
            print(f"check_hf_export: {int(bad.sum())} of {t.numel()} {side} log-probabilities are not finite "
                  f"(first at position {pos}, token {tok}: {float(t[pos, tok])})")
            finite = False
    diff = (logp - s3r).abs()
    # NaN counts as the largest difference (torch's max and argmax propagate it).
    worst = float(diff.max())
    pos, tok = divmod(int(diff.argmax()), logp.shape[1])
    print(f"check_hf_export: {S} positions x {logp.shape[1]} tokens, max |log-prob difference| {worst:.3e} "
          f"(tolerance {args.tolerance:g}) at position {pos}, token {tok}: "
          f"Hugging Face {float(logp[pos, tok]):.6f}, s3r {float(s3r[pos, tok]):.6f}")
    if not finite or not math.isfinite(worst) or not worst <= args.tolerance:
        print("MISMATCH" + ("" if finite else ": non-finite log-probabilities"))
        return 1
    print("check_hf_export: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
