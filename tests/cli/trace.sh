# dsc train --trace FILE: a Chrome trace (Trace Event Format JSON) with a
# step, compute, comm, wait and copy track per rank (pid = rank); valid JSON
# also when training fails or is stopped midway; a bad path is refused before
# training; the printed hidden-communication share equals what
# bench/trace_overlap.py computes from the file.
source "$(dirname "$0")/lib/common.bash"
source "$(dirname "$0")/lib/corpus.bash"
MODEL="$SRC/examples/gpt-tiny.dsm"
TOOL="$SRC/bench/trace_overlap.py"
export DSC_CACHE_DIR="$TMP/kernel-cache"

make_corpus "$TMP/corpus.txt"
expect_exit 0 "$DSC" data "$TMP/corpus.txt" -o "$TMP/c"
RUN=(--data "$TMP/c" --batch 2 --seq 16 --lr 3e-3)

expect_exit 0 "$DSC" train --help && expect_grep '^  --trace FILE ' "$TMP/out"
# a bad path: a clear error before anything is compiled or trained
expect_exit 1 "$DSC" train "$MODEL" "${RUN[@]}" --steps 2 --trace "$TMP/no/such/dir/t.json" &&
  expect_grep 't.json: error: cannot open the trace for writing: No such file' "$TMP/err"
[ -s "$TMP/out" ] && fail "bad trace path: training started" || pass
expect_exit 1 "$DSC" train "$MODEL" "${RUN[@]}" --steps 2 --trace "$TMP" &&
  expect_grep 'cannot write the trace: is a directory' "$TMP/err"
expect_exit 1 "$DSC" train "$MODEL" "${RUN[@]}" --trace &&
  expect_grep '\-\-trace needs a value' "$TMP/err"

