/* The training step's micro-batches (pass accumulate, include/dsc/interp.h):
 * with grad_accum K > 1 a step is K runs of graph "micro_step" on rows
 * [k*B, (k+1)*B) of the step's inputs, then one run of "train_step" on lr.
 * The views here are shared by the interpreter and every executor. */
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"

int64_t dsc_step_micro_batches(const dsc_module *m) {
  const char *v = m ? dsc_module_get_meta(m, "accumulate.steps") : NULL;
  if (!v || !dsc_module_find_graph(m, "micro_step")) return 1;
  char *end;
  long long k = strtoll(v, &end, 10);
  return *end == 0 && k >= 1 ? (int64_t)k : 1;
}

bool dsc_step_is_sum(const dsc_module *m, int i) {
  return i >= 0 && i < m->n_params && m->params[i].state &&
         strncmp(m->params[i].name, "acc.", 4) == 0;
}

dsc_status dsc_step_micro_inputs(const dsc_module *m, const dsc_tensor *const *inputs,
                                 int n_inputs, int64_t k, dsc_tensor *views, double *first) {
  const dsc_graph *g = dsc_module_find_graph(m, "micro_step");
  int64_t K = dsc_step_micro_batches(m);
  dsc_context *ctx = m->ctx;
  int n_data = g ? g->n_inputs - 1 : 0;
  if (!g || n_inputs != n_data + 1 || k < 0 || k >= K) {
    ir_error(ctx, ir_no_loc,
             "training step: %d inputs given, the step takes %d (the micro-batches' data, then lr)",
             n_inputs, n_data + 1);
    return DSC_ERR_USER;
  }
  for (int i = 0; i < n_data; i++) {
    const dsc_type *mt = &g->inputs[i]->type;
    const dsc_tensor *t = inputs[i];
    bool ok = t && t->type.dtype == mt->dtype && t->type.rank == mt->rank && mt->rank >= 1 &&
              t->type.dims[0] == mt->dims[0] * K;
    for (int d = 1; ok && d < mt->rank; d++) ok = t->type.dims[d] == mt->dims[d];
    if (!ok) {
      char want[128], got[128];
      dsc_type full = *mt;
      if (full.rank >= 1) full.dims[0] *= K;
      dsc_type_format(&full, want, sizeof want);
      if (t) dsc_type_format(&t->type, got, sizeof got);
      ir_error(ctx, ir_no_loc,
               "training step: input %d ('%s') is %s, expected %s (grad_accum %lld micro-batches "
               "of %lld rows)",
               i, g->inputs[i]->name, t ? got : "missing", want, (long long)K,
               (long long)mt->dims[0]);
      return DSC_ERR_USER;
    }
    views[i].type = *mt;
    views[i].data = t->data + k * dsc_type_numel(mt);
  }
  *first = k == 0 ? 1.0 : 0.0;
  views[n_data].type = dsc_type_make(DSC_F32, 0, NULL);
  views[n_data].data = first;
  return DSC_OK;
}

dsc_status dsc_interp_run_step(const dsc_module *m, const dsc_params *params,
                               const dsc_tensor *const *inputs, int n_inputs,
                               dsc_tensor **outputs) {
  const dsc_graph *step = dsc_module_find_graph(m, "train_step");
  int64_t K = dsc_step_micro_batches(m);
  if (!step) {
    ir_error(m->ctx, ir_no_loc, "training step: the module has no graph 'train_step'");
    return DSC_ERR_USER;
  }
  if (K == 1) return dsc_interp_run(step, params, inputs, n_inputs, outputs);
  const dsc_graph *micro = dsc_module_find_graph(m, "micro_step");
  dsc_tensor views[DSC_MAX_STEP_INPUTS];
  const dsc_tensor *vp[DSC_MAX_STEP_INPUTS];
  if (n_inputs > DSC_MAX_STEP_INPUTS) {
    ir_error(m->ctx, ir_no_loc, "training step: more than %d inputs", DSC_MAX_STEP_INPUTS);
    return DSC_ERR_USER;
  }
  for (int k = 0; k < n_inputs; k++) vp[k] = &views[k];
  for (int64_t k = 0; k < K; k++) {
    double first;
    dsc_status st = dsc_step_micro_inputs(m, inputs, n_inputs, k, views, &first);
    dsc_tensor *loss = NULL;
    if (st == DSC_OK) st = dsc_interp_run(micro, params, vp, n_inputs, &loss);
    dsc_tensor_free(m->ctx, loss);
    if (st != DSC_OK) return st;
  }
  return dsc_interp_run(step, params, &inputs[n_inputs - 1], 1, outputs);
}
