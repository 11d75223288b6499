#!/usr/bin/env bash
# bench/offload.sh on gpt-tiny: the five modes train (two rounds), the table
# and the JSON line carry their step times, the host step's copies and host
# kernels (with a GB/s figure), the host stream's hidden share and
# bench/mem_bw's AdamW-stream bandwidth; a model that does not parse makes
# the script exit 1.
source "$(dirname "$0")/lib/common.bash"
[ -x "$DSC" ] || { echo "no dsc binary"; exit 1; }
if ! "$DSC" run "$SRC/examples/gpt-tiny.dsm" --backend cpu --quiet >/dev/null 2>&1; then
  echo "cpu backend not built: skipped"; exit 0
fi
BENCH=("$SRC/bench/offload.sh" --dsc "$DSC" --steps 3 --threads 2 --batch 4 --seq 32 --reps 2 --overlap true --out "$TMP/b")
expect_exit 0 "${BENCH[@]}" --model "$SRC/examples/gpt-tiny.dsm"
cat "$TMP/out"
json=$(grep '^{"impl":"offload_bench"' "$TMP/out")
# mem_bw is built with the benchmarks (DSC_BUILD_BENCH, on by default)
have_bw=$([ -x "$(dirname "$DSC")/bench/mem_bw" ] && echo 1 || echo 0)
python3 - "$json" "$have_bw" <<'PY' && pass || fail "offload bench JSON: $json"
import json, sys
j = json.loads(sys.argv[1])
keys = ["step_ms_none", "step_ms_host", "step_ms_overlap", "step_ms_delayed", "step_ms_zenflow",
        "mean_ms_none", "mean_ms_zenflow",
        "copy_ms_host", "host_kernel_ms", "host_kernel_gbps"]
for k in keys + (["mem_bw_adamw_gbps"] if sys.argv[2] == "1" else []):
    assert isinstance(j[k], (int, float)) and j[k] > 0, (k, j[k])
assert j["threads"] == 2 and j["ranks"] == 1 and j["reps"] == 2 and j["clip"] is True and j["overlap"] == "true"
for k in ["hidden_host_share_overlap", "hidden_host_share_delayed"]:
    assert 0 <= j[k] <= 1, (k, j[k])
PY
grep -q '^--offload-optimizer host (sync) ' "$TMP/out" && grep -q '^  overlapped (host stream) ' "$TMP/out" &&
  grep -q '^  + --delayed-param-update ' "$TMP/out" &&
  grep -q '^  + --zenflow true ' "$TMP/out" &&
  grep -q '^no offload .* 1\.000 ' "$TMP/out" &&
  pass || fail "offload bench table"
printf 'model broken {\n' >"$TMP/broken.dsm"
expect_exit 1 "${BENCH[@]}" --model "$TMP/broken.dsm"
grep -q "the 'none' run failed" "$TMP/err" && pass || fail "broken model: $(cat "$TMP/err")"
finish
