# Adaptive offload (--offload-optimizer auto, driver/offload_auto.c;
# docs/memory.md "Adaptive offload"): a budget just below the step's
# no-offload device peak moves some but not all optimizer states and fits;
# a budget at the peak moves nothing; a budget too small even with every
# state offloaded fails naming what is still over; training under auto on
# the cpu backend gives the loss curve of the run without offload (1e-5
# relative, f32) and its planned device peak is within the budget; auto
# without a budget, and on the interpreter's dsc dump, is refused.
source "$(dirname "$0")/lib/common.bash"
source "$(dirname "$0")/lib/corpus.bash"
MODEL="$SRC/examples/gpt-tiny.dsm"
export DSC_CACHE_DIR="$TMP/kernel-cache"
SHAPE=(--batch 2 --seq 32 --precision f32)
jnum() { grep -oE "\"$1\": -?[0-9]+" "$2" | head -1 | grep -oE -- '-?[0-9]+$'; }
plan() { # NAME ARGS...: dsc plan --json into $TMP/plan-NAME
  local name=$1
  shift
  expect_exit 0 "$DSC" plan "$MODEL" "${SHAPE[@]}" --zero-stage 0 --json "$@" &&
    cp "$TMP/out" "$TMP/plan-$name"
}

plan none
P=$(jnum peak "$TMP/plan-none")
[ -n "$P" ] && [ "$P" -gt 0 ] && pass || fail "no peak planned"

# ---- just below the peak: some states move, not all, and the step fits
B=$((P - 4096))
plan below --offload-optimizer auto --memory-budget "$B"
python3 - "$TMP/plan-below" "$B" "$P" <<'EOF' && pass || fail "budget just below the peak"
import json, sys
d = json.load(open(sys.argv[1])); B, P = int(sys.argv[2]), int(sys.argv[3])
r, a = d["ranks"][0], d["offload_auto"]
assert r["peak"] <= B, (r["peak"], B)
assert a["peak_no_offload"] == P, a
assert 0 < a["moved"] < a["candidates"], a
assert a["host"] == sum(v["bytes"] for v in a["values"]) and a["disk"] == 0, a
assert all(v["name"].startswith("opt.") and v["tier"] == "host" for v in a["values"]), a
# the order: furthest next use from the peak first, then the largest
keys = [(-v["next_use"], -v["bytes"]) for v in a["values"]]
assert keys == sorted(keys), keys
# only what the budget requires: without the last one moved it would not fit
assert P - (a["host"] - a["values"][-1]["bytes"]) > B, a
EOF
# the table says which values moved and why
expect_exit 0 "$DSC" plan "$MODEL" "${SHAPE[@]}" --zero-stage 0 --offload-optimizer auto \
  --memory-budget "$B"
expect_grep '^stage 0: offload auto: the device peak without offload, .* is over the budget of .*: [0-9]+ of [0-9]+ values moved \(host ' "$TMP/out"
expect_grep '^  opt\.[mv]\.[^ ]+ +host +[0-9.]+ [KM]?i?B +next use [0-9]+ instructions after the peak$' "$TMP/out"
expect_grep '^  stage 0: fits' "$TMP/out"

# ---- at the peak: nothing moves
plan at --offload-optimizer auto --memory-budget "$P"
[ "$(jnum moved "$TMP/plan-at")" -eq 0 ] && [ "$(jnum host "$TMP/plan-at")" -eq 0 ] &&
  [ "$(jnum peak "$TMP/plan-at")" -eq "$P" ] && pass || fail "budget at the peak: something moved"

# ---- too small even with every state offloaded: the message, exit 1
OPT=$(jnum optimizer "$TMP/plan-none")
SMALL=$((P - OPT - 65536))
expect_exit 1 "$DSC" plan "$MODEL" "${SHAPE[@]}" --zero-stage 0 --json --offload-optimizer auto \
  --memory-budget "$SMALL" &&
  expect_grep 'offload auto: the step needs [0-9.]+ MiB per rank with every optimizer state offloaded \([0-9]+ values: .* to host, .* to disk\), still over the memory budget of [0-9.]+ MiB by [0-9.]+ MiB: params' "$TMP/err"

# ---- usage: a budget is required; dsc dump cannot choose
expect_exit 1 "$DSC" plan "$MODEL" "${SHAPE[@]}" --offload-optimizer auto &&
  expect_grep 'offload-optimizer auto needs --memory-budget' "$TMP/err"
expect_exit 1 "$DSC" dump "$MODEL" --after offload --offload-optimizer auto &&
  expect_grep 'auto needs a memory budget' "$TMP/err"
expect_exit 1 "$DSC" plan "$MODEL" --offload-optimizer automatic && expect_grep 'or auto' "$TMP/err"

# ---- training under auto: the curve of the run without offload, the plan within B
make_corpus "$TMP/corpus.txt"
expect_exit 0 "$DSC" data "$TMP/corpus.txt" -o "$TMP/c"
TB=$((P - OPT / 2)) # about half of the states must move
RUN=(--data "$TMP/c" --batch 2 --seq 32 --precision f32 --steps 4 --eval-every 0 --backend cpu)
expect_exit 0 "$DSC" train "$MODEL" "${RUN[@]}" --out "$TMP/o-none"
expect_exit 0 "$DSC" train "$MODEL" "${RUN[@]}" --out "$TMP/o-auto" --offload-optimizer auto \
  --memory-budget "$TB"
expect_grep '^offload auto: [1-9][0-9]* of [0-9]+ values offloaded \(host [0-9.]+ MiB, disk 0.00 MiB\): device peak [0-9.]+ MiB without offload, [0-9.]+ MiB with' "$TMP/out"
expect_grep '^memory: planned ' "$TMP/out"
cp "$TMP/out" "$TMP/train-auto.out"
# plain stage 0 does not fit that budget
expect_exit 1 "$DSC" train "$MODEL" "${RUN[@]}" --out "$TMP/o-x" --memory-budget "$TB" &&
  expect_grep 'over the memory budget' "$TMP/err"
losses() { grep -oE '"loss":[^,]*' "$TMP/o-$1/metrics.jsonl" | cut -d: -f2; }
a=$(losses none) b=$(losses auto)
[ "$(wc -l <<<"$a")" -eq 4 ] && [ "$(wc -l <<<"$b")" -eq 4 ] && pass || fail "not 4 losses"
paste <(echo "$a") <(echo "$b") | awk '
  { d = $1 - $2; if (d < 0) d = -d; if (d > 1e-5 * ($1 < 0 ? -$1 : $1)) { print "FAIL: " $1 " vs " $2; bad = 1 } }
  END { exit bad }' && pass || fail "auto offload changed the loss curve"
plan train --offload-optimizer auto --memory-budget "$TB"
pk=$(jnum peak "$TMP/plan-train") mv=$(jnum moved "$TMP/plan-train") cand=$(jnum candidates "$TMP/plan-train")
[ "$pk" -le "$TB" ] && [ "$mv" -gt 0 ] && [ "$mv" -lt "$cand" ] && pass ||
  fail "training plan: peak $pk over $TB, or $mv of $cand moved"
# the trainer's plan is dsc plan's (device peak + host arena)
planned=$(sed -nE 's/^memory: planned ([0-9.]+) MiB.*/\1/p' "$TMP/train-auto.out")
want=$(awk -v p="$pk" -v h="$(jnum host "$TMP/plan-train")" 'BEGIN { printf "%.1f", (p + h) / 1048576 }')
[ "$planned" = "$want" ] && pass || fail "trainer planned $planned MiB, dsc plan $want MiB"
finish
