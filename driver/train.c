/* The training loop (include/dsc/trainer.h): compile, build the step graph,
 * feed batches, evaluate, checkpoint, resume; and sampling from a checkpoint.
 *
 * This file drives the layers below it (frontend, passes, interpreter,
 * runtime files); it is the library form of `dsc train` and `dsc sample`.
 * Exact resume rests on three facts: the interpreter is deterministic, the
 * loader's position is saved and restored, and the learning rate depends on
 * the step alone. */
#define _XOPEN_SOURCE 700 /* realpath, mkdir, clock_gettime */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "driver/driver.h"
#include "passes/passes.h"

dsc_status dsc_make_logits_graph(dsc_graph *g) {
  dsc_context *ctx = dsc_module_context(dsc_graph_module(g));
  const dsc_node *out = dsc_graph_output_count(g) == 1 ? dsc_graph_output_at(g, 0) : NULL;
  if (!out || dsc_node_op(out) != DSC_OP_CROSS_ENTROPY) {
    ir_error(ctx, ir_no_loc,
             "graph '%s' does not end in cross_entropy(logits, targets), so its logits cannot be "
             "sampled from",
             dsc_graph_name(g));
    return DSC_ERR_USER;
  }
  dsc_node *logits = dsc_node_input(out, 0);
  return dsc_graph_set_outputs(g, &logits, 1);
}

/* ---------------------------------------------------------------- helpers */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static dsc_status oom(dsc_context *ctx) {
  ir_error(ctx, ir_no_loc, "out of memory");
  return DSC_ERR_INTERNAL;
}

/* mkdir -p */
static dsc_status make_dirs(dsc_context *ctx, ir_arena *a, const char *dir) {
  char *p = ir_arena_strdup(a, dir);
  if (!p) return oom(ctx);
  for (char *s = p + 1;; s++) {
    if (*s != '/' && *s != 0) continue;
    char c = *s;
    *s = 0;
    if (mkdir(p, 0777) != 0 && errno != EEXIST)
      return rt_io_error(ctx, p, "cannot create directory");
    *s = c;
    if (!c) break;
  }
  struct stat sb;
  if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
    ir_error(ctx, rt_loc(dir), "not a directory");
    return DSC_ERR_USER;
  }
  return DSC_OK;
}

/* An absolute path for a file that exists (realpath), else path made
 * absolute against the working directory. */
static const char *absolute(ir_arena *a, const char *path) {
  char buf[PATH_MAX];
  if (realpath(path, buf)) return ir_arena_strdup(a, buf);
  if (path[0] == '/' || !getcwd(buf, sizeof buf)) return ir_arena_strdup(a, path);
  return ir_arena_printf(a, "%s/%s", buf, path);
}

static bool parse_i64(const char *s, int64_t *out) {
  if (!s || !*s) return false;
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (errno || *end) return false;
  *out = v;
  return true;
}

/* JSON number, or null when not finite (JSON has no NaN). */
static void json_num(FILE *f, const char *key, double v, const char *fmt) {
  fprintf(f, ",\"%s\":", key);
  if (isfinite(v))
    fprintf(f, fmt, v);
  else
    fputs("null", f);
}

/* ---------------------------------------------------------------- trainer */

struct dsc_trainer {
  dsc_context *ctx;
  ir_arena arena; /* paths, specs, small arrays */
  drv_ds_config ds; /* --deepspeed FILE (ds.path NULL: none) */
  bool *in_section; /* per settings-table row: the model's train section sets it */
  dsc_trainer_info info;
  dsc_train_config cfg;
  dsc_module *m;   /* the step module */
  dsc_module *fwd; /* forward module for validation (NULL without a val shard) */
  dsc_program *prog; /* the .dsx the modules and kernels come from, or NULL */
  dsc_graph *step_g, *micro_g, *fwd_g; /* micro_step: grad_accum > 1 */
  dsc_params *params;     /* host copy (doubles): checkpoints, initialisation */
  dsc_exec *step_x, *fwd_x; /* the backend's executors of step and validation modules */
  dsc_params *fwd_params;   /* host staging for the validation executor */
  bool params_stale;        /* the step executor holds newer values than params */
  dsc_loader *train, *val;
  dsc_tensor *in_tok, *in_tgt, *in_lr, *v_tok, *v_tgt;
  dsc_tensor *in_seed;       /* dropout's seeds, one per micro-batch (NULL: no dropout) */
  int32_t *buf_in, *buf_tgt; /* B*K*world*T each (the global batch), context-allocated */
  size_t buf_bytes;
  int64_t B, T, K, step, end, last_saved;
  /* fp16: the steps skipped for an overflow (DeepSpeed's skipped_steps),
   * which the schedule does not count, as DeepSpeed's engine does not step
   * its lr scheduler on them; saved with checkpoints */
  int64_t skipped;
  dsc_comm *comm; /* NULL: one rank */
  int rank, world;
  /* --mesh: sp ranks share each sequence (Ulysses), tp ranks compute parts
   * of one step on the same sequences, dp = world / (sp tp) hold different
   * ones; this rank's coordinates; T_rank = T / sp positions */
  int64_t sp, ep, tp, dp, T_rank;
  int sp_rank, dp_rank;
  dsc_mesh *mesh;   /* the axes' groups (NULL: no axis but dp) */
  dsc_trace *trace; /* NULL: off (options.trace) */
  int64_t eval_batches, eval_every, save_every;
  int keep_last;
  ir_rng rng; /* the run's generator: saved and restored with checkpoints */
  uint64_t seed;
  const char *out_dir, *last_ckpt, *data_prefix;
  FILE *metrics, *log;
  const char *metrics_path, *log_path;
  rt_run_lock *lock; /* rank 0's hold on out_dir (runtime/rundir.c) */
  int n_model, n_opt;
  dsc_tensor_spec *model_spec, *opt_spec;
  const char **model_names, **opt_names;
  dsc_tensor **model_t, **opt_t; /* full values: checkpoints and validation read these */
  /* ZeRO stages 1-3: per module param, the full tensor a sharded one is
   * gathered into (NULL: not sharded, the param itself is full) */
  dsc_tensor **full_t;
  int64_t shard_world;
  bool full_fresh;   /* full_t holds the current values (dsc_trainer_gather) */
  bool saving;       /* checkpoints are saved (by rank 0, and shards by every rank) */
  const char *ckpt_dir; /* where, on every rank */
  bool val_any;      /* some rank evaluates (every rank gathers for it) */
  int64_t rss_exec; /* RSS growth over creating the step executor; -1: unknown */
  int64_t heap_exec; /* malloc heap growth over the same; -1: unknown */
  bool rss_stepped; /* the first step's growth is in info.mem_rss_growth */
  /* wall_clock_breakdown: the executor's phase totals after the last step
   * (micro_step's, train_step's), to report each step's difference */
  bool breakdown;
  dsc_phase_times phases_seen[2];
};

/* The resident set of this process (bytes), -1 when /proc is not there. */
static int64_t heap_now(void) { return rt_heap_bytes(); }
static int64_t rss_now(void) { return rt_rss_bytes(); }

const dsc_trainer_info *dsc_trainer_get_info(const dsc_trainer *t) { return &t->info; }
/* Copies the executor's params and states into the host copy when a step
 * ran since the last copy (per step this would cost a full conversion). */
static dsc_status sync_params(dsc_trainer *t) {
  if (!t->params_stale) return DSC_OK;
  dsc_status st = dsc_exec_get_params(t->step_x, t->params);
  if (st == DSC_OK) t->params_stale = false, t->full_fresh = false;
  return st;
}

/* Param i's full value from every rank's chunk (collective). */
static dsc_status gather_param(dsc_trainer *t, int i) {
  dsc_tensor *full = t->full_t[i], *chunk = dsc_params_get(t->params, i);
  int64_t s = dsc_type_numel(&chunk->type), n = dsc_type_numel(&full->type);
  size_t bytes = sizeof(double) * (size_t)(s * t->shard_world);
  double *all = ir_alloc(t->ctx, bytes);
  if (!all) return oom(t->ctx);
  dsc_status st = dsc_comm_all_gather(t->comm, chunk->data, all, s, DSC_F64, t->step);
  if (st == DSC_OK) memcpy(full->data, all, sizeof(double) * (size_t)n);
  ir_free(t->ctx, all, bytes);
  return st;
}

dsc_status dsc_trainer_gather(dsc_trainer *t) {
  dsc_status st = sync_params(t);
  if (st != DSC_OK || !t->shard_world || t->full_fresh) return st;
  for (int i = 0; st == DSC_OK && i < dsc_module_param_count(t->m); i++)
    if (t->full_t[i]) st = gather_param(t, i);
  if (st == DSC_OK) t->full_fresh = true;
  return st;
}

const dsc_tensor *dsc_trainer_full_param(dsc_trainer *t, const char *name) {
  int i = dsc_module_find_param(t->m, name);
  if (i < 0 || t->params_stale || (t->shard_world && !t->full_fresh)) return NULL;
  return t->full_t[i] ? t->full_t[i] : dsc_params_get(t->params, i);
}

/* The full values for validation and checkpoints: one rank alone cannot
 * gather them (dsc_trainer_gather is collective). */
static dsc_status full_values(dsc_trainer *t) {
  dsc_status st = sync_params(t);
  if (st != DSC_OK || !t->shard_world || t->full_fresh) return st;
  ir_error(t->ctx, ir_no_loc,
           "trainer: the params are sharded (ZeRO stage %" PRId64
           "): every rank calls "
           "dsc_trainer_gather first",
           t->cfg.zero.stage);
  return DSC_ERR_USER;
}

/* After a restore into the full tensors: this rank's chunks. */
static void scatter_full(dsc_trainer *t) {
  for (int i = 0; t->shard_world && i < dsc_module_param_count(t->m); i++) {
    dsc_tensor *full = t->full_t[i], *chunk = dsc_params_get(t->params, i);
    if (!full) continue;
    int64_t s = dsc_type_numel(&chunk->type), n = dsc_type_numel(&full->type);
    int64_t first = (int64_t)t->rank * s, k = first >= n ? 0 : n - first < s ? n - first : s;
    memset(chunk->data, 0, sizeof(double) * (size_t)s);
    if (k > 0) memcpy(chunk->data, full->data + first, sizeof(double) * (size_t)k);
  }
  t->full_fresh = true;
}

dsc_status dsc_trainer_print_profile(dsc_trainer *t, int top, FILE *out) {
  return dsc_exec_print_profile(t->step_x, "train_step", top, out);
}

const dsc_params *dsc_trainer_params(dsc_trainer *t) {
  return sync_params(t) == DSC_OK ? t->params : NULL;
}

void dsc_trainer_free(dsc_trainer *t) {
  if (!t) return;
  dsc_context *ctx = t->ctx;
  if (t->metrics) fclose(t->metrics);
  if (t->log) fclose(t->log);
  rt_run_lock_release(t->lock);
  dsc_loader_free(t->train);
  dsc_loader_free(t->val);
  dsc_tensor *ts[6] = {t->in_tok, t->in_tgt, t->in_lr, t->v_tok, t->v_tgt, t->in_seed};
  for (int i = 0; i < 6; i++) dsc_tensor_free(ctx, ts[i]);
  if (t->buf_in) ir_free(ctx, t->buf_in, t->buf_bytes);
  if (t->buf_tgt) ir_free(ctx, t->buf_tgt, t->buf_bytes);
  dsc_exec_free(t->step_x);
  dsc_exec_free(t->fwd_x);
  dsc_mesh_free(t->mesh);
  for (int i = 0; t->full_t && i < dsc_module_param_count(t->m); i++)
    dsc_tensor_free(ctx, t->full_t[i]);
  dsc_params_free(t->params);
  dsc_params_free(t->fwd_params);
  dsc_module_free(t->m);
  dsc_module_free(t->fwd);
  dsc_program_free(t->prog);
  ir_arena_release(&t->arena);
  ir_free(ctx, t, sizeof *t);
}

/* Settings recorded in a checkpoint must agree with explicit flags. */
static dsc_status agree(dsc_context *ctx, const dsc_checkpoint *c, const char *key,
                        int64_t *value) {
  const char *s = dsc_checkpoint_extra(c, key);
  int64_t v;
  if (!s) return DSC_OK;
  if (!parse_i64(s, &v) || v <= 0) {
    ir_error(ctx, rt_loc(c->dir), "malformed checkpoint state: \"%s\" is '%s'", key, s);
    return DSC_ERR_USER;
  }
  if (*value > 0 && *value != v) {
    ir_error(ctx, rt_loc(c->dir),
             "the checkpoint was trained with %s = %" PRId64 ", not %" PRId64
             " (a resumed run keeps its %s)",
             key, v, *value, key);
    return DSC_ERR_USER;
  }
  *value = v;
  return DSC_OK;
}

