#!/usr/bin/env bash
# The whole test suite, as CI runs it:
#   1. a -Werror build and every test (unit tests through ctest, CLI end-to-end tests);
#   2. the same tests under AddressSanitizer + UndefinedBehaviorSanitizer;
#   3. the fuzzers of the model-language frontend and the text-IR parser
#      (libFuzzer), each for a bounded time (FUZZ_SECONDS, default 60).
#   4. when the set-up files changed since the last recorded fresh check
#      (scripts/fresh-check.sha256), scripts/fresh-check.sh --quick: the
#      README's commands on a minimal Debian 12 (DSC_FRESH_CHECK=0 skips it,
#      =1 forces it; skipped while no check has ever passed: no stamp).
# --release-only: step 1 alone (what the quick fresh check runs).
# Build trees go to build-test/ (kept between runs; delete to start clean).
set -euo pipefail
cd "$(dirname "$0")/.."
release_only=0
case ${1:-} in
--release-only) release_only=1 ;;
"") ;;
*) echo "test.sh: unknown argument '$1' (--release-only or nothing)" >&2; exit 1 ;;
esac
scripts/install-deps.sh --venv build-test/pyenv --hf-venv build-test/hf-venv
# The venv holds what Debian lacks (safetensors); it sees Debian's numpy.
if [ -x build-test/pyenv/bin/python3 ]; then export PATH=$PWD/build-test/pyenv/bin:$PATH; fi
# transformers over Debian's torch: the oracle of tests/cli/hf_oracle.sh,
# which fails (not skips) when this Python lacks them
export DSC_HF_PYTHON=$PWD/build-test/hf-venv/bin/python3

jobs=$(nproc)
run_suite() { # name, extra cmake flags...
  local dir=build-test/$1
  shift
  echo "=== build $dir ($*)"
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDSC_WERROR=ON "$@" >/dev/null
  cmake --build "$dir" -j "$jobs"
  echo "=== test $dir"
  ctest --test-dir "$dir" -j "$jobs" --output-on-failure --timeout 900
}

run_suite release
if [ $release_only -eq 1 ]; then
  echo "=== release tests passed (--release-only)"
  exit 0
fi
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  run_suite sanitize -DDSC_SANITIZE=ON

# libFuzzer on the two text parsers (model language, text IR), seeded with
# the examples and their printed IR.
fuzz_secs=${FUZZ_SECONDS:-60}
CC=clang CXX=clang++ cmake -S . -B build-test/fuzz -G Ninja -DDSC_FUZZ=ON -DDSC_BUILD_TESTS=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build-test/fuzz -j "$jobs" --target fuzz_frontend fuzz_ir_text
mkdir -p build-test/fuzz/corpus-dsm build-test/fuzz/corpus-ir
for f in examples/*.dsm; do
  build-test/release/dsc dump "$f" -o "build-test/fuzz/corpus-ir/$(basename "$f" .dsm).dsir"
done
fuzz() { # target, seconds, corpus dirs...
  local target=$1 secs=$2
  shift 2
  echo "=== fuzz $target for $secs s"
  build-test/fuzz/tests/fuzz/$target -max_total_time="$secs" -max_len=8192 -timeout=10 \
    -rss_limit_mb=2048 -print_final_stats=1 "$@" 2>&1 | tail -n 4
}
fuzz fuzz_frontend "$fuzz_secs" build-test/fuzz/corpus-dsm tests/fuzz/corpus
fuzz fuzz_ir_text "$fuzz_secs" build-test/fuzz/corpus-ir
cmake --build build-test/fuzz -j "$jobs" --target fuzz_safetensors && mkdir -p build-test/fuzz/corpus-st && fuzz fuzz_safetensors 30 build-test/fuzz/corpus-st tests/crafted/files tests/crafted/base
cmake --build build-test/fuzz -j "$jobs" --target fuzz_state_json && mkdir -p build-test/fuzz/corpus-state && fuzz fuzz_state_json 30 build-test/fuzz/corpus-state tests/crafted/files tests/crafted/base


# The set-up on a fresh machine: only when what decides it changed.
if [ -n "${DSC_IN_FRESH_CHECK:-}" ]; then
  echo "=== fresh check: skipped (this is the fresh check)"
elif [ "${DSC_FRESH_CHECK:-}" = 0 ]; then
  echo "=== fresh check: skipped (DSC_FRESH_CHECK=0)"
elif [ ! -f scripts/fresh-check.sha256 ] && [ "${DSC_FRESH_CHECK:-}" != 1 ]; then
  # No check has passed yet on this tree's set-up: until one has (and its
  # stamp is committed), running it here on every change would add ~20 min
  # to each CI run. DSC_FRESH_CHECK=1 forces it.
  echo "=== fresh check: skipped (no passing check recorded yet: run scripts/fresh-check.sh)"
elif why=$(scripts/fresh-check.sh --stamp-current); then
  echo "=== fresh check: skipped (set-up files unchanged since the last one, scripts/fresh-check.sha256)"
else
  echo "=== fresh check: $why: running scripts/fresh-check.sh --quick"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO scripts/fresh-check.sh --quick
fi
echo "=== all tests passed"
