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
 * in the job's shared state and breaks every communicator of the job, its
 * groups too (as MPI_Abort ends every process). A slot whose computation has
 * started always completes first, so no rank returns while another still
 * reads its buffers.
 *
 * A group (dsc_comm_split) is its own numbering of collectives and its own
 * slots under the job's lock: the first member to make it registers it under
 * (parent, the split's number, color) and the others find it there. */
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
  size_t *offsets;      /* all_to_all: [world], where each rank's input starts in result */
  int64_t *send_displs; /* all_to_all_v: [world][world], each rank's (its request may go first) */
  rt_slot *next;
};

typedef struct rt_job rt_job;

/* The ranks of one communicator: the world, or a group. */
typedef struct rt_group rt_group;
struct rt_group {
  rt_job *job;
  int world;
  int *members; /* [world]: the job's rank of each; NULL for the world */
  rt_slot *slots;
  int refs; /* a group's communicators not yet freed */
  rt_group *next;
};

/* A group being made: its members find it by (parent, split number, color). */
typedef struct rt_split rt_split;
struct rt_split {
  const rt_group *parent;
  int64_t seq;
  int color, taken;
  rt_group *g;
  rt_split *next;
};

struct rt_job {
  pthread_mutex_t mu;
  pthread_cond_t cv; /* on CLOCK_MONOTONIC */
  rt_group root;
  rt_group *groups; /* made by splits, not yet freed */
  rt_split *splits;
  bool failed;
  const rt_group *fail_group; /* with fail_seq: the slot the failure is about */
  int64_t fail_seq;           /* -1: none in particular */
  char reason[512];           /* said by a rank waiting on that slot: "timed out after ..." */
  char full[768];    /* said by everyone else: "rank 0's all_reduce #7 (step 3) timed out ..." */
  int64_t *left_at;  /* [job world]: -1 while running, else the collectives it started */
  dsc_comm *comms;   /* [job world] */
  int n_failed_ranks;
  int *fail_order; /* [job world]: ranks whose fn failed, in time order */
};

static int job_rank(const rt_group *g, int r) { return g->members ? g->members[r] : r; }

/* ---- shared state helpers (called with the lock held) ---- */

static void fail_locked(rt_job *s, const rt_group *g, int64_t seq, const char *full,
                        const char *reason_fmt, ...) __attribute__((format(printf, 5, 6)));
static void fail_locked(rt_job *s, const rt_group *g, int64_t seq, const char *full,
                        const char *reason_fmt, ...) {
  if (s->failed) return;
  s->failed = true;
  s->fail_group = g;
  s->fail_seq = seq;
  va_list ap;
  va_start(ap, reason_fmt);
  vsnprintf(s->reason, sizeof s->reason, reason_fmt, ap);
  va_end(ap);
  snprintf(s->full, sizeof s->full, "%s", full);
  pthread_cond_broadcast(&s->cv);
}

/* Reports the shared failure on the rank waiting on (or starting) req. */
static dsc_status report_failure(rt_job *s, dsc_comm_request *req) {
  char what[96], who[64];
  rt_comm_describe(req, what, sizeof what);
  rt_comm_who(req->comm, who, sizeof who);
  if (s->fail_group == req->comm->impl && s->fail_seq == req->seq)
    ir_error(req->comm->ctx, ir_no_loc, "%s: %s %s", who, what, s->reason);
  else
    ir_error(req->comm->ctx, ir_no_loc, "%s: %s failed: %s", who, what, s->full);
  return DSC_ERR_USER;
}

static void free_slot(rt_group *s, rt_slot *slot) {
  for (rt_slot **p = &s->slots; *p; p = &(*p)->next)
    if (*p == slot) {
      *p = slot->next;
      break;
    }
  free(slot->posted);
  free(slot->args);
  free(slot->result);
  free(slot->offsets);
  free(slot->send_displs);
  free(slot);
}

