# dsc train --mesh tp=N: tensor parallelism (Megatron's column- and
# row-parallel matmuls and vocabulary-parallel loss, found by pass
# tensor_parallel). The tiny GPT at tp 2 and tp 4 (in-process ranks and
# mpirun), dp 2 x tp 2 under ZeRO-3 (and stopped, resumed on 2 data ranks),
# with grad_accum 2 under ZeRO-2, selective remat, the interpreter, the tiny
# Llama (rope, grouped-query attention, SwiGLU) at tp 2 and the MoE GPT at
# ep 2 x tp 2 follow the loss curve of the run without tp on the same global
# batch and end at the same weights (1e-5 relative to each tensor); bf16
# follows bf16's curve; the same run twice is bitwise identical; a mesh that
# does not fit the model is refused before anything runs, naming the
# numbers; dsc plan names the tp collectives and shows the activations per
# rank falling.
source "$(dirname "$0")/lib/common.bash"
source "$(dirname "$0")/lib/corpus.bash"
source "$(dirname "$0")/lib/mesh.bash"
GPT="$SRC/examples/gpt-tiny.dsm"
LLAMA="$SRC/examples/llama-tiny.dsm"
export DSC_CACHE_DIR="$TMP/kernel-cache"

make_corpus "$TMP/corpus.txt"
expect_exit 0 "$DSC" data "$TMP/corpus.txt" -o "$TMP/c"
RUN=(--data "$TMP/c" --batch 2 --seq 32 --lr 3e-3 --steps 6 --eval-every 0 --quiet)

expect_exit 0 "$DSC" train --help && expect_grep '^  --mesh dp=D,sp=S  the ranks as a mesh \(axes dp, ep, sp, tp' "$TMP/out"

# refused before anything runs, naming the numbers
expect_exit 1 "$DSC" train "$GPT" "${RUN[@]}" --ranks 8 --mesh tp=8 &&
  expect_grep "tensor parallel \(tp=8\) gives each rank 1/tp of this attention's heads: heads 4 is not divisible by 8" "$TMP/err"
expect_exit 1 "$DSC" train "$LLAMA" "${RUN[@]}" --ranks 4 --mesh tp=4 &&
  expect_grep "this attention's kv_heads: kv_heads 2 is not divisible by 4" "$TMP/err"
expect_exit 1 "$DSC" train "$GPT" "${RUN[@]}" --ranks 4 --mesh tp=2 --global-batch 2 &&
  expect_grep 'global batch of 2 sequences is not divisible by batch 2 x data ranks 2 = 4' "$TMP/err"

# the same global batch (2 sequences of 32 tokens) at tp 1, 2, 4
expect_exit 0 "$DSC" train "$GPT" "${RUN[@]}" --out "$TMP/g1"
expect_exit 0 "$DSC" train "$GPT" "${RUN[@]}" --ranks 2 --mesh tp=2 --out "$TMP/t2"
expect_exit 0 "$DSC" train "$GPT" "${RUN[@]}" --ranks 2 --mesh tp=2 --out "$TMP/t2b"
expect_exit 0 "$DSC" train "$GPT" "${RUN[@]}" --ranks 4 --mesh tp=4 --out "$TMP/t4"
expect_exit 0 "$DSC" train "$GPT" --data "$TMP/c" --batch 2 --seq 32 --steps 1 --eval-every 0 \
  --ranks 4 --mesh dp=2,tp=2 &&
  expect_grep '^batch 2 x seq 32 x grad_accum 1 x 4 ranks \(inproc, mesh dp=2,tp=2\) = 128 tokens/step' "$TMP/out"
# 4 sequences: two data ranks, or two rows of a dp 2 x tp 2 mesh at ZeRO-3
expect_exit 0 "$DSC" train "$GPT" "${RUN[@]}" --ranks 2 --out "$TMP/d2"
expect_exit 0 "$DSC" train "$GPT" "${RUN[@]}" --ranks 4 --mesh dp=2,tp=2 --zero-stage 3 \
  --out "$TMP/d2t2"
expect_exit 0 "$DSC" export "$TMP/d2t2" -o "$TMP/d2t2/export.safetensors"
# stopped at tp 2 after 3 steps, resumed on one rank: the checkpoint
# records tp, so the data ranks (and the global batch) are the same
expect_exit 0 "$DSC" train "$GPT" "${RUN[@]}" --ranks 4 --mesh dp=2,tp=2 --stop-at 3 \
  --out "$TMP/s4"
