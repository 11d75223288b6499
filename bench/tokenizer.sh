#!/usr/bin/env bash
# Encoding throughput: dsc data --tokenizer against the tokenizers library,
# on the same text and the same tokenizer.json, in one run.
#
#   bench/tokenizer.sh [--dsc BIN] [--mb N] [--vocab V] [--venv DIR]
#
# The text: the machine's license texts and package copyright files,
# cut or repeated to N MB (default 8). Four tokenizers are trained by the
# library on its first 1 MB (vocabulary V, default 8000) in the styles of
# GPT-2 (byte-level), Llama 3 (split regex + byte-level, ignore_merges),
# Qwen 2 (NFC, its split regex + byte-level) and Llama 2 (byte fallback, no
# pre-tokenizer: the whole text is one piece). Each is timed in
# dsc (the encode alone, as dsc data prints it; the best of 3) and in the
# library: encode(text) on the whole text (one thread, what dsc does) and
# encode_batch over its lines (the library's threads), best of 3. The ids of
# dsc and encode(text) are compared. Prints a table with the CPU and the load
# average; the venv (default build-test/pyenv, made by
# scripts/install-deps.sh --venv) must have tokenizers and numpy.
set -uo pipefail
SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DSC=$SRC/build/dsc
MB=8
VOCAB=8000
VENV=$SRC/build-test/pyenv
while [ $# -gt 0 ]; do
  case $1 in
  --dsc) DSC=$2; shift ;;
  --mb) MB=$2; shift ;;
  --vocab) VOCAB=$2; shift ;;
  --venv) VENV=$2; shift ;;
  *) echo "bench/tokenizer.sh: unknown argument '$1'" >&2; exit 1 ;;
  esac
  shift
done
[ -x "$DSC" ] || { echo "bench/tokenizer.sh: no dsc at $DSC (--dsc BIN)" >&2; exit 1; }
PY=$VENV/bin/python3
"$PY" -c 'import tokenizers, numpy' || { echo "bench/tokenizer.sh: $PY lacks tokenizers/numpy" >&2; exit 1; }
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
echo "cpu: $(lscpu | sed -n 's/^Model name: *//p') ($(nproc) cores); load before: $(cut -d' ' -f1-3 /proc/loadavg)"
"$PY" - "$W" "$MB" "$VOCAB" <<'EOF'
import glob, sys
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
w, mb, vocab = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
parts = []
for p in sorted(glob.glob("/usr/share/common-licenses/*") + glob.glob("/usr/share/doc/*/copyright")):
    try:
        parts.append(open(p, encoding="utf-8").read())
    except (UnicodeDecodeError, IsADirectoryError, OSError):
        pass
base = "\n".join(parts)
text = (base * int(mb * 1e6 / len(base) + 1))[: int(mb * 1e6)]
text = text.encode("utf-8")[: int(mb * 1e6)].decode("utf-8", "ignore")
train = [base[:1_000_000]]
open(f"{w}/text.txt", "w", encoding="utf-8", newline="").write(text)
L3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
      r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
Q2 = L3.replace(r"\p{N}{1,3}", r"\p{N}")
alpha = pre_tokenizers.ByteLevel.alphabet()
g = Tokenizer(models.BPE())
g.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
g.decoder = decoders.ByteLevel()
g.train_from_iterator(train, trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>"], initial_alphabet=alpha, show_progress=False))
g.save(f"{w}/gpt2.json")
l3 = Tokenizer(models.BPE(ignore_merges=True))
l3.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(L3), behavior="isolated"), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
l3.decoder = decoders.ByteLevel()
l3.train_from_iterator(train, trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|begin_of_text|>"], initial_alphabet=alpha, show_progress=False))
l3.save(f"{w}/llama3.json")
q = Tokenizer(models.BPE())
q.normalizer = normalizers.NFC()
q.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(Q2), behavior="isolated"), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
q.post_processor = processors.ByteLevel(trim_offsets=False)
q.decoder = decoders.ByteLevel()
q.train_from_iterator(train, trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"], initial_alphabet=alpha, show_progress=False))
q.save(f"{w}/qwen.json")
l2 = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
l2.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
# trained on words (a BPE trainer on one 1 MB piece rescans it per merge),
# then saved without a pre-tokenizer, as Llama 2's file is
l2.pre_tokenizer = pre_tokenizers.Split("▁", behavior="merged_with_next")
l2.train_from_iterator(train, trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<unk>", "<s>", "</s>"], limit_alphabet=200, show_progress=False))
l2.pre_tokenizer = None
l2.save(f"{w}/llama2.json")
EOF
printf '%-8s %8s %10s %10s %16s %16s %8s\n' tokenizer MB tokens "dsc MB/s" "library MB/s" "lib batch MB/s" "dsc/lib"
rc=0
for name in gpt2 llama3 qwen llama2; do
  best=0
  for _ in 1 2 3; do
    r=$("$DSC" data "$W/text.txt" --tokenizer "$W/$name.json" -o "$W/$name") || { echo "dsc data failed on $name"; rc=1; continue 2; }
    m=$(echo "$r" | sed -n 's/.*: \([0-9.]*\) MB\/s$/\1/p')
    best=$(echo "$m $best" | awk '{print ($1 > $2) ? $1 : $2}')
  done
  "$PY" - "$W" "$name" "$best" <<'EOF' || rc=1
import sys, time
import numpy as np
from tokenizers import Tokenizer
w, name, dsc_mbs = sys.argv[1], sys.argv[2], float(sys.argv[3])
t = Tokenizer.from_file(f"{w}/{name}.json")
text = open(f"{w}/text.txt", encoding="utf-8", newline="").read()
mb = len(text.encode("utf-8")) / 1e6
one = batch = 1e9
for _ in range(3):
    t0 = time.perf_counter(); ids = t.encode(text).ids; one = min(one, time.perf_counter() - t0)
lines = text.splitlines(keepends=True)
for _ in range(3):
    t0 = time.perf_counter(); t.encode_batch(lines); batch = min(batch, time.perf_counter() - t0)
got = []
for part in ("train", "val"):
    b = open(f"{w}/{name}_{part}.bin", "rb").read()
    h = np.frombuffer(b[:1024], dtype=np.int32)
    got += np.frombuffer(b[1024:], dtype=np.uint16 if h[0] == 20240520 else np.uint32).tolist()
same = "ids equal" if got == ids else "IDS DIFFER"
print(f"{name:<8} {mb:8.1f} {len(ids):10d} {dsc_mbs:10.1f} {mb / one:16.2f} {mb / batch:16.2f} {dsc_mbs / (mb / one):7.1f}x  {same}")
sys.exit(0 if got == ids else 1)
EOF
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
exit $rc
