/* CPU code generation: kernel IR -> LLVM IR (LLVM 14 C API) -> O3 for the
 * host CPU -> object file -> ORC LLJIT.
 *
 * Shape of a compiled kernel (see codegen.h for the ABI):
 *   for each segment of [outer_begin, outer_end) lying in one row of the last
 *   outer dim: recover the outer multi-index once (div/mod by constants), then
 *   loop over that row (so an all-outer elementwise kernel still gets a plain,
 *   vectorisable loop), and run the stages for each outer index: nested loops
 *   over the inner dims (innermost = last domain dim), trip counts constant.
 *
 * Numerics. Everything is computed in the expression's type (f32 stays f32).
 * REDUCE folds use helper functions whose fadd / fcmp+select carry fast-math
 * flags (reassoc contract for sums; nnan nsz for max/min), so the loop
 * vectoriser may reassociate them: sums are accumulated in vector-lane
 * partial sums (typically 16 lanes x interleave) and added at the end, a
 * different rounding order than the sequential sum of kir_eval (the error
 * bound is the same order, usually smaller); max/min reductions assume no NaN
 * input. Nothing else gets fast-math flags. The LLVM 14 C API cannot set
 * instruction flags, so these helpers (and exp/tanh/bf16 below) are written
 * in textual IR, parsed into each module and inlined (alwaysinline).
 * f32 exp is inline (Cephes polynomial, ~1 ulp, denormal results kept) and
 * f32 tanh is Eigen's rational approximation (max rel. error 3.5e-7 over
 * [-20, 20], checked against double tanh): both vectorise, unlike libm calls.
 * f64 uses libm (llvm.exp.f64, tanh), resolved from the process. */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include "codegen/codegen.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef DSC_HAVE_LLVM

#include <math.h>
#include <llvm-c/Analysis.h>
#include <llvm-c/BitWriter.h>
#include <llvm-c/Core.h>
#include <llvm-c/Error.h>
#include <llvm-c/IRReader.h>
#include <llvm-c/LLJIT.h>
#include <llvm-c/Orc.h>
#include <llvm-c/Target.h>
#include <llvm-c/TargetMachine.h>
#include <llvm-c/Transforms/PassBuilder.h>
#include <llvm/Config/llvm-config.h>
#include <pthread.h>
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

/* Bump when the generated code changes (meaning or speed): invalidates disk
 * caches. */
#define CG_LLVM_CACHE_VERSION 7u
#define CG_CACHE_MAGIC "DSCLLVMO"

/* ---- helpers in textual IR (see the file comment) ---- */
static const char cg_helpers_ir[] =
    "declare float @llvm.rint.f32(float)\n"
    "define internal float @dsc.radd.f32(float %a, float %b) #0 {\n"
    "  %r = fadd reassoc contract float %a, %b\n"
    "  ret float %r\n}\n"
    "define internal double @dsc.radd.f64(double %a, double %b) #0 {\n"
    "  %r = fadd reassoc contract double %a, %b\n"
    "  ret double %r\n}\n"
    "define internal float @dsc.rmax.f32(float %a, float %b) #0 {\n"
    "  %c = fcmp nnan nsz ogt float %a, %b\n"
    "  %r = select nnan nsz i1 %c, float %a, float %b\n"
    "  ret float %r\n}\n"
    "define internal float @dsc.rmin.f32(float %a, float %b) #0 {\n"
    "  %c = fcmp nnan nsz olt float %a, %b\n"
    "  %r = select nnan nsz i1 %c, float %a, float %b\n"
    "  ret float %r\n}\n"
    "define internal double @dsc.rmax.f64(double %a, double %b) #0 {\n"
    "  %c = fcmp nnan nsz ogt double %a, %b\n"
    "  %r = select nnan nsz i1 %c, double %a, double %b\n"
    "  ret double %r\n}\n"
    "define internal double @dsc.rmin.f64(double %a, double %b) #0 {\n"
    "  %c = fcmp nnan nsz olt double %a, %b\n"
    "  %r = select nnan nsz i1 %c, double %a, double %b\n"
    "  ret double %r\n}\n"
    /* exp(x), f32: x = n ln2 + r, |r| <= ln2/2 (Cephes expf); 2^n applied
     * in two halves so that results down to the denormals are right. The
     * polynomials here and in tanh carry `contract`: fused multiply-adds
     * where the target has FMA (fewer instructions, no less accurate). */
    "define internal float @dsc.exp.f32(float %x) #0 {\n"
    "  %xi = bitcast float %x to i32\n"
    "  %ax = and i32 %xi, 2147483647\n"
    "  %nan = icmp ugt i32 %ax, 2139095040\n"
    "  %ovf = fcmp ogt float %x, 0x40562E4300000000\n"
    "  %lo = fcmp olt float %x, -104.0\n"
    "  %x1 = select i1 %lo, float -104.0, float %x\n"
    "  %xc = select i1 %ovf, float 0.0, float %x1\n"
    "  %t = fmul float %xc, 0x3FF7154760000000\n"
    "  %n = call float @llvm.rint.f32(float %t)\n"
    "  %a = fmul float %n, 0x3FE6300000000000\n"
    "  %r1 = fsub float %xc, %a\n"
    "  %b = fmul float %n, 0xBF2BD01060000000\n"
    "  %r = fsub float %r1, %b\n"
    "  %z = fmul float %r, %r\n"
    "  %p0 = fmul contract float %r, 0x3F2A0D2CE0000000\n"
    "  %p1 = fadd contract float %p0, 0x3F56E879C0000000\n"
    "  %p1m = fmul contract float %p1, %r\n"
    "  %p2 = fadd contract float %p1m, 0x3F81112100000000\n"
    "  %p2m = fmul contract float %p2, %r\n"
    "  %p3 = fadd contract float %p2m, 0x3FA5553820000000\n"
    "  %p3m = fmul contract float %p3, %r\n"
    "  %p4 = fadd contract float %p3m, 0x3FC5555540000000\n"
    "  %p4m = fmul contract float %p4, %r\n"
    "  %p5 = fadd contract float %p4m, 0x3FE0000000000000\n"
    "  %yz = fmul contract float %p5, %z\n"
    "  %y1 = fadd contract float %yz, %r\n"
    "  %y = fadd float %y1, 1.0\n"
    "  %ni = fptosi float %n to i32\n"
    "  %n1 = ashr i32 %ni, 1\n"
    "  %n2 = sub i32 %ni, %n1\n"
    "  %e1 = add i32 %n1, 127\n"
    "  %e2 = add i32 %n2, 127\n"
    "  %s1i = shl i32 %e1, 23\n"
    "  %s2i = shl i32 %e2, 23\n"
    "  %s1 = bitcast i32 %s1i to float\n"
    "  %s2 = bitcast i32 %s2i to float\n"
    "  %m1 = fmul float %y, %s1\n"
    "  %m = fmul float %m1, %s2\n"
    "  %o = select i1 %ovf, float 0x7FF0000000000000, float %m\n"
    "  %res = select i1 %nan, float %x, float %o\n"
    "  ret float %res\n}\n"
    /* tanh(x), f32: Eigen's odd/even rational approximation on the clamped
     * argument; tanh(x) = x below 4e-4. */
    "define internal float @dsc.tanh.f32(float %x) #0 {\n"
    "  %hi = fcmp ogt float %x, 0x401F9F09E0000000\n"
    "  %lo = fcmp olt float %x, 0xC01F9F09E0000000\n"
    "  %x1 = select i1 %hi, float 0x401F9F09E0000000, float %x\n"
    "  %xc = select i1 %lo, float 0xC01F9F09E0000000, float %x1\n"
    "  %x2 = fmul float %xc, %xc\n"
    "  %a0 = fmul contract float %x2, 0xBCB3E4B800000000\n"
    "  %a1 = fadd contract float %a0, 0x3D4C266FC0000000\n"
    "  %a1m = fmul contract float %a1, %x2\n"
    "  %a2 = fadd contract float %a1m, 0xBDD7A6FFE0000000\n"
    "  %a2m = fmul contract float %a2, %x2\n"
    "  %a3 = fadd contract float %a2m, 0x3E6B800820000000\n"
    "  %a3m = fmul contract float %a3, %x2\n"
    "  %a4 = fadd contract float %a3m, 0x3EEF286940000000\n"
    "  %a4m = fmul contract float %a4, %x2\n"
    "  %a5 = fadd contract float %a4m, 0x3F44E1BDA0000000\n"
    "  %a5m = fmul contract float %a5, %x2\n"
    "  %a6 = fadd contract float %a5m, 0x3F740B3B80000000\n"
    "  %p = fmul float %a6, %xc\n"
    "  %b0 = fmul contract float %x2, 0x3EB41A7B00000000\n"
    "  %b1 = fadd contract float %b0, 0x3F1F12BAC0000000\n"
    "  %b1m = fmul contract float %b1, %x2\n"
    "  %b2 = fadd contract float %b1m, 0x3F629540A0000000\n"
    "  %b2m = fmul contract float %b2, %x2\n"
    "  %q = fadd contract float %b2m, 0x3F740B3BA0000000\n"
    "  %t = fdiv float %p, %q\n"
    "  %ax = call float @llvm.fabs.f32(float %x)\n"
    "  %tiny = fcmp olt float %ax, 0x3F3A36E2E0000000\n"
    "  %res = select i1 %tiny, float %x, float %t\n"
    "  ret float %res\n}\n"
    "declare float @llvm.fabs.f32(float)\n"
    /* f32 -> bf16, round to nearest even (integer ops); NaN stays quiet NaN. */
    "define internal i16 @dsc.f32_to_bf16(float %x) #0 {\n"
    "  %u = bitcast float %x to i32\n"
    "  %ax = and i32 %u, 2147483647\n"
    "  %nan = icmp ugt i32 %ax, 2139095040\n"
    "  %h = lshr i32 %u, 16\n"
    "  %lsb = and i32 %h, 1\n"
    "  %bias = add i32 %lsb, 32767\n"
    "  %s = add i32 %u, %bias\n"
    "  %r = lshr i32 %s, 16\n"
    "  %q = or i32 %h, 64\n"
    "  %v = select i1 %nan, i32 %q, i32 %r\n"
    "  %t = trunc i32 %v to i16\n"
    "  ret i16 %t\n}\n"
    "attributes #0 = { alwaysinline nounwind readnone willreturn }\n";

/* ---- one-time LLVM target initialisation ---- */
static pthread_once_t cg_llvm_once = PTHREAD_ONCE_INIT;
static int cg_llvm_init_failed;
static void cg_llvm_init(void) {
  cg_llvm_init_failed = LLVMInitializeNativeTarget() || LLVMInitializeNativeAsmPrinter() ||
                        LLVMInitializeNativeAsmParser();
}
static bool llvm_ready(dsc_context *ctx) {
  pthread_once(&cg_llvm_once, cg_llvm_init);
  if (cg_llvm_init_failed) {
    ir_error(ctx, ir_no_loc, "llvm: the native target could not be initialised");
    return false;
  }
  return true;
}

/* Consumes err and reports it as a diagnostic. */
static void report_llvm_error(dsc_context *ctx, const char *what, LLVMErrorRef err) {
  char *msg = LLVMGetErrorMessage(err);
  ir_error(ctx, ir_no_loc, "llvm: %s: %s", what, msg ? msg : "(no message)");
  LLVMDisposeErrorMessage(msg);
}

/* ======================= emitter: kernel IR -> LLVM IR ======================= */

typedef struct {
  const kir_expr *key;
  LLVMValueRef val;
} memo_entry;

typedef struct {
  dsc_context *ctx;
  LLVMContextRef c;
  LLVMModuleRef m;
  LLVMBuilderRef b;
  LLVMValueRef fn;
  const kir_kernel *k;
  LLVMTypeRef f32, f64, f16, i1, i8, i16, i32, i64, i8p;
  LLVMValueRef *argp; /* per argument: pointer to its storage element type */
  LLVMValueRef *slots; /* allocas */
  LLVMValueRef bad;    /* alloca i8: some gather was out of range (NULL: no gathers) */
  LLVMValueRef idx[KIR_MAX_RANK];
  LLVMValueRef notok; /* per evaluation point: OR of failed load gathers (NULL: none) */
  memo_entry *memo;
  int memo_cap, memo_n;
  bool failed;
  /* Column tiling (see tile_columns): while tile_slots is set, each domain
   * point runs for CG_TILE_W consecutive indices of the last outer dim,
   * tile_base + w, with slot s of column w at tile_slots[s][w]. */
  LLVMValueRef *tile_slots;
  LLVMValueRef tile_base;
} emitter;

/* Columns per tile: one 512-bit vector of f32. */
#define CG_TILE_W 16
#define KIR_MAX_SLOTS_TILED 16

