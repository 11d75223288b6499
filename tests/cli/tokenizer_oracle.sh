# dsc data --tokenizer against the tokenizers library (tests/cli/lib/
# tokenizer_oracle.py): six tokenizers trained by the library in the styles
# of GPT-2, Llama 3, Llama 2, Mistral, Qwen 2 (NFC) and a vocabulary over
# 65,536 (NFKD); on a different text, dsc's ids equal the library's id for
# id (special tokens, non-ASCII, CR and random strings included), the shards
# are 32-bit exactly when an id needs it, and dsc data --decode equals the
# library's decode byte for byte. Then a run trained on tokenized data keeps
# the tokenizer and samples text with it, and bad input ends with exit 1 and
# a message.
source "$(dirname "$0")/lib/common.bash"
export DSC_CACHE_DIR="$TMP/kernel-cache"
ORACLE="$SRC/tests/cli/lib/tokenizer_oracle.py"

if ! python3 -c 'import tokenizers, numpy' 2>/dev/null; then
  if [ -n "${CI:-}" ]; then echo "FAIL: CI without the tokenizers package (scripts/install-deps.sh --venv)"; exit 1; fi
  echo "SKIP: python3 cannot import tokenizers (scripts/install-deps.sh --venv DIR installs it)"
  exit 0
fi
expect_exit 0 python3 "$ORACLE" make "$TMP"

for name in gpt2 llama3 llama2 mistral qwen wide; do
  expect_exit 0 "$DSC" data "$TMP/text.txt" --tokenizer "$TMP/$name.json" -o "$TMP/$name" --val-fraction 0.3 &&
    expect_grep "MB/s" "$TMP/out"
  python3 "$ORACLE" ids "$TMP" "$name" "$TMP/$name" >"$TMP/cmp" && pass || { fail "$name: ids"; cat "$TMP/cmp"; }
  for part in train val; do
    expect_exit 0 "$DSC" data --decode "$TMP/${name}_$part.bin" --tokenizer "$TMP/$name.json" &&
      cp "$TMP/out" "$TMP/decoded"
    python3 "$ORACLE" decode "$TMP" "$name" "$TMP/${name}_$part.bin" "$TMP/decoded" >"$TMP/cmp" && pass ||
      { fail "$name: decode of $part"; cat "$TMP/cmp"; }
  done
done
cmp -s "$TMP/gpt2.json" "$TMP/gpt2_tokenizer.json" && pass || fail "dsc data did not keep the tokenizer beside the shards"
expect_grep "32-bit tokens" <("$DSC" data "$TMP/text.txt" --tokenizer "$TMP/wide.json" -o "$TMP/w2")

# a run on tokenized data keeps the tokenizer; dsc sample encodes the
# prompt and decodes the text with it
expect_exit 0 "$DSC" data /usr/share/common-licenses/GPL-3 --tokenizer "$TMP/llama3.json" -o "$TMP/gpl"
sed 's/^const vocab = 256,/const vocab = 1500,/' "$SRC/examples/llama-tiny.dsm" >"$TMP/llama-1500.dsm"
expect_exit 0 "$DSC" train "$TMP/llama-1500.dsm" --data "$TMP/gpl" --out "$TMP/run" --steps 30 \
  --batch 4 --seq 64 --eval-every 0 --quiet
cmp -s "$TMP/llama3.json" "$TMP/run/tokenizer.json" && pass || fail "the run has no copy of its tokenizer"
# a fresh run replaces a tokenizer that an earlier run without checkpoints left
mkdir -p "$TMP/run2" && cp "$TMP/gpt2.json" "$TMP/run2/tokenizer.json"
expect_exit 0 "$DSC" train "$TMP/llama-1500.dsm" --data "$TMP/gpl" --out "$TMP/run2" --steps 1 \
  --batch 4 --seq 64 --eval-every 0 --quiet
cmp -s "$TMP/llama3.json" "$TMP/run2/tokenizer.json" && pass || fail "a fresh run kept a stale tokenizer"
expect_exit 0 "$DSC" sample "$TMP/run" --tokens 30 --prompt "The GNU General Public License" --seed 3 &&
  expect_grep "^The GNU General Public License" "$TMP/out"
python3 -c 'import sys; open(sys.argv[1], encoding="utf-8").read()' "$TMP/out" && pass || fail "sample: not UTF-8"
# the same tokens through the byte model's path would print ids (<123>): none
grep -q '<[0-9]\+>' "$TMP/out" && fail "sample printed ids, not text" || pass
# the byte-level model refuses the tokenizer's ids
expect_exit 1 "$DSC" train "$SRC/examples/llama-tiny.dsm" --data "$TMP/gpl" --out "$TMP/run256" --steps 1 --quiet &&
  expect_grep "outside the vocabulary \(size 256\)" "$TMP/err"

# bad input: text that is not UTF-8, a truncated or unsupported tokenizer
printf 'fine text \xff\xfe then more\n' >"$TMP/latin.txt"
expect_exit 1 "$DSC" data "$TMP/latin.txt" --tokenizer "$TMP/gpt2.json" -o "$TMP/bad" &&
  expect_grep "not UTF-8 at byte 10 \(0xff\)" "$TMP/err" && expect_grep "cannot encode this file" "$TMP/err"
head -c 2000 "$TMP/gpt2.json" >"$TMP/cut.json"
expect_exit 1 "$DSC" data "$TMP/text.txt" --tokenizer "$TMP/cut.json" -o "$TMP/bad" &&
  expect_grep "cut.json:[0-9]+:[0-9]+: .*not valid JSON" "$TMP/err"
python3 - "$TMP/gpt2.json" "$TMP/lower.json" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))
j["normalizer"] = {"type": "Lowercase"}
json.dump(j, open(sys.argv[2], "w"))
EOF
expect_exit 1 "$DSC" data "$TMP/text.txt" --tokenizer "$TMP/lower.json" -o "$TMP/bad" &&
  expect_grep "normalizer 'Lowercase' is not supported" "$TMP/err"
[ ! -e "$TMP/bad_train.bin" ] && pass || fail "a failed dsc data wrote a shard"
finish
