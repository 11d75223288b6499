// Data parallelism at ZeRO stage 0 (passes/zero.c, the trainer's ranks):
// the pass's rewrite of train_step, its settings, and the equivalence of
// training at world 1, 2 and 4 with the same global batch.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "dsc/dsc.h"
#include "ir/ir.h"
#include "runtime_test_util.h"
#include "tests/unit/test_util.h"

namespace {

const std::string kSrc = DSC_SOURCE_DIR;
const std::string kTiny = kSrc + "/examples/gpt-tiny.dsm";
const std::string kMlp = kSrc + "/examples/mlp.dsm";

struct Ctx {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  ~Ctx() { dsc_context_free(ctx); }
  std::string diags() const { return ::diags(ctx); }
};

dsc_module *compile(dsc_context *ctx, const std::string &path, int64_t B) {
  dsc_dim_binding dims[2] = {{"B", B}, {"T", 8}};
  dsc_frontend_options fo = {dims, 2, false};
  dsc_module *m = nullptr;
  EXPECT_EQ(dsc_compile_file(ctx, path.c_str(), &fo, &m), DSC_OK);
  return m;
}

int count_op(const dsc_graph *g, dsc_op op) {
  int n = 0;
  for (int i = 0; i < dsc_graph_node_count(g); i++) n += dsc_node_op(dsc_graph_node(g, i)) == op;
  return n;
}

int trainable(const dsc_module *m) {
  int n = 0;
  for (int i = 0; i < dsc_module_param_count(m); i++) n += !dsc_module_param_is_state(m, i);
  return n;
}

// The mlp example through the pipeline up to "zero" at world N, stage S.
struct Piped {
  Ctx c;
  dsc_module *m = nullptr;
  dsc_status st = DSC_ERR_INTERNAL;
  Piped(int64_t world, int64_t stage, const char *stop = "zero",
        dsc_precision prec = DSC_PRECISION_F32, int64_t bucket = -1, int64_t prefetch = -1,
        int64_t unshard = -1) {
    m = compile(c.ctx, kMlp, 4);
    if (!m) return;
    dsc_train_config cfg;
    EXPECT_EQ(dsc_train_config_from_module(m, &cfg), DSC_OK) << c.diags();
    cfg.grad_accum = 2, cfg.clip = 1.0, cfg.world = world, cfg.zero.stage = stage;
    cfg.precision = prec;
    if (bucket >= 0) cfg.zero.bucket_bytes = bucket;
    if (prefetch >= 0) cfg.zero.prefetch_bytes = prefetch;
    if (unshard >= 0) cfg.zero.unshard_bytes = unshard;
    dsc_pipeline_options po;
    memset(&po, 0, sizeof po);
    po.train = &cfg;
    po.stop_after = stop;
    po.verify_each = true;
    st = dsc_run_pipeline(m, &po);
  }
  ~Piped() { dsc_module_free(m); }
  dsc_graph *step() { return dsc_module_find_graph(m, "train_step"); }
  dsc_graph *micro() { return dsc_module_find_graph(m, "micro_step"); }
};

TEST(ZeroPass, IsARowOfThePipelineRightAfterOptimizer) {
  int opt = -1, zero = -1;
  for (int i = 0; i < dsc_pass_count(); i++) {
    if (std::string(dsc_pass_name(i)) == "optimizer") opt = i;
    if (std::string(dsc_pass_name(i)) == "zero") zero = i;
  }
  ASSERT_GE(opt, 0);
  EXPECT_EQ(zero, opt + 1);
}

TEST(ZeroPass, WorldOneChangesNothing) {
  Piped a(1, 0, "optimizer"), b(1, 0, "zero"), c(1, 3, "zero");  // any stage at world 1
  ASSERT_EQ(a.st, DSC_OK) << a.c.diags();
  ASSERT_EQ(b.st, DSC_OK) << b.c.diags();
  ASSERT_EQ(c.st, DSC_OK) << c.c.diags();
  EXPECT_EQ(dsc_graph_node_count(a.step()), dsc_graph_node_count(b.step()));
  EXPECT_EQ(dsc_graph_node_count(a.step()), dsc_graph_node_count(c.step()));
  EXPECT_EQ(count_op(b.step(), DSC_OP_ALL_REDUCE_START), 0);
}

TEST(ZeroPass, StageZeroAllReducesEachGradientBeforeTheNormAndTheLoss) {
  Piped p(2, 0);
  ASSERT_EQ(p.st, DSC_OK) << p.c.diags();
  dsc_graph *g = p.step();
  int n = trainable(p.m);
  ASSERT_EQ(n, 6);
  EXPECT_EQ(count_op(g, DSC_OP_ALL_REDUCE_START), n + 1);  // one per param + the loss
  EXPECT_EQ(count_op(g, DSC_OP_ALL_REDUCE_WAIT), n + 1);
  for (int i = 0; i < dsc_graph_node_count(g); i++) {
    const dsc_node *nd = dsc_graph_node(g, i);
    if (dsc_node_op(nd) != DSC_OP_ALL_REDUCE_START) continue;
    EXPECT_EQ(dsc_node_attr(nd, "world")->u.i, 2);
    EXPECT_EQ(dsc_node_attr(nd, "tag")->u.i, 0);
  }
  // loss = wait * 0.5
  const dsc_node *loss = dsc_graph_output_at(g, 0);
  ASSERT_EQ(dsc_node_op(loss), DSC_OP_MUL);
  EXPECT_EQ(dsc_node_op(dsc_node_input(loss, 0)), DSC_OP_ALL_REDUCE_WAIT);
  // grad_norm = sqrt(sum of sum(x * x)): every x is a mean over ranks
  const dsc_node *s = dsc_node_input(dsc_graph_output_at(g, 1), 0);
  int terms = 0;
  for (;;) {
    const dsc_node *t = s;
    if (dsc_node_op(s) == DSC_OP_ADD) t = dsc_node_input(s, 1);
    const dsc_node *sq = dsc_node_input(t, 0);  // sum(x * x)
    ASSERT_EQ(dsc_node_op(sq), DSC_OP_MUL);
    const dsc_node *x = dsc_node_input(sq, 0);
    ASSERT_EQ(dsc_node_op(x), DSC_OP_MUL);
    EXPECT_EQ(dsc_node_op(dsc_node_input(x, 0)), DSC_OP_ALL_REDUCE_WAIT);
    terms++;
    if (dsc_node_op(s) != DSC_OP_ADD) break;
    s = dsc_node_input(s, 0);
  }
  EXPECT_EQ(terms, n);
  // the rewritten graph prints and parses back byte for byte
  char *text = nullptr;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  ASSERT_EQ(dsc_module_print(p.m, f), DSC_OK);
  fclose(f);
  dsc_module *back = nullptr;
  ASSERT_EQ(dsc_module_parse(p.c.ctx, text, len, "zero.dsir", &back), DSC_OK) << p.c.diags();
  char *text2 = nullptr;
  size_t len2 = 0;
  f = open_memstream(&text2, &len2);
  ASSERT_EQ(dsc_module_print(back, f), DSC_OK);
  fclose(f);
  EXPECT_EQ(std::string(text, len), std::string(text2, len2));
  free(text);
  free(text2);
  dsc_module_free(back);
}

TEST(ZeroPass, TheWholePipelineAndFp16KeepTheIRValid) {
  Piped full(4, 0, nullptr);  // through decompose, cse, fuse
  EXPECT_EQ(full.st, DSC_OK) << full.c.diags();
  Piped fp16(2, 0, "zero", DSC_PRECISION_FP16);
  ASSERT_EQ(fp16.st, DSC_OK) << fp16.c.diags();
  EXPECT_EQ(count_op(fp16.step(), DSC_OP_ALL_REDUCE_START), trainable(fp16.m) + 1);
}

// numel of param/state `name`'s module type
int64_t param_numel(const dsc_module *m, const char *name) {
  int i = dsc_module_find_param(m, name);
  if (i < 0) return -1;
  dsc_type t = dsc_module_param_type(m, i);
  return dsc_type_numel(&t);
}

std::string printed(const dsc_module *m) {
  char *text = nullptr;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  EXPECT_EQ(dsc_module_print(m, f), DSC_OK);
  fclose(f);
  std::string s(text, len);
  free(text);
  return s;
}

// Every trainable param's optimizer state (the mlp example trains with SGD
// and momentum) is sharded: [ceil(numel / N)], with "shard.<name>" giving
// the full shape back.
void expect_sharded_states(const dsc_module *m, int64_t world, bool params_too) {
  for (int i = 0; i < dsc_module_param_count(m); i++) {
    if (dsc_module_param_is_state(m, i)) continue;
    std::string n = dsc_module_param_name(m, i);
    dsc_type full;
    int64_t w = 0;
    int sh = dsc_module_param_shard(m, i, &full, &w);
    EXPECT_EQ(sh, params_too ? 1 : 0) << n;
    int64_t numel = dsc_type_numel(&full), s = (numel + world - 1) / world;
    EXPECT_EQ(param_numel(m, ("opt.momentum." + n).c_str()), s) << n;
    EXPECT_EQ(param_numel(m, n.c_str()), params_too ? s : numel) << n;
    int j = dsc_module_find_param(m, ("opt.momentum." + n).c_str());
    EXPECT_EQ(dsc_module_param_shard(m, j, &full, &w), 1);
    EXPECT_EQ(w, world);
    EXPECT_EQ(dsc_type_numel(&full), numel);
  }
  EXPECT_EQ(param_numel(m, "opt.step"), 1);  // scalars stay whole
  EXPECT_STREQ(dsc_module_get_meta(m, "zero.world"), std::to_string(world).c_str());
}

TEST(ZeroPass, StageOneShardsTheOptimizerStatesAndGathersTheParams) {
  Piped p(3, 1);  // world 3: most sizes need padding
  ASSERT_EQ(p.st, DSC_OK) << p.c.diags();
  dsc_graph *g = p.step();
  int n = trainable(p.m);
  expect_sharded_states(p.m, 3, false);
  EXPECT_EQ(count_op(g, DSC_OP_ALL_REDUCE_START), n + 1);  // gradients + loss, as stage 0
  EXPECT_EQ(count_op(g, DSC_OP_REDUCE_SCATTER_START), 0);
  EXPECT_EQ(count_op(g, DSC_OP_ALL_GATHER_START), n);      // each updated param chunk
  EXPECT_EQ(count_op(g, DSC_OP_LOCAL_SHARD), 2 * n);       // each param's and gradient's chunk
  EXPECT_STREQ(dsc_module_get_meta(p.m, "zero.stage"), "1");
}

TEST(ZeroPass, StageTwoReduceScattersGradientsAndSumsTheNormOnce) {
  Piped p(2, 2);
  ASSERT_EQ(p.st, DSC_OK) << p.c.diags();
  dsc_graph *g = p.step();
  int n = trainable(p.m);
  expect_sharded_states(p.m, 2, false);
  EXPECT_EQ(count_op(g, DSC_OP_REDUCE_SCATTER_START), n);
  // the loss and one scalar for the global norm (partial sums of squares)
  EXPECT_EQ(count_op(g, DSC_OP_ALL_REDUCE_START), 2);
  EXPECT_EQ(count_op(g, DSC_OP_ALL_GATHER_START), n);
  EXPECT_EQ(count_op(g, DSC_OP_LOCAL_SHARD), n);  // the params' chunks
  const dsc_node *norm = dsc_graph_output_at(g, 1);
  ASSERT_EQ(dsc_node_op(norm), DSC_OP_SQRT);
  EXPECT_EQ(dsc_node_op(dsc_node_input(norm, 0)), DSC_OP_ALL_REDUCE_WAIT);
}

TEST(ZeroPass, StageThreeShardsParamsAndGathersThemForForwardAndBackward) {
  Piped p(2, 3);
  ASSERT_EQ(p.st, DSC_OK) << p.c.diags();
  dsc_graph *g = p.step();
  int n = trainable(p.m);
  expect_sharded_states(p.m, 2, true);
  EXPECT_EQ(count_op(g, DSC_OP_REDUCE_SCATTER_START), n);
  EXPECT_EQ(count_op(g, DSC_OP_LOCAL_SHARD), 0);  // nothing whole is left to cut
  // one micro-batch (pass accumulate loops over grad_accum 2 of them later):
  // a forward and a backward gather of each weight the backward reads
  // (biases' gradients do not need them)
  int gathers = count_op(g, DSC_OP_ALL_GATHER_START);
  EXPECT_GE(gathers, n);
  EXPECT_LE(gathers, 2 * n);
  // the gathered values are read only by the forward and backward passes
  for (int i = 0; i < dsc_graph_node_count(g); i++) {
    const dsc_node *nd = dsc_graph_node(g, i);
    if (dsc_node_op(nd) != DSC_OP_ASSIGN) continue;
    EXPECT_NE(dsc_node_op(dsc_node_input(nd, 0)), DSC_OP_ALL_GATHER_WAIT);
  }
  // the sharded module prints and parses back byte for byte (meta included)
  std::string text = printed(p.m);
  EXPECT_NE(text.find("shard."), std::string::npos);
  dsc_module *back = nullptr;
  ASSERT_EQ(dsc_module_parse(p.c.ctx, text.data(), text.size(), "z3.dsir", &back), DSC_OK)
      << p.c.diags();
  EXPECT_EQ(printed(back), text);
  dsc_module_free(back);
}

int first_pos(dsc_graph *g, dsc_op op, bool last = false) {
  int r = -1;
  for (int i = 0; i < dsc_graph_node_count(g); i++)
    if (dsc_node_op(dsc_graph_node(g, i)) == op && (r < 0 || last)) r = i;
  return r;
}

TEST(SchedulePass, BucketsMergeReduceScattersAndZeroBytesKeepsOnePerGradient) {
  int n;
  {
    Piped one(2, 2, "schedule", DSC_PRECISION_F32, 0);
    ASSERT_EQ(one.st, DSC_OK) << one.c.diags();
    n = trainable(one.m);
    EXPECT_EQ(count_op(one.step(), DSC_OP_REDUCE_SCATTER_START), n);
  }
  Piped all(2, 2, "schedule", DSC_PRECISION_F32, int64_t(1) << 30);
  ASSERT_EQ(all.st, DSC_OK) << all.c.diags();
  EXPECT_EQ(count_op(all.step(), DSC_OP_REDUCE_SCATTER_START), 1);
  // a budget of one byte cannot merge anything; the whole pipeline still
  // runs, and each micro-batch reduce-scatters its gradients (stage 3)
  Piped tiny(2, 3, nullptr, DSC_PRECISION_F32, 1);
  ASSERT_EQ(tiny.st, DSC_OK) << tiny.c.diags();
  EXPECT_EQ(count_op(tiny.micro(), DSC_OP_REDUCE_SCATTER_START), n);
  EXPECT_EQ(count_op(tiny.step(), DSC_OP_REDUCE_SCATTER_START), 0);
}

TEST(SchedulePass, PrefetchStartsGathersAheadWithinTheBudget) {
  // no budget: every gather starts right before its wait
  Piped late(2, 3, "schedule", DSC_PRECISION_F32, 0, 0);
  ASSERT_EQ(late.st, DSC_OK) << late.c.diags();
  dsc_graph *g = late.step();
  for (int i = 0; i < dsc_graph_node_count(g); i++) {
    const dsc_node *nd = dsc_graph_node(g, i);
    if (dsc_node_op(nd) != DSC_OP_ALL_GATHER_WAIT) continue;
    EXPECT_EQ(dsc_node_input(nd, 0), dsc_graph_node(g, i - 1));
  }
  // a budget for everything: every forward gather starts before the first
  // wait (those of the update's gathered params excepted: stage 3 has none)
  Piped early(2, 3, "schedule", DSC_PRECISION_F32, 0, int64_t(1) << 30);
  ASSERT_EQ(early.st, DSC_OK) << early.c.diags();
  g = early.step();
  EXPECT_LT(first_pos(g, DSC_OP_ALL_GATHER_START, true), first_pos(g, DSC_OP_ALL_GATHER_WAIT));
}

TEST(ZeroPass, SelectiveUnshardingGathersOncePerMicroBatchWithinTheBudget) {
  Piped twice(2, 3, "zero", DSC_PRECISION_F32, -1, -1, 0);
  ASSERT_EQ(twice.st, DSC_OK) << twice.c.diags();
  int n = trainable(twice.m), base = count_op(twice.step(), DSC_OP_ALL_GATHER_START);
  // all kept: one gather per param in the micro-batch's graph
  Piped all(2, 3, "zero", DSC_PRECISION_F32, -1, -1, int64_t(1) << 30);
  ASSERT_EQ(all.st, DSC_OK) << all.c.diags();
  EXPECT_EQ(count_op(all.step(), DSC_OP_ALL_GATHER_START), n);
  EXPECT_GT(base, n);
  // smallest first: a budget for the biases (10 + 64 + 64 floats, which the
  // backward does not read) and w3 (64 x 10) saves w3's backward gather;
  // w1 and w2 are gathered again
  Piped some(2, 3, "zero", DSC_PRECISION_F32, -1, -1, (10 + 64 + 64 + 640) * 4);
  ASSERT_EQ(some.st, DSC_OK) << some.c.diags();
  EXPECT_EQ(count_op(some.step(), DSC_OP_ALL_GATHER_START), base - 1);
}

TEST(ZeroPass, ShardedStagesSurviveTheWholePipelineAndFp16) {
  for (int stage = 1; stage <= 3; stage++) {
    Piped full(4, stage, nullptr);  // through decompose, cse, fuse
    EXPECT_EQ(full.st, DSC_OK) << "stage " << stage << ": " << full.c.diags();
    Piped fp16(2, stage, "zero", DSC_PRECISION_FP16);
    EXPECT_EQ(fp16.st, DSC_OK) << "stage " << stage << ": " << fp16.c.diags();
  }
}

TEST(ZeroPass, CollectiveTagsCanBeSetToTheStep) {
  Piped p(2, 0);
  ASSERT_EQ(p.st, DSC_OK) << p.c.diags();
  dsc_graph_set_collective_tags(p.step(), 17);
  for (int i = 0; i < dsc_graph_node_count(p.step()); i++) {
    const dsc_node *nd = dsc_graph_node(p.step(), i);
    if (dsc_node_op(nd) == DSC_OP_ALL_REDUCE_START) {
      EXPECT_EQ(dsc_node_attr(nd, "tag")->u.i, 17);
    }
  }
}

TEST(ZeroConfig, StageAndGlobalBatchKeysMirrorDeepSpeed) {
  Ctx c;
  dsc_module *m = dsc_module_new(c.ctx, "m");
  dsc_train_config cfg;
  ASSERT_EQ(dsc_train_config_from_module(m, &cfg), DSC_OK);
  EXPECT_EQ(cfg.world, 1);
  EXPECT_EQ(cfg.zero.stage, 0);
  EXPECT_EQ(cfg.global_batch, 0);
  ASSERT_EQ(dsc_module_set_meta(m, "train.zero.stage", "2"), DSC_OK);
  ASSERT_EQ(dsc_module_set_meta(m, "train.zero.overlap", "true"), DSC_OK);  // a later pass's
  ASSERT_EQ(dsc_module_set_meta(m, "train.train_batch_size", "32"), DSC_OK);
  ASSERT_EQ(dsc_train_config_from_module(m, &cfg), DSC_OK) << c.diags();
  EXPECT_EQ(cfg.zero.stage, 2);
  EXPECT_EQ(cfg.global_batch, 32);
  dsc_module_free(m);

  m = dsc_module_new(c.ctx, "m");
  ASSERT_EQ(dsc_module_set_meta(m, "train.zero_optimization.stage", "1"), DSC_OK);
  ASSERT_EQ(dsc_train_config_from_module(m, &cfg), DSC_OK) << c.diags();
  EXPECT_EQ(cfg.zero.stage, 1);
  ASSERT_EQ(dsc_module_set_meta(m, "train.zero_optimization.stage", "4"), DSC_OK);
  EXPECT_EQ(dsc_train_config_from_module(m, &cfg), DSC_ERR_USER);
  EXPECT_NE(c.diags().find("'train.zero_optimization.stage' must be 0, 1, 2 or 3, got '4'"),
            std::string::npos)
      << c.diags();
  dsc_module_free(m);
}

// ---- the trainer at several world sizes ----

std::string write_shard(const rt_test::TempDir &d, const std::string &name, int64_t n) {
  Ctx c;
  std::vector<uint16_t> toks(n);
  for (int64_t i = 0; i < n; i++) toks[i] = (uint16_t)((i * 7 + i / 13 + (i * i) % 11) % 256);
  std::string path = d / name;
  EXPECT_EQ(dsc_shard_write(c.ctx, path.c_str(), toks.data(), n), DSC_OK) << c.diags();
  return path;
}

struct RankResult {
  std::vector<double> loss, norm;
  std::vector<std::string> names;           // params and their adam moments
  std::vector<std::vector<double>> params;  // their values
};

// The trainable params of gpt-tiny, with their AdamW states (and, with
// master weights, their f32 copies).
std::vector<std::string> tiny_param_names(bool master = false) {
  Ctx c;
  std::vector<std::string> names;
  dsc_module *m = compile(c.ctx, kTiny, 2);
  for (int i = 0; m && i < dsc_module_param_count(m); i++) {
    std::string n = dsc_module_param_name(m, i);
    names.insert(names.end(), {n, "opt.m." + n, "opt.v." + n});
    if (master) names.push_back("opt.master." + n);
  }
  dsc_module_free(m);
  return names;
}

struct Job {
  dsc_trainer_options o;
  int steps = 0;
  std::string bad_prefix;  // non-empty: rank 1 opens this data prefix instead
  std::vector<RankResult> ranks;
};

dsc_status rank_fn(dsc_comm *comm, void *ud) {
  Job *j = static_cast<Job *>(ud);
  int r = dsc_comm_rank(comm);
  dsc_trainer_options o = j->o;
  o.comm = comm;
  if (r == 1 && !j->bad_prefix.empty()) o.data_prefix = j->bad_prefix.c_str();
  dsc_trainer *t = nullptr;
  dsc_status st = dsc_trainer_open(dsc_comm_context(comm), &o, &t);
  if (st != DSC_OK) return st;
  RankResult &res = j->ranks[r];
  for (int s = 0; s < j->steps && st == DSC_OK; s++) {
    dsc_train_progress p;
    st = dsc_trainer_step(t, &p);
    res.loss.push_back(p.loss);
    res.norm.push_back(p.grad_norm);
  }
  if (st == DSC_OK) {
    const dsc_trainer_info *info = dsc_trainer_get_info(t);
    EXPECT_EQ(info->world, dsc_comm_world(comm));
    EXPECT_EQ(info->rank, r);
    EXPECT_EQ(dsc_trainer_gather(t), DSC_OK);  // collective: full values from the shards
    res.names = tiny_param_names(j->o.precision && std::strcmp(j->o.precision, "bf16") == 0);
    for (const std::string &name : res.names) {
      const dsc_tensor *v = dsc_trainer_full_param(t, name.c_str());
      EXPECT_NE(v, nullptr) << name;
      if (v) res.params.emplace_back(v->data, v->data + dsc_type_numel(&v->type));
    }
  }
  dsc_trainer_free(t);
  return st;
}

struct World {
  rt_test::TempDir d;
  std::string prefix;
  World() {
    write_shard(d, "z_train.bin", 3000);
    write_shard(d, "z_val.bin", 200);
    prefix = d / "z";
  }
  // Trains `steps` steps at `world` ranks with grad_accum K (global batch
  // 2 x K x world sequences of 8 tokens); rank 0's result.
  RankResult run(int world, int64_t K, int steps, const char *backend = "interp",
                 std::string *err = nullptr, int64_t global = 0, int stage = -1,
                 const std::string &bad = "", int reduce_each = -1,
                 const char *precision = nullptr) {
    Ctx c;
    Job j;
    memset(&j.o, 0, sizeof j.o);
    j.o.model_path = kTiny.c_str();
    j.o.precision = precision;
    j.o.data_prefix = prefix.c_str();
    j.o.batch = 2, j.o.seq = 8, j.o.grad_accum = K, j.o.steps = 100;
    if (global > 0) j.o.knobs.has_global_batch = true, j.o.knobs.global_batch = global;
    j.o.save_every = -1, j.o.eval_every = 0;
    j.o.backend = backend;
    j.o.threads = 1;
    if (stage >= 0) j.o.knobs.has_zero_stage = true, j.o.knobs.zero_stage = stage;
    if (reduce_each >= 0)
      j.o.knobs.has_reduce_each_micro_batch = true,
      j.o.knobs.reduce_each_micro_batch = reduce_each == 1;
    j.steps = steps;
    j.bad_prefix = bad;
    j.ranks.resize(world);
    dsc_status st = dsc_comm_inproc_run(c.ctx, world, rank_fn, &j);
    if (err) *err = c.diags();
    if (!err) {
      EXPECT_EQ(st, DSC_OK) << c.diags();
    }
    if (st != DSC_OK) return RankResult();
    // every rank holds the same loss, norm and params, bit for bit
    for (int r = 1; r < world; r++) {
      EXPECT_EQ(j.ranks[r].loss, j.ranks[0].loss) << "rank " << r;
      EXPECT_EQ(j.ranks[r].norm, j.ranks[0].norm) << "rank " << r;
      EXPECT_TRUE(j.ranks[r].params == j.ranks[0].params) << "rank " << r;
    }
    return j.ranks[0];
  }
};

// max |a - b| / max(|b|, floor): the floor keeps values near zero (biases
// moved from 0 by a few steps) from dominating the relative error.
double max_rel(const std::vector<double> &a, const std::vector<double> &b, double floor) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); i++)
    m = std::fmax(m, std::fabs(a[i] - b[i]) / std::fmax(std::fabs(b[i]), floor));
  return m;
}

