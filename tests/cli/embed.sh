# The embedding example builds, prints, round-trips and runs a graph.
source "$(dirname "$0")/lib/common.bash"
expect_exit 0 "$EMBED"
expect_grep '^module embed_demo' "$TMP/out"
expect_grep '= gelu\(' "$TMP/out"
expect_grep '^round trip: identical' "$TMP/out"
expect_grep '^loss: [0-9]+\.[0-9]+' "$TMP/out"
finish
