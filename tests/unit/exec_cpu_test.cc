// The CPU runtime: thread pool (runtime/threadpool.c), GEMM plans
// (runtime/gemm_cpu.c) and the program executor (runtime/exec_cpu.c).
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "codegen/codegen.h"
#include "runtime/runtime.h"
#include "tests/unit/test_util.h"

namespace {

struct Ctx {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  ~Ctx() { dsc_context_free(ctx); }
  std::string diags() const { return ::diags(ctx); }
};

// ---------------- thread pool ----------------

struct CoverJob {
  std::vector<std::atomic<int>> *hits;
  std::atomic<int> bad_chunk{0};
  int threads;
  std::vector<int64_t> begins;  // per chunk: the begin it saw (-1: none)
};

void cover(void *arg, int64_t begin, int64_t end, int chunk) {
  auto *j = static_cast<CoverJob *>(arg);
  if (chunk < 0 || chunk >= j->threads || begin >= end) {
    j->bad_chunk++;
    return;
  }
  j->begins[chunk] = begin;
  for (int64_t i = begin; i < end; i++) (*j->hits)[i]++;
}

// Both teams: OpenMP's (where built with it) and the pthread one.
rt_pool *new_pool(dsc_context *ctx, bool pthreads, int threads) {
  return pthreads ? rt_pool_new_pthreads(ctx, threads) : rt_pool_new(ctx, threads);
}

TEST(ThreadPool, CoversEveryIndexExactlyOnceAndSplitsDeterministically) {
  Ctx c;
  for (bool pthreads : {false, true})
    for (int threads : {1, 2, 3, 5}) {
      rt_pool *p = new_pool(c.ctx, pthreads, threads);
      ASSERT_NE(p, nullptr) << c.diags();
      EXPECT_EQ(rt_pool_threads(p), threads);
      for (int64_t n : {0, 1, 2, 3, 7, 64, 1000, 12345}) {
        for (int64_t min_chunk : {0, 7, 1000}) {
          std::vector<std::atomic<int>> hits(n);
          for (auto &h : hits) h = 0;
          std::vector<int64_t> first;
          for (int rep = 0; rep < 2; rep++) {
            CoverJob j;
            j.hits = &hits;
            j.threads = threads;
            j.begins.assign(threads, -1);
            rt_pool_parallel_for(p, n, min_chunk, cover, &j);
            EXPECT_EQ(j.bad_chunk.load(), 0);
            int chunks = rt_pool_chunks(p, n, min_chunk);
            EXPECT_LE(chunks, threads);
            if (n > 0 && min_chunk > 0 && n >= min_chunk) {
              EXPECT_GE(n / chunks, min_chunk);
            }
            for (int ch = 0; ch < threads; ch++)
              EXPECT_EQ(j.begins[ch] >= 0, ch < chunks) << "n=" << n << " chunk " << ch;
            if (rep == 0) {
              first = j.begins;
            } else {
              EXPECT_EQ(first, j.begins) << "the split must not depend on timing";
            }
          }
          for (int64_t i = 0; i < n; i++)
            ASSERT_EQ(hits[i].load(), 2) << "threads=" << threads << " n=" << n << " i=" << i;
        }
      }
      rt_pool_free(p);
    }
}

void add_range(void *arg, int64_t begin, int64_t end, int) {
  auto *sum = static_cast<std::atomic<int64_t> *>(arg);
  int64_t s = 0;
  for (int64_t i = begin; i < end; i++) s += i;
  *sum += s;
}

TEST(ThreadPool, ManyJobsThroughSpinAndSleepWakeups) {
  Ctx c;
  for (bool pthreads : {false, true}) {
    rt_pool *p = new_pool(c.ctx, pthreads, 3);
    ASSERT_NE(p, nullptr);
    if (pthreads) {
      EXPECT_FALSE(rt_pool_is_openmp(p));
    }
    for (int job = 0; job < 600; job++) {
      // Every 50th job after a pause: the workers have gone to sleep.
      if (job % 50 == 49) std::this_thread::sleep_for(std::chrono::milliseconds(2));
      std::atomic<int64_t> sum{0};
      int64_t n = 1 + job % 37;
      rt_pool_parallel_for(p, n, 1, add_range, &sum);
      ASSERT_EQ(sum.load(), n * (n - 1) / 2) << "job " << job;
    }
    rt_pool_free(p);
  }
  EXPECT_EQ(rt_pool_new(c.ctx, 0), nullptr);
  EXPECT_GE(dsc_error_count(c.ctx), 1);
}

// ---------------- GEMM ----------------

// One operand's storage: a buffer plus the strides and offset of a view.
struct Operand {
  std::vector<float> data;
  cg_matrix m{};
};

// Layout of a test GEMM: per operand, whether it is stored transposed, an
// extra row padding and offset (a slice of a wider matrix) and which batch
// dims it broadcasts.
struct Layout {
  bool trans = false;
  int64_t pad = 0, offset = 0;
  bool bcast[2] = {false, false};
};

Operand make_operand(std::mt19937 &rng, int64_t b0, int64_t b1, int64_t rows, int64_t cols,
                     const Layout &l, int buffer) {
  Operand o;
  int64_t inner = l.trans ? rows : cols, outer = l.trans ? cols : rows;
  int64_t ld = inner + l.pad, mat = outer * ld;
  o.m.buffer = buffer;
  o.m.offset = l.offset;
  o.m.row_stride = l.trans ? 1 : ld;
  o.m.col_stride = l.trans ? ld : 1;
  int64_t n1 = l.bcast[1] ? 1 : b1, n0 = l.bcast[0] ? 1 : b0;
  o.m.batch_stride[1] = l.bcast[1] ? 0 : mat;
  o.m.batch_stride[0] = l.bcast[0] ? 0 : mat * n1;
  o.data.resize(l.offset + mat * n1 * n0 + 3);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (auto &x : o.data) x = u(rng);
  return o;
}

double at(const Operand &o, int64_t b0, int64_t b1, int64_t r, int64_t c) {
  const cg_matrix &m = o.m;
  return o.data[m.offset + b0 * m.batch_stride[0] + b1 * m.batch_stride[1] + r * m.row_stride +
                c * m.col_stride];
}

struct GemmCase {
  const char *name;
  int64_t b0, b1, m, n, k;
  Layout la, lb, lc;
  double alpha = 1, beta = 0;
};

// Runs the case through a plan (library or loop) and compares every C
// element with a double-precision triple loop. Tolerance: max |err| over
// max |ref| below 1e-5 (f32 accumulation over k <= 300 terms in [-1, 1]).
void check_gemm(const GemmCase &gc, rt_pool *pool, int flags, std::string *impl) {
  Ctx c;
  std::mt19937 rng(1234 + (unsigned)gc.m * 7 + (unsigned)gc.n);
  Operand a = make_operand(rng, gc.b0, gc.b1, gc.m, gc.k, gc.la, 0);
  Operand b = make_operand(rng, gc.b0, gc.b1, gc.k, gc.n, gc.lb, 1);
  Operand cm = make_operand(rng, gc.b0, gc.b1, gc.m, gc.n, gc.lc, 2);
  Operand c0 = cm;
  cg_gemm g{};
  g.batch[0] = gc.b0;
  g.batch[1] = gc.b1;
  g.m = gc.m;
  g.n = gc.n;
  g.k = gc.k;
  g.a = a.m;
  g.b = b.m;
  g.c = cm.m;
  g.alpha = gc.alpha;
  g.beta = gc.beta;
  ASSERT_LE(cg_gemm_extent(&g, 0), (int64_t)a.data.size());
  ASSERT_LE(cg_gemm_extent(&g, 1), (int64_t)b.data.size());
  ASSERT_LE(cg_gemm_extent(&g, 2), (int64_t)cm.data.size());
  rt_gemm_engine *e = rt_gemm_engine_new(c.ctx, pool);
  ASSERT_NE(e, nullptr) << c.diags();
  rt_gemm_plan *pl = rt_gemm_plan_new(e, &g, DSC_F32, DSC_F32, flags);
  ASSERT_NE(pl, nullptr) << c.diags();
  *impl = rt_gemm_plan_impl(pl);
  char err[256] = "";
  for (int rep = 0; rep < 2; rep++) {  // a plan runs again with the same result
    cm.data = c0.data;
    ASSERT_TRUE(rt_gemm_run(pl, a.data.data(), b.data.data(), cm.data.data(), err, sizeof err))
        << err;
  }
  double max_err = 0, max_ref = 0;
  for (int64_t i0 = 0; i0 < gc.b0; i0++)
    for (int64_t i1 = 0; i1 < gc.b1; i1++)
      for (int64_t i = 0; i < gc.m; i++)
        for (int64_t j = 0; j < gc.n; j++) {
          double s = 0;
          for (int64_t p = 0; p < gc.k; p++) s += at(a, i0, i1, i, p) * at(b, i0, i1, p, j);
          double ref = gc.alpha * s + gc.beta * at(c0, i0, i1, i, j);
          max_err = std::max(max_err, std::fabs(at(cm, i0, i1, i, j) - ref));
          max_ref = std::max(max_ref, std::fabs(ref));
        }
  EXPECT_GT(max_ref, 0.1);
  EXPECT_LT(max_err / max_ref, 1e-5) << gc.name << " via " << *impl;
  // Elements of C outside the view are untouched (slices, padding).
  std::vector<bool> in_view(cm.data.size(), false);
  for (int64_t i0 = 0; i0 < gc.b0; i0++)
    for (int64_t i1 = 0; i1 < gc.b1; i1++)
      for (int64_t i = 0; i < gc.m; i++)
        for (int64_t j = 0; j < gc.n; j++)
          in_view[cm.m.offset + i0 * cm.m.batch_stride[0] + i1 * cm.m.batch_stride[1] +
                  i * cm.m.row_stride + j * cm.m.col_stride] = true;
  for (size_t i = 0; i < cm.data.size(); i++)
    if (!in_view[i]) {
      ASSERT_EQ(cm.data[i], c0.data[i]) << gc.name << " wrote outside C at " << i;
    }
  rt_gemm_plan_free(pl);
  rt_gemm_engine_free(e);
}

std::vector<GemmCase> gemm_cases() {
  std::vector<GemmCase> v;
  GemmCase plain{"plain", 1, 1, 37, 53, 29, {}, {}, {}};
  v.push_back(plain);
  GemmCase ta = plain;
  ta.name = "transposed A";
  ta.la.trans = true;
  v.push_back(ta);
  GemmCase tb = plain;
  tb.name = "transposed B";
  tb.lb.trans = true;
  v.push_back(tb);
  GemmCase tab = plain;
  tab.name = "transposed A and B, transposed C";
  tab.la.trans = tab.lb.trans = tab.lc.trans = true;
  v.push_back(tab);
  GemmCase batched{"batched 2x3", 2, 3, 17, 19, 23, {}, {}, {}};
  v.push_back(batched);
  GemmCase one_batch{"one batch dim", 1, 4, 9, 33, 65, {}, {}, {}};
  one_batch.lb.trans = true;
  v.push_back(one_batch);
  GemmCase bc = batched;
  bc.name = "broadcast batch (A over dim 1, B over dim 0)";
  bc.la.bcast[1] = true;
  bc.lb.bcast[0] = true;
  v.push_back(bc);
  GemmCase bcb = batched;
  bcb.name = "broadcast B over both batch dims";
  bcb.lb.bcast[0] = bcb.lb.bcast[1] = true;
  v.push_back(bcb);
  GemmCase sl = plain;
  sl.name = "sliced operands (offsets, row stride > cols)";
  sl.la.pad = 7;
  sl.la.offset = 5;
  sl.lb.pad = 3;
  sl.lb.offset = 11;
  sl.lc.pad = 4;
  sl.lc.offset = 2;
  v.push_back(sl);
  GemmCase ab = sl;
  ab.name = "alpha and beta";
  ab.alpha = 0.5;
  ab.beta = 1.5;
  v.push_back(ab);
  GemmCase ab_batched = bc;
  ab_batched.name = "alpha, beta, broadcast batch";
  ab_batched.alpha = -2;
  ab_batched.beta = 0.25;
  v.push_back(ab_batched);
  GemmCase big{"larger (parallel rows)", 1, 1, 64, 200, 300, {}, {}, {}};
  v.push_back(big);
  GemmCase vec{"m = 1, k = 1", 1, 1, 1, 40, 1, {}, {}, {}};
  v.push_back(vec);
  return v;
}

TEST(GemmCpu, LibraryPlansMatchNaiveLoop) {
  Ctx c;
  rt_pool *pool = rt_pool_new(c.ctx, 2);
  ASSERT_NE(pool, nullptr);
  int library = 0;
  for (const GemmCase &gc : gemm_cases()) {
    std::string impl;
    check_gemm(gc, pool, 0, &impl);
    if (impl.rfind("onednn:", 0) == 0 || impl.rfind("dsc:sgemm", 0) == 0) library++;
  }
#ifdef DSC_HAVE_LLVM
  // oneDNN takes at least the plain, transposed and batched cases.
  EXPECT_GE(library, 5);
#else
  EXPECT_EQ(library, 0);
#endif
  rt_pool_free(pool);
}

TEST(GemmCpu, LoopFallbackMatchesNaiveLoop) {
  Ctx c;
  for (int threads : {1, 3}) {
    rt_pool *pool = rt_pool_new(c.ctx, threads);
    ASSERT_NE(pool, nullptr);
    for (const GemmCase &gc : gemm_cases()) {
      std::string impl;
      check_gemm(gc, pool, RT_GEMM_NO_LIBRARY, &impl);
      EXPECT_EQ(impl, "loop");
    }
    rt_pool_free(pool);
  }
}

// bf16 A and B with an f32 C: compared with the double product of the
// bf16-rounded inputs (both accumulate in f32: same 1e-5 bound).
TEST(GemmCpu, Bf16InputsF32Output) {
  Ctx c;
  rt_pool *pool = rt_pool_new(c.ctx, 2);
  rt_gemm_engine *e = rt_gemm_engine_new(c.ctx, pool);
  ASSERT_NE(e, nullptr) << c.diags();
  const int64_t M = 24, N = 40, K = 56;
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<uint16_t> a(M * K), b(N * K);
  for (auto &x : a) x = ir_bf16_bits(u(rng));
  for (auto &x : b) x = ir_bf16_bits(u(rng));
  cg_gemm g{};
  g.batch[0] = g.batch[1] = 1;
  g.m = M;
  g.n = N;
  g.k = K;
  g.a.row_stride = K;
  g.a.col_stride = 1;
  g.b.row_stride = 1;  // B stored [N, K]: transposed
  g.b.col_stride = K;
  g.c.row_stride = N;
  g.c.col_stride = 1;
  g.alpha = 1;
  for (int flags : {0, (int)RT_GEMM_NO_LIBRARY}) {
    rt_gemm_plan *pl = rt_gemm_plan_new(e, &g, DSC_BF16, DSC_F32, flags);
    ASSERT_NE(pl, nullptr) << c.diags();
    std::vector<float> out(M * N, 123.f);
    char err[256];
    ASSERT_TRUE(rt_gemm_run(pl, a.data(), b.data(), out.data(), err, sizeof err)) << err;
    double max_err = 0, max_ref = 0;
    for (int64_t i = 0; i < M; i++)
      for (int64_t j = 0; j < N; j++) {
        double s = 0;
        for (int64_t p = 0; p < K; p++)
          s += ir_bf16_value(a[i * K + p]) * ir_bf16_value(b[j * K + p]);
        max_err = std::max(max_err, std::fabs(out[i * N + j] - s));
        max_ref = std::max(max_ref, std::fabs(s));
      }
    EXPECT_LT(max_err / max_ref, 1e-5) << rt_gemm_plan_impl(pl);
    rt_gemm_plan_free(pl);
  }
  rt_gemm_engine_free(e);
  rt_pool_free(pool);
}

TEST(GemmCpu, MalformedGemmIsRejected) {
  Ctx c;
  rt_pool *pool = rt_pool_new(c.ctx, 1);
  rt_gemm_engine *e = rt_gemm_engine_new(c.ctx, pool);
  ASSERT_NE(e, nullptr);
  cg_gemm g{};
  g.batch[0] = 1;
  g.batch[1] = 2;
  g.m = g.n = g.k = 4;
  g.a.row_stride = g.b.row_stride = g.c.row_stride = 4;
  g.a.col_stride = g.b.col_stride = g.c.col_stride = 1;
  g.a.batch_stride[1] = g.b.batch_stride[1] = 16;
  g.c.batch_stride[1] = 0;  // two batches writing one C
  EXPECT_EQ(rt_gemm_plan_new(e, &g, DSC_F32, DSC_F32, 0), nullptr);
  EXPECT_NE(c.diags().find("C cannot be broadcast"), std::string::npos) << c.diags();
  g.c.batch_stride[1] = 16;
  g.a.row_stride = -4;
  EXPECT_EQ(rt_gemm_plan_new(e, &g, DSC_F32, DSC_F32, 0), nullptr);
  g.a.row_stride = 4;
  g.k = 0;
  EXPECT_EQ(rt_gemm_plan_new(e, &g, DSC_F32, DSC_F32, 0), nullptr);
  g.k = 4;
  EXPECT_EQ(rt_gemm_plan_new(e, &g, DSC_I32, DSC_F32, 0), nullptr);
  rt_gemm_engine_free(e);
  rt_pool_free(pool);
}

// ---------------- the executor ----------------

// Hand-written kernels with the CPU kernel ABI, matching the kernel IR the
// program carries (so that a reference evaluator can run the same program).
constexpr int64_t R = 6, C = 5, N = 7, V = 4;

// z[r, c] = x[r, c] + p[r, c]
void k_add(void *const *args, int64_t b, int64_t e, int32_t *) {
  const float *x = (const float *)args[0], *p = (const float *)args[1];
  float *z = (float *)args[2];
  for (int64_t r = b; r < e; r++)
    for (int64_t c = 0; c < C; c++) z[r * C + c] = x[r * C + c] + p[r * C + c];
}

// s[r] = sum_n m[r, n]
void k_rowsum(void *const *args, int64_t b, int64_t e, int32_t *) {
  const float *m = (const float *)args[0];
  float *s = (float *)args[1];
  for (int64_t r = b; r < e; r++) {
    float acc = 0;
    for (int64_t n = 0; n < N; n++) acc += m[r * N + n];
    s[r] = acc;
  }
}

// out[r, n] = table[ids[r], n], status 1 for an id outside [0, V)
void k_gather(void *const *args, int64_t b, int64_t e, int32_t *status) {
  const float *t = (const float *)args[0];
  const int32_t *ids = (const int32_t *)args[1];
  float *out = (float *)args[2];
  for (int64_t r = b; r < e; r++) {
    int32_t id = ids[r];
    for (int64_t n = 0; n < N; n++) {
      if (id < 0 || id >= V) {
        *status = 1;
        out[r * N + n] = 0;
      } else {
        out[r * N + n] = t[id * N + n];
      }
    }
  }
}

kir_access acc(int arg, std::initializer_list<int64_t> strides) {
  kir_access x;
  memset(&x, 0, sizeof x);
  x.arg = arg;
  int d = 0;
  for (int64_t s : strides) x.stride[d++] = s;
  return x;
}

// A program over params P [R, C], W [C, N], S [R] (a state), T [V, N] and
// inputs X [R, C] f32, ids [R] i32:
//   0 LAUNCH z = x + p          3 LAUNCH e = T[ids]   (gather)
//   1 GEMM   m = z . W          4 EMBEDDING_GRAD g[V, N] from ids, m
//   2 LAUNCH s = rowsum(m)      5 COPY   y = z[1:, :] (flattened)
// outputs s, g, e, y; assign S <- s.
struct TestProgram {
  ir_arena arena;
  cg_program p{};
  cg_buffer bufs[12];
  kir_kernel kernels[3];
  kir_kernel *kptrs[3];
  kir_arg kargs[3][3];
  kir_stage stages[3][2];
  dsc_dtype slot_f32 = DSC_F32;
  cg_instr ins[6];
  int args[3][3] = {{3, 0, 5}, {6, 7, -1}, {9, 4, 10}};
  cg_output outs[4];
  cg_assign assign{};
  cg_cpu_kernel_fn fns[3] = {k_add, k_rowsum, k_gather};
  int64_t state_bytes = 0;
  enum { P = 0, W, S, X, IDS, Z, M, SB, G, T, E, Y };

