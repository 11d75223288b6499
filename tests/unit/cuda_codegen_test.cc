// CUDA code generation (codegen/cuda.c): kernel IR -> CUDA C -> NVRTC.
// There is no GPU here: the kernels are checked by structure (launch
// configuration, mapping, text) and by compiling every one of them with NVRTC
// for sm_90 (PTX entry points, an ELF cubin, no warnings).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

extern "C" {
#include "codegen/codegen.h"
}
#include "tests/unit/test_util.h"

namespace {

struct Arena {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  ir_arena a;
  Arena() { ir_arena_init(&a, ctx); }
  ~Arena() {
    ir_arena_release(&a);
    dsc_context_free(ctx);
  }
};

kir_access Acc(int arg, int64_t offset, std::initializer_list<int64_t> strides) {
  kir_access x;
  memset(&x, 0, sizeof x);
  x.arg = arg;
  x.offset = offset;
  int d = 0;
  for (int64_t s : strides) x.stride[d++] = s;
  return x;
}

// Builds a kernel whose arrays live in the arena (so it outlives the builder).
struct KB {
  ir_arena *a;
  std::vector<kir_arg> args;
  std::vector<dsc_dtype> slots;
  std::vector<kir_stage> stages;
  explicit KB(ir_arena *arena) : a(arena) {}
  int Arg(dsc_dtype dt, int64_t numel, bool read, bool written) {
    args.push_back({dt, numel, read, written});
    return (int)args.size() - 1;
  }
  int Slot(dsc_dtype dt) {
    slots.push_back(dt);
    return (int)slots.size() - 1;
  }
  kir_expr *Load(dsc_dtype t, int arg, int64_t offset, std::initializer_list<int64_t> strides) {
    return kir_load(a, t, Acc(arg, offset, strides));
  }
  kir_expr *F(double v) { return kir_const(a, DSC_F32, v); }
  void Reduce(kir_reduce_op op, int slot, kir_expr *e) {
    kir_stage s;
    memset(&s, 0, sizeof s);
    s.kind = KIR_STAGE_REDUCE;
    s.reduce = op;
    s.slot = slot;
    s.expr = e;
    stages.push_back(s);
  }
  void Let(int slot, kir_expr *e) {
    kir_stage s;
    memset(&s, 0, sizeof s);
    s.kind = KIR_STAGE_LET;
    s.slot = slot;
    s.expr = e;
    stages.push_back(s);
  }
  void Store(kir_access dst, kir_expr *e, bool over_inner = true) {
    kir_stage s;
    memset(&s, 0, sizeof s);
    s.kind = KIR_STAGE_STORE;
    s.over_inner = over_inner;
    s.dst = dst;
    s.expr = e;
    stages.push_back(s);
  }
  kir_kernel *Done(const char *name, std::initializer_list<int64_t> dims, int n_outer) {
    kir_kernel *k = (kir_kernel *)ir_arena_alloc(a, sizeof *k);
    k->name = ir_arena_strdup(a, name);
    k->rank = (int)dims.size();
    k->n_outer = n_outer;
    int d = 0;
    for (int64_t x : dims) k->dims[d++] = x;
    k->n_args = (int)args.size();
    k->args = (kir_arg *)ir_arena_alloc(a, sizeof(kir_arg) * (args.size() + 1));
    if (!args.empty()) memcpy(k->args, args.data(), sizeof(kir_arg) * args.size());
    k->n_slots = (int)slots.size();
    k->slot_types = (dsc_dtype *)ir_arena_alloc(a, sizeof(dsc_dtype) * (slots.size() + 1));
    if (!slots.empty()) memcpy(k->slot_types, slots.data(), sizeof(dsc_dtype) * slots.size());
    k->n_stages = (int)stages.size();
    k->stages = (kir_stage *)ir_arena_alloc(a, sizeof(kir_stage) * (stages.size() + 1));
    memcpy(k->stages, stages.data(), sizeof(kir_stage) * stages.size());
    return k;
  }
};

// softmax over the last dim of x[R, C] (f32) into y (dtype out).
kir_kernel *Softmax(ir_arena *a, const char *name, int64_t R, int64_t C, dsc_dtype out) {
  KB b(a);
  int x = b.Arg(DSC_F32, R * C, true, false), y = b.Arg(out, R * C, false, true);
  int mx = b.Slot(DSC_F32), sum = b.Slot(DSC_F32);
  kir_expr *xv = b.Load(DSC_F32, x, 0, {C, 1});
  kir_expr *e = kir_un(a, KIR_EXP, kir_bin(a, KIR_SUB, xv, kir_scalar(a, DSC_F32, mx)));
  b.Reduce(KIR_REDUCE_MAX, mx, xv);
  b.Reduce(KIR_REDUCE_SUM, sum, e);
  b.Store(Acc(y, 0, {C, 1}), kir_bin(a, KIR_DIV, e, kir_scalar(a, DSC_F32, sum)));
  return b.Done(name, {R, C}, 1);
}

// Every unary op on a float type t: out[i*N + n] = op_i(x[n]).
kir_kernel *Unary(ir_arena *a, const char *name, dsc_dtype t, int64_t N) {
  KB b(a);
  kir_unary ops[] = {KIR_NEG,  KIR_EXP,     KIR_LOG, KIR_SQRT, KIR_RSQRT,
                     KIR_TANH, KIR_SIGMOID, KIR_ABS, KIR_SIN,  KIR_COS};
  const int n_ops = (int)(sizeof ops / sizeof ops[0]);
  int x = b.Arg(t, N, true, false), out = b.Arg(t, n_ops * N, false, true);
  kir_expr *xv = b.Load(t, x, 0, {1});
  for (int i = 0; i < n_ops; i++) b.Store(Acc(out, i * N, {1}), kir_un(a, ops[i], xv));
  return b.Done(name, {N}, 1);
}

// Every binary op, select and cast on compute type t (float or integer).
kir_kernel *Binary(ir_arena *a, const char *name, dsc_dtype t, int64_t N) {
  KB b(a);
  bool fl = t == DSC_F32 || t == DSC_F64;
  int x = b.Arg(t, N, true, false), y = b.Arg(t, N, true, false);
  int out = b.Arg(t, 10 * N, false, true), cmp = b.Arg(DSC_BOOL, 5 * N, false, true);
  int casts = b.Arg(DSC_F64, 4 * N, false, true);
  kir_expr *xv = b.Load(t, x, 0, {1}), *yv = b.Load(t, y, 0, {1});
  std::vector<kir_binary> ops = {KIR_ADD, KIR_SUB, KIR_MUL, KIR_DIV, KIR_MAX, KIR_MIN};
  if (fl) ops.push_back(KIR_POW);
  int i = 0;
  for (kir_binary op : ops) b.Store(Acc(out, N * i++, {1}), kir_bin(a, op, xv, yv));
  kir_expr *lt = kir_bin(a, KIR_LT, xv, yv), *gt = kir_bin(a, KIR_GT, xv, yv);
  b.Store(Acc(out, N * i++, {1}), kir_select(a, lt, xv, yv));
  if (!fl) {  // integer unaries
    b.Store(Acc(out, N * i++, {1}), kir_un(a, KIR_NEG, xv));
    b.Store(Acc(out, N * i++, {1}), kir_un(a, KIR_ABS, xv));
  }
  if (t == DSC_I64) b.Store(Acc(out, N * i++, {1}), kir_bin(a, KIR_RAND24, xv, yv));
  b.Store(Acc(cmp, 0, {1}), lt);
  b.Store(Acc(cmp, N, {1}), gt);
  b.Store(Acc(cmp, 2 * N, {1}), kir_bin(a, KIR_EQ, xv, yv));
  b.Store(Acc(cmp, 3 * N, {1}), kir_bin(a, KIR_AND, lt, kir_bin(a, KIR_EQ, lt, gt)));
  b.Store(Acc(cmp, 4 * N, {1}), kir_bin(a, KIR_OR, lt, gt));
  // casts to every compute type and back to f64 storage
  b.Store(Acc(casts, 0, {1}), kir_cast(a, DSC_F32, xv));
  b.Store(Acc(casts, N, {1}), kir_cast(a, DSC_I32, xv));
  b.Store(Acc(casts, 2 * N, {1}), kir_cast(a, DSC_I64, kir_cast(a, DSC_F64, xv)));
  b.Store(Acc(casts, 3 * N, {1}), kir_cast(a, DSC_F64, kir_cast(a, DSC_BOOL, xv)));
  return b.Done(name, {N}, 1);
}

// Loads from every storage dtype, stores to every storage dtype (from f32,
// f64, i32 and bool compute values).
kir_kernel *Storage(ir_arena *a, const char *name, int64_t N) {
  KB b(a);
  dsc_dtype all[] = {DSC_F32, DSC_F64, DSC_BF16, DSC_F16, DSC_I32, DSC_I64, DSC_BOOL};
  std::vector<int> in, out;
  for (dsc_dtype d : all) in.push_back(b.Arg(d, N, true, false));
  for (dsc_dtype d : all) out.push_back(b.Arg(d, 4 * N, false, true));
  kir_expr *sum = nullptr;
  for (int i = 0; i < 7; i++) {
    kir_expr *v = b.Load(DSC_F32, in[i], 0, {1});
    sum = sum ? kir_bin(a, KIR_ADD, sum, v) : v;
  }
  kir_expr *d = b.Load(DSC_F64, in[2], 0, {1});   // bf16 widened to f64
  kir_expr *iv = b.Load(DSC_I32, in[3], 0, {1});  // f16 truncated to i32
  kir_expr *bv = b.Load(DSC_BOOL, in[6], 0, {1});
  for (int i = 0; i < 7; i++) {
    b.Store(Acc(out[i], 0, {1}), sum);
    b.Store(Acc(out[i], N, {1}), d);
    b.Store(Acc(out[i], 2 * N, {1}), iv);
    b.Store(Acc(out[i], 3 * N, {1}), bv);
  }
  return b.Done(name, {N}, 1);
}

// REDUCE sum/max/min in f32, f64 and i32, LETs and once-per-row stores.
kir_kernel *Reductions(ir_arena *a, const char *name, int64_t R, int64_t C) {
  KB b(a);
  int x = b.Arg(DSC_F32, R * C, true, false), xd = b.Arg(DSC_F64, R * C, true, false);
  int out = b.Arg(DSC_F32, R * 8, false, true);
  int sum = b.Slot(DSC_F32), mx = b.Slot(DSC_F32), mn = b.Slot(DSC_F32), mean = b.Slot(DSC_F32);
  int dmin = b.Slot(DSC_F64), isum = b.Slot(DSC_I32), imax = b.Slot(DSC_I64);
  kir_expr *xv = b.Load(DSC_F32, x, 0, {C, 1});
  b.Reduce(KIR_REDUCE_SUM, sum, xv);
  b.Reduce(KIR_REDUCE_MAX, mx, xv);
  b.Reduce(KIR_REDUCE_MIN, mn, xv);
  b.Let(mean, kir_bin(a, KIR_DIV, kir_scalar(a, DSC_F32, sum), b.F((double)C)));
  b.Reduce(KIR_REDUCE_MIN, dmin, b.Load(DSC_F64, xd, 0, {C, 1}));
  b.Reduce(KIR_REDUCE_SUM, isum, kir_cast(a, DSC_I32, kir_index(a, 1)));
  b.Reduce(KIR_REDUCE_MAX, imax, kir_bin(a, KIR_MUL, kir_index(a, 0), kir_index(a, 1)));
  int s[] = {sum, mx, mn, mean};
  for (int i = 0; i < 4; i++) b.Store(Acc(out, i, {8, 0}), kir_scalar(a, DSC_F32, s[i]), false);
  b.Store(Acc(out, 4, {8, 0}), kir_cast(a, DSC_F32, kir_scalar(a, DSC_F64, dmin)), false);
  b.Store(Acc(out, 5, {8, 0}), kir_cast(a, DSC_F32, kir_scalar(a, DSC_I32, isum)), false);
  b.Store(Acc(out, 6, {8, 0}), kir_cast(a, DSC_F32, kir_scalar(a, DSC_I64, imax)), false);
  return b.Done(name, {R, C}, 1);
}

// n_outer = 0: one block reduces everything into a scalar.
kir_kernel *ReduceAll(ir_arena *a, const char *name, int64_t N) {
  KB b(a);
  int x = b.Arg(DSC_F32, N, true, false), y = b.Arg(DSC_F32, 1, false, true);
  int sum = b.Slot(DSC_F32), mean = b.Slot(DSC_F32);
  b.Reduce(KIR_REDUCE_SUM, sum, b.Load(DSC_F32, x, 0, {1}));
  b.Let(mean, kir_bin(a, KIR_MUL, kir_scalar(a, DSC_F32, sum), b.F(1.0 / (double)N)));
  b.Store(Acc(y, 0, {0}), kir_scalar(a, DSC_F32, mean), false);
  return b.Done(name, {N}, 0);
}

// n_outer = 0 without reductions, a broadcast bias (stride 0) and an index.
kir_kernel *Broadcast(ir_arena *a, const char *name, int64_t R, int64_t C) {
  KB b(a);
  int x = b.Arg(DSC_F32, R * C, true, false), bias = b.Arg(DSC_BF16, C, true, false);
  int y = b.Arg(DSC_F32, R * C, false, true);
  kir_expr *v =
      kir_bin(a, KIR_ADD, b.Load(DSC_F32, x, 0, {C, 1}), b.Load(DSC_F32, bias, 0, {0, 1}));
  v = kir_bin(a, KIR_ADD, v, kir_cast(a, DSC_F32, kir_index(a, 1)));
  b.Store(Acc(y, 0, {C, 1}), v);
  return b.Done(name, {R, C}, 0);
}

// LET and a once-per-row store in the thread-per-point mapping.
kir_kernel *LetPoint(ir_arena *a, const char *name, int64_t R, int64_t C) {
  KB b(a);
  int x = b.Arg(DSC_F32, R, true, false), y = b.Arg(DSC_F32, R * C, true, false);
  int out = b.Arg(DSC_F32, R * C, false, true), out2 = b.Arg(DSC_F16, R, false, true);
  int s = b.Slot(DSC_F32);
  b.Let(s, kir_bin(a, KIR_MUL, b.Load(DSC_F32, x, 0, {1, 0}), b.F(2.0)));
  b.Store(Acc(out, 0, {C, 1}),
          kir_bin(a, KIR_MUL, b.Load(DSC_F32, y, 0, {C, 1}), kir_scalar(a, DSC_F32, s)));
  b.Store(Acc(out2, 0, {1, 0}), kir_scalar(a, DSC_F32, s), false);
  return b.Done(name, {R, C}, 1);
}

// Embedding lookup (gathered load) and a scatter (gathered store).
kir_kernel *Gather(ir_arena *a, const char *name, int64_t T, int64_t V, int64_t D) {
  KB b(a);
  int ids = b.Arg(DSC_I32, T, true, false), table = b.Arg(DSC_F32, V * D, true, false);
  int out = b.Arg(DSC_F32, T * D, false, true), dst = b.Arg(DSC_BF16, V * D, false, true);
  kir_expr *id = b.Load(DSC_I32, ids, 0, {1, 0});
  kir_access ta = Acc(table, 0, {0, 1});
  ta.gather = id;
  ta.gather_stride = D;
  ta.gather_bound = V;
  kir_expr *row = kir_load(a, DSC_F32, ta);
  b.Store(Acc(out, 0, {D, 1}), row);
  kir_access da = Acc(dst, 0, {0, 1});
  da.gather = kir_cast(a, DSC_I64, id);
  da.gather_stride = D;
  da.gather_bound = V;
  b.Store(da, kir_bin(a, KIR_MUL, row, b.F(0.5)));
  return b.Done(name, {T, D}, 1);
}

// Stage 1 reads what stage 0 wrote at another point (reversed): the kernel
// must order the stages across threads.
kir_kernel *Hazard(ir_arena *a, const char *name, int64_t N) {
  KB b(a);
  int x = b.Arg(DSC_F32, N, true, false), y = b.Arg(DSC_F32, N, true, true);
  int z = b.Arg(DSC_F32, N, false, true);
  b.Store(Acc(y, 0, {1}), kir_bin(a, KIR_MUL, b.Load(DSC_F32, x, 0, {1}), b.F(2)));
  b.Store(Acc(z, 0, {1}), b.Load(DSC_F32, y, N - 1, {-1}));
  return b.Done(name, {N}, 0);
}

// Constants at the edges of every compute type.
kir_kernel *Constants(ir_arena *a, const char *name) {
  KB b(a);
  int f = b.Arg(DSC_F32, 4, false, true), d = b.Arg(DSC_F64, 4, false, true);
  int i = b.Arg(DSC_I32, 2, false, true), l = b.Arg(DSC_I64, 2, false, true);
  int o = b.Arg(DSC_BOOL, 2, false, true);
  double fv[] = {INFINITY, -INFINITY, NAN, 0.1};
  double dv[] = {1e300, -INFINITY, NAN, -0.0};
  for (int k = 0; k < 4; k++) {
    b.Store(Acc(f, k, {}), kir_const(a, DSC_F32, fv[k]), false);
    b.Store(Acc(d, k, {}), kir_const(a, DSC_F64, dv[k]), false);
  }
  b.Store(Acc(i, 0, {}), kir_const(a, DSC_I32, -2147483648.0), false);
  b.Store(Acc(i, 1, {}), kir_const(a, DSC_I32, 7), false);
  b.Store(Acc(l, 0, {}), kir_const(a, DSC_I64, -9223372036854775808.0), false);
  b.Store(Acc(l, 1, {}), kir_const(a, DSC_I64, 1e15), false);
  b.Store(Acc(o, 0, {}), kir_const(a, DSC_BOOL, 1), false);
  b.Store(Acc(o, 1, {}), kir_const(a, DSC_BOOL, 0), false);
  return b.Done(name, {}, 0);
}

// Domains and rows beyond 2^31 elements (64-bit counters and addresses).
kir_kernel *Huge(ir_arena *a, const char *name, bool reduce) {
  KB b(a);
  const int64_t R = 2, C = 3000000000LL;
  int x = b.Arg(DSC_F32, R * C, true, false), y = b.Arg(DSC_F32, R * C, false, true);
  kir_expr *xv = b.Load(DSC_F32, x, 0, {C, 1});
  if (reduce) {
    int s = b.Slot(DSC_F32);
    b.Reduce(KIR_REDUCE_SUM, s, xv);
    b.Store(Acc(y, 0, {C, 0}), kir_scalar(a, DSC_F32, s), false);
  } else {
    b.Store(Acc(y, 0, {C, 1}), kir_un(a, KIR_NEG, xv));
  }
  return b.Done(name, {R, C}, 1);
}

struct Suite {
  std::vector<kir_kernel *> k;
  explicit Suite(ir_arena *a) {
    k.push_back(Softmax(a, "softmax_long_rows", 3, 1000, DSC_F32));
    k.push_back(Softmax(a, "softmax_bf16", 5, 37, DSC_BF16));
    k.push_back(Softmax(a, "softmax_f16", 4, 300, DSC_F16));
    k.push_back(Unary(a, "unary_f32", DSC_F32, 1000));
    k.push_back(Unary(a, "unary_f64", DSC_F64, 100));
    k.push_back(Binary(a, "binary_f32", DSC_F32, 257));
    k.push_back(Binary(a, "binary_f64", DSC_F64, 64));
    k.push_back(Binary(a, "binary_i32", DSC_I32, 33));
    k.push_back(Binary(a, "binary_i64", DSC_I64, 31));
    k.push_back(Storage(a, "storage_types", 100));
    k.push_back(Reductions(a, "reductions", 7, 513));
    k.push_back(ReduceAll(a, "reduce_all", 5000));
    k.push_back(Broadcast(a, "broadcast_bias", 6, 70));
    k.push_back(LetPoint(a, "let_point", 9, 40));
    k.push_back(Gather(a, "gather_embed", 16, 50, 24));
    k.push_back(Hazard(a, "hazard_reverse", 300));
    k.push_back(Constants(a, "constants"));
    k.push_back(Huge(a, "huge_point", false));
    k.push_back(Huge(a, "huge_rows", true));
    // Identical bodies share one __device__ function behind two entry points.
    k.push_back(Softmax(a, "softmax_long_rows_again", 3, 1000, DSC_F32));
    k.push_back(Unary(a, "unary_f32_again", DSC_F32, 1000));
  }
};

std::string Source(Arena &A, const kir_kernel *k, cg_cuda_launch *l) {
  char *s = cg_cuda_source(&A.a, k, l);
  EXPECT_NE(s, nullptr) << diags(A.ctx);
  return s ? s : "";
}

int Count(const std::string &s, const std::string &what) {
  int n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) n++;
  return n;
}

