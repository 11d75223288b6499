/* The disk tier's file (runtime/runtime.h "runtime/offload_io.c"): one file
 * per rank, a header page and two slots, read and written with pread/pwrite
 * on a small pool of IO threads.
 *
 * Layout: bytes [0, 512) the header (magic "DSCOFF01", version, active slot,
 * generation, slot bytes, value count, FNV-1a of those fields), zeros to
 * 4096, then slot 0 and slot 1 of slot_bytes each. Why two slots: a step
 * that fails (or a disk that fills up) half way through its write-back must
 * not leave a mix of old and new values, as an assign that fails changes
 * nothing; the header flips only after the other slot is on disk. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/runtime.h"

#define HDR_BYTES 512
#define DATA_START 4096

/* A chunk of a streamed transfer (the queue of the IO threads). */
typedef struct {
  int req;
  bool write;
  char *buf;
  int64_t len, off;
} stream_task;

/* A streamed transfer: done when pending reaches 0. */
typedef struct {
  int64_t pending;
  int err;
  int64_t err_off;
  bool write;
} stream_req;

struct rt_offload {
  dsc_context *ctx;
  char *path;
  int fd;
  int n;
  int64_t *offsets, *bytes;
  int64_t slot_bytes;
  uint32_t active;
  int64_t generation;
  /* streaming: IO threads over a queue, guarded by mu (workers touch reqs
   * and the queue only under it; the main thread grows them under it) */
  int want_threads, n_threads;
  pthread_t *threads;
  pthread_mutex_t mu;
  pthread_cond_t work, done;
  bool stop, sync_init;
  stream_task *queue;
  int64_t q_head, q_len, q_cap; /* a ring */
  stream_req *reqs;
  int n_reqs, cap_reqs;
  bool *written; /* per value, in the current begin..end */
  bool failed;   /* some transfer since begin failed */
};

typedef struct {
  int fd;
  bool write;
  char *buf;
  int64_t len, off;
} io_task;

typedef struct {
  io_task *tasks;
  int64_t n;
  atomic_llong next;
  atomic_int failed;
  int err;         /* errno of the first failure */
  int64_t err_off; /* its file offset */
  pthread_mutex_t mu;
} io_job;

static void *io_worker(void *arg) {
  io_job *j = arg;
  for (;;) {
    if (atomic_load(&j->failed)) break;
    long long i = atomic_fetch_add(&j->next, 1);
    if (i >= j->n) break;
    io_task *t = &j->tasks[i];
    int64_t done = 0;
    while (done < t->len) {
      ssize_t r = t->write ? pwrite(t->fd, t->buf + done, (size_t)(t->len - done), t->off + done)
                           : pread(t->fd, t->buf + done, (size_t)(t->len - done), t->off + done);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) {
        pthread_mutex_lock(&j->mu);
        if (!atomic_load(&j->failed)) {
          j->err = r < 0 ? errno : EIO; /* a short read: the file was truncated */
          j->err_off = t->off + done;
          atomic_store(&j->failed, 1);
        }
        pthread_mutex_unlock(&j->mu);
        return NULL;
      }
      done += r;
    }
  }
  return NULL;
}

/* Runs the tasks on up to `threads` threads (the caller is one). */
static bool run_io(io_task *tasks, int64_t n, int threads, int *err, int64_t *err_off) {
  io_job j;
  memset(&j, 0, sizeof j);
  j.tasks = tasks, j.n = n;
  atomic_init(&j.next, 0);
  atomic_init(&j.failed, 0);
  pthread_mutex_init(&j.mu, NULL);
  pthread_t th[64];
  int started = 0;
  if (threads < 1) threads = 1;
  if (threads > 64) threads = 64;
  int64_t want = n - 1 < threads - 1 ? n - 1 : threads - 1;
  for (int i = 0; i < want; i++)
    if (pthread_create(&th[started], NULL, io_worker, &j) == 0) started++;
  io_worker(&j);
  for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
  pthread_mutex_destroy(&j.mu);
  *err = j.err, *err_off = j.err_off;
  return !atomic_load(&j.failed);
}

static uint64_t fnv(const void *p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ ((const unsigned char *)p)[i]) * 1099511628211ull;
  return h;
}

