// Autodiff: every gradient rule against central finite differences in f64,
// a whole tiny GPT, and the pass's error paths.
//
// Gradient checks: loss = sum(op(params...) * R) with R a random graph input,
// params overwritten with seeded random values away from kinks. Each gradient
// element a is compared with fd = (L(p+h) - L(p-h)) / 2h, h = 1e-6, and must
// satisfy |a - fd| / max(|a|, |fd|, 1e-3) < 1e-6 (whole GPT: h = 1e-5, see
// kModelRelTol).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "dsc/dsc.h"
#include "ir/ir.h"
#include "passes/passes.h"
#include "tests/unit/test_util.h"

namespace {

constexpr double kStep = 1e-6;    // central-difference step h
constexpr double kRelTol = 1e-6;  // bound on |a - fd| / max(|a|, |fd|, kFloor)
constexpr double kFloor = 1e-3;   // denominator floor for near-zero gradients
// Whole-model checks: L = cross entropy ~ 3.5 after thousands of ops carries a
// few ulps of roundoff, i.e. |fd| noise ~ 1e-9 with h = 1e-6, which is 1e-6
// relative at the 1e-3 floor. A larger step, h = 1e-5, cuts that noise tenfold
// while the truncation error (h^2/6 times the third derivative, ~2e-11) stays
// far below, so the bound is the same 1e-6. A wrong rule shows errors >= 1e-2.
constexpr double kModelStep = 1e-5;
constexpr double kModelRelTol = 1e-6;

using Gen = std::function<double(std::mt19937_64 &)>;

// |x| in [0.2, 1.2] with a random sign: away from the kinks of relu/abs at 0.
double away(std::mt19937_64 &r) {
  double u = std::uniform_real_distribution<double>(0.2, 1.2)(r);
  return (r() & 1) ? u : -u;
}
double positive(std::mt19937_64 &r) { return std::uniform_real_distribution<double>(0.5, 2.0)(r); }
double normal(std::mt19937_64 &r) { return std::normal_distribution<double>(0.0, 1.0)(r); }
// Two interleaved grids 0.05 apart, so maximum(a, b) never sees a tie.
double grid_a(std::mt19937_64 &r) {
  return 0.1 * (double)std::uniform_int_distribution<int>(-10, 10)(r) + 0.05;
}
double grid_b(std::mt19937_64 &r) {
  return 0.1 * (double)std::uniform_int_distribution<int>(-10, 10)(r);
}

dsc_type ty(std::vector<int64_t> dims, dsc_dtype dt = DSC_F64) {
  return dsc_type_make(dt, (int)dims.size(), dims.data());
}

struct Harness {
  dsc_context *ctx;
  dsc_module *m;
  dsc_graph *g;
  std::mt19937_64 rng;
  std::vector<dsc_tensor *> inputs;
  std::vector<Gen> gens;  // per module param
  double max_err = 0;
  std::string graph = "f";

  explicit Harness(uint64_t seed = 1, dsc_alloc_fn alloc = nullptr, void *ud = nullptr)
      : rng(seed) {
    ctx = dsc_context_new(alloc, ud);
    m = dsc_module_new(ctx, "t");
    g = dsc_graph_new(m, "f");
  }
  // Adopts a module compiled elsewhere (made with this->ctx).
  void adopt(dsc_module *mod, const char *graph_name) {
    dsc_module_free(m);
    m = mod;
    graph = graph_name;
    g = dsc_module_find_graph(m, graph_name);
    ASSERT_NE(g, nullptr);
  }
  ~Harness() {
    for (dsc_tensor *t : inputs) dsc_tensor_free(ctx, t);
    dsc_module_free(m);
    dsc_context_free(ctx);
  }

  dsc_node *param(const char *name, std::vector<int64_t> dims, Gen gen = away) {
    dsc_init init = {DSC_INIT_ZEROS, 0, 0, NULL};
    EXPECT_EQ(dsc_module_add_param(m, name, ty(dims), init), DSC_OK);
    gens.push_back(gen);
    return dsc_param_ref(g, name);
  }

  dsc_node *input(const char *name, dsc_type t, const std::function<double()> &fill) {
    dsc_node *n = dsc_graph_input(g, name, t);
    dsc_tensor *v = dsc_tensor_new(ctx, t);
    for (int64_t i = 0; i < dsc_type_numel(&t); i++) v->data[i] = fill();
    inputs.push_back(v);
    return n;
  }
  dsc_node *random_input(const char *name, std::vector<int64_t> dims, Gen gen = normal) {
    return input(name, ty(dims), [&] { return gen(rng); });
  }
  dsc_node *ids(const char *name, std::vector<int64_t> dims, int64_t V, dsc_dtype dt = DSC_I32) {
    return input(name, ty(dims, dt),
                 [&] { return (double)std::uniform_int_distribution<int64_t>(0, V - 1)(rng); });
  }

  // loss = sum(y * R), R a random input of y's shape.
  void weighted_sum_loss(dsc_node *y) {
    ASSERT_NE(y, nullptr) << diags(ctx);
    dsc_type t = dsc_node_type(y);
    std::vector<int64_t> dims(t.dims, t.dims + t.rank), axes;
    for (int i = 0; i < t.rank; i++) axes.push_back(i);
    dsc_node *r = random_input("r", dims);
    dsc_node *loss = dsc_reduce(g, DSC_OP_SUM, dsc_binary(g, DSC_OP_MUL, y, r), axes.data(),
                                (int)axes.size(), 0);
    set_loss(loss);
  }
  void set_loss(dsc_node *loss) {
    ASSERT_NE(loss, nullptr) << diags(ctx);
    ASSERT_EQ(dsc_graph_set_outputs(g, &loss, 1), DSC_OK);
  }

  // Runs the graph; returns all outputs (caller frees) or an empty vector.
  std::vector<dsc_tensor *> run(const dsc_params *p) {
    std::vector<dsc_tensor *> outs(dsc_graph_output_count(g));
    if (dsc_interp_run(g, p, inputs.data(), (int)inputs.size(), outs.data()) != DSC_OK) return {};
    return outs;
  }
  double loss_at(const dsc_params *p) {
    std::vector<dsc_tensor *> outs = run(p);
    EXPECT_FALSE(outs.empty()) << diags(ctx);
    if (outs.empty()) return NAN;
    double l = outs[0]->data[0];
    for (dsc_tensor *t : outs) dsc_tensor_free(ctx, t);
    return l;
  }

