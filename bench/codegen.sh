#!/usr/bin/env bash
# The Code generation benchmark: GPT-2 124M training step (B=4, T=64, 2
# threads) on dsc's cpu backend (f32 and bf16) against PyTorch eager and
# dsc's interpreter, the machine's FMA peak, the executor's cold and warm
# compile times, and (--load) the same steps under a background load.
#
#   bench/codegen.sh [--build DIR] [--model gpt2|gpt-tiny] [--steps N]
#                    [--interp-steps N] [--threads N] [--attn sdpa|math]
#                    [--isa avx512|avx2|baseline] [--venv DIR]
#                    [--load | --background N] [--no-bf16] [--no-pytorch-bf16]
#                    [--no-interp] [--no-pytorch]
#   bench/codegen.sh --table FILE     (only print the table of a JSON file)
#
# Builds (Release, DIR default build/bench-release) if needed, creates the
# venv (--venv DIR, else $BENCH_VENV, else build/bench-venv) with torch from
# PyPI if missing, then runs in one go: fma_peak; dsc cpu once on an empty
# kernel cache (cold compile, 1 step) and timed on the same cache (warm);
# dsc cpu bf16, then f32 and bf16 in one process with their steps
# alternating (the bf16/f32 ratio, free of the machine's drift between
# processes); PyTorch f32 and bf16 (autocast); with --load (one busy
# process per core) or --background N (N of them) dsc's and PyTorch's steps
# again under that load, the busy processes started before and killed after
# each timed part; last the dsc interp step (slow: --interp-steps defaults to
# 1). --isa lowers the ISA: DSC_CPU_ISA for dsc, the probe's --isa, and
# PyTorch's ATEN_CPU_CAPABILITY / ONEDNN_MAX_CPU_ISA / MKL_ENABLE_INSTRUCTIONS
# when below the host's. --model gpt-tiny (examples/gpt-tiny.dsm) for a quick
# check of the script. Prints a table with the CPU, the ISA and the load
# average before and after; figures taken at a 1-minute load above 0.5
# before the run are marked unreliable. The JSON lines go to
# build/bench/codegen.json. Exit 0 when every part that could run ran; 1
# when one failed.
set -uo pipefail

SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=$SRC/build/bench-release
VENV=${BENCH_VENV:-$SRC/build/bench-venv}
STEPS=5
INTERP_STEPS=1
THREADS=2
ATTN=sdpa
ISA=${DSC_CPU_ISA:-}
MODEL_NAME=gpt2
BACKGROUND=0
RUN_BF16=1
RUN_PYTORCH_BF16=1
RUN_INTERP=1
RUN_PYTORCH=1
TABLE_ONLY=
B=4
T=64
NCPU=$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2)

usage() { sed -n '2,29p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --build) BUILD=$(realpath -m "${2:?}"); shift ;;
    --model) MODEL_NAME=${2:?}; shift ;;
    --steps) STEPS=${2:?}; shift ;;
    --interp-steps) INTERP_STEPS=${2:?}; shift ;;
    --threads) THREADS=${2:?}; shift ;;
    --attn) ATTN=${2:?}; shift ;;
    --isa) ISA=${2:?}; shift ;;
    --venv) VENV=$(realpath -m "${2:?}"); shift ;;
    --load) BACKGROUND=$NCPU ;;
    --background) BACKGROUND=${2:?}; shift ;;
    --no-bf16) RUN_BF16=0; RUN_PYTORCH_BF16=0 ;;
    --no-pytorch-bf16) RUN_PYTORCH_BF16=0 ;;
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
if ! [[ "$BACKGROUND" =~ ^[0-9]+$ ]] || [ "$BACKGROUND" -gt 256 ]; then
  echo "codegen.sh: --background takes a count of busy processes (0-256)" >&2
  exit 2
fi
case "$MODEL_NAME" in
  gpt2|gpt-tiny) ;;
  *) echo "codegen.sh: --model is gpt2 or gpt-tiny (the models bench/pytorch_gpt2_step.py has)" >&2; exit 2 ;;
