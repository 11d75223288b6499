// dsc's packed GEMM (runtime/sgemm.c) through the CPU GEMM plans
// (runtime/gemm_cpu.c): every layout of cg_gemm against a double-precision
// reference, beta == 0 never reading C, and results bitwise independent of
// the thread count, on every kernel (AVX-512, AVX2, forced by DSC_CPU_ISA)
// and every dtype pair it takes (f32 or bf16 operands, f32 or bf16 C), and
// for bf16 operands the vdpbf16ps kernel (AVX512-BF16 hosts) next to its
// converting sibling.
//
// The reference is what the interpreter computes for a matmul
// (ir/interp_ops.c interp_matmul): the operands' values (bf16 decoded
// exactly) multiplied and summed in double, rounded once into C's dtype.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <cstdlib>

#include "runtime/runtime.h"
#include "tests/unit/test_util.h"

namespace {

struct Ctx {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  ~Ctx() { dsc_context_free(ctx); }
  std::string diags() const { return ::diags(ctx); }
};

// The kernel and dtypes every test runs with (a test parameter).
struct Mode {
  cg_cpu_isa isa;
  dsc_dtype ab, c;
  bool dpbf16 = false;  // the vdpbf16ps kernel (else bf16 widened to f32)
};
const Mode *g_mode = nullptr;  // the running test's

std::string mode_name(const Mode &m) {
  std::string s = cg_cpu_isa_name(m.isa);
  s += m.ab == DSC_BF16 ? "_bf16" : "_f32";
  s += m.c == DSC_BF16 ? "_bf16" : "_f32";
  return m.dpbf16 ? s + "_dpbf16" : s;
}

std::string expected_impl(const Mode &m) {
  if (m.dpbf16) return "dsc:sgemm-avx512-dpbf16";
  return std::string("dsc:sgemm-") + cg_cpu_isa_name(m.isa) + (m.ab == DSC_BF16 ? "-bf16" : "");
}

int mode_flags(const Mode &m) { return m.dpbf16 ? RT_GEMM_DPBF16 : 0; }

bool host_has(const Mode &m) {
  __builtin_cpu_init();
  return cg_cpu_isa_host() >= m.isa && (!m.dpbf16 || __builtin_cpu_supports("avx512bf16"));
}

// Sets DSC_CPU_ISA for the test's plans and restores it after.
class IsaEnv {
 public:
  explicit IsaEnv(const char *isa) {
    const char *old = getenv("DSC_CPU_ISA");
    had_ = old != nullptr;
    if (old) old_ = old;
    if (isa)
      setenv("DSC_CPU_ISA", isa, 1);
    else
      unsetenv("DSC_CPU_ISA");
  }
  ~IsaEnv() {
    if (had_)
      setenv("DSC_CPU_ISA", old_.c_str(), 1);
    else
      unsetenv("DSC_CPU_ISA");
  }

