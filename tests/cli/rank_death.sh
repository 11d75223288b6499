# Ranks never outlive the job (docs/zero.md "When a rank dies"): 20 times, a
# 2-rank `dsc launch` training gets SIGKILL or SIGSTOP on a random rank after a
# random delay (0 to 1.5 s: start-up, compile, steps, checkpoint saves); the
# launch must return non-zero within the collective timeout plus a few
# seconds, leaving no process of the try behind. In-process ranks: one rank
# failing ends the others promptly.
source "$(dirname "$0")/lib/common.bash"
MODEL="$SRC/examples/gpt-tiny.dsm"
export DSC_CACHE_DIR="$TMP/kernel-cache"
export ASAN_OPTIONS=detect_leaks=0 # Open MPI's own allocations are not dsc's leaks
TRIES=${RANK_DEATH_TRIES:-20}
SEED=${RANK_DEATH_SEED:-$$}
RANDOM=$SEED
echo "seed $SEED (RANK_DEATH_SEED=$SEED reproduces the choices)"

expect_exit 0 "$DSC" data /usr/share/common-licenses/GPL-3 -o "$TMP/gpl" || { finish; exit 1; }
T0=$SECONDS
RUN=(--data "$TMP/gpl" --batch 2 --seq 16 --save-every 3 --log-every 1)

# In-process ranks: rank 0 fails at its next checkpoint (the --out directory
# became a file); rank 1 must stop at once, not after the 300 s default timeout.
"$DSC" train "$MODEL" "${RUN[@]}" --steps 100000 --ranks 2 --out "$TMP/inproc" \
  >"$TMP/inproc.out" 2>"$TMP/inproc.err" &
tp=$!
for _ in $(seq 4800); do [ -d "$TMP/inproc/step-000003" ] && break; sleep 0.05; done
# (a save between the two commands finds its directory gone: the run lock's
# check, runtime/rundir.c, fails it the same way)
mv "$TMP/inproc" "$TMP/inproc.moved" && touch "$TMP/inproc"
start=$(date +%s%N)
for _ in $(seq 100); do kill -0 $tp 2>/dev/null || break; sleep 0.05; done
if kill -0 $tp 2>/dev/null; then
  fail "in-process: rank 1 still running 5 s after rank 0 failed"
  kill -KILL $tp
fi
wait $tp
rc=$?
[ $rc -ne 0 ] && pass || fail "in-process: a failed rank, exit 0"
expect_grep 'rank 0 failed first; rank 1 failed too' "$TMP/inproc.err"
# the rank's error keeps its location, as one process prints it ("FILE: error: ...")
expect_grep "^$TMP/inproc[^ ]*: error: " "$TMP/inproc.err"
echo "in-process: exit $rc $(( ($(date +%s%N) - start) / 1000000 )) ms after the failure"

if ! "$DSC" launch -n 2 --dry-run -- train x >/dev/null 2>&1 || ! command -v mpirun >/dev/null; then
  echo "no MPI in this dsc or no mpirun: skipped the launches"
  finish
  exit $?
fi

echo "in-process part: $((SECONDS - T0)) s"
# A whole run first: it ends 0 with nothing left (and fills the kernel cache).
expect_exit 0 "$DSC" launch -n 2 -- train "$MODEL" "${RUN[@]}" --steps 3 --out "$TMP/whole"
[ -z "$(pgrep -f -- "$TMP/whole")" ] && pass || fail "processes left after a whole run"

echo "whole run: $((SECONDS - T0)) s"
export DSC_COMM_TIMEOUT=0.5
BOUND=10 # seconds from the signal to dsc launch's return: the timeout, the kill, a busy machine
# The pid of rank R among the processes of a try (mpirun sets its rank in its environment).
rank_pid() { # MARKER R
  local p
  for p in $(pgrep -f -- "$1"); do
    tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2" &&
      echo "$p" && return 0
  done
  return 1
}
worst=0
for try in $(seq "$TRIES"); do
  out="$TMP/try$try/out" # in every command line of the try: the marker
  rank=$((RANDOM % 2))
  sig=$([ $((RANDOM % 2)) -eq 0 ] && echo KILL || echo STOP)
  delay_ms=$((RANDOM % 1500))
  "$DSC" launch -n 2 -- train "$MODEL" "${RUN[@]}" --steps 100000 --out "$out" \
    >"$TMP/try$try.out" 2>"$TMP/try$try.err" &
  lp=$!
  victim=
  for _ in $(seq 600); do victim=$(rank_pid "$out" $rank) && break; sleep 0.02; done
  sleep "$(printf '%d.%03d' $((delay_ms / 1000)) $((delay_ms % 1000)))"
  what="try $try: SIG$sig to rank $rank after $delay_ms ms"
  [ -n "$victim" ] && kill -$sig "$victim" 2>/dev/null
  start=$(date +%s%N)
  for _ in $(seq $((BOUND * 20))); do kill -0 $lp 2>/dev/null || break; sleep 0.05; done
  if kill -0 $lp 2>/dev/null; then
    fail "$what: dsc launch still running after $BOUND s"
    pkill -KILL -f -- "$out"
  fi
  wait $lp
  rc=$?
  ms=$((($(date +%s%N) - start) / 1000000))
  [ $ms -gt $worst ] && worst=$ms
  [ $rc -ne 0 ] && pass || fail "$what: dsc launch exited 0"
  left=$(pgrep -a -f -- "$out")
  if [ -z "$left" ]; then pass; else
    fail "$what: left behind:"
    echo "$left" | sed 's/^/    /'
    pkill -KILL -f -- "$out"
  fi
  # who ended it, named: mpirun for a killed rank, dsc launch or the survivor for a stopped one
  if [ $sig = KILL ]; then
    expect_grep "process rank $rank with PID [0-9]+ on node .* exited on signal 9" "$TMP/try$try.err"
  else
    expect_grep "rank $rank \\(pid [0-9]+\\) has been stopped|rank $((1 - rank)): .*(timed out|did not return)" "$TMP/try$try.err"
  fi
  echo "$what: exit $rc after $ms ms ($(grep -c '^step ' "$TMP/try$try.out") steps)"
done
echo "tries: $((SECONDS - T0)) s"
echo "slowest end: $worst ms after the signal (bound $BOUND s)"
finish
