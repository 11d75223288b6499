// Hostile inputs (issue 14): headers with very many tensors parse in
// O(n log n), shapes from files are overflow-checked, checkpoints with
// non-finite values or junk state are refused naming the file and field,
// .dsx section tables that overlap are refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <ctime>
#include <string>

#include "runtime_test_util.h"


using rt_test::read_bytes;
using rt_test::TempDir;
using rt_test::write_bytes;

namespace {

std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; i++) s[i] = (char)(v >> (8 * i));
  return s;
}

std::string st_file(std::string header, const std::string &data) {
  while (header.size() % 8) header += ' ';
  return le64(header.size()) + header + data;
}

// n F32[1] tensors named t<i>, data in name order; the last one named
// `last` (a duplicate when it names an earlier one).
std::string many_tensors(int n, const std::string &last) {
  std::string h = "{";
  h.reserve((size_t)n * 64);
  char buf[128];
  for (int i = 0; i < n; i++) {
    std::string name = i == n - 1 && !last.empty() ? last : "t" + std::to_string(1000000 + i);
    snprintf(buf, sizeof buf, "%s\"%s\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[%d,%d]}",
             i ? "," : "", name.c_str(), 4 * i, 4 * i + 4);
    h += buf;
  }
  h += "}";
  return st_file(h, std::string((size_t)n * 4, '\0'));
}

// Process CPU time: the bound then holds on a loaded machine too (the
// quadratic name check it guards against is CPU time as well).
using cpu_clock = std::clock_t;
const double kBound = 10.0;
double seconds_since(cpu_clock t0) { return (double)(std::clock() - t0) / CLOCKS_PER_SEC; }

// 300k tensors: a pairwise name check took more than 200 s. The bound (CPU
// seconds) leaves room for ASan on a slow CI core: a release build reads
// them in about 0.7 s, an ASan build in about 2.7 s (measured on a loaded
// 2-core machine).
TEST(HostileSafetensors, ThreeHundredThousandTensorsParseAndWriteQuickly) {
  TempDir dir;
  const int n = 300000;
  std::string p = dir / "many.safetensors";
  write_bytes(p, many_tensors(n, ""));
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  dsc_tensor_set *s = nullptr;
  cpu_clock t0 = std::clock();
  ASSERT_EQ(dsc_safetensors_read(ctx, p.c_str(), &s), DSC_OK) << diags(ctx);
  double read_s = seconds_since(t0);
  ASSERT_EQ(s->n, n);
  EXPECT_NE(dsc_tensor_set_find(s, "t1299999"), nullptr);
  EXPECT_LT(read_s, kBound) << "reading " << n << " tensors";
  // the writer: the name check and the data order sort (names reversed, so
  // an insertion sort would be quadratic too)
  std::vector<const char *> names(s->names, s->names + n);
  std::vector<dsc_tensor *> ts(s->tensors, s->tensors + n);
  std::reverse(names.begin(), names.end());
  std::reverse(ts.begin(), ts.end());
  dsc_tensor_set rev = {n, names.data(), ts.data(), 0, nullptr};
  std::string q = dir / "again.safetensors";
  t0 = std::clock();
  ASSERT_EQ(dsc_safetensors_write(ctx, q.c_str(), &rev), DSC_OK) << diags(ctx);
  double write_s = seconds_since(t0);
  EXPECT_LT(write_s, kBound) << "writing " << n << " tensors";
  EXPECT_EQ(read_bytes(q), read_bytes(p));  // same data order: by name
  // checking a set against a spec of as many names is O(n log n) as well
  std::vector<dsc_tensor_spec> spec;
  for (int i = 0; i < n; i++) spec.push_back({names[(size_t)i], ts[(size_t)i]->type});
  t0 = std::clock();
  EXPECT_EQ(dsc_tensor_set_check(ctx, p.c_str(), s, spec.data(), n), DSC_OK) << diags(ctx);
  double check_s = seconds_since(t0);
  EXPECT_LT(check_s, kBound) << "checking " << n << " tensors against a spec";
  // and finding each by name (a resume copying them into the params)
  std::vector<int> at((size_t)n);
  t0 = std::clock();
  ASSERT_TRUE(rt_tensor_set_lookup(ctx, s, names.data(), n, at.data()));
  double lookup_s = seconds_since(t0);
  EXPECT_LT(lookup_s, kBound) << "finding " << n << " tensors by name";
  for (int i = 0; i < n; i += 9973) EXPECT_STREQ(s->names[at[(size_t)i]], names[(size_t)i]);
  const char *absent = "no such tensor";
  int none = 0;
  ASSERT_TRUE(rt_tensor_set_lookup(ctx, s, &absent, 1, &none));
  EXPECT_EQ(none, -1);
  printf("%d tensors: read %.2f s, write %.2f s, check %.2f s, lookup %.2f s\n", n, read_s, write_s,
         check_s, lookup_s);
  dsc_tensor_set_free(ctx, s);
  dsc_context_free(ctx);
}

