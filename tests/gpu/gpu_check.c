/* dsc_gpu_check: the cuda backend against the reference interpreter on a
 * real GPU (tests/gpu/run.sh runs it on the device machine). Plain C linked
 * to libdsc: the device machine has no GoogleTest.
 *
 *   dsc_gpu_check [SOURCE_DIR]     (default: the source dir it was built from,
 *                                   or $DSC_SOURCE_DIR)
 *
 * Checks, one line each ("PASS"/"FAIL", the worst error and the tolerance):
 *  1. every op of include/dsc/ops.def that a compiled graph can hold, alone
 *     in a small graph on random inputs (never all zeros), per dtype: the
 *     cuda executor's outputs against the interpreter's;
 *  2. a kernel's index out of range (embedding) is a clean error naming it;
 *  3. the tiny GPT's fused training step (forward + backward + AdamW, one
 *     compiled program) for 3 steps: loss, grad norm, and every param and
 *     state afterwards;
 *  4. 20 training steps of the tiny GPT through the trainer on cuda and on
 *     the interpreter: the loss curves, at precision f32 and bf16.
 * Tolerances (norm-wise: max |gpu - ref| / max |ref| over a tensor; the
 * interpreter rounds to the dtype after every op, the GPU keeps f32 inside a
 * fused kernel and reduces in another order):
 *   f64 1e-12, f32 1e-5, f16 2e-3, bf16 1.6e-2, integers and bool exact;
 *   the training step (3 steps, f32) 1e-4; loss curves per step, relative,
 *   f32 1e-3 and bf16 2e-2.
 *  5. (>= 2 GPUs) the tiny GPT at world 2 on NCCL, ZeRO stages 0 and 3,
 *     against the interpreter's world-2 curve ("collectives").
 * Ops not covered alone: input and param (in every graph), the collectives
 * and local_shard (covered by 5), assign (covered by the training step).
 * Environment: DSC_CACHE_DIR (the kernel cache), DSC_GPU_CHECK_ONLY (groups
 * to run: ops,errors,step,curves,collectives), DSC_GPU_CHECK_BACKEND=cpu (a dry run of
 * the harness on the cpu backend, where there is no GPU).
 * Exit status: 0 all passed, 1 a check failed, 77 no CUDA device (skipped). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dsc/dsc.h"
#include "runtime/cuda_api.h"
#include "tests/unit/test_util.h"

static int n_pass, n_fail;
/* the backend under test: cuda; $DSC_GPU_CHECK_BACKEND=cpu runs the same
 * checks on the cpu backend (a dry run of this program where there is no GPU) */
static dsc_backend check_backend = DSC_BACKEND_CUDA;
static const char *source_dir;

static void report(bool ok, const char *name, double err, double tol, const char *extra) {
  printf("%s  %-44s err %.3g  tol %.3g%s%s\n", ok ? "PASS" : "FAIL", name, err, tol,
         extra && extra[0] ? "  " : "", extra ? extra : "");
  fflush(stdout);
  ok ? n_pass++ : n_fail++;
}

static void report_msg(bool ok, const char *name, const char *msg) {
  printf("%s  %-44s %s\n", ok ? "PASS" : "FAIL", name, msg);
  fflush(stdout);
  ok ? n_pass++ : n_fail++;
}

static void last_diags(dsc_context *ctx, char *buf, size_t n) { test_diags_join(ctx, " | ", buf, n); }

static double tol_of(dsc_dtype dt) {
  switch (dt) {
    case DSC_F64: return 1e-12;
    case DSC_F32: return 1e-5;
    case DSC_F16: return 2e-3;
    case DSC_BF16: return 1.6e-2;
    default: return 0;
  }
}

/* ---- random inputs ---- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static double uniform(void) { /* [0, 1) */
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return (double)(rng_state >> 11) / 9007199254740992.0;
}

typedef enum { IN_ANY, IN_POS, IN_NONZERO, IN_IDS } in_kind;

/* The inputs of the graph being built: the builder runs twice (interpreter
 * module, cuda module), the specs are recorded on the first run. */
#define MAX_INPUTS 8
typedef struct {
  in_kind kind;
  int64_t bound; /* IN_IDS: [0, bound) */
} in_spec;
static in_spec specs[MAX_INPUTS];
static int n_specs;

static dsc_type ty(dsc_dtype dt, int rank, const int64_t *dims) {
  return dsc_type_make(dt, rank, dims);
}

