/* driver/: the top layer of the library. It drives the others in order
 * (frontend -> passes -> runtime) for whole jobs such as training and
 * sampling, so that no lower layer has to reach up. Public API:
 * include/dsc/trainer.h. Prefix drv_. */
#ifndef DSC_DRIVER_H
#define DSC_DRIVER_H

#include "codegen/codegen.h"
#include "dsc/autocfg.h"
#include "dsc/exec.h"
#include "dsc/frontend.h"
#include "dsc/memplan.h"
#include "dsc/trainer.h"
#include "runtime/runtime.h"

/* ======================= driver/exec_new.c =======================
 * The compile step the driver runs where it makes an executor: checks the
 * backend, compiles m for it (codegen/compile.c), hands the result to the
 * runtime (rt_exec_new). dsc_exec_new and dsc_exec_new_with_program are
 * this function. */
dsc_status drv_exec_new(dsc_module *m, const dsc_exec_options *opts, const dsc_program *program,
                        const char *program_module, dsc_exec **out);

/* ======================= driver/build.c =======================
 * The build steps every job shares (dsc train, plan, compile, sample,
 * offload auto, auto-configuration): the other driver files call these and
 * this file calls none of them but driver/cost.c (scripts/check-layers.sh
 * keeps it so). A .dsx thus holds exactly the graphs `dsc train MODEL.dsm`
 * builds, and a plan is of the step the trainer runs. */
/* The ranks of the mesh axes that share or split a model (--mesh). */
typedef struct {
  int64_t sp; /* sequence-parallel ranks (Ulysses): each holds T / sp positions */
  int64_t ep; /* expert-parallel ranks: each runs E / ep of every MoE layer's experts */
  int64_t tp; /* tensor-parallel ranks: each computes 1/tp of the heads and hidden units */
} drv_mesh_axes;

typedef struct {
  int64_t B, T, vocab;
  int64_t T_rank; /* the positions the step holds: T / sp (T without sp) */
} drv_model_facts;
/* A .dsx path: the magic, or the extension (a renamed model file must then
 * fail as a program file, not be compiled as a model). */
bool drv_is_program(const char *path);
/* The model file compiled with dims B and T bound where > 0; eval: for
 * validation and sampling (dropout off, no "dropout_seed" input). */
dsc_status drv_compile_model(dsc_context *ctx, const char *path, int64_t B, int64_t T, bool eval,
                             dsc_module **out);
/* The training step reads a "dropout_seed" input (i64 [K], one per
 * micro-batch) after the tokens and targets: the model has a dropout. */
bool drv_step_has_seed(const dsc_module *m);
/* forward(tokens: int[B, T], targets: int[B, T][, dropout_seed: i64[1]]) ->
 * scalar loss. */
dsc_status drv_check_forward(dsc_context *ctx, const char *path, const dsc_graph *g);
/* Compiles the step module of model `path` at batch B, seq T (0: the
 * model's), checks forward(tokens, targets) -> loss and the context. With
 * sequence parallelism over sp > 1 ranks the module holds T / sp positions
 * (f->T_rank; f->T is the whole sequence), which sp must divide. */
dsc_status drv_compile_step(dsc_context *ctx, const char *path, int64_t B, int64_t T, int64_t sp,
                            dsc_module **m, drv_model_facts *f);
/* Runs the pipeline on the step module m (cfg: batch, seq, grad_accum,
 * precision, optimizer) and, when want_fwd, compiles the forward module at
 * cfg->batch x cfg->seq; both get the codegen passes unless backend is the
 * interpreter. */
dsc_status drv_build_graphs(dsc_context *ctx, const char *path, dsc_module *m,
                            const dsc_train_config *cfg, dsc_backend backend, bool want_fwd,
                            dsc_module **fwd);
/* --mesh SPEC (NULL: data parallel only) for a job of `world` ranks: its
 * shape and the sizes of its axes besides dp (1: none). */
dsc_status drv_mesh(dsc_context *ctx, const char *spec, int64_t world, dsc_mesh_shape *shape,
                    drv_mesh_axes *axes);
/* The type of the step's data input i (tokens 0, targets 1) with all its
 * rows: micro_step's input x grad_accum when the step is a loop. */
dsc_type drv_step_input_type(const dsc_module *m, int i);
/* The step's graphs as the trainer runs them (driver/build.c's comment). */
dsc_status drv_check_step(dsc_context *ctx, const dsc_module *m, int64_t rows, int64_t T);
/* The memory plan of step module m's train_step (codegen/memplan.c) with
 * the CPU runtime's GEMM scratch for `threads` (0: one per core, the
 * executor's default: drv_default_threads). */
