/* Adaptive offload (driver/driver.h; docs/memory.md "Adaptive offload"):
 * --offload-optimizer auto and --offload-param auto move off the device only
 * what the memory budget requires, as DeepCompile's adaptive offloading does.
 *
 * The loop: plan the step with nothing of the auto classes offloaded; while
 * the device peak exceeds the budget, take the values not moved yet (module
 * states for the optimizer class, param shards at ZeRO stage 3 for the param
 * class), order them by how far their next use in the step lies from the
 * instruction where the plan peaks (furthest first: a value needed last is
 * the one a transfer can bring back in time), then by size (largest first),
 * and move the first ones until their bytes cover the excess; plan again
 * (the peak need not drop by exactly their bytes: alignment, and passes
 * that react to tiers), repeat. A value goes to the host tier, or to disk
 * when the host budget would be exceeded and an offload directory is given.
 * When the device fits but the host budget does not, host values move to
 * disk in the same order. Every plan compiles the model afresh in a private
 * context, so the caller's module and diagnostics are untouched; the chosen
 * list becomes cfg->offload.values for the caller's own pipeline run, which
 * pass offload (passes/offload.c) turns into module meta tier.<name>. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "driver/driver.h"
#include "dsc/memplan.h"

typedef struct {
  int param;        /* module index */
  const char *name; /* in rep->arena */
  int64_t bytes, next_use;
  int moved; /* index into rep->values, -1 when still on the device */
} candidate;

/* One plan: the step compiled in sub with cfg's current choice. */
typedef struct {
  cg_memplan plan;
  int64_t *bytes, *next_use; /* per module param/state (malloc'd) */
  int n_params;
  bool *is_candidate;
  char **names; /* strdup'd */
} one_plan;

static void one_plan_free(one_plan *p) {
  for (int i = 0; p->names && i < p->n_params; i++) free(p->names[i]);
  free(p->names), free(p->bytes), free(p->next_use), free(p->is_candidate);
  memset(p, 0, sizeof *p);
}

static void use(const cg_program *pr, int buf, int at, int peak, int64_t *next_use) {
  if (buf < 0 || buf >= pr->n_buffers || pr->buffers[buf].kind != CG_BUF_PARAM) return;
  int n = pr->n_instrs;
  /* the step repeats: a use before the peak is next needed in the next step */
  int64_t d = at >= peak ? at - peak : (int64_t)at + n - peak;
  int64_t *slot = &next_use[pr->buffers[buf].index];
  if (d < *slot) *slot = d;
}

/* For each param/state of the program, instructions from `peak` to its next
 * read or write (n_instrs when no instruction touches it). */
static void next_uses(const cg_program *pr, int peak, int n_params, int64_t *next_use) {
  for (int i = 0; i < n_params; i++) next_use[i] = pr->n_instrs;
  for (int i = 0; i < pr->n_instrs; i++) {
    const cg_instr *in = &pr->instrs[i];
    switch (in->kind) {
      case CG_INS_LAUNCH:
        for (int a = 0; a < in->n_args; a++) use(pr, in->args[a], i, peak, next_use);
        break;
      case CG_INS_GEMM:
        use(pr, in->gemm.a.buffer, i, peak, next_use);
        use(pr, in->gemm.b.buffer, i, peak, next_use);
        use(pr, in->gemm.c.buffer, i, peak, next_use);
        break;
      case CG_INS_EMBEDDING_GRAD:
      case CG_INS_SET_ROWS:
      case CG_INS_COPY:
      case CG_INS_COLLECTIVE_START:
      case CG_INS_COLLECTIVE_WAIT:
        if (in->kind == CG_INS_EMBEDDING_GRAD || in->kind == CG_INS_SET_ROWS)
          use(pr, in->ids, i, peak, next_use);
        use(pr, in->src, i, peak, next_use);
        use(pr, in->dst, i, peak, next_use);
        break;
      default: /* tier transfers move a value, they do not need it */
        break;
    }
  }
}

