# dsc data: byte-level tokenization of a text file into train/val token shards.
source "$(dirname "$0")/lib/common.bash"

# u32 FILE OFFSET: the little-endian 32-bit word at OFFSET
u32() { od -An -tu4 -j "$2" -N4 --endian=little "$1" | tr -d ' '; }

expect_exit 0 "$DSC" data --help && expect_grep '^usage: dsc data TEXTFILE -o PREFIX' "$TMP/out"
expect_exit 1 "$DSC" data && expect_grep 'dsc data: missing text file' "$TMP/err"
expect_exit 1 "$DSC" data "$TMP/x.txt" && expect_grep 'missing -o PREFIX' "$TMP/err"
expect_exit 1 "$DSC" data --bogus && expect_grep "unknown option '--bogus'" "$TMP/err"
expect_exit 1 "$DSC" data "$TMP/absent.txt" -o "$TMP/p" && expect_grep 'absent.txt: error: cannot open' "$TMP/err"
for f in 0 1 1.5 abc -0.2; do
  expect_exit 1 "$DSC" data "$TMP/x.txt" -o "$TMP/p" --val-fraction "$f" && expect_grep 'not a number in \(0, 1\)' "$TMP/err"
done

# 1000 bytes of text (all byte values 1..255 appear), default 10% validation
python3 -c 'import sys; sys.stdout.buffer.write(bytes((i * 7) % 255 + 1 for i in range(1000)))' >"$TMP/text.txt"
expect_exit 0 "$DSC" data "$TMP/text.txt" -o "$TMP/tiny"
expect_grep "tiny_train.bin: 900 tokens \(train\)" "$TMP/out"
expect_grep "tiny_val.bin: 100 tokens \(val\)" "$TMP/out"
expect_grep "vocabulary: 256" "$TMP/out"
for part in train:900 val:100; do
  f="$TMP/tiny_${part%%:*}.bin" n=${part##*:}
  [ "$(stat -c %s "$f")" -eq $((1024 + 2 * n)) ] && pass || fail "$f: size $(stat -c %s "$f")"
  [ "$(u32 "$f" 0)" = 20240520 ] && [ "$(u32 "$f" 4)" = 1 ] && [ "$(u32 "$f" 8)" = "$n" ] && pass || fail "$f: header"
done
# tokens are the bytes: train = first 900 bytes, val = the last 100, as uint16
python3 - "$TMP" <<'PY' && pass || fail "token values differ from the text's bytes"
import sys, struct
d = sys.argv[1]
text = open(d + "/text.txt", "rb").read()
def toks(p):
    b = open(p, "rb").read()[1024:]
    return bytes(v for v in struct.unpack("<%dH" % (len(b) // 2), b))
assert toks(d + "/tiny_train.bin") == text[:900]
assert toks(d + "/tiny_val.bin") == text[900:]
PY

expect_exit 0 "$DSC" data "$TMP/text.txt" -o "$TMP/q" --val-fraction 0.25 && expect_grep "q_val.bin: 250 tokens" "$TMP/out"
printf 'abc' >"$TMP/short.txt"
expect_exit 1 "$DSC" data "$TMP/short.txt" -o "$TMP/s" && expect_grep 'short.txt: error: too short to split' "$TMP/err"
[ ! -e "$TMP/s_train.bin" ] && pass || fail "a failed split left a shard behind"
expect_exit 1 "$DSC" data "$TMP/text.txt" -o "$TMP/no/such/dir/p" && expect_grep 'p_train.bin: error: cannot create a temporary file' "$TMP/err"
# a directory is not a text file
expect_exit 1 "$DSC" data "$TMP" -o "$TMP/dir" && expect_grep 'not a regular file \(a directory\)' "$TMP/err"
finish