 private:
  bool had_ = false;
  std::string old_;
};

// How one operand is laid out: row-major, transposed (unit row stride) or
// fully strided (no unit stride: every element `gap` apart), with padding
// between rows/matrices, an offset, and batch dims it broadcasts over.
enum class Kind { Rows, Cols, Strided };
struct Layout {
  Kind kind = Kind::Rows;
  int64_t offset = 0, pad = 0, gap = 2;
  bool bcast[2] = {false, false};
};

// data: every element's value; for a bf16 operand h holds its bits (what
// the GEMM reads and writes) and data the values they decode to.
struct Operand {
  cg_matrix m{};
  dsc_dtype dt = DSC_F32;
  std::vector<float> data;
  std::vector<uint16_t> h;
  void *ptr() { return dt == DSC_BF16 ? (void *)h.data() : (void *)data.data(); }
  float value(size_t i) const { return dt == DSC_BF16 ? (float)ir_bf16_value(h[i]) : data[i]; }
  // bitwise equality of element i with o's
  bool same(const Operand &o, size_t i) const {
    if (dt == DSC_BF16) return h[i] == o.h[i];
    return std::memcmp(&data[i], &o.data[i], sizeof(float)) == 0;
  }
  size_t size() const { return data.size(); }
};

Operand make(std::mt19937 &rng, int64_t b0, int64_t b1, int64_t rows, int64_t cols, const Layout &l,
             float fill_nan = 0, dsc_dtype dt = DSC_F32) {
  Operand o;
  int64_t mat;
  switch (l.kind) {
    case Kind::Rows:
      o.m.col_stride = 1;
      o.m.row_stride = cols + l.pad;
      mat = rows * o.m.row_stride;
      break;
    case Kind::Cols:
      o.m.row_stride = 1;
      o.m.col_stride = rows + l.pad;
      mat = cols * o.m.col_stride;
      break;
    default:
      o.m.col_stride = l.gap;
      o.m.row_stride = cols * l.gap + l.pad;
      mat = rows * o.m.row_stride;
      break;
  }
  o.m.offset = l.offset;
  o.m.batch_stride[1] = l.bcast[1] ? 0 : mat;
  o.m.batch_stride[0] = l.bcast[0] ? 0 : mat * (l.bcast[1] ? 1 : b1);
  o.data.resize(l.offset + mat * b0 * b1 + 5);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (auto &x : o.data) x = fill_nan != 0 ? std::numeric_limits<float>::quiet_NaN() : u(rng);
  o.dt = dt;
  if (dt == DSC_BF16) {
    o.h.resize(o.data.size());
    for (size_t i = 0; i < o.data.size(); i++) {
      o.h[i] = ir_bf16_bits(o.data[i]);
      o.data[i] = (float)ir_bf16_value(o.h[i]);
    }
  }
  return o;
}

int64_t index(const Operand &o, int64_t b0, int64_t b1, int64_t r, int64_t c) {
  const cg_matrix &m = o.m;
  return m.offset + b0 * m.batch_stride[0] + b1 * m.batch_stride[1] + r * m.row_stride +
         c * m.col_stride;
}

double at(const Operand &o, int64_t b0, int64_t b1, int64_t r, int64_t c) {
  return o.value(index(o, b0, b1, r, c));
}

struct Case {
  std::string name;
  int64_t b0 = 1, b1 = 1, m, n, k;
  Layout la, lb, lc;
  double alpha = 1, beta = 0;
  bool nan_c = false;  // C starts as NaN (only with beta == 0)
};

struct Prepared {
  Case cs;
  Operand a, b, c, c0;
  cg_gemm g{};
  rt_gemm_plan *plan = nullptr;
};

void prepare(Prepared &p, rt_gemm_engine *e, Ctx &c) {
  const Case &cs = p.cs;
  const Mode &mode = *g_mode;
  std::mt19937 rng(99 + (unsigned)(cs.m * 131 + cs.n * 17 + cs.k));
  p.a = make(rng, cs.b0, cs.b1, cs.m, cs.k, cs.la, 0, mode.ab);
  p.b = make(rng, cs.b0, cs.b1, cs.k, cs.n, cs.lb, 0, mode.ab);
  p.c = make(rng, cs.b0, cs.b1, cs.m, cs.n, cs.lc, cs.nan_c ? 1.f : 0.f, mode.c);
  p.c0 = p.c;
  p.g.batch[0] = cs.b0;
  p.g.batch[1] = cs.b1;
  p.g.m = cs.m;
  p.g.n = cs.n;
  p.g.k = cs.k;
  p.g.a = p.a.m;
  p.g.b = p.b.m;
  p.g.c = p.c.m;
  p.g.alpha = cs.alpha;
  p.g.beta = cs.beta;
  ASSERT_LE(cg_gemm_extent(&p.g, 0), (int64_t)p.a.data.size());
  ASSERT_LE(cg_gemm_extent(&p.g, 1), (int64_t)p.b.data.size());
  ASSERT_LE(cg_gemm_extent(&p.g, 2), (int64_t)p.c.data.size());
  p.plan = rt_gemm_plan_new(e, &p.g, mode.ab, mode.c, mode_flags(mode));
  ASSERT_NE(p.plan, nullptr) << c.diags();
  EXPECT_EQ(rt_gemm_plan_impl(p.plan), expected_impl(mode));
}

bool run(Prepared &p, char *err, size_t errlen) {
  return rt_gemm_run(p.plan, p.a.ptr(), p.b.ptr(), p.c.ptr(), err, errlen);
}

// Every element against a double reference. Tolerance: the classic bound
// for a length-k f32 dot product plus the alpha/beta update,
// |err| <= (k + 4) * 2^-23 * (|alpha| sum_p |a_ip b_pj| + |beta c_ij|),
// i.e. proportional to the magnitudes involved, never absolute. bf16
// operands take the same bound (their products are exact in f32; only the
// f32 sums round; vdpbf16ps rounds each of its two adds as an FMA, so the
// same bound holds for it, in another order of k). A bf16 C adds its one rounding to nearest even
// of the f32 result y (|y - ref| <= e, the bound above): 2^-8 |y| <= 2^-8 (|ref| + e).
void check(const Prepared &p) {
  const Case &cs = p.cs;
  double worst = 0;
  for (int64_t i0 = 0; i0 < cs.b0; i0++)
    for (int64_t i1 = 0; i1 < cs.b1; i1++)
      for (int64_t i = 0; i < cs.m; i++)
        for (int64_t j = 0; j < cs.n; j++) {
          double s = 0, mag = 0;
          for (int64_t q = 0; q < cs.k; q++) {
            double x = at(p.a, i0, i1, i, q) * at(p.b, i0, i1, q, j);
            s += x;
            mag += std::fabs(x);
          }
          double ref = cs.alpha * s, bound = std::fabs(cs.alpha) * mag;
          if (cs.beta != 0) {
            ref += cs.beta * at(p.c0, i0, i1, i, j);
            bound += std::fabs(cs.beta * at(p.c0, i0, i1, i, j));
          }
          double got = at(p.c, i0, i1, i, j);
          ASSERT_TRUE(std::isfinite(got)) << cs.name << " at " << i << "," << j;
          double tol = (double)(cs.k + 4) * std::ldexp(1.0, -23) * bound;
          if (p.c.dt == DSC_BF16) tol += std::ldexp(1.0, -8) * (std::fabs(ref) + tol);
          ASSERT_LE(std::fabs(got - ref), tol)
              << cs.name << " at (" << i0 << "," << i1 << "," << i << "," << j << ")";
          if (bound > 0) worst = std::max(worst, std::fabs(got - ref) / bound);
        }
  // Elements outside the view (padding, gaps, offsets) are untouched.
  std::vector<bool> in_view(p.c.size(), false);
  for (int64_t i0 = 0; i0 < cs.b0; i0++)
    for (int64_t i1 = 0; i1 < cs.b1; i1++)
      for (int64_t i = 0; i < cs.m; i++)
        for (int64_t j = 0; j < cs.n; j++)
          in_view[p.c.m.offset + i0 * p.c.m.batch_stride[0] + i1 * p.c.m.batch_stride[1] +
                  i * p.c.m.row_stride + j * p.c.m.col_stride] = true;
  for (size_t i = 0; i < p.c.size(); i++) {
    if (in_view[i]) continue;
    ASSERT_TRUE(p.c.same(p.c0, i)) << cs.name << " wrote outside C at " << i;
  }
}

// One test per mode: skipped only where the host lacks the mode's ISA.
class Sgemm : public ::testing::TestWithParam<Mode> {
 protected:
  void SetUp() override {
    const Mode &m = GetParam();
    if (!host_has(m)) GTEST_SKIP() << "this host has no " << mode_name(m);
    env_ = new IsaEnv(cg_cpu_isa_name(m.isa));
    g_mode = &m;
  }
  void TearDown() override {
    delete env_;
    g_mode = nullptr;
  }
  IsaEnv *env_ = nullptr;
};

const Mode kModes[] = {
    {CG_ISA_AVX512, DSC_F32, DSC_F32},        {CG_ISA_AVX512, DSC_BF16, DSC_F32},
    {CG_ISA_AVX512, DSC_BF16, DSC_BF16},      {CG_ISA_AVX512, DSC_F32, DSC_BF16},
    {CG_ISA_AVX2, DSC_F32, DSC_F32},          {CG_ISA_AVX2, DSC_BF16, DSC_F32},
    {CG_ISA_AVX2, DSC_BF16, DSC_BF16},        {CG_ISA_AVX2, DSC_F32, DSC_BF16},
    {CG_ISA_AVX512, DSC_BF16, DSC_F32, true}, {CG_ISA_AVX512, DSC_BF16, DSC_BF16, true},
};
INSTANTIATE_TEST_SUITE_P(Kernels, Sgemm, ::testing::ValuesIn(kModes),
                         [](const ::testing::TestParamInfo<Mode> &i) {
                           return mode_name(i.param);
                         });

std::vector<Case> layout_cases() {
  std::vector<Case> v;
  struct Size {
    int64_t m, n, k;
  };
  // 1x1x1; odd sizes off MR (12), NR (32), the 16-wide transposes; 9x49x769
  // crosses the depth block KC = 384 twice, 20x700x30 the column block NB = 320.
  const Size sizes[] = {{1, 1, 1}, {17, 33, 65}, {9, 49, 769}, {20, 700, 30}};
  const Kind kinds[] = {Kind::Rows, Kind::Cols, Kind::Strided};
  const char *names[] = {"N", "T", "S"};
  for (const Size &s : sizes)
    for (int ka = 0; ka < 3; ka++)
      for (int kb = 0; kb < 3; kb++)
        for (int kc = 0; kc < 3; kc++) {
          Case cs;
          cs.m = s.m;
          cs.n = s.n;
          cs.k = s.k;
          cs.la.kind = kinds[ka];
          cs.lb.kind = kinds[kb];
          cs.lc.kind = kinds[kc];
          cs.la.offset = 3;
          cs.lb.pad = 5;
          cs.lc.offset = 7;
          cs.lc.pad = 2;
          cs.name = std::to_string(s.m) + "x" + std::to_string(s.n) + "x" + std::to_string(s.k) +
                    " A" + names[ka] + " B" + names[kb] + " C" + names[kc];
          v.push_back(cs);
        }
  return v;
}

void run_cases(std::vector<Case> cases, int threads) {
  Ctx c;
  rt_pool *pool = rt_pool_new(c.ctx, threads);
  ASSERT_NE(pool, nullptr);
  rt_gemm_engine *e = rt_gemm_engine_new(c.ctx, pool);
  ASSERT_NE(e, nullptr) << c.diags();
  // Plan every case first: the engine's shared scratch grows as larger
  // GEMMs are planned, and the earlier, smaller plans must still work.
  std::vector<Prepared> ps(cases.size());
  for (size_t i = 0; i < cases.size(); i++) {
    ps[i].cs = cases[i];
    prepare(ps[i], e, c);
    if (::testing::Test::HasFatalFailure()) return;
  }
  char err[256] = "";
  for (Prepared &p : ps) {
    ASSERT_TRUE(run(p, err, sizeof err)) << err;
    check(p);
    rt_gemm_plan_free(p.plan);
  }
  rt_gemm_engine_free(e);
  rt_pool_free(pool);
}

TEST_P(Sgemm, EveryTranspositionAndStrideMatchesDoubleReference) { run_cases(layout_cases(), 2); }

TEST_P(Sgemm, LargeOddShapeAcrossRowBlocks) {
  std::vector<Case> v;
  Case big;
  big.name = "300x70x1000";
  big.m = 300, big.n = 70, big.k = 1000;
  v.push_back(big);
  Case tall;  // crosses the row block MB = 1024, B transposed
  tall.name = "1030x50x20 B^T";
  tall.m = 1030, tall.n = 50, tall.k = 20;
  tall.lb.kind = Kind::Cols;
  v.push_back(tall);
  run_cases(v, 2);
}

TEST_P(Sgemm, AlphaBetaAndNaNFilledCWithBetaZero) {
  std::vector<Case> v;
  for (Kind kc : {Kind::Rows, Kind::Cols, Kind::Strided}) {
    Case ab;
    ab.name = "alpha -0.75 beta 1.5";
    ab.m = 23, ab.n = 97, ab.k = 800;  // two depth blocks: beta applies once
    ab.alpha = -0.75, ab.beta = 1.5;
    ab.lc.kind = kc;
    v.push_back(ab);
    Case nan = ab;
    nan.name = "beta 0, C all NaN";
    nan.alpha = 2, nan.beta = 0, nan.nan_c = true;
    v.push_back(nan);
  }
  run_cases(v, 2);
}

TEST_P(Sgemm, BatchedWithBroadcastOperands) {
  std::vector<Case> v;
  Case bc;
  bc.name = "2x3 batches, A broadcast over dim 1";
  bc.b0 = 2, bc.b1 = 3, bc.m = 19, bc.n = 50, bc.k = 33;
  bc.la.bcast[1] = true;
  bc.alpha = 0.5, bc.beta = -1;
  v.push_back(bc);
  Case bb = bc;
  bb.name = "2x3 batches, B^T broadcast over both dims";
  bb.la.bcast[1] = false;
  bb.lb.bcast[0] = bb.lb.bcast[1] = true;
  bb.lb.kind = Kind::Cols;
  v.push_back(bb);
  Case heads;  // many batches: split over threads by whole batches
  heads.name = "4x12 heads 64x64x64 q.k^T";
  heads.b0 = 4, heads.b1 = 12, heads.m = 64, heads.n = 64, heads.k = 64;
  heads.lb.kind = Kind::Cols;
  v.push_back(heads);
  Case few = bc;  // 3 batches on 2 threads: each batch split over threads
  few.name = "1x3 batches 40x200x64";
  few.b0 = 1, few.m = 40, few.n = 200, few.k = 64;
  v.push_back(few);
  run_cases(v, 2);
}

// The transposed-B packing (16 x 16 register transposes of B^T's rows) at
// its edges: a 16-column panel, a panel of 15, depths off 16 and across the
// depth block, odd leading dimensions and offsets, C both ways.
TEST_P(Sgemm, TransposedBPackingEdges) {
  struct Size {
    int64_t m, n, k;
  };
  // 7x600x700: one depth block of 700 (kc_of) over several column blocks.
  const Size sizes[] = {{13, 48, 400}, {5, 47, 33}, {25, 80, 16}, {3, 16, 399}, {7, 600, 700}};
  std::vector<Case> v;
  for (const Size &sz : sizes)
    for (Kind kc : {Kind::Rows, Kind::Cols}) {
      Case cs;
      cs.m = sz.m, cs.n = sz.n, cs.k = sz.k;
      cs.lb.kind = Kind::Cols;
      cs.lb.offset = 11, cs.lb.pad = 3;
      cs.la.offset = 1, cs.la.pad = 1;
      cs.lc.kind = kc;
      cs.alpha = 1.25, cs.beta = 0.5;
      cs.name = std::to_string(sz.m) + "x" + std::to_string(sz.n) + "x" + std::to_string(sz.k) +
                " B^T C" + (kc == Kind::Rows ? "N" : "T");
      v.push_back(cs);
    }
  run_cases(v, 2);
}

// The same GEMM on 1, 2 and 3 threads (and on the pthread team as well as
// the default one) gives the same bits: threads split M or N (or batches),
// never K.
TEST_P(Sgemm, BitwiseIdenticalForAnyThreadCount) {
  std::vector<Case> v;
  Case wide;
  wide.name = "wide 64x900x800 (split N)";
  wide.m = 64, wide.n = 900, wide.k = 800;
  wide.lb.kind = Kind::Cols;
  v.push_back(wide);
  Case one = wide;  // B^T with K <= 768: a single depth block (kc_of)
  one.name = "wide 64x900x700 B^T, one depth block";
  one.k = 700;
  one.beta = -1;
  v.push_back(one);
  Case tall;
  tall.name = "tall 500x96x300 (split M), C^T";
  tall.m = 500, tall.n = 96, tall.k = 300;
  tall.la.kind = Kind::Cols;
  tall.lc.kind = Kind::Cols;
  tall.beta = 0.5;
  v.push_back(tall);
  Case heads;
  heads.name = "batched 2x6 of 40x64x64";
  heads.b0 = 2, heads.b1 = 6, heads.m = 40, heads.n = 64, heads.k = 64;
  v.push_back(heads);
  Case three = heads;
  three.name = "1x3 batches of 200x200x100";
  three.b0 = 1, three.b1 = 3, three.m = 200, three.n = 200, three.k = 100;
  v.push_back(three);
  for (const Case &cs : v) {
    Operand first;
    for (int team : {1, 2, 3, -2}) {  // negative: a pthread team of -team
      int threads = team < 0 ? -team : team;
      Ctx c;
      rt_pool *pool = team < 0 ? rt_pool_new_pthreads(c.ctx, threads) : rt_pool_new(c.ctx, threads);
      rt_gemm_engine *e = rt_gemm_engine_new(c.ctx, pool);
      ASSERT_NE(e, nullptr) << c.diags();
      Prepared p;
      p.cs = cs;
      prepare(p, e, c);
      if (::testing::Test::HasFatalFailure()) return;
      char err[256] = "";
      for (int rep = 0; rep < 2; rep++) {  // and the same bits run after run
        p.c = p.c0;
        ASSERT_TRUE(run(p, err, sizeof err)) << err;
        if (first.size() == 0) {
          check(p);
          first = p.c;
        } else {
          for (size_t i = 0; i < first.size(); i++)
            ASSERT_TRUE(first.same(p.c, i))
                << cs.name << ": " << threads << " threads, run " << rep << ", element " << i;
        }
      }
      rt_gemm_plan_free(p.plan);
      rt_gemm_engine_free(e);
      rt_pool_free(pool);
    }
  }
}

// A few rows (a decode step's GEMMs: M <= 8 with f32 operands take the
// unpacked path of runtime/sgemm.c) give bitwise the rows the packed path
// gives them inside a 40-row GEMM: the same FMAs in the same order. Row-
// major and transposed B, strided A, one and several depth blocks, column
// edges off 8 and 16, alpha and beta, one and two threads, and batches
// (attention's heads: 12, split whole over the threads; 3, each split by
// columns).
TEST_P(Sgemm, FewRowsEqualTheirRowsOfALargerGemm) {
  struct Shape {
    int64_t n, k;
    Kind b;
    int64_t batches;
  };
  const Shape shapes[] = {
      {37, 100, Kind::Rows, 1}, {300, 769, Kind::Rows, 1}, {600, 64, Kind::Rows, 1},
      {37, 100, Kind::Cols, 1}, {300, 700, Kind::Cols, 1}, {90, 1000, Kind::Cols, 1},
      {1, 9, Kind::Cols, 1},    {1, 1, Kind::Rows, 1},     {70, 64, Kind::Cols, 12},
      {64, 70, Kind::Rows, 12}, {500, 64, Kind::Rows, 3},  {2100, 50, Kind::Rows, 1},
      {1000, 40, Kind::Cols, 1}};
  int compared = 0;
  for (const Shape &sh : shapes)
    for (int64_t m : {1, 2, 3, 8})
      for (int threads : {1, 2}) {
        Case cs;
        cs.m = 40, cs.n = sh.n, cs.k = sh.k, cs.b1 = sh.batches;
        cs.lb.kind = sh.b;
        cs.la.kind = m == 3 ? Kind::Strided : Kind::Rows;
        cs.alpha = m == 8 ? 0.5 : 1, cs.beta = m == 3 ? -1 : 0;
        cs.name = std::to_string(m) + " of 40 rows x" + std::to_string(sh.n) + "x" +
                  std::to_string(sh.k) + (sh.b == Kind::Cols ? " B^T" : "") + " in " +
                  std::to_string(sh.batches) + " batches";
        Ctx c;
        rt_pool *pool = rt_pool_new(c.ctx, threads);
        rt_gemm_engine *e = rt_gemm_engine_new(c.ctx, pool);
        ASSERT_NE(e, nullptr) << c.diags();
        Prepared big;
        big.cs = cs;
        prepare(big, e, c);
        if (::testing::Test::HasFatalFailure()) return;
        Prepared few = big;  // the same operands; C's first m rows only
        few.cs.m = m, few.g.m = m;
        few.plan = rt_gemm_plan_new(e, &few.g, g_mode->ab, g_mode->c, mode_flags(*g_mode));
        ASSERT_NE(few.plan, nullptr) << c.diags();
        char err[256] = "";
        ASSERT_TRUE(run(big, err, sizeof err)) << err;
        ASSERT_TRUE(run(few, err, sizeof err)) << err;
        check(few);
        for (int64_t bb = 0; bb < sh.batches; bb++)
          for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < cs.n; j++) {
              int64_t at = index(big.c, 0, bb, i, j);
              ASSERT_TRUE(big.c.same(few.c, at))
                  << cs.name << ", " << threads << " threads, batch " << bb << " at " << i << ","
                  << j << ": " << few.c.data[at] << " vs " << big.c.data[at];
              compared++;
            }
        rt_gemm_plan_free(big.plan);
        rt_gemm_plan_free(few.plan);
        rt_gemm_engine_free(e);
        rt_pool_free(pool);
      }
  EXPECT_GT(compared, 10000);
}

