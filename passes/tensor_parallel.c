/* Tensor parallelism (Megatron-LM's, as DeepSpeed's AutoTP chooses it;
 * docs/parallelism.md): graph 'forward' becomes one rank's program of the
 * `tp` mesh axis (cfg->tp ranks), each of which computes 1/tp of every
 * attention's heads and of every MLP's hidden units.
 *
 * The pass looks for row-parallel matmuls: matmul(h, W2), W2 a param [F, d]
 * (or its cast), whose input h [..., F] is column-local: computed column by
 * column from matmuls by params, matmul(x, W1) with W1 [k, F], through
 *   - elementwise ops (the other operands: the same kind of value, a bias
 *     [F], or a value broadcast along the columns);
 *   - slices along the last axis (the fused q/k/v projection's q, k, v);
 *   - rope (per head) and attention (q, k, v split by heads: rank r holds
 *     heads [r H/tp, (r+1) H/tp) and the kv heads they read).
 * It then computes the rank's 1/tp of h's columns, with W1 column-parallel
 * (each rank's block of columns of every slice read) and W2 row-parallel
 * (the matching block of rows), and sums the ranks' partial products with
 * an all_reduce over tp. In Megatron's words: q/k/v and the MLP's up (and
 * gate) projections are column-parallel, attention's output and the MLP's
 * down projection row-parallel.
 *
 * The output layer and the loss are vocabulary-parallel:
 * cross_entropy(matmul(h, W), targets), W [d, V] (a param, its cast or
 * transpose: tied embeddings), V divisible by tp, becomes the rank's logits
 * [.., V/tp] (W's block of columns) and the loss from them: each rank's
 * log-sum-exp over its columns, all_gather'ed over tp and combined; the
 * target's logit from the rank whose columns hold it (all_reduce). Norms
 * and embeddings run whole on every rank.
 *
 * Params stay whole on every rank: a rank reads its block (local_shard
 * over tp, whose gradient is the block's, zeros elsewhere). Autodiff takes
 * an all_reduce's adjoint as the all_reduce of the gradient, so every
 * rank's gradients are exact derivatives of the mean loss over all ranks,
 * and the zero pass's mean over the world is the mean over the data ranks
 * (tp ranks train on the same sequences). */
#include <inttypes.h>
#include <string.h>

#include "passes/passes.h"

typedef struct {
  const ir_node *v;
  int64_t a, w;
  ir_node *local;
} tp_memo;

typedef struct {
  ir_module *m;
  ir_graph *g;
  int64_t tp;
  tp_memo *memo;
  int n_memo, cap_memo;
  int quiet; /* > 0: probe() reports no error */
  bool failed;
} tp_state;

enum { TP_NO = 0, TP_YES = 1, TP_ERROR = -1 };

static ir_node *checked(tp_state *s, ir_node *x) {
  if (!x) s->failed = true;
  return x;
}

/* The param behind w (a param of rank `rank` or its cast), else NULL. */
static const ir_node *param_of(const ir_node *w, int rank) {
  const ir_node *p = w->op == DSC_OP_CAST ? w->in[0] : w;
  return p->op == DSC_OP_PARAM && w->type.rank == rank ? p : NULL;
}

static int64_t last_dim(const ir_node *x) {
  return x->type.rank ? x->type.dims[x->type.rank - 1] : 1;
}

/* Whether columns [a, a+w) of v split into tp head-aligned blocks. */
static int divides(tp_state *s, const ir_node *v, int64_t w, int64_t heads, const char *what) {
  if (w % s->tp == 0 && (heads <= 0 || heads % s->tp == 0)) return TP_YES;
  if (s->quiet) return TP_ERROR;
  if (heads > 0)
    ir_error(s->m->ctx, v->loc,
             "tensor parallel (tp=%" PRId64 ") gives each rank 1/tp of this %s's %s: %s %" PRId64
             " is not divisible by %" PRId64 "; use a tp that divides it",
             s->tp, dsc_op_name(v->op), what, what, heads, s->tp);
  else
    ir_error(s->m->ctx, v->loc,
             "tensor parallel (tp=%" PRId64 ") splits this %s's %" PRId64
             " columns over the ranks: not divisible by %" PRId64,
             s->tp, dsc_op_name(v->op), w, s->tp);
  return TP_ERROR;
}

