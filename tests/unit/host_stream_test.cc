// The CPU executor's host stream (runtime/host_stream.c): items run one at
// a time in post order on the stream's thread; a waiting poster runs the
// items not started itself; a failed item stops the stream until the next
// begin; cancel starts nothing more.
#include <gtest/gtest.h>

#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "runtime/runtime.h"
#include "tests/unit/test_util.h"

namespace {

struct Log {
  std::mutex mu;
  std::vector<int> order;
  int by_poster = 0;
  int fail_at = -1;
  int sleep_us = 0;
  int running = 0, most_running = 0;
};

bool record(void *arg, int item, bool poster, char *err, size_t errlen) {
  Log *l = static_cast<Log *>(arg);
  {
    std::lock_guard<std::mutex> g(l->mu);
    l->running++;
    if (l->running > l->most_running) l->most_running = l->running;
  }
  if (l->sleep_us) std::this_thread::sleep_for(std::chrono::microseconds(l->sleep_us));
  std::lock_guard<std::mutex> g(l->mu);
  l->running--;
  if (item == l->fail_at) {
    snprintf(err, errlen, "item %d failed", item);
    return false;
  }
  l->order.push_back(item);
  l->by_poster += poster;
  return true;
}

TEST(HostStream, ItemsRunOneAtATimeInPostOrderAndAWaitingPosterRunsTheRest) {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  Log log;
  log.sleep_us = 500;
  rt_host_stream *s = rt_host_stream_new(ctx, 64, record, &log);
  ASSERT_NE(s, nullptr) << diags(ctx);
  for (int run = 0; run < 3; run++) {
    log.order.clear();
    log.by_poster = 0;
    rt_host_stream_begin(s);
    for (int i = 0; i < 40; i++) ASSERT_TRUE(rt_host_stream_post(s, 100 + i));
    char err[200] = "";
    ASSERT_TRUE(rt_host_stream_wait(s, 10, err, sizeof err)) << err;
    {
      std::lock_guard<std::mutex> g(log.mu);
      EXPECT_GE(log.order.size(), 10u);
    }
    ASSERT_TRUE(rt_host_stream_wait(s, 40, err, sizeof err)) << err;
    ASSERT_EQ(log.order.size(), 40u);
    for (int i = 0; i < 40; i++) EXPECT_EQ(log.order[i], 100 + i);
    // 40 items of 0.5 ms posted at once: the stream's thread is far from
    // done when the poster waits, so the poster ran some of them
    EXPECT_GT(log.by_poster, 0);
    EXPECT_EQ(log.most_running, 1);
    int64_t busy = 0, waited = 0;
    rt_host_stream_times(s, &busy, &waited);
    EXPECT_GE(busy, 40 * 500 * 1000);
    EXPECT_GT(waited, 0);
    EXPECT_LE(waited, busy + 50 * 1000 * 1000);
  }
  // room for 64 posts per run
  rt_host_stream_begin(s);
  for (int i = 0; i < 64; i++) EXPECT_TRUE(rt_host_stream_post(s, i));
  EXPECT_FALSE(rt_host_stream_post(s, 64));
  char err[200] = "";
  EXPECT_TRUE(rt_host_stream_wait(s, 1000, err, sizeof err)) << err;  // n past posted: all
  rt_host_stream_free(s);
  dsc_context_free(ctx);
}

TEST(HostStream, AFailedItemStopsTheStreamUntilTheNextBeginAndCancelStartsNothingMore) {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  Log log;
  log.fail_at = 5;
  rt_host_stream *s = rt_host_stream_new(ctx, 16, record, &log);
  ASSERT_NE(s, nullptr) << diags(ctx);
  rt_host_stream_begin(s);
  for (int i = 0; i < 10; i++) ASSERT_TRUE(rt_host_stream_post(s, i));
  char err[200] = "";
  EXPECT_TRUE(rt_host_stream_wait(s, 5, err, sizeof err)) << err;
  EXPECT_FALSE(rt_host_stream_wait(s, 10, err, sizeof err));
  EXPECT_EQ(std::string(err), "item 5 failed");
  EXPECT_EQ(log.order, (std::vector<int>{0, 1, 2, 3, 4}));
  // the next run starts clean
  log.fail_at = -1;
  log.order.clear();
  rt_host_stream_begin(s);
  for (int i = 0; i < 3; i++) ASSERT_TRUE(rt_host_stream_post(s, i));
  EXPECT_TRUE(rt_host_stream_wait(s, 3, err, sizeof err)) << err;
  EXPECT_EQ(log.order, (std::vector<int>{0, 1, 2}));
  // cancel: the running item finishes, no other starts
  log.order.clear();
  log.sleep_us = 20000;
  rt_host_stream_begin(s);
  for (int i = 0; i < 10; i++) ASSERT_TRUE(rt_host_stream_post(s, i));
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  rt_host_stream_cancel(s);
  size_t after_cancel;
  {
    std::lock_guard<std::mutex> g(log.mu);
    after_cancel = log.order.size();
    EXPECT_EQ(log.running, 0);
  }
  EXPECT_LE(after_cancel, 2u);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  {
    std::lock_guard<std::mutex> g(log.mu);
    EXPECT_EQ(log.order.size(), after_cancel);
  }
  rt_host_stream_begin(s);  // idle again: a new run works
  ASSERT_TRUE(rt_host_stream_post(s, 7));
  log.sleep_us = 0;
  EXPECT_TRUE(rt_host_stream_wait(s, 1, err, sizeof err)) << err;
  EXPECT_EQ(log.order.back(), 7);
  rt_host_stream_free(s);
  dsc_context_free(ctx);
}

}  // namespace
