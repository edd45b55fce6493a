#!/usr/bin/python3
"""The PyTorch peer of s3r's decoder: the same model in plain PyTorch (1.13, CPU), for
side-by-side training-step speed (`bench`) and, loaded from an s3r checkpoint, as a second
opinion on its loss (check_checkpoint.py).

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

Usage:
  /usr/bin/python3 bench/peer/llama_peer.py bench --preset small [--arch qwen3|gemma3|qwen3moe] [--kv-heads N] \\
      --mode f32|bf16 --threads 2 --warmup 2 --repeats 5 [--json OUT]
  /usr/bin/python3 bench/peer/llama_peer.py info [--threads 2]
"""
import argparse
import json
import math
import os
import re
import statistics
import sys
import time

import peer_env

# name: (layers L, width C, heads, ffn F, vocab V, seq_len S, batch B) - src/model/config.cpp
PRESETS = {
    "tiny": (2, 64, 4, 192, 256, 32, 4),
    "small": (6, 256, 4, 768, 4096, 256, 16),
    "wide": (4, 1024, 8, 4096, 4096, 256, 8),
}
# `s3r train` defaults (tools/train.cpp, include/s3r/optim/adamw.hpp; moe_aux_loss: --moe-aux-loss,
# tools/commands.hpp, also the model's default in `s3r bench step`)
TRAIN_DEFAULTS = {"lr": 3e-3, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1, "clip": 1.0,
                  "rope_theta": 10000.0, "norm_eps": 1e-5, "moe_aux_loss": 0.001}
ARCHS = ("llama", "qwen3", "gemma3", "qwen3moe")
# qwen3moe's presets (src/model/config.cpp): E experts per preset (8 at tiny and wide, 32 at small
# and paper), k = 2 per token, one expert's width 3 C / 8 (Qwen3-30B-A3B's 768 of C 2048).
MOE_EXPERTS = {"tiny": 8, "small": 32, "wide": 8, "paper": 32}
MOE_EXPERTS_USED = 2
# Gemma 3's local layers: (l + 1) % GEMMA3_PERIOD != 0, with RoPE base GEMMA3_LOCAL_THETA.
GEMMA3_PERIOD, GEMMA3_LOCAL_THETA = 6, 10000.0


