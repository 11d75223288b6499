// safetensors files (format, every dtype, every rejection) and checkpoint
// directories (layout, latest link, resume state, atomicity, validation).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <deque>
#include <map>
#include <random>

#include "runtime_test_util.h"
#include "tests/unit/test_util.h"

using rt_test::read_bytes;
using rt_test::Ctx;
using rt_test::TempDir;
using rt_test::write_bytes;

namespace {

// Owns the tensors of a set built by a test.
struct Set {
  dsc_context *ctx;
  std::deque<std::string> name_store;  // stable addresses for names[]
  std::vector<const char *> names;
  std::vector<dsc_tensor *> tensors;
  std::vector<dsc_kv> meta;
  explicit Set(dsc_context *c) : ctx(c) {}
  ~Set() {
    for (auto *t : tensors) dsc_tensor_free(ctx, t);
  }
  dsc_tensor *add(const std::string &name, dsc_dtype dt, std::vector<int64_t> dims,
                  std::vector<double> vals = {}) {
    dsc_tensor *t = dsc_tensor_new(ctx, dsc_type_make(dt, (int)dims.size(), dims.data()));
    for (size_t i = 0; i < vals.size(); i++) t->data[i] = vals[i];
    name_store.push_back(name);
    names.push_back(name_store.back().c_str());
    tensors.push_back(t);
    return t;
  }
  // Random values held exactly by the dtype, never all zero.
  dsc_tensor *add_random(const std::string &name, dsc_dtype dt, std::vector<int64_t> dims,
                         uint32_t seed) {
    dsc_tensor *t = add(name, dt, dims);
    std::mt19937_64 g(seed);
    std::normal_distribution<double> nd(0.0, 3.0);
    int64_t n = dsc_type_numel(&t->type);
    for (int64_t i = 0; i < n; i++) {
      switch (dt) {
        case DSC_I32:
          t->data[i] = (double)(int32_t)(uint32_t)g();
          break;
        case DSC_I64:
          t->data[i] = (double)((int64_t)(g() >> 11) - (1LL << 52));
          break;
        case DSC_BOOL:
          t->data[i] = (double)((g() >> 7) & 1);
          break;
        default:
          t->data[i] = nd(g) * std::pow(10.0, (double)(i % 7) - 3.0);
      }
    }
    if (n > 0) t->data[0] = dt == DSC_BOOL ? 1 : 1.25;
    ir_round_to_dtype(t);
    return t;
  }
  dsc_tensor_set view() {
    dsc_tensor_set s = {(int)names.size(), names.data(), tensors.data(), (int)meta.size(),
                        meta.data()};
    return s;
  }
};

void expect_same(const dsc_tensor_set &want, const dsc_tensor_set *got) {
  ASSERT_NE(got, nullptr);
  ASSERT_EQ(got->n, want.n);
  for (int i = 0; i < want.n; i++) {
    const dsc_tensor *a = want.tensors[i], *b = dsc_tensor_set_find(got, want.names[i]);
    ASSERT_NE(b, nullptr) << want.names[i];
    ASSERT_TRUE(dsc_type_equal(&a->type, &b->type)) << want.names[i];
    int64_t n = dsc_type_numel(&a->type);
    for (int64_t k = 0; k < n; k++)
      ASSERT_EQ(a->data[k], b->data[k]) << want.names[i] << "[" << k << "]";
  }
}

std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; i++) s[i] = (char)(v >> (8 * i));
  return s;
}

// A safetensors file built by hand: the header padded with spaces as the package does.
std::string st_file(std::string header, const std::string &data, bool pad = true) {
  while (pad && header.size() % 8) header += ' ';
  return le64(header.size()) + header + data;
}

// -------------------------------------------------------------- conversions

