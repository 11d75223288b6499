/* The in-process backend: `world` ranks as threads sharing one state under a
 * mutex, waits on a condition variable (no busy waiting).
 *
 * Collective number n of every rank meets in slot n. Each rank posts its
 * arguments there; the rank that arrives last checks nothing is left to wait
 * for, then (outside the lock) reduces every rank's input in rank order into
 * a scratch result, so the result never depends on thread timing. Each rank's
 * wait copies its part out of the scratch; the last one to leave frees the
 * slot. Inputs are read only by that one computation, which happens before
 * any rank's wait returns, so in-place calls are safe.
 *
 * Any failure (mismatch, timeout, abort, a rank that left) is recorded once
 * in the shared state and breaks the communicator for every rank. A slot
 * whose computation has started always completes first, so no rank returns
 * while another still reads its buffers. */
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/runtime.h"

typedef struct rt_slot rt_slot;
struct rt_slot {
  int64_t seq;
  int arrived, released;
  bool computing, computed;
  bool *posted;       /* [world] */
  rt_comm_args *args; /* [world] */
  unsigned char *result;
  rt_slot *next;
};

typedef struct {
  pthread_mutex_t mu;
  pthread_cond_t cv; /* on CLOCK_MONOTONIC */
  int world;
  rt_slot *slots;
  bool failed;
  int64_t fail_seq;  /* the slot the failure is about; -1: none in particular */
  char reason[512];  /* said by a rank waiting on slot fail_seq: "timed out after ..." */
  char full[768];    /* said by everyone else: "rank 0's all_reduce #7 (step 3) timed out ..." */
  int64_t *left_at;  /* [world]: -1 while running, else the collectives it started */
  dsc_comm *comms;   /* [world] */
  int n_failed_ranks;
  int *fail_order;   /* [world]: ranks whose fn failed, in time order */
} rt_inproc;

/* ---- shared state helpers (called with the lock held) ---- */