esac
case "$ISA" in
  ''|avx512|avx2|baseline) ;;
  *) echo "codegen.sh: --isa is avx512, avx2 or baseline" >&2; exit 2 ;;
esac
case "$ATTN" in
  sdpa|math) ;;
  *) echo "codegen.sh: --attn is sdpa or math" >&2; exit 2 ;;
esac
MODEL=$SRC/examples/$MODEL_NAME.dsm

# ---- the table of a JSON file ----
print_table() {
python3 - "$1" <<'EOF'
import json, sys
rows = {}
for line in open(sys.argv[1]):
    line = line.strip()
    if line:
        r = json.loads(line)
        rows[r.get("row", r["impl"])] = r  # older files: one row per impl
meta = rows.get("bench", {})
fp = rows.get("fma_peak", {})
peak = fp.get("gflops")
ISSUE_PEAK = 374.0  # the issue's figure for these 2-core AVX-512 machines
load0 = meta.get("load_before")
unreliable = load0 is not None and float(load0.split()[0]) > 0.5
mark = " *" if unreliable else ""
# The step's work, counted on dsc's train_step graph (bench/train_step.c);
# PyTorch runs the same model, so the same count applies to it.
gflop = next((rows[k]["gflop"] for k in ("dsc-cpu", "dsc-cpu-cold", "dsc-interp", "dsc-cpu-bf16")
              if k in rows), None)
if gflop is None and "pytorch" in rows:
    gflop = rows["pytorch"].get("gflop_est")
def t(k):
    return rows[k]["step_s_median"] if k in rows else None
def others(k):  # other processes' share of the CPUs during the part; "!" above 10%
    f = rows.get(k, {}).get("others_cpu_frac")
    return f"{100 * f:5.0f}%{'!' if f > 0.1 else ' '}" if f is not None else f"{'':>7}"
busy = [k for k, r in rows.items() if (r.get("others_cpu_frac") or 0) > 0.1]
def pt_of(k):  # the PyTorch row of the same precision and load
    base, _, load = k.partition("@")
    p = "pytorch-bf16" if base.endswith("bf16") else "pytorch"
    return p + ("@" + load if load else "")
print()
cpu = fp.get("cpu") or meta.get("cpu_model")
if cpu:
    core = fp.get("core")
    fam = f", family {fp['family']} model {fp['model']}" if "family" in fp else ""
    print(f"CPU: {cpu}" + (f" ({core}{fam})" if core else "") +
          (f", {meta['nproc']} CPUs online" if "nproc" in meta else ""))
isa = fp.get("isa") or meta.get("isa")
if isa:
    src = meta.get("isa_source", "")
    print(f"ISA: {isa}" + (f" ({src})" if src else ""))
if meta:
    print(f"load average (1, 5, 15 min): {meta.get('load_before', '?')} before the run, "
          f"{meta.get('load_after', '?')} after")
if unreliable:
    print(f"* unreliable (load {load0.split()[0]} before the run): other work shared the cores; "
          "rerun on an idle machine")
if peak:
    line = f"FMA peak ({fp['isa']}, {fp['threads']} threads): {peak:.1f} GFLOP/s measured"
    if fp.get("expected_gflops"):
        line += (f", {fp['expected_gflops']:.1f} expected ({fp['flop_per_cycle']:.0f} FLOP/cycle "
                 f"x {fp['cores']} cores x {fp['clock_ghz']:.2f} GHz, the clock measured; "
                 f"nominal {fp['nominal_ghz']:.2f}): {fp['pct_expected']:.0f}%")
        if fp["clock_ghz"] < fp.get("nominal_ghz", 0):
            line += "; the measured clock is below the nominal one: the cores were shared"
            if "expected_gflops_nominal" in fp:
                line += f" (at the nominal clock: {fp['expected_gflops_nominal']:.1f} expected)"
    else:
        line += f" (the issue's figure: {ISSUE_PEAK:.0f})"
    print(line + mark)
    if fp.get("warning"):
        print(f"WARNING (fma_peak): {fp['warning']}")
if gflop:
    mdl = meta.get("model", "gpt2")
    b, s = meta.get("batch", 4), meta.get("seq", 64)
    print(f"work per step: {gflop:.1f} GFLOP ({mdl}, B={b}, T={s}; bf16 rows: the same count, "
          "the % against the f32 peak)")
print()
print(f"{'impl':<14} {'step s':>9} {'steps':>5} {'GFLOP/s':>9} {'% peak':>7} {'% 374':>6} "
      f"{'vs pytorch':>10} {'exec_new s':>10} {'others':>7}")
order = ["dsc-cpu", "dsc-cpu-bf16", "pytorch", "pytorch-bf16", "dsc-interp"]
for k in order:
    if k not in rows:
        if k in ("dsc-cpu", "pytorch", "dsc-interp"):
            print(f"{k:<14} {'n/a':>9}")
        continue
    s = t(k)
    gfs = gflop / s if gflop else None
    pk = f"{100 * gfs / peak:6.1f}%" if gfs and peak else "    n/a"
    p374 = f"{100 * gfs / ISSUE_PEAK:5.1f}%" if gfs else "   n/a"
    vs = f"{t(pt_of(k)) / s:9.2f}x" if t(pt_of(k)) else "       n/a"
    en = rows[k].get("exec_new_s")
    en = f"{en:10.2f}" if en is not None else f"{'':>10}"
    print(f"{k:<14} {s:9.4f} {rows[k]['steps']:5d} {gfs or 0:9.1f} {pk:>7} {p374:>6} {vs:>10} "
          f"{en} {others(k)}{mark}")
print()
if "dsc-cpu-cold" not in rows and rows.get("dsc-cpu", {}).get("exec_new_s") is not None:
    print(f"executor build (dsc_exec_new, f32): {rows['dsc-cpu']['exec_new_s']:.2f} s "
          "(the kernel cache's state not recorded)")
elif "dsc-cpu-cold" in rows:
    cold = rows.get("dsc-cpu-cold", {}).get("exec_new_s")
    warm = rows.get("dsc-cpu", {}).get("exec_new_s")
    f = lambda v: f"{v:.2f} s" if v is not None else "n/a"
    print(f"executor build (dsc_exec_new, f32): cold {f(cold)} (empty DSC_CACHE_DIR), "
          f"warm {f(warm)} (the same directory){mark}")
    if "dsc-cpu-bf16" in rows:
        print(f"  bf16: {f(rows['dsc-cpu-bf16'].get('exec_new_s'))} (its first run on that "
              "cache: the kernels bf16 does not share with f32 compile)")
if t("dsc-cpu") and t("dsc-interp"):
    print(f"dsc-cpu vs interp:  {t('dsc-interp') / t('dsc-cpu'):.1f}x faster")
if t("dsc-cpu") and t("pytorch"):
    sp = t("pytorch") / t("dsc-cpu")
    print(f"dsc-cpu vs pytorch: {sp:.2f}x (speedup = pytorch_time / dsc_time; target >= 1.3x: "
          f"{'met' if sp >= 1.3 else 'NOT met'}){mark}")
if t("dsc-cpu-bf16") and t("pytorch-bf16"):
    print(f"dsc-cpu-bf16 vs pytorch-bf16: {t('pytorch-bf16') / t('dsc-cpu-bf16'):.2f}x{mark}")
pair = rows.get("dsc-bf16-pair", {}).get("step_ratio_median")
if pair:
    n = rows["dsc-bf16-pair"].get("steps", "?")
    print(f"dsc bf16 / f32, steps alternating in one process (median of {n} pairs): "
          f"{pair:.3f} (target <= 1: {'met' if pair <= 1 else 'NOT met'}){mark}")
if t("dsc-cpu") and gflop and peak:
    frac = gflop / t("dsc-cpu") / peak
    frac374 = gflop / t("dsc-cpu") / ISSUE_PEAK
    print(f"dsc-cpu of FMA peak: {100 * frac:.1f}% of measured, {100 * frac374:.1f}% of 374 "
          f"(target >= 50% of the measured peak: {'met' if frac >= 0.5 else 'NOT met'}){mark}")
loaded = [k for k in order if k + "@load" in rows]
if loaded:
    n = rows[loaded[0] + "@load"].get("background", "?")
    print()
    print(f"under load: {n} busy processes (one spinning shell each), started before and "
          "killed after each timed part")
    print(f"{'impl':<14} {'idle s':>9} {'loaded s':>9} {'slowdown':>9} {'others idle':>11} "
          f"{'loaded':>7}")
    for k in loaded:
        i, l = t(k), t(k + "@load")
        sl = f"{l / i:8.2f}x" if i else "      n/a"
        print(f"{k:<14} {i or 0:9.4f} {l:9.4f} {sl:>9} {others(k):>11} {others(k + '@load')}"
              f"{mark}")
    for d, p in (("dsc-cpu", "pytorch"), ("dsc-cpu-bf16", "pytorch-bf16")):
        if not all(t(x) for x in (d, p, d + "@load", p + "@load")):
            continue
        ri, rl = t(p) / t(d), t(p + "@load") / t(d + "@load")
        sd, sp = t(d + "@load") / t(d), t(p + "@load") / t(p)
        print(f"{d} vs {p}: {ri:.2f}x idle, {rl:.2f}x loaded; slowdown {sd:.2f}x against "
              f"{sp:.2f}x (target: slowdown no worse than PyTorch's: "
              f"{'met' if sd <= sp else 'NOT met'}; loaded >= 1.3x: "
              f"{'met' if rl >= 1.3 else 'NOT met'}){mark}")
if any("others_cpu_frac" in r for r in rows.values()):
    print("others: the share of all CPUs that processes outside the bench (and its busy "
          "processes) took during that part" + ("; '!' above 10%: " + ", ".join(busy) +
          " ran beside other work, their figures are unreliable" if busy else ""))
if "pytorch" in rows:
    p = rows["pytorch"]
    print(f"pytorch {p['torch']}, attention: {p['attention']}")
if unreliable:
    print(f"* unreliable (load {load0.split()[0]} before the run)")
EOF
}
if [ -n "$TABLE_ONLY" ]; then
  [ -f "$TABLE_ONLY" ] || { echo "codegen.sh: no file '$TABLE_ONLY'" >&2; exit 2; }
  print_table "$TABLE_ONLY"
  exit