TEST(Safetensors, HalfPrecisionBitsRoundToNearestEven) {
  EXPECT_EQ(ir_f16_bits(1.0), 0x3c00);
  EXPECT_EQ(ir_f16_bits(-2.0), 0xc000);
  EXPECT_EQ(ir_f16_bits(65504.0), 0x7bff);
  EXPECT_EQ(ir_f16_bits(65519.0), 0x7bff);  // below the halfway point to 2^16
  EXPECT_EQ(ir_f16_bits(65520.0), 0x7c00);  // tie rounds to even: overflow to inf
  EXPECT_EQ(ir_f16_bits(std::ldexp(1.0, -24)), 0x0001);
  EXPECT_EQ(ir_f16_bits(std::ldexp(1.0, -25)), 0x0000);      // tie to even (zero)
  EXPECT_EQ(ir_f16_bits(3 * std::ldexp(1.0, -25)), 0x0002);  // tie to even (two)
  EXPECT_EQ(ir_f16_bits(std::ldexp(1023.5, -24)), 0x0400);   // rounds up into the normals
  EXPECT_EQ(ir_f16_bits(-0.0), 0x8000);
  EXPECT_EQ(ir_f16_bits(INFINITY), 0x7c00);
  EXPECT_TRUE(std::isnan(ir_f16_value(ir_f16_bits(NAN))));
  EXPECT_EQ(ir_bf16_bits(1.0), 0x3f80);
  EXPECT_EQ(ir_bf16_bits(1.0 + std::ldexp(1.0, -8)), 0x3f80);      // tie to even
  EXPECT_EQ(ir_bf16_bits(1.0 + 3 * std::ldexp(1.0, -8)), 0x3f82);  // tie to even (up)
  // Just above a tie: rounding through f32 first would land on the tie and go
  // down; direct rounding goes up.
  EXPECT_EQ(ir_bf16_bits(1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -30)), 0x3f81);
  EXPECT_EQ(ir_bf16_bits(1e39), 0x7f80);
  EXPECT_EQ(ir_bf16_value(0x3f81), 1.0078125);
  EXPECT_EQ(ir_f16_value(0x0001), std::ldexp(1.0, -24));
}

TEST(Safetensors, HalfPrecisionAgreesWithInterpreterRounding) {
  std::mt19937_64 g(99);
  std::uniform_real_distribution<double> mant(-1.0, 1.0);
  std::uniform_int_distribution<int> ex(-30, 20);
  Ctx c;
  int64_t n = 20000;
  for (dsc_dtype dt : {DSC_F16, DSC_BF16}) {
    dsc_tensor *t = dsc_tensor_new(c.ctx, dsc_type_make(dt, 1, &n));
    std::vector<double> raw(n);
    for (int64_t i = 0; i < n; i++) raw[i] = t->data[i] = std::ldexp(mant(g), ex(g));
    ir_round_to_dtype(t);
    for (int64_t i = 0; i < n; i++) {
      double mine =
          dt == DSC_F16 ? ir_f16_value(ir_f16_bits(raw[i])) : ir_bf16_value(ir_bf16_bits(raw[i]));
      ASSERT_EQ(mine, t->data[i]) << dsc_dtype_name(dt) << " of " << raw[i];
    }
    dsc_tensor_free(c.ctx, t);
  }
}

// ---------------------------------------------------------------- round trip

TEST(Safetensors, RoundTripsEveryDtypeWithMetadata) {
  TempDir dir;
  Ctx c;
  Set s(c.ctx);
  s.add_random("w.f32", DSC_F32, {3, 5}, 1);
  s.add_random("w.f64", DSC_F64, {2, 2, 3}, 2);
  s.add_random("w.bf16", DSC_BF16, {7}, 3);
  s.add_random("w.f16", DSC_F16, {4, 2}, 4);
  s.add_random("ids.i32", DSC_I32, {6}, 5);
  s.add_random("ids.i64", DSC_I64, {2, 3}, 6);
  s.add_random("mask", DSC_BOOL, {9}, 7);
  s.add_random("scalar", DSC_F32, {}, 8);
  s.add("empty", DSC_F16, {0, 3});
  s.meta = {{"format", "pt"}, {"note", "quote \" and\nnewline"}};
  std::string p = dir / "t.safetensors";
  dsc_tensor_set v = s.view();
  ASSERT_EQ(dsc_safetensors_write(c.ctx, p.c_str(), &v), DSC_OK) << c.msgs();
  dsc_tensor_set *got = nullptr;
  ASSERT_EQ(dsc_safetensors_read(c.ctx, p.c_str(), &got), DSC_OK) << c.msgs();
  expect_same(v, got);
  ASSERT_EQ(got->n_meta, 2);
  EXPECT_STREQ(dsc_tensor_set_meta(got, "format"), "pt");
  EXPECT_STREQ(dsc_tensor_set_meta(got, "note"), "quote \" and\nnewline");
  dsc_tensor_set_free(c.ctx, got);
  EXPECT_EQ(rt_test::list_dir(dir.path), std::vector<std::string>{"t.safetensors"});
}

