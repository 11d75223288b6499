/* dsc import --list: how a Hugging Face model directory maps onto a model. */
#include <string.h>

#include "tools/cli.h"

static const char import_help[] =
    "usage: dsc import --list DIR MODEL.dsm [--dim NAME=V]\n"
    "\n"
    "Reads DIR, a Hugging Face model directory (config.json, and\n"
    "model.safetensors or model.safetensors.index.json with its shards), checks\n"
    "config.json against the model's ops (heads, key/value heads, rope_theta, the\n"
    "norms' eps) and prints, a line per tensor, its name, type and file and the\n"
    "param of MODEL.dsm it becomes ('as is', 'transposed': transformers stores a\n"
    "Linear weight [out, in], dsc [in, out]). Every tensor must map to a param\n"
    "and every param must be found, with its shape; the first that does not is\n"
    "an error naming the file, the tensor and both shapes. Nothing is loaded;\n"
    "'dsc train MODEL.dsm --init-from DIR' loads the weights (docs/models.md).\n";

int cli_import(int argc, char **argv) {
  const char *dir = NULL, *model = NULL;
  bool list = false;
  cli_dims dims = {0};
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      fputs(import_help, stdout);
      return CLI_EXIT_OK;
    }
    if (strcmp(argv[i], "--list") == 0) {
      list = true;
      continue;
    }
    int r = cli_parse_dim_flag("import", argc, argv, &i, &dims);
    if (r < 0) return CLI_EXIT_USER;
    if (r > 0) continue;
    if (argv[i][0] == '-' && argv[i][1])
      return cli_usage_error("import", "unknown option '%s'", argv[i]), CLI_EXIT_USER;
    if (!dir)
      dir = argv[i];
    else if (!model)
      model = argv[i];
    else
      return cli_usage_error("import", "one directory and one model file"), CLI_EXIT_USER;
  }
  if (!list)
    return cli_usage_error("import",
                           "--list is the only action (training imports with "
                           "'dsc train MODEL.dsm --init-from DIR')"),
           CLI_EXIT_USER;
  if (!dir || !model)
    return cli_usage_error("import", "needs a model directory and a model file"), CLI_EXIT_USER;
  dsc_context *ctx = dsc_context_new(NULL, NULL);
  if (!ctx) return fputs("dsc: out of memory\n", stderr), CLI_EXIT_INTERNAL;
  dsc_module *m = NULL;
  dsc_status st = cli_load_module(ctx, model, &dims, &m);
  if (st == DSC_OK) st = dsc_hf_check_config(ctx, dir, m);
  if (st == DSC_OK) st = dsc_hf_list(ctx, dir, m, stdout);
  dsc_diag_print(ctx, stderr);
  dsc_module_free(m);
  dsc_context_free(ctx);
  return cli_exit_code(st);
}
