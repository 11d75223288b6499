/* Reverse-mode automatic differentiation over the IR.
 *
 * 1. active: float nodes that depend on a param through float values only
 *    (integers and bools are piecewise constant, so they cut the path).
 * 2. needed: active nodes on a path to the loss (reverse sweep).
 * 3. every needed op must have a gradient rule; all missing ones are
 *    reported before anything is built.
 * 4. reverse topological sweep from the loss, seeded with d loss = 1: each
 *    needed node's rule turns its accumulated gradient into gradients for
 *    its active inputs; a value used several times accumulates with add.
 * 5. param gradients are summed over every `param` node reading a param and
 *    become outputs 1.. in module param order; unused ones are zero consts.
 * 6. backward nodes that no output uses (gradients a rule produced for an
 *    inactive input) are dropped, so the printed IR shows only what runs.
 * Backward nodes carry the source location of the forward node they
 * differentiate, so later diagnostics point at the model text. */
#include <string.h>

#include "passes/passes.h"

typedef struct {
  ir_module *m;
  ir_graph *g;
  int n0;          /* node count before the pass: forward nodes */
  bool *active;    /* [n0] */
  bool *needed;    /* [n0] */
  ir_node **grad;  /* [n0] accumulated gradient of each forward node */
  ir_node **pgrad; /* [n_params] */
} ad_state;

static dsc_loc loc_or_none(const ir_node *n) { return n ? n->loc : ir_no_loc; }

static bool is_zero_const(const ir_node *n) {
  return n->op == DSC_OP_CONST && ir_attr_float(n, "value") == 0.0;
}

/* A concat's parts along its axis as [begin, end) intervals. */
typedef struct {
  int64_t begin, end;
  ir_node *part; /* NULL: zeros */
} ad_segment;

#define AD_MAX_SEGMENTS 16

static int concat_segments(const ir_node *n, ad_segment *seg) {
  int64_t axis = ir_attr_int(n, "axis"), off = 0;
  if (n->n_in > AD_MAX_SEGMENTS) return -1;
  for (int i = 0; i < n->n_in; i++) {
    int64_t len = n->in[i]->type.dims[axis];
    seg[i] = (ad_segment){off, off + len, is_zero_const(n->in[i]) ? NULL : n->in[i]};
    off += len;
  }
  return n->n_in;
}

/* Whether [b, e) lies inside one zero segment. */
static bool inside_zeros(const ad_segment *seg, int n, int64_t b, int64_t e) {
  for (int i = 0; i < n; i++)
    if (!seg[i].part && seg[i].begin <= b && e <= seg[i].end) return true;
  return false;
}

/* The gradient of a slice is the slice's gradient padded with zeros
 * (ir_grad_slice), so a value split into slices (GPT's fused qkv) would
 * accumulate as zero-filled buffers added together. When both gradients
 * are concats along one axis whose non-zero parts fall into the other's
 * zeros, their sum is the concat of all non-zero parts: built here
 * directly, with zeros only in the gaps. Exact, since x + 0 = x. Returns
 * NULL when the shapes do not have that form (then add as usual). */
