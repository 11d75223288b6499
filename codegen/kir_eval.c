/* The kernel IR's reference evaluator (codegen/codegen.h): plain loops, one
 * domain point at a time, every value a double rounded to its compute type
 * after each operation (f32 results to float, integers wrapped), loads and
 * stores converted from / to the argument's storage dtype. Slow and simple:
 * it is the oracle for the LLVM and CUDA emitters. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/codegen.h"

int kir_internal_topo(const kir_expr *root, const kir_expr ***items, int **a, int **b, int **c,
                      int **g);

/* ---------------- evaluation ---------------- */

static double round_to(dsc_dtype t, double v) {
  switch (t) {
    case DSC_F32: return (float)v;
    case DSC_I32: return (double)cg_trunc_int(v, 32);
    case DSC_I64: return (double)cg_trunc_int(v, 64);
    case DSC_BOOL: return v != 0 ? 1.0 : 0.0;
    default: return v;
  }
}

typedef struct {
  int n;
  const kir_expr **items;
  int *a, *b, *c, *g;
  double *val;
} stage_prog;

typedef struct {
  const kir_kernel *k;
  void *const *args;
  int64_t idx[KIR_MAX_RANK];
  double *slots;
  bool status;
} eval_state;

/* Address of an access at the current point; false when a gather is out
 * of range (the status flag is set). */
static bool address(eval_state *s, const kir_access *acc, double gather_value, int64_t *out) {
  int64_t off = acc->offset;
  for (int d = 0; d < s->k->rank; d++) off += acc->stride[d] * s->idx[d];
  if (acc->gather) {
    if (!(gather_value >= 0 && gather_value < (double)acc->gather_bound)) {
      s->status = true;
      return false;
    }
    off += acc->gather_stride * (int64_t)gather_value;
  }
  *out = off;
  return true;
}

static double apply_unary(int op, dsc_dtype t, double x) {
  switch (op) {
    case KIR_NEG: return -x;
    case KIR_EXP: return exp(x);
    case KIR_LOG: return log(x);
    case KIR_SQRT: return sqrt(x);
    case KIR_RSQRT: return 1.0 / sqrt(x);
    case KIR_TANH: return tanh(x);
    case KIR_SIGMOID: return 1.0 / (1.0 + exp(-x));
    case KIR_ABS: return fabs(x);
    case KIR_SIN: return sin(x);
    case KIR_COS: return cos(x);
  }
  (void)t;
  return NAN;
}

static double apply_binary(int op, dsc_dtype t, double x, double y) {
  bool integer = t == DSC_I32 || t == DSC_I64;
  switch (op) {
    case KIR_ADD: return x + y;
    case KIR_SUB: return x - y;
    case KIR_MUL: return x * y;
    case KIR_DIV:
      if (integer) return y == 0 ? 0 : trunc(x / y);
      return x / y;
    case KIR_MAX: return (isnan(x) || isnan(y)) ? NAN : (x > y ? x : y);
    case KIR_MIN: return (isnan(x) || isnan(y)) ? NAN : (x < y ? x : y);
    case KIR_POW: return pow(x, y);
    case KIR_LT: return x < y;
    case KIR_GT: return x > y;
    case KIR_EQ: return x == y;
    case KIR_AND: return (x != 0) && (y != 0);
    case KIR_OR: return (x != 0) || (y != 0);
    case KIR_RAND24:
      return (double)ir_rand24((int64_t)x, (int64_t)y);
  }
  return NAN;
}

/* Evaluates the stage program at the current point; the root is last. */
static double run_prog(eval_state *s, stage_prog *p) {
  for (int i = 0; i < p->n; i++) {
    const kir_expr *e = p->items[i];
    double *v = p->val, r = 0;
    switch (e->kind) {
      case KIR_CONST: r = e->value; break;
      case KIR_LOAD: {
        int64_t off;
        if (!address(s, &e->access, p->g[i] >= 0 ? v[p->g[i]] : 0, &off)) {
          r = 0;
          break;
        }
        const kir_arg *arg = &s->k->args[e->access.arg];
        r = cg_load_elem(arg->dtype,
                         (const char *)s->args[e->access.arg] + off * (int64_t)dsc_dtype_size(arg->dtype));
        break;
      }
      case KIR_INDEX: r = (double)s->idx[e->var]; break;
      case KIR_SCALAR: r = s->slots[e->slot]; break;
      case KIR_UNARY: r = apply_unary(e->op, e->type, v[p->a[i]]); break;
      case KIR_BINARY: r = apply_binary(e->op, p->items[p->a[i]]->type, v[p->a[i]], v[p->b[i]]); break;
      case KIR_SELECT: r = v[p->a[i]] != 0 ? v[p->b[i]] : v[p->c[i]]; break;
      case KIR_CAST: r = v[p->a[i]]; break;
    }
    v[i] = round_to(e->type, r);
  }
  return p->n ? p->val[p->n - 1] : 0;
}

