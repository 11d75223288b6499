#!/usr/bin/env bash
# The delayed parameter update (--delayed-param-update true, train key
# offload.delayed_update): step 1 updates nothing, so step 2 trains at the
# initial params; the cpu backend follows the interpreter's curve; the same
# with the optimizer step on the host, at 2 ranks with ZeRO stage 2 and
# across a resume (the not-yet-applied gradient is in the checkpoint);
# fp16 with it is a clear error.
source "$(dirname "$0")/lib/common.bash"
source "$(dirname "$0")/lib/corpus.bash"
MODEL="$SRC/examples/gpt-tiny.dsm"
export DSC_CACHE_DIR="$TMP/kernel-cache"
make_corpus "$TMP/corpus.txt"
expect_exit 0 "$DSC" data "$TMP/corpus.txt" -o "$TMP/c"
RUN=(--data "$TMP/c" --batch 2 --seq 16 --global-batch 4 --lr 3e-3 --steps 8 --eval-every 0
  --quiet)
DPU=(--delayed-param-update true)
have_cpu=1
"$DSC" run "$MODEL" --backend cpu --quiet >/dev/null 2>&1 || have_cpu=0

expect_exit 0 "$DSC" train "$MODEL" "${RUN[@]}" --backend interp --out "$TMP/plain"
expect_exit 0 "$DSC" train "$MODEL" "${RUN[@]}" "${DPU[@]}" --backend interp --out "$TMP/d-interp"
runs=(d-interp)
if [ $have_cpu = 1 ]; then
  expect_exit 0 "$DSC" train "$MODEL" "${RUN[@]}" "${DPU[@]}" --backend cpu --out "$TMP/d-cpu"
  expect_exit 0 "$DSC" train "$MODEL" "${RUN[@]}" "${DPU[@]}" --backend cpu \
    --offload-optimizer host --out "$TMP/d-host"
  runs+=(d-cpu d-host)
fi
expect_exit 0 "$DSC" train "$MODEL" "${RUN[@]}" "${DPU[@]}" --backend interp --ranks 2 \
  --zero-stage 2 --out "$TMP/d-w2s2"
expect_exit 0 "$DSC" train "$MODEL" "${RUN[@]}" "${DPU[@]}" --backend interp --stop-at 4 \
  --out "$TMP/d-resumed"
expect_exit 0 "$DSC" train --resume "$TMP/d-resumed" --steps 8 --quiet
runs+=(d-w2s2 d-resumed)

python3 - "$TMP" "$(dirname "$0")/lib" "${runs[@]}" <<'PY' && pass || fail "delayed update curves"
import sys
sys.path.insert(0, sys.argv[2])
from curves import assert_same, metrics
root, runs = sys.argv[1], sys.argv[3:]
base = assert_same(root, runs[0], runs[1:], 8)
plain = metrics(root, "plain")
assert len(plain) == 8
# step 1: the same loss and gradient; step 2 of the delayed run trains at
# the initial params, the plain run's at updated ones
assert base[0]["loss"] == plain[0]["loss"] and base[0]["grad_norm"] == plain[0]["grad_norm"]
assert base[1]["loss"] != plain[1]["loss"]
assert base[-1]["loss"] < base[0]["loss"] - 0.05, "the delayed run should learn"
print("delayed update: step-8 loss %.4f (plain %.4f), %d runs agree" %
      (base[-1]["loss"], plain[-1]["loss"], len(runs)))
PY
# the checkpoint holds the gradient not applied yet and the step count one behind
python3 - "$TMP/d-interp/latest/optimizer.safetensors" <<'PY' && pass || fail "delayed update states"
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
head = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
names = [k for k in head if k != "__metadata__"]
assert "opt.delayed_primed" in names and any(k.startswith("opt.delayed.") for k in names), names
PY
expect_exit 1 "$DSC" train --resume "$TMP/d-resumed" --steps 10 --delayed-param-update false &&
  expect_grep 'trained with delayed_update true, not false' "$TMP/err"
expect_exit 1 "$DSC" train "$MODEL" "${RUN[@]}" "${DPU[@]}" --precision fp16 --out "$TMP/fp16" &&
  expect_grep 'delayed_update \(--delayed-param-update\) with precision fp16 is not supported' "$TMP/err"
expect_exit 1 "$DSC" train "$MODEL" "${RUN[@]}" --delayed-param-update yes --out "$TMP/bad" &&
  expect_grep 'delayed-param-update needs true or false' "$TMP/err"
finish
