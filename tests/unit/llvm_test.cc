// The LLVM CPU backend (codegen/llvm.c): hand-built kernels compiled through
// LLVM and run over several outer chunks (as a thread pool would), compared
// with kir_eval (double precision, the oracle) on random, never-all-zero data.
//
// Tolerances (per element, |got - want| <= tol * max(|want|, floor)):
//   f32 1e-5 relative (floor stated per test: near-zero values from
//       cancellation are compared absolutely), f64 1e-12, bf16 2^-7 (one bf16
//       ulp: f32 vs double compute may round across a boundary), f16 1e-3
//       (one ulp), integers and bool exact.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <dirent.h>
#include <elf.h>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "codegen/codegen.h"
#include "tests/unit/test_util.h"


namespace {

// A kernel under construction; storage for the arrays lives here.
struct KB {
  kir_kernel k{};
  std::vector<kir_arg> args;
  std::vector<dsc_dtype> slots;
  std::vector<kir_stage> stages;
  KB(const char *name, std::vector<int64_t> dims, int n_outer) {
    k.name = name;
    k.rank = (int)dims.size();
    k.n_outer = n_outer;
    for (size_t i = 0; i < dims.size(); i++) k.dims[i] = dims[i];
  }
  int arg(dsc_dtype dt, int64_t numel, bool read, bool written) {
    args.push_back(kir_arg{dt, numel, read, written});
    return (int)args.size() - 1;
  }
  int slot(dsc_dtype t) {
    slots.push_back(t);
    return (int)slots.size() - 1;
  }
  void reduce(kir_reduce_op op, int slot, kir_expr *e) {
    kir_stage s{};
    s.kind = KIR_STAGE_REDUCE;
    s.reduce = op;
    s.slot = slot;
    s.expr = e;
    stages.push_back(s);
  }
  void let(int slot, kir_expr *e) {
    kir_stage s{};
    s.kind = KIR_STAGE_LET;
    s.slot = slot;
    s.expr = e;
    stages.push_back(s);
  }
  void store(kir_access dst, kir_expr *e, bool over_inner = true) {
    kir_stage s{};
    s.kind = KIR_STAGE_STORE;
    s.over_inner = over_inner;
    s.dst = dst;
    s.expr = e;
    stages.push_back(s);
  }
  kir_kernel *done() {
    k.n_args = (int)args.size();
    k.args = args.data();
    k.n_slots = (int)slots.size();
    k.slot_types = slots.data();
    k.n_stages = (int)stages.size();
    k.stages = stages.data();
    return &k;
  }
};

kir_access acc(int arg, int64_t offset, std::vector<int64_t> strides, kir_expr *gather = nullptr,
               int64_t gstride = 0, int64_t gbound = 0) {
  kir_access a{};
  a.arg = arg;
  a.offset = offset;
  for (size_t i = 0; i < strides.size(); i++) a.stride[i] = strides[i];
  a.gather = gather;
  a.gather_stride = gstride;
  a.gather_bound = gbound;
  return a;
}

struct Tol {
  double f32_floor = 1.0; // f32: relative to max(|want|, floor)
  double half = -1;       // bf16/f16 relative tolerance (-1: the defaults above)
};

class LlvmTest : public ::testing::Test {
 protected:
  dsc_context *ctx = nullptr;
  ir_arena arena{};
  cg_llvm_jit *jit = nullptr;
  std::mt19937 rng{1234};

  void SetUp() override {
#ifndef DSC_HAVE_LLVM
    GTEST_SKIP() << "built without LLVM";
#endif
    ctx = dsc_context_new(nullptr, nullptr);
    ir_arena_init(&arena, ctx);
    jit = cg_llvm_jit_new(ctx, nullptr);
    ASSERT_NE(jit, nullptr) << diags();
  }
  void TearDown() override {
    if (!ctx) return;
    cg_llvm_jit_free(jit);
    ir_arena_release(&arena);
    dsc_context_free(ctx);
  }
  std::string diags() { return ::diags(ctx); }

  // ---- expression shorthands ----
  kir_expr *ld(dsc_dtype t, kir_access a) { return kir_load(&arena, t, a); }
  kir_expr *c(dsc_dtype t, double v) { return kir_const(&arena, t, v); }
  kir_expr *un(kir_unary op, kir_expr *x) { return kir_un(&arena, op, x); }
  kir_expr *bin(kir_binary op, kir_expr *x, kir_expr *y) { return kir_bin(&arena, op, x, y); }
  kir_expr *sc(dsc_dtype t, int slot) { return kir_scalar(&arena, t, slot); }

  // Random storage for every argument (values in [lo, hi]; integers rounded).
  std::vector<std::vector<unsigned char>> make_data(const kir_kernel *k, double lo, double hi) {
    std::uniform_real_distribution<double> u(lo, hi);
    std::vector<std::vector<unsigned char>> bufs;
    for (int i = 0; i < k->n_args; i++) {
      const kir_arg &a = k->args[i];
      std::vector<unsigned char> b((size_t)a.numel * dsc_dtype_size(a.dtype));
      for (int64_t e = 0; e < a.numel; e++) {
        double v = u(rng);
        unsigned char *p = b.data() + e * dsc_dtype_size(a.dtype);
        switch (a.dtype) {
          case DSC_F32: { float f = (float)v; memcpy(p, &f, 4); break; }
          case DSC_F64: memcpy(p, &v, 8); break;
          case DSC_I32: { int32_t x = (int32_t)std::lround(v); memcpy(p, &x, 4); break; }
          case DSC_I64: { int64_t x = std::lround(v); memcpy(p, &x, 8); break; }
          case DSC_BOOL: *p = v > 0; break;
          case DSC_BF16: { float f = (float)v; uint32_t w; memcpy(&w, &f, 4); uint16_t h = (uint16_t)(w >> 16); memcpy(p, &h, 2); break; }
          case DSC_F16: { uint16_t h = (uint16_t)(0x3c00 + (std::lround(std::fabs(v) * 100) % 0x400)); memcpy(p, &h, 2); break; }
          default: break;
        }
      }
      bufs.push_back(std::move(b));
    }
    return bufs;
  }

  static double elem(dsc_dtype dt, const unsigned char *p) {
    switch (dt) {
      case DSC_F32: { float f; memcpy(&f, p, 4); return f; }
      case DSC_F64: { double d; memcpy(&d, p, 8); return d; }
      case DSC_I32: { int32_t x; memcpy(&x, p, 4); return x; }
      case DSC_I64: { int64_t x; memcpy(&x, p, 8); return (double)x; }
      case DSC_BOOL: return *p;
      case DSC_BF16: { uint16_t h; memcpy(&h, p, 2); return ir_bf16_value(h); }
      case DSC_F16: { uint16_t h; memcpy(&h, p, 2); return ir_f16_value(h); }
      default: return 0;
    }
  }

  cg_cpu_kernel_fn compile(kir_kernel *k) {
    cg_cpu_kernel_fn fn = nullptr;
    auto t0 = std::chrono::steady_clock::now();
    dsc_status st = cg_llvm_compile(jit, &k, 1, &fn);
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(st, DSC_OK) << diags();
    EXPECT_NE(fn, nullptr);
    std::printf("[llvm] compiled %s in %.1f ms\n", k->name, ms);
    if (const char *dump = getenv("DSC_LLVM_TEST_DUMP")) { // debugging aid: optimised IR
      if (!strcmp(dump, k->name)) {
        char *ir = cg_llvm_print_optimized_ir(ctx, &k, 1);
        if (ir) std::printf("%s\n", ir);
        free(ir);
      }
    }
    return fn;
  }