static void put64(unsigned char *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static bool write_header(rt_offload *o, uint32_t active, int64_t gen, char *err, size_t errlen) {
  unsigned char h[HDR_BYTES];
  memset(h, 0, sizeof h);
  memcpy(h, "DSCOFF01", 8);
  put64(h + 8, 1);
  put64(h + 16, active);
  put64(h + 24, (uint64_t)gen);
  put64(h + 32, (uint64_t)o->slot_bytes);
  put64(h + 40, (uint64_t)o->n);
  put64(h + 48, fnv(h, 48));
  ssize_t r;
  do r = pwrite(o->fd, h, sizeof h, 0);
  while (r < 0 && errno == EINTR);
  if (r != (ssize_t)sizeof h || fdatasync(o->fd) != 0) {
    snprintf(err, errlen, "offload file '%s': writing its header failed: %s", o->path,
             strerror(r < 0 ? errno : errno ? errno : EIO));
    return false;
  }
  return true;
}

rt_offload *rt_offload_open(dsc_context *ctx, const char *path, int n, const int64_t *offsets,
                            const int64_t *bytes, int64_t slot_bytes) {
  if (n < 0 || slot_bytes < 0 || slot_bytes > (INT64_MAX - DATA_START) / 2) {
    ir_error(ctx, rt_loc(path), "offload file: bad layout");
    return NULL;
  }
  rt_offload *o = ir_alloc(ctx, sizeof *o);
  if (!o) return NULL;
  memset(o, 0, sizeof *o);
  o->ctx = ctx, o->fd = -1, o->n = n, o->slot_bytes = slot_bytes;
  o->want_threads = RT_OFFLOAD_THREADS;
  pthread_mutex_init(&o->mu, NULL);
  pthread_cond_init(&o->work, NULL);
  pthread_cond_init(&o->done, NULL);
  o->sync_init = true;
  o->written = ir_alloc(ctx, (size_t)n + 1);
  size_t pl = strlen(path) + 1;
  o->path = ir_alloc(ctx, pl);
  o->offsets = ir_alloc(ctx, sizeof(int64_t) * (size_t)(n + 1));
  o->bytes = ir_alloc(ctx, sizeof(int64_t) * (size_t)(n + 1));
  if (!o->path || !o->offsets || !o->bytes || !o->written) {
    ir_error(ctx, ir_no_loc, "offload: out of memory");
    rt_offload_free(o);
    return NULL;
  }
  memcpy(o->path, path, pl);
  for (int i = 0; i < n; i++) {
    if (offsets[i] < 0 || bytes[i] < 0 || offsets[i] > slot_bytes - bytes[i]) {
      ir_error(ctx, rt_loc(path), "offload file: value %d lies outside its slot", i);
      rt_offload_free(o);
      return NULL;
    }
    o->offsets[i] = offsets[i], o->bytes[i] = bytes[i];
  }
  o->fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (o->fd < 0) {
    ir_error(ctx, ir_no_loc, "cannot create offload file '%s': %s (--offload-dir must be a "
             "writable directory)", path, strerror(errno));
    rt_offload_free(o);
    return NULL;
  }
  /* Slot 1 is "active" until the first commit, which so writes slot 0: the
   * file grows to its full size only with the second commit (a full disk
   * then fails a step, which must change nothing, not the start). */
  o->active = 1;
  char err[1200];
  if (!write_header(o, 1, 0, err, sizeof err)) {
    ir_error(ctx, ir_no_loc, "%s", err);
    rt_offload_free(o);
    return NULL;
  }
  return o;
}

static void stop_threads(rt_offload *o);

void rt_offload_free(rt_offload *o) {
  if (!o) return;
  dsc_context *ctx = o->ctx;
  stop_threads(o);
  if (o->sync_init) {
    pthread_mutex_destroy(&o->mu);
    pthread_cond_destroy(&o->work);
    pthread_cond_destroy(&o->done);
  }
  if (o->queue) ir_free(ctx, o->queue, sizeof(stream_task) * (size_t)o->q_cap);
  if (o->reqs) ir_free(ctx, o->reqs, sizeof(stream_req) * (size_t)o->cap_reqs);
  if (o->written) ir_free(ctx, o->written, (size_t)o->n + 1);
  if (o->fd >= 0) close(o->fd);
  if (o->path) ir_free(ctx, o->path, strlen(o->path) + 1);
  if (o->offsets) ir_free(ctx, o->offsets, sizeof(int64_t) * (size_t)(o->n + 1));
  if (o->bytes) ir_free(ctx, o->bytes, sizeof(int64_t) * (size_t)(o->n + 1));
  ir_free(ctx, o, sizeof *o);
}

const char *rt_offload_path(const rt_offload *o) { return o->path; }
int64_t rt_offload_generation(const rt_offload *o) { return o->generation; }

/* One task per chunk of every value of slot `slot`. */
static bool transfer(rt_offload *o, uint32_t slot, char *const *bufs, bool write, char *err,
                     size_t errlen) {
  int64_t nt = 0;
  for (int i = 0; i < o->n; i++)
    if (bufs[i] && o->bytes[i] > 0) nt += (o->bytes[i] + RT_OFFLOAD_CHUNK - 1) / RT_OFFLOAD_CHUNK;
  if (nt == 0) return true;
  io_task *t = ir_alloc(o->ctx, sizeof *t * (size_t)nt);
  if (!t) {
    snprintf(err, errlen, "offload file '%s': out of memory", o->path);
    return false;
  }
  int64_t k = 0, base = DATA_START + (int64_t)slot * o->slot_bytes;
  for (int i = 0; i < o->n; i++) {
    if (!bufs[i]) continue;
    for (int64_t c = 0; c < o->bytes[i]; c += RT_OFFLOAD_CHUNK) {
      int64_t len = o->bytes[i] - c < RT_OFFLOAD_CHUNK ? o->bytes[i] - c : RT_OFFLOAD_CHUNK;
      t[k++] = (io_task){o->fd, write, bufs[i] + c, len, base + o->offsets[i] + c};
    }
  }
  int e = 0;
  int64_t at = 0;
  bool ok = run_io(t, nt, o->want_threads, &e, &at);
  ir_free(o->ctx, t, sizeof *t * (size_t)nt);
  if (!ok)
    snprintf(err, errlen, "offload file '%s': %s at offset %" PRId64 " failed: %s", o->path,
             write ? "writing" : "reading", at, strerror(e));
  return ok;
}

bool rt_offload_read(rt_offload *o, void *const *dst, char *err, size_t errlen) {
  if (o->generation == 0) {
    snprintf(err, errlen, "offload file '%s': no values written yet", o->path);
    return false;
  }
  return transfer(o, o->active, (char *const *)dst, false, err, errlen);
}

bool rt_offload_commit(rt_offload *o, const void *const *src, char *err, size_t errlen) {
  for (int i = 0; i < o->n; i++)
    if (!src[i]) { /* the other slot must get every value before it becomes active */
      snprintf(err, errlen, "offload file '%s': a commit needs every value", o->path);
      return false;
    }
  uint32_t other = o->active ^ 1u;
  if (!transfer(o, other, (char *const *)src, true, err, errlen)) return false;
  if (fdatasync(o->fd) != 0) {
    snprintf(err, errlen, "offload file '%s': sync failed: %s", o->path, strerror(errno));
    return false;
  }
  if (!write_header(o, other, o->generation + 1, err, errlen)) return false;
  o->active = other;
  o->generation++;
  return true;
}

/* ---- streaming ---- */

static void *stream_worker(void *arg) {
  rt_offload *o = arg;
  pthread_mutex_lock(&o->mu);
  for (;;) {
    while (!o->stop && o->q_len == 0) pthread_cond_wait(&o->work, &o->mu);
    if (o->q_len == 0) break; /* stop, and nothing left */
    stream_task t = o->queue[o->q_head];
    o->q_head = (o->q_head + 1) % o->q_cap;
    o->q_len--;
    bool skip = o->reqs[t.req].err != 0; /* an earlier chunk failed */
    pthread_mutex_unlock(&o->mu);
    int e = 0;
    int64_t done = 0;
    while (!skip && done < t.len) {
      ssize_t r = t.write ? pwrite(o->fd, t.buf + done, (size_t)(t.len - done), t.off + done)
                          : pread(o->fd, t.buf + done, (size_t)(t.len - done), t.off + done);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) {
        e = r < 0 ? errno : EIO; /* a short read: the file was truncated */
        break;
      }
      done += r;
    }
    pthread_mutex_lock(&o->mu);
    stream_req *q = &o->reqs[t.req];
    if (e && !q->err) q->err = e, q->err_off = t.off + done;
    if (--q->pending == 0) pthread_cond_broadcast(&o->done);
  }
  pthread_mutex_unlock(&o->mu);
  return NULL;
}

