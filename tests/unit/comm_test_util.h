// Shared by the tests that run in-process ranks (comm_test.cc,
// collective_test.cc): a context, its diagnostics as text, and running a
// lambda on every rank.
#ifndef DSC_COMM_TEST_UTIL_H
#define DSC_COMM_TEST_UTIL_H

#include <functional>
#include <string>

#include "dsc/comm.h"

namespace comm_test {

struct Ctx {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  ~Ctx() { dsc_context_free(ctx); }
};

inline std::string all_diags(const dsc_context *ctx) {
  std::string s;
  for (int i = 0; i < dsc_diag_count(ctx); i++)
    s += std::string(dsc_diag_get(ctx, i)->message) + "\n";
  return s;
}

// Runs fn on every rank; the std::function is shared by all rank threads.
using RankFn = std::function<dsc_status(dsc_comm *)>;
inline dsc_status run_ranks(dsc_context *ctx, int world, RankFn fn) {
  return dsc_comm_inproc_run(
      ctx, world, [](dsc_comm *c, void *ud) { return (*static_cast<RankFn *>(ud))(c); }, &fn);
}

}  // namespace comm_test

#endif
