/* Shape rules: the output type of every op from its inputs and attributes.
 *
 * Each rule is called by the builder (dsc_build) before a node is appended
 * and by the verifier on parsed graphs, so it must not trust anything: it
 * checks arity, attribute presence and values, ranks and element counts,
 * and explains a rejection in err (the caller adds "op: " and a location). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "ir/ir.h"

/* Enough for "bool[" + 8 dims of 20 digits + commas + "]". */
#define TYPE_BUF 200

typedef struct {
  char s[TYPE_BUF];
} tybuf;

static tybuf fmt(const dsc_type *t) {
  tybuf b;
  dsc_type_format(t, b.s, sizeof b.s);
  return b;
}


#define FAIL(...) ir_fail(err, errlen, __VA_ARGS__)

/* Element count with overflow detection; false when a dim is negative or
 * the product does not fit in int64. */
static bool numel_ok(const dsc_type *t, int64_t *numel) {
  int64_t n = 1;
  for (int i = 0; i < t->rank; i++) {
    int64_t d = t->dims[i];
    if (d < 0) return false;
    if (d != 0 && n > INT64_MAX / d) return false;
    n *= d;
  }
  if (numel) *numel = n;
  return true;
}

/* Final checks shared by every rule: a valid dtype, rank and element count. */
static bool finish(const dsc_type *t, dsc_type *out, char *err, size_t errlen) {
  if ((unsigned)t->dtype >= DSC_DTYPE_COUNT) return FAIL("invalid dtype %d", (int)t->dtype);
  if (t->rank < 0 || t->rank > DSC_MAX_RANK)
    return FAIL("result rank %d exceeds the maximum rank %d", t->rank, DSC_MAX_RANK);
  for (int i = 0; i < t->rank; i++)
    if (t->dims[i] < 0) return FAIL("result dim %d is negative (%lld)", i, (long long)t->dims[i]);
  if (!numel_ok(t, NULL)) return FAIL("result %s has too many elements", fmt(t).s);
  *out = *t;
  return true;
}

static bool need_inputs(const ir_node *n, int k, char *err, size_t errlen) {
  if (n->n_in != k) return FAIL("takes %d input(s), got %d", k, n->n_in);
  for (int i = 0; i < k; i++)
    if (!n->in[i]) return FAIL("input %d is missing", i);
  return true;
}

static bool need_attr(const ir_node *n, const char *key, dsc_attr_kind kind, char *err,
                      size_t errlen) {
  const dsc_attr *a = ir_attr(n, key);
  if (!a || a->kind != kind) return FAIL("missing attribute '%s'", key);
  return true;
}

/* Builds a type from a shape attribute: rank <= DSC_MAX_RANK, dims > 0. */
static bool shape_attr(const ir_node *n, const char *key, dsc_dtype dt, dsc_type *t, char *err,
                       size_t errlen) {
  if (!need_attr(n, key, DSC_ATTR_INTS, err, errlen)) return false;
  int cnt;
  const int64_t *v = ir_attr_ints(n, key, &cnt);
  if (cnt < 0 || cnt > DSC_MAX_RANK)
    return FAIL("%s has %d dims; the maximum rank is %d", key, cnt, DSC_MAX_RANK);
  memset(t, 0, sizeof *t);
  t->dtype = dt;
  t->rank = cnt;
  for (int i = 0; i < cnt; i++) {
    if (v[i] <= 0) return FAIL("%s dim %d must be positive, got %lld", key, i, (long long)v[i]);
    t->dims[i] = v[i];
  }
  if (!numel_ok(t, NULL)) return FAIL("%s %s has too many elements", key, fmt(t).s);
  return true;
}

static bool valid_dtype(dsc_dtype dt) { return (unsigned)dt < DSC_DTYPE_COUNT; }

static bool check_axis(int64_t axis, int rank, char *err, size_t errlen) {
  if (axis < 0 || axis >= rank)
    return FAIL("axis %lld out of range for rank %d", (long long)axis, rank);
  return true;
}

static bool same_dtype(const dsc_type *a, const dsc_type *b, char *err, size_t errlen) {
  if (a->dtype != b->dtype) return FAIL("dtypes differ: %s and %s", fmt(a).s, fmt(b).s);
  return true;
}

static bool need_float(const dsc_type *t, const char *what, char *err, size_t errlen) {
  if (!dsc_dtype_is_float(t->dtype)) return FAIL("%s must be a float type, got %s", what, fmt(t).s);
  return true;
}

