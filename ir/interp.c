/* The reference interpreter: tensors, parameter initialisation, rounding to
 * dtypes and the node-by-node graph runner. Kernels are in interp_ops.c. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ir/ir.h"

/* ---------------------------------------------------------------- tensors
 * One allocation per tensor: a hidden header with the block size (so that
 * freeing does not depend on the public type field), the dsc_tensor, then
 * the data. */
typedef struct {
  size_t bytes;
  size_t pad; /* keeps the tensor and its data 16-byte aligned */
} tensor_hdr;

#define TENSOR_HEAD ((sizeof(tensor_hdr) + sizeof(dsc_tensor) + 15) & ~(size_t)15)

/* Element count of a well-formed type; false on a bad rank, a negative dim
 * or an overflow of int64 or of the byte size. */
static bool type_numel(const dsc_type *t, int64_t *out) {
  if (t->rank < 0 || t->rank > DSC_MAX_RANK) return false;
  int64_t n = 1;
  for (int i = 0; i < t->rank; i++) {
    int64_t d = t->dims[i];
    if (d < 0 || (d != 0 && n > INT64_MAX / d)) return false;
    n *= d;
  }
  *out = n;
  return true;
}

static bool tensor_bytes(const dsc_type *t, size_t *bytes) {
  int64_t n;
  if (!type_numel(t, &n)) return false;
  if ((uint64_t)n > (SIZE_MAX - TENSOR_HEAD) / sizeof(double)) return false;
  *bytes = TENSOR_HEAD + (size_t)n * sizeof(double);
  return true;
}

dsc_tensor *dsc_tensor_new(dsc_context *ctx, dsc_type type) {
  size_t bytes;
  if (!ctx || (unsigned)type.dtype >= DSC_DTYPE_COUNT || !tensor_bytes(&type, &bytes)) return NULL;
  unsigned char *block = ir_alloc(ctx, bytes);
  if (!block) return NULL;
  memset(block, 0, bytes);
  ((tensor_hdr *)block)->bytes = bytes;
  dsc_tensor *t = (dsc_tensor *)(block + sizeof(tensor_hdr));
  t->type = type;
  t->data = (double *)(block + TENSOR_HEAD);
  return t;
}

void dsc_tensor_free(dsc_context *ctx, dsc_tensor *t) {
  if (!t) return;
  unsigned char *block = (unsigned char *)t - sizeof(tensor_hdr);
  ir_free(ctx, block, ((tensor_hdr *)block)->bytes);
}

/* ---------------------------------------------------------------- rounding */

/* Rounds x to the nearest value of a binary float format with p significant
 * bits (implicit bit included), minimum normal exponent emin and maximum
 * exponent emax; ties to even; subnormals keep the quantum 2^(emin-p+1);
 * values at or beyond max + half an ulp become infinite. */
static double round_format(double x, int p, int emin, int emax) {
  if (x == 0 || isnan(x) || isinf(x)) return x;
  int e;
  frexp(x, &e); /* |x| in [2^(e-1), 2^e) */
  int lead = e - 1 < emin ? emin : e - 1;
  int q = lead - (p - 1);
  double r = ldexp(nearbyint(ldexp(x, -q)), q); /* exact scaling; rounding mode: to nearest even */
  double max = ldexp(2.0 - ldexp(1.0, 1 - p), emax);
  if (fabs(r) > max) return x < 0 ? -INFINITY : INFINITY;
  return r;
}

static double round_f32(double x) {
  if (fabs(x) <= 3.4028234663852886e38) return (double)(float)x; /* in range: C rounds to even */
  return round_format(x, 24, -126, 127);
}
static double round_bf16(double x) { return round_format(x, 8, -126, 127); }
static double round_f16(double x) { return round_format(x, 11, -14, 15); }

/* Integers truncate toward zero and wrap modulo 2^bits (two's complement,
 * as integer arithmetic does on every backend); NaN becomes 0. */
static double round_int(double x, int bits) {
  if (isnan(x)) return 0;
  if (isinf(x)) return 0; /* no integer is closer; matches wrap of a multiple of 2^bits */
  double m = ldexp(1.0, bits), h = ldexp(1.0, bits - 1);
  double r = fmod(trunc(x), m); /* exact */
  if (r >= h) r -= m;
  if (r < -h) r += m;
  return r + 0.0; /* no -0 for integers */
}

float ir_bf16_round(float x) { return (float)round_bf16(x); }
float ir_f16_round(float x) { return (float)round_f16(x); }