  // Runs k through kir_eval and through LLVM (outer range split into uneven
  // chunks), compares every written argument; returns the status pair.
  void check(kir_kernel *k, double lo, double hi, Tol tol = Tol(), bool expect_status = false,
             std::vector<std::vector<unsigned char>> *data = nullptr) {
    char err[256];
    ASSERT_TRUE(kir_validate(k, err, sizeof err)) << err;
    auto want = data ? *data : make_data(k, lo, hi);
    auto got = want;
    std::vector<void *> pw, pg;
    for (auto &b : want) pw.push_back(b.data());
    for (auto &b : got) pg.push_back(b.data());
    bool eval_ok = kir_eval(k, pw.data());
    EXPECT_EQ(eval_ok, !expect_status);
    cg_cpu_kernel_fn fn = compile(k);
    ASSERT_NE(fn, nullptr);
    int64_t n_outer = 1;
    for (int d = 0; d < k->n_outer; d++) n_outer *= k->dims[d];
    // chunks of uneven size, not aligned to rows: [0,a) [a,b) [b,n)
    int64_t a = n_outer / 3, b = n_outer - n_outer / 5;
    int32_t status = 0;
    fn(pg.data(), 0, a, &status);
    fn(pg.data(), a, b, &status);
    fn(pg.data(), b, n_outer, &status);
    fn(pg.data(), n_outer, n_outer, &status); // empty chunk
    EXPECT_EQ(status, expect_status ? 1 : 0);
    for (int i = 0; i < k->n_args; i++) {
      const kir_arg &arg = k->args[i];
      if (!arg.written) continue;
      size_t es = dsc_dtype_size(arg.dtype);
      int bad = 0;
      for (int64_t e = 0; e < arg.numel && bad < 5; e++) {
        double w = elem(arg.dtype, want[i].data() + e * es), g = elem(arg.dtype, got[i].data() + e * es);
        double t = 0, scale = std::fabs(w);
        switch (arg.dtype) {
          case DSC_F32: t = 1e-5; scale = std::max(scale, tol.f32_floor); break;
          case DSC_F64: t = 1e-12; scale = std::max(scale, 1e-300); break;
          case DSC_BF16: t = tol.half >= 0 ? tol.half : 1.0 / 128; break;
          case DSC_F16: t = tol.half >= 0 ? tol.half : 1e-3; break;
          default: t = 0; break;
        }
        bool ok = (std::isnan(w) && std::isnan(g)) || (std::isinf(w) && w == g) ||
                  std::fabs(g - w) <= t * scale;
        if (!ok) {
          bad++;
          ADD_FAILURE() << k->name << " arg " << i << " element " << e << ": llvm " << g
                        << " vs kir_eval " << w;
        }
      }
    }
  }
};

// out[i,j,k] = f(a[i,j,k] * b[k] + c[i,0,k]) with a DAG that reuses t; the
// same kernel with 0..3 outer dims (so segment logic and pure-inner loops run).
TEST_F(LlvmTest, ElementwiseChainWithBroadcastMatchesEval) {
  for (int n_outer = 0; n_outer <= 3; n_outer++) {
    std::string name = "ew_chain_" + std::to_string(n_outer);
    KB kb(name.c_str(), {4, 5, 33}, n_outer);
    int A = kb.arg(DSC_F32, 4 * 5 * 33, true, false), B = kb.arg(DSC_F32, 33, true, false),
        C = kb.arg(DSC_F32, 4 * 33, true, false), O = kb.arg(DSC_F32, 4 * 5 * 33, false, true);
    kir_expr *a = ld(DSC_F32, acc(A, 0, {165, 33, 1})), *b = ld(DSC_F32, acc(B, 0, {0, 0, 1})),
             *cc = ld(DSC_F32, acc(C, 0, {33, 0, 1}));
    kir_expr *t = bin(KIR_ADD, bin(KIR_MUL, a, b), cc);
    kir_expr *at1 = bin(KIR_ADD, un(KIR_ABS, t), c(DSC_F32, 1.0));
    kir_expr *e = un(KIR_TANH, t);
    e = bin(KIR_ADD, e, bin(KIR_MUL, un(KIR_SIGMOID, t), t));
    e = bin(KIR_SUB, e, bin(KIR_DIV, un(KIR_EXP, bin(KIR_MUL, t, c(DSC_F32, 0.5))), un(KIR_SQRT, at1)));
    e = bin(KIR_ADD, e, un(KIR_LOG, at1));
    e = bin(KIR_SUB, e, un(KIR_RSQRT, at1));
    e = bin(KIR_ADD, e, bin(KIR_MAX, t, c(DSC_F32, 0.0)));
    e = bin(KIR_ADD, e, bin(KIR_MIN, t, cc));
    e = bin(KIR_ADD, e, bin(KIR_POW, at1, c(DSC_F32, 1.5)));
    e = bin(KIR_ADD, e, un(KIR_NEG, kir_select(&arena, bin(KIR_LT, t, cc), a, b)));
    e = bin(KIR_ADD, e,
            bin(KIR_MUL, un(KIR_SIN, t), un(KIR_COS, bin(KIR_MUL, t, c(DSC_F32, 3.0)))));
    kb.store(acc(O, 0, {165, 33, 1}), e);
    check(kb.done(), -3, 3);
  }
}

// Dropout's bits: rand24(seed, counter) in LLVM's wrapping i64 operations
// equals ir_rand24 (kir_eval's), for seeds of either sign up to 2^53 and
// counters past 2^40 (a later dropout's stream), vectorised or not.
TEST_F(LlvmTest, Rand24IsIrRand24) {
  KB kb("rand24", {3, 1031}, 1);
  int S = kb.arg(DSC_I64, 3, true, false), O = kb.arg(DSC_I64, 3 * 1031, false, true);
  kir_expr *ctr = bin(KIR_ADD, kir_index(&arena, 1), c(DSC_I64, 4097.0 * 1099511627776.0));
  kb.store(acc(O, 0, {1031, 1}), bin(KIR_RAND24, ld(DSC_I64, acc(S, 0, {1, 0})), ctr));
  check(kb.done(), -9.0e15, 9.0e15);
  // and ir_rand24 is docs/ir.md's formula: values from a Python replica of
  // top24(mix(mix(s) + c * 0x9e3779b97f4a7c15)) in 64-bit wrapping arithmetic
  EXPECT_EQ(ir_rand24(0, 0), 0);
  EXPECT_EQ(ir_rand24(1, 5), 3389999);
  EXPECT_EQ(ir_rand24(2, 5), 9011819);
  EXPECT_EQ(ir_rand24(9007199254740991LL, (3LL << 40) + 17), 995906);
}

// Three-stage softmax (REDUCE max, REDUCE sum of exp, LET 1/sum, STORE);
// the exp node is shared by the sum and the store.
static kir_kernel *softmax_kernel(ir_arena *ar, KB &kb, int64_t C) {
  int X = kb.arg(DSC_F32, kb.k.dims[0] * C, true, false),
      Y = kb.arg(DSC_F32, kb.k.dims[0] * C, false, true);
  int mx = kb.slot(DSC_F32), sum = kb.slot(DSC_F32), inv = kb.slot(DSC_F32);
  kir_expr *x = kir_load(ar, DSC_F32, acc(X, 0, {C, 1}));
  kb.reduce(KIR_REDUCE_MAX, mx, x);
  kir_expr *ex = kir_un(ar, KIR_EXP, kir_bin(ar, KIR_SUB, x, kir_scalar(ar, DSC_F32, mx)));
  kb.reduce(KIR_REDUCE_SUM, sum, ex);
  kb.let(inv, kir_bin(ar, KIR_DIV, kir_const(ar, DSC_F32, 1.0), kir_scalar(ar, DSC_F32, sum)));
  kb.store(acc(Y, 0, {C, 1}), kir_bin(ar, KIR_MUL, ex, kir_scalar(ar, DSC_F32, inv)));
  return kb.done();
}

// Rows of 1000, logits in [-20, 20] (exp down to e^-40, far from denormals).
TEST_F(LlvmTest, SoftmaxThreeStagesMatchesEval) {
  KB kb("softmax_rows", {7, 1000}, 1);
  check(softmax_kernel(&arena, kb, 1000), -20, 20, Tol{0.0}); // every output relative
}

// The f32 vector the host's widest registers hold, as the optimised IR
// spells it: "<16 x float>" with AVX-512, "<8 x float>" with AVX2 (the
// kernels prefer 512-bit vectors where the host has them); "" elsewhere.
static std::string host_f32_vector() {
  switch (cg_cpu_isa_get()) {
    case CG_ISA_AVX512: return "<16 x float>";
    case CG_ISA_AVX2: return "<8 x float>";
    default: return "";
  }
}

TEST_F(LlvmTest, SoftmaxInnerLoopsVectoriseAtTheHostsWidth) {
  const std::string v = host_f32_vector();
  if (v.empty()) GTEST_SKIP() << "no AVX2 or AVX-512 on this host";
  const std::string lanes = v == "<16 x float>" ? "v16f32" : "v8f32";
  KB kb("softmax_vec", {8, 1024}, 1);
  kir_kernel *k = softmax_kernel(&arena, kb, 1024);
  char *ir = cg_llvm_print_optimized_ir(ctx, &k, 1);
  ASSERT_NE(ir, nullptr) << diags();
  std::string s(ir);
  free(ir);
  // All three inner loops: a max reduction, a sum reduction (of exp) and
  // the normalising store run on the host's full vectors.
  EXPECT_NE(s.find(v), std::string::npos);
  bool max_vec = s.find("llvm.vector.reduce.fmax." + lanes) != std::string::npos ||
                 s.find("fcmp nnan nsz ogt " + v) != std::string::npos;
  EXPECT_TRUE(max_vec) << "max reduction not vectorised";
  EXPECT_NE(s.find("fadd reassoc contract " + v), std::string::npos) << "sum not vectorised";
  EXPECT_NE(s.find("store " + v), std::string::npos) << "store loop not vectorised";
  // before optimisation: scalar code, one function per kernel
  char *raw = cg_llvm_print_ir(ctx, &k, 1);
  ASSERT_NE(raw, nullptr) << diags();
  EXPECT_NE(std::string(raw).find("define void @softmax_vec(i8** %args"), std::string::npos) << raw;
  EXPECT_EQ(std::string(raw).find("<16 x float>"), std::string::npos);
  free(raw);
}

// The types of every relocation in an ELF64 object (empty when it is not one).
static std::vector<uint32_t> elf64_relocation_types(const unsigned char *o, size_t n) {
  std::vector<uint32_t> types;
  Elf64_Ehdr eh;
  if (n < sizeof eh || memcmp(o, ELFMAG, SELFMAG) != 0 || o[EI_CLASS] != ELFCLASS64) return types;
  memcpy(&eh, o, sizeof eh);
  for (int i = 0; i < eh.e_shnum; i++) {
    Elf64_Shdr sh;
    size_t at = eh.e_shoff + (size_t)i * eh.e_shentsize;
    if (at + sizeof sh > n) break;
    memcpy(&sh, o + at, sizeof sh);
    if (sh.sh_type != SHT_RELA && sh.sh_type != SHT_REL) continue;
    size_t ent = sh.sh_type == SHT_RELA ? sizeof(Elf64_Rela) : sizeof(Elf64_Rel);
    for (size_t r = 0; r + ent <= sh.sh_size && sh.sh_offset + r + ent <= n; r += ent) {
      Elf64_Rel rel;
      memcpy(&rel, o + sh.sh_offset + r, sizeof rel);
      types.push_back((uint32_t)ELF64_R_TYPE(rel.r_info));
    }
  }
  return types;
}

// The JIT maps a kernel's code and its constants (.rodata) separately, and
// in a GPT-2 run GBs of arenas lie between its mappings: a 32-bit
// PC-relative reference from one to the other could not reach and was
// silently truncated (a load from an arena: wrong losses, NaNs, SIGSEGV
// from run to run). Every reference must be a 64-bit address.
TEST_F(LlvmTest, KernelObjectsReachTheirConstantsAndLibmFromAnyDistance) {
#ifndef __x86_64__
  GTEST_SKIP() << "the relocation types checked are x86-64's";
#endif
  KB sm("softmax_reloc", {8, 1000}, 1);
  KB ln("log_reloc", {4, 300}, 1); // logf and broadcast constants
  int X = ln.arg(DSC_F32, 1200, true, false), Y = ln.arg(DSC_F32, 1200, false, true);
  ln.store(acc(Y, 0, {300, 1}),
           bin(KIR_MUL, un(KIR_LOG, bin(KIR_ADD, ld(DSC_F32, acc(X, 0, {300, 1})), c(DSC_F32, 1.5))),
               c(DSC_F32, 0.3125)));
  kir_kernel *ks[2] = {softmax_kernel(&arena, sm, 1000), ln.done()};
  void *objs[2] = {nullptr, nullptr};
  size_t lens[2] = {0, 0};
  ASSERT_EQ(cg_llvm_kernel_objects(jit, ks, 2, objs, lens), DSC_OK) << diags();
  size_t n_relocs = 0;
  for (int i = 0; i < 2; i++) {
    std::vector<uint32_t> types = elf64_relocation_types((const unsigned char *)objs[i], lens[i]);
    EXPECT_FALSE(types.empty()) << ks[i]->name << ": no relocations (constants folded away?)";
    for (uint32_t t : types)
      EXPECT_TRUE(t == R_X86_64_64 || t == R_X86_64_PC64 || t == R_X86_64_GOTOFF64 ||
                  t == R_X86_64_GOTPC64)
          << ks[i]->name << ": relocation type " << t << " is 32 bits wide";
    n_relocs += types.size();
    free(objs[i]);
  }
  std::printf("[llvm] %zu relocations checked\n", n_relocs);
  // and the kernels still compute what kir_eval does
  check(ks[0], -20, 20, Tol{0.0});
  check(ks[1], 0, 3);
}

TEST_F(LlvmTest, LayernormMatchesEval) {
  const int64_t R = 5, D = 768;
  KB kb("layernorm", {R, D}, 1);
  int X = kb.arg(DSC_F32, R * D, true, false), W = kb.arg(DSC_F32, D, true, false),
      Bb = kb.arg(DSC_F32, D, true, false), Y = kb.arg(DSC_F32, R * D, false, true);
  int sum = kb.slot(DSC_F32), mean = kb.slot(DSC_F32), var = kb.slot(DSC_F32),
      rstd = kb.slot(DSC_F32);
  kir_expr *x = ld(DSC_F32, acc(X, 0, {D, 1}));
  kb.reduce(KIR_REDUCE_SUM, sum, x);
  kb.let(mean, bin(KIR_MUL, sc(DSC_F32, sum), c(DSC_F32, 1.0 / D)));
  kir_expr *d = bin(KIR_SUB, x, sc(DSC_F32, mean));
  kb.reduce(KIR_REDUCE_SUM, var, bin(KIR_MUL, d, d));
  kb.let(rstd, un(KIR_RSQRT, bin(KIR_ADD, bin(KIR_MUL, sc(DSC_F32, var), c(DSC_F32, 1.0 / D)),
                                 c(DSC_F32, 1e-5))));
  kir_expr *y = bin(KIR_ADD, bin(KIR_MUL, bin(KIR_MUL, d, sc(DSC_F32, rstd)),
                                 ld(DSC_F32, acc(W, 0, {0, 1}))),
                    ld(DSC_F32, acc(Bb, 0, {0, 1})));
  kb.store(acc(Y, 0, {D, 1}), y);
  // x in [1, 5] (nonzero mean). Outputs are normalised (unit scale) and x - mean
  // cancels in f32, so |y| < 1 is compared absolutely (floor 1).
  check(kb.done(), 1, 5, Tol{1.0});
}

// Column sums and maxima of x [300, 17]: domain [col, row], the reduced dim
// strided by 17; results stored once per outer index.
TEST_F(LlvmTest, ColumnReductionMatchesEval) {
  const int64_t R = 300, C = 17;
  KB kb("colreduce", {C, R}, 1);
  int X = kb.arg(DSC_F32, R * C, true, false), S = kb.arg(DSC_F32, C, false, true),
      M = kb.arg(DSC_F32, C, false, true), N = kb.arg(DSC_F32, C, false, true);
  int s = kb.slot(DSC_F32), m = kb.slot(DSC_F32), n = kb.slot(DSC_F32);
  kir_expr *x = ld(DSC_F32, acc(X, 0, {1, C}));
  kb.reduce(KIR_REDUCE_SUM, s, x);
  kb.reduce(KIR_REDUCE_MAX, m, x);
  kb.reduce(KIR_REDUCE_MIN, n, x);
  kb.store(acc(S, 0, {1, 0}), sc(DSC_F32, s), false);
  kb.store(acc(M, 0, {1, 0}), sc(DSC_F32, m), false);
  kb.store(acc(N, 0, {1, 0}), sc(DSC_F32, n), false);
  check(kb.done(), 0.25, 2.0);
}

// Column tiling (codegen/llvm.c tile_columns): y = x / colsum(x) over
// domain [2, 37 | 3, 70] with x [2, 3, 70, 37] (the last outer dim is the
// contiguous one): 37 columns per row = two tiles of 16 plus 5 single
// columns, and the test's uneven chunks start and end mid-row. The sum, a
// LET, a store once and a store over the inner dims all run tiled, and the
// loads across the tile vectorise.
TEST_F(LlvmTest, ColumnTiledKernelMatchesEvalAndVectorises) {
  const int64_t P = 2, C = 37, R0 = 3, R1 = 70;
  KB kb("coltile", {P, C, R0, R1}, 2);
  int X = kb.arg(DSC_F32, P * R0 * R1 * C, true, false), S = kb.arg(DSC_F32, P * C, false, true),
      Y = kb.arg(DSC_F32, P * R0 * R1 * C, false, true);
  int sum = kb.slot(DSC_F32), inv = kb.slot(DSC_F32);
  kir_expr *x = ld(DSC_F32, acc(X, 0, {R0 * R1 * C, 1, R1 * C, C}));
  kb.reduce(KIR_REDUCE_SUM, sum, x);
  kb.let(inv, bin(KIR_DIV, c(DSC_F32, 1.0), sc(DSC_F32, sum)));
  kb.store(acc(S, 0, {C, 1, 0, 0}), sc(DSC_F32, sum), false);
  kb.store(acc(Y, 0, {R0 * R1 * C, 1, R1 * C, C}), bin(KIR_MUL, x, sc(DSC_F32, inv)));
  kir_kernel *k = kb.done();
  check(k, 0.5, 2.0);
  char *ir = cg_llvm_print_optimized_ir(ctx, &k, 1);
  ASSERT_NE(ir, nullptr) << diags();
  std::string s(ir);
  free(ir);
  const std::string v = host_f32_vector();
  if (!v.empty()) {
    EXPECT_NE(s.find("load " + v), std::string::npos) << "tile loads not vectorised";
  }
}

// An optimizer-like update: eight pointers, two of them written. Without
// distinct_args the vectoriser must check at run time that the written
// arrays overlap no read one (or give up); with it (codegen/lower.c proves
// it for every launch) the body takes noalias pointers and runs unchecked.
TEST_F(LlvmTest, DistinctArgumentsVectoriseWithoutRuntimeOverlapChecks) {
  const std::string v = host_f32_vector();
  for (bool distinct : {false, true}) {
    KB kb(distinct ? "upd_distinct" : "upd_maybe_alias", {4, 4096}, 1);
    const int64_t n = 4096;
    int A = kb.arg(DSC_F32, 4 * n, true, false), B = kb.arg(DSC_F32, 4 * n, true, false),
        C = kb.arg(DSC_F32, 4 * n, true, false), D = kb.arg(DSC_F32, 4 * n, true, false),
        E = kb.arg(DSC_F32, 4 * n, true, false), F = kb.arg(DSC_F32, 4 * n, true, false),
        Y = kb.arg(DSC_F32, 4 * n, false, true), Z = kb.arg(DSC_F32, 4 * n, false, true);
    auto at = [&](int arg) { return ld(DSC_F32, acc(arg, 0, {n, 1})); };
    kb.store(acc(Y, 0, {n, 1}),
             bin(KIR_ADD, bin(KIR_MUL, at(A), at(B)), bin(KIR_MUL, at(C), at(D))));
    kb.store(acc(Z, 0, {n, 1}), bin(KIR_SUB, bin(KIR_MUL, at(E), at(F)), at(A)));
    kir_kernel *k = kb.done();
    k->distinct_args = distinct;
    check(k, -2, 2); // the noalias body computes what the evaluator does
    char *ir = cg_llvm_print_optimized_ir(ctx, &k, 1);
    ASSERT_NE(ir, nullptr) << diags();
    std::string s(ir);
    free(ir);
    bool checked = s.find("vector.memcheck") != std::string::npos;
    bool vector_loads = !v.empty() && s.find("load " + v) != std::string::npos;
    if (distinct) {
      EXPECT_FALSE(checked) << "runtime overlap checks despite noalias arguments";
      EXPECT_NE(s.find(".body"), std::string::npos) << "no noalias body";
      if (!v.empty()) {
        EXPECT_TRUE(vector_loads) << "the update did not vectorise";
      }
    } else {
      EXPECT_TRUE(checked || !vector_loads) << "may-alias pointers vectorised without checks";
    }
  }
}

// Stores over the inner dims run in one loop nest, so what they share is
// computed once per point: an AdamW-like update storing m, the param in
// place (its readers first) and the param's bf16 rounding, all from one
// sqrt, has the sqrt calls of a single store. A stage reading what an
// earlier one wrote (here Y, at a shifted index) starts a loop of its own:
// the values stay the evaluator's, which runs the stages one after another.
TEST_F(LlvmTest, StoresOverTheInnerDimsShareOneLoop) {
  const int64_t n = 1024;
  // the optimised IR's vectorised loops and its sqrt calls
  auto shape = [&](kir_kernel *k, int *loops, int *sqrts) {
    char *ir = cg_llvm_print_optimized_ir(ctx, &k, 1);
    ASSERT_NE(ir, nullptr) << diags();
    std::istringstream in(ir);
    free(ir);
    *loops = *sqrts = 0;
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("vector.body", 0) == 0 && line.find(':') != std::string::npos) ++*loops;
      if (line.find("call") != std::string::npos && line.find("@llvm.sqrt") != std::string::npos)
        ++*sqrts;
    }
  };
  KB one("upd_one", {4, n}, 1);
  {
    int G = one.arg(DSC_F32, 4 * n, true, false), V = one.arg(DSC_F32, 4 * n, true, false),
        P = one.arg(DSC_F32, 4 * n, true, true);
    auto at = [&](int arg) { return ld(DSC_F32, acc(arg, 0, {n, 1})); };
    kir_expr *upd = bin(KIR_SUB, at(P), bin(KIR_DIV, at(G), un(KIR_SQRT, at(V))));
    one.store(acc(P, 0, {n, 1}), upd);
  }
  KB three("upd_three", {4, n}, 1);
  {
    int G = three.arg(DSC_F32, 4 * n, true, false), V = three.arg(DSC_F32, 4 * n, true, false),
        P = three.arg(DSC_F32, 4 * n, true, true), M = three.arg(DSC_F32, 4 * n, false, true),
        H = three.arg(DSC_BF16, 4 * n, false, true);
    auto at = [&](int arg) { return ld(DSC_F32, acc(arg, 0, {n, 1})); };
    // each stage its own expression objects, as the lowering builds them
    auto upd = [&]() { return bin(KIR_SUB, at(P), bin(KIR_DIV, at(G), un(KIR_SQRT, at(V)))); };
    three.store(acc(H, 0, {n, 1}), upd());  // reads P: before P's store
    three.store(acc(M, 0, {n, 1}), bin(KIR_MUL, c(DSC_F32, 0.5), upd()));  // reads P too
    three.store(acc(P, 0, {n, 1}), upd());                                 // P in place
  }
  kir_kernel *k1 = one.done(), *k3 = three.done();
  k1->distinct_args = k3->distinct_args = true; /* as the lowering marks them */
  check(k1, 0.5, 2);
  check(k3, 0.5, 2);
  int loops1, sqrts1, loops3, sqrts3;
  shape(k1, &loops1, &sqrts1);
  shape(k3, &loops3, &sqrts3);
  if (!host_f32_vector().empty()) {
    EXPECT_EQ(loops1, 1);
    EXPECT_EQ(loops3, 1) << "the three stores run in loops of their own";
  }
  EXPECT_GT(sqrts3, 0);
  // once per vector of the loop: as many as the loads of V
  EXPECT_LE(sqrts3, sqrts1) << "the stores compute the sqrt apart";

  // a reader of an earlier store's argument, one element further on
  KB split("upd_split", {4, n - 1}, 1);
  {
    int X = split.arg(DSC_F32, 4 * n, true, false), Z = split.arg(DSC_F32, 4 * n, true, true);
    int W = split.arg(DSC_F32, 4 * n, false, true);
    split.store(acc(Z, 0, {n, 1}), un(KIR_SQRT, ld(DSC_F32, acc(X, 0, {n, 1}))));
    split.store(acc(W, 0, {n, 1}), ld(DSC_F32, acc(Z, 1, {n, 1})));  // Z[i + 1]: the earlier loop's
  }
  check(split.done(), 0.5, 2);
}

