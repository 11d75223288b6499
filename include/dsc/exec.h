/* dsc public API: executing a module's graphs on a backend.
 *
 * An executor owns the values of a module's params and states in the
 * backend's native form (f32 arrays for the CPU backend, device memory for
 * CUDA) and runs any of the module's graphs on them. dsc_params (doubles)
 * stay the canonical host copy used for initialisation and checkpoints:
 * copy them in with dsc_exec_set_params, out with dsc_exec_get_params.
 *
 *   interp  the reference interpreter (include/dsc/interp.h), always built
 *   cpu     LLVM-JIT kernels on a thread pool + oneDNN GEMMs (DSC_HAVE_LLVM)
 *   cuda    NVRTC kernels + cuBLASLt on an NVIDIA GPU (DSC_HAVE_CUDA)
 *
 * The cpu and cuda backends need every graph fused first (the pipeline's
 * "fuse" pass: dsc_run_pipeline without stop_after). */
#ifndef DSC_EXEC_H
#define DSC_EXEC_H

#include "dsc/core.h"
#include "dsc/interp.h"
#include "dsc/ir.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { DSC_BACKEND_INTERP, DSC_BACKEND_CPU, DSC_BACKEND_CUDA } dsc_backend;

/* "interp" "cpu" "cuda"; dsc_backend_from_name returns 0 on success. */
const char *dsc_backend_name(dsc_backend b);
int dsc_backend_from_name(const char *name, dsc_backend *out);
/* Whether this build has the backend (interp: always). */
bool dsc_backend_available(dsc_backend b);
/* The default: cpu where it is built, else interp. */
dsc_backend dsc_backend_default(void);

typedef struct {
  dsc_backend backend;
  int threads;           /* cpu: worker threads; 0 = one per core */
  const char *cache_dir; /* on-disk kernel cache; NULL: $DSC_CACHE_DIR if set, else none */
} dsc_exec_options;

typedef struct dsc_exec dsc_exec;

/* Compiles every graph of m for the backend. Params and states start as
 * zeros: call dsc_exec_set_params before the first run. m must outlive the
 * executor and must not change while it lives. */
dsc_status dsc_exec_new(dsc_module *m, const dsc_exec_options *opts, dsc_exec **out);
void dsc_exec_free(dsc_exec *e);
dsc_backend dsc_exec_backend(const dsc_exec *e);

/* Copies every param and state in (p from dsc_params_init(m, ...)) or out. */
dsc_status dsc_exec_set_params(dsc_exec *e, const dsc_params *p);
dsc_status dsc_exec_get_params(dsc_exec *e, dsc_params *p);

/* Runs graph `graph` (by name) as dsc_interp_run does: inputs must match
 * the graph's input types, outputs receives one new tensor per graph output
 * (free with dsc_tensor_free), `assign`s update the executor's params and
 * states when the run completed (on an error nothing is updated). */
dsc_status dsc_exec_run(dsc_exec *e, const char *graph, const dsc_tensor *const *inputs,
                        int n_inputs, dsc_tensor **outputs);

/* Per-instruction timing of the compiled backends (off by default; the
 * interpreter has none). dsc_exec_print_profile prints graph's `top`
 * slowest instructions (kernel launches, GEMMs, ...) with their share of
 * the time, summed over the runs since profiling was switched on, plus a
 * total per instruction kind. */
void dsc_exec_set_profiling(dsc_exec *e, bool on);
dsc_status dsc_exec_print_profile(dsc_exec *e, const char *graph, int top, FILE *out);

#ifdef __cplusplus
}
#endif
#endif
