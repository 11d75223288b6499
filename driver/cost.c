/* The cost model of auto-configuration (include/dsc/autocfg.h): the
 * summary of a lowered step program (drv_step_work, called by the memory
 * plan, driver/build.c) and its predicted time (dsc_step_cost_eval). A leaf
 * of the driver: it calls no other driver file.
 *
 * The model, in one paragraph. Compute: every GEMM is 2*m*n*k*batch FLOPs;
 * every kernel stage costs its domain points (over the inner dims for
 * reductions and inner stores, the outer dims otherwise) times its
 * arithmetic nodes (at least 1: a copy still touches every element); copies
 * and embedding gradients one per element. All of it runs at the measured
 * GEMM rate: elementwise work is memory bound and slower than that, but it
 * is a few percent of a transformer's FLOPs, and what the search compares
 * (recompute of checkpointing, which is in the program, against
 * communication and offload) is dominated by GEMMs. Communication: ring
 * formulas (dsc_ring_bytes) over the link rate plus a fixed latency per
 * collective, replayed against the compute stream in program order
 * (dsc_step_cost_eval), so what the schedule pass overlaps is not counted.
 * Offload: host and disk bytes read and written once per step, half hidden. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "driver/driver.h"
#include "dsc/autocfg.h"

/* ---------------------------------------------------------------------------
 * The program summary */

double dsc_ring_bytes(dsc_coll_kind k, double payload, int64_t world) {
  if (world <= 1 || payload <= 0) return 0;
  double n = (double)world;
  switch (k) {
    case DSC_COLL_ALL_REDUCE:
      return 2 * (n - 1) / n * payload; /* reduce-scatter + all-gather */
    case DSC_COLL_REDUCE_SCATTER:
    case DSC_COLL_ALL_GATHER:
    case DSC_COLL_ALL_TO_ALL:
      return (n - 1) / n * payload;
    case DSC_COLL_BROADCAST:
      return payload; /* pipelined ring: each rank forwards the whole tensor once */
    case DSC_COLL_KINDS:
      break;
  }
  return 0;
}

void dsc_step_work_free(dsc_step_work *w) {
  if (!w) return;
  free(w->events);
  memset(w, 0, sizeof *w);
}

/* Arithmetic nodes of an expression DAG, each counted once (emitters
 * evaluate a shared node once per point). seen: the nodes met so far. */
typedef struct {
  const kir_expr *seen[512];
  int n;
} op_count;

static double expr_ops(const kir_expr *e, op_count *c) {
  if (!e) return 0;
  for (int i = 0; i < c->n; i++)
    if (c->seen[i] == e) return 0;
  if (c->n < (int)(sizeof c->seen / sizeof c->seen[0])) c->seen[c->n++] = e;
  double self =
      e->kind == KIR_UNARY || e->kind == KIR_BINARY || e->kind == KIR_SELECT || e->kind == KIR_CAST
          ? 1
          : 0;
  double gather = e->kind == KIR_LOAD ? expr_ops(e->access.gather, c) : 0;
  return self + gather + expr_ops(e->a, c) + expr_ops(e->b, c) + expr_ops(e->c, c);
}

static double kernel_flops(const kir_kernel *k) {
  double outer = 1, all = 1;
  for (int d = 0; d < k->rank; d++) {
    all *= (double)k->dims[d];
    if (d < k->n_outer) outer *= (double)k->dims[d];
  }
  double f = 0;
  for (int s = 0; s < k->n_stages; s++) {
    const kir_stage *st = &k->stages[s];
    bool inner = st->kind == KIR_STAGE_REDUCE || (st->kind == KIR_STAGE_STORE && st->over_inner);
    op_count c;
    c.n = 0;
    double ops = expr_ops(st->expr, &c);
    f += (inner ? all : outer) * (ops < 1 ? 1 : ops);
  }
  return f;
}

