# dsc launch -n N -- train ARGS: runs mpirun -np N <this dsc> train ARGS with
# mpirun's exit status; bad arguments and a missing mpirun are clear errors;
# with Open MPI it trains exactly as mpirun -np 2 dsc train does.
source "$(dirname "$0")/lib/common.bash"
source "$(dirname "$0")/lib/corpus.bash"
MODEL="$SRC/examples/gpt-tiny.dsm"
export DSC_CACHE_DIR="$TMP/kernel-cache"

expect_exit 0 "$DSC" launch --help && expect_grep '^usage: dsc launch -n N ' "$TMP/out"
expect_exit 0 "$DSC" --help && expect_grep '^  launch ' "$TMP/out"
for bad in "-n 0 -- train" "-n x -- train" "-n 2000 -- train" "-n" "-- train" "-n 2" "-n 2 --" \
  "-n 2 -- run m.dsm" "-n 2 --bogus -- train" "-n 2 --mpirun" "-n 2 -- train m.dsm --ranks 2"; do
  # shellcheck disable=SC2086
  expect_exit 1 "$DSC" launch $bad && expect_grep '^dsc launch: ' "$TMP/err"
done
expect_grep 'each process is a rank already' "$TMP/err"

if "$DSC" launch -n 2 --dry-run -- train x 2>&1 | grep -q 'built without MPI'; then
  expect_exit 1 "$DSC" launch -n 2 -- train x && expect_grep 'built without MPI' "$TMP/err"
  echo "dsc built without MPI: skipped the launches"
  finish
  exit $?
fi

# a missing mpirun: a message, exit 1
expect_exit 1 env PATH=/nonexistent "$DSC" launch -n 2 -- train x &&
  expect_grep 'mpirun not found in PATH' "$TMP/err"
expect_exit 1 "$DSC" launch -n 2 --mpirun "$TMP/nope" -- train x &&
  expect_grep "mpirun $TMP/nope: not an executable file" "$TMP/err"

# the command it runs, and the exit status passed through (a stand-in mpirun)
cat >"$TMP/fake-mpirun" <<'SH'
#!/bin/sh
printf '%s\n' "$@" >"$FAKE_ARGS"
exit "${FAKE_CODE:-0}"
SH
chmod +x "$TMP/fake-mpirun"
for code in 0 3 143; do
  FAKE_ARGS="$TMP/args" FAKE_CODE=$code "$DSC" launch -n 3 --mpirun "$TMP/fake-mpirun" -- \
    train "$MODEL" --steps 'a b' >"$TMP/out" 2>"$TMP/err"
  got=$?
  [ $got -eq $code ] && pass || fail "fake mpirun exited $code, dsc launch $got"
