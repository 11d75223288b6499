// The in-process communicator: every collective at several world sizes
// against references computed here (bitwise: sums are in rank order), async
// requests, reproducibility, and every failure mode (timeout, abort, a rank
// that fails or leaves, mismatched collectives, bad arguments) reported with
// a message that names it instead of hanging.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "dsc/comm.h"
#include "ir/ir.h"
#include "tests/unit/comm_test_util.h"
#include "tests/unit/test_util.h"

namespace {

using comm_test::Ctx;
using comm_test::run_ranks;

// Deterministic inputs in [-1, -0.25] u [0.25, 1] (never zero), per (salt, rank).
std::vector<double> data(uint32_t salt, int rank, size_t n) {
  std::mt19937_64 g(salt * 1000003u + (uint32_t)rank);
  std::uniform_real_distribution<double> u(0.25, 1.0);
  std::vector<double> v(n);
  for (auto &x : v) x = (g() & 1) ? u(g) : -u(g);
  return v;
}

template <typename T>
std::vector<T> as(const std::vector<double> &v) {
  return std::vector<T>(v.begin(), v.end());
}

// The documented result: ((x0 + x1) + x2) + ... in T's arithmetic.
template <typename T>
std::vector<T> rank_order_sum(uint32_t salt, int world, size_t n) {
  std::vector<T> s = as<T>(data(salt, 0, n));
  for (int r = 1; r < world; r++) {
    std::vector<T> x = as<T>(data(salt, r, n));
    for (size_t i = 0; i < n; i++) s[i] += x[i];
  }
  return s;
}

template <typename T>
bool bitwise_equal(const std::vector<T> &a, const std::vector<T> &b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

dsc_status fail_from(dsc_comm *c, const char *what) {
  ADD_FAILURE() << "rank " << dsc_comm_rank(c) << ": " << what
                << " failed: " << diags(dsc_comm_context(c));
  return DSC_ERR_USER;
}

class CommWorld : public ::testing::TestWithParam<int> {};

TEST_P(CommWorld, EveryCollectiveMatchesTheReferenceBitwise) {
  const int world = GetParam();
  const size_t n = 1003, chunk = 41;
  Ctx ctx;
  dsc_status st = run_ranks(ctx.ctx, world, [&](dsc_comm *c) -> dsc_status {
    int r = dsc_comm_rank(c);
    EXPECT_EQ(dsc_comm_world(c), world);
    EXPECT_STREQ(dsc_comm_backend(c), "inproc");
    EXPECT_EQ(dsc_comm_local_rank(c), r);  // in-process ranks share one node
    EXPECT_EQ(dsc_comm_local_world(c), world);
    // all_reduce sum, f64 and f32: exactly the rank-order sum.
    std::vector<double> x = data(1, r, n), y(n);
    if (dsc_comm_all_reduce(c, x.data(), y.data(), n, DSC_F64, DSC_COMM_SUM, 1))
      return fail_from(c, "ar");
    EXPECT_TRUE(bitwise_equal(y, rank_order_sum<double>(1, world, n)));
    std::vector<float> xf = as<float>(data(2, r, n)), yf(n);
    if (dsc_comm_all_reduce(c, xf.data(), yf.data(), n, DSC_F32, DSC_COMM_SUM, 2))
      return fail_from(c, "ar32");
    EXPECT_TRUE(bitwise_equal(yf, rank_order_sum<float>(2, world, n)));
    // mean, in place: the rank-order sum divided by world.
    if (dsc_comm_all_reduce(c, x.data(), x.data(), n, DSC_F64, DSC_COMM_MEAN, 3))
      return fail_from(c, "mean");
    std::vector<double> mean = rank_order_sum<double>(1, world, n);
    for (auto &m : mean) m /= world;
    EXPECT_TRUE(bitwise_equal(x, mean));
    // i32 sum.
    std::vector<int32_t> xi(n), yi(n), refi(n, 0);
    for (int q = 0; q < world; q++) {
      std::vector<double> d = data(3, q, n);
      for (size_t i = 0; i < n; i++) {
        if (q == r) xi[i] = (int32_t)(d[i] * 1e6);
        refi[i] += (int32_t)(d[i] * 1e6);
      }
    }
    if (dsc_comm_all_reduce(c, xi.data(), yi.data(), n, DSC_I32, DSC_COMM_SUM, 4))
      return fail_from(c, "ari");
    EXPECT_EQ(yi, refi);
    // reduce_scatter: chunk r of the rank-order sum (and mean).
    std::vector<double> rs = data(4, r, chunk * world), rsy(chunk);
    if (dsc_comm_reduce_scatter(c, rs.data(), rsy.data(), chunk * world, DSC_F64, DSC_COMM_SUM, 5))
      return fail_from(c, "rs");
    std::vector<double> full = rank_order_sum<double>(4, world, chunk * world);
    EXPECT_TRUE(bitwise_equal(
        rsy, std::vector<double>(full.begin() + r * chunk, full.begin() + (r + 1) * chunk)));
    std::vector<float> rsf = as<float>(data(5, r, chunk * world)), rsfy(chunk);
    if (dsc_comm_reduce_scatter(c, rsf.data(), rsfy.data(), chunk * world, DSC_F32, DSC_COMM_MEAN,
                                6))
      return fail_from(c, "rs mean");
    std::vector<float> fullf = rank_order_sum<float>(5, world, chunk * world);
    for (size_t i = 0; i < chunk; i++) EXPECT_EQ(rsfy[i], fullf[r * chunk + i] / (float)world);
    // all_gather: rank q's input at offset q * count.
    std::vector<double> g = data(6, r, chunk), gy(chunk * world);
    if (dsc_comm_all_gather(c, g.data(), gy.data(), chunk, DSC_F64, 7)) return fail_from(c, "ag");
    for (int q = 0; q < world; q++) {
      std::vector<double> want = data(6, q, chunk);
      EXPECT_TRUE(bitwise_equal(
          std::vector<double>(gy.begin() + q * chunk, gy.begin() + (q + 1) * chunk), want));
    }
    // broadcast from the last rank, and from rank 0 in bf16 (bytes move as they are).
    int root = world - 1;
    std::vector<double> b = data(7, r, n);
    if (dsc_comm_broadcast(c, b.data(), n, DSC_F64, root, 8)) return fail_from(c, "bc");
    EXPECT_TRUE(bitwise_equal(b, data(7, root, n)));
    uint16_t h[5] = {(uint16_t)(r + 1), 2, 3, 4, (uint16_t)(7 * r + 1)};
    if (dsc_comm_broadcast(c, h, 5, DSC_BF16, 0, 9)) return fail_from(c, "bc16");
    EXPECT_EQ(h[0], 1);
    EXPECT_EQ(h[4], 1);
    if (dsc_comm_barrier(c, 10)) return fail_from(c, "barrier");
    EXPECT_FALSE(dsc_comm_broken(c));
    return DSC_OK;
  });
  EXPECT_EQ(st, DSC_OK) << diags(ctx.ctx);
}

TEST_P(CommWorld, SeveralRequestsInFlightCompleteInAnyWaitOrder) {
  const int world = GetParam();
  const size_t n = 257;
  Ctx ctx;
  dsc_status st = run_ranks(ctx.ctx, world, [&](dsc_comm *c) -> dsc_status {
    int r = dsc_comm_rank(c);
    std::vector<double> a = data(11, r, n), ay(n), g = data(12, r, 9), gy(9 * world);
    std::vector<double> b = data(13, r, 33), rs = data(14, r, 3 * world), rsy(3);
    dsc_comm_request *q[5];
    if (dsc_comm_all_reduce_start(c, a.data(), ay.data(), n, DSC_F64, DSC_COMM_SUM, 1, &q[0]) ||
        dsc_comm_all_gather_start(c, g.data(), gy.data(), 9, DSC_F64, 1, &q[1]) ||
        dsc_comm_broadcast_start(c, b.data(), 33, DSC_F64, 0, 1, &q[2]) ||
        dsc_comm_reduce_scatter_start(c, rs.data(), rsy.data(), 3 * world, DSC_F64, DSC_COMM_SUM, 1,
                                      &q[3]) ||
        dsc_comm_barrier_start(c, 1, &q[4]))
      return fail_from(c, "start");
    for (int i = 4; i >= 0; i--)  // reverse order on purpose
      if (dsc_comm_wait(q[i])) return fail_from(c, "wait");
    EXPECT_TRUE(bitwise_equal(ay, rank_order_sum<double>(11, world, n)));
    for (int p = 0; p < world; p++)
      for (size_t i = 0; i < 9; i++) EXPECT_EQ(gy[p * 9 + i], data(12, p, 9)[i]);
    EXPECT_TRUE(bitwise_equal(b, data(13, 0, 33)));
    std::vector<double> full = rank_order_sum<double>(14, world, 3 * world);
    for (size_t i = 0; i < 3; i++) EXPECT_EQ(rsy[i], full[r * 3 + i]);
    return DSC_OK;
  });
  EXPECT_EQ(st, DSC_OK) << diags(ctx.ctx);
}

INSTANTIATE_TEST_SUITE_P(Worlds, CommWorld, ::testing::Values(1, 2, 3, 4, 8));

TEST(Comm, TwoRunsAreBitwiseIdentical) {
  const int world = 8;
  const size_t n = 4096;
  std::vector<std::vector<float>> out[2];
  for (int run_i = 0; run_i < 2; run_i++) {
    out[run_i].assign(world, std::vector<float>(n));
    Ctx ctx;
    dsc_status st = run_ranks(ctx.ctx, world, [&](dsc_comm *c) -> dsc_status {
      int r = dsc_comm_rank(c);
      // Stagger the ranks differently in each run: the order of arrival must not matter.
      std::this_thread::sleep_for(std::chrono::milliseconds(run_i ? (world - r) : r));
      std::vector<float> x = as<float>(data(21, r, n));
      return dsc_comm_all_reduce(c, x.data(), out[run_i][r].data(), n, DSC_F32, DSC_COMM_SUM, 0);
    });
    ASSERT_EQ(st, DSC_OK) << diags(ctx.ctx);
  }
  for (int r = 0; r < world; r++) {
    EXPECT_TRUE(bitwise_equal(out[0][r], out[1][r])) << "rank " << r;
    EXPECT_TRUE(bitwise_equal(out[0][r], rank_order_sum<float>(21, world, n))) << "rank " << r;
  }
}

TEST(Comm, TimeoutFailsEveryWaitingRankWithANamedError) {
  const int world = 4;
  Ctx ctx;
  std::atomic<int> done{0};
  std::mutex mu;
  std::vector<std::string> msgs(world);
  std::vector<double> secs(world, 0);
  dsc_status st = run_ranks(ctx.ctx, world, [&](dsc_comm *c) -> dsc_status {
    int r = dsc_comm_rank(c);
    EXPECT_EQ(dsc_comm_set_timeout(c, 0.2), DSC_OK);
    double x = r + 1, y = 0;
    if (dsc_comm_all_reduce(c, &x, &y, 1, DSC_F64, DSC_COMM_SUM, 2)) return fail_from(c, "first");
    EXPECT_EQ(y, world * (world + 1) / 2.0);
    if (r == 3) {  // alive but never joins the next collective
      while (done.load() < world - 1) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      return DSC_OK;
    }
    auto t0 = std::chrono::steady_clock::now();
    dsc_status s = dsc_comm_all_reduce(c, &x, &y, 1, DSC_F64, DSC_COMM_SUM, 3);
    std::chrono::duration<double> dt = std::chrono::steady_clock::now() - t0;
    EXPECT_NE(s, DSC_OK);
    EXPECT_TRUE(dsc_comm_broken(c));
    // Later collectives fail at once, not after another timeout.
    t0 = std::chrono::steady_clock::now();
    EXPECT_NE(dsc_comm_barrier(c, 4), DSC_OK);
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 0.1);
    {
      std::lock_guard<std::mutex> g(mu);
      msgs[r] = diags(dsc_comm_context(c));
      secs[r] = dt.count();
    }
    done++;
    return s;
  });
  EXPECT_EQ(st, DSC_ERR_USER);
  for (int r = 0; r < 3; r++) {
    std::string want = "rank " + std::to_string(r) +
                       ": all_reduce #1 (step 3) timed out after 0.2 s waiting for rank 3";
    EXPECT_NE(msgs[r].find(want), std::string::npos) << msgs[r];
    EXPECT_LT(secs[r], 1.5) << "rank " << r;  // about the timeout, generous for loaded machines
    EXPECT_NE(msgs[r].find("barrier #2 (step 4) failed"), std::string::npos) << msgs[r];
  }
  EXPECT_NE(diags(ctx.ctx).find("timed out after 0.2 s waiting for rank 3"), std::string::npos)
      << diags(ctx.ctx);
}

TEST(Comm, AbortOfOneRankFailsTheOthersPromptly) {
  const int world = 4;
  Ctx ctx;
  std::vector<std::string> msgs(world);
  std::mutex mu;
  auto t0 = std::chrono::steady_clock::now();
  dsc_status st = run_ranks(ctx.ctx, world, [&](dsc_comm *c) -> dsc_status {
    int r = dsc_comm_rank(c);  // default timeout (300 s): the abort, not a timeout, ends this
    double x = 1, y;
    if (dsc_comm_all_reduce(c, &x, &y, 1, DSC_F64, DSC_COMM_SUM, 0)) return fail_from(c, "first");
    if (r == 2) {
      dsc_comm_abort(c, "out of data");
      return DSC_ERR_USER;
    }
    dsc_status s = dsc_comm_all_reduce(c, &x, &y, 1, DSC_F64, DSC_COMM_SUM, 1);
    std::lock_guard<std::mutex> g(mu);
    msgs[r] = diags(dsc_comm_context(c));
    return s;
  });
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(st, DSC_ERR_USER);
  EXPECT_LT(secs, 5.0);
  for (int r : {0, 1, 3})
    EXPECT_NE(msgs[r].find("rank " + std::to_string(r) +
                           ": all_reduce #1 (step 1) failed: rank 2 aborted: out of data"),
              std::string::npos)
        << msgs[r];
  EXPECT_NE(diags(ctx.ctx).find("rank 2 aborted: out of data"), std::string::npos)
      << diags(ctx.ctx);
}

TEST(Comm, RankReturningAnErrorOrLeavingEarlyIsNamed) {
  Ctx ctx;
  std::string m0;
  dsc_status st = run_ranks(ctx.ctx, 3, [&](dsc_comm *c) -> dsc_status {
    int r = dsc_comm_rank(c);
    if (r == 1) {
      ir_error(dsc_comm_context(c), ir_no_loc, "batch 7 is corrupt");
      return DSC_ERR_USER;
    }
    double x = 1, y;
    dsc_status s = dsc_comm_all_reduce(c, &x, &y, 1, DSC_F64, DSC_COMM_SUM, 5);
    if (r == 0) m0 = diags(dsc_comm_context(c));
    return s;
  });
  EXPECT_EQ(st, DSC_ERR_USER);
  EXPECT_NE(m0.find("rank 0: all_reduce #0 (step 5) failed: rank 1 failed: batch 7 is corrupt"),
            std::string::npos)
      << m0;
  EXPECT_NE(diags(ctx.ctx).find("batch 7 is corrupt"), std::string::npos);

  // A rank that returns DSC_OK after one collective while the others start a second.
  Ctx ctx2;
  std::string m2;
  st = run_ranks(ctx2.ctx, 3, [&](dsc_comm *c) -> dsc_status {
    int r = dsc_comm_rank(c);
    double x = 1, y;
    if (dsc_comm_all_reduce(c, &x, &y, 1, DSC_F64, DSC_COMM_SUM, 0)) return fail_from(c, "first");
    if (r == 1) return DSC_OK;
    dsc_status s = dsc_comm_barrier(c, 1);
    if (r == 2) m2 = diags(dsc_comm_context(c));
    return s;
  });
  EXPECT_EQ(st, DSC_ERR_USER);
  EXPECT_NE(m2.find("barrier #1 (step 1)"), std::string::npos) << m2;
  EXPECT_NE(m2.find("rank 1 returned from its function after 1 collectives"), std::string::npos)
      << m2;
}

TEST(Comm, MismatchedCollectivesAreReportedNotDeadlocked) {
  struct Case {
    const char *what;
    std::function<dsc_status(dsc_comm *, std::vector<double> &)> rank1;
    const char *expect;
  };
  std::vector<Case> cases = {
      {"kind",
       [](dsc_comm *c, std::vector<double> &v) {
         std::vector<double> out(16);
         return dsc_comm_all_gather(c, v.data(), out.data(), 8, DSC_F64, 0);
       },
       "all_gather (step 0, f64, count 8)"},
      {"length",
       [](dsc_comm *c, std::vector<double> &v) {
         return dsc_comm_all_reduce(c, v.data(), v.data(), 7, DSC_F64, DSC_COMM_SUM, 0);
       },
       "all_reduce (step 0, f64, count 7, sum)"},
      {"step",
       [](dsc_comm *c, std::vector<double> &v) {
         return dsc_comm_all_reduce(c, v.data(), v.data(), 8, DSC_F64, DSC_COMM_SUM, 1);
       },
       "all_reduce (step 1, f64, count 8, sum)"},
  };
  for (const Case &k : cases) {
    Ctx ctx;
    std::vector<std::string> msgs(2);
    dsc_status st = run_ranks(ctx.ctx, 2, [&](dsc_comm *c) -> dsc_status {
      int r = dsc_comm_rank(c);
      std::vector<double> v = data(31, r, 8);
      dsc_status s = r == 0
                         ? dsc_comm_all_reduce(c, v.data(), v.data(), 8, DSC_F64, DSC_COMM_SUM, 0)
                         : k.rank1(c, v);
      msgs[r] = diags(dsc_comm_context(c));
      return s;
    });
    EXPECT_EQ(st, DSC_ERR_USER) << k.what;
    for (int r = 0; r < 2; r++) {
      EXPECT_NE(msgs[r].find("does not match across ranks"), std::string::npos)
          << k.what << msgs[r];
      EXPECT_NE(msgs[r].find("all_reduce (step 0, f64, count 8, sum)"), std::string::npos)
          << msgs[r];
      EXPECT_NE(msgs[r].find(k.expect), std::string::npos) << k.what << msgs[r];
    }
  }
}

TEST(Comm, BadArgumentsFailOnTheCallerAndKeepRanksInStep) {
  Ctx ctx;
  std::vector<std::string> msgs(4);
  dsc_status st = run_ranks(ctx.ctx, 4, [&](dsc_comm *c) -> dsc_status {
    int r = dsc_comm_rank(c);
    dsc_context *rc = dsc_comm_context(c);
    std::vector<double> v(10, 1.0), out(10);
    dsc_comm_request *req = reinterpret_cast<dsc_comm_request *>(&v);  // must be reset to NULL
    EXPECT_EQ(
        dsc_comm_reduce_scatter_start(c, v.data(), out.data(), 10, DSC_F64, DSC_COMM_SUM, 2, &req),
        DSC_ERR_USER);
    EXPECT_EQ(req, nullptr);
    EXPECT_EQ(dsc_comm_broadcast(c, v.data(), 10, DSC_F64, 4, 2), DSC_ERR_USER);
    EXPECT_EQ(dsc_comm_all_reduce(c, v.data(), out.data(), 10, DSC_BF16, DSC_COMM_SUM, 2),
              DSC_ERR_USER);
    EXPECT_EQ(dsc_comm_all_reduce(c, v.data(), out.data(), 10, DSC_I32, DSC_COMM_MEAN, 2),
              DSC_ERR_USER);
    EXPECT_EQ(dsc_comm_all_gather(c, v.data(), out.data(), -1, DSC_F64, 2), DSC_ERR_USER);
    EXPECT_EQ(dsc_comm_all_gather(c, nullptr, out.data(), 1, DSC_F64, 2), DSC_ERR_USER);
    EXPECT_EQ(dsc_comm_set_timeout(c, 0), DSC_ERR_USER);
    EXPECT_EQ(dsc_comm_timeout(c), DSC_COMM_DEFAULT_TIMEOUT);
    msgs[r] = diags(rc);
    EXPECT_FALSE(dsc_comm_broken(c));
    // Rejected calls took no collective number: this one is #0 on every rank and works.
    dsc_diag_clear(rc);
    double x = r, y = 0;
    dsc_status s = dsc_comm_all_reduce(c, &x, &y, 1, DSC_F64, DSC_COMM_SUM, 3);
    EXPECT_EQ(y, 6.0);
    return s;
  });
  EXPECT_EQ(st, DSC_OK) << diags(ctx.ctx);
  const std::string &m = msgs[1];
  EXPECT_NE(
      m.find(
          "rank 1: reduce_scatter (step 2): input length 10 does not divide by the world size 4"),
      std::string::npos)
      << m;
  EXPECT_NE(m.find("root 4 is not a rank (world 4)"), std::string::npos) << m;
  EXPECT_NE(m.find("cannot sum dtype bf16"), std::string::npos) << m;
  EXPECT_NE(m.find("cannot average dtype i32"), std::string::npos) << m;
  EXPECT_NE(m.find("negative count -1"), std::string::npos) << m;
  EXPECT_NE(m.find("NULL buffer"), std::string::npos) << m;
  EXPECT_NE(m.find("timeout must be a positive number"), std::string::npos) << m;

  Ctx bad;
  EXPECT_EQ(run_ranks(bad.ctx, 0, [](dsc_comm *) { return DSC_OK; }), DSC_ERR_USER);
  EXPECT_NE(diags(bad.ctx).find("world size must be in [1, 1024], got 0"), std::string::npos);
}

TEST(Comm, TimeoutComesFromTheEnvironment) {
  const char *old = std::getenv("DSC_COMM_TIMEOUT");
  std::string saved = old ? old : "";
  setenv("DSC_COMM_TIMEOUT", "1.5", 1);
  Ctx ctx;
  std::atomic<int> seen{0};
  EXPECT_EQ(run_ranks(ctx.ctx, 2,
                      [&](dsc_comm *c) {
                        if (dsc_comm_timeout(c) == 1.5) seen++;
                        return DSC_OK;
                      }),
            DSC_OK);
  EXPECT_EQ(seen.load(), 2);
  setenv("DSC_COMM_TIMEOUT", "soon", 1);
  Ctx bad;
  EXPECT_EQ(run_ranks(bad.ctx, 2, [](dsc_comm *) { return DSC_OK; }), DSC_ERR_USER);
  EXPECT_NE(diags(bad.ctx).find(
                "DSC_COMM_TIMEOUT: expected a positive number of seconds, got 'soon'"),
            std::string::npos)
      << diags(bad.ctx);
  if (old)
    setenv("DSC_COMM_TIMEOUT", saved.c_str(), 1);
  else
    unsetenv("DSC_COMM_TIMEOUT");
}

TEST(Comm, MpiAvailabilityIsReported) {
  Ctx ctx;
  if (!dsc_comm_have_mpi()) {
    dsc_comm *c = reinterpret_cast<dsc_comm *>(&ctx);
    EXPECT_EQ(dsc_comm_mpi_new(ctx.ctx, &c), DSC_ERR_USER);
    EXPECT_EQ(c, nullptr);
    EXPECT_NE(diags(ctx.ctx).find("built without MPI"), std::string::npos);
  } else {
    GTEST_SKIP() << "built with MPI: tests/mpi/comm_mpi_test.c runs under mpirun";
  }
}

}  // namespace