/* Keeps the lines of a JSON-lines log whose "step" is at most `step` (a
 * resumed run rewrites what came after its checkpoint), then opens it for
 * appending; a fresh run truncates. */
static dsc_status open_log(dsc_context *ctx, const char *path, int64_t keep_upto, FILE **out) {
  *out = NULL;
  char *kept = NULL;
  size_t kept_n = 0;
  if (keep_upto > 0) {
    /* Only a regular file has lines to keep (a FIFO or /dev/stdout: none). */
    const char *kind;
    int in_fd = rt_open_regular_fd(path, 0, &kind);
    FILE *in = in_fd >= 0 ? fdopen(in_fd, "rb") : NULL;
    if (!in && in_fd >= 0) close(in_fd);
    if (in) {
      kept = malloc(1);
      char *line = NULL;
      size_t cap = 0;
      ssize_t n;
      while (kept && (n = getline(&line, &cap, in)) > 0) {
        const char *p = strstr(line, "\"step\":");
        long long s = p ? strtoll(p + 7, NULL, 10) : -1;
        if (s < 0 || s > keep_upto) continue;
        char *nk = realloc(kept, kept_n + (size_t)n + 1);
        if (!nk) {
          free(kept);
          kept = NULL;
          break;
        }
        kept = nk;
        memcpy(kept + kept_n, line, (size_t)n);
        kept_n += (size_t)n;
      }
      free(line);
      fclose(in);
      if (!kept) return oom(ctx);
    }
  }
  FILE *f = fopen(path, "w");
  if (!f) {
    free(kept);
    return rt_io_error(ctx, path, "cannot open for writing");
  }
  if (kept_n && fwrite(kept, 1, kept_n, f) != kept_n) {
    free(kept);
    fclose(f);
    return rt_io_error(ctx, path, "write failed");
  }
  free(kept);
  if (fflush(f) != 0) {
    dsc_status st = rt_io_error(ctx, path, "write failed");
    fclose(f);
    return st;
  }
  *out = f;
  return DSC_OK;
}

static dsc_status build_specs(dsc_trainer *t) {
  const dsc_module *m = t->m;
  int n = dsc_module_param_count(m);
  for (int i = 0; i < n; i++) {
    if (dsc_step_is_sum(m, i)) continue; /* rewritten each step: not checkpointed */
    if (dsc_module_param_is_state(m, i))
      t->n_opt++;
    else
      t->n_model++;
  }
  int cap_m = t->n_model ? t->n_model : 1, cap_o = t->n_opt ? t->n_opt : 1;
  t->model_spec = ir_arena_alloc(&t->arena, sizeof(dsc_tensor_spec) * (size_t)cap_m);
  t->opt_spec = ir_arena_alloc(&t->arena, sizeof(dsc_tensor_spec) * (size_t)cap_o);
  t->model_names = ir_arena_alloc(&t->arena, sizeof(char *) * (size_t)cap_m);
  t->opt_names = ir_arena_alloc(&t->arena, sizeof(char *) * (size_t)cap_o);
  t->model_t = ir_arena_alloc(&t->arena, sizeof(dsc_tensor *) * (size_t)cap_m);
  t->opt_t = ir_arena_alloc(&t->arena, sizeof(dsc_tensor *) * (size_t)cap_o);
  t->full_t = ir_arena_alloc(&t->arena, sizeof(dsc_tensor *) * (size_t)(n + 1));
  if (t->arena.failed) return oom(t->ctx);
  memset(t->full_t, 0, sizeof(dsc_tensor *) * (size_t)(n + 1));
  int km = 0, ko = 0;
  for (int i = 0; i < n; i++) {
    if (dsc_step_is_sum(m, i)) continue; /* rewritten each step: not checkpointed */
    dsc_tensor_spec s = {dsc_module_param_name(m, i), dsc_module_param_type(m, i)};
    dsc_tensor *v = dsc_params_get(t->params, i);
    int64_t w;
    int sh = dsc_module_param_shard(m, i, &s.type, &w);
    if (sh < 0 || (sh > 0 && w != t->world)) {
      ir_error(t->ctx, ir_no_loc, "trainer: param '%s' has malformed shard metadata", s.name);
      return DSC_ERR_INTERNAL;
    }
    if (sh > 0) { /* checkpoints hold full tensors, whatever the world */
      if (!(v = t->full_t[i] = dsc_tensor_new(t->ctx, s.type))) return oom(t->ctx);
      t->shard_world = w;
    }
    if (dsc_module_param_is_state(m, i)) {
      t->opt_spec[ko] = s, t->opt_names[ko] = s.name, t->opt_t[ko++] = v;
      t->info.n_state += dsc_type_numel(&s.type);
    } else {
      t->model_spec[km] = s, t->model_names[km] = s.name, t->model_t[km++] = v;
      t->info.n_params += dsc_type_numel(&s.type);
    }
  }
  return DSC_OK;
}

/* Copies a checkpoint's checked tensors into the params (by a sorted
 * index: a model of 1e5 tensors resumes in O(n log n), not O(n^2)). */
static dsc_status restore_set(dsc_context *ctx, const dsc_tensor_set *s, dsc_tensor **dst,
                              const char **names, int n) {
  int *at = ir_alloc(ctx, sizeof *at * (size_t)(n > 0 ? n : 1));
  if (!at || !rt_tensor_set_lookup(ctx, s, names, n, at)) {
    if (at) ir_free(ctx, at, sizeof *at * (size_t)(n > 0 ? n : 1));
    return oom(ctx);
  }
  for (int i = 0; i < n; i++) /* dsc_tensor_set_check found each, of this type */
    memcpy(dst[i]->data, s->tensors[at[i]]->data,
           sizeof(double) * (size_t)dsc_type_numel(&dst[i]->type));
  ir_free(ctx, at, sizeof *at * (size_t)(n > 0 ? n : 1));
  return DSC_OK;
}

/* A setting the program was compiled with must agree with an explicit
 * flag (0: not given): the graphs are fixed in the file. */
static dsc_status program_agrees(dsc_trainer *t, const char *key, const char *flag, int64_t want,
                                 int64_t *value) {
  dsc_status st = dsc_program_meta_i64(t->prog, key, value);
  if (st == DSC_OK && want > 0 && want != *value) {
    ir_error(t->ctx, rt_loc(dsc_program_path(t->prog)),
             "was compiled with %s %" PRId64 ", not %" PRId64
             " (its graphs are fixed: recompile with dsc compile %s %" PRId64 ")",
             flag, *value, want, flag, want);
    st = DSC_ERR_USER;
  }
  return st;
}

/* The step module and the run's settings from a program file. */
static dsc_status program_modules(dsc_trainer *t, int64_t *B, int64_t *T, int64_t *K,
                                  const char *precision) {
  dsc_status st;
  if ((st = program_agrees(t, "batch", "--batch", *B, B)) != DSC_OK ||
      (st = program_agrees(t, "seq", "--seq", *T, T)) != DSC_OK ||
      (st = program_agrees(t, "grad_accum", "--grad-accum", *K, K)) != DSC_OK ||
      (st = dsc_program_meta_i64(t->prog, "vocab", &t->info.vocab)) != DSC_OK)
    return st;
  const char *prec = dsc_program_meta(t->prog, "precision");
  dsc_precision want, have;
  if (!prec || dsc_precision_from_name(prec, &have) != 0) {
    ir_error(t->ctx, rt_loc(dsc_program_path(t->prog)),
             "not a valid .dsx file: meta 'precision' is missing or unknown");
    return DSC_ERR_USER;
  }
  if (precision && dsc_precision_from_name(precision, &want) == 0 && want != have) {
    ir_error(t->ctx, rt_loc(dsc_program_path(t->prog)),
             "was compiled with --precision %s, not %s (its graphs are fixed: recompile with "
             "dsc compile --precision %s)",
             prec, precision, precision);
    return DSC_ERR_USER;
  }
  return dsc_program_module(t->prog, "step", &t->m);
}

/* --memory-budget: the step's arenas (the plan) must fit, or nothing is
 * allocated and the message says what the step holds. */
static dsc_status check_budget(dsc_trainer *t, dsc_backend backend, const cg_memplan *p,
                               int64_t budget) {
  if (backend != DSC_BACKEND_CPU) {
    ir_error(t->ctx, ir_no_loc,
             "a memory budget needs the cpu backend (its arenas are planned; the "
             "interpreter allocates as it goes)");
    return DSC_ERR_USER;
  }
  if (p->peak <= budget) return DSC_OK;
  const double mib = 1024.0 * 1024.0;
  ir_error(t->ctx, ir_no_loc,
           "the training step needs %.1f MiB per rank, over the memory budget of %.1f MiB by "
           "%.1f MiB: params %.1f, grads %.1f, optimizer %.1f, activations %.1f, workspace "
           "%.1f, comm %.1f MiB (dsc plan shows them for every ZeRO stage; a higher stage, "
           "more ranks, --checkpoint-activations selective or a smaller batch need less)",
           (double)p->peak / mib, (double)budget / mib, (double)(p->peak - budget) / mib,
           (double)p->bytes[CG_MEM_PARAMS] / mib, (double)p->bytes[CG_MEM_GRADS] / mib,
           (double)p->bytes[CG_MEM_OPTIMIZER] / mib, (double)p->bytes[CG_MEM_ACTIVATIONS] / mib,
           (double)p->bytes[CG_MEM_WORKSPACE] / mib, (double)p->bytes[CG_MEM_COMM] / mib);
  return DSC_ERR_USER;
}

static dsc_status check_host_budget(dsc_trainer *t, dsc_backend backend, const cg_memplan *p,
                                    int64_t budget) {
  if (backend != DSC_BACKEND_CPU) {
    ir_error(t->ctx, ir_no_loc,
             "a host memory budget needs the cpu backend (its arenas are planned; the "
             "interpreter allocates as it goes)");
    return DSC_ERR_USER;
  }
  if (p->host_bytes <= budget) return DSC_OK;
  const double mib = 1024.0 * 1024.0;
  ir_error(t->ctx, ir_no_loc,
           "the offloaded values need %.1f MiB of host memory per rank, over the host memory "
           "budget of %.1f MiB by %.1f MiB: params %.1f, optimizer %.1f MiB (host arena %.1f, "
           "host work %.1f MiB; --offload-optimizer/--offload-param disk keep them on disk, "
           "streamed, none puts them on the device)",
           (double)p->host_bytes / mib, (double)budget / mib,
           (double)(p->host_bytes - budget) / mib, (double)p->host_params / mib,
           (double)p->host_optimizer / mib, (double)p->host_arena / mib,
           (double)p->host_work / mib);
  return DSC_ERR_USER;
}

/* The disk tier's file of this rank: <offload_dir>/dsc-offload-rank<R>.bin. */
static dsc_status open_offload_file(dsc_trainer *t, const dsc_trainer_options *o) {
  int64_t disk = 0;
  dsc_exec_tier_bytes(t->step_x, NULL, NULL, &disk);
  if (disk == 0) return DSC_OK;
  if (!o->offload_dir || !o->offload_dir[0]) {
    ir_error(t->ctx, ir_no_loc,
             "offloading to disk needs a directory for the offload files: give --offload-dir DIR");
    return DSC_ERR_USER;
  }
  char *path = ir_arena_printf(&t->arena, "%s/dsc-offload-rank%d.bin", o->offload_dir, t->rank);
  if (!path) return DSC_ERR_INTERNAL;
  return dsc_exec_set_offload_file(t->step_x, path);
}

/* ------------------------------------------------ opening a trainer
 * dsc_trainer_open in named steps: resume (the checkpoint), open the
 * program (model or .dsx), resolve the settings, open the data, build the
 * graphs, restore, open the executors, open the output. */

typedef struct {
  const dsc_trainer_options *o;
  dsc_checkpoint *ck; /* the checkpoint resumed from, or NULL */
  int64_t B, T, K;    /* the flags', then the checkpoint's, then the model's */
  const char *model_path, *prefix;
  int64_t ck_global; /* a resume at another world keeps the global batch */
  const char *train_path, *val_path;
  bool has_val; /* this rank evaluates */
  dsc_backend backend;
  bool settings_only; /* dsc_trainer_print_config: no data is opened, none is needed */
} open_state;

