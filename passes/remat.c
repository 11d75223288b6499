/* The activation checkpointing pass (rematerialisation), on the
 * differentiated graph "forward" (after autodiff, before the optimizer
 * inlines it). The backward pass recomputes some of the forward values it
 * reads instead of keeping them: a recomputed value is a clone of its op
 * (over clones of its recomputed inputs) placed right before its first
 * backward reader, so the forward's copy dies after its last forward use
 * instead of living until the backward. The values are the same bit for
 * bit (the same ops on the same inputs), so training is unchanged; the
 * memory plan shows the drop. Policies (cfg->remat,
 * --checkpoint-activations):
 * - selective (Megatron's selective recomputation): the cheap values
 *   (elementwise ops, views, norms and softmaxes) are recomputed from the
 *   expensive ones, which stay (matmul and attention outputs, reductions,
 *   gathers, inputs and params);
 * - block, blocks:K (torch.utils.checkpoint around every K-th block): only
 *   each such block's input stays, and the backward recomputes everything
 *   in the blocks from it, matmuls included. A value's block is the
 *   highest instance index of the block params it depends on ("h.3.fc_w":
 *   3); a block's input is a value of a lower block that it reads. What
 *   follows the last read of a block param (the output layer, the loss)
 *   stays.
 * - offload (issue 7's alternative to recomputation): the values the
 *   backward reads are kept, but on the host: to_host after their last
 *   forward reader, to_device before their first backward reader
 *   (passes/offload_host.c); views of them are re-applied on the copy.
 * Policy "none" does nothing. */
#include <stdlib.h>
#include <string.h>

#include "passes/passes.h"

/* Cheap to compute again from its inputs. */
static bool recomputable(const ir_node *n) {
  switch (ir_op(n->op)->cg) {
    case IR_CG_ELEMENTWISE: /* casts too: bf16 copies of activations are not kept */
      return true;
    case IR_CG_COPY: /* views and concatenation; not embedding (a gather) or assign */
      return n->op != DSC_OP_EMBEDDING && n->op != DSC_OP_ASSIGN;
    case IR_CG_COMPOSITE:
      return n->op == DSC_OP_LAYERNORM || n->op == DSC_OP_RMSNORM || n->op == DSC_OP_SOFTMAX ||
             n->op == DSC_OP_LOG_SOFTMAX;
    default:
      return false;
  }
}

typedef struct {
  ir_graph *g;
  const bool *fwd;
  const bool *redo; /* per node: the backward recomputes it */
  ir_node **clone;  /* per forward node: its recomputation, built on demand */
  pass_act_offload *off; /* policy offload: kept values come back from the host */
} remat_state;

/* The backward's copy of forward value x: a clone of x over clones of its
 * recomputable forward inputs (the others are read as they are). */
static ir_node *recompute(remat_state *s, ir_node *x) {
  if (s->clone[x->id]) return s->clone[x->id];
  ir_node *small[8], **in = small;
  if (x->n_in > 8 &&
      !(in = ir_arena_alloc(&s->g->module->arena, sizeof(ir_node *) * (size_t)x->n_in)))
    return NULL;
  for (int q = 0; q < x->n_in; q++) {
    ir_node *y = x->in[q];
    in[q] = s->redo[y->id] ? recompute(s, y) : s->off ? pass_act_offload_ref(s->off, y) : y;
    if (!in[q]) return NULL;
  }
  dsc_loc saved = s->g->cur_loc;
  s->g->cur_loc = x->loc;
  ir_node *c = ir_node_new_raw(s->g, x->op, x->type, in, x->n_in, x->attrs, x->n_attrs);
  s->g->cur_loc = saved;
  if (c) c->role = IR_ROLE_RECOMPUTED;
  return s->clone[x->id] = c;
}

/* "h.3.fc_w" -> 3: the instance of a block array a param belongs to; -1. */
static int param_block(const char *name) {
  const char *dot = strchr(name, '.');
  if (!dot) return -1;
  char *end;
  long v = strtol(dot + 1, &end, 10);
  return end != dot + 1 && *end == '.' && v >= 0 && v < (1L << 30) ? (int)v : -1;
}

/* Policy block / blocks:K: redo[i] for the forward values inside blocks
 * that are not a kept block input. */
