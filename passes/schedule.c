/* The schedule pass: where the collectives of graph "train_step" start and
 * wait (DeepSpeed's overlap_comm, DeepCompile's proactive prefetching).
 * The zero pass leaves each collective's wait right before the first reader
 * of its result; this pass
 * - merges reduce_scatters (stages 2-3: one per gradient, started right
 *   after it) into buckets of at most cfg->zero.bucket_bytes: fewer, larger
 *   messages. A bucket lays its members out rank-major ([world, S_1 + ... +
 *   S_k], each member's [world, S_i] side by side) so that the rank's chunk
 *   of the bucket is its chunk of every member, and it starts when its last
 *   member's gradient is computed. The sums are the same element by
 *   element, so results do not change.
 * - completes each gradient reduction while the backward goes on: its wait
 *   right after the next reduction's start, which frees the sent gradient;
 * - starts all_gathers early (prefetch): walking the graph, the next
 *   gathers (in the order of their waits) start as soon as they fit in
 *   cfg->zero.prefetch_bytes of gathers in flight; so while one layer
 *   computes, the next layer's params arrive.
 * The persistence threshold (small params never sharded at stage 3) is the
 * zero pass's decision. Nothing happens at world 1. */
#include <string.h>

#include "passes/passes.h"

typedef struct {
  ir_node *start, *wait;
} sched_pair;

static dsc_status oom(ir_module *m) {
  ir_error(m->ctx, ir_no_loc, "schedule: out of memory");
  return DSC_ERR_INTERNAL;
}

/* The collectives of kind `start_op` with their waits, in start order; not
 * the model's own (tensor parallelism's all_reduces: each is read right
 * away, and they stay where they are). */
static int find_pairs(ir_module *m, ir_graph *g, dsc_op start_op, dsc_op wait_op,
                      sched_pair **out) {
  sched_pair *p = ir_arena_alloc(&m->arena, sizeof(sched_pair) * (size_t)(g->n_nodes + 1));
  int *pos = ir_arena_alloc(&m->arena, sizeof(int) * (size_t)(g->n_nodes + 1));
  if (!p || !pos) return -1;
  int n = 0;
  for (int i = 0; i < g->n_nodes; i++) {
    ir_node *x = g->nodes[i];
    pos[i] = -1;
    if (x->op == start_op && !pass_model_collective(x)) pos[i] = n, p[n++] = (sched_pair){x, NULL};
    if (x->op == wait_op && pos[x->in[0]->id] >= 0) p[pos[x->in[0]->id]].wait = x;
  }
  *out = p;
  return n;
}

static bool add_fixed(ir_module *m, pass_fixed_key **fx, int *n, int *cap, ir_node *x, double key) {
  if (!x) return false;
  if (!ir_grow(&m->arena, (void **)fx, cap, *n + 1, sizeof(pass_fixed_key))) return false;
  (*fx)[(*n)++] = (pass_fixed_key){x, key + 1e-6 * *n};
  return true;
}

/* One bucket of reduce_scatters p[0..k): a single collective. */
static bool merge_bucket(ir_module *m, ir_graph *g, sched_pair *p, int k, pass_fixed_key **fx,
                         int *nfx, int *capfx) {
  int64_t world = ir_attr_int(p[0].start, "world"), total = 0;
  ir_node **parts = ir_arena_alloc(&m->arena, sizeof(ir_node *) * (size_t)k);
  if (!parts) return false;
  double after = 0;
  for (int i = 0; i < k; i++) {
    ir_node *f = p[i].start->in[0];
    if (f->id > after) after = f->id;
  }
  after += 0.5;
  for (int i = 0; i < k; i++) {
    int64_t s = p[i].wait->type.dims[0], dims[2] = {world, s};
    parts[i] = dsc_reshape(g, p[i].start->in[0], dims, 2);
    if (!add_fixed(m, fx, nfx, capfx, parts[i], after)) return false;
    total += s;
  }
  dsc_attr ax = dsc_attr_int("axis", 1);
  ir_node *cat = dsc_build(g, DSC_OP_CONCAT, parts, k, &ax, 1);
  int64_t flat_n = world * total;
  ir_node *flat = cat ? dsc_reshape(g, cat, &flat_n, 1) : NULL;
  ir_node *st = flat ? pass_collective_start(g, DSC_OP_REDUCE_SCATTER_START, flat, world,
                                             ir_collective_group(p[0].start))
                     : NULL;
  ir_node *wt = st ? dsc_build(g, DSC_OP_REDUCE_SCATTER_WAIT, &st, 1, NULL, 0) : NULL;
  if (wt) wt->role = IR_ROLE_GRAD; /* the rank's chunks of the bucket's gradients */
  if (!add_fixed(m, fx, nfx, capfx, cat, after) || !add_fixed(m, fx, nfx, capfx, flat, after) ||
      !add_fixed(m, fx, nfx, capfx, st, after) || !wt)
    return false;
  int64_t off = 0;
  for (int i = 0; i < k; i++) {
    int64_t s = p[i].wait->type.dims[0];
    dsc_attr sa[3] = {dsc_attr_int("axis", 0), dsc_attr_int("start", off),
                      dsc_attr_int("end", off + s)};
    ir_node *piece = dsc_build(g, DSC_OP_SLICE, &wt, 1, sa, 3);
    if (!piece) return false;
    pass_replace_uses(g, p[i].wait, piece);
    off += s;
  }
  return true;
}

