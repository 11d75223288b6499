/* Host-side work (issue 7 items 2 and 3; docs/memory.md "Offload"): the
 * ZeRO-Offload optimizer step on the host, and activation offload.
 *
 * Both are placement plus copies: a node placed on the host (ir_node.place
 * = IR_PLACE_HOST, printed ` host`) keeps its value in host memory (the
 * code generator's host work arena), and values cross between the tiers
 * only through to_host / to_device (include/dsc/ops.def). The interpreter
 * ignores placement and the copies are copies, so the numbers are the
 * same as without; what changes is the device's memory.
 *
 * The optimizer step (pass_offload_host_run, from pass "offload" with
 * --offload-optimizer host). In graph "train_step", the update region is
 * the nodes that feed an assign (or an output other than the loss) and do
 * not feed the loss or a gradient (role IR_ROLE_GRAD: the averaged, or at
 * ZeRO stages 1-3 the reduce-scattered, gradients). Of that region a node
 * goes to the host when it reads a gradient, a host-tier value or a host
 * node (forward), or
 * when every reader is a host node or an assign to a value that lives off
 * the device (backward: the bias corrections, lr * weight_decay); sources,
 * collectives and disk tier transfers never do. Then every edge from the
 * device into a host node gets one to_host per value (a gradient's right
 * after the gradient, so its device buffer dies during the backward), and
 * every edge from a host node to the device (an assign to a device param,
 * an all_gather of updated shards) one to_device per value, which the
 * lowering writes straight into the param (codegen/lower.c
 * inplace_transfers). Host-tier and disk-tier values (tier.<name>: the
 * optimizer states, offloaded param shards) are read and assigned in place.
 * Nodes of role IR_ROLE_DEVICE_STEP (ZenFlow's selective update, made by
 * the optimizer pass) stay on the device whatever they read, and go as
 * early as their inputs allow, so that each gradient's selected rows are
 * gathered right after it.
 *
 * Activation offload (pass_act_offload_*, used by passes/remat.c's policy
 * "offload"): a forward value the backward reads goes to the host with
 * to_host right after its last forward reader and comes back with one
 * to_device right before its first backward reader; views are re-applied
 * on the copy (remat recomputes them), so only values with buffers move. */
#include <stdio.h>
#include <string.h>

#include "passes/passes.h"

static bool is_source(const ir_node *x) {
  return x->op == DSC_OP_INPUT || x->op == DSC_OP_PARAM || x->op == DSC_OP_CONST ||
         x->op == DSC_OP_IOTA;
}

/* A device-only op: communication, disk transfers, the copies themselves. */
static bool device_only(const ir_node *x) {
  ir_cg_class c = ir_op(x->op)->cg;
  return c == IR_CG_COLLECTIVE || c == IR_CG_TIER || x->op == DSC_OP_TO_HOST ||
         x->op == DSC_OP_TO_DEVICE || x->op == DSC_OP_ASSIGN;
}

/* The tier (module meta tier.<name>: "host", "disk") of the value a param
 * read or an assign names; NULL when it lives on the device. */
static const char *tier_of(const ir_module *m, const char *name) {
  char key[600];
  if (!name || (size_t)snprintf(key, sizeof key, "tier.%s", name) >= sizeof key) return NULL;
  return dsc_module_get_meta(m, key);
}

static bool off_device(const ir_module *m, const char *name) { return tier_of(m, name) != NULL; }

/* A read of a value the host tier holds (an optimizer state): the update
 * computes where its operands live. Without it an update that reads no
 * gradient (the delayed update's, which applies the stored one) stayed on
 * the device, reading the host's states across the link. */
static bool on_host_tier(const ir_module *m, const ir_node *x) {
  const char *t = x->op == DSC_OP_PARAM ? tier_of(m, ir_attr_str(x, "name")) : NULL;
  return t && strcmp(t, "host") == 0;
}

static ir_node *transfer(ir_graph *g, dsc_op op, ir_node *x) {
  dsc_loc saved = g->cur_loc;
  g->cur_loc = x->loc;
  ir_node *c = ir_node_new_raw(g, op, x->type, &x, 1, NULL, 0);
  g->cur_loc = saved;
  if (c) c->place = op == DSC_OP_TO_HOST ? IR_PLACE_HOST : IR_PLACE_DEVICE;
  return c;
}

/* Marks the ancestors of x (x included) in mark[]. */
static void mark_ancestors(ir_node *x, bool *mark, ir_node **stack) {
  if (mark[x->id]) return;
  int sp = 0;
  mark[x->id] = true, stack[sp++] = x;
  while (sp > 0) {
    ir_node *y = stack[--sp];
    for (int q = 0; q < y->n_in; q++)
      if (!mark[y->in[q]->id]) mark[y->in[q]->id] = true, stack[sp++] = y->in[q];
  }
}

