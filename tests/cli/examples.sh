# Every example checks cleanly, dumps, and its text IR round-trips byte for byte.
source "$(dirname "$0")/lib/common.bash"

n=0
for f in "$SRC"/examples/*.dsm; do
  n=$((n + 1))
  name=$(basename "$f" .dsm)
  expect_exit 0 "$DSC" check "$f"
  [ -s "$TMP/err" ] && fail "dsc check $name printed diagnostics" && cat "$TMP/err"
  expect_exit 0 "$DSC" dump "$f" -o "$TMP/$name.1.dsir" || continue
  expect_grep '^graph forward\(' "$TMP/$name.1.dsir"
  expect_exit 0 "$DSC" dump "$TMP/$name.1.dsir" -o "$TMP/$name.2.dsir" || continue
  if cmp -s "$TMP/$name.1.dsir" "$TMP/$name.2.dsir"; then pass; else
    fail "round trip of $name differs"; diff "$TMP/$name.1.dsir" "$TMP/$name.2.dsir" | head -10
  fi
  expect_exit 0 "$DSC" dump "$f" --dot && expect_grep '^digraph' "$TMP/out"
done
[ "$n" -ge 3 ] && pass || fail "expected at least 3 examples, found $n"

# the whole GPT-2 124M IR: 12 blocks of params, printed in full
expect_exit 0 "$DSC" dump "$SRC/examples/gpt2.dsm" -o "$TMP/gpt2.dsir"
expect_grep '^param h\.11\.' "$TMP/gpt2.dsir"
expect_grep '^param wte: f32\[50304,768\]' "$TMP/gpt2.dsir"
finish
