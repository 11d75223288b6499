// The reference interpreter, op by op, against f64 references written here
// independently (explicit nested loops over the specific small shapes), on
// random non-zero inputs from a seeded std::mt19937.
//
// Tolerances: f64 graphs |got - ref| <= 1e-12 * max(1, |ref|); f32 graphs
// are compared with the f64 reference rounded to f32, at 1e-6 relative.
// Every test runs on a context with a counting allocator and fails if any
// byte is still allocated after the module and context are freed.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "dsc/interp.h"
#include "dsc/ir.h"
#include "ir/ir.h"
#include "tests/unit/test_util.h"

namespace {

// ---------------------------------------------------------------- allocator
// Counts live blocks and bytes, checks that frees pass the size that was
// allocated, records the peak, and can fail on request.
struct Counter {
  int64_t live_bytes = 0, live_blocks = 0, peak_bytes = 0;
  int64_t fail_countdown = -1;   // > 0: the n-th next allocation fails
  size_t fail_above = SIZE_MAX;  // allocations larger than this fail
  bool size_mismatch = false;
  std::map<void *, size_t> sizes;
};

void *counting_alloc(void *ud, void *ptr, size_t osize, size_t nsize) {
  Counter *c = static_cast<Counter *>(ud);
  if (ptr) {
    auto it = c->sizes.find(ptr);
    if (it == c->sizes.end() || it->second != osize) c->size_mismatch = true;
  }
  if (nsize == 0) {
    if (ptr) {
      c->live_bytes -= (int64_t)osize;
      c->live_blocks--;
      c->sizes.erase(ptr);
      free(ptr);
    }
    return nullptr;
  }
  if (nsize > c->fail_above) return nullptr;
  if (c->fail_countdown > 0 && --c->fail_countdown == 0) return nullptr;
  void *p = realloc(ptr, nsize);
  if (!p) return nullptr;
  if (ptr) {
    c->live_bytes -= (int64_t)osize;
    c->live_blocks--;
    c->sizes.erase(ptr);
  }
  c->live_bytes += (int64_t)nsize;
  c->live_blocks++;
  c->sizes[p] = nsize;
  if (c->live_bytes > c->peak_bytes) c->peak_bytes = c->live_bytes;
  return p;
}

dsc_type T(dsc_dtype dt, std::vector<int64_t> dims) {
  return dsc_type_make(dt, (int)dims.size(), dims.data());
}

bool near_rel(double got, double ref, double rtol) {
  if (std::isnan(ref)) return std::isnan(got);
  if (std::isinf(ref)) return got == ref;
  return std::fabs(got - ref) <= rtol * std::max(1.0, std::fabs(ref));
}

#define EXPECT_NEAR_REL(got, ref, rtol) \
  EXPECT_TRUE(near_rel((got), (ref), (rtol))) << "got " << (got) << " want " << (ref)

const double kF64 = 1e-12;
const double kF32 = 1e-6;

class Interp : public ::testing::Test {
 protected:
  Counter cnt;
  dsc_context *ctx = nullptr;
  dsc_module *m = nullptr;
  dsc_graph *g = nullptr;
  std::mt19937 rng{20240611};
  std::vector<dsc_tensor *> owned;

  void SetUp() override {
    ctx = dsc_context_new(counting_alloc, &cnt);
    ASSERT_NE(ctx, nullptr);
    m = dsc_module_new(ctx, "t");
    g = dsc_graph_new(m, "main");
    ASSERT_NE(g, nullptr);
  }
  void TearDown() override {
    for (dsc_tensor *t : owned) dsc_tensor_free(ctx, t);
    dsc_module_free(m);
    dsc_context_free(ctx);
    EXPECT_EQ(cnt.live_bytes, 0) << "leaked bytes";
    EXPECT_EQ(cnt.live_blocks, 0) << "leaked blocks";
    EXPECT_FALSE(cnt.size_mismatch) << "a free passed a size different from the allocation";
  }

  // Random non-zero value: magnitude in [0.1, 2), random sign.
  double nz() {
    std::uniform_real_distribution<double> mag(0.1, 2.0);
    return (rng() & 1 ? -1.0 : 1.0) * mag(rng);
  }
  double pos() { return std::uniform_real_distribution<double>(0.1, 3.0)(rng); }

  dsc_tensor *tensor(dsc_type t) {
    dsc_tensor *x = dsc_tensor_new(ctx, t);
    EXPECT_NE(x, nullptr);
    owned.push_back(x);
    return x;
  }
  // Random non-zero tensor, representable in its dtype.
  dsc_tensor *rnd(dsc_type t, bool positive = false) {
    dsc_tensor *x = tensor(t);
    int64_t n = dsc_type_numel(&t);
    for (int64_t i = 0; i < n; i++) {
      double v = positive ? pos() : nz();
      if (t.dtype == DSC_F32) v = (double)(float)v;
      x->data[i] = v;
    }
    return x;
  }
  dsc_tensor *vals(dsc_type t, std::vector<double> v) {
    dsc_tensor *x = tensor(t);
    EXPECT_EQ((int64_t)v.size(), dsc_type_numel(&t));
    for (size_t i = 0; i < v.size(); i++) x->data[i] = v[i];
    return x;
  }
  dsc_tensor *ints(dsc_type t, int64_t lo, int64_t hi) {
    dsc_tensor *x = tensor(t);
    std::uniform_int_distribution<int64_t> d(lo, hi - 1);
    for (int64_t i = 0; i < dsc_type_numel(&t); i++) x->data[i] = (double)d(rng);
    return x;
  }
  dsc_node *input(const char *name, dsc_type t) { return dsc_graph_input(g, name, t); }

  std::string diag_text() { return diags(ctx); }
  std::string last_error() {
    int n = dsc_diag_count(ctx);
    return n ? dsc_diag_get(ctx, n - 1)->message : "";
  }

  // Runs the graph with the given outputs and inputs; asserts success.
  std::vector<dsc_tensor *> run(std::vector<dsc_node *> outs, std::vector<dsc_tensor *> ins,
                                const dsc_params *params = nullptr) {
    for (dsc_node *o : outs) EXPECT_NE(o, nullptr) << diag_text();
    if (dsc_graph_set_outputs(g, outs.data(), (int)outs.size()) != DSC_OK) return {};
    std::vector<dsc_tensor *> res(outs.size(), nullptr);
    std::vector<const dsc_tensor *> cin(ins.begin(), ins.end());
    dsc_status st = dsc_interp_run(g, params, cin.data(), (int)cin.size(), res.data());
    EXPECT_EQ(st, DSC_OK) << diag_text();
    for (dsc_tensor *t : res)
      if (t) owned.push_back(t);
    return res;
  }
  dsc_tensor *run1(dsc_node *out, std::vector<dsc_tensor *> ins, const dsc_params *p = nullptr) {
    auto r = run({out}, ins, p);
    return r.empty() ? nullptr : r[0];
  }
  // Runs expecting failure; returns the status.
  dsc_status run_fail(dsc_node *out, std::vector<dsc_tensor *> ins) {
    EXPECT_NE(out, nullptr) << diag_text();
    dsc_graph_set_outputs(g, &out, 1);
    dsc_tensor *res = reinterpret_cast<dsc_tensor *>(0x1);
    std::vector<const dsc_tensor *> cin(ins.begin(), ins.end());
    dsc_status st = dsc_interp_run(g, nullptr, cin.data(), (int)cin.size(), &res);
    EXPECT_EQ(res, nullptr) << "a failed run must not hand out an output";
    return st;
  }

  dsc_node *build(dsc_op op, std::vector<dsc_node *> in, std::vector<dsc_attr> attrs = {}) {
    return dsc_build(g, op, in.data(), (int)in.size(), attrs.data(), (int)attrs.size());
  }
};

// ---------------------------------------------------------------- sources

TEST_F(Interp, ConstFillsAndRoundsToDtype) {
  dsc_node *c = dsc_const(g, 2.5, T(DSC_F32, {2, 3}));
  dsc_node *h = dsc_const(g, 1.0 + std::ldexp(1.0, -8), T(DSC_BF16, {4}));
  auto r = run({c, h}, {});
  ASSERT_EQ(r.size(), 2u);
  for (int i = 0; i < 6; i++) EXPECT_EQ(r[0]->data[i], 2.5);
  for (int i = 0; i < 4; i++) EXPECT_EQ(r[1]->data[i], 1.0);  // tie rounds to even
}

TEST_F(Interp, IotaCountsAlongAxis) {
  int64_t shape[3] = {2, 3, 4};
  dsc_attr a[3] = {dsc_attr_int("axis", 1), dsc_attr_dtype("dtype", DSC_I32),
                   dsc_attr_ints("shape", shape, 3)};
  dsc_node *n = dsc_build(g, DSC_OP_IOTA, nullptr, 0, a, 3);
  dsc_tensor *r = run1(n, {});
  ASSERT_NE(r, nullptr);
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 3; j++)
      for (int k = 0; k < 4; k++) EXPECT_EQ(r->data[(i * 3 + j) * 4 + k], j);
}

