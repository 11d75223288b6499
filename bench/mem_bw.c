/* mem_bw: the memory bandwidth an optimizer step can reach on this machine,
 * the bound for dsc's host AdamW (bench/offload.sh compares the two).
 *
 * Each thread streams over its own slice of arrays much larger than the
 * caches, timed from the first thread's start to the last one's end (each
 * thread reads the clock itself), best of K trials:
 *   read   s += a[i]                                     4 bytes per element
 *          (what a decode step does to its weights: bench/serve.sh's limit)
 *   copy   b[i] = a[i]                                   8 bytes per element
 *   triad  a[i] = b[i] + s * c[i]                        12 bytes per element
 *   adamw  p, m, v updated from g as AdamW does (decoupled decay, bias
 *          corrections folded into the step size): reads p g m v, writes
 *          p m v                                         28 bytes per element
 * GB/s counts the bytes the loop names (10^9 bytes), not the write-allocate
 * reads a store miss adds, the same rule dsc's --profile uses. The loops are
 * plain C, -O3; the AdamW one also in clones for the widest ISA (below).
 *
 *   mem_bw [--threads N] [--mib M] [--trials K] [--small-pages]
 *
 * Defaults: the online CPUs, 1024 MiB over all the arrays of a kernel,
 * 5 trials, the arrays advised MADV_HUGEPAGE as dsc's arenas are (with
 * 4 KiB pages seven streams miss the TLB; --small-pages measures that). Prints one JSON line per
 * kernel:
 * {"impl":"mem_bw","kernel":"adamw","threads":2,"mib":1024,"gbps":..,"ms":..} */
#define _GNU_SOURCE
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

enum { K_READ, K_COPY, K_TRIAD, K_ADAMW, N_KERNELS };
static const char *kernel_name[N_KERNELS] = {"read", "copy", "triad", "adamw"};
static const int kernel_arrays[N_KERNELS] = {1, 2, 3, 4}; /* adamw: p g m v */
static const int kernel_bytes[N_KERNELS] = {4, 8, 12, 28};

typedef struct {
  float *arr[4];
  size_t n;  /* this thread's slice */
  float sum; /* the read kernel's, kept so that its loads are not dropped */
} slice;

typedef struct {
  pthread_barrier_t *start, *stop;
  slice s;
  int kernel, trials;
  double t0, t1; /* this trial's start and end on this thread */
} worker;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The AdamW stream computes a sqrt and a division per element: built for
 * the baseline ISA alone it is bound by them (8 GB/s on one Zen 3 core,
 * where a copy streams 16), not by memory. GCC builds clones for AVX-512,
 * AVX2 + FMA and the baseline and picks the widest the CPU has at load
 * time; -fno-math-errno (CMakeLists.txt) lets sqrtf vectorise. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define WIDEST_ISA __attribute__((target_clones("avx512f", "avx2,fma", "default")))
#else
#define WIDEST_ISA
#endif

WIDEST_ISA static void adamw(float *restrict p, const float *restrict gr, float *restrict m_,
                             float *restrict v_, size_t n) {
  const float lr = 1e-3f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f, wd = 0.01f;
  const float step = lr / (1 - b1), rc2 = 1 / sqrtf(1 - b2);
  for (size_t i = 0; i < n; i++) {
    float g = gr[i];
    float m = b1 * m_[i] + (1 - b1) * g, v = b2 * v_[i] + (1 - b2) * g * g;
    m_[i] = m, v_[i] = v;
    p[i] = p[i] * (1 - lr * wd) - step * m / (sqrtf(v) * rc2 + eps);
  }
}

/* 16 independent sums (n is a multiple of 16): the adds' latency hidden,
 * so that memory is the bound */
WIDEST_ISA static float read_sum(const float *restrict a, size_t n) {
  float acc[16] = {0};
  for (size_t i = 0; i < n; i += 16)
    for (int k = 0; k < 16; k++) acc[k] += a[i + k];
  float s = 0;
  for (int k = 0; k < 16; k++) s += acc[k];
  return s;
}

static void run_kernel(int kernel, slice *s) {
  float *restrict a = s->arr[0], *restrict b = s->arr[1], *restrict c = s->arr[2],
                  *restrict d = s->arr[3];
  size_t n = s->n;
  switch (kernel) {
    case K_READ:
      s->sum += read_sum(a, n);
      break;
    case K_COPY:
      for (size_t i = 0; i < n; i++) b[i] = a[i];
      break;
    case K_TRIAD:
      for (size_t i = 0; i < n; i++) a[i] = b[i] + 0.5f * c[i];
      break;
    case K_ADAMW:
      adamw(a, b, c, d, n);
      break; /* p g m v */
  }
}