static void emit_fail(emitter *e, const char *fmt, const char *detail) {
  if (!e->failed) ir_error(e->ctx, ir_no_loc, fmt, e->k->name, detail);
  e->failed = true;
}

static void memo_reset(emitter *e) {
  if (e->memo) memset(e->memo, 0, sizeof(memo_entry) * (size_t)e->memo_cap);
  e->memo_n = 0;
  e->notok = NULL;
}

static size_t memo_slot(const kir_expr *x, int cap) {
  uintptr_t h = (uintptr_t)x;
  h ^= h >> 17;
  h *= (uintptr_t)0x9E3779B97F4A7C15ull;
  return (size_t)(h >> 7) & (size_t)(cap - 1);
}

static LLVMValueRef memo_get(emitter *e, const kir_expr *x) {
  if (!e->memo) return NULL;
  for (size_t i = memo_slot(x, e->memo_cap);; i = (i + 1) & (size_t)(e->memo_cap - 1)) {
    if (!e->memo[i].key) return NULL;
    if (e->memo[i].key == x) return e->memo[i].val;
  }
}

static void memo_put(emitter *e, const kir_expr *x, LLVMValueRef v) {
  if (2 * (e->memo_n + 1) > e->memo_cap) {
    int ncap = e->memo_cap ? 2 * e->memo_cap : 64;
    memo_entry *n = ir_alloc(e->ctx, sizeof(memo_entry) * (size_t)ncap);
    if (!n) {
      emit_fail(e, "llvm: kernel %s: %s", "out of memory");
      return;
    }
    memset(n, 0, sizeof(memo_entry) * (size_t)ncap);
    for (int i = 0; i < e->memo_cap; i++) {
      if (!e->memo[i].key) continue;
      size_t j = memo_slot(e->memo[i].key, ncap);
      while (n[j].key) j = (j + 1) & (size_t)(ncap - 1);
      n[j] = e->memo[i];
    }
    if (e->memo) ir_free(e->ctx, e->memo, sizeof(memo_entry) * (size_t)e->memo_cap);
    e->memo = n;
    e->memo_cap = ncap;
  }
  size_t i = memo_slot(x, e->memo_cap);
  while (e->memo[i].key) i = (i + 1) & (size_t)(e->memo_cap - 1);
  e->memo[i].key = x;
  e->memo[i].val = v;
  e->memo_n++;
}

static LLVMTypeRef compute_type(emitter *e, dsc_dtype t) {
  switch (t) {
  case DSC_F32: return e->f32;
  case DSC_F64: return e->f64;
  case DSC_I32: return e->i32;
  case DSC_I64: return e->i64;
  case DSC_BOOL: return e->i1;
  default: return NULL;
  }
}

static LLVMTypeRef storage_type(emitter *e, dsc_dtype t) {
  switch (t) {
  case DSC_F32: return e->f32;
  case DSC_F64: return e->f64;
  case DSC_BF16: return e->i16;
  case DSC_F16: return e->f16;
  case DSC_I32: return e->i32;
  case DSC_I64: return e->i64;
  case DSC_BOOL: return e->i8;
  default: return NULL;
  }
}

static bool is_float(dsc_dtype t) { return t == DSC_F32 || t == DSC_F64; }
static bool is_int(dsc_dtype t) { return t == DSC_I32 || t == DSC_I64; }

static LLVMValueRef call_named(emitter *e, const char *name, LLVMTypeRef ret, LLVMValueRef *args,
                               unsigned n) {
  LLVMTypeRef params[3];
  for (unsigned i = 0; i < n; i++) params[i] = LLVMTypeOf(args[i]);
  LLVMTypeRef fty = LLVMFunctionType(ret, params, n, 0);
  LLVMValueRef f = LLVMGetNamedFunction(e->m, name);
  if (!f) f = LLVMAddFunction(e->m, name, fty);
  return LLVMBuildCall2(e->b, fty, f, args, n, "");
}

static LLVMValueRef call1(emitter *e, const char *name, LLVMValueRef x) {
  return call_named(e, name, LLVMTypeOf(x), &x, 1);
}

/* Converts between compute types (cast semantics: float->int truncates
 * toward zero, ->bool is != 0). */
static LLVMValueRef convert(emitter *e, LLVMValueRef v, dsc_dtype from, dsc_dtype to) {
  if (from == to) return v;
  LLVMTypeRef tt = compute_type(e, to);
  if (!tt || !compute_type(e, from)) {
    emit_fail(e, "llvm: kernel %s: %s", "unsupported conversion");
    return LLVMGetUndef(tt ? tt : e->i32);
  }
  if (to == DSC_BOOL) {
    if (is_float(from))
      return LLVMBuildFCmp(e->b, LLVMRealUNE, v, LLVMConstNull(LLVMTypeOf(v)), "");
    return LLVMBuildICmp(e->b, LLVMIntNE, v, LLVMConstNull(LLVMTypeOf(v)), "");
  }
  if (from == DSC_BOOL)
    return is_float(to) ? LLVMBuildUIToFP(e->b, v, tt, "") : LLVMBuildZExt(e->b, v, tt, "");
  if (is_float(from) && is_float(to))
    return from == DSC_F32 ? LLVMBuildFPExt(e->b, v, tt, "") : LLVMBuildFPTrunc(e->b, v, tt, "");
  if (is_float(from)) return LLVMBuildFPToSI(e->b, v, tt, "");
  if (is_float(to)) return LLVMBuildSIToFP(e->b, v, tt, "");
  return from == DSC_I32 ? LLVMBuildSExt(e->b, v, tt, "") : LLVMBuildTrunc(e->b, v, tt, "");
}

static LLVMValueRef ev(emitter *e, const kir_expr *x);

static LLVMValueRef const_i64(emitter *e, int64_t v) {
  return LLVMConstInt(e->i64, (unsigned long long)v, 1);
}

/* Element pointer of an access at the current point. A gather index out of
 * range is replaced by 0 (a valid address) and *inb is its range check
 * (NULL without a gather). */
static LLVMValueRef address(emitter *e, const kir_access *acc, LLVMValueRef *inb_out) {
  *inb_out = NULL;
  const kir_kernel *k = e->k;
  if (acc->arg < 0 || acc->arg >= k->n_args) {
    emit_fail(e, "llvm: kernel %s: %s", "argument index out of range");
    return NULL;
  }
  LLVMValueRef off = const_i64(e, acc->offset);
  for (int d = 0; d < k->rank; d++) {
    if (acc->stride[d] == 0) continue;
    LLVMValueRef t = LLVMBuildNSWMul(e->b, e->idx[d], const_i64(e, acc->stride[d]), "");
    off = LLVMBuildNSWAdd(e->b, off, t, "");
  }
  if (acc->gather) {
    LLVMValueRef g = ev(e, acc->gather);
    if (e->failed) return NULL;
    if (!is_int(acc->gather->type)) {
      emit_fail(e, "llvm: kernel %s: %s", "gather index is not an integer");
      return NULL;
    }
    g = convert(e, g, acc->gather->type, DSC_I64);
    LLVMValueRef inb = LLVMBuildICmp(e->b, LLVMIntULT, g, const_i64(e, acc->gather_bound), "");
    *inb_out = inb;
    g = LLVMBuildSelect(e->b, inb, g, const_i64(e, 0), "");
    LLVMValueRef t = LLVMBuildNSWMul(e->b, g, const_i64(e, acc->gather_stride), "");
    off = LLVMBuildNSWAdd(e->b, off, t, "");
  }
  LLVMTypeRef st = storage_type(e, k->args[acc->arg].dtype);
  return LLVMBuildInBoundsGEP2(e->b, st, e->argp[acc->arg], &off, 1, "");
}

static LLVMValueRef emit_load(emitter *e, const kir_expr *x) {
  LLVMValueRef inb;
  LLVMValueRef p = address(e, &x->access, &inb);
  if (!p) return NULL;
  dsc_dtype sd = e->k->args[x->access.arg].dtype;
  LLVMTypeRef st = storage_type(e, sd);
  LLVMValueRef v = LLVMBuildLoad2(e->b, st, p, "");
  dsc_dtype from = sd;
  switch (sd) {
  case DSC_BF16: {
    v = LLVMBuildZExt(e->b, v, e->i32, "");
    v = LLVMBuildShl(e->b, v, LLVMConstInt(e->i32, 16, 0), "");
    v = LLVMBuildBitCast(e->b, v, e->f32, "");
    from = DSC_F32;
    break;
  }
  case DSC_F16:
    v = LLVMBuildFPExt(e->b, v, e->f32, "");
    from = DSC_F32;
    break;
  case DSC_BOOL:
    v = LLVMBuildICmp(e->b, LLVMIntNE, v, LLVMConstInt(e->i8, 0, 0), "");
    break;
  default: break;
  }
  v = convert(e, v, from, x->type);
  /* A gather out of range loads 0 (and the kernel reports status 1). */
  if (inb) {
    v = LLVMBuildSelect(e->b, inb, v, LLVMConstNull(LLVMTypeOf(v)), "");
    LLVMValueRef bad = LLVMBuildNot(e->b, inb, "");
    e->notok = e->notok ? LLVMBuildOr(e->b, e->notok, bad, "") : bad;
  }
  return v;
}

static LLVMValueRef emit_store_value(emitter *e, LLVMValueRef v, dsc_dtype from, dsc_dtype sd) {
  switch (sd) {
  case DSC_BF16: {
    v = convert(e, v, from, DSC_F32);
    LLVMValueRef f = LLVMGetNamedFunction(e->m, "dsc.f32_to_bf16");
    LLVMTypeRef fty = LLVMFunctionType(e->i16, &e->f32, 1, 0);
    return LLVMBuildCall2(e->b, fty, f, &v, 1, "");
  }
  case DSC_F16:
    v = convert(e, v, from, DSC_F32);
    return LLVMBuildFPTrunc(e->b, v, e->f16, "");
  case DSC_BOOL:
    v = convert(e, v, from, DSC_BOOL);
    return LLVMBuildZExt(e->b, v, e->i8, "");
  default: return convert(e, v, from, sd);
  }
}

/* Float unary ops that are one call: the function for f32 and for f64
 * (dsc.* are the vectorisable helpers of cg_helpers_ir). */
static const struct {
  int op;
  const char *f32, *f64;
} llvm_unary[] = {
    {KIR_EXP, "dsc.exp.f32", "llvm.exp.f64"},     {KIR_LOG, "llvm.log.f32", "llvm.log.f64"},
    {KIR_SQRT, "llvm.sqrt.f32", "llvm.sqrt.f64"}, {KIR_TANH, "dsc.tanh.f32", "tanh"},
    {KIR_ABS, "llvm.fabs.f32", "llvm.fabs.f64"},  {KIR_SIN, "llvm.sin.f32", "llvm.sin.f64"},
    {KIR_COS, "llvm.cos.f32", "llvm.cos.f64"},
};

static LLVMValueRef emit_unary(emitter *e, int op, dsc_dtype t, LLVMValueRef a) {
  LLVMTypeRef ty = LLVMTypeOf(a);
  if (!is_float(t)) {
    if (op == KIR_NEG && is_int(t)) return LLVMBuildNeg(e->b, a, "");
    if (op == KIR_ABS && is_int(t)) {
      LLVMValueRef neg = LLVMBuildICmp(e->b, LLVMIntSLT, a, LLVMConstNull(ty), "");
      return LLVMBuildSelect(e->b, neg, LLVMBuildNeg(e->b, a, ""), a, "");
    }
    emit_fail(e, "llvm: kernel %s: %s", "unary op on a non-float type");
    return NULL;
  }
  bool f32 = t == DSC_F32;
  LLVMValueRef one = LLVMConstReal(ty, 1.0);
  for (size_t i = 0; i < sizeof llvm_unary / sizeof llvm_unary[0]; i++)
    if (llvm_unary[i].op == op) return call1(e, f32 ? llvm_unary[i].f32 : llvm_unary[i].f64, a);
  switch (op) {
  case KIR_NEG: return LLVMBuildFNeg(e->b, a, "");
  case KIR_RSQRT:
    return LLVMBuildFDiv(e->b, one, call1(e, f32 ? "llvm.sqrt.f32" : "llvm.sqrt.f64", a), "");
  case KIR_SIGMOID: {
    LLVMValueRef ex = call1(e, f32 ? "dsc.exp.f32" : "llvm.exp.f64", LLVMBuildFNeg(e->b, a, ""));
    return LLVMBuildFDiv(e->b, one, LLVMBuildFAdd(e->b, one, ex, ""), "");
  }
  default: emit_fail(e, "llvm: kernel %s: %s", "unknown unary op"); return NULL;
  }
}