static dsc_status bucket_reduce_scatters(ir_module *m, ir_graph *g, int64_t bucket_bytes) {
  sched_pair *p;
  int n = find_pairs(m, g, DSC_OP_REDUCE_SCATTER_START, DSC_OP_REDUCE_SCATTER_WAIT, &p);
  if (n < 0) return oom(m);
  if (n < 2 || bucket_bytes <= 0) return DSC_OK;
  pass_fixed_key *fx = NULL;
  int nfx = 0, capfx = 0, n_orig = g->n_nodes;
  for (int i = 0; i < n;) {
    dsc_dtype dt = p[i].start->type.dtype;
    int64_t world = ir_attr_int(p[i].start, "world"), bytes = 0;
    const char *group = ir_collective_group(p[i].start); /* a bucket is over one group */
    int j = i;
    while (j < n && p[j].wait && p[j].start->type.dtype == dt &&
           ir_attr_int(p[j].start, "world") == world &&
           strcmp(ir_collective_group(p[j].start), group) == 0) {
      int64_t b = dsc_type_numel(&p[j].start->in[0]->type) * (int64_t)dsc_dtype_size(dt);
      if (j > i && bytes + b > bucket_bytes) break;
      bytes += b, j++;
    }
    if (j == i) j = i + 1; /* a start without its wait stays alone */
    if (j - i >= 2 && !merge_bucket(m, g, p + i, j - i, &fx, &nfx, &capfx)) return oom(m);
    i = j;
  }
  return nfx ? pass_reorder(g, n_orig, fx, nfx) : DSC_OK;
}

/* Gradient reductions complete while the backward goes on: the wait of
 * each all_reduce / reduce_scatter moves up to right after the next one's
 * start (one in flight while the next is issued), instead of staying right
 * before the update. A collective's buffers belong to it until its wait, so
 * this frees each sent (full, local) gradient early: without it every
 * gradient would be held twice until the update. */
static dsc_status drain_reductions(ir_module *m, ir_graph *g) {
  sched_pair *ar, *rs;
  int nar = find_pairs(m, g, DSC_OP_ALL_REDUCE_START, DSC_OP_ALL_REDUCE_WAIT, &ar);
  int nrs = find_pairs(m, g, DSC_OP_REDUCE_SCATTER_START, DSC_OP_REDUCE_SCATTER_WAIT, &rs);
  if (nar < 0 || nrs < 0) return oom(m);
  /* all of them in start order (positions are ids) */
  sched_pair *all = ir_arena_alloc(&m->arena, sizeof(sched_pair) * (size_t)(nar + nrs + 1));
  pass_fixed_key *fx = ir_arena_alloc(&m->arena, sizeof(pass_fixed_key) * (size_t)(nar + nrs + 1));
  if (!all || !fx) return oom(m);
  int n = 0, i = 0, j = 0, nfx = 0;
  while (i < nar || j < nrs)
    all[n++] = j >= nrs || (i < nar && ar[i].start->id < rs[j].start->id) ? ar[i++] : rs[j++];
  for (int k = 0; k + 1 < n; k++) {
    sched_pair *p = &all[k];
    int next = all[k + 1].start->id;
    if (p->wait && p->wait->id > next + 1 && p->start->type.rank > 0) /* not the scalar loss */
      fx[nfx++] = (pass_fixed_key){p->wait, next + 0.5 + 1e-6 * nfx};
  }
  return nfx ? pass_reorder(g, g->n_nodes, fx, nfx) : DSC_OK;
}

