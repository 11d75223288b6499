// The all_to_all_start/wait ops over the world and over a mesh's groups: the
// interpreter and the compiled cpu program on every in-process rank against
// the exchange computed here, the program's instructions naming the group,
// the shape rule, and the errors (no mesh with that axis, a group of another
// size) before anything starts.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "codegen/codegen.h"
#include "dsc/dsc.h"
#include "tests/unit/comm_test_util.h"

namespace {

using comm_test::Ctx;
using comm_test::op1;
using comm_test::op2;
using comm_test::run_ranks;
using comm_test::T;

const int64_t kRows = 2, kCols = 3;  // per chunk

// Rank r's input element i: never zero, distinct per rank.
double input(int rank, int64_t i) { return 0.25 + 0.01 * (double)i + 0.5 * rank; }

// step(x f32[G*kRows, kCols]) = tanh(w) + w, w = all_to_all(x*x + x) over group.
dsc_module *module(dsc_context *ctx, int64_t g_world, const char *group) {
  dsc_module *m = dsc_module_new(ctx, "m");
  dsc_graph *g = dsc_graph_new(m, "step");
  dsc_node *x = dsc_graph_input(g, "x", T(DSC_F32, {g_world * kRows, kCols}));
  dsc_node *h = op2(g, DSC_OP_ADD, op2(g, DSC_OP_MUL, x, x), x);
  dsc_attr a[3] = {dsc_attr_int("world", g_world), dsc_attr_int("tag", 4),
                   dsc_attr_str("group", group)};
  dsc_node *s = h ? dsc_build(g, DSC_OP_ALL_TO_ALL_START, &h, 1, a, 3) : nullptr;
  dsc_node *w = op1(g, DSC_OP_ALL_TO_ALL_WAIT, s);
  dsc_node *o = op2(g, DSC_OP_ADD, op1(g, DSC_OP_TANH, w), w);
  if (!o || dsc_graph_set_outputs(g, &o, 1) != DSC_OK || dsc_module_verify(m) != DSC_OK ||
      dsc_run_codegen_passes(m) != DSC_OK) {
    dsc_module_free(m);
    return nullptr;
  }
  return m;
}

struct Case {
  const char *mesh;   // nullptr: no mesh
  const char *group;  // the op's
};

// Runs `c` at world 4: interp and cpu on every rank, each against the
// exchange computed from the group's world ranks.
void run_case(const Case &c) {
  const int world = 4;
  Ctx outer;
  dsc_mesh_shape shape;
  ASSERT_EQ(dsc_mesh_parse(outer.ctx, c.mesh, world, &shape), DSC_OK) << diags(outer.ctx);
  int64_t gw = dsc_mesh_size(&shape, c.group);
  if (std::strcmp(c.group, "world") == 0) gw = world;
  dsc_status st = run_ranks(outer.ctx, world, [&](dsc_comm *comm) -> dsc_status {
    int r = dsc_comm_rank(comm);
    dsc_context *ctx = dsc_comm_context(comm);
    dsc_comm_set_timeout(comm, 30);
    dsc_mesh *mesh = nullptr;
    if (c.mesh && dsc_mesh_new(comm, &shape, &mesh) != DSC_OK) return DSC_ERR_USER;
    dsc_comm *grp = dsc_comm_group(comm, c.group);
    EXPECT_NE(grp, nullptr);
    dsc_module *m = module(ctx, gw, c.group);
    EXPECT_NE(m, nullptr) << diags(ctx);
    dsc_status s = m && grp ? DSC_OK : DSC_ERR_USER;
    const int64_t n = gw * kRows * kCols, chunk = kRows * kCols;
    dsc_tensor *x = s == DSC_OK ? dsc_tensor_new(ctx, T(DSC_F32, {gw * kRows, kCols})) : nullptr;
    for (int64_t i = 0; x && i < n; i++) x->data[i] = (double)(float)input(r, i);
    for (dsc_backend b : {DSC_BACKEND_INTERP, DSC_BACKEND_CPU}) {
      if (s != DSC_OK || !dsc_backend_available(b)) continue;
      dsc_exec_options o = {b, 1, "off"};
      dsc_exec *e = nullptr;
      dsc_tensor *out = nullptr;
      const dsc_tensor *in[1] = {x};
      s = dsc_exec_new(m, &o, &e);
      if (s == DSC_OK) s = dsc_exec_set_comm(e, comm);
      if (s == DSC_OK) s = dsc_exec_run(e, "step", in, 1, &out);
      EXPECT_EQ(s, DSC_OK) << diags(ctx);
      // Chunk i comes from the group's rank i: its chunk for this rank's group rank.
      int me = dsc_comm_rank(grp);
      for (int64_t i = 0; s == DSC_OK && i < gw; i++) {
        int from = dsc_comm_world_rank(grp, (int)i);
        for (int64_t k = 0; k < chunk; k++) {
          double v = (double)(float)input(from, me * chunk + k);
          float h = (float)v * (float)v + (float)v;
          double want = std::tanh((double)h) + (double)h;
          EXPECT_NEAR(out->data[i * chunk + k], want, 1e-6 * std::fabs(want))
              << (b == DSC_BACKEND_CPU ? "cpu" : "interp") << " rank " << r << " chunk " << i;
        }
      }
      dsc_tensor_free(ctx, out);
      dsc_exec_free(e);
    }
    dsc_tensor_free(ctx, x);
    dsc_module_free(m);
    dsc_mesh_free(mesh);
    return s;
  });
  EXPECT_EQ(st, DSC_OK) << diags(outer.ctx);
}

TEST(AllToAllOp, OverTheWorld) { run_case({nullptr, "world"}); }
TEST(AllToAllOp, OverTheExpertGroupsOfAMesh) { run_case({"dp=2,ep=2", "ep"}); }
TEST(AllToAllOp, OverTheDataGroupsOfAMesh) { run_case({"dp=2,ep=2", "dp"}); }

// The gradient through all_to_all is the exchange of the gradient: on every
// rank of dp=2,ep=2, d/dx of the job's total loss sum_r sum(tanh(a2a(x_r^2))
// * R_r) over the ep group (and over the world) against central differences
// in f64, each perturbation made on one rank and every rank's loss summed.
// With shard, local_shard over the group takes the exchange's place: the
// loss reads this rank's chunk of x*x (the expert-parallel pass's param
// blocks), whose gradient is dy at the chunk and zeros elsewhere. With
// reduce, an all_reduce over the group takes it (tensor parallelism's sum of
// partial products), whose gradient is the all_reduce of the gradient; with
// gather, an all_gather and then a reduce_scatter (the vocabulary-parallel
// loss's gather), adjoints of each other.
enum Through { kExchange, kShard, kReduce, kGather };
void gradient_case(const char *group, int64_t gw, Through through = kExchange) {
  const bool shard = through == kShard;
  const int world = 4;
  Ctx outer;
  dsc_mesh_shape shape;
  ASSERT_EQ(dsc_mesh_parse(outer.ctx, "dp=2,ep=2", world, &shape), DSC_OK);
  dsc_status st = run_ranks(outer.ctx, world, [&](dsc_comm *comm) -> dsc_status {
    int r = dsc_comm_rank(comm);
    dsc_context *ctx = dsc_comm_context(comm);
    dsc_comm_set_timeout(comm, 30);
    dsc_mesh *mesh = nullptr;
    if (dsc_mesh_new(comm, &shape, &mesh) != DSC_OK) return DSC_ERR_USER;
    dsc_module *m = dsc_module_new(ctx, "m");
    dsc_init init = {DSC_INIT_ZEROS, 0, 0, NULL};
    const int64_t n = gw * kRows * kCols;
    dsc_type tx = T(DSC_F64, {gw * kRows, kCols}), tr = shard ? T(DSC_F64, {n / gw}) : tx;
    dsc_module_add_param(m, "x", tx, init);
    dsc_graph *g = dsc_graph_new(m, "f");
    dsc_node *x = dsc_param_ref(g, "x"), *rr = dsc_graph_input(g, "r", tr);
    dsc_attr a[3] = {dsc_attr_int("world", gw), dsc_attr_int("tag", 0),
                     dsc_attr_str("group", group)};
    dsc_node *sq = op2(g, DSC_OP_MUL, x, x), *ex;
    if (shard) {
      dsc_attr ls[2] = {dsc_attr_int("world", gw), dsc_attr_str("group", group)};
      dsc_node *flat = dsc_reshape(g, sq, &n, 1);
      ex = flat ? dsc_build(g, DSC_OP_LOCAL_SHARD, &flat, 1, ls, 2) : nullptr;
    } else if (through == kGather) {  // x*x gathered [gw*gw*kRows, kCols], tanh, summed back
      dsc_node *all =
          op1(g, DSC_OP_ALL_GATHER_WAIT, dsc_build(g, DSC_OP_ALL_GATHER_START, &sq, 1, a, 3));
      dsc_node *t = op1(g, DSC_OP_TANH, all);
      ex = op1(g, DSC_OP_REDUCE_SCATTER_WAIT,
               t ? dsc_build(g, DSC_OP_REDUCE_SCATTER_START, &t, 1, a, 3) : nullptr);
    } else if (through == kReduce) {
      ex = op1(g, DSC_OP_ALL_REDUCE_WAIT, dsc_build(g, DSC_OP_ALL_REDUCE_START, &sq, 1, a, 3));
    } else {
      ex = op1(g, DSC_OP_ALL_TO_ALL_WAIT, dsc_build(g, DSC_OP_ALL_TO_ALL_START, &sq, 1, a, 3));
    }
    int64_t axes[2] = {0, 1};
    dsc_node *loss = dsc_reduce(g, DSC_OP_SUM, op2(g, DSC_OP_MUL, op1(g, DSC_OP_TANH, ex), rr),
                                axes, shard ? 1 : 2, 0);
    dsc_status s = loss ? dsc_graph_set_outputs(g, &loss, 1) : DSC_ERR_USER;
    if (s == DSC_OK) s = dsc_autodiff(m, "f");
    if (s == DSC_OK) s = dsc_module_verify(m);
    EXPECT_EQ(s, DSC_OK) << diags(ctx);
    dsc_params *P = s == DSC_OK ? dsc_params_init(m, 1) : nullptr;
    dsc_tensor *R = dsc_tensor_new(ctx, tr);
    for (int64_t i = 0; P && i < n; i++) dsc_params_get(P, 0)->data[i] = input(r, i) - 0.5;
    for (int64_t i = 0; i < dsc_type_numel(&tr); i++)
      R->data[i] = std::cos(1.0 + (double)(r * n + i));
    dsc_interp_options io = {comm};
    const dsc_tensor *in[1] = {R};
    // The job's total loss, and this rank's gradient.
    auto total = [&](std::vector<double> *grad) -> double {
      dsc_tensor *out[2] = {nullptr, nullptr};
      double l = NAN, tot = NAN;
      if (dsc_interp_run_with(g, P, in, 1, out, &io) == DSC_OK) {
        l = out[0]->data[0];
        if (grad) grad->assign(out[1]->data, out[1]->data + n);
      }
      for (dsc_tensor *t : out) dsc_tensor_free(ctx, t);
      if (dsc_comm_all_reduce(comm, &l, &tot, 1, DSC_F64, DSC_COMM_SUM, 0) != DSC_OK) return NAN;
      return tot;
    };
    std::vector<double> grad;
    if (P) total(&grad);
    const double h = 1e-6;
    for (int q = 0; P && q < world; q++)
      for (int64_t i = 0; i < n; i += 5) {  // every rank takes part in every evaluation
        double *v = &dsc_params_get(P, 0)->data[i], keep = *v;
        if (r == q) *v = keep + h;
        double lp = total(nullptr);
        if (r == q) *v = keep - h;
        double lm = total(nullptr);
        if (r == q) {
          *v = keep;
          double fd = (lp - lm) / (2 * h);
          EXPECT_NEAR(grad[i], fd, 1e-6 * std::max(1.0, std::fabs(fd)))
              << group << ": rank " << r << " element " << i;
        }
      }
    dsc_tensor_free(ctx, R);
    dsc_params_free(P);
    dsc_module_free(m);
    dsc_mesh_free(mesh);
    return s;
  });
  EXPECT_EQ(st, DSC_OK) << diags(outer.ctx);
}

TEST(AllToAllOp, GradientOverAGroupIsTheExchangeOfTheGradient) { gradient_case("ep", 2); }
TEST(AllToAllOp, GradientOverTheWorldIsTheExchangeOfTheGradient) { gradient_case("world", 4); }
TEST(AllToAllOp, LocalShardGradientIsTheChunkOverAGroup) { gradient_case("ep", 2, kShard); }
TEST(AllToAllOp, LocalShardGradientIsTheChunkOverTheWorld) { gradient_case("world", 4, kShard); }
TEST(AllToAllOp, AllReduceGradientIsTheSumOfTheGradientOverAGroup) {
  gradient_case("ep", 2, kReduce);
}
TEST(AllToAllOp, AllReduceGradientIsTheSumOfTheGradientOverTheWorld) {
  gradient_case("world", 4, kReduce);
}
TEST(AllToAllOp, AllGatherAndReduceScatterGradientsAreEachOthersOverAGroup) {
  gradient_case("ep", 2, kGather);
}

TEST(AllToAllOp, TheProgramNamesTheGroupAndTheShapeRuleChecksIt) {
  Ctx ctx;
  dsc_module *m = module(ctx.ctx, 2, "ep");
  ASSERT_NE(m, nullptr) << diags(ctx.ctx);
  ir_arena arena;
  ir_arena_init(&arena, ctx.ctx);
  cg_program *p = nullptr;
  ASSERT_EQ(cg_lower_graph(dsc_module_find_graph(m, "step"), &arena, &p), DSC_OK) << diags(ctx.ctx);
  int starts = 0;
  for (int i = 0; i < p->n_instrs; i++)
    if (p->instrs[i].kind == CG_INS_COLLECTIVE_START) {
      starts++;
      EXPECT_EQ(p->instrs[i].coll.kind, CG_COLL_ALL_TO_ALL);
      EXPECT_STREQ(p->instrs[i].coll.group, "ep");
      EXPECT_EQ(p->instrs[i].coll.count, kRows * kCols);  // per peer
    }
  EXPECT_EQ(starts, 1);
  std::string text = cg_program_print(&arena, p);
  EXPECT_NE(text.find("all_to_all_start #0 "), std::string::npos) << text;
  EXPECT_NE(text.find(" f32 count=6 world=2 tag=4 group=ep\n"), std::string::npos) << text;
  ir_arena_release(&arena);
  dsc_module_free(m);
  // An unknown group, and dim 0 not divisible by the world.
  for (const char *g : {"xp", ""}) {
    dsc_diag_clear(ctx.ctx);
    EXPECT_EQ(module(ctx.ctx, 2, g), nullptr);
    EXPECT_NE(diags(ctx.ctx).find("is not a communicator (world, dp, ep, sp, tp)"),
              std::string::npos)
        << diags(ctx.ctx);
  }
  dsc_module *m3 = dsc_module_new(ctx.ctx, "m");
  dsc_graph *g = dsc_graph_new(m3, "step");
  dsc_node *x = dsc_graph_input(g, "x", T(DSC_F32, {5, 2}));
  dsc_attr a[3] = {dsc_attr_int("world", 2), dsc_attr_int("tag", 0), dsc_attr_str("group", "ep")};
  dsc_diag_clear(ctx.ctx);
  EXPECT_EQ(dsc_build(g, DSC_OP_ALL_TO_ALL_START, &x, 1, a, 3), nullptr);
  EXPECT_NE(diags(ctx.ctx).find("dim 0 (5) is not divisible by world 2"), std::string::npos)
      << diags(ctx.ctx);
  dsc_module_free(m3);
}

TEST(AllToAllOp, AGroupTheCommunicatorLacksOrOfAnotherSizeFailsBeforeAnythingStarts) {
  for (dsc_backend b : {DSC_BACKEND_INTERP, DSC_BACKEND_CPU}) {
    if (!dsc_backend_available(b)) continue;
    for (bool with_mesh : {false, true}) {
      Ctx outer;
      std::string msg0;
      dsc_status st = run_ranks(outer.ctx, 4, [&](dsc_comm *comm) -> dsc_status {
        dsc_context *ctx = dsc_comm_context(comm);
        dsc_mesh_shape shape;
        dsc_mesh *mesh = nullptr;
        if (with_mesh && (dsc_mesh_parse(ctx, "dp=2,ep=2", 4, &shape) != DSC_OK ||
                          dsc_mesh_new(comm, &shape, &mesh) != DSC_OK))
          return DSC_ERR_USER;
        dsc_module *m = module(ctx, 4, "ep");  // ep has 2 ranks, not 4
        dsc_exec_options o = {b, 1, "off"};
        dsc_exec *e = nullptr;
        dsc_tensor *x = dsc_tensor_new(ctx, T(DSC_F32, {4 * kRows, kCols}));
        for (int64_t i = 0; i < 4 * kRows * kCols; i++) x->data[i] = 1;
        const dsc_tensor *in[1] = {x};
        dsc_tensor *out = nullptr;
        dsc_status s = m ? dsc_exec_new(m, &o, &e) : DSC_ERR_USER;
        if (s == DSC_OK) dsc_exec_set_comm(e, comm);
        if (s == DSC_OK) s = dsc_exec_run(e, "step", in, 1, &out);
        if (dsc_comm_rank(comm) == 0) msg0 = diags(ctx);
        EXPECT_FALSE(dsc_comm_broken(comm));  // refused before any collective started
        dsc_tensor_free(ctx, out);
        dsc_tensor_free(ctx, x);
        dsc_exec_free(e);
        dsc_module_free(m);
        dsc_mesh_free(mesh);
        return s == DSC_OK ? DSC_ERR_INTERNAL : DSC_OK;  // the refusal is the expected result
      });
      EXPECT_EQ(st, DSC_OK) << diags(outer.ctx);
      const char *want = with_mesh ? "has world 4 but its group 'ep' has 2"
                                   : "runs over group 'ep', but the communicator has no mesh";
      EXPECT_NE(msg0.find(want), std::string::npos)
          << (b == DSC_BACKEND_CPU ? "cpu: " : "interp: ") << msg0;
    }
  }
}

}  // namespace