TEST(Safetensors, WrittenBytesMatchTheSpecByHand) {
  TempDir dir;
  Ctx c;
  Set s(c.ctx);
  s.add("d", DSC_BOOL, {2}, {1, 0});
  s.add("b", DSC_F32, {2}, {1.5, -2});
  s.add("c", DSC_BF16, {1}, {1.0});
  s.add("a", DSC_I64, {1}, {-3});
  s.add("e", DSC_F32, {1, 1}, {0.25});
  s.meta = {{"k", "v"}};
  std::string p = dir / "spec.safetensors";
  dsc_tensor_set v = s.view();
  ASSERT_EQ(dsc_safetensors_write(c.ctx, p.c_str(), &v), DSC_OK) << c.msgs();
  std::string bytes = read_bytes(p);
  ASSERT_GE(bytes.size(), 8u);
  uint64_t n = 0;
  for (int i = 0; i < 8; i++) n |= (uint64_t)(uint8_t)bytes[i] << (8 * i);
  EXPECT_EQ(n % 8, 0u);
  // Order: I64, then F32 (by name), then BF16, then BOOL; compact JSON.
  std::string want =
      "{\"__metadata__\":{\"k\":\"v\"},"
      "\"a\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[0,8]},"
      "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]},"
      "\"e\":{\"dtype\":\"F32\",\"shape\":[1,1],\"data_offsets\":[16,20]},"
      "\"c\":{\"dtype\":\"BF16\",\"shape\":[1],\"data_offsets\":[20,22]},"
      "\"d\":{\"dtype\":\"BOOL\",\"shape\":[2],\"data_offsets\":[22,24]}}";
  while (want.size() % 8) want += ' ';
  ASSERT_EQ(n, want.size());
  EXPECT_EQ(bytes.substr(8, n), want);
  const unsigned char data[] = {0xfd, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,  // -3
                                0x00, 0x00, 0xc0, 0x3f, 0x00, 0x00, 0x00, 0xc0,  // 1.5, -2
                                0x00, 0x00, 0x80, 0x3e,                          // 0.25
                                0x80, 0x3f,                                      // bf16 1
                                0x01, 0x00};
  EXPECT_EQ(bytes.substr(8 + n), std::string((const char *)data, sizeof data));
}

TEST(Safetensors, WriterRejectsUnrepresentableValuesAndKeepsTheOldFile) {
  TempDir dir;
  Ctx c;
  Set good(c.ctx), bad(c.ctx);
  good.add_random("w", DSC_F32, {4}, 3);
  bad.add("ids", DSC_I32, {3}, {1, 1e20, 2});
  std::string p = dir / "m.safetensors";
  dsc_tensor_set gv = good.view(), bv = bad.view();
  ASSERT_EQ(dsc_safetensors_write(c.ctx, p.c_str(), &gv), DSC_OK);
  std::string before = read_bytes(p);
  EXPECT_EQ(dsc_safetensors_write(c.ctx, p.c_str(), &bv), DSC_ERR_USER);
  EXPECT_EQ(c.msgs(), p + ": tensor 'ids': element 1 (1e+20) does not fit I32\n");
  EXPECT_EQ(read_bytes(p), before);
  EXPECT_EQ(rt_test::list_dir(dir.path), std::vector<std::string>{"m.safetensors"});
  dsc_diag_clear(c.ctx);
  bad.add("ids", DSC_F32, {1});
  bv = bad.view();
  EXPECT_EQ(dsc_safetensors_write(c.ctx, p.c_str(), &bv), DSC_ERR_USER);
  EXPECT_EQ(c.msgs(), p + ": tensor 'ids' appears twice\n");
  dsc_diag_clear(c.ctx);
  std::string nodir = dir / "absent/m.safetensors";
  EXPECT_EQ(dsc_safetensors_write(c.ctx, nodir.c_str(), &gv), DSC_ERR_USER);
  EXPECT_NE(c.msgs().find(nodir + ": cannot create a temporary file"), std::string::npos);
}

