/* The CPU executor: runs lowered programs (codegen/codegen.h) on host
 * arenas with a thread pool.
 *
 * Build, plan, then compute (ggml): rt_cpu_exec_new validates every program
 * against its arenas, allocates the arenas, resolves each instruction's
 * argument pointers and builds the GEMM plans; a run then only copies the
 * inputs in and walks the instruction list. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "runtime/runtime.h"

typedef struct {
  void *src, *dst;
  size_t bytes;
  const uint8_t *guard; /* the copy is skipped unless *guard == guard_if (NULL: always) */
  bool guard_if;
} rt_assign_copy;

typedef struct {
  const cg_program *p;
  const cg_cpu_kernel_fn *fns;
  char *work; /* the executor's WORK arena (one run at a time: shared) */
  int64_t work_bytes;
  char *host_work_raw, *host_work; /* the host work arena (host-placed temporaries) */
  int64_t host_work_bytes;
  void ***args;            /* per LAUNCH instruction: argument base pointers */
  rt_gemm_plan **plans;    /* per GEMM instruction */
  rt_assign_copy *assigns; /* non-in-place assigns */
  int n_assign_copies;
  int64_t *prof_ns;
  int64_t *prof_skips; /* per instruction: runs its guard skipped it */
  int64_t runs;
  dsc_comm_request **reqs;    /* per collective id: in flight (NULL once waited) */
  int64_t *coll_t0, *coll_t1; /* tracing: per collective id, its start and its wait's end */
  int *tier_reqs;             /* per disk transfer id: the offload file's transfer id */
  /* the host stream (cg_instr.host_stream): its instructions, and per
   * other instruction how many of them (in program order) must be done
   * before it runs (plan_host_waits) */
  int n_host;
  int *host_need;
} rt_prog;

/* Where an instruction runs: a pool and its per-chunk status slots. */
typedef struct {
  rt_pool *pool;
  int32_t *status;
} rt_lane;

struct rt_cpu_exec {
  dsc_context *ctx;
  ir_arena arena; /* bookkeeping (not the big arenas) */
  rt_pool *pool;
  rt_gemm_engine *gemm;
  char *state_raw, *state;
  int64_t state_bytes;
  char *work_raw, *work; /* the largest program's WORK arena, shared by all */
  int64_t work_bytes;
  /* offload tiers (cg_tier): [0] unused (the STATE arena), [1] host,
   * [2] the disk tier's staging (runtime/exec.c fills it from the file) */
  char *tier_raw[CG_TIER_COUNT], *tier_base[CG_TIER_COUNT];
  int64_t tier_bytes[CG_TIER_COUNT];
  int n_progs;
  rt_prog *progs;
  rt_lane lane; /* the executor's thread and pool */
  /* the host stream (runtime/host_stream.c) and its pool; the program it
   * runs now (set before the run's first post) */
  rt_host_stream *hs;
  rt_lane hs_lane;
  rt_prog *hs_prog;
  /* whether the stream's thread runs them (host_stream_on): -1 until the
   * first run that has any decides it, then 0 (in their place) or 1 */
  int hs_on;
  bool profiling;
  dsc_comm *comm;   /* collectives (rt_cpu_exec_set_comm); not owned */
  int64_t tag;      /* >= 0: every collective's tag (rt_cpu_exec_set_tag), else its own */
  dsc_trace *trace; /* rt_cpu_exec_set_trace; not owned */
  int trace_pid;
  /* the disk tier (rt_cpu_exec_set_offload): the file, not owned, and per
   * module param its value index in it (-1: not on disk) */
  rt_offload *disk;
  int *disk_value, n_disk_params;
};

/* ---- creation ---- */

/* The tag a collective travels with: the step (rt_cpu_exec_set_tag), so
 * that a failure names it, else the one compiled into the program. */
static int64_t coll_tag(const rt_cpu_exec *e, const cg_collective *c) {
  return e->tag >= 0 ? e->tag : c->tag;
}

void rt_cpu_exec_set_tag(rt_cpu_exec *e, int64_t tag) { e->tag = tag; }

/* Arenas of at least one huge page are aligned to 2 MiB and advised to the
 * kernel as huge-page memory (before the first touch). Why: on the KVM
 * guests we measure on, every TLB miss is a two-level page walk; with 4 KiB
 * pages the GEMMs' packing and the optimizer's streams lose 20-60% to them
 * (runtime/sgemm.c's comment has the figures). Smaller arenas: 64 bytes. */
#define RT_HUGE_PAGE ((int64_t)2 << 20)

static int64_t arena_slack(int64_t bytes) { return bytes >= RT_HUGE_PAGE ? RT_HUGE_PAGE : 64; }

static char *alloc_aligned(dsc_context *ctx, int64_t bytes, char **raw) {
  int64_t slack = arena_slack(bytes);
  *raw = NULL;
  if (bytes < 0 || bytes > INT64_MAX - slack) return NULL;
  *raw = ir_alloc(ctx, (size_t)(bytes + slack));
  if (!*raw) return NULL;
  char *p = (char *)(((uintptr_t)*raw + (uintptr_t)slack - 1) & ~((uintptr_t)slack - 1));
#ifdef MADV_HUGEPAGE
  /* a hint: whole huge pages inside the allocation only; failure is fine */
  if (slack == RT_HUGE_PAGE)
    (void)madvise(p, (size_t)(bytes / RT_HUGE_PAGE * RT_HUGE_PAGE), MADV_HUGEPAGE);
#endif
  memset(*raw, 0, (size_t)(bytes + slack));
  return p;
}

static char *buf_ptr(const rt_cpu_exec *e, const rt_prog *rp, int b) {
  const cg_buffer *cb = &rp->p->buffers[b];
  if (cb->kind == CG_BUF_PARAM && cb->tier > 0)
    return e->tier_base[cb->tier] ? e->tier_base[cb->tier] + cb->offset : NULL; /* disk: none */
  if (cb->kind == CG_BUF_TEMP && cb->tier == CG_TIER_HOST) return rp->host_work + cb->offset;
  return (cb->kind == CG_BUF_PARAM ? e->state : rp->work) + cb->offset;
}

