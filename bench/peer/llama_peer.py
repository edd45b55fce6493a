#!/usr/bin/python3
"""The PyTorch peer of s3r's decoder: the same model in plain PyTorch (1.13, CPU), for
side-by-side training-step speed (`bench`) and, loaded from an s3r checkpoint, as a second
opinion on its loss (check_checkpoint.py).

The model itself (its layers, families, initialization and optimizer) is in peer_model.py;
the presets and `s3r train`'s defaults in peer_config.py.

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
# TRAIN_DEFAULTS: the other scripts read it here
from peer_config import ARCHS, PRESETS, TRAIN_DEFAULTS, preset_config  # noqa: F401


def build_model_classes():
    """The peer decoder's class, peer_model.LlamaPeer: imported here, after peer_env.ensure has set
    the environment torch loads in."""
    import peer_model

    return peer_model.LlamaPeer


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