static ir_node *merge_padded(ir_graph *g, ir_node *a, ir_node *b) {
  if (a->op != DSC_OP_CONCAT || b->op != DSC_OP_CONCAT) return NULL;
  int64_t axis = ir_attr_int(a, "axis");
  if (ir_attr_int(b, "axis") != axis) return NULL;
  ad_segment sa[AD_MAX_SEGMENTS], sb[AD_MAX_SEGMENTS], out[2 * AD_MAX_SEGMENTS];
  int na = concat_segments(a, sa), nb = concat_segments(b, sb);
  if (na < 0 || nb < 0) return NULL;
  for (int i = 0; i < na; i++)
    if (sa[i].part && !inside_zeros(sb, nb, sa[i].begin, sa[i].end)) return NULL;
  for (int i = 0; i < nb; i++)
    if (sb[i].part && !inside_zeros(sa, na, sb[i].begin, sb[i].end)) return NULL;
  /* Non-zero parts of both, in axis order (disjoint, by the checks above). */
  int n = 0;
  for (int ia = 0, ib = 0; ia < na || ib < nb;) {
    bool take_a = ib >= nb || (ia < na && sa[ia].begin < sb[ib].begin);
    ad_segment s = take_a ? sa[ia++] : sb[ib++];
    if (s.part) out[n++] = s;
  }
  ir_node *parts[4 * AD_MAX_SEGMENTS + 1];
  int np = 0;
  int64_t at = 0, total = a->type.dims[axis];
  for (int i = 0; i <= n; i++) {
    int64_t next = i < n ? out[i].begin : total;
    if (next > at) { /* a gap: zeros */
      dsc_type t = a->type;
      t.dims[axis] = next - at;
      if (!(parts[np++] = dsc_const(g, 0.0, t))) return NULL;
    }
    if (i < n) {
      parts[np++] = out[i].part;
      at = out[i].end;
    }
  }
  dsc_attr at_axis = dsc_attr_int("axis", axis);
  return dsc_build(g, DSC_OP_CONCAT, parts, np, &at_axis, 1);
}

/* Adds dx into *slot (sum of gradients of a value used several times). */
static bool accumulate(ir_graph *g, ir_node **slot, ir_node *dx) {
  ir_node *merged = *slot ? merge_padded(g, *slot, dx) : NULL;
  *slot = merged ? merged : *slot ? dsc_binary(g, DSC_OP_ADD, *slot, dx) : dx;
  return *slot != NULL;
}

static void type_str(const dsc_type *t, char *buf, size_t n) { dsc_type_format(t, buf, n); }

/* Runs n's rule and accumulates the results into its active inputs. */
static bool backprop_node(ad_state *s, const ir_grad_fn *rules, ir_node *n) {
  dsc_context *ctx = s->m->ctx;
  ir_node *dx_small[4] = {NULL}, **dx = dx_small;
  if (n->n_in > 4) {
    dx = ir_arena_alloc(&s->m->arena, sizeof(ir_node *) * (size_t)n->n_in);
    if (!dx) {
      ir_error(ctx, n->loc, "out of memory while building the IR");
      return false;
    }
  }
  if (!rules[n->op](s->g, n, s->grad[n->id], dx)) {
    ir_error(ctx, n->loc, "autodiff: could not build the gradient of '%s' (node %%%d)",
             dsc_op_name(n->op), n->id);
    return false;
  }
  for (int i = 0; i < n->n_in; i++) {
    ir_node *in = n->in[i];
    if (!s->active[in->id]) continue;
    if (!dx[i]) {
      ir_error(ctx, n->loc,
               "autodiff: the gradient rule of '%s' gave no gradient for input %d (node %%%d)",
               dsc_op_name(n->op), i, in->id);
      return false;
    }
    if (!dsc_type_equal(&dx[i]->type, &in->type)) {
      char a[128], b[128];
      type_str(&dx[i]->type, a, sizeof a);
      type_str(&in->type, b, sizeof b);
      ir_error(ctx, n->loc, "autodiff: the gradient rule of '%s' gave %s for input %d of type %s",
               dsc_op_name(n->op), a, i, b);
      return false;
    }
    if (!accumulate(s->g, &s->grad[in->id], dx[i])) return false;
  }
  return true;
}

/* Drops backward nodes (ids >= n0) that no graph output uses. */
static bool drop_dead(ad_state *s) {
  ir_graph *g = s->g;
  dsc_context *ctx = s->m->ctx;
  size_t sz = sizeof(bool) * (size_t)g->n_nodes;
  bool *live = ir_alloc(ctx, sz ? sz : 1);
  if (!live) {
    ir_error(ctx, ir_no_loc, "out of memory in autodiff");
    return false;
  }
  memset(live, 0, sz);
  for (int i = 0; i < g->n_outputs; i++) live[g->outputs[i]->id] = true;
  for (int i = g->n_nodes - 1; i >= s->n0; i--)
    if (live[i])
      for (int j = 0; j < g->nodes[i]->n_in; j++) live[g->nodes[i]->in[j]->id] = true;
  int k = s->n0;
  for (int i = s->n0; i < g->n_nodes; i++)
    if (live[i]) {
      g->nodes[k] = g->nodes[i];
      g->nodes[k]->id = k;
      k++;
    }
  g->n_nodes = k;
  ir_free(ctx, live, sz ? sz : 1);
  return true;
}

