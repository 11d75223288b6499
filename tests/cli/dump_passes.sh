# dsc dump and the pass pipeline: --list-passes, --after, --print-after-all,
# --verify, --grad-accum, and the text round trip of the training step.
source "$(dirname "$0")/lib/common.bash"
GPT="$SRC/examples/gpt-tiny.dsm"
MLP="$SRC/examples/mlp.dsm"

expect_exit 0 "$DSC" dump --list-passes && expect_grep '^autodiff ' "$TMP/out" &&
  expect_grep '^optimizer ' "$TMP/out"
expect_exit 0 "$DSC" dump --help && expect_grep 'after PASS' "$TMP/out"

# the whole step of gpt-tiny: adamw states, clipping, assigns, [loss, grad_norm]
if expect_exit 0 "$DSC" dump "$GPT" --after optimizer -o "$TMP/step.dsir"; then
  expect_grep '^graph train_step\(%tokens: i32\[8,64\], %targets: i32\[8,64\], %lr: f32\[\]\) \{$' "$TMP/step.dsir"
  expect_grep '^state opt\.step: f32\[\] = zeros$' "$TMP/step.dsir"
  expect_grep '^state opt\.v\.h\.1\.fc_w: f32\[64,256\] = zeros$' "$TMP/step.dsir"
  expect_grep '= maximum\(' "$TMP/step.dsir"
  expect_grep 'assign\(%[0-9]+\) \{name = "wte"\}' "$TMP/step.dsir"
  expect_grep '^  return %[0-9]+, %[0-9]+$' "$TMP/step.dsir"
  if grep -q '^graph forward' "$TMP/step.dsir"; then fail "graph forward left in the step module"; else pass; fi
  # round trip: dumping the printed step gives the same bytes
  expect_exit 0 "$DSC" dump "$TMP/step.dsir" -o "$TMP/step2.dsir"
  if cmp -s "$TMP/step.dsir" "$TMP/step2.dsir"; then pass; else fail "step graph text does not round-trip"; fi
fi

# stop after autodiff: the differentiated forward, no step yet
expect_exit 0 "$DSC" dump "$MLP" --after autodiff --verify && {
  expect_grep '^graph forward\(' "$TMP/out"
  if grep -q 'train_step' "$TMP/out"; then fail "train_step after autodiff"; else pass; fi
}

# --print-after-all: one section per pass, in order
expect_exit 0 "$DSC" dump "$MLP" --print-after-all && {
  expect_grep '^// ---- IR after precision ----$' "$TMP/out"
  expect_grep '^// ---- IR after autodiff ----$' "$TMP/out"
  expect_grep '^// ---- IR after optimizer ----$' "$TMP/out"
  n_passes=$("$DSC" dump --list-passes | wc -l)
  [ "$(grep -c '^// ---- IR after' "$TMP/out")" -eq "$n_passes" ] && pass ||
    fail "expected $n_passes sections (one per pass)"
}

# sgd from mlp.dsm's train section, --batch and --grad-accum overrides
# (the optimizer builds one micro-batch's step; pass accumulate makes the loop)
expect_exit 0 "$DSC" dump "$MLP" --after optimizer --batch 4 --grad-accum 3 && {
  expect_grep '^graph train_step\(%x: f32\[4,32\], %labels: i32\[4\], %lr: f32\[\]\)' "$TMP/out"
  expect_grep '^state opt\.momentum\.w1: f32\[32,64\] = zeros$' "$TMP/out"
}
expect_exit 0 "$DSC" dump "$MLP" --after accumulate --batch 4 --grad-accum 3 --verify && {
  expect_grep '^graph train_step\(%lr: f32\[\]\)' "$TMP/out"
  expect_grep '^graph micro_step\(%x: f32\[4,32\], %labels: i32\[4\], %first: f32\[\]\)' "$TMP/out"
  expect_grep '^state acc\.0: f32\[\] = zeros$' "$TMP/out"
  expect_grep 'assign\(%[0-9]+\) \{name = "acc\.1"\}' "$TMP/out"
  expect_grep '^meta "accumulate\.steps" = "3"$' "$TMP/out"
}

# --precision: bf16 computes in bf16 with bf16 params and f32 master weights
# (autocast's f32 params with --master-weights false); fp16 adds the loss
# scale and `skipped`
expect_exit 0 "$DSC" dump "$MLP" --after optimizer --precision bf16 --verify && {
  expect_grep '= cast\(%[0-9]+\) \{dtype = bf16\} : bf16\[' "$TMP/out"
  expect_grep '^param w1: bf16\[32,64\]' "$TMP/out"
  expect_grep '^state opt\.master\.w1: f32\[32,64\] = copy\(w1\)$' "$TMP/out"
  expect_grep 'assign\(%[0-9]+\) \{name = "opt\.master\.w1"\}' "$TMP/out"
  expect_grep '^  return %[0-9]+, %[0-9]+$' "$TMP/out"
}
expect_exit 0 "$DSC" dump "$MLP" --after optimizer --precision bf16 --master-weights false --verify && {
  expect_grep '^param w1: f32\[32,64\]' "$TMP/out"
  grep -q 'opt\.master' "$TMP/out" && fail "autocast: master weights in the dump" || pass
}
expect_exit 0 "$DSC" dump "$MLP" --after optimizer --precision fp16 && {
  expect_grep '^state opt\.loss_scale: f32\[\] = const\(65536' "$TMP/out"
  expect_grep '^state opt\.hysteresis_left: f32\[\]' "$TMP/out"
  expect_grep '^  return %[0-9]+, %[0-9]+, %[0-9]+$' "$TMP/out"
}
expect_exit 1 "$DSC" dump "$MLP" --after optimizer --precision f8 && expect_grep "not one of f32, bf16, fp16" "$TMP/err"

# errors
expect_exit 1 "$DSC" dump "$MLP" --after nope && expect_grep "unknown pass 'nope' \(the passes are: precision, sequence_parallel, expert_parallel, tensor_parallel, autodiff, remat, optimizer" "$TMP/err"
expect_exit 1 "$DSC" dump "$MLP" --after && expect_grep 'after needs a pass name' "$TMP/err"
expect_exit 1 "$DSC" dump "$MLP" --after optimizer --grad-accum 0 && expect_grep 'not a positive integer' "$TMP/err"
expect_exit 1 "$DSC" dump "$MLP" --after optimizer --print-after-all && expect_grep 'exclude each other' "$TMP/err"
cat >"$TMP/bad.dsir" <<'DSIR'
module bad

meta "train.optimizer" = "adamw(lr = oops)"

param w: f32[2] = zeros

graph forward(%x: f32[2]) {
  %0 = param {name = "w"} : f32[2]
  %1 = mul(%x, %0) : f32[2]
  %2 = sum(%1) {axes = [0], keepdims = false} : f32[]
  return %2
}
DSIR
expect_exit 1 "$DSC" dump "$TMP/bad.dsir" --after optimizer && expect_grep "train.optimizer.lr" "$TMP/err"
# a step graph cannot be built twice
expect_exit 1 "$DSC" dump "$TMP/step.dsir" --after optimizer && expect_grep "no graph 'forward'" "$TMP/err"
finish