void ir_round_to_dtype(dsc_tensor *t) {
  int64_t n = dsc_type_numel(&t->type);
  double *d = t->data;
  switch (t->type.dtype) {
    case DSC_F64:
      break;
    case DSC_F32:
      for (int64_t i = 0; i < n; i++) d[i] = round_f32(d[i]);
      break;
    case DSC_BF16:
      for (int64_t i = 0; i < n; i++) d[i] = round_bf16(d[i]);
      break;
    case DSC_F16:
      for (int64_t i = 0; i < n; i++) d[i] = round_f16(d[i]);
      break;
    case DSC_I32:
      for (int64_t i = 0; i < n; i++) d[i] = round_int(d[i], 32);
      break;
    case DSC_I64:
      for (int64_t i = 0; i < n; i++) d[i] = round_int(d[i], 64);
      break;
    case DSC_BOOL:
      for (int64_t i = 0; i < n; i++) d[i] = d[i] != 0 ? 1.0 : 0.0;
      break;
    default:
      break;
  }
}

/* ---------------------------------------------------------------- params */

struct dsc_params {
  dsc_context *ctx;
  const dsc_module *m;
  int n;
  dsc_tensor **t;
};

/* Elements [first, first + cnt) of param pa's initial value (its stream of
 * docs/ir.md) into d; false (reported) for an unknown kind. */
/* Every 2^20 draws a pending Ctrl-C or SIGTERM stops the stream: one of GPT-2's
 * params (wte, 38.6M values) takes seconds alone, under a sanitizer several. */
#define INIT_GOES_ON(ctx, k) \
  (((k)&0xFFFFF) != 0 || ir_check_interrupt((ctx), "initialising the params") == DSC_OK)

static bool init_values(dsc_context *ctx, const ir_param *pa, uint64_t seed, double *d,
                        int64_t first, int64_t cnt) {
  ir_rng rng;
  uint64_t x = seed ^ ir_fnv1a64(pa->name);
  ir_rng_seed(&rng, ir_splitmix64(&x));
  double a = pa->init.a, b = pa->init.b;
  switch (pa->init.kind) {
    case DSC_INIT_ZEROS:
      return true;
    case DSC_INIT_ONES:
      for (int64_t k = 0; k < cnt; k++) d[k] = 1.0;
      return true;
    case DSC_INIT_CONST:
      for (int64_t k = 0; k < cnt; k++) d[k] = a;
      return true;
    case DSC_INIT_NORMAL:
      for (int64_t k = 0; k < 2 * first; k++) { /* a normal takes two */
        if (!INIT_GOES_ON(ctx, k)) return false;
        ir_rng_uniform(&rng);
      }
      for (int64_t k = 0; k < cnt; k++) {
        if (!INIT_GOES_ON(ctx, k)) return false;
        d[k] = b + a * ir_rng_normal(&rng);
      }
      return true;
    case DSC_INIT_UNIFORM:
      for (int64_t k = 0; k < first; k++) {
        if (!INIT_GOES_ON(ctx, k)) return false;
        ir_rng_uniform(&rng);
      }
      for (int64_t k = 0; k < cnt; k++) {
        if (!INIT_GOES_ON(ctx, k)) return false;
        d[k] = a + (b - a) * ir_rng_uniform(&rng);
      }
      return true;
    default:
      ir_error(ctx, ir_no_loc, "parameter '%s' has an unknown initializer kind %d", pa->name,
               (int)pa->init.kind);
      return false;
  }
}

static dsc_params *params_new(const dsc_module *m, uint64_t seed, int rank, bool init);

dsc_params *dsc_params_init(const dsc_module *m, uint64_t seed) {
  return params_new(m, seed, 0, true);
}

dsc_params *dsc_params_init_rank(const dsc_module *m, uint64_t seed, int rank) {
  return params_new(m, seed, rank, true);
}

dsc_params *dsc_params_zeros(const dsc_module *m) { return params_new(m, 0, 0, false); }

