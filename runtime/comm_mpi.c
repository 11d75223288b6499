/* The MPI backend: one rank per process over a duplicate of MPI_COMM_WORLD,
 * with MPI's nonblocking collectives. A wait polls MPI_Test until the
 * communicator's timeout (sleeping between polls, growing to 1 ms): MPI has
 * no portable way to cancel a collective, so a timeout breaks the
 * communicator and the caller ends the job (dsc_comm_abort, or exiting
 * without MPI_Finalize, which makes mpirun stop the other ranks).
 *
 * MPI_Init_thread, MPI_Comm_dup and MPI_Finalize wait for every rank too but
 * take no timeout: a stopped rank keeps its sockets open, so nothing else
 * would ever end them. Each runs under a watchdog (docs/zero.md "When a rank
 * dies"). */
#include "runtime/runtime.h"

#ifndef DSC_HAVE_MPI

bool rt_comm_mpi_available(void) { return false; }

dsc_status rt_comm_mpi_new(dsc_context *ctx, dsc_comm **out) {
  *out = NULL;
  ir_error(ctx, ir_no_loc, "this dsc was built without MPI (configure with Open MPI installed "
           "and -DDSC_ENABLE_MPI=ON)");
  return DSC_ERR_USER;
}

#else

#include <limits.h>
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct {
  MPI_Comm comm;
  bool we_initialised; /* finalise MPI in free */
} rt_mpi;

typedef struct {
  MPI_Request req;
  bool active;
  int *v; /* all_to_all_v: the byte counts and displacements MPI reads until done [4 * world] */
  size_t v_bytes;
} rt_mpi_req;

static void free_req(dsc_comm *c, rt_mpi_req *r) {
  if (r->v) ir_free(c->ctx, r->v, r->v_bytes);
  ir_free(c->ctx, r, sizeof *r);
}

bool rt_comm_mpi_available(void) { return true; }

/* ---- the watchdog of the blocking calls ----
 * Start-up and shut-down wait for the slowest rank's process to get there
 * (started one after another, loading dsc on a busy machine), so they get
 * the collective timeout plus this. */
#define RT_MPI_WATCHDOG_SLACK 10.0

typedef struct {
  pthread_mutex_t mu;
  pthread_cond_t cv; /* on CLOCK_MONOTONIC */
  pthread_t thread;
  bool armed, done;
  double seconds;
  struct timespec deadline;
  char what[48], rank[24];
} rt_mpi_watchdog;

static void *watchdog_main(void *p) {
  rt_mpi_watchdog *w = p;
  pthread_mutex_lock(&w->mu);
  while (!w->done)
    if (pthread_cond_timedwait(&w->cv, &w->mu, &w->deadline) != 0 && !w->done) {
      /* The call cannot be interrupted and the library cannot return from
       * it: end this process. A rank that exits without finalising makes
       * mpirun end the job (killing the stopped rank too). */
      fprintf(stderr,
              "dsc: rank %s: %s did not return within %.1f s (a rank is stopped, gone or far "
              "behind); ending this rank\n",
              w->rank, w->what, w->seconds);
      fflush(stderr);
      _exit(1);
    }
  pthread_mutex_unlock(&w->mu);
  return NULL;
}

/* Without a thread (none could be started) the call runs unwatched. */
static void watchdog_arm(rt_mpi_watchdog *w, const char *what, const char *rank, double seconds) {
  memset(w, 0, sizeof *w);
  snprintf(w->what, sizeof w->what, "%s", what);
  snprintf(w->rank, sizeof w->rank, "%s", rank);
  w->seconds = seconds;
  double t = rt_comm_now() + seconds;
  w->deadline.tv_sec = (time_t)t;
  w->deadline.tv_nsec = (long)((t - (double)w->deadline.tv_sec) * 1e9);
  if (w->deadline.tv_nsec >= 1000000000L) w->deadline.tv_nsec = 999999999L;
  pthread_condattr_t ca;
  if (pthread_condattr_init(&ca) != 0) return;
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  bool cv_ok = pthread_cond_init(&w->cv, &ca) == 0;
  pthread_condattr_destroy(&ca);
  if (!cv_ok) return;
  pthread_mutex_init(&w->mu, NULL);
  if (pthread_create(&w->thread, NULL, watchdog_main, w) != 0) {
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    return;
  }
  w->armed = true;
}

