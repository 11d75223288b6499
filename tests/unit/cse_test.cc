// Common subexpression elimination (passes/cse.c): which nodes merge, which
// stay, and that the tiny GPT's training step computes bit-identical results
// after the pass (the interpreter runs both graphs).
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "dsc/dsc.h"
#include "ir/ir.h"
#include "passes/passes.h"
#include "tests/unit/test_util.h"

namespace {

dsc_type ty(std::vector<int64_t> dims, dsc_dtype dt = DSC_F32) {
  return dsc_type_make(dt, (int)dims.size(), dims.data());
}

int count_op(dsc_graph *g, dsc_op op) {
  int n = 0;
  for (int i = 0; i < dsc_graph_node_count(g); i++) n += dsc_node_op(dsc_graph_node(g, i)) == op;
  return n;
}

struct Graph {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  dsc_module *m = dsc_module_new(ctx, "t");
  dsc_graph *g = dsc_graph_new(m, "f");
  ~Graph() {
    dsc_module_free(m);
    dsc_context_free(ctx);
  }
  dsc_node *sum(dsc_node *x, std::vector<int64_t> axes, bool keep = false) {
    return dsc_reduce(g, DSC_OP_SUM, x, axes.data(), (int)axes.size(), keep);
  }
};

// Two softmax-like chains over the same input: the reductions (max, sum)
// merge, so does a matmul; the elementwise copies (exp) stay, one per
// consumer, and the duplicate reductions are removed as unused.
TEST(Cse, EqualReductionsAndMatmulsMergeElementwiseCopiesStay) {
  Graph t;
  dsc_node *x = dsc_graph_input(t.g, "x", ty({4, 6}));
  dsc_node *w = dsc_graph_input(t.g, "w", ty({6, 3}));
  std::vector<dsc_node *> outs;
  for (int k = 0; k < 2; k++) {
    int64_t ax = 1;
    dsc_node *mx = dsc_reduce(t.g, DSC_OP_MAX, x, &ax, 1, true);
    dsc_node *e = dsc_unary(t.g, DSC_OP_EXP, dsc_binary(t.g, DSC_OP_SUB, x, mx));
    dsc_node *s = t.sum(e, {1}, true);
    outs.push_back(dsc_binary(t.g, DSC_OP_DIV, e, s));
    outs.push_back(dsc_binary(t.g, DSC_OP_MATMUL, x, w));
  }
  ASSERT_EQ(dsc_graph_set_outputs(t.g, outs.data(), (int)outs.size()), DSC_OK) << diags(t.ctx);
  ASSERT_EQ(count_op(t.g, DSC_OP_MAX), 2);
  ASSERT_EQ(pass_cse_graph(t.g), DSC_OK) << diags(t.ctx);
  ASSERT_EQ(dsc_module_verify(t.m), DSC_OK) << diags(t.ctx);
  EXPECT_EQ(count_op(t.g, DSC_OP_MAX), 1);
  EXPECT_EQ(count_op(t.g, DSC_OP_SUM), 1);
  EXPECT_EQ(count_op(t.g, DSC_OP_MATMUL), 1);
  EXPECT_EQ(count_op(t.g, DSC_OP_EXP), 2);  // recomputed by each consumer, never stored twice
  EXPECT_EQ(count_op(t.g, DSC_OP_DIV), 2);
  EXPECT_EQ(dsc_graph_output_at(t.g, 1), dsc_graph_output_at(t.g, 3));
}

// Different axes, keepdims, inputs, dtypes or float attributes never merge.
TEST(Cse, DifferentAttributesOrInputsDoNotMerge) {
  Graph t;
  dsc_node *x = dsc_graph_input(t.g, "x", ty({4, 6}));
  dsc_node *y = dsc_graph_input(t.g, "y", ty({4, 6}));
  std::vector<dsc_node *> outs = {t.sum(x, {1}), t.sum(x, {0}), t.sum(x, {1}, true), t.sum(y, {1}),
                                  t.sum(dsc_cast(t.g, x, DSC_F64), {1})};
  dsc_attr p2 = dsc_attr_float("exponent", 2.0), p3 = dsc_attr_float("exponent", 3.0);
  outs.push_back(t.sum(dsc_build(t.g, DSC_OP_POW, &x, 1, &p2, 1), {0, 1}));
  outs.push_back(t.sum(dsc_build(t.g, DSC_OP_POW, &x, 1, &p3, 1), {0, 1}));
  ASSERT_EQ(dsc_graph_set_outputs(t.g, outs.data(), (int)outs.size()), DSC_OK) << diags(t.ctx);
  int sums = count_op(t.g, DSC_OP_SUM);
  ASSERT_EQ(pass_cse_graph(t.g), DSC_OK) << diags(t.ctx);
  EXPECT_EQ(count_op(t.g, DSC_OP_SUM), sums);
}

// Side effects stay: assigns of one value to two params, and inputs, are
// never merged or dropped even when nothing reads them; an unused pure node
// is dropped.
TEST(Cse, AssignsAndInputsStayUnusedPureNodesGo) {
  Graph t;
  dsc_init init = {DSC_INIT_ZEROS, 0, 0, NULL};
  ASSERT_EQ(dsc_module_add_param(t.m, "p", ty({3}), init), DSC_OK);
  ASSERT_EQ(dsc_module_add_param(t.m, "q", ty({3}), init), DSC_OK);
  dsc_node *x = dsc_graph_input(t.g, "x", ty({3}));
  dsc_graph_input(t.g, "unused", ty({2}));
  dsc_node *p = dsc_param_ref(t.g, "p");
  dsc_node *v = dsc_binary(t.g, DSC_OP_ADD, p, x);
  dsc_attr to_p = dsc_attr_str("name", "p"), to_q = dsc_attr_str("name", "q");
  dsc_build(t.g, DSC_OP_ASSIGN, &v, 1, &to_p, 1);
  dsc_build(t.g, DSC_OP_ASSIGN, &v, 1, &to_q, 1);
  t.sum(x, {0});  // unused
  dsc_node *out = t.sum(v, {0});
  ASSERT_EQ(dsc_graph_set_outputs(t.g, &out, 1), DSC_OK) << diags(t.ctx);
  ASSERT_EQ(pass_cse_graph(t.g), DSC_OK) << diags(t.ctx);
  ASSERT_EQ(dsc_module_verify(t.m), DSC_OK) << diags(t.ctx);
  EXPECT_EQ(count_op(t.g, DSC_OP_ASSIGN), 2);
  EXPECT_EQ(count_op(t.g, DSC_OP_INPUT), 2);
  EXPECT_EQ(count_op(t.g, DSC_OP_SUM), 1);
}

// The tiny GPT's training step through "decompose", with and without the
// pass: the cross-entropy backward reuses the forward's max and sum, and
// one step gives bit-identical loss, gradient norm, params and states.
TEST(Cse, TinyGptStepIsBitIdenticalAndSharesTheLossStatistics) {
  struct Step {
    dsc_context *ctx = dsc_context_new(nullptr, nullptr);
    dsc_module *m = nullptr;
    dsc_params *params = nullptr;
    dsc_graph *g = nullptr;
    ~Step() {
      dsc_params_free(params);
      dsc_module_free(m);
      dsc_context_free(ctx);
    }
  } a, b;
  for (Step *s : {&a, &b}) {
    dsc_dim_binding dims[2] = {{"B", 2}, {"T", 8}};
    dsc_frontend_options o = {dims, 2, false};
    std::string path = std::string(DSC_SOURCE_DIR) + "/examples/gpt-tiny.dsm";
    ASSERT_EQ(dsc_compile_file(s->ctx, path.c_str(), &o, &s->m), DSC_OK) << diags(s->ctx);
    dsc_train_config cfg;
    ASSERT_EQ(dsc_train_config_from_module(s->m, &cfg), DSC_OK) << diags(s->ctx);
    dsc_pipeline_options po = {&cfg, s == &a ? "decompose" : "cse", false, nullptr, true};
    ASSERT_EQ(dsc_run_pipeline(s->m, &po), DSC_OK) << diags(s->ctx);
    s->g = dsc_module_find_graph(s->m, "train_step");
    ASSERT_NE(s->g, nullptr);
    s->params = dsc_params_init(s->m, 5);
    ASSERT_NE(s->params, nullptr);
  }
  EXPECT_LT(count_op(b.g, DSC_OP_MAX), count_op(a.g, DSC_OP_MAX));
  EXPECT_LT(dsc_graph_node_count(b.g), dsc_graph_node_count(a.g));
  printf("tiny GPT train_step: %d nodes -> %d after cse; max %d -> %d, sum %d -> %d\n",
         dsc_graph_node_count(a.g), dsc_graph_node_count(b.g), count_op(a.g, DSC_OP_MAX),
         count_op(b.g, DSC_OP_MAX), count_op(a.g, DSC_OP_SUM), count_op(b.g, DSC_OP_SUM));

  std::mt19937_64 rng(3);
  std::vector<dsc_tensor *> in;
  for (int i = 0; i < dsc_graph_input_count(a.g); i++) {
    dsc_type t = dsc_node_type(dsc_graph_input_at(a.g, i));
    dsc_tensor *x = dsc_tensor_new(a.ctx, t);
    for (int64_t j = 0; j < dsc_type_numel(&t); j++)
      x->data[j] = t.dtype == DSC_F32 ? 1e-3 : (double)(rng() % 256);
    in.push_back(x);
  }
  std::vector<dsc_tensor *> oa(dsc_graph_output_count(a.g)), ob(dsc_graph_output_count(b.g));
  ASSERT_EQ(oa.size(), ob.size());
  ASSERT_EQ(dsc_interp_run(a.g, a.params, in.data(), (int)in.size(), oa.data()), DSC_OK)
      << diags(a.ctx);
  ASSERT_EQ(dsc_interp_run(b.g, b.params, in.data(), (int)in.size(), ob.data()), DSC_OK)
      << diags(b.ctx);
  for (size_t k = 0; k < oa.size(); k++) {
    EXPECT_EQ(oa[k]->data[0], ob[k]->data[0]) << "output " << k;
    EXPECT_EQ(std::memcmp(oa[k]->data, ob[k]->data, sizeof(double) * dsc_type_numel(&oa[k]->type)), 0);
  }
  EXPECT_GT(oa[0]->data[0], 4.0);  // ~log(256): the step really ran
  ASSERT_EQ(dsc_params_count(a.params), dsc_params_count(b.params));
  for (int i = 0; i < dsc_params_count(a.params); i++) {
    dsc_tensor *pa = dsc_params_get(a.params, i), *pb = dsc_params_get(b.params, i);
    ASSERT_TRUE(dsc_type_equal(&pa->type, &pb->type));
    EXPECT_EQ(std::memcmp(pa->data, pb->data, sizeof(double) * dsc_type_numel(&pa->type)), 0)
        << dsc_module_param_name(a.m, i);
  }
  for (dsc_tensor *x : oa) dsc_tensor_free(a.ctx, x);
  for (dsc_tensor *x : ob) dsc_tensor_free(b.ctx, x);
  for (dsc_tensor *x : in) dsc_tensor_free(a.ctx, x);
}

}  // namespace
