/* The pass manager: the default training pipeline as a table. Each row is
 * {name, description, run}; later passes (remat, schedule, ...) are
 * new rows. After each pass the module is verified (always in builds
 * without NDEBUG, else on request), so a pass that breaks the IR is named. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "passes/passes.h"

/* DSC_TIME_PASSES=1: each pass's wall time and the nodes after it, on
 * stderr (docs/memory.md "How the passes scale"). */
static double seconds_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void report_time(const ir_module *m, const char *pass, double s) {
  long nodes = 0;
  for (int i = 0; i < m->n_graphs; i++) nodes += m->graphs[i]->n_nodes;
  fprintf(stderr, "dsc: pass %-10s %8.3f s, %ld nodes in %d graph(s) after it\n", pass, s, nodes,
          m->n_graphs);
}

static dsc_status run_precision(ir_module *m, const dsc_pipeline_options *opts) {
  return pass_precision_run(m, opts->train);
}

static dsc_status run_autodiff(ir_module *m, const dsc_pipeline_options *opts) {
  (void)opts;
  ir_graph *f = dsc_module_find_graph(m, "forward");
  if (!f) {
    ir_error(m->ctx, ir_no_loc, "autodiff: the module has no graph 'forward'");
    return DSC_ERR_USER;
  }
  return pass_autodiff_run(m, f);
}

static dsc_status run_remat(ir_module *m, const dsc_pipeline_options *opts) {
  return pass_remat_run(m, opts->train);
}

static dsc_status run_optimizer(ir_module *m, const dsc_pipeline_options *opts) {
  return pass_optimizer_run(m, opts->train);
}

static dsc_status run_sequence_parallel(ir_module *m, const dsc_pipeline_options *opts) {
  return pass_sequence_parallel_run(m, opts->train);
}

static dsc_status run_expert_parallel(ir_module *m, const dsc_pipeline_options *opts) {
  return pass_expert_parallel_run(m, opts->train);
}

static dsc_status run_tensor_parallel(ir_module *m, const dsc_pipeline_options *opts) {
  return pass_tensor_parallel_run(m, opts->train);
}

static dsc_status run_zero(ir_module *m, const dsc_pipeline_options *opts) {
  return pass_zero_run(m, opts->train);
}

static dsc_status run_offload(ir_module *m, const dsc_pipeline_options *opts) {
  return pass_offload_run(m, opts->train);
}

static dsc_status run_schedule(ir_module *m, const dsc_pipeline_options *opts) {
  return pass_schedule_run(m, opts->train);
}

static dsc_status run_accumulate(ir_module *m, const dsc_pipeline_options *opts) {
  return pass_accumulate_run(m, opts->train);
}

static dsc_status run_decompose(ir_module *m, const dsc_pipeline_options *opts) {
  (void)opts;
  return pass_decompose_run(m);
}

static dsc_status run_cse(ir_module *m, const dsc_pipeline_options *opts) {
  (void)opts;
  return pass_cse_run(m);
}

static dsc_status run_guard(ir_module *m, const dsc_pipeline_options *opts) {
  (void)opts;
  return pass_guard_run(m);
}

static dsc_status run_fuse(ir_module *m, const dsc_pipeline_options *opts) {
  (void)opts;
  return pass_fuse_run(m);
}

static const struct {
  const char *name, *description;
  pass_run_fn run;
} passes[] = {
    {"precision",
     "mixed precision: graph 'forward' computes in bf16/fp16 with f32 master weights (fp16: "
     "loss scaling); nothing with precision f32",
     run_precision},
    {"sequence_parallel",
     "Ulysses sequence parallelism (--mesh sp=N): each rank holds T/N positions of every "
     "sequence; attention's q, k, v are exchanged (all_to_all over sp) into a split over heads "
     "and back; nothing without an sp axis",
     run_sequence_parallel},
    {"expert_parallel",
     "expert parallelism (--mesh ep=N): each rank runs E/N of every MoE layer's experts; the "
     "experts' slots are exchanged (all_to_all over ep) before and after them; nothing without "
     "an ep axis",
     run_expert_parallel},
    {"tensor_parallel",
     "tensor parallelism (--mesh tp=N): each rank computes 1/N of every attention's heads and "
     "MLP's hidden units (column- and row-parallel matmuls, Megatron's; the partial products "
     "summed by an all_reduce over tp) and 1/N of the vocabulary of the output layer and the "
     "loss; nothing without a tp axis",
     run_tensor_parallel},
    {"autodiff", "append the backward pass to graph 'forward' (outputs: loss, gradients)",
     run_autodiff},
    {"remat",
     "activation checkpointing (--checkpoint-activations selective): the backward recomputes "
     "cheap forward values (elementwise, views, norms, softmax) instead of keeping them",
     run_remat},
    {"optimizer",
     "build graph 'train_step': micro-batches, gradient averaging and clipping, the optimizer "
     "update with its states",
     run_optimizer},
    {"zero",
     "data parallelism (dsc train --ranks, mpirun): ZeRO stage 0 averages the gradients and the "
     "loss over the ranks; 1 shards optimizer states, 2 also gradients (reduce_scatter), 3 also "
     "params (all_gather before use); nothing at world 1",
     run_zero},
    {"offload",
     "memory tiers (--offload-optimizer, --offload-param at stage 3): the optimizer states or "
     "param shards live in host memory or a file per rank (module meta tier.<name>); nothing "
     "without offload",
     run_offload},
    {"schedule",
     "overlap: reduce_scatters merged into buckets (--bucket-bytes), all_gathers started ahead "
     "of their use within --prefetch-bytes (nothing at world 1); disk reads ahead within "
     "--offload-prefetch-bytes; offloaded activations back ahead of their readers by their "
     "copy's time (a cost model) on the host stream",
     run_schedule},
    {"accumulate",
     "gradient accumulation as a loop (grad_accum > 1): graph 'micro_step' (forward, backward, "
     "the gradients summed into states acc.*) run once per micro-batch, then 'train_step' (the "
     "update) once; nothing at grad_accum 1",
     run_accumulate},
    {"decompose",
     "rewrite composite ops (softmax, norms, attention, cross_entropy) into primitive ops for "
     "code generation",
     run_decompose},
    {"cse",
     "compute equal reductions, matmuls and gathers once (the backward reuses the forward's "
     "softmax statistics); drop unused nodes",
     run_cse},
    {"guard",
     "mark the values a step needs only when a bool scalar has one value (ZenFlow's host update "
     "and selection, the delayed update's first step, fp16's skipped steps): the executor skips "
     "them in the other steps",
     run_guard},
    {"fuse",
     "group computations into kernels (node groups: reductions with their elementwise "
     "producers and consumers, elementwise chains, one optimizer update per param)",
     run_fuse},
};
#define N_PASSES ((int)(sizeof passes / sizeof passes[0]))

