"""The PyTorch peer decoder with s3r_torch.convert(recipe="s3r+dx") trains like `s3r train` with
the same recipe: on the same data, batches and schedule (bench/peer/train_peer.py), the final
training loss (mean of the last 10 of 60 steps, tiny preset) of 5 seeds is compared pairwise
(same seed: same batches; the initializations differ: torch's and s3r's generators).

Decision: a paired t-test of the per-seed differences at the 1% level (t(0.995, 4) = 4.604), with
the difference's standard error from the 5 pairs. Both runs must also fall from about 5.7 to below
3.0. The test's resolution is shown on a negative control: the same converted decoder trained
with half the peak learning rate must be told apart from s3r's run by the same test.
The converted decoder is also compared with the plain nn.Linear f32 decoder from the same
initialization (the same test).

Usage: train_check.py S3R_BINARY DATA_DIR WORK_DIR REPO_ROOT   (PYTHONPATH: s3r_torch's folder)
"""
import json
import math
import os
import shutil
import statistics
import subprocess
import sys

T_995_DF4 = 4.604  # two-sided 1% critical value of Student's t with 4 degrees of freedom
SEEDS = (1, 2, 3, 4, 5)
STEPS = 60


def final_loss(path):
    losses = [json.loads(line)["loss"] for line in open(path) if '"loss"' in line]
    if len(losses) != STEPS:
        raise SystemExit(f"train_check: {path} has {len(losses)} losses, expected {STEPS}")
    return losses[0], statistics.fmean(losses[-10:])


def s3r_run(s3r, data, work, seed):
    out = os.path.join(work, f"s3r-{seed}")
    subprocess.run([s3r, "train", "--preset", "tiny", "--vocab", "300", "--data", data, "--steps", str(STEPS),
                    "--seed", str(seed), "--recipe", "s3r+dx", "--eval-every", "1000", "--out", out, "--overwrite"],
                   check=True, stdout=subprocess.DEVNULL)
    return final_loss(os.path.join(out, "metrics.jsonl"))


def torch_run(root, data, work, seed, recipe, lr=3e-3):
    out = os.path.join(work, f"torch-{recipe}-{lr:g}-{seed}.jsonl")
    subprocess.run(["/usr/bin/python3", os.path.join(root, "bench", "peer", "train_peer.py"), "--data", data,
                    "--preset", "tiny", "--vocab", "300", "--recipe", recipe, "--steps", str(STEPS), "--seed",
                    str(seed), "--lr", str(lr), "--threads", "2", "--out", out], check=True, stdout=subprocess.DEVNULL)
    return final_loss(out)


def paired(name, a, b):
    """(mean difference, its tolerance, passes) of the paired t-test of a against b."""
    d = [x - y for x, y in zip(a, b)]
    tol = T_995_DF4 * statistics.stdev(d) / math.sqrt(len(d))
    ok = abs(statistics.fmean(d)) <= tol
    print(f"  {name}: mean difference {statistics.fmean(d):+.4f}, tolerance {tol:.4f} "
          f"({'same' if ok else 'different'}); per seed {', '.join(f'{x:+.4f}' for x in d)}")
    return ok


def main():
    s3r, data, work, root = sys.argv[1:5]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    runs = {"s3r": [s3r_run(s3r, data, work, s) for s in SEEDS],
            "torch s3r+dx": [torch_run(root, data, work, s, "s3r+dx") for s in SEEDS],
            "torch f32": [torch_run(root, data, work, s, "torch-f32") for s in SEEDS],
            "torch s3r+dx, lr / 2": [torch_run(root, data, work, s, "s3r+dx", lr=1.5e-3) for s in SEEDS]}
    final = {k: [f for _, f in v] for k, v in runs.items()}
    for k, v in runs.items():
        print(f"  {k}: first loss {statistics.fmean(f for f, _ in v):.4f}, final {statistics.fmean(final[k]):.4f} "
              f"({', '.join(f'{x:.4f}' for x in final[k])})")
    failures = []
    for k in ("s3r", "torch s3r+dx", "torch f32"):
        if not max(final[k]) < 3.0:
            failures.append(f"{k} did not learn: final losses {final[k]}")
    if not paired("torch s3r+dx - s3r", final["torch s3r+dx"], final["s3r"]):
        failures.append("the converted PyTorch decoder does not train like s3r's")
    if not paired("torch s3r+dx - torch f32", final["torch s3r+dx"], final["torch f32"]):
        failures.append("the converted PyTorch decoder does not train like its f32 self")
    if paired("negative control: torch s3r+dx at lr / 2 - s3r", final["torch s3r+dx, lr / 2"], final["s3r"]):
        failures.append("the test cannot tell half the learning rate from s3r's run")
    if failures:
        raise SystemExit("train_check: " + "; ".join(failures))
    print("train_check: ok")


if __name__ == "__main__":
    main()
