/* GPU code generation: kernel IR -> CUDA C (always built, so the source can
 * be generated and inspected anywhere) -> NVRTC -> PTX + cubin (only with
 * DSC_HAVE_CUDA; NVRTC needs no GPU and no driver).
 *
 * Mapping of a kir_kernel onto the CUDA grid (see codegen/codegen.h for the
 * kernel IR's meaning):
 *
 * - POINT mapping (no REDUCE stage, no cross-point hazard, see below): one
 *   thread per domain point. A grid-stride loop walks the flattened domain
 *   (all dims, row-major), blocks of up to 256 threads, and every stage runs
 *   at the thread's point in order. LET slots are per-thread registers; a
 *   STORE once per outer index runs only at the point whose inner indices
 *   are all 0 (kir_validate makes its value and address outer-only).
 *
 * - BLOCK mapping (any REDUCE stage): one thread block per outer index (a
 *   grid-stride loop over the flattened outer dims, so any grid size works;
 *   grid.x = min(outer count, 2^31-1)). blockDim is 256, or fewer (a
 *   multiple of 32) for short rows. Threads stride over the flattened inner
 *   domain. A REDUCE folds a per-thread partial, then warp shuffles
 *   (__shfl_xor_sync butterfly: every lane ends with the same value), one
 *   partial per warp in shared memory, __syncthreads, and every thread folds
 *   the warp partials in warp order, so all threads hold the identical slot
 *   value (no second broadcast). LET is computed by every thread. STORE
 *   over_inner is strided by threads like a REDUCE; STORE once per outer
 *   index is done by thread 0. A __syncthreads ends each outer iteration
 *   (the shared partials are reused by the next one).
 *
 * - Hazards: stages run in order per outer index. When a later stage reads
 *   (or writes) an argument an earlier stage wrote, and the two accesses are
 *   not the same element owned by the same thread (identical affine access,
 *   no gather, both "pointwise" stages), the kernel uses the BLOCK mapping
 *   and a __syncthreads separates the two stages.
 *
 * Types: f32 float, f64 double, i32 int, i64 long long, bool bool (storage:
 * unsigned char). bf16/f16 are stored as unsigned short and converted by
 * hand (integer ops for bf16, the PTX cvt instruction for f16), so the
 * source needs no toolkit header and compiles fast. Conversions follow
 * codegen/kir_eval.c: stores round f64 to float first, then to bf16/f16
 * (round to nearest even); integer arithmetic wraps (done in unsigned);
 * integer division by 0 gives 0; max/min propagate NaN. Math uses the
 * precise library functions (expf, logf, tanhf, sqrtf, rsqrtf; NVRTC runs
 * without -use_fast_math).
 *
 * Expression DAGs are emitted once per node per point as locals (v<N>);
 * addresses are computed in 32-bit modular arithmetic when the argument has
 * fewer than 2^31 elements (exact: the true address is in range), else in
 * 64-bit. Gathers are bounds-checked: out of range sets *status = 1 (a
 * plain store: every writer writes 1), loads 0, skips the store.
 *
 * Kernel parameters: the argument pointers in order (const for arguments
 * that are never written), then `int *status`. Shared memory is static, so
 * cg_cuda_launch.shared_bytes (dynamic shared memory) is 0. */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef DSC_HAVE_CUDA
#include <nvrtc.h>
#endif

#include "codegen/codegen.h"

int kir_internal_topo(const kir_expr *root, const kir_expr ***items, int **a, int **b, int **c,
                      int **g);

#define CUDA_BLOCK_MAX 256
#define CUDA_GRID_MAX 2147483647LL
#define INDEX32_LIMIT 2147483647LL

/* ---------------- text buffer (context allocator) ---------------- */

typedef struct {
  dsc_context *ctx;
  char *p;
  size_t len, cap;
  bool failed;
} sbuf;

static void sb_vprintf(sbuf *b, const char *fmt, va_list ap) {
  if (b->failed) return;
  va_list ap2;
  va_copy(ap2, ap);
  int n = vsnprintf(NULL, 0, fmt, ap2);
  va_end(ap2);
  if (n < 0) {
    b->failed = true;
    return;
  }
  if (b->len + (size_t)n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + (size_t)n + 1) cap *= 2;
    char *p = ir_realloc(b->ctx, b->p, b->cap, cap);
    if (!p) {
      b->failed = true;
      return;
    }
    b->p = p;
    b->cap = cap;
  }
  vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
  b->len += (size_t)n;
}

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  sb_vprintf(b, fmt, ap);
  va_end(ap);
}

static void sb_free(sbuf *b) {
  if (b->p) ir_free(b->ctx, b->p, b->cap);
  b->p = NULL;
  b->len = b->cap = 0;
}

/* ---------------- types and literals ---------------- */

static bool is_float(dsc_dtype t) { return t == DSC_F32 || t == DSC_F64; }
static bool is_int(dsc_dtype t) { return t == DSC_I32 || t == DSC_I64; }

/* C type of a compute type (NULL: not a compute type). */
static const char *compute_ctype(dsc_dtype t) {
  switch (t) {
    case DSC_F32:
      return "float";
    case DSC_F64:
      return "double";
    case DSC_I32:
      return "int";
    case DSC_I64:
      return "long long";
    case DSC_BOOL:
      return "bool";
    default:
      return NULL;
  }
}

static const char *unsigned_ctype(dsc_dtype t) {
  return t == DSC_I64 ? "unsigned long long" : "unsigned";
}

static const char *storage_ctype(dsc_dtype t) {
  switch (t) {
    case DSC_F32:
      return "float";
    case DSC_F64:
      return "double";
    case DSC_BF16:
    case DSC_F16:
      return "unsigned short";
    case DSC_I32:
      return "int";
    case DSC_I64:
      return "long long";
    case DSC_BOOL:
      return "unsigned char";
    default:
      return NULL;
  }
}

/* kir_eval's integer conversion: truncate; i32 wraps modulo 2^32; i64 out
 * of range is INT64_MIN; NaN is 0. */
static int64_t wrap_int(double v, int bits) {
  if (isnan(v)) return 0;
  double t = trunc(v);
  if (bits == 32) {
    if (t >= 2147483648.0 || t < -2147483648.0) t = fmod(t, 4294967296.0);
    return (int32_t)(uint32_t)(int64_t)t;
  }
  if (t >= 9223372036854775808.0 || t < -9223372036854775808.0) return INT64_MIN;
  return (int64_t)t;
}

/* Adds ".0" when a %g rendering would read as an integer literal. */
static void float_text(char *buf, size_t n, const char *fmt, double v) {
  snprintf(buf, n, fmt, v);
  if (!strpbrk(buf, ".en")) {
    size_t l = strlen(buf);
    if (l + 3 < n) memcpy(buf + l, ".0", 3);
  }
}

/* A literal of compute type t with value v (converted as kir_eval does).
 * %.9g / %.17g round-trip float / double exactly. */