static dsc_params *params_new(const dsc_module *m, uint64_t seed, int rank, bool init) {
  if (!m) return NULL;
  dsc_context *ctx = m->ctx;
  dsc_params *p = ir_alloc(ctx, sizeof *p);
  if (!p) {
    ir_error(ctx, ir_no_loc, "out of memory: need %zu bytes for the parameter table", sizeof *p);
    return NULL;
  }
  memset(p, 0, sizeof *p);
  p->ctx = ctx;
  p->m = m;
  if (m->n_params > 0) {
    size_t bytes = sizeof(dsc_tensor *) * (size_t)m->n_params;
    p->t = ir_alloc(ctx, bytes);
    if (!p->t) {
      ir_error(ctx, ir_no_loc, "out of memory: need %zu bytes for the parameter table", bytes);
      dsc_params_free(p);
      return NULL;
    }
    memset(p->t, 0, bytes);
  }
  for (int i = 0; i < m->n_params; i++) {
    const ir_param *pa = &m->params[i];
    size_t bytes;
    /* GPT-2's 124M values take seconds: a Ctrl-C stops it */
    if (ir_check_interrupt(ctx, "initialising the params") != DSC_OK) {
      dsc_params_free(p);
      return NULL;
    }
    if ((unsigned)pa->type.dtype >= DSC_DTYPE_COUNT || !tensor_bytes(&pa->type, &bytes)) {
      char tb[200];
      dsc_type_format(&pa->type, tb, sizeof tb);
      ir_error(ctx, ir_no_loc, "parameter '%s' has an invalid or too large type %s", pa->name, tb);
      dsc_params_free(p);
      return NULL;
    }
    dsc_tensor *t = dsc_tensor_new(ctx, pa->type);
    if (!t) {
      ir_error(ctx, ir_no_loc, "out of memory: need %zu bytes for parameter '%s'", bytes, pa->name);
      dsc_params_free(p);
      return NULL;
    }
    p->t[i] = t;
    p->n = i + 1;
    if (!init) continue;
    /* A shard holds elements [first, first + cnt) of the full stream, the
     * ones past the full tensor's end stay zero. */
    dsc_type full;
    int64_t world, first = 0, cnt = dsc_type_numel(&t->type);
    int sh = dsc_module_param_shard(m, i, &full, &world);
    if (sh < 0 || (sh > 0 && (rank < 0 || rank >= world))) {
      ir_error(ctx, ir_no_loc, "parameter '%s': malformed shard metadata or rank %d out of range",
               pa->name, rank);
      dsc_params_free(p);
      return NULL;
    }
    if (sh > 0) {
      int64_t n = dsc_type_numel(&full);
      first = (int64_t)rank * cnt;
      cnt = first >= n ? 0 : n - first < cnt ? n - first : cnt;
    }
    /* copy(): the source's stream and initializer, rounded to its dtype */
    const ir_param *src = pa;
    if (pa->init.kind == DSC_INIT_COPY) {
      int si = dsc_module_find_param(m, pa->init.from);
      dsc_type sfull;
      int64_t sworld;
      int ssh = si >= 0 ? dsc_module_param_shard(m, si, &sfull, &sworld) : -1;
      int64_t full_n = sh > 0 ? dsc_type_numel(&full) : dsc_type_numel(&t->type);
      src = si >= 0 ? &m->params[si] : NULL;
      if (!src || ssh < 0 || src->init.kind == DSC_INIT_COPY ||
          (ssh > 0 ? dsc_type_numel(&sfull) : dsc_type_numel(&src->type)) != full_n) {
        ir_error(ctx, ir_no_loc,
                 "parameter '%s': copy(%s) names no parameter of the same size with its own "
                 "initializer",
                 pa->name, pa->init.from ? pa->init.from : "");
        dsc_params_free(p);
        return NULL;
      }
    }
    if (!init_values(ctx, src, seed, t->data, first, cnt)) {
      dsc_params_free(p);
      return NULL;
    }
    if (src != pa) {
      dsc_tensor view = *t;
      view.type.dtype = src->type.dtype;
      ir_round_to_dtype(&view);
    }
    ir_round_to_dtype(t);
  }
  p->n = m->n_params;
  return p;
}

void dsc_params_free(dsc_params *p) {
  if (!p) return;
  dsc_context *ctx = p->ctx;
  if (p->t) {
    for (int i = 0; i < p->n; i++) dsc_tensor_free(ctx, p->t[i]);
    ir_free(ctx, p->t, sizeof(dsc_tensor *) * (size_t)p->m->n_params);
  }
  ir_free(ctx, p, sizeof *p);
}

int dsc_params_count(const dsc_params *p) { return p ? p->n : 0; }
const dsc_module *dsc_params_module(const dsc_params *p) { return p->m; }

dsc_tensor *dsc_params_get(const dsc_params *p, int i) {
  return p && i >= 0 && i < p->n ? p->t[i] : NULL;
}

