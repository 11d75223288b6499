/* dsc public API: the training loop and sampling, as library calls.
 *
 * A trainer compiles a model file, runs the training pipeline (train.h) to
 * get the "train_step" graph, feeds it batches from a token shard and runs it
 * with the reference interpreter; params and optimizer states are updated in
 * place by the graph's `assign` nodes. Validation runs the model's forward
 * graph (a second module compiled from the same file) on the same parameter
 * values. Checkpoints hold the trainable params (model.safetensors), the
 * optimizer states (optimizer.safetensors) and the step, loader position and
 * run settings (state.json), so that a resumed run continues bit for bit.
 * The model may also be a .dsx program file (dsc_program_compile below):
 * its modules are used as they are, without the pipeline, and its kernels
 * are loaded instead of compiled where they fit the host.
 *
 * Nothing here prints: progress goes to a callback, errors are diagnostics. */
#ifndef DSC_TRAINER_H
#define DSC_TRAINER_H

#include <signal.h>

#include "dsc/core.h"
#include "dsc/exec.h"
#include "dsc/infer.h"
#include "dsc/interp.h"
#include "dsc/ir.h"
#include "dsc/trace.h"
#include "dsc/train.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  /* When resuming, NULL / 0 here means the checkpoint's value: model, data,
   * batch, seq, grad_accum, steps, lr, seed (batch, seq, grad_accum must
   * agree with it when given). */
  const char *model_path;  /* .dsm, or a .dsx from dsc_program_compile (by its magic) */
  const char *data_prefix; /* PREFIX_train.bin (+ PREFIX_val.bin if it exists) */
  const char *out_dir;     /* checkpoints and metrics.jsonl; NULL: none (resume: its dir) */
  const char *resume;      /* a checkpoint (OUT or OUT/step-N) to continue from, or NULL */
  /* A Hugging Face model directory whose weights start the run instead of
   * the model's initializers (dsc_hf_import; the optimizer starts fresh);
   * NULL: none. Not with resume. */
  const char *init_from;
  const char *log_path;    /* extra copy of this run's JSON lines, or NULL */
  /* Overrides of the model's train section; 0 keeps the section's value
   * (save_every / eval_every: -1 keeps, 0 sets "only at the end" / "never"). */
  int64_t batch, seq, grad_accum, steps, log_every;
  int64_t save_every, eval_every;
  double lr; /* <= 0 keeps */
  bool has_seed;
  uint64_t seed;
  int64_t eval_batches; /* validation batches per evaluation; 0: 8 */
  int64_t stop_at;      /* > 0: checkpoint and stop once this many steps are done */
  int keep_last;        /* checkpoints kept (dsc_checkpoint_save); 0: all */
  const char *precision; /* "f32", "bf16", "fp16" (train.precision); NULL keeps */
  const char *backend;   /* "interp", "cpu", "cuda" (include/dsc/exec.h); NULL: the default */
  int threads;           /* cpu backend worker threads; 0: one per core */
  bool profile;          /* time every instruction of the step (dsc_trainer_print_profile) */
  /* Data parallelism (docs/training.md "Data parallel"): this trainer is
   * rank dsc_comm_rank(comm) of dsc_comm_world(comm); NULL: a single rank.
   * Every rank opens a trainer with the same options. Each step reads the
   * global batch of batch x grad_accum x world sequences (the same ones
   * whatever the world) and rank r trains on rows [r*B*K, (r+1)*B*K); the
   * step graph averages gradients and loss over the ranks (pass "zero").
   * Rank 0 alone writes out_dir (checkpoints, metrics.jsonl), log_path and
   * runs validation; every rank's steps report the same (global) loss. */
  dsc_comm *comm;
  /* The ranks' mesh ("dp=2,sp=2", dsc/mesh.h; NULL: data parallel over all
   * of them). An sp axis is Ulysses sequence parallelism (pass
   * "sequence_parallel"): the sp ranks of a dp row train on the same
   * sequences, each on its T / sp positions, so the global batch is batch x
   * grad_accum x (world / sp) sequences of seq tokens. An ep axis is expert
   * parallelism (pass "expert_parallel"): its ranks are data-parallel ranks
   * that each run 1/ep of every MoE layer's experts. */
  const char *mesh;
  /* The run knobs over the train section (include/dsc/settings.h): the
   * global batch (DeepSpeed's train_batch_size: grad_accum becomes
   * global_batch / (batch x world), which must divide evenly and agree with
   * an explicit grad_accum), ZeRO's stage and sizes, activation
   * checkpointing, the offload tiers and the disk tier's streaming; each
   * where its has_ flag is set. */
  dsc_run_knobs knobs;
  /* > 0: bytes one rank's training step may allocate (cpu backend: its
   * arenas, as dsc plan computes them); a step that needs more is refused
   * before anything is allocated, with what does not fit */
  int64_t memory_budget;
  /* Chrome trace (include/dsc/trace.h) of this rank (pid = rank): the
   * executors' events plus a span per step (step track), data loading and
   * checkpoint writes (copy track), validation (step track) and the
   * trainer's own stop-flag all-reduce (comm track, category "control").
   * NULL: off. Not owned; it must outlive the trainer. */
  dsc_trace *trace;
  /* the disk tier's directory (required for offload to disk) */
  const char *offload_dir;
  /* > 0: bytes of host memory one rank's offloaded values may take (the
   * host arena plus the disk tier's staging), checked like memory_budget */
  int64_t host_memory_budget;
  /* A DeepSpeed config (ds_config.json; docs/deepspeed.md), or NULL: its
   * keys with DeepSpeed's meaning, over the model's train section and
   * under the options and knobs above. */
  const char *ds_config;
} dsc_trainer_options;

