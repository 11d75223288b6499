/* dsc train: the training loop (include/dsc/trainer.h) with progress lines,
 * a summary, and a checkpoint on SIGINT/SIGTERM. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tools/cli.h"

static const char train_help[] =
    "usage: dsc train MODEL.dsm --data PREFIX [options]\n"
    "       dsc train --resume DIR [MODEL.dsm] [options]\n"
    "\n"
    "Trains a token model (forward(tokens, targets) -> loss): compiles MODEL.dsm,\n"
    "runs the training pipeline (precision, autodiff, optimizer, decompose, cse, fuse)\n"
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
    "  --seed S          seed of the parameter init and the data order\n"
    "  --backend B       interp (the reference interpreter), cpu (LLVM-JIT kernels +\n"
    "                    oneDNN GEMMs; the default where built) or cuda\n"
    "  --threads N       cpu backend threads (default: one per core)\n"
    "  --profile         time every instruction of the step; print the slowest at the end\n"
    "  --out DIR         checkpoints DIR/step-NNNNNN (newest: DIR/latest) and\n"
    "                    DIR/metrics.jsonl (the run's JSON lines)\n"
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
    "  --quiet           no progress lines or summary\n"
    "\n"
    "SIGINT (Ctrl-C) or SIGTERM stops after the current step, writes a checkpoint\n"
    "and exits with 130 (SIGINT) or 143 (SIGTERM), as shells report such stops.\n"
    "Exit codes otherwise: 0 done, 1 bad input (model, data, checkpoint, flags), 2 internal.\n";

static volatile sig_atomic_t stop_signal = 0;
static void on_signal(int sig) { stop_signal = sig; }

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

static bool on_step(void *ud, const dsc_train_progress *p) {
  progress *pr = ud;
  pr->ms_sum += p->ms;
  pr->n++;
  if (pr->quiet) return true;
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

/* Flag value parsers; false with a usage message. */
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

