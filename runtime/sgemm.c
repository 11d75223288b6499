/* A BLIS-style packed GEMM for cg_gemm's strided operands, f32 or bf16
 * operands and f32 or bf16 C, with an AVX-512 and an AVX2+FMA microkernel
 * (runtime/gemm_cpu.c picks one by cg_cpu_isa_get(), $DSC_CPU_ISA).
 *
 * What changed (issue 16, "fast on any CPU"):
 *   - bf16 operands: the packing widens bf16 to f32 (a 16-bit shift, exact)
 *     while it copies, and the same f32 microkernel runs; products of two
 *     bf16 are exact in f32, so only the f32 accumulation rounds. A bf16 C
 *     is rounded once, to nearest even (cg_bf16_of_f32: the bits of
 *     ir_bf16_bits, the interpreter's rounding), from the f32 result of the
 *     whole depth: over several depth blocks the f32 sums of a block of C
 *     are kept in scratch (acc) and rounded after the last. Before, bf16
 *     GEMMs went to oneDNN 2.6's matmul primitive (a 128x256x64 one took
 *     130 ms in a gpt-tiny step).
 *   - an AVX2+FMA kernel (6 x 16, BLIS's Haswell shape) for AVX2-only
 *     hosts (AMD Zen 3), with packing that uses no AVX-512 instruction; the
 *     packing is one template (pack_a_t, pack_b_t) instantiated per kernel
 *     and operand dtype.
 *   - for bf16 operands on AVX512-BF16 hosts, an opt-in 12x32 kernel with
 *     vdpbf16ps on bf16 pairs (RT_GEMM_DPBF16; pack_a_pairs, pack_b_pairs,
 *     kernel512_dp), tested next to the converting kernel. Not the default:
 *     on this Sapphire Rapids it runs at 0.55-0.9x of the converting
 *     kernel on GPT-2's shapes (bench/gemm_shapes "dp/512", --best, load
 *     4.5-5.6): vdpbf16ps does 2 multiply-adds per lane but issues on one
 *     port where FMAs issue on two, so the peak is the same and the pair
 *     packing is extra.
 *   - rt_sgemm_scratch_floats is the largest over both kernels and C's
 *     dtypes, so that the memory plan holds whichever the executor picks.
 *   - AVX2 packing without element-by-element loops: row-major A through
 *     8 x 8 register transposes (transpose_rows8), bf16 rows widened 8, 4
 *     and 2 at a time (widen_bf16), and no masked stores (vmaskmovps to
 *     memory is microcoded on Zen: with it the batched 64x64x64 attention
 *     products ran 17% slower than element by element). On GPT-2's step
 *     at DSC_CPU_ISA=avx2 the bf16 step went from 1.01-1.03x of f32's time
 *     to 0.97-0.98x (docs/performance.md).
 * The AVX-512 f32 path does the same operations as before (bitwise).
 * Measured (bench/gemm_shapes --dnnl-avx2 --best, 2 threads, load 2.4-3.6):
 * over GPT-2's step shapes the AVX2 kernel runs at 0.97x oneDNN 2.6's AVX2
 * dnnl_sgemm (0.83x on 256x768x3072, 0.86x on 256x768x50304, 1.3x on the
 * batched attention products; oneDNN is not used on that path all the
 * same: 3% overall, and its results depend on the thread count); bf16
 * operands run at 0.99-1.02x of f32 on the same kernel (docs/performance.md).
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
 * FMAs. AVX-512: MR = 12, NR = 32 (BLIS's Skylake-X shape, transposed): 24
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
#include <stdint.h>
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
#define KC RT_SGEMM_KC
#define MR512 12 /* the AVX-512 kernel: 12 x 32 */
#define NR512 32
#define MR256 6 /* the AVX2 kernel: 6 x 16 */
#define NR256 16

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }
static int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

/* One matrix of one batch: element (r, c) at p[r * rs + c * cs], f32 or
 * bf16 elements (the packing's template parameter says which). */