/* Resolves the settings of a run as dsc_trainer_open would (compiling the
 * model, reading the ds_config and a checkpoint to resume) and prints each
 * with its value and where it came from (default, the model's train
 * section, the ds_config's key and line, a flag), without training, for
 * rank 0 of `world` ranks. */
dsc_status dsc_trainer_print_config(dsc_context *ctx, const dsc_trainer_options *opts, int world,
                                    FILE *out);

typedef struct dsc_trainer dsc_trainer;

/* What a run is: for the header the CLI prints. */
typedef struct {
  const char *model_name, *model_path, *data_train, *data_val; /* data_val NULL: none */
  int64_t n_params;                                            /* trainable elements */
  int64_t n_state;                                             /* optimizer state elements */
  int64_t vocab;
  int64_t train_tokens, val_tokens;
  int64_t start_step;       /* > 0 when resumed */
  const char *resumed_from; /* the step directory read, or NULL */
  const dsc_train_config *cfg;
  const char *program_path; /* the model is a .dsx program file (absolute), or NULL */
  int kernels_compiled;     /* kernels the executors compiled (cpu backend) */
  int kernels_prebuilt;     /* kernels loaded from the .dsx instead */
  int rank, world;          /* data parallelism: this trainer's rank of world (0 of 1) */
  int64_t global_batch;     /* sequences per step: batch x grad_accum x world / sp */
  const char *mesh;         /* "dp=2,sp=2" with an axis besides dp, else NULL */
  /* Memory (cpu backend; 0 otherwise): the plan's peak (dsc plan: STATE +
   * WORK arenas + GEMM scratch of the step) and the process's RSS growth
   * over creating the step executor plus its first step (-1: unknown), the
   * part the plan predicts; set once the first step has run. */
  int64_t mem_planned, mem_rss_growth;
  /* What of mem_rss_growth the trainer can name (-1: unknown): the step
   * executor's arenas as resident after the first step (the pages it
   * touched), its GEMM packing scratch resident, its kernels' object bytes,
   * and the malloc heap's growth over the same two windows (LLVM's compile,
   * bookkeeping; glibc), and the kernel compile's growth outside the heap
   * (its worker threads' stacks, LLVM's own mappings). The rest (the
   * executor's threads, libraries' lazy pages) is mem_rss_growth minus these. */
  int64_t mem_arenas_touched, mem_gemm_scratch, mem_kernel_code, mem_heap, mem_compile;
  /* Offload (cpu backend): of mem_planned, the host arena (host-tier values);
   * the disk tier's staging (held during a step only) and file bytes */
  int64_t mem_host, mem_disk_staging, mem_disk_file;
  /* --offload-optimizer/--offload-param auto: one line saying what was
   * offloaded for the memory budget ("offload auto: ..."); NULL otherwise */
  const char *offload_auto;
  /* --init-from: the tensor bytes this rank read from the directory (under
   * ZeRO-3 only its chunk of each sharded param); 0 otherwise */
  int64_t import_bytes;
} dsc_trainer_info;

