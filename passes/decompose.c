/* The decompose pass: rewrites every composite op (softmax, log_softmax,
 * layernorm, rmsnorm, attention, rope, dropout, cross_entropy) into primitive IR ops, so
 * that code generation only meets elementwise ops, reductions, layout ops,
 * matmul, embedding and embedding_grad. embedding_grad (a scatter-add) stays.
 *
 * Forms (all numerically stable, as the interpreter's kernels):
 *   softmax      e = exp(x - max(x)); e / sum(e)
 *   log_softmax  d = x - max(x); d - log(sum(exp(d)))
 *   layernorm    c = x - mean(x); c * rsqrt(mean(c*c) + eps) * w + b   (two-pass, biased)
 *   rmsnorm      x * rsqrt(mean(x*x) + eps) * w
 *   attention    heads split by reshape + permute, S = Q K^T (matmul) * 1/sqrt(hd),
 *                causal: where(s > t, -inf, S) (exp(-inf - max) is exactly 0, and the
 *                diagonal is never masked, so the max is finite), softmax over s,
 *                O = P V, heads merged back by permute + reshape
 *   cross_entropy mean over positions of log(sum(exp(d))) - d[target] with
 *                d = logits - max(logits); the pick is a one-hot reduction
 *                sum(where(equal(iota over V, target), d, 0)) that fuses into the
 *                row kernel of the max and the sum.
 *   dropout      where(rand24(seed, stream 2^40 + row-major index) < round(p 2^24),
 *                0, x * 1/(1-p))
 * Compute dtype: the interpreter computes every composite in doubles and
 * rounds the result once, so f64 nodes decompose in f64 and f32 nodes in f32
 * (the accepted approximation); bf16/f16 norms, softmaxes and losses cast
 * their inputs to f32 and the result back. A bf16/f16 attention keeps its
 * two matmuls in the low dtype (as autocast does) and runs scale, mask and
 * softmax in f32.
 *
 * Out-of-range targets: the interpreter's cross_entropy reports a target
 * outside [0, V); a bare one-hot would silently drop it. The target is
 * therefore read through embedding(iota table [V, 1], targets), which is
 * bounds-checked exactly on [0, V) (the interpreter names the id and V; code
 * generation's gather sets its status) and yields the target as a float
 * (exact: the table is f32 up to V = 2^24, f64 beyond), compared with a float
 * iota over V. The training data loader also checks token ids against the
 * vocabulary, so a bad target never reaches a step from `dsc train`.
 *
 * Graph surgery without a half-rewritten graph on failure: the replacements
 * are first appended after the existing nodes (nothing old is touched; on a
 * failure the node count is restored), then one pass interleaves them at
 * their composites' positions, redirects uses and renumbers. Every new node
 * carries its composite's source location. */
#include <math.h>
#include <string.h>

#include "passes/passes.h"

bool pass_decompose_op(dsc_op op) {
  switch (op) {
    case DSC_OP_SOFTMAX:
    case DSC_OP_LOG_SOFTMAX:
    case DSC_OP_LAYERNORM:
    case DSC_OP_RMSNORM:
    case DSC_OP_ATTENTION:
    case DSC_OP_ROPE:
    case DSC_OP_DROPOUT:
    case DSC_OP_CROSS_ENTROPY:
      return true;
    default:
      return false;
  }
}

/* ---------------------------------------------------------------- builders */

static ir_node *scalar(ir_graph *g, double v, dsc_dtype dt) {
  dsc_type t;
  memset(&t, 0, sizeof t);
  t.dtype = dt;
  return dsc_const(g, v, t);
}
static ir_node *bin(ir_graph *g, dsc_op op, ir_node *a, ir_node *b) {
  return dsc_binary(g, op, a, b);
}
static ir_node *un(ir_graph *g, dsc_op op, ir_node *x) { return dsc_unary(g, op, x); }
static ir_node *reduce_keep(ir_graph *g, dsc_op op, ir_node *x, int64_t axis) {
  return dsc_reduce(g, op, x, &axis, 1, 1);
}
static ir_node *where(ir_graph *g, ir_node *c, ir_node *a, ir_node *b) {
  ir_node *in[3] = {c, a, b};
  return dsc_build(g, DSC_OP_WHERE, in, 3, NULL, 0);
}
static ir_node *iota(ir_graph *g, int64_t axis, dsc_dtype dt, const int64_t *shape, int rank) {
  dsc_attr a[3] = {dsc_attr_int("axis", axis), dsc_attr_dtype("dtype", dt),
                   dsc_attr_ints("shape", shape, rank)};
  return dsc_build(g, DSC_OP_IOTA, NULL, 0, a, 3);
}
/* x converted to dt (no node when it already has it). */
static ir_node *to(ir_graph *g, ir_node *x, dsc_dtype dt) {
  if (!x || x->type.dtype == dt) return x;
  return dsc_cast(g, x, dt);
}
/* The dtype a composite of dtype dt computes in: f64 stays, everything else f32. */
static dsc_dtype compute_dtype(dsc_dtype dt) { return dt == DSC_F64 ? DSC_F64 : DSC_F32; }