static dsc_status plan_once(dsc_context *sub, const char *path, const dsc_train_config *cfg,
                            int threads, one_plan *out) {
  memset(out, 0, sizeof *out);
  dsc_module *m = NULL;
  drv_model_facts f;
  ir_arena a;
  ir_arena_init(&a, sub);
  dsc_status st = drv_compile_step(sub, path, cfg->batch, cfg->seq, cfg->sp, &m, &f);
  if (st == DSC_OK) st = drv_build_graphs(sub, path, m, cfg, DSC_BACKEND_CPU, false, NULL);
  const dsc_graph *g = st == DSC_OK ? dsc_module_find_graph(m, "train_step") : NULL;
  if (st == DSC_OK && !g) {
    ir_error(sub, ir_no_loc, "offload auto: the module has no graph 'train_step'");
    st = DSC_ERR_INTERNAL;
  }
  cg_program *prog = NULL;
  if (st == DSC_OK) {
    cg_memplan_options o = {drv_default_threads(threads), NULL};
#ifdef DSC_HAVE_LLVM
    if (rt_sgemm_supported()) o.gemm_scratch_floats = rt_sgemm_scratch_floats; /* as plan.c */
#endif
    st = cg_memplan_graph(g, &a, &o, &out->plan, &prog);
    /* grad_accum > 1: micro_step shares the STATE arena and the one WORK
     * arena; the step's peak is the larger program's (driver/build.c) */
    const dsc_graph *micro = dsc_module_find_graph(m, "micro_step");
    cg_memplan mp;
    if (st == DSC_OK && micro && (st = cg_memplan_graph(micro, &a, &o, &mp, NULL)) == DSC_OK &&
        mp.peak > out->plan.peak)
      out->plan.peak = mp.peak;
  }
  if (st == DSC_OK) {
    int n = out->n_params = dsc_module_param_count(m);
    out->bytes = calloc((size_t)n + 1, sizeof *out->bytes);
    out->next_use = calloc((size_t)n + 1, sizeof *out->next_use);
    out->is_candidate = calloc((size_t)n + 1, sizeof *out->is_candidate);
    out->names = calloc((size_t)n + 1, sizeof *out->names);
    if (!out->bytes || !out->next_use || !out->is_candidate || !out->names) {
      ir_error(sub, ir_no_loc, "offload auto: out of memory");
      st = DSC_ERR_INTERNAL;
    }
    for (int b = 0; st == DSC_OK && b < prog->n_buffers; b++) {
      const cg_buffer *buf = &prog->buffers[b];
      if (buf->kind == CG_BUF_PARAM && buf->index >= 0 && buf->index < n)
        out->bytes[buf->index] = buf->numel * (int64_t)dsc_dtype_size(buf->dtype);
    }
    for (int i = 0; st == DSC_OK && i < n; i++) {
      const ir_param *p = &m->params[i];
      char key[600];
      snprintf(key, sizeof key, "shard.%s", p->name);
      /* acc.*: the micro-batches' gradient sums, read by every micro_step */
      bool acc = dsc_step_is_sum(m, i);
      out->is_candidate[i] =
          acc     ? false
          : p->state ? cfg->offload.optimizer == DSC_OFFLOAD_AUTO
                   : cfg->offload.param == DSC_OFFLOAD_AUTO && dsc_module_get_meta(m, key) != NULL;
      if (!(out->names[i] = strdup(p->name))) {
        ir_error(sub, ir_no_loc, "offload auto: out of memory");
        st = DSC_ERR_INTERNAL;
      }
    }
    if (st == DSC_OK) next_uses(prog, out->plan.peak_instr, n, out->next_use);
  }
  ir_arena_release(&a);
  dsc_module_free(m);
  if (st != DSC_OK) one_plan_free(out);
  return st;
}

/* furthest next use first, then the largest, then module order */
static int cand_cmp(const void *x, const void *y) {
  const candidate *a = x, *b = y;
  if (a->next_use != b->next_use) return a->next_use > b->next_use ? -1 : 1;
  if (a->bytes != b->bytes) return a->bytes > b->bytes ? -1 : 1;
  return a->param - b->param;
}

