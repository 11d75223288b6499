# dsc train --mesh ep=N: expert parallelism on examples/moe-tiny.dsm (4
# experts per layer, top-2). Every run trains the same micro-batches (2
# sequences of 32 tokens; 4 per step): world 1 with grad-accum 4 against
# dp 2 x ep 2 at world 4 (ZeRO 0 and 3), ep 4, ep 2 at world 2 (in-process
# and mpirun) and the interpreter; each follows the reference's loss curve
# and ends at its weights (1e-5 relative to each tensor); the same run
# twice is bitwise identical; experts not divisible by ep, or a model
# without experts, are refused before anything runs; dsc plan names the ep
# exchanges.
source "$(dirname "$0")/lib/common.bash"
source "$(dirname "$0")/lib/corpus.bash"
source "$(dirname "$0")/lib/mesh.bash"
MOE="$SRC/examples/moe-tiny.dsm"
export DSC_CACHE_DIR="$TMP/kernel-cache"

make_corpus "$TMP/corpus.txt"
expect_exit 0 "$DSC" data "$TMP/corpus.txt" -o "$TMP/c"
RUN=(--data "$TMP/c" --batch 2 --seq 32 --steps 6 --eval-every 0 --quiet)

expect_exit 1 "$DSC" train "$MOE" "${RUN[@]}" --ranks 6 --mesh dp=2,ep=3 &&
  expect_grep 'expert parallelism \(ep=3\) gives each rank experts / ep of each MoE layer: 4 experts are not divisible by 3' "$TMP/err"
expect_exit 1 "$DSC" train "$SRC/examples/gpt-tiny.dsm" "${RUN[@]}" --ranks 2 --mesh ep=2 &&
  expect_grep "expert parallel \(ep=2\): graph 'forward' has no experts" "$TMP/err"

expect_exit 0 "$DSC" train "$MOE" "${RUN[@]}" --grad-accum 4 --out "$TMP/w1"
expect_exit 0 "$DSC" train "$MOE" "${RUN[@]}" --ranks 4 --mesh dp=2,ep=2 --out "$TMP/e22"
expect_exit 0 "$DSC" train "$MOE" "${RUN[@]}" --ranks 4 --mesh dp=2,ep=2 --out "$TMP/e22b"
expect_exit 0 "$DSC" train "$MOE" "${RUN[@]}" --ranks 4 --mesh dp=2,ep=2 --zero-stage 3 \
  --out "$TMP/e22z3"
expect_exit 0 "$DSC" export "$TMP/e22z3" -o "$TMP/e22z3/export.safetensors"
expect_exit 0 "$DSC" train "$MOE" "${RUN[@]}" --ranks 4 --mesh ep=4 --out "$TMP/e4"
expect_exit 0 "$DSC" train "$MOE" "${RUN[@]}" --ranks 2 --mesh ep=2 --grad-accum 2 --out "$TMP/e2"
# the reference interpreter runs the same exchanges
expect_exit 0 "$DSC" train "$MOE" "${RUN[@]}" --steps 2 --backend interp --grad-accum 2 --out "$TMP/i1"
expect_exit 0 "$DSC" train "$MOE" "${RUN[@]}" --steps 2 --backend interp --ranks 2 --mesh ep=2 \
  --out "$TMP/i2"
pairs="e22:w1 e22z3:w1 e4:w1 e2:w1 i2:i1"
mpi_train "$TMP/m2" "$MOE" "${RUN[@]}" --mesh ep=2 --grad-accum 2 && pairs="$pairs m2:w1"
for f in model.safetensors optimizer.safetensors; do
  cmp -s "$TMP/e22/latest/$f" "$TMP/e22b/latest/$f" && pass || fail "dp 2 x ep 2 twice: $f differs"
done
# shellcheck disable=SC2086
same_runs expert-parallel $pairs

# 2 layers x (an exchange in and one out) x (forward, backward)
expect_exit 0 "$DSC" plan "$MOE" --world 4 --mesh dp=2,ep=2 --zero-stage 0 &&
  expect_grep '^  stage 0: ep all_to_all x 8: ' "$TMP/out"
finish
