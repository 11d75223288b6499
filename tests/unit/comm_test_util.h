// Shared by the tests that run ranks (comm_test.cc, collective_test.cc,
// exec_collective_test.cc, nccl_test.cc, program_verify_test.cc): a context, the shorthands that
// build collective graphs, and running a lambda on every in-process rank.
#ifndef DSC_COMM_TEST_UTIL_H
#define DSC_COMM_TEST_UTIL_H

#include <functional>
#include <string>
#include <vector>

#include "dsc/comm.h"
#include "tests/unit/test_util.h"

namespace comm_test {

struct Ctx {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  ~Ctx() { dsc_context_free(ctx); }
};

// Graph building shorthands of the collective graphs.
inline dsc_type T(dsc_dtype dt, std::vector<int64_t> dims) {
  return dsc_type_make(dt, (int)dims.size(), dims.data());
}
inline dsc_node *op1(dsc_graph *g, dsc_op op, dsc_node *x) {
  return dsc_build(g, op, &x, 1, nullptr, 0);
}
inline dsc_node *op2(dsc_graph *g, dsc_op op, dsc_node *x, dsc_node *y) {
  dsc_node *in[2] = {x, y};
  return dsc_build(g, op, in, 2, nullptr, 0);
}
inline dsc_node *start(dsc_graph *g, dsc_op op, dsc_node *x, int64_t world, int64_t tag,
                       int64_t root = 0, const char *group = "world") {
  bool bc = op == DSC_OP_BROADCAST_START; /* world, tag, root, group */
  dsc_attr a[4] = {dsc_attr_int("world", world), dsc_attr_int("tag", tag),
                   bc ? dsc_attr_int("root", root) : dsc_attr_str("group", group),
                   dsc_attr_str("group", group)};
  return dsc_build(g, op, &x, 1, a, bc ? 4 : 3);
}

// Every collective kind at `world`, in dtype dt, compiled (fused).
inline dsc_module *coll_module(dsc_context *ctx, int world, dsc_dtype dt) {
  dsc_module *m = dsc_module_new(ctx, "m");
  dsc_graph *g = dsc_graph_new(m, "step");
  dsc_node *x = dsc_graph_input(g, "x", T(dt, {2 * (int64_t)world, 3}));
  dsc_node *h = op2(g, DSC_OP_MUL, x, x);
  dsc_node *ar = start(g, DSC_OP_ALL_REDUCE_START, h, world, 1);
  dsc_node *rs = start(g, DSC_OP_REDUCE_SCATTER_START, x, world, 1);
  dsc_node *ag = start(g, DSC_OP_ALL_GATHER_START, x, world, 1);
  dsc_node *bc = start(g, DSC_OP_BROADCAST_START, h, world, 1, world - 1);
  dsc_attr aa[3] = {dsc_attr_int("world", world), dsc_attr_int("tag", 1),
                    dsc_attr_str("group", "world")};
  dsc_node *a2a = dsc_build(g, DSC_OP_ALL_TO_ALL_START, &h, 1, aa, 3);
  dsc_node *outs[5] = {op2(g, DSC_OP_ADD, op1(g, DSC_OP_ALL_REDUCE_WAIT, ar), x),
                       op1(g, DSC_OP_REDUCE_SCATTER_WAIT, rs), op1(g, DSC_OP_ALL_GATHER_WAIT, ag),
                       op1(g, DSC_OP_BROADCAST_WAIT, bc), op1(g, DSC_OP_ALL_TO_ALL_WAIT, a2a)};
  for (dsc_node *o : outs)
    if (!o) return nullptr;
  if (dsc_graph_set_outputs(g, outs, 5) != DSC_OK || dsc_module_verify(m) != DSC_OK ||
      dsc_run_codegen_passes(m) != DSC_OK) {
    dsc_module_free(m);
    return nullptr;
  }
  return m;
}

// Runs fn on every rank; the std::function is shared by all rank threads.
using RankFn = std::function<dsc_status(dsc_comm *)>;
inline dsc_status run_ranks(dsc_context *ctx, int world, RankFn fn) {
  return dsc_comm_inproc_run(
      ctx, world, [](dsc_comm *c, void *ud) { return (*static_cast<RankFn *>(ud))(c); }, &fn);
}

}  // namespace comm_test

#endif