// ---------------------------------------------------------------- rejection

std::string read_error(const std::string &path) {
  Ctx c;
  dsc_tensor_set *got = nullptr;
  EXPECT_EQ(dsc_safetensors_read(c.ctx, path.c_str(), &got), DSC_ERR_USER);
  EXPECT_EQ(got, nullptr);
  return c.msgs();
}

std::string entry(const char *name, const char *dtype, const char *shape, int b, int e) {
  return std::string("\"") + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape +
         ",\"data_offsets\":[" + std::to_string(b) + "," + std::to_string(e) + "]}";
}

TEST(Safetensors, RejectsCorruptFilesWithPreciseMessages) {
  TempDir dir;
  std::string p = dir / "bad.safetensors";
  std::string d16(16, '\x11');
  struct Case {
    std::string file, message;
  } cases[] = {
      {"abc", "file too short: 3 bytes, a safetensors file starts with an 8-byte header length"},
      {le64(1ULL << 40) + "{}      ",
       "header length 1099511627776 is absurd (more than 100000000 bytes)"},
      {le64(64) + "{}      ", "header length 64 is larger than the rest of the file (8 bytes)"},
      {st_file("{\"a\":", ""), "header is not valid JSON"},
      {st_file("{} x", ""), "header has bytes after its JSON object (at header byte 3)"},
      {st_file("[1,2]", ""), "header is not a JSON object"},
      {st_file("{\"a\":{\"shape\":[4],\"data_offsets\":[0,16]}}", d16),
       "tensor 'a': entry has no \"dtype\""},
      {st_file("{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,16]}}", d16),
       "tensor 'a': entry has no \"shape\""},
      {st_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[4]}}", d16),
       "tensor 'a': entry has no \"data_offsets\""},
      {st_file("{" + entry("a", "Q4", "[4]", 0, 16) + "}", d16),
       "tensor 'a': unsupported dtype 'Q4' (dsc reads F32 F64 BF16 F16 I32 I64 BOOL)"},
      {st_file("{" + entry("a", "F32", "[-4]", 0, 16) + "}", d16),
       "tensor 'a': shape entry 0 is not a non-negative integer"},
      {st_file("{" + entry("a", "F32", "[4]", 8, 4) + "}", d16),
       "tensor 'a': \"data_offsets\" is not [begin, end] with 0 <= begin <= end"},
      {st_file("{" + entry("a", "F32", "[5]", 0, 20) + "}", d16),
       "tensor 'a': data_offsets [0, 20] run past the end of the data (16 bytes)"},
      {st_file("{" + entry("a", "F32", "[3]", 0, 16) + "}", d16),
       "tensor 'a': data_offsets [0, 16] hold 16 bytes but F32 f32[3] needs 12"},
      {st_file("{" + entry("a", "F32", "[2]", 0, 8) + "," + entry("b", "F32", "[2]", 4, 12) + "}",
               d16),
       "tensors 'a' and 'b' overlap (data bytes 4 to 8 are shared)"},
      {st_file("{" + entry("a", "F32", "[1]", 0, 4) + "," + entry("b", "F32", "[2]", 8, 16) + "}",
               d16),
       "hole between tensors 'a' and 'b' (data bytes 4 to 8 belong to no tensor)"},
      {st_file("{" + entry("a", "F32", "[2]", 8, 16) + "}", d16),
       "hole before tensor 'a' (data bytes 0 to 8 belong to no tensor)"},
      {st_file("{" + entry("a", "F32", "[2]", 0, 8) + "}", d16),
       "8 trailing bytes after the last tensor's data"},
      {st_file("{" + entry("a", "F32", "[2]", 0, 8) + "," + entry("a", "F32", "[2]", 8, 16) + "}",
               d16),
       "tensor 'a' appears twice in the header"},
      {st_file("{\"__metadata__\":{\"k\":1}}", ""), "\"__metadata__\" entry 'k' is not a string"},
  };
  for (const Case &k : cases) {
    write_bytes(p, k.file);
    std::string got = read_error(p);
    EXPECT_EQ(got.rfind(p + ": " + k.message, 0), 0u) << "want: " << k.message << "\ngot: " << got;
  }
}

