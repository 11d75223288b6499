// softplus, the last op added (docs/architecture.md, "Adding an op"): one
// row of include/dsc/ops.def plus its gradient rule (ir_grad_softplus), and
// through that row the frontend's builtin and constant folding, the
// interpreter, the LLVM CPU backend and the CUDA kernel (NVRTC). The
// finite-difference gradient is AutodiffGrad.Softplus (autodiff_test.cc).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "codegen/codegen.h"
#include "dsc/dsc.h"
#include "tests/unit/test_util.h"

extern "C" {
#include "runtime/cuda_api.h"
}

namespace {

double closed_form(double x) { return std::log1p(std::exp(x)); }

// Inputs across the range: large |x| is where log(1 + e^x) overflows or
// loses everything when written naively.
const std::vector<double> kXs = {-80, -30, -2.5, -0.5, 0, 1e-3, 0.75, 3, 30, 80};

dsc_module *compile(dsc_context *ctx, const std::string &text) {
  dsc_module *m = nullptr;
  EXPECT_EQ(dsc_compile_string(ctx, text.data(), text.size(), "sp.dsm", nullptr, &m), DSC_OK)
      << diags(ctx);
  return m;
}

// The module's forward graph on kXs (as the graph's one input), by the
// interpreter.
std::vector<double> interp_forward(dsc_context *ctx, dsc_module *m) {
  const dsc_graph *g = dsc_module_find_graph(m, "forward");
  EXPECT_NE(g, nullptr);
  if (!g) return {};
  dsc_tensor *x = dsc_tensor_new(ctx, dsc_node_type(dsc_graph_input_at(g, 0)));
  for (size_t i = 0; i < kXs.size(); i++) x->data[i] = kXs[i];
  dsc_params *p = dsc_params_init(m, 1);
  dsc_tensor *y = nullptr;
  EXPECT_EQ(dsc_interp_run(g, p, &x, 1, &y), DSC_OK) << diags(ctx);
  std::vector<double> r;
  if (y) r.assign(y->data, y->data + kXs.size());
  dsc_tensor_free(ctx, x);
  dsc_tensor_free(ctx, y);
  dsc_params_free(p);
  return r;
}

TEST(OpSoftplus, BuiltinLowersToTheOpAndFoldsNumbers) {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  // c folds at compile time through the op's scalar function
  dsc_module *m = compile(ctx, R"(model sp {
  const c = softplus(1.5)
  fn forward(x: f64[10]) {
    return softplus(x) * c
  }
}
)");
  ASSERT_NE(m, nullptr);
  const dsc_graph *g = dsc_module_find_graph(m, "forward");
  int n_softplus = 0;
  for (int i = 0; i < dsc_graph_node_count(g); i++)
    n_softplus += dsc_node_op(dsc_graph_node(g, i)) == DSC_OP_SOFTPLUS;
  EXPECT_EQ(n_softplus, 1);  // the constant is folded, not a node
  std::vector<double> y = interp_forward(ctx, m);
  ASSERT_EQ(y.size(), kXs.size());
  for (size_t i = 0; i < kXs.size(); i++)
    EXPECT_NEAR(y[i], closed_form(kXs[i]) * closed_form(1.5),
                1e-14 * std::fmax(1.0, std::fabs(y[i])))
        << "x = " << kXs[i];
  dsc_module_free(m);
  dsc_context_free(ctx);
}

TEST(OpSoftplus, BuiltinSignatureIsChecked) {
  const struct {
    const char *call, *message;
  } cases[] = {
      {"softplus(x, x)", "'softplus' takes 1 argument, got 2"},
      {"softplus(true)", "argument 'x' of 'softplus' must be a tensor or a number, not a bool"},
      {"softplus(y = x)", "'softplus' has no argument named 'y'"},
  };
  for (const auto &c : cases) {
    dsc_context *ctx = dsc_context_new(nullptr, nullptr);
    std::string text =
        std::string("model sp {\n  fn forward(x: f32[4]) {\n    return ") + c.call + "\n  }\n}\n";
    dsc_module *m = nullptr;
    EXPECT_EQ(dsc_compile_string(ctx, text.data(), text.size(), "sp.dsm", nullptr, &m),
              DSC_ERR_USER)
        << c.call;
    EXPECT_NE(diags(ctx).find(c.message), std::string::npos) << c.call << ": " << diags(ctx);
    dsc_module_free(m);
    dsc_context_free(ctx);
  }
}

TEST(OpSoftplus, InterpreterFollowsTheClosedFormWithoutOverflow) {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  dsc_module *m = compile(ctx, "model sp {\n  fn forward(x: f64[10]) { return softplus(x) }\n}\n");
  ASSERT_NE(m, nullptr);
  std::vector<double> y = interp_forward(ctx, m);
  ASSERT_EQ(y.size(), kXs.size());
  for (size_t i = 0; i < kXs.size(); i++) {
    EXPECT_TRUE(std::isfinite(y[i])) << "x = " << kXs[i];
    // relative 1e-13: the formula adds max(x, 0) and log(1 + e^-|x|)
    EXPECT_NEAR(y[i], closed_form(kXs[i]), 1e-13 * std::fmax(closed_form(kXs[i]), 1e-300))
        << "x = " << kXs[i];
  }
  dsc_module_free(m);
  dsc_context_free(ctx);
}

