#!/usr/bin/python3
"""Independent check of `s3r export --format hf`: reads the exported folder as a Hugging Face
LlamaForCausalLM, Qwen3ForCausalLM, Gemma3ForCausalLM or Qwen3MoeForCausalLM (config.json,
model.safetensors) and computes its forward in PyTorch (float64) following transformers'
conventions, written from them and not from s3r (the Gemma 3 parts from transformers'
modeling_gemma3 and masking_utils, the Qwen3-MoE parts from modeling_qwen3_moe and
configuration_qwen3_moe):
weights (out, in) applied as x W^T, RoPE on half-split pairs (rotate_half: (x[i], x[i + HD/2])
with inv_freq theta^(-2i/HD)), RMSNorm x / sqrt(mean(x^2) + eps) * w, MLP
down(silu(gate(x)) * up(x)), untied lm_head; grouped-query attention with num_key_value_heads
NKV < num_attention_heads NH (k_proj, v_proj (NKV * HD, C); repeat_kv: query head h attends with
kv head h // (NH / NKV)). A Qwen3ForCausalLM adds q_norm and k_norm (RMSNorm over each head's
head_dim elements of q and k, before RoPE). A Gemma3ForCausalLM (model_type gemma3_text) is the
Qwen3 block with Gemma3RMSNorm (gain 1 + w) everywhere, post_attention_layernorm on the
attention's output and post_feedforward_layernorm on the MLP's (pre_feedforward_layernorm before
it), the MLP's activation gelu_pytorch_tanh, embeddings times hidden_size ** 0.5 (a float32
tensor, as Gemma3TextScaledWordEmbedding's buffer), scores times query_pre_attn_scalar ** -0.5,
the head tied to embed_tokens (tie_word_embeddings), soft-capping where the config sets it, and
per layer (config layer_types, or sliding_window_pattern P: layer l slides when (l + 1) % P != 0)
either full causal attention with RoPE base rope_theta or a sliding window (query i sees keys
i - sliding_window < j <= i, masking_utils' sliding_window_overlay) with rope_local_base_freq.
A Qwen3MoeForCausalLM (model_type qwen3_moe) is the Qwen3 block with the MLP replaced by
Qwen3MoeSparseMoeBlock: router logits h gate^T (mlp.gate.weight (num_experts E, C)), softmax over
the E experts (transformers: in f32; here float64), the num_experts_per_tok k largest probabilities
(ties to the lower expert: a stable sort; torch.topk leaves ties unspecified), divided by their sum
when norm_topk_prob (Qwen3MoeConfig's default: false), and the output sum_j w_j expert_j(h) with
each expert mlp.experts.e.{gate,up,down}_proj a SwiGLU of width moe_intermediate_size. The reader
refuses (exit status 2) what it does not implement: dense layers among the sparse ones
(decoder_sparse_step != 1, mlp_only_layers), a shared expert (Qwen2-MoE's
shared_expert_intermediate_size and the like), use_sliding_window (Qwen3's and Qwen3-MoE's).
Its next-token log-probabilities after every prompt token are compared with s3r's own
(`s3r generate --precision f32 --dump-logprobs FILE`).

  /usr/bin/python3 bench/peer/check_hf_export.py --hf DIR --logprobs FILE [--tolerance 1e-4] [--inject BUG]

Tolerance: s3r's forward in f32 against this one in float64; measured 2e-6 on a tiny model (the
qwen3_moe line also reports the smallest margin between the k-th and the (k+1)-th probability of
any token's routing: a near-tie there could route f32 and float64 differently). An
export without the q/k permutation (half-split RoPE applied to adjacent-pair weights) or with
a matrix left untransposed is off by 1e-2 or more (tests/peer/hf_export_check.sh); so is this
reader with an injected bug (--inject, BUGS below), such as the wrong repeat_kv on a grouped-query
export or Gemma's norms applied as w instead of 1 + w, or the experts' weights not renormalized.
A non-finite number on either side (NaN or infinity here; NaN, infinity or null, JSON's stand-in
for NaN, in s3r's dump) is a mismatch: a NaN difference compares false with the tolerance and
would otherwise pass.
Exit status: 0 within the tolerance, 1 on a mismatch (MISMATCH), 2 on unusable inputs (a config this
reader does not implement among them).
"""
import argparse
import json
import math
import os
import sys

import peer_env

FAMILIES = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM", "gemma3_text": "Gemma3ForCausalLM",
            "qwen3_moe": "Qwen3MoeForCausalLM"}
