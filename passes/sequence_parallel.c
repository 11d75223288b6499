/* Ulysses sequence parallelism (DeepSpeed-Ulysses; docs/parallelism.md):
 * graph 'forward', compiled at this rank's part of the sequence, T/sp
 * positions of every sequence, becomes one rank's program of the `sp` mesh
 * axis (cfg->sp ranks).
 *
 *   attention   q, k and v [B, T/sp, heads hd] are exchanged over sp (one
 *               all_to_all of the three) into [B, T, heads/sp hd]: every rank then holds
 *               the whole sequence for its share of the heads, attends as
 *               one rank would, and the output is exchanged back into
 *               [B, T/sp, heads hd]. Heads and kv_heads must be divisible
 *               by sp.
 *   positions   iota(T/sp), read as positions (a position embedding's
 *               index, rope's positions), becomes this rank's part of
 *               iota(T): local_shard {group "sp"}.
 *
 * Everything else works on each position alone and runs unchanged on the
 * rank's positions. The loss is the mean over the rank's tokens; with every
 * rank's share of the sequence the same size, the zero pass's mean over the
 * ranks (sp ranks are data-parallel ranks for the params and gradients) is
 * the mean over the whole sequence. Autodiff differentiates through the
 * exchanges (an exchange's adjoint is the same exchange of the gradient). */
#include <inttypes.h>
#include <string.h>

#include "passes/passes.h"

typedef struct {
  ir_module *m;
  ir_graph *g;
  int64_t sp, t; /* ranks of the axis; positions per rank */
  bool failed;
} sp_state;

static ir_node *checked(sp_state *s, ir_node *x) {
  if (!x) s->failed = true;
  return x;
}

static ir_node *all_to_all(sp_state *s, ir_node *x) {
  return checked(s, pass_all_to_all(s->g, x, s->sp, "sp"));
}

static ir_node *reshape4(sp_state *s, ir_node *x, int64_t a, int64_t b, int64_t c, int64_t d) {
  int64_t shape[4] = {a, b, c, d};
  return x ? checked(s, dsc_reshape(s->g, x, shape, d > 0 ? 4 : 3)) : NULL;
}

static ir_node *permute4(sp_state *s, ir_node *x, int64_t a, int64_t b, int64_t c, int64_t d) {
  int64_t perm[4] = {a, b, c, d};
  return x ? checked(s, dsc_permute(s->g, x, perm, 4)) : NULL;
}

/* [B, T/sp, n_i hd] (this rank's positions, every head) -> [B, T, n_i/sp hd]
 * (every position, head group `rank`) for the k tensors x[i] in one
 * exchange: head group j goes to rank j, and the positions from rank i are
 * the i-th part of the sequence. */
static void seq_to_heads(sp_state *s, ir_node *const *x, int k, ir_node **out) {
  int64_t B = x[0]->type.dims[0], t = s->t, c[3], all = 0;
  ir_node *parts[3];
  for (int i = 0; i < k; i++) {
    c[i] = x[i]->type.dims[2] / s->sp, all += c[i];
    parts[i] = reshape4(s, x[i], B, t, s->sp, c[i]);
  }
  dsc_attr axis = dsc_attr_int("axis", 3);
  ir_node *y = s->failed ? NULL : checked(s, dsc_build(s->g, DSC_OP_CONCAT, parts, k, &axis, 1));
  y = permute4(s, all_to_all(s, permute4(s, y, 2, 0, 1, 3)), 1, 0, 2, 3); /* [B, sp, t, all] */
  for (int i = 0, at = 0; i < k; at += (int)c[i], i++) {
    dsc_attr a[3] = {dsc_attr_int("axis", 3), dsc_attr_int("start", at),
                     dsc_attr_int("end", at + c[i])};
    ir_node *part = y ? checked(s, dsc_build(s->g, DSC_OP_SLICE, &y, 1, a, 3)) : NULL;
    out[i] = reshape4(s, part, B, s->sp * t, c[i], 0);
  }
}

/* The inverse: [B, T, n/sp hd] -> [B, T/sp, n hd]. */
static ir_node *heads_to_seq(sp_state *s, ir_node *y) {
  int64_t B = y->type.dims[0], t = s->t, c = y->type.dims[2];
  ir_node *x = permute4(s, reshape4(s, y, B, s->sp, t, c), 1, 0, 2, 3); /* [sp, B, t, c] */
  x = permute4(s, all_to_all(s, x), 1, 2, 0, 3);                        /* [B, t, sp, c] */
  return reshape4(s, x, B, t, s->sp * c, 0);
}

