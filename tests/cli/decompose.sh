# The decompose pass from the command line: `dsc dump --after decompose` on
# the tiny GPT leaves no composite op, keeps the step's signature, and its
# text parses back to the same bytes.
source "$(dirname "$0")/lib/common.bash"
GPT="$SRC/examples/gpt-tiny.dsm"

expect_exit 0 "$DSC" dump --list-passes && expect_grep '^decompose ' "$TMP/out"

if expect_exit 0 "$DSC" dump "$GPT" --after decompose --verify -o "$TMP/dec.dsir"; then
  expect_grep '^graph train_step\(%tokens: i32\[8,64\], %targets: i32\[8,64\], %lr: f32\[\]\) \{$' "$TMP/dec.dsir"
  if grep -qE '= (softmax|log_softmax|layernorm|rmsnorm|attention|cross_entropy)\(' "$TMP/dec.dsir"; then
    fail "a composite op is left after decompose"
  else
    pass
  fi
  # the pieces: stable softmax (max, exp, sum), rsqrt norms, the per-head matmuls,
  # and the bounds-checked target read
  expect_grep '= max\(%[0-9]+\) \{axes = \[3\], keepdims = true\} : f32\[8,4,64,1\]$' "$TMP/dec.dsir"
  expect_grep '= matmul\(%[0-9]+, %[0-9]+\) : f32\[8,4,64,64\]$' "$TMP/dec.dsir"
  expect_grep '= rsqrt\(' "$TMP/dec.dsir"
  expect_grep '= embedding\(%[0-9]+, %targets\) : f32\[8,64,1\]$' "$TMP/dec.dsir"
  expect_grep '= embedding_grad\(' "$TMP/dec.dsir"
  expect_grep '^  return %[0-9]+, %[0-9]+$' "$TMP/dec.dsir"
  expect_exit 0 "$DSC" dump "$TMP/dec.dsir" -o "$TMP/dec2.dsir"
  if cmp -s "$TMP/dec.dsir" "$TMP/dec2.dsir"; then pass; else fail "decomposed step does not round-trip"; fi
fi

# bf16: the composites decompose too; the softmax's exp runs in f32
if expect_exit 0 "$DSC" dump "$GPT" --after decompose --precision bf16 --verify; then
  if grep -qE '= (softmax|attention|layernorm|cross_entropy)\(' "$TMP/out"; then
    fail "a composite op is left after decompose (bf16)"
  else
    pass
  fi
  expect_grep '= exp\(%[0-9]+\) : f32\[8,4,64,64\]$' "$TMP/out"
  expect_grep '= matmul\(%[0-9]+, %[0-9]+\) : bf16\[8,4,64,64\]$' "$TMP/out"
fi
finish
