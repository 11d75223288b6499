/* The zero pass: data parallelism over cfg->world ranks, the ZeRO family
 * (Rajbhandari et al.; DeepSpeed's zero_optimization.stage). The step graph
 * becomes one rank's program (SPMD): every rank runs it on its own share of
 * the global batch.
 *
 * Stage 0 (every rank holds all params, gradients and optimizer states):
 * - each trainable param's averaged gradient, where the optimizer pass
 *   leaves it (before the global norm, fp16's finite test and clipping),
 *   becomes mean over ranks = all_reduce_wait(all_reduce_start(g)) * (1/N):
 *   every rank then computes the same grad_norm, clipping and update, and the
 *   params stay identical on all ranks;
 * - the loss output becomes the mean over ranks (the global batch's mean).
 * Each start comes right after its gradient is computed (with grad_accum 1
 * that is inside the backward pass); its wait right before the gradient's
 * first reader, so a later scheduler pass has both ends to move.
 *
 * The gradients are found through the graph the optimizer pass builds:
 * grad_norm = sqrt(t_1 + t_2 + ... + t_n) (left-nested adds), t_j =
 * [cast](sum(g_j * g_j)), one term per trainable param in module order.
 * Only the optimizer's readers of g_j are rewired (the nodes no gradient
 * depends on: the norm, fp16's finite test, clipping, the update), never
 * the backward pass.
 *
 * Stages 1-3 shard optimizer states, gradients and params: see "stages
 * 1-3" below. At world 1 there is nothing to shard or reduce and the pass
 * does nothing, whatever the stage.
 *
 * Tags: every start gets tag 0; the trainer sets it to the step number
 * before each step (dsc_graph_set_collective_tags), so a failed collective
 * names its step. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "passes/passes.h"

/* One value reduced over ranks: x becomes mean = (wait(start(x))) * 1/N. */
typedef struct {
  ir_node *x, *start, *wait, *inv, *mean;
  int first_use; /* original id of x's first reader after the cut; n0: none */
} zero_red;

static dsc_status internal(ir_module *m, const char *why) {
  ir_error(m->ctx, ir_no_loc,
           "zero: graph 'train_step' is not what the optimizer pass builds (%s); run the "
           "passes in order",
           why);
  return DSC_ERR_INTERNAL;
}

/* The gradient x of a norm term [cast](sum(y * y)), y = [cast](x) [/
 * opt.loss_scale]: the value as the backward gives it (with master weights
 * a bf16 or fp16 gradient, read in f32), or NULL. */
static ir_node *term_value(ir_node *t) {
  if (t->op == DSC_OP_CAST) t = t->in[0];
  if (t->op != DSC_OP_SUM || t->in[0]->op != DSC_OP_MUL) return NULL;
  ir_node *mul = t->in[0], *y = mul->in[0];
  if (y != mul->in[1]) return NULL;
  if (y->op == DSC_OP_DIV && y->in[1]->op == DSC_OP_PARAM && y->in[1]->type.rank == 0)
    y = y->in[0]; /* fp16: the unscaled gradient */
  if (y->op == DSC_OP_CAST && y->in[0]->role == IR_ROLE_GRAD) y = y->in[0];
  return y;
}

/* The n averaged gradients, in module param order, from grad_norm. */
static bool find_grads(ir_graph *g, int n, ir_node **grads) {
  ir_node *norm = g->outputs[1];
  if (norm->op != DSC_OP_SQRT) return false;
  ir_node *s = norm->in[0];
  for (int j = n - 1; j >= 1; j--) {
    if (s->op != DSC_OP_ADD) return false;
    if (!(grads[j] = term_value(s->in[1]))) return false;
    s = s->in[0];
  }
  return (grads[0] = term_value(s)) != NULL;
}

static bool make_red(ir_graph *g, int64_t world, zero_red *r) {
  r->start = pass_collective_start(g, DSC_OP_ALL_REDUCE_START, r->x, world, "world");
  if (!r->start) return false;
  r->wait = dsc_build(g, DSC_OP_ALL_REDUCE_WAIT, &r->start, 1, NULL, 0);
  if (!r->wait) return false;
  r->inv = dsc_const(g, 1.0 / (double)world, dsc_type_make(r->x->type.dtype, 0, NULL));
  if (!r->inv) return false;
  r->mean = dsc_binary(g, DSC_OP_MUL, r->wait, r->inv);
  return r->mean != NULL;
}

/* anc[i]: node i is a gradient or something a gradient depends on (the
 * forward and backward passes); the other nodes are the optimizer's part
 * (and forward values no gradient needs, such as the loss itself). */
static bool *grad_ancestors(ir_module *m, ir_graph *g, ir_node *const *grads, int n) {
  int nn = g->n_nodes;
  bool *anc = ir_arena_alloc(&m->arena, sizeof(bool) * (size_t)(nn + 1));
  ir_node **stack = ir_arena_alloc(&m->arena, sizeof(ir_node *) * (size_t)(nn + 1));
  if (!anc || !stack) return NULL;
  memset(anc, 0, sizeof(bool) * (size_t)(nn + 1));
  int sp = 0;
  for (int j = 0; j < n; j++)
    if (!anc[grads[j]->id]) anc[grads[j]->id] = true, stack[sp++] = grads[j];
  while (sp > 0) {
    ir_node *x = stack[--sp];
    for (int q = 0; q < x->n_in; q++)
      if (!anc[x->in[q]->id]) anc[x->in[q]->id] = true, stack[sp++] = x->in[q];
  }
  return anc;
}