/* Iterates every inner index (row-major), calling fn at each point. */
static void for_inner(eval_state *s, void (*fn)(eval_state *, const kir_stage *, stage_prog *,
                                               stage_prog *, double *),
                      const kir_stage *st, stage_prog *p, stage_prog *gp, double *acc) {
  const kir_kernel *k = s->k;
  for (int d = k->n_outer; d < k->rank; d++) s->idx[d] = 0;
  for (;;) {
    fn(s, st, p, gp, acc);
    int d = k->rank - 1;
    while (d >= k->n_outer) {
      if (++s->idx[d] < k->dims[d]) break;
      s->idx[d] = 0;
      d--;
    }
    if (d < k->n_outer) return;
  }
}

static void reduce_point(eval_state *s, const kir_stage *st, stage_prog *p, stage_prog *gp,
                         double *acc) {
  (void)gp;
  double v = run_prog(s, p);
  switch (st->reduce) {
    case KIR_REDUCE_SUM: *acc += v; break;
    case KIR_REDUCE_MAX: *acc = (isnan(v) || isnan(*acc)) ? NAN : (v > *acc ? v : *acc); break;
    case KIR_REDUCE_MIN: *acc = (isnan(v) || isnan(*acc)) ? NAN : (v < *acc ? v : *acc); break;
  }
}

static void store_point(eval_state *s, const kir_stage *st, stage_prog *p, stage_prog *gp,
                        double *acc) {
  (void)acc;
  double v = run_prog(s, p);
  double gv = gp ? run_prog(s, gp) : 0;
  int64_t off;
  if (!address(s, &st->dst, gv, &off)) return;
  const kir_arg *arg = &s->k->args[st->dst.arg];
  cg_store_elem(arg->dtype, (char *)s->args[st->dst.arg] + off * (int64_t)dsc_dtype_size(arg->dtype),
                v);
}

static void prog_free(stage_prog *p) {
  free(p->items);
  free(p->a);
  free(p->b);
  free(p->c);
  free(p->g);
  free(p->val);
}

static bool prog_build(stage_prog *p, const kir_expr *root) {
  memset(p, 0, sizeof *p);
  p->n = kir_internal_topo(root, &p->items, &p->a, &p->b, &p->c, &p->g);
  if (p->n < 0) return false;
  p->val = calloc((size_t)p->n + 1, sizeof *p->val);
  return p->val != NULL;
}

bool kir_eval(const kir_kernel *k, void *const *args) {
  int ns = k->n_stages;
  stage_prog *progs = calloc((size_t)ns * 2 + 1, sizeof *progs);
  double *slots = calloc((size_t)k->n_slots + 1, sizeof *slots);
  bool ok = progs && slots;
  for (int i = 0; ok && i < ns; i++) {
    ok = prog_build(&progs[2 * i], k->stages[i].expr);
    if (ok && k->stages[i].kind == KIR_STAGE_STORE && k->stages[i].dst.gather)
      ok = prog_build(&progs[2 * i + 1], k->stages[i].dst.gather);
  }
  eval_state s = {.k = k, .args = args, .slots = slots};
  if (ok) {
    int64_t n_outer = 1;
    for (int d = 0; d < k->n_outer; d++) n_outer *= k->dims[d];
    for (int64_t o = 0; o < n_outer; o++) {
      int64_t rem = o;
      for (int d = k->n_outer - 1; d >= 0; d--) {
        s.idx[d] = rem % k->dims[d];
        rem /= k->dims[d];
      }
      for (int i = 0; i < ns; i++) {
        const kir_stage *st = &k->stages[i];
        stage_prog *gp = progs[2 * i + 1].n > 0 ? &progs[2 * i + 1] : NULL;
        switch (st->kind) {
          case KIR_STAGE_REDUCE: {
            double acc = st->reduce == KIR_REDUCE_SUM   ? 0.0
                         : st->reduce == KIR_REDUCE_MAX ? -INFINITY
                                                        : INFINITY;
            for_inner(&s, reduce_point, st, &progs[2 * i], NULL, &acc);
            slots[st->slot] = round_to(k->slot_types[st->slot], acc);
            break;
          }
          case KIR_STAGE_LET:
            for (int d = k->n_outer; d < k->rank; d++) s.idx[d] = 0;
            slots[st->slot] = run_prog(&s, &progs[2 * i]);
            break;
          case KIR_STAGE_STORE:
            if (st->over_inner) {
              for_inner(&s, store_point, st, &progs[2 * i], gp, NULL);
            } else {
              for (int d = k->n_outer; d < k->rank; d++) s.idx[d] = 0;
              store_point(&s, st, &progs[2 * i], gp, NULL);
            }
            break;
        }
      }
    }
  }
  for (int i = 0; progs && i < 2 * ns; i++) prog_free(&progs[i]);
  free(progs);
  free(slots);
  return ok && !s.status;
}
