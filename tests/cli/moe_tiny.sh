# examples/moe-tiny.dsm (a GPT whose MLPs are 4 experts with top-2 gating, a
# capacity factor of 1.25 and the router losses, examples/lib/moe.dsm): the
# cpu backend gives the interpreter's forward loss and its loss curve over
# 30 training steps (1e-5 relative per step), the model learns, bf16
# follows f32's curve, and --target cuda compiles every kernel of its step
# with NVRTC.
source "$(dirname "$0")/lib/common.bash"
source "$(dirname "$0")/lib/corpus.bash"
MODEL="$SRC/examples/moe-tiny.dsm"
export DSC_CACHE_DIR="$TMP/kernel-cache"

expect_exit 0 "$DSC" check "$MODEL"
expect_exit 0 "$DSC" dump "$MODEL" -o "$TMP/moe.dsir"
expect_grep '^param h\.1\.fc_w: f32\[4,64,128\]' "$TMP/moe.dsir"
expect_grep '^param h\.0\.router: f32\[64,4\]' "$TMP/moe.dsir"

if ! "$DSC" run "$MODEL" --backend cpu --quiet >/dev/null 2>&1; then
  echo "cpu backend not built: only the interpreter ran"
  expect_exit 0 "$DSC" run "$MODEL" --backend interp --quiet --batch 2 --seq 16
  finish
  exit
fi

loss_of() { sed -n 's/^loss: //p' "$1"; }
expect_exit 0 "$DSC" run "$MODEL" --backend interp --batch 4 --seq 32 --quiet && cp "$TMP/out" "$TMP/run_interp"
expect_exit 0 "$DSC" run "$MODEL" --backend cpu --batch 4 --seq 32 --threads 2 --quiet && cp "$TMP/out" "$TMP/run_cpu"
python3 - "$(loss_of "$TMP/run_interp")" "$(loss_of "$TMP/run_cpu")" <<'PY' && pass || fail "forward losses differ"
import math, sys
a, b = float(sys.argv[1]), float(sys.argv[2])
# a fresh model is near uniform over the bytes; the router losses add about 0.01 (balanced)
assert abs(a - math.log(256)) < 0.08, a
sys.exit(0 if abs(a - b) <= 1e-5 * abs(a) else 1)
PY

make_corpus "$TMP/corpus.txt"
expect_exit 0 "$DSC" data "$TMP/corpus.txt" -o "$TMP/c"
for b in interp cpu; do
  expect_exit 0 "$DSC" train "$MODEL" --data "$TMP/c" --backend "$b" --threads 2 --steps 30 \
    --batch 4 --seq 32 --eval-every 15 --eval-batches 2 --save-every 0 --log "$TMP/$b.jsonl" --quiet
done
PYTHONPATH="$SRC/tests/cli/lib" python3 - "$TMP/interp.jsonl" "$TMP/cpu.jsonl" <<'PY' && pass || fail "loss curves differ"
import sys
from curves import same_losses
a, b, worst = same_losses(sys.argv[1], sys.argv[2])
assert len(a) == 30, len(a)
assert a[-1]["loss"] < a[0]["loss"] - 1.0, ("moe-tiny should learn in 30 steps", a[0], a[-1])
print("moe-tiny: loss %.4f -> %.4f; worst relative difference cpu/interp %.2g"
      % (a[0]["loss"], a[-1]["loss"], worst))
PY

# bf16 (master weights): the router's counts and slot indices stay f32 (bf16
# holds integers only to 256; 512 tokens per batch here) and ties between
# equal bf16 gates go to the first expert, so the curve follows f32's
for p in f32 bf16; do
  expect_exit 0 "$DSC" train "$MODEL" --data "$TMP/c" --precision $p --steps 10 --batch 8 --seq 64 \
    --eval-every 0 --save-every 0 --log "$TMP/p_$p.jsonl" --quiet
done
PYTHONPATH="$SRC/tests/cli/lib" python3 - "$TMP/p_f32.jsonl" "$TMP/p_bf16.jsonl" <<'PY' && pass || fail "bf16 does not follow f32"
import sys
from curves import same_losses
a, b, worst = same_losses(sys.argv[1], sys.argv[2], rel=5e-3)
print("moe-tiny bf16 against f32 over 10 steps: worst relative loss difference %.2g" % worst)
PY

if "$DSC" compile "$MODEL" --target cuda -o "$TMP/moe.dsx" >"$TMP/out" 2>"$TMP/err"; then
  expect_grep '2 graphs, [1-9][0-9]* kernels for cuda' "$TMP/out"
elif grep -q 'built without' "$TMP/err"; then
  echo "--target cuda: this build has no NVRTC; skipped"
else
  fail "dsc compile --target cuda failed"; sed 's/^/    /' "$TMP/err" | head
fi
finish
