#!/usr/bin/env bash
# dsc and DeepSpeed side by side on the CPU, the same ds_config for both
# (issue 19 item 4; not CI):
#
#   bench/deepspeed_peer.sh [--dsc build/dsc] [--venv DIR] [--steps N] [--models "gpt-tiny gpt-30m"]
#
# Installs torch and deepspeed from PyPI into a venv (DIR, default
# build/ds-venv) if missing. For each model (examples/gpt-tiny.dsm, 120k
# params; a 30M GPT-2: examples/gpt2.dsm with d 384, 6 heads, 6 layers, written
# to build/bench/gpt-30m.dsm) and ZeRO stage 1, 2, 3, it writes one
# ds_config.json (micro-batch, AdamW, clipping, f32), then runs
#   DeepSpeed: python -m torch.distributed.run --nproc_per_node 2
#              bench/deepspeed_peer.py (the model of bench/pytorch_gpt2_step.py,
#              DeepSpeed's CPU accelerator, gloo, one thread per rank)
#   dsc:       dsc launch -n 2 -- train MODEL --deepspeed ds_config.json
#              --threads 1 (MPI, 2 ranks)
# and prints the median step time, tokens/s and rank 0's peak RSS of both and
# the ratio, with the CPU and the load. A stage DeepSpeed cannot run on the
# CPU is reported with its error.
set -uo pipefail
SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DSC=$SRC/build/dsc
VENV=$SRC/build/ds-venv
STEPS=10
MODELS="gpt-tiny gpt-30m"
while [ $# -gt 0 ]; do
  case $1 in
    --dsc) DSC=$(realpath "${2:?}"); shift ;;
    --venv) VENV=$(realpath -m "${2:?}"); shift ;;
    --steps) STEPS=${2:?}; shift ;;
    --models) MODELS=${2:?}; shift ;;
    *) echo "deepspeed_peer.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
OUT=$SRC/build/bench/deepspeed-peer
mkdir -p "$OUT"
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import deepspeed" >/dev/null 2>&1; then
  echo "deepspeed_peer.sh: installing torch and deepspeed into $VENV (PyPI; several GB)"
  { python3 -m venv "$VENV" && "$VENV/bin/pip" install -q torch numpy ninja &&
    DS_BUILD_OPS=0 "$VENV/bin/pip" install -q --no-build-isolation deepspeed; } >"$OUT/venv.log" 2>&1 ||
    { echo "deepspeed_peer.sh: the venv failed (see $OUT/venv.log)" >&2; exit 1; }
fi
sed -e 's/d = 768, heads = 12, layers = 12/d = 384, heads = 6, layers = 6/' -e 's/^model gpt2 {/model gpt_30m {/' \
  "$SRC/examples/gpt2.dsm" >"$OUT/gpt-30m.dsm"
cp -r "$SRC/examples/lib" "$OUT/" 2>/dev/null || true
"$DSC" data /usr/share/common-licenses/GPL-3 -o "$OUT/gpl" >/dev/null

cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
echo "CPU: $cpu, $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg) before"
echo "2 ranks, one thread each, f32, AdamW, clipping 1.0, seq 64, $STEPS timed steps (after 2)"
echo
echo "| model | stage | DeepSpeed step | dsc step | dsc speedup | DeepSpeed tok/s | dsc tok/s | DeepSpeed peak RSS (rank 0) | dsc peak RSS (rank 0) |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
fail=0
for model in $MODELS; do
  if [ "$model" = gpt-tiny ]; then m="$SRC/examples/gpt-tiny.dsm" micro=8; else m="$OUT/gpt-30m.dsm" micro=4; fi
  for stage in 1 2 3; do
    cfg="$OUT/$model-z$stage.json"
    cat >"$cfg" <<EOF
{"train_micro_batch_size_per_gpu": $micro, "gradient_accumulation_steps": 1,
 "optimizer": {"type": "AdamW", "params": {"lr": 0.0006, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}},
 "gradient_clipping": 1.0, "zero_optimization": {"stage": $stage}, "steps_per_print": 100000}
EOF
    ds_json=$(OMP_NUM_THREADS=1 "$VENV/bin/python" -m torch.distributed.run --nproc_per_node 2 \
      "$SRC/bench/deepspeed_peer.py" --model "$model" --config "$cfg" --seq 64 --steps "$STEPS" \
      2>"$OUT/$model-z$stage.ds.err" | grep '^{' | tail -1)
    log="$OUT/$model-z$stage.dsc.jsonl"
    rm -f "$log"
    "$DSC" launch -n 2 -- train "$m" --data "$OUT/gpl" --deepspeed "$cfg" --precision f32 --seq 64 \
      --steps $((STEPS + 2)) --eval-every 0 --threads 1 --log "$log" >"$OUT/$model-z$stage.dsc.out" \
      2>"$OUT/$model-z$stage.dsc.err"
    python3 - "$model" "$stage" "$ds_json" "$log" "$OUT/$model-z$stage.dsc.out" "$OUT/$model-z$stage.ds.err" <<'PY' || fail=1
import json, re, statistics, sys
model, stage, ds_line, log, dsc_out, ds_err = sys.argv[1:]
mib = lambda b: "%.1f MiB" % (b / 2**20)
row = ["", ""]
try:
    ds = json.loads(ds_line)
    ds_step, ds_tok, ds_rss = ds["step_s_median"], ds["tokens_per_s"], mib(ds["peak_rss_bytes"][0])
except Exception:
    err = [l for l in open(ds_err) if "Error" in l or "error" in l]
    ds = None
    ds_step, ds_tok, ds_rss = None, "-", "-"
    print("DeepSpeed %s stage %s failed: %s" % (model, stage, (err[-1].strip() if err else "no result")[:300]), file=sys.stderr)
steps = [json.loads(l) for l in open(log)] if __import__("os").path.exists(log) else []
if len(steps) < 3:
    print("| %s | %s | %s | failed | - | %s | - | %s | - |" % (model, stage, ds_step, ds_tok, ds_rss))
    sys.exit(1)
dsc_step = statistics.median(s["ms"] for s in steps[2:]) / 1000
dsc_tok = statistics.median(s["tokens_per_s"] for s in steps[2:])
m = re.search(r"peak RSS ([0-9.]+) MiB", open(dsc_out).read())
dsc_rss = "%s MiB" % m.group(1) if m else "-"
sp = "%.2fx" % (ds_step / dsc_step) if ds_step else "-"
print("| %s | %s | %s | %.4f s | %s | %s | %.0f | %s | %s |" % (
    model, stage, "%.4f s" % ds_step if ds_step else "failed", dsc_step, sp, ds_tok, dsc_tok, ds_rss, dsc_rss))
PY
  done
done
echo
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg); DeepSpeed $("$VENV/bin/python" -c 'import deepspeed, torch; print(deepspeed.__version__, "torch", torch.__version__)' 2>/dev/null | tail -1)"
exit $fail