static dsc_node *input(dsc_graph *g, dsc_dtype dt, in_kind kind, int64_t bound, int rank,
                       const int64_t *dims) {
  char name[16];
  int i = dsc_graph_input_count(g);
  snprintf(name, sizeof name, "x%d", i);
  if (i < MAX_INPUTS) specs[i] = (in_spec){kind, bound};
  if (i + 1 > n_specs) n_specs = i + 1;
  return dsc_graph_input(g, name, ty(dt, rank, dims));
}
#define IN(g, dt, kind, bound, ...) \
  input(g, dt, kind, bound, (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (int64_t[]){__VA_ARGS__})

static void fill(dsc_tensor *t, in_spec s) {
  int64_t n = dsc_type_numel(&t->type);
  for (int64_t j = 0; j < n; j++) {
    double u = uniform(), v;
    switch (t->type.dtype) {
      case DSC_BOOL: v = u < 0.5; break;
      case DSC_I32:
      case DSC_I64:
        if (s.kind == IN_IDS)
          v = floor(u * (double)s.bound);
        else
          v = floor(u * 15) - 7; /* [-7, 7] */
        if (s.kind == IN_NONZERO && v == 0) v = 3;
        if (s.kind == IN_POS && v <= 0) v = 1 - v;
        break;
      default:
        v = s.kind == IN_POS ? 0.1 + 1.9 * u : 4 * u - 2;
        if (s.kind == IN_NONZERO && fabs(v) < 0.25) v = v < 0 ? -0.5 : 0.5;
        break;
    }
    /* exactly representable in the dtype: the interpreter takes the
     * doubles as given, the compiled backends store them in the dtype */
    unsigned char raw[8];
    cg_store_elem(t->type.dtype, raw, v);
    t->data[j] = cg_load_elem(t->type.dtype, raw);
  }
}

/* ---- one op, one graph ---- */

typedef dsc_node *(*build_fn)(dsc_graph *g, dsc_dtype dt);

typedef struct {
  const char *name;
  build_fn build;
  dsc_dtype dtypes[5]; /* DSC_DTYPE_COUNT ends the list */
} op_case;

static dsc_module *build_module(dsc_context *ctx, build_fn f, dsc_dtype dt) {
  dsc_module *m = dsc_module_new(ctx, "check");
  dsc_graph *g = m ? dsc_graph_new(m, "g") : NULL;
  dsc_node *out = g ? f(g, dt) : NULL;
  if (!out || dsc_graph_set_outputs(g, &out, 1) != DSC_OK) {
    dsc_module_free(m);
    return NULL;
  }
  return m;
}

/* Runs module graph "g" on both executors; compares output 0.. n. */
static void check_case(dsc_context *ctx, const op_case *c, dsc_dtype dt) {
  char name[96], diag[1500];
  snprintf(name, sizeof name, "op %s %s", c->name, dsc_dtype_name(dt));
  dsc_diag_clear(ctx);
  n_specs = 0;
  dsc_module *mi = build_module(ctx, c->build, dt), *mc = build_module(ctx, c->build, dt);
  dsc_exec *xi = NULL, *xc = NULL;
  dsc_tensor *in[MAX_INPUTS] = {0}, *oi[4] = {0}, *oc[4] = {0};
  if (!mi || !mc || dsc_run_codegen_passes(mc) != DSC_OK) {
    last_diags(ctx, diag, sizeof diag);
    report_msg(false, name, diag);
    goto out;
  }
  dsc_exec_options oi_ = {DSC_BACKEND_INTERP, 0, NULL}, oc_ = {check_backend, 0, NULL};
  if (dsc_exec_new(mi, &oi_, &xi) != DSC_OK || dsc_exec_new(mc, &oc_, &xc) != DSC_OK) {
    last_diags(ctx, diag, sizeof diag);
    report_msg(false, name, diag);
    goto out;
  }
  dsc_graph *g = dsc_module_find_graph(mi, "g");
  int n_in = dsc_graph_input_count(g);
  for (int i = 0; i < n_in && i < MAX_INPUTS; i++) {
    in[i] = dsc_tensor_new(ctx, dsc_node_type(dsc_graph_input_at(g, i)));
    if (!in[i]) goto out;
    fill(in[i], specs[i]);
  }
  if (dsc_exec_run(xi, "g", (const dsc_tensor *const *)in, n_in, oi) != DSC_OK ||
      dsc_exec_run(xc, "g", (const dsc_tensor *const *)in, n_in, oc) != DSC_OK) {
    last_diags(ctx, diag, sizeof diag);
    report_msg(false, name, diag);
    goto out;
  }
  dsc_dtype od = oi[0]->type.dtype;
  double tol = tol_of(od);
  test_diff d = test_compare(oi[0]->data, oc[0]->data, dsc_type_numel(&oi[0]->type));
  double worst = tol > 0 ? test_normwise(d) : d.err;
  int64_t bad_at = d.at;
  bool nonzero = d.nonzero;
  char extra[200] = "";
  if (worst > tol && bad_at >= 0)
    snprintf(extra, sizeof extra, "at %lld: gpu %.9g, interp %.9g", (long long)bad_at,
             oc[0]->data[bad_at], oi[0]->data[bad_at]);
  else if (!nonzero && od != DSC_BOOL)
    snprintf(extra, sizeof extra, "(reference all zeros: a weak check)");
  report(worst <= tol, name, worst, tol, extra);
out:
  for (int i = 0; i < MAX_INPUTS; i++) dsc_tensor_free(ctx, in[i]);
  for (int i = 0; i < 4; i++) dsc_tensor_free(ctx, oi[i]), dsc_tensor_free(ctx, oc[i]);
  dsc_exec_free(xi);
  dsc_exec_free(xc);
  dsc_module_free(mi);
  dsc_module_free(mc);
}

/* ---- the builders ---- */

static dsc_node *b_const(dsc_graph *g, dsc_dtype dt) {
  dsc_attr a[3] = {dsc_attr_float("value", dt == DSC_I32 ? 7 : 1.375), dsc_attr_dtype("dtype", dt),
                   dsc_attr_ints("shape", (int64_t[]){3, 5}, 2)};
  /* plus an input, so that the graph does something with data */
  dsc_node *c = dsc_build(g, DSC_OP_CONST, NULL, 0, a, 3);
  return dsc_binary(g, DSC_OP_ADD, c, IN(g, dt, IN_ANY, 0, 3, 5));
}
static dsc_node *b_iota(dsc_graph *g, dsc_dtype dt) {
  dsc_attr a[3] = {dsc_attr_int("axis", 1), dsc_attr_dtype("dtype", dt),
                   dsc_attr_ints("shape", (int64_t[]){4, 6, 3}, 3)};
  dsc_node *c = dsc_build(g, DSC_OP_IOTA, NULL, 0, a, 3);
  return dsc_binary(g, DSC_OP_MUL, c, IN(g, dt, IN_ANY, 0, 4, 6, 3));
}
#define BINARY(fn, op, kind_b)                                                 \
  static dsc_node *fn(dsc_graph *g, dsc_dtype dt) {                            \
    dsc_node *a = IN(g, dt, IN_ANY, 0, 4, 1, 6), *b = IN(g, dt, kind_b, 0, 5, 6); \
    return dsc_binary(g, op, a, b);                                            \
  }
BINARY(b_add, DSC_OP_ADD, IN_ANY)
BINARY(b_sub, DSC_OP_SUB, IN_ANY)
BINARY(b_mul, DSC_OP_MUL, IN_ANY)
BINARY(b_div, DSC_OP_DIV, IN_NONZERO)
BINARY(b_maximum, DSC_OP_MAXIMUM, IN_ANY)
BINARY(b_less, DSC_OP_LESS, IN_ANY)
BINARY(b_greater, DSC_OP_GREATER, IN_ANY)
BINARY(b_equal, DSC_OP_EQUAL, IN_ANY)
static dsc_node *b_where(dsc_graph *g, dsc_dtype dt) {
  dsc_node *c = IN(g, DSC_BOOL, IN_ANY, 0, 4, 6), *a = IN(g, dt, IN_ANY, 0, 4, 6),
           *b = IN(g, dt, IN_ANY, 0, 6);
  return dsc_build(g, DSC_OP_WHERE, (dsc_node *[]){c, a, b}, 3, NULL, 0);
}
#define UNARY(fn, op, kind)                                 \
  static dsc_node *fn(dsc_graph *g, dsc_dtype dt) {         \
    return dsc_unary(g, op, IN(g, dt, kind, 0, 7, 33));     \
  }
UNARY(b_neg, DSC_OP_NEG, IN_ANY)
UNARY(b_exp, DSC_OP_EXP, IN_ANY)
UNARY(b_log, DSC_OP_LOG, IN_POS)
UNARY(b_sqrt, DSC_OP_SQRT, IN_POS)
UNARY(b_rsqrt, DSC_OP_RSQRT, IN_POS)
UNARY(b_tanh, DSC_OP_TANH, IN_ANY)
UNARY(b_relu, DSC_OP_RELU, IN_ANY)
UNARY(b_gelu, DSC_OP_GELU, IN_ANY)
UNARY(b_softplus, DSC_OP_SOFTPLUS, IN_ANY)
UNARY(b_silu, DSC_OP_SILU, IN_ANY)
UNARY(b_sigmoid, DSC_OP_SIGMOID, IN_ANY)
UNARY(b_sin, DSC_OP_SIN, IN_ANY)
UNARY(b_cos, DSC_OP_COS, IN_ANY)
static dsc_node *b_pow(dsc_graph *g, dsc_dtype dt) {
  dsc_attr a = dsc_attr_float("exponent", 1.5);
  return dsc_build(g, DSC_OP_POW, (dsc_node *[]){IN(g, dt, IN_POS, 0, 7, 33)}, 1, &a, 1);
}
/* casts from dt to a fixed set of targets, all in one output: cast to f32 */
static dsc_node *b_cast_to_i32(dsc_graph *g, dsc_dtype dt) {
  return dsc_cast(g, IN(g, dt, IN_ANY, 0, 6, 9), DSC_I32);
}
static dsc_node *b_cast_to_bf16(dsc_graph *g, dsc_dtype dt) {
  return dsc_cast(g, IN(g, dt, IN_ANY, 0, 6, 9), DSC_BF16);
}
static dsc_node *b_cast_to_f32(dsc_graph *g, dsc_dtype dt) {
  return dsc_cast(g, IN(g, dt, IN_ANY, 0, 6, 9), DSC_F32);
}
static dsc_node *b_cast_to_bool(dsc_graph *g, dsc_dtype dt) {
  return dsc_cast(g, IN(g, dt, IN_ANY, 0, 6, 9), DSC_BOOL);
}
static dsc_node *reduce(dsc_graph *g, dsc_dtype dt, dsc_op op, const int64_t *axes, int n,
                        int keep) {
  return dsc_reduce(g, op, IN(g, dt, IN_ANY, 0, 5, 37, 6), axes, n, keep);
}
static dsc_node *b_sum1(dsc_graph *g, dsc_dtype dt) {
  return reduce(g, dt, DSC_OP_SUM, (int64_t[]){1}, 1, 0);
}
static dsc_node *b_sum02(dsc_graph *g, dsc_dtype dt) {
  return reduce(g, dt, DSC_OP_SUM, (int64_t[]){0, 2}, 2, 1);
}
static dsc_node *b_sum_all(dsc_graph *g, dsc_dtype dt) {
  return reduce(g, dt, DSC_OP_SUM, (int64_t[]){0, 1, 2}, 3, 0);
}
static dsc_node *b_mean2(dsc_graph *g, dsc_dtype dt) {
  return reduce(g, dt, DSC_OP_MEAN, (int64_t[]){2}, 1, 1);
}
static dsc_node *b_max1(dsc_graph *g, dsc_dtype dt) {
  return reduce(g, dt, DSC_OP_MAX, (int64_t[]){1}, 1, 0);
}
static dsc_node *b_sum_none(dsc_graph *g, dsc_dtype dt) {
  return reduce(g, dt, DSC_OP_SUM, NULL, 0, 0);
}
/* layout ops, each followed by exp so that a kernel reads the view */
static dsc_node *b_reshape(dsc_graph *g, dsc_dtype dt) {
  return dsc_unary(g, DSC_OP_EXP, dsc_reshape(g, IN(g, dt, IN_ANY, 0, 4, 6, 5), (int64_t[]){24, 5}, 2));
}
static dsc_node *b_permute(dsc_graph *g, dsc_dtype dt) {
  return dsc_unary(g, DSC_OP_EXP,
                   dsc_permute(g, IN(g, dt, IN_ANY, 0, 4, 6, 5), (int64_t[]){2, 0, 1}, 3));
}
static dsc_node *b_permute_only(dsc_graph *g, dsc_dtype dt) {
  return dsc_permute(g, IN(g, dt, IN_ANY, 0, 4, 6, 5), (int64_t[]){1, 2, 0}, 3);
}
static dsc_node *b_slice(dsc_graph *g, dsc_dtype dt) {
  dsc_attr a[3] = {dsc_attr_int("axis", 1), dsc_attr_int("start", 2), dsc_attr_int("end", 7)};
  return dsc_build(g, DSC_OP_SLICE, (dsc_node *[]){IN(g, dt, IN_ANY, 0, 3, 9, 4)}, 1, a, 3);
}
static dsc_node *b_concat(dsc_graph *g, dsc_dtype dt) {
  dsc_attr a = dsc_attr_int("axis", 1);
  dsc_node *x = IN(g, dt, IN_ANY, 0, 3, 2, 4), *y = IN(g, dt, IN_ANY, 0, 3, 5, 4);
  return dsc_build(g, DSC_OP_CONCAT, (dsc_node *[]){x, dsc_unary(g, DSC_OP_NEG, y), x}, 3, &a, 1);
}
static dsc_node *b_broadcast(dsc_graph *g, dsc_dtype dt) {
  dsc_attr a = dsc_attr_ints("shape", (int64_t[]){3, 4, 5}, 3);
  return dsc_build(g, DSC_OP_BROADCAST, (dsc_node *[]){IN(g, dt, IN_ANY, 0, 4, 1)}, 1, &a, 1);
}
static dsc_node *b_embedding(dsc_graph *g, dsc_dtype dt) {
  dsc_node *table = IN(g, dt, IN_ANY, 0, 16, 8), *ids = IN(g, DSC_I32, IN_IDS, 16, 3, 5);
  return dsc_build(g, DSC_OP_EMBEDDING, (dsc_node *[]){table, ids}, 2, NULL, 0);
}
static dsc_node *b_embedding_grad(dsc_graph *g, dsc_dtype dt) {
  dsc_attr a = dsc_attr_int("rows", 12);
  dsc_node *ids = IN(g, DSC_I64, IN_IDS, 12, 4, 9), *dy = IN(g, dt, IN_ANY, 0, 4, 9, 6);
  return dsc_build(g, DSC_OP_EMBEDDING_GRAD, (dsc_node *[]){ids, dy}, 2, &a, 1);
}
static dsc_node *b_matmul(dsc_graph *g, dsc_dtype dt) {
  return dsc_matmul(g, IN(g, dt, IN_ANY, 0, 2, 3, 5, 24), IN(g, dt, IN_ANY, 0, 24, 7));
}
static dsc_node *b_matmul_t(dsc_graph *g, dsc_dtype dt) { /* a transposed operand: strides */
  dsc_node *b = dsc_permute(g, IN(g, dt, IN_ANY, 0, 40, 32), (int64_t[]){1, 0}, 2);
  return dsc_matmul(g, IN(g, dt, IN_ANY, 0, 16, 32), b);
}
static dsc_node *b_matmul_big(dsc_graph *g, dsc_dtype dt) {
  return dsc_matmul(g, IN(g, dt, IN_ANY, 0, 128, 256), IN(g, dt, IN_ANY, 0, 256, 96));
}
static dsc_node *b_softmax(dsc_graph *g, dsc_dtype dt) {
  dsc_attr a = dsc_attr_int("axis", 1);
  return dsc_build(g, DSC_OP_SOFTMAX, (dsc_node *[]){IN(g, dt, IN_ANY, 0, 4, 50)}, 1, &a, 1);
}
static dsc_node *b_softmax0(dsc_graph *g, dsc_dtype dt) {
  dsc_attr a = dsc_attr_int("axis", 0);
  return dsc_build(g, DSC_OP_SOFTMAX, (dsc_node *[]){IN(g, dt, IN_ANY, 0, 9, 5)}, 1, &a, 1);
}
static dsc_node *b_log_softmax(dsc_graph *g, dsc_dtype dt) {
  dsc_attr a = dsc_attr_int("axis", 1);
  return dsc_build(g, DSC_OP_LOG_SOFTMAX, (dsc_node *[]){IN(g, dt, IN_ANY, 0, 4, 50)}, 1, &a, 1);
}
static dsc_node *b_layernorm(dsc_graph *g, dsc_dtype dt) {
  dsc_attr a = dsc_attr_float("eps", 1e-5);
  dsc_node *x = IN(g, dt, IN_ANY, 0, 3, 4, 32), *w = IN(g, dt, IN_ANY, 0, 32),
           *b = IN(g, dt, IN_ANY, 0, 32);
  return dsc_build(g, DSC_OP_LAYERNORM, (dsc_node *[]){x, w, b}, 3, &a, 1);
}
static dsc_node *b_rmsnorm(dsc_graph *g, dsc_dtype dt) {
  dsc_attr a = dsc_attr_float("eps", 1e-6);
  dsc_node *x = IN(g, dt, IN_ANY, 0, 3, 4, 32), *w = IN(g, dt, IN_ANY, 0, 32);
  return dsc_build(g, DSC_OP_RMSNORM, (dsc_node *[]){x, w}, 2, &a, 1);
}
static dsc_node *attention(dsc_graph *g, dsc_dtype dt, int causal) {
  dsc_node *q = IN(g, dt, IN_ANY, 0, 2, 8, 16), *k = IN(g, dt, IN_ANY, 0, 2, 8, 16),
           *v = IN(g, dt, IN_ANY, 0, 2, 8, 16);
  return dsc_attention(g, q, k, v, 2, 2, causal, 0);
}
static dsc_node *b_attention_causal(dsc_graph *g, dsc_dtype dt) { return attention(g, dt, 1); }
static dsc_node *b_attention(dsc_graph *g, dsc_dtype dt) { return attention(g, dt, 0); }
/* grouped-query: 4 query heads on 2 key/value heads, 10 keys for 8 queries */
static dsc_node *b_attention_gqa(dsc_graph *g, dsc_dtype dt) {
  dsc_node *q = IN(g, dt, IN_ANY, 0, 2, 8, 32), *k = IN(g, dt, IN_ANY, 0, 2, 10, 16),
           *v = IN(g, dt, IN_ANY, 0, 2, 10, 16);
  return dsc_attention(g, q, k, v, 4, 2, 1, 0);
}
static dsc_node *b_rope(dsc_graph *g, dsc_dtype dt) {
  dsc_node *x = IN(g, dt, IN_ANY, 0, 2, 8, 32), *p = IN(g, DSC_I32, IN_IDS, 64, 2, 8);
  return dsc_rope(g, x, p, 4, 10000.0, false);
}
static dsc_node *b_rope_interleaved(dsc_graph *g, dsc_dtype dt) {
  dsc_node *x = IN(g, dt, IN_ANY, 0, 2, 8, 32), *p = IN(g, DSC_I32, IN_IDS, 64, 8);
  return dsc_rope(g, x, p, 2, 500000.0, true);
}
static dsc_node *b_cross_entropy(dsc_graph *g, dsc_dtype dt) {
  dsc_node *l = IN(g, dt, IN_ANY, 0, 2, 5, 11), *t = IN(g, DSC_I32, IN_IDS, 11, 2, 5);
  return dsc_build(g, DSC_OP_CROSS_ENTROPY, (dsc_node *[]){l, t}, 2, NULL, 0);
}
/* a fused elementwise chain with a reduction (one kernel after fusion) */
static dsc_node *b_fused(dsc_graph *g, dsc_dtype dt) {
  dsc_node *x = IN(g, dt, IN_ANY, 0, 6, 40), *y = IN(g, dt, IN_ANY, 0, 40);
  dsc_node *t = dsc_unary(g, DSC_OP_GELU, dsc_binary(g, DSC_OP_MUL, x, y));
  dsc_node *s = dsc_reduce(g, DSC_OP_SUM, dsc_unary(g, DSC_OP_EXP, t), (int64_t[]){1}, 1, 1);
  return dsc_binary(g, DSC_OP_DIV, dsc_unary(g, DSC_OP_TANH, t), s);
}

#define END DSC_DTYPE_COUNT
#define FLOATS {DSC_F32, DSC_BF16, DSC_F16, DSC_F64, END}
static const op_case cases[] = {
    {"const", b_const, {DSC_F32, DSC_I32, END}},
    {"iota", b_iota, {DSC_F32, DSC_I64, END}},
    {"add", b_add, {DSC_F32, DSC_BF16, DSC_F16, DSC_I32, END}},
    {"sub", b_sub, {DSC_F32, DSC_BF16, DSC_I64, END}},
    {"mul", b_mul, {DSC_F32, DSC_F16, DSC_I32, END}},
    {"div", b_div, {DSC_F32, DSC_BF16, DSC_I32, DSC_I64, END}},
    {"maximum", b_maximum, {DSC_F32, DSC_BF16, DSC_I32, END}},
    {"less", b_less, {DSC_F32, DSC_I32, END}},
    {"greater", b_greater, {DSC_F32, DSC_BF16, END}},
    {"equal", b_equal, {DSC_I32, DSC_F32, END}},
    {"where", b_where, {DSC_F32, DSC_BF16, DSC_I32, END}},
    {"neg", b_neg, {DSC_F32, DSC_BF16, DSC_I32, END}},
    {"exp", b_exp, FLOATS},
    {"log", b_log, FLOATS},
    {"sqrt", b_sqrt, FLOATS},
    {"rsqrt", b_rsqrt, FLOATS},
    {"tanh", b_tanh, FLOATS},
    {"relu", b_relu, {DSC_F32, DSC_BF16, DSC_I32, END}},
    {"gelu", b_gelu, FLOATS},
    {"softplus", b_softplus, FLOATS},
    {"silu", b_silu, FLOATS},
    {"sigmoid", b_sigmoid, FLOATS},
    {"sin", b_sin, FLOATS},
    {"cos", b_cos, FLOATS},
    {"pow", b_pow, FLOATS},
    {"cast->i32", b_cast_to_i32, {DSC_F32, DSC_BF16, DSC_F64, DSC_I64, END}},
    {"cast->bf16", b_cast_to_bf16, {DSC_F32, DSC_F16, DSC_I32, END}},
    {"cast->f32", b_cast_to_f32, {DSC_BF16, DSC_F16, DSC_F64, DSC_I32, END}},
    {"cast->bool", b_cast_to_bool, {DSC_F32, DSC_I32, END}},
    {"sum axis 1", b_sum1, {DSC_F32, DSC_BF16, DSC_F64, DSC_I32, END}},
    {"sum axes 0,2 keepdims", b_sum02, {DSC_F32, DSC_F16, END}},
    {"sum all", b_sum_all, {DSC_F32, DSC_BF16, END}},
    {"sum no axes", b_sum_none, {DSC_F32, END}},
    {"mean axis 2", b_mean2, {DSC_F32, DSC_BF16, END}},
    {"max axis 1", b_max1, {DSC_F32, DSC_BF16, DSC_I64, END}},
    {"attention grouped-query", b_attention_gqa, {DSC_F32, DSC_BF16, END}},
    {"rope", b_rope, {DSC_F32, DSC_BF16, END}},
    {"rope interleaved", b_rope_interleaved, {DSC_F32, END}},
    {"reshape", b_reshape, {DSC_F32, DSC_BF16, END}},
    {"permute", b_permute, {DSC_F32, DSC_F16, END}},
    {"permute (output)", b_permute_only, {DSC_F32, DSC_I32, END}},
    {"slice", b_slice, {DSC_F32, DSC_I64, END}},
    {"concat", b_concat, {DSC_F32, DSC_BF16, END}},
    {"broadcast", b_broadcast, {DSC_F32, DSC_BOOL, END}},
    {"embedding", b_embedding, {DSC_F32, DSC_BF16, END}},
    {"embedding_grad", b_embedding_grad, {DSC_F32, DSC_BF16, DSC_F16, DSC_F64, END}},
    {"matmul batched", b_matmul, {DSC_F32, DSC_BF16, DSC_F16, END}},
    {"matmul transposed b", b_matmul_t, {DSC_F32, DSC_BF16, END}},
    {"matmul 128x256x96", b_matmul_big, {DSC_F32, DSC_BF16, DSC_F16, END}},
    {"softmax axis 1", b_softmax, {DSC_F32, DSC_BF16, DSC_F16, END}},
    {"softmax axis 0", b_softmax0, {DSC_F32, END}},
    {"log_softmax", b_log_softmax, {DSC_F32, DSC_BF16, END}},
    {"layernorm", b_layernorm, {DSC_F32, DSC_BF16, END}},
    {"rmsnorm", b_rmsnorm, {DSC_F32, DSC_BF16, END}},
    {"attention causal", b_attention_causal, {DSC_F32, DSC_BF16, END}},
    {"attention", b_attention, {DSC_F32, END}},
    {"cross_entropy", b_cross_entropy, {DSC_F32, DSC_BF16, END}},
    {"fused gelu/exp/sum/tanh/div", b_fused, {DSC_F32, DSC_BF16, END}},
};

/* ---- a kernel's index out of range ---- */

static void check_bad_index(dsc_context *ctx) {
  const char *name = "embedding id out of range is an error";
  dsc_diag_clear(ctx);
  n_specs = 0;
  dsc_module *m = build_module(ctx, b_embedding, DSC_F32);
  dsc_exec *x = NULL;
  dsc_tensor *in[2] = {0}, *out[1] = {0};
  char diag[1500];
  dsc_exec_options o = {check_backend, 0, NULL};
  if (!m || dsc_run_codegen_passes(m) != DSC_OK || dsc_exec_new(m, &o, &x) != DSC_OK) {
    last_diags(ctx, diag, sizeof diag);
    report_msg(false, name, diag);
    goto out;
  }
  dsc_graph *g = dsc_module_find_graph(m, "g");
  for (int i = 0; i < 2; i++) {
    in[i] = dsc_tensor_new(ctx, dsc_node_type(dsc_graph_input_at(g, i)));
    fill(in[i], specs[i]);
  }
  in[1]->data[7] = 99; /* V = 16 */
  dsc_status st = dsc_exec_run(x, "g", (const dsc_tensor *const *)in, 2, out);
  last_diags(ctx, diag, sizeof diag);
  bool ok = st == DSC_ERR_USER && strstr(diag, "out of range") && !out[0];
  report_msg(ok, name, diag);
  /* and the executor still works afterwards */
  dsc_diag_clear(ctx);
  in[1]->data[7] = 3;
  st = dsc_exec_run(x, "g", (const dsc_tensor *const *)in, 2, out);
  last_diags(ctx, diag, sizeof diag);
  report_msg(st == DSC_OK, "runs again after a kernel error", st == DSC_OK ? "" : diag);
out:
  for (int i = 0; i < 2; i++) dsc_tensor_free(ctx, in[i]);
  dsc_tensor_free(ctx, out[0]);
  dsc_exec_free(x);
  dsc_module_free(m);
}

/* ---- the tiny GPT's fused training step ---- */

/* Adam's first steps are lr * sign(g) with eps = 1e-8: a gradient that is
 * zero up to rounding then moves by +-lr on either backend (exec_test.cc);
 * eps = 1e-3 keeps the update a smooth function of g */
static dsc_module *tiny_step(dsc_context *ctx, const char *stop_after) {
  test_tiny_options o = {.source_dir = source_dir, .stop_after = stop_after, .adam_eps = 1e-3};
  return test_tiny_step(ctx, &o);
}

static void check_train_step(dsc_context *ctx) {
  const double tol = 1e-4;
  char diag[1500];
  dsc_diag_clear(ctx);
  dsc_module *mi = tiny_step(ctx, "optimizer"), *mc = tiny_step(ctx, NULL);
  dsc_exec *xi = NULL, *xc = NULL;
  dsc_params *pi = NULL, *pc = NULL;
  dsc_exec_options oi = {DSC_BACKEND_INTERP, 0, NULL}, oc = {check_backend, 0, NULL};
  if (!mi || !mc || dsc_exec_new(mi, &oi, &xi) != DSC_OK || dsc_exec_new(mc, &oc, &xc) != DSC_OK) {
    last_diags(ctx, diag, sizeof diag);
    report_msg(false, "gpt-tiny train step: compile", diag);
    goto out;
  }
  pi = dsc_params_init(mi, 5), pc = dsc_params_init(mc, 5);
  if (!pi || !pc || dsc_exec_set_params(xi, pi) != DSC_OK || dsc_exec_set_params(xc, pc) != DSC_OK) {
    last_diags(ctx, diag, sizeof diag);
    report_msg(false, "gpt-tiny train step: params in", diag);
    goto out;
  }
  /* params in and straight out unchanged (the dtype round trip is exact: f32) */
  {
    dsc_params *back = dsc_params_init(mc, 99);
    bool same = back && dsc_exec_get_params(xc, back) == DSC_OK;
    for (int p = 0; same && p < dsc_params_count(pc); p++) {
      const dsc_tensor *a = dsc_params_get(pc, p), *b = dsc_params_get(back, p);
      for (int64_t j = 0; same && j < dsc_type_numel(&a->type); j++)
        same = (float)a->data[j] == (float)b->data[j];
    }
    report_msg(same, "params in and out unchanged", same ? "" : "differ");
    dsc_params_free(back);
  }
  const dsc_graph *g = dsc_module_find_graph(mc, "train_step");
  for (int step = 0; step < 3; step++) {
    dsc_tensor *in[3];
    for (int i = 0; i < 3; i++) in[i] = dsc_tensor_new(ctx, dsc_node_type(dsc_graph_input_at(g, i)));
    int64_t n = dsc_type_numel(&in[0]->type);
    for (int64_t j = 0; j < n; j++)
      in[0]->data[j] = floor(uniform() * 256), in[1]->data[j] = floor(uniform() * 256);
    in[2]->data[0] = (double)(float)1e-3;
    dsc_tensor *ri[2] = {0}, *rc[2] = {0};
    bool ran = dsc_exec_run_step(xi, (const dsc_tensor *const *)in, 3, ri) == DSC_OK &&
               dsc_exec_run_step(xc, (const dsc_tensor *const *)in, 3, rc) == DSC_OK;
    char name[80];
    if (!ran) {
      last_diags(ctx, diag, sizeof diag);
      snprintf(name, sizeof name, "gpt-tiny train step %d: run", step + 1);
      report_msg(false, name, diag);
    } else {
      for (int k = 0; k < 2; k++) {
        double e = fabs(rc[k]->data[0] - ri[k]->data[0]) / fmax(fabs(ri[k]->data[0]), 1e-30);
        char extra[100];
        snprintf(extra, sizeof extra, "gpu %.8g, interp %.8g", rc[k]->data[0], ri[k]->data[0]);
        snprintf(name, sizeof name, "gpt-tiny train step %d: %s", step + 1,
                 k == 0 ? "loss" : "grad norm");
        report(e <= tol, name, e, tol, extra);
      }
    }
    for (int k = 0; k < 2; k++) dsc_tensor_free(ctx, ri[k]), dsc_tensor_free(ctx, rc[k]);
    for (int i = 0; i < 3; i++) dsc_tensor_free(ctx, in[i]);
    if (!ran) goto out;
  }
  if (dsc_exec_get_params(xi, pi) != DSC_OK || dsc_exec_get_params(xc, pc) != DSC_OK) {
    last_diags(ctx, diag, sizeof diag);
    report_msg(false, "gpt-tiny train step: params out", diag);
    goto out;
  }
  double worst = 0;
  const char *worst_name = "";
  int moved = 0;
  for (int p = 0; p < dsc_params_count(pi); p++) {
    const dsc_tensor *a = dsc_params_get(pi, p), *b = dsc_params_get(pc, p);
    test_diff d = test_compare(a->data, b->data, dsc_type_numel(&a->type));
    double e = test_normwise(d);
    /* Adam's second moments are squares of gradients: twice the relative error */
    if (strncmp(dsc_module_param_name(mi, p), "opt.v.", 6) == 0) e /= 2;
    if (e > worst) worst = e, worst_name = dsc_module_param_name(mi, p);
    moved += d.scale > 0;
  }
  char extra[160];
  snprintf(extra, sizeof extra, "worst: %s; %d of %d params/states non-zero", worst_name, moved,
           dsc_params_count(pi));
  report(worst <= tol && moved > 10, "gpt-tiny train step: params and states after 3", worst, tol,
         extra);
out:
  dsc_params_free(pi);
  dsc_params_free(pc);
  dsc_exec_free(xi);
  dsc_exec_free(xc);
  dsc_module_free(mi);
  dsc_module_free(mc);
}

/* ---- loss curves through the trainer ---- */

static bool write_data(dsc_context *ctx, const char *prefix) {
  /* English-like bytes: a short text repeated with a varying offset, so
   * that the model learns in a few steps */
  static const char text[] =
      "the quick brown fox jumps over the lazy dog. a tiny model learns to spell the "
      "words it sees again and again, and its loss falls step after step. ";
  int64_t n = 1 << 16;
  uint16_t *tok = malloc(sizeof *tok * (size_t)n);
  if (!tok) return false;
  size_t len = sizeof text - 1;
  for (int64_t i = 0; i < n; i++) tok[i] = (uint16_t)(unsigned char)text[(i + i / 997) % len];
  char path[4400];
  bool ok = true;
  for (int k = 0; k < 2 && ok; k++) {
    snprintf(path, sizeof path, "%s_%s.bin", prefix, k ? "val" : "train");
    ok = dsc_shard_write(ctx, path, tok, n) == DSC_OK;
  }
  free(tok);
  return ok;
}

static bool train_curve(dsc_context *ctx, const char *data, const char *backend,
                        const char *precision, int steps, double *loss, char *diag, size_t n) {
  char model[4096];
  snprintf(model, sizeof model, "%s/examples/gpt-tiny.dsm", source_dir);
  dsc_trainer_options o;
  memset(&o, 0, sizeof o);
  o.model_path = model;
  o.data_prefix = data;
  o.batch = 4, o.seq = 64, o.grad_accum = 1, o.steps = steps;
  o.save_every = -1, o.eval_every = 0;
  o.has_seed = true, o.seed = 1234;
  o.precision = precision;
  o.backend = backend;
  dsc_trainer *t = NULL;
  dsc_diag_clear(ctx);
  if (dsc_trainer_open(ctx, &o, &t) != DSC_OK) {
    last_diags(ctx, diag, n);
    return false;
  }
  bool ok = true;
  for (int s = 0; s < steps && ok; s++) {
    dsc_train_progress p;
    ok = dsc_trainer_step(t, &p) == DSC_OK;
    loss[s] = ok ? p.loss : NAN;
  }
  if (!ok) last_diags(ctx, diag, n);
  dsc_trainer_free(t);
  return ok;
}

/* A scratch dir (dir: a mkdtemp template) with the token data at
 * prefix; false after reporting why not (what: the check's name). */
static bool scratch_data(dsc_context *ctx, const char *what, char *dir, char *prefix, size_t n) {
  char name[100], diag[1500];
  if (!mkdtemp(dir)) {
    snprintf(name, sizeof name, "%s: scratch dir", what);
    report_msg(false, name, "mkdtemp failed");
    return false;
  }
  snprintf(prefix, n, "%s/tokens", dir);
  if (!write_data(ctx, prefix)) {
    last_diags(ctx, diag, sizeof diag);
    snprintf(name, sizeof name, "%s: data", what);
    report_msg(false, name, diag);
    return false;
  }
  return true;
}

static void check_loss_curves(dsc_context *ctx) {
  enum { STEPS = 20 };
  char dir[] = "/tmp/dsc_gpu_check.XXXXXX", prefix[200], diag[1500];
  if (!scratch_data(ctx, "loss curves", dir, prefix, sizeof prefix)) return;
  static const struct {
    const char *precision;
    double tol;
  } runs[] = {{"f32", 1e-3}, {"bf16", 2e-2}};
  for (int r = 0; r < 2; r++) {
    double li[STEPS], lc[STEPS];
    char name[80];
    snprintf(name, sizeof name, "gpt-tiny %d steps %s: loss curve", STEPS, runs[r].precision);
    if (!train_curve(ctx, prefix, "interp", runs[r].precision, STEPS, li, diag, sizeof diag) ||
        !train_curve(ctx, prefix, dsc_backend_name(check_backend), runs[r].precision, STEPS, lc, diag, sizeof diag)) {
      report_msg(false, name, diag);
      continue;
    }
    int at = 0;
    double worst = test_curve_diff(li, lc, STEPS, &at);
    bool learned = lc[STEPS - 1] < lc[0] - 0.3;
    char extra[200];
    int len = snprintf(extra, sizeof extra, "step 1 %.4f/%.4f, step %d %.4f/%.4f (gpu/interp)",
                       lc[0], li[0], STEPS, lc[STEPS - 1], li[STEPS - 1]);
    if (worst > runs[r].tol && len > 0 && (size_t)len < sizeof extra)
      len += snprintf(extra + len, sizeof extra - (size_t)len, "; worst at step %d", at + 1);
    if (!learned && len > 0 && (size_t)len < sizeof extra)
      snprintf(extra + len, sizeof extra - (size_t)len, "; did not learn");
    report(worst <= runs[r].tol && learned, name, worst, runs[r].tol, extra);
  }
  char cmd[200];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) fprintf(stderr, "gpu_check: could not remove %s\n", dir);
}