static ir_node *split_attention(sp_state *s, ir_node *n) {
  dsc_context *ctx = s->m->ctx;
  int64_t H = ir_attr_int(n, "heads"), KVH = ir_attr_int(n, "kv_heads");
  const dsc_type *q = &n->in[0]->type, *k = &n->in[1]->type;
  if (q->rank != 3 || k->rank != 3 || q->dims[1] != s->t || k->dims[1] != s->t) {
    ir_error(ctx, n->loc,
             "sequence parallel (sp=%" PRId64
             "): this attention's queries and keys are not the "
             "rank's %" PRId64 " positions of the sequence (q [B, %" PRId64 ", ...], k [B, %" PRId64
             ", ...]); Ulysses splits self-attention over the whole sequence",
             s->sp, s->t, q->rank == 3 ? q->dims[1] : -1, k->rank == 3 ? k->dims[1] : -1);
    return NULL;
  }
  if (H % s->sp != 0 || (KVH > 0 && KVH % s->sp != 0)) {
    ir_error(ctx, n->loc,
             "sequence parallel (sp=%" PRId64
             ") gives each rank heads / sp of attention's heads: "
             "%s %" PRId64 " is not divisible by %" PRId64 "; use an sp that divides it",
             s->sp, H % s->sp != 0 ? "heads" : "kv_heads", H % s->sp != 0 ? H : KVH, s->sp);
    return NULL;
  }
  dsc_graph_set_loc(s->g, n->loc);
  /* q, k and v in one exchange (or k and v, when they are one node) */
  ir_node *in[3] = {n->in[0], n->in[1], n->in[2]}, *x[3];
  seq_to_heads(s, in, in[1] == in[2] ? 2 : 3, x);
  if (s->failed) return NULL;
  if (in[1] == in[2]) x[2] = x[1];
  ir_node *a = dsc_attention_windowed(s->g, x[0], x[1], x[2], H / s->sp,
                                      KVH > 0 ? KVH / s->sp : KVH, ir_attr_bool(n, "causal"),
                                      ir_attr_float(n, "scale"), ir_attr_int(n, "window"));
  return checked(s, a) ? heads_to_seq(s, a) : NULL;
}

/* iota(t) read only as positions: true; read otherwise too: an error (the
 * pass cannot tell what it numbers); not read as positions: false. */
static bool position_iota(sp_state *s, const ir_node *io) {
  if (io->op != DSC_OP_IOTA || io->type.rank != 1 || io->type.dims[0] != s->t ||
      ir_attr_int(io, "axis") != 0)
    return false;
  const ir_node *other = NULL;
  bool as_position = false;
  for (int i = io->id + 1; i < s->g->n_nodes; i++) {
    const ir_node *u = s->g->nodes[i];
    for (int j = 0; j < u->n_in; j++) {
      if (u->in[j] != io) continue;
      if (pass_reads_positions(u, j))
        as_position = true;
      else
        other = u;
    }
  }
  if (as_position && other) {
    ir_error(s->m->ctx, other->loc,
             "sequence parallel: iota(%" PRId64
             ") gives positions and is also read by %s; "
             "write the positions as their own iota",
             s->t, dsc_op_name(other->op));
    s->failed = true;
  }
  return as_position && !other;
}

static ir_node *rank_positions(sp_state *s, const ir_node *io) {
  int64_t T = s->t * s->sp;
  dsc_attr a[3] = {dsc_attr_int("axis", 0), dsc_attr_dtype("dtype", ir_attr_dtype(io, "dtype")),
                   dsc_attr_ints("shape", &T, 1)};
  dsc_graph_set_loc(s->g, io->loc);
  ir_node *all = checked(s, dsc_build(s->g, DSC_OP_IOTA, NULL, 0, a, 3));
  return all ? checked(s, pass_local_shard(s->g, all, s->sp, "sp")) : NULL;
}

dsc_status pass_sequence_parallel_run(ir_module *m, const dsc_train_config *cfg) {
  if (!cfg || cfg->sp <= 1) return DSC_OK;
  dsc_status st = DSC_OK;
  ir_graph *g = pass_mesh_forward(m, "sequence parallel", "sp", cfg->sp, cfg->world, &st);
  if (!g) return st;
  if (g->n_inputs < 1 || g->inputs[0]->type.rank != 2) {
    ir_error(m->ctx, ir_no_loc, "sequence parallel: graph 'forward' does not read tokens [B, T]");
    return DSC_ERR_INTERNAL;
  }
  sp_state s = {m, g, cfg->sp, g->inputs[0]->type.dims[1], false};
  int n = g->n_nodes, attentions = 0;
  for (int i = 0; i < n && !s.failed; i++) {
    ir_node *x = g->nodes[i], *y = NULL;
    if (x->op == DSC_OP_ATTENTION) {
      if (!(y = split_attention(&s, x))) s.failed = true;
      attentions++;
    } else if (position_iota(&s, x)) {
      y = rank_positions(&s, x);
    }
    if (y) pass_replace_uses(g, x, y);
  }
  if (s.failed) return DSC_ERR_USER;
  if (attentions == 0) {
    ir_error(m->ctx, ir_no_loc,
             "sequence parallel (sp=%" PRId64
             "): graph 'forward' has no attention to split by "
             "heads, so its ranks would not see each other's positions",
             s.sp);
    return DSC_ERR_USER;
  }
  return pass_reorder(g, n, NULL, 0);
}
