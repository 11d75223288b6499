/* attention's and rope's builders, and the head layout that attention's
 * gradient rule (ir/grad.c) and its decomposition (passes/decompose.c)
 * share.
 *
 * attention(q, k, v) {heads H, kv_heads KVH, causal, scale}: q [B, T, H hd],
 * k and v [B, S, KVH hd]. Query head h reads key/value head h / G, G = H /
 * KVH (grouped-query attention; transformers' repeat_kv), so q is split as
 * [B, KVH, G, T, hd] and k, v as [B, KVH, 1, S, hd]: every matmul broadcasts
 * over the group axis and no key or value is copied G times. With G = 1 the
 * group axis is left out ([B, H, T, hd]). Causal: query t sees keys s <= t +
 * S - T (the last T of S positions, as with a KV cache); with a sliding
 * window W > 0 (Mistral's sliding_window) only those with t + S - T - s < W.
 *
 * rope(x, positions) {heads, theta, interleaved}: x [..., T, heads hd]; in
 * each head, pair (i, i + hd/2) (Llama/NeoX: rotate-half) or (2i, 2i + 1)
 * (GPT-J: interleaved) is rotated by the angle p theta^(-2i/hd), p the
 * token's position. */
#include <math.h>
#include <string.h>

#include "ir/ir.h"

dsc_node *dsc_attention_windowed(dsc_graph *g, dsc_node *q, dsc_node *k, dsc_node *v, int64_t heads,
                                 int64_t kv_heads, bool causal, double scale, int64_t window) {
  if (!q) return NULL;
  if (!(scale > 0) && q->type.rank == 3 && heads > 0 && q->type.dims[2] % heads == 0)
    scale = 1.0 / sqrt((double)(q->type.dims[2] / heads));
  dsc_attr a[5] = {dsc_attr_int("heads", heads), dsc_attr_int("kv_heads", kv_heads),
                   dsc_attr_bool("causal", causal), dsc_attr_float("scale", scale),
                   dsc_attr_int("window", window)};
  dsc_node *in[3] = {q, k, v};
  return dsc_build(g, DSC_OP_ATTENTION, in, 3, a, 5);
}

dsc_node *dsc_attention(dsc_graph *g, dsc_node *q, dsc_node *k, dsc_node *v, int64_t heads,
                        int64_t kv_heads, bool causal, double scale) {
  return dsc_attention_windowed(g, q, k, v, heads, kv_heads, causal, scale, 0);
}

dsc_node *dsc_rope_scaled(dsc_graph *g, dsc_node *x, dsc_node *positions, int64_t heads,
                          double theta, bool interleaved, const dsc_rope_scaling *s) {
  dsc_rope_scaling none = {1, 0, 0, 0};
  if (!s) s = &none;
  dsc_attr a[7] = {dsc_attr_int("heads", heads),
                   dsc_attr_float("theta", theta),
                   dsc_attr_bool("interleaved", interleaved),
                   dsc_attr_float("factor", s->factor),
                   dsc_attr_float("low_freq_factor", s->low_freq_factor),
                   dsc_attr_float("high_freq_factor", s->high_freq_factor),
                   dsc_attr_int("original_context", s->original_context)};
  dsc_node *in[2] = {x, positions};
  return dsc_build(g, DSC_OP_ROPE, in, 2, a, 7);
}

dsc_node *dsc_rope(dsc_graph *g, dsc_node *x, dsc_node *positions, int64_t heads, double theta,
                   bool interleaved) {
  return dsc_rope_scaled(g, x, positions, heads, theta, interleaved, NULL);
}

/* transformers' _compute_llama3_parameters for one frequency, in doubles:
 * wavelength 2 pi / f against the original context's bounds. */
