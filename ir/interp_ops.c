/* Reference kernels: one plain-loop implementation per op, in doubles.
 *
 * The interpreter (ir/interp.c) allocates `out` with the node's type (zero
 * filled) before the call and rounds it to the dtype afterwards, so kernels
 * compute in double and never round. Shapes have been checked by the op's
 * shape rule; kernels only report data-dependent errors (an index out of
 * range, an integer division by zero). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"


static int64_t numel(const dsc_tensor *t) { return dsc_type_numel(&t->type); }

/* Product of dims in [from, to). */
static int64_t dims_prod(const dsc_type *t, int from, int to) {
  int64_t p = 1;
  for (int i = from; i < to; i++) p *= t->dims[i];
  return p;
}

/* ---------------------------------------------------------------- strided iteration
 * Walks a row-major index space of `rank` dims and keeps up to three linear
 * offsets in step, each with its own strides (0 for a broadcast dim). */
typedef struct {
  int rank, n;
  int64_t dims[DSC_MAX_RANK];
  int64_t idx[DSC_MAX_RANK];
  int64_t stride[3][DSC_MAX_RANK];
  int64_t off[3];
} iter;

static void iter_init(iter *it, const dsc_type *space, int n_streams) {
  memset(it, 0, sizeof *it);
  it->rank = space->rank;
  it->n = n_streams;
  for (int d = 0; d < space->rank; d++) it->dims[d] = space->dims[d];
}

/* Strides that read `in` broadcast numpy-style to the index space `out`
 * (trailing dims aligned; size-1 and missing dims get stride 0). */
static void bcast_strides(const dsc_type *in, const dsc_type *out, int64_t *stride) {
  int64_t s = 1;
  for (int d = out->rank - 1; d >= 0; d--) {
    int di = d - (out->rank - in->rank);
    if (di < 0) {
      stride[d] = 0;
      continue;
    }
    stride[d] = in->dims[di] == 1 ? 0 : s;
    s *= in->dims[di];
  }
}

static void iter_next(iter *it) {
  for (int d = it->rank - 1; d >= 0; d--) {
    it->idx[d]++;
    for (int k = 0; k < it->n; k++) it->off[k] += it->stride[k][d];
    if (it->idx[d] < it->dims[d]) return;
    for (int k = 0; k < it->n; k++) it->off[k] -= it->stride[k][d] * it->dims[d];
    it->idx[d] = 0;
  }
}

/* ---------------------------------------------------------------- sources */

bool interp_input(const dsc_node *n, const dsc_tensor *const *in, dsc_tensor *out, char *err,
                  size_t errlen) {
  IR_UNUSED(n), IR_UNUSED(in), IR_UNUSED(out);
  return ir_fail(err, errlen, "internal: input nodes are bound by the interpreter, not computed");
}

bool interp_param(const dsc_node *n, const dsc_tensor *const *in, dsc_tensor *out, char *err,
                  size_t errlen) {
  IR_UNUSED(n), IR_UNUSED(in), IR_UNUSED(out);
  return ir_fail(err, errlen, "internal: param nodes are bound by the interpreter, not computed");
}

bool interp_const(const dsc_node *n, const dsc_tensor *const *in, dsc_tensor *out, char *err,
                  size_t errlen) {
  IR_UNUSED(in), IR_UNUSED(err), IR_UNUSED(errlen);
  double v = ir_attr_float(n, "value");
  int64_t cnt = numel(out);
  for (int64_t i = 0; i < cnt; i++) out->data[i] = v;
  return true;
}

bool interp_iota(const dsc_node *n, const dsc_tensor *const *in, dsc_tensor *out, char *err,
                 size_t errlen) {
  IR_UNUSED(in), IR_UNUSED(err), IR_UNUSED(errlen);
  int axis = (int)ir_attr_int(n, "axis");
  iter it;
  iter_init(&it, &out->type, 0);
  int64_t cnt = numel(out);
  for (int64_t i = 0; i < cnt; i++, iter_next(&it)) out->data[i] = (double)it.idx[axis];
  return true;
}