static void mib(char *buf, size_t n, int64_t b) {
  snprintf(buf, n, "%.2f MiB", (double)b / (1024.0 * 1024.0));
}

static const char *classes(const dsc_train_config *cfg) {
  bool o = cfg->offload.optimizer == DSC_OFFLOAD_AUTO, p = cfg->offload.param == DSC_OFFLOAD_AUTO;
  return o && p ? "every optimizer state and param shard"
         : o    ? "every optimizer state"
                : "every param shard";
}

/* A plan still over the device budget with nothing left to move. */
static void fail_device(dsc_context *ctx, const dsc_train_config *cfg, const drv_offload_budget *b,
                        const drv_offload_report *rep, const cg_memplan *p, bool host_blocked) {
  char peak[32], bud[32], over[32], host[32], disk[32], c[6][32];
  mib(peak, sizeof peak, p->peak), mib(bud, sizeof bud, b->budget);
  mib(over, sizeof over, p->peak - b->budget);
  mib(host, sizeof host, rep->moved[DSC_OFFLOAD_HOST]);
  mib(disk, sizeof disk, rep->moved[DSC_OFFLOAD_DISK]);
  for (int k = 0; k < 6; k++) mib(c[k], sizeof c[k], p->bytes[k]);
  ir_error(ctx, ir_no_loc,
           "offload auto: the step needs %s per rank with %s %s (%d values: %s to host, %s to "
           "disk), still over the memory budget of %s by %s: params %s, grads %s, optimizer "
           "%s, activations %s, workspace %s, comm %s (%s)",
           peak, host_blocked ? "what the host budget allows of" : classes(cfg),
           host_blocked ? classes(cfg) : "offloaded", rep->n, host, disk, bud, over, c[0], c[1],
           c[2], c[3], c[4], c[5],
           host_blocked && !b->disk
               ? "the host memory budget holds no more; --offload-dir DIR adds the disk tier"
               : "a higher ZeRO stage, more ranks, --offload-param auto at stage 3, "
                 "--checkpoint-activations or a smaller batch need less");
}

