#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ (clang, ASan + UBSan, build/fuzz) and runs each for a
# while on a working copy of its seed corpus (build/fuzz/corpus/<target>; fuzz/corpus/ is never
# grown). Prints per target the executions and whether it found a crash; crash inputs are kept
# in build/fuzz/artifacts/. Exits non-zero when any target found one.
#
# Usage: scripts/fuzz.sh [SECONDS | --smoke] [TARGET...]
#          SECONDS per target (default 60); --smoke: 10 s each (what CI runs)
#        scripts/fuzz.sh --make-seeds      regenerates fuzz/corpus/ with the library's writers
#          (fuzz/corpus/*/regress_*: inputs that crashed an earlier reader, kept by hand)
# Reproduce a finding: build/fuzz/fuzz/<target> build/fuzz/artifacts/<target>-crash-...
# Needs clang, libFuzzer's runtime and OpenMP for clang (Debian 12: clang libclang-rt-14-dev
# libomp-14-dev, installed here when missing) besides what scripts/setup.sh installs.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=60
make_seeds=0
targets=()
for arg in "$@"; do
  case "$arg" in
    --smoke) seconds=10 ;;
    --make-seeds) make_seeds=1 ;;
    fuzz_*) targets+=("$arg") ;;
    ''|*[!0-9]*) echo "fuzz.sh: unknown argument '$arg'; usage: scripts/fuzz.sh [SECONDS | --smoke] [TARGET...]" >&2; exit 2 ;;
    *) seconds="$arg" ;;
  esac
done
all=(fuzz_token_shard fuzz_safetensors fuzz_text_reader fuzz_checkpoint)
((${#targets[@]})) || targets=("${all[@]}")

# Per target: the largest input (the checkpoint seeds are ~14 KB) and its dictionary.
declare -A max_len=([fuzz_token_shard]=4096 [fuzz_safetensors]=4096 [fuzz_text_reader]=4096 [fuzz_checkpoint]=32768)
declare -A dict=([fuzz_safetensors]=fuzz/safetensors.dict [fuzz_checkpoint]=fuzz/checkpoint.dict
                 [fuzz_text_reader]=fuzz/text.dict)

# Packages (as scripts/setup.sh does it: only those missing, as root or through sudo).
packages=(clang libclang-rt-14-dev libomp-14-dev)
command -v dpkg-query >/dev/null && scripts/install_packages.sh fuzz "${packages[@]}"
command -v clang++ >/dev/null || { echo "fuzz: clang++ not found" >&2; exit 1; }

build=build/fuzz
cmake -S . -B "$build" -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo -DS3R_FUZZ=ON \
  -DS3R_BUILD_TESTS=OFF -DS3R_BUILD_BENCH=OFF >/dev/null
if ((make_seeds)); then
  cmake --build "$build" -j "$(nproc)" --target fuzz_make_seeds
  "$build/fuzz/fuzz_make_seeds" fuzz/corpus  # overwrites its seeds; keeps the regress_* inputs
  exit 0
fi
cmake --build "$build" -j "$(nproc)" --target "${targets[@]}"

mkdir -p "$build/artifacts" "$build/logs" "$build/tmp"
export OMP_NUM_THREADS=1 TMPDIR="$PWD/$build/tmp"
# Any UBSan report aborts (the library is built with -fno-sanitize-recover=undefined too).
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export ASAN_OPTIONS="abort_on_error=0:detect_leaks=1"
failed=0
summary=()
for t in "${targets[@]}"; do
  corpus="$build/corpus/$t"
  mkdir -p "$corpus"
  cp -n fuzz/corpus/"$t"/* "$corpus"/ 2>/dev/null || true
  log="$build/logs/$t.log"
  args=(-max_total_time="$seconds" -max_len="${max_len[$t]}" -timeout=20 -rss_limit_mb=2048
        -artifact_prefix="$build/artifacts/$t-" -print_final_stats=1)
  [ -n "${dict[$t]:-}" ] && args+=(-dict="${dict[$t]}")
  echo "== $t: ${seconds} s (log $log)"
  rc=0
  "$build/fuzz/$t" "${args[@]}" "$corpus" >"$log" 2>&1 || rc=$?
  execs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | tail -1 | awk '{print $2}')
  if ((rc != 0)); then
    failed=1
    artifact=$(grep -o "Test unit written to [^ ]*" "$log" | tail -1 | awk '{print $5}')
    grep -m1 -E "ERROR: (AddressSanitizer|libFuzzer|LeakSanitizer)|runtime error|terminate called|what\(\)" "$log" || true
    summary+=("$(printf '%-18s %10s execs  CRASH (exit %d): %s' "$t" "${execs:-?}" "$rc" "${artifact:-see $log}")")
  else
    summary+=("$(printf '%-18s %10s execs  no crash (corpus %s files)' "$t" "${execs:-?}" "$(ls "$corpus" | wc -l)")")
  fi
done
rm -rf "$build/tmp"
echo "== fuzz summary (${seconds} s per target)"
printf '%s\n' "${summary[@]}"
exit "$failed"