  // Differentiates, verifies, and compares gradients with finite differences.
  // samples < 0: every element; otherwise about that many in total, spread
  // over the params in proportion to their size (at least 2 each).
  void check(int samples = -1, double tol = kRelTol, double step = kStep) {
    int np = dsc_module_param_count(m);
    ASSERT_EQ(dsc_autodiff(m, graph.c_str()), DSC_OK) << diags(ctx);
    ASSERT_EQ(dsc_module_verify(m), DSC_OK) << diags(ctx);
    ASSERT_EQ(dsc_graph_output_count(g), np + 1);
    ASSERT_EQ((int)gens.size(), np);
    dsc_params *P = dsc_params_init(m, 7);
    ASSERT_NE(P, nullptr);
    for (int p = 0; p < np; p++) {
      dsc_tensor *t = dsc_params_get(P, p);
      for (int64_t i = 0; i < dsc_type_numel(&t->type); i++) t->data[i] = gens[p](rng);
    }
    std::vector<dsc_tensor *> outs = run(P);
    ASSERT_FALSE(outs.empty()) << diags(ctx);
    int64_t total = dsc_module_param_numel(m);
    for (int p = 0; p < np; p++) {
      dsc_tensor *t = dsc_params_get(P, p), *gr = outs[1 + p];
      ASSERT_TRUE(dsc_type_equal(&t->type, &gr->type)) << dsc_module_param_name(m, p);
      int64_t n = dsc_type_numel(&t->type);
      std::vector<int64_t> idx;
      if (samples < 0) {
        for (int64_t i = 0; i < n; i++) idx.push_back(i);
      } else {
        int64_t k = std::max<int64_t>(2, (int64_t)samples * n / total);
        for (int64_t j = 0; j < std::min(k, n); j++)
          idx.push_back(std::uniform_int_distribution<int64_t>(0, n - 1)(rng));
      }
      bool any_nonzero = false;
      for (int64_t i = 0; i < n; i++) any_nonzero |= std::fabs(gr->data[i]) > 1e-9;
      EXPECT_TRUE(any_nonzero) << "gradient of " << dsc_module_param_name(m, p) << " is all zero";
      for (int64_t i : idx) {
        double old = t->data[i];
        t->data[i] = old + step;
        double lp = loss_at(P);
        t->data[i] = old - step;
        double lm = loss_at(P);
        t->data[i] = old;
        double fd = (lp - lm) / (2 * step), a = gr->data[i];
        double err = std::fabs(a - fd) / std::max({std::fabs(a), std::fabs(fd), kFloor});
        max_err = std::max(max_err, err);
        EXPECT_LT(err, tol) << dsc_module_param_name(m, p) << "[" << i << "]: autodiff " << a
                            << ", finite difference " << fd;
      }
    }
    for (dsc_tensor *o : outs) dsc_tensor_free(ctx, o);
    dsc_params_free(P);
    if (getenv("DSC_AUTODIFF_VERBOSE"))
      printf("%s: max relative error %.3g\n",
             ::testing::UnitTest::GetInstance()->current_test_info()->name(), max_err);
  }
};

dsc_node *build1(dsc_graph *g, dsc_op op, dsc_node *x, std::vector<dsc_attr> attrs) {
  return dsc_build(g, op, &x, 1, attrs.data(), (int)attrs.size());
}

// ---------------------------------------------------------------- binary ops

void binary_case(dsc_op op, std::vector<int64_t> da, std::vector<int64_t> db, Gen ga, Gen gb) {
  Harness h;
  dsc_node *a = h.param("a", da, ga), *b = h.param("b", db, gb);
  h.weighted_sum_loss(dsc_binary(h.g, op, a, b));
  h.check();
}

TEST(AutodiffGrad, AddBroadcastsBothWays) {
  binary_case(DSC_OP_ADD, {2, 3, 4}, {3, 1}, away, away);
  binary_case(DSC_OP_ADD, {3, 1}, {2, 1, 4}, away, away);
}
TEST(AutodiffGrad, SubBroadcasts) { binary_case(DSC_OP_SUB, {3, 1}, {2, 3, 4}, away, away); }
TEST(AutodiffGrad, MulBroadcasts) {
  binary_case(DSC_OP_MUL, {2, 1, 4}, {3, 4}, away, away);
  binary_case(DSC_OP_MUL, {}, {3, 4}, away, away);
}
TEST(AutodiffGrad, DivBroadcasts) { binary_case(DSC_OP_DIV, {2, 3, 4}, {4}, away, positive); }
TEST(AutodiffGrad, MaximumBroadcastsAwayFromTies) {
  binary_case(DSC_OP_MAXIMUM, {2, 3, 4}, {3, 1}, grid_a, grid_b);
}

TEST(AutodiffGrad, MaximumSplitsTiesEqually) {
  Harness h;
  dsc_node *a = h.param("a", {4}), *b = h.param("b", {4});
  dsc_node *y = dsc_binary(h.g, DSC_OP_MAXIMUM, a, b);
  h.set_loss(dsc_reduce(h.g, DSC_OP_SUM, y, std::vector<int64_t>{0}.data(), 1, 0));
  ASSERT_EQ(dsc_autodiff(h.m, "f"), DSC_OK) << diags(h.ctx);
  dsc_params *P = dsc_params_init(h.m, 1);
  double av[4] = {1, 2, 3, 4}, bv[4] = {1, 5, 3, 0};
  memcpy(dsc_params_get(P, 0)->data, av, sizeof av);
  memcpy(dsc_params_get(P, 1)->data, bv, sizeof bv);
  std::vector<dsc_tensor *> outs = h.run(P);
  ASSERT_EQ(outs.size(), 3u) << diags(h.ctx);
  double ga[4] = {0.5, 0, 0.5, 1}, gb[4] = {0.5, 1, 0.5, 0};
  for (int i = 0; i < 4; i++) {
    EXPECT_EQ(outs[1]->data[i], ga[i]) << i;
    EXPECT_EQ(outs[2]->data[i], gb[i]) << i;
  }
  for (dsc_tensor *t : outs) dsc_tensor_free(h.ctx, t);
  dsc_params_free(P);
}

TEST(AutodiffGrad, WhereBroadcastsAndSkipsCondition) {
  Harness h;
  dsc_node *c = h.random_input("c", {2, 3, 4});
  dsc_node *cond = dsc_binary(h.g, DSC_OP_GREATER, c, dsc_const(h.g, 0.0, ty({})));
  dsc_node *a = h.param("a", {3, 4}), *b = h.param("b", {2, 1, 4});
  dsc_node *in[3] = {cond, a, b};
  h.weighted_sum_loss(dsc_build(h.g, DSC_OP_WHERE, in, 3, nullptr, 0));
  h.check();
}

// ---------------------------------------------------------------- unary ops

void unary_case(dsc_op op, Gen gen, std::vector<dsc_attr> attrs = {}) {
  Harness h;
  dsc_node *x = h.param("x", {3, 4}, gen);
  h.weighted_sum_loss(build1(h.g, op, x, attrs));
  h.check();
}

TEST(AutodiffGrad, Neg) { unary_case(DSC_OP_NEG, away); }
TEST(AutodiffGrad, Exp) { unary_case(DSC_OP_EXP, away); }
TEST(AutodiffGrad, Log) { unary_case(DSC_OP_LOG, positive); }
TEST(AutodiffGrad, Sqrt) { unary_case(DSC_OP_SQRT, positive); }
TEST(AutodiffGrad, Rsqrt) { unary_case(DSC_OP_RSQRT, positive); }
TEST(AutodiffGrad, Tanh) { unary_case(DSC_OP_TANH, away); }
TEST(AutodiffGrad, ReluAwayFromZero) { unary_case(DSC_OP_RELU, away); }
TEST(AutodiffGrad, Gelu) { unary_case(DSC_OP_GELU, normal); }
TEST(AutodiffGrad, Silu) { unary_case(DSC_OP_SILU, normal); }
TEST(AutodiffGrad, Sigmoid) { unary_case(DSC_OP_SIGMOID, normal); }
TEST(AutodiffGrad, Softplus) { unary_case(DSC_OP_SOFTPLUS, normal); }
TEST(AutodiffGrad, Sin) { unary_case(DSC_OP_SIN, normal); }
TEST(AutodiffGrad, Cos) { unary_case(DSC_OP_COS, normal); }
TEST(AutodiffGrad, Pow) {
  for (double p : {2.0, 3.0, 0.5, -1.5, 1.0})
    unary_case(DSC_OP_POW, positive, {dsc_attr_float("exponent", p)});
}
TEST(AutodiffGrad, CastSameDtype) {
  unary_case(DSC_OP_CAST, away, {dsc_attr_dtype("dtype", DSC_F64)});
}

// f32 -> f64: the gradient is dy cast back to f32, exactly.
TEST(AutodiffGrad, CastF32ToF64CastsGradientBack) {
  Harness h;
  dsc_init init = {DSC_INIT_ZEROS, 0, 0, NULL};
  ASSERT_EQ(dsc_module_add_param(h.m, "x", ty({5}, DSC_F32), init), DSC_OK);
  dsc_node *x = dsc_param_ref(h.g, "x");
  h.weighted_sum_loss(dsc_cast(h.g, x, DSC_F64));
  ASSERT_EQ(dsc_autodiff(h.m, "f"), DSC_OK) << diags(h.ctx);
  ASSERT_EQ(dsc_module_verify(h.m), DSC_OK) << diags(h.ctx);
  dsc_params *P = dsc_params_init(h.m, 1);
  std::vector<dsc_tensor *> outs = h.run(P);
  ASSERT_EQ(outs.size(), 2u) << diags(h.ctx);
  EXPECT_EQ(outs[1]->type.dtype, DSC_F32);
  for (int i = 0; i < 5; i++) EXPECT_EQ(outs[1]->data[i], (double)(float)h.inputs[0]->data[i]);
  for (dsc_tensor *t : outs) dsc_tensor_free(h.ctx, t);
  dsc_params_free(P);
}

// ---------------------------------------------------------------- reductions

void reduce_case(dsc_op op, std::vector<int64_t> axes, bool keep, Gen gen = away) {
  Harness h;
  dsc_node *x = h.param("x", {2, 3, 4}, gen);
  h.weighted_sum_loss(dsc_reduce(h.g, op, x, axes.data(), (int)axes.size(), keep));
  h.check();
}

TEST(AutodiffGrad, Sum) {
  reduce_case(DSC_OP_SUM, {0, 2}, false);
  reduce_case(DSC_OP_SUM, {1}, true);
  reduce_case(DSC_OP_SUM, {0, 1, 2}, false);
  reduce_case(DSC_OP_SUM, {}, false);
}
TEST(AutodiffGrad, Mean) {
  reduce_case(DSC_OP_MEAN, {0, 2}, false);
  reduce_case(DSC_OP_MEAN, {2}, true);
  reduce_case(DSC_OP_MEAN, {0, 1, 2}, true);
}
TEST(AutodiffGrad, MaxWithDistinctValues) {
  reduce_case(DSC_OP_MAX, {1}, false, normal);
  reduce_case(DSC_OP_MAX, {0, 2}, true, normal);
  reduce_case(DSC_OP_MAX, {0, 1, 2}, false, normal);
}

TEST(AutodiffGrad, MaxSplitsTiesEqually) {
  Harness h;
  dsc_node *x = h.param("x", {2, 3});
  h.set_loss(dsc_reduce(h.g, DSC_OP_SUM,
                        dsc_reduce(h.g, DSC_OP_MAX, x, std::vector<int64_t>{1}.data(), 1, 0),
                        std::vector<int64_t>{0}.data(), 1, 0));
  ASSERT_EQ(dsc_autodiff(h.m, "f"), DSC_OK) << diags(h.ctx);
  dsc_params *P = dsc_params_init(h.m, 1);
  double xv[6] = {1, 3, 3, 5, 2, 5};
  memcpy(dsc_params_get(P, 0)->data, xv, sizeof xv);
  std::vector<dsc_tensor *> outs = h.run(P);
  ASSERT_EQ(outs.size(), 2u) << diags(h.ctx);
  double want[6] = {0, 0.5, 0.5, 0.5, 0, 0.5};
  for (int i = 0; i < 6; i++) EXPECT_EQ(outs[1]->data[i], want[i]) << i;
  for (dsc_tensor *t : outs) dsc_tensor_free(h.ctx, t);
  dsc_params_free(P);
}

// ---------------------------------------------------------------- layout

TEST(AutodiffGrad, Reshape) {
  Harness h;
  dsc_node *x = h.param("x", {2, 3, 4});
  int64_t shape[2] = {4, 6};
  h.weighted_sum_loss(dsc_reshape(h.g, x, shape, 2));
  h.check();
}

TEST(AutodiffGrad, Permute) {
  Harness h;
  dsc_node *x = h.param("x", {2, 3, 4});
  int64_t perm[3] = {2, 0, 1};
  h.weighted_sum_loss(dsc_permute(h.g, x, perm, 3));
  h.check();
}

TEST(AutodiffGrad, SliceAtStartMiddleAndEnd) {
  for (auto se : std::vector<std::pair<int64_t, int64_t>>{{0, 2}, {1, 3}, {2, 5}, {0, 5}}) {
    Harness h;
    dsc_node *x = h.param("x", {3, 5, 2});
    h.weighted_sum_loss(build1(h.g, DSC_OP_SLICE, x,
                               {dsc_attr_int("axis", 1), dsc_attr_int("start", se.first),
                                dsc_attr_int("end", se.second)}));
    h.check();
  }
}

// Counts the graph's nodes of one op (after autodiff: the backward too).
int count_op(dsc_graph *g, dsc_op op) {
  int n = 0;
  for (int i = 0; i < dsc_graph_node_count(g); i++) n += dsc_node_op(dsc_graph_node(g, i)) == op;
  return n;
}

// y = f(x[:, 0:2]) + g(x[:, 2:3]) + h(x[:, 4:6]) (GPT's qkv split): the
// slices' zero-padded gradients merge into one concat (zeros only in the
// unused gap [3, 4)), with no add; overlapping slices must still add.
TEST(AutodiffGrad, DisjointSliceGradientsMergeIntoOneConcat) {
  for (bool overlap : {false, true}) {
    SCOPED_TRACE(overlap ? "overlapping slices" : "disjoint slices");
    Harness h;
    dsc_node *x = h.param("x", {3, 6, 2});
    int64_t ranges[3][2] = {{0, 2}, {2, 3}, {overlap ? 1 : 4, 6}};
    dsc_op ops[3] = {DSC_OP_TANH, DSC_OP_EXP, DSC_OP_NEG};
    dsc_node *y = nullptr;
    for (int k = 0; k < 3; k++) {
      dsc_node *s = build1(h.g, DSC_OP_SLICE, x,
                           {dsc_attr_int("axis", 1), dsc_attr_int("start", ranges[k][0]),
                            dsc_attr_int("end", ranges[k][1])});
      dsc_node *r = h.random_input(("r" + std::to_string(k)).c_str(),
                                   {3, ranges[k][1] - ranges[k][0], 2});
      int64_t axes[3] = {0, 1, 2};
      dsc_node *l = dsc_reduce(h.g, DSC_OP_SUM, dsc_binary(h.g, DSC_OP_MUL, dsc_unary(h.g, ops[k], s), r),
                               axes, 3, 0);
      y = y ? dsc_binary(h.g, DSC_OP_ADD, y, l) : l;
    }
    h.set_loss(y);
    int adds_before = count_op(h.g, DSC_OP_ADD);
    h.check();
    // The backward of the two forward adds passes dy through; only the
    // gradient accumulation of x could add more.
    int added = count_op(h.g, DSC_OP_ADD) - adds_before;
    if (overlap) {
      EXPECT_GE(added, 1);
    } else {
      EXPECT_EQ(added, 0);
    }
    const dsc_node *gx = dsc_graph_output_at(h.g, 1);
    EXPECT_EQ(dsc_node_op(gx), overlap ? DSC_OP_ADD : DSC_OP_CONCAT);
    if (!overlap) {
      EXPECT_EQ(dsc_node_input_count(gx), 4);  // x0:2, x2:3, zeros 3:4, x4:6
    }
  }
}

TEST(AutodiffGrad, Concat) {
  Harness h;
  dsc_node *in[3] = {h.param("a", {2, 1, 3}), h.param("b", {2, 4, 3}), h.param("c", {2, 2, 3})};
  dsc_attr ax = dsc_attr_int("axis", 1);
  h.weighted_sum_loss(dsc_build(h.g, DSC_OP_CONCAT, in, 3, &ax, 1));
  h.check();
}

TEST(AutodiffGrad, Broadcast) {
  Harness h;
  dsc_node *x = h.param("x", {3, 1});
  int64_t shape[3] = {2, 3, 4};
  h.weighted_sum_loss(build1(h.g, DSC_OP_BROADCAST, x, {dsc_attr_ints("shape", shape, 3)}));
  h.check();
}

// 8 ids over 5 rows: some rows repeat, so the scatter-add must accumulate.
TEST(AutodiffGrad, EmbeddingAccumulatesRepeatedIds) {
  for (dsc_dtype dt : {DSC_I32, DSC_I64}) {
    Harness h;
    dsc_node *tab = h.param("table", {5, 3});
    dsc_node *ids = h.ids("ids", {2, 4}, 5, dt);
    h.weighted_sum_loss(dsc_binary(h.g, DSC_OP_EMBEDDING, tab, ids));
    h.check();
  }
}

TEST(AutodiffGrad, EmbeddingGradWithRespectToDy) {
  Harness h;
  dsc_node *ids = h.ids("ids", {2, 4}, 5);
  dsc_node *dy = h.param("dy", {2, 4, 3});
  dsc_node *in[2] = {ids, dy};
  dsc_attr rows = dsc_attr_int("rows", 5);
  h.weighted_sum_loss(dsc_build(h.g, DSC_OP_EMBEDDING_GRAD, in, 2, &rows, 1));
  h.check();
}

// ---------------------------------------------------------------- matmul

TEST(AutodiffGrad, Matmul2d) { binary_case(DSC_OP_MATMUL, {3, 4}, {4, 5}, normal, normal); }
TEST(AutodiffGrad, MatmulBroadcastsBatchDims) {
  binary_case(DSC_OP_MATMUL, {2, 1, 3, 4}, {3, 4, 2}, normal, normal);
  binary_case(DSC_OP_MATMUL, {2, 3, 4}, {4, 5}, normal, normal);
  binary_case(DSC_OP_MATMUL, {3, 4}, {2, 4, 5}, normal, normal);
}

// ---------------------------------------------------------------- composites

TEST(AutodiffGrad, Softmax) {
  for (int64_t axis : {0, 1}) unary_case(DSC_OP_SOFTMAX, normal, {dsc_attr_int("axis", axis)});
}
TEST(AutodiffGrad, LogSoftmax) {
  for (int64_t axis : {0, 1}) unary_case(DSC_OP_LOG_SOFTMAX, normal, {dsc_attr_int("axis", axis)});
}

TEST(AutodiffGrad, Layernorm) {
  Harness h;
  dsc_node *in[3] = {h.param("x", {2, 3, 5}, normal), h.param("w", {5}, away),
                     h.param("b", {5}, away)};
  dsc_attr eps = dsc_attr_float("eps", 1e-5);
  h.weighted_sum_loss(dsc_build(h.g, DSC_OP_LAYERNORM, in, 3, &eps, 1));
  h.check();
}

TEST(AutodiffGrad, Rmsnorm) {
  Harness h;
  dsc_node *in[2] = {h.param("x", {2, 3, 5}, normal), h.param("w", {5}, away)};
  dsc_attr eps = dsc_attr_float("eps", 1e-5);
  h.weighted_sum_loss(dsc_build(h.g, DSC_OP_RMSNORM, in, 2, &eps, 1));
  h.check();
}

void attention_case(int64_t heads, bool causal, bool shared) {
  Harness h;
  dsc_node *q = h.param("q", {2, 3, 4}, normal);
  dsc_node *k = shared ? q : h.param("k", {2, 3, 4}, normal);
  dsc_node *v = shared ? q : h.param("v", {2, 3, 4}, normal);
  h.weighted_sum_loss(dsc_attention(h.g, q, k, v, heads, heads, causal, 0));
  h.check();
}

TEST(AutodiffGrad, AttentionCausal) { attention_case(2, true, false); }
TEST(AutodiffGrad, AttentionNonCausal) { attention_case(2, false, false); }
TEST(AutodiffGrad, AttentionOneHead) { attention_case(1, true, false); }
TEST(AutodiffGrad, AttentionSelfSharedInput) { attention_case(2, true, true); }

// Grouped-query attention: the key/value gradient sums over the query heads
// of its group; keys beyond the queries (S > T) with the causal offset.
void grouped_case(int64_t heads, int64_t kv_heads, int64_t S, bool causal, double scale) {
  Harness h;
  const int64_t hd = 2, T = 3;
  dsc_node *q = h.param("q", {2, T, heads * hd}, normal);
  dsc_node *k = h.param("k", {2, S, kv_heads * hd}, normal);
  dsc_node *v = h.param("v", {2, S, kv_heads * hd}, normal);
  h.weighted_sum_loss(dsc_attention(h.g, q, k, v, heads, kv_heads, causal, scale));
  // a larger step: the loss sums more heads, so its rounding over the
  // default step (|loss| 1e-16 / 1e-6) is near 1e-6 of the smallest gradients
  h.check(-1, kRelTol, kStep * 10);
}

TEST(AutodiffGrad, AttentionGroupedQueries) { grouped_case(4, 2, 3, true, 0); }
TEST(AutodiffGrad, AttentionMultiQuery) { grouped_case(3, 1, 3, false, 0); }
TEST(AutodiffGrad, AttentionLongerKeysCausalScaled) { grouped_case(2, 2, 5, true, 0.3); }
TEST(AutodiffGrad, AttentionGroupedLongerKeys) { grouped_case(4, 1, 4, true, 0); }

// A sliding window of 2 over 4 keys (3 queries): the masked keys get no
// gradient, the others their share.
TEST(AutodiffGrad, AttentionSlidingWindow) {
  Harness h;
  const int64_t hd = 2, T = 3, S = 4;
  dsc_node *q = h.param("q", {2, T, 4 * hd}, normal);
  dsc_node *k = h.param("k", {2, S, 2 * hd}, normal);
  dsc_node *v = h.param("v", {2, S, 2 * hd}, normal);
  h.weighted_sum_loss(dsc_attention_windowed(h.g, q, k, v, 4, 2, true, 0, 2));
  h.check(-1, kRelTol, kStep * 10);
}

// rope's gradient is the rotation back: checked in both pairings, with
// positions per batch row.
TEST(AutodiffGrad, Rope) {
  for (bool inter : {false, true}) {
    SCOPED_TRACE(inter ? "interleaved" : "rotate-half");
    Harness h;
    dsc_node *x = h.param("x", {2, 3, 8}, normal);
    dsc_node *pos = h.ids("pos", {2, 3}, 50);
    h.weighted_sum_loss(dsc_rope(h.g, x, pos, 2, 10000.0, inter));
    h.check();
  }
}

// Llama 3.1's scaled frequencies: the gradient rotates back at the same ones.
TEST(AutodiffGrad, RopeLlama3Scaling) {
  Harness h;
  dsc_node *x = h.param("x", {2, 3, 32}, normal);
  dsc_node *pos = h.ids("pos", {3}, 300);
  dsc_rope_scaling sc = {8.0, 1.0, 4.0, 256};
  h.weighted_sum_loss(dsc_rope_scaled(h.g, x, pos, 1, 10000.0, false, &sc));
  h.check();
}

// dropout's gradient is the same dropout of dy: the finite differences of a
// fixed seed's mask, half of the elements dropped.
TEST(AutodiffGrad, Dropout) {
  Harness h;
  dsc_node *x = h.param("x", {3, 4, 5}, normal);
  dsc_node *seed = h.ids("seed", {1}, (int64_t)1 << 40, DSC_I64);
  dsc_node *y = dsc_dropout(h.g, x, seed, 0.5, 3);
  h.weighted_sum_loss(dsc_binary(h.g, DSC_OP_MUL, y, y));
  h.check();
}

TEST(AutodiffGrad, CrossEntropy) {
  Harness h;
  dsc_node *lg = h.param("logits", {2, 3, 5}, normal);
  dsc_node *tg = h.ids("targets", {2, 3}, 5);
  h.set_loss(dsc_binary(h.g, DSC_OP_CROSS_ENTROPY, lg, tg));
  h.check();
}

TEST(AutodiffGrad, CrossEntropyRank1LogitsScaledLoss) {
  Harness h;
  dsc_node *lg = h.param("logits", {6}, normal);
  dsc_node *tg = h.ids("targets", {}, 6, DSC_I64);
  dsc_node *ce = dsc_binary(h.g, DSC_OP_CROSS_ENTROPY, lg, tg);
  h.set_loss(dsc_binary(h.g, DSC_OP_MUL, ce, dsc_const(h.g, 3.0, ty({}))));
  h.check();
}

// A chain through several ops, with values used more than once.
TEST(AutodiffGrad, SharedValuesAccumulate) {
  Harness h;
  dsc_node *x = h.param("x", {3, 4});
  dsc_node *x2 = dsc_param_ref(h.g, "x");  // a second read of the same param
  dsc_node *t = dsc_unary(h.g, DSC_OP_TANH, dsc_binary(h.g, DSC_OP_MUL, x, x2));
  h.weighted_sum_loss(dsc_binary(h.g, DSC_OP_ADD, dsc_binary(h.g, DSC_OP_MUL, t, x), t));
  h.check();
}

// ---------------------------------------------------------------- a tiny GPT

// d 16, 2 heads, 2 layers, vocab 32, seq 8, batch 2, tied embeddings, in f64,
// built with the builder API.
struct TinyGpt {
  static constexpr int64_t B = 2, T = 8, D = 16, H = 2, L = 2, V = 32;
  Harness &h;
  explicit TinyGpt(Harness &hh) : h(hh) {}

