# dsc train --ranks N and mpirun -np N dsc train: data parallelism at ZeRO
# stage 0. The tiny GPT trained 12 steps with the same global batch (8
# sequences) at world 1 (grad-accum 4), 2 (2) and 4 (1) follows the same loss
# curve and ends at the same weights; the same run twice is bitwise identical;
# rank 0 alone prints and saves; bad flags and unsupported settings are clear
# errors.
source "$(dirname "$0")/lib/common.bash"
source "$(dirname "$0")/lib/corpus.bash"
MODEL="$SRC/examples/gpt-tiny.dsm"
export DSC_CACHE_DIR="$TMP/kernel-cache"

for bad in "--ranks 0" "--ranks x" "--ranks 2000" "--ranks" "--zero-stage 4" "--zero-stage -1" \
  "--global-batch 0"; do
  # shellcheck disable=SC2086
  expect_exit 1 "$DSC" train "$MODEL" --data x $bad && expect_grep 'needs' "$TMP/err"
done
expect_exit 0 "$DSC" train --help && expect_grep '^  --ranks N ' "$TMP/out"

make_corpus "$TMP/corpus.txt"
expect_exit 0 "$DSC" data "$TMP/corpus.txt" -o "$TMP/c"
RUN=(--data "$TMP/c" --batch 2 --seq 16 --global-batch 8 --lr 3e-3 --backend interp)

expect_exit 1 "$DSC" train "$MODEL" "${RUN[@]}" --ranks 3 &&
  expect_grep 'global batch of 8 sequences is not divisible by batch 2 x world 3 = 6' "$TMP/err"
expect_exit 1 "$DSC" train "$MODEL" "${RUN[@]}" --ranks 2 --grad-accum 4 &&
  expect_grep 'global batch 8 is not batch 2 x grad_accum 4 x world 2 = 16' "$TMP/err"
# a rank that fails (here every rank: no such data) ends the run with its error
expect_exit 1 "$DSC" train "$MODEL" --data "$TMP/none" --ranks 2 &&
  expect_grep 'none_train.bin.*cannot open' "$TMP/err"

