# dsc compile: the tiny GPT's graphs and kernels in a .dsx program file.
# Training from the .dsx runs the same kernels as training from the .dsm
# (identical losses, bit for bit), loads every kernel instead of compiling
# it (the executors' counts say so), and resumes and samples like a model
# file; --target cuda writes CUDA C, PTX and cubin per graph; damaged files,
# changed graph flags and files of the wrong kind are clear errors.
source "$(dirname "$0")/lib/common.bash"
source "$(dirname "$0")/lib/corpus.bash"
MODEL="$SRC/examples/gpt-tiny.dsm"
export DSC_CACHE_DIR=off # "0 compiled" must come from the .dsx, not a kernel cache

expect_exit 0 "$DSC" compile --help && expect_grep '^usage: dsc compile MODEL.dsm' "$TMP/out"
expect_exit 1 "$DSC" compile && expect_grep 'missing model file' "$TMP/err"
expect_exit 1 "$DSC" compile "$MODEL" --target tpu && expect_grep 'not one of cpu, cuda' "$TMP/err"

if ! "$DSC" run "$MODEL" --backend cpu --quiet >/dev/null 2>&1; then
  expect_exit 1 "$DSC" compile "$MODEL" -o "$TMP/g.dsx" && expect_grep 'built without' "$TMP/err"
  echo "cpu backend not built: only the error checks ran"
  finish
  exit
fi

# Default output: MODEL.dsx in the current directory.
(cd "$TMP" && "$DSC" compile "$MODEL" >"$TMP/out" 2>"$TMP/err") && pass || fail "compile failed"
[ -s "$TMP/gpt-tiny.dsx" ] && pass || fail "no gpt-tiny.dsx in the current directory"
expect_grep '^wrote gpt-tiny.dsx: 2 graphs, [0-9]+ kernels for cpu' "$TMP/out"
G="$TMP/gpt-tiny.dsx"
expect_exit 0 "$DSC" compile --list "$G"
for s in meta module.step cpu/step/train_step module.forward cpu/forward/forward; do
  expect_grep "^  $s +[0-9]+ bytes" "$TMP/out"
done
expect_grep '^  target +cpu' "$TMP/out" && expect_grep '^  seq +64' "$TMP/out"

make_corpus "$TMP/corpus.txt"
expect_exit 0 "$DSC" data "$TMP/corpus.txt" -o "$TMP/c"
train() { # OUT MODEL ARGS...: 20 steps, fixed seed, validation every 10
  local log=$1 model=$2
  shift 2
  expect_exit 0 "$DSC" train "$model" --data "$TMP/c" --steps 20 --seed 5 --threads 2 \
    --eval-every 10 --eval-batches 2 --log "$log" "$@"
}
train "$TMP/dsm.jsonl" "$MODEL" --quiet
train "$TMP/dsx.jsonl" "$G" && cp "$TMP/out" "$TMP/first"
# Every kernel of both graphs comes from the file: none is compiled.
expect_grep "^program .*gpt-tiny.dsx: [1-9][0-9]* kernels loaded, 0 compiled$" "$TMP/first"
train "$TMP/dsx2.jsonl" "$G"
expect_grep "^program .*gpt-tiny.dsx: [1-9][0-9]* kernels loaded, 0 compiled$" "$TMP/out"
same_losses() { # A B: equal loss and val_loss at every step
  python3 - "$1" "$2" <<'EOF'
import json, sys
a, b = ([json.loads(l) for l in open(p)] for p in sys.argv[1:])
assert len(a) == len(b) == 20, (len(a), len(b))
for x, y in zip(a, b):
    for k in ("loss", "grad_norm", "val_loss"):
        assert x.get(k) == y.get(k), (x["step"], k, x.get(k), y.get(k))
assert sum("val_loss" in x for x in a) == 2
EOF
}
same_losses "$TMP/dsm.jsonl" "$TMP/dsx.jsonl" && pass || fail ".dsx and .dsm losses differ"
same_losses "$TMP/dsx.jsonl" "$TMP/dsx2.jsonl" && pass || fail "two .dsx runs differ"

# The interpreter runs the file's (decomposed, fused) graphs.
expect_exit 0 "$DSC" train "$G" --data "$TMP/c" --steps 2 --backend interp --quiet

# dsc run: the forward graph with the file's kernels, the .dsm's loss.
expect_exit 0 "$DSC" run "$G" --seed 3 && cp "$TMP/out" "$TMP/run_dsx"
expect_grep "kernels loaded, 0 compiled" "$TMP/err"
expect_exit 0 "$DSC" run "$MODEL" --seed 3 --batch 8 --seq 64 --quiet
cmp -s "$TMP/out" "$TMP/run_dsx" && pass || fail "dsc run: .dsx and .dsm outputs differ"