static void literal(dsc_dtype t, double v, char *buf, size_t n) {
  switch (t) {
    case DSC_F32: {
      float f = (float)v;
      if (isnan(f))
        snprintf(buf, n, "__int_as_float(0x7fffffff)");
      else if (isinf(f))
        snprintf(buf, n, "__int_as_float(%s)", f > 0 ? "0x7f800000" : "(int)0xff800000u");
      else {
        char tmp[48];
        float_text(tmp, sizeof tmp, "%.9g", (double)f);
        snprintf(buf, n, "%sf", tmp);
      }
      break;
    }
    case DSC_F64:
      if (isnan(v))
        snprintf(buf, n, "__longlong_as_double(0x7ff8000000000000ll)");
      else if (isinf(v))
        snprintf(buf, n, "__longlong_as_double(%s)",
                 v > 0 ? "0x7ff0000000000000ll" : "(long long)0xfff0000000000000ull");
      else
        float_text(buf, n, "%.17g", v);
      break;
    case DSC_I32: {
      int64_t i = wrap_int(v, 32);
      if (i == INT32_MIN)
        snprintf(buf, n, "(-2147483647 - 1)");
      else
        snprintf(buf, n, "%" PRId64, i);
      break;
    }
    case DSC_I64: {
      int64_t i = wrap_int(v, 64);
      if (i == INT64_MIN)
        snprintf(buf, n, "(-9223372036854775807ll - 1)");
      else
        snprintf(buf, n, "%" PRId64 "ll", i);
      break;
    }
    case DSC_BOOL:
      snprintf(buf, n, "%s", v != 0 ? "true" : "false");
      break;
    default:
      snprintf(buf, n, "0");
      break;
  }
}

/* ---------------- the emitter ---------------- */

/* One stage's expression program (post-order DAG nodes, operand positions). */
typedef struct {
  int n;
  const kir_expr **items;
  int *a, *b, *c, *g;
  int base; /* node i is the local v<base+i> */
} prog;

typedef struct {
  bool block_mapping;
  int64_t outer, inner, total;
  int block;
  bool outer32, inner32, total32; /* flattened counters fit in 32 bits */
} mapping;

typedef struct {
  sbuf *b;
  const kir_kernel *k;
  mapping m;
  prog *progs; /* 2 per stage: expr, dst gather */
  const char *fn_name;
  bool device_fn; /* a __device__ function shared by identical kernels */
  int next_var;
  char err[300];
  bool bad;
} emitter;