// The absolute tolerance a needs to equal b within 1e-5 relative (as
// numpy.allclose(a, b, rtol=1e-5, atol)): max |a - b| - 1e-5 |b| over the
// params and their AdamW moments; separately (*k_bias) for the key part of
// the attention biases (attn_b[d, 2d)): softmax ignores a shift of all
// scores, so their gradient is zero in exact arithmetic and f32 rounding
// noise in any summation order, which Adam turns into lr-sized steps.
double needed_atol(const RankResult &a, const RankResult &b, double *k_bias) {
  double m = 0;
  *k_bias = 0;
  EXPECT_EQ(a.params.size(), b.params.size());
  for (size_t i = 0; i < a.params.size() && i < b.params.size(); i++) {
    bool attn_b =
        a.names[i].size() >= 6 && a.names[i].compare(a.names[i].size() - 6, 6, "attn_b") == 0;
    size_t d = a.params[i].size() / 3;
    for (size_t k = 0; k < a.params[i].size() && k < b.params[i].size(); k++) {
      double e = std::fabs(a.params[i][k] - b.params[i][k]) - 1e-5 * std::fabs(b.params[i][k]);
      if (attn_b && k >= d && k < 2 * d)
        *k_bias = std::fmax(*k_bias, e);
      else
        m = std::fmax(m, e);
    }
  }
  return m;
}