# Resume and sample from a run trained from the .dsx.
expect_exit 0 "$DSC" train "$G" --data "$TMP/c" --steps 6 --stop-at 3 --out "$TMP/run" --quiet
expect_exit 0 "$DSC" train --resume "$TMP/run" --quiet
expect_exit 0 "$DSC" sample "$TMP/run" --tokens 5 --seed 1

# Graph flags are fixed in the file; run-time flags are not.
expect_exit 1 "$DSC" train "$G" --data "$TMP/c" --seq 32 &&
  expect_grep 'gpt-tiny.dsx: error: was compiled with --seq 64, not 32' "$TMP/err"
expect_exit 1 "$DSC" train "$G" --data "$TMP/c" --grad-accum 2 && expect_grep 'grad-accum 1, not 2' "$TMP/err"
expect_exit 1 "$DSC" train "$G" --data "$TMP/c" --precision bf16 && expect_grep 'precision f32, not bf16' "$TMP/err"
expect_exit 1 "$DSC" run "$G" --batch 2 && expect_grep 'compiled with --batch 8, not 2' "$TMP/err"
expect_exit 0 "$DSC" train "$G" --data "$TMP/c" --batch 8 --seq 64 --steps 2 --lr 1e-3 --quiet

# Damaged files and files of the wrong kind.
python3 - "$G" "$TMP" <<'EOF'
import sys
data = open(sys.argv[1], "rb").read()
out = sys.argv[2]
open(out + "/trunc.dsx", "wb").write(data[: len(data) // 2])
bad = bytearray(data); bad[len(data) - 100] ^= 0xFF
open(out + "/corrupt.dsx", "wb").write(bad)
v2 = bytearray(data); v2[4] = 2
open(out + "/v2.dsx", "wb").write(v2)
EOF
expect_exit 1 "$DSC" train "$TMP/trunc.dsx" --data "$TMP/c" && expect_grep 'runs past the end \(truncated\?\)' "$TMP/err"
expect_exit 1 "$DSC" run "$TMP/corrupt.dsx" && expect_grep 'is corrupted \(checksum\)' "$TMP/err"
expect_exit 1 "$DSC" run "$TMP/v2.dsx" && expect_grep 'format version 2, this dsc reads version 1' "$TMP/err"
cp "$MODEL" "$TMP/renamed.dsx"
expect_exit 1 "$DSC" train "$TMP/renamed.dsx" --data "$TMP/c" && expect_grep 'not a compiled program' "$TMP/err"
expect_exit 1 "$DSC" run "$TMP/renamed.dsx" && expect_grep 'not a compiled program' "$TMP/err"
expect_exit 1 "$DSC" compile --list "$TMP/renamed.dsx" && expect_grep 'not a compiled program' "$TMP/err"
expect_exit 1 "$DSC" check "$G" && expect_grep 'is a compiled program \(.dsx\), not a model file' "$TMP/err"
expect_exit 1 "$DSC" compile "$G" && expect_grep 'is a compiled program \(.dsx\) already' "$TMP/err"

# --target cuda: CUDA C, PTX and cubin for every graph (NVRTC; no GPU needed).
if "$DSC" compile "$MODEL" --target cuda -o "$TMP/cuda.dsx" >"$TMP/out" 2>"$TMP/err"; then
  expect_exit 0 "$DSC" compile --list "$TMP/cuda.dsx" && expect_grep '^  host +sm_90' "$TMP/out"
  for g in step/train_step forward/forward; do
    for ext in cu ptx cubin; do expect_grep "^  cuda/$g\\.$ext +[1-9][0-9]* bytes" "$TMP/out"; done
  done
  # The cpu backend compiles its kernels from the file's IR, and says why.
  train "$TMP/cuda.jsonl" "$TMP/cuda.dsx" --backend cpu
  expect_grep 'cuda.dsx: warning: compiling the kernels from the IR: it holds cuda kernels' "$TMP/err"
  expect_grep "0 kernels loaded, [1-9][0-9]* compiled" "$TMP/out"
  same_losses "$TMP/dsm.jsonl" "$TMP/cuda.jsonl" && pass || fail "cuda .dsx on cpu: losses differ"
  # grad_accum 2: the micro-batch loop's two step graphs, each its own NVRTC program
  expect_exit 0 "$DSC" compile "$MODEL" --target cuda --grad-accum 2 -o "$TMP/cuda2.dsx" &&
    expect_grep '3 graphs, [1-9][0-9]* kernels for cuda' "$TMP/out"
  expect_exit 0 "$DSC" compile --list "$TMP/cuda2.dsx"
  for g in step/train_step step/micro_step; do
    for ext in cu ptx cubin; do expect_grep "^  cuda/$g\\.$ext +[1-9][0-9]* bytes" "$TMP/out"; done
  done
elif grep -q 'built without' "$TMP/err"; then
  echo "--target cuda: this build has no NVRTC; skipped the cuda checks"
else
  fail "dsc compile --target cuda failed"; sed 's/^/    /' "$TMP/err" | head
fi
finish