TEST(CudaCodegen, EveryTestKernelValidates) {
  Arena A;
  Suite S(&A.a);
  for (kir_kernel *k : S.k) {
    char err[256] = "";
    EXPECT_TRUE(kir_validate(k, err, sizeof err)) << k->name << ": " << err;
  }
}

TEST(CudaCodegen, ReductionKernelsRunABlockPerRow) {
  Arena A;
  cg_cuda_launch l;
  // Rows longer than the block: 256 threads stride the 1000 columns.
  std::string s = Source(A, Softmax(&A.a, "sm", 3, 1000, DSC_F32), &l);
  EXPECT_EQ(l.grid[0], 3u);
  EXPECT_EQ(l.block[0], 256u);
  EXPECT_EQ(l.grid[1] * l.grid[2] * l.block[1] * l.block[2], 1u);
  EXPECT_EQ(l.shared_bytes, 0u);
  EXPECT_NE(s.find("extern \"C\" __global__ void __launch_bounds__(256) sm(const float *a0, "
                   "float *a1, int *status)"),
            std::string::npos)
      << s;
  EXPECT_NE(s.find("block-per-outer-index"), std::string::npos);
  EXPECT_NE(s.find("r += 256u"), std::string::npos);
  EXPECT_EQ(Count(s, "__shfl_xor_sync"), 2);  // one per REDUCE
  // Short rows: the block shrinks to a warp multiple covering the row.
  s = Source(A, Softmax(&A.a, "sm2", 5, 37, DSC_BF16), &l);
  EXPECT_EQ(l.grid[0], 5u);
  EXPECT_EQ(l.block[0], 64u);
  EXPECT_NE(s.find("dsc_f32_bf16("), std::string::npos);
  EXPECT_NE(s.find("unsigned short *a1"), std::string::npos);
  // n_outer = 0: a single block, the scalar stored by thread 0.
  s = Source(A, ReduceAll(&A.a, "ra", 5000), &l);
  EXPECT_EQ(l.grid[0], 1u);
  EXPECT_EQ(l.block[0], 256u);
  EXPECT_NE(s.find("if (threadIdx.x == 0)"), std::string::npos);
}