static dsc_status check_options(dsc_trainer *t, const dsc_trainer_options *o) {
  if (o->batch < 0 || o->seq < 0 || o->grad_accum < 0 || o->steps < 0 || o->eval_batches < 0 ||
      o->stop_at < 0) {
    ir_error(t->ctx, ir_no_loc,
             "trainer: batch, seq, grad_accum, steps, eval_batches and stop_at must not be "
             "negative");
    return DSC_ERR_USER;
  }
  dsc_status st;
  if ((st = drv_check_ranks_here(t->ctx, o->comm)) != DSC_OK ||
      (o->threads > 0 && (st = rt_check_threads(t->ctx, o->threads)) != DSC_OK))
    return st; /* driver/limits.c: before anything is loaded or compiled */
  if (o->init_from && o->resume) {
    ir_error(t->ctx, ir_no_loc,
             "--init-from starts a run from published weights and --resume continues a run "
             "from its checkpoint: give one of them");
    return DSC_ERR_USER;
  }
  t->comm = o->comm;
  t->rank = o->comm ? dsc_comm_rank(o->comm) : 0;
  t->world = o->comm ? dsc_comm_world(o->comm) : 1;
  t->info.rank = t->rank, t->info.world = t->world;
  return DSC_OK;
}

/* --deepspeed FILE: its settings (applied over the train section once the
 * model is compiled) and, before the compile, DeepSpeed's batch triple as
 * the micro-batch and grad_accum where the flags leave them; its nvme_path
 * as the offload directory where --offload-dir leaves it. */
static dsc_status open_ds_config(dsc_trainer *t, open_state *s, dsc_trainer_options *oc) {
  if (!oc->ds_config) return DSC_OK;
  dsc_context *ctx = t->ctx;
  dsc_status st = drv_ds_config_read(ctx, oc->ds_config, &t->arena, &t->ds);
  if (st != DSC_OK) return st;
  if (oc->model_path && drv_is_program(oc->model_path)) {
    ir_error(ctx, rt_loc(oc->ds_config),
             "a .dsx program holds its settings compiled in; --deepspeed applies to a model file "
             "(.dsm)");
    return DSC_ERR_USER;
  }
  int64_t micro, accum;
  if ((st = drv_ds_config_batch(ctx, &t->ds, (int)t->dp, oc->batch, oc->grad_accum, &micro,
                                &accum)) != DSC_OK)
    return st;
  if (s->B <= 0 && micro > 0) s->B = micro;
  if (s->K <= 0 && accum > 0) s->K = accum;
  if ((!oc->offload_dir || !oc->offload_dir[0]) && t->ds.offload_dir)
    oc->offload_dir = t->ds.offload_dir;
  return DSC_OK;
}

/* The step module's train section as compiled, then the ds_config over it. */
static dsc_status apply_ds_config(dsc_trainer *t) {
  int n = dsc_setting_count();
  t->in_section = ir_arena_alloc(&t->arena, sizeof(bool) * (size_t)(n + 1));
  if (!t->in_section) return oom(t->ctx);
  for (int i = 0; i < n; i++) {
    char key[96];
    snprintf(key, sizeof key, "train.%s", dsc_setting_at(i)->key);
    t->in_section[i] = dsc_module_get_meta(t->m, key) != NULL;
  }
  /* lr and weight_decay also come from the section's optimizer(lr = ...) */
  const char *opt = dsc_module_get_meta(t->m, "train.optimizer");
  for (int i = 0; opt && i < n; i++) {
    const char *k = dsc_setting_at(i)->key;
    if (strcmp(k, "lr") == 0 || strcmp(k, "weight_decay") == 0) {
      char pat[32];
      snprintf(pat, sizeof pat, "%s =", k);
      t->in_section[i] |= strstr(opt, pat) != NULL;
    }
  }
  return t->ds.path ? drv_ds_config_apply(t->ctx, &t->ds, t->m) : DSC_OK;
}

/* --resume: the checkpoint, and what it records of the model, the data and
 * the shape of a step (batch, seq, grad_accum must agree with the flags). */
static dsc_status open_resume(dsc_trainer *t, open_state *s) {
  dsc_context *ctx = t->ctx;
  const dsc_trainer_options *o = s->o;
  if (o->resume) {
    dsc_status st = dsc_checkpoint_load(ctx, o->resume, NULL, 0, NULL, 0, &s->ck);
    if (st != DSC_OK) return st;
    const dsc_checkpoint *ck = s->ck;
    t->info.resumed_from = ir_arena_strdup(&t->arena, ck->dir);
    if (!s->model_path) s->model_path = dsc_checkpoint_extra(ck, "model");
    if (!s->prefix) s->prefix = dsc_checkpoint_extra(ck, "data");
    if ((st = agree(ctx, ck, "batch", &s->B)) != DSC_OK ||
        (st = agree(ctx, ck, "seq", &s->T)) != DSC_OK ||
        (st = agree(ctx, ck, "grad_accum", &s->K)) != DSC_OK)
      return st;
    /* the checkpoint's data ranks: its world over its sp and tp ranks */
    int64_t ck_w = 1, ck_sp = 1, ck_tp = 1, B = s->B, K = s->K;
    const char *w = dsc_checkpoint_extra(ck, "world"), *sp = dsc_checkpoint_extra(ck, "sp");
    const char *tp = dsc_checkpoint_extra(ck, "tp");
    if (sp && (!parse_i64(sp, &ck_sp) || ck_sp < 1)) ck_sp = 1;
    if (tp && (!parse_i64(tp, &ck_tp) || ck_tp < 1)) ck_tp = 1;
    if (w && parse_i64(w, &ck_w) && ck_w > 0 && ck_w % (ck_sp * ck_tp) == 0) ck_w /= ck_sp * ck_tp;
    if (w && ck_w != t->dp && o->grad_accum <= 0 && K > 0 && ck_w > 0 && B > 0 &&
        K <= INT64_MAX / B / ck_w)
      s->ck_global = B * K * ck_w, s->K = 0; /* grad_accum follows from the world */
    if (!s->model_path || !s->prefix) {
      ir_error(ctx, rt_loc(ck->dir), "the checkpoint does not record its %s; give it explicitly",
               !s->model_path ? "model file" : "data prefix");
      return DSC_ERR_USER;
    }
  }
  if (!s->model_path || (!s->prefix && !s->settings_only)) {
    ir_error(ctx, ir_no_loc, "trainer: %s is required",
             !s->model_path ? "a model file" : "a data prefix");
    return DSC_ERR_USER;
  }
  return DSC_OK;
}

/* The step module: from a program file, else compiled (the forward
 * signature checked, the vocabulary found). */
static dsc_status open_program(dsc_trainer *t, open_state *s) {
  dsc_context *ctx = t->ctx;
  t->info.model_path = absolute(&t->arena, s->model_path);
  t->data_prefix = s->prefix ? absolute(&t->arena, s->prefix) : "";
  if (!t->info.model_path || !t->data_prefix) return oom(ctx);
  dsc_status st;
  if (drv_is_program(s->model_path)) {
    if (t->world > 1) {
      /* Its step graph is one rank's, without the gradient all-reduce. */
      ir_error(ctx, rt_loc(s->model_path),
               "a .dsx program trains on one rank; data-parallel runs (%d ranks) need the model "
               "file (.dsm)",
               t->world);
      return DSC_ERR_USER;
    }
    if ((st = dsc_program_open(ctx, s->model_path, &t->prog)) != DSC_OK) return st;
    t->info.program_path = t->info.model_path;
    if ((st = program_modules(t, &s->B, &s->T, &s->K, s->o->precision)) != DSC_OK) return st;
  } else {
    drv_model_facts facts;
    if ((st = drv_compile_step(ctx, s->model_path, s->B, s->T, t->sp, &t->m, &facts)) != DSC_OK)
      return st;
    /* the model's ops before the passes change them */
    if (s->o->init_from && (st = dsc_hf_check_config(ctx, s->o->init_from, t->m)) != DSC_OK)
      return st;
    s->B = facts.B, s->T = facts.T;
    t->T_rank = facts.T_rank;
    t->info.vocab = facts.vocab;
    if ((st = apply_ds_config(t)) != DSC_OK) return st;
  }
  t->B = s->B, t->T = s->T;
  if (!t->T_rank) t->T_rank = t->T; /* a program file: one rank */
  t->info.model_name = dsc_module_name(t->m);
  return DSC_OK;
}

/* The settings in layers, each over the one before: the defaults and the
 * train section (dsc_train_config_from_module), the checkpoint's state.json,
 * the flags. One row per setting a checkpoint records; the run knobs' flags
 * (ZeRO, remat, offload) are the last layer, drv_apply_run_settings. */
typedef enum {
  LAYER_COUNT,   /* int64 >= 1 */
  LAYER_CADENCE, /* int64 >= 0 */
  LAYER_RATE,    /* double > 0, finite */
  LAYER_SEED,    /* uint64 */
  LAYER_STAGE,   /* the ZeRO stage, in the settings table's range */
} layer_kind;
typedef struct {
  const char *ck_key; /* in the checkpoint's state; NULL: not recorded */
  layer_kind kind;
  void *field;   /* of dsc_train_config */
  bool flag_set; /* the flag's value below overrides */
  int64_t flag_i;
  double flag_f;
} setting_layer;

static void apply_layers(const setting_layer *rows, int n, const dsc_checkpoint *ck) {
  for (int i = 0; i < n; i++) {
    const setting_layer *r = &rows[i];
    const char *s = ck && r->ck_key ? dsc_checkpoint_extra(ck, r->ck_key) : NULL;
    int64_t v = 0;
    uint64_t u = 0;
    if (s && r->kind == LAYER_RATE) {
      char *end;
      double f = strtod(s, &end);
      if (!*end && f > 0 && isfinite(f)) *(double *)r->field = f;
    } else if (s && r->kind == LAYER_SEED) {
      if (sscanf(s, "%" SCNu64, &u) == 1) *(uint64_t *)r->field = u;
    } else if (s && r->kind == LAYER_STAGE) {
      /* the range of the settings table's row (include/dsc/settings.h) */
      dsc_setting_value sv;
      if (dsc_setting_parse(dsc_setting_find("zero.stage"), s, true, &sv))
        *(int64_t *)r->field = sv.i;
    } else if (s && parse_i64(s, &v) && (r->kind == LAYER_COUNT ? v > 0 : v >= 0)) {
      *(int64_t *)r->field = v;
    }
    if (!r->flag_set) continue;
    if (r->kind == LAYER_RATE)
      *(double *)r->field = r->flag_f;
    else if (r->kind == LAYER_SEED)
      *(uint64_t *)r->field = (uint64_t)r->flag_i;
    else
      *(int64_t *)r->field = r->flag_i;
  }
}

/* A resumed run keeps its master weights or their absence (the params'
 * dtype depends on it): from the state's "master_weights", or, in a state
 * written before it was recorded, from whether the optimizer set holds
 * opt.master.* tensors. */
static dsc_status resolve_master_weights(dsc_trainer *t, open_state *s) {
  if (!s->ck) return DSC_OK;
  const char *v = dsc_checkpoint_extra(s->ck, "master_weights");
  bool ck_mw = false;
  if (v && strcmp(v, "true") != 0 && strcmp(v, "false") != 0) {
    ir_error(t->ctx, rt_loc(s->ck->dir),
             "malformed checkpoint state: \"master_weights\" is '%s' (true or false)", v);
    return DSC_ERR_USER;
  }
  if (v) {
    ck_mw = strcmp(v, "true") == 0;
  } else {
    const dsc_tensor_set *o = s->ck->optimizer;
    for (int i = 0; o && i < o->n && !ck_mw; i++) ck_mw = strncmp(o->names[i], "opt.master.", 11) == 0;
    if (!ck_mw && t->cfg.precision == DSC_PRECISION_F32) ck_mw = t->cfg.master_weights;
  }
  if (s->o->knobs.has_master_weights && s->o->knobs.master_weights != ck_mw &&
      t->cfg.precision != DSC_PRECISION_F32) {
    ir_error(t->ctx, rt_loc(s->ck->dir),
             "the checkpoint was trained with master_weights %s, not %s (a resumed run keeps "
             "them: its params' dtype depends on it)",
             ck_mw ? "true" : "false", ck_mw ? "false" : "true");
    return DSC_ERR_USER;
  }
  t->cfg.master_weights = ck_mw;
  return DSC_OK;
}

