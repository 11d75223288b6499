/* dsc public API: training settings and the pass pipeline that turns a
 * forward graph into one training-step graph.
 *
 * After dsc_run_pipeline with the default pipeline the module holds graph
 * "train_step":
 *   inputs  the forward graph's inputs (one micro-batch), then `lr: f32[]`,
 *           the learning rate of this step (the host computes the schedule
 *           with dsc_lr_at); with grad_accum K > 1 (pass "accumulate") the
 *           micro-batch part is graph "micro_step" (the forward inputs, then
 *           `first: f32[]`), run K times, and train_step takes lr alone:
 *           run a whole step with dsc_exec_run_step / dsc_interp_run_step on
 *           inputs with K*B rows (micro-batch k is rows [k*B, (k+1)*B));
 *   outputs [loss: f32[] (mean over the micro-batches), grad_norm: f32[]
 *           (global L2 norm of the averaged gradients, before clipping)];
 *           at cfg->world > 1 (pass "zero") the averaged gradients and the
 *           loss are means over the ranks too (all_reduce start/wait pairs);
 *   state   optimizer states are module states named "opt.<what>.<param>"
 *           plus "opt.step" (f32[], steps taken); `assign` nodes write the
 *           new params and states, committed by the interpreter when the
 *           step has run.
 * The forward graph itself is removed (it is inlined into the step).
 *
 * Mixed precision (cfg->precision, pass "precision", docs/training.md): with
 * bf16 or fp16 the params are held in the low dtype with f32 master weights
 * in the optimizer states (cfg->master_weights) and the forward computes
 * in the low dtype (norms, softmax, losses and sum/mean in f32); the step's
 * inputs and outputs keep their types. fp16 adds dynamic loss scaling with
 * the states opt.loss_scale, opt.good_steps, opt.hysteresis_left and a third
 * output `skipped: f32[]` (1 when the step overflowed and was skipped: no
 * param or optimizer state changed, opt.step did not advance). f32 and bf16
 * steps have exactly the two outputs above. */
#ifndef DSC_TRAIN_H
#define DSC_TRAIN_H

#include "dsc/core.h"
#include "dsc/ir.h"
#include "dsc/settings.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { DSC_OPT_ADAMW, DSC_OPT_SGD, DSC_OPT_MUON } dsc_optimizer_kind;
typedef enum {
  DSC_SCHED_CONSTANT, /* lr (after warmup, if any) */
  DSC_SCHED_COSINE,   /* warmup, then cosine from lr to min_lr at decay_steps */
  DSC_SCHED_LINEAR,   /* warmup, then linear from lr to min_lr at decay_steps */
  /* DeepSpeed's schedulers, step for step as deepspeed.runtime.lr_schedules
   * (docs/deepspeed.md): lr is warmup_max_lr, min_lr warmup_min_lr, warmup
   * warmup_num_steps, decay_steps total_num_steps */
  DSC_SCHED_WARMUP_LR,        /* WarmupLR: min_lr to lr over warmup, then lr */
  DSC_SCHED_WARMUP_DECAY_LR,  /* WarmupDecayLR: then linear to 0 at decay_steps */
  DSC_SCHED_WARMUP_COSINE_LR, /* WarmupCosineLR: ratios of lr, cosine to cos_min_ratio */
  DSC_SCHED_ONE_CYCLE,        /* OneCycle: min_lr up to lr and back, then a decay */
  DSC_SCHED_LR_RANGE_TEST,    /* LRRangeTest: lr x (1 + step_rate x steps / step_size) */
} dsc_schedule_kind;
typedef enum {
  DSC_PRECISION_F32,  /* everything in f32 (the pass does nothing) */
  DSC_PRECISION_BF16, /* bf16 compute, f32 master weights */
  DSC_PRECISION_FP16, /* f16 compute, f32 master weights, dynamic loss scaling */
} dsc_precision;

/* "none", "selective", "blocks" or "block" (every block) or "blocks:K"
 * (every K blocks) or "offload" -> policy and K (1 unless given); 0 on success, -1
 * otherwise. */
int dsc_remat_parse(const char *name, dsc_remat_policy *out, int64_t *every);
int dsc_remat_from_name(const char *name, dsc_remat_policy *out); /* K ignored */
const char *dsc_remat_name(dsc_remat_policy p);