dsc_status drv_offload_auto(dsc_context *ctx, const char *path, dsc_train_config *cfg,
                            const drv_offload_budget *b, drv_offload_report *rep) {
  memset(rep, 0, sizeof *rep);
  ir_arena_init(&rep->arena, ctx);
  bool opt = cfg->offload.optimizer == DSC_OFFLOAD_AUTO;
  bool par = cfg->offload.param == DSC_OFFLOAD_AUTO;
  if (!opt && !par) return DSC_OK;
  rep->on = true;
  if (b->budget <= 0) {
    ir_error(ctx, ir_no_loc,
             "--offload-%s auto needs --memory-budget B: it offloads only what the budget "
             "requires",
             opt ? "optimizer" : "param");
    return DSC_ERR_USER;
  }
  dsc_context *sub = dsc_context_new(NULL, NULL);
  if (!sub) {
    ir_error(ctx, ir_no_loc, "offload auto: out of memory");
    return DSC_ERR_INTERNAL;
  }
  static const dsc_offload_value none_yet[1] = {{"", DSC_OFFLOAD_HOST}};
  cfg->offload.values = none_yet, cfg->offload.n_values = 0;
  candidate *cand = NULL;
  int n_cand = 0;
  dsc_status st = DSC_OK;
  for (;;) {
    one_plan p;
    dsc_diag_clear(sub);
    if ((st = plan_once(sub, path, cfg, b->threads, &p)) != DSC_OK) {
      for (int i = 0; i < dsc_diag_count(sub); i++) {
        const dsc_diag *d = dsc_diag_get(sub, i);
        if (d->severity == DSC_DIAG_ERROR) ir_diag(ctx, d->severity, d->loc, "%s", d->message);
      }
      break;
    }
    rep->n_plans++;
    const cg_memplan *mp = &p.plan;
    if (rep->n_plans == 1) { /* the candidates, and room for all of them in the list */
      rep->peak_none = mp->peak;
      for (int i = 0; i < p.n_params; i++) n_cand += p.is_candidate[i];
      cand = calloc((size_t)n_cand + 1, sizeof *cand);
      rep->values = ir_arena_alloc(&rep->arena, sizeof *rep->values * ((size_t)n_cand + 1));
      rep->bytes = ir_arena_alloc(&rep->arena, sizeof *rep->bytes * ((size_t)n_cand + 1));
      rep->next_use = ir_arena_alloc(&rep->arena, sizeof *rep->next_use * ((size_t)n_cand + 1));
      for (int i = 0, k = 0; cand && rep->values && rep->bytes && rep->next_use && i < p.n_params;
           i++)
        if (p.is_candidate[i]) {
          cand[k] = (candidate){i, ir_arena_strdup(&rep->arena, p.names[i]), 0, 0, -1};
          if (!cand[k++].name) rep->values = NULL;
        }
      if (!cand || !rep->values || !rep->bytes || !rep->next_use) {
        one_plan_free(&p);
        ir_error(ctx, ir_no_loc, "offload auto: out of memory");
        st = DSC_ERR_INTERNAL;
        break;
      }
      rep->n_candidates = n_cand;
      cfg->offload.values = rep->values;
    }
    rep->peak = mp->peak, rep->host_bytes = mp->host_bytes;
    bool dev_ok = mp->peak <= b->budget;
    bool host_ok = b->host_budget <= 0 || mp->host_bytes <= b->host_budget;
    if (dev_ok && host_ok) {
      one_plan_free(&p);
      break;
    }
    for (int k = 0; k < n_cand; k++) {
      int i = cand[k].param;
      cand[k].bytes = i < p.n_params ? p.bytes[i] : 0;
      cand[k].next_use = i < p.n_params ? p.next_use[i] : 0;
    }
    qsort(cand, (size_t)n_cand, sizeof *cand, cand_cmp);
    int picked = 0;
    if (!dev_ok) {
      /* device values, in order, until their bytes cover the excess */
      int64_t need = mp->peak - b->budget, got = 0, host = mp->host_arena;
      bool host_blocked = false;
      for (int k = 0; k < n_cand && got < need; k++) {
        candidate *c = &cand[k];
        if (c->moved >= 0 || c->bytes <= 0) continue;
        dsc_offload_tier t = DSC_OFFLOAD_HOST;
        if (b->host_budget > 0 && host + c->bytes > b->host_budget) {
          if (!b->disk) {
            host_blocked = true;
            continue;
          }
          t = DSC_OFFLOAD_DISK;
        }
        if (t == DSC_OFFLOAD_HOST) host += c->bytes;
        c->moved = rep->n;
        rep->values[rep->n] = (dsc_offload_value){c->name, t};
        rep->bytes[rep->n] = c->bytes, rep->next_use[rep->n] = c->next_use;
        rep->moved[t] += c->bytes;
        rep->n++, got += c->bytes, picked++;
      }
      if (picked == 0 && !b->lenient) fail_device(ctx, cfg, b, rep, mp, host_blocked);
    } else if (b->disk) {
      /* the device fits, the host does not: host values to disk, in order */
      int64_t need = mp->host_bytes - b->host_budget, got = 0;
      for (int k = 0; k < n_cand && got < need; k++) {
        candidate *c = &cand[k];
        if (c->moved < 0 || rep->values[c->moved].tier != DSC_OFFLOAD_HOST) continue;
        rep->values[c->moved].tier = DSC_OFFLOAD_DISK;
        rep->moved[DSC_OFFLOAD_HOST] -= c->bytes, rep->moved[DSC_OFFLOAD_DISK] += c->bytes;
        got += c->bytes, picked++;
      }
    }
    if (picked == 0 && dev_ok && !b->lenient) {
      char h[32], hb[32];
      mib(h, sizeof h, mp->host_bytes), mib(hb, sizeof hb, b->host_budget);
      ir_error(ctx, ir_no_loc,
               "offload auto: the step fits the memory budget with %d values offloaded, but they "
               "need %s of host memory per rank, over the host memory budget of %s%s",
               rep->n, h, hb,
               b->disk ? " even with every one on the disk tier (its staging is host memory "
                         "while a step runs)"
                       : "; --offload-dir DIR lets them go to the disk tier");
    }
    one_plan_free(&p);
    cfg->offload.n_values = rep->n;
    if (picked == 0) { /* nothing left to move */
      st = b->lenient ? DSC_OK : DSC_ERR_USER;
      break;
    }
  }
  free(cand);
  dsc_context_free(sub);
  cfg->offload.n_values = rep->n;
  return st;
}