done
dsc_abs=$(readlink -f "$DSC")
printf -- '-np\n3\n%s\ntrain\n%s\n--steps\na b\n' "$dsc_abs" "$MODEL" >"$TMP/want"
cmp -s "$TMP/want" "$TMP/args" && pass || { fail "mpirun arguments differ:"; diff "$TMP/want" "$TMP/args"; }
# No process of the job outlives it (docs/zero.md "When a rank dies"): what
# a stand-in mpirun leaves behind (a stopped child) is killed and named; a
# rank stopped longer than DSC_COMM_TIMEOUT ends the job; SIGTERM goes to
# mpirun, a second one kills the job.
cat >"$TMP/leaky-mpirun" <<'SH'
#!/bin/sh
# (its group, orphaned when this exits, gets SIGHUP and SIGCONT: ignore the first)
sh -c 'trap "" HUP; echo $$ >"$FAKE_PID.new"; mv "$FAKE_PID.new" "$FAKE_PID"; kill -STOP $$
exec sleep 300' &
while [ ! -s "$FAKE_PID" ]; do sleep 0.01; done
sleep 0.1
exit 3
SH
cat >"$TMP/stopping-mpirun" <<'SH'
#!/bin/sh
OMPI_COMM_WORLD_RANK=1 sh -c 'echo $$ >"$FAKE_PID"; kill -STOP $$; sleep 300' &
wait
SH
cat >"$TMP/stubborn-mpirun" <<'SH'
#!/bin/sh
trap 'echo TERM >>"$FAKE_ARGS"' TERM
[ -n "${FAKE_IGNORE:-}" ] || trap 'echo TERM >>"$FAKE_ARGS"; exit 143' TERM
echo $$ >"$FAKE_PID"
while :; do sleep 0.1; done
SH
chmod +x "$TMP/leaky-mpirun" "$TMP/stopping-mpirun" "$TMP/stubborn-mpirun"
gone() { # PID: true once the process is gone (or a zombie) within 5 s
  for _ in $(seq 50); do
    [ "$(ps -o stat= -p "$1" 2>/dev/null | cut -c1)" = "" ] && return 0
    [ "$(ps -o stat= -p "$1" 2>/dev/null | cut -c1)" = Z ] && return 0
    sleep 0.1
  done
  return 1
}
rm -f "$TMP/pid"
expect_exit 3 env FAKE_PID="$TMP/pid" "$DSC" launch -n 2 --mpirun "$TMP/leaky-mpirun" -- train x &&
  expect_grep "mpirun exited but pid [0-9]+( \(stopped\))? was still there: killed" "$TMP/err"
gone "$(cat "$TMP/pid")" && pass || fail "the stopped child of mpirun outlived dsc launch"
rm -f "$TMP/pid"
start=$SECONDS
expect_exit 1 env FAKE_PID="$TMP/pid" DSC_COMM_TIMEOUT=0.5 "$DSC" launch -n 2 \
  --mpirun "$TMP/stopping-mpirun" -- train x &&
  expect_grep "rank 1 \(pid [0-9]+\) has been stopped for 0\.[5-9] s, longer than the collective timeout \(0\.5 s\): killing the job" "$TMP/err"
[ $((SECONDS - start)) -lt 10 ] && pass || fail "a stopped rank held dsc launch $((SECONDS - start)) s"
gone "$(cat "$TMP/pid")" && pass || fail "the stopped rank outlived dsc launch"
for ignore in "" 1; do
  rm -f "$TMP/pid" "$TMP/args"
  FAKE_PID="$TMP/pid" FAKE_ARGS="$TMP/args" FAKE_IGNORE=$ignore "$DSC" launch -n 2 \
    --mpirun "$TMP/stubborn-mpirun" -- train x >"$TMP/out" 2>"$TMP/err" &
  lp=$!
  for _ in $(seq 100); do [ -s "$TMP/pid" ] && break; sleep 0.05; done
  kill -TERM $lp
  [ -n "$ignore" ] && sleep 0.5 && kill -TERM $lp
  wait $lp
  got=$?
  [ $got -eq 143 ] && pass || fail "SIGTERM (ignored by mpirun: '$ignore'): dsc launch exited $got"
  expect_grep '^TERM$' "$TMP/args"
  [ -n "$ignore" ] && expect_grep 'a second signal \(Terminated\): killing the job' "$TMP/err"
  gone "$(cat "$TMP/pid")" && pass || fail "mpirun outlived dsc launch after SIGTERM"
done
# dsc launch itself killed: mpirun gets SIGTERM (its parent-death signal)
rm -f "$TMP/pid" "$TMP/args"
FAKE_PID="$TMP/pid" FAKE_ARGS="$TMP/args" "$DSC" launch -n 2 --mpirun "$TMP/stubborn-mpirun" -- \
  train x >"$TMP/out" 2>"$TMP/err" &
lp=$!
for _ in $(seq 100); do [ -s "$TMP/pid" ] && break; sleep 0.05; done
kill -KILL $lp
wait $lp 2>/dev/null
gone "$(cat "$TMP/pid")" && pass || fail "mpirun outlived a killed dsc launch"
expect_grep '^TERM$' "$TMP/args"

