/* A fixed thread team for the CPU executor's parallel loops.
 *
 * Two implementations behind one interface. Where the library is built
 * with OpenMP (with oneDNN, whose Debian build threads with OpenMP), jobs
 * run as OpenMP parallel regions: kernels and oneDNN GEMMs then share one
 * team of n_threads threads. Two teams would oversubscribe the cores, since
 * libgomp's idle threads spin for a long while after each region, exactly
 * when the other team's threads want the cores. Elsewhere (and in tests,
 * through rt_pool_new_pthreads) a pthread team as below.
 *
 * One job at a time: the caller publishes (n, chunks, fn, arg) and bumps the
 * generation counter; worker w runs chunk w (the caller runs chunk 0) and
 * decrements `pending`; the caller waits for pending to reach zero. Waiting
 * spins for a short while (a training step launches jobs back to back, and a
 * futex wake costs several microseconds) and then sleeps on a condition
 * variable, so idle workers do not take cores from oneDNN's own threads. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "runtime/runtime.h"

#ifdef _OPENMP
#include <omp.h>
#endif

/* Spin iterations before sleeping (each a pause instruction, ~10-40 ns). */
#define RT_POOL_SPIN 4000

typedef struct {
  rt_pool *pool;
  int index; /* 1 .. n_threads-1 */
  pthread_t thread;
} rt_worker;

struct rt_pool {
  dsc_context *ctx;
  int n_threads;
  bool omp;      /* jobs are OpenMP parallel regions (no workers of our own) */
  int n_started; /* workers actually created */
  rt_worker *workers;
  pthread_mutex_t mu;
  pthread_cond_t wake; /* workers: a new generation or stop */
  pthread_cond_t done; /* caller: pending reached 0 */
  atomic_uint_fast64_t gen;
  atomic_int pending;
  atomic_bool stop; /* set under mu, before the generation bump */
  /* the current job (written before gen is released) */
  int64_t n;
  int n_chunks;
  rt_range_fn fn;
  void *arg;
};

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

static void run_chunk(rt_pool *p, int c) {
  int64_t begin = p->n * c / p->n_chunks, end = p->n * (c + 1) / p->n_chunks;
  if (begin < end) p->fn(p->arg, begin, end, c);
}

static void *worker_main(void *arg) {
  rt_worker *w = arg;
  rt_pool *p = w->pool;
  uint_fast64_t seen = 0;
  for (;;) {
    uint_fast64_t g = atomic_load_explicit(&p->gen, memory_order_acquire);
    for (int s = 0; g == seen && s < RT_POOL_SPIN; s++) {
      cpu_relax();
      g = atomic_load_explicit(&p->gen, memory_order_acquire);
    }
    if (g == seen) {
      pthread_mutex_lock(&p->mu);
      while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen)
        pthread_cond_wait(&p->wake, &p->mu);
      pthread_mutex_unlock(&p->mu);
    }
    /* Stopping bumps the generation too: never mistake it for a job (the
     * previous job's arg may be gone by now). */
    if (atomic_load_explicit(&p->stop, memory_order_acquire)) return NULL;
    seen = g;
    /* Every worker acknowledges every job (even without a chunk of it), so
     * the caller never rewrites the job while a worker still reads it. */
    if (w->index < p->n_chunks) run_chunk(p, w->index);
    if (atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel) == 1) {
      pthread_mutex_lock(&p->mu);
      pthread_cond_signal(&p->done);
      pthread_mutex_unlock(&p->mu);
    }
  }
}

static void stop_workers(rt_pool *p) {
  pthread_mutex_lock(&p->mu);
  atomic_store_explicit(&p->stop, true, memory_order_release);
  atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
  pthread_cond_broadcast(&p->wake);
  pthread_mutex_unlock(&p->mu);
  for (int i = 0; i < p->n_started; i++) pthread_join(p->workers[i].thread, NULL);
  p->n_started = 0;
}