TEST(CudaCodegen, ElementwiseKernelsRunAThreadPerPoint) {
  Arena A;
  cg_cuda_launch l;
  std::string s = Source(A, Unary(&A.a, "u", DSC_F32, 1000), &l);
  EXPECT_EQ(l.block[0], 256u);
  EXPECT_EQ(l.grid[0], 4u);  // ceil(1000 / 256)
  EXPECT_NE(s.find("thread-per-point"), std::string::npos);
  EXPECT_EQ(s.find("__syncthreads"), std::string::npos);
  for (const char *fn : {"expf(", "logf(", "sqrtf(", "rsqrtf(", "tanhf(", "fabsf("})
    EXPECT_NE(s.find(fn), std::string::npos) << fn;
  s = Source(A, Broadcast(&A.a, "bc", 2, 3), &l);  // 6 points: one warp
  EXPECT_EQ(l.block[0], 32u);
  EXPECT_EQ(l.grid[0], 1u);
  // A once-per-row store in the point mapping runs at inner index 0 only.
  s = Source(A, LetPoint(&A.a, "lp", 9, 40), &l);
  EXPECT_NE(s.find("if (f % 40u == 0)"), std::string::npos) << s;
  EXPECT_EQ(l.grid[0], 2u);  // 360 points
}

TEST(CudaCodegen, SharedSubexpressionsAreEvaluatedOncePerPoint) {
  Arena A;
  KB b(&A.a);
  int x = b.Arg(DSC_F32, 64, true, false), y = b.Arg(DSC_F32, 64, false, true);
  kir_expr *t = kir_un(&A.a, KIR_EXP, b.Load(DSC_F32, x, 0, {1}));
  b.Store(Acc(y, 0, {1}), kir_bin(&A.a, KIR_MUL, t, kir_bin(&A.a, KIR_ADD, t, t)));
  std::string s = Source(A, b.Done("dag", {64}, 1), nullptr);
  EXPECT_EQ(Count(s, "expf("), 1) << s;
  EXPECT_EQ(Count(s, "a0["), 1) << s;
}

