/* dsc public API: passes over an IR module. */
#ifndef DSC_PASSES_H
#define DSC_PASSES_H

#include "dsc/core.h"
#include "dsc/ir.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Reverse-mode autodiff of graph `graph_name`, whose single output must be
 * a rank-0 float loss. Appends the backward computation to the graph and
 * sets its outputs to [loss, gradient of param 0, gradient of param 1, ...]
 * in the module's param order (each gradient has its param's type). A param
 * the loss does not depend on gets a zero gradient and a warning. Errors
 * (no such graph, a non-scalar loss, an op without a gradient rule on the
 * path from a param to the loss) are diagnostics on the module's context;
 * the graph is then left unchanged. */
dsc_status dsc_autodiff(dsc_module *m, const char *graph_name);

#ifdef __cplusplus
}
#endif
#endif
