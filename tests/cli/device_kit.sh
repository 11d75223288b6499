# The build of the GPU device machine (issue 6 item 3): no Flex, Bison or
# cJSON there. scripts/device-kit.sh makes the kit here; a configure with
# Flex and Bison hidden takes the lexer and parser from it, and the dsc it
# builds (every optional backend off, as small as it gets) parses and runs a
# model. Without the kit the configure stops with a message that says how to
# make one.
source "$(dirname "$0")/lib/common.bash"
KIT=$TMP/kit
expect_exit 0 bash "$SRC/scripts/device-kit.sh" "$KIT"
for f in gen/frontend/parser.c gen/frontend/parser.h gen/frontend/lexer.c gen/frontend/lexer.h \
         cjson/include/cjson/cJSON.h cjson/lib/libcjson.so; do
  [ -s "$KIT/$f" ] && pass || fail "the kit has no $f"
done
# the kit's library is a file, not a link (links do not travel to the device)
[ ! -L "$KIT/cjson/lib/libcjson.so" ] && pass || fail "libcjson.so in the kit is a symlink"

NOFLEX=(-DCMAKE_DISABLE_FIND_PACKAGE_FLEX=ON -DCMAKE_DISABLE_FIND_PACKAGE_BISON=ON
        -DDSC_ENABLE_CUDA=OFF -DDSC_ENABLE_LLVM=OFF -DDSC_ENABLE_MPI=OFF -DDSC_BUILD_TESTS=OFF
        -DDSC_BUILD_BENCH=OFF -G Ninja)
expect_exit 1 cmake -S "$SRC" -B "$TMP/b0" "${NOFLEX[@]}"
expect_grep 'scripts/device-kit.sh' "$TMP/err"
expect_exit 0 cmake -S "$SRC" -B "$TMP/b1" "${NOFLEX[@]}" -DDSC_GEN_FRONTEND_DIR="$KIT/gen/frontend" \
  -DCMAKE_PREFIX_PATH="$KIT/cjson"
expect_grep 'lexer and parser from' "$TMP/out"
expect_exit 0 ninja -C "$TMP/b1" dsc
if [ -x "$TMP/b1/dsc" ]; then
  expect_exit 0 "$TMP/b1/dsc" check "$SRC/examples/gpt-tiny.dsm"
  # a syntax error still reports through the pregenerated parser
  printf 'model m {\n  forward(x) { return x +; }\n}\n' >"$TMP/bad.dsm"
  expect_exit 1 "$TMP/b1/dsc" check "$TMP/bad.dsm"
  expect_grep 'bad.dsm:2' "$TMP/err"
  ldd "$TMP/b1/dsc" >"$TMP/ldd"
  expect_grep "$KIT/cjson/lib/libcjson.so" "$TMP/ldd"
fi
finish
