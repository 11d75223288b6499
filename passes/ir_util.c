/* Graph surgery shared by passes: inlining a graph into another, removing
 * a graph from a module. */
#include <string.h>

#include "passes/passes.h"

bool pass_inline_graph(ir_graph *dst, const ir_graph *src, ir_node *const *inputs, ir_node **outs) {
  ir_module *m = dst->module;
  size_t sz = sizeof(ir_node *) * (size_t)(src->n_nodes ? src->n_nodes : 1);
  ir_node **map = ir_arena_alloc(&m->arena, sz);
  if (!map) {
    ir_error(m->ctx, ir_no_loc, "out of memory while inlining graph '%s'", src->name);
    return false;
  }
  for (int i = 0; i < src->n_inputs; i++) map[src->inputs[i]->id] = inputs[i];
  dsc_loc saved = dst->cur_loc;
  for (int i = 0; i < src->n_nodes; i++) {
    const ir_node *n = src->nodes[i];
    if (n->op == DSC_OP_INPUT) continue; /* mapped above */
    ir_node *small[8], **in = small;
    if (n->n_in > 8 && !(in = ir_arena_alloc(&m->arena, sizeof(ir_node *) * (size_t)n->n_in)))
      return ir_error(m->ctx, ir_no_loc, "out of memory while inlining"), false;
    for (int j = 0; j < n->n_in; j++) in[j] = map[n->in[j]->id];
    dst->cur_loc = n->loc; /* the clone points at the same model text */
    ir_node *c = ir_node_new_raw(dst, n->op, n->type, in, n->n_in, n->attrs, n->n_attrs);
    if (!c) {
      dst->cur_loc = saved;
      return false; /* ir_node_new_raw reported it */
    }
    map[i] = c;
  }
  dst->cur_loc = saved;
  for (int k = 0; k < src->n_outputs; k++) outs[k] = map[src->outputs[k]->id];
  return true;
}

bool pass_remove_graph(ir_module *m, const char *name) {
  for (int i = 0; i < m->n_graphs; i++)
    if (strcmp(m->graphs[i]->name, name) == 0) {
      memmove(&m->graphs[i], &m->graphs[i + 1], sizeof(ir_graph *) * (size_t)(m->n_graphs - i - 1));
      m->n_graphs--;
      return true;
    }
  return false;
}