constexpr int kSteps = 5;

// f32 in the interpreter: the world-N sums group the micro-batches
// differently ((g0 + g1) / 2 + (g2 + g3) / 2 instead of g0 + g1 + g2 + g3),
// so results agree to rounding. Bounds: loss and grad_norm 1e-5 relative
// (measured 8.7e-8); params and Adam moments 1e-5 relative + 1e-7 absolute
// (measured 1.8e-8), the attention key bias 2e-6 absolute (measured 2.3e-7).
void expect_same_as_world_one(int world, int64_t K) {
  World w;
  RankResult w1 = w.run(1, 4, kSteps), wn = w.run(world, K, kSteps);
  ASSERT_EQ(w1.loss.size(), (size_t)kSteps);
  EXPECT_GT(w1.loss[0], 5.0);  // log(256) = 5.55 at init
  EXPECT_LT(w1.loss.back(), w1.loss[0]);
  double l = max_rel(wn.loss, w1.loss, 1e-3), n = max_rel(wn.norm, w1.norm, 1e-3);
  double k, p = needed_atol(wn, w1, &k);
  EXPECT_LT(l, 1e-5);
  EXPECT_LT(n, 1e-5);
  EXPECT_LT(p, 1e-7);  // f32 ulp of 0.02 (a typical weight) is 1.9e-9
  EXPECT_LT(k, 2e-6);  // noise-driven steps: a fraction of the summed lr (9e-4)
  std::printf("world %d vs 1: loss %.1e, grad_norm %.1e, params atol %.1e (key bias %.1e)\n", world,
              l, n, p, k);
}

