/* Part of pass "schedule" (pass_prefetch_returns_run): offloaded
 * activations come back ahead of their use by the time their copy takes.
 *
 * Activation offload (passes/offload_host.c, remat policy "offload") sends
 * each kept forward value to the host (to_host) and brings it back with a
 * to_device that the reorder leaves right before its first backward
 * reader. On the host stream (meta offload.overlap, runtime/exec_cpu.c)
 * the copy then starts when its reader needs it, and the reader waits for
 * all of it. This pass moves each such to_device earlier:
 *   - by time: to the latest point before its reader where the executor's
 *     work in between takes at least as long as the copy (a cost model,
 *     below), so that the copy is hidden and its device buffer is held no
 *     longer than that;
 *   - within bytes: never so early that the returns started ahead of their
 *     readers hold more than cfg->offload.prefetch_bytes at any point (the
 *     device memory they cost; dsc plan counts it), and never before the
 *     value's to_host.
 * Without the host stream (overlap false) the copies run in their place
 * anyway, so nothing moves.
 *
 * The cost model (pass_node_seconds): a matmul's 2·M·N·K flops and an
 * attention's 4·B·H·T²·d at the GEMM rate; a to_host its bytes at the
 * copy rate (host <-> device); any other op its operands' and result's
 * bytes at the memory rate (what a memory-bound kernel moves); views,
 * sources and assigns nothing; host-placed nodes and the stream's own
 * copies (to_device) nothing, as they are not the executor's time. The
 * rates are cfg->gemm_gflops, cfg->mem_gbps and cfg->copy_gbps (dsc train
 * takes them from the host's calibration, driver/calibrate.c, when it has
 * one: on the CPU memory and copies are both its memcpy rate), else the
 * PASS_DEFAULT_* rates: a 2-core server's. Only their ratios matter for
 * where a copy starts. */
#include <string.h>

#include "passes/passes.h"

static int64_t bytes_of(const ir_node *x) {
  return dsc_type_numel(&x->type) * (int64_t)dsc_dtype_size(x->type.dtype);
}

static double rate(double given, double fallback) { return (given > 0 ? given : fallback) * 1e9; }

void pass_rates_of(const dsc_train_config *cfg, pass_rates *out) {
  out->gemm_flops = rate(cfg ? cfg->gemm_gflops : 0, PASS_DEFAULT_GEMM_GFLOPS);
  out->mem_bytes = rate(cfg ? cfg->mem_gbps : 0, PASS_DEFAULT_MEM_GBPS);
  out->copy_bytes = rate(cfg ? cfg->copy_gbps : 0, PASS_DEFAULT_COPY_GBPS);
}

double pass_node_seconds(const ir_node *x, const pass_rates *r) {
  if (x->n_in == 0 || pass_is_view(x) || x->op == DSC_OP_ASSIGN || x->place == IR_PLACE_HOST ||
      x->op == DSC_OP_TO_DEVICE)
    return 0;
  if (x->op == DSC_OP_MATMUL) {
    const dsc_type *a = &x->in[0]->type;
    double k = (double)a->dims[a->rank - 1];
    return 2.0 * (double)dsc_type_numel(&x->type) * k / r->gemm_flops;
  }
  if (x->op == DSC_OP_ATTENTION) { /* q, k, v: [B, T, D]; scores and weighted sum */
    const dsc_type *q = &x->in[0]->type, *k = &x->in[1]->type;
    double t = (double)k->dims[k->rank - 2];
    return 4.0 * (double)dsc_type_numel(q) * t / r->gemm_flops;
  }
  int64_t b = bytes_of(x);
  for (int q = 0; q < x->n_in; q++) b += bytes_of(x->in[q]);
  /* the executor's own copies to the host cross the link */
  return (double)b / (x->op == DSC_OP_TO_HOST ? r->copy_bytes : r->mem_bytes);
}

