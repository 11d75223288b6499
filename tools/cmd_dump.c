/* dsc dump: the text IR (or DOT) of a model file or a .dsir file. */
#include <string.h>

#include "tools/cli.h"

static const char dump_help[] =
    "usage: dsc dump FILE [--dot] [-o OUT] [--batch B] [--seq T] [--dim NAME=V]\n"
    "\n"
    "Prints the IR of FILE: a model file (.dsm) is compiled first; a text IR file\n"
    "(.dsir) is parsed, verified and printed again (the text form round-trips\n"
    "byte for byte). --dot prints Graphviz DOT instead (dsc dump m.dsm --dot | dot -Tsvg).\n"
    "-o writes to OUT instead of standard output.\n";

int cli_dump(int argc, char **argv) {
  const char *path = NULL, *out_path = NULL;
  bool dot = false;
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
      st = dot ? dsc_module_print_dot(m, out) : dsc_module_print(m, out);
      if (fflush(out) != 0 || ferror(out)) {
        fprintf(stderr, "dsc dump: error writing %s\n", out_path ? out_path : "standard output");
        st = DSC_ERR_USER;
      }
      if (out_path && fclose(out) != 0 && st == DSC_OK) st = DSC_ERR_USER;
    }
  }
  dsc_diag_print(ctx, stderr);
  dsc_module_free(m);
  dsc_context_free(ctx);
  return cli_exit_code(st);
}
