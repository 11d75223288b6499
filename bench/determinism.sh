#!/usr/bin/env bash
# Run the same training N times and compare the loss curves: dsc's cpu
# backend is bitwise deterministic for a fixed thread count (the kernels'
# chunks and the GEMM's panels depend on the shape and the thread count
# only), so every run must print the same losses and gradient norms.
#
#   bench/determinism.sh [--dsc PATH] [--model FILE] [--runs N] [--steps N]
#                        [--threads N] [--batch B] [--seq T] [--load N]
#                        [--cache DIR] [--out DIR]
#
# Defaults: examples/gpt2.dsm (124M, f32, B=4, T=64, grad_accum 1), 6 runs
# of 2 steps on 2 threads, on one warm kernel cache (the first run fills it).
# --load N runs N busy processes (one core each) beside the runs. Prints each
# run's loss/gradient-norm per step, the CPU and the load, and the runs that differ
# from the first. Exit 0 when all runs agree, 1 when one differs or fails.
set -uo pipefail

SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DSC=$SRC/build/dsc
MODEL=$SRC/examples/gpt2.dsm
RUNS=6
STEPS=2
THREADS=2
B=4
T=64
LOAD=0
OUT=$SRC/build/bench/determinism
CACHE=

usage() { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --dsc) DSC=$(realpath -m "${2:?}"); shift ;;
    --model) MODEL=$(realpath -m "${2:?}"); shift ;;
    --runs) RUNS=${2:?}; shift ;;
    --steps) STEPS=${2:?}; shift ;;
    --threads) THREADS=${2:?}; shift ;;
    --batch) B=${2:?}; shift ;;
    --seq) T=${2:?}; shift ;;
    --load) LOAD=${2:?}; shift ;;
    --cache) CACHE=$(realpath -m "${2:?}"); shift ;;
    --out) OUT=$(realpath -m "${2:?}"); shift ;;
    -h|--help) usage 0 ;;
    *) echo "bench/determinism.sh: unknown option '$1'" >&2; usage ;;
  esac
  shift
done
[ -x "$DSC" ] || { echo "bench/determinism.sh: no dsc at $DSC (build first)" >&2; exit 1; }
mkdir -p "$OUT"
CACHE=${CACHE:-$OUT/cache}

# shellcheck source=../tests/cli/lib/corpus.bash
source "$SRC/tests/cli/lib/corpus.bash"
if [ ! -f "$OUT/data_train.bin" ]; then
  make_corpus "$OUT/corpus.txt" 200000
  "$DSC" data "$OUT/corpus.txt" -o "$OUT/data" >/dev/null || exit 1
fi

busy=()
stop_load() { for p in "${busy[@]}"; do kill "$p" 2>/dev/null; done; busy=(); }
trap stop_load EXIT
for ((i = 0; i < LOAD; i++)); do
  (while :; do :; done) &
  busy+=($!)
done

echo "CPU: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg) before; $RUNS runs of $(basename "$MODEL") x $STEPS steps, $THREADS threads, B=$B T=$T, $LOAD busy processes"
first=""
status=0
for ((r = 1; r <= RUNS; r++)); do
  rm -rf "$OUT/run"
  DSC_CACHE_DIR=$CACHE "$DSC" train "$MODEL" --data "$OUT/data" --out "$OUT/run" \
    --batch "$B" --seq "$T" --grad-accum 1 --steps "$STEPS" --threads "$THREADS" \
    --precision f32 --save-every 0 >"$OUT/run$r.log" 2>&1
  rc=$?
  curve=$(awk -F'|' '/^step /{split($2, l, " "); split($4, g, " "); printf "%s/%s ", l[2], g[2]}' "$OUT/run$r.log")
  verdict=""
  if [ $rc -ne 0 ]; then
    verdict="FAILED (exit $rc, $OUT/run$r.log)"
    status=1
  elif [ -z "$first" ]; then
    first=$curve
  elif [ "$curve" != "$first" ]; then
    verdict="DIFFERS from run 1"
    status=1
  fi
  echo "run $r: $curve$verdict"
done
stop_load
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
[ $status -eq 0 ] && echo "all $RUNS runs agree" || echo "the runs do not agree"
exit $status
