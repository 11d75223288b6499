# Requests this machine cannot serve are refused before the work starts:
# exit 1 within seconds, with the numbers (runtime/limits.c, driver/limits.c).
source "$(dirname "$0")/lib/common.bash"
source "$(dirname "$0")/lib/corpus.bash"
MODEL="$SRC/examples/gpt-tiny.dsm"
make_corpus "$TMP/corpus.txt"
expect_exit 0 "$DSC" data "$TMP/corpus.txt" -o "$TMP/c"
BOUND=${DSC_LIMIT_BOUND:-15} # seconds (each returns in 1-3 s here; CI machines are loaded)
CAP=$((4 * $(nproc)))

# refused SECONDS_VAR PATTERN CMD...: exit 1, PATTERN in stderr, within BOUND s.
refused() {
  local pat=$1
  shift
  local t0=$(date +%s)
  expect_exit 1 "$@" && expect_grep "$pat" "$TMP/err"
  local took=$(($(date +%s) - t0))
  [ $took -le $BOUND ] && pass || fail "'$*' took $took s to refuse (bound $BOUND s)"
  echo "refused in $took s: $*"
}

# memory: the planned arenas against the memory available (10M x 64 tokens:
# terabytes); the message names both figures
refused 'out of memory while planning the step.s arenas: needed [0-9]+ bytes \([0-9.]+ GiB\), this host has [0-9]+ bytes' \
  "$DSC" train "$MODEL" --data "$TMP/c" --batch 10000000 --steps 1
# the same with the host's figure given (DSC_HOST_MEMORY): 1 MiB is less than batch 8 needs
refused 'needed [0-9]+ bytes .*this host has 1048576 bytes' \
  env DSC_HOST_MEMORY=1048576 "$DSC" train "$MODEL" --data "$TMP/c" --batch 8 --steps 1
# in-process ranks share the host: the arenas of every rank count
refused "\\(2 ranks x [0-9]+ bytes in this process\\): needed" \
  env DSC_HOST_MEMORY=1048576 "$DSC" train "$MODEL" --data "$TMP/c" --batch 8 --ranks 2 --steps 1
# dsc run: the executor's arenas, checked before they are allocated
# (after lowering, before the JIT: no kernel was compiled into the cache)
mkdir -p "$TMP/arena-cache"
refused "out of memory while creating the CPU executor.s arenas: needed [0-9]+ bytes .*this host has 1048576 bytes" \
  env DSC_HOST_MEMORY=1048576 DSC_CACHE_DIR="$TMP/arena-cache" "$DSC" run "$MODEL" --batch 64 --quiet
[ -z "$(ls -A "$TMP/arena-cache")" ] && pass || fail "kernels compiled before the arenas were refused: $(ls "$TMP/arena-cache" | head -3)"

# grad_accum is a loop (pass accumulate): any count compiles and plans in the
# time of one micro-batch; a step's token buffers are checked before they
# are allocated
refused "out of memory while holding a step's tokens \\(batch 8 x grad_accum 1000000000 x world 1 rows of 64\\): needed 12288000000000 bytes" \
  "$DSC" train "$MODEL" --data "$TMP/c" --grad-accum 1000000000 --steps 1
expect_exit 0 "$DSC" plan "$SRC/examples/gpt2.dsm" --grad-accum 1000000000 &&
  expect_grep 'grad_accum 1000000000 per rank' "$TMP/out"
# LLaMA-70B's own train section (grad_accum 1024, seq 4096) at world 1 plans
# within a 16 GiB host: its IR is one micro-batch's
expect_exit 0 env DSC_HOST_MEMORY=$((16 << 30)) "$DSC" plan "$SRC/examples/llama-70b.dsm" --world 1 &&
  expect_grep 'seq 4096 x grad_accum 1024 per rank' "$TMP/out"

# threads and in-process ranks: at most 4 x the online CPUs
refused "$((CAP + 1)) threads is more than 4 x the $(nproc) online CPUs \\($CAP\\)" \
  "$DSC" train "$MODEL" --data "$TMP/c" --threads $((CAP + 1)) --steps 1
if [ $((CAP + 1)) -le 1024 ]; then
  refused "$((CAP + 1)) threads is more than 4 x" "$DSC" run "$MODEL" --threads $((CAP + 1)) --quiet
  refused "$((CAP + 1)) in-process ranks is more than 4 x the $(nproc) online CPUs" \
    "$DSC" train "$MODEL" --data "$TMP/c" --ranks $((CAP + 1)) --steps 1
fi
# the cap itself still runs
expect_exit 0 "$DSC" run "$MODEL" --threads "$CAP" --quiet

# dsc run checks --seq against the model's context, as dsc train does
refused "sequence length 100000000 is longer than the model's context of 64 positions" \
  "$DSC" run "$MODEL" --seq 100000000
refused "sequence length 65 is longer than the model's context of 64" "$DSC" run "$MODEL" --seq 65
expect_exit 0 "$DSC" run "$MODEL" --seq 64 --quiet
finish