/* With overlap: an updated param comes back (its to_device, which the
 * lowering writes straight into the param) as soon as both its host update
 * is placed and the device's last read of the param (through views) is
 * done, so that the copies go beside the rest of the backward instead of
 * all after it. Only for a to_device whose one reader is the param's
 * assign; the others (ZenFlow's combine) stay before their reader. */
static bool return_early(ir_graph *g, int n, const bool *host, const double *asap,
                         ir_node *const *td, pass_fixed_key *keys, int *n_keys) {
  ir_module *m = g->module;
  int *last = ir_arena_alloc(&m->arena, sizeof(int) * (size_t)(n + 1));
  int *readers = ir_arena_alloc(&m->arena, sizeof(int) * (size_t)(g->n_nodes + 1));
  int *param_last = ir_arena_alloc(&m->arena, sizeof(int) * (size_t)(m->n_params + 1));
  if (!last || !readers || !param_last) return false;
  memset(readers, 0, sizeof(int) * (size_t)(g->n_nodes + 1));
  for (int i = 0; i < g->n_nodes; i++)
    for (int q = 0; q < g->nodes[i]->n_in; q++) readers[g->nodes[i]->in[q]->id]++;
  /* last[i]: the last original node reading node i's bytes (views see
   * through); consumers come later, so one pass from the end */
  for (int i = 0; i < n; i++) last[i] = -1;
  for (int i = n - 1; i >= 0; i--) {
    const ir_node *c = g->nodes[i];
    int at = pass_is_view(c) && last[i] > i ? last[i] : i;
    if (host[i]) at = n; /* moved: not a fixed place */
    for (int q = 0; q < c->n_in; q++) {
      int x = c->in[q]->id;
      if (x < n && at > last[x]) last[x] = at;
    }
  }
  /* per param: the last read of any of its param nodes */
  for (int k = 0; k < m->n_params; k++) param_last[k] = -1;
  for (int j = 0; j < n; j++) {
    const ir_node *r = g->nodes[j];
    int k = r->op == DSC_OP_PARAM ? dsc_module_find_param(m, ir_attr_str(r, "name")) : -1;
    if (k >= 0 && last[j] > param_last[k]) param_last[k] = last[j];
  }
  for (int i = 0; i < n; i++) {
    const ir_node *a = g->nodes[i];
    if (a->op != DSC_OP_ASSIGN || a->in[0]->op != DSC_OP_TO_DEVICE) continue;
    ir_node *d = a->in[0];
    const ir_node *src = d->in[0];
    if (d->id < n || readers[d->id] != 1 || src->id >= n || !host[src->id] || td[src->id] != d)
      continue;
    int k = dsc_module_find_param(m, ir_attr_str(a, "name"));
    double at = asap[src->id];
    if (k >= 0 && param_last[k] > at) at = param_last[k];
    if (at >= n) continue; /* read to the end: stays before the assign */
    keys[(*n_keys)++] = (pass_fixed_key){d, at + 0.5};
  }
  return true;
}

