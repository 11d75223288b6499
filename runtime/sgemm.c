/* A BLIS-style packed f32 GEMM with an AVX-512 microkernel, for cg_gemm's
 * strided operands (runtime/gemm_cpu.c picks it for f32 on AVX-512 hosts).
 *
 * Why our own: on these 2-core Xeons (Sapphire Rapids under KVM) oneDNN 2.6's
 * dnnl_sgemm reaches 66-76% of a core's FMA peak on GPT-2's shapes and its
 * matmul primitive less; this one aims at 80-90% and runs on dsc's pool.
 *
 * Structure (BLIS's loops, with the roles of A and B swapped because C is
 * row-major and the vector dimension runs along N):
 *   rows of C in blocks of MB -> depth in blocks of KC: pack A (MB x KC)
 *     -> columns in blocks of NB: pack B (KC x NB, stays in L2)
 *       -> A micro-panels of MR rows (MR x KC, stays in L1)
 *         -> B micro-panels of NR columns (streamed from L2): microkernel.
 * The microkernel keeps an MR x NR tile of C in registers: per step of k it
 * loads NR/16 vectors of B and broadcasts MR elements of A into MR*NR/16
 * FMAs. MR = 12, NR = 32 (BLIS's Skylake-X shape, transposed): 24
 * accumulators + 2 B vectors + 1 broadcast of the 32 zmm registers; 24
 * independent FMA chains cover the 4-cycle latency on two FMA ports (8
 * needed); 14 loads per 24 FMAs stay under the two load ports' limit; the B
 * stream from L2 costs 64/MR = 5.3 bytes per FMA (8x48 would need 8). 32
 * divides every N of GPT-2 (768, 2304, 3072, 50304); M = 256 wastes 2% in
 * edge tiles. In isolation (panels in cache) it runs at ~87% of a core's
 * FMA peak here; in whole GEMMs packing and memory stalls take more (the
 * transposed-B packing of the LM head most: see bench/gemm_shapes.c).
 * Cache blocking for L1d 48 KiB / L2 2 MiB per core (lscpu): KC = 384 keeps
 * the A micro-panel at 18 KiB (~40% of L1, the rest for the B stream);
 * NB = 320 makes the packed B block 480 KiB, so that it, the streamed A
 * block and C's tiles fit L2; MB = 1020 bounds the packed A block (1.5 MiB) while
 * repacking B only M/1020 times. (Software prefetching of the next B and A
 * blocks and of the C tile, spread over the kernels' k loops, made no
 * measurable difference here, so it is not done; re-measured in wave 4 with
 * an A/B harness: prefetching the next B block's source from the kernels
 * costs 7%, prefetching rows ahead inside the packing, B in the kernel, or
 * KC 256 / NB 480 change nothing. A transposed B with K <= 768 is one
 * depth block: see kc_of.)
 * Pages: on this KVM guest the GEMMs lose 20-60% to TLB misses (two-level
 * page walks) when the operands are on 4 KiB pages: bench/gemm_shapes
 * --huge shows the difference. The executor's arenas should be 2 MiB
 * aligned and advised MADV_HUGEPAGE; this file cannot do it for them.
 *
 * Determinism: threads split the larger of M and N in whole micro-panels
 * (or whole batches) and NEVER split K. Every element of C is computed by
 * the same sequence of FMAs (depth blocks of kc_of(g) from k = 0, each block's
 * products in order of k, then C = alpha * acc + beta * C with beta = 1
 * after the first block) whatever tile, chunk or thread it lands in, so the
 * result is bitwise identical for any thread count and any run.
 * beta == 0 never reads C (it may hold garbage or NaN). */
#include <string.h>

#include "runtime/runtime.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define RT_SGEMM_X86 1
#include <immintrin.h>
#endif

#ifndef RT_SGEMM_KC
#define RT_SGEMM_KC 384
#endif
#ifndef RT_SGEMM_NB
#define RT_SGEMM_NB 320
#endif
#ifndef RT_SGEMM_MR
#define RT_SGEMM_MR 12
#endif
#ifndef RT_SGEMM_NR
#define RT_SGEMM_NR 32
#endif
#define MR RT_SGEMM_MR
#define NR RT_SGEMM_NR /* a multiple of 16 */
#define NV (NR / 16)
#define KC RT_SGEMM_KC
#define NB (RT_SGEMM_NB / NR * NR)
#define MB (1024 / MR * MR)

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