static void fail(emitter *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(emitter *e, const char *fmt, ...) {
  if (e->bad) return;
  e->bad = true;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(e->err, sizeof e->err, fmt, ap);
  va_end(ap);
}

static void line(emitter *e, int ind, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void line(emitter *e, int ind, const char *fmt, ...) {
  sb_printf(e->b, "%*s", 2 * ind, "");
  va_list ap;
  va_start(ap, fmt);
  sb_vprintf(e->b, fmt, ap);
  va_end(ap);
  sb_printf(e->b, "\n");
}

static void prog_free(prog *p) {
  free(p->items);
  free(p->a);
  free(p->b);
  free(p->c);
  free(p->g);
  memset(p, 0, sizeof *p);
}

static bool prog_build(emitter *e, prog *p, const kir_expr *root) {
  memset(p, 0, sizeof *p);
  if (!root) return true;
  p->n = kir_internal_topo(root, &p->items, &p->a, &p->b, &p->c, &p->g);
  if (p->n < 0) {
    p->n = 0;
    fail(e, "out of memory");
    return false;
  }
  p->base = e->next_var;
  e->next_var += p->n;
  return true;
}

/* Converts text `x` of compute type `from` to compute type `to`. */
static void convert(char *out, size_t n, dsc_dtype from, dsc_dtype to, const char *x) {
  if (from == to)
    snprintf(out, n, "%s", x);
  else if (is_float(from) && is_int(to)) /* kir_eval's wrapping, not the hardware's saturation */
    snprintf(out, n, "dsc_f64_%s((double)%s)", to == DSC_I32 ? "i32" : "i64", x);
  else if (to == DSC_BOOL)
    snprintf(out, n, "(%s != 0)", x);
  else
    snprintf(out, n, "(%s)%s", compute_ctype(to), x);
}

/* ---- accesses ---- */

/* Bitmask of domain dims an access moves with. */
static unsigned access_dims(const kir_kernel *k, const kir_access *ac) {
  unsigned m = 0;
  for (int d = 0; d < k->rank; d++)
    if (ac->stride[d]) m |= 1u << d;
  return m;
}

/* The element index of `ac` (gather value in local `gvar`, or NULL). */
static void access_index(emitter *e, const kir_access *ac, const char *gvar, char *out, size_t n) {
  const kir_kernel *k = e->k;
  bool narrow = k->args[ac->arg].numel <= INDEX32_LIMIT;
  size_t len = 0;
  out[0] = 0;
#define APPEND(...)                                                        \
  do {                                                                     \
    if (len < n) len += (size_t)snprintf(out + len, n - len, __VA_ARGS__); \
  } while (0)
  const char *sep = "";
  if (narrow) {
    /* Modular 32-bit arithmetic: the true index lies in [0, 2^31). */
    if (ac->offset) {
      APPEND("%" PRIu32 "u", (uint32_t)ac->offset);
      sep = " + ";
    }
    for (int d = 0; d < k->rank; d++)
      if (ac->stride[d]) {
        if (ac->stride[d] == 1)
          APPEND("%s(unsigned)i%d", sep, d);
        else
          APPEND("%s%" PRIu32 "u * (unsigned)i%d", sep, (uint32_t)ac->stride[d], d);
        sep = " + ";
      }
    if (gvar)
      APPEND("%s%" PRIu32 "u * (unsigned)%s", sep, (uint32_t)ac->gather_stride, gvar);
    else if (!*sep)
      APPEND("0u");
  } else {
    if (ac->offset) {
      APPEND("%" PRId64 "ll", ac->offset);
      sep = " + ";
    }
    for (int d = 0; d < k->rank; d++)
      if (ac->stride[d]) {
        APPEND("%s%" PRId64 "ll * i%d", sep, ac->stride[d], d);
        sep = " + ";
      }
    if (gvar)
      APPEND("%s%" PRId64 "ll * (long long)%s", sep, ac->gather_stride, gvar);
    else if (!*sep)
      APPEND("0ll");
  }
#undef APPEND
  if (len >= n) fail(e, "access text too long");
}

/* A loaded element of storage dtype s as compute type t. */
static void load_text(dsc_dtype s, dsc_dtype t, const char *elem, char *out, size_t n) {
  char v[700];
  dsc_dtype from = s;
  switch (s) {
    case DSC_BF16:
      snprintf(v, sizeof v, "dsc_bf16_f32(%s)", elem);
      from = DSC_F32;
      break;
    case DSC_F16:
      snprintf(v, sizeof v, "dsc_f16_f32(%s)", elem);
      from = DSC_F32;
      break;
    case DSC_BOOL:
      snprintf(v, sizeof v, "(%s != 0)", elem);
      break;
    default:
      snprintf(v, sizeof v, "%s", elem);
      break;
  }
  convert(out, n, from, t, v);
}

/* A value of compute type t as storage dtype s (kir_eval's cg_store_elem). */
static void store_text(dsc_dtype t, dsc_dtype s, const char *x, char *out, size_t n) {
  switch (s) {
    case DSC_BF16:
      if (t == DSC_F32)
        snprintf(out, n, "dsc_f32_bf16(%s)", x);
      else
        snprintf(out, n, "dsc_f32_bf16((float)%s)", x);
      break;
    case DSC_F16:
      if (t == DSC_F32)
        snprintf(out, n, "dsc_f32_f16(%s)", x);
      else
        snprintf(out, n, "dsc_f32_f16((float)%s)", x);
      break;
    case DSC_BOOL:
      snprintf(out, n, "(unsigned char)(%s != 0)", x);
      break;
    default:
      if (t == s)
        snprintf(out, n, "%s", x);
      else if (is_float(t) && is_int(s)) /* storage i32/i64 are the compute types */
        convert(out, n, t, s, x);
      else
        snprintf(out, n, "(%s)%s", storage_ctype(s), x);
      break;
  }
}

/* ---- expressions ---- */

static void var_name(const prog *p, int i, char *out, size_t n) {
  snprintf(out, n, "v%d", p->base + i);
}

/* Integer negation that wraps (INT_MIN stays INT_MIN, as kir_eval wraps). */
static void int_neg(dsc_dtype t, const char *x, char *out, size_t n) {
  snprintf(out, n, "(%s)(0%s - (%s)%s)", compute_ctype(t), t == DSC_I64 ? "ull" : "u",
           unsigned_ctype(t), x);
}

/* Float unary ops as CUDA C: {f} the math functions' suffix (f for f32),
 * {1} the type's one, {a} the operand. */
static const struct {
  int op;
  const char *text;
} cuda_unary[] = {
    {KIR_NEG, "-{a}"},
    {KIR_EXP, "exp{f}({a})"},
    {KIR_LOG, "log{f}({a})"},
    {KIR_SQRT, "sqrt{f}({a})"},
    {KIR_RSQRT, "rsqrt{f}({a})"},
    {KIR_TANH, "tanh{f}({a})"},
    {KIR_SIGMOID, "{1} / ({1} + exp{f}(-{a}))"},
    {KIR_ABS, "fabs{f}({a})"},
    {KIR_SIN, "sin{f}({a})"},
    {KIR_COS, "cos{f}({a})"},
};

/* text with {f}, {1} and {a} replaced, into out (truncated at n). */
static void render(const char *text, const char *f, const char *one, const char *a, char *out,
                   size_t n) {
  size_t len = 0;
  for (const char *p = text; *p && len + 1 < n; p++) {
    const char *sub = NULL;
    if (p[0] == '{' && p[1] && p[2] == '}')
      sub = p[1] == 'f' ? f : p[1] == '1' ? one : p[1] == 'a' ? a : NULL;
    if (sub) {
      len += (size_t)snprintf(out + len, n - len, "%s", sub);
      if (len >= n) len = n - 1;
      p += 2;
    } else {
      out[len++] = *p;
    }
  }
  out[len] = 0;
}

static void emit_unary(emitter *e, const kir_expr *x, const char *a, char *rhs, size_t n) {
  dsc_dtype t = x->type;
  const char *f = t == DSC_F32 ? "f" : "";
  if (is_int(t)) {
    char neg[200];
    int_neg(t, a, neg, sizeof neg);
    if (x->op == KIR_NEG)
      snprintf(rhs, n, "%s", neg);
    else if (x->op == KIR_ABS)
      snprintf(rhs, n, "%s < 0 ? %s : %s", a, neg, a);
    else
      fail(e, "unary op %d on %s", x->op, dsc_dtype_name(t));
    return;
  }
  if (!is_float(t)) {
    fail(e, "unary op %d on %s", x->op, dsc_dtype_name(t));
    return;
  }
  for (size_t i = 0; i < sizeof cuda_unary / sizeof cuda_unary[0]; i++)
    if (cuda_unary[i].op == x->op) {
      render(cuda_unary[i].text, f, t == DSC_F32 ? "1.0f" : "1.0", a, rhs, n);
      return;
    }
  fail(e, "unknown unary op %d", x->op);
}

static void emit_binary(emitter *e, const kir_expr *x, dsc_dtype t, const char *a, const char *b,
                        char *rhs, size_t n) {
  bool integer = is_int(t);
  const char *sym = NULL;
  switch (x->op) {
    case KIR_ADD:
      sym = "+";
      break;
    case KIR_SUB:
      sym = "-";
      break;
    case KIR_MUL:
      sym = "*";
      break;
    case KIR_LT:
      snprintf(rhs, n, "%s < %s", a, b);
      return;
    case KIR_GT:
      snprintf(rhs, n, "%s > %s", a, b);
      return;
    case KIR_EQ:
      snprintf(rhs, n, "%s == %s", a, b);
      return;
    case KIR_AND:
    case KIR_OR:
      if (t != DSC_BOOL) fail(e, "and/or on %s", dsc_dtype_name(t));
      snprintf(rhs, n, "%s %s %s", a, x->op == KIR_AND ? "&&" : "||", b);
      return;
    case KIR_MAX:
    case KIR_MIN: {
      const char *cmp = x->op == KIR_MAX ? ">" : "<";
      if (integer)
        snprintf(rhs, n, "%s %s %s ? %s : %s", a, cmp, b, a, b);
      else if (is_float(t)) /* NaN propagates from either side, as in kir_eval */
        snprintf(rhs, n, "(%s %s %s || %s != %s) ? %s : %s", a, cmp, b, a, a, a, b);
      else
        fail(e, "max/min on %s", dsc_dtype_name(t));
      return;
    }
    case KIR_DIV:
      if (integer) {
        char neg[200];
        int_neg(t, a, neg, sizeof neg);
        snprintf(rhs, n, "%s == 0 ? (%s)0 : %s == -1 ? %s : %s / %s", b, compute_ctype(t), b, neg,
                 a, b);
      } else if (is_float(t))
        snprintf(rhs, n, "%s / %s", a, b);
      else
        fail(e, "div on %s", dsc_dtype_name(t));
      return;
    case KIR_POW:
      if (is_float(t))
        snprintf(rhs, n, "pow%s(%s, %s)", t == DSC_F32 ? "f" : "", a, b);
      else
        fail(e, "pow on %s", dsc_dtype_name(t));
      return;
    case KIR_RAND24:
      if (t == DSC_I64)
        snprintf(rhs, n, "dsc_rand24(%s, %s)", a, b);
      else
        fail(e, "rand24 on %s", dsc_dtype_name(t));
      return;
    default:
      fail(e, "unknown binary op %d", x->op);
      return;
  }
  if (integer)
    snprintf(rhs, n, "(%s)((%s)%s %s (%s)%s)", compute_ctype(t), unsigned_ctype(t), a, sym,
             unsigned_ctype(t), b);
  else if (is_float(t))
    snprintf(rhs, n, "%s %s %s", a, sym, b);
  else
    fail(e, "arithmetic on %s", dsc_dtype_name(t));
}

/* Emits every node of p as a local at indentation ind. */
static void emit_prog(emitter *e, const prog *p, int ind) {
  const kir_kernel *k = e->k;
  for (int i = 0; i < p->n && !e->bad; i++) {
    const kir_expr *x = p->items[i];
    const char *ct = compute_ctype(x->type);
    if (!ct) {
      fail(e, "expression of type %s", dsc_dtype_name(x->type));
      return;
    }
    char v[32], a[32] = "", b[32] = "", c[32] = "", rhs[1200];
    var_name(p, i, v, sizeof v);
    if (p->a[i] >= 0) var_name(p, p->a[i], a, sizeof a);
    if (p->b[i] >= 0) var_name(p, p->b[i], b, sizeof b);
    if (p->c[i] >= 0) var_name(p, p->c[i], c, sizeof c);
    if ((x->kind == KIR_UNARY || x->kind == KIR_BINARY || x->kind == KIR_SELECT ||
         x->kind == KIR_CAST) &&
        (p->a[i] < 0 || ((x->kind == KIR_BINARY || x->kind == KIR_SELECT) && p->b[i] < 0) ||
         (x->kind == KIR_SELECT && p->c[i] < 0))) {
      fail(e, "expression without operand");
      return;
    }
    switch (x->kind) {
      case KIR_CONST:
        literal(x->type, x->value, rhs, sizeof rhs);
        break;
      case KIR_INDEX: {
        if (x->var < 0 || x->var >= k->rank) {
          fail(e, "index of dim %d", x->var);
          return;
        }
        char iv[16];
        snprintf(iv, sizeof iv, "i%d", x->var);
        convert(rhs, sizeof rhs, DSC_I64, x->type, iv);
        break;
      }
      case KIR_SCALAR: {
        if (x->slot < 0 || x->slot >= k->n_slots) {
          fail(e, "slot %d", x->slot);
          return;
        }
        char sv[16];
        snprintf(sv, sizeof sv, "s%d", x->slot);
        convert(rhs, sizeof rhs, k->slot_types[x->slot], x->type, sv);
        break;
      }
      case KIR_UNARY:
        emit_unary(e, x, a, rhs, sizeof rhs);
        break;
      case KIR_BINARY:
        emit_binary(e, x, p->items[p->a[i]]->type, a, b, rhs, sizeof rhs);
        break;
      case KIR_SELECT:
        snprintf(rhs, sizeof rhs, "%s ? %s : %s", a, b, c);
        break;
      case KIR_CAST:
        convert(rhs, sizeof rhs, p->items[p->a[i]]->type, x->type, a);
        break;
      case KIR_LOAD: {
        const kir_access *ac = &x->access;
        if (ac->arg < 0 || ac->arg >= k->n_args) {
          fail(e, "load of argument %d", ac->arg);
          return;
        }
        char g[32] = "", idx[600], elem[640];
        if (ac->gather) {
          if (p->g[i] < 0) {
            fail(e, "gather without index");
            return;
          }
          var_name(p, p->g[i], g, sizeof g);
        }
        access_index(e, ac, ac->gather ? g : NULL, idx, sizeof idx);
        snprintf(elem, sizeof elem, "a%d[%s]", ac->arg, idx);
        load_text(k->args[ac->arg].dtype, x->type, elem, rhs, sizeof rhs);
        if (ac->gather) {
          char zero[64];
          literal(x->type, 0, zero, sizeof zero);
          line(e, ind, "%s %s = %s;", ct, v, zero);
          line(e, ind, "if (%s >= 0 && %s < %" PRId64 "ll) %s = %s;", g, g, ac->gather_bound, v,
               rhs);
          line(e, ind, "else *status = 1;");
          continue;
        }
        break;
      }
      default:
        fail(e, "unknown expression kind %d", (int)x->kind);
        return;
    }
    line(e, ind, "const %s %s = %s;", ct, v, rhs);
  }
}

/* The root's local of a stage program. */
static void root_name(const prog *p, char *out, size_t n) { var_name(p, p->n - 1, out, n); }

/* Emits the store of a STORE stage whose value is already in locals. */
static void emit_store(emitter *e, int si, int ind) {
  const kir_kernel *k = e->k;
  const kir_stage *st = &k->stages[si];
  const prog *vp = &e->progs[2 * si], *gp = &e->progs[2 * si + 1];
  if (st->dst.arg < 0 || st->dst.arg >= k->n_args) {
    fail(e, "store to argument %d", st->dst.arg);
    return;
  }
  char val[32], g[32] = "", idx[600], conv[700];
  root_name(vp, val, sizeof val);
  if (st->dst.gather) {
    emit_prog(e, gp, ind);
    root_name(gp, g, sizeof g);
  }
  access_index(e, &st->dst, st->dst.gather ? g : NULL, idx, sizeof idx);
  store_text(st->expr->type, k->args[st->dst.arg].dtype, val, conv, sizeof conv);
  if (st->dst.gather) {
    line(e, ind, "if (%s >= 0 && %s < %" PRId64 "ll) a%d[%s] = %s;", g, g, st->dst.gather_bound,
         st->dst.arg, idx, conv);
    line(e, ind, "else *status = 1;");
  } else {
    line(e, ind, "a%d[%s] = %s;", st->dst.arg, idx, conv);
  }
}

/* Dims used by a stage (index nodes, load and store addresses). */
static unsigned stage_dims(emitter *e, int si) {
  const kir_kernel *k = e->k;
  unsigned m = 0;
  for (int j = 0; j < 2; j++) {
    const prog *p = &e->progs[2 * si + j];
    for (int i = 0; i < p->n; i++) {
      const kir_expr *x = p->items[i];
      if (x->kind == KIR_INDEX && x->var >= 0 && x->var < k->rank) m |= 1u << x->var;
      if (x->kind == KIR_LOAD) m |= access_dims(k, &x->access);
    }
  }
  if (k->stages[si].kind == KIR_STAGE_STORE) m |= access_dims(k, &k->stages[si].dst);
  return m;
}

/* Declares i<d> for the dims in `mask` within [lo, hi) from flat counter
 * `flat` over those dims (row-major). */
static void emit_decompose(emitter *e, int ind, unsigned mask, int lo, int hi, const char *flat) {
  const kir_kernel *k = e->k;
  for (int d = lo; d < hi; d++) {
    if (!(mask & (1u << d))) continue;
    int64_t after = 1;
    for (int j = d + 1; j < hi; j++) after *= k->dims[j];
    if (k->dims[d] == 1)
      line(e, ind, "const long long i%d = 0;", d);
    else if (d == lo && after == 1)
      line(e, ind, "const long long i%d = (long long)%s;", d, flat);
    else if (d == lo)
      line(e, ind, "const long long i%d = (long long)(%s / %" PRId64 "u);", d, flat, after);
    else if (after == 1)
      line(e, ind, "const long long i%d = (long long)(%s %% %" PRId64 "u);", d, flat, k->dims[d]);
    else
      line(e, ind, "const long long i%d = (long long)(%s / %" PRId64 "u %% %" PRId64 "u);", d, flat,
           after, k->dims[d]);
  }
}

/* ---- hazards between stages ---- */

typedef struct {
  const kir_access *ac;
  bool write;
} stage_access;

static int collect_accesses(emitter *e, int si, stage_access *out, int cap) {
  int n = 0;
  for (int j = 0; j < 2; j++) {
    const prog *p = &e->progs[2 * si + j];
    for (int i = 0; i < p->n && n < cap; i++)
      if (p->items[i]->kind == KIR_LOAD) out[n++] = (stage_access){&p->items[i]->access, false};
  }
  if (e->k->stages[si].kind == KIR_STAGE_STORE && n < cap)
    out[n++] = (stage_access){&e->k->stages[si].dst, true};
  return n;
}

/* The element range an access can touch over the whole domain. */
static void access_range(const kir_kernel *k, const kir_access *ac, int64_t *lo, int64_t *hi) {
  *lo = *hi = ac->offset;
  for (int d = 0; d < k->rank; d++) {
    int64_t span = ac->stride[d] * (k->dims[d] - 1);
    if (span < 0)
      *lo += span;
    else
      *hi += span;
  }
  if (ac->gather) *hi += ac->gather_stride * (ac->gather_bound - 1);
}

static bool disjoint(const kir_kernel *k, const kir_access *x, const kir_access *y) {
  int64_t xlo, xhi, ylo, yhi;
  access_range(k, x, &xlo, &xhi);
  access_range(k, y, &ylo, &yhi);
  return xhi < ylo || yhi < xlo;
}

static bool same_access(const kir_access *x, const kir_access *y) {
  if (x->gather || y->gather || x->offset != y->offset) return false;
  for (int d = 0; d < KIR_MAX_RANK; d++)
    if (x->stride[d] != y->stride[d]) return false;
  return true;
}

/* Whether stage j's element at a point is owned by the thread of that point
 * (the same thread touches it in every pointwise stage). */
static bool pointwise(const kir_stage *st, bool block_mapping) {
  if (st->kind == KIR_STAGE_STORE) return st->over_inner;
  if (st->kind == KIR_STAGE_REDUCE) return block_mapping;
  return !block_mapping; /* LET: per point in the point mapping, per thread in the block one */
}

/* Whether stage s must wait for stage j (j < s) to finish in every thread. */
static bool conflict(emitter *e, int j, int s, bool block_mapping) {
  enum { CAP = 1024 };
  stage_access *x = malloc(2 * CAP * sizeof *x);
  if (!x) {
    fail(e, "out of memory");
    return false;
  }
  stage_access *y = x + CAP;
  int nx = collect_accesses(e, j, x, CAP), ny = collect_accesses(e, s, y, CAP);
  bool both_pointwise =
      pointwise(&e->k->stages[j], block_mapping) && pointwise(&e->k->stages[s], block_mapping);
  bool hit = nx == CAP || ny == CAP; /* too many to check: be safe */
  for (int a = 0; a < nx && !hit; a++)
    for (int b = 0; b < ny && !hit; b++)
      if (x[a].ac->arg == y[b].ac->arg && (x[a].write || y[b].write) &&
          !(both_pointwise && same_access(x[a].ac, y[b].ac)) && !disjoint(e->k, x[a].ac, y[b].ac))
        hit = true;
  free(x);
  return hit;
}

/* ---- kernels ---- */

static void choose_mapping(emitter *e, mapping *m) {
  const kir_kernel *k = e->k;
  memset(m, 0, sizeof *m);
  m->outer = m->inner = 1;
  for (int d = 0; d < k->rank; d++) {
    if (d < k->n_outer)
      m->outer *= k->dims[d];
    else
      m->inner *= k->dims[d];
  }
  m->total = m->outer * m->inner;
  for (int s = 0; s < k->n_stages; s++)
    if (k->stages[s].kind == KIR_STAGE_REDUCE) m->block_mapping = true;
  for (int s = 1; s < k->n_stages && !m->block_mapping; s++)
    for (int j = 0; j < s && !m->block_mapping; j++)
      if (conflict(e, j, s, false)) m->block_mapping = true;
  int64_t threads = m->block_mapping ? m->inner : m->total;
  int64_t block = (threads + 31) / 32 * 32;
  m->block = (int)(block > CUDA_BLOCK_MAX ? CUDA_BLOCK_MAX : block < 32 ? 32 : block);
  m->outer32 = m->outer <= INDEX32_LIMIT;
  m->inner32 = m->inner <= INDEX32_LIMIT;
  m->total32 = m->total <= INDEX32_LIMIT;
}

static void launch_of(const mapping *m, cg_cuda_launch *l) {
  memset(l, 0, sizeof *l);
  int64_t grid = m->block_mapping ? m->outer : (m->total + m->block - 1) / m->block;
  if (grid > CUDA_GRID_MAX) grid = CUDA_GRID_MAX;
  if (grid < 1) grid = 1;
  l->grid[0] = (unsigned)grid;
  l->grid[1] = l->grid[2] = 1;
  l->block[0] = (unsigned)m->block;
  l->block[1] = l->block[2] = 1;
  l->shared_bytes = 0;
}

static const char *reduce_name(kir_reduce_op op) {
  return op == KIR_REDUCE_SUM ? "sum" : op == KIR_REDUCE_MAX ? "max" : "min";
}

/* `acc = fold(acc, x)` for a reduction of compute type t. */
static void fold_text(kir_reduce_op op, dsc_dtype t, const char *acc, const char *x, char *out,
                      size_t n) {
  if (op == KIR_REDUCE_SUM) {
    if (is_int(t))
      snprintf(out, n, "%s = (%s)((%s)%s + (%s)%s);", acc, compute_ctype(t), unsigned_ctype(t), acc,
               unsigned_ctype(t), x);
    else
      snprintf(out, n, "%s += %s;", acc, x);
    return;
  }
  const char *cmp = op == KIR_REDUCE_MAX ? ">" : "<";
  if (is_int(t))
    snprintf(out, n, "if (%s %s %s) %s = %s;", x, cmp, acc, acc, x);
  else /* a NaN anywhere wins, as in kir_eval */
    snprintf(out, n, "if (%s %s %s || %s != %s) %s = %s;", x, cmp, acc, x, x, acc, x);
}

static void reduce_identity(kir_reduce_op op, dsc_dtype t, char *out, size_t n) {
  if (op == KIR_REDUCE_SUM)
    literal(t, 0, out, n);
  else if (is_float(t))
    literal(t, op == KIR_REDUCE_MAX ? -INFINITY : INFINITY, out, n);
  else if (t == DSC_I32)
    snprintf(out, n, "%s", op == KIR_REDUCE_MAX ? "(-2147483647 - 1)" : "2147483647");
  else
    snprintf(out, n, "%s",
             op == KIR_REDUCE_MAX ? "(-9223372036854775807ll - 1)" : "9223372036854775807ll");
}

static void emit_reduce(emitter *e, int si, int ind, unsigned dims) {
  const kir_kernel *k = e->k;
  const kir_stage *st = &k->stages[si];
  const prog *p = &e->progs[2 * si];
  dsc_dtype t = st->expr->type;
  const char *ct = compute_ctype(t);
  if (!is_float(t) && !is_int(t)) {
    fail(e, "reduction of %s", dsc_dtype_name(t));
    return;
  }
  char id[64], fold[300], root[32];
  reduce_identity(st->reduce, t, id, sizeof id);
  root_name(p, root, sizeof root);
  line(e, ind, "%s acc = %s;", ct, id);
  const char *rt = e->m.inner32 ? "unsigned" : "unsigned long long";
  line(e, ind, "for (%s r = threadIdx.x; r < %" PRId64 "u; r += %du) {", rt, e->m.inner,
       e->m.block);
  emit_decompose(e, ind + 1, dims, k->n_outer, k->rank, "r");
  emit_prog(e, p, ind + 1);
  fold_text(st->reduce, t, "acc", root, fold, sizeof fold);
  line(e, ind + 1, "%s", fold);
  line(e, ind, "}");
  int warps = e->m.block / 32;
  fold_text(st->reduce, t, "acc", "other", fold, sizeof fold);
  line(e, ind, "for (int m = 16; m > 0; m >>= 1) {");
  line(e, ind + 1, "const %s other = __shfl_xor_sync(0xffffffffu, acc, m);", ct);
  line(e, ind + 1, "%s", fold);
  line(e, ind, "}");
  line(e, ind, "if ((threadIdx.x & 31u) == 0) red%d[threadIdx.x >> 5] = acc;", si);
  line(e, ind, "__syncthreads();");
  char s[16];
  snprintf(s, sizeof s, "s%d", st->slot);
  line(e, ind, "%s = red%d[0];", s, si);
  if (warps > 1) {
    fold_text(st->reduce, t, s, "other", fold, sizeof fold);
    line(e, ind, "for (int w = 1; w < %d; w++) {", warps);
    line(e, ind + 1, "const %s other = red%d[w];", ct, si);
    line(e, ind + 1, "%s", fold);
    line(e, ind, "}");
  }
}

/* The parameter list "(const float *a0, ..., int *status)". */
static void print_params(sbuf *b, const kir_kernel *k) {
  sb_printf(b, "(");
  for (int i = 0; i < k->n_args; i++) {
    const char *st = storage_ctype(k->args[i].dtype);
    sb_printf(b, "%s%s *a%d, ", k->args[i].written ? "" : "const ", st ? st : "void", i);
  }
  sb_printf(b, "int *status)");
}

static void emit_params(emitter *e) {
  const kir_kernel *k = e->k;
  for (int i = 0; i < k->n_args; i++)
    if (!storage_ctype(k->args[i].dtype))
      fail(e, "argument %d of dtype %s", i, dsc_dtype_name(k->args[i].dtype));
  if (e->device_fn)
    sb_printf(e->b, "static __device__ __noinline__ void %s", e->fn_name);
  else
    sb_printf(e->b, "extern \"C\" __global__ void __launch_bounds__(%d) %s", e->m.block,
              e->fn_name);
  print_params(e->b, k);
  sb_printf(e->b, " {\n");
}

static void emit_slots(emitter *e, int ind) {
  const kir_kernel *k = e->k;
  for (int s = 0; s < k->n_slots; s++) {
    const char *ct = compute_ctype(k->slot_types[s]);
    if (!ct) {
      fail(e, "slot %d of type %s", s, dsc_dtype_name(k->slot_types[s]));
      return;
    }
    char zero[64];
    literal(k->slot_types[s], 0, zero, sizeof zero);
    line(e, ind, "%s s%d = %s;", ct, s, zero);
  }
}

static void stage_comment(emitter *e, int si, int ind) {
  const kir_stage *st = &e->k->stages[si];
  switch (st->kind) {
    case KIR_STAGE_REDUCE:
      line(e, ind, "/* stage %d: s%d = %s over the inner dims */", si, st->slot,
           reduce_name(st->reduce));
      break;
    case KIR_STAGE_LET:
      line(e, ind, "/* stage %d: s%d = let */", si, st->slot);
      break;
    case KIR_STAGE_STORE:
      line(e, ind, "/* stage %d: store a%d %s */", si, st->dst.arg,
           st->over_inner ? "over the inner dims" : "once per outer index");
      break;
  }
}

static void emit_point_kernel(emitter *e) {
  const kir_kernel *k = e->k;
  const mapping *m = &e->m;
  unsigned all = 0;
  for (int s = 0; s < k->n_stages; s++) all |= stage_dims(e, s);
  emit_params(e);
  if (m->total32)
    line(e, 1,
         "for (unsigned f = blockIdx.x * %du + threadIdx.x; f < %" PRId64
         "u; f += gridDim.x * %du) {",
         m->block, m->total, m->block);
  else
    line(e, 1,
         "for (unsigned long long f = (unsigned long long)blockIdx.x * %du + threadIdx.x; "
         "f < %" PRId64 "ull; f += (unsigned long long)gridDim.x * %du) {",
         m->block, m->total, m->block);
  emit_decompose(e, 2, all, 0, k->rank, "f");
  emit_slots(e, 2);
  for (int s = 0; s < k->n_stages && !e->bad; s++) {
    const kir_stage *st = &k->stages[s];
    stage_comment(e, s, 2);
    bool once = st->kind == KIR_STAGE_STORE && !st->over_inner && m->inner > 1;
    if (once)
      line(e, 2, "if (f %% %" PRId64 "u == 0) {", m->inner);
    else
      line(e, 2, "{");
    emit_prog(e, &e->progs[2 * s], 3);
    char root[32];
    root_name(&e->progs[2 * s], root, sizeof root);
    if (st->kind == KIR_STAGE_STORE)
      emit_store(e, s, 3);
    else
      line(e, 3, "s%d = %s;", st->slot, root);
    line(e, 2, "}");
  }
  line(e, 1, "}");
  line(e, 0, "}");
}

static void emit_block_kernel(emitter *e) {
  const kir_kernel *k = e->k;
  const mapping *m = &e->m;
  emit_params(e);
  bool any_reduce = false;
  for (int s = 0; s < k->n_stages; s++)
    if (k->stages[s].kind == KIR_STAGE_REDUCE) {
      line(e, 1, "__shared__ %s red%d[%d];", compute_ctype(k->stages[s].expr->type), s,
           m->block / 32);
      any_reduce = true;
    }
  unsigned outer_dims = 0;
  for (int s = 0; s < k->n_stages; s++) outer_dims |= stage_dims(e, s);
  if (m->outer32)
    line(e, 1, "for (unsigned o = blockIdx.x; o < %" PRId64 "u; o += gridDim.x) {", m->outer);
  else
    line(e, 1, "for (unsigned long long o = blockIdx.x; o < %" PRId64 "ull; o += gridDim.x) {",
         m->outer);
  emit_decompose(e, 2, outer_dims, 0, k->n_outer, "o");
  emit_slots(e, 2);
  const char *rt = m->inner32 ? "unsigned" : "unsigned long long";
  int since = 0; /* stages before `since` are ordered by a barrier already */
  for (int s = 0; s < k->n_stages && !e->bad; s++) {
    const kir_stage *st = &k->stages[s];
    bool sync = false;
    for (int j = since; j < s && !sync; j++) sync = conflict(e, j, s, true);
    if (sync) {
      line(e, 2, "__syncthreads(); /* stage %d touches what an earlier stage wrote */", s);
      since = s;
    }
    if (st->kind == KIR_STAGE_REDUCE) since = s + 1; /* its own barrier follows its loads */
    stage_comment(e, s, 2);
    unsigned dims = stage_dims(e, s);
    line(e, 2, "{");
    if (st->kind == KIR_STAGE_REDUCE) {
      emit_reduce(e, s, 3, dims);
    } else if (st->kind == KIR_STAGE_LET) {
      emit_decompose(e, 3, dims, k->n_outer, k->rank, "0u"); /* outer-only: inner indices 0 */
      emit_prog(e, &e->progs[2 * s], 3);
      char root[32];
      root_name(&e->progs[2 * s], root, sizeof root);
      line(e, 3, "s%d = %s;", st->slot, root);
    } else if (st->over_inner) {
      line(e, 3, "for (%s r = threadIdx.x; r < %" PRId64 "u; r += %du) {", rt, m->inner, m->block);
      emit_decompose(e, 4, dims, k->n_outer, k->rank, "r");
      emit_prog(e, &e->progs[2 * s], 4);
      emit_store(e, s, 4);
      line(e, 3, "}");
    } else {
      line(e, 3, "if (threadIdx.x == 0) {");
      emit_decompose(e, 4, dims, k->n_outer, k->rank, "0u");
      emit_prog(e, &e->progs[2 * s], 4);
      emit_store(e, s, 4);
      line(e, 3, "}");
    }
    line(e, 2, "}");
  }
  if (any_reduce) line(e, 2, "__syncthreads(); /* the warp partials are reused next iteration */");
  line(e, 1, "}");
  line(e, 0, "}");
}

static const char prelude[] =
    "/* Generated by dsc (codegen/cuda.c): kernel IR -> CUDA C. */\n"
    "/* bf16/f16 storage is unsigned short; conversions round to nearest even. */\n"
    "static __device__ __forceinline__ float dsc_bf16_f32(unsigned short h) {\n"
    "  return __uint_as_float((unsigned)h << 16);\n"
    "}\n"
    "static __device__ __forceinline__ unsigned short dsc_f32_bf16(float f) {\n"
    "  unsigned u = __float_as_uint(f);\n"
    "  if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);\n"
    "  u += 0x7fffu + ((u >> 16) & 1u);\n"
    "  return (unsigned short)(u >> 16);\n"
    "}\n"
    "static __device__ __forceinline__ float dsc_f16_f32(unsigned short h) {\n"
    "  float f;\n"
    "  asm(\"cvt.f32.f16 %0, %1;\" : \"=f\"(f) : \"h\"(h));\n"
    "  return f;\n"
    "}\n"
    "static __device__ __forceinline__ unsigned short dsc_f32_f16(float f) {\n"
    "  unsigned short h;\n"
    "  asm(\"cvt.rn.f16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(f));\n"
    "  return h;\n"
    "}\n"
    "/* float -> integer as kir_eval converts: truncate, NaN is 0, i32 wraps\n"
    "   modulo 2^32, i64 out of range is INT64_MIN. */\n"
    "static __device__ __forceinline__ int dsc_f64_i32(double x) {\n"
    "  if (x != x) return 0;\n"
    "  double t = trunc(x);\n"
    "  if (t >= 2147483648.0 || t < -2147483648.0) t = fmod(t, 4294967296.0);\n"
    "  return (int)(unsigned)(long long)t;\n"
    "}\n"
    "static __device__ __forceinline__ long long dsc_f64_i64(double x) {\n"
    "  if (x != x) return 0;\n"
    "  if (x >= 9223372036854775808.0 || x < -9223372036854775808.0)\n"
    "    return -9223372036854775807ll - 1;\n"
    "  return (long long)x;\n"
    "}\n"
    "/* dropout's bits, as ir_rand24 (ir/rng.c): splitmix64's output function\n"
    "   of the mixed seed plus the counter times the golden gamma, top 24 bits */\n"
    "static __device__ __forceinline__ unsigned long long dsc_mix64(unsigned long long z) {\n"
    "  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;\n"
    "  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;\n"
    "  return z ^ (z >> 31);\n"
    "}\n"
    "static __device__ __forceinline__ long long dsc_rand24(long long seed, long long c) {\n"
    "  unsigned long long z = dsc_mix64((unsigned long long)seed) +\n"
    "                         (unsigned long long)c * 0x9e3779b97f4a7c15ull;\n"
    "  return (long long)(dsc_mix64(z) >> 40);\n"
    "}\n";

static bool valid_identifier(const char *s) {
  if (!s || !*s || (*s >= '0' && *s <= '9')) return false;
  for (; *s; s++)
    if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
          *s == '_'))
      return false;
  return true;
}