/* One value's tier (adaptive offload): param/state `name` lives in `tier`. */
typedef struct {
  const char *name;
  dsc_offload_tier tier; /* host or disk */
} dsc_offload_value;
/* "none", "host" or "cpu", "disk" or "nvme" (DeepSpeed's names), "auto" ->
 * tier; 0 on success, -1 otherwise. dsc_offload_name gives none, host,
 * disk, auto. */
int dsc_offload_from_name(const char *name, dsc_offload_tier *out);
const char *dsc_offload_name(dsc_offload_tier t);

typedef struct {
  int64_t batch, seq;   /* micro-batch size B and sequence length T */
  int64_t grad_accum;   /* micro-batches per optimizer step */
  int64_t steps;        /* optimizer steps of the whole run */
  uint64_t seed;
  int64_t eval_every;   /* 0: never */
  int64_t save_every;   /* 0: only at the end */
  int64_t log_every;    /* progress line every N steps */
  double clip;          /* global-norm gradient clipping; 0: off */
  struct {
    dsc_optimizer_kind kind;
    double lr;
    double beta1, beta2, eps; /* adamw (and muon's adamw part) */
    double weight_decay;      /* decoupled (adamw, muon); L2 for sgd */
    double momentum;          /* sgd, muon */
    bool nesterov;            /* sgd, muon */
    bool decay_1d;            /* apply weight decay to 1-D params too (default off) */
    double adam_lr;           /* muon: lr of the params trained by adamw; 0: lr */
  } opt;
  struct {
    dsc_schedule_kind kind;
    int64_t warmup;      /* linear warmup steps from 0 */
    double min_lr;
    int64_t decay_steps; /* 0: the run's steps */
    /* DeepSpeed's schedulers: a log (DeepSpeed's default) or linear warmup,
     * WarmupCosineLR's warmup_min_ratio and cos_min_ratio */
    bool warmup_log;
    double min_ratio, cos_min_ratio;
    /* OneCycle (lr is cycle_max_lr, min_lr cycle_min_lr): the steps of
     * the cycle's rising and falling halves, the stairs of each (0: no
     * stairs), then min_lr / (1 + decay_lr_rate x steps / decay_step_size)
     * (either 0: min_lr) */
    int64_t first_steps, second_steps, first_stairs, second_stairs, decay_step_size;
    double decay_lr_rate;
    /* LRRangeTest (lr is lr_range_test_min_lr): lr_range_test_step_size,
     * _step_rate, _staircase */
    int64_t step_size;
    double step_rate;
    bool staircase;
  } sched;
  dsc_precision precision; /* train.precision: f32 (default), bf16, fp16 */
  /* bf16/fp16 (train.master_weights, --master-weights; default true): the
   * trainable params and their gradients are held in the low dtype and the
   * optimizer keeps an f32 master copy of each, state "opt.master.<param>"
   * (sharded with the moments from stage 1), as DeepSpeed's bf16/fp16 and
   * the ZeRO paper's mixed-precision model states; false: f32 params and
   * gradients, the forward casts (PyTorch's autocast). */
  bool master_weights;
  /* DeepSpeed's wall_clock_breakdown (train.wall_clock_breakdown,
   * --wall-clock-breakdown): each step's time by phase, printed as
   * DeepSpeed's engine prints it (dsc_train_progress.breakdown) */
  bool wall_clock_breakdown;
  /* fp16 dynamic loss scaling (DeepSpeed's "fp16" settings) */
  struct {
    int64_t initial_scale_power; /* the scale starts at 2^this (16) */
    int64_t loss_scale_window;   /* good steps in a row before the scale doubles (1000) */
    int64_t hysteresis;          /* overflows tolerated before the scale halves (2) */
    double min_loss_scale;       /* the scale never goes below this (1) */
  } fp16;
  /* Data parallelism (pass "zero", docs/training.md "Data parallel"): the
   * step graph is one rank's program of `world` ranks (<= 1: one rank, the
   * pass does nothing). */
  int64_t world;
  /* Ulysses sequence parallelism (pass "sequence_parallel", --mesh sp=N):
   * the ranks of the mesh axis sp, which share each sequence, T/sp positions
   * each; the step graph holds one rank's part (<= 1: off). The ranks that
   * hold different sequences, the data-parallel ones, are world / sp. */
  int64_t sp;
  /* Expert parallelism (pass "expert_parallel", --mesh ep=N): the ranks of
   * the mesh axis ep, each running E / ep of every MoE layer's experts on
   * the tokens of all of them (<= 1: off). They are data-parallel ranks. */
  int64_t ep;
  /* Tensor parallelism (pass "tensor_parallel", --mesh tp=N): the ranks of
   * the mesh axis tp, each computing 1/tp of every attention's heads and
   * MLP's hidden units on the same sequences (<= 1: off). The ranks that
   * hold different sequences are world / (sp tp). */
  int64_t tp;
  /* Global batch in sequences, DeepSpeed's train_batch_size (train.
   * train_batch_size): batch x grad_accum x world; 0: not given. The trainer
   * infers grad_accum from it. */
  int64_t global_batch;
  struct {
    /* train.zero.stage (or train.zero_optimization.stage, as ds_config
     * spells it): 0 all-reduces the averaged gradients; 1 shards the
     * optimizer states, 2 also the gradients, 3 also the params (docs/zero.md).
     * Default 0. */
    int64_t stage;
    /* Pass "schedule": all_gathers in flight ahead of their use, at most
     * this many bytes (train.zero.prefetch_bytes, --prefetch-bytes; default
     * 64 MiB; 0: each gather starts right before its use). */
    int64_t prefetch_bytes;
    /* reduce_scatters merged into buckets of at most this many bytes
     * (train.zero.bucket_bytes, --bucket-bytes; default 25 MiB; 0: one per
     * gradient). */
    int64_t bucket_bytes;
    /* With grad_accum > 1 at stages 2-3 (pass "accumulate"): the gradients
     * are reduce-scattered after every micro-batch's backward into
     * shard-sized accumulation buffers (true, the default: DeepSpeed's
     * ZeRO-2/3), or once per step after the last micro-batch (false: 1/K the
     * communication, full-size buffers). Stages 0-1 reduce once per step, as
     * DeepSpeed does. train.zero.reduce_each_micro_batch. */
    bool reduce_each_micro_batch;
    /* stage 3: params of at most this many elements stay whole on every
     * rank, as DeepSpeed's stage3_param_persistence_threshold
     * (train.zero.persist_threshold, --persist-threshold; default 0: every
     * param is sharded, DeepSpeed's default is 100000). */
    int64_t persist_threshold;
    /* stage 3, selective unsharding (DeepCompile): params whose full bytes
     * fit in this budget, smallest first, are gathered once per micro-batch
     * and kept for the backward instead of gathered again
     * (train.zero.unshard_bytes, --unshard-bytes; default 0). */
    int64_t unshard_bytes;
  } zero;
  /* Activation checkpointing (pass "remat", train.checkpoint_activations,
   * --checkpoint-activations): none; selective (the backward recomputes
   * elementwise ops, views, norms and softmaxes; matmul and attention
   * outputs stay); block (only each block's input stays, the backward
   * recomputes the block), every remat_every blocks (train.checkpoint_every,
   * or "blocks:K"). Default none. */
  dsc_remat_policy remat;
  int64_t remat_every;
  /* Offload (pass "offload", docs/memory.md "Offload"): the tier of the
   * optimizer states and (ZeRO stage 3) of the param shards:
   * train.offload.optimizer / .param (none, host or cpu, disk or nvme),
   * --offload-optimizer / --offload-param. Default none (device). */
  struct {
    dsc_offload_tier optimizer, param;
    /* auto: the values chosen for the budget (driver/offload_auto.c), set
     * for the pipeline run, not read from the train section. Pass offload
     * gives each its tier; an auto class's other values stay on the device.
     * NULL (not chosen yet) with an auto class is an error of the pass. */
    const dsc_offload_value *values;
    int n_values;
    /* the disk tier's streaming (passes/offload_disk.c): bytes of reads in
     * flight ahead of their use (--offload-prefetch-bytes, default 64 MiB)
     * and IO threads per rank (--offload-io-threads, default 4) */
    int64_t prefetch_bytes;
    int64_t io_threads;
    /* ZeRO-Offload's delayed parameter update (train.offload.delayed_update,
     * --delayed-param-update; default false): each step applies the
     * previous step's gradient, kept in state "opt.delayed.<param>", so the
     * update does not wait for this step's backward; the first step updates
     * nothing (passes/optimizer.c, docs/memory.md) */
    bool delayed_update;
    /* The host's part of the step beside the device's
     * (train.offload.overlap, --offload-overlap; default auto): the copies
     * between the tiers and the host-placed kernels go to the executor's
     * host stream as soon as their inputs are final, and the device's work
     * waits for them only where it reads what they write or writes what
     * they read (runtime/exec_cpu.c). On the CPU the host and the device
     * are the same cores: auto gives the stream a thread of its own only
     * when the executor's threads leave a core free (else it would take
     * turns with them: measured slower, docs/memory.md), true always,
     * false never (one instruction at a time). Either way the numbers are
     * the same. */
    dsc_switch overlap;
  } offload;
  /* ZenFlow (train.zenflow.*, ds_config zero_optimization.zenflow;
   * passes/optimizer.c, docs/memory.md "ZenFlow"): with AdamW and
   * --offload-optimizer host, each 2-D param's most important columns (the
   * share topk_ratio, by the sum of |gradient|; chosen every select_interval
   * steps) are updated every step on the device; all gradients accumulate
   * on the host, which updates the rest every update_interval steps. The
   * first full_warm_up_rounds steps are plain steps. Default off. */
  struct {
    bool enabled;
    double topk_ratio;       /* in (0, 1); default 0.1 */
    int64_t select_interval; /* >= update_interval; default 4 */
    int64_t update_interval; /* >= 1; default 4 */
    int64_t warm_up;         /* full_warm_up_rounds; default 0 */
    bool overlap_step;       /* the host step beside the next steps: refused (not built) */
  } zenflow;
  /* This machine's rates for the schedule pass's time estimates
   * (passes/prefetch.c): f32 GEMM GFLOP/s, device memory GB/s and host <->
   * device copy GB/s; 0: the pass's defaults. dsc train sets them from the
   * host's calibration (dsc_calibrate's cache, as --auto writes it) when
   * it has one. */
  double gemm_gflops, mem_gbps, copy_gbps;
} dsc_train_config;

