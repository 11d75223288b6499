// Hugging Face tokenizer.json (runtime/tokenizer.c) on small hand-written
// files whose ids follow from the BPE rules by hand: merge priority,
// byte-level alphabet, byte fallback, added tokens, templates, decoders, and
// every refusal with its message. tests/cli/tokenizer_oracle.sh checks the
// same code against the tokenizers library on trained tokenizers.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "runtime_test_util.h"

using rt_test::Ctx;
using rt_test::TempDir;

namespace {

// GPT-2's bytes_to_unicode: the byte-level alphabet's character for byte b.
std::string byte_char(unsigned b) {
  auto self = [](unsigned c) { return (c >= 33 && c <= 126) || (c >= 161 && c <= 172) || c >= 174; };
  unsigned cp = b;
  if (!self(b)) {
    cp = 256;
    for (unsigned c = 0; c < b; c++) cp += !self(c);
  }
  std::string s;
  if (cp < 0x80) {
    s += (char)cp;
  } else {
    s += (char)(0xc0 | cp >> 6);
    s += (char)(0x80 | (cp & 63));
  }
  return s;
}

std::string json_escape(const std::string &s) {
  std::string o;
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      o += '\\';
      o += (char)c;
    } else if (c < 0x20) {
      char b[8];
      snprintf(b, sizeof b, "\\u%04x", c);
      o += b;
    } else {
      o += (char)c;
    }
  }
  return o;
}

struct Spec {
  std::vector<std::string> vocab;   // id = position
  std::vector<std::string> merges;  // "a b"
  std::string added = "[]", normalizer = "null", pre = "null", post = "null", decoder = "null";
  std::string model_extra;          // more model fields, each with a leading comma
};

std::string to_json(const Spec &s) {
  std::string j = "{\"version\":\"1.0\",\"added_tokens\":" + s.added + ",\"normalizer\":" + s.normalizer +
                  ",\"pre_tokenizer\":" + s.pre + ",\"post_processor\":" + s.post +
                  ",\"decoder\":" + s.decoder + ",\"model\":{\"type\":\"BPE\"" + s.model_extra +
                  ",\"vocab\":{";
  for (size_t i = 0; i < s.vocab.size(); i++)
    j += (i ? "," : "") + std::string("\"") + json_escape(s.vocab[i]) + "\":" + std::to_string(i);
  j += "},\"merges\":[";
  for (size_t i = 0; i < s.merges.size(); i++)
    j += (i ? ",\"" : "\"") + json_escape(s.merges[i]) + "\"";
  return j + "]}}";
}

// The 256 byte characters, then `more`.
std::vector<std::string> byte_vocab(std::vector<std::string> more) {
  std::vector<std::string> v;
  for (unsigned b = 0; b < 256; b++) v.push_back(byte_char(b));
  v.insert(v.end(), more.begin(), more.end());
  return v;
}

struct Tok {
  TempDir dir;
  Ctx c;
  dsc_tokenizer *t = nullptr;
  dsc_status st;
  explicit Tok(const std::string &json) {
    rt_test::write_bytes(dir / "tokenizer.json", json);
    st = dsc_tokenizer_load(c.ctx, (dir / "tokenizer.json").c_str(), &t);
  }
  ~Tok() { dsc_tokenizer_free(t); }
  std::vector<uint32_t> encode(const std::string &text, bool special = true) {
    uint32_t *ids = nullptr;
    int64_t n = 0;
    EXPECT_EQ(dsc_tokenizer_encode(t, text.data(), text.size(), special, &ids, &n), DSC_OK) << c.msgs();
    std::vector<uint32_t> v(ids, ids + n);
    free(ids);
    return v;
  }
  std::string decode(const std::vector<uint32_t> &ids, bool skip = true) {
    char *text = nullptr;
    size_t len = 0;
    EXPECT_EQ(dsc_tokenizer_decode(t, ids.data(), (int64_t)ids.size(), skip, &text, &len), DSC_OK)
        << c.msgs();
    std::string s(text ? text : "", len);
    free(text);
    return s;
  }
  std::string path() const { return dir / "tokenizer.json"; }
};

