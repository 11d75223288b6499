/* Communicators: what every backend shares. Arguments are checked here, once,
 * so that a bad call fails on the calling rank before any backend sees it
 * (and before it takes a collective number, so the ranks stay in step). */
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/runtime.h"

static const char *const kind_names[] = {"all_reduce", "reduce_scatter", "all_gather",  "broadcast",
                                         "barrier",    "all_to_all",     "all_to_all_v"};

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
  snprintf(c->name, sizeof c->name, "world");
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
  const dsc_comm *c = req->comm;
  snprintf(buf, n, "%s%s%s #%lld (step %lld)", c->world_ranks ? c->name : "",
           c->world_ranks ? " " : "", rt_comm_kind_name(req->a.kind), (long long)req->seq,
           (long long)req->a.tag);
}

const char *rt_comm_who(const dsc_comm *c, char *buf, size_t n) {
  if (c->world_ranks)
    snprintf(buf, n, "rank %d (%s rank %d)", c->world_ranks[c->rank], c->name, c->rank);
  else
    snprintf(buf, n, "rank %d", c->rank);
  return buf;
}

int rt_comm_world_rank(const dsc_comm *c, int r) { return c->world_ranks ? c->world_ranks[r] : r; }

/* The largest end (displacement + count) of world per-peer ranges. */
static int64_t extent(const int64_t *counts, const int64_t *displs, int world) {
  int64_t e = 0;
  for (int j = 0; j < world; j++)
    if (counts[j] > 0 && displs[j] + counts[j] > e) e = displs[j] + counts[j];
  return e;
}

int64_t rt_comm_a2a_send_extent(int world, const rt_comm_args *a) {
  if (a->kind == RT_COMM_ALL_TO_ALL_V) return extent(a->v, a->v + world, world);
  return a->count * world;
}

