/* The inference graph of a token model with a paged KV cache (issue 23;
 * docs/inference.md).
 *
 * A forward graph compiled at [B, t] is copied node by node into a graph of
 * the inference module with three changes:
 *   positions   iota(T), as the token and rope positions, becomes pos[b] +
 *               iota(t) ([B, t]), clamped to the cache's last position so
 *               that a padded last chunk reads a valid row of a position
 *               table (what padding computes is never read);
 *   attention   the keys and values live in a pool of rows shared by all
 *               sequences, states kv.<i>.k and kv.<i>.v [P, C]: the caller
 *               hands out the rows in blocks and says, per step, where
 *               each row's keys land (dest [B * t]: the pool row of each
 *               new key, -1 for none) and which
 *               pool row holds position s of sequence b (rows [B, span]: a
 *               graph sees the first `span` positions, so a step whose
 *               sequences are short runs a graph of a short span).
 *               The queries attend to the positions gathered through rows,
 *               masked where a key's position is after the query's (or,
 *               with a window W, W or more before it): positions a
 *               sequence has not written are never seen;
 *   the loss    cross_entropy(logits, targets) becomes the logits of token
 *               last[b] of each row: the last matmul reads that row only.
 * The write is a set_rows of the state (the code generator writes the new
 * rows in place: a step costs what it writes, not the pool) and the read
 * an embedding of the pool by rows. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "passes/passes.h"

typedef struct {
  ir_module *dst;
  ir_graph *g;
  const ir_graph *fwd;
  int64_t B, t, context, span, pool;
  ir_node *tokens, *pos, *last;
  ir_node *rows;      /* [B, span] i32: the pool row of each sequence's positions */
  ir_node *dest;      /* [B * t] i32: the pool row of each new key, or -1 */
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

/* the pool [P, C] with the step's keys x [B, t, C] written to the rows dest names */
static ir_node *write_rows(kv_builder *b, ir_node *pool, ir_node *x) {
  ir_graph *g = b->g;
  int64_t flat[2] = {b->B * b->t, x->type.dims[2]};
  ir_node *in[3] = {pool, b->dest, dsc_reshape(g, x, flat, 2)};
  return dsc_build(g, DSC_OP_SET_ROWS, in, 3, NULL, 0);
}

/* [B, span, C]: each sequence's first positions, gathered from the pool */
static ir_node *read_rows(kv_builder *b, ir_node *pool) {
  ir_node *in[2] = {pool, b->rows};
  return dsc_build(b->g, DSC_OP_EMBEDDING, in, 2, NULL, 0);
}

static ir_node *cache_state(kv_builder *b, const ir_node *like, const char *kind,
                            const dsc_loc *loc) {
  char name[64];
  snprintf(name, sizeof name, "kv.%d.%s", b->attentions, kind);
  dsc_type ty = like->type; /* [B, t, C] -> [P, C] */
  ty.rank = 2, ty.dims[0] = b->pool, ty.dims[1] = like->type.dims[2], ty.dims[2] = 0;
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
  kn = read_rows(b, kn), vn = read_rows(b, vn);
  b->attentions++;
  /* masked where s > p (after the query) or p - s >= W (out of its window) */
  int64_t B = b->B, t = b->t, S = b->span, W = ir_attr_int(n, "window");
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
      if (u->in[j] == io && !pass_reads_positions(u, j)) {
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
                               int64_t context, int64_t span, int64_t pool) {
  dsc_context *ctx = dst->ctx;
  dsc_status st = check_forward(ctx, fwd);
  if (st != DSC_OK) return st;
  kv_builder b;
  memset(&b, 0, sizeof b);
  b.dst = dst, b.fwd = fwd, b.context = context, b.span = span, b.pool = pool;
  b.B = fwd->inputs[0]->type.dims[0], b.t = fwd->inputs[0]->type.dims[1];
  if (context < b.t) {
    ir_error(ctx, ir_no_loc,
             "kv cache: a cache of %" PRId64 " positions cannot take rows of %" PRId64 " tokens",
             context, b.t);
    return DSC_ERR_USER;
  }
  if (span < b.t || span > context) {
    ir_error(ctx, ir_no_loc,
             "kv cache: a span of %" PRId64 " positions must be within the context (%" PRId64
             ") and take the row's %" PRId64 " tokens",
             span, context, b.t);
    return DSC_ERR_USER;
  }
  if (pool < 1) {
    ir_error(ctx, ir_no_loc, "kv cache: the pool needs at least one row (got %" PRId64 ")", pool);
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
  dsc_type rt = vt, dt = vt;
  rt.rank = 2, rt.dims[1] = span;
  dt.dims[0] = b.B * b.t;
  b.rows = dsc_graph_input(g, "rows", rt);
  b.dest = dsc_graph_input(g, "dest", dt);
  if (!b.tokens || !b.pos || !b.last || !b.rows || !b.dest) return DSC_ERR_INTERNAL;
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
