# The build of the GPU device machine (issue 6 item 3): no Flex, Bison,
# cJSON, PCRE2 or utf8proc there. scripts/device-kit.sh makes the kit here; a configure with
# Flex and Bison hidden takes the lexer and parser from it, and the dsc it
# builds (every optional backend off, as small as it gets) parses and runs a
# model. Without the kit the configure stops with a message that says how to
# make one.
source "$(dirname "$0")/lib/common.bash"
KIT=$TMP/kit
expect_exit 0 bash "$SRC/scripts/device-kit.sh" "$KIT"
for f in gen/frontend/parser.c gen/frontend/parser.h gen/frontend/lexer.c gen/frontend/lexer.h \
         deps/include/cjson/cJSON.h deps/include/pcre2.h deps/include/utf8proc.h \
         deps/lib/libcjson.so deps/lib/libpcre2-8.so deps/lib/libutf8proc.so; do
  [ -s "$KIT/$f" ] && pass || fail "the kit has no $f"
done
# the kit's libraries are files, not links (links do not travel to the device)
for l in "$KIT"/deps/lib/*; do [ ! -L "$l" ] && pass || fail "$l in the kit is a symlink"; done

NOFLEX=(-DCMAKE_DISABLE_FIND_PACKAGE_FLEX=ON -DCMAKE_DISABLE_FIND_PACKAGE_BISON=ON
        -DDSC_ENABLE_CUDA=OFF -DDSC_ENABLE_LLVM=OFF -DDSC_ENABLE_MPI=OFF -DDSC_BUILD_TESTS=OFF
        -DDSC_BUILD_BENCH=OFF -G Ninja)
expect_exit 1 cmake -S "$SRC" -B "$TMP/b0" "${NOFLEX[@]}"
expect_grep 'scripts/device-kit.sh' "$TMP/err"
expect_exit 0 cmake -S "$SRC" -B "$TMP/b1" "${NOFLEX[@]}" -DDSC_GEN_FRONTEND_DIR="$KIT/gen/frontend" \
  -DCMAKE_PREFIX_PATH="$KIT/deps"
expect_grep 'lexer and parser from' "$TMP/out"
expect_exit 0 ninja -C "$TMP/b1" dsc
if [ -x "$TMP/b1/dsc" ]; then
  expect_exit 0 "$TMP/b1/dsc" check "$SRC/examples/gpt-tiny.dsm"
  # a syntax error still reports through the pregenerated parser
  printf 'model m {\n  forward(x) { return x +; }\n}\n' >"$TMP/bad.dsm"
  expect_exit 1 "$TMP/b1/dsc" check "$TMP/bad.dsm"
  expect_grep 'bad.dsm:2' "$TMP/err"
  ldd "$TMP/b1/dsc" >"$TMP/ldd"
  for l in libcjson.so libpcre2-8.so libutf8proc.so; do expect_grep "$KIT/deps/lib/$l" "$TMP/ldd"; done
fi
finish
