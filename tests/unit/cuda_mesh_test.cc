// The training steps of the mesh passes (sequence, expert and tensor
// parallelism) lower to Programs whose every kernel compiles with NVRTC for
// sm_90 in one program, and whose collectives run over their mesh axis:
// what the cuda executor would launch on a GPU, checked without one. The
// steps are one rank's of dp=2 x {sp, ep, tp}=2 at ZeRO-3 (4 ranks).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>

extern "C" {
#include "codegen/codegen.h"
#include "dsc/frontend.h"
#include "dsc/train.h"
}
#include "tests/unit/test_util.h"

namespace {

struct MeshCase {
  const char *model;  // under examples/
  const char *axis;   // "sp", "ep" or "tp"
  int64_t T;          // positions the step holds (seq / sp with sp)
  int over_axis;      // the step's collectives over the axis
};

// The collective starts of p over group (a mesh axis; "": the world's).
int count_group(const cg_program *p, const char *group) {
  int n = 0;
  for (int i = 0; i < p->n_instrs; i++)
    if (p->instrs[i].kind == CG_INS_COLLECTIVE_START && strcmp(p->instrs[i].coll.group, group) == 0)
      n++;
  return n;
}

void compile_case(const MeshCase &c) {
#ifndef DSC_HAVE_CUDA
  GTEST_SKIP() << "built without the CUDA toolkit";
#else
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  dsc_module *m = nullptr;
  dsc_dim_binding dims[2] = {{"B", 2}, {"T", c.T}};
  dsc_frontend_options fo = {dims, 2, false};
  std::string path = std::string(DSC_SOURCE_DIR) + "/examples/" + c.model;
  ASSERT_EQ(dsc_compile_file(ctx, path.c_str(), &fo, &m), DSC_OK) << diags(ctx);
  dsc_train_config cfg;
  ASSERT_EQ(dsc_train_config_from_module(m, &cfg), DSC_OK) << diags(ctx);
  cfg.batch = 2, cfg.seq = c.T, cfg.grad_accum = 1;
  cfg.precision = DSC_PRECISION_BF16;
  cfg.world = 4, cfg.zero.stage = 3;
  cfg.sp = cfg.ep = cfg.tp = 1;
  int64_t *axis = !strcmp(c.axis, "sp") ? &cfg.sp : !strcmp(c.axis, "ep") ? &cfg.ep : &cfg.tp;
  *axis = 2;
  dsc_pipeline_options po;
  memset(&po, 0, sizeof po);
  po.train = &cfg;
  ASSERT_EQ(dsc_run_pipeline(m, &po), DSC_OK) << diags(ctx);
  dsc_graph *g = dsc_module_find_graph(m, "train_step");
  ASSERT_NE(g, nullptr);
  ir_arena a;
  ir_arena_init(&a, ctx);
  cg_program *p = nullptr;
  ASSERT_EQ(cg_lower_graph(g, &a, &p), DSC_OK) << diags(ctx);
  ASSERT_GT(p->n_kernels, 0);
  EXPECT_EQ(count_group(p, c.axis), c.over_axis) << c.axis << ": the step's collectives";
  EXPECT_GE(count_group(p, ""), 1) << "ZeRO-3's gathers and reductions over the world";
  char *src = cg_cuda_program_source(&a, p->kernels, p->n_kernels);
  ASSERT_NE(src, nullptr) << diags(ctx);
  char *ptx = nullptr;
  void *cubin = nullptr;
  size_t ptx_len = 0, cubin_len = 0;
  std::string name = std::string(c.axis) + "_train_step.cu";
  dsc_status st = cg_nvrtc_compile(ctx, src, name.c_str(), 90, &ptx, &ptx_len, &cubin, &cubin_len);
  EXPECT_EQ(st, DSC_OK) << diags(ctx).substr(0, 20000);
  if (st == DSC_OK) {
    std::string text(ptx);
    for (int i = 0; i < p->n_kernels; i++)
      EXPECT_NE(text.find(std::string(".visible .entry ") + p->kernels[i]->name + "("),
                std::string::npos)
          << p->kernels[i]->name;
  }
  std::printf("%s over %s=2: %d kernels, %d collectives over %s, one NVRTC compile\n", c.model,
              c.axis, p->n_kernels, count_group(p, c.axis), c.axis);
  free(ptx);
  free(cubin);
  ir_arena_release(&a);
  dsc_module_free(m);
  dsc_context_free(ctx);
#endif
}

// 2 layers x (2 exchanges forward + 2 backward)
TEST(CudaMesh, SequenceParallelStepCompilesForSm90) {
  compile_case({"llama-tiny.dsm", "sp", 16, 8});
}
// 2 MoE layers x (the slots out and back) x (forward, backward)
TEST(CudaMesh, ExpertParallelStepCompilesForSm90) { compile_case({"moe-tiny.dsm", "ep", 32, 8}); }
// 2 layers x 2 all_reduces x (forward, backward), and the loss's all_gather
// and all_reduce with their adjoints
TEST(CudaMesh, TensorParallelStepCompilesForSm90) {
  compile_case({"llama-tiny.dsm", "tp", 32, 12});
}

}  // namespace