/* ir_rand24 (ir/rng.c) in i64 operations, which wrap as its unsigned ones:
 * splitmix64's output function of the mixed seed a plus counter b times the
 * golden gamma, shifted to its top 24 bits. */
static LLVMValueRef mix64(emitter *e, LLVMValueRef z) {
  LLVMTypeRef i64 = LLVMTypeOf(z);
  static const unsigned long long mul[2] = {0xbf58476d1ce4e5b9ULL, 0x94d049bb133111ebULL};
  static const unsigned shift[3] = {30, 27, 31};
  for (int i = 0; i < 3; i++) {
    z = LLVMBuildXor(e->b, z, LLVMBuildLShr(e->b, z, LLVMConstInt(i64, shift[i], 0), ""), "");
    if (i < 2) z = LLVMBuildMul(e->b, z, LLVMConstInt(i64, mul[i], 0), "");
  }
  return z;
}
static LLVMValueRef rand24(emitter *e, LLVMValueRef seed, LLVMValueRef counter) {
  LLVMTypeRef i64 = LLVMTypeOf(seed);
  LLVMValueRef c = LLVMBuildMul(e->b, counter, LLVMConstInt(i64, 0x9e3779b97f4a7c15ULL, 0), "");
  LLVMValueRef z = mix64(e, LLVMBuildAdd(e->b, mix64(e, seed), c, ""));
  return LLVMBuildLShr(e->b, z, LLVMConstInt(i64, 64 - IR_RAND24_BITS, 0), "");
}

static LLVMValueRef emit_binary(emitter *e, int op, dsc_dtype t, LLVMValueRef a, LLVMValueRef b) {
  bool fl = is_float(t), in = is_int(t);
  switch (op) {
  case KIR_ADD:
  case KIR_SUB:
  case KIR_MUL:
  case KIR_DIV:
    if (fl) {
      if (op == KIR_ADD) return LLVMBuildFAdd(e->b, a, b, "");
      if (op == KIR_SUB) return LLVMBuildFSub(e->b, a, b, "");
      if (op == KIR_MUL) return LLVMBuildFMul(e->b, a, b, "");
      return LLVMBuildFDiv(e->b, a, b, "");
    }
    if (in) {
      if (op == KIR_ADD) return LLVMBuildAdd(e->b, a, b, "");
      if (op == KIR_SUB) return LLVMBuildSub(e->b, a, b, "");
      if (op == KIR_MUL) return LLVMBuildMul(e->b, a, b, "");
      return LLVMBuildSDiv(e->b, a, b, ""); /* truncates toward zero */
    }
    break;
  case KIR_MAX:
  case KIR_MIN:
    if (fl) {
      /* NaN-propagating like (a > b ? a : b) with a NaN a; matches C fmax
       * only for non-NaN inputs, which is all kir_eval promises too. */
      LLVMValueRef c =
          LLVMBuildFCmp(e->b, op == KIR_MAX ? LLVMRealOGT : LLVMRealOLT, a, b, "");
      return LLVMBuildSelect(e->b, c, a, b, "");
    }
    if (in) {
      LLVMValueRef c = LLVMBuildICmp(e->b, op == KIR_MAX ? LLVMIntSGT : LLVMIntSLT, a, b, "");
      return LLVMBuildSelect(e->b, c, a, b, "");
    }
    if (t == DSC_BOOL) return op == KIR_MAX ? LLVMBuildOr(e->b, a, b, "") : LLVMBuildAnd(e->b, a, b, "");
    break;
  case KIR_POW:
    if (fl) {
      LLVMValueRef args[2] = {a, b};
      return call_named(e, t == DSC_F32 ? "llvm.pow.f32" : "llvm.pow.f64", LLVMTypeOf(a), args,
                        2);
    }
    break;
  case KIR_LT:
  case KIR_GT:
  case KIR_EQ: {
    /* the operands' type decides; t is bool here */
    LLVMTypeRef ot = LLVMTypeOf(a);
    LLVMTypeKind kind = LLVMGetTypeKind(ot);
    if (kind == LLVMFloatTypeKind || kind == LLVMDoubleTypeKind) {
      LLVMRealPredicate p = op == KIR_LT ? LLVMRealOLT : op == KIR_GT ? LLVMRealOGT : LLVMRealOEQ;
      return LLVMBuildFCmp(e->b, p, a, b, "");
    }
    LLVMIntPredicate p = op == KIR_LT ? LLVMIntSLT : op == KIR_GT ? LLVMIntSGT : LLVMIntEQ;
    return LLVMBuildICmp(e->b, p, a, b, "");
  }
  case KIR_AND:
    if (t == DSC_BOOL) return LLVMBuildAnd(e->b, a, b, "");
    break;
  case KIR_OR:
    if (t == DSC_BOOL) return LLVMBuildOr(e->b, a, b, "");
    break;
  case KIR_RAND24:
    if (t == DSC_I64) return rand24(e, a, b);
    break;
  default: break;
  }
  emit_fail(e, "llvm: kernel %s: %s", "binary op not defined for its operand type");
  return NULL;
}

static LLVMValueRef ev(emitter *e, const kir_expr *x) {
  if (e->failed) return NULL;
  if (!x) {
    emit_fail(e, "llvm: kernel %s: %s", "missing expression operand");
    return NULL;
  }
  LLVMValueRef v = memo_get(e, x);
  if (v) return v;
  LLVMTypeRef ty = compute_type(e, x->type);
  if (!ty) {
    emit_fail(e, "llvm: kernel %s: %s", "expression type is not f32/f64/i32/i64/bool");
    return NULL;
  }
  switch (x->kind) {
  case KIR_CONST:
    if (is_float(x->type)) v = LLVMConstReal(ty, x->value);
    else if (x->type == DSC_BOOL) v = LLVMConstInt(ty, x->value != 0, 0);
    else v = LLVMConstInt(ty, (unsigned long long)(long long)x->value, 1);
    break;
  case KIR_LOAD: v = emit_load(e, x); break;
  case KIR_INDEX:
    if (x->var < 0 || x->var >= e->k->rank) {
      emit_fail(e, "llvm: kernel %s: %s", "index variable out of range");
      return NULL;
    }
    v = convert(e, e->idx[x->var], DSC_I64, x->type);
    break;
  case KIR_SCALAR:
    if (x->slot < 0 || x->slot >= e->k->n_slots) {
      emit_fail(e, "llvm: kernel %s: %s", "scalar slot out of range");
      return NULL;
    }
    v = LLVMBuildLoad2(e->b, compute_type(e, e->k->slot_types[x->slot]), e->slots[x->slot], "");
    v = convert(e, v, e->k->slot_types[x->slot], x->type);
    break;
  case KIR_UNARY: {
    LLVMValueRef a = ev(e, x->a);
    if (!a) return NULL;
    v = emit_unary(e, x->op, x->type, a);
    break;
  }
  case KIR_BINARY: {
    LLVMValueRef a = ev(e, x->a), b = ev(e, x->b);
    if (!a || !b) return NULL;
    if (LLVMTypeOf(a) != LLVMTypeOf(b)) {
      emit_fail(e, "llvm: kernel %s: %s", "binary operands of different types");
      return NULL;
    }
    v = emit_binary(e, x->op, x->a->type, a, b);
    if (v && x->op != KIR_LT && x->op != KIR_GT && x->op != KIR_EQ && x->a->type != x->type)
      v = convert(e, v, x->a->type, x->type);
    break;
  }
  case KIR_SELECT: {
    LLVMValueRef c = ev(e, x->a), a = ev(e, x->b), b = ev(e, x->c);
    if (!c || !a || !b) return NULL;
    if (x->a->type != DSC_BOOL || LLVMTypeOf(a) != LLVMTypeOf(b)) {
      emit_fail(e, "llvm: kernel %s: %s", "select operand types");
      return NULL;
    }
    v = convert(e, LLVMBuildSelect(e->b, c, a, b, ""), x->b->type, x->type);
    break;
  }
  case KIR_CAST: {
    LLVMValueRef a = ev(e, x->a);
    if (!a) return NULL;
    v = convert(e, a, x->a->type, x->type);
    break;
  }
  default: emit_fail(e, "llvm: kernel %s: %s", "unknown expression kind"); return NULL;
  }
  if (!v || e->failed) return NULL;
  memo_put(e, x, v);
  return v;
}

/* Records the current point's gather failures into the kernel's flag. */
static void note_bad(emitter *e) {
  if (!e->notok) return;
  LLVMValueRef notok = LLVMBuildZExt(e->b, e->notok, e->i8, "");
  LLVMValueRef cur = LLVMBuildLoad2(e->b, e->i8, e->bad, "");
  LLVMBuildStore(e->b, LLVMBuildOr(e->b, cur, notok, ""), e->bad);
}

typedef struct {
  const kir_stage *st;
} stage_ctx;

/* The body of one stage at one domain point (all indices set), reusing the
 * values of the point's earlier stages (stage_point starts afresh). */
static void stage_body(emitter *e, const kir_stage *st) {
  const kir_kernel *k = e->k;
  LLVMValueRef v = ev(e, st->expr);
  if (!v) return;
  dsc_dtype et = st->expr->type;
  if (st->kind == KIR_STAGE_STORE) {
    if (st->dst.arg < 0 || st->dst.arg >= k->n_args) {
      emit_fail(e, "llvm: kernel %s: %s", "store argument out of range");
      return;
    }
    LLVMValueRef inb;
    LLVMValueRef p = address(e, &st->dst, &inb);
    if (!p) return;
    LLVMValueRef sv = emit_store_value(e, v, et, k->args[st->dst.arg].dtype);
    if (inb) { /* a destination gather out of range: no store */
      LLVMValueRef bad = LLVMBuildNot(e->b, inb, "");
      e->notok = e->notok ? LLVMBuildOr(e->b, e->notok, bad, "") : bad;
    }
    note_bad(e);
    if (inb) {
      LLVMBasicBlockRef sb = LLVMAppendBasicBlockInContext(e->c, e->fn, "store");
      LLVMBasicBlockRef cb = LLVMAppendBasicBlockInContext(e->c, e->fn, "cont");
      LLVMBuildCondBr(e->b, inb, sb, cb);
      LLVMPositionBuilderAtEnd(e->b, sb);
      LLVMBuildStore(e->b, sv, p);
      LLVMBuildBr(e->b, cb);
      LLVMPositionBuilderAtEnd(e->b, cb);
    } else {
      LLVMBuildStore(e->b, sv, p);
    }
    return;
  }
  note_bad(e);
  if (st->slot < 0 || st->slot >= k->n_slots) {
    emit_fail(e, "llvm: kernel %s: %s", "stage slot out of range");
    return;
  }
  dsc_dtype slt = k->slot_types[st->slot];
  v = convert(e, v, et, slt);
  LLVMValueRef slot = e->slots[st->slot];
  if (st->kind == KIR_STAGE_LET) {
    LLVMBuildStore(e->b, v, slot);
    return;
  }
  LLVMTypeRef ty = compute_type(e, slt);
  LLVMValueRef acc = LLVMBuildLoad2(e->b, ty, slot, ""), r = NULL;
  if (is_float(slt)) {
    const char *name = NULL;
    bool f32 = slt == DSC_F32;
    switch (st->reduce) {
    case KIR_REDUCE_SUM: name = f32 ? "dsc.radd.f32" : "dsc.radd.f64"; break;
    case KIR_REDUCE_MAX: name = f32 ? "dsc.rmax.f32" : "dsc.rmax.f64"; break;
    case KIR_REDUCE_MIN: name = f32 ? "dsc.rmin.f32" : "dsc.rmin.f64"; break;
    }
    if (!name) {
      emit_fail(e, "llvm: kernel %s: %s", "unknown reduction");
      return;
    }
    /* new value first: for max/min the select keeps acc unless v wins */
    LLVMValueRef args[2] = {v, acc};
    if (st->reduce == KIR_REDUCE_SUM) {
      args[0] = acc;
      args[1] = v;
    }
    r = call_named(e, name, ty, args, 2);
  } else if (is_int(slt)) {
    if (st->reduce == KIR_REDUCE_SUM) {
      r = LLVMBuildAdd(e->b, acc, v, "");
    } else {
      LLVMValueRef c = LLVMBuildICmp(e->b, st->reduce == KIR_REDUCE_MAX ? LLVMIntSGT : LLVMIntSLT,
                                     v, acc, "");
      r = LLVMBuildSelect(e->b, c, v, acc, "");
    }
  } else { /* bool: sum/max = or, min = and */
    r = st->reduce == KIR_REDUCE_MIN ? LLVMBuildAnd(e->b, acc, v, "")
                                     : LLVMBuildOr(e->b, acc, v, "");
  }
  LLVMBuildStore(e->b, r, slot);
}

