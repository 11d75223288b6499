#!/usr/bin/env bash
# Step time at ZeRO stages 0-3 on 2 and 4 MPI ranks (dsc launch), with the
# ratio to stage 0 at the same world and the share of communication hidden
# behind compute (from each run's trace, bench/trace_overlap.py).
#
#   bench/zero.sh [--dsc PATH] [--ranks "2 4"] [--stages "0 1 2 3"] [--steps N]
#                 [--warmup N] [--d D] [--layers L] [--batch B] [--seq T]
#                 [--global-batch G] [--threads N] [--out DIR]
#
# The model is examples/gpt-tiny.dsm widened to d = 256, 4 layers (3.2M
# params, ~0.2 s per step at 2 ranks x 1 thread on a 2-core VM); every run
# trains the same global batch (G = 32 sequences of 64 tokens: grad_accum =
# G / (batch x ranks)). Step time: the median of the steps after the warmup.
# Rows that dsc refuses with "not implemented" say so; other rows still run.
# JSON lines of the rows go to DIR/zero.jsonl (DIR default build/bench/zero),
# the traces to DIR/r<R>-s<S>.json (+ .rank1 ...). Exit 0 when every row ran
# or is not implemented yet; 1 when a run failed otherwise.
set -uo pipefail

SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DSC=$SRC/build/dsc
RANKS="2 4"
STAGES="0 1 2 3"
STEPS=8
WARMUP=2
D=256
LAYERS=4
B=8
T=64
G=32
THREADS=1
OUT=$SRC/build/bench/zero

usage() { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --dsc) DSC=$(realpath -m "${2:?}"); shift ;;
    --ranks) RANKS=${2:?}; shift ;;
    --stages) STAGES=${2:?}; shift ;;
    --steps) STEPS=${2:?}; shift ;;
    --warmup) WARMUP=${2:?}; shift ;;
    --d) D=${2:?}; shift ;;
    --layers) LAYERS=${2:?}; shift ;;
    --batch) B=${2:?}; shift ;;
    --seq) T=${2:?}; shift ;;
    --global-batch) G=${2:?}; shift ;;
    --threads) THREADS=${2:?}; shift ;;
    --out) OUT=$(realpath -m "${2:?}"); shift ;;
    -h|--help) usage 0 ;;
    *) echo "bench/zero.sh: unknown option '$1'" >&2; usage ;;
  esac
  shift
done
[ -x "$DSC" ] || { echo "bench/zero.sh: no dsc at $DSC (build it, or give --dsc PATH)" >&2; exit 1; }
[ "$STEPS" -gt "$WARMUP" ] 2>/dev/null ||
  { echo "bench/zero.sh: --steps must exceed --warmup ($WARMUP)" >&2; exit 1; }
mkdir -p "$OUT" || exit 1
export DSC_CACHE_DIR=${DSC_CACHE_DIR:-$OUT/kernel-cache}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0}

# The model: gpt-tiny with the width and depth given (lib/ next to it).
ln -sfn "$SRC/examples/lib" "$OUT/lib"
sed -e "s/^const vocab = 256, d = 64, heads = 4/const vocab = 256, d = $D, heads = 4/" \
  -e "s/const ctx = 64, layers = 2/const ctx = 64, layers = $LAYERS/" \
  -e 's/^model gpt_tiny/model gpt_zero_bench/' "$SRC/examples/gpt-tiny.dsm" >"$OUT/model.dsm"
grep -q "d = $D, heads" "$OUT/model.dsm" && grep -q "layers = $LAYERS" "$OUT/model.dsm" ||
  { echo "bench/zero.sh: examples/gpt-tiny.dsm changed: cannot set d and layers" >&2; exit 1; }
# The data: a deterministic English-like text of ~350 KB (tests/cli/lib/corpus.bash).
if [ ! -s "$OUT/c_train.bin" ]; then
  # shellcheck source=../tests/cli/lib/corpus.bash
  source "$SRC/tests/cli/lib/corpus.bash"
  make_corpus "$OUT/corpus.txt" 60000
  "$DSC" data "$OUT/corpus.txt" -o "$OUT/c" >/dev/null || exit 1
fi

