// Training steps lowered by codegen/lower.c and printed by codegen/cuda.c
// compile with NVRTC for sm_90 in ONE program (one compile per program, not
// per kernel), every kernel an entry of the PTX: the GPT-2 124M step (B=4,
// T=64, f32), and one rank's steps of the mesh passes (sequence, expert and
// tensor parallelism: dp=2 x {sp, ep, tp}=2 at ZeRO-3, bf16) with their
// collectives over the axis counted. What the cuda executor would launch on
// a GPU, checked without one.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>

extern "C" {
#include "codegen/codegen.h"
#include "dsc/frontend.h"
#include "dsc/train.h"
}
#include "tests/unit/test_util.h"

namespace {

// The collective starts of p over group (a mesh axis; "": the world's).
int count_group(const cg_program *p, const char *group) {
  int n = 0;
  for (int i = 0; i < p->n_instrs; i++)
    if (p->instrs[i].kind == CG_INS_COLLECTIVE_START && strcmp(p->instrs[i].coll.group, group) == 0)
      n++;
  return n;
}

// examples/MODEL at B x T through the training pipeline (cfg as the model's
// train section, then `tune`), its train_step lowered and compiled by NVRTC
// in one program; `check` sees the Program.
void compile_step(const char *model, int64_t B, int64_t T,
                  const std::function<void(dsc_train_config *)> &tune,
                  const std::function<void(const cg_program *)> &check) {
#ifndef DSC_HAVE_CUDA
  (void)model, (void)B, (void)T, (void)tune, (void)check;
  GTEST_SKIP() << "built without the CUDA toolkit";
#else
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  dsc_module *m = nullptr;
  dsc_dim_binding dims[2] = {{"B", B}, {"T", T}};
  dsc_frontend_options fo = {dims, 2, false};
  std::string path = std::string(DSC_SOURCE_DIR) + "/examples/" + model;
  ASSERT_EQ(dsc_compile_file(ctx, path.c_str(), &fo, &m), DSC_OK) << diags(ctx);
  dsc_train_config cfg;
  ASSERT_EQ(dsc_train_config_from_module(m, &cfg), DSC_OK) << diags(ctx);
  cfg.batch = B, cfg.seq = T, cfg.grad_accum = 1;
  tune(&cfg);
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
  check(p);
  auto t0 = std::chrono::steady_clock::now();
  char *src = cg_cuda_program_source(&a, p->kernels, p->n_kernels);
  double gen_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_NE(src, nullptr) << diags(ctx);
  char *ptx = nullptr;
  void *cubin = nullptr;
  size_t ptx_len = 0, cubin_len = 0;
  t0 = std::chrono::steady_clock::now();
  std::string name = std::string(model) + ".train_step.cu";
  dsc_status st = cg_nvrtc_compile(ctx, src, name.c_str(), 90, &ptx, &ptx_len, &cubin, &cubin_len);
  double nvrtc_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf(
      "%s train step: %d kernels, %zu bytes of CUDA C (%.3f s) -> %zu bytes PTX, %zu bytes "
      "cubin; one NVRTC compile for sm_90: %.2f s\n",
      model, p->n_kernels, strlen(src), gen_s, ptx_len, cubin_len, nvrtc_s);
  EXPECT_EQ(st, DSC_OK) << diags(ctx).substr(0, 20000);
  if (st == DSC_OK) {
    std::string text(ptx);
    for (int i = 0; i < p->n_kernels; i++)
      EXPECT_NE(text.find(std::string(".visible .entry ") + p->kernels[i]->name + "("),
                std::string::npos)
          << p->kernels[i]->name;
    const unsigned char *c = (const unsigned char *)cubin;
    EXPECT_TRUE(cubin_len > 4 && c[0] == 0x7f && c[1] == 'E' && c[2] == 'L' && c[3] == 'F');
  }
  free(ptx);
  free(cubin);
  ir_arena_release(&a);
  dsc_module_free(m);
  dsc_context_free(ctx);
#endif
}

TEST(CudaGpt2, EveryTrainStepKernelCompilesInOneNvrtcProgram) {
  compile_step(
      "gpt2.dsm", 4, 64, [](dsc_train_config *c) { c->precision = DSC_PRECISION_F32; },
      [](const cg_program *) {});
}

// One rank of dp=2 x {axis}=2 at ZeRO-3, bf16: over_axis collectives over
// the axis, and ZeRO-3's over the world.
void mesh_case(const char *model, const char *axis, int64_t T, int over_axis) {
  compile_step(
      model, 2, T,
      [axis](dsc_train_config *c) {
        c->precision = DSC_PRECISION_BF16;
        c->world = 4, c->zero.stage = 3;
        c->sp = c->ep = c->tp = 1;
        *(!strcmp(axis, "sp") ? &c->sp : !strcmp(axis, "ep") ? &c->ep : &c->tp) = 2;
      },
      [axis, over_axis](const cg_program *p) {
        EXPECT_EQ(count_group(p, axis), over_axis) << axis << ": the step's collectives";
        EXPECT_GE(count_group(p, ""), 1) << "ZeRO-3's gathers and reductions over the world";
      });
}

// 2 layers x (2 exchanges forward + 2 backward); the step holds seq / sp
TEST(CudaMesh, SequenceParallelStepCompilesForSm90) { mesh_case("llama-tiny.dsm", "sp", 16, 8); }
// 2 MoE layers x (the slots out and back) x (forward, backward)
TEST(CudaMesh, ExpertParallelStepCompilesForSm90) { mesh_case("moe-tiny.dsm", "ep", 32, 8); }
// 2 layers x 2 all_reduces x (forward, backward), and the loss's all_gather
// and all_reduce with their adjoints
TEST(CudaMesh, TensorParallelStepCompilesForSm90) { mesh_case("llama-tiny.dsm", "tp", 32, 12); }

}  // namespace
