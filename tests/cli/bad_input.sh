# Malformed, truncated and garbage inputs: a located diagnostic and exit 1,
# never a crash (exit >= 128 or 2) or a hang (ctest's timeout).
source "$(dirname "$0")/lib/common.bash"

located='^[^:]+:[0-9]+:[0-9]+: error: '
: >"$TMP/empty.dsm"
printf 'model m {\n  param w: f32[4 = zeros\n' >"$TMP/truncated.dsm"
# Fixed garbage (a seeded generator, so a failure reproduces): bytes 0-255,
# not valid UTF-8 (a valid UTF-8 line is shown as it is).
LC_ALL=C awk 'BEGIN { srand(7); for (i = 0; i < 4096; i++) printf "%c", int(rand() * 256) }' \
  >"$TMP/garbage.dsm"
printf 'module m\n\ngraph forward(%%x: f32[2]) {\n  %%0 = frob(%%x) : f32[2]\n  return %%0\n}\n' >"$TMP/bad.dsir"
head -c 2000 "$SRC/examples/gpt2.dsm" >"$TMP/gpt2-cut.dsm"
for f in empty.dsm truncated.dsm garbage.dsm bad.dsir gpt2-cut.dsm; do
  for cmd in check dump run; do
    expect_exit 1 "$DSC" $cmd "$TMP/$f"
  done
  expect_grep 'error' "$TMP/err"
done
expect_exit 1 "$DSC" check "$TMP/truncated.dsm" && expect_grep "$located" "$TMP/err"
expect_exit 1 "$DSC" dump "$TMP/bad.dsir" && expect_grep 'bad.dsir:4:[0-9]+: error: .*frob' "$TMP/err"
# binary garbage is shown as '?' (no raw bytes to the terminal), long lines cut
expect_exit 1 "$DSC" check "$TMP/garbage.dsm"
if LC_ALL=C grep -q $'[\x80-\xff]' "$TMP/err"; then fail "raw non-ASCII bytes in the diagnostic"; else pass; fi
awk 'length > 220 { bad = 1 } END { exit bad }' "$TMP/err" && pass || fail "diagnostic line longer than 220 columns"
# a token of raw bytes (a string literal) quoted in a syntax error: '?' too
printf '"#\343\006\311\311 \377" x\n' >"$TMP/rawtoken.dsm"
expect_exit 1 "$DSC" check "$TMP/rawtoken.dsm" && expect_grep "unexpected '\"#\?\?\?\?" "$TMP/err"
if LC_ALL=C grep -q $'[\x80-\xff]' "$TMP/err"; then fail "raw bytes of a token in the diagnostic"; else pass; fi
# every truncation of a real model is handled
size=$(wc -c <"$SRC/examples/gpt-tiny.dsm")
for k in 1 2 3 4 5 6 7; do
  cut=$((size * k / 8))
  head -c $cut "$SRC/examples/gpt-tiny.dsm" >"$TMP/cut.dsm"
  "$DSC" check "$TMP/cut.dsm" >/dev/null 2>&1
  rc=$?
  [ $rc -eq 1 ] && pass || fail "check of gpt-tiny cut at $cut bytes exited $rc"
done
finish
