#!/usr/bin/env bash
# Installs what s3r needs (Debian 12 packages) and builds the release preset.
# Idempotent: packages already present are not reinstalled; the build is incremental.
# Usage: scripts/setup.sh [--no-build]
set -euo pipefail
cd "$(dirname "$0")/.."

# Build tools, tests, benchmarks, GEMMs (oneDNN), the CLI (CLI11, nlohmann-json), the tokenizer
# (SentencePiece), gzip input (zlib), loss-curve PNGs (gnuplot) and the experiment scripts
# (python3, standard library only). scripts/fetch_data.sh uses the machine's npm.
# The PyTorch peer (bench/peer: side-by-side speed, independent check of checkpoints) needs
# python3-torch (importable by /usr/bin/python3) and OpenBLAS: Debian's torch calls the generic
# libblas.so.3, and the reference BLAS behind it is 10-50x slower for f32 products.
packages=(g++ cmake make libgtest-dev libbenchmark-dev libdnnl-dev libcli11-dev nlohmann-json3-dev
          libsentencepiece-dev zlib1g-dev gnuplot-nox python3 python3-torch libopenblas0-pthread)

scripts/install_packages.sh setup "${packages[@]}"

[ "${1:-}" = "--no-build" ] && exit 0
cmake --preset release >/dev/null
cmake --build --preset release
echo "setup: built build/release"
