/* gemm_shapes: dsc's GEMM plans (runtime/gemm_cpu.c) against oneDNN's
 * dnnl_sgemm on the GEMMs of a GPT-2 124M train step (B=4, T=64), side by
 * side in one run, with the f32 FMA peak measured in the same run
 * (bench/fma_peak.c's probe: 16 register-only FMA chains per thread). dsc's
 * plans run with f32 operands on the AVX-512 kernel ("avx512") and on the
 * AVX2 one (planned under DSC_CPU_ISA=avx2: "avx2"), and with bf16 operands
 * (f32 C) widened to f32 on both ("bf16", "avx2bf16") and on AVX512-BF16
 * hosts through vdpbf16ps ("dpbf16"), and with bf16 operands and a bf16 C
 * on the host's own kernel ("bf16c", what a bf16 step's forward runs); the
 * ratios compare AVX2 with oneDNN and bf16 with f32 on the same kernel. On
 * a host without AVX-512 (or AVX512-BF16) those columns print "-" and the
 * FMA probe runs its AVX2 chains.
 *
 *   gemm_shapes [--threads N] [--reps R] [--ms MS] [--only SUBSTRING] [--cpu-time] [--best]
 *               [--huge] [--dnnl-avx2] [--f32]
 *
 * --f32 runs the f32 implementations only (avx512, avx2, dnnl).
 *
 * --cpu-time (with --threads 1) times with the process's CPU clock, for
 * comparing variants on a loaded machine (preemption does not count).
 * --best reports each implementation's fastest repetition of one call
 * instead of the median of ~20 ms repetitions: on a loaded machine the
 * other processes' cache pollution makes medians vary by 30%+, the fastest
 * of many short repetitions much less (use with --reps 30 or more).
 * --huge puts the operands on 2 MiB-aligned memory advised MADV_HUGEPAGE
 * (transparent huge pages are "madvise" here). On this KVM guest 4 KiB
 * pages cost the GEMMs 20-60%: the packing walks B (W^T: 154 MB for the LM
 * head) and the C tiles touch a new page per row, and every TLB miss is a
 * two-level (guest + EPT) page walk.
 *
 * --dnnl-avx2 caps oneDNN at AVX2 (dnnl_set_max_cpu_isa, as DNNL_MAX_CPU_ISA=AVX2
 * would), so that its dnnl_sgemm is what an AVX2-only host (Zen 3) would run
 * against dsc's AVX2 kernel; the effective ISA is printed.
 *
 * The implementations' repetitions are interleaved (each once, then again,
 * ...) and medians reported, so that load from other processes affects all
 * alike. Layouts are the step's (A^T / B^T: the operand is a transposed
 * view, unit row stride). Prints one line per shape and a JSON summary. */
#define _GNU_SOURCE
#include <immintrin.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "bench/fma_probe.h"
#include "runtime/runtime.h"

#ifdef DSC_HAVE_LLVM
#include <dnnl.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#endif

