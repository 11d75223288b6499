#!/usr/bin/env bash
# The layering of the sources (DESIGN.md: each layer calls only down):
#  1. the call graph between driver/*.c files has no cycle. Who calls whom
#     is derived from the sources (non-static definitions at column 0,
#     calls `name(` in the other files, comments stripped by cpp), or with
#     --objects DIR from the object files DIR/*.o (nm: defined text symbols
#     against undefined ones);
#  2. no #include arrow points up: runtime/ into codegen/ or driver/, ir/
#     into runtime/, codegen/ into passes/. Until the program-layer split
#     lands these are reported (exit 0); --strict makes them fail.
# usage: scripts/check-layers.sh [--strict] [--objects DIR] [ROOT]  (ROOT: the
# source tree, default this script's). Exit 0 ok, 1 a violation, 2 misuse.
set -u
strict=0 objects= root=
while [ $# -gt 0 ]; do
  case "$1" in
    --strict) strict=1 ;;
    --objects) objects=${2:?--objects needs a directory}; shift ;;
    -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "check-layers: unknown option '$1'" >&2; exit 2 ;;
    *) root=$1 ;;
  esac
  shift
done
root=${root:-$(cd "$(dirname "$0")/.." && pwd)}
[ -d "$root/driver" ] || { echo "check-layers: $root has no driver/" >&2; exit 2; }
tmp=$(mktemp -d) || exit 2
trap 'rm -rf "$tmp"' EXIT
status=0

# ---- 1. driver call graph: "FILE SYMBOL" lines of definitions and uses
if [ -n "$objects" ]; then
  for o in "$objects"/*.o; do
    [ -e "$o" ] || { echo "check-layers: no object files in $objects" >&2; exit 2; }
    f=$(basename "$o" .o); f=${f%.c}
    nm --defined-only -g "$o" | awk -v f="$f" '$2 == "T" {print f, $3}' >>"$tmp/defs"
    nm -u "$o" | awk -v f="$f" '{print f, $2}' >>"$tmp/uses"
  done
else
  for c in "$root"/driver/*.c; do
    f=$(basename "$c" .c)
    # comments out, strings blanked: a name in either is no call
    cpp -fpreprocessed -P "$c" 2>/dev/null | sed 's/"\([^"\\]\|\\.\)*"/""/g' >"$tmp/$f.i"
    awk -v f="$f" '/^[A-Za-z_]/ && !/^(static|typedef|extern|struct|enum|union)[ (]/ && /\(/ {
        s = $0; sub(/\(.*/, "", s); n = split(s, w, /[^A-Za-z0-9_]+/)
        if (w[n] != "") print f, w[n] }' "$tmp/$f.i" >>"$tmp/defs"
    grep -oE '\b[A-Za-z_][A-Za-z0-9_]*[[:space:]]*\(' "$tmp/$f.i" | tr -d '( \t' |
      sort -u | awk -v f="$f" '{print f, $1}' >>"$tmp/uses"
  done
fi
touch "$tmp/defs" "$tmp/uses"
# edges CALLER CALLEE between different files
awk 'NR == FNR {def[$2] = $1; next} ($2 in def) && def[$2] != $1 {print $1, def[$2]}' \
  "$tmp/defs" "$tmp/uses" | sort -u >"$tmp/edges"
echo "driver call graph (caller -> callee):"
awk '{a[$1] = a[$1] " " $2} END {for (k in a) print "  " k " ->" a[k]}' "$tmp/edges" | sort
# tsort names the files of a loop on stderr
if ! tsort "$tmp/edges" >/dev/null 2>"$tmp/loop"; then
  echo "check-layers: the driver's files call in a cycle:" \
    "$(grep -v 'input contains a loop' "$tmp/loop" | sed 's/^tsort: //' | tr '\n' ' ')" >&2
  status=1
else
  echo "driver: no cycle"
fi

# ---- 2. include arrows: DIR and the layers it must not include
bad=0
check_includes() { # dir forbidden...
  local dir=$1; shift
  [ -d "$root/$dir" ] || return 0
  for up in "$@"; do
    grep -HnE "^[[:space:]]*#[[:space:]]*include[[:space:]]+\"$up/" \
      "$root/$dir"/*.c "$root/$dir"/*.h 2>/dev/null | sed "s|^$root/||" >>"$tmp/includes"
  done
}
touch "$tmp/includes"
check_includes runtime codegen driver
check_includes ir runtime
check_includes codegen passes
bad=$(wc -l <"$tmp/includes")
if [ "$bad" -gt 0 ]; then
  echo "includes pointing up ($bad):"
  sed 's/^/  /' "$tmp/includes"
  if [ "$strict" = 1 ]; then
    echo "check-layers: $bad #include lines point up a layer" >&2
    status=1
  else
    echo "  (reported, not failed: give --strict once the program layer has landed)"
  fi
else
  echo "includes: none points up"
fi
exit $status