static bool check_loss(ir_module *m, ir_graph *g) {
  if (g->n_outputs != 1) {
    ir_error(m->ctx, ir_no_loc,
             "autodiff: graph '%s' must have exactly one output (the loss), it has %d", g->name,
             g->n_outputs);
    return false;
  }
  ir_node *loss = g->outputs[0];
  if (loss->type.rank != 0 || !dsc_dtype_is_float(loss->type.dtype)) {
    char t[128];
    type_str(&loss->type, t, sizeof t);
    ir_error(m->ctx, loc_or_none(loss),
             "autodiff: the loss of graph '%s' must be a rank-0 float tensor, got %s", g->name, t);
    return false;
  }
  return true;
}

/* Marks active and needed nodes; reports every needed op without a rule. */
static bool analyse(ad_state *s, const ir_grad_fn *rules, ir_node *loss) {
  ir_graph *g = s->g;
  for (int i = 0; i < s->n0; i++) {
    ir_node *n = g->nodes[i];
    bool act = false;
    if (dsc_dtype_is_float(n->type.dtype)) {
      if (n->op == DSC_OP_PARAM) {
        const ir_param *pp = ir_module_param(s->m, ir_attr_str(n, "name"));
        act = pp && !pp->state; /* states (optimizer moments) are not differentiated */
      }
      for (int j = 0; !act && j < n->n_in; j++) act = s->active[n->in[j]->id];
    }
    s->active[i] = act;
  }
  if (s->active[loss->id]) s->needed[loss->id] = true;
  for (int i = loss->id; i >= 0; i--) {
    ir_node *n = g->nodes[i];
    if (!s->needed[i]) continue;
    for (int j = 0; j < n->n_in; j++)
      if (s->active[n->in[j]->id]) s->needed[n->in[j]->id] = true;
  }
  bool ok = true;
  for (int i = 0; i <= loss->id; i++) {
    ir_node *n = g->nodes[i];
    if (!s->needed[i] || n->op == DSC_OP_PARAM || rules[n->op]) continue;
    ir_error(s->m->ctx, n->loc,
             "autodiff: op '%s' (node %%%d) has no gradient rule, but the loss of graph '%s' "
             "depends on a parameter through it",
             dsc_op_name(n->op), n->id, g->name);
    ok = false;
  }
  return ok;
}

static bool sweep(ad_state *s, const ir_grad_fn *rules, ir_node *loss) {
  ir_graph *g = s->g;
  ir_module *m = s->m;
  if (s->needed[loss->id]) {
    g->cur_loc = loss->loc;
    dsc_type one = loss->type;
    if (!(s->grad[loss->id] = dsc_const(g, 1.0, one))) return false;
  }
  for (int i = loss->id; i >= 0; i--) {
    ir_node *n = g->nodes[i];
    if (!s->needed[i] || !s->grad[i]) continue;
    g->cur_loc = n->loc;
    if (n->op == DSC_OP_PARAM) {
      int p = dsc_module_find_param(m, ir_attr_str(n, "name"));
      if (p < 0) {
        ir_error(m->ctx, n->loc, "autodiff: unknown parameter '%s'", ir_attr_str(n, "name"));
        return false;
      }
      if (!accumulate(g, &s->pgrad[p], s->grad[i])) return false;
      continue;
    }
    if (!backprop_node(s, rules, n)) return false;
  }
  /* Zero gradients for params the loss does not depend on. */
  g->cur_loc = loss->loc;
  for (int p = 0; p < m->n_params; p++) {
    if (s->pgrad[p] || m->params[p].state) continue;
    const ir_param *pp = &m->params[p];
    if (dsc_dtype_is_float(pp->type.dtype))
      ir_diag(m->ctx, DSC_DIAG_WARNING, ir_no_loc,
              "autodiff: the loss of graph '%s' does not depend on parameter '%s'; its gradient "
              "is zero",
              g->name, pp->name);
    else
      ir_diag(m->ctx, DSC_DIAG_WARNING, ir_no_loc,
              "autodiff: parameter '%s' is not a float tensor; its gradient is zero", pp->name);
    if (!(s->pgrad[p] = dsc_const(g, 0.0, pp->type))) return false;
  }
  return true;
}