dsc_tensor *dsc_params_find(const dsc_params *p, const char *name) {
  if (!p || !name) return NULL;
  return dsc_params_get(p, dsc_module_find_param(p->m, name));
}

/* ---------------------------------------------------------------- the runner */

typedef struct {
  dsc_context *ctx;
  int n;
  dsc_tensor **vals; /* value of each node (NULL once freed) */
  bool *owned;       /* vals[i] was allocated by this run */
  int *last_use;     /* index of the last node reading node i; INT_MAX: an output */
  int *input_index;  /* for input nodes: position in g->inputs */
  const dsc_tensor **ins;
  const ir_collectives *coll; /* the communicator's calls (NULL: none) */
  void *comm;
  bool collectives; /* the graph has collective ops */
  void **reqs;      /* for start nodes: the collective in flight (NULL once waited) */
  size_t bytes;
  void *block;
} run_state;

/* Waits every collective still in flight (a failure is already reported on
 * the communicator's context and breaks it); true when all completed. */
static bool settle_requests(run_state *s) {
  bool ok = true;
  for (int i = 0; i < s->n; i++)
    if (s->reqs[i]) {
      if (s->coll->wait(s->reqs[i]) != DSC_OK) ok = false;
      s->reqs[i] = NULL;
    }
  return ok;
}

static void run_release(run_state *s) {
  /* Buffers of a started collective belong to it until its wait returns. */
  if (s->reqs) settle_requests(s);
  for (int i = 0; i < s->n; i++)
    if (s->owned[i]) dsc_tensor_free(s->ctx, s->vals[i]);
  ir_free(s->ctx, s->block, s->bytes);
}

/* An error while running a graph with collectives: the other ranks may be
 * waiting for collectives this rank will never start, so give up on the
 * whole job (they fail promptly), then complete what is in flight. When the
 * communicator itself failed it is broken already and nothing is aborted. */
static void run_fail(run_state *s, const dsc_graph *g, bool abort_comm) {
  if (s->comm && s->collectives && abort_comm && !s->coll->broken(s->comm)) {
    char why[600];
    int nd = dsc_diag_count(s->ctx);
    snprintf(why, sizeof why, "graph '%s' failed: %s", g->name,
             nd > 0 ? dsc_diag_get(s->ctx, nd - 1)->message : "error");
    s->coll->abort(s->comm, why);
  }
  run_release(s);
}

/* Reports a failed collective at node nd. The communicator's message is on
 * its own context; repeat it here when the graph's context is another. */
static void comm_error(run_state *s, const ir_node *nd) {
  dsc_context *cc = s->coll->context(s->comm);
  int nd_cc = dsc_diag_count(cc);
  if (cc != s->ctx && nd_cc > 0)
    ir_error(s->ctx, nd->loc, "%s: %s", ir_op(nd->op)->name, dsc_diag_get(cc, nd_cc - 1)->message);
  else
    ir_error(s->ctx, nd->loc, "%s (node %%%d): the collective failed", ir_op(nd->op)->name, nd->id);
}

/* Collectives need a communicator of the graph's world, and a start's data
 * is in flight: only its wait may read it (the shape rules check that a
 * wait reads the matching start). */
static dsc_status check_collectives(const dsc_graph *g, run_state *s) {
  dsc_context *ctx = s->ctx;
  for (int i = 0; i < g->n_nodes; i++) {
    const ir_node *nd = g->nodes[i];
    if (ir_op(nd->op)->cg != IR_CG_COLLECTIVE) continue;
    s->collectives = true;
    if (!s->comm) {
      ir_error(ctx, nd->loc,
               "graph '%s' has collective ops (%s at node %%%d); run it with a communicator",
               g->name, ir_op(nd->op)->name, i);
      return DSC_ERR_USER;
    }
    if (!ir_is_collective_start(nd->op) && nd->op != DSC_OP_LOCAL_SHARD) continue;
    const char *group = ir_collective_group(nd);
    void *gc = s->coll->group(s->comm, group);
    if (!gc) {
      ir_error(ctx, nd->loc,
               "%s: node %%%d runs over group '%s', but the communicator has no mesh with that "
               "axis (dsc_mesh_new, --mesh)",
               ir_op(nd->op)->name, i, group);
      return DSC_ERR_USER;
    }
    if (ir_attr_int(nd, "world") != s->coll->world(gc)) {
      char has[64] = "the communicator's world is";
      if (gc != s->comm) snprintf(has, sizeof has, "its group '%s' has", group);
      ir_error(ctx, nd->loc, "%s: node %%%d has world %lld but %s %d", ir_op(nd->op)->name, i,
               (long long)ir_attr_int(nd, "world"), has, s->coll->world(gc));
      return DSC_ERR_USER;
    }
  }
  if (!s->collectives) return DSC_OK;
  const ir_node *r;
  int j, k;
  if (ir_find_in_flight_read(g, &r, &j, &k)) {
    if (k < 0)
      ir_error(ctx, r->loc,
               "%s: reads %%%d, a %s whose data is in flight (only its wait may read it)",
               ir_op(r->op)->name, r->in[j]->id, ir_op(r->in[j]->op)->name);
    else
      ir_error(ctx, ir_no_loc,
               "output %d of graph '%s' is a %s (%%%d) whose data is in flight; output its wait", k,
               g->name, ir_op(r->op)->name, r->id);
    return DSC_ERR_USER;
  }
  return DSC_OK;
}

