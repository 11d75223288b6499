# dsc train --mesh sp=N: Ulysses sequence parallelism. The tiny GPT at sp 2
# and sp 4 (in-process ranks and mpirun), dp 2 x sp 2 under ZeRO-3, and the
# tiny Llama (rope, grouped-query attention) at sp 2 follow the loss curve
# of the run without sp on the same global batch and end at the same
# weights (1e-5 relative to each tensor); the same run twice is bitwise identical; a mesh
# that does not fit the model is refused before anything runs, naming the
# numbers; dsc plan shows the activations per rank falling with sp and
# names the group of every collective.
source "$(dirname "$0")/lib/common.bash"
source "$(dirname "$0")/lib/corpus.bash"
source "$(dirname "$0")/lib/mesh.bash"
GPT="$SRC/examples/gpt-tiny.dsm"
LLAMA="$SRC/examples/llama-tiny.dsm"
export DSC_CACHE_DIR="$TMP/kernel-cache"

make_corpus "$TMP/corpus.txt"
expect_exit 0 "$DSC" data "$TMP/corpus.txt" -o "$TMP/c"
RUN=(--data "$TMP/c" --batch 2 --seq 32 --lr 3e-3 --steps 6 --eval-every 0 --quiet)

expect_exit 0 "$DSC" train --help && expect_grep '^  --mesh dp=D,sp=S  the ranks as a mesh \(axes dp, ep, sp' "$TMP/out"

# refused before anything runs, naming the numbers
expect_exit 1 "$DSC" train "$GPT" "${RUN[@]}" --ranks 4 --mesh sp=3 &&
  expect_grep '\-\-mesh sp=3: the axes multiply to 3, which does not divide the world of 4 ranks' "$TMP/err"
expect_exit 1 "$DSC" train "$GPT" "${RUN[@]}" --ranks 8 --mesh sp=8 &&
  expect_grep "sequence parallel \(sp=8\) gives each rank heads / sp of attention's heads: heads 4 is not divisible by 8" "$TMP/err"
expect_exit 1 "$DSC" train "$LLAMA" "${RUN[@]}" --ranks 4 --mesh sp=4 &&
  expect_grep 'kv_heads 2 is not divisible by 4' "$TMP/err"
expect_exit 1 "$DSC" train "$GPT" "${RUN[@]}" --seq 30 --ranks 4 --mesh sp=4 &&
  expect_grep '\-\-mesh sp=4: the sequence length 30 is not divisible by 4' "$TMP/err"
expect_exit 1 "$DSC" train "$GPT" "${RUN[@]}" --ranks 4 --mesh sp=2 --global-batch 2 &&
  expect_grep 'global batch of 2 sequences is not divisible by batch 2 x data ranks 2 = 4' "$TMP/err"

# the same global batch (2 sequences of 32 tokens) at sp 1, 2, 4
expect_exit 0 "$DSC" train "$GPT" "${RUN[@]}" --out "$TMP/g1"
expect_exit 0 "$DSC" train "$GPT" "${RUN[@]}" --ranks 2 --mesh sp=2 --out "$TMP/g2"
expect_exit 0 "$DSC" train "$GPT" "${RUN[@]}" --ranks 2 --mesh sp=2 --out "$TMP/g2b"
expect_exit 0 "$DSC" train "$GPT" "${RUN[@]}" --ranks 4 --mesh sp=4 --out "$TMP/g4"
# 4 sequences: two data-parallel ranks, or two rows of a dp 2 x sp 2 mesh at ZeRO-3
expect_exit 0 "$DSC" train "$GPT" "${RUN[@]}" --ranks 2 --out "$TMP/d2"
expect_exit 0 "$DSC" train "$GPT" "${RUN[@]}" --ranks 4 --mesh dp=2,sp=2 --zero-stage 3 \
  --out "$TMP/d2s2"
expect_exit 0 "$DSC" export "$TMP/d2s2" -o "$TMP/d2s2/export.safetensors"
expect_exit 0 "$DSC" train "$GPT" --data "$TMP/c" --batch 2 --seq 32 --steps 1 --eval-every 0 \
  --ranks 4 --mesh dp=2,sp=2 &&
  expect_grep '^batch 2 x seq 32 x grad_accum 1 x 4 ranks \(inproc, mesh dp=2,sp=2\) = 128 tokens/step' "$TMP/out"
# the reference interpreter runs the same exchanges
expect_exit 0 "$DSC" train "$GPT" "${RUN[@]}" --steps 2 --backend interp --out "$TMP/i1"
expect_exit 0 "$DSC" train "$GPT" "${RUN[@]}" --steps 2 --backend interp --ranks 2 --mesh sp=2 \
  --out "$TMP/i2"
# rope positions and grouped-query attention (4 heads, 2 key/value heads)
expect_exit 0 "$DSC" train "$LLAMA" "${RUN[@]}" --out "$TMP/l1"
expect_exit 0 "$DSC" train "$LLAMA" "${RUN[@]}" --ranks 2 --mesh sp=2 --out "$TMP/l2"
pairs="g2:g1 g4:g1 d2s2:d2 i2:i1 l2:l1"
mpi_train "$TMP/m2" "$GPT" "${RUN[@]}" --mesh sp=2 && pairs="$pairs m2:g1"

for f in model.safetensors optimizer.safetensors; do
  cmp -s "$TMP/g2/latest/$f" "$TMP/g2b/latest/$f" && pass || fail "sp 2 twice: $f differs"
done
# shellcheck disable=SC2086
same_runs sequence-parallel $pairs

# the plan (the issue's case: Llama 7B at 65536 positions, 8 ranks): each
# rank holds seq / sp positions and heads / sp heads of attention, so its
# activations fall by about sp
L7="$SRC/examples/llama-7b.dsm"
plan_activations_fall sp 8 7 "$L7" --world 8 --batch 1 --seq 65536 --grad-accum 1 --zero-stage 3
expect_exit 0 "$DSC" plan "$L7" --world 8 --batch 1 --seq 65536 --grad-accum 1 --zero-stage 3 \
  --mesh sp=8 &&
  expect_grep '^sequence parallel over sp = 8 ranks: each holds 8192 of the 65536 positions' "$TMP/out"
# the plan names each collective's group: 2 layers x (2 exchanges forward + 2 backward)
expect_exit 0 "$DSC" plan "$GPT" --world 4 --mesh dp=2,sp=2 --zero-stage 3 &&
  expect_grep '^  stage 3: world all_gather x [0-9]+: .*, sp all_to_all x 8: 1.00 MiB, world all_reduce x 2: 8 B, world reduce_scatter x 1: ' "$TMP/out"
finish
