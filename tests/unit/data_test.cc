// Token shards (llm.c format) and the batch loader: round trip, every
// rejection with its message, reproducibility and resume.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <set>

#include "runtime_test_util.h"
#include "tests/unit/test_util.h"

using rt_test::Ctx;
using rt_test::TempDir;

namespace {

std::vector<uint16_t> random_tokens(size_t n, uint32_t seed, uint16_t vocab = 65535) {
  std::mt19937 g(seed);
  std::uniform_int_distribution<int> d(1, vocab - 1);  // never all zero
  std::vector<uint16_t> t(n);
  for (auto &x : t) x = (uint16_t)d(g);
  return t;
}

std::string le32(int32_t v) {
  std::string s(4, '\0');
  for (int i = 0; i < 4; i++) s[i] = (char)((uint32_t)v >> (8 * i));
  return s;
}

// A shard built by hand: header words, then `payload` bytes.
std::string raw_shard(int32_t magic, int32_t version, int32_t count, const std::string &payload) {
  std::string h = le32(magic) + le32(version) + le32(count);
  h.resize(1024, '\0');
  return h + payload;
}

TEST(Shard, RoundTripAndExactBytes) {
  TempDir dir;
  Ctx c;
  auto toks = random_tokens(1001, 7);
  toks[3] = 65535;  // the largest id survives
  std::string p = dir / "a.bin";
  ASSERT_EQ(dsc_shard_write(c.ctx, p.c_str(), toks.data(), (int64_t)toks.size()), DSC_OK)
      << c.msgs();
  std::string bytes = rt_test::read_bytes(p);
  ASSERT_EQ(bytes.size(), 1024 + 2 * toks.size());
  EXPECT_EQ(bytes.substr(0, 12), le32(20240520) + le32(1) + le32(1001));
  EXPECT_EQ(bytes.substr(12, 1012), std::string(1012, '\0'));
  for (size_t i = 0; i < toks.size(); i++) {
    ASSERT_EQ((uint8_t)bytes[1024 + 2 * i], toks[i] & 0xff) << i;
    ASSERT_EQ((uint8_t)bytes[1025 + 2 * i], toks[i] >> 8) << i;
  }
  uint32_t *got = nullptr;
  int64_t n = 0;
  ASSERT_EQ(dsc_shard_read(c.ctx, p.c_str(), 65536, &got, &n), DSC_OK) << c.msgs();
  ASSERT_EQ(n, 1001);
  EXPECT_TRUE(std::equal(toks.begin(), toks.end(), got));
  dsc_shard_free(c.ctx, got, n);
  // No temporary file is left next to the shard.
  EXPECT_EQ(rt_test::list_dir(dir.path), std::vector<std::string>{"a.bin"});
}

// Reads path expecting failure; returns the messages.
std::string read_error(const std::string &path, int64_t vocab = 0) {
  Ctx c;
  uint32_t *got = nullptr;
  int64_t n = -1;
  EXPECT_EQ(dsc_shard_read(c.ctx, path.c_str(), vocab, &got, &n), DSC_ERR_USER);
  EXPECT_EQ(got, nullptr);
  EXPECT_EQ(n, 0);
  return c.msgs();
}

TEST(Shard, RejectsFileTooShortForHeader) {
  TempDir dir;
  std::string p = dir / "short.bin";
  rt_test::write_bytes(p, std::string(100, 'x'));
  EXPECT_EQ(read_error(p),
            p + ": file too short for the header: 100 bytes, the header alone is 1024\n");
}

TEST(Shard, RejectsBadMagicNamingFoundAndExpected) {
  TempDir dir;
  std::string p = dir / "magic.bin";
  rt_test::write_bytes(p, raw_shard(20240521, 1, 2, std::string(4, '\1')));
  EXPECT_EQ(read_error(p),
            p + ": bad magic number 20240521 (expected 20240520 or 20240801): not a token shard\n");
}

TEST(Shard, RejectsUnsupportedVersion) {
  TempDir dir;
  std::string p = dir / "v2.bin";
  rt_test::write_bytes(p, raw_shard(20240520, 2, 2, std::string(4, '\1')));
  EXPECT_EQ(read_error(p),
            p + ": unsupported shard version 2 (this dsc reads version 1 under magic 20240520)\n");
  // llm.c's 32-bit (Llama 3) format is version 7
  rt_test::write_bytes(p, raw_shard(20240801, 1, 1, std::string(4, '\1')));
  EXPECT_EQ(read_error(p),
            p + ": unsupported shard version 1 (this dsc reads version 7 under magic 20240801)\n");
}

// llm.c's Llama 3 shards: magic 20240801, version 7, uint32 ids; the loader
// reads them as it reads the 16-bit ones.
TEST(Shard, ThirtyTwoBitRoundTripAndLoader) {
  TempDir dir;
  Ctx c;
  std::vector<uint32_t> toks(201);
  for (size_t i = 0; i < toks.size(); i++) toks[i] = (uint32_t)(i * 2654435761u % 128256u);
  toks[5] = 128255;  // Llama 3's largest id
  std::string p = dir / "w.bin";
  ASSERT_EQ(dsc_shard_write32(c.ctx, p.c_str(), toks.data(), (int64_t)toks.size()), DSC_OK)
      << c.msgs();
  std::string bytes = rt_test::read_bytes(p);
  ASSERT_EQ(bytes.size(), 1024 + 4 * toks.size());
  EXPECT_EQ(bytes.substr(0, 12), le32(20240801) + le32(7) + le32(201));
  for (size_t i = 0; i < toks.size(); i++) ASSERT_EQ(bytes.substr(1024 + 4 * i, 4), le32((int32_t)toks[i])) << i;
  uint32_t *got = nullptr;
  int64_t n = 0;
  ASSERT_EQ(dsc_shard_read(c.ctx, p.c_str(), 128256, &got, &n), DSC_OK) << c.msgs();
  ASSERT_EQ(n, 201);
  EXPECT_TRUE(std::equal(toks.begin(), toks.end(), got));
  dsc_shard_free(c.ctx, got, n);
  EXPECT_EQ(read_error(p, 128255),
            p + ": token id 128255 at position 5 is outside the vocabulary (size 128255)\n");
  rt_test::write_bytes(p, raw_shard(20240801, 7, 5, std::string(18, '\1')));
  EXPECT_EQ(read_error(p), p + ": truncated: the header says 5 tokens (20 bytes) but the file holds "
                               "18 bytes after the header\n");
  // the loader: inputs and targets are the ids, whatever their width
  ASSERT_EQ(dsc_shard_write32(c.ctx, p.c_str(), toks.data(), (int64_t)toks.size()), DSC_OK);
  dsc_loader_options o = {2, 10, 128256, 0, DSC_LOADER_SEQUENTIAL};
  dsc_loader *l = nullptr;
  ASSERT_EQ(dsc_loader_open(c.ctx, p.c_str(), &o, &l), DSC_OK) << c.msgs();
  std::vector<int32_t> in(20), tg(20);
  ASSERT_EQ(dsc_loader_next(l, in.data(), tg.data()), DSC_OK);
  for (int i = 0; i < 20; i++) {
    EXPECT_EQ(in[i], (int32_t)toks[i]) << i;
    EXPECT_EQ(tg[i], (int32_t)toks[i + 1]) << i;
  }
  dsc_loader_free(l);
}

TEST(Shard, RejectsTruncatedAndTrailingBytes) {
  TempDir dir;
  std::string p = dir / "t.bin";
  rt_test::write_bytes(p, raw_shard(20240520, 1, 5, std::string(9, '\1')));
  EXPECT_EQ(read_error(p),
            p + ": truncated: the header says 5 tokens (10 bytes) but the file holds "
                "9 bytes after the header\n");
  rt_test::write_bytes(p, raw_shard(20240520, 1, 5, std::string(13, '\1')));
  EXPECT_EQ(read_error(p), p + ": 3 trailing bytes: the header says 5 tokens (10 bytes) but the "
                               "file holds 13 bytes after the header\n");
  rt_test::write_bytes(p, raw_shard(20240520, 1, -1, ""));
  EXPECT_EQ(read_error(p), p + ": negative token count -1 in the header\n");
}

TEST(Shard, RejectsIdsOutsideVocabularyNamingFirstPosition) {
  TempDir dir;
  Ctx c;
  std::string p = dir / "v.bin";
  auto toks = random_tokens(50, 3, 256);
  toks[17] = 300;
  toks[30] = 999;  // only the first bad one is named
  ASSERT_EQ(dsc_shard_write(c.ctx, p.c_str(), toks.data(), 50), DSC_OK);
  EXPECT_EQ(read_error(p, 256),
            p + ": token id 300 at position 17 is outside the vocabulary (size 256)\n");
  // Without a vocabulary limit the same shard reads.
  uint32_t *got = nullptr;
  int64_t n = 0;
  EXPECT_EQ(dsc_shard_read(c.ctx, p.c_str(), 0, &got, &n), DSC_OK);
  dsc_shard_free(c.ctx, got, n);
}

TEST(Shard, MissingFileAndUnwritableDestination) {
  TempDir dir;
  EXPECT_NE(read_error(dir / "absent.bin").find("absent.bin: cannot open: No such file"),
            std::string::npos);
  Ctx c;
  uint16_t t[2] = {1, 2};
  std::string p = dir / "no_dir/x.bin";
  EXPECT_EQ(dsc_shard_write(c.ctx, p.c_str(), t, 2), DSC_ERR_USER);
  EXPECT_NE(c.msgs().find(p + ": cannot create a temporary file next to it"), std::string::npos)
      << c.msgs();
}

// ---------------------------------------------------------------- loader

struct Loader {
  Ctx c;
  dsc_loader *l = nullptr;
  Loader(const std::string &path, int64_t B, int64_t T, uint64_t seed,
         dsc_loader_mode mode = DSC_LOADER_SHUFFLE, int64_t vocab = 0) {
    dsc_loader_options o = {B, T, vocab, seed, mode};
    EXPECT_EQ(dsc_loader_open(c.ctx, path.c_str(), &o, &l), DSC_OK) << c.msgs();
  }
  ~Loader() { dsc_loader_free(l); }
  std::vector<int32_t> next(std::vector<int32_t> *targets = nullptr) {
    int64_t n = l->B * l->T;
    std::vector<int32_t> in(n), tg(n);
    EXPECT_EQ(dsc_loader_next(l, in.data(), tg.data()), DSC_OK);
    if (targets) *targets = tg;
    return in;
  }
};

std::string make_shard(const TempDir &dir, const std::vector<uint16_t> &toks, const char *name) {
  Ctx c;
  std::string p = dir / name;
  EXPECT_EQ(dsc_shard_write(c.ctx, p.c_str(), toks.data(), (int64_t)toks.size()), DSC_OK);
  return p;
}

TEST(Loader, WindowsAreNonOverlappingAndTargetsShiftByOne) {
  TempDir dir;
  // Token i has value i + 1: a window is recognisable by its first token.
  std::vector<uint16_t> toks(8 * 10 + 5);
  for (size_t i = 0; i < toks.size(); i++) toks[i] = (uint16_t)(i + 1);
  std::string p = make_shard(dir, toks, "s.bin");
  Loader L(p, 2, 8, 42);
  ASSERT_EQ(dsc_loader_windows(L.l), 10);  // (85 - 1) / 8
  std::multiset<int> starts;
  for (int b = 0; b < 5; b++) {  // one epoch: 5 batches of 2 windows
    std::vector<int32_t> tg;
    auto in = L.next(&tg);
    for (int r = 0; r < 2; r++) {
      int s = in[r * 8] - 1;
      EXPECT_EQ(s % 8, 0);
      starts.insert(s);
      for (int t = 0; t < 8; t++) {
        EXPECT_EQ(in[r * 8 + t], s + t + 1);
        EXPECT_EQ(tg[r * 8 + t], s + t + 2);
      }
    }
  }
  // Each window exactly once per epoch.
  std::multiset<int> want;
  for (int w = 0; w < 10; w++) want.insert(w * 8);
  EXPECT_EQ(starts, want);
  EXPECT_EQ(dsc_loader_tell(L.l).epoch, 1);
  EXPECT_EQ(dsc_loader_tell(L.l).index, 0);
}

TEST(Loader, SameSeedSameBatchesDifferentSeedDiffers) {
  TempDir dir;
  std::string p = make_shard(dir, random_tokens(4000, 11), "s.bin");
  Loader a(p, 4, 16, 1234), b(p, 4, 16, 1234), c(p, 4, 16, 1235);
  bool differs = false;
  for (int i = 0; i < 200; i++) {  // several epochs (62 windows each)
    auto x = a.next(), y = b.next(), z = c.next();
    ASSERT_EQ(x, y) << "batch " << i;
    differs |= x != z;
  }
  EXPECT_TRUE(differs);
}

TEST(Loader, EpochsArePermutedDifferently) {
  TempDir dir;
  std::vector<int64_t> e0(50), e1(50);
  rt_loader_permutation(9, 0, e0.data(), 50);
  rt_loader_permutation(9, 1, e1.data(), 50);
  EXPECT_NE(e0, e1);
  auto s0 = e0;
  std::sort(s0.begin(), s0.end());
  for (int i = 0; i < 50; i++) EXPECT_EQ(s0[i], i);
}

TEST(Loader, ResumeFromSavedPositionContinuesIdentically) {
  TempDir dir;
  std::string p = make_shard(dir, random_tokens(3000, 5), "s.bin");
  Loader a(p, 3, 10, 77);  // 299 windows: batches cross epoch boundaries
  for (int i = 0; i < 150; i++) a.next();
  dsc_loader_pos pos = dsc_loader_tell(a.l);
  EXPECT_EQ(pos.epoch, 1);  // 450 windows drawn
  EXPECT_EQ(pos.index, 450 - 299);
  std::vector<std::vector<int32_t>> want;
  for (int i = 0; i < 120; i++) want.push_back(a.next());
  Loader b(p, 3, 10, 77);
  ASSERT_EQ(dsc_loader_seek(b.l, pos), DSC_OK);
  for (int i = 0; i < 120; i++) ASSERT_EQ(b.next(), want[i]) << "batch " << i;
}

TEST(Loader, SequentialModeReadsFirstWindowsInOrder) {
  TempDir dir;
  auto toks = random_tokens(100, 8);
  std::string p = make_shard(dir, toks, "v.bin");
  Loader L(p, 2, 7, 0, DSC_LOADER_SEQUENTIAL);
  ASSERT_EQ(dsc_loader_windows(L.l), 14);
  for (int round = 0; round < 2; round++) {  // seek back to {0, 0}: same batches again
    ASSERT_EQ(dsc_loader_seek(L.l, dsc_loader_pos{0, 0}), DSC_OK);
    for (int b = 0; b < 3; b++) {
      std::vector<int32_t> tg;
      auto in = L.next(&tg);
      for (int r = 0; r < 2; r++)
        for (int t = 0; t < 7; t++) {
          size_t s = (size_t)(b * 2 + r) * 7;
          ASSERT_EQ(in[r * 7 + t], toks[s + t]);
          ASSERT_EQ(tg[r * 7 + t], toks[s + t + 1]);
        }
    }
  }
}

TEST(Loader, FillsI32Tensors) {
  TempDir dir;
  std::string p = make_shard(dir, random_tokens(500, 9), "s.bin");
  Loader a(p, 2, 5, 3), b(p, 2, 5, 3);
  dsc_type ty = dsc_type_make(DSC_I32, 2, std::vector<int64_t>{2, 5}.data());
  dsc_tensor *in = dsc_tensor_new(a.c.ctx, ty), *tg = dsc_tensor_new(a.c.ctx, ty);
  for (int k = 0; k < 4; k++) {
    ASSERT_EQ(dsc_loader_next_tensors(a.l, in, tg), DSC_OK);
    std::vector<int32_t> t2;
    auto i2 = b.next(&t2);
    for (int i = 0; i < 10; i++) {
      EXPECT_EQ(in->data[i], i2[i]);
      EXPECT_EQ(tg->data[i], t2[i]);
    }
  }
  dsc_tensor *bad = dsc_tensor_new(a.c.ctx, dsc_type_make(DSC_I64, 2, ty.dims));
  EXPECT_EQ(dsc_loader_next_tensors(a.l, bad, tg), DSC_ERR_USER);
  EXPECT_NE(a.c.msgs().find("loader: inputs tensor is i64[2,5], expected i32[2,5]"),
            std::string::npos)
      << a.c.msgs();
  dsc_tensor_free(a.c.ctx, in);
  dsc_tensor_free(a.c.ctx, tg);
  dsc_tensor_free(a.c.ctx, bad);
}

TEST(Loader, RejectsShortShardBadPositionAndBadIds) {
  TempDir dir;
  std::string p = make_shard(dir, random_tokens(16, 1, 200), "tiny.bin");
  Ctx c;
  dsc_loader *l = nullptr;
  dsc_loader_options o = {1, 16, 0, 1, DSC_LOADER_SHUFFLE};
  EXPECT_EQ(dsc_loader_open(c.ctx, p.c_str(), &o, &l), DSC_ERR_USER);
  EXPECT_EQ(l, nullptr);
  EXPECT_EQ(c.msgs(), p + ": the shard holds 16 tokens, fewer than seq + 1 = 17 (one window of "
                          "inputs and targets)\n");
  dsc_diag_clear(c.ctx);
  o.seq = 15;  // exactly T + 1 tokens: one window
  ASSERT_EQ(dsc_loader_open(c.ctx, p.c_str(), &o, &l), DSC_OK);
  EXPECT_EQ(dsc_loader_windows(l), 1);
  EXPECT_EQ(dsc_loader_seek(l, dsc_loader_pos{0, 1}), DSC_ERR_USER);
  EXPECT_EQ(dsc_loader_seek(l, dsc_loader_pos{-1, 0}), DSC_ERR_USER);
  EXPECT_NE(c.msgs().find("outside this shard (1 windows per epoch)"), std::string::npos);
  dsc_loader_free(l);
  dsc_diag_clear(c.ctx);
  o.vocab_size = 100;  // ids go up to 199
  EXPECT_EQ(dsc_loader_open(c.ctx, p.c_str(), &o, &l), DSC_ERR_USER);
  EXPECT_NE(c.msgs().find("is outside the vocabulary (size 100)"), std::string::npos);
  dsc_diag_clear(c.ctx);
  o.batch = 0;
  EXPECT_EQ(dsc_loader_open(c.ctx, p.c_str(), &o, &l), DSC_ERR_USER);
  EXPECT_NE(c.msgs().find("batch and seq must be between 1 and 2^31-1"), std::string::npos);
}

}  // namespace