double ir_rope_freq(const ir_node *n, int64_t i, int64_t hd) {
  double f = pow(ir_attr_float(n, "theta"), -2.0 * (double)i / (double)hd);
  double factor = ir_attr_float(n, "factor");
  if (factor == 1) return f;
  double lo = ir_attr_float(n, "low_freq_factor"), hi = ir_attr_float(n, "high_freq_factor");
  double old = (double)ir_attr_int(n, "original_context"), wl = 2 * M_PI / f;
  if (wl < old / hi) return f;
  if (wl > old / lo) return f / factor;
  double s = (old / wl - lo) / (hi - lo);
  return (1 - s) * f / factor + s * f;
}

int64_t ir_attn_groups(const ir_node *n) {
  int64_t H = ir_attr_int(n, "heads"), KVH = ir_attr_int(n, "kv_heads");
  return KVH > 0 ? H / KVH : 1;
}

ir_node *ir_attn_split(ir_graph *g, ir_node *x, int64_t kv_heads, int64_t groups, bool grouped,
                       bool transposed) {
  if (!x) return NULL;
  const int64_t *d = x->type.dims;
  int64_t n = kv_heads * groups, hd = d[2] / n;
  if (!grouped) { /* [B, L, n, hd] -> [B, n, L, hd] or [B, n, hd, L] */
    int64_t shape[4] = {d[0], d[1], n, hd};
    int64_t perm[4] = {0, 2, 1, 3}, perm_t[4] = {0, 2, 3, 1};
    return dsc_permute(g, dsc_reshape(g, x, shape, 4), transposed ? perm_t : perm, 4);
  }
  int64_t shape[5] = {d[0], d[1], kv_heads, groups, hd};
  int64_t perm[5] = {0, 2, 3, 1, 4}, perm_t[5] = {0, 2, 3, 4, 1};
  return dsc_permute(g, dsc_reshape(g, x, shape, 5), transposed ? perm_t : perm, 5);
}

ir_node *ir_attn_merge(ir_graph *g, ir_node *x) {
  if (!x) return NULL;
  const int64_t *d = x->type.dims;
  if (x->type.rank == 4) { /* [B, n, L, hd] */
    int64_t shape[3] = {d[0], d[2], d[1] * d[3]}, perm[4] = {0, 2, 1, 3};
    return dsc_reshape(g, dsc_permute(g, x, perm, 4), shape, 3);
  }
  int64_t shape[3] = {d[0], d[3], d[1] * d[2] * d[4]}, perm[5] = {0, 3, 1, 2, 4};
  return dsc_reshape(g, dsc_permute(g, x, perm, 5), shape, 3);
}

ir_node *ir_attn_masked(ir_graph *g, int64_t T, int64_t S, int64_t window) {
  int64_t ts[2] = {T, S};
  dsc_attr as[3] = {dsc_attr_int("axis", 1), dsc_attr_dtype("dtype", DSC_I32),
                    dsc_attr_ints("shape", ts, 2)};
  dsc_attr at[3] = {dsc_attr_int("axis", 0), dsc_attr_dtype("dtype", DSC_I32),
                    dsc_attr_ints("shape", ts, 2)};
  ir_node *s = dsc_build(g, DSC_OP_IOTA, NULL, 0, as, 3);
  ir_node *t = dsc_build(g, DSC_OP_IOTA, NULL, 0, at, 3);
  if (S != T) {
    dsc_type i32;
    memset(&i32, 0, sizeof i32);
    i32.dtype = DSC_I32;
    t = dsc_binary(g, DSC_OP_ADD, t, dsc_const(g, (double)(S - T), i32));
  }
  ir_node *future = dsc_binary(g, DSC_OP_GREATER, s, t);
  if (window <= 0 || window >= S) return future;
  /* sliding window: also masked where t' - s >= window, the key window or
   * more positions back: where(future, future, t' - s > window - 1) */
  dsc_type i32;
  memset(&i32, 0, sizeof i32);
  i32.dtype = DSC_I32;
  ir_node *back = dsc_binary(g, DSC_OP_SUB, t, s);
  ir_node *gone = dsc_binary(g, DSC_OP_GREATER, back, dsc_const(g, (double)(window - 1), i32));
  ir_node *in[3] = {future, future, gone};
  return dsc_build(g, DSC_OP_WHERE, in, 3, NULL, 0);
}