  explicit TestProgram(dsc_context *ctx) {
    ir_arena_init(&arena, ctx);
    int64_t state = 0, work = 0;
    auto add = [&](int i, cg_buf_kind kind, int index, dsc_dtype dt, int64_t numel) {
      cg_buffer &b = bufs[i];
      b.kind = kind;
      b.index = index;
      b.dtype = dt;
      b.numel = numel;
      int64_t &off = kind == CG_BUF_PARAM ? state : work;
      b.offset = off;
      off += (numel * (int64_t)dsc_dtype_size(dt) + 63) / 64 * 64;
      b.first_use = b.last_use = -1;
      b.tier = CG_TIER_DEVICE;
    };
    add(P, CG_BUF_PARAM, 0, DSC_F32, R * C);
    add(W, CG_BUF_PARAM, 1, DSC_F32, C * N);
    add(S, CG_BUF_PARAM, 2, DSC_F32, R);
    add(X, CG_BUF_INPUT, 0, DSC_F32, R * C);
    add(IDS, CG_BUF_INPUT, 1, DSC_I32, R);
    add(Z, CG_BUF_TEMP, 0, DSC_F32, R * C);
    add(M, CG_BUF_TEMP, 0, DSC_F32, R * N);
    add(SB, CG_BUF_TEMP, 0, DSC_F32, R);
    add(G, CG_BUF_TEMP, 0, DSC_F32, V * N);
    add(T, CG_BUF_PARAM, 3, DSC_F32, V * N);
    add(E, CG_BUF_TEMP, 0, DSC_F32, R * N);
    add(Y, CG_BUF_TEMP, 0, DSC_F32, (R - 1) * C);
    state_bytes = state;
    p.graph_name = "test";
    p.n_buffers = p.cap_buffers = 12;
    p.buffers = bufs;
    p.arena_bytes[CG_ARENA_STATE] = state;
    p.arena_bytes[CG_ARENA_WORK] = work;

    ir_arena *a = &arena;
    // kernel 0: add, domain [R, C]
    kir_kernel &k0 = kernels[0];
    k0 = kir_kernel{};
    k0.name = "add";
    k0.rank = 2;
    k0.n_outer = 1;
    k0.dims[0] = R;
    k0.dims[1] = C;
    k0.n_args = 3;
    k0.args = kargs[0];
    for (int i = 0; i < 3; i++) kargs[0][i] = kir_arg{DSC_F32, R * C, i < 2, i == 2};
    stages[0][0] = kir_stage{};
    stages[0][0].kind = KIR_STAGE_STORE;
    stages[0][0].over_inner = true;
    stages[0][0].dst = acc(2, {C, 1});
    stages[0][0].expr = kir_bin(a, KIR_ADD, kir_load(a, DSC_F32, acc(0, {C, 1})),
                                kir_load(a, DSC_F32, acc(1, {C, 1})));
    k0.n_stages = 1;
    k0.stages = stages[0];
    // kernel 1: row sum, domain [R, N]
    kir_kernel &k1 = kernels[1];
    k1 = kir_kernel{};
    k1.name = "rowsum";
    k1.rank = 2;
    k1.n_outer = 1;
    k1.dims[0] = R;
    k1.dims[1] = N;
    k1.n_args = 2;
    k1.args = kargs[1];
    kargs[1][0] = kir_arg{DSC_F32, R * N, true, false};
    kargs[1][1] = kir_arg{DSC_F32, R, false, true};
    k1.n_slots = 1;
    k1.slot_types = &slot_f32;
    stages[1][0] = kir_stage{};
    stages[1][0].kind = KIR_STAGE_REDUCE;
    stages[1][0].reduce = KIR_REDUCE_SUM;
    stages[1][0].slot = 0;
    stages[1][0].expr = kir_load(a, DSC_F32, acc(0, {N, 1}));
    stages[1][1] = kir_stage{};
    stages[1][1].kind = KIR_STAGE_STORE;
    stages[1][1].over_inner = false;
    stages[1][1].dst = acc(1, {1, 0});
    stages[1][1].expr = kir_scalar(a, DSC_F32, 0);
    k1.n_stages = 2;
    k1.stages = stages[1];
    // kernel 2: gather rows of T by ids, domain [R, N]
    kir_kernel &k2 = kernels[2];
    k2 = kir_kernel{};
    k2.name = "gather";
    k2.rank = 2;
    k2.n_outer = 1;
    k2.dims[0] = R;
    k2.dims[1] = N;
    k2.n_args = 3;
    k2.args = kargs[2];
    kargs[2][0] = kir_arg{DSC_F32, V * N, true, false};
    kargs[2][1] = kir_arg{DSC_I32, R, true, false};
    kargs[2][2] = kir_arg{DSC_F32, R * N, false, true};
    kir_access ga = acc(0, {0, 1});
    ga.gather = kir_load(a, DSC_I64, acc(1, {1, 0}));
    ga.gather_stride = N;
    ga.gather_bound = V;
    stages[2][0] = kir_stage{};
    stages[2][0].kind = KIR_STAGE_STORE;
    stages[2][0].over_inner = true;
    stages[2][0].dst = acc(2, {N, 1});
    stages[2][0].expr = kir_load(a, DSC_F32, ga);
    k2.n_stages = 1;
    k2.stages = stages[2];
    for (int i = 0; i < 3; i++) kptrs[i] = &kernels[i];
    p.n_kernels = p.cap_kernels = 3;
    p.kernels = kptrs;
    EXPECT_EQ(cg_program_kernel_table(&arena, &p), DSC_OK);  // the executors read kernel_info

    for (auto &i : ins) i = cg_instr{};
    ins[0].kind = CG_INS_LAUNCH;
    ins[0].kernel = 0;
    ins[0].n_args = 3;
    ins[0].args = args[0];
    ins[1].kind = CG_INS_GEMM;
    cg_gemm &g = ins[1].gemm;
    g.batch[0] = g.batch[1] = 1;
    g.m = R;
    g.n = N;
    g.k = C;
    g.a = cg_matrix{Z, 0, {0, 0}, C, 1};
    g.b = cg_matrix{W, 0, {0, 0}, N, 1};
    g.c = cg_matrix{M, 0, {0, 0}, N, 1};
    g.alpha = 1;
    ins[2].kind = CG_INS_LAUNCH;
    ins[2].kernel = 1;
    ins[2].n_args = 2;
    ins[2].args = args[1];
    ins[3].kind = CG_INS_LAUNCH;
    ins[3].kernel = 2;
    ins[3].n_args = 3;
    ins[3].args = args[2];
    ins[4].kind = CG_INS_EMBEDDING_GRAD;
    ins[4].ids = IDS;
    ins[4].src = M;
    ins[4].dst = G;
    ins[4].n_ids = R;
    ins[4].rows = V;
    ins[4].cols = N;
    ins[5].kind = CG_INS_COPY;
    ins[5].src = Z;
    ins[5].dst = Y;
    ins[5].numel = (R - 1) * C;
    ins[5].src_offset = C;
    ins[5].dst_offset = 0;
    p.n_instrs = p.cap_instrs = 6;
    p.instrs = ins;

    int ob[4] = {SB, G, E, Y};
    int64_t on[4] = {R, V * N, R * N, (R - 1) * C};
    for (int o = 0; o < 4; o++) {
      outs[o].buffer = ob[o];
      outs[o].offset = 0;
      outs[o].type = dsc_type_make(DSC_F32, 1, &on[o]);
    }
    p.n_outputs = 4;
    p.outputs = outs;
    assign.param = 2;
    assign.buffer = SB;
    assign.in_place = false;
    p.n_assigns = 1;
    p.assigns = &assign;
  }
  ~TestProgram() { ir_arena_release(&arena); }
};

struct Data {
  std::vector<float> P, W, S, T, X;
  std::vector<int32_t> ids;
  explicit Data(unsigned seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    auto fill = [&](std::vector<float> &v, int64_t n) {
      v.resize(n);
      for (auto &x : v) x = u(rng);
    };
    fill(P, R * C);
    fill(W, C * N);
    fill(S, R);
    fill(T, V * N);
    fill(X, R * C);
    ids = {3, 0, 3, 1, 2, 3};  // repeated rows: the gradient accumulates
  }
};

void put_state(rt_cpu_exec *e, const TestProgram &tp, const Data &d) {
  char *st = (char *)rt_cpu_exec_state(e);
  memcpy(st + tp.bufs[TestProgram::P].offset, d.P.data(), d.P.size() * 4);
  memcpy(st + tp.bufs[TestProgram::W].offset, d.W.data(), d.W.size() * 4);
  memcpy(st + tp.bufs[TestProgram::S].offset, d.S.data(), d.S.size() * 4);
  memcpy(st + tp.bufs[TestProgram::T].offset, d.T.data(), d.T.size() * 4);
}

const float *state_S(rt_cpu_exec *e, const TestProgram &tp) {
  return (const float *)((char *)rt_cpu_exec_state(e) + tp.bufs[TestProgram::S].offset);
}

// Results in double, computed directly from the definitions. Tolerance for
// the f32 results: 1e-5 relative to the largest magnitude of each output.
void expect_matches_reference(const Data &d, void *const *outs) {
  std::vector<double> z(R * C), m(R * N), s(R, 0), g(V * N, 0);
  for (int64_t i = 0; i < R * C; i++) z[i] = (double)d.X[i] + d.P[i];
  for (int64_t r = 0; r < R; r++)
    for (int64_t n = 0; n < N; n++) {
      double acc = 0;
      for (int64_t c = 0; c < C; c++) acc += (double)(float)z[r * C + c] * d.W[c * N + n];
      m[r * N + n] = acc;
      s[r] += acc;
      g[d.ids[r] * N + n] += acc;
    }
  auto check = [](const char *what, const float *got, const std::vector<double> &ref) {
    double max_ref = 0, max_err = 0;
    for (size_t i = 0; i < ref.size(); i++) {
      max_ref = std::max(max_ref, std::fabs(ref[i]));
      max_err = std::max(max_err, std::fabs(got[i] - ref[i]));
    }
    EXPECT_GT(max_ref, 0.1) << what;
    EXPECT_LT(max_err, 1e-5 * max_ref) << what;
  };
  check("s", (const float *)outs[0], s);
  check("embedding gradient", (const float *)outs[1], g);
  const float *e = (const float *)outs[2];
  for (int64_t r = 0; r < R; r++)
    for (int64_t n = 0; n < N; n++) ASSERT_EQ(e[r * N + n], d.T[d.ids[r] * N + n]);
  const float *y = (const float *)outs[3];
  for (int64_t i = 0; i < (R - 1) * C; i++) ASSERT_EQ(y[i], (float)z[C + i]);
}

// The same program through the reference evaluator (codegen/program_eval.c:
// kir_eval kernels, double-accumulated GEMMs). Tolerance: 1e-5 relative to
// each output's largest magnitude (the GEMM accumulates in f32 here).
void expect_matches_program_eval(const TestProgram &tp, const Data &d, void *const *outs) {
  std::vector<double> state_store(tp.state_bytes / 8 + 1), work_store(tp.p.arena_bytes[1] / 8 + 1);
  char *state = (char *)state_store.data(), *work = (char *)work_store.data();
  memcpy(state + tp.bufs[TestProgram::P].offset, d.P.data(), d.P.size() * 4);
  memcpy(state + tp.bufs[TestProgram::W].offset, d.W.data(), d.W.size() * 4);
  memcpy(state + tp.bufs[TestProgram::S].offset, d.S.data(), d.S.size() * 4);
  memcpy(state + tp.bufs[TestProgram::T].offset, d.T.data(), d.T.size() * 4);
  memcpy(work + tp.bufs[TestProgram::X].offset, d.X.data(), d.X.size() * 4);
  memcpy(work + tp.bufs[TestProgram::IDS].offset, d.ids.data(), d.ids.size() * 4);
  char err[256] = "";
  ASSERT_TRUE(cg_program_eval(&tp.p, state, work, err, sizeof err)) << err;
  for (int o = 0; o < tp.p.n_outputs; o++) {
    const float *ref = (const float *)(work + tp.bufs[tp.outs[o].buffer].offset);
    const float *got = (const float *)outs[o];
    int64_t n = dsc_type_numel(&tp.outs[o].type);
    double max_ref = 0, max_err = 0;
    for (int64_t i = 0; i < n; i++) {
      max_ref = std::max(max_ref, (double)std::fabs(ref[i]));
      max_err = std::max(max_err, (double)std::fabs(got[i] - ref[i]));
    }
    EXPECT_GT(max_ref, 0.1) << "output " << o;
    EXPECT_LE(max_err, 1e-5 * max_ref) << "output " << o;
  }
}

TEST(ExecCpu, RunsLaunchGemmEmbeddingGradCopyAndAssigns) {
  Ctx c;
  TestProgram tp(c.ctx);
  ASSERT_FALSE(tp.arena.failed);
  char kerr[256];
  for (int k = 0; k < 3; k++) ASSERT_TRUE(kir_validate(&tp.kernels[k], kerr, sizeof kerr)) << kerr;
  std::vector<std::vector<float>> results;
  for (int threads : {1, 3}) {
    const cg_program *progs[1] = {&tp.p};
    cg_cpu_kernel_fn *fns[1] = {tp.fns};
    rt_cpu_exec *e = rt_cpu_exec_new(c.ctx, progs, 1, fns, threads, tp.state_bytes);
    ASSERT_NE(e, nullptr) << c.diags();
    Data d(99);
    put_state(e, tp, d);
    rt_cpu_exec_set_profiling(e, true);
    for (int run = 0; run < 3; run++) {  // steady state: same inputs, same results
      void *inputs[2] = {d.X.data(), d.ids.data()};
      void *outs[4] = {};
      char err[256] = "";
      ASSERT_TRUE(rt_cpu_exec_run(e, 0, inputs, outs, err, sizeof err)) << err;
      expect_matches_reference(d, outs);
      if (run == 0) expect_matches_program_eval(tp, d, outs);
      // the assign wrote s into the state S
      for (int64_t r = 0; r < R; r++) ASSERT_EQ(state_S(e, tp)[r], ((const float *)outs[0])[r]);
      if (run == 2) {
        std::vector<float> all;
        for (int o = 0; o < 4; o++) {
          const float *f = (const float *)outs[o];
          all.insert(all.end(), f, f + dsc_type_numel(&tp.outs[o].type));
        }
        results.push_back(all);
      }
    }
    int n = 0;
    int64_t runs = 0;
    const int64_t *ns = rt_cpu_exec_profile(e, 0, &n, &runs);
    EXPECT_EQ(n, 6);
    EXPECT_EQ(runs, 3);
    int64_t total = 0;
    for (int i = 0; i < n; i++) total += ns[i];
    EXPECT_GT(total, 0);
    const rt_gemm_plan *pl = rt_cpu_exec_gemm_plan(e, 0, 1);
    ASSERT_NE(pl, nullptr);
    EXPECT_EQ(rt_cpu_exec_gemm_plan(e, 0, 0), nullptr);
    rt_cpu_exec_free(e);
  }
  // One thread and three threads give bit-identical results.
  ASSERT_EQ(results.size(), 2u);
  EXPECT_EQ(results[0], results[1]);
}

TEST(ExecCpu, KernelIndexOutOfRangeFailsAndSkipsAssigns) {
  Ctx c;
  TestProgram tp(c.ctx);
  tp.ins[3].op = dsc_op_name(DSC_OP_EMBEDDING);  // the gather kernel came from an embedding
  const cg_program *progs[1] = {&tp.p};
  cg_cpu_kernel_fn *fns[1] = {tp.fns};
  rt_cpu_exec *e = rt_cpu_exec_new(c.ctx, progs, 1, fns, 2, tp.state_bytes);
  ASSERT_NE(e, nullptr) << c.diags();
  Data d(5);
  put_state(e, tp, d);
  d.ids[4] = V;  // out of range
  void *inputs[2] = {d.X.data(), d.ids.data()};
  void *outs[4] = {};
  char err[256] = "";
  EXPECT_FALSE(rt_cpu_exec_run(e, 0, inputs, outs, err, sizeof err));
  EXPECT_NE(std::string(err).find("embedding: index out of range"), std::string::npos) << err;
  for (int64_t r = 0; r < R; r++) EXPECT_EQ(state_S(e, tp)[r], d.S[r]) << "assign applied";
  // A negative id fails the same way; a good run afterwards succeeds.
  d.ids[4] = -1;
  EXPECT_FALSE(rt_cpu_exec_run(e, 0, inputs, outs, err, sizeof err));
  d.ids[4] = 1;
  ASSERT_TRUE(rt_cpu_exec_run(e, 0, inputs, outs, err, sizeof err)) << err;
  expect_matches_reference(d, outs);
  rt_cpu_exec_free(e);
}

TEST(ExecCpu, EmbeddingGradIdOutOfRangeFails) {
  Ctx c;
  TestProgram tp(c.ctx);
  tp.p.n_instrs = 5;  // the embedding gradient runs before anything reads its ids
  std::swap(tp.ins[3], tp.ins[4]);
  const cg_program *progs[1] = {&tp.p};
  cg_cpu_kernel_fn *fns[1] = {tp.fns};
  rt_cpu_exec *e = rt_cpu_exec_new(c.ctx, progs, 1, fns, 3, tp.state_bytes);
  ASSERT_NE(e, nullptr) << c.diags();
  Data d(6);
  put_state(e, tp, d);
  d.ids[0] = 1000;
  void *inputs[2] = {d.X.data(), d.ids.data()};
  void *outs[4] = {};
  char err[256] = "";
  EXPECT_FALSE(rt_cpu_exec_run(e, 0, inputs, outs, err, sizeof err));
  EXPECT_NE(std::string(err).find("embedding gradient: index out of range: id 1000 at position 0 "
                                  "is outside [0, 4) (instruction 3)"),
            std::string::npos)
      << err;
  for (int64_t r = 0; r < R; r++) EXPECT_EQ(state_S(e, tp)[r], d.S[r]);
  rt_cpu_exec_free(e);
}

TEST(ExecCpu, MalformedProgramsAreRejectedAtLoad) {
  struct Breaker {
    const char *expect;
    void (*apply)(TestProgram &);
  };
  const Breaker breakers[] = {
      {"outside its arena", [](TestProgram &t) { t.bufs[TestProgram::Z].offset += 1 << 20; }},
      {"takes 3 arguments", [](TestProgram &t) { t.ins[0].n_args = 2; }},
      {"does not fit buffer", [](TestProgram &t) { t.args[0][2] = TestProgram::IDS; }},
      {"kernel 7 does not exist", [](TestProgram &t) { t.ins[0].kernel = 7; }},
      {"GEMM operand B reaches past", [](TestProgram &t) { t.ins[1].gemm.b.offset = 1; }},
      {"sizes do not fit", [](TestProgram &t) { t.ins[4].rows = 1000; }},
      {"copy: range outside", [](TestProgram &t) { t.ins[5].src_offset = 2 * C; }},
      {"output 2 does not fit", [](TestProgram &t) { t.outs[2].offset = 1; }},
      {"which assign 0 overwrites", [](TestProgram &t) { t.outs[0].buffer = TestProgram::S; }},
  };
  for (const Breaker &b : breakers) {
    Ctx c;
    TestProgram tp(c.ctx);
    b.apply(tp);
    const cg_program *progs[1] = {&tp.p};
    cg_cpu_kernel_fn *fns[1] = {tp.fns};
    EXPECT_EQ(rt_cpu_exec_new(c.ctx, progs, 1, fns, 2, tp.state_bytes), nullptr) << b.expect;
    EXPECT_NE(c.diags().find(b.expect), std::string::npos) << c.diags();
  }
}

}  // namespace
