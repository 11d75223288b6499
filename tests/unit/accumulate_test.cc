// Gradient accumulation as a loop (passes/accumulate.c): graph micro_step run
// grad_accum K times, then train_step once. Its program does not grow with
// K, its memory plan counts the sums once, and its results equal one batch
// of the same rows (bitwise where the summation is exact).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "dsc/autocfg.h"
#include "dsc/dsc.h"
#include "tests/unit/test_util.h"

namespace {

const std::string kSrc = DSC_SOURCE_DIR;
const std::string kTiny = kSrc + "/examples/gpt-tiny.dsm";
const std::string kMlp = kSrc + "/examples/mlp.dsm";

struct Ctx {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  ~Ctx() { dsc_context_free(ctx); }
};

// mlp.dsm with micro-batch B through the pipeline up to `stop` (nullptr: all).
dsc_module *piped(dsc_context *ctx, int64_t B, int64_t K, const char *stop, int64_t world = 1,
                  int64_t stage = 0, bool each = true,
                  dsc_precision precision = DSC_PRECISION_F32) {
  dsc_dim_binding dims[1] = {{"B", B}};
  dsc_frontend_options fo = {dims, 1, false};
  dsc_module *m = nullptr;
  EXPECT_EQ(dsc_compile_file(ctx, kMlp.c_str(), &fo, &m), DSC_OK) << diags(ctx);
  if (!m) return nullptr;
  dsc_train_config cfg;
  EXPECT_EQ(dsc_train_config_from_module(m, &cfg), DSC_OK) << diags(ctx);
  cfg.grad_accum = K, cfg.world = world, cfg.zero.stage = stage;
  cfg.zero.reduce_each_micro_batch = each;
  cfg.clip = 1.0;
  cfg.precision = precision;
  dsc_pipeline_options po;
  memset(&po, 0, sizeof po);
  po.train = &cfg;
  po.stop_after = stop;
  po.verify_each = true;
  EXPECT_EQ(dsc_run_pipeline(m, &po), DSC_OK) << diags(ctx);
  return m;
}

int count_op(const dsc_graph *g, dsc_op op) {
  int n = 0;
  for (int i = 0; g && i < dsc_graph_node_count(g); i++)
    n += dsc_node_op(dsc_graph_node(g, i)) == op;
  return n;
}

TEST(AccumulatePass, TheProgramDoesNotGrowWithGradAccum) {
  Ctx c;
  dsc_module *one = piped(c.ctx, 4, 1, nullptr), *two = piped(c.ctx, 4, 2, nullptr),
             *many = piped(c.ctx, 4, 1024, nullptr);
  ASSERT_TRUE(one && two && many);
  EXPECT_EQ(dsc_module_find_graph(one, "micro_step"), nullptr);
  EXPECT_EQ(dsc_step_micro_batches(one), 1);
  EXPECT_EQ(dsc_step_micro_batches(many), 1024);
  for (const char *name : {"micro_step", "train_step"}) {
    const dsc_graph *a = dsc_module_find_graph(two, name), *b = dsc_module_find_graph(many, name);
    ASSERT_TRUE(a && b) << name;
    EXPECT_EQ(dsc_graph_node_count(a), dsc_graph_node_count(b)) << name;
  }
  // one accumulation state per trainable param and the loss
  int trainable = 0, acc = 0;
  for (int i = 0; i < dsc_module_param_count(two); i++) {
    trainable += !dsc_module_param_is_state(two, i);
    acc += std::strncmp(dsc_module_param_name(two, i), "acc.", 4) == 0;
  }
  EXPECT_EQ(acc, trainable + 1);
  // the forward runs once per micro-batch: as many matmuls as grad_accum 1's step
  EXPECT_EQ(count_op(dsc_module_find_graph(two, "micro_step"), DSC_OP_MATMUL),
            count_op(dsc_module_find_graph(one, "train_step"), DSC_OP_MATMUL));
  EXPECT_EQ(count_op(dsc_module_find_graph(two, "train_step"), DSC_OP_MATMUL), 0);
  dsc_module_free(one), dsc_module_free(two), dsc_module_free(many);
}

// bf16 with master weights: the bf16 gradients are summed in f32 states
// (one rounding per step, not one per micro-batch), and the optimizer part
// reads the f32 sums themselves, not a bf16 rounding of them.
TEST(AccumulatePass, Bf16GradientsAreSummedInF32) {
  Ctx c;
  for (int stage : {0, 2}) {
    dsc_module *m = piped(c.ctx, 4, 4, "accumulate", stage ? 2 : 1, stage, true,
                          DSC_PRECISION_BF16);
    ASSERT_NE(m, nullptr);
    int acc = 0;
    for (int i = 0; i < dsc_module_param_count(m); i++) {
      if (std::strncmp(dsc_module_param_name(m, i), "acc.", 4) != 0) continue;
      acc++;
      EXPECT_EQ(dsc_module_param_type(m, i).dtype, DSC_F32) << dsc_module_param_name(m, i);
    }
    EXPECT_GT(acc, 1);
    const dsc_graph *g = dsc_module_find_graph(m, "train_step");
    for (int i = 0; i < dsc_graph_node_count(g); i++) {
      const dsc_node *n = dsc_graph_node(g, i);
      if (dsc_node_op(n) != DSC_OP_CAST || dsc_node_type(n).dtype != DSC_F32) continue;
      const dsc_node *x = dsc_node_input(n, 0);
      // no f32 -> bf16 -> f32 round trip of a sum
      EXPECT_FALSE(dsc_node_op(x) == DSC_OP_CAST && dsc_node_op(dsc_node_input(x, 0)) == DSC_OP_PARAM)
          << "stage " << stage << " node " << i;
    }
    dsc_module_free(m);
  }
}

TEST(AccumulatePass, WhereTheRanksReduce) {
  Ctx c;
  // stage 2, each micro-batch: the reduce_scatters run in micro_step and the
  // sums are shard-sized
  dsc_module *each = piped(c.ctx, 4, 2, "accumulate", 2, 2, true);
  dsc_module *once = piped(c.ctx, 4, 2, "accumulate", 2, 2, false);
  dsc_module *zero0 = piped(c.ctx, 4, 2, "accumulate", 2, 0, true);
  ASSERT_TRUE(each && once && zero0);
  auto graph = [](dsc_module *m, const char *n) { return dsc_module_find_graph(m, n); };
  EXPECT_GT(count_op(graph(each, "micro_step"), DSC_OP_REDUCE_SCATTER_START), 0);
  EXPECT_EQ(count_op(graph(each, "train_step"), DSC_OP_REDUCE_SCATTER_START), 0);
  EXPECT_STREQ(dsc_module_get_meta(each, "accumulate.reduce"), "micro_batch");
  // once per step: the reduction moves to train_step, the sums are whole
  EXPECT_EQ(count_op(graph(once, "micro_step"), DSC_OP_REDUCE_SCATTER_START), 0);
  EXPECT_GT(count_op(graph(once, "train_step"), DSC_OP_REDUCE_SCATTER_START), 0);
  EXPECT_STREQ(dsc_module_get_meta(once, "accumulate.reduce"), "step");
  auto acc_numel = [](dsc_module *m) {
    int64_t n = 0;
    for (int i = 0; i < dsc_module_param_count(m); i++)
      if (std::strncmp(dsc_module_param_name(m, i), "acc.", 4) == 0) {
        dsc_type t = dsc_module_param_type(m, i);
        n += dsc_type_numel(&t);
      }
    return n;
  };
  EXPECT_LT(2 * acc_numel(each), acc_numel(once) + 2 * 64);  // halves, up to padding
  // stage 0 reduces once per step, as DeepSpeed does without ZeRO
  EXPECT_EQ(count_op(graph(zero0, "micro_step"), DSC_OP_ALL_REDUCE_START), 0);
  EXPECT_GT(count_op(graph(zero0, "train_step"), DSC_OP_ALL_REDUCE_START), 0);
  dsc_module_free(each), dsc_module_free(once), dsc_module_free(zero0);
}

// Two copies of the same micro-batch: g / 2 + g / 2 = g exactly, so the loop
// at grad_accum 2 gives grad_accum 1's step on one copy bit for bit, on the
// interpreter and on the compiled backend.
TEST(AccumulateStep, TwoEqualMicroBatchesGiveOneBatchsStepBitwise) {
  std::vector<dsc_backend> backends = {DSC_BACKEND_INTERP};
  if (dsc_backend_available(DSC_BACKEND_CPU)) backends.push_back(DSC_BACKEND_CPU);
  for (dsc_backend be : backends) {
    Ctx c;
    dsc_module *one = piped(c.ctx, 4, 1, be == DSC_BACKEND_INTERP ? "accumulate" : nullptr);
    dsc_module *two = piped(c.ctx, 4, 2, be == DSC_BACKEND_INTERP ? "accumulate" : nullptr);
    ASSERT_TRUE(one && two);
    dsc_exec_options eo;
    memset(&eo, 0, sizeof eo);
    eo.backend = be;
    eo.threads = 1;
    dsc_exec *x1 = nullptr, *x2 = nullptr;
    ASSERT_EQ(dsc_exec_new(one, &eo, &x1), DSC_OK) << diags(c.ctx);
    ASSERT_EQ(dsc_exec_new(two, &eo, &x2), DSC_OK) << diags(c.ctx);
    dsc_params *p1 = dsc_params_init(one, 3), *p2 = dsc_params_init(two, 3);
    ASSERT_EQ(dsc_exec_set_params(x1, p1), DSC_OK) << diags(c.ctx);
    ASSERT_EQ(dsc_exec_set_params(x2, p2), DSC_OK) << diags(c.ctx);
    std::mt19937_64 rng(5);
    std::normal_distribution<double> nd(0, 1);
    for (int step = 0; step < 3; step++) {
      int64_t d1[2] = {4, 32}, d2[2] = {8, 32}, l1[1] = {4}, l2[1] = {8};
      dsc_tensor *x_1 = dsc_tensor_new(c.ctx, dsc_type_make(DSC_F32, 2, d1));
      dsc_tensor *x_2 = dsc_tensor_new(c.ctx, dsc_type_make(DSC_F32, 2, d2));
      dsc_tensor *y_1 = dsc_tensor_new(c.ctx, dsc_type_make(DSC_I32, 1, l1));
      dsc_tensor *y_2 = dsc_tensor_new(c.ctx, dsc_type_make(DSC_I32, 1, l2));
      dsc_tensor *lr = dsc_tensor_new(c.ctx, dsc_type_make(DSC_F32, 0, nullptr));
      for (int i = 0; i < 4 * 32; i++)
        x_1->data[i] = x_2->data[i] = x_2->data[i + 4 * 32] = (double)(float)nd(rng);
      for (int i = 0; i < 4; i++) y_1->data[i] = y_2->data[i] = y_2->data[i + 4] = (double)(rng() % 10);
      lr->data[0] = (double)0.05f;
      const dsc_tensor *in1[3] = {x_1, y_1, lr}, *in2[3] = {x_2, y_2, lr};
      dsc_tensor *o1[2] = {nullptr, nullptr}, *o2[2] = {nullptr, nullptr};
      ASSERT_EQ(dsc_exec_run_step(x1, in1, 3, o1), DSC_OK) << diags(c.ctx);
      ASSERT_EQ(dsc_exec_run_step(x2, in2, 3, o2), DSC_OK) << diags(c.ctx);
      EXPECT_EQ(o1[0]->data[0], o2[0]->data[0]) << "loss, step " << step;
      EXPECT_EQ(o1[1]->data[0], o2[1]->data[0]) << "grad_norm, step " << step;
      for (auto *t : {o1[0], o1[1], o2[0], o2[1], x_1, x_2, y_1, y_2, lr}) dsc_tensor_free(c.ctx, t);
    }
    ASSERT_EQ(dsc_exec_get_params(x1, p1), DSC_OK);
    ASSERT_EQ(dsc_exec_get_params(x2, p2), DSC_OK);
    for (int i = 0; i < dsc_module_param_count(one); i++) {
      const char *name = dsc_module_param_name(one, i);
      dsc_tensor *a = dsc_params_find(p1, name), *b = dsc_params_find(p2, name);
      ASSERT_TRUE(a && b) << name;
      int64_t n = dsc_type_numel(&a->type);
      EXPECT_EQ(std::memcmp(a->data, b->data, sizeof(double) * (size_t)n), 0)
          << name << " on " << dsc_backend_name(be);
    }
    // wrong step inputs: an error naming the input and the rows expected
    {
      int64_t d[2] = {6, 32};
      dsc_tensor *bad = dsc_tensor_new(c.ctx, dsc_type_make(DSC_F32, 2, d));
      dsc_tensor *lab = dsc_tensor_new(c.ctx, dsc_type_make(DSC_I32, 1, d));
      dsc_tensor *lr = dsc_tensor_new(c.ctx, dsc_type_make(DSC_F32, 0, nullptr));
      const dsc_tensor *in[3] = {bad, lab, lr};
      dsc_tensor *o[2] = {nullptr, nullptr};
      EXPECT_EQ(dsc_exec_run_step(x2, in, 3, o), DSC_ERR_USER);
      EXPECT_NE(diags(c.ctx).find("input 0 ('x') is f32[6,32], expected f32[8,32] (grad_accum 2 "
                                  "micro-batches of 4 rows)"),
                std::string::npos)
          << diags(c.ctx);
      for (auto *t : {bad, lab, lr}) dsc_tensor_free(c.ctx, t);
    }
    dsc_params_free(p1), dsc_params_free(p2);
    dsc_exec_free(x1), dsc_exec_free(x2);
    dsc_module_free(one), dsc_module_free(two);
  }
}

// The memory plan: the sums once, the same peak at any grad_accum.
TEST(AccumulatePlan, ThePeakDoesNotGrowWithGradAccum) {
  Ctx c;
  std::string path = kTiny;
  dsc_memory_plan p2{}, p64{}, p1{};
  for (auto [K, out] : {std::pair<int64_t, dsc_memory_plan *>{1, &p1}, {2, &p2}, {64, &p64}}) {
    dsc_plan_options o{};
    o.model_path = path.c_str();
    o.world = 1;
    o.batch = 2, o.seq = 16, o.grad_accum = K;
    o.threads = 1;
    ASSERT_EQ(dsc_plan_memory(c.ctx, &o, out), DSC_OK) << diags(c.ctx);
  }
  EXPECT_EQ(p2.rank.peak, p64.rank.peak);
  EXPECT_EQ(p2.rank.grads, p64.rank.grads);
  EXPECT_EQ(p2.grads_held, p64.grads_held);
  EXPECT_EQ(p64.grad_accum, 64);
  // the sums are f32 grads of every param, held through the step
  EXPECT_GE(p2.grads_held, 4 * p2.param_count);
  EXPECT_GE(p2.rank.grads, 4 * p2.param_count);
  EXPECT_EQ(p2.rank.params, p1.rank.params);
  EXPECT_EQ(p2.rank.optimizer, p1.rank.optimizer);
}

}  // namespace