/* ---------------------------------------------------------------- elementwise */

typedef double (*binop)(double, double);

/* out[i] = f(a[...], b[...]) with broadcasting. */
static void binary_map(const dsc_tensor *a, const dsc_tensor *b, dsc_tensor *out, binop f) {
  int64_t cnt = numel(out);
  const double *pa = a->data, *pb = b->data;
  if (numel(a) == cnt && numel(b) == cnt) { /* same shape: no index arithmetic */
    for (int64_t i = 0; i < cnt; i++) out->data[i] = f(pa[i], pb[i]);
    return;
  }
  iter it;
  iter_init(&it, &out->type, 2);
  bcast_strides(&a->type, &out->type, it.stride[0]);
  bcast_strides(&b->type, &out->type, it.stride[1]);
  for (int64_t i = 0; i < cnt; i++, iter_next(&it)) out->data[i] = f(pa[it.off[0]], pb[it.off[1]]);
}

static double op_fdiv(double a, double b) { return a / b; }
static double op_idiv(double a, double b) { return trunc(a / b); } /* b != 0 checked */

bool interp_div(const dsc_node *n, const dsc_tensor *const *in, dsc_tensor *out, char *err,
                size_t errlen) {
  IR_UNUSED(n);
  if (dsc_dtype_is_float(out->type.dtype)) {
    binary_map(in[0], in[1], out, op_fdiv);
    return true;
  }
  /* Integer division truncates toward zero; a zero divisor is an error. */
  int64_t nb = numel(in[1]);
  for (int64_t i = 0; i < nb; i++)
    if (in[1]->data[i] == 0)
      return ir_fail(err, errlen, "integer division by zero (divisor element %lld)", (long long)i);
  binary_map(in[0], in[1], out, op_idiv);
  return true;
}

/* Every elementwise op but div: its scalar function (include/dsc/ops.def)
 * at each point, the inputs broadcast numpy-style. */
bool interp_elementwise(const dsc_node *n, const dsc_tensor *const *in, dsc_tensor *out,
                        char *err, size_t errlen) {
  IR_UNUSED(err), IR_UNUSED(errlen);
  const ir_op_info *oi = ir_op(n->op);
  double p = 0, x[3] = {0, 0, 0};
  for (int a = 0; a < oi->n_attrs; a++)
    if (oi->attr_kinds[a] == DSC_ATTR_FLOAT) p = ir_attr_float(n, oi->attr_keys[a]);
  int64_t cnt = numel(out);
  int k = n->n_in;
  bool same = true;
  for (int i = 0; i < k; i++) same = same && numel(in[i]) == cnt;
  if (same) { /* no index arithmetic */
    for (int64_t j = 0; j < cnt; j++) {
      for (int i = 0; i < k; i++) x[i] = in[i]->data[j];
      out->data[j] = oi->scalar(x, p);
    }
    return true;
  }
  iter it;
  iter_init(&it, &out->type, k);
  for (int i = 0; i < k; i++) bcast_strides(&in[i]->type, &out->type, it.stride[i]);
  for (int64_t j = 0; j < cnt; j++, iter_next(&it)) {
    for (int i = 0; i < k; i++) x[i] = in[i]->data[it.off[i]];
    out->data[j] = oi->scalar(x, p);
  }
  return true;
}

/* ---------------------------------------------------------------- reductions */

/* Sets up an iterator over x whose stream 0 is the output offset of each
 * element (reduced axes have stride 0). Returns the reduced element count. */
