/* dsc run: the forward pass on random inputs, on any backend. */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tools/cli.h"

static const char run_help[] =
    "usage: dsc run FILE [--seed S] [--batch B] [--seq T] [--dim NAME=V]\n"
    "               [--backend interp|cpu|cuda] [--threads N] [--init-from DIR] [--quiet]\n"
    "\n"
    "Initialises the parameters from their initializers (deterministic in S,\n"
    "default 0), draws random inputs (standard normal for float inputs; for\n"
    "integer inputs, uniform ids below the smallest table or class count they\n"
    "index: embedding rows, cross_entropy classes) and runs the forward graph\n"
    "on the backend (default: cpu where built, else interp, the reference\n"
    "interpreter; --threads: cpu threads). Prints 'loss: X' when forward returns a\n"
    "scalar, else each output's type and leading values. FILE is a .dsm model,\n"
    "a .dsir text IR file or a .dsx program from 'dsc compile' (its forward graph\n"
    "and, on the same host, its kernels; --batch and --seq must match it).\n"
    "--init-from DIR runs with the weights of a Hugging Face model directory\n"
    "(docs/models.md) instead of the initializers.\n"
    "--quiet drops the summary on standard error.\n";

/* The forward module of a program file; dims must match what it was
 * compiled with (its graphs are fixed). */
static dsc_status load_program(dsc_context *ctx, const char *path, const cli_dims *dims,
                               dsc_program **prog, dsc_module **m) {
  dsc_status st = dsc_program_open(ctx, path, prog);
  for (int k = 0; st == DSC_OK && k < dims->n; k++) {
    const char *name = dims->names[k];
    const char *key = strcmp(name, "B") == 0 ? "batch" : strcmp(name, "T") == 0 ? "seq" : NULL;
    int64_t have = 0;
    if (!key) {
      fprintf(stderr, "%s: error: --dim %s: a compiled program's dims are fixed\n", path, name);
      st = DSC_ERR_USER;
    } else if ((st = dsc_program_meta_i64(*prog, key, &have)) == DSC_OK &&
               have != dims->dims[k].value) {
      fprintf(stderr,
              "%s: error: was compiled with --%s %" PRId64 ", not %" PRId64
              " (its graphs are fixed: recompile with dsc compile --%s %" PRId64 ")\n",
              path, key, have, dims->dims[k].value, key, dims->dims[k].value);
      st = DSC_ERR_USER;
    }
  }
  if (st == DSC_OK) st = dsc_program_module(*prog, "forward", m);
  return st;
}

/* splitmix64: the inputs only need to be reproducible, not the params'
 * generator (that one is documented in docs/ir.md). */