/* A resumed run keeps a setting whose states only it has, or its absence:
 * the delayed parameter update (opt.delayed.*: the gradient not applied
 * yet) and ZenFlow (opt.zf.*: the host's sums, the selection). From the
 * state's `key` ("delayed_update", "zenflow"), or from whether the
 * optimizer set holds `marker`. A flag that contradicts it is an error. */
static dsc_status resolve_kept_setting(dsc_trainer *t, open_state *s, const char *key,
                                       const char *marker, bool has_flag, bool flag, bool *field,
                                       const char *holds) {
  if (!s->ck) return DSC_OK;
  const char *v = dsc_checkpoint_extra(s->ck, key);
  bool ck_on = false;
  if (v && strcmp(v, "true") != 0 && strcmp(v, "false") != 0) {
    ir_error(t->ctx, rt_loc(s->ck->dir),
             "malformed checkpoint state: \"%s\" is '%s' (true or false)", key, v);
    return DSC_ERR_USER;
  }
  if (v) {
    ck_on = strcmp(v, "true") == 0;
  } else {
    const dsc_tensor_set *o = s->ck->optimizer;
    for (int i = 0; o && i < o->n && !ck_on; i++) ck_on = strcmp(o->names[i], marker) == 0;
  }
  if (has_flag && flag != ck_on) {
    ir_error(t->ctx, rt_loc(s->ck->dir),
             "the checkpoint was trained with %s %s, not %s (a resumed run keeps it: the "
             "checkpoint %s %s)",
             key, ck_on ? "true" : "false", ck_on ? "false" : "true", ck_on ? "holds" : "has no",
             holds);
    return DSC_ERR_USER;
  }
  *field = ck_on;
  return DSC_OK;
}

static dsc_status resolve_delayed_update(dsc_trainer *t, open_state *s) {
  const dsc_run_knobs *k = &s->o->knobs;
  return resolve_kept_setting(t, s, "delayed_update", "opt.delayed_primed", k->has_delayed_update,
                              k->delayed_update, &t->cfg.offload.delayed_update,
                              "a gradient not applied yet");
}

static dsc_status resolve_zenflow(dsc_trainer *t, open_state *s) {
  const dsc_run_knobs *k = &s->o->knobs;
  return resolve_kept_setting(t, s, "zenflow", "opt.zf.step", k->has_zenflow, k->zenflow,
                              &t->cfg.zenflow.enabled,
                              "ZenFlow's states: the host's gradient sums and the selection");
}

/* A resumed run keeps its precision (its optimizer states depend on it); a
 * program file's graphs fix it (agreed with the flag in program_modules)
 * and, with muon's separate adam_lr, the ratio of the two rates. */
static dsc_status resolve_precision(dsc_trainer *t, open_state *s) {
  dsc_context *ctx = t->ctx;
  dsc_train_config *cfg = &t->cfg;
  const char *flag = s->o->precision;
  if (flag && dsc_precision_from_name(flag, &cfg->precision) != 0) {
    ir_error(ctx, ir_no_loc, "trainer: precision '%s' is not one of f32, bf16, fp16", flag);
    return DSC_ERR_USER;
  }
  const char *ck_prec = s->ck ? dsc_checkpoint_extra(s->ck, "precision") : NULL;
  if (ck_prec) {
    dsc_precision p;
    if (dsc_precision_from_name(ck_prec, &p) != 0) {
      ir_error(ctx, rt_loc(s->ck->dir), "malformed checkpoint state: \"precision\" is '%s'",
               ck_prec);
      return DSC_ERR_USER;
    }
    if (flag && p != cfg->precision) {
      ir_error(ctx, rt_loc(s->ck->dir),
               "the checkpoint was trained with precision %s, not %s (a resumed run keeps its "
               "precision)",
               ck_prec, flag);
      return DSC_ERR_USER;
    }
    cfg->precision = p;
  }
  if (!t->prog) return DSC_OK;
  dsc_precision have = cfg->precision;
  dsc_precision_from_name(dsc_program_meta(t->prog, "precision"), &have);
  if (ck_prec && have != cfg->precision) {
    ir_error(ctx, rt_loc(s->ck->dir), "the checkpoint was trained with precision %s, %s holds %s",
             ck_prec, dsc_program_path(t->prog), dsc_precision_name(have));
    return DSC_ERR_USER;
  }
  cfg->precision = have;
  const char *plr = dsc_program_meta(t->prog, "lr");
  if (cfg->opt.kind == DSC_OPT_MUON && cfg->opt.adam_lr > 0 &&
      (!plr || strtod(plr, NULL) != cfg->opt.lr)) {
    ir_error(ctx, rt_loc(dsc_program_path(t->prog)),
             "was compiled for lr %s, not %g (muon with adam_lr: the ratio is in the graph; "
             "recompile with dsc compile --lr %g)",
             plr ? plr : "?", cfg->opt.lr, cfg->opt.lr);
    return DSC_ERR_USER;
  }
  return DSC_OK;
}

static dsc_status resolve_settings(dsc_trainer *t, open_state *s) {
  dsc_context *ctx = t->ctx;
  const dsc_trainer_options *o = s->o;
  dsc_train_config *cfg = &t->cfg;
  dsc_status st;
  if ((st = dsc_train_config_from_module(t->m, cfg)) != DSC_OK) return st;
  cfg->batch = s->B, cfg->seq = s->T;
  if (s->K > 0) cfg->grad_accum = s->K;
  const setting_layer layers[] = {
      {"steps", LAYER_COUNT, &cfg->steps, o->steps > 0, o->steps, 0},
      {"lr", LAYER_RATE, &cfg->opt.lr, o->lr > 0, 0, o->lr},
      {"save_every", LAYER_CADENCE, &cfg->save_every, o->save_every >= 0, o->save_every, 0},
      {"eval_every", LAYER_CADENCE, &cfg->eval_every, o->eval_every >= 0, o->eval_every, 0},
      {NULL, LAYER_COUNT, &cfg->log_every, o->log_every > 0, o->log_every, 0},
      {"seed", LAYER_SEED, &cfg->seed, o->has_seed, (int64_t)o->seed, 0},
      {"zero_stage", LAYER_STAGE, &cfg->zero.stage, false, 0, 0}, /* flag: the knobs below */
  };
  apply_layers(layers, (int)(sizeof layers / sizeof layers[0]), s->ck);
  if ((st = resolve_precision(t, s)) != DSC_OK) return st;
  if (s->ck_global > 0) cfg->global_batch = s->ck_global;
  drv_run_settings rs = {.who = "trainer",
                         .B = s->B,
                         .world = t->world,
                         .mesh = {t->sp, t->ep, t->tp},
                         .grad_accum = s->K,
                         .knobs = &o->knobs};
  if ((st = drv_apply_run_settings(ctx, &rs, cfg)) != DSC_OK) return st;
  if ((st = resolve_master_weights(t, s)) != DSC_OK) return st;
  if ((st = resolve_delayed_update(t, s)) != DSC_OK) return st;
  if ((st = resolve_zenflow(t, s)) != DSC_OK) return st;
  if (s->ck) { /* checkpoints hold full tensors: any world and stage resumes them */
    int64_t ck_world = 1;
    const char *w = dsc_checkpoint_extra(s->ck, "world");
    if (w && (!parse_i64(w, &ck_world) || ck_world <= 0)) {
      ir_error(ctx, rt_loc(s->ck->dir), "malformed checkpoint state: \"world\" is '%s'", w);
      return DSC_ERR_USER;
    }
  }
  int64_t B = s->B, T = s->T, K = t->K = s->K = cfg->grad_accum;
  t->seed = cfg->seed;
  t->info.cfg = cfg;
  t->info.global_batch = B * K * t->dp;
  t->eval_batches = o->eval_batches > 0 ? o->eval_batches : 8;
  t->keep_last = o->keep_last;
  if (B > INT64_MAX / K || B * K > INT64_MAX / t->world || B * K * t->world > INT64_MAX / T) {
    ir_error(ctx, ir_no_loc, "trainer: batch * grad_accum * world * seq overflows");
    return DSC_ERR_USER;
  }
  return DSC_OK;
}

/* Data: the training shard must exist, the validation shard may. */
static dsc_status open_data(dsc_trainer *t, open_state *s) {
  ir_arena *a = &t->arena;
  s->train_path = ir_arena_printf(a, "%s_train.bin", t->data_prefix);
  s->val_path = ir_arena_printf(a, "%s_val.bin", t->data_prefix);
  if (!s->train_path || !s->val_path) return oom(t->ctx);
  struct stat sb;
  bool has_val = stat(s->val_path, &sb) == 0;
  /* A validation shard shorter than one window cannot be evaluated: say so
   * and train without it rather than refusing the whole run. */
  int64_t val_tokens = 0;
  if (has_val && rt_shard_peek(s->val_path, &val_tokens) && val_tokens < s->T + 1) {
    ir_diag(t->ctx, DSC_DIAG_WARNING, rt_loc(s->val_path),
            "holds fewer than seq + 1 = %" PRId64 " tokens; training without validation", s->T + 1);
    has_val = false;
  }
  t->val_any = has_val;
  s->has_val = has_val && t->rank == 0; /* rank 0 alone evaluates */
  t->info.data_train = s->train_path;
  t->info.data_val = s->has_val ? s->val_path : NULL;
  return DSC_OK;
}

/* The graphs: a program file holds them ready (any backend runs them, the
 * interpreter included); a model file goes through the pipeline. Then the
 * params, initialised for this rank. */
static dsc_status open_graphs(dsc_trainer *t, open_state *s) {
  dsc_context *ctx = t->ctx;
  const dsc_trainer_options *o = s->o;
  dsc_status st;
  s->backend = dsc_backend_default();
  if (o->backend && dsc_backend_from_name(o->backend, &s->backend) != 0) {
    ir_error(ctx, ir_no_loc, "unknown backend '%s' (interp, cpu or cuda)", o->backend);
    return DSC_ERR_USER;
  }
  if (t->prog) {
    if (s->has_val && (st = dsc_program_module(t->prog, "forward", &t->fwd)) != DSC_OK) return st;
  } else {
    /* offload auto: the values the budget requires (driver/offload_auto.c) */
    drv_offload_budget ob = {o->memory_budget, o->host_memory_budget,
                             o->offload_dir && o->offload_dir[0], o->threads, false};
    char *auto_text = NULL;
    if ((st = drv_offload_auto_keep(ctx, s->model_path, &t->cfg, &ob, &t->arena, &auto_text)) !=
            DSC_OK ||
        (st = drv_build_graphs(ctx, s->model_path, t->m, &t->cfg, s->backend, s->has_val,
                               &t->fwd)) != DSC_OK)
      return st;
    t->info.offload_auto = auto_text;
  }
  if (t->fwd) {
    t->fwd_g = dsc_module_find_graph(t->fwd, "forward");
    if ((st = drv_check_forward(ctx, s->model_path, t->fwd_g)) != DSC_OK) return st;
  }
  if ((st = drv_check_step(ctx, t->m, s->B * s->K, t->T_rank)) != DSC_OK) return st;
  t->step_g = dsc_module_find_graph(t->m, "train_step");
  t->micro_g = dsc_module_find_graph(t->m, "micro_step");
  if (!(t->params = dsc_params_init_rank(t->m, t->cfg.seed, t->rank)))
    return ir_check_interrupt(ctx, "initialising the params") != DSC_OK ? DSC_ERR_INTERRUPTED
                                                                         : DSC_ERR_INTERNAL;
  if ((st = build_specs(t)) != DSC_OK) return st;
  for (int i = 0; t->fwd && i < dsc_module_param_count(t->fwd); i++) {
    const char *name = dsc_module_param_name(t->fwd, i);
    int j = dsc_module_find_param(t->m, name);
    dsc_type a_t = dsc_module_param_type(t->fwd, i);
    dsc_type b_t = a_t;
    int64_t w;
    if (j >= 0 && dsc_module_param_shard(t->m, j, &b_t, &w) < 0) j = -1;
    /* master weights hold the step's params in bf16/fp16: the f32
     * validation forward reads those values exactly */
    if (j >= 0 && dsc_dtype_is_float(a_t.dtype) && dsc_dtype_is_float(b_t.dtype))
      b_t.dtype = a_t.dtype;
    if (j < 0 || !dsc_type_equal(&a_t, &b_t)) {
      ir_error(ctx, ir_no_loc,
               "trainer: the validation module's param '%s' is not in the step module", name);
      return DSC_ERR_INTERNAL;
    }
  }
  return DSC_OK;
}