const char kByteLevelPre[] =
    "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":true,\"use_regex\":true}";
const char kByteLevelDec[] = "{\"type\":\"ByteLevel\"}";

TEST(Tokenizer, MergePriorityDecidesTheSplit) {
  // "the": with "h e" ranked before "t h" the result is t + he, not th + e
  Spec s;
  s.vocab = byte_vocab({"he", "th", "Ġt", "Ġthe"});
  s.merges = {"h e", "t h", "Ġ t", "Ġt he"};
  s.pre = kByteLevelPre;
  s.decoder = kByteLevelDec;
  Tok k(to_json(s));
  ASSERT_EQ(k.st, DSC_OK) << k.c.msgs();
  EXPECT_EQ(dsc_tokenizer_vocab_size(k.t), 260);
  EXPECT_EQ(k.encode("the"), (std::vector<uint32_t>{'t', 256}));
  // " the": Ġ t first (rank 2 < none), then Ġt + he (rank 3) -> one token
  EXPECT_EQ(k.encode(" the"), (std::vector<uint32_t>{259}));
  // the GPT-2 split keeps words apart: "the the" = t he, Ġthe
  EXPECT_EQ(k.encode("the the"), (std::vector<uint32_t>{'t', 256, 259}));
  Spec r = s;
  r.merges = {"t h", "h e", "Ġ t", "Ġt he"};  // now th + e
  Tok k2(to_json(r));
  ASSERT_EQ(k2.st, DSC_OK) << k2.c.msgs();
  EXPECT_EQ(k2.encode("the"), (std::vector<uint32_t>{257, 'e'}));
  // every byte has a character: newline is Ċ (id 10), é is two bytes
  EXPECT_EQ(k.encode("\né"), (std::vector<uint32_t>{10, 0xc3, 0xa9}));
  EXPECT_EQ(k.decode(k.encode("the the\né\t!")), "the the\né\t!");
}