TEST(Safetensors, RejectsTruncatedAndFlippedRealFiles) {
  TempDir dir;
  Ctx c;
  Set s(c.ctx);
  s.add_random("w", DSC_F32, {8}, 1);
  s.add_random("v", DSC_F16, {4}, 2);
  std::string p = dir / "m.safetensors";
  dsc_tensor_set v = s.view();
  ASSERT_EQ(dsc_safetensors_write(c.ctx, p.c_str(), &v), DSC_OK);
  std::string good = read_bytes(p);
  write_bytes(p, good.substr(0, good.size() - 3));
  EXPECT_NE(read_error(p).find(
                "tensor 'v': data_offsets [32, 40] run past the end of the data (37 bytes)"),
            std::string::npos);
  write_bytes(p, good.substr(0, 20));
  EXPECT_NE(read_error(p).find("is larger than the rest of the file"), std::string::npos);
  std::string flipped = good;
  flipped[8] = 'x';  // the header's opening brace
  write_bytes(p, flipped);
  EXPECT_NE(read_error(p).find("header is not valid JSON"), std::string::npos);
  flipped = good;
  size_t at = flipped.find("\"F32\"");
  flipped[at + 2] = '8';  // "F82"
  write_bytes(p, flipped);
  EXPECT_NE(read_error(p).find("tensor 'w': unsupported dtype 'F82'"), std::string::npos);
  write_bytes(p, good + "xy");
  EXPECT_NE(read_error(p).find("2 trailing bytes after the last tensor's data"), std::string::npos);
}

// Writes files for tests/cli/safetensors_python.sh when DSC_ST_OUT names a
// directory: the Python package must read them and match the values in
// expected.txt (one line per tensor: name dtype dims values...).
TEST(SafetensorsPython, WriteFixture) {
  const char *out = getenv("DSC_ST_OUT");
  if (!out || !*out) GTEST_SKIP() << "DSC_ST_OUT not set";
  Ctx c;
  Set plain(c.ctx), with_bf16(c.ctx);
  plain.add_random("layer.0.w", DSC_F32, {3, 4}, 11);
  plain.add_random("layer.0.b", DSC_F64, {5}, 12);
  plain.add_random("half", DSC_F16, {2, 3}, 13);
  plain.add_random("ids", DSC_I32, {7}, 14);
  plain.add_random("big_ids", DSC_I64, {2, 2}, 15);
  plain.add_random("mask", DSC_BOOL, {6}, 16);
  plain.add_random("scalar", DSC_F32, {}, 17);
  plain.add("empty", DSC_F32, {0, 2});
  plain.meta = {{"format", "np"}};
  with_bf16.add_random("bf", DSC_BF16, {3, 3}, 18);
  with_bf16.add_random("f", DSC_F32, {4}, 19);
  std::string dir = out;
  dsc_tensor_set a = plain.view(), b = with_bf16.view();
  ASSERT_EQ(dsc_safetensors_write(c.ctx, (dir + "/dsc.safetensors").c_str(), &a), DSC_OK)
      << c.msgs();
  ASSERT_EQ(dsc_safetensors_write(c.ctx, (dir + "/dsc_bf16.safetensors").c_str(), &b), DSC_OK)
      << c.msgs();
  FILE *f = fopen((dir + "/expected.txt").c_str(), "w");
  ASSERT_NE(f, nullptr);
  for (Set *s : {&plain, &with_bf16})
    for (size_t i = 0; i < s->names.size(); i++) {
      const dsc_tensor *t = s->tensors[i];
      fprintf(f, "%s %s %s %d", s == &plain ? "dsc.safetensors" : "dsc_bf16.safetensors",
              s->names[i], rt_st_dtype_name(t->type.dtype), t->type.rank);
      for (int d = 0; d < t->type.rank; d++) fprintf(f, " %lld", (long long)t->type.dims[d]);
      for (int64_t k = 0; k < dsc_type_numel(&t->type); k++) fprintf(f, " %.17g", t->data[k]);
      fprintf(f, "\n");
    }
  fclose(f);
}