// ---------------------------------------------------------------- binary, broadcasting

struct BinCase {
  dsc_op op;
  double (*ref)(double, double);
};

TEST_F(Interp, BinaryOpsBroadcast_2x1x3_with_4x1) {
  const BinCase cases[] = {
      {DSC_OP_ADD, [](double a, double b) { return a + b; }},
      {DSC_OP_SUB, [](double a, double b) { return a - b; }},
      {DSC_OP_MUL, [](double a, double b) { return a * b; }},
      {DSC_OP_DIV, [](double a, double b) { return a / b; }},
      {DSC_OP_MAXIMUM, [](double a, double b) { return a < b ? b : a; }},
  };
  dsc_node *x = input("x", T(DSC_F64, {2, 1, 3}));
  dsc_node *y = input("y", T(DSC_F64, {4, 1}));
  std::vector<dsc_node *> outs;
  for (const auto &c : cases) outs.push_back(dsc_binary(g, c.op, x, y));
  dsc_tensor *a = rnd(T(DSC_F64, {2, 1, 3})), *b = rnd(T(DSC_F64, {4, 1}));
  auto r = run(outs, {a, b});
  ASSERT_EQ(r.size(), 5u);
  for (size_t c = 0; c < 5; c++) {
    EXPECT_TRUE(dsc_type_equal(&r[c]->type, &outs[c]->type));
    EXPECT_EQ(r[c]->type.rank, 3);
    EXPECT_EQ(r[c]->type.dims[1], 4);
    for (int i = 0; i < 2; i++)
      for (int j = 0; j < 4; j++)
        for (int k = 0; k < 3; k++)
          EXPECT_NEAR_REL(r[c]->data[(i * 4 + j) * 3 + k],
                          cases[c].ref(a->data[i * 3 + k], b->data[j]), kF64);
  }
}

TEST_F(Interp, BinaryF32RoundsEachResult) {
  dsc_node *x = input("x", T(DSC_F32, {5, 7}));
  dsc_node *y = input("y", T(DSC_F32, {7}));
  dsc_node *o = dsc_binary(g, DSC_OP_DIV, x, y);
  dsc_tensor *a = rnd(T(DSC_F32, {5, 7})), *b = rnd(T(DSC_F32, {7}));
  dsc_tensor *r = run1(o, {a, b});
  ASSERT_NE(r, nullptr);
  for (int i = 0; i < 5; i++)
    for (int j = 0; j < 7; j++) {
      double want = (double)(float)(a->data[i * 7 + j] / b->data[j]);
      EXPECT_NEAR_REL(r->data[i * 7 + j], want, kF32);
      EXPECT_EQ(r->data[i * 7 + j], (double)(float)r->data[i * 7 + j]) << "not an f32 value";
    }
}

TEST_F(Interp, IntegerDivisionTruncatesTowardZero) {
  dsc_node *x = input("x", T(DSC_I32, {6}));
  dsc_node *y = input("y", T(DSC_I32, {6}));
  dsc_tensor *a = vals(T(DSC_I32, {6}), {7, -7, 7, -7, 9, -1});
  dsc_tensor *b = vals(T(DSC_I32, {6}), {2, 2, -2, -2, 3, 5});
  dsc_tensor *r = run1(dsc_binary(g, DSC_OP_DIV, x, y), {a, b});
  ASSERT_NE(r, nullptr);
  for (int i = 0; i < 6; i++) EXPECT_EQ(r->data[i], (int)a->data[i] / (int)b->data[i]) << i;
}

TEST_F(Interp, I32AdditionWrapsAround) {
  dsc_node *x = input("x", T(DSC_I32, {2}));
  dsc_node *y = input("y", T(DSC_I32, {2}));
  dsc_tensor *a = vals(T(DSC_I32, {2}), {2147483647.0, -2147483648.0});
  dsc_tensor *b = vals(T(DSC_I32, {2}), {1, -1});
  dsc_tensor *r = run1(dsc_binary(g, DSC_OP_ADD, x, y), {a, b});
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->data[0], -2147483648.0);
  EXPECT_EQ(r->data[1], 2147483647.0);
}

TEST_F(Interp, ComparisonsBroadcastToBool) {
  dsc_node *x = input("x", T(DSC_F64, {2, 1, 3}));
  dsc_node *y = input("y", T(DSC_F64, {4, 1}));
  dsc_node *lt = dsc_binary(g, DSC_OP_LESS, x, y);
  dsc_node *gt = dsc_binary(g, DSC_OP_GREATER, x, y);
  dsc_node *eq = dsc_binary(g, DSC_OP_EQUAL, x, y);
  EXPECT_EQ(dsc_node_type(eq).dtype, DSC_BOOL);
  // Values from {1, 2, 3} so that ties occur.
  dsc_tensor *a = ints(T(DSC_F64, {2, 1, 3}), 1, 4), *b = ints(T(DSC_F64, {4, 1}), 1, 4);
  auto r = run({lt, gt, eq}, {a, b});
  ASSERT_EQ(r.size(), 3u);
  int ties = 0;
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 4; j++)
      for (int k = 0; k < 3; k++) {
        double av = a->data[i * 3 + k], bv = b->data[j];
        int o = (i * 4 + j) * 3 + k;
        EXPECT_EQ(r[0]->data[o], av < bv ? 1.0 : 0.0);
        EXPECT_EQ(r[1]->data[o], av > bv ? 1.0 : 0.0);
        EXPECT_EQ(r[2]->data[o], av == bv ? 1.0 : 0.0);
        ties += av == bv;
      }
  EXPECT_GT(ties, 0) << "the test needs some equal pairs";
}

TEST_F(Interp, WhereBroadcastsAllThree) {
  dsc_node *c = input("c", T(DSC_BOOL, {4, 1}));
  dsc_node *x = input("x", T(DSC_F64, {2, 4, 3}));
  dsc_node *y = input("y", T(DSC_F64, {3}));
  dsc_node *w = build(DSC_OP_WHERE, {c, x, y});
  dsc_tensor *ct = vals(T(DSC_BOOL, {4, 1}), {1, 0, 0, 1});
  dsc_tensor *a = rnd(T(DSC_F64, {2, 4, 3})), *b = rnd(T(DSC_F64, {3}));
  dsc_tensor *r = run1(w, {ct, a, b});
  ASSERT_NE(r, nullptr);
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 4; j++)
      for (int k = 0; k < 3; k++)
        EXPECT_EQ(r->data[(i * 4 + j) * 3 + k],
                  ct->data[j] ? a->data[(i * 4 + j) * 3 + k] : b->data[k]);
}

// ---------------------------------------------------------------- unary

struct UnCase {
  dsc_op op;
  bool positive;
  double (*ref)(double);
};

const UnCase kUnary[] = {
    {DSC_OP_NEG, false, [](double x) { return -x; }},
    {DSC_OP_EXP, false, [](double x) { return std::exp(x); }},
    {DSC_OP_LOG, true, [](double x) { return std::log(x); }},
    {DSC_OP_SQRT, true, [](double x) { return std::sqrt(x); }},
    {DSC_OP_RSQRT, true, [](double x) { return std::pow(x, -0.5); }},
    {DSC_OP_TANH, false, [](double x) { return std::tanh(x); }},
    {DSC_OP_RELU, false, [](double x) { return x > 0 ? x : 0.0; }},
    {DSC_OP_GELU, false,
     [](double x) {
       double inner = std::sqrt(2.0 / M_PI) * (x + 0.044715 * std::pow(x, 3));
       return 0.5 * x * (1.0 + std::tanh(inner));
     }},
    {DSC_OP_SILU, false, [](double x) { return x * (1.0 / (1.0 + std::exp(-x))); }},
    {DSC_OP_SIGMOID, false, [](double x) { return std::exp(x) / (1.0 + std::exp(x)); }},
    {DSC_OP_SOFTPLUS, false, [](double x) { return std::log1p(std::exp(x)); }},
};

TEST_F(Interp, UnaryOpsF64) {
  for (const UnCase &c : kUnary) {
    SCOPED_TRACE(dsc_op_name(c.op));
    dsc_graph *save = g;
    g = dsc_graph_new(m, dsc_op_name(c.op));
    dsc_node *x = input("x", T(DSC_F64, {3, 4}));
    dsc_tensor *a = rnd(T(DSC_F64, {3, 4}), c.positive);
    dsc_tensor *r = run1(dsc_unary(g, c.op, x), {a});
    ASSERT_NE(r, nullptr);
    for (int i = 0; i < 12; i++) EXPECT_NEAR_REL(r->data[i], c.ref(a->data[i]), kF64);
    g = save;
  }
}