// Embedding-style gather: out[n, d] = table[ids[n], d]; an id of 11 (V = 11)
// and one of -3 give status 1 and a zero row; a second kernel scatters rows
// through a destination gather (out-of-range rows are not stored).
TEST_F(LlvmTest, GatherOutOfRangeSetsStatusLoadsZeroAndSkipsStore) {
  const int64_t V = 11, D = 24, N = 6;
  KB kb("gather_rows", {N, D}, 1);
  int T = kb.arg(DSC_F32, V * D, true, false), I = kb.arg(DSC_I32, N, true, false),
      O = kb.arg(DSC_F32, N * D, false, true);
  kir_expr *id = ld(DSC_I32, acc(I, 0, {1, 0}));
  kb.store(acc(O, 0, {D, 1}), ld(DSC_F32, acc(T, 0, {0, 1}, id, D, V)));
  kir_kernel *k = kb.done();
  auto data = make_data(k, 0.5, 1.5);
  int32_t ids[N] = {3, 0, 11, 10, -3, 7};
  memcpy(data[I].data(), ids, sizeof ids);
  check(k, 0, 0, Tol(), true, &data);
  int32_t good[N] = {3, 0, 1, 10, 2, 7};
  memcpy(data[I].data(), good, sizeof good);
  check(k, 0, 0, Tol(), false, &data);

  KB ks("scatter_rows", {N, D}, 1);
  int X = ks.arg(DSC_F32, N * D, true, false), J = ks.arg(DSC_I64, N, true, false),
      Out = ks.arg(DSC_F32, V * D, true, true);
  kir_expr *jd = ld(DSC_I64, acc(J, 0, {1, 0}));
  ks.store(acc(Out, 0, {0, 1}, jd, D, V),
           bin(KIR_ADD, ld(DSC_F32, acc(X, 0, {D, 1})), c(DSC_F32, 100.0)));
  kir_kernel *k2 = ks.done();
  auto d2 = make_data(k2, 0.5, 1.5);
  int64_t js[N] = {1, 12, 4, -1, 9, 0};
  memcpy(d2[J].data(), js, sizeof js);
  check(k2, 0, 0, Tol(), true, &d2);
}