# the '--' is optional; --dry-run prints the command
expect_exit 0 "$DSC" launch -n 2 --mpirun "$TMP/fake-mpirun" --dry-run train a &&
  expect_grep "^$TMP/fake-mpirun -np 2 $dsc_abs train a\$" "$TMP/out"

# DeepSpeed's launcher flags map onto mpirun (issue 19 item 2)
printf '# two nodes\nworker-1 slots=4\nworker-2 slots=4   # the second\n\n' >"$TMP/hostfile"
launch_dry() { # EXPECTED-ARGS FLAGS...: the command dsc launch would run
  local want=$1
  shift
  expect_exit 0 "$DSC" launch --mpirun "$TMP/fake-mpirun" --dry-run "$@" -- train m.dsm &&
    expect_grep "^$TMP/fake-mpirun $want $dsc_abs train m.dsm\$" "$TMP/out"
}
launch_dry "-np 8 --host worker-1:4,worker-2:4" --hostfile "$TMP/hostfile"
launch_dry "-np 4 --host worker-1:2,worker-2:2" --hostfile="$TMP/hostfile" --num_gpus 2
launch_dry "-np 4 --host worker-1:4" --hostfile "$TMP/hostfile" --num_nodes=1
launch_dry "-np 3" --num_gpus 3
launch_dry "-np 6 --host worker-1:4,worker-2:4" --hostfile "$TMP/hostfile" -n 6
launch_err() { # PATTERN FLAGS...
  local want=$1
  shift
  expect_exit 1 "$DSC" launch --mpirun "$TMP/fake-mpirun" --dry-run "$@" -- train m.dsm &&
    expect_grep "$want" "$TMP/err"
}
printf 'a slots=2\nb slot=3\n' >"$TMP/hf-bad"
printf 'a slots=2\na slots=3\n' >"$TMP/hf-twice"
printf '# nothing\n' >"$TMP/hf-empty"
launch_err "hf-bad:2: expected 'HOST slots=N' \(N from 1 to 1024\), as in DeepSpeed's hostfile" --hostfile "$TMP/hf-bad"
launch_err "hf-twice:2: host 'a' is listed twice" --hostfile "$TMP/hf-twice"
launch_err "lists no host" --hostfile "$TMP/hf-empty"
launch_err "cannot open hostfile .*nope" --hostfile "$TMP/nope"
launch_err "--num_nodes 3, but hostfile .* lists 2 hosts" --hostfile "$TMP/hostfile" --num_nodes 3
launch_err "-n 9 ranks, but the hostfile gives 8 slots" --hostfile "$TMP/hostfile" -n 9
launch_err "--num_nodes 2 needs a --hostfile naming the nodes" --num_nodes 2
launch_err "-n 2 and --num_gpus 3 disagree" -n 2 --num_gpus 3
launch_err "--num_gpus needs an integer in \[1, 1024\]" --num_gpus 0