TEST_F(Interp, UnaryOpsF32AgainstRoundedF64) {
  for (const UnCase &c : kUnary) {
    SCOPED_TRACE(dsc_op_name(c.op));
    g = dsc_graph_new(m, dsc_op_name(c.op));
    dsc_node *x = input("x", T(DSC_F32, {17}));
    dsc_tensor *a = rnd(T(DSC_F32, {17}), c.positive);
    dsc_tensor *r = run1(dsc_unary(g, c.op, x), {a});
    ASSERT_NE(r, nullptr);
    for (int i = 0; i < 17; i++)
      EXPECT_NEAR_REL(r->data[i], (double)(float)c.ref(a->data[i]), kF32);
  }
}

TEST_F(Interp, PowUsesExponentAttribute) {
  dsc_node *x = input("x", T(DSC_F64, {9}));
  dsc_attr e = dsc_attr_float("exponent", 2.5);
  dsc_node *p = build(DSC_OP_POW, {x}, {e});
  dsc_tensor *a = rnd(T(DSC_F64, {9}), true);
  dsc_tensor *r = run1(p, {a});
  ASSERT_NE(r, nullptr);
  for (int i = 0; i < 9; i++)
    EXPECT_NEAR_REL(r->data[i], a->data[i] * a->data[i] * std::sqrt(a->data[i]), kF64);
}

TEST_F(Interp, NegAndReluOnIntegers) {
  dsc_node *x = input("x", T(DSC_I64, {4}));
  dsc_tensor *a = vals(T(DSC_I64, {4}), {-3, 5, -1, 2});
  auto r = run({dsc_unary(g, DSC_OP_NEG, x), dsc_unary(g, DSC_OP_RELU, x)}, {a});
  ASSERT_EQ(r.size(), 2u);
  const double neg[] = {3, -5, 1, -2}, relu[] = {0, 5, 0, 2};
  for (int i = 0; i < 4; i++) {
    EXPECT_EQ(r[0]->data[i], neg[i]);
    EXPECT_EQ(r[1]->data[i], relu[i]);
  }
}

TEST_F(Interp, CastTruncatesRoundsAndTestsNonZero) {
  dsc_node *x = input("x", T(DSC_F64, {6}));
  const double in[] = {-2.7, 2.7, -0.5, 0.0, 1.0 + std::ldexp(1.0, -11), 65520.0};
  dsc_tensor *a = vals(T(DSC_F64, {6}), std::vector<double>(in, in + 6));
  auto r = run({dsc_cast(g, x, DSC_I32), dsc_cast(g, x, DSC_BOOL), dsc_cast(g, x, DSC_F16),
                dsc_cast(g, x, DSC_F32)},
               {a});
  ASSERT_EQ(r.size(), 4u);
  const double i32[] = {-2, 2, 0, 0, 1, 65520}, b[] = {1, 1, 1, 0, 1, 1};
  const double f16[] = {-2.69921875, 2.69921875, -0.5, 0, 1.0, INFINITY};
  for (int i = 0; i < 6; i++) {
    EXPECT_EQ(r[0]->data[i], i32[i]) << i;
    EXPECT_EQ(r[1]->data[i], b[i]) << i;
    EXPECT_EQ(r[2]->data[i], f16[i]) << i;
    EXPECT_EQ(r[3]->data[i], (double)(float)in[i]) << i;
  }
}

// ---------------------------------------------------------------- reductions

TEST_F(Interp, SumMeanMaxOverAxes0And2) {
  dsc_node *x = input("x", T(DSC_F64, {3, 4, 5}));
  int64_t axes[2] = {0, 2};
  dsc_node *s = dsc_reduce(g, DSC_OP_SUM, x, axes, 2, 0);
  dsc_node *sk = dsc_reduce(g, DSC_OP_SUM, x, axes, 2, 1);
  dsc_node *mn = dsc_reduce(g, DSC_OP_MEAN, x, axes, 2, 0);
  dsc_node *mx = dsc_reduce(g, DSC_OP_MAX, x, axes, 2, 1);
  dsc_tensor *a = rnd(T(DSC_F64, {3, 4, 5}));
  auto r = run({s, sk, mn, mx}, {a});
  ASSERT_EQ(r.size(), 4u);
  dsc_type want_keep = T(DSC_F64, {1, 4, 1}), want = T(DSC_F64, {4});
  EXPECT_TRUE(dsc_type_equal(&r[0]->type, &want));
  EXPECT_TRUE(dsc_type_equal(&r[1]->type, &want_keep));
  for (int j = 0; j < 4; j++) {
    double sum = 0, best = -1e300;
    for (int i = 0; i < 3; i++)
      for (int k = 0; k < 5; k++) {
        double v = a->data[(i * 4 + j) * 5 + k];
        sum += v;
        best = std::max(best, v);
      }
    EXPECT_NEAR_REL(r[0]->data[j], sum, kF64);
    EXPECT_NEAR_REL(r[1]->data[j], sum, kF64);
    EXPECT_NEAR_REL(r[2]->data[j], sum / 15.0, kF64);
    EXPECT_EQ(r[3]->data[j], best);
  }
}

TEST_F(Interp, ReduceAllAxesGivesRankZeroAndEmptyAxesIsIdentity) {
  dsc_node *x = input("x", T(DSC_F64, {3, 4}));
  int64_t all[2] = {0, 1};
  dsc_node *s = dsc_reduce(g, DSC_OP_SUM, x, all, 2, 0);
  dsc_node *id = dsc_reduce(g, DSC_OP_MAX, x, nullptr, 0, 0);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(dsc_node_type(s).rank, 0);
  dsc_tensor *a = rnd(T(DSC_F64, {3, 4}));
  auto r = run({s, id}, {a});
  ASSERT_EQ(r.size(), 2u);
  double sum = 0;
  for (int i = 0; i < 12; i++) sum += a->data[i];
  EXPECT_NEAR_REL(r[0]->data[0], sum, kF64);
  for (int i = 0; i < 12; i++) EXPECT_EQ(r[1]->data[i], a->data[i]);
}

// ---------------------------------------------------------------- layout

TEST_F(Interp, ReshapeKeepsRowMajorOrder) {
  dsc_node *x = input("x", T(DSC_F64, {3, 4, 5}));
  int64_t shape[2] = {20, 3};
  dsc_tensor *a = rnd(T(DSC_F64, {3, 4, 5}));
  dsc_tensor *r = run1(dsc_reshape(g, x, shape, 2), {a});
  ASSERT_NE(r, nullptr);
  for (int i = 0; i < 20; i++)
    for (int j = 0; j < 3; j++) EXPECT_EQ(r->data[i * 3 + j], a->data[i * 3 + j]);
  EXPECT_EQ(r->type.dims[0], 20);
}

TEST_F(Interp, PermuteMovesAxes) {
  dsc_node *x = input("x", T(DSC_F64, {2, 3, 4}));
  int64_t perm[3] = {2, 0, 1};
  dsc_tensor *a = rnd(T(DSC_F64, {2, 3, 4}));
  dsc_tensor *r = run1(dsc_permute(g, x, perm, 3), {a});
  ASSERT_NE(r, nullptr);
  dsc_type want = T(DSC_F64, {4, 2, 3});
  EXPECT_TRUE(dsc_type_equal(&r->type, &want));
  for (int p = 0; p < 4; p++)
    for (int q = 0; q < 2; q++)
      for (int s = 0; s < 3; s++)
        EXPECT_EQ(r->data[(p * 2 + q) * 3 + s], a->data[(q * 3 + s) * 4 + p]);
}

TEST_F(Interp, SliceTakesRangeOnAxis) {
  dsc_node *x = input("x", T(DSC_F64, {3, 4, 5}));
  dsc_node *s = build(DSC_OP_SLICE, {x},
                      {dsc_attr_int("axis", 1), dsc_attr_int("start", 1), dsc_attr_int("end", 3)});
  dsc_tensor *a = rnd(T(DSC_F64, {3, 4, 5}));
  dsc_tensor *r = run1(s, {a});
  ASSERT_NE(r, nullptr);
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 2; j++)
      for (int k = 0; k < 5; k++)
        EXPECT_EQ(r->data[(i * 2 + j) * 5 + k], a->data[(i * 4 + j + 1) * 5 + k]);
}

TEST_F(Interp, ConcatJoinsOnAxis1) {
  dsc_node *x = input("x", T(DSC_F64, {2, 1, 3}));
  dsc_node *y = input("y", T(DSC_F64, {2, 2, 3}));
  dsc_node *z = input("z", T(DSC_F64, {2, 3, 3}));
  dsc_node *c = build(DSC_OP_CONCAT, {x, y, z}, {dsc_attr_int("axis", 1)});
  dsc_tensor *a = rnd(T(DSC_F64, {2, 1, 3})), *b = rnd(T(DSC_F64, {2, 2, 3})),
             *d = rnd(T(DSC_F64, {2, 3, 3}));
  dsc_tensor *r = run1(c, {a, b, d});
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->type.dims[1], 6);
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 6; j++)
      for (int k = 0; k < 3; k++) {
        double want = j < 1   ? a->data[(i * 1 + j) * 3 + k]
                      : j < 3 ? b->data[(i * 2 + j - 1) * 3 + k]
                              : d->data[(i * 3 + j - 3) * 3 + k];
        EXPECT_EQ(r->data[(i * 6 + j) * 3 + k], want);
      }
}