/* ---------------------------------------------------------------- the forms */

/* Stable softmax (or log_softmax) of x along axis, in x's dtype. */
static ir_node *softmax_in(ir_graph *g, ir_node *x, int64_t axis, bool log_out) {
  ir_node *d = bin(g, DSC_OP_SUB, x, reduce_keep(g, DSC_OP_MAX, x, axis));
  ir_node *e = un(g, DSC_OP_EXP, d);
  ir_node *s = reduce_keep(g, DSC_OP_SUM, e, axis);
  return log_out ? bin(g, DSC_OP_SUB, d, un(g, DSC_OP_LOG, s)) : bin(g, DSC_OP_DIV, e, s);
}

static ir_node *decompose_softmax(ir_graph *g, const ir_node *n) {
  dsc_dtype cd = compute_dtype(n->type.dtype);
  ir_node *y =
      softmax_in(g, to(g, n->in[0], cd), ir_attr_int(n, "axis"), n->op == DSC_OP_LOG_SOFTMAX);
  return to(g, y, n->type.dtype);
}

static ir_node *decompose_norm(ir_graph *g, const ir_node *n) {
  dsc_dtype cd = compute_dtype(n->type.dtype);
  bool rms = n->op == DSC_OP_RMSNORM;
  ir_node *x = to(g, n->in[0], cd), *w = to(g, n->in[1], cd);
  int64_t ax = n->in[0]->type.rank - 1;
  /* two passes: the variance of the centred values (biased), as the kernel */
  ir_node *c = rms ? x : bin(g, DSC_OP_SUB, x, reduce_keep(g, DSC_OP_MEAN, x, ax));
  ir_node *var = reduce_keep(g, DSC_OP_MEAN, bin(g, DSC_OP_MUL, c, c), ax);
  ir_node *r = un(g, DSC_OP_RSQRT, bin(g, DSC_OP_ADD, var, scalar(g, ir_attr_float(n, "eps"), cd)));
  ir_node *y = bin(g, DSC_OP_MUL, bin(g, DSC_OP_MUL, c, r), w);
  if (!rms) y = bin(g, DSC_OP_ADD, y, to(g, n->in[2], cd));
  return to(g, y, n->type.dtype);
}

/* The heads as ir/attention.c lays them out: grouped-query attention keeps
 * one copy of each key/value head, broadcast over its G query heads. */
ir_node *pass_attention_form(ir_graph *g, const ir_node *attn, ir_node *q, ir_node *k, ir_node *v,
                             ir_node *masked) {
  int64_t G = ir_attn_groups(attn), KVH = ir_attr_int(attn, "kv_heads");
  bool grouped = G > 1;
  dsc_dtype dt = attn->type.dtype, cd = compute_dtype(dt);
  q = ir_attn_split(g, q, KVH, G, grouped, false);
  ir_node *kt = ir_attn_split(g, k, KVH, 1, grouped, true);
  v = ir_attn_split(g, v, KVH, 1, grouped, false);
  /* scores [B, KVH, G, T, S] or [B, H, T, S]: the matmul in the node's
   * dtype, the rest in cd */
  ir_node *s = to(g, dsc_matmul(g, q, kt), cd);
  s = bin(g, DSC_OP_MUL, s, scalar(g, ir_attr_float(attn, "scale"), cd));
  if (masked) /* no row is all masked: a finite max */
    s = where(g, masked, scalar(g, -INFINITY, cd), s);
  ir_node *p = to(g, softmax_in(g, s, grouped ? 4 : 3, false), dt);
  return ir_attn_merge(g, dsc_matmul(g, p, v));
}

static ir_node *decompose_attention(ir_graph *g, const ir_node *n) {
  int64_t T = n->type.dims[1], S = n->in[1]->type.dims[1];
  ir_node *masked = NULL;
  if (ir_attr_bool(n, "causal")) /* the diagonal is never masked */
    masked = ir_attn_masked(g, T, S, ir_attr_int(n, "window"));
  return pass_attention_form(g, n, n->in[0], n->in[1], n->in[2], masked);
}