// k = 1 and wide: one product per element, one depth step per tile.
TEST_P(Sgemm, DepthOne) {
  std::vector<Case> v;
  for (Kind kb : {Kind::Rows, Kind::Cols}) {
    Case cs;
    cs.name = kb == Kind::Rows ? "70x90x1" : "70x90x1 B^T";
    cs.m = 70, cs.n = 90, cs.k = 1;
    cs.lb.kind = kb;
    cs.alpha = 0.5, cs.beta = 2;
    v.push_back(cs);
  }
  run_cases(v, 3);
}

// A bf16 C gets the interpreter's rounding bit for bit: with k = 1,
// alpha = 1 and beta = 0 each element is one product of two bf16, exact in
// f32, so the GEMM's only rounding is the f32 -> bf16 one, which must give
// ir_bf16_bits of the exact product (ties to even, overflow to infinity,
// NaN stays NaN).
void bf16_rounding(const Mode &mode) {
  Ctx c;
  rt_pool *pool = rt_pool_new(c.ctx, 2);
  rt_gemm_engine *e = rt_gemm_engine_new(c.ctx, pool);
  ASSERT_NE(e, nullptr) << c.diags();
  const int64_t M = 37, N = 300;
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> mant(-2, 2);
  std::uniform_int_distribution<int> ex(-40, 40);
  auto value = [&]() { return std::ldexp(mant(rng), ex(rng)); };
  std::vector<double> av(M), bv(N);
  for (auto &x : av) x = mode.ab == DSC_BF16 ? ir_bf16_value(ir_bf16_bits(value())) : value();
  for (auto &x : bv) x = mode.ab == DSC_BF16 ? ir_bf16_value(ir_bf16_bits(value())) : value();
  av[0] = std::ldexp(1.5, 100), bv[0] = std::ldexp(1.25, 100);  // overflows to infinity
  av[1] = std::numeric_limits<double>::quiet_NaN();
  std::vector<float> af(av.begin(), av.end()), bfl(bv.begin(), bv.end());
  std::vector<uint16_t> ah(M), bh(N), out(M * N, 0x1234);
  for (int64_t i = 0; i < M; i++) ah[i] = ir_bf16_bits(av[i]);
  for (int64_t j = 0; j < N; j++) bh[j] = ir_bf16_bits(bv[j]);
  cg_gemm g{};
  g.batch[0] = g.batch[1] = 1;
  g.m = M, g.n = N, g.k = 1;
  g.a.row_stride = 1, g.a.col_stride = 1;
  g.b.row_stride = N, g.b.col_stride = 1;
  g.c.row_stride = N, g.c.col_stride = 1;
  g.alpha = 1;
  rt_gemm_plan *pl = rt_gemm_plan_new(e, &g, mode.ab, DSC_BF16, mode_flags(mode));
  ASSERT_NE(pl, nullptr) << c.diags();
  EXPECT_EQ(rt_gemm_plan_impl(pl), expected_impl(mode));
  char err[256] = "";
  bool bf = mode.ab == DSC_BF16;
  ASSERT_TRUE(rt_gemm_run(pl, bf ? (void *)ah.data() : (void *)af.data(),
                          bf ? (void *)bh.data() : (void *)bfl.data(), out.data(), err, sizeof err))
      << err;
  int ties = 0;
  for (int64_t i = 0; i < M; i++)
    for (int64_t j = 0; j < N; j++) {
      double exact = (double)(float)av[i] * (double)(float)bv[j];
      // an f32 operand's product may round in f32 first: compare with the
      // f32 product there (still one rounding of the value the GEMM has)
      if (!bf) exact = (double)((float)av[i] * (float)bv[j]);
      uint16_t want = ir_bf16_bits(exact), got = out[i * N + j];
      if (std::isnan(exact)) {
        EXPECT_TRUE(std::isnan(ir_bf16_value(got))) << i << "," << j;
        continue;
      }
      float ef = (float)exact;
      uint32_t u;
      std::memcpy(&u, &ef, sizeof u);
      if ((u & 0xffff) == 0x8000) ties++;
      ASSERT_EQ(got, want) << "(" << i << "," << j << "): " << exact;
    }
  if (bf) {
    EXPECT_GT(ties, 10) << "the inputs should exercise ties";
  }
  rt_gemm_plan_free(pl);
  rt_gemm_engine_free(e);
  rt_pool_free(pool);
}

