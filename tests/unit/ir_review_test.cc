// Regressions found in review: inputs the text form cannot round-trip,
// initializers and assigns the verifier must reject, integer -0.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>

#include "dsc/dsc.h"
#include "tests/unit/test_util.h"

namespace {

struct Ctx {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  ~Ctx() { dsc_context_free(ctx); }
  std::string diags() const { return ::diags(ctx); }
};

dsc_status parse(Ctx &c, const std::string &text, dsc_module **m) {
  return dsc_module_parse(c.ctx, text.data(), text.size(), "r.dsir", m);
}

}  // namespace

TEST(IrReview, NumericInputNamesAreRejectedSoPrintedTextRoundTrips) {
  Ctx c;
  dsc_module *m = nullptr;
  EXPECT_EQ(parse(c,
                  "module m\n\ngraph forward(%0: f32[2]) {\n  %1 = neg(%0) : f32[2]\n"
                  "  return %1\n}\n",
                  &m),
            DSC_ERR_USER);
  EXPECT_EQ(m, nullptr);
  EXPECT_NE(c.diags().find("3:15: graph input %0 must be named, not numbered"), std::string::npos)
      << c.diags();
  // the builder API says the same
  dsc_module *b = dsc_module_new(c.ctx, "b");
  dsc_graph *g = dsc_graph_new(b, "forward");
  int64_t two = 2;
  EXPECT_EQ(dsc_graph_input(g, "12", dsc_type_make(DSC_F32, 1, &two)), nullptr);
  EXPECT_NE(dsc_graph_input(g, "x12", dsc_type_make(DSC_F32, 1, &two)), nullptr);
  dsc_module_free(b);
}

TEST(IrReview, VerifierRejectsBadInitializers) {
  const char *cases[][2] = {
      {"param w: i32[4] = normal(0.02, 0.0)", "normal() initializes only float tensors"},
      {"param w: bool[2] = uniform(-1.0, 1.0)", "uniform() initializes only float tensors"},
      {"param w: f32[2] = normal(nan, 0.0)", "finite std >= 0"},
      {"param w: f32[2] = normal(-1.0, 0.0)", "finite std >= 0"},
      {"param w: f32[2] = uniform(1.0, 1.0)", "lo < hi"},
      {"param w: f32[2] = const(inf)", "finite value"},
      {"param w: i32[2] = const(2.5)", "needs an integer"},
      {"param w: bool[2] = const(2.0)", "bool is 0 or 1"},
  };
  for (auto &k : cases) {
    Ctx c;
    dsc_module *m = nullptr;
    std::string text = std::string("module m\n\n") + k[0] +
                       "\n\ngraph forward(%x: f32[2]) {\n  %0 = neg(%x) : f32[2]\n  return %0\n}\n";
    EXPECT_EQ(parse(c, text, &m), DSC_ERR_USER) << k[0];
    EXPECT_NE(c.diags().find(k[1]), std::string::npos) << k[0] << "\n" << c.diags();
    dsc_module_free(m);
  }
  // the valid forms still pass
  Ctx c;
  dsc_module *m = nullptr;
  EXPECT_EQ(parse(c,
                  "module m\n\nparam a: f32[2] = normal(0.02, 0.0)\nparam b: i32[2] = const(3.0)\n"
                  "param c: bool[2] = const(1.0)\nparam d: f32[2] = uniform(-0.5, 0.5)\n\n"
                  "graph forward(%x: f32[2]) {\n  %0 = neg(%x) : f32[2]\n  return %0\n}\n",
                  &m),
            DSC_OK)
      << c.diags();
  dsc_module_free(m);
}

