// The schedule pass's returns of offloaded activations (passes/prefetch.c):
// with the host stream each to_device starts ahead of its reader by its
// copy's time under the cost model, within offload.prefetch_bytes of early
// returns at any point; without the stream nothing moves.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "dsc/dsc.h"
#include "passes/passes.h"
#include "tests/unit/test_util.h"

namespace {

const std::string kTiny = std::string(DSC_SOURCE_DIR) + "/examples/gpt-tiny.dsm";

struct Built {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  dsc_module *m = nullptr;
  dsc_train_config cfg;
  ~Built() {
    dsc_module_free(m);
    dsc_context_free(ctx);
  }
};

// gpt-tiny with activation offload through pass "schedule".
void build(Built *r, dsc_switch overlap, double copy_gbps, int64_t budget) {
  dsc_dim_binding dims[2] = {{"B", 4}, {"T", 32}};
  dsc_frontend_options fo = {dims, 2, false};
  ASSERT_EQ(dsc_compile_file(r->ctx, kTiny.c_str(), &fo, &r->m), DSC_OK) << diags(r->ctx);
  ASSERT_EQ(dsc_train_config_from_module(r->m, &r->cfg), DSC_OK) << diags(r->ctx);
  r->cfg.remat = DSC_REMAT_OFFLOAD;
  r->cfg.offload.overlap = overlap;
  r->cfg.offload.prefetch_bytes = budget;
  r->cfg.gemm_gflops = 200;
  r->cfg.mem_gbps = 20;
  r->cfg.copy_gbps = copy_gbps;
  dsc_pipeline_options po;
  memset(&po, 0, sizeof po);
  po.train = &r->cfg;
  po.stop_after = "schedule";
  po.verify_each = true;
  ASSERT_EQ(dsc_run_pipeline(r->m, &po), DSC_OK) << diags(r->ctx);
}

struct Return {
  int at, from, reader;  // positions: the to_device, its to_host, its first reader
  int64_t bytes;
};

std::vector<Return> returns(const ir_graph *g) {
  std::vector<int> first(g->n_nodes, g->n_nodes);
  for (int i = 0; i < g->n_nodes; i++)
    for (int q = 0; q < g->nodes[i]->n_in; q++)
      first[g->nodes[i]->in[q]->id] = std::min(first[g->nodes[i]->in[q]->id], i);
  std::vector<Return> out;
  for (int i = 0; i < g->n_nodes; i++) {
    const ir_node *d = g->nodes[i];
    if (d->op != DSC_OP_TO_DEVICE || d->in[0]->op != DSC_OP_TO_HOST) continue;
    int64_t b = dsc_type_numel(&d->type) * (int64_t)dsc_dtype_size(d->type.dtype);
    out.push_back({i, d->in[0]->id, first[i], b});
  }
  return out;
}

// The executor's time in the nodes between positions a and b (exclusive).
double seconds_between(const ir_graph *g, int a, int b, const pass_rates &r) {
  double s = 0;
  for (int i = a + 1; i < b; i++) s += pass_node_seconds(g->nodes[i], &r);
  return s;
}

TEST(Prefetch, ReturnsStartByTheirCopysTimeUnderTheCostModel) {
  // default rates (200 GFLOP/s, 20 GB/s): a 16 KiB activation's copy
  // takes under a microsecond, so each return starts only as far ahead as
  // that needs
  Built base, timed;
  build(&base, DSC_SWITCH_FALSE, 20, 64 << 20);
  build(&timed, DSC_SWITCH_AUTO, 20, 64 << 20);
  const ir_graph *g0 = dsc_module_find_graph(base.m, "train_step");
  const ir_graph *g1 = dsc_module_find_graph(timed.m, "train_step");
  std::vector<Return> r0 = returns(g0), r1 = returns(g1);
  ASSERT_GT(r1.size(), 8u);
  ASSERT_EQ(r0.size(), r1.size());
  pass_rates rates;
  pass_rates_of(&timed.cfg, &rates);
  int moved = 0;
  for (const Return &r : r1) {
    double need = (double)r.bytes / rates.copy_bytes;
    double ahead = seconds_between(g1, r.at, r.reader, rates);
    // hidden (enough work in between), or as early as it may go (right
    // after its to_host: no work in between)
    EXPECT_TRUE(ahead >= need || seconds_between(g1, r.from, r.at, rates) == 0)
        << "return at " << r.at << " needs " << need << " s, has " << ahead;
    // and no earlier than that: without its first node of work it would
    // not be hidden
    int first_work = r.at + 1;
    while (first_work < r.reader && pass_node_seconds(g1->nodes[first_work], &rates) == 0)
      first_work++;
    EXPECT_LT(seconds_between(g1, first_work, r.reader, rates), need) << r.at;
    moved += ahead > 0;
  }
  EXPECT_GT(moved, 0);
  // without the stream each return sits right before its reader: no work
  // in between
  for (const Return &r : r0) EXPECT_EQ(seconds_between(g0, r.at, r.reader, rates), 0) << r.at;
}

TEST(Prefetch, ASlowLinkStartsReturnsEarlyWithinThePrefetchBudget) {
  // a 1 MB/s link (the device's memory still 20 GB/s): no return can be hidden; each starts as
  // early as the bytes allow: with room for all, right after its to_host
  Built all, two;
  build(&all, DSC_SWITCH_TRUE, 1e-3, int64_t(1) << 40);
  const ir_graph *g = dsc_module_find_graph(all.m, "train_step");
  pass_rates rates;
  pass_rates_of(&all.cfg, &rates);
  std::vector<Return> rs = returns(g);
  ASSERT_FALSE(rs.empty());
  for (const Return &r : rs)
    EXPECT_EQ(seconds_between(g, r.from, r.at, rates), 0)
        << r.from << " " << r.at << " " << r.reader;
  // with room for two of the largest, at every node of work at most the
  // budget of returns is started ahead of its reader
  int64_t largest = 0;
  for (const Return &r : rs) largest = std::max(largest, r.bytes);
  build(&two, DSC_SWITCH_TRUE, 1e-3, 2 * largest);
  g = dsc_module_find_graph(two.m, "train_step");
  rs = returns(g);
  int early = 0;
  for (int i = 0; i < g->n_nodes; i++) {
    if (pass_node_seconds(g->nodes[i], &rates) == 0) continue;
    int64_t held = 0;
    for (const Return &r : rs)
      if (r.at < i && i < r.reader) held += r.bytes;
    EXPECT_LE(held, 2 * largest) << "node " << i;
    early += held > 0;
  }
  EXPECT_GT(early, 0);
}

}  // namespace