static void stop_threads(rt_offload *o) {
  if (o->n_threads == 0) return;
  pthread_mutex_lock(&o->mu);
  o->stop = true;
  pthread_cond_broadcast(&o->work);
  pthread_mutex_unlock(&o->mu);
  for (int i = 0; i < o->n_threads; i++) pthread_join(o->threads[i], NULL);
  ir_free(o->ctx, o->threads, sizeof(pthread_t) * (size_t)o->want_threads);
  o->threads = NULL;
  o->n_threads = 0;
  o->stop = false;
}

bool rt_offload_set_threads(rt_offload *o, int n) {
  if (n < 1 || n > 64) return false;
  if (n != o->want_threads) {
    stop_threads(o);
    o->want_threads = n;
  }
  return true;
}

int64_t rt_offload_value_bytes(const rt_offload *o, int value) {
  return value >= 0 && value < o->n ? o->bytes[value] : 0;
}

static void drain(rt_offload *o) {
  pthread_mutex_lock(&o->mu);
  for (int i = 0; i < o->n_reqs; i++)
    while (o->reqs[i].pending > 0) pthread_cond_wait(&o->done, &o->mu);
  pthread_mutex_unlock(&o->mu);
}

void rt_offload_begin(rt_offload *o) {
  drain(o); /* nothing of an earlier run may still write into its buffers */
  o->n_reqs = 0;
  o->failed = false;
  memset(o->written, 0, (size_t)o->n + 1);
}