# --include / --exclude, DeepSpeed's NAME[:SLOT[,SLOT...]][@NAME...]: the
# hosts' kept slots are their ranks; kept slots other than each host's first
# ones, the same on every host, become CUDA_VISIBLE_DEVICES (a rank takes
# GPU rank mod their number); different ones cannot be pinned (a note)
launch_dry "-np 6 --host worker-1:2,worker-2:4" --hostfile "$TMP/hostfile" --include="worker-1:0,1@worker-2"
grep -q "note:" "$TMP/err" && fail "slots 0..k-1 of each host gave a note" || pass
launch_dry "-np 4 --host worker-1:2,worker-2:2 -x CUDA_VISIBLE_DEVICES=1,3" --hostfile "$TMP/hostfile" -i "worker-1:1,3@worker-2:3,1"
launch_dry "-np 7 --host worker-1:4,worker-2:3" --hostfile "$TMP/hostfile" --exclude=worker-2:0
expect_grep "^dsc launch: note: --exclude keeps different slots on different hosts: each host runs as many ranks as it keeps slots, .* the slot indices are not pinned" "$TMP/err"
launch_dry "-np 4 --host worker-2:4" --hostfile "$TMP/hostfile" -e worker-1
launch_dry "-np 4 --host worker-1:4" --hostfile "$TMP/hostfile" --exclude worker-2:0,1,2,3
grep -q "note:" "$TMP/err" && fail "a whole host excluded by its slots gave a note" || pass
# a host named bare and with slots keeps the slots (DeepSpeed merges them)
launch_dry "-np 1 --host worker-1:1 -x CUDA_VISIBLE_DEVICES=2" --hostfile "$TMP/hostfile" --include "worker-1@worker-1:2"
launch_dry "-np 2 --host worker-2:4" --hostfile "$TMP/hostfile" --include worker-2 -n 2
launch_dry "-np 8 --host worker-1:4,worker-2:4" --hostfile "$TMP/hostfile" --include= # "": not given
# without a hostfile the one host is localhost (its GPUs, or its CPUs)
launch_dry "-np 1" --include localhost:0
launch_err "--include and --exclude are mutually exclusive \(as in DeepSpeed's launcher\)" --hostfile "$TMP/hostfile" --include worker-1 --exclude worker-2
launch_err "--include cannot be combined with --num_nodes or --num_gpus" --hostfile "$TMP/hostfile" --include worker-1 --num_gpus 2
launch_err "--exclude cannot be combined with --num_nodes or --num_gpus" --hostfile "$TMP/hostfile" --exclude worker-1 --num_nodes 1
launch_err "--include: host 'worker-3' is not in hostfile .*hostfile" --hostfile "$TMP/hostfile" --include worker-1@worker-3
launch_err "--exclude: host 'worker-2' has no slot 4: it has 4 \(0 to 3\)" --hostfile "$TMP/hostfile" --exclude worker-2:4
launch_err "--include 'worker-1:0,x': bad slot 'x' for host 'worker-1' \(slots are indices from 0" --hostfile "$TMP/hostfile" --include worker-1:0,x
launch_err "bad slot '' for host 'worker-1'" --hostfile "$TMP/hostfile" --include worker-1:
launch_err "bad slot '-1' for host 'worker-1'" --hostfile "$TMP/hostfile" --include=worker-1:-1
launch_err "'worker-1:0:1' has more than one ':'" --hostfile "$TMP/hostfile" --include worker-1:0:1
launch_err "--include 'worker-1@': an empty host name \(the form is NAME\[:SLOT\[,SLOT...\]\]\[@NAME...\]" --hostfile "$TMP/hostfile" --include "worker-1@"
launch_err "--exclude 'worker-1@worker-2' leaves no slot to run on" --hostfile "$TMP/hostfile" --exclude worker-1@worker-2
launch_err "-n 3 ranks, but --include keeps 2 slots" --hostfile "$TMP/hostfile" --include worker-1:0,1 -n 3
launch_err "--include: host 'worker-1' is not this one: without --hostfile the only host is 'localhost'" --include worker-1
launch_err "--exclude: host 'localhost' has no slot 4096: it has [0-9]+ \(0 to [0-9]+; without --hostfile: its CUDA devices, or with none its CPUs\)" --exclude localhost:4096
launch_err "--exclude 'localhost' leaves no slot to run on" --exclude localhost
launch_err "--include needs NAME\[:SLOT\[,SLOT...\]\]\[@NAME...\], as in worker-0:0,1@worker-1" --include
launch_err "--exclude needs NAME" -e

