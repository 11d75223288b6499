/* The FMA probe's kernel, shared by bench/fma_peak.c and bench/gemm_shapes.c:
 * FMA_CHAINS independent chains of fused multiply-adds on 16-float AVX-512
 * vectors, so that the loop is bound by FMA throughput, not latency. The
 * factors keep every chain bounded (|acc| stays near b / (1 - a)), so no
 * denormal or overflow slows the loop down. Each iteration is FMA_CHAINS x
 * 32 flops per thread. */
#ifndef DSC_BENCH_FMA_PROBE_H
#define DSC_BENCH_FMA_PROBE_H

#include <immintrin.h>
#include <stdint.h>

#define FMA_CHAINS 16

__attribute__((target("avx512f"))) static inline float fma_chains_avx512(int64_t iters,
                                                                        float seed) {
  __m512 acc[FMA_CHAINS];
  for (int c = 0; c < FMA_CHAINS; c++) acc[c] = _mm512_set1_ps(seed + (float)c);
  const __m512 a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(0.001f);
  for (int64_t i = 0; i < iters; i++) {
#pragma GCC unroll 16
    for (int c = 0; c < FMA_CHAINS; c++) acc[c] = _mm512_fmadd_ps(acc[c], a, b);
  }
  __m512 s = acc[0];
  for (int c = 1; c < FMA_CHAINS; c++) s = _mm512_add_ps(s, acc[c]);
  return _mm512_reduce_add_ps(s);
}

#endif