TEST(Tokenizer, ByteFallbackAndTheMetaspaceNormalizer) {
  // Llama 2 style: "▁" prepended and for spaces; an unknown character
  // becomes its UTF-8 bytes' <0xXX> tokens
  Spec s;
  s.vocab = {"<unk>", "<s>", "▁", "a", "b", "▁a", "ab", "▁ab"};
  for (unsigned b = 0; b < 256; b++) {
    char name[8];
    snprintf(name, sizeof name, "<0x%02X>", b);
    s.vocab.push_back(name);
  }
  s.merges = {"▁ a", "a b", "▁a b"};
  s.model_extra = ",\"unk_token\":\"<unk>\",\"byte_fallback\":true,\"fuse_unk\":true";
  s.added = "[{\"id\":1,\"content\":\"<s>\",\"special\":true}]";
  s.normalizer =
      "{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Prepend\",\"prepend\":\"▁\"},"
      "{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"▁\"}]}";
  s.post =
      "{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\",\"type_id\":0}},"
      "{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],\"pair\":[],\"special_tokens\":{\"<s>\":"
      "{\"id\":\"<s>\",\"ids\":[1],\"tokens\":[\"<s>\"]}}}";
  s.decoder =
      "{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":{\"String\":\"▁\"},"
      "\"content\":\" \"},{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"},{\"type\":\"Strip\","
      "\"content\":\" \",\"start\":1,\"stop\":0}]}";
  Tok k(to_json(s));
  ASSERT_EQ(k.st, DSC_OK) << k.c.msgs();
  const uint32_t B0 = 8;  // <0x00>
  // "ab é": ▁ab ▁ <0xC3> <0xA9>, with the template's <s> first
  EXPECT_EQ(k.encode("ab é"), (std::vector<uint32_t>{1, 7, 2, B0 + 0xc3, B0 + 0xa9}));
  EXPECT_EQ(k.encode("ab é", false), (std::vector<uint32_t>{7, 2, B0 + 0xc3, B0 + 0xa9}));
  EXPECT_EQ(k.decode(k.encode("ab é")), "ab é");
  EXPECT_EQ(k.decode(k.encode("ab é"), false), "<s> ab é");  // Strip sees "<" first
  // a byte run that is not UTF-8: one U+FFFD per token
  EXPECT_EQ(k.decode({3, B0 + 0xc3, 4}), "a\xef\xbf\xbd" "b");
  // an added token splits the text; each side is normalized on its own
  EXPECT_EQ(k.encode("a<s>b", false), (std::vector<uint32_t>{5, 1, 2, 4}));
}

TEST(Tokenizer, AddedTokensLongestFirstWithStrip) {
  Spec s;
  s.vocab = byte_vocab({});
  s.pre = kByteLevelPre;
  s.decoder = kByteLevelDec;
  s.added =
      "[{\"id\":256,\"content\":\"<|end|>\",\"special\":true},"
      "{\"id\":257,\"content\":\"<|end|>x\",\"special\":false,\"lstrip\":true,\"rstrip\":true}]";
  Tok k(to_json(s));
  ASSERT_EQ(k.st, DSC_OK) << k.c.msgs();
  EXPECT_EQ(k.encode("a<|end|>b"), (std::vector<uint32_t>{'a', 256, 'b'}));
  // the longer token wins, and eats the spaces on both sides
  EXPECT_EQ(k.encode("a  <|end|>x  b"), (std::vector<uint32_t>{'a', 257, 'b'}));
  EXPECT_EQ(k.decode({'a', 256, 'b'}), "ab");  // special skipped
  EXPECT_EQ(k.decode({'a', 256, 'b'}, false), "a<|end|>b");
  EXPECT_EQ(k.encode(""), std::vector<uint32_t>{});
}

TEST(Tokenizer, SplitBehaviors) {
  // Split on "-" as each behavior does: "a-b--c"
  struct Case {
    const char *behavior;
    std::vector<uint32_t> ids;
  } cases[] = {
      {"Removed", {'a', 'b', 'c'}},
      {"Isolated", {'a', '-', 'b', '-', '-', 'c'}},
      {"MergedWithPrevious", {256, 257, '-', 'c'}},  // a- b- - c
      {"MergedWithNext", {'a', 258, '-', 259}},      // a -b - -c
      {"Contiguous", {'a', '-', 'b', 260, 'c'}},     // a - b -- c
  };
  for (const Case &c : cases) {
    Spec s;
    s.vocab = byte_vocab({"a-", "b-", "-b", "-c", "--"});
    s.merges = {"a -", "b -", "- b", "- c", "- -"};
    s.pre = std::string("{\"type\":\"Split\",\"pattern\":{\"String\":\"-\"},\"behavior\":\"") + c.behavior +
            "\",\"invert\":false}";
    Tok k(to_json(s));
    ASSERT_EQ(k.st, DSC_OK) << k.c.msgs();
    EXPECT_EQ(k.encode("a-b--c"), c.ids) << c.behavior;
  }
}

TEST(Tokenizer, UnicodeNormalizers) {
  // byte-level ids show the normalized bytes: NFC composes e + U+0301 into
  // é (C3 A9) and the Hangul jamo U+1100 U+1161 into 가 (EA B0 80); NFD
  // takes é apart; the K forms also fold the ligature ﬁ into "fi"
  struct Case {
    const char *form, *text;
    std::vector<uint32_t> ids;
  } cases[] = {
      {"NFC", "ae\xcc\x81" "b \xe1\x84\x80\xe1\x85\xa1", {'a', 0xc3, 0xa9, 'b', ' ', 0xea, 0xb0, 0x80}},
      {"NFC", "\xef\xac\x81", {0xef, 0xac, 0x81}},
      {"NFD", "a\xc3\xa9", {'a', 'e', 0xcc, 0x81}},
      {"NFKC", "\xef\xac\x81" "e\xcc\x81", {'f', 'i', 0xc3, 0xa9}},
      {"NFKD", "\xef\xac\x81\xc3\xa9", {'f', 'i', 'e', 0xcc, 0x81}},
  };
  for (const Case &c : cases) {
    Spec s;
    s.vocab = byte_vocab({});
    s.pre = "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":false}";
    s.normalizer = std::string("{\"type\":\"") + c.form + "\"}";
    Tok k(to_json(s));
    ASSERT_EQ(k.st, DSC_OK) << k.c.msgs();
    EXPECT_EQ(k.encode(c.text), c.ids) << c.form << " " << c.text;
  }
}

