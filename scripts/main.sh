#!/usr/bin/env bash
# The main job: installs and builds (setup.sh), fetches and prepares the default data
# (fetch_data.sh: nlp-corpus from npm, a 4096-token BPE tokenizer), then trains the `small`
# decoder (L=6, C=256, F=768, S=256, B=16) with s3r + dx for 600 steps: about 10 minutes on
# 2 cores. Prints a config table, a line per step, validation losses and a summary; writes
# data/runs/small-s3r-dx/{metrics.jsonl, checkpoint/, loss.png}.
# Extra arguments go to `s3r train` (e.g. --mode sr --correction none --out data/runs/sr). Run
# again, it refuses to replace the finished run: add --overwrite to train it anew.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/fetch_data.sh
build/release/tools/s3r train --preset small --mode s3r --correction dx --steps 600 \
  --data data/nlp-corpus --out data/runs/small-s3r-dx "$@"
