/* passes/: the pass layer's internal vocabulary, sectioned by source file.
 * Passes transform IR modules in place; the public entry points are in
 * include/dsc/passes.h. */
#ifndef DSC_PASSES_INTERNAL_H
#define DSC_PASSES_INTERNAL_H

#include "dsc/passes.h"
#include "dsc/train.h"
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

/* ======================= passes/ir_util.c =======================
 * Graph surgery shared by passes. */
/* Appends a copy of every node of `src` (same module) to `dst`: src's i-th
 * input becomes inputs[i] (a node of dst), other nodes are cloned with their
 * types, attributes and source locations (no shape rule runs: the types are
 * already checked). outs[k] receives the clone of src's k-th output.
 * Returns false (with a diagnostic) when out of memory. */
bool pass_inline_graph(ir_graph *dst, const ir_graph *src, ir_node *const *inputs, ir_node **outs);
/* Removes graph `name` from the module (its nodes stay in the arena).
 * Returns false when there is no such graph. */
bool pass_remove_graph(ir_module *m, const char *name);

/* ======================= passes/optimizer.c =======================
 * Builds the training-step graph "train_step" from graph "forward" (run
 * through autodiff first when it still has one output) as include/dsc/train.h
 * describes: grad_accum micro-batches, gradient averaging, global norm,
 * clipping, the optimizer update (adamw, sgd, muon) with its states and the
 * `assign`s. Removes "forward". On error "train_step" is removed again, but
 * states already created stay (callers discard the module). */
dsc_status pass_optimizer_run(ir_module *m, const dsc_train_config *cfg);

/* ======================= passes/precision.c =======================
 * Mixed precision (cfg->precision): rebuilds graph "forward" (one output,
 * before autodiff) so that it computes in bf16 or f16 with the params kept
 * in f32; norms, softmax, losses and sum/mean stay in f32; the outputs keep
 * their types. fp16 also creates state opt.loss_scale and scales the loss
 * by it. f32 (or cfg NULL): nothing changes. On error "forward" is
 * unchanged. */
dsc_status pass_precision_run(ir_module *m, const dsc_train_config *cfg);
/* Checks cfg->fp16's loss-scaling settings (a diagnostic when invalid). */
bool pass_precision_check_fp16(ir_module *m, const dsc_train_config *cfg);

/* ======================= passes/pass_manager.c =======================
 * The default pipeline is a table of rows {name, description, run}; a new
 * pass is one row. dsc_run_pipeline (include/dsc/train.h) runs them in
 * order, verifying after each one (always in builds without NDEBUG). */
typedef dsc_status (*pass_run_fn)(ir_module *m, const dsc_pipeline_options *opts);

#ifdef __cplusplus
}
#endif
#endif
