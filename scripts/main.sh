#!/usr/bin/env bash
# The main job: installs and builds (setup.sh), fetches and prepares the default data
# (fetch_data.sh: nlp-corpus from npm, a 4096-token BPE tokenizer), then trains the `small`
# decoder (L=6, C=256, F=768, S=256, B=16) with s3r + dx for 600 steps: about 10 minutes on
# 2 cores. Prints a config table, a line per step, validation losses and a summary; writes
# data/runs/small-s3r-dx/{metrics.jsonl, checkpoint/, loss.png}.
# Extra arguments go to `s3r train` (e.g. --recipe sr --out data/runs/sr). Run
# again, it refuses to replace the finished run: add --overwrite to train it anew.
# `--ranks R` (first argument) trains the same job as R MPI ranks on this machine (mpirun -np R
# in front of `s3r train`, cores / R threads each): the same losses, bit for bit
# (docs/DISTRIBUTED.md). Give it another --out to keep both runs.
set -euo pipefail
cd "$(dirname "$0")/.."
launch=()
if [ "${1:-}" = --ranks ]; then
  ranks=${2:?"--ranks needs a number of ranks"}; shift 2
  [[ $ranks =~ ^[1-9][0-9]*$ ]] || { echo "main.sh: --ranks must be a positive integer, got '$ranks'" >&2; exit 1; }
  threads=$(( $(nproc) / ranks )); (( threads >= 1 )) || threads=1
  launch=(mpirun -np "$ranks" --bind-to none -x OMP_NUM_THREADS="$threads")
  (( ranks <= $(nproc) )) || launch+=(--oversubscribe)
  # One host: shared memory without the ptrace-based single copy (refused in containers).
  export OMPI_MCA_btl_vader_single_copy_mechanism=${OMPI_MCA_btl_vader_single_copy_mechanism:-none}
  [ "$(id -u)" = 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
scripts/setup.sh
scripts/fetch_data.sh
# The job's settings, each unless the extra arguments give it (s3r train takes an option once).
# The recipe is s3r train's default, s3r+dx, unless --recipe or --mode/--correction/--head say
# otherwise (a mode alone takes its own correction: dx in int8 modes, none in bf16 and f32).
given() { local a; for a in "${@:2}"; do [[ $a == "$1" || $a == "$1="* ]] && return 0; done; return 1; }
args=()
for pair in "--preset small" "--steps 600" "--data data/nlp-corpus" "--out data/runs/small-s3r-dx"; do
  key=${pair%% *}
  given "$key" "$@" && continue
  args+=($pair)
done
"${launch[@]}" build/release/tools/s3r train "${args[@]}" "$@"