/* An offloaded activation's return: to_device(to_host(x)) of a value x
 * computed on the device (not a param: the host step's returns are the
 * offload pass's to place). */
static bool is_return(const ir_node *d) {
  if (d->op != DSC_OP_TO_DEVICE || d->in[0]->op != DSC_OP_TO_HOST) return false;
  const ir_node *x = d->in[0]->in[0];
  return x->op != DSC_OP_PARAM && x->place != IR_PLACE_HOST;
}

static dsc_status prefetch_graph(ir_module *m, ir_graph *g, const pass_rates *r, int64_t budget) {
  int n = g->n_nodes;
  ir_arena *a = &m->arena;
  int *first = ir_arena_alloc(a, sizeof(int) * (size_t)(n + 1));        /* first reader */
  double *t = ir_arena_alloc(a, sizeof(double) * (size_t)(n + 1));      /* executor time before i */
  int64_t *live = ir_arena_alloc(a, sizeof(int64_t) * (size_t)(n + 1)); /* early returns' bytes */
  pass_fixed_key *keys = ir_arena_alloc(a, sizeof(pass_fixed_key) * (size_t)(n + 1));
  bool *done = ir_arena_alloc(a, sizeof(bool) * (size_t)(n + 1));
  if (!first || !t || !live || !keys || !done) {
    ir_error(m->ctx, ir_no_loc, "schedule: out of memory");
    return DSC_ERR_INTERNAL;
  }
  for (int i = 0; i < n; i++) first[i] = n, live[i] = 0, done[i] = false;
  t[0] = 0;
  for (int i = 0; i < n; i++) {
    const ir_node *c = g->nodes[i];
    t[i + 1] = t[i] + pass_node_seconds(c, r);
    for (int q = 0; q < c->n_in; q++)
      if (i < first[c->in[q]->id]) first[c->in[q]->id] = i;
  }
  /* in the order of their readers (the order the backward needs them), so
   * that an earlier return takes the budget first */
  int n_keys = 0;
  for (int rpos = 0; rpos < n; rpos++)
    for (int q = 0; q < g->nodes[rpos]->n_in; q++) {
      ir_node *d = g->nodes[rpos]->in[q];
      if (!is_return(d) || first[d->id] != rpos || d->id > rpos || done[d->id]) continue;
      done[d->id] = true;        /* a reader may read it twice */
      int lo = d->in[0]->id + 1; /* after its to_host */
      double need = (double)bytes_of(d) / r->copy_bytes;
      /* the latest p with the executor's work in [p, rpos) >= need */
      int p = rpos;
      while (p > lo && t[rpos] - t[p] < need) p--;
      /* within the budget: the latest blocker in [p, rpos) bounds p */
      int64_t b = bytes_of(d);
      for (int i = rpos - 1; i >= p; i--)
        if (live[i] + b > budget) {
          p = i + 1;
          break;
        }
      if (p >= d->id) continue; /* not earlier than where it is */
      for (int i = p; i < rpos; i++) live[i] += b;
      keys[n_keys++] = (pass_fixed_key){d, p - 0.5 + 1e-6 * n_keys};
    }
  return n_keys ? pass_reorder(g, n, keys, n_keys) : DSC_OK;
}

dsc_status pass_prefetch_returns_run(ir_module *m, const dsc_train_config *cfg) {
  if (!cfg || !dsc_module_get_meta(m, "offload.overlap")) return DSC_OK;
  pass_rates r;
  pass_rates_of(cfg, &r);
  int64_t budget = cfg->offload.prefetch_bytes;
  for (int gi = 0; gi < m->n_graphs; gi++) {
    ir_graph *g = m->graphs[gi];
    bool any = false;
    for (int i = 0; i < g->n_nodes && !any; i++) any = is_return(g->nodes[i]);
    if (!any) continue;
    dsc_status st = prefetch_graph(m, g, &r, budget);
    if (st != DSC_OK) return st;
  }
  return DSC_OK;
}
