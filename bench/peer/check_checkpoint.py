#!/usr/bin/python3
"""Independent check of an s3r run's numbers: recomputes the final validation loss of a run
folder's checkpoint in PyTorch and compares it with the val_loss that `s3r train` logged.

  /usr/bin/python3 bench/peer/check_checkpoint.py --run DIR --data DATA_DIR [--eval-batches N]

- weights: DIR/checkpoint/model.safetensors (F32, matrices (in, out); shaped from version 3, flat
  before; a gemma3 checkpoint's LM head is its embedding transposed, with no tensor; a qwen3moe
  checkpoint's FFN is ffn.router (C, E) and the stacked experts ffn.experts.gate, ffn.experts.up
  (E, C, F) and ffn.experts.down (E, F, C), with config "experts" E and "experts_used" k), config from
  DIR/checkpoint/meta.json (grouped-query attention: config "kv_heads" < "heads", Wk and Wv
  (C, kv_heads * HD); absent: kv_heads = heads); read by bench/peer/s3r_files.py from docs/FORMATS.md alone;
- data: the windows of DATA_DIR/val.bin that s3r's `evaluate` reads (a fresh
  DataLoader(val, S, 0x5eed): Fisher-Yates on Threefry words, bench/peer/threefry.py), N batches
  of B windows (N = `s3r train --eval-batches`, default 8);
- forward: bench/peer/s3r_forward.py, s3r's numerics for the checkpoint's mode;
- also the benchmark's peer model (peer_model.py, plain PyTorch f32 ops) on the same weights and
  windows (for an f32 checkpoint it must agree too: the peer that `bench` times is this model).

Tolerances (relative difference of the mean validation loss) and what limits them; measured
(tests/peer/checkpoint_check.sh; `small` runs of 60 and 600 steps on data/nlp-corpus):
- f32 (1e-6): s3r's f32 products (oneDNN) sum in another order than the float64 sums here; the
  rest repeats s3r's operations. Measured: 4e-10 (tiny), 7e-10 (small).
- bf16 and int8 modes (1e-5): the int8 projections are bit-identical given identical inputs, but
  their inputs pass through the f32 attention products (in bf16 mode, through every product),
  whose last-bit differences flip a few int8 codes or bf16 roundings downstream (one code step is
  1/127 of the row's scale, one bf16 step 2^-8 relative). The flips, not the sums themselves,
  limit the agreement: computing attention with f32 instead of f64 sums here moves a `small`
  batch's loss by 1.3-1.6e-6 relative, while the same change in the LM head moves it by 4e-10.
  Measured: bf16 5e-8 (tiny, small); s3r + dx 1e-8 (tiny), 1.6e-6 (small, 600 steps) and 4.1e-6
  (the same run trained as on an AVX2-only CPU, S3R_MAX_ISA=avx2). Deeper or wider models flip
  more codes; pass --rtol for them.
- an int8 LM head (`s3r train --head int8`; 3e-5): a flipped code of a token's input moves all
  V logits of that token. Measured: 3.1e-6 (tiny rtne), where single batches move by 2e-6 when
  the attention sums here change from f64 to f32.
- the plain-PyTorch peer on an f32 checkpoint (1e-5): torch's sigmoid and exp (SLEEF, 1 ulp)
  and OpenBLAS's summation order instead of s3r's. Measured: 1.5e-8 (tiny), 6e-9 (small).
The tolerances catch plausible bugs (`--inject`, tests/peer), measured on tiny runs: RoPE on
half-split pairs instead of adjacent ones (1.7-2.1e-4), RMSNorm eps 1e-6 instead of 1e-5
(2.0-2.5e-4), one weight changed by 0.01 (7e-5), the attention matrices read transposed (6e-2),
no causal mask (2-3e-3), the windows in file order (3e-4 to 1e-3); on a grouped-query checkpoint
(tiny, 4 heads, 2 kv heads), query head h reading kv head h % NKV instead of h // (NH / NKV)
(1.3e-2). Int8 scales of absmax/128 (2-7e-5) and an f32 LM head in an int8 or bf16 run
(2-3e-5) are caught with less margin; rounding int8 ties away from zero (8e-7) and SiLU with
torch.sigmoid instead of s3r's polynomial exp (3e-9) are below the resolution of a loss
comparison.
Grouped-query checkpoints take the same tolerances; measured (tiny, 4 heads, 2 kv heads): f32
2.6e-9 (the plain-PyTorch peer 1.0e-8), s3r + dx 7.7e-7. So do the families (meta.json config
"arch"): qwen3 (tiny) f32 8.8e-10, s3r + dx 3.2e-10; gemma3 (tiny with 6 layers, five of them
local with a window of 16) f32 2.1e-9 (the peer 2.5e-8), s3r + dx 8.7e-8. Gemma 3's bugs are
caught by 10^3 or more: gains w instead of 1 + w (0.67), local layers without their window
(3.6e-3), or with the global RoPE base (4.2e-3), embeddings without sqrt(C) (3.4e-3); GELU as
torch's gelu(approximate="tanh") instead of s3r's sigmoid form moves the loss by 7e-11, below
the resolution. qwen3moe (tiny: 8 experts of width 24, 2 per token): f32 2.3e-9 (the peer
9.5e-9), s3r + dx 5.5e-7, bf16 3.4e-7. The s3r + dx difference is one int8 code: layer 0's
attention output of one token sits 1 ulp from a rounding tie (-102.49999), s3r's fused attention
rounds it the other way, and in a model this small that moves the batch's loss by 1.3e-5 (the
other 7 batches agree to about 1e-9; flipping that code here reproduces s3r's loss of the window to
3e-9 relative). Its bugs: weights p_j not divided by the sum of the k chosen (1.2e-2 f32 and
s3r + dx), the k least probable experts (2.8e-2, 3.0e-2), the experts' matrices read as (out, in)
(2.4e-2, 2.5e-2), the peer without the renormalization (1.2e-2); the router computed in the
projections' precision instead of f32 moves s3r + dx by only 2.6e-5 (bf16 1.2e-5), too close to
the tolerance to rely on. A bug that cannot change the checkpoint's loss is refused (exit status 2).

Exit status: 0 when every comparison is within its tolerance, 1 on a mismatch (the numbers and
the relative difference are printed), 2 on unusable inputs.
"""
import argparse
import math
import os
import sys
import time

