/* The CPU executor's host stream (runtime/runtime.h "host stream"): one
 * thread that runs posted items in post order while the executor's thread
 * goes on, as a CUDA stream does for the GPU.
 *
 * The executor posts each cg_instr.host_stream instruction when its turn
 * in the program comes (so everything before it on the executor's thread
 * is done) and waits for the first N posted items before an instruction
 * that touches what they touch (runtime/exec_cpu.c plan_host_waits). Items
 * run one at a time, in order: a run's host-stream instructions depend on
 * one another the way they would on one thread.
 *
 * A waiting poster helps: once the running item (if any) is done, it runs
 * the items up to the one it waits for itself, on its own threads (fn's
 * `poster` true), while the stream's thread stays out; so work that cannot
 * overlap (the update after a clipping norm that needs every gradient)
 * runs on all the executor's threads, as without the stream.
 *
 * Counters under mu: posted, done (items completed, a prefix of posted).
 * One item runs at a time (running), by the stream's thread or a helping
 * poster. A failed item stops the stream until the next begin: later items
 * are not run, and waits for them return its message. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "runtime/runtime.h"

struct rt_host_stream {
  dsc_context *ctx;
  rt_host_item_fn fn;
  void *arg;
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t work, progress;
  int *items; /* posted items of this run */
  int cap;
  int posted, done;
  bool failed, cancel, stop;
  bool running; /* an item is running (outside mu) */
  bool helping; /* the poster runs items: the stream's thread takes none */
  char err[1200];
  int64_t busy_ns, wait_ns; /* this run's: items running; the poster blocked in waits */
};

static int64_t clock_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Runs the next item with mu held on entry and exit (released meanwhile). */
static void run_next(rt_host_stream *s, bool poster) {
  int item = s->items[s->done];
  s->running = true;
  pthread_mutex_unlock(&s->mu);
  char err[sizeof s->err];
  err[0] = 0;
  int64_t t0 = clock_ns();
  bool ok = s->fn(s->arg, item, poster, err, sizeof err);
  int64_t t1 = clock_ns();
  pthread_mutex_lock(&s->mu);
  s->busy_ns += t1 - t0;
  if (poster) s->wait_ns += t1 - t0; /* the executor's time, not hidden */
  s->running = false;
  if (ok) {
    s->done++;
  } else {
    s->failed = true;
    snprintf(s->err, sizeof s->err, "%s", err[0] ? err : "a host stream instruction failed");
  }
  pthread_cond_broadcast(&s->progress);
}

static void *stream_main(void *arg) {
  rt_host_stream *s = arg;
  pthread_mutex_lock(&s->mu);
  for (;;) {
    while (!s->stop && (s->failed || s->cancel || s->helping || s->done >= s->posted))
      pthread_cond_wait(&s->work, &s->mu);
    if (s->stop) break;
    run_next(s, false);
  }
  pthread_mutex_unlock(&s->mu);
  return NULL;
}

rt_host_stream *rt_host_stream_new(dsc_context *ctx, int max_items, rt_host_item_fn fn, void *arg) {
  rt_host_stream *s = ir_alloc(ctx, sizeof *s);
  if (!s) {
    ir_error(ctx, ir_no_loc, "out of memory creating the host stream");
    return NULL;
  }
  memset(s, 0, sizeof *s);
  s->ctx = ctx, s->fn = fn, s->arg = arg;
  s->cap = max_items > 0 ? max_items : 1;
  s->items = ir_alloc(ctx, sizeof(int) * (size_t)s->cap);
  if (!s->items) {
    ir_free(ctx, s, sizeof *s);
    ir_error(ctx, ir_no_loc, "out of memory creating the host stream");
    return NULL;
  }
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->work, NULL);
  pthread_cond_init(&s->progress, NULL);
  int rc = pthread_create(&s->thread, NULL, stream_main, s);
  if (rc != 0) {
    ir_error(ctx, ir_no_loc, "cannot start the host stream's thread: %s", strerror(rc));
    pthread_cond_destroy(&s->progress);
    pthread_cond_destroy(&s->work);
    pthread_mutex_destroy(&s->mu);
    ir_free(ctx, s->items, sizeof(int) * (size_t)s->cap);
    ir_free(ctx, s, sizeof *s);
    return NULL;
  }
  return s;
}

void rt_host_stream_free(rt_host_stream *s) {
  if (!s) return;
  pthread_mutex_lock(&s->mu);
  s->stop = true;
  pthread_cond_broadcast(&s->work);
  pthread_mutex_unlock(&s->mu);
  pthread_join(s->thread, NULL);
  pthread_cond_destroy(&s->progress);
  pthread_cond_destroy(&s->work);
  pthread_mutex_destroy(&s->mu);
  ir_free(s->ctx, s->items, sizeof(int) * (size_t)s->cap);
  ir_free(s->ctx, s, sizeof *s);
}

void rt_host_stream_begin(rt_host_stream *s) {
  pthread_mutex_lock(&s->mu);
  s->posted = s->done = 0;
  s->failed = s->cancel = false;
  s->err[0] = 0;
  s->busy_ns = s->wait_ns = 0;
  pthread_mutex_unlock(&s->mu);
}

bool rt_host_stream_post(rt_host_stream *s, int item) {
  pthread_mutex_lock(&s->mu);
  bool ok = s->posted < s->cap;
  if (ok) {
    s->items[s->posted++] = item;
    pthread_cond_signal(&s->work);
  }
  pthread_mutex_unlock(&s->mu);
  return ok;
}

bool rt_host_stream_wait(rt_host_stream *s, int n, char *err, size_t errlen) {
  pthread_mutex_lock(&s->mu);
  if (n > s->posted) n = s->posted;
  if (s->done < n && !s->failed) {
    int64_t t0 = clock_ns();
    s->helping = true;
    while (s->running) pthread_cond_wait(&s->progress, &s->mu); /* the stream's item */
    s->wait_ns += clock_ns() - t0;
    while (s->done < n && !s->failed && !s->cancel) run_next(s, true);
    s->helping = false;
    pthread_cond_signal(&s->work); /* the stream's thread goes on past n */
  }
  bool ok = s->done >= n;
  if (!ok) snprintf(err, errlen, "%s", s->err);
  pthread_mutex_unlock(&s->mu);
  return ok;
}

void rt_host_stream_cancel(rt_host_stream *s) {
  pthread_mutex_lock(&s->mu);
  s->cancel = true; /* the running item completes; no other starts */
  while (s->running) pthread_cond_wait(&s->progress, &s->mu);
  pthread_mutex_unlock(&s->mu);
}

void rt_host_stream_times(rt_host_stream *s, int64_t *busy_ns, int64_t *wait_ns) {
  pthread_mutex_lock(&s->mu);
  *busy_ns = s->busy_ns, *wait_ns = s->wait_ns;
  pthread_mutex_unlock(&s->mu);
}
