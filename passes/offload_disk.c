/* The disk tier's streaming (issue 7 item 2, ZeRO-Infinity; docs/memory.md
 * "Offload"): part of pass "offload" (pass_offload_disk_run) and of pass
 * "schedule" (pass_offload_schedule_run).
 *
 * pass_offload_disk_run rewrites, in every graph of the module, the reads
 * and writes of each disk-tier value (module meta tier.<name> = disk):
 *   - the readers of `param {name}` get `tier_read_wait(tier_read_start
 *     {name})`, placed right before the first reader. Readers far apart
 *     (more than READ_GAP nodes after the previous one: a param the forward
 *     and the backward both read, or a state read again by a later update)
 *     get a read of their own, so that the buffer is not held in between;
 *   - `assign {name}(x)` becomes `tier_write_wait(tier_write_start
 *     {name}(x))` at the assign's place.
 * The module meta "offload.io_threads" tells the executor how many IO
 * threads to run (cfg->offload.io_threads).
 *
 * pass_offload_schedule_run (after the collectives are scheduled) moves
 * the read starts early, as schedule.c prefetches all_gathers: walking the
 * graph, the next reads (in the order of their waits) start as soon as they
 * fit in cfg->offload.prefetch_bytes of reads in flight, never later than
 * right before their wait; and each write's wait moves to right after the
 * next write's start (the last one to the end), so that at most two writes
 * are in flight and each overlaps what follows it. */
#include <stdio.h>
#include <string.h>

#include "passes/passes.h"

#define READ_GAP 32 /* nodes between readers that one read still serves */

static dsc_status oom(ir_module *m) {
  ir_error(m->ctx, ir_no_loc, "offload: out of memory");
  return DSC_ERR_INTERNAL;
}

static bool on_disk(const ir_module *m, const char *name) {
  char key[600];
  if ((size_t)snprintf(key, sizeof key, "tier.%s", name) >= sizeof key) return false;
  const char *t = dsc_module_get_meta((ir_module *)m, key);
  return t && strcmp(t, "disk") == 0;
}

static bool is_disk_ref(const ir_module *m, const ir_node *x, dsc_op op) {
  if (x->op != op) return false;
  const char *name = ir_attr_str(x, "name");
  return name && on_disk(m, name);
}

/* One read (start + wait) for the readers of p at positions [from, to] of
 * the reader list (node indices; n_nodes stands for the graph outputs). */
static ir_node *new_read(ir_graph *g, const ir_node *p) {
  dsc_attr a = dsc_attr_str("name", ir_attr_str(p, "name"));
  dsc_graph_set_loc(g, p->loc);
  ir_node *s = dsc_build(g, DSC_OP_TIER_READ_START, NULL, 0, &a, 1);
  return s ? dsc_build(g, DSC_OP_TIER_READ_WAIT, &s, 1, NULL, 0) : NULL;
}

static dsc_status rewrite_graph(ir_module *m, ir_graph *g) {
  int n_orig = g->n_nodes;
  bool changed = false;
  int *readers = ir_arena_alloc(&m->arena, sizeof(int) * (size_t)(n_orig + 1));
  if (!readers) return oom(m);
  for (int i = 0; i < n_orig; i++) {
    ir_node *p = g->nodes[i];
    if (is_disk_ref(m, p, DSC_OP_ASSIGN)) {
      dsc_attr a = dsc_attr_str("name", ir_attr_str(p, "name"));
      dsc_graph_set_loc(g, p->loc);
      ir_node *x = p->in[0];
      ir_node *s = dsc_build(g, DSC_OP_TIER_WRITE_START, &x, 1, &a, 1);
      if (!s) return DSC_ERR_USER;
      /* the assign becomes the write's wait (same type, same place) */
      p->op = DSC_OP_TIER_WRITE_WAIT;
      p->in[0] = s;
      p->n_attrs = 0;
      p->attrs = NULL;
      changed = true;
      continue;
    }
    if (!is_disk_ref(m, p, DSC_OP_PARAM)) continue;
    int nr = 0;
    for (int j = i + 1; j < n_orig; j++)
      for (int q = 0; q < g->nodes[j]->n_in; q++)
        if (g->nodes[j]->in[q] == p) {
          readers[nr++] = j;
          break;
        }
    bool output = false;
    for (int k = 0; k < g->n_outputs; k++) output |= g->outputs[k] == p;
    ir_node *w = NULL;
    for (int r = 0; r < nr; r++) {
      if (!w || readers[r] - readers[r - 1] > READ_GAP) w = new_read(g, p);
      if (!w) return DSC_ERR_USER;
      ir_node *c = g->nodes[readers[r]];
      for (int q = 0; q < c->n_in; q++)
        if (c->in[q] == p) c->in[q] = w;
    }
    if (output) { /* an output of the value itself: a read at the end */
      ir_node *o = new_read(g, p);
      if (!o) return DSC_ERR_USER;
      for (int k = 0; k < g->n_outputs; k++)
        if (g->outputs[k] == p) g->outputs[k] = o;
    }
    changed |= nr > 0 || output;
  }
  /* new nodes go right before their first reader; the params now unread
   * are dropped */
  return changed ? pass_reorder(g, n_orig, NULL, 0) : DSC_OK;
}

