/* The activation checkpointing pass (rematerialisation), on the
 * differentiated graph "forward" (after autodiff, before the optimizer
 * inlines it). Policy "selective" (cfg->remat, --checkpoint-activations
 * selective, as Megatron's selective recomputation and PyTorch's
 * selective activation checkpointing): the backward pass recomputes the
 * cheap forward values it reads (elementwise ops, layout ops, norms and
 * softmaxes) from the expensive ones, which stay (matmul and attention
 * outputs, reductions, gathers, inputs and params). A recomputed value is a
 * clone of its op placed right before its first backward reader, so the
 * forward's copy dies after its last forward use instead of living until
 * the backward. The values are the same bit for bit (the same ops on the
 * same inputs), so training is unchanged; the memory plan shows the drop.
 * Policy "none" does nothing. */
#include <string.h>

#include "passes/passes.h"

/* Cheap to compute again from its inputs. */
static bool recomputable(const ir_node *n) {
  switch (ir_op(n->op)->cg) {
    case IR_CG_ELEMENTWISE:
      /* not casts: with bf16 compute, recomputed casts led the fuse pass to
       * groups it could not order (a cycle; gpt-tiny, bf16, cpu backend:
       * tests/cli/remat.sh keeps that case running). Casts of params are
       * recomputed per segment by the zero pass anyway. */
      return n->op != DSC_OP_CAST;
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
  ir_node **clone; /* per forward node: its recomputation, built on demand */
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
    in[q] = s->fwd[y->id] && recomputable(y) ? recompute(s, y) : y;
    if (!in[q]) return NULL;
  }
  dsc_loc saved = s->g->cur_loc;
  s->g->cur_loc = x->loc;
  ir_node *c = ir_node_new_raw(s->g, x->op, x->type, in, x->n_in, x->attrs, x->n_attrs);
  s->g->cur_loc = saved;
  return s->clone[x->id] = c;
}

static dsc_status selective(ir_module *m, ir_graph *g) {
  if (g->n_outputs < 1) return DSC_OK;
  int n = g->n_nodes;
  ir_arena *a = &m->arena;
  bool *fwd = ir_arena_alloc(a, sizeof(bool) * (size_t)n);
  ir_node **stack = ir_arena_alloc(a, sizeof(ir_node *) * (size_t)n);
  ir_node **clone = ir_arena_alloc(a, sizeof(ir_node *) * (size_t)n);
  if (!fwd || !stack || !clone) {
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
  remat_state s = {g, fwd, clone};
  for (int i = 0; i < n; i++) {
    ir_node *b = g->nodes[i];
    if (fwd[i]) continue; /* a backward node */
    for (int q = 0; q < b->n_in; q++) {
      ir_node *x = b->in[q];
      if (!fwd[x->id] || !recomputable(x)) continue;
      if (!(b->in[q] = recompute(&s, x))) {
        ir_error(m->ctx, ir_no_loc, "remat: out of memory");
        return DSC_ERR_INTERNAL;
      }
    }
  }
  /* the clones go right before their first reader */
  return pass_reorder(g, n, NULL, 0);
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
  return selective(m, g);
}
