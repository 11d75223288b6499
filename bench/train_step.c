/* train_step: times one GPT training step of a model file on a backend.
 *
 *   train_step [MODEL.dsm] [--backend interp|cpu|cuda] [--threads N] [--batch B]
 *              [--seq T] [--steps N] [--warmup W] [--seed S] [--precision P[,P2]]
 *              [--count-only] [--profile]
 *
 * Loads the model through the frontend (B and T bound as `dsc train` does),
 * takes the train section's settings with grad_accum 1 and precision f32
 * (unless --precision), runs the whole pass pipeline, builds an executor,
 * initialises the params from their initializers and times dsc_exec_run of
 * "train_step" on random tokens (a fresh draw for every step). --count-only
 * stops after the pipeline and prints the FLOP count alone.
 *
 * FLOPs are counted on the train_step graph as it will run (after the
 * pipeline's decompose pass, attention and the other composites are
 * primitive ops, so their matmuls count as matmuls):
 *   matmul [.., M, K] x [.., K, N]   2 * batch * M * N * K
 *   attention q,k,v [B, T, C]        (if not decomposed) 4 * B * T * T * C:
 *                                    q k^T and p v over the full square
 *   data movement (input param const iota reshape permute slice concat
 *   broadcast embedding cast assign, collectives)   0
 *   every other op                   1 per element of its largest operand or
 *                                    result (elementwise ops, reductions,
 *                                    embedding_grad, undecomposed composites)
 * For GPT-2 124M at B=4, T=64: 195.3 GFLOP, 191.9 of them in matmuls.
 *
 * Prints one JSON line:
 *   {"impl":"dsc-<backend>","step_s_median":..,"gflop":..,"gflop_matmul":..,...}
 * (cuda adds "peak_mem_bytes": dsc_exec_device_bytes).
 *
 * --precision f32,bf16 builds both in one process and alternates their
 * steps (f32 bf16, bf16 f32, ...) on the same tokens: a line per precision,
 * then {"impl":"dsc-pair","step_ratio_median":..}, the median over steps of
 * bf16's time over f32's. Separate processes minutes apart compare a
 * machine whose speed drifts with its other tenants (on the 2-core guests
 * here, 5-10% from one run to the next); steps back to back do not. */
#define _POSIX_C_SOURCE 200809L
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dsc/exec.h"
#include "dsc/frontend.h"
#include "dsc/interp.h"
#include "dsc/ir.h"
#include "dsc/train.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static uint64_t rng_next(uint64_t *s) { /* splitmix64 */
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

typedef struct {
  double matmul, attention, other;
} flop_count;

static double numel(const dsc_node *n) {
  dsc_type t = dsc_node_type(n);
  return (double)dsc_type_numel(&t);
}

static flop_count count_flops(const dsc_graph *g) {
  flop_count fc = {0, 0, 0};
  for (int i = 0; i < dsc_graph_node_count(g); i++) {
    const dsc_node *n = dsc_graph_node(g, i);
    dsc_op op = dsc_node_op(n);
    switch (op) {
      case DSC_OP_INPUT:
      case DSC_OP_PARAM:
      case DSC_OP_CONST:
      case DSC_OP_IOTA:
      case DSC_OP_RESHAPE:
      case DSC_OP_PERMUTE:
      case DSC_OP_SLICE:
      case DSC_OP_CONCAT:
      case DSC_OP_BROADCAST:
      case DSC_OP_EMBEDDING:
      case DSC_OP_CAST:
      case DSC_OP_ASSIGN:
      case DSC_OP_ALL_REDUCE_START:
      case DSC_OP_ALL_REDUCE_WAIT:
      case DSC_OP_REDUCE_SCATTER_START:
      case DSC_OP_REDUCE_SCATTER_WAIT:
      case DSC_OP_ALL_GATHER_START:
      case DSC_OP_ALL_GATHER_WAIT:
      case DSC_OP_BROADCAST_START:
      case DSC_OP_BROADCAST_WAIT:
      case DSC_OP_ALL_TO_ALL_START:
      case DSC_OP_ALL_TO_ALL_WAIT:
        break;
      case DSC_OP_MATMUL: {
        /* result [batch.., M, N]; K is the last dim of the first input */
        dsc_type a = dsc_node_type(dsc_node_input(n, 0));
        fc.matmul += 2.0 * numel(n) * (double)a.dims[a.rank - 1];
        break;
      }
      case DSC_OP_ATTENTION: {
        dsc_type q = dsc_node_type(dsc_node_input(n, 0));
        double B = (double)q.dims[0], T = (double)q.dims[1], C = (double)q.dims[2];
        const dsc_attr *h = dsc_node_attr(n, "heads");
        fc.attention += 4.0 * B * T * T * C;
        /* the softmax over [B, heads, T, T] scores */
        fc.other += h && h->kind == DSC_ATTR_INT ? B * (double)h->u.i * T * T : 0;
        break;
      }
      default: {
        double m = numel(n);
        for (int k = 0; k < dsc_node_input_count(n); k++) {
          double e = numel(dsc_node_input(n, k));
          if (e > m) m = e;
        }
        fc.other += m;
        break;
      }
    }
  }
  return fc;
}