/* ---------------------------------------------------------------- sources */

bool ir_shape_input(const ir_node *n, dsc_type *out, char *err, size_t errlen) {
  if (n->n_in != 0) return FAIL("takes no inputs, got %d", n->n_in);
  return finish(&n->type, out, err, errlen);
}

bool ir_shape_param(const ir_node *n, dsc_type *out, char *err, size_t errlen) {
  if (n->n_in != 0) return FAIL("takes no inputs, got %d", n->n_in);
  if (!need_attr(n, "name", DSC_ATTR_STR, err, errlen)) return false;
  const char *name = ir_attr_str(n, "name");
  const ir_param *p = n->graph && n->graph->module ? ir_module_param(n->graph->module, name) : NULL;
  if (!p) return FAIL("unknown parameter '%s'", name);
  return finish(&p->type, out, err, errlen);
}

bool ir_shape_const(const ir_node *n, dsc_type *out, char *err, size_t errlen) {
  if (n->n_in != 0) return FAIL("takes no inputs, got %d", n->n_in);
  if (!need_attr(n, "value", DSC_ATTR_FLOAT, err, errlen) ||
      !need_attr(n, "dtype", DSC_ATTR_DTYPE, err, errlen))
    return false;
  dsc_dtype dt = ir_attr_dtype(n, "dtype");
  if (!valid_dtype(dt)) return FAIL("invalid dtype %d", (int)dt);
  dsc_type t;
  if (!shape_attr(n, "shape", dt, &t, err, errlen)) return false;
  return finish(&t, out, err, errlen);
}

bool ir_shape_iota(const ir_node *n, dsc_type *out, char *err, size_t errlen) {
  if (n->n_in != 0) return FAIL("takes no inputs, got %d", n->n_in);
  if (!need_attr(n, "axis", DSC_ATTR_INT, err, errlen) ||
      !need_attr(n, "dtype", DSC_ATTR_DTYPE, err, errlen))
    return false;
  dsc_dtype dt = ir_attr_dtype(n, "dtype");
  if (!valid_dtype(dt)) return FAIL("invalid dtype %d", (int)dt);
  if (dt == DSC_BOOL) return FAIL("dtype must not be bool");
  dsc_type t;
  if (!shape_attr(n, "shape", dt, &t, err, errlen)) return false;
  if (!check_axis(ir_attr_int(n, "axis"), t.rank, err, errlen)) return false;
  return finish(&t, out, err, errlen);
}

/* ---------------------------------------------------------------- elementwise */

static bool broadcast2(const dsc_type *a, const dsc_type *b, dsc_type *r, char *err,
                       size_t errlen) {
  if (!ir_broadcast_shapes(a, b, r))
    return FAIL("shapes %s and %s do not broadcast", fmt(a).s, fmt(b).s);
  return true;
}

bool ir_shape_binary(const ir_node *n, dsc_type *out, char *err, size_t errlen) {
  if (!need_inputs(n, 2, err, errlen)) return false;
  const dsc_type *a = &n->in[0]->type, *b = &n->in[1]->type;
  if (!same_dtype(a, b, err, errlen)) return false;
  if (a->dtype == DSC_BOOL) return FAIL("operands must not be bool, got %s", fmt(a).s);
  dsc_type r;
  if (!broadcast2(a, b, &r, err, errlen)) return false;
  return finish(&r, out, err, errlen);
}

bool ir_shape_rand24(const ir_node *n, dsc_type *out, char *err, size_t errlen) {
  if (!need_inputs(n, 2, err, errlen)) return false;
  const dsc_type *a = &n->in[0]->type, *b = &n->in[1]->type;
  if (a->dtype != DSC_I64 || b->dtype != DSC_I64)
    return FAIL("seed and counter must be i64, got %s and %s", fmt(a).s, fmt(b).s);
  dsc_type r;
  if (!broadcast2(a, b, &r, err, errlen)) return false;
  return finish(&r, out, err, errlen);
}

bool ir_shape_compare(const ir_node *n, dsc_type *out, char *err, size_t errlen) {
  if (!need_inputs(n, 2, err, errlen)) return false;
  const dsc_type *a = &n->in[0]->type, *b = &n->in[1]->type;
  if (!same_dtype(a, b, err, errlen)) return false;
  dsc_type r;
  if (!broadcast2(a, b, &r, err, errlen)) return false;
  r.dtype = DSC_BOOL;
  return finish(&r, out, err, errlen);
}

