#!/usr/bin/env bash
# Installs what s3r needs (Debian 12 packages) and builds the release preset.
# Idempotent: packages already present are not reinstalled; the build is incremental.
# Usage: scripts/setup.sh [--no-build]
set -euo pipefail
cd "$(dirname "$0")/.."

# Build tools, tests, benchmarks, GEMMs (oneDNN), the CLI (CLI11, nlohmann-json), the tokenizer
# (SentencePiece), gzip input (zlib), loss-curve PNGs (gnuplot) and the experiment scripts
# (python3, standard library only). scripts/fetch_data.sh uses the machine's npm.
packages=(g++ cmake make libgtest-dev libbenchmark-dev libdnnl-dev libcli11-dev nlohmann-json3-dev
          libsentencepiece-dev zlib1g-dev gnuplot-nox python3)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup: all packages present (${packages[*]})"
fi

[ "${1:-}" = "--no-build" ] && exit 0
cmake --preset release >/dev/null
cmake --build --preset release
echo "setup: built build/release"
