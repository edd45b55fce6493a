"""The PyTorch peer's decoder (plain PyTorch 1.13, CPU): llama_peer.py benchmarks it,
check_checkpoint.py loads it from an s3r checkpoint, train_peer.py and s3r_torch_bench.py train
it. Importing this module imports torch: import it after peer_env.ensure
(llama_peer.build_model_classes does).

The model (s3r/model/model.hpp, src/model/layers.cpp): token embedding; per block RMSNorm ->
Q, K, V (no bias) -> RoPE on adjacent pairs (elements 2i, 2i+1 of each head rotate by
pos * theta^(-2i/HD)) -> causal softmax attention -> output projection -> residual; RMSNorm ->
SwiGLU (silu(x W_gate) * (x W_up)) W_down -> residual; final RMSNorm; untied LM head; mean
cross-entropy. Grouped-query attention with kv_heads NKV < heads NH (`s3r train --kv-heads`):
W_k and W_v are (C, NKV * HD), RoPE rotates K per kv head, and query head h attends with kv head
h // (NH / NKV) (K and V heads repeat_interleave'd, as Hugging Face's repeat_kv). Weights are
stored (in, out) as s3r stores them: y = x W. Init as s3r: normal (0, 0.02), attn.o and ffn.down
scaled by 1/sqrt(2L), norm gains 1 (gemma3: 0, applied as 1 + w). AdamW as `s3r train`'s
defaults: betas (0.9, 0.95), eps 1e-8, weight decay 0.1 on the matrices (not on the embedding or
the norm gains), global gradient-norm clip 1.0.

Families (`--arch`, SPEC.md A.9): qwen3 adds QK-norm (RMSNorm over each head of q and k, before
RoPE); gemma3 is that block with RMSNorm gains 1 + w, post-norms (x + norm(att W_o), then
x_mid + norm(ffn(norm(x_mid)))), GeGLU (gelu(x W_gate, approximate="tanh") * (x W_up)) W_down,
embeddings times sqrt(C) (f32), the LM head tied to the embedding (logits = xn tok_emb^T), and
local layers ((l + 1) % 6 != 0) that attend through a sliding window W (query i to keys
i - W < j <= i) with RoPE base 1e4, the others causally with base 1e6. qwen3moe (SPEC.md A.10) is
the qwen3 block with its FFN replaced by a routed mixture of E SwiGLU experts of width F, k per
token, as Hugging Face's Qwen3MoeSparseMoeBlock computes it: router logits xn W_r (a linear, W_r
(C, E)), softmax (f32), topk, the k weights divided by their sum (norm_topk_prob), then per expert
the rows routed to it gathered (index_select), its SwiGLU, and the weighted results added back
(index_add_); the experts' matrices are stacked (E, C, F) and (E, F, C) as s3r stores them. Training
adds the Switch load-balancing loss per example, times 0.001, as `s3r train` and `s3r bench step` do
(E sum_e f_e P_e; f_e: the example's rows routed to e over S, P_e: the mean of p_e over its S
tokens; averaged over the examples).
"""
import math

import torch
import torch.nn.functional as F
from torch import nn

from peer_config import GEMMA3_LOCAL_THETA, TRAIN_DEFAULTS, is_local


