"""Table I, decisive version: the pre-registered plan of scripts/table1.py, as data (the studies'
convergence.py arguments, the comparisons and claims, the planning numbers)."""

# The pre-registered plan (data). Each study: convergence.py's --configs and the options that
# differ from its defaults; --out, --s3r, --data, --jobs and --threads are added per invocation.
# A grid is extended by a factor of 2 beyond any edge where a configuration's best lr falls. The
# width study's: on convergence.py's default (7.5e-4, 1.5e-3, 3e-3) sr's best at C = 512 was the
# lower edge (seed 0: 5.608, 5.686, 5.825), so the grid moved down to 3.75e-4 .. 1.5e-3, where
# sr's best was again the lower edge (5.599 at 3.75e-4): 1.875e-4 was added.
PLAN = {
    "width": {"configs": ["sr", "s3r", "s3r+dx", "s3r+two-way"],
              "options": ["--width", "512", "--lrs", "0.0001875,0.000375,0.00075,0.0015", "--seeds", "8",
                          "--widths", ""]},
    "length": {"configs": ["bf16", "rtne", "sr"],
               "options": ["--width", "256", "--steps", "1600", "--eval-every", "100",
                           "--checkpoint-every", "200", "--seeds", "8", "--widths", ""]},
}
# Only for tests/tools/table1_test.py (hidden flag --tiny-plan-for-tests): the same studies, tiny.
_TINY = ["--preset", "tiny", "--seq-len", "0", "--batch", "0", "--width", "64", "--warmup", "2",
         "--lrs", "1e-3,3e-3", "--seeds", "3", "--eval-every", "6", "--eval-batches", "2",
         "--checkpoint-every", "6", "--widths", ""]
TINY_PLAN = {"width": {"configs": PLAN["width"]["configs"], "options": _TINY + ["--steps", "12"]},
             "length": {"configs": PLAN["length"]["configs"], "options": _TINY + ["--steps", "24"]}}
EXTRA = ("width", "bf16")  # seed 0 at sr's best lr in the width study: Table II's checkpoint

ALPHA = 0.05      # family-wise, Holm over the 8 comparisons
DELTA = 0.03      # effect of interest and equivalence margin, nats
SIGMA = 0.015     # planning sd of a paired difference
PRIOR_SDS = (0.015, 0.018, 0.012, 0.005, 0.011)  # 3-seed study, non-bcast paired sds (2 df each)
PRIOR_DF_EACH = 2
# (id, study, a, b, claim, kind, expected sign of a - b, statement)
COMPARISONS = [
    ("W1", "width", "s3r", "sr", "a", "difference", +1, "s3r without correction ends worse than sr"),
    ("W2", "width", "s3r+dx", "s3r", "b", "difference", -1, "the dX correction repairs s3r"),
    ("W3", "width", "s3r+two-way", "s3r", "b", "difference", -1, "the two-way correction repairs s3r"),
    ("W4", "width", "s3r+dx", "sr", "c", "equivalence", 0, "s3r + dx returns to sr's quality"),
    ("W5", "width", "s3r+two-way", "sr", "c", "equivalence", 0, "s3r + two-way returns to sr's quality"),
    ("L1", "length", "rtne", "sr", "d", "difference", +1, "rtne ends worse than sr when trained longer"),
    ("L2", "length", "rtne", "bf16", "d-context", "difference", +1, "rtne ends worse than bf16"),
    ("L3", "length", "sr", "bf16", "d-context", "difference", +1, "sr ends worse than bf16"),
]
CLAIMS = [("a", "s3r (per-token threshold, no correction) ends worse than sr", ["W1"]),
          ("b", "S3R-EC repairs s3r", ["W2", "W3"]),
          ("c", "S3R-EC returns to sr's quality (equivalence within +-0.03)", ["W4", "W5"]),
          ("d", "rtne ends worse than sr with longer training (L2, L3: context)", ["L1"])]
# Seconds per training step, measured on this machine (one thread per run, two runs at a time).
SEC_PER_STEP = {512: {"sr": 0.42, "s3r": 0.40, "s3r+dx": 0.40, "s3r+two-way": 0.40, "bf16": 0.52},
                256: {"sr": 0.19, "bf16": 0.18, "rtne": 0.18}}
EVAL_BATCH_COST = 1.0 / 3.0  # one validation batch, in training steps
KINDS = ["attn.q", "attn.k", "attn.v", "attn.o", "ffn.gate", "ffn.up", "ffn.down"]
GRAD_QUANTITIES = [("dx_first_block", "dX block 0"), ("dx_last_block", "dX last block"),
                   ("dw_first_block", "dW block 0"), ("embedding", "embedding")]