static int64_t reduce_setup(const dsc_node *n, const dsc_tensor *x, iter *it) {
  int cnt;
  const int64_t *axes = ir_attr_ints(n, "axes", &cnt);
  bool reduced[DSC_MAX_RANK] = {false};
  for (int i = 0; i < cnt; i++) reduced[axes[i]] = true;
  iter_init(it, &x->type, 1);
  int64_t s = 1, group = 1;
  for (int d = x->type.rank - 1; d >= 0; d--) {
    if (reduced[d]) {
      it->stride[0][d] = 0;
      group *= x->type.dims[d];
    } else {
      it->stride[0][d] = s;
      s *= x->type.dims[d];
    }
  }
  return group;
}

bool interp_sum(const dsc_node *n, const dsc_tensor *const *in, dsc_tensor *out, char *err,
                size_t errlen) {
  IR_UNUSED(err), IR_UNUSED(errlen);
  iter it;
  reduce_setup(n, in[0], &it);
  memset(out->data, 0, sizeof(double) * (size_t)numel(out));
  int64_t cnt = numel(in[0]);
  for (int64_t i = 0; i < cnt; i++, iter_next(&it)) out->data[it.off[0]] += in[0]->data[i];
  return true;
}

bool interp_mean(const dsc_node *n, const dsc_tensor *const *in, dsc_tensor *out, char *err,
                 size_t errlen) {
  iter it;
  int64_t group = reduce_setup(n, in[0], &it);
  if (!interp_sum(n, in, out, err, errlen)) return false;
  int64_t cnt = numel(out);
  for (int64_t i = 0; i < cnt; i++) out->data[i] /= (double)group;
  return true;
}

bool interp_max(const dsc_node *n, const dsc_tensor *const *in, dsc_tensor *out, char *err,
                size_t errlen) {
  IR_UNUSED(err), IR_UNUSED(errlen);
  iter it;
  reduce_setup(n, in[0], &it);
  int64_t cnt_out = numel(out), cnt = numel(in[0]);
  ir_scalar_fn maximum = ir_op(DSC_OP_MAXIMUM)->scalar; /* NaN propagates, as in the op */
  for (int64_t i = 0; i < cnt_out; i++) out->data[i] = -INFINITY;
  for (int64_t i = 0; i < cnt; i++, iter_next(&it)) {
    double x[2] = {out->data[it.off[0]], in[0]->data[i]};
    out->data[it.off[0]] = maximum(x, 0);
  }
  return true;
}

/* ---------------------------------------------------------------- layout */

bool interp_reshape(const dsc_node *n, const dsc_tensor *const *in, dsc_tensor *out, char *err,
                    size_t errlen) {
  IR_UNUSED(n), IR_UNUSED(err), IR_UNUSED(errlen);
  memcpy(out->data, in[0]->data, sizeof(double) * (size_t)numel(out));
  return true;
}

bool interp_permute(const dsc_node *n, const dsc_tensor *const *in, dsc_tensor *out, char *err,
                    size_t errlen) {
  IR_UNUSED(err), IR_UNUSED(errlen);
  int cnt;
  const int64_t *perm = ir_attr_ints(n, "perm", &cnt);
  const dsc_type *xt = &in[0]->type;
  int64_t in_stride[DSC_MAX_RANK], s = 1;
  for (int d = xt->rank - 1; d >= 0; d--) {
    in_stride[d] = s;
    s *= xt->dims[d];
  }
  iter it;
  iter_init(&it, &out->type, 1);
  for (int d = 0; d < cnt; d++) it.stride[0][d] = in_stride[perm[d]];
  int64_t total = numel(out);
  for (int64_t i = 0; i < total; i++, iter_next(&it)) out->data[i] = in[0]->data[it.off[0]];
  return true;
}

bool interp_slice(const dsc_node *n, const dsc_tensor *const *in, dsc_tensor *out, char *err,
                  size_t errlen) {
  IR_UNUSED(err), IR_UNUSED(errlen);
  const dsc_type *xt = &in[0]->type;
  int axis = (int)ir_attr_int(n, "axis");
  int64_t start = ir_attr_int(n, "start"), end = ir_attr_int(n, "end");
  int64_t outer = dims_prod(xt, 0, axis), inner = dims_prod(xt, axis + 1, xt->rank);
  int64_t len = xt->dims[axis], chunk = (end - start) * inner;
  for (int64_t o = 0; o < outer; o++)
    memcpy(out->data + o * chunk, in[0]->data + (o * len + start) * inner,
           sizeof(double) * (size_t)chunk);
  return true;
}

