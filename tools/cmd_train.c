/* dsc train: the training loop (include/dsc/trainer.h) with progress lines,
 * a summary, and a checkpoint on SIGINT/SIGTERM. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "tools/cli.h"

/* The environment of a process started by mpirun (Open MPI, or PMI). */
static int64_t mpi_env_world(void) {
  const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
    int64_t n;
    const char *v = getenv(vars[i]);
    if (v && cli_parse_i64(v, &n) && n > 0) return n;
  }
  return 0;
}

/* This process's rank under mpirun (0 when not started by one). */
static int64_t mpi_env_rank(void) {
  const char *vars[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
    int64_t r;
    const char *v = getenv(vars[i]);
    if (v && cli_parse_i64(v, &r) && r >= 0) return r;
  }
  return 0;
}

/* The one line a traced run ends with: the share of communication hidden
 * behind compute (include/dsc/trace.h; bench/trace_overlap.py). */
static void print_trace_line(const char *path, int64_t mpi_world, const dsc_trace_overlap *o) {
  printf("trace: %s", path);
  if (mpi_world == 2) printf(" (+ %s.rank1)", path);
  if (mpi_world > 2) printf(" (+ %s.rank1 .. %s.rank%" PRId64 ")", path, path, mpi_world - 1);
  double h = dsc_trace_hidden_share(o);
  if (h < 0)
    printf(": no collectives traced (one rank, or the interp backend)\n");
  else
    printf(": communication hidden behind compute %.1f%% (blocked %.3f ms of %.3f ms in %" PRId64
           " collectives, summed over %d ranks)\n",
           100 * h, o->wait_s * 1e3, o->comm_s * 1e3, o->collectives, o->ranks);
  double hh = dsc_trace_hidden_host_share(o);
  if (hh >= 0)
    printf("trace: host stream hidden behind the executor %.1f%% (blocked %.3f ms of %.3f ms of "
           "host work)\n",
           100 * hh, o->host_wait_s * 1e3, o->host_busy_s * 1e3);
  fflush(stdout);
}

