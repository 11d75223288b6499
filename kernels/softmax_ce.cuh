/* kernels/softmax_ce.cuh: fused softmax + cross-entropy for long rows
 * (GPT-2's V = 50304): one thread block per row, 16-byte vector loads.
 *
 * Forward, per row n of logits [N, V]:
 *   lse[n]    = log(sum_i exp(x_i))          (max-shifted, online)
 *   losses[n] = lse[n] - x[target[n]]
 *   probs     = exp(x - lse)                 (only when probs != NULL)
 * then dsc_ce_loss_mean_* averages the N losses in one block (a fixed order
 * of additions: deterministic, no atomics). Backward:
 *   dlogits = (exp(x - lse) - onehot(target)) * dloss / N
 * reusing the saved lse, so the row is read once and written once. A target
 * outside [0, V) sets *status = 1 (a runtime error for the host) and
 * contributes a loss of 0 and no one-hot term. */
#ifndef DSC_KERNELS_SOFTMAX_CE_CUH
#define DSC_KERNELS_SOFTMAX_CE_CUH
#include "common.cuh"

/* Calls f(i, value) for every element of the row owned by this thread:
 * 16-byte loads when the whole tensor allows them (V a multiple of the
 * vector width and an aligned base), element loads otherwise. */
template <typename T, typename F>
__device__ __forceinline__ void row_foreach(const T *x, int V, bool vec, F f) {
  constexpr int n = dsc_vec<T>::n;
  if (vec) {
    const uint4 *xv = reinterpret_cast<const uint4 *>(x);
    for (int i = threadIdx.x; i < V / n; i += blockDim.x) {
      dsc_vec<T> c;
      c.raw = xv[i];
#pragma unroll
      for (int j = 0; j < n; ++j) f(i * n + j, to_f32(c.e[j]));
    }
  } else {
    for (int i = threadIdx.x; i < V; i += blockDim.x) f(i, to_f32(x[i]));
  }
}

template <typename T> __device__ __forceinline__ bool row_vectorisable(const void *p, int V) {
  return V % dsc_vec<T>::n == 0 && (reinterpret_cast<unsigned long long>(p) & 15) == 0;
}

/* grid = N, block = cg_cuda_template_launch's choice (a multiple of 32). */
template <typename T, typename I>
__device__ void softmax_ce_fwd(const T *logits, const I *targets, float *losses, float *lse_out,
                               T *probs, int *status, int N, int V) {
  __shared__ float scratch[32];
  const int row = blockIdx.x;
  if (row >= N) return;
  const T *x = logits + (long long)row * V;
  const bool vec = row_vectorisable<T>(logits, V) && (probs == 0 || row_vectorisable<T>(probs, V));

  /* Online max and sum of exp per thread: one read of the row. */
  float m = DSC_NEG_INF, s = 0.0f;
  row_foreach(x, V, vec, [&](int, float v) {
    if (v > m) {
      s = s * expf(m - v) + 1.0f; /* m = -inf gives exp(-inf) = 0 */
      m = v;
    } else if (v != DSC_NEG_INF) {
      s += expf(v - m);
    }
  });
  /* Merge the threads: rescale every partial sum to the row's max. */
  const float row_max = block_max(m, scratch);
  s = m == DSC_NEG_INF ? 0.0f : s * expf(m - row_max);
  const float lse = row_max + logf(block_sum(s, scratch));

  if (threadIdx.x == 0) {
    const long long t = (long long)targets[row];
    float loss = 0.0f;
    if (t < 0 || t >= V) {
      *status = 1; /* every writer writes the same value: a benign race */
    } else {
      loss = lse - to_f32(x[t]);
    }
    losses[row] = loss;
    if (lse_out) lse_out[row] = lse;
  }
  if (probs) {
    T *p = probs + (long long)row * V;
    if (vec) {
      constexpr int n = dsc_vec<T>::n;
      uint4 *pv = reinterpret_cast<uint4 *>(p);
      const uint4 *xv = reinterpret_cast<const uint4 *>(x);
      for (int i = threadIdx.x; i < V / n; i += blockDim.x) {
        dsc_vec<T> c;
        c.raw = xv[i];
#pragma unroll
        for (int j = 0; j < n; ++j) c.e[j] = from_f32<T>(expf(to_f32(c.e[j]) - lse));
        pv[i] = c.raw;
      }
    } else {
      for (int i = threadIdx.x; i < V; i += blockDim.x) p[i] = from_f32<T>(expf(to_f32(x[i]) - lse));
    }
  }
}

