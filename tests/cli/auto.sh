# dsc plan --auto and dsc train --auto (issue 7 item 4; docs/memory.md
# "Auto-configuration"): the search picks a configuration that fits a
# budget too small for stage 0 without checkpointing, dsc train --auto trains
# with it and its losses equal those of the same configuration given as
# flags; fixed flags stay fixed; none fits -> exit 1 naming the smallest
# peak; bad flags are usage errors; the calibration is cached.
source "$(dirname "$0")/lib/common.bash"
source "$(dirname "$0")/lib/corpus.bash"
MODEL="$SRC/examples/gpt-tiny.dsm"
export DSC_CACHE_DIR="$TMP/cache"
SHAPE=(--batch 2 --seq 16 --grad-accum 2)
# fixed rates: the choice must not depend on this machine's load
RATES=(--compute-gflops 100 --link-gbps 10 --host-gbps 10 --disk-gbps 1)

# usage errors
expect_exit 1 "$DSC" plan "$MODEL" --world 2 --auto && expect_grep 'needs --memory-budget' "$TMP/err"
for bad in "--link-gbps 0" "--link-gbps x" "--compute-gflops" "--max-plans 0" "--max-plans 65"; do
  # shellcheck disable=SC2086
  expect_exit 1 "$DSC" plan "$MODEL" --auto --memory-budget 1GiB $bad && expect_grep 'needs' "$TMP/err"
done
expect_exit 1 "$DSC" train "$MODEL" --data x --auto && expect_grep 'needs --memory-budget' "$TMP/err"
expect_exit 0 "$DSC" plan --help && expect_grep '^  --auto ' "$TMP/out"
expect_exit 0 "$DSC" train --help && expect_grep '^  --recalibrate ' "$TMP/out"

# planned peaks (no checkpointing): stage 0 and the smallest of stages 1-3
peak() { # STAGE
  "$DSC" plan "$MODEL" --world 2 --zero-stage "$1" "${SHAPE[@]}" --checkpoint-activations none --json |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["ranks"][0]["peak"])'
}
P0=$(peak 0) P1=$(peak 1) P2=$(peak 2) P3=$(peak 3)
MIN=$(printf '%s\n' "$P1" "$P2" "$P3" | sort -n | head -1)
[ -n "$P0" ] && [ -n "$MIN" ] && [ "$MIN" -lt "$P0" ] && pass || fail "stage peaks $P0 $P1 $P2 $P3"
BUDGET=$(((MIN + P0) / 2))

# plan --auto: a configuration other than plain stage 0, which does not fit
expect_exit 0 "$DSC" plan "$MODEL" --world 2 "${SHAPE[@]}" --auto --memory-budget "$BUDGET" \
  --checkpoint-activations none "${RATES[@]}"
expect_grep '^auto: [0-9]+ configurations planned for .* at world 2, budget .* per rank: [1-9][0-9]* fit' "$TMP/out"
expect_grep '^rates: compute 100.0 GFLOP/s, link 10.00 GB/s, host 10.00 GB/s, disk 1.00 GB/s \(from the flags\)' "$TMP/out"
expect_grep '^chosen: --zero-stage [0-3] --checkpoint-activations none' "$TMP/out"
expect_grep '^  predicted step [0-9.]+ ms: compute [0-9.]+ ms \+ exposed communication' "$TMP/out"
expect_grep '^  [0-9]+ +0 +none +none +none .* no$' "$TMP/out" # plain stage 0 planned, does not fit
if grep -qE '^chosen: --zero-stage 0 --checkpoint-activations none$' "$TMP/out"; then
  fail "plain stage 0 chosen under a budget it exceeds"
else pass; fi
CHOSEN=$(sed -n 's/^chosen: //p' "$TMP/out")

# --json: the same choice, its peak within the budget
expect_exit 0 "$DSC" plan "$MODEL" --world 2 "${SHAPE[@]}" --auto --memory-budget "$BUDGET" \
  --checkpoint-activations none "${RATES[@]}" --json
