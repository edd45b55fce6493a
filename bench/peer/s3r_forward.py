"""The decoder's forward pass with s3r's numerics, written in PyTorch from SPEC.md section 1 and
the operations s3r documents (src/model/layers.cpp, src/nn/quant_linear.cpp,
src/kernels/ref/numerics.hpp), for an independent check of a checkpoint's validation loss.

Every element-wise step repeats s3r's f32 operations in the same order (s3r builds with
-ffp-contract=off, so there is no fused multiply-add to mimic), and every long sum that s3r
accumulates in double is accumulated in double here. What cannot be repeated bit for bit is the
summation order of s3r's float matrix products (oneDNN's f32 and bf16 kernels); those products
are computed here in float64 from the same f32 (or bf16-rounded) operands and rounded to f32
once, i.e. closer to the exact value than s3r's f32 accumulation. The int8 products are integer
sums, exact in float64, so the int8 projections are bit-identical given bit-identical inputs.

Modes (the checkpoint's `mode`): f32 (every product f32); bf16 (the seven projections per block
and the LM head on bf16-rounded operands, RTNE, f32 accumulation); rtne, sr, s3r, s3r-bcast (their
forward is one and the same: per-token x per-output-channel absmax int8, round to nearest even,
LM head bf16, or int8 when meta.json says "lm_head": "int8"). Attention products are f32 in
every mode. Cross-entropy uses s3r's polynomial exp (before the fused kernels, libm's exp in
double: a difference of about 1e-7 of the loss, far inside the check's tolerances).

Grouped-query attention (meta.json's config "kv_heads" NKV < heads NH; absent: NKV = NH): Wk and
Wv are (C, NKV * HD) with HD = C / NH, RoPE rotates K per kv head, and query head h attends with
kv head h // (NH / NKV) (Hugging Face's repeat_kv: consecutive query heads share a kv head),
written here with torch's repeat_interleave of the K and V heads.

Families (meta.json config "arch"; absent: llama; SPEC.md A.9, the traits table FAMILIES below):
qwen3 adds QK-norm (an RMSNorm over each head's HD elements of q and k, before RoPE); gemma3 is
the qwen3 block with every RMSNorm's gain 1 + w (an f32 add, then the product), post-norms
(x_mid = x + norm(att Wo), out = x_mid + norm(ffn(norm(x_mid)))), GeGLU (GELU's tanh form as s3r
computes it: z * sigmoid_poly(2u) on z clamped to [-10, 10]), embeddings times f32(sqrt(C)), the
LM head tied to the embedding (tok_emb transposed; no lm_head tensor), and local layers
((l + 1) % 6 != 0, when config "window" W > 0) whose query i attends keys i - W < j <= i with
RoPE base 1e4 (the other, global layers: causal, config rope_theta). qwen3moe (SPEC.md A.10) is
the qwen3 block with its FFN replaced by a routed mixture of E SwiGLU experts (config "experts" E,
"experts_used" k, "ffn_width" F one expert's width; tensors ffn.router (C, E), ffn.experts.gate
and ffn.experts.up (E, C, F), ffn.experts.down (E, F, C)): router logits z = xn Wr (an f32
product in every mode), p = softmax(z) with the max and the row sum in double (libm exp in double,
rounded to f32 once), the k largest p in slot order (ties: the lower expert), weights
p_j / (p_1 + ... + p_k) (the sum and the division in f32), each chosen expert's SwiGLU of the
token's row in the checkpoint's mode (int8: the row's own absmax scale, as the gathered row has in
s3r, and per-output-channel scales of that expert's matrices), and Y = w_1 y_1 + w_2 y_2 + ...
added in f32 in slot order.
"""
import math

import torch

F32 = torch.float32
F64 = torch.float64
INT8_MODES = ("rtne", "sr", "s3r", "s3r-bcast")

