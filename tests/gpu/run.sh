#!/usr/bin/env bash
# The GPU device check (docs/gpu.md): builds dsc, runs the GPU tests, then
# benchmarks a GPT-2 124M training step (B=16, T=1024, bf16) against PyTorch
# on the same card. One script, one call of the device machine, under 8
# minutes; prints a short table last.
#
#   tests/gpu/run.sh [--kit DIR] [--build DIR] [--out DIR] [--steps N] [--no-bench]
#
#   --kit DIR    what a machine without Flex, Bison and cJSON needs
#                (scripts/device-kit.sh; default .device-kit, used only when
#                flex or bison is missing here)
#   --build DIR  build directory (default build-gpu)
#   --out DIR    where the logs and JSON lines go (default DIR/gpu-out)
#   --steps N    timed steps of each benchmark (default 10, after 3 warm-ups)
#
# Steps: (1) configure and build (Release; LLVM, MPI and the GoogleTest suite
# off: the device machine has none of them); (2) dsc_gpu_check: every op and
# fused kernel on the cuda backend against the interpreter, and the tiny
# GPT's loss curve on the GPU against the CPU's; (3) the bf16 GEMM ceiling
# (bench/gpu_gemm_ceiling.py), the dsc step (bench/train_step --backend cuda)
# and PyTorch's (bench/pytorch_gpt2_step.py --device cuda --dtype bf16).
# Without a GPU (this repository's CI machines) the build runs, the GPU
# parts say "skipped: no GPU", and the exit status is 0 if the build passed.
# Exit 1 when any part that could run failed.
set -uo pipefail

SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
KIT=$SRC/.device-kit
BUILD=$SRC/build-gpu
OUTDIR=
STEPS=10
BENCH=1
while [ $# -gt 0 ]; do
  case "$1" in
    --kit) KIT=$(realpath -m "${2:?}"); shift ;;
    --build) BUILD=$(realpath -m "${2:?}"); shift ;;
    --out) OUTDIR=$(realpath -m "${2:?}"); shift ;;
    --steps) STEPS=${2:?}; shift ;;
    --no-bench) BENCH=0 ;;
    -h|--help) sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
  shift
done
[[ "$STEPS" =~ ^[1-9][0-9]*$ ]] || { echo "run.sh: --steps must be a positive integer" >&2; exit 2; }
OUTDIR=${OUTDIR:-$BUILD/gpu-out}
mkdir -p "$OUTDIR"
JSON=$OUTDIR/gpu.json
: >"$JSON"
T0=$(date +%s)
FAILED=0
declare -A STATUS
say() { printf '[run.sh %4ss] %s\n' "$(($(date +%s) - T0))" "$*"; }
# part NAME SECONDS CMD...: runs CMD with a time limit, its output teed to
# OUTDIR/NAME.log; records passed / FAILED (rc) / skipped (rc 77).
part() {
  local name=$1 limit=$2
  shift 2
  say "$name: $*"
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$OUTDIR/$name.log"
  local rc=${PIPESTATUS[0]}
  case $rc in
    0) STATUS[$name]=passed ;;
    77) STATUS[$name]="skipped: no GPU" ;;
    124|137) STATUS[$name]="FAILED (over ${limit}s)"; FAILED=1 ;;
    *) STATUS[$name]="FAILED (exit $rc)"; FAILED=1 ;;
  esac
  say "$name: ${STATUS[$name]}"
  return $rc
}

# ---- (1) build ----
HAVE_GPU=0
if command -v nvidia-smi >/dev/null && nvidia-smi -L >"$OUTDIR/nvidia-smi.log" 2>&1; then
  HAVE_GPU=1
  say "GPU: $(head -1 "$OUTDIR/nvidia-smi.log")"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >>"$OUTDIR/nvidia-smi.log" 2>&1
else
  say "no GPU here (nvidia-smi found none): build and CPU parts only"
fi
CONF=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DDSC_ENABLE_LLVM=OFF -DDSC_ENABLE_MPI=OFF -DDSC_ENABLE_SERVE=OFF
      -DDSC_BUILD_TESTS=OFF)
if ! command -v flex >/dev/null || ! command -v bison >/dev/null; then
  [ -d "$KIT/gen/frontend" ] || {
    echo "run.sh: no flex/bison here and no kit at $KIT (make one with scripts/device-kit.sh" \
         "on a machine that has them, and carry it)" >&2
    exit 1
  }
  CONF+=(-DDSC_GEN_FRONTEND_DIR="$KIT/gen/frontend")