static dsc_status stage0(ir_module *m, ir_graph *g, int64_t world) {
  int n_train = 0;
  for (int p = 0; p < m->n_params; p++) n_train += !m->params[p].state;
  if (g->n_outputs < 2) return internal(m, "fewer than 2 outputs");
  ir_arena *a = &m->arena;
  ir_node **grads = ir_arena_alloc(a, sizeof(ir_node *) * (size_t)(n_train + 1));
  zero_red *reds = ir_arena_alloc(a, sizeof(zero_red) * (size_t)(n_train + 1));
  if (!grads || !reds) return ir_error(m->ctx, ir_no_loc, "zero: out of memory"), DSC_ERR_INTERNAL;
  memset(reds, 0, sizeof(zero_red) * (size_t)(n_train + 1));
  if (n_train > 0 && !find_grads(g, n_train, grads))
    return internal(m, "grad_norm is not sqrt of a sum of squared gradients");
  for (int p = 0, j = 0; p < m->n_params; p++)
    if (!m->params[p].state && !dsc_type_equal(&grads[j++]->type, &m->params[p].type))
      return internal(m, "a gradient's type differs from its param's");

  int n0 = g->n_nodes, n_red = 0;
  bool *anc = grad_ancestors(m, g, grads, n_train);
  if (!anc) return ir_error(m->ctx, ir_no_loc, "zero: out of memory"), DSC_ERR_INTERNAL;
  /* One reduction per distinct gradient node; the loss last. */
  for (int j = 0; j < n_train; j++) {
    bool seen = false;
    for (int k = 0; k < n_red && !seen; k++) seen = reds[k].x == grads[j];
    if (!seen) reds[n_red++].x = grads[j];
  }
  reds[n_red++].x = g->outputs[0];
  for (int k = 0; k < n_red; k++) {
    reds[k].first_use = n0;
    if (!make_red(g, world, &reds[k])) return DSC_ERR_INTERNAL;
  }
  zero_red *loss = &reds[n_red - 1];

  /* Rewire the optimizer's readers (no gradient depends on them) to the
   * means; the local gradients become what the collectives send. */
  /* the memory plan counts the reduced sums (the collectives' results) as
   * gradients, the local ones as what the collectives send */
  for (int k = 0; k < n_red - 1; k++) reds[k].x->role = IR_ROLE_NONE, reds[k].wait->role = IR_ROLE_GRAD;
  for (int i = 0; i < n0; i++) {
    if (anc[i]) continue;
    ir_node *nd = g->nodes[i];
    for (int k = 0; k < n_red - 1; k++)
      for (int q = 0; q < nd->n_in; q++)
        if (nd->in[q] == reds[k].x) {
          nd->in[q] = reds[k].mean;
          if (i < reds[k].first_use) reds[k].first_use = i;
        }
  }
  g->outputs[0] = loss->mean;

  /* New order: each start right after its value, each wait (with 1/N and
   * the mean) right before the first reader; the loss's at the end. */
  int total = g->n_nodes, k_out = 0;
  ir_node **order = ir_arena_alloc(a, sizeof(ir_node *) * (size_t)total);
  if (!order) return ir_error(m->ctx, ir_no_loc, "zero: out of memory"), DSC_ERR_INTERNAL;
  for (int i = 0; i <= n0; i++) {
    for (int k = 0; k < n_red; k++)
      if (reds[k].first_use == i) {
        order[k_out++] = reds[k].wait;
        order[k_out++] = reds[k].inv;
        order[k_out++] = reds[k].mean;
      }
    if (i == n0) break;
    order[k_out++] = g->nodes[i];
    for (int k = 0; k < n_red; k++)
      if (reds[k].x == g->nodes[i]) order[k_out++] = reds[k].start;
  }
  if (k_out != total) return internal(m, "a reduced value is not a node of the graph");
  for (int i = 0; i < total; i++) {
    g->nodes[i] = order[i];
    g->nodes[i]->id = i;
  }
  return DSC_OK;
}