static rt_slot *find_slot(rt_group *s, int64_t seq, bool create) {
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
  const char *name = rt_comm_kind_name(a->kind);
  long long tag = (long long)a->tag;
  const char *dt = a->kind == RT_COMM_BARRIER ? "" : dsc_dtype_name(a->dtype);
  switch (a->kind) {
    case RT_COMM_BARRIER:
      snprintf(buf, n, "barrier (step %lld)", tag);
      break;
    case RT_COMM_ALL_TO_ALL_V:
      snprintf(buf, n, "%s (step %lld, %s)", name, tag, dt);
      break;
    case RT_COMM_ALL_REDUCE:
    case RT_COMM_REDUCE_SCATTER:
      snprintf(buf, n, "%s (step %lld, %s, count %lld, %s)", name, tag, dt, (long long)a->count,
               a->op == DSC_COMM_SUM ? "sum" : "mean");
      break;
    case RT_COMM_BROADCAST:
      snprintf(buf, n, "%s (step %lld, %s, count %lld, root %d)", name, tag, dt,
               (long long)a->count, a->root);
      break;
    default:
      snprintf(buf, n, "%s (step %lld, %s, count %lld)", name, tag, dt, (long long)a->count);
      break;
  }
}

static bool args_match(const rt_comm_args *x, const rt_comm_args *y) {
  if (x->kind != y->kind || x->tag != y->tag) return false;
  if (x->kind == RT_COMM_BARRIER) return true;
  if (x->dtype != y->dtype || x->count != y->count) return false;
  if ((x->kind == RT_COMM_ALL_REDUCE || x->kind == RT_COMM_REDUCE_SCATTER) && x->op != y->op)
    return false;
  return x->kind != RT_COMM_BROADCAST || x->root == y->root;
}

/* Formats "rank 3" or "ranks 1, 3" (the job's ranks) for those that have not posted. */
static void missing_ranks(const rt_group *s, const rt_slot *slot, char *buf, size_t n) {
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
    k += (size_t)snprintf(buf + k, n - k, "%s %d", shown ? "," : "", job_rank(s, r));
    shown++;
  }
}

/* ---- the computation (outside the lock; only the last arriving rank) ---- */

/* An all_to_all_v whose counts disagree: what rank i sends rank j must be
 * what j expects from i. Writes the problem into why. */
static bool counts_agree(const rt_group *s, const rt_slot *slot, char *why, size_t n) {
  int w = s->world;
  for (int i = 0; i < w; i++)
    for (int j = 0; j < w; j++) {
      int64_t sent = slot->args[i].v[j], expected = slot->args[j].v[2 * w + i];
      if (sent == expected) continue;
      snprintf(why, n, "rank %d sends %lld elements to rank %d, which expects %lld from it",
               job_rank(s, i), (long long)sent, job_rank(s, j), (long long)expected);
      return false;
    }
  return true;
}

/* Returns NULL, or what went wrong. */
static const char *compute(rt_group *s, rt_slot *slot, char *why, size_t why_n) {
  const rt_comm_args *a0 = &slot->args[0];
  if (a0->kind == RT_COMM_BARRIER) return NULL;
  size_t esz = dsc_dtype_size(a0->dtype);
  size_t n = (size_t)a0->count, w = (size_t)s->world;
  if (a0->kind == RT_COMM_ALL_TO_ALL || a0->kind == RT_COMM_ALL_TO_ALL_V) {
    if (a0->kind == RT_COMM_ALL_TO_ALL_V && !counts_agree(s, slot, why, why_n)) return why;
    /* Every rank's whole input, side by side: each wait takes its pieces. */
    slot->offsets = malloc(w * sizeof *slot->offsets);
    if (!slot->offsets) return "out of memory";
    if (a0->kind == RT_COMM_ALL_TO_ALL_V) {
      slot->send_displs = malloc(w * w * sizeof *slot->send_displs);
      if (!slot->send_displs) return "out of memory";
      for (size_t r = 0; r < w; r++)
        memcpy(slot->send_displs + r * w, slot->args[r].v + w, w * sizeof *slot->send_displs);
    }
    size_t total = 0;
    for (size_t r = 0; r < w; r++) {
      slot->offsets[r] = total;
      total += (size_t)rt_comm_a2a_send_extent(s->world, &slot->args[r]) * esz;
    }
    slot->result = malloc(total ? total : 1);
    if (!slot->result) return "out of memory";
    for (size_t r = 0; r < w; r++) {
      size_t bytes = (r + 1 < w ? slot->offsets[r + 1] : total) - slot->offsets[r];
      if (bytes) memcpy(slot->result + slot->offsets[r], slot->args[r].send, bytes);
    }
    return NULL;
  }
  size_t bytes = a0->kind == RT_COMM_ALL_GATHER ? n * esz * w : n * esz;
  slot->result = malloc(bytes ? bytes : 1);
  if (!slot->result) return "out of memory";
  switch (a0->kind) {
  case RT_COMM_ALL_REDUCE:
  case RT_COMM_REDUCE_SCATTER:
    if (bytes) memcpy(slot->result, slot->args[0].send, bytes);
    for (int r = 1; r < s->world; r++)
      rt_comm_accumulate(slot->result, slot->args[r].send, a0->count, a0->dtype);
    if (a0->op == DSC_COMM_MEAN) rt_comm_divide(slot->result, a0->count, a0->dtype, s->world);
    break;
  case RT_COMM_ALL_GATHER:
    for (size_t r = 0; r < w && bytes; r++)
      memcpy(slot->result + r * n * esz, slot->args[r].send, n * esz);
    break;
  case RT_COMM_BROADCAST:
    if (bytes) memcpy(slot->result, slot->args[a0->root].send, bytes);
    break;
  default:
    break;
  }
  return NULL;
}