TEST_F(Interp, BroadcastExpandsToShape) {
  dsc_node *x = input("x", T(DSC_F64, {3, 1}));
  int64_t shape[3] = {2, 3, 4};
  dsc_node *b = build(DSC_OP_BROADCAST, {x}, {dsc_attr_ints("shape", shape, 3)});
  dsc_tensor *a = rnd(T(DSC_F64, {3, 1}));
  dsc_tensor *r = run1(b, {a});
  ASSERT_NE(r, nullptr);
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 3; j++)
      for (int k = 0; k < 4; k++) EXPECT_EQ(r->data[(i * 3 + j) * 4 + k], a->data[j]);
}

TEST_F(Interp, EmbeddingGathersRows) {
  dsc_node *tab = input("tab", T(DSC_F64, {5, 4}));
  dsc_node *ids = input("ids", T(DSC_I64, {2, 3}));
  dsc_tensor *t = rnd(T(DSC_F64, {5, 4})), *id = ints(T(DSC_I64, {2, 3}), 0, 5);
  dsc_tensor *r = run1(build(DSC_OP_EMBEDDING, {tab, ids}), {t, id});
  ASSERT_NE(r, nullptr);
  dsc_type want = T(DSC_F64, {2, 3, 4});
  EXPECT_TRUE(dsc_type_equal(&r->type, &want));
  for (int p = 0; p < 6; p++)
    for (int d = 0; d < 4; d++) EXPECT_EQ(r->data[p * 4 + d], t->data[(int)id->data[p] * 4 + d]);
}

// ---------------------------------------------------------------- matmul

TEST_F(Interp, BatchedMatmulBroadcastsBatchDims) {
  dsc_node *x = input("x", T(DSC_F64, {2, 1, 3, 4}));
  dsc_node *y = input("y", T(DSC_F64, {3, 4, 5}));
  dsc_tensor *a = rnd(T(DSC_F64, {2, 1, 3, 4})), *b = rnd(T(DSC_F64, {3, 4, 5}));
  dsc_tensor *r = run1(dsc_matmul(g, x, y), {a, b});
  ASSERT_NE(r, nullptr);
  dsc_type want = T(DSC_F64, {2, 3, 3, 5});
  EXPECT_TRUE(dsc_type_equal(&r->type, &want));
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 3; j++)
      for (int mm = 0; mm < 3; mm++)
        for (int nn = 0; nn < 5; nn++) {
          double acc = 0;
          for (int k = 0; k < 4; k++)
            acc += a->data[(i * 3 + mm) * 4 + k] * b->data[(j * 4 + k) * 5 + nn];
          EXPECT_NEAR_REL(r->data[((i * 3 + j) * 3 + mm) * 5 + nn], acc, kF64);
        }
}

TEST_F(Interp, MatmulF32AgainstRoundedF64) {
  dsc_node *x = input("x", T(DSC_F32, {7, 9}));
  dsc_node *y = input("y", T(DSC_F32, {9, 6}));
  dsc_tensor *a = rnd(T(DSC_F32, {7, 9})), *b = rnd(T(DSC_F32, {9, 6}));
  dsc_tensor *r = run1(dsc_matmul(g, x, y), {a, b});
  ASSERT_NE(r, nullptr);
  for (int i = 0; i < 7; i++)
    for (int j = 0; j < 6; j++) {
      double acc = 0;
      for (int k = 0; k < 9; k++) acc += a->data[i * 9 + k] * b->data[k * 6 + j];
      EXPECT_NEAR_REL(r->data[i * 6 + j], (double)(float)acc, kF32);
    }
}

// ---------------------------------------------------------------- composites

TEST_F(Interp, SoftmaxAndLogSoftmaxOnMiddleAxis) {
  dsc_node *x = input("x", T(DSC_F64, {3, 4, 5}));
  dsc_attr ax = dsc_attr_int("axis", 1);
  dsc_node *s = build(DSC_OP_SOFTMAX, {x}, {ax});
  dsc_node *ls = build(DSC_OP_LOG_SOFTMAX, {x}, {ax});
  dsc_tensor *a = rnd(T(DSC_F64, {3, 4, 5}));
  auto r = run({s, ls}, {a});
  ASSERT_EQ(r.size(), 2u);
  for (int i = 0; i < 3; i++)
    for (int k = 0; k < 5; k++) {
      double z = 0;
      for (int j = 0; j < 4; j++) z += std::exp(a->data[(i * 4 + j) * 5 + k]);
      for (int j = 0; j < 4; j++) {
        double v = a->data[(i * 4 + j) * 5 + k];
        EXPECT_NEAR_REL(r[0]->data[(i * 4 + j) * 5 + k], std::exp(v) / z, kF64);
        EXPECT_NEAR_REL(r[1]->data[(i * 4 + j) * 5 + k], v - std::log(z), kF64);
      }
    }
}

TEST_F(Interp, SoftmaxIsStableForLargeLogits) {
  dsc_node *x = input("x", T(DSC_F32, {3}));
  dsc_tensor *a = vals(T(DSC_F32, {3}), {1000, 1001, 999});
  auto r = run({build(DSC_OP_SOFTMAX, {x}, {dsc_attr_int("axis", 0)}),
                build(DSC_OP_LOG_SOFTMAX, {x}, {dsc_attr_int("axis", 0)})},
               {a});
  ASSERT_EQ(r.size(), 2u);
  double z = std::exp(-1.0) + 1.0 + std::exp(-2.0);
  EXPECT_NEAR_REL(r[0]->data[1], (double)(float)(1.0 / z), kF32);
  EXPECT_NEAR_REL(r[1]->data[2], (double)(float)(-2.0 - std::log(z)), kF32);
}

TEST_F(Interp, LayernormAndRmsnorm) {
  const int R = 6, D = 8;
  dsc_node *x = input("x", T(DSC_F64, {2, 3, D}));
  dsc_node *w = input("w", T(DSC_F64, {D}));
  dsc_node *b = input("b", T(DSC_F64, {D}));
  dsc_attr eps = dsc_attr_float("eps", 1e-5);
  dsc_node *ln = build(DSC_OP_LAYERNORM, {x, w, b}, {eps});
  dsc_node *rms = build(DSC_OP_RMSNORM, {x, w}, {eps});
  dsc_tensor *xa = rnd(T(DSC_F64, {2, 3, D})), *wa = rnd(T(DSC_F64, {D})),
             *ba = rnd(T(DSC_F64, {D}));
  auto r = run({ln, rms}, {xa, wa, ba});
  ASSERT_EQ(r.size(), 2u);
  for (int row = 0; row < R; row++) {
    const double *v = xa->data + row * D;
    double mu = 0, sq = 0;
    for (int j = 0; j < D; j++) mu += v[j] / D;
    double var = 0;
    for (int j = 0; j < D; j++) var += (v[j] - mu) * (v[j] - mu) / D;
    for (int j = 0; j < D; j++) sq += v[j] * v[j] / D;
    for (int j = 0; j < D; j++) {
      EXPECT_NEAR_REL(r[0]->data[row * D + j],
                      (v[j] - mu) / std::sqrt(var + 1e-5) * wa->data[j] + ba->data[j], kF64);
      EXPECT_NEAR_REL(r[1]->data[row * D + j], v[j] / std::sqrt(sq + 1e-5) * wa->data[j], kF64);
    }
  }
}

// Explicit per-head reference: full score matrix, mask, softmax, weighted sum.
static std::vector<double> attention_ref(const dsc_tensor *q, const dsc_tensor *k,
                                         const dsc_tensor *v, int B, int Tn, int C, int H,
                                         bool causal) {
  std::vector<double> out((size_t)B * Tn * C, 0.0);
  int hd = C / H;
  for (int b = 0; b < B; b++)
    for (int h = 0; h < H; h++) {
      std::vector<std::vector<double>> S(Tn, std::vector<double>(Tn));
      for (int t = 0; t < Tn; t++)
        for (int s = 0; s < Tn; s++) {
          double dot = 0;
          for (int d = 0; d < hd; d++)
            dot += q->data[(b * Tn + t) * C + h * hd + d] * k->data[(b * Tn + s) * C + h * hd + d];
          S[t][s] = (causal && s > t) ? -INFINITY : dot / std::sqrt((double)hd);
        }
      for (int t = 0; t < Tn; t++) {
        double z = 0;
        for (int s = 0; s < Tn; s++) z += std::exp(S[t][s]);
        for (int d = 0; d < hd; d++) {
          double acc = 0;
          for (int s = 0; s < Tn; s++)
            acc += std::exp(S[t][s]) / z * v->data[(b * Tn + s) * C + h * hd + d];
          out[(b * Tn + t) * C + h * hd + d] = acc;
        }
      }
    }
  return out;
}

