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
# s3r_torch (python/, s3r's layer inside PyTorch) builds against libtorch-dev and pybind11-dev.
packages=(g++ cmake make libgtest-dev libbenchmark-dev libdnnl-dev libcli11-dev nlohmann-json3-dev
          libsentencepiece-dev zlib1g-dev gnuplot-nox python3 python3-torch libopenblas0-pthread
          openmpi-bin libopenmpi-dev libtorch-dev pybind11-dev python3-dev)

scripts/install_packages.sh setup "${packages[@]}"

# llama.cpp for the check of `s3r export --format gguf` (tests/llama): the npm package
# node-llama-cpp 3.22.1 with its prebuilt x86-64 CPU binaries, into tests/llama/node_modules
# (85 MB, git-ignored). It needs Node.js >= 20 with npm: Debian 12's own nodejs is 18, so a
# machine without a newer one gets Debian's and the check stays off (CMake says so).
command -v npm >/dev/null || scripts/install_packages.sh setup nodejs npm
if command -v node >/dev/null && [ "$(node -p 'process.versions.node.split(".")[0]')" -ge 20 ]; then
  if [ "$(node -p 'require("./tests/llama/node_modules/node-llama-cpp/package.json").version' 2>/dev/null)" != 3.22.1 ]; then
    echo "setup: installing node-llama-cpp into tests/llama"
    (cd tests/llama && npm install --no-audit --no-fund --no-package-lock --omit=optional --ignore-scripts --loglevel=error)
  fi
else
  echo "setup: Node.js >= 20 not found: the llama.cpp check of GGUF exports (tests/llama) is off"
fi

[ "${1:-}" = "--no-build" ] && exit 0
cmake --preset release >/dev/null
cmake --build --preset release
echo "setup: built build/release"
