#!/usr/bin/python3
"""s3r's layers inside PyTorch against PyTorch's own: the peer decoder (peer_model.py) with its
projections as nn.Linear modules, one training step (forward, backward, clipping, AdamW) timed in
three configurations in the same process, with the same threads, in interleaved rounds:
  torch-f32   nn.Linear, f32
  torch-bf16  nn.Linear under torch.autocast("cpu", bfloat16) (needs native bf16, as llama_peer)
  s3r+dx      s3r_torch.convert(model, recipe) for the seven projections of every block, the LM
              head through s3r's bf16 layer (bf16, as s3r's recipe keeps it, where nn.Linear
              would run it in f32); the rest of the model (attention, norms, loss) plain
              PyTorch f32
  s3r+dx-autocast  convert(model, recipe) as a user writes it, under bf16 autocast: the LM
              head stays nn.Linear (convert skips it), so it and the rest of the model run in
              PyTorch's bf16 (not in the default list)
Peak memory: each configuration again alone in a child process (a few steps), its peak resident
set (VmHWM).

    PYTHONPATH=build/release/python /usr/bin/python3 bench/peer/s3r_torch_bench.py --preset wide \\
        --rounds 3 --repeats 2 --warmup 2 [--json OUT]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_peer  # noqa: E402
import peer_env  # noqa: E402

CONFIGS = ("torch-f32", "torch-bf16", "s3r+dx", "s3r+dx-autocast")
DEFAULT_CONFIGS = CONFIGS[:3]


def make_step(config, preset, recipe, threads):
    """A function running one training step of a fresh model in `config`; returns its ms."""
    import torch

    cfg = llama_peer.preset_config(preset)
    model = llama_peer.build_model_classes()(cfg, modules=True)
    model.init_weights(0)
    converted = config.startswith("s3r+dx")
    if converted:
        import s3r_torch

        s3r_torch.convert(model, recipe=recipe)
        if config == "s3r+dx":  # the LM head in bf16 without autocast: s3r's bf16 layer
            s3r_torch.convert(model, recipe="bf16", skip=[])
    opt = model.optimizer()
    if converted:
        s3r_torch.advance_on(opt)
    g = torch.Generator().manual_seed(7)
    B, S, V = cfg["batch"], cfg["seq_len"], cfg["vocab"]
    data = torch.randint(0, V, (B, S + 1), generator=g)
    tokens, targets = data[:, :-1].contiguous(), data[:, 1:].contiguous()
    params = list(model.parameters())

    def step():
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=config in ("torch-bf16", "s3r+dx-autocast")):
            loss = model(tokens, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, llama_peer.TRAIN_DEFAULTS["clip"])
        opt.step()
        opt.zero_grad(set_to_none=False)
        if not torch.isfinite(loss):
            raise SystemExit(f"s3r_torch_bench: {config}: a non-finite loss")
        return (time.perf_counter() - t0) * 1e3

    return step, B * S


def memory_child(args):
    """--memory-of CONFIG: run its steps alone, print its peak resident set in bytes."""
    import torch

    torch.set_num_threads(args.threads)
    step, _ = make_step(args.memory_of, args.preset, args.recipe, args.threads)
    for _ in range(3):
        step()
    print(json.dumps({"peak_rss_bytes": llama_peer.peak_rss_bytes()}))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", choices=("tiny", "small", "wide"), default="small")
    ap.add_argument("--recipe", default="s3r+dx", help="the s3r_torch recipe of the converted decoder")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (each config's steps once per round)")
    ap.add_argument("--repeats", type=int, default=2, help="timed steps per config and round")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps per config first")
    ap.add_argument("--configs", default=",".join(DEFAULT_CONFIGS), help=f"a comma list of {', '.join(CONFIGS)}")
    ap.add_argument("--cap", choices=("avx2", "avx512", "avx512_bf16"),
                    help="both sides as a lesser CPU (side_by_side.py's caps: S3R_MAX_ISA, oneDNN, ATen, OpenBLAS)")
    ap.add_argument("--allow-emulated-bf16", action="store_true", help="time torch-bf16 without native bf16")
    ap.add_argument("--no-memory", action="store_true", help="skip the peak-memory child processes")
    ap.add_argument("--json", help="write the results as JSON")
    ap.add_argument("--memory-of", choices=CONFIGS, help=argparse.SUPPRESS)
    args = ap.parse_args()
    configs = [c for c in args.configs.split(",") if c]
    if any(c not in CONFIGS for c in configs) or not configs:
        ap.error(f"--configs: expected a comma list of {', '.join(CONFIGS)}, got {args.configs!r}")
    if args.threads < 1 or args.rounds < 1 or args.repeats < 1 or args.warmup < 0:
        ap.error("--threads, --rounds and --repeats must be >= 1, --warmup >= 0")
    if args.cap:  # before torch and s3r_torch load (they read these when loaded)
        import side_by_side

        cap_env, cap_modes, _ = side_by_side.CAPS[args.cap]
        os.environ.update(cap_env)
    notes = peer_env.ensure(args.threads)  # may run this script again, with the environment set
    if args.memory_of:
        return memory_child(args)
    if args.cap and "bf16" not in cap_modes and "torch-bf16" in configs:
        configs.remove("torch-bf16")
        print(f"s3r_torch_bench: --cap {args.cap} has no native bf16: torch-bf16 left out")
    if "torch-bf16" in configs and not peer_env.native_bf16() and not args.allow_emulated_bf16:
        configs.remove("torch-bf16")
        print("s3r_torch_bench: no native bf16 on this CPU: torch-bf16 left out (--allow-emulated-bf16 times it)")
    import torch

    torch.set_num_threads(args.threads)
    print(f"s3r_torch_bench: preset {args.preset}, {args.threads} threads, cap {args.cap or 'none'}, torch {torch.__version__}, "
          f"cpu {peer_env.cpu_model()} ({peer_env.isa_tiers()}); env: {'; '.join(notes) or 'as is'}", flush=True)
    steps, tokens = {}, 0
    for c in configs:
        steps[c], tokens = make_step(c, args.preset, args.recipe, args.threads)
        for _ in range(args.warmup):
            steps[c]()
    ms = {c: [] for c in configs}
    for r in range(args.rounds):
        for c in configs:
            ms[c] += [steps[c]() for _ in range(args.repeats)]
        print(f"  round {r + 1}/{args.rounds}: " + ", ".join(f"{c} {statistics.median(ms[c][-args.repeats:]):.0f} ms"
                                                             for c in configs), flush=True)
    peak = {}
    if not args.no_memory:
        for c in configs:
            out = subprocess.run([sys.executable, os.path.abspath(__file__), "--memory-of", c, "--preset", args.preset,
                                  "--recipe", args.recipe, "--threads", str(args.threads)] +
                                 (["--cap", args.cap] if args.cap else []),
                                 check=True, capture_output=True, text=True).stdout
            peak[c] = json.loads(out.strip().splitlines()[-1])["peak_rss_bytes"]
    med = {c: statistics.median(v) for c, v in ms.items()}
    torch_best = min((c for c in configs if c.startswith("torch")), key=lambda c: med[c], default=None)
    print(f"  {'config':<11} {'median ms':>10} {'min ms':>8} {'tokens/s':>9} {'peak MB':>8}  vs fastest torch")
    for c in configs:
        ratio = f"{med[torch_best] / med[c]:.2f}x" if torch_best else "-"
        mb = f"{peak[c] / 1e6:.0f}" if c in peak else "-"
        print(f"  {c:<11} {med[c]:>10.1f} {min(ms[c]):>8.1f} {tokens / (med[c] / 1e3):>9.0f} {mb:>8}  {ratio}")
    if args.json:
        result = {"preset": args.preset, "recipe": args.recipe, "cap": args.cap, "threads": args.threads, "tokens_per_step": tokens,
                  "cpu": peer_env.cpu_model(), "isa": peer_env.isa_tiers(), "torch": torch.__version__,
                  "ms": ms, "median_ms": med, "peak_rss_bytes": peak, "fastest_torch": torch_best}
        with open(args.json + ".tmp", "w") as f:
            json.dump(result, f, indent=1)
        os.replace(args.json + ".tmp", args.json)


if __name__ == "__main__":
    main()
