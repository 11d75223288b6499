/* Auto-configuration (include/dsc/autocfg.h; docs/memory.md
 * "Auto-configuration"): a search over ZeRO stage, offload, activation
 * checkpointing, bucket and prefetch sizes that plans each candidate
 * (dsc_plan_memory_work), keeps those that fit the memory budget and ranks
 * them by the predicted step time of driver/cost.c's model. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "driver/driver.h"
#include "dsc/autocfg.h"

/* ---------------------------------------------------------------------------
 * The search */

/* lightest first: auto (driver/offload_auto.c) moves only what the budget
 * requires, so it sits between none and moving a whole class to host */
static const dsc_offload_tier tier_at[4] = {DSC_OFFLOAD_NONE, DSC_OFFLOAD_AUTO, DSC_OFFLOAD_HOST,
                                            DSC_OFFLOAD_DISK};
#define TIER_DISK 3
static const dsc_remat_policy act_at[3] = {DSC_REMAT_NONE, DSC_REMAT_SELECTIVE, DSC_REMAT_BLOCKS};

static int tier_of(dsc_offload_tier t) {
  for (int i = 0; i < 4; i++)
    if (tier_at[i] == t) return i;
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
  const dsc_run_knobs *kb = &c->knobs;
  char b1[32], b2[32], act[32];
  if (kb->remat == DSC_REMAT_BLOCKS && kb->remat_every > 1)
    snprintf(act, sizeof act, "blocks:%" PRId64, kb->remat_every);
  else
    snprintf(act, sizeof act, "%s", dsc_remat_name(kb->remat));
  int k = snprintf(buf, n, "--zero-stage %" PRId64 " --checkpoint-activations %s",
                   world > 1 ? kb->zero_stage : 0, act);
  if (k < 0 || (size_t)k >= n) return;
  if (kb->offload_optimizer != DSC_OFFLOAD_NONE)
    k += snprintf(buf + k, n - (size_t)k, " --offload-optimizer %s",
                  dsc_offload_name(kb->offload_optimizer));
  if ((size_t)k >= n) return;
  if (kb->offload_param != DSC_OFFLOAD_NONE)
    k += snprintf(buf + k, n - (size_t)k, " --offload-param %s",
                  dsc_offload_name(kb->offload_param));
  if ((size_t)k >= n) return;
  bytes_flag(b1, sizeof b1, kb->bucket_bytes);
  bytes_flag(b2, sizeof b2, kb->prefetch_bytes);
  if (kb->has_bucket_bytes) k += snprintf(buf + k, n - (size_t)k, " --bucket-bytes %s", b1);
  if ((size_t)k >= n) return;
  if (kb->has_prefetch_bytes) snprintf(buf + k, n - (size_t)k, " --prefetch-bytes %s", b2);
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
  po.knobs = c.knobs; /* the base's with the candidate's choices */
  /* offload auto fits this budget; when it cannot, the candidate does not fit */
  po.memory_budget = s->o->memory_budget, po.host_memory_budget = s->o->host_memory_budget;
  po.offload_auto_lenient = true;
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
  const dsc_run_knobs *b = &s->o->base.knobs;
  if (s->r->n_fit == 0 || s->o->base.world <= 1) return 0;
  dsc_autocfg_candidate best = s->r->cand[0];
  if (best.knobs.zero_stage >= 2 && !b->has_bucket_bytes) {
    for (size_t i = 0; i < sizeof buckets / sizeof buckets[0]; i++) {
      dsc_autocfg_candidate c = best;
      c.knobs.has_bucket_bytes = true, c.knobs.bucket_bytes = buckets[i];
      int k = try_candidate(s, c);
      if (k == -1) return -1;
    }
    rank_candidates(s->r);
    best = s->r->cand[0];
  }
  if (best.knobs.zero_stage == 3 && !b->has_prefetch_bytes) {
    for (size_t i = 0; i < sizeof prefetches / sizeof prefetches[0]; i++) {
      dsc_autocfg_candidate c = best;
      c.knobs.has_prefetch_bytes = true, c.knobs.prefetch_bytes = prefetches[i];
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
  const dsc_run_knobs *kb = &b->knobs;
  int fixed_opt = kb->has_offload_optimizer ? tier_of(kb->offload_optimizer) : -1;
  int fixed_param = kb->has_offload_param ? tier_of(kb->offload_param) : -1;
  if ((kb->has_offload_optimizer && fixed_opt < 0) || (kb->has_offload_param && fixed_param < 0)) {
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
  if (kb->has_zero_stage) s_lo = s_hi = (int)kb->zero_stage;
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
        if (kb->has_remat && a > 0) break;
        if ((ao != ot || ap != pt) && auto_failed[ao][ap][a]) continue;
        if ((no != ot || np != pt) && fit_at[no][np][a]) continue;
        dsc_autocfg_candidate c;
        memset(&c, 0, sizeof c);
        c.knobs = *kb; /* the fixed choices and the rest of the run's knobs */
        c.knobs.has_zero_stage = true, c.knobs.zero_stage = stage;
        c.knobs.has_offload_optimizer = true, c.knobs.offload_optimizer = tier_at[ot];
        c.knobs.has_offload_param = true, c.knobs.offload_param = tier_at[pt];
        if (!kb->has_remat)
          c.knobs.has_remat = true, c.knobs.remat = act_at[a], c.knobs.remat_every = 1;
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
