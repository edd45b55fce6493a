"""What scripts/convergence.py and its report share: the study's configurations, and the
formatting and file helpers of its outputs (NaN-aware: a diverged run's loss is NaN)."""
import csv
import json
import math
import os

# (name, --mode, --correction): the paper's nine configurations, in its order.
CONFIGS = [
    ("bf16", "bf16", "none"),
    ("rtne", "rtne", "none"),
    ("sr", "sr", "none"),
    ("s3r", "s3r", "none"),
    ("s3r+dx", "s3r", "dx"),
    ("s3r+two-way", "s3r", "two-way"),
    ("s3r-bcast", "s3r-bcast", "none"),
    ("s3r-bcast+dx", "s3r-bcast", "dx"),
    ("s3r-bcast+two-way", "s3r-bcast", "two-way"),
]
WIDTH_CONFIGS = ["sr", "s3r", "s3r+dx"]
# Colours in val_curves.png (CONFIGS order): s3r-bcast and its corrections reuse the colours of
# s3r and its corrections, dashed, so that each family reads as one.
COLORS = ["#000000", "#e41a1c", "#377eb8", "#ff7f00", "#4daf4a", "#984ea3", "#ff7f00", "#4daf4a", "#984ea3"]


def as_loss(x):
    """A loss read from JSON as a float: null (s3r's and this driver's NaN) and anything not a
    number become NaN."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return float("nan")
    return float(x)


def json_safe(x):
    """X with every non-finite float replaced by None, for strict JSON (null, as s3r writes)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    return x


def dumps(x):
    return json.dumps(json_safe(x), indent=1, allow_nan=False)


def write_atomic(path, text):
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def finite(x):
    return x is not None and math.isfinite(x)


def fmt(x, spec=".4f"):
    """X formatted; "" for a missing or NaN statistic (not computed)."""
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def fmt_loss(x, spec=".5f"):
    """A run's loss: "nan" when it diverged (so a CSV reader gets NaN), "" when missing."""
    if x is None:
        return ""
    return "nan" if not finite(x) else format(x, spec)


def write_csv(path, rows):
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", newline="") as f:
        csv.writer(f).writerows(rows)
    os.replace(tmp, path)
