/* passes/: the pass layer's internal vocabulary, sectioned by source file.
 * Passes transform IR modules in place; the public entry points are in
 * include/dsc/passes.h. */
#ifndef DSC_PASSES_INTERNAL_H
#define DSC_PASSES_INTERNAL_H

#include "dsc/passes.h"
#include "ir/ir.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ======================= passes/autodiff.c =======================
 * Reverse-mode differentiation of a graph whose single output is a rank-0
 * float loss. Appends the backward nodes to g and sets g's outputs to
 * [loss, d loss / d param 0, d loss / d param 1, ...] in module param order.
 * Only float values on a path from a param to the loss are differentiated
 * (integer and bool values cut the path). A param the loss does not depend
 * on gets a zero gradient and a warning. An op on a path without a gradient
 * rule is an error at the node's source location. On error g is unchanged. */
dsc_status pass_autodiff_run(ir_module *m, ir_graph *g);
/* Same with an explicit rule table (DSC_OP_COUNT entries, NULL = no rule);
 * pass_autodiff_run uses ir_grad_rules(). Tests use it to remove a rule. */
dsc_status pass_autodiff_run_with_rules(ir_module *m, ir_graph *g, const ir_grad_fn *rules);

#ifdef __cplusplus
}
#endif
#endif