static void fail_locked(rt_inproc *s, int64_t seq, const char *full, const char *reason_fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void fail_locked(rt_inproc *s, int64_t seq, const char *full, const char *reason_fmt, ...) {
  if (s->failed) return;
  s->failed = true;
  s->fail_seq = seq;
  va_list ap;
  va_start(ap, reason_fmt);
  vsnprintf(s->reason, sizeof s->reason, reason_fmt, ap);
  va_end(ap);
  snprintf(s->full, sizeof s->full, "%s", full);
  pthread_cond_broadcast(&s->cv);
}

/* Reports the shared failure on the rank waiting on (or starting) req. */
static dsc_status report_failure(rt_inproc *s, dsc_comm_request *req) {
  char what[96];
  rt_comm_describe(req, what, sizeof what);
  if (s->fail_seq == req->seq)
    ir_error(req->comm->ctx, ir_no_loc, "rank %d: %s %s", req->comm->rank, what, s->reason);
  else
    ir_error(req->comm->ctx, ir_no_loc, "rank %d: %s failed: %s", req->comm->rank, what, s->full);
  return DSC_ERR_USER;
}

static void free_slot(rt_inproc *s, rt_slot *slot) {
  for (rt_slot **p = &s->slots; *p; p = &(*p)->next)
    if (*p == slot) {
      *p = slot->next;
      break;
    }
  free(slot->posted);
  free(slot->args);
  free(slot->result);
  free(slot);
}

static rt_slot *find_slot(rt_inproc *s, int64_t seq, bool create) {
  for (rt_slot *p = s->slots; p; p = p->next)
    if (p->seq == seq) return p;
  if (!create) return NULL;
  rt_slot *slot = calloc(1, sizeof *slot);
  if (!slot) return NULL;
  slot->seq = seq;
  slot->posted = calloc((size_t)s->world, sizeof *slot->posted);
  slot->args = calloc((size_t)s->world, sizeof *slot->args);
  if (!slot->posted || !slot->args) {
    free(slot->posted);
    free(slot->args);
    free(slot);
    return NULL;
  }
  slot->next = s->slots;
  s->slots = slot;
  return slot;
}

static void describe_args(const rt_comm_args *a, char *buf, size_t n) {
  if (a->kind == RT_COMM_BARRIER) {
    snprintf(buf, n, "barrier (step %lld)", (long long)a->tag);
    return;
  }
  int k = snprintf(buf, n, "%s (step %lld, %s, count %lld", rt_comm_kind_name(a->kind),
                   (long long)a->tag, dsc_dtype_name(a->dtype), (long long)a->count);
  if (k < 0 || (size_t)k >= n) return;
  if (a->kind == RT_COMM_ALL_REDUCE || a->kind == RT_COMM_REDUCE_SCATTER)
    snprintf(buf + k, n - (size_t)k, ", %s)", a->op == DSC_COMM_SUM ? "sum" : "mean");
  else if (a->kind == RT_COMM_BROADCAST)
    snprintf(buf + k, n - (size_t)k, ", root %d)", a->root);
  else
    snprintf(buf + k, n - (size_t)k, ")");
}

static bool args_match(const rt_comm_args *x, const rt_comm_args *y) {
  if (x->kind != y->kind || x->tag != y->tag) return false;
  if (x->kind == RT_COMM_BARRIER) return true;
  if (x->dtype != y->dtype || x->count != y->count) return false;
  if ((x->kind == RT_COMM_ALL_REDUCE || x->kind == RT_COMM_REDUCE_SCATTER) && x->op != y->op)
    return false;
  return x->kind != RT_COMM_BROADCAST || x->root == y->root;
}

/* Formats "rank 3" or "ranks 1, 3" for the ranks that have not posted. */
static void missing_ranks(const rt_inproc *s, const rt_slot *slot, char *buf, size_t n) {
  int missing = 0;
  for (int r = 0; r < s->world; r++) missing += !slot->posted[r];
  size_t k = (size_t)snprintf(buf, n, "rank%s", missing > 1 ? "s" : "");
  int shown = 0;
  for (int r = 0; r < s->world && k < n; r++) {
    if (slot->posted[r]) continue;
    if (shown == 8) {
      snprintf(buf + k, n - k, ", ...");
      break;
    }
    k += (size_t)snprintf(buf + k, n - k, "%s %d", shown ? "," : "", r);
    shown++;
  }
}

/* ---- the computation (outside the lock; only the last arriving rank) ---- */

static bool compute(rt_inproc *s, rt_slot *slot) {
  const rt_comm_args *a0 = &slot->args[0];
  if (a0->kind == RT_COMM_BARRIER) return true;
  size_t esz = dsc_dtype_size(a0->dtype);
  size_t n = (size_t)a0->count;
  size_t bytes = a0->kind == RT_COMM_ALL_GATHER ? n * esz * (size_t)s->world : n * esz;
  slot->result = malloc(bytes ? bytes : 1);
  if (!slot->result) return false;
  switch (a0->kind) {
  case RT_COMM_ALL_REDUCE:
  case RT_COMM_REDUCE_SCATTER:
    if (bytes) memcpy(slot->result, slot->args[0].send, bytes);
    for (int r = 1; r < s->world; r++)
      rt_comm_accumulate(slot->result, slot->args[r].send, a0->count, a0->dtype);
    if (a0->op == DSC_COMM_MEAN) rt_comm_divide(slot->result, a0->count, a0->dtype, s->world);
    break;
  case RT_COMM_ALL_GATHER:
    for (int r = 0; r < s->world && bytes; r++)
      memcpy(slot->result + (size_t)r * n * esz, slot->args[r].send, n * esz);
    break;
  case RT_COMM_BROADCAST:
    if (bytes) memcpy(slot->result, slot->args[a0->root].send, bytes);
    break;
  case RT_COMM_BARRIER: break;
  }
  return true;
}

/* ---- backend entry points ---- */

static dsc_status inproc_start(dsc_comm_request *req) {
  dsc_comm *c = req->comm;
  rt_inproc *s = c->impl;
  pthread_mutex_lock(&s->mu);
  if (s->failed) {
    dsc_status st = report_failure(s, req);
    pthread_mutex_unlock(&s->mu);
    return st;
  }
  rt_slot *slot = find_slot(s, req->seq, true);
  if (!slot) {
    pthread_mutex_unlock(&s->mu);
    ir_error(c->ctx, ir_no_loc, "rank %d: %s: out of memory", c->rank,
             rt_comm_kind_name(req->a.kind));
    return DSC_ERR_INTERNAL;
  }
  /* Compare with the first rank that posted here. */
  for (int r = 0; r < s->world; r++) {
    if (!slot->posted[r]) continue;
    if (!args_match(&slot->args[r], &req->a)) {
      char mine[160], theirs[160], full[512];
      describe_args(&req->a, mine, sizeof mine);
      describe_args(&slot->args[r], theirs, sizeof theirs);
      snprintf(full, sizeof full, "collective #%lld does not match across ranks: rank %d started "
               "%s, rank %d started %s", (long long)req->seq, r, theirs, c->rank, mine);
      fail_locked(s, req->seq, full, "does not match across ranks: rank %d started %s, rank %d "
                  "started %s", r, theirs, c->rank, mine);
      dsc_status st = report_failure(s, req);
      pthread_mutex_unlock(&s->mu);
      return st;
    }
    break;
  }
  slot->posted[c->rank] = true;
  slot->args[c->rank] = req->a;
  slot->arrived++;
  req->impl = slot;
  if (slot->arrived == s->world) {
    slot->computing = true;
    pthread_mutex_unlock(&s->mu);
    bool ok = compute(s, slot);
    pthread_mutex_lock(&s->mu);
    slot->computing = false;
    if (ok) {
      slot->computed = true;
    } else {
      char full[256];
      snprintf(full, sizeof full, "collective #%lld: out of memory", (long long)req->seq);
      fail_locked(s, req->seq, full, "ran out of memory");
    }
    pthread_cond_broadcast(&s->cv);
  }
  pthread_mutex_unlock(&s->mu);
  return DSC_OK;
}

static void release_locked(rt_inproc *s, rt_slot *slot) {
  if (++slot->released == s->world) free_slot(s, slot);
}

static dsc_status inproc_wait(dsc_comm_request *req) {
  dsc_comm *c = req->comm;
  rt_inproc *s = c->impl;
  rt_slot *slot = req->impl;
  double t0 = rt_comm_now(), deadline = t0 + c->timeout;
  struct timespec ts;
  ts.tv_sec = (time_t)deadline;
  ts.tv_nsec = (long)((deadline - (double)ts.tv_sec) * 1e9);
  if (ts.tv_nsec >= 1000000000L) ts.tv_nsec = 999999999L;
  pthread_mutex_lock(&s->mu);
  for (;;) {
    if (slot->computed) break;
    /* Never leave while our inputs are being read. */
    if (!slot->computing) {
      if (s->failed) {
        dsc_status st = report_failure(s, req);
        release_locked(s, slot);
        pthread_mutex_unlock(&s->mu);
        return st;
      }
      for (int r = 0; r < s->world; r++) {
        if (slot->posted[r] || s->left_at[r] < 0) continue;
        char what[96], full[512];
        rt_comm_describe(req, what, sizeof what);
        snprintf(full, sizeof full, "%s cannot complete: rank %d returned from its function after "
                 "%lld collectives", what, r, (long long)s->left_at[r]);
        fail_locked(s, req->seq, full, "cannot complete: rank %d returned from its function after "
                    "%lld collectives", r, (long long)s->left_at[r]);
        break;
      }
      if (s->failed) continue;
      if (rt_comm_now() >= deadline) {
        char what[96], who[128], full[512];
        rt_comm_describe(req, what, sizeof what);
        missing_ranks(s, slot, who, sizeof who);
        snprintf(full, sizeof full, "rank %d's %s timed out after %.1f s waiting for %s", c->rank,
                 what, c->timeout, who);
        fail_locked(s, req->seq, full, "timed out after %.1f s waiting for %s", c->timeout, who);
        continue;
      }
    }
    pthread_cond_timedwait(&s->cv, &s->mu, &ts);
  }
  pthread_mutex_unlock(&s->mu);
  /* The result is immutable until every rank has released the slot. */
  const rt_comm_args *a = &req->a;
  size_t esz = a->kind == RT_COMM_BARRIER ? 0 : dsc_dtype_size(a->dtype);
  size_t n = (size_t)rt_comm_recv_count(c, a) * esz;
  size_t off = a->kind == RT_COMM_REDUCE_SCATTER ? (size_t)c->rank * n : 0;
  if (n && !(a->kind == RT_COMM_BROADCAST && c->rank == a->root))
    memmove(a->recv, slot->result + off, n);
  pthread_mutex_lock(&s->mu);
  release_locked(s, slot);
  pthread_mutex_unlock(&s->mu);
  return DSC_OK;
}

static void inproc_release(dsc_comm_request *req) {
  rt_inproc *s = req->comm->impl;
  pthread_mutex_lock(&s->mu);
  rt_slot *slot = req->impl;
  /* Wait out a computation that may read this rank's buffers. */
  while (slot->computing) pthread_cond_wait(&s->cv, &s->mu);
  release_locked(s, slot);
  pthread_mutex_unlock(&s->mu);
}

static void inproc_abort(dsc_comm *c, const char *reason) {
  rt_inproc *s = c->impl;
  /* On the aborting rank's own context too: the run reports the first failed rank's. */
  ir_error(c->ctx, ir_no_loc, "rank %d aborted: %s", c->rank, reason);
  pthread_mutex_lock(&s->mu);
  char full[512];
  snprintf(full, sizeof full, "rank %d aborted: %s", c->rank, reason);
  fail_locked(s, -1, full, "%s", full);
  pthread_mutex_unlock(&s->mu);
}

const rt_comm_backend rt_comm_inproc_backend = {
    "inproc", inproc_start, inproc_wait, inproc_release, inproc_abort, NULL,
};

/* ---- running the ranks ---- */

typedef struct {
  rt_inproc *s;
  int rank;
  dsc_comm_rank_fn fn;
  void *ud;
  dsc_status status;
} rank_job;

static void *rank_main(void *p) {
  rank_job *job = p;
  rt_inproc *s = job->s;
  dsc_comm *c = &s->comms[job->rank];
  dsc_status st = job->fn(c, job->ud);
  int64_t unwaited = c->n_pending;
  rt_comm_release_pending(c);
  pthread_mutex_lock(&s->mu);
  if (st != DSC_OK) {
    s->fail_order[s->n_failed_ranks++] = job->rank;
    /* Name the cause: this rank's first error, unless a failure is already known. */
    const char *msg = "(no diagnostic)";
    for (int i = 0; i < dsc_diag_count(c->ctx); i++)
      if (dsc_diag_get(c->ctx, i)->severity == DSC_DIAG_ERROR) {
        msg = dsc_diag_get(c->ctx, i)->message;
        break;
      }
    char full[768];
    snprintf(full, sizeof full, "rank %d failed: %s", job->rank, msg);
    fail_locked(s, -1, full, "%s", full);
  } else if (unwaited > 0) {
    char full[256];
    snprintf(full, sizeof full, "rank %d returned with %lld collectives started but not waited",
             job->rank, (long long)unwaited);
    fail_locked(s, -1, full, "%s", full);
  }
  s->left_at[job->rank] = c->seq;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
  job->status = st;
  return NULL;
}

static void copy_diags(dsc_context *to, const dsc_context *from) {
  for (int i = 0; i < dsc_diag_count(from); i++) {
    const dsc_diag *d = dsc_diag_get(from, i);
    /* ir_diag copies the location's file name: the rank's context may go. */
    ir_diag(to, d->severity, d->loc, "%s", d->message);
  }
}

dsc_status dsc_comm_inproc_run(dsc_context *ctx, int world, dsc_comm_rank_fn fn, void *user_data) {
  if (world < 1 || world > 1024 || !fn) {
    ir_error(ctx, ir_no_loc, "in-process communicator: world size must be in [1, 1024], got %d",
             world);
    return DSC_ERR_USER;
  }
  rt_inproc s;
  memset(&s, 0, sizeof s);
  s.world = world;
  s.fail_seq = -1;
  size_t w = (size_t)world;
  s.left_at = malloc(w * sizeof *s.left_at);
  s.comms = calloc(w, sizeof *s.comms);
  s.fail_order = calloc(w, sizeof *s.fail_order);
  rank_job *jobs = calloc(w, sizeof *jobs);
  pthread_t *threads = calloc(w, sizeof *threads);
  dsc_status st = DSC_OK;
  int n_ctx = 0, n_threads = 0;
  bool sync_ok = false;
  if (!s.left_at || !s.comms || !s.fail_order || !jobs || !threads) goto oom;
  pthread_condattr_t ca;
  if (pthread_mutex_init(&s.mu, NULL) != 0) goto oom;
  if (pthread_condattr_init(&ca) != 0) {
    pthread_mutex_destroy(&s.mu);
    goto oom;
  }
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  int cv_err = pthread_cond_init(&s.cv, &ca);
  pthread_condattr_destroy(&ca);
  if (cv_err != 0) {
    pthread_mutex_destroy(&s.mu);
    goto oom;
  }
  sync_ok = true;
  for (int r = 0; r < world; r++) {
    s.left_at[r] = -1;
    dsc_context *rc = dsc_context_new(NULL, NULL);
    if (!rc) goto oom;
    ir_context_inherit_interrupt(rc, ctx);
    n_ctx++;
    if (rt_comm_init(&s.comms[r], &rt_comm_inproc_backend, rc, r, world) != DSC_OK) {
      copy_diags(ctx, rc);
      st = DSC_ERR_USER;
      goto done;
    }
    s.comms[r].impl = &s;
  }
  for (int r = 0; r < world; r++) {
    jobs[r] = (rank_job){&s, r, fn, user_data, DSC_OK};
    if (pthread_create(&threads[r], NULL, rank_main, &jobs[r]) != 0) {
      /* The ranks already running see this one as aborted and fail promptly. */
      inproc_abort(&s.comms[r], "could not start its thread");
      ir_error(ctx, ir_no_loc, "in-process communicator: could not start the thread of rank %d",
               r);
      st = DSC_ERR_INTERNAL;
      break;
    }
    n_threads++;
  }
  for (int r = 0; r < n_threads; r++) pthread_join(threads[r], NULL);
  if (st == DSC_OK && s.n_failed_ranks > 0) {
    int first = s.fail_order[0];
    st = jobs[first].status;
    copy_diags(ctx, s.comms[first].ctx);
    if (s.n_failed_ranks > 1) {
      char others[256];
      size_t k = 0;
      for (int i = 1; i < s.n_failed_ranks && k < sizeof others; i++)
        k += (size_t)snprintf(others + k, sizeof others - k, "%s%d", i > 1 ? ", " : "",
                              s.fail_order[i]);
      ir_diag(ctx, DSC_DIAG_NOTE, ir_no_loc, "rank %d failed first; rank%s %s failed too", first,
              s.n_failed_ranks > 2 ? "s" : "", others);
    }
  }
  goto done;
oom:
  ir_error(ctx, ir_no_loc, "in-process communicator: out of memory");
  st = DSC_ERR_INTERNAL;
done:
  while (s.slots) free_slot(&s, s.slots);
  for (int r = 0; r < n_ctx; r++) dsc_context_free(s.comms[r].ctx);
  if (sync_ok) {
    pthread_cond_destroy(&s.cv);
    pthread_mutex_destroy(&s.mu);
  }
  free(s.left_at);
  free(s.comms);
  free(s.fail_order);
  free(jobs);
  free(threads);
  return st;
}
