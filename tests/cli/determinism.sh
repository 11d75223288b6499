#!/usr/bin/env bash
# bench/determinism.sh on gpt-tiny: three runs of the same training (2
# threads, 3 steps) print the same loss and gradient-norm curve, and the
# script says so (exit 0); a run that cannot start is reported as FAILED
# with exit 1.
source "$(dirname "$0")/lib/common.bash"
[ -x "$DSC" ] || { echo "no dsc binary"; exit 1; }
if ! "$DSC" run "$SRC/examples/gpt-tiny.dsm" --backend cpu --quiet >/dev/null 2>&1; then
  echo "cpu backend not built: skipped"; exit 0
fi
B="$SRC/bench/determinism.sh --dsc $DSC --model $SRC/examples/gpt-tiny.dsm --steps 3 --batch 4 --seq 32"
expect_exit 0 $B --runs 3 --out "$TMP/d"
grep -q "^all 3 runs agree" "$TMP/out" && [ "$(grep -c '^run [123]: [0-9.]*/[0-9.]* [0-9.]*/[0-9.]* [0-9.]*/[0-9.]* $' "$TMP/out")" -eq 3 ] &&
  pass || fail "three gpt-tiny runs: $(cat "$TMP/out")"
# a model that does not parse: the first run fails, the script exits 1
printf 'model broken {\n' >"$TMP/broken.dsm"
expect_exit 1 "$SRC/bench/determinism.sh" --dsc "$DSC" --model "$TMP/broken.dsm" --runs 1 --out "$TMP/d"
grep -q "^run 1: FAILED (exit 1" "$TMP/out" && pass || fail "broken model: $(cat "$TMP/out")"
finish