// bf16 and f16: loads widen, stores round to nearest even; magnitudes up to
// 1e5 so f16 overflows to inf, and tiny values reach f16 subnormals.
// Exact comparison (see below).
TEST_F(LlvmTest, Bf16AndF16LoadsAndStoresMatchEval) {
  const int64_t N = 4, M = 100;
  KB kb("half_store", {N, M}, 1);
  int X = kb.arg(DSC_F32, N * M, true, false), Hb = kb.arg(DSC_BF16, N * M, true, false),
      Ob = kb.arg(DSC_BF16, N * M, false, true), Oh = kb.arg(DSC_F16, N * M, false, true),
      Of = kb.arg(DSC_F32, N * M, false, true), Hh = kb.arg(DSC_F16, N * M, true, false);
  kir_expr *x = ld(DSC_F32, acc(X, 0, {M, 1}));
  kir_expr *hb = ld(DSC_F32, acc(Hb, 0, {M, 1})), *hh = ld(DSC_F32, acc(Hh, 0, {M, 1}));
  kir_expr *scaled = bin(KIR_MUL, x, bin(KIR_MUL, kir_cast(&arena, DSC_F32, kir_index(&arena, 1)),
                                         kir_cast(&arena, DSC_F32, kir_index(&arena, 1))));
  kb.store(acc(Ob, 0, {M, 1}), bin(KIR_ADD, bin(KIR_MUL, x, c(DSC_F32, 1.37)), hb));
  kb.store(acc(Oh, 0, {M, 1}), bin(KIR_ADD, scaled, bin(KIR_MUL, x, c(DSC_F32, 1e-6))));
  kb.store(acc(Of, 0, {M, 1}), bin(KIR_MUL, hb, hh));
  // Only f32 mul/add feed the stores, which kir_eval rounds identically: the
  // rounded bf16/f16 values must be bit-exact (tolerance 0).
  check(kb.done(), -11, 11, Tol{1.0, 0.0});
}

