// DeepSpeed configs (driver/ds_config.c): the batch rule, the settings a
// file becomes, and where its messages point. The end-to-end runs are
// tests/cli/ds_config.sh.
#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <string>

extern "C" {
#include "driver/driver.h"
#include "passes/passes.h"
}
#include "tests/unit/test_util.h"

namespace {

struct Ctx {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  ir_arena arena;
  Ctx() { ir_arena_init(&arena, ctx); }
  ~Ctx() {
    ir_arena_release(&arena);
    dsc_context_free(ctx);
  }
};

std::string write_json(const std::string &name, const std::string &text) {
  std::string path = testing::TempDir() + name;
  FILE *f = std::fopen(path.c_str(), "w");
  std::fputs(text.c_str(), f);
  std::fclose(f);
  return path;
}

drv_ds_config triple(int64_t g, int64_t m, int64_t a) {
  drv_ds_config c{};
  c.path = "ds.json", c.global = g, c.micro = m, c.accum = a;
  return c;
}

// DeepSpeed's rule, train_batch_size = micro x accumulation x world: any two
// give the third; a flag takes the file's place.
TEST(DsConfig, TheBatchTripleFollowsDeepSpeedsRule) {
  Ctx c;
  int64_t m = 0, a = 0;
  drv_ds_config t = triple(32, 4, 0);
  ASSERT_EQ(drv_ds_config_batch(c.ctx, &t, 2, 0, 0, &m, &a), DSC_OK);
  EXPECT_EQ(m, 4);
  EXPECT_EQ(a, 4);
  t = triple(32, 0, 2);
  ASSERT_EQ(drv_ds_config_batch(c.ctx, &t, 4, 0, 0, &m, &a), DSC_OK);
  EXPECT_EQ(m, 4);
  EXPECT_EQ(a, 2);
  t = triple(32, 0, 0);  // micro = global / world, no accumulation
  ASSERT_EQ(drv_ds_config_batch(c.ctx, &t, 8, 0, 0, &m, &a), DSC_OK);
  EXPECT_EQ(m, 4);
  EXPECT_EQ(a, 1);
  t = triple(0, 3, 0);
  ASSERT_EQ(drv_ds_config_batch(c.ctx, &t, 8, 0, 0, &m, &a), DSC_OK);
  EXPECT_EQ(m, 3);
  EXPECT_EQ(a, 1);
  t = triple(0, 0, 5);  // the model's train section gives the micro-batch
  ASSERT_EQ(drv_ds_config_batch(c.ctx, &t, 8, 0, 0, &m, &a), DSC_OK);
  EXPECT_EQ(m, 0);
  EXPECT_EQ(a, 5);
  t = triple(32, 4, 2);
  ASSERT_EQ(drv_ds_config_batch(c.ctx, &t, 4, 0, 0, &m, &a), DSC_OK);
  t = triple(32, 0, 0);  // the flag --grad-accum 2 gives the micro-batch: 32 / (2 x 4)
  ASSERT_EQ(drv_ds_config_batch(c.ctx, &t, 4, 0, 2, &m, &a), DSC_OK);
  EXPECT_EQ(m, 4);
  EXPECT_EQ(a, 2);
  EXPECT_EQ(dsc_error_count(c.ctx), 0);
  t = triple(32, 0, 2);  // a flag that contradicts the file's global batch: 2 x 2 x 4 = 16
  EXPECT_EQ(drv_ds_config_batch(c.ctx, &t, 4, 2, 0, &m, &a), DSC_ERR_USER);
  dsc_diag_clear(c.ctx);
  t = triple(32, 4, 2);
  EXPECT_EQ(drv_ds_config_batch(c.ctx, &t, 2, 0, 0, &m, &a), DSC_ERR_USER);
  EXPECT_NE(diags(c.ctx).find("train_batch_size 32 is not train_micro_batch_size_per_gpu 4 x "
                              "gradient_accumulation_steps 2 x world 2 = 16"),
            std::string::npos)
      << diags(c.ctx);
  t = triple(30, 4, 0);
  EXPECT_EQ(drv_ds_config_batch(c.ctx, &t, 2, 0, 0, &m, &a), DSC_ERR_USER);
  EXPECT_NE(diags(c.ctx).find("train_batch_size 30 is not divisible by "
                              "train_micro_batch_size_per_gpu 4 x world 2 = 8"),
            std::string::npos)
      << diags(c.ctx);
}

// A file's keys become train settings in the train section's syntax, each
// naming its key and line; DeepSpeed's bucket sizes count elements.
TEST(DsConfig, KeysBecomeTrainSettingsWithTheirPlace) {
  Ctx c;
  std::string p = write_json("ds_keys.json",
                             "{\n"
                             "  \"bf16\": {\"enabled\": true},\n"
                             "  \"zero_optimization\": {\n"
                             "    \"stage\": 2,\n"
                             "    \"reduce_bucket_size\": 1000,\n"
                             "    \"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"/x\"}\n"
                             "  },\n"
                             "  \"gradient_clipping\": 0.25, \"steps_per_print\": 7, \"seed\": 3,\n"
                             "  \"activation_checkpointing\": {\"cpu_checkpointing\": true}\n"
                             "}\n");
  drv_ds_config ds;
  ASSERT_EQ(drv_ds_config_read(c.ctx, p.c_str(), &c.arena, &ds), DSC_OK) << diags(c.ctx);
  struct {
    const char *key, *value, *from;
    int line, col;
  } want[] = {
      {"precision", "bf16", "bf16.enabled", 2, 12},
      {"zero.stage", "2", "zero_optimization.stage", 4, 5},
      {"zero.bucket_bytes", "1000", "zero_optimization.reduce_bucket_size", 5, 5},  // elements
      {"offload.optimizer", "disk", "zero_optimization.offload_optimizer.device", 6, 27},
      {"clip", "0.25", "gradient_clipping", 8, 3},
      {"log_every", "7", "steps_per_print", 8, 30},
      {"seed", "3", "seed", 8, 52},
      {"checkpoint_activations", "offload", "activation_checkpointing", 9, 3},
  };
  for (const auto &w : want) {
    const drv_ds_setting *s = drv_ds_config_find(&ds, w.key);
    ASSERT_NE(s, nullptr) << w.key;
    EXPECT_STREQ(s->value, w.value) << w.key;
    EXPECT_STREQ(s->from, w.from) << w.key;
    EXPECT_EQ(s->loc.line, w.line) << w.key;
    EXPECT_EQ(s->loc.col, w.col) << w.key;
  }
  EXPECT_STREQ(ds.offload_dir, "/x");
  EXPECT_EQ(drv_ds_config_find(&ds, "zero.prefetch_bytes"), nullptr);
  EXPECT_EQ(dsc_diag_count(c.ctx), 0) << diags(c.ctx);
  // applied: DeepSpeed's bucket of 1000 elements is 2000 bytes of bf16 gradients
  dsc_module *m = dsc_module_new(c.ctx, "m");
  ASSERT_EQ(drv_ds_config_apply(c.ctx, &ds, m), DSC_OK) << diags(c.ctx);
  dsc_train_config cfg;
  ASSERT_EQ(dsc_train_config_from_module(m, &cfg), DSC_OK) << diags(c.ctx);
  EXPECT_EQ(cfg.zero.bucket_bytes, 2000);
  EXPECT_EQ(cfg.zero.stage, 2);
  dsc_module_free(m);
}

// A bucket in elements counts the gradients' bytes of the precision the
// module trains in, whether the file or the train section sets it: 2 with
// bf16 master weights, 4 in f32 or with f32 gradients (autocast).
TEST(DsConfig, BucketElementsFollowTheModulesPrecision) {
  Ctx c;
  std::string p = write_json("ds_bucket.json",
                             "{\"zero_optimization\": {\"reduce_bucket_size\": 100, "
                             "\"stage3_prefetch_bucket_size\": 10}}");
  drv_ds_config ds;
  ASSERT_EQ(drv_ds_config_read(c.ctx, p.c_str(), &c.arena, &ds), DSC_OK) << diags(c.ctx);
  struct {
    const char *precision, *master;
    int64_t bytes;
  } cases[] = {{"bf16", nullptr, 2}, {"f32", nullptr, 4}, {"bf16", "false", 4}, {"fp16", "true", 2}};
  for (const auto &k : cases) {
    dsc_module *m = dsc_module_new(c.ctx, "m");
    ASSERT_EQ(dsc_module_set_meta(m, "train.precision", k.precision), DSC_OK);
    if (k.master) {
      ASSERT_EQ(dsc_module_set_meta(m, "train.master_weights", k.master), DSC_OK);
    }
    ASSERT_EQ(drv_ds_config_apply(c.ctx, &ds, m), DSC_OK) << diags(c.ctx);
    dsc_train_config cfg;
    ASSERT_EQ(dsc_train_config_from_module(m, &cfg), DSC_OK) << diags(c.ctx);
    EXPECT_EQ(cfg.zero.bucket_bytes, 100 * k.bytes) << k.precision;
    EXPECT_EQ(cfg.zero.prefetch_bytes, 10 * k.bytes) << k.precision;
    dsc_module_free(m);
  }
}

// The optimizer and schedule texts the config applies and --print-config
// shows read back to the same settings, for every kind.
TEST(DsConfig, OptimizerAndScheduleTextsReadBack) {
  Ctx c;
  dsc_module *m0 = dsc_module_new(c.ctx, "m");
  dsc_train_config cfg;
  ASSERT_EQ(dsc_train_config_from_module(m0, &cfg), DSC_OK);
  dsc_module_free(m0);
  cfg.opt.lr = 0.003, cfg.opt.weight_decay = 0.1, cfg.opt.beta1 = 0.8, cfg.opt.beta2 = 0.95;
  cfg.opt.eps = 1e-7, cfg.opt.momentum = 0.5, cfg.opt.nesterov = true, cfg.opt.decay_1d = true;
  cfg.opt.adam_lr = 0.01;
  cfg.sched.warmup = 7, cfg.sched.min_lr = 1e-5, cfg.sched.decay_steps = 40;
  cfg.sched.warmup_log = false, cfg.sched.min_ratio = 0.2, cfg.sched.cos_min_ratio = 0.05;
  cfg.sched.first_steps = 9, cfg.sched.second_steps = 0, cfg.sched.first_stairs = 3;
  cfg.sched.second_stairs = 1, cfg.sched.decay_step_size = 4, cfg.sched.decay_lr_rate = 0.125;
  cfg.sched.step_size = 6, cfg.sched.step_rate = 0.3, cfg.sched.staircase = true;
  for (dsc_optimizer_kind ok : {DSC_OPT_ADAMW, DSC_OPT_SGD, DSC_OPT_MUON})
    for (dsc_schedule_kind sk :
         {DSC_SCHED_CONSTANT, DSC_SCHED_COSINE, DSC_SCHED_LINEAR, DSC_SCHED_WARMUP_LR,
          DSC_SCHED_WARMUP_DECAY_LR, DSC_SCHED_WARMUP_COSINE_LR, DSC_SCHED_ONE_CYCLE,
          DSC_SCHED_LR_RANGE_TEST}) {
      dsc_train_config a = cfg, b;
      a.opt.kind = ok, a.sched.kind = sk;
      char opt[400], sched[400];
      pass_format_optimizer(&a, opt, sizeof opt);
      pass_format_schedule(&a, sched, sizeof sched);
      dsc_module *m = dsc_module_new(c.ctx, "m");
      ASSERT_EQ(dsc_module_set_meta(m, "train.optimizer", opt), DSC_OK);
      ASSERT_EQ(dsc_module_set_meta(m, "train.schedule", sched), DSC_OK);
      ASSERT_EQ(dsc_train_config_from_module(m, &b), DSC_OK) << opt << " " << sched << diags(c.ctx);
      dsc_module_free(m);
      EXPECT_EQ(b.opt.kind, ok) << opt;
      EXPECT_EQ(b.opt.lr, a.opt.lr) << opt;
      EXPECT_EQ(b.opt.weight_decay, a.opt.weight_decay) << opt;
      EXPECT_EQ(b.opt.decay_1d, a.opt.decay_1d) << opt;
      if (ok != DSC_OPT_SGD) {
        EXPECT_EQ(b.opt.beta1, a.opt.beta1) << opt;
        EXPECT_EQ(b.opt.beta2, a.opt.beta2) << opt;
        EXPECT_EQ(b.opt.eps, a.opt.eps) << opt;
      }
      if (ok != DSC_OPT_ADAMW) {
        EXPECT_EQ(b.opt.momentum, a.opt.momentum) << opt;
        EXPECT_EQ(b.opt.nesterov, a.opt.nesterov) << opt;
      }
      if (ok == DSC_OPT_MUON) {
        EXPECT_EQ(b.opt.adam_lr, a.opt.adam_lr) << opt;
      }
      EXPECT_EQ(b.sched.kind, sk) << sched;
      bool cycle = sk == DSC_SCHED_ONE_CYCLE, range = sk == DSC_SCHED_LR_RANGE_TEST;
      if (!cycle && !range) {
        EXPECT_EQ(b.sched.warmup, a.sched.warmup) << sched;
      }
      if (sk != DSC_SCHED_CONSTANT && sk != DSC_SCHED_WARMUP_COSINE_LR && !range) {
        EXPECT_EQ(b.sched.min_lr, a.sched.min_lr) << sched;
      }
      if (sk != DSC_SCHED_CONSTANT && sk != DSC_SCHED_WARMUP_LR && !cycle && !range) {
        EXPECT_EQ(b.sched.decay_steps, a.sched.decay_steps) << sched;
      }
      if (sk >= DSC_SCHED_WARMUP_LR && !cycle && !range) {
        EXPECT_EQ(b.sched.warmup_log, a.sched.warmup_log) << sched;
      }
      if (cycle) {
        EXPECT_EQ(b.sched.first_steps, a.sched.first_steps) << sched;
        EXPECT_EQ(b.sched.second_steps, a.sched.second_steps) << sched;
        EXPECT_EQ(b.sched.first_stairs, a.sched.first_stairs) << sched;
        EXPECT_EQ(b.sched.second_stairs, a.sched.second_stairs) << sched;
        EXPECT_EQ(b.sched.decay_step_size, a.sched.decay_step_size) << sched;
        EXPECT_EQ(b.sched.decay_lr_rate, a.sched.decay_lr_rate) << sched;
      }
      if (range) {
        EXPECT_EQ(b.sched.step_size, a.sched.step_size) << sched;
        EXPECT_EQ(b.sched.step_rate, a.sched.step_rate) << sched;
        EXPECT_EQ(b.sched.staircase, a.sched.staircase) << sched;
      }
      if (sk == DSC_SCHED_WARMUP_COSINE_LR) {
        EXPECT_EQ(b.sched.min_ratio, a.sched.min_ratio) << sched;
        EXPECT_EQ(b.sched.cos_min_ratio, a.sched.cos_min_ratio) << sched;
      }
    }
}

// OneCycle and LRRangeTest: DeepSpeed's defaults for what the file leaves
// out (the second half and stairs the first's), "auto" the model's values
// where it has the same schedule (else DeepSpeed's), cycle_max_lr and
// lr_range_test_min_lr the lr.
TEST(DsConfig, OneCycleAndLrRangeTestTakeDeepSpeedsDefaultsAndTheModelsAutoValues) {
  Ctx c;
  std::string p = write_json("ds_cycle.json",
                             "{\"scheduler\": {\"type\": \"OneCycle\", \"params\": {"
                             "\"cycle_min_lr\": \"auto\", \"cycle_max_lr\": \"auto\", "
                             "\"cycle_first_step_size\": \"auto\", \"cycle_first_stair_count\": "
                             "\"auto\", \"cycle_momentum\": false}}}");
  drv_ds_config ds;
  ASSERT_EQ(drv_ds_config_read(c.ctx, p.c_str(), &c.arena, &ds), DSC_OK) << diags(c.ctx);
  for (bool has_cycle : {true, false}) {
    dsc_module *m = dsc_module_new(c.ctx, "m");
    ASSERT_EQ(dsc_module_set_meta(m, "train.lr", "0.02"), DSC_OK);
    ASSERT_EQ(dsc_module_set_meta(m, "train.schedule",
                                  has_cycle ? "one_cycle(min_lr = 1e-4, first_steps = 5, "
                                              "second_steps = 2, first_stairs = 1)"
                                            : "cosine(warmup = 3, min_lr = 2e-4)"),
              DSC_OK);
    ASSERT_EQ(drv_ds_config_apply(c.ctx, &ds, m), DSC_OK) << diags(c.ctx);
    dsc_train_config cfg;
    ASSERT_EQ(dsc_train_config_from_module(m, &cfg), DSC_OK) << diags(c.ctx);
    EXPECT_EQ(cfg.sched.kind, DSC_SCHED_ONE_CYCLE);
    EXPECT_EQ(cfg.opt.lr, 0.02);                           // auto: the model's lr
    EXPECT_EQ(cfg.sched.min_lr, has_cycle ? 1e-4 : 2e-4);  // auto: the model's min_lr
    EXPECT_EQ(cfg.sched.first_steps, has_cycle ? 5 : 2000);
    EXPECT_EQ(cfg.sched.second_steps, has_cycle ? 5 : 2000);  // absent: the first's
    EXPECT_EQ(cfg.sched.first_stairs, has_cycle ? 1 : 0);
    EXPECT_EQ(cfg.sched.second_stairs, has_cycle ? 1 : 0);
    EXPECT_EQ(cfg.sched.decay_step_size, 0);
    dsc_module_free(m);
  }
  EXPECT_EQ(dsc_diag_count(c.ctx), 0) << diags(c.ctx);  // cycle_momentum false: no warning
  p = write_json("ds_range.json",
                 "{\"scheduler\": {\"type\": \"LRRangeTest\", \"params\": {"
                 "\"lr_range_test_step_rate\": 0.5}}}");
  ASSERT_EQ(drv_ds_config_read(c.ctx, p.c_str(), &c.arena, &ds), DSC_OK) << diags(c.ctx);
  dsc_module *m = dsc_module_new(c.ctx, "m");
  ASSERT_EQ(drv_ds_config_apply(c.ctx, &ds, m), DSC_OK) << diags(c.ctx);
  dsc_train_config cfg;
  ASSERT_EQ(dsc_train_config_from_module(m, &cfg), DSC_OK) << diags(c.ctx);
  EXPECT_EQ(cfg.sched.kind, DSC_SCHED_LR_RANGE_TEST);
  EXPECT_EQ(cfg.opt.lr, 1e-3);  // DeepSpeed's lr_range_test_min_lr
  EXPECT_EQ(cfg.sched.step_size, 2000);
  EXPECT_EQ(cfg.sched.step_rate, 0.5);
  EXPECT_FALSE(cfg.sched.staircase);
  const drv_ds_setting *src = drv_ds_config_find(&ds, "lr");
  ASSERT_NE(src, nullptr);
  EXPECT_STREQ(src->from, "scheduler.params.lr_range_test_min_lr");
  dsc_module_free(m);
}

// Applied to a module, the settings are read by the one settings table; the
// optimizer takes DeepSpeed's defaults for what the file leaves out and the
// model's values for "auto".
TEST(DsConfig, TheOptimizerTakesDeepSpeedsDefaultsAndTheModelsAutoValues) {
  Ctx c;
  std::string p = write_json("ds_opt.json",
                             "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": \"auto\", "
                             "\"betas\": [0.8, 0.9]}}}");
  drv_ds_config ds;
  ASSERT_EQ(drv_ds_config_read(c.ctx, p.c_str(), &c.arena, &ds), DSC_OK) << diags(c.ctx);
  ASSERT_EQ(ds.n_auto, 1);
  EXPECT_STREQ(ds.autos[0].path, "optimizer.params.lr");
  dsc_module *m = dsc_module_new(c.ctx, "m");
  ASSERT_EQ(dsc_module_set_meta(m, "train.optimizer", "adamw(lr = 0.004, eps = 1e-6, weight_decay = 0.3)"),
            DSC_OK);
  ASSERT_EQ(drv_ds_config_apply(c.ctx, &ds, m), DSC_OK) << diags(c.ctx);
  dsc_train_config cfg;
  ASSERT_EQ(dsc_train_config_from_module(m, &cfg), DSC_OK) << diags(c.ctx);
  EXPECT_EQ(cfg.opt.kind, DSC_OPT_ADAMW);
  EXPECT_EQ(cfg.opt.lr, 0.004);  // auto: the model's
  EXPECT_EQ(cfg.opt.beta1, 0.8);
  EXPECT_EQ(cfg.opt.beta2, 0.9);
  EXPECT_EQ(cfg.opt.eps, 1e-8);          // absent: FusedAdam's default, not the model's 1e-6
  EXPECT_EQ(cfg.opt.weight_decay, 0.0);  // absent: DeepSpeed's 0
  dsc_module_free(m);
  // SGD: torch's momentum 0 unless given (dsc's own default is 0.9)
  p = write_json("ds_sgd.json", "{\"optimizer\": {\"type\": \"sgd\", \"params\": {\"lr\": 0.1}}}");
  ASSERT_EQ(drv_ds_config_read(c.ctx, p.c_str(), &c.arena, &ds), DSC_OK) << diags(c.ctx);
  m = dsc_module_new(c.ctx, "m");
  ASSERT_EQ(drv_ds_config_apply(c.ctx, &ds, m), DSC_OK) << diags(c.ctx);
  ASSERT_EQ(dsc_train_config_from_module(m, &cfg), DSC_OK) << diags(c.ctx);
  EXPECT_EQ(cfg.opt.kind, DSC_OPT_SGD);
  EXPECT_EQ(cfg.opt.lr, 0.1);
  EXPECT_EQ(cfg.opt.momentum, 0.0);
  dsc_module_free(m);
}

// Hostile files: every prefix of a full config and a few thousand random
// byte changes of it load or fail with an error diagnostic, never crash
// (the sanitizer build runs this too); what loads applies to a module and
// reads back through the settings table or fails with a message.
TEST(DsConfig, MangledFilesLoadOrFailWithAMessage) {
  const std::string good =
      "{\"train_batch_size\": 16, \"train_micro_batch_size_per_gpu\": 2,\n"
      " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.001, \"betas\": [0.9, 0.95]}},\n"
      " \"scheduler\": {\"type\": \"WarmupDecayLR\", \"params\": {\"warmup_num_steps\": 5, "
      "\"total_num_steps\": \"auto\"}},\n"
      " \"fp16\": {\"enabled\": true, \"initial_scale_power\": 8}, \"gradient_clipping\": 1.0,\n"
      " \"zero_optimization\": {\"stage\": 3, \"offload_param\": {\"device\": \"nvme\", "
      "\"nvme_path\": \"/x\"}, \"overlap_comm\": true},\n"
      " \"activation_checkpointing\": {\"cpu_checkpointing\": false}, \"steps_per_print\": 3}\n";
  std::mt19937 rng(17);
  const char bytes[] = "{}[]\":,0123456789.eE-+ \n\\tfnula\x01\xff";
  int loaded = 0, failed = 0;
  for (int trial = 0; trial < 3000 + (int)good.size(); trial++) {
    std::string t = good;
    if (trial < (int)good.size()) {
      t.resize((size_t)trial);  // every prefix
    } else {
      int edits = 1 + (int)(rng() % 4);
      for (int e = 0; e < edits && !t.empty(); e++) {
        size_t at = rng() % t.size();
        char c = bytes[rng() % (sizeof bytes - 1)];
        switch (rng() % 3) {
          case 0: t[at] = c; break;
          case 1: t.insert(at, 1, c); break;
          default: t.erase(at, 1 + rng() % 8);
        }
      }
    }
    Ctx c;
    std::string p = write_json("ds_mangled.json", t);
    drv_ds_config ds;
    dsc_status st = drv_ds_config_read(c.ctx, p.c_str(), &c.arena, &ds);
    if (st != DSC_OK) {
      ASSERT_GT(dsc_error_count(c.ctx), 0) << t;
      failed++;
      continue;
    }
    ASSERT_EQ(dsc_error_count(c.ctx), 0) << t;
    int64_t m, a;
    if (drv_ds_config_batch(c.ctx, &ds, 2, 0, 0, &m, &a) != DSC_OK) {
      ASSERT_GT(dsc_error_count(c.ctx), 0) << t;
      continue;
    }
    dsc_module *mod = dsc_module_new(c.ctx, "m");
    dsc_status ap = drv_ds_config_apply(c.ctx, &ds, mod);
    dsc_train_config cfg;
    if (ap == DSC_OK) ap = dsc_train_config_from_module(mod, &cfg);
    if (ap != DSC_OK) {
      ASSERT_GT(dsc_error_count(c.ctx), 0) << t;
    }
    dsc_module_free(mod);
    loaded++;
  }
  EXPECT_GT(loaded, 20);  // most changes break the JSON or a key: both must say so
  EXPECT_GT(failed, 1000);
  std::printf("[ measured ] mangled ds_configs: %d loaded, %d refused\n", loaded, failed);
}

}  // namespace