/* Starts the collective of start node nd from input x into out. */
static dsc_status start_collective(run_state *s, const ir_node *nd, const dsc_tensor *x,
                                   dsc_tensor *out, void **req) {
  int64_t count = dsc_type_numel(&x->type), tag = ir_attr_int(nd, "tag");
  void *c = s->coll->group(s->comm, ir_collective_group(nd)); /* check_collectives found it */
  switch (nd->op) {
    case DSC_OP_ALL_REDUCE_START:
      return s->coll->start(c, IR_COLL_ALL_REDUCE, x->data, out->data, count, 0, tag, req);
    case DSC_OP_REDUCE_SCATTER_START:
      return s->coll->start(c, IR_COLL_REDUCE_SCATTER, x->data, out->data, count, 0, tag, req);
    case DSC_OP_ALL_GATHER_START:
      return s->coll->start(c, IR_COLL_ALL_GATHER, x->data, out->data, count, 0, tag, req);
    case DSC_OP_BROADCAST_START:
      /* in place: the root's copy is sent, the others' overwritten */
      memcpy(out->data, x->data, sizeof(double) * (size_t)count);
      return s->coll->start(c, IR_COLL_BROADCAST, out->data, out->data, count,
                            (int)ir_attr_int(nd, "root"), tag, req);
    case DSC_OP_ALL_TO_ALL_START:
      return s->coll->start(c, IR_COLL_ALL_TO_ALL, x->data, out->data,
                            count / ir_attr_int(nd, "world"), 0, tag, req);
    default:
      ir_error(s->ctx, nd->loc, "internal: %s is not a collective start", ir_op(nd->op)->name);
      return DSC_ERR_INTERNAL;
  }
}

static bool oom_bytes(dsc_context *ctx, dsc_loc loc, const dsc_type *t, const char *what) {
  int64_t cnt;
  if (type_numel(t, &cnt) && (uint64_t)cnt <= SIZE_MAX / sizeof(double))
    ir_error(ctx, loc, "out of memory: need %llu bytes for %s",
             (unsigned long long)((uint64_t)cnt * sizeof(double)), what);
  else
    ir_error(ctx, loc, "out of memory: %s has too many elements", what);
  return false;
}

/* Checks the graph's structure before running: SSA order, input and param
 * bindings, and that each node's type is what its shape rule says (the
 * kernels index memory by these types, so an unverified graph must not
 * reach them). */
