// Collective ops (start/wait pairs) in the IR, run by the interpreter through
// the in-process communicator: results against references computed here
// (sums bitwise: the communicator adds in rank order), several collectives in
// flight, shape-rule rejections, the missing-communicator and world checks,
// an error on one rank that must not hang the others, and the text form.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "dsc/comm.h"
#include "ir/ir.h"
#include "tests/unit/comm_test_util.h"
#include "tests/unit/test_util.h"

namespace {

using comm_test::Ctx;
using comm_test::run_ranks;

dsc_type T(dsc_dtype dt, std::vector<int64_t> dims) {
  return dsc_type_make(dt, (int)dims.size(), dims.data());
}

// Values in [-1, -0.25] u [0.25, 1] (never zero) with many mantissa bits, per (salt, rank).
std::vector<double> data(uint32_t salt, int rank, size_t n) {
  std::mt19937_64 g(salt * 1000003u + (uint32_t)rank);
  std::uniform_real_distribution<double> u(0.25, 1.0);
  std::vector<double> v(n);
  for (auto &x : v) x = (g() & 1) ? u(g) : -u(g);
  return v;
}

dsc_node *start(dsc_graph *g, dsc_op op, dsc_node *x, int64_t world, int64_t tag, int64_t root = -1,
                const char *group = "world") {
  bool bc = op == DSC_OP_BROADCAST_START; /* world, tag, root, group */
  dsc_attr a[4] = {dsc_attr_int("world", world), dsc_attr_int("tag", tag),
                   bc ? dsc_attr_int("root", root) : dsc_attr_str("group", group),
                   dsc_attr_str("group", group)};
  return dsc_build(g, op, &x, 1, a, bc ? 4 : 3);
}

dsc_node *cwait(dsc_graph *g, dsc_op op, dsc_node *s) {
  return dsc_build(g, op, &s, 1, nullptr, 0);
}

bool same(const dsc_type &a, dsc_type b) { return dsc_type_equal(&a, &b) != 0; }

dsc_tensor *tensor(dsc_context *ctx, dsc_type t, const std::vector<double> &v) {
  dsc_tensor *x = dsc_tensor_new(ctx, t);
  std::memcpy(x->data, v.data(), v.size() * sizeof(double));
  return x;
}

std::vector<double> values(const dsc_tensor *t) {
  return std::vector<double>(t->data, t->data + dsc_type_numel(&t->type));
}

bool bitwise_equal(const std::vector<double> &a, const std::vector<double> &b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}

class CollectiveWorld : public ::testing::TestWithParam<int> {};

// Every collective once, all_reduce and reduce_scatter in flight together,
// on f64 [2*world, 3] data that differs per rank.
TEST_P(CollectiveWorld, AllFourCollectivesMatchTheReference) {
  const int world = GetParam();
  const int64_t rows = 2 * world, cols = 3;
  const size_t n = (size_t)(rows * cols);
  const uint32_t salt = 11;
  std::vector<std::vector<std::vector<double>>> got(world);
  Ctx outer;
  dsc_status st = run_ranks(outer.ctx, world, [&](dsc_comm *c) -> dsc_status {
    dsc_context *ctx = dsc_comm_context(c);
    int rank = dsc_comm_rank(c);
    dsc_module *m = dsc_module_new(ctx, "m");
    dsc_graph *g = dsc_graph_new(m, "g");
    dsc_node *x = dsc_graph_input(g, "x", T(DSC_F64, {rows, cols}));
    dsc_node *ar = start(g, DSC_OP_ALL_REDUCE_START, x, world, 1);
    dsc_node *rs = start(g, DSC_OP_REDUCE_SCATTER_START, x, world, 2);
    dsc_node *arw = cwait(g, DSC_OP_ALL_REDUCE_WAIT, ar);
    dsc_node *rsw = cwait(g, DSC_OP_REDUCE_SCATTER_WAIT, rs);
    dsc_node *ag = cwait(g, DSC_OP_ALL_GATHER_WAIT, start(g, DSC_OP_ALL_GATHER_START, x, world, 3));
    dsc_node *bc =
        cwait(g, DSC_OP_BROADCAST_WAIT, start(g, DSC_OP_BROADCAST_START, x, world, 4, 1));
    dsc_node *outs[4] = {arw, rsw, ag, bc};
    dsc_status s = DSC_ERR_USER;
    if (arw && rsw && ag && bc && dsc_graph_set_outputs(g, outs, 4) == DSC_OK &&
        dsc_module_verify(m) == DSC_OK) {
      dsc_tensor *in = tensor(ctx, T(DSC_F64, {rows, cols}), data(salt, rank, n));
      const dsc_tensor *ins[1] = {in};
      dsc_tensor *res[4] = {};
      dsc_interp_options o = {c};
      s = dsc_interp_run_with(g, nullptr, ins, 1, res, &o);
      if (s == DSC_OK)
        for (int k = 0; k < 4; k++) {
          got[rank].push_back(values(res[k]));
          dsc_tensor_free(ctx, res[k]);
        }
      dsc_tensor_free(ctx, in);
    }
    if (s != DSC_OK) ADD_FAILURE() << "rank " << rank << ": " << diags(ctx);
    dsc_module_free(m);
    return s;
  });
  ASSERT_EQ(st, DSC_OK) << diags(outer.ctx);
  std::vector<double> sum = data(salt, 0, n), gathered;
  for (int r = 1; r < world; r++) {
    std::vector<double> v = data(salt, r, n);
    for (size_t i = 0; i < n; i++) sum[i] += v[i];
  }
  for (int r = 0; r < world; r++) {
    std::vector<double> v = data(salt, r, n);
    gathered.insert(gathered.end(), v.begin(), v.end());
  }
  const size_t chunk = n / (size_t)world;
  for (int r = 0; r < world; r++) {
    ASSERT_EQ(got[r].size(), 4u) << "rank " << r;
    EXPECT_TRUE(bitwise_equal(got[r][0], sum)) << "all_reduce, rank " << r;
    std::vector<double> mine(sum.begin() + (ptrdiff_t)(r * chunk),
                             sum.begin() + (ptrdiff_t)((r + 1) * chunk));
    EXPECT_TRUE(bitwise_equal(got[r][1], mine)) << "reduce_scatter, rank " << r;
    EXPECT_TRUE(bitwise_equal(got[r][2], gathered)) << "all_gather, rank " << r;
    EXPECT_TRUE(bitwise_equal(got[r][3], data(salt, 1, n))) << "broadcast from 1, rank " << r;
  }
}

// Two starts in flight, waited in reverse order; a start with no wait (completed
// at the end of the run); results used by ordinary ops; an f32 all_reduce
// (summed in f64, rounded to f32 once by the wait).
TEST_P(CollectiveWorld, StartsInFlightAndWaitsInAnyOrder) {
  const int world = GetParam();
  const size_t n = 5;
  const uint32_t salt = 23;
  std::vector<std::vector<std::vector<double>>> got(world);
  Ctx outer;
  dsc_status st = run_ranks(outer.ctx, world, [&](dsc_comm *c) -> dsc_status {
    dsc_context *ctx = dsc_comm_context(c);
    int rank = dsc_comm_rank(c);
    dsc_module *m = dsc_module_new(ctx, "m");
    dsc_graph *g = dsc_graph_new(m, "g");
    dsc_node *x = dsc_graph_input(g, "x", T(DSC_F32, {(int64_t)n}));
    dsc_node *a = start(g, DSC_OP_ALL_REDUCE_START, x, world, 7);
    dsc_node *b = start(g, DSC_OP_ALL_GATHER_START, x, world, 7);
    start(g, DSC_OP_BROADCAST_START, x, world, 8, 0); /* never waited in the graph */
    dsc_node *bw = cwait(g, DSC_OP_ALL_GATHER_WAIT, b);
    dsc_node *aw = cwait(g, DSC_OP_ALL_REDUCE_WAIT, a);
    dsc_node *neg = dsc_unary(g, DSC_OP_NEG, aw);
    dsc_node *outs[2] = {neg, bw};
    dsc_status s = DSC_ERR_USER;
    if (neg && bw && dsc_graph_set_outputs(g, outs, 2) == DSC_OK) {
      std::vector<double> v = data(salt, rank, n);
      for (auto &e : v) e = (double)(float)e;
      dsc_tensor *in = tensor(ctx, T(DSC_F32, {(int64_t)n}), v);
      const dsc_tensor *ins[1] = {in};
      dsc_tensor *res[2] = {};
      dsc_interp_options o = {c};
      s = dsc_interp_run_with(g, nullptr, ins, 1, res, &o);
      if (s == DSC_OK)
        for (int k = 0; k < 2; k++) {
          got[rank].push_back(values(res[k]));
          dsc_tensor_free(ctx, res[k]);
        }
      dsc_tensor_free(ctx, in);
    }
    if (s != DSC_OK) ADD_FAILURE() << "rank " << rank << ": " << diags(ctx);
    dsc_module_free(m);
    return s;
  });
  ASSERT_EQ(st, DSC_OK) << diags(outer.ctx);
  std::vector<double> sum(n, 0.0), gathered;
  for (int r = 0; r < world; r++) {
    std::vector<double> v = data(salt, r, n);
    for (size_t i = 0; i < n; i++) {
      double f = (double)(float)v[i];
      sum[i] = r == 0 ? f : sum[i] + f;
      gathered.push_back(f);
    }
  }
  for (auto &e : sum) e = -(double)(float)e;
  for (int r = 0; r < world; r++) {
    ASSERT_EQ(got[r].size(), 2u);
    EXPECT_TRUE(bitwise_equal(got[r][0], sum)) << "rank " << r;
    EXPECT_TRUE(bitwise_equal(got[r][1], gathered)) << "rank " << r;
  }
}

// Rank 0 fails (an embedding id out of range) between two collectives: the
// others wait on the second one, which rank 0 never starts. They must fail
// promptly (rank 0 aborts the communicator), not after the timeout.
TEST_P(CollectiveWorld, ErrorOnOneRankDoesNotHangTheOthers) {
  const int world = GetParam();
  Ctx outer;
  std::vector<std::string> msgs(world);
  auto t0 = std::chrono::steady_clock::now();
  dsc_status st = run_ranks(outer.ctx, world, [&](dsc_comm *c) -> dsc_status {
    dsc_comm_set_timeout(c, 60.0);
    dsc_context *ctx = dsc_comm_context(c);
    int rank = dsc_comm_rank(c);
    dsc_module *m = dsc_module_new(ctx, "m");
    dsc_graph *g = dsc_graph_new(m, "g");
    dsc_node *x = dsc_graph_input(g, "x", T(DSC_F64, {4, 2}));
    dsc_node *ids = dsc_graph_input(g, "ids", T(DSC_I32, {1}));
    dsc_node *a = start(g, DSC_OP_ALL_REDUCE_START, x, world, 1);
    dsc_node *ei[2] = {x, ids};
    dsc_node *e = dsc_build(g, DSC_OP_EMBEDDING, ei, 2, nullptr, 0);
    dsc_node *b = start(g, DSC_OP_ALL_REDUCE_START, e, world, 2);
    dsc_node *outs[2] = {cwait(g, DSC_OP_ALL_REDUCE_WAIT, a), cwait(g, DSC_OP_ALL_REDUCE_WAIT, b)};
    dsc_status s = DSC_ERR_INTERNAL;
    if (outs[0] && outs[1] && dsc_graph_set_outputs(g, outs, 2) == DSC_OK) {
      dsc_tensor *in = tensor(ctx, T(DSC_F64, {4, 2}), data(5, rank, 8));
      dsc_tensor *id = tensor(ctx, T(DSC_I32, {1}), {rank == 0 ? 9.0 : 1.0});
      const dsc_tensor *ins[2] = {in, id};
      dsc_tensor *res[2] = {};
      dsc_interp_options o = {c};
      s = dsc_interp_run_with(g, nullptr, ins, 2, res, &o);
      EXPECT_EQ(res[0], nullptr);
      EXPECT_EQ(res[1], nullptr);
      dsc_tensor_free(ctx, in);
      dsc_tensor_free(ctx, id);
    }
    msgs[rank] = diags(ctx);
    dsc_module_free(m);
    return s;
  });
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(st, DSC_OK);
  EXPECT_LT(secs, 30.0);
  EXPECT_NE(msgs[0].find("runtime error in embedding"), std::string::npos) << msgs[0];
  for (int r = 1; r < world; r++) {
    // depending on timing, the start or the wait of a collective sees the abort
    EXPECT_NE(msgs[r].find("rank 0 aborted: graph 'g' failed: runtime error in embedding"),
              std::string::npos)
        << msgs[r];
    EXPECT_NE(msgs[r].find("the collective failed"), std::string::npos) << msgs[r];
  }
}

// A graph built for another world is rejected on every rank before anything starts.
TEST_P(CollectiveWorld, WorldAttributeMustMatchTheCommunicator) {
  const int world = GetParam();
  Ctx outer;
  std::vector<std::string> msgs(world);
  dsc_status st = run_ranks(outer.ctx, world, [&](dsc_comm *c) -> dsc_status {
    dsc_context *ctx = dsc_comm_context(c);
    dsc_module *m = dsc_module_new(ctx, "m");
    dsc_graph *g = dsc_graph_new(m, "g");
    dsc_node *x = dsc_graph_input(g, "x", T(DSC_F64, {8}));
    dsc_node *w = cwait(g, DSC_OP_ALL_REDUCE_WAIT, start(g, DSC_OP_ALL_REDUCE_START, x, 8, 0));
    dsc_status s = DSC_ERR_INTERNAL;
    if (w && dsc_graph_set_outputs(g, &w, 1) == DSC_OK) {
      dsc_tensor *in = tensor(ctx, T(DSC_F64, {8}), data(3, dsc_comm_rank(c), 8));
      const dsc_tensor *ins[1] = {in};
      dsc_tensor *res[1] = {};
      dsc_interp_options o = {c};
      s = dsc_interp_run_with(g, nullptr, ins, 1, res, &o);
      dsc_tensor_free(ctx, in);
    }
    msgs[dsc_comm_rank(c)] = diags(ctx);
    dsc_module_free(m);
    return s == DSC_ERR_USER ? DSC_OK : DSC_ERR_INTERNAL;
  });
  EXPECT_EQ(st, DSC_OK) << diags(outer.ctx);
  std::string want = "all_reduce_start: node %1 has world 8 but the communicator's world is " +
                     std::to_string(world);
  for (int r = 0; r < world; r++) EXPECT_NE(msgs[r].find(want), std::string::npos) << msgs[r];
}

INSTANTIATE_TEST_SUITE_P(Worlds, CollectiveWorld, ::testing::Values(2, 4));

TEST(Collective, ShapeRules) {
  Ctx c;
  dsc_module *m = dsc_module_new(c.ctx, "m");
  dsc_graph *g = dsc_graph_new(m, "g");
  dsc_node *x = dsc_graph_input(g, "x", T(DSC_F32, {6, 4}));
  dsc_node *rs = start(g, DSC_OP_REDUCE_SCATTER_START, x, 3, 0);
  ASSERT_NE(rs, nullptr) << diags(c.ctx);
  EXPECT_TRUE(same(rs->type, T(DSC_F32, {2, 4})));
  dsc_node *ag = start(g, DSC_OP_ALL_GATHER_START, x, 3, 0);
  ASSERT_NE(ag, nullptr);
  EXPECT_TRUE(same(ag->type, T(DSC_F32, {18, 4})));
  dsc_node *agw = cwait(g, DSC_OP_ALL_GATHER_WAIT, ag);
  ASSERT_NE(agw, nullptr);
  EXPECT_TRUE(dsc_type_equal(&agw->type, &ag->type));
  dsc_node *bc = start(g, DSC_OP_BROADCAST_START, x, 2, 0, 1);
  ASSERT_NE(bc, nullptr);
  EXPECT_TRUE(dsc_type_equal(&bc->type, &x->type));
  EXPECT_EQ(dsc_diag_count(c.ctx), 0) << diags(c.ctx);

  struct Bad {
    std::function<dsc_node *()> build;
    const char *msg;
  } bad[] = {
      {[&] { return start(g, DSC_OP_REDUCE_SCATTER_START, x, 4, 0); },
       "reduce_scatter_start: dim 0 (6) is not divisible by world 4"},
      {[&] { return cwait(g, DSC_OP_ALL_REDUCE_WAIT, ag); },
       "all_reduce_wait: the input must be the matching all_reduce_start, got all_gather_start"},
      {[&] { return cwait(g, DSC_OP_BROADCAST_WAIT, x); },
       "broadcast_wait: the input must be the matching broadcast_start, got input"},
      {[&] { return start(g, DSC_OP_BROADCAST_START, x, 2, 0, 2); },
       "broadcast_start: root 2 is not a rank of world 2"},
      {[&] { return start(g, DSC_OP_ALL_REDUCE_START, x, 0, 0); },
       "all_reduce_start: world must be in [1, "},
      {[&] { return start(g, DSC_OP_ALL_GATHER_START, dsc_const(g, 1, T(DSC_F32, {})), 2, 0); },
       "all_gather_start: the input needs rank >= 1"},
      {[&] { return start(g, DSC_OP_ALL_REDUCE_START, dsc_const(g, 1, T(DSC_BOOL, {2})), 2, 0); },
       "all_reduce_start: sums need a numeric dtype, got bool"},
  };
  for (auto &b : bad) {
    int before = dsc_diag_count(c.ctx);
    EXPECT_EQ(b.build(), nullptr) << b.msg;
    ASSERT_EQ(dsc_diag_count(c.ctx), before + 1) << b.msg;
    EXPECT_NE(std::string(dsc_diag_get(c.ctx, before)->message).find(b.msg), std::string::npos)
        << dsc_diag_get(c.ctx, before)->message;
  }
  dsc_module_free(m);
}

TEST(Collective, NeedsACommunicator) {
  Ctx c;
  dsc_module *m = dsc_module_new(c.ctx, "m");
  dsc_graph *g = dsc_graph_new(m, "g");
  dsc_node *x = dsc_graph_input(g, "x", T(DSC_F64, {2}));
  dsc_node *w = cwait(g, DSC_OP_ALL_REDUCE_WAIT, start(g, DSC_OP_ALL_REDUCE_START, x, 2, 0));
  ASSERT_EQ(dsc_graph_set_outputs(g, &w, 1), DSC_OK);
  dsc_tensor *in = tensor(c.ctx, T(DSC_F64, {2}), {1.5, -2.5});
  const dsc_tensor *ins[1] = {in};
  dsc_tensor *res[1] = {};
  EXPECT_EQ(dsc_interp_run(g, nullptr, ins, 1, res), DSC_ERR_USER);
  EXPECT_EQ(res[0], nullptr);
  dsc_interp_options o = {nullptr};
  EXPECT_EQ(dsc_interp_run_with(g, nullptr, ins, 1, res, &o), DSC_ERR_USER);
  std::string d = diags(c.ctx);
  EXPECT_NE(d.find("graph 'g' has collective ops (all_reduce_start at node %1); run it with a "
                   "communicator"),
            std::string::npos)
      << d;
  dsc_tensor_free(c.ctx, in);
  dsc_module_free(m);
}

// A start's data is in flight: an ordinary op or a graph output may not read it.
TEST(Collective, OnlyTheWaitReadsAStart) {
  for (int as_output = 0; as_output < 2; as_output++) {
    Ctx outer;
    std::string msg;
    dsc_status st = run_ranks(outer.ctx, 1, [&](dsc_comm *c) -> dsc_status {
      dsc_context *ctx = dsc_comm_context(c);
      dsc_module *m = dsc_module_new(ctx, "m");
      dsc_graph *g = dsc_graph_new(m, "g");
      dsc_node *x = dsc_graph_input(g, "x", T(DSC_F64, {3}));
      dsc_node *s = start(g, DSC_OP_ALL_REDUCE_START, x, 1, 0);
      dsc_node *out = as_output ? s : dsc_binary(g, DSC_OP_ADD, s, x);
      dsc_status r = DSC_ERR_INTERNAL;
      if (out && dsc_graph_set_outputs(g, &out, 1) == DSC_OK) {
        dsc_tensor *in = tensor(ctx, T(DSC_F64, {3}), {1, 2, 3});
        const dsc_tensor *ins[1] = {in};
        dsc_tensor *res[1] = {};
        dsc_interp_options o = {c};
        r = dsc_interp_run_with(g, nullptr, ins, 1, res, &o);
        dsc_tensor_free(ctx, in);
      }
      msg = diags(ctx);
      dsc_module_free(m);
      return r == DSC_ERR_USER ? DSC_OK : DSC_ERR_INTERNAL;
    });
    EXPECT_EQ(st, DSC_OK) << msg;
    const char *want = as_output ? "output 0 of graph 'g' is a all_reduce_start (%1) whose data "
                                   "is in flight"
                                 : "add: reads %1, a all_reduce_start whose data is in flight";
    EXPECT_NE(msg.find(want), std::string::npos) << msg;
  }
}

TEST(Collective, TextRoundTripAndVerify) {
  Ctx c;
  dsc_module *m = dsc_module_new(c.ctx, "m");
  dsc_graph *g = dsc_graph_new(m, "g");
  dsc_node *x = dsc_graph_input(g, "x", T(DSC_BF16, {4, 2}));
  dsc_node *a = start(g, DSC_OP_ALL_REDUCE_START, x, 2, 3);
  dsc_node *r = start(g, DSC_OP_REDUCE_SCATTER_START, x, 2, 3);
  dsc_node *outs[4] = {
      cwait(g, DSC_OP_ALL_REDUCE_WAIT, a), cwait(g, DSC_OP_REDUCE_SCATTER_WAIT, r),
      cwait(g, DSC_OP_ALL_GATHER_WAIT, start(g, DSC_OP_ALL_GATHER_START, x, 2, 4)),
      cwait(g, DSC_OP_BROADCAST_WAIT, start(g, DSC_OP_BROADCAST_START, x, 2, 5, 1))};
  ASSERT_EQ(dsc_graph_set_outputs(g, outs, 4), DSC_OK) << diags(c.ctx);
  ASSERT_EQ(dsc_module_verify(m), DSC_OK) << diags(c.ctx);
  char *t1 = dsc_module_print_string(m);
  ASSERT_NE(t1, nullptr);
  std::string s1 = t1;
  dsc_string_free(c.ctx, t1);
  EXPECT_NE(s1.find("broadcast_start"), std::string::npos) << s1;
  EXPECT_NE(s1.find("root"), std::string::npos) << s1;
  dsc_module *m2 = nullptr;
  ASSERT_EQ(dsc_module_parse(c.ctx, s1.data(), s1.size(), "c.dsir", &m2), DSC_OK)
      << diags(c.ctx) << s1;
  EXPECT_EQ(dsc_module_verify(m2), DSC_OK) << diags(c.ctx);
  char *t2 = dsc_module_print_string(m2);
  ASSERT_NE(t2, nullptr);
  EXPECT_EQ(s1, std::string(t2));
  dsc_string_free(c.ctx, t2);
  dsc_module_free(m2);

  // The verifier applies the wait's shape rule to parsed text: swap the two waits' inputs.
  std::string bad = s1;
  size_t p = bad.find("all_reduce_wait(");
  size_t q = bad.find("reduce_scatter_wait(");
  ASSERT_NE(p, std::string::npos);
  ASSERT_NE(q, std::string::npos);
  bad.replace(p, std::strlen("all_reduce_wait"), "reduce_scatter_wait");
  q = bad.find("reduce_scatter_wait(", p + 1);
  bad.replace(q, std::strlen("reduce_scatter_wait"), "all_reduce_wait");
  dsc_module *m3 = nullptr;
  int before = dsc_diag_count(c.ctx);
  dsc_status ps = dsc_module_parse(c.ctx, bad.data(), bad.size(), "bad.dsir", &m3);
  if (ps == DSC_OK) {
    EXPECT_NE(dsc_module_verify(m3), DSC_OK) << bad;
  }
  std::string d;
  for (int i = before; i < dsc_diag_count(c.ctx); i++) d += dsc_diag_get(c.ctx, i)->message;
  EXPECT_NE(d.find("the input must be the matching"), std::string::npos) << d << "\n" << bad;
  dsc_module_free(m3);
  dsc_module_free(m);
}

}  // namespace