typedef struct {
  const void *p;
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
/* The column block (for micro-panels of nr columns): the packed B block
 * stays within KC x NB floats. */
static int64_t nb_of(const cg_gemm *g, int nr) {
  int64_t kc = kc_of(g), nb = RT_SGEMM_NB / nr * nr;
  return kc <= KC ? nb : (int64_t)KC * nb / kc / nr * nr;
}
/* The row block: bounds the packed A block, ~1020 rows. */
static int64_t mb_of(int mr) { return 1024 / mr * mr; }

/* Floats of packing scratch one thread needs for a kernel of mr x nr (A
 * block, B block, one C tile, and for a bf16 C over several depth blocks
 * the f32 sums of one mb x nb block), each part a multiple of 16 floats
 * (64 bytes). */
static int64_t a_floats(const cg_gemm *g, int mr) {
  return round_up(min64(round_up(g->m, mr), mb_of(mr)) * kc_of(g), 16);
}
static int64_t b_floats(const cg_gemm *g, int nr) {
  return round_up(min64(round_up(g->n, nr), nb_of(g, nr)) * kc_of(g), 16);
}
static int64_t acc_ld(const cg_gemm *g, int nr) { return min64(round_up(g->n, nr), nb_of(g, nr)); }
static int64_t acc_floats(const cg_gemm *g, int mr, int nr) {
  if (g->k <= kc_of(g)) return 0;
  return round_up(min64(round_up(g->m, mr), mb_of(mr)) * acc_ld(g, nr), 16);
}
static int64_t scratch_of(const cg_gemm *g, int mr, int nr) {
  return a_floats(g, mr) + b_floats(g, nr) + round_up(mr * nr, 16) + acc_floats(g, mr, nr);
}

/* The largest over the kernels (and over C's dtypes: the bf16-C block is
 * counted whenever K spans several depth blocks), so that the memory plan,
 * which knows neither the ISA the executor will pick nor the dtypes, holds
 * for any of them. */
int64_t rt_sgemm_scratch_floats(const cg_gemm *g) {
  cg_gemm t = canonical(g);
  return max64(scratch_of(&t, MR512, NR512), scratch_of(&t, MR256, NR256));
}

bool rt_sgemm_dtypes_supported(dsc_dtype ab, dsc_dtype c) {
  return (ab == DSC_F32 || ab == DSC_BF16) && (c == DSC_F32 || c == DSC_BF16);
}

#ifdef RT_SGEMM_X86

bool rt_sgemm_isa_supported(cg_cpu_isa isa) { return isa >= CG_ISA_AVX2; }
bool rt_sgemm_supported(void) {
  return rt_sgemm_isa_supported(cg_cpu_isa_get()); /* $DSC_CPU_ISA */
}

#define SG_INLINE static inline __attribute__((always_inline))

/* ---- bf16 (as ir/types.c: bf16 -> f32 exact, f32 -> bf16 to nearest even) ---- */

/* cg_f32_of_bf16 / cg_bf16_of_f32: program/program.h */

/* Element i of an f32 or bf16 array, as f32. */
SG_INLINE float elem(const void *p, int64_t i, bool bf16) {
  return bf16 ? cg_f32_of_bf16(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}
SG_INLINE const void *elem_ptr(const void *p, int64_t i, bool bf16) {
  return bf16 ? (const void *)((const uint16_t *)p + i) : (const void *)((const float *)p + i);
}

/* ---- packing: AVX2 register transposes (the 6x16 kernel's B^T) ---- */

/* 8 elements from p (f32, or bf16 widened by a shift) */
__attribute__((target("avx2"))) static inline __m256 load8(const void *p, bool bf16) {
  if (!bf16) return _mm256_loadu_ps(p);
  __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

/* dst[i * dst_ld + j] = src[j * ld + i] for i, j < 8: a transposed B's
 * columns are contiguous, its packed panel wants rows (element by element
 * this cost the dx GEMMs 10-15% against oneDNN's AVX2 sgemm). */
/* 8 x 8 in registers: r[i] holds row i's 8 values on entry, column i's on
 * exit (also the few-row path's transposed B, below). */
__attribute__((target("avx2"))) static inline void transpose8x8_regs(__m256 r[8]) {
  __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
  __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
  __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
  __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
  /* s_q: elements q and q + 4 of rows 0-3 (low lanes) / 4-7 (in s_q+4) */
  __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xEE);
  __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xEE);
  __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xEE);
  __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xEE);
  r[0] = _mm256_permute2f128_ps(s0, s4, 0x20), r[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
  r[2] = _mm256_permute2f128_ps(s2, s6, 0x20), r[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
  r[4] = _mm256_permute2f128_ps(s0, s4, 0x31), r[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
  r[6] = _mm256_permute2f128_ps(s2, s6, 0x31), r[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
}

__attribute__((target("avx2"))) static void transpose8(const void *src, int64_t ld, bool bf16,
                                                       float *dst, int64_t dst_ld) {
  __m256 r[8];
  for (int i = 0; i < 8; i++) r[i] = load8(elem_ptr(src, i * ld, bf16), bf16);
  transpose8x8_regs(r);
  for (int i = 0; i < 8; i++) _mm256_storeu_ps(dst + i * dst_ld, r[i]);
}

/* n bf16 at s widened to f32 at d (exact): 8, then 4, then 2 at a time,
 * an odd last one alone, never past s + n or d + n and without masked
 * stores (microcoded and slow on AMD's Zen). The packing's rows of MR (6,
 * 12) and NR (16, 32) elements. */
__attribute__((target("avx2"))) static inline void widen_bf16(const uint16_t *s, float *d, int n) {
  int i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(d + i, load8(s + i, true));
  if (i + 4 <= n) {
    __m128i w = _mm_cvtepu16_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(s + i)));
    _mm_storeu_ps(d + i, _mm_castsi128_ps(_mm_slli_epi32(w, 16)));
    i += 4;
  }
  if (i + 2 <= n) {
    int32_t two;
    memcpy(&two, s + i, sizeof two);
    __m128i w = _mm_cvtepu16_epi32(_mm_cvtsi32_si128(two));
    _mm_storel_pi((__m64 *)(void *)(d + i), _mm_castsi128_ps(_mm_slli_epi32(w, 16)));
    i += 2;
  }
  if (i < n) d[i] = cg_f32_of_bf16(s[i]);
}

/* rows (<= MR <= 8) rows of 8 depths of row-major A (row stride ld) into
 * dst[k * MR + r] for k < 8 and r < MR, lanes rows..MR-1 zero: one 8 x 8
 * register transpose (AVX2: the 6x16 kernel's A from row-major A, which
 * element by element cost bf16 most: its reads widen one at a time). Each
 * depth's 8 lanes are stored whole, the lanes past MR overwritten by the
 * next depth's store, except the last depth's (no masked store: slow on
 * Zen, see widen_bf16). */
__attribute__((target("avx2"))) static void transpose_rows8(const void *src, int64_t ld, bool bf16,
                                                            int rows, int MR, float *dst) {
  __m256 r[8];
  for (int i = 0; i < 8; i++)
    r[i] = i < rows ? load8(elem_ptr(src, i * ld, bf16), bf16) : _mm256_setzero_ps();
  transpose8x8_regs(r);
  for (int k = 0; k < 7; k++) _mm256_storeu_ps(dst + k * MR, r[k]);
  float last[8];
  _mm256_storeu_ps(last, r[7]);
  memcpy(dst + 7 * MR, last, sizeof(float) * (size_t)MR);
}

/* ---- packing: AVX-512 register transposes ---- */

/* 16 elements from p (f32, or bf16 widened by a shift) */
__attribute__((target("avx512f"))) static inline __m512 load16(const void *p, bool bf16) {
  if (!bf16) return _mm512_loadu_ps(p);
  __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}

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

__attribute__((target("avx512f"))) static void transpose16(const void *src, int64_t ld, bool bf16,
                                                           float *dst, int64_t dst_ld) {
  __m512 r[16];
  for (int i = 0; i < 16; i++) r[i] = load16(elem_ptr(src, i * ld, bf16), bf16);
  transpose_regs(r);
  for (int i = 0; i < 16; i++) _mm512_storeu_ps(dst + i * dst_ld, r[i]);
}

/* dst[k * MR512 + i] = src[i * ld + k] for i < rows (<= MR512), k < 16;
 * lanes rows..MR512-1 zero: 16 depths of an A micro-panel from row-major A. */
__attribute__((target("avx512f"))) static void transpose_rows(const void *src, int64_t ld,
                                                              bool bf16, int rows, float *dst) {
  __m512 r[16];
  for (int i = 0; i < 16; i++)
    r[i] = i < rows ? load16(elem_ptr(src, i * ld, bf16), bf16) : _mm512_setzero_ps();
  transpose_regs(r);
  __mmask16 m = (__mmask16)((1u << MR512) - 1);
  for (int k = 0; k < 16; k++) _mm512_mask_storeu_ps(dst + k * MR512, m, r[k]);
}

/* ---- packing: one template for every kernel and operand dtype ----
 * MR, NR: the kernel's shape; bf16: the operands' dtype (widened to f32
 * here, exactly); x512: the AVX-512 register transposes may be used. The
 * wrappers below instantiate it per kernel with constant arguments. */

/* A[i0 + r, p0 + k] for r < mb, k < kc into MR-row micro-panels:
 * dst[(panel * kc + k) * MR + r], rows past mb zero. */
SG_INLINE void pack_a_t(rt_view a, int64_t i0, int64_t mb, int64_t p0, int64_t kc, float *dst,
                        int MR, bool bf16, bool x512) {
  for (int64_t ir = 0; ir < mb; ir += MR, dst += kc * MR) {
    int rows = (int)min64(MR, mb - ir);
    int64_t base = (i0 + ir) * a.rs + p0 * a.cs;
    if (a.rs == 1 && rows == MR) {
      /* transposed A: the MR rows of one k are contiguous */
      for (int64_t k = 0; k < kc; k++) {
        if (!bf16) {
          memcpy(dst + k * MR, (const float *)a.p + base + k * a.cs, (size_t)MR * sizeof(float));
          continue;
        }
        widen_bf16((const uint16_t *)a.p + base + k * a.cs, dst + k * MR, MR);
      }
      continue;
    }
    int64_t k16 = 0;
    if (x512 && a.cs == 1) {
      /* row-major A: 16 x 16 register transposes of 16 depths of the rows */
      for (; k16 + 16 <= kc; k16 += 16)
        transpose_rows(elem_ptr(a.p, base + k16, bf16), a.rs, bf16, rows, dst + k16 * MR);
    } else if (a.cs == 1 && MR <= 8) {
      /* row-major A on AVX2: 8 x 8 transposes of 8 depths of the rows */
      for (; k16 + 8 <= kc; k16 += 8)
        transpose_rows8(elem_ptr(a.p, base + k16, bf16), a.rs, bf16, rows, MR, dst + k16 * MR);
    }
    if (rows < MR) memset(dst + k16 * MR, 0, (size_t)((kc - k16) * MR) * sizeof(float));
    /* the rest row by row: reads along each row of A */
    for (int r = 0; r < rows; r++)
      for (int64_t k = k16; k < kc; k++)
        dst[k * MR + r] = elem(a.p, base + r * a.rs + k * a.cs, bf16);
  }
}

/* B[p0 + k, j0 + c] for k < kc, c < nb into NR-column micro-panels:
 * dst[(panel * kc + k) * NR + c], columns past nb zero. */
SG_INLINE void pack_b_t(rt_view b, int64_t p0, int64_t kc, int64_t j0, int64_t nb, float *dst,
                        int NR, bool bf16, bool x512) {
  if (b.cs == 1) {
    /* row-major B: each row segment read once, front to back; full panels
     * copy NR elements with a constant count (inlined vector moves) */
    int64_t full = nb / NR * NR;
    for (int64_t k = 0; k < kc; k++) {
      int64_t src = (p0 + k) * b.rs + j0;
      for (int64_t jr = 0; jr < full; jr += NR) {
        float *d = dst + jr * kc + k * NR;
        if (!bf16) {
          memcpy(d, (const float *)b.p + src + jr, (size_t)NR * sizeof(float));
          continue;
        }
        widen_bf16((const uint16_t *)b.p + src + jr, d, NR);
      }
      if (full < nb) {
        float *d = dst + full * kc + k * NR;
        for (int64_t c = 0; c < nb - full; c++) d[c] = elem(b.p, src + full + c, bf16);
        memset(d + (nb - full), 0, (size_t)(NR - (nb - full)) * sizeof(float));
      }
    }
    return;
  }
  for (int64_t jr = 0; jr < nb; jr += NR, dst += kc * NR) {
    int cols = (int)min64(NR, nb - jr);
    int64_t src = p0 * b.rs + (j0 + jr) * b.cs;
    if (cols < NR) memset(dst, 0, (size_t)(kc * NR) * sizeof(float));
    /* B^T's rows (columns of B) are contiguous: 16 x 16 (AVX-512) or 8 x 8
     * (AVX2) register transposes, the edges element by element */
    const int blk = x512 ? 16 : 8;
    int64_t kb = b.rs == 1 ? kc / blk * blk : 0;
    int cb = b.rs == 1 ? cols / blk * blk : 0;
    for (int c = 0; c < cb; c += blk)
      for (int64_t k = 0; k < kb; k += blk) {
        const void *at = elem_ptr(b.p, src + c * b.cs + k, bf16);
        if (x512)
          transpose16(at, b.cs, bf16, dst + k * NR + c, NR);
        else
          transpose8(at, b.cs, bf16, dst + k * NR + c, NR);
      }
    for (int c = 0; c < cols; c++)
      for (int64_t k = c < cb ? kb : 0; k < kc; k++)
        dst[k * NR + c] = elem(b.p, src + c * b.cs + k * b.rs, bf16);
  }
}

typedef void sg_pack_a_fn(rt_view a, int64_t i0, int64_t mb, int64_t p0, int64_t kc, float *dst);
typedef void sg_pack_b_fn(rt_view b, int64_t p0, int64_t kc, int64_t j0, int64_t nb, float *dst);

#define SG_PACKERS(name, isa, MR, NR, x512)                                                    \
  __attribute__((target(isa))) static void name##_a_f32(rt_view a, int64_t i0, int64_t mb,     \
                                                        int64_t p0, int64_t kc, float *dst) {  \
    pack_a_t(a, i0, mb, p0, kc, dst, MR, false, x512);                                         \
  }                                                                                            \
  __attribute__((target(isa))) static void name##_a_bf16(rt_view a, int64_t i0, int64_t mb,    \
                                                         int64_t p0, int64_t kc, float *dst) { \
    pack_a_t(a, i0, mb, p0, kc, dst, MR, true, x512);                                          \
  }                                                                                            \
  __attribute__((target(isa))) static void name##_b_f32(rt_view b, int64_t p0, int64_t kc,     \
                                                        int64_t j0, int64_t nb, float *dst) {  \
    pack_b_t(b, p0, kc, j0, nb, dst, NR, false, x512);                                         \
  }                                                                                            \
  __attribute__((target(isa))) static void name##_b_bf16(rt_view b, int64_t p0, int64_t kc,    \
                                                         int64_t j0, int64_t nb, float *dst) { \
    pack_b_t(b, p0, kc, j0, nb, dst, NR, true, x512);                                          \
  }