dsc_status pass_offload_disk_run(ir_module *m, const dsc_train_config *cfg) {
  bool any = false;
  for (int i = 0; i < m->n_params && !any; i++) any = on_disk(m, m->params[i].name);
  if (!any) return DSC_OK;
  int64_t threads = cfg ? cfg->offload.io_threads : 4;
  if (threads < 1 || threads > 64) {
    ir_error(m->ctx, ir_no_loc, "offload: --offload-io-threads must be in [1, 64], got %lld",
             (long long)threads);
    return DSC_ERR_USER;
  }
  if (cfg && cfg->offload.prefetch_bytes < 0) {
    ir_error(m->ctx, ir_no_loc, "offload: --offload-prefetch-bytes must be >= 0, got %lld",
             (long long)cfg->offload.prefetch_bytes);
    return DSC_ERR_USER;
  }
  char v[32];
  snprintf(v, sizeof v, "%lld", (long long)threads);
  dsc_status st = dsc_module_set_meta(m, "offload.io_threads", v);
  for (int i = 0; st == DSC_OK && i < m->n_graphs; i++) st = rewrite_graph(m, m->graphs[i]);
  return st;
}

static int64_t bytes_of(const ir_node *x) {
  return dsc_type_numel(&x->type) * (int64_t)dsc_dtype_size(x->type.dtype);
}

static dsc_status schedule_graph(ir_module *m, ir_graph *g, int64_t budget) {
  int n = g->n_nodes;
  ir_node **wstart = ir_arena_alloc(&m->arena, sizeof(ir_node *) * (size_t)(n + 1));
  pass_fixed_key *fx = ir_arena_alloc(&m->arena, sizeof(pass_fixed_key) * (size_t)(n + 1));
  if (!wstart || !fx) return oom(m);
  int nfx = 0, nws = 0;
  /* reads in wait order: each start as early as the budget allows */
  int64_t inflight = 0;
  int next = 0; /* index of the next read wait not yet started */
  for (int i = 0; i < n; i++) {
    while (next < n) {
      while (next < n && g->nodes[next]->op != DSC_OP_TIER_READ_WAIT) next++;
      if (next >= n) break;
      ir_node *w = g->nodes[next];
      if (next != i && inflight + bytes_of(w) > budget) break;
      if (w->in[0]->id < i) { /* already before here (started by an earlier pass) */
        inflight += bytes_of(w);
        next++;
        continue;
      }
      fx[nfx++] = (pass_fixed_key){w->in[0], i - 0.5 + 1e-6 * nfx};
      inflight += bytes_of(w);
      next++;
    }
    if (g->nodes[i]->op == DSC_OP_TIER_READ_WAIT) inflight -= bytes_of(g->nodes[i]);
    if (g->nodes[i]->op == DSC_OP_TIER_WRITE_START) wstart[nws++] = g->nodes[i];
  }
  /* writes: each wait right after the next write's start, the last at the end */
  for (int k = 0; k < nws; k++) {
    ir_node *w = NULL;
    for (int i = wstart[k]->id + 1; i < n && !w; i++)
      if (g->nodes[i]->op == DSC_OP_TIER_WRITE_WAIT && g->nodes[i]->in[0] == wstart[k])
        w = g->nodes[i];
    if (!w) continue;
    double key = k + 1 < nws ? wstart[k + 1]->id + 0.5 : n + 1.0;
    if (key > w->id) fx[nfx++] = (pass_fixed_key){w, key + 1e-6 * k};
  }
  return nfx ? pass_reorder(g, n, fx, nfx) : DSC_OK;
}

dsc_status pass_offload_schedule_run(ir_module *m, const dsc_train_config *cfg) {
  int64_t budget = cfg ? cfg->offload.prefetch_bytes : 64 << 20;
  for (int gi = 0; gi < m->n_graphs; gi++) {
    ir_graph *g = m->graphs[gi];
    bool any = false;
    for (int i = 0; i < g->n_nodes && !any; i++) any = ir_op(g->nodes[i]->op)->cg == IR_CG_TIER;
    if (!any) continue;
    dsc_status st = schedule_graph(m, g, budget);
    if (st != DSC_OK) return st;
  }
  return DSC_OK;
}
