// Collective ops (start/wait pairs) in compiled CPU programs: the program's
// COLLECTIVE_START / _WAIT instructions (liveness from start to wait, no
// in-place write of a buffer in flight), and the cpu executor run through
// the in-process communicator on every rank against the interpreter on the
// same ranks (worlds 1-4), bitwise repeatable; bf16 sums staged through f32;
// the profile's kinds; and the errors: no communicator, a world mismatch, a
// mismatch the communicator reports, a rank failing mid-step (no hang).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "codegen/codegen.h"
#include "dsc/dsc.h"
#include "tests/unit/comm_test_util.h"

namespace {

using comm_test::Ctx;
using comm_test::run_ranks;

using comm_test::op1;
using comm_test::op2;
using comm_test::start;
using comm_test::T;
dsc_node *cast(dsc_graph *g, dsc_node *x, dsc_dtype dt) {
  dsc_attr a = dsc_attr_dtype("dtype", dt);
  return dsc_build(g, DSC_OP_CAST, &x, 1, &a, 1);
}

// A fresh kernel cache per test process: the ranks' executors compile the
// same kernels, so all but the first load them (and no stale objects from
// another build are ever used).
struct KernelCache {
  std::string dir;
  bool made = false;
  const char *get() {
    if (!made) {
      made = true;
      std::string t = testing::TempDir() + "dsc_exec_coll_XXXXXX";
      std::vector<char> buf(t.begin(), t.end());
      buf.push_back(0);
      if (mkdtemp(buf.data())) dir = buf.data();
    }
    return dir.empty() ? nullptr : dir.c_str();
  }
  ~KernelCache() {
    std::error_code ec;
    if (!dir.empty()) std::filesystem::remove_all(dir, ec);
  }
} kernel_cache;
const char *cache_dir() { return kernel_cache.get(); }

// The main graph of world W (f32): every collective kind, a param sent while
// a kernel computes its assigned new value (its in-place write must wait for
// the wait), elementwise work between the starts and the waits, fused
// kernels consuming the waits, and a start that is never waited.
//   inputs x, y: f32[2W, 3]; param w: f32[4]
//   outputs o1 = allreduce(x*y + x) * z + x   (z = tanh(y) * y)
//           o2 = sum(reducescatter(x)^2, axis 1)
//           o3 = tanh(allgather(w)) + allgather(w)
//           o4 = broadcast(y, root W-1) + x
//   assign w <- tanh(w) + w
dsc_module *main_module(dsc_context *ctx, int world, int64_t tag_base = 0) {
  dsc_module *m = dsc_module_new(ctx, "m");
  dsc_init init = {DSC_INIT_NORMAL, 1.0, 0.0, NULL};
  if (dsc_module_add_param(m, "w", T(DSC_F32, {4}), init) != DSC_OK) return nullptr;
  dsc_graph *g = dsc_graph_new(m, "step");
  dsc_node *x = dsc_graph_input(g, "x", T(DSC_F32, {2 * world, 3}));
  dsc_node *y = dsc_graph_input(g, "y", T(DSC_F32, {2 * world, 3}));
  dsc_attr pa = dsc_attr_str("name", "w");
  dsc_node *w = dsc_build(g, DSC_OP_PARAM, nullptr, 0, &pa, 1);
  dsc_node *h = op2(g, DSC_OP_ADD, op2(g, DSC_OP_MUL, x, y), x);
  dsc_node *ar = start(g, DSC_OP_ALL_REDUCE_START, h, world, tag_base + 1);
  dsc_node *rs = start(g, DSC_OP_REDUCE_SCATTER_START, x, world, tag_base + 2);
  dsc_node *ag = start(g, DSC_OP_ALL_GATHER_START, w, world, tag_base + 3);
  dsc_node *bc = start(g, DSC_OP_BROADCAST_START, y, world, tag_base + 4, world - 1);
  dsc_node *neww = op2(g, DSC_OP_ADD, op1(g, DSC_OP_TANH, w), w);
  dsc_node *as = dsc_build(g, DSC_OP_ASSIGN, &neww, 1, &pa, 1);
  dsc_node *z = op2(g, DSC_OP_MUL, op1(g, DSC_OP_TANH, y), y);
  dsc_node *dangling = start(g, DSC_OP_ALL_REDUCE_START, z, world, tag_base + 5);
  dsc_node *arw = op1(g, DSC_OP_ALL_REDUCE_WAIT, ar);
  dsc_node *o1 = op2(g, DSC_OP_ADD, op2(g, DSC_OP_MUL, arw, z), x);
  dsc_node *rsw = op1(g, DSC_OP_REDUCE_SCATTER_WAIT, rs);
  int64_t axes[1] = {1};
  dsc_attr sa[2] = {dsc_attr_ints("axes", axes, 1), dsc_attr_bool("keepdims", 0)};
  dsc_node *sq = op2(g, DSC_OP_MUL, rsw, rsw);
  dsc_node *o2 = sq ? dsc_build(g, DSC_OP_SUM, &sq, 1, sa, 2) : nullptr;
  dsc_node *agw = op1(g, DSC_OP_ALL_GATHER_WAIT, ag);
  dsc_node *o3 = op2(g, DSC_OP_ADD, op1(g, DSC_OP_TANH, agw), agw);
  dsc_node *o4 = op2(g, DSC_OP_ADD, op1(g, DSC_OP_BROADCAST_WAIT, bc), x);
  dsc_node *outs[4] = {o1, o2, o3, o4};
  if (!as || !dangling || !o1 || !o2 || !o3 || !o4 || dsc_graph_set_outputs(g, outs, 4) != DSC_OK ||
      dsc_module_verify(m) != DSC_OK || dsc_run_codegen_passes(m) != DSC_OK) {
    dsc_module_free(m);
    return nullptr;
  }
  return m;
}

// bf16: sums staged through f32 (reduce), gather and broadcast moved as bf16.
//   input x: f32[2W, 4]; outputs f32 of allreduce, reducescatter, allgather,
//   broadcast(root 0) of bf16(x * 3).
dsc_module *bf16_module(dsc_context *ctx, int world) {
  dsc_module *m = dsc_module_new(ctx, "m");
  dsc_graph *g = dsc_graph_new(m, "step");
  dsc_node *x = dsc_graph_input(g, "x", T(DSC_F32, {2 * world, 4}));
  dsc_node *xb = cast(g, op2(g, DSC_OP_ADD, op2(g, DSC_OP_ADD, x, x), x), DSC_BF16);
  dsc_op st[4] = {DSC_OP_ALL_REDUCE_START, DSC_OP_REDUCE_SCATTER_START, DSC_OP_ALL_GATHER_START,
                  DSC_OP_BROADCAST_START};
  dsc_op wt[4] = {DSC_OP_ALL_REDUCE_WAIT, DSC_OP_REDUCE_SCATTER_WAIT, DSC_OP_ALL_GATHER_WAIT,
                  DSC_OP_BROADCAST_WAIT};
  dsc_node *s[4], *outs[4];
  for (int k = 0; k < 4; k++) s[k] = start(g, st[k], xb, world, 10 + k);
  for (int k = 0; k < 4; k++) outs[k] = cast(g, op1(g, wt[k], s[k]), DSC_F32);
  for (int k = 0; k < 4; k++)
    if (!outs[k]) return dsc_module_free(m), nullptr;
  if (dsc_graph_set_outputs(g, outs, 4) != DSC_OK || dsc_module_verify(m) != DSC_OK ||
      dsc_run_codegen_passes(m) != DSC_OK) {
    dsc_module_free(m);
    return nullptr;
  }
  return m;
}

// Random never-zero values in +-[0.25, 1] per (salt, rank).
std::vector<double> data(uint32_t salt, int rank, size_t n) {
  std::mt19937_64 g(salt * 1000003u + (uint32_t)rank);
  std::uniform_real_distribution<double> u(0.25, 1.0);
  std::vector<double> v(n);
  for (auto &x : v) x = (g() & 1) ? u(g) : -u(g);
  return v;
}

using Values = std::vector<std::vector<double>>;

// One rank's state: its own context, module, and both executors (created on
// the test's thread, one rank after the other; run on the rank's thread).
struct Rank {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  dsc_module *m = nullptr;
  dsc_exec *cpu = nullptr, *interp = nullptr;
  dsc_params *params = nullptr;
  std::vector<dsc_tensor *> inputs;
  ~Rank() {
    for (dsc_tensor *t : inputs) dsc_tensor_free(ctx, t);
    dsc_params_free(params);
    dsc_exec_free(cpu);
    dsc_exec_free(interp);
    dsc_module_free(m);
    dsc_context_free(ctx);
  }
};

bool make_execs(Rank &r, int rank, uint32_t salt) {
  dsc_exec_options oc = {DSC_BACKEND_CPU, 1, cache_dir()};
  dsc_exec_options oi = {DSC_BACKEND_INTERP, 0, nullptr};
  if (dsc_exec_new(r.m, &oc, &r.cpu) != DSC_OK || dsc_exec_new(r.m, &oi, &r.interp) != DSC_OK)
    return false;
  r.params = dsc_params_init(r.m, 100 + (uint64_t)rank);  // params differ per rank
  if (!r.params || dsc_exec_set_params(r.cpu, r.params) != DSC_OK ||
      dsc_exec_set_params(r.interp, r.params) != DSC_OK)
    return false;
  dsc_graph *g = dsc_module_find_graph(r.m, "step");
  for (int i = 0; i < dsc_graph_input_count(g); i++) {
    dsc_type t = dsc_node_type(dsc_graph_input_at(g, i));
    dsc_tensor *x = dsc_tensor_new(r.ctx, t);
    std::vector<double> v = data(salt + (uint32_t)i, rank, (size_t)dsc_type_numel(&t));
    std::memcpy(x->data, v.data(), v.size() * sizeof(double));
    r.inputs.push_back(x);
  }
  return true;
}

dsc_status run(dsc_exec *e, Rank &r, Values *out) {
  dsc_graph *g = dsc_module_find_graph(r.m, "step");
  int no = dsc_graph_output_count(g);
  std::vector<dsc_tensor *> res((size_t)no, nullptr);
  dsc_status st = dsc_exec_run(e, "step", r.inputs.data(), (int)r.inputs.size(), res.data());
  if (st != DSC_OK) return st;
  out->clear();
  for (dsc_tensor *t : res) {
    out->emplace_back(t->data, t->data + dsc_type_numel(&t->type));
    dsc_tensor_free(r.ctx, t);
  }
  return DSC_OK;
}

Values params_of(dsc_exec *e, Rank &r) {
  dsc_params *p = dsc_params_init(r.m, 0);
  Values v;
  if (p && dsc_exec_get_params(e, p) == DSC_OK)
    for (int i = 0; i < dsc_params_count(p); i++) {
      dsc_tensor *t = dsc_params_get(p, i);
      v.emplace_back(t->data, t->data + dsc_type_numel(&t->type));
    }
  dsc_params_free(p);
  return v;
}

// |a - b| <= tol * (largest |b| of that output), elementwise: relative to
// the output's scale, since an element that is a cancelling sum (o1 = s*z +
// x) carries the absolute error of its terms. The first failure as text.
std::string compare(const Values &a, const Values &b, double tol) {
  if (a.size() != b.size()) return "different output counts";
  for (size_t k = 0; k < a.size(); k++) {
    if (a[k].size() != b[k].size()) return "output " + std::to_string(k) + ": sizes differ";
    double scale = 1e-30;
    for (double v : b[k]) scale = std::max(scale, std::fabs(v));
    for (size_t i = 0; i < a[k].size(); i++)
      if (!(std::fabs(a[k][i] - b[k][i]) <= tol * scale)) {
        char msg[200];
        snprintf(msg, sizeof msg, "output %zu[%zu]: %.9g vs %.9g (scale %.9g)", k, i, a[k][i],
                 b[k][i], scale);
        return msg;
      }
  }
  return "";
}

bool bitwise(const Values &a, const Values &b) {
  if (a.size() != b.size()) return false;
  for (size_t k = 0; k < a.size(); k++)
    if (a[k].size() != b[k].size() ||
        std::memcmp(a[k].data(), b[k].data(), a[k].size() * sizeof(double)) != 0)
      return false;
  return true;
}

// Builds world ranks of module `build`, runs the interpreter once and the cpu
// backend twice (params reset in between) on every rank; checks per rank.
// tol: relative, cpu vs interpreter.
template <typename Build>
void run_world(int world, Build build, double tol, uint32_t salt, bool main_graph) {
  if (!dsc_backend_available(DSC_BACKEND_CPU)) GTEST_SKIP() << "no cpu backend in this build";
  std::vector<Rank> ranks((size_t)world);
  for (int r = 0; r < world; r++) {
    ranks[r].m = build(ranks[r].ctx, world);
    ASSERT_NE(ranks[r].m, nullptr) << diags(ranks[r].ctx);
    ASSERT_TRUE(make_execs(ranks[r], r, salt)) << diags(ranks[r].ctx);
  }
  std::vector<Values> ref((size_t)world), got1((size_t)world), got2((size_t)world),
      ref_p((size_t)world), p1((size_t)world), p2((size_t)world);
  Ctx outer;
  dsc_status st = run_ranks(outer.ctx, world, [&](dsc_comm *c) -> dsc_status {
    int r = dsc_comm_rank(c);
    Rank &k = ranks[r];
    dsc_comm_set_timeout(c, 30);  // a bug fails the test instead of hanging it
    dsc_exec_set_comm(k.interp, c);
    dsc_exec_set_comm(k.cpu, c);
    dsc_status s = run(k.interp, k, &ref[r]);
    if (s == DSC_OK) s = run(k.cpu, k, &got1[r]);
    if (s == DSC_OK) p1[r] = params_of(k.cpu, k);
    if (s == DSC_OK) s = dsc_exec_set_params(k.cpu, k.params);
    if (s == DSC_OK) s = run(k.cpu, k, &got2[r]);
    if (s == DSC_OK) p2[r] = params_of(k.cpu, k), ref_p[r] = params_of(k.interp, k);
    return s;
  });
  std::string why;
  for (auto &k : ranks) why += diags(k.ctx);
  ASSERT_EQ(st, DSC_OK) << diags(outer.ctx) << why;
  for (int r = 0; r < world; r++) {
    EXPECT_EQ(compare(got1[r], ref[r], tol), "") << "rank " << r << " of " << world;
    EXPECT_TRUE(bitwise(got1[r], got2[r])) << "rank " << r << ": two runs differ";
    EXPECT_EQ(compare(p1[r], ref_p[r], tol), "") << "rank " << r << ": assigned params";
    EXPECT_TRUE(bitwise(p1[r], p2[r])) << "rank " << r << ": params of two runs differ";
  }
  // The collectives did combine the ranks: rank 0's broadcast output (o4 =
  // y of rank W-1 + x of rank 0) differs from its own y + x when W > 1.
  if (main_graph && world > 1 && ref[0].size() == 4) {
    std::vector<double> y0 = data(salt + 1, 0, ref[0][3].size()),
                        x0 = data(salt, 0, ref[0][3].size());
    bool differs = false;
    for (size_t i = 0; i < y0.size(); i++)
      differs |= std::fabs(ref[0][3][i] - (double)(float)((float)y0[i] + (float)x0[i])) > 1e-6;
    EXPECT_TRUE(differs);
  }
}

class ExecCollectiveWorld : public ::testing::TestWithParam<int> {};

// f32 within 1e-6 of each output's largest magnitude (see compare) of the
// interpreter, which sums in f64 and rounds once; the communicator sums in
// f32 in rank order: an ulp or two for 4 ranks of values in +-[0.25, 1].
TEST_P(ExecCollectiveWorld, CpuMatchesTheInterpreterOnEveryRank) {
  run_world(GetParam(), [](dsc_context *c, int w) { return main_module(c, w); }, 1e-6, 7, true);
}

// bf16 sums go through f32 (exact for these few bf16 terms) and round once,
// as the interpreter's f64 sum does: equal within 1e-6 relative.
TEST_P(ExecCollectiveWorld, Bf16CollectivesMatchTheInterpreter) {
  run_world(GetParam(), bf16_module, 1e-6, 31, false);
}

INSTANTIATE_TEST_SUITE_P(Worlds, ExecCollectiveWorld, ::testing::Values(1, 2, 3, 4));

// The lowered program: each collective's src and dst are live from its start
// through its wait, no instruction in between writes them (the param w sent
// by all_gather is not overwritten in place by the kernel computing its new
// value), every start has one later wait (the dangling one at the end).
TEST(ExecCollective, ProgramKeepsCollectiveBuffersUntilTheWait) {
  Ctx c;
  dsc_module *m = main_module(c.ctx, 2);
  ASSERT_NE(m, nullptr) << diags(c.ctx);
  ir_arena a;
  ir_arena_init(&a, c.ctx);
  cg_program *p = nullptr;
  ASSERT_EQ(cg_lower_graph(dsc_module_find_graph(m, "step"), &a, &p), DSC_OK) << diags(c.ctx);
  char *text = cg_program_print(&a, p);
  ASSERT_NE(text, nullptr);
  EXPECT_EQ(p->n_collectives, 5) << text;
  int kinds[4] = {0, 0, 0, 0};
  for (int i = 0; i < p->n_instrs; i++) {
    const cg_instr *s = &p->instrs[i];
    if (s->kind != CG_INS_COLLECTIVE_START) continue;
    kinds[s->coll.kind]++;
    int w = -1;
    for (int j = i + 1; j < p->n_instrs; j++)
      if (p->instrs[j].kind == CG_INS_COLLECTIVE_WAIT && p->instrs[j].coll.id == s->coll.id) {
        EXPECT_EQ(w, -1) << "two waits of #" << s->coll.id << "\n" << text;
        w = j;
      }
    ASSERT_GT(w, i) << "no wait of #" << s->coll.id << "\n" << text;
    for (int b : {s->src, s->dst}) {
      const cg_buffer *buf = &p->buffers[b];
      if (buf->kind != CG_BUF_PARAM) {
        EXPECT_LE(buf->first_use, i) << "b" << b << "\n" << text;
        EXPECT_GE(buf->last_use, w) << "b" << b << "\n" << text;
      }
      for (int j = i + 1; j < w; j++) {
        const cg_instr *in = &p->instrs[j];
        if (in->kind == CG_INS_LAUNCH) {
          for (int k = 0; k < in->n_args; k++) {
            EXPECT_FALSE(in->args[k] == b && p->kernels[in->kernel]->args[k].written)
                << "instruction " << j << " writes b" << b << " while #" << s->coll.id
                << " is in flight\n"
                << text;
          }
        }
        if (in->kind == CG_INS_GEMM) {
          EXPECT_NE(in->gemm.c.buffer, b) << text;
        }
        if (in->kind == CG_INS_COPY || in->kind == CG_INS_EMBEDDING_GRAD) {
          EXPECT_NE(in->dst, b) << text;
        }
      }
      // Distinct WORK buffers live at the same time never overlap.
      for (int o = 0; o < p->n_buffers; o++) {
        const cg_buffer *ob = &p->buffers[o];
        if (o == b || buf->kind == CG_BUF_PARAM || ob->kind == CG_BUF_PARAM || ob->first_use < 0)
          continue;
        bool live = ob->first_use <= buf->last_use && buf->first_use <= ob->last_use;
        int64_t s1 = buf->numel * (int64_t)dsc_dtype_size(buf->dtype),
                s2 = ob->numel * (int64_t)dsc_dtype_size(ob->dtype);
        bool overlap = buf->offset < ob->offset + s2 && ob->offset < buf->offset + s1;
        EXPECT_FALSE(live && overlap) << "b" << b << " and b" << o << "\n" << text;
      }
    }
  }
  EXPECT_EQ(kinds[CG_COLL_ALL_REDUCE], 2);
  EXPECT_EQ(kinds[CG_COLL_REDUCE_SCATTER], 1);
  EXPECT_EQ(kinds[CG_COLL_ALL_GATHER], 1);
  EXPECT_EQ(kinds[CG_COLL_BROADCAST], 1);
  EXPECT_NE(std::string(text).find("all_gather_start #"), std::string::npos) << text;
  // The assign of w could not be written in place (w is in flight).
  ASSERT_EQ(p->n_assigns, 1);
  EXPECT_FALSE(p->assigns[0].in_place) << text;
  ir_arena_release(&a);
  dsc_module_free(m);
}

// The reference program evaluator runs one rank: with world 1 every
// collective is a copy (o4 = broadcast(y) + x = y + x); a larger world is a
// clear error, not a wrong answer.
TEST(ExecCollective, ProgramEvalRunsWorldOneAndRejectsMore) {
  for (int world : {1, 2}) {
    Ctx c;
    dsc_module *m = main_module(c.ctx, world);
    ASSERT_NE(m, nullptr) << diags(c.ctx);
    ir_arena a;
    ir_arena_init(&a, c.ctx);
    cg_program *p = nullptr;
    ASSERT_EQ(cg_lower_graph(dsc_module_find_graph(m, "step"), &a, &p), DSC_OK);
    std::vector<float> state((size_t)p->arena_bytes[CG_ARENA_STATE] / 4 + 16, 0.5f),
        work((size_t)p->arena_bytes[CG_ARENA_WORK] / 4 + 16, 0.0f);
    std::vector<double> in[2] = {data(1, 0, (size_t)(6 * world)), data(2, 0, (size_t)(6 * world))};
    for (int b = 0; b < p->n_buffers; b++)
      if (p->buffers[b].kind == CG_BUF_INPUT)
        for (int64_t i = 0; i < p->buffers[b].numel; i++)
          work[(size_t)(p->buffers[b].offset / 4 + i)] = (float)in[p->buffers[b].index][(size_t)i];
    char err[300] = "";
    bool ok = cg_program_eval(p, state.data(), work.data(), err, sizeof err);
    if (world == 1) {
      ASSERT_TRUE(ok) << err;
      const cg_output *o = &p->outputs[3];
      const float *v = &work[(size_t)(p->buffers[o->buffer].offset / 4 + o->offset)];
      for (int i = 0; i < 6; i++) EXPECT_EQ(v[i], (float)in[1][(size_t)i] + (float)in[0][(size_t)i]);
    } else {
      EXPECT_FALSE(ok);
      EXPECT_NE(std::string(err).find("world 2 needs a communicator"), std::string::npos) << err;
    }
    ir_arena_release(&a);
    dsc_module_free(m);
  }
}

// Without a communicator, and with one of another world: a clear error
// naming the op, nothing started, no crash.
TEST(ExecCollective, NoCommunicatorOrWrongWorldIsAnError) {
  if (!dsc_backend_available(DSC_BACKEND_CPU)) GTEST_SKIP() << "no cpu backend in this build";
  Rank r;
  r.m = main_module(r.ctx, 3);
  ASSERT_NE(r.m, nullptr) << diags(r.ctx);
  ASSERT_TRUE(make_execs(r, 0, 5)) << diags(r.ctx);
  Values out;
  for (dsc_exec *e : {r.cpu, r.interp}) {
    EXPECT_EQ(run(e, r, &out), DSC_ERR_USER);
    std::string d = diags(r.ctx);
    EXPECT_NE(d.find("all_reduce_start"), std::string::npos) << d;
    EXPECT_NE(d.find("communicator"), std::string::npos) << d;
  }
  Ctx outer;
  std::string msg;
  dsc_status st = run_ranks(outer.ctx, 2, [&](dsc_comm *c) -> dsc_status {
    if (dsc_comm_rank(c) != 0) return DSC_OK;  // rank 1 starts nothing
    dsc_exec_set_comm(r.cpu, c);
    Values o;
    dsc_status s = run(r.cpu, r, &o);
    msg = diags(r.ctx);
    dsc_exec_set_comm(r.cpu, nullptr);
    return s == DSC_OK ? DSC_ERR_INTERNAL : DSC_OK;
  });
  EXPECT_EQ(st, DSC_OK) << diags(outer.ctx);
  EXPECT_NE(msg.find("world 3 but the communicator's world is 2"), std::string::npos) << msg;
}

// A collective the ranks disagree on (a different tag on rank 1): the
// communicator's message comes back from dsc_exec_run on every rank.
TEST(ExecCollective, CommFailureCarriesTheCommMessage) {
  if (!dsc_backend_available(DSC_BACKEND_CPU)) GTEST_SKIP() << "no cpu backend in this build";
  const int world = 2;
  std::vector<Rank> ranks(world);
  for (int r = 0; r < world; r++) {
    ranks[r].m = main_module(ranks[r].ctx, world, r == 1 ? 100 : 0);
    ASSERT_NE(ranks[r].m, nullptr) << diags(ranks[r].ctx);
    ASSERT_TRUE(make_execs(ranks[r], r, 3)) << diags(ranks[r].ctx);
  }
  std::vector<dsc_status> sts(world, DSC_OK);
  Ctx outer;
  dsc_status st = run_ranks(outer.ctx, world, [&](dsc_comm *c) -> dsc_status {
    int r = dsc_comm_rank(c);
    dsc_comm_set_timeout(c, 30);
    dsc_exec_set_comm(ranks[r].cpu, c);
    Values o;
    return sts[r] = run(ranks[r].cpu, ranks[r], &o);
  });
  EXPECT_NE(st, DSC_OK);
  for (int r = 0; r < world; r++) {
    EXPECT_EQ(sts[r], DSC_ERR_USER) << "rank " << r;
    std::string d = diags(ranks[r].ctx);
    EXPECT_NE(d.find("does not match across ranks"), std::string::npos) << "rank " << r << ": " << d;
    EXPECT_NE(d.find("graph 'step'"), std::string::npos) << d;
  }
}

// The tag a compiled program's collectives carry is set at run time (the
// trainer sets the step): different tags on two ranks are a mismatch, equal
// ones run, whatever tag the program was compiled with.
TEST(ExecCollective, CollectiveTagIsSetAtRunTime) {
  if (!dsc_backend_available(DSC_BACKEND_CPU)) GTEST_SKIP() << "no cpu backend in this build";
  const int world = 2;
  for (int same = 0; same <= 1; same++) {
    std::vector<Rank> ranks(world);
    for (int r = 0; r < world; r++) {
      ranks[r].m = main_module(ranks[r].ctx, world, 0);
      ASSERT_NE(ranks[r].m, nullptr) << diags(ranks[r].ctx);
      ASSERT_TRUE(make_execs(ranks[r], r, 3)) << diags(ranks[r].ctx);
    }
    std::vector<dsc_status> sts(world, DSC_OK);
    Ctx outer;
    run_ranks(outer.ctx, world, [&](dsc_comm *c) -> dsc_status {
      int r = dsc_comm_rank(c);
      dsc_comm_set_timeout(c, 30);
      dsc_exec_set_comm(ranks[r].cpu, c);
      dsc_exec_set_collective_tag(ranks[r].cpu, same ? 9 : 5 + r);
      Values o;
      return sts[r] = run(ranks[r].cpu, ranks[r], &o);
    });
    for (int r = 0; r < world; r++) {
      std::string d = diags(ranks[r].ctx);
      if (same) {
        EXPECT_EQ(sts[r], DSC_OK) << d;
      } else {
        EXPECT_EQ(sts[r], DSC_ERR_USER);
        EXPECT_NE(d.find("does not match across ranks"), std::string::npos) << d;
      }
    }
  }
}

// Rank 1 hits an index out of range in a kernel between a start and its
// wait: it reports that, aborts the communicator, and the other ranks fail
// promptly naming rank 1 (no hang: the timeout is far longer than the test).
//   x: f32[4, 3], ids: i32[4] -> all_reduce(x), all_reduce(embedding(x, ids))
TEST(ExecCollective, OneRankFailingMidStepFailsTheOthers) {
  if (!dsc_backend_available(DSC_BACKEND_CPU)) GTEST_SKIP() << "no cpu backend in this build";
  const int world = 3;
  struct R {
    Ctx c;
    dsc_module *m = nullptr;
    dsc_exec *e = nullptr;
    ~R() { dsc_exec_free(e), dsc_module_free(m); }
  };
  std::vector<R> ranks(world);
  for (int r = 0; r < world; r++) {
    dsc_module *m = ranks[r].m = dsc_module_new(ranks[r].c.ctx, "m");
    dsc_graph *g = dsc_graph_new(m, "step");
    dsc_node *x = dsc_graph_input(g, "x", T(DSC_F32, {4, 3}));
    dsc_node *ids = dsc_graph_input(g, "ids", T(DSC_I32, {4}));
    dsc_node *a = start(g, DSC_OP_ALL_REDUCE_START, op2(g, DSC_OP_MUL, x, x), world, 1);
    dsc_node *e = op1(g, DSC_OP_TANH, op2(g, DSC_OP_EMBEDDING, x, ids));
    dsc_node *b = start(g, DSC_OP_ALL_REDUCE_START, e, world, 2);
    dsc_node *outs[2] = {op1(g, DSC_OP_ALL_REDUCE_WAIT, a), op1(g, DSC_OP_ALL_REDUCE_WAIT, b)};
    ASSERT_TRUE(outs[0] && outs[1] && dsc_graph_set_outputs(g, outs, 2) == DSC_OK &&
                dsc_module_verify(m) == DSC_OK && dsc_run_codegen_passes(m) == DSC_OK)
        << diags(ranks[r].c.ctx);
    dsc_exec_options o = {DSC_BACKEND_CPU, 1, cache_dir()};
    ASSERT_EQ(dsc_exec_new(m, &o, &ranks[r].e), DSC_OK) << diags(ranks[r].c.ctx);
  }
  std::vector<dsc_status> sts(world, DSC_OK);
  Ctx outer;
  auto t0 = std::chrono::steady_clock::now();
  dsc_status st = run_ranks(outer.ctx, world, [&](dsc_comm *c) -> dsc_status {
    int r = dsc_comm_rank(c);
    dsc_comm_set_timeout(c, 60);
    dsc_context *ctx = ranks[r].c.ctx;
    dsc_exec_set_comm(ranks[r].e, c);
    dsc_tensor *x = dsc_tensor_new(ctx, T(DSC_F32, {4, 3}));
    dsc_tensor *ids = dsc_tensor_new(ctx, T(DSC_I32, {4}));
    std::vector<double> v = data(9, r, 12);
    std::memcpy(x->data, v.data(), sizeof(double) * 12);
    for (int i = 0; i < 4; i++) ids->data[i] = (i + r) % 4;
    if (r == 1) ids->data[2] = 7;  // outside [0, 4)
    const dsc_tensor *ins[2] = {x, ids};
    dsc_tensor *res[2] = {};
    sts[r] = dsc_exec_run(ranks[r].e, "step", ins, 2, res);
    for (dsc_tensor *t : res) dsc_tensor_free(ctx, t);
    dsc_tensor_free(ctx, x), dsc_tensor_free(ctx, ids);
    return sts[r];
  });
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(secs, 20.0);
  EXPECT_NE(st, DSC_OK);
  std::string d1 = diags(ranks[1].c.ctx);
  EXPECT_EQ(sts[1], DSC_ERR_USER);
  EXPECT_NE(d1.find("out of range"), std::string::npos) << d1;
  for (int r : {0, 2}) {
    EXPECT_EQ(sts[r], DSC_ERR_USER) << "rank " << r;
    std::string d = diags(ranks[r].c.ctx);
    EXPECT_NE(d.find("rank 1"), std::string::npos) << "rank " << r << ": " << d;
  }
}

// The profile lists collective starts and waits as their own kinds.
TEST(ExecCollective, ProfileShowsCollectiveKinds) {
  if (!dsc_backend_available(DSC_BACKEND_CPU)) GTEST_SKIP() << "no cpu backend in this build";
  Rank r;
  r.m = main_module(r.ctx, 1);
  ASSERT_NE(r.m, nullptr) << diags(r.ctx);
  ASSERT_TRUE(make_execs(r, 0, 5)) << diags(r.ctx);
  Ctx outer;
  std::string text;
  dsc_status st = run_ranks(outer.ctx, 1, [&](dsc_comm *c) -> dsc_status {
    dsc_exec_set_comm(r.cpu, c);
    dsc_exec_set_profiling(r.cpu, true);
    Values o;
    dsc_status s = run(r.cpu, r, &o);
    char *buf = nullptr;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (s == DSC_OK) s = dsc_exec_print_profile(r.cpu, "step", 40, f);
    fclose(f);
    text = buf ? buf : "";
    free(buf);
    return s;
  });
  ASSERT_EQ(st, DSC_OK) << diags(outer.ctx) << diags(r.ctx);
  EXPECT_NE(text.find("comm_start"), std::string::npos) << text;
  EXPECT_NE(text.find("comm_wait"), std::string::npos) << text;
  EXPECT_NE(text.find("all_gather #"), std::string::npos) << text;
}

}  // namespace
