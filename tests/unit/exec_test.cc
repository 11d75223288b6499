// The public executor (include/dsc/exec.h): the cpu backend against the
// interpreter on the tiny GPT's training step, params in and out, errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "dsc/dsc.h"
#include "tests/unit/test_util.h"

namespace {

// The tiny GPT's train step at B=2, T=16, through the pipeline up to
// stop_after. With eps = 1e-8 Adam's first steps are lr * sign(g): a
// gradient that is zero up to rounding (the attention key bias) then moves
// by +-lr on either backend, a difference no tolerance can describe.
// eps = 1e-3 keeps the update a smooth function of g (as lower_test.cc does).
dsc_module *tiny_step(dsc_context *ctx, const char *stop_after) {
  test_tiny_options o = {};
  o.stop_after = stop_after;
  o.adam_eps = 1e-3;
  return test_tiny_step(ctx, &o);
}

TEST(Exec, BackendNamesAndAvailability) {
  dsc_backend b;
  EXPECT_EQ(dsc_backend_from_name("cpu", &b), 0);
  EXPECT_EQ(b, DSC_BACKEND_CPU);
  EXPECT_STREQ(dsc_backend_name(DSC_BACKEND_CUDA), "cuda");
  EXPECT_NE(dsc_backend_from_name("gpu", &b), 0);
  EXPECT_TRUE(dsc_backend_available(DSC_BACKEND_INTERP));
#ifdef DSC_HAVE_CUDA
  EXPECT_TRUE(dsc_backend_available(DSC_BACKEND_CUDA));  // the device check is dsc_exec_new's
#else
  EXPECT_FALSE(dsc_backend_available(DSC_BACKEND_CUDA));
#endif
}

TEST(Exec, CudaBackendIsAClearErrorHere) {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  dsc_module *m = tiny_step(ctx, nullptr);
  ASSERT_NE(m, nullptr) << diags(ctx);
  dsc_exec_options o = {DSC_BACKEND_CUDA, 0, nullptr};
  dsc_exec *x = nullptr;
  EXPECT_EQ(dsc_exec_new(m, &o, &x), DSC_ERR_USER);
  EXPECT_EQ(x, nullptr);
  EXPECT_NE(diags(ctx).find("backend cuda"), std::string::npos) << diags(ctx);
  dsc_module_free(m);
  dsc_context_free(ctx);
}

// Three AdamW steps of the tiny GPT on the cpu backend follow the
// interpreter: loss and grad norm within 1e-5 relative each step; params
// and states within 1e-5 of their largest magnitude (norm-wise: small
// elements come from cancelling sums), Adam's second moments (squares of
// gradients, so twice the relative error) within 2e-5.
TEST(Exec, CpuTrainStepFollowsTheInterpreter) {
  if (!dsc_backend_available(DSC_BACKEND_CPU)) GTEST_SKIP() << "no cpu backend in this build";
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  dsc_module *mi = tiny_step(ctx, "optimizer"), *mc = tiny_step(ctx, nullptr);
  ASSERT_TRUE(mi && mc) << diags(ctx);
  dsc_exec_options oi = {DSC_BACKEND_INTERP, 0, nullptr}, oc = {DSC_BACKEND_CPU, 2, nullptr};
  dsc_exec *xi = nullptr, *xc = nullptr;
  ASSERT_EQ(dsc_exec_new(mi, &oi, &xi), DSC_OK) << diags(ctx);
  ASSERT_EQ(dsc_exec_new(mc, &oc, &xc), DSC_OK) << diags(ctx);
  EXPECT_EQ(dsc_exec_backend(xc), DSC_BACKEND_CPU);
  dsc_params *pi = dsc_params_init(mi, 5), *pc = dsc_params_init(mc, 5);
  ASSERT_EQ(dsc_exec_set_params(xi, pi), DSC_OK);
  ASSERT_EQ(dsc_exec_set_params(xc, pc), DSC_OK);
  const dsc_graph *g = dsc_module_find_graph(mc, "train_step");
  ASSERT_NE(g, nullptr);
  std::mt19937 rng(11);
  for (int step = 0; step < 3; step++) {
    dsc_tensor *in[3];
    for (int i = 0; i < 3; i++) in[i] = dsc_tensor_new(ctx, dsc_node_type(dsc_graph_input_at(g, i)));
    int64_t n = dsc_type_numel(&in[0]->type);
    for (int64_t j = 0; j < n; j++) in[0]->data[j] = (double)(rng() % 256), in[1]->data[j] = (double)(rng() % 256);
    in[2]->data[0] = (double)(float)1e-3;
    dsc_tensor *oi_[2] = {nullptr, nullptr}, *oc_[2] = {nullptr, nullptr};
    ASSERT_EQ(dsc_exec_run(xi, "train_step", in, 3, oi_), DSC_OK) << diags(ctx);
    ASSERT_EQ(dsc_exec_run(xc, "train_step", in, 3, oc_), DSC_OK) << diags(ctx);
    for (int k = 0; k < 2; k++)
      EXPECT_NEAR(oc_[k]->data[0], oi_[k]->data[0], 1e-5 * std::fabs(oi_[k]->data[0]))
          << "step " << step << " output " << k;
    for (int k = 0; k < 2; k++) dsc_tensor_free(ctx, oi_[k]), dsc_tensor_free(ctx, oc_[k]);
    for (int i = 0; i < 3; i++) dsc_tensor_free(ctx, in[i]);
  }
  ASSERT_EQ(dsc_exec_get_params(xi, pi), DSC_OK);
  ASSERT_EQ(dsc_exec_get_params(xc, pc), DSC_OK);
  ASSERT_EQ(dsc_params_count(pi), dsc_params_count(pc));
  int moved = 0;
  for (int p = 0; p < dsc_params_count(pi); p++) {
    const dsc_tensor *a = dsc_params_get(pi, p), *b = dsc_params_get(pc, p);
    test_diff d = test_compare(a->data, b->data, dsc_type_numel(&a->type));
    const char *name = dsc_module_param_name(mi, p);
    double tol = strncmp(name, "opt.v.", 6) == 0 ? 2e-5 : 1e-5;
    EXPECT_LE(d.err, tol * std::fmax(d.scale, 1e-30)) << name;
    moved += d.scale > 0;
  }
  EXPECT_GT(moved, 10);
  // Params go in and out unchanged.
  dsc_params *back = dsc_params_init(mc, 99);
  ASSERT_EQ(dsc_exec_set_params(xc, pc), DSC_OK);
  ASSERT_EQ(dsc_exec_get_params(xc, back), DSC_OK);
  for (int p = 0; p < dsc_params_count(pc); p++) {
    const dsc_tensor *a = dsc_params_get(pc, p), *b = dsc_params_get(back, p);
    EXPECT_EQ(memcmp(a->data, b->data, sizeof(double) * (size_t)dsc_type_numel(&a->type)), 0);
  }
  dsc_params_free(back);
  // Errors: unknown graph, wrong input count, params of another module.
  dsc_diag_clear(ctx);
  EXPECT_EQ(dsc_exec_run(xc, "nope", nullptr, 0, nullptr), DSC_ERR_USER);
  EXPECT_NE(diags(ctx).find("no graph 'nope'"), std::string::npos) << diags(ctx);
  EXPECT_EQ(dsc_exec_run(xc, "train_step", nullptr, 0, nullptr), DSC_ERR_USER);
  dsc_params_free(pi);
  dsc_params_free(pc);
  dsc_exec_free(xi);
  dsc_exec_free(xc);
  dsc_module_free(mi);
  dsc_module_free(mc);
  dsc_context_free(ctx);
}

}  // namespace