static const char train_help[] =
    "usage: dsc train MODEL.dsm --data PREFIX [options]\n"
    "       dsc train --resume DIR [MODEL.dsm] [options]\n"
    "\n"
    "Trains a token model (forward(tokens, targets) -> loss): compiles MODEL.dsm,\n"
    "runs the training pipeline (precision, sequence_parallel, expert_parallel, autodiff,\n"
    "optimizer, zero, "
    "accumulate, decompose, "
    "cse, guard, fuse; dsc dump --list-passes)\n"
    "and steps through PREFIX_train.bin (written by 'dsc data').\n"
    "MODEL may be a .dsx from 'dsc compile': its graphs and (same host) kernels are\n"
    "used as they are; --batch, --seq, --grad-accum and --precision must then match\n"
    "what it was compiled with.\n"
    "The flags override the model's train section:\n"
    "  --data PREFIX     token shards PREFIX_train.bin and, if present, PREFIX_val.bin\n"
    "  --steps N         optimizer steps of the whole run, counted from step 0\n"
    "                    (also when resuming)\n"
    "  --batch B         micro-batch size (binds the dim B)\n"
    "  --seq T           sequence length (binds the dim T)\n"
    "  --grad-accum K    micro-batches per optimizer step\n"
    "  --lr X            peak learning rate\n"
    "  --precision P     f32, bf16 or fp16: mixed precision with f32 master weights\n"
    "                    (fp16 with dynamic loss scaling; docs/training.md)\n"
    "  --master-weights true|false  bf16/fp16: params and gradients in the low dtype,\n"
    "                    f32 master weights sharded with the optimizer states (true,\n"
    "                    the default, as DeepSpeed) or f32 params and gradients with\n"
    "                    casts in the forward (false, as PyTorch's autocast)\n"
    "  --seed S          seed of the parameter init and the data order\n"
    "  --backend B       interp (the reference interpreter), cpu (LLVM-JIT kernels +\n"
    "                    oneDNN GEMMs; the default where built) or cuda\n"
    "  --threads N       cpu backend threads (default: one per core)\n"
    "  --profile         time every instruction of the step; print the slowest at the end\n"
    "  --wall-clock-breakdown true|false  DeepSpeed's per-step timer lines (fwd, bwd,\n"
    "                    bwd_inner, bwd_allreduce, step; train.wall_clock_breakdown)\n"
    "  --deepspeed FILE  a DeepSpeed config (ds_config.json; also --config,\n"
    "                    --deepspeed_config): its keys with DeepSpeed's meaning over\n"
    "                    the model's train section, under these flags (docs/deepspeed.md)\n"
    "  --print-config    print every setting, its value and where it came from\n"
    "                    (default, train section, ds_config key and line, flag); no\n"
    "                    training\n"
    "  --trace FILE      write a Chrome trace (Perfetto, chrome://tracing) of the run:\n"
    "                    tracks step, compute, comm, wait and copy per rank (pid = rank);\n"
    "                    ends with the share of communication hidden behind compute.\n"
    "                    Under mpirun rank R > 0 writes FILE.rankR (docs/training.md)\n"
    "  --out DIR         checkpoints DIR/step-NNNNNN (newest: DIR/latest) and\n"
    "                    DIR/metrics.jsonl (the run's JSON lines); one run writes\n"
    "                    DIR at a time (a lock, DIR/.lock, names its pid)\n"
    "  --save-every N    checkpoint every N steps (and always at the end; 0: end only)\n"
    "  --keep-last N     keep only the N newest checkpoints (default: all)\n"
    "  --eval-every N    validation loss every N steps and at the end (0: never)\n"
    "  --eval-batches N  validation batches per evaluation (default 8; the first N\n"
    "                    batches of PREFIX_val.bin, the same every time)\n"
    "  --log FILE        also write the JSON lines to FILE: one per step with step,\n"
    "                    loss, lr, grad_norm, tokens_per_s, ms (+ val_loss when evaluated)\n"
    "  --log-every N     progress line every N steps when not on a terminal\n"
    "  --stop-at N       checkpoint and stop once N steps are done (the schedule\n"
    "                    still follows --steps; continue later with --resume)\n"
    "  --resume DIR      continue from a checkpoint (DIR or DIR/step-NNNNNN): restores\n"
    "                    params, optimizer state, step and data position, so the run\n"
    "                    continues exactly as if it had not stopped. Model, data,\n"
    "                    batch, seq, grad-accum, steps, lr and seed default to the\n"
    "                    checkpoint's (batch, seq, grad-accum cannot change); new\n"
    "                    checkpoints go next to it unless --out is given.\n"
    "  --init-from DIR   start from the weights of a Hugging Face model directory\n"
    "                    (config.json + model.safetensors or a sharded index;\n"
    "                    llama, mistral, qwen2, gpt2) instead of the initializers;\n"
    "                    the optimizer starts fresh (docs/models.md;\n"
    "                    'dsc import --list DIR MODEL.dsm' shows the mapping)\n"
    "  --quiet           no progress lines or summary\n"
    "\n"
    "Data parallel (docs/training.md): every step trains on a global batch of\n"
    "batch x grad-accum x ranks sequences, the same ones whatever the split;\n"
    "gradients and loss are averaged over the ranks. Rank 0 prints, evaluates and\n"
    "writes checkpoints. Under 'mpirun -np N dsc train ...' each process is a rank.\n"
    "  --ranks N         N ranks as threads of this process (in-process backend)\n"
    "  --mesh dp=D,sp=S  the ranks as a mesh (axes dp, ep, sp, tp; their product = ranks;\n"
    "                    dp implied; docs/parallelism.md). sp=S: the S ranks of an sp\n"
    "                    group train on the same sequences, seq / S positions each,\n"
    "                    attention's heads split over them (Ulysses); the global\n"
    "                    batch is batch x grad-accum x ranks / S sequences. ep=E: each\n"
    "                    rank runs 1/E of every MoE layer's experts on the tokens of\n"
    "                    its ep group (expert parallelism). tp=P: the P ranks of a tp\n"
    "                    group train on the same sequences, each computing 1/P of\n"
    "                    every attention's heads and MLP's hidden units (tensor\n"
    "                    parallelism, Megatron's); the global batch is over ranks / P\n"
    "  --global-batch G  sequences per step; grad-accum = G / (batch x ranks), which\n"
    "                    must divide evenly (DeepSpeed's train_batch_size)\n"
    "  --zero-stage S    ZeRO stage (train.zero.stage); 0: gradients all-reduced,\n"
    "                    nothing sharded; 1: optimizer states sharded; 2: also\n"
    "                    gradients (reduce-scattered); 3: also params (gathered\n"
    "                    before use). Checkpoints hold full tensors: resume at any\n"
    "                    world size and stage keeps the global batch\n"
    "  --bucket-bytes N  reduce_scatters merged into buckets of at most N bytes\n"
    "                    (train.zero.bucket_bytes; default 25MiB; 0: one per gradient)\n"
    "  --prefetch-bytes N  all_gathers started ahead of use, at most N bytes in\n"
    "                    flight (train.zero.prefetch_bytes; default 64MiB)\n"
    "  --persist-threshold N  stage 3 keeps params of at most N elements whole\n"
    "                    (DeepSpeed's stage3_param_persistence_threshold; default 0)\n"
    "  --reduce-each-micro-batch true|false  with grad-accum > 1 at stages 2-3:\n"
    "                    reduce-scatter each micro-batch's gradients into shard-sized\n"
    "                    sums, overlapping its backward (true, the default, as\n"
    "                    DeepSpeed), or sum whole gradients and reduce once per step\n"
    "                    (false: 1/K the traffic, full-size sums). Stages 0-1 reduce\n"
    "                    once per step\n"
    "  --memory-budget B bytes one rank's step may allocate (cpu backend; e.g. 4GiB):\n"
    "                    a step that needs more is refused before anything runs\n"
    "  --offload-optimizer T  where the optimizer states live: none (the device),\n"
    "                    host (host memory) or disk (a file per rank under\n"
    "                    --offload-dir); cpu and nvme are DeepSpeed's names for them;\n"
    "                    host and disk also run the optimizer step on the host\n"
    "                    (gradients copied out during the backward, params back)\n"
    "                    (train.offload.optimizer; default none; docs/memory.md);\n"
    "                    auto: only the states --memory-budget requires, furthest\n"
    "                    next use from the peak and largest first (disk past\n"
    "                    --host-memory-budget when --offload-dir is given)\n"
    "  --offload-param T stage 3 (--ranks N): where the param shards live (as above)\n"
    "  --offload-dir DIR the disk tier's directory (DIR/dsc-offload-rank<R>.bin)\n"
    "  --offload-prefetch-bytes N  disk tier: reads started ahead of their use, at\n"
    "                    most N bytes in flight (default 64MiB; docs/memory.md)\n"
    "  --offload-io-threads N  disk tier: IO threads per rank (1-64, default 4)\n"
    "  --delayed-param-update true|false  each step applies the previous step's\n"
    "                    gradient (ZeRO-Offload's delayed parameter update; the\n"
    "                    first step updates nothing; train.offload.delayed_update;\n"
    "                    default false; docs/memory.md)\n"
    "  --offload-overlap true|false|auto  the host's part of the step (tier\n"
    "                    copies, the host optimizer) on a thread of its own beside\n"
    "                    the device's, each param's as soon as its inputs are on\n"
    "                    the host (train.offload.overlap; default auto: only when\n"
    "                    --threads leaves a core free, as on the cpu backend the\n"
    "                    host and the device share the cores; false: one\n"
    "                    instruction at a time; same numbers either way)\n"
    "  --zenflow true|false  ZenFlow (with --offload-optimizer host): each 2-D\n"
    "                    param's top columns by |gradient| are updated every step\n"
    "                    on the device, the rest by the host every update_interval\n"
    "                    steps; train.zenflow.* (topk_ratio, select_interval,\n"
    "                    update_interval, full_warm_up_rounds; default false;\n"
    "                    docs/memory.md \"ZenFlow\")\n"
    "  --host-memory-budget B  host memory one rank's offloaded values may take\n"
    "  --checkpoint-activations P  none; selective: the backward recomputes\n"
    "                    elementwise ops, norms and softmaxes instead of keeping them;\n"
    "                    block: only each block's input is kept, the backward\n"
    "                    recomputes the block; blocks:K: every K-th block's input;\n"
    "                    offload: the kept forward values go to host memory after\n"
    "                    their last forward use and come back before the backward\n"
    "                    (train.checkpoint_activations, checkpoint_every; default none)\n"
    "  --unshard-bytes N stage 3 keeps params gathered from forward to backward\n"
    "                    (smallest first) while their bytes fit in N (DeepCompile's\n"
    "                    selective unsharding; train.zero.unshard_bytes; default 0)\n" CLI_AUTO_HELP
    "                    (dsc train --auto: the search's choice is printed, then trained)\n"
    "\n"
    "SIGINT (Ctrl-C) or SIGTERM stops after the current step, writes a checkpoint\n"
    "and exits with 130 (SIGINT) or 143 (SIGTERM), as shells report such stops.\n"
    "Exit codes otherwise: 0 done, 1 bad input (model, data, checkpoint, flags), 2 internal.\n";