bool interp_concat(const dsc_node *n, const dsc_tensor *const *in, dsc_tensor *out, char *err,
                   size_t errlen) {
  IR_UNUSED(err), IR_UNUSED(errlen);
  int axis = (int)ir_attr_int(n, "axis");
  const dsc_type *ot = &out->type;
  int64_t outer = dims_prod(ot, 0, axis), inner = dims_prod(ot, axis + 1, ot->rank);
  int64_t out_chunk = ot->dims[axis] * inner, pos = 0;
  for (int k = 0; k < n->n_in; k++) {
    int64_t chunk = in[k]->type.dims[axis] * inner;
    for (int64_t o = 0; o < outer; o++)
      memcpy(out->data + o * out_chunk + pos, in[k]->data + o * chunk,
             sizeof(double) * (size_t)chunk);
    pos += chunk;
  }
  return true;
}

bool interp_broadcast(const dsc_node *n, const dsc_tensor *const *in, dsc_tensor *out, char *err,
                      size_t errlen) {
  IR_UNUSED(n), IR_UNUSED(err), IR_UNUSED(errlen);
  iter it;
  iter_init(&it, &out->type, 1);
  bcast_strides(&in[0]->type, &out->type, it.stride[0]);
  int64_t cnt = numel(out);
  for (int64_t i = 0; i < cnt; i++, iter_next(&it)) out->data[i] = in[0]->data[it.off[0]];
  return true;
}

/* Formats an index value for a message (integral values without ".0"). */
static void fmt_index(double v, char *buf, size_t n) {
  if (v == trunc(v) && fabs(v) < 9e15)
    snprintf(buf, n, "%lld", (long long)v);
  else
    snprintf(buf, n, "%g", v);
}

bool interp_embedding(const dsc_node *n, const dsc_tensor *const *in, dsc_tensor *out, char *err,
                      size_t errlen) {
  IR_UNUSED(n);
  const dsc_tensor *tab = in[0], *ids = in[1];
  int64_t V = tab->type.dims[0], D = tab->type.dims[1], cnt = numel(ids);
  for (int64_t p = 0; p < cnt; p++) {
    double v = ids->data[p];
    if (!(v >= 0 && v < (double)V)) {
      char b[64];
      fmt_index(v, b, sizeof b);
      return ir_fail(err, errlen, "id %s at position %lld is out of range [0, %lld)", b, (long long)p,
                  (long long)V);
    }
    memcpy(out->data + p * D, tab->data + (int64_t)v * D, sizeof(double) * (size_t)D);
  }
  return true;
}

/* ---------------------------------------------------------------- matmul */

/* C[M,N] = A[M,K] B[K,N]. The inner loop runs over contiguous rows of B and
 * C; blocks of C (ROWS x COLS) stay in cache while the matching columns of
 * B stream through once per row block. */
static void gemm(const double *restrict a, const double *restrict b, double *restrict c, int64_t M,
                 int64_t K, int64_t N) {
  enum { ROWS = 32, COLS = 256 };
  memset(c, 0, sizeof(double) * (size_t)(M * N));
  for (int64_t j0 = 0; j0 < N; j0 += COLS) {
    int64_t j1 = j0 + COLS < N ? j0 + COLS : N;
    for (int64_t i0 = 0; i0 < M; i0 += ROWS) {
      int64_t i1 = i0 + ROWS < M ? i0 + ROWS : M;
      for (int64_t k = 0; k < K; k++) {
        const double *restrict brow = b + k * N;
        for (int64_t i = i0; i < i1; i++) {
          double aik = a[i * K + k];
          double *restrict crow = c + i * N;
          for (int64_t j = j0; j < j1; j++) crow[j] += aik * brow[j];
        }
      }
    }
  }
}