/* Whether columns [a, a+w) of v (w: its last dim or a part of it) are
 * column-local: TP_YES, TP_NO, or TP_ERROR (reported) when they are but do
 * not split over tp. */
static int probe(tp_state *s, const ir_node *v, int64_t a, int64_t w) {
  int64_t N = last_dim(v);
  if (v->type.rank < 2 || a < 0 || a + w > N) return TP_NO;
  switch (v->op) {
    case DSC_OP_MATMUL:
      return param_of(v->in[1], 2) ? divides(s, v, w, 0, NULL) : TP_NO;
    case DSC_OP_SLICE:
      if (ir_attr_int(v, "axis") != v->type.rank - 1) return TP_NO;
      return probe(s, v->in[0], ir_attr_int(v, "start") + a, w);
    case DSC_OP_ROPE: {
      int64_t H = ir_attr_int(v, "heads"), hd = H > 0 ? N / H : 0;
      if (hd <= 0 || a % hd != 0 || w % hd != 0) return TP_NO;
      int r = probe(s, v->in[0], a, w);
      return r == TP_YES ? divides(s, v, w, w / hd, "heads") : r;
    }
    case DSC_OP_ATTENTION: {
      if (a != 0 || w != N) return TP_NO;
      int64_t H = ir_attr_int(v, "heads"), KVH = ir_attr_int(v, "kv_heads");
      int r = TP_YES;
      s->quiet++; /* the attention's own numbers first: a rope's heads are its kv_heads */
      for (int i = 0; i < 3 && r == TP_YES; i++) r = probe(s, v->in[i], 0, last_dim(v->in[i]));
      s->quiet--;
      if (r == TP_NO) return r;
      int h = divides(s, v, w, H, "heads");
      if (h == TP_YES && KVH > 0) h = divides(s, v, w, KVH, "kv_heads");
      for (int i = 0; i < 3 && h == TP_YES; i++) h = probe(s, v->in[i], 0, last_dim(v->in[i]));
      return h;
    }
    default:
      break;
  }
  if (ir_op(v->op)->cg != IR_CG_ELEMENTWISE) return TP_NO;
  bool any = false;
  for (int j = 0; j < v->n_in; j++) {
    const ir_node *x = v->in[j];
    if (last_dim(x) != N || x->type.rank == 0) continue; /* broadcast along the columns */
    if (dsc_type_equal(&x->type, &v->type)) {
      int r = probe(s, x, a, w);
      if (r == TP_ERROR) return r;
      any |= r == TP_YES;
    }
  }
  return any ? TP_YES : TP_NO;
}

static ir_node *reshape(tp_state *s, ir_node *x, const int64_t *dims, int rank) {
  return x ? checked(s, dsc_reshape(s->g, x, dims, rank)) : NULL;
}

static ir_node *slice_last(tp_state *s, ir_node *x, int64_t a, int64_t w) {
  if (!x || (a == 0 && w == last_dim(x))) return x;
  dsc_attr at[3] = {dsc_attr_int("axis", x->type.rank - 1), dsc_attr_int("start", a),
                    dsc_attr_int("end", a + w)};
  return checked(s, dsc_build(s->g, DSC_OP_SLICE, &x, 1, at, 3));
}

/* This rank's block of columns [a, a+w) of any value x [..., N]: the
 * columns as [tp, ..., w/tp] (the rank's block leading, so that the flat
 * value's chunk is the block), then local_shard over tp. A cast of a param
 * is the cast of the param's block. */
static ir_node *column_block(tp_state *s, ir_node *x, int64_t a, int64_t w) {
  if (x->op == DSC_OP_CAST && x->in[0]->op == DSC_OP_PARAM) {
    ir_node *b = column_block(s, x->in[0], a, w);
    return b ? checked(s, dsc_cast(s->g, b, x->type.dtype)) : NULL;
  }
  int r = x->type.rank;
  int64_t dims[DSC_MAX_RANK + 1], perm[DSC_MAX_RANK + 1],
      n = dsc_type_numel(&x->type) / last_dim(x);
  memcpy(dims, x->type.dims, sizeof(int64_t) * (size_t)r);
  dims[r - 1] = s->tp, dims[r] = w / s->tp;
  ir_node *y = reshape(s, slice_last(s, x, a, w), dims, r + 1);
  if (r > 1) { /* [..., tp, w/tp] -> [tp, ..., w/tp] */
    perm[0] = r - 1;
    for (int i = 0; i < r - 1; i++) perm[i + 1] = i;
    perm[r] = r;
    y = y ? checked(s, dsc_permute(s->g, y, perm, r + 1)) : NULL;
  }
  int64_t flat = n * w;
  y = reshape(s, y, &flat, 1);
  y = y ? checked(s, pass_local_shard(s->g, y, s->tp, "tp")) : NULL;
  dims[r - 1] = w / s->tp;
  return reshape(s, y, dims, r);
}

