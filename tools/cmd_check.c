/* dsc check: diagnostics only. */
#include <string.h>

#include "tools/cli.h"

static const char check_help[] =
    "usage: dsc check FILE.dsm [--batch B] [--seq T] [--dim NAME=V]\n"
    "\n"
    "Parses and checks a model file (names, types, shapes, train settings) and\n"
    "prints its diagnostics as file:line:col: error: message. Prints nothing and\n"
    "exits 0 when the model is correct. Symbolic dims B and T default to the\n"
    "train section's batch and seq.\n";

int cli_check(int argc, char **argv) {
  const char *path = NULL;
  cli_dims dims = {0};
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      fputs(check_help, stdout);
      return CLI_EXIT_OK;
    }
    int r = cli_parse_dim_flag("check", argc, argv, &i, &dims);
    if (r < 0) return CLI_EXIT_USER;
    if (r > 0) continue;
    if (argv[i][0] == '-' && argv[i][1]) return cli_usage_error("check", "unknown option '%s'", argv[i]), CLI_EXIT_USER;
    if (path) return cli_usage_error("check", "one model file at a time"), CLI_EXIT_USER;
    path = argv[i];
  }
  if (!path) return cli_usage_error("check", "missing model file"), CLI_EXIT_USER;
  dsc_context *ctx = dsc_context_new(NULL, NULL);
  if (!ctx) return fputs("dsc: out of memory\n", stderr), CLI_EXIT_INTERNAL;
  dsc_module *m = NULL;
  dsc_status st = cli_load_module(ctx, path, &dims, &m);
  dsc_diag_print(ctx, stderr);
  dsc_module_free(m);
  dsc_context_free(ctx);
  return cli_exit_code(st);
}