# world 1, 2, 4 and ZeRO stages 1-3: same global batch; rank 0 prints one
# line per step and saves (full tensors, whatever the sharding)
for ws in 1:0 2:0 4:0 2:1 4:2 2:3 4:3; do
  w=${ws%:*} s=${ws#*:} dir=w${ws%:*}
  [ "$s" = 0 ] || dir=w${w}s$s
  expect_exit 0 "$DSC" train "$MODEL" "${RUN[@]}" --ranks $w --zero-stage $s --steps 12 \
    --out "$TMP/$dir" --eval-every 6 --eval-batches 2
  [ "$(grep -c '^step ' "$TMP/out")" -eq 12 ] && pass || fail "$dir: not 12 progress lines"
  [ "$w" = 1 ] || expect_grep "^batch 2 x seq 16 x grad_accum $((4 / w)) x $w ranks \\(inproc\\) = 128 tokens/step, ZeRO stage $s" "$TMP/out"
  expect_grep '^step 12/12 \| loss [0-9.]+ .* \| val [0-9.]+ \| saved' "$TMP/out"
  if [ "$s" != 0 ]; then # each rank wrote its shards; export consolidates them
    [ "$(ls "$TMP/$dir/latest" | grep -c '^shard-0000[0-3]-of-0000'"$w"'.safetensors$')" -eq "$w" ] &&
      pass || fail "$dir: not $w shard files"
    expect_exit 0 "$DSC" export "$TMP/$dir" -o "$TMP/$dir/export.safetensors"
  fi
done
# selective unsharding (every param kept from forward to backward): same curve
expect_exit 0 "$DSC" train "$MODEL" "${RUN[@]}" --ranks 2 --zero-stage 3 --unshard-bytes 1GiB \
  --steps 12 --out "$TMP/w2s3u" --eval-every 6 --eval-batches 2 --quiet
expect_exit 0 "$DSC" export "$TMP/w2s3u" -o "$TMP/w2s3u/export.safetensors"
# ZeRO stage 3 saved at world 4 after 6 steps, resumed at world 2 stage 1:
# the same curve as the uninterrupted run
expect_exit 0 "$DSC" train "$MODEL" "${RUN[@]}" --ranks 4 --zero-stage 3 --steps 12 --stop-at 6 \
  --out "$TMP/rs" --eval-every 6 --eval-batches 2 --quiet
expect_exit 0 "$DSC" train --resume "$TMP/rs" --ranks 2 --zero-stage 1 --eval-batches 2 --quiet
[ "$(wc -l <"$TMP/rs/metrics.jsonl")" -eq 12 ] && pass || fail "resumed run: not 12 metrics lines"
ln -s "$TMP/rs" "$TMP/w2s9"
expect_exit 0 "$DSC" export "$TMP/rs" -o "$TMP/rs/export.safetensors"
# a ZeRO checkpoint with a shard missing or damaged is refused by name
cp -r "$TMP/w2s3/step-000012" "$TMP/bad1" && rm "$TMP/bad1/shard-00001-of-00002.safetensors"
expect_exit 1 "$DSC" export "$TMP/bad1" -o "$TMP/x.safetensors" &&
  expect_grep 'shard-00001-of-00002.safetensors: error: checkpoint file is missing \(the checkpoint has 2 shards\)' "$TMP/err"
cp -r "$TMP/w2s3/step-000012" "$TMP/bad2" && truncate -s 100 "$TMP/bad2/shard-00000-of-00002.safetensors"
expect_exit 1 "$DSC" train --resume "$TMP/bad2" --ranks 2 --steps 14 &&
  expect_grep 'shard-00000-of-00002.safetensors' "$TMP/err"
[ ! -e "$TMP/x.safetensors" ] && pass || fail "export wrote a file from a damaged checkpoint"
PYTHONPATH="$SRC/tests/cli/lib" python3 - "$TMP" <<'PY' && pass || fail "world 1, 2, 4 differ"
import json, sys
from curves import safetensors as tensors
root = sys.argv[1]
def metrics(w):
    return [json.loads(l) for l in open(f"{root}/w{w}/metrics.jsonl")]
import numpy as np
base = metrics(1)
assert len(base) == 12 and base[0]["loss"] > 5.0 and base[-1]["loss"] < base[0]["loss"], base
for w in (2, 4, "2s1", "4s2", "2s3", "4s3", "2s9", "2s3u"):  # 2s9: stage 3 at 4 ranks resumed at stage 1, 2 ranks
    m = metrics(w)
    for a, b in zip(m, base):
        for k in ("loss", "grad_norm", "lr"):
            assert abs(a[k] - b[k]) <= 1e-5 * abs(b[k]), (w, k, a, b)
        assert ("val_loss" in a) == ("val_loss" in b)
        if "val_loss" in a:
            assert abs(a["val_loss"] - b["val_loss"]) <= 1e-5 * abs(b["val_loss"]), (w, a, b)
    exported = f"{root}/w{w}/export.safetensors"  # ZeRO checkpoints: consolidated by dsc export
    import os
    ta = tensors(exported if os.path.exists(exported) else f"{root}/w{w}/latest/model.safetensors")
    tb = tensors(f"{root}/w1/latest/model.safetensors")
    assert ta.keys() == tb.keys()
    for k in tb:
        # attn_b's key part has a gradient that is zero in exact arithmetic
        # (softmax ignores a shift of all scores): rounding noise there becomes
        # lr-sized Adam steps whatever the summation order (measured up to 6e-7).
        atol = 2e-6 if k.endswith("attn_b") else 1e-7
        assert np.allclose(ta[k], tb[k], rtol=1e-5, atol=atol), (w, k, np.abs(ta[k] - tb[k]).max())
PY
state_world() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["extra"]["world"])' "$1"; }
[ "$(state_world "$TMP/w2/latest/state.json")" = 2 ] && pass || fail "state.json does not record world 2"

# the same run twice: bitwise identical checkpoints
expect_exit 0 "$DSC" train "$MODEL" "${RUN[@]}" --ranks 2 --steps 12 --out "$TMP/w2b" \
  --eval-every 6 --eval-batches 2 --quiet
for f in model.safetensors optimizer.safetensors; do
  cmp -s "$TMP/w2/latest/$f" "$TMP/w2b/latest/$f" && pass || fail "world 2 twice: $f differs"
done

# the same ZeRO stage 3 run twice: bitwise identical checkpoints
expect_exit 0 "$DSC" train "$MODEL" "${RUN[@]}" --ranks 2 --zero-stage 3 --steps 12 \
  --out "$TMP/w2s3b" --eval-every 6 --eval-batches 2 --quiet
for f in model.safetensors optimizer.safetensors; do
  cmp -s "$TMP/w2s3/latest/$f" "$TMP/w2s3b/latest/$f" && pass || fail "stage 3 twice: $f differs"
done

# resume at another world size (checkpoints hold full tensors)
expect_exit 0 "$DSC" train --resume "$TMP/w2b" --steps 14 --ranks 4 --quiet

# SIGTERM: every rank stops after the same step; rank 0 checkpoints it
"$DSC" train "$MODEL" "${RUN[@]}" --ranks 2 --steps 100000 --out "$TMP/sig" --quiet \
  >"$TMP/out" 2>"$TMP/err" &
pid=$!
for _ in $(seq 1 600); do
  [ -s "$TMP/sig/metrics.jsonl" ] && break
  sleep 0.05
