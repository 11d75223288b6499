/* The FMA probe's kernels, shared by bench/fma_peak.c and bench/gemm_shapes.c:
 * independent chains of fused multiply-adds (acc = acc * a + b) on registers
 * only, so that the loop is bound by FMA throughput, not latency. The factors
 * keep every chain bounded (|acc| stays near b / (1 - a)), so no denormal or
 * overflow slows the loop down.
 *
 * How many chains: a core with P FMA pipes of latency L cycles needs at least
 * P x L FMAs in flight. Intel Skylake-SP .. Emerald Rapids: 2 x 4 = 8 (AVX2
 * on Haswell/Broadwell: 2 x 5 = 10); AMD Zen 2: 2 x 5 = 10, Zen 3/4: 2 x 4 =
 * 8. And all chains plus the two constants must fit in the register file, or
 * the compiler spills accumulators and each spilled chain waits on a store
 * and a reload every iteration (with 16 chains on AVX2's 16 ymm registers GCC
 * 12 kept 3 of them on the stack: the probe read about half of a Zen 3's
 * peak). So: AVX-512, 32 zmm: 16 chains + 2 = 18 registers; AVX2, 16 ymm: 12
 * chains + 2 = 14; SSE (no FMA: a separate mul and add), 16 xmm: 14 + 2 = 16,
 * 28 ops in flight. Check with `objdump -d build/bench/fma_peak`: the loop of
 * fma_chains_avx2 is 12 vfmadd*ps on registers and no vmovaps. */
#ifndef DSC_BENCH_FMA_PROBE_H
#define DSC_BENCH_FMA_PROBE_H

#include <immintrin.h>
#include <stdint.h>

#define FMA_CHAINS 16      /* AVX-512: 16 x 32 flops per iteration */
#define FMA_CHAINS_AVX2 12 /* AVX2: 12 x 16 flops per iteration */
#define FMA_CHAINS_SSE 14  /* SSE2 mul + add: 14 x 8 flops per iteration */

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

__attribute__((target("avx2,fma"))) static inline float fma_chains_avx2(int64_t iters, float seed) {
  __m256 acc[FMA_CHAINS_AVX2];
  for (int c = 0; c < FMA_CHAINS_AVX2; c++) acc[c] = _mm256_set1_ps(seed + (float)c);
  const __m256 a = _mm256_set1_ps(0.999f), b = _mm256_set1_ps(0.001f);
  for (int64_t i = 0; i < iters; i++) {
#pragma GCC unroll 16
    for (int c = 0; c < FMA_CHAINS_AVX2; c++) acc[c] = _mm256_fmadd_ps(acc[c], a, b);
  }
  __m256 s = acc[0];
  for (int c = 1; c < FMA_CHAINS_AVX2; c++) s = _mm256_add_ps(s, acc[c]);
  float lanes[8];
  _mm256_storeu_ps(lanes, s);
  float t = 0;
  for (int i = 0; i < 8; i++) t += lanes[i];
  return t;
}

/* The baseline ISA (SSE2, dsc's DSC_CPU_ISA=baseline): no FMA, so a mulps
 * and a dependent addps per chain step (2 flops a lane, as one FMA). */
static inline float fma_chains_sse(int64_t iters, float seed) {
  __m128 acc[FMA_CHAINS_SSE];
  for (int c = 0; c < FMA_CHAINS_SSE; c++) acc[c] = _mm_set1_ps(seed + (float)c);
  const __m128 a = _mm_set1_ps(0.999f), b = _mm_set1_ps(0.001f);
  for (int64_t i = 0; i < iters; i++) {
#pragma GCC unroll 16
    for (int c = 0; c < FMA_CHAINS_SSE; c++) acc[c] = _mm_add_ps(_mm_mul_ps(acc[c], a), b);
  }
  __m128 s = acc[0];
  for (int c = 1; c < FMA_CHAINS_SSE; c++) s = _mm_add_ps(s, acc[c]);
  float lanes[4];
  _mm_storeu_ps(lanes, s);
  return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}

#endif
