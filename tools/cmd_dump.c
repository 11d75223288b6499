/* dsc dump: the text IR (or DOT) of a model file or a .dsir file. */
#include <errno.h>
#include <string.h>

#include "tools/cli.h"

static const char dump_help[] =
    "usage: dsc dump FILE [--dot] [-o OUT] [--batch B] [--seq T] [--dim NAME=V]\n"
    "                [--after PASS | --print-after-all] [--grad-accum K] [--verify]\n"
    "                [--precision f32|bf16|fp16] [--master-weights true|false]\n"
    "                [--world N] [--zero-stage S]\n"
    "                [--bucket-bytes N] [--prefetch-bytes N] [--persist-threshold N]\n"
    "                [--unshard-bytes N] [--checkpoint-activations none|selective|offload]\n"
    "                [--offload-optimizer none|host|disk] [--offload-param none|host|disk]\n"
    "                [--offload-prefetch-bytes N] [--offload-io-threads N]\n"
    "       dsc dump --list-passes\n"
    "\n"
    "Prints the IR of FILE: a model file (.dsm) is compiled first; a text IR file\n"
    "(.dsir) is parsed, verified and printed again (the text form round-trips\n"
    "byte for byte). --dot prints Graphviz DOT instead (dsc dump m.dsm --dot | dot -Tsvg).\n"
    "-o writes to OUT instead of standard output.\n"
    "\n"
    "--after PASS runs the training pipeline up to PASS and prints the IR then\n"
    "(--after optimizer: the whole training step); --print-after-all prints it\n"
    "after every pass. The train settings come from the model's train section;\n"
    "--grad-accum overrides its grad_accum, --precision its precision (mixed\n"
    "precision: bf16 or fp16 params, gradients and compute with f32 master weights;\n"
    "--master-weights false: f32 params and gradients, bf16 or fp16 compute). --world and\n"
    "--zero-stage give one rank's program of N ranks at that ZeRO stage (see\n"
    "dsc train --help for the other four). --verify checks the\n"
    "IR after each pass. --list-passes lists the passes in pipeline order.\n";

/* Runs the pipeline as the flags ask; the train settings come from the
 * model's train section, with --batch/--seq/--grad-accum on top. */
static dsc_status run_passes(dsc_module *m, const cli_dims *dims, int64_t grad_accum,
                             const char *precision, int64_t world, const dsc_run_knobs *knobs,
                             const char *after, bool print_all, bool verify, FILE *out) {
  dsc_train_config cfg;
  dsc_status st = dsc_train_config_from_module(m, &cfg);
  if (st != DSC_OK) return st;
  for (int k = 0; k < dims->n; k++) {
    if (strcmp(dims->names[k], "B") == 0) cfg.batch = dims->dims[k].value;
    if (strcmp(dims->names[k], "T") == 0) cfg.seq = dims->dims[k].value;
  }
  if (grad_accum > 0) cfg.grad_accum = grad_accum;
  if (precision) dsc_precision_from_name(precision, &cfg.precision); /* checked by the caller */
  if (world > 0) cfg.world = world;
  /* the run knobs (checked by the settings table as they were parsed) */
  if ((st = dsc_run_knobs_apply(dsc_module_context(m), "dump", knobs, &cfg)) != DSC_OK) return st;
  dsc_pipeline_options po = {&cfg, after, print_all, out, verify};
  return dsc_run_pipeline(m, &po);
}

