// The settings schema (include/dsc/settings.h, passes/settings.c): one table
// of train keys that the frontend, the metadata reader, the CLI flags and the
// library callers' knobs all go through, so that a value means the same and
// is refused the same everywhere.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "dsc/frontend.h"
#include "dsc/settings.h"
#include "dsc/train.h"

namespace {

std::string all_diags(dsc_context *ctx) {
  std::string s;
  for (int i = 0; i < dsc_diag_count(ctx); i++)
    s += std::string(dsc_diag_get(ctx, i)->message) + "\n";
  return s;
}

struct Ctx {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  ~Ctx() { dsc_context_free(ctx); }
};

// The config a module with one train.KEY = VALUE gives (or the error).
dsc_status config_of(Ctx &c, const char *key, const char *value, dsc_train_config *cfg) {
  dsc_module *m = dsc_module_new(c.ctx, "m");
  std::string k = std::string("train.") + key;
  EXPECT_EQ(dsc_module_set_meta(m, k.c_str(), value), DSC_OK);
  dsc_status st = dsc_train_config_from_module(m, cfg);
  dsc_module_free(m);
  return st;
}

TEST(Settings, EveryFlagIsARunKnobAndEveryKeyIsFound) {
  int knobs = 0;
  for (int i = 0; i < dsc_setting_count(); i++) {
    const dsc_setting *s = dsc_setting_at(i);
    EXPECT_EQ(dsc_setting_find(s->key), s) << s->key;
    if (s->alias) {
      EXPECT_EQ(dsc_setting_find(s->alias), s) << s->alias;
    }
    if (s->kind != DSC_SETTING_SECTION) {
      EXPECT_TRUE(s->want && *s->want) << s->key;
    }
    EXPECT_EQ(s->flag != nullptr, s->knob_off >= 0) << s->key;  // a flag is a knob's
    if (s->flag) {
      EXPECT_EQ(dsc_setting_find_flag(s->flag), s) << s->flag;
      EXPECT_GE(s->cfg_off, 0) << s->key;  // and lands in the config
      knobs++;
    }
  }
  EXPECT_EQ(knobs, 17);
  EXPECT_EQ(dsc_setting_find("zero.nonsense"), nullptr);
  EXPECT_EQ(dsc_setting_find_flag("--batch"), nullptr);
}

TEST(Settings, OneRangeForTheSectionTheMetadataAndTheFlags) {
  const dsc_setting *stage = dsc_setting_find("zero.stage");
  ASSERT_NE(stage, nullptr);
  dsc_setting_value v;
  for (const char *ok : {"0", "3"}) EXPECT_TRUE(dsc_setting_parse(stage, ok, false, &v)) << ok;
  for (const char *bad : {"4", "-1", "1.5", "two", ""})
    EXPECT_FALSE(dsc_setting_parse(stage, bad, false, &v)) << bad;
  for (const char *bad : {"4", "-1", "1.5", "two", ""})
    EXPECT_FALSE(dsc_setting_parse(stage, bad, true, &v)) << bad;
  ASSERT_TRUE(dsc_setting_parse(stage, "2", true, &v));
  EXPECT_EQ(v.i, 2);
  // the metadata reader refuses what the table refuses, with the table's words
  Ctx c;
  dsc_train_config cfg;
  EXPECT_EQ(config_of(c, "zero.stage", "4", &cfg), DSC_ERR_USER);
  EXPECT_NE(all_diags(c.ctx).find("'train.zero.stage' must be 0, 1, 2 or 3, got '4'"),
            std::string::npos)
      << all_diags(c.ctx);
  // and every scalar row takes back what a flag of it would set
  EXPECT_EQ(config_of(c, "offload.io_threads", "8", &cfg), DSC_OK) << all_diags(c.ctx);
  EXPECT_EQ(cfg.offload.io_threads, 8);
  EXPECT_EQ(config_of(c, "offload.io_threads", "65", &cfg), DSC_ERR_USER);
  EXPECT_EQ(config_of(c, "zero.bucket", "4096", &cfg), DSC_OK);
  EXPECT_EQ(cfg.zero.bucket_bytes, 4096);
}

TEST(Settings, FlagsTakeByteSuffixesAndNames) {
  dsc_run_knobs k;
  memset(&k, 0, sizeof k);
  EXPECT_TRUE(dsc_run_knobs_set(&k, "--bucket-bytes", "25MB"));
  EXPECT_TRUE(k.has_bucket_bytes);
  EXPECT_EQ(k.bucket_bytes, 25 << 20);
  EXPECT_TRUE(dsc_run_knobs_set(&k, "--checkpoint-activations", "blocks:3"));
  EXPECT_EQ(k.remat, DSC_REMAT_BLOCKS);
  EXPECT_EQ(k.remat_every, 3);
  EXPECT_TRUE(dsc_run_knobs_set(&k, "--offload-optimizer", "cpu"));  // DeepSpeed's name
  EXPECT_EQ(k.offload_optimizer, DSC_OFFLOAD_HOST);
  EXPECT_FALSE(dsc_run_knobs_set(&k, "--offload-param", "gpu"));
  EXPECT_FALSE(k.has_offload_param);
  EXPECT_FALSE(dsc_run_knobs_set(&k, "--offload-io-threads", "0"));
  EXPECT_FALSE(dsc_run_knobs_set(&k, "--batch", "4"));  // not a knob
  // a switch: true, false or auto, on the command line and in a section
  EXPECT_TRUE(dsc_run_knobs_set(&k, "--offload-overlap", "auto"));
  EXPECT_EQ(k.offload_overlap, DSC_SWITCH_AUTO);
  EXPECT_TRUE(dsc_run_knobs_set(&k, "--offload-overlap", "false"));
  EXPECT_EQ(k.offload_overlap, DSC_SWITCH_FALSE);
  EXPECT_FALSE(dsc_run_knobs_set(&k, "--offload-overlap", "1"));
  const dsc_setting *s = dsc_setting_find("offload.overlap");
  ASSERT_NE(s, nullptr);
  dsc_setting_value v;
  ASSERT_TRUE(dsc_setting_parse(s, "true", false, &v));
  EXPECT_EQ(v.i, DSC_SWITCH_TRUE);
  ASSERT_TRUE(dsc_setting_parse(s, "auto", false, &v));
  EXPECT_EQ(v.i, DSC_SWITCH_AUTO);
  EXPECT_FALSE(dsc_setting_parse(s, "sometimes", false, &v));
  EXPECT_FALSE(dsc_setting_parse(s, "2", false, &v));
}

TEST(Settings, LibraryKnobsAreRangeCheckedByTheTable) {
  Ctx c;
  dsc_train_config cfg;
  ASSERT_EQ(config_of(c, "zero.stage", "1", &cfg), DSC_OK);
  dsc_run_knobs k;
  memset(&k, 0, sizeof k);
  EXPECT_EQ(dsc_run_knobs_apply(c.ctx, "trainer", &k, &cfg), DSC_OK);
  EXPECT_EQ(cfg.zero.stage, 1);  // unset knobs keep the section's value
  k.has_zero_stage = true, k.zero_stage = 7;
  EXPECT_EQ(dsc_run_knobs_apply(c.ctx, "trainer", &k, &cfg), DSC_ERR_USER);
  std::string d = all_diags(c.ctx);
  EXPECT_NE(d.find("trainer: the ZeRO stage (--zero-stage, train.zero.stage) must be 0, 1, 2 or "
                   "3, got 7"),
            std::string::npos)
      << d;
  k.zero_stage = 3;
  k.has_remat = true, k.remat = DSC_REMAT_BLOCKS, k.remat_every = 2;
  k.has_offload_optimizer = true, k.offload_optimizer = DSC_OFFLOAD_DISK;
  ASSERT_EQ(dsc_run_knobs_apply(c.ctx, "trainer", &k, &cfg), DSC_OK);
  EXPECT_EQ(cfg.zero.stage, 3);
  EXPECT_EQ(cfg.remat, DSC_REMAT_BLOCKS);
  EXPECT_EQ(cfg.remat_every, 2);
  EXPECT_EQ(cfg.offload.optimizer, DSC_OFFLOAD_DISK);
  k.has_bucket_bytes = true, k.bucket_bytes = -1;
  EXPECT_EQ(dsc_run_knobs_apply(c.ctx, "plan", &k, &cfg), DSC_ERR_USER);
  EXPECT_NE(all_diags(c.ctx).find("plan: bucket_bytes (--bucket-bytes"), std::string::npos);
}

// The optimizers' and schedules' forms are one table: the settings' "want"
// text names exactly them, the frontend takes every key the metadata reader
// reads (muon's adam_lr and decay_1d were refused by a copy that missed
// them), and the two refuse the same unknown names and keys.
TEST(Settings, OptimizerAndScheduleFormsAreOneTable) {
  for (const char *key : {"optimizer", "schedule"}) {
    const dsc_setting *s = dsc_setting_find(key);
    ASSERT_NE(s, nullptr);
    int n = 0;
    const dsc_setting_form *f = dsc_setting_forms(s, &n);
    ASSERT_NE(f, nullptr);
    std::string want = "one of ";
    for (int i = 0; i < n; i++) want += std::string(i ? ", " : "") + f[i].name;
    EXPECT_EQ(want, s->want) << key;
  }
  int n = 0;
  EXPECT_EQ(dsc_setting_forms(dsc_setting_find("batch"), &n), nullptr);
  EXPECT_EQ(n, 0);
  struct Case {
    const char *train;
    bool ok;
    const char *message;
  };
  const Case cases[] = {
      {"optimizer = muon(lr = 0.02, momentum = 0.95, adam_lr = 3e-4, decay_1d = true)", true, ""},
      {"optimizer = adamw(lr = 1e-3, betas = (0.9, 0.95), decay_1d = false)", true, ""},
      {"schedule = warmup_cosine_lr(warmup = 10, decay_steps = 100, cos_min_ratio = 0.1)", true,
       ""},
      {"optimizer = sgd(adam_lr = 1e-3)", false, "'sgd' has no setting 'adam_lr'"},
      {"optimizer = adamw(decay_1d = 1)", false,
       "setting 'decay_1d' of 'adamw' must be true or false"},
      {"schedule = cosin", false, "unknown schedule 'cosin'; did you mean 'cosine'?"},
  };
  for (const Case &k : cases) {
    std::string src = std::string("model m {\n  fn forward(x: f32[4]) { return sum(x) }\n}\n") +
                      "train {\n  " + k.train + "\n}\n";
    Ctx c;
    dsc_module *m = nullptr;
    dsc_status st = dsc_compile_string(c.ctx, src.c_str(), src.size(), "f.dsm", nullptr, &m);
    if (k.ok) {
      EXPECT_EQ(st, DSC_OK) << k.train << ": " << all_diags(c.ctx);
      dsc_train_config cfg;
      if (m) {
        EXPECT_EQ(dsc_train_config_from_module(m, &cfg), DSC_OK) << all_diags(c.ctx);
      }
      if (m && strstr(k.train, "adam_lr")) {
        EXPECT_EQ(cfg.opt.kind, DSC_OPT_MUON);
        EXPECT_DOUBLE_EQ(cfg.opt.adam_lr, 3e-4);
        EXPECT_TRUE(cfg.opt.decay_1d);
      }
    } else {
      EXPECT_EQ(st, DSC_ERR_USER) << k.train;
      EXPECT_NE(all_diags(c.ctx).find(k.message), std::string::npos) << all_diags(c.ctx);
    }
    dsc_module_free(m);
  }
}

// The frontend checks a train section with the same table: its keys (the
// offload streaming ones too), and the table's refusal at the value's line.
TEST(Settings, TheFrontendUsesTheTable) {
  const char *good =
      "model m {\n  fn forward(x: f32[4]) { return sum(x) }\n}\n"
      "train {\n  offload { optimizer = host, io_threads = 8 }\n  zero { stage = 2 }\n}\n";
  Ctx c;
  dsc_module *m = nullptr;
  ASSERT_EQ(dsc_compile_string(c.ctx, good, strlen(good), "good.dsm", nullptr, &m), DSC_OK)
      << all_diags(c.ctx);
  dsc_train_config cfg;
  ASSERT_EQ(dsc_train_config_from_module(m, &cfg), DSC_OK) << all_diags(c.ctx);
  EXPECT_EQ(cfg.offload.io_threads, 8);
  EXPECT_EQ(cfg.offload.optimizer, DSC_OFFLOAD_HOST);
  EXPECT_EQ(cfg.zero.stage, 2);
  dsc_module_free(m);
  const char *bad =
      "model m {\n  fn forward(x: f32[4]) { return sum(x) }\n}\n"
      "train {\n  offload { io_threads = 65 }\n}\n";
  Ctx b;
  m = nullptr;
  EXPECT_EQ(dsc_compile_string(b.ctx, bad, strlen(bad), "bad.dsm", nullptr, &m), DSC_ERR_USER);
  dsc_module_free(m);
  ASSERT_GE(dsc_diag_count(b.ctx), 1);
  const dsc_diag *d = dsc_diag_get(b.ctx, 0);
  EXPECT_STREQ(d->message, "'io_threads' must be 1 to 64");
  EXPECT_EQ(d->loc.line, 5);
}

}  // namespace