/* Appends kernel k to b; false with a diagnostic on ctx when it cannot. */
/* Appends kernel k to b as a kernel named fn_name, or as a __device__
 * function of that name (device_fn); false with a diagnostic on ctx. */
static bool emit_kernel(dsc_context *ctx, sbuf *b, const kir_kernel *k, const char *fn_name,
                        bool device_fn, cg_cuda_launch *launch) {
  char err[300];
  if (!kir_validate(k, err, sizeof err)) {
    ir_error(ctx, ir_no_loc, "cuda: invalid kernel: %s", err);
    return false;
  }
  if (!valid_identifier(k->name)) {
    ir_error(ctx, ir_no_loc, "cuda: kernel name '%s' is not a C identifier", k->name);
    return false;
  }
  emitter e = {.b = b, .k = k, .fn_name = fn_name, .device_fn = device_fn};
  int np = 2 * (k->n_stages > 0 ? k->n_stages : 1);
  e.progs = calloc((size_t)np, sizeof *e.progs);
  if (!e.progs) fail(&e, "out of memory");
  for (int s = 0; s < k->n_stages && !e.bad; s++) {
    prog_build(&e, &e.progs[2 * s], k->stages[s].expr);
    if (k->stages[s].kind == KIR_STAGE_STORE)
      prog_build(&e, &e.progs[2 * s + 1], k->stages[s].dst.gather);
  }
  if (!e.bad) choose_mapping(&e, &e.m);
  if (!e.bad) {
    sb_printf(b, "\n/* %s: %s mapping, domain", fn_name,
              e.m.block_mapping ? "block-per-outer-index" : "thread-per-point");
    for (int d = 0; d < k->rank; d++) sb_printf(b, " %" PRId64, k->dims[d]);
    sb_printf(b, " (%d outer) */\n", k->n_outer);
    if (e.m.block_mapping)
      emit_block_kernel(&e);
    else
      emit_point_kernel(&e);
  }
  if (launch && !e.bad) launch_of(&e.m, launch);
  for (int i = 0; e.progs && i < np; i++) prog_free(&e.progs[i]);
  free(e.progs);
  if (b->failed && !e.bad) fail(&e, "out of memory");
  if (e.bad) {
    ir_error(ctx, ir_no_loc, "cuda: kernel %s: %s", k->name, e.err);
    return false;
  }
  return true;
}

