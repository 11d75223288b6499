/* dsc generate (alias dsc sample): generate tokens from a trained
 * checkpoint (bytes, or the run's tokenizer) through the KV-cache engine
 * (include/dsc/infer.h). */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tools/cli.h"

static const char generate_help[] =
    "usage: dsc generate DIR --tokens N [--temperature X] [--top-k K] [--top-p P] [--seed S]\n"
    "                    [--prompt TEXT] [--model FILE] [--tokenizer FILE]\n"
    "                    [--backend interp|cpu|cuda] [--threads N] [--chunk C] [--context N]\n"
    "                    [--stats] [--profile]\n"
    "       dsc sample ...   (the same)\n"
    "\n"
    "Loads the checkpoint DIR (a step directory, or an output directory: its\n"
    "'latest'), compiles the model file recorded in it (or --model FILE) into two\n"
    "inference graphs with a KV cache (docs/inference.md): one runs the prompt C\n"
    "tokens at a time, the other one token per step, each reading the keys and\n"
    "values of the tokens before it from the cache. Generates N tokens, written to\n"
    "standard output as they come; the prompt is printed first (a newline when\n"
    "there is none). The cache holds the model's context (its position table, else\n"
    "the trained sequence length); when the text fills it, the newer half is run\n"
    "again from position 0. Tokens are bytes, unless the run has a tokenizer.json\n"
    "(dsc train copies the one of dsc data --tokenizer or of --init-from) or\n"
    "--tokenizer FILE names one: then the prompt is encoded and the text decoded\n"
    "with it, as the tokenizers library does.\n"
    "  --temperature X   softmax temperature (default 1.0; 0 = greedy)\n"
    "  --top-k K         sample among the K most likely tokens (default: all; 1 = greedy)\n"
    "  --top-p P         then among the fewest most likely whose probabilities reach P\n"
    "                    (0 < P <= 1; default 1: all)\n"
    "  --seed S          seed of the sampling generator (default 0): same seed, same text\n"
    "  --backend B       interp, cpu or cuda (default: cpu where built, else interp)\n"
    "  --threads N       cpu worker threads (default: one per core)\n"
    "  --chunk C         prompt tokens per step (default 16)\n"
    "  --context N       positions the cache holds (default: the model's position table,\n"
    "                    else the trained sequence length; at most the table)\n"
    "  --stats           print the prompt's and the generation's time to standard error\n"
    "  --profile         then the one-token steps' slowest instructions (compiled backends)\n";

static dsc_status flush_stdout(void) {
  if (fflush(stdout) == 0) return DSC_OK;
  /* stop at once: nobody reads the rest */
  fprintf(stderr, "dsc: error: cannot write the standard output: %s\n", strerror(errno));
  return DSC_ERR_USER;
}

/* With a tokenizer: the prompt's ids (the template's special tokens first)
 * go in; after each new id the whole text is decoded again and what is new
 * beyond the prompt is printed, held back while it ends in an incomplete
 * character (decoders work on whole texts: a space or a byte sequence may
 * only resolve with the next token). */
static dsc_status sample_tokenized(dsc_sampler *s, dsc_tokenizer *tok, const char *prompt,
                                   int64_t n_tokens, const dsc_sampling *how) {
  const char *p = prompt && *prompt ? prompt : "";
  uint32_t *ids = NULL, *grown;
  int64_t n = 0;
  dsc_status st = dsc_tokenizer_encode(tok, p, strlen(p), true, &ids, &n);
  if (st == DSC_OK && n == 0) { /* no prompt, no template tokens: a newline */
    free(ids);
    st = dsc_tokenizer_encode(tok, "\n", 1, true, &ids, &n);
  }
  char *text = NULL;
  size_t len = 0, printed = 0;
  if (st == DSC_OK) st = dsc_tokenizer_decode(tok, ids, n, true, &text, &len);
  if (st == DSC_OK) {
    fputs(p, stdout);
    printed = len; /* the prompt shows as the user wrote it */
  }
  for (int64_t i = 0; st == DSC_OK && i < n; i++) st = dsc_sampler_push(s, ids[i]);
  for (int64_t k = 0; st == DSC_OK && k < n_tokens; k++) {
    int64_t id;
    if ((st = dsc_sampler_next(s, how, &id)) != DSC_OK) break;
    if (!(grown = realloc(ids, (size_t)(n + 1) * sizeof *ids))) {
      fputs("dsc: out of memory\n", stderr);
      st = DSC_ERR_INTERNAL;
      break;
    }
    ids = grown;
    ids[n++] = (uint32_t)id;
    free(text);
    text = NULL;
    if ((st = dsc_tokenizer_decode(tok, ids, n, true, &text, &len)) != DSC_OK) break;
    bool last = k + 1 == n_tokens;
    bool pending = len >= 3 && memcmp(text + len - 3, "\xef\xbf\xbd", 3) == 0;
    if (len > printed && (last || !pending)) {
      fwrite(text + printed, 1, len - printed, stdout);
      printed = len;
      if ((st = flush_stdout()) != DSC_OK) break;
    }
    st = dsc_sampler_push(s, id);
  }
  free(text);
  free(ids);
  return st;
}

