"""The PyTorch peer's model configurations and `s3r train`'s defaults, without torch (the
scripts read them before peer_env.ensure sets the environment torch loads in)."""

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
