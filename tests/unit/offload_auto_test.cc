// Adaptive offload (driver/offload_auto.c, pass offload's per-value tiers in
// passes/offload.c): the pass tiers exactly the listed values; dsc_plan_memory
// with offload auto moves only what the budget requires, furthest next use
// from the peak and largest first, and fits; nothing moves under a budget at
// the peak; a budget too small even with every candidate moved is an error
// naming what is over (a plan in lenient mode); the auto-configuration
// search plans auto as an offload choice.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "dsc/autocfg.h"
#include "dsc/dsc.h"
#include "dsc/memplan.h"
#include "tests/unit/test_util.h"

namespace {

const std::string kModel = std::string(DSC_SOURCE_DIR) + "/examples/gpt-tiny.dsm";

// gpt-tiny's step at batch 2 x seq 16 through the pipeline up to `offload`.
dsc_status tiny_step(dsc_context *ctx, const dsc_offload_value *values, int n_values,
                     dsc_module **out) {
  dsc_dim_binding dims[2] = {{"B", 2}, {"T", 16}};
  dsc_frontend_options fo;
  memset(&fo, 0, sizeof fo);
  fo.dims = dims;
  fo.n_dims = 2;
  *out = nullptr;
  dsc_status st = dsc_compile_file(ctx, kModel.c_str(), &fo, out);
  if (st != DSC_OK) return st;
  dsc_train_config cfg;
  if ((st = dsc_train_config_from_module(*out, &cfg)) != DSC_OK) return st;
  cfg.batch = 2, cfg.seq = 16, cfg.grad_accum = 1;
  cfg.offload.optimizer = DSC_OFFLOAD_AUTO;
  cfg.offload.values = values, cfg.offload.n_values = n_values;
  dsc_pipeline_options po;
  memset(&po, 0, sizeof po);
  po.train = &cfg;
  po.stop_after = "offload";
  return dsc_run_pipeline(*out, &po);
}

TEST(OffloadAuto, PassTiersExactlyTheListedValues) {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  dsc_offload_value v[2] = {{"opt.m.wte", DSC_OFFLOAD_HOST}, {"opt.v.lnf_w", DSC_OFFLOAD_DISK}};
  dsc_module *m = nullptr;
  ASSERT_EQ(tiny_step(ctx, v, 2, &m), DSC_OK) << diags(ctx);
  int tiered = 0, states = 0;
  for (int i = 0; i < dsc_module_param_count(m); i++) {
    std::string name = dsc_module_param_name(m, i);
    const char *t = dsc_module_get_meta(m, ("tier." + name).c_str());
    states += name.rfind("opt.", 0) == 0;
    if (!t) continue;
    tiered++;
    if (name == "opt.m.wte")
      EXPECT_STREQ(t, "host");
    else if (name == "opt.v.lnf_w")
      EXPECT_STREQ(t, "disk");
    else
      ADD_FAILURE() << name << " tiered " << t << " without being listed";
  }
  EXPECT_EQ(tiered, 2);
  EXPECT_GT(states, 10);  // the other states stay on the device
  dsc_module_free(m);
  dsc_context_free(ctx);
}

TEST(OffloadAuto, PassRefusesAnUnchosenAutoAndValuesItMayNotMove) {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  dsc_module *m = nullptr;
  EXPECT_EQ(tiny_step(ctx, nullptr, 0, &m), DSC_ERR_USER);
  EXPECT_NE(diags(ctx).find("auto needs a memory budget"), std::string::npos) << diags(ctx);
  dsc_module_free(m);
  // a param (the optimizer class is auto, the param class is not), a name
  // that is no value, and a tier that is not host or disk
  dsc_offload_value bad[3] = {{"wte", DSC_OFFLOAD_HOST},
                              {"opt.m.nothing", DSC_OFFLOAD_HOST},
                              {"opt.m.wte", DSC_OFFLOAD_AUTO}};
  for (const dsc_offload_value &b : bad) {
    dsc_diag_clear(ctx);
    EXPECT_EQ(tiny_step(ctx, &b, 1, &m), DSC_ERR_USER) << b.name;
    EXPECT_NE(diags(ctx).find(std::string("auto cannot move '") + b.name + "'"), std::string::npos)
        << diags(ctx);
    dsc_module_free(m);
  }
  dsc_context_free(ctx);
}

dsc_plan_options tiny_plan() {
  dsc_plan_options o;
  memset(&o, 0, sizeof o);
  o.model_path = kModel.c_str();
  o.batch = 2, o.seq = 32, o.world = 1;
  o.precision = "f32";
  o.knobs.has_zero_stage = true, o.knobs.zero_stage = 0;
  o.threads = 2;
  return o;
}

TEST(OffloadAuto, BudgetBelowThePeakMovesOnlyWhatItRequiresInOrder) {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  dsc_plan_options o = tiny_plan();
  dsc_memory_plan none, p;
  ASSERT_EQ(dsc_plan_memory(ctx, &o, &none), DSC_OK) << diags(ctx);
  EXPECT_FALSE(none.offload_auto);
  // budgets from just below the peak to where most states must move
  for (int64_t below : {int64_t(1), int64_t(100000), none.rank.optimizer - 70000}) {
    SCOPED_TRACE(below);
    dsc_run_knobs_set(&o.knobs, "--offload-optimizer", "auto");
    o.memory_budget = none.rank.peak - below;
    ASSERT_EQ(dsc_plan_memory(ctx, &o, &p), DSC_OK) << diags(ctx);
    ASSERT_TRUE(p.offload_auto);
    EXPECT_EQ(p.peak_no_offload, none.rank.peak);
    EXPECT_LE(p.rank.peak, o.memory_budget);
    EXPECT_GT(p.n_offloaded, 0);
    EXPECT_LT(p.n_offloaded, p.auto_candidates);
    EXPECT_EQ(p.offloaded_disk, 0);
    int64_t sum = 0;
    for (int i = 0; i < p.n_offloaded && i < DSC_PLAN_OFFLOADED_MAX; i++) {
      const dsc_plan_offloaded &v = p.offloaded[i];
      EXPECT_EQ(std::string(v.name).rfind("opt.", 0), 0u) << v.name;
      EXPECT_EQ(v.tier, DSC_OFFLOAD_HOST);
      EXPECT_GT(v.bytes, 0);
      sum += v.bytes;
      if (i > 0) {  // furthest next use first, then the largest
        const dsc_plan_offloaded &u = p.offloaded[i - 1];
        EXPECT_TRUE(u.next_use > v.next_use || (u.next_use == v.next_use && u.bytes >= v.bytes))
            << u.name << " before " << v.name;
      }
    }
    if (p.n_offloaded <= DSC_PLAN_OFFLOADED_MAX) {
      EXPECT_EQ(sum, p.offloaded_host);
      // only what the budget requires: the moved bytes minus the last value
      // would leave the peak over the budget
      int64_t last = p.offloaded[p.n_offloaded - 1].bytes;
      EXPECT_GT(none.rank.peak - (sum - last), o.memory_budget);
    }
    EXPECT_EQ(p.host_bytes, p.offloaded_host);              // the host arena holds them
    EXPECT_EQ(none.rank.peak - p.rank.peak, p.host_bytes);  // and the device lost them
  }
  dsc_context_free(ctx);
}

TEST(OffloadAuto, BudgetAtThePeakMovesNothing) {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  dsc_plan_options o = tiny_plan();
  dsc_memory_plan none, p;
  ASSERT_EQ(dsc_plan_memory(ctx, &o, &none), DSC_OK) << diags(ctx);
  dsc_run_knobs_set(&o.knobs, "--offload-optimizer", "auto");
  o.memory_budget = none.rank.peak;
  ASSERT_EQ(dsc_plan_memory(ctx, &o, &p), DSC_OK) << diags(ctx);
  EXPECT_TRUE(p.offload_auto);
  EXPECT_EQ(p.n_offloaded, 0);
  EXPECT_GT(p.auto_candidates, 0);
  EXPECT_EQ(p.auto_plans, 1);
  EXPECT_EQ(p.rank.peak, none.rank.peak);
  EXPECT_EQ(p.host_bytes, 0);
  dsc_context_free(ctx);
}

TEST(OffloadAuto, TooSmallABudgetFailsNamingWhatIsOver) {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  dsc_plan_options o = tiny_plan();
  dsc_memory_plan none, p;
  ASSERT_EQ(dsc_plan_memory(ctx, &o, &none), DSC_OK) << diags(ctx);
  dsc_run_knobs_set(&o.knobs, "--offload-optimizer", "auto");
  o.memory_budget = none.rank.peak - none.rank.optimizer - 65536;
  EXPECT_EQ(dsc_plan_memory(ctx, &o, &p), DSC_ERR_USER);
  std::string d = diags(ctx);
  EXPECT_NE(d.find("offload auto: the step needs "), std::string::npos) << d;
  EXPECT_NE(d.find("with every optimizer state offloaded"), std::string::npos) << d;
  EXPECT_NE(d.find("still over the memory budget of"), std::string::npos) << d;
  EXPECT_NE(d.find("activations"), std::string::npos) << d;
  // lenient (the search's candidates): a plan with every state moved, over the budget
  dsc_diag_clear(ctx);
  o.offload_auto_lenient = true;
  ASSERT_EQ(dsc_plan_memory(ctx, &o, &p), DSC_OK) << diags(ctx);
  EXPECT_GT(p.rank.peak, o.memory_budget);
  EXPECT_EQ(p.n_offloaded, p.auto_candidates);
  EXPECT_EQ(p.rank.optimizer, 0);
  // no budget at all
  dsc_diag_clear(ctx);
  o.offload_auto_lenient = false;
  o.memory_budget = 0;
  EXPECT_EQ(dsc_plan_memory(ctx, &o, &p), DSC_ERR_USER);
  EXPECT_NE(diags(ctx).find("--offload-optimizer auto needs --memory-budget"), std::string::npos)
      << diags(ctx);
  dsc_context_free(ctx);
}

TEST(OffloadAuto, AHostBudgetWithoutTheDiskTierIsAClearError) {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  dsc_plan_options o = tiny_plan();
  dsc_memory_plan none, p;
  ASSERT_EQ(dsc_plan_memory(ctx, &o, &none), DSC_OK) << diags(ctx);
  dsc_run_knobs_set(&o.knobs, "--offload-optimizer", "auto");
  o.memory_budget = none.rank.peak - none.rank.optimizer / 2;
  o.host_memory_budget = 4096;  // far less than half the states
  EXPECT_EQ(dsc_plan_memory(ctx, &o, &p), DSC_ERR_USER);
  EXPECT_NE(diags(ctx).find("the host memory budget holds no more; --offload-dir DIR adds the "
                            "disk tier"),
            std::string::npos)
      << diags(ctx);
  dsc_context_free(ctx);
}

TEST(OffloadAuto, TheSearchPlansAutoAsAnOffloadChoice) {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  dsc_plan_options o = tiny_plan();
  dsc_memory_plan none;
  ASSERT_EQ(dsc_plan_memory(ctx, &o, &none), DSC_OK) << diags(ctx);
  dsc_autocfg_options ao;
  memset(&ao, 0, sizeof ao);
  ao.base = o;
  ao.base.knobs.has_zero_stage = false;
  dsc_run_knobs_set(&ao.base.knobs, "--checkpoint-activations",
                    "none");  // offload is the only way to fit
  ao.memory_budget = none.rank.peak - 50000;
  ao.rates = {100, 10, 10, 1, 0};
  dsc_autocfg_result *r = new dsc_autocfg_result;
  ASSERT_EQ(dsc_autocfg_search(ctx, &ao, r), DSC_OK) << diags(ctx);
  bool host_planned = false;
  for (int i = 0; i < r->n; i++)
    host_planned |= r->cand[i].knobs.offload_optimizer == DSC_OFFLOAD_HOST;
  // auto fits, so moving every state (host) is dominated and not planned
  EXPECT_STREQ(dsc_offload_name(r->cand[0].knobs.offload_optimizer), "auto");
  EXPECT_TRUE(r->cand[0].fits);
  EXPECT_LE(r->cand[0].plan.rank.peak, ao.memory_budget);
  EXPECT_GT(r->cand[0].plan.n_offloaded, 0);
  EXPECT_FALSE(host_planned);
  char flags[256];
  dsc_autocfg_flags(&r->cand[0], 1, flags, sizeof flags);
  EXPECT_NE(std::string(flags).find("--offload-optimizer auto"), std::string::npos) << flags;
  delete r;
  dsc_context_free(ctx);
}

}  // namespace