TEST(HostileSafetensors, DuplicateNameAtTheEndOfAHugeHeaderIsFound) {
  TempDir dir;
  std::string p = dir / "dup.safetensors";
  write_bytes(p, many_tensors(300000, "t1000000"));
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  dsc_tensor_set *s = nullptr;
  cpu_clock t0 = std::clock();
  EXPECT_EQ(dsc_safetensors_read(ctx, p.c_str(), &s), DSC_ERR_USER);
  EXPECT_LT(seconds_since(t0), kBound);
  EXPECT_EQ(diags(ctx), p + ": tensor 't1000000' appears twice in the header\n");
  dsc_context_free(ctx);
}

TEST(HostileSafetensors, WriterFindsADuplicateNameAmongMany) {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  const int n = 50000;
  std::vector<std::string> store;
  for (int i = 0; i < n; i++) store.push_back("w" + std::to_string(i));
  store.back() = "w17";
  std::vector<const char *> names;
  std::vector<dsc_tensor *> ts;
  for (int i = 0; i < n; i++) {
    names.push_back(store[(size_t)i].c_str());
    ts.push_back(dsc_tensor_new(ctx, dsc_type_make(DSC_F32, 0, nullptr)));
  }
  dsc_tensor_set set = {n, names.data(), ts.data(), 0, nullptr};
  TempDir dir;
  std::string p = dir / "w.safetensors";
  EXPECT_EQ(dsc_safetensors_write(ctx, p.c_str(), &set), DSC_ERR_USER);
  EXPECT_EQ(diags(ctx), p + ": tensor 'w17' appears twice\n");
  for (auto *t : ts) dsc_tensor_free(ctx, t);
  dsc_context_free(ctx);
}

TEST(HostileSafetensors, ShapesWhoseElementCountOverflowsAreRefused) {
  TempDir dir;
  std::string p = dir / "big.safetensors";
  // 2^32 * 2^32 elements: an unchecked product wraps to 0 and matches [0, 0]
  write_bytes(p, st_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],"
                         "\"data_offsets\":[0,0]}}",
                         ""));
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  dsc_tensor_set *s = nullptr;
  EXPECT_EQ(dsc_safetensors_read(ctx, p.c_str(), &s), DSC_ERR_USER);
  EXPECT_EQ(diags(ctx), p + ": tensor 'a': shape f32[4294967296,4294967296] has too many "
                            "elements (the count overflows 64 bits)\n");
  dsc_context_free(ctx);
  // a zero dim makes the count 0, but the other dims' product (a stride)
  // must still fit
  ctx = dsc_context_new(nullptr, nullptr);
  write_bytes(p, st_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[0,4294967296,4294967296],"
                         "\"data_offsets\":[0,0]}}",
                         ""));
  EXPECT_EQ(dsc_safetensors_read(ctx, p.c_str(), &s), DSC_ERR_USER);
  EXPECT_NE(diags(ctx).find("the count overflows 64 bits"), std::string::npos) << diags(ctx);
  dsc_context_free(ctx);
}

TEST(HostileShapes, CheckedNumelRefusesOverflowNegativeDimsAndBadRanks) {
  int64_t n = -1;
  int64_t d1[] = {16384, 1125899906842625LL};  // the ZeRO shard header of the issue
  dsc_type t = dsc_type_make(DSC_F32, 2, d1);
  EXPECT_FALSE(dsc_type_numel_checked(&t, &n));
  int64_t d2[] = {1, 0, INT64_MAX};
  t = dsc_type_make(DSC_F32, 3, d2);
  EXPECT_TRUE(dsc_type_numel_checked(&t, &n));
  EXPECT_EQ(n, 0);
  int64_t d3[] = {2, 0, INT64_MAX};
  t = dsc_type_make(DSC_F32, 3, d3);
  EXPECT_FALSE(dsc_type_numel_checked(&t, &n));  // 2 * INT64_MAX: a stride overflows
  int64_t d4[] = {4, -1};
  t = dsc_type_make(DSC_F32, 2, d4);
  EXPECT_FALSE(dsc_type_numel_checked(&t, &n));
  int64_t d5[] = {1LL << 31, 1LL << 31, 2};  // 2^63
  t = dsc_type_make(DSC_F32, 3, d5);
  EXPECT_FALSE(dsc_type_numel_checked(&t, &n));
  d5[2] = 1;  // 2^62
  t = dsc_type_make(DSC_F32, 3, d5);
  EXPECT_TRUE(dsc_type_numel_checked(&t, &n));
  EXPECT_EQ(n, 1LL << 62);
  t.rank = DSC_MAX_RANK + 1;
  EXPECT_FALSE(dsc_type_numel_checked(&t, &n));
  t = dsc_type_make(DSC_F32, 0, nullptr);
  EXPECT_TRUE(dsc_type_numel_checked(&t, &n));
  EXPECT_EQ(n, 1);
}