# check_trace FILE STEPS PIDS COMM: the file parses as JSON (python3's
# parser), every rank in PIDS has its named tracks, STEPS step events and
# compute events; COMM=1: collectives on comm (each with its wait inside its
# span) and the overlap figures.
check_trace() {
  python3 - "$@" <<'PY'
import json, re, sys
path, steps, pids, comm = sys.argv[1], int(sys.argv[2]), [int(p) for p in sys.argv[3].split(",")], sys.argv[4] == "1"
d = json.load(open(path))
ev = d["traceEvents"]
names = {(e["pid"], e["tid"]): e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
procs = {e["pid"]: e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "process_name"}
assert sorted(procs) == pids and all(procs[p] == f"rank {p}" for p in pids), procs
# complete events, and the comm and copy tracks' async pairs as spans
xs, begun = [e for e in ev if e["ph"] == "X"], {}
for e in ev:
    if e["ph"] == "b":
        begun[(e["pid"], e["cat"], e["id"])] = e
    elif e["ph"] == "e":
        b = begun.pop((e["pid"], e["cat"], e["id"]))
        xs.append(dict(b, ph="X", dur=e["ts"] - b["ts"]))
assert not begun, begun
assert not [e for e in ev if e["ph"] == "X" and e["tid"] in (3, 5)], "comm/copy as complete events"
assert {e["pid"] for e in xs} == set(pids), {e["pid"] for e in xs}
for p in pids:
    tracks = {names[(p, t)] for t in range(1, 6)}
    assert tracks == {"step", "compute", "comm", "wait", "copy"}, tracks
    mine = [e for e in xs if e["pid"] == p]
    on = lambda t: [e for e in mine if names[(p, e["tid"])] == t]
    assert all(isinstance(e["ts"], (int, float)) and e["dur"] >= 0 for e in mine)
    st = [e["name"] for e in on("step") if e["name"].startswith("step ")]
    assert st == [f"step {i}" for i in range(1, steps + 1)], st
    assert len(on("compute")) >= steps, len(on("compute"))
    assert sum(e["name"].startswith("load batch") for e in on("copy")) == steps
    if comm:
        cs = [e for e in on("comm") if e["cat"] == "collective"]
        ws = [e for e in on("wait") if e["cat"] == "collective"]
        assert len(cs) >= steps and len(cs) == len(ws), (len(cs), len(ws))
        for c in cs:
            assert re.fullmatch(r"(all_reduce|reduce_scatter|all_gather|broadcast) [0-9.]+ [KMG]?B", c["name"]), c["name"]
        # a wait lies inside its collective's span (the same instruction ends both)
        for c, w in zip(cs, ws):
            assert w["name"] == "wait " + c["name"] and c["args"]["id"] == w["args"]["id"]
            assert c["ts"] <= w["ts"] + 1e-3 and abs((c["ts"] + c["dur"]) - (w["ts"] + w["dur"])) < 2e-3, (c, w)
        # the compiled program: named kernels and GEMMs
        assert any(re.fullmatch(r"matmul [0-9x\[\]]+", e["name"]) for e in on("compute"))
        assert any(e["cat"] == "kernel" for e in on("compute"))
print("ok")
PY
}

# the interpreter, one rank: a compute event per step, no collectives; a
# checkpoint write on the copy track
expect_exit 0 "$DSC" train "$MODEL" "${RUN[@]}" --backend interp --steps 3 --out "$TMP/o1" \
  --trace "$TMP/i.json" &&
  expect_grep '^trace: .*/i.json: no collectives traced' "$TMP/out"
check_trace "$TMP/i.json" 3 0 0 >/dev/null && pass || fail "interp trace"
python3 -c 'import json,sys; ev=json.load(open(sys.argv[1]))["traceEvents"]
assert [e["name"] for e in ev if e["ph"]=="b" and e["tid"]==5 and e["name"].startswith("checkpoint")] == ["checkpoint step 3"]
assert sum(e["name"] == "train_step (interpreter)" for e in ev if e["ph"]=="X") == 3' "$TMP/i.json" &&
  pass || fail "interp trace: checkpoint or interpreter events"

# the Trace Event Format's schema, nesting complete events, paired async ones
CHECK=(python3 "$SRC/tests/cli/lib/trace_check.py" "$SRC/tests/cli/lib/chrome_trace.schema.json")
expect_exit 0 "${CHECK[@]}" "$TMP/i.json" && expect_grep '^ok$' "$TMP/out"
# the checker fails: two complete events on one track that overlap partially,
# an async begin without its end, an event without a pid
printf '%s' '{"traceEvents":[{"name":"a","ph":"X","pid":0,"tid":2,"ts":0,"dur":10},{"name":"b","ph":"X","pid":0,"tid":2,"ts":5,"dur":10}]}' >"$TMP/bad1.json"
expect_exit 1 "${CHECK[@]}" "$TMP/bad1.json" && expect_grep "'b' \[5, 15\] overlaps 'a'" "$TMP/err"
printf '%s' '{"traceEvents":[{"name":"a","cat":"c","ph":"b","id":"0x1","pid":0,"tid":3,"ts":0}]}' >"$TMP/bad2.json"
expect_exit 1 "${CHECK[@]}" "$TMP/bad2.json" && expect_grep 'never end' "$TMP/err"
printf '%s' '{"traceEvents":[{"name":"a","ph":"X","tid":3,"ts":0,"dur":1}]}' >"$TMP/bad3.json"
expect_exit 1 "${CHECK[@]}" "$TMP/bad3.json" && expect_grep "no 'pid'" "$TMP/err"

# training that fails midway (the loss overflows) still leaves valid JSON
expect_exit 1 "$DSC" train "$MODEL" "${RUN[@]}" --backend interp --steps 20 --lr 1e9 \
  --trace "$TMP/f.json" && expect_grep 'loss is not finite' "$TMP/err"
python3 -m json.tool "$TMP/f.json" >/dev/null && pass || fail "failed run: trace is not valid JSON"

if "$DSC" run "$MODEL" --backend cpu --quiet >/dev/null 2>&1; then
  # two in-process ranks: one file, pid = rank, every track
  expect_exit 0 "$DSC" train "$MODEL" "${RUN[@]}" --backend cpu --threads 1 --ranks 2 \
    --global-batch 8 --steps 4 --trace "$TMP/r2.json" --eval-every 4 --eval-batches 1
  check_trace "$TMP/r2.json" 4 0,1 1 >/dev/null && pass || { fail "ranks 2 trace"; check_trace "$TMP/r2.json" 4 0,1 1; }
  # the printed share = the tool's = the file's own figure
  printed=$(sed -nE 's/^trace: .*hidden behind compute ([0-9.]+)%.*/\1/p' "$TMP/out")
  [ -n "$printed" ] && pass || fail "no hidden-communication line: $(cat "$TMP/out")"
  python3 "$TOOL" --json "$TMP/r2.json" >"$TMP/ov.json" && pass || fail "trace_overlap.py failed"
  python3 - "$TMP/ov.json" "$TMP/r2.json" "$printed" <<'PY' && pass || fail "overlap figures differ"
import json, sys
ov = json.load(open(sys.argv[1]))
own = json.load(open(sys.argv[2]))["otherData"]
t = ov["total"]
assert t["ranks"] == 2 and t["collectives"] > 0 and 0 <= t["hidden"] <= 1, t
assert abs(t["hidden"] - own["hidden_comm_share"]) < 1e-6, (t, own)
assert abs(100 * t["hidden"] - float(sys.argv[3])) <= 0.051, (t, sys.argv[3])
for r in ov["ranks"]:
    assert r["steps"] == 4 and 0 <= r["wait_us"] <= r["comm_us"], r
PY
  expect_exit 0 python3 "$TOOL" "$TMP/r2.json" && expect_grep '^hidden: [0-9.]+% of ' "$TMP/out"
  expect_exit 1 python3 "$TOOL" "$TMP/c_train.bin" && expect_grep 'not valid JSON' "$TMP/err"
  # overlapping collectives: async pairs; every complete event nests
  expect_exit 0 "${CHECK[@]}" "$TMP/r2.json"

  # SIGTERM midway: the run checkpoints, exits 143, and the trace is valid
  "$DSC" train "$MODEL" "${RUN[@]}" --backend cpu --threads 1 --ranks 2 --steps 100000 \
    --trace "$TMP/sig.json" --log "$TMP/sig.jsonl" --quiet >"$TMP/out" 2>"$TMP/err" &
  pid=$!
  for _ in $(seq 1 600); do
    [ -s "$TMP/sig.jsonl" ] && break
    sleep 0.05
  done
  kill -TERM $pid
  wait $pid
  code=$?
  [ $code -eq 143 ] && pass || fail "SIGTERM: exit $code"
  python3 -m json.tool "$TMP/sig.json" >/dev/null && pass || fail "stopped run: trace is not valid JSON"
  expect_exit 0 "${CHECK[@]}" "$TMP/sig.json"

  # mpirun: rank R > 0 writes FILE.rankR; the tool reads them together
  if command -v mpirun >/dev/null 2>&1 && ! "$DSC" launch -n 2 --dry-run train x 2>&1 | grep -q 'without MPI'; then
    export ASAN_OPTIONS=detect_leaks=0 # Open MPI's own allocations
    expect_exit 0 "$DSC" launch -n 2 -- train "$MODEL" "${RUN[@]}" --backend cpu --threads 1 \
      --global-batch 8 --steps 3 --trace "$TMP/m.json" &&
      expect_grep "^trace: .*/m.json \(\+ .*/m.json.rank1\): communication hidden" "$TMP/out"
    check_trace "$TMP/m.json" 3 0 1 >/dev/null && pass || fail "mpi rank 0 trace"
    check_trace "$TMP/m.json.rank1" 3 1 1 >/dev/null && pass || fail "mpi rank 1 trace"
    expect_exit 0 python3 "$TOOL" --merge "$TMP/merged.json" "$TMP/m.json" &&
      expect_grep 'over 2 rank\(s\)' "$TMP/out"
    check_trace "$TMP/merged.json" 3 0,1 1 >/dev/null && pass || fail "merged trace"
    expect_exit 0 "${CHECK[@]}" "$TMP/m.json" "$TMP/m.json.rank1" "$TMP/merged.json"
    # a rank that fails closes its trace before the job is aborted
    "$DSC" launch -n 2 -- train "$MODEL" --data "$TMP/none" --trace "$TMP/bad.json" \
      >"$TMP/out" 2>"$TMP/err"
    [ $? -ne 0 ] && pass || fail "mpi with missing data exited 0"
    python3 -m json.tool "$TMP/bad.json" >/dev/null && pass || fail "aborted mpi run: invalid JSON"
  fi
else
  echo "cpu backend not built: skipped the compiled-program traces"
fi
finish