/* ======================= stages 1-3: sharding =======================
 *
 * A sharded tensor of P elements is its flat vector zero-padded to
 * P' = S*N elements, S = ceil(P/N); rank r holds elements [r*S, (r+1)*S).
 * Sharded module params and states get type [S]; module meta
 * "shard.<name>" = "<N> <d0>x<d1>..." records the full shape, and
 * "zero.stage" / "zero.world" the layout (checkpoints and the trainer read
 * them).
 *
 * The optimizer's part of the graph (the nodes no gradient depends on) is
 * rewritten value by value. Each value is FULL (as before), SHARD (it has a
 * sharded tensor's full shape and is computed on the rank's [S] chunk
 * instead) or PARTIAL (a scalar that is the sum over ranks of a local
 * scalar: a sum over a SHARD value). The leaves are the optimizer states
 * (stages 1-3: their shards), the reduce-scattered gradients (stages 2-3)
 * and the params (stage 3). Elementwise ops over SHARD values (and scalars)
 * stay SHARD; FULL operands of the same shape are sharded with local_shard;
 * a full sum of a SHARD value becomes PARTIAL when the padding is known to
 * be zero, and casts, scalings and adds of PARTIAL values stay PARTIAL.
 * Any other reader gets the FULL value back: an all_gather of the SHARD
 * value, an all_reduce of the PARTIAL one. So AdamW and SGD update only the
 * rank's chunk, the global gradient norm costs one scalar all_reduce, and
 * an update that is not elementwise (Muon's matmuls) still computes the
 * right thing on gathered values.
 *
 * Stage 3 keeps params of at most cfg->zero.persist_threshold elements whole
 * (as stage 2 does), as DeepSpeed's stage3_param_persistence_threshold, and
 * (selective unsharding, as DeepCompile) lets params whose full bytes fit
 * in cfg->zero.unshard_bytes, smallest first, keep their forward gather for
 * the backward: one gather per micro-batch instead of two.
 *
 * Stage 1: gradients are all-reduced as at stage 0; the update reads their
 * chunk. Stage 2: each gradient is reduce-scattered (x 1/N) right after it
 * is computed. Stage 1-2: the updated param chunk is all-gathered into the
 * param. Stage 3: the params are sharded too; every read in the forward and
 * backward passes reads an all_gather, one per param per segment, where the
 * segments end at each micro-batch's loss (forward | backward) and at each
 * micro-batch's first input slice: the forward's gathered param dies after
 * its last forward use and the backward gathers it again.
 *
 * New nodes are placed by a priority topological sort: reduce-scatter and
 * loss starts right after their value (as soon as possible), everything
 * else right before its first reader (as late as possible). */

typedef enum { ZK_FULL = 0, ZK_SHARD, ZK_PARTIAL } zero_kind;

typedef struct {
  ir_module *m;
  ir_graph *g;
  int64_t world;
  int stage;
  int n_orig; /* nodes that keep their position as key */
  int n_walk; /* nodes when the walk began: the per-node arrays cover them */
  bool *anc;  /* per node < n_walk: a gradient depends on it */
  unsigned char *kind;
  bool *zpad;         /* SHARD: its padding is zero */
  ir_node **sv;       /* SHARD: the [S] chunk; PARTIAL: the local scalar */
  ir_node **full;     /* memo: the FULL value of a SHARD/PARTIAL node */
  ir_node **shard;    /* memo: to_shard of a FULL node */
  bool *sharded;      /* per module param: its type is now [S] */
  dsc_type *full_type; /* per module param: its type before sharding */
  pass_fixed_key *fixed;
  int n_fixed, cap_fixed;
  bool failed;
} zs;

static int64_t shard_len(int64_t numel, int64_t world) {
  return numel / world + (numel % world != 0);
}

static ir_node *zs_oom(zs *z) {
  if (!z->failed) ir_error(z->m->ctx, ir_no_loc, "zero: out of memory");
  z->failed = true;
  return NULL;
}

/* Remembers that x goes right after node `after` (as soon as possible). */
static ir_node *asap(zs *z, ir_node *x, const ir_node *after) {
  if (!x) return z->failed = true, NULL;
  if (!ir_grow(&z->m->arena, (void **)&z->fixed, &z->cap_fixed, z->n_fixed + 1, sizeof(pass_fixed_key)))
    return zs_oom(z);
  z->fixed[z->n_fixed++] = (pass_fixed_key){x, after->id + 0.5 + 1e-6 * z->n_fixed};
  return x;
}

static zero_kind kind_of(const zs *z, const ir_node *x) {
  return x->id < z->n_walk ? (zero_kind)z->kind[x->id] : ZK_FULL;
}

static ir_node *flat(zs *z, ir_node *x) {
  if (!x || x->type.rank == 1) return x;
  int64_t n = dsc_type_numel(&x->type);
  return dsc_reshape(z->g, x, &n, 1);
}

static ir_node *build1(zs *z, dsc_op op, ir_node *x, const dsc_attr *a, int na) {
  if (!x) return NULL;
  ir_node *r = dsc_build(z->g, op, &x, 1, a, na);
  if (!r) z->failed = true;
  return r;
}

/* A start of op over the world (the data-parallel ranks). */
static ir_node *start(zs *z, dsc_op op, ir_node *x) {
  ir_node *r = x ? pass_collective_start(z->g, op, x, z->world, "world") : NULL;
  if (!r) z->failed = true;
  return r;
}

static ir_node *local_shard(zs *z, ir_node *x) {
  ir_node *f = flat(z, x), *r = f ? pass_local_shard(z->g, f, z->world, "world") : NULL;
  if (!r) z->failed = true;
  return r;
}

/* The full tensor of type t from its chunks: all_gather, unpad, reshape. */
static ir_node *gather(zs *z, ir_node *chunk, const dsc_type *t) {
  ir_node *w = build1(z, DSC_OP_ALL_GATHER_WAIT, start(z, DSC_OP_ALL_GATHER_START, chunk), NULL, 0);
  int64_t n = dsc_type_numel(t);
  if (w && w->type.dims[0] != n) {
    dsc_attr s[3] = {dsc_attr_int("axis", 0), dsc_attr_int("start", 0), dsc_attr_int("end", n)};
    w = build1(z, DSC_OP_SLICE, w, s, 3);
  }
  if (w && t->rank != 1) w = dsc_reshape(z->g, w, t->dims, t->rank);
  if (!w) z->failed = true;
  return w;
}

