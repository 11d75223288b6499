#!/usr/bin/env bash
# The Code generation benchmark: GPT-2 124M training step (B=4, T=64, f32,
# 2 threads) on dsc's cpu backend against PyTorch eager and dsc's
# interpreter, and the machine's FMA peak.
#
#   bench/codegen.sh [--build DIR] [--steps N] [--interp-steps N] [--threads N]
#                    [--attn sdpa|math] [--no-interp] [--no-pytorch]
#   bench/codegen.sh --table FILE     (only print the table of a JSON file)
#
# Builds (Release, DIR default build/bench-release) if needed, creates the
# venv build/bench-venv with torch from PyPI if missing, then runs in one go:
# fma_peak, dsc cpu step, PyTorch step, dsc interp step (slow: --interp-steps
# defaults to 1). Prints a table; the JSON lines go to build/bench/codegen.json.
# Exit 0 when every part that could run ran; 1 when one failed.
set -uo pipefail

SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=$SRC/build/bench-release
STEPS=5
INTERP_STEPS=1
THREADS=2
ATTN=sdpa
RUN_INTERP=1
RUN_PYTORCH=1
TABLE_ONLY=
B=4
T=64
MODEL=$SRC/examples/gpt2.dsm

usage() { sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --build) BUILD=$(realpath -m "${2:?}"); shift ;;
    --steps) STEPS=${2:?}; shift ;;
    --interp-steps) INTERP_STEPS=${2:?}; shift ;;
    --threads) THREADS=${2:?}; shift ;;
    --attn) ATTN=${2:?}; shift ;;
    --no-interp) RUN_INTERP=0 ;;
    --no-pytorch) RUN_PYTORCH=0 ;;
    --table) TABLE_ONLY=$(realpath -m "${2:?}"); shift ;;
    -h|--help) usage 0 ;;
    *) echo "codegen.sh: unknown option '$1'" >&2; usage ;;
  esac
  shift
done
for v in "$STEPS" "$INTERP_STEPS" "$THREADS"; do
  [[ "$v" =~ ^[1-9][0-9]*$ ]] || { echo "codegen.sh: counts must be positive integers" >&2; exit 2; }
done

# ---- the table of a JSON file ----
print_table() {
python3 - "$1" <<'EOF'
import json, sys
rows = {}
for line in open(sys.argv[1]):
    line = line.strip()
    if line:
        r = json.loads(line)
        rows[r["impl"]] = r
peak = rows.get("fma_peak", {}).get("gflops")
ISSUE_PEAK = 374.0  # the issue's figure for these 2-core AVX-512 machines
# The step's work, counted on dsc's train_step graph (bench/train_step.c);
# PyTorch runs the same model, so the same count applies to it.
gflop = next((rows[k]["gflop"] for k in ("dsc-cpu", "dsc-interp") if k in rows), None)
if gflop is None and "pytorch" in rows:
    gflop = rows["pytorch"].get("gflop_est")
def t(k):
    return rows[k]["step_s_median"] if k in rows else None
print()
if peak:
    print(f"FMA peak ({rows['fma_peak']['isa']}, {rows['fma_peak']['threads']} threads): "
          f"{peak:.1f} GFLOP/s measured (the issue's figure: {ISSUE_PEAK:.0f})")
if gflop:
    print(f"work per step: {gflop:.1f} GFLOP (GPT-2 124M, B=4, T=64, f32)")
print()
print(f"{'impl':<12} {'step s':>9} {'steps':>5} {'GFLOP/s':>9} {'% peak':>7} {'% 374':>6} "
      f"{'vs pytorch':>10}")
for k in ("dsc-cpu", "pytorch", "dsc-interp"):
    if k not in rows:
        print(f"{k:<12} {'n/a':>9}")
        continue
    s = t(k)
    gfs = gflop / s if gflop else None
    pk = f"{100 * gfs / peak:6.1f}%" if gfs and peak else "    n/a"
    p374 = f"{100 * gfs / ISSUE_PEAK:5.1f}%" if gfs else "   n/a"
    vs = f"{t('pytorch') / s:9.2f}x" if t("pytorch") else "       n/a"
    print(f"{k:<12} {s:9.4f} {rows[k]['steps']:5d} {gfs or 0:9.1f} {pk:>7} {p374:>6} {vs:>10}")
print()
if t("dsc-cpu") and t("dsc-interp"):
    print(f"dsc-cpu vs interp:  {t('dsc-interp') / t('dsc-cpu'):.1f}x faster")
if t("dsc-cpu") and t("pytorch"):
    sp = t("pytorch") / t("dsc-cpu")
    print(f"dsc-cpu vs pytorch: {sp:.2f}x (speedup = pytorch_time / dsc_time; target >= 1.3x: "
          f"{'met' if sp >= 1.3 else 'NOT met'})")
if t("dsc-cpu") and gflop and peak:
    frac = gflop / t("dsc-cpu") / peak
    frac374 = gflop / t("dsc-cpu") / ISSUE_PEAK
    print(f"dsc-cpu of FMA peak: {100 * frac:.1f}% of measured, {100 * frac374:.1f}% of 374 "
          f"(target >= 50% of the measured peak: {'met' if frac >= 0.5 else 'NOT met'})")
if "pytorch" in rows:
    p = rows["pytorch"]
    print(f"pytorch {p['torch']}, attention: {p['attention']}")
EOF
}
if [ -n "$TABLE_ONLY" ]; then
  [ -f "$TABLE_ONLY" ] || { echo "codegen.sh: no file '$TABLE_ONLY'" >&2; exit 2; }
  print_table "$TABLE_ONLY"
  exit
