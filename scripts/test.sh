#!/usr/bin/env bash
# The whole test suite, as CI runs it:
#   1. a -Werror build and every test (unit tests through ctest, CLI end-to-end tests);
#   2. the same tests under AddressSanitizer + UndefinedBehaviorSanitizer;
#   3. the frontend fuzzer (libFuzzer) for a bounded time (FUZZ_SECONDS, default 60).
# Build trees go to build-test/ (kept between runs; delete to start clean).
set -euo pipefail
cd "$(dirname "$0")/.."
"$(dirname "$0")/install-deps.sh"

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
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  run_suite sanitize -DDSC_SANITIZE=ON

echo "=== fuzz the frontend for ${FUZZ_SECONDS:-60} s"
CC=clang CXX=clang++ cmake -S . -B build-test/fuzz -G Ninja -DDSC_FUZZ=ON -DDSC_BUILD_TESTS=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build-test/fuzz -j "$jobs" --target fuzz_frontend
mkdir -p build-test/fuzz/corpus
build-test/fuzz/tests/fuzz/fuzz_frontend -max_total_time="${FUZZ_SECONDS:-60}" -max_len=4096 \
  -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 build-test/fuzz/corpus tests/fuzz/corpus 2>&1 | tail -n 12
echo "=== all tests passed"
