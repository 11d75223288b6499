/* dsc compile: a model's training and forward graphs with their kernels
 * into a .dsx program file (dsc_program_compile), and --list of one. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tools/cli.h"

static const char compile_help[] =
    "usage: dsc compile MODEL.dsm [-o FILE.dsx] [--target cpu|cuda] [--batch B] [--seq T]\n"
    "                   [--grad-accum K] [--precision f32|bf16|fp16] [--lr X]\n"
    "       dsc compile --list FILE.dsx\n"
    "\n"
    "Builds what 'dsc train MODEL.dsm' builds (the training step through the whole\n"
    "pipeline at batch*grad-accum x seq, and the forward graph at batch x seq) and\n"
    "writes it with its compiled kernels to FILE.dsx (default: MODEL.dsx in the\n"
    "current directory, as 'cc -c' does). 'dsc train FILE.dsx' and 'dsc run FILE.dsx'\n"
    "then skip the pipeline and, on the same host, the kernel compilation.\n"
    "  --target cpu   one object per kernel for this host's CPU (the default); on\n"
    "                 another CPU, LLVM or dsc version the kernels are recompiled\n"
    "                 from the IR with a warning\n"
    "  --target cuda  per graph the CUDA C, PTX and cubin for sm_90 (NVRTC)\n"
    "The graph flags are as for dsc train; their defaults come from the model's\n"
    "train section. A .dsx cannot change them later: dsc train/run refuse a\n"
    "different --batch, --seq, --grad-accum or --precision. --lr matters to the\n"
    "graph only for muon with adam_lr. Run-time settings (steps, lr schedule,\n"
    "seed, data, threads, backend, checkpoints) stay flags of dsc train.\n"
    "\n"
    "-o writes atomically (a temporary file renamed over a regular file); a\n"
    "character device (/dev/null) or a FIFO is written into in place, a\n"
    "directory is refused.\n"
    "--list prints the file's settings and sections (name, bytes).\n";

static int list(const char *path) {
  dsc_context *ctx = dsc_context_new(NULL, NULL);
  if (!ctx) return fputs("dsc: out of memory\n", stderr), CLI_EXIT_INTERNAL;
  dsc_program *p = NULL;
  dsc_status st = dsc_program_open(ctx, path, &p);
  dsc_diag_print(ctx, stderr);
  if (st == DSC_OK) {
    const char *keys[] = {"dsc_version", "target", "host",       "model",     "model_name",
                          "batch",       "seq",    "grad_accum", "precision", "vocab"};
    printf("%s: dsc program format %s\n", path, dsc_program_meta(p, "format"));
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
      const char *v = dsc_program_meta(p, keys[i]);
      if (v) printf("  %-12s %s\n", keys[i], v);
    }
    printf("sections:\n");
    for (int i = 0; i < dsc_program_section_count(p); i++)
      printf("  %-40s %12zu bytes\n", dsc_program_section_name(p, i),
             dsc_program_section_size(p, i));
  }
  dsc_program_free(p);
  dsc_context_free(ctx);
  return cli_exit_code(st);
}

/* MODEL.dsm -> MODEL.dsx in the current directory. */
static char *default_output(const char *model) {
  const char *base = strrchr(model, '/');
  base = base ? base + 1 : model;
  size_t n = strlen(base);
  if (n > 4 && strcmp(base + n - 4, ".dsm") == 0) n -= 4;
  char *out = malloc(n + 5);
  if (out) {
    memcpy(out, base, n);
    memcpy(out + n, ".dsx", 5);
  }
  return out;
}

static bool want_i64(int argc, char **argv, int *i, int64_t *out) {
  if (*i + 1 >= argc || !cli_parse_i64(argv[*i + 1], out) || *out < 1 || *out > (1LL << 40)) {
    cli_usage_error("compile", "%s needs a positive integer", argv[*i]);
    return false;
  }
  ++*i;
  return true;
}

int cli_compile(int argc, char **argv) {
  dsc_compile_options o;
  memset(&o, 0, sizeof o);
  const char *list_path = NULL;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    bool ok = true;
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      fputs(compile_help, stdout);
      return CLI_EXIT_OK;
    } else if (strcmp(a, "--list") == 0) {
      if (i + 1 >= argc)
        return cli_usage_error("compile", "--list needs a .dsx file"), CLI_EXIT_USER;
      list_path = argv[++i];
    } else if (strcmp(a, "-o") == 0 || strcmp(a, "--target") == 0 ||
               strcmp(a, "--precision") == 0) {
      if (i + 1 >= argc || !argv[i + 1][0])
        return cli_usage_error("compile", "%s needs a value", a), CLI_EXIT_USER;
      const char *v = argv[++i];
      dsc_precision prec;
      if (a[1] == 'o')
        o.out_path = v;
      else if (a[2] == 't') {
        if (strcmp(v, "cpu") != 0 && strcmp(v, "cuda") != 0)
          return cli_usage_error("compile", "--target: '%s' is not one of cpu, cuda", v),
                 CLI_EXIT_USER;
        o.target = v;
      } else {
        if (dsc_precision_from_name(v, &prec) != 0)
          return cli_usage_error("compile", "--precision: '%s' is not one of f32, bf16, fp16", v),
                 CLI_EXIT_USER;
        o.precision = v;
      }
    } else if (strcmp(a, "--batch") == 0) {
      ok = want_i64(argc, argv, &i, &o.batch);
    } else if (strcmp(a, "--seq") == 0) {
      ok = want_i64(argc, argv, &i, &o.seq);
    } else if (strcmp(a, "--grad-accum") == 0) {
      ok = want_i64(argc, argv, &i, &o.grad_accum);
    } else if (strcmp(a, "--lr") == 0) {
      if (!cli_parse_positive(i + 1 < argc ? argv[i + 1] : "", &o.lr))
        return cli_usage_error("compile", "--lr needs a positive number"), CLI_EXIT_USER;
      i++;
    } else if (a[0] == '-' && a[1]) {
      return cli_usage_error("compile", "unknown option '%s'", a), CLI_EXIT_USER;
    } else if (o.model_path) {
      return cli_usage_error("compile", "one model file at a time"), CLI_EXIT_USER;
    } else {
      o.model_path = a;
    }
    if (!ok) return CLI_EXIT_USER;
  }
  if (list_path) {
    if (o.model_path)
      return cli_usage_error("compile", "--list takes only the .dsx file"), CLI_EXIT_USER;
    return list(list_path);
  }
  if (!o.model_path) return cli_usage_error("compile", "missing model file"), CLI_EXIT_USER;
  char *def = o.out_path ? NULL : default_output(o.model_path);
  if (!o.out_path && !def) return fputs("dsc: out of memory\n", stderr), CLI_EXIT_INTERNAL;
  if (!o.out_path) o.out_path = def;

  dsc_context *ctx = dsc_context_new(NULL, NULL);
  if (!ctx) {
    free(def);
    return fputs("dsc: out of memory\n", stderr), CLI_EXIT_INTERNAL;
  }
  cli_catch_signals(ctx); /* Ctrl-C stops compiling (exit 130), nothing written */
  cli_show_progress(ctx);
  dsc_compile_summary sum;
  dsc_status st = dsc_program_compile(ctx, &o, &sum);
  dsc_diag_print(ctx, stderr);
  if (st == DSC_OK)
    printf("wrote %s: %d graphs, %d kernels for %s, %.1f KiB\n", o.out_path, sum.graphs,
           sum.kernels, o.target ? o.target : "cpu", (double)sum.bytes / 1024);
  dsc_context_free(ctx);
  free(def);
  return cli_exit_code(st);
}
