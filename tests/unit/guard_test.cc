// Guards (passes/guard.c, ir_node.guard, cg_instr.guarded): a value needed
// only when a bool scalar has one value is marked, prints and parses as
// ` when %c` / ` unless %c`, is checked by the verifier, and the cpu
// executor skips its instructions in the other runs while computing what
// the interpreter computes (which runs everything).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "dsc/dsc.h"
#include "ir/ir.h"
#include "passes/passes.h"
#include "tests/unit/test_util.h"

namespace {

// A toggle s (0, 1, 0, ...) gives c = s > 0.5. w changes only when c (an
// assign of where(c, u, w)), m only unless c; y is always computed; z
// reads u as the branch c takes, so u is needed only when c.
const char kToggle[] = R"(module toggle
param w: f32[64] = normal(0.5, 1.0)
state s: f32[] = zeros
state m: f32[64] = zeros
graph step(%x: f32[64]) {
  %one = const {value = 1.0, dtype = f32, shape = []} : f32[]
  %half = const {value = 0.5, dtype = f32, shape = []} : f32[]
  %s = param {name = "s"} : f32[]
  %s1 = sub(%one, %s) : f32[]
  %as = assign(%s1) {name = "s"} : f32[]
  %c = greater(%s, %half) : bool[]
  %w = param {name = "w"} : f32[64]
  %e = exp(%x) : f32[64]
  %u = mul(%e, %w) : f32[64]
  %nw = where(%c, %u, %w) : f32[64]
  %aw = assign(%nw) {name = "w"} : f32[64]
  %m = param {name = "m"} : f32[64]
  %v = add(%m, %x) : f32[64]
  %nm = where(%c, %m, %v) : f32[64]
  %am = assign(%nm) {name = "m"} : f32[64]
  %y = mul(%x, %w) : f32[64]
  %z = where(%c, %u, %y) : f32[64]
  return %y, %z
}
)";

std::string print(const dsc_module *m) {
  char *t = dsc_module_print_string(m);
  std::string s = t ? t : "";
  dsc_string_free(dsc_module_context(m), t);
  return s;
}

dsc_module *parse(dsc_context *ctx, const std::string &text) {
  dsc_module *m = nullptr;
  return dsc_module_parse(ctx, text.data(), text.size(), "g.dsir", &m) == DSC_OK ? m : nullptr;
}

// What dsc_exec_print_profile prints for graph g.
std::string profile_text(dsc_exec *e, const char *g) {
  FILE *f = tmpfile();
  if (!f) return "";
  dsc_exec_print_profile(e, g, 3, f);
  std::string s;
  rewind(f);
  char buf[512];
  while (fgets(buf, sizeof buf, f)) s += buf;
  fclose(f);
  return s;
}

// The percentage in "(guarded) ... skipped in P% of their runs"; -1 when
// the profile has no guarded instruction.
double skipped_percent(const std::string &profile) {
  size_t at = profile.find("(guarded)");
  if (at == std::string::npos) return -1;
  size_t p = profile.find("skipped in ", at);
  return p == std::string::npos ? -1 : std::atof(profile.c_str() + p + 11);
}

// A cpu executor of m (2 threads) holding params p, timing each
// instruction; nullptr on an error (in m's diagnostics).
dsc_exec *profiled_cpu_exec(dsc_module *m, const dsc_params *p) {
  dsc_exec_options o = {DSC_BACKEND_CPU, 2, nullptr};
  dsc_exec *e = nullptr;
  if (dsc_exec_new(m, &o, &e) != DSC_OK) return nullptr;
  if (dsc_exec_set_params(e, p) != DSC_OK) return dsc_exec_free(e), nullptr;
  dsc_exec_set_profiling(e, true);
  return e;
}

void clear_guards(dsc_module *m) {
  for (int i = 0; i < m->n_graphs; i++)
    for (int j = 0; j < m->graphs[i]->n_nodes; j++) m->graphs[i]->nodes[j]->guard = nullptr;
}

double max_rel(const dsc_tensor *a, const dsc_tensor *b) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < dsc_type_numel(&a->type); i++) {
    num = std::max(num, std::fabs(a->data[i] - b->data[i]));
    den = std::max(den, std::fabs(b->data[i]));
  }
  return num / (den > 0 ? den : 1);
}