  dsc_node *p(const std::string &name, std::vector<int64_t> dims, Gen gen) {
    return h.param(name.c_str(), dims, gen);
  }
  dsc_node *bin(dsc_op op, dsc_node *a, dsc_node *b) { return dsc_binary(h.g, op, a, b); }
  dsc_node *ln(dsc_node *x, const std::string &pre) {
    dsc_node *in[3] = {x,
                       p(pre + "_w", {D}, [](std::mt19937_64 &r) { return 1 + 0.3 * normal(r); }),
                       p(pre + "_b", {D}, [](std::mt19937_64 &r) { return 0.3 * normal(r); })};
    dsc_attr eps = dsc_attr_float("eps", 1e-5);
    return dsc_build(h.g, DSC_OP_LAYERNORM, in, 3, &eps, 1);
  }
  dsc_node *linear(dsc_node *x, const std::string &pre, int64_t in, int64_t out) {
    double s = 1.0 / std::sqrt((double)in);
    dsc_node *w = p(pre + "_w", {in, out}, [s](std::mt19937_64 &r) { return s * normal(r); });
    dsc_node *b = p(pre + "_b", {out}, [](std::mt19937_64 &r) { return 0.1 * normal(r); });
    return bin(DSC_OP_ADD, dsc_matmul(h.g, x, w), b);
  }
  dsc_node *slice(dsc_node *x, int64_t s, int64_t e) {
    return build1(h.g, DSC_OP_SLICE, x,
                  {dsc_attr_int("axis", 2), dsc_attr_int("start", s), dsc_attr_int("end", e)});
  }