fi
# the kit's cJSON, PCRE2 and utf8proc where the machine lacks one of them
[ -d "$KIT/deps" ] && { [ ! -e /usr/include/cjson/cJSON.h ] || [ ! -e /usr/include/pcre2.h ] ||
  [ ! -e /usr/include/utf8proc.h ]; } && CONF+=(-DCMAKE_PREFIX_PATH="$KIT/deps")
# (timeout runs programs, not shell functions: the build is one bash -c)
part build 300 bash -c "cmake -S ${SRC@Q} -B ${BUILD@Q} ${CONF[*]@Q} &&
  ninja -C ${BUILD@Q} -j $(nproc) dsc dsc_gpu_check train_step" ||
  { say "build failed: nothing else can run"; exit 1; }
grep -q 'CUDA=ON' "$OUTDIR/build.log" || say "warning: this build has no CUDA backend"

# ---- (2) GPU tests ----
export DSC_CACHE_DIR=${DSC_CACHE_DIR:-$BUILD/kernel-cache}
part gpu_check 240 "$BUILD/dsc_gpu_check" "$SRC"

# ---- (3) benchmark: GPT-2 124M, B=16, T=1024, bf16 ----
if [ "$BENCH" = 1 ] && [ "$HAVE_GPU" = 1 ]; then
  cd "$SRC" || exit 1
  part gemm_ceiling 60 python3 bench/gpu_gemm_ceiling.py &&
    grep '^{' "$OUTDIR/gemm_ceiling.log" | tail -1 >>"$JSON"
  part dsc_step 300 "$BUILD/bench/train_step" examples/gpt2.dsm --backend cuda --precision bf16 \
      --batch 16 --seq 1024 --steps "$STEPS" --warmup 3 &&
    grep '^{' "$OUTDIR/dsc_step.log" | tail -1 >>"$JSON"
  part pytorch_step 180 python3 bench/pytorch_gpt2_step.py --device cuda --dtype bf16 \
      --batch 16 --seq 1024 --steps "$STEPS" --warmup 3 &&
    grep '^{' "$OUTDIR/pytorch_step.log" | tail -1 >>"$JSON"
else
  for p in gemm_ceiling dsc_step pytorch_step; do
    STATUS[$p]=$([ "$BENCH" = 1 ] && echo "skipped: no GPU" || echo "skipped: --no-bench")
  done
fi

# ---- the table ----
echo
echo "== dsc GPU check, $(date -u '+%Y-%m-%d %H:%M UTC'), $(head -1 "$OUTDIR/nvidia-smi.log" 2>/dev/null || echo 'no GPU') =="
for p in build gpu_check gemm_ceiling dsc_step pytorch_step; do
  printf '  %-13s %s\n' "$p" "${STATUS[$p]:-not run}"
done
if [ -s "$JSON" ]; then
  python3 - "$JSON" <<'EOF'
import json, sys
rows = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    rows[r["impl"]] = r
ceil = rows.get("gemm-ceiling", {}).get("tflops")
print(f"\n  bf16 GEMM ceiling: {ceil} TFLOP/s" if ceil else "\n  bf16 GEMM ceiling: n/a")
print(f"  {'impl':<14} {'step ms':>8} {'tokens/s':>10} {'TFLOP/s':>8} {'MFU':>6} {'peak GiB':>9} {'vs torch':>8}")
torch_s = rows.get("pytorch-cuda", {}).get("step_s_median")
for k in ("dsc-cuda", "pytorch-cuda"):
    r = rows.get(k)
    if not r:
        print(f"  {k:<14} {'n/a':>8}")
        continue
    s = r["step_s_median"]
    tok = r["batch"] * r["seq"] / s
    # model FLOPs: the step's matmul work (dsc counts its graph, PyTorch
    # estimates the same model), the usual MFU numerator
    gf = r.get("gflop_matmul") or rows.get("dsc-cuda", {}).get("gflop_matmul") or r.get("gflop_est")
    tf = gf / s / 1e3 if gf else None
    mfu = f"{100 * tf / ceil:5.1f}%" if tf and ceil else "  n/a"
    mem = r.get("peak_mem_bytes")
    mem = f"{mem / 2**30:9.2f}" if mem else f"{'n/a':>9}"
    ratio = f"{torch_s / s:7.2f}x" if torch_s else "    n/a"
    print(f"  {k:<14} {1e3 * s:8.1f} {tok:10.0f} {tf or 0:8.1f} {mfu:>6} {mem} {ratio}")
EOF
fi
say "done"
exit $FAILED