typedef struct {
  bool tty, quiet;
  int64_t log_every, start_step;
  double ms_sum;
  int64_t n;
} progress;

static void fmt_duration(char *buf, size_t n, double s) {
  long t = (long)(s + 0.5);
  if (t >= 3600)
    snprintf(buf, n, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
  else
    snprintf(buf, n, "%ld:%02ld", t / 60, t % 60);
}

/* DeepSpeed's wall_clock_breakdown lines, as its engine prints them on rank
 * 0 after each step: the micro-step timers (one line here, the means over
 * the step's micro-batches, where DeepSpeed prints a line per micro-batch)
 * and the step's totals. */
static void print_breakdown(const dsc_phase_times *b) {
  double k = b->runs > 0 ? (double)b->runs : 1;
  printf("[Rank 0] time (ms) | fwd_microstep: %.2f | bwd_microstep: %.2f | "
         "bwd_inner_microstep: %.2f | bwd_allreduce_microstep: %.2f | step_microstep: %.2f\n",
         b->fwd / k, b->bwd / k, b->bwd_inner / k, b->bwd_allreduce / k, b->step);
  printf("[Rank 0] time (ms) | fwd: %.2f | bwd: %.2f | bwd_inner: %.2f | bwd_allreduce: %.2f | "
         "step: %.2f\n",
         b->fwd, b->bwd, b->bwd_inner, b->bwd_allreduce, b->step);
}

static bool on_step(void *ud, const dsc_train_progress *p) {
  progress *pr = ud;
  pr->ms_sum += p->ms;
  pr->n++;
  if (pr->quiet) return true;
  if (p->has_breakdown) print_breakdown(&p->breakdown);
  bool show =
      pr->tty || p->step % pr->log_every == 0 || p->step == p->steps || p->has_val || pr->n == 1;
  if (!show) return true;
  char eta[32];
  fmt_duration(eta, sizeof eta, (double)(p->steps - p->step) * pr->ms_sum / (double)pr->n * 1e-3);
  printf("step %" PRId64 "/%" PRId64
         " | loss %.4f | lr %.3e | norm %.3f | %.0f tok/s | %.0f ms"
         " | ETA %s",
         p->step, p->steps, p->loss, p->lr, p->grad_norm, p->tokens_per_s, p->ms, eta);
  if (p->has_val) printf(" | val %.4f", p->val_loss);
  if (p->skipped) printf(" | overflow: step skipped");
  if (p->saved) printf(" | saved");
  putchar('\n');
  fflush(stdout);
  return true;
}

/* Planned against measured memory (cpu backend; tests/cli/plan.sh checks
 * them). The RSS growth is the process's: with --ranks N every rank's
 * executor is in it. */
static void print_memory(const dsc_trainer_info *info) {
  if (info->mem_planned <= 0 || info->mem_rss_growth == 0) return;
  const double mib = 1024.0 * 1024.0;
  printf("memory: planned %.1f MiB (dsc plan: arenas + GEMM scratch per rank), measured ",
         (double)info->mem_planned / mib);
  if (info->mem_rss_growth < 0)
    printf("n/a");
  else
    printf("%.1f MiB (RSS growth over executor creation and first step%s)",
           (double)info->mem_rss_growth / mib, info->world > 1 ? ", this process" : "");
  struct rusage ru;
  if (getrusage(RUSAGE_SELF, &ru) == 0)
    printf(", peak RSS %.1f MiB", (double)ru.ru_maxrss / 1024.0);
  putchar('\n');
  /* what of the growth it can name; the rest: thread stacks, libraries */
  const int64_t part[5] = {info->mem_arenas_touched, info->mem_gemm_scratch,
                           info->mem_kernel_code, info->mem_heap, info->mem_compile};
  const char *name[5] = {"arenas touched", "GEMM scratch", "kernel code", "malloc heap",
                         "compile threads and LLVM maps"};
  if (info->mem_rss_growth < 0 || info->world > 1) return; /* ranks share the process's RSS */
  int64_t rest = info->mem_rss_growth;
  printf("memory: of the measured:");
  for (int i = 0; i < 5; i++) {
    if (part[i] < 0) {
      printf(" %s n/a,", name[i]);
      continue;
    }
    printf(" %s %.1f,", name[i], (double)part[i] / mib);
    rest -= part[i];
  }
  printf(" unexplained %.1f MiB\n", (double)rest / mib);
}

/* Flag value parsers; false with a usage message. */
/* A byte count (cli_parse_bytes) as the next argument. */
static bool want_bytes(int argc, char **argv, int *i, int64_t *out) {
  return *i + 1 < argc && cli_parse_bytes(argv[++*i], out);
}

static bool want_i64(int argc, char **argv, int *i, int64_t min, int64_t *out) {
  const char *flag = argv[*i];
  if (*i + 1 >= argc || !cli_parse_i64(argv[*i + 1], out) || *out < min) {
    cli_usage_error("train", "%s needs an integer >= %" PRId64, flag, min);
    return false;
  }
  ++*i;
  return true;
}

static bool want_str(int argc, char **argv, int *i, const char **out) {
  if (*i + 1 >= argc || !argv[*i + 1][0]) {
    cli_usage_error("train", "%s needs a value", argv[*i]);
    return false;
  }
  *out = argv[++*i];
  return true;
}

typedef struct {
  dsc_trainer_options o;
  bool quiet;
  dsc_context *single_ctx; /* one rank without a communicator: its context */
  int code;                /* rank 0's exit code once its training returned DSC_OK */
} train_job;

/* One rank's run: open, header, steps, summary. Rank 0 prints (progress on
 * stdout, warnings on stderr); errors stay on the rank's context for the
 * caller to print. */
static dsc_status train_rank(dsc_comm *comm, train_job *j) {
  dsc_context *ctx = comm ? dsc_comm_context(comm) : j->single_ctx;
  bool lead = !comm || dsc_comm_rank(comm) == 0;
  bool quiet = j->quiet || !lead;
  dsc_trainer_options o = j->o;
  o.comm = comm;
  if (lead && !o.resume && !o.out_dir)
    fputs("dsc train: note: no --out, so no checkpoint will be saved\n", stderr);
  dsc_trainer *t = NULL;
  dsc_status st = dsc_trainer_open(ctx, &o, &t);
  if (st != DSC_OK) return st;
  if (lead) dsc_diag_print(ctx, stderr);
  dsc_diag_clear(ctx); /* the other ranks' warnings are rank 0's too */
  const dsc_trainer_info *info = dsc_trainer_get_info(t);
  const dsc_train_config *cfg = info->cfg;
  if (!quiet) {
    printf("model %s (%s): %" PRId64 " parameters, %" PRId64 " optimizer state values\n",
           info->model_name, info->model_path, info->n_params, info->n_state);
    printf("data: %" PRId64 " training tokens", info->train_tokens);
    if (info->data_val) printf(", %" PRId64 " validation tokens", info->val_tokens);
    printf(" (vocabulary %" PRId64 ")\n", info->vocab);
    if (info->world > 1)
      printf("batch %" PRId64 " x seq %" PRId64 " x grad_accum %" PRId64
             " x %d ranks (%s%s%s) = %" PRId64 " tokens/step, ZeRO stage %" PRId64 ", %" PRId64
             " steps, lr %g, seed %" PRIu64 "\n",
             cfg->batch, cfg->seq, cfg->grad_accum, info->world, dsc_comm_backend(comm),
             info->mesh ? ", mesh " : "", info->mesh ? info->mesh : "",
             info->global_batch * cfg->seq, cfg->zero.stage, cfg->steps, cfg->opt.lr, cfg->seed);
    else
      printf("batch %" PRId64 " x seq %" PRId64 " x grad_accum %" PRId64 " = %" PRId64
             " tokens/step, %" PRId64 " steps, lr %g, seed %" PRIu64 "\n",
             cfg->batch, cfg->seq, cfg->grad_accum, cfg->batch * cfg->seq * cfg->grad_accum,
             cfg->steps, cfg->opt.lr, cfg->seed);
    if (info->program_path)
      printf("program %s: %d kernels loaded, %d compiled\n", info->program_path,
             info->kernels_prebuilt, info->kernels_compiled);
    if (info->resumed_from)
      printf("resumed from %s at step %" PRId64 "\n", info->resumed_from, info->start_step);
    if (o.init_from)
      printf("weights from %s (%.3f MB read%s)\n", o.init_from, (double)info->import_bytes / 1e6,
             cfg->zero.stage == 3 && info->world > 1 ? " by rank 0: its ZeRO-3 chunks" : "");
    if (info->offload_auto) printf("%s\n", info->offload_auto);
    fflush(stdout);
  }
  progress pr = {isatty(STDOUT_FILENO) != 0, quiet, cfg->log_every > 0 ? cfg->log_every : 1,
                 info->start_step,           0,     0};
  dsc_train_summary sum;
  st = dsc_trainer_run(t, &cli_signal, on_step, &pr, &sum);
  if (st != DSC_OK) {
    dsc_trainer_free(t);
    return st;
  }
  if (lead) dsc_diag_print(ctx, stderr);
  dsc_diag_clear(ctx);
  int code = CLI_EXIT_OK;
  if (!quiet) {
    char took[32];
    fmt_duration(took, sizeof took, sum.seconds);
    printf("%s %" PRId64 " steps (%" PRId64 " this run) in %s, %.0f tok/s; final loss %.4f",
           sum.stopped ? "stopped after" : "done:", sum.steps_done, sum.steps_run, took,
           sum.tokens_per_s, sum.final_loss);
    if (!isnan(sum.best_val_loss)) printf(", best val loss %.4f", sum.best_val_loss);
    putchar('\n');
    if (sum.last_checkpoint) printf("checkpoint: %s\n", sum.last_checkpoint);
    print_memory(info);
  }
  if (sum.stopped && cli_signal) {
    if (lead)
      fprintf(stderr, "dsc train: stopped by %s at step %" PRId64 "%s%s\n",
              cli_signal == SIGINT ? "SIGINT" : "SIGTERM", sum.steps_done,
              sum.last_checkpoint ? "; checkpoint " : " (no --out: nothing saved)",
              sum.last_checkpoint ? sum.last_checkpoint : "");
    code = 128 + cli_signal;
  }
  if (lead && o.profile && dsc_trainer_print_profile(t, 25, stdout) != DSC_OK)
    dsc_diag_print(ctx, stderr);
  if (lead) j->code = code;
  fflush(stdout);
  dsc_trainer_free(t);
  return DSC_OK;
}

static dsc_status train_rank_fn(dsc_comm *comm, void *ud) { return train_rank(comm, ud); }

/* --auto (tools/cmd_auto.c): the search over what the user did not fix,
 * then o holds the chosen configuration. Under mpirun every process
 * searches: the rates must come from flags so that all choose the same. */
static int train_auto(dsc_trainer_options *o, const cli_auto *au, int64_t world, bool mpi,
                      bool quiet) {
  if (o->memory_budget <= 0)
    return cli_usage_error("train", "--auto needs --memory-budget B (bytes one rank may use)"),
           CLI_EXIT_USER;
  if (o->resume)
    return cli_usage_error("train", "--auto configures a new run; a resumed run takes the "
                                    "configuration flags (dsc plan --auto prints them)"),
           CLI_EXIT_USER;
  if (mpi && !(au->rates.compute_gflops > 0 && au->rates.link_gbps > 0 &&
               au->rates.host_gbps > 0 && au->rates.disk_gbps > 0))
    return cli_usage_error("train", "--auto under mpirun needs --compute-gflops, --link-gbps, "
                                    "--host-gbps and --disk-gbps (every rank must choose alike)"),
           CLI_EXIT_USER;
  dsc_context *ctx = dsc_context_new(NULL, NULL);
  dsc_autocfg_result *res = malloc(sizeof *res);
  if (!ctx || !res) {
    free(res);
    dsc_context_free(ctx);
    return fputs("dsc: out of memory\n", stderr), CLI_EXIT_INTERNAL;
  }
  dsc_autocfg_options ao;
  memset(&ao, 0, sizeof ao);
  dsc_plan_options *b = &ao.base;
  b->model_path = o->model_path;
  b->batch = o->batch, b->seq = o->seq, b->grad_accum = o->grad_accum;
  b->precision = o->precision;
  b->world = world;
  b->mesh = o->mesh;
  b->threads = o->threads;
  b->knobs = o->knobs; /* what the user fixed; the search chooses the rest */
  b->offload_dir = o->offload_dir;
  b->host_memory_budget = o->host_memory_budget;
  ao.memory_budget = o->memory_budget;
  int code = cli_auto_run("train", ctx, au, &ao, false, quiet ? stderr : stdout, res);
  if (code == CLI_EXIT_OK) {
    const dsc_autocfg_candidate *c = &res->cand[0];
    char flags[256];
    dsc_autocfg_flags(c, world, flags, sizeof flags);
    o->knobs = c->knobs; /* the choice, with the knobs the user fixed */
    fprintf(quiet ? stderr : stdout, "auto: training with %s\n\n", flags);
    fflush(quiet ? stderr : stdout);
  }
  free(res);
  dsc_context_free(ctx);
  return code;
}

/* What the command line gives besides the trainer options. */
typedef struct {
  dsc_trainer_options o;
  bool quiet;
  int64_t ranks;
  const char *trace_path;
  cli_auto au;
  bool print_config;
} train_args;

/* A flag of the run itself (paths, shape, schedule, cadence). 1: handled,
 * 0: not one of these, -1: a usage error (printed). */
static int run_flag(int argc, char **argv, int *i, dsc_trainer_options *o) {
  const char *a = argv[*i];
  int64_t v;
  bool ok;
  if (strcmp(a, "--data") == 0)
    ok = want_str(argc, argv, i, &o->data_prefix);
  else if (strcmp(a, "--out") == 0)
    ok = want_str(argc, argv, i, &o->out_dir);
  else if (strcmp(a, "--resume") == 0)
    ok = want_str(argc, argv, i, &o->resume);
  else if (strcmp(a, "--init-from") == 0)
    ok = want_str(argc, argv, i, &o->init_from);
  else if (strcmp(a, "--log") == 0)
    ok = want_str(argc, argv, i, &o->log_path);
  else if (strcmp(a, "--steps") == 0)
    ok = want_i64(argc, argv, i, 1, &o->steps);
  else if (strcmp(a, "--batch") == 0)
    ok = want_i64(argc, argv, i, 1, &o->batch);
  else if (strcmp(a, "--seq") == 0)
    ok = want_i64(argc, argv, i, 1, &o->seq);
  else if (strcmp(a, "--grad-accum") == 0)
    ok = want_i64(argc, argv, i, 1, &o->grad_accum);
  else if (strcmp(a, "--save-every") == 0)
    ok = want_i64(argc, argv, i, 0, &o->save_every);
  else if (strcmp(a, "--eval-every") == 0)
    ok = want_i64(argc, argv, i, 0, &o->eval_every);
  else if (strcmp(a, "--eval-batches") == 0)
    ok = want_i64(argc, argv, i, 1, &o->eval_batches);
  else if (strcmp(a, "--log-every") == 0)
    ok = want_i64(argc, argv, i, 1, &o->log_every);
  else if (strcmp(a, "--stop-at") == 0)
    ok = want_i64(argc, argv, i, 1, &o->stop_at);
  else if (strcmp(a, "--keep-last") == 0) {
    ok = want_i64(argc, argv, i, 1, &v) && v < 1000000;
    o->keep_last = (int)v;
  } else if (strcmp(a, "--seed") == 0) {
    ok = want_i64(argc, argv, i, 0, &v);
    o->seed = (uint64_t)v;
    o->has_seed = true;
  } else if (strcmp(a, "--lr") == 0) {
    if (!cli_parse_positive(*i + 1 < argc ? argv[*i + 1] : "", &o->lr))
      return cli_usage_error("train", "--lr needs a positive number"), -1;
    ok = true, ++*i;
  } else if (strcmp(a, "--precision") == 0) {
    dsc_precision prec;
    ok = want_str(argc, argv, i, &o->precision);
    if (ok && dsc_precision_from_name(o->precision, &prec) != 0)
      return cli_usage_error("train", "--precision: '%s' is not one of f32, bf16, fp16",
                             o->precision),
             -1;
  } else {
    return 0;
  }
  return ok ? 1 : -1;
}

/* A flag of where and how it runs (backend, ranks, memory, offload,
 * tracing). 1: handled, 0: not one of these, -1: a usage error. */
static int machine_flag(int argc, char **argv, int *i, train_args *ta) {
  dsc_trainer_options *o = &ta->o;
  const char *a = argv[*i];
  int64_t v;
  if (strcmp(a, "--backend") == 0) {
    dsc_backend b;
    if (!want_str(argc, argv, i, &o->backend)) return -1;
    if (dsc_backend_from_name(o->backend, &b) != 0)
      return cli_usage_error("train", "--backend: '%s' is not one of interp, cpu, cuda",
                             o->backend),
             -1;
  } else if (strcmp(a, "--threads") == 0) {
    if (!(want_i64(argc, argv, i, 1, &v) && v <= 1024)) return -1;
    o->threads = (int)v;
  } else if (strcmp(a, "--ranks") == 0) {
    if (!(want_i64(argc, argv, i, 1, &ta->ranks) && ta->ranks <= 1024))
      return cli_usage_error("train", "--ranks needs an integer in [1, 1024]"), -1;
  } else if (strcmp(a, "--mesh") == 0) {
    if (!want_str(argc, argv, i, &o->mesh)) return -1;
  } else if (strcmp(a, "--memory-budget") == 0) {
    if (!want_bytes(argc, argv, i, &o->memory_budget) || o->memory_budget <= 0)
      return cli_usage_error("train", "--memory-budget needs a byte count such as 16GiB"), -1;
  } else if (strcmp(a, "--offload-dir") == 0) {
    if (*i + 1 >= argc || !argv[*i + 1][0])
      return cli_usage_error("train", "--offload-dir needs a directory"), -1;
    o->offload_dir = argv[++*i];
  } else if (strcmp(a, "--host-memory-budget") == 0) {
    if (!want_bytes(argc, argv, i, &o->host_memory_budget) || o->host_memory_budget <= 0)
      return cli_usage_error("train", "--host-memory-budget needs a byte count such as 16GiB"), -1;
  } else if (strcmp(a, "--trace") == 0) {
    if (!want_str(argc, argv, i, &ta->trace_path)) return -1;
  } else if (strcmp(a, "--profile") == 0) {
    o->profile = true;
  } else if (strcmp(a, "--quiet") == 0) {
    ta->quiet = true;
  } else if (strcmp(a, "--deepspeed") == 0 || strcmp(a, "--config") == 0 ||
             strcmp(a, "--deepspeed_config") == 0) {
    if (*i + 1 >= argc || !argv[*i + 1][0])
      return cli_usage_error("train", "%s needs a ds_config.json file", a), -1;
    o->ds_config = argv[++*i];
  } else if (strcmp(a, "--print-config") == 0) {
    ta->print_config = true;
  } else {
    return 0;
  }
  return 1;
}

/* The command line into ta; -1 to go on, else the exit code. */
static int parse_train_args(int argc, char **argv, train_args *ta) {
  memset(ta, 0, sizeof *ta);
  ta->o.save_every = ta->o.eval_every = -1;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    int k;
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      fputs(train_help, stdout);
      return CLI_EXIT_OK;
    }
    if ((k = run_flag(argc, argv, &i, &ta->o)) != 0 ||
        (k = cli_knob_flag("train", argc, argv, &i, &ta->o.knobs)) != 0 ||
        (k = machine_flag(argc, argv, &i, ta)) != 0 ||
        (k = cli_auto_flag("train", argc, argv, &i, &ta->au)) != 0) {
      if (k < 0) return CLI_EXIT_USER;
    } else if (a[0] == '-' && a[1]) {
      return cli_usage_error("train", "unknown option '%s'", a), CLI_EXIT_USER;
    } else if (ta->o.model_path) {
      return cli_usage_error("train", "one model file at a time"), CLI_EXIT_USER;
    } else {
      ta->o.model_path = a;
    }
  }
  if (!ta->o.resume && !ta->o.model_path)
    return cli_usage_error("train", "missing model file"), CLI_EXIT_USER;
  if (!ta->o.resume && !ta->o.data_prefix && !ta->print_config)
    return cli_usage_error("train", "missing --data PREFIX (token shards from 'dsc data')"),
           CLI_EXIT_USER;
  return -1;
}

