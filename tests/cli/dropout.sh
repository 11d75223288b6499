# Dropout in training (issue: real models, item 1): tests/cli/lib/dropout_tiny.dsm
# drops embeddings, attention probabilities and both residual branches.
# - the cpu backend's loss curve is the interpreter's (1e-5 relative per
#   step): the same elements drop in both, forward and backward;
# - at grad_accum 2 and with 2 ranks under ZeRO-3 as well;
# - a resumed run continues bit for bit (the seeds come from the run's
#   generator, which checkpoints save);
# - dropout is off in evaluation: with a learning rate too small to move an
#   f32 weight, the validation loss equals the same model's with p = 0,
#   while the training loss differs;
# - dsc sample runs the trained model (no seed input there), and --target
#   cuda compiles every kernel with NVRTC.
source "$(dirname "$0")/lib/common.bash"
source "$(dirname "$0")/lib/corpus.bash"
MODEL="$SRC/tests/cli/lib/dropout_tiny.dsm"
export DSC_CACHE_DIR="$TMP/kernel-cache"

expect_exit 0 "$DSC" dump "$MODEL" --dim B=2 --dim T=8 -o "$TMP/drop.dsir"
expect_grep '^graph forward\(%tokens: i32\[2,8\], %targets: i32\[2,8\], %dropout_seed: i64\[1\]\)' "$TMP/drop.dsir"
expect_grep ' = dropout\(%[0-9]+, %dropout_seed\) \{p = 0.1, stream = 6\} : f32\[2,8,32\]' "$TMP/drop.dsir"
[ "$(grep -c ' = dropout(' "$TMP/drop.dsir")" -eq 7 ] && pass || fail "7 dropouts expected"

make_corpus "$TMP/corpus.txt"
expect_exit 0 "$DSC" data "$TMP/corpus.txt" -o "$TMP/c"
backends="interp"
"$DSC" run "$MODEL" --backend cpu --quiet >/dev/null 2>&1 && backends="interp cpu"
train() { # NAME ARGS...: a run into $TMP/NAME with its log $TMP/NAME.jsonl
  local name=$1
  shift
  expect_exit 0 "$DSC" train "$MODEL" --data "$TMP/c" --threads 2 --save-every 0 --eval-batches 2 \
    --out "$TMP/$name" --log "$TMP/$name.jsonl" --quiet "$@"
}
for b in $backends; do
  train "$b" --backend "$b" --steps 30
  train "$b-acc" --backend "$b" --steps 4 --batch 2 --grad-accum 2 --eval-every 0
done
# compare A B: loss and val_loss per step within 1e-5 relative
compare() {
  PYTHONPATH="$SRC/tests/cli/lib" python3 - "$TMP/$1.jsonl" "$TMP/$2.jsonl" "$3" <<'EOF'
import sys
from curves import same_losses
a, b, worst = same_losses(sys.argv[1], sys.argv[2], float(sys.argv[3]))
print("%s vs %s: %d steps, loss %.4f -> %.4f, worst relative difference %.2g"
      % (sys.argv[1].split("/")[-1], sys.argv[2].split("/")[-1], len(a), a[0]["loss"], a[-1]["loss"], worst))
EOF
}
if [ "$backends" = "interp cpu" ]; then
  compare interp cpu 1e-5 && pass || fail "cpu and interpreter differ"
  compare interp-acc cpu-acc 1e-5 && pass || fail "cpu and interpreter differ at grad_accum 2"
else
  echo "cpu backend not built: the interpreter alone"
fi
B=${backends##* }
python3 - "$TMP/$B.jsonl" <<'EOF' && pass || fail "the model does not learn with dropout"
import json, sys
a = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
assert a[-1]["loss"] < a[0]["loss"] - 1.0, (a[0]["loss"], a[-1]["loss"])
EOF

# two ranks under ZeRO-3: each rank's own seeds, the loss falls
train ranks --backend "$B" --threads 1 --ranks 2 --zero-stage 3 --batch 2 --steps 6 --eval-every 0
python3 -c 'import json,sys; a=[json.loads(l) for l in open(sys.argv[1]) if "\"loss\"" in l]; sys.exit(0 if len(a) == 6 and a[-1]["loss"] < a[0]["loss"] else 1)' \
  "$TMP/ranks.jsonl" && pass || fail "2 ranks: no falling loss"

# resume: 3 steps, then 3 more from the checkpoint = 6 uninterrupted, bit for bit
train whole --backend "$B" --steps 6 --eval-every 0
train half --backend "$B" --steps 3 --eval-every 0
expect_exit 0 "$DSC" train --resume "$TMP/half" --steps 6 --data "$TMP/c" --backend "$B" --threads 2 \
  --eval-every 0 --log "$TMP/half.jsonl" --quiet
if cmp -s <(sed 's/"ms":[^,]*,//; s/"tokens_per_s":[^,}]*//' "$TMP/whole.jsonl" | cut -d, -f1-2) \
  <(sed 's/"ms":[^,]*,//; s/"tokens_per_s":[^,}]*//' "$TMP/half.jsonl" | cut -d, -f1-2); then pass
else
  fail "a resumed run's losses differ from the uninterrupted run's"
  paste "$TMP/whole.jsonl" "$TMP/half.jsonl" | cut -c1-120 | head
fi

# off in evaluation: lr 1e-30 leaves every f32 weight as it was
sed 's/pdrop = 0.1/pdrop = 0.0/' "$MODEL" >"$TMP/nodrop.dsm"
sed -i "s|\"../../../examples/lib/layers.dsm\"|\"$SRC/examples/lib/layers.dsm\"|" "$TMP/nodrop.dsm"
train evaldrop --backend "$B" --steps 2 --eval-every 1 --lr 1e-30
expect_exit 0 "$DSC" train "$TMP/nodrop.dsm" --data "$TMP/c" --threads 2 --save-every 0 --eval-batches 2 \
  --backend "$B" --steps 2 --eval-every 1 --lr 1e-30 --log "$TMP/evalplain.jsonl" --quiet
python3 - "$TMP/evaldrop.jsonl" "$TMP/evalplain.jsonl" <<'EOF' && pass || fail "validation is not dropout-free"
import json, sys
a, b = [[json.loads(l) for l in open(p) if '"loss"' in l] for p in sys.argv[1:]]
assert [x["val_loss"] for x in a] == [y["val_loss"] for y in b], (a, b)
assert a[0]["loss"] != b[0]["loss"], "the training loss should see the dropout"
print("validation %.6f with and without dropout; training %.6f with, %.6f without"
      % (a[0]["val_loss"], a[0]["loss"], b[0]["loss"]))
EOF

expect_exit 0 "$DSC" sample "$TMP/$B" --tokens 8 --prompt "the " --seed 1

if "$DSC" compile "$MODEL" --target cuda --grad-accum 2 -o "$TMP/drop.dsx" >"$TMP/out" 2>"$TMP/err"; then
  expect_grep '3 graphs, [1-9][0-9]* kernels for cuda' "$TMP/out"
elif grep -q 'built without' "$TMP/err"; then
  echo "--target cuda: this build has no NVRTC; skipped"
else
  fail "dsc compile --target cuda failed"; sed 's/^/    /' "$TMP/err" | head
fi
finish