/* One matrix of one batch: element (r, c) at p[r * rs + c * cs]. */
typedef struct {
  const float *p;
  int64_t rs, cs;
} rt_view;

/* The GEMM with C's unit stride along columns: a C with unit row stride is
 * computed as C^T = B^T A^T, so that the vector dimension runs along C's
 * contiguous one. */
static bool c_transposed(const cg_gemm *g) { return g->c.col_stride != 1 && g->c.row_stride == 1; }

static cg_gemm canonical(const cg_gemm *g) {
  cg_gemm t = *g;
  if (c_transposed(g)) {
    t.m = g->n;
    t.n = g->m;
    t.a = g->b;
    t.a.row_stride = g->b.col_stride;
    t.a.col_stride = g->b.row_stride;
    t.b = g->a;
    t.b.row_stride = g->a.col_stride;
    t.b.col_stride = g->a.row_stride;
    t.c.row_stride = g->c.col_stride;
    t.c.col_stride = g->c.row_stride;
  }
  return t;
}

/* The depth block: KC, except that a transposed B (W^T with W row-major,
 * the LM head's tied embedding) with K <= 2 KC is one block. Its packing
 * then reads each row of W whole, once per column block, and C is written
 * once instead of written and re-read: with 4 KiB pages on this KVM guest
 * every page touched is a costly two-level TLB walk, and C (256 x 50304)
 * and W (154 MB) are large. Measured on 256x50304x768: 18% less time with
 * 4 KiB pages, 6% with huge pages; on row-major B (256x3072x768) one block
 * of 768 was 7-13% slower, so it keeps KC. Depends on the shape only. */
static int64_t kc_of(const cg_gemm *g) {
  bool bt = g->b.row_stride == 1 && g->b.col_stride != 1;
  return bt && g->k <= 2 * KC ? g->k : min64(g->k, KC);
}
/* The column block: the packed B block stays within KC x NB floats. */
static int64_t nb_of(const cg_gemm *g) {
  int64_t kc = kc_of(g);
  return kc <= KC ? NB : (int64_t)KC * NB / kc / NR * NR;
}

/* Floats of packing scratch one thread needs (A block, B block, one C tile),
 * each part a multiple of 16 floats (64 bytes). */
static int64_t a_floats(const cg_gemm *g) {
  return round_up(min64(round_up(g->m, MR), MB) * kc_of(g), 16);
}
static int64_t b_floats(const cg_gemm *g) {
  return round_up(min64(round_up(g->n, NR), nb_of(g)) * kc_of(g), 16);
}

int64_t rt_sgemm_scratch_floats(const cg_gemm *g) {
  cg_gemm t = canonical(g);
  return a_floats(&t) + b_floats(&t) + MR * NR;
}

#ifdef RT_SGEMM_X86

bool rt_sgemm_supported(void) { return cg_cpu_isa_get() >= CG_ISA_AVX512; /* $DSC_CPU_ISA */ }

/* ---- packing ---- */

/* dst[i * dst_ld + j] = src[j * ld + i] for i, j < 16: packs a transposed B
 * (B = W^T with W row-major), whose columns are contiguous. */
__attribute__((target("avx512f"))) static inline void transpose_regs(__m512 *r) {
  __m512 t[16];
  for (int i = 0; i < 8; i++) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  /* u[4i+q], lane L: rows 4i..4i+3 of column 4L+q */
  for (int i = 0; i < 4; i++) {
    __m512d a0 = _mm512_castps_pd(t[4 * i]), a1 = _mm512_castps_pd(t[4 * i + 1]);
    __m512d a2 = _mm512_castps_pd(t[4 * i + 2]), a3 = _mm512_castps_pd(t[4 * i + 3]);
    r[4 * i + 0] = _mm512_castpd_ps(_mm512_unpacklo_pd(a0, a2));
    r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a0, a2));
    r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(a1, a3));
    r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(a1, a3));
  }
  for (int q = 0; q < 4; q++) {
    __m512 v0 = _mm512_shuffle_f32x4(r[q], r[4 + q], 0x44);
    __m512 v1 = _mm512_shuffle_f32x4(r[q], r[4 + q], 0xEE);
    __m512 w0 = _mm512_shuffle_f32x4(r[8 + q], r[12 + q], 0x44);
    __m512 w1 = _mm512_shuffle_f32x4(r[8 + q], r[12 + q], 0xEE);
    t[0 + q] = _mm512_shuffle_f32x4(v0, w0, 0x88);
    t[4 + q] = _mm512_shuffle_f32x4(v0, w0, 0xDD);
    t[8 + q] = _mm512_shuffle_f32x4(v1, w1, 0x88);
    t[12 + q] = _mm512_shuffle_f32x4(v1, w1, 0xDD);
  }
  for (int i = 0; i < 16; i++) r[i] = t[i];
}