TEST(Guard, MarksWhatOneValueOfAConditionNeedsAndRoundTripsAsText) {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  dsc_module *m = parse(ctx, kToggle);
  ASSERT_NE(m, nullptr) << diags(ctx);
  ASSERT_EQ(pass_guard_run(m), DSC_OK) << diags(ctx);
  ASSERT_EQ(dsc_module_verify(m), DSC_OK) << diags(ctx);
  // what each node needs, by its op and what it reads (the printer
  // renumbers the values)
  const dsc_graph *g = dsc_module_find_graph(m, "step");
  const ir_node *c = nullptr;
  for (int i = 0; i < g->n_nodes; i++)
    if (g->nodes[i]->op == DSC_OP_GREATER) c = g->nodes[i];
  ASSERT_NE(c, nullptr);
  int n_when = 0, n_unless = 0;
  for (int i = 0; i < g->n_nodes; i++) {
    const ir_node *y = g->nodes[i];
    int want = 0;  // 1: when c, -1: unless c, 0: always
    const char *name = y->op == DSC_OP_ASSIGN ? ir_attr_str(y, "name") : "";
    if (y->op == DSC_OP_EXP || (y->op == DSC_OP_MUL && y->in[0]->op == DSC_OP_EXP) ||
        (y->op == DSC_OP_WHERE && y->in[2]->op == DSC_OP_PARAM) || strcmp(name, "w") == 0)
      want = 1;  // e, u, nw, the assign of w
    if (y->op == DSC_OP_ADD || (y->op == DSC_OP_WHERE && y->in[2]->op == DSC_OP_ADD) ||
        strcmp(name, "m") == 0)
      want = -1;  // v, nm, the assign of m
    int got = !y->guard ? 0 : y->guard != c ? 9 : y->guard_if ? 1 : -1;
    EXPECT_EQ(got, want) << "node " << i << " (" << dsc_op_name(y->op) << ")\n" << print(m);
    n_when += got == 1, n_unless += got == -1;
  }
  EXPECT_EQ(n_when, 4);
  EXPECT_EQ(n_unless, 3);
  std::string t = print(m);
  EXPECT_NE(t.find(" when %"), std::string::npos) << t;
  EXPECT_NE(t.find(" unless %"), std::string::npos) << t;
  // the text form parses back to the same module, guards and all
  dsc_module *m2 = parse(ctx, t);
  ASSERT_NE(m2, nullptr) << diags(ctx) << t;
  EXPECT_EQ(print(m2), t);
  dsc_module_free(m2);
  dsc_module_free(m);
  dsc_context_free(ctx);
}

TEST(Guard, TheVerifierRejectsAGuardThatWouldSkipANeededValue) {
  struct {
    const char *from, *to, *says;
  } cases[] = {
      {"%s1 = sub(%one, %s) : f32[]", "%s1 = sub(%one, %s) : f32[]", nullptr},  // as it is
      // a value read always, computed only when c
      {"%u = mul(%e, %w) : f32[64]", "%u = mul(%e, %w) : f32[64] when %c\n  %r = add(%u, %x) : f32[64]",
       "computed only when its guard holds"},
      {"%v = add(%m, %x) : f32[64]", "%v = add(%m, %x) : f32[64] when %c",
       "computed only when its guard holds"},  // nm reads it as c's false branch
      {"%y = mul(%x, %w) : f32[64]", "%y = mul(%x, %w) : f32[64] when %c", "has a guard"},
      {"%e = exp(%x) : f32[64]", "%e = exp(%x) : f32[64] when %s", "not a bool scalar"},
      {"%w = param {name = \"w\"} : f32[64]", "%w = param {name = \"w\"} : f32[64] when %c",
       "never skipped"},
      {"%aw = assign(%nw) {name = \"w\"} : f32[64]",
       "%aw = assign(%nw) {name = \"w\"} : f32[64] unless %c", "changes the state"},
      {"%am = assign(%nm) {name = \"m\"} : f32[64]",
       "%am = assign(%nm) {name = \"m\"} : f32[64] when %c", "changes the state"},
  };
  for (const auto &k : cases) {
    dsc_context *ctx = dsc_context_new(nullptr, nullptr);
    std::string text = kToggle;
    size_t at = text.find(k.from);
    ASSERT_NE(at, std::string::npos) << k.from;
    text.replace(at, strlen(k.from), k.to);
    dsc_module *m = parse(ctx, text);
    if (!k.says) {
      EXPECT_NE(m, nullptr) << diags(ctx);
    } else {
      EXPECT_EQ(m, nullptr) << k.to;
      EXPECT_NE(diags(ctx).find(k.says), std::string::npos) << diags(ctx);
    }
    dsc_module_free(m);
    dsc_context_free(ctx);
  }
  // a guard defined after its node does not parse (an unknown value)
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  std::string text = kToggle;
  text.replace(text.find("%s1 = sub(%one, %s) : f32[]"), 27, "%s1 = sub(%one, %s) : f32[] when %c");
  EXPECT_EQ(parse(ctx, text), nullptr);
  dsc_context_free(ctx);
}

