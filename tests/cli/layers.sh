# scripts/check-layers.sh: the driver's files call without a cycle (this
# tree passes, a made-up cycle fails) and upward #includes are found.
source "$(dirname "$0")/lib/common.bash"
CHECK="$SRC/scripts/check-layers.sh"

# ---- this tree: no cycle among driver/ files; build.c calls no job file (only
# the cost model and the calibration cache, for the schedule pass's rates)
# --strict: the tree has no upward include either (the program layer removed the last ones)
expect_exit 0 "$CHECK" --strict "$SRC" && expect_grep '^includes: none points up' "$TMP/out"
expect_exit 0 "$CHECK" "$SRC" && expect_grep '^driver: no cycle' "$TMP/out"
expect_grep '^  build -> calibrate cost$' "$TMP/out"
for job in train plan program autocfg offload_auto; do
  grep -qE "^  build -> .*\b$job\b" "$TMP/out" && fail "build.c calls $job.c" || pass
done

# ---- a cycle through two files is named; a comment naming a call is not one
R="$TMP/tree"
mkdir -p "$R/driver" "$R/runtime" "$R/ir" "$R/codegen"
printf 'int drv_a(void) { return drv_b(); }\n' >"$R/driver/a.c"
printf '/* drv_a() is not called here */\nint drv_b(void) { return 1; }\n' >"$R/driver/b.c"
expect_exit 0 "$CHECK" "$R" && expect_grep '^  a -> b$' "$TMP/out"
printf 'int drv_b(void) { return drv_c(); }\n' >"$R/driver/b.c"
printf 'int drv_c(void) { return drv_a(); }\n' >"$R/driver/c.c"
expect_exit 1 "$CHECK" "$R" && expect_grep 'call in a cycle: .*\ba\b' "$TMP/err"

# ---- includes pointing up: reported, failed with --strict
rm "$R/driver/c.c"
printf 'int drv_b(void) { return 1; }\n' >"$R/driver/b.c"
printf '#include "driver/driver.h"\n' >"$R/runtime/x.c"
printf '#include "runtime/runtime.h"\n' >"$R/ir/y.c"
printf '#include "passes/passes.h"\n' >"$R/codegen/z.c"
expect_exit 0 "$CHECK" "$R" && expect_grep '^includes pointing up \(3\)' "$TMP/out"
expect_grep 'runtime/x.c:1:#include "driver/driver.h"' "$TMP/out"
expect_exit 1 "$CHECK" --strict "$R" && expect_grep '3 #include lines point up' "$TMP/err"
rm "$R/runtime/x.c" "$R/ir/y.c" "$R/codegen/z.c"
expect_exit 0 "$CHECK" --strict "$R" && expect_grep '^includes: none points up' "$TMP/out"

# ---- from the object files (nm) the graph is the same as from the sources
OBJ="$(dirname "$DSC")/CMakeFiles/dsc_objects.dir/driver"
if [ -d "$OBJ" ] && command -v nm >/dev/null; then
  expect_exit 0 "$CHECK" --objects "$OBJ" "$SRC" && expect_grep '^driver: no cycle' "$TMP/out"
  grep '^  [a-z_]* ->' "$TMP/out" >"$TMP/from_objects"
  "$CHECK" "$SRC" | grep '^  [a-z_]* ->' >"$TMP/from_sources"
  cmp -s "$TMP/from_objects" "$TMP/from_sources" && pass ||
    fail "call graphs differ: $(diff "$TMP/from_sources" "$TMP/from_objects" | tr '\n' ' ')"
fi
finish
