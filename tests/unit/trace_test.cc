// The trace writer (runtime/trace.c): events from several threads land whole
// and escaped in one JSON file; the overlap figures; a bad path is an error;
// a NULL trace is a no-op.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "dsc/trace.h"
#include "ir/ir.h"

namespace {

struct Ctx {
  dsc_context *c = dsc_context_new(nullptr, nullptr);
  ~Ctx() { dsc_context_free(c); }
};

std::string slurp(const std::string &path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

size_t count(const std::string &s, const std::string &what) {
  size_t n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) n++;
  return n;
}

std::string tmp_path(const char *name) {
  return std::string(DSC_BINARY_DIR) + "/trace_test_" + name + ".json";
}

TEST(Trace, ThreadsWriteWholeEscapedEvents) {
  Ctx ctx;
  std::string path = tmp_path("threads");
  dsc_trace *t = nullptr;
  ASSERT_EQ(dsc_trace_open(ctx.c, path.c_str(), &t), DSC_OK);
  const int threads = 4, per = 500;
  std::vector<std::thread> ts;
  for (int r = 0; r < threads; r++)
    ts.emplace_back([t, r] {
      for (int i = 0; i < per; i++) {
        int64_t t0 = dsc_trace_now_ns();
        dsc_trace_span(t, r, DSC_TRACE_COMPUTE, "kernel", t0, t0 + 1500 + i, "{\"i\":1}",
                       "a\"b\\c\n");
      }
    });
  for (auto &th : ts) th.join();
  // 2 metadata events per track (6 tracks) + 2 per rank, then the spans
  EXPECT_EQ(dsc_trace_event_count(t), threads * (per + 2 + 2 * 6));
  ASSERT_EQ(dsc_trace_close(t), DSC_OK);
  std::string s = slurp(path);
  EXPECT_EQ(s.rfind("{\"traceEvents\":[\n", 0), 0u);
  EXPECT_EQ(s.substr(s.size() - 3), "}}\n");
  EXPECT_EQ(count(s, "\"ph\":\"X\""), size_t(threads * per));
  EXPECT_EQ(count(s, "\"name\":\"a\\\"b\\\\c\\u000a\""), size_t(threads * per));
  for (int r = 0; r < threads; r++)
    EXPECT_EQ(count(s, "\"args\":{\"name\":\"rank " + std::to_string(r) + "\"}"), 1u) << r;
  EXPECT_EQ(count(s, "\"args\":{\"name\":\"wait\"}"), size_t(threads));
  EXPECT_EQ(count(s, "\"args\":{\"name\":\"host stream\"}"), size_t(threads));
  // 1500 ns -> "1.500" us
  EXPECT_NE(s.find("\"dur\":1.500,"), std::string::npos);
  EXPECT_EQ(s.find("hidden_comm_share"), std::string::npos);  // no collectives
  std::remove(path.c_str());
}

TEST(Trace, OverlapFigures) {
  Ctx ctx;
  std::string path = tmp_path("overlap");
  dsc_trace *t = nullptr;
  ASSERT_EQ(dsc_trace_open(ctx.c, path.c_str(), &t), DSC_OK);
  dsc_trace_overlap o;
  dsc_trace_get_overlap(t, &o);
  EXPECT_EQ(o.collectives, 0);
  EXPECT_EQ(dsc_trace_hidden_share(&o), -1);
  dsc_trace_add_overlap(t, 0, 1000, 250, 2);
  dsc_trace_add_overlap(t, 3, 3000, 1750, 5);
  dsc_trace_add_overlap(t, 3, 0, 0, 0);
  dsc_trace_get_overlap(t, &o);
  EXPECT_EQ(o.ranks, 2);
  EXPECT_EQ(o.collectives, 7);
  EXPECT_DOUBLE_EQ(o.comm_s, 4000e-9);
  EXPECT_DOUBLE_EQ(o.wait_s, 2000e-9);
  EXPECT_DOUBLE_EQ(dsc_trace_hidden_share(&o), 0.5);
  EXPECT_EQ(dsc_trace_hidden_host_share(&o), -1);
  dsc_trace_add_host(t, 3, 8000, 2000);
  dsc_trace_get_overlap(t, &o);
  EXPECT_DOUBLE_EQ(o.host_busy_s, 8000e-9);
  EXPECT_DOUBLE_EQ(dsc_trace_hidden_host_share(&o), 0.75);
  ASSERT_EQ(dsc_trace_close(t), DSC_OK);
  std::string s = slurp(path);
  EXPECT_NE(s.find("\"3\":{\"collectives\":5,\"comm_us\":3.000,\"wait_us\":1.750,"
                   "\"host_busy_us\":8.000,\"host_wait_us\":2.000}"),
            std::string::npos)
      << s;
  EXPECT_NE(s.find("\"hidden_comm_share\":0.500000"), std::string::npos) << s;
  std::remove(path.c_str());
}

TEST(Trace, BadPathsAndNull) {
  Ctx ctx;
  dsc_trace *t = nullptr;
  EXPECT_EQ(dsc_trace_open(ctx.c, "/nonexistent-dir/x/t.json", &t), DSC_ERR_USER);
  EXPECT_EQ(t, nullptr);
  ASSERT_GE(dsc_diag_count(ctx.c), 1);
  EXPECT_NE(std::string(dsc_diag_get(ctx.c, 0)->message).find("cannot open the trace"),
            std::string::npos);
  EXPECT_EQ(dsc_trace_open(ctx.c, DSC_BINARY_DIR, &t), DSC_ERR_USER);
  EXPECT_NE(std::string(dsc_diag_get(ctx.c, 1)->message).find("is a directory"), std::string::npos);
  // NULL: every call is a no-op
  dsc_trace_span(nullptr, 0, DSC_TRACE_STEP, nullptr, 0, 1, nullptr, "x");
  dsc_trace_spanf(nullptr, 0, DSC_TRACE_STEP, 0, 1, "%d", 1);
  dsc_trace_add_overlap(nullptr, 0, 1, 1, 1);
  EXPECT_EQ(dsc_trace_event_count(nullptr), 0);
  EXPECT_EQ(dsc_trace_close(nullptr), DSC_OK);
}

TEST(Trace, FormatBytes) {
  char b[32];
  EXPECT_STREQ(dsc_trace_format_bytes(b, sizeof b, 4), "4 B");
  EXPECT_STREQ(dsc_trace_format_bytes(b, sizeof b, 65536), "65.5 KB");
  EXPECT_STREQ(dsc_trace_format_bytes(b, sizeof b, 3100000), "3.1 MB");
  EXPECT_STREQ(dsc_trace_format_bytes(b, sizeof b, 2500000000LL), "2.5 GB");
}

}  // namespace