static void stage_point(emitter *e, const kir_stage *st) {
  memo_reset(e);
  stage_body(e, st);
}

/* Emits loops over domain dims [d, rank) around stage_point of the n_st
 * stages from st (one loop nest for all: see store_run). Trip counts are
 * constants > 0 (the caller skips empty loop nests). */
static void tile_point(emitter *e, const kir_stage *st);

static void inner_loops(emitter *e, int d, const kir_stage *st, int n_st) {
  const kir_kernel *k = e->k;
  if (e->failed) return;
  if (d == k->rank) {
    if (e->tile_slots) {
      for (int s = 0; s < n_st; s++) tile_point(e, &st[s]);
      return;
    }
    memo_reset(e);
    for (int s = 0; s < n_st && !e->failed; s++) stage_body(e, &st[s]);
    return;
  }
  if (k->dims[d] == 1) {
    e->idx[d] = const_i64(e, 0);
    inner_loops(e, d + 1, st, n_st);
    return;
  }
  LLVMBasicBlockRef pre = LLVMGetInsertBlock(e->b);
  LLVMBasicBlockRef body = LLVMAppendBasicBlockInContext(e->c, e->fn, "inner");
  LLVMBasicBlockRef exit = LLVMAppendBasicBlockInContext(e->c, e->fn, "inner.end");
  LLVMBuildBr(e->b, body);
  LLVMPositionBuilderAtEnd(e->b, body);
  LLVMValueRef i = LLVMBuildPhi(e->b, e->i64, "i");
  e->idx[d] = i;
  inner_loops(e, d + 1, st, n_st);
  if (e->failed) return;
  LLVMValueRef next = LLVMBuildNUWAdd(e->b, i, const_i64(e, 1), "");
  LLVMValueRef done = LLVMBuildICmp(e->b, LLVMIntEQ, next, const_i64(e, k->dims[d]), "");
  LLVMBasicBlockRef latch = LLVMGetInsertBlock(e->b);
  LLVMBuildCondBr(e->b, done, exit, body);
  LLVMValueRef in_v[2] = {const_i64(e, 0), next};
  LLVMBasicBlockRef in_b[2] = {pre, latch};
  LLVMAddIncoming(i, in_v, in_b, 2);
  LLVMPositionBuilderAtEnd(e->b, exit);
}

static LLVMValueRef reduce_init(emitter *e, dsc_dtype t, kir_reduce_op op) {
  LLVMTypeRef ty = compute_type(e, t);
  if (op == KIR_REDUCE_SUM) return LLVMConstNull(ty);
  bool mx = op == KIR_REDUCE_MAX;
  if (is_float(t)) return LLVMConstReal(ty, mx ? -INFINITY : INFINITY);
  if (t == DSC_I32) return LLVMConstInt(ty, (unsigned long long)(mx ? INT32_MIN : INT32_MAX), 1);
  if (t == DSC_I64) return LLVMConstInt(ty, (unsigned long long)(mx ? INT64_MIN : INT64_MAX), 1);
  return LLVMConstInt(ty, mx ? 0 : 1, 0);
}

/* Does expression x load an argument marked in `written`? */
static bool expr_reads_written(const kir_expr *x, const bool *written, int depth) {
  if (!x) return false;
  if (depth > 10000) return true; /* too deep to tell: assume it does */
  if (x->kind == KIR_LOAD &&
      (written[x->access.arg] || expr_reads_written(x->access.gather, written, depth + 1)))
    return true;
  return expr_reads_written(x->a, written, depth + 1) ||
         expr_reads_written(x->b, written, depth + 1) ||
         expr_reads_written(x->c, written, depth + 1);
}

/* How many STORE stages over the inner dims, from stage s on, run in one
 * loop nest: the values they share (an optimizer update stored as the f32
 * master, its bf16 rounding as the param, and the new moments) are then
 * computed once per point instead of once per stage's loop, as separate
 * loops would (the bf16 AdamW update of GPT-2's embedding cost 33 ms that
 * way against 17 ms in f32). Same results: a stage that reads an argument
 * an earlier stage of the run wrote ends the run (none does after the
 * in-place ordering, whose readers come first and read the element they
 * overwrite), and within a point the stages keep their order. */
static int store_run(emitter *e, int s) {
  const kir_kernel *k = e->k;
  bool *written = calloc((size_t)(k->n_args > 0 ? k->n_args : 1), sizeof(bool));
  if (!written) return 1; /* a loop per stage, as before */
  int n = 0;
  for (int t = s; t < k->n_stages; t++, n++) {
    const kir_stage *st = &k->stages[t];
    if (st->kind != KIR_STAGE_STORE || !st->over_inner || !st->expr) break;
    if (st->dst.arg < 0 || st->dst.arg >= k->n_args) break;
    if (n > 0 && (expr_reads_written(st->expr, written, 0) ||
                  expr_reads_written(st->dst.gather, written, 0)))
      break;
    written[st->dst.arg] = true;
  }
  free(written);
  return n > 0 ? n : 1;
}

/* All stages for the current outer index. */
static void outer_point(emitter *e) {
  const kir_kernel *k = e->k;
  bool inner_empty = false;
  for (int d = k->n_outer; d < k->rank; d++) inner_empty |= k->dims[d] == 0;
  for (int s = 0; s < k->n_stages && !e->failed; s++) {
    const kir_stage *st = &k->stages[s];
    if (!st->expr) {
      emit_fail(e, "llvm: kernel %s: %s", "stage without expression");
      return;
    }
    switch (st->kind) {
    case KIR_STAGE_REDUCE: {
      if (st->slot < 0 || st->slot >= k->n_slots) {
        emit_fail(e, "llvm: kernel %s: %s", "stage slot out of range");
        return;
      }
      dsc_dtype t = k->slot_types[st->slot];
      if (!compute_type(e, t)) {
        emit_fail(e, "llvm: kernel %s: %s", "slot type");
        return;
      }
      LLVMBuildStore(e->b, reduce_init(e, t, st->reduce), e->slots[st->slot]);
      if (!inner_empty) inner_loops(e, k->n_outer, st, 1);
      break;
    }
    case KIR_STAGE_LET:
      for (int d = k->n_outer; d < k->rank; d++) e->idx[d] = const_i64(e, 0);
      stage_point(e, st);
      break;
    case KIR_STAGE_STORE:
      if (st->over_inner) {
        int run = store_run(e, s);
        if (!inner_empty) inner_loops(e, k->n_outer, st, run);
        s += run - 1;
      } else {
        for (int d = k->n_outer; d < k->rank; d++) e->idx[d] = const_i64(e, 0);
        stage_point(e, st);
      }
      break;
    default: emit_fail(e, "llvm: kernel %s: %s", "unknown stage kind"); return;
    }
  }
}

/* Stage st at the current inner point for the tile's CG_TILE_W columns: a
 * loop of constant trip count whose body is the plain stage with column w's
 * index and slots, which the loop vectoriser turns into vector code (the
 * loads are consecutive across w). */
static void tile_point(emitter *e, const kir_stage *st) {
  const kir_kernel *k = e->k;
  int L = k->n_outer - 1;
  LLVMValueRef *plain = e->slots;
  LLVMValueRef cols[KIR_MAX_SLOTS_TILED];
  LLVMBasicBlockRef pre = LLVMGetInsertBlock(e->b);
  LLVMBasicBlockRef body = LLVMAppendBasicBlockInContext(e->c, e->fn, "col");
  LLVMBasicBlockRef exit = LLVMAppendBasicBlockInContext(e->c, e->fn, "col.end");
  LLVMBuildBr(e->b, body);
  LLVMPositionBuilderAtEnd(e->b, body);
  LLVMValueRef w = LLVMBuildPhi(e->b, e->i64, "w");
  e->idx[L] = LLVMBuildNSWAdd(e->b, e->tile_base, w, "");
  LLVMValueRef zero = const_i64(e, 0);
  for (int s = 0; s < k->n_slots; s++) {
    LLVMValueRef ix[2] = {zero, w};
    LLVMTypeRef at = LLVMArrayType(compute_type(e, k->slot_types[s]), CG_TILE_W);
    cols[s] = LLVMBuildInBoundsGEP2(e->b, at, e->tile_slots[s], ix, 2, "");
  }
  e->slots = cols;
  stage_point(e, st);
  e->slots = plain;
  if (e->failed) return;
  LLVMValueRef next = LLVMBuildNUWAdd(e->b, w, const_i64(e, 1), "");
  LLVMValueRef done = LLVMBuildICmp(e->b, LLVMIntEQ, next, const_i64(e, CG_TILE_W), "");
  LLVMBasicBlockRef latch = LLVMGetInsertBlock(e->b);
  LLVMBuildCondBr(e->b, done, exit, body);
  LLVMValueRef in_v[2] = {zero, next};
  LLVMBasicBlockRef in_b[2] = {pre, latch};
  LLVMAddIncoming(w, in_v, in_b, 2);
  LLVMPositionBuilderAtEnd(e->b, exit);
}

static bool access_tileable(const kir_kernel *k, const kir_access *a, bool *column, bool *row) {
  if (a->gather) return false;
  int64_t sl = a->stride[k->n_outer - 1];
  if (sl != 0 && sl != 1) return false;
  *column |= sl == 1;
  /* contiguous along the innermost non-trivial inner dim: the plain loop
   * order already vectorises it */
  for (int d = k->rank - 1; d >= k->n_outer; d--)
    if (k->dims[d] > 1) {
      *row |= a->stride[d] == 1;
      break;
    }
  return true;
}

static bool expr_tileable(const kir_kernel *k, const kir_expr *x, bool *column, bool *row,
                          int depth) {
  if (!x) return true;
  if (depth > 10000) return false;
  if (x->kind == KIR_LOAD && !access_tileable(k, &x->access, column, row)) return false;
  return expr_tileable(k, x->a, column, row, depth + 1) &&
         expr_tileable(k, x->b, column, row, depth + 1) &&
         expr_tileable(k, x->c, column, row, depth + 1);
}

/* Column tiling: a kernel whose inner loops walk memory with a large stride
 * while consecutive indices of the last outer dim are consecutive in memory
 * (the column sums of bias and layernorm gradients: out[j] = sum_i x[i, j])
 * cannot vectorise its inner loops. Running CG_TILE_W outer indices side by
 * side at each inner point makes the loads unit-stride across the tile.
 * Legal for every kernel (outer indices are independent: the thread pool
 * splits them anyway); chosen when every access is unit-stride or constant
 * along the last outer dim, some is unit-stride, none is unit-stride along
 * the inner loops, and there are no gathers. Results are identical to the
 * plain order: each outer index still folds its inner points in order. */
static bool tile_columns(const kir_kernel *k) {
  if (k->n_outer < 1 || k->rank == k->n_outer || k->dims[k->n_outer - 1] < CG_TILE_W ||
      k->n_slots > KIR_MAX_SLOTS_TILED)
    return false;
  for (int d = 0; d < k->rank; d++)
    if (k->dims[d] < 1) return false;
  bool column = false, row = false;
  for (int s = 0; s < k->n_stages; s++) {
    const kir_stage *st = &k->stages[s];
    if (!expr_tileable(k, st->expr, &column, &row, 0)) return false;
    if (st->kind == KIR_STAGE_STORE && !access_tileable(k, &st->dst, &column, &row)) return false;
  }
  return column && !row;
}

/* All stages for the tile of CG_TILE_W outer indices from e->tile_base. */
static void outer_tile(emitter *e) {
  const kir_kernel *k = e->k;
  for (int s = 0; s < k->n_stages && !e->failed; s++) {
    const kir_stage *st = &k->stages[s];
    if (st->kind == KIR_STAGE_REDUCE) {
      dsc_dtype t = k->slot_types[st->slot];
      LLVMTypeRef at = LLVMArrayType(compute_type(e, t), CG_TILE_W);
      for (int w = 0; w < CG_TILE_W; w++) {
        LLVMValueRef ix[2] = {const_i64(e, 0), const_i64(e, w)};
        LLVMValueRef p = LLVMBuildInBoundsGEP2(e->b, at, e->tile_slots[st->slot], ix, 2, "");
        LLVMBuildStore(e->b, reduce_init(e, t, st->reduce), p);
      }
      inner_loops(e, k->n_outer, st, 1);
    } else if (st->kind == KIR_STAGE_STORE && st->over_inner) {
      inner_loops(e, k->n_outer, st, 1);
    } else {
      for (int d = k->n_outer; d < k->rank; d++) e->idx[d] = const_i64(e, 0);
      tile_point(e, st);
    }
  }
}

