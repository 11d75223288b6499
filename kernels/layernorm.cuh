/* kernels/layernorm.cuh: layernorm over the last axis of x [N, C] (biased
 * variance, dsc's `layernorm` op), forward and backward.
 *
 * Forward: one block per row; the row is cached in shared memory as f32 so
 * the mean and the variance are two exact passes (sum of (x - mean)^2, not
 * E[x^2] - mean^2, which cancels badly) with a single read of global
 * memory. Saves mean and rstd = 1/sqrt(var + eps) per row for the backward.
 *
 * Backward, with xhat = (x - mean) * rstd and g = dy * w:
 *   dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
 *   dw = sum over rows of dy * xhat,  db = sum over rows of dy
 * dw/db are deterministic: each block owns a contiguous chunk of rows and
 * accumulates per-column partial sums in shared memory (a thread always owns
 * the same columns, so no atomics), writes them to dw_partial/db_partial
 * [n_blocks, C], and layernorm_bwd_dwdb sums the partials over blocks in
 * block order. Gradients are written, not accumulated. */
#ifndef DSC_KERNELS_LAYERNORM_CUH
#define DSC_KERNELS_LAYERNORM_CUH
#include "common.cuh"

/* grid = N, block = a multiple of 32, dynamic shared = C floats. */
template <typename T>
__device__ void layernorm_fwd(const T *x, const T *w, const T *b, T *y, float *mean_out,
                              float *rstd_out, int N, int C, float eps) {
  extern __shared__ float xs[];
  __shared__ float scratch[32];
  const int row = blockIdx.x;
  if (row >= N) return;
  const T *xr = x + (long long)row * C;
  T *yr = y + (long long)row * C;

  float s = 0.0f;
  for (int i = threadIdx.x; i < C; i += blockDim.x) {
    const float v = to_f32(xr[i]);
    xs[i] = v; /* each thread rereads only its own entries: no barrier needed */
    s += v;
  }
  const float mean = block_sum(s, scratch) / (float)C;
  float q = 0.0f;
  for (int i = threadIdx.x; i < C; i += blockDim.x) {
    const float d = xs[i] - mean;
    q += d * d;
  }
  const float var = block_sum(q, scratch) / (float)C;
  const float rstd = 1.0f / sqrtf(var + eps);
  for (int i = threadIdx.x; i < C; i += blockDim.x)
    yr[i] = from_f32<T>((xs[i] - mean) * rstd * to_f32(w[i]) + to_f32(b[i]));
  if (threadIdx.x == 0) {
    if (mean_out) mean_out[row] = mean;
    if (rstd_out) rstd_out[row] = rstd;
  }
}

/* grid = n_blocks (rows split into contiguous chunks of rows_per_block),
 * block = a multiple of 32, dynamic shared = 2 * C floats. */
template <typename T>
__device__ void layernorm_bwd(const T *dy, const T *x, const T *w, const float *mean,
                              const float *rstd, T *dx, float *dw_partial, float *db_partial,
                              int N, int C, int rows_per_block) {
  extern __shared__ float acc[]; /* dw partial [C], then db partial [C] */
  __shared__ float scratch[32];
  float *dw_acc = acc, *db_acc = acc + C;
  for (int i = threadIdx.x; i < C; i += blockDim.x) dw_acc[i] = db_acc[i] = 0.0f;

  const int row_begin = blockIdx.x * rows_per_block;
  const int row_end = min(N, row_begin + rows_per_block);
  for (int row = row_begin; row < row_end; ++row) {
    const long long base = (long long)row * C;
    const float mu = mean[row], rs = rstd[row];
    float sum_g = 0.0f, sum_gx = 0.0f;
    for (int i = threadIdx.x; i < C; i += blockDim.x) {
      const float d = to_f32(dy[base + i]);
      const float xhat = (to_f32(x[base + i]) - mu) * rs;
      const float g = d * to_f32(w[i]);
      sum_g += g;
      sum_gx += g * xhat;
      dw_acc[i] += d * xhat;
      db_acc[i] += d;
    }
    const float mean_g = block_sum(sum_g, scratch) / (float)C;
    const float mean_gx = block_sum(sum_gx, scratch) / (float)C;
    for (int i = threadIdx.x; i < C; i += blockDim.x) {
      const float xhat = (to_f32(x[base + i]) - mu) * rs;
      const float g = to_f32(dy[base + i]) * to_f32(w[i]);
      dx[base + i] = from_f32<T>(rs * (g - mean_g - xhat * mean_gx));
    }
  }
  for (int i = threadIdx.x; i < C; i += blockDim.x) {
    dw_partial[(long long)blockIdx.x * C + i] = dw_acc[i];
    db_partial[(long long)blockIdx.x * C + i] = db_acc[i];
  }
}

/* grid = ceil(C / block): one thread per column sums the n_parts partials
 * in block order (the deterministic second stage). */
template <typename T>
__device__ void layernorm_bwd_dwdb(const float *dw_partial, const float *db_partial, T *dw, T *db,
                                   int n_parts, int C) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= C) return;
  float sw = 0.0f, sb = 0.0f;
  for (int p = 0; p < n_parts; ++p) {
    sw += dw_partial[(long long)p * C + i];
    sb += db_partial[(long long)p * C + i];
  }
  dw[i] = from_f32<T>(sw);
  db[i] = from_f32<T>(sb);
}

#define DSC_LAYERNORM_INSTANTIATE(T, SUFFIX)                                                       \
  extern "C" __global__ void __launch_bounds__(1024) dsc_layernorm_fwd_##SUFFIX(                   \
      const T *x, const T *w, const T *b, T *y, float *mean, float *rstd, int N, int C,            \
      float eps) {                                                                                 \
    layernorm_fwd<T>(x, w, b, y, mean, rstd, N, C, eps);                                           \
  }                                                                                                \
  extern "C" __global__ void __launch_bounds__(1024) dsc_layernorm_bwd_##SUFFIX(                   \
      const T *dy, const T *x, const T *w, const float *mean, const float *rstd, T *dx,            \
      float *dw_partial, float *db_partial, int N, int C, int rows_per_block) {                    \
    layernorm_bwd<T>(dy, x, w, mean, rstd, dx, dw_partial, db_partial, N, C, rows_per_block);      \
  }                                                                                                \
  extern "C" __global__ void __launch_bounds__(1024) dsc_layernorm_bwd_dwdb_##SUFFIX(              \
      const float *dw_partial, const float *db_partial, T *dw, T *db, int n_parts, int C) {        \
    layernorm_bwd_dwdb<T>(dw_partial, db_partial, dw, db, n_parts, C);                             \
  }

#endif
