/* The interpreter as an executor backend (runtime/runtime.h rt_executor):
 * the oracle. Its values are doubles (dsc_params); it compiles nothing, and
 * its collectives reach the communicator through ir_collectives
 * (runtime/interp_comm.c). */
#include <string.h>

#include "runtime/runtime.h"

typedef struct {
  dsc_module *m;
  dsc_params *params; /* the values themselves */
  dsc_comm *comm;     /* not owned */
} interp_exec;

static bool interp_available(void) { return true; }

static dsc_status interp_create(const rt_exec_args *a, void **impl) {
  dsc_context *ctx = dsc_module_context(a->m);
  interp_exec *x = ir_alloc(ctx, sizeof *x);
  if (!x) return DSC_ERR_INTERNAL;
  memset(x, 0, sizeof *x);
  x->m = a->m;
  if (!(x->params = dsc_params_init(a->m, 0))) {
    ir_free(ctx, x, sizeof *x);
    return DSC_ERR_INTERNAL;
  }
  *impl = x;
  return DSC_OK;
}

static void interp_destroy(void *impl) {
  interp_exec *x = impl;
  dsc_params_free(x->params);
  ir_free(dsc_module_context(x->m), x, sizeof *x);
}

static dsc_status copy_values(interp_exec *x, dsc_params *dst, const dsc_params *src) {
  for (int i = 0; i < dsc_module_param_count(x->m); i++) {
    dsc_tensor *s = dsc_params_get(src, i), *d = dsc_params_get(dst, i);
    memcpy(d->data, s->data, sizeof(double) * (size_t)dsc_type_numel(&s->type));
  }
  return DSC_OK;
}

static dsc_status interp_set_params(void *impl, const dsc_params *p) {
  interp_exec *x = impl;
  return copy_values(x, x->params, p);
}

static dsc_status interp_get_params(void *impl, dsc_params *p) {
  interp_exec *x = impl;
  return copy_values(x, p, x->params);
}

static dsc_status interp_set_param(void *impl, int i, const dsc_tensor *t) {
  interp_exec *x = impl;
  memcpy(dsc_params_get(x->params, i)->data, t->data,
         sizeof(double) * (size_t)dsc_type_numel(&t->type));
  return DSC_OK;
}

static dsc_params *interp_values(void *impl) { return ((interp_exec *)impl)->params; }

static dsc_status interp_run(void *impl, int graph, const dsc_tensor *const *inputs, int n_inputs,
                             dsc_tensor **outputs) {
  interp_exec *x = impl;
  dsc_interp_options io = {x->comm};
  return dsc_interp_run_with(dsc_module_graph(x->m, graph), x->params, inputs, n_inputs, outputs,
                             &io);
}

static dsc_status interp_set_comm(void *impl, dsc_comm *comm) {
  ((interp_exec *)impl)->comm = comm;
  return DSC_OK;
}

const rt_executor rt_exec_interp = {
    .name = "interp",
    .id = DSC_BACKEND_INTERP,
    .available = interp_available,
    .not_built = "backend interp is always built in",
    .run_label = "interpreter",
    .create = interp_create,
    .destroy = interp_destroy,
    .set_params = interp_set_params,
    .get_params = interp_get_params,
    .set_param = interp_set_param,
    .values = interp_values,
    .run = interp_run,
    .set_comm = interp_set_comm,
};