import peer_env


# The bugs of the plain-PyTorch peer model alone (the s3r-numerics forward runs without them).
PEER_BUGS = ("peer-norm-eps", "peer-gqa-kv-modulo", "peer-window-ignored", "peer-moe-no-renorm")


def inapplicable(inject, cfg, nkv, s3r_forward):
    """Why the bug `inject` cannot show on this checkpoint (a bug that changes nothing here would
    pass the check, so it is refused), or None."""
    arch, mode = cfg.get("arch", "llama"), cfg["mode"]
    if inject in PEER_BUGS and mode != "f32":
        return f"needs an f32 checkpoint (the peer is compared on f32 only), not {mode}"
    if inject in ("gqa-kv-modulo", "peer-gqa-kv-modulo") and nkv in (1, cfg["heads"]):
        return (f"needs a grouped-query checkpoint with 1 < kv_heads < heads (here {nkv} kv heads, {cfg['heads']} "
                "heads: h % NKV = h // (NH / NKV))")
    if inject in s3r_forward.FAMILY_BUGS and arch not in s3r_forward.FAMILY_BUGS[inject]:
        return f"needs a checkpoint of the {' or '.join(s3r_forward.FAMILY_BUGS[inject])} family, not {arch}"
    if inject == "peer-moe-no-renorm" and not s3r_forward.family(cfg)["moe"]:
        return f"needs a checkpoint of the qwen3moe family, not {arch}"
    if inject == "moe-router-quantized" and mode == "f32":
        return "needs an int8 or bf16 checkpoint (in f32 the projections and the router are both f32)"
    local = any(s3r_forward.is_local(cfg, l) for l in range(cfg["layers"]))
    if inject in ("window-ignored", "local-rope-global-base", "peer-window-ignored") and not local:
        return "needs a checkpoint with local layers (a window, and layers l with (l + 1) % 6 != 0)"
    return None


