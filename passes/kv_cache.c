/* The inference graph of a token model with a KV cache (issue 23;
 * docs/inference.md).
 *
 * A forward graph compiled at [B, t] is copied node by node into a graph of
 * the inference module with three changes:
 *   positions   iota(T), as the token and rope positions, becomes pos[b] +
 *               iota(t) ([B, t]), clamped to the cache's last position so
 *               that a padded last chunk reads a valid row of a position
 *               table (what padding computes is never read);
 *   attention   the row's keys and values are written into states kv.<i>.k
 *               and kv.<i>.v [B, context, C] at their positions, and the
 *               queries attend to the whole cache, masked where a key's
 *               position is after the query's (or, with a window W, W or
 *               more before it): positions not yet written are never seen,
 *               and what a slot held for an earlier sequence is masked;
 *   the loss    cross_entropy(logits, targets) becomes the logits of token
 *               last[b] of each row: the last matmul reads that row only.
 * The cache write is a where over the cache (the row's keys gathered to the
 * positions they land on), so the graph needs no new op and the
 * interpreter, the CPU code generator and CUDA all run it as they are.
 * With t = 1 the gather is a broadcast of the one key. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "passes/passes.h"

typedef struct {
  ir_module *dst;
  ir_graph *g;
  const ir_graph *fwd;
  int64_t B, t, context;
  ir_node *tokens, *pos, *last;
  ir_node *positions; /* [B, t] i32: the queries' positions, unclamped */
  ir_node *clamped;   /* the same, at most context - 1 */
  int attentions;
} kv_builder;

static ir_node *i32_const(ir_graph *g, double v) {
  dsc_type t;
  memset(&t, 0, sizeof t);
  t.dtype = DSC_I32;
  return dsc_const(g, v, t);
}

static ir_node *iota2(ir_graph *g, int64_t axis, int64_t d0, int64_t d1) {
  int64_t shape[2] = {d0, d1};
  dsc_attr a[3] = {dsc_attr_int("axis", axis), dsc_attr_dtype("dtype", DSC_I32),
                   dsc_attr_ints("shape", shape, 2)};
  return dsc_build(g, DSC_OP_IOTA, NULL, 0, a, 3);
}

static ir_node *where3(ir_graph *g, ir_node *c, ir_node *a, ir_node *b) {
  ir_node *in[3] = {c, a, b};
  return dsc_build(g, DSC_OP_WHERE, in, 3, NULL, 0);
}

/* min(x, hi) for i32 x */
static ir_node *at_most(ir_graph *g, ir_node *x, int64_t hi) {
  ir_node *h = i32_const(g, (double)hi);
  return where3(g, dsc_binary(g, DSC_OP_GREATER, x, h), h, x);
}

static ir_node *reshape(ir_graph *g, ir_node *x, int64_t d0, int64_t d1, int64_t d2, int rank) {
  int64_t shape[3] = {d0, d1, d2};
  return dsc_reshape(g, x, shape, rank);
}

/* cache [B, S, C] with the row's x [B, t, C] written at positions pos[b] ..
 * pos[b] + t - 1 (those below S). */
static ir_node *write_rows(kv_builder *b, ir_node *cache, ir_node *x) {
  ir_graph *g = b->g;
  int64_t B = b->B, t = b->t, S = b->context, C = x->type.dims[2];
  ir_node *rel = dsc_binary(g, DSC_OP_SUB, iota2(g, 1, B, S), reshape(g, b->pos, B, 1, 0, 2));
  ir_node *landed, *vals;
  if (t == 1) {
    landed = dsc_binary(g, DSC_OP_EQUAL, rel, i32_const(g, 0));
    vals = x; /* [B, 1, C] broadcasts over S */
  } else {
    /* the row's token that lands on each position (clamped): rel itself
     * where 0 <= rel < t */
    ir_node *r = at_most(g, dsc_binary(g, DSC_OP_MAXIMUM, rel, i32_const(g, 0)), t - 1);
    landed = dsc_binary(g, DSC_OP_EQUAL, rel, r);
    ir_node *row0 = dsc_binary(g, DSC_OP_MUL, iota2(g, 0, B, S), i32_const(g, (double)t));
    int64_t flat[2] = {B * t, C};
    ir_node *in[2] = {dsc_reshape(g, x, flat, 2), dsc_binary(g, DSC_OP_ADD, row0, r)};
    vals = dsc_build(g, DSC_OP_EMBEDDING, in, 2, NULL, 0); /* [B, S, C] */
  }
  return where3(g, reshape(g, landed, B, S, 1, 3), vals, cache);
}