/* Each all_gather starts as soon as it fits in the prefetch budget (in the
 * order of the waits), never later than right before its wait. */
static dsc_status prefetch_gathers(ir_module *m, ir_graph *g, int64_t budget) {
  sched_pair *p;
  int n = find_pairs(m, g, DSC_OP_ALL_GATHER_START, DSC_OP_ALL_GATHER_WAIT, &p);
  if (n < 0) return oom(m);
  if (n == 0 || budget <= 0) return DSC_OK;
  /* the gathers in wait order */
  int *by_wait = ir_arena_alloc(&m->arena, sizeof(int) * (size_t)n);
  int *wait_of = ir_arena_alloc(&m->arena, sizeof(int) * (size_t)(g->n_nodes + 1));
  pass_fixed_key *fx = ir_arena_alloc(&m->arena, sizeof(pass_fixed_key) * (size_t)(3 * n));
  if (!by_wait || !wait_of || !fx) return oom(m);
  for (int i = 0; i < g->n_nodes; i++) wait_of[i] = -1;
  int nw = 0;
  for (int k = 0; k < n; k++)
    if (p[k].wait) wait_of[p[k].wait->id] = k;
  for (int i = 0; i < g->n_nodes; i++)
    if (wait_of[i] >= 0) by_wait[nw++] = wait_of[i];
  int64_t inflight = 0;
  int next = 0, nfx = 0;
  for (int i = 0; i < g->n_nodes && next < nw; i++) {
    /* issue while the budget allows; a gather whose wait is here goes now */
    while (next < nw) {
      sched_pair *q = &p[by_wait[next]];
      int64_t b = dsc_type_numel(&q->wait->type) * (int64_t)dsc_dtype_size(q->wait->type.dtype);
      if (q->wait->id != i && inflight + b > budget) break;
      ir_node *src = q->start->in[0];
      if (src->op == DSC_OP_TIER_READ_WAIT) /* a disk shard: its read moves along */
        fx[nfx++] = (pass_fixed_key){src->in[0], i - 0.5 + 1e-6 * nfx};
      if (src->op == DSC_OP_PARAM || src->op == DSC_OP_TIER_READ_WAIT)
        /* a sharded param: readable any time, so it moves along */
        fx[nfx++] = (pass_fixed_key){src, i - 0.5 + 1e-6 * nfx};
      fx[nfx++] = (pass_fixed_key){q->start, i - 0.5 + 1e-6 * nfx};
      inflight += b;
      next++;
    }
    int k = wait_of[i];
    if (k >= 0)
      inflight -= dsc_type_numel(&p[k].wait->type) * (int64_t)dsc_dtype_size(p[k].wait->type.dtype);
  }
  return pass_reorder(g, g->n_nodes, fx, nfx);
}

dsc_status pass_schedule_run(ir_module *m, const dsc_train_config *cfg) {
  if (!cfg) return DSC_OK;
  dsc_status st0 = pass_prefetch_returns_run(m, cfg); /* offloaded activations */
  if (st0 != DSC_OK) return st0;
  if (cfg->world <= 1) return pass_offload_schedule_run(m, cfg); /* disk reads and writes */
  ir_graph *g = dsc_module_find_graph(m, "train_step");
  if (!g) return DSC_OK;
  if (cfg->zero.prefetch_bytes < 0 || cfg->zero.bucket_bytes < 0) {
    ir_error(m->ctx, ir_no_loc, "schedule: prefetch and bucket sizes must be non-negative");
    return DSC_ERR_USER;
  }
  dsc_status st = bucket_reduce_scatters(m, g, cfg->zero.bucket_bytes);
  if (st == DSC_OK) st = drain_reductions(m, g);
  if (st == DSC_OK) st = prefetch_gathers(m, g, cfg->zero.prefetch_bytes);
  if (st == DSC_OK) st = pass_offload_schedule_run(m, cfg);
  return st;
}