if command -v mpirun >/dev/null 2>&1; then
  export ASAN_OPTIONS=detect_leaks=0 # Open MPI's own allocations are not dsc's leaks
  make_corpus "$TMP/corpus.txt"
  expect_exit 0 "$DSC" data "$TMP/corpus.txt" -o "$TMP/c"
  RUN=(--data "$TMP/c" --batch 2 --seq 16 --global-batch 8 --lr 3e-3 --steps 6)
  expect_exit 0 "$DSC" launch -n 2 -- train "$MODEL" "${RUN[@]}" --log "$TMP/launch.jsonl" &&
    expect_grep '^batch 2 x seq 16 x grad_accum 2 x 2 ranks \(mpi\)' "$TMP/out"
  [ "$(grep -c '^step ' "$TMP/out")" -eq 6 ] && pass || fail "dsc launch: not 6 progress lines"
  expect_exit 0 mpirun -np 2 --oversubscribe --allow-run-as-root "$DSC" train "$MODEL" "${RUN[@]}" \
    --log "$TMP/mpirun.jsonl"
  python3 - "$TMP/launch.jsonl" "$TMP/mpirun.jsonl" <<'PY' && pass || fail "dsc launch differs from mpirun"
import json, sys
a, b = [[json.loads(l) for l in open(p)] for p in sys.argv[1:]]
assert len(a) == len(b) == 6
for x, y in zip(a, b):
    assert x["loss"] == y["loss"] and x["grad_norm"] == y["grad_norm"], (x, y)
PY
  # DeepSpeed's habits run the same job: --num_gpus 2, and a hostfile of this
  # node; the command is printed first
  expect_exit 0 "$DSC" launch --num_gpus 2 -- train "$MODEL" "${RUN[@]}" --log "$TMP/gpus.jsonl" &&
    expect_grep "^dsc launch: running: .*mpirun -np 2 $dsc_abs train " "$TMP/err"
  cmp -s <(grep -o '"loss":[^,]*' "$TMP/gpus.jsonl") <(grep -o '"loss":[^,]*' "$TMP/launch.jsonl") &&
    pass || fail "dsc launch --num_gpus 2 differs from -n 2"
  echo "localhost slots=2" >"$TMP/hf-local"
  expect_exit 0 "$DSC" launch --hostfile "$TMP/hf-local" -- train "$MODEL" "${RUN[@]}" --log "$TMP/hf.jsonl" &&
    expect_grep "^dsc launch: running: .*mpirun -np 2 --host localhost:2 $dsc_abs train " "$TMP/err"
  cmp -s <(grep -o '"loss":[^,]*' "$TMP/hf.jsonl") <(grep -o '"loss":[^,]*' "$TMP/launch.jsonl") &&
    pass || fail "dsc launch --hostfile differs from -n 2"
  # --include with slots: the hosts' kept slots, CUDA_VISIBLE_DEVICES through mpirun's -x
  echo "localhost slots=3" >"$TMP/hf-local3"
  expect_exit 0 "$DSC" launch --hostfile "$TMP/hf-local3" --include localhost:0,2 -- train "$MODEL" "${RUN[@]}" \
    --log "$TMP/inc.jsonl" &&
    expect_grep "^dsc launch: running: .*mpirun -np 2 --host localhost:2 -x CUDA_VISIBLE_DEVICES=0,2 $dsc_abs train " "$TMP/err"
  cmp -s <(grep -o '"loss":[^,]*' "$TMP/inc.jsonl") <(grep -o '"loss":[^,]*' "$TMP/launch.jsonl") &&
    pass || fail "dsc launch --include localhost:0,2 differs from -n 2"
  # a failing job's status comes back (every rank: a usage error, exit 1)
  expect_exit 1 "$DSC" launch -n 2 -- train "$MODEL" "${RUN[@]}" --zero-stage 7 &&
    expect_grep 'zero-stage needs 0, 1, 2 or 3' "$TMP/err"
  # a rank failing at run time ends the job non-zero with its error
  "$DSC" launch -n 2 -- train "$MODEL" --data "$TMP/none" >"$TMP/out" 2>"$TMP/err"
  [ $? -ne 0 ] && pass || fail "dsc launch with missing data exited 0"
  expect_grep 'none_train.bin: error: cannot open' "$TMP/err"
else
  echo "no mpirun: skipped the real launches"
fi
finish