/* The FULL value of a SHARD or PARTIAL node x. */
static ir_node *full_value(zs *z, ir_node *x) {
  if (z->full[x->id]) return z->full[x->id];
  ir_node *r;
  if (z->kind[x->id] == ZK_SHARD) {
    r = gather(z, z->sv[x->id], &x->type);
  } else {
    r = build1(z, DSC_OP_ALL_REDUCE_WAIT, start(z, DSC_OP_ALL_REDUCE_START, z->sv[x->id]), NULL, 0);
  }
  return z->full[x->id] = r;
}

static bool same_shape(const dsc_type *a, const dsc_type *b) {
  if (a->rank != b->rank) return false;
  for (int d = 0; d < a->rank; d++)
    if (a->dims[d] != b->dims[d]) return false;
  return true;
}

/* Ops whose result is zero where their inputs are (for the padding): the
 * keeps-zero flag of their row in include/dsc/ops.def. */
static bool keeps_zero(dsc_op op) { return (ir_op(op)->flags & IR_OPF_KEEPS_ZERO) != 0; }

/* The chunk of FULL value x (a sharded tensor's shape): elementwise ops of
 * the optimizer's part are computed on chunks, other values are cut with
 * local_shard. *zp: the chunk's padding is zero. */
static ir_node *to_shard(zs *z, ir_node *x, bool *zp) {
  bool old = x->id < z->n_walk;
  if (old && z->shard[x->id]) return *zp = true, z->shard[x->id];
  ir_node *r = NULL;
  bool through = old && !z->anc[x->id] && ir_op(x->op)->cg == IR_CG_ELEMENTWISE &&
                 x->op != DSC_OP_CAST && keeps_zero(x->op);
  for (int q = 0; through && q < x->n_in; q++)
    through = kind_of(z, x->in[q]) == ZK_FULL &&
              (x->in[q]->type.rank == 0 || same_shape(&x->in[q]->type, &x->type));
  if (through) {
    ir_node *in[3];
    for (int q = 0; q < x->n_in; q++) {
      bool dummy;
      in[q] = x->in[q]->type.rank == 0 ? x->in[q] : to_shard(z, x->in[q], &dummy);
      if (!in[q]) return NULL;
    }
    r = dsc_build(z->g, x->op, in, x->n_in, x->attrs, x->n_attrs);
    if (!r) z->failed = true;
  } else {
    r = local_shard(z, x);
  }
  if (old) z->shard[x->id] = r;
  *zp = true; /* local_shard pads with zeros; the ops above keep them */
  return r;
}

static void set_kind(zs *z, ir_node *n, zero_kind k, ir_node *v, bool zp) {
  if (!v) {
    z->failed = true;
    return;
  }
  z->kind[n->id] = (unsigned char)k;
  z->sv[n->id] = v;
  z->zpad[n->id] = zp;
}

/* Elementwise node n over SHARD values: computed on chunks. False: n must
 * see FULL values (a broadcast between non-scalar shapes). */
static bool shard_elementwise(zs *z, ir_node *n) {
  ir_node *in[3];
  bool zp = keeps_zero(n->op), any_zp = false;
  if (n->n_in > 3) return false;
  for (int q = 0; q < n->n_in; q++) {
    ir_node *x = n->in[q];
    zero_kind k = kind_of(z, x);
    if (k == ZK_SHARD && same_shape(&x->type, &n->type)) {
      in[q] = z->sv[x->id];
      any_zp |= z->zpad[x->id];
      zp &= z->zpad[x->id] || n->op == DSC_OP_MUL;
    } else if (k == ZK_FULL && x->type.rank == 0) {
      in[q] = x;
      if (n->op != DSC_OP_MUL) zp = false; /* 0 + c, where(c, 0, s), ... */
    } else if (k == ZK_FULL && same_shape(&x->type, &n->type)) {
      bool xzp;
      if (!(in[q] = to_shard(z, x, &xzp))) return true; /* failed: reported */
      any_zp |= xzp;
      zp &= xzp || n->op == DSC_OP_MUL;
    } else {
      return false;
    }
  }
  if (n->op == DSC_OP_MUL) zp = any_zp; /* 0 * x = 0 */
  ir_node *r = dsc_build(z->g, n->op, in, n->n_in, n->attrs, n->n_attrs);
  set_kind(z, n, ZK_SHARD, r, zp);
  return true;
}

static bool is_zero_const(const ir_node *x) {
  return x->op == DSC_OP_CONST && ir_attr_float(x, "value") == 0.0;
}