/* --init-from: the published weights into the model params' full tensors
 * (rounded to each param's dtype, as initializers are), and every copy()
 * state (the master weights) made again from its param. Under ZeRO-3 each
 * rank reads only its chunk of the sharded params and the ranks gather the
 * full values (every rank opens its trainer, so all of them are here). */
static dsc_status import_weights(dsc_trainer *t, const char *dir) {
  const dsc_module *m = t->m;
  int np = dsc_module_param_count(m);
  dsc_tensor **dst = ir_arena_alloc(&t->arena, sizeof *dst * (size_t)(np > 0 ? np : 1));
  dsc_tensor **chunk = ir_arena_alloc(&t->arena, sizeof *chunk * (size_t)(np > 0 ? np : 1));
  if (!dst || !chunk) return oom(t->ctx);
  for (int i = 0; i < np; i++) dst[i] = chunk[i] = NULL;
  for (int k = 0; k < t->n_model; k++) {
    int i = dsc_module_find_param(m, t->model_names[k]);
    dst[i] = t->model_t[k];
    if (t->full_t[i]) chunk[i] = dsc_params_get(t->params, i);
  }
  int world = t->shard_world ? (int)t->shard_world : 1;
  dsc_status st = dsc_hf_import_sharded(t->ctx, dir, m, dst, chunk, t->shard_world ? t->rank : 0,
                                        world, &t->info.import_bytes);
  for (int i = 0; st == DSC_OK && i < np; i++)
    if (chunk[i]) st = gather_param(t, i);
  if (st != DSC_OK) return st;
  for (int k = 0; k < t->n_model; k++) ir_round_to_dtype(t->model_t[k]);
  for (int k = 0; k < t->n_opt; k++) {
    int i = dsc_module_find_param(m, t->opt_names[k]);
    dsc_init init = dsc_module_param_init(m, i);
    int src = init.kind == DSC_INIT_COPY ? dsc_module_find_param(m, init.from) : -1;
    if (src < 0 || !dst[src]) continue;
    dsc_tensor *to = t->opt_t[k];
    if (dsc_type_numel(&to->type) != dsc_type_numel(&dst[src]->type)) continue;
    memcpy(to->data, dst[src]->data, sizeof(double) * (size_t)dsc_type_numel(&to->type));
    ir_round_to_dtype(to);
  }
  scatter_full(t);
  return DSC_OK;
}

/* Restore: the files must hold exactly this model's params and states. */
static dsc_status restore_checkpoint(dsc_trainer *t, open_state *s) {
  const dsc_checkpoint *ck = s->ck;
  if (!ck) {
    ir_rng_seed(&t->rng, t->cfg.seed);
    t->last_saved = -1;
    return s->o->init_from ? import_weights(t, s->o->init_from) : DSC_OK;
  }
  dsc_context *ctx = t->ctx;
  char *mp = ir_arena_printf(&t->arena, "%s/model.safetensors", ck->dir);
  char *op = ir_arena_printf(&t->arena, "%s/optimizer.safetensors", ck->dir);
  if (!mp || !op) return oom(ctx);
  dsc_status st;
  if ((st = dsc_tensor_set_check(ctx, mp, ck->model, t->model_spec, t->n_model)) != DSC_OK ||
      (st = dsc_tensor_set_check(ctx, op, ck->optimizer, t->opt_spec, t->n_opt)) != DSC_OK)
    return st;
  if ((st = restore_set(ctx, ck->model, t->model_t, t->model_names, t->n_model)) != DSC_OK ||
      (st = restore_set(ctx, ck->optimizer, t->opt_t, t->opt_names, t->n_opt)) != DSC_OK)
    return st;
  scatter_full(t);
  t->step = t->info.start_step = ck->state.step;
  int64_t end = s->o->stop_at > 0 && s->o->stop_at < t->cfg.steps ? s->o->stop_at : t->cfg.steps;
  if (t->step >= end) {
    ir_error(ctx, rt_loc(ck->dir),
             "the checkpoint is already at step %" PRId64
             "; give --steps (or --stop-at) "
             "above it to train further",
             t->step);
    return DSC_ERR_USER;
  }
  memcpy(t->rng.s, ck->state.rng, sizeof t->rng.s);
  /* absent in checkpoints from before it was saved: none skipped */
  const char *sk = dsc_checkpoint_extra(ck, "skipped_steps");
  if (sk && (!parse_i64(sk, &t->skipped) || t->skipped < 0 || t->skipped > t->step)) {
    ir_error(ctx, rt_loc(ck->dir),
             "malformed checkpoint state: \"skipped_steps\" is '%s' (0 to the step, %" PRId64 ")",
             sk, t->step);
    return DSC_ERR_USER;
  }
  t->last_saved = t->step;
  return DSC_OK;
}

/* Loaders: ids must be below the vocabulary. Every rank draws the whole
 * global batch (same seed, same order) and trains on its rows, so a step's
 * sequences do not depend on the world. */
static dsc_status open_loaders(dsc_trainer *t, open_state *s) {
  int64_t B = s->B, T = s->T, seed = (int64_t)t->cfg.seed;
  /* the global batch's tokens and targets (int32), and this rank's share of
   * them as the step's f64 input tensors, before anything is allocated */
  double rows = (double)B * (double)s->K * (double)t->dp;
  double need = rows * (double)T * 2 * 4 + (double)B * (double)s->K * (double)T * 2 * 8;
  char what[200];
  snprintf(what, sizeof what,
           "holding a step's tokens (batch %" PRId64 " x grad_accum %" PRId64 " x %s %" PRId64
           " rows of %" PRId64 ")",
           B, s->K, t->dp < t->world ? "data ranks" : "world", t->dp, T);
  dsc_status st = rt_check_host_memory(t->ctx, what, need > 9e18 ? INT64_MAX : (int64_t)need);
  if (st != DSC_OK) return st;
  dsc_loader_options lo = {B * s->K * t->dp, T, t->info.vocab, (uint64_t)seed, DSC_LOADER_SHUFFLE};
  st = dsc_loader_open(t->ctx, s->train_path, &lo, &t->train);
  if (st != DSC_OK) return st;
  if (s->ck && (st = dsc_loader_seek(t->train, s->ck->state.loader)) != DSC_OK) {
    ir_error(t->ctx, rt_loc(s->ck->dir), "the checkpoint's loader position does not fit %s",
             s->train_path);
    return st;
  }
  t->info.train_tokens = dsc_loader_tokens(t->train);
  if (!s->has_val) return DSC_OK;
  dsc_loader_options vo = {B, T, t->info.vocab, (uint64_t)seed, DSC_LOADER_SEQUENTIAL};
  if ((st = dsc_loader_open(t->ctx, s->val_path, &vo, &t->val)) != DSC_OK) return st;
  t->info.val_tokens = dsc_loader_tokens(t->val);
  int64_t per_epoch = dsc_loader_windows(t->val) / B;
  if (per_epoch < 1) per_epoch = 1;
  if (t->eval_batches > per_epoch) t->eval_batches = per_epoch;
  return DSC_OK;
}

/* Executors, holding the params (initialised or restored above). Memory:
 * the plan of the step (the same lowering as the executor's) against the
 * budgets, and the RSS growth over creating the executor (its arenas),
 * completed by the first step's (dsc_trainer_step). */
static dsc_status open_executor(dsc_trainer *t, open_state *s) {
  dsc_context *ctx = t->ctx;
  const dsc_trainer_options *o = s->o;
  dsc_backend backend = s->backend;
  dsc_exec_options xo = {backend, o->threads, NULL};
  char why[1200];
  if (t->prog && backend == DSC_BACKEND_CPU && !dsc_program_cpu_usable(t->prog, why, sizeof why))
    ir_diag(ctx, DSC_DIAG_WARNING, rt_loc(dsc_program_path(t->prog)),
            "compiling the kernels from the IR: %s", why);
  cg_memplan mplan;
  dsc_status st;
  if (backend == DSC_BACKEND_CPU && (st = drv_plan_step(ctx, t->m, o->threads, &mplan)) != DSC_OK)
    return st;
  if (backend == DSC_BACKEND_CPU && (st = drv_check_step_memory(ctx, &mplan, t->comm)) != DSC_OK)
    return st;
  if (o->memory_budget > 0 && (st = check_budget(t, backend, &mplan, o->memory_budget)) != DSC_OK)
    return st;
  if (o->host_memory_budget > 0 &&
      (st = check_host_budget(t, backend, &mplan, o->host_memory_budget)) != DSC_OK)
    return st;
  int64_t rss0 = rss_now(), heap0 = heap_now();
  if ((st = dsc_exec_new_with_program(t->m, &xo, t->prog, "step", &t->step_x)) != DSC_OK) return st;
  if (backend == DSC_BACKEND_CPU) {
    int64_t rss1 = rss_now(), heap1 = heap_now();
    t->heap_exec = heap0 < 0 || heap1 < 0 ? -1 : heap1 - heap0;
    /* on the CPU the host tier is the same RAM: the RSS growth covers both */
    t->info.mem_planned = mplan.peak + mplan.host_arena + mplan.host_work;
    t->info.mem_host = mplan.host_arena + mplan.host_work; /* + host-placed temporaries */
    t->info.mem_disk_staging = mplan.disk_staging, t->info.mem_disk_file = mplan.disk_bytes;
    t->rss_exec = rss0 < 0 || rss1 < 0 ? -1 : rss1 - rss0;
  }
  dsc_exec_kernel_counts(t->step_x, &t->info.kernels_compiled, &t->info.kernels_prebuilt);
  if ((st = open_offload_file(t, o)) != DSC_OK) return st;
  if ((st = dsc_exec_set_params(t->step_x, t->params)) != DSC_OK) return st;
  if (t->comm && (st = dsc_exec_set_comm(t->step_x, t->comm)) != DSC_OK) return st;
  if (t->cfg.wall_clock_breakdown && !dsc_exec_has_profile(t->step_x))
    ir_diag(ctx, DSC_DIAG_WARNING, ir_no_loc,
            "wall_clock_breakdown: the %s backend times no instructions, so no breakdown is "
            "printed (the cpu and cuda backends do)",
            dsc_backend_name(dsc_exec_backend(t->step_x)));
  t->breakdown = t->cfg.wall_clock_breakdown && dsc_exec_has_profile(t->step_x);
  if (o->profile || t->breakdown) dsc_exec_set_profiling(t->step_x, true);
  if (t->fwd) {
    if ((st = dsc_exec_new_with_program(t->fwd, &xo, t->prog, "forward", &t->fwd_x)) != DSC_OK)
      return st;
    int c, p;
    dsc_exec_kernel_counts(t->fwd_x, &c, &p);
    t->info.kernels_compiled += c, t->info.kernels_prebuilt += p;
    if (!(t->fwd_params = dsc_params_init(t->fwd, 0))) return oom(ctx);
  }
  /* Tracing: pid = rank. */
  t->trace = o->trace;
  if (t->trace && ((st = dsc_exec_set_trace(t->step_x, t->trace, t->rank)) != DSC_OK ||
                   (t->fwd_x && (st = dsc_exec_set_trace(t->fwd_x, t->trace, t->rank)) != DSC_OK)))
    return st;
  return DSC_OK;
}

/* Buffers of the global batch and the graphs' input tensors. */
static dsc_status open_buffers(dsc_trainer *t, open_state *s) {
  dsc_context *ctx = t->ctx;
  t->buf_bytes = sizeof(int32_t) * (size_t)(s->B * s->K * t->dp * s->T);
  t->buf_in = ir_alloc(ctx, t->buf_bytes);
  t->buf_tgt = ir_alloc(ctx, t->buf_bytes);
  t->in_tok = dsc_tensor_new(ctx, drv_step_input_type(t->m, 0));
  t->in_tgt = dsc_tensor_new(ctx, drv_step_input_type(t->m, 1));
  t->in_lr = dsc_tensor_new(ctx, dsc_type_make(DSC_F32, 0, NULL));
  if (drv_step_has_seed(t->m) && !(t->in_seed = dsc_tensor_new(ctx, drv_step_input_type(t->m, 2))))
    return oom(ctx);
  if (s->has_val) {
    t->v_tok = dsc_tensor_new(ctx, dsc_node_type(dsc_graph_input_at(t->fwd_g, 0)));
    t->v_tgt = dsc_tensor_new(ctx, dsc_node_type(dsc_graph_input_at(t->fwd_g, 1)));
  }
  if (!t->buf_in || !t->buf_tgt || !t->in_tok || !t->in_tgt || !t->in_lr ||
      (s->has_val && (!t->v_tok || !t->v_tgt)))
    return oom(ctx);
  return DSC_OK;
}