static void watchdog_disarm(rt_mpi_watchdog *w) {
  if (!w->armed) return;
  pthread_mutex_lock(&w->mu);
  w->done = true;
  pthread_cond_signal(&w->cv);
  pthread_mutex_unlock(&w->mu);
  pthread_join(w->thread, NULL);
  pthread_mutex_destroy(&w->mu);
  pthread_cond_destroy(&w->cv);
  w->armed = false;
}

/* This process's rank before MPI can say it (the launcher's variables). */
static const char *env_rank(void) {
  static const char *const vars[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"};
  for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) {
    const char *v = getenv(vars[i]);
    if (v && *v) return v;
  }
  return "?";
}

static dsc_status mpi_fail(dsc_comm *c, const dsc_comm_request *req, int err) {
  char msg[MPI_MAX_ERROR_STRING + 1], who[64];
  int len = 0;
  if (MPI_Error_string(err, msg, &len) != MPI_SUCCESS) len = 0;
  msg[len] = 0;
  rt_comm_who(c, who, sizeof who);
  if (req) {
    char what[96];
    rt_comm_describe(req, what, sizeof what);
    ir_error(c->ctx, ir_no_loc, "%s: %s: MPI error: %s", who, what, msg);
  } else {
    ir_error(c->ctx, ir_no_loc, "%s: MPI error: %s", who, msg);
  }
  c->broken = true;
  return DSC_ERR_USER;
}

static bool mpi_dtype(dsc_dtype dt, MPI_Datatype *out) {
  switch (dt) {
  case DSC_F32: *out = MPI_FLOAT; return true;
  case DSC_F64: *out = MPI_DOUBLE; return true;
  case DSC_I32: *out = MPI_INT32_T; return true;
  case DSC_I64: *out = MPI_INT64_T; return true;
  default: return false;
  }
}