static clockid_t clock_id = CLOCK_MONOTONIC;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(clock_id, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* n bytes, 2 MiB-aligned; with huge, advised MADV_HUGEPAGE before first
 * touch. */
static void *alloc_operand(size_t n, bool huge) {
  size_t align = (size_t)2 << 20;
  n = (n + align - 1) / align * align;
  void *p = aligned_alloc(align, n);
  if (p && huge) madvise(p, n, MADV_HUGEPAGE);
  return p;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* ---- the FMA peak (bench/fma_peak.c's probe: AVX-512 or AVX2 chains) ---- */

static bool have_avx512;

/* One probe run; flops per iteration: fma_flops_per_iter(). */
static float fma_chains(int64_t iters, float seed) {
  return have_avx512 ? fma_chains_avx512(iters, seed) : fma_chains_avx2(iters, seed);
}
static double fma_flops_per_iter(void) {
  return have_avx512 ? FMA_CHAINS * 32.0 : FMA_CHAINS_AVX2 * 16.0;
}

typedef struct {
  pthread_barrier_t *start, *stop;
  int64_t iters;
  int trials;
  float result;
} peak_worker;

static void *peak_main(void *p) {
  peak_worker *w = p;
  for (int t = 0; t < w->trials; t++) {
    pthread_barrier_wait(w->start);
    w->result += fma_chains(w->iters, (float)t);
    pthread_barrier_wait(w->stop);
  }
  return NULL;
}

/* Best of 5 trials of ~ms each, all threads timed together. */
static double fma_peak(int threads, double ms) {
  int64_t iters = 1 << 16;
  for (;;) {
    double t0 = now_s();
    volatile float sink = fma_chains(iters, 1);
    (void)sink;
    double dt = now_s() - t0;
    if (dt > ms * 1e-3 / 4 || iters > ((int64_t)1 << 40)) {
      iters = (int64_t)((double)iters * (ms * 1e-3) / (dt > 0 ? dt : 1e-9));
      break;
    }
    iters *= 4;
  }
  if (iters < 1) iters = 1;
  enum { TRIALS = 5 };
  pthread_barrier_t start, stop;
  pthread_barrier_init(&start, NULL, (unsigned)threads + 1);
  pthread_barrier_init(&stop, NULL, (unsigned)threads + 1);
  peak_worker ws[64];
  pthread_t tids[64];
  for (int i = 0; i < threads; i++) {
    ws[i] = (peak_worker){&start, &stop, iters, TRIALS, 0};
    pthread_create(&tids[i], NULL, peak_main, &ws[i]);
  }
  double best = 0;
  for (int t = 0; t < TRIALS; t++) {
    pthread_barrier_wait(&start);
    double t0 = now_s();
    pthread_barrier_wait(&stop);
    double gf = fma_flops_per_iter() * (double)iters * threads / (now_s() - t0) * 1e-9;
    if (gf > best) best = gf;
  }
  for (int i = 0; i < threads; i++) pthread_join(tids[i], NULL);
  pthread_barrier_destroy(&start);
  pthread_barrier_destroy(&stop);
  return best;
}

/* ---- the shapes ---- */

typedef struct {
  const char *what;
  int64_t m, n, k;
  bool ta, tb; /* A stored [k, m] / B stored [n, k] (transposed views) */
  int64_t batch;
  bool cold; /* B from memory, not the cache: calls cycle through copies of
              * B of >= COLD_BYTES in all, as a decode step's weights */
} shape;
#define COLD_BYTES ((size_t)256 << 20)

static const shape shapes[] = {
    {"lm_head fwd", 256, 50304, 768, false, true, 1, false},
    {"lm_head dx", 256, 768, 50304, false, false, 1, false},
    {"lm_head dW", 50304, 768, 256, true, false, 1, false},
    {"fc fwd", 256, 3072, 768, false, false, 1, false},
    {"proj fwd", 256, 768, 3072, false, false, 1, false},
    {"proj dW", 3072, 768, 256, true, false, 1, false},
    {"fc dW", 768, 3072, 256, true, false, 1, false},
    {"qkv fwd", 256, 2304, 768, false, false, 1, false},
    {"qkv dW", 768, 2304, 256, true, false, 1, false},
    {"attn proj fwd", 256, 768, 768, false, false, 1, false},
    {"attn proj dW", 768, 768, 256, true, false, 1, false},
    {"qkv dx", 256, 768, 2304, false, true, 1, false},
    {"fc dx", 256, 768, 3072, false, true, 1, false},
    {"attn q.k^T", 64, 64, 64, false, true, 48, false},
    {"attn p.v", 64, 64, 64, false, false, 48, false},
    /* a batch-1 decode step (issue 23): one row, each weight read once
     * from memory; GB/s of weights = 2 x the GFLOP/s */
    {"decode qkv", 1, 2304, 768, false, false, 1, true},
    {"decode attn proj", 1, 768, 768, false, false, 1, true},
    {"decode fc", 1, 3072, 768, false, false, 1, true},
    {"decode proj", 1, 768, 3072, false, false, 1, true},
    {"decode lm_head", 1, 50304, 768, false, true, 1, true},
};

/* One shape as a cg_gemm over contiguous row-major storage of each operand
 * (batched ones: one matrix per batch, B=4 x heads=12). */
static cg_gemm make_gemm(const shape *s) {
  cg_gemm g;
  memset(&g, 0, sizeof g);
  g.batch[0] = s->batch > 1 ? 4 : 1;
  g.batch[1] = s->batch > 1 ? s->batch / 4 : 1;
  g.m = s->m;
  g.n = s->n;
  g.k = s->k;
  g.a.row_stride = s->ta ? 1 : s->k;
  g.a.col_stride = s->ta ? s->m : 1;
  g.b.row_stride = s->tb ? 1 : s->n;
  g.b.col_stride = s->tb ? s->k : 1;
  g.c.row_stride = s->n;
  g.c.col_stride = 1;
  g.a.batch_stride[1] = s->m * s->k;
  g.a.batch_stride[0] = g.a.batch_stride[1] * g.batch[1];
  g.b.batch_stride[1] = s->k * s->n;
  g.b.batch_stride[0] = g.b.batch_stride[1] * g.batch[1];
  g.c.batch_stride[1] = s->m * s->n;
  g.c.batch_stride[0] = g.c.batch_stride[1] * g.batch[1];
  g.alpha = 1;
  g.beta = 0;
  return g;
}

/* A GFLOP/s cell, "-" for an implementation the host does not run (t 0). */
static void gflops_cell(char *out, size_t n, double flop, double t) {
  if (t > 0)
    snprintf(out, n, "%.1f", flop / t * 1e-9);
  else
    snprintf(out, n, "-");
}
static void ratio_cell(char *out, size_t n, double num, double den) {
  if (num > 0 && den > 0)
    snprintf(out, n, "%.2fx", num / den);
  else
    snprintf(out, n, "-");
}

static int usage(void) {
  fputs(
      "usage: gemm_shapes [--threads N] [--reps R] [--ms MS] [--only SUBSTRING] [--cpu-time] "
      "[--best] [--huge] [--dnnl-avx2] [--f32]\n",
      stderr);
  return 2;
}

int main(int argc, char **argv) {
  int threads = 2, reps = 9;
  double ms = 200;
  const char *only = NULL; /* run the shapes whose name contains it */
  bool best = false, huge = false, f32_only = false;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--cpu-time") == 0) {
      clock_id = CLOCK_PROCESS_CPUTIME_ID;
      continue;
    }
    if (strcmp(argv[i], "--best") == 0) {
      best = true;
      continue;
    }
    if (strcmp(argv[i], "--f32") == 0) {
      f32_only = true;
      continue;
    }
    if (strcmp(argv[i], "--huge") == 0) {
      huge = true;
      continue;
    }
    if (strcmp(argv[i], "--dnnl-avx2") == 0) {
#ifdef DSC_HAVE_LLVM
      if (dnnl_set_max_cpu_isa(dnnl_cpu_isa_avx2) != dnnl_success)
        return fputs("gemm_shapes: oneDNN refuses to cap its ISA\n", stderr), 1;
#endif
      continue;
    }
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!v) return usage();
    if (strcmp(argv[i], "--threads") == 0)
      threads = atoi(v);
    else if (strcmp(argv[i], "--reps") == 0)
      reps = atoi(v);
    else if (strcmp(argv[i], "--ms") == 0)
      ms = atof(v);
    else if (strcmp(argv[i], "--only") == 0)
      only = v;
    else
      return usage();
    i++;
  }
  if (clock_id != CLOCK_MONOTONIC && threads != 1)
    return fputs("gemm_shapes: --cpu-time needs --threads 1\n", stderr), 2;
  if (threads < 1 || threads > 64 || reps < 1 || reps > 1000 || !(ms > 0 && ms < 60000))
    return usage();
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma"))
    return fputs("gemm_shapes: needs AVX2 and FMA (the FMA probe and dsc's sgemm)\n", stderr), 1;
  have_avx512 = __builtin_cpu_supports("avx512f");
  bool have_dpbf16 = have_avx512 && __builtin_cpu_supports("avx512bf16");

  dsc_context *ctx = dsc_context_new(NULL, NULL);
  rt_pool *pool = ctx ? rt_pool_new(ctx, threads) : NULL;
  rt_gemm_engine *eng = pool ? rt_gemm_engine_new(ctx, pool) : NULL;
  if (!eng) return fputs("gemm_shapes: cannot create the pool or GEMM engine\n", stderr), 1;
#if defined(DSC_HAVE_LLVM) && defined(_OPENMP)
  omp_set_num_threads(threads);
#endif
  double peak = fma_peak(threads, ms);
  printf("f32 FMA peak, %d threads: %.1f GFLOP/s (operands on %s pages)\n", threads, peak,
         huge ? "huge" : "4 KiB");
#ifdef DSC_HAVE_LLVM
  printf("oneDNN's effective ISA: 0x%x (avx2 0x%x, avx512_core 0x%x)\n",
         (unsigned)dnnl_get_effective_cpu_isa(), (unsigned)dnnl_cpu_isa_avx2,
         (unsigned)dnnl_cpu_isa_avx512_core);
#endif
  printf("%-14s %-22s %-6s %8s %6s %8s %8s %8s %8s %8s %8s %6s %6s %6s %6s %6s\n", "gemm",
         "m x n x k (batch)", "layout", "avx512", "%peak", "avx2", "dnnl", "bf16", "avx2bf16",
         "dpbf16", "bf16c", "2/dnnl", "bf/512", "bf/2", "dp/512", "c/f32");
  /* avx512, avx2, dnnl, bf16 widened (avx512), bf16 widened (avx2), bf16
   * vdpbf16ps, bf16 operands and C on the host's kernel (isa NULL: the
   * planner's own choice) */
  enum { N_IMPL = 7, DNNL = 2, BF16C = 6 };
  static const char *const isa_of[N_IMPL] = {"avx512", "avx2",   NULL, "avx512",
                                             "avx2",   "avx512", NULL};
  /* which implementations this host runs (the others print "-") */
  bool runs[N_IMPL];
  for (int q = 0; q < N_IMPL; q++)
    runs[q] =
        !(f32_only && q >= 3) &&
        (q == 5 ? have_dpbf16 : !isa_of[q] || strcmp(isa_of[q], "avx512") != 0 || have_avx512);
  /* the f32 column the host's own kernel is compared with */
  int host_f32 = have_avx512 ? 0 : 1;
  double tot_flop = 0, tot[N_IMPL] = {0};
  int n_shapes = (int)(sizeof shapes / sizeof shapes[0]);
  for (int si = 0; si < n_shapes; si++) {
    const shape *s = &shapes[si];
    if (only && !strstr(s->what, only)) continue;
    cg_gemm g = make_gemm(s);
    int64_t nb = g.batch[0] * g.batch[1];
    size_t na = (size_t)(nb * s->m * s->k), nbb = (size_t)(nb * s->k * s->n);
    size_t nc = (size_t)(nb * s->m * s->n);
    size_t copies = s->cold ? (COLD_BYTES + nbb * 4 - 1) / (nbb * 4) : 1;
    float *a = alloc_operand(na * 4, huge), *b = alloc_operand(copies * nbb * 4, huge);
    float *c = alloc_operand(nc * 4, huge); /* also the bf16 C (half of it) */
    uint16_t *ah = alloc_operand(na * 2, huge), *bh = alloc_operand(copies * nbb * 2, huge);
    if (!a || !b || !c || !ah || !bh) return fputs("gemm_shapes: out of memory\n", stderr), 1;
    for (size_t i = 0; i < na; i++) a[i] = (float)((i * 7919) % 1000) * 1e-3f - 0.5f;
    for (size_t i = 0; i < copies * nbb; i++)
      b[i] = (float)((i % nbb * 104729) % 1000) * 1e-3f - 0.5f;
    for (size_t i = 0; i < na; i++) ah[i] = ir_bf16_bits(a[i]);
    for (size_t i = 0; i < copies * nbb; i++) bh[i] = ir_bf16_bits(b[i]);
    rt_gemm_plan *pl[N_IMPL] = {NULL};
    for (int q = 0; q < N_IMPL; q++) {
      if (q == DNNL || !runs[q]) continue;
      if (isa_of[q]) setenv("DSC_CPU_ISA", isa_of[q], 1); /* the kernel is fixed at planning */
      pl[q] = rt_gemm_plan_new(eng, &g, q >= 3 ? DSC_BF16 : DSC_F32,
                               q == BF16C ? DSC_BF16 : DSC_F32, q == 5 ? RT_GEMM_DPBF16 : 0);
      unsetenv("DSC_CPU_ISA");
      if (!pl[q]) return fputs("gemm_shapes: planning failed\n", stderr), 1;
    }
    double flop = 2.0 * (double)nb * (double)s->m * (double)s->n * (double)s->k;
    /* each timed repetition lasts >= ~20 ms: inner loops of the call */
    int inner = best ? 1 : (int)(4e9 / flop) + 1;
    if (s->cold && inner < (int)copies) inner = (int)copies;
    double *t[N_IMPL];
    for (int q = 0; q < N_IMPL; q++) t[q] = malloc(sizeof(double) * (size_t)reps);
    char err[256];
    for (int r = -1; r < reps; r++) { /* r = -1: warm-up */
      for (int q = 0; q < N_IMPL; q++) {
        double t0 = now_s();
        if (!runs[q]) continue;
        if (pl[q]) {
          const void *pa = q >= 3 ? (const void *)ah : a;
          for (int it = 0; it < inner; it++) {
            size_t at = (size_t)it % copies * nbb;
            const void *pb = q >= 3 ? (const void *)(bh + at) : b + at;
            rt_gemm_run(pl[q], pa, pb, c, err, sizeof err);
          }
        } else {
#ifdef DSC_HAVE_LLVM
          for (int it = 0; it < inner; it++)
            for (int64_t bb = 0; bb < nb; bb++)
              dnnl_sgemm('N' + (s->ta ? 6 : 0), 'N' + (s->tb ? 6 : 0), s->m, s->n, s->k, 1.0f,
                         a + bb * s->m * s->k, s->ta ? s->m : s->k,
                         b + (size_t)it % copies * nbb + bb * s->k * s->n, s->tb ? s->k : s->n,
                         0.0f, c + bb * s->m * s->n, s->n);
#endif
        }
        if (r >= 0) t[q][r] = (now_s() - t0) / inner;
      }
    }
    double d[N_IMPL];
    for (int q = 0; q < N_IMPL; q++) {
      if (!runs[q]) {
        d[q] = 0;
        continue;
      }
      qsort(t[q], (size_t)reps, sizeof(double), cmp_double);
      d[q] = t[q][best ? 0 : reps / 2];
    }
#ifndef DSC_HAVE_LLVM
    d[DNNL] = d[host_f32]; /* no oneDNN in this build: its column repeats dsc's */
#endif
    char dims[64];
    snprintf(dims, sizeof dims, "%" PRId64 "x%" PRId64 "x%" PRId64 " (%" PRId64 ")", s->m, s->n,
             s->k, nb);
    char col[N_IMPL][16], ratio[5][16];
    for (int q = 0; q < N_IMPL; q++) gflops_cell(col[q], sizeof col[q], flop, d[q]);
    ratio_cell(ratio[0], sizeof ratio[0], d[DNNL], d[1]);
    ratio_cell(ratio[1], sizeof ratio[1], d[0], d[3]);
    ratio_cell(ratio[2], sizeof ratio[2], d[1], d[4]);
    ratio_cell(ratio[3], sizeof ratio[3], d[0], d[5]);
    ratio_cell(ratio[4], sizeof ratio[4], d[host_f32], d[BF16C]);
    char pct[16]; /* the host's f32 kernel against the probe's peak */
    snprintf(pct, sizeof pct, "%.1f", 100 * flop / d[host_f32] * 1e-9 / peak);
    printf("%-14s %-22s %-6s %8s %5s%% %8s %8s %8s %8s %8s %8s %6s %6s %6s %6s %6s  [%s]\n",
           s->what, dims,
           s->ta   ? "AtB"
           : s->tb ? "ABt"
                   : "AB",
           col[0], pct, col[1], col[2], col[3], col[4], col[5], col[6], ratio[0], ratio[1],
           ratio[2], ratio[3], ratio[4], pl[5] ? rt_gemm_plan_impl(pl[5]) : "-");
    tot_flop += flop;
    for (int q = 0; q < N_IMPL; q++) tot[q] += d[q];
    for (int q = 0; q < N_IMPL; q++) {
      if (pl[q]) rt_gemm_plan_free(pl[q]);
      free(t[q]);
    }
    free(a), free(b), free(c), free(ah), free(bh);
  }
  /* the JSON summary: GFLOP/s over all shapes, 0 where the host cannot run it */
  double gf[N_IMPL];
  for (int q = 0; q < N_IMPL; q++) gf[q] = tot[q] > 0 ? tot_flop / tot[q] * 1e-9 : 0;
  printf(
      "{\"impl\":\"gemm_shapes\",\"threads\":%d,\"avx512\":%s,\"peak_gflops\":%.1f,"
      "\"dsc_gflops\":%.1f,\"dsc_avx2_gflops\":%.1f,\"dnnl_gflops\":%.1f,"
      "\"dsc_bf16_gflops\":%.1f,\"dsc_avx2_bf16_gflops\":%.1f,\"dsc_dpbf16_gflops\":%.1f,"
      "\"dsc_bf16c_gflops\":%.1f,\"dsc_pct_peak\":%.1f,\"dnnl_pct_peak\":%.1f}\n",
      threads, have_avx512 ? "true" : "false", peak, gf[0], gf[1], gf[DNNL], gf[3], gf[4], gf[5],
      gf[BF16C], 100 * gf[host_f32] / peak, 100 * gf[DNNL] / peak);
  rt_gemm_engine_free(eng);
  rt_pool_free(pool);
  dsc_context_free(ctx);
  return 0;
}
