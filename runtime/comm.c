/* Communicators: what every backend shares. Arguments are checked here, once,
 * so that a bad call fails on the calling rank before any backend sees it
 * (and before it takes a collective number, so the ranks stay in step). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/runtime.h"

static const char *const kind_names[] = {"all_reduce", "reduce_scatter", "all_gather",
                                         "broadcast", "barrier"};

const char *rt_comm_kind_name(rt_comm_kind k) { return kind_names[k]; }

double rt_comm_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

dsc_status rt_comm_init(dsc_comm *c, const rt_comm_backend *be, dsc_context *ctx, int rank,
                        int world) {
  memset(c, 0, sizeof *c);
  c->be = be;
  c->ctx = ctx;
  c->rank = rank;
  c->world = world;
  c->local_rank = rank, c->local_world = world; /* one node until the backend says more */
  c->timeout = DSC_COMM_DEFAULT_TIMEOUT;
  if (!rt_comm_env_timeout(&c->timeout)) {
    ir_error(ctx, ir_no_loc, "DSC_COMM_TIMEOUT: expected a positive number of seconds, got '%s'",
             getenv("DSC_COMM_TIMEOUT"));
    return DSC_ERR_USER;
  }
  return DSC_OK;
}

bool rt_comm_env_timeout(double *seconds) {
  const char *env = getenv("DSC_COMM_TIMEOUT");
  if (!env || !*env) return true;
  char *end;
  double t = strtod(env, &end);
  if (*end != 0 || !(t > 0) || !isfinite(t)) return false;
  *seconds = t;
  return true;
}

int dsc_comm_rank(const dsc_comm *c) { return c->rank; }
int dsc_comm_world(const dsc_comm *c) { return c->world; }
int dsc_comm_local_rank(const dsc_comm *c) { return c->local_rank; }
int dsc_comm_local_world(const dsc_comm *c) { return c->local_world; }
const char *dsc_comm_backend(const dsc_comm *c) { return c->be->name; }
dsc_context *dsc_comm_context(const dsc_comm *c) { return c->ctx; }
double dsc_comm_timeout(const dsc_comm *c) { return c->timeout; }
bool dsc_comm_broken(const dsc_comm *c) { return c->broken; }

dsc_status dsc_comm_set_timeout(dsc_comm *c, double seconds) {
  if (!(seconds > 0) || !isfinite(seconds)) {
    ir_error(c->ctx, ir_no_loc, "rank %d: communicator timeout must be a positive number of "
             "seconds, got %g", c->rank, seconds);
    return DSC_ERR_USER;
  }
  c->timeout = seconds;
  return DSC_OK;
}

void rt_comm_describe(const dsc_comm_request *req, char *buf, size_t n) {
  snprintf(buf, n, "%s #%lld (step %lld)", rt_comm_kind_name(req->a.kind), (long long)req->seq,
           (long long)req->a.tag);
}

int64_t rt_comm_recv_count(const dsc_comm *c, const rt_comm_args *a) {
  switch (a->kind) {
  case RT_COMM_REDUCE_SCATTER: return a->count / c->world;
  case RT_COMM_ALL_GATHER: return a->count * c->world;
  case RT_COMM_BARRIER: return 0;
  default: return a->count;
  }
}

void rt_comm_accumulate(void *dst, const void *src, int64_t count, dsc_dtype dt) {
  switch (dt) {
  case DSC_F32: {
    float *d = dst;
    const float *s = src;
    for (int64_t i = 0; i < count; i++) d[i] += s[i];
    break;
  }
  case DSC_F64: {
    double *d = dst;
    const double *s = src;
    for (int64_t i = 0; i < count; i++) d[i] += s[i];
    break;
  }
  case DSC_I32: { /* unsigned: overflow wraps instead of being undefined */
    uint32_t *d = dst;
    const uint32_t *s = src;
    for (int64_t i = 0; i < count; i++) d[i] += s[i];
    break;
  }
  case DSC_I64: {
    uint64_t *d = dst;
    const uint64_t *s = src;
    for (int64_t i = 0; i < count; i++) d[i] += s[i];
    break;
  }
  default: break; /* rejected by the argument checks */
  }
}

void rt_comm_divide(void *buf, int64_t count, dsc_dtype dt, int world) {
  if (dt == DSC_F32) {
    float *d = buf;
    for (int64_t i = 0; i < count; i++) d[i] /= (float)world;
  } else if (dt == DSC_F64) {
    double *d = buf;
    for (int64_t i = 0; i < count; i++) d[i] /= (double)world;
  }
}

/* ---- starting and waiting ---- */

static bool is_reduction(rt_comm_kind k) {
  return k == RT_COMM_ALL_REDUCE || k == RT_COMM_REDUCE_SCATTER;
}