__attribute__((target("avx512f"))) static void transpose16(const float *src, int64_t ld, float *dst,
                                                           int64_t dst_ld) {
  __m512 r[16];
  for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_ps(src + i * ld);
  transpose_regs(r);
  for (int i = 0; i < 16; i++) _mm512_storeu_ps(dst + i * dst_ld, r[i]);
}

/* dst[k * MR + i] = src[i * ld + k] for i < rows (<= MR <= 16), k < 16;
 * lanes rows..MR-1 zero: 16 depths of an A micro-panel from row-major A. */
__attribute__((target("avx512f"))) static void transpose_rows(const float *src, int64_t ld,
                                                              int rows, float *dst) {
  __m512 r[16];
  for (int i = 0; i < 16; i++)
    r[i] = i < rows ? _mm512_loadu_ps(src + i * ld) : _mm512_setzero_ps();
  transpose_regs(r);
  __mmask16 m = (__mmask16)((1u << MR) - 1);
  for (int k = 0; k < 16; k++) _mm512_mask_storeu_ps(dst + k * MR, m, r[k]);
}

/* A[i0 + r, p0 + k] for r < mb, k < kc into MR-row micro-panels:
 * dst[(panel * kc + k) * MR + r], rows past mb zero. */
__attribute__((target("avx512f"))) static void pack_a(rt_view a, int64_t i0, int64_t mb, int64_t p0,
                                                      int64_t kc, float *dst) {
  for (int64_t ir = 0; ir < mb; ir += MR, dst += kc * MR) {
    int rows = (int)min64(MR, mb - ir);
    const float *src = a.p + (i0 + ir) * a.rs + p0 * a.cs;
    if (a.rs == 1 && rows == MR) {
      /* transposed A: the MR rows of one k are contiguous */
      for (int64_t k = 0; k < kc; k++) memcpy(dst + k * MR, src + k * a.cs, MR * sizeof(float));
      continue;
    }
    int64_t k16 = 0;
    if (a.cs == 1 && MR <= 16) {
      /* row-major A: 16 x 16 register transposes of 16 depths of the rows */
      for (; k16 + 16 <= kc; k16 += 16) transpose_rows(src + k16, a.rs, rows, dst + k16 * MR);
    }
    if (rows < MR) memset(dst + k16 * MR, 0, (size_t)((kc - k16) * MR) * sizeof(float));
    /* the rest row by row: reads along each row of A */
    for (int r = 0; r < rows; r++) {
      const float *s = src + r * a.rs;
      for (int64_t k = k16; k < kc; k++) dst[k * MR + r] = s[k * a.cs];
    }
  }
}

/* B[p0 + k, j0 + c] for k < kc, c < nb into NR-column micro-panels:
 * dst[(panel * kc + k) * NR + c], columns past nb zero. */
__attribute__((target("avx512f"))) static void pack_b(rt_view b, int64_t p0, int64_t kc, int64_t j0,
                                                      int64_t nb, float *dst) {
  if (b.cs == 1) {
    /* row-major B: each row segment read once, front to back; full panels
     * copy NR floats with a constant size (inlined vector moves) */
    int64_t full = nb / NR * NR;
    for (int64_t k = 0; k < kc; k++) {
      const float *src = b.p + (p0 + k) * b.rs + j0;
      for (int64_t jr = 0; jr < full; jr += NR)
        memcpy(dst + jr * kc + k * NR, src + jr, NR * sizeof(float));
      if (full < nb) {
        float *d = dst + full * kc + k * NR;
        memcpy(d, src + full, (size_t)(nb - full) * sizeof(float));
        memset(d + (nb - full), 0, (size_t)(NR - (nb - full)) * sizeof(float));
      }
    }
    return;
  }
  for (int64_t jr = 0; jr < nb; jr += NR, dst += kc * NR) {
    int cols = (int)min64(NR, nb - jr);
    const float *src = b.p + p0 * b.rs + (j0 + jr) * b.cs;
    if (cols < NR) memset(dst, 0, (size_t)(kc * NR) * sizeof(float));
    int64_t k16 = b.rs == 1 ? kc / 16 * 16 : 0;
    int c16 = b.rs == 1 ? cols / 16 * 16 : 0;
    /* B^T's rows (columns of B) are contiguous: 16 x 16 register transposes */
    for (int c = 0; c < c16; c += 16)
      for (int64_t k = 0; k < k16; k += 16)
        transpose16(src + c * b.cs + k, b.cs, dst + k * NR + c, NR);
    for (int c = 0; c < cols; c++) {
      const float *s = src + c * b.cs;
      for (int64_t k = c < c16 ? k16 : 0; k < kc; k++) dst[k * NR + c] = s[k * b.rs];
    }
  }
}