// The cpu executor over runs that toggle c: the interpreter's outputs and
// params, with the guarded half of the work skipped in each run.
TEST(Guard, TheCpuExecutorSkipsGuardedWorkAndComputesWhatTheInterpreterDoes) {
  if (!dsc_backend_available(DSC_BACKEND_CPU)) GTEST_SKIP() << "cpu backend not built";
  for (bool guarded : {true, false}) {
    dsc_context *ctx = dsc_context_new(nullptr, nullptr);
    dsc_module *m = parse(ctx, kToggle);
    ASSERT_NE(m, nullptr) << diags(ctx);
    ASSERT_EQ(pass_guard_run(m), DSC_OK) << diags(ctx);
    ASSERT_EQ(pass_fuse_run(m), DSC_OK) << diags(ctx);
    if (!guarded) clear_guards(m);
    ASSERT_EQ(dsc_module_verify(m), DSC_OK) << diags(ctx);
    dsc_params *P = dsc_params_init(m, 3), *Q = dsc_params_init(m, 3);
    dsc_exec *e = profiled_cpu_exec(m, Q);
    ASSERT_NE(e, nullptr) << diags(ctx);
    const dsc_graph *g = dsc_module_find_graph(m, "step");
    std::mt19937 rng(5);
    std::normal_distribution<double> nd(0, 0.5);
    for (int run = 0; run < 6; run++) {
      const int64_t n[1] = {64};
      dsc_tensor *x = dsc_tensor_new(ctx, dsc_type_make(DSC_F32, 1, n));
      for (int i = 0; i < 64; i++) x->data[i] = (double)(float)nd(rng);
      const dsc_tensor *in[1] = {x};
      dsc_tensor *got[2] = {nullptr, nullptr}, *want[2] = {nullptr, nullptr};
      ASSERT_EQ(dsc_exec_run(e, "step", in, 1, got), DSC_OK) << diags(ctx);
      ASSERT_EQ(dsc_interp_run(g, P, in, 1, want), DSC_OK) << diags(ctx);
      for (int k = 0; k < 2; k++) EXPECT_LT(max_rel(got[k], want[k]), 1e-6) << run << " " << k;
      for (int k = 0; k < 2; k++) dsc_tensor_free(ctx, got[k]), dsc_tensor_free(ctx, want[k]);
      dsc_tensor_free(ctx, x);
    }
    ASSERT_EQ(dsc_exec_get_params(e, Q), DSC_OK) << diags(ctx);
    for (const char *name : {"w", "m", "s"})
      EXPECT_LT(max_rel(dsc_params_find(Q, name), dsc_params_find(P, name)), 1e-6) << name;
    std::string prof = profile_text(e, "step");
    if (guarded)  // each instruction runs in the 3 runs of its value of c
      EXPECT_DOUBLE_EQ(skipped_percent(prof), 50.0) << prof;
    else
      EXPECT_EQ(skipped_percent(prof), -1) << prof;
    dsc_exec_free(e);
    dsc_params_free(P), dsc_params_free(Q);
    dsc_module_free(m);
    dsc_context_free(ctx);
  }
}

// ZenFlow on examples/mlp.dsm (update interval 2, selection every 4): the
// host's AdamW, the gradients' copies for it and its copies back run only
// at a boundary, the importance ranking only at a selection; the cpu
// executor follows the interpreter step by step while skipping them.
const std::string kMlp = std::string(DSC_SOURCE_DIR) + "/examples/mlp.dsm";

dsc_module *zenflow_step(dsc_context *ctx, bool delayed) {
  dsc_dim_binding b = {"B", 4};
  dsc_frontend_options fo = {&b, 1, false};
  dsc_module *m = nullptr;
  if (dsc_compile_file(ctx, kMlp.c_str(), &fo, &m) != DSC_OK) return nullptr;
  dsc_train_config c;
  if (dsc_train_config_from_module(m, &c) != DSC_OK) return nullptr;
  c.opt.kind = DSC_OPT_ADAMW;
  c.opt.lr = 0.01;
  c.opt.beta1 = 0.9, c.opt.beta2 = 0.95;
  c.opt.weight_decay = 0.1;
  c.offload.optimizer = DSC_OFFLOAD_HOST;
  if (delayed) {
    c.offload.delayed_update = true;
  } else {
    c.zenflow.enabled = true;
    c.zenflow.topk_ratio = 0.5;
    c.zenflow.update_interval = 2;
    c.zenflow.select_interval = 4;
    c.zenflow.warm_up = 1;
  }
  dsc_pipeline_options po = {&c, nullptr, false, nullptr, true};
  if (dsc_run_pipeline(m, &po) != DSC_OK) return dsc_module_free(m), nullptr;
  return m;
}