bool ir_shape_where(const ir_node *n, dsc_type *out, char *err, size_t errlen) {
  if (!need_inputs(n, 3, err, errlen)) return false;
  const dsc_type *c = &n->in[0]->type, *a = &n->in[1]->type, *b = &n->in[2]->type;
  if (c->dtype != DSC_BOOL) return FAIL("condition must be bool, got %s", fmt(c).s);
  if (!same_dtype(a, b, err, errlen)) return false;
  dsc_type ab, r;
  if (!broadcast2(a, b, &ab, err, errlen)) return false;
  if (!ir_broadcast_shapes(c, &ab, &r))
    return FAIL("shapes %s, %s and %s do not broadcast", fmt(c).s, fmt(a).s, fmt(b).s);
  r.dtype = a->dtype;
  return finish(&r, out, err, errlen);
}

bool ir_shape_unary(const ir_node *n, dsc_type *out, char *err, size_t errlen) {
  if (!need_inputs(n, 1, err, errlen)) return false;
  const dsc_type *x = &n->in[0]->type;
  if (x->dtype == DSC_BOOL) return FAIL("operand must not be bool, got %s", fmt(x).s);
  return finish(x, out, err, errlen);
}

bool ir_shape_unary_float(const ir_node *n, dsc_type *out, char *err, size_t errlen) {
  if (!need_inputs(n, 1, err, errlen)) return false;
  const dsc_type *x = &n->in[0]->type;
  if (!need_float(x, "operand", err, errlen)) return false;
  if (n->op == DSC_OP_POW && !need_attr(n, "exponent", DSC_ATTR_FLOAT, err, errlen)) return false;
  return finish(x, out, err, errlen);
}

bool ir_shape_cast(const ir_node *n, dsc_type *out, char *err, size_t errlen) {
  if (!need_inputs(n, 1, err, errlen)) return false;
  if (!need_attr(n, "dtype", DSC_ATTR_DTYPE, err, errlen)) return false;
  dsc_dtype dt = ir_attr_dtype(n, "dtype");
  if (!valid_dtype(dt)) return FAIL("invalid dtype %d", (int)dt);
  dsc_type r = n->in[0]->type;
  r.dtype = dt;
  return finish(&r, out, err, errlen);
}

/* ---------------------------------------------------------------- reductions */

bool ir_shape_reduce(const ir_node *n, dsc_type *out, char *err, size_t errlen) {
  if (!need_inputs(n, 1, err, errlen)) return false;
  if (!need_attr(n, "axes", DSC_ATTR_INTS, err, errlen) ||
      !need_attr(n, "keepdims", DSC_ATTR_BOOL, err, errlen))
    return false;
  const dsc_type *x = &n->in[0]->type;
  if (n->op == DSC_OP_MEAN && !need_float(x, "operand", err, errlen)) return false;
  if (n->op == DSC_OP_SUM && x->dtype == DSC_BOOL)
    return FAIL("operand must not be bool, got %s", fmt(x).s);
  int cnt;
  const int64_t *axes = ir_attr_ints(n, "axes", &cnt);
  bool keep = ir_attr_bool(n, "keepdims");
  bool reduced[DSC_MAX_RANK] = {false};
  for (int i = 0; i < cnt; i++) {
    if (!check_axis(axes[i], x->rank, err, errlen)) return false;
    if (i > 0 && axes[i] <= axes[i - 1])
      return FAIL("axes must be strictly increasing, got %lld after %lld", (long long)axes[i],
                  (long long)axes[i - 1]);
    reduced[axes[i]] = true;
  }
  dsc_type r;
  memset(&r, 0, sizeof r);
  r.dtype = x->dtype;
  for (int d = 0; d < x->rank; d++) {
    if (!reduced[d])
      r.dims[r.rank++] = x->dims[d];
    else if (keep)
      r.dims[r.rank++] = 1;
  }
  return finish(&r, out, err, errlen);
}

/* ---------------------------------------------------------------- layout */

bool ir_shape_reshape(const ir_node *n, dsc_type *out, char *err, size_t errlen) {
  if (!need_inputs(n, 1, err, errlen)) return false;
  const dsc_type *x = &n->in[0]->type;
  dsc_type r;
  if (!shape_attr(n, "shape", x->dtype, &r, err, errlen)) return false;
  int64_t nx, nr;
  if (!numel_ok(x, &nx) || !numel_ok(&r, &nr) || nx != nr)
    return FAIL("cannot reshape %s to %s: element counts differ", fmt(x).s, fmt(&r).s);
  return finish(&r, out, err, errlen);
}