/* Defaults (documented in docs/training.md), then the module's train.*
 * metadata. Unknown or malformed settings are diagnostics. */
dsc_status dsc_train_config_from_module(const dsc_module *m, dsc_train_config *cfg);
/* The run knobs over cfg (dsc train, dsc plan, the auto-configuration):
 * each knob whose has_ flag is set is range-checked by the settings table
 * (include/dsc/settings.h) and stored; an error names `who` ("trainer",
 * "plan"), the knob, its flag and its train key. */
dsc_status dsc_run_knobs_apply(dsc_context *ctx, const char *who, const dsc_run_knobs *k,
                               dsc_train_config *cfg);
/* "f32", "bf16", "fp16"; NULL for a value out of range. */
const char *dsc_precision_name(dsc_precision p);
/* Returns 0 and sets *out when name is one of those (or "f16"). */
int dsc_precision_from_name(const char *name, dsc_precision *out);
/* The learning rate of optimizer step `step` (0-based). */
double dsc_lr_at(const dsc_train_config *cfg, int64_t step);

/* Sets the `tag` of every collective start of g (the trainer: the step
 * number, so that a failed collective names its step). Backends that copy
 * the tag when they compile (cpu) keep the value they were built with. */
void dsc_graph_set_collective_tags(dsc_graph *g, int64_t tag);

/* ---- the pass pipeline ---- */
typedef struct {
  const dsc_train_config *train; /* required by the optimizer pass */
  const char *stop_after;        /* NULL: run every pass; else stop after this one */
  bool print_after_all;          /* print the IR after each pass to `print_to` */
  FILE *print_to;
  bool verify_each;              /* verify after each pass (always in debug builds) */
} dsc_pipeline_options;

int dsc_pass_count(void);
const char *dsc_pass_name(int i);
const char *dsc_pass_description(int i);
/* Runs the default training pipeline in order. An unknown stop_after is a
 * diagnostic listing the pass names. */
dsc_status dsc_run_pipeline(dsc_module *m, const dsc_pipeline_options *opts);
/* Runs only the code generation passes (decompose, cse, fuse) on every graph of
 * m: what the cpu and cuda backends need for a module that skipped the
 * training pipeline (a forward-only module). */
dsc_status dsc_run_codegen_passes(dsc_module *m);

#ifdef __cplusplus
}
#endif
#endif