  void build() {
    Gen emb = [](std::mt19937_64 &r) { return 0.5 * normal(r); };
    dsc_node *wte = p("wte", {V, D}, emb), *wpe = p("wpe", {T, D}, emb);
    dsc_node *tokens = h.ids("tokens", {B, T}, V), *targets = h.ids("targets", {B, T}, V);
    int64_t tshape[1] = {T};
    dsc_attr ia[3] = {dsc_attr_int("axis", 0), dsc_attr_dtype("dtype", DSC_I32),
                      dsc_attr_ints("shape", tshape, 1)};
    dsc_node *pos = dsc_build(h.g, DSC_OP_IOTA, nullptr, 0, ia, 3);
    dsc_node *x =
        bin(DSC_OP_ADD, bin(DSC_OP_EMBEDDING, wte, tokens), bin(DSC_OP_EMBEDDING, wpe, pos));
    for (int l = 0; l < L; l++) {
      std::string pre = "h." + std::to_string(l) + ".";
      dsc_node *qkv = linear(ln(x, pre + "ln1"), pre + "attn", D, 3 * D);
      dsc_node *att = dsc_attention(h.g, slice(qkv, 0, D), slice(qkv, D, 2 * D),
                                    slice(qkv, 2 * D, 3 * D), H, H, true, 0);
      x = bin(DSC_OP_ADD, x, linear(att, pre + "proj", D, D));
      dsc_node *m = dsc_unary(h.g, DSC_OP_GELU, linear(ln(x, pre + "ln2"), pre + "fc", D, 4 * D));
      x = bin(DSC_OP_ADD, x, linear(m, pre + "fc2", 4 * D, D));
    }
    int64_t tr[2] = {1, 0};
    dsc_node *logits = dsc_matmul(h.g, ln(x, "lnf"), dsc_permute(h.g, wte, tr, 2));
    h.set_loss(bin(DSC_OP_CROSS_ENTROPY, logits, targets));
  }
};

TEST(AutodiffGpt, TinyGptGradientsMatchFiniteDifferences) {
  Harness h(42);
  TinyGpt gpt(h);
  gpt.build();
  ASSERT_FALSE(HasFailure());
  h.check(200, kModelRelTol, kModelStep);
  EXPECT_EQ(dsc_error_count(h.ctx), 0) << diags(h.ctx);
  RecordProperty("max_rel_err", std::to_string(h.max_err));
  printf("tiny GPT: max relative error %.3g over the sampled elements\n", h.max_err);
}

// The same architecture written in the model language (an f64 copy of
// examples/gpt-tiny.dsm with its layers inline), compiled by the frontend.
const char kTinyGptF64[] = R"(
fn mlp(x, w_fc, b_fc, w_proj, b_proj) {
  return matmul(gelu(matmul(x, w_fc) + b_fc), w_proj) + b_proj
}
fn self_attention(x, w_qkv, b_qkv, w_proj, b_proj, d, heads) {
  qkv = matmul(x, w_qkv) + b_qkv
  q = slice(qkv, -1, 0, d)
  k = slice(qkv, -1, d, 2 * d)
  v = slice(qkv, -1, 2 * d, 3 * d)
  return matmul(attention(q, k, v, heads = heads, causal = true), w_proj) + b_proj
}
model gpt_tiny_f64 {
  const vocab = 32, d = 16, heads = 2, ctx = 8, layers = 2
  param wte: f64[vocab, d] = normal(0.02)
  param wpe: f64[ctx, d] = normal(0.01)
  block h[layers] {
    param ln1_w: f64[d] = ones
    param ln1_b: f64[d] = zeros
    param attn_w: f64[d, 3 * d] = normal(0.02)
    param attn_b: f64[3 * d] = zeros
    param attn_proj_w: f64[d, d] = normal(0.02)
    param attn_proj_b: f64[d] = zeros
    param ln2_w: f64[d] = ones
    param ln2_b: f64[d] = zeros
    param fc_w: f64[d, 4 * d] = normal(0.02)
    param fc_b: f64[4 * d] = zeros
    param fc_proj_w: f64[4 * d, d] = normal(0.02)
    param fc_proj_b: f64[d] = zeros
    fn forward(x: f64[B, T, d]) -> f64[B, T, d] {
      x = x + self_attention(layernorm(x, ln1_w, ln1_b), attn_w, attn_b, attn_proj_w,
                             attn_proj_b, d, heads)
      return x + mlp(layernorm(x, ln2_w, ln2_b), fc_w, fc_b, fc_proj_w, fc_proj_b)
    }
  }
  param lnf_w: f64[d] = ones
  param lnf_b: f64[d] = zeros
  fn forward(tokens: i32[B, T], targets: i32[B, T]) -> f64 {
    x = embedding(wte, tokens) + embedding(wpe, iota(T))
    for l in h { x = l.forward(x) }
    logits = matmul(layernorm(x, lnf_w, lnf_b), transpose(wte))
    return cross_entropy(logits, targets)
  }
}
train { batch = 2, seq = 8 }
)";