static dsc_status mpi_start(dsc_comm_request *req) {
  dsc_comm *c = req->comm;
  rt_mpi *m = c->impl;
  const rt_comm_args *a = &req->a;
  char what[96], who[64];
  rt_comm_describe(req, what, sizeof what);
  rt_comm_who(c, who, sizeof who);
  if (c->broken) {
    ir_error(c->ctx, ir_no_loc, "%s: %s failed: the communicator is broken by an earlier failure",
             who, what);
    return DSC_ERR_USER;
  }
  /* MPI counts are int: reductions count elements, the rest move bytes. */
  size_t esz = a->kind == RT_COMM_BARRIER ? 1 : dsc_dtype_size(a->dtype);
  int64_t units = a->kind == RT_COMM_ALL_REDUCE || a->kind == RT_COMM_REDUCE_SCATTER
                      ? a->count
                      : a->count * (int64_t)esz;
  int64_t largest = units; /* every int MPI is given */
  if (a->kind == RT_COMM_ALL_TO_ALL_V)
    largest = (rt_comm_a2a_send_extent(c->world, a) > rt_comm_recv_count(c, a)
                   ? rt_comm_a2a_send_extent(c->world, a)
                   : rt_comm_recv_count(c, a)) *
              (int64_t)esz;
  if (units > INT_MAX || largest > INT_MAX) {
    ir_error(c->ctx, ir_no_loc, "%s: %s: count %lld is too large for MPI (int counts)", who, what,
             (long long)(a->count ? a->count : largest / (int64_t)esz));
    return DSC_ERR_USER;
  }
  rt_mpi_req *r = ir_alloc(c->ctx, sizeof *r);
  if (r) memset(r, 0, sizeof *r);
  if (r && a->kind == RT_COMM_ALL_TO_ALL_V) {
    r->v_bytes = 4 * (size_t)c->world * sizeof *r->v;
    r->v = ir_alloc(c->ctx, r->v_bytes);
    if (!r->v) {
      ir_free(c->ctx, r, sizeof *r);
      r = NULL;
    }
  }
  if (!r) {
    ir_error(c->ctx, ir_no_loc, "%s: %s: out of memory", who, what);
    return DSC_ERR_INTERNAL;
  }
  r->active = true;
  MPI_Datatype dt = MPI_BYTE;
  int err = MPI_SUCCESS;
  const void *send = a->send == a->recv ? MPI_IN_PLACE : a->send;
  switch (a->kind) {
  case RT_COMM_ALL_REDUCE:
    mpi_dtype(a->dtype, &dt);
    err = MPI_Iallreduce(send, a->recv, (int)units, dt, MPI_SUM, m->comm, &r->req);
    break;
  case RT_COMM_REDUCE_SCATTER:
    /* In place: the input is recv (count elements), the chunk lands at its start. */
    mpi_dtype(a->dtype, &dt);
    err = MPI_Ireduce_scatter_block(send, a->recv, (int)(units / c->world), dt, MPI_SUM, m->comm,
                                    &r->req);
    break;
  case RT_COMM_ALL_GATHER: {
    /* In place here means the input is at the start of recv; MPI wants it
     * at this rank's offset. */
    size_t bytes = (size_t)units;
    if (a->send == a->recv && bytes && c->rank > 0)
      memmove((unsigned char *)a->recv + (size_t)c->rank * bytes, a->recv, bytes);
    err = MPI_Iallgather(send, (int)units, MPI_BYTE, a->recv, (int)units, MPI_BYTE, m->comm,
                         &r->req);
    break;
  }
  case RT_COMM_BROADCAST:
    err = MPI_Ibcast(a->recv, (int)units, MPI_BYTE, a->root, m->comm, &r->req);
    break;
  case RT_COMM_BARRIER: err = MPI_Ibarrier(m->comm, &r->req); break;
  case RT_COMM_ALL_TO_ALL:
    err =
        MPI_Ialltoall(send, (int)units, MPI_BYTE, a->recv, (int)units, MPI_BYTE, m->comm, &r->req);
    break;
  case RT_COMM_ALL_TO_ALL_V: {
    /* In bytes, as the other moves: MPI reads the arrays until it completes. */
    for (int i = 0; i < 4 * c->world; i++) r->v[i] = (int)(a->v[i] * (int64_t)esz);
    int w = c->world;
    err = MPI_Ialltoallv(a->send, r->v, r->v + w, MPI_BYTE, a->recv, r->v + 2 * w, r->v + 3 * w,
                         MPI_BYTE, m->comm, &r->req);
    break;
  }
  }
  if (err != MPI_SUCCESS) {
    free_req(c, r);
    return mpi_fail(c, req, err);
  }
  req->impl = r;
  return DSC_OK;
}

static dsc_status mpi_wait(dsc_comm_request *req) {
  dsc_comm *c = req->comm;
  rt_mpi_req *r = req->impl;
  double deadline = rt_comm_now() + c->timeout;
  long nap_ns = 10000;
  dsc_status st = DSC_OK;
  for (;;) {
    int done = 0;
    int err = MPI_Test(&r->req, &done, MPI_STATUS_IGNORE);
    if (err != MPI_SUCCESS) {
      st = mpi_fail(c, req, err);
      break;
    }
    if (done) {
      r->active = false;
      if (req->a.op == DSC_COMM_MEAN &&
          (req->a.kind == RT_COMM_ALL_REDUCE || req->a.kind == RT_COMM_REDUCE_SCATTER))
        rt_comm_divide(req->a.recv, rt_comm_recv_count(c, &req->a), req->a.dtype, c->world);
      break;
    }
    /* On a broken communicator the others are gone or will never come:
     * give up at once rather than after another timeout per request. */
    if (c->broken) {
      char what[96], who[64];
      rt_comm_describe(req, what, sizeof what);
      ir_error(c->ctx, ir_no_loc,
               "%s: %s abandoned: the communicator is broken by an earlier "
               "failure",
               rt_comm_who(c, who, sizeof who), what);
      st = DSC_ERR_USER;
      break;
    }
    if (rt_comm_now() >= deadline) {
      char what[96], who[64];
      rt_comm_describe(req, what, sizeof what);
      ir_error(c->ctx, ir_no_loc,
               "%s: %s timed out after %.1f s waiting for the other ranks (MPI cannot tell "
               "which); end the job with dsc_comm_abort",
               rt_comm_who(c, who, sizeof who), what, c->timeout);
      c->broken = true;
      st = DSC_ERR_USER;
      break;
    }
    struct timespec ts = {0, nap_ns};
    nanosleep(&ts, NULL);
    if (nap_ns < 1000000) nap_ns *= 2;
  }
  /* A timed-out request stays active inside MPI; its memory is leaked on
   * purpose (freeing it would let MPI write into freed memory). */
  if (!r->active) free_req(c, r);
  return st;
}

