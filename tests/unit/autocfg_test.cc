// Auto-configuration (driver/autocfg.c, include/dsc/autocfg.h): the ring
// formulas and the step-time replay against hand-computed values; the
// program summary (GEMM FLOPs of a lowered chain, collective bytes of a
// planned step, recomputation counted); the search (a budget that excludes
// stage 0 picks a sharded or offloaded configuration, fixed choices stay
// fixed, world 1 searches stage 0 only, the plan bound holds, none fits ->
// an error naming the smallest peak).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "codegen/codegen.h"
#include "dsc/autocfg.h"
#include "dsc/frontend.h"
#include "dsc/train.h"
#include "tests/unit/test_util.h"

// driver/driver.h (a C header without C++ guards): the program summary
extern "C" dsc_status drv_step_work(dsc_context *ctx, const cg_program *p, int64_t world,
                                    dsc_step_work *out);

namespace {

dsc_step_event compute(double flops) { return {DSC_EV_COMPUTE, flops, 0, 0}; }
dsc_step_event start(int id, double bytes) { return {DSC_EV_START, 0, id, bytes}; }
dsc_step_event wait(int id) { return {DSC_EV_WAIT, 0, id, 0}; }

// Rates that make the arithmetic readable: 1 GFLOP/s, 1 GB/s, 10 us latency.
dsc_rates unit_rates() { return {1.0, 1.0, 1.0, 0.5, 10.0}; }

dsc_step_work work_of(std::vector<dsc_step_event> &ev, int n_coll) {
  dsc_step_work w{};
  w.events = ev.data();
  w.n_events = (int)ev.size();
  w.n_coll = n_coll;
  for (auto &e : ev)
    if (e.kind == DSC_EV_COMPUTE) w.gemm_flops += e.flops;
  return w;
}

TEST(AutocfgCost, RingBytesFormulas) {
  // B = 1000 bytes over 4 ranks: all_reduce 2*3/4*B, the others 3/4*B, broadcast B
  EXPECT_DOUBLE_EQ(dsc_ring_bytes(DSC_COLL_ALL_REDUCE, 1000, 4), 1500);
  EXPECT_DOUBLE_EQ(dsc_ring_bytes(DSC_COLL_REDUCE_SCATTER, 1000, 4), 750);
  EXPECT_DOUBLE_EQ(dsc_ring_bytes(DSC_COLL_ALL_GATHER, 1000, 4), 750);
  EXPECT_DOUBLE_EQ(dsc_ring_bytes(DSC_COLL_BROADCAST, 1000, 4), 1000);
  EXPECT_DOUBLE_EQ(dsc_ring_bytes(DSC_COLL_ALL_REDUCE, 1000, 2), 1000);
  EXPECT_DOUBLE_EQ(dsc_ring_bytes(DSC_COLL_ALL_REDUCE, 1000, 1), 0);
}

// compute 1 ms | start (2 ms + 10 us) | compute 1 ms | wait | compute 1 ms:
// the collective runs from 1 to 3.01 ms, so the wait stalls 1.01 ms.
TEST(AutocfgCost, ExposedCommunicationIsWhatTheWaitStalls) {
  std::vector<dsc_step_event> ev = {compute(1e6), start(0, 2e6), compute(1e6), wait(0),
                                    compute(1e6)};
  dsc_step_work w = work_of(ev, 1);
  dsc_rates r = unit_rates();
  dsc_step_cost c;
  dsc_step_cost_eval(&w, &r, 0, 0, &c);
  EXPECT_NEAR(c.compute_s, 3e-3, 1e-12);
  EXPECT_NEAR(c.comm_s, 2.01e-3, 1e-12);
  EXPECT_NEAR(c.exposed_comm_s, 1.01e-3, 1e-12);
  EXPECT_NEAR(c.offload_s, 0, 1e-15);
  EXPECT_NEAR(c.step_s, 4.01e-3, 1e-12);
}

// A collective started early enough is hidden; two back to back queue on
// the one communication stream.
TEST(AutocfgCost, HiddenAndQueuedCollectives) {
  dsc_rates r = unit_rates();
  dsc_step_cost c;
  std::vector<dsc_step_event> hidden = {start(0, 1e6), compute(5e6), wait(0)};
  dsc_step_work w = work_of(hidden, 1);
  dsc_step_cost_eval(&w, &r, 0, 0, &c);
  EXPECT_NEAR(c.exposed_comm_s, 0, 1e-12);
  EXPECT_NEAR(c.step_s, 5e-3, 1e-12);
  // two of 1 ms (+10 us) each from t = 0: the second ends at 2.02 ms
  std::vector<dsc_step_event> queued = {start(0, 1e6), start(1, 1e6), compute(1.5e6), wait(0),
                                        wait(1)};
  w = work_of(queued, 2);
  dsc_step_cost_eval(&w, &r, 0, 0, &c);
  EXPECT_NEAR(c.comm_s, 2.02e-3, 1e-12);
  EXPECT_NEAR(c.exposed_comm_s, 0.52e-3, 1e-12);
  EXPECT_NEAR(c.step_s, 2.02e-3, 1e-12);
}

// host: 2 x 1 MB at 1 GB/s = 2 ms; disk: 2 x 1 MB at 0.5 GB/s = 4 ms; half
// hidden, at most the compute time (3 ms).
TEST(AutocfgCost, OffloadTransfersHalfHiddenAtMostCompute) {
  std::vector<dsc_step_event> ev = {compute(3e6)};
  dsc_step_work w = work_of(ev, 0);
  dsc_rates r = unit_rates();
  dsc_step_cost c;
  dsc_step_cost_eval(&w, &r, 1000000, 0, &c);
  EXPECT_NEAR(c.offload_s, 1e-3, 1e-12);
  dsc_step_cost_eval(&w, &r, 1000000, 1000000, &c);
  EXPECT_NEAR(c.offload_s, 3e-3, 1e-12); // 6 ms, 3 hidden (= compute)
  EXPECT_NEAR(c.step_s, 6e-3, 1e-12);
}

// A chain of 3 matmuls [64,64] x [64,64], lowered: 3 x 2*64^3 GEMM FLOPs.
TEST(AutocfgWork, GemmFlopsOfALoweredChain) {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  dsc_module *m = dsc_module_new(ctx, "t");
  dsc_graph *g = dsc_graph_new(m, "chain");
  int64_t d[2] = {64, 64};
  dsc_type t = dsc_type_make(DSC_F32, 2, d);
  dsc_node *y = dsc_graph_input(g, "x", t);
  for (int i = 0; i < 3; i++) {
    std::string name = "w" + std::to_string(i);
    ASSERT_EQ(dsc_module_add_param(m, name.c_str(), t, {DSC_INIT_NORMAL, 0.1, 0, NULL}), DSC_OK);
    y = dsc_matmul(g, y, dsc_param_ref(g, name.c_str()));
  }
  dsc_node *r = dsc_build(g, DSC_OP_RELU, &y, 1, nullptr, 0);
  ASSERT_NE(r, nullptr) << diags(ctx);
  dsc_graph_set_outputs(g, &r, 1);
  ASSERT_EQ(dsc_run_codegen_passes(m), DSC_OK) << diags(ctx);
  ir_arena a;
  ir_arena_init(&a, ctx);
  cg_memplan p;
  cg_program *prog = nullptr;
  ASSERT_EQ(cg_memplan_graph(g, &a, nullptr, &p, &prog), DSC_OK) << diags(ctx);
  dsc_step_work w;
  ASSERT_EQ(drv_step_work(ctx, prog, 1, &w), DSC_OK);
  EXPECT_DOUBLE_EQ(w.gemm_flops, 3 * 2.0 * 64 * 64 * 64);
  EXPECT_DOUBLE_EQ(w.kernel_flops, 64.0 * 64); // the relu: one op per element
  EXPECT_EQ(w.n_coll, 0);
  EXPECT_EQ(w.n_events, 1); // one merged compute event
  dsc_step_work_free(&w);
  ir_arena_release(&a);
  dsc_module_free(m);
  dsc_context_free(ctx);
}

std::string tiny() { return std::string(DSC_SOURCE_DIR) + "/examples/gpt-tiny.dsm"; }

dsc_plan_options tiny_options(const std::string &path, int64_t world) {
  dsc_plan_options o{};
  o.model_path = path.c_str();
  o.world = world;
  o.batch = 2, o.seq = 16, o.grad_accum = 2;
  o.threads = 1;
  return o;
}

struct Planned {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  dsc_memory_plan plan{};
  dsc_step_work work{};
  ~Planned() {
    dsc_step_work_free(&work);
    dsc_context_free(ctx);
  }
};

// Stage 0 all-reduces every f32 gradient (4 Psi bytes, plus the scalars);
// at world 2 a ring sends the payload once, at world 4 1.5 times. Stage 3
// gathers the params in the forward and again in the backward of each
// micro-batch (2 of them): 4 x 4 Psi, less the params whose gradient does
// not read them (biases: gathered in the forward only), so over 3 x 4 Psi.
TEST(AutocfgWork, CollectiveBytesOfPlannedSteps) {
  std::string path = tiny();
  for (int64_t world : {2, 4}) {
    Planned s0;
    dsc_plan_options o = tiny_options(path, world);
    o.knobs.has_zero_stage = true, o.knobs.zero_stage = 0;
    ASSERT_EQ(dsc_plan_memory_work(s0.ctx, &o, &s0.plan, &s0.work), DSC_OK) << diags(s0.ctx);
    double psi = (double)s0.plan.param_count;
    EXPECT_GE(s0.work.coll_bytes[DSC_COLL_ALL_REDUCE], 4 * psi);
    EXPECT_LT(s0.work.coll_bytes[DSC_COLL_ALL_REDUCE], 4 * psi + 64);
    EXPECT_DOUBLE_EQ(s0.work.link_bytes[DSC_COLL_ALL_REDUCE],
                     s0.work.coll_bytes[DSC_COLL_ALL_REDUCE] * (world == 2 ? 1.0 : 1.5));
    EXPECT_EQ(s0.work.coll_bytes[DSC_COLL_ALL_GATHER], 0);
    EXPECT_GT(s0.work.gemm_flops, 0);
    Planned s3;
    o.knobs.zero_stage = 3;
    ASSERT_EQ(dsc_plan_memory_work(s3.ctx, &o, &s3.plan, &s3.work), DSC_OK) << diags(s3.ctx);
    EXPECT_GT(s3.work.coll_bytes[DSC_COLL_ALL_GATHER], 3 * 4 * psi);
    EXPECT_LE(s3.work.coll_bytes[DSC_COLL_ALL_GATHER], 4 * 4 * psi + 4096);
    EXPECT_GT(s3.work.coll_bytes[DSC_COLL_REDUCE_SCATTER], 0);
    // the same forward and backward: the same GEMMs
    EXPECT_DOUBLE_EQ(s3.work.gemm_flops, s0.work.gemm_flops);
  }
}

// Checkpointing recomputes forward values in the backward, and the program
// summary counts that work: selective recomputes elementwise ops and norms
// (kernel FLOPs up, GEMMs equal), blocks recomputes whole blocks (more work
// in all, its matmuls too: cse keeps the recomputed ones apart from their
// forward twins).
TEST(AutocfgWork, RecomputationIsCounted) {
  std::string path = tiny();
  Planned none, sel, blocks;
  dsc_plan_options o = tiny_options(path, 1);
  dsc_run_knobs_set(&o.knobs, "--checkpoint-activations", "none");
  ASSERT_EQ(dsc_plan_memory_work(none.ctx, &o, &none.plan, &none.work), DSC_OK);
  dsc_run_knobs_set(&o.knobs, "--checkpoint-activations", "selective");
  ASSERT_EQ(dsc_plan_memory_work(sel.ctx, &o, &sel.plan, &sel.work), DSC_OK);
  dsc_run_knobs_set(&o.knobs, "--checkpoint-activations", "blocks");
  ASSERT_EQ(dsc_plan_memory_work(blocks.ctx, &o, &blocks.plan, &blocks.work), DSC_OK);
  EXPECT_GT(sel.work.kernel_flops, none.work.kernel_flops);
  EXPECT_DOUBLE_EQ(sel.work.gemm_flops, none.work.gemm_flops);
  EXPECT_GT(blocks.work.gemm_flops, none.work.gemm_flops);
  EXPECT_GT(blocks.work.gemm_flops + blocks.work.kernel_flops,
            none.work.gemm_flops + none.work.kernel_flops);
  // recomputation is at most one more forward: under 4/3 of the step
  EXPECT_LT(blocks.work.gemm_flops + blocks.work.kernel_flops,
            (none.work.gemm_flops + none.work.kernel_flops) * 4 / 3);
}

struct Search {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  dsc_autocfg_options o{};
  dsc_autocfg_result r{};
  std::string path = tiny();
  explicit Search(int64_t world) {
    o.base = tiny_options(path, world);
    o.rates = {100.0, 10.0, 10.0, 1.0, 10.0};
  }
  ~Search() { dsc_context_free(ctx); }
  int64_t peak(int stage, const char *act) {
    dsc_plan_options p = o.base;
    p.knobs.has_zero_stage = true, p.knobs.zero_stage = stage;
    EXPECT_TRUE(dsc_run_knobs_set(&p.knobs, "--checkpoint-activations", act));
    dsc_memory_plan m;
    EXPECT_EQ(dsc_plan_memory(ctx, &p, &m), DSC_OK) << diags(ctx);
    return m.rank.peak;
  }
};

bool is_plain_stage0(const dsc_autocfg_candidate &c) {
  return c.knobs.zero_stage == 0 && c.knobs.offload_optimizer == DSC_OFFLOAD_NONE &&
         c.knobs.offload_param == DSC_OFFLOAD_NONE;
}

// Without checkpointing, one byte under stage 0's peak: the choice shards or
// offloads, fits, and is the fastest fitting one; the runners-up are ranked.
TEST(AutocfgSearch, BudgetBelowStage0PicksShardedOrOffloaded) {
  Search s(2);
  dsc_run_knobs_set(&s.o.base.knobs, "--checkpoint-activations", "none");
  s.o.memory_budget = s.peak(0, "none") - 1;
  ASSERT_EQ(dsc_autocfg_search(s.ctx, &s.o, &s.r), DSC_OK) << diags(s.ctx);
  ASSERT_GT(s.r.n_fit, 0);
  const dsc_autocfg_candidate &c = s.r.cand[0];
  EXPECT_TRUE(c.fits);
  EXPECT_FALSE(is_plain_stage0(c));
  EXPECT_LE(c.plan.rank.peak, s.o.memory_budget);
  for (int i = 0; i < s.r.n; i++) {
    EXPECT_STREQ(dsc_remat_name(s.r.cand[i].knobs.remat), "none");
    if (i > 0 && i < s.r.n_fit) {
      EXPECT_LE(s.r.cand[i - 1].cost.step_s, s.r.cand[i].cost.step_s);
    }
    if (is_plain_stage0(s.r.cand[i])) {
      EXPECT_FALSE(s.r.cand[i].fits);
    }
  }
  EXPECT_LE(s.r.n_planned, 40);
  char flags[256];
  dsc_autocfg_flags(&c, 2, flags, sizeof flags);
  EXPECT_NE(std::string(flags).find("--checkpoint-activations none"), std::string::npos) << flags;
}

// A fixed stage and offload stay fixed; the disk tier needs a directory.
TEST(AutocfgSearch, FixedChoicesAreRespected) {
  Search s(2);
  s.o.base.knobs.has_zero_stage = true, s.o.base.knobs.zero_stage = 1;
  s.o.memory_budget = (int64_t)1 << 40;
  ASSERT_EQ(dsc_autocfg_search(s.ctx, &s.o, &s.r), DSC_OK) << diags(s.ctx);
  for (int i = 0; i < s.r.n; i++) {
    EXPECT_EQ(s.r.cand[i].knobs.zero_stage, 1);
    EXPECT_STRNE(dsc_offload_name(s.r.cand[i].knobs.offload_optimizer),
                 "disk");  // no --offload-dir
  }
  EXPECT_STREQ(dsc_remat_name(s.r.cand[0].knobs.remat), "none");  // fits: no recompute needed
  Search h(2);
  dsc_run_knobs_set(&h.o.base.knobs, "--offload-optimizer", "host");
  h.o.memory_budget = (int64_t)1 << 40;
  ASSERT_EQ(dsc_autocfg_search(h.ctx, &h.o, &h.r), DSC_OK) << diags(h.ctx);
  for (int i = 0; i < h.r.n; i++)
    EXPECT_STREQ(dsc_offload_name(h.r.cand[i].knobs.offload_optimizer), "host");
  Search d(2);
  dsc_run_knobs_set(&d.o.base.knobs, "--offload-optimizer", "disk");
  d.o.memory_budget = (int64_t)1 << 40;
  EXPECT_EQ(dsc_autocfg_search(d.ctx, &d.o, &d.r), DSC_ERR_USER);
  EXPECT_NE(diags(d.ctx).find("--offload-dir"), std::string::npos) << diags(d.ctx);
}

// World 1 searches stage 0 only, params never offloaded; the bound holds.
TEST(AutocfgSearch, WorldOneAndThePlanBound) {
  Search s(1);
  s.o.memory_budget = (int64_t)1 << 40;
  ASSERT_EQ(dsc_autocfg_search(s.ctx, &s.o, &s.r), DSC_OK) << diags(s.ctx);
  for (int i = 0; i < s.r.n; i++) {
    EXPECT_EQ(s.r.cand[i].knobs.zero_stage, 0);
    EXPECT_STREQ(dsc_offload_name(s.r.cand[i].knobs.offload_param), "none");
  }
  Search b(2);
  b.o.memory_budget = 1;
  b.o.max_plans = 3;
  EXPECT_EQ(dsc_autocfg_search(b.ctx, &b.o, &b.r), DSC_ERR_USER);
  EXPECT_EQ(b.r.n_planned, 3);
  EXPECT_NE(diags(b.ctx).find("stopped at --max-plans"), std::string::npos) << diags(b.ctx);
}

// Nothing fits: an error naming the smallest peak found and the budget it
// would take; the result keeps what was planned.
TEST(AutocfgSearch, NoneFitsNamesTheSmallestPeak) {
  Search s(2);
  s.o.memory_budget = 4096;
  ASSERT_EQ(dsc_autocfg_search(s.ctx, &s.o, &s.r), DSC_ERR_USER);
  EXPECT_EQ(s.r.n_fit, 0);
  ASSERT_GE(s.r.smallest, 0) << diags(s.ctx);
  int64_t smallest = s.r.cand[s.r.smallest].plan.rank.peak;
  for (int i = 0; i < s.r.n; i++) EXPECT_GE(s.r.cand[i].plan.rank.peak, smallest);
  std::string d = diags(s.ctx);
  EXPECT_NE(d.find("no configuration fits the memory budget of 4.00 KiB"), std::string::npos) << d;
  EXPECT_NE(d.find("it would take --memory-budget"), std::string::npos) << d;
  Search z(2);
  z.o.memory_budget = 1 << 30;
  z.o.rates.link_gbps = 0;
  EXPECT_EQ(dsc_autocfg_search(z.ctx, &z.o, &z.r), DSC_ERR_USER);
  EXPECT_EQ(z.r.n_planned, 0);
}

// Calibration measures four positive rates and caches them per host.
TEST(AutocfgCalibrate, MeasuresAndCaches) {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  std::string cache = std::string(DSC_BINARY_DIR) + "/autocfg_test_calibration.txt";
  std::remove(cache.c_str());
  dsc_calibrate_options o{};
  o.cache_path = cache.c_str();
  o.threads = 1;
  dsc_rates r;
  bool cached = true;
  ASSERT_EQ(dsc_calibrate(ctx, &o, &r, &cached), DSC_OK) << diags(ctx);
  EXPECT_FALSE(cached);
  EXPECT_GT(r.compute_gflops, 0.1);
  EXPECT_GT(r.host_gbps, 0.01);
  EXPECT_GT(r.disk_gbps, 0.0001);
  EXPECT_GT(r.link_gbps, 0.001);
  dsc_rates again;
  // the cache alone (what dsc train's schedule pass reads): this host and
  // thread count only
  ASSERT_TRUE(dsc_calibrate_cached(&o, &again));
  EXPECT_NEAR(again.host_gbps, r.host_gbps, 1e-5 * r.host_gbps);
  o.threads = 3;
  EXPECT_FALSE(dsc_calibrate_cached(&o, &again));
  o.threads = 1;
  o.no_cache = true;
  EXPECT_FALSE(dsc_calibrate_cached(&o, &again));
  o.no_cache = false;
  ASSERT_EQ(dsc_calibrate(ctx, &o, &again, &cached), DSC_OK) << diags(ctx);
  EXPECT_TRUE(cached);
  EXPECT_NEAR(again.compute_gflops, r.compute_gflops, 1e-5 * r.compute_gflops);
  o.recalibrate = true;
  ASSERT_EQ(dsc_calibrate(ctx, &o, &again, &cached), DSC_OK) << diags(ctx);
  EXPECT_FALSE(cached);
  // another thread count is another key: measured again
  o.recalibrate = false;
  o.threads = 2;
  ASSERT_EQ(dsc_calibrate(ctx, &o, &again, &cached), DSC_OK) << diags(ctx);
  EXPECT_FALSE(cached);
  // an unwritable disk directory is an error naming it
  o.disk_dir = "/nonexistent-dir-for-dsc";
  o.recalibrate = true;
  EXPECT_NE(dsc_calibrate(ctx, &o, &again, &cached), DSC_OK);
  EXPECT_NE(diags(ctx).find("cannot create a test file"), std::string::npos) << diags(ctx);
  std::remove(cache.c_str());
  dsc_context_free(ctx);
}

} // namespace