TEST(AutodiffGpt, TinyGptFromModelLanguageMatchesFiniteDifferences) {
  Harness h(11);
  dsc_module *mod = nullptr;
  ASSERT_EQ(
      dsc_compile_string(h.ctx, kTinyGptF64, sizeof kTinyGptF64 - 1, "gpt_f64.dsm", nullptr, &mod),
      DSC_OK)
      << diags(h.ctx);
  h.adopt(mod, "forward");
  ASSERT_EQ(dsc_graph_input_count(h.g), 2);
  for (int i = 0; i < 2; i++) {
    dsc_tensor *t = dsc_tensor_new(h.ctx, dsc_node_type(dsc_graph_input_at(h.g, i)));
    ASSERT_EQ(dsc_type_numel(&t->type), 16);
    for (int j = 0; j < 16; j++)
      t->data[j] = (double)std::uniform_int_distribution<int>(0, 31)(h.rng);
    h.inputs.push_back(t);
  }
  // Values of a trained-looking model, large enough for well-conditioned
  // differences: norm weights near 1, matrices scaled by 1/sqrt(fan-in).
  for (int p = 0; p < dsc_module_param_count(h.m); p++) {
    std::string name = dsc_module_param_name(h.m, p);
    dsc_type t = dsc_module_param_type(h.m, p);
    bool norm_w = name.find("ln") != std::string::npos && name.back() == 'w';
    double s = t.rank == 2 ? 1.0 / std::sqrt((double)t.dims[0]) : 0.1;
    if (name == "wte" || name == "wpe") s = 0.5;
    h.gens.push_back(
        [norm_w, s](std::mt19937_64 &r) { return (norm_w ? 1.0 : 0.0) + s * normal(r); });
  }
  h.check(200, kModelRelTol, kModelStep);
  printf("tiny GPT (model language): max relative error %.3g\n", h.max_err);
}