/* rope: x viewed as [..., T, heads, 2, hd/2] (rotate-half) or [..., T,
 * heads, hd/2, 2] (interleaved); the halves x0, x1 of each pair become x0 c
 * - x1 s and x1 c + x0 s, with c, s the cos and sin of the angle p f_i,
 * f_i = theta^(-2i/hd) = exp(-2i ln(theta) / hd) computed in f64 and
 * rounded once. */
static ir_node *decompose_rope(ir_graph *g, const ir_node *n) {
  const dsc_type *xt = &n->in[0]->type, *pt = &n->in[1]->type;
  dsc_dtype dt = n->type.dtype, cd = compute_dtype(dt);
  int r = xt->rank;
  int64_t C = xt->dims[r - 1], H = ir_attr_int(n, "heads"), hd = C / H, half = hd / 2;
  bool inter = ir_attr_bool(n, "interleaved");
  int64_t pair_axis = inter ? r + 1 : r, split[DSC_MAX_RANK];
  for (int d = 0; d < r - 1; d++) split[d] = xt->dims[d];
  split[r - 1] = H, split[r] = inter ? half : 2, split[r + 1] = inter ? 2 : half;
  ir_node *x = dsc_reshape(g, to(g, n->in[0], cd), split, r + 2);
  ir_node *f = un(g, DSC_OP_EXP,
                  bin(g, DSC_OP_MUL, iota(g, 0, DSC_F64, &half, 1),
                      scalar(g, -2.0 * log(ir_attr_float(n, "theta")) / (double)hd, DSC_F64)));
  double factor = ir_attr_float(n, "factor");
  if (factor != 1) { /* llama3: as ir_rope_freq, on the wavelengths 2 pi / f */
    double lo = ir_attr_float(n, "low_freq_factor"), hi = ir_attr_float(n, "high_freq_factor");
    double old = (double)ir_attr_int(n, "original_context");
    ir_node *wl = bin(g, DSC_OP_DIV, scalar(g, 2 * M_PI, DSC_F64), f);
    ir_node *slow = bin(g, DSC_OP_DIV, f, scalar(g, factor, DSC_F64));
    ir_node *s = bin(
        g, DSC_OP_DIV,
        bin(g, DSC_OP_SUB, bin(g, DSC_OP_DIV, scalar(g, old, DSC_F64), wl), scalar(g, lo, DSC_F64)),
        scalar(g, hi - lo, DSC_F64));
    ir_node *mid =
        bin(g, DSC_OP_ADD, bin(g, DSC_OP_MUL, bin(g, DSC_OP_SUB, scalar(g, 1, DSC_F64), s), slow),
            bin(g, DSC_OP_MUL, s, f));
    f = where(g, bin(g, DSC_OP_LESS, wl, scalar(g, old / hi, DSC_F64)), f,
              where(g, bin(g, DSC_OP_GREATER, wl, scalar(g, old / lo, DSC_F64)), slow, mid));
  }
  /* angles [..., T, 1, 1, hd/2] or [..., T, 1, hd/2, 1] over the positions' axes */
  int64_t pshape[DSC_MAX_RANK], fshape[3] = {1, inter ? half : 1, inter ? 1 : half};
  for (int d = 0; d < pt->rank; d++) pshape[d] = pt->dims[d];
  pshape[pt->rank] = pshape[pt->rank + 1] = pshape[pt->rank + 2] = 1;
  ir_node *pos = dsc_reshape(g, to(g, n->in[1], cd), pshape, pt->rank + 3);
  ir_node *a = bin(g, DSC_OP_MUL, pos, dsc_reshape(g, to(g, f, cd), fshape, 3));
  ir_node *c = un(g, DSC_OP_COS, a), *sn = un(g, DSC_OP_SIN, a);
  dsc_attr s0[3] = {dsc_attr_int("axis", pair_axis), dsc_attr_int("start", 0),
                    dsc_attr_int("end", 1)};
  dsc_attr s1[3] = {dsc_attr_int("axis", pair_axis), dsc_attr_int("start", 1),
                    dsc_attr_int("end", 2)};
  ir_node *x0 = dsc_build(g, DSC_OP_SLICE, &x, 1, s0, 3);
  ir_node *x1 = dsc_build(g, DSC_OP_SLICE, &x, 1, s1, 3);
  ir_node *y0 = bin(g, DSC_OP_SUB, bin(g, DSC_OP_MUL, x0, c), bin(g, DSC_OP_MUL, x1, sn));
  ir_node *y1 = bin(g, DSC_OP_ADD, bin(g, DSC_OP_MUL, x1, c), bin(g, DSC_OP_MUL, x0, sn));
  dsc_attr ca = dsc_attr_int("axis", pair_axis);
  ir_node *y = dsc_build(g, DSC_OP_CONCAT, (ir_node *[]){y0, y1}, 2, &ca, 1);
  return to(g, dsc_reshape(g, y, xt->dims, r), dt);
}

