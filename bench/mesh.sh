#!/usr/bin/env bash
# Step time of sequence, tensor and expert parallelism against data
# parallelism and one rank, on the same global batch, side by side in one run.
#
#   bench/mesh.sh [--dsc PATH] [--rounds N] [--steps N] [--d D] [--layers L]
#                 [--seq T] [--batch B] [--out DIR]
#
# Two models: examples/gpt-tiny.dsm and examples/moe-tiny.dsm (4 experts,
# top-2), widened to d = D (256), L (4) layers and a context of T (256)
# positions. Every row trains B (4) sequences of T tokens per step on the
# machine's cores: one rank with every core's threads; 2 in-process ranks x
# (cores / 2) threads as dp=2 (B/2 sequences each), as sp=2 (gpt: all B
# sequences, T/2 positions each), as tp=2 (gpt: all B sequences, half of
# every attention's heads and MLP's hidden units each) and as ep=2 (moe:
# B/2 sequences each, each rank running 2 of the 4 experts on both ranks'
# tokens). MoE capacities
# are per micro-batch, so moe's one-rank row runs grad-accum 2 (the same
# micro-batches as the 2-rank rows). The rows alternate for N (3) rounds; a
# row's time is the median over its rounds of the median step after the
# first 3. Prints the CPU (lscpu), the load before and after, the times and
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
OUT=$SRC/build/bench/mesh

usage() { sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }
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
    *) echo "bench/mesh.sh: unknown option '$1'" >&2; usage ;;
  esac
  shift
done
[ -x "$DSC" ] || { echo "bench/mesh.sh: no dsc at $DSC (give --dsc PATH)" >&2; exit 1; }
[ "$STEPS" -gt 3 ] 2>/dev/null || { echo "bench/mesh.sh: --steps must exceed 3" >&2; exit 1; }
[ $((B % 2)) -eq 0 ] && [ $((T % 2)) -eq 0 ] ||
  { echo "bench/mesh.sh: --batch and --seq must be even (2 ranks)" >&2; exit 1; }
mkdir -p "$OUT" || exit 1
export DSC_CACHE_DIR=${DSC_CACHE_DIR:-$OUT/kernel-cache}

ln -sfn "$SRC/examples/lib" "$OUT/lib"
for m in gpt moe; do
  sed -e "s/^const vocab = 256, d = 64, heads = 4/const vocab = 256, d = $D, heads = 4/" \
    -e "s/const ctx = 64, layers = 2/const ctx = $T, layers = $LAYERS/" \
    "$SRC/examples/$m-tiny.dsm" >"$OUT/$m.dsm"
  grep -q "d = $D, heads" "$OUT/$m.dsm" && grep -q "ctx = $T, layers = $LAYERS" "$OUT/$m.dsm" ||
    { echo "bench/mesh.sh: examples/$m-tiny.dsm changed: cannot set d, ctx, layers" >&2; exit 1; }
done
if [ ! -s "$OUT/c_train.bin" ]; then
  # shellcheck source=../tests/cli/lib/corpus.bash
  source "$SRC/tests/cli/lib/corpus.bash"
  make_corpus "$OUT/corpus.txt" 60000
  "$DSC" data "$OUT/corpus.txt" -o "$OUT/c" >/dev/null || exit 1
fi

cores=$(nproc)
half=$((cores / 2 > 0 ? cores / 2 : 1))
names=(gpt-one gpt-dp2 gpt-sp2 gpt-tp2 moe-one moe-dp2 moe-ep2)
args=("gpt --threads $cores --batch $B"
  "gpt --ranks 2 --threads $half --batch $((B / 2))"
  "gpt --ranks 2 --mesh sp=2 --threads $half --batch $B"
  "gpt --ranks 2 --mesh tp=2 --threads $half --batch $B"
  "moe --threads $cores --batch $((B / 2)) --grad-accum 2"
  "moe --ranks 2 --threads $half --batch $((B / 2))"
  "moe --ranks 2 --mesh ep=2 --threads $half --batch $((B / 2))")
echo "cpu: $(lscpu | sed -n 's/^Model name: *//p'); $cores cores; load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "models: gpt-tiny and moe-tiny at d $D, $LAYERS layers, 4 heads; $B sequences x $T tokens per step; $ROUNDS rounds"
status=0
for r in $(seq 1 "$ROUNDS"); do
  for i in "${!names[@]}"; do
    dir=$OUT/${names[$i]}-$r
    rm -rf "$dir"
    # shellcheck disable=SC2086
    set -- ${args[$i]}
    model=$1
    shift
    if ! "$DSC" train "$OUT/$model.dsm" --data "$OUT/c" --seq "$T" --steps "$STEPS" --eval-every 0 \
      --quiet --out "$dir" --save-every 0 "$@" >"$OUT/${names[$i]}.log" 2>&1; then
      echo "bench/mesh.sh: ${names[$i]} failed:" >&2
      cat "$OUT/${names[$i]}.log" >&2
      status=1
    fi
  done
done
python3 - "$OUT" "$ROUNDS" <<'PY' || status=1
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
rows = {}
for name in ("gpt-one", "gpt-dp2", "gpt-sp2", "gpt-tp2", "moe-one", "moe-dp2", "moe-ep2"):
    per_round, loss = [], None
    for r in range(1, rounds + 1):
        m = [json.loads(l) for l in open(f"{out}/{name}-{r}/metrics.jsonl")]
        per_round.append(statistics.median(x["ms"] for x in m[3:]))
        loss = m[-1]["loss"]
    rows[name] = (statistics.median(per_round), loss)
    print(f"{name:8s} step {rows[name][0]:8.2f} ms (rounds: {', '.join(f'{v:.2f}' for v in per_round)})"
          f"  final loss {loss:.6f}")
def ratio(a, b):
    return rows[a][0] / rows[b][0]
print(f"gpt: sp2 / one {ratio('gpt-sp2', 'gpt-one'):.2f}x, sp2 / dp2 {ratio('gpt-sp2', 'gpt-dp2'):.2f}x")
print(f"gpt: tp2 / one {ratio('gpt-tp2', 'gpt-one'):.2f}x, tp2 / dp2 {ratio('gpt-tp2', 'gpt-dp2'):.2f}x")
print(f"moe: ep2 / one {ratio('moe-ep2', 'moe-one'):.2f}x, ep2 / dp2 {ratio('moe-ep2', 'moe-dp2'):.2f}x")
PY
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
exit $status