bool ir_shape_permute(const ir_node *n, dsc_type *out, char *err, size_t errlen) {
  if (!need_inputs(n, 1, err, errlen)) return false;
  if (!need_attr(n, "perm", DSC_ATTR_INTS, err, errlen)) return false;
  const dsc_type *x = &n->in[0]->type;
  int cnt;
  const int64_t *perm = ir_attr_ints(n, "perm", &cnt);
  if (cnt != x->rank)
    return FAIL("perm has %d entries for rank %d input %s", cnt, x->rank, fmt(x).s);
  bool seen[DSC_MAX_RANK] = {false};
  dsc_type r = *x;
  for (int i = 0; i < cnt; i++) {
    if (!check_axis(perm[i], x->rank, err, errlen)) return false;
    if (seen[perm[i]])
      return FAIL("perm is not a permutation: axis %lld repeats", (long long)perm[i]);
    seen[perm[i]] = true;
    r.dims[i] = x->dims[perm[i]];
  }
  return finish(&r, out, err, errlen);
}

bool ir_shape_slice(const ir_node *n, dsc_type *out, char *err, size_t errlen) {
  if (!need_inputs(n, 1, err, errlen)) return false;
  if (!need_attr(n, "axis", DSC_ATTR_INT, err, errlen) ||
      !need_attr(n, "start", DSC_ATTR_INT, err, errlen) ||
      !need_attr(n, "end", DSC_ATTR_INT, err, errlen))
    return false;
  const dsc_type *x = &n->in[0]->type;
  int64_t axis = ir_attr_int(n, "axis"), start = ir_attr_int(n, "start"),
          end = ir_attr_int(n, "end");
  if (!check_axis(axis, x->rank, err, errlen)) return false;
  if (start < 0 || start >= end || end > x->dims[axis])
    return FAIL("slice [%lld, %lld) is not a non-empty range within [0, %lld) on axis %lld of %s",
                (long long)start, (long long)end, (long long)x->dims[axis], (long long)axis,
                fmt(x).s);
  dsc_type r = *x;
  r.dims[axis] = end - start;
  return finish(&r, out, err, errlen);
}

bool ir_shape_concat(const ir_node *n, dsc_type *out, char *err, size_t errlen) {
  if (n->n_in < 1) return FAIL("takes at least 1 input, got %d", n->n_in);
  for (int i = 0; i < n->n_in; i++)
    if (!n->in[i]) return FAIL("input %d is missing", i);
  if (!need_attr(n, "axis", DSC_ATTR_INT, err, errlen)) return false;
  const dsc_type *x0 = &n->in[0]->type;
  int64_t axis = ir_attr_int(n, "axis");
  if (!check_axis(axis, x0->rank, err, errlen)) return false;
  dsc_type r = *x0;
  for (int i = 1; i < n->n_in; i++) {
    const dsc_type *xi = &n->in[i]->type;
    if (!same_dtype(x0, xi, err, errlen)) return false;
    if (xi->rank != x0->rank)
      return FAIL("ranks differ: %s and %s (input %d)", fmt(x0).s, fmt(xi).s, i);
    for (int d = 0; d < x0->rank; d++)
      if (d != axis && xi->dims[d] != x0->dims[d])
        return FAIL("dim %d differs off the concat axis %lld: %s and %s (input %d)", d,
                    (long long)axis, fmt(x0).s, fmt(xi).s, i);
    if (xi->dims[axis] > INT64_MAX - r.dims[axis]) return FAIL("concatenated dim overflows");
    r.dims[axis] += xi->dims[axis];
  }
  return finish(&r, out, err, errlen);
}

bool ir_shape_broadcast(const ir_node *n, dsc_type *out, char *err, size_t errlen) {
  if (!need_inputs(n, 1, err, errlen)) return false;
  const dsc_type *x = &n->in[0]->type;
  dsc_type r;
  if (!shape_attr(n, "shape", x->dtype, &r, err, errlen)) return false;
  bool ok = x->rank <= r.rank;
  for (int i = 0; ok && i < x->rank; i++) {
    int64_t d = x->dims[x->rank - 1 - i], t = r.dims[r.rank - 1 - i];
    ok = d == t || d == 1;
  }
  if (!ok) return FAIL("cannot broadcast %s to %s", fmt(x).s, fmt(&r).s);
  return finish(&r, out, err, errlen);
}