static int usage(const char *msg) {
  if (msg) fprintf(stderr, "train_step: %s\n", msg);
  fputs(
      "usage: train_step [MODEL.dsm] [--backend interp|cpu|cuda] [--threads N] [--batch B]\n"
      "                  [--seq T] [--steps N] [--warmup W] [--seed S] [--precision P[,P2]]\n"
      "                  [--count-only] [--profile]   (--profile: the slowest\n"
      "                  instructions of the timed steps, to stderr; --precision f32,bf16:\n"
      "                  both, steps alternating, and the median ratio of P2's to P's)\n",
      stderr);
  return 2;
}

static bool parse_i64(const char *s, int64_t min, int64_t *out) {
  if (!s || !*s) return false;
  char *end = NULL;
  long long v = strtoll(s, &end, 10);
  if (*end || v < min) return false;
  *out = v;
  return true;
}

/* Prints the context's diagnostics and returns exit code 1. */
static int fail(dsc_context *ctx, const char *what) {
  dsc_diag_print(ctx, stderr);
  fprintf(stderr, "train_step: %s failed\n", what);
  return 1;
}

/* One precision's model, executor and inputs. */
typedef struct {
  dsc_module *m;
  dsc_exec *e;
  dsc_params *params;
  dsc_tensor *in[3];
  dsc_tensor **outs; /* the step's outputs, n_out of them */
  int n_out;
  dsc_train_config cfg;
  flop_count fc;
  int64_t vocab;
  double compile_s, exec_new_s;
  double *times;
  double loss_first, loss_last, norm_first;
} run_state;

typedef struct {
  const char *model;
  dsc_backend backend;
  const char *backend_name;
  int64_t threads, B, T;
  bool count_only;
} run_options;

static void run_free(dsc_context *ctx, run_state *r) {
  free(r->times);
  free(r->outs);
  for (int k = 0; k < 3; k++)
    if (r->in[k]) dsc_tensor_free(ctx, r->in[k]);
  dsc_params_free(r->params);
  dsc_exec_free(r->e);
  dsc_module_free(r->m);
  memset(r, 0, sizeof *r);
}

/* Compiles the model at one precision, runs the pipeline and (unless
 * count_only) builds the executor, the params and the inputs. Returns 0, or
 * the exit code after printing why. */