void drv_offload_report_free(drv_offload_report *rep) {
  if (!rep) return;
  ir_arena_release(&rep->arena);
  memset(rep, 0, sizeof *rep);
}

char *drv_offload_report_text(ir_arena *a, const drv_offload_report *rep) {
  if (!rep->on) return NULL;
  char pn[32], pk[32], h[32], d[32];
  mib(pn, sizeof pn, rep->peak_none), mib(pk, sizeof pk, rep->peak);
  mib(h, sizeof h, rep->moved[DSC_OFFLOAD_HOST]), mib(d, sizeof d, rep->moved[DSC_OFFLOAD_DISK]);
  if (rep->n == 0)
    return ir_arena_printf(a,
                           "offload auto: nothing offloaded (%d candidates): the step's device "
                           "peak %s fits the budget",
                           rep->n_candidates, pn);
  return ir_arena_printf(a,
                         "offload auto: %d of %d values offloaded (host %s, disk %s): device "
                         "peak %s without offload, %s with (%d plans)",
                         rep->n, rep->n_candidates, h, d, pn, pk, rep->n_plans);
}

void drv_offload_report_to_plan(const drv_offload_report *rep, dsc_memory_plan *out) {
  out->offload_auto = rep->on;
  if (!rep->on) return;
  out->peak_no_offload = rep->peak_none;
  out->auto_candidates = rep->n_candidates, out->n_offloaded = rep->n;
  out->auto_plans = rep->n_plans;
  out->offloaded_host = rep->moved[DSC_OFFLOAD_HOST];
  out->offloaded_disk = rep->moved[DSC_OFFLOAD_DISK];
  for (int i = 0; i < rep->n && i < DSC_PLAN_OFFLOADED_MAX; i++) {
    dsc_plan_offloaded *v = &out->offloaded[i];
    snprintf(v->name, sizeof v->name, "%s", rep->values[i].name);
    v->tier = (int)rep->values[i].tier;
    v->bytes = rep->bytes[i], v->next_use = rep->next_use[i];
  }
}

dsc_status drv_offload_auto_keep(dsc_context *ctx, const char *path, dsc_train_config *cfg,
                                 const drv_offload_budget *b, ir_arena *keep, char **text) {
  drv_offload_report rep;
  dsc_status st = drv_offload_auto(ctx, path, cfg, b, &rep);
  *text = NULL;
  if (st == DSC_OK && rep.on) {
    dsc_offload_value *v = ir_arena_alloc(keep, sizeof *v * ((size_t)rep.n + 1));
    for (int i = 0; v && i < rep.n; i++)
      if (!(v[i].name = ir_arena_strdup(keep, rep.values[i].name)))
        v = NULL;
      else
        v[i].tier = rep.values[i].tier;
    if (v && (*text = drv_offload_report_text(keep, &rep)) != NULL) {
      cfg->offload.values = v;
    } else {
      ir_error(ctx, ir_no_loc, "offload auto: out of memory");
      st = DSC_ERR_INTERNAL;
    }
  }
  if (st != DSC_OK) cfg->offload.values = NULL, cfg->offload.n_values = 0;
  drv_offload_report_free(&rep);
  return st;
}
