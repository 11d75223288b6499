"""The tokenizers library as the oracle of dsc's tokenizer.json reader.

  tokenizer_oracle.py make DIR
      trains six BPE tokenizers with the library on a training text (the
      GPL and a few non-ASCII lines) in the styles of the published models:
        gpt2      ByteLevel pre-tokenizer and decoder, <|endoftext|>
        llama3    Split(Llama 3's regex) + ByteLevel(use_regex false),
                  ignore_merges, a <|begin_of_text|> template
        llama2    Prepend + Replace normalizer, byte fallback (<0xXX>), <unk>
                  fused, the Replace/ByteFallback/Fuse/Strip decoder, <s> template
        mistral   Metaspace pre-tokenizer (prepend_scheme first) and decoder,
                  byte fallback
        qwen      NFC normalizer, Split(Qwen 2's regex) + ByteLevel, the
                  ByteLevel post-processor, <|im_start|> and <|im_end|>
        wide      gpt2 with its vocabulary grown past 65,536, an added token
                  at the top (32-bit shards) and an NFKD normalizer
      and writes DIR/NAME.json for each and DIR/text.txt, a different text:
      special tokens inline, non-ASCII (decomposed and compatibility
      characters too), CR, tabs, runs of spaces, and random strings over a
      mixed alphabet (seeded).
  tokenizer_oracle.py ids DIR NAME PREFIX
      PREFIX_train.bin + PREFIX_val.bin (either shard format) must equal the
      library's encode(text).ids, id for id; exit 1 naming the first difference.
  tokenizer_oracle.py decode DIR NAME SHARD TEXTFILE
      TEXTFILE (dsc data --decode) must equal the library's
      decode(ids, skip_special_tokens=False), byte for byte.
"""
import json
import random
import sys

import numpy as np
from tokenizers import (Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers,
                        processors, trainers)

LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
               r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
MULTI = "Café déjà vu, naïve façade. 中文测试 日本語 Привет мир 🙂 ünïcödé ß\n" * 3


def training_text():
    with open("/usr/share/common-licenses/GPL-3", encoding="utf-8") as f:
        return [f.read(), MULTI]


def with_bytes(t):
    """The 256 <0xXX> tokens appended to the vocabulary (as Llama 2's has them)."""
    j = json.loads(t.to_str())
    v = j["model"]["vocab"]
    n = max(list(v.values()) + [a["id"] for a in j["added_tokens"]]) + 1
    for b in range(256):
        if "<0x%02X>" % b not in v:
            v["<0x%02X>" % b] = n
            n += 1
    return Tokenizer.from_str(json.dumps(j))