bool ir_shape_embedding(const ir_node *n, dsc_type *out, char *err, size_t errlen) {
  if (!need_inputs(n, 2, err, errlen)) return false;
  const dsc_type *tab = &n->in[0]->type, *ids = &n->in[1]->type;
  if (!need_float(tab, "table", err, errlen)) return false;
  if (tab->rank != 2) return FAIL("table must have rank 2 [V, D], got %s", fmt(tab).s);
  if (ids->dtype != DSC_I32 && ids->dtype != DSC_I64)
    return FAIL("ids must be i32 or i64, got %s", fmt(ids).s);
  if (ids->rank + 1 > DSC_MAX_RANK)
    return FAIL("result rank %d exceeds the maximum rank %d", ids->rank + 1, DSC_MAX_RANK);
  dsc_type r = *ids;
  r.dtype = tab->dtype;
  r.dims[r.rank++] = tab->dims[1];
  return finish(&r, out, err, errlen);
}

/* ---------------------------------------------------------------- matmul */

bool ir_shape_matmul(const ir_node *n, dsc_type *out, char *err, size_t errlen) {
  if (!need_inputs(n, 2, err, errlen)) return false;
  const dsc_type *a = &n->in[0]->type, *b = &n->in[1]->type;
  if (a->rank < 2 || b->rank < 2)
    return FAIL("operands must have rank >= 2: %s x %s", fmt(a).s, fmt(b).s);
  if (!same_dtype(a, b, err, errlen)) return false;
  if (!need_float(a, "operands", err, errlen)) return false;
  if (a->dims[a->rank - 1] != b->dims[b->rank - 2])
    return FAIL("inner dims differ: %s x %s", fmt(a).s, fmt(b).s);
  dsc_type ba = *a, bb = *b, r;
  ba.rank -= 2;
  bb.rank -= 2;
  if (!ir_broadcast_shapes(&ba, &bb, &r))
    return FAIL("batch dims do not broadcast: %s x %s", fmt(a).s, fmt(b).s);
  r.dtype = a->dtype;
  r.dims[r.rank++] = a->dims[a->rank - 2];
  r.dims[r.rank++] = b->dims[b->rank - 1];
  return finish(&r, out, err, errlen);
}

/* ---------------------------------------------------------------- composites */

bool ir_shape_softmax(const ir_node *n, dsc_type *out, char *err, size_t errlen) {
  if (!need_inputs(n, 1, err, errlen)) return false;
  if (!need_attr(n, "axis", DSC_ATTR_INT, err, errlen)) return false;
  const dsc_type *x = &n->in[0]->type;
  if (!need_float(x, "operand", err, errlen)) return false;
  if (!check_axis(ir_attr_int(n, "axis"), x->rank, err, errlen)) return false;
  return finish(x, out, err, errlen);
}

/* x [..., D] with per-channel vectors of shape [D] and x's dtype. */
static bool norm_common(const ir_node *n, int n_vec, dsc_type *out, char *err, size_t errlen) {
  if (!need_inputs(n, 1 + n_vec, err, errlen)) return false;
  if (!need_attr(n, "eps", DSC_ATTR_FLOAT, err, errlen)) return false;
  const dsc_type *x = &n->in[0]->type;
  if (!need_float(x, "input", err, errlen)) return false;
  if (x->rank < 1) return FAIL("input must have rank >= 1, got %s", fmt(x).s);
  int64_t d = x->dims[x->rank - 1];
  static const char *names[] = {"weight", "bias"};
  for (int i = 0; i < n_vec; i++) {
    const dsc_type *v = &n->in[1 + i]->type;
    if (!same_dtype(x, v, err, errlen)) return false;
    if (v->rank != 1 || v->dims[0] != d)
      return FAIL("%s must be [%lld] to match input %s, got %s", names[i], (long long)d, fmt(x).s,
                  fmt(v).s);
  }
  if (ir_attr_float(n, "eps") < 0) return FAIL("eps must be non-negative");
  return finish(x, out, err, errlen);
}

bool ir_shape_layernorm(const ir_node *n, dsc_type *out, char *err, size_t errlen) {
  return norm_common(n, 2, out, err, errlen);
}