static dsc_status check_args(dsc_comm *c, const rt_comm_args *a, dsc_comm_request **req) {
  const char *name = rt_comm_kind_name(a->kind);
  dsc_context *ctx = c->ctx;
  if (!req) {
    ir_error(ctx, ir_no_loc, "rank %d: %s (step %lld): no request pointer", c->rank, name,
             (long long)a->tag);
    return DSC_ERR_USER;
  }
  *req = NULL;
  if (a->kind == RT_COMM_BARRIER) return DSC_OK;
  if ((unsigned)a->dtype >= DSC_DTYPE_COUNT) {
    ir_error(ctx, ir_no_loc, "rank %d: %s (step %lld): invalid dtype %d", c->rank, name,
             (long long)a->tag, (int)a->dtype);
    return DSC_ERR_USER;
  }
  if (a->count < 0) {
    ir_error(ctx, ir_no_loc, "rank %d: %s (step %lld): negative count %lld", c->rank, name,
             (long long)a->tag, (long long)a->count);
    return DSC_ERR_USER;
  }
  /* Byte sizes must fit in a size_t (and the gathered total too). */
  int64_t total = a->kind == RT_COMM_ALL_GATHER ? a->count * (int64_t)c->world : a->count;
  if (a->count > (int64_t)1 << 40 || total > (int64_t)1 << 42) {
    ir_error(ctx, ir_no_loc, "rank %d: %s (step %lld): count %lld is too large", c->rank, name,
             (long long)a->tag, (long long)a->count);
    return DSC_ERR_USER;
  }
  if (is_reduction(a->kind)) {
    bool ok = a->dtype == DSC_F32 || a->dtype == DSC_F64 ||
              (a->op == DSC_COMM_SUM && (a->dtype == DSC_I32 || a->dtype == DSC_I64));
    if (a->op != DSC_COMM_SUM && a->op != DSC_COMM_MEAN) {
      ir_error(ctx, ir_no_loc, "rank %d: %s (step %lld): invalid reduction op %d", c->rank, name,
               (long long)a->tag, (int)a->op);
      return DSC_ERR_USER;
    }
    if (!ok) {
      ir_error(ctx, ir_no_loc,
               "rank %d: %s (step %lld): cannot %s dtype %s (sum: f32, f64, i32, i64; mean: f32, "
               "f64)",
               c->rank, name, (long long)a->tag, a->op == DSC_COMM_SUM ? "sum" : "average",
               dsc_dtype_name(a->dtype));
      return DSC_ERR_USER;
    }
  }
  if (a->kind == RT_COMM_REDUCE_SCATTER && a->count % c->world != 0) {
    ir_error(ctx, ir_no_loc,
             "rank %d: reduce_scatter (step %lld): input length %lld does not divide by the world "
             "size %d (every rank receives an equal chunk)",
             c->rank, (long long)a->tag, (long long)a->count, c->world);
    return DSC_ERR_USER;
  }
  if (a->kind == RT_COMM_BROADCAST && (a->root < 0 || a->root >= c->world)) {
    ir_error(ctx, ir_no_loc, "rank %d: broadcast (step %lld): root %d is not a rank (world %d)",
             c->rank, (long long)a->tag, a->root, c->world);
    return DSC_ERR_USER;
  }
  bool needs_send = a->kind != RT_COMM_BROADCAST;
  if (a->count > 0 && ((needs_send && !a->send) || !a->recv)) {
    ir_error(ctx, ir_no_loc, "rank %d: %s (step %lld): NULL buffer", c->rank, name,
             (long long)a->tag);
    return DSC_ERR_USER;
  }
  return DSC_OK;
}

static void unlink_pending(dsc_comm_request *r) {
  dsc_comm *c = r->comm;
  if (r->prev) r->prev->next = r->next;
  else c->pending = r->next;
  if (r->next) r->next->prev = r->prev;
  c->n_pending--;
}

static dsc_status start(dsc_comm *c, const rt_comm_args *a, dsc_comm_request **out) {
  dsc_status st = check_args(c, a, out);
  if (st != DSC_OK) return st;
  dsc_comm_request *r = ir_alloc(c->ctx, sizeof *r);
  if (!r) {
    ir_error(c->ctx, ir_no_loc, "rank %d: %s: out of memory", c->rank, rt_comm_kind_name(a->kind));
    return DSC_ERR_INTERNAL;
  }
  memset(r, 0, sizeof *r);
  r->comm = c;
  r->a = *a;
  r->seq = c->seq++;
  st = c->be->start(r);
  if (st != DSC_OK) {
    c->broken = true;
    ir_free(c->ctx, r, sizeof *r);
    return st;
  }
  r->next = c->pending;
  if (c->pending) c->pending->prev = r;
  c->pending = r;
  c->n_pending++;
  *out = r;
  return DSC_OK;
}

