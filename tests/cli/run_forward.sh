# dsc run: the forward pass at random init gives the loss of a uniform guess.
source "$(dirname "$0")/lib/common.bash"

# loss_near FILE TARGET TOL: the 'loss: X' line of FILE is within TOL of TARGET
loss_near() {
  local got
  got=$(sed -n 's/^loss: //p' "$1")
  if [ -n "$got" ] && awk -v g="$got" -v t="$2" -v e="$3" 'BEGIN { d = g - t; if (d < 0) d = -d; exit !(d <= e) }'; then
    pass
  else
    fail "loss '$got' not within $3 of $2"
  fi
}

expect_exit 0 "$DSC" run "$SRC/examples/gpt-tiny.dsm" && loss_near "$TMP/out" 5.5452 0.1
cp "$TMP/out" "$TMP/first"
# same seed, same loss; another seed, another loss
expect_exit 0 "$DSC" run "$SRC/examples/gpt-tiny.dsm" && { cmp -s "$TMP/out" "$TMP/first" && pass || fail "same seed gave different output"; }
expect_exit 0 "$DSC" run "$SRC/examples/gpt-tiny.dsm" --seed 7 && { cmp -s "$TMP/out" "$TMP/first" && fail "seed 7 gave the same output as seed 0" || pass; }
expect_exit 0 "$DSC" run "$SRC/examples/gpt-tiny.dsm" --batch 2 --seq 16 && loss_near "$TMP/out" 5.5452 0.15
expect_exit 0 "$DSC" run "$SRC/examples/mlp.dsm" && expect_grep '^loss: ' "$TMP/out"

# GPT-2 124M at batch 1, seq 16: ln(50257) = 10.825
expect_exit 0 "$DSC" run "$SRC/examples/gpt2.dsm" --batch 1 --seq 16 && loss_near "$TMP/out" 10.825 0.15
expect_grep 'model gpt2: 124475904 parameters' "$TMP/err"

# a text IR file runs too, with the same result as its model file
"$DSC" dump "$SRC/examples/gpt-tiny.dsm" -o "$TMP/tiny.dsir"
expect_exit 0 "$DSC" run "$TMP/tiny.dsir" && { cmp -s "$TMP/out" "$TMP/first" && pass || fail ".dsir run differs from .dsm run"; }
finish