dsc_status pass_offload_host_run(ir_module *m, const dsc_train_config *cfg) {
  IR_UNUSED(cfg);
  ir_graph *g = dsc_module_find_graph(m, "train_step");
  if (!g || g->n_outputs < 1) return DSC_OK;
  int n = g->n_nodes;
  ir_arena *a = &m->arena;
  size_t nb = sizeof(bool) * (size_t)(n + 1);
  bool *dev = ir_arena_alloc(a, nb), *need = ir_arena_alloc(a, nb), *host = ir_arena_alloc(a, nb);
  bool *elig = ir_arena_alloc(a, nb);
  ir_node **stack = ir_arena_alloc(a, sizeof(ir_node *) * (size_t)(n + 1));
  ir_node **th = ir_arena_alloc(a, sizeof(ir_node *) * (size_t)(n + 1)); /* to_host per value */
  ir_node **td = ir_arena_alloc(a, sizeof(ir_node *) * (size_t)(n + 1)); /* to_device per value */
  pass_fixed_key *keys = ir_arena_alloc(a, sizeof(pass_fixed_key) * (size_t)(4 * n + 1));
  if (!dev || !need || !host || !elig || !stack || !th || !td || !keys) goto oom;
  memset(dev, 0, nb), memset(need, 0, nb), memset(host, 0, nb), memset(elig, 0, nb);
  memset(th, 0, sizeof(ir_node *) * (size_t)(n + 1));
  memset(td, 0, sizeof(ir_node *) * (size_t)(n + 1));
  /* the device's part: the loss and the gradients with what they need */
  mark_ancestors(g->outputs[0], dev, stack);
  for (int i = 0; i < n; i++)
    if (g->nodes[i]->role == IR_ROLE_GRAD) mark_ancestors(g->nodes[i], dev, stack);
  /* the update region: what the assigns and the other outputs need */
  for (int i = 0; i < n; i++)
    if (g->nodes[i]->op == DSC_OP_ASSIGN) mark_ancestors(g->nodes[i]->in[0], need, stack);
  for (int k = 1; k < g->n_outputs; k++) mark_ancestors(g->outputs[k], need, stack);
  int n_host = 0;
  for (int i = 0; i < n; i++) {
    ir_node *x = g->nodes[i];
    elig[i] =
        need[i] && !dev[i] && !is_source(x) && !device_only(x) && x->role != IR_ROLE_DEVICE_STEP;
  }
  /* forward: readers of gradients and of host values; backward: values
   * only host nodes (or off-device assigns) read. Until nothing changes. */
  int *readers = ir_arena_alloc(a, sizeof(int) * (size_t)(n + 1));
  bool *all_host = ir_arena_alloc(a, nb);
  if (!readers || !all_host) goto oom;
  for (bool changed = true; changed;) {
    changed = false;
    for (int i = 0; i < n; i++) {
      ir_node *x = g->nodes[i];
      if (!elig[i] || host[i]) continue;
      for (int q = 0; q < x->n_in; q++)
        if (x->in[q]->role == IR_ROLE_GRAD || host[x->in[q]->id] || on_host_tier(m, x->in[q])) {
          host[i] = true, changed = true, n_host++;
          break;
        }
    }
    memset(readers, 0, sizeof(int) * (size_t)(n + 1));
    for (int i = 0; i < n; i++) all_host[i] = true;
    for (int i = 0; i < n; i++) {
      ir_node *c = g->nodes[i];
      bool h = host[i] || (c->op == DSC_OP_ASSIGN && off_device(m, ir_attr_str(c, "name")));
      for (int q = 0; q < c->n_in; q++) {
        readers[c->in[q]->id]++;
        if (!h) all_host[c->in[q]->id] = false;
      }
    }
    for (int k = 0; k < g->n_outputs; k++) all_host[g->outputs[k]->id] = false;
    for (int i = n - 1; i >= 0; i--)
      if (elig[i] && !host[i] && readers[i] > 0 && all_host[i])
        host[i] = true, changed = true, n_host++;
  }
  if (n_host == 0) return DSC_OK;
  /* the copies */
  int n_keys = 0;
  for (int i = 0; i < n; i++) {
    ir_node *c = g->nodes[i];
    bool c_host = host[i];
    bool c_off = c->op == DSC_OP_ASSIGN && off_device(m, ir_attr_str(c, "name"));
    for (int q = 0; q < c->n_in; q++) {
      ir_node *x = c->in[q];
      if (c_host && !host[x->id]) {
        /* device -> host, unless x needs no copy: constants (inlined),
         * values that live off the device */
        if (x->op == DSC_OP_CONST || x->op == DSC_OP_IOTA ||
            (x->op == DSC_OP_PARAM && off_device(m, ir_attr_str(x, "name"))))
          continue;
        if (!th[x->id]) {
          if (!(th[x->id] = transfer(g, DSC_OP_TO_HOST, x))) goto oom;
          if (x->role == IR_ROLE_GRAD) /* copied out as soon as it is final */
            keys[n_keys++] = (pass_fixed_key){th[x->id], x->id + 0.5};
        }
        c->in[q] = th[x->id];
      } else if (!c_host && !c_off && host[x->id]) { /* host -> device */
        if (!td[x->id] && !(td[x->id] = transfer(g, DSC_OP_TO_DEVICE, x))) goto oom;
        c->in[q] = td[x->id];
      }
    }
  }
  for (int i = 0; i < n; i++)
    if (host[i]) g->nodes[i]->place = IR_PLACE_HOST;
  /* As early as their inputs allow: the device's part of the update
   * (ZenFlow), so that the selected rows of each gradient are gathered
   * right after it and the whole gradient dies with its to_host, as
   * without it; and, when the host's work overlaps the device's
   * (meta offload.overlap), the host nodes, so that each param's host
   * update starts as soon as its gradient is on the host, while the
   * backward goes on. */
  bool overlap = dsc_module_get_meta(m, "offload.overlap") != NULL;
  double *asap = ir_arena_alloc(a, sizeof(double) * (size_t)(n + 1));
  bool *front = ir_arena_alloc(a, nb);
  if (!asap || !front) goto oom;
  memset(front, 0, nb);
  for (int i = 0; i < n; i++) {
    ir_node *x = g->nodes[i];
    bool device_step = x->role == IR_ROLE_DEVICE_STEP;
    if (!device_step && !(overlap && host[i])) continue;
    double at = -1;
    for (int q = 0; q < x->n_in; q++) {
      const ir_node *y = x->in[q];
      bool back = y->op == DSC_OP_TO_DEVICE;
      /* a copy made here follows its source */
      if (y->id >= n && y->n_in == 1 && y->in[0]->id < n) y = y->in[0];
      bool moved = y->id < n && (y->role == IR_ROLE_DEVICE_STEP || (overlap && host[y->id]));
      double ky = y->id >= n  ? (double)n
                  : moved     ? asap[y->id]
                  : is_source(y) ? -1
                                 : (double)y->id;
      /* a host update read back: without overlap each param's comes back
       * and is combined before the next one's (one at a time); with it,
       * after the backward, which the host stream's work goes beside */
      if (back && overlap) ky = (double)n;
      if (ky > at) at = ky;
      /* a source keeps its place unless moved too: to the front, where
       * the reader may go (a param or constant costs nothing there) */
      if (y->id < n && is_source(y) && !front[y->id]) {
        front[y->id] = true;
        keys[n_keys++] = (pass_fixed_key){(ir_node *)y, -1};
      }
    }
    asap[i] = at;
    keys[n_keys++] = (pass_fixed_key){x, at + 0.5};
  }
  if (overlap && !return_early(g, n, host, asap, td, keys, &n_keys)) goto oom;
  return pass_reorder(g, n, keys, n_keys);
oom:
  ir_error(m->ctx, ir_no_loc, "offload: out of memory");
  return DSC_ERR_INTERNAL;
}