# Deliberate bugs in this reader (the check must then fail): name -> (what, model types it needs).
BUGS = {
    "gqa-kv-modulo": ("query head h reads kv head h % NKV instead of h // (NH / NKV) (grouped-query exports)",
                      ("llama", "qwen3", "gemma3_text")),
    "qk-norm-skipped": ("q_norm and k_norm left out", ("qwen3", "gemma3_text", "qwen3_moe")),
    "gemma-norm-offset-skipped": ("Gemma3RMSNorm's gain applied as w instead of 1 + w", ("gemma3_text",)),
    "window-ignored": ("sliding layers attend to every earlier key", ("gemma3_text",)),
    "local-rope-global-base": ("sliding layers rotate with rope_theta instead of rope_local_base_freq",
                               ("gemma3_text",)),
    "moe-no-renorm": ("the k experts' probabilities used as they are, not divided by their sum (norm_topk_prob "
                      "ignored)", ("qwen3_moe",)),
    "moe-topk-last": ("each token routed to its k least probable experts instead of its k most probable",
                      ("qwen3_moe",)),
}
SLIDING, FULL = "sliding_attention", "full_attention"


class Model:
    """The exported model's config.json read as transformers reads it."""

    def __init__(self, cfg):
        self.cfg, self.type = cfg, cfg["model_type"]
        self.gemma = self.type == "gemma3_text"
        self.qk_norm = self.type in ("qwen3", "gemma3_text", "qwen3_moe")
        self.moe = self.type == "qwen3_moe"
        self.L, self.C, self.NH = cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_attention_heads"]
        self.HD = cfg.get("head_dim") or self.C // self.NH
        self.NKV = cfg.get("num_key_value_heads", self.NH)  # transformers' default: multi-head attention
        if not isinstance(self.NKV, int) or self.NKV < 1 or self.NH % self.NKV != 0:
            raise ValueError(f"num_key_value_heads {self.NKV!r} does not divide num_attention_heads {self.NH}")
        self.eps = cfg["rms_norm_eps"]
        self.tied = cfg.get("tie_word_embeddings", self.gemma)  # Gemma3TextConfig's default is True
        if self.gemma:
            act = cfg.get("hidden_activation")
            if act != "gelu_pytorch_tanh":
                raise ValueError(f"hidden_activation {act!r}: this reader knows gelu_pytorch_tanh")
            self.scaling = cfg["query_pre_attn_scalar"] ** -0.5
            self.kinds = cfg.get("layer_types") or [
                SLIDING if (l + 1) % cfg.get("sliding_window_pattern", 6) else FULL for l in range(self.L)]
            if len(self.kinds) != self.L or not set(self.kinds) <= {SLIDING, FULL}:
                raise ValueError(f"layer_types {self.kinds!r}: not {self.L} of {SLIDING}, {FULL}")
            self.window = cfg["sliding_window"]
            rp = cfg.get("rope_parameters") or {}  # newer transformers: per layer type
            self.theta = {FULL: rp.get(FULL, {}).get("rope_theta", cfg.get("rope_theta")),
                          SLIDING: rp.get(SLIDING, {}).get("rope_theta", cfg.get("rope_local_base_freq"))}
        else:
            if cfg.get("hidden_act", "silu") != "silu":
                raise ValueError(f"hidden_act {cfg.get('hidden_act')!r}: this reader knows silu")
            if cfg.get("use_sliding_window"):  # Qwen3Config, Qwen3MoeConfig: windows per max_window_layers
                raise ValueError("use_sliding_window true: this reader knows full causal attention only")
            self.scaling = self.HD ** -0.5
            self.kinds, self.window, self.theta = [FULL] * self.L, None, {FULL: cfg["rope_theta"]}
        if self.moe:
            self.read_moe(cfg)

    def read_moe(self, cfg):
        """Qwen3MoeConfig's routing fields; what Qwen3MoeForCausalLM would do otherwise is refused."""
        shared = {k: v for k, v in cfg.items() if "shared_expert" in k and v}  # Qwen2-MoE, DeepSeek: not Qwen3-MoE
        if shared:
            raise ValueError(f"config.json asks for a shared expert ({shared}): Qwen3MoeSparseMoeBlock has none, "
                             "and this reader implements none")
        step, dense = cfg.get("decoder_sparse_step", 1), cfg.get("mlp_only_layers") or []  # Qwen3MoeConfig's defaults
        if step != 1 or dense:
            raise ValueError(f"decoder_sparse_step {step!r}, mlp_only_layers {dense!r}: this reader implements every "
                             "layer sparse only (decoder_sparse_step 1, mlp_only_layers [])")
        self.E, self.k, self.F = cfg["num_experts"], cfg["num_experts_per_tok"], cfg["moe_intermediate_size"]
        if not (isinstance(self.E, int) and isinstance(self.k, int) and 1 <= self.k <= self.E):
            raise ValueError(f"num_experts {self.E!r}, num_experts_per_tok {self.k!r}: need 1 <= k <= E")
        self.norm_topk = cfg.get("norm_topk_prob", False)  # Qwen3MoeConfig's default is False
        if not isinstance(self.norm_topk, bool):
            raise ValueError(f"norm_topk_prob {self.norm_topk!r}: not true or false")

    def shape_error(self, w):
        """A message when a tensor has a shape other than Hugging Face's (out, in) one, else None."""
        want = {"model.embed_tokens.weight": (self.cfg["vocab_size"], self.C), "model.norm.weight": (self.C,)}
        if not self.tied:
            want["lm_head.weight"] = (self.cfg["vocab_size"], self.C)
        for l in range(self.L):
            p = f"model.layers.{l}.self_attn."
            q, kv = self.NH * self.HD, self.NKV * self.HD
            want.update({p + "q_proj.weight": (q, self.C), p + "k_proj.weight": (kv, self.C),
                         p + "v_proj.weight": (kv, self.C), p + "o_proj.weight": (self.C, q)})
            if self.moe:  # Qwen3MoeSparseMoeBlock: gate, and one Qwen3MoeMLP per expert
                p = f"model.layers.{l}.mlp."
                moe = {p + "gate.weight": (self.E, self.C)}
                for e in range(self.E):
                    moe.update({f"{p}experts.{e}.gate_proj.weight": (self.F, self.C),
                                f"{p}experts.{e}.up_proj.weight": (self.F, self.C),
                                f"{p}experts.{e}.down_proj.weight": (self.C, self.F)})
                other = sorted(n for n in w if n.startswith(p) and n not in moe)
                if other:  # a dense MLP's, a shared expert's, a fused layout: not this model
                    return f"{other[0]} in a sparse layer ({len(other)} tensors beside gate and experts.0-{self.E - 1})"
                want.update(moe)
        for name, shape in want.items():
            got = tuple(w[name].shape) if name in w else None
            if got != shape:
                what = (f"{self.E} experts of width {self.F}" if ".mlp." in name else
                        f"{self.NH} heads, {self.NKV} kv heads of {self.HD}")
                return f"{name} has shape {got}, expected {shape} ({what})"
        if self.tied and "lm_head.weight" in w:
            return "lm_head.weight in an export with tie_word_embeddings (the head is embed_tokens)"
        return None


