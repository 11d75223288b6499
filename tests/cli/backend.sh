# dsc run/train --backend: the cpu backend (LLVM-JIT kernels + oneDNN) gives
# the interpreter's numbers: the forward loss, and 50 training steps of the
# tiny GPT on the same loss curve (1e-5 relative per step; the validation
# loss too); --profile prints the step's slowest instructions; bad or
# unavailable backends are clear errors.
source "$(dirname "$0")/lib/common.bash"
source "$(dirname "$0")/lib/corpus.bash"
MODEL="$SRC/examples/gpt-tiny.dsm"
export DSC_CACHE_DIR="$TMP/kernel-cache"

expect_exit 1 "$DSC" run "$MODEL" --backend gpu && expect_grep "interp, cpu, cuda" "$TMP/err"
expect_exit 1 "$DSC" train "$MODEL" --data "$TMP/none" --backend tpu &&
  expect_grep "not one of interp, cpu, cuda" "$TMP/err"
# no GPU here (tests/cli/cuda_backend.sh has the messages); on a GPU machine it runs
if ! nvidia-smi -L >/dev/null 2>&1; then
  expect_exit 1 "$DSC" run "$MODEL" --backend cuda --quiet && expect_grep "backend cuda" "$TMP/err"
fi

if ! "$DSC" run "$MODEL" --backend cpu --quiet >/dev/null 2>&1; then
  echo "cpu backend not built: only the error checks ran"
  finish
  exit
fi

loss_of() { sed -n 's/^loss: //p' "$1"; }
expect_exit 0 "$DSC" run "$MODEL" --backend interp --quiet && cp "$TMP/out" "$TMP/run_interp"
expect_exit 0 "$DSC" run "$MODEL" --backend cpu --threads 2 --quiet && cp "$TMP/out" "$TMP/run_cpu"
python3 - "$(loss_of "$TMP/run_interp")" "$(loss_of "$TMP/run_cpu")" <<'EOF' && pass || fail "forward losses differ"
import sys
a, b = float(sys.argv[1]), float(sys.argv[2])
sys.exit(0 if abs(a - b) <= 1e-5 * abs(a) else 1)
EOF

make_corpus "$TMP/corpus.txt"
expect_exit 0 "$DSC" data "$TMP/corpus.txt" -o "$TMP/c"
for b in interp cpu; do
  expect_exit 0 "$DSC" train "$MODEL" --data "$TMP/c" --backend "$b" --threads 2 --steps 50 \
    --eval-every 25 --eval-batches 2 --log "$TMP/$b.jsonl" --quiet
done
PYTHONPATH="$SRC/tests/cli/lib" python3 - "$TMP/interp.jsonl" "$TMP/cpu.jsonl" <<'EOF' && pass || fail "loss curves differ"
import sys
from curves import same_losses
a, b, worst = same_losses(sys.argv[1], sys.argv[2])
assert len(a) == 50, len(a)
assert a[-1]["loss"] < a[0]["loss"] - 0.5, "the tiny GPT should learn in 50 steps"
print("worst relative difference over 50 steps:", worst)
EOF

expect_exit 0 "$DSC" train "$MODEL" --data "$TMP/c" --backend cpu --steps 2 --profile --quiet &&
  expect_grep "profile of train_step" "$TMP/out" && expect_grep " gemm " "$TMP/out"
finish