fi

OUT=$SRC/build/bench
mkdir -p "$OUT"
JSON=$OUT/codegen.json
: > "$JSON"
status=0
log() { echo "== $*" >&2; }

# ---- the background load, never left behind ----
BG_PIDS=()
CACHE=
RUN_PID=
start_background() {
  local i
  for ((i = 0; i < BACKGROUND; i++)); do
    sh -c 'while :; do :; done' &
    BG_PIDS+=($!)
  done
}
stop_background() {
  [ ${#BG_PIDS[@]} -gt 0 ] || return 0
  kill "${BG_PIDS[@]}" 2>/dev/null
  wait "${BG_PIDS[@]}" 2>/dev/null
  BG_PIDS=()
}
# shellcheck disable=SC2317  # (the functions below are called indirectly)
cleanup() {
  [ -n "$RUN_PID" ] && kill "$RUN_PID" 2>/dev/null
  stop_background
  [ -n "$CACHE" ] && rm -rf "$CACHE"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

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

# ---- the ISA: dsc's, the probe's and (when lowered) PyTorch's ----
HOST_ISA=$(env -u DSC_CPU_ISA "$BUILD/bench/fma_peak" --threads 1 --trials 1 --ms 1 \
  2>/dev/null | sed -n 's/.*"isa":"\([a-z0-9]*\)".*/\1/p')
DSC_ENV=(env -u DSC_CPU_ISA)
TORCH_ENV=(env)
if [ -n "$ISA" ]; then
  DSC_ENV=(env "DSC_CPU_ISA=$ISA")
  ISA_SOURCE="DSC_CPU_ISA=$ISA for dsc, the probe's --isa $ISA"
  if [ "$ISA" != "${HOST_ISA:-avx512}" ]; then
    case "$ISA" in
      avx2) TORCH_ENV=(env ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2) ;;
      baseline) TORCH_ENV=(env ATEN_CPU_CAPABILITY=default ONEDNN_MAX_CPU_ISA=SSE41 MKL_ENABLE_INSTRUCTIONS=SSE4_2) ;;
    esac
    ISA_SOURCE+="; PyTorch: ${TORCH_ENV[*]:1}"
  fi
  PROBE_ISA=(--isa "$ISA")
else
  ISA_SOURCE="the host's best; DSC_CPU_ISA unset"
  PROBE_ISA=()
fi

# CPU time in clock ticks: all CPUs' busy time (/proc/stat: user nice system
# irq softirq steal), the script's reaped children's (its own is ~0), the
# busy processes' while they run.
CLK_TCK=$(getconf CLK_TCK 2>/dev/null || echo 100)
cpu_busy() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 + $9 }' /proc/stat; }
own_cpu() { sed 's/^.*) //' "/proc/$$/stat" | awk '{ print $12 + $13 + $14 + $15 }'; }
bg_cpu() {
  local p sum=0 v
  for p in "${BG_PIDS[@]}"; do
    v=$(sed 's/^.*) //' "/proc/$p/stat" 2>/dev/null | awk '{ print $12 + $13 }')
    sum=$((sum + ${v:-0}))
  done
  echo "$sum"
}
# run ROW CMD...: appends the command's JSON line (its last stdout line) to
# $JSON, tagged with the row's name, the background load it ran under and
# the share of the CPUs that other processes took meanwhile (others_cpu_frac).
# The command runs in the background and is waited for, so that a signal to
# the script stops it at once (cleanup kills it and the busy processes).
run() {
  local name=$1; shift
  log "$name: $*"
  local line rc bg=${#BG_PIDS[@]} t0 t1 busy0 busy1 own0 own1 others
  t0=$(date +%s.%N) busy0=$(cpu_busy) own0=$(($(own_cpu) + $(bg_cpu)))
  "$@" >"$OUT/$name.out" 2>"$OUT/$name.log" &
  RUN_PID=$!
  wait "$RUN_PID"
  rc=$?
  RUN_PID=
  t1=$(date +%s.%N) busy1=$(cpu_busy) own1=$(($(own_cpu) + $(bg_cpu)))
  # the share of all CPUs that other processes took while it ran
  others=$(awk -v b="$((busy1 - busy0))" -v o="$((own1 - own0))" \
    -v t0="$t0" -v t1="$t1" -v n="$NCPU" -v hz="$CLK_TCK" \
    'BEGIN { f = (b - o) / hz / ((t1 - t0) * n); printf "%.3f", f < 0 ? 0 : f }')
  line=$(tail -n 1 "$OUT/$name.out")
  if [ $rc = 0 ] && [[ "$line" == "{"*"}" ]]; then
    echo "${line%\}},\"row\":\"$name\",\"background\":$bg,\"others_cpu_frac\":$others}" >> "$JSON"
  else
    echo "codegen.sh: $name failed (exit $rc), see $OUT/$name.log" >&2
    tail -n 5 "$OUT/$name.log" >&2
    status=1
  fi
}
# shellcheck disable=SC2317
# The timed parts, each run idle (SUFFIX '') and under load (SUFFIX @load).
dsc_step() { # ROW PRECISION
  run "$1" "${DSC_ENV[@]}" "DSC_CACHE_DIR=$CACHE" "$BUILD/bench/train_step" "$MODEL" \
    --backend cpu --threads "$THREADS" --batch "$B" --seq "$T" --steps "$STEPS" --warmup 1 \
    --precision "$2"
}
# shellcheck disable=SC2317
dsc_pair() { # ROW: f32 and bf16 in one process, their steps alternating
  run "$1" "${DSC_ENV[@]}" "DSC_CACHE_DIR=$CACHE" "$BUILD/bench/train_step" "$MODEL" \
    --backend cpu --threads "$THREADS" --batch "$B" --seq "$T" --steps "$((2 * STEPS))" \
    --warmup 1 --precision f32,bf16
}
# shellcheck disable=SC2317
pytorch_step() { # ROW DTYPE
  run "$1" "${TORCH_ENV[@]}" "$VENV/bin/python" "$SRC/bench/pytorch_gpt2_step.py" \
    --model "$MODEL_NAME" --threads "$THREADS" --batch "$B" --seq "$T" --steps "$STEPS" \
    --warmup 2 --attn "$ATTN" --dtype "$2"
}
part() { # LOADED CMD...: CMD, under the background load when LOADED is 1
  local loaded=$1; shift
  [ "$loaded" = 1 ] && start_background
  "$@"
  stop_background
}
timed_parts() { # SUFFIX
  local sfx=$1 loaded=0
  [ -n "$sfx" ] && loaded=1
  if [ $HAVE_DSC = 1 ]; then
    part $loaded dsc_step "dsc-cpu$sfx" f32
    [ $RUN_BF16 = 1 ] && part $loaded dsc_step "dsc-cpu-bf16$sfx" bf16
    # the rows above are processes a minute apart; the ratio bf16 / f32 from
    # steps alternating in one process does not move with the machine's drift
    [ $RUN_BF16 = 1 ] && [ -z "$sfx" ] && part 0 dsc_pair "dsc-bf16-pair"
  fi
  if [ $RUN_PYTORCH = 1 ]; then
    part $loaded pytorch_step "pytorch$sfx" f32
    [ $RUN_PYTORCH_BF16 = 1 ] && part $loaded pytorch_step "pytorch-bf16$sfx" bf16
  fi
}

# The kernel cache: always explicit (the default may be ~/.cache/dsc) and
# new, so the first dsc run compiles everything (cold) and the next reuse it.
CACHE=$(mktemp -d "$OUT/kernel-cache.XXXXXX")
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
log "load before the runs: $LOAD0 ($NCPU CPUs; other work skews the figures)"
run fma_peak "$BUILD/bench/fma_peak" --threads "$THREADS" "${PROBE_ISA[@]}"
if [ $HAVE_DSC = 1 ]; then
  run dsc-cpu-cold "${DSC_ENV[@]}" "DSC_CACHE_DIR=$CACHE" "$BUILD/bench/train_step" "$MODEL" \
    --backend cpu --threads "$THREADS" --batch "$B" --seq "$T" --steps 1 --warmup 0
fi
timed_parts ""
[ "$BACKGROUND" -gt 0 ] && timed_parts "@load"
if [ $HAVE_DSC = 1 ] && [ $RUN_INTERP = 1 ]; then
  run dsc-interp "${DSC_ENV[@]}" "$BUILD/bench/train_step" "$MODEL" --backend interp \
    --threads "$THREADS" --batch "$B" --seq "$T" --steps "$INTERP_STEPS" --warmup 0
fi
LOAD1=$(cut -d' ' -f1-3 /proc/loadavg)
log "load after the runs: $LOAD1"

export BENCH_MODEL=$MODEL_NAME BENCH_B=$B BENCH_T=$T BENCH_THREADS=$THREADS \
  BENCH_NCPU=$NCPU BENCH_ISA=${ISA:-$HOST_ISA} BENCH_ISA_SOURCE=$ISA_SOURCE \
  BENCH_BACKGROUND=$BACKGROUND BENCH_LOAD0=$LOAD0 BENCH_LOAD1=$LOAD1 BENCH_STEPS=$STEPS
BENCH_CPU_MODEL=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1) \
python3 - "$JSON" <<'EOF'
import datetime, json, os, sys
e = os.environ
meta = {"impl": "bench", "row": "bench", "model": e["BENCH_MODEL"], "batch": int(e["BENCH_B"]),
        "seq": int(e["BENCH_T"]), "threads": int(e["BENCH_THREADS"]),
        "nproc": int(e["BENCH_NCPU"]), "cpu_model": e["BENCH_CPU_MODEL"],
        "isa": e["BENCH_ISA"], "isa_source": e["BENCH_ISA_SOURCE"],
        "background": int(e["BENCH_BACKGROUND"]), "steps": int(e["BENCH_STEPS"]),
        "load_before": e["BENCH_LOAD0"], "load_after": e["BENCH_LOAD1"],
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
with open(sys.argv[1], "a") as f:
    f.write(json.dumps(meta) + "\n")
EOF
print_table "$JSON"
echo "JSON lines: $JSON"
exit $status
