/* Expert parallelism (DeepSpeed-MoE's dataflow; docs/parallelism.md): graph
 * 'forward' becomes one rank's program of the `ep` mesh axis (cfg->ep
 * ranks), each of which runs E / ep of every MoE layer's E experts.
 *
 * An expert region is what the model computes per expert: it starts at the
 * slots x [E, C, d] (the tokens dispatched to each expert's C slots) that a
 * batched matmul multiplies by an expert param w [E, d, f] (a param whose
 * leading dimension is the experts, or its cast), and grows through the
 * matmuls and elementwise ops whose every input is the slots, the region,
 * an expert param or a scalar, keeping [E, ...] (examples/lib/moe.dsm's
 * moe_expert_mlp). The pass
 *   - exchanges the slots over ep (all_to_all: the slots of experts
 *     [j E/ep, (j+1) E/ep) go to rank j) and lays what arrives out as
 *     [E/ep, ep C, d]: this rank's experts, with every ep rank's tokens;
 *   - runs the region on this rank's experts: each expert param read as its
 *     block [E/ep, ...] (local_shard over ep of the param, whose gradient
 *     is that block's and zeros elsewhere);
 *   - exchanges each value leaving the region back ([E, C, k] on the rank
 *     whose tokens they are).
 * Params stay whole on every rank (the zero pass's mean over all ranks
 * sums each block's gradient from the ranks that ran it, so every rank
 * updates every expert identically); ZeRO stages 1-3 shard them over the
 * world like any param. The computation per token is the single rank's:
 * the losses and gradients equal the run without ep on the same
 * micro-batches (capacities are per rank's tokens, as in DeepSpeed). */
#include <inttypes.h>
#include <string.h>

#include "passes/passes.h"

#define EP_MAX_INPUTS 4 /* a region's ops: matmul, elementwise (where: 3) */

typedef struct {
  ir_module *m;
  ir_graph *g;
  int64_t ep;
  int n;                 /* the nodes before the pass: region and mine have n entries */
  unsigned char *region; /* per node id: in some expert region */
  bool failed;
} ep_state;

/* The expert param behind x: a param of rank >= 2 with leading dimension
 * E, or a cast of one (mixed precision); else NULL. */
static const ir_node *expert_param(const ir_node *x, int64_t E) {
  const ir_node *p = x->op == DSC_OP_CAST ? x->in[0] : x;
  if (p->op != DSC_OP_PARAM || x->type.rank < 2 || x->type.dims[0] != E) return NULL;
  return p;
}

/* Nodes the pass added (an earlier region's exchanges back) are in none. */
static bool in_region(const ep_state *s, const ir_node *x, const unsigned char *mine) {
  return x->id < s->n && mine[x->id];
}

/* Whether node q joins the region of slots x (mine: its members so far). */
static bool joins(const ep_state *s, const ir_node *q, const ir_node *x,
                  const unsigned char *mine) {
  int64_t E = x->type.dims[0];
  bool elementwise = ir_op(q->op)->cg == IR_CG_ELEMENTWISE;
  if (!(q->op == DSC_OP_MATMUL || elementwise) || q->type.rank != 3 || q->type.dims[0] != E ||
      q->n_in > EP_MAX_INPUTS)
    return false;
  bool reads = false;
  for (int j = 0; j < q->n_in; j++) {
    const ir_node *a = q->in[j];
    if (a == x || in_region(s, a, mine))
      reads = true;
    else if (!expert_param(a, E) && a->type.rank != 0)
      return false;
  }
  return reads;
}

static ir_node *checked(ep_state *s, ir_node *x) {
  if (!x) s->failed = true;
  return x;
}

static ir_node *all_to_all(ep_state *s, ir_node *x) {
  return checked(s, pass_all_to_all(s->g, x, s->ep, "ep"));
}

static ir_node *reshape(ep_state *s, ir_node *x, const int64_t *dims, int rank) {
  return x ? checked(s, dsc_reshape(s->g, x, dims, rank)) : NULL;
}

static ir_node *permute0213(ep_state *s, ir_node *x) { /* swaps the two leading axes */
  int64_t perm[4] = {1, 0, 2, 3};
  return x ? checked(s, dsc_permute(s->g, x, perm, 4)) : NULL;
}

/* [E, C, k] (this rank's tokens, every expert) -> [E/ep, ep C, k] (this
 * rank's experts, every rank's tokens). */
static ir_node *slots_in(ep_state *s, ir_node *x) {
  int64_t E = x->type.dims[0], C = x->type.dims[1], k = x->type.dims[2], El = E / s->ep;
  int64_t four[4] = {s->ep, El, C, k}, three[3] = {El, s->ep * C, k};
  return reshape(s, permute0213(s, reshape(s, all_to_all(s, x), four, 4)), three, 3);
}

/* The inverse: [E/ep, ep C, k] -> [E, C, k]. */
static ir_node *slots_out(ep_state *s, ir_node *y, int64_t E, int64_t C) {
  int64_t k = y->type.dims[2], El = E / s->ep;
  int64_t four[4] = {El, s->ep, C, k}, three[3] = {E, C, k};
  return reshape(s, all_to_all(s, permute0213(s, reshape(s, y, four, 4))), three, 3);
}