dsc_status pass_autodiff_run_with_rules(ir_module *m, ir_graph *g, const ir_grad_fn *rules) {
  dsc_context *ctx = m->ctx;
  if (!g || g->module != m) {
    ir_error(ctx, ir_no_loc, "autodiff: the graph does not belong to module '%s'", m->name);
    return DSC_ERR_USER;
  }
  if (!check_loss(m, g)) return DSC_ERR_USER;
  ir_node *loss = g->outputs[0];
  ad_state s = {.m = m, .g = g, .n0 = g->n_nodes};
  size_t nb = (size_t)s.n0 + 1, np = (size_t)m->n_params + 1;
  s.active = ir_alloc(ctx, sizeof(bool) * nb);
  s.needed = ir_alloc(ctx, sizeof(bool) * nb);
  s.grad = ir_alloc(ctx, sizeof(ir_node *) * nb);
  s.pgrad = ir_alloc(ctx, sizeof(ir_node *) * np);
  dsc_status st = DSC_OK;
  if (!s.active || !s.needed || !s.grad || !s.pgrad) {
    ir_error(ctx, ir_no_loc, "out of memory in autodiff");
    st = DSC_ERR_INTERNAL;
    goto done;
  }
  memset(s.active, 0, sizeof(bool) * nb);
  memset(s.needed, 0, sizeof(bool) * nb);
  memset(s.grad, 0, sizeof(ir_node *) * nb);
  memset(s.pgrad, 0, sizeof(ir_node *) * np);
  if (!analyse(&s, rules, loss)) {
    st = DSC_ERR_USER;
    goto done;
  }
  dsc_loc saved = g->cur_loc;
  ir_node **old_outs = g->outputs;
  bool ok = sweep(&s, rules, loss);
  g->cur_loc = saved;
  if (ok) {
    ir_node **outs = ir_alloc(ctx, sizeof(ir_node *) * np);
    if (!outs) {
      ir_error(ctx, ir_no_loc, "out of memory in autodiff");
      ok = false;
    } else {
      /* [loss, gradient of each trainable param in module order] */
      int n_out = 0;
      outs[n_out++] = loss;
      for (int p = 0; p < m->n_params; p++)
        if (!m->params[p].state) outs[n_out++] = s.pgrad[p];
      ok = dsc_graph_set_outputs(g, outs, n_out) == DSC_OK && drop_dead(&s);
      ir_free(ctx, outs, sizeof(ir_node *) * np);
    }
  }
  if (!ok) {
    /* Leave the graph as it was: the new nodes stay in the arena, unused. */
    g->n_nodes = s.n0;
    g->outputs = old_outs;
    g->n_outputs = 1;
    st = DSC_ERR_INTERNAL;
  }
done:
  ir_free(ctx, s.active, sizeof(bool) * nb);
  ir_free(ctx, s.needed, sizeof(bool) * nb);
  ir_free(ctx, s.grad, sizeof(ir_node *) * nb);
  ir_free(ctx, s.pgrad, sizeof(ir_node *) * np);
  return st;
}

dsc_status pass_autodiff_run(ir_module *m, ir_graph *g) {
  return pass_autodiff_run_with_rules(m, g, ir_grad_rules());
}

dsc_status dsc_autodiff(dsc_module *m, const char *graph_name) {
  if (!m) return DSC_ERR_USER;
  ir_graph *g = graph_name ? dsc_module_find_graph(m, graph_name) : NULL;
  if (!g) {
    ir_error(m->ctx, ir_no_loc, "autodiff: module '%s' has no graph named '%s'", m->name,
             graph_name ? graph_name : "(null)");
    return DSC_ERR_USER;
  }
  return pass_autodiff_run(m, g);
}