TEST_F(LlvmTest, F64ChainAndReductionMatchEval) {
  const int64_t R = 6, C = 129;
  KB kb("f64_kernel", {R, C}, 1);
  int X = kb.arg(DSC_F64, R * C, true, false), Y = kb.arg(DSC_F64, R * C, false, true),
      S = kb.arg(DSC_F64, R, false, true);
  int s = kb.slot(DSC_F64), m = kb.slot(DSC_F64);
  kir_expr *x = ld(DSC_F64, acc(X, 0, {C, 1}));
  kir_expr *t = bin(KIR_ADD, un(KIR_TANH, x), un(KIR_SIGMOID, x));
  t = bin(KIR_ADD, t, un(KIR_LOG, bin(KIR_ADD, bin(KIR_MUL, x, x), c(DSC_F64, 1.0))));
  t = bin(KIR_ADD, t, un(KIR_EXP, bin(KIR_MUL, x, c(DSC_F64, 0.25))));
  kb.reduce(KIR_REDUCE_SUM, s, t);
  kb.reduce(KIR_REDUCE_MAX, m, x);
  kb.store(acc(Y, 0, {C, 1}), bin(KIR_SUB, bin(KIR_DIV, t, sc(DSC_F64, s)), sc(DSC_F64, m)));
  kb.store(acc(S, 0, {1, 0}), sc(DSC_F64, s), false);
  check(kb.done(), -4, 4);
}

// Integer arithmetic: truncating division of negative values, max/min,
// comparisons and select, casts through f32, an integer sum; exact.
TEST_F(LlvmTest, I32ArithmeticMatchesEvalExactly) {
  const int64_t R = 9, C = 37;
  KB kb("int_kernel", {R, C}, 1);
  int A = kb.arg(DSC_I32, R * C, true, false), B = kb.arg(DSC_I32, R * C, true, false),
      O = kb.arg(DSC_I32, R * C, false, true), S = kb.arg(DSC_I64, R, false, true),
      Bo = kb.arg(DSC_BOOL, R * C, false, true), F = kb.arg(DSC_F32, R * C, false, true);
  int s = kb.slot(DSC_I64);
  kir_expr *a = ld(DSC_I32, acc(A, 0, {C, 1})), *b = ld(DSC_I32, acc(B, 0, {C, 1}));
  // divisor never 0: |b| + 1
  kir_expr *den = bin(KIR_ADD, un(KIR_ABS, b), c(DSC_I32, 1));
  kir_expr *q = bin(KIR_DIV, bin(KIR_MUL, a, c(DSC_I32, 7)), kir_select(&arena, bin(KIR_LT, a, b), den, un(KIR_NEG, den)));
  kir_expr *e = bin(KIR_ADD, q, bin(KIR_SUB, bin(KIR_MAX, a, b), bin(KIR_MIN, a, c(DSC_I32, 3))));
  e = bin(KIR_ADD, e, kir_cast(&arena, DSC_I32, bin(KIR_MUL, kir_cast(&arena, DSC_F32, a), c(DSC_F32, 0.7))));
  kb.reduce(KIR_REDUCE_SUM, s, kir_cast(&arena, DSC_I64, e));
  kb.store(acc(O, 0, {C, 1}), bin(KIR_ADD, e, kir_cast(&arena, DSC_I32, kir_index(&arena, 1))));
  kb.store(acc(S, 0, {1, 0}), sc(DSC_I64, s), false);
  kb.store(acc(Bo, 0, {C, 1}), bin(KIR_OR, bin(KIR_GT, a, b), bin(KIR_EQ, a, c(DSC_I32, 0))));
  kb.store(acc(F, 0, {C, 1}), a); // i32 -> f32 store conversion
  check(kb.done(), -50, 50);
}

