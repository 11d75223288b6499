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
 * Readers of g_j are rewired only after the last g_j, i.e. in the
 * optimizer's part of the graph, never inside the backward pass.
 *
 * Stages 1-3 (sharding) are not implemented yet: an error at world > 1. At
 * world 1 there is nothing to shard or reduce and the pass does nothing.
 *
 * Tags: every start gets tag 0; the trainer sets it to the step number
 * before each step (dsc_graph_set_collective_tags), so a failed collective
 * names its step. */
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

/* x of a norm term [cast](sum(x * x)), or NULL. */
static ir_node *term_value(ir_node *t) {
  if (t->op == DSC_OP_CAST) t = t->in[0];
  if (t->op != DSC_OP_SUM || t->in[0]->op != DSC_OP_MUL) return NULL;
  ir_node *mul = t->in[0];
  return mul->in[0] == mul->in[1] ? mul->in[0] : NULL;
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
  dsc_attr a[2] = {dsc_attr_int("world", world), dsc_attr_int("tag", 0)};
  r->start = dsc_build(g, DSC_OP_ALL_REDUCE_START, &r->x, 1, a, 2);
  if (!r->start) return false;
  r->wait = dsc_build(g, DSC_OP_ALL_REDUCE_WAIT, &r->start, 1, NULL, 0);
  if (!r->wait) return false;
  r->inv = dsc_const(g, 1.0 / (double)world, dsc_type_make(r->x->type.dtype, 0, NULL));
  if (!r->inv) return false;
  r->mean = dsc_binary(g, DSC_OP_MUL, r->wait, r->inv);
  return r->mean != NULL;
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

  int n0 = g->n_nodes, cut = -1, n_red = 0;
  for (int j = 0; j < n_train; j++)
    if (grads[j]->id > cut) cut = grads[j]->id;
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

  /* Rewire the optimizer's readers (after the cut) to the means. */
  for (int i = cut + 1; i < n0; i++) {
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
  if (cfg->zero.stage > 0) {
    ir_error(m->ctx, ir_no_loc,
             "ZeRO stage %lld is not implemented yet (world %lld); use stage 0 (data "
             "parallelism: gradients all-reduced, nothing sharded)",
             (long long)cfg->zero.stage, (long long)cfg->world);
    return DSC_ERR_USER;
  }
  ir_graph *g = dsc_module_find_graph(m, "train_step");
  if (!g) {
    ir_error(m->ctx, ir_no_loc,
             "zero: the module has no graph 'train_step' (run the optimizer "
             "pass first)");
    return DSC_ERR_USER;
  }
  for (int i = 0; i < g->n_nodes; i++)
    if (ir_op(g->nodes[i]->op)->cg == IR_CG_COLLECTIVE) {
      ir_error(m->ctx, ir_no_loc, "zero: graph 'train_step' already has collectives (%s)",
               ir_op(g->nodes[i]->op)->name);
      return DSC_ERR_USER;
    }
  return stage0(m, g, cfg->world);
}

void dsc_graph_set_collective_tags(dsc_graph *g, int64_t tag) {
  for (int i = 0; g && i < g->n_nodes; i++) {
    ir_node *nd = g->nodes[i];
    if (!ir_is_collective_start(nd->op)) continue;
    for (int k = 0; k < nd->n_attrs; k++)
      if (strcmp(nd->attrs[k].key, "tag") == 0) nd->attrs[k].u.i = tag;
  }
}