// A GPT whose MLPs are Mixtures of Experts (examples/lib/moe.dsm, imported
// as examples/moe-tiny.dsm does): top-2 gating with a capacity that drops
// tokens, the load-balancing and z-losses; in f64, every gradient against
// central differences (the masks are constant near the sampled point).
const char kMoeF64[] = R"(
import "lib/layers.dsm"
import "lib/moe.dsm"
model moe_f64 {
  const vocab = 32, d = 16, heads = 2, ctx = 8, experts = 4, top2 = 1, ffn = 8
  param wte: f64[vocab, d] = normal(0.02)
  param wpe: f64[ctx, d] = normal(0.01)
  param ln1_w: f64[d] = ones
  param ln1_b: f64[d] = zeros
  param attn_w: f64[d, 3 * d] = normal(0.02)
  param attn_b: f64[3 * d] = zeros
  param attn_proj_w: f64[d, d] = normal(0.02)
  param attn_proj_b: f64[d] = zeros
  param ln2_w: f64[d] = ones
  param ln2_b: f64[d] = zeros
  param router: f64[d, experts] = normal(0.02)
  param fc_w: f64[experts, d, ffn] = normal(0.02)
  param fc_b: f64[experts, 1, ffn] = zeros
  param fc_proj_w: f64[experts, ffn, d] = normal(0.02)
  param fc_proj_b: f64[experts, 1, d] = zeros
  fn forward(tokens: i32[B, T], targets: i32[B, T]) -> f64 {
    x = embedding(wte, tokens) + embedding(wpe, iota(T))
    x = x + self_attention(layernorm(x, ln1_w, ln1_b), attn_w, attn_b, attn_proj_w, attn_proj_b,
                           d, heads)
    S = B * T
    y = reshape(layernorm(x, ln2_w, ln2_b), [S, d])
    C = moe_capacity(S, 2, experts, 5, 4)
    c1 = moe_choice(y, router, S, experts, top2, C, f64, 0)
    c2 = moe_choice(y, router, S, experts, top2, C, f64, 1)
    out = moe_expert_mlp(moe_dispatch(y, c1, c2, S, experts, C, f64), fc_w, fc_b, fc_proj_w,
                         fc_proj_b)
    out = moe_combine(out, c1, c2, moe_weights(y, router, c1, c2, top2), S, experts, C, f64)
    x = x + reshape(out, [B, T, d])
    aux = 0.01 * moe_balance_loss(y, router, experts, f64) + 0.001 * moe_z_loss(y, router)
    return cross_entropy(matmul(x, transpose(wte)), targets) + aux
  }
}
train { batch = 2, seq = 8 }
)";

TEST(AutodiffGpt, MixtureOfExpertsFromModelLanguageMatchesFiniteDifferences) {
  Harness h(23);
  dsc_module *mod = nullptr;
  std::string file = std::string(DSC_SOURCE_DIR) + "/examples/moe_f64.dsm";  // finds lib/
  ASSERT_EQ(dsc_compile_string(h.ctx, kMoeF64, sizeof kMoeF64 - 1, file.c_str(), nullptr, &mod),
            DSC_OK)
      << diags(h.ctx);
  h.adopt(mod, "forward");
  for (int i = 0; i < 2; i++) {
    dsc_tensor *t = dsc_tensor_new(h.ctx, dsc_node_type(dsc_graph_input_at(h.g, i)));
    for (int j = 0; j < 16; j++)
      t->data[j] = (double)std::uniform_int_distribution<int>(0, 31)(h.rng);
    h.inputs.push_back(t);
  }
  for (int p = 0; p < dsc_module_param_count(h.m); p++) {
    std::string name = dsc_module_param_name(h.m, p);
    dsc_type t = dsc_module_param_type(h.m, p);
    bool norm_w = name.find("ln") != std::string::npos && name.back() == 'w';
    double s = t.rank >= 2 ? 1.0 / std::sqrt((double)t.dims[t.rank - 2]) : 0.1;
    if (name == "wte" || name == "wpe" || name == "router") s = 0.5;  // distinct gates
    h.gens.push_back(
        [norm_w, s](std::mt19937_64 &r) { return (norm_w ? 1.0 : 0.0) + s * normal(r); });
  }
  h.check(300, kModelRelTol, kModelStep);
  printf("MoE GPT (model language): max relative error %.3g\n", h.max_err);
}

