// The pass manager: the pass table, stop_after, an unknown pass name,
// print_after_all and verification after each pass.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "dsc/dsc.h"
#include "ir/ir.h"
#include "passes/passes.h"
#include "tests/unit/test_util.h"

namespace {

const char kModel[] = R"(
model tiny {
  param w: f32[3, 2] = normal(0.5)
  param b: f32[2] = zeros
  fn forward(x: f32[B, 3], labels: i32[B]) -> f32 {
    return cross_entropy(matmul(x, w) + b, labels)
  }
}
)";

struct Fixture {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  dsc_module *m = nullptr;
  dsc_train_config cfg;
  Fixture() {
    dsc_dim_binding b = {"B", 2};
    dsc_frontend_options o = {&b, 1, false};
    EXPECT_EQ(dsc_compile_string(ctx, kModel, strlen(kModel), "tiny.dsm", &o, &m), DSC_OK);
    EXPECT_EQ(dsc_train_config_from_module(m, &cfg), DSC_OK);
  }
  ~Fixture() {
    dsc_module_free(m);
    dsc_context_free(ctx);
  }
  std::string diags() { return ::diags(ctx); }
};

TEST(PassManager, TableListsThePipelineInOrder) {
  ASSERT_GE(dsc_pass_count(), 3);
  EXPECT_STREQ(dsc_pass_name(0), "precision");
  EXPECT_STREQ(dsc_pass_name(1), "sequence_parallel");
  EXPECT_STREQ(dsc_pass_name(2), "expert_parallel");
  EXPECT_STREQ(dsc_pass_name(3), "tensor_parallel");
  EXPECT_STREQ(dsc_pass_name(4), "autodiff");
  EXPECT_STREQ(dsc_pass_name(5), "remat");
  EXPECT_STREQ(dsc_pass_name(6), "optimizer");
  for (int i = 0; i < dsc_pass_count(); i++) {
    ASSERT_NE(dsc_pass_description(i), nullptr);
    EXPECT_GT(strlen(dsc_pass_description(i)), 10u);
  }
  EXPECT_EQ(dsc_pass_name(-1), nullptr);
  EXPECT_EQ(dsc_pass_name(dsc_pass_count()), nullptr);
}

TEST(PassManager, StopAfterAutodiff) {
  Fixture f;
  dsc_pipeline_options po = {&f.cfg, "autodiff", false, nullptr, true};
  ASSERT_EQ(dsc_run_pipeline(f.m, &po), DSC_OK) << f.diags();
  dsc_graph *g = dsc_module_find_graph(f.m, "forward");
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(dsc_graph_output_count(g), 3);  // loss, dw, db
  EXPECT_EQ(dsc_module_find_graph(f.m, "train_step"), nullptr);
  EXPECT_LT(dsc_module_find_param(f.m, "opt.step"), 0);
}

TEST(PassManager, FullPipelineBuildsTheStep) {
  Fixture f;
  dsc_pipeline_options po = {&f.cfg, nullptr, false, nullptr, false};
  ASSERT_EQ(dsc_run_pipeline(f.m, &po), DSC_OK) << f.diags();
  EXPECT_EQ(dsc_module_find_graph(f.m, "forward"), nullptr);
  ASSERT_NE(dsc_module_find_graph(f.m, "train_step"), nullptr);
  EXPECT_EQ(dsc_module_verify(f.m), DSC_OK);
  // stop_after naming the last pass is the same as running them all
  Fixture h;
  dsc_pipeline_options po2 = {&h.cfg, dsc_pass_name(dsc_pass_count() - 1), false, nullptr, false};
  ASSERT_EQ(dsc_run_pipeline(h.m, &po2), DSC_OK) << h.diags();
  char *a = dsc_module_print_string(f.m), *b = dsc_module_print_string(h.m);
  EXPECT_STREQ(a, b);
  dsc_string_free(f.ctx, a);
  dsc_string_free(h.ctx, b);
}

TEST(PassManager, UnknownPassListsTheNames) {
  Fixture f;
  dsc_pipeline_options po = {&f.cfg, "no_such_pass", false, nullptr, false};
  EXPECT_EQ(dsc_run_pipeline(f.m, &po), DSC_ERR_USER);
  EXPECT_NE(f.diags().find("unknown pass 'no_such_pass' (the passes are: precision, "
                           "sequence_parallel, expert_parallel, tensor_parallel, autodiff, remat, "
                           "optimizer"),
            std::string::npos)
      << f.diags();
  // nothing ran
  EXPECT_EQ(dsc_graph_output_count(dsc_module_find_graph(f.m, "forward")), 1);
}