def gpt2():
    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    t.train_from_iterator(training_text(), trainers.BpeTrainer(
        vocab_size=1200, special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return t


def llama3():
    t = Tokenizer(models.BPE(ignore_merges=True))
    t.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    t.decoder = decoders.ByteLevel()
    t.train_from_iterator(training_text(), trainers.BpeTrainer(
        vocab_size=1500, special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    bos = "<|begin_of_text|>"
    t.post_processor = processors.TemplateProcessing(
        single=bos + " $A", special_tokens=[(bos, t.token_to_id(bos))])
    return t


def llama2():
    t = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    t.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    t.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                   decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    t.train_from_iterator(training_text(), trainers.BpeTrainer(
        vocab_size=900, special_tokens=["<unk>", "<s>", "</s>"], limit_alphabet=80))
    t = with_bytes(t)
    t.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", t.token_to_id("<s>"))])
    return t


def mistral():
    t = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=True)
    t.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
    t.train_from_iterator(training_text(), trainers.BpeTrainer(
        vocab_size=900, special_tokens=["<unk>", "<s>", "</s>"], limit_alphabet=70))
    return with_bytes(t)


def qwen():
    t = Tokenizer(models.BPE())
    t.normalizer = normalizers.NFC()
    t.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    t.post_processor = processors.ByteLevel(trim_offsets=False)
    t.decoder = decoders.ByteLevel()
    t.train_from_iterator(training_text(), trainers.BpeTrainer(
        vocab_size=1300, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return t


def wide():
    j = json.loads(gpt2().to_str())
    v = j["model"]["vocab"]
    for k in range(len(v), 70000):
        v["<filler_%d>" % k] = k
    j["normalizer"] = {"type": "NFKD"}
    t = Tokenizer.from_str(json.dumps(j))
    t.add_special_tokens(["<|wide|>"])
    assert t.token_to_id("<|wide|>") >= 65536
    return t


def test_text():
    rng = random.Random(1234)
    alphabet = list("abcdeXYZ   \n\t\r0123456789'.,;!?-_()") + [
        "é", "ü", "中", "文", "🙂", "Ж", "ß", "\u00a0", "\u2003", "١", "²", "<|endoftext|>",
        "<s>", "</s>", "<|begin_of_text|>", "<|wide|>", "'s", "'LL", "  ", "\n\n",
        "<|im_start|>", "<|im_end|>", "\u0301", "\u0308", "e\u0301", "\u212b", "\ufb01", "\u2460",
        "\u1100\u1161", "\u1100", "\u1161", "\uff21", "\u00bd", "\u03d3"]
    fixed = ("Hello world! Don't you think it's   great?  Numbers: 1234567 and 3.14159.\r\n"
             "<|endoftext|>Café déjà vu — naïve façade; 中文测试 Привет, мир! 🙂🚀\n"
             "\tTabs\tand   spaces   \n \n<s> A new document</s><|begin_of_text|>here. WE'LL SEE\n"
             "<|im_start|>user\nCafe\u0301 \u212bngstr\u00f6m \ufb01sh \u1100\u1161 \uff21\u00bd<|im_end|>\n")
    rand = "\n".join("".join(rng.choice(alphabet) for _ in range(rng.randint(0, 50)))
                     for _ in range(150))
    return fixed + rand + " end"


def read_shard(path):
    with open(path, "rb") as f:
        b = f.read()
    h = np.frombuffer(b[:1024], dtype=np.int32)
    assert (h[0], h[1]) in ((20240520, 1), (20240801, 7)), (path, h[:3])
    dt = np.uint16 if h[0] == 20240520 else np.uint32
    ids = np.frombuffer(b[1024:], dtype=dt)
    assert len(ids) == h[2], (path, len(ids), h[2])
    return [int(x) for x in ids], int(h[0])


def main():
    cmd, d = sys.argv[1], sys.argv[2]
    if cmd == "make":
        for name, f in (("gpt2", gpt2), ("llama3", llama3), ("llama2", llama2),
                        ("mistral", mistral), ("qwen", qwen), ("wide", wide)):
            f().save(f"{d}/{name}.json")
        with open(f"{d}/text.txt", "w", encoding="utf-8", newline="") as f:
            f.write(test_text())
        return 0
    name = sys.argv[3]
    t = Tokenizer.from_file(f"{d}/{name}.json")
    with open(f"{d}/text.txt", encoding="utf-8", newline="") as f:
        text = f.read()
    if cmd == "ids":
        want = t.encode(text).ids
        train, magic = read_shard(sys.argv[4] + "_train.bin")
        val, magic_val = read_shard(sys.argv[4] + "_val.bin")
        got = train + val
        wide_ids = max(want) >= 65536
        if magic != magic_val or (magic == 20240801) != wide_ids:
            print(f"{name}: shard format {magic}/{magic_val} for ids up to {max(want)}")
            return 1
        if got != want:
            i = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
            print(f"{name}: {len(got)} ids, the library {len(want)}; first difference at {i}: "
                  f"dsc {[t.id_to_token(x) for x in got[i:i + 4]]}, "
                  f"library {[t.id_to_token(x) for x in want[i:i + 4]]}")
            return 1
        print(f"{name}: {len(got)} ids equal")
        return 0
    if cmd == "decode":
        ids, _ = read_shard(sys.argv[4])
        want = t.decode(ids, skip_special_tokens=False).encode("utf-8")
        with open(sys.argv[5], "rb") as f:
            got = f.read()
        if got != want:
            i = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
            print(f"{name}: decoded {len(got)} bytes, the library {len(want)}; first difference at "
                  f"byte {i}: dsc {got[i:i + 20]!r}, library {want[i:i + 20]!r}")
            return 1
        print(f"{name}: {len(got)} decoded bytes equal")
        return 0
    raise SystemExit(f"unknown command {cmd}")


if __name__ == "__main__":
    sys.exit(main())
