#!/usr/bin/env bash
# Builds (via setup.sh) and runs the unit tests of the release build.
# With --asan: builds the AddressSanitizer + UBSan preset (build/asan) and runs the same tests there.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--asan" ]; then
  scripts/setup.sh --no-build
  cmake --preset asan >/dev/null
  cmake --build --preset asan
  ctest --preset asan
else
  scripts/setup.sh
  ctest --preset release
fi