static bool start_threads(rt_offload *o, char *err, size_t errlen) {
  if (o->n_threads > 0) return true;
  o->threads = ir_alloc(o->ctx, sizeof(pthread_t) * (size_t)o->want_threads);
  if (!o->threads) {
    snprintf(err, errlen, "offload file '%s': out of memory", o->path);
    return false;
  }
  for (int i = 0; i < o->want_threads; i++) {
    if (pthread_create(&o->threads[o->n_threads], NULL, stream_worker, o) != 0) break;
    o->n_threads++;
  }
  if (o->n_threads == 0) {
    ir_free(o->ctx, o->threads, sizeof(pthread_t) * (size_t)o->want_threads);
    o->threads = NULL;
    snprintf(err, errlen, "offload file '%s': cannot start an IO thread", o->path);
    return false;
  }
  return true;
}

int rt_offload_start(rt_offload *o, int value, void *buf, bool write, char *err, size_t errlen) {
  if (value < 0 || value >= o->n) {
    snprintf(err, errlen, "offload file '%s': value %d does not exist", o->path, value);
    return -1;
  }
  if (!write && o->generation == 0) {
    snprintf(err, errlen, "offload file '%s': no values written yet", o->path);
    return -1;
  }
  if (!start_threads(o, err, errlen)) return -1;
  int64_t chunks = (o->bytes[value] + RT_OFFLOAD_CHUNK - 1) / RT_OFFLOAD_CHUNK;
  uint32_t slot = write ? o->active ^ 1u : o->active;
  int64_t base = DATA_START + (int64_t)slot * o->slot_bytes + o->offsets[value];
  pthread_mutex_lock(&o->mu);
  bool ok = true;
  if (o->n_reqs + 1 > o->cap_reqs) { /* grow (workers read reqs only under mu) */
    int cap = o->cap_reqs ? 2 * o->cap_reqs : 16;
    stream_req *r = ir_alloc(o->ctx, sizeof(stream_req) * (size_t)cap);
    if (r) {
      if (o->reqs) memcpy(r, o->reqs, sizeof(stream_req) * (size_t)o->n_reqs);
      if (o->reqs) ir_free(o->ctx, o->reqs, sizeof(stream_req) * (size_t)o->cap_reqs);
      o->reqs = r, o->cap_reqs = cap;
    } else
      ok = false;
  }
  if (ok && o->q_len + chunks > o->q_cap) { /* grow the ring, unrolled from its head */
    int64_t cap = o->q_cap ? 2 * o->q_cap : 64;
    while (cap < o->q_len + chunks) cap *= 2;
    stream_task *q = ir_alloc(o->ctx, sizeof(stream_task) * (size_t)cap);
    if (q) {
      for (int64_t i = 0; i < o->q_len; i++) q[i] = o->queue[(o->q_head + i) % o->q_cap];
      if (o->queue) ir_free(o->ctx, o->queue, sizeof(stream_task) * (size_t)o->q_cap);
      o->queue = q, o->q_cap = cap, o->q_head = 0;
    } else
      ok = false;
  }
  int id = -1;
  if (ok) {
    id = o->n_reqs++;
    o->reqs[id] = (stream_req){chunks, 0, 0, write};
    for (int64_t c = 0; c < chunks; c++) {
      int64_t at = c * RT_OFFLOAD_CHUNK;
      int64_t left = o->bytes[value] - at, len = left < RT_OFFLOAD_CHUNK ? left : RT_OFFLOAD_CHUNK;
      o->queue[(o->q_head + o->q_len++) % o->q_cap] =
          (stream_task){id, write, (char *)buf + at, len, base + at};
    }
    if (write) o->written[value] = true;
    pthread_cond_broadcast(&o->work);
  }
  pthread_mutex_unlock(&o->mu);
  if (!ok) snprintf(err, errlen, "offload file '%s': out of memory", o->path);
  return id;
}