bool interp_matmul(const dsc_node *n, const dsc_tensor *const *in, dsc_tensor *out, char *err,
                   size_t errlen) {
  IR_UNUSED(n), IR_UNUSED(err), IR_UNUSED(errlen);
  const dsc_type *at = &in[0]->type, *bt = &in[1]->type, *ot = &out->type;
  int64_t M = at->dims[at->rank - 2], K = at->dims[at->rank - 1], N = bt->dims[bt->rank - 1];
  /* Batch dims only: broadcast strides in units of whole matrices. */
  dsc_type ab = *at, bb = *bt, ob = *ot;
  ab.rank -= 2, bb.rank -= 2, ob.rank -= 2;
  iter it;
  iter_init(&it, &ob, 2);
  bcast_strides(&ab, &ob, it.stride[0]);
  bcast_strides(&bb, &ob, it.stride[1]);
  int64_t batches = dims_prod(&ob, 0, ob.rank);
  for (int64_t bi = 0; bi < batches; bi++, iter_next(&it))
    gemm(in[0]->data + it.off[0] * M * K, in[1]->data + it.off[1] * K * N, out->data + bi * M * N,
         M, K, N);
  return true;
}

/* ---------------------------------------------------------------- composites */

/* Softmax over each 1-D lane along `axis` (lane elements are base + l*inner),
 * shifted by the lane max so that exp never overflows. */
static void softmax_lanes(const dsc_node *n, const dsc_tensor *x, dsc_tensor *out, bool log_out) {
  int axis = (int)ir_attr_int(n, "axis");
  const dsc_type *t = &x->type;
  int64_t outer = dims_prod(t, 0, axis), L = t->dims[axis], inner = dims_prod(t, axis + 1, t->rank);
  for (int64_t o = 0; o < outer; o++)
    for (int64_t i = 0; i < inner; i++) {
      const double *xs = x->data + o * L * inner + i;
      double *ys = out->data + o * L * inner + i;
      double m = -INFINITY;
      for (int64_t l = 0; l < L; l++)
        if (xs[l * inner] > m) m = xs[l * inner];
      double s = 0;
      for (int64_t l = 0; l < L; l++) s += exp(xs[l * inner] - m);
      if (log_out) {
        double lse = log(s);
        for (int64_t l = 0; l < L; l++) ys[l * inner] = xs[l * inner] - m - lse;
      } else {
        for (int64_t l = 0; l < L; l++) ys[l * inner] = exp(xs[l * inner] - m) / s;
      }
    }
}

bool interp_softmax(const dsc_node *n, const dsc_tensor *const *in, dsc_tensor *out, char *err,
                    size_t errlen) {
  IR_UNUSED(err), IR_UNUSED(errlen);
  softmax_lanes(n, in[0], out, false);
  return true;
}

bool interp_log_softmax(const dsc_node *n, const dsc_tensor *const *in, dsc_tensor *out, char *err,
                        size_t errlen) {
  IR_UNUSED(err), IR_UNUSED(errlen);
  softmax_lanes(n, in[0], out, true);
  return true;
}

/* Normalises each row of D elements; b may be NULL (rmsnorm). */
static void norm_rows(const dsc_tensor *x, const double *w, const double *b, double eps, bool rms,
                      dsc_tensor *out) {
  int64_t D = x->type.dims[x->type.rank - 1];
  int64_t rows = D ? numel(x) / D : 0;
  for (int64_t r = 0; r < rows; r++) {
    const double *xr = x->data + r * D;
    double *yr = out->data + r * D;
    double mean = 0, var = 0;
    if (!rms) {
      for (int64_t j = 0; j < D; j++) mean += xr[j];
      mean /= (double)D;
    }
    for (int64_t j = 0; j < D; j++) var += (xr[j] - mean) * (xr[j] - mean);
    var /= (double)D; /* biased (rms: mean of squares) */
    double inv = 1.0 / sqrt(var + eps);
    for (int64_t j = 0; j < D; j++) yr[j] = (xr[j] - mean) * inv * w[j] + (b ? b[j] : 0.0);
  }
}