static bool push_event(dsc_step_work *w, int *cap, dsc_step_event ev) {
  /* consecutive compute merges into one event */
  if (ev.kind == DSC_EV_COMPUTE && w->n_events > 0 &&
      w->events[w->n_events - 1].kind == DSC_EV_COMPUTE) {
    w->events[w->n_events - 1].flops += ev.flops;
    return true;
  }
  if (w->n_events == *cap) {
    int nc = *cap ? 2 * *cap : 64;
    dsc_step_event *e = realloc(w->events, sizeof *e * (size_t)nc);
    if (!e) return false;
    w->events = e, *cap = nc;
  }
  w->events[w->n_events++] = ev;
  return true;
}

dsc_status drv_step_work(dsc_context *ctx, const cg_program *p, int64_t world, dsc_step_work *out) {
  memset(out, 0, sizeof *out);
  int cap = 0;
  for (int i = 0; i < p->n_instrs; i++) {
    const cg_instr *in = &p->instrs[i];
    dsc_step_event ev = {DSC_EV_COMPUTE, 0, 0, 0};
    switch (in->kind) {
      case CG_INS_LAUNCH:
        ev.flops = kernel_flops(p->kernels[in->kernel]);
        out->kernel_flops += ev.flops;
        break;
      case CG_INS_GEMM: {
        const cg_gemm *g = &in->gemm;
        ev.flops = 2.0 * (double)g->m * (double)g->n * (double)g->k * (double)g->batch[0] *
                   (double)g->batch[1];
        out->gemm_flops += ev.flops;
        break;
      }
      case CG_INS_EMBEDDING_GRAD:
        ev.flops = (double)in->n_ids * (double)in->cols;
        out->kernel_flops += ev.flops;
        break;
      case CG_INS_SET_ROWS:
        ev.flops = (double)in->n_ids * (double)in->cols;
        out->kernel_flops += ev.flops;
        break;
      case CG_INS_COPY:
        ev.flops = (double)in->numel;
        out->kernel_flops += ev.flops;
        break;
      case CG_INS_COLLECTIVE_START: {
        const cg_collective *c = &in->coll;
        dsc_coll_kind k = c->kind == CG_COLL_ALL_REDUCE       ? DSC_COLL_ALL_REDUCE
                          : c->kind == CG_COLL_REDUCE_SCATTER ? DSC_COLL_REDUCE_SCATTER
                          : c->kind == CG_COLL_ALL_GATHER     ? DSC_COLL_ALL_GATHER
                          : c->kind == CG_COLL_ALL_TO_ALL     ? DSC_COLL_ALL_TO_ALL
                                                              : DSC_COLL_BROADCAST;
        /* the op's world (module meta zero.world is absent at stage 0) */
        int64_t n = c->world > 0 ? c->world : world;
        double payload = (double)c->count * (double)dsc_dtype_size(c->dtype);
        /* count: what each rank sends (to each peer, for all_to_all) */
        if (k == DSC_COLL_ALL_GATHER || k == DSC_COLL_ALL_TO_ALL) payload *= (double)n;
        ev.kind = DSC_EV_START;
        ev.coll = c->id;
        ev.link_bytes = dsc_ring_bytes(k, payload, n);
        out->coll_bytes[k] += payload;
        out->link_bytes[k] += ev.link_bytes;
        out->coll_count[k]++;
        if (c->id + 1 > out->n_coll) out->n_coll = c->id + 1;
        break;
      }
      case CG_INS_COLLECTIVE_WAIT:
        ev.kind = DSC_EV_WAIT;
        ev.coll = in->coll.id;
        break;
      case CG_INS_TIER_START: /* disk transfers: overlapped, not compute */
      case CG_INS_TIER_WAIT:
        break;
    }
    if (!push_event(out, &cap, ev)) {
      dsc_step_work_free(out);
      ir_error(ctx, ir_no_loc, "auto: out of memory");
      return DSC_ERR_INTERNAL;
    }
  }
  return DSC_OK;
}