/* --print-config: the settings with their sources, no training. */
static int print_config(train_args *ta, int64_t mpi_world) {
  dsc_context *ctx = dsc_context_new(NULL, NULL);
  if (!ctx) return fputs("dsc: out of memory\n", stderr), CLI_EXIT_INTERNAL;
  int world = (int)(ta->ranks > 1 ? ta->ranks : mpi_world > 1 ? mpi_world : 1);
  dsc_status st = dsc_trainer_print_config(ctx, &ta->o, world, stdout);
  dsc_diag_print(ctx, stderr);
  dsc_context_free(ctx);
  return cli_exit_code(st);
}

/* mpirun's world against --ranks and this build; -1 to go on, else the
 * exit code. */
static int check_world(int64_t mpi_world, int64_t ranks) {
  if (mpi_world > 1 && ranks > 0)
    return cli_usage_error("train",
                           "--ranks runs in-process ranks; under mpirun (%" PRId64
                           " processes) each process is a rank already",
                           mpi_world),
           CLI_EXIT_USER;
  if (mpi_world > 1 && !dsc_comm_have_mpi()) {
    fprintf(stderr,
            "dsc train: error: started by mpirun with %" PRId64
            " processes, but this dsc was built without MPI (rebuild with MPI, or use --ranks N)\n",
            mpi_world);
    return CLI_EXIT_USER;
  }
  return -1;
}

