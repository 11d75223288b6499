/* kernels/attention.cuh: flash-attention-style attention for dsc's
 * `attention(q, k, v) {heads, causal}` op: q, k, v, o are [B, T, C] with
 * C = H * HD, head h using channels [h*HD, (h+1)*HD); scores are
 * q.k / sqrt(HD); causal masks keys s > query t. lse and D are [B, H, T] f32.
 *
 * Work split (all kernels: 4 warps of 32 lanes, tiles in shared memory,
 * every shared array under 48 KiB for HD <= 128):
 * - forward: a block owns 16 queries of one (b, h), a warp 4 of them; the
 *   block walks 32-key tiles of K and V. Lane j scores key j of the tile
 *   against the warp's query (a full dot product from shared memory), the
 *   warp's max/sum give the online-softmax update, and for the output each
 *   lane owns HD/32 output dims and receives p_j by shuffle. The row's
 *   logsumexp is saved for the backward; the T x T matrix never exists.
 * - backward (FlashAttention-2's, split in two so there are no float
 *   atomics and results are deterministic):
 *     attention_bwd_pre:  D[t] = sum_d dO[t,d] * O[t,d]           (warp per row)
 *     attention_bwd_dq:   queries own the block (8 per block), key tiles
 *                         stream: P = exp(S - lse), dS = P * (dO.V - D),
 *                         dQ = scale * dS K
 *     attention_bwd_dkdv: keys own the block (8 per block), query tiles
 *                         stream: dV = P^T dO, dK = scale * dS^T Q
 *   Both recompute P from the saved logsumexp instead of storing it. */
#ifndef DSC_KERNELS_ATTENTION_CUH
#define DSC_KERNELS_ATTENTION_CUH
#include "common.cuh"

#define DSC_ATT_WARPS 4

/* Row (b, t) of head h in a [B, T, H*HD] tensor. */
__device__ __forceinline__ long long att_row(int b, int t, int T, int C, int h, int HD) {
  return ((long long)b * T + t) * C + (long long)h * HD;
}

/* Loads rows [r0, r0 + ROWS) of head h into a shared f32 tile (row pitch
 * PITCH), zero past the sequence end. */
template <typename T, int ROWS, int HD, int PITCH>
__device__ __forceinline__ void att_load_tile(float (*tile)[PITCH], const T *src, int b, int r0,
                                              int T_, int C, int h, float scale) {
  for (int e = threadIdx.x; e < ROWS * HD; e += blockDim.x) {
    const int r = e / HD, d = e % HD, t = r0 + r;
    tile[r][d] = t < T_ ? to_f32(src[att_row(b, t, T_, C, h, HD) + d]) * scale : 0.0f;
  }
}