dsc_status dsc_comm_wait(dsc_comm_request *req) {
  if (!req) return DSC_ERR_USER;
  dsc_comm *c = req->comm;
  dsc_status st = c->be->wait(req);
  if (st != DSC_OK) c->broken = true;
  unlink_pending(req);
  ir_free(c->ctx, req, sizeof *req);
  return st;
}

void rt_comm_release_pending(dsc_comm *c) {
  while (c->pending) {
    dsc_comm_request *r = c->pending;
    c->be->release(r);
    unlink_pending(r);
    ir_free(c->ctx, r, sizeof *r);
  }
}

void dsc_comm_abort(dsc_comm *c, const char *reason) {
  c->broken = true;
  c->be->abort(c, reason ? reason : "(no reason given)");
}

dsc_status dsc_comm_all_reduce_start(dsc_comm *c, const void *send, void *recv, int64_t count,
                                     dsc_dtype dt, dsc_comm_op op, int64_t tag,
                                     dsc_comm_request **req) {
  rt_comm_args a = {RT_COMM_ALL_REDUCE, dt, op, count, 0, tag, send, recv};
  return start(c, &a, req);
}

dsc_status dsc_comm_reduce_scatter_start(dsc_comm *c, const void *send, void *recv, int64_t count,
                                         dsc_dtype dt, dsc_comm_op op, int64_t tag,
                                         dsc_comm_request **req) {
  rt_comm_args a = {RT_COMM_REDUCE_SCATTER, dt, op, count, 0, tag, send, recv};
  return start(c, &a, req);
}

dsc_status dsc_comm_all_gather_start(dsc_comm *c, const void *send, void *recv, int64_t count,
                                     dsc_dtype dt, int64_t tag, dsc_comm_request **req) {
  rt_comm_args a = {RT_COMM_ALL_GATHER, dt, DSC_COMM_SUM, count, 0, tag, send, recv};
  return start(c, &a, req);
}

dsc_status dsc_comm_broadcast_start(dsc_comm *c, void *buf, int64_t count, dsc_dtype dt, int root,
                                    int64_t tag, dsc_comm_request **req) {
  rt_comm_args a = {RT_COMM_BROADCAST, dt, DSC_COMM_SUM, count, root, tag, buf, buf};
  return start(c, &a, req);
}

dsc_status dsc_comm_barrier_start(dsc_comm *c, int64_t tag, dsc_comm_request **req) {
  rt_comm_args a = {RT_COMM_BARRIER, DSC_F32, DSC_COMM_SUM, 0, 0, tag, NULL, NULL};
  return start(c, &a, req);
}

/* Takes &r: the request exists only once the start call has returned. */
static dsc_status finish(dsc_status st, dsc_comm_request **r) {
  return st == DSC_OK ? dsc_comm_wait(*r) : st;
}

dsc_status dsc_comm_all_reduce(dsc_comm *c, const void *send, void *recv, int64_t count,
                               dsc_dtype dt, dsc_comm_op op, int64_t tag) {
  dsc_comm_request *r = NULL;
  return finish(dsc_comm_all_reduce_start(c, send, recv, count, dt, op, tag, &r), &r);
}

dsc_status dsc_comm_reduce_scatter(dsc_comm *c, const void *send, void *recv, int64_t count,
                                   dsc_dtype dt, dsc_comm_op op, int64_t tag) {
  dsc_comm_request *r = NULL;
  return finish(dsc_comm_reduce_scatter_start(c, send, recv, count, dt, op, tag, &r), &r);
}

dsc_status dsc_comm_all_gather(dsc_comm *c, const void *send, void *recv, int64_t count,
                               dsc_dtype dt, int64_t tag) {
  dsc_comm_request *r = NULL;
  return finish(dsc_comm_all_gather_start(c, send, recv, count, dt, tag, &r), &r);
}

dsc_status dsc_comm_broadcast(dsc_comm *c, void *buf, int64_t count, dsc_dtype dt, int root,
                              int64_t tag) {
  dsc_comm_request *r = NULL;
  return finish(dsc_comm_broadcast_start(c, buf, count, dt, root, tag, &r), &r);
}

dsc_status dsc_comm_barrier(dsc_comm *c, int64_t tag) {
  dsc_comm_request *r = NULL;
  return finish(dsc_comm_barrier_start(c, tag, &r), &r);
}

bool dsc_comm_have_mpi(void) { return rt_comm_mpi_available(); }

dsc_status dsc_comm_mpi_new(dsc_context *ctx, dsc_comm **out) { return rt_comm_mpi_new(ctx, out); }

void dsc_comm_free(dsc_comm *c) {
  if (!c || !c->be->free) return; /* in-process communicators belong to their run */
  dsc_context *ctx = c->ctx;
  rt_comm_release_pending(c);
  c->be->free(c);
  ir_free(ctx, c, sizeof *c);
}
