# dsc train: flags, bad input, and a short run of examples/gpt-tiny.dsm on a
# generated corpus whose loss must fall.
source "$(dirname "$0")/lib/common.bash"
source "$(dirname "$0")/lib/corpus.bash"
MODEL="$SRC/examples/gpt-tiny.dsm"

expect_exit 0 "$DSC" train --help && expect_grep '^usage: dsc train MODEL.dsm --data PREFIX' "$TMP/out"
expect_grep 'exits with 130 \(SIGINT\)' "$TMP/out"
expect_exit 1 "$DSC" train && expect_grep 'missing model file' "$TMP/err"
expect_exit 1 "$DSC" train "$MODEL" && expect_grep 'missing --data PREFIX' "$TMP/err"
expect_exit 1 "$DSC" train "$MODEL" --data x --bogus && expect_grep "unknown option '--bogus'" "$TMP/err"
for bad in "--steps 0" "--steps x" "--batch -1" "--lr 0" "--lr abc" "--save-every -2" "--seq"; do
  # shellcheck disable=SC2086
  expect_exit 1 "$DSC" train "$MODEL" --data x $bad && expect_grep 'needs' "$TMP/err"
done

make_corpus "$TMP/corpus.txt"
expect_exit 0 "$DSC" data "$TMP/corpus.txt" -o "$TMP/c"
SMALL=(--batch 4 --seq 32)

# bad input: missing shards, ids outside the vocabulary, an unwritable --out,
# a model that is not a token model; nothing is written
expect_exit 1 "$DSC" train "$MODEL" --data "$TMP/none" "${SMALL[@]}" && expect_grep 'none_train.bin: error: cannot open' "$TMP/err"
python3 - "$TMP/big_train.bin" <<'PY'
import struct, sys
ids = [(i * 37) % 300 for i in range(200)]  # ids up to 299 > vocab 256
open(sys.argv[1], "wb").write(struct.pack("<256i", 20240520, 1, len(ids), *[0] * 253) + struct.pack("<%dH" % len(ids), *ids))
PY
expect_exit 1 "$DSC" train "$MODEL" --data "$TMP/big" "${SMALL[@]}" --out "$TMP/o_big" && expect_grep 'big_train.bin: error: token id [0-9]+ .*outside the vocabulary \(size 256\)' "$TMP/err"
[ ! -e "$TMP/o_big" ] && pass || fail "a rejected run created its --out"
touch "$TMP/plainfile"
expect_exit 1 "$DSC" train "$MODEL" --data "$TMP/c" "${SMALL[@]}" --out "$TMP/plainfile/out" && expect_grep 'cannot create directory' "$TMP/err"
expect_exit 1 "$DSC" train "$SRC/examples/mlp.dsm" --data "$TMP/c" && expect_grep 'needs a token model' "$TMP/err"

# The run: 60 steps of 4 x 32 tokens at lr 3e-3 (the model's cosine schedule,
# warmup 50). Measured: loss 5.45 at step 1, about 1.75 over steps 56-60.
# Asserted: first loss > 5 (log(256) = 5.55 at init), mean of the last 5 < 2.5.
expect_exit 0 "$DSC" train "$MODEL" --data "$TMP/c" "${SMALL[@]}" --steps 60 --lr 3e-3 \
  --save-every 20 --eval-every 20 --eval-batches 4 --out "$TMP/run" --log "$TMP/log.jsonl"
expect_grep '^model gpt_tiny .*120576 parameters' "$TMP/out"
expect_grep '^step 60/60 \| loss [0-9.]+ \| lr .* \| val [0-9.]+ \| saved' "$TMP/out"
expect_grep '^done: 60 steps \(60 this run\) .* final loss [0-9.]+, best val loss [0-9.]+' "$TMP/out"
expect_grep "^checkpoint: $TMP/run/step-000060" "$TMP/out"
python3 - "$TMP/log.jsonl" "$TMP/run/metrics.jsonl" <<'PY' && pass || fail "JSON log check"
import json, math, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
assert [l["step"] for l in lines] == list(range(1, 61)), "one line per step, steps 1..60"
for l in lines:
    for k in ("loss", "lr", "grad_norm", "tokens_per_s", "ms"):
        assert isinstance(l[k], (int, float)) and math.isfinite(l[k]), (l, k)
    assert ("val_loss" in l) == (l["step"] % 20 == 0), l
loss = [l["loss"] for l in lines]
assert loss[0] > 5.0, loss[0]
assert sum(loss[-5:]) / 5 < 2.5, loss[-5:]
val = [l["val_loss"] for l in lines if "val_loss" in l]
assert val[-1] < val[0] - 1.0, val
assert lines[0]["lr"] < lines[49]["lr"], "warmup: the lr rises"
assert open(sys.argv[1]).read() == open(sys.argv[2]).read(), "--log and DIR/metrics.jsonl differ"
PY
for s in 000020 000040 000060; do
  for f in model.safetensors optimizer.safetensors state.json; do
    [ -s "$TMP/run/step-$s/$f" ] && pass || fail "missing $TMP/run/step-$s/$f"
  done
done
[ "$(readlink "$TMP/run/latest")" = step-000060 ] && pass || fail "latest -> $(readlink "$TMP/run/latest")"
python3 - "$TMP/run/latest/state.json" "$MODEL" <<'PY' && pass || fail "state.json contents"
import json, os, sys
s = json.load(open(sys.argv[1]))
assert s["step"] == 60
e = s["extra"]
assert e["model"] == os.path.realpath(sys.argv[2]), e["model"]
assert (e["batch"], e["seq"], e["vocab"], e["grad_accum"]) == ("4", "32", "256", "1"), e
PY
# without a validation shard: no val_loss anywhere, training still runs
cp "$TMP/c_train.bin" "$TMP/noval_train.bin"
expect_exit 0 "$DSC" train "$MODEL" --data "$TMP/noval" "${SMALL[@]}" --steps 2 --eval-every 1 --log "$TMP/noval.jsonl"
[ "$(wc -l <"$TMP/noval.jsonl")" -eq 2 ] && ! grep -q val_loss "$TMP/noval.jsonl" && pass || fail "run without val shard"
# a validation shard shorter than one window: a warning, and training goes on
head -c 400 "$SRC/examples/gpt-tiny.dsm" >"$TMP/short.txt"
expect_exit 0 "$DSC" data "$TMP/short.txt" -o "$TMP/short"
expect_exit 0 "$DSC" train "$MODEL" --data "$TMP/short" --batch 2 --seq 48 --steps 2 --quiet &&
  expect_grep 'short_val.bin: warning: holds fewer than seq \+ 1 = 49 tokens; training without validation' "$TMP/err"
# no --out: said at the start
expect_grep 'no --out, so no checkpoint will be saved' "$TMP/err"
finish
