#!/usr/bin/env bash
# The default data: the npm package nlp-corpus (about 9 MB of varied English: film reviews,
# news, UN documents, ...) fetched into data/ (git-ignored) and prepared with
# `s3r data prepare` (a 4096-token SentencePiece BPE tokenizer, train.bin, val.bin).
# Idempotent: does nothing when data/nlp-corpus/train.bin exists. The C++ never downloads.
set -euo pipefail
cd "$(dirname "$0")/.."
out=data/nlp-corpus
if [ -f "$out/train.bin" ] && [ -f "$out/val.bin" ]; then
  echo "fetch_data: $out already prepared"
  exit 0
fi
command -v npm >/dev/null || { echo "fetch_data: npm is required (Debian package npm)" >&2; exit 1; }
mkdir -p data/npm
if [ ! -d data/npm/package/builds ]; then
  echo "fetch_data: fetching nlp-corpus@4.4.0 from the npm registry"
  (cd data/npm && npm pack --silent nlp-corpus@4.4.0 >/dev/null && tar xzf nlp-corpus-4.4.0.tgz)
fi
build/release/tools/s3r data prepare data/npm/package/builds --out "$out" --vocab 4096