/* This rank's block [E/ep, ...] of expert param (or cast) w [E, ...]. */
static ir_node *param_block(ep_state *s, ir_node *w) {
  int64_t n = dsc_type_numel(&w->type), dims[DSC_MAX_RANK];
  memcpy(dims, w->type.dims, sizeof(int64_t) * (size_t)w->type.rank);
  dims[0] /= s->ep;
  ir_node *flat = reshape(s, w, &n, 1);
  ir_node *mine = flat ? checked(s, pass_local_shard(s->g, flat, s->ep, "ep")) : NULL;
  return reshape(s, mine, dims, w->type.rank);
}

/* The region of slots x (members marked in mine, in node order) on this
 * rank's experts; its values read outside it exchanged back. */
static bool rewrite_region(ep_state *s, ir_node *x, const unsigned char *mine) {
  dsc_context *ctx = s->m->ctx;
  int64_t E = x->type.dims[0], C = x->type.dims[1];
  if (E % s->ep != 0) {
    ir_error(ctx, x->loc,
             "expert parallelism (ep=%" PRId64
             ") gives each rank experts / ep of each MoE "
             "layer: %" PRId64 " experts are not divisible by %" PRId64,
             s->ep, E, s->ep);
    return false;
  }
  ir_graph *g = s->g;
  ir_node **clone = ir_arena_alloc(&s->m->arena, sizeof(ir_node *) * (size_t)g->n_nodes);
  if (!clone) return ir_error(ctx, ir_no_loc, "out of memory in the expert-parallel pass"), false;
  int n = s->n;
  memset(clone, 0, sizeof(ir_node *) * (size_t)g->n_nodes);
  dsc_graph_set_loc(g, x->loc);
  clone[x->id] = slots_in(s, x);
  for (int i = x->id + 1; i < n && !s->failed; i++) {
    ir_node *q = g->nodes[i];
    if (!mine[i]) continue;
    ir_node *in[EP_MAX_INPUTS];
    for (int j = 0; j < q->n_in; j++) {
      ir_node *a = q->in[j];
      if (!clone[a->id] && expert_param(a, E)) clone[a->id] = param_block(s, a);
      in[j] = clone[a->id] ? clone[a->id] : a; /* a scalar stays */
    }
    dsc_graph_set_loc(g, q->loc);
    clone[i] = checked(s, dsc_build(g, q->op, in, q->n_in, q->attrs, q->n_attrs));
  }
  /* values read outside the region go back to their tokens' ranks */
  for (int i = x->id + 1; i < n && !s->failed; i++) {
    ir_node *q = g->nodes[i];
    if (!mine[i]) continue;
    bool outside = false;
    for (int k = 0; k < g->n_outputs; k++) outside |= g->outputs[k] == q;
    for (int u = i + 1; u < n && !outside; u++)
      for (int j = 0; j < g->nodes[u]->n_in; j++) outside |= g->nodes[u]->in[j] == q && !mine[u];
    if (!outside) continue;
    dsc_graph_set_loc(g, q->loc);
    ir_node *back = slots_out(s, clone[i], E, C);
    if (!back) break;
    /* only the readers outside the region: its members read the clones */
    for (int u = i + 1; u < n; u++)
      for (int j = 0; !mine[u] && j < g->nodes[u]->n_in; j++)
        if (g->nodes[u]->in[j] == q) g->nodes[u]->in[j] = back;
    for (int k = 0; k < g->n_outputs; k++)
      if (g->outputs[k] == q) g->outputs[k] = back;
  }
  return !s->failed;
}

dsc_status pass_expert_parallel_run(ir_module *m, const dsc_train_config *cfg) {
  if (!cfg || cfg->ep <= 1) return DSC_OK;
  dsc_status st = DSC_OK;
  ir_graph *g = pass_mesh_forward(m, "expert parallel", "ep", cfg->ep, cfg->world, &st);
  if (!g) return st;
  int n = g->n_nodes, regions = 0;
  ep_state s = {m, g, cfg->ep, n, ir_arena_alloc(&m->arena, (size_t)n), false};
  unsigned char *mine = ir_arena_alloc(&m->arena, (size_t)n);
  if (!s.region || !mine) {
    ir_error(m->ctx, ir_no_loc, "out of memory in the expert-parallel pass");
    return DSC_ERR_INTERNAL;
  }
  memset(s.region, 0, (size_t)n);
  for (int i = 0; i < n && !s.failed; i++) {
    ir_node *q = g->nodes[i];
    if (q->op != DSC_OP_MATMUL || s.region[i] || q->in[0]->type.rank != 3 ||
        !expert_param(q->in[1], q->in[0]->type.dims[0]))
      continue;
    ir_node *x = q->in[0]; /* the slots: the region starts here */
    memset(mine, 0, (size_t)n);
    for (int k = x->id + 1; k < n; k++)
      if (!s.region[k] && joins(&s, g->nodes[k], x, mine)) mine[k] = s.region[k] = 1;
    if (!rewrite_region(&s, x, mine)) return DSC_ERR_USER;
    regions++;
  }
  if (regions == 0) {
    ir_error(m->ctx, ir_no_loc,
             "expert parallel (ep=%" PRId64
             "): graph 'forward' has no experts: no batched "
             "matmul of slots [E, C, d] by a param [E, d, f] (examples/lib/moe.dsm's "
             "moe_expert_mlp)",
             cfg->ep);
    return DSC_ERR_USER;
  }
  return pass_reorder(g, n, NULL, 0);
}
