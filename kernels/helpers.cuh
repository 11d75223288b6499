/* kernels/helpers.cuh: the CUDA executor's own kernels (runtime/exec_cuda.c),
 * self-contained (no includes): embedding gradients, set_rows and the bf16/f16 <-> f32
 * conversions of inputs and outputs. bf16/f16 are unsigned shorts converted
 * as codegen/cuda.c's prelude does (round to nearest even); embedding
 * gradients accumulate with atomicAdd in f32 (f64 for an f64 destination),
 * so their sums are not bitwise deterministic. */
struct dsc_bf16 { unsigned short h; };
struct dsc_f16 { unsigned short h; };
static __device__ __forceinline__ double dsc_ld(float x) { return x; }
static __device__ __forceinline__ double dsc_ld(double x) { return x; }
static __device__ __forceinline__ double dsc_ld(dsc_bf16 x) {
  return __uint_as_float((unsigned)x.h << 16);
}
static __device__ __forceinline__ double dsc_ld(dsc_f16 x) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x.h));
  return f;
}
static __device__ __forceinline__ dsc_bf16 dsc_to_bf16(float f) {
  unsigned u = __float_as_uint(f);
  dsc_bf16 r;
  if ((u & 0x7fffffffu) > 0x7f800000u) { r.h = (unsigned short)((u >> 16) | 0x40u); return r; }
  u += 0x7fffu + ((u >> 16) & 1u);
  r.h = (unsigned short)(u >> 16);
  return r;
}
static __device__ __forceinline__ dsc_f16 dsc_to_f16(float f) {
  dsc_f16 r;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r.h) : "f"(f));
  return r;
}
#define DSC_GRID_LOOP(i, n) \
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < (n); \
       i += (long long)gridDim.x * blockDim.x)
template <typename S, typename A, typename I>
static __device__ void dsc_embgrad(const I *ids, const S *src, A *acc, long long n_ids,
                                   long long rows, long long cols, int *status,
                                   unsigned long long *bad_pos) {
  DSC_GRID_LOOP(t, n_ids * cols) {
    long long i = t / cols, c = t - i * cols;
    long long id = (long long)ids[i];
    if (id < 0 || id >= rows) {
      if (c == 0) { atomicMin(bad_pos, (unsigned long long)i); *status = 1; }
      continue;
    }
    atomicAdd(&acc[id * cols + c], (A)dsc_ld(src[t]));
  }
}
#define DSC_EMB(sn, S, an, A, in, I) \
  extern "C" __global__ void dsc_embgrad_##sn##_##an##_##in(const I *ids, const S *src, \
      A *acc, long long n_ids, long long rows, long long cols, int *status, \
      unsigned long long *bad_pos) { \
    dsc_embgrad<S, A, I>(ids, src, acc, n_ids, rows, cols, status, bad_pos); \
  }
#define DSC_EMB_S(an, A, in, I) DSC_EMB(f32, float, an, A, in, I) \
  DSC_EMB(f64, double, an, A, in, I) DSC_EMB(bf16, dsc_bf16, an, A, in, I) \
  DSC_EMB(f16, dsc_f16, an, A, in, I)
DSC_EMB_S(f32, float, i32, int)
DSC_EMB_S(f32, float, i64, long long)
DSC_EMB_S(f64, double, i32, int)
DSC_EMB_S(f64, double, i64, long long)
    /* set_rows: one block per written row; a row whose id is out of range, or
     * written again by a later id, is skipped (the last write wins, as in the
     * reference's order) */
    template <typename I>
    static __device__ void dsc_set_rows(const I *ids, const unsigned char *src, unsigned char *dst,
                                        long long n_ids, long long rows, long long row_bytes) {
  __shared__ int skip;
  for (long long i = blockIdx.x; i < n_ids; i += gridDim.x) {
    long long id = (long long)ids[i];
    if (threadIdx.x == 0) {
      int s = id < 0 || id >= rows;
      for (long long j = i + 1; j < n_ids && !s; j++) s = (long long)ids[j] == id;
      skip = s;
    }
    __syncthreads();
    if (!skip)
      for (long long b = threadIdx.x; b < row_bytes; b += blockDim.x)
        dst[id * row_bytes + b] = src[i * row_bytes + b];
    __syncthreads();
  }
}
extern "C" __global__ void dsc_set_rows_i32(const int *ids, const unsigned char *src,
                                            unsigned char *dst, long long n_ids, long long rows,
                                            long long row_bytes) {
  dsc_set_rows<int>(ids, src, dst, n_ids, rows, row_bytes);
}
extern "C" __global__ void dsc_set_rows_i64(const long long *ids, const unsigned char *src,
                                            unsigned char *dst, long long n_ids, long long rows,
                                            long long row_bytes) {
  dsc_set_rows<long long>(ids, src, dst, n_ids, rows, row_bytes);
}
extern "C" __global__ void dsc_bf16_to_f32(const dsc_bf16 *in, float *out, long long n) {
  DSC_GRID_LOOP(i, n) out[i] = (float)dsc_ld(in[i]);
}
extern "C" __global__ void dsc_f16_to_f32(const dsc_f16 *in, float *out, long long n) {
  DSC_GRID_LOOP(i, n) out[i] = (float)dsc_ld(in[i]);
}
extern "C" __global__ void dsc_f32_to_bf16(const float *in, dsc_bf16 *out, long long n) {
  DSC_GRID_LOOP(i, n) out[i] = dsc_to_bf16(in[i]);
}
extern "C" __global__ void dsc_f32_to_f16(const float *in, dsc_f16 *out, long long n) {
  DSC_GRID_LOOP(i, n) out[i] = dsc_to_f16(in[i]);
}
