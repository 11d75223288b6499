// all_reduce, reduce_scatter, all_gather and broadcast over a mesh's groups
// (the group attribute every collective start carries): on every rank of
// dp=2,ep=2, the interpreter and the compiled cpu program against the
// collective computed here over the ranks of this rank's group; a group the
// communicator has no mesh for is refused before anything starts.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "codegen/codegen.h"
#include "dsc/dsc.h"
#include "tests/unit/comm_test_util.h"

namespace {

using comm_test::Ctx;
using comm_test::op1;
using comm_test::op2;
using comm_test::run_ranks;
using comm_test::start;
using comm_test::T;

const int64_t kN = 6;  // elements per rank

double input(int rank, int64_t i) { return 0.5 + 0.125 * (double)i + (double)(rank + 1); }

// step(x f32[kN]) -> (all_reduce(x), reduce_scatter(x), all_gather(x),
// broadcast(x) from the group's rank 1), each over `group` of size gw.
dsc_module *module(dsc_context *ctx, int64_t gw, const char *group) {
  dsc_module *m = dsc_module_new(ctx, "m");
  dsc_graph *g = dsc_graph_new(m, "step");
  dsc_node *x = dsc_graph_input(g, "x", T(DSC_F32, {kN}));
  dsc_node *outs[4] = {
      op1(g, DSC_OP_ALL_REDUCE_WAIT, start(g, DSC_OP_ALL_REDUCE_START, x, gw, 1, 0, group)),
      op1(g, DSC_OP_REDUCE_SCATTER_WAIT, start(g, DSC_OP_REDUCE_SCATTER_START, x, gw, 1, 0, group)),
      op1(g, DSC_OP_ALL_GATHER_WAIT, start(g, DSC_OP_ALL_GATHER_START, x, gw, 1, 0, group)),
      op1(g, DSC_OP_BROADCAST_WAIT, start(g, DSC_OP_BROADCAST_START, x, gw, 1, 1, group))};
  for (dsc_node *o : outs)
    if (!o) return dsc_module_free(m), nullptr;
  if (dsc_graph_set_outputs(g, outs, 4) != DSC_OK || dsc_module_verify(m) != DSC_OK ||
      dsc_run_codegen_passes(m) != DSC_OK) {
    dsc_module_free(m);
    return nullptr;
  }
  return m;
}

void run_group(const char *group) {
  const int world = 4;
  Ctx outer;
  dsc_mesh_shape shape;
  ASSERT_EQ(dsc_mesh_parse(outer.ctx, "dp=2,ep=2", world, &shape), DSC_OK) << diags(outer.ctx);
  const int64_t gw = dsc_mesh_size(&shape, group);
  dsc_status st = run_ranks(outer.ctx, world, [&](dsc_comm *comm) -> dsc_status {
    int r = dsc_comm_rank(comm);
    dsc_context *ctx = dsc_comm_context(comm);
    dsc_comm_set_timeout(comm, 30);
    dsc_mesh *mesh = nullptr;
    if (dsc_mesh_new(comm, &shape, &mesh) != DSC_OK) return DSC_ERR_USER;
    dsc_comm *grp = dsc_comm_group(comm, group);
    dsc_module *m = module(ctx, gw, group);
    EXPECT_NE(m, nullptr) << diags(ctx);
    dsc_status s = m && grp ? DSC_OK : DSC_ERR_USER;
    // the world ranks of this rank's group, in group order
    std::vector<int> members;
    for (int i = 0; grp && i < gw; i++) members.push_back(dsc_comm_world_rank(grp, i));
    int me = grp ? dsc_comm_rank(grp) : 0;
    dsc_tensor *x = s == DSC_OK ? dsc_tensor_new(ctx, T(DSC_F32, {kN})) : nullptr;
    for (int64_t i = 0; x && i < kN; i++) x->data[i] = input(r, i);
    for (dsc_backend b : {DSC_BACKEND_INTERP, DSC_BACKEND_CPU}) {
      if (s != DSC_OK || !dsc_backend_available(b)) continue;
      const char *bn = b == DSC_BACKEND_CPU ? "cpu" : "interp";
      dsc_exec_options o = {b, 1, "off"};
      dsc_exec *e = nullptr;
      dsc_tensor *out[4] = {};
      const dsc_tensor *in[1] = {x};
      s = dsc_exec_new(m, &o, &e);
      if (s == DSC_OK) s = dsc_exec_set_comm(e, comm);
      if (s == DSC_OK) s = dsc_exec_run(e, "step", in, 1, out);
      EXPECT_EQ(s, DSC_OK) << bn << ": " << diags(ctx);
      for (int64_t i = 0; s == DSC_OK && i < kN; i++) {
        double sum = 0;
        for (int w : members) sum += input(w, i);
        EXPECT_DOUBLE_EQ(out[0]->data[i], sum) << bn << " all_reduce, rank " << r << " " << i;
        EXPECT_DOUBLE_EQ(out[3]->data[i], input(members[1], i)) << bn << " broadcast, rank " << r;
      }
      for (int64_t i = 0; s == DSC_OK && i < kN / gw; i++) {
        double sum = 0;
        for (int w : members) sum += input(w, me * (kN / gw) + i);
        EXPECT_DOUBLE_EQ(out[1]->data[i], sum) << bn << " reduce_scatter, rank " << r;
      }
      for (int64_t j = 0; s == DSC_OK && j < gw; j++)
        for (int64_t i = 0; i < kN; i++)
          EXPECT_DOUBLE_EQ(out[2]->data[j * kN + i], input(members[(size_t)j], i))
              << bn << " all_gather, rank " << r;
      for (dsc_tensor *t : out) dsc_tensor_free(ctx, t);
      dsc_exec_free(e);
    }
    dsc_tensor_free(ctx, x);
    dsc_module_free(m);
    dsc_mesh_free(mesh);
    return s;
  });
  EXPECT_EQ(st, DSC_OK) << diags(outer.ctx);
}

TEST(GroupCollective, OverTheDataGroupsOfAMesh) { run_group("dp"); }
TEST(GroupCollective, OverTheExpertGroupsOfAMesh) { run_group("ep"); }

// Without a mesh the group does not exist: refused before anything starts,
// on every backend, naming the axis.
TEST(GroupCollective, NoMeshIsRefused) {
  Ctx outer;
  dsc_status st = run_ranks(outer.ctx, 2, [&](dsc_comm *comm) -> dsc_status {
    dsc_context *ctx = dsc_comm_context(comm);
    dsc_module *m = module(ctx, 2, "tp");
    EXPECT_NE(m, nullptr) << diags(ctx);
    if (!m) return DSC_ERR_USER;
    dsc_tensor *x = dsc_tensor_new(ctx, T(DSC_F32, {kN}));
    for (dsc_backend b : {DSC_BACKEND_INTERP, DSC_BACKEND_CPU}) {
      if (!dsc_backend_available(b)) continue;
      dsc_exec_options o = {b, 1, "off"};
      dsc_exec *e = nullptr;
      dsc_tensor *out[4] = {};
      const dsc_tensor *in[1] = {x};
      dsc_status s = dsc_exec_new(m, &o, &e);
      if (s == DSC_OK) s = dsc_exec_set_comm(e, comm);
      if (s == DSC_OK) s = dsc_exec_run(e, "step", in, 1, out);
      EXPECT_NE(s, DSC_OK);
      EXPECT_NE(diags(ctx).find("group 'tp'"), std::string::npos) << diags(ctx);
      dsc_diag_clear(ctx);
      for (dsc_tensor *t : out) dsc_tensor_free(ctx, t);
      dsc_exec_free(e);
    }
    dsc_tensor_free(ctx, x);
    dsc_module_free(m);
    return DSC_OK;
  });
  EXPECT_EQ(st, DSC_OK) << diags(outer.ctx);
}

}  // namespace
