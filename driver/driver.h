/* driver/: the top layer of the library. It drives the others in order
 * (frontend -> passes -> runtime) for whole jobs such as training and
 * sampling, so that no lower layer has to reach up. Public API:
 * include/dsc/trainer.h. Prefix drv_. */
#ifndef DSC_DRIVER_H
#define DSC_DRIVER_H

#include "codegen/codegen.h"
#include "dsc/exec.h"
#include "dsc/frontend.h"
#include "dsc/trainer.h"
#include "runtime/runtime.h"

/* ======================= driver/train.c =======================
 * The modules of a training run, shared with dsc compile (driver/program.c)
 * so that a .dsx holds exactly the graphs `dsc train MODEL.dsm` builds. */
typedef struct {
  int64_t B, T, vocab;
} drv_model_facts;
/* A .dsx path: the magic, or the extension (a renamed model file must then
 * fail as a program file, not be compiled as a model). */
bool drv_is_program(const char *path);
/* Compiles the step module of model `path` at batch B, seq T (0: the
 * model's), checks forward(tokens, targets) -> loss and the context. */
dsc_status drv_compile_step(dsc_context *ctx, const char *path, int64_t B, int64_t T,
                            dsc_module **m, drv_model_facts *f);
/* Runs the pipeline on the step module m (cfg: batch, seq, grad_accum,
 * precision, optimizer) and, when want_fwd, compiles the forward module at
 * cfg->batch x cfg->seq; both get the codegen passes unless backend is the
 * interpreter. */
dsc_status drv_build_graphs(dsc_context *ctx, const char *path, dsc_module *m,
                            const dsc_train_config *cfg, dsc_backend backend, bool want_fwd,
                            dsc_module **fwd);
/* train_step(tokens[rows, T], targets[rows, T], lr: f32[]) -> 2 or 3 outputs. */
dsc_status drv_check_step(dsc_context *ctx, const dsc_module *m, int64_t rows, int64_t T);

/* ======================= driver/plan.c =======================
 * The memory plan of step module m's train_step (codegen/memplan.c) with
 * the CPU runtime's GEMM scratch for `threads` (0: one per core, the
 * executor's default: drv_default_threads). */
int drv_default_threads(int threads);
dsc_status drv_plan_step(dsc_context *ctx, const dsc_module *m, int threads, cg_memplan *out);

#endif
