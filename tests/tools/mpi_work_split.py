#!/usr/bin/env python3
"""That a data-parallel `s3r train` run split its work over the ranks (docs/DISTRIBUTED.md).

Matching bits alone do not show it: R ranks that each ran the whole batch would log the same
numbers. From the run's log (`work of rank r: ...` lines, the model line) and metrics.jsonl:
  - every rank's forward passes saw exactly its 1/R of the tokens, in training and validation;
  - AdamW's moments: every parameter on every rank, or with --shard-optimizer a share per rank
    (K/R of the norm's K chunks of at most 16384 elements, fewer than all parameters) that adds
    up to the parameters;
  - rank 0's bytes per step: the volume of DISTRIBUTED.md's table, 2 (R-1)/R x 4 bytes per
    parameter (int8 dW sums and float partials), plus (R-1) x 4 per parameter of its share when
    sharded (the weights' all-gather),
    within 1% (the table leaves out D's all-reduces and the loss leaves, a few hundred bytes).
Usage: mpi_work_split.py LOG RUN_DIR RANKS STEPS EVALUATIONS EVAL_BATCHES [--sharded]
Exit 0 with one "ok" line, or 1 with "FAIL: ..." naming what differs.
"""
import json
import re
import sys

NORM_CHUNK = 16384  # optim::kNormChunk: shares are cut at these chunks


def fail(msg):
    print(f"FAIL: {msg}")
    sys.exit(1)


def main():
    log_path, run_dir, ranks, steps, evaluations, eval_batches = sys.argv[1:7]
    ranks, steps, evaluations, eval_batches = int(ranks), int(steps), int(evaluations), int(eval_batches)
    sharded = "--sharded" in sys.argv[7:]
    log = open(log_path).read()
    m = re.search(r"\(L=(\d+) C=(\d+) heads=\d+ F=(\d+) V=(\d+) S=(\d+) B=(\d+),", log)
    if not m:
        fail(f"{log_path}: no model line")
    L, C, F, V, S, B = map(int, m.groups())
    # Tensors: the embedding and the LM head (V x C), per block two RMSNorm gains (C), four
    # attention projections (C x C) and three SwiGLU matrices (C x F), and the final gain.
    sizes = [V * C] + L * ([C] + 4 * [C * C] + [C] + 3 * [C * F]) + [C, V * C]
    params = sum(sizes)
    chunks = sum(-(-n // NORM_CHUNK) for n in sizes)  # the norm's chunks, which the shares cut
    work = {}
    for r, trained, evaluated, kept, total, sent in re.findall(
            r"^work of rank (\d+): (\d+) training tokens, (\d+) validation tokens, AdamW moments of (\d+) of "
            r"(\d+) parameters \([^)]*\), (\d+) bytes sent$", log, re.M):
        work[int(r)] = dict(trained=int(trained), evaluated=int(evaluated), kept=int(kept), total=int(total),
                            sent=int(sent))
    if sorted(work) != list(range(ranks)):
        fail(f"{log_path}: 'work of rank' lines for ranks {sorted(work)}, expected 0..{ranks - 1}")
    share = B * S // ranks
    for r, w in sorted(work.items()):
        if w["total"] != params:
            fail(f"rank {r} reports {w['total']} parameters, the model has {params}")
        if w["trained"] != steps * share:
            fail(f"rank {r} trained on {w['trained']} tokens, expected {steps} steps x {B} x {S} / {ranks} = "
                 f"{steps * share}")
        if w["evaluated"] != evaluations * eval_batches * share:
            fail(f"rank {r} validated on {w['evaluated']} tokens, expected {evaluations} x {eval_batches} x "
                 f"{share}")
        if not sharded and w["kept"] != params:
            fail(f"rank {r} keeps the moments of {w['kept']} parameters, expected all {params} (not sharded)")
        if sharded and not (0 < w["kept"] <= -(-chunks // ranks) * NORM_CHUNK and w["kept"] < params):
            fail(f"rank {r} keeps the moments of {w['kept']} parameters, expected its share of {chunks} chunks "
                 f"of at most {NORM_CHUNK} ({params} parameters) over {ranks} ranks")
        if w["sent"] <= 0:
            fail(f"rank {r} sent no bytes")
    if sharded and sum(w["kept"] for w in work.values()) != params:
        fail(f"the ranks' moment shares add up to {sum(w['kept'] for w in work.values())}, not {params}")
    # The all-gather of the updated weights: rank 0 sends its share to the R - 1 others ((R-1)/R
    # x 4 bytes per parameter when the shares are even; the tiny model's chunks are not).
    expect = 2 * (ranks - 1) * 4 * params / ranks + ((ranks - 1) * 4 * work[0]["kept"] if sharded else 0)
    for line in open(f"{run_dir}/metrics.jsonl"):
        j = json.loads(line)
        if "loss" not in j:
            continue
        got = j.get("sent_bytes")
        if got is None or abs(got - expect) > 0.01 * expect:
            fail(f"step {j['step']}: rank 0 sent {got} bytes, DISTRIBUTED.md's formula gives {expect:.0f}")
    print(f"ok: {ranks} ranks x {share} tokens per step, moments kept "
          f"{', '.join(str(w['kept']) for _, w in sorted(work.items()))} of {params}, "
          f"{expect:.0f} bytes per step (formula)")


if __name__ == "__main__":
    main()