python3 - "$TMP/out" "$BUDGET" "$CHOSEN" <<'EOF' && pass || fail "--json"
import json, sys
d = json.load(open(sys.argv[1]))
c = d["chosen"]
assert c["flags"] == sys.argv[3], (c["flags"], sys.argv[3])
assert c["fits"] and c["peak"] <= int(sys.argv[2]), c
assert d["planned"] >= len(d["candidates"]) >= d["fit"] >= 1, d
fit = [x for x in d["candidates"] if x["fits"]]
assert fit[0] == c and all(a["step_s"] <= b["step_s"] for a, b in zip(fit, fit[1:]))
assert all(x["checkpoint_activations"] == "none" for x in d["candidates"])
EOF

# a fixed stage stays fixed
expect_exit 0 "$DSC" plan "$MODEL" --world 2 "${SHAPE[@]}" --auto --memory-budget 1GiB \
  --zero-stage 3 "${RATES[@]}"
expect_grep '^chosen: --zero-stage 3 ' "$TMP/out"
if grep -qE '^  [0-9]+ +[012] ' "$TMP/out"; then fail "a stage other than the fixed 3 planned"; else pass; fi

# none fits: exit 1, the smallest peak and what it would take
expect_exit 1 "$DSC" plan "$MODEL" --world 2 "${SHAPE[@]}" --auto --memory-budget 64KiB "${RATES[@]}" &&
  expect_grep 'no configuration fits the memory budget of 64.00 KiB per rank \([0-9]+ planned\): the smallest peak is .* it would take --memory-budget' "$TMP/err"

# calibration: measured once, then read from $DSC_CACHE_DIR
expect_exit 0 "$DSC" plan "$MODEL" "${SHAPE[@]}" --auto --memory-budget 1GiB
expect_grep '^rates: .*\(calibrated in [0-9.]+ s, cached in .*/cache/calibration-.*\.txt\)' "$TMP/out"
expect_exit 0 "$DSC" plan "$MODEL" "${SHAPE[@]}" --auto --memory-budget 1GiB --link-gbps 5
expect_grep '^rates: .*link 5.00 GB/s.*\(calibrated earlier: .*; flags override some\)' "$TMP/out"

# dsc train --auto under the budget, then the same configuration as flags:
# the same losses step by step
make_corpus "$TMP/corpus.txt"
expect_exit 0 "$DSC" data "$TMP/corpus.txt" -o "$TMP/c"
RUN=(--data "$TMP/c" "${SHAPE[@]}" --ranks 2 --lr 3e-3 --steps 6 --backend cpu --memory-budget "$BUDGET")
expect_exit 0 "$DSC" train "$MODEL" "${RUN[@]}" --auto --checkpoint-activations none "${RATES[@]}"
expect_grep "^auto: training with $CHOSEN\$" "$TMP/out"
grep '^step ' "$TMP/out" | sed 's/ | [0-9]* tok\/s.*//' >"$TMP/auto.loss"
[ "$(wc -l <"$TMP/auto.loss")" -eq 6 ] && pass || fail "dsc train --auto: not 6 steps"
# shellcheck disable=SC2086
expect_exit 0 "$DSC" train "$MODEL" "${RUN[@]}" $CHOSEN
grep '^step ' "$TMP/out" | sed 's/ | [0-9]* tok\/s.*//' >"$TMP/explicit.loss"
if cmp -s "$TMP/auto.loss" "$TMP/explicit.loss"; then pass; else
  fail "auto and explicit runs differ"
  diff "$TMP/auto.loss" "$TMP/explicit.loss" | head
fi
# and stage 0 itself is refused under that budget
expect_exit 1 "$DSC" train "$MODEL" "${RUN[@]}" --zero-stage 0 --checkpoint-activations none &&
  expect_grep 'over the memory budget' "$TMP/err"
finish