/* ---- the microkernel ---- */

/* c[r * ldc + j] = alpha * sum_k a[k*MR + r] * b[k*NR + j] + beta * c[...]
 * for r < mr, j < nr (unit column stride); beta == 0 never reads c. */
__attribute__((target("avx512f,fma"))) static void kernel(int64_t kc, const float *restrict a,
                                                          const float *restrict b, float *c,
                                                          int64_t ldc, int mr, int nr, float alpha,
                                                          float beta) {
  __m512 acc[MR][NV];
#pragma GCC unroll 16
  for (int r = 0; r < MR; r++)
#pragma GCC unroll 4
    for (int v = 0; v < NV; v++) acc[r][v] = _mm512_setzero_ps();
  for (int64_t k = 0; k < kc; k++) {
    __m512 bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; v++) bv[v] = _mm512_load_ps(b + v * 16);
#pragma GCC unroll 16
    for (int r = 0; r < MR; r++) {
      __m512 av = _mm512_set1_ps(a[r]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; v++) acc[r][v] = _mm512_fmadd_ps(av, bv[v], acc[r][v]);
    }
    a += MR;
    b += NR;
  }
  __mmask16 mask[NV];
  for (int v = 0; v < NV; v++) {
    int n = nr - v * 16;
    mask[v] = n >= 16 ? (__mmask16)0xFFFF : n <= 0 ? 0 : (__mmask16)((1u << n) - 1);
  }
  __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
  for (int r = 0; r < mr; r++) {
    float *cr = c + r * ldc;
    for (int v = 0; v < NV; v++) {
      __m512 x = _mm512_mul_ps(va, acc[r][v]);
      if (beta != 0) x = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(mask[v], cr + v * 16), x);
      _mm512_mask_storeu_ps(cr + v * 16, mask[v], x);
    }
  }
}

/* ---- the blocked loops ---- */

/* C[i0:i1, j0:j1] of one GEMM (canonical: unit column stride in C, or a
 * strided C updated through the tile buffer), single-threaded. */
static void gemm_block(const cg_gemm *g, rt_view a, rt_view b, float *c, int64_t i0, int64_t i1,
                       int64_t j0, int64_t j1, float *scratch) {
  float *ap = scratch, *bp = scratch + a_floats(g), *tile = bp + b_floats(g);
  int64_t crs = g->c.row_stride, ccs = g->c.col_stride;
  float alpha = (float)g->alpha;
  int64_t kcb = kc_of(g), ncb = nb_of(g);
  for (int64_t ib = i0; ib < i1; ib += MB) {
    int64_t mb = min64(MB, i1 - ib);
    for (int64_t pb = 0; pb < g->k; pb += kcb) {
      int64_t kc = min64(kcb, g->k - pb);
      float beta = pb == 0 ? (float)g->beta : 1.0f;
      pack_a(a, ib, mb, pb, kc, ap);
      for (int64_t jb = j0; jb < j1; jb += ncb) {
        int64_t nb = min64(ncb, j1 - jb);
        pack_b(b, pb, kc, jb, nb, bp);
        for (int64_t ir = 0; ir < mb; ir += MR) {
          int mr = (int)min64(MR, mb - ir);
          const float *apanel = ap + ir * kc;
          for (int64_t jr = 0; jr < nb; jr += NR) {
            int nr = (int)min64(NR, nb - jr);
            float *ct = c + (ib + ir) * crs + (jb + jr) * ccs;
            if (ccs == 1) {
              kernel(kc, apanel, bp + jr * kc, ct, crs, mr, nr, alpha, beta);
              continue;
            }
            /* strided C: the tile in a buffer, then the update element-wise */
            kernel(kc, apanel, bp + jr * kc, tile, NR, mr, nr, 1.0f, 0.0f);
            for (int r = 0; r < mr; r++)
              for (int j = 0; j < nr; j++) {
                float *cj = ct + r * crs + j * ccs, x = alpha * tile[r * NR + j];
                *cj = beta != 0 ? __builtin_fmaf(beta, *cj, x) : x;
              }
          }
        }
      }
    }
  }
}