dsc_status drv_step_work_repeat(dsc_context *ctx, const dsc_step_work *micro, int64_t times,
                                dsc_step_work *w) {
  int n = micro->n_events + w->n_events;
  dsc_step_event *ev = malloc(sizeof *ev * (size_t)(n > 0 ? n : 1));
  if (!ev) return ir_error(ctx, ir_no_loc, "auto: out of memory"), DSC_ERR_INTERNAL;
  memcpy(ev, micro->events, sizeof *ev * (size_t)micro->n_events);
  for (int i = 0; i < w->n_events; i++) {
    ev[micro->n_events + i] = w->events[i];
    if (ev[micro->n_events + i].kind != DSC_EV_COMPUTE) ev[micro->n_events + i].coll += micro->n_coll;
  }
  free(w->events);
  w->events = ev, w->n_events = n;
  w->repeat_events = micro->n_events, w->repeat = times;
  w->n_coll += micro->n_coll;
  double k = (double)times;
  w->gemm_flops += k * micro->gemm_flops, w->kernel_flops += k * micro->kernel_flops;
  for (int c = 0; c < DSC_COLL_KINDS; c++) {
    w->coll_bytes[c] += k * micro->coll_bytes[c];
    w->link_bytes[c] += k * micro->link_bytes[c];
    w->coll_count[c] += times * micro->coll_count[c];
  }
  return DSC_OK;
}

/* ---------------------------------------------------------------------------
 * The cost */

#define DEFAULT_LATENCY_US 10.0
#define OFFLOAD_HIDDEN 0.5 /* share of offload transfers overlapped with compute */

void dsc_step_cost_eval(const dsc_step_work *w, const dsc_rates *r, int64_t host_bytes,
                        int64_t disk_bytes, dsc_step_cost *out) {
  memset(out, 0, sizeof *out);
  double rate = r->compute_gflops * 1e9, link = r->link_gbps * 1e9;
  double lat = (r->coll_latency_us > 0 ? r->coll_latency_us : DEFAULT_LATENCY_US) * 1e-6;
  out->compute_s = (w->gemm_flops + w->kernel_flops) / rate;
  /* one compute stream (t) and one communication stream (comm_free) */
  double *end = w->n_coll > 0 ? calloc((size_t)w->n_coll, sizeof *end) : NULL;
  double t = 0, comm_free = 0;
  /* the micro-batch's events `repeat` times, then the rest */
  int64_t reps = w->repeat > 1 ? w->repeat : 1, head = w->repeat_events;
  int64_t total = head * reps + (w->n_events - head);
  for (int64_t i = 0; i < total; i++) {
    int64_t r = i < head * reps ? i % head : i - head * (reps - 1);
    const dsc_step_event *e = &w->events[r];
    if (e->kind == DSC_EV_COMPUTE) {
      t += e->flops / rate;
    } else if (e->kind == DSC_EV_START) {
      double dur = lat + e->link_bytes / link;
      double begin = t > comm_free ? t : comm_free;
      comm_free = begin + dur;
      out->comm_s += dur;
      if (end && e->coll >= 0 && e->coll < w->n_coll) end[e->coll] = comm_free;
    } else if (end && e->coll >= 0 && e->coll < w->n_coll && end[e->coll] > t) {
      t = end[e->coll]; /* the wait stalls compute */
    }
  }
  if (w->n_coll > 0 && !end) t = out->compute_s + out->comm_s; /* no memory: nothing overlaps */
  free(end);
  out->exposed_comm_s = t - out->compute_s;
  if (out->exposed_comm_s < 0) out->exposed_comm_s = 0; /* rounding */
  double xfer = 0;
  if (host_bytes > 0) xfer += 2.0 * (double)host_bytes / (r->host_gbps * 1e9);
  if (disk_bytes > 0) xfer += 2.0 * (double)disk_bytes / (r->disk_gbps * 1e9);
  double hidden = OFFLOAD_HIDDEN * xfer;
  if (hidden > out->compute_s) hidden = out->compute_s;
  out->offload_s = xfer - hidden;
  out->step_s = out->compute_s + out->exposed_comm_s + out->offload_s;
}
