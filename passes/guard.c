/* Pass guard: the values a step needs only in some of its runs.
 *
 * A step's graph has no control flow. An update applied only on some steps
 * (ZenFlow's host update every S steps and its selection every R, the
 * delayed update's first step, fp16's skipped steps) is computed every step
 * and kept by a where(c, new, old) on a bool scalar c. This pass marks
 * (ir_node.guard, printed ` when %c` / ` unless %c`) each value needed only
 * when c has one value, so that an executor may skip computing it in the
 * other runs (codegen/lower.c puts the guard on its instructions). The
 * numbers are the same either way; the interpreter computes everything.
 *
 * The rule, from the last node back:
 *  - an assign of where(c, x, s) or where(c, s, x), with s a read of the
 *    state it assigns, changes the state only when c is true (false): it
 *    takes that guard (ir_guard_kept_state), and is skipped otherwise;
 *  - any other node whose op may be skipped (ir_guard_may_skip) takes the
 *    guard that all of its reads agree on: a read as branch x of a
 *    where(c, ...) on a bool scalar c needs it when c is true (false for
 *    the other branch); a read by a guarded node needs it under that
 *    node's guard; any other read, or being a graph output, always;
 *  - a guard comes before the node in the order (the executor reads c when
 *    the node's turn comes), so each condition and the scalars it is
 *    computed from are first moved as early as their inputs allow;
 *  - a condition and its copies to or from the host (a host where reads
 *    the copy) are one guard: the original (ir_guard_root).
 * pass_guard_settle drops the guards that a later reorder (fuse) or a
 * fusion group no longer allows. */
#include <string.h>

#include "passes/passes.h"

static bool bool_scalar(const ir_node *c) {
  return c->type.dtype == DSC_BOOL && dsc_type_numel(&c->type) == 1;
}

/* The conditions of wheres on bool scalars and the scalars they are
 * computed from (not collectives or disk transfers, which keep their
 * order across ranks), to the front: each runs as soon as its inputs are
 * there. */
static dsc_status conditions_first(ir_graph *g) {
  ir_module *m = g->module;
  int n = g->n_nodes;
  bool *cone = ir_arena_alloc(&m->arena, sizeof(bool) * (size_t)(n + 1));
  ir_node **stack = ir_arena_alloc(&m->arena, sizeof(ir_node *) * (size_t)(n + 1));
  pass_fixed_key *keys = ir_arena_alloc(&m->arena, sizeof(pass_fixed_key) * (size_t)(n + 1));
  if (!cone || !stack || !keys) {
    ir_error(m->ctx, ir_no_loc, "guard: out of memory");
    return DSC_ERR_INTERNAL;
  }
  memset(cone, 0, sizeof(bool) * (size_t)(n + 1));
  int sp = 0, n_keys = 0;
  for (int i = 0; i < n; i++) {
    const ir_node *w = g->nodes[i];
    if (w->op == DSC_OP_WHERE && bool_scalar(w->in[0]) && !cone[w->in[0]->id])
      cone[w->in[0]->id] = true, stack[sp++] = w->in[0];
  }
  while (sp > 0) {
    ir_node *y = stack[--sp];
    keys[n_keys++] = (pass_fixed_key){y, -1.0 + 1e-9 * y->id}; /* in their order */
    for (int q = 0; q < y->n_in; q++) {
      ir_node *x = y->in[q];
      ir_cg_class c = ir_op(x->op)->cg;
      if (!cone[x->id] && dsc_type_numel(&x->type) == 1 && c != IR_CG_COLLECTIVE &&
          c != IR_CG_TIER)
        cone[x->id] = true, stack[sp++] = x;
    }
  }
  return n_keys > 0 ? pass_reorder(g, n, keys, n_keys) : DSC_OK;
}

/* What the reads of a node agree on: nothing yet, one guard, or always. */
enum { NEED_NONE, NEED_GUARD, NEED_ALWAYS };
typedef struct {
  int kind;
  ir_node *c;
  bool v;
} need;

static void meet(need *a, int kind, ir_node *c, bool v) {
  if (a->kind == NEED_ALWAYS) return;
  if (kind == NEED_ALWAYS || (a->kind == NEED_GUARD && (a->c != c || a->v != v))) {
    a->kind = NEED_ALWAYS;
    return;
  }
  a->kind = NEED_GUARD, a->c = c, a->v = v;
}

static dsc_status guard_graph(ir_graph *g) {
  dsc_status st = conditions_first(g);
  if (st != DSC_OK) return st;
  ir_module *m = g->module;
  int n = g->n_nodes;
  need *nd = ir_arena_alloc(&m->arena, sizeof(need) * (size_t)(n + 1));
  if (!nd) {
    ir_error(m->ctx, ir_no_loc, "guard: out of memory");
    return DSC_ERR_INTERNAL;
  }
  memset(nd, 0, sizeof(need) * (size_t)(n + 1));
  for (int k = 0; k < g->n_outputs; k++) nd[g->outputs[k]->id].kind = NEED_ALWAYS;
  for (int i = n - 1; i >= 0; i--) {
    ir_node *y = g->nodes[i];
    y->guard = NULL, y->guard_if = false;
    bool when = false;
    ir_node *c = NULL;
    if (y->op == DSC_OP_ASSIGN)
      c = (ir_node *)ir_guard_kept_state(y, &when);
    else if (ir_guard_may_skip(y->op) && nd[i].kind == NEED_GUARD)
      c = nd[i].c, when = nd[i].v;
    if (c && c->id < y->id && bool_scalar(c)) y->guard = c, y->guard_if = when;
    for (int q = 0; q < y->n_in; q++) {
      need *x = &nd[y->in[q]->id];
      if (y->op == DSC_OP_WHERE && q > 0 && bool_scalar(y->in[0]))
        meet(x, NEED_GUARD, (ir_node *)ir_guard_root(y->in[0]), q == 1);
      else
        meet(x, y->guard ? NEED_GUARD : NEED_ALWAYS, y->guard, y->guard_if);
    }
  }
  pass_guard_settle(g);
  return DSC_OK;
}

static void drop_guard(ir_node *n, bool *changed) {
  if (!n->guard) return;
  n->guard = NULL, n->guard_if = false, *changed = true;
}

void pass_guard_settle(ir_graph *g) {
  for (bool changed = true; changed;) {
    changed = false;
    for (int i = g->n_nodes - 1; i >= 0; i--) {
      ir_node *y = g->nodes[i];
      if (y->guard && (y->guard->id >= y->id || ir_guard_problem(y))) {
        drop_guard(y, &changed);
        continue;
      }
      for (int q = 0; q < y->n_in; q++)
        if (!ir_guard_read_ok(y->in[q], y)) drop_guard(y->in[q], &changed);
    }
    for (int k = 0; k < g->n_outputs; k++) drop_guard(g->outputs[k], &changed);
    /* a group's kernel runs whole: one member without the guard keeps all */
    for (int i = 0, end; i < g->n_nodes; i = end) {
      ir_node *a = g->nodes[i];
      bool same = true;
      for (end = i + 1; a->group > 0 && end < g->n_nodes && g->nodes[end]->group == a->group; end++)
        same = same && g->nodes[end]->guard == a->guard && g->nodes[end]->guard_if == a->guard_if;
      for (int k = i; !same && k < end; k++) drop_guard(g->nodes[k], &changed);
    }
  }
}

dsc_status pass_guard_run(ir_module *m) {
  for (int i = 0; i < m->n_graphs; i++) {
    dsc_status st = guard_graph(m->graphs[i]);
    if (st != DSC_OK) return st;
  }
  return DSC_OK;
}