static rt_pool *pool_new(dsc_context *ctx, int n_threads, bool omp) {
  if (n_threads < 1 || n_threads > 1024) {
    ir_error(ctx, ir_no_loc, "thread pool: %d threads (expected 1 to 1024)", n_threads);
    return NULL;
  }
  rt_pool *p = ir_alloc(ctx, sizeof *p);
  if (!p) {
    ir_error(ctx, ir_no_loc, "out of memory creating a thread pool");
    return NULL;
  }
  memset(p, 0, sizeof *p);
  p->ctx = ctx;
  p->n_threads = n_threads;
  atomic_init(&p->gen, 0);
  atomic_init(&p->pending, 0);
  atomic_init(&p->stop, false);
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->wake, NULL);
  pthread_cond_init(&p->done, NULL);
  p->omp = omp;
  if (n_threads == 1 || omp) return p;
  p->workers = ir_alloc(ctx, sizeof *p->workers * (size_t)(n_threads - 1));
  if (!p->workers) {
    ir_error(ctx, ir_no_loc, "out of memory creating a thread pool");
    rt_pool_free(p);
    return NULL;
  }
  for (int i = 0; i < n_threads - 1; i++) {
    rt_worker *w = &p->workers[i];
    w->pool = p;
    w->index = i + 1;
    int rc = pthread_create(&w->thread, NULL, worker_main, w);
    if (rc != 0) {
      ir_error(ctx, ir_no_loc, "thread pool: cannot start thread %d of %d: %s", i + 2, n_threads,
               strerror(rc));
      rt_pool_free(p);
      return NULL;
    }
    p->n_started++;
  }
  return p;
}

rt_pool *rt_pool_new(dsc_context *ctx, int n_threads) {
#ifdef _OPENMP
  return pool_new(ctx, n_threads, true);
#else
  return pool_new(ctx, n_threads, false);
#endif
}

rt_pool *rt_pool_new_pthreads(dsc_context *ctx, int n_threads) {
  return pool_new(ctx, n_threads, false);
}

bool rt_pool_is_openmp(const rt_pool *p) { return p->omp; }

void rt_pool_free(rt_pool *p) {
  if (!p) return;
  stop_workers(p);
  if (p->workers) ir_free(p->ctx, p->workers, sizeof *p->workers * (size_t)(p->n_threads - 1));
  pthread_mutex_destroy(&p->mu);
  pthread_cond_destroy(&p->wake);
  pthread_cond_destroy(&p->done);
  ir_free(p->ctx, p, sizeof *p);
}

int rt_pool_threads(const rt_pool *p) { return p->n_threads; }

int rt_pool_chunks(const rt_pool *p, int64_t n, int64_t min_chunk) {
  if (n <= 0) return 0;
  if (min_chunk < 1) min_chunk = 1;
  int64_t c = n / min_chunk;
  if (c < 1) c = 1;
  return c < p->n_threads ? (int)c : p->n_threads;
}

void rt_pool_parallel_for(rt_pool *p, int64_t n, int64_t min_chunk, rt_range_fn fn, void *arg) {
  int chunks = rt_pool_chunks(p, n, min_chunk);
  if (chunks == 0) return;
  if (chunks == 1) {
    fn(arg, 0, n, 0);
    return;
  }
  p->n = n;
  p->n_chunks = chunks;
  p->fn = fn;
  p->arg = arg;
#ifdef _OPENMP
  if (p->omp) {
    /* The runtime may give fewer threads than asked (nesting, limits):
     * each thread then runs every team-size-th chunk, same bounds. */
#pragma omp parallel num_threads(chunks)
    {
      int t = omp_get_thread_num(), nt = omp_get_num_threads();
      for (int c = t; c < chunks; c += nt) run_chunk(p, c);
    }
    return;
  }
#endif
  atomic_store_explicit(&p->pending, p->n_threads - 1, memory_order_relaxed);
  /* Under the mutex so a worker between its generation check and its
   * cond_wait cannot miss the broadcast. */
  pthread_mutex_lock(&p->mu);
  atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
  pthread_cond_broadcast(&p->wake);
  pthread_mutex_unlock(&p->mu);
  run_chunk(p, 0);
  for (int s = 0; s < RT_POOL_SPIN; s++) {
    if (atomic_load_explicit(&p->pending, memory_order_acquire) == 0) return;
    cpu_relax();
  }
  pthread_mutex_lock(&p->mu);
  while (atomic_load_explicit(&p->pending, memory_order_acquire) != 0)
    pthread_cond_wait(&p->done, &p->mu);
  pthread_mutex_unlock(&p->mu);
}