TEST_F(Interp, AttentionCausalAndNonCausalPerHead) {
  const int B = 2, Tn = 5, C = 6, H = 3;
  dsc_type ty = T(DSC_F64, {B, Tn, C});
  dsc_node *q = input("q", ty), *k = input("k", ty), *v = input("v", ty);
  dsc_node *ac = dsc_attention(g, q, k, v, H, H, true, 0);
  dsc_node *an = dsc_attention(g, q, k, v, H, H, false, 0);
  dsc_tensor *qa = rnd(ty), *ka = rnd(ty), *va = rnd(ty);
  auto r = run({ac, an}, {qa, ka, va});
  ASSERT_EQ(r.size(), 2u);
  auto rc = attention_ref(qa, ka, va, B, Tn, C, H, true);
  auto rn = attention_ref(qa, ka, va, B, Tn, C, H, false);
  int differ = 0;
  for (size_t i = 0; i < rc.size(); i++) {
    EXPECT_NEAR_REL(r[0]->data[i], rc[i], kF64) << i;
    EXPECT_NEAR_REL(r[1]->data[i], rn[i], kF64) << i;
    differ += std::fabs(rc[i] - rn[i]) > 1e-9;
  }
  EXPECT_GT(differ, 0) << "the causal mask must change the result";
  // The first query sees only itself under the mask: output = v row 0.
  for (int c = 0; c < C; c++) EXPECT_NEAR_REL(r[0]->data[c], va->data[c], kF64);
}

TEST_F(Interp, CrossEntropyMatchesLogSumExp) {
  dsc_node *lg = input("logits", T(DSC_F64, {2, 3, 7}));
  dsc_node *tg = input("targets", T(DSC_I32, {2, 3}));
  dsc_node *ce = build(DSC_OP_CROSS_ENTROPY, {lg, tg});
  ASSERT_NE(ce, nullptr);
  EXPECT_EQ(dsc_node_type(ce).rank, 0);
  dsc_tensor *la = rnd(T(DSC_F64, {2, 3, 7})), *ta = ints(T(DSC_I32, {2, 3}), 0, 7);
  dsc_tensor *r = run1(ce, {la, ta});
  ASSERT_NE(r, nullptr);
  double loss = 0;
  for (int p = 0; p < 6; p++) {
    double z = 0;
    for (int j = 0; j < 7; j++) z += std::exp(la->data[p * 7 + j]);
    loss += std::log(z) - la->data[p * 7 + (int)ta->data[p]];
  }
  EXPECT_NEAR_REL(r->data[0], loss / 6, kF64);
}

TEST_F(Interp, CrossEntropyF32IsStableForLargeLogits) {
  dsc_node *lg = input("logits", T(DSC_F32, {2, 3}));
  dsc_node *tg = input("targets", T(DSC_I64, {2}));
  dsc_tensor *la = vals(T(DSC_F32, {2, 3}), {500, 501, 502, -300, -301, -299});
  dsc_tensor *ta = vals(T(DSC_I64, {2}), {0, 2});
  dsc_tensor *r = run1(build(DSC_OP_CROSS_ENTROPY, {lg, tg}), {la, ta});
  ASSERT_NE(r, nullptr);
  double l0 = std::log(std::exp(-2.0) + std::exp(-1.0) + 1.0) + 2.0;
  double l1 = std::log(std::exp(-1.0) + std::exp(-2.0) + 1.0);
  EXPECT_NEAR_REL(r->data[0], (double)(float)((l0 + l1) / 2), kF32);
}

// ---------------------------------------------------------------- runtime errors

TEST_F(Interp, EmbeddingIdOutOfRangeIsAUserError) {
  dsc_node *tab = input("tab", T(DSC_F64, {5, 4}));
  dsc_node *ids = input("ids", T(DSC_I32, {3}));
  dsc_node *e = build(DSC_OP_EMBEDDING, {tab, ids});
  dsc_node *out = dsc_unary(g, DSC_OP_TANH, e);
  dsc_tensor *t = rnd(T(DSC_F64, {5, 4})), *id = vals(T(DSC_I32, {3}), {1, 5, 2});
  EXPECT_EQ(run_fail(out, {t, id}), DSC_ERR_USER);
  EXPECT_EQ(last_error(), "runtime error in embedding: id 5 at position 1 is out of range [0, 5)");
}

TEST_F(Interp, CrossEntropyTargetOutOfRangeIsAUserError) {
  dsc_node *lg = input("logits", T(DSC_F64, {2, 3}));
  dsc_node *tg = input("targets", T(DSC_I64, {2}));
  dsc_node *sq = dsc_binary(g, DSC_OP_MUL, lg, lg);  // an intermediate alive at the error
  dsc_node *ce = build(DSC_OP_CROSS_ENTROPY, {sq, tg});
  dsc_tensor *la = rnd(T(DSC_F64, {2, 3})), *ta = vals(T(DSC_I64, {2}), {0, -1});
  EXPECT_EQ(run_fail(ce, {la, ta}), DSC_ERR_USER);
  EXPECT_EQ(last_error(),
            "runtime error in cross_entropy: target -1 at position 1 is out of range [0, 3)");
}

TEST_F(Interp, IntegerDivisionByZeroIsAUserErrorAtTheNodeLocation) {
  dsc_node *x = input("x", T(DSC_I64, {3}));
  dsc_node *y = input("y", T(DSC_I64, {3}));
  dsc_loc loc = {"model.dsm", 7, 3};
  dsc_graph_set_loc(g, loc);
  dsc_node *d = dsc_binary(g, DSC_OP_DIV, x, y);
  dsc_tensor *a = vals(T(DSC_I64, {3}), {4, 5, 6}), *b = vals(T(DSC_I64, {3}), {1, 0, 2});
  EXPECT_EQ(run_fail(d, {a, b}), DSC_ERR_USER);
  EXPECT_EQ(last_error(), "runtime error in div: integer division by zero (divisor element 1)");
  const dsc_diag *dg = dsc_diag_get(ctx, dsc_diag_count(ctx) - 1);
  ASSERT_NE(dg->loc.file, nullptr);
  EXPECT_STREQ(dg->loc.file, "model.dsm");
  EXPECT_EQ(dg->loc.line, 7);
  EXPECT_EQ(dg->loc.col, 3);
}

TEST_F(Interp, InputTypeMismatchNamesTheInput) {
  dsc_node *x = input("x", T(DSC_F32, {2, 3}));
  dsc_tensor *a = rnd(T(DSC_F32, {3, 2}));
  EXPECT_EQ(run_fail(dsc_unary(g, DSC_OP_NEG, x), {a}), DSC_ERR_USER);
  EXPECT_EQ(last_error(), "input 'x' of graph 'main' expects f32[2,3], got f32[3,2]");
}

TEST_F(Interp, WrongInputCountIsAUserError) {
  dsc_node *x = input("x", T(DSC_F32, {2}));
  EXPECT_EQ(run_fail(dsc_unary(g, DSC_OP_NEG, x), {}), DSC_ERR_USER);
  EXPECT_EQ(last_error(), "graph 'main' takes 1 input(s), got 0");
}

TEST_F(Interp, OutOfMemoryForAnOutputIsReported) {
  dsc_node *x = input("x", T(DSC_F64, {64, 64}));
  dsc_node *y = dsc_unary(g, DSC_OP_TANH, x);
  dsc_node *z = dsc_matmul(g, y, y);
  dsc_tensor *a = rnd(T(DSC_F64, {64, 64}));
  dsc_graph_set_outputs(g, &z, 1);
  cnt.fail_above = 20000;  // each 64x64 f64 tensor needs 32768 bytes of data
  dsc_tensor *out = nullptr;
  const dsc_tensor *in[1] = {a};
  EXPECT_EQ(dsc_interp_run(g, nullptr, in, 1, &out), DSC_ERR_INTERNAL);
  cnt.fail_above = SIZE_MAX;
  EXPECT_EQ(out, nullptr);
  EXPECT_EQ(last_error(), "out of memory: need 32768 bytes for tanh output");
}

