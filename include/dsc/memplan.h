/* dsc public API: the memory plan of a training run (dsc plan).
 *
 * dsc_plan_memory builds the step graph exactly as `dsc train` would (the
 * frontend, the training pipeline for the given world and ZeRO stage, the
 * lowering) and reads the lowered program's arenas: the bytes one rank
 * needs, by category, without allocating or running the model. The arenas
 * are the ones the CPU runtime allocates (codegen/memplan.c says how, and
 * defines the categories; docs/zero.md "Memory plan"). */
#ifndef DSC_MEMPLAN_H
#define DSC_MEMPLAN_H

#include "dsc/core.h"
#include "dsc/train.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  const char *model_path;         /* .dsm */
  int64_t batch, seq, grad_accum; /* 0: the model's */
  const char *precision;          /* "f32" "bf16" "fp16"; NULL: the model's */
  int64_t world;                  /* ranks; <= 1: one */
  /* the ranks' mesh ("dp=2,sp=4", dsc/mesh.h; NULL: data parallel): with
   * an sp axis the step holds seq / sp positions per rank (Ulysses) */
  const char *mesh;
  /* the run knobs over the model's train section, as dsc train's flags of
   * the same names (include/dsc/settings.h) */
  dsc_run_knobs knobs;
  int threads; /* CPU threads (GEMM scratch); 0: one per core */
  /* the disk tier's directory (NULL: none given) */
  const char *offload_dir;
  /* > 0: host memory per rank for the offloaded values (dsc plan --host-memory-budget) */
  int64_t host_memory_budget;
  /* > 0: device bytes per rank (--memory-budget); what offload auto fits */
  int64_t memory_budget;
  /* offload auto that cannot meet the budgets plans every candidate moved
   * instead of failing (the auto-configuration search: a candidate that
   * does not fit) */
  bool offload_auto_lenient;
  /* a DeepSpeed config (as dsc train --deepspeed), or NULL */
  const char *ds_config;
} dsc_plan_options;

/* Adaptive offload (offload "auto", driver/offload_auto.c): one value moved
 * off the device, in the order chosen. */
typedef struct {
  char name[96];      /* truncated past 95 characters */
  int tier;           /* dsc_offload_tier: host or disk */
  int64_t bytes;      /* this rank's bytes of the value */
  int64_t next_use;   /* instructions from the no-offload plan's peak to its next use */
} dsc_plan_offloaded;
#define DSC_PLAN_OFFLOADED_MAX 32

/* The collectives of one step, by group and kind: what dsc plan lists as
 * the step's communication. */
#define DSC_PLAN_COLL_MAX 16
typedef struct {
  char group[8]; /* "world" or a mesh axis ("dp", "ep", "sp", "tp") */
  char kind[16]; /* "all_reduce", "reduce_scatter", "all_gather", "broadcast", "all_to_all" */
  int64_t count; /* collectives per optimizer step (every micro-batch's included) */
  int64_t bytes; /* their inputs' bytes on one rank */
} dsc_plan_collective;

/* One rank's bytes; params + grads + optimizer + activations + workspace +
 * comm == peak. */
typedef struct {
  int64_t params, grads, optimizer, activations, workspace, comm, peak;
} dsc_plan_figures;

typedef struct {
  dsc_plan_figures rank; /* every rank runs the same program (SPMD): the same bytes */
  int64_t param_count;   /* Psi: trainable elements of the whole model */
  /* the most gradient bytes live at once during the step (rank.grads is
   * what is live at the peak): the paper's gradient term */
  int64_t grads_held;
  int64_t world, stage; /* as configured (at world 1 every stage runs as stage 0) */
  int64_t sp;           /* sequence-parallel ranks (1: none); seq / sp positions per rank */
  int64_t tp;           /* tensor-parallel ranks (1: none); 1/tp of the heads and hidden units */
  dsc_precision precision;
  dsc_optimizer_kind optimizer;
  /* bytes per param of the params (P), gradients (G) and optimizer states
   * (K) as the ZeRO paper counts them: f32 4 + 4 + K0, with master weights
   * (bf16/fp16) 2 + 2 + (4 + K0), K0 = adamw 8, sgd 4 with momentum else 0;
   * k_bytes -1 when not one number (muon) */
  int p_bytes, g_bytes, k_bytes;
  bool master_weights; /* bf16/fp16 params and grads, f32 master weights */
  int64_t batch, seq, grad_accum;
  /* the allocations: peak = state_arena + work_arena + gemm_scratch */
  int64_t state_arena, work_arena, gemm_scratch;
  int64_t padding;          /* arena alignment and WORK fragmentation (inside workspace) */
  int threads;              /* the GEMM scratch's thread count */
  int peak_instr, n_instrs; /* where the WORK arena's live bytes peak */
  /* sharded params/states: bytes of zero padding in rank 0's and the last
   * rank's shards (inside params and optimizer) */
  bool sharded;
  int64_t pad_params[2], pad_states[2];
  /* Offload tiers: one rank's bytes held in host memory and on disk (the
   * device figures above exclude them) */
  int64_t host_bytes, disk_bytes;
  /* of host_bytes: the host work arena (the host optimizer step's and
   * activation offload's temporaries: passes/offload_host.c) */
  int64_t host_work;
  /* Offload auto: the device peak planned without offload, the values auto
   * could move (candidates) and moved (n_offloaded; the first
   * DSC_PLAN_OFFLOADED_MAX of them in offloaded[]), their bytes per tier,
   * and the plans it took. */
  bool offload_auto;
  int64_t peak_no_offload;
  int auto_candidates, n_offloaded, auto_plans;
  int64_t offloaded_host, offloaded_disk;
  dsc_plan_offloaded offloaded[DSC_PLAN_OFFLOADED_MAX];
  /* the largest trainable param tensor (elements of its full shape): what
   * DeepSpeed's estimators call the largest layer */
  int64_t largest_param;
  char largest_name[128];
  /* the step's collectives by (group, kind), in order of first use */
  int n_collectives;
  dsc_plan_collective collectives[DSC_PLAN_COLL_MAX];
} dsc_memory_plan;

/* DeepSpeed's model-state estimators, as deepspeed.runtime.zero's
 * estimate_zero2_model_states_mem_needs (stage 2: cpu_offload) and
 * estimate_zero3_model_states_mem_needs (stage 3: cpu_offload,
 * cpu_offload_params, zero_init) compute them: bytes per CPU (host) and per
 * GPU for `psi` params, the largest layer's `largest`, on `nodes` x
 * `gpus_per_node`, with their additional_buffer_factor (1.5 by default). */
typedef struct {
  int64_t cpu, gpu;
} dsc_deepspeed_estimate;
dsc_deepspeed_estimate dsc_deepspeed_estimate_zero(int stage, int64_t psi, int64_t largest,
                                                    int64_t gpus_per_node, int64_t nodes,
                                                    bool cpu_offload, bool cpu_offload_params,
                                                    bool zero_init, double buffer_factor);

/* Every problem (no file, bad model, a stage the pipeline refuses) is a
 * diagnostic on ctx. */
dsc_status dsc_plan_memory(dsc_context *ctx, const dsc_plan_options *o, dsc_memory_plan *out);

#ifdef __cplusplus
}
#endif
#endif