TEST(ZeroTrain, WorldTwoFollowsWorldOnesLossCurveAndWeights) { expect_same_as_world_one(2, 2); }
TEST(ZeroTrain, WorldFourFollowsWorldOnesLossCurveAndWeights) { expect_same_as_world_one(4, 1); }

TEST(ZeroTrain, ADifferentGlobalBatchIsADifferentRun) {
  // the comparison above can fail: world 2 with grad_accum 4 trains on 16
  // sequences per step, not 8
  World w;
  RankResult a = w.run(1, 4, 2), b = w.run(2, 4, 2);
  ASSERT_EQ(a.loss.size(), 2u);
  ASSERT_EQ(b.loss.size(), 2u);
  EXPECT_GT(max_rel(b.loss, a.loss, 1e-3), 1e-4);
}

TEST(ZeroTrain, TheSameRunTwiceIsBitwiseIdentical) {
  World w;
  RankResult a = w.run(2, 2, 4), b = w.run(2, 2, 4);
  EXPECT_EQ(a.loss, b.loss);
  EXPECT_TRUE(a.params == b.params);
}

TEST(ZeroTrain, GlobalBatchGivesGradAccumAndMustDivide) {
  World w;
  RankResult a = w.run(2, 0, 2, "interp", nullptr, 8), b = w.run(2, 2, 2);
  EXPECT_EQ(a.loss, b.loss);  // 8 = 2 x K x 2: K = 2
  std::string err;
  w.run(2, 0, 1, "interp", &err, 6);
  EXPECT_NE(err.find("global batch of 6 sequences is not divisible by batch 2 x world 2 = 4"),
            std::string::npos)
      << err;
  w.run(2, 3, 1, "interp", &err, 8);
  EXPECT_NE(err.find("global batch 8 is not batch 2 x grad_accum 3 x world 2 = 12"),
            std::string::npos)
      << err;
}

