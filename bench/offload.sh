#!/usr/bin/env bash
# The cost of offloading the optimizer step, side by side in one run: GPT-2
# (124M, f32, B=4, T=64, grad_accum 1) trained with no offload; with
# ZeRO-Offload's host step (--offload-optimizer host: the states on the host,
# the gradients copied out during the backward, AdamW on the host, the params
# copied back) one instruction at a time (--offload-overlap false, "sync")
# and on the host stream's own thread beside the device's work
# (--offload-overlap true, "overlap"); with the delayed parameter update (--delayed-param-update true: the
# step applies the previous gradient, so the host's update can go beside
# the whole forward and backward); and ZenFlow (--zenflow true: the top 10%
# of each weight's columns updated on the device every step, the host's
# update every 4 steps; one rank only, it is not built for ZeRO stages 1-3
# at world > 1). For each: the median step time over steps 2..N (over all
# --reps runs, which go round the modes in turn so that a change of the
# machine's load hits every mode alike) and the mean (ZenFlow's steps are
# not alike: its host update runs every 4th step and is skipped in the
# others, so its cost is the mean over whole rounds: --steps 1+4k), from --profile the time in copies
# and the host kernels' time and GB/s; from --trace the host stream's work
# per step and the share of it hidden behind the device's; and
# bench/mem_bw's copy / triad / AdamW-stream bandwidth on the same threads
# over the bytes the host kernels move, the bound for the host step.
# --no-clip trains every mode with gradient_clipping 0: with clipping each
# update needs the norm of every gradient, so it cannot start during the
# backward; without, each param's update goes beside the backward.
# --overlap V gives the delayed and ZenFlow modes --offload-overlap V
# (default auto, what a user gets: the stream's own thread only where
# --threads leaves a core free).
#
#   bench/offload.sh [--dsc PATH] [--mem-bw PATH] [--model FILE] [--steps N]
#                    [--threads N] [--ranks N] [--batch B] [--seq T] [--reps R]
#                    [--no-clip] [--overlap true|false|auto] [--out DIR]
#
# --mem-bw defaults to bench/mem_bw beside dsc's build (DSC_DIR/bench/mem_bw).
# --ranks N trains N in-process ranks at ZeRO stage 2 (--threads each).
# Prints the CPU and load, a table, the ratios to no offload, and one JSON
# line ("impl":"offload_bench"). Exit 1 when a run fails.
set -uo pipefail

SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DSC=$SRC/build/dsc
MEM_BW=
MODEL=$SRC/examples/gpt2.dsm
STEPS=5
THREADS=$(nproc)
RANKS=1
B=4
T=64
OUT=$SRC/build/bench/offload
REPS=1
CLIP=1
OVERLAP=auto

usage() { sed -n '2,36p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --dsc) DSC=$(realpath -m "${2:?}"); shift ;;
    --mem-bw) MEM_BW=$(realpath -m "${2:?}"); shift ;;
    --model) MODEL=$(realpath -m "${2:?}"); shift ;;
    --steps) STEPS=${2:?}; shift ;;
    --threads) THREADS=${2:?}; shift ;;
    --ranks) RANKS=${2:?}; shift ;;
    --batch) B=${2:?}; shift ;;
    --seq) T=${2:?}; shift ;;
    --out) OUT=$(realpath -m "${2:?}"); shift ;;
    --reps) REPS=${2:?}; shift ;;
    --no-clip) CLIP=0 ;;
    --overlap) OVERLAP=${2:?}; shift ;;
    -h|--help) usage 0 ;;
    *) echo "bench/offload.sh: unknown option '$1'" >&2; usage ;;
  esac
  shift
done
[ -x "$DSC" ] || { echo "bench/offload.sh: no dsc at $DSC (build first)" >&2; exit 1; }
MEM_BW=${MEM_BW:-$(dirname "$DSC")/bench/mem_bw}
[ "$STEPS" -ge 2 ] || { echo "bench/offload.sh: --steps must be at least 2 (step 1 is warm-up)" >&2; exit 2; }
mkdir -p "$OUT"
export DSC_CACHE_DIR=${DSC_CACHE_DIR:-$OUT/cache}