static dsc_status check_graph(const dsc_graph *g, const dsc_params *params,
                              const dsc_tensor *const *inputs, int n_inputs, run_state *s) {
  dsc_context *ctx = s->ctx;
  char tb1[200], tb2[200];
  if (n_inputs != g->n_inputs) {
    ir_error(ctx, ir_no_loc, "graph '%s' takes %d input(s), got %d", g->name, g->n_inputs,
             n_inputs);
    return DSC_ERR_USER;
  }
  for (int k = 0; k < g->n_inputs; k++) {
    const ir_node *in = g->inputs[k];
    if (!inputs || !inputs[k]) {
      ir_error(ctx, ir_no_loc, "input '%s' of graph '%s' is missing", in->name, g->name);
      return DSC_ERR_USER;
    }
    if (!dsc_type_equal(&inputs[k]->type, &in->type)) {
      dsc_type_format(&in->type, tb1, sizeof tb1);
      dsc_type_format(&inputs[k]->type, tb2, sizeof tb2);
      ir_error(ctx, ir_no_loc, "input '%s' of graph '%s' expects %s, got %s", in->name, g->name,
               tb1, tb2);
      return DSC_ERR_USER;
    }
  }
  for (int i = 0; i < g->n_nodes; i++) {
    const ir_node *n = g->nodes[i];
    if (!n || n->id != i || n->graph != g) {
      ir_error(ctx, ir_no_loc, "internal: node %d of graph '%s' is malformed", i, g->name);
      return DSC_ERR_INTERNAL;
    }
    const ir_op_info *info = ir_op(n->op);
    if (!info) {
      ir_error(ctx, n->loc, "node %%%d has an unknown op %d", i, (int)n->op);
      return DSC_ERR_USER;
    }
    for (int j = 0; j < n->n_in; j++) {
      const ir_node *a = n->in[j];
      if (!a || a->graph != g || a->id < 0 || a->id >= i || g->nodes[a->id] != a) {
        ir_error(ctx, n->loc, "%s: input %d is not an earlier node of graph '%s'", info->name, j,
                 g->name);
        return DSC_ERR_USER;
      }
    }
    if (n->op == DSC_OP_INPUT) {
      s->input_index[i] = -1;
      for (int k = 0; k < g->n_inputs; k++)
        if (g->inputs[k] == n) s->input_index[i] = k;
      if (s->input_index[i] < 0) {
        ir_error(ctx, n->loc, "input node %%%d is not an input of graph '%s'", i, g->name);
        return DSC_ERR_USER;
      }
      continue;
    }
    char err[512] = "";
    dsc_type t;
    memset(&t, 0, sizeof t);
    if (!info->shape(n, &t, err, sizeof err)) {
      ir_error(ctx, n->loc, "%s: %s", info->name, err);
      return DSC_ERR_USER;
    }
    if (!dsc_type_equal(&t, &n->type)) {
      dsc_type_format(&n->type, tb1, sizeof tb1);
      dsc_type_format(&t, tb2, sizeof tb2);
      ir_error(ctx, n->loc, "%s: node %%%d is typed %s but its inputs give %s", info->name, i, tb1,
               tb2);
      return DSC_ERR_USER;
    }
    if (n->op == DSC_OP_PARAM || n->op == DSC_OP_TIER_READ_START) {
      const char *name = ir_attr_str(n, "name");
      const dsc_tensor *pt = dsc_params_find(params, name);
      if (!pt) {
        ir_error(ctx, n->loc, "parameter '%s' has no value (%s)", name,
                 params ? "not in the given parameters" : "no parameters were given");
        return DSC_ERR_USER;
      }
      if (!dsc_type_equal(&pt->type, &n->type)) {
        dsc_type_format(&n->type, tb1, sizeof tb1);
        dsc_type_format(&pt->type, tb2, sizeof tb2);
        ir_error(ctx, n->loc, "parameter '%s' is read as %s but its value is %s", name, tb1, tb2);
        return DSC_ERR_USER;
      }
    }
  }
  for (int k = 0; k < g->n_outputs; k++) {
    const ir_node *o = g->outputs[k];
    if (!o || o->graph != g || o->id < 0 || o->id >= g->n_nodes || g->nodes[o->id] != o) {
      ir_error(ctx, ir_no_loc, "output %d of graph '%s' is not a node of the graph", k, g->name);
      return DSC_ERR_USER;
    }
  }
  return DSC_OK;
}

dsc_status dsc_interp_run(const dsc_graph *g, const dsc_params *params,
                          const dsc_tensor *const *inputs, int n_inputs, dsc_tensor **outputs) {
  return ir_interp_run(g, params, inputs, n_inputs, outputs, NULL, NULL);
}

