#!/usr/bin/env bash
# The serving benchmark (issue 23): GPT-2 124M on the CPU, dsc serve against
# Hugging Face transformers' generate (PyPI) on the same weights, machine and
# threads, at 1, 8 and 32 concurrent requests (transformers: static batches
# of the same prompts), decode tokens/s and time to first token, and the
# bandwidth limit of a batch-1 decode step (the weights once over this
# machine's bandwidth: the larger of bench/mem_bw's read and copy streams,
# measured before and after the run, the best of the four).
#
#   bench/serve.sh [--build DIR] [--venv DIR] [--threads N] [--prompt P] [--new N]
#                  [--conc 1,8,32]
#
# Builds (Release, DIR default build/bench-release) if needed; the venv
# (default build/bench-venv, as bench/codegen.sh) gets torch and transformers
# from PyPI if missing. The weights: one f32 training step of
# examples/gpt2.dsm from its initial values (no Hugging Face download here),
# exported with dsc export --format hf for transformers. Prints the CPU,
# the load before and after and one line per concurrency; JSON lines go to
# build/bench/serve.json.
set -euo pipefail
SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=$SRC/build/bench-release
VENV=${BENCH_VENV:-$SRC/build/bench-venv}
THREADS=2 PROMPT=32 NEW=32 CONC=1,8,32
while [ $# -gt 0 ]; do
  case $1 in
    --build) BUILD=$(realpath -m "${2:?}"); shift ;;
    --venv) VENV=$(realpath -m "${2:?}"); shift ;;
    --threads) THREADS=${2:?}; shift ;;
    --prompt) PROMPT=${2:?}; shift ;;
    --new) NEW=${2:?}; shift ;;
    --conc) CONC=${2:?}; shift ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "serve.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
  shift
done
if [ ! -x "$BUILD/dsc" ] || [ ! -x "$BUILD/bench/mem_bw" ]; then
  cmake -S "$SRC" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDSC_BUILD_TESTS=OFF >/dev/null
fi
cmake --build "$BUILD" --target dsc mem_bw >/dev/null
if ! "$VENV/bin/python3" -c 'import torch, transformers' 2>/dev/null; then
  [ -x "$VENV/bin/python3" ] || python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet torch transformers
fi
WORK=$SRC/build/bench/serve
mkdir -p "$WORK"
DSC=$BUILD/dsc
export DSC_CACHE_DIR=$WORK/kernel-cache
if [ ! -e "$WORK/g2/latest" ]; then
  "$DSC" data "$SRC/README.md" -o "$WORK/corpus" >/dev/null
  "$DSC" train "$SRC/examples/gpt2.dsm" --data "$WORK/corpus" --batch 1 --seq 64 --grad-accum 1 \
    --steps 1 --precision f32 --eval-every 0 --threads "$THREADS" --out "$WORK/g2" --quiet
fi
[ -e "$WORK/g2-hf/config.json" ] || "$DSC" export "$WORK/g2" --format hf -o "$WORK/g2-hf" >/dev/null
echo "cpu: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, $THREADS threads; load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "prompt $PROMPT tokens, $NEW new, greedy, f32"
"$VENV/bin/python3" "$SRC/bench/serve_bench.py" --dsc "$DSC" --checkpoint "$WORK/g2" --hf "$WORK/g2-hf" \
  --work "$WORK" --threads "$THREADS" --prompt "$PROMPT" --new "$NEW" --conc "$CONC" \
  --mem-bw "$BUILD/bench/mem_bw" --json "$SRC/build/bench/serve.json"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