SG_PACKERS(pack512, "avx512f,avx512bw,avx512vl,fma", MR512, NR512, true)
SG_PACKERS(pack256, "avx2,fma", MR256, NR256, false)

/* ---- the microkernels ----
 * c[r * ldc + j] = alpha * sum_k a[k*MR + r] * b[k*NR + j] + beta * c[...]
 * for r < mr, j < nr (unit column stride); beta == 0 never reads c. Every
 * element: one FMA per k in order of k into a zeroed f32 accumulator, then
 * x = alpha * acc and, if beta != 0, fma(beta, c, x). */

typedef void sg_kernel_fn(int64_t kc, const float *restrict a, const float *restrict b, float *c,
                          int64_t ldc, int mr, int nr, float alpha, float beta);

#define NV512 (NR512 / 16)
/* The AVX-512 kernels' update of C from their 12 x 32 sums. */
__attribute__((target("avx512f,fma"))) SG_INLINE void store512(__m512 (*acc)[NV512], float *c,
                                                               int64_t ldc, int mr, int nr,
                                                               float alpha, float beta) {
  __mmask16 mask[NV512];
  for (int v = 0; v < NV512; v++) {
    int n = nr - v * 16;
    mask[v] = n >= 16 ? (__mmask16)0xFFFF : n <= 0 ? 0 : (__mmask16)((1u << n) - 1);
  }
  __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
  for (int r = 0; r < mr; r++) {
    float *cr = c + r * ldc;
    for (int v = 0; v < NV512; v++) {
      __m512 x = _mm512_mul_ps(va, acc[r][v]);
      if (beta != 0) x = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(mask[v], cr + v * 16), x);
      _mm512_mask_storeu_ps(cr + v * 16, mask[v], x);
    }
  }
}
__attribute__((target("avx512f,fma"))) static void kernel512(int64_t kc, const float *restrict a,
                                                             const float *restrict b, float *c,
                                                             int64_t ldc, int mr, int nr,
                                                             float alpha, float beta) {
  __m512 acc[MR512][NV512];
#pragma GCC unroll 16
  for (int r = 0; r < MR512; r++)
#pragma GCC unroll 4
    for (int v = 0; v < NV512; v++) acc[r][v] = _mm512_setzero_ps();
  for (int64_t k = 0; k < kc; k++) {
    __m512 bv[NV512];
#pragma GCC unroll 4
    for (int v = 0; v < NV512; v++) bv[v] = _mm512_load_ps(b + v * 16);
#pragma GCC unroll 16
    for (int r = 0; r < MR512; r++) {
      __m512 av = _mm512_set1_ps(a[r]);
#pragma GCC unroll 4
      for (int v = 0; v < NV512; v++) acc[r][v] = _mm512_fmadd_ps(av, bv[v], acc[r][v]);
    }
    a += MR512;
    b += NR512;
  }
  store512(acc, c, ldc, mr, nr, alpha, beta);
}

