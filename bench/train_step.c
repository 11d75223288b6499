/* train_step: times one GPT training step of a model file on a backend.
 *
 *   train_step [MODEL.dsm] [--backend interp|cpu|cuda] [--threads N] [--batch B]
 *              [--seq T] [--steps N] [--warmup W] [--seed S] [--precision P]
 *              [--count-only]
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
 * (cuda adds "peak_mem_bytes": dsc_exec_device_bytes). */
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
      "                  [--seq T] [--steps N] [--warmup W] [--seed S] [--precision P]\n"
      "                  [--count-only] [--profile]   (--profile: the slowest\n"
      "                  instructions of the timed steps, to stderr)\n",
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

int main(int argc, char **argv) {
  const char *model = "examples/gpt2.dsm", *backend_name = "cpu", *precision = "f32";
  int64_t threads = 2, B = 4, T = 64, steps = 5, warmup = 1, seed = 1;
  bool count_only = false, profile = false;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    bool ok = true;
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) return usage(NULL), 0;
    if (a[0] != '-') {
      model = a;
      continue;
    }
    if (strcmp(a, "--count-only") == 0) {
      count_only = true;
      continue;
    }
    if (strcmp(a, "--profile") == 0) {
      profile = true;
      continue;
    }
    if (strcmp(a, "--backend") == 0)
      ok = (backend_name = v) != NULL;
    else if (strcmp(a, "--precision") == 0)
      ok = (precision = v) != NULL;
    else if (strcmp(a, "--threads") == 0)
      ok = parse_i64(v, 0, &threads) && threads < 4096;
    else if (strcmp(a, "--batch") == 0)
      ok = parse_i64(v, 1, &B);
    else if (strcmp(a, "--seq") == 0)
      ok = parse_i64(v, 1, &T);
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
  dsc_backend backend;
  if (dsc_backend_from_name(backend_name, &backend) != 0) return usage("unknown backend");

  dsc_context *ctx = dsc_context_new(NULL, NULL);
  if (!ctx) return fputs("train_step: out of memory\n", stderr), 1;
  int code = 1;
  dsc_module *m = NULL;
  dsc_exec *e = NULL;
  dsc_params *params = NULL;
  dsc_tensor *in[3] = {NULL, NULL, NULL};
  double *times = NULL;

  dsc_dim_binding dims[2] = {{"B", B}, {"T", T}};
  dsc_frontend_options fo = {dims, 2, false};
  double t0 = now_s();
  if (dsc_compile_file(ctx, model, &fo, &m) != DSC_OK) {
    code = fail(ctx, "compiling the model");
    goto done;
  }
  /* The vocabulary, from the forward graph before the pipeline decomposes
   * its cross_entropy: the class axis of the loss's logits. */
  int64_t vocab = 0;
  dsc_graph *fg = dsc_module_find_graph(m, "forward");
  for (int i = 0; fg && i < dsc_graph_node_count(fg) && !vocab; i++) {
    const dsc_node *n = dsc_graph_node(fg, i);
    if (dsc_node_op(n) == DSC_OP_CROSS_ENTROPY) {
      dsc_type lt = dsc_node_type(dsc_node_input(n, 0));
      vocab = lt.dims[lt.rank - 1];
    }
  }
  if (vocab <= 0) {
    fputs("train_step: the model's forward has no cross_entropy: cannot tell the vocabulary\n",
          stderr);
    goto done;
  }
  dsc_train_config cfg;
  if (dsc_train_config_from_module(m, &cfg) != DSC_OK) {
    code = fail(ctx, "reading the train section");
    goto done;
  }
  cfg.batch = B, cfg.seq = T, cfg.grad_accum = 1;
  if (dsc_precision_from_name(precision, &cfg.precision) != 0) {
    code = usage("--precision must be f32, bf16 or fp16");
    goto done;
  }
  dsc_pipeline_options po;
  memset(&po, 0, sizeof po);
  po.train = &cfg;
  if (dsc_run_pipeline(m, &po) != DSC_OK) {
    code = fail(ctx, "the pass pipeline");
    goto done;
  }
  dsc_graph *g = dsc_module_find_graph(m, "train_step");
  if (!g || dsc_graph_input_count(g) != 3 || dsc_graph_output_count(g) < 2) {
    fputs("train_step: the pipeline made no train_step(tokens, targets, lr) graph\n", stderr);
    goto done;
  }
  double compile_s = now_s() - t0;
  flop_count fc = count_flops(g);
  if (count_only) {
    printf(
        "{\"impl\":\"dsc-count\",\"gflop\":%.3f,\"gflop_matmul\":%.3f,"
        "\"gflop_attention\":%.3f,\"gflop_other\":%.3f,\"nodes\":%d,\"batch\":%" PRId64
        ",\"seq\":%" PRId64 ",\"precision\":\"%s\",\"pipeline_s\":%.3f}\n",
        (fc.matmul + fc.attention + fc.other) * 1e-9, fc.matmul * 1e-9, fc.attention * 1e-9,
        fc.other * 1e-9, dsc_graph_node_count(g), B, T, dsc_precision_name(cfg.precision),
        compile_s);
    code = 0;
    goto done;
  }

  if (!dsc_backend_available(backend)) {
    fprintf(stderr, "train_step: backend '%s' is not in this build\n", backend_name);
    goto done;
  }
  dsc_exec_options eo = {backend, (int)threads, NULL};
  t0 = now_s();
  if (dsc_exec_new(m, &eo, &e) != DSC_OK) {
    code = fail(ctx, "building the executor");
    goto done;
  }
  double exec_new_s = now_s() - t0;
  if (!(params = dsc_params_init(m, (uint64_t)seed))) {
    code = fail(ctx, "initialising the params");
    goto done;
  }
  if (dsc_exec_set_params(e, params) != DSC_OK) {
    code = fail(ctx, "setting the params");
    goto done;
  }

  /* Tokens below the real GPT-2 vocabulary (50257) when the model's is
   * padded beyond it, as data would be. */
  dsc_type tok_t = dsc_node_type(dsc_graph_input_at(g, 0));
  dsc_type tgt_t = dsc_node_type(dsc_graph_input_at(g, 1));
  dsc_type lr_t = dsc_node_type(dsc_graph_input_at(g, 2));
  if ((tok_t.dtype != DSC_I32 && tok_t.dtype != DSC_I64) || !dsc_type_equal(&tok_t, &tgt_t)) {
    fputs(
        "train_step: not a token model: forward(tokens, targets) must take two integer "
        "tensors of one shape\n",
        stderr);
    goto done;
  }
  int64_t draw = vocab > 50257 ? 50257 : vocab;
  for (int k = 0; k < 2; k++)
    if (!(in[k] = dsc_tensor_new(ctx, tok_t))) goto oom;
  if (!(in[2] = dsc_tensor_new(ctx, lr_t))) goto oom;
  in[2]->data[0] = cfg.opt.lr;
  int n_out = dsc_graph_output_count(g);
  dsc_tensor **outs = calloc((size_t)n_out, sizeof *outs);
  times = calloc((size_t)steps, sizeof *times);
  if (!outs || !times) {
    free(outs);
    goto oom;
  }

  uint64_t rs = (uint64_t)seed * 0x2545F4914F6CDD1Dull + 7;
  int64_t ntok = dsc_type_numel(&tok_t);
  double loss_first = NAN, loss_last = NAN, norm_first = NAN;
  bool run_ok = true;
  for (int64_t s = 0; s < warmup + steps && run_ok; s++) {
    for (int k = 0; k < 2; k++)
      for (int64_t j = 0; j < ntok; j++) in[k]->data[j] = (double)(rng_next(&rs) % (uint64_t)draw);
    if (profile && s == warmup) dsc_exec_set_profiling(e, true);
    double ts = now_s();
    dsc_status st = dsc_exec_run_step(e, (const dsc_tensor *const *)in, 3, outs);
    double dt = now_s() - ts;
    if (st != DSC_OK) {
      code = fail(ctx, "dsc_exec_run");
      run_ok = false;
      break;
    }
    double loss = outs[0]->data[0];
    if (s == 0) loss_first = loss, norm_first = outs[1]->data[0];
    loss_last = loss;
    if (!isfinite(loss)) {
      fprintf(stderr, "train_step: step %" PRId64 " gave a non-finite loss\n", s);
      run_ok = false;
    }
    for (int k = 0; k < n_out; k++) {
      dsc_tensor_free(ctx, outs[k]);
      outs[k] = NULL;
    }
    if (s >= warmup) times[s - warmup] = dt;
    fprintf(stderr, "train_step: %s step %" PRId64 ": %.3f s, loss %.4f\n", backend_name, s, dt,
            loss);
  }
  free(outs);
  if (!run_ok) goto done;
  if (profile && dsc_exec_print_profile(e, "train_step", getenv("TOPN") ? atoi(getenv("TOPN")) : 25, stderr) != DSC_OK) {
    code = fail(ctx, "printing the profile");
    goto done;
  }

  double sum = 0, best = times[0];
  for (int64_t s = 0; s < steps; s++) sum += times[s], best = times[s] < best ? times[s] : best;
  qsort(times, (size_t)steps, sizeof *times, cmp_double);
  double median = steps % 2 ? times[steps / 2] : 0.5 * (times[steps / 2 - 1] + times[steps / 2]);
  int64_t n_params = 0; /* trainable: the optimizer's states are params too */
  for (int i = 0; i < dsc_module_param_count(m); i++) {
    if (dsc_module_param_is_state(m, i)) continue;
    dsc_type pt = dsc_module_param_type(m, i);
    n_params += dsc_type_numel(&pt);
  }
  double gflop = (fc.matmul + fc.attention + fc.other) * 1e-9;
  printf(
      "{\"impl\":\"dsc-%s\",\"step_s_median\":%.6f,\"step_s_mean\":%.6f,\"step_s_min\":%.6f,"
      "\"steps\":%" PRId64 ",\"warmup\":%" PRId64
      ",\"gflop\":%.3f,\"gflop_matmul\":%.3f,"
      "\"gflop_attention\":%.3f,\"gflop_other\":%.3f,\"gflops\":%.2f,\"batch\":%" PRId64
      ",\"seq\":%" PRId64 ",\"threads\":%" PRId64 ",\"precision\":\"%s\",\"params\":%" PRId64
      ",\"loss_first\":%.5f,\"grad_norm_first\":%.5f,\"loss_last\":%.5f,"
      "\"pipeline_s\":%.3f,\"exec_new_s\":%.3f",
      backend_name, median, sum / (double)steps, best, steps, warmup, gflop, fc.matmul * 1e-9,
      fc.attention * 1e-9, fc.other * 1e-9, gflop / median, B, T, threads,
      dsc_precision_name(cfg.precision), n_params, loss_first, norm_first, loss_last, compile_s,
      exec_new_s);
  /* cuda: everything the step uses on the GPU is allocated with the executor */
  if (backend == DSC_BACKEND_CUDA)
    printf(",\"peak_mem_bytes\":%" PRId64, dsc_exec_device_bytes(e));
  printf("}\n");
  code = 0;
  goto done;
oom:
  fputs("train_step: out of memory\n", stderr);
done:
  free(times);
  for (int k = 0; k < 3; k++)
    if (in[k]) dsc_tensor_free(ctx, in[k]);
  dsc_params_free(params);
  dsc_exec_free(e);
  dsc_module_free(m);
  dsc_context_free(ctx);
  return code;
}