int drv_default_threads(int threads);
dsc_status drv_plan_step(dsc_context *ctx, const dsc_module *m, int threads, cg_memplan *out);
/* drv_plan_step that also summarises the lowered program for the cost
 * model into *work when work is not NULL (driver/cost.c). */
dsc_status drv_plan_step_work(dsc_context *ctx, const dsc_module *m, int threads, cg_memplan *out,
                              dsc_step_work *work);

/* ======================= driver/ds_config.c =======================
 * A DeepSpeed config file (dsc train|plan --deepspeed FILE) as a layer of
 * settings between the model's train section and the flags: each key
 * DeepSpeed defines becomes a train setting with DeepSpeed's meaning
 * (docs/deepspeed.md), applied to the step module's train.* metadata, so
 * the settings table checks it as any train section value. */
enum { DRV_DS_ABSENT, DRV_DS_AUTO, DRV_DS_GIVEN };
typedef struct {
  int state; /* DRV_DS_*: absent means DeepSpeed's default, auto the model's value */
  double v;
} drv_ds_opt_field;
typedef struct {
  const char *key;   /* the train setting: "zero.stage" */
  const char *value; /* in the train section's syntax: "3" */
  const char *from;  /* the ds_config key it came from: "zero_optimization.stage" */
  dsc_loc loc;       /* that key's place in the file */
  bool elements;     /* value is DeepSpeed's element count: bytes when applied */
} drv_ds_setting;
typedef struct {
  bool given;
  dsc_optimizer_kind kind;
  drv_ds_opt_field lr, beta1, beta2, eps, weight_decay, momentum;
  bool nesterov;
  dsc_loc loc;
  drv_ds_setting src[3]; /* optimizer, lr, weight_decay (key NULL: "auto") */
} drv_ds_opt;

typedef struct {
  bool given;
  dsc_schedule_kind kind; /* DSC_SCHED_WARMUP_LR ... _LR_RANGE_TEST */
  /* max_lr is the lr the schedule drives: warmup_max_lr, cycle_max_lr or
   * lr_range_test_min_lr; min_lr warmup_min_lr or cycle_min_lr */
  drv_ds_opt_field min_lr, max_lr, warmup, total, min_ratio, cos_min_ratio;
  /* OneCycle: cycle_{first,second}_step_size, _stair_count, decay_step_size,
   * decay_lr_rate, cycle_{min,max}_mom (read, not applied: cycle_momentum);
   * LRRangeTest: lr_range_test_step_size, _step_rate */
  drv_ds_opt_field first, second, first_stairs, second_stairs, decay_size, decay_rate;
  drv_ds_opt_field min_mom, max_mom, step_size, step_rate;
  bool linear;         /* warmup_type "linear" (DeepSpeed's default: log) */
  bool staircase;      /* lr_range_test_staircase */
  bool cycle_momentum; /* OneCycle's (DeepSpeed's default: true): warned of with Adam */
  dsc_loc loc, momentum_loc;
} drv_ds_sched;

#define DRV_DS_AUTO_MAX 32
typedef struct {
  const char *path;
  drv_ds_setting *set;
  int n, cap;
  /* the batch triple (0: not given, or "auto"): train_batch_size,
   * train_micro_batch_size_per_gpu, gradient_accumulation_steps */
  int64_t global, micro, accum;
  dsc_loc batch_loc[3];
  const char *offload_dir; /* offload_*.nvme_path */
  drv_ds_opt opt;           /* "optimizer", made a setting when applied */
  drv_ds_sched sched;       /* "scheduler", likewise */
  drv_ds_setting sched_src, sched_lr_src; /* --print-config's sources (key NULL: none) */
  /* "auto" values: left to the model and the flags, reported */
  struct {
    const char *path, *what;
  } autos[DRV_DS_AUTO_MAX];
  int n_auto;
} drv_ds_config;

/* Reads and checks FILE (errors and warnings name its line and column). */
dsc_status drv_ds_config_read(dsc_context *ctx, const char *path, ir_arena *arena,
                              drv_ds_config *out);
/* DeepSpeed's batch rule: train_batch_size = micro x accumulation x world;
 * any two give the third, a contradiction is an error with the arithmetic.
 * flag_micro / flag_accum (> 0) are the command line's, over the file's;
 * *micro / *accum: 0 where neither says (the model's train section). */
dsc_status drv_ds_config_batch(dsc_context *ctx, const drv_ds_config *c, int64_t world,
                               int64_t flag_micro, int64_t flag_accum, int64_t *micro,
                               int64_t *accum);