def peer_loss(cfg, theta, nkv, inject, flat, batches):
    """The benchmark's peer model (peer_model.py, plain f32 PyTorch) on the checkpoint's weights:
    its mean loss over `batches` [(inputs, targets)], with the peer's own bug if `inject` is one."""
    import torch

    import llama_peer

    norm_eps = float(torch.tensor(cfg.get("norm_eps", 1e-5), dtype=torch.float32))
    if inject == "peer-norm-eps":  # the other of the families' two eps
        norm_eps = 1e-6 if abs(norm_eps - 1e-5) < 1e-9 else 1e-5
    model = llama_peer.build_model_classes()(dict(cfg, rope_theta=theta, norm_eps=norm_eps, kv_heads=nkv),
                                             kv_map="modulo" if inject == "peer-gqa-kv-modulo" else "group",
                                             windows=inject != "peer-window-ignored",
                                             moe_renorm=inject != "peer-moe-no-renorm")
    model.load_s3r(flat)
    with torch.no_grad():
        return sum(float(model(*b)) for b in batches) / len(batches)


def inject_weight_bug(inject, flat, params, cfg, nkv, frequent):
    """perturb-weight: lm_head[0, frequent] += 0.01 in both the checkpoint's tensors (for the peer;
    returned as a new dict) and params; transpose-attn: params' square attention matrices read
    transposed."""
    if inject == "perturb-weight":
        flat = dict(flat)
        if "lm_head" in flat:
            flat["lm_head"] = flat["lm_head"].copy()
            flat["lm_head"].reshape(-1)[frequent] += 0.01  # row 0 of the (C, V) matrix (stored shaped or flat)
        else:  # a tied head: lm_head[0, t] is tok_emb[t, 0] (params' lm_head is a view of it)
            flat["tok_emb"] = flat["tok_emb"].copy()
            flat["tok_emb"].reshape(-1)[frequent * cfg["width"]] += 0.01
        params["lm_head"][0, frequent] += 0.01
    if inject == "transpose-attn":
        for l in range(cfg["layers"]):
            for m in ("q", "k", "v", "o") if nkv == cfg["heads"] else ("q", "o"):  # the square ones
                name = f"blocks.{l}.attn.{m}"
                params[name] = params[name].t().contiguous()
    return flat


def describe(cfg, nkv, int8_head, s3r_forward):
    """The checkpoint's mode and model in one line (the header of the check's output)."""
    mode, window, moe = cfg["mode"], s3r_forward.window(cfg), s3r_forward.experts(cfg)
    return (f"mode {mode}"
            f"{' + ' + cfg.get('correction', 'none') if mode in s3r_forward.INT8_MODES else ''}"
            f"{', int8 LM head' if int8_head else ''}, "
            f"{cfg['arch'] + ' ' if cfg.get('arch', 'llama') != 'llama' else ''}"
            f"L={cfg['layers']} C={cfg['width']} heads={cfg['heads']}"
            f"{f' kv_heads={nkv}' if nkv != cfg['heads'] else ''}"
            f"{f' hd={s3r_forward.head_dim(cfg)}' if cfg.get('head_size') else ''}"
            f"{f' window={window}' if window else ''}"
            f" F={cfg['ffn_width']}{' E={}/k={}'.format(*moe) if moe else ''}"
            f" V={cfg['vocab']} S={cfg['seq_len']} B={cfg['batch']}")


