/* tests/unit/cuda_reference.h: plain-loop references of the hand-written
 * CUDA templates (kernels/ .cuh), in double precision over f32 data.
 *
 * The kernels cannot run on this machine (no GPU); these functions state
 * their math in the simplest form so that a later GPU test (issue: GPU
 * runtime) can compare each kernel's output against them. They are checked
 * here against finite differences and closed forms
 * (tests/unit/cuda_templates_test.cc). Layouts are the kernels' layouts:
 * rows contiguous; attention tensors [B, T, H*hd] with head h at channels
 * [h*hd, (h+1)*hd), lse [B, H, T]. */
#ifndef DSC_TESTS_CUDA_REFERENCE_H
#define DSC_TESTS_CUDA_REFERENCE_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

/* Softmax + cross-entropy forward over logits [N, V]: per-row loss
 * lse - x[target], lse, probabilities (probs may be NULL). Returns the mean
 * loss; *bad_target set when a target is outside [0, V) (its loss is 0). */
static inline double ref_softmax_ce_fwd(const float *logits, const int64_t *targets, int N, int V,
                                        float *losses, float *lse, float *probs,
                                        bool *bad_target) {
  double total = 0;
  *bad_target = false;
  for (int n = 0; n < N; n++) {
    const float *x = logits + (int64_t)n * V;
    double mx = -INFINITY, s = 0;
    for (int i = 0; i < V; i++) mx = x[i] > mx ? x[i] : mx;
    for (int i = 0; i < V; i++) s += exp(x[i] - mx);
    const double l = mx + log(s);
    const int64_t t = targets[n];
    double loss = 0;
    if (t < 0 || t >= V)
      *bad_target = true;
    else
      loss = l - x[t];
    losses[n] = (float)loss;
    lse[n] = (float)l;
    if (probs)
      for (int i = 0; i < V; i++) probs[(int64_t)n * V + i] = (float)exp(x[i] - l);
    total += loss;
  }
  return total / N;
}

/* dlogits = (softmax - onehot(target)) * dloss / N, from the saved lse. */
static inline void ref_softmax_ce_bwd(const float *logits, const int64_t *targets,
                                      const float *lse, float dloss, int N, int V,
                                      float *dlogits) {
  for (int n = 0; n < N; n++)
    for (int i = 0; i < V; i++) {
      const int64_t j = (int64_t)n * V + i;
      const double p = exp((double)logits[j] - lse[n]);
      dlogits[j] = (float)((p - (i == targets[n] ? 1.0 : 0.0)) * dloss / N);
    }
}

/* Layernorm forward over rows of x [N, C]: biased variance, saving mean
 * and rstd = 1/sqrt(var + eps). */
static inline void ref_layernorm_fwd(const float *x, const float *w, const float *b, int N, int C,
                                     float eps, float *y, float *mean, float *rstd) {
  for (int n = 0; n < N; n++) {
    const float *xr = x + (int64_t)n * C;
    double m = 0, v = 0;
    for (int i = 0; i < C; i++) m += xr[i];
    m /= C;
    for (int i = 0; i < C; i++) v += (xr[i] - m) * (xr[i] - m);
    v /= C;
    const double rs = 1.0 / sqrt(v + eps);
    for (int i = 0; i < C; i++) y[(int64_t)n * C + i] = (float)((xr[i] - m) * rs * w[i] + b[i]);
    mean[n] = (float)m;
    rstd[n] = (float)rs;
  }
}

/* Layernorm backward: dx, and dw, db summed over all rows (written). */
static inline void ref_layernorm_bwd(const float *dy, const float *x, const float *w,
                                     const float *mean, const float *rstd, int N, int C,
                                     float *dx, float *dw, float *db) {
  for (int i = 0; i < C; i++) dw[i] = db[i] = 0;
  double *dws = (double *)calloc((size_t)C * 2, sizeof(double)), *dbs = dws + C;
  for (int n = 0; n < N; n++) {
    const int64_t base = (int64_t)n * C;
    double sg = 0, sgx = 0;
    for (int i = 0; i < C; i++) {
      const double xh = (x[base + i] - (double)mean[n]) * rstd[n], g = (double)dy[base + i] * w[i];
      sg += g;
      sgx += g * xh;
      dws[i] += dy[base + i] * xh;
      dbs[i] += dy[base + i];
    }
    sg /= C;
    sgx /= C;
    for (int i = 0; i < C; i++) {
      const double xh = (x[base + i] - (double)mean[n]) * rstd[n], g = (double)dy[base + i] * w[i];
      dx[base + i] = (float)(rstd[n] * (g - sg - xh * sgx));
    }
  }
  for (int i = 0; i < C; i++) dw[i] = (float)dws[i], db[i] = (float)dbs[i];
  free(dws);
}

/* Element (b, t, h, d) of a [B, T, H*hd] tensor. */
static inline int64_t ref_att_at(int b, int t, int h, int d, int T, int H, int hd) {
  return ((int64_t)b * T + t) * H * hd + (int64_t)h * hd + d;
}

/* Attention forward: o = softmax(q k^T / sqrt(hd), causal: s <= t) v per
 * (b, h); lse [B, H, T] the log of each row's normaliser (of the scaled
 * scores). */