TEST(CudaCodegen, FloatToIntegerConversionsWrapLikeTheEvaluator) {
  Arena A;
  KB b(&A.a);
  int x = b.Arg(DSC_F32, 8, true, false), y = b.Arg(DSC_I32, 8, false, true);
  int z = b.Arg(DSC_I64, 8, false, true);
  kir_expr *xv = b.Load(DSC_F32, x, 0, {1});
  b.Store(Acc(y, 0, {1}), xv);                           // storage conversion
  b.Store(Acc(z, 0, {1}), kir_cast(&A.a, DSC_I64, xv));  // cast
  std::string s = Source(A, b.Done("f2i", {8}, 1), nullptr);
  EXPECT_NE(s.find("= dsc_f64_i32((double)v"), std::string::npos) << s;
  EXPECT_NE(s.find("= dsc_f64_i64((double)v"), std::string::npos) << s;
}

TEST(CudaCodegen, CrossPointHazardUsesABarrier) {
  Arena A;
  cg_cuda_launch l;
  std::string s = Source(A, Hazard(&A.a, "hz", 300), &l);
  EXPECT_NE(s.find("block-per-outer-index"), std::string::npos) << s;
  EXPECT_EQ(Count(s, "__syncthreads();"), 1) << s;
  EXPECT_EQ(l.grid[0], 1u);
  // The same two stages at the same point need no barrier.
  KB b(&A.a);
  int x = b.Arg(DSC_F32, 300, true, false), y = b.Arg(DSC_F32, 300, true, true);
  int z = b.Arg(DSC_F32, 300, false, true);
  b.Store(Acc(y, 0, {1}), b.Load(DSC_F32, x, 0, {1}));
  b.Store(Acc(z, 0, {1}), b.Load(DSC_F32, y, 0, {1}));
  s = Source(A, b.Done("same_point", {300}, 0), &l);
  EXPECT_NE(s.find("thread-per-point"), std::string::npos) << s;
  EXPECT_EQ(s.find("__syncthreads"), std::string::npos);
}