bool ir_shape_rmsnorm(const ir_node *n, dsc_type *out, char *err, size_t errlen) {
  return norm_common(n, 1, out, err, errlen);
}

/* q [B, T, H hd], k and v [B, S, KVH hd] of q's dtype, KVH dividing H; causal
 * needs S >= T (the queries are the last T positions). */
bool ir_shape_attention(const ir_node *n, dsc_type *out, char *err, size_t errlen) {
  if (!need_inputs(n, 3, err, errlen)) return false;
  if (!need_attr(n, "heads", DSC_ATTR_INT, err, errlen) ||
      !need_attr(n, "kv_heads", DSC_ATTR_INT, err, errlen) ||
      !need_attr(n, "causal", DSC_ATTR_BOOL, err, errlen) ||
      !need_attr(n, "scale", DSC_ATTR_FLOAT, err, errlen) ||
      !need_attr(n, "window", DSC_ATTR_INT, err, errlen))
    return false;
  const dsc_type *q = &n->in[0]->type, *k = &n->in[1]->type, *v = &n->in[2]->type;
  if (!need_float(q, "q", err, errlen)) return false;
  if (q->rank != 3) return FAIL("q must have rank 3 [B, T, C], got %s", fmt(q).s);
  if (k->rank != 3 || !dsc_type_equal(k, v) || k->dtype != q->dtype || k->dims[0] != q->dims[0])
    return FAIL(
        "k and v must have one type [B, S, C_kv] with q's batch and dtype, got q %s, "
        "k %s and v %s",
        fmt(q).s, fmt(k).s, fmt(v).s);
  int64_t heads = ir_attr_int(n, "heads"), kvh = ir_attr_int(n, "kv_heads");
  if (heads <= 0 || q->dims[2] % heads != 0)
    return FAIL("heads %lld does not divide the channel dim %lld of %s", (long long)heads,
                (long long)q->dims[2], fmt(q).s);
  if (kvh <= 0 || heads % kvh != 0)
    return FAIL("kv_heads %lld must divide heads %lld", (long long)kvh, (long long)heads);
  int64_t hd = q->dims[2] / heads;
  if (k->dims[2] != kvh * hd)
    return FAIL("k and v %s must have kv_heads x head dim = %lld x %lld = %lld channels", fmt(k).s,
                (long long)kvh, (long long)hd, (long long)(kvh * hd));
  if (ir_attr_bool(n, "causal") && k->dims[1] < q->dims[1])
    return FAIL(
        "causal attention needs at least as many keys as queries, got %lld keys for "
        "%lld queries",
        (long long)k->dims[1], (long long)q->dims[1]);
  double scale = ir_attr_float(n, "scale");
  if (!(scale > 0) || !isfinite(scale)) return FAIL("scale must be positive, got %g", scale);
  int64_t window = ir_attr_int(n, "window");
  if (window < 0 || (window > 0 && !ir_attr_bool(n, "causal")))
    return FAIL("window must be 0 (none) or positive with causal attention, got %lld%s",
                (long long)window, ir_attr_bool(n, "causal") ? "" : " (not causal)");
  return finish(q, out, err, errlen);
}

/* x [..., T, heads hd] float with hd even; positions integer, its shape x's
 * without the last axis or a right-aligned part of it with 1 for broadcast. */