static inline void ref_attention_fwd(const float *q, const float *k, const float *v, int B, int T,
                                     int H, int hd, bool causal, float *o, float *lse) {
  double *p = (double *)malloc(sizeof(double) * (size_t)T);
  const double scale = 1.0 / sqrt((double)hd);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < H; h++)
      for (int t = 0; t < T; t++) {
        const int n_keys = causal ? t + 1 : T;
        double mx = -INFINITY, sum = 0;
        for (int s = 0; s < n_keys; s++) {
          double dot = 0;
          for (int d = 0; d < hd; d++)
            dot += (double)q[ref_att_at(b, t, h, d, T, H, hd)] * k[ref_att_at(b, s, h, d, T, H, hd)];
          p[s] = dot * scale;
          mx = p[s] > mx ? p[s] : mx;
        }
        for (int s = 0; s < n_keys; s++) sum += (p[s] = exp(p[s] - mx));
        for (int d = 0; d < hd; d++) {
          double acc = 0;
          for (int s = 0; s < n_keys; s++) acc += p[s] * v[ref_att_at(b, s, h, d, T, H, hd)];
          o[ref_att_at(b, t, h, d, T, H, hd)] = (float)(acc / sum);
        }
        lse[((int64_t)b * H + h) * T + t] = (float)(mx + log(sum));
      }
  free(p);
}

/* Attention backward from dout (and the saved lse): dq, dk, dv (written).
 * P = exp(S - lse), dV = P^T dO, dP = dO V^T, dS = P (dP - rowsum(dO o)),
 * dQ = dS K / sqrt(hd), dK = dS^T Q / sqrt(hd). */
static inline void ref_attention_bwd(const float *q, const float *k, const float *v,
                                     const float *o, const float *dout, const float *lse, int B,
                                     int T, int H, int hd, bool causal, float *dq, float *dk,
                                     float *dv) {
  const int64_t n = (int64_t)B * T * H * hd;
  for (int64_t i = 0; i < n; i++) dq[i] = dk[i] = dv[i] = 0;
  double *acc = (double *)calloc((size_t)n * 3, sizeof(double));
  double *aq = acc, *ak = acc + n, *av = acc + 2 * n;
  const double scale = 1.0 / sqrt((double)hd);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < H; h++)
      for (int t = 0; t < T; t++) {
        double D = 0;
        for (int d = 0; d < hd; d++)
          D += (double)dout[ref_att_at(b, t, h, d, T, H, hd)] * o[ref_att_at(b, t, h, d, T, H, hd)];
        const int n_keys = causal ? t + 1 : T;
        for (int s = 0; s < n_keys; s++) {
          double dot = 0, dp = 0;
          for (int d = 0; d < hd; d++) {
            dot += (double)q[ref_att_at(b, t, h, d, T, H, hd)] * k[ref_att_at(b, s, h, d, T, H, hd)];
            dp += (double)dout[ref_att_at(b, t, h, d, T, H, hd)] * v[ref_att_at(b, s, h, d, T, H, hd)];
          }
          const double p = exp(dot * scale - lse[((int64_t)b * H + h) * T + t]);
          const double ds = p * (dp - D);
          for (int d = 0; d < hd; d++) {
            av[ref_att_at(b, s, h, d, T, H, hd)] += p * dout[ref_att_at(b, t, h, d, T, H, hd)];
            aq[ref_att_at(b, t, h, d, T, H, hd)] += ds * k[ref_att_at(b, s, h, d, T, H, hd)] * scale;
            ak[ref_att_at(b, s, h, d, T, H, hd)] += ds * q[ref_att_at(b, t, h, d, T, H, hd)] * scale;
          }
        }
      }
  for (int64_t i = 0; i < n; i++) dq[i] = (float)aq[i], dk[i] = (float)ak[i], dv[i] = (float)av[i];
  free(acc);
}

/* One AdamW step (PyTorch's decoupled decay) on n elements, step >= 1:
 * g = grad * grad_scale; w -= lr*wd*w; m, v moments; w -= lr * mhat /
 * (sqrt(vhat) + eps). w_copy (may be NULL) receives the new weights. */
static inline void ref_adamw(float *w, const float *grad, float *m, float *v, int64_t n, float lr,
                             float beta1, float beta2, float eps, float weight_decay, int64_t step,
                             float grad_scale, float *w_copy) {
  const double bc1 = 1 - pow(beta1, (double)step), bc2 = 1 - pow(beta2, (double)step);
  for (int64_t i = 0; i < n; i++) {
    const double g = (double)grad[i] * grad_scale;
    double wi = w[i];
    wi -= (double)lr * weight_decay * wi;
    const double mi = beta1 * (double)m[i] + (1 - (double)beta1) * g;
    const double vi = beta2 * (double)v[i] + (1 - (double)beta2) * g * g;
    wi -= lr * (mi / bc1) / (sqrt(vi / bc2) + eps);
    m[i] = (float)mi;
    v[i] = (float)vi;
    w[i] = (float)wi;
    if (w_copy) w_copy[i] = (float)wi;
  }
}

#endif