TEST(CudaCodegen, GathersAreBoundsChecked) {
  Arena A;
  std::string s = Source(A, Gather(&A.a, "g", 16, 50, 24), nullptr);
  // The gathered row in each of the two stages and the scattered store.
  EXPECT_EQ(Count(s, "*status = 1;"), 3) << s;
  EXPECT_EQ(Count(s, "< 50ll)"), 3) << s;
}

TEST(CudaCodegen, HugeDomainsUse64BitCounters) {
  Arena A;
  cg_cuda_launch l;
  std::string s = Source(A, Huge(&A.a, "hp", false), &l);
  EXPECT_NE(s.find("unsigned long long f"), std::string::npos) << s;
  EXPECT_NE(s.find("3000000000ll * i0"), std::string::npos) << s;
  EXPECT_EQ(l.grid[0], 23437500u);  // ceil(6e9 / 256)
  s = Source(A, Huge(&A.a, "hr", true), &l);
  EXPECT_NE(s.find("unsigned long long r"), std::string::npos) << s;
  EXPECT_EQ(l.grid[0], 2u);
}

TEST(CudaCodegen, LaunchConfigMatchesSource) {
  Arena A;
  Suite S(&A.a);
  for (kir_kernel *k : S.k) {
    cg_cuda_launch a, b;
    ASSERT_NE(cg_cuda_source(&A.a, k, &a), nullptr) << diags(A.ctx);
    ASSERT_TRUE(cg_cuda_launch_config(A.ctx, k, &b));
    EXPECT_EQ(memcmp(&a, &b, sizeof a), 0) << k->name;
  }
}