/* This rank's block of rows of a param (or cast) [F, d]: a view's chunk. */
static ir_node *row_block(tp_state *s, ir_node *x) {
  if (x->op == DSC_OP_CAST) {
    ir_node *b = row_block(s, x->in[0]);
    return b ? checked(s, dsc_cast(s->g, b, x->type.dtype)) : NULL;
  }
  int64_t flat = dsc_type_numel(&x->type), dims[2] = {x->type.dims[0] / s->tp, x->type.dims[1]};
  ir_node *y = reshape(s, x, &flat, 1);
  y = y ? checked(s, pass_local_shard(s->g, y, s->tp, "tp")) : NULL;
  return reshape(s, y, dims, 2);
}

/* v's op on new inputs, with attrs "heads" and "kv_heads" over tp (heads
 * > 0: "heads" set to that instead). */
static ir_node *rebuild(tp_state *s, const ir_node *v, ir_node **in, int64_t heads) {
  dsc_attr at[16];
  int na = v->n_attrs < 16 ? v->n_attrs : 16;
  if (na > 0) memcpy(at, v->attrs, sizeof(dsc_attr) * (size_t)na);
  for (int k = 0; k < na; k++)
    if (strcmp(at[k].key, "heads") == 0 && heads > 0)
      at[k].u.i = heads;
    else if (strcmp(at[k].key, "heads") == 0 || strcmp(at[k].key, "kv_heads") == 0)
      at[k].u.i /= s->tp;
  dsc_graph_set_loc(s->g, v->loc);
  return checked(s, dsc_build(s->g, v->op, in, v->n_in, at, na));
}

/* The rank's block of columns [a, a+w) of v, which probe() accepted. */
static ir_node *local(tp_state *s, ir_node *v, int64_t a, int64_t w) {
  for (int i = 0; i < s->n_memo; i++)
    if (s->memo[i].v == v && s->memo[i].a == a && s->memo[i].w == w) return s->memo[i].local;
  ir_node *in[8] = {0}, *y = NULL;
  int64_t N = last_dim(v);
  if (v->n_in > 8) return checked(s, NULL);
  switch (v->op) {
    case DSC_OP_MATMUL:
      in[0] = v->in[0], in[1] = column_block(s, v->in[1], a, w);
      y = in[1] ? rebuild(s, v, in, 0) : NULL;
      break;
    case DSC_OP_SLICE:
      y = local(s, v->in[0], ir_attr_int(v, "start") + a, w);
      break;
    case DSC_OP_ROPE:
      in[0] = local(s, v->in[0], a, w), in[1] = v->in[1];
      /* the block's heads: w / hd of them, over tp */
      if (in[0]) y = rebuild(s, v, in, w / (N / ir_attr_int(v, "heads")) / s->tp);
      break;
    case DSC_OP_ATTENTION:
      for (int i = 0; i < v->n_in; i++)
        in[i] = i < 3 ? local(s, v->in[i], 0, last_dim(v->in[i])) : v->in[i];
      y = in[0] && in[1] && in[2] ? rebuild(s, v, in, 0) : NULL;
      break;
    default: /* elementwise */
      for (int j = 0; j < v->n_in && !s->failed; j++) {
        ir_node *x = v->in[j];
        if (last_dim(x) != N || x->type.rank == 0)
          in[j] = x; /* broadcast along the columns */
        else if (dsc_type_equal(&x->type, &v->type) && probe(s, x, a, w) == TP_YES)
          in[j] = local(s, x, a, w);
        else
          in[j] = column_block(s, x, a, w); /* a bias, or another value: its block */
      }
      y = s->failed ? NULL : rebuild(s, v, in, 0);
      break;
  }
  if (!y || !ir_grow(&s->m->arena, (void **)&s->memo, &s->cap_memo, s->n_memo + 1, sizeof(tp_memo)))
    return checked(s, NULL);
  s->memo[s->n_memo++] = (tp_memo){v, a, w, y};
  return y;
}