// ---------------------------------------------------------------- errors and IR

TEST(AutodiffPass, OpWithoutRuleIsRejectedAtItsLocation) {
  Harness h;
  dsc_node *x = h.param("x", {3});
  dsc_graph_set_loc(h.g, dsc_loc{"model.dsm", 7, 3});
  dsc_node *y = dsc_unary(h.g, DSC_OP_GELU, x);
  dsc_graph_set_loc(h.g, dsc_loc{"model.dsm", 8, 3});
  h.set_loss(dsc_reduce(h.g, DSC_OP_SUM, y, std::vector<int64_t>{0}.data(), 1, 0));
  int before = dsc_graph_node_count(h.g);
  std::vector<ir_grad_fn> rules(ir_grad_rules(), ir_grad_rules() + DSC_OP_COUNT);
  rules[DSC_OP_GELU] = nullptr;
  EXPECT_EQ(pass_autodiff_run_with_rules(h.m, h.g, rules.data()), DSC_ERR_USER);
  ASSERT_EQ(dsc_error_count(h.ctx), 1) << diags(h.ctx);
  const dsc_diag *d = dsc_diag_get(h.ctx, 0);
  EXPECT_NE(std::string(d->message).find("'gelu'"), std::string::npos) << d->message;
  EXPECT_NE(std::string(d->message).find("no gradient rule"), std::string::npos) << d->message;
  ASSERT_NE(d->loc.file, nullptr);
  EXPECT_STREQ(d->loc.file, "model.dsm");
  EXPECT_EQ(d->loc.line, 7);
  EXPECT_EQ(d->loc.col, 3);
  EXPECT_EQ(dsc_graph_node_count(h.g), before);  // the graph is left as it was
  EXPECT_EQ(dsc_graph_output_count(h.g), 1);
}

TEST(AutodiffPass, RejectsNonScalarLoss) {
  Harness h;
  dsc_node *x = h.param("x", {2, 3});
  h.set_loss(dsc_unary(h.g, DSC_OP_EXP, x));
  EXPECT_EQ(dsc_autodiff(h.m, "f"), DSC_ERR_USER);
  ASSERT_GE(dsc_error_count(h.ctx), 1);
  EXPECT_NE(diags(h.ctx).find("must be a rank-0 float tensor, got f64[2,3]"), std::string::npos)
      << diags(h.ctx);
}

TEST(AutodiffPass, RejectsIntegerLossAndSeveralOutputs) {
  Harness h;
  dsc_node *x = h.param("x", {});
  dsc_node *i = dsc_cast(h.g, x, DSC_I32);
  h.set_loss(i);
  EXPECT_EQ(dsc_autodiff(h.m, "f"), DSC_ERR_USER);
  EXPECT_NE(diags(h.ctx).find("rank-0 float"), std::string::npos) << diags(h.ctx);
  dsc_diag_clear(h.ctx);
  dsc_node *outs[2] = {x, x};
  ASSERT_EQ(dsc_graph_set_outputs(h.g, outs, 2), DSC_OK);
  EXPECT_EQ(dsc_autodiff(h.m, "f"), DSC_ERR_USER);
  EXPECT_NE(diags(h.ctx).find("exactly one output"), std::string::npos) << diags(h.ctx);
  dsc_diag_clear(h.ctx);
  EXPECT_EQ(dsc_autodiff(h.m, "nope"), DSC_ERR_USER);
  EXPECT_NE(diags(h.ctx).find("no graph named 'nope'"), std::string::npos) << diags(h.ctx);
}

// A param the loss ignores, and one it reads only through a comparison (not
// differentiable), get zero gradients and a warning each.
TEST(AutodiffPass, UnusedParamsGetZeroGradientAndWarning) {
  Harness h;
  dsc_node *x = h.param("x", {3});
  h.param("unused", {2, 2});
  dsc_node *c = h.param("gate", {3});
  dsc_node *mask =
      dsc_cast(h.g, dsc_binary(h.g, DSC_OP_GREATER, c, dsc_const(h.g, 0, ty({}))), DSC_F64);
  h.set_loss(dsc_reduce(h.g, DSC_OP_SUM, dsc_binary(h.g, DSC_OP_MUL, x, mask),
                        std::vector<int64_t>{0}.data(), 1, 0));
  ASSERT_EQ(dsc_autodiff(h.m, "f"), DSC_OK) << diags(h.ctx);
  ASSERT_EQ(dsc_module_verify(h.m), DSC_OK) << diags(h.ctx);
  EXPECT_EQ(dsc_error_count(h.ctx), 0);
  std::string d = diags(h.ctx);
  EXPECT_NE(d.find("does not depend on parameter 'unused'"), std::string::npos) << d;
  EXPECT_NE(d.find("does not depend on parameter 'gate'"), std::string::npos) << d;
  EXPECT_EQ(d.find("parameter 'x'"), std::string::npos) << d;
  dsc_params *P = dsc_params_init(h.m, 3);
  double gv[3] = {1, -1, 2};
  memcpy(dsc_params_get(P, 2)->data, gv, sizeof gv);
  std::vector<dsc_tensor *> outs = h.run(P);
  ASSERT_EQ(outs.size(), 4u) << diags(h.ctx);
  double want_x[3] = {1, 0, 1};
  for (int i = 0; i < 3; i++) EXPECT_EQ(outs[1]->data[i], want_x[i]);
  EXPECT_EQ(outs[2]->type.rank, 2);
  for (int i = 0; i < 4; i++) EXPECT_EQ(outs[2]->data[i], 0.0);
  for (int i = 0; i < 3; i++) EXPECT_EQ(outs[3]->data[i], 0.0);
  for (dsc_tensor *t : outs) dsc_tensor_free(h.ctx, t);
  dsc_params_free(P);
}

// Backward nodes carry the location of the forward node they differentiate.
TEST(AutodiffPass, BackwardNodesKeepForwardLocations) {
  Harness h;
  dsc_node *x = h.param("x", {3});
  dsc_graph_set_loc(h.g, dsc_loc{"m.dsm", 4, 9});
  dsc_node *y = dsc_unary(h.g, DSC_OP_TANH, x);
  dsc_graph_set_loc(h.g, dsc_loc{"m.dsm", 5, 2});
  h.set_loss(dsc_reduce(h.g, DSC_OP_SUM, y, std::vector<int64_t>{0}.data(), 1, 0));
  int n0 = dsc_graph_node_count(h.g);
  ASSERT_EQ(dsc_autodiff(h.m, "f"), DSC_OK) << diags(h.ctx);
  bool saw_tanh_line = false;
  for (int i = n0; i < dsc_graph_node_count(h.g); i++) {
    const ir_node *n = dsc_graph_node(h.g, i);
    EXPECT_TRUE(n->loc.line == 4 || n->loc.line == 5) << i;
    saw_tanh_line |= n->loc.line == 4;
  }
  EXPECT_TRUE(saw_tanh_line);
}