TEST(CudaCodegen, IdenticalKernelsShareOneBody) {
  Arena A;
  kir_kernel *k[3] = {Softmax(&A.a, "first", 3, 100, DSC_F32),
                      Softmax(&A.a, "other", 3, 101, DSC_F32),
                      Softmax(&A.a, "second", 3, 100, DSC_F32)};
  char *src = cg_cuda_program_source(&A.a, k, 3);
  ASSERT_NE(src, nullptr) << diags(A.ctx);
  std::string s(src);
  EXPECT_EQ(Count(s, "__noinline__"), 1) << s;
  EXPECT_EQ(Count(s, "dsc_shared0("), 3) << s;  // the body, two calls
  EXPECT_EQ(Count(s, "__global__"), 3) << s;
  EXPECT_NE(s.find("__launch_bounds__(128) first(const float *a0, float *a1, int *status) {\n"
                   "  dsc_shared0(a0, a1, status);"),
            std::string::npos)
      << s;
  EXPECT_NE(s.find("__launch_bounds__(128) other(const float *a0, float *a1, int *status) {\n"
                   "  __shared__"),
            std::string::npos)
      << s;
}

TEST(CudaCodegen, InvalidKernelsAreDiagnosed) {
  Arena A;
  kir_kernel *k = Softmax(&A.a, "sm", 3, 10, DSC_F32);
  k->stages[2].dst.offset = 1;  // the last store falls off the output
  EXPECT_EQ(cg_cuda_source(&A.a, k, nullptr), nullptr);
  ASSERT_EQ(dsc_error_count(A.ctx), 1);
  EXPECT_NE(diags(A.ctx).find("cuda: invalid kernel"), std::string::npos) << diags(A.ctx);
  dsc_diag_clear(A.ctx);
  kir_kernel *bad = Softmax(&A.a, "not-an-identifier", 3, 10, DSC_F32);
  EXPECT_EQ(cg_cuda_source(&A.a, bad, nullptr), nullptr);
  EXPECT_NE(diags(A.ctx).find("not a C identifier"), std::string::npos) << diags(A.ctx);
  dsc_diag_clear(A.ctx);
  kir_kernel *twice[2] = {Softmax(&A.a, "same", 3, 10, DSC_F32),
                          Softmax(&A.a, "same", 3, 10, DSC_F32)};
  EXPECT_EQ(cg_cuda_program_source(&A.a, twice, 2), nullptr);
  EXPECT_NE(diags(A.ctx).find("two kernels named 'same'"), std::string::npos) << diags(A.ctx);
}