# shellcheck source=../tests/cli/lib/corpus.bash
source "$SRC/tests/cli/lib/corpus.bash"
if [ ! -f "$OUT/data_train.bin" ]; then
  make_corpus "$OUT/corpus.txt" 200000
  "$DSC" data "$OUT/corpus.txt" -o "$OUT/data" >/dev/null || exit 1
fi

echo "CPU: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg) before"
echo "$(basename "$MODEL"), f32, B=$B T=$T grad_accum 1, $STEPS steps (median and mean of 2..$STEPS over $REPS runs), $THREADS threads x $RANKS ranks, clipping $([ "$CLIP" = 1 ] && echo "as the model's" || echo off), delayed and ZenFlow with --offload-overlap $OVERLAP"


status=0
declare -A step_ms mean_ms copy_ms host_ms host_gbps stream_ms hidden
modes=(none host overlap delayed)
[ "$RANKS" -eq 1 ] && modes+=(zenflow)
clip_flags=()
if [ "$CLIP" = 0 ]; then
  echo '{"gradient_clipping": 0.0}' >"$OUT/no-clip.json"
  clip_flags=(--deepspeed "$OUT/no-clip.json")
fi
rm -f "$OUT"/*.steps
for ((rep = 1; rep <= REPS; rep++)); do
  for mode in "${modes[@]}"; do
    flags=(--batch "$B" --seq "$T" --grad-accum 1 --steps "$STEPS" --threads "$THREADS"
           --precision f32 --save-every 0 --profile "${clip_flags[@]}")
    [ "$mode" != none ] && flags+=(--offload-optimizer host --trace "$OUT/$mode.trace.json")
    [ "$mode" = host ] && flags+=(--offload-overlap false)
    [ "$mode" = overlap ] && flags+=(--offload-overlap true)
    [ "$mode" = delayed ] && flags+=(--delayed-param-update true --offload-overlap "$OVERLAP")
    [ "$mode" = zenflow ] && flags+=(--zenflow true --offload-overlap "$OVERLAP")
    [ "$RANKS" -gt 1 ] && flags+=(--ranks "$RANKS" --zero-stage 2)
    rm -rf "$OUT/run-$mode"
    if ! "$DSC" train "$MODEL" --data "$OUT/data" --out "$OUT/run-$mode" "${flags[@]}" \
        >"$OUT/$mode.log" 2>&1; then
      echo "bench/offload.sh: the '$mode' run failed ($OUT/$mode.log):" >&2
      tail -3 "$OUT/$mode.log" >&2
      status=1
      continue
    fi
    awk -F'|' '/^step /{split($1, s, "[ /]"); if (s[2] >= 2) {sub(/ ms.*/, "", $6); print $6 + 0}}' \
      "$OUT/$mode.log" >>"$OUT/$mode.steps"
    [ "$rep" -gt 1 ] && continue
    copy_ms[$mode]=$(awk '/^  copy /{print $3; exit}' "$OUT/$mode.log")
    host_ms[$mode]=$(awk '/^  \(host kernels\)/{print $4; exit}' "$OUT/$mode.log")
    host_gbps[$mode]=$(sed -n 's/^  (host kernels).*, \([0-9.]*\) GB\/s$/\1/p' "$OUT/$mode.log" | head -1)
    # the host stream's work per training step (the steps and validation
    # runs of the trace) and the share the device did not wait for
    if [ "$mode" != host ] && [ -f "$OUT/$mode.trace.json" ]; then
      read -r stream_ms[$mode] hidden[$mode] < <(python3 - "$OUT/$mode.trace.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
ev = d["traceEvents"]
track = {e["args"]["name"]: e["tid"] for e in ev if e.get("ph") == "M" and e["name"] == "thread_name"}
steps = [e for e in ev if e.get("tid") == track["step"] and e.get("ph") == "X" and e["name"].startswith("step ")]
busy = sum(e["dur"] for e in ev if e.get("tid") == track["host stream"] and e.get("ph") == "X"
           for s in steps[1:] if s["ts"] <= e["ts"] <= s["ts"] + s["dur"])
share = d["otherData"].get("hidden_host_share")
print("%.1f %s" % (busy / 1e3 / max(len(steps) - 1, 1), "-" if share is None else "%.3f" % share))
PY
)
    fi
  done
