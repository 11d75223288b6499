# dsc train --precision: bf16 and fp16 (mixed precision, f32 master weights)
# train gpt-tiny for a few steps; a bad value is a usage error.
source "$(dirname "$0")/lib/common.bash"
source "$(dirname "$0")/lib/corpus.bash"
MODEL="$SRC/examples/gpt-tiny.dsm"

make_corpus "$TMP/corpus.txt"
expect_exit 0 "$DSC" data "$TMP/corpus.txt" -o "$TMP/c"
expect_exit 1 "$DSC" train "$MODEL" --data "$TMP/c" --precision f8 &&
  expect_grep "not one of f32, bf16, fp16" "$TMP/err"
expect_exit 0 "$DSC" train --help && expect_grep '--precision P' "$TMP/out"
for p in bf16 fp16; do
  expect_exit 0 "$DSC" train "$MODEL" --data "$TMP/c" --precision "$p" --batch 2 --seq 16 \
    --steps 3 --log "$TMP/$p.jsonl" --quiet &&
    [ "$(grep -c '"loss":' "$TMP/$p.jsonl")" -eq 3 ] && pass || fail "$p: expected 3 JSON lines"
done
finish