: >"$OUT/zero.jsonl"
status=0
rows=()
for r in $RANKS; do
  base=""
  for s in $STAGES; do
    tag="r$r-s$s"
    rm -f "$OUT/$tag.json" "$OUT/$tag.json".rank* "$OUT/$tag.jsonl"
    "$DSC" launch -n "$r" -- train "$OUT/model.dsm" --data "$OUT/c" --batch "$B" --seq "$T" \
      --global-batch "$G" --steps "$STEPS" --eval-every 0 --threads "$THREADS" --zero-stage "$s" \
      --trace "$OUT/$tag.json" --log "$OUT/$tag.jsonl" --quiet >"$OUT/$tag.out" 2>"$OUT/$tag.err"
    code=$?
    if [ $code -ne 0 ]; then
      if grep -q 'not implemented' "$OUT/$tag.err"; then
        why="not implemented: $(grep -m1 -o 'ZeRO stage.*not implemented[^(]*' "$OUT/$tag.err" |
          sed 's/ *$//')"
      else
        why="failed (exit $code): $(grep -m1 'error' "$OUT/$tag.err" | cut -c1-80)"
        status=1
      fi
      rows+=("$(printf '%5s %5s  %s' "$r" "$s" "$why")")
      printf '{"ranks":%s,"stage":%s,"error":%s}\n' "$r" "$s" \
        "$(python3 -c 'import json,sys; print(json.dumps(sys.argv[1]))' "$why")" >>"$OUT/zero.jsonl"
      continue
    fi
    row=$(python3 - "$OUT/$tag.jsonl" "$WARMUP" "$SRC/bench/trace_overlap.py" "$OUT/$tag.json" \
      "$r" "$s" "$B" "$T" "$G" <<'PY'
import json, statistics, subprocess, sys
log, warm, tool, trace = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
r, s, B, T, G = (int(x) for x in sys.argv[5:10])
ms = [json.loads(l)["ms"] for l in open(log)][warm:]
ov = json.loads(subprocess.run([sys.executable, tool, "--json", trace], check=True,
                               capture_output=True, text=True).stdout)["total"]
steps = len(ms) + warm
print(json.dumps({"ranks": r, "stage": s, "batch": B, "seq": T, "global_batch": G, "steps": steps,
                  "steps_timed": len(ms), "step_ms": statistics.median(ms), "min_ms": min(ms),
                  "comm_ms": ov["comm_us"] / 1e3, "wait_ms": ov["wait_us"] / 1e3,
                  "collectives": ov["collectives"], "hidden": ov["hidden"]}))
PY
    ) || { rows+=("$(printf '%5s %5s  %s' "$r" "$s" "no figures (see $OUT/$tag.jsonl)")")
           status=1; continue; }
    echo "$row" >>"$OUT/zero.jsonl"
    ms=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["step_ms"])' "$row")
    [ "$s" = 0 ] && base=$ms
    rows+=("$(python3 - "$row" "$base" <<'PY'
import json, sys
x, base = json.loads(sys.argv[1]), sys.argv[2]
ratio = f"{x['step_ms'] / float(base):.2f}" if base else "-"
hid = f"{100 * x['hidden']:.1f}%" if x["hidden"] is not None else "-"
per = x["ranks"] * x["steps"]  # per rank and step
print(f"{x['ranks']:>5} {x['stage']:>5} {x['step_ms']:>9.1f} {ratio:>8} {x['collectives'] / per:>11.0f} "
      f"{x['comm_ms'] / per:>10.2f} {x['wait_ms'] / per:>10.2f} {hid:>7}")
PY
    )")
  done
done

echo "ZeRO stages: $(basename "$OUT")/model.dsm (d $D, $LAYERS layers), global batch $G x seq $T," \
  "batch $B per rank, $THREADS thread(s) per rank, median of steps $((WARMUP + 1))-$STEPS"
echo "host: $(nproc) CPUs, $(uname -m); dsc $("$DSC" --version | cut -d' ' -f2)"
printf '%5s %5s %9s %8s %11s %10s %10s %7s\n' ranks stage "step ms" "vs st.0" "collectives" \
  "comm ms" "wait ms" hidden
printf '%s\n' "${rows[@]}"
echo "(collectives, comm ms, wait ms: per rank and step, over all steps; hidden = 1 - wait / comm)"
exit $status