fi

OUT=$SRC/build/bench
VENV=$SRC/build/bench-venv
mkdir -p "$OUT"
JSON=$OUT/codegen.json
: > "$JSON"
status=0
log() { echo "== $*" >&2; }

# ---- build (Release) ----
if [ ! -f "$BUILD/build.ninja" ]; then
  log "configuring $BUILD (Release)"
  cmake -S "$SRC" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDSC_BUILD_TESTS=OFF \
    -DDSC_BUILD_BENCH=ON >"$OUT/configure.log" 2>&1 \
    || { echo "codegen.sh: cmake failed, see $OUT/configure.log" >&2; exit 1; }
fi
targets=(fma_peak)
# train_step exists only once the executor (runtime/exec.c) does.
if ninja -C "$BUILD" -t targets all 2>/dev/null | grep -q '^train_step:'; then
  targets+=(train_step)
else
  # a new runtime/exec.c needs a re-configure to add the target
  cmake "$BUILD" >>"$OUT/configure.log" 2>&1
  ninja -C "$BUILD" -t targets all 2>/dev/null | grep -q '^train_step:' && targets+=(train_step)
fi
log "building ${targets[*]} in $BUILD"
ninja -C "$BUILD" -j2 "${targets[@]}" >"$OUT/build.log" 2>&1 \
  || { echo "codegen.sh: build failed, see $OUT/build.log" >&2; exit 1; }
HAVE_DSC=0
[ -x "$BUILD/bench/train_step" ] && [[ " ${targets[*]} " == *" train_step "* ]] && HAVE_DSC=1
[ $HAVE_DSC = 1 ] || { log "no train_step (runtime/exec.c missing): dsc rows skipped"; status=1; }

# ---- PyTorch venv (PyPI's torch wheel; the CPU-only index is not reachable) ----
if [ $RUN_PYTORCH = 1 ] && ! "$VENV/bin/python" -c 'import torch' 2>/dev/null; then
  log "installing torch into $VENV (large download, once)"
  { python3 -m venv "$VENV" && "$VENV/bin/pip" install -q torch numpy; } >"$OUT/venv.log" 2>&1
  if ! "$VENV/bin/python" -c 'import torch' 2>>"$OUT/venv.log"; then
    echo "codegen.sh: torch did not install, see $OUT/venv.log" >&2
    RUN_PYTORCH=0
    status=1
  fi
fi

# run NAME CMD...: appends the command's JSON line (its last stdout line) to $JSON.
run() {
  local name=$1; shift
  log "$name: $*"
  local line
  if line=$("$@" 2>"$OUT/$name.log" | tail -n 1) && [[ "$line" == "{"* ]]; then
    echo "$line" >> "$JSON"
  else
    echo "codegen.sh: $name failed, see $OUT/$name.log" >&2
    tail -n 5 "$OUT/$name.log" >&2
    status=1
  fi
}

LOAD0=$(cut -d' ' -f1 /proc/loadavg)
log "load before the runs: $(cut -d' ' -f1-3 /proc/loadavg) (2 cores; other work skews the figures)"
run fma_peak "$BUILD/bench/fma_peak" --threads "$THREADS"
if [ $HAVE_DSC = 1 ]; then
  run dsc-cpu "$BUILD/bench/train_step" "$MODEL" --backend cpu --threads "$THREADS" \
    --batch $B --seq $T --steps "$STEPS" --warmup 1
fi
if [ $RUN_PYTORCH = 1 ]; then
  run pytorch "$VENV/bin/python" "$SRC/bench/pytorch_gpt2_step.py" --threads "$THREADS" \
    --batch $B --seq $T --steps "$STEPS" --warmup 2 --attn "$ATTN"
fi
if [ $HAVE_DSC = 1 ] && [ $RUN_INTERP = 1 ]; then
  run dsc-interp "$BUILD/bench/train_step" "$MODEL" --backend interp --threads "$THREADS" \
    --batch $B --seq $T --steps "$INTERP_STEPS" --warmup 0
fi
log "load after the runs: $(cut -d' ' -f1-3 /proc/loadavg)"

print_table "$JSON"
if awk "BEGIN{exit !($LOAD0 > 1.0)}"; then
  echo "WARNING: load average was $LOAD0 before the runs: other work shared the 2 cores, so" \
    "the times above are too slow and the ratios unreliable; rerun on an idle machine"
fi
echo "JSON lines: $JSON"
exit $status