/* grid = (ceil(T/16), B*H), block = 128. */
template <typename T, int HD>
__device__ void attention_fwd(const T *q, const T *k, const T *v, T *o, float *lse, int B, int T_,
                              int H, int causal) {
  constexpr int BQ = 16, BK = 32, RPW = BQ / DSC_ATT_WARPS, DPL = (HD + 31) / 32;
  __shared__ float qs[BQ][HD];
  __shared__ float ks[BK][HD + 1]; /* +1: lane j reads row j; the pad spreads rows over banks */
  __shared__ float vs[BK][HD];
  const int C = H * HD, bh = blockIdx.y, b = bh / H, h = bh % H, q0 = blockIdx.x * BQ;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (b >= B) return;
  /* Scaling q once instead of every score. */
  att_load_tile<T, BQ, HD, HD>(qs, q, b, q0, T_, C, h, 1.0f / sqrtf((float)HD));

  float m[RPW], l[RPW], acc[RPW][DPL];
#pragma unroll
  for (int rr = 0; rr < RPW; ++rr) {
    m[rr] = DSC_NEG_INF;
    l[rr] = 0.0f;
#pragma unroll
    for (int i = 0; i < DPL; ++i) acc[rr][i] = 0.0f;
  }
  /* Causal: no query of this block sees a key past its last query. */
  const int k_end = causal ? min(T_, q0 + BQ) : T_;
  for (int k0 = 0; k0 < k_end; k0 += BK) {
    __syncthreads(); /* the previous tile is consumed (and qs is loaded) */
    att_load_tile<T, BK, HD, HD + 1>(ks, k, b, k0, T_, C, h, 1.0f);
    att_load_tile<T, BK, HD, HD>(vs, v, b, k0, T_, C, h, 1.0f);
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < RPW; ++rr) {
      const int r = warp * RPW + rr, t = q0 + r;
      if (t >= T_) continue; /* uniform over the warp */
      const int key = k0 + lane;
      const bool valid = key < T_ && (!causal || key <= t);
      float s = DSC_NEG_INF;
      if (valid) {
        s = 0.0f;
#pragma unroll 16
        for (int d = 0; d < HD; ++d) s += qs[r][d] * ks[lane][d];
      }
      const float m_new = fmaxf(m[rr], warp_max(s));
      if (m_new == DSC_NEG_INF) continue; /* no visible key yet (uniform over the warp) */
      const float p = valid ? expf(s - m_new) : 0.0f;
      const float alpha = expf(m[rr] - m_new); /* 0 on the first visible tile */
      l[rr] = l[rr] * alpha + warp_sum(p);
      m[rr] = m_new;
#pragma unroll
      for (int i = 0; i < DPL; ++i) acc[rr][i] *= alpha;
      for (int j = 0; j < BK; ++j) {
        const float pj = __shfl_sync(0xffffffffu, p, j);
#pragma unroll
        for (int i = 0; i < DPL; ++i) {
          const int d = lane + 32 * i;
          if (d < HD) acc[rr][i] += pj * vs[j][d];
        }
      }
    }
  }
#pragma unroll
  for (int rr = 0; rr < RPW; ++rr) {
    const int t = q0 + warp * RPW + rr;
    if (t >= T_) continue;
    const float inv_l = 1.0f / l[rr]; /* l >= 1: every query sees at least itself / key 0 */
#pragma unroll
    for (int i = 0; i < DPL; ++i) {
      const int d = lane + 32 * i;
      if (d < HD) o[att_row(b, t, T_, C, h, HD) + d] = from_f32<T>(acc[rr][i] * inv_l);
    }
    if (lane == 0) lse[(long long)bh * T_ + t] = m[rr] + logf(l[rr]);
  }
}

/* grid = ceil(B*T*H / 4), block = 128: one warp per (b, t, h) row. */
template <typename T, int HD>
__device__ void attention_bwd_pre(const T *o, const T *dout, float *D, int B, int T_, int H) {
  const long long rid = (long long)blockIdx.x * DSC_ATT_WARPS + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (rid >= (long long)B * T_ * H) return;
  const int h = (int)(rid % H), t = (int)((rid / H) % T_), b = (int)(rid / ((long long)H * T_));
  const long long base = att_row(b, t, T_, H * HD, h, HD);
  float s = 0.0f;
  for (int d = lane; d < HD; d += 32) s += to_f32(dout[base + d]) * to_f32(o[base + d]);
  s = warp_sum(s);
  if (lane == 0) D[((long long)b * H + h) * T_ + t] = s;
}