done
kill -TERM $pid
wait $pid
code=$?
[ $code -eq 143 ] && pass || fail "SIGTERM with --ranks 2: exit $code, expected 143"
expect_grep 'stopped by SIGTERM at step [0-9]+; checkpoint' "$TMP/err"
[ -e "$TMP/sig/latest/model.safetensors" ] && pass || fail "SIGTERM: no checkpoint"

# the cpu backend, where it is built: same curve as the interpreter
if "$DSC" run "$MODEL" --backend cpu --quiet >/dev/null 2>&1; then
  expect_exit 0 "$DSC" train "$MODEL" "${RUN[@]/interp/cpu}" --threads 1 --ranks 2 --steps 12 \
    --log "$TMP/cpu2.jsonl" --quiet
  python3 - "$TMP/w1/metrics.jsonl" "$TMP/cpu2.jsonl" <<'PY' && pass || fail "cpu world 2 differs"
import json, sys
a, b = [[json.loads(l) for l in open(p)] for p in sys.argv[1:]]
assert len(a) == len(b) == 12
for x, y in zip(a, b):
    assert abs(x["loss"] - y["loss"]) <= 1e-5 * abs(x["loss"]), (x, y)
PY
else
  echo "cpu backend not built: skipped its data-parallel run"
fi

# mpirun -np 2 dsc train equals --ranks 2 (where dsc is built with MPI)
if command -v mpirun >/dev/null 2>&1; then
  # (Open MPI's own allocations are not dsc's leaks under ASan)
  MPI=(env ASAN_OPTIONS=detect_leaks=0 mpirun -x ASAN_OPTIONS -np 2 --oversubscribe --allow-run-as-root)
  "${MPI[@]}" "$DSC" train "$MODEL" "${RUN[@]}" --steps 12 --log "$TMP/mpi.jsonl" \
    >"$TMP/out" 2>"$TMP/err"
  code=$?
  if [ $code -eq 1 ] && grep -q 'built without MPI' "$TMP/err"; then
    echo "dsc built without MPI: skipped mpirun"
  elif [ $code -ne 0 ]; then
    fail "mpirun -np 2 dsc train exited $code"
    sed 's/^/    /' "$TMP/err" | head -20
  else
    pass
    expect_grep '^batch 2 x seq 16 x grad_accum 2 x 2 ranks \(mpi\)' "$TMP/out"
    [ "$(grep -c '^step ' "$TMP/out")" -eq 12 ] && pass || fail "mpirun: not 12 progress lines"
    python3 - "$TMP/w2/metrics.jsonl" "$TMP/mpi.jsonl" <<'PY' && pass || fail "mpirun differs from --ranks 2"
import json, sys
a, b = [[json.loads(l) for l in open(p)] for p in sys.argv[1:]]
assert len(a) == len(b) == 12
for x, y in zip(a, b):
    assert x["loss"] == y["loss"] and x["grad_norm"] == y["grad_norm"], (x, y)
PY
    # ZeRO stage 3 under Open MPI: the same curve as --ranks 2, and its
    # checkpoint (each process wrote its shard) resumes at --ranks 1
    "${MPI[@]}" "$DSC" train "$MODEL" "${RUN[@]}" --zero-stage 3 --steps 12 --out "$TMP/mpi3" \
      --eval-every 6 --eval-batches 2 >"$TMP/out" 2>"$TMP/err"
    [ $? -eq 0 ] && pass || { fail "mpirun stage 3 failed"; sed 's/^/    /' "$TMP/err" | head; }
    python3 - "$TMP/w2s3/metrics.jsonl" "$TMP/mpi3/metrics.jsonl" <<'PY' && pass || fail "mpirun stage 3 differs from --ranks 2"
import json, sys
a, b = [[json.loads(l) for l in open(p)] for p in sys.argv[1:]]
assert len(a) == len(b) == 12
for x, y in zip(a, b):
    assert x["loss"] == y["loss"] and x["grad_norm"] == y["grad_norm"], (x, y)
PY
    cmp -s "$TMP/w2s3/latest/shard-00001-of-00002.safetensors" \
      "$TMP/mpi3/latest/shard-00001-of-00002.safetensors" && pass || fail "mpirun stage 3: rank 1's shard differs"
    # a failing rank ends the job with its error (here: every rank, no data)
    "${MPI[@]}" "$DSC" train "$MODEL" --data "$TMP/none" >"$TMP/out" 2>"$TMP/err"
    [ $? -ne 0 ] && pass || fail "mpirun with missing data exited 0"
    expect_grep 'none_train.bin: error: cannot open' "$TMP/err"
    expect_grep 'dsc: rank [01]: aborting: dsc train failed on rank [01]' "$TMP/err"
    # --ranks under mpirun is a usage error on every process
    expect_exit 1 "${MPI[@]}" "$DSC" train "$MODEL" "${RUN[@]}" --ranks 2 &&
      expect_grep 'under mpirun \(2 processes\) each process is a rank already' "$TMP/err"
  fi
fi
finish