static bool kernel_has_gather_expr(const kir_expr *x, int depth) {
  if (!x || depth > 10000) return false;
  if (x->kind == KIR_LOAD && x->access.gather) return true;
  return kernel_has_gather_expr(x->a, depth + 1) || kernel_has_gather_expr(x->b, depth + 1) ||
         kernel_has_gather_expr(x->c, depth + 1);
}

/* nounwind, and the host's CPU and features when given. */
static void function_attributes(emitter *e, LLVMValueRef fn, const char *cpu,
                                const char *features) {
  unsigned nounwind = LLVMGetEnumAttributeKindForName("nounwind", 8);
  LLVMAddAttributeAtIndex(fn, LLVMAttributeFunctionIndex,
                          LLVMCreateEnumAttribute(e->c, nounwind, 0));
  if (!cpu) return;
  static const char *keys[] = {"target-cpu", "target-features", "prefer-vector-width"};
  const char *vals[] = {cpu, features, "512"};
  for (int i = 0; i < 3; i++)
    LLVMAddAttributeAtIndex(fn, LLVMAttributeFunctionIndex,
                            LLVMCreateStringAttribute(e->c, keys[i], (unsigned)strlen(keys[i]),
                                                      vals[i], (unsigned)strlen(vals[i])));
}

/* Adds function `sym` for kernel k to e->m. */
static bool emit_kernel(emitter *e, const kir_kernel *k, const char *sym, const char *cpu,
                        const char *features) {
  e->k = k;
  e->failed = false;
  if (k->rank < 0 || k->rank > KIR_MAX_RANK || k->n_outer < 0 || k->n_outer > k->rank) {
    emit_fail(e, "llvm: kernel %s: %s", "bad rank");
    return false;
  }
  for (int i = 0; i < k->n_args; i++)
    if (!storage_type(e, k->args[i].dtype)) {
      emit_fail(e, "llvm: kernel %s: %s", "bad argument dtype");
      return false;
    }
  LLVMTypeRef i8pp = LLVMPointerType(e->i8p, 0);
  LLVMTypeRef params[4] = {i8pp, e->i64, e->i64, LLVMPointerType(e->i32, 0)};
  LLVMTypeRef fty = LLVMFunctionType(LLVMVoidTypeInContext(e->c), params, 4, 0);
  if (LLVMGetNamedFunction(e->m, sym)) {
    emit_fail(e, "llvm: kernel %s: %s", "duplicate kernel name in one module");
    return false;
  }
  LLVMValueRef abi = LLVMAddFunction(e->m, sym, fty);
  LLVMSetLinkage(abi, LLVMExternalLinkage);
  function_attributes(e, abi, cpu, features);
  LLVMValueRef p_args = LLVMGetParam(abi, 0), p_begin = LLVMGetParam(abi, 1),
               p_end = LLVMGetParam(abi, 2), p_status = LLVMGetParam(abi, 3);
  LLVMSetValueName2(p_args, "args", 4);
  LLVMSetValueName2(p_begin, "outer_begin", 11);
  LLVMSetValueName2(p_end, "outer_end", 9);
  LLVMSetValueName2(p_status, "status", 6);

  LLVMBasicBlockRef entry = LLVMAppendBasicBlockInContext(e->c, abi, "entry");
  LLVMPositionBuilderAtEnd(e->b, entry);
  size_t na = (size_t)(k->n_args > 0 ? k->n_args : 1), ns = (size_t)(k->n_slots > 0 ? k->n_slots : 1);
  e->argp = ir_alloc(e->ctx, sizeof(LLVMValueRef) * na);
  e->slots = ir_alloc(e->ctx, sizeof(LLVMValueRef) * ns);
  LLVMValueRef *body_args = ir_alloc(e->ctx, sizeof(LLVMValueRef) * (na + 3));
  if (!e->argp || !e->slots || !body_args) {
    emit_fail(e, "llvm: kernel %s: %s", "out of memory");
    goto done;
  }
  for (int i = 0; i < k->n_args; i++) {
    LLVMValueRef ix = LLVMConstInt(e->i64, (unsigned long long)i, 0);
    LLVMValueRef pp = LLVMBuildInBoundsGEP2(e->b, e->i8p, p_args, &ix, 1, "");
    body_args[i] = LLVMBuildLoad2(e->b, e->i8p, pp, "");
  }
  e->fn = abi;
  if (k->distinct_args) {
    /* The ABI entry loads the pointers and calls an always-inlined body
     * that takes them as noalias parameters: no two arguments overlap
     * (kir_kernel.distinct_args), and saying so lets the vectoriser skip
     * the runtime overlap checks it gives up on past a handful of pointers
     * (an optimizer update reads and writes six or more). */
    int nb = k->n_args + 3;
    LLVMTypeRef *bt = ir_alloc(e->ctx, sizeof(LLVMTypeRef) * (size_t)nb);
    char *bname = ir_alloc(e->ctx, strlen(sym) + 6);
    if (!bt || !bname) {
      if (bt) ir_free(e->ctx, bt, sizeof(LLVMTypeRef) * (size_t)nb);
      emit_fail(e, "llvm: kernel %s: %s", "out of memory");
      goto done;
    }
    for (int i = 0; i < k->n_args; i++) bt[i] = e->i8p;
    bt[k->n_args] = e->i64, bt[k->n_args + 1] = e->i64, bt[k->n_args + 2] = params[3];
    sprintf(bname, "%s.body", sym);
    LLVMValueRef body = LLVMAddFunction(
        e->m, bname, LLVMFunctionType(LLVMVoidTypeInContext(e->c), bt, (unsigned)nb, 0));
    ir_free(e->ctx, bt, sizeof(LLVMTypeRef) * (size_t)nb);
    ir_free(e->ctx, bname, strlen(sym) + 6);
    LLVMSetLinkage(body, LLVMInternalLinkage);
    function_attributes(e, body, cpu, features);
    unsigned inl = LLVMGetEnumAttributeKindForName("alwaysinline", 12);
    unsigned noalias = LLVMGetEnumAttributeKindForName("noalias", 7);
    LLVMAddAttributeAtIndex(body, LLVMAttributeFunctionIndex,
                            LLVMCreateEnumAttribute(e->c, inl, 0));
    for (int i = 0; i < k->n_args; i++)
      LLVMAddAttributeAtIndex(body, (unsigned)i + 1, LLVMCreateEnumAttribute(e->c, noalias, 0));
    body_args[k->n_args] = p_begin, body_args[k->n_args + 1] = p_end;
    body_args[k->n_args + 2] = p_status;
    LLVMBuildCall2(e->b, LLVMGlobalGetValueType(body), body, body_args, (unsigned)nb, "");
    LLVMBuildRetVoid(e->b);
    e->fn = body;
    for (int i = 0; i < k->n_args; i++) body_args[i] = LLVMGetParam(body, (unsigned)i);
    p_begin = LLVMGetParam(body, (unsigned)k->n_args);
    p_end = LLVMGetParam(body, (unsigned)k->n_args + 1);
    p_status = LLVMGetParam(body, (unsigned)k->n_args + 2);
    entry = LLVMAppendBasicBlockInContext(e->c, body, "entry");
    LLVMPositionBuilderAtEnd(e->b, entry);
  }
  for (int s = 0; s < k->n_slots; s++) {
    LLVMTypeRef t = compute_type(e, k->slot_types[s]);
    if (!t) {
      emit_fail(e, "llvm: kernel %s: %s", "slot type is not f32/f64/i32/i64/bool");
      goto done;
    }
    e->slots[s] = LLVMBuildAlloca(e->b, t, "slot");
  }
  LLVMValueRef tile_slots[KIR_MAX_SLOTS_TILED];
  bool tiled = tile_columns(k);
  for (int s = 0; tiled && s < k->n_slots; s++)
    tile_slots[s] =
        LLVMBuildAlloca(e->b, LLVMArrayType(compute_type(e, k->slot_types[s]), CG_TILE_W), "tile");
  bool gathers = false;
  for (int s = 0; s < k->n_stages; s++)
    gathers |= kernel_has_gather_expr(k->stages[s].expr, 0) ||
               (k->stages[s].kind == KIR_STAGE_STORE && k->stages[s].dst.gather);
  e->bad = NULL;
  if (gathers) {
    e->bad = LLVMBuildAlloca(e->b, e->i8, "bad");
    LLVMBuildStore(e->b, LLVMConstInt(e->i8, 0, 0), e->bad);
  }
  for (int i = 0; i < k->n_args; i++)
    e->argp[i] = LLVMBuildBitCast(e->b, body_args[i],
                                  LLVMPointerType(storage_type(e, k->args[i].dtype), 0), "arg");
  bool outer_empty = false;
  for (int d = 0; d < k->n_outer; d++) outer_empty |= k->dims[d] == 0;

  LLVMBasicBlockRef ret = LLVMAppendBasicBlockInContext(e->c, e->fn, "ret");
  if (!outer_empty) {
    LLVMBasicBlockRef head = LLVMAppendBasicBlockInContext(e->c, e->fn, "seg");
    LLVMValueRef any = LLVMBuildICmp(e->b, LLVMIntSLT, p_begin, p_end, "");
    LLVMBuildCondBr(e->b, any, head, ret);
    LLVMPositionBuilderAtEnd(e->b, head);
    LLVMValueRef o = LLVMBuildPhi(e->b, e->i64, "o");
    LLVMValueRef seg_len, idx0 = NULL;
    if (k->n_outer == 0) {
      seg_len = const_i64(e, 1);
    } else {
      /* the multi-index of o, once per segment */
      LLVMValueRef rem = o;
      int L = k->n_outer - 1;
      for (int d = L; d >= 0; d--) {
        LLVMValueRef dim = const_i64(e, k->dims[d]);
        if (d > 0) {
          e->idx[d] = LLVMBuildURem(e->b, rem, dim, "");
          rem = LLVMBuildUDiv(e->b, rem, dim, "");
        } else {
          e->idx[d] = rem;
        }
      }
      idx0 = e->idx[L];
      LLVMValueRef row_left = LLVMBuildNSWSub(e->b, const_i64(e, k->dims[L]), idx0, "");
      LLVMValueRef left = LLVMBuildNSWSub(e->b, p_end, o, "");
      LLVMValueRef lt = LLVMBuildICmp(e->b, LLVMIntSLT, row_left, left, "");
      seg_len = LLVMBuildSelect(e->b, lt, row_left, left, "seg_len");
    }
    LLVMBasicBlockRef seg_pre = LLVMGetInsertBlock(e->b);
    LLVMBasicBlockRef body = LLVMAppendBasicBlockInContext(e->c, e->fn, "row");
    LLVMBasicBlockRef latch = LLVMAppendBasicBlockInContext(e->c, e->fn, "seg.next");
    LLVMValueRef j_first = const_i64(e, 0);
    if (tiled) {
      /* whole tiles of the segment first, then the remaining columns one by
       * one in the plain loop below */
      LLVMBasicBlockRef check = LLVMAppendBasicBlockInContext(e->c, e->fn, "tiles");
      LLVMBasicBlockRef tile = LLVMAppendBasicBlockInContext(e->c, e->fn, "tile");
      LLVMBasicBlockRef rest = LLVMAppendBasicBlockInContext(e->c, e->fn, "tiles.end");
      LLVMBuildBr(e->b, check);
      LLVMPositionBuilderAtEnd(e->b, check);
      LLVMValueRef jt = LLVMBuildPhi(e->b, e->i64, "jt");
      LLVMValueRef left = LLVMBuildNSWSub(e->b, seg_len, jt, "");
      LLVMBuildCondBr(e->b, LLVMBuildICmp(e->b, LLVMIntSGE, left, const_i64(e, CG_TILE_W), ""),
                      tile, rest);
      LLVMPositionBuilderAtEnd(e->b, tile);
      e->tile_slots = tile_slots;
      e->tile_base = LLVMBuildNSWAdd(e->b, idx0, jt, "");
      outer_tile(e);
      e->tile_slots = NULL;
      if (e->failed) goto done;
      LLVMValueRef jt_next = LLVMBuildNUWAdd(e->b, jt, const_i64(e, CG_TILE_W), "");
      LLVMBasicBlockRef tile_end = LLVMGetInsertBlock(e->b);
      LLVMBuildBr(e->b, check);
      LLVMValueRef tv[2] = {const_i64(e, 0), jt_next};
      LLVMBasicBlockRef tb[2] = {seg_pre, tile_end};
      LLVMAddIncoming(jt, tv, tb, 2);
      LLVMPositionBuilderAtEnd(e->b, rest);
      LLVMBuildCondBr(e->b, LLVMBuildICmp(e->b, LLVMIntEQ, jt, seg_len, ""), latch, body);
      seg_pre = rest;
      j_first = jt;
    } else {
      LLVMBuildBr(e->b, body);
    }
    LLVMPositionBuilderAtEnd(e->b, body);
    LLVMValueRef j = LLVMBuildPhi(e->b, e->i64, "j");
    if (k->n_outer > 0) e->idx[k->n_outer - 1] = LLVMBuildNSWAdd(e->b, idx0, j, "");
    outer_point(e);
    if (e->failed) goto done;
    LLVMValueRef jn = LLVMBuildNUWAdd(e->b, j, const_i64(e, 1), "");
    LLVMValueRef jdone = LLVMBuildICmp(e->b, LLVMIntEQ, jn, seg_len, "");
    LLVMBasicBlockRef body_end = LLVMGetInsertBlock(e->b);
    LLVMBuildCondBr(e->b, jdone, latch, body);
    LLVMValueRef jv[2] = {j_first, jn};
    LLVMBasicBlockRef jb[2] = {seg_pre, body_end};
    LLVMAddIncoming(j, jv, jb, 2);
    LLVMPositionBuilderAtEnd(e->b, latch);
    LLVMValueRef on = LLVMBuildNSWAdd(e->b, o, seg_len, "");
    LLVMValueRef more = LLVMBuildICmp(e->b, LLVMIntSLT, on, p_end, "");
    LLVMBuildCondBr(e->b, more, head, ret);
    LLVMValueRef ov[2] = {p_begin, on};
    LLVMBasicBlockRef ob[2] = {entry, latch};
    LLVMAddIncoming(o, ov, ob, 2);
  } else {
    LLVMBuildBr(e->b, ret);
  }
  LLVMPositionBuilderAtEnd(e->b, ret);
  if (e->bad) {
    LLVMBasicBlockRef setb = LLVMAppendBasicBlockInContext(e->c, e->fn, "status");
    LLVMBasicBlockRef out = LLVMAppendBasicBlockInContext(e->c, e->fn, "out");
    LLVMValueRef b = LLVMBuildLoad2(e->b, e->i8, e->bad, "");
    LLVMBuildCondBr(e->b, LLVMBuildICmp(e->b, LLVMIntNE, b, LLVMConstInt(e->i8, 0, 0), ""), setb,
                    out);
    LLVMPositionBuilderAtEnd(e->b, setb);
    LLVMBuildStore(e->b, LLVMConstInt(e->i32, 1, 0), p_status);
    LLVMBuildBr(e->b, out);
    LLVMPositionBuilderAtEnd(e->b, out);
  }
  LLVMBuildRetVoid(e->b);
done:
  if (body_args) ir_free(e->ctx, body_args, sizeof(LLVMValueRef) * (na + 3));
  if (e->argp) ir_free(e->ctx, e->argp, sizeof(LLVMValueRef) * na);
  if (e->slots) ir_free(e->ctx, e->slots, sizeof(LLVMValueRef) * ns);
  e->argp = e->slots = NULL;
  return !e->failed;
}

