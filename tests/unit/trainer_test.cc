// The trainer library (include/dsc/trainer.h): model facts (vocab, context,
// logits graph), sampling, and the loop's state (steps, stop, checkpoints).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "dsc/dsc.h"
#include "runtime_test_util.h"
#include "tests/unit/test_util.h"

namespace {

const std::string kTiny = std::string(DSC_SOURCE_DIR) + "/examples/gpt-tiny.dsm";

struct Ctx {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  ~Ctx() { dsc_context_free(ctx); }
  std::string diags() const { return ::diags(ctx); }
};

dsc_module *compile_tiny(dsc_context *ctx, int64_t B, int64_t T) {
  dsc_dim_binding dims[2] = {{"B", B}, {"T", T}};
  dsc_frontend_options fo = {dims, 2, false};
  dsc_module *m = nullptr;
  EXPECT_EQ(dsc_compile_file(ctx, kTiny.c_str(), &fo, &m), DSC_OK);
  return m;
}

TEST(TrainerModel, VocabAndContextOfGptTiny) {
  Ctx c;
  dsc_module *m = compile_tiny(c.ctx, 2, 8);
  ASSERT_NE(m, nullptr);
  const dsc_graph *g = dsc_module_find_graph(m, "forward");
  EXPECT_EQ(dsc_model_vocab(g), 256);   // wte rows (and the logits' classes)
  EXPECT_EQ(dsc_model_context(g), 64);  // wpe rows: ctx = 64, not T = 8
  dsc_module_free(m);
}

TEST(TrainerModel, VocabFromCrossEntropyAloneAndNone) {
  Ctx c;
  dsc_module *m = dsc_module_new(c.ctx, "m");
  dsc_graph *g = dsc_graph_new(m, "forward");
  int64_t ld[3] = {2, 3, 7}, td[2] = {2, 3};
  dsc_node *logits = dsc_graph_input(g, "logits", dsc_type_make(DSC_F32, 3, ld));
  dsc_node *tg = dsc_graph_input(g, "targets", dsc_type_make(DSC_I32, 2, td));
  dsc_node *in[2] = {logits, tg};
  dsc_node *ce = dsc_build(g, DSC_OP_CROSS_ENTROPY, in, 2, nullptr, 0);
  ASSERT_NE(ce, nullptr);
  ASSERT_EQ(dsc_graph_set_outputs(g, &ce, 1), DSC_OK);
  EXPECT_EQ(dsc_model_vocab(g), 7);
  EXPECT_EQ(dsc_model_context(g), -1);

  dsc_graph *h = dsc_graph_new(m, "plain");
  dsc_node *x = dsc_graph_input(h, "x", dsc_type_make(DSC_F32, 2, td));
  dsc_node *y = dsc_unary(h, DSC_OP_RELU, x);
  ASSERT_EQ(dsc_graph_set_outputs(h, &y, 1), DSC_OK);
  EXPECT_EQ(dsc_model_vocab(h), -1);
  EXPECT_EQ(dsc_make_logits_graph(h), DSC_ERR_USER);
  EXPECT_NE(c.diags().find("does not end in cross_entropy"), std::string::npos) << c.diags();
  dsc_module_free(m);
}

TEST(TrainerModel, LogitsGraphReturnsTheCrossEntropyInput) {
  Ctx c;
  dsc_module *m = compile_tiny(c.ctx, 1, 5);
  ASSERT_NE(m, nullptr);
  dsc_graph *g = dsc_module_find_graph(m, "forward");
  ASSERT_EQ(dsc_make_logits_graph(g), DSC_OK);
  ASSERT_EQ(dsc_graph_output_count(g), 1);
  dsc_type t = dsc_node_type(dsc_graph_output_at(g, 0));
  ASSERT_EQ(t.rank, 3);
  EXPECT_EQ(t.dims[0], 1);
  EXPECT_EQ(t.dims[1], 5);
  EXPECT_EQ(t.dims[2], 256);
  // Causality: the logits at position 1 do not depend on tokens after it.
  dsc_params *p = dsc_params_init(m, 3);
  dsc_tensor *tok = dsc_tensor_new(c.ctx, dsc_node_type(dsc_graph_input_at(g, 0)));
  dsc_tensor *tgt = dsc_tensor_new(c.ctx, dsc_node_type(dsc_graph_input_at(g, 1)));
  double a[5] = {10, 20, 0, 0, 0}, b[5] = {10, 20, 99, 7, 200};
  std::vector<double> first;
  for (double *toks : {a, b}) {
    for (int i = 0; i < 5; i++) tok->data[i] = toks[i];
    const dsc_tensor *ins[2] = {tok, tgt};
    dsc_tensor *out = nullptr;
    ASSERT_EQ(dsc_interp_run(g, p, ins, 2, &out), DSC_OK) << c.diags();
    std::vector<double> row(out->data + 256, out->data + 512);
    if (first.empty())
      first = row;
    else
      EXPECT_EQ(row, first);  // exact: the same arithmetic on the same values
    dsc_tensor_free(c.ctx, out);
  }
  dsc_tensor_free(c.ctx, tok);
  dsc_tensor_free(c.ctx, tgt);
  dsc_params_free(p);
  dsc_module_free(m);
}

static int64_t sample(const double *l, int64_t V, double temperature, int64_t top_k,
                      uint64_t rng[4], double top_p = 1.0) {
  dsc_sampling how = {temperature, top_k, top_p};
  return dsc_sample_logits(l, V, &how, rng);
}

TEST(TrainerSample, GreedyAndTopOneTakeTheFirstMaximum) {
  double l[6] = {0.5, 2.0, -1.0, 2.0, 1.9, 0.0};
  uint64_t rng[4] = {1, 2, 3, 4}, keep[4] = {1, 2, 3, 4};
  EXPECT_EQ(sample(l, 6, 0.0, 0, rng), 1);
  EXPECT_EQ(sample(l, 6, 5.0, 1, rng), 1);
  EXPECT_EQ(0, memcmp(rng, keep, sizeof rng));  // greedy draws nothing
}

TEST(TrainerSample, FrequenciesFollowTheSoftmaxAndTopK) {
  // p proportional to 1, 2, 4, 8 at temperature 1 (logits log 1..log 8).
  double l[4] = {0, std::log(2.0), std::log(4.0), std::log(8.0)};
  uint64_t rng[4] = {0x9e3779b97f4a7c15ULL, 7, 11, 13};
  const int n = 30000;
  int count[4] = {0, 0, 0, 0};
  for (int i = 0; i < n; i++) count[sample(l, 4, 1.0, 0, rng)]++;
  for (int k = 0; k < 4; k++)  // tolerance: > 5 standard deviations of the count
    EXPECT_NEAR(count[k] / (double)n, (1 << k) / 15.0, 0.015) << k;
  // top-k 2: only the two largest, in ratio 4 : 8
  int c2[4] = {0, 0, 0, 0};
  for (int i = 0; i < n; i++) c2[sample(l, 4, 1.0, 2, rng)]++;
  EXPECT_EQ(c2[0] + c2[1], 0);
  EXPECT_NEAR(c2[3] / (double)n, 2.0 / 3.0, 0.015);
  // temperature 0.5 squares the ratios: 1, 4, 16, 64 (of 85)
  int c3[4] = {0, 0, 0, 0};
  for (int i = 0; i < n; i++) c3[sample(l, 4, 0.5, 0, rng)]++;
  EXPECT_NEAR(c3[3] / (double)n, 64.0 / 85.0, 0.015);
  // the same state draws the same sequence
  uint64_t r1[4] = {5, 6, 7, 8}, r2[4] = {5, 6, 7, 8};
  for (int i = 0; i < 100; i++) EXPECT_EQ(sample(l, 4, 1.0, 3, r1), sample(l, 4, 1.0, 3, r2));
}

TEST(TrainerSample, TopPKeepsTheFewestThatReachP) {
  // p = 1, 2, 4, 8 (of 15): top-p 0.5 keeps {8} (8/15 >= 0.5), 0.6 keeps
  // {8, 4} (12/15), 0.85 keeps {8, 4, 2} (14/15); 1.0 keeps all
  double l[4] = {0, std::log(2.0), std::log(4.0), std::log(8.0)};
  uint64_t rng[4] = {3, 1, 4, 1};
  const int n = 30000;
  int c[4] = {0, 0, 0, 0};
  for (int i = 0; i < 500; i++) EXPECT_EQ(sample(l, 4, 1.0, 0, rng, 0.5), 3);
  for (int i = 0; i < n; i++) c[sample(l, 4, 1.0, 0, rng, 0.6)]++;
  EXPECT_EQ(c[0] + c[1], 0);
  EXPECT_NEAR(c[3] / (double)n, 2.0 / 3.0, 0.015);
  int c2[4] = {0, 0, 0, 0};
  for (int i = 0; i < n; i++) c2[sample(l, 4, 1.0, 0, rng, 0.85)]++;
  EXPECT_EQ(c2[0], 0);
  EXPECT_NEAR(c2[1] / (double)n, 2.0 / 14.0, 0.015);
  // after top-k 3 (2, 4, 8 of 14), 0.8 keeps {8, 4} (12/14)
  int c3[4] = {0, 0, 0, 0};
  for (int i = 0; i < n; i++) c3[sample(l, 4, 1.0, 3, rng, 0.8)]++;
  EXPECT_EQ(c3[0] + c3[1], 0);
  // temperature first: at 0.5 the probabilities are 1, 4, 16, 64 (of 85),
  // so top-p 0.7 keeps {64} alone
  for (int i = 0; i < 500; i++) EXPECT_EQ(sample(l, 4, 0.5, 0, rng, 0.7), 3);
  // top-p 1 draws what no top-p draws, from the same state
  uint64_t r1[4] = {5, 6, 7, 8}, r2[4] = {5, 6, 7, 8};
  for (int i = 0; i < 100; i++) EXPECT_EQ(sample(l, 4, 1.0, 0, r1, 1.0), sample(l, 4, 1.0, 0, r2));
}

TEST(TrainerSample, TopKTiesAreTakenInIndexOrder) {
  double l[5] = {1, 3, 3, 3, 0};
  uint64_t rng[4] = {1, 2, 3, 4};
  for (int i = 0; i < 2000; i++) {
    int64_t t = sample(l, 5, 1.0, 2, rng);
    EXPECT_TRUE(t == 1 || t == 2) << t;
  }
}

// A token shard of a repeating pattern, ids below 256.
std::string write_shard(const rt_test::TempDir &d, const std::string &name, int64_t n, int mod) {
  Ctx c;
  std::vector<uint16_t> toks(n);
  for (int64_t i = 0; i < n; i++) toks[i] = (uint16_t)((i * 7 + i / 13) % mod);
  std::string path = d / name;
  EXPECT_EQ(dsc_shard_write(c.ctx, path.c_str(), toks.data(), n), DSC_OK) << c.diags();
  return path;
}

dsc_trainer_options small_opts(const std::string &prefix, const std::string &out) {
  dsc_trainer_options o;
  memset(&o, 0, sizeof o);
  o.model_path = kTiny.c_str();
  o.data_prefix = strdup(prefix.c_str());
  o.out_dir = out.empty() ? nullptr : strdup(out.c_str());
  o.batch = 2, o.seq = 8, o.steps = 4;
  o.save_every = -1;
  o.eval_every = 0; // never (the model's train section asks for every 50 steps)
  return o;
}
void free_opts(dsc_trainer_options &o) {
  free((void *)o.data_prefix);
  free((void *)o.out_dir);
}

bool stop_after_two(void *ud, const dsc_train_progress *p) {
  (*(int *)ud)++;
  return p->step < 2;
}

TEST(TrainerLoop, StepsUpdateParamsAndStopSavesTheStepReached) {
  rt_test::TempDir d;
  write_shard(d, "t_train.bin", 600, 256);
  write_shard(d, "t_val.bin", 100, 256);
  Ctx c;
  dsc_trainer_options o = small_opts(d / "t", d / "out");
  dsc_trainer *t = nullptr;
  ASSERT_EQ(dsc_trainer_open(c.ctx, &o, &t), DSC_OK) << c.diags();
  const dsc_trainer_info *info = dsc_trainer_get_info(t);
  EXPECT_EQ(info->vocab, 256);
  EXPECT_EQ(info->n_params, 120576);
  EXPECT_GT(info->n_state, 2 * 120576 - 1);  // adamw: two moments per param (+ step)
  EXPECT_EQ(info->train_tokens, 600);
  ASSERT_NE(info->data_val, nullptr);
  double before = dsc_params_find(dsc_trainer_params(t), "wte")->data[5];
  double v0;
  ASSERT_EQ(dsc_trainer_evaluate(t, &v0), DSC_OK);
  EXPECT_NEAR(v0, std::log(256.0), 0.1);  // near-uniform predictions at init

  int calls = 0;
  dsc_train_summary sum;
  ASSERT_EQ(dsc_trainer_run(t, nullptr, stop_after_two, &calls, &sum), DSC_OK) << c.diags();
  EXPECT_EQ(calls, 2);
  EXPECT_TRUE(sum.stopped);
  EXPECT_EQ(sum.steps_done, 2);
  EXPECT_NE(dsc_params_find(dsc_trainer_params(t), "wte")->data[5], before);
  ASSERT_NE(sum.last_checkpoint, nullptr);
  EXPECT_EQ(std::string(sum.last_checkpoint), d / "out/step-000002");
  // the evaluation is a pure function of the params: twice the same value
  double v1, v2;
  ASSERT_EQ(dsc_trainer_evaluate(t, &v1), DSC_OK);
  ASSERT_EQ(dsc_trainer_evaluate(t, &v2), DSC_OK);
  EXPECT_EQ(v1, v2);
  dsc_trainer_free(t);

  // A stop flag already set: no step, the resumed state is saved as it was.
  o.resume = strdup((d / "out").c_str());
  ASSERT_EQ(dsc_trainer_open(c.ctx, &o, &t), DSC_OK) << c.diags();
  EXPECT_EQ(dsc_trainer_get_info(t)->start_step, 2);
  volatile sig_atomic_t stop = 1;
  ASSERT_EQ(dsc_trainer_run(t, &stop, nullptr, nullptr, &sum), DSC_OK);
  EXPECT_TRUE(sum.stopped);
  EXPECT_EQ(sum.steps_run, 0);
  EXPECT_EQ(sum.last_checkpoint, nullptr);  // nothing new to save
  stop = 0;
  ASSERT_EQ(dsc_trainer_run(t, &stop, nullptr, nullptr, &sum), DSC_OK);
  EXPECT_EQ(sum.steps_done, 4);
  EXPECT_FALSE(sum.stopped);
  EXPECT_TRUE(std::isfinite(sum.final_loss));
  EXPECT_TRUE(std::isnan(sum.best_val_loss));  // eval_every 0: never
  dsc_trainer_free(t);
  free((void *)o.resume);
  free_opts(o);
}

TEST(TrainerLoop, RejectsIdsOutsideTheVocabularyAndWritesNothing) {
  rt_test::TempDir d;
  write_shard(d, "big_train.bin", 600, 300);
  Ctx c;
  dsc_trainer_options o = small_opts(d / "big", d / "out");
  dsc_trainer *t = nullptr;
  EXPECT_EQ(dsc_trainer_open(c.ctx, &o, &t), DSC_ERR_USER);
  EXPECT_EQ(t, nullptr);
  EXPECT_NE(c.diags().find("outside the vocabulary (size 256)"), std::string::npos) << c.diags();
  struct stat sb;
  EXPECT_NE(stat((d / "out").c_str(), &sb), 0);
  free_opts(o);
}

TEST(TrainerLoop, NotATokenModel) {
  rt_test::TempDir d;
  write_shard(d, "t_train.bin", 600, 256);
  Ctx c;
  dsc_trainer_options o = small_opts(d / "t", "");
  std::string mlp = std::string(DSC_SOURCE_DIR) + "/examples/mlp.dsm";
  o.model_path = mlp.c_str();
  dsc_trainer *t = nullptr;
  EXPECT_EQ(dsc_trainer_open(c.ctx, &o, &t), DSC_ERR_USER);
  EXPECT_NE(c.diags().find("needs a token model"), std::string::npos) << c.diags();
  free_opts(o);
}

}  // namespace