/* ---- bf16 pairs for AVX512-BF16 (vdpbf16ps) ----
 * vdpbf16ps adds to each f32 lane the products of one pair of bf16 from
 * each operand (the odd element's product first, then the even one's, each
 * rounded to nearest even as an FMA would; denormals flushed): per step the
 * A panel holds, per row, the pair (A[r, 2q], A[r, 2q + 1]) as 32 bits, the
 * B panel per column the pair (B[2q, j], B[2q + 1, j]); an odd depth is
 * padded with zeros. The panels keep the f32 packing's strides (kc * MR and
 * kc * NR floats), of which they fill half. */

__attribute__((target("avx512f"))) static void pack_a_pairs(rt_view a, int64_t i0, int64_t mb,
                                                            int64_t p0, int64_t kc, float *dstf) {
  const uint16_t *p = a.p;
  int64_t kp = (kc + 1) / 2;
  for (int64_t ir = 0; ir < mb; ir += MR512, dstf += kc * MR512) {
    uint16_t *dst = (uint16_t *)dstf;
    int rows = (int)min64(MR512, mb - ir);
    if (rows < MR512 || (kc & 1)) memset(dst, 0, (size_t)(kp * MR512 * 2) * sizeof(uint16_t));
    for (int r = 0; r < rows; r++) {
      const uint16_t *s = p + (i0 + ir + r) * a.rs + p0 * a.cs;
      for (int64_t k = 0; k < kc; k++) dst[((k >> 1) * MR512 + r) * 2 + (k & 1)] = s[k * a.cs];
    }
  }
}

__attribute__((target("avx512f"))) static void pack_b_pairs(rt_view b, int64_t p0, int64_t kc,
                                                            int64_t j0, int64_t nb, float *dstf) {
  const uint16_t *p = b.p;
  uint16_t *dst = (uint16_t *)dstf;
  int64_t kp = (kc + 1) / 2, nbr = round_up(nb, NR512);
  /* element t of pair q of column c (c < nbr) */
#define PAIR(c, q, t) dst[2 * ((c) / NR512 * NR512 * kc + (q)*NR512 + (c) % NR512) + (t)]
  if (b.cs == 1) {
    /* row-major B: two rows widened to 32 bits and merged, 16 columns at once */
    int64_t full = nb / 16 * 16;
    for (int64_t q = 0; q < kp; q++) {
      bool two = 2 * q + 1 < kc;
      const uint16_t *r0 = p + (p0 + 2 * q) * b.rs + j0, *r1 = r0 + b.rs;
      for (int64_t c = 0; c < full; c += 16) {
        __m512i lo = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(r0 + c)));
        __m512i hi =
            two ? _mm512_slli_epi32(
                      _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(r1 + c))), 16)
                : _mm512_setzero_si512();
        _mm512_storeu_si512((void *)&PAIR(c, q, 0), _mm512_or_si512(lo, hi));
      }
      for (int64_t c = full; c < nbr; c++) {
        PAIR(c, q, 0) = c < nb ? r0[c] : 0;
        PAIR(c, q, 1) = c < nb && two ? r1[c] : 0;
      }
    }
    return;
  }
  for (int64_t c = 0; c < nbr; c++) {
    const uint16_t *s = p + p0 * b.rs + (j0 + c) * b.cs;
    for (int64_t q = 0; q < kp; q++)
      for (int t = 0; t < 2; t++) {
        int64_t k = 2 * q + t;
        PAIR(c, q, t) = c < nb && k < kc ? s[k * b.rs] : 0;
      }
  }
#undef PAIR
}

__attribute__((target("avx512f,avx512bf16,fma"))) static void kernel512_dp(
    int64_t kc, const float *restrict a, const float *restrict b, float *c, int64_t ldc, int mr,
    int nr, float alpha, float beta) {
  __m512 acc[MR512][NV512];
#pragma GCC unroll 16
  for (int r = 0; r < MR512; r++)
#pragma GCC unroll 4
    for (int v = 0; v < NV512; v++) acc[r][v] = _mm512_setzero_ps();
  for (int64_t q = 0; q < (kc + 1) / 2; q++) {
    __m512bh bv[NV512];
#pragma GCC unroll 4
    for (int v = 0; v < NV512; v++) bv[v] = (__m512bh)_mm512_load_si512((const void *)(b + v * 16));
#pragma GCC unroll 16
    for (int r = 0; r < MR512; r++) {
      int32_t pair;
      memcpy(&pair, a + r, sizeof pair);
      __m512bh av = (__m512bh)_mm512_set1_epi32(pair);
#pragma GCC unroll 4
      for (int v = 0; v < NV512; v++) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], av, bv[v]);
    }
    a += MR512;
    b += NR512;
  }
  store512(acc, c, ldc, mr, nr, alpha, beta);
}

/* 8 f32 lanes as 8 bf16, rounded as cg_bf16_of_f32 (to nearest even; a
 * NaN stays a quiet NaN of its sign). */
__attribute__((target("avx2,fma"))) SG_INLINE __m128i bf16x8_of(__m256 x) {
  const __m256i one = _mm256_set1_epi32(1), round = _mm256_set1_epi32(0x7fff);
  const __m256i abs = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
  const __m256i sign = _mm256_set1_epi32(0x8000), qnan = _mm256_set1_epi32(0x7fc0);
  __m256i u = _mm256_castps_si256(x);
  __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), one);
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, round), lsb), 16);
  /* unsigned ax > inf: both are below 2^31, so the signed compare is right */
  __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs), inf);
  __m256i nanv = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(u, 16), sign), qnan);
  r = _mm256_blendv_epi8(r, nanv, nan);
  /* 8 x 32 -> 8 x 16: values fit 16 bits, so the saturating pack is exact */
  __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
  return _mm256_castsi256_si128(packed);
}
/* 8 bf16 at p widened to f32 (exact) */
__attribute__((target("avx2,fma"))) SG_INLINE __m256 f32x8_of_bf16(const uint16_t *p) {
  __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(h, 16));
}

/* ---- a row of a bf16 C ----
 * dst[q] = bf16(alpha * src[q] + beta * dst[q]) for q < n (beta == 0 never
 * reads dst): update()'s operations and cg_bf16_of_f32's bits, vectorised
 * (a scalar loop here cost a small bf16 GEMM three times its f32 time). */
typedef void sg_store_bf16_fn(uint16_t *dst, const float *src, int n, float alpha, float beta);
/* the microkernel's contract with a bf16 C: c[r * ldc + j] = bf16(alpha *
 * sum + beta * c[...]), one rounding, as store_bf16 rounds a row */
typedef void sg_kernel_bf16c_fn(int64_t kc, const float *restrict a, const float *restrict b,
                                uint16_t *c, int64_t ldc, int mr, int nr, float alpha, float beta);

__attribute__((target("avx512f,avx512bw,avx512vl,fma"))) static void store_bf16_512(
    uint16_t *dst, const float *src, int n, float alpha, float beta) {
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
  const __m512i one = _mm512_set1_epi32(1), round = _mm512_set1_epi32(0x7fff);
  const __m512i abs = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
  const __m512i sign = _mm512_set1_epi32(0x8000), qnan = _mm512_set1_epi32(0x7fc0);
  for (int q = 0; q < n; q += 16) {
    __mmask16 m = n - q >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - q)) - 1);
    __m512 x = _mm512_mul_ps(va, _mm512_maskz_loadu_ps(m, src + q));
    if (beta != 0) {
      __m512i old = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, dst + q));
      x = _mm512_fmadd_ps(vb, _mm512_castsi512_ps(_mm512_slli_epi32(old, 16)), x);
    }
    __m512i u = _mm512_castps_si512(x);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), one);
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, round), lsb), 16);
    __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, abs), inf);
    __m512i nanv = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(u, 16), sign), qnan);
    r = _mm512_mask_mov_epi32(r, nan, nanv);
    _mm256_mask_storeu_epi16(dst + q, m, _mm512_cvtepi32_epi16(r));
  }
}