// Stages 1-3 at world 2 and 4 against world 1 (stage 0), same global batch
// (8 sequences), same bounds as above: sharding changes where the update is
// computed, not what. Stage 2-3's grad_norm sums per-rank partial sums.
void expect_stage_same_as_world_one(int world, int64_t K, int stage, const char *backend) {
  World w;
  RankResult w1 = w.run(1, 4, kSteps, backend),
             wn = w.run(world, K, kSteps, backend, nullptr, 0, stage);
  ASSERT_EQ(wn.loss.size(), (size_t)kSteps);
  double l = max_rel(wn.loss, w1.loss, 1e-3), n = max_rel(wn.norm, w1.norm, 1e-3);
  double k, p = needed_atol(wn, w1, &k);
  EXPECT_LT(l, 1e-5);
  EXPECT_LT(n, 1e-5);
  EXPECT_LT(p, 1e-7);
  EXPECT_LT(k, 2e-6);
  std::printf("%s world %d stage %d vs world 1: loss %.1e, grad_norm %.1e, params atol %.1e\n",
              backend, world, stage, l, n, p);
}

TEST(ZeroTrain, StageOneAtWorldTwoAndFourFollowsWorldOne) {
  expect_stage_same_as_world_one(2, 2, 1, "interp");
  expect_stage_same_as_world_one(4, 1, 1, "interp");
}
TEST(ZeroTrain, StageTwoAtWorldTwoAndFourFollowsWorldOne) {
  expect_stage_same_as_world_one(2, 2, 2, "interp");
  expect_stage_same_as_world_one(4, 1, 2, "interp");
}
TEST(ZeroTrain, StageThreeAtWorldTwoAndFourFollowsWorldOne) {
  expect_stage_same_as_world_one(2, 2, 3, "interp");
  expect_stage_same_as_world_one(4, 1, 3, "interp");
}

