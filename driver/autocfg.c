/* Auto-configuration (include/dsc/autocfg.h; docs/memory.md
 * "Auto-configuration"): a cost model of the lowered step program and a
 * search over ZeRO stage, offload, activation checkpointing, bucket and
 * prefetch sizes that plans each candidate (dsc_plan_memory_work), keeps
 * those that fit the memory budget and ranks them by predicted step time.
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
      return (n - 1) / n * payload;
    case DSC_COLL_BROADCAST:
      return payload; /* pipelined ring: each rank forwards the whole tensor once */
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
  double self = e->kind == KIR_UNARY || e->kind == KIR_BINARY || e->kind == KIR_SELECT ||
                        e->kind == KIR_CAST
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

dsc_status drv_step_work(dsc_context *ctx, const cg_program *p, int64_t world,
                         dsc_step_work *out) {
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
      case CG_INS_COPY:
        ev.flops = (double)in->numel;
        out->kernel_flops += ev.flops;
        break;
      case CG_INS_COLLECTIVE_START: {
        const cg_collective *c = &in->coll;
        dsc_coll_kind k = c->kind == CG_COLL_ALL_REDUCE       ? DSC_COLL_ALL_REDUCE
                          : c->kind == CG_COLL_REDUCE_SCATTER ? DSC_COLL_REDUCE_SCATTER
                          : c->kind == CG_COLL_ALL_GATHER     ? DSC_COLL_ALL_GATHER
                                                              : DSC_COLL_BROADCAST;
        /* the op's world (module meta zero.world is absent at stage 0) */
        int64_t n = c->world > 0 ? c->world : world;
        double payload = (double)c->count * (double)dsc_dtype_size(c->dtype);
        if (k == DSC_COLL_ALL_GATHER) payload *= (double)n; /* count: what each rank sends */
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
  for (int i = 0; i < w->n_events; i++) {
    const dsc_step_event *e = &w->events[i];
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

/* ---------------------------------------------------------------------------
 * The search */

/* lightest first: auto (driver/offload_auto.c) moves only what the budget
 * requires, so it sits between none and moving a whole class to host */
static const char *const tier_name[4] = {"none", "auto", "host", "disk"};
#define TIER_DISK 3
static const char *const act_name[3] = {"none", "selective", "blocks"};

static int tier_of(const char *s) {
  dsc_offload_tier t;
  if (dsc_offload_from_name(s, &t) != 0) return -1; /* DeepSpeed's names too */
  for (int i = 0; i < 4; i++)
    if (strcmp(dsc_offload_name(t), tier_name[i]) == 0) return i;
  return -1;
}

static void human(char *buf, size_t n, int64_t b) {
  const char *unit[] = {"KiB", "MiB", "GiB", "TiB"};
  if (b < 1024) {
    snprintf(buf, n, "%" PRId64 " B", b);
    return;
  }
  double v = (double)b / 1024;
  int u = 0;
  while (v >= 1024 && u < 3) v /= 1024, u++;
  snprintf(buf, n, "%.2f %s", v, unit[u]);
}

static void bytes_flag(char *buf, size_t n, int64_t b) {
  if (b > 0 && b % (1 << 20) == 0)
    snprintf(buf, n, "%" PRId64 "MiB", b >> 20);
  else if (b > 0 && b % 1024 == 0)
    snprintf(buf, n, "%" PRId64 "KiB", b >> 10);
  else
    snprintf(buf, n, "%" PRId64, b);
}

void dsc_autocfg_flags(const dsc_autocfg_candidate *c, int64_t world, char *buf, size_t n) {
  char b1[32], b2[32];
  int k = snprintf(buf, n, "--zero-stage %d --checkpoint-activations %s", world > 1 ? c->zero_stage : 0,
                   c->checkpoint_activations);
  if (k < 0 || (size_t)k >= n) return;
  if (strcmp(c->offload_optimizer, "none") != 0)
    k += snprintf(buf + k, n - (size_t)k, " --offload-optimizer %s", c->offload_optimizer);
  if ((size_t)k >= n) return;
  if (strcmp(c->offload_param, "none") != 0)
    k += snprintf(buf + k, n - (size_t)k, " --offload-param %s", c->offload_param);
  if ((size_t)k >= n) return;
  bytes_flag(b1, sizeof b1, c->bucket_bytes);
  bytes_flag(b2, sizeof b2, c->prefetch_bytes);
  if (c->has_bucket_bytes) k += snprintf(buf + k, n - (size_t)k, " --bucket-bytes %s", b1);
  if ((size_t)k >= n) return;
  if (c->has_prefetch_bytes) snprintf(buf + k, n - (size_t)k, " --prefetch-bytes %s", b2);
}

typedef struct {
  dsc_context *ctx;
  const dsc_autocfg_options *o;
  dsc_autocfg_result *r;
  int max_plans;
  dsc_status st; /* of the plan that failed */
} search;

/* Plans candidate c (its choices set) and appends it. Returns 1 when it
 * fits, 0 when not, -1 on an error (diagnostic on ctx), -2 when the plan
 * bound is reached (nothing planned). */
static int try_candidate(search *s, dsc_autocfg_candidate c) {
  if (s->r->n_planned >= s->max_plans || s->r->n >= DSC_AUTOCFG_MAX) return -2;
  dsc_plan_options po = s->o->base;
  po.has_zero_stage = true, po.zero_stage = c.zero_stage;
  po.checkpoint_activations = c.checkpoint_activations;
  po.offload_optimizer = c.offload_optimizer, po.offload_param = c.offload_param;
  /* offload auto fits this budget; when it cannot, the candidate does not fit */
  po.memory_budget = s->o->memory_budget, po.host_memory_budget = s->o->host_memory_budget;
  po.offload_auto_lenient = true;
  po.has_bucket_bytes = c.has_bucket_bytes, po.bucket_bytes = c.bucket_bytes;
  po.has_prefetch_bytes = c.has_prefetch_bytes, po.prefetch_bytes = c.prefetch_bytes;
  dsc_step_work w;
  s->r->n_planned++;
  dsc_status st = dsc_plan_memory_work(s->ctx, &po, &c.plan, &w);
  if (st != DSC_OK) return s->st = st, -1;
  dsc_step_cost_eval(&w, &s->o->rates, c.plan.host_bytes, c.plan.disk_bytes, &c.cost);
  dsc_step_work_free(&w);
  c.fits = c.plan.rank.peak <= s->o->memory_budget &&
           (s->o->host_memory_budget <= 0 || c.plan.host_bytes <= s->o->host_memory_budget);
  s->r->cand[s->r->n++] = c;
  return c.fits ? 1 : 0;
}

/* fitting first by step time, then the rest by peak; stable (generation
 * order breaks ties: lighter configurations were generated first) */
static int cand_cmp(const dsc_autocfg_candidate *a, const dsc_autocfg_candidate *b) {
  if (a->fits != b->fits) return a->fits ? -1 : 1;
  double x = a->fits ? a->cost.step_s : (double)a->plan.rank.peak;
  double y = b->fits ? b->cost.step_s : (double)b->plan.rank.peak;
  return x < y ? -1 : x > y ? 1 : 0;
}

static void rank_candidates(dsc_autocfg_result *r) {
  for (int i = 1; i < r->n; i++) { /* insertion sort: stable, n <= 64 */
    dsc_autocfg_candidate c = r->cand[i];
    int j = i;
    while (j > 0 && cand_cmp(&c, &r->cand[j - 1]) < 0) r->cand[j] = r->cand[j - 1], j--;
    r->cand[j] = c;
  }
  r->n_fit = 0;
  r->smallest = r->n > 0 ? 0 : -1;
  for (int i = 0; i < r->n; i++) {
    if (r->cand[i].fits) r->n_fit++;
    if (r->cand[i].plan.rank.peak < r->cand[r->smallest].plan.rank.peak) r->smallest = i;
  }
}

/* Bucket and prefetch sizes for the best candidate (stage 2-3: buckets of
 * reduce_scatters; stage 3: prefetch of all_gathers): a few values each,
 * planned because prefetch changes what is live; the best fitting one stays
 * first after ranking. */
static int refine(search *s) {
  static const int64_t buckets[] = {(int64_t)4 << 20, (int64_t)100 << 20};
  static const int64_t prefetches[] = {(int64_t)16 << 20, (int64_t)256 << 20};
  const dsc_plan_options *b = &s->o->base;
  if (s->r->n_fit == 0 || s->o->base.world <= 1) return 0;
  dsc_autocfg_candidate best = s->r->cand[0];
  if (best.zero_stage >= 2 && !b->has_bucket_bytes) {
    for (size_t i = 0; i < sizeof buckets / sizeof buckets[0]; i++) {
      dsc_autocfg_candidate c = best;
      c.has_bucket_bytes = true, c.bucket_bytes = buckets[i];
      int k = try_candidate(s, c);
      if (k == -1) return -1;
    }
    rank_candidates(s->r);
    best = s->r->cand[0];
  }
  if (best.zero_stage == 3 && !b->has_prefetch_bytes) {
    for (size_t i = 0; i < sizeof prefetches / sizeof prefetches[0]; i++) {
      dsc_autocfg_candidate c = best;
      c.has_prefetch_bytes = true, c.prefetch_bytes = prefetches[i];
      if (try_candidate(s, c) == -1) return -1;
    }
    rank_candidates(s->r);
  }
  return 0;
}

dsc_status dsc_autocfg_search(dsc_context *ctx, const dsc_autocfg_options *o,
                              dsc_autocfg_result *out) {
  memset(out, 0, sizeof *out);
  out->smallest = -1;
  const dsc_plan_options *b = &o->base;
  const dsc_rates *rt = &o->rates;
  if (o->memory_budget <= 0) {
    ir_error(ctx, ir_no_loc, "auto: a memory budget (--memory-budget) is required");
    return DSC_ERR_USER;
  }
  if (!(rt->compute_gflops > 0) || !(rt->link_gbps > 0) || !(rt->host_gbps > 0) ||
      !(rt->disk_gbps > 0) || !isfinite(rt->compute_gflops + rt->link_gbps + rt->host_gbps + rt->disk_gbps)) {
    ir_error(ctx, ir_no_loc, "auto: every rate (compute, link, host, disk) must be positive");
    return DSC_ERR_USER;
  }
  int fixed_opt = b->offload_optimizer ? tier_of(b->offload_optimizer) : -1;
  int fixed_param = b->offload_param ? tier_of(b->offload_param) : -1;
  if ((b->offload_optimizer && fixed_opt < 0) || (b->offload_param && fixed_param < 0)) {
    ir_error(ctx, ir_no_loc, "auto: offload must be none, host, disk or auto");
    return DSC_ERR_USER;
  }
  if ((fixed_opt == TIER_DISK || fixed_param == TIER_DISK) && !b->offload_dir) {
    ir_error(ctx, ir_no_loc, "auto: offload to disk needs an offload directory (--offload-dir)");
    return DSC_ERR_USER;
  }
  bool disk = b->offload_dir != NULL;
  search s = {ctx, o, out, o->max_plans > 0 ? o->max_plans : 40, DSC_OK};
  if (s.max_plans > DSC_AUTOCFG_MAX) s.max_plans = DSC_AUTOCFG_MAX;
  int64_t world = b->world > 1 ? b->world : 1;
  int s_lo = 0, s_hi = world > 1 ? 3 : 0;
  if (b->has_zero_stage) s_lo = s_hi = b->zero_stage;
  bool stopped = false;
  for (int stage = s_lo; stage <= s_hi && !stopped; stage++) {
    /* offload combinations, lightest first: (optimizer tier, param tier);
     * params offload only at stage 3 */
    int combos[16][2], nc = 0;
    for (int sum = 0; sum <= 2 * TIER_DISK; sum++)
      for (int ot = 0; ot <= TIER_DISK; ot++) {
        int pt = sum - ot;
        if (pt < 0 || pt > TIER_DISK) continue;
        if ((ot == TIER_DISK || pt == TIER_DISK) && !disk) continue;
        if (pt > 0 && (stage != 3 || world <= 1)) continue; /* params shard at stage 3 only */
        if (fixed_opt >= 0 && ot != fixed_opt) continue;
        if (fixed_param >= 0 && pt != fixed_param) continue;
        combos[nc][0] = ot, combos[nc][1] = pt, nc++;
      }
    /* combinations that fit without checkpointing: any heavier one only adds transfers */
    int fit_light[16][2], nf = 0;
    /* auto that did not fit at a policy moved its whole class to the host:
     * host for that class plans the same, so it is not planned again */
    bool auto_failed[TIER_DISK + 1][TIER_DISK + 1][3];
    memset(auto_failed, 0, sizeof auto_failed);
    /* and auto where the same without offload of that class fit at a policy
     * moves nothing: the same plan */
    bool fit_at[TIER_DISK + 1][TIER_DISK + 1][3];
    memset(fit_at, 0, sizeof fit_at);
    for (int ci = 0; ci < nc && !stopped; ci++) {
      bool dominated = false;
      for (int f = 0; f < nf; f++)
        if (combos[ci][0] >= fit_light[f][0] && combos[ci][1] >= fit_light[f][1]) dominated = true;
      if (dominated) continue;
      int ot = combos[ci][0], pt = combos[ci][1];
      int ao = ot == 2 ? 1 : ot, ap = pt == 2 ? 1 : pt; /* host -> auto */
      int no = ot == 1 ? 0 : ot, np = pt == 1 ? 0 : pt; /* auto -> none */
      for (int a = 0; a < 3; a++) {
        if (b->checkpoint_activations && a > 0) break;
        if ((ao != ot || ap != pt) && auto_failed[ao][ap][a]) continue;
        if ((no != ot || np != pt) && fit_at[no][np][a]) continue;
        dsc_autocfg_candidate c;
        memset(&c, 0, sizeof c);
        c.zero_stage = stage;
        c.offload_optimizer = tier_name[combos[ci][0]];
        c.offload_param = tier_name[combos[ci][1]];
        c.checkpoint_activations = b->checkpoint_activations ? b->checkpoint_activations : act_name[a];
        c.has_bucket_bytes = b->has_bucket_bytes, c.bucket_bytes = b->bucket_bytes;
        c.has_prefetch_bytes = b->has_prefetch_bytes, c.prefetch_bytes = b->prefetch_bytes;
        int k = try_candidate(&s, c);
        if (k == -1) return s.st; /* the model or a setting is at fault: say so, stop */
        if (k == -2) {
          stopped = true;
          break;
        }
        if (k == 0 && (ot == 1 || pt == 1)) auto_failed[ot][pt][a] = true;
        if (k == 1) fit_at[ot][pt][a] = true;
        if (k == 1) { /* heavier checkpointing only adds recomputation */
          if (a == 0) fit_light[nf][0] = combos[ci][0], fit_light[nf][1] = combos[ci][1], nf++;
          break;
        }
      }
    }
  }
  rank_candidates(out);
  if (refine(&s) != 0) return s.st;
  if (out->n_fit > 0) return DSC_OK;
  char bud[32], peak[32], over[32], flags[256];
  human(bud, sizeof bud, o->memory_budget);
  if (out->smallest < 0) {
    ir_error(ctx, ir_no_loc, "auto: nothing was planned (--max-plans)");
    return DSC_ERR_USER;
  }
  const dsc_autocfg_candidate *m = &out->cand[out->smallest];
  human(peak, sizeof peak, m->plan.rank.peak);
  int64_t d = m->plan.rank.peak - o->memory_budget;
  human(over, sizeof over, d > 0 ? d : 0);
  dsc_autocfg_flags(m, world, flags, sizeof flags);
  bool host_limited = d <= 0; /* it fit the device: the host budget excluded it */
  if (host_limited) {
    char hb[32], hm[32];
    human(hb, sizeof hb, m->plan.host_bytes);
    human(hm, sizeof hm, o->host_memory_budget);
    ir_error(ctx, ir_no_loc,
             "auto: no configuration fits the memory budget of %s per rank and the host budget "
             "of %s (%d planned): the smallest device peak, %s (%s), needs %s of host memory; "
             "a larger --host-memory-budget would let it run",
             bud, hm, out->n_planned, peak, flags, hb);
  } else {
    ir_error(ctx, ir_no_loc,
             "auto: no configuration fits the memory budget of %s per rank (%d planned%s): the "
             "smallest peak is %s (%s), %s over; it would take --memory-budget %s, or more "
             "ranks, a smaller --batch or --seq%s",
             bud, out->n_planned, stopped ? ", stopped at --max-plans" : "", peak, flags, over,
             peak, disk ? "" : ", or the disk tier (--offload-dir)");
  }
  return DSC_ERR_USER;
}
