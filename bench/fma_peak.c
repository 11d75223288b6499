/* fma_peak: measures this CPU's f32 FMA throughput (GFLOP/s) with N threads.
 *
 * Each thread runs independent chains of packed FMAs (acc = acc * a + b) on
 * registers only: 16 accumulators hide the FMA latency (4 cycles on two
 * ports needs at least 8 chains in flight). One FMA on a 16-lane AVX-512
 * register counts 32 flops (8 lanes and 16 flops with AVX2). Without
 * -ffast-math the compiler may not reassociate or fold the chains, and they
 * stay in registers (an asm barrier on them would force spills). The best of
 * several trials is reported, all threads timed together between barriers.
 *
 *   fma_peak [--threads N] [--trials K] [--ms MS] [--isa avx512|avx2]
 *
 * Prints one JSON line: {"impl":"fma_peak","isa":..,"threads":..,"gflops":..}. */
#define _GNU_SOURCE
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/fma_probe.h"

#define CHAINS FMA_CHAINS

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* AVX-512: bench/fma_probe.h (gemm_shapes.c measures the same way). */
static float fma_avx512(int64_t iters, float seed) { return fma_chains_avx512(iters, seed); }

__attribute__((target("avx2,fma"))) static float fma_avx2(int64_t iters, float seed) {
  __m256 acc[CHAINS];
  for (int c = 0; c < CHAINS; c++) acc[c] = _mm256_set1_ps(seed + (float)c);
  const __m256 a = _mm256_set1_ps(0.999f), b = _mm256_set1_ps(0.001f);
  for (int64_t i = 0; i < iters; i++) {
#pragma GCC unroll 16
    for (int c = 0; c < CHAINS; c++) acc[c] = _mm256_fmadd_ps(acc[c], a, b);
  }
  __m256 s = acc[0];
  for (int c = 1; c < CHAINS; c++) s = _mm256_add_ps(s, acc[c]);
  float lanes[8];
  _mm256_storeu_ps(lanes, s);
  float t = 0;
  for (int i = 0; i < 8; i++) t += lanes[i];
  return t;
}

typedef struct {
  pthread_barrier_t *start, *stop;
  int64_t iters;
  int avx512;
  int trials;
  float result;
} worker;

static void *run_worker(void *p) {
  worker *w = p;
  for (int t = 0; t < w->trials; t++) {
    pthread_barrier_wait(w->start);
    w->result += w->avx512 ? fma_avx512(w->iters, (float)t) : fma_avx2(w->iters, (float)t);
    pthread_barrier_wait(w->stop);
  }
  return NULL;
}

static int usage(void) {
  fputs("usage: fma_peak [--threads N] [--trials K] [--ms MS] [--isa avx512|avx2]\n", stderr);
  return 2;
}

int main(int argc, char **argv) {
  int threads = 2, trials = 5;
  double ms = 200;
  __builtin_cpu_init();
  int avx512 = __builtin_cpu_supports("avx512f");
  for (int i = 1; i < argc; i++) {
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!v) return usage();
    if (strcmp(argv[i], "--threads") == 0)
      threads = atoi(v);
    else if (strcmp(argv[i], "--trials") == 0)
      trials = atoi(v);
    else if (strcmp(argv[i], "--ms") == 0)
      ms = atof(v);
    else if (strcmp(argv[i], "--isa") == 0) {
      if (strcmp(v, "avx2") == 0)
        avx512 = 0;
      else if (strcmp(v, "avx512") == 0 && __builtin_cpu_supports("avx512f"))
        avx512 = 1;
      else
        return fprintf(stderr, "fma_peak: ISA '%s' is not available here\n", v), 2;
    } else
      return usage();
    i++;
  }
  if (threads < 1 || threads > 1024 || trials < 1 || trials > 1000 || !(ms > 0 && ms < 60000))
    return usage();
  if (!avx512 && !(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")))
    return fputs("fma_peak: this CPU has neither AVX-512 nor AVX2+FMA\n", stderr), 1;
  double flops_per_iter = CHAINS * (avx512 ? 32.0 : 16.0);

  /* Calibrate on one thread so that a trial lasts about `ms`. */
  int64_t iters = 1 << 16;
  for (;;) {
    double t0 = now_s();
    volatile float sink = avx512 ? fma_avx512(iters, 1) : fma_avx2(iters, 1);
    (void)sink;
    double dt = now_s() - t0;
    if (dt > ms * 1e-3 / 4 || iters > ((int64_t)1 << 40)) {
      iters = (int64_t)((double)iters * (ms * 1e-3) / (dt > 0 ? dt : 1e-9));
      break;
    }
    iters *= 4;
  }
  if (iters < 1) iters = 1;

  pthread_barrier_t start, stop;
  pthread_barrier_init(&start, NULL, (unsigned)threads + 1);
  pthread_barrier_init(&stop, NULL, (unsigned)threads + 1);
  worker *ws = calloc((size_t)threads, sizeof *ws);
  pthread_t *tids = calloc((size_t)threads, sizeof *tids);
  if (!ws || !tids) return fputs("fma_peak: out of memory\n", stderr), 1;
  for (int i = 0; i < threads; i++) {
    ws[i] = (worker){&start, &stop, iters, avx512, trials, 0};
    if (pthread_create(&tids[i], NULL, run_worker, &ws[i]) != 0)
      return fputs("fma_peak: cannot start a thread\n", stderr), 1;
  }
  double best = 0, sum = 0;
  for (int t = 0; t < trials; t++) {
    pthread_barrier_wait(&start);
    double t0 = now_s();
    pthread_barrier_wait(&stop);
    double dt = now_s() - t0;
    double gf = flops_per_iter * (double)iters * threads / dt * 1e-9;
    sum += gf;
    if (gf > best) best = gf;
  }
  float check = 0;
  for (int i = 0; i < threads; i++) {
    pthread_join(tids[i], NULL);
    check += ws[i].result;
  }
  pthread_barrier_destroy(&start);
  pthread_barrier_destroy(&stop);
  free(ws);
  free(tids);
  /* check is printed so the work cannot be optimised away. */
  printf(
      "{\"impl\":\"fma_peak\",\"isa\":\"%s\",\"threads\":%d,\"trials\":%d,\"gflops\":%.1f,"
      "\"gflops_mean\":%.1f,\"check\":%.3g}\n",
      avx512 ? "avx512" : "avx2", threads, trials, best, sum / trials, (double)check);
  return 0;
}