/* One node of the optimizer's part. */
static void walk_node(zs *z, ir_node *n) {
  bool any = false, part = false;
  for (int q = 0; q < n->n_in; q++) {
    zero_kind k = kind_of(z, n->in[q]);
    any |= k != ZK_FULL;
    part |= k == ZK_PARTIAL;
  }
  if (!any) return;
  ir_node *a = n->in[0], *b = n->n_in > 1 ? n->in[1] : NULL;
  zero_kind ka = kind_of(z, a), kb = b ? kind_of(z, b) : ZK_FULL;
  if (ir_op(n->op)->cg == IR_CG_ELEMENTWISE && !part && shard_elementwise(z, n)) return;
  if (n->op == DSC_OP_SUM && ka == ZK_SHARD && n->type.rank == 0 &&
      (z->zpad[a->id] || dsc_type_numel(&a->type) % z->world == 0)) {
    int64_t ax = 0;
    set_kind(z, n, ZK_PARTIAL, dsc_reduce(z->g, DSC_OP_SUM, z->sv[a->id], &ax, 1, false), false);
    return;
  }
  if (n->op == DSC_OP_CAST && ka == ZK_PARTIAL) {
    set_kind(z, n, ZK_PARTIAL, dsc_cast(z->g, z->sv[a->id], n->type.dtype), false);
    return;
  }
  if ((n->op == DSC_OP_MUL || n->op == DSC_OP_DIV) && ka == ZK_PARTIAL && kb == ZK_FULL) {
    set_kind(z, n, ZK_PARTIAL, dsc_binary(z->g, n->op, z->sv[a->id], b), false);
    return;
  }
  if (n->op == DSC_OP_MUL && kb == ZK_PARTIAL && ka == ZK_FULL) {
    set_kind(z, n, ZK_PARTIAL, dsc_binary(z->g, n->op, a, z->sv[b->id]), false);
    return;
  }
  if (n->op == DSC_OP_ADD && ka == ZK_PARTIAL && kb == ZK_PARTIAL) {
    set_kind(z, n, ZK_PARTIAL, dsc_binary(z->g, n->op, z->sv[a->id], z->sv[b->id]), false);
    return;
  }
  if (n->op == DSC_OP_ADD && ((ka == ZK_PARTIAL && is_zero_const(b)) ||
                              (kb == ZK_PARTIAL && is_zero_const(a)))) {
    ir_node *v = z->sv[(ka == ZK_PARTIAL ? a : b)->id];
    set_kind(z, n, ZK_PARTIAL, v->type.dtype == n->type.dtype ? v : NULL, false);
    return;
  }
  for (int q = 0; q < n->n_in; q++)
    if (kind_of(z, n->in[q]) != ZK_FULL && !(n->in[q] = full_value(z, n->in[q]))) z->failed = true;
}

/* The ids of the micro-batch losses summed (and scaled) into the loss. */
static int micro_losses(ir_node *x, int *ids, int n, int cap) {
  for (;;) {
    if (x->op == DSC_OP_CAST) {
      x = x->in[0];
    } else if ((x->op == DSC_OP_MUL || x->op == DSC_OP_DIV) && x->in[1]->type.rank == 0 &&
               (x->in[1]->op == DSC_OP_CONST || x->in[1]->op == DSC_OP_PARAM)) {
      x = x->in[0];
    } else if (x->op == DSC_OP_MUL && x->in[0]->op == DSC_OP_CONST) {
      x = x->in[1];
    } else {
      break;
    }
  }
  if (x->op == DSC_OP_ADD && x->type.rank == 0) {
    n = micro_losses(x->in[0], ids, n, cap);
    return micro_losses(x->in[1], ids, n, cap);
  }
  if (n < cap) ids[n++] = x->id;
  return n;
}

static int cmp_int(const void *a, const void *b) {
  int x = *(const int *)a, y = *(const int *)b;
  return (x > y) - (x < y);
}

/* Selective unsharding (DeepCompile): which sharded params keep their
 * forward gather for the backward (one gather per micro-batch instead of
 * two), smallest first while their full bytes fit in `budget`: the most
 * collectives saved per byte held. */
static bool *kept_gathered(zs *z, int64_t budget) {
  ir_module *m = z->m;
  bool *keep = ir_arena_alloc(&m->arena, sizeof(bool) * (size_t)(m->n_params + 1));
  if (!keep) return NULL;
  memset(keep, 0, sizeof(bool) * (size_t)(m->n_params + 1));
  for (int64_t used = 0;;) {
    int best = -1;
    int64_t best_bytes = 0;
    for (int p = 0; p < m->n_params; p++) {
      if (!z->sharded[p] || m->params[p].state || keep[p]) continue;
      int64_t b = dsc_type_numel(&z->full_type[p]) * (int64_t)dsc_dtype_size(z->full_type[p].dtype);
      if (best < 0 || b < best_bytes) best = p, best_bytes = b;
    }
    if (best < 0 || used + best_bytes > budget) return keep;
    keep[best] = true, used += best_bytes;
  }
}

/* The sharded trainable param that x is, or reads through a chain of
 * casts, reshapes and permutes (mixed precision's bf16 copy, a transposed
 * view); -1 for anything else. */
static int chain_param(const zs *z, const ir_node *x) {
  while (x->op == DSC_OP_CAST || x->op == DSC_OP_RESHAPE || x->op == DSC_OP_PERMUTE) x = x->in[0];
  if (x->op != DSC_OP_PARAM) return -1;
  int p = dsc_module_find_param(z->m, ir_attr_str(x, "name"));
  return p >= 0 && z->sharded[p] && !z->m->params[p].state ? p : -1;
}

typedef struct {
  int *seg;        /* per node (< n_walk) or per param: the segment of val */
  ir_node **val;
} gather_memo;

/* The value of chain x (chain_param(x) = p) in segment seg: the param's
 * gather of that segment, then a copy of the chain's ops, so that a bf16
 * copy of a param is made again from the backward's gather instead of kept
 * from the forward. */
