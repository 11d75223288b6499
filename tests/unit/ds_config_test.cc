// DeepSpeed configs (driver/ds_config.c): the batch rule, the settings a
// file becomes, and where its messages point. The end-to-end runs are
// tests/cli/ds_config.sh.
#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <string>

extern "C" {
#include "driver/driver.h"
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
      {"zero.bucket_bytes", "2000", "zero_optimization.reduce_bucket_size", 5, 5},
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