static void *work(void *arg) {
  worker *w = arg;
  /* first touch by the thread that streams the slice (NUMA-local pages) */
  for (int k = 0; k < 4; k++)
    if (w->s.arr[k])
      for (size_t i = 0; i < w->s.n; i++) w->s.arr[k][i] = (float)(i % 7) * 0.25f + 1.0f;
  for (int t = 0; t < w->trials; t++) {
    /* timed here, not by main: main may be woken after the workers finish */
    pthread_barrier_wait(w->start);
    w->t0 = now_s();
    run_kernel(w->kernel, &w->s);
    w->t1 = now_s();
    pthread_barrier_wait(w->stop);
  }
  return NULL;
}

static int usage(void) {
  fprintf(stderr, "usage: mem_bw [--threads N] [--mib M] [--trials K] [--small-pages]\n");
  return 2;
}

int main(int argc, char **argv) {
  long threads = sysconf(_SC_NPROCESSORS_ONLN), mib = 1024, trials = 5;
  int huge = 1;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--small-pages")) {
      huge = 0;
      continue;
    }
    long *dst = !strcmp(argv[i], "--threads")  ? &threads
                : !strcmp(argv[i], "--mib")    ? &mib
                : !strcmp(argv[i], "--trials") ? &trials
                                               : NULL;
    char *end = NULL;
    if (!dst || i + 1 >= argc) return usage();
    *dst = strtol(argv[++i], &end, 10);
    if (!end || *end || *dst <= 0) return usage();
  }
  if (threads > 1024 || mib > (1L << 20)) return usage();
  for (int kernel = 0; kernel < N_KERNELS; kernel++) {
    size_t n = (size_t)mib * 1048576 / (sizeof(float) * (size_t)kernel_arrays[kernel]);
    n -= n % (size_t)(16 * threads);
    float *arr[4] = {NULL, NULL, NULL, NULL};
    for (int k = 0; k < kernel_arrays[kernel]; k++)
      if (posix_memalign((void **)&arr[k], 2 << 20, n * sizeof(float))) {
        fprintf(stderr, "mem_bw: out of memory (%ld MiB)\n", mib);
        return 1;
      }
#ifdef MADV_HUGEPAGE
      else if (huge) /* as dsc's arenas are (runtime/exec_cpu.c) */
        (void)madvise(arr[k], n * sizeof(float) / (2 << 20) * (2 << 20), MADV_HUGEPAGE);
#endif
    pthread_barrier_t start, stop;
    pthread_barrier_init(&start, NULL, (unsigned)threads + 1);
    pthread_barrier_init(&stop, NULL, (unsigned)threads + 1);
    worker *w = calloc((size_t)threads, sizeof *w);
    pthread_t *tid = calloc((size_t)threads, sizeof *tid);
    if (!w || !tid) return 1;
    size_t per = n / (size_t)threads;
    for (long t = 0; t < threads; t++) {
      w[t] = (worker){&start, &stop, {{NULL, NULL, NULL, NULL}, per, 0}, kernel, (int)trials, 0, 0};
      for (int k = 0; k < 4; k++) w[t].s.arr[k] = arr[k] ? arr[k] + (size_t)t * per : NULL;
      pthread_create(&tid[t], NULL, work, &w[t]);
    }
    double best = 1e30;
    for (long t = 0; t < trials; t++) {
      pthread_barrier_wait(&start);
      pthread_barrier_wait(&stop);
      double t0 = w[0].t0, t1 = w[0].t1; /* the first start to the last end */
      for (long k = 1; k < threads; k++)
        t0 = w[k].t0 < t0 ? w[k].t0 : t0, t1 = w[k].t1 > t1 ? w[k].t1 : t1;
      if (t1 - t0 < best) best = t1 - t0;
    }
    for (long t = 0; t < threads; t++) pthread_join(tid[t], NULL);
    double sum = 0; /* keeps the stores live; also a check that they ran */
    for (size_t i = 0; i < n; i += 4096) sum += arr[0][i];
    for (long t = 0; t < threads; t++) sum += w[t].s.sum;
    printf(
        "{\"impl\":\"mem_bw\",\"kernel\":\"%s\",\"threads\":%ld,\"mib\":%ld,\"elements\":%zu,"
        "\"huge_pages\":%s,\"ms\":%.3f,\"gbps\":%.2f,\"check\":%s}\n",
        kernel_name[kernel], threads, mib, n, huge ? "true" : "false", best * 1e3,
        (double)n * kernel_bytes[kernel] / best / 1e9, isfinite(sum) ? "true" : "false");
    fflush(stdout);
    pthread_barrier_destroy(&start);
    pthread_barrier_destroy(&stop);
    free(w), free(tid);
    for (int k = 0; k < 4; k++) free(arr[k]);
  }
  return 0;
}