__attribute__((target("avx2,fma"))) static void store_bf16_256(uint16_t *dst, const float *src,
                                                               int n, float alpha, float beta) {
  const __m256 va = _mm256_set1_ps(alpha), vb = _mm256_set1_ps(beta);
  int q = 0;
  for (; q + 8 <= n; q += 8) {
    __m256 x = _mm256_mul_ps(va, _mm256_loadu_ps(src + q));
    if (beta != 0) x = _mm256_fmadd_ps(vb, f32x8_of_bf16(dst + q), x);
    _mm_storeu_si128((__m128i *)(dst + q), bf16x8_of(x));
  }
  for (; q < n; q++)
    dst[q] = cg_bf16_of_f32(beta != 0 ? __builtin_fmaf(beta, cg_f32_of_bf16(dst[q]), alpha * src[q])
                                   : alpha * src[q]);
}

/* BLIS's Haswell shape (transposed): 6 x 16, 12 ymm accumulators + 2 B
 * vectors + 1 broadcast of the 16 ymm registers; 12 independent FMA chains
 * (4-5 cycles latency x 2 ports: 8-10 needed); 8 loads per 12 FMAs. Edge
 * columns go element by element (AVX2 has no cheap masked loads). C is f32
 * or, with c_bf16, bf16: the sums are rounded once, from the registers'
 * spill, as store_bf16_256 rounds a row (the tile buffer and a second pass
 * over it cost small bf16 GEMMs, k = 64 or 256, 5-20% against f32). */
__attribute__((target("avx2,fma"))) SG_INLINE void kernel256_t(int64_t kc, const float *restrict a,
                                                               const float *restrict b, void *cv,
                                                               int64_t ldc, int mr, int nr,
                                                               float alpha, float beta,
                                                               bool c_bf16) {
  __m256 acc[MR256][2];
#pragma GCC unroll 8
  for (int r = 0; r < MR256; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int64_t k = 0; k < kc; k++) {
    __m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8);
#pragma GCC unroll 8
    for (int r = 0; r < MR256; r++) {
      __m256 av = _mm256_broadcast_ss(a + r);
      acc[r][0] = _mm256_fmadd_ps(av, b0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(av, b1, acc[r][1]);
    }
    a += MR256;
    b += NR256;
  }
  /* the sums leave the registers once, through constant indices (indexing
   * acc by the runtime mr made GCC keep acc in memory, stored every k) */
  float t[MR256 * NR256];
#pragma GCC unroll 8
  for (int r = 0; r < MR256; r++) {
    _mm256_storeu_ps(t + r * NR256, acc[r][0]);
    _mm256_storeu_ps(t + r * NR256 + 8, acc[r][1]);
  }
  __m256 va = _mm256_set1_ps(alpha), vb = _mm256_set1_ps(beta);
  if (c_bf16) {
    uint16_t *c = cv;
    if (nr < NR256) {
      for (int r = 0; r < mr; r++) store_bf16_256(c + r * ldc, t + r * NR256, nr, alpha, beta);
      return;
    }
    for (int r = 0; r < mr; r++)
      for (int v = 0; v < 2; v++) {
        uint16_t *p = c + r * ldc + v * 8;
        __m256 x = _mm256_mul_ps(va, _mm256_loadu_ps(t + r * NR256 + v * 8));
        if (beta != 0) x = _mm256_fmadd_ps(vb, f32x8_of_bf16(p), x);
        _mm_storeu_si128((__m128i *)p, bf16x8_of(x));
      }
    return;
  }
  float *c = cv;
  if (nr == NR256) {
    for (int r = 0; r < mr; r++)
      for (int v = 0; v < 2; v++) {
        float *p = c + r * ldc + v * 8;
        __m256 x = _mm256_mul_ps(va, _mm256_loadu_ps(t + r * NR256 + v * 8));
        if (beta != 0) x = _mm256_fmadd_ps(vb, _mm256_loadu_ps(p), x);
        _mm256_storeu_ps(p, x);
      }
    return;
  }
  for (int r = 0; r < mr; r++)
    for (int j = 0; j < nr; j++) {
      float *p = c + r * ldc + j, x = alpha * t[r * NR256 + j];
      *p = beta != 0 ? _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(beta), _mm_set_ss(*p), _mm_set_ss(x)))
                     : x;
    }
}
__attribute__((target("avx2,fma"))) static void kernel256(int64_t kc, const float *restrict a,
                                                          const float *restrict b, float *c,
                                                          int64_t ldc, int mr, int nr, float alpha,
                                                          float beta) {
  kernel256_t(kc, a, b, c, ldc, mr, nr, alpha, beta, false);
}
__attribute__((target("avx2,fma"))) static void kernel256_bf16c(int64_t kc, const float *restrict a,
                                                                const float *restrict b,
                                                                uint16_t *c, int64_t ldc, int mr,
                                                                int nr, float alpha, float beta) {
  kernel256_t(kc, a, b, c, ldc, mr, nr, alpha, beta, true);
}

typedef struct {
  const char *name;
  int mr, nr;
  sg_pack_a_fn *pack_a[2]; /* [bf16 operands] */
  sg_pack_b_fn *pack_b[2];
  sg_kernel_fn *kernel;
  sg_store_bf16_fn *store_bf16;
  sg_kernel_bf16c_fn *kernel_bf16c; /* NULL: a bf16 C goes through the tile */
} sg_kernel;

static const sg_kernel kernels[3] = {
    [RT_SGEMM_AVX2] = {"avx2",
                       MR256,
                       NR256,
                       {pack256_a_f32, pack256_a_bf16},
                       {pack256_b_f32, pack256_b_bf16},
                       kernel256,
                       store_bf16_256,
                       kernel256_bf16c},
    [RT_SGEMM_AVX512] = {"avx512",
                         MR512,
                         NR512,
                         {pack512_a_f32, pack512_a_bf16},
                         {pack512_b_f32, pack512_b_bf16},
                         kernel512,
                         store_bf16_512},
    /* bf16 operands only */
    [RT_SGEMM_AVX512_DPBF16] = {"avx512-dpbf16",
                                MR512,
                                NR512,
                                {NULL, pack_a_pairs},
                                {NULL, pack_b_pairs},
                                kernel512_dp,
                                store_bf16_512},
};

rt_sgemm_kernel rt_sgemm_kernel_for(cg_cpu_isa isa, dsc_dtype ab, bool dpbf16) {
  if (isa < CG_ISA_AVX512) return RT_SGEMM_AVX2;
  __builtin_cpu_init();
  if (dpbf16 && ab == DSC_BF16 && __builtin_cpu_supports("avx512bf16"))
    return RT_SGEMM_AVX512_DPBF16;
  return RT_SGEMM_AVX512;
}

const char *rt_sgemm_kernel_name(rt_sgemm_kernel k) { return kernels[k].name; }

/* ---- the blocked loops ---- */

typedef struct {
  const cg_gemm *g; /* canonical */
  const sg_kernel *kr;
  bool ab_bf16, c_bf16;
  const void *a, *b;
  void *c;
  float *scratch;
  int64_t per_thread;
  bool split_m;  /* chunks are MR-row panels (else NR-column panels) */
  bool batches;  /* chunks are whole batches */
  int64_t batch; /* the batch the panels belong to (when !batches) */
} rt_sgemm_job;