static ir_node *chain_value(zs *z, ir_node *x, int p, int seg, gather_memo *by_param,
                            gather_memo *by_node) {
  if (x->op == DSC_OP_PARAM) {
    if (by_param->seg[p] != seg || !by_param->val[p]) {
      by_param->seg[p] = seg;
      by_param->val[p] = gather(z, dsc_param_ref(z->g, z->m->params[p].name), &z->full_type[p]);
    }
    return by_param->val[p];
  }
  if (by_node->seg[x->id] == seg && by_node->val[x->id]) return by_node->val[x->id];
  ir_node *in = chain_value(z, x->in[0], p, seg, by_param, by_node);
  ir_node *v = in ? dsc_build(z->g, x->op, &in, 1, x->attrs, x->n_attrs) : NULL;
  if (!v) z->failed = true;
  by_node->seg[x->id] = seg;
  return by_node->val[x->id] = v;
}

/* Stage 3: every read of a sharded param by the forward and backward
 * passes (directly or through casts and views) reads an all_gather, one per
 * param and segment. */
static bool gather_params(zs *z, ir_node *loss, int64_t unshard_bytes) {
  ir_module *m = z->m;
  ir_graph *g = z->g;
  int cap = g->n_nodes + 1, nb = 0, nmb = 0;
  int *bounds = ir_arena_alloc(&m->arena, sizeof(int) * (size_t)cap);
  int *mb_bounds = ir_arena_alloc(&m->arena, sizeof(int) * (size_t)cap);
  gather_memo bp = {ir_arena_alloc(&m->arena, sizeof(int) * (size_t)(m->n_params + 1)),
                    ir_arena_alloc(&m->arena, sizeof(ir_node *) * (size_t)(m->n_params + 1))};
  gather_memo bn = {ir_arena_alloc(&m->arena, sizeof(int) * (size_t)(z->n_walk + 1)),
                    ir_arena_alloc(&m->arena, sizeof(ir_node *) * (size_t)(z->n_walk + 1))};
  bool *keep = kept_gathered(z, unshard_bytes);
  if (!bounds || !mb_bounds || !bp.seg || !bp.val || !bn.seg || !bn.val || !keep)
    return zs_oom(z), false;
  for (int i = 0; i <= z->n_walk; i++) bn.seg[i] = -1, bn.val[i] = NULL;
  nb = micro_losses(loss, bounds, 0, cap);
  for (int i = 0; i < z->n_walk && nb < cap; i++) {
    ir_node *x = g->nodes[i];
    if (x->op == DSC_OP_SLICE && x->in[0]->op == DSC_OP_INPUT && ir_attr_int(x, "start") > 0)
      bounds[nb++] = i, mb_bounds[nmb++] = i;
  }
  qsort(bounds, (size_t)nb, sizeof(int), cmp_int);
  for (int p = 0; p < m->n_params; p++) bp.seg[p] = -1, bp.val[p] = NULL;
  /* segments: every param's end at each boundary; a kept one's only where
   * the next micro-batch starts */
  int seg_all = 0, seg_mb = 0;
  for (int i = 0; i < z->n_walk && !z->failed; i++) {
    ir_node *nd = g->nodes[i];
    while (seg_all < nb && bounds[seg_all] < i) seg_all++;
    while (seg_mb < nmb && mb_bounds[seg_mb] < i) seg_mb++;
    /* a chain's own nodes stay as they are (dead once their readers read
     * copies), so that later readers still find the param behind them */
    if (!z->anc[i] || nd->op == DSC_OP_PARAM || chain_param(z, nd) >= 0) continue;
    for (int q = 0; q < nd->n_in; q++) {
      ir_node *r = nd->in[q];
      int p = r->id < z->n_walk ? chain_param(z, r) : -1;
      if (p < 0) continue;
      ir_node *v = chain_value(z, r, p, keep[p] ? seg_mb : seg_all, &bp, &bn);
      if (!v) return false;
      nd->in[q] = v;
    }
  }
  return !z->failed;
}

/* Shards param/state p: module type [S], meta "shard.<name>". */
static bool shard_param(zs *z, int p) {
  ir_module *m = z->m;
  ir_param *pa = &m->params[p];
  z->full_type[p] = pa->type;
  int64_t numel = dsc_type_numel(&pa->type), s = shard_len(numel, z->world);
  char dims[400];
  int o = 0;
  for (int d = 0; d < pa->type.rank && o < (int)sizeof dims - 24; d++)
    o += snprintf(dims + o, sizeof dims - (size_t)o, "%s%lld", d ? "x" : "", (long long)pa->type.dims[d]);
  if (pa->type.rank == 0) snprintf(dims, sizeof dims, "scalar");
  const char *key = ir_arena_printf(&m->arena, "shard.%s", pa->name);
  const char *val = ir_arena_printf(&m->arena, "%lld %s", (long long)z->world, dims);
  if (!key || !val || dsc_module_set_meta(m, key, val) != DSC_OK) return zs_oom(z), false;
  pa->type = dsc_type_make(pa->type.dtype, 1, &s);
  z->sharded[p] = true;
  return true;
}

static bool is_optimizer_state(const ir_param *pa) {
  return pa->state && strncmp(pa->name, "opt.", 4) == 0 && pa->type.rank >= 1;
}