/* ---- collectives: world 2 on two GPUs (NCCL), in-process ranks ---- */

typedef struct {
  const char *data, *backend;
  int stage, steps;
  double loss[2][20]; /* per rank */
} coll_job;

static dsc_status coll_rank(dsc_comm *comm, void *ud) {
  coll_job *j = ud;
  dsc_context *ctx = dsc_comm_context(comm);
  char model[4096];
  snprintf(model, sizeof model, "%s/examples/gpt-tiny.dsm", source_dir);
  dsc_trainer_options o;
  memset(&o, 0, sizeof o);
  o.model_path = model;
  o.data_prefix = j->data;
  o.batch = 2, o.seq = 64, o.grad_accum = 1, o.steps = j->steps;
  o.save_every = -1, o.eval_every = 0;
  o.has_seed = true, o.seed = 1234;
  o.precision = "f32";
  o.backend = j->backend;
  o.comm = comm;
  o.knobs.has_zero_stage = true, o.knobs.zero_stage = j->stage;
  dsc_trainer *t = NULL;
  dsc_status st = dsc_trainer_open(ctx, &o, &t);
  for (int s = 0; s < j->steps && st == DSC_OK; s++) {
    dsc_train_progress p;
    st = dsc_trainer_step(t, &p);
    j->loss[dsc_comm_rank(comm)][s] = st == DSC_OK ? p.loss : NAN;
  }
  dsc_trainer_free(t);
  return st;
}

