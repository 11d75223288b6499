// The .dsx container (runtime/dsx.c): round trip, and every truncation or
// corruption is a clear error, never a crash.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" {
#include "runtime/runtime.h"
}

namespace {

std::string tmp_path(const char *name) {
  return std::string(DSC_BINARY_DIR) + "/dsx_test_" + name + ".dsx";
}

std::vector<char> slurp(const std::string &p) {
  std::ifstream f(p, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(f), {});
}

void spit(const std::string &p, const std::vector<char> &b) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(b.data(), (std::streamsize)b.size());
}

std::string diags(dsc_context *ctx) {
  std::string s;
  for (int i = 0; i < dsc_diag_count(ctx); i++) {
    const dsc_diag *d = dsc_diag_get(ctx, i);
    s += d->loc.file ? d->loc.file : "", s += ": ", s += d->message, s += "\n";
  }
  return s;
}

TEST(Dsx, RoundTripsSections) {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  std::string big(100000, 'x');
  for (size_t i = 0; i < big.size(); i++) big[i] = (char)(i * 31 + 7);
  rt_dsx_section s[3] = {{(char *)"module.step", (void *)"module m\n", 9},
                         {(char *)"cpu.obj.train_step", big.data(), big.size()},
                         {(char *)"empty", (void *)"", 0}};
  std::string p = tmp_path("roundtrip");
  ASSERT_EQ(rt_dsx_write(ctx, p.c_str(), s, 3), DSC_OK) << diags(ctx);
  rt_dsx *d = nullptr;
  ASSERT_EQ(rt_dsx_read(ctx, p.c_str(), &d), DSC_OK) << diags(ctx);
  ASSERT_EQ(d->n, 3);
  const rt_dsx_section *m = rt_dsx_find(d, "module.step");
  ASSERT_NE(m, nullptr);
  EXPECT_STREQ((const char *)m->data, "module m\n");
  const rt_dsx_section *o = rt_dsx_find(d, "cpu.obj.train_step");
  ASSERT_NE(o, nullptr);
  EXPECT_EQ(std::string((const char *)o->data, o->size), big);
  EXPECT_EQ(rt_dsx_find(d, "empty")->size, 0u);
  EXPECT_EQ(rt_dsx_find(d, "nope"), nullptr);
  rt_dsx_free(ctx, d);
  EXPECT_EQ(dsc_diag_count(ctx), 0);
  dsc_context_free(ctx);
}

TEST(Dsx, TruncationsAndCorruptionsAreErrors) {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  std::string payload(3000, 'a');
  rt_dsx_section s[2] = {{(char *)"one", payload.data(), payload.size()},
                         {(char *)"two", (void *)"hello", 5}};
  std::string p = tmp_path("good"), q = tmp_path("bad");
  ASSERT_EQ(rt_dsx_write(ctx, p.c_str(), s, 2), DSC_OK);
  std::vector<char> good = slurp(p);
  // Every truncation point fails (stepping through header, table and data).
  for (size_t cut = 0; cut < good.size(); cut += cut < 200 ? 1 : 97) {
    spit(q, std::vector<char>(good.begin(), good.begin() + (long)cut));
    rt_dsx *d = nullptr;
    EXPECT_EQ(rt_dsx_read(ctx, q.c_str(), &d), DSC_ERR_USER) << "cut at " << cut;
    EXPECT_EQ(d, nullptr);
    EXPECT_NE(diags(ctx).find("bad.dsx"), std::string::npos) << diags(ctx);
    dsc_diag_clear(ctx);
  }
  // A flipped byte in a section is a checksum error naming the section.
  std::vector<char> flipped = good;
  flipped[flipped.size() - 3] ^= 1;  // inside "two"
  spit(q, flipped);
  rt_dsx *d = nullptr;
  EXPECT_EQ(rt_dsx_read(ctx, q.c_str(), &d), DSC_ERR_USER);
  EXPECT_NE(diags(ctx).find("section 'two' is corrupted"), std::string::npos) << diags(ctx);
  dsc_diag_clear(ctx);
  // Random garbage headers never crash.
  for (int seed = 0; seed < 200; seed++) {
    std::vector<char> g = good;
    unsigned x = (unsigned)seed * 2654435761u + 1;
    for (int k = 0; k < 4; k++) {
      x = x * 1103515245u + 12345u;
      g[16 + (x >> 8) % 64] = (char)(x >> 16);
    }
    spit(q, g);
    d = nullptr;
    dsc_status st = rt_dsx_read(ctx, q.c_str(), &d);
    if (st == DSC_OK) rt_dsx_free(ctx, d);
    dsc_diag_clear(ctx);
  }
  EXPECT_EQ(rt_dsx_read(ctx, (p + ".missing").c_str(), &d), DSC_ERR_USER);
  dsc_context_free(ctx);
  std::remove(p.c_str());
  std::remove(q.c_str());
}

}  // namespace