bool interp_layernorm(const dsc_node *n, const dsc_tensor *const *in, dsc_tensor *out, char *err,
                      size_t errlen) {
  IR_UNUSED(err), IR_UNUSED(errlen);
  norm_rows(in[0], in[1]->data, in[2]->data, ir_attr_float(n, "eps"), false, out);
  return true;
}

bool interp_rmsnorm(const dsc_node *n, const dsc_tensor *const *in, dsc_tensor *out, char *err,
                    size_t errlen) {
  IR_UNUSED(err), IR_UNUSED(errlen);
  norm_rows(in[0], in[1]->data, NULL, ir_attr_float(n, "eps"), true, out);
  return true;
}

/* Per batch and query head h (key/value head h / G): scores = q.k scale,
 * causal mask s > t + S - T (and s <= t + S - T - window with a sliding
 * window), stable softmax over s, weighted sum of v. Two
 * passes over s (max, then exp-weighted accumulation) so that no scratch
 * memory is needed. */
bool interp_attention(const dsc_node *n, const dsc_tensor *const *in, dsc_tensor *out, char *err,
                      size_t errlen) {
  IR_UNUSED(err), IR_UNUSED(errlen);
  const dsc_type *t = &in[0]->type;
  int64_t B = t->dims[0], T = t->dims[1], C = t->dims[2], H = ir_attr_int(n, "heads");
  int64_t S = in[1]->type.dims[1], Ckv = in[1]->type.dims[2], G = ir_attn_groups(n);
  bool causal = ir_attr_bool(n, "causal");
  int64_t hd = C / H, window = ir_attr_int(n, "window");
  double scale = ir_attr_float(n, "scale");
  const double *q = in[0]->data, *k = in[1]->data, *v = in[2]->data;
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < H; h++)
      for (int64_t tq = 0; tq < T; tq++) {
        const double *qr = q + (b * T + tq) * C + h * hd;
        double *orow = out->data + (b * T + tq) * C + h * hd;
        int64_t kv = (h / G) * hd, n_s = causal ? tq + 1 + S - T : S;
        int64_t s0 = causal && window > 0 && n_s > window ? n_s - window : 0;
        double m = -INFINITY;
        for (int64_t s = s0; s < n_s; s++) {
          const double *kr = k + (b * S + s) * Ckv + kv;
          double dot = 0;
          for (int64_t j = 0; j < hd; j++) dot += qr[j] * kr[j];
          if (dot * scale > m) m = dot * scale;
        }
        double denom = 0;
        for (int64_t j = 0; j < hd; j++) orow[j] = 0;
        for (int64_t s = s0; s < n_s; s++) {
          const double *kr = k + (b * S + s) * Ckv + kv;
          const double *vr = v + (b * S + s) * Ckv + kv;
          double dot = 0;
          for (int64_t j = 0; j < hd; j++) dot += qr[j] * kr[j];
          double w = exp(dot * scale - m);
          denom += w;
          for (int64_t j = 0; j < hd; j++) orow[j] += w * vr[j];
        }
        for (int64_t j = 0; j < hd; j++) orow[j] /= denom;
      }
  return true;
}

/* Rotates each head's pairs (i, i + hd/2), or (2i, 2i + 1) when interleaved,
 * by p f_i (ir_rope_freq: theta^(-2i/hd), or llama3's scaled frequencies),
 * p the row's position (broadcast from its shape). */