/* The trace file exists and is writable before anything is compiled:
 * rank 0's is FILE, rank R's under mpirun FILE.rankR. -1 to go on, else
 * the exit code (the error printed). */
static int open_trace(dsc_context *ctx, const char *path, int64_t mpi_world, dsc_trace **out) {
  *out = NULL;
  if (!path) return -1;
  int64_t r = mpi_world > 1 ? mpi_env_rank() : 0;
  char *p = malloc(strlen(path) + 32);
  if (!p) return fputs("dsc: out of memory\n", stderr), CLI_EXIT_INTERNAL;
  if (r > 0)
    sprintf(p, "%s.rank%" PRId64, path, r);
  else
    strcpy(p, path);
  dsc_status st = dsc_trace_open(ctx, p, out);
  free(p);
  if (st != DSC_OK) return dsc_diag_print(ctx, stderr), cli_exit_code(st);
  return -1;
}

/* One rank per process under mpirun: rank 0 reports; any failure ends the
 * job. *trace is closed (and NULL) when the job is aborted. */
static int train_mpi(dsc_context *ctx, train_job *job, const char *trace_path, int64_t mpi_world,
                     dsc_trace **trace) {
  dsc_comm *comm = NULL;
  dsc_status st = dsc_comm_mpi_new(ctx, &comm);
  if (st != DSC_OK) return dsc_diag_print(ctx, stderr), cli_exit_code(st);
  cli_catch_signals(ctx);
  st = train_rank(comm, job);
  cli_release_signals();
  if (st != DSC_OK) {
    dsc_diag_print(ctx, stderr);
    fflush(stderr);
    dsc_trace_close(*trace); /* a valid file before MPI_Abort ends the process */
    *trace = NULL;
    char why[160];
    snprintf(why, sizeof why, "dsc train failed on rank %d (exit %d)", dsc_comm_rank(comm),
             cli_exit_code(st));
    dsc_comm_abort(comm, why); /* ends every process of the job */
  }
  if (*trace) {
    /* every rank traced its own file: rank 0 prints the sums */
    dsc_trace_overlap ov;
    dsc_trace_get_overlap(*trace, &ov);
    double v[5] = {ov.comm_s, ov.wait_s, (double)ov.collectives, ov.host_busy_s, ov.host_wait_s};
    if (dsc_comm_all_reduce(comm, v, v, 5, DSC_F64, DSC_COMM_SUM, 0) == DSC_OK) {
      ov.comm_s = v[0], ov.wait_s = v[1], ov.collectives = (int64_t)v[2];
      ov.host_busy_s = v[3], ov.host_wait_s = v[4];
      ov.ranks = dsc_comm_world(comm);
      if (dsc_comm_rank(comm) == 0 && !job->quiet) print_trace_line(trace_path, mpi_world, &ov);
    } else {
      dsc_diag_print(ctx, stderr);
    }
  }
  dsc_comm_free(comm);
  return job->code;
}