/* The run keeps the tokenizer its tokens came from (dsc data's
 * PREFIX_tokenizer.json, else --init-from's tokenizer.json) as
 * OUT/tokenizer.json, where dsc sample finds it. A resumed run keeps its own;
 * a fresh one replaces whatever an earlier, checkpoint-less run left. */
static dsc_status copy_tokenizer(dsc_trainer *t, open_state *s, const char *out) {
  ir_arena *a = &t->arena;
  const char *dst = ir_arena_printf(a, "%s/tokenizer.json", out);
  const char *from_data = s->prefix ? ir_arena_printf(a, "%s_tokenizer.json", s->prefix) : NULL;
  const char *from_init = s->o->init_from ? ir_arena_printf(a, "%s/tokenizer.json", s->o->init_from) : NULL;
  if (!dst || (s->prefix && !from_data) || (s->o->init_from && !from_init)) return oom(t->ctx);
  struct stat sb;
  const char *src = from_data && stat(from_data, &sb) == 0   ? from_data
                    : from_init && stat(from_init, &sb) == 0 ? from_init
                                                             : NULL;
  if (!src || (s->ck && stat(dst, &sb) == 0)) return DSC_OK;
  return dsc_file_copy(t->ctx, src, dst);
}

/* Output: created and writable before the first step. A resumed run
 * writes next to the checkpoint it came from unless told otherwise. Rank 0
 * alone writes, except the shards of a ZeRO checkpoint, which every rank
 * writes into the same step directory. */
static dsc_status open_output(dsc_trainer *t, open_state *s) {
  dsc_context *ctx = t->ctx;
  ir_arena *a = &t->arena;
  const dsc_trainer_options *o = s->o;
  const dsc_checkpoint *ck = s->ck;
  const char *out = o->out_dir;
  dsc_status st;
  if (!out && ck) {
    char *p = rt_parent_dir(ctx, ck->dir);
    if (!p) return oom(ctx);
    out = ir_arena_strdup(a, p);
    ir_free(ctx, p, strlen(p) + 1);
  }
  t->ckpt_dir = out;
  if (t->rank != 0) out = NULL;
  /* The writer's lock first: nothing is written before it is held. */
  if (out && ((st = make_dirs(ctx, a, out)) != DSC_OK ||
              (st = rt_run_lock_take(ctx, out, &t->lock)) != DSC_OK))
    return st;
  if (out && !ck) {
    /* A fresh run must not mix with (and prune) another run's checkpoints. */
    char *latest = ir_arena_printf(a, "%s/latest", out);
    if (!latest) return oom(ctx);
    struct stat sb;
    if (lstat(latest, &sb) == 0) {
      ir_error(ctx, rt_loc(out),
               "already holds checkpoints (%s): continue with --resume %s, or choose another "
               "--out",
               latest, out);
      return DSC_ERR_USER;
    }
  }
  t->saving = o->out_dir || ck;
  if (out && (st = copy_tokenizer(t, s, out)) != DSC_OK) return st;
  if (out) {
    t->out_dir = ir_arena_strdup(a, out);
    const char *mpath = ir_arena_printf(a, "%s/metrics.jsonl", out);
    if (!t->out_dir || !mpath) return oom(ctx);
    t->metrics_path = mpath;
    if ((st = open_log(ctx, mpath, t->step, &t->metrics)) != DSC_OK) return st;
  }
  t->log_path = o->log_path;
  if (o->log_path && t->rank == 0 &&
      (st = open_log(ctx, o->log_path, t->step, &t->log)) != DSC_OK)
    return st;
  t->end = t->cfg.steps;
  if (o->stop_at > 0 && o->stop_at < t->end) t->end = o->stop_at;
  return DSC_OK;
}

/* --mesh: the axes' sizes and this rank's place; the groups (a collective
 * of every rank) when there is an axis besides dp. */
static dsc_status open_mesh(dsc_trainer *t, const dsc_trainer_options *o) {
  dsc_mesh_shape shape;
  drv_mesh_axes axes;
  dsc_status st = drv_mesh(t->ctx, o->mesh, t->world, &shape, &axes);
  if (st != DSC_OK) return st;
  t->sp = axes.sp, t->ep = axes.ep, t->tp = axes.tp;
  /* the data ranks: every axis but sp and tp (ep ranks train on their own
   * sequences; a tp group on the same ones), numbered row-major as the
   * mesh numbers ranks */
  t->dp = t->world / (t->sp * t->tp);
  t->sp_rank = t->dp_rank = 0;
  for (int a = 0; a < shape.n_axes; a++) {
    int c = dsc_mesh_coord(&shape, t->rank, a);
    if (strcmp(shape.axis[a], "sp") == 0)
      t->sp_rank = c;
    else if (strcmp(shape.axis[a], "tp") != 0)
      t->dp_rank = t->dp_rank * shape.size[a] + c;
  }
  if (t->sp > 1 || t->ep > 1 || t->tp > 1) {
    char text[64];
    dsc_mesh_format(&shape, text, sizeof text);
    if (!(t->info.mesh = ir_arena_strdup(&t->arena, text))) return oom(t->ctx);
    if (o->comm) st = dsc_mesh_new(o->comm, &shape, &t->mesh);
  }
  return st;
}

static open_state open_begin(dsc_trainer_options *o, bool settings_only) {
  open_state s = {.o = o,
                  .B = o->batch,
                  .T = o->seq,
                  .K = o->grad_accum,
                  .model_path = o->model_path,
                  .prefix = o->data_prefix,
                  .settings_only = settings_only};
  return s;
}

/* The steps up to the resolved settings: what dsc_trainer_print_config
 * shows and every later step builds on. o may get the ds_config's
 * offload_dir. */
static dsc_status open_settings(dsc_trainer *t, open_state *s, dsc_trainer_options *o, int world) {
  dsc_status st = check_options(t, o);
  if (st == DSC_OK && !o->comm && world > 1) t->world = t->info.world = world;
  if (st == DSC_OK) st = open_mesh(t, o);
  if (st == DSC_OK && (st = open_ds_config(t, s, o)) == DSC_OK &&
      (st = open_resume(t, s)) == DSC_OK && (st = open_program(t, s)) == DSC_OK)
    st = resolve_settings(t, s);
  return st;
}

static dsc_status open_inner(dsc_trainer *t, const dsc_trainer_options *opts) {
  dsc_trainer_options oc = *opts; /* the ds_config may fill offload_dir */
  open_state s = open_begin(&oc, false);
  dsc_status st;
  if ((st = open_settings(t, &s, &oc, 0)) == DSC_OK && (st = open_data(t, &s)) == DSC_OK &&
      (st = open_graphs(t, &s)) == DSC_OK && (st = restore_checkpoint(t, &s)) == DSC_OK &&
      (st = open_loaders(t, &s)) == DSC_OK && (st = open_executor(t, &s)) == DSC_OK &&
      (st = open_buffers(t, &s)) == DSC_OK)
    st = open_output(t, &s);
  dsc_checkpoint_free(t->ctx, s.ck);
  return st;
}

static dsc_trainer *trainer_new(dsc_context *ctx) {
  dsc_trainer *t = ir_alloc(ctx, sizeof *t);
  if (!t) return oom(ctx), NULL;
  memset(t, 0, sizeof *t);
  t->ctx = ctx;
  ir_arena_init(&t->arena, ctx);
  return t;
}

dsc_status dsc_trainer_open(dsc_context *ctx, const dsc_trainer_options *opts, dsc_trainer **out) {
  *out = NULL;
  dsc_trainer *t = trainer_new(ctx);
  if (!t) return DSC_ERR_INTERNAL;
  dsc_status st = open_inner(t, opts);
  if (st != DSC_OK) {
    dsc_trainer_free(t);
    return st;
  }
  *out = t;
  return DSC_OK;
}

static void fill(dsc_tensor *dst, const int32_t *src, int64_t n) {
  for (int64_t i = 0; i < n; i++) dst->data[i] = src[i];
}

/* This rank's share of the global batch: rows [dp_rank*B*K, (dp_rank+1)*B*K)
 * and, with sequence parallelism, positions [sp_rank*T_rank, (sp_rank+1)*T_rank)
 * of each. */
static void fill_share(const dsc_trainer *t, dsc_tensor *dst, const int32_t *src) {
  int64_t rows = t->B * t->K, w = t->T_rank;
  src += (int64_t)t->dp_rank * rows * t->T + (int64_t)t->sp_rank * w;
  for (int64_t r = 0; r < rows; r++)
    for (int64_t i = 0; i < w; i++) dst->data[r * w + i] = src[r * t->T + i];
}

/* This step's share of the executor's phase totals (micro_step's and
 * train_step's summed): the totals now less those after the last step. */
static dsc_status step_breakdown(dsc_trainer *t, dsc_train_progress *p) {
  const char *graphs[2] = {"micro_step", "train_step"};
  dsc_phase_times *d = &p->breakdown;
  memset(d, 0, sizeof *d);
  for (int g = 0; g < 2; g++) {
    if (g == 0 && !t->micro_g) continue;
    dsc_phase_times now, *was = &t->phases_seen[g];
    dsc_status st = dsc_exec_phase_times(t->step_x, graphs[g], &now);
    if (st != DSC_OK) return st;
    d->fwd += now.fwd - was->fwd, d->bwd += now.bwd - was->bwd;
    d->bwd_inner += now.bwd_inner - was->bwd_inner;
    d->bwd_allreduce += now.bwd_allreduce - was->bwd_allreduce;
    d->step += now.step - was->step;
    /* micro-batches: micro_step's runs, or train_step's when it is the whole step */
    if (g == 0 || !t->micro_g) d->runs = now.runs - was->runs;
    *was = now;
  }
  p->has_breakdown = true;
  return DSC_OK;
}

