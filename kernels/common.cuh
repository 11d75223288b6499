/* kernels/common.cuh: what every hand-written dsc CUDA template shares.
 *
 * The templates are compiled by NVRTC with no include path (the GPU compile
 * path must not depend on where the toolkit's headers live), so this file
 * defines the two 16-bit float types itself instead of using <cuda_bf16.h>
 * and <cuda_fp16.h>: a dsc_bf16 / dsc_f16 is the raw 16-bit pattern, with the
 * same memory layout as __nv_bfloat16 / __half. Every kernel loads its
 * element type, computes in f32 and rounds to nearest-even on store.
 *
 * Instantiation: each template file ends with a DSC_<NAME>_INSTANTIATE(T,
 * SUFFIX, ...) macro that defines the extern "C" __global__ entry points
 * (named dsc_<entry>_<suffix>, see codegen/cuda_templates.c) calling the
 * templated device functions; the registry appends one such line per dtype. */
#ifndef DSC_KERNELS_COMMON_CUH
#define DSC_KERNELS_COMMON_CUH

struct __align__(2) dsc_bf16 {
  unsigned short bits;
};
struct __align__(2) dsc_f16 {
  unsigned short bits;
};

/* ---- element <-> f32 ---- */
__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(dsc_bf16 x) {
  return __uint_as_float(((unsigned)x.bits) << 16); /* bf16 is the top half of an f32 */
}
__device__ __forceinline__ float to_f32(dsc_f16 x) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x.bits));
  return f;
}

template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ dsc_bf16 from_f32<dsc_bf16>(float x) {
  /* Round to nearest even by hand (portable to every arch; matches the
   * interpreter's dsc_f32_to_bf16): add 0x7fff plus the lowest kept bit. */
  unsigned u = __float_as_uint(x);
  dsc_bf16 r;
  if (x != x) {
    r.bits = 0x7fc0; /* a quiet NaN */
  } else {
    r.bits = (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
  return r;
}
template <> __device__ __forceinline__ dsc_f16 from_f32<dsc_f16>(float x) {
  dsc_f16 r;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r.bits) : "f"(x));
  return r;
}

/* Reads and writes of 16 bytes at once (when a row is 16-byte aligned):
 * kVec elements of T per access. */
template <typename T> struct dsc_vec {
  static constexpr int n = 16 / sizeof(T);
  union {
    uint4 raw;
    T e[16 / sizeof(T)];
  };
};

#define DSC_NEG_INF __int_as_float(0xff800000)

/* ---- warp and block reductions (blockDim.x a multiple of 32, <= 1024) ---- */
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/* Sum over the whole block, returned to every thread. `scratch` holds 32
 * floats of shared memory; the leading barrier lets a caller reuse it for
 * back-to-back reductions. The order of additions is fixed by the launch
 * shape, so results are deterministic run to run. */
__device__ __forceinline__ float block_sum(float v, float *scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < n_warps ? scratch[lane] : 0.0f;
  return warp_sum(v);
}
__device__ __forceinline__ float block_max(float v, float *scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < n_warps ? scratch[lane] : DSC_NEG_INF;
  return warp_max(v);
}

#endif