// No outer dims: the outer range is the single index 0; the whole domain is
// inner (a global mean, then x - mean).
TEST_F(LlvmTest, KernelWithoutOuterDimsMatchesEval) {
  KB kb("no_outer", {50, 40}, 0);
  int X = kb.arg(DSC_F32, 2000, true, false), Y = kb.arg(DSC_F32, 2000, false, true),
      M = kb.arg(DSC_F32, 1, false, true);
  int s = kb.slot(DSC_F32), m = kb.slot(DSC_F32);
  kir_expr *x = ld(DSC_F32, acc(X, 0, {40, 1}));
  kb.reduce(KIR_REDUCE_SUM, s, x);
  kb.let(m, bin(KIR_DIV, sc(DSC_F32, s), c(DSC_F32, 2000)));
  kb.store(acc(M, 0, {0, 0}), sc(DSC_F32, m), false);
  kb.store(acc(Y, 0, {40, 1}), bin(KIR_SUB, x, sc(DSC_F32, m)));
  check(kb.done(), 0.5, 3.0, Tol{0.1});
}

TEST_F(LlvmTest, InvalidKernelIsADiagnosticNotACrash) {
  KB kb("bad_kernel", {4, 8}, 1);
  int X = kb.arg(DSC_F32, 16, true, false), Y = kb.arg(DSC_F32, 32, false, true); // X too small
  kb.store(acc(Y, 0, {8, 1}), ld(DSC_F32, acc(X, 0, {8, 1})));
  kir_kernel *k = kb.done();
  cg_cpu_kernel_fn fn = nullptr;
  EXPECT_NE(cg_llvm_compile(jit, &k, 1, &fn), DSC_OK);
  EXPECT_GT(dsc_error_count(ctx), 0);
  EXPECT_NE(diags().find("bad_kernel"), std::string::npos) << diags();
  EXPECT_EQ(cg_llvm_print_ir(ctx, &k, 1), nullptr);
}

TEST_F(LlvmTest, SameKernelTwiceSharesCodeAndBitcodeIsWritten) {
  KB kb("twice", {3, 64}, 1);
  int X = kb.arg(DSC_F32, 192, true, false), Y = kb.arg(DSC_F32, 192, false, true);
  kb.store(acc(Y, 0, {64, 1}), un(KIR_EXP, ld(DSC_F32, acc(X, 0, {64, 1}))));
  kir_kernel *ks[2] = {kb.done(), kb.done()};
  cg_cpu_kernel_fn fns[2] = {nullptr, nullptr};
  ASSERT_EQ(cg_llvm_compile(jit, ks, 2, fns), DSC_OK) << diags();
  EXPECT_EQ(fns[0], fns[1]);
  int compiled = 0, hits = 0;
  cg_llvm_jit_stats(jit, &compiled, &hits);
  EXPECT_EQ(compiled, 1);
  size_t len = 0;
  unsigned char *bc = (unsigned char *)cg_llvm_bitcode(ctx, ks, 1, &len);
  ASSERT_NE(bc, nullptr) << diags();
  ASSERT_GT(len, 4u);
  EXPECT_EQ(bc[0], 'B');
  EXPECT_EQ(bc[1], 'C');
  free(bc);
}

// The disk cache: a second JIT on the same directory loads objects instead
// of compiling; a corrupted (truncated or bit-flipped) file is recompiled and
// rewritten, and its kernel still computes the right thing.
TEST_F(LlvmTest, DiskCacheHitsAndRecompilesCorruptFiles) {
  std::string dir = std::string(DSC_BINARY_DIR) + "/testtmp";
  mkdir(dir.c_str(), 0777);
  dir += "/llvm_cache_" + std::to_string(getpid());
  mkdir(dir.c_str(), 0777);
  auto list = [&]() {
    std::vector<std::string> v;
    DIR *d = opendir(dir.c_str());
    if (!d) return v;
    while (struct dirent *e = readdir(d))
      if (e->d_name[0] != '.') v.push_back(dir + "/" + e->d_name);
    closedir(d);
    return v;
  };
  for (auto &f : list()) remove(f.c_str());

  const int64_t R = 4, C = 256;
  KB k1("cached_softmax", {R, C}, 1);
  k1.arg(DSC_F32, R * C, true, false);
  k1.arg(DSC_F32, R * C, false, true);
  k1.slot(DSC_F32);
  k1.slot(DSC_F32);
  kir_expr *x = ld(DSC_F32, acc(0, 0, {C, 1}));
  k1.reduce(KIR_REDUCE_MAX, 0, x);
  kir_expr *ex = un(KIR_EXP, bin(KIR_SUB, x, sc(DSC_F32, 0)));
  k1.reduce(KIR_REDUCE_SUM, 1, ex);
  k1.store(acc(1, 0, {C, 1}), bin(KIR_DIV, ex, sc(DSC_F32, 1)));
  KB k2("cached_tanh", {R, C}, 2);
  k2.arg(DSC_F32, R * C, true, false);
  k2.arg(DSC_F32, R * C, false, true);
  k2.store(acc(1, 0, {C, 1}), un(KIR_TANH, ld(DSC_F32, acc(0, 0, {C, 1}))));
  kir_kernel *ks[2] = {k1.done(), k2.done()};

  auto run = [&](int *compiled, int *hits) {
    cg_llvm_jit *j = cg_llvm_jit_new(ctx, dir.c_str());
    EXPECT_NE(j, nullptr) << diags();
    if (!j) return;
    cg_cpu_kernel_fn fns[2] = {nullptr, nullptr};
    EXPECT_EQ(cg_llvm_compile(j, ks, 2, fns), DSC_OK) << diags();
    cg_llvm_jit_stats(j, compiled, hits);
    // the loaded code is right: compare with kir_eval
    for (int i = 0; i < 2 && fns[i]; i++) {
      auto want = make_data(ks[i], -5, 5);
      auto got = want;
      void *pw[2] = {want[0].data(), want[1].data()}, *pg[2] = {got[0].data(), got[1].data()};
      kir_eval(ks[i], pw);
      int32_t st = 0;
      int64_t n = i == 0 ? R : R * C;
      fns[i](pg, 0, n, &st);
      const float *w = (const float *)want[1].data(), *g = (const float *)got[1].data();
      for (int64_t e = 0; e < R * C; e++)
        ASSERT_LE(std::fabs(g[e] - w[e]), 1e-5 * std::fabs(w[e])) << ks[i]->name << " " << e;
    }
    cg_llvm_jit_free(j);
  };
  int compiled = -1, hits = -1;
  auto t0 = std::chrono::steady_clock::now();
  run(&compiled, &hits);
  auto t1 = std::chrono::steady_clock::now();
  EXPECT_EQ(compiled, 2);
  EXPECT_EQ(hits, 0);
  auto files = list();
  ASSERT_EQ(files.size(), 2u); // no temp files left behind
  run(&compiled, &hits);
  auto t2 = std::chrono::steady_clock::now();
  EXPECT_EQ(compiled, 0);
  EXPECT_EQ(hits, 2);
  std::printf("[llvm] cache: cold %.1f ms, warm %.1f ms\n",
              std::chrono::duration<double, std::milli>(t1 - t0).count(),
              std::chrono::duration<double, std::milli>(t2 - t1).count());

  // corrupt: truncate one file, flip a byte in the other
  {
    struct stat sb;
    ASSERT_EQ(stat(files[0].c_str(), &sb), 0);
    ASSERT_EQ(truncate(files[0].c_str(), sb.st_size / 2), 0);
    FILE *f = fopen(files[1].c_str(), "r+b");
    ASSERT_NE(f, nullptr);
    fseek(f, 100, SEEK_SET);
    int ch = fgetc(f);
    fseek(f, 100, SEEK_SET);
    fputc(ch ^ 0x5a, f);
    fclose(f);
  }
  run(&compiled, &hits);
  EXPECT_EQ(compiled, 2);
  EXPECT_EQ(hits, 0);
  EXPECT_EQ(list().size(), 2u);
  run(&compiled, &hits); // rewritten files are good again
  EXPECT_EQ(compiled, 0);
  EXPECT_EQ(hits, 2);
  EXPECT_EQ(dsc_error_count(ctx), 0) << diags();
  for (auto &f : list()) remove(f.c_str());
  rmdir(dir.c_str());
}

