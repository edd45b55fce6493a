#!/usr/bin/python3
"""Trains the PyTorch peer decoder (peer_model.py, its projections as nn.Linear modules) as
`s3r train` trains s3r's: the same token shard, the same batches (s3r's DataLoader order, from
the seed), the same learning-rate schedule, AdamW settings and clipping. The projections run in
plain PyTorch f32 (--recipe torch-f32) or through s3r's layers (s3r_torch.convert with the
recipe; the LM head then in the recipe's head mode, bf16 or f32, as s3r's); one metrics line per
step, like s3r's metrics.jsonl ({"step", "loss", "lr", "ms"}).

    PYTHONPATH=build/release/python /usr/bin/python3 bench/peer/train_peer.py \\
        --data data/nlp-corpus --preset small --recipe s3r+dx --steps 100 --out torch-s3r-dx.jsonl

The initialization is the peer's (normal 0.02 from torch's generator seeded with --seed), not
s3r's, so the two runs start from different weights of the same distribution.
"""
import argparse
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_peer  # noqa: E402
import peer_env  # noqa: E402


def lr_at(step, peak, final, warmup, total):
    """s3r's LrSchedule::at (src/optim/adamw.cpp): linear warm-up, then a cosine to `final`."""
    if step < warmup:
        return peak * (step + 1) / warmup
    if step >= total:
        return final
    progress = (step - warmup) / (total - warmup)
    return final + (peak - final) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build(args):
    import torch

    cfg = llama_peer.preset_config(args.preset)
    if args.vocab:
        cfg["vocab"] = args.vocab
    model = llama_peer.build_model_classes()(cfg, modules=True)
    model.init_weights(args.seed)
    if args.recipe != "torch-f32":
        import s3r_torch

        s3r_torch.convert(model, recipe=args.recipe, seed=args.seed)
        head = "f32" if args.recipe == "f32" else "bf16"  # s3r's LM head (SPEC A.9): bf16, f32 in f32
        s3r_torch.convert(model, recipe=head, skip=[], seed=args.seed)
    opt = model.optimizer(lr=args.lr)
    if args.recipe != "torch-f32":
        s3r_torch.set_step(0)
        s3r_torch.advance_on(opt)  # each optimizer step begins the next threshold step
    return torch, cfg, model, opt


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, help="an s3r dataset folder (train.bin, info.json)")
    ap.add_argument("--preset", choices=sorted(llama_peer.PRESETS), default="tiny")
    ap.add_argument("--vocab", type=int, help="the model's vocabulary (default: the preset's; `s3r train --vocab`)")
    ap.add_argument("--recipe", default="s3r+dx", help="an s3r_torch recipe, or torch-f32 (nn.Linear, no s3r)")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--schedule-steps", type=int, help="the cosine's length (default --steps)")
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--lr", type=float, default=llama_peer.TRAIN_DEFAULTS["lr"])
    ap.add_argument("--min-lr", type=float, default=3e-4)
    ap.add_argument("--seed", type=int, default=0, help="initialization, batch order and threshold keys")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--out", required=True, help="metrics, one JSON line per step")
    args = ap.parse_args()
    if args.steps < 1 or args.warmup < 0 or args.threads < 1 or not 0 <= args.seed < 2 ** 32:
        ap.error("--steps and --threads must be >= 1, --warmup >= 0, --seed in [0, 2^32)")
    total = args.schedule_steps or args.steps
    if not os.path.isfile(os.path.join(args.data, "train.bin")):
        ap.error(f"--data {args.data}: no train.bin there (s3r data prepare writes it)")
    peer_env.ensure(args.threads)
    import s3r_files
    import threefry

    torch, cfg, model, opt = build(args)
    torch.set_num_threads(args.threads)
    tokens, vocab = s3r_files.read_shard(os.path.join(args.data, "train.bin"))
    if vocab > cfg["vocab"]:
        ap.error(f"the shard's vocabulary is {vocab}, the model's {cfg['vocab']}: pass --vocab {vocab}")
    B, S = cfg["batch"], cfg["seq_len"]
    batches = threefry.loader_batches(tokens, S, args.seed, B, args.steps)
    data = torch.from_numpy(tokens)
    params = list(model.parameters())
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        for step, starts in enumerate(batches):
            t0 = time.perf_counter()
            windows = torch.stack([data[s:s + S + 1] for s in starts])
            lr = lr_at(step, args.lr, args.min_lr, args.warmup, total)
            for group in opt.param_groups:
                group["lr"] = lr
            loss = model(windows[:, :-1], windows[:, 1:])
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, llama_peer.TRAIN_DEFAULTS["clip"])
            opt.step()
            ms = (time.perf_counter() - t0) * 1e3
            f.write(json.dumps({"step": step, "loss": float(loss), "lr": lr, "ms": ms}) + "\n")
            if step % 10 == 0 or step == args.steps - 1:
                print(f"train_peer: step {step + 1}/{args.steps} loss {float(loss):.4f} lr {lr:.2e} {ms:.0f} ms",
                      flush=True)
            if not math.isfinite(float(loss)):
                raise SystemExit(f"train_peer: non-finite loss at step {step}")
    os.replace(tmp, args.out)


if __name__ == "__main__":
    main()