// ------------------------------------------------------------ checkpoints

struct Dir {
  TempDir tmp;
  std::string step;
  Dir() : step(tmp / "step-000005") { mkdir(step.c_str(), 0777); }
};

std::string state_json(const std::string &extra,
                       const std::string &rng =
                           "[\"0123456789abcdef\",\"0000000000000001\","
                           "\"0000000000000002\",\"0000000000000003\"]",
                       int step = 5) {
  return "{\"format\":\"dsc-checkpoint\",\"version\":1,\"step\":" + std::to_string(step) +
         ",\"rng\":" + rng + ",\"loader\":{\"epoch\":0,\"index\":1},\"extra\":{" + extra + "}}";
}

std::string f32_file(const std::string &name, const std::vector<float> &v,
                     const std::string &meta = "") {
  std::string data(v.size() * 4, '\0');
  memcpy(&data[0], v.data(), data.size());
  std::string h = "{";
  if (!meta.empty()) h += "\"__metadata__\":{" + meta + "},";
  h += "\"" + name + "\":{\"dtype\":\"F32\",\"shape\":[" + std::to_string(v.size()) +
       "],\"data_offsets\":[0," + std::to_string(data.size()) + "]}}";
  return st_file(h, data);
}

std::string load_error(const std::string &dir) {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  dsc_checkpoint *ck = nullptr;
  dsc_status st = dsc_checkpoint_load(ctx, dir.c_str(), nullptr, 0, nullptr, 0, &ck);
  std::string m = st == DSC_OK ? "loaded" : diags(ctx);
  EXPECT_EQ(st == DSC_OK, ck != nullptr);
  dsc_checkpoint_free(ctx, ck);
  dsc_context_free(ctx);
  return m;
}

TEST(HostileCheckpoint, ShardFullShapeOverflowingInt64IsNamed) {
  Dir d;
  write_bytes(d.step + "/state.json", state_json("\"zero_world\":\"1\""));
  write_bytes(d.step + "/model.safetensors", st_file("{}", ""));
  write_bytes(d.step + "/optimizer.safetensors", st_file("{}", ""));
  std::string shard = d.step + "/shard-00000-of-00001.safetensors";
  write_bytes(shard, f32_file("wte", {1, 2, 3, 4},
                              "\"full.wte\":\"16384x1125899906842625\",\"set.wte\":\"model\""));
  EXPECT_EQ(load_error(d.step),
            shard +
                ": malformed shard metadata: \"full.wte\" is '16384x1125899906842625', not a "
                "shape d0xd1x... of positive dims whose element count fits 64 bits\n");
  write_bytes(shard, f32_file("wte", {1, 2, 3, 4}, "\"full.wte\":\"2x2\",\"set.wte\":\"model\""));
  EXPECT_EQ(load_error(d.step), "loaded");
}

TEST(HostileCheckpoint, NonFiniteValuesAreNamedByTensorAndFile) {
  Dir d;
  write_bytes(d.step + "/state.json", state_json(""));
  write_bytes(d.step + "/optimizer.safetensors", st_file("{}", ""));
  write_bytes(d.step + "/model.safetensors", f32_file("wte", {1, 2, NAN, 4}));
  EXPECT_EQ(load_error(d.step), d.step +
                                    "/model.safetensors: tensor 'wte': element 2 is NaN (a "
                                    "checkpoint holds finite values only)\n");
  write_bytes(d.step + "/model.safetensors", f32_file("wte", {1, 2, 3, 4}));
  write_bytes(d.step + "/optimizer.safetensors", f32_file("wte.m", {-INFINITY}));
  EXPECT_EQ(load_error(d.step), d.step +
                                    "/optimizer.safetensors: tensor 'wte.m': element 0 is "
                                    "infinite (a checkpoint holds finite values only)\n");
  write_bytes(d.step + "/optimizer.safetensors", f32_file("opt.loss_scale", {0}));
  EXPECT_EQ(load_error(d.step), d.step +
                                    "/optimizer.safetensors: tensor 'opt.loss_scale' is 0, "
                                    "not a positive number\n");
  write_bytes(d.step + "/optimizer.safetensors", f32_file("opt.loss_scale", {65536}));
  EXPECT_EQ(load_error(d.step), "loaded");
}