/* Creates a context and a module holding the helpers. */
static bool module_new(dsc_context *ctx, LLVMContextRef *c, LLVMModuleRef *m) {
  *c = LLVMContextCreate();
  *m = NULL;
  LLVMMemoryBufferRef buf = LLVMCreateMemoryBufferWithMemoryRangeCopy(
      cg_helpers_ir, sizeof cg_helpers_ir - 1, "dsc_helpers");
  char *msg = NULL;
  if (LLVMParseIRInContext(*c, buf, m, &msg)) { /* takes buf */
    ir_error(ctx, ir_no_loc, "llvm: internal helper IR does not parse: %s", msg ? msg : "");
    LLVMDisposeMessage(msg);
    LLVMContextDispose(*c);
    *c = NULL;
    *m = NULL;
    return false;
  }
  return true;
}

static void emitter_init(emitter *e, dsc_context *ctx, LLVMContextRef c, LLVMModuleRef m) {
  memset(e, 0, sizeof *e);
  e->ctx = ctx;
  e->c = c;
  e->m = m;
  e->b = LLVMCreateBuilderInContext(c);
  e->f32 = LLVMFloatTypeInContext(c);
  e->f64 = LLVMDoubleTypeInContext(c);
  e->f16 = LLVMHalfTypeInContext(c);
  e->i1 = LLVMInt1TypeInContext(c);
  e->i8 = LLVMInt8TypeInContext(c);
  e->i16 = LLVMInt16TypeInContext(c);
  e->i32 = LLVMInt32TypeInContext(c);
  e->i64 = LLVMInt64TypeInContext(c);
  e->i8p = LLVMPointerType(e->i8, 0);
}

static void emitter_dispose(emitter *e) {
  if (e->memo) ir_free(e->ctx, e->memo, sizeof(memo_entry) * (size_t)e->memo_cap);
  e->memo = NULL;
  if (e->b) LLVMDisposeBuilder(e->b);
  e->b = NULL;
}

/* Validates, emits and verifies one module with kernels[0..n) named syms[i]
 * (k->name when syms is NULL). On failure everything is disposed. */
static bool build_module(dsc_context *ctx, kir_kernel *const *kernels, int n, char **syms,
                         const char *cpu, const char *features, LLVMContextRef *c,
                         LLVMModuleRef *m) {
  for (int i = 0; i < n; i++) {
    char err[512];
    if (!kernels[i] || !kernels[i]->name) {
      ir_error(ctx, ir_no_loc, "llvm: kernel %d is missing or unnamed", i);
      return false;
    }
    if (!kir_validate(kernels[i], err, sizeof err)) {
      ir_error(ctx, ir_no_loc, "llvm: kernel %s is invalid: %s", kernels[i]->name, err);
      return false;
    }
  }
  if (!module_new(ctx, c, m)) return false;
  emitter e;
  emitter_init(&e, ctx, *c, *m);
  bool ok = true;
  for (int i = 0; i < n && ok; i++)
    ok = emit_kernel(&e, kernels[i], syms ? syms[i] : kernels[i]->name, cpu, features);
  emitter_dispose(&e);
  if (ok) {
    char *msg = NULL;
    if (LLVMVerifyModule(*m, LLVMReturnStatusAction, &msg)) {
      ir_error(ctx, ir_no_loc, "llvm: generated IR does not verify: %s", msg ? msg : "");
      ok = false;
    }
    LLVMDisposeMessage(msg);
  }
  if (!ok) {
    LLVMDisposeModule(*m);
    LLVMContextDispose(*c);
    *m = NULL;
    *c = NULL;
  }
  return ok;
}

/* ======================= target machine, optimisation ======================= */

typedef struct {
  LLVMTargetMachineRef tm;
  char *triple, *cpu, *features; /* LLVM messages */
} host_target;

static void host_target_dispose(host_target *h) {
  if (h->tm) LLVMDisposeTargetMachine(h->tm);
  LLVMDisposeMessage(h->triple);
  LLVMDisposeMessage(h->cpu);
  LLVMDisposeMessage(h->features);
  memset(h, 0, sizeof *h);
}

/* Whether LLVM feature name f (no sign) needs more than isa. */
static bool feature_above(const char *f, size_t n, cg_cpu_isa isa) {
  static const char *const prefix512[] = {"avx512", "amx", "avx10"};
  static const char *const vex[] = {"avxvnni", "avxvnniint8", "avxvnniint16", "avxifma",
                                    "avxneconvert"};
  static const char *const avx[] = {"fma", "f16c", "fma4", "xop", "vaes", "vpclmulqdq"};
  for (size_t i = 0; i < sizeof prefix512 / sizeof *prefix512; i++)
    if (isa < CG_ISA_AVX512 && strncmp(f, prefix512[i], strlen(prefix512[i])) == 0) return true;
  for (size_t i = 0; i < sizeof vex / sizeof *vex; i++)
    if (isa < CG_ISA_AVX512 && n == strlen(vex[i]) && strncmp(f, vex[i], n) == 0) return true;
  if (isa >= CG_ISA_AVX2) return false;
  if (strncmp(f, "avx", 3) == 0) return true;
  for (size_t i = 0; i < sizeof avx / sizeof *avx; i++)
    if (n == strlen(avx[i]) && strncmp(f, avx[i], n) == 0) return true;
  return false;
}

/* The host's features (an LLVM message, taken) with every "+f" that needs
 * more than isa turned into "-f": $DSC_CPU_ISA's kernels for a lesser CPU. */
static char *isa_features(char *host, cg_cpu_isa isa) {
  if (!host || isa == cg_cpu_isa_host()) return host;
  char *out = LLVMCreateMessage(host);
  for (char *f = out; *f;) {
    size_t n = strcspn(f, ",");
    if (f[0] == '+' && feature_above(f + 1, n - 1, isa)) f[0] = '-';
    f += n;
    if (*f == ',') f++;
  }
  LLVMDisposeMessage(host);
  return out;
}

static bool host_target_init(dsc_context *ctx, host_target *h) {
  memset(h, 0, sizeof *h);
  if (!llvm_ready(ctx)) return false;
  h->triple = LLVMGetDefaultTargetTriple();
  h->cpu = LLVMGetHostCPUName();
  h->features = isa_features(LLVMGetHostCPUFeatures(), cg_cpu_isa_get());
  LLVMTargetRef target = NULL;
  char *msg = NULL;
  if (LLVMGetTargetFromTriple(h->triple, &target, &msg)) {
    ir_error(ctx, ir_no_loc, "llvm: no target for %s: %s", h->triple, msg ? msg : "");
    LLVMDisposeMessage(msg);
    host_target_dispose(h);
    return false;
  }
  /* The large code model: every reference from a kernel's code to its
   * constants and to libm is a 64-bit absolute address. The JIT's memory
   * manager maps a kernel's .text and .rodata separately, and with GBs of
   * arenas mapped between them they can end up more than 2 GiB apart: the
   * small model's 32-bit PC-relative references were then silently
   * truncated (RuntimeDyld checks them only in assert builds), and GPT-2
   * trained to other losses, NaNs or a SIGSEGV from run to run. */
  h->tm = LLVMCreateTargetMachine(target, h->triple, h->cpu, h->features,
                                  LLVMCodeGenLevelAggressive, LLVMRelocStatic, LLVMCodeModelLarge);
  if (!h->tm) {
    ir_error(ctx, ir_no_loc, "llvm: cannot create a target machine for %s", h->triple);
    host_target_dispose(h);
    return false;
  }
  return true;
}

static bool optimise(dsc_context *ctx, host_target *h, LLVMModuleRef m) {
  LLVMSetTarget(m, h->triple);
  LLVMTargetDataRef td = LLVMCreateTargetDataLayout(h->tm);
  char *dl = LLVMCopyStringRepOfTargetData(td);
  LLVMSetDataLayout(m, dl);
  LLVMDisposeMessage(dl);
  LLVMDisposeTargetData(td);
  LLVMPassBuilderOptionsRef opts = LLVMCreatePassBuilderOptions();
  LLVMPassBuilderOptionsSetLoopVectorization(opts, 1);
  LLVMPassBuilderOptionsSetSLPVectorization(opts, 1);
  LLVMPassBuilderOptionsSetLoopInterleaving(opts, 1);
  LLVMPassBuilderOptionsSetLoopUnrolling(opts, 1);
  LLVMErrorRef err = LLVMRunPasses(m, "default<O3>", h->tm, opts);
  LLVMDisposePassBuilderOptions(opts);
  if (err) {
    report_llvm_error(ctx, "optimisation", err);
    return false;
  }
  return true;
}

/* ======================= the JIT ======================= */

typedef struct {
  char *sym; /* ir_alloc'd */
  cg_cpu_kernel_fn fn;
} jit_sym;

struct cg_llvm_jit {
  dsc_context *ctx;
  char *cache_dir; /* ir_alloc'd, or NULL */
  host_target host;
  LLVMOrcLLJITRef jit;
  LLVMOrcJITDylibRef jd;
  jit_sym *syms;
  int n_syms, cap_syms;
  int compiled, cache_hits;
  size_t code_bytes; /* object bytes linked into the JIT (its code and data) */
  int compile_threads; /* 0: the host's */
};

static void es_error_reporter(void *ud, LLVMErrorRef err) {
  report_llvm_error((dsc_context *)ud, "JIT session", err);
}

static char *ctx_strdup(dsc_context *ctx, const char *s) {
  size_t n = strlen(s) + 1;
  char *p = ir_alloc(ctx, n);
  if (p) memcpy(p, s, n);
  return p;
}

static void ctx_strfree(dsc_context *ctx, char *s) {
  if (s) ir_free(ctx, s, strlen(s) + 1);
}