// ---------------------------------------------------------------- checkpoints

struct Ckpt {
  Ctx c;
  Set model{c.ctx}, opt{c.ctx};
  dsc_checkpoint_state state{};
  std::vector<dsc_kv> extra = {{"config_hash", "abc123"}, {"note", "run 1"}};
  Ckpt() {
    model.add_random("wte", DSC_F32, {16, 8}, 1);
    model.add_random("ln.w", DSC_F32, {8}, 2);
    opt.add_random("wte.m", DSC_F32, {16, 8}, 3);
    opt.add_random("wte.v", DSC_F32, {16, 8}, 4);
    opt.add("t", DSC_I64, {}, {7});
    state.step = 123;
    state.rng[0] = 0x0123456789abcdefULL;
    state.rng[1] = 0xfedcba9876543210ULL;
    state.rng[2] = 1;
    state.rng[3] = ~0ULL;
    state.loader = {2, 41};
    state.extra = extra.data();
    state.n_extra = (int)extra.size();
  }
  dsc_status save(const std::string &out, int64_t step, int keep = 0) {
    state.step = step;
    dsc_tensor_set m = model.view(), o = opt.view();
    return dsc_checkpoint_save(c.ctx, out.c_str(), &m, &o, &state, keep);
  }
  std::vector<dsc_tensor_spec> model_spec() {
    std::vector<dsc_tensor_spec> s;
    for (size_t i = 0; i < model.names.size(); i++)
      s.push_back({model.names[i], model.tensors[i]->type});
    return s;
  }
};

std::string link_target(const std::string &p) {
  char buf[512];
  ssize_t n = readlink(p.c_str(), buf, sizeof buf - 1);
  return n < 0 ? "" : std::string(buf, (size_t)n);
}

TEST(Checkpoint, SavesLayoutAndLoadsThroughLatest) {
  TempDir dir;
  Ckpt k;
  std::string out = dir / "run/ckpt";  // created, parents included
  ASSERT_EQ(k.save(out, 123), DSC_OK) << k.c.msgs();
  auto files = rt_test::list_dir(out + "/step-000123");
  std::sort(files.begin(), files.end());
  EXPECT_EQ(files,
            (std::vector<std::string>{"model.safetensors", "optimizer.safetensors", "state.json"}));
  EXPECT_EQ(link_target(out + "/latest"), "step-000123");
  auto top = rt_test::list_dir(out);
  std::sort(top.begin(), top.end());
  EXPECT_EQ(top, (std::vector<std::string>{"latest", "step-000123"}));  // no temporaries left
  for (std::string path : {out, out + "/step-000123"}) {
    dsc_checkpoint *ck = nullptr;
    auto spec = k.model_spec();
    ASSERT_EQ(
        dsc_checkpoint_load(k.c.ctx, path.c_str(), spec.data(), (int)spec.size(), nullptr, 0, &ck),
        DSC_OK)
        << k.c.msgs();
    EXPECT_EQ(std::string(ck->dir), out + "/step-000123");
    expect_same(k.model.view(), ck->model);
    expect_same(k.opt.view(), ck->optimizer);
    EXPECT_EQ(ck->state.step, 123);
    for (int i = 0; i < 4; i++) EXPECT_EQ(ck->state.rng[i], k.state.rng[i]);
    EXPECT_EQ(ck->state.loader.epoch, 2);
    EXPECT_EQ(ck->state.loader.index, 41);
    ASSERT_EQ(ck->state.n_extra, 2);
    EXPECT_STREQ(ck->state.extra[0].key, "config_hash");
    EXPECT_STREQ(ck->state.extra[0].value, "abc123");
    EXPECT_STREQ(ck->state.extra[1].value, "run 1");
    dsc_checkpoint_free(k.c.ctx, ck);
  }
}