/* grid = (ceil(T/8), B*H), block = 128. */
template <typename T, int HD>
__device__ void attention_bwd_dq(const T *q, const T *k, const T *v, const T *dout,
                                 const float *lse, const float *D, T *dq, int B, int T_, int H,
                                 int causal) {
  constexpr int BQ = 8, BK = 32, RPW = BQ / DSC_ATT_WARPS, DPL = (HD + 31) / 32;
  __shared__ float qs[BQ][HD], dos[BQ][HD];
  __shared__ float ks[BK][HD + 1], vs[BK][HD + 1];
  const int C = H * HD, bh = blockIdx.y, b = bh / H, h = bh % H, q0 = blockIdx.x * BQ;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const float scale = 1.0f / sqrtf((float)HD);
  if (b >= B) return;
  att_load_tile<T, BQ, HD, HD>(qs, q, b, q0, T_, C, h, 1.0f);
  att_load_tile<T, BQ, HD, HD>(dos, dout, b, q0, T_, C, h, 1.0f);

  float row_lse[RPW], row_D[RPW], acc[RPW][DPL];
#pragma unroll
  for (int rr = 0; rr < RPW; ++rr) {
    const int t = q0 + warp * RPW + rr;
    row_lse[rr] = t < T_ ? lse[(long long)bh * T_ + t] : 0.0f;
    row_D[rr] = t < T_ ? D[(long long)bh * T_ + t] : 0.0f;
#pragma unroll
    for (int i = 0; i < DPL; ++i) acc[rr][i] = 0.0f;
  }
  const int k_end = causal ? min(T_, q0 + BQ) : T_;
  for (int k0 = 0; k0 < k_end; k0 += BK) {
    __syncthreads();
    att_load_tile<T, BK, HD, HD + 1>(ks, k, b, k0, T_, C, h, 1.0f);
    att_load_tile<T, BK, HD, HD + 1>(vs, v, b, k0, T_, C, h, 1.0f);
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < RPW; ++rr) {
      const int r = warp * RPW + rr, t = q0 + r, key = k0 + lane;
      if (t >= T_) continue;
      const bool valid = key < T_ && (!causal || key <= t);
      float ds = 0.0f;
      if (valid) {
        float s = 0.0f, dp = 0.0f;
#pragma unroll 16
        for (int d = 0; d < HD; ++d) {
          s += qs[r][d] * ks[lane][d];
          dp += dos[r][d] * vs[lane][d];
        }
        const float p = expf(s * scale - row_lse[rr]);
        ds = p * (dp - row_D[rr]);
      }
      for (int j = 0; j < BK; ++j) {
        const float dsj = __shfl_sync(0xffffffffu, ds, j);
#pragma unroll
        for (int i = 0; i < DPL; ++i) {
          const int d = lane + 32 * i;
          if (d < HD) acc[rr][i] += dsj * ks[j][d];
        }
      }
    }
  }
#pragma unroll
  for (int rr = 0; rr < RPW; ++rr) {
    const int t = q0 + warp * RPW + rr;
    if (t >= T_) continue;
#pragma unroll
    for (int i = 0; i < DPL; ++i) {
      const int d = lane + 32 * i;
      if (d < HD) dq[att_row(b, t, T_, C, h, HD) + d] = from_f32<T>(acc[rr][i] * scale);
    }
  }
}