cg_llvm_jit *cg_llvm_jit_new(dsc_context *ctx, const char *cache_dir) {
  cg_llvm_jit *j = ir_alloc(ctx, sizeof *j);
  if (!j) {
    ir_error(ctx, ir_no_loc, "llvm: out of memory");
    return NULL;
  }
  memset(j, 0, sizeof *j);
  j->ctx = ctx;
  if (!host_target_init(ctx, &j->host)) {
    ir_free(ctx, j, sizeof *j);
    return NULL;
  }
  if (cache_dir) {
    j->cache_dir = ctx_strdup(ctx, cache_dir);
    if (!j->cache_dir) {
      ir_error(ctx, ir_no_loc, "llvm: out of memory");
      cg_llvm_jit_free(j);
      return NULL;
    }
  }
  LLVMErrorRef err = LLVMOrcCreateLLJIT(&j->jit, NULL); /* host defaults */
  if (err) {
    report_llvm_error(ctx, "cannot create the JIT", err);
    j->jit = NULL;
    cg_llvm_jit_free(j);
    return NULL;
  }
  LLVMOrcExecutionSessionSetErrorReporter(LLVMOrcLLJITGetExecutionSession(j->jit),
                                          es_error_reporter, ctx);
  j->jd = LLVMOrcLLJITGetMainJITDylib(j->jit);
  /* libm and friends (tanh, log, pow when not inlined) from the process */
  LLVMOrcDefinitionGeneratorRef gen = NULL;
  err = LLVMOrcCreateDynamicLibrarySearchGeneratorForProcess(
      &gen, LLVMOrcLLJITGetGlobalPrefix(j->jit), NULL, NULL);
  if (err) {
    report_llvm_error(ctx, "cannot search the process for symbols", err);
    cg_llvm_jit_free(j);
    return NULL;
  }
  LLVMOrcJITDylibAddGenerator(j->jd, gen);
  return j;
}

void cg_llvm_jit_free(cg_llvm_jit *j) {
  if (!j) return;
  dsc_context *ctx = j->ctx;
  if (j->jit) {
    LLVMErrorRef err = LLVMOrcDisposeLLJIT(j->jit);
    if (err) report_llvm_error(ctx, "disposing the JIT", err);
  }
  host_target_dispose(&j->host);
  for (int i = 0; i < j->n_syms; i++) ctx_strfree(ctx, j->syms[i].sym);
  if (j->syms) ir_free(ctx, j->syms, sizeof(jit_sym) * (size_t)j->cap_syms);
  ctx_strfree(ctx, j->cache_dir);
  ir_free(ctx, j, sizeof *j);
}

void cg_llvm_jit_set_threads(cg_llvm_jit *j, int threads) {
  if (j) j->compile_threads = threads > 0 ? threads : 0;
}

void cg_llvm_jit_stats(const cg_llvm_jit *j, int *compiled, int *cache_hits) {
  if (compiled) *compiled = j ? j->compiled : 0;
  if (cache_hits) *cache_hits = j ? j->cache_hits : 0;
}

size_t cg_llvm_jit_code_bytes(const cg_llvm_jit *j) { return j ? j->code_bytes : 0; }

/* The op part of a lowered kernel's name "k<instr>_<op>" (the whole name
 * otherwise): kernels equal in body and op share one symbol and object. */
static const char *op_part(const char *name) {
  const char *p = name;
  if (*p != 'k') return name;
  for (p++; *p >= '0' && *p <= '9'; p++) {
  }
  return p > name + 1 && *p == '_' && p[1] ? p + 1 : name;
}

/* The cache key and JIT symbol of a kernel: its body (kir_body_hash), its
 * op, the target and dsc's code generator: not the instruction number in
 * its name, so the same layer's kernel in 12 layers is compiled once. */
static uint64_t cache_key(const cg_llvm_jit *j, const kir_kernel *k) {
  uint64_t kh = kir_body_hash(k);
  uint32_t ver = CG_LLVM_CACHE_VERSION;
  const char *op = op_part(k->name);
  uint64_t h = cg_fnv1a(CG_FNV_INIT, &kh, sizeof kh);
  h = cg_fnv1a(h, op, strlen(op) + 1);
  h = cg_fnv1a(h, j->host.triple, strlen(j->host.triple) + 1);
  h = cg_fnv1a(h, j->host.cpu, strlen(j->host.cpu) + 1);
  h = cg_fnv1a(h, j->host.features, strlen(j->host.features) + 1);
  h = cg_fnv1a(h, LLVM_VERSION_STRING, sizeof LLVM_VERSION_STRING);
  return cg_fnv1a(h, &ver, sizeof ver);
}

/* "<op>.<key>" (malloc'd; NULL when out of memory). */
static char *symbol_of(const kir_kernel *k, uint64_t key) {
  const char *op = op_part(k->name);
  size_t n = strlen(op) + 20;
  char *sym = malloc(n);
  if (sym) snprintf(sym, n, "%s.%016llx", op, (unsigned long long)key);
  return sym;
}

/* The kernel cache (codegen/cache.c): one object file per kernel, "<key>.o". */
static LLVMMemoryBufferRef cache_read(dsc_context *ctx, const char *dir, uint64_t key) {
  size_t len = 0;
  void *data = cg_cache_read(ctx, dir, key, "o", CG_CACHE_MAGIC, (uint64_t)1 << 30, &len);
  if (!data) return NULL;
  LLVMMemoryBufferRef buf = LLVMCreateMemoryBufferWithMemoryRangeCopy(data, len, "dsc_cached_kernel");
  free(data);
  return buf;
}

static void cache_write(dsc_context *ctx, const char *dir, uint64_t key, LLVMMemoryBufferRef obj) {
  cg_cache_write(ctx, dir, key, "o", CG_CACHE_MAGIC, LLVMGetBufferStart(obj),
                 LLVMGetBufferSize(obj));
}

static cg_cpu_kernel_fn find_sym(const cg_llvm_jit *j, const char *sym) {
  for (int i = 0; i < j->n_syms; i++)
    if (strcmp(j->syms[i].sym, sym) == 0) return j->syms[i].fn;
  return NULL;
}

/* Compiles kernel k alone into an object file for target h; errors on ctx. */
static LLVMMemoryBufferRef compile_object(dsc_context *ctx, host_target *h, kir_kernel *k,
                                          char *sym) {
  LLVMContextRef c;
  LLVMModuleRef m;
  kir_kernel *one[1] = {k};
  if (!build_module(ctx, one, 1, &sym, h->cpu, h->features, &c, &m)) return NULL;
  LLVMMemoryBufferRef obj = NULL;
  if (optimise(ctx, h, m)) {
    char *msg = NULL;
    if (LLVMTargetMachineEmitToMemoryBuffer(h->tm, m, LLVMObjectFile, &msg, &obj)) {
      ir_error(ctx, ir_no_loc, "llvm: kernel %s: code generation failed: %s", k->name,
               msg ? msg : "");
      obj = NULL;
    }
    LLVMDisposeMessage(msg);
  }
  LLVMDisposeModule(m);
  LLVMContextDispose(c);
  return obj;
}

/* ---- compiling in parallel ----
 * One job per distinct kernel that is neither in the JIT, nor prebuilt,
 * nor in the cache. Workers (the calling thread among them) take jobs in
 * order; each has its own LLVM target machine and its own dsc_context (the
 * libc allocator; its diagnostics are copied to the caller's context in job
 * order), since neither is safe to share between threads. The objects are
 * linked into the JIT afterwards, on the calling thread, in kernel order:
 * the result does not depend on the number of threads. */

typedef struct {
  kir_kernel *k;
  char *sym;                /* malloc'd */
  uint64_t key;
  int same_as;              /* an earlier kernel of this call with this key, or -1 */
  bool compile;             /* a job of the workers */
  LLVMMemoryBufferRef obj;  /* to link (taken by the JIT), or NULL */
  dsc_context *diags;       /* a failed job's errors */
  dsc_status failure;       /* a failed job's status */
} kernel_slot;

typedef struct {
  cg_llvm_jit *j;
  kernel_slot *slots;
  int *jobs, n_jobs;
  int next, done;           /* atomics */
  int failed;               /* atomic: stop taking jobs */
  pthread_mutex_t lock;
} compile_run;

static void report_progress(compile_run *r) {
  char what[64];
  snprintf(what, sizeof what, "compiling %d kernel%s", r->n_jobs, r->n_jobs == 1 ? "" : "s");
  ir_progress(r->j->ctx, what, __atomic_load_n(&r->done, __ATOMIC_RELAXED), r->n_jobs);
}

/* Takes and compiles jobs until none is left (or one failed); `main`: the
 * calling thread, which reports progress. */
static void compile_jobs(compile_run *r, bool main) {
  dsc_context *ctx = dsc_context_new(NULL, NULL);
  host_target h;
  bool ready = ctx && host_target_init(ctx, &h);
  if (ctx) ir_context_inherit_interrupt(ctx, r->j->ctx);
  for (;;) {
    int i = __atomic_fetch_add(&r->next, 1, __ATOMIC_RELAXED);
    if (i >= r->n_jobs || __atomic_load_n(&r->failed, __ATOMIC_RELAXED)) break;
    kernel_slot *s = &r->slots[r->jobs[i]];
    s->failure = ready ? ir_check_interrupt(ctx, "compiling kernels") : DSC_ERR_INTERNAL;
    if (s->failure == DSC_OK && !(s->obj = compile_object(ctx, &h, s->k, s->sym)))
      s->failure = DSC_ERR_INTERNAL;
    if (!s->obj) {
      /* this job's errors go back to the caller (a lost context: out of memory) */
      s->diags = ctx;
      ctx = NULL;
      __atomic_store_n(&r->failed, 1, __ATOMIC_RELAXED);
      break;
    }
    if (r->j->cache_dir) cache_write(ctx, r->j->cache_dir, s->key, s->obj);
    __atomic_fetch_add(&r->done, 1, __ATOMIC_RELAXED);
    if (main) report_progress(r);
  }
  if (ready) host_target_dispose(&h);
  if (ctx) dsc_context_free(ctx);
}

static void *compile_worker(void *arg) {
  compile_jobs(arg, false);
  return NULL;
}

/* Threads for compiling: the CPUs this process may run on. */
static int host_threads(void) {
#ifdef CPU_COUNT
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
#endif
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}

static bool run_jobs(compile_run *r) {
  if (r->n_jobs == 0) return true;
  int threads = r->j->compile_threads > 0 ? r->j->compile_threads : host_threads();
  if (threads > r->n_jobs) threads = r->n_jobs;
  if (threads > 64) threads = 64;
  pthread_t tids[64];
  int started = 0;
  for (int t = 1; t < threads; t++) {
    if (pthread_create(&tids[started], NULL, compile_worker, r) != 0) break; /* fewer threads */
    started++;
  }
  report_progress(r);
  compile_jobs(r, true);
  for (int t = 0; t < started; t++) pthread_join(tids[t], NULL);
  if (!r->failed) report_progress(r);
  return !r->failed;
}

static void free_slots(dsc_context *ctx, kernel_slot *slots, int n) {
  for (int i = 0; i < n; i++) {
    free(slots[i].sym);
    if (slots[i].obj) LLVMDisposeMemoryBuffer(slots[i].obj);
    if (slots[i].diags) dsc_context_free(slots[i].diags);
  }
  ir_free(ctx, slots, sizeof *slots * (size_t)(n > 0 ? n : 1));
}

static bool keep_symbol(cg_llvm_jit *j, const char *sym, cg_cpu_kernel_fn fn) {
  if (j->n_syms == j->cap_syms) {
    int ncap = j->cap_syms ? 2 * j->cap_syms : 16;
    jit_sym *ns = ir_realloc(j->ctx, j->syms, sizeof(jit_sym) * (size_t)j->cap_syms,
                             sizeof(jit_sym) * (size_t)ncap);
    if (!ns) return false;
    j->syms = ns;
    j->cap_syms = ncap;
  }
  char *kept = ctx_strdup(j->ctx, sym);
  if (!kept) return false;
  j->syms[j->n_syms].sym = kept;
  j->syms[j->n_syms].fn = fn;
  j->n_syms++;
  return true;
}

dsc_status cg_llvm_compile(cg_llvm_jit *j, kir_kernel *const *kernels, int n,
                           cg_cpu_kernel_fn *fns) {
  return cg_llvm_compile_with(j, kernels, n, fns, NULL, NULL);
}

/* Phases 1 and 2 of a batch: what each kernel needs (nothing: in the JIT
 * already when fns is given, or equal to an earlier one; its prebuilt or
 * cached object; or a compile job), then the jobs on the host's threads.
 * *out: the slots (free_slots), set also on failure. */