dsc_status dsc_trainer_step(dsc_trainer *t, dsc_train_progress *p) {
  memset(p, 0, sizeof *p);
  double t0 = now_s();
  int64_t tr0 = t->trace ? dsc_trace_now_ns() : 0;
  int64_t n = t->B * t->K * t->T_rank; /* this rank's tokens (fill) */
  dsc_status st = dsc_loader_next(t->train, t->buf_in, t->buf_tgt);
  if (st != DSC_OK) return st;
  fill_share(t, t->in_tok, t->buf_in);
  fill_share(t, t->in_tgt, t->buf_tgt);
  if (t->trace)
    dsc_trace_spanf(t->trace, t->rank, DSC_TRACE_COPY, tr0, dsc_trace_now_ns(),
                    "load batch %" PRId64, t->step + 1);
  /* Comm messages name the step ("(step 12)"). */
  if (t->comm) { /* a failed collective names its step */
    dsc_graph_set_collective_tags(t->step_g, t->step + 1);
    if (t->micro_g) dsc_graph_set_collective_tags(t->micro_g, t->step + 1);
    dsc_exec_set_collective_tag(t->step_x, t->step + 1);
  }
  double lr = dsc_lr_at(&t->cfg, t->step - t->skipped);
  t->in_lr->data[0] = (double)(float)lr; /* an f32 input holds f32 values */
  /* Dropout's seeds: drawn from the run's generator (saved in checkpoints, so
   * a resumed run draws what the uninterrupted one would), one per
   * micro-batch, 53 bits (a double holds them), apart per rank as each rank's
   * rows are. */
  for (int64_t k = 0; t->in_seed && k < dsc_type_numel(&t->in_seed->type); k++)
    t->in_seed->data[k] =
        (double)(((ir_rng_next(&t->rng) >> 11) + (uint64_t)t->rank) & IR_RAND_MAX_SEED);
  const dsc_tensor *ins[4] = {t->in_tok, t->in_tgt};
  int n_ins = 2;
  if (t->in_seed) ins[n_ins++] = t->in_seed;
  ins[n_ins++] = t->in_lr;
  dsc_tensor *outs[3] = {NULL, NULL, NULL}; /* loss, grad_norm (, skipped: fp16) */
  int64_t rss0 = t->rss_stepped || !t->info.mem_planned ? -1 : rss_now(), heap0 = heap_now();
  st = dsc_exec_run_step(t->step_x, ins, n_ins, outs);
  if (st != DSC_OK) return st;
  if (!t->rss_stepped && t->info.mem_planned) {
    int64_t rss1 = rss_now();
    t->info.mem_rss_growth =
        rss0 < 0 || rss1 < 0 || t->rss_exec < 0 ? -1 : t->rss_exec + rss1 - rss0;
    int64_t heap1 = heap_now();
    t->info.mem_heap = heap0 < 0 || heap1 < 0 || t->heap_exec < 0 ? -1 : t->heap_exec + heap1 - heap0;
    dsc_exec_memory xm;
    dsc_exec_memory_report(t->step_x, &xm);
    /* the arenas and the GEMM scratch are malloc'd (mmapped chunks): counted
     * as resident above; the kernel compile's growth outside the heap (its
     * threads' stacks, LLVM's own mappings) is named apart */
    if (t->info.mem_heap >= 0 && xm.arenas >= 0 && xm.gemm_scratch_resident >= 0)
      t->info.mem_heap -= xm.arenas + xm.gemm_scratch_resident;
    t->info.mem_compile = xm.compile_other;
    t->info.mem_arenas_touched = xm.arenas_resident;
    t->info.mem_gemm_scratch = xm.gemm_scratch_resident;
    t->info.mem_kernel_code = xm.kernel_code;
    t->rss_stepped = true;
  }
  t->params_stale = true;
  p->loss = outs[0]->data[0];
  p->grad_norm = outs[1]->data[0];
  p->skipped = outs[2] && outs[2]->data[0] != 0;
  t->skipped += p->skipped;
  for (int i = 0; i < 3; i++) dsc_tensor_free(t->ctx, outs[i]);
  t->step++;
  p->step = t->step;
  p->steps = t->cfg.steps;
  p->lr = t->in_lr->data[0];
  p->ms = (now_s() - t0) * 1e3;
  if (t->trace)
    dsc_trace_spanf(t->trace, t->rank, DSC_TRACE_STEP, tr0, dsc_trace_now_ns(), "step %" PRId64,
                    t->step);
  p->tokens_per_s = p->ms > 0 ? (double)(n * t->world) / (p->ms * 1e-3) : 0;
  p->val_loss = NAN;
  if (t->breakdown && (st = step_breakdown(t, p)) != DSC_OK) return st;
  if (!isfinite(p->loss)) {
    /* The params already hold the step's update: nothing may be saved. */
    ir_error(t->ctx, ir_no_loc,
             "step %" PRId64
             ": the loss is not finite (%g); stopping without a checkpoint "
             "(lower the learning rate?)",
             t->step, p->loss);
    return DSC_ERR_USER;
  }
  return DSC_OK;
}

dsc_status dsc_trainer_evaluate(dsc_trainer *t, double *val_loss) {
  *val_loss = NAN;
  if (!t->val) {
    ir_error(t->ctx, ir_no_loc, "trainer: no validation shard");
    return DSC_ERR_USER;
  }
  int64_t tr0 = t->trace ? dsc_trace_now_ns() : 0;
  /* The validation module reads the step module's current params by name. */
  dsc_status st = full_values(t);
  for (int i = 0; st == DSC_OK && i < dsc_module_param_count(t->fwd); i++) {
    int j = dsc_module_find_param(t->m, dsc_module_param_name(t->fwd, i));
    const dsc_tensor *src = t->full_t[j] ? t->full_t[j] : dsc_params_get(t->params, j);
    dsc_tensor *dst = dsc_params_get(t->fwd_params, i);
    memcpy(dst->data, src->data, sizeof(double) * (size_t)dsc_type_numel(&dst->type));
  }
  if (st == DSC_OK) st = dsc_exec_set_params(t->fwd_x, t->fwd_params);
  if (st == DSC_OK) st = dsc_loader_seek(t->val, (dsc_loader_pos){0, 0});
  double sum = 0;
  int64_t n = t->B * t->T;
  for (int64_t b = 0; st == DSC_OK && b < t->eval_batches; b++) {
    st = dsc_loader_next(t->val, t->buf_in, t->buf_tgt);
    if (st != DSC_OK) break;
    fill(t->v_tok, t->buf_in, n);
    fill(t->v_tgt, t->buf_tgt, n);
    const dsc_tensor *ins[2] = {t->v_tok, t->v_tgt};
    dsc_tensor *out = NULL;
    st = dsc_exec_run(t->fwd_x, "forward", ins, 2, &out);
    if (st == DSC_OK) sum += out->data[0];
    dsc_tensor_free(t->ctx, out);
  }
  if (st == DSC_OK) *val_loss = sum / (double)t->eval_batches;
  if (t->trace)
    dsc_trace_spanf(t->trace, t->rank, DSC_TRACE_STEP, tr0, dsc_trace_now_ns(),
                    "validation (%" PRId64 " batches)", t->eval_batches);
  return st;
}

/* A ZeRO checkpoint: every rank writes its chunks, rank 0 the rest (a
 * collective; nothing is gathered). */
static dsc_status save_sharded(dsc_trainer *t, dsc_checkpoint_state *s) {
  const dsc_module *m = t->m;
  int n = dsc_module_param_count(m);
  ir_arena a;
  ir_arena_init(&a, t->ctx);
  const char **names[3];
  dsc_tensor **ts[3];
  int cnt[3] = {0, 0, 0};
  for (int k = 0; k < 3; k++) {
    names[k] = ir_arena_alloc(&a, sizeof(char *) * (size_t)(n + 1));
    ts[k] = ir_arena_alloc(&a, sizeof(dsc_tensor *) * (size_t)(n + 1));
  }
  dsc_kv *meta = ir_arena_alloc(&a, sizeof(dsc_kv) * (size_t)(2 * n + 1));
  dsc_kv *extra = ir_arena_alloc(&a, sizeof(dsc_kv) * (size_t)(s->n_extra + 1));
  int n_meta = 0;
  for (int i = 0; i < n && !a.failed; i++) {
    if (dsc_step_is_sum(m, i)) continue; /* rewritten each step: not checkpointed */
    const char *name = dsc_module_param_name(m, i);
    bool state = dsc_module_param_is_state(m, i);
    int k = t->full_t[i] ? 2 : state ? 1 : 0; /* model, optimizer, shards */
    names[k][cnt[k]] = name;
    ts[k][cnt[k]++] = dsc_params_get(t->params, i);
    if (k != 2) continue;
    const dsc_type *f = &t->full_t[i]->type;
    char dims[400] = "scalar";
    for (int d = 0, o = 0; d < f->rank && o < (int)sizeof dims - 24; d++)
      o += snprintf(dims + o, sizeof dims - (size_t)o, "%s%lld", d ? "x" : "", (long long)f->dims[d]);
    meta[n_meta++] = (dsc_kv){ir_arena_printf(&a, "full.%s", name), ir_arena_strdup(&a, dims)};
    meta[n_meta++] = (dsc_kv){ir_arena_printf(&a, "set.%s", name), state ? "optimizer" : "model"};
  }
  dsc_status st;
  if (a.failed) {
    st = oom(t->ctx);
  } else {
    memcpy(extra, s->extra, sizeof(dsc_kv) * (size_t)s->n_extra);
    char w[32];
    snprintf(w, sizeof w, "%" PRId64, t->shard_world);
    extra[s->n_extra] = (dsc_kv){"zero_world", w};
    dsc_checkpoint_state s2 = *s;
    s2.extra = extra, s2.n_extra = s->n_extra + 1;
    dsc_tensor_set model = {cnt[0], names[0], ts[0], 0, NULL};
    dsc_tensor_set opt = {cnt[1], names[1], ts[1], 0, NULL};
    dsc_tensor_set shards = {cnt[2], names[2], ts[2], n_meta, meta};
    st = dsc_checkpoint_save_sharded(t->ctx, t->comm, t->ckpt_dir, &model, &opt, &shards, &s2,
                                     t->keep_last);
  }
  ir_arena_release(&a);
  return st;
}

dsc_status dsc_trainer_save(dsc_trainer *t) {
  ir_arena *a = &t->arena;
  int64_t tr0 = t->trace ? dsc_trace_now_ns() : 0;
  dsc_status sst = t->shard_world ? sync_params(t) : full_values(t);
  if (sst != DSC_OK) return sst;
  if (t->shard_world ? !t->ckpt_dir : !t->out_dir) {
    ir_error(t->ctx, ir_no_loc, "trainer: no output directory to save to");
    return DSC_ERR_USER;
  }
  char num[14][32];
  snprintf(num[0], sizeof num[0], "%" PRId64, t->B);
  snprintf(num[1], sizeof num[1], "%" PRId64, t->T);
  snprintf(num[2], sizeof num[2], "%" PRId64, t->K);
  snprintf(num[3], sizeof num[3], "%" PRId64, t->info.vocab);
  snprintf(num[4], sizeof num[4], "%" PRIu64, t->seed);
  snprintf(num[5], sizeof num[5], "%" PRId64, t->cfg.steps);
  snprintf(num[6], sizeof num[6], "%.17g", t->cfg.opt.lr);
  snprintf(num[7], sizeof num[7], "%" PRId64, t->cfg.save_every);
  snprintf(num[8], sizeof num[8], "%" PRId64, t->cfg.eval_every);
  snprintf(num[9], sizeof num[9], "%d", t->world);
  snprintf(num[10], sizeof num[10], "%" PRId64, t->cfg.zero.stage);
  snprintf(num[11], sizeof num[11], "%" PRId64, t->skipped);
  snprintf(num[12], sizeof num[12], "%" PRId64, t->sp);
  snprintf(num[13], sizeof num[13], "%" PRId64, t->tp);
  const dsc_kv extra[] = {
      {"model", t->info.model_path},
      {"model_name", t->info.model_name},
      {"data", t->data_prefix},
      {"batch", num[0]},
      {"seq", num[1]},
      {"grad_accum", num[2]},
      {"vocab", num[3]},
      {"seed", num[4]},
      {"steps", num[5]},
      {"lr", num[6]},
      {"precision", dsc_precision_name(t->cfg.precision)},
      {"master_weights", t->cfg.master_weights ? "true" : "false"},
      {"delayed_update", t->cfg.offload.delayed_update ? "true" : "false"},
      {"zenflow", t->cfg.zenflow.enabled ? "true" : "false"},
      {"save_every", num[7]},
      {"eval_every", num[8]},
      {"world", num[9]},
      {"sp", num[12]},
      {"tp", num[13]},
      {"zero_stage", num[10]},
      {"skipped_steps", num[11]},
  };
  dsc_checkpoint_state s;
  memset(&s, 0, sizeof s);
  s.step = t->step;
  memcpy(s.rng, t->rng.s, sizeof s.rng);
  s.loader = dsc_loader_tell(t->train);
  s.n_extra = (int)(sizeof extra / sizeof extra[0]);
  s.extra = extra;
  dsc_tensor_set model = {t->n_model, t->model_names, t->model_t, 0, NULL};
  dsc_tensor_set opt = {t->n_opt, t->opt_names, t->opt_t, 0, NULL};
  /* The directory this run locked, not one that took its place (a move
   * mid-run must not let the saves recreate it unlocked). */
  dsc_status st = rt_run_lock_check(t->lock, t->ckpt_dir);
  if (st != DSC_OK) return st;
  st = t->shard_world ? save_sharded(t, &s)
                      : dsc_checkpoint_save(t->ctx, t->out_dir, &model, &opt, &s, t->keep_last);
  if (st != DSC_OK) return st;
  t->last_saved = t->step;
  t->last_ckpt = ir_arena_printf(a, "%s/step-%06" PRId64, t->ckpt_dir, t->step);
  if (t->trace)
    dsc_trace_spanf(t->trace, t->rank, DSC_TRACE_COPY, tr0, dsc_trace_now_ns(),
                    "checkpoint step %" PRId64, t->step);
  return DSC_OK;
}

