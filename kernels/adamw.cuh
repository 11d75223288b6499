/* kernels/adamw.cuh: AdamW (decoupled weight decay, PyTorch's formula) over
 * a list of tensors in one launch ("multi-tensor"): blockIdx.y picks the
 * tensor, blockIdx.x and the threads stride over its elements.
 *
 * Per element, with g = grad * grad_scale:
 *   w -= lr * weight_decay * w
 *   m  = beta1 * m + (1 - beta1) * g
 *   v  = beta2 * v + (1 - beta2) * g^2
 *   w -= lr * (m / bc1) / (sqrt(v / bc2) + eps)     bc_i = 1 - beta_i^step
 * Weights, m and v are f32 (master copies); the gradient has the storage
 * type T (f32/bf16/f16), and when w_copy != NULL the updated weight is also
 * written there in T (the low-precision copy the forward reads), in the same
 * pass. grad_scale is a device scalar (NULL: 1) so that loss-scale
 * unscaling and global-norm clipping computed on the device need no host
 * round trip. bc1, bc2 and lr change per step and are host arguments. */
#ifndef DSC_KERNELS_ADAMW_CUH
#define DSC_KERNELS_ADAMW_CUH
#include "common.cuh"

/* One tensor of the list. The host mirror is cg_adamw_tensor (codegen.h):
 * the same 56-byte layout, pointers as 64-bit device addresses. */
template <typename T> struct dsc_adamw_tensor {
  float *w;
  const T *g;
  float *m;
  float *v;
  T *w_copy;
  long long n;
  float weight_decay; /* 0 for tensors without decay (biases, norms) */
  float pad_;
};

/* grid = (blocks per tensor, n_tensors), block = 256. */
template <typename T>
__device__ void adamw_step(const dsc_adamw_tensor<T> *tensors, int n_tensors, float lr,
                           float beta1, float beta2, float eps, float bc1, float bc2,
                           const float *grad_scale) {
  if ((int)blockIdx.y >= n_tensors) return;
  const dsc_adamw_tensor<T> t = tensors[blockIdx.y];
  const float gs = grad_scale ? grad_scale[0] : 1.0f;
  const long long stride = (long long)gridDim.x * blockDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < t.n; i += stride) {
    const float g = to_f32(t.g[i]) * gs;
    float w = t.w[i];
    w -= lr * t.weight_decay * w;
    const float m = beta1 * t.m[i] + (1.0f - beta1) * g;
    const float v = beta2 * t.v[i] + (1.0f - beta2) * g * g;
    w -= lr * (m / bc1) / (sqrtf(v / bc2) + eps);
    t.m[i] = m;
    t.v[i] = v;
    t.w[i] = w;
    if (t.w_copy) t.w_copy[i] = from_f32<T>(w);
  }
}

#define DSC_ADAMW_INSTANTIATE(T, SUFFIX)                                                           \
  extern "C" __global__ void __launch_bounds__(256) dsc_adamw_##SUFFIX(                            \
      const dsc_adamw_tensor<T> *tensors, int n_tensors, float lr, float beta1, float beta2,       \
      float eps, float bc1, float bc2, const float *grad_scale) {                                  \
    adamw_step<T>(tensors, n_tensors, lr, beta1, beta2, eps, bc1, bc2, grad_scale);                \
  }

#endif