TEST(Checkpoint, LatestMovesAndKeepLastPrunesOldSteps) {
  TempDir dir;
  Ckpt k;
  std::string out = dir / "ck";
  ASSERT_EQ(k.save(out, 5), DSC_OK);
  ASSERT_EQ(k.save(out, 10), DSC_OK);
  EXPECT_EQ(link_target(out + "/latest"), "step-000010");
  ASSERT_EQ(k.save(out, 15, 2), DSC_OK) << k.c.msgs();
  auto top = rt_test::list_dir(out);
  std::sort(top.begin(), top.end());
  EXPECT_EQ(top, (std::vector<std::string>{"latest", "step-000010", "step-000015"}));
  // A resumed run saving an earlier step never prunes what it just wrote.
  ASSERT_EQ(k.save(out, 12, 1), DSC_OK);
  top = rt_test::list_dir(out);
  std::sort(top.begin(), top.end());
  EXPECT_EQ(top, (std::vector<std::string>{"latest", "step-000012", "step-000015"}));
  EXPECT_EQ(link_target(out + "/latest"), "step-000012");
}

TEST(Checkpoint, SavingTheSameStepAgainReplacesIt) {
  TempDir dir;
  Ckpt k;
  std::string out = dir / "ck";
  ASSERT_EQ(k.save(out, 7), DSC_OK);
  k.model.tensors[1]->data[0] = 42.5;
  k.state.loader = {3, 1};
  ASSERT_EQ(k.save(out, 7), DSC_OK) << k.c.msgs();
  dsc_checkpoint *ck = nullptr;
  ASSERT_EQ(dsc_checkpoint_load(k.c.ctx, out.c_str(), nullptr, 0, nullptr, 0, &ck), DSC_OK);
  EXPECT_EQ(dsc_tensor_set_find(ck->model, "ln.w")->data[0], 42.5);
  EXPECT_EQ(ck->state.loader.epoch, 3);
  dsc_checkpoint_free(k.c.ctx, ck);
  auto top = rt_test::list_dir(out);
  std::sort(top.begin(), top.end());
  EXPECT_EQ(top, (std::vector<std::string>{"latest", "step-000007"}));
}

TEST(Checkpoint, FailedSaveLeavesPreviousCheckpointAndLatestIntact) {
  TempDir dir;
  Ckpt k;
  std::string out = dir / "ck";
  ASSERT_EQ(k.save(out, 1), DSC_OK);
  std::string model_before = read_bytes(out + "/step-000001/model.safetensors");
  k.opt.add("bad", DSC_I32, {2}, {1, 1e12});  // fails halfway through the step directory
  EXPECT_EQ(k.save(out, 2), DSC_ERR_USER);
  EXPECT_NE(k.c.msgs().find("tensor 'bad': element 1 (1e+12) does not fit I32"), std::string::npos)
      << k.c.msgs();
  auto top = rt_test::list_dir(out);
  std::sort(top.begin(), top.end());
  EXPECT_EQ(top, (std::vector<std::string>{"latest", "step-000001"}));
  EXPECT_EQ(link_target(out + "/latest"), "step-000001");
  EXPECT_EQ(read_bytes(out + "/step-000001/model.safetensors"), model_before);
  // Out directory that is a regular file.
  dsc_diag_clear(k.c.ctx);
  write_bytes(dir / "file", "x");
  EXPECT_EQ(k.save(dir / "file", 3), DSC_ERR_USER);
  EXPECT_NE(k.c.msgs().find(dir / "file"), std::string::npos) << k.c.msgs();
}

