/* Graph surgery shared by passes: inlining a graph into another, removing
 * a graph from a module, reordering after nodes were added. */
#include <inttypes.h>
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
    c->role = n->role; /* a recomputation stays one (cse) */
    c->place = n->place;
    map[i] = c;
  }
  dst->cur_loc = saved;
  for (int k = 0; k < src->n_outputs; k++) outs[k] = map[src->outputs[k]->id];
  return true;
}

bool pass_is_view(const ir_node *x) {
  return x->op == DSC_OP_RESHAPE || x->op == DSC_OP_PERMUTE || x->op == DSC_OP_SLICE ||
         x->op == DSC_OP_BROADCAST;
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

dsc_status pass_reorder(ir_graph *g, int n_orig, const pass_fixed_key *fixed_keys, int n_fixed) {
  ir_module *m = g->module;
  ir_arena *ar = &m->arena;
  int nn = g->n_nodes;
  bool *live = ir_arena_alloc(ar, sizeof(bool) * (size_t)nn);
  ir_node **stack = ir_arena_alloc(ar, sizeof(ir_node *) * (size_t)nn);
  double *key = ir_arena_alloc(ar, sizeof(double) * (size_t)nn);
  bool *fixed = ir_arena_alloc(ar, sizeof(bool) * (size_t)nn);
  int *indeg = ir_arena_alloc(ar, sizeof(int) * (size_t)nn);
  int *cstart = ir_arena_alloc(ar, sizeof(int) * (size_t)(nn + 1));
  if (!live || !stack || !key || !fixed || !indeg || !cstart) return ir_error(m->ctx, ir_no_loc, "out of memory while ordering graph '%s'", g->name), DSC_ERR_INTERNAL;
  memset(live, 0, sizeof(bool) * (size_t)nn);
  memset(fixed, 0, sizeof(bool) * (size_t)nn);
  int sp = 0;
  for (int i = 0; i < nn; i++)
    if (g->nodes[i]->op == DSC_OP_ASSIGN || g->nodes[i]->op == DSC_OP_INPUT ||
        g->nodes[i]->op == DSC_OP_TIER_WRITE_WAIT) /* a disk write: a side effect */
      live[i] = true, stack[sp++] = g->nodes[i];
  for (int k = 0; k < g->n_outputs; k++)
    if (!live[g->outputs[k]->id]) live[g->outputs[k]->id] = true, stack[sp++] = g->outputs[k];
  while (sp > 0) {
    ir_node *x = stack[--sp];
    for (int q = 0; q < x->n_in; q++)
      if (!live[x->in[q]->id]) live[x->in[q]->id] = true, stack[sp++] = x->in[q];
  }
  /* keys */
  for (int i = 0; i < nn; i++) key[i] = i < n_orig ? (double)i : (double)nn;
  for (int i = 0; i < n_orig; i++) fixed[i] = true;
  for (int f = 0; f < n_fixed; f++) {
    key[fixed_keys[f].node->id] = fixed_keys[f].key;
    fixed[fixed_keys[f].node->id] = true;
  }
  for (int k = 0; k < g->n_outputs; k++) {
    int o = g->outputs[k]->id;
    if (!fixed[o]) key[o] = nn;
  }
  for (bool changed = true; changed;) { /* as late as possible: before the first reader */
    changed = false;
    for (int i = nn - 1; i >= 0; i--) {
      ir_node *c = g->nodes[i];
      if (!live[i]) continue;
      for (int q = 0; q < c->n_in; q++) {
        int x = c->in[q]->id;
        if (!fixed[x] && key[i] - 1e-4 < key[x]) key[x] = key[i] - 1e-4, changed = true;
      }
    }
  }
  /* consumers (CSR) and in-degrees over live nodes */
  memset(cstart, 0, sizeof(int) * (size_t)(nn + 1));
  int edges = 0;
  for (int i = 0; i < nn; i++) {
    indeg[i] = 0;
    if (!live[i]) continue;
    ir_node *c = g->nodes[i];
    for (int q = 0; q < c->n_in; q++) cstart[c->in[q]->id + 1]++, indeg[i]++, edges++;
  }
  for (int i = 0; i < nn; i++) cstart[i + 1] += cstart[i];
  int *cons = ir_arena_alloc(ar, sizeof(int) * (size_t)(edges + 1));
  int *fill = ir_arena_alloc(ar, sizeof(int) * (size_t)nn);
  int *heap = ir_arena_alloc(ar, sizeof(int) * (size_t)nn);
  ir_node **order = ir_arena_alloc(ar, sizeof(ir_node *) * (size_t)nn);
  if (!cons || !fill || !heap || !order) return ir_error(m->ctx, ir_no_loc, "out of memory while ordering graph '%s'", g->name), DSC_ERR_INTERNAL;
  memcpy(fill, cstart, sizeof(int) * (size_t)nn);
  for (int i = 0; i < nn; i++) {
    if (!live[i]) continue;
    ir_node *c = g->nodes[i];
    for (int q = 0; q < c->n_in; q++) cons[fill[c->in[q]->id]++] = i;
  }
#define ZLESS(a, b) (key[a] < key[b] || (key[a] == key[b] && (a) < (b)))
  int hn = 0, k_out = 0;
  for (int i = 0; i < nn; i++)
    if (live[i] && indeg[i] == 0) {
      int j = hn++;
      heap[j] = i;
      while (j > 0 && ZLESS(heap[j], heap[(j - 1) / 2])) {
        int t = heap[j]; heap[j] = heap[(j - 1) / 2]; heap[(j - 1) / 2] = t; j = (j - 1) / 2;
      }
    }
  while (hn > 0) {
    int x = heap[0];
    heap[0] = heap[--hn];
    for (int j = 0;;) {
      int l = 2 * j + 1, r = l + 1, s = j;
      if (l < hn && ZLESS(heap[l], heap[s])) s = l;
      if (r < hn && ZLESS(heap[r], heap[s])) s = r;
      if (s == j) break;
      int t = heap[j]; heap[j] = heap[s]; heap[s] = t; j = s;
    }
    order[k_out++] = g->nodes[x];
    for (int e = cstart[x]; e < cstart[x + 1]; e++) {
      int c = cons[e];
      if (--indeg[c] == 0) {
        int j = hn++;
        heap[j] = c;
        while (j > 0 && ZLESS(heap[j], heap[(j - 1) / 2])) {
          int t = heap[j]; heap[j] = heap[(j - 1) / 2]; heap[(j - 1) / 2] = t; j = (j - 1) / 2;
        }
      }
    }
  }
#undef ZLESS
  int n_live = 0;
  for (int i = 0; i < nn; i++) n_live += live[i];
  if (k_out != n_live) {
    ir_error(m->ctx, ir_no_loc, "internal: graph '%s' has a cycle after a pass moved nodes", g->name);
    return DSC_ERR_INTERNAL;
  }
  for (int i = 0; i < k_out; i++) {
    g->nodes[i] = order[i];
    order[i]->id = i;
  }
  g->n_nodes = k_out;
  return DSC_OK;
}

void pass_replace_uses(ir_graph *g, ir_node *from, ir_node *to) {
  for (int i = 0; i < g->n_nodes; i++) {
    ir_node *x = g->nodes[i];
    if (x == to) continue;
    for (int q = 0; q < x->n_in; q++)
      if (x->in[q] == from) x->in[q] = to;
  }
  for (int k = 0; k < g->n_outputs; k++)
    if (g->outputs[k] == from) g->outputs[k] = to;
}

ir_node *pass_collective_start(ir_graph *g, dsc_op op, ir_node *x, int64_t world,
                               const char *group) {
  dsc_attr a[3] = {dsc_attr_int("world", world), dsc_attr_int("tag", 0),
                   dsc_attr_str("group", group)};
  return x ? dsc_build(g, op, &x, 1, a, 3) : NULL;
}

ir_node *pass_local_shard(ir_graph *g, ir_node *x, int64_t world, const char *group) {
  dsc_attr a[2] = {dsc_attr_int("world", world), dsc_attr_str("group", group)};
  return x ? dsc_build(g, DSC_OP_LOCAL_SHARD, &x, 1, a, 2) : NULL;
}

ir_node *pass_all_to_all(ir_graph *g, ir_node *x, int64_t world, const char *group) {
  ir_node *start = pass_collective_start(g, DSC_OP_ALL_TO_ALL_START, x, world, group);
  return start ? dsc_build(g, DSC_OP_ALL_TO_ALL_WAIT, &start, 1, NULL, 0) : NULL;
}

ir_graph *pass_mesh_forward(ir_module *m, const char *what, const char *axis, int64_t n,
                            int64_t world, dsc_status *st) {
  ir_graph *g = dsc_module_find_graph(m, "forward");
  if (!g) {
    ir_error(m->ctx, ir_no_loc, "%s: the module has no graph 'forward'", what);
    *st = DSC_ERR_INTERNAL;
    return NULL;
  }
  if (world % n != 0) {
    ir_error(m->ctx, ir_no_loc, "%s: %s=%" PRId64 " does not divide the world of %" PRId64 " ranks",
             what, axis, n, world);
    *st = DSC_ERR_USER;
    return NULL;
  }
  return g;
}

bool pass_model_collective(const ir_node *x) {
  const char *group = ir_collective_group(x);
  return strcmp(group, "sp") == 0 || strcmp(group, "ep") == 0 || strcmp(group, "tp") == 0;
}

bool pass_reads_positions(const ir_node *u, int j) {
  return (u->op == DSC_OP_EMBEDDING || u->op == DSC_OP_ROPE) && j == 1;
}