int cli_dump(int argc, char **argv) {
  const char *path = NULL, *out_path = NULL;
  const char *after = NULL, *precision = NULL;
  dsc_precision prec;
  bool dot = false, print_all = false, verify = false;
  int64_t grad_accum = 0;
  int64_t world = -1; /* -1: the model's */
  dsc_run_knobs knobs;
  memset(&knobs, 0, sizeof knobs);
  cli_dims dims = {0};
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      fputs(dump_help, stdout);
      return CLI_EXIT_OK;
    }
    int r = cli_parse_dim_flag("dump", argc, argv, &i, &dims);
    if (r < 0) return CLI_EXIT_USER;
    if (r > 0) continue;
    if (strcmp(argv[i], "--dot") == 0) {
      dot = true;
    } else if (strcmp(argv[i], "--list-passes") == 0) {
      for (int k = 0; k < dsc_pass_count(); k++)
        printf("%-10s %s\n", dsc_pass_name(k), dsc_pass_description(k));
      return CLI_EXIT_OK;
    } else if (strcmp(argv[i], "--after") == 0) {
      if (i + 1 >= argc) return cli_usage_error("dump", "--after needs a pass name"), CLI_EXIT_USER;
      after = argv[++i];
    } else if (strcmp(argv[i], "--print-after-all") == 0) {
      print_all = true;
    } else if (strcmp(argv[i], "--verify") == 0) {
      verify = true;
    } else if (strcmp(argv[i], "--grad-accum") == 0) {
      if (i + 1 >= argc || !cli_parse_i64(argv[i + 1], &grad_accum) || grad_accum <= 0 ||
          grad_accum > (1 << 20))
        return cli_usage_error("dump", "--grad-accum: '%s' is not a positive integer",
                               i + 1 < argc ? argv[i + 1] : ""),
               CLI_EXIT_USER;
      i++;
    } else if (strcmp(argv[i], "--precision") == 0) {
      if (i + 1 >= argc || dsc_precision_from_name(argv[i + 1], &prec) != 0)
        return cli_usage_error("dump", "--precision: '%s' is not one of f32, bf16, fp16",
                               i + 1 < argc ? argv[i + 1] : ""),
               CLI_EXIT_USER;
      precision = argv[++i];
    } else if ((r = cli_knob_flag("dump", argc, argv, &i, &knobs)) != 0) {
      if (r < 0) return CLI_EXIT_USER;
    } else if (strcmp(argv[i], "--world") == 0) {
      int64_t v = -1;
      if (i + 1 >= argc || !cli_parse_i64(argv[i + 1], &v) || v < 1 || v > (1 << 20))
        return cli_usage_error("dump", "%s: '%s' is out of range", argv[i],
                               i + 1 < argc ? argv[i + 1] : ""),
               CLI_EXIT_USER;
      world = v;
      i++;
    } else if (strcmp(argv[i], "-o") == 0) {
      if (i + 1 >= argc) return cli_usage_error("dump", "-o needs a file"), CLI_EXIT_USER;
      out_path = argv[++i];
    } else if (argv[i][0] == '-' && argv[i][1]) {
      return cli_usage_error("dump", "unknown option '%s'", argv[i]), CLI_EXIT_USER;
    } else if (path) {
      return cli_usage_error("dump", "one file at a time"), CLI_EXIT_USER;
    } else {
      path = argv[i];
    }
  }
  if (!path) return cli_usage_error("dump", "missing file"), CLI_EXIT_USER;
  if (after && print_all)
    return cli_usage_error("dump", "--after and --print-after-all exclude each other"),
           CLI_EXIT_USER;
  if (dot && print_all)
    return cli_usage_error("dump", "--dot and --print-after-all exclude each other"), CLI_EXIT_USER;
  dsc_context *ctx = dsc_context_new(NULL, NULL);
  if (!ctx) return fputs("dsc: out of memory\n", stderr), CLI_EXIT_INTERNAL;
  dsc_module *m = NULL;
  dsc_status st = cli_load_module(ctx, path, &dims, &m);
  if (st == DSC_OK) {
    FILE *out = out_path ? fopen(out_path, "w") : stdout;
    if (!out) {
      perror(out_path);
      st = DSC_ERR_USER;
    } else {
      if (after || print_all || verify)
        st = run_passes(m, &dims, grad_accum, precision, world, &knobs, after, print_all, verify,
                        out);
      if (st == DSC_OK && !print_all)
        st = dot ? dsc_module_print_dot(m, out) : dsc_module_print(m, out);
      if (fflush(out) != 0 || ferror(out)) {
        fprintf(stderr, "dsc dump: error writing %s: %s\n", out_path ? out_path : "standard output",
                strerror(errno));
        st = DSC_ERR_USER;
      }
      if (out_path && fclose(out) != 0 && st == DSC_OK) {
        fprintf(stderr, "dsc dump: error writing %s: %s\n", out_path, strerror(errno));
        st = DSC_ERR_USER;
      }
    }
  }
  dsc_diag_print(ctx, stderr);
  dsc_module_free(m);
  dsc_context_free(ctx);
  return cli_exit_code(st);
}