def parse_args(s3r_forward):
    """The command line (after peer_env.ensure: the help lists s3r_forward's bugs)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", required=True, help="s3r run folder (checkpoint/, metrics.jsonl)")
    ap.add_argument("--data", required=True, help="dataset folder with val.bin")
    ap.add_argument("--eval-batches", type=int, default=8, help="`s3r train --eval-batches` of the run (default 8)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--rtol", type=float, help="override the tolerance of the s3r-numerics comparison")
    bugs = dict(s3r_forward.BUGS)
    bugs.update({"perturb-weight": "one weight changed: lm_head[0, the most frequent target token] += 0.01",
                 "transpose-attn": "the square attention matrices read as (out, in) instead of (in, out)",
                 "window-order": "validation windows in file order instead of the loader's shuffled order",
                 "peer-norm-eps": "the plain-PyTorch peer model alone (not the s3r-numerics forward) built with "
                                  "RMSNorm eps 1e-6 instead of the checkpoint's 1e-5 (1e-5 instead of 1e-6 for "
                                  "qwen3, gemma3 and qwen3moe): only the peer's comparison can catch it (f32 checkpoints, "
                                  "without --no-peer)",
                 "peer-gqa-kv-modulo": "the plain-PyTorch peer model alone built with query head h reading kv head "
                                       "h % NKV instead of h // (NH / NKV) (f32 GQA checkpoints, without --no-peer)",
                 "peer-window-ignored": "the plain-PyTorch peer model alone built with local layers attending to "
                                        "every earlier key (f32 gemma3 checkpoints, without --no-peer)",
                 "peer-moe-no-renorm": "the plain-PyTorch peer model alone built with the experts' weights not "
                                       "divided by their sum (f32 qwen3moe checkpoints, without --no-peer)"})
    ap.add_argument("--inject", choices=sorted(bugs), metavar="BUG",
                    help="compute with a deliberate bug (the check must then fail, except for the changes "
                         "below its resolution: silu-exact, gelu-exact, round-half-away): " +
                         "; ".join(f"{k}: {v}" for k, v in sorted(bugs.items())).replace("%", "%%"))
    ap.add_argument("--no-peer", action="store_true", help="skip the plain-PyTorch peer model")
    args = ap.parse_args()
    if args.eval_batches < 1 or args.threads < 1:
        ap.error("--eval-batches and --threads must be >= 1")
    if args.inject in PEER_BUGS and args.no_peer:
        ap.error(f"--inject {args.inject} changes the peer model only: leave out --no-peer")
    return args


class Refusal(Exception):
    """The run, its data or the options cannot be checked (exit 2, with this message)."""


def load_run(args, s3r_forward, s3r_files):
    """The checkpoint's config, step, flat tensors and parameters, the validation tokens and the
    val_loss s3r logged at that step; Refusal where they are unreadable or do not fit together."""
    try:
        meta = s3r_files.read_meta(args.run)
        cfg = meta["config"]
        step = int(meta["step"])
        flat = s3r_files.read_safetensors(os.path.join(args.run, "checkpoint", "model.safetensors"))
        tokens, vocab = s3r_files.read_shard(os.path.join(args.data, "val.bin"))
        logged = s3r_files.logged_val_loss(args.run, step)
        nkv = s3r_forward.kv_heads(cfg)
        params = s3r_forward.unflatten(flat, cfg)  # checks the family, the window, the tensors' shapes
    except (OSError, ValueError, KeyError, s3r_files.FormatError) as e:
        raise Refusal(f"cannot read the run or the data: {e}") from e
    if logged is None:
        raise Refusal(f"{args.run}/metrics.jsonl has no val_loss for the checkpoint's step {step}")
    if vocab != cfg["vocab"]:
        raise Refusal(f"val.bin's vocabulary {vocab} differs from the model's {cfg['vocab']}")
    if cfg["mode"] not in ("f32", "bf16") + s3r_forward.INT8_MODES:
        raise Refusal(f"unknown mode '{cfg['mode']}' in meta.json")
    refusal = inapplicable(args.inject, cfg, nkv, s3r_forward)
    if refusal:
        raise Refusal(f"--inject {args.inject} {refusal}")
    return cfg, step, flat, params, nkv, tokens, logged


def validation_batches(args, tokens, cfg, threefry):
    """The windows' starts of each validation batch, as s3r's loader draws them (in order with
    --inject window-order)."""
    B, S = cfg["batch"], cfg["seq_len"]
    if args.inject == "window-order":
        windows = (len(tokens) - 1) // S
        return [[((i * B + b) % windows) * S for b in range(B)] for i in range(args.eval_batches)]
    return threefry.loader_batches(tokens, S, 0x5EED, B, args.eval_batches)


def main():
    # BLAS and thread settings go into the environment before torch loads (peer_env re-executes).
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--threads", type=int, default=os.cpu_count())
    threads = max(1, pre.parse_known_args()[0].threads)
    peer_env.ensure(threads, malloc_tuning=False)
    import s3r_forward

    args = parse_args(s3r_forward)
    import torch

    import s3r_files
    import threefry

    torch.set_num_threads(args.threads)
    try:
        cfg, step, flat, params, nkv, tokens, logged = load_run(args, s3r_forward, s3r_files)
    except Refusal as e:
        print(f"check_checkpoint: {e}", file=sys.stderr)
        return 2
    mode, S = cfg["mode"], cfg["seq_len"]
    batches = validation_batches(args, tokens, cfg, threefry)
    tok = torch.from_numpy(tokens)
    offs = torch.arange(S + 1)

    def batch_tensors(starts):
        w = tok[torch.tensor(starts)[:, None] + offs[None, :]]  # (B, S + 1)
        return w[:, :-1].contiguous(), w[:, 1:].contiguous()

    if args.inject in ("perturb-weight", "transpose-attn"):
        targets = torch.cat([batch_tensors(b)[1].reshape(-1) for b in batches])
        flat = inject_weight_bug(args.inject, flat, params, cfg, nkv, int(torch.bincount(targets).argmax()))
    bug = args.inject if args.inject in s3r_forward.BUGS else None
    theta = float(torch.tensor(cfg.get("rope_theta", 10000.0), dtype=torch.float32))
    tables = s3r_forward.rope_tables_for(cfg, S, bug)
    t0 = time.time()
    ours = sum(s3r_forward.mean_loss(params, cfg, mode, *batch_tensors(starts), bug=bug, tables=tables)
               for starts in batches) / len(batches)
    elapsed = time.time() - t0

    int8_head = mode in s3r_forward.INT8_MODES and cfg.get("lm_head", "default") == "int8"
    # An int8 LM head: one flipped code of a token's input moves all V logits of that token, so
    # each flip weighs more (measured 3e-6 on tiny, where a token is 1/128 of a batch).
    default_rtol = 1e-6 if mode == "f32" else 3e-5 if int8_head else 1e-5
    rtol = args.rtol if args.rtol is not None else default_rtol
    ok = True

    def compare(what, value, tol):
        nonlocal ok
        rel = abs(value - logged) / abs(logged) if logged != 0 else abs(value)
        good = math.isfinite(value) and math.isfinite(logged) and rel < tol
        ok &= good
        print(f"  {what:<38} {value:.10f}  rel diff {rel:.3e}  (tolerance {tol:.0e})  "
              f"{'ok' if good else 'MISMATCH'}")
        return rel

    print(f"check_checkpoint: {args.run} step {step}, {describe(cfg, nkv, int8_head, s3r_forward)}; "
          f"{len(batches)} validation batches of {args.data}/val.bin")
    if args.inject:
        print(f"  INJECTED BUG: {args.inject}")
    print(f"  {'s3r val_loss (metrics.jsonl)':<38} {logged:.10f}")
    compare(f"PyTorch, s3r numerics ({mode})", ours, rtol)
    print(f"  ({elapsed:.1f} s; torch {torch.__version__}, {torch.get_num_threads()} threads)")
    if not args.no_peer:
        peer = peer_loss(cfg, theta, nkv, args.inject, flat, [batch_tensors(s) for s in batches])
        # The bugs that the peer sees too: its inputs (weights, windows) or the peer itself.
        peer_sees = (None, "perturb-weight", "window-order") + PEER_BUGS
        if mode == "f32" and args.inject in peer_sees:
            compare("PyTorch peer model (plain f32 ops)", peer, 1e-5)
        else:
            rel = abs(peer - logged) / abs(logged) if logged != 0 else abs(peer)
            without = args.inject not in peer_sees
            # Information only, except that a non-finite loss is never an answer.
            good = math.isfinite(peer)
            ok &= good
            print(f"  {'PyTorch peer model (plain f32 ops)':<38} {peer:.10f}  rel diff {rel:.3e}  "
                  f"(information only: the peer runs f32{' without the injected bug' if without else ''})"
                  f"{'' if good else '  MISMATCH: not finite'}")
    print("check_checkpoint: " + ("ok" if ok else "MISMATCH: PyTorch and s3r disagree on the validation loss"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sys.exit(main())