/* matmul(h, W2) as the sum over tp of the ranks' partial products. */
static ir_node *row_parallel(tp_state *s, ir_node *mm) {
  ir_node *in[2] = {local(s, mm->in[0], 0, last_dim(mm->in[0])), row_block(s, mm->in[1])};
  if (!in[0] || !in[1]) return NULL;
  dsc_graph_set_loc(s->g, mm->loc);
  ir_node *part = checked(s, dsc_build(s->g, DSC_OP_MATMUL, in, 2, NULL, 0));
  ir_node *st =
      part ? checked(s, pass_collective_start(s->g, DSC_OP_ALL_REDUCE_START, part, s->tp, "tp"))
           : NULL;
  return st ? checked(s, dsc_build(s->g, DSC_OP_ALL_REDUCE_WAIT, &st, 1, NULL, 0)) : NULL;
}

static ir_node *reduce(tp_state *s, dsc_op op, ir_node *x, int64_t axis, bool keep) {
  return x ? checked(s, dsc_reduce(s->g, op, x, &axis, 1, keep)) : NULL;
}

static ir_node *binary(tp_state *s, dsc_op op, ir_node *a, ir_node *b) {
  return a && b ? checked(s, dsc_binary(s->g, op, a, b)) : NULL;
}

static ir_node *unary(tp_state *s, dsc_op op, ir_node *x) {
  return x ? checked(s, dsc_unary(s->g, op, x)) : NULL;
}

/* log(sum(exp(x))) over axis, stable: m + log(sum(exp(x - m))), m the max
 * (its gradient cancels: the result's derivative in m is zero). */
static ir_node *logsumexp(tp_state *s, ir_node *x, int64_t axis) {
  ir_node *m = reduce(s, DSC_OP_MAX, x, axis, true);
  ir_node *e = unary(s, DSC_OP_EXP, binary(s, DSC_OP_SUB, x, m));
  ir_node *l = unary(s, DSC_OP_LOG, reduce(s, DSC_OP_SUM, e, axis, true));
  return binary(s, DSC_OP_ADD, l, m);
}

static ir_node *collective(tp_state *s, dsc_op start, dsc_op wait, ir_node *x) {
  ir_node *st = x ? checked(s, pass_collective_start(s->g, start, x, s->tp, "tp")) : NULL;
  return st ? checked(s, dsc_build(s->g, wait, &st, 1, NULL, 0)) : NULL;
}

/* The logits of cross_entropy ce: its input, or what that casts (mixed
 * precision computes the loss in f32 from bf16 logits). */
static ir_node *logits_matmul(ir_node *ce) {
  ir_node *x = ce->in[0];
  return x->op == DSC_OP_CAST ? x->in[0] : x;
}

/* cross_entropy(matmul(h, W), targets) over the rank's V/tp columns of the
 * logits [.., V]: mean over tokens of logsumexp(all logits) - the target's
 * logit, in f32. */