TEST(SgemmBf16, OutputRoundsAsTheInterpreter) {
  int ran = 0;
  for (const Mode &m : kModes) {
    if (m.c != DSC_BF16 || !host_has(m)) continue;
    IsaEnv env(cg_cpu_isa_name(m.isa));
    SCOPED_TRACE(mode_name(m));
    bf16_rounding(m);
    ran++;
  }
  if (ran == 0) GTEST_SKIP() << "this host has no AVX2";
}

// Other dtypes, the NO_LIBRARY flag and a baseline DSC_CPU_ISA keep their
// paths; f32 and bf16 name the kernel of the ISA.
TEST(SgemmPlan, OnlyF32AndBf16PlansOnAvx2OrBetterUseIt) {
  Ctx c;
  rt_pool *pool = rt_pool_new(c.ctx, 1);
  rt_gemm_engine *e = rt_gemm_engine_new(c.ctx, pool);
  ASSERT_NE(e, nullptr) << c.diags();
  cg_gemm g{};
  g.batch[0] = g.batch[1] = 1;
  g.m = g.n = g.k = 4;
  g.a.row_stride = g.b.row_stride = g.c.row_stride = 4;
  g.a.col_stride = g.b.col_stride = g.c.col_stride = 1;
  g.alpha = 1;
  for (int isa = CG_ISA_BASELINE; isa <= (int)cg_cpu_isa_host(); isa++) {
    IsaEnv env(cg_cpu_isa_name((cg_cpu_isa)isa));
    std::string name = cg_cpu_isa_name((cg_cpu_isa)isa);
    rt_gemm_plan *f32 = rt_gemm_plan_new(e, &g, DSC_F32, DSC_F32, 0);
    rt_gemm_plan *bf16 = rt_gemm_plan_new(e, &g, DSC_BF16, DSC_BF16, 0);
    rt_gemm_plan *f64 = rt_gemm_plan_new(e, &g, DSC_F64, DSC_F64, 0);
    rt_gemm_plan *f16 = rt_gemm_plan_new(e, &g, DSC_F16, DSC_F32, 0);
    rt_gemm_plan *loop = rt_gemm_plan_new(e, &g, DSC_F32, DSC_F32, RT_GEMM_NO_LIBRARY);
    ASSERT_TRUE(f32 && bf16 && f64 && f16 && loop) << c.diags();
    EXPECT_EQ(rt_sgemm_supported(), isa >= CG_ISA_AVX2) << name;
    if (isa >= CG_ISA_AVX2) {
      EXPECT_EQ(std::string(rt_gemm_plan_impl(f32)), "dsc:sgemm-" + name);
      __builtin_cpu_init();
      bool dp = isa == CG_ISA_AVX512 && __builtin_cpu_supports("avx512bf16");
      EXPECT_EQ(std::string(rt_gemm_plan_impl(bf16)), "dsc:sgemm-" + name + "-bf16");
      rt_gemm_plan *opt = rt_gemm_plan_new(e, &g, DSC_BF16, DSC_BF16, RT_GEMM_DPBF16);
      ASSERT_NE(opt, nullptr) << c.diags();
      EXPECT_EQ(std::string(rt_gemm_plan_impl(opt)),
                dp ? "dsc:sgemm-avx512-dpbf16" : "dsc:sgemm-" + name + "-bf16");
      rt_gemm_plan_free(opt);
    } else {
      EXPECT_NE(std::string(rt_gemm_plan_impl(f32)).rfind("dsc:", 0), 0u) << name;
      EXPECT_NE(std::string(rt_gemm_plan_impl(bf16)).rfind("dsc:", 0), 0u) << name;
    }
    EXPECT_NE(std::string(rt_gemm_plan_impl(f64)).rfind("dsc:", 0), 0u) << name;
    EXPECT_NE(std::string(rt_gemm_plan_impl(f16)).rfind("dsc:", 0), 0u) << name;
    EXPECT_STREQ(rt_gemm_plan_impl(loop), "loop");
    for (rt_gemm_plan *p : {f32, bf16, f64, f16, loop}) rt_gemm_plan_free(p);
  }
  rt_gemm_engine_free(e);
  rt_pool_free(pool);
}

// The scratch a plan reserves holds for either kernel (the memory plan
// calls rt_sgemm_scratch_floats without knowing the ISA or the dtypes).
TEST(SgemmPlan, ScratchCoversEveryKernel) {
  cg_gemm g{};
  g.batch[0] = g.batch[1] = 1;
  g.m = 256, g.n = 3072, g.k = 768;
  g.a.row_stride = 768, g.a.col_stride = 1;
  g.b.row_stride = 3072, g.b.col_stride = 1;
  g.c.row_stride = 3072, g.c.col_stride = 1;
  // AVX-512: A 264 (256 in panels of 12) x 384 + B 320 x 384 + a 12 x 32
  // tile + the bf16-C sums of 264 x 320 (K = 768 spans two depth blocks);
  // AVX2 (A 258 x 384, sums 258 x 320) needs less.
  int64_t avx512 = 264 * 384 + 320 * 384 + 12 * 32 + 264 * 320;
  EXPECT_EQ(rt_sgemm_scratch_floats(&g), avx512);
  g.k = 300;  // one depth block: no sums kept
  EXPECT_EQ(rt_sgemm_scratch_floats(&g), 264 * 300 + 320 * 300 + 12 * 32);
}

}  // namespace