static dsc_status shard_stages(ir_module *m, ir_graph *g, int64_t world, int stage,
                               int64_t persist, int64_t unshard) {
  int n_train = 0;
  for (int p = 0; p < m->n_params; p++) n_train += !m->params[p].state;
  if (g->n_outputs < 2) return internal(m, "fewer than 2 outputs");
  ir_arena *ar = &m->arena;
  zs z;
  memset(&z, 0, sizeof z);
  z.m = m, z.g = g, z.world = world, z.stage = stage;
  ir_node **grads = ir_arena_alloc(ar, sizeof(ir_node *) * (size_t)(n_train + 1));
  z.sharded = ir_arena_alloc(ar, sizeof(bool) * (size_t)(m->n_params + 1));
  z.full_type = ir_arena_alloc(ar, sizeof(dsc_type) * (size_t)(m->n_params + 1));
  if (!grads || !z.sharded || !z.full_type) return zs_oom(&z), DSC_ERR_INTERNAL;
  memset(z.sharded, 0, sizeof(bool) * (size_t)(m->n_params + 1));
  if (n_train > 0 && !find_grads(g, n_train, grads))
    return internal(m, "grad_norm is not sqrt of a sum of squared gradients");
  for (int p = 0, j = 0; p < m->n_params; p++)
    if (!m->params[p].state && !dsc_type_equal(&grads[j++]->type, &m->params[p].type))
      return internal(m, "a gradient's type differs from its param's");
  ir_node *loss = g->outputs[0];

  /* gradients: all-reduced (stage 1) or reduce-scattered (stages 2-3) */
  ir_node **rs = ir_arena_alloc(ar, sizeof(ir_node *) * (size_t)(n_train + 1));
  if (!rs) return zs_oom(&z), DSC_ERR_INTERNAL;
  if (stage == 1) {
    dsc_status st = stage0(m, g, world);
    if (st != DSC_OK) return st;
    z.n_orig = g->n_nodes;
  } else {
    z.n_orig = g->n_nodes;
    zero_red lr;
    memset(&lr, 0, sizeof lr);
    lr.x = loss;
    if (!make_red(g, world, &lr)) return DSC_ERR_INTERNAL;
    asap(&z, lr.start, loss);
    g->outputs[0] = lr.mean;
    for (int j = 0; j < n_train; j++) {
      rs[j] = NULL;
      for (int k = 0; k < j; k++)
        if (grads[k] == grads[j]) rs[j] = rs[k];
      if (rs[j]) continue;
      ir_node *x = grads[j];
      int64_t numel = dsc_type_numel(&x->type), s = shard_len(numel, world);
      ir_node *f = asap(&z, flat(&z, x), x);
      if (f && s * world != numel) {
        int64_t padn = s * world - numel;
        ir_node *in[2] = {f, asap(&z, dsc_const(g, 0, dsc_type_make(x->type.dtype, 1, &padn)), x)};
        dsc_attr a = dsc_attr_int("axis", 0);
        f = in[1] ? asap(&z, dsc_build(g, DSC_OP_CONCAT, in, 2, &a, 1), x) : NULL;
      }
      ir_node *st = asap(&z, start(&z, DSC_OP_REDUCE_SCATTER_START, f), x);
      ir_node *w = build1(&z, DSC_OP_REDUCE_SCATTER_WAIT, st, NULL, 0);
      ir_node *inv = w ? dsc_const(g, 1.0 / (double)world, dsc_type_make(x->type.dtype, 0, NULL)) : NULL;
      rs[j] = inv ? dsc_binary(g, DSC_OP_MUL, w, inv) : NULL;
      if (!rs[j]) return DSC_ERR_INTERNAL;
      w->role = IR_ROLE_GRAD; /* the rank's summed chunk: the memory plan's "grads" */
      x->role = IR_ROLE_NONE;
    }
  }

  /* the walk's arrays; shard the module's states (and params) */
  int nw = z.n_walk = g->n_nodes;
  z.anc = grad_ancestors(m, g, grads, n_train);
  z.kind = ir_arena_alloc(ar, (size_t)nw + 1);
  z.zpad = ir_arena_alloc(ar, sizeof(bool) * (size_t)(nw + 1));
  z.sv = ir_arena_alloc(ar, sizeof(ir_node *) * (size_t)(nw + 1));
  z.full = ir_arena_alloc(ar, sizeof(ir_node *) * (size_t)(nw + 1));
  z.shard = ir_arena_alloc(ar, sizeof(ir_node *) * (size_t)(nw + 1));
  if (!z.anc || !z.kind || !z.zpad || !z.sv || !z.full || !z.shard)
    return zs_oom(&z), DSC_ERR_INTERNAL;
  memset(z.kind, 0, (size_t)nw + 1);
  memset(z.zpad, 0, sizeof(bool) * (size_t)(nw + 1));
  memset(z.sv, 0, sizeof(ir_node *) * (size_t)(nw + 1));
  memset(z.full, 0, sizeof(ir_node *) * (size_t)(nw + 1));
  memset(z.shard, 0, sizeof(ir_node *) * (size_t)(nw + 1));
  for (int p = 0; p < m->n_params; p++)
    if (is_optimizer_state(&m->params[p]) ||
        (stage == 3 && !m->params[p].state && dsc_type_numel(&m->params[p].type) > persist))
      if (!shard_param(&z, p)) return DSC_ERR_INTERNAL;
  if (stage >= 2)
    for (int j = 0; j < n_train; j++) set_kind(&z, grads[j], ZK_SHARD, rs[j], true);
  for (int i = 0; i < nw && !z.failed; i++) { /* reads of sharded params/states: their chunks */
    ir_node *x = g->nodes[i];
    if (x->op != DSC_OP_PARAM) continue;
    int p = dsc_module_find_param(m, ir_attr_str(x, "name"));
    if (p >= 0 && z.sharded[p]) set_kind(&z, x, ZK_SHARD, dsc_param_ref(g, m->params[p].name), true);
  }
  if (z.failed) return DSC_ERR_INTERNAL;
  if (stage == 3 && !gather_params(&z, loss, unshard)) return DSC_ERR_INTERNAL;

  /* the optimizer's part */
  for (int i = 0; i < nw && !z.failed; i++) {
    ir_node *n = g->nodes[i];
    if (z.anc[i] || n->op == DSC_OP_PARAM || n->op == DSC_OP_ASSIGN || n->n_in == 0) continue;
    if (i >= z.n_orig) continue; /* the reductions made above read the full gradients */
    walk_node(&z, n);
  }
  for (int i = 0; i < nw && !z.failed; i++) {
    ir_node *n = g->nodes[i];
    if (n->op != DSC_OP_ASSIGN) continue;
    int p = dsc_module_find_param(m, ir_attr_str(n, "name"));
    ir_node *x = n->in[0], *v = x;
    zero_kind k = kind_of(&z, x);
    bool zp;
    if (p >= 0 && z.sharded[p])
      v = k == ZK_SHARD ? z.sv[x->id] : k == ZK_FULL ? to_shard(&z, x, &zp) : NULL;
    else if (k != ZK_FULL)
      v = full_value(&z, x);
    if (!v) return z.failed ? DSC_ERR_INTERNAL : internal(m, "a sharded state is assigned a sum");
    n->in[0] = v;
    n->type = v->type;
  }
  for (int k = 0; k < g->n_outputs && !z.failed; k++)
    if (kind_of(&z, g->outputs[k]) != ZK_FULL) g->outputs[k] = full_value(&z, g->outputs[k]);
  if (z.failed) return DSC_ERR_INTERNAL;

  /* other graphs must not read what is now sharded */
  for (int gi = 0; gi < m->n_graphs; gi++) {
    ir_graph *o = m->graphs[gi];
    if (o == g) continue;
    for (int i = 0; i < o->n_nodes; i++) {
      if (o->nodes[i]->op != DSC_OP_PARAM) continue;
      int p = dsc_module_find_param(m, ir_attr_str(o->nodes[i], "name"));
      if (p >= 0 && z.sharded[p]) {
        ir_error(m->ctx, ir_no_loc,
                 "zero: graph '%s' reads '%s', which ZeRO stage %d shards; run it from a module "
                 "without the zero pass",
                 o->name, m->params[p].name, stage);
        return DSC_ERR_USER;
      }
    }
  }
  char buf[32];
  snprintf(buf, sizeof buf, "%d", stage);
  if (dsc_module_set_meta(m, "zero.stage", buf) != DSC_OK) return DSC_ERR_INTERNAL;
  snprintf(buf, sizeof buf, "%lld", (long long)world);
  if (dsc_module_set_meta(m, "zero.world", buf) != DSC_OK) return DSC_ERR_INTERNAL;
  return pass_reorder(g, z.n_orig, z.fixed, z.n_fixed);
}