static dsc_status gather_objects(cg_llvm_jit *j, kir_kernel *const *kernels, int n,
                                 cg_cpu_kernel_fn *fns, const void *const *objs,
                                 const size_t *lens, kernel_slot **out) {
  dsc_context *ctx = j->ctx;
  kernel_slot *slots = ir_alloc(ctx, sizeof *slots * (size_t)n);
  int *jobs = ir_alloc(ctx, sizeof *jobs * (size_t)n);
  *out = slots;
  if (!slots || !jobs) {
    ir_error(ctx, ir_no_loc, "llvm: out of memory");
    if (jobs) ir_free(ctx, jobs, sizeof *jobs * (size_t)n);
    return DSC_ERR_INTERNAL;
  }
  memset(slots, 0, sizeof *slots * (size_t)n);
  compile_run r = {.j = j, .slots = slots, .jobs = jobs};
  dsc_status st = DSC_OK;
  for (int i = 0; i < n && st == DSC_OK; i++) {
    kernel_slot *s = &slots[i];
    char err[512];
    s->same_as = -1;
    s->k = kernels[i];
    if ((st = ir_check_interrupt(ctx, "compiling kernels")) != DSC_OK) break;
    if (!s->k || !s->k->name) {
      ir_error(ctx, ir_no_loc, "llvm: kernel %d is missing or unnamed", i);
      st = DSC_ERR_INTERNAL;
      break;
    }
    if (!kir_validate(s->k, err, sizeof err)) {
      ir_error(ctx, ir_no_loc, "llvm: kernel %s is invalid: %s", s->k->name, err);
      st = DSC_ERR_INTERNAL;
      break;
    }
    s->key = cache_key(j, s->k);
    if (!(s->sym = symbol_of(s->k, s->key))) {
      ir_error(ctx, ir_no_loc, "llvm: out of memory");
      st = DSC_ERR_INTERNAL;
      break;
    }
    if (fns && (fns[i] = find_sym(j, s->sym))) continue;
    for (int e = i - 1; e >= 0 && s->same_as < 0; e--)
      if (slots[e].key == s->key && strcmp(slots[e].sym, s->sym) == 0)
        s->same_as = slots[e].same_as >= 0 ? slots[e].same_as : e;
    if (s->same_as >= 0) continue;
    if (objs && objs[i]) { /* prebuilt (a .dsx): must define exactly this symbol */
      s->obj = LLVMCreateMemoryBufferWithMemoryRangeCopy(objs[i], lens[i], "dsc_prebuilt_kernel");
    } else if (j->cache_dir) {
      s->obj = cache_read(ctx, j->cache_dir, s->key);
    }
    if (s->obj)
      j->cache_hits++;
    else
      jobs[r.n_jobs++] = i, s->compile = true;
  }
  if (st == DSC_OK && !run_jobs(&r)) {
    /* the first failed job's errors (several may fail before all stop) */
    st = DSC_ERR_INTERNAL;
    bool told = false;
    for (int i = 0; i < n && !told; i++) {
      if (slots[i].failure == DSC_OK || !slots[i].compile) continue;
      st = slots[i].failure;
      for (int d = 0; slots[i].diags && d < dsc_diag_count(slots[i].diags); d++, told = true) {
        const dsc_diag *dg = dsc_diag_get(slots[i].diags, d);
        ir_diag(ctx, dg->severity, dg->loc, "%s", dg->message);
      }
    }
    if (!told) ir_error(ctx, ir_no_loc, "llvm: out of memory compiling kernels");
  }
  if (st == DSC_OK) j->compiled += r.n_jobs;
  ir_free(ctx, jobs, sizeof *jobs * (size_t)n);
  return st;
}

dsc_status cg_llvm_compile_with(cg_llvm_jit *j, kir_kernel *const *kernels, int n,
                                cg_cpu_kernel_fn *fns, const void *const *objs,
                                const size_t *lens) {
  if (!j) return DSC_ERR_INTERNAL;
  if (n <= 0) return DSC_OK;
  dsc_context *ctx = j->ctx;
  kernel_slot *slots = NULL;
  memset(fns, 0, sizeof *fns * (size_t)n);
  dsc_status st = gather_objects(j, kernels, n, fns, objs, lens, &slots);
  /* 3. link, in kernel order */
  for (int i = 0; i < n && st == DSC_OK; i++) {
    kernel_slot *s = &slots[i];
    if (fns[i]) continue;
    if (s->same_as >= 0) {
      fns[i] = fns[s->same_as];
      continue;
    }
    j->code_bytes += LLVMGetBufferSize(s->obj);
    LLVMErrorRef e = LLVMOrcLLJITAddObjectFile(j->jit, j->jd, s->obj); /* takes obj */
    s->obj = NULL;
    LLVMOrcExecutorAddress addr = 0;
    if (!e) e = LLVMOrcLLJITLookup(j->jit, &addr, s->sym);
    if (e) {
      char what[300];
      snprintf(what, sizeof what, "kernel %s", s->k->name);
      report_llvm_error(ctx, what, e);
      st = DSC_ERR_INTERNAL;
      break;
    }
    fns[i] = (cg_cpu_kernel_fn)(uintptr_t)addr;
    if (!keep_symbol(j, s->sym, fns[i])) {
      ir_error(ctx, ir_no_loc, "llvm: out of memory");
      st = DSC_ERR_INTERNAL;
    }
  }
  if (slots) free_slots(ctx, slots, n);
  return st;
}

dsc_status cg_llvm_kernel_objects(cg_llvm_jit *j, kir_kernel *const *kernels, int n, void **objs,
                                  size_t *lens) {
  if (!j) return DSC_ERR_INTERNAL;
  if (n <= 0) return DSC_OK;
  memset(objs, 0, sizeof *objs * (size_t)n);
  memset(lens, 0, sizeof *lens * (size_t)n);
  kernel_slot *slots = NULL;
  dsc_status st = gather_objects(j, kernels, n, NULL, NULL, NULL, &slots);
  for (int i = 0; i < n && st == DSC_OK; i++) {
    LLVMMemoryBufferRef obj = slots[slots[i].same_as >= 0 ? slots[i].same_as : i].obj;
    size_t len = LLVMGetBufferSize(obj);
    if (!(objs[i] = malloc(len ? len : 1))) {
      ir_error(j->ctx, ir_no_loc, "llvm: out of memory");
      st = DSC_ERR_INTERNAL;
      break;
    }
    memcpy(objs[i], LLVMGetBufferStart(obj), len);
    lens[i] = len;
  }
  if (st != DSC_OK)
    for (int i = 0; i < n; i++) free(objs[i]), objs[i] = NULL, lens[i] = 0;
  if (slots) free_slots(j->ctx, slots, n);
  return st;
}

void cg_llvm_host(const cg_llvm_jit *j, char *buf, size_t len) {
  /* the code generator's version too: a .dsx from an older codegen
   * recompiles instead of loading stale objects */
  snprintf(buf, len, "%s %s %s llvm-%s codegen-%u", j->host.triple, j->host.cpu, j->host.features,
           LLVM_VERSION_STRING, CG_LLVM_CACHE_VERSION);
}

bool cg_llvm_host_string(dsc_context *ctx, char *buf, size_t len) {
  host_target h; /* a target machine, no JIT */
  if (!host_target_init(ctx, &h)) return false;
  snprintf(buf, len, "%s %s %s llvm-%s codegen-%u", h.triple, h.cpu, h.features,
           LLVM_VERSION_STRING, CG_LLVM_CACHE_VERSION);
  host_target_dispose(&h);
  return true;
}

/* ======================= text and bitcode ======================= */

static char *module_text(LLVMModuleRef m) {
  char *s = LLVMPrintModuleToString(m);
  size_t n = s ? strlen(s) + 1 : 0;
  char *out = s ? malloc(n) : NULL;
  if (out) memcpy(out, s, n);
  LLVMDisposeMessage(s);
  return out;
}

char *cg_llvm_print_ir(dsc_context *ctx, kir_kernel *const *kernels, int n) {
  LLVMContextRef c;
  LLVMModuleRef m;
  if (!llvm_ready(ctx) || !build_module(ctx, kernels, n, NULL, NULL, NULL, &c, &m)) return NULL;
  char *out = module_text(m);
  if (!out) ir_error(ctx, ir_no_loc, "llvm: out of memory");
  LLVMDisposeModule(m);
  LLVMContextDispose(c);
  return out;
}

char *cg_llvm_print_optimized_ir(dsc_context *ctx, kir_kernel *const *kernels, int n) {
  host_target h;
  if (!host_target_init(ctx, &h)) return NULL;
  LLVMContextRef c;
  LLVMModuleRef m;
  char *out = NULL;
  if (build_module(ctx, kernels, n, NULL, h.cpu, h.features, &c, &m)) {
    if (optimise(ctx, &h, m)) {
      out = module_text(m);
      if (!out) ir_error(ctx, ir_no_loc, "llvm: out of memory");
    }
    LLVMDisposeModule(m);
    LLVMContextDispose(c);
  }
  host_target_dispose(&h);
  return out;
}

void *cg_llvm_bitcode(dsc_context *ctx, kir_kernel *const *kernels, int n, size_t *len) {
  LLVMContextRef c;
  LLVMModuleRef m;
  *len = 0;
  if (!llvm_ready(ctx) || !build_module(ctx, kernels, n, NULL, NULL, NULL, &c, &m)) return NULL;
  LLVMMemoryBufferRef buf = LLVMWriteBitcodeToMemoryBuffer(m);
  void *out = NULL;
  if (buf) {
    size_t sz = LLVMGetBufferSize(buf);
    out = malloc(sz ? sz : 1);
    if (out) {
      memcpy(out, LLVMGetBufferStart(buf), sz);
      *len = sz;
    }
    LLVMDisposeMemoryBuffer(buf);
  }
  if (!out) ir_error(ctx, ir_no_loc, "llvm: cannot write bitcode");
  LLVMDisposeModule(m);
  LLVMContextDispose(c);
  return out;
}

#else /* !DSC_HAVE_LLVM */

static void no_llvm(dsc_context *ctx) {
  ir_error(ctx, ir_no_loc, "this build has no LLVM backend");
}

cg_llvm_jit *cg_llvm_jit_new(dsc_context *ctx, const char *cache_dir) {
  (void)cache_dir;
  no_llvm(ctx);
  return NULL;
}

void cg_llvm_jit_free(cg_llvm_jit *j) { (void)j; }

void cg_llvm_jit_set_threads(cg_llvm_jit *j, int threads) { (void)j, (void)threads; }

size_t cg_llvm_jit_code_bytes(const cg_llvm_jit *j) {
  (void)j;
  return 0;
}

void cg_llvm_jit_stats(const cg_llvm_jit *j, int *compiled, int *cache_hits) {
  (void)j;
  if (compiled) *compiled = 0;
  if (cache_hits) *cache_hits = 0;
}

dsc_status cg_llvm_compile(cg_llvm_jit *j, kir_kernel *const *kernels, int n,
                           cg_cpu_kernel_fn *fns) {
  (void)j, (void)kernels, (void)n, (void)fns;
  return DSC_ERR_USER; /* no jit can exist: cg_llvm_jit_new reported why */
}

char *cg_llvm_print_ir(dsc_context *ctx, kir_kernel *const *kernels, int n) {
  (void)kernels, (void)n;
  no_llvm(ctx);
  return NULL;
}

char *cg_llvm_print_optimized_ir(dsc_context *ctx, kir_kernel *const *kernels, int n) {
  (void)kernels, (void)n;
  no_llvm(ctx);
  return NULL;
}

dsc_status cg_llvm_compile_with(cg_llvm_jit *j, kir_kernel *const *kernels, int n,
                                cg_cpu_kernel_fn *fns, const void *const *objs,
                                const size_t *lens) {
  (void)objs, (void)lens;
  return cg_llvm_compile(j, kernels, n, fns);
}

dsc_status cg_llvm_kernel_objects(cg_llvm_jit *j, kir_kernel *const *kernels, int n, void **objs,
                                  size_t *lens) {
  (void)j, (void)kernels, (void)n, (void)objs, (void)lens;
  return DSC_ERR_USER; /* no jit can exist: cg_llvm_jit_new reported why */
}

void cg_llvm_host(const cg_llvm_jit *j, char *buf, size_t len) {
  (void)j;
  snprintf(buf, len, "none");
}

bool cg_llvm_host_string(dsc_context *ctx, char *buf, size_t len) {
  (void)ctx;
  snprintf(buf, len, "none");
  return false;
}

void *cg_llvm_bitcode(dsc_context *ctx, kir_kernel *const *kernels, int n, size_t *len) {
  (void)kernels, (void)n;
  *len = 0;
  no_llvm(ctx);
  return NULL;
}

#endif