// Equal kernels under other instruction numbers ("k3_exp", "k17_exp": the
// same layer's kernel in every layer) compile once; another op, or another
// body, does not share.
TEST_F(LlvmTest, EqualBodiesOfOneOpCompileOnce) {
  auto exp_kernel = [&](const char *name, int64_t cols) {
    auto *kb = new KB(name, {3, cols}, 1);
    int X = kb->arg(DSC_F32, 3 * cols, true, false), Y = kb->arg(DSC_F32, 3 * cols, false, true);
    kb->store(acc(Y, 0, {cols, 1}), un(KIR_EXP, ld(DSC_F32, acc(X, 0, {cols, 1}))));
    return kb;
  };
  std::vector<KB *> kbs = {exp_kernel("k3_exp", 64), exp_kernel("k17_exp", 64),
                           exp_kernel("k3_tanh", 64), exp_kernel("k9_exp", 32)};
  kir_kernel *ks[4];
  for (int i = 0; i < 4; i++) ks[i] = kbs[i]->done();
  cg_cpu_kernel_fn fns[4] = {};
  ASSERT_EQ(cg_llvm_compile(jit, ks, 4, fns), DSC_OK) << diags();
  EXPECT_EQ(fns[0], fns[1]);
  EXPECT_NE(fns[0], fns[2]);
  EXPECT_NE(fns[0], fns[3]);
  int compiled = 0, hits = 0;
  cg_llvm_jit_stats(jit, &compiled, &hits);
  EXPECT_EQ(compiled, 3);
  // and a later call finds them in the JIT
  cg_cpu_kernel_fn again = nullptr;
  ASSERT_EQ(cg_llvm_compile(jit, &ks[1], 1, &again), DSC_OK) << diags();
  EXPECT_EQ(again, fns[0]);
  cg_llvm_jit_stats(jit, &compiled, &hits);
  EXPECT_EQ(compiled, 3);
  for (int i = 0; i < 4; i++) {
    auto want = make_data(ks[i], -3, 3), got = want;
    void *pw[2] = {want[0].data(), want[1].data()}, *pg[2] = {got[0].data(), got[1].data()};
    kir_eval(ks[i], pw);
    int32_t st = 0;
    fns[i](pg, 0, 3, &st);
    const float *w = (const float *)want[1].data(), *g = (const float *)got[1].data();
    for (int64_t e = 0; e < ks[i]->dims[0] * ks[i]->dims[1]; e++)
      ASSERT_LE(std::fabs(g[e] - w[e]), 1e-6 * std::fabs(w[e])) << ks[i]->name << " " << e;
  }
  for (KB *kb : kbs) delete kb;
}

// Kernels compiled on 1 or 3 threads: the same code (bit-identical results)
// and every one right.
TEST_F(LlvmTest, ParallelCompileGivesTheSameKernels) {
  const int n = 12;
  std::vector<KB *> kbs;
  std::vector<kir_kernel *> ks;
  for (int i = 0; i < n; i++) {
    auto *kb = new KB("k1_scale", {4, 48}, 1);
    int X = kb->arg(DSC_F32, 192, true, false), Y = kb->arg(DSC_F32, 192, false, true);
    kir_expr *x = ld(DSC_F32, acc(X, 0, {48, 1}));
    kb->store(acc(Y, 0, {48, 1}), bin(KIR_ADD, un(KIR_TANH, bin(KIR_MUL, x, c(DSC_F32, 0.25 * (i + 1)))),
                                      c(DSC_F32, i)));
    kbs.push_back(kb);
    ks.push_back(kb->done());
  }
  std::vector<std::vector<std::vector<unsigned char>>> inputs;
  for (int i = 0; i < n; i++) inputs.push_back(make_data(ks[i], -2, 2));
  std::vector<std::vector<float>> results[2];
  for (int t = 0; t < 2; t++) {
    cg_llvm_jit *j = cg_llvm_jit_new(ctx, nullptr);
    ASSERT_NE(j, nullptr) << diags();
    cg_llvm_jit_set_threads(j, t == 0 ? 1 : 3);
    std::vector<cg_cpu_kernel_fn> fns(n);
    ASSERT_EQ(cg_llvm_compile(j, ks.data(), n, fns.data()), DSC_OK) << diags();
    int compiled = 0, hits = 0;
    cg_llvm_jit_stats(j, &compiled, &hits);
    EXPECT_EQ(compiled, n);
    for (int i = 0; i < n; i++) {
      auto want = inputs[i], got = want;
      void *pw[2] = {want[0].data(), want[1].data()}, *pg[2] = {got[0].data(), got[1].data()};
      kir_eval(ks[i], pw);
      int32_t st = 0;
      fns[i](pg, 0, 4, &st);
      const float *w = (const float *)want[1].data(), *g = (const float *)got[1].data();
      for (int e = 0; e < 192; e++) ASSERT_NEAR(g[e], w[e], 1e-5 * (1 + std::fabs(w[e]))) << i;
      results[t].emplace_back(g, g + 192);
    }
    cg_llvm_jit_free(j);
  }
  EXPECT_EQ(results[0], results[1]);
  for (KB *kb : kbs) delete kb;
}

// A signal while the workers compile: every thread stops, one "interrupted"
// error, DSC_ERR_INTERRUPTED, nothing linked.
TEST_F(LlvmTest, InterruptStopsTheCompileThreads) {
  const int n = 8;
  std::vector<KB *> kbs;
  std::vector<kir_kernel *> ks;
  for (int i = 0; i < n; i++) {
    auto *kb = new KB("k1_shift", {2, 32}, 1);
    int X = kb->arg(DSC_F32, 64, true, false), Y = kb->arg(DSC_F32, 64, false, true);
    kb->store(acc(Y, 0, {32, 1}), bin(KIR_ADD, ld(DSC_F32, acc(X, 0, {32, 1})), c(DSC_F32, i)));
    kbs.push_back(kb);
    ks.push_back(kb->done());
  }
  static int polls;
  polls = 0;
  // the first n polls are the checks before the jobs start; then stop
  dsc_context_set_interrupt(
      ctx, [](void *ud) -> int { return __atomic_fetch_add(&polls, 1, __ATOMIC_RELAXED) >= *(int *)ud; },
      (void *)&n);
  cg_llvm_jit_set_threads(jit, 3);
  std::vector<cg_cpu_kernel_fn> fns(n);
  EXPECT_EQ(cg_llvm_compile(jit, ks.data(), n, fns.data()), DSC_ERR_INTERRUPTED);
  EXPECT_EQ(dsc_error_count(ctx), 1) << diags();
  EXPECT_NE(diags().find("interrupted while compiling kernels"), std::string::npos) << diags();
  int compiled = -1, hits = -1;
  cg_llvm_jit_stats(jit, &compiled, &hits);
  EXPECT_EQ(compiled, 0);
  dsc_context_set_interrupt(ctx, nullptr, nullptr);
  for (KB *kb : kbs) delete kb;
}

// Progress: from 0 to all the kernels compiled, on the calling thread.
TEST_F(LlvmTest, CompileReportsProgress) {
  const int n = 5;
  std::vector<KB *> kbs;
  std::vector<kir_kernel *> ks;
  for (int i = 0; i < n; i++) {
    auto *kb = new KB("k2_neg", {2, 16}, 1);
    int X = kb->arg(DSC_F32, 32, true, false), Y = kb->arg(DSC_F32, 32, false, true);
    kb->store(acc(Y, 0, {16, 1}), bin(KIR_MUL, ld(DSC_F32, acc(X, 0, {16, 1})), c(DSC_F32, -i)));
    kbs.push_back(kb);
    ks.push_back(kb->done());
  }
  struct seen {
    std::vector<int64_t> done;
    std::string what;
    int64_t total = 0;
  } s;
  dsc_context_set_progress(
      ctx,
      [](void *ud, const char *what, int64_t done, int64_t total) {
        auto *p = (seen *)ud;
        p->done.push_back(done);
        p->what = what;
        p->total = total;
      },
      &s);
  std::vector<cg_cpu_kernel_fn> fns(n);
  ASSERT_EQ(cg_llvm_compile(jit, ks.data(), n, fns.data()), DSC_OK) << diags();
  ASSERT_GE(s.done.size(), 2u);
  EXPECT_EQ(s.done.front(), 0);
  EXPECT_EQ(s.done.back(), n);
  EXPECT_EQ(s.total, n);
  EXPECT_EQ(s.what, "compiling 5 kernels");
  for (size_t i = 1; i < s.done.size(); i++) EXPECT_LE(s.done[i - 1], s.done[i]);
  dsc_context_set_progress(ctx, nullptr, nullptr);
  for (KB *kb : kbs) delete kb;
}