/* This rank's part of the result into its recv. */
static void deliver(const rt_group *s, const rt_slot *slot, const dsc_comm *c,
                    const rt_comm_args *a) {
  if (a->kind == RT_COMM_BARRIER) return;
  size_t esz = dsc_dtype_size(a->dtype);
  if (a->kind == RT_COMM_ALL_TO_ALL || a->kind == RT_COMM_ALL_TO_ALL_V) {
    int w = s->world, me = c->rank;
    unsigned char *recv = a->recv;
    for (int i = 0; i < w; i++) {
      size_t src, dst, count;
      if (a->kind == RT_COMM_ALL_TO_ALL) {
        count = (size_t)a->count;
        src = (size_t)me * count, dst = (size_t)i * count;
      } else {
        count = (size_t)a->v[2 * w + i];
        src = (size_t)slot->send_displs[(size_t)i * (size_t)w + (size_t)me];
        dst = (size_t)a->v[3 * w + i];
      }
      if (count) memcpy(recv + dst * esz, slot->result + slot->offsets[i] + src * esz, count * esz);
    }
    return;
  }
  size_t n = (size_t)rt_comm_recv_count(c, a) * esz;
  size_t off = a->kind == RT_COMM_REDUCE_SCATTER ? (size_t)c->rank * n : 0;
  if (n && !(a->kind == RT_COMM_BROADCAST && c->rank == a->root))
    memmove(a->recv, slot->result + off, n);
}

/* ---- backend entry points ---- */

