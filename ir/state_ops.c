/* The `assign` op: shape rule and interpreter kernel. The interpreter's run
 * loop commits assigned values into the params after the whole graph ran. */
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