std::string load_error(const std::string &json, dsc_status want = DSC_ERR_USER) {
  Tok k(json);
  EXPECT_EQ(k.st, want);
  EXPECT_EQ(k.t, nullptr);
  std::string m = k.c.msgs();
  std::string prefix = k.path() + ": ";
  EXPECT_EQ(m.compare(0, prefix.size(), prefix), 0) << m;
  return m.substr(std::min(m.size(), prefix.size()));
}

TEST(Tokenizer, RefusesWhatItDoesNotComputeNamingIt) {
  Spec s;
  s.vocab = {"a", "b", "ab"};
  s.merges = {"a b"};
  std::string ok = to_json(s);
  {
    Tok k(ok);
    ASSERT_EQ(k.st, DSC_OK) << k.c.msgs();
  }
  auto with = [&](const std::string &from, const std::string &to) {
    std::string j = ok;
    size_t at = j.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return j.replace(at, from.size(), to);
  };
  EXPECT_EQ(load_error(with("\"type\":\"BPE\"", "\"type\":\"WordPiece\"")),
            "model type 'WordPiece' is not supported (BPE is)\n");
  EXPECT_EQ(load_error(with("\"normalizer\":null", "\"normalizer\":{\"type\":\"Lowercase\"}")),
            "normalizer 'Lowercase' is not supported (dsc reads the steps listed in docs/models.md)\n");
  EXPECT_EQ(load_error(with("\"pre_tokenizer\":null", "\"pre_tokenizer\":{\"type\":\"BertPreTokenizer\"}")),
            "pre_tokenizer 'BertPreTokenizer' is not supported (dsc reads the steps listed in "
            "docs/models.md)\n");
  EXPECT_EQ(load_error(with("\"merges\":[\"a b\"]", "\"merges\":[\"a c\"]")),
            "model.merges[0]: \"a\" + \"c\": the second is not in the vocabulary\n");
  EXPECT_EQ(load_error(with("\"merges\":[\"a b\"]", "\"merges\":[\"ab\"]")),
            "model.merges[0] \"ab\" is not two tokens split by one space\n");
  EXPECT_EQ(load_error(with("\"b\":1", "\"b\":0")), "model.vocab: id 0 is given to both \"a\" and \"b\"\n");
  EXPECT_EQ(load_error(with("\"pre_tokenizer\":null",
                            "\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(\"},"
                            "\"behavior\":\"Isolated\"}"))
                .substr(0, 52),
            "pre_tokenizer Split: the pattern does not compile at");
  EXPECT_EQ(load_error(with("\"model\":", "\"modes\":")), "no \"model\" object: not a tokenizers tokenizer.json\n");
  Tok bad("{\"model\": [1,");  // not JSON: rt_read_json names line and column
  EXPECT_EQ(bad.st, DSC_ERR_USER);
  EXPECT_NE(bad.c.msgs().find("not valid JSON here"), std::string::npos) << bad.c.msgs();
}

TEST(Tokenizer, RefusesTextThatIsNotUtf8AndUnknownIds) {
  Spec s;
  s.vocab = byte_vocab({});
  s.pre = kByteLevelPre;
  Tok k(to_json(s));
  ASSERT_EQ(k.st, DSC_OK) << k.c.msgs();
  uint32_t *ids = nullptr;
  int64_t n = 0;
  std::string bad = "ok \xc3(";
  EXPECT_EQ(dsc_tokenizer_encode(k.t, bad.data(), bad.size(), true, &ids, &n), DSC_ERR_USER);
  EXPECT_EQ(k.c.msgs(), k.path() + ": the text is not UTF-8 at byte 3 (0xc3)\n");
  char *text = nullptr;
  size_t len = 0;
  uint32_t unknown[2] = {5, 999};
  EXPECT_EQ(dsc_tokenizer_decode(k.t, unknown, 2, true, &text, &len), DSC_ERR_USER);
  EXPECT_NE(k.c.msgs().find("token id 999 at position 1 is not in the vocabulary"), std::string::npos);
}

}  // namespace