static void mpi_release(dsc_comm_request *req) {
  rt_mpi_req *r = req->impl;
  /* Never waited: the collective may still be running, so the communicator
   * cannot be finalised; the request's memory stays with MPI. */
  if (r && r->active) req->comm->broken = true;
  else if (r)
    free_req(req->comm, r);
}

static void mpi_abort(dsc_comm *c, const char *reason) {
  rt_mpi *m = c->impl;
  /* The one place the library writes: the process ends in MPI_Abort, so the
   * reason would otherwise be lost. */
  fprintf(stderr, "dsc: rank %d: aborting: %s\n", rt_comm_world_rank(c, c->rank), reason);
  fflush(stderr);
  (void)m;
  MPI_Abort(MPI_COMM_WORLD, 1); /* the whole job, also from a group */
}

static void mpi_free(dsc_comm *c) {
  rt_mpi *m = c->impl;
  if (c->world_ranks) { /* a group: its MPI communicator only */
    if (!c->broken) MPI_Comm_free(&m->comm);
    ir_free(c->ctx, m, sizeof *m);
    return;
  }
  if (!c->broken) {
    MPI_Comm_free(&m->comm);
    if (m->we_initialised) {
      /* MPI_Finalize waits for every rank: bounded like a collective. */
      char rank[24];
      snprintf(rank, sizeof rank, "%d", c->rank);
      rt_mpi_watchdog w;
      watchdog_arm(&w, "MPI_Finalize", rank, c->timeout + RT_MPI_WATCHDOG_SLACK);
      MPI_Finalize();
      watchdog_disarm(&w);
    }
  }
  ir_free(c->ctx, m, sizeof *m);
}

static dsc_status mpi_split(dsc_comm *parent, int color, int key, const int *members, int n,
                            int rank, const char *name, dsc_comm **out);

static const rt_comm_backend mpi_backend = {
    "mpi", mpi_start, mpi_wait, mpi_release, mpi_abort, mpi_free, mpi_split,
};

static dsc_status mpi_split(dsc_comm *parent, int color, int key, const int *members, int n,
                            int rank, const char *name, dsc_comm **out) {
  rt_mpi *pm = parent->impl;
  char who[64];
  rt_comm_who(parent, who, sizeof who);
  MPI_Comm sub = MPI_COMM_NULL;
  /* Every rank of parent takes part, also those joining no group. */
  rt_mpi_watchdog w;
  char rk[24];
  snprintf(rk, sizeof rk, "%d", rt_comm_world_rank(parent, parent->rank));
  watchdog_arm(&w, "MPI_Comm_split", rk, parent->timeout + RT_MPI_WATCHDOG_SLACK);
  int err = MPI_Comm_split(pm->comm, color < 0 ? MPI_UNDEFINED : color, key, &sub);
  watchdog_disarm(&w);
  if (err != MPI_SUCCESS) return mpi_fail(parent, NULL, err);
  if (n == 0) return DSC_OK;
  int size = 0, me = -1;
  MPI_Comm_size(sub, &size);
  MPI_Comm_rank(sub, &me);
  dsc_comm *c = ir_alloc(parent->ctx, sizeof *c);
  rt_mpi *m = ir_alloc(parent->ctx, sizeof *m);
  if (!c || !m || !rt_comm_init_group(c, parent, &mpi_backend, members, n, rank, name)) {
    if (c) rt_comm_fini_group(c);
    ir_free(parent->ctx, c, sizeof *c);
    ir_free(parent->ctx, m, sizeof *m);
    MPI_Comm_free(&sub);
    ir_error(parent->ctx, ir_no_loc, "%s: split into '%s': out of memory", who, name);
    return DSC_ERR_INTERNAL;
  }
  if (size != n || me != rank) { /* MPI orders by (key, rank) as comm.c did */
    ir_error(parent->ctx, ir_no_loc,
             "%s: split into '%s': MPI made a group of %d with this rank at %d, expected %d at %d",
             who, name, size, me, n, rank);
    rt_comm_fini_group(c);
    ir_free(parent->ctx, c, sizeof *c);
    ir_free(parent->ctx, m, sizeof *m);
    MPI_Comm_free(&sub);
    return DSC_ERR_INTERNAL;
  }
  MPI_Comm_set_errhandler(sub, MPI_ERRORS_RETURN);
  m->comm = sub;
  m->we_initialised = false;
  MPI_Comm node; /* the group's ranks on this node */
  if (MPI_Comm_split_type(sub, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node) == MPI_SUCCESS) {
    MPI_Comm_rank(node, &c->local_rank);
    MPI_Comm_size(node, &c->local_world);
    MPI_Comm_free(&node);
  }
  c->impl = m;
  *out = c;
  return DSC_OK;
}