static ir_node *decompose_cross_entropy(ir_graph *g, const ir_node *n) {
  ir_node *tg = n->in[1];
  const dsc_type *lt = &n->in[0]->type;
  dsc_dtype cd = compute_dtype(n->type.dtype);
  int64_t ax = lt->rank - 1, V = lt->dims[ax];
  ir_node *x = to(g, n->in[0], cd);
  ir_node *d = bin(g, DSC_OP_SUB, x, reduce_keep(g, DSC_OP_MAX, x, ax));
  ir_node *lse = un(g, DSC_OP_LOG, reduce_keep(g, DSC_OP_SUM, un(g, DSC_OP_EXP, d), ax));
  /* The target as a float [..., 1] through a bounds-checked gather (see the
   * file comment); integers are exact in f32 up to 2^24. */
  dsc_dtype kd = V <= (INT64_C(1) << 24) ? DSC_F32 : DSC_F64;
  int64_t tab_shape[2] = {V, 1};
  ir_node *target =
      dsc_build(g, DSC_OP_EMBEDDING, (ir_node *[]){iota(g, 0, kd, tab_shape, 2), tg}, 2, NULL, 0);
  ir_node *hot = bin(g, DSC_OP_EQUAL, iota(g, 0, kd, &V, 1), target); /* [..., V] */
  ir_node *pick = reduce_keep(g, DSC_OP_SUM, where(g, hot, d, scalar(g, 0.0, cd)), ax);
  ir_node *per_pos = bin(g, DSC_OP_SUB, lse, pick); /* [..., 1] */
  int64_t axes[DSC_MAX_RANK];
  int r = per_pos ? per_pos->type.rank : 0;
  for (int i = 0; i < r; i++) axes[i] = i;
  return to(g, dsc_reduce(g, DSC_OP_MEAN, per_pos, axes, r, 0), n->type.dtype);
}

/* dropout: where(rand24(seed, counter) < threshold, 0, x * 1/(1-p)), the
 * counter stream 2^40 + the row-major index built from one iota per axis;
 * all elementwise, so it fuses into the kernels around it, forward and
 * backward alike. */
static ir_node *decompose_dropout(ir_graph *g, const ir_node *n) {
  const dsc_type *t = &n->type;
  double p = ir_attr_float(n, "p");
  dsc_dtype cd = compute_dtype(t->dtype);
  ir_node *ctr = scalar(g, (double)(ir_attr_int(n, "stream") << IR_DROPOUT_STREAM_SHIFT), DSC_I64);
  int64_t stride = 1;
  for (int d = t->rank - 1; d >= 0; d--) {
    if (t->dims[d] > 1) {
      ir_node *ix = iota(g, d, DSC_I64, t->dims, t->rank);
      if (stride > 1) ix = bin(g, DSC_OP_MUL, ix, scalar(g, (double)stride, DSC_I64));
      ctr = bin(g, DSC_OP_ADD, ctr, ix);
    }
    stride *= t->dims[d];
  }
  ir_node *seed = dsc_reshape(g, n->in[1], NULL, 0);
  ir_node *drop = bin(g, DSC_OP_LESS, bin(g, DSC_OP_RAND24, seed, ctr),
                      scalar(g, (double)ir_dropout_threshold(p), DSC_I64));
  ir_node *y = bin(g, DSC_OP_MUL, to(g, n->in[0], cd), scalar(g, 1.0 / (1.0 - p), cd));
  return to(g, where(g, drop, scalar(g, 0, cd), y), t->dtype);
}

/* Builds the replacement of composite n (its inputs already redirected in
 * `in`) at the end of g. */
static ir_node *decompose_node(ir_graph *g, const ir_node *n) {
  switch (n->op) {
    case DSC_OP_SOFTMAX:
    case DSC_OP_LOG_SOFTMAX:
      return decompose_softmax(g, n);
    case DSC_OP_LAYERNORM:
    case DSC_OP_RMSNORM:
      return decompose_norm(g, n);
    case DSC_OP_ATTENTION:
      return decompose_attention(g, n);
    case DSC_OP_ROPE:
      return decompose_rope(g, n);
    case DSC_OP_DROPOUT:
      return decompose_dropout(g, n);
    case DSC_OP_CROSS_ENTROPY:
      return decompose_cross_entropy(g, n);
    default:
      return NULL;
  }
}