# Deliberate bugs, to show that the check's tolerances catch them (check_checkpoint.py --inject).
BUGS = {
    "rope-half-split": "RoPE rotates element i with i + HD/2 (the GPT-NeoX layout) instead of adjacent pairs 2i, 2i+1",
    "norm-eps": "RMSNorm eps 1e-6 instead of the checkpoint's 1e-5 (1e-5 instead of 1e-6 for qwen3, gemma3 and "
                "qwen3moe)",
    "no-causal-mask": "attention may look at later tokens",
    "silu-exact": "SiLU with torch.sigmoid instead of s3r's polynomial exp (a 1-ulp-level change, not a bug: "
                  "shows the resolution of the check)",
    "int8-scale-128": "int8 scales absmax / 128 instead of absmax / 127 (int8 modes)",
    "head-f32": "LM head in f32 instead of bf16 (int8 and bf16 modes)",
    "round-half-away": "int8 codes rounded half away from zero instead of half to even (int8 modes)",
    "gqa-kv-modulo": "grouped-query attention: query head h uses kv head h % NKV instead of h // (NH / NKV) "
                     "(GQA checkpoints only)",
    "qk-norm-skipped": "q and k enter RoPE without their per-head RMSNorm (qwen3, gemma3 and qwen3moe checkpoints)",
    "gemma-norm-offset-skipped": "every RMSNorm multiplies by w instead of 1 + w (gemma3 checkpoints)",
    "window-ignored": "local layers attend to every earlier key, not only the window's (gemma3 checkpoints)",
    "local-rope-global-base": "local layers rotate with the global RoPE base (1e6) instead of 1e4 (gemma3 checkpoints)",
    "embed-scale-skipped": "embeddings not multiplied by sqrt(C) (gemma3 checkpoints)",
    "gelu-exact": "GeGLU's GELU as torch's gelu(approximate='tanh') instead of s3r's sigmoid form (a change at "
                  "the level of f32 rounding, not a bug: shows the resolution of the check; gemma3 checkpoints)",
    "moe-no-renorm": "mixture of experts: the weights are the chosen experts' probabilities p_j, not divided by their "
                     "sum (Qwen3-MoE's norm_topk_prob off; qwen3moe checkpoints)",
    "moe-topk-last": "mixture of experts: each token goes to its k least probable experts instead of the k most "
                     "probable ones (a sort in the wrong direction; qwen3moe checkpoints)",
    "moe-router-quantized": "mixture of experts: the router computed like the projections (int8 or bf16) instead of "
                            "in f32 (int8 and bf16 qwen3moe checkpoints)",
    "moe-experts-out-in": "mixture of experts: the experts' matrices read as (out, in) (Hugging Face's layout: gate "
                          "and up (E, F, C), down (E, C, F)) and transposed, instead of s3r's (in, out) "
                          "(qwen3moe checkpoints)",
}
# The bugs that only a family's own parts can show (check_checkpoint.py refuses them elsewhere).
FAMILY_BUGS = {"qk-norm-skipped": ("qwen3", "gemma3", "qwen3moe"), "gemma-norm-offset-skipped": ("gemma3",),
               "window-ignored": ("gemma3",), "local-rope-global-base": ("gemma3",),
               "embed-scale-skipped": ("gemma3",), "gelu-exact": ("gemma3",), "moe-no-renorm": ("qwen3moe",),
               "moe-topk-last": ("qwen3moe",), "moe-router-quantized": ("qwen3moe",),
               "moe-experts-out-in": ("qwen3moe",)}

# The families' traits (s3r/model/config.hpp, src/model/config.cpp; SPEC.md A.9). norm_offset:
# gains 1 + w; local_period P: layers l with (l + 1) % P != 0 are local (sliding window, RoPE base
# rope_theta_local) when config "window" > 0; moe: the FFN is a routed mixture of experts (A.10).
FAMILIES = {
    "llama": {"qk_norm": False, "norm_offset": False, "post_norms": False, "gelu": False, "embed_scale": False,
              "tied_head": False, "local_period": 0, "rope_theta_local": None, "moe": False},
    "qwen3": {"qk_norm": True, "norm_offset": False, "post_norms": False, "gelu": False, "embed_scale": False,
              "tied_head": False, "local_period": 0, "rope_theta_local": None, "moe": False},
    "gemma3": {"qk_norm": True, "norm_offset": True, "post_norms": True, "gelu": True, "embed_scale": True,
               "tied_head": True, "local_period": 6, "rope_theta_local": 10000.0, "moe": False},
    "qwen3moe": {"qk_norm": True, "norm_offset": False, "post_norms": False, "gelu": False, "embed_scale": False,
                 "tied_head": False, "local_period": 0, "rope_theta_local": None, "moe": True},
}


