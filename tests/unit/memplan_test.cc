// The memory plan (codegen/memplan.c): the categories add up to the peak,
// which is the lowered program's arenas (+ GEMM scratch); liveness makes a
// chain's peak smaller than the sum of its buffers; params and optimizer
// bytes are the module's; gradients, collectives and forward values land in
// their categories; shard padding per rank.
#include <gtest/gtest.h>

#include <string>

#include "codegen/codegen.h"
#include "dsc/frontend.h"
#include "dsc/train.h"
#include "tests/unit/test_util.h"

namespace {

int64_t sum_bytes(const cg_memplan &p) {
  int64_t s = 0;
  for (int k = 0; k < CG_MEM_COUNT; k++) s += p.bytes[k];
  return s;
}

struct Fixture {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  dsc_module *m = dsc_module_new(ctx, "t");
  ir_arena a;
  Fixture() { ir_arena_init(&a, ctx); }
  ~Fixture() {
    ir_arena_release(&a);
    dsc_module_free(m);
    dsc_context_free(ctx);
  }
};

dsc_type f32(std::initializer_list<int64_t> dims) {
  std::vector<int64_t> d(dims);
  return dsc_type_make(DSC_F32, (int)d.size(), d.data());
}

// A chain of n matmuls y_{i+1} = y_i . w_i (64x64, f32): each result is a
// buffer that dies after the next matmul reads it.
dsc_graph *chain(Fixture &f, int n) {
  dsc_graph *g = dsc_graph_new(f.m, "chain");
  dsc_node *y = dsc_graph_input(g, "x", f32({64, 64}));
  for (int i = 0; i < n; i++) {
    std::string name = "w" + std::to_string(i);
    EXPECT_EQ(dsc_module_add_param(f.m, name.c_str(), f32({64, 64}), {DSC_INIT_NORMAL, 0.1, 0, NULL}),
              DSC_OK);
    y = dsc_matmul(g, y, dsc_param_ref(g, name.c_str()));
  }
  int64_t axes[2] = {0, 1};
  dsc_attr at[2] = {dsc_attr_ints("axes", axes, 2), dsc_attr_bool("keepdims", 0)};
  dsc_node *s = dsc_build(g, DSC_OP_SUM, &y, 1, at, 2);
  EXPECT_NE(s, nullptr) << diags(f.ctx);
  EXPECT_EQ(dsc_graph_set_outputs(g, &s, 1), DSC_OK);
  return g;
}

TEST(MemPlan, ChainPeakIsBelowTheSumAndCategoriesAddUp) {
  Fixture f;
  const int n = 8;
  dsc_graph *g = chain(f, n);
  ASSERT_EQ(dsc_module_add_state(f.m, "opt.step", f32({}), {DSC_INIT_ZEROS, 0, 0, NULL}), DSC_OK);
  ASSERT_EQ(dsc_module_add_state(f.m, "opt.m.w0", f32({64, 64}), {DSC_INIT_ZEROS, 0, 0, NULL}), DSC_OK);
  ASSERT_EQ(dsc_run_codegen_passes(f.m), DSC_OK) << diags(f.ctx);
  cg_memplan p;
  cg_program *prog = nullptr;
  ASSERT_EQ(cg_memplan_graph(g, &f.a, nullptr, &p, &prog), DSC_OK) << diags(f.ctx);

  // The arenas are the program's, and the categories add up to the peak.
  EXPECT_EQ(p.state_arena, prog->arena_bytes[CG_ARENA_STATE]);
  EXPECT_EQ(p.work_arena, prog->arena_bytes[CG_ARENA_WORK]);
  EXPECT_EQ(p.gemm_scratch, 0);
  EXPECT_EQ(p.peak, p.state_arena + p.work_arena);
  EXPECT_EQ(sum_bytes(p), p.peak);

  // params and optimizer bytes are the module's.
  EXPECT_EQ(p.bytes[CG_MEM_PARAMS], n * 64 * 64 * 4);
  EXPECT_EQ(p.bytes[CG_MEM_OPTIMIZER], 4 + 64 * 64 * 4);
  EXPECT_EQ(p.param_count, n * 64 * 64);
  EXPECT_EQ(p.param_elems, n * 64 * 64);
  EXPECT_EQ(p.state_elems, 1 + 64 * 64);
  int64_t layout_total = 0;
  std::vector<int64_t> offs(dsc_module_param_count(f.m) + 1);
  ASSERT_TRUE(cg_state_layout(f.m, offs.data(), &layout_total));
  EXPECT_EQ(p.state_arena, layout_total);

  // Liveness: n matmul results of 16 KiB each, but at most the input, the
  // operand and the result of one matmul are live at once.
  int64_t all = 0;
  int temps = 0;
  for (int b = 0; b < prog->n_buffers; b++)
    if (prog->buffers[b].kind != CG_BUF_PARAM && prog->buffers[b].first_use >= 0) {
      all += prog->buffers[b].numel * 4;
      temps += prog->buffers[b].kind == CG_BUF_TEMP;
    }
  EXPECT_GE(temps, n);
  EXPECT_LT(p.work_arena, all);
  EXPECT_LE(p.work_live, 3 * 64 * 64 * 4 + 64);
  EXPECT_LE(p.work_live, p.work_arena);
  // Every value here feeds the loss: activations (the input among them).
  EXPECT_EQ(p.bytes[CG_MEM_ACTIVATIONS], p.work_live);
  EXPECT_EQ(p.bytes[CG_MEM_GRADS], 0);
  EXPECT_EQ(p.bytes[CG_MEM_COMM], 0);
  EXPECT_EQ(p.grads_held, 0);
}

int64_t fake_scratch(const cg_gemm *g) { return 1000 + g->m; }

TEST(MemPlan, GemmScratchIsWorkspaceAndPartOfThePeak) {
  Fixture f;
  dsc_graph *g = chain(f, 3);
  ASSERT_EQ(dsc_run_codegen_passes(f.m), DSC_OK) << diags(f.ctx);
  cg_memplan without, with;
  ASSERT_EQ(cg_memplan_graph(g, &f.a, nullptr, &without, nullptr), DSC_OK);
  cg_memplan_options o = {3, fake_scratch};
  ASSERT_EQ(cg_memplan_graph(g, &f.a, &o, &with, nullptr), DSC_OK);
  EXPECT_EQ(with.gemm_scratch, (1000 + 64) * 4 * 3 + 64);  // the largest, per thread, + alignment
  EXPECT_EQ(with.peak, without.peak + with.gemm_scratch);
  EXPECT_EQ(with.bytes[CG_MEM_WORKSPACE], without.bytes[CG_MEM_WORKSPACE] + with.gemm_scratch);
  EXPECT_EQ(sum_bytes(with), with.peak);
}

TEST(MemPlan, GradsAndCommAreClassified) {
  Fixture f;
  dsc_graph *g = dsc_graph_new(f.m, "step");
  ASSERT_EQ(dsc_module_add_param(f.m, "w", f32({64, 64}), {DSC_INIT_NORMAL, 0.1, 0, NULL}), DSC_OK);
  dsc_node *x = dsc_graph_input(g, "x", f32({64, 64}));
  dsc_node *w = dsc_param_ref(g, "w");
  dsc_node *h = dsc_matmul(g, x, w);   // forward
  dsc_node *gw = dsc_matmul(g, x, h);  // stands for a gradient
  dsc_attr at[3] = {dsc_attr_int("world", 2), dsc_attr_int("tag", 0),
                    dsc_attr_str("group", "world")};
  dsc_node *st = dsc_build(g, DSC_OP_ALL_REDUCE_START, &gw, 1, at, 3);
  dsc_node *wt = dsc_build(g, DSC_OP_ALL_REDUCE_WAIT, &st, 1, nullptr, 0);
  dsc_node *upd = dsc_matmul(g, wt, gw);  // reads both: all three live together
  ASSERT_NE(upd, nullptr) << diags(f.ctx);
  dsc_node *outs[2] = {h, upd};
  ASSERT_EQ(dsc_graph_set_outputs(g, outs, 2), DSC_OK);
  ASSERT_EQ(dsc_run_codegen_passes(f.m), DSC_OK) << diags(f.ctx);
  gw->role = IR_ROLE_GRAD;
  cg_memplan p;
  ASSERT_EQ(cg_memplan_graph(g, &f.a, nullptr, &p, nullptr), DSC_OK) << diags(f.ctx);
  const int64_t t = 64 * 64 * 4;
  EXPECT_EQ(sum_bytes(p), p.peak);
  EXPECT_EQ(p.bytes[CG_MEM_GRADS], t);  // gw: a grad although it is a collective's src
  EXPECT_EQ(p.bytes[CG_MEM_COMM], t);   // the all-reduce's result
  EXPECT_EQ(p.grads_held, t);
  // at the peak (the last matmul) x is dead; h (output 0, the "loss") is an
  // activation, upd workspace
  EXPECT_EQ(p.work_live, 4 * t);
  EXPECT_EQ(p.bytes[CG_MEM_ACTIVATIONS], t);
  EXPECT_GE(p.bytes[CG_MEM_WORKSPACE], t);
}

TEST(MemPlan, ShardsCountTheFullModelAndTheirPadding) {
  Fixture f;
  // w: 10 elements over 4 ranks -> shards of 3 (rank 3 holds 1 real, 2 zeros);
  // s: a state of 8 over 4 -> 2 each, no padding
  ASSERT_EQ(dsc_module_add_param(f.m, "w", f32({3}), {DSC_INIT_ZEROS, 0, 0, NULL}), DSC_OK);
  ASSERT_EQ(dsc_module_add_state(f.m, "s", f32({2}), {DSC_INIT_ZEROS, 0, 0, NULL}), DSC_OK);
  ASSERT_EQ(dsc_module_set_meta(f.m, "shard.w", "4 2x5"), DSC_OK);
  ASSERT_EQ(dsc_module_set_meta(f.m, "shard.s", "4 8"), DSC_OK);
  ASSERT_EQ(dsc_module_set_meta(f.m, "zero.world", "4"), DSC_OK);
  ASSERT_EQ(dsc_module_set_meta(f.m, "zero.stage", "3"), DSC_OK);
  EXPECT_EQ(cg_memplan_shard_padding(f.m, 0, false), 0);
  EXPECT_EQ(cg_memplan_shard_padding(f.m, 2, false), 0);
  EXPECT_EQ(cg_memplan_shard_padding(f.m, 3, false), 2 * 4);
  EXPECT_EQ(cg_memplan_shard_padding(f.m, 3, true), 0);

  dsc_graph *g = dsc_graph_new(f.m, "step");
  dsc_node *x = dsc_graph_input(g, "x", f32({3}));
  dsc_node *y = dsc_binary(g, DSC_OP_ADD, x, dsc_param_ref(g, "w"));
  ASSERT_EQ(dsc_graph_set_outputs(g, &y, 1), DSC_OK);
  ASSERT_EQ(dsc_run_codegen_passes(f.m), DSC_OK) << diags(f.ctx);
  cg_memplan p;
  ASSERT_EQ(cg_memplan_graph(g, &f.a, nullptr, &p, nullptr), DSC_OK) << diags(f.ctx);
  EXPECT_EQ(p.param_count, 10);  // Psi: the full model
  EXPECT_EQ(p.param_elems, 3);   // what this rank holds
  EXPECT_EQ(p.bytes[CG_MEM_PARAMS], 12);
  EXPECT_EQ(p.bytes[CG_MEM_OPTIMIZER], 8);
  EXPECT_TRUE(p.sharded);
  EXPECT_EQ(p.world, 4);
  EXPECT_EQ(p.stage, 3);
  EXPECT_EQ(sum_bytes(p), p.peak);
}

// The tiny GPT's training step: f32 AdamW model states are the formulas'
// (4 + 4 + 8) Psi (+ opt.step), everything adds up to the arenas.
TEST(MemPlan, TinyGptModelStatesMatchTheFormulas) {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  dsc_module *m = nullptr;
  dsc_dim_binding dims[2] = {{"B", 4}, {"T", 16}};
  dsc_frontend_options fo = {dims, 2, false};
  std::string path = std::string(DSC_SOURCE_DIR) + "/examples/gpt-tiny.dsm";
  ASSERT_EQ(dsc_compile_file(ctx, path.c_str(), &fo, &m), DSC_OK) << diags(ctx);
  dsc_train_config cfg;
  ASSERT_EQ(dsc_train_config_from_module(m, &cfg), DSC_OK);
  dsc_pipeline_options po = {&cfg, nullptr, false, nullptr, false};
  ASSERT_EQ(dsc_run_pipeline(m, &po), DSC_OK) << diags(ctx);
  ir_arena a;
  ir_arena_init(&a, ctx);
  cg_memplan p;
  ASSERT_EQ(cg_memplan_graph(dsc_module_find_graph(m, "train_step"), &a, nullptr, &p, nullptr),
            DSC_OK)
      << diags(ctx);
  const int64_t psi = 120576;
  EXPECT_EQ(p.param_count, psi);
  EXPECT_EQ(p.bytes[CG_MEM_PARAMS], 4 * psi);
  EXPECT_EQ(p.bytes[CG_MEM_OPTIMIZER], 8 * psi + 4);  // m, v, opt.step
  EXPECT_EQ(p.grads_held, 4 * psi);                   // every gradient, live at the update
  EXPECT_EQ(sum_bytes(p), p.peak);
  EXPECT_EQ(p.peak, p.state_arena + p.work_arena);
  EXPECT_GT(p.bytes[CG_MEM_ACTIVATIONS], 0);
  EXPECT_LT(p.padding, p.peak / 4);  // alignment and fragmentation stay small
  ir_arena_release(&a);
  dsc_module_free(m);
  dsc_context_free(ctx);
}

}  // namespace