TEST(CudaCodegen, PrintsTheSoftmaxKernel) {
  Arena A;
  cg_cuda_launch l;
  std::string s = Source(A, Softmax(&A.a, "softmax", 4, 1000, DSC_F32), &l);
  ASSERT_FALSE(s.empty());
  std::printf("---- softmax [4, 1000] f32: grid %u, block %u ----\n%s\n", l.grid[0], l.block[0],
              s.c_str());
  EXPECT_NE(s.find("/* stage 1: s1 = sum over the inner dims */"), std::string::npos);
}

#ifdef DSC_HAVE_CUDA

bool IsElf(const void *p, size_t n) {
  const unsigned char *c = (const unsigned char *)p;
  return n > 4 && c[0] == 0x7f && c[1] == 'E' && c[2] == 'L' && c[3] == 'F';
}

TEST(CudaNvrtc, EveryTestKernelCompilesForSm90InOneProgram) {
  Arena A;
  Suite S(&A.a);
  char *src = cg_cuda_program_source(&A.a, S.k.data(), (int)S.k.size());
  ASSERT_NE(src, nullptr) << diags(A.ctx);
  char *ptx = nullptr;
  void *cubin = nullptr;
  size_t ptx_len = 0, cubin_len = 0;
  auto t0 = std::chrono::steady_clock::now();
  dsc_status st = cg_nvrtc_compile(A.ctx, src, "suite.cu", 90, &ptx, &ptx_len, &cubin, &cubin_len);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf(
      "NVRTC: %zu kernels, %zu bytes of CUDA C -> %zu bytes PTX, %zu bytes cubin in %.2f s\n",
      S.k.size(), strlen(src), ptx_len, cubin_len, secs);
  ASSERT_EQ(st, DSC_OK) << diags(A.ctx);
  EXPECT_EQ(dsc_diag_count(A.ctx), 0) << "NVRTC warnings:\n" << diags(A.ctx);
  ASSERT_NE(ptx, nullptr);
  ASSERT_NE(cubin, nullptr);
  EXPECT_EQ(ptx_len, strlen(ptx));
  EXPECT_TRUE(IsElf(cubin, cubin_len));
  std::string p(ptx);
  EXPECT_NE(p.find(".target sm_90"), std::string::npos);
  for (kir_kernel *k : S.k)
    EXPECT_NE(p.find(std::string(".visible .entry ") + k->name + "("), std::string::npos)
        << k->name;
  free(ptx);
  free(cubin);
}

