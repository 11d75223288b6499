/* dsc sample: generate byte tokens from a trained checkpoint. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tools/cli.h"

static const char sample_help[] =
    "usage: dsc sample DIR --tokens N [--temperature X] [--top-k K] [--seed S]\n"
    "                  [--prompt TEXT] [--model FILE]\n"
    "\n"
    "Loads the checkpoint DIR (a step directory, or an output directory: its\n"
    "'latest'), recompiles the model file recorded in it (or --model FILE) for one\n"
    "sequence of the model's context length, and generates N byte tokens, written\n"
    "to standard output as they come (bytes as they are: a byte-level model).\n"
    "The window holds the last T tokens, the prompt's bytes first (a newline when\n"
    "there is no prompt); the prompt is printed first, then what follows it.\n"
    "  --temperature X   softmax temperature (default 1.0; 0 = greedy)\n"
    "  --top-k K         sample among the K most likely tokens (default: all; 1 = greedy)\n"
    "  --seed S          seed of the sampling generator (default 0): same seed, same text\n";

int cli_sample(int argc, char **argv) {
  dsc_sampler_options o = {NULL, NULL, 0};
  int64_t n_tokens = -1, top_k = 0, seed = 0;
  double temperature = 1.0;
  const char *prompt = NULL;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    bool has_val = i + 1 < argc;
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      fputs(sample_help, stdout);
      return CLI_EXIT_OK;
    } else if (strcmp(a, "--tokens") == 0) {
      if (!has_val || !cli_parse_i64(argv[++i], &n_tokens) || n_tokens < 0)
        return cli_usage_error("sample", "--tokens needs a non-negative integer"), CLI_EXIT_USER;
    } else if (strcmp(a, "--top-k") == 0) {
      if (!has_val || !cli_parse_i64(argv[++i], &top_k) || top_k < 1)
        return cli_usage_error("sample", "--top-k needs a positive integer"), CLI_EXIT_USER;
    } else if (strcmp(a, "--seed") == 0) {
      if (!has_val || !cli_parse_i64(argv[++i], &seed) || seed < 0)
        return cli_usage_error("sample", "--seed needs a non-negative integer"), CLI_EXIT_USER;
    } else if (strcmp(a, "--temperature") == 0) {
      const char *s = has_val ? argv[++i] : "";
      char *end = NULL;
      errno = 0;
      temperature = strtod(s, &end);
      if (!*s || *end || errno || !(temperature >= 0) || !isfinite(temperature))
        return cli_usage_error("sample", "--temperature needs a number >= 0"), CLI_EXIT_USER;
    } else if (strcmp(a, "--prompt") == 0) {
      if (!has_val) return cli_usage_error("sample", "--prompt needs a value"), CLI_EXIT_USER;
      prompt = argv[++i];
    } else if (strcmp(a, "--model") == 0) {
      if (!has_val) return cli_usage_error("sample", "--model needs a file"), CLI_EXIT_USER;
      o.model_path = argv[++i];
    } else if (a[0] == '-' && a[1]) {
      return cli_usage_error("sample", "unknown option '%s'", a), CLI_EXIT_USER;
    } else if (o.checkpoint) {
      return cli_usage_error("sample", "one checkpoint at a time"), CLI_EXIT_USER;
    } else {
      o.checkpoint = a;
    }
  }
  if (!o.checkpoint) return cli_usage_error("sample", "missing checkpoint DIR"), CLI_EXIT_USER;
  if (n_tokens < 0) return cli_usage_error("sample", "missing --tokens N"), CLI_EXIT_USER;
  o.seed = (uint64_t)seed;

  dsc_context *ctx = dsc_context_new(NULL, NULL);
  if (!ctx) return fputs("dsc: out of memory\n", stderr), CLI_EXIT_INTERNAL;
  cli_show_progress(ctx);
  dsc_sampler *s = NULL;
  dsc_status st = dsc_sampler_open(ctx, &o, &s);
  if (st == DSC_OK) {
    if (prompt && *prompt) {
      fputs(prompt, stdout); /* the text continues the prompt, so show both */
      for (const unsigned char *p = (const unsigned char *)prompt; st == DSC_OK && *p; p++)
        st = dsc_sampler_push(s, *p);
    } else
      st = dsc_sampler_push(s, '\n');
  }
  for (int64_t k = 0; st == DSC_OK && k < n_tokens; k++) {
    int64_t tok;
    st = dsc_sampler_next(s, temperature, top_k, &tok);
    if (st != DSC_OK) break;
    if (tok > 255) { /* a vocabulary above bytes: print the id */
      printf("<%" PRId64 ">", tok);
    } else {
      putchar((int)tok);
    }
    if (fflush(stdout) != 0) { /* stop at once: nobody reads the rest */
      fprintf(stderr, "dsc: error: cannot write the standard output: %s\n", strerror(errno));
      st = DSC_ERR_USER;
      break;
    }
    st = dsc_sampler_push(s, tok);
  }
  if (st == DSC_OK && n_tokens > 0 && isatty(STDOUT_FILENO)) putchar('\n'); /* tidy prompt */
  dsc_diag_print(ctx, stderr);
  dsc_sampler_free(s);
  dsc_context_free(ctx);
  return cli_exit_code(st);
}