def sparse_moe(m, w, h, l, inject, stats):
    """Qwen3MoeSparseMoeBlock of layer l on h (S, C); `stats` gets the smallest routing margin."""
    import torch

    p = f"model.layers.{l}.mlp."
    probs = (h @ w[p + "gate.weight"].T).softmax(-1)  # (S, E)
    # Stable sort: of equal probabilities the lower expert comes first (s3r's rule).
    order = torch.sort(probs, dim=-1, descending=inject != "moe-topk-last", stable=True).indices
    chosen = order[:, :m.k]  # (S, k)
    weights = probs.gather(1, chosen)
    if m.E > m.k:
        ranked = probs.gather(1, torch.sort(probs, dim=-1, descending=True, stable=True).indices)
        margin = float((ranked[:, m.k - 1] - ranked[:, m.k]).min())
        stats["margin"] = min(stats.get("margin", margin), margin)
    if m.norm_topk and inject != "moe-no-renorm":
        weights = weights / weights.sum(-1, keepdim=True)
    out = torch.zeros_like(h)
    for e in range(m.E):
        tok, slot = (chosen == e).nonzero(as_tuple=True)
        if tok.numel() == 0:
            continue
        q = f"{p}experts.{e}."
        x = h[tok]
        y = (torch.nn.functional.silu(x @ w[q + "gate_proj.weight"].T) * (x @ w[q + "up_proj.weight"].T)) \
            @ w[q + "down_proj.weight"].T
        out.index_add_(0, tok, y * weights[tok, slot, None])
    return out