dsc_status pass_zero_run(ir_module *m, const dsc_train_config *cfg) {
  if (!cfg) return DSC_OK; /* no training settings: one rank */
  if (cfg->zero.stage < 0 || cfg->zero.stage > 3) {
    ir_error(m->ctx, ir_no_loc, "zero: stage must be 0, 1, 2 or 3, got %lld",
             (long long)cfg->zero.stage);
    return DSC_ERR_USER;
  }
  if (cfg->world <= 1) return DSC_OK;
  if (cfg->world > INT32_MAX) {
    ir_error(m->ctx, ir_no_loc, "zero: world %lld is too large", (long long)cfg->world);
    return DSC_ERR_USER;
  }
  ir_graph *g = dsc_module_find_graph(m, "train_step");
  if (!g) {
    ir_error(m->ctx, ir_no_loc,
             "zero: the module has no graph 'train_step' (run the optimizer "
             "pass first)");
    return DSC_ERR_USER;
  }
  /* the world's collectives are this pass's: a graph with them went through
   * it already; a mesh axis' (sequence parallelism's exchanges) are the
   * model's and stay */
  for (int i = 0; i < g->n_nodes; i++) {
    const ir_node *x = g->nodes[i];
    if (ir_op(x->op)->cg != IR_CG_COLLECTIVE) continue;
    if (strcmp(ir_collective_group(ir_is_collective_wait(x->op) ? x->in[0] : x), "world") == 0) {
      ir_error(m->ctx, ir_no_loc, "zero: graph 'train_step' already has collectives (%s)",
               ir_op(x->op)->name);
      return DSC_ERR_USER;
    }
  }
  if (cfg->zero.stage == 0) return stage0(m, g, cfg->world);
  return shard_stages(m, g, cfg->world, (int)cfg->zero.stage, cfg->zero.persist_threshold,
                      cfg->zero.unshard_bytes);
}

void dsc_graph_set_collective_tags(dsc_graph *g, int64_t tag) {
  for (int i = 0; g && i < g->n_nodes; i++) {
    ir_node *nd = g->nodes[i];
    if (!ir_is_collective_start(nd->op)) continue;
    for (int k = 0; k < nd->n_attrs; k++)
      if (strcmp(nd->attrs[k].key, "tag") == 0) nd->attrs[k].u.i = tag;
  }
}