static char *finish(ir_arena *a, sbuf *b, bool ok) {
  char *out = NULL;
  if (ok && !b->failed) out = ir_arena_strndup(a, b->p, b->len);
  if (ok && !out) ir_error(a->ctx, ir_no_loc, "cuda: out of memory");
  sb_free(b);
  return out;
}

char *cg_cuda_source(ir_arena *a, const kir_kernel *k, cg_cuda_launch *launch) {
  sbuf b = {.ctx = a->ctx};
  sb_printf(&b, "%s", prelude);
  bool ok = valid_identifier(k->name) ? emit_kernel(a->ctx, &b, k, k->name, false, launch)
                                      : emit_kernel(a->ctx, &b, k, "", false, launch);
  return finish(a, &b, ok);
}

bool cg_cuda_launch_config(dsc_context *ctx, const kir_kernel *k, cg_cuda_launch *launch) {
  emitter e = {.k = k};
  char err[300];
  if (!kir_validate(k, err, sizeof err)) {
    ir_error(ctx, ir_no_loc, "cuda: invalid kernel: %s", err);
    return false;
  }
  int np = 2 * (k->n_stages > 0 ? k->n_stages : 1);
  e.progs = calloc((size_t)np, sizeof *e.progs);
  if (!e.progs) fail(&e, "out of memory");
  for (int s = 0; s < k->n_stages && !e.bad; s++) {
    prog_build(&e, &e.progs[2 * s], k->stages[s].expr);
    if (k->stages[s].kind == KIR_STAGE_STORE)
      prog_build(&e, &e.progs[2 * s + 1], k->stages[s].dst.gather);
  }
  if (!e.bad) choose_mapping(&e, &e.m);
  if (!e.bad) launch_of(&e.m, launch);
  for (int i = 0; e.progs && i < np; i++) prog_free(&e.progs[i]);
  free(e.progs);
  if (e.bad) ir_error(ctx, ir_no_loc, "cuda: kernel %s: %s", k->name, e.err);
  return !e.bad;
}