dsc_status ir_interp_run(const ir_graph *g, const dsc_params *params,
                         const dsc_tensor *const *inputs, int n_inputs, dsc_tensor **outputs,
                         const ir_collectives *coll, void *comm) {
  if (!g) return DSC_ERR_USER;
  dsc_context *ctx = g->module->ctx;
  if (g->n_outputs > 0 && !outputs) {
    ir_error(ctx, ir_no_loc, "dsc_interp_run: graph '%s' has %d output(s) but no output array",
             g->name, g->n_outputs);
    return DSC_ERR_USER;
  }
  for (int k = 0; k < g->n_outputs; k++) outputs[k] = NULL;

  run_state s;
  memset(&s, 0, sizeof s);
  s.ctx = ctx;
  s.n = g->n_nodes;
  s.coll = comm ? coll : NULL;
  s.comm = s.coll ? comm : NULL;
  int max_in = 1;
  for (int i = 0; i < g->n_nodes; i++)
    if (g->nodes[i] && g->nodes[i]->n_in > max_in) max_in = g->nodes[i]->n_in;
  /* One block for the bookkeeping arrays, pointer-sized pieces first. */
  size_t n = (size_t)(s.n ? s.n : 1);
  s.bytes = n * sizeof(dsc_tensor *) + (size_t)max_in * sizeof(dsc_tensor *) +
            n * sizeof(void *) + 2 * n * sizeof(int) + n * sizeof(bool);
  s.block = ir_alloc(ctx, s.bytes);
  if (!s.block) {
    ir_error(ctx, ir_no_loc, "out of memory: need %zu bytes to run graph '%s'", s.bytes, g->name);
    return DSC_ERR_INTERNAL;
  }
  memset(s.block, 0, s.bytes);
  unsigned char *p = s.block;
  s.vals = (dsc_tensor **)p, p += n * sizeof(dsc_tensor *);
  s.ins = (const dsc_tensor **)p, p += (size_t)max_in * sizeof(dsc_tensor *);
  s.reqs = (void **)p, p += n * sizeof(void *);
  s.last_use = (int *)p, p += n * sizeof(int);
  s.input_index = (int *)p, p += n * sizeof(int);
  s.owned = (bool *)p;

  dsc_status st = check_graph(g, params, inputs, n_inputs, &s);
  if (st == DSC_OK) st = check_collectives(g, &s);
  if (st != DSC_OK) {
    s.n = 0; /* nothing allocated yet */
    run_release(&s);
    return st;
  }

  /* Lifetimes: a value dies after its last reader; outputs never die here. */
  for (int i = 0; i < g->n_nodes; i++) {
    s.last_use[i] = i;
    const ir_node *nd = g->nodes[i];
    for (int j = 0; j < nd->n_in; j++) s.last_use[nd->in[j]->id] = i;
  }
  for (int k = 0; k < g->n_outputs; k++) s.last_use[g->outputs[k]->id] = INT_MAX;
  /* Assigned values live until the step ends, when they are committed. */
  for (int i = 0; i < g->n_nodes; i++)
    if (g->nodes[i]->op == DSC_OP_ASSIGN || g->nodes[i]->op == DSC_OP_TIER_WRITE_START)
      s.last_use[i] = INT_MAX;
  /* A start's tensor lives until its wait ran (one without a wait until the
   * end, when it is waited), and so does the input it sends from. */
  for (int i = 0; i < g->n_nodes; i++) {
    if (!ir_is_collective_start(g->nodes[i]->op)) continue;
    if (s.last_use[i] == i) s.last_use[i] = INT_MAX;
    int x = g->nodes[i]->in[0]->id;
    if (s.last_use[x] < s.last_use[i]) s.last_use[x] = s.last_use[i];
  }

  for (int i = 0; i < g->n_nodes; i++) {
    const ir_node *nd = g->nodes[i];
    const ir_op_info *info = ir_op(nd->op);
    if (nd->op == DSC_OP_INPUT) {
      s.vals[i] = (dsc_tensor *)inputs[s.input_index[i]]; /* read only; never owned */
      continue;
    }
    if (nd->op == DSC_OP_PARAM || nd->op == DSC_OP_TIER_READ_START) { /* a disk read: the value */
      s.vals[i] = dsc_params_find(params, ir_attr_str(nd, "name"));
      continue;
    }
    if (ir_is_collective_wait(nd->op)) {
      int sid = nd->in[0]->id;
      void *req = s.reqs[sid];
      s.reqs[sid] = NULL;
      if (req && s.coll->wait(req) != DSC_OK) {
        comm_error(&s, nd);
        run_fail(&s, g, false);
        return DSC_ERR_USER;
      }
    }
    dsc_tensor *out = dsc_tensor_new(ctx, nd->type);
    if (!out) {
      char what[64];
      snprintf(what, sizeof what, "%s output", info->name);
      oom_bytes(ctx, nd->loc, &nd->type, what);
      run_fail(&s, g, true);
      return DSC_ERR_INTERNAL;
    }
    for (int j = 0; j < nd->n_in; j++) s.ins[j] = s.vals[nd->in[j]->id];
    if (ir_is_collective_start(nd->op)) {
      void *req = NULL;
      dsc_status cst = start_collective(&s, nd, s.ins[0], out, &req);
      if (cst != DSC_OK) {
        dsc_tensor_free(ctx, out);
        comm_error(&s, nd);
        run_fail(&s, g, true);
        return cst;
      }
      s.reqs[i] = req;
      s.vals[i] = out; /* in flight: rounded by the wait */
      s.owned[i] = true;
      continue; /* its input lives until the wait (see the lifetimes above) */
    }
    char err[512] = "";
    if (nd->op == DSC_OP_LOCAL_SHARD) { /* this rank's chunk: only the run knows the rank */
      int64_t chunk = dsc_type_numel(&nd->type), len = dsc_type_numel(&s.ins[0]->type);
      int64_t first = (int64_t)s.coll->rank(s.coll->group(s.comm, ir_collective_group(nd))) * chunk;
      int64_t n = first >= len ? 0 : len - first < chunk ? len - first : chunk;
      if (n > 0) memcpy(out->data, s.ins[0]->data + first, sizeof(double) * (size_t)n);
      memset(out->data + (n > 0 ? n : 0), 0, sizeof(double) * (size_t)(chunk - (n > 0 ? n : 0)));
    } else if (!info->interp(nd, s.ins, out, err, sizeof err)) {
      ir_error(ctx, nd->loc, "runtime error in %s: %s", info->name, err);
      dsc_tensor_free(ctx, out);
      run_fail(&s, g, true);
      return DSC_ERR_USER;
    }
    ir_round_to_dtype(out);
    s.vals[i] = out;
    s.owned[i] = true;
    if (ir_is_collective_wait(nd->op)) {
      /* the input the start sent from may die with its wait */
      int x = nd->in[0]->in[0]->id;
      if (s.owned[x] && s.last_use[x] == i) {
        dsc_tensor_free(ctx, s.vals[x]);
        s.vals[x] = NULL;
        s.owned[x] = false;
      }
    }
    /* Free inputs read for the last time, and this value if nobody reads it. */
    for (int j = 0; j < nd->n_in; j++) {
      int id = nd->in[j]->id;
      if (s.owned[id] && s.last_use[id] == i) {
        dsc_tensor_free(ctx, s.vals[id]);
        s.vals[id] = NULL;
        s.owned[id] = false;
      }
    }
    if (s.last_use[i] == i) {
      dsc_tensor_free(ctx, out);
      s.vals[i] = NULL;
      s.owned[i] = false;
    }
  }

  /* Starts that no wait completed are completed now. */
  if (s.collectives && !settle_requests(&s)) {
    ir_error(ctx, ir_no_loc, "graph '%s': a collective without a wait failed", g->name);
    run_fail(&s, g, false);
    return DSC_ERR_USER;
  }

  /* Hand out the results. Inputs, params and repeated outputs are copied so
   * that the caller owns (and frees) every output tensor exactly once. */
  for (int k = 0; k < g->n_outputs; k++) {
    int id = g->outputs[k]->id;
    if (s.owned[id]) {
      outputs[k] = s.vals[id];
      s.owned[id] = false;
      continue;
    }
    const dsc_tensor *src = s.vals[id];
    dsc_tensor *copy = dsc_tensor_new(ctx, src->type);
    if (!copy) {
      oom_bytes(ctx, ir_no_loc, &src->type, "a graph output");
      for (int j = 0; j < k; j++) {
        dsc_tensor_free(ctx, outputs[j]);
        outputs[j] = NULL;
      }
      run_release(&s);
      return DSC_ERR_INTERNAL;
    }
    memcpy(copy->data, src->data, sizeof(double) * (size_t)dsc_type_numel(&src->type));
    outputs[k] = copy;
  }
  /* Commit `assign`s: every param read above saw the values from before the
   * step. Copies only, so nothing can fail halfway through. */
  for (int i = 0; i < g->n_nodes; i++) {
    const ir_node *nd = g->nodes[i];
    if (nd->op != DSC_OP_ASSIGN && nd->op != DSC_OP_TIER_WRITE_START) continue;
    dsc_tensor *dst = dsc_params_find(params, ir_attr_str(nd, "name"));
    if (dst && s.vals[i])
      memcpy(dst->data, s.vals[i]->data, sizeof(double) * (size_t)dsc_type_numel(&dst->type));
  }
  run_release(&s);
  return DSC_OK;
}