expect_exit 0 "$DSC" train --resume "$TMP/s4" --ranks 2 --quiet
# the micro-batch loop (its collectives per micro-batch at ZeRO-2) and remat
expect_exit 0 "$DSC" train "$GPT" "${RUN[@]}" --grad-accum 2 --out "$TMP/a1"
expect_exit 0 "$DSC" train "$GPT" "${RUN[@]}" --grad-accum 2 --ranks 2 --mesh tp=2 \
  --zero-stage 2 --out "$TMP/a2"
expect_exit 0 "$DSC" export "$TMP/a2" -o "$TMP/a2/export.safetensors"
expect_exit 0 "$DSC" train "$GPT" "${RUN[@]}" --checkpoint-activations selective --ranks 2 \
  --mesh tp=2 --out "$TMP/r2"
# the reference interpreter runs the same split
expect_exit 0 "$DSC" train "$GPT" "${RUN[@]}" --steps 2 --backend interp --out "$TMP/i1"
expect_exit 0 "$DSC" train "$GPT" "${RUN[@]}" --steps 2 --backend interp --ranks 2 --mesh tp=2 \
  --out "$TMP/i2"
# rope, grouped-query attention (4 heads, 2 key/value heads), SwiGLU, no biases
expect_exit 0 "$DSC" train "$LLAMA" "${RUN[@]}" --out "$TMP/l1"
expect_exit 0 "$DSC" train "$LLAMA" "${RUN[@]}" --ranks 2 --mesh tp=2 --out "$TMP/l2"
# MoE: the experts over ep=2 (their capacities per micro-batch, so the
# reference runs grad-accum 2 on one rank), the attention and the loss over tp=2
MOE="$SRC/examples/moe-tiny.dsm"
expect_exit 0 "$DSC" train "$MOE" "${RUN[@]}" --grad-accum 2 --out "$TMP/w1"
expect_exit 0 "$DSC" train "$MOE" "${RUN[@]}" --ranks 4 --mesh ep=2,tp=2 --out "$TMP/et"
# bf16: the split rounds its partial sums differently, so the curve within bf16's 2e-3
expect_exit 0 "$DSC" train "$GPT" "${RUN[@]}" --precision bf16 --out "$TMP/b1"
expect_exit 0 "$DSC" train "$GPT" "${RUN[@]}" --precision bf16 --ranks 2 --mesh tp=2 --out "$TMP/b2"
pairs="t2:g1 t4:g1 d2t2:d2 s4:d2 a2:a1 r2:g1 i2:i1 l2:l1 et:w1"
mpi_train "$TMP/m2" "$GPT" "${RUN[@]}" --mesh tp=2 && pairs="$pairs m2:g1"

for f in model.safetensors optimizer.safetensors; do
  cmp -s "$TMP/t2/latest/$f" "$TMP/t2b/latest/$f" && pass || fail "tp 2 twice: $f differs"
done
# shellcheck disable=SC2086
same_runs tensor-parallel $pairs
PYTHONPATH="$SRC/tests/cli/lib" python3 -c "import sys; from curves import assert_same; assert_same(sys.argv[1], 'b1', ['b2'], 6, rel=2e-3)" "$TMP" &&
  pass || fail "bf16 at tp 2 does not follow bf16's curve"

# the plan: Llama 7B at 16384 positions on 8 ranks; with tp 8 each rank
# holds 1/8 of the attention and MLP activations (the residual stream,
# norms and logits stay whole, as in Megatron without sequence parallelism)
L7="$SRC/examples/llama-7b.dsm"
plan_activations_fall tp 8 3 "$L7" --world 8 --batch 1 --seq 16384 --grad-accum 1 --zero-stage 3
expect_exit 0 "$DSC" plan "$L7" --world 8 --batch 1 --seq 16384 --grad-accum 1 --zero-stage 3 \
  --mesh tp=8 &&
  expect_grep "^tensor parallel over tp = 8 ranks: each computes 1/8 of every attention's heads" "$TMP/out"
# the plan names each collective's group: 2 layers x (2 all_reduces forward
# + 2 backward), and the loss's all_reduce (target logits) and all_gather
# (log-sum-exps), forward and backward
expect_exit 0 "$DSC" plan "$GPT" --world 4 --mesh dp=2,tp=2 --zero-stage 3 &&
  expect_grep '^  stage 3: world all_gather x [0-9]+: .*, tp all_reduce x 10: [0-9.]+ [KM]iB, tp all_gather x 1: 2.00 KiB, world all_reduce x 2: 8 B, tp reduce_scatter x 1: 4.00 KiB, world reduce_scatter x 1: ' "$TMP/out"
finish
