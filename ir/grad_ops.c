/* Ops that exist for the backward pass: shape rules and reference kernels.
 *
 * embedding_grad(ids: i32/i64 [...], dy: float [..., D]) {rows} -> [rows, D]
 *   the scatter-add adjoint of embedding: row r of the result is the sum of
 *   the dy rows at every position whose id is r (repeated ids accumulate). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "ir/ir.h"


bool ir_shape_embedding_grad(const ir_node *n, dsc_type *out, char *err, size_t errlen) {
  if (n->n_in != 2 || !n->in[0] || !n->in[1])
    return ir_fail(err, errlen, "takes 2 input(s), got %d", n->n_in);
  const dsc_attr *rows = ir_attr(n, "rows");
  if (!rows || rows->kind != DSC_ATTR_INT) return ir_fail(err, errlen, "missing attribute 'rows'");
  const dsc_type *ids = &n->in[0]->type, *dy = &n->in[1]->type;
  char a[128], b[128];
  dsc_type_format(ids, a, sizeof a);
  dsc_type_format(dy, b, sizeof b);
  if (ids->dtype != DSC_I32 && ids->dtype != DSC_I64)
    return ir_fail(err, errlen, "ids must be i32 or i64, got %s", a);
  if (!dsc_dtype_is_float(dy->dtype))
    return ir_fail(err, errlen, "dy must be a float type, got %s", b);
  bool ok = dy->rank == ids->rank + 1;
  for (int i = 0; ok && i < ids->rank; i++) ok = ids->dims[i] == dy->dims[i];
  if (!ok) return ir_fail(err, errlen, "dy %s must have the shape of ids %s plus one axis", b, a);
  if (rows->u.i <= 0)
    return ir_fail(err, errlen, "rows must be positive, got %lld", (long long)rows->u.i);
  dsc_type r;
  memset(&r, 0, sizeof r);
  r.dtype = dy->dtype;
  r.rank = 2;
  r.dims[0] = rows->u.i;
  r.dims[1] = dy->dims[dy->rank - 1];
  if (r.dims[1] > 0 && r.dims[0] > INT64_MAX / r.dims[1])
    return ir_fail(err, errlen, "result has too many elements");
  *out = r;
  return true;
}

bool interp_embedding_grad(const dsc_node *n, const dsc_tensor *const *in, dsc_tensor *out,
                           char *err, size_t errlen) {
  IR_UNUSED(n);
  const dsc_tensor *ids = in[0], *dy = in[1];
  int64_t V = out->type.dims[0], D = out->type.dims[1], cnt = dsc_type_numel(&ids->type);
  memset(out->data, 0, sizeof(double) * (size_t)(V * D));
  for (int64_t p = 0; p < cnt; p++) {
    double v = ids->data[p];
    if (!(v >= 0 && v < (double)V)) {
      if (v == trunc(v) && fabs(v) < 9e15)
        return ir_fail(err, errlen, "id %lld at position %lld is out of range [0, %lld)", (long long)v,
                    (long long)p, (long long)V);
      return ir_fail(err, errlen, "id %g at position %lld is out of range [0, %lld)", v, (long long)p,
                  (long long)V);
    }
    double *row = out->data + (int64_t)v * D;
    const double *src = dy->data + p * D;
    for (int64_t j = 0; j < D; j++) row[j] += src[j];
  }
  return true;
}