TEST(PassManager, PrintAfterAll) {
  Fixture f;
  char *buf = nullptr;
  size_t len = 0;
  FILE *out = open_memstream(&buf, &len);
  ASSERT_NE(out, nullptr);
  dsc_pipeline_options po = {&f.cfg, nullptr, true, out, false};
  ASSERT_EQ(dsc_run_pipeline(f.m, &po), DSC_OK) << f.diags();
  fclose(out);
  std::string s(buf, len);
  free(buf);
  size_t a = s.find("// ---- IR after autodiff ----\nmodule tiny\n");
  size_t o = s.find("// ---- IR after optimizer ----\nmodule tiny\n");
  ASSERT_NE(a, std::string::npos) << s;
  ASSERT_NE(o, std::string::npos) << s;
  EXPECT_EQ(s.find("// ---- IR after precision ----\nmodule tiny\n"), 0u);  // f32: no change
  EXPECT_LT(0u, a);
  EXPECT_LT(a, o);
  // after autodiff: the forward graph; after the optimizer: the step
  EXPECT_NE(s.substr(a, o - a).find("graph forward("), std::string::npos);
  EXPECT_EQ(s.substr(a, o - a).find("graph train_step("), std::string::npos);
  EXPECT_NE(s.substr(o).find("graph train_step("), std::string::npos);
  EXPECT_EQ(s.substr(o).find("graph forward("), std::string::npos);
}

TEST(PassManager, OptimizerNeedsSettings) {
  Fixture f;
  dsc_pipeline_options po = {nullptr, nullptr, false, nullptr, false};
  EXPECT_EQ(dsc_run_pipeline(f.m, &po), DSC_ERR_USER);
  EXPECT_NE(f.diags().find("no training settings"), std::string::npos) << f.diags();
}

TEST(PassManager, VerificationRejectsABrokenInputBeforeAnyPass) {
  // A forward graph reading a param that does not exist: with verification
  // on, the pipeline rejects its input before the first pass runs, so the
  // error is not blamed on a pass.
  Fixture f;
  char *text = dsc_module_print_string(f.m);
  ASSERT_NE(text, nullptr);
  dsc_module *m = nullptr;
  ASSERT_EQ(dsc_module_parse(f.ctx, text, strlen(text), "t.dsir", &m), DSC_OK) << f.diags();
  dsc_string_free(f.ctx, text);
  dsc_graph *g = dsc_module_find_graph(m, "forward");
  int corrupted = 0;
  for (int i = 0; i < g->n_nodes; i++)
    if (g->nodes[i]->op == DSC_OP_PARAM && strcmp(ir_attr_str(g->nodes[i], "name"), "b") == 0) {
      g->nodes[i]->attrs[0].u.s = "no_such_param";
      corrupted++;
    }
  ASSERT_EQ(corrupted, 1);
  dsc_pipeline_options po = {&f.cfg, "autodiff", false, nullptr, true};
  EXPECT_EQ(dsc_run_pipeline(m, &po), DSC_ERR_USER);
  EXPECT_NE(f.diags().find("the IR given to the pass pipeline is invalid"), std::string::npos)
      << f.diags();
  EXPECT_EQ(f.diags().find("after pass"), std::string::npos) << f.diags();
  EXPECT_NE(f.diags().find("no_such_param"), std::string::npos) << f.diags();
  dsc_module_free(m);
}

TEST(PassManager, PassesRunOnAForwardWithoutTheFrontend) {
  // The pipeline works on a module read back from text, too.
  Fixture f;
  char *text = dsc_module_print_string(f.m);
  ASSERT_NE(text, nullptr);
  dsc_module *m = nullptr;
  ASSERT_EQ(dsc_module_parse(f.ctx, text, strlen(text), "t.dsir", &m), DSC_OK) << f.diags();
  dsc_string_free(f.ctx, text);
  dsc_pipeline_options po = {&f.cfg, nullptr, false, nullptr, true};
  EXPECT_EQ(dsc_run_pipeline(m, &po), DSC_OK) << f.diags();
  EXPECT_NE(dsc_module_find_graph(m, "train_step"), nullptr);
  dsc_module_free(m);
}

}  // namespace