static ir_node *vocab_parallel_loss(tp_state *s, ir_node *ce) {
  ir_node *mm = logits_matmul(ce), *tg = ce->in[1];
  int r = mm->type.rank;
  int64_t V = last_dim(mm), Vl = V / s->tp, tokens = dsc_type_numel(&tg->type);
  dsc_graph_set_loc(s->g, mm->loc);
  ir_node *in[2] = {mm->in[0], column_block(s, mm->in[1], 0, V)};
  ir_node *l = in[1] ? checked(s, dsc_build(s->g, DSC_OP_MATMUL, in, 2, NULL, 0)) : NULL;
  dsc_graph_set_loc(s->g, ce->loc);
  if (l && l->type.dtype != DSC_F32) l = checked(s, dsc_cast(s->g, l, DSC_F32));
  /* every rank's log-sum-exp of its columns, side by side: [tp, tokens] */
  int64_t one[2] = {1, tokens}, col[2] = {tokens, 1};
  ir_node *part = reshape(s, logsumexp(s, l, r - 1), one, 2);
  ir_node *lse =
      logsumexp(s, collective(s, DSC_OP_ALL_GATHER_START, DSC_OP_ALL_GATHER_WAIT, part), 0);
  /* the target's logit: column t - rank Vl on the rank whose block holds it */
  dsc_attr io[3] = {dsc_attr_int("axis", 0), dsc_attr_dtype("dtype", tg->type.dtype),
                    dsc_attr_ints("shape", &s->tp, 1)};
  ir_node *ranks = checked(s, dsc_build(s->g, DSC_OP_IOTA, NULL, 0, io, 3));
  ir_node *me = ranks ? checked(s, pass_local_shard(s->g, ranks, s->tp, "tp")) : NULL;
  ir_node *width = checked(s, dsc_const(s->g, (double)Vl, dsc_type_make(tg->type.dtype, 0, NULL)));
  ir_node *t = binary(s, DSC_OP_SUB, reshape(s, tg, col, 2), binary(s, DSC_OP_MUL, me, width));
  io[2] = dsc_attr_ints("shape", &Vl, 1);
  ir_node *cols = checked(s, dsc_build(s->g, DSC_OP_IOTA, NULL, 0, io, 3));
  ir_node *hot = binary(s, DSC_OP_EQUAL, t, cols); /* [tokens, Vl] */
  hot = hot ? checked(s, dsc_cast(s->g, hot, DSC_F32)) : NULL;
  int64_t flat[2] = {tokens, Vl};
  ir_node *picked =
      reduce(s, DSC_OP_SUM, binary(s, DSC_OP_MUL, hot, reshape(s, l, flat, 2)), 1, false);
  picked =
      collective(s, DSC_OP_ALL_REDUCE_START, DSC_OP_ALL_REDUCE_WAIT, reshape(s, picked, one, 2));
  int64_t both[2] = {0, 1};
  ir_node *diff = binary(s, DSC_OP_SUB, lse, picked); /* [1, tokens] */
  ir_node *loss = diff ? checked(s, dsc_reduce(s->g, DSC_OP_MEAN, diff, both, 2, false)) : NULL;
  if (loss && loss->type.dtype != ce->type.dtype)
    loss = checked(s, dsc_cast(s->g, loss, ce->type.dtype));
  return loss;
}

/* A cross_entropy of logits matmul(h, W), W rank 2, V divisible by tp. */
static bool vocab_parallel(const tp_state *s, ir_node *ce) {
  if (ce->op != DSC_OP_CROSS_ENTROPY) return false;
  const ir_node *mm = logits_matmul(ce);
  return mm->op == DSC_OP_MATMUL && mm->in[1]->type.rank == 2 && mm->type.rank >= 2 &&
         last_dim(mm) % s->tp == 0;
}

dsc_status pass_tensor_parallel_run(ir_module *m, const dsc_train_config *cfg) {
  if (!cfg || cfg->tp <= 1) return DSC_OK;
  dsc_status st = DSC_OK;
  ir_graph *g = pass_mesh_forward(m, "tensor parallel", "tp", cfg->tp, cfg->world, &st);
  if (!g) return st;
  tp_state s = {m, g, cfg->tp, NULL, 0, 0, 0, false};
  int n = g->n_nodes, pairs = 0;
  for (int i = 0; i < n && !s.failed; i++) {
    ir_node *mm = g->nodes[i];
    if (vocab_parallel(&s, mm)) {
      ir_node *loss = vocab_parallel_loss(&s, mm);
      if (!loss) break;
      pass_replace_uses(g, mm, loss);
      continue;
    }
    if (mm->op != DSC_OP_MATMUL || !param_of(mm->in[1], 2) || mm->in[0]->type.rank < 2) continue;
    int r = probe(&s, mm->in[0], 0, last_dim(mm->in[0]));
    if (r == TP_ERROR) return DSC_ERR_USER;
    if (r == TP_NO) continue;
    ir_node *y = row_parallel(&s, mm);
    if (!y) break;
    pass_replace_uses(g, mm, y);
    pairs++;
  }
  if (s.failed) {
    ir_error(m->ctx, ir_no_loc,
             "tensor parallel: could not build the rank's graph (out of memory?)");
    return DSC_ERR_INTERNAL;
  }
  if (pairs == 0) {
    ir_error(m->ctx, ir_no_loc,
             "tensor parallel (tp=%" PRId64
             "): graph 'forward' has nothing to split: no matmul by "
             "a param [F, d] whose input is computed column by column from matmuls by params "
             "(attention's output projection, an MLP's down projection)",
             cfg->tp);
    return DSC_ERR_USER;
  }
  return pass_reorder(g, n, NULL, 0);
}
