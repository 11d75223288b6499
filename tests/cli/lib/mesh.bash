# Shared by the mesh tests (cli.sequence_parallel, cli.expert_parallel,
# cli.tensor_parallel); source after common.bash.

# mpi_train OUT ARGS...: `dsc train ARGS --out OUT` as 2 MPI processes.
# Returns 1 without a check when there is no mpirun.
mpi_train() {
  command -v mpirun >/dev/null 2>&1 || return 1
  local out=$1
  shift
  # Open MPI's own allocations are not dsc's leaks (as cli.ranks)
  expect_exit 0 env ASAN_OPTIONS=detect_leaks=0 mpirun -x ASAN_OPTIONS -np 2 --oversubscribe \
    --allow-run-as-root "$DSC" train "$@" --out "$out"
}

# same_runs WHAT A:B...: each run $TMP/A trained the curve of $TMP/B and
# ended at its weights (tests/cli/lib/curves.py's assert_same_run).
same_runs() {
  local what=$1
  shift
  PYTHONPATH="$SRC/tests/cli/lib" python3 - "$TMP" "$@" <<'PY' && pass || fail "$what runs differ from their reference"
import sys
from curves import assert_same_run
for pair in sys.argv[2:]:
    loss, weights = assert_same_run(sys.argv[1], *pair.split(":"))
    print(pair, "max |loss diff|", loss, "max weight diff (relative to the tensor)", weights)
PY
}

# plan_activations_fall AXIS N MIN PLAN-ARGS...: rank 0's activations in
# `dsc plan PLAN-ARGS --json` fall by more than MIN with --mesh AXIS=N.
plan_activations_fall() {
  local axis=$1 n=$2 min=$3
  shift 3
  expect_exit 0 "$DSC" plan "$@" --json && cp "$TMP/out" "$TMP/plan-1.json"
  expect_exit 0 "$DSC" plan "$@" --json --mesh "$axis=$n" && cp "$TMP/out" "$TMP/plan-$n.json"
  python3 - "$TMP/plan-1.json" "$TMP/plan-$n.json" "$axis" "$min" <<'PY' && pass || fail "activations do not fall with $axis"
import json, sys
a, b = (json.load(open(p))["ranks"][0]["activations"] for p in sys.argv[1:3])
print(f"activations per rank: {sys.argv[3]} 1: {a}, with {sys.argv[3]}: {b}, ratio {a / b:.2f}")
assert a / b > float(sys.argv[4]), (a, b)
PY
}