// softplus alone on an f32 [4, 33] input (a ragged vector tail).
dsc_module *softplus_module(dsc_context *ctx) {
  dsc_module *m = dsc_module_new(ctx, "sp");
  dsc_graph *g = dsc_graph_new(m, "g");
  int64_t dims[2] = {4, 33};
  dsc_node *x = dsc_graph_input(g, "x", dsc_type_make(DSC_F32, 2, dims));
  dsc_node *y = dsc_unary(g, DSC_OP_SOFTPLUS, x);
  EXPECT_EQ(dsc_graph_set_outputs(g, &y, 1), DSC_OK) << diags(ctx);
  return m;
}

TEST(OpSoftplus, LlvmCpuBackendMatchesTheInterpreter) {
  if (!dsc_backend_available(DSC_BACKEND_CPU)) GTEST_SKIP() << "no cpu backend in this build";
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  dsc_module *mi = softplus_module(ctx), *mc = softplus_module(ctx);
  ASSERT_EQ(dsc_run_codegen_passes(mc), DSC_OK) << diags(ctx);
  dsc_exec_options oi = {DSC_BACKEND_INTERP, 0, nullptr}, oc = {DSC_BACKEND_CPU, 1, nullptr};
  dsc_exec *xi = nullptr, *xc = nullptr;
  ASSERT_EQ(dsc_exec_new(mi, &oi, &xi), DSC_OK) << diags(ctx);
  ASSERT_EQ(dsc_exec_new(mc, &oc, &xc), DSC_OK) << diags(ctx);
  dsc_tensor *x = dsc_tensor_new(ctx, dsc_node_type(dsc_graph_input_at(dsc_module_find_graph(mi, "g"), 0)));
  int64_t n = dsc_type_numel(&x->type);
  for (int64_t j = 0; j < n; j++) x->data[j] = (double)(float)(-40.0 + 80.0 * (double)j / (double)(n - 1));
  dsc_tensor *yi = nullptr, *yc = nullptr;
  ASSERT_EQ(dsc_exec_run(xi, "g", &x, 1, &yi), DSC_OK) << diags(ctx);
  ASSERT_EQ(dsc_exec_run(xc, "g", &x, 1, &yc), DSC_OK) << diags(ctx);
  test_diff d = test_compare(yi->data, yc->data, n);
  EXPECT_TRUE(d.nonzero);
  // f32: the kernel's exp/log against the interpreter's doubles rounded to f32
  EXPECT_LE(test_normwise(d), 1e-6) << "at " << d.at << ": cpu " << yc->data[d.at] << ", interp "
                                    << yi->data[d.at];
  for (int64_t j = 0; j < n; j++) ASSERT_TRUE(std::isfinite(yc->data[j])) << j;
  dsc_tensor_free(ctx, x);
  dsc_tensor_free(ctx, yi);
  dsc_tensor_free(ctx, yc);
  dsc_exec_free(xi);
  dsc_exec_free(xc);
  dsc_module_free(mi);
  dsc_module_free(mc);
  dsc_context_free(ctx);
}

#ifdef DSC_HAVE_CUDA
// The kernel's CUDA C renders the op's formula and NVRTC compiles it for
// sm_90 (no GPU needed; tests/gpu/gpu_check.c runs it on one).
TEST(OpSoftplus, CudaKernelCompilesWithNvrtc) {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  dsc_module *m = softplus_module(ctx);
  ASSERT_EQ(dsc_run_codegen_passes(m), DSC_OK) << diags(ctx);
  ir_arena arena;
  ir_arena_init(&arena, ctx);
  cg_program *p = nullptr;
  ASSERT_EQ(cg_lower_graph(dsc_module_find_graph(m, "g"), &arena, &p), DSC_OK) << diags(ctx);
  ASSERT_EQ(p->n_kernels, 1);
  std::string src = cg_cuda_program_source(&arena, p->kernels, p->n_kernels);
  EXPECT_NE(src.find("fabsf("), std::string::npos) << src;  // max(x, 0) + log(1 + e^-|x|)
  EXPECT_NE(src.find("logf("), std::string::npos) << src;
  EXPECT_NE(src.find("expf("), std::string::npos) << src;
  void *cubin = nullptr;
  size_t len = 0;
  bool cached = true;
  ASSERT_EQ(cg_cuda_compile_program(ctx, &arena, p, 90, nullptr, &cubin, &len, &cached), DSC_OK)
      << diags(ctx);
  EXPECT_FALSE(cached);
  ASSERT_GT(len, 4u);
  EXPECT_EQ(memcmp(cubin, "\x7f" "ELF", 4), 0);
  free(cubin);
  ir_arena_release(&arena);
  dsc_module_free(m);
  dsc_context_free(ctx);
}
#endif

}  // namespace
