/* dsc public API: the model description language (.dsm files).
 *
 * Parses a model file, checks names, types and shapes, and lowers it into an
 * IR module: one graph `forward` (the model's forward function, with every
 * function inlined and block loops unrolled), the parameters (block params
 * named "<block>.<index>.<param>"), and the `train` section as metadata keys
 * "train.<key>". Symbolic dims (B, T, ...) in the forward signature are bound
 * from `bindings`; when a binding is absent, B and T fall back to the train
 * section's `batch` and `seq`. */
#ifndef DSC_FRONTEND_H
#define DSC_FRONTEND_H

#include "dsc/core.h"
#include "dsc/ir.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  const char *name;
  int64_t value;
} dsc_dim_binding;

typedef struct {
  const dsc_dim_binding *dims;
  int n_dims;
  /* Evaluation (validation, sampling): every dropout is the identity and the
   * graph has no DSC_DROPOUT_SEED input. Training (false): a model with a
   * dropout of p > 0 gets that input, i64[1], after its own. */
  bool eval;
} dsc_frontend_options;

/* The name of the graph input that carries dropout's seed. */
#define DSC_DROPOUT_SEED "dropout_seed"

/* Reads and compiles a model file. Diagnostics (file:line:col) go to ctx.
 * On success *out is a verified module owned by the caller. */
dsc_status dsc_compile_file(dsc_context *ctx, const char *path, const dsc_frontend_options *opts,
                            dsc_module **out);
/* Same, from text in memory; `file` names it in diagnostics and resolves
 * relative imports (relative to the current directory when NULL). */
dsc_status dsc_compile_string(dsc_context *ctx, const char *text, size_t len, const char *file,
                              const dsc_frontend_options *opts, dsc_module **out);

#ifdef __cplusplus
}
#endif
#endif
