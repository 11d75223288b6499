#!/usr/bin/env bash
# Step time of Ulysses sequence parallelism against data parallelism and one
# rank, on the same global batch, side by side in one run.
#
#   bench/sequence_parallel.sh [--dsc PATH] [--rounds N] [--steps N] [--d D]
#                              [--layers L] [--seq T] [--batch B] [--out DIR]
#
# The model is examples/gpt-tiny.dsm widened to d = D (256), L (4) layers and
# a context of T (256) positions. Every row trains B (4) sequences of T
# tokens per step on the machine's cores: one rank with every core's
# threads; 2 in-process ranks x (cores / 2) threads as dp=2 (B/2 sequences
# each) and as sp=2 (all B sequences, T/2 positions each: attention's q, k,
# v and output exchanged over the ranks). The rows alternate for N (3)
# rounds; a row's time is the median over its rounds of the median step
# after the first 3. Prints the CPU (lscpu), the load before, the times and
# the ratios; exit 1 when a run failed.
set -uo pipefail

SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DSC=$SRC/build/dsc
ROUNDS=3
STEPS=12
D=256
LAYERS=4
T=256
B=4
OUT=$SRC/build/bench/sequence_parallel

usage() { sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --dsc) DSC=$(realpath -m "${2:?}"); shift ;;
    --rounds) ROUNDS=${2:?}; shift ;;
    --steps) STEPS=${2:?}; shift ;;
    --d) D=${2:?}; shift ;;
    --layers) LAYERS=${2:?}; shift ;;
    --seq) T=${2:?}; shift ;;
    --batch) B=${2:?}; shift ;;
    --out) OUT=$(realpath -m "${2:?}"); shift ;;
    -h|--help) usage 0 ;;
    *) echo "bench/sequence_parallel.sh: unknown option '$1'" >&2; usage ;;
  esac
  shift
done
[ -x "$DSC" ] || { echo "bench/sequence_parallel.sh: no dsc at $DSC (give --dsc PATH)" >&2; exit 1; }
[ "$STEPS" -gt 3 ] 2>/dev/null || { echo "bench/sequence_parallel.sh: --steps must exceed 3" >&2; exit 1; }
[ $((B % 2)) -eq 0 ] && [ $((T % 2)) -eq 0 ] ||
  { echo "bench/sequence_parallel.sh: --batch and --seq must be even (2 ranks)" >&2; exit 1; }
mkdir -p "$OUT" || exit 1
export DSC_CACHE_DIR=${DSC_CACHE_DIR:-$OUT/kernel-cache}

ln -sfn "$SRC/examples/lib" "$OUT/lib"
sed -e "s/^const vocab = 256, d = 64, heads = 4/const vocab = 256, d = $D, heads = 4/" \
  -e "s/const ctx = 64, layers = 2/const ctx = $T, layers = $LAYERS/" \
  -e 's/^model gpt_tiny/model gpt_sp_bench/' "$SRC/examples/gpt-tiny.dsm" >"$OUT/model.dsm"
grep -q "d = $D, heads" "$OUT/model.dsm" && grep -q "ctx = $T, layers = $LAYERS" "$OUT/model.dsm" ||
  { echo "bench/sequence_parallel.sh: examples/gpt-tiny.dsm changed: cannot set d, ctx, layers" >&2; exit 1; }
if [ ! -s "$OUT/c_train.bin" ]; then
  # shellcheck source=../tests/cli/lib/corpus.bash
  source "$SRC/tests/cli/lib/corpus.bash"
  make_corpus "$OUT/corpus.txt" 60000
  "$DSC" data "$OUT/corpus.txt" -o "$OUT/c" >/dev/null || exit 1
fi

cores=$(nproc)
half=$((cores / 2 > 0 ? cores / 2 : 1))
names=(one dp2 sp2)
args=("--threads $cores --batch $B"
  "--ranks 2 --threads $half --batch $((B / 2))"
  "--ranks 2 --mesh sp=2 --threads $half --batch $B")
echo "cpu: $(lscpu | sed -n 's/^Model name: *//p'); $cores cores; load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "model: gpt-tiny at d $D, $LAYERS layers, 4 heads; $B sequences x $T tokens per step; $ROUNDS rounds"
status=0
for r in $(seq 1 "$ROUNDS"); do
  for i in 0 1 2; do
    dir=$OUT/${names[$i]}-$r
    rm -rf "$dir"
    # shellcheck disable=SC2086
    if ! "$DSC" train "$OUT/model.dsm" --data "$OUT/c" --seq "$T" --steps "$STEPS" --eval-every 0 \
      --quiet --out "$dir" --save-every 0 ${args[$i]} >"$OUT/${names[$i]}.log" 2>&1; then
      echo "bench/sequence_parallel.sh: ${names[$i]} failed:" >&2
      cat "$OUT/${names[$i]}.log" >&2
      status=1
    fi
  done
done
python3 - "$OUT" "$ROUNDS" <<'PY' || status=1
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
rows = {}
for name in ("one", "dp2", "sp2"):
    per_round, loss = [], None
    for r in range(1, rounds + 1):
        m = [json.loads(l) for l in open(f"{out}/{name}-{r}/metrics.jsonl")]
        per_round.append(statistics.median(x["ms"] for x in m[3:]))
        loss = m[-1]["loss"]
    rows[name] = (statistics.median(per_round), loss)
    print(f"{name:4s} step {rows[name][0]:8.2f} ms (rounds: {', '.join(f'{v:.2f}' for v in per_round)})"
          f"  final loss {loss:.6f}")
print(f"sp2 / one {rows['sp2'][0] / rows['one'][0]:.2f}x, sp2 / dp2 {rows['sp2'][0] / rows['dp2'][0]:.2f}x")
PY
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
exit $status