/* Writes the file's settings over module m's train.* metadata. */
dsc_status drv_ds_config_apply(dsc_context *ctx, const drv_ds_config *c, dsc_module *m);
/* The file's setting of train key `key`, or NULL. */
const drv_ds_setting *drv_ds_config_find(const drv_ds_config *c, const char *key);

/* ======================= driver/settings.c =======================
 * The run settings that override the model's train section, applied the
 * same way by dsc train (driver/train.c), dsc plan (driver/plan.c) and dsc
 * compile (driver/program.c): precision, grad_accum (or from the global
 * batch: global = B x grad_accum x world), the world and the run knobs
 * (include/dsc/settings.h: ZeRO's, the remat policy, the offload tiers).
 * Unset fields (0, NULL, has_ false) keep the section's values. Errors
 * start with `who` ("trainer", "plan", ...). */
typedef struct {
  const char *who;
  int64_t B, world, grad_accum;
  drv_mesh_axes mesh; /* the axes besides dp (zero: none) */
  const char *precision;
  const dsc_run_knobs *knobs; /* NULL: none set */
} drv_run_settings;
dsc_status drv_apply_run_settings(dsc_context *ctx, const drv_run_settings *s,
                                  dsc_train_config *cfg);

/* ======================= driver/limits.c ======================= */
/* Refuses more in-process ranks than runtime/limits.c allows (comm NULL or
 * another backend: nothing to check). */
dsc_status drv_check_ranks_here(dsc_context *ctx, const dsc_comm *comm);
/* The planned arenas of the ranks in this process against the memory
 * available, before the executor allocates them. */
dsc_status drv_check_step_memory(dsc_context *ctx, const cg_memplan *p, const dsc_comm *comm);

/* ======================= driver/offload_auto.c =======================
 * Adaptive offload (--offload-optimizer auto, --offload-param auto;
 * DeepCompile): plans the step (model `path` at cfg->batch x cfg->seq,
 * compiled afresh each time) without offload; while the device peak exceeds
 * `budget`, moves the candidate values (module states; param shards at
 * stage 3) whose next use is furthest from the peak instruction, then the
 * largest, to the host tier (disk when host_budget would be exceeded and
 * `disk`), and plans again. On success cfg->offload.values lists the choice
 * (in rep's arena) for the caller's pipeline run; *rep says what moved and
 * why. Nothing to do (rep->on false) unless a class is auto. A budget not
 * met with every candidate moved is an error naming what is still over. */
typedef struct {
  int64_t budget;      /* device bytes per rank (> 0) */
  int64_t host_budget; /* host bytes per rank; 0: no limit */
  bool disk;           /* the disk tier may be used (--offload-dir given) */
  int threads;         /* the plans' GEMM scratch threads (0: one per core) */
  bool lenient;        /* budget not met: keep the last choice, no error */
} drv_offload_budget;
typedef struct {
  bool on;
  int64_t peak_none, peak;   /* device peak planned without offload, and with the choice */
  int64_t host_bytes;        /* the final plan's host bytes */
  int n_candidates, n_plans;
  int n;                     /* values moved (values[0..n-1] of cfg, in the order chosen) */
  dsc_offload_value *values;
  int64_t *bytes, *next_use; /* per moved value */
  int64_t moved[3];          /* bytes moved per dsc_offload_tier */
  ir_arena arena;
} drv_offload_report;
dsc_status drv_offload_auto(dsc_context *ctx, const char *path, dsc_train_config *cfg,
                            const drv_offload_budget *b, drv_offload_report *rep);
void drv_offload_report_free(drv_offload_report *rep);
/* The report as one line ("offload auto: ...") in a, or NULL when off. */
char *drv_offload_report_text(ir_arena *a, const drv_offload_report *rep);
/* The report into a memory plan's offload_auto fields (include/dsc/memplan.h). */
void drv_offload_report_to_plan(const drv_offload_report *rep, dsc_memory_plan *out);
/* drv_offload_auto for a run (the trainer): the chosen list and the
 * report's line (*text, NULL when no class is auto) copied into `keep`. */
dsc_status drv_offload_auto_keep(dsc_context *ctx, const char *path, dsc_train_config *cfg,
                                 const drv_offload_budget *b, ir_arena *keep, char **text);

/* ======================= driver/cost.c =======================
 * The cost model's summary of a step program of `world` ranks: FLOPs and
 * collectives in program order (include/dsc/autocfg.h). */
/* Prepends `times` runs of micro's events to w (the grad_accum loop). */
dsc_status drv_step_work_repeat(dsc_context *ctx, const dsc_step_work *micro, int64_t times,
                                dsc_step_work *w);
dsc_status drv_step_work(dsc_context *ctx, const cg_program *p, int64_t world,
                         dsc_step_work *out);

#endif