static dsc_status inproc_start(dsc_comm_request *req) {
  dsc_comm *c = req->comm;
  rt_group *g = c->impl;
  rt_job *s = g->job;
  pthread_mutex_lock(&s->mu);
  if (s->failed) {
    dsc_status st = report_failure(s, req);
    pthread_mutex_unlock(&s->mu);
    return st;
  }
  char who[64];
  rt_comm_who(c, who, sizeof who);
  rt_slot *slot = find_slot(g, req->seq, true);
  if (!slot) {
    pthread_mutex_unlock(&s->mu);
    ir_error(c->ctx, ir_no_loc, "%s: %s: out of memory", who, rt_comm_kind_name(req->a.kind));
    return DSC_ERR_INTERNAL;
  }
  /* Compare with the first rank that posted here. */
  for (int r = 0; r < g->world; r++) {
    if (!slot->posted[r]) continue;
    if (!args_match(&slot->args[r], &req->a)) {
      char mine[160], theirs[160], full[512], coll[64];
      describe_args(&req->a, mine, sizeof mine);
      describe_args(&slot->args[r], theirs, sizeof theirs);
      snprintf(coll, sizeof coll, "%s%scollective #%lld", c->world_ranks ? c->name : "",
               c->world_ranks ? " " : "", (long long)req->seq);
      snprintf(full, sizeof full,
               "%s does not match across ranks: rank %d started %s, rank %d "
               "started %s",
               coll, job_rank(g, r), theirs, job_rank(g, c->rank), mine);
      fail_locked(s, g, req->seq, full,
                  "does not match across ranks: rank %d started %s, rank %d "
                  "started %s",
                  job_rank(g, r), theirs, job_rank(g, c->rank), mine);
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
  if (slot->arrived == g->world) {
    slot->computing = true;
    pthread_mutex_unlock(&s->mu);
    char why[256];
    const char *err = compute(g, slot, why, sizeof why);
    pthread_mutex_lock(&s->mu);
    slot->computing = false;
    if (!err) {
      slot->computed = true;
    } else {
      char what[96], full[512];
      rt_comm_describe(req, what, sizeof what);
      snprintf(full, sizeof full, "%s: %s", what, err);
      fail_locked(s, g, req->seq, full, "failed: %s", err);
    }
    pthread_cond_broadcast(&s->cv);
  }
  pthread_mutex_unlock(&s->mu);
  return DSC_OK;
}

static void release_locked(rt_group *g, rt_slot *slot) {
  if (++slot->released == g->world) free_slot(g, slot);
}

static dsc_status inproc_wait(dsc_comm_request *req) {
  dsc_comm *c = req->comm;
  rt_group *g = c->impl;
  rt_job *s = g->job;
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
        release_locked(g, slot);
        pthread_mutex_unlock(&s->mu);
        return st;
      }
      for (int r = 0; r < g->world; r++) {
        int jr = job_rank(g, r);
        if (slot->posted[r] || s->left_at[jr] < 0) continue;
        char what[96], full[512], left[128];
        rt_comm_describe(req, what, sizeof what);
        if (g->members)
          snprintf(left, sizeof left, "rank %d returned from its function", jr);
        else
          snprintf(left, sizeof left, "rank %d returned from its function after %lld collectives",
                   jr, (long long)s->left_at[jr]);
        snprintf(full, sizeof full, "%s cannot complete: %s", what, left);
        fail_locked(s, g, req->seq, full, "cannot complete: %s", left);
        break;
      }
      if (s->failed) continue;
      if (rt_comm_now() >= deadline) {
        char what[96], who[128], full[512], me[64];
        rt_comm_describe(req, what, sizeof what);
        missing_ranks(g, slot, who, sizeof who);
        snprintf(full, sizeof full, "%s's %s timed out after %.1f s waiting for %s",
                 rt_comm_who(c, me, sizeof me), what, c->timeout, who);
        fail_locked(s, g, req->seq, full, "timed out after %.1f s waiting for %s", c->timeout, who);
        continue;
      }
    }
    pthread_cond_timedwait(&s->cv, &s->mu, &ts);
  }
  pthread_mutex_unlock(&s->mu);
  /* The result is immutable until every rank has released the slot. */
  deliver(g, slot, c, &req->a);
  pthread_mutex_lock(&s->mu);
  release_locked(g, slot);
  pthread_mutex_unlock(&s->mu);
  return DSC_OK;
}

static void inproc_release(dsc_comm_request *req) {
  rt_group *g = req->comm->impl;
  rt_job *s = g->job;
  pthread_mutex_lock(&s->mu);
  rt_slot *slot = req->impl;
  /* Wait out a computation that may read this rank's buffers. */
  while (slot->computing) pthread_cond_wait(&s->cv, &s->mu);
  release_locked(g, slot);
  pthread_mutex_unlock(&s->mu);
}

static void inproc_abort(dsc_comm *c, const char *reason) {
  rt_group *g = c->impl;
  rt_job *s = g->job;
  int jr = job_rank(g, c->rank);
  /* On the aborting rank's own context too: the run reports the first failed rank's. */
  ir_error(c->ctx, ir_no_loc, "rank %d aborted: %s", jr, reason);
  pthread_mutex_lock(&s->mu);
  char full[512];
  snprintf(full, sizeof full, "rank %d aborted: %s", jr, reason);
  fail_locked(s, NULL, -1, full, "%s", full);
  pthread_mutex_unlock(&s->mu);
}

static void free_group_locked(rt_job *s, rt_group *g) {
  for (rt_group **p = &s->groups; *p; p = &(*p)->next)
    if (*p == g) {
      *p = g->next;
      break;
    }
  while (g->slots) free_slot(g, g->slots);
  free(g->members);
  free(g);
}