/* gpt-tiny at world 2 (one thread and one GPU per rank, NCCL) at ZeRO
 * stages 0 and 3 against the interpreter's world-2 curve (the same ranks
 * through the in-process communicator): 10 steps, relative 1e-3 (f32). */
static void check_collectives(dsc_context *ctx) {
  enum { STEPS = 10 };
  const double tol = 1e-3;
  int n_dev = 0;
  const rt_cuda_api *api = check_backend == DSC_BACKEND_CUDA ? rt_cuda_api_get(NULL, 0) : NULL;
  if (api && api->DeviceGetCount(&n_dev) != CUDA_SUCCESS) n_dev = 0;
  if (check_backend == DSC_BACKEND_CUDA && n_dev < 2) {
    printf("collectives: skipped (%d GPU)\n", n_dev);
    return;
  }
  char dir[] = "/tmp/dsc_gpu_check_coll.XXXXXX", prefix[200], diag[1500];
  if (!scratch_data(ctx, "collectives", dir, prefix, sizeof prefix)) return;
  static const int stages[2] = {0, 3};
  for (int k = 0; k < 2; k++) {
    coll_job ji = {prefix, "interp", stages[k], STEPS, {{0}}},
             jc = {prefix, dsc_backend_name(check_backend), stages[k], STEPS, {{0}}};
    char name[100];
    snprintf(name, sizeof name, "gpt-tiny world 2 zero %d, %d steps: loss curve", stages[k], STEPS);
    dsc_diag_clear(ctx);
    if (dsc_comm_inproc_run(ctx, 2, coll_rank, &ji) != DSC_OK ||
        dsc_comm_inproc_run(ctx, 2, coll_rank, &jc) != DSC_OK) {
      last_diags(ctx, diag, sizeof diag);
      report_msg(false, name, diag);
      continue;
    }
    double worst = test_curve_diff(ji.loss[0], jc.loss[0], STEPS, NULL);
    bool same_ranks = true;
    for (int s = 0; s < STEPS; s++) same_ranks = same_ranks && jc.loss[0][s] == jc.loss[1][s];
    char extra[200];
    snprintf(extra, sizeof extra, "step 1 %.4f/%.4f, step %d %.4f/%.4f (gpu/interp)%s",
             jc.loss[0][0], ji.loss[0][0], STEPS, jc.loss[0][STEPS - 1], ji.loss[0][STEPS - 1],
             same_ranks ? "" : "; the ranks' losses differ");
    report(worst <= tol && same_ranks, name, worst, tol, extra);
  }
  char cmd[200];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) fprintf(stderr, "gpu_check: could not remove %s\n", dir);
}