static uint64_t text_hash(const char *p, size_t n) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)p[i]) * 1099511628211ull;
  return h;
}

/* Kernels with identical bodies (the layers of a transformer lower to the
 * same kernels over different buffers) share one __noinline__ __device__
 * function, and each named kernel is a wrapper calling it: NVVM and ptxas
 * compile every distinct body once (GPT-2's 783 kernels have 60). */
char *cg_cuda_program_source(ir_arena *a, kir_kernel *const *k, int n) {
  dsc_context *ctx = a->ctx;
  sbuf b = {.ctx = ctx};
  sb_printf(&b, "%s", prelude);
  bool ok = true;
  for (int i = 0; i < n && ok; i++) {
    if (!k[i]) {
      ir_error(ctx, ir_no_loc, "cuda: kernel %d is missing", i);
      ok = false;
    }
    for (int j = 0; j < i && ok; j++)
      if (k[i]->name && k[j]->name && strcmp(k[i]->name, k[j]->name) == 0) {
        ir_error(ctx, ir_no_loc, "cuda: two kernels named '%s' in one program", k[i]->name);
        ok = false;
      }
  }
  sbuf *body = ok && n > 0 ? calloc((size_t)n, sizeof *body) : NULL;
  uint64_t *hash = ok && n > 0 ? calloc((size_t)n, sizeof *hash) : NULL;
  int *group = ok && n > 0 ? calloc((size_t)n, sizeof *group) : NULL;
  int *uses = ok && n > 0 ? calloc((size_t)n, sizeof *uses) : NULL;
  cg_cuda_launch *launch = ok && n > 0 ? calloc((size_t)n, sizeof *launch) : NULL;
  if (ok && n > 0 && !(body && hash && group && uses && launch)) {
    ir_error(ctx, ir_no_loc, "cuda: out of memory");
    ok = false;
  }
  /* Each kernel's body under one fixed name, to find identical ones. */
  for (int i = 0; i < n && ok; i++) {
    body[i].ctx = ctx;
    ok = valid_identifier(k[i]->name) &&
         emit_kernel(ctx, &body[i], k[i], "dsc_body", true, &launch[i]);
    if (!valid_identifier(k[i]->name))
      ir_error(ctx, ir_no_loc, "cuda: kernel name '%s' is not a C identifier",
               k[i]->name ? k[i]->name : "(null)");
    if (ok && body[i].failed) {
      ir_error(ctx, ir_no_loc, "cuda: out of memory");
      ok = false;
    }
    if (!ok) break;
    hash[i] = text_hash(body[i].p, body[i].len);
    group[i] = i;
    for (int j = 0; j < i; j++)
      if (group[j] == j && hash[j] == hash[i] && body[j].len == body[i].len &&
          memcmp(body[j].p, body[i].p, body[i].len) == 0) {
        group[i] = j;
        break;
      }
    uses[group[i]]++;
  }
  for (int i = 0; i < n && ok; i++) {
    int g = group[i];
    if (uses[g] == 1) {
      ok = emit_kernel(ctx, &b, k[i], k[i]->name, false, NULL);
      continue;
    }
    char shared[32];
    snprintf(shared, sizeof shared, "dsc_shared%d", g);
    if (g == i) ok = emit_kernel(ctx, &b, k[i], shared, true, NULL);
    if (!ok) break;
    sb_printf(&b, "/* %s: the body %s */\n", k[i]->name, shared);
    sb_printf(&b, "extern \"C\" __global__ void __launch_bounds__(%u) %s", launch[i].block[0],
              k[i]->name);
    print_params(&b, k[i]);
    sb_printf(&b, " {\n  %s(", shared);
    for (int j = 0; j < k[i]->n_args; j++) sb_printf(&b, "a%d, ", j);
    sb_printf(&b, "status);\n}\n");
  }
  for (int i = 0; body && i < n; i++) sb_free(&body[i]);
  free(body);
  free(hash);
  free(group);
  free(uses);
  free(launch);
  return finish(a, &b, ok);
}