def rope_cos_sin(theta, head_dim, seq_len):
    """cos, sin (S, HD/2) f32 of the angle pos * theta^(-2i/HD), computed in float64."""
    freq = theta ** (-2.0 * torch.arange(head_dim // 2, dtype=torch.float64) / head_dim)
    angle = torch.arange(seq_len, dtype=torch.float64)[:, None] * freq[None, :]
    return torch.cos(angle).float(), torch.sin(angle).float()


def weight(m):
    """A matrix: an (in, out) Parameter, or an nn.Linear module's (out, in) weight."""
    return m.weight if isinstance(m, nn.Module) else m


class RMSNorm(nn.Module):
    def __init__(self, width, eps, offset=False):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps
        self.offset = offset  # gemma3: the gain is 1 + w

    def forward(self, x):
        gain = 1.0 + self.weight if self.offset else self.weight
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * gain


class MoeFFN(nn.Module):
    """A routed mixture of SwiGLU experts (qwen3moe, SPEC.md A.10) as Hugging Face's
    Qwen3MoeSparseMoeBlock computes it, on stacked (in, out) expert matrices: router, softmax,
    topk, renormalized weights, and a loop over the experts that gathers each one's rows
    (index_select) and adds its weighted outputs back (index_add_). The router runs in f32
    also under bf16 autocast, as s3r's does in every mode. renorm=False (the weights are the
    probabilities, not divided by their sum) is a deliberate bug, for check_checkpoint.py
    --inject peer-moe-no-renorm only."""

    def __init__(self, C, Fw, E, k, renorm=True):
        super().__init__()
        if not 1 <= k <= E:
            raise ValueError(f"experts_used {k} not in [1, experts = {E}]")
        self.E, self.k, self.renorm = E, k, renorm
        self.router = nn.Parameter(torch.empty(C, E))
        self.gate = nn.Parameter(torch.empty(E, C, Fw))
        self.up = nn.Parameter(torch.empty(E, C, Fw))
        self.down = nn.Parameter(torch.empty(E, Fw, C))
        self.aux = None  # the last forward's load-balancing loss (with gradients enabled)

    def forward(self, x):
        B, S, C = x.shape
        E, k = self.E, self.k
        h = x.reshape(B * S, C)
        with torch.autocast("cpu", enabled=False):
            probs = torch.softmax(h.float() @ self.router, dim=-1)  # (T, E)
        w, idx = torch.topk(probs, k, dim=-1)  # (T, k): slot j holds the j-th most probable expert
        if self.renorm:
            w = w / w.sum(-1, keepdim=True)
        flat = idx.reshape(-1)  # row r = t k + j
        _, order = torch.sort(flat, stable=True)  # the rows grouped by expert
        counts = torch.bincount(flat, minlength=E)
        tokens, weights = order // k, w.reshape(-1)[order]
        out = torch.zeros_like(h)
        start = 0
        for e, n in enumerate(counts.tolist()):
            if n == 0:
                continue
            rows = tokens[start:start + n]
            xe = h.index_select(0, rows)
            ye = (F.silu(xe @ self.gate[e]) * (xe @ self.up[e])) @ self.down[e]
            out.index_add_(0, rows, (ye * weights[start:start + n, None]).to(out.dtype))
            start += n
        if torch.is_grad_enabled():  # Switch's load-balancing loss, per example (s3r/nn/moe.hpp)
            routed = torch.zeros(B, E, dtype=probs.dtype).scatter_add_(
                1, idx.reshape(B, S * k), torch.ones(B, S * k, dtype=probs.dtype))
            self.aux = E * ((routed / S) * probs.reshape(B, S, E).mean(1)).sum(-1).mean()
        return out.reshape(B, S, C)


class Block(nn.Module):
    def __init__(self, cfg, kv_map, layer, moe_renorm=True, modules=False):
        super().__init__()
        C, Fw = cfg["width"], cfg["ffn_width"]
        self.heads = cfg["heads"]
        self.kv_heads = cfg.get("kv_heads", self.heads)
        if self.kv_heads < 1 or self.heads % self.kv_heads != 0:
            raise ValueError(f"kv_heads {self.kv_heads} does not divide heads {self.heads}")
        # kv_map "modulo" (query head h reads kv head h % NKV) is a deliberate bug, for
        # check_checkpoint.py --inject peer-gqa-kv-modulo only.
        self.kv_map = kv_map
        self.hd = cfg.get("head_size", 0) or C // self.heads  # HD: explicit, or C / heads
        kv, qw = self.kv_heads * self.hd, self.heads * self.hd
        arch, eps = cfg.get("arch", "llama"), cfg["norm_eps"]
        gemma = arch == "gemma3"
        self.local = is_local(cfg, layer)  # attends through the sliding window (the model's mask)
        self.attn_norm = RMSNorm(C, eps, gemma)
        # Qwen3's and Gemma 3's QK-norm: RMSNorm over each head of q and k (gains of HD), before RoPE
        self.qk_norm = arch in ("qwen3", "gemma3", "qwen3moe")
        if self.qk_norm:
            self.q_norm = RMSNorm(self.hd, eps, gemma)
            self.k_norm = RMSNorm(self.hd, eps, gemma)
        self.post_norms, self.gelu = gemma, gemma  # Gemma 3: post-norms, GeGLU
        if self.post_norms:
            self.attn_post_norm = RMSNorm(C, eps, gemma)
            self.ffn_post_norm = RMSNorm(C, eps, gemma)
        self.ffn_norm = RMSNorm(C, eps, gemma)
        # (in, out) matrices, y = x W, as s3r stores them; W_q (C, NH * HD), W_k, W_v (C, NKV * HD).
        # modules=True: nn.Linear(in, out, bias=False) modules instead (weights (out, in)), for
        # s3r_torch.convert and its comparison with nn.Linear (s3r_torch_bench.py).
        mat = (lambda i, o: nn.Linear(i, o, bias=False)) if modules else (lambda i, o: nn.Parameter(torch.empty(i, o)))
        self.q = mat(C, qw)
        self.k = mat(C, kv)
        self.v = mat(C, kv)
        self.o = mat(qw, C)
        self.moe = None
        if arch == "qwen3moe":  # a mixture of experts in place of the FFN; Fw: one expert's width
            self.moe = MoeFFN(C, Fw, cfg["experts"], cfg["experts_used"], moe_renorm)
        else:
            self.gate = mat(C, Fw)
            self.up = mat(C, Fw)
            self.down = mat(Fw, C)

    @staticmethod
    def mm(x, w):
        """x W for an (in, out) matrix, or an nn.Linear module's x W^T."""
        return w(x) if isinstance(w, nn.Module) else x @ w

    def rope(self, x, cos, sin):
        # x (B, H, S, HD): pairs (2i, 2i+1) rotate by the angle of pair i
        a, b = x[..., 0::2], x[..., 1::2]
        return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)

    def attend(self, x, cos, sin, mask):
        B, S, C = x.shape
        H, KV, HD = self.heads, self.kv_heads, self.hd
        xn = self.attn_norm(x)
        q = self.mm(xn, self.q).view(B, S, H, HD).transpose(1, 2)
        k = self.mm(xn, self.k).view(B, S, KV, HD).transpose(1, 2)  # (B, NKV, S, HD)
        v = self.mm(xn, self.v).view(B, S, KV, HD).transpose(1, 2)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.rope(q, cos, sin), self.rope(k, cos, sin)  # K per kv head
        if KV != H:  # grouped-query attention: query head h reads kv head h // (H / KV)
            if self.kv_map == "modulo":
                k, v = k.repeat(1, H // KV, 1, 1), v.repeat(1, H // KV, 1, 1)
            else:
                k, v = k.repeat_interleave(H // KV, dim=1), v.repeat_interleave(H // KV, dim=1)
        scores = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(HD))
        p = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)
        return self.mm((p @ v).transpose(1, 2).reshape(B, S, H * HD), self.o)

    def forward(self, x, cos, sin, mask):
        a = self.attend(x, cos, sin, mask)
        x = x + (self.attn_post_norm(a) if self.post_norms else a)
        xn = self.ffn_norm(x)
        if self.moe is not None:
            f = self.moe(xn)
        else:
            g = self.mm(xn, self.gate)
            f = self.mm((F.gelu(g, approximate="tanh") if self.gelu else F.silu(g)) * self.mm(xn, self.up), self.down)
        return x + (self.ffn_post_norm(f) if self.post_norms else f)


class LlamaPeer(nn.Module):
    def __init__(self, cfg, kv_map="group", windows=True, moe_renorm=True, modules=False):
        """windows=False (local layers attending to every earlier key) and moe_renorm=False
        (MoeFFN's) are deliberate bugs, for check_checkpoint.py --inject peer-window-ignored and
        peer-moe-no-renorm only. modules=True: the projections and the LM head are nn.Linear
        modules (weights (out, in)), as most PyTorch models hold them."""
        super().__init__()
        self.cfg = cfg
        C, V, S, H = cfg["width"], cfg["vocab"], cfg["seq_len"], cfg["heads"]
        gemma = cfg.get("arch", "llama") == "gemma3"
        self.tok_emb = nn.Parameter(torch.empty(V, C))
        self.blocks = nn.ModuleList(Block(cfg, kv_map, l, moe_renorm, modules) for l in range(cfg["layers"]))
        self.final_norm = RMSNorm(C, cfg["norm_eps"], gemma)
        self.tied = gemma  # the LM head is tok_emb transposed
        self.embed_scale = float(torch.tensor(math.sqrt(C), dtype=torch.float32)) if gemma else None
        if not self.tied:
            self.lm_head = nn.Linear(C, V, bias=False) if modules else nn.Parameter(torch.empty(C, V))
        hd = cfg.get("head_size", 0) or C // H
        cos, sin = rope_cos_sin(cfg["rope_theta"], hd, S)
        self.register_buffer("cos", cos, persistent=False)  # (S, HD/2)
        self.register_buffer("sin", sin, persistent=False)
        causal = torch.triu(torch.ones(S, S, dtype=torch.bool), 1)
        self.register_buffer("mask", causal, persistent=False)
        if any(b.local for b in self.blocks):  # keys j <= i - W are masked too; RoPE base 1e4
            W = cfg["window"] if windows else S
            self.register_buffer("mask_local", causal | torch.tril(torch.ones(S, S, dtype=torch.bool), -W),
                                 persistent=False)
            cos, sin = rope_cos_sin(GEMMA3_LOCAL_THETA, hd, S)
            self.register_buffer("cos_local", cos, persistent=False)
            self.register_buffer("sin_local", sin, persistent=False)

    def init_weights(self, seed=0):
        g = torch.Generator().manual_seed(seed)
        residual = 1.0 / math.sqrt(2.0 * self.cfg["layers"])
        with torch.no_grad():
            for name, p in self.named_parameters():
                if "norm" in name:
                    p.fill_(0.0 if self.tied else 1.0)  # gemma3's gains are 1 + w
                else:
                    p.normal_(0.0, 0.02, generator=g)
                    if name.endswith((".o", ".down", ".o.weight", ".down.weight")):
                        p.mul_(residual)

    def forward(self, tokens, targets):
        S = tokens.shape[1]
        x = self.tok_emb[tokens]
        if self.embed_scale is not None:
            x = x * self.embed_scale
        for blk in self.blocks:
            if blk.local:
                x = blk(x, self.cos_local[:S], self.sin_local[:S], self.mask_local[:S, :S])
            else:
                x = blk(x, self.cos[:S], self.sin[:S], self.mask[:S, :S])
        logits = self.final_norm(x) @ self.tok_emb.t() if self.tied else Block.mm(self.final_norm(x), self.lm_head)
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))

    def aux_loss(self):
        """The mixture of experts' load-balancing losses of the last forward with gradients, summed
        over the blocks (the training objective adds TRAIN_DEFAULTS["moe_aux_loss"] times this);
        None without experts."""
        terms = [b.moe.aux for b in self.blocks if b.moe is not None and b.moe.aux is not None]
        return sum(terms) if terms else None

    def s3r_names(self):
        """{s3r checkpoint tensor name: parameter} (docs/FORMATS.md; a tied head has no tensor).
        The weight of an nn.Linear module (modules=True) is the transpose of s3r's tensor."""
        out = {"tok_emb": self.tok_emb, "final_norm": self.final_norm.weight}
        if not self.tied:
            out["lm_head"] = weight(self.lm_head)
        for l, b in enumerate(self.blocks):
            p = f"blocks.{l}."
            out.update({p + "attn_norm": b.attn_norm.weight, p + "ffn_norm": b.ffn_norm.weight,
                        p + "attn.q": weight(b.q), p + "attn.k": weight(b.k), p + "attn.v": weight(b.v),
                        p + "attn.o": weight(b.o)})
            if b.moe is not None:
                out.update({p + "ffn.router": b.moe.router, p + "ffn.experts.gate": b.moe.gate,
                            p + "ffn.experts.up": b.moe.up, p + "ffn.experts.down": b.moe.down})
            else:
                out.update({p + "ffn.gate": weight(b.gate), p + "ffn.up": weight(b.up), p + "ffn.down": weight(b.down)})
            if b.qk_norm:
                out.update({p + "attn.q_norm": b.q_norm.weight, p + "attn.k_norm": b.k_norm.weight})
            if b.post_norms:
                out.update({p + "attn_post_norm": b.attn_post_norm.weight,
                            p + "ffn_post_norm": b.ffn_post_norm.weight})
        return out

    def load_s3r(self, flat):
        """Weights from an s3r checkpoint's flat f32 tensors {name: numpy array}."""
        transposed = self.linear_weights()
        with torch.no_grad():
            for name, p in self.s3r_names().items():
                t = torch.from_numpy(flat[name].copy())
                p.copy_(t.view(p.shape[::-1]).t() if id(p) in transposed else t.view(p.shape))

    def linear_weights(self):
        """ids of the weights of nn.Linear modules (and of s3r_torch's Linear layers)."""
        return {id(m.weight) for m in self.modules() if isinstance(m, nn.Linear) or type(m).__name__ == "Linear"}

    def optimizer(self, lr=TRAIN_DEFAULTS["lr"], foreach=False):
        decay = [p for n, p in self.s3r_names().items() if "norm" not in n and n != "tok_emb"]
        no_decay = [p for n, p in self.s3r_names().items() if "norm" in n or n == "tok_emb"]
        return torch.optim.AdamW([{"params": decay, "weight_decay": TRAIN_DEFAULTS["weight_decay"]},
                                  {"params": no_decay, "weight_decay": 0.0}],
                                 lr=lr, betas=TRAIN_DEFAULTS["betas"], eps=TRAIN_DEFAULTS["eps"],
                                 foreach=foreach)