static ir_node *cache_state(kv_builder *b, const ir_node *like, const char *kind,
                            const dsc_loc *loc) {
  char name[64];
  snprintf(name, sizeof name, "kv.%d.%s", b->attentions, kind);
  dsc_type ty = like->type;
  ty.dims[1] = b->context;
  int i = dsc_module_find_param(b->dst, name);
  if (i < 0) {
    dsc_init zeros = {DSC_INIT_ZEROS, 0, 0, NULL};
    if (dsc_module_add_state(b->dst, name, ty, zeros) != DSC_OK) return NULL;
  } else {
    dsc_type have = dsc_module_param_type(b->dst, i);
    if (!dsc_type_equal(&have, &ty)) {
      char t1[96], t2[96];
      dsc_type_format(&have, t1, sizeof t1);
      dsc_type_format(&ty, t2, sizeof t2);
      ir_error(b->dst->ctx, *loc,
               "kv cache: state %s is %s in the inference module, this graph needs %s", name, t1,
               t2);
      return NULL;
    }
  }
  return dsc_param_ref(b->g, name);
}

static ir_node *assign(ir_graph *g, ir_node *x, const char *name) {
  dsc_attr a = dsc_attr_str("name", name);
  return dsc_build(g, DSC_OP_ASSIGN, &x, 1, &a, 1);
}

/* attention n of the forward graph over the cache, q k v its inputs here */
static ir_node *cached_attention(kv_builder *b, const ir_node *n, ir_node *q, ir_node *k,
                                 ir_node *v) {
  ir_graph *g = b->g;
  dsc_context *ctx = b->dst->ctx;
  if (!ir_attr_bool(n, "causal")) {
    ir_error(ctx, n->loc,
             "kv cache: this attention is not causal, so a token's keys would change with the "
             "tokens after it; a cache needs causal attention");
    return NULL;
  }
  if (k->type.dims[1] != b->t || q->type.dims[1] != b->t) {
    ir_error(ctx, n->loc,
             "kv cache: attention's queries and keys must both be the row's %" PRId64 " tokens",
             b->t);
    return NULL;
  }
  ir_node *kc = cache_state(b, k, "k", &n->loc), *vc = kc ? cache_state(b, v, "v", &n->loc) : NULL;
  if (!vc) return NULL;
  ir_node *kn = write_rows(b, kc, k), *vn = write_rows(b, vc, v);
  assign(g, kn, dsc_node_attr(kc, "name")->u.s);
  assign(g, vn, dsc_node_attr(vc, "name")->u.s);
  b->attentions++;
  /* masked where s > p (after the query) or p - s >= W (out of its window) */
  int64_t B = b->B, t = b->t, S = b->context, W = ir_attr_int(n, "window");
  ir_node *s = iota2(g, 1, 1, S);                    /* [1, S] */
  ir_node *p = reshape(g, b->positions, B, t, 1, 3); /* [B, t, 1] */
  ir_node *masked = dsc_binary(g, DSC_OP_GREATER, reshape(g, s, 1, 1, S, 3), p);
  if (W > 0) {
    ir_node *back = dsc_binary(g, DSC_OP_SUB, p, reshape(g, s, 1, 1, S, 3));
    masked = where3(g, masked, masked,
                    dsc_binary(g, DSC_OP_GREATER, back, i32_const(g, (double)(W - 1))));
  }
  /* scores [B, KVH, G, t, S] (grouped) or [B, H, t, S] */
  int64_t shape[5] = {B, 1, 1, t, S};
  bool grouped = ir_attn_groups(n) > 1;
  masked = grouped ? dsc_reshape(g, masked, shape, 5)
                   : dsc_reshape(g, masked, (int64_t[]){B, 1, t, S}, 4);
  return pass_attention_form(g, n, q, kn, vn, masked);
}

