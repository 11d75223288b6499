# --backend cuda where there is no GPU (these build machines): dsc run and
# dsc train exit 1 with the no-driver message, before reading any data; a
# library that is not a driver (DSC_LIBCUDA) and the toolkit's driver stub
# are the same clean error. On a machine with a GPU this script only checks
# that the backend is listed (tests/gpu/gpu_check.c runs there).
source "$(dirname "$0")/lib/common.bash"
source "$(dirname "$0")/lib/corpus.bash"
MODEL="$SRC/examples/gpt-tiny.dsm"
export DSC_CACHE_DIR="$TMP/kernel-cache"

if ! expect_exit 1 "$DSC" run "$MODEL" --backend cuda --quiet; then finish; exit; fi
if grep -q "is not built in" "$TMP/err"; then
  echo "cuda backend not built: only the not-built message was checked"
  expect_grep "backend cuda is not built in" "$TMP/err"
  finish
  exit
fi
if ! grep -q "no CUDA driver\|no CUDA device" "$TMP/err"; then
  echo "a CUDA device seems present: the no-GPU checks do not apply here"
  cat "$TMP/err"
  finish
  exit
fi
expect_grep "^error: backend cuda: no CUDA driver \(libcuda\.so\.1: " "$TMP/err"

make_corpus "$TMP/corpus.txt"
expect_exit 0 "$DSC" data "$TMP/corpus.txt" -o "$TMP/c"
expect_exit 1 "$DSC" train "$MODEL" --data "$TMP/c" --backend cuda --steps 2 --quiet &&
  expect_grep "backend cuda: no CUDA driver" "$TMP/err"
[ "$(wc -l <"$TMP/err")" -le 2 ] && pass || fail "more than one error line: $(cat "$TMP/err")"

# a library that is not a driver, and the toolkit's stub: named, no crash
DSC_LIBCUDA=libm.so.6 expect_exit 1 "$DSC" run "$MODEL" --backend cuda --quiet &&
  expect_grep "no CUDA driver \(libm\.so\.6 has no cuInit" "$TMP/err"
for stub in /usr/local/cuda/lib64/stubs/libcuda.so /usr/local/cuda/targets/*/lib/stubs/libcuda.so; do
  [ -f "$stub" ] || continue
  DSC_LIBCUDA=$stub expect_exit 1 "$DSC" run "$MODEL" --backend cuda --quiet &&
    expect_grep "backend cuda: no CUDA driver" "$TMP/err"
  break
done
finish