/* C[r, j] (f32 or bf16 at c + r * crs + j * ccs) = x + beta * C[r, j],
 * rounded once into C's dtype; beta == 0 never reads C. */
static inline void update(void *c, bool c_bf16, int64_t at, float x, float beta) {
  if (c_bf16) {
    uint16_t *p = (uint16_t *)c + at;
    *p = cg_bf16_of_f32(beta != 0 ? __builtin_fmaf(beta, cg_f32_of_bf16(*p), x) : x);
  } else {
    float *p = (float *)c + at;
    *p = beta != 0 ? __builtin_fmaf(beta, *p, x) : x;
  }
}

/* C[i0:i1, j0:j1] of one GEMM (canonical: unit column stride in C, or a
 * strided C updated through the tile buffer), single-threaded. */
static void gemm_block(const rt_sgemm_job *j, rt_view a, rt_view b, void *c, int64_t i0, int64_t i1,
                       int64_t j0, int64_t j1, float *scratch) {
  const cg_gemm *g = j->g;
  const sg_kernel *kr = j->kr;
  const int MR = kr->mr, NR = kr->nr;
  sg_pack_a_fn *pack_a = kr->pack_a[j->ab_bf16];
  sg_pack_b_fn *pack_b = kr->pack_b[j->ab_bf16];
  sg_kernel_fn *kernel = kr->kernel;
  float *ap = scratch, *bp = ap + a_floats(g, MR), *tile = bp + b_floats(g, NR);
  float *acc = tile + round_up(MR * NR, 16);
  int64_t crs = g->c.row_stride, ccs = g->c.col_stride;
  float alpha = (float)g->alpha, beta0 = (float)g->beta;
  int64_t mcb = mb_of(MR), kcb = kc_of(g), ncb = nb_of(g, NR);
  for (int64_t ib = i0; ib < i1; ib += mcb) {
    int64_t mb = min64(mcb, i1 - ib);
    if (j->c_bf16 && g->k > kcb) {
      /* bf16 C over several depth blocks: the f32 sums of one mb x nb block
       * stay in acc until the last depth block, then one rounding into C
       * (a bf16 C in between would round every block) */
      int64_t ld = acc_ld(g, NR);
      for (int64_t jb = j0; jb < j1; jb += ncb) {
        int64_t nb = min64(ncb, j1 - jb);
        for (int64_t pb = 0; pb < g->k; pb += kcb) {
          int64_t kc = min64(kcb, g->k - pb);
          pack_a(a, ib, mb, pb, kc, ap);
          pack_b(b, pb, kc, jb, nb, bp);
          for (int64_t ir = 0; ir < mb; ir += MR)
            for (int64_t jr = 0; jr < nb; jr += NR)
              kernel(kc, ap + ir * kc, bp + jr * kc, acc + ir * ld + jr, ld,
                     (int)min64(MR, mb - ir), (int)min64(NR, nb - jr), 1.0f, pb == 0 ? 0.0f : 1.0f);
        }
        for (int64_t r = 0; r < mb; r++) {
          int64_t at = (ib + r) * crs + jb * ccs;
          if (ccs == 1) {
            kr->store_bf16((uint16_t *)c + at, acc + r * ld, (int)nb, alpha, beta0);
            continue;
          }
          for (int64_t q = 0; q < nb; q++) update(c, true, at + q * ccs, alpha * acc[r * ld + q], beta0);
        }
      }
      continue;
    }
    for (int64_t pb = 0; pb < g->k; pb += kcb) {
      int64_t kc = min64(kcb, g->k - pb);
      float beta = pb == 0 ? beta0 : 1.0f;
      pack_a(a, ib, mb, pb, kc, ap);
      for (int64_t jb = j0; jb < j1; jb += ncb) {
        int64_t nb = min64(ncb, j1 - jb);
        pack_b(b, pb, kc, jb, nb, bp);
        for (int64_t ir = 0; ir < mb; ir += MR) {
          int mr = (int)min64(MR, mb - ir);
          const float *apanel = ap + ir * kc;
          for (int64_t jr = 0; jr < nb; jr += NR) {
            int nr = (int)min64(NR, nb - jr);
            int64_t at = (ib + ir) * crs + (jb + jr) * ccs;
            if (ccs == 1 && !j->c_bf16) {
              kernel(kc, apanel, bp + jr * kc, (float *)c + at, crs, mr, nr, alpha, beta);
              continue;
            }
            if (ccs == 1 && kr->kernel_bf16c) {
              kr->kernel_bf16c(kc, apanel, bp + jr * kc, (uint16_t *)c + at, crs, mr, nr, alpha,
                               beta);
              continue;
            }
            /* strided or bf16 C: the tile in a buffer, then the update
             * element-wise (the same operations as in the kernel) */
            kernel(kc, apanel, bp + jr * kc, tile, NR, mr, nr, 1.0f, 0.0f);
            for (int r = 0; r < mr; r++) {
              if (j->c_bf16 && ccs == 1) {
                kr->store_bf16((uint16_t *)c + at + r * crs, tile + r * NR, nr, alpha, beta);
                continue;
              }
              for (int q = 0; q < nr; q++)
                update(c, j->c_bf16, at + r * crs + q * ccs, alpha * tile[r * NR + q], beta);
            }
          }
        }
      }
    }
  }
}

/* ---- a few rows of C: B read once, unpacked ----
 * A decode step multiplies one row per sequence by every weight: M is a
 * few rows, and packing B (a copy of the whole weight, written and read
 * again) costs more than the product. With M <= SMALL_M, f32 operands and
 * C, and C contiguous along columns, the rows are computed straight from B,
 * so that each weight is read once per call:
 *   - row-major B: for each depth row k, the row's columns of B times A[m,
 *     k], added to per-row sums kept in an L1 buffer, panels of PANEL
 *     columns at a time;
 *   - transposed B (W^T, W row-major: the tied LM head): 8 rows of W at
 *     once, transposed 8 x 8 in registers, so that a vector holds 8
 *     columns of one depth row.
 * Either way every element of C gets the packed path's operations in the
 * packed path's order: for each depth block of kc_of(g), the products in
 * order of k fused into a sum from 0, then C = alpha * sum (+ beta * C by
 * an FMA, beta 1 after the first block). So the results are bitwise those
 * of the packed kernels (the tests compare them), whatever M. */
#define SMALL_M 8
#define PANEL 256

/* One GEMM of a batch: its operands' first elements. */
typedef struct {
  const cg_gemm *g;
  const float *a, *b;
  float *c;
} sg_small_job;

__attribute__((target("avx2,fma"))) static void small_update(float *c, const float *acc, int64_t n,
                                                             float alpha, float beta) {
  __m256 va = _mm256_set1_ps(alpha), vb = _mm256_set1_ps(beta);
  int64_t q = 0;
  for (; q + 8 <= n; q += 8) {
    __m256 x = _mm256_mul_ps(va, _mm256_loadu_ps(acc + q));
    if (beta != 0) x = _mm256_fmadd_ps(vb, _mm256_loadu_ps(c + q), x);
    _mm256_storeu_ps(c + q, x);
  }
  for (; q < n; q++) {
    float x = alpha * acc[q];
    c[q] = beta != 0
               ? _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(beta), _mm_set_ss(c[q]), _mm_set_ss(x)))
               : x;
  }
}