bool interp_rope(const dsc_node *n, const dsc_tensor *const *in, dsc_tensor *out, char *err,
                 size_t errlen) {
  const dsc_type *xt = &in[0]->type, *pt = &in[1]->type;
  int64_t C = xt->dims[xt->rank - 1], H = ir_attr_int(n, "heads"), hd = C / H, half = hd / 2;
  int64_t rows = numel(in[0]) / C;
  bool inter = ir_attr_bool(n, "interleaved");
  double *f = malloc(sizeof(double) * (size_t)(half > 0 ? half : 1)); /* the frequencies, once */
  if (!f) return ir_fail(err, errlen, "out of memory");
  for (int64_t i = 0; i < half; i++) f[i] = ir_rope_freq(n, i, hd);
  int lead = xt->rank - 1 - pt->rank; /* x's row axes the positions lack */
  for (int64_t r = 0; r < rows; r++) {
    /* the position of row r: its index over x's row axes, broadcast */
    int64_t rest = r, pi = 0, stride = 1;
    for (int d = xt->rank - 2; d >= 0; d--) {
      int64_t idx = rest % xt->dims[d];
      rest /= xt->dims[d];
      if (d >= lead) {
        int64_t pd = pt->dims[d - lead];
        pi += (pd == 1 ? 0 : idx) * stride;
        stride *= pd;
      }
    }
    double p = in[1]->data[pi];
    const double *x = in[0]->data + r * C;
    double *y = out->data + r * C;
    for (int64_t h = 0; h < H; h++)
      for (int64_t i = 0; i < half; i++) {
        double a = p * f[i], c = cos(a), s = sin(a);
        int64_t j0 = h * hd + (inter ? 2 * i : i), j1 = h * hd + (inter ? 2 * i + 1 : i + half);
        double x0 = x[j0], x1 = x[j1];
        y[j0] = x0 * c - x1 * s;
        y[j1] = x1 * c + x0 * s;
      }
  }
  free(f);
  return true;
}

/* Element i is dropped when rand24(seed, stream 2^40 + i) < round(p 2^24)
 * and scaled by 1/(1 - p) otherwise; the scale and the product are rounded
 * as the decomposition's f32 (f64 for f64 x) multiply rounds them. */
bool interp_dropout(const dsc_node *n, const dsc_tensor *const *in, dsc_tensor *out, char *err,
                    size_t errlen) {
  IR_UNUSED(err), IR_UNUSED(errlen);
  double p = ir_attr_float(n, "p");
  int64_t base = ir_attr_int(n, "stream") << IR_DROPOUT_STREAM_SHIFT;
  int64_t seed = (int64_t)in[1]->data[0], thr = ir_dropout_threshold(p);
  bool f64 = in[0]->type.dtype == DSC_F64;
  double scale = f64 ? 1.0 / (1.0 - p) : (double)(float)(1.0 / (1.0 - p));
  for (int64_t i = 0; i < numel(in[0]); i++) {
    double y = in[0]->data[i] * scale;
    out->data[i] = ir_rand24(seed, base + i) < thr ? 0.0 : f64 ? y : (double)(float)y;
  }
  return true;
}

bool interp_cross_entropy(const dsc_node *n, const dsc_tensor *const *in, dsc_tensor *out,
                          char *err, size_t errlen) {
  IR_UNUSED(n);
  const dsc_tensor *lg = in[0], *tg = in[1];
  int64_t V = lg->type.dims[lg->type.rank - 1], P = numel(tg);
  double total = 0;
  for (int64_t p = 0; p < P; p++) {
    double tv = tg->data[p];
    if (!(tv >= 0 && tv < (double)V)) {
      char b[64];
      fmt_index(tv, b, sizeof b);
      return ir_fail(err, errlen, "target %s at position %lld is out of range [0, %lld)", b,
                  (long long)p, (long long)V);
    }
    const double *row = lg->data + p * V;
    double m = -INFINITY, s = 0;
    for (int64_t j = 0; j < V; j++)
      if (row[j] > m) m = row[j];
    for (int64_t j = 0; j < V; j++) s += exp(row[j] - m);
    total += m + log(s) - row[(int64_t)tv];
  }
  out->data[0] = total / (double)P;
  return true;
}