/* Formats a validation problem of program pi as one diagnostic. */
static bool bad(rt_cpu_exec *e, const cg_program *p, int ins, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static bool bad(rt_cpu_exec *e, const cg_program *p, int ins, const char *fmt, ...) {
  char msg[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  const char *name = p->graph_name ? p->graph_name : "?";
  if (ins >= 0)
    ir_error(e->ctx, ir_no_loc, "program '%s': instruction %d: %s", name, ins, msg);
  else
    ir_error(e->ctx, ir_no_loc, "program '%s': %s", name, msg);
  return false;
}

/* What this executor adds to cg_program_verify: each kernel's compiled
 * entry and its argument pointers, each GEMM's plan, the assign copies. */
static bool plan_instr(rt_cpu_exec *e, rt_prog *rp, int i) {
  const cg_program *p = rp->p;
  const cg_instr *in = &p->instrs[i];
  if (in->kind == CG_INS_LAUNCH) {
    const cg_kernel_info *k = &p->kernel_info[in->kernel];
    if (!rp->fns[in->kernel]) return bad(e, p, i, "kernel '%s' is not compiled", k->name);
    void **args = ir_arena_alloc(&e->arena, sizeof *args * (size_t)(k->n_args + 1));
    if (!args) return false;
    for (int a = 0; a < k->n_args; a++) args[a] = buf_ptr(e, rp, in->args[a]);
    /* a kernel compiled with noalias pointers: its arguments' bytes must be
     * apart, or its vectorised loops would read stale values */
    for (int a = 0; k->distinct_args && a < k->n_args; a++)
      for (int b = 0; b < a; b++) {
        const char *pa = args[a], *pb = args[b];
        size_t na = (size_t)k->args[a].numel * dsc_dtype_size(k->args[a].dtype),
               nb = (size_t)k->args[b].numel * dsc_dtype_size(k->args[b].dtype);
        if (pa && pb && na > 0 && nb > 0 && pa < pb + nb && pb < pa + na)
          return bad(e, p, i,
                     "kernel '%s' takes distinct arguments, but arguments %d and %d overlap",
                     k->name, b, a);
      }
    rp->args[i] = args;
  } else if (in->kind == CG_INS_GEMM) {
    const cg_gemm *g = &in->gemm;
    rp->plans[i] = rt_gemm_plan_new(e->gemm, g, p->buffers[g->a.buffer].dtype,
                                    p->buffers[g->c.buffer].dtype, 0);
    return rp->plans[i] != NULL;
  }
  return true;
}

/* ---- the host stream's waits ---- */

/* Bytes an instruction reads or writes: a whole buffer (a view's access
 * stays inside its buffer; a kernel argument may reach numel elements). */
typedef struct {
  const char *lo, *hi;
  bool write;
} rt_span;

#define RT_MAX_SPANS 64

static int add_span(const rt_cpu_exec *e, const rt_prog *rp, int b, int64_t numel, bool write,
                    rt_span *out, int n) {
  if (b < 0 || n >= RT_MAX_SPANS) return n;
  const cg_buffer *cb = &rp->p->buffers[b];
  const char *lo = buf_ptr(e, rp, b);
  int64_t elems = cb->numel > numel ? cb->numel : numel;
  if (!lo || elems <= 0) return n;
  out[n] = (rt_span){lo, lo + elems * (int64_t)dsc_dtype_size(cb->dtype), write};
  return n + 1;
}

/* The spans of instruction i, or -1 when it has more than RT_MAX_SPANS
 * (then it conflicts with everything). */
static int instr_spans(const rt_cpu_exec *e, const rt_prog *rp, int i, rt_span *out) {
  const cg_program *p = rp->p;
  const cg_instr *in = &p->instrs[i];
  int n = in->guarded ? add_span(e, rp, in->guard, 0, false, out, 0) : 0; /* read first */
  switch (in->kind) {
    case CG_INS_LAUNCH: {
      const cg_kernel_info *k = &p->kernel_info[in->kernel];
      if (n + k->n_args > RT_MAX_SPANS) return -1;
      for (int a = 0; a < k->n_args; a++)
        n = add_span(e, rp, in->args[a], k->args[a].numel, k->args[a].written, out, n);
      return n;
    }
    case CG_INS_GEMM:
      n = add_span(e, rp, in->gemm.a.buffer, 0, false, out, n);
      n = add_span(e, rp, in->gemm.b.buffer, 0, false, out, n);
      return add_span(e, rp, in->gemm.c.buffer, 0, true, out, n);
    case CG_INS_COLLECTIVE_START:
    case CG_INS_COLLECTIVE_WAIT: /* in flight in between: both written */
      n = add_span(e, rp, in->src, 0, true, out, n);
      return add_span(e, rp, in->dst, 0, true, out, n);
    case CG_INS_TIER_START:
    case CG_INS_TIER_WAIT:
      return add_span(e, rp, in->src, 0, true, out, n);
    case CG_INS_EMBEDDING_GRAD:
    case CG_INS_SET_ROWS:
    case CG_INS_COPY:
      n = add_span(e, rp, in->ids, 0, false, out, n);
      n = add_span(e, rp, in->src, 0, false, out, n);
      return add_span(e, rp, in->dst, 0, true, out, n);
  }
  return -1;
}

static bool spans_conflict(const rt_span *a, int na, const rt_span *b, int nb) {
  if (na < 0 || nb < 0) return true;
  for (int i = 0; i < na; i++)
    for (int j = 0; j < nb; j++)
      if ((a[i].write || b[j].write) && a[i].lo < b[j].hi && b[j].lo < a[i].hi) return true;
  return false;
}

/* host_need[i] for each instruction off the stream: the host-stream
 * instructions before it in program order (the stream runs them in that
 * order) up to the last one whose bytes meet its own with a write on
 * either side. Placement reuses a buffer's bytes once its last reader is
 * done in program order; on the stream "done" comes later, so reuse is
 * a conflict like any other. */
static bool plan_host_waits(rt_cpu_exec *e, rt_prog *rp) {
  const cg_program *p = rp->p;
  rp->n_host = 0;
  for (int i = 0; i < p->n_instrs; i++) rp->n_host += p->instrs[i].host_stream;
  if (rp->n_host == 0) return true;
  rp->host_need = ir_arena_alloc(&e->arena, sizeof(int) * (size_t)p->n_instrs);
  size_t spans_size = sizeof(rt_span) * RT_MAX_SPANS * (size_t)rp->n_host;
  rt_span *spans = ir_alloc(e->ctx, spans_size); /* per host instruction, RT_MAX_SPANS apart */
  int *n_spans = ir_alloc(e->ctx, sizeof(int) * (size_t)rp->n_host);
  bool ok = rp->host_need && spans && n_spans;
  int posted = 0, covered = 0; /* host instructions before i; of them, known done */
  rt_span mine[RT_MAX_SPANS];
  for (int i = 0; ok && i < p->n_instrs; i++) {
    rp->host_need[i] = 0;
    if (p->instrs[i].host_stream) {
      n_spans[posted] = instr_spans(e, rp, i, spans + (size_t)posted * RT_MAX_SPANS);
      posted++;
      continue;
    }
    int nm = instr_spans(e, rp, i, mine);
    for (int h = posted - 1; h >= covered; h--)
      if (spans_conflict(mine, nm, spans + (size_t)h * RT_MAX_SPANS, n_spans[h])) {
        covered = h + 1;
        rp->host_need[i] = covered;
        break;
      }
  }
  if (spans) ir_free(e->ctx, spans, spans_size);
  if (n_spans) ir_free(e->ctx, n_spans, sizeof(int) * (size_t)rp->n_host);
  if (!ok) ir_error(e->ctx, ir_no_loc, "out of memory planning the host stream");
  return ok;
}

static bool plan_prog(rt_cpu_exec *e, rt_prog *rp) {
  const cg_program *p = rp->p;
  cg_verify_limits lim = {{e->state_bytes, e->tier_bytes[CG_TIER_HOST], e->tier_bytes[CG_TIER_DISK]},
                          true, NULL};
  if (!cg_program_verify(e->ctx, p, &lim)) return false;
  rp->work_bytes = p->arena_bytes[CG_ARENA_WORK];
  rp->work = e->work;
  rp->host_work_bytes = p->host_work_bytes;
  if (rp->host_work_bytes > 0 &&
      !(rp->host_work = alloc_aligned(e->ctx, rp->host_work_bytes, &rp->host_work_raw))) {
    ir_error(e->ctx, ir_no_loc,
             "out of memory loading program '%s' (host work arena %" PRId64 " bytes)",
             p->graph_name ? p->graph_name : "?", rp->host_work_bytes);
    return false;
  }
  size_t n = (size_t)(p->n_instrs > 0 ? p->n_instrs : 1);
  rp->args = ir_arena_alloc(&e->arena, sizeof *rp->args * n);
  rp->plans = ir_arena_alloc(&e->arena, sizeof *rp->plans * n);
  rp->prof_ns = ir_arena_alloc(&e->arena, sizeof *rp->prof_ns * n);
  rp->prof_skips = ir_arena_alloc(&e->arena, sizeof *rp->prof_skips * n);
  rp->assigns = ir_arena_alloc(&e->arena, sizeof *rp->assigns * (size_t)(p->n_assigns + 1));
  rp->reqs = ir_arena_alloc(&e->arena, sizeof *rp->reqs * (size_t)(p->n_collectives + 1));
  rp->tier_reqs = ir_arena_alloc(&e->arena, sizeof(int) * (size_t)(p->n_tier_ios + 1));
  if (!rp->work || !rp->args || !rp->plans || !rp->prof_ns || !rp->prof_skips || !rp->assigns || !rp->reqs ||
      !rp->tier_reqs) {
    ir_error(e->ctx, ir_no_loc, "out of memory loading program '%s' (WORK arena %" PRId64 " bytes)",
             p->graph_name ? p->graph_name : "?", rp->work_bytes);
    return false;
  }
  memset(rp->reqs, 0, sizeof *rp->reqs * (size_t)(p->n_collectives + 1));
  for (int i = 0; i < p->n_instrs; i++)
    if (!plan_instr(e, rp, i)) return false;
  if (!plan_host_waits(e, rp)) return false;
  for (int a = 0; a < p->n_assigns; a++) {
    const cg_assign *as = &p->assigns[a];
    if (as->in_place) continue;
    int pb = cg_param_buffer(p, as->param);
    rt_assign_copy *c = &rp->assigns[rp->n_assign_copies++];
    c->src = buf_ptr(e, rp, as->buffer);
    c->dst = buf_ptr(e, rp, pb);
    c->bytes = (size_t)p->buffers[pb].numel * dsc_dtype_size(p->buffers[pb].dtype);
    c->guard = as->guarded ? (const uint8_t *)buf_ptr(e, rp, as->guard) : NULL;
    c->guard_if = as->guard_if;
  }
  return true;
}

static bool host_item(void *arg, int item, bool poster, char *err, size_t errlen);

/* The host stream, when a program has instructions for it: its own thread
 * and no more (a pool of one), since on the CPU the "device" and the host
 * are the same cores: beside the executor's threads it takes one core's
 * share; what the executor waits for it runs on the executor's threads
 * (rt_host_stream_wait helps). */
static bool start_host_stream(rt_cpu_exec *e) {
  int max_items = 0;
  for (int i = 0; i < e->n_progs; i++)
    if (e->progs[i].n_host > max_items) max_items = e->progs[i].n_host;
  e->hs_on = -1;
  if (max_items == 0) return true;
  int threads = 1;
  e->hs_lane.pool = rt_pool_new_pthreads(e->ctx, threads);
  e->hs_lane.status = ir_arena_alloc(&e->arena, sizeof(int32_t) * (size_t)threads);
  if (!e->hs_lane.pool || !e->hs_lane.status) return false;
  e->hs = rt_host_stream_new(e->ctx, max_items, host_item, e);
  return e->hs != NULL;
}

rt_cpu_exec *rt_cpu_exec_new(dsc_context *ctx, const cg_program *const *progs, int n_progs,
                             cg_cpu_kernel_fn *const *fns, int n_threads, int64_t state_bytes) {
  int64_t tiers[CG_TIER_COUNT] = {state_bytes, 0, 0};
  return rt_cpu_exec_new_tiered(ctx, progs, n_progs, fns, n_threads, tiers);
}

rt_cpu_exec *rt_cpu_exec_new_tiered(dsc_context *ctx, const cg_program *const *progs,
                                    int n_progs, cg_cpu_kernel_fn *const *fns, int n_threads,
                                    const int64_t *tier_bytes) {
  int64_t state_bytes = tier_bytes[0];
  if (n_progs < 0 || state_bytes < 0 || tier_bytes[1] < 0 || tier_bytes[2] < 0) {
    ir_error(ctx, ir_no_loc, "CPU executor: bad arguments");
    return NULL;
  }
  rt_cpu_exec *e = ir_alloc(ctx, sizeof *e);
  if (!e) {
    ir_error(ctx, ir_no_loc, "out of memory creating the CPU executor");
    return NULL;
  }
  memset(e, 0, sizeof *e);
  e->tag = -1;
  e->ctx = ctx;
  ir_arena_init(&e->arena, ctx);
  e->state_bytes = state_bytes;
  e->n_progs = n_progs;
  /* Our own workers, not OpenMP's team: with kernels on the OpenMP pool a GPT-2
   * step under CPU load sometimes gave a different (once NaN) loss; the
   * pthread pool was right in every run (docs/performance.md). */
  e->lane.pool = rt_pool_new_pthreads(ctx, n_threads);
  if (!e->lane.pool) goto fail;
  e->gemm = rt_gemm_engine_new(ctx, e->lane.pool);
  if (!e->gemm) goto fail;
  e->state = alloc_aligned(ctx, state_bytes, &e->state_raw);
  for (int t = 1; t < CG_TIER_COUNT; t++) {
    e->tier_bytes[t] = tier_bytes[t];
    if (tier_bytes[t] > 0 && !(e->tier_base[t] = alloc_aligned(ctx, tier_bytes[t], &e->tier_raw[t]))) {
      ir_error(ctx, ir_no_loc, "out of memory creating the CPU executor (%s arena %" PRId64 " bytes)",
               t == CG_TIER_HOST ? "host" : "disk staging", tier_bytes[t]);
      goto fail;
    }
  }
  /* Programs run one at a time (a step's micro_step then train_step), so
   * they share one WORK arena: the memory plan counts the largest. */
  for (int i = 0; i < n_progs; i++)
    if (progs[i]->arena_bytes[CG_ARENA_WORK] > e->work_bytes)
      e->work_bytes = progs[i]->arena_bytes[CG_ARENA_WORK];
  if (!(e->work = alloc_aligned(ctx, e->work_bytes, &e->work_raw))) {
    ir_error(ctx, ir_no_loc, "out of memory creating the CPU executor (WORK arena %" PRId64 " bytes)",
             e->work_bytes);
    goto fail;
  }
  e->progs = ir_arena_alloc(&e->arena, sizeof *e->progs * (size_t)(n_progs + 1));
  e->lane.status = ir_arena_alloc(&e->arena, sizeof(int32_t) * (size_t)n_threads);
  if (!e->state || !e->progs || !e->lane.status) {
    ir_error(ctx, ir_no_loc,
             "out of memory creating the CPU executor (STATE arena %" PRId64 " bytes)",
             state_bytes);
    goto fail;
  }
  for (int i = 0; i < n_progs; i++) {
    e->progs[i].p = progs[i];
    e->progs[i].fns = fns ? fns[i] : NULL;
    if (!e->progs[i].fns && progs[i]->n_kernels > 0) {
      ir_error(ctx, ir_no_loc, "CPU executor: program %d has no compiled kernels", i);
      goto fail;
    }
    if (!plan_prog(e, &e->progs[i])) goto fail;
  }
  if (!start_host_stream(e)) goto fail;
  return e;
fail:
  rt_cpu_exec_free(e);
  return NULL;
}

void rt_cpu_exec_free(rt_cpu_exec *e) {
  if (!e) return;
  rt_cpu_exec_set_offload(e, NULL, NULL, 0);
  for (int i = 0; e->progs && i < e->n_progs; i++) {
    rt_prog *rp = &e->progs[i];
    if (rp->plans)
      for (int j = 0; j < rp->p->n_instrs; j++) rt_gemm_plan_free(rp->plans[j]);
    if (rp->host_work_raw)
      ir_free(e->ctx, rp->host_work_raw,
              (size_t)(rp->host_work_bytes + arena_slack(rp->host_work_bytes)));
  }
  if (e->state_raw)
    ir_free(e->ctx, e->state_raw, (size_t)(e->state_bytes + arena_slack(e->state_bytes)));
  if (e->work_raw)
    ir_free(e->ctx, e->work_raw, (size_t)(e->work_bytes + arena_slack(e->work_bytes)));
  for (int t = 1; t < CG_TIER_COUNT; t++)
    if (e->tier_raw[t])
      ir_free(e->ctx, e->tier_raw[t], (size_t)(e->tier_bytes[t] + arena_slack(e->tier_bytes[t])));
  rt_gemm_engine_free(e->gemm);
  rt_host_stream_free(e->hs); /* joins its thread before its pool goes */
  rt_pool_free(e->hs_lane.pool);
  rt_pool_free(e->lane.pool);
  ir_arena_release(&e->arena);
  ir_free(e->ctx, e, sizeof *e);
}

void *rt_cpu_exec_state(rt_cpu_exec *e) { return e->state; }

static void add_resident(int64_t *sum, const void *p, int64_t bytes) {
  int64_t r = rt_resident_bytes(p, (size_t)bytes);
  *sum = *sum < 0 || r < 0 ? -1 : *sum + r;
}

void rt_cpu_exec_memory(const rt_cpu_exec *e, int64_t *arenas, int64_t *arenas_resident,
                        int64_t *scratch_resident) {
  int64_t all = e->state_bytes + e->work_bytes, res = 0;
  add_resident(&res, e->state, e->state_bytes);
  add_resident(&res, e->work, e->work_bytes);
  for (int t = 1; t < CG_TIER_COUNT; t++)
    if (e->tier_base[t]) all += e->tier_bytes[t], add_resident(&res, e->tier_base[t], e->tier_bytes[t]);
  for (int i = 0; i < e->n_progs; i++)
    if (e->progs[i].host_work)
      all += e->progs[i].host_work_bytes,
          add_resident(&res, e->progs[i].host_work, e->progs[i].host_work_bytes);
  *arenas = all, *arenas_resident = res;
  *scratch_resident = rt_gemm_engine_scratch_resident(e->gemm);
}

void *rt_cpu_exec_tier(rt_cpu_exec *e, int tier) {
  if (tier <= 0 || tier >= CG_TIER_COUNT) return tier == 0 ? e->state : NULL;
  return e->tier_base[tier];
}

void rt_cpu_exec_release_tier(rt_cpu_exec *e, int tier) {
#ifdef MADV_DONTNEED
  /* whole pages inside the arena only: the kernel frees them, the next
   * touch maps zero pages (the disk staging is refilled before each run) */
  if (tier <= 0 || tier >= CG_TIER_COUNT || !e->tier_base[tier]) return;
  uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
  uintptr_t lo = ((uintptr_t)e->tier_base[tier] + pg - 1) & ~(pg - 1);
  uintptr_t hi = ((uintptr_t)e->tier_base[tier] + (uintptr_t)e->tier_bytes[tier]) & ~(pg - 1);
  if (hi > lo) (void)madvise((void *)lo, hi - lo, MADV_DONTNEED);
#else
  (void)e, (void)tier;
#endif
}

void rt_cpu_exec_set_comm(rt_cpu_exec *e, dsc_comm *comm) { e->comm = comm; }

bool rt_cpu_exec_set_trace(rt_cpu_exec *e, dsc_trace *trace, int pid) {
  for (int i = 0; trace && i < e->n_progs; i++) {
    rt_prog *rp = &e->progs[i];
    int n = rp->p->n_collectives;
    if (rp->coll_t0 || n <= 0) continue;
    rp->coll_t0 = ir_arena_alloc(&e->arena, sizeof(int64_t) * (size_t)n);
    rp->coll_t1 = ir_arena_alloc(&e->arena, sizeof(int64_t) * (size_t)n);
    if (!rp->coll_t0 || !rp->coll_t1) {
      rp->coll_t0 = rp->coll_t1 = NULL;
      ir_error(e->ctx, ir_no_loc, "out of memory setting up the trace");
      return false;
    }
  }
  e->trace = trace;
  e->trace_pid = pid;
  return true;
}

void rt_cpu_exec_set_profiling(rt_cpu_exec *e, bool on) {
  if (on && !e->profiling)
    for (int i = 0; i < e->n_progs; i++) {
      memset(e->progs[i].prof_ns, 0, sizeof(int64_t) * (size_t)e->progs[i].p->n_instrs);
      memset(e->progs[i].prof_skips, 0, sizeof(int64_t) * (size_t)e->progs[i].p->n_instrs);
      e->progs[i].runs = 0;
    }
  e->profiling = on;
}

const int64_t *rt_cpu_exec_profile(const rt_cpu_exec *e, int prog, int *n, int64_t *runs) {
  if (prog < 0 || prog >= e->n_progs) {
    *n = 0;
    *runs = 0;
    return NULL;
  }
  *n = e->progs[prog].p->n_instrs;
  *runs = e->progs[prog].runs;
  return e->progs[prog].prof_ns;
}

const int64_t *rt_cpu_exec_profile_skips(const rt_cpu_exec *e, int prog) {
  return prog >= 0 && prog < e->n_progs ? e->progs[prog].prof_skips : NULL;
}

const rt_gemm_plan *rt_cpu_exec_gemm_plan(const rt_cpu_exec *e, int prog, int ins) {
  if (prog < 0 || prog >= e->n_progs || ins < 0 || ins >= e->progs[prog].p->n_instrs) return NULL;
  return e->progs[prog].plans[ins];
}

/* ---- running ---- */

typedef struct {
  cg_cpu_kernel_fn fn;
  void *const *args;
  int32_t *status;
} launch_job;

static void launch_range(void *arg, int64_t begin, int64_t end, int chunk) {
  launch_job *j = arg;
  j->fn(j->args, begin, end, &j->status[chunk]);
}

/* Outer index count and the smallest chunk worth a thread: about 16K inner
 * points (times stages) per chunk, so tiny kernels stay on one thread. */
static void launch_split(const cg_kernel_info *k, int64_t *outer, int64_t *min_chunk) {
  int64_t work = k->inner_work;
  *outer = k->outer;
  *min_chunk = work >= 16384 ? 1 : 16384 / (work > 0 ? work : 1);
}

typedef struct {
  const cg_instr *in;
  const char *ids;
  bool ids64;
  const char *src;
  char *dst;
  dsc_dtype src_dt, dst_dt;
  int32_t *status;
  int64_t bad_id, bad_pos; /* the first id out of range (chunk 0 records it) */
} embgrad_job;             /* and set_rows' */

static void embgrad_zero(void *arg, int64_t begin, int64_t end, int chunk) {
  (void)chunk;
  embgrad_job *j = arg;
  size_t es = dsc_dtype_size(j->dst_dt);
  memset(j->dst + begin * (int64_t)es, 0, (size_t)(end - begin) * es); /* +0 in every float */
}

/* Element i of a buffer of dtype dt (program/elem.c). */
static double load_float(const char *base, dsc_dtype dt, int64_t i) {
  return cg_load_elem(dt, base + i * (int64_t)dsc_dtype_size(dt));
}

static void store_float(char *base, dsc_dtype dt, int64_t i, double v) {
  cg_store_elem(dt, base + i * (int64_t)dsc_dtype_size(dt), v);
}

/* One row of the accumulation: a bf16 or f32 src into an f32 dst, or a
 * bf16 src into a bf16 dst; each add in f32, then rounded into dst's dtype.
 * That is the reference's double add rounded once: two bf16 values sum
 * exactly in f32 unless their exponents are over 16 apart, and then the
 * f32 rounding stays far from a bf16 halfway point. (An f32 src into a bf16
 * dst could round twice: it takes the generic path.) */
static void embgrad_row_f32_bf16(char *dst, bool dst_bf16, const char *src, bool src_bf16,
                                 int64_t begin, int64_t end) {
  for (int64_t c = begin; c < end; c++) {
    float sv = src_bf16 ? cg_f32_of_bf16(((const uint16_t *)src)[c]) : ((const float *)src)[c];
    if (dst_bf16) {
      uint16_t *d = (uint16_t *)dst + c;
      *d = cg_bf16_of_f32(cg_f32_of_bf16(*d) + sv);
    } else {
      ((float *)dst)[c] += sv;
    }
  }
}

/* Columns [begin, end) of every row: each element of dst is written by one
 * thread, accumulating the ids in order, so the sums are deterministic (and
 * equal to the sequential loop's, rounding to dst's dtype after each add). */
static void embgrad_cols(void *arg, int64_t begin, int64_t end, int chunk) {
  embgrad_job *j = arg;
  const cg_instr *in = j->in;
  for (int64_t i = 0; i < in->n_ids; i++) {
    int64_t id = j->ids64 ? ((const int64_t *)j->ids)[i] : ((const int32_t *)j->ids)[i];
    if (id < 0 || id >= in->rows) {
      if (chunk == 0 && !j->status[0]) {
        j->bad_id = id;
        j->bad_pos = i;
      }
      j->status[chunk] = 1;
      continue;
    }
    if (j->src_dt == DSC_F32 && j->dst_dt == DSC_F32) {
      const float *s = (const float *)j->src + i * in->cols;
      float *d = (float *)j->dst + id * in->cols;
      for (int64_t c = begin; c < end; c++) d[c] += s[c];
    } else if (j->src_dt == DSC_F64 && j->dst_dt == DSC_F64) {
      const double *s = (const double *)j->src + i * in->cols;
      double *d = (double *)j->dst + id * in->cols;
      for (int64_t c = begin; c < end; c++) d[c] += s[c];
    } else if ((j->src_dt == DSC_BF16 && j->dst_dt == DSC_BF16) ||
               (j->src_dt == DSC_BF16 && j->dst_dt == DSC_F32)) {
      size_t ss = dsc_dtype_size(j->src_dt), ds = dsc_dtype_size(j->dst_dt);
      embgrad_row_f32_bf16(j->dst + (size_t)(id * in->cols) * ds, j->dst_dt == DSC_BF16,
                           j->src + (size_t)(i * in->cols) * ss, j->src_dt == DSC_BF16, begin, end);
    } else {
      for (int64_t c = begin; c < end; c++) {
        int64_t di = id * in->cols + c;
        store_float(
            j->dst, j->dst_dt, di,
            load_float(j->dst, j->dst_dt, di) + load_float(j->src, j->src_dt, i * in->cols + c));
      }
    }
  }
}

/* set_rows (the same job): columns [begin, end) of each row written, ids in
 * order (a later duplicate wins, as in the reference); ids outside [0,
 * rows) write nothing. */
static void set_rows_cols(void *arg, int64_t begin, int64_t end, int chunk) {
  (void)chunk;
  const embgrad_job *j = arg;
  const cg_instr *in = j->in;
  size_t es = dsc_dtype_size(j->dst_dt);
  for (int64_t i = 0; i < in->n_ids; i++) {
    int64_t id = j->ids64 ? ((const int64_t *)j->ids)[i] : ((const int32_t *)j->ids)[i];
    if (id < 0 || id >= in->rows) continue;
    memcpy(j->dst + (size_t)(id * in->cols + begin) * es,
           j->src + (size_t)(i * in->cols + begin) * es, (size_t)(end - begin) * es);
  }
}

/* The job of an embedding_grad or set_rows instruction. */
static embgrad_job rows_job(const rt_cpu_exec *e, const rt_prog *rp, const cg_instr *in,
                            int32_t *status) {
  const cg_program *p = rp->p;
  embgrad_job j = {in,
                   buf_ptr(e, rp, in->ids),
                   p->buffers[in->ids].dtype == DSC_I64,
                   buf_ptr(e, rp, in->src),
                   buf_ptr(e, rp, in->dst),
                   p->buffers[in->src].dtype,
                   p->buffers[in->dst].dtype,
                   status,
                   0,
                   0};
  return j;
}

typedef struct {
  const char *src;
  char *dst;
} copy_job;

static void copy_range(void *arg, int64_t begin, int64_t end, int chunk) {
  (void)chunk;
  copy_job *j = arg;
  memcpy(j->dst + begin, j->src + begin, (size_t)(end - begin));
}

static bool any_status(const rt_lane *lane) {
  int32_t s = 0;
  for (int t = 0; t < rt_pool_threads(lane->pool); t++) s |= lane->status[t];
  return s != 0;
}

static const char *instr_op(const cg_instr *in) {
  if (in->op) return in->op;
  switch (in->kind) {
    case CG_INS_LAUNCH:
      return "kernel";
    case CG_INS_GEMM:
      return "matmul";
    case CG_INS_EMBEDDING_GRAD:
      return "embedding gradient";
    case CG_INS_SET_ROWS:
      return "set rows";
    case CG_INS_COPY:
      return "copy";
    case CG_INS_COLLECTIVE_START:
      return "collective start";
    case CG_INS_COLLECTIVE_WAIT:
      return "collective wait";
    case CG_INS_TIER_START:
      return "disk transfer start";
    case CG_INS_TIER_WAIT:
      return "disk transfer wait";
  }
  return "?";
}

/* The communicator's message for a failed collective (its last diagnostic,
 * on the rank's context), into err with the instruction. */
static bool comm_fail(rt_cpu_exec *e, const cg_instr *in, int i, char *err, size_t errlen) {
  dsc_context *cc = dsc_comm_context(e->comm);
  int nd = dsc_diag_count(cc);
  if (cc != e->ctx && nd > 0)
    return ir_fail(err, errlen, "%s (instruction %d): %s", instr_op(in), i,
                   dsc_diag_get(cc, nd - 1)->message);
  return ir_fail(err, errlen, "%s (instruction %d): the collective failed%s", instr_op(in), i,
                 nd > 0 ? " (see the previous message)" : "");
}

static bool run_collective(rt_cpu_exec *e, rt_prog *rp, int i, char *err, size_t errlen) {
  const cg_instr *in = &rp->p->instrs[i];
  const cg_collective *c = &in->coll;
  dsc_comm_request **req = &rp->reqs[c->id];
  if (in->kind == CG_INS_COLLECTIVE_WAIT) {
    dsc_comm_request *r = *req;
    *req = NULL;
    if (r && dsc_comm_wait(r) != DSC_OK) return comm_fail(e, in, i, err, errlen);
    return true;
  }
  const char *src = buf_ptr(e, rp, in->src);
  char *dst = buf_ptr(e, rp, in->dst);
  dsc_comm *g = dsc_comm_group(e->comm, c->group); /* check_comm found it */
  dsc_status st;
  switch (c->kind) {
    case CG_COLL_ALL_REDUCE:
      st = dsc_comm_all_reduce_start(g, src, dst, c->count, c->dtype, (dsc_comm_op)c->op,
                                     coll_tag(e, c), req);
      break;
    case CG_COLL_REDUCE_SCATTER:
      st = dsc_comm_reduce_scatter_start(g, src, dst, c->count, c->dtype, (dsc_comm_op)c->op,
                                         coll_tag(e, c), req);
      break;
    case CG_COLL_ALL_GATHER:
      st = dsc_comm_all_gather_start(g, src, dst, c->count, c->dtype, coll_tag(e, c), req);
      break;
    case CG_COLL_BROADCAST:
      st = dsc_comm_broadcast_start(g, dst, c->count, c->dtype, c->root, coll_tag(e, c), req);
      break;
    case CG_COLL_ALL_TO_ALL:
      st = dsc_comm_all_to_all_start(g, src, dst, c->count, c->dtype, coll_tag(e, c), req);
      break;
    default:
      return ir_fail(err, errlen, "instruction %d: unknown collective kind", i);
  }
  if (st != DSC_OK) {
    *req = NULL;
    return comm_fail(e, in, i, err, errlen);
  }
  return true;
}

/* Collectives need a communicator of each op's world; checked before
 * anything starts (as the interpreter does). */
static bool check_comm(rt_cpu_exec *e, const cg_program *p, char *err, size_t errlen) {
  for (int i = 0; i < p->n_instrs; i++) {
    const cg_instr *in = &p->instrs[i];
    if (in->kind != CG_INS_COLLECTIVE_START && !(in->kind == CG_INS_COPY && in->src_rank_chunk))
      continue;
    if (!e->comm)
      return ir_fail(err, errlen,
                     "the program has collective ops (%s at instruction %d); run it with a "
                     "communicator (dsc_exec_set_comm)",
                     instr_op(in), i);
    const char *group = in->coll.group;
    dsc_comm *g = dsc_comm_group(e->comm, group);
    if (!g)
      return ir_fail(err, errlen,
                     "%s (instruction %d) runs over group '%s', but the communicator has no mesh "
                     "with that axis (dsc_mesh_new, --mesh)",
                     instr_op(in), i, group);
    if (in->coll.world != dsc_comm_world(g)) {
      char has[64] = "the communicator's world is";
      if (g != e->comm) snprintf(has, sizeof has, "its group '%s' has", group);
      return ir_fail(err, errlen, "%s (instruction %d) has world %" PRId64 " but %s %d",
                     instr_op(in), i, in->coll.world, has, dsc_comm_world(g));
    }
  }
  return true;
}

/* A run with collectives failed: the other ranks may wait for collectives
 * this rank will never start, so give up on the job (they fail promptly;
 * nothing to do when the communicator itself failed: it is broken), then
 * complete what is in flight so that no buffer stays lent to it. */
static void fail_collectives(rt_cpu_exec *e, rt_prog *rp, const char *graph, const char *why) {
  if (!dsc_comm_broken(e->comm)) {
    char reason[600];
    snprintf(reason, sizeof reason, "graph '%s' failed: %s", graph, why);
    dsc_comm_abort(e->comm, reason);
  }
  for (int c = 0; c < rp->p->n_collectives; c++)
    if (rp->reqs[c]) {
      dsc_comm_wait(rp->reqs[c]);
      rp->reqs[c] = NULL;
    }
}

/* A disk transfer: started on the offload file's IO threads, waited here. */
static bool run_tier(rt_cpu_exec *e, rt_prog *rp, int i, char *err, size_t errlen) {
  const cg_instr *in = &rp->p->instrs[i];
  const cg_tier_io *t = &in->tier;
  if (in->kind == CG_INS_TIER_WAIT) {
    char msg[1200];
    if (!rt_offload_wait(e->disk, rp->tier_reqs[t->id], msg, sizeof msg))
      return ir_fail(err, errlen, "%s (instruction %d): %s", instr_op(in), i, msg);
    return true;
  }
  int k = t->param >= 0 && t->param < e->n_disk_params ? e->disk_value[t->param] : -1;
  const cg_buffer *b = &rp->p->buffers[in->src];
  int64_t bytes = b->numel * (int64_t)dsc_dtype_size(b->dtype);
  if (k < 0 || rt_offload_value_bytes(e->disk, k) > bytes)
    return ir_fail(err, errlen, "%s (instruction %d): param %d is not in the offload file",
                   instr_op(in), i, t->param);
  char msg[1200];
  int id = rt_offload_start(e->disk, k, buf_ptr(e, rp, in->src), t->write, msg, sizeof msg);
  if (id < 0) return ir_fail(err, errlen, "%s (instruction %d): %s", instr_op(in), i, msg);
  rp->tier_reqs[t->id] = id;
  return true;
}

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static bool run_instr(rt_cpu_exec *e, const rt_lane *lane, rt_prog *rp, int i, char *err,
                      size_t errlen) {
  const cg_program *p = rp->p;
  const cg_instr *in = &p->instrs[i];
  int nt = rt_pool_threads(lane->pool);
  /* a value this run does not need (passes/guard.c): its guard's byte,
   * written by an instruction before this one */
  if (in->guarded && (*(const uint8_t *)buf_ptr(e, rp, in->guard) != 0) != in->guard_if) {
    if (e->profiling) rp->prof_skips[i]++;
    return true;
  }
  switch (in->kind) {
    case CG_INS_LAUNCH: {
      const cg_kernel_info *k = &p->kernel_info[in->kernel];
      memset(lane->status, 0, sizeof *lane->status * (size_t)nt);
      launch_job j = {rp->fns[in->kernel], rp->args[i], lane->status};
      int64_t outer, min_chunk;
      launch_split(k, &outer, &min_chunk);
      rt_pool_parallel_for(lane->pool, outer, min_chunk, launch_range, &j);
      if (any_status(lane))
        return ir_fail(err, errlen, "%s: index out of range (instruction %d, kernel %s)",
                       instr_op(in), i, k->name);
      return true;
    }
    case CG_INS_GEMM: {
      const cg_gemm *g = &in->gemm;
      char msg[200];
      if (!rt_gemm_run(rp->plans[i], buf_ptr(e, rp, g->a.buffer), buf_ptr(e, rp, g->b.buffer),
                       buf_ptr(e, rp, g->c.buffer), msg, sizeof msg))
        return ir_fail(err, errlen, "%s: %s (instruction %d)", instr_op(in), msg, i);
      return true;
    }
    case CG_INS_EMBEDDING_GRAD: {
      memset(lane->status, 0, sizeof *lane->status * (size_t)nt);
      embgrad_job j = rows_job(e, rp, in, lane->status);
      if (!in->accumulate)
        rt_pool_parallel_for(lane->pool, in->rows * in->cols, 1 << 16, embgrad_zero, &j);
      rt_pool_parallel_for(lane->pool, in->cols, 64, embgrad_cols, &j);
      if (any_status(lane))
        return ir_fail(err, errlen,
                       "%s: index out of range: id %" PRId64 " at position %" PRId64
                       " is outside [0, %" PRId64 ") (instruction %d)",
                       instr_op(in), j.bad_id, j.bad_pos, in->rows, i);
      return true;
    }
    case CG_INS_SET_ROWS: {
      embgrad_job j = rows_job(e, rp, in, lane->status);
      rt_pool_parallel_for(lane->pool, in->cols, 256, set_rows_cols, &j);
      return true;
    }
    case CG_INS_COPY: {
      size_t es = dsc_dtype_size(p->buffers[in->src].dtype);
      int64_t src_offset = in->src_offset, n = in->numel;
      if (in->src_rank_chunk) { /* this rank's chunk, zeros past the source */
        int64_t first = (int64_t)dsc_comm_rank(dsc_comm_group(e->comm, in->coll.group)) * in->numel;
        n = first >= in->src_len ? 0 : in->src_len - first < n ? in->src_len - first : n;
        src_offset += first < in->src_len ? first : 0;
        memset(buf_ptr(e, rp, in->dst) + (in->dst_offset + n) * (int64_t)es, 0,
               (size_t)(in->numel - n) * es);
      }
      copy_job j = {buf_ptr(e, rp, in->src) + src_offset * (int64_t)es,
                    buf_ptr(e, rp, in->dst) + in->dst_offset * (int64_t)es};
      rt_pool_parallel_for(lane->pool, n * (int64_t)es, 1 << 20, copy_range, &j);
      return true;
    }
    case CG_INS_COLLECTIVE_START:
    case CG_INS_COLLECTIVE_WAIT:
      return run_collective(e, rp, i, err, errlen);
    case CG_INS_TIER_START:
    case CG_INS_TIER_WAIT:
      return run_tier(e, rp, i, err, errlen);
  }
  return ir_fail(err, errlen, "instruction %d: unknown kind", i);
}

/* Instruction i ran from t0 to t1: its trace event(s). A collective's span
 * runs from its start to the return of its wait, the latest it can have
 * completed (the comm API has no completion time of its own). */
static void trace_instr(rt_cpu_exec *e, rt_prog *rp, int i, int64_t t0, int64_t t1) {
  const cg_program *p = rp->p;
  const cg_instr *in = &p->instrs[i];
  dsc_trace *tr = e->trace;
  int pid = e->trace_pid;
  char name[200], args[160], size[32];
  /* the host stream's work on its own track (when its thread runs it) */
  bool hs = in->host_stream && e->hs_on == 1;
  dsc_trace_track compute = hs ? DSC_TRACE_HOST : DSC_TRACE_COMPUTE;
  dsc_trace_track copy = hs ? DSC_TRACE_HOST : DSC_TRACE_COPY;
  switch (in->kind) {
    case CG_INS_LAUNCH:
      snprintf(args, sizeof args, "{\"instr\":%d}", i);
      dsc_trace_span(tr, pid, compute, "kernel", t0, t1, args, p->kernel_info[in->kernel].name);
      return;
    case CG_INS_GEMM: {
      const cg_gemm *g = &in->gemm;
      int64_t b = g->batch[0] * g->batch[1];
      if (b > 1)
        snprintf(name, sizeof name, "%s %" PRId64 "x[%" PRId64 "x%" PRId64 "x%" PRId64 "]",
                 instr_op(in), b, g->m, g->n, g->k);
      else
        snprintf(name, sizeof name, "%s %" PRId64 "x%" PRId64 "x%" PRId64, instr_op(in), g->m, g->n,
                 g->k);
      snprintf(args, sizeof args, "{\"instr\":%d,\"flop\":%" PRId64 "}", i,
               2 * b * g->m * g->n * g->k);
      dsc_trace_span(tr, pid, DSC_TRACE_COMPUTE, "gemm", t0, t1, args, name);
      return;
    }
    case CG_INS_EMBEDDING_GRAD:
    case CG_INS_SET_ROWS:
      snprintf(args, sizeof args, "{\"instr\":%d}", i);
      dsc_trace_span(tr, pid, DSC_TRACE_COMPUTE, "kernel", t0, t1, args, instr_op(in));
      return;
    case CG_INS_COPY:
      dsc_trace_format_bytes(size, sizeof size,
                             in->numel * (int64_t)dsc_dtype_size(p->buffers[in->src].dtype));
      snprintf(name, sizeof name, "copy %s", size);
      snprintf(args, sizeof args, "{\"instr\":%d}", i);
      dsc_trace_span(tr, pid, copy, "copy", t0, t1, args, name);
      return;
    case CG_INS_COLLECTIVE_START:
      rp->coll_t0[in->coll.id] = t0;
      rp->coll_t1[in->coll.id] = t1;
      return;
    case CG_INS_COLLECTIVE_WAIT: {
      const cg_collective *c = &in->coll;
      int64_t bytes = c->count * (int64_t)dsc_dtype_size(c->dtype);
      if (c->kind == CG_COLL_ALL_GATHER || c->kind == CG_COLL_ALL_TO_ALL)
        bytes *= c->world; /* what every rank ends up with */
      dsc_trace_format_bytes(size, sizeof size, bytes);
      const char *group = c->group[0] ? c->group : "world";
      snprintf(args, sizeof args,
               "{\"bytes\":%" PRId64 ",\"id\":%d,\"tag\":%" PRId64
               ",\"instr\":%d,\"group\":\"%s\"}",
               bytes, c->id, coll_tag(e, c), i, group);
      /* a group's collectives say so in their name: "ep all_to_all 12 KiB" */
      snprintf(name, sizeof name, "wait %s%s%s %s", c->group[0] ? c->group : "",
               c->group[0] ? " " : "", cg_coll_kind_name(c->kind), size);
      dsc_trace_span(tr, pid, DSC_TRACE_WAIT, "collective", t0, t1, args, name);
      snprintf(name, sizeof name, "%s%s%s %s", c->group[0] ? c->group : "", c->group[0] ? " " : "",
               cg_coll_kind_name(c->kind), size);
      dsc_trace_span(tr, pid, DSC_TRACE_COMM, "collective", rp->coll_t0[c->id], t1, args, name);
      rp->coll_t1[c->id] = t1;
      return;
    }
    case CG_INS_TIER_START:
    case CG_INS_TIER_WAIT: {
      const cg_buffer *bf = &p->buffers[in->src];
      dsc_trace_format_bytes(size, sizeof size, bf->numel * (int64_t)dsc_dtype_size(bf->dtype));
      snprintf(name, sizeof name, "%s %s %s", in->kind == CG_INS_TIER_WAIT ? "wait disk" : "disk",
               in->tier.write ? "write" : "read", size);
      snprintf(args, sizeof args, "{\"instr\":%d,\"param\":%d}", i, in->tier.param);
      dsc_trace_span(tr, pid, in->kind == CG_INS_TIER_WAIT ? DSC_TRACE_WAIT : DSC_TRACE_COPY,
                     "offload", t0, t1, args, name);
      return;
    }
  }
}

/* A traced run's overlap figures: the union of its collectives' spans and
 * the time blocked in their waits (waits never overlap: one executor thread). */
static void trace_overlap(rt_cpu_exec *e, rt_prog *rp, int64_t wait_ns) {
  int n = rp->p->n_collectives;
  if (n <= 0) return;
  /* insertion sort by start: a run has few collectives */
  for (int a = 1; a < n; a++)
    for (int b = a; b > 0 && rp->coll_t0[b - 1] > rp->coll_t0[b]; b--) {
      int64_t s = rp->coll_t0[b], f = rp->coll_t1[b];
      rp->coll_t0[b] = rp->coll_t0[b - 1], rp->coll_t1[b] = rp->coll_t1[b - 1];
      rp->coll_t0[b - 1] = s, rp->coll_t1[b - 1] = f;
    }
  int64_t total = 0, lo = rp->coll_t0[0], hi = rp->coll_t1[0];
  for (int c = 1; c < n; c++) {
    if (rp->coll_t0[c] > hi) {
      total += hi - lo;
      lo = rp->coll_t0[c];
      hi = rp->coll_t1[c];
    } else if (rp->coll_t1[c] > hi) {
      hi = rp->coll_t1[c];
    }
  }
  total += hi - lo;
  dsc_trace_add_overlap(e->trace, e->trace_pid, total, wait_ns, n);
}

/* A host-stream instruction, on the stream's thread and pool, or on the
 * executor's when it waits for it (poster): timed as the executor's own
 * are (the trace puts it on the host stream's track). */
static bool host_item(void *arg, int item, bool poster, char *err, size_t errlen) {
  rt_cpu_exec *e = arg;
  rt_prog *rp = e->hs_prog;
  bool timed = e->profiling || e->trace;
  int64_t t0 = timed ? now_ns() : 0;
  if (!run_instr(e, poster ? &e->lane : &e->hs_lane, rp, item, err, errlen)) return false;
  if (timed) {
    int64_t t1 = now_ns();
    if (e->profiling) rp->prof_ns[item] += t1 - t0;
    if (e->trace) trace_instr(e, rp, item, t0, t1);
  }
  return true;
}

/* Whether program p's host-stream instructions run on the stream's thread:
 * always where the program asks (offload.overlap true), else only when the
 * executor's threads, times the ranks on this machine, leave an online CPU
 * free. On a CPU the host and the device are the same cores: a stream
 * beside threads that already take every core takes turns with them, and
 * a GEMM waits for its slowest thread (docs/memory.md "The overlapped host
 * step": measured slower than one instruction at a time). Decided at the
 * first run, when the communicator (the ranks on this machine) is set. */
static bool host_stream_on(rt_cpu_exec *e, const cg_program *p) {
  if (e->hs_on < 0) {
    int local = e->comm ? dsc_comm_local_world(e->comm) : 1;
    int64_t busy = (int64_t)rt_pool_threads(e->lane.pool) * (local > 0 ? local : 1);
    e->hs_on = p->host_stream_own_thread || busy < rt_online_cpus();
  }
  return e->hs_on == 1; /* the programs of a module share offload.overlap */
}

bool rt_cpu_exec_host_stream_on(const rt_cpu_exec *e) { return e && e->hs_on == 1; }

/* Blocks until the first n host-stream instructions are done; the wait's
 * span on the trace's wait track. */
static bool wait_host(rt_cpu_exec *e, int n, char *err, size_t errlen) {
  int64_t t0 = e->trace ? now_ns() : 0;
  char msg[1200];
  if (!rt_host_stream_wait(e->hs, n, msg, sizeof msg))
    return ir_fail(err, errlen, "host stream: %s", msg);
  if (e->trace) {
    int64_t t1 = now_ns();
    if (t1 - t0 > 1000) /* a wait that blocked (over a microsecond) */
      dsc_trace_span(e->trace, e->trace_pid, DSC_TRACE_WAIT, "host", t0, t1, NULL,
                     "wait host stream");
  }
  return true;
}

bool rt_cpu_exec_run(rt_cpu_exec *e, int prog, void *const *inputs, void **outputs_out, char *err,
                     size_t errlen) {
  if (prog < 0 || prog >= e->n_progs)
    return ir_fail(err, errlen, "program %d does not exist (%d loaded)", prog, e->n_progs);
  rt_prog *rp = &e->progs[prog];
  const cg_program *p = rp->p;
  for (int b = 0; b < p->n_buffers; b++) {
    const cg_buffer *cb = &p->buffers[b];
    if (cb->kind != CG_BUF_INPUT) continue;
    if (!inputs || !inputs[cb->index])
      return ir_fail(err, errlen, "graph input %d is missing", cb->index);
    memcpy(buf_ptr(e, rp, b), inputs[cb->index], (size_t)cb->numel * dsc_dtype_size(cb->dtype));
  }
  if ((p->n_collectives > 0 || p->needs_rank) && !check_comm(e, p, err, errlen)) return false;
  if (p->n_tier_ios > 0) {
    if (!e->disk)
      return ir_fail(err, errlen, "the program streams disk tier values but has no offload "
                                  "file (dsc_exec_set_offload_file, --offload-dir)");
    rt_offload_begin(e->disk);
  }
  bool timed = e->profiling || e->trace;
  int64_t wait_ns = 0;
  bool streamed = rp->n_host > 0 && host_stream_on(e, p);
  if (streamed) rt_host_stream_begin(e->hs), e->hs_prog = rp;
  for (int i = 0; i <= p->n_instrs; i++) {
    bool ok;
    int64_t t0 = timed ? now_ns() : 0;
    if (i == p->n_instrs) { /* the end: everything the stream was given */
      if (!streamed) break;
      ok = wait_host(e, rp->n_host, err, errlen);
    } else if (streamed && p->instrs[i].host_stream) {
      ok = rt_host_stream_post(e->hs, i) || ir_fail(err, errlen, "host stream: queue full");
      if (ok) continue;
    } else {
      ok = !streamed || rp->host_need[i] == 0 || wait_host(e, rp->host_need[i], err, errlen);
      if (ok && timed) t0 = now_ns(); /* the wait is the wait track's, not the instruction's */
      ok = ok && run_instr(e, &e->lane, rp, i, err, errlen);
    }
    if (!ok) {
      if (streamed) rt_host_stream_cancel(e->hs); /* nothing of this run still running */
      if (p->n_collectives > 0) fail_collectives(e, rp, p->graph_name ? p->graph_name : "?", err);
      char msg[8];
      if (p->n_tier_ios > 0) rt_offload_end(e->disk, false, msg, sizeof msg); /* changes nothing */
      return false;
    }
    if (i == p->n_instrs) break;
    if (timed) {
      int64_t t1 = now_ns();
      if (e->profiling) rp->prof_ns[i] += t1 - t0;
      if (e->trace) {
        trace_instr(e, rp, i, t0, t1);
        if (p->instrs[i].kind == CG_INS_COLLECTIVE_WAIT) wait_ns += t1 - t0;
      }
    }
  }
  if (e->profiling) rp->runs++;
  if (e->trace) trace_overlap(e, rp, wait_ns);
  if (e->trace && streamed) {
    int64_t busy, waited;
    rt_host_stream_times(e->hs, &busy, &waited);
    dsc_trace_add_host(e->trace, e->trace_pid, busy, waited);
  }
  /* The disk writes land before the assigns: a failed commit then changes
   * nothing (the file keeps its active slot, the arenas their values). */
  if (p->n_tier_ios > 0) {
    char msg[1200] = "";
    if (!rt_offload_end(e->disk, true, msg, sizeof msg))
      return ir_fail(err, errlen, "%s", msg);
  }
  for (int a = 0; a < rp->n_assign_copies; a++) {
    const rt_assign_copy *c = &rp->assigns[a];
    if (!c->guard || (*c->guard != 0) == c->guard_if) memcpy(c->dst, c->src, c->bytes);
  }
  for (int o = 0; o < p->n_outputs; o++) {
    const cg_output *out = &p->outputs[o];
    outputs_out[o] =
        buf_ptr(e, rp, out->buffer) + out->offset * (int64_t)dsc_dtype_size(out->type.dtype);
  }
  return true;
}

bool rt_cpu_exec_set_offload(rt_cpu_exec *e, rt_offload *disk, const int *value_of_param,
                             int n_params) {
  if (e->disk_value) ir_free(e->ctx, e->disk_value, sizeof(int) * (size_t)(e->n_disk_params + 1));
  e->disk_value = NULL, e->n_disk_params = 0, e->disk = NULL;
  if (!disk) return true;
  if (!(e->disk_value = ir_alloc(e->ctx, sizeof(int) * (size_t)(n_params + 1)))) return false;
  memcpy(e->disk_value, value_of_param, sizeof(int) * (size_t)n_params);
  e->n_disk_params = n_params, e->disk = disk;
  return true;
}