/* ------------------------------------------------------------ activation offload */

struct pass_act_offload {
  ir_graph *g;
  int n;          /* nodes when it was made (the forward and backward) */
  const bool *fwd;
  int *last_fwd;  /* per node: its last forward reader (-1: none) */
  bool *movable;  /* per node: a forward value with a buffer worth moving */
  ir_node **dev;  /* per node: its to_device(to_host(x)), built on demand */
  pass_fixed_key *keys;
  int n_keys;
};

pass_act_offload *pass_act_offload_new(ir_graph *g, const bool *fwd) {
  ir_module *m = g->module;
  ir_arena *a = &m->arena;
  int n = g->n_nodes;
  pass_act_offload *s = ir_arena_alloc(a, sizeof *s);
  bool *konst = ir_arena_alloc(a, sizeof(bool) * (size_t)(n + 1));
  if (!s || !konst) return NULL;
  s->g = g, s->n = n, s->fwd = fwd, s->n_keys = 0;
  s->last_fwd = ir_arena_alloc(a, sizeof(int) * (size_t)(n + 1));
  s->movable = ir_arena_alloc(a, sizeof(bool) * (size_t)(n + 1));
  s->dev = ir_arena_alloc(a, sizeof(ir_node *) * (size_t)(n + 1));
  s->keys = ir_arena_alloc(a, sizeof(pass_fixed_key) * (size_t)(n + 1));
  if (!s->last_fwd || !s->movable || !s->dev || !s->keys) return NULL;
  memset(s->dev, 0, sizeof(ir_node *) * (size_t)(n + 1));
  for (int i = 0; i < n; i++) {
    ir_node *x = g->nodes[i];
    s->last_fwd[i] = -1;
    /* values of constants only (masks, index grids) are recomputed where
     * read: they have no buffer to move */
    bool k = x->op == DSC_OP_CONST || x->op == DSC_OP_IOTA;
    if (!k && x->n_in > 0 && ir_op(x->op)->cg != IR_CG_COLLECTIVE) {
      k = true;
      for (int q = 0; q < x->n_in; q++) k = k && konst[x->in[q]->id];
    }
    konst[i] = k;
    s->movable[i] = fwd[i] && !is_source(x) && !k && !pass_is_view(x) &&
                    !device_only(x) && dsc_type_numel(&x->type) > 1;
    for (int q = 0; q < x->n_in; q++)
      if (fwd[i] && i > s->last_fwd[x->in[q]->id]) s->last_fwd[x->in[q]->id] = i;
  }
  return s;
}

ir_node *pass_act_offload_ref(pass_act_offload *s, ir_node *x) {
  if (x->id >= s->n || !s->movable[x->id]) return x;
  if (s->dev[x->id]) return s->dev[x->id];
  ir_node *h = transfer(s->g, DSC_OP_TO_HOST, x);
  ir_node *d = h ? transfer(s->g, DSC_OP_TO_DEVICE, h) : NULL;
  if (!d) return NULL;
  /* out right after the forward's last read; back (placed by the reorder)
   * right before the backward's first */
  int after = s->last_fwd[x->id] > x->id ? s->last_fwd[x->id] : x->id;
  s->keys[s->n_keys++] = (pass_fixed_key){h, after + 0.5};
  return s->dev[x->id] = d;
}

const pass_fixed_key *pass_act_offload_keys(const pass_act_offload *s, int *n) {
  *n = s->n_keys;
  return s->keys;
}