/* ---------------------------------------------------------------- surgery */

static dsc_status decompose_graph(ir_module *m, ir_graph *g) {
  int n_old = g->n_nodes, n_comp = 0;
  for (int i = 0; i < n_old; i++) n_comp += pass_decompose_op(g->nodes[i]->op);
  if (n_comp == 0) return DSC_OK;
  ir_arena *a = &m->arena;
  dsc_loc saved = g->cur_loc;
  /* repl[i]: what old node i's uses read (itself unless replaced);
   * first[i]..first[i+1]: replacement nodes appended for the k-th composite */
  ir_node **repl = ir_arena_alloc(a, sizeof(ir_node *) * (size_t)n_old);
  ir_node **in_buf = NULL;
  int *range = ir_arena_alloc(a, sizeof(int) * (size_t)(2 * n_old));
  if (!repl || !range) goto oom;
  for (int i = 0; i < n_old; i++) repl[i] = g->nodes[i];

  /* Phase 1: append the replacements (old nodes untouched). A composite's
   * view of its inputs goes through a scratch copy with redirected inputs. */
  for (int i = 0; i < n_old; i++) {
    ir_node *n = g->nodes[i];
    if (!pass_decompose_op(n->op)) continue;
    ir_node view = *n;
    if (!(in_buf = ir_arena_alloc(a, sizeof(ir_node *) * (size_t)n->n_in))) goto oom_restore;
    for (int j = 0; j < n->n_in; j++) in_buf[j] = repl[n->in[j]->id];
    view.in = in_buf;
    g->cur_loc = n->loc; /* the new nodes point at the composite's source */
    range[2 * i] = g->n_nodes;
    ir_node *r = decompose_node(g, &view);
    range[2 * i + 1] = g->n_nodes;
    if (!r) goto fail_restore;
    if (n->role == IR_ROLE_RECOMPUTED) /* cse keeps a recomputed attention's matmuls */
      for (int k = range[2 * i]; k < range[2 * i + 1]; k++) g->nodes[k]->role = n->role;
    if (!dsc_type_equal(&r->type, &n->type)) {
      char t1[128], t2[128];
      dsc_type_format(&n->type, t1, sizeof t1);
      dsc_type_format(&r->type, t2, sizeof t2);
      ir_error(m->ctx, n->loc, "decompose: internal: %s %s decomposed to %s", dsc_op_name(n->op),
               t1, t2);
      goto fail_restore;
    }
    repl[i] = r;
  }
  g->cur_loc = saved;

  /* Phase 2 (cannot fail once the array exists): the old kept nodes and the
   * replacements in SSA order, uses redirected, ids renumbered. */
  int total = g->n_nodes - n_comp;
  ir_node **order = ir_arena_alloc(a, sizeof(ir_node *) * (size_t)total);
  if (!order) goto oom_truncate;
  int k = 0;
  for (int i = 0; i < n_old; i++) {
    ir_node *n = g->nodes[i];
    if (pass_decompose_op(n->op)) {
      for (int j = range[2 * i]; j < range[2 * i + 1]; j++) order[k++] = g->nodes[j];
      continue;
    }
    for (int j = 0; j < n->n_in; j++) n->in[j] = repl[n->in[j]->id];
    order[k++] = n;
  }
  for (int o = 0; o < g->n_outputs; o++) g->outputs[o] = repl[g->outputs[o]->id];
  for (int i = 0; i < total; i++) order[i]->id = i;
  g->nodes = order;
  g->n_nodes = g->cap_nodes = total;
  return DSC_OK;

oom_restore:
  g->cur_loc = saved;
oom_truncate:
  g->n_nodes = n_old;
oom:
  ir_error(m->ctx, ir_no_loc, "decompose: out of memory in graph '%s'", g->name);
  return DSC_ERR_INTERNAL;
fail_restore:
  g->cur_loc = saved;
  g->n_nodes = n_old; /* the appended nodes are abandoned to the arena */
  return DSC_ERR_INTERNAL;
}

dsc_status pass_decompose_run(ir_module *m) {
  for (int i = 0; i < m->n_graphs; i++) {
    dsc_status st = decompose_graph(m, m->graphs[i]);
    if (st != DSC_OK) return st;
  }
  return DSC_OK;
}