// Every allocation of a run fails in turn: each run must either succeed or
// fail with DSC_ERR_INTERNAL, and leave nothing allocated behind.
TEST_F(Interp, EveryAllocationFailureIsCleanedUp) {
  dsc_node *x = input("x", T(DSC_F64, {4, 4}));
  dsc_node *y = dsc_unary(g, DSC_OP_EXP, x);
  dsc_node *z = dsc_binary(g, DSC_OP_ADD, y, x);
  dsc_node *w = dsc_matmul(g, z, y);
  dsc_node *outs[3] = {w, z, x};  // includes an input, which must be copied
  ASSERT_EQ(dsc_graph_set_outputs(g, outs, 3), DSC_OK);
  dsc_tensor *a = rnd(T(DSC_F64, {4, 4}));
  const dsc_tensor *in[1] = {a};
  bool succeeded = false;
  for (int fail_at = 1; fail_at < 40 && !succeeded; fail_at++) {
    dsc_diag_clear(ctx);
    int64_t before = cnt.live_bytes;
    cnt.fail_countdown = fail_at;
    dsc_tensor *res[3] = {nullptr, nullptr, nullptr};
    dsc_status st = dsc_interp_run(g, nullptr, in, 1, res);
    cnt.fail_countdown = -1;
    if (st == DSC_OK) {
      succeeded = true;
      for (dsc_tensor *t : res) {
        ASSERT_NE(t, nullptr);
        dsc_tensor_free(ctx, t);
      }
    } else {
      EXPECT_EQ(st, DSC_ERR_INTERNAL) << "fail_at " << fail_at;
      for (dsc_tensor *t : res) EXPECT_EQ(t, nullptr);
    }
    dsc_diag_clear(ctx);
    EXPECT_EQ(cnt.live_bytes, before) << "leak with allocation " << fail_at << " failing";
  }
  EXPECT_TRUE(succeeded);
}

TEST_F(Interp, OutputsThatAreInputsOrRepeatedAreSeparateTensors) {
  dsc_node *x = input("x", T(DSC_F64, {3}));
  dsc_node *y = dsc_unary(g, DSC_OP_NEG, x);
  dsc_tensor *a = rnd(T(DSC_F64, {3}));
  auto r = run({y, y, x}, {a});
  ASSERT_EQ(r.size(), 3u);
  EXPECT_NE(r[0], r[1]);
  EXPECT_NE(r[2], a);
  for (int i = 0; i < 3; i++) {
    EXPECT_EQ(r[0]->data[i], -a->data[i]);
    EXPECT_EQ(r[1]->data[i], -a->data[i]);
    EXPECT_EQ(r[2]->data[i], a->data[i]);
  }
}

// A long chain: with intermediates freed after their last use, the peak
// stays at a few tensors instead of one per node.
TEST_F(Interp, LongChainFreesIntermediates) {
  const int N = 300;
  dsc_node *x = input("x", T(DSC_F64, {64, 64}));
  dsc_node *c = dsc_const(g, 0.5, T(DSC_F64, {64, 64}));
  dsc_node *h = x;
  for (int i = 0; i < N; i++) h = dsc_binary(g, DSC_OP_ADD, dsc_unary(g, DSC_OP_TANH, h), c);
  dsc_tensor *a = rnd(T(DSC_F64, {64, 64}));
  int64_t base = cnt.live_bytes;
  cnt.peak_bytes = base;
  dsc_tensor *r = run1(h, {a});
  ASSERT_NE(r, nullptr);
  const int64_t tensor_bytes = 64 * 64 * 8;
  EXPECT_LT(cnt.peak_bytes - base, 6 * tensor_bytes + 64 * 1024) << "intermediates are not freed";
  for (int i = 0; i < 64 * 64; i += 97) {
    double v = a->data[i];
    for (int k = 0; k < N; k++) v = std::tanh(v) + 0.5;
    EXPECT_NEAR_REL(r->data[i], v, kF64);
  }
}

// ---------------------------------------------------------------- shape rules

struct Rejects : Interp {
  void expect_error(dsc_node *n, const std::string &msg) {
    EXPECT_EQ(n, nullptr);
    EXPECT_EQ(last_error(), msg);
  }
};

TEST_F(Rejects, ElementwiseFamily) {
  dsc_node *a = input("a", T(DSC_F32, {4, 3}));
  dsc_node *b = input("b", T(DSC_F32, {5}));
  dsc_node *i = input("i", T(DSC_I32, {4, 3}));
  dsc_node *bo = input("bo", T(DSC_BOOL, {4, 3}));
  expect_error(dsc_binary(g, DSC_OP_ADD, a, b), "add: shapes f32[4,3] and f32[5] do not broadcast");
  expect_error(dsc_binary(g, DSC_OP_MUL, a, i), "mul: dtypes differ: f32[4,3] and i32[4,3]");
  expect_error(dsc_binary(g, DSC_OP_SUB, bo, bo), "sub: operands must not be bool, got bool[4,3]");
  expect_error(dsc_binary(g, DSC_OP_LESS, a, b),
               "less: shapes f32[4,3] and f32[5] do not broadcast");
  expect_error(build(DSC_OP_WHERE, {a, a, a}), "where: condition must be bool, got f32[4,3]");
  expect_error(build(DSC_OP_WHERE, {bo, a, i}), "where: dtypes differ: f32[4,3] and i32[4,3]");
  expect_error(dsc_unary(g, DSC_OP_EXP, i), "exp: operand must be a float type, got i32[4,3]");
  expect_error(dsc_unary(g, DSC_OP_NEG, bo), "neg: operand must not be bool, got bool[4,3]");
  int before = dsc_diag_count(ctx);
  EXPECT_EQ(dsc_binary(g, DSC_OP_ADD, a, nullptr), nullptr);  // earlier failure: no new diagnostic
  EXPECT_EQ(dsc_diag_count(ctx), before);
}

TEST_F(Rejects, ReductionFamily) {
  dsc_node *a = input("a", T(DSC_F32, {4, 3}));
  dsc_node *i = input("i", T(DSC_I32, {4, 3}));
  int64_t bad[1] = {3}, dec[2] = {1, 0};
  expect_error(dsc_reduce(g, DSC_OP_SUM, a, bad, 1, 0), "sum: axis 3 out of range for rank 2");
  expect_error(dsc_reduce(g, DSC_OP_MAX, a, dec, 2, 0),
               "max: axes must be strictly increasing, got 0 after 1");
  int64_t ok[1] = {0};
  expect_error(dsc_reduce(g, DSC_OP_MEAN, i, ok, 1, 0),
               "mean: operand must be a float type, got i32[4,3]");
  expect_error(build(DSC_OP_SOFTMAX, {a}, {dsc_attr_int("axis", 2)}),
               "softmax: axis 2 out of range for rank 2");
  expect_error(build(DSC_OP_LOG_SOFTMAX, {i}, {dsc_attr_int("axis", 0)}),
               "log_softmax: operand must be a float type, got i32[4,3]");
}

TEST_F(Rejects, LayoutFamily) {
  dsc_node *a = input("a", T(DSC_F32, {4, 3}));
  dsc_node *b = input("b", T(DSC_F32, {4, 5}));
  dsc_node *c = input("c", T(DSC_F32, {4}));
  int64_t s5[2] = {5, 2}, sneg[2] = {-1, 12};
  expect_error(dsc_reshape(g, a, s5, 2),
               "reshape: cannot reshape f32[4,3] to f32[5,2]: element counts differ");
  expect_error(dsc_reshape(g, a, sneg, 2), "reshape: shape dim 0 must be positive, got -1");
  int64_t p1[2] = {0, 0}, p2[1] = {0};
  expect_error(dsc_permute(g, a, p1, 2), "permute: perm is not a permutation: axis 0 repeats");
  expect_error(dsc_permute(g, a, p2, 1), "permute: perm has 1 entries for rank 2 input f32[4,3]");
  expect_error(build(DSC_OP_SLICE, {a},
                     {dsc_attr_int("axis", 1), dsc_attr_int("start", 2), dsc_attr_int("end", 2)}),
               "slice: slice [2, 2) is not a non-empty range within [0, 3) on axis 1 of f32[4,3]");
  expect_error(build(DSC_OP_SLICE, {a},
                     {dsc_attr_int("axis", 2), dsc_attr_int("start", 0), dsc_attr_int("end", 1)}),
               "slice: axis 2 out of range for rank 2");
  expect_error(build(DSC_OP_CONCAT, {a, b}, {dsc_attr_int("axis", 0)}),
               "concat: dim 1 differs off the concat axis 0: f32[4,3] and f32[4,5] (input 1)");
  expect_error(build(DSC_OP_CONCAT, {a, c}, {dsc_attr_int("axis", 0)}),
               "concat: ranks differ: f32[4,3] and f32[4] (input 1)");
  int64_t to[2] = {4, 4};
  expect_error(build(DSC_OP_BROADCAST, {a}, {dsc_attr_ints("shape", to, 2)}),
               "broadcast: cannot broadcast f32[4,3] to f32[4,4]");
  dsc_node *ids = input("ids", T(DSC_F32, {2}));
  expect_error(build(DSC_OP_EMBEDDING, {a, ids}), "embedding: ids must be i32 or i64, got f32[2]");
  dsc_node *iid = input("iid", T(DSC_I32, {2}));
  expect_error(build(DSC_OP_EMBEDDING, {c, iid}),
               "embedding: table must have rank 2 [V, D], got f32[4]");
}