TEST(Guard, ZenFlowsHostUpdateAndItsCopiesRunOnlyAtABoundary) {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  dsc_module *m = zenflow_step(ctx, false);
  ASSERT_NE(m, nullptr) << diags(ctx);
  const dsc_graph *g = dsc_module_find_graph(m, "train_step");
  ASSERT_NE(g, nullptr);
  int to_device = 0, to_device_guarded = 0, host_guarded = 0, sqrt_host = 0, sqrt_guarded = 0;
  std::map<const ir_node *, int> conditions;
  for (int i = 0; i < g->n_nodes; i++) {
    const ir_node *x = g->nodes[i];
    if (x->guard) conditions[x->guard]++;
    if (x->op == DSC_OP_TO_DEVICE) to_device++, to_device_guarded += x->guard && x->guard_if;
    if (x->place == IR_PLACE_HOST && x->guard) host_guarded++;
    // AdamW's sqrt(v) on the host: the host's update (not the scalar
    // gradient norm, an output)
    if (x->op == DSC_OP_SQRT && x->place == IR_PLACE_HOST && dsc_type_numel(&x->type) > 1)
      sqrt_host++, sqrt_guarded += x->guard != nullptr;
  }
  EXPECT_GT(to_device, 0);
  EXPECT_EQ(to_device_guarded, to_device);  // every host update comes back only at a boundary
  EXPECT_GT(host_guarded, 0);
  EXPECT_EQ(sqrt_guarded, sqrt_host);
  EXPECT_GE(conditions.size(), 2u);  // the boundary and the selection
  dsc_module_free(m);
  // the delayed update: the update is skipped on the first step
  m = zenflow_step(ctx, true);
  ASSERT_NE(m, nullptr) << diags(ctx);
  g = dsc_module_find_graph(m, "train_step");
  int assigns_guarded = 0;
  for (int i = 0; i < g->n_nodes; i++)
    assigns_guarded += g->nodes[i]->op == DSC_OP_ASSIGN && g->nodes[i]->guard != nullptr;
  EXPECT_GT(assigns_guarded, 0);
  dsc_module_free(m);
  dsc_context_free(ctx);
}

TEST(Guard, ZenFlowOnTheCpuExecutorFollowsTheInterpreterWhileSkipping) {
  if (!dsc_backend_available(DSC_BACKEND_CPU)) GTEST_SKIP() << "cpu backend not built";
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  dsc_module *m = zenflow_step(ctx, false);
  ASSERT_NE(m, nullptr) << diags(ctx);
  dsc_params *P = dsc_params_init(m, 7), *Q = dsc_params_init(m, 7);
  dsc_exec *e = profiled_cpu_exec(m, Q);
  ASSERT_NE(e, nullptr) << diags(ctx);
  std::mt19937 rng(11);
  std::normal_distribution<double> nd(0, 1);
  for (int step = 0; step < 9; step++) {
    const int64_t xd[2] = {4, 32};
    dsc_tensor *x = dsc_tensor_new(ctx, dsc_type_make(DSC_F32, 2, xd));
    dsc_tensor *lab = dsc_tensor_new(ctx, dsc_type_make(DSC_I32, 1, xd));
    dsc_tensor *lr = dsc_tensor_new(ctx, dsc_type_make(DSC_F32, 0, nullptr));
    for (int i = 0; i < 4 * 32; i++) x->data[i] = (double)(float)nd(rng);
    for (int i = 0; i < 4; i++) lab->data[i] = (double)(rng() % 10);
    lr->data[0] = (double)0.01f;
    const dsc_tensor *in[3] = {x, lab, lr};
    dsc_tensor *got[2] = {nullptr, nullptr}, *want[2] = {nullptr, nullptr};
    ASSERT_EQ(dsc_exec_run_step(e, in, 3, got), DSC_OK) << diags(ctx);
    ASSERT_EQ(dsc_interp_run_step(m, P, in, 3, want), DSC_OK) << diags(ctx);
    EXPECT_LT(max_rel(got[0], want[0]), 1e-5) << "loss at step " << step;
    for (int k = 0; k < 2; k++) dsc_tensor_free(ctx, got[k]), dsc_tensor_free(ctx, want[k]);
    dsc_tensor_free(ctx, x), dsc_tensor_free(ctx, lab), dsc_tensor_free(ctx, lr);
  }
  ASSERT_EQ(dsc_exec_get_params(e, Q), DSC_OK) << diags(ctx);
  for (int i = 0; i < dsc_params_count(P); i++)
    EXPECT_LT(max_rel(dsc_params_get(Q, i), dsc_params_get(P, i)), 1e-5)
        << dsc_module_param_name(m, i);
  std::string prof = profile_text(e, "train_step");
  EXPECT_GT(skipped_percent(prof), 20.0) << prof;
  dsc_exec_free(e);
  dsc_params_free(P), dsc_params_free(Q);
  dsc_module_free(m);
  dsc_context_free(ctx);
}

}  // namespace