/* Whether the position iota (node `io`) is read only as positions. */
static bool positions_only(const kv_builder *b, const ir_node *io) {
  for (int i = io->id + 1; i < b->fwd->n_nodes; i++) {
    const ir_node *u = b->fwd->nodes[i];
    for (int j = 0; j < u->n_in; j++)
      if (u->in[j] == io && !((u->op == DSC_OP_EMBEDDING || u->op == DSC_OP_ROPE) && j == 1)) {
        ir_error(b->dst->ctx, u->loc,
                 "kv cache: iota(%" PRId64
                 ") is read by %s; the cache offsets it only where it "
                 "indexes a position embedding or gives rope its positions",
                 b->t, dsc_op_name(u->op));
        return false;
      }
  }
  return true;
}

static bool is_position_iota(const kv_builder *b, const ir_node *n) {
  return n->op == DSC_OP_IOTA && n->type.rank == 1 && n->type.dims[0] == b->t &&
         ir_attr_int(n, "axis") == 0;
}

/* logits of row token last[b]: x [B, t, N] -> [B, N] */
static ir_node *last_rows(kv_builder *b, ir_node *x) {
  ir_graph *g = b->g;
  int64_t B = b->B, t = b->t, N = x->type.dims[2];
  int64_t flat[2] = {B * t, N};
  ir_node *row0 =
      dsc_binary(g, DSC_OP_MUL, reshape(g, iota2(g, 0, B, 1), B, 0, 0, 1), i32_const(g, (double)t));
  ir_node *in[2] = {dsc_reshape(g, x, flat, 2), dsc_binary(g, DSC_OP_ADD, row0, b->last)};
  return dsc_build(g, DSC_OP_EMBEDDING, in, 2, NULL, 0);
}

static dsc_status copy_params(ir_module *dst, const ir_module *src) {
  for (int i = 0; i < src->n_params; i++) {
    const ir_param *p = &src->params[i];
    int j = dsc_module_find_param(dst, p->name);
    if (j >= 0) {
      dsc_type have = dsc_module_param_type(dst, j);
      if (dsc_type_equal(&have, &p->type)) continue;
      ir_error(dst->ctx, ir_no_loc, "kv cache: param %s differs between the inference graphs",
               p->name);
      return DSC_ERR_INTERNAL;
    }
    dsc_status st = p->state ? dsc_module_add_state(dst, p->name, p->type, p->init)
                             : dsc_module_add_param(dst, p->name, p->type, p->init);
    if (st != DSC_OK) return st;
  }
  return DSC_OK;
}

static dsc_status check_forward(dsc_context *ctx, const ir_graph *fwd) {
  const ir_node *out = fwd->n_outputs == 1 ? fwd->outputs[0] : NULL;
  bool ok = out && out->op == DSC_OP_CROSS_ENTROPY && fwd->n_inputs >= 2 &&
            out->in[1] == fwd->inputs[1] && out->in[0]->type.rank == 3;
  for (int i = 0; ok && i < 2; i++) {
    const dsc_type *ty = &fwd->inputs[i]->type;
    ok = ty->rank == 2 && (ty->dtype == DSC_I32 || ty->dtype == DSC_I64);
  }
  if (!ok)
    ir_error(ctx, ir_no_loc,
             "kv cache: graph '%s' does not end in cross_entropy(logits [B, T, V], targets) of "
             "its inputs (tokens [B, T], targets [B, T]), so it has no logits to generate from",
             fwd->name);
  return ok ? DSC_OK : DSC_ERR_USER;
}

