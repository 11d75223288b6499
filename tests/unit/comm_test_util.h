// Shared by the tests that run ranks (comm_test.cc, collective_test.cc,
// exec_collective_test.cc, nccl_test.cc): a context, the shorthands that
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
                       int64_t root = 0) {
  dsc_attr a[3] = {dsc_attr_int("world", world), dsc_attr_int("tag", tag),
                   dsc_attr_int("root", root)};
  return dsc_build(g, op, &x, 1, a, op == DSC_OP_BROADCAST_START ? 3 : 2);
}

// Runs fn on every rank; the std::function is shared by all rank threads.
using RankFn = std::function<dsc_status(dsc_comm *)>;
inline dsc_status run_ranks(dsc_context *ctx, int world, RankFn fn) {
  return dsc_comm_inproc_run(
      ctx, world, [](dsc_comm *c, void *ud) { return (*static_cast<RankFn *>(ud))(c); }, &fn);
}

}  // namespace comm_test

#endif