/* One finished optimizer step. step counts completed steps (1..steps), as
 * the checkpoint directories do. */
typedef struct {
  int64_t step, steps;
  double loss, lr, grad_norm;
  double ms, tokens_per_s;
  bool has_val;
  double val_loss;
  bool saved; /* a checkpoint of this step was written */
  bool skipped; /* precision fp16: the step overflowed and changed nothing */
  /* train.wall_clock_breakdown on a compiled backend: the step's time by
   * phase (include/dsc/exec.h), summed over its micro-batches (runs: how
   * many); the first step's includes the executor's warm-up */
  bool has_breakdown;
  dsc_phase_times breakdown;
} dsc_train_progress;

typedef struct {
  int64_t steps_done, steps_run;    /* total, and in this call */
  double final_loss, best_val_loss; /* best_val_loss NaN when never evaluated */
  double seconds, tokens_per_s;
  bool stopped;                /* *stop was set: checkpointed and left early */
  const char *last_checkpoint; /* step directory written last, or NULL */
} dsc_train_summary;

/* Compiles, builds the step graph, initialises (or restores) params and
 * states and opens the shards. Every problem is a diagnostic; nothing is
 * written before training starts except the (created) out_dir. */
dsc_status dsc_trainer_open(dsc_context *ctx, const dsc_trainer_options *opts, dsc_trainer **out);
void dsc_trainer_free(dsc_trainer *t);
const dsc_trainer_info *dsc_trainer_get_info(const dsc_trainer *t);
/* The parameter values (trainable params and states of the step module). */
/* The params and states as of the last step (copied from the backend). */
/* The step's slowest instructions (options.profile; compiled backends). */
dsc_status dsc_trainer_print_profile(dsc_trainer *t, int top, FILE *out);
const dsc_params *dsc_trainer_params(dsc_trainer *t);

/* One optimizer step (grad_accum micro-batches). dsc_trainer_run writes
 * the JSON lines (metrics.jsonl, log_path), one per step. */
dsc_status dsc_trainer_step(dsc_trainer *t, dsc_train_progress *p);
/* Mean loss over the first eval_batches batches of the validation shard. */
dsc_status dsc_trainer_evaluate(dsc_trainer *t, double *val_loss);
/* Checkpoint of the current step into out_dir. With ZeRO sharding (stages
 * 1-3 at world > 1) a collective: every rank calls it and writes its shards
 * (dsc_checkpoint_save_sharded). */
dsc_status dsc_trainer_save(dsc_trainer *t);
/* ZeRO stages 1-3: gathers the full params and states from every rank's
 * shards (a collective: every rank calls it); evaluate and save read them
 * until the next step. Without sharding it only copies from the backend. */
dsc_status dsc_trainer_gather(dsc_trainer *t);
/* The full value of param/state `name` after dsc_trainer_gather (NULL if no
 * such name or not gathered since the last step). */
const dsc_tensor *dsc_trainer_full_param(dsc_trainer *t, const char *name);

/* Called after each step; return false to stop (as *stop does). */
typedef bool (*dsc_train_callback)(void *ud, const dsc_train_progress *p);
/* Steps until cfg->steps (or stop_at) are done, evaluating every eval_every
 * and checkpointing every save_every steps and at the end. *stop (e.g. set
 * by a signal handler; may be NULL) is polled between steps: when set, the
 * current step is checkpointed and the call returns DSC_OK with
 * summary->stopped. A failed step writes no checkpoint. */