int dsc_pass_count(void) { return N_PASSES; }
const char *dsc_pass_name(int i) { return i >= 0 && i < N_PASSES ? passes[i].name : NULL; }
const char *dsc_pass_description(int i) {
  return i >= 0 && i < N_PASSES ? passes[i].description : NULL;
}

dsc_status dsc_run_pipeline(dsc_module *m, const dsc_pipeline_options *opts) {
  dsc_pipeline_options none;
  if (!opts) {
    memset(&none, 0, sizeof none);
    opts = &none;
  }
  int last = N_PASSES - 1;
  if (opts->stop_after) {
    last = -1;
    for (int i = 0; i < N_PASSES; i++)
      if (strcmp(passes[i].name, opts->stop_after) == 0) last = i;
    if (last < 0) {
      char list[512] = "";
      for (int i = 0; i < N_PASSES; i++) {
        size_t l = strlen(list);
        snprintf(list + l, sizeof list - l, "%s%s", i ? ", " : "", passes[i].name);
      }
      ir_error(m->ctx, ir_no_loc, "unknown pass '%s' (the passes are: %s)", opts->stop_after, list);
      return DSC_ERR_USER;
    }
  }
#ifdef NDEBUG
  bool verify = opts->verify_each;
#else
  bool verify = true;
#endif
  /* Check the input first, so that a broken input is not blamed on a pass. */
  if (verify && dsc_module_verify(m) != DSC_OK) {
    ir_error(m->ctx, ir_no_loc, "the IR given to the pass pipeline is invalid");
    return DSC_ERR_USER;
  }
  const char *tp = getenv("DSC_TIME_PASSES");
  bool timed = tp && *tp && strcmp(tp, "0") != 0;
  for (int i = 0; i <= last; i++) {
    dsc_status st = ir_check_interrupt(m->ctx, "running the passes");
    double t0 = timed ? seconds_now() : 0;
    if (st == DSC_OK) st = passes[i].run(m, opts);
    if (st != DSC_OK) return st;
    if (timed) report_time(m, passes[i].name, seconds_now() - t0);
    if (verify && dsc_module_verify(m) != DSC_OK) {
      ir_error(m->ctx, ir_no_loc, "the IR is invalid after pass '%s' (a bug in that pass)",
               passes[i].name);
      return DSC_ERR_INTERNAL;
    }
    if (opts->print_after_all) {
      FILE *out = opts->print_to ? opts->print_to : stdout;
      fprintf(out, "// ---- IR after %s ----\n", passes[i].name);
      st = dsc_module_print(m, out);
      if (st != DSC_OK) return st;
    }
  }
  return DSC_OK;
}

/* The passes a compiled backend needs on a module that did not go through
 * the training pipeline (the validation and sampling modules): every pass
 * from "decompose" on. */
dsc_status dsc_run_codegen_passes(dsc_module *m) {
  int first = -1;
  for (int i = 0; i < N_PASSES; i++)
    if (strcmp(passes[i].name, "decompose") == 0) first = i;
  dsc_pipeline_options none;
  memset(&none, 0, sizeof none);
  const char *tp = getenv("DSC_TIME_PASSES");
  bool timed = tp && *tp && strcmp(tp, "0") != 0;
  for (int i = first; i >= 0 && i < N_PASSES; i++) {
    dsc_status st = ir_check_interrupt(m->ctx, "running the passes");
    double t0 = timed ? seconds_now() : 0;
    if (st == DSC_OK) st = passes[i].run(m, &none);
    if (st != DSC_OK) return st;
    if (timed) report_time(m, passes[i].name, seconds_now() - t0);
#ifndef NDEBUG
    if (dsc_module_verify(m) != DSC_OK) {
      ir_error(m->ctx, ir_no_loc, "the IR is invalid after pass '%s' (a bug in that pass)",
               passes[i].name);
      return DSC_ERR_INTERNAL;
    }
#endif
  }
  return DSC_OK;
}