static void block_policy(ir_graph *g, const bool *fwd, int64_t every, bool *redo, int *blk) {
  int n = g->n_nodes, last_read = -1;
  for (int i = 0; i < n; i++) {
    ir_node *x = g->nodes[i];
    blk[i] = x->op == DSC_OP_PARAM ? param_block(ir_attr_str(x, "name")) : -1;
    for (int q = 0; q < x->n_in; q++) {
      int b = blk[x->in[q]->id];
      if (b > blk[i]) blk[i] = b;
      if (fwd[i] && x->in[q]->op == DSC_OP_PARAM && b >= 0) last_read = i;
    }
  }
  for (int i = 0; i <= last_read; i++)
    redo[i] = fwd[i] && g->nodes[i]->n_in > 0 && blk[i] >= 0;
  /* kept: the values a checkpointed block (every `every`-th) reads from an
   * earlier block or from before the blocks */
  for (int i = 0; i <= last_read; i++) {
    ir_node *y = g->nodes[i];
    if (!fwd[i] || blk[i] < 0 || blk[i] % every != 0) continue;
    for (int q = 0; q < y->n_in; q++) {
      int x = y->in[q]->id;
      if (blk[x] < blk[i]) redo[x] = false;
    }
  }
}

static dsc_status run_policy(ir_module *m, ir_graph *g, const dsc_train_config *cfg) {
  if (g->n_outputs < 1) return DSC_OK;
  int n = g->n_nodes;
  ir_arena *a = &m->arena;
  bool *fwd = ir_arena_alloc(a, sizeof(bool) * (size_t)n);
  bool *redo = ir_arena_alloc(a, sizeof(bool) * (size_t)n);
  int *blk = ir_arena_alloc(a, sizeof(int) * (size_t)n);
  ir_node **stack = ir_arena_alloc(a, sizeof(ir_node *) * (size_t)n);
  ir_node **clone = ir_arena_alloc(a, sizeof(ir_node *) * (size_t)n);
  if (!fwd || !redo || !blk || !stack || !clone) {
    ir_error(m->ctx, ir_no_loc, "remat: out of memory");
    return DSC_ERR_INTERNAL;
  }
  memset(fwd, 0, sizeof(bool) * (size_t)n);
  memset(clone, 0, sizeof(ir_node *) * (size_t)n);
  /* the forward pass: what the loss (output 0) is computed from */
  int sp = 0;
  fwd[g->outputs[0]->id] = true, stack[sp++] = g->outputs[0];
  while (sp > 0) {
    ir_node *x = stack[--sp];
    for (int q = 0; q < x->n_in; q++)
      if (!fwd[x->in[q]->id]) fwd[x->in[q]->id] = true, stack[sp++] = x->in[q];
  }
  memset(redo, 0, sizeof(bool) * (size_t)n);
  pass_act_offload *off = NULL;
  if (cfg->remat == DSC_REMAT_BLOCKS)
    block_policy(g, fwd, cfg->remat_every > 0 ? cfg->remat_every : 1, redo, blk);
  else if (cfg->remat == DSC_REMAT_OFFLOAD) { /* views re-applied, values moved (offload_host.c) */
    for (int i = 0; i < n; i++)
      redo[i] = fwd[i] && g->nodes[i]->n_in > 0 && pass_is_view(g->nodes[i]);
    if (!(off = pass_act_offload_new(g, fwd))) {
      ir_error(m->ctx, ir_no_loc, "remat: out of memory");
      return DSC_ERR_INTERNAL;
    }
  } else
    for (int i = 0; i < n; i++) redo[i] = fwd[i] && recomputable(g->nodes[i]);
  remat_state s = {g, fwd, redo, clone, off};
  for (int i = 0; i < n; i++) {
    ir_node *b = g->nodes[i];
    if (fwd[i]) continue; /* a backward node */
    for (int q = 0; q < b->n_in; q++) {
      ir_node *x = b->in[q];
      if (!redo[x->id] && !off) continue;
      if (!(b->in[q] = redo[x->id] ? recompute(&s, x) : pass_act_offload_ref(off, x))) {
        ir_error(m->ctx, ir_no_loc, "remat: out of memory");
        return DSC_ERR_INTERNAL;
      }
    }
  }
  /* the clones go right before their first reader (offload: the to_host
   * copies right after their value's last forward reader) */
  int n_keys = 0;
  const pass_fixed_key *keys = off ? pass_act_offload_keys(off, &n_keys) : NULL;
  return pass_reorder(g, n, keys, n_keys);
}

dsc_status pass_remat_run(ir_module *m, const dsc_train_config *cfg) {
  if (!cfg || cfg->remat == DSC_REMAT_NONE) return DSC_OK;
  ir_graph *g = dsc_module_find_graph(m, "forward");
  if (!g) {
    ir_error(m->ctx, ir_no_loc, "remat: the module has no graph 'forward'");
    return DSC_ERR_USER;
  }
  if (g->n_outputs < 2) {
    ir_error(m->ctx, ir_no_loc,
             "remat: graph 'forward' has no backward pass (run autodiff first)");
    return DSC_ERR_USER;
  }
  return run_policy(m, g, cfg);
}