bool rt_offload_wait(rt_offload *o, int id, char *err, size_t errlen) {
  if (id < 0 || id >= o->n_reqs) {
    snprintf(err, errlen, "offload file '%s': transfer %d was not started", o->path, id);
    return false;
  }
  pthread_mutex_lock(&o->mu);
  while (o->reqs[id].pending > 0) pthread_cond_wait(&o->done, &o->mu);
  stream_req r = o->reqs[id];
  pthread_mutex_unlock(&o->mu);
  if (r.err) {
    o->failed = true;
    snprintf(err, errlen, "offload file '%s': %s at offset %" PRId64 " failed: %s", o->path,
             r.write ? "writing" : "reading", r.err_off, strerror(r.err));
    return false;
  }
  return true;
}

/* Value i from the active slot into the other one, through a bounce buffer. */
static bool copy_value(rt_offload *o, int i, char *bounce, char *err, size_t errlen) {
  int64_t from = DATA_START + (int64_t)o->active * o->slot_bytes + o->offsets[i];
  int64_t to = DATA_START + (int64_t)(o->active ^ 1u) * o->slot_bytes + o->offsets[i];
  for (int64_t at = 0; at < o->bytes[i]; at += RT_OFFLOAD_CHUNK) {
    int64_t len = o->bytes[i] - at < RT_OFFLOAD_CHUNK ? o->bytes[i] - at : RT_OFFLOAD_CHUNK;
    io_task t[2] = {{o->fd, false, bounce, len, from + at}, {o->fd, true, bounce, len, to + at}};
    for (int k = 0; k < 2; k++) {
      int e = 0;
      int64_t where = 0;
      if (!run_io(&t[k], 1, 1, &e, &where)) {
        snprintf(err, errlen, "offload file '%s': %s at offset %" PRId64 " failed: %s", o->path,
                 k ? "writing" : "reading", where, strerror(e));
        return false;
      }
    }
  }
  return true;
}

bool rt_offload_end(rt_offload *o, bool commit, char *err, size_t errlen) {
  drain(o);
  bool any = false, told = false;
  for (int i = 0; i < o->n_reqs; i++) {
    if (o->reqs[i].err && !o->failed) {
      o->failed = told = true;
      snprintf(err, errlen, "offload file '%s': %s at offset %" PRId64 " failed: %s", o->path,
               o->reqs[i].write ? "writing" : "reading", o->reqs[i].err_off,
               strerror(o->reqs[i].err));
    }
    any |= o->reqs[i].write;
  }
  o->n_reqs = 0;
  if (o->failed) {
    if (commit && !told) snprintf(err, errlen, "offload file '%s': a transfer failed", o->path);
    return !commit;
  }
  if (!commit || !any) return true;
  if (o->generation > 0) { /* the values this run did not write */
    char *bounce = NULL;
    for (int i = 0; i < o->n; i++) {
      if (o->written[i] || o->bytes[i] == 0) continue;
      if (!bounce && !(bounce = ir_alloc(o->ctx, (size_t)RT_OFFLOAD_CHUNK))) {
        snprintf(err, errlen, "offload file '%s': out of memory", o->path);
        return false;
      }
      if (!copy_value(o, i, bounce, err, errlen)) {
        ir_free(o->ctx, bounce, (size_t)RT_OFFLOAD_CHUNK);
        return false;
      }
    }
    if (bounce) ir_free(o->ctx, bounce, (size_t)RT_OFFLOAD_CHUNK);
  } else {
    for (int i = 0; i < o->n; i++)
      if (!o->written[i] && o->bytes[i] > 0) {
        snprintf(err, errlen, "offload file '%s': a first commit needs every value", o->path);
        return false;
      }
  }
  if (fdatasync(o->fd) != 0) {
    snprintf(err, errlen, "offload file '%s': sync failed: %s", o->path, strerror(errno));
    return false;
  }
  if (!write_header(o, o->active ^ 1u, o->generation + 1, err, errlen)) return false;
  o->active ^= 1u;
  o->generation++;
  return true;
}
