/* The disk tier's start/wait ops (include/dsc/ops.def, "disk tier
 * streaming"): shape rules, interpreter kernels and the verifier's check.
 * The interpreter (ir/interp.c) binds tier_read_start to the param's
 * current value, as it binds `param`, and commits tier_write_start's value
 * when the run completes, as it commits `assign`: so a graph with tier ops
 * computes exactly what the graph with param/assign computed. */
#include <stdio.h>
#include <string.h>

#include "ir/ir.h"

bool ir_is_tier_start(dsc_op op) {
  return op == DSC_OP_TIER_READ_START || op == DSC_OP_TIER_WRITE_START;
}

static bool tier_fail(char *err, size_t errlen, const char *msg, const char *name) {
  snprintf(err, errlen, msg, name);
  return false;
}

bool ir_shape_tier_read_start(const ir_node *n, dsc_type *out, char *err, size_t errlen) {
  if (n->n_in != 0) return tier_fail(err, errlen, "takes no inputs%s", "");
  const char *name = ir_attr_str(n, "name");
  const ir_param *p = name && n->graph ? ir_module_param(n->graph->module, name) : NULL;
  if (!p) return tier_fail(err, errlen, "unknown parameter or state '%s'", name ? name : "?");
  *out = p->type;
  return true;
}

bool ir_shape_tier_write_start(const ir_node *n, dsc_type *out, char *err, size_t errlen) {
  const char *name = ir_attr_str(n, "name");
  const ir_param *p = name && n->graph ? ir_module_param(n->graph->module, name) : NULL;
  if (!p) return tier_fail(err, errlen, "unknown parameter or state '%s'", name ? name : "?");
  if (!dsc_type_equal(&p->type, &n->in[0]->type)) {
    char want[128], got[128];
    dsc_type_format(&p->type, want, sizeof want);
    dsc_type_format(&n->in[0]->type, got, sizeof got);
    snprintf(err, errlen, "'%s' is %s but the written value is %s", name, want, got);
    return false;
  }
  *out = p->type;
  return true;
}

bool ir_shape_tier_wait(const ir_node *n, dsc_type *out, char *err, size_t errlen) {
  dsc_op want = n->op == DSC_OP_TIER_READ_WAIT ? DSC_OP_TIER_READ_START : DSC_OP_TIER_WRITE_START;
  if (n->in[0]->op != want)
    return tier_fail(err, errlen, "its input must be a %s", dsc_op_name(want));
  *out = n->in[0]->type;
  return true;
}

bool interp_tier_read_start(const dsc_node *n, const dsc_tensor *const *in, dsc_tensor *out,
                            char *err, size_t errlen) {
  IR_UNUSED(n), IR_UNUSED(in), IR_UNUSED(out);
  return ir_fail(err, errlen, "internal: tier reads are bound by the interpreter, not computed");
}

bool interp_tier_copy(const dsc_node *n, const dsc_tensor *const *in, dsc_tensor *out, char *err,
                      size_t errlen) {
  IR_UNUSED(n), IR_UNUSED(err), IR_UNUSED(errlen);
  memcpy(out->data, in[0]->data, sizeof(double) * (size_t)dsc_type_numel(&out->type));
  return true;
}

static const char *written_name(const ir_node *x) {
  if (x->op != DSC_OP_ASSIGN && x->op != DSC_OP_TIER_WRITE_START) return NULL;
  if (x->n_attrs != 1 || x->attrs[0].kind != DSC_ATTR_STR) return NULL;
  return x->attrs[0].u.s;
}

bool ir_find_tier_misuse(const ir_graph *g, const ir_node **bad, char *msg, size_t msglen) {
  for (int i = 0; i < g->n_nodes; i++) {
    const ir_node *x = g->nodes[i];
    if (!x) continue;
    for (int j = 0; j < x->n_in; j++) {
      const ir_node *s = x->in[j];
      if (!s || !ir_is_tier_start(s->op)) continue;
      bool ok = (s->op == DSC_OP_TIER_READ_START && x->op == DSC_OP_TIER_READ_WAIT) ||
                (s->op == DSC_OP_TIER_WRITE_START && x->op == DSC_OP_TIER_WRITE_WAIT);
      if (!ok) {
        *bad = x;
        snprintf(msg, msglen, "reads %%%d, a %s whose data is in flight (only its wait may)",
                 s->id, dsc_op_name(s->op));
        return true;
      }
      for (int k = 0; k < i; k++) /* one wait per start */
        if (g->nodes[k] && g->nodes[k]->op == x->op && g->nodes[k]->n_in == 1 &&
            g->nodes[k]->in[0] == s) {
          *bad = x;
          snprintf(msg, msglen, "%%%d (%s) already has a wait", s->id, dsc_op_name(s->op));
          return true;
        }
    }
    const char *name = written_name(x);
    for (int k = 0; name && k < i; k++) {
      const char *o = g->nodes[k] ? written_name(g->nodes[k]) : NULL;
      /* two assigns: the verifier's own check says so */
      if (o && strcmp(o, name) == 0 &&
          (x->op == DSC_OP_TIER_WRITE_START || g->nodes[k]->op == DSC_OP_TIER_WRITE_START)) {
        *bad = x;
        snprintf(msg, msglen, "'%s' is written twice in one graph (assign or tier_write_start)",
                 name);
        return true;
      }
    }
  }
  for (int k = 0; k < g->n_outputs; k++)
    if (g->outputs[k] && ir_is_tier_start(g->outputs[k]->op)) {
      *bad = g->outputs[k];
      snprintf(msg, msglen, "graph output %d is a %s whose data is in flight", k,
               dsc_op_name(g->outputs[k]->op));
      return true;
    }
  return false;
}