dsc_status rt_comm_mpi_new(dsc_context *ctx, dsc_comm **out) {
  *out = NULL;
  int inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (finalized) {
    ir_error(ctx, ir_no_loc, "MPI communicator: MPI has already been finalised");
    return DSC_ERR_USER;
  }
  /* An invalid DSC_COMM_TIMEOUT is reported by rt_comm_init below. */
  double timeout = DSC_COMM_DEFAULT_TIMEOUT;
  rt_comm_env_timeout(&timeout);
  rt_mpi_watchdog w;
  bool we_init = false;
  if (!inited) {
    int provided = 0;
    watchdog_arm(&w, "MPI_Init_thread", env_rank(), timeout + RT_MPI_WATCHDOG_SLACK);
    int err = MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided);
    watchdog_disarm(&w);
    if (err != MPI_SUCCESS) {
      ir_error(ctx, ir_no_loc, "MPI communicator: MPI_Init_thread failed");
      return DSC_ERR_USER;
    }
    we_init = true;
  }
  dsc_comm *c = ir_alloc(ctx, sizeof *c);
  rt_mpi *m = ir_alloc(ctx, sizeof *m);
  if (!c || !m) {
    ir_free(ctx, c, sizeof *c);
    ir_free(ctx, m, sizeof *m);
    ir_error(ctx, ir_no_loc, "MPI communicator: out of memory");
    return DSC_ERR_INTERNAL;
  }
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  dsc_status st = rt_comm_init(c, &mpi_backend, ctx, rank, world);
  int err = MPI_SUCCESS;
  if (st == DSC_OK) {
    /* Our own communicator: our collectives cannot mix with the caller's. */
    char rk[24];
    snprintf(rk, sizeof rk, "%d", rank);
    watchdog_arm(&w, "MPI_Comm_dup", rk, c->timeout + RT_MPI_WATCHDOG_SLACK);
    err = MPI_Comm_dup(MPI_COMM_WORLD, &m->comm);
    watchdog_disarm(&w);
    if (err == MPI_SUCCESS) err = MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN);
    if (err == MPI_SUCCESS) { /* the ranks on this node: who shares its GPUs */
      MPI_Comm node;
      watchdog_arm(&w, "MPI_Comm_split_type", rk, c->timeout + RT_MPI_WATCHDOG_SLACK);
      err = MPI_Comm_split_type(m->comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
      watchdog_disarm(&w);
      if (err == MPI_SUCCESS) {
        MPI_Comm_rank(node, &c->local_rank);
        MPI_Comm_size(node, &c->local_world);
        MPI_Comm_free(&node);
      }
    }
    if (err != MPI_SUCCESS) st = mpi_fail(c, NULL, err);
  }
  if (st != DSC_OK) {
    ir_free(ctx, c, sizeof *c);
    ir_free(ctx, m, sizeof *m);
    if (we_init && err == MPI_SUCCESS) MPI_Finalize();
    return st;
  }
  m->we_initialised = we_init;
  c->impl = m;
  *out = c;
  return DSC_OK;
}

#endif