/* False (with the diagnostic naming path) when the line could not be written. */
static bool write_line(dsc_context *ctx, FILE *f, const char *path, const dsc_train_progress *p) {
  if (!f) return true;
  fprintf(f, "{\"step\":%" PRId64, p->step);
  json_num(f, "loss", p->loss, "%.9g");
  json_num(f, "lr", p->lr, "%.9g");
  json_num(f, "grad_norm", p->grad_norm, "%.9g");
  json_num(f, "tokens_per_s", p->tokens_per_s, "%.1f");
  json_num(f, "ms", p->ms, "%.3f");
  if (p->has_val) json_num(f, "val_loss", p->val_loss, "%.9g");
  if (p->skipped) fputs(",\"skipped\":true", f); /* fp16: overflow, update skipped */
  if (p->has_breakdown) { /* DeepSpeed's wall_clock_breakdown timers, ms */
    json_num(f, "fwd_ms", p->breakdown.fwd, "%.3f");
    json_num(f, "bwd_ms", p->breakdown.bwd, "%.3f");
    json_num(f, "bwd_inner_ms", p->breakdown.bwd_inner, "%.3f");
    json_num(f, "bwd_allreduce_ms", p->breakdown.bwd_allreduce, "%.3f");
    json_num(f, "step_ms", p->breakdown.step, "%.3f");
  }
  fputs("}\n", f);
  if (fflush(f) == 0 && !ferror(f)) return true;
  rt_io_error(ctx, path, "write failed");
  return false;
}

dsc_status dsc_trainer_run(dsc_trainer *t, const volatile sig_atomic_t *stop, dsc_train_callback cb,
                           void *ud, dsc_train_summary *sum) {
  memset(sum, 0, sizeof *sum);
  sum->best_val_loss = NAN;
  sum->final_loss = NAN;
  double start = now_s();
  int64_t tokens = 0, start_step = t->step;
  dsc_status st = DSC_OK;
  bool cb_stop = false;
  while (t->step < t->end) {
    bool want_stop = cb_stop || (stop && *stop);
    if (t->comm) {
      /* Ranks stop together: a signal or a callback seen by one rank is
       * agreed on before the step, or the others would wait for it. */
      int32_t v = want_stop;
      int64_t tr0 = t->trace ? dsc_trace_now_ns() : 0;
      if ((st = dsc_comm_all_reduce(t->comm, &v, &v, 1, DSC_I32, DSC_COMM_SUM, t->step + 1)) !=
          DSC_OK)
        return st;
      /* category "control": not part of the step's overlap figures */
      if (t->trace)
        dsc_trace_span(t->trace, t->rank, DSC_TRACE_COMM, "control", tr0, dsc_trace_now_ns(), NULL,
                       "all_reduce 4 B (stop flag)");
      want_stop = v > 0;
    }
    if (want_stop) {
      sum->stopped = true;
      break;
    }
    dsc_train_progress p;
    if ((st = dsc_trainer_step(t, &p)) != DSC_OK) return st;
    tokens += t->B * t->K * t->T * t->dp;
    sum->final_loss = p.loss;
    int64_t ev = t->cfg.eval_every, se = t->cfg.save_every;
    bool eval_now = ev > 0 && (t->step % ev == 0 || t->step == t->cfg.steps);
    bool save_now = (se > 0 && t->step % se == 0) || t->step == t->end;
    /* sharded params: every rank takes part in gathering them */
    if (t->val_any && eval_now && (st = dsc_trainer_gather(t)) != DSC_OK) return st;
    if (t->val && eval_now) {
      if ((st = dsc_trainer_evaluate(t, &p.val_loss)) != DSC_OK) return st;
      p.has_val = true;
      if (isnan(sum->best_val_loss) || p.val_loss < sum->best_val_loss)
        sum->best_val_loss = p.val_loss;
    }
    if (t->saving && save_now) t->last_saved = t->step; /* on every rank: see the stop below */
    if (save_now && (t->out_dir || (t->saving && t->shard_world))) { /* sharded: every rank */
      if ((st = dsc_trainer_save(t)) != DSC_OK) return st;
      p.saved = true;
    }
    if (!write_line(t->ctx, t->metrics, t->metrics_path, &p) ||
        !write_line(t->ctx, t->log, t->log_path, &p))
      return DSC_ERR_USER;
    if (cb && !cb(ud, &p)) cb_stop = true; /* agreed on at the top of the loop */
  }
  if (cb_stop) sum->stopped = true;
  if (sum->stopped && t->saving && t->last_saved != t->step &&
      (t->out_dir || t->shard_world) && (st = dsc_trainer_save(t)) != DSC_OK)
    return st;
  sum->steps_done = t->step;
  sum->steps_run = t->step - start_step;
  sum->seconds = now_s() - start;
  sum->tokens_per_s = sum->seconds > 0 ? (double)tokens / sum->seconds : 0;
  sum->last_checkpoint = t->last_ckpt;
  return st;
}

/* ------------------------------------------------ --print-config */

/* Setting s's value in cfg, in the train section's syntax. */
static void format_setting(const dsc_setting *s, const dsc_train_config *cfg, char *buf, size_t n) {
  const char *p = (const char *)cfg + (s->cfg_off >= 0 ? s->cfg_off : 0);
  int64_t i;
  double d;
  bool b;
  int e;
  if (strcmp(s->key, "lr") == 0) {
    ir_format_double(cfg->opt.lr, buf, n);
  } else if (strcmp(s->key, "weight_decay") == 0) {
    ir_format_double(cfg->opt.weight_decay, buf, n);
  } else if (s->kind == DSC_SETTING_OPTIMIZER) {
    pass_format_optimizer(cfg, buf, n);
  } else if (s->kind == DSC_SETTING_SCHEDULE) {
    pass_format_schedule(cfg, buf, n);
  } else if (strcmp(s->key, "train_batch_size") == 0) {
    snprintf(buf, n, "%" PRId64, cfg->batch * cfg->grad_accum * cfg->world);
  } else if (s->cfg_off < 0) {
    snprintf(buf, n, "-");
  } else if (s->kind == DSC_SETTING_INT || s->kind == DSC_SETTING_BYTES) {
    memcpy(&i, p, sizeof i);
    snprintf(buf, n, "%" PRId64, i);
  } else if (s->kind == DSC_SETTING_NUM) {
    memcpy(&d, p, sizeof d);
    ir_format_double(d, buf, n);
  } else if (s->kind == DSC_SETTING_BOOL) {
    memcpy(&b, p, sizeof b);
    snprintf(buf, n, "%s", b ? "true" : "false");
  } else {
    memcpy(&e, p, sizeof e);
    const char *name = s->kind == DSC_SETTING_PRECISION ? dsc_precision_name((dsc_precision)e)
                       : s->kind == DSC_SETTING_TIER    ? dsc_offload_name((dsc_offload_tier)e)
                       : s->kind == DSC_SETTING_SWITCH  ? dsc_switch_name((dsc_switch)e)
                                                        : dsc_remat_name((dsc_remat_policy)e);
    if (s->kind == DSC_SETTING_REMAT && e == DSC_REMAT_BLOCKS && cfg->remat_every > 1)
      snprintf(buf, n, "blocks:%" PRId64, cfg->remat_every);
    else
      snprintf(buf, n, "%s", name ? name : "?");
  }
}

/* Where setting row i's value came from. */
static void setting_source(const dsc_trainer *t, const dsc_trainer_options *o, bool resumed, int i,
                           char *buf, size_t n) {
  const dsc_setting *s = dsc_setting_at(i);
  const char *k = s->key;
  /* the flags: run knobs, then the trainer's own options */
  bool knob = s->has_off >= 0 && *(const bool *)((const char *)&o->knobs + s->has_off);
  const char *flag = knob ? s->flag
                     : strcmp(k, "batch") == 0 && o->batch > 0         ? "--batch"
                     : strcmp(k, "seq") == 0 && o->seq > 0             ? "--seq"
                     : strcmp(k, "grad_accum") == 0 && o->grad_accum > 0 ? "--grad-accum"
                     : strcmp(k, "steps") == 0 && o->steps > 0          ? "--steps"
                     : strcmp(k, "lr") == 0 && o->lr > 0                ? "--lr"
                     : strcmp(k, "seed") == 0 && o->has_seed            ? "--seed"
                     : strcmp(k, "precision") == 0 && o->precision      ? "--precision"
                     : strcmp(k, "log_every") == 0 && o->log_every > 0  ? "--log-every"
                     : strcmp(k, "save_every") == 0 && o->save_every >= 0 ? "--save-every"
                     : strcmp(k, "eval_every") == 0 && o->eval_every >= 0 ? "--eval-every"
                                                                         : NULL;
  if (flag) {
    snprintf(buf, n, "flag %s", flag);
    return;
  }
  static const char *const ck_keys[] = {
      "batch",          "seq",  "grad_accum", "steps",      "lr",         "precision",
      "master_weights", "seed", "save_every", "eval_every", "zero.stage", "offload.delayed_update",
      "zenflow.enabled"};
  for (size_t j = 0; resumed && j < sizeof ck_keys / sizeof ck_keys[0]; j++)
    if (strcmp(k, ck_keys[j]) == 0) {
      snprintf(buf, n, "the checkpoint resumed");
      return;
    }
  const drv_ds_config *c = &t->ds;
  const drv_ds_setting *d = c->path ? drv_ds_config_find(c, k) : NULL;
  /* the batch triple sets batch and grad_accum through DeepSpeed's rule */
  bool triple = strcmp(k, "batch") == 0 || strcmp(k, "grad_accum") == 0 ||
                strcmp(k, "train_batch_size") == 0;
  int64_t given = strcmp(k, "batch") == 0 ? c->micro : strcmp(k, "grad_accum") == 0 ? c->accum : 0;
  if (!d && c->path && triple && (c->global > 0 || given > 0)) {
    int w = given > 0 ? (strcmp(k, "batch") == 0 ? 1 : 2) : 0;
    snprintf(buf, n, "%s:%d (%s)", c->path, c->batch_loc[w].line,
             w == 0 ? "train_batch_size, DeepSpeed's batch rule" : w == 1 ? "train_micro_batch_size_per_gpu" : "gradient_accumulation_steps");
    return;
  }
  if (d) {
    snprintf(buf, n, "%s:%d (%s)", c->path, d->loc.line, d->from);
    return;
  }
  if (t->in_section && t->in_section[i]) {
    snprintf(buf, n, "the model's train section");
    return;
  }
  snprintf(buf, n, "default");
}

dsc_status dsc_trainer_print_config(dsc_context *ctx, const dsc_trainer_options *opts, int world,
                                    FILE *out) {
  dsc_trainer *t = trainer_new(ctx);
  if (!t) return DSC_ERR_INTERNAL;
  dsc_trainer_options oc = *opts, *o = &oc;
  open_state s = open_begin(o, true);
  dsc_status st = open_settings(t, &s, o, world);
  if (st == DSC_OK) {
    fprintf(out, "settings of %s (%s%s%s), rank 0 of %d:\n", t->info.model_path,
            t->ds.path ? "ds_config " : "no ds_config", t->ds.path ? t->ds.path : "",
            s.ck ? ", resumed" : "", t->world);
    for (int i = 0; i < dsc_setting_count(); i++) {
      const dsc_setting *row = dsc_setting_at(i);
      bool own = row->kind == DSC_SETTING_OPTIMIZER || row->kind == DSC_SETTING_SCHEDULE ||
                 strcmp(row->key, "lr") == 0 || strcmp(row->key, "weight_decay") == 0;
      if (row->kind == DSC_SETTING_SECTION || (row->cfg_off < 0 && !own)) continue;
      bool alias = false; /* another row of the same field has the flag (zero.bucket) */
      for (int j = 0; j < dsc_setting_count() && row->cfg_off >= 0; j++)
        alias |= j != i && dsc_setting_at(j)->cfg_off == row->cfg_off && !row->flag &&
                 dsc_setting_at(j)->flag;
      if (alias) continue;
      char v[400], src[400];
      format_setting(row, &t->cfg, v, sizeof v);
      setting_source(t, o, s.ck != NULL, i, src, sizeof src);
      fprintf(out, "  %-28s %-40s # %s\n", row->key, v, src);
    }
    if (o->offload_dir)
      fprintf(out, "  %-28s %-40s # %s\n", "(offload dir)", o->offload_dir,
                  opts->offload_dir ? "flag --offload-dir" : "ds_config nvme_path");
    for (int i = 0; i < t->ds.n_auto; i++)
      fprintf(out, "  auto: %s: %s\n", t->ds.autos[i].path, t->ds.autos[i].what);
  }
  dsc_checkpoint_free(ctx, s.ck);
  dsc_trainer_free(t);
  return st;
}
