/* dsc data: a text file -> train/val token shards (byte-level tokens). */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tools/cli.h"

static const char data_help[] =
    "usage: dsc data TEXTFILE -o PREFIX [--val-fraction F]\n"
    "\n"
    "Tokenizes a text file at the byte level (token = byte value, vocabulary 256)\n"
    "and writes two token shards in llm.c's format: PREFIX_train.bin and\n"
    "PREFIX_val.bin. The last F of the bytes (default 0.1, 0 < F < 1) go to the\n"
    "validation shard. Prints the token count of each shard. TEXTFILE must be a\n"
    "regular file (a FIFO is refused, never waited on); each shard is written\n"
    "atomically, or straight into a character device or FIFO of that name.\n";

int cli_data(int argc, char **argv) {
  const char *path = NULL, *prefix = NULL;
  double frac = 0.1;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      fputs(data_help, stdout);
      return CLI_EXIT_OK;
    }
    if (strcmp(a, "-o") == 0 || strcmp(a, "--output") == 0) {
      if (i + 1 >= argc) return cli_usage_error("data", "%s needs a value", a), CLI_EXIT_USER;
      prefix = argv[++i];
      continue;
    }
    if (strcmp(a, "--val-fraction") == 0) {
      if (i + 1 >= argc) return cli_usage_error("data", "%s needs a value", a), CLI_EXIT_USER;
      const char *v = argv[++i];
      char *end;
      errno = 0;
      frac = strtod(v, &end);
      if (!*v || *end || errno || !(frac > 0 && frac < 1))
        return cli_usage_error("data", "--val-fraction: '%s' is not a number in (0, 1)", v),
               CLI_EXIT_USER;
      continue;
    }
    if (a[0] == '-' && a[1])
      return cli_usage_error("data", "unknown option '%s'", a), CLI_EXIT_USER;
    if (path) return cli_usage_error("data", "one text file at a time"), CLI_EXIT_USER;
    path = a;
  }
  if (!path) return cli_usage_error("data", "missing text file"), CLI_EXIT_USER;
  if (!prefix || !*prefix) return cli_usage_error("data", "missing -o PREFIX"), CLI_EXIT_USER;

  size_t len;
  char *text = cli_read_file(path, &len);
  if (!text) return CLI_EXIT_USER;
  int64_t n_val = (int64_t)floor((double)len * frac), n_train = (int64_t)len - n_val;
  if (n_val < 1 || n_train < 1) {
    fprintf(stderr,
            "%s: error: too short to split: %zu bytes give %lld training and %lld validation "
            "tokens (each needs at least one)\n",
            path, len, (long long)n_train, (long long)n_val);
    free(text);
    return CLI_EXIT_USER;
  }
  if ((int64_t)len > INT32_MAX) {
    fprintf(stderr, "%s: error: %zu bytes is more than one shard holds (%d tokens)\n", path, len,
            INT32_MAX);
    free(text);
    return CLI_EXIT_USER;
  }
  uint16_t *tokens = malloc(len * sizeof *tokens);
  size_t plen = strlen(prefix) + 16;
  char *out_train = malloc(plen), *out_val = malloc(plen);
  dsc_context *ctx = dsc_context_new(NULL, NULL);
  if (!tokens || !out_train || !out_val || !ctx) {
    fputs("dsc: out of memory\n", stderr);
    free(text), free(tokens), free(out_train), free(out_val), dsc_context_free(ctx);
    return CLI_EXIT_INTERNAL;
  }
  for (size_t i = 0; i < len; i++) tokens[i] = (unsigned char)text[i];
  snprintf(out_train, plen, "%s_train.bin", prefix);
  snprintf(out_val, plen, "%s_val.bin", prefix);
  dsc_status st = dsc_shard_write(ctx, out_train, tokens, n_train);
  if (st == DSC_OK) st = dsc_shard_write(ctx, out_val, tokens + n_train, n_val);
  dsc_diag_print(ctx, stderr);
  if (st == DSC_OK) {
    printf("%s: %lld tokens (train)\n", out_train, (long long)n_train);
    printf("%s: %lld tokens (val)\n", out_val, (long long)n_val);
    printf("vocabulary: 256 (byte-level)\n");
  }
  free(text), free(tokens), free(out_train), free(out_val);
  dsc_context_free(ctx);
  return cli_exit_code(st);
}