/* In-process ranks (ranks > 1) or one rank, with the signal handlers set. */
static int train_local(dsc_context *ctx, train_job *job, int64_t ranks, const char *trace_path,
                       dsc_trace *trace) {
  cli_catch_signals(ctx);
  cli_show_progress(ctx); /* one rank's compile (in-process ranks compile in their own) */
  dsc_status st;
  if (ranks > 1) {
    st = dsc_comm_inproc_run(ctx, (int)ranks, train_rank_fn, job);
  } else {
    job->single_ctx = ctx;
    st = train_rank(NULL, job);
  }
  cli_release_signals();
  dsc_diag_print(ctx, stderr); /* the first failed rank's errors */
  dsc_trace_overlap ov;
  dsc_trace_get_overlap(trace, &ov);
  if (trace && st == DSC_OK && !job->quiet) print_trace_line(trace_path, 0, &ov);
  return st == DSC_OK ? job->code : cli_exit_code(st);
}

int cli_train(int argc, char **argv) {
  train_args ta;
  int code = parse_train_args(argc, argv, &ta);
  if (code >= 0) return code;
  int64_t mpi_world = mpi_env_world();
  if ((code = check_world(mpi_world, ta.ranks)) >= 0) return code;
  if (ta.print_config) return print_config(&ta, mpi_world);
  if (ta.au.on) {
    int64_t world = ta.ranks > 1 ? ta.ranks : mpi_world > 1 ? mpi_world : 1;
    if ((code = train_auto(&ta.o, &ta.au, world, mpi_world > 1, ta.quiet)) != CLI_EXIT_OK)
      return code;
  }
  dsc_context *ctx = dsc_context_new(NULL, NULL);
  if (!ctx) return fputs("dsc: out of memory\n", stderr), CLI_EXIT_INTERNAL;
  dsc_trace *trace = NULL;
  if ((code = open_trace(ctx, ta.trace_path, mpi_world, &trace)) >= 0) {
    dsc_context_free(ctx);
    return code;
  }
  ta.o.trace = trace;
  train_job job = {ta.o, ta.quiet, NULL, CLI_EXIT_OK};
  if (mpi_world > 1)
    code = train_mpi(ctx, &job, ta.trace_path, mpi_world, &trace);
  else
    code = train_local(ctx, &job, ta.ranks, ta.trace_path, trace);
  if (dsc_trace_close(trace) != DSC_OK) {
    dsc_diag_print(ctx, stderr);
    if (code == CLI_EXIT_OK) code = CLI_EXIT_USER;
  }
  dsc_context_free(ctx);
  return code;
}
