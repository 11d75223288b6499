/* Which part of the training step each node is (ir/ir.h, ir_graph_phases):
 * the loss's ancestors are the forward, the gradient norm's other ancestors
 * the backward, the rest the optimizer step. */
#include <string.h>

#include "ir/ir.h"

/* Gives `p` to root and every ancestor of it that has no phase yet. */
static void mark_ancestors(const ir_graph *g, const ir_node *root, unsigned char p, bool *seen,
                           unsigned char *phase, int *stack) {
  if (seen[root->id]) return;
  int top = 0;
  seen[root->id] = true, phase[root->id] = p;
  stack[top++] = root->id;
  while (top > 0) {
    const ir_node *x = g->nodes[stack[--top]];
    for (int j = 0; j < x->n_in; j++) {
      int s = x->in[j]->id;
      if (!seen[s]) seen[s] = true, phase[s] = p, stack[top++] = s;
    }
  }
}

bool ir_graph_phases(const ir_graph *g, unsigned char *phase) {
  int n = g->n_nodes;
  bool step = strcmp(g->name, "train_step") == 0, micro = strcmp(g->name, "micro_step") == 0;
  memset(phase, IR_PHASE_FORWARD, (size_t)n);
  if ((!step && !micro) || g->n_outputs < 1 || n == 0) return true;
  dsc_context *ctx = g->module->ctx;
  size_t seen_bytes = sizeof(bool) * (size_t)n, stack_bytes = sizeof(int) * (size_t)n;
  bool *seen = ir_alloc(ctx, seen_bytes);
  int *stack = ir_alloc(ctx, stack_bytes); /* each node is pushed once */
  if (!seen || !stack) {
    if (seen) ir_free(ctx, seen, seen_bytes);
    if (stack) ir_free(ctx, stack, stack_bytes);
    return false;
  }
  memset(seen, 0, seen_bytes);
  mark_ancestors(g, g->outputs[0], IR_PHASE_FORWARD, seen, phase, stack);
  if (step && g->n_outputs >= 2)
    mark_ancestors(g, g->outputs[1], IR_PHASE_BACKWARD, seen, phase, stack);
  unsigned char rest = micro ? IR_PHASE_BACKWARD : IR_PHASE_STEP;
  for (int i = 0; i < n; i++)
    if (!seen[i]) phase[i] = rest;
  ir_free(ctx, seen, seen_bytes);
  ir_free(ctx, stack, stack_bytes);
  return true;
}