TEST_F(Rejects, MatmulFamily) {
  dsc_node *a = input("a", T(DSC_F32, {2, 3}));
  dsc_node *b = input("b", T(DSC_F32, {4, 5}));
  dsc_node *v = input("v", T(DSC_F32, {3}));
  dsc_node *ba = input("ba", T(DSC_F32, {2, 3, 4}));
  dsc_node *bb = input("bb", T(DSC_F32, {3, 4, 5}));
  dsc_node *i = input("i", T(DSC_I32, {3, 3}));
  expect_error(dsc_matmul(g, a, b), "matmul: inner dims differ: f32[2,3] x f32[4,5]");
  expect_error(dsc_matmul(g, a, v), "matmul: operands must have rank >= 2: f32[2,3] x f32[3]");
  expect_error(dsc_matmul(g, ba, bb),
               "matmul: batch dims do not broadcast: f32[2,3,4] x f32[3,4,5]");
  expect_error(dsc_matmul(g, i, i), "matmul: operands must be a float type, got i32[3,3]");
}

TEST_F(Rejects, CompositeFamily) {
  dsc_node *x = input("x", T(DSC_F32, {2, 4, 6}));
  dsc_node *w = input("w", T(DSC_F32, {5}));
  dsc_node *k = input("k", T(DSC_F32, {2, 4, 5}));
  dsc_attr eps = dsc_attr_float("eps", 1e-5);
  expect_error(build(DSC_OP_LAYERNORM, {x, w, w}, {eps}),
               "layernorm: weight must be [6] to match input f32[2,4,6], got f32[5]");
  expect_error(build(DSC_OP_RMSNORM, {x, w}, {eps}),
               "rmsnorm: weight must be [6] to match input f32[2,4,6], got f32[5]");
  expect_error(dsc_attention(g, x, x, x, 4, 4, true, 0),
               "attention: heads 4 does not divide the channel dim 6 of f32[2,4,6]");
  expect_error(dsc_attention(g, x, k, x, 2, 2, true, 0),
               "attention: k and v must have one type [B, S, C_kv] with q's batch and dtype, got "
               "q f32[2,4,6], k f32[2,4,5] and v f32[2,4,6]");
  expect_error(dsc_attention(g, x, x, x, 2, 3, true, 0),
               "attention: kv_heads 3 must divide heads 2");
  expect_error(dsc_attention(g, x, x, x, 3, 1, true, 0),
               "attention: k and v f32[2,4,6] must have kv_heads x head dim = 1 x 2 = 2 channels");
  dsc_node *k3 = input("k3", T(DSC_F32, {2, 3, 6}));
  expect_error(dsc_attention(g, x, k3, k3, 2, 2, true, 0),
               "attention: causal attention needs at least as many keys as queries, got 3 keys "
               "for 4 queries");
  dsc_node *p4 = input("p4", T(DSC_I32, {4}));
  expect_error(
      dsc_rope(g, x, p4, 4, 10000, false),
      "rope: heads 4 must split the channel dim 6 of f32[2,4,6] into heads of an even size");
  expect_error(
      dsc_rope(g, x, p4, 6, 10000, false),
      "rope: heads 6 must split the channel dim 6 of f32[2,4,6] into heads of an even size");
  expect_error(dsc_rope(g, x, p4, 1, 0.5, false), "rope: theta must be above 1, got 0.5");
  expect_error(dsc_rope(g, x, w, 1, 10000, false),
               "rope: positions must be i32 or i64, got f32[5]");
  dsc_node *p5 = input("p5", T(DSC_I32, {5}));
  expect_error(
      dsc_rope(g, x, p5, 1, 10000, false),
      "rope: positions i32[5] must broadcast to the shape of x f32[2,4,6] without its last "
      "axis");
  dsc_node *t = input("t", T(DSC_I32, {2, 5}));
  expect_error(build(DSC_OP_CROSS_ENTROPY, {x, t}),
               "cross_entropy: targets i32[2,5] must have the shape of logits f32[2,4,6] without "
               "the last axis");
  dsc_node *tf = input("tf", T(DSC_F32, {2, 4}));
  expect_error(build(DSC_OP_CROSS_ENTROPY, {x, tf}),
               "cross_entropy: targets must be i32 or i64, got f32[2,4]");
}

TEST_F(Rejects, SourcesFamily) {
  expect_error(dsc_param_ref(g, "nope"), "param: unknown parameter 'nope'");
  expect_error(dsc_const(g, 1.0, T(DSC_F32, {2, 0})), "const: shape dim 1 must be positive, got 0");
  int64_t shape[2] = {2, 3};
  dsc_attr a[3] = {dsc_attr_int("axis", 2), dsc_attr_dtype("dtype", DSC_I32),
                   dsc_attr_ints("shape", shape, 2)};
  expect_error(dsc_build(g, DSC_OP_IOTA, nullptr, 0, a, 3), "iota: axis 2 out of range for rank 2");
  dsc_node *x = input("x", T(DSC_I32, {7}));
  int64_t big[8] = {7, 1, 1, 1, 1, 1, 1, 1};
  dsc_node *r8 = dsc_reshape(g, x, big, 8);
  ASSERT_NE(r8, nullptr);
  expect_error(build(DSC_OP_EMBEDDING, {input("tab", T(DSC_F32, {3, 2})), r8}),
               "embedding: result rank 9 exceeds the maximum rank 8");
}

TEST_F(Rejects, HugeShapesAreRejectedNotOverflowed) {
  int64_t huge[3] = {int64_t(1) << 31, int64_t(1) << 31, int64_t(1) << 31};
  dsc_attr a[3] = {dsc_attr_float("value", 1.0), dsc_attr_dtype("dtype", DSC_F32),
                   dsc_attr_ints("shape", huge, 3)};
  expect_error(dsc_build(g, DSC_OP_CONST, nullptr, 0, a, 3),
               "const: shape f32[2147483648,2147483648,2147483648] has too many elements");
}

// ---------------------------------------------------------------- rounding

TEST(Rounding, Bf16RoundsToNearestEven) {
  EXPECT_EQ(ir_bf16_round(1.0f + std::ldexp(1.0f, -8)), 1.0f);  // tie -> even
  EXPECT_EQ(ir_bf16_round(1.0f + 3 * std::ldexp(1.0f, -8)),
            1.0f + std::ldexp(1.0f, -6));  // tie -> even
  EXPECT_EQ(ir_bf16_round(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)),
            1.0f + std::ldexp(1.0f, -7));
  EXPECT_EQ(ir_bf16_round(-3.14159f), -3.140625f);
  EXPECT_TRUE(std::isinf(ir_bf16_round(3.4028234e38f)));   // above the largest bf16 + half ulp
  EXPECT_EQ(ir_bf16_round(3.3895314e38f), 3.3895314e38f);  // largest bf16
  EXPECT_TRUE(std::isnan(ir_bf16_round(NAN)));
  EXPECT_EQ(ir_bf16_round(-INFINITY), -INFINITY);
  EXPECT_EQ(ir_bf16_round(std::ldexp(1.0f, -133)), std::ldexp(1.0f, -133));  // bf16 subnormal
}

TEST(Rounding, F16RoundsOverflowsAndHandlesSubnormals) {
  EXPECT_EQ(ir_f16_round(1.0f + std::ldexp(1.0f, -11)), 1.0f);  // tie -> even
  EXPECT_EQ(ir_f16_round(1.0f + 3 * std::ldexp(1.0f, -11)), 1.0f + std::ldexp(1.0f, -9));
  EXPECT_EQ(ir_f16_round(65504.0f), 65504.0f);
  EXPECT_EQ(ir_f16_round(65519.0f), 65504.0f);
  EXPECT_EQ(ir_f16_round(65520.0f), INFINITY);  // halfway to 2^16: ties to even overflow
  EXPECT_EQ(ir_f16_round(-1e6f), -INFINITY);
  EXPECT_EQ(ir_f16_round(std::ldexp(1.0f, -24)), std::ldexp(1.0f, -24));      // smallest subnormal
  EXPECT_EQ(ir_f16_round(std::ldexp(1.0f, -25)), 0.0f);                       // tie -> even (0)
  EXPECT_EQ(ir_f16_round(3 * std::ldexp(1.0f, -25)), std::ldexp(1.0f, -23));  // tie -> even (2)
  EXPECT_EQ(ir_f16_round(std::ldexp(1.0f, -26) * 3), std::ldexp(1.0f, -24));  // 0.75 quantum -> 1
  EXPECT_TRUE(std::isnan(ir_f16_round(NAN)));
  EXPECT_EQ(ir_f16_round(0.1f), 0.0999755859375f);
}

// ---------------------------------------------------------------- params