/* ---------------- NVRTC ---------------- */

dsc_status cg_nvrtc_compile(dsc_context *ctx, const char *source, const char *name, int arch,
                            char **ptx, size_t *ptx_len, void **cubin, size_t *cubin_len) {
  if (ptx) *ptx = NULL;
  if (ptx_len) *ptx_len = 0;
  if (cubin) *cubin = NULL;
  if (cubin_len) *cubin_len = 0;
#ifndef DSC_HAVE_CUDA
  (void)source;
  (void)name;
  (void)arch;
  ir_error(ctx, ir_no_loc, "cuda: this dsc was built without the CUDA toolkit (no NVRTC)");
  return DSC_ERR_USER;
#else
  if (!source) {
    ir_error(ctx, ir_no_loc, "cuda: no source to compile");
    return DSC_ERR_INTERNAL;
  }
  /* NVRTC answers an unsupported architecture with a bare "invalid option":
   * name the supported ones instead. */
  int n_archs = 0;
  bool supported = false;
  if (nvrtcGetNumSupportedArchs(&n_archs) == NVRTC_SUCCESS && n_archs > 0 && n_archs < 1000) {
    int archs[1000];
    if (nvrtcGetSupportedArchs(archs) == NVRTC_SUCCESS) {
      char list[4000];
      size_t len = 0;
      list[0] = 0;
      for (int i = 0; i < n_archs; i++) {
        if (archs[i] == arch) supported = true;
        if (len < sizeof list)
          len += (size_t)snprintf(list + len, sizeof list - len, "%s%d", i ? " " : "", archs[i]);
      }
      if (!supported) {
        ir_error(ctx, ir_no_loc, "cuda: NVRTC cannot compile for sm_%d (supported: %s)", arch,
                 list);
        return DSC_ERR_USER;
      }
    }
  }
  const char *prog_name = name ? name : "dsc_kernels.cu";
  nvrtcProgram prog;
  nvrtcResult r = nvrtcCreateProgram(&prog, source, prog_name, 0, NULL, NULL);
  if (r != NVRTC_SUCCESS) {
    ir_error(ctx, ir_no_loc, "cuda: nvrtcCreateProgram: %s", nvrtcGetErrorString(r));
    return DSC_ERR_INTERNAL;
  }
  /* One compile for a real architecture yields both the cubin and the PTX
   * it was assembled from (the same PTX a compute_XX compile gives). No
   * -use_fast_math: precise division, square root and math functions. */
  char arch_opt[64];
  snprintf(arch_opt, sizeof arch_opt, "--gpu-architecture=sm_%d", arch);
  const char *opts[4] = {arch_opt, "-default-device", "--std=c++17"};
  int n_opts = 3;
#ifdef DSC_CUDA_INCLUDE_DIR
  /* Generated kernels need no header; hand-written templates may include
   * the toolkit's (cuda_bf16.h, ...), and NVRTC has no default path. */
  opts[n_opts++] = "-I" DSC_CUDA_INCLUDE_DIR;
#endif
  r = nvrtcCompileProgram(prog, n_opts, opts);
  size_t log_size = 0;
  char *log = NULL;
  if (nvrtcGetProgramLogSize(prog, &log_size) == NVRTC_SUCCESS && log_size > 1) {
    log = ir_alloc(ctx, log_size);
    if (log && nvrtcGetProgramLog(prog, log) != NVRTC_SUCCESS) log[0] = 0;
  }
  dsc_status st = DSC_OK;
  if (r != NVRTC_SUCCESS) {
    ir_error(ctx, ir_no_loc, "cuda: NVRTC failed to compile %s for sm_%d (%s):\n%s", prog_name,
             arch, nvrtcGetErrorString(r), log ? log : "(no log)");
    st = DSC_ERR_INTERNAL;
  } else if (log && log[0]) {
    ir_diag(ctx, DSC_DIAG_WARNING, ir_no_loc, "cuda: NVRTC warnings for %s:\n%s", prog_name, log);
  }
  if (log) ir_free(ctx, log, log_size);
  if (st == DSC_OK && ptx) {
    size_t n = 0;
    r = nvrtcGetPTXSize(prog, &n);
    char *p = r == NVRTC_SUCCESS && n > 0 ? malloc(n) : NULL;
    if (p && nvrtcGetPTX(prog, p) == NVRTC_SUCCESS) {
      p[n - 1] = 0;
      *ptx = p;
      if (ptx_len) *ptx_len = strlen(p);
    } else {
      free(p);
      ir_error(ctx, ir_no_loc, "cuda: no PTX from NVRTC for %s (%s)", prog_name,
               nvrtcGetErrorString(r));
      st = DSC_ERR_INTERNAL;
    }
  }
  if (st == DSC_OK && cubin) {
    size_t n = 0;
    r = nvrtcGetCUBINSize(prog, &n);
    void *c = r == NVRTC_SUCCESS && n > 0 ? malloc(n) : NULL;
    if (c && nvrtcGetCUBIN(prog, c) == NVRTC_SUCCESS) {
      *cubin = c;
      if (cubin_len) *cubin_len = n;
    } else {
      free(c);
      ir_error(ctx, ir_no_loc, "cuda: no cubin from NVRTC for %s (%s)", prog_name,
               nvrtcGetErrorString(r));
      st = DSC_ERR_INTERNAL;
    }
  }
  nvrtcDestroyProgram(&prog);
  if (st != DSC_OK && ptx && *ptx) {
    free(*ptx);
    *ptx = NULL;
    if (ptx_len) *ptx_len = 0;
  }
  return st;
#endif
}