TEST(CudaNvrtc, SingleKernelSourceCompiles) {
  Arena A;
  char *src = cg_cuda_source(&A.a, Softmax(&A.a, "softmax_one", 2, 100, DSC_F16), nullptr);
  ASSERT_NE(src, nullptr) << diags(A.ctx);
  char *ptx = nullptr;
  size_t ptx_len = 0;
  // PTX only (no cubin requested).
  ASSERT_EQ(cg_nvrtc_compile(A.ctx, src, "one.cu", 90, &ptx, &ptx_len, nullptr, nullptr), DSC_OK)
      << diags(A.ctx);
  ASSERT_NE(ptx, nullptr);
  EXPECT_NE(std::string(ptx).find(".visible .entry softmax_one("), std::string::npos);
  EXPECT_NE(std::string(ptx).find("cvt.rn.f16.f32"), std::string::npos);
  free(ptx);
}

TEST(CudaNvrtc, CompileErrorsCarryTheNvrtcLog) {
  Arena A;
  const char *broken =
      "extern \"C\" __global__ void broken(float *a, int *status) {\n"
      "  a[threadIdx.x] = undefined_value_xyz;\n"
      "}\n";
  char *ptx = (char *)0x1;
  void *cubin = (void *)0x1;
  size_t ptx_len = 7, cubin_len = 7;
  EXPECT_EQ(cg_nvrtc_compile(A.ctx, broken, "broken.cu", 90, &ptx, &ptx_len, &cubin, &cubin_len),
            DSC_ERR_INTERNAL);
  EXPECT_EQ(ptx, nullptr);
  EXPECT_EQ(cubin, nullptr);
  EXPECT_EQ(ptx_len, 0u);
  EXPECT_EQ(cubin_len, 0u);
  ASSERT_EQ(dsc_error_count(A.ctx), 1);
  std::string d = diags(A.ctx);
  EXPECT_NE(d.find("broken.cu"), std::string::npos) << d;
  EXPECT_NE(d.find("undefined_value_xyz"), std::string::npos) << d;  // from the NVRTC log
  EXPECT_NE(d.find("sm_90"), std::string::npos) << d;
}

TEST(CudaNvrtc, UnsupportedArchitectureIsAUserError) {
  Arena A;
  char *ptx = nullptr;
  EXPECT_EQ(cg_nvrtc_compile(A.ctx, "extern \"C\" __global__ void k() {}", "k.cu", 12, &ptx,
                             nullptr, nullptr, nullptr),
            DSC_ERR_USER);
  EXPECT_EQ(ptx, nullptr);
  EXPECT_NE(diags(A.ctx).find("cannot compile for sm_12 (supported: "), std::string::npos)
      << diags(A.ctx);
}

#else

TEST(CudaNvrtc, WithoutTheToolkitCompilingIsAnError) {
  Arena A;
  char *ptx = (char *)0x1;
  EXPECT_EQ(cg_nvrtc_compile(A.ctx, "", "k.cu", 90, &ptx, nullptr, nullptr, nullptr), DSC_ERR_USER);
  EXPECT_EQ(ptx, nullptr);
  EXPECT_NE(diags(A.ctx).find("without the CUDA toolkit"), std::string::npos) << diags(A.ctx);
}

#endif

}  // namespace