/* $DSC_GPU_CHECK_ONLY: a comma-separated list of the groups to run (ops,
 * errors, step, curves, collectives); unset: all. */
static bool group_on(const char *group) {
  const char *only = getenv("DSC_GPU_CHECK_ONLY");
  if (!only || !only[0]) return true;
  size_t n = strlen(group);
  for (const char *p = only; (p = strstr(p, group)) != NULL; p += n)
    if ((p == only || p[-1] == ',') && (p[n] == 0 || p[n] == ',')) return true;
  return false;
}

int main(int argc, char **argv) {
  source_dir = argc > 1 ? argv[1] : getenv("DSC_SOURCE_DIR");
#ifdef DSC_SOURCE_DIR
  if (!source_dir || !source_dir[0]) source_dir = DSC_SOURCE_DIR;
#endif
  if (!source_dir || !source_dir[0]) {
    fprintf(stderr, "usage: dsc_gpu_check SOURCE_DIR (or set DSC_SOURCE_DIR)\n");
    return 2;
  }
  char why[512];
  int arch = 0;
  const char *dry = getenv("DSC_GPU_CHECK_BACKEND");
  if (dry && dry[0] && (dsc_backend_from_name(dry, &check_backend) != 0 ||
                        !dsc_backend_available(check_backend))) {
    fprintf(stderr, "gpu_check: DSC_GPU_CHECK_BACKEND=%s is not an available backend\n", dry);
    return 2;
  }
  if (check_backend != DSC_BACKEND_CUDA)
    printf("gpu_check: dry run on backend %s (DSC_GPU_CHECK_BACKEND)\n", dsc_backend_name(check_backend));
  else if (!rt_cuda_probe(why, sizeof why, &arch)) {
    printf("no CUDA device: skipped (%s)\n", why);
    return 77;
  } else {
    printf("gpu_check: CUDA device 0, sm_%d; sources %s\n", arch, source_dir);
  }
  /* the kernel cache: $DSC_CACHE_DIR when set (the executor reads it) */
  dsc_context *ctx = dsc_context_new(NULL, NULL);
  if (!ctx) return 1;
  /* One executor alive for the whole run keeps the device's primary
   * context retained: each later executor then skips creating it anew. */
  dsc_module *keep_m = build_module(ctx, b_add, DSC_F32);
  dsc_exec *keep_x = NULL;
  dsc_exec_options keep_o = {check_backend, 0, NULL};
  if (!keep_m || dsc_run_codegen_passes(keep_m) != DSC_OK ||
      dsc_exec_new(keep_m, &keep_o, &keep_x) != DSC_OK) {
    char diag[1500];
    last_diags(ctx, diag, sizeof diag);
    report_msg(false, "create an executor", diag);
  }
  if (group_on("ops"))
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
      for (int d = 0; d < 5 && cases[c].dtypes[d] != END; d++)
        check_case(ctx, &cases[c], cases[c].dtypes[d]);
  if (group_on("errors")) check_bad_index(ctx);
  if (group_on("step")) check_train_step(ctx);
  if (group_on("curves")) check_loss_curves(ctx);
  if (group_on("collectives")) check_collectives(ctx);
  dsc_exec_free(keep_x);
  dsc_module_free(keep_m);
  printf("gpu_check: %d passed, %d failed\n", n_pass, n_fail);
  dsc_context_free(ctx);
  return n_fail ? 1 : 0;
}