static int run_setup(dsc_context *ctx, const run_options *o, const char *precision, int64_t seed,
                     int64_t steps, run_state *r) {
  memset(r, 0, sizeof *r);
  r->loss_first = r->loss_last = r->norm_first = NAN;
  dsc_dim_binding dims[2] = {{"B", o->B}, {"T", o->T}};
  dsc_frontend_options fo = {dims, 2, false};
  double t0 = now_s();
  if (dsc_compile_file(ctx, o->model, &fo, &r->m) != DSC_OK)
    return fail(ctx, "compiling the model");
  /* The vocabulary, from the forward graph before the pipeline decomposes
   * its cross_entropy: the class axis of the loss's logits. */
  dsc_graph *fg = dsc_module_find_graph(r->m, "forward");
  for (int i = 0; fg && i < dsc_graph_node_count(fg) && !r->vocab; i++) {
    const dsc_node *n = dsc_graph_node(fg, i);
    if (dsc_node_op(n) == DSC_OP_CROSS_ENTROPY) {
      dsc_type lt = dsc_node_type(dsc_node_input(n, 0));
      r->vocab = lt.dims[lt.rank - 1];
    }
  }
  if (r->vocab <= 0)
    return fputs(
               "train_step: the model's forward has no cross_entropy: cannot tell the "
               "vocabulary\n",
               stderr),
           1;
  if (dsc_train_config_from_module(r->m, &r->cfg) != DSC_OK)
    return fail(ctx, "reading the train section");
  r->cfg.batch = o->B, r->cfg.seq = o->T, r->cfg.grad_accum = 1;
  if (dsc_precision_from_name(precision, &r->cfg.precision) != 0)
    return usage("--precision must be f32, bf16 or fp16 (or two of them: f32,bf16)");
  dsc_pipeline_options po;
  memset(&po, 0, sizeof po);
  po.train = &r->cfg;
  if (dsc_run_pipeline(r->m, &po) != DSC_OK) return fail(ctx, "the pass pipeline");
  dsc_graph *g = dsc_module_find_graph(r->m, "train_step");
  if (!g || dsc_graph_input_count(g) != 3 || dsc_graph_output_count(g) < 2)
    return fputs("train_step: the pipeline made no train_step(tokens, targets, lr) graph\n",
                 stderr),
           1;
  r->compile_s = now_s() - t0;
  r->fc = count_flops(g);
  if (o->count_only) return 0;

  dsc_exec_options eo = {o->backend, (int)o->threads, NULL};
  t0 = now_s();
  if (dsc_exec_new(r->m, &eo, &r->e) != DSC_OK) return fail(ctx, "building the executor");
  r->exec_new_s = now_s() - t0;
  if (!(r->params = dsc_params_init(r->m, (uint64_t)seed)))
    return fail(ctx, "initialising the params");
  if (dsc_exec_set_params(r->e, r->params) != DSC_OK) return fail(ctx, "setting the params");
  dsc_type tok_t = dsc_node_type(dsc_graph_input_at(g, 0));
  dsc_type tgt_t = dsc_node_type(dsc_graph_input_at(g, 1));
  dsc_type lr_t = dsc_node_type(dsc_graph_input_at(g, 2));
  if ((tok_t.dtype != DSC_I32 && tok_t.dtype != DSC_I64) || !dsc_type_equal(&tok_t, &tgt_t))
    return fputs(
               "train_step: not a token model: forward(tokens, targets) must take two "
               "integer tensors of one shape\n",
               stderr),
           1;
  for (int k = 0; k < 2; k++)
    if (!(r->in[k] = dsc_tensor_new(ctx, tok_t))) goto oom;
  if (!(r->in[2] = dsc_tensor_new(ctx, lr_t))) goto oom;
  r->in[2]->data[0] = r->cfg.opt.lr;
  if (!(r->times = calloc((size_t)steps, sizeof *r->times))) goto oom;
  r->n_out = dsc_graph_output_count(g);
  if (!(r->outs = calloc((size_t)r->n_out, sizeof *r->outs))) goto oom;
  return 0;
oom:
  fputs("train_step: out of memory\n", stderr);
  return 1;
}

/* One timed step of r on the tokens drawn from the stream state rs (the
 * same draw for both precisions of a pair). Returns 0, or the exit code. */
static int run_one(dsc_context *ctx, const run_options *o, run_state *r, uint64_t rs, int64_t s,
                   int64_t warmup, bool profile) {
  /* Tokens below the real GPT-2 vocabulary (50257) when the model's is
   * padded beyond it, as data would be. */
  int64_t draw = r->vocab > 50257 ? 50257 : r->vocab;
  dsc_type tok_t = r->in[0]->type;
  int64_t ntok = dsc_type_numel(&tok_t);
  for (int k = 0; k < 2; k++)
    for (int64_t j = 0; j < ntok; j++) r->in[k]->data[j] = (double)(rng_next(&rs) % (uint64_t)draw);
  if (profile && s == warmup) dsc_exec_set_profiling(r->e, true);
  dsc_tensor **outs = r->outs;
  double ts = now_s();
  dsc_status st = dsc_exec_run_step(r->e, (const dsc_tensor *const *)r->in, 3, outs);
  double dt = now_s() - ts;
  if (st != DSC_OK) return fail(ctx, "dsc_exec_run");
  double loss = outs[0]->data[0];
  if (s == 0) r->loss_first = loss, r->norm_first = outs[1]->data[0];
  r->loss_last = loss;
  for (int k = 0; k < r->n_out; k++) {
    dsc_tensor_free(ctx, outs[k]);
    outs[k] = NULL;
  }
  if (!isfinite(loss))
    return fprintf(stderr, "train_step: step %" PRId64 " gave a non-finite loss\n", s), 1;
  if (s >= warmup) r->times[s - warmup] = dt;
  fprintf(stderr, "train_step: %s %s step %" PRId64 ": %.3f s, loss %.4f\n", o->backend_name,
          dsc_precision_name(r->cfg.precision), s, dt, loss);
  return 0;
}