static uint64_t next_u64(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
static double next_uniform(uint64_t *s) { return (double)(next_u64(s) >> 11) * 0x1.0p-53; }
static double next_normal(uint64_t *s) {
  double u = 1.0 - next_uniform(s), v = next_uniform(s);
  return sqrt(-2.0 * log(u)) * cos(2.0 * M_PI * v);
}

/* Exclusive upper bound for an integer input: the fewest rows or classes
 * among the ops that index with it; 2 when nothing indexes with it. */
static int64_t index_bound(const dsc_graph *g, const dsc_node *input) {
  int64_t bound = -1;
  for (int i = 0; i < dsc_graph_node_count(g); i++) {
    const dsc_node *n = dsc_graph_node(g, i);
    int64_t b = -1;
    if (dsc_node_op(n) == DSC_OP_EMBEDDING && dsc_node_input(n, 1) == input)
      b = dsc_node_type(dsc_node_input(n, 0)).dims[0];
    if (dsc_node_op(n) == DSC_OP_CROSS_ENTROPY && dsc_node_input(n, 1) == input) {
      dsc_type lt = dsc_node_type(dsc_node_input(n, 0));
      b = lt.dims[lt.rank - 1];
    }
    if (b > 0 && (bound < 0 || b < bound)) bound = b;
  }
  return bound > 0 ? bound : 2;
}

static void print_output(int k, const dsc_tensor *t) {
  char ty[256];
  dsc_type_format(&t->type, ty, sizeof ty);
  int64_t n = dsc_type_numel(&t->type);
  if (t->type.rank == 0) { /* a float scalar first output is the model's loss */
    if (k == 0 && dsc_dtype_is_float(t->type.dtype))
      printf("loss: %.6f\n", t->data[0]);
    else
      printf("output %d: %s %.9g\n", k, ty, t->data[0]);
    return;
  }
  double sum = 0, sq = 0;
  for (int64_t i = 0; i < n; i++) sum += t->data[i], sq += t->data[i] * t->data[i];
  double mean = sum / (double)n, var = sq / (double)n - mean * mean;
  printf("output %d: %s  mean %.6g  std %.6g\n  [", k, ty, mean, sqrt(var > 0 ? var : 0));
  int64_t shown = n < 16 ? n : 16;
  for (int64_t i = 0; i < shown; i++) printf(i ? ", %.6g" : "%.6g", t->data[i]);
  printf("%s]\n", n > shown ? ", ..." : "");
}

/* As dsc train checks (driver/train.c drv_compile_step): positions beyond
 * the model's position table, before the inputs are allocated. */
static dsc_status check_context(const char *path, const dsc_graph *g) {
  if (dsc_graph_input_count(g) < 1) return DSC_OK;
  dsc_type t = dsc_node_type(dsc_graph_input_at(g, 0));
  int64_t context = dsc_model_context(g);
  if (t.rank < 2 || context <= 0 || t.dims[1] <= context) return DSC_OK;
  fprintf(stderr,
          "%s: error: sequence length %" PRId64 " is longer than the model's context of %" PRId64
          " positions (its position table); use --seq %" PRId64 " or less\n",
          path, t.dims[1], context, context);
  return DSC_ERR_USER;
}

int cli_run(int argc, char **argv) {
  const char *path = NULL;
  int64_t seed = 0;
  bool quiet = false;
  const char *init_from = NULL;
  cli_dims dims = {0};
  dsc_backend backend = dsc_backend_default();
  int64_t threads = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      fputs(run_help, stdout);
      return CLI_EXIT_OK;
    }
    int r = cli_parse_dim_flag("run", argc, argv, &i, &dims);
    if (r < 0) return CLI_EXIT_USER;
    if (r > 0) continue;
    if (strcmp(argv[i], "--seed") == 0) {
      if (i + 1 >= argc || !cli_parse_i64(argv[i + 1], &seed) || seed < 0)
        return cli_usage_error("run", "--seed needs a non-negative integer"), CLI_EXIT_USER;
      i++;
    } else if (strcmp(argv[i], "--backend") == 0) {
      if (i + 1 >= argc || dsc_backend_from_name(argv[i + 1], &backend) != 0)
        return cli_usage_error("run", "--backend needs one of interp, cpu, cuda"), CLI_EXIT_USER;
      i++;
    } else if (strcmp(argv[i], "--threads") == 0) {
      if (i + 1 >= argc || !cli_parse_i64(argv[i + 1], &threads) || threads < 1 || threads > 1024)
        return cli_usage_error("run", "--threads needs a positive integer"), CLI_EXIT_USER;
      i++;
    } else if (strcmp(argv[i], "--init-from") == 0) {
      if (i + 1 >= argc)
        return cli_usage_error("run", "--init-from needs a directory"), CLI_EXIT_USER;
      init_from = argv[++i];
    } else if (strcmp(argv[i], "--quiet") == 0) {
      quiet = true;
    } else if (argv[i][0] == '-' && argv[i][1]) {
      return cli_usage_error("run", "unknown option '%s'", argv[i]), CLI_EXIT_USER;
    } else if (path) {
      return cli_usage_error("run", "one model file at a time"), CLI_EXIT_USER;
    } else {
      path = argv[i];
    }
  }
  if (!path) return cli_usage_error("run", "missing model file"), CLI_EXIT_USER;

  dsc_context *ctx = dsc_context_new(NULL, NULL);
  if (!ctx) return fputs("dsc: out of memory\n", stderr), CLI_EXIT_INTERNAL;
  if (!quiet) cli_show_progress(ctx);
  dsc_module *m = NULL;
  dsc_program *prog = NULL;
  dsc_params *params = NULL;
  dsc_tensor **inputs = NULL, **outputs = NULL;
  int n_in = 0, n_out = 0;
  size_t plen = strlen(path);
  bool is_prog = dsc_program_is_file(path) || (plen >= 4 && strcmp(path + plen - 4, ".dsx") == 0);
  dsc_status st = is_prog ? load_program(ctx, path, &dims, &prog, &m)
                          : cli_load_module(ctx, path, &dims, &m);
  const dsc_graph *g = st == DSC_OK ? dsc_module_find_graph(m, "forward") : NULL;
  if (st == DSC_OK && !g) {
    fprintf(stderr, "%s: error: the module has no graph 'forward'\n", path);
    st = DSC_ERR_USER;
  }
  if (st == DSC_OK) st = check_context(path, g);
  if (st == DSC_OK && !(params = dsc_params_init(m, (uint64_t)seed))) st = DSC_ERR_INTERNAL;
  if (st == DSC_OK && init_from && prog) {
    fprintf(stderr, "%s: error: --init-from needs the model file (.dsm), not a program\n", path);
    st = DSC_ERR_USER;
  }
  if (st == DSC_OK && init_from) { /* m is still before the passes: its ops are the model's */
    int np = dsc_module_param_count(m);
    dsc_tensor **dst = calloc((size_t)np + 1, sizeof *dst);
    for (int i = 0; dst && i < np; i++) dst[i] = dsc_params_get(params, i);
    st = dst ? dsc_hf_check_config(ctx, init_from, m) : DSC_ERR_INTERNAL;
    if (st == DSC_OK) st = dsc_hf_import(ctx, init_from, m, dst);
    free(dst);
  }
  if (st == DSC_OK) {
    n_in = dsc_graph_input_count(g);
    n_out = dsc_graph_output_count(g);
    inputs = calloc((size_t)n_in + 1, sizeof *inputs);
    outputs = calloc((size_t)n_out + 1, sizeof *outputs);
    if (!inputs || !outputs) st = DSC_ERR_INTERNAL;
  }
  uint64_t rng = (uint64_t)seed * 0x2545f4914f6cdd1dULL + 1;
  for (int i = 0; st == DSC_OK && i < n_in; i++) {
    const dsc_node *in = dsc_graph_input_at(g, i);
    dsc_type t = dsc_node_type(in);
    if (!(inputs[i] = dsc_tensor_new(ctx, t))) {
      char ty[256];
      dsc_type_format(&t, ty, sizeof ty);
      fprintf(stderr, "dsc run: error: out of memory for input '%s' (%s, %.3g GB as doubles)\n",
              dsc_node_name(in), ty, (double)dsc_type_numel(&t) * 8 / 1e9);
      st = DSC_ERR_INTERNAL;
      break;
    }
    int64_t n = dsc_type_numel(&t), bound = dsc_dtype_is_float(t.dtype) ? 0 : index_bound(g, in);
    for (int64_t e = 0; e < n; e++)
      inputs[i]->data[e] = bound ? (double)(next_u64(&rng) % (uint64_t)bound) : next_normal(&rng);
    if (!quiet) {
      char ty[256];
      dsc_type_format(&t, ty, sizeof ty);
      if (bound)
        fprintf(stderr, "input %s: %s, random ids in [0, %" PRId64 ")\n", dsc_node_name(in), ty, bound);
      else
        fprintf(stderr, "input %s: %s, standard normal\n", dsc_node_name(in), ty);
    }
  }
  if (st == DSC_OK) {
    if (!quiet)
      fprintf(stderr, "model %s: %" PRId64 " parameters in %d tensors, seed %" PRId64 "\n",
              dsc_module_name(m), dsc_module_param_numel(m), dsc_module_param_count(m), seed);
    dsc_exec *x = NULL;
    dsc_exec_options xo = {backend, (int)threads, NULL};
    char why[1200];
    if (prog && backend == DSC_BACKEND_CPU && !dsc_program_cpu_usable(prog, why, sizeof why))
      fprintf(stderr, "%s: warning: compiling the kernels from the IR: %s\n", path, why);
    /* A program's graphs went through the codegen passes already. */
    if (backend != DSC_BACKEND_INTERP && !prog) st = dsc_run_codegen_passes(m);
    if (st == DSC_OK) st = dsc_exec_new_with_program(m, &xo, prog, "forward", &x);
    if (st == DSC_OK && prog && !quiet) {
      int compiled, loaded;
      dsc_exec_kernel_counts(x, &compiled, &loaded);
      fprintf(stderr, "program %s: %d kernels loaded, %d compiled\n", path, loaded, compiled);
    } else if (st == DSC_OK && backend != DSC_BACKEND_INTERP && !quiet) {
      int compiled, prebuilt;
      dsc_exec_kernel_counts(x, &compiled, &prebuilt);
      fprintf(stderr, "kernels: %d compiled, %d from the kernel cache\n", compiled,
              dsc_exec_kernels_cached(x));
    }
    if (st == DSC_OK) st = dsc_exec_set_params(x, params);
    if (st == DSC_OK) st = dsc_exec_run(x, "forward", (const dsc_tensor *const *)inputs, n_in, outputs);
    dsc_exec_free(x);
  }
  for (int k = 0; st == DSC_OK && k < n_out; k++) print_output(k, outputs[k]);
  dsc_diag_print(ctx, stderr);
  for (int i = 0; inputs && i < n_in; i++) dsc_tensor_free(ctx, inputs[i]);
  for (int k = 0; outputs && k < n_out; k++) dsc_tensor_free(ctx, outputs[k]);
  free(inputs);
  free(outputs);
  dsc_params_free(params);
  dsc_module_free(m);
  dsc_program_free(prog);
  dsc_context_free(ctx);
  return cli_exit_code(st);
}