int64_t rt_comm_recv_count(const dsc_comm *c, const rt_comm_args *a) {
  switch (a->kind) {
  case RT_COMM_REDUCE_SCATTER: return a->count / c->world;
  case RT_COMM_ALL_GATHER:
  case RT_COMM_ALL_TO_ALL:
    return a->count * c->world;
  case RT_COMM_ALL_TO_ALL_V:
    return extent(a->v + 2 * c->world, a->v + 3 * c->world, c->world);
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

/* The per-peer ranges of an all_to_all_v: counts and displacements in
 * [0, 2^40]; send ranges may overlap (a range is only read), recv ranges
 * must not (two peers would write the same elements). */
/* An argument error on the calling rank: "rank 5 (ep rank 1): " + the text. */
static dsc_status args_error(dsc_comm *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static dsc_status args_error(dsc_comm *c, const char *fmt, ...) {
  char who[64], msg[448];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  ir_error(c->ctx, ir_no_loc, "%s: %s", rt_comm_who(c, who, sizeof who), msg);
  return DSC_ERR_USER;
}

static bool check_ranges(dsc_comm *c, const rt_comm_args *a) {
  int w = c->world;
  for (int side = 0; side < 2; side++) {
    const int64_t *counts = a->v + 2 * side * w, *displs = counts + w;
    const char *which = side ? "recv" : "send";
    for (int j = 0; j < w; j++) {
      if (counts[j] < 0 || displs[j] < 0 || counts[j] > (int64_t)1 << 40 ||
          displs[j] > (int64_t)1 << 40) {
        args_error(c,
                   "all_to_all_v (step %lld): %s count %lld at displacement %lld for rank %d "
                   "(counts and displacements must be in [0, 2^40])",
                   (long long)a->tag, which, (long long)counts[j], (long long)displs[j],
                   rt_comm_world_rank(c, j));
        return false;
      }
    }
    if (!side) continue;
    for (int i = 0; i < w; i++)
      for (int j = i + 1; j < w; j++)
        if (counts[i] && counts[j] && displs[i] < displs[j] + counts[j] &&
            displs[j] < displs[i] + counts[i]) {
          args_error(c,
                     "all_to_all_v (step %lld): the recv ranges of ranks %d and %d overlap "
                     "([%lld, %lld) and [%lld, %lld))",
                     (long long)a->tag, rt_comm_world_rank(c, i), rt_comm_world_rank(c, j),
                     (long long)displs[i], (long long)(displs[i] + counts[i]), (long long)displs[j],
                     (long long)(displs[j] + counts[j]));
          return false;
        }
  }
  return true;
}

static dsc_status check_args(dsc_comm *c, const rt_comm_args *a, dsc_comm_request **req) {
  const char *name = rt_comm_kind_name(a->kind);
  if (!req) {
    return args_error(c, "%s (step %lld): no request pointer", name, (long long)a->tag);
  }
  *req = NULL;
  if (a->kind == RT_COMM_BARRIER) return DSC_OK;
  if ((unsigned)a->dtype >= DSC_DTYPE_COUNT) {
    return args_error(c, "%s (step %lld): invalid dtype %d", name, (long long)a->tag,
                      (int)a->dtype);
  }
  if (a->kind == RT_COMM_ALL_TO_ALL_V) {
    if (!check_ranges(c, a)) return DSC_ERR_USER;
    if (a->send && a->send == a->recv) {
      return args_error(c,
                        "all_to_all_v (step %lld): send and recv are the same buffer (in place is "
                        "only for all_to_all)",
                        (long long)a->tag);
    }
    if ((rt_comm_a2a_send_extent(c->world, a) > 0 && !a->send) ||
        (rt_comm_recv_count(c, a) > 0 && !a->recv)) {
      return args_error(c, "all_to_all_v (step %lld): NULL buffer", (long long)a->tag);
    }
    return DSC_OK;
  }
  if (a->count < 0) {
    return args_error(c, "%s (step %lld): negative count %lld", name, (long long)a->tag,
                      (long long)a->count);
  }
  /* Byte sizes must fit in a size_t (and the gathered total too). */
  int64_t total = a->kind == RT_COMM_ALL_GATHER || a->kind == RT_COMM_ALL_TO_ALL
                      ? a->count * (int64_t)c->world
                      : a->count;
  if (a->count > (int64_t)1 << 40 || total > (int64_t)1 << 42) {
    return args_error(c, "%s (step %lld): count %lld is too large", name, (long long)a->tag,
                      (long long)a->count);
  }
  if (is_reduction(a->kind)) {
    bool ok = a->dtype == DSC_F32 || a->dtype == DSC_F64 ||
              (a->op == DSC_COMM_SUM && (a->dtype == DSC_I32 || a->dtype == DSC_I64));
    if (a->op != DSC_COMM_SUM && a->op != DSC_COMM_MEAN) {
      return args_error(c, "%s (step %lld): invalid reduction op %d", name, (long long)a->tag,
                        (int)a->op);
    }
    if (!ok) {
      return args_error(c,
                        "%s (step %lld): cannot %s dtype %s (sum: f32, f64, i32, i64; mean: f32, "
                        "f64)",
                        name, (long long)a->tag, a->op == DSC_COMM_SUM ? "sum" : "average",
                        dsc_dtype_name(a->dtype));
    }
  }
  if (a->kind == RT_COMM_REDUCE_SCATTER && a->count % c->world != 0) {
    return args_error(c,
                      "reduce_scatter (step %lld): input length %lld does not divide by the world "
                      "size %d (every rank receives an equal chunk)",
                      (long long)a->tag, (long long)a->count, c->world);
  }
  if (a->kind == RT_COMM_BROADCAST && (a->root < 0 || a->root >= c->world)) {
    return args_error(c, "broadcast (step %lld): root %d is not a rank (world %d)",
                      (long long)a->tag, a->root, c->world);
  }
  bool needs_send = a->kind != RT_COMM_BROADCAST;
  if (a->count > 0 && ((needs_send && !a->send) || !a->recv)) {
    return args_error(c, "%s (step %lld): NULL buffer", name, (long long)a->tag);
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

static size_t v_bytes(const dsc_comm *c) { return 4 * (size_t)c->world * sizeof(int64_t); }

static void free_request(dsc_comm_request *r) {
  dsc_comm *c = r->comm;
  if (r->a.v) ir_free(c->ctx, r->a.v, v_bytes(c));
  ir_free(c->ctx, r, sizeof *r);
}

static dsc_status start(dsc_comm *c, const rt_comm_args *a, dsc_comm_request **out) {
  dsc_status st = check_args(c, a, out);
  if (st != DSC_OK) return st;
  dsc_comm_request *r = ir_alloc(c->ctx, sizeof *r);
  int64_t *v = a->v ? ir_alloc(c->ctx, v_bytes(c)) : NULL;
  if (!r || (a->v && !v)) {
    char who[64];
    ir_error(c->ctx, ir_no_loc, "%s: %s: out of memory", rt_comm_who(c, who, sizeof who),
             rt_comm_kind_name(a->kind));
    if (r) ir_free(c->ctx, r, sizeof *r);
    if (v) ir_free(c->ctx, v, v_bytes(c));
    return DSC_ERR_INTERNAL;
  }
  memset(r, 0, sizeof *r);
  r->comm = c;
  r->a = *a;
  if (v) r->a.v = memcpy(v, a->v, v_bytes(c)); /* the caller's arrays are free to go */
  r->seq = c->seq++;
  st = c->be->start(r);
  if (st != DSC_OK) {
    c->broken = true;
    free_request(r);
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
  free_request(req);
  return st;
}

void rt_comm_release_pending(dsc_comm *c) {
  while (c->pending) {
    dsc_comm_request *r = c->pending;
    c->be->release(r);
    unlink_pending(r);
    free_request(r);
  }
}

void dsc_comm_abort(dsc_comm *c, const char *reason) {
  c->broken = true;
  c->be->abort(c, reason ? reason : "(no reason given)");
}

dsc_status dsc_comm_all_reduce_start(dsc_comm *c, const void *send, void *recv, int64_t count,
                                     dsc_dtype dt, dsc_comm_op op, int64_t tag,
                                     dsc_comm_request **req) {
  rt_comm_args a = {RT_COMM_ALL_REDUCE, dt, op, count, 0, tag, send, recv, NULL};
  return start(c, &a, req);
}

dsc_status dsc_comm_reduce_scatter_start(dsc_comm *c, const void *send, void *recv, int64_t count,
                                         dsc_dtype dt, dsc_comm_op op, int64_t tag,
                                         dsc_comm_request **req) {
  rt_comm_args a = {RT_COMM_REDUCE_SCATTER, dt, op, count, 0, tag, send, recv, NULL};
  return start(c, &a, req);
}

dsc_status dsc_comm_all_gather_start(dsc_comm *c, const void *send, void *recv, int64_t count,
                                     dsc_dtype dt, int64_t tag, dsc_comm_request **req) {
  rt_comm_args a = {RT_COMM_ALL_GATHER, dt, DSC_COMM_SUM, count, 0, tag, send, recv, NULL};
  return start(c, &a, req);
}

dsc_status dsc_comm_broadcast_start(dsc_comm *c, void *buf, int64_t count, dsc_dtype dt, int root,
                                    int64_t tag, dsc_comm_request **req) {
  rt_comm_args a = {RT_COMM_BROADCAST, dt, DSC_COMM_SUM, count, root, tag, buf, buf, NULL};
  return start(c, &a, req);
}

dsc_status dsc_comm_barrier_start(dsc_comm *c, int64_t tag, dsc_comm_request **req) {
  rt_comm_args a = {RT_COMM_BARRIER, DSC_F32, DSC_COMM_SUM, 0, 0, tag, NULL, NULL, NULL};
  return start(c, &a, req);
}

dsc_status dsc_comm_all_to_all_start(dsc_comm *c, const void *send, void *recv, int64_t count,
                                     dsc_dtype dt, int64_t tag, dsc_comm_request **req) {
  rt_comm_args a = {RT_COMM_ALL_TO_ALL, dt, DSC_COMM_SUM, count, 0, tag, send, recv, NULL};
  return start(c, &a, req);
}

dsc_status dsc_comm_all_to_all_v_start(dsc_comm *c, const void *send, const int64_t *send_counts,
                                       const int64_t *send_displs, void *recv,
                                       const int64_t *recv_counts, const int64_t *recv_displs,
                                       dsc_dtype dt, int64_t tag, dsc_comm_request **req) {
  if (!send_counts || !send_displs || !recv_counts || !recv_displs) {
    char who[64];
    ir_error(c->ctx, ir_no_loc, "%s: all_to_all_v (step %lld): NULL counts or displacements",
             rt_comm_who(c, who, sizeof who), (long long)tag);
    if (req) *req = NULL;
    return DSC_ERR_USER;
  }
  /* Gathered into one array for the checks; start copies it for the request. */
  size_t w = (size_t)c->world;
  int64_t stack[64];
  int64_t *v = 4 * w <= 64 ? stack : ir_alloc(c->ctx, v_bytes(c));
  if (!v) {
    ir_error(c->ctx, ir_no_loc, "all_to_all_v: out of memory");
    return DSC_ERR_INTERNAL;
  }
  memcpy(v, send_counts, w * sizeof *v);
  memcpy(v + w, send_displs, w * sizeof *v);
  memcpy(v + 2 * w, recv_counts, w * sizeof *v);
  memcpy(v + 3 * w, recv_displs, w * sizeof *v);
  rt_comm_args a = {RT_COMM_ALL_TO_ALL_V, dt, DSC_COMM_SUM, 0, 0, tag, send, recv, v};
  dsc_status st = start(c, &a, req);
  if (v != stack) ir_free(c->ctx, v, v_bytes(c));
  return st;
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

dsc_status dsc_comm_all_to_all(dsc_comm *c, const void *send, void *recv, int64_t count,
                               dsc_dtype dt, int64_t tag) {
  dsc_comm_request *r = NULL;
  return finish(dsc_comm_all_to_all_start(c, send, recv, count, dt, tag, &r), &r);
}

dsc_status dsc_comm_all_to_all_v(dsc_comm *c, const void *send, const int64_t *send_counts,
                                 const int64_t *send_displs, void *recv, const int64_t *recv_counts,
                                 const int64_t *recv_displs, dsc_dtype dt, int64_t tag) {
  dsc_comm_request *r = NULL;
  return finish(dsc_comm_all_to_all_v_start(c, send, send_counts, send_displs, recv, recv_counts,
                                            recv_displs, dt, tag, &r),
                &r);
}

bool dsc_comm_have_mpi(void) { return rt_comm_mpi_available(); }

dsc_status dsc_comm_mpi_new(dsc_context *ctx, dsc_comm **out) { return rt_comm_mpi_new(ctx, out); }

void dsc_comm_free(dsc_comm *c) {
  if (!c || !c->be->free) return; /* in-process communicators belong to their run */
  dsc_context *ctx = c->ctx;
  rt_comm_release_pending(c);
  c->be->free(c);
  rt_comm_fini_group(c);
  ir_free(ctx, c, sizeof *c);
}

/* ---- groups ---- */

const char *dsc_comm_name(const dsc_comm *c) { return c->name; }

int dsc_comm_world_rank(const dsc_comm *c, int rank) {
  return rank >= 0 && rank < c->world ? rt_comm_world_rank(c, rank) : -1;
}

bool rt_comm_init_group(dsc_comm *g, const dsc_comm *parent, const rt_comm_backend *be,
                        const int *members, int n, int rank, const char *name) {
  memset(g, 0, sizeof *g);
  g->be = be;
  g->ctx = parent->ctx;
  g->rank = rank;
  g->world = n;
  g->local_rank = rank, g->local_world = n;
  g->timeout = parent->timeout;
  snprintf(g->name, sizeof g->name, "%s", name);
  g->world_ranks = ir_alloc(g->ctx, (size_t)n * sizeof *g->world_ranks);
  if (!g->world_ranks) return false;
  for (int i = 0; i < n; i++) g->world_ranks[i] = rt_comm_world_rank(parent, members[i]);
  return true;
}

void rt_comm_fini_group(dsc_comm *g) {
  if (g->world_ranks) ir_free(g->ctx, g->world_ranks, (size_t)g->world * sizeof *g->world_ranks);
  g->world_ranks = NULL;
}

/* A group's name goes into messages and traces: short and plain. */
static bool valid_group_name(const char *name) {
  size_t n = name ? strlen(name) : 0;
  if (n == 0 || n >= sizeof(((dsc_comm *)0)->name)) return false;
  for (size_t i = 0; i < n; i++) {
    char ch = name[i];
    if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
          ch == '_' || ch == '-' || ch == '+' || ch == '.'))
      return false;
  }
  return true;
}

dsc_status dsc_comm_split(dsc_comm *c, int color, int key, const char *name, dsc_comm **out) {
  char who[64];
  rt_comm_who(c, who, sizeof who);
  if (!out) {
    ir_error(c->ctx, ir_no_loc, "%s: split: no result pointer", who);
    return DSC_ERR_USER;
  }
  *out = NULL;
  if (!valid_group_name(name)) {
    ir_error(c->ctx, ir_no_loc,
             "%s: split: group name '%s' must be 1 to %zu letters, digits or _-+.", who,
             name ? name : "(null)", sizeof c->name - 1);
    return DSC_ERR_USER;
  }
  if (!c->be->split) {
    ir_error(c->ctx, ir_no_loc, "%s: split: the %s backend has no groups", who, c->be->name);
    return DSC_ERR_USER;
  }
  /* Every rank learns every (color, key); a negative color joins no group. */
  size_t w = (size_t)c->world;
  int64_t mine[2] = {color < 0 ? -1 : color, key};
  int64_t *all = ir_alloc(c->ctx, 2 * w * sizeof *all);
  int *members = ir_alloc(c->ctx, w * sizeof *members);
  if (!all || !members) {
    if (all) ir_free(c->ctx, all, 2 * w * sizeof *all);
    if (members) ir_free(c->ctx, members, w * sizeof *members);
    ir_error(c->ctx, ir_no_loc, "%s: split: out of memory", who);
    return DSC_ERR_INTERNAL;
  }
  dsc_status st = dsc_comm_all_gather(c, mine, all, 2, DSC_I64, 0);
  int n = 0, rank = -1;
  if (st == DSC_OK && color >= 0) {
    /* Ranks of this color ordered by (key, parent rank), as MPI_Comm_split. */
    for (int r = 0; r < c->world; r++) {
      if (all[2 * r] != color) continue;
      int at = n++;
      while (at > 0 && all[2 * members[at - 1] + 1] > all[2 * r + 1]) {
        members[at] = members[at - 1];
        at--;
      }
      members[at] = r;
    }
    for (int i = 0; i < n; i++)
      if (members[i] == c->rank) rank = i;
  }
  if (st == DSC_OK) st = c->be->split(c, color < 0 ? -1 : color, key, members, n, rank, name, out);
  ir_free(c->ctx, all, 2 * w * sizeof *all);
  ir_free(c->ctx, members, w * sizeof *members);
  return st;
}