/* grid = 1: the mean of N per-row losses, summed in a fixed order. */
template <typename T> __device__ void ce_loss_mean(const float *losses, T *out, int N) {
  __shared__ float scratch[32];
  float s = 0.0f;
  for (int i = threadIdx.x; i < N; i += blockDim.x) s += losses[i];
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) out[0] = from_f32<T>(s / (float)N);
}

/* grid = N. dloss: the scalar gradient of the mean loss (logits' dtype).
 * dlogits may alias logits: each element is read before it is written by
 * the same thread. */
template <typename T, typename I>
__device__ void softmax_ce_bwd(const T *logits, const I *targets, const float *lse, const T *dloss,
                               T *dlogits, int N, int V) {
  const int row = blockIdx.x;
  if (row >= N) return;
  const T *x = logits + (long long)row * V;
  T *dx = dlogits + (long long)row * V;
  const float row_lse = lse[row];
  const float scale = to_f32(dloss[0]) / (float)N;
  const long long t = (long long)targets[row]; /* out of range: no one-hot term */
  if (row_vectorisable<T>(logits, V) && row_vectorisable<T>(dlogits, V)) {
    constexpr int n = dsc_vec<T>::n;
    const uint4 *xv = reinterpret_cast<const uint4 *>(x);
    uint4 *dv = reinterpret_cast<uint4 *>(dx);
    for (int i = threadIdx.x; i < V / n; i += blockDim.x) {
      dsc_vec<T> c;
      c.raw = xv[i];
#pragma unroll
      for (int j = 0; j < n; ++j) {
        const float p = expf(to_f32(c.e[j]) - row_lse);
        c.e[j] = from_f32<T>((p - (i * n + j == t ? 1.0f : 0.0f)) * scale);
      }
      dv[i] = c.raw;
    }
  } else {
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
      const float p = expf(to_f32(x[i]) - row_lse);
      dx[i] = from_f32<T>((p - (i == t ? 1.0f : 0.0f)) * scale);
    }
  }
}

/* Entry points for element type T (f32/bf16/f16 storage) and target type I. */
#define DSC_SOFTMAX_CE_INSTANTIATE(T, I, SUFFIX)                                                   \
  extern "C" __global__ void __launch_bounds__(1024) dsc_softmax_ce_fwd_##SUFFIX(                  \
      const T *logits, const I *targets, float *losses, float *lse, T *probs, int *status, int N,  \
      int V) {                                                                                     \
    softmax_ce_fwd<T, I>(logits, targets, losses, lse, probs, status, N, V);                       \
  }                                                                                                \
  extern "C" __global__ void __launch_bounds__(1024)                                               \
      dsc_ce_loss_mean_##SUFFIX(const float *losses, T *out, int N) {                              \
    ce_loss_mean<T>(losses, out, N);                                                               \
  }                                                                                                \
  extern "C" __global__ void __launch_bounds__(1024) dsc_softmax_ce_bwd_##SUFFIX(                  \
      const T *logits, const I *targets, const float *lse, const T *dloss, T *dlogits, int N,      \
      int V) {                                                                                     \
    softmax_ce_bwd<T, I>(logits, targets, lse, dloss, dlogits, N, V);                              \
  }

#endif