typedef struct {
  const cg_gemm *g; /* canonical */
  const float *a, *b;
  float *c;
  float *scratch;
  int64_t per_thread;
  bool split_m;  /* chunks are MR-row panels (else NR-column panels) */
  bool batches;  /* chunks are whole batches */
  int64_t batch; /* the batch the panels belong to (when !batches) */
} rt_sgemm_job;

static void run_batch(const rt_sgemm_job *j, int64_t bb, int64_t i0, int64_t i1, int64_t j0,
                      int64_t j1, float *scratch) {
  const cg_gemm *g = j->g;
  int64_t b0 = bb / g->batch[1], b1 = bb % g->batch[1];
  rt_view a = {j->a + g->a.offset + b0 * g->a.batch_stride[0] + b1 * g->a.batch_stride[1],
               g->a.row_stride, g->a.col_stride};
  rt_view b = {j->b + g->b.offset + b0 * g->b.batch_stride[0] + b1 * g->b.batch_stride[1],
               g->b.row_stride, g->b.col_stride};
  float *c = j->c + g->c.offset + b0 * g->c.batch_stride[0] + b1 * g->c.batch_stride[1];
  gemm_block(g, a, b, c, i0, i1, j0, j1, scratch);
}

static void run_chunk(void *arg, int64_t begin, int64_t end, int chunk) {
  const rt_sgemm_job *j = arg;
  const cg_gemm *g = j->g;
  float *scratch = j->scratch + chunk * j->per_thread;
  if (j->batches)
    for (int64_t bb = begin; bb < end; bb++) run_batch(j, bb, 0, g->m, 0, g->n, scratch);
  else if (j->split_m)
    run_batch(j, j->batch, begin * MR, min64(end * MR, g->m), 0, g->n, scratch);
  else
    run_batch(j, j->batch, 0, g->m, begin * NR, min64(end * NR, g->n), scratch);
}

void rt_sgemm(rt_pool *pool, const cg_gemm *g0, const float *a, const float *b, float *c,
              float *scratch, int64_t per_thread) {
  cg_gemm g = canonical(g0);
  if (c_transposed(g0)) {
    const float *t = a; /* C^T = B^T A^T: the operands trade places */
    a = b;
    b = t;
  }
  rt_sgemm_job j = {&g, a, b, c, scratch, per_thread, g.m >= g.n, false, 0};
  int threads = rt_pool_threads(pool);
  int64_t nbatch = g.batch[0] * g.batch[1];
  /* Whole batches per thread when they split evenly or are many (the
   * attention heads); else each batch split over the threads. Every choice
   * depends on the shape only. */
  if (nbatch > 1 && threads > 1 && (nbatch % threads == 0 || nbatch >= 4 * threads)) {
    j.batches = true;
    rt_pool_parallel_for(pool, nbatch, 1, run_chunk, &j);
    return;
  }
  int64_t units = j.split_m ? (g.m + MR - 1) / MR : (g.n + NR - 1) / NR;
  /* at least ~1M multiply-adds per chunk, so small GEMMs stay on one thread */
  int64_t per_unit = (j.split_m ? MR * g.n : NR * g.m) * g.k;
  int64_t min_units = per_unit >= (1 << 20) ? 1 : (1 << 20) / per_unit;
  for (j.batch = 0; j.batch < nbatch; j.batch++)
    rt_pool_parallel_for(pool, units, min_units, run_chunk, &j);
}

#else /* not x86-64 */

bool rt_sgemm_supported(void) { return false; }

void rt_sgemm(rt_pool *pool, const cg_gemm *g, const float *a, const float *b, float *c,
              float *scratch, int64_t per_thread) {
  (void)pool, (void)g, (void)a, (void)b, (void)c, (void)scratch, (void)per_thread;
}

#endif
