# Shared helpers for tests/cli/*.sh (sourced). ctest sets DSC, EMBED, SRC, TMPROOT.
set -uo pipefail
: "${DSC:?set DSC to the dsc binary}" "${SRC:?set SRC to the source dir}"
TMP=$(mktemp -d "${TMPROOT:-/tmp}/cli.XXXXXX" 2>/dev/null || { mkdir -p "${TMPROOT:-/tmp}" && mktemp -d "${TMPROOT:-/tmp}/cli.XXXXXX"; })
trap 'rm -rf "$TMP"' EXIT
# the default kernel cache of a test is its own, never the user's ~/.cache/dsc
export XDG_CACHE_HOME="$TMP/xdg-cache"
failures=0
checks=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
pass() { checks=$((checks + 1)); }

# expect_exit CODE CMD...: runs CMD with stdout/stderr captured in $TMP/out, $TMP/err
expect_exit() {
  local want=$1
  shift
  "$@" >"$TMP/out" 2>"$TMP/err"
  local got=$?
  if [ "$got" -ne "$want" ]; then
    fail "'$*' exited $got, expected $want"
    sed 's/^/    /' "$TMP/err" | head -20
    return 1
  fi
  pass
  return 0
}
expect_grep() { # PATTERN FILE
  if grep -qE -- "$1" "$2"; then pass; else fail "no '$1' in $(basename "$2"):"; sed 's/^/    /' "$2" | head -10; fi
}
finish() {
  echo "$checks checks passed, $failures failed"
  [ "$failures" -eq 0 ]
}
