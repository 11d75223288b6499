/* The host tier copies to_host and to_device (include/dsc/ops.def): the
 * value passes through unchanged, only its placement differs, so the shape
 * rule is the identity and the interpreter (which has no memory tiers)
 * copies. passes/offload_host.c inserts them; codegen/lower.c lowers each to
 * one CG_INS_COPY between the device WORK arena and the host work arena. */
#include <string.h>

#include "ir/ir.h"

bool ir_shape_transfer(const ir_node *n, dsc_type *out, char *err, size_t errlen) {
  IR_UNUSED(err), IR_UNUSED(errlen);
  *out = n->in[0]->type;
  return true;
}

bool interp_transfer(const dsc_node *n, const dsc_tensor *const *in, dsc_tensor *out, char *err,
                     size_t errlen) {
  IR_UNUSED(n), IR_UNUSED(err), IR_UNUSED(errlen);
  memcpy(out->data, in[0]->data, sizeof(double) * (size_t)dsc_type_numel(&out->type));
  return true;
}