TEST(ZeroTrain, StagesOneToThreeOnTheCpuBackendFollowWorldOne) {
  if (!dsc_backend_available(DSC_BACKEND_CPU)) GTEST_SKIP() << "no cpu backend in this build";
  // world 1 on the same backend: the compiled kernels round differently
  // from the interpreter. Stage 1 runs local_shard, stage 3 the gathers.
  expect_stage_same_as_world_one(2, 2, 1, "cpu");
  expect_stage_same_as_world_one(2, 2, 3, "cpu");
}

// grad_accum as a loop at stages 2 and 3 (passes/accumulate.c): the
// reduce_scatters run in every micro-batch (the default) or once per step;
// both follow world 1 within the bounds above.
TEST(ZeroTrain, ReducingEachMicroBatchOrOncePerStepFollowsWorldOne) {
  World w;
  RankResult w1 = w.run(1, 4, kSteps);
  for (int stage : {2, 3})
    for (int each : {1, 0}) {
      RankResult wn = w.run(2, 2, kSteps, "interp", nullptr, 0, stage, "", each);
      ASSERT_EQ(wn.loss.size(), (size_t)kSteps);
      double l = max_rel(wn.loss, w1.loss, 1e-3), n = max_rel(wn.norm, w1.norm, 1e-3);
      double k, p = needed_atol(wn, w1, &k);
      EXPECT_LT(l, 1e-5) << "stage " << stage << " each " << each;
      EXPECT_LT(n, 1e-5) << "stage " << stage << " each " << each;
      EXPECT_LT(p, 1e-7) << "stage " << stage << " each " << each;
      EXPECT_LT(k, 2e-6) << "stage " << stage << " each " << each;
      std::printf("stage %d, reduce %s: loss %.1e, grad_norm %.1e, params atol %.1e\n", stage,
                  each ? "each micro-batch" : "once per step", l, n, p);
    }
}