int cli_train(int argc, char **argv) {
  dsc_trainer_options o;
  memset(&o, 0, sizeof o);
  o.save_every = o.eval_every = -1;
  bool quiet = false;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    int64_t v;
    bool ok = true;
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      fputs(train_help, stdout);
      return CLI_EXIT_OK;
    } else if (strcmp(a, "--data") == 0)
      ok = want_str(argc, argv, &i, &o.data_prefix);
    else if (strcmp(a, "--out") == 0)
      ok = want_str(argc, argv, &i, &o.out_dir);
    else if (strcmp(a, "--resume") == 0)
      ok = want_str(argc, argv, &i, &o.resume);
    else if (strcmp(a, "--log") == 0)
      ok = want_str(argc, argv, &i, &o.log_path);
    else if (strcmp(a, "--steps") == 0)
      ok = want_i64(argc, argv, &i, 1, &o.steps);
    else if (strcmp(a, "--batch") == 0)
      ok = want_i64(argc, argv, &i, 1, &o.batch);
    else if (strcmp(a, "--seq") == 0)
      ok = want_i64(argc, argv, &i, 1, &o.seq);
    else if (strcmp(a, "--grad-accum") == 0)
      ok = want_i64(argc, argv, &i, 1, &o.grad_accum);
    else if (strcmp(a, "--save-every") == 0)
      ok = want_i64(argc, argv, &i, 0, &o.save_every);
    else if (strcmp(a, "--eval-every") == 0)
      ok = want_i64(argc, argv, &i, 0, &o.eval_every);
    else if (strcmp(a, "--eval-batches") == 0)
      ok = want_i64(argc, argv, &i, 1, &o.eval_batches);
    else if (strcmp(a, "--log-every") == 0)
      ok = want_i64(argc, argv, &i, 1, &o.log_every);
    else if (strcmp(a, "--stop-at") == 0)
      ok = want_i64(argc, argv, &i, 1, &o.stop_at);
    else if (strcmp(a, "--keep-last") == 0) {
      ok = want_i64(argc, argv, &i, 1, &v) && v < 1000000;
      o.keep_last = (int)v;
    } else if (strcmp(a, "--seed") == 0) {
      ok = want_i64(argc, argv, &i, 0, &v);
      o.seed = (uint64_t)v;
      o.has_seed = true;
    } else if (strcmp(a, "--lr") == 0) {
      char *end = NULL;
      const char *s = i + 1 < argc ? argv[i + 1] : "";
      errno = 0;
      o.lr = strtod(s, &end);
      if (!*s || *end || errno || !(o.lr > 0) || !isfinite(o.lr))
        return cli_usage_error("train", "--lr needs a positive number"), CLI_EXIT_USER;
      i++;
    } else if (strcmp(a, "--precision") == 0) {
      dsc_precision prec;
      ok = want_str(argc, argv, &i, &o.precision);
      if (ok && dsc_precision_from_name(o.precision, &prec) != 0)
        return cli_usage_error("train", "--precision: '%s' is not one of f32, bf16, fp16",
                               o.precision),
               CLI_EXIT_USER;
    } else if (strcmp(a, "--backend") == 0) {
      dsc_backend b;
      ok = want_str(argc, argv, &i, &o.backend);
      if (ok && dsc_backend_from_name(o.backend, &b) != 0)
        return cli_usage_error("train", "--backend: '%s' is not one of interp, cpu, cuda",
                               o.backend),
               CLI_EXIT_USER;
    } else if (strcmp(a, "--threads") == 0) {
      ok = want_i64(argc, argv, &i, 1, &v) && v <= 1024;
      o.threads = (int)v;
    } else if (strcmp(a, "--profile") == 0) {
      o.profile = true;
    } else if (strcmp(a, "--quiet") == 0) {
      quiet = true;
    } else if (a[0] == '-' && a[1]) {
      return cli_usage_error("train", "unknown option '%s'", a), CLI_EXIT_USER;
    } else if (o.model_path) {
      return cli_usage_error("train", "one model file at a time"), CLI_EXIT_USER;
    } else {
      o.model_path = a;
    }
    if (!ok) return CLI_EXIT_USER;
  }
  if (!o.resume && !o.model_path)
    return cli_usage_error("train", "missing model file"), CLI_EXIT_USER;
  if (!o.resume && !o.data_prefix)
    return cli_usage_error("train", "missing --data PREFIX (token shards from 'dsc data')"),
           CLI_EXIT_USER;

  if (!o.resume && !o.out_dir)
    fputs("dsc train: note: no --out, so no checkpoint will be saved\n", stderr);

  dsc_context *ctx = dsc_context_new(NULL, NULL);
  if (!ctx) return fputs("dsc: out of memory\n", stderr), CLI_EXIT_INTERNAL;
  dsc_trainer *t = NULL;
  dsc_status st = dsc_trainer_open(ctx, &o, &t);
  dsc_diag_print(ctx, stderr);
  dsc_diag_clear(ctx);
  if (st != DSC_OK) {
    dsc_context_free(ctx);
    return cli_exit_code(st);
  }
  const dsc_trainer_info *info = dsc_trainer_get_info(t);
  const dsc_train_config *cfg = info->cfg;
  if (!quiet) {
    printf("model %s (%s): %" PRId64 " parameters, %" PRId64 " optimizer state values\n",
           info->model_name, info->model_path, info->n_params, info->n_state);
    printf("data: %" PRId64 " training tokens", info->train_tokens);
    if (info->data_val) printf(", %" PRId64 " validation tokens", info->val_tokens);
    printf(" (vocabulary %" PRId64 ")\n", info->vocab);
    printf("batch %" PRId64 " x seq %" PRId64 " x grad_accum %" PRId64 " = %" PRId64
           " tokens/step, %" PRId64 " steps, lr %g, seed %" PRIu64 "\n",
           cfg->batch, cfg->seq, cfg->grad_accum, cfg->batch * cfg->seq * cfg->grad_accum,
           cfg->steps, cfg->opt.lr, cfg->seed);
    if (info->program_path)
      printf("program %s: %d kernels loaded, %d compiled\n", info->program_path,
             info->kernels_prebuilt, info->kernels_compiled);
    if (info->resumed_from)
      printf("resumed from %s at step %" PRId64 "\n", info->resumed_from, info->start_step);
    fflush(stdout);
  }
  struct sigaction sa, old_int, old_term;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  progress pr = {isatty(STDOUT_FILENO) != 0, quiet, cfg->log_every > 0 ? cfg->log_every : 1,
                 info->start_step,           0,     0};
  dsc_train_summary sum;
  st = dsc_trainer_run(t, &stop_signal, on_step, &pr, &sum);
  sigaction(SIGINT, &old_int, NULL);
  sigaction(SIGTERM, &old_term, NULL);
  dsc_diag_print(ctx, stderr);
  int code = cli_exit_code(st);
  if (st == DSC_OK && !quiet) {
    char took[32];
    fmt_duration(took, sizeof took, sum.seconds);
    printf("%s %" PRId64 " steps (%" PRId64 " this run) in %s, %.0f tok/s; final loss %.4f",
           sum.stopped ? "stopped after" : "done:", sum.steps_done, sum.steps_run, took,
           sum.tokens_per_s, sum.final_loss);
    if (!isnan(sum.best_val_loss)) printf(", best val loss %.4f", sum.best_val_loss);
    putchar('\n');
    if (sum.last_checkpoint) printf("checkpoint: %s\n", sum.last_checkpoint);
  }
  if (st == DSC_OK && sum.stopped && stop_signal) {
    fprintf(stderr, "dsc train: stopped by %s at step %" PRId64 "%s%s\n",
            stop_signal == SIGINT ? "SIGINT" : "SIGTERM", sum.steps_done,
            sum.last_checkpoint ? "; checkpoint " : " (no --out: nothing saved)",
            sum.last_checkpoint ? sum.last_checkpoint : "");
    code = 128 + stop_signal;
  }
  if (st == DSC_OK && o.profile && dsc_trainer_print_profile(t, 25, stdout) != DSC_OK)
    dsc_diag_print(ctx, stderr);
  dsc_trainer_free(t);
  dsc_context_free(ctx);
  return code;
}
