/* dsc public API: the reference interpreter.
 *
 * The oracle every backend and pass is tested against: runs a graph op by
 * op with plain loops. Every element is held as a double; after each op the
 * result is rounded to the precision of its dtype (f32, bf16, f16 by
 * round-to-nearest-even, integers exactly), so an f32 graph gets f32
 * results computed with f64 intermediates inside each op. */
#ifndef DSC_INTERP_H
#define DSC_INTERP_H

#include "dsc/comm.h"
#include "dsc/core.h"
#include "dsc/ir.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  dsc_type type;
  double *data; /* numel elements, row-major */
} dsc_tensor;

/* Kernel signature used by the op table (include/dsc/ops.def). `out` is
 * allocated with the node's type before the call. Returns false with a
 * message in err on a runtime error (e.g. an index out of range). */
typedef bool (*dsc_interp_kernel)(const dsc_node *n, const dsc_tensor *const *in, dsc_tensor *out,
                                  char *err, size_t errlen);

/* Tensors allocated with the context's allocator. */
dsc_tensor *dsc_tensor_new(dsc_context *ctx, dsc_type type); /* zero-filled */
void dsc_tensor_free(dsc_context *ctx, dsc_tensor *t);

/* The values of a module's parameters. */
typedef struct dsc_params dsc_params;
/* Initialises every parameter from its initializer, deterministically from
 * seed (see docs/ir.md for the generator). */
dsc_params *dsc_params_init(const dsc_module *m, uint64_t seed);
/* The same for rank `rank` of a sharded module (dsc_module_param_shard): a
 * sharded param holds the rank's chunk of the full tensor's initial values
 * (the same values at any world size), zeros past its end. */
dsc_params *dsc_params_init_rank(const dsc_module *m, uint64_t seed, int rank);
/* Every parameter zero, for values that come from elsewhere (a checkpoint):
 * no initializer runs (GPT-2's take seconds). */
dsc_params *dsc_params_zeros(const dsc_module *m);
void dsc_params_free(dsc_params *p);
int dsc_params_count(const dsc_params *p);
const dsc_module *dsc_params_module(const dsc_params *p); /* the module it was made for */
dsc_tensor *dsc_params_get(const dsc_params *p, int i); /* module's i-th param */
dsc_tensor *dsc_params_find(const dsc_params *p, const char *name);

/* Runs graph g. inputs[i] must match g's i-th input type; outputs receives
 * one new tensor per graph output (caller frees with dsc_tensor_free).
 * Nodes of op `assign` write their values into `params` after the whole
 * graph ran (every `param` read sees the values from before the run); on an
 * error nothing is written. Errors (type mismatch, index out of range, out
 * of memory) are reported as diagnostics on the module's context. */
dsc_status dsc_interp_run(const dsc_graph *g, const dsc_params *params,
                          const dsc_tensor *const *inputs, int n_inputs, dsc_tensor **outputs);

/* The training step (include/dsc/train.h). With grad_accum K > 1 the module
 * holds graph "micro_step" (pass accumulate) and a step is K runs of it on
 * rows [k*B, (k+1)*B) of the step's data inputs, then one run of
 * "train_step" on lr; with K 1 it is one run of "train_step".
 * dsc_step_micro_batches: K (1 without micro_step).
 * dsc_step_micro_inputs: micro-batch k's inputs as views into `inputs` (the
 * step's: data with K*B rows, then lr), then `first` (1 for k = 0): views
 * must hold n_inputs tensors; an error names an input of the wrong type.
 * dsc_interp_run_step: the whole step on the interpreter; outputs as
 * train_step's. At most DSC_MAX_STEP_INPUTS inputs. */
#define DSC_MAX_STEP_INPUTS 16
int64_t dsc_step_micro_batches(const dsc_module *m);
/* Whether module param i is one of pass accumulate's sums (state acc.<n>):
 * a gradient buffer rewritten by every step's first micro-batch (the memory
 * plan counts it as grads; checkpoints and offload leave it alone). */
bool dsc_step_is_sum(const dsc_module *m, int i);
dsc_status dsc_step_micro_inputs(const dsc_module *m, const dsc_tensor *const *inputs,
                                 int n_inputs, int64_t k, dsc_tensor *views, double *first);
dsc_status dsc_interp_run_step(const dsc_module *m, const dsc_params *params,
                               const dsc_tensor *const *inputs, int n_inputs,
                               dsc_tensor **outputs);

/* Options of a run; NULL means all defaults. */
typedef struct {
  /* Runs the collective ops (all_reduce_start, ...): each start calls the
   * matching dsc_comm_*_start on the f64 data with the node's tag, its wait
   * completes it. Required when the graph has collective ops; their world
   * attribute must equal the communicator's world. On an error during the
   * run the communicator is aborted (dsc_comm_abort) so that no rank hangs,
   * and every started collective is waited. */
  dsc_comm *comm;
} dsc_interp_options;

/* dsc_interp_run with options (dsc_interp_run passes NULL). */
dsc_status dsc_interp_run_with(const dsc_graph *g, const dsc_params *params,
                               const dsc_tensor *const *inputs, int n_inputs,
                               dsc_tensor **outputs, const dsc_interp_options *opts);

#ifdef __cplusplus
}
#endif
#endif