/* grid = (ceil(T/8), B*H), block = 128. */
template <typename T, int HD>
__device__ void attention_bwd_dkdv(const T *q, const T *k, const T *v, const T *dout,
                                   const float *lse, const float *D, T *dk, T *dv, int B, int T_,
                                   int H, int causal) {
  constexpr int BKEY = 8, BQ = 32, KPW = BKEY / DSC_ATT_WARPS, DPL = (HD + 31) / 32;
  __shared__ float ks[BKEY][HD], vs[BKEY][HD];
  __shared__ float qs[BQ][HD + 1], dos[BQ][HD + 1];
  __shared__ float lses[BQ], Ds[BQ];
  const int C = H * HD, bh = blockIdx.y, b = bh / H, h = bh % H, k0 = blockIdx.x * BKEY;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const float scale = 1.0f / sqrtf((float)HD);
  if (b >= B) return;
  att_load_tile<T, BKEY, HD, HD>(ks, k, b, k0, T_, C, h, 1.0f);
  att_load_tile<T, BKEY, HD, HD>(vs, v, b, k0, T_, C, h, 1.0f);

  float dk_acc[KPW][DPL], dv_acc[KPW][DPL];
#pragma unroll
  for (int kk = 0; kk < KPW; ++kk)
#pragma unroll
    for (int i = 0; i < DPL; ++i) dk_acc[kk][i] = dv_acc[kk][i] = 0.0f;

  /* Causal: queries before this block's first key see none of its keys. */
  const int q_begin = causal ? (k0 / BQ) * BQ : 0;
  for (int q0 = q_begin; q0 < T_; q0 += BQ) {
    __syncthreads();
    att_load_tile<T, BQ, HD, HD + 1>(qs, q, b, q0, T_, C, h, 1.0f);
    att_load_tile<T, BQ, HD, HD + 1>(dos, dout, b, q0, T_, C, h, 1.0f);
    for (int i = threadIdx.x; i < BQ; i += blockDim.x) {
      const int t = q0 + i;
      lses[i] = t < T_ ? lse[(long long)bh * T_ + t] : 0.0f;
      Ds[i] = t < T_ ? D[(long long)bh * T_ + t] : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < KPW; ++kk) {
      const int r = warp * KPW + kk, key = k0 + r, t = q0 + lane;
      if (key >= T_) continue;
      const bool valid = t < T_ && (!causal || key <= t);
      float p = 0.0f, ds = 0.0f;
      if (valid) {
        float s = 0.0f, dp = 0.0f;
#pragma unroll 16
        for (int d = 0; d < HD; ++d) {
          s += qs[lane][d] * ks[r][d];
          dp += dos[lane][d] * vs[r][d];
        }
        p = expf(s * scale - lses[lane]);
        ds = p * (dp - Ds[lane]);
      }
      for (int j = 0; j < BQ; ++j) {
        const float pj = __shfl_sync(0xffffffffu, p, j);
        const float dsj = __shfl_sync(0xffffffffu, ds, j);
#pragma unroll
        for (int i = 0; i < DPL; ++i) {
          const int d = lane + 32 * i;
          if (d < HD) {
            dv_acc[kk][i] += pj * dos[j][d];
            dk_acc[kk][i] += dsj * qs[j][d];
          }
        }
      }
    }
  }
#pragma unroll
  for (int kk = 0; kk < KPW; ++kk) {
    const int key = k0 + warp * KPW + kk;
    if (key >= T_) continue;
#pragma unroll
    for (int i = 0; i < DPL; ++i) {
      const int d = lane + 32 * i;
      if (d < HD) {
        dk[att_row(b, key, T_, C, h, HD) + d] = from_f32<T>(dk_acc[kk][i] * scale);
        dv[att_row(b, key, T_, C, h, HD) + d] = from_f32<T>(dv_acc[kk][i]);
      }
    }
  }
}

/* Entry points for storage type T and head dim HD (1..128). */
#define DSC_ATTENTION_INSTANTIATE(T, HD, SUFFIX)                                                   \
  extern "C" __global__ void __launch_bounds__(128) dsc_attention_fwd_##SUFFIX(                    \
      const T *q, const T *k, const T *v, T *o, float *lse, int B, int T_, int H, int causal) {    \
    attention_fwd<T, HD>(q, k, v, o, lse, B, T_, H, causal);                                       \
  }                                                                                                \
  extern "C" __global__ void __launch_bounds__(128) dsc_attention_bwd_pre_##SUFFIX(                \
      const T *o, const T *dout, float *D, int B, int T_, int H) {                                 \
    attention_bwd_pre<T, HD>(o, dout, D, B, T_, H);                                                \
  }                                                                                                \
  extern "C" __global__ void __launch_bounds__(128) dsc_attention_bwd_dq_##SUFFIX(                 \
      const T *q, const T *k, const T *v, const T *dout, const float *lse, const float *D, T *dq,  \
      int B, int T_, int H, int causal) {                                                          \
    attention_bwd_dq<T, HD>(q, k, v, dout, lse, D, dq, B, T_, H, causal);                          \
  }                                                                                                \
  extern "C" __global__ void __launch_bounds__(128) dsc_attention_bwd_dkdv_##SUFFIX(               \
      const T *q, const T *k, const T *v, const T *dout, const float *lse, const float *D, T *dk,  \
      T *dv, int B, int T_, int H, int causal) {                                                   \
    attention_bwd_dkdv<T, HD>(q, k, v, dout, lse, D, dk, dv, B, T_, H, causal);                    \
  }

#endif