static double median_of(double *v, int64_t n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* The JSON line of one precision's timed steps. */
static void print_result(const run_options *o, run_state *r, int64_t steps, int64_t warmup) {
  double sum = 0, best = r->times[0];
  for (int64_t s = 0; s < steps; s++)
    sum += r->times[s], best = r->times[s] < best ? r->times[s] : best;
  double *sorted = malloc(sizeof(double) * (size_t)steps);
  double median = r->times[0];
  if (sorted) {
    memcpy(sorted, r->times, sizeof(double) * (size_t)steps);
    median = median_of(sorted, steps);
    free(sorted);
  }
  int64_t n_params = 0; /* trainable: the optimizer's states are params too */
  for (int i = 0; i < dsc_module_param_count(r->m); i++) {
    if (dsc_module_param_is_state(r->m, i)) continue;
    dsc_type pt = dsc_module_param_type(r->m, i);
    n_params += dsc_type_numel(&pt);
  }
  const flop_count *fc = &r->fc;
  double gflop = (fc->matmul + fc->attention + fc->other) * 1e-9;
  printf(
      "{\"impl\":\"dsc-%s\",\"step_s_median\":%.6f,\"step_s_mean\":%.6f,\"step_s_min\":%.6f,"
      "\"steps\":%" PRId64 ",\"warmup\":%" PRId64
      ",\"gflop\":%.3f,\"gflop_matmul\":%.3f,"
      "\"gflop_attention\":%.3f,\"gflop_other\":%.3f,\"gflops\":%.2f,\"batch\":%" PRId64
      ",\"seq\":%" PRId64 ",\"threads\":%" PRId64 ",\"precision\":\"%s\",\"params\":%" PRId64
      ",\"loss_first\":%.5f,\"grad_norm_first\":%.5f,\"loss_last\":%.5f,"
      "\"pipeline_s\":%.3f,\"exec_new_s\":%.3f",
      o->backend_name, median, sum / (double)steps, best, steps, warmup, gflop, fc->matmul * 1e-9,
      fc->attention * 1e-9, fc->other * 1e-9, gflop / median, o->B, o->T, o->threads,
      dsc_precision_name(r->cfg.precision), n_params, r->loss_first, r->norm_first, r->loss_last,
      r->compile_s, r->exec_new_s);
  /* cuda: everything the step uses on the GPU is allocated with the executor */
  if (o->backend == DSC_BACKEND_CUDA)
    printf(",\"peak_mem_bytes\":%" PRId64, dsc_exec_device_bytes(r->e));
  printf("}\n");
}

int main(int argc, char **argv) {
  const char *precision = "f32";
  run_options o = {"examples/gpt2.dsm", DSC_BACKEND_CPU, "cpu", 2, 4, 64, false};
  int64_t steps = 5, warmup = 1, seed = 1;
  bool profile = false;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    bool ok = true;
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) return usage(NULL), 0;
    if (a[0] != '-') {
      o.model = a;
      continue;
    }
    if (strcmp(a, "--count-only") == 0) {
      o.count_only = true;
      continue;
    }
    if (strcmp(a, "--profile") == 0) {
      profile = true;
      continue;
    }
    if (strcmp(a, "--backend") == 0)
      ok = (o.backend_name = v) != NULL;
    else if (strcmp(a, "--precision") == 0)
      ok = (precision = v) != NULL;
    else if (strcmp(a, "--threads") == 0)
      ok = parse_i64(v, 0, &o.threads) && o.threads < 4096;
    else if (strcmp(a, "--batch") == 0)
      ok = parse_i64(v, 1, &o.B);
    else if (strcmp(a, "--seq") == 0)
      ok = parse_i64(v, 1, &o.T);
    else if (strcmp(a, "--steps") == 0)
      ok = parse_i64(v, 1, &steps) && steps < 100000;
    else if (strcmp(a, "--warmup") == 0)
      ok = parse_i64(v, 0, &warmup) && warmup < 100000;
    else if (strcmp(a, "--seed") == 0)
      ok = parse_i64(v, 0, &seed);
    else
      return usage("unknown option");
    if (!ok) {
      fprintf(stderr, "train_step: bad or missing value for %s\n", a);
      return 2;
    }
    i++;
  }
  if (dsc_backend_from_name(o.backend_name, &o.backend) != 0) return usage("unknown backend");
  /* --precision A,B: both in one process, their steps alternating (A B, then
   * B A, ...) on the same tokens, so that a machine whose speed drifts (other
   * tenants) slows both alike; prints a line per precision, then their ratio */
  char prec[2][16];
  int n_runs = 1;
  const char *comma = strchr(precision, ',');
  if (strlen(precision) >= sizeof prec) return usage("--precision: f32, bf16, fp16 or two of them");
  snprintf(prec[0], sizeof prec[0], "%.*s",
           comma ? (int)(comma - precision) : (int)strlen(precision), precision);
  if (comma) snprintf(prec[1], sizeof prec[1], "%s", comma + 1), n_runs = 2;
  if (n_runs == 2 && o.count_only) return usage("two precisions time steps: not with --count-only");

  dsc_context *ctx = dsc_context_new(NULL, NULL);
  if (!ctx) return fputs("train_step: out of memory\n", stderr), 1;
  int code = 1;
  run_state r[2];
  memset(r, 0, sizeof r);
  if (!o.count_only && !dsc_backend_available(o.backend)) {
    fprintf(stderr, "train_step: backend '%s' is not in this build\n", o.backend_name);
    goto done;
  }
  for (int k = 0; k < n_runs; k++)
    if ((code = run_setup(ctx, &o, prec[k], seed, steps, &r[k])) != 0) goto done;
  code = 1;
  if (o.count_only) {
    const flop_count *fc = &r[0].fc;
    printf(
        "{\"impl\":\"dsc-count\",\"gflop\":%.3f,\"gflop_matmul\":%.3f,"
        "\"gflop_attention\":%.3f,\"gflop_other\":%.3f,\"nodes\":%d,\"batch\":%" PRId64
        ",\"seq\":%" PRId64 ",\"precision\":\"%s\",\"pipeline_s\":%.3f}\n",
        (fc->matmul + fc->attention + fc->other) * 1e-9, fc->matmul * 1e-9, fc->attention * 1e-9,
        fc->other * 1e-9, dsc_graph_node_count(dsc_module_find_graph(r[0].m, "train_step")), o.B,
        o.T, dsc_precision_name(r[0].cfg.precision), r[0].compile_s);
    code = 0;
    goto done;
  }
  uint64_t rs = (uint64_t)seed * 0x2545F4914F6CDD1Dull + 7;
  for (int64_t s = 0; s < warmup + steps; s++) {
    for (int q = 0; q < n_runs; q++) {
      int k = n_runs == 2 && s % 2 ? 1 - q : q;
      if ((code = run_one(ctx, &o, &r[k], rs, s, warmup, profile)) != 0) goto done;
    }
    /* the next step's tokens: the stream after this step's draws */
    dsc_type tok_t = r[0].in[0]->type;
    for (int64_t j = 0; j < 2 * dsc_type_numel(&tok_t); j++) rng_next(&rs);
  }
  code = 1;
  for (int k = 0; k < n_runs && profile; k++) {
    if (n_runs == 2) fprintf(stderr, "train_step: %s\n", dsc_precision_name(r[k].cfg.precision));
    if (dsc_exec_print_profile(r[k].e, "train_step", getenv("TOPN") ? atoi(getenv("TOPN")) : 25,
                               stderr) != DSC_OK) {
      code = fail(ctx, "printing the profile");
      goto done;
    }
  }
  for (int k = 0; k < n_runs; k++) print_result(&o, &r[k], steps, warmup);
  if (n_runs == 2) {
    /* the median of the per-step ratios: each pair of steps ran back to back */
    double *ratio = malloc(sizeof(double) * (size_t)steps);
    if (!ratio) goto done;
    for (int64_t s = 0; s < steps; s++) ratio[s] = r[1].times[s] / r[0].times[s];
    printf(
        "{\"impl\":\"dsc-pair\",\"precisions\":\"%s,%s\",\"step_ratio_median\":%.4f,\"steps\":"
        "%" PRId64 "}\n",
        dsc_precision_name(r[0].cfg.precision), dsc_precision_name(r[1].cfg.precision),
        median_of(ratio, steps), steps);
    free(ratio);
  }
  code = 0;
done:
  for (int k = 0; k < 2; k++) run_free(ctx, &r[k]);
  dsc_context_free(ctx);
  return code;
}