/* Columns [j0, j1) of C = A B, B row-major (unit column stride), in
 * panels of SMALL_M * PANEL / M columns (the sums' buffer stays SMALL_M *
 * PANEL floats, in L1): one row reads 8 KiB of each depth row of B at a
 * time. The panel's rows are prefetched into L2 SMALL_PREFETCH bytes ahead
 * of their use: each is a run of a few KiB at a stride of the whole row,
 * which the hardware's prefetchers find late. */
#define SMALL_PREFETCH 32768
__attribute__((target("avx2,fma"))) static void small_rows(const sg_small_job *sj, int64_t j0,
                                                           int64_t j1) {
  const cg_gemm *g = sj->g;
  int64_t M = g->m, kcb = kc_of(g), panel = SMALL_M * PANEL / M / 8 * 8;
  int64_t ldb = g->b.row_stride;
  float acc[SMALL_M * PANEL] __attribute__((aligned(32)));
  for (int64_t jb = j0; jb < j1; jb += panel) {
    int64_t nb = min64(panel, j1 - jb), nv = nb / 8 * 8;
    int64_t ahead = SMALL_PREFETCH / (nb * 4) + 1; /* rows */
    for (int64_t pb = 0; pb < g->k; pb += kcb) {
      int64_t kc = min64(kcb, g->k - pb);
      memset(acc, 0, sizeof(float) * (size_t)(M * panel));
      for (int64_t k = pb; k < pb + kc; k++) {
        const float *brow = sj->b + k * ldb + jb;
        if (k + ahead < g->k)
          for (int64_t q = 0; q < nb; q += 16)
            _mm_prefetch((const char *)(brow + ahead * ldb + q), _MM_HINT_T1);
        for (int64_t m = 0; m < M; m++) {
          float am = sj->a[m * g->a.row_stride + k * g->a.col_stride];
          __m256 av = _mm256_set1_ps(am);
          float *am_acc = acc + m * panel;
          int64_t q = 0;
          for (; q < nv; q += 8)
            _mm256_store_ps(am_acc + q, _mm256_fmadd_ps(av, _mm256_loadu_ps(brow + q),
                                                        _mm256_load_ps(am_acc + q)));
          for (; q < nb; q++)
            am_acc[q] = _mm_cvtss_f32(
                _mm_fmadd_ss(_mm_set_ss(am), _mm_set_ss(brow[q]), _mm_set_ss(am_acc[q])));
        }
      }
      for (int64_t m = 0; m < M; m++)
        small_update(sj->c + m * g->c.row_stride + jb, acc + m * panel, nb, (float)g->alpha,
                     pb == 0 ? (float)g->beta : 1.0f);
    }
  }
}

/* C = A W^T, B[k, n] = W[n, k] (unit row stride): columns n0 .. n0 + cols
 * (cols <= 8; the other lanes read row n0 again) in one depth block [pb,
 * pb + kc), into acc[m]. 8 rows of W at once, transposed 8 x 8 in
 * registers, so that a vector holds 8 columns of one depth row. Inlined
 * with M constant and the loops unrolled, the M sums stay in registers
 * (on the stack every FMA waited for the store of the one before). The
 * rows `ahead` rows on are prefetched into L2 as these are read: 8 rows
 * of a few KiB each are more streams than the hardware's prefetchers keep
 * up with. */
__attribute__((target("avx2,fma"), always_inline)) static inline void bt_tile(
    const sg_small_job *sj, int64_t n0, int cols, int M, int64_t pb, int64_t kc, int64_t ahead,
    __m256 *acc) {
  const cg_gemm *g = sj->g;
  int64_t ldw = g->b.col_stride, ars = g->a.row_stride, acs = g->a.col_stride, k = pb;
  const float *w[8];
#pragma GCC unroll 8
  for (int r = 0; r < 8; r++) w[r] = sj->b + (n0 + (r < cols ? r : 0)) * ldw;
  /* ahead 0: the rows after these are past the end of B */
  const float *next = sj->b + (n0 + ahead) * ldw;
#pragma GCC unroll 8
  for (int m = 0; m < M; m++) acc[m] = _mm256_setzero_ps();
  for (; k + 8 <= pb + kc; k += 8) {
    __m256 col[8];
    if (ahead && (k & 8)) /* a cache line of each row every other step */
#pragma GCC unroll 8
      for (int r = 0; r < 8; r++) _mm_prefetch((const char *)(next + r * ldw + k), _MM_HINT_T1);
#pragma GCC unroll 8
    for (int r = 0; r < 8; r++) col[r] = _mm256_loadu_ps(w[r] + k);
    transpose8x8_regs(col);
#pragma GCC unroll 8
    for (int q = 0; q < 8; q++)
#pragma GCC unroll 8
      for (int m = 0; m < M; m++)
        acc[m] = _mm256_fmadd_ps(_mm256_set1_ps(sj->a[m * ars + (k + q) * acs]), col[q], acc[m]);
  }
  for (; k < pb + kc; k++) {
    __m256 col =
        _mm256_setr_ps(w[0][k], w[1][k], w[2][k], w[3][k], w[4][k], w[5][k], w[6][k], w[7][k]);
#pragma GCC unroll 8
    for (int m = 0; m < M; m++)
      acc[m] = _mm256_fmadd_ps(_mm256_set1_ps(sj->a[m * ars + k * acs]), col, acc[m]);
  }
}

/* Columns [j0, j1) of C = A W^T, M rows (a constant where inlined): C =
 * alpha * sum (+ beta C) per depth block, as the packed path's update. The
 * prefetch runs SMALL_PREFETCH bytes ahead, in whole tiles of 8 rows. */
__attribute__((target("avx2,fma"), always_inline)) static inline void bt_columns(
    const sg_small_job *sj, int64_t j0, int64_t j1, int M) {
  const cg_gemm *g = sj->g;
  int64_t kcb = kc_of(g), tile_bytes = 8 * 4 * g->k;
  int64_t ahead = 8 * ((SMALL_PREFETCH + tile_bytes - 1) / tile_bytes);
  for (int64_t n0 = j0; n0 < j1; n0 += 8) {
    int cols = (int)min64(8, j1 - n0);
    for (int64_t pb = 0; pb < g->k; pb += kcb) {
      __m256 acc[SMALL_M];
      bt_tile(sj, n0, cols, M, pb, min64(kcb, g->k - pb), n0 + ahead + 8 <= g->n ? ahead : 0, acc);
      float t[8];
      for (int m = 0; m < M; m++) {
        _mm256_storeu_ps(t, acc[m]);
        small_update(sj->c + m * g->c.row_stride + n0, t, cols, (float)g->alpha,
                     pb == 0 ? (float)g->beta : 1.0f);
      }
    }
  }
}

/* Columns [j0, j1) of C = A W^T: one specialisation per M. */
__attribute__((target("avx2,fma"))) static void small_rows_bt(const sg_small_job *sj, int64_t j0,
                                                              int64_t j1) {
  /* M is at most SMALL_M (small_fits) */
  switch (sj->g->m) {
    case 1:
      bt_columns(sj, j0, j1, 1);
      break;
    case 2:
      bt_columns(sj, j0, j1, 2);
      break;
    case 3:
      bt_columns(sj, j0, j1, 3);
      break;
    case 4:
      bt_columns(sj, j0, j1, 4);
      break;
    case 5:
      bt_columns(sj, j0, j1, 5);
      break;
    case 6:
      bt_columns(sj, j0, j1, 6);
      break;
    case 7:
      bt_columns(sj, j0, j1, 7);
      break;
    default:
      bt_columns(sj, j0, j1, SMALL_M);
      break;
  }
}