TEST(Checkpoint, UnwritableDirectoryIsAnErrorAndChangesNothing) {
  if (geteuid() == 0) GTEST_SKIP() << "root ignores directory permissions";
  TempDir dir;
  Ckpt k;
  std::string out = dir / "ck";
  ASSERT_EQ(k.save(out, 1), DSC_OK);
  chmod(out.c_str(), 0555);
  EXPECT_EQ(k.save(out, 2), DSC_ERR_USER);
  chmod(out.c_str(), 0755);
  EXPECT_NE(k.c.msgs().find("cannot create directory"), std::string::npos) << k.c.msgs();
  EXPECT_EQ(link_target(out + "/latest"), "step-000001");
}

std::string load_error(const std::string &path,
                       const std::vector<dsc_tensor_spec> *spec = nullptr) {
  Ctx c;
  dsc_checkpoint *ck = nullptr;
  EXPECT_EQ(dsc_checkpoint_load(c.ctx, path.c_str(), spec ? spec->data() : nullptr,
                                spec ? (int)spec->size() : 0, nullptr, 0, &ck),
            DSC_ERR_USER);
  EXPECT_EQ(ck, nullptr);
  return c.msgs();
}

TEST(Checkpoint, LoadRejectsMismatchedShapesMissingAndUnexpectedTensors) {
  TempDir dir;
  Ckpt k;
  std::string out = dir / "ck";
  ASSERT_EQ(k.save(out, 3), DSC_OK);
  std::string mf = out + "/step-000003/model.safetensors";
  auto spec = k.model_spec();
  spec[0].type.dims[0] = 32;
  EXPECT_EQ(load_error(out, &spec), mf + ": tensor 'wte': expected f32[32,8], found f32[16,8]\n");
  spec = k.model_spec();
  spec[1].type.dtype = DSC_BF16;
  spec.push_back({"lnf.w", dsc_type_make(DSC_F32, 1, spec[1].type.dims)});
  EXPECT_EQ(load_error(out, &spec), mf + ": tensor 'ln.w': expected bf16[8], found f32[8]\n" + mf +
                                        ": tensor 'lnf.w' is missing (expected f32[8])\n");
  spec = k.model_spec();
  spec.pop_back();
  EXPECT_EQ(load_error(out, &spec), mf + ": unexpected tensor 'ln.w'\n");
}

TEST(Checkpoint, LoadRejectsMissingFilesCorruptFilesAndBadState) {
  TempDir dir;
  Ckpt k;
  std::string out = dir / "ck";
  ASSERT_EQ(k.save(out, 4), DSC_OK);
  std::string step = out + "/step-000004";
  EXPECT_EQ(load_error(dir / "nothing"),
            dir / "nothing" + ": cannot open checkpoint: No such file or directory\n");
  EXPECT_EQ(
      load_error(dir.path),
      dir.path +
          ": not a checkpoint: no state.json here and no 'latest' link to a step directory\n");

  std::string model = read_bytes(step + "/model.safetensors");
  write_bytes(step + "/model.safetensors", model.substr(0, model.size() - 1));
  EXPECT_NE(load_error(out).find(step + "/model.safetensors: tensor 'wte': data_offsets"),
            std::string::npos);
  write_bytes(step + "/model.safetensors", model);

  std::string state = read_bytes(step + "/state.json");
  write_bytes(step + "/state.json", "{\"format\": \"dsc-checkpoint\", \"version\": 1, ");
  EXPECT_EQ(load_error(out), step + "/state.json: malformed checkpoint state: not a JSON object\n");
  std::string s2 = state;
  s2.replace(s2.find("\"step\""), 6, "\"stop\"");
  write_bytes(step + "/state.json", s2);
  EXPECT_EQ(
      load_error(out),
      step + "/state.json: malformed checkpoint state: \"step\" is not a non-negative integer\n");
  write_bytes(step + "/state.json", state);

  unlink((step + "/optimizer.safetensors").c_str());
  unlink((step + "/state.json").c_str());
  EXPECT_EQ(load_error(out), step + "/optimizer.safetensors: checkpoint file is missing\n" + step +
                                 "/state.json: checkpoint file is missing\n");
  TempDir::remove_tree(step);
  EXPECT_EQ(load_error(out), out + "/latest: points to 'step-000004', which does not exist\n");
}

}  // namespace