// The differentiated GPT prints, parses back and prints identically.
TEST(AutodiffPass, DifferentiatedGraphRoundTripsThroughText) {
  Harness h(5);
  TinyGpt gpt(h);
  gpt.build();
  ASSERT_EQ(dsc_autodiff(h.m, "f"), DSC_OK) << diags(h.ctx);
  ASSERT_EQ(dsc_module_verify(h.m), DSC_OK) << diags(h.ctx);
  char *text = dsc_module_print_string(h.m);
  ASSERT_NE(text, nullptr) << diags(h.ctx);
  std::string s1(text);
  dsc_string_free(h.ctx, text);
  EXPECT_NE(s1.find("embedding_grad"), std::string::npos);
  dsc_module *m2 = nullptr;
  ASSERT_EQ(dsc_module_parse(h.ctx, s1.data(), s1.size(), "grad.dsir", &m2), DSC_OK)
      << diags(h.ctx);
  ASSERT_EQ(dsc_module_verify(m2), DSC_OK) << diags(h.ctx);
  char *text2 = dsc_module_print_string(m2);
  ASSERT_NE(text2, nullptr);
  EXPECT_EQ(s1, std::string(text2));
  dsc_string_free(h.ctx, text2);
  dsc_module_free(m2);
}

// An allocator that fails once `left` allocations have succeeded.
struct FailingAlloc {
  bool armed = false;
  long left = 0;
};
void *failing_alloc(void *ud, void *ptr, size_t osize, size_t nsize) {
  (void)osize;
  FailingAlloc *fa = (FailingAlloc *)ud;
  if (nsize == 0) {
    free(ptr);
    return nullptr;
  }
  if (fa->armed && fa->left-- <= 0) return nullptr;
  return realloc(ptr, nsize);
}

// Every allocation the pass makes is failed in turn: the pass reports an
// internal error, leaves the graph as it was and leaks nothing (ASan).
TEST(AutodiffPass, OutOfMemoryAtEveryAllocation) {
  bool succeeded = false;
  int failures = 0;
  for (long limit = 0; limit < 400 && !succeeded; limit++) {
    FailingAlloc fa;
    Harness h(1, failing_alloc, &fa);
    TinyGpt gpt(h);
    gpt.build();
    ASSERT_FALSE(HasFailure());
    int before = dsc_graph_node_count(h.g);
    fa.left = limit;
    fa.armed = true;
    dsc_status st = dsc_autodiff(h.m, "f");
    fa.armed = false;
    if (st == DSC_OK) {
      succeeded = true;
      EXPECT_EQ(dsc_module_verify(h.m), DSC_OK) << diags(h.ctx);
      EXPECT_EQ(dsc_graph_output_count(h.g), dsc_module_param_count(h.m) + 1);
    } else {
      failures++;
      EXPECT_EQ(st, DSC_ERR_INTERNAL) << "limit " << limit << "\n" << diags(h.ctx);
      EXPECT_EQ(dsc_graph_node_count(h.g), before) << "limit " << limit;
      EXPECT_EQ(dsc_graph_output_count(h.g), 1) << "limit " << limit;
      EXPECT_EQ(dsc_module_verify(h.m), DSC_OK) << "limit " << limit << "\n" << diags(h.ctx);
    }
  }
  EXPECT_TRUE(succeeded);
  EXPECT_GT(failures, 5);
}

TEST(AutodiffOps, EmbeddingGradRejectsOutOfRangeIds) {
  Harness h;
  dsc_node *ids = h.input("ids", ty({3}, DSC_I32), [] { return 7.0; });
  dsc_node *dy = h.param("dy", {3, 2});
  dsc_node *in[2] = {ids, dy};
  dsc_attr rows = dsc_attr_int("rows", 4);
  dsc_node *eg = dsc_build(h.g, DSC_OP_EMBEDDING_GRAD, in, 2, &rows, 1);
  ASSERT_NE(eg, nullptr) << diags(h.ctx);
  ASSERT_EQ(dsc_graph_set_outputs(h.g, &eg, 1), DSC_OK);
  dsc_params *P = dsc_params_init(h.m, 1);
  std::vector<dsc_tensor *> outs = h.run(P);
  EXPECT_TRUE(outs.empty());
  EXPECT_NE(diags(h.ctx).find("id 7 at position 0 is out of range [0, 4)"), std::string::npos)
      << diags(h.ctx);
  dsc_params_free(P);
}

TEST(AutodiffOps, EmbeddingGradShapeRuleRejectsBadShapes) {
  Harness h;
  dsc_node *ids = h.input("ids", ty({3}, DSC_I32), [] { return 0.0; });
  dsc_node *dy = h.param("dy", {4, 2});
  dsc_node *in[2] = {ids, dy};
  dsc_attr rows = dsc_attr_int("rows", 4);
  EXPECT_EQ(dsc_build(h.g, DSC_OP_EMBEDDING_GRAD, in, 2, &rows, 1), nullptr);
  EXPECT_NE(diags(h.ctx).find("embedding_grad: dy f64[4,2] must have the shape of ids i32[3]"),
            std::string::npos)
      << diags(h.ctx);
  dsc_diag_clear(h.ctx);
  dsc_attr zero = dsc_attr_int("rows", 0);
  in[1] = h.param("dy2", {3, 2});
  EXPECT_EQ(dsc_build(h.g, DSC_OP_EMBEDDING_GRAD, in, 2, &zero, 1), nullptr);
  EXPECT_NE(diags(h.ctx).find("rows must be positive"), std::string::npos) << diags(h.ctx);
}

TEST(AutodiffRules, RuleTableCoversTheDifferentiableOps) {
  for (dsc_op op : {DSC_OP_INPUT, DSC_OP_PARAM, DSC_OP_CONST, DSC_OP_IOTA, DSC_OP_LESS,
                    DSC_OP_GREATER, DSC_OP_EQUAL})
    EXPECT_EQ(ir_grad_rule(op), nullptr) << dsc_op_name(op);
  for (dsc_op op : {DSC_OP_ADD,       DSC_OP_SUB,           DSC_OP_MUL,           DSC_OP_DIV,
                    DSC_OP_MAXIMUM,   DSC_OP_WHERE,         DSC_OP_NEG,           DSC_OP_EXP,
                    DSC_OP_LOG,       DSC_OP_SQRT,          DSC_OP_RSQRT,         DSC_OP_TANH,
                    DSC_OP_RELU,      DSC_OP_GELU,          DSC_OP_SILU,          DSC_OP_SIGMOID,       DSC_OP_SOFTPLUS,
                    DSC_OP_POW,       DSC_OP_CAST,          DSC_OP_SUM,           DSC_OP_MEAN,
                    DSC_OP_MAX,       DSC_OP_RESHAPE,       DSC_OP_PERMUTE,       DSC_OP_SLICE,
                    DSC_OP_CONCAT,    DSC_OP_BROADCAST,     DSC_OP_EMBEDDING,     DSC_OP_MATMUL,
                    DSC_OP_SOFTMAX,   DSC_OP_LOG_SOFTMAX,   DSC_OP_LAYERNORM,     DSC_OP_RMSNORM,
                    DSC_OP_ATTENTION, DSC_OP_CROSS_ENTROPY, DSC_OP_EMBEDDING_GRAD})
    EXPECT_NE(ir_grad_rule(op), nullptr) << dsc_op_name(op);
  EXPECT_EQ(ir_grad_rule(DSC_OP_COUNT), nullptr);
}

}  // namespace