def hf_logprobs(m, w, ids, inject, stats):
    """(S, V) float64 log-probabilities of the next token after each of `ids`; `stats` gets the
    smallest routing margin (qwen3_moe)."""
    import torch

    S, HD = len(ids), m.HD

    def norm(x, g):
        gain = 1.0 + g if m.gemma and inject != "gemma-norm-offset-skipped" else g  # Gemma3RMSNorm: 1 + w
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + m.eps) * gain

    def rope(kind):  # (S, 1, HD) cos and sin of the layer type's base
        theta = m.theta[FULL if inject == "local-rope-global-base" else kind]
        inv_freq = 1.0 / (theta ** (torch.arange(0, HD, 2, dtype=torch.float64) / HD))
        emb = torch.outer(torch.arange(S, dtype=torch.float64), inv_freq).repeat(1, 2)
        return emb.cos()[:, None, :], emb.sin()[:, None, :]

    def rotate_half(x):
        return torch.cat([-x[..., HD // 2:], x[..., :HD // 2]], dim=-1)

    def mask(kind):  # additive (S, S): causal, and for a sliding layer keys j > i - window only
        i, j = torch.arange(S)[:, None], torch.arange(S)[None, :]
        keep = j <= i
        if kind == SLIDING and inject != "window-ignored":
            keep &= j > i - m.window
        return torch.zeros(S, S, dtype=torch.float64).masked_fill(~keep, float("-inf"))

    def repeat_kv(t):  # (S, NKV, HD) -> (S, NH, HD): kv head j serves query heads j*G .. j*G + G-1
        if inject == "gqa-kv-modulo":
            return t.repeat(1, m.NH // m.NKV, 1)
        return t.repeat_interleave(m.NH // m.NKV, dim=1)

    def attention(h, l):
        p = f"model.layers.{l}.self_attn."
        q = (h @ w[p + "q_proj.weight"].T).view(S, m.NH, HD)
        k = (h @ w[p + "k_proj.weight"].T).view(S, m.NKV, HD)
        v = (h @ w[p + "v_proj.weight"].T).view(S, m.NKV, HD)
        if m.qk_norm and inject != "qk-norm-skipped":
            q, k = norm(q, w[p + "q_norm.weight"]), norm(k, w[p + "k_norm.weight"])
        cos, sin = rope(m.kinds[l])
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = repeat_kv(k), repeat_kv(v)
        scores = torch.einsum("snd,tnd->nst", q, k) * m.scaling
        cap = m.cfg.get("attn_logit_softcapping") if m.gemma else None
        if cap:
            scores = torch.tanh(scores / cap) * cap
        att = torch.einsum("nst,tnd->snd", (scores + mask(m.kinds[l])).softmax(-1), v).reshape(S, m.NH * HD)
        return att @ w[p + "o_proj.weight"].T

    def mlp(h, l):
        p = f"model.layers.{l}.mlp."
        gate, up = h @ w[p + "gate_proj.weight"].T, h @ w[p + "up_proj.weight"].T
        act = torch.nn.functional.gelu(gate, approximate="tanh") if m.gemma else torch.nn.functional.silu(gate)
        return (act * up) @ w[p + "down_proj.weight"].T

    x = w["model.embed_tokens.weight"][ids]  # (S, C)
    if m.gemma:  # the buffer torch.tensor(hidden_size ** 0.5) is float32, cast to the weights' dtype
        x = x * torch.tensor(m.C ** 0.5).to(torch.float64)
    for l in range(m.L):
        p = f"model.layers.{l}."
        if m.gemma:
            a = attention(norm(x, w[p + "input_layernorm.weight"]), l)
            x = x + norm(a, w[p + "post_attention_layernorm.weight"])
            f = mlp(norm(x, w[p + "pre_feedforward_layernorm.weight"]), l)
            x = x + norm(f, w[p + "post_feedforward_layernorm.weight"])
        else:
            x = x + attention(norm(x, w[p + "input_layernorm.weight"]), l)
            h = norm(x, w[p + "post_attention_layernorm.weight"])
            x = x + (sparse_moe(m, w, h, l, inject, stats) if m.moe else mlp(h, l))
    head = w["model.embed_tokens.weight"] if m.tied else w["lm_head.weight"]
    logits = norm(x, w["model.norm.weight"]) @ head.T
    cap = m.cfg.get("final_logit_softcapping") if m.gemma else None
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return logits.log_softmax(-1)


def compare(logp, dump, tolerance, logprobs_path):
    """Exit status of the comparison of our log-probabilities with s3r's dump (printed)."""
    import torch

    try:  # s3r writes a NaN as null
        s3r = torch.tensor([[math.nan if v is None else v for v in row] for row in dump["logprobs"]],
                           dtype=torch.float64)
    except (TypeError, ValueError) as e:
        print(f"check_hf_export: {logprobs_path} holds no (positions, tokens) log-probabilities: {e}",
              file=sys.stderr)
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
    print(f"check_hf_export: {logp.shape[0]} positions x {logp.shape[1]} tokens, max |log-prob difference| "
          f"{worst:.3e} (tolerance {tolerance:g}) at position {pos}, token {tok}: "
          f"Hugging Face {float(logp[pos, tok]):.6f}, s3r {float(s3r[pos, tok]):.6f}")
    if not finite or not math.isfinite(worst) or not worst <= tolerance:
        print("MISMATCH" + ("" if finite else ": non-finite log-probabilities"))
        return 1
    print("check_hf_export: ok")
    return 0


def inapplicable(inject, m, prompt_len):
    """Why the reader's bug `inject` cannot change this export's numbers (it would pass), or None."""
    if inject not in BUGS:
        return None
    if m.type not in BUGS[inject][1]:
        return f"needs a {' or '.join(FAMILIES[t] for t in BUGS[inject][1])} export, not {FAMILIES[m.type]}"
    if inject == "gqa-kv-modulo" and m.NKV in (1, m.NH):
        return f"needs 1 < num_key_value_heads < num_attention_heads (here {m.NKV} and {m.NH})"
    if inject == "window-ignored" and not (SLIDING in m.kinds and prompt_len > m.window):
        return f"needs a sliding layer and a prompt longer than sliding_window {m.window} (here {prompt_len} tokens)"
    if inject == "local-rope-global-base" and not (SLIDING in m.kinds and m.theta[SLIDING] != m.theta[FULL]):
        return "needs a sliding layer whose RoPE base differs from rope_theta"
    if inject in ("moe-no-renorm", "moe-topk-last") and m.k == m.E:
        return f"needs num_experts_per_tok < num_experts (here {m.k} of {m.E}: every expert is chosen)"
    if inject == "moe-no-renorm" and not m.norm_topk:
        return "needs norm_topk_prob true"
    return None


def main():
    peer_env.ensure(2, malloc_tuning=False)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hf", required=True, help="folder written by s3r export --format hf")
    ap.add_argument("--logprobs", required=True, help="JSON of s3r generate --dump-logprobs")
    ap.add_argument("--tolerance", type=float, default=1e-4)
    ap.add_argument("--inject", choices=sorted(BUGS), metavar="BUG",
                    help="a deliberate bug in this reader (the check must then fail): " +
                         "; ".join(f"{k}: {v[0]}" for k, v in sorted(BUGS.items())).replace("%", "%%"))
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
        if cfg.get("architectures") != [FAMILIES.get(cfg.get("model_type"))]:
            raise ValueError(f"config.json is none of {', '.join(FAMILIES.values())}: {cfg.get('architectures')}, "
                             f"model_type {cfg.get('model_type')}")
        m = Model(cfg)
    except (OSError, ValueError, KeyError, TypeError, s3r_files.FormatError) as e:
        print(f"check_hf_export: cannot read the inputs: {e}", file=sys.stderr)
        return 2
    ids = torch.tensor(dump["prompt_ids"])
    refusal = inapplicable(args.inject, m, len(ids))
    if refusal:
        print(f"check_hf_export: --inject {args.inject} {refusal}", file=sys.stderr)
        return 2
    error = m.shape_error(w)  # a wrong shape is an export bug, not a traceback
    if error:
        print(f"MISMATCH: {error}")
        return 1
    if m.gemma:
        local = sum(k == SLIDING for k in m.kinds)
        print(f"check_hf_export: Gemma3ForCausalLM, {local} sliding layers of {m.L} (window {m.window}, RoPE base "
              f"{m.theta[SLIDING]:g}; full: {m.theta[FULL]:g}), prompt of {len(ids)} tokens")
    stats = {}
    logp = hf_logprobs(m, w, ids, args.inject, stats)
    if m.moe:
        margin = f"{stats['margin']:.2e}" if "margin" in stats else "none (k = E)"
        print(f"check_hf_export: Qwen3MoeForCausalLM, {m.L} sparse layers of {m.L}, {m.E} experts of width {m.F}, "
              f"{m.k} per token, norm_topk_prob {str(m.norm_topk).lower()}; smallest gap between the k-th and "
              f"(k+1)-th routing probability: {margin}")
    return compare(logp, dump, args.tolerance, args.logprobs)


if __name__ == "__main__":
    sys.exit(main())