const char *cli_run_tokenizer(const char *checkpoint, char *buf, size_t n) {
  snprintf(buf, n, "%s/tokenizer.json", checkpoint);
  if (access(buf, F_OK) != 0) snprintf(buf, n, "%s/../tokenizer.json", checkpoint);
  return access(buf, F_OK) == 0 ? buf : NULL;
}

int cli_generate(int argc, char **argv) {
  dsc_sampler_options o = {NULL, NULL, 0, NULL, 0, 0};
  dsc_exec_options xo = {dsc_backend_default(), 0, NULL};
  int64_t threads = 0, chunk = 0, context = 0;
  bool stats = false, profile = false;
  int64_t n_tokens = -1, seed = 0;
  dsc_sampling how = {1.0, 0, 1.0};
  const char *prompt = NULL, *tok_path = NULL;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    bool has_val = i + 1 < argc;
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      fputs(generate_help, stdout);
      return CLI_EXIT_OK;
    } else if (strcmp(a, "--tokens") == 0) {
      if (!has_val || !cli_parse_i64(argv[++i], &n_tokens) || n_tokens < 0)
        return cli_usage_error("generate", "--tokens needs a non-negative integer"), CLI_EXIT_USER;
    } else if (strcmp(a, "--top-k") == 0) {
      if (!has_val || !cli_parse_i64(argv[++i], &how.top_k) || how.top_k < 1)
        return cli_usage_error("generate", "--top-k needs a positive integer"), CLI_EXIT_USER;
    } else if (strcmp(a, "--top-p") == 0) {
      if (!has_val || !cli_parse_positive(argv[++i], &how.top_p) || how.top_p > 1)
        return cli_usage_error("generate", "--top-p needs a number in (0, 1]"), CLI_EXIT_USER;
    } else if (strcmp(a, "--seed") == 0) {
      if (!has_val || !cli_parse_i64(argv[++i], &seed) || seed < 0)
        return cli_usage_error("generate", "--seed needs a non-negative integer"), CLI_EXIT_USER;
    } else if (strcmp(a, "--temperature") == 0) {
      const char *s = has_val ? argv[++i] : "";
      char *end = NULL;
      errno = 0;
      how.temperature = strtod(s, &end);
      if (!*s || *end || errno || !(how.temperature >= 0) || !isfinite(how.temperature))
        return cli_usage_error("generate", "--temperature needs a number >= 0"), CLI_EXIT_USER;
    } else if (strcmp(a, "--prompt") == 0) {
      if (!has_val) return cli_usage_error("generate", "--prompt needs a value"), CLI_EXIT_USER;
      prompt = argv[++i];
    } else if (strcmp(a, "--tokenizer") == 0) {
      if (!has_val) return cli_usage_error("generate", "--tokenizer needs a file"), CLI_EXIT_USER;
      tok_path = argv[++i];
    } else if (strcmp(a, "--backend") == 0) {
      if (!has_val || dsc_backend_from_name(argv[++i], &xo.backend) != 0)
        return cli_usage_error("generate", "--backend needs one of interp, cpu, cuda"),
               CLI_EXIT_USER;
    } else if (strcmp(a, "--threads") == 0) {
      if (!has_val || !cli_parse_i64(argv[++i], &threads) || threads < 1 || threads > 1024)
        return cli_usage_error("generate", "--threads needs a positive integer"), CLI_EXIT_USER;
    } else if (strcmp(a, "--chunk") == 0) {
      if (!has_val || !cli_parse_i64(argv[++i], &chunk) || chunk < 1 || chunk > 4096)
        return cli_usage_error("generate", "--chunk needs an integer in 1..4096"), CLI_EXIT_USER;
    } else if (strcmp(a, "--context") == 0) {
      if (!has_val || !cli_parse_i64(argv[++i], &context) || context < 1 || context > (1 << 24))
        return cli_usage_error("generate", "--context needs a positive integer"), CLI_EXIT_USER;
    } else if (strcmp(a, "--stats") == 0) {
      stats = true;
    } else if (strcmp(a, "--profile") == 0) {
      profile = true;
    } else if (strcmp(a, "--model") == 0) {
      if (!has_val) return cli_usage_error("generate", "--model needs a file"), CLI_EXIT_USER;
      o.model_path = argv[++i];
    } else if (a[0] == '-' && a[1]) {
      return cli_usage_error("generate", "unknown option '%s'", a), CLI_EXIT_USER;
    } else if (o.checkpoint) {
      return cli_usage_error("generate", "one checkpoint at a time"), CLI_EXIT_USER;
    } else {
      o.checkpoint = a;
    }
  }
  if (!o.checkpoint) return cli_usage_error("generate", "missing checkpoint DIR"), CLI_EXIT_USER;
  if (n_tokens < 0) return cli_usage_error("generate", "missing --tokens N"), CLI_EXIT_USER;
  o.seed = (uint64_t)seed;
  xo.threads = (int)threads;
  o.exec = &xo;
  o.chunk = chunk;
  o.context = context;

  dsc_context *ctx = dsc_context_new(NULL, NULL);
  if (!ctx) return fputs("dsc: out of memory\n", stderr), CLI_EXIT_INTERNAL;
  cli_show_progress(ctx);
  dsc_tokenizer *tok = NULL;
  dsc_status st = DSC_OK;
  char found[4096];
  if (!tok_path) tok_path = cli_run_tokenizer(o.checkpoint, found, sizeof found);
  if (tok_path) st = dsc_tokenizer_load(ctx, tok_path, &tok);
  dsc_sampler *s = NULL;
  if (st == DSC_OK) st = dsc_sampler_open(ctx, &o, &s);
  dsc_exec *x = s ? dsc_sampler_exec(s) : NULL;
  if (st == DSC_OK && profile) {
    if (dsc_exec_has_profile(x))
      dsc_exec_set_profiling(x, true);
    else
      fputs("dsc generate: --profile: this backend times no instructions\n", stderr);
  }
  if (st == DSC_OK && tok) {
    st = sample_tokenized(s, tok, prompt, n_tokens, &how);
  } else if (st == DSC_OK) {
    if (prompt && *prompt) {
      fputs(prompt, stdout); /* the text continues the prompt, so show both */
      for (const unsigned char *p = (const unsigned char *)prompt; st == DSC_OK && *p; p++)
        st = dsc_sampler_push(s, *p);
    } else
      st = dsc_sampler_push(s, '\n');
    for (int64_t k = 0; st == DSC_OK && k < n_tokens; k++) {
      int64_t id;
      st = dsc_sampler_next(s, &how, &id);
      if (st != DSC_OK) break;
      if (id > 255) { /* a vocabulary above bytes, no tokenizer: print the id */
        printf("<%" PRId64 ">", id);
      } else {
        putchar((int)id);
      }
      if ((st = flush_stdout()) != DSC_OK) break;
      st = dsc_sampler_push(s, id);
    }
  }
  if (st == DSC_OK && n_tokens > 0 && isatty(STDOUT_FILENO)) putchar('\n'); /* tidy prompt */
  if (st == DSC_OK && stats) {
    double ps, ds;
    int64_t pn, dn;
    dsc_sampler_times(s, &ps, &pn, &ds, &dn);
    fflush(stdout);
    fprintf(stderr,
            "generate: %" PRId64 " prompt steps in %.3f s, %" PRId64
            " one-token steps in %.3f s "
            "(%.1f tokens/s)\n",
            pn, ps, dn, ds, ds > 0 ? (double)dn / ds : 0.0);
  }
  if (st == DSC_OK && profile && dsc_exec_has_profile(x)) {
    fflush(stdout);
    st = dsc_exec_print_profile(x, dsc_sampler_one_token_graph(s), 20, stderr);
  }
  dsc_diag_print(ctx, stderr);
  dsc_sampler_free(s);
  dsc_tokenizer_free(tok);
  dsc_context_free(ctx);
  return cli_exit_code(st);
}