static void small_columns(const sg_small_job *sj, int64_t j0, int64_t j1) {
  if (sj->g->b.col_stride == 1)
    small_rows(sj, j0, j1);
  else
    small_rows_bt(sj, j0, j1);
}

/* Batch bb of the operands at a, b, c (their offsets not yet applied). */
static sg_small_job small_batch(const sg_small_job *all, int64_t bb) {
  const cg_gemm *g = all->g;
  int64_t b0 = bb / g->batch[1], b1 = bb % g->batch[1];
  return (sg_small_job){
      g, all->a + g->a.offset + b0 * g->a.batch_stride[0] + b1 * g->a.batch_stride[1],
      all->b + g->b.offset + b0 * g->b.batch_stride[0] + b1 * g->b.batch_stride[1],
      all->c + g->c.offset + b0 * g->c.batch_stride[0] + b1 * g->c.batch_stride[1]};
}

/* A chunk of whole batches (the attention heads). */
static void small_batches(void *arg, int64_t begin, int64_t end, int chunk) {
  (void)chunk;
  for (int64_t bb = begin; bb < end; bb++) {
    sg_small_job sj = small_batch(arg, bb);
    small_columns(&sj, 0, sj.g->n);
  }
}

/* A chunk of one GEMM's columns, in blocks of 16. */
static void small_chunk(void *arg, int64_t begin, int64_t end, int chunk) {
  (void)chunk;
  const sg_small_job *sj = arg;
  small_columns(sj, begin * 16, min64(end * 16, sj->g->n));
}

/* The canonical GEMM g (f32, C unit column stride) takes the unpacked path. */
static bool small_fits(const cg_gemm *g, bool ab_bf16, bool c_bf16) {
  return !ab_bf16 && !c_bf16 && g->m <= SMALL_M && g->c.col_stride == 1 &&
         (g->b.col_stride == 1 || g->b.row_stride == 1);
}

/* Threads take whole batches where they are many, as the packed path does;
 * else they split the columns in blocks of 16, each thread's share at least
 * 64 KiB of B (memory-bound: a few rows do 2M flops per 4 bytes read). */
static void small_run(rt_pool *pool, const cg_gemm *g, const float *a, const float *b, float *c) {
  sg_small_job all = {g, a, b, c};
  int threads = rt_pool_threads(pool);
  int64_t nbatch = g->batch[0] * g->batch[1];
  if (nbatch > 1 && threads > 1 && (nbatch % threads == 0 || nbatch >= 4 * threads)) {
    rt_pool_parallel_for(pool, nbatch, 1, small_batches, &all);
    return;
  }
  int64_t units = (g->n + 15) / 16, per_unit = 16 * g->k * 4;
  int64_t min_units = per_unit >= 65536 ? 1 : (65536 + per_unit - 1) / per_unit;
  for (int64_t bb = 0; bb < nbatch; bb++) {
    sg_small_job sj = small_batch(&all, bb);
    rt_pool_parallel_for(pool, units, min_units, small_chunk, &sj);
  }
}

static void run_batch(const rt_sgemm_job *j, int64_t bb, int64_t i0, int64_t i1, int64_t j0,
                      int64_t j1, float *scratch) {
  const cg_gemm *g = j->g;
  int64_t b0 = bb / g->batch[1], b1 = bb % g->batch[1];
  int64_t sab = j->ab_bf16 ? 2 : 4, sc = j->c_bf16 ? 2 : 4;
  rt_view a = {(const char *)j->a +
                   sab * (g->a.offset + b0 * g->a.batch_stride[0] + b1 * g->a.batch_stride[1]),
               g->a.row_stride, g->a.col_stride};
  rt_view b = {(const char *)j->b +
                   sab * (g->b.offset + b0 * g->b.batch_stride[0] + b1 * g->b.batch_stride[1]),
               g->b.row_stride, g->b.col_stride};
  char *c =
      (char *)j->c + sc * (g->c.offset + b0 * g->c.batch_stride[0] + b1 * g->c.batch_stride[1]);
  gemm_block(j, a, b, c, i0, i1, j0, j1, scratch);
}

static void run_chunk(void *arg, int64_t begin, int64_t end, int chunk) {
  const rt_sgemm_job *j = arg;
  const cg_gemm *g = j->g;
  int64_t MR = j->kr->mr, NR = j->kr->nr;
  float *scratch = j->scratch + chunk * j->per_thread;
  if (j->batches)
    for (int64_t bb = begin; bb < end; bb++) run_batch(j, bb, 0, g->m, 0, g->n, scratch);
  else if (j->split_m)
    run_batch(j, j->batch, begin * MR, min64(end * MR, g->m), 0, g->n, scratch);
  else
    run_batch(j, j->batch, 0, g->m, begin * NR, min64(end * NR, g->n), scratch);
}

void rt_sgemm_typed(rt_pool *pool, const cg_gemm *g0, rt_sgemm_kernel kernel, dsc_dtype ab,
                    dsc_dtype cdt, const void *a, const void *b, void *c, float *scratch,
                    int64_t per_thread) {
  cg_gemm g = canonical(g0);
  if (c_transposed(g0)) {
    const void *t = a; /* C^T = B^T A^T: the operands trade places */
    a = b;
    b = t;
  }
  if (small_fits(&g, ab == DSC_BF16, cdt == DSC_BF16)) {
    small_run(pool, &g, a, b, c);
    return;
  }
  const sg_kernel *kr = &kernels[kernel];
  int64_t MR = kr->mr, NR = kr->nr;
  rt_sgemm_job j = {&g, kr,      ab == DSC_BF16, cdt == DSC_BF16, a,     b,
                    c,  scratch, per_thread,     g.m >= g.n,      false, 0};
  int threads = rt_pool_threads(pool);
  int64_t nbatch = g.batch[0] * g.batch[1];
  /* Whole batches per thread when they split evenly or are many (the
   * attention heads); else each batch split over the threads. Every choice
   * depends on the shape (and the kernel) only. */
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

void rt_sgemm(rt_pool *pool, const cg_gemm *g, const float *a, const float *b, float *c,
              float *scratch, int64_t per_thread) {
  rt_sgemm_typed(pool, g, rt_sgemm_kernel_for(cg_cpu_isa_get(), DSC_F32, false), DSC_F32, DSC_F32,
                 a, b, c, scratch, per_thread);
}

#else /* not x86-64 */

bool rt_sgemm_isa_supported(cg_cpu_isa isa) { return (void)isa, false; }
bool rt_sgemm_supported(void) { return false; }

rt_sgemm_kernel rt_sgemm_kernel_for(cg_cpu_isa isa, dsc_dtype ab, bool dpbf16) {
  return (void)isa, (void)ab, (void)dpbf16, RT_SGEMM_AVX2;
}

const char *rt_sgemm_kernel_name(rt_sgemm_kernel k) { return (void)k, "none"; }

void rt_sgemm_typed(rt_pool *pool, const cg_gemm *g, rt_sgemm_kernel kernel, dsc_dtype ab,
                    dsc_dtype cdt, const void *a, const void *b, void *c, float *scratch,
                    int64_t per_thread) {
  (void)pool, (void)g, (void)kernel, (void)ab, (void)cdt, (void)a, (void)b, (void)c, (void)scratch;
  (void)per_thread;
}

void rt_sgemm(rt_pool *pool, const cg_gemm *g, const float *a, const float *b, float *c,
              float *scratch, int64_t per_thread) {
  (void)pool, (void)g, (void)a, (void)b, (void)c, (void)scratch, (void)per_thread;
}

#endif