dsc_status pass_kv_cache_graph(ir_module *dst, const ir_graph *fwd, const char *name,
                               int64_t context) {
  dsc_context *ctx = dst->ctx;
  dsc_status st = check_forward(ctx, fwd);
  if (st != DSC_OK) return st;
  kv_builder b;
  memset(&b, 0, sizeof b);
  b.dst = dst, b.fwd = fwd, b.context = context;
  b.B = fwd->inputs[0]->type.dims[0], b.t = fwd->inputs[0]->type.dims[1];
  if (context < b.t) {
    ir_error(ctx, ir_no_loc,
             "kv cache: a cache of %" PRId64 " positions cannot take rows of %" PRId64 " tokens",
             context, b.t);
    return DSC_ERR_USER;
  }
  if (dsc_module_find_graph(dst, name)) {
    ir_error(ctx, ir_no_loc, "kv cache: the inference module already has a graph '%s'", name);
    return DSC_ERR_INTERNAL;
  }
  if ((st = copy_params(dst, fwd->module)) != DSC_OK) return st;
  ir_graph *g = b.g = dsc_graph_new(dst, name);
  if (!g) return DSC_ERR_INTERNAL;
  dsc_type it = fwd->inputs[0]->type, vt;
  memset(&vt, 0, sizeof vt);
  vt.dtype = DSC_I32, vt.rank = 1, vt.dims[0] = b.B;
  b.tokens = dsc_graph_input(g, "tokens", it);
  b.pos = dsc_graph_input(g, "pos", vt);
  b.last = dsc_graph_input(g, "last", vt);
  if (!b.tokens || !b.pos || !b.last) return DSC_ERR_INTERNAL;
  b.positions = dsc_binary(g, DSC_OP_ADD, reshape(g, b.pos, b.B, 1, 0, 2), iota2(g, 1, b.B, b.t));
  b.clamped = at_most(g, b.positions, context - 1);

  ir_arena *a = &dst->arena;
  ir_node **map = ir_arena_alloc(a, sizeof(ir_node *) * (size_t)(fwd->n_nodes + 1));
  ir_node **in = ir_arena_alloc(a, sizeof(ir_node *) * 8);
  if (!map || !in) return DSC_ERR_INTERNAL;
  const ir_node *ce = fwd->outputs[0], *logits = ce->in[0];
  ir_node *out = NULL;
  for (int i = 0; i < fwd->n_nodes; i++) {
    const ir_node *n = fwd->nodes[i];
    ir_node *r = NULL;
    dsc_graph_set_loc(g, n->loc);
    if (n == ce) break; /* the output: nothing after it matters */
    if (n->op == DSC_OP_INPUT) {
      if (n == fwd->inputs[0]) {
        r = b.tokens;
      } else if (n == fwd->inputs[1]) {
        map[i] = NULL; /* the targets: read by the loss only (checked) */
        continue;
      } else {
        ir_error(ctx, n->loc,
                 "kv cache: the forward graph has an input '%s' beyond tokens and targets",
                 n->name ? n->name : "?");
        return DSC_ERR_USER;
      }
    } else if (n->op == DSC_OP_ASSIGN || ir_op(n->op)->cg == IR_CG_COLLECTIVE ||
               ir_op(n->op)->cg == IR_CG_TIER) {
      ir_error(ctx, n->loc,
               "kv cache: the forward graph has %s; it must be the model's plain forward",
               dsc_op_name(n->op));
      return DSC_ERR_USER;
    } else if (is_position_iota(&b, n)) {
      if (!positions_only(&b, n)) return DSC_ERR_USER;
      r = n->type.dtype == DSC_I32 ? b.clamped : dsc_cast(g, b.clamped, n->type.dtype);
    } else {
      for (int j = 0; j < n->n_in; j++) {
        if (!map[n->in[j]->id]) {
          ir_error(ctx, n->loc, "kv cache: %s reads the targets; only the loss may",
                   dsc_op_name(n->op));
          return DSC_ERR_USER;
        }
      }
      if (n->op == DSC_OP_ATTENTION) {
        r = cached_attention(&b, n, map[n->in[0]->id], map[n->in[1]->id], map[n->in[2]->id]);
      } else if (n == logits && n->op == DSC_OP_MATMUL && n->in[0]->type.rank == 3 &&
                 n->in[1]->type.rank == 2) {
        /* only the last token's row reaches the head */
        r = out = dsc_matmul(g, last_rows(&b, map[n->in[0]->id]), map[n->in[1]->id]);
      } else {
        if (n->n_in > 8 && !(in = ir_arena_alloc(a, sizeof(ir_node *) * (size_t)n->n_in)))
          return DSC_ERR_INTERNAL;
        for (int j = 0; j < n->n_in; j++) in[j] = map[n->in[j]->id];
        r = dsc_build(g, n->op, in, n->n_in, n->attrs, n->n_attrs);
      }
    }
    if (!r) return DSC_ERR_USER; /* reported where it failed */
    map[i] = r;
  }
  if (!out) out = last_rows(&b, map[logits->id]);
  if (!out) return DSC_ERR_INTERNAL;
  if (b.attentions == 0) {
    ir_error(ctx, ir_no_loc, "kv cache: the model has no attention to cache");
    return DSC_ERR_USER;
  }
  return dsc_graph_set_outputs(g, &out, 1);
}
