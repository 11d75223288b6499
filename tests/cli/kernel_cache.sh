#!/usr/bin/env bash
# The kernel cache by default: $XDG_CACHE_HOME/dsc, else ~/.cache/dsc (made
# with its parents), reused by the next run; DSC_CACHE_DIR overrides it;
# --no-cache and DSC_CACHE_DIR=off write nothing; equal kernels of a
# program compile once (GPT-tiny's two layers share their kernels).
source "$(dirname "$0")/lib/common.bash"
[ -x "$DSC" ] || { echo "no dsc binary"; exit 1; }
if ! "$DSC" run "$SRC/examples/gpt-tiny.dsm" --backend cpu --quiet >/dev/null 2>&1; then
  echo "cpu backend not built: skipped"; exit 0
fi
MODEL=$SRC/examples/gpt-tiny.dsm
count() { find "$1" -name '*.o' 2>/dev/null | wc -l; }
compiled() { sed -n 's/^kernels: \([0-9]*\) compiled, \([0-9]*\) from the kernel cache$/\1 \2/p' "$TMP/err"; }

# ~/.cache/dsc, parents made (no .cache under the new HOME)
H=$TMP/home
mkdir -p "$H"
expect_exit 0 env -u XDG_CACHE_HOME -u DSC_CACHE_DIR HOME="$H" "$DSC" run "$MODEL" --backend cpu
read -r c1 h1 <<<"$(compiled)"
n1=$(count "$H/.cache/dsc")
[ "${c1:-0}" -gt 0 ] && [ "$n1" -eq "$c1" ] && [ "${h1:-1}" -eq 0 ] && pass ||
  fail "first run: compiled '$c1', cached '$h1', files $n1 in ~/.cache/dsc"
# the second run compiles nothing
expect_exit 0 env -u XDG_CACHE_HOME -u DSC_CACHE_DIR HOME="$H" "$DSC" run "$MODEL" --backend cpu
read -r c2 h2 <<<"$(compiled)"
[ "${c2:-1}" -eq 0 ] && [ "${h2:-0}" -gt 0 ] && [ "$(count "$H/.cache/dsc")" -eq "$n1" ] && pass ||
  fail "second run: compiled '$c2', cached '$h2'"
# equal kernels compiled once: fewer compiled than distinct instructions
# would need (the two layers of gpt-tiny have the same kernels)
expect_exit 0 env DSC_CACHE_DIR="$TMP/c3" "$DSC" run "$SRC/examples/gpt-tiny.dsm" --backend cpu --dim L=4
read -r c4 _ <<<"$(compiled)"
[ "${c4:-0}" -gt 0 ] && [ "$c4" -eq "$c1" ] && pass ||
  fail "4 layers compiled $c4 kernels, 2 layers $c1: equal kernels should compile once"

# $XDG_CACHE_HOME/dsc when set (absolute)
expect_exit 0 env -u DSC_CACHE_DIR XDG_CACHE_HOME="$TMP/xdg" HOME="$H" "$DSC" run "$MODEL" --backend cpu --quiet
[ "$(count "$TMP/xdg/dsc")" -eq "$n1" ] && pass || fail "XDG_CACHE_HOME/dsc holds $(count "$TMP/xdg/dsc") objects, not $n1"
# DSC_CACHE_DIR wins
expect_exit 0 env DSC_CACHE_DIR="$TMP/mine" XDG_CACHE_HOME="$TMP/xdg2" "$DSC" run "$MODEL" --backend cpu --quiet
[ "$(count "$TMP/mine")" -eq "$n1" ] && [ ! -e "$TMP/xdg2" ] && pass || fail "DSC_CACHE_DIR was not the cache"

# --no-cache (any position) and DSC_CACHE_DIR=off: nothing read or written
expect_exit 0 env -u DSC_CACHE_DIR XDG_CACHE_HOME="$TMP/none" "$DSC" run --no-cache "$MODEL" --backend cpu
read -r c5 h5 <<<"$(compiled)"
[ ! -e "$TMP/none" ] && [ "${h5:-1}" -eq 0 ] && [ "${c5:-0}" -eq "$c1" ] && pass || fail "--no-cache used a cache"
expect_exit 0 env DSC_CACHE_DIR=off XDG_CACHE_HOME="$TMP/none" "$DSC" run "$MODEL" --backend cpu --quiet
[ ! -e "$TMP/none" ] && pass || fail "DSC_CACHE_DIR=off wrote $TMP/none"
expect_exit 0 "$DSC" --help
expect_grep "no-cache" "$TMP/out"

# an unwritable cache costs nothing but the compile
mkdir -p "$TMP/ro" && chmod 500 "$TMP/ro"
if [ "$(id -u)" != 0 ]; then
  expect_exit 0 env DSC_CACHE_DIR="$TMP/ro/dsc" "$DSC" run "$MODEL" --backend cpu
  expect_grep '^loss: ' "$TMP/out"
fi
chmod 700 "$TMP/ro"

# DSC_CPU_ISA: an unknown value is a clear error
expect_exit 1 env DSC_CPU_ISA=avx1024 "$DSC" run "$MODEL" --backend cpu
expect_grep 'DSC_CPU_ISA=avx1024: expected avx512, avx2 or baseline' "$TMP/err"
finish