def preset_config(name, kv_heads=None, arch="llama"):
    """A preset's model of family `arch` (`s3r train --arch`, src/model/config.cpp): llama; qwen3
    with QK-norm, half as many kv heads as heads, a head size of 2 C / heads, RoPE base 1e6, eps
    1e-6; gemma3 with half as many kv heads, the head size C / heads, base 1e6 (local layers 1e4),
    eps 1e-6 and the window S / 2; qwen3moe as qwen3 with a mixture of experts: E experts
    (MOE_EXPERTS), k = 2 per token, ffn_width (one expert's) 3 C / 8. kv_heads (None: the
    family's) as `s3r train --kv-heads`, which must divide the heads."""
    L, C, H, F, V, S, B = PRESETS[name]
    if arch not in ARCHS:
        raise ValueError(f"--arch {arch}: expected one of {', '.join(ARCHS)}")
    if kv_heads is not None and (kv_heads < 1 or H % kv_heads != 0):
        raise ValueError(f"--kv-heads {kv_heads} does not divide the {H} heads of preset {name}")
    plain = arch == "llama"
    cfg = {"layers": L, "width": C, "heads": H, "kv_heads": kv_heads or (H if plain else H // 2), "ffn_width": F,
           "vocab": V, "seq_len": S, "batch": B, "rope_theta": TRAIN_DEFAULTS["rope_theta"] if plain else 1e6,
           "norm_eps": TRAIN_DEFAULTS["norm_eps"] if plain else 1e-6}
    if arch in ("qwen3", "qwen3moe"):
        cfg.update(arch=arch, head_size=2 * C // H)
    if arch == "qwen3moe":
        cfg.update(ffn_width=C * 3 // 8, experts=MOE_EXPERTS[name], experts_used=MOE_EXPERTS_USED)
    if arch == "gemma3":
        cfg.update(arch="gemma3", window=S // 2)
    return cfg


def is_local(cfg, layer):
    """Whether layer `layer` of the model attends through the sliding window (gemma3's local layers)."""
    return cfg.get("arch") == "gemma3" and cfg.get("window", 0) > 0 and (layer + 1) % GEMMA3_PERIOD != 0


def rope_cos_sin(theta, head_dim, seq_len):
    """cos, sin (S, HD/2) f32 of the angle pos * theta^(-2i/HD), computed in float64."""
    import torch

    freq = theta ** (-2.0 * torch.arange(head_dim // 2, dtype=torch.float64) / head_dim)
    angle = torch.arange(seq_len, dtype=torch.float64)[:, None] * freq[None, :]
    return torch.cos(angle).float(), torch.sin(angle).float()


def build_model_classes():
    """The nn.Module classes (defined after torch is imported, i.e. after peer_env.ensure)."""
    import torch
    import torch.nn.functional as F
    from torch import nn

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

    return LlamaPeer


def peak_rss_bytes():
    """VmHWM of this process (peak resident set), in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def environment_info(threads, notes, want_onednn=False):
    import torch

    kind, libs = peer_env.blas_summary()
    info = {"torch": torch.__version__, "threads": torch.get_num_threads(), "blas": kind, "blas_libraries": libs,
            "env_notes": notes, "cpu": peer_env.cpu_model(), "isa": peer_env.isa_tiers(),
            "native_bf16": peer_env.native_bf16(), "python": sys.version.split()[0],
            "malloc": {k: os.environ[k] for k in ("MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")
                       if k in os.environ}}
    config = torch.__config__.show()
    summary = [line.strip(" -") for line in config.splitlines()
               if any(k in line for k in ("MKL-DNN", "oneDNN", "OpenMP", "CPU capability"))]
    summary += [m.group(0) for m in re.finditer(r"BLAS_INFO=\w+", config)]
    info["torch_build"] = "; ".join(summary)
    if want_onednn:
        isa, impl = peer_env.onednn_isa()
        info["onednn_isa"], info["onednn_bf16_matmul"] = isa, impl
    return info


def bench(args, notes):
    import torch

    torch.set_num_threads(args.threads)
    cfg = preset_config(args.preset, args.kv_heads, args.arch)
    LlamaPeer = build_model_classes()
    if args.mode == "bf16" and not peer_env.native_bf16() and not args.allow_emulated_bf16:
        raise SystemExit("llama_peer: this CPU has no native bf16 (avx512_bf16 or amx_bf16); "
                         "bf16 autocast would be emulated (pass --allow-emulated-bf16 to run it anyway)")
    model = LlamaPeer(cfg)
    model.init_weights(0)
    opt = model.optimizer(foreach=args.foreach)
    g = torch.Generator().manual_seed(7)
    B, S, V = cfg["batch"], cfg["seq_len"], cfg["vocab"]
    data = torch.randint(0, V, (B, S + 1), generator=g)  # a fixed random batch
    tokens, targets = data[:, :-1].contiguous(), data[:, 1:].contiguous()
    params = list(model.parameters())

    def objective():
        """The cross-entropy, and the training objective: plus the experts' load-balancing loss
        times `s3r train`'s --moe-aux-loss default (qwen3moe)."""
        loss = model(tokens, targets)
        aux = model.aux_loss()
        return loss, loss if aux is None else loss + TRAIN_DEFAULTS["moe_aux_loss"] * aux

    def step():
        t0 = time.perf_counter()
        if args.mode == "bf16":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss, total = objective()
        else:
            loss, total = objective()
        total.backward()
        torch.nn.utils.clip_grad_norm_(params, TRAIN_DEFAULTS["clip"])
        opt.step()
        opt.zero_grad(set_to_none=args.grads_to_none)
        return (time.perf_counter() - t0) * 1e3, float(loss)

    info = environment_info(args.threads, notes, want_onednn=args.mode == "bf16")
    print(f"llama_peer bench: preset {args.preset} ({' '.join(f'{k}={v}' for k, v in cfg.items())}), "
          f"mode {args.mode}, {B * S} tokens per step")
    print(f"  torch {info['torch']}, {info['threads']} threads, BLAS: {info['blas']}")
    if "onednn_isa" in info:
        print(f"  oneDNN bf16 matmul: {info['onednn_bf16_matmul']} ({info['onednn_isa']})")
    for n in notes:
        print(f"  env: {n}")
    if info["blas"].startswith("REFERENCE"):
        print(f"WARNING: torch's f32 products run on the reference BLAS: {info['blas']}", file=sys.stderr)
    print(f"  cpu: {info['cpu']} ({info['isa']})")
    sys.stdout.flush()
    losses = []
    for _ in range(args.warmup):
        _, l = step()
        losses.append(l)
    ms = []
    for i in range(args.repeats):
        t, l = step()
        ms.append(t)
        losses.append(l)
        print(f"  step {i + 1}/{args.repeats}: {t:.1f} ms (loss {l:.4f})")
        sys.stdout.flush()
    med = statistics.median(ms)
    tps = B * S / (med / 1e3)
    rss = peak_rss_bytes()
    print(f"  median {med:.1f} ms, min {min(ms):.1f} ms, {tps:.0f} tokens/s, peak RSS {rss / 1e6:.1f} MB")
    if not all(math.isfinite(l) for l in losses):
        raise SystemExit("llama_peer: a non-finite loss")
    result = {"preset": args.preset, "config": cfg, "mode": args.mode, "tokens_per_step": B * S,
              "warmup": args.warmup, "repeats": args.repeats, "ms": ms, "median_ms": med, "min_ms": min(ms),
              "tokens_per_s": tps, "peak_rss_bytes": rss, "losses": losses, "zero_grad_set_to_none":
              args.grads_to_none, "adamw_foreach": args.foreach, **info}
    if args.json:
        tmp = args.json + ".tmp"
        with open(tmp, "w") as f:
            json.dump(result, f, indent=1)
        os.replace(tmp, args.json)
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("bench", help="time full training steps on a fixed random batch")
    b.add_argument("--preset", choices=sorted(PRESETS), default="small")
    b.add_argument("--arch", choices=ARCHS, default="llama", help="model family, as `s3r train --arch`")
    b.add_argument("--kv-heads", type=int, help="key/value heads, as `s3r train --kv-heads` (must divide the preset's "
                   "heads; default: the heads, i.e. multi-head attention)")
    b.add_argument("--mode", choices=("f32", "bf16"), default="f32",
                   help="f32, or bf16 autocast (CPU with native bf16 only)")
    b.add_argument("--threads", type=int, default=os.cpu_count())
    b.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3: steps 2 and 3 are slow)")
    b.add_argument("--repeats", type=int, default=5)
    b.add_argument("--json", help="write the results as JSON")
    b.add_argument("--grads-to-none", action="store_true",
                   help="zero_grad(set_to_none=True): new gradient tensors every step (default: zero them in place)")
    b.add_argument("--foreach", action="store_true", help="AdamW(foreach=True): multi-tensor updates")
    b.add_argument("--no-malloc-tuning", action="store_true",
                   help="leave glibc malloc's defaults (large tensors mapped afresh every step)")
    b.add_argument("--allow-emulated-bf16", action="store_true")
    i = sub.add_parser("info", help="print the environment the peer runs in (BLAS, threads, oneDNN ISA)")
    i.add_argument("--threads", type=int, default=os.cpu_count())
    i.add_argument("--no-malloc-tuning", action="store_true")
    args = ap.parse_args()
    if args.threads < 1:
        ap.error("--threads must be >= 1")
    if args.cmd == "bench" and (args.repeats < 1 or args.warmup < 0):
        ap.error("--repeats must be >= 1 and --warmup >= 0")
    if args.cmd == "bench":
        try:
            preset_config(args.preset, args.kv_heads, args.arch)
        except ValueError as e:
            ap.error(str(e))
    notes = peer_env.ensure(args.threads, malloc_tuning=not args.no_malloc_tuning)
    if args.cmd == "bench":
        bench(args, notes)
    else:
        import torch

        torch.set_num_threads(args.threads)
        print(json.dumps(environment_info(args.threads, notes, want_onednn=True), indent=1))


if __name__ == "__main__":
    main()