dsc_status dsc_trainer_run(dsc_trainer *t, const volatile sig_atomic_t *stop, dsc_train_callback cb,
                           void *ud, dsc_train_summary *summary);

/* ---- program files (.dsx; include/dsc/exec.h) ----
 * dsc_program_compile builds the modules dsc_trainer_open would build from
 * the model file (the step module through the whole pipeline at batch *
 * grad_accum x seq, and the forward module at batch x seq with the codegen
 * passes), then writes them with their kernels for `target`. Training or
 * running from the .dsx skips the pipeline and, on the same host, the
 * kernel compilation. */
typedef struct {
  const char *model_path;          /* .dsm */
  const char *out_path;            /* the .dsx, written atomically */
  const char *target;              /* "cpu" (NULL) or "cuda" */
  int64_t batch, seq, grad_accum;  /* 0: the model's train section */
  const char *precision;           /* NULL: the model's */
  double lr;                       /* <= 0: the model's (in the graph only for muon's adam_lr) */
  int cuda_arch;                   /* cuda: sm_XX; 0: 90 */
} dsc_compile_options;
typedef struct {
  int graphs, kernels;
  int64_t bytes; /* of the file */
} dsc_compile_summary;
dsc_status dsc_program_compile(dsc_context *ctx, const dsc_compile_options *o,
                               dsc_compile_summary *sum);

/* ---- pieces, usable on their own ---- */

/* Vocabulary of a token model: the rows of the embedding table indexed by
 * graph input 0, else the class count of a cross_entropy whose targets are a
 * graph input; the smallest when several. -1 when neither exists. */
int64_t dsc_model_vocab(const dsc_graph *g);
/* Context length: the rows of an embedding table indexed by iota (the
 * position embedding); -1 when there is none. */
int64_t dsc_model_context(const dsc_graph *g);
/* Makes the forward graph return its logits: its single output must be
 * cross_entropy(logits, targets); the output becomes `logits`. */
dsc_status dsc_make_logits_graph(dsc_graph *g);
/* ---- sampling from a checkpoint ---- */
typedef struct dsc_sampler dsc_sampler;
typedef struct {
  const char *checkpoint; /* OUT or OUT/step-N */
  const char *model_path; /* NULL: the one recorded in the checkpoint */
  uint64_t seed;
  const dsc_exec_options *exec; /* NULL: the default backend */
  int64_t chunk;                /* prompt tokens per step; 0: 16 */
  int64_t context;              /* positions the window holds; 0: the model's */
} dsc_sampler_options;

dsc_status dsc_sampler_open(dsc_context *ctx, const dsc_sampler_options *opts, dsc_sampler **out);
void dsc_sampler_free(dsc_sampler *s);
int64_t dsc_sampler_context(const dsc_sampler *s); /* T: tokens the window holds */
int64_t dsc_sampler_vocab(const dsc_sampler *s);
/* Appends a token to the window. A full window keeps its newer half, which
 * is run again from position 0 at the next draw (a KV cache holds absolute
 * positions, so it cannot slide by one). */
dsc_status dsc_sampler_push(dsc_sampler *s, int64_t token);
/* The engine's executor and one-token graph (dsc_infer_exec,
 * dsc_infer_one_token_graph). */
dsc_exec *dsc_sampler_exec(dsc_sampler *s);
const char *dsc_sampler_one_token_graph(const dsc_sampler *s);
/* The engine's time in prompt chunks and one-token steps (dsc_infer_times). */
void dsc_sampler_times(const dsc_sampler *s, double *prefill_s, int64_t *prefills, double *decode_s,
                       int64_t *decodes);
/* Runs the tokens pushed since the last draw through the model (the KV
 * cache holds the earlier ones) and draws the next token (not pushed). */
dsc_status dsc_sampler_next(dsc_sampler *s, const dsc_sampling *how, int64_t *token);

#ifdef __cplusplus
}
#endif
#endif