// Where the kernel cache lives: the option, $DSC_CACHE_DIR ("off": none),
// $XDG_CACHE_HOME/dsc (an absolute one), ~/.cache/dsc; and a directory whose
// parents are missing is made.
TEST_F(LlvmTest, KernelCacheDirectory) {
  struct saved_env {
    std::vector<std::pair<std::string, std::string>> vars;
    saved_env() {
      for (const char *v : {"DSC_CACHE_DIR", "XDG_CACHE_HOME", "HOME"})
        vars.emplace_back(v, getenv(v) ? getenv(v) : std::string("\x01"));
    }
    ~saved_env() {
      for (auto &p : vars) {
        if (p.second == "\x01")
          unsetenv(p.first.c_str());
        else
          setenv(p.first.c_str(), p.second.c_str(), 1);
      }
    }
  } keep;
  char buf[4096];
  setenv("HOME", "/home/u", 1);
  unsetenv("XDG_CACHE_HOME");
  unsetenv("DSC_CACHE_DIR");
  EXPECT_STREQ(cg_kernel_cache_dir(nullptr, buf, sizeof buf), "/home/u/.cache/dsc");
  setenv("XDG_CACHE_HOME", "relative", 1); // not absolute: ignored, as the XDG spec says
  EXPECT_STREQ(cg_kernel_cache_dir(nullptr, buf, sizeof buf), "/home/u/.cache/dsc");
  setenv("XDG_CACHE_HOME", "/xdg", 1);
  EXPECT_STREQ(cg_kernel_cache_dir(nullptr, buf, sizeof buf), "/xdg/dsc");
  setenv("DSC_CACHE_DIR", "/mine", 1);
  EXPECT_STREQ(cg_kernel_cache_dir(nullptr, buf, sizeof buf), "/mine");
  EXPECT_STREQ(cg_kernel_cache_dir("/opt", buf, sizeof buf), "/opt");
  setenv("DSC_CACHE_DIR", "off", 1);
  EXPECT_EQ(cg_kernel_cache_dir(nullptr, buf, sizeof buf), nullptr);
  EXPECT_EQ(cg_kernel_cache_dir("off", buf, sizeof buf), nullptr);
  unsetenv("DSC_CACHE_DIR");
  unsetenv("XDG_CACHE_HOME");
  unsetenv("HOME");
  EXPECT_EQ(cg_kernel_cache_dir(nullptr, buf, sizeof buf), nullptr);

  std::string root = std::string(DSC_BINARY_DIR) + "/testtmp/cache_parents_" + std::to_string(getpid());
  std::string dir = root + "/a/b/dsc";
  cg_llvm_jit *j = cg_llvm_jit_new(ctx, dir.c_str());
  ASSERT_NE(j, nullptr) << diags();
  KB kb("k1_sqrt", {2, 16}, 1);
  int X = kb.arg(DSC_F32, 32, true, false), Y = kb.arg(DSC_F32, 32, false, true);
  kb.store(acc(Y, 0, {16, 1}), un(KIR_SQRT, ld(DSC_F32, acc(X, 0, {16, 1}))));
  kir_kernel *k = kb.done();
  cg_cpu_kernel_fn fn = nullptr;
  ASSERT_EQ(cg_llvm_compile(j, &k, 1, &fn), DSC_OK) << diags();
  cg_llvm_jit_free(j);
  int files = 0;
  if (DIR *d = opendir(dir.c_str())) {
    while (struct dirent *e = readdir(d)) files += e->d_name[0] != '.';
    closedir(d);
  }
  EXPECT_EQ(files, 1);
  std::string rm = "rm -rf '" + root + "'";
  EXPECT_EQ(system(rm.c_str()), 0);
}

// DSC_CPU_ISA lowers the ISA of the kernels (the host string says so, and
// they still compute the right thing); above the host or unknown: an error.
TEST_F(LlvmTest, CpuIsaLowersTheKernelTarget) {
  std::string saved = getenv("DSC_CPU_ISA") ? getenv("DSC_CPU_ISA") : "";
  cg_cpu_isa host = cg_cpu_isa_host(), isa;
  char err[200];
  unsetenv("DSC_CPU_ISA");
  EXPECT_TRUE(cg_cpu_isa_resolve(&isa, err, sizeof err));
  EXPECT_EQ(isa, host);
  setenv("DSC_CPU_ISA", "avx1024", 1);
  EXPECT_FALSE(cg_cpu_isa_resolve(&isa, err, sizeof err));
  EXPECT_NE(std::string(err).find("expected avx512, avx2 or baseline"), std::string::npos) << err;
  EXPECT_EQ(cg_cpu_isa_get(), CG_ISA_BASELINE);
  if (host < CG_ISA_AVX512) {
    setenv("DSC_CPU_ISA", "avx512", 1);
    EXPECT_FALSE(cg_cpu_isa_resolve(&isa, err, sizeof err));
    EXPECT_NE(std::string(err).find("can lower the ISA, not raise it"), std::string::npos) << err;
  }
  char here[1024], lowered[1024];
  unsetenv("DSC_CPU_ISA");
  ASSERT_TRUE(cg_llvm_host_string(ctx, here, sizeof here)) << diags();
  for (cg_cpu_isa want : {CG_ISA_AVX2, CG_ISA_BASELINE}) {
    if (want > host) continue;
    setenv("DSC_CPU_ISA", cg_cpu_isa_name(want), 1);
    ASSERT_TRUE(cg_cpu_isa_resolve(&isa, err, sizeof err)) << err;
    EXPECT_EQ(isa, want);
    ASSERT_TRUE(cg_llvm_host_string(ctx, lowered, sizeof lowered)) << diags();
    std::string l = lowered;
    EXPECT_EQ(l.find("+avx512"), std::string::npos) << l;
    if (want == CG_ISA_BASELINE) {
      EXPECT_EQ(l.find("+avx"), std::string::npos) << l;
    }
    if (host > want) {
      EXPECT_NE(l, std::string(here));
    }
    cg_llvm_jit *j = cg_llvm_jit_new(ctx, nullptr);
    ASSERT_NE(j, nullptr) << diags();
    KB kb("k1_exp", {4, 40}, 1);
    int X = kb.arg(DSC_F32, 160, true, false), Y = kb.arg(DSC_F32, 160, false, true);
    kb.store(acc(Y, 0, {40, 1}), un(KIR_EXP, ld(DSC_F32, acc(X, 0, {40, 1}))));
    kir_kernel *k = kb.done();
    cg_cpu_kernel_fn fn = nullptr;
    ASSERT_EQ(cg_llvm_compile(j, &k, 1, &fn), DSC_OK) << diags();
    auto want_d = make_data(k, -4, 4), got = want_d;
    void *pw[2] = {want_d[0].data(), want_d[1].data()}, *pg[2] = {got[0].data(), got[1].data()};
    kir_eval(k, pw);
    int32_t st = 0;
    fn(pg, 0, 4, &st);
    const float *w = (const float *)want_d[1].data(), *g = (const float *)got[1].data();
    for (int e = 0; e < 160; e++) ASSERT_LE(std::fabs(g[e] - w[e]), 2e-6 * std::fabs(w[e])) << e;
    cg_llvm_jit_free(j);
  }
  if (saved.empty())
    unsetenv("DSC_CPU_ISA");
  else
    setenv("DSC_CPU_ISA", saved.c_str(), 1);
}

} // namespace