TEST(IrReview, VerifierRejectsTwoAssignsToOneState) {
  Ctx c;
  dsc_module *m = nullptr;
  EXPECT_EQ(parse(c,
                  "module m\n\nstate s: f32[2] = zeros\n\ngraph step(%x: f32[2]) {\n"
                  "  %0 = neg(%x) : f32[2]\n  %1 = assign(%0) {name = \"s\"} : f32[2]\n"
                  "  %2 = assign(%x) {name = \"s\"} : f32[2]\n  return %2\n}\n",
                  &m),
            DSC_ERR_USER);
  EXPECT_NE(c.diags().find("'s' is assigned twice in one graph"), std::string::npos) << c.diags();
  EXPECT_NE(c.diags().find("8:3:"), std::string::npos) << "at the second assign\n" << c.diags();
}

TEST(IrReview, IntegerResultsHaveNoNegativeZero) {
  Ctx c;
  dsc_module *m = dsc_module_new(c.ctx, "m");
  dsc_graph *g = dsc_graph_new(m, "forward");
  int64_t n = 3;
  dsc_node *x = dsc_graph_input(g, "x", dsc_type_make(DSC_F32, 1, &n));
  dsc_node *y = dsc_cast(g, x, DSC_I32);
  ASSERT_EQ(dsc_graph_set_outputs(g, &y, 1), DSC_OK) << c.diags();
  dsc_params *p = dsc_params_init(m, 0);
  dsc_tensor *in = dsc_tensor_new(c.ctx, dsc_type_make(DSC_F32, 1, &n));
  in->data[0] = -0.25, in->data[1] = -2.5, in->data[2] = 0.75;
  const dsc_tensor *ins[1] = {in};
  dsc_tensor *out = nullptr;
  ASSERT_EQ(dsc_interp_run(g, p, ins, 1, &out), DSC_OK) << c.diags();
  EXPECT_EQ(out->data[0], 0.0);
  EXPECT_FALSE(std::signbit(out->data[0])) << "-0 from truncating -0.25";
  EXPECT_EQ(out->data[1], -2.0);
  EXPECT_FALSE(std::signbit(out->data[2]));
  dsc_tensor_free(c.ctx, in);
  dsc_tensor_free(c.ctx, out);
  dsc_params_free(p);
  dsc_module_free(m);
}

TEST(IrReview, VerifierRejectsReadingACollectiveInFlight) {
  // Only the matching wait may read a start's value (the data in flight).
  Ctx c;
  dsc_module *m = nullptr;
  EXPECT_EQ(parse(c,
                  "module m\n\ngraph g(%x: f32[2]) {\n"
                  "  %0 = all_reduce_start(%x) {world = 2, tag = 0, group = \"world\"} : f32[2]\n"
                  "  %1 = neg(%0) : f32[2]\n  %2 = all_reduce_wait(%0) : f32[2]\n"
                  "  return %2\n}\n",
                  &m),
            DSC_ERR_USER);
  EXPECT_NE(c.diags().find("5:3: neg: reads a all_reduce_start whose data is in flight"),
            std::string::npos)
      << c.diags();
  Ctx c2;
  EXPECT_EQ(parse(c2,
                  "module m\n\ngraph g(%x: f32[2]) {\n"
                  "  %0 = all_reduce_start(%x) {world = 2, tag = 0, group = \"world\"} : f32[2]\n"
                  "  %1 = all_reduce_wait(%0) : f32[2]\n  return %0\n}\n",
                  &m),
            DSC_ERR_USER);
  EXPECT_NE(c2.diags().find("output 0 is a all_reduce_start whose data is in flight"),
            std::string::npos)
      << c2.diags();
  // start then wait then use: fine
  Ctx c3;
  EXPECT_EQ(parse(c3,
                  "module m\n\ngraph g(%x: f32[2]) {\n"
                  "  %0 = all_reduce_start(%x) {world = 2, tag = 0, group = \"world\"} : f32[2]\n"
                  "  %1 = all_reduce_wait(%0) : f32[2]\n  %2 = neg(%1) : f32[2]\n  return %2\n}\n",
                  &m),
            DSC_OK)
      << c3.diags();
  dsc_module_free(m);
}
