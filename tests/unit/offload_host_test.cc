// Host-side work (passes/offload_host.c, ir/transfer_ops.c, the host work
// arena of codegen/lower.c and runtime/exec_cpu.c): to_host / to_device are
// identity copies that print, parse and lower to COPY instructions between
// the device WORK arena and the host work arena; the host optimizer step
// places the update on the host with the copies at the tier boundaries and
// computes the same values.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "codegen/codegen.h"
#include "dsc/dsc.h"
#include "passes/passes.h"
#include "tests/unit/test_util.h"

namespace {

dsc_type T(dsc_dtype dt, std::vector<int64_t> dims) {
  dsc_type t;
  memset(&t, 0, sizeof t);
  t.dtype = dt;
  t.rank = (int)dims.size();
  for (size_t i = 0; i < dims.size(); i++) t.dims[i] = dims[i];
  return t;
}

dsc_tensor *random_tensor(dsc_context *ctx, dsc_type t, unsigned seed) {
  dsc_tensor *x = dsc_tensor_new(ctx, t);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> d(0.5, 1.5);  // never zero
  for (int64_t i = 0; i < dsc_type_numel(&t); i++) x->data[i] = (float)d(rng);
  return x;
}

std::string print(dsc_module *m) {
  char *t = dsc_module_print_string(m);
  std::string s = t ? t : "";
  dsc_string_free(m->ctx, t);
  return s;
}

// x -> y = x*x (device) -> h = to_host(y) -> z = h + h (host) -> d =
// to_device(z) -> e = d * x (device); outputs e and z.
dsc_module *transfer_module(dsc_context *ctx) {
  dsc_module *m = dsc_module_new(ctx, "m");
  dsc_graph *g = dsc_graph_new(m, "g");
  dsc_node *x = dsc_graph_input(g, "x", T(DSC_F32, {16, 8}));
  dsc_node *y = dsc_binary(g, DSC_OP_MUL, x, x);
  dsc_node *h = dsc_build(g, DSC_OP_TO_HOST, &y, 1, nullptr, 0);
  dsc_node *z = dsc_binary(g, DSC_OP_ADD, h, h);
  if (!z) return nullptr;
  h->place = z->place = IR_PLACE_HOST;
  dsc_node *d = dsc_build(g, DSC_OP_TO_DEVICE, &z, 1, nullptr, 0);
  dsc_node *e = dsc_binary(g, DSC_OP_MUL, d, x);
  dsc_node *outs[2] = {e, z};
  if (!e || dsc_graph_set_outputs(g, outs, 2) != DSC_OK) return nullptr;
  return m;
}

// Graph g of m (input [16, 8], two outputs of 128 values) run by the cpu
// backend on inputs of seeds first..last gives the interpreter's values
// exactly, run after run (one executor).
void cpu_runs_as_interp(dsc_context *ctx, dsc_module *m, const dsc_graph *g, unsigned first,
                        unsigned last) {
  if (!dsc_backend_available(DSC_BACKEND_CPU)) return;
  dsc_exec_options o = {DSC_BACKEND_CPU, 2, nullptr};
  dsc_exec *e = nullptr;
  ASSERT_EQ(dsc_exec_new(m, &o, &e), DSC_OK) << diags(ctx);
  for (unsigned seed = first; seed <= last; seed++) {
    dsc_tensor *x = random_tensor(ctx, T(DSC_F32, {16, 8}), seed);
    const dsc_tensor *in[1] = {x};
    dsc_tensor *got[2] = {nullptr, nullptr}, *want[2] = {nullptr, nullptr};
    ASSERT_EQ(dsc_exec_run(e, "g", in, 1, got), DSC_OK) << diags(ctx);
    ASSERT_EQ(dsc_interp_run(g, nullptr, in, 1, want), DSC_OK) << diags(ctx);
    for (int k = 0; k < 2; k++)
      for (int i = 0; i < 128; i++) EXPECT_EQ(got[k]->data[i], want[k]->data[i]) << k << " " << i;
    for (int k = 0; k < 2; k++) dsc_tensor_free(ctx, got[k]), dsc_tensor_free(ctx, want[k]);
    dsc_tensor_free(ctx, x);
  }
  dsc_exec_free(e);
}

TEST(OffloadHost, TransfersAreIdentityCopiesThatPrintWithPlacementAndParseBack) {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  dsc_module *m = transfer_module(ctx);
  ASSERT_NE(m, nullptr) << diags(ctx);
  ASSERT_EQ(dsc_module_verify(m), DSC_OK) << diags(ctx);
  std::string s1 = print(m);
  EXPECT_NE(s1.find("= to_host(%"), std::string::npos) << s1;
  EXPECT_NE(s1.find("= to_device(%"), std::string::npos) << s1;
  EXPECT_NE(s1.find(": f32[16,8] host\n"), std::string::npos) << s1;  // z and to_host
  dsc_module *m2 = nullptr;
  ASSERT_EQ(dsc_module_parse(ctx, s1.data(), s1.size(), "t.dsir", &m2), DSC_OK) << diags(ctx) << s1;
  EXPECT_EQ(print(m2), s1);
  const dsc_graph *g2 = dsc_module_find_graph(m2, "g");
  int n_host = 0;
  for (int i = 0; i < g2->n_nodes; i++) n_host += g2->nodes[i]->place == IR_PLACE_HOST;
  EXPECT_EQ(n_host, 2);  // to_host's result and z; to_device's is the device's
  // the interpreter: the copies change nothing
  dsc_tensor *x = random_tensor(ctx, T(DSC_F32, {16, 8}), 7);
  const dsc_tensor *in[1] = {x};
  dsc_tensor *out[2] = {nullptr, nullptr};
  ASSERT_EQ(dsc_interp_run(g2, nullptr, in, 1, out), DSC_OK) << diags(ctx);
  for (int i = 0; i < 128; i++) {
    double v = x->data[i];
    EXPECT_DOUBLE_EQ(out[1]->data[i], (float)(2 * (float)(v * v)));
    EXPECT_DOUBLE_EQ(out[0]->data[i], (float)(out[1]->data[i] * v));
  }
  dsc_tensor_free(ctx, out[0]), dsc_tensor_free(ctx, out[1]), dsc_tensor_free(ctx, x);
  // a transfer takes exactly one input
  dsc_graph *g3 = dsc_graph_new(m2, "bad");
  dsc_node *a = dsc_graph_input(g3, "a", T(DSC_F32, {2}));
  dsc_node *two[2] = {a, a};
  EXPECT_EQ(dsc_build(g3, DSC_OP_TO_HOST, two, 2, nullptr, 0), nullptr);
  dsc_module_free(m2);
  dsc_module_free(m);
  dsc_context_free(ctx);
}

TEST(OffloadHost, LoweringPutsHostValuesInTheHostWorkArenaAndTheCpuRunsThem) {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  dsc_module *m = transfer_module(ctx);
  ASSERT_NE(m, nullptr) << diags(ctx);
  ASSERT_EQ(pass_fuse_run(m), DSC_OK) << diags(ctx);
  const dsc_graph *g = dsc_module_find_graph(m, "g");
  ir_arena a;
  ir_arena_init(&a, ctx);
  cg_program *p = nullptr;
  ASSERT_EQ(cg_lower_graph(g, &a, &p), DSC_OK) << diags(ctx);
  int copies = 0;
  for (int i = 0; i < p->n_instrs; i++) {
    const cg_instr *in = &p->instrs[i];
    if (in->kind != CG_INS_COPY) continue;
    copies++;
    bool to_host = std::string(in->op) == dsc_op_name(DSC_OP_TO_HOST);
    EXPECT_EQ(p->buffers[in->src].tier, to_host ? CG_TIER_DEVICE : CG_TIER_HOST);
    EXPECT_EQ(p->buffers[in->dst].tier, to_host ? CG_TIER_HOST : CG_TIER_DEVICE);
    EXPECT_EQ(in->numel, 128);
  }
  EXPECT_EQ(copies, 2);
  // h and z (512 bytes each, both live at z's kernel) in the host arena; the
  // device's WORK arena holds x, y, d, e
  EXPECT_EQ(p->host_work_bytes, 1024);
  int64_t host_bytes = 0;
  for (int b = 0; b < p->n_buffers; b++)
    if (p->buffers[b].tier == CG_TIER_HOST) host_bytes += 512;
  EXPECT_EQ(host_bytes, 1024);
  cg_memplan plan;
  ASSERT_EQ(cg_memplan_program(g, p, nullptr, &plan), DSC_OK) << diags(ctx);
  EXPECT_EQ(plan.host_work, 1024);
  EXPECT_EQ(plan.host_bytes, 1024);
  EXPECT_EQ(plan.work_arena, p->arena_bytes[CG_ARENA_WORK]);
  ir_arena_release(&a);
  cpu_runs_as_interp(ctx, m, g, 11, 11);
  dsc_module_free(m);
  dsc_context_free(ctx);
}

// A miniature train_step: w (device param), s (host-tier state); the
// gradient gr = x * w (role GRAD); loss = sum(x * w); s' = 0.9 s + gr;
// w' = w - lr * s'; assigns w and s; outputs loss and |s'|^2.
dsc_module *step_module(dsc_context *ctx) {
  dsc_module *m = dsc_module_new(ctx, "step");
  dsc_init ones = {DSC_INIT_NORMAL, 0.5, 1.0, NULL};
  if (dsc_module_add_param(m, "w", T(DSC_F32, {32}), ones) != DSC_OK ||
      dsc_module_add_state(m, "s", T(DSC_F32, {32}), ones) != DSC_OK ||
      dsc_module_set_meta(m, "tier.s", "host") != DSC_OK)
    return nullptr;
  dsc_graph *g = dsc_graph_new(m, "train_step");
  dsc_node *x = dsc_graph_input(g, "x", T(DSC_F32, {32}));
  dsc_node *lr = dsc_graph_input(g, "lr", T(DSC_F32, {}));
  dsc_node *w = dsc_param_ref(g, "w");
  dsc_node *gr = dsc_binary(g, DSC_OP_MUL, x, w);
  int64_t ax[1] = {0};
  dsc_node *loss = dsc_reduce(g, DSC_OP_SUM, gr, ax, 1, false);
  if (!loss) return nullptr;
  gr->role = IR_ROLE_GRAD;
  dsc_node *s = dsc_param_ref(g, "s");
  dsc_node *s2 = dsc_binary(g, DSC_OP_ADD, dsc_binary(g, DSC_OP_MUL, s, dsc_const(g, 0.9, T(DSC_F32, {}))), gr);
  dsc_node *w2 = dsc_binary(g, DSC_OP_SUB, w, dsc_binary(g, DSC_OP_MUL, lr, s2));
  dsc_node *sq = dsc_reduce(g, DSC_OP_SUM, dsc_binary(g, DSC_OP_MUL, s2, s2), ax, 1, false);
  dsc_attr an = {};
  an.key = "name", an.kind = DSC_ATTR_STR, an.u.s = "w";
  dsc_node *a1 = dsc_build(g, DSC_OP_ASSIGN, &w2, 1, &an, 1);
  an.u.s = "s";
  dsc_node *a2 = dsc_build(g, DSC_OP_ASSIGN, &s2, 1, &an, 1);
  dsc_node *outs[2] = {loss, sq};
  if (!a1 || !a2 || dsc_graph_set_outputs(g, outs, 2) != DSC_OK) return nullptr;
  return m;
}

void run_step(dsc_module *m, std::vector<double> *outs, std::vector<double> *params) {
  dsc_context *ctx = m->ctx;
  dsc_params *ps = dsc_params_init(m, 3);
  dsc_tensor *x = random_tensor(ctx, T(DSC_F32, {32}), 5);
  dsc_tensor *lr = dsc_tensor_new(ctx, T(DSC_F32, {}));
  lr->data[0] = 0.125;
  const dsc_tensor *in[2] = {x, lr};
  dsc_tensor *out[2] = {nullptr, nullptr};
  ASSERT_EQ(dsc_interp_run(dsc_module_find_graph(m, "train_step"), ps, in, 2, out), DSC_OK)
      << diags(ctx);
  for (int k = 0; k < 2; k++) outs->push_back(out[k]->data[0]), dsc_tensor_free(ctx, out[k]);
  for (int i = 0; i < dsc_params_count(ps); i++) {
    dsc_tensor *t = dsc_params_get(ps, i);
    for (int64_t j = 0; j < dsc_type_numel(&t->type); j++) params->push_back(t->data[j]);
  }
  dsc_tensor_free(ctx, x), dsc_tensor_free(ctx, lr);
  dsc_params_free(ps);
}

TEST(OffloadHost, OptimizerStepRunsOnTheHostBetweenCopiesAndComputesTheSame) {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  dsc_module *m = step_module(ctx);
  ASSERT_NE(m, nullptr) << diags(ctx);
  ASSERT_EQ(dsc_module_verify(m), DSC_OK) << diags(ctx);
  std::vector<double> o0, p0, o1, p1;
  run_step(m, &o0, &p0);
  ASSERT_EQ(pass_offload_host_run(m, nullptr), DSC_OK) << diags(ctx);
  ASSERT_EQ(dsc_module_verify(m), DSC_OK) << diags(ctx);
  std::string s = print(m);
  const dsc_graph *g = dsc_module_find_graph(m, "train_step");
  int to_host = 0, to_device = 0;
  for (int i = 0; i < g->n_nodes; i++) {
    const ir_node *x = g->nodes[i];
    if (x->op == DSC_OP_TO_HOST) {
      to_host++;
      EXPECT_EQ(x->place, IR_PLACE_HOST);
      // the gradient's copy comes right after the gradient
      if (x->in[0]->role == IR_ROLE_GRAD) {
        EXPECT_EQ(x->in[0]->id, i - 1) << s;
      }
    }
    if (x->op == DSC_OP_TO_DEVICE) {
      to_device++;
      EXPECT_EQ(x->place, IR_PLACE_DEVICE);
    }
    if (x->op == DSC_OP_ASSIGN) {
      bool dev = std::string(ir_attr_str(x, "name")) == "w";
      // the device param gets its value back with to_device; the host state directly
      EXPECT_EQ(x->in[0]->op == DSC_OP_TO_DEVICE, dev) << s;
      if (!dev) {
        EXPECT_EQ(x->in[0]->place, IR_PLACE_HOST) << s;
      }
    }
    if (x->role == IR_ROLE_GRAD) {
      EXPECT_EQ(x->place, 0);
    }
    if (x->op == DSC_OP_SUB) {
      EXPECT_EQ(x->place, IR_PLACE_HOST) << s;  // the update
    }
  }
  EXPECT_EQ(to_host, 3) << s;  // the gradient, w and lr
  EXPECT_EQ(to_device, 1) << s;
  EXPECT_EQ(g->outputs[0]->place, IR_PLACE_DEVICE);  // the loss
  EXPECT_EQ(g->outputs[1]->place, IR_PLACE_HOST);    // computed from the host copies
  run_step(m, &o1, &p1);
  EXPECT_EQ(o0, o1);
  EXPECT_EQ(p0, p1);
  dsc_module_free(m);
  dsc_context_free(ctx);
}

// With meta offload.overlap (--offload-overlap, the default), the host's
// kernels and the copies back go to the CPU executor's host stream; the copy
// out of a device temporary stays on the executor's thread; the numbers are
// those of the interpreter, run after run.
TEST(OffloadHost, OverlapPutsHostWorkOnTheHostStreamAndComputesTheSame) {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  dsc_module *m = transfer_module(ctx);
  ASSERT_NE(m, nullptr) << diags(ctx);
  ASSERT_EQ(dsc_module_set_meta(m, "offload.overlap", "true"), DSC_OK);
  ASSERT_EQ(pass_fuse_run(m), DSC_OK) << diags(ctx);
  const dsc_graph *g = dsc_module_find_graph(m, "g");
  ir_arena a;
  ir_arena_init(&a, ctx);
  cg_program *p = nullptr;
  ASSERT_EQ(cg_lower_graph(g, &a, &p), DSC_OK) << diags(ctx);
  int streamed = 0;
  for (int i = 0; i < p->n_instrs; i++) {
    const cg_instr *in = &p->instrs[i];
    bool out_of_device = in->kind == CG_INS_COPY && std::string(in->op) == "to_host";
    bool host = in->kind == CG_INS_COPY ? !out_of_device
                                        : p->buffers[in->args[0]].tier == CG_TIER_HOST ||
                                              p->buffers[in->args[in->n_args - 1]].tier ==
                                                  CG_TIER_HOST;
    EXPECT_EQ(in->host_stream, host) << i << " " << in->op;
    streamed += in->host_stream;
  }
  EXPECT_EQ(streamed, 2);  // z = h + h and to_device(z)
  char *text = cg_program_print(&a, p);
  ASSERT_NE(text, nullptr);
  EXPECT_NE(std::string(text).find(": host copy"), std::string::npos) << text;
  // the stream's host buffers are not reused before the program's end
  for (int b = 0; b < p->n_buffers; b++)
    if (p->buffers[b].tier == CG_TIER_HOST && p->buffers[b].kind == CG_BUF_TEMP) {
      EXPECT_EQ(p->buffers[b].last_use, p->n_instrs);
    }
  ir_arena_release(&a);
  cpu_runs_as_interp(ctx, m, g, 1, 20);
  dsc_module_free(m);
  dsc_context_free(ctx);
}

// With overlap the host's update goes right after the gradient it reads,
// and the updated param comes back as soon as the device no longer reads
// the param: here before the loss's sum, which reads only the gradient.
TEST(OffloadHost, OverlapOrdersTheHostUpdateEarlyAndBringsTheParamBackEarly) {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  dsc_module *m = step_module(ctx);
  ASSERT_NE(m, nullptr) << diags(ctx);
  std::vector<double> o0, p0, o1, p1;
  run_step(m, &o0, &p0);
  ASSERT_EQ(dsc_module_set_meta(m, "offload.overlap", "true"), DSC_OK);
  ASSERT_EQ(pass_offload_host_run(m, nullptr), DSC_OK) << diags(ctx);
  ASSERT_EQ(dsc_module_verify(m), DSC_OK) << diags(ctx);
  std::string s = print(m);
  const dsc_graph *g = dsc_module_find_graph(m, "train_step");
  int back = -1, loss = g->outputs[0]->id, update = -1;
  for (int i = 0; i < g->n_nodes; i++) {
    if (g->nodes[i]->op == DSC_OP_TO_DEVICE) back = i;
    if (g->nodes[i]->op == DSC_OP_SUB) update = i;
  }
  ASSERT_GE(back, 0) << s;
  EXPECT_LT(update, loss) << s;
  EXPECT_LT(back, loss) << s;
  run_step(m, &o1, &p1);
  EXPECT_EQ(o0, o1);
  EXPECT_EQ(p0, p1);
  if (dsc_backend_available(DSC_BACKEND_CPU)) {
    ASSERT_EQ(pass_fuse_run(m), DSC_OK) << diags(ctx);
    dsc_exec_options o = {DSC_BACKEND_CPU, 2, nullptr};
    dsc_exec *e = nullptr;
    ASSERT_EQ(dsc_exec_new(m, &o, &e), DSC_OK) << diags(ctx);
    dsc_params *ps = dsc_params_init(m, 3);
    ASSERT_EQ(dsc_exec_set_params(e, ps), DSC_OK) << diags(ctx);
    dsc_tensor *x = random_tensor(ctx, T(DSC_F32, {32}), 5);
    dsc_tensor *lr = dsc_tensor_new(ctx, T(DSC_F32, {}));
    lr->data[0] = 0.125;
    const dsc_tensor *in[2] = {x, lr};
    dsc_tensor *out[2] = {nullptr, nullptr};
    ASSERT_EQ(dsc_exec_run(e, "train_step", in, 2, out), DSC_OK) << diags(ctx);
    EXPECT_NEAR(out[0]->data[0], o0[0], 1e-4 * std::fabs(o0[0]));
    EXPECT_NEAR(out[1]->data[0], o0[1], 1e-4 * std::fabs(o0[1]));
    ASSERT_EQ(dsc_exec_get_params(e, ps), DSC_OK) << diags(ctx);
    size_t k = 0;
    for (int i = 0; i < dsc_params_count(ps); i++) {
      dsc_tensor *t = dsc_params_get(ps, i);
      for (int64_t j = 0; j < dsc_type_numel(&t->type); j++, k++)
        EXPECT_NEAR(t->data[j], p0[k], 1e-5 * std::fabs(p0[k]) + 1e-6) << i << " " << j;
    }
    for (int q = 0; q < 2; q++) dsc_tensor_free(ctx, out[q]);
    dsc_tensor_free(ctx, x), dsc_tensor_free(ctx, lr);
    dsc_params_free(ps);
    dsc_exec_free(e);
  }
  dsc_module_free(m);
  dsc_context_free(ctx);
}

}  // namespace
