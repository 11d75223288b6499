# The dsc command's interface: help, exit codes, argument errors.
source "$(dirname "$0")/lib/common.bash"

expect_exit 0 "$DSC" --help && expect_grep '^commands:' "$TMP/out"
expect_exit 0 "$DSC" --version && expect_grep '^dsc [0-9]' "$TMP/out"
expect_exit 1 "$DSC"
for cmd in check dump run; do
  expect_exit 0 "$DSC" $cmd --help && expect_grep "^usage: dsc $cmd" "$TMP/out"
  expect_exit 1 "$DSC" $cmd && expect_grep "dsc $cmd: missing" "$TMP/err"
  expect_exit 1 "$DSC" $cmd --no-such-flag x.dsm && expect_grep "unknown option '--no-such-flag'" "$TMP/err"
  expect_exit 1 "$DSC" $cmd "$TMP/absent.dsm" && expect_grep 'absent.dsm' "$TMP/err"
done
expect_exit 1 "$DSC" frobnicate && expect_grep "unknown command 'frobnicate'" "$TMP/err"
expect_exit 1 "$DSC" run "$SRC/examples/mlp.dsm" --batch 0 && expect_grep 'not a positive integer' "$TMP/err"
expect_exit 1 "$DSC" run "$SRC/examples/mlp.dsm" --seed -3 && expect_grep 'non-negative' "$TMP/err"
expect_exit 1 "$DSC" run "$SRC/examples/mlp.dsm" --dim B && expect_grep 'NAME=VALUE' "$TMP/err"
finish
