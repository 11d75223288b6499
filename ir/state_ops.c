/* The state ops: `assign` (the interpreter's run loop commits assigned
 * values into the params after the whole graph ran) and `set_rows` (a
 * state's rows replaced: the KV cache's write). Shape rules and
 * interpreter kernels. */
#include <stdio.h>
#include <string.h>

#include "ir/ir.h"

bool ir_shape_assign(const ir_node *n, dsc_type *out, char *err, size_t errlen) {
  const char *name = ir_attr_str(n, "name");
  const ir_param *p = ir_module_param(n->graph->module, name);
  if (!p) {
    snprintf(err, errlen, "unknown parameter or state '%s'", name);
    return false;
  }
  if (!dsc_type_equal(&p->type, &n->in[0]->type)) {
    char want[128], got[128];
    dsc_type_format(&p->type, want, sizeof want);
    dsc_type_format(&n->in[0]->type, got, sizeof got);
    snprintf(err, errlen, "'%s' is %s but the assigned value is %s", name, want, got);
    return false;
  }
  *out = p->type;
  return true;
}

bool interp_assign(const dsc_node *n, const dsc_tensor *const *in, dsc_tensor *out, char *err,
                   size_t errlen) {
  IR_UNUSED(n), IR_UNUSED(err), IR_UNUSED(errlen);
  memcpy(out->data, in[0]->data, sizeof(double) * (size_t)dsc_type_numel(&out->type));
  return true;
}

bool ir_shape_set_rows(const ir_node *n, dsc_type *out, char *err, size_t errlen) {
  const dsc_type *x = &n->in[0]->type, *ids = &n->in[1]->type, *rows = &n->in[2]->type;
  char a[128], b[128], c[128];
  dsc_type_format(x, a, sizeof a);
  dsc_type_format(ids, b, sizeof b);
  dsc_type_format(rows, c, sizeof c);
  if (x->rank != 2 || !dsc_dtype_is_float(x->dtype))
    return ir_fail(err, errlen, "x must be a float matrix [P, C], got %s", a);
  if (ids->rank != 1 || (ids->dtype != DSC_I32 && ids->dtype != DSC_I64))
    return ir_fail(err, errlen, "ids must be i32 or i64 [N], got %s", b);
  if (rows->rank != 2 || rows->dtype != x->dtype || rows->dims[0] != ids->dims[0] ||
      rows->dims[1] != x->dims[1])
    return ir_fail(err, errlen, "rows must be %s [N = %lld, C = %lld] like x %s, got %s",
                   dsc_dtype_name(x->dtype), (long long)ids->dims[0], (long long)x->dims[1], a, c);
  *out = *x;
  return true;
}

bool interp_set_rows(const dsc_node *n, const dsc_tensor *const *in, dsc_tensor *out, char *err,
                     size_t errlen) {
  IR_UNUSED(n), IR_UNUSED(err), IR_UNUSED(errlen);
  int64_t P = out->type.dims[0], C = out->type.dims[1], N = in[1]->type.dims[0];
  memcpy(out->data, in[0]->data, sizeof(double) * (size_t)(P * C));
  for (int64_t i = 0; i < N; i++) {
    double id = in[1]->data[i];
    if (id >= 0 && id < (double)P)
      memcpy(out->data + (int64_t)id * C, in[2]->data + i * C, sizeof(double) * (size_t)C);
  }
  return true;
}
