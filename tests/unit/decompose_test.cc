// The decompose pass: every composite op, rewritten into primitive ops, gives
// what the composite gives when both graphs run in the interpreter (random
// inputs, several shapes, axes, heads, causal on/off, f32 and f64); uses are
// redirected, locations kept, targets out of range still fail; the tiny GPT's
// training step is unchanged by the pass.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "dsc/dsc.h"
#include "ir/ir.h"
#include "passes/passes.h"
#include "tests/unit/test_util.h"

namespace {

dsc_type make_type(dsc_dtype dt, std::vector<int64_t> dims) {
  dsc_type t;
  memset(&t, 0, sizeof t);
  t.dtype = dt;
  t.rank = (int)dims.size();
  for (size_t i = 0; i < dims.size(); i++) t.dims[i] = dims[i];
  return t;
}

// max |a - b| / max |b|: the error relative to the reference's scale (an
// elementwise ratio would blow up where the reference crosses zero).
double rel_err(const dsc_tensor *a, const dsc_tensor *b) {
  double num = 0, den = 0;
  int64_t n = dsc_type_numel(&b->type);
  for (int64_t i = 0; i < n; i++) {
    if (std::isnan(a->data[i]) != std::isnan(b->data[i])) return INFINITY;
    num = std::fmax(num, std::fabs(a->data[i] - b->data[i]));
    den = std::fmax(den, std::fabs(b->data[i]));
  }
  return den > 0 ? num / den : num;
}

// Tolerances: f64 decomposed in f64 (rounding per op ~1e-16); f32 in f32
// (a few roundings per element, against the kernel's single rounding).
double tol_for(dsc_dtype dt) { return dt == DSC_F64 ? 1e-12 : 1e-5; }

// One graph "g" holding a composite and its inputs, run before and after
// the pass on the same random inputs.
struct Case {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  dsc_module *m = dsc_module_new(ctx, "t");
  dsc_graph *g = dsc_graph_new(m, "g");
  std::vector<dsc_tensor *> inputs;
  std::mt19937_64 rng;
  dsc_loc in_loc = {"inputs.dsm", 1, 1}, op_loc = {"model.dsm", 7, 3};
  explicit Case(uint64_t seed) : rng(seed) { dsc_graph_set_loc(g, in_loc); }
  ~Case() {
    for (dsc_tensor *t : inputs) dsc_tensor_free(ctx, t);
    dsc_module_free(m);
    dsc_context_free(ctx);
  }
  // A float input with values in [-lim, lim] (never all zero: checked).
  dsc_node *input(const char *name, dsc_type t, double lim = 2.0) {
    dsc_tensor *x = dsc_tensor_new(ctx, t);
    std::uniform_real_distribution<double> u(-lim, lim);
    int64_t n = dsc_type_numel(&t);
    bool nonzero = false;
    for (int64_t i = 0; i < n; i++) {
      x->data[i] = u(rng);
      nonzero |= x->data[i] != 0;
    }
    EXPECT_TRUE(nonzero);
    ir_round_to_dtype(x);  // values representable in the dtype (bf16, f32)
    inputs.push_back(x);
    return dsc_graph_input(g, name, t);
  }
  // An integer input with values in [0, hi).
  dsc_node *ids(const char *name, dsc_type t, int64_t hi) {
    dsc_tensor *x = dsc_tensor_new(ctx, t);
    std::uniform_int_distribution<int64_t> u(0, hi - 1);
    int64_t n = dsc_type_numel(&t);
    for (int64_t i = 0; i < n; i++) x->data[i] = (double)u(rng);
    if (n > 1 && x->data[0] == x->data[1]) x->data[1] = (double)(((int64_t)x->data[0] + 1) % hi);
    inputs.push_back(x);
    return dsc_graph_input(g, name, t);
  }
  dsc_node *op(dsc_op op, std::vector<dsc_node *> in, std::vector<dsc_attr> attrs) {
    dsc_graph_set_loc(g, op_loc);
    dsc_node *n = dsc_build(g, op, in.data(), (int)in.size(), attrs.data(), (int)attrs.size());
    dsc_graph_set_loc(g, in_loc);
    EXPECT_NE(n, nullptr) << diags(ctx);
    return n;
  }
  dsc_node *attention(dsc_node *q, dsc_node *k, dsc_node *v, int64_t heads, int64_t kv_heads,
                      bool causal, double scale = 0) {
    dsc_graph_set_loc(g, op_loc);
    dsc_node *n = dsc_attention(g, q, k, v, heads, kv_heads, causal, scale);
    dsc_graph_set_loc(g, in_loc);
    EXPECT_NE(n, nullptr) << diags(ctx);
    return n;
  }
  dsc_node *rope(dsc_node *x, dsc_node *pos, int64_t heads, double theta, bool interleaved) {
    dsc_graph_set_loc(g, op_loc);
    dsc_node *n = dsc_rope(g, x, pos, heads, theta, interleaved);
    dsc_graph_set_loc(g, in_loc);
    EXPECT_NE(n, nullptr) << diags(ctx);
    return n;
  }
  std::vector<dsc_tensor *> run() {
    std::vector<const dsc_tensor *> in(inputs.begin(), inputs.end());
    std::vector<dsc_tensor *> out((size_t)dsc_graph_output_count(g), nullptr);
    dsc_status st = dsc_interp_run(g, nullptr, in.data(), (int)in.size(), out.data());
    EXPECT_EQ(st, DSC_OK) << diags(ctx);
    return out;
  }
  void free_all(std::vector<dsc_tensor *> &v) {
    for (dsc_tensor *t : v) dsc_tensor_free(ctx, t);
    v.clear();
  }
  // Runs, decomposes, checks the structure, runs again and compares each
  // output within tol. Returns the largest relative error seen.
  double check(std::vector<dsc_node *> outs, double tol) {
    EXPECT_EQ(dsc_graph_set_outputs(g, outs.data(), (int)outs.size()), DSC_OK);
    std::vector<dsc_type> types;
    for (dsc_node *o : outs) types.push_back(o->type);
    std::vector<dsc_tensor *> ref = run();
    std::set<const ir_node *> before;
    for (int i = 0; i < dsc_graph_node_count(g); i++) before.insert(dsc_graph_node(g, i));
    EXPECT_EQ(pass_decompose_run(m), DSC_OK) << diags(ctx);
    EXPECT_EQ(dsc_module_verify(m), DSC_OK) << diags(ctx);
    for (int i = 0; i < dsc_graph_node_count(g); i++) {
      const ir_node *n = dsc_graph_node(g, i);
      EXPECT_FALSE(pass_decompose_op(n->op)) << dsc_op_name(n->op) << " left";
      EXPECT_EQ(n->id, i);
      if (before.count(n)) continue;
      // every new node points at the composite's source
      EXPECT_TRUE(n->loc.file && strcmp(n->loc.file, op_loc.file) == 0 &&
                  n->loc.line == op_loc.line && n->loc.col == op_loc.col)
          << dsc_op_name(n->op) << " node " << i << " lost its location";
    }
    for (int k = 0; k < dsc_graph_output_count(g); k++) {
      dsc_type t = dsc_node_type(dsc_graph_output_at(g, k));
      EXPECT_TRUE(dsc_type_equal(&t, &types[(size_t)k])) << "output " << k << " changed type";
    }
    std::vector<dsc_tensor *> got = run();
    double worst = 0;
    if (got.size() == ref.size() && !got.empty() && got[0]) {
      for (size_t k = 0; k < ref.size(); k++) {
        double e = rel_err(got[k], ref[k]);
        EXPECT_LE(e, tol) << "output " << k;
        worst = std::fmax(worst, e);
      }
    }
    free_all(ref);
    free_all(got);
    return worst;
  }
};

const dsc_dtype kFloats[] = {DSC_F32, DSC_F64};

// ------------------------------------------------------------ softmax

TEST(Decompose, SoftmaxAndLogSoftmaxEveryAxis) {
  std::vector<std::vector<int64_t>> shapes = {{9}, {3, 7}, {2, 3, 5}, {2, 1, 4, 3}};
  uint64_t seed = 1;
  for (dsc_op op : {DSC_OP_SOFTMAX, DSC_OP_LOG_SOFTMAX})
    for (dsc_dtype dt : kFloats)
      for (auto &s : shapes)
        for (int axis = 0; axis < (int)s.size(); axis++) {
          SCOPED_TRACE(std::string(dsc_op_name(op)) + " axis " + std::to_string(axis) + " rank " +
                       std::to_string(s.size()) + (dt == DSC_F64 ? " f64" : " f32"));
          Case c(seed++);
          // wide logits: the max shift matters (exp(8) vs exp(-8))
          dsc_node *x = c.input("x", make_type(dt, s), 8.0);
          dsc_node *y = c.op(op, {x}, {dsc_attr_int("axis", axis)});
          c.check({y}, tol_for(dt));
        }
}

// Large logits would overflow exp without the max shift.
TEST(Decompose, SoftmaxIsShiftedByTheMax) {
  for (dsc_dtype dt : kFloats) {
    Case c(3);
    dsc_node *x = c.input("x", make_type(dt, {4, 6}), 2.0);
    dsc_node *big = dsc_binary(c.g, DSC_OP_ADD, x, dsc_const(c.g, 1000.0, make_type(dt, {})));
    dsc_node *y = c.op(DSC_OP_SOFTMAX, {big}, {dsc_attr_int("axis", 1)});
    dsc_node *z = c.op(DSC_OP_LOG_SOFTMAX, {big}, {dsc_attr_int("axis", 1)});
    c.check({y, z}, tol_for(dt));
  }
}

// ------------------------------------------------------------ norms

TEST(Decompose, LayernormAndRmsnorm) {
  std::vector<std::vector<int64_t>> shapes = {{8}, {3, 16}, {2, 3, 5}};
  uint64_t seed = 100;
  for (dsc_op op : {DSC_OP_LAYERNORM, DSC_OP_RMSNORM})
    for (dsc_dtype dt : kFloats)
      for (auto &s : shapes)
        for (double eps : {1e-5, 0.1}) {
          SCOPED_TRACE(std::string(dsc_op_name(op)) + " rank " + std::to_string(s.size()) +
                       " eps " + std::to_string(eps) + (dt == DSC_F64 ? " f64" : " f32"));
          Case c(seed++);
          int64_t D = s.back();
          // an offset mean: the two-pass variance matters
          dsc_node *x0 = c.input("x", make_type(dt, s), 1.0);
          dsc_node *x = dsc_binary(c.g, DSC_OP_ADD, x0, dsc_const(c.g, 3.0, make_type(dt, {})));
          dsc_node *w = c.input("w", make_type(dt, {D}), 1.5);
          std::vector<dsc_node *> in = {x, w};
          if (op == DSC_OP_LAYERNORM) in.push_back(c.input("b", make_type(dt, {D}), 0.5));
          dsc_node *y = c.op(op, in, {dsc_attr_float("eps", eps)});
          c.check({y}, tol_for(dt));
        }
}

// ------------------------------------------------------------ attention

struct AttnShape {
  int64_t B, T, C, H;
};

TEST(Decompose, AttentionHeadsAndCausal) {
  AttnShape shapes[] = {{2, 5, 8, 2}, {1, 4, 6, 3}, {2, 3, 4, 1}, {1, 7, 12, 4}};
  uint64_t seed = 200;
  for (dsc_dtype dt : kFloats)
    for (const AttnShape &a : shapes)
      for (bool causal : {true, false}) {
        SCOPED_TRACE("B" + std::to_string(a.B) + " T" + std::to_string(a.T) + " C" +
                     std::to_string(a.C) + " H" + std::to_string(a.H) + (causal ? " causal" : "") +
                     (dt == DSC_F64 ? " f64" : " f32"));
        Case c(seed++);
        dsc_type t = make_type(dt, {a.B, a.T, a.C});
        dsc_node *q = c.input("q", t, 1.5), *k = c.input("k", t, 1.5), *v = c.input("v", t);
        dsc_node *y = c.attention(q, k, v, a.H, a.H, causal, 0);
        c.check({y}, tol_for(dt));
      }
}

// Grouped-query attention (kv_heads < heads, including multi-query), keys
// beyond the queries (S > T: the queries are the last T positions) and an
// explicit scale, against the interpreter's per-head loops.
TEST(Decompose, AttentionGroupedQueriesLongerKeysAndScale) {
  struct G {
    int64_t B, T, S, H, KVH, hd;
    double scale;
  } cases[] = {{2, 5, 5, 4, 2, 3, 0},
               {1, 4, 4, 6, 1, 2, 0},
               {2, 3, 7, 4, 4, 2, 0},
               {1, 3, 6, 6, 3, 4, 0.05},
               {2, 6, 6, 2, 1, 5, 2.0}};
  uint64_t seed = 300;
  for (dsc_dtype dt : kFloats)
    for (const G &a : cases)
      for (bool causal : {true, false}) {
        SCOPED_TRACE("B" + std::to_string(a.B) + " T" + std::to_string(a.T) + " S" +
                     std::to_string(a.S) + " H" + std::to_string(a.H) + " KVH" +
                     std::to_string(a.KVH) + (causal ? " causal" : "") +
                     (dt == DSC_F64 ? " f64" : " f32"));
        Case c(seed++);
        dsc_node *q = c.input("q", make_type(dt, {a.B, a.T, a.H * a.hd}), 1.5);
        dsc_type kt = make_type(dt, {a.B, a.S, a.KVH * a.hd});
        dsc_node *k = c.input("k", kt, 1.5), *v = c.input("v", kt);
        c.check({c.attention(q, k, v, a.H, a.KVH, causal, a.scale)}, tol_for(dt));
      }
}

// rope in both pairings, positions [T], [B, T] and [1, T] (with an offset as
// in decoding), rank 3 and 4 inputs, against the interpreter's rotation.
TEST(Decompose, RopeRotatesPairsAtTheirPositions) {
  uint64_t seed = 400;
  for (dsc_dtype dt : kFloats)
    for (bool inter : {false, true})
      for (int pos_kind = 0; pos_kind < 3; pos_kind++) {
        SCOPED_TRACE(std::string(inter ? "interleaved" : "rotate-half") + " positions " +
                     std::to_string(pos_kind) + (dt == DSC_F64 ? " f64" : " f32"));
        Case c(seed++);
        const int64_t B = 2, T = 5, H = 3, hd = 8;
        dsc_node *x = c.input("x", make_type(dt, {B, T, H * hd}));
        dsc_node *pos = pos_kind == 0   ? c.ids("p", make_type(DSC_I32, {T}), 64)
                        : pos_kind == 1 ? c.ids("p", make_type(DSC_I64, {B, T}), 4096)
                                        : c.ids("p", make_type(DSC_I32, {1, T}), 200);
        dsc_node *x4 = c.input("x4", make_type(dt, {B, 2, T, 2 * hd}));
        dsc_node *y = c.rope(x, pos, H, 10000.0, inter);
        dsc_node *y4 = c.rope(x4, pos, 2, 500000.0, inter);
        // f32: angles p f_i rounded to f32 as transformers computes them
        // (p up to 4096: the angle's rounding is about p 2^-24 radians)
        c.check({y, y4}, dt == DSC_F64 ? 1e-12 : 2e-4);
      }
}

// dropout's elementwise form (rand24 over an index built from iotas, where,
// the scaled x) equals the interpreter's kernel bit for bit: the same
// elements drop, the kept ones are rounded alike (bf16 through f32, as the
// interpreter's f32 scale and product); ranks 0 to 4, seeds [1] and [],
// streams past the first, p from 0.05 to 0.9.
TEST(Decompose, DropoutDropsTheInterpretersElements) {
  std::vector<std::vector<int64_t>> shapes = {{}, {7}, {3, 5}, {2, 3, 4}, {2, 1, 3, 5}};
  const double ps[] = {0.05, 0.5, 0.9};
  uint64_t seed = 500;
  for (dsc_dtype dt : {DSC_F32, DSC_F64, DSC_BF16})
    for (size_t s = 0; s < shapes.size(); s++) {
      double p = ps[s % 3];
      SCOPED_TRACE(std::string(dsc_dtype_name(dt)) + " rank " + std::to_string(shapes[s].size()) +
                   " p " + std::to_string(p));
      Case c(seed++);
      dsc_node *x = c.input("x", make_type(dt, shapes[s]));
      std::vector<int64_t> sd = s % 2 ? std::vector<int64_t>{1} : std::vector<int64_t>{};
      dsc_node *sv = c.ids("seed", make_type(DSC_I64, sd), (int64_t)1 << 53);
      dsc_node *y = c.op(DSC_OP_DROPOUT, {x, sv},
                         {dsc_attr_float("p", p), dsc_attr_int("stream", (int64_t)s * 1000)});
      c.check({y}, 0.0);
    }
}

// Mistral's sliding window: windows shorter than, equal to and longer than
// the keys, grouped and not, more keys than queries.
TEST(Decompose, SlidingWindowAttention) {
  struct W {
    int64_t T, S, H, KVH, window;
  } cases[] = {{6, 6, 2, 2, 2}, {5, 8, 4, 2, 3}, {4, 4, 2, 1, 4}, {4, 6, 2, 2, 9}};
  uint64_t seed = 600;
  for (dsc_dtype dt : kFloats)
    for (const W &w : cases) {
      SCOPED_TRACE("T" + std::to_string(w.T) + " S" + std::to_string(w.S) + " window " +
                   std::to_string(w.window) + (dt == DSC_F64 ? " f64" : " f32"));
      Case c(seed++);
      const int64_t hd = 3;
      dsc_node *q = c.input("q", make_type(dt, {2, w.T, w.H * hd}), 1.5);
      dsc_type kt = make_type(dt, {2, w.S, w.KVH * hd});
      dsc_node *k = c.input("k", kt, 1.5), *v = c.input("v", kt);
      dsc_graph_set_loc(c.g, c.op_loc);
      dsc_node *y = dsc_attention_windowed(c.g, q, k, v, w.H, w.KVH, true, 0, w.window);
      dsc_graph_set_loc(c.g, c.in_loc);
      ASSERT_NE(y, nullptr) << diags(c.ctx);
      c.check({y}, tol_for(dt));
    }
}

// Llama 3.1's scaled frequencies (all three bands over a head of 32, an
// original context of 256): the decomposition's wavelength test and
// interpolation in f64 against the interpreter's ir_rope_freq.
TEST(Decompose, RopeLlama3Scaling) {
  uint64_t seed = 450;
  for (dsc_dtype dt : kFloats)
    for (bool inter : {false, true}) {
      SCOPED_TRACE(std::string(inter ? "interleaved" : "rotate-half") +
                   (dt == DSC_F64 ? " f64" : " f32"));
      Case c(seed++);
      dsc_node *x = c.input("x", make_type(dt, {2, 5, 64}));
      dsc_node *pos = c.ids("p", make_type(DSC_I64, {5}), 4096);
      dsc_rope_scaling sc = {8.0, 1.0, 4.0, 256};
      dsc_graph_set_loc(c.g, c.op_loc);
      dsc_node *y = dsc_rope_scaled(c.g, x, pos, 2, 500000.0, inter, &sc);
      dsc_graph_set_loc(c.g, c.in_loc);
      ASSERT_NE(y, nullptr) << diags(c.ctx);
      c.check({y}, dt == DSC_F64 ? 1e-12 : 2e-4);
    }
}

// Self-attention on one value (q = k = v) and masked positions that are
// exactly zero: a huge value at a future key must not leak into earlier rows.
TEST(Decompose, AttentionCausalMaskIsExact) {
  Case c(7);
  dsc_type t = make_type(DSC_F32, {1, 4, 4});
  dsc_node *x = c.input("x", t);
  dsc_node *self = c.attention(x, x, x, 2, 2, true, 0);
  // v with a huge last row: rows 0..2 of the output must not see it
  dsc_node *k = c.input("k", t);
  dsc_node *v = c.input("v", t);
  c.inputs.back()->data[3 * 4 + 0] = 1e30;
  dsc_node *masked = c.attention(x, k, v, 1, 1, true, 0);
  c.check({self, masked}, 1e-5);
  std::vector<dsc_tensor *> out = c.run();
  ASSERT_EQ(out.size(), 2u);
  for (int row = 0; row < 3; row++)
    for (int ch = 0; ch < 4; ch++) EXPECT_LT(std::fabs(out[1]->data[row * 4 + ch]), 10.0);
  EXPECT_GT(std::fabs(out[1]->data[3 * 4 + 0]), 1e20);  // the last row does see it
  c.free_all(out);
}

// ------------------------------------------------------------ cross_entropy

TEST(Decompose, CrossEntropyShapesAndTargetDtypes) {
  std::vector<std::vector<int64_t>> shapes = {{7}, {6, 11}, {2, 3, 5}};
  uint64_t seed = 300;
  for (dsc_dtype dt : kFloats)
    for (dsc_dtype it : {DSC_I32, DSC_I64})
      for (auto &s : shapes) {
        SCOPED_TRACE("rank " + std::to_string(s.size()) + (dt == DSC_F64 ? " f64" : " f32") +
                     (it == DSC_I64 ? " i64" : " i32"));
        Case c(seed++);
        std::vector<int64_t> ts(s.begin(), s.end() - 1);
        dsc_node *lg = c.input("logits", make_type(dt, s), 6.0);
        dsc_node *tg = c.ids("targets", make_type(it, ts), s.back());
        dsc_node *y = c.op(DSC_OP_CROSS_ENTROPY, {lg, tg}, {});
        c.check({y}, tol_for(dt));
      }
}

// A target outside [0, V) is still a runtime error after the pass (the
// decomposition reads the target through a bounds-checked embedding).
TEST(Decompose, CrossEntropyTargetOutOfRangeStillFails) {
  for (double bad : {5.0, -1.0}) {
    Case c(11);
    dsc_node *lg = c.input("logits", make_type(DSC_F32, {3, 5}));
    dsc_node *tg = c.ids("targets", make_type(DSC_I32, {3}), 5);
    dsc_node *y = c.op(DSC_OP_CROSS_ENTROPY, {lg, tg}, {});
    ASSERT_EQ(dsc_graph_set_outputs(c.g, &y, 1), DSC_OK);
    ASSERT_EQ(pass_decompose_run(c.m), DSC_OK) << diags(c.ctx);
    c.inputs[1]->data[2] = bad;
    std::vector<const dsc_tensor *> in(c.inputs.begin(), c.inputs.end());
    dsc_tensor *out = nullptr;
    EXPECT_NE(dsc_interp_run(c.g, nullptr, in.data(), 2, &out), DSC_OK);
    EXPECT_EQ(out, nullptr);
    std::string d = diags(c.ctx);
    EXPECT_NE(d.find("out of range [0, 5)"), std::string::npos) << d;
    EXPECT_NE(d.find(bad < 0 ? "id -1 at position 2" : "id 5 at position 2"), std::string::npos)
        << d;
    // the error points at the cross_entropy's source
    bool located = false;
    for (int i = 0; i < dsc_diag_count(c.ctx); i++) {
      const dsc_diag *dg = dsc_diag_get(c.ctx, i);
      located |= dg->loc.file && strcmp(dg->loc.file, "model.dsm") == 0 && dg->loc.line == 7;
    }
    EXPECT_TRUE(located) << d;
    if (out) dsc_tensor_free(c.ctx, out);
  }
}

// ------------------------------------------------------------ mixed precision

// bf16 composites compute in f32 inside (norms, softmax, loss) or keep bf16
// matmuls (attention); the result keeps its bf16 type. Tolerance: a few
// bf16 roundings (2^-8 each) against the kernel's single rounding.
TEST(Decompose, Bf16CompositesKeepTheirTypeAndComputeInF32) {
  Case c(21);
  dsc_node *x = c.input("x", make_type(DSC_BF16, {2, 4, 8}));
  dsc_node *w = c.input("w", make_type(DSC_BF16, {8}));
  dsc_node *b = c.input("b", make_type(DSC_BF16, {8}));
  dsc_node *sm = c.op(DSC_OP_SOFTMAX, {x}, {dsc_attr_int("axis", 2)});
  dsc_node *ln = c.op(DSC_OP_LAYERNORM, {x, w, b}, {dsc_attr_float("eps", 1e-5)});
  dsc_node *at = c.attention(x, x, x, 2, 2, true, 0);
  c.check({sm, ln, at}, 3e-2);
  int exps = 0;
  for (int i = 0; i < dsc_graph_node_count(c.g); i++) {
    const ir_node *n = dsc_graph_node(c.g, i);
    if (n->op == DSC_OP_EXP) {
      exps++;
      EXPECT_EQ(n->type.dtype, DSC_F32);
    }
    if (n->op == DSC_OP_MATMUL) {
      EXPECT_EQ(n->type.dtype, DSC_BF16);
    }
  }
  EXPECT_EQ(exps, 2);
}

// ------------------------------------------------------------ graph surgery

// Composites feeding composites and other ops, and graph outputs that are
// composites: every use is redirected.
TEST(Decompose, ChainsAndOutputsAreRedirected) {
  for (dsc_dtype dt : kFloats) {
    Case c(31);
    dsc_node *x = c.input("x", make_type(dt, {3, 6}));
    dsc_node *w = c.input("w", make_type(dt, {6}));
    dsc_node *b = c.input("b", make_type(dt, {6}));
    dsc_node *ln = c.op(DSC_OP_LAYERNORM, {x, w, b}, {dsc_attr_float("eps", 1e-5)});
    dsc_node *rn = c.op(DSC_OP_RMSNORM, {ln, w}, {dsc_attr_float("eps", 1e-6)});
    dsc_node *sm = c.op(DSC_OP_SOFTMAX, {rn}, {dsc_attr_int("axis", 1)});
    dsc_node *mix = dsc_binary(c.g, DSC_OP_MUL, sm, ln);
    dsc_node *ls = c.op(DSC_OP_LOG_SOFTMAX, {mix}, {dsc_attr_int("axis", 0)});
    c.check({ls, sm, mix, ln}, tol_for(dt));
  }
}

TEST(Decompose, GraphsWithoutCompositesAreUnchanged) {
  Case c(41);
  dsc_node *x = c.input("x", make_type(DSC_F32, {3, 4}));
  dsc_node *y = dsc_unary(c.g, DSC_OP_EXP, x);
  ASSERT_EQ(dsc_graph_set_outputs(c.g, &y, 1), DSC_OK);
  char *before = dsc_module_print_string(c.m);
  ASSERT_EQ(pass_decompose_run(c.m), DSC_OK);
  char *after = dsc_module_print_string(c.m);
  EXPECT_STREQ(before, after);
  dsc_string_free(c.ctx, before);
  dsc_string_free(c.ctx, after);
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
// internal error and the graph stays as it was (verifies, same text).
TEST(Decompose, OutOfMemoryLeavesTheGraphUnchanged) {
  bool succeeded = false;
  int failures = 0;
  for (long limit = 0; limit < 100 && !succeeded; limit++) {
    FailingAlloc fa;
    dsc_context *ctx = dsc_context_new(failing_alloc, &fa);
    dsc_module *m = dsc_module_new(ctx, "t");
    dsc_graph *g = dsc_graph_new(m, "g");
    // enough composites that the rewrite needs several new arena chunks
    dsc_node *x = dsc_graph_input(g, "x", make_type(DSC_F32, {1, 3, 4}));
    dsc_attr ax = dsc_attr_int("axis", 2);
    for (int i = 0; i < 60; i++) {
      dsc_node *a = dsc_attention(g, x, x, x, 2, 2, true, 0);
      x = dsc_build(g, DSC_OP_SOFTMAX, &a, 1, &ax, 1);
    }
    ASSERT_EQ(dsc_graph_set_outputs(g, &x, 1), DSC_OK);
    char *before = dsc_module_print_string(m);
    ASSERT_NE(before, nullptr);
    fa.left = limit;
    fa.armed = true;
    dsc_status st = pass_decompose_run(m);
    fa.armed = false;
    if (st == DSC_OK) {
      succeeded = true;
      EXPECT_EQ(dsc_module_verify(m), DSC_OK) << diags(ctx);
    } else {
      failures++;
      EXPECT_EQ(st, DSC_ERR_INTERNAL) << "limit " << limit;
      EXPECT_EQ(dsc_module_verify(m), DSC_OK) << "limit " << limit << "\n" << diags(ctx);
      char *after = dsc_module_print_string(m);
      EXPECT_STREQ(before, after) << "limit " << limit;
      dsc_string_free(ctx, after);
    }
    dsc_string_free(ctx, before);
    dsc_module_free(m);
    dsc_context_free(ctx);
  }
  EXPECT_TRUE(succeeded);
  EXPECT_GT(failures, 2);
}

// ------------------------------------------------------------ the tiny GPT

std::map<std::string, int> op_counts(dsc_graph *g) {
  std::map<std::string, int> c;
  for (int i = 0; i < dsc_graph_node_count(g); i++)
    c[dsc_op_name(dsc_node_op(dsc_graph_node(g, i)))]++;
  return c;
}

struct Step {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  dsc_module *m = nullptr;
  dsc_params *params = nullptr;
  dsc_graph *g = nullptr;
  dsc_train_config cfg;
  ~Step() {
    dsc_params_free(params);
    dsc_module_free(m);
    dsc_context_free(ctx);
  }
  // examples/gpt-tiny.dsm at B=2, T=8 through the pipeline up to stop_after;
  // `decompose` also runs the pass on the result (for stops before it).
  void open(const char *stop_after, const char *graph, bool decompose, bool sgd = false) {
    dsc_dim_binding b[2] = {{"B", 2}, {"T", 8}};
    dsc_frontend_options o = {b, 2, false};
    std::string path = std::string(DSC_SOURCE_DIR) + "/examples/gpt-tiny.dsm";
    ASSERT_EQ(dsc_compile_file(ctx, path.c_str(), &o, &m), DSC_OK) << diags(ctx);
    ASSERT_EQ(dsc_train_config_from_module(m, &cfg), DSC_OK) << diags(ctx);
    if (sgd) cfg.opt.kind = DSC_OPT_SGD;
    dsc_pipeline_options po = {&cfg, stop_after, false, nullptr, true};
    ASSERT_EQ(dsc_run_pipeline(m, &po), DSC_OK) << diags(ctx);
    if (decompose) {
      ASSERT_EQ(pass_decompose_run(m), DSC_OK) << diags(ctx);
      ASSERT_EQ(dsc_module_verify(m), DSC_OK) << diags(ctx);
    }
    g = dsc_module_find_graph(m, graph);
    ASSERT_NE(g, nullptr);
    params = dsc_params_init(m, 5);
    ASSERT_NE(params, nullptr);
  }
};

// The same random batch for both runs: tokens, targets (and lr for a step).
struct Batch {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  dsc_tensor *tokens, *targets, *lr;
  Batch() {
    std::mt19937_64 rng(9);
    std::uniform_int_distribution<int> tok(0, 255);
    dsc_type it = make_type(DSC_I32, {2, 8});
    tokens = dsc_tensor_new(ctx, it);
    targets = dsc_tensor_new(ctx, it);
    for (int i = 0; i < 16; i++) tokens->data[i] = tok(rng), targets->data[i] = tok(rng);
    lr = dsc_tensor_new(ctx, make_type(DSC_F32, {}));
    lr->data[0] = 1e-3;
  }
  ~Batch() {
    for (dsc_tensor *t : {tokens, targets, lr}) dsc_tensor_free(ctx, t);
    dsc_context_free(ctx);
  }
};

// Runs s's graph on the batch; returns its outputs (freed by the caller).
std::vector<dsc_tensor *> run_step(Step &s, const Batch &b) {
  const dsc_tensor *in[3] = {b.tokens, b.targets, b.lr};
  std::vector<dsc_tensor *> out((size_t)dsc_graph_output_count(s.g), nullptr);
  EXPECT_EQ(dsc_interp_run(s.g, s.params, in, dsc_graph_input_count(s.g), out.data()), DSC_OK)
      << diags(s.ctx);
  return out;
}

void free_outs(Step &s, std::vector<dsc_tensor *> &v) {
  for (dsc_tensor *t : v) dsc_tensor_free(s.ctx, t);
}

// The pipeline through "decompose" leaves no composite in the step; prints
// the op counts before/after (for the record).
TEST(Decompose, TinyGptPipelineLeavesNoComposite) {
  Step ref, dec;
  ref.open("optimizer", "train_step", false);
  dec.open("decompose", "train_step", false);
  ASSERT_FALSE(HasFailure());
  std::map<std::string, int> before = op_counts(ref.g), after = op_counts(dec.g);
  for (const char *name :
       {"softmax", "log_softmax", "layernorm", "rmsnorm", "attention", "cross_entropy"})
    EXPECT_EQ(after.count(name), 0u) << name << " left after decompose";
  EXPECT_EQ(before["attention"], 2);
  EXPECT_EQ(before["cross_entropy"], 1);
  EXPECT_EQ(after["embedding_grad"], before["embedding_grad"]);  // not rewritten
  EXPECT_EQ(after["assign"], before["assign"]);
  std::string line = "tiny GPT train_step ops: " + std::to_string(dsc_graph_node_count(ref.g)) +
                     " -> " + std::to_string(dsc_graph_node_count(dec.g));
  for (auto &kv : before)
    if (after[kv.first] != kv.second)
      line += "; " + kv.first + " " + std::to_string(kv.second) + "->" +
              std::to_string(after[kv.first]);
  for (auto &kv : after)
    if (!before.count(kv.first)) line += "; " + kv.first + " 0->" + std::to_string(kv.second);
  printf("%s\n", line.c_str());
}

// Loss and every gradient of the differentiated forward graph (the backward
// pass has its own softmaxes): within 1e-5 relative to each tensor's largest
// magnitude (f32).
TEST(Decompose, TinyGptGradientsMatch) {
  Step ref, dec;
  ref.open("autodiff", "forward", false);
  dec.open("autodiff", "forward", true);
  ASSERT_FALSE(HasFailure());
  Batch b;
  std::vector<dsc_tensor *> o1 = run_step(ref, b), o2 = run_step(dec, b);
  ASSERT_EQ(o1.size(), o2.size());
  ASSERT_TRUE(o1[0] && o2[0]);
  EXPECT_GT(o1[0]->data[0], 4.0);  // ~log(256) at init: the graph really ran
  for (size_t k = 0; k < o1.size(); k++) {
    EXPECT_LE(rel_err(o2[k], o1[k]), 1e-5) << "output " << k;
  }
  free_outs(ref, o1);
  free_outs(dec, o2);
}

// One training step: loss, gradient norm and every updated param and state
// within 1e-5 relative to the tensor's largest magnitude (f32). SGD: the
// update is linear in the gradient, so every element is held to that. AdamW's
// first step moves an element by lr * g / (|g| + eps) (+ decay): where |g| is
// far below eps (1e-8) the step is lr * g / eps, decided by the gradient's
// rounding noise. The attention key bias is such a case (softmax ignores a
// per-row shift, so its exact gradient is 0 and the reference moves it by
// ~1e-4 lr); so is a weight behind a gelu unit that is off for the whole
// batch. Any reordering of the f32 arithmetic changes those steps, so for
// AdamW an element may differ by up to 0.1 lr where the reference itself
// moved it by at most 0.1 lr; every element with a real gradient moves by ~lr
// and must match within 1e-5.
void step_case(bool sgd) {
  Step ref, dec;
  ref.open("optimizer", "train_step", false, sgd);
  dec.open("decompose", "train_step", false, sgd);
  ASSERT_FALSE(::testing::Test::HasFailure());
  dsc_params *p0 = dsc_params_init(ref.m, 5);  // the params before the step
  Batch b;
  std::vector<dsc_tensor *> o1 = run_step(ref, b), o2 = run_step(dec, b);
  ASSERT_EQ(o1.size(), 2u);
  ASSERT_EQ(o2.size(), 2u);
  ASSERT_TRUE(o1[0] && o2[0]);
  EXPECT_LE(rel_err(o2[0], o1[0]), 1e-5) << "loss " << o1[0]->data[0] << " vs " << o2[0]->data[0];
  EXPECT_LE(rel_err(o2[1], o1[1]), 1e-5) << "grad_norm";
  ASSERT_EQ(dsc_params_count(ref.params), dsc_params_count(dec.params));
  int noise_steps = 0;
  int64_t total = 0;
  for (int i = 0; i < dsc_params_count(ref.params); i++) {
    dsc_tensor *r = dsc_params_get(ref.params, i), *d = dsc_params_get(dec.params, i);
    dsc_tensor *before = dsc_params_get(p0, i);
    double scale = 0;
    int64_t n = dsc_type_numel(&r->type);
    total += n;
    for (int64_t j = 0; j < n; j++) scale = std::fmax(scale, std::fabs(r->data[j]));
    for (int64_t j = 0; j < n; j++) {
      double err = std::fabs(d->data[j] - r->data[j]);
      if (err <= 1e-5 * scale) continue;
      double moved = std::fabs(r->data[j] - before->data[j]), lr = b.lr->data[0];
      bool noise_step = !sgd && moved <= 0.1 * lr && err <= 0.1 * lr;
      EXPECT_TRUE(noise_step) << dsc_module_param_name(ref.m, i) << "[" << j << "] " << r->data[j]
                              << " vs " << d->data[j];
      if (noise_step) noise_steps++;
      if (!noise_step) break;
    }
  }
  EXPECT_LT(noise_steps, total / 100);  // a handful, not a systematic difference
  printf("%s step: loss %.9g vs %.9g, %d elements in Adam's noise regime\n", sgd ? "sgd" : "adamw",
         o1[0]->data[0], o2[0]->data[0], noise_steps);
  dsc_params_free(p0);
  free_outs(ref, o1);
  free_outs(dec, o2);
}

TEST(Decompose, TinyGptSgdStepMatches) { step_case(true); }
TEST(Decompose, TinyGptAdamwStepMatches) { step_case(false); }

}  // namespace