bool ir_shape_rope(const ir_node *n, dsc_type *out, char *err, size_t errlen) {
  if (!need_inputs(n, 2, err, errlen)) return false;
  if (!need_attr(n, "heads", DSC_ATTR_INT, err, errlen) ||
      !need_attr(n, "theta", DSC_ATTR_FLOAT, err, errlen) ||
      !need_attr(n, "interleaved", DSC_ATTR_BOOL, err, errlen))
    return false;
  const dsc_type *x = &n->in[0]->type, *p = &n->in[1]->type;
  if (!need_float(x, "x", err, errlen)) return false;
  if (x->rank < 2 || x->rank > DSC_MAX_RANK - 2)
    return FAIL("x must have rank 2 to %d [..., T, C], got %s", DSC_MAX_RANK - 2, fmt(x).s);
  int64_t heads = ir_attr_int(n, "heads"), C = x->dims[x->rank - 1];
  if (heads <= 0 || C % heads != 0 || (C / heads) % 2 != 0)
    return FAIL("heads %lld must split the channel dim %lld of %s into heads of an even size",
                (long long)heads, (long long)C, fmt(x).s);
  double theta = ir_attr_float(n, "theta");
  if (!(theta > 1) || !isfinite(theta)) return FAIL("theta must be above 1, got %g", theta);
  if (!need_attr(n, "factor", DSC_ATTR_FLOAT, err, errlen) ||
      !need_attr(n, "low_freq_factor", DSC_ATTR_FLOAT, err, errlen) ||
      !need_attr(n, "high_freq_factor", DSC_ATTR_FLOAT, err, errlen) ||
      !need_attr(n, "original_context", DSC_ATTR_INT, err, errlen))
    return false;
  double factor = ir_attr_float(n, "factor"), lo = ir_attr_float(n, "low_freq_factor"),
         hi = ir_attr_float(n, "high_freq_factor");
  if (!(factor >= 1) || !isfinite(factor))
    return FAIL("factor must be at least 1 (1: no scaling), got %g", factor);
  if (factor > 1 && !(lo > 0 && hi > lo && isfinite(hi) && ir_attr_int(n, "original_context") > 0))
    return FAIL(
        "scaled frequencies need 0 < low_freq_factor < high_freq_factor and a positive "
        "original_context, got %g, %g and %lld",
        lo, hi, (long long)ir_attr_int(n, "original_context"));
  if (p->dtype != DSC_I32 && p->dtype != DSC_I64)
    return FAIL("positions must be i32 or i64, got %s", fmt(p).s);
  bool ok = p->rank <= x->rank - 1;
  for (int i = 1; ok && i <= p->rank; i++) {
    int64_t pd = p->dims[p->rank - i], xd = x->dims[x->rank - 1 - i];
    ok = pd == xd || pd == 1;
  }
  if (!ok)
    return FAIL("positions %s must broadcast to the shape of x %s without its last axis", fmt(p).s,
                fmt(x).s);
  return finish(x, out, err, errlen);
}

bool ir_shape_dropout(const ir_node *n, dsc_type *out, char *err, size_t errlen) {
  if (!need_inputs(n, 2, err, errlen)) return false;
  if (!need_attr(n, "p", DSC_ATTR_FLOAT, err, errlen) ||
      !need_attr(n, "stream", DSC_ATTR_INT, err, errlen))
    return false;
  const dsc_type *x = &n->in[0]->type, *s = &n->in[1]->type;
  if (!need_float(x, "x", err, errlen)) return false;
  if (s->dtype != DSC_I64 || dsc_type_numel(s) != 1 || s->rank > 1)
    return FAIL("seed must be i64[] or i64[1], got %s", fmt(s).s);
  double p = ir_attr_float(n, "p");
  if (!(p >= 0 && p < 1)) return FAIL("p must be in [0, 1), got %g", p);
  int64_t stream = ir_attr_int(n, "stream");
  if (stream < 0 || stream >= IR_DROPOUT_MAX_STREAMS)
    return FAIL("stream %lld is outside [0, %d): a model has at most %d dropouts",
                (long long)stream, IR_DROPOUT_MAX_STREAMS, IR_DROPOUT_MAX_STREAMS);
  int64_t numel;
  if (!numel_ok(x, &numel) || numel > ((int64_t)1 << IR_DROPOUT_STREAM_SHIFT))
    return FAIL("x %s has more than 2^%d elements, dropout's counter per stream", fmt(x).s,
                IR_DROPOUT_STREAM_SHIFT);
  return finish(x, out, err, errlen);
}

bool ir_shape_cross_entropy(const ir_node *n, dsc_type *out, char *err, size_t errlen) {
  if (!need_inputs(n, 2, err, errlen)) return false;
  const dsc_type *lg = &n->in[0]->type, *tg = &n->in[1]->type;
  if (!need_float(lg, "logits", err, errlen)) return false;
  if (lg->rank < 1) return FAIL("logits must have rank >= 1, got %s", fmt(lg).s);
  if (tg->dtype != DSC_I32 && tg->dtype != DSC_I64)
    return FAIL("targets must be i32 or i64, got %s", fmt(tg).s);
  bool ok = tg->rank == lg->rank - 1;
  for (int i = 0; ok && i < tg->rank; i++) ok = tg->dims[i] == lg->dims[i];
  if (!ok)
    return FAIL("targets %s must have the shape of logits %s without the last axis", fmt(tg).s,
                fmt(lg).s);
  dsc_type r;
  memset(&r, 0, sizeof r);
  r.dtype = lg->dtype;
  return finish(&r, out, err, errlen);
}