TEST(Rng, KnownVectors) {
  EXPECT_EQ(ir_fnv1a64(""), 0xcbf29ce484222325ULL);
  EXPECT_EQ(ir_fnv1a64("a"), 0xaf63dc4c8601ec8cULL);
  uint64_t x = 0;
  EXPECT_EQ(ir_splitmix64(&x), 0xe220a8397b1dcdafULL);
  EXPECT_EQ(ir_splitmix64(&x), 0x6e789e6aa1b965f4ULL);
  ir_rng r;
  ir_rng_seed(&r, 0);
  EXPECT_EQ(r.s[0], 0xe220a8397b1dcdafULL);  // splitmix64's first output from 0
  for (int i = 0; i < 1000; i++) {
    double u = ir_rng_uniform(&r);
    EXPECT_GE(u, 0.0);
    EXPECT_LT(u, 1.0);
    EXPECT_EQ(u, std::ldexp(std::ldexp(u, 53), -53));  // a multiple of 2^-53
  }
}

struct Params : ::testing::Test {
  Counter cnt;
  dsc_context *ctx = nullptr;
  dsc_module *m = nullptr;
  void SetUp() override {
    ctx = dsc_context_new(counting_alloc, &cnt);
    m = dsc_module_new(ctx, "p");
  }
  void TearDown() override {
    dsc_module_free(m);
    dsc_context_free(ctx);
    EXPECT_EQ(cnt.live_bytes, 0);
    EXPECT_FALSE(cnt.size_mismatch);
  }
  void add(const char *name, dsc_type t, dsc_init_kind k, double a = 0, double b = 0) {
    dsc_init init = {k, a, b, nullptr};
    ASSERT_EQ(dsc_module_add_param(m, name, t, init), DSC_OK);
  }
};

TEST_F(Params, InitKindsAndDeterminism) {
  add("w", T(DSC_F32, {100000}), DSC_INIT_NORMAL, 0.02, 0.0);
  add("v", T(DSC_F32, {100000}), DSC_INIT_NORMAL, 0.02, 0.0);
  add("z", T(DSC_F32, {3}), DSC_INIT_ZEROS);
  add("o", T(DSC_BF16, {3}), DSC_INIT_ONES);
  add("c", T(DSC_F32, {3}), DSC_INIT_CONST, 0.3);
  add("u", T(DSC_F64, {10000}), DSC_INIT_UNIFORM, -1.0, 2.0);
  add("h", T(DSC_BF16, {1000}), DSC_INIT_NORMAL, 1.0, 5.0);
  dsc_params *p1 = dsc_params_init(m, 42), *p2 = dsc_params_init(m, 42),
             *p3 = dsc_params_init(m, 43);
  ASSERT_TRUE(p1 && p2 && p3);
  EXPECT_EQ(dsc_params_count(p1), 7);
  dsc_tensor *w = dsc_params_find(p1, "w"), *v = dsc_params_find(p1, "v");
  ASSERT_TRUE(w && v);
  EXPECT_EQ(dsc_params_get(p1, 0), w);
  EXPECT_EQ(dsc_params_find(p1, "missing"), nullptr);
  // Same seed, same values; another seed or another name, another stream.
  int same_seed_diff = 0, other_seed_same = 0, other_name_same = 0;
  for (int i = 0; i < 100000; i++) {
    same_seed_diff += w->data[i] != dsc_params_find(p2, "w")->data[i];
    other_seed_same += w->data[i] == dsc_params_find(p3, "w")->data[i];
    other_name_same += w->data[i] == v->data[i];
  }
  EXPECT_EQ(same_seed_diff, 0);
  EXPECT_LT(other_seed_same, 100);
  EXPECT_LT(other_name_same, 100);
  // normal(0.02): sample std within 5%, mean near 0, values are f32.
  double sum = 0, sq = 0;
  for (int i = 0; i < 100000; i++) {
    sum += w->data[i];
    sq += w->data[i] * w->data[i];
    ASSERT_EQ(w->data[i], (double)(float)w->data[i]);
  }
  double mean = sum / 1e5, sd = std::sqrt(sq / 1e5 - mean * mean);
  EXPECT_NEAR(sd, 0.02, 0.02 * 0.05);
  EXPECT_NEAR(mean, 0.0, 0.0005);
  // The documented stream: splitmix64(seed ^ fnv1a64(name)) seeds xoshiro256**.
  ir_rng r;
  uint64_t x = 42 ^ ir_fnv1a64("w");
  ir_rng_seed(&r, ir_splitmix64(&x));
  EXPECT_EQ(w->data[0], (double)(float)(0.02 * ir_rng_normal(&r)));
  for (int i = 0; i < 3; i++) {
    EXPECT_EQ(dsc_params_find(p1, "z")->data[i], 0.0);
    EXPECT_EQ(dsc_params_find(p1, "o")->data[i], 1.0);
    EXPECT_EQ(dsc_params_find(p1, "c")->data[i], (double)0.3f);
  }
  dsc_tensor *u = dsc_params_find(p1, "u");
  double lo = 1e9, hi = -1e9, us = 0;
  for (int i = 0; i < 10000; i++) {
    lo = std::min(lo, u->data[i]);
    hi = std::max(hi, u->data[i]);
    us += u->data[i];
  }
  EXPECT_GE(lo, -1.0);
  EXPECT_LT(hi, 2.0);
  EXPECT_LT(lo, -0.99);
  EXPECT_GT(hi, 1.99);
  EXPECT_NEAR(us / 10000, 0.5, 0.05);
  dsc_tensor *h = dsc_params_find(p1, "h");
  double hs = 0;
  for (int i = 0; i < 1000; i++) {
    EXPECT_EQ((float)h->data[i], ir_bf16_round((float)h->data[i]));
    hs += h->data[i];
  }
  EXPECT_NEAR(hs / 1000, 5.0, 0.2);  // mean = b
  dsc_params_free(p1);
  dsc_params_free(p2);
  dsc_params_free(p3);
}

TEST_F(Params, GraphReadsParamValues) {
  add("w", T(DSC_F64, {3, 2}), DSC_INIT_NORMAL, 1.0, 0.0);
  dsc_graph *g = dsc_graph_new(m, "main");
  dsc_node *x = dsc_graph_input(g, "x", T(DSC_F64, {4, 3}));
  dsc_node *y = dsc_matmul(g, x, dsc_param_ref(g, "w"));
  dsc_node *pw = dsc_param_ref(g, "w");
  dsc_node *outs[2] = {y, pw};
  ASSERT_EQ(dsc_graph_set_outputs(g, outs, 2), DSC_OK);
  dsc_params *p = dsc_params_init(m, 7);
  ASSERT_NE(p, nullptr);
  dsc_tensor *xt = dsc_tensor_new(ctx, T(DSC_F64, {4, 3}));
  std::mt19937 rng(5);
  for (int i = 0; i < 12; i++) xt->data[i] = 0.5 + (rng() % 100) / 50.0;
  const dsc_tensor *in[1] = {xt};
  dsc_tensor *res[2] = {nullptr, nullptr};
  ASSERT_EQ(dsc_interp_run(g, p, in, 1, res), DSC_OK);
  const double *wv = dsc_params_find(p, "w")->data;
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < 2; j++) {
      double acc = 0;
      for (int k = 0; k < 3; k++) acc += xt->data[i * 3 + k] * wv[k * 2 + j];
      EXPECT_NEAR_REL(res[0]->data[i * 2 + j], acc, kF64);
    }
  EXPECT_NE(res[1], dsc_params_find(p, "w")) << "a param output is a copy owned by the caller";
  for (int i = 0; i < 6; i++) EXPECT_EQ(res[1]->data[i], wv[i]);
  // Without params the run fails and says which param is missing.
  dsc_tensor *none[2] = {nullptr, nullptr};
  EXPECT_EQ(dsc_interp_run(g, nullptr, in, 1, none), DSC_ERR_USER);
  int nd = dsc_diag_count(ctx);
  EXPECT_STREQ(dsc_diag_get(ctx, nd - 1)->message,
               "parameter 'w' has no value (no parameters were given)");
  dsc_tensor_free(ctx, res[0]);
  dsc_tensor_free(ctx, res[1]);
  dsc_tensor_free(ctx, xt);
  dsc_params_free(p);
}

TEST(Tensor, NewRejectsOverflowingShapes) {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  int64_t dims[3] = {int64_t(1) << 40, int64_t(1) << 40, 4};
  EXPECT_EQ(dsc_tensor_new(ctx, dsc_type_make(DSC_F32, 3, dims)), nullptr);
  int64_t neg[1] = {-1};
  EXPECT_EQ(dsc_tensor_new(ctx, dsc_type_make(DSC_F32, 1, neg)), nullptr);
  dsc_tensor *s = dsc_tensor_new(ctx, dsc_type_make(DSC_F32, 0, nullptr));
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->data[0], 0.0);
  dsc_tensor_free(ctx, s);
  dsc_context_free(ctx);
}

}  // namespace