TEST(HostileCheckpoint, JunkStateValuesAreNamedByField) {
  Dir d;
  write_bytes(d.step + "/optimizer.safetensors", st_file("{}", ""));
  write_bytes(d.step + "/model.safetensors", f32_file("wte", {1}));
  std::string sp = d.step + "/state.json", pre = sp + ": malformed checkpoint state: ";
  struct Case {
    std::string state, message;
  } cases[] = {
      {state_json("\"lr\":\"nan\""), "\"extra.lr\" is 'nan', not a finite number >= 0"},
      {state_json("\"lr\":\"-0.1\""), "\"extra.lr\" is '-0.1', not a finite number >= 0"},
      {state_json("\"lr\":\"3e-4x\""), "\"extra.lr\" is '3e-4x', not a finite number >= 0"},
      {state_json("\"lr\":\"1e999\""), "\"extra.lr\" is '1e999', not a finite number >= 0"},
      {state_json("\"seed\":\"-1\""),
       "\"extra.seed\" is '-1', not an integer in [0, 18446744073709551615]"},
      {state_json("\"seed\":\"18446744073709551616\""),
       "\"extra.seed\" is '18446744073709551616', not an integer in [0, 18446744073709551615]"},
      {state_json("\"batch\":\"0\""), "\"extra.batch\" is '0', not an integer in [1, 2147483648]"},
      {state_json("\"zero_stage\":\"4\""), "\"extra.zero_stage\" is '4', not an integer in [0, 3]"},
      {state_json("\"steps\":\"4\""), "\"step\" 5 is past \"extra.steps\" 4"},
      {state_json("",
                  "[\"0000000000000000\",\"0000000000000000\",\"0000000000000000\","
                  "\"0000000000000000\"]"),
       "\"rng\" is all zero (xoshiro256** never leaves that state: not a saved RNG)"},
      {state_json("", "[\"0123456789abcdef\",\"1\",\"2\",\"3\"]"),
       "\"rng\" is not an array of 4 hex strings"},
  };
  for (const Case &k : cases) {
    write_bytes(sp, k.state);
    EXPECT_EQ(load_error(d.step), pre + k.message + "\n");
  }
  write_bytes(sp, state_json("\"lr\":\"0.0003\",\"seed\":\"18446744073709551615\",\"steps\":\"5\","
                             "\"note\":\"free-form -1\""));
  EXPECT_EQ(load_error(d.step), "loaded");
}

// ------------------------------------------------------------ .dsx files

TEST(HostileDsx, OverlappingDuplicateAndTableSectionsAreRefused) {
  TempDir dir;
  std::string p = dir / "p.dsx";
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  rt_dsx_section s[2] = {{(char *)"meta", (void *)"format=1\n", 9},
                         {(char *)"module.step", (void *)"0123456789abcdef", 16}};
  ASSERT_EQ(rt_dsx_write(ctx, p.c_str(), s, 2), DSC_OK);
  std::string good = read_bytes(p);
  auto read_error = [&](const std::string &bytes) {
    write_bytes(p, bytes);
    dsc_context *c = dsc_context_new(nullptr, nullptr);
    rt_dsx *d = nullptr;
    dsc_status st = rt_dsx_read(c, p.c_str(), &d);
    std::string m = st == DSC_OK ? "read" : diags(c);
    rt_dsx_free(c, d);
    dsc_context_free(c);
    return m;
  };
  EXPECT_EQ(read_error(good), "read");
  // entry 1 (at 16 + 36): its offset set to entry 0's, checksum kept right
  std::string b = good;
  size_t e1 = 16 + 32 + 4;
  memcpy(&b[e1], &good[16], 8);       // same offset as "meta"
  memcpy(&b[e1 + 8], &good[24], 8);   // same length
  memcpy(&b[e1 + 16], &good[32], 8);  // same checksum
  EXPECT_EQ(read_error(b),
            p + ": not a valid .dsx file: sections 'meta' and 'module.step' overlap\n");
  b = good;
  uint64_t zero = 16;  // inside the table
  memcpy(&b[16], &zero, 8);
  EXPECT_EQ(read_error(b), p + ": not a valid .dsx file: section 'meta' starts at byte 16, inside "
                               "the section table (95 bytes)\n");
  rt_dsx_section twice[2] = {{(char *)"meta", (void *)"format=1\n", 9},
                             {(char *)"meta", (void *)"format=2\n", 9}};
  ASSERT_EQ(rt_dsx_write(ctx, p.c_str(), twice, 2), DSC_OK);
  EXPECT_EQ(read_error(read_bytes(p)),
            p + ": not a valid .dsx file: section 'meta' appears twice\n");
  dsc_context_free(ctx);
}

}  // namespace