/* A member lets go of its group; the last one frees it. */
static void group_unref(rt_group *g) {
  rt_job *s = g->job;
  pthread_mutex_lock(&s->mu);
  if (--g->refs == 0) free_group_locked(s, g);
  pthread_mutex_unlock(&s->mu);
}

static void inproc_group_free(dsc_comm *c) { group_unref(c->impl); }

static dsc_status inproc_split(dsc_comm *parent, int color, int key, const int *members, int n,
                               int rank, const char *name, dsc_comm **out);

const rt_comm_backend rt_comm_inproc_backend = {
    "inproc", inproc_start, inproc_wait, inproc_release, inproc_abort, NULL, inproc_split,
};

/* A group's communicators are freed by their ranks (dsc_comm_free). */
static const rt_comm_backend inproc_group_backend = {
    "inproc",     inproc_start,      inproc_wait,  inproc_release,
    inproc_abort, inproc_group_free, inproc_split,
};

static dsc_status inproc_split(dsc_comm *parent, int color, int key, const int *members, int n,
                               int rank, const char *name, dsc_comm **out) {
  (void)key;
  if (n == 0) return DSC_OK;
  rt_group *pg = parent->impl;
  rt_job *s = pg->job;
  dsc_comm *c = ir_alloc(parent->ctx, sizeof *c);
  if (!c) goto oom;
  pthread_mutex_lock(&s->mu);
  /* The split's all_gather has numbered it: parent->seq is the same on every member. */
  rt_split *sp = NULL;
  for (rt_split *p = s->splits; p; p = p->next)
    if (p->parent == pg && p->seq == parent->seq && p->color == color) sp = p;
  if (!sp) {
    sp = calloc(1, sizeof *sp);
    rt_group *g = calloc(1, sizeof *g);
    int *m = malloc((size_t)n * sizeof *m);
    if (!sp || !g || !m) {
      pthread_mutex_unlock(&s->mu);
      free(sp), free(g), free(m);
      ir_free(parent->ctx, c, sizeof *c);
      goto oom;
    }
    for (int i = 0; i < n; i++) m[i] = job_rank(pg, members[i]);
    *g = (rt_group){s, n, m, NULL, n, s->groups};
    s->groups = g;
    *sp = (rt_split){pg, parent->seq, color, 0, g, s->splits};
    s->splits = sp;
  }
  rt_group *g = sp->g;
  if (++sp->taken == n) { /* the last member: nobody looks for it any more */
    for (rt_split **p = &s->splits; *p; p = &(*p)->next)
      if (*p == sp) {
        *p = sp->next;
        break;
      }
    free(sp);
  }
  pthread_mutex_unlock(&s->mu);
  if (!rt_comm_init_group(c, parent, &inproc_group_backend, members, n, rank, name)) {
    ir_free(parent->ctx, c, sizeof *c);
    group_unref(g);
    goto oom;
  }
  c->local_rank = rank, c->local_world = n; /* one process: one node */
  c->impl = g;
  *out = c;
  return DSC_OK;
oom:
  ir_error(parent->ctx, ir_no_loc, "rank %d: split into '%s': out of memory",
           rt_comm_world_rank(parent, parent->rank), name);
  return DSC_ERR_INTERNAL;
}

/* ---- running the ranks ---- */

typedef struct {
  rt_job *s;
  int rank;
  dsc_comm_rank_fn fn;
  void *ud;
  dsc_status status;
} rank_job;

static void *rank_main(void *p) {
  rank_job *job = p;
  rt_job *s = job->s;
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
    fail_locked(s, NULL, -1, full, "%s", full);
  } else if (unwaited > 0) {
    char full[256];
    snprintf(full, sizeof full, "rank %d returned with %lld collectives started but not waited",
             job->rank, (long long)unwaited);
    fail_locked(s, NULL, -1, full, "%s", full);
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
  rt_job s;
  memset(&s, 0, sizeof s);
  s.root.job = &s;
  s.root.world = world;
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
    s.comms[r].impl = &s.root;
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
  while (s.root.slots) free_slot(&s.root, s.root.slots);
  /* Groups a rank never freed (it failed first): their state, not their comms. */
  while (s.groups) free_group_locked(&s, s.groups);
  while (s.splits) {
    rt_split *sp = s.splits;
    s.splits = sp->next;
    free(sp);
  }
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