def head_dim(cfg):
    """The checkpoint's head size HD: meta.json config "head_size", written only when it is
    explicit (absent: C / heads)."""
    hd = cfg.get("head_size", 0) or cfg["width"] // cfg["heads"]
    if not isinstance(hd, int) or isinstance(hd, bool) or hd < 1 or hd % 2:
        raise ValueError(f"config head_size {cfg.get('head_size')!r}: not an even head size")
    return hd


def family(cfg):
    """The traits of the checkpoint's family (meta.json config "arch"; absent: llama)."""
    arch = cfg.get("arch", "llama")
    if arch not in FAMILIES:
        raise ValueError(f"config arch {arch!r}: not a family this reader knows ({', '.join(FAMILIES)})")
    return FAMILIES[arch]


def experts(cfg):
    """(E, k) of a mixture-of-experts checkpoint (config "experts", "experts_used"; the family must
    have one), or None for a dense FFN (then neither may be given)."""
    moe = family(cfg)["moe"]
    e, k = cfg.get("experts", 0), cfg.get("experts_used", 0)
    for name, v in (("experts", e), ("experts_used", k)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise ValueError(f"config {name} {v!r}: not a count")
    if not moe:
        if e or k:
            raise ValueError(f"config experts {e}, experts_used {k}: the {cfg.get('arch', 'llama')} family has no "
                             "mixture of experts")
        return None
    if e < 1 or not 1 <= k <= e:
        raise ValueError(f"config experts {e}, experts_used {k}: a mixture of experts needs 1 <= k <= E")
    return e, k


def qk_norm(cfg):
    """Whether the checkpoint's family normalizes each head of q and k (qwen3, gemma3, qwen3moe)."""
    return family(cfg)["qk_norm"]


def window(cfg):
    """The sliding window W of the family's local layers (config "window"; absent or 0: none)."""
    w = cfg.get("window", 0)
    if not isinstance(w, int) or isinstance(w, bool) or w < 0:
        raise ValueError(f"config window {w!r}: not a window size")
    if w and not family(cfg)["local_period"]:
        raise ValueError(f"config window {w}: the {cfg.get('arch', 'llama')} family has no local layers")
    return w


def is_local(cfg, layer):
    """Whether layer `layer` is local: (l + 1) % P != 0 for the family's period P, with a window."""
    period = family(cfg)["local_period"]
    return window(cfg) > 0 and period > 0 and (layer + 1) % period != 0


def layer_theta(cfg, layer, bug=None):
    """The layer's RoPE base as the double that s3r's f32 option becomes (local layers: the
    family's own base; the others: config rope_theta)."""
    local = is_local(cfg, layer) and bug != "local-rope-global-base"
    theta = family(cfg)["rope_theta_local"] if local else cfg.get("rope_theta", 10000.0)
    return float(torch.tensor(theta, dtype=F32))


def rope_tables_for(cfg, seq_len, bug=None):
    """{theta: (cos, sin)} for every RoPE base that the model's layers use."""
    thetas = {layer_theta(cfg, l, bug) for l in range(cfg["layers"])}
    return {t: rope_tables(seq_len, head_dim(cfg), t) for t in sorted(thetas)}


def kv_heads(cfg):
    """The checkpoint's key/value heads: meta.json config "kv_heads", written only when it differs
    from "heads" (absent: multi-head attention, kv_heads = heads)."""
    nh = cfg["heads"]
    nkv = cfg.get("kv_heads", nh)
    if not isinstance(nkv, int) or isinstance(nkv, bool) or nkv < 1 or nh % nkv != 0:
        raise ValueError(f"kv_heads {nkv!r} does not divide heads {nh}")
    return nkv


def _f32(x):
    return torch.tensor(x, dtype=F32)


def exp_poly(x):
    """s3r's f32 exp (src/kernels/ref/numerics.hpp exp_poly): Cephes' method, same operations
    in the same order, f32 throughout; 2^n applied exactly (in f64, then one exact rounding)."""
    x = torch.clamp(x, -87.0, 88.0)
    n = torch.floor(x * _f32(1.44269504088896341) + _f32(0.5))
    r = x - n * _f32(0.693359375)
    r = r - n * _f32(-2.12194440e-4)
    p = torch.full_like(x, 1.9875691500e-4)
    for c in (1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1):
        p = p * r + _f32(c)
    p = p * (r * r) + r + _f32(1.0)
    return (p.to(F64) * torch.exp2(n.to(F64))).to(F32)


def sigmoid_poly(z):
    return _f32(1.0) / (_f32(1.0) + exp_poly(-z))


def rmsnorm(x, weight, eps):
    """(x * r) * w in f32 with r = f32(1 / sqrt(sum_c x^2 / C + eps)), the sum in double."""
    ss = (x.to(F64) ** 2).sum(-1, keepdim=True)
    r = (1.0 / torch.sqrt(ss / x.shape[-1] + eps)).to(F32)
    return (x * r) * weight


def rope_tables(seq_len, head_dim, theta):
    """cos and sin (S, HD/2) f32 of angle pos * theta^(-2i/HD), evaluated in double by libm."""
    cos = torch.empty(seq_len, head_dim // 2, dtype=F32)
    sin = torch.empty(seq_len, head_dim // 2, dtype=F32)
    for i in range(head_dim // 2):
        freq = math.pow(float(theta), -2.0 * i / head_dim)
        for pos in range(seq_len):
            a = 1.0 * pos * freq
            cos[pos, i] = math.cos(a)
            sin[pos, i] = math.sin(a)
    return cos, sin


def rope(x, cos, sin, heads, bug=None):
    """x (B, S, heads * HD) (Q with the query heads, K with the kv heads): in each head, elements
    2i and 2i+1 rotate by the angle of pair i."""
    B, S, C = x.shape
    hd = C // heads
    xh = x.reshape(B, S, heads, hd)
    if bug == "rope-half-split":
        a, b = xh[..., : hd // 2], xh[..., hd // 2:]
    else:
        a, b = xh[..., 0::2], xh[..., 1::2]
    c = cos[None, :, None, :]
    s = sin[None, :, None, :]
    ra = a * c - b * s
    rb = a * s + b * c
    if bug == "rope-half-split":
        out = torch.cat([ra, rb], dim=-1)
    else:
        out = torch.stack([ra, rb], dim=-1).reshape(B, S, heads, hd)
    return out.reshape(B, S, C)


def attention(q, k, v, heads, kv_heads=None, bug=None, window=0):
    """Causal softmax attention as s3r's unfused attention_forward computed it: scores in f32
    (products here in f64, rounded once), scaled in f32, max-subtracted, exp in f32 (libm expf;
    here exp in double rounded to f32), the row sum in double, probabilities times f32(1 / sum).
    s3r's fused attention (src/model/attention.cpp) computes the same function in
    another order (an online softmax over key blocks with its polynomial exp); like the order of
    the float products, that is below the check's tolerances (measured: f32 9e-10, s3r + dx
    3e-7 on tiny runs).
    q (B, S, heads * HD); k, v (B, S, kv_heads * HD): query head h reads kv head
    h // (heads / kv_heads) (each kv head repeated for its group of consecutive query heads).
    window W > 0 (a local layer): query i attends keys i - W < j <= i only; the keys it leaves
    out get probability 0, as s3r's fused attention gives them (exactly +0)."""
    B, S, C = q.shape
    nkv = heads if kv_heads is None else kv_heads
    hd = C // heads
    group = heads // nkv
    qh = q.reshape(B, S, heads, hd).transpose(1, 2).to(F64)
    kh = k.reshape(B, S, nkv, hd).transpose(1, 2).to(F64)  # (B, NKV, S, HD)
    vh = v.reshape(B, S, nkv, hd).transpose(1, 2).to(F64)
    if bug == "gqa-kv-modulo":  # kv heads 0..NKV-1, 0..NKV-1, ...: query head h reads h % NKV
        kh, vh = kh.repeat(1, group, 1, 1), vh.repeat(1, group, 1, 1)
    else:  # kv heads 0,0,..,1,1,..: query head h reads h // group
        kh, vh = kh.repeat_interleave(group, dim=1), vh.repeat_interleave(group, dim=1)
    scale = _f32(1.0 / math.sqrt(hd))
    scores = (qh @ kh.transpose(-1, -2)).to(F32) * scale
    if bug != "no-causal-mask":
        future = torch.triu(torch.ones(S, S, dtype=torch.bool), diagonal=1)
        if window > 0:  # and the keys j <= i - W, before the window
            future |= torch.tril(torch.ones(S, S, dtype=torch.bool), diagonal=-window)
        scores = scores.masked_fill(future, -math.inf)
    mx = scores.amax(-1, keepdim=True)
    e = torch.exp((scores - mx).to(F64)).to(F32)
    total = e.to(F64).sum(-1, keepdim=True)
    p = e * (1.0 / total).to(F32)
    out = (p.to(F64) @ vh).to(F32)
    return out.transpose(1, 2).reshape(B, S, C)


def gelu_tanh_poly(z):
    """GELU's tanh form as s3r computes it (kernels/ref/numerics.hpp gelu_gate, gelu_clamp):
    z * sigmoid_poly((c k) (1 + 0.044715 c^2)) with c = z clamped to [-10, 10], k = 2 sqrt(2/pi)
    in f32, the same f32 operations in the same order."""
    c = torch.clamp(z, -10.0, 10.0)
    return z * sigmoid_poly((c * _f32(1.5957691216057308)) * (_f32(1.0) + _f32(0.044715) * (c * c)))


def _bf16(x):
    return x.to(torch.bfloat16).to(F64)  # RTNE, like s3r::to_bf16 (finite values)


def quantize(x, dim, bug=None):
    """Absmax int8 codes along `dim` (the reduced axis): scale = absmax / 127 in f32 (1 where it
    is 0), codes = clamp(rne(x / scale), -127, 127) with the division in f32 (SPEC section 1)."""
    absmax = x.abs().amax(dim=dim, keepdim=True)
    scale = absmax / _f32(128.0 if bug == "int8-scale-128" else 127.0)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    v = x / scale
    if bug == "round-half-away":
        codes = torch.sign(v) * torch.floor(v.abs() + 0.5)
    else:
        codes = torch.round(v)  # round half to even
    return torch.clamp(codes, -127, 127), scale


def linear(x, w, mode, bug=None):
    """y = x W for x (T, K) f32, W (K, N) f32 in the given mode; returns f32 (T, N)."""
    if mode == "f32":
        return (x.to(F64) @ w.to(F64)).to(F32)
    if mode == "bf16":
        return (_bf16(x) @ _bf16(w)).to(F32)
    xq, sx = quantize(x, 1, bug)  # (T, K), (T, 1): per token
    wq, sw = quantize(w, 0, bug)  # (K, N), (1, N): per output channel
    acc = (xq.to(F64) @ wq.to(F64)).to(F32)  # exact integer sums, converted to f32 as s3r does
    return (acc * sw) * sx  # (float(acc) * sw[n]) * sx[t], s3r's epilogue order


def tensor_shapes(cfg):
    """{name: shape} of the checkpoint's tensors: Wq (C, heads * HD), Wo its transpose's shape,
    Wk and Wv (C, kv_heads * HD); QK-norm gains (HD,), post-norm gains (C,); lm_head (C, V)
    unless the family ties it to the embedding; a mixture of experts (qwen3moe) has ffn.router (C, E),
    ffn.experts.gate and ffn.experts.up (E, C, F), ffn.experts.down (E, F, C) in place of ffn.gate,
    ffn.up, ffn.down."""
    C, F, V = cfg["width"], cfg["ffn_width"], cfg["vocab"]
    hd = head_dim(cfg)
    Q, KV = cfg["heads"] * hd, kv_heads(cfg) * hd
    fam = family(cfg)
    moe = experts(cfg)
    shapes = {"tok_emb": (V, C), "final_norm": (C,)}
    if not fam["tied_head"]:
        shapes["lm_head"] = (C, V)
    for l in range(cfg["layers"]):
        p = f"blocks.{l}."
        shapes.update({p + "attn_norm": (C,), p + "ffn_norm": (C,), p + "attn.q": (C, Q), p + "attn.k": (C, KV),
                       p + "attn.v": (C, KV), p + "attn.o": (Q, C)})
        if moe:
            E = moe[0]
            shapes.update({p + "ffn.router": (C, E), p + "ffn.experts.gate": (E, C, F),
                           p + "ffn.experts.up": (E, C, F), p + "ffn.experts.down": (E, F, C)})
        else:
            shapes.update({p + "ffn.gate": (C, F), p + "ffn.up": (C, F), p + "ffn.down": (F, C)})
        if fam["qk_norm"]:
            shapes.update({p + "attn.q_norm": (hd,), p + "attn.k_norm": (hd,)})
        if fam["post_norms"]:
            shapes.update({p + "attn_post_norm": (C,), p + "ffn_post_norm": (C,)})
    return shapes


def unflatten(tensors, cfg):
    """{name: f32 torch tensor of its shape} from a checkpoint's tensors: stored with their shapes
    (version 3; matrices (in, out)) or flat (versions 1 and 2). A tied head (gemma3) is given as
    "lm_head": the embedding transposed, a view of "tok_emb" (a change to one is in both)."""
    shapes = tensor_shapes(cfg)
    missing = sorted(set(shapes) - set(tensors))
    extra = sorted(set(tensors) - set(shapes))
    if missing or extra:
        raise ValueError(f"checkpoint tensors do not match the config: missing {missing}, unexpected {extra}")
    out = {}
    for name, shape in shapes.items():
        flat = torch.from_numpy(tensors[name].copy())
        if flat.numel() != math.prod(shape):
            raise ValueError(f"tensor '{name}' has {flat.numel()} values, expected {shape}")
        if flat.dim() != 1 and tuple(flat.shape) != shape:
            raise ValueError(f"tensor '{name}' has shape {tuple(flat.shape)}, expected {shape} (in, out)")
        out[name] = flat.reshape(shape)
    if family(cfg)["tied_head"]:
        out["lm_head"] = out["tok_emb"].t()
    return out


class _Numerics:
    """What one forward needs besides the weights: the checkpoint's config, its products' modes,
    its norm eps, its RoPE tables and the injected bug."""

    def __init__(self, cfg, mode, seq_len, bug, tables):
        self.cfg, self.bug, self.fam = cfg, bug, family(cfg)
        eps = cfg.get("norm_eps", 1e-5)
        if bug == "norm-eps":  # the other of the two eps the families use
            eps = 1e-6 if abs(eps - 1e-5) < 1e-9 else 1e-5
        self.eps = float(torch.tensor(eps, dtype=F32))  # an f32 option, promoted to double
        self.tables = tables if tables is not None else rope_tables_for(cfg, seq_len, bug)
        self.proj = mode if mode in ("f32", "bf16") else "int8"
        if mode == "f32" or bug == "head-f32":
            self.head_mode = "f32"
        elif mode in INT8_MODES and cfg.get("lm_head", "default") == "int8":
            self.head_mode = "int8"  # `s3r train --head int8`: the head as an eighth int8 projection
        else:
            self.head_mode = "bf16"

    def norm(self, x, w):
        """RMSNorm with the family's gain: w, or 1 + w (gemma3: an f32 add, then the product)."""
        if self.fam["norm_offset"] and self.bug != "gemma-norm-offset-skipped":
            w = _f32(1.0) + w
        return rmsnorm(x, w, self.eps)

    def linear(self, x, w):
        return linear(x, w, self.proj, self.bug)


def _attention_block(params, num, l, x, B, S):
    """x_mid = x + att Wo (post-norms: x + norm(att Wo)) of block l, x (T, C)."""
    cfg, bug, p = num.cfg, num.bug, f"blocks.{l}."
    heads, nkv, hd = cfg["heads"], kv_heads(cfg), head_dim(cfg)
    Q, KV = heads * hd, nkv * hd
    xn = num.norm(x, params[p + "attn_norm"])
    q = num.linear(xn, params[p + "attn.q"]).reshape(B, S, Q)
    k = num.linear(xn, params[p + "attn.k"]).reshape(B, S, KV)
    v = num.linear(xn, params[p + "attn.v"]).reshape(B, S, KV)
    if num.fam["qk_norm"] and bug != "qk-norm-skipped":  # RMSNorm over each head's HD elements, before RoPE
        q = num.norm(q.reshape(B, S, heads, hd), params[p + "attn.q_norm"]).reshape(B, S, Q)
        k = num.norm(k.reshape(B, S, nkv, hd), params[p + "attn.k_norm"]).reshape(B, S, KV)
    cos, sin = num.tables[layer_theta(cfg, l, bug)]
    q = rope(q, cos, sin, heads, bug)
    k = rope(k, cos, sin, nkv, bug)  # per kv head
    local = is_local(cfg, l) and bug != "window-ignored"
    att = attention(q, k, v, heads, nkv, bug, window(cfg) if local else 0).reshape(B * S, Q)
    o = num.linear(att, params[p + "attn.o"])
    if num.fam["post_norms"]:
        o = num.norm(o, params[p + "attn_post_norm"])
    return o + x


def _gated_ffn(num, h, gate, up, down):
    """(act(h Wgate) * (h Wup)) Wdown, act SiLU (SwiGLU) or the family's GELU (GeGLU), h (T, C);
    each product in the checkpoint's mode (int8: h's rows quantized per row, the matrices per
    output channel)."""
    bug = num.bug
    h1 = num.linear(h, gate)
    h3 = num.linear(h, up)
    if num.fam["gelu"]:
        act = torch.nn.functional.gelu(h1, approximate="tanh") if bug == "gelu-exact" else gelu_tanh_poly(h1)
    else:
        act = h1 * (torch.sigmoid(h1) if bug == "silu-exact" else sigmoid_poly(h1))
    return num.linear(act * h3, down)


def route(logits, k, bug=None):
    """The routing of SPEC.md A.10 from the router's f32 logits (T, E): probabilities p (T, E) f32
    (max and row sum in double, the sum over the experts in index order as s3r adds it, each
    exp(z - max) / sum rounded once), the chosen experts (T, k) in slot order (the j-th largest p;
    ties: the lower expert, as a scan with a strict > finds it) and their weights (T, k) f32:
    p_j / (p_1 + ... + p_k), the sum in f32 in slot order."""
    z = logits.to(F64)
    E = z.shape[1]
    ex = torch.exp(z - z.amax(-1, keepdim=True))
    total = torch.zeros(z.shape[0], dtype=F64)
    for e in range(E):
        total = total + ex[:, e]
    p = (ex / total[:, None]).to(F32)
    # k passes of argmax (torch.argmax returns the first, i.e. lowest, index of the maximum) over
    # the experts not yet chosen; the bug takes the minima instead.
    left = p.clone()
    chosen = []
    for _ in range(k):
        if bug == "moe-topk-last":
            e = left.argmin(-1)
            left.scatter_(1, e[:, None], math.inf)
        else:
            e = left.argmax(-1)
            left.scatter_(1, e[:, None], -1.0)  # below every probability
        chosen.append(e)
    chosen = torch.stack(chosen, 1)  # (T, k)
    pk = p.gather(1, chosen)
    ksum = pk[:, 0].clone()
    for j in range(1, k):
        ksum = ksum + pk[:, j]
    weights = pk if bug == "moe-no-renorm" else pk / ksum[:, None]
    return p, chosen, weights


def _moe_ffn(params, num, l, xn):
    """The mixture of experts of block l (SPEC.md A.10) on xn (T, C): router logits xn Wr (f32),
    route(), each expert's SwiGLU over the rows routed to it (in increasing row order t k + j, as
    s3r's stable sort groups them; int8 quantizes each row by its own absmax, so a row's result does
    not depend on its group), and Y[t] = w_1 y_1 + w_2 y_2 + ... in f32, in slot order."""
    p, bug, cfg = f"blocks.{l}.ffn.", num.bug, num.cfg
    E, k = experts(cfg)
    T, C = xn.shape
    F = cfg["ffn_width"]
    router_mode = num.proj if bug == "moe-router-quantized" else "f32"
    _, chosen, weights = route(linear(xn, params[p + "router"], router_mode, bug), k, bug)
    gate, up, down = params[p + "experts.gate"], params[p + "experts.up"], params[p + "experts.down"]
    if bug == "moe-experts-out-in":  # stored (E, in, out), read as (E, out, in) and transposed
        gate = gate.reshape(E, F, C).transpose(1, 2)
        up = up.reshape(E, F, C).transpose(1, 2)
        down = down.reshape(E, C, F).transpose(1, 2)
    rows = chosen.reshape(-1)  # row r = t k + j
    ys = torch.zeros(T * k, C, dtype=F32)
    for e in range(E):
        r = torch.nonzero(rows == e).squeeze(1)  # increasing r
        if r.numel():
            ys[r] = _gated_ffn(num, xn[r // k], gate[e], up[e], down[e])
    ys = ys.reshape(T, k, C)
    out = weights[:, 0:1] * ys[:, 0]
    for j in range(1, k):
        out = out + weights[:, j:j + 1] * ys[:, j]
    return out


def _ffn_block(params, num, l, x_mid):
    """x_mid + ffn(norm(x_mid)) (post-norms: x_mid + norm(ffn(...))) of block l; ffn is SwiGLU or
    GeGLU: (act(h Wgate) * (h Wup)) Wdown, or a mixture of SwiGLU experts (qwen3moe)."""
    p = f"blocks.{l}."
    xn2 = num.norm(x_mid, params[p + "ffn_norm"])
    if num.fam["moe"]:
        f = _moe_ffn(params, num, l, xn2)
    else:
        f = _gated_ffn(num, xn2, params[p + "ffn.gate"], params[p + "ffn.up"], params[p + "ffn.down"])
    if num.fam["post_norms"]:
        f = num.norm(f, params[p + "ffn_post_norm"])
    return f + x_mid


def mean_loss(params, cfg, mode, inputs, targets, bug=None, tables=None):
    """Mean cross-entropy (float) of one batch: inputs, targets (B, S) int64 tensors. tables:
    rope_tables_for(cfg, S, bug), computed here when None."""
    B, S = inputs.shape
    num = _Numerics(cfg, mode, S, bug, tables)
    x = params["tok_emb"][inputs.reshape(-1)]  # (T, C)
    if num.fam["embed_scale"] and bug != "embed-scale-skipped":
        x = x * _f32(math.sqrt(cfg["width"]))  # sqrt(C) rounded once to f32, an f32 product
    for l in range(cfg["layers"]):
        x = _ffn_block(params, num, l, _attention_block(params, num, l, x, B, S))
    xn = num.norm(x, params["final_norm"])
    logits = linear(xn, params["lm_head"], num.head_mode, bug)  # (T, V) f32
    # Cross-entropy as s3r's softmax_xent_rows: max in f32, exp_poly(z - max) in f32, the sum of
    # the exponentials in double, loss = (log(sum) + max) - z[y] in double.
    mx = logits.amax(-1, keepdim=True)
    total = exp_poly(logits - mx).to(F64).sum(-1)
    zy = logits.gather(1, targets.reshape(-1, 1)).squeeze(1)
    token_loss = (torch.log(total) + mx.squeeze(-1).to(F64)) - zy.to(F64)
    return float(token_loss.sum()) / (B * S)