done
for mode in "${modes[@]}"; do
  [ -s "$OUT/$mode.steps" ] || continue
  step_ms[$mode]=$(sort -n "$OUT/$mode.steps" | awk '{v[NR] = $1} END {print NR ? (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) : ""}')
  mean_ms[$mode]=$(awk '{s += $1} END {if (NR) printf "%.1f", s / NR}' "$OUT/$mode.steps")
  rm -f "$OUT/$mode.steps"
done

# The bandwidth bound, on the threads one rank uses, over as many bytes as
# the host kernels move per step (the host step's working set).
bw_json=""
mb=$(sed -n 's/^  (host kernels).*  \([0-9.]*\) MB per run.*/\1/p' "$OUT/host.log" 2>/dev/null | head -1)
mib=$(awk -v mb="${mb:-1024}" 'BEGIN {m = int(mb * 1e6 / 1048576); print m < 64 ? 64 : m}')
if [ -x "$MEM_BW" ]; then
  bw_json=$("$MEM_BW" --threads "$THREADS" --mib "$mib" --trials 5) || bw_json=""
fi
bw() { sed -n "s/.*\"kernel\":\"$1\".*\"gbps\":\([0-9.]*\).*/\1/p" <<<"$bw_json"; }

printf '%-34s %10s %10s %10s %10s %12s %12s %12s %8s\n' "mode" "step ms" "x none" "mean ms" \
  "x none" "copies ms" "host ms" "stream ms" "hidden"
for mode in "${modes[@]}"; do
  [ -n "${step_ms[$mode]:-}" ] || continue
  ratio=$(awk -v a="${step_ms[$mode]}" -v b="${step_ms[none]:-0}" 'BEGIN {printf (b > 0 ? "%.3f" : "-"), a / b}')
  mratio=$(awk -v a="${mean_ms[$mode]}" -v b="${mean_ms[none]:-0}" 'BEGIN {printf (b > 0 ? "%.3f" : "-"), a / b}')
  case $mode in
    none) what="no offload" ;;
    host) what="--offload-optimizer host (sync)" ;;
    overlap) what="  overlapped (host stream)" ;;
    delayed) what="  + --delayed-param-update" ;;
    zenflow) what="  + --zenflow true" ;;
  esac
  printf '%-34s %10s %10s %10s %10s %12s %12s %12s %8s\n' "$what" "${step_ms[$mode]}" "$ratio" \
    "${mean_ms[$mode]}" "$mratio" "${copy_ms[$mode]:--}" "${host_ms[$mode]:--}" "${stream_ms[$mode]:--}" "${hidden[$mode]:--}"
done
[ -n "${host_gbps[host]:-}" ] &&
  echo "host kernels of the offloaded step: ${host_gbps[host]} GB/s; this machine's streams over $mib MiB on $THREADS threads: copy $(bw copy), triad $(bw triad), AdamW $(bw adamw) GB/s (bench/mem_bw)"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
num() { [[ "${1:-}" =~ ^[0-9.]+$ ]] && echo "$1" || echo null; }
printf '{"impl":"offload_bench","threads":%s,"ranks":%s,"reps":%s,"clip":%s,"overlap":"%s","step_ms_none":%s,"step_ms_host":%s,"step_ms_overlap":%s,"step_ms_delayed":%s,"step_ms_zenflow":%s,"mean_ms_none":%s,"mean_ms_zenflow":%s,"hidden_host_share_overlap":%s,"hidden_host_share_delayed":%s,"copy_ms_host":%s,"host_kernel_ms":%s,"host_kernel_gbps":%s,"mem_bw_adamw_gbps":%s}\n' \
  "$THREADS" "$RANKS" "$REPS" "$([ "$CLIP" = 1 ] && echo true || echo false)" "$OVERLAP" "${step_ms[none]:-null}" "${step_ms[host]:-null}" "${step_ms[overlap]:-null}" "${step_ms[delayed]:-null}" "${step_ms[zenflow]:-null}" \
  "${mean_ms[none]:-null}" "${mean_ms[zenflow]:-null}" \
  "$(num "${hidden[overlap]:-}")" "$(num "${hidden[delayed]:-}")" "${copy_ms[host]:-null}" \
  "${host_ms[host]:-null}" "${host_gbps[host]:-null}" "$(bw adamw | grep . || echo null)"
exit $status