// bf16 with master weights (the ZeRO paper's mixed-precision model states):
// every stage at world 2 follows world 1 in bf16. The ranks reduce bf16
// gradients, so the sums round differently from one rank's: bounds are
// bf16's, measured below. On every rank and at every stage each bf16 param
// is its f32 master weight rounded to bf16, bit for bit.
TEST(ZeroTrain, Bf16MasterWeightsAtEveryStageFollowWorldOne) {
  World w;
  RankResult w1 = w.run(1, 4, kSteps, "interp", nullptr, 0, -1, "", -1, "bf16");
  ASSERT_EQ(w1.loss.size(), (size_t)kSteps);
  EXPECT_LT(w1.loss.back(), w1.loss[0]);
  for (int stage : {0, 1, 2, 3}) {
    RankResult wn = w.run(2, 2, kSteps, "interp", nullptr, 0, stage, "", -1, "bf16");
    ASSERT_EQ(wn.loss.size(), (size_t)kSteps);
    double l = max_rel(wn.loss, w1.loss, 1e-3), n = max_rel(wn.norm, w1.norm, 1e-3);
    EXPECT_LT(l, 1e-3) << "stage " << stage;  // measured 4.1e-5
    EXPECT_LT(n, 5e-3) << "stage " << stage;  // measured 5.4e-4
    for (const RankResult *r : {&w1, &wn}) {
      ASSERT_EQ(r->names.size(), r->params.size());
      for (size_t i = 0; i + 3 < r->names.size(); i += 4) {
        ASSERT_EQ(r->names[i + 3], "opt.master." + r->names[i]);
        const std::vector<double> &p = r->params[i], &mw = r->params[i + 3];
        ASSERT_EQ(p.size(), mw.size());
        size_t bad = 0;
        for (size_t k = 0; k < p.size(); k++) bad += p[k] != (double)ir_bf16_round((float)mw[k]);
        EXPECT_EQ(bad, 0u) << r->names[i] << " stage " << stage;
      }
    }
    std::printf("bf16 world 2 stage %d vs world 1: loss %.1e, grad_norm %.1e\n", stage, l, n);
  }
}

TEST(ZeroTrain, StageThreeTwiceIsBitwiseIdentical) {
  World w;
  RankResult a = w.run(2, 2, 3, "interp", nullptr, 0, 3), b = w.run(2, 2, 3, "interp", nullptr, 0, 3);
  EXPECT_EQ(a.loss, b.loss);
  EXPECT_TRUE(a.params == b.params);
}

TEST(ZeroTrain, ARankThatFailsEndsEveryRankWithItsError) {
  World w;
  std::string err;
  w.run(3, 1, 2, "interp", &err, 0, -1, w.d / "missing");
  EXPECT_NE(err.find("missing_train.bin"), std::string::npos) << err;
  EXPECT_NE(err.find("cannot open"), std::string::npos) << err;
}

}  // namespace
