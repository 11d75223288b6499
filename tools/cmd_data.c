/* dsc data: a text file -> train/val token shards (bytes, or the ids of a
 * Hugging Face tokenizer.json). */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tools/cli.h"

static const char data_help[] =
    "usage: dsc data TEXTFILE -o PREFIX [--val-fraction F] [--tokenizer FILE]\n"
    "\n"
    "Tokenizes a text file at the byte level (token = byte value, vocabulary 256)\n"
    "and writes two token shards in llm.c's format: PREFIX_train.bin and\n"
    "PREFIX_val.bin. The last F of the tokens (default 0.1, 0 < F < 1) go to the\n"
    "validation shard. Prints the token count of each shard. TEXTFILE must be a\n"
    "regular file (a FIFO is refused, never waited on); each shard is written\n"
    "atomically, or straight into a character device or FIFO of that name.\n"
    "  --tokenizer FILE  a Hugging Face tokenizer.json (BPE: GPT-2, Llama, Mistral,\n"
    "                    Qwen style): the file is encoded as the tokenizers\n"
    "                    library's encode(text) does, special tokens included;\n"
    "                    vocabularies over 65,536 get llm.c's 32-bit shards. The\n"
    "                    tokenizer is copied to PREFIX_tokenizer.json, and from\n"
    "                    there into a run's directory by dsc train (dsc sample\n"
    "                    decodes with it).\n"
    "\n"
    "usage: dsc data --decode SHARD [--tokenizer FILE]\n"
    "\n"
    "Prints the text of a token shard: its ids decoded with the tokenizer (special\n"
    "tokens shown), or as bytes without one.\n";

/* dsc data --decode: a shard back to text on standard output. */
static int decode_shard(const char *path, const char *tok_path) {
  dsc_context *ctx = dsc_context_new(NULL, NULL);
  if (!ctx) return fputs("dsc: out of memory\n", stderr), CLI_EXIT_INTERNAL;
  dsc_tokenizer *tok = NULL;
  uint32_t *ids = NULL;
  int64_t n = 0;
  char *text = NULL;
  size_t len = 0;
  dsc_status st = tok_path ? dsc_tokenizer_load(ctx, tok_path, &tok) : DSC_OK;
  if (st == DSC_OK) st = dsc_shard_read(ctx, path, tok ? dsc_tokenizer_vocab_size(tok) : 256, &ids, &n);
  if (st == DSC_OK && tok) {
    st = dsc_tokenizer_decode(tok, ids, n, false, &text, &len);
  } else if (st == DSC_OK) {
    len = (size_t)n;
    if (!(text = malloc(len + 1))) fputs("dsc: out of memory\n", stderr), st = DSC_ERR_INTERNAL;
    for (size_t i = 0; text && i < len; i++) text[i] = (char)ids[i];
  }
  if (st == DSC_OK && (fwrite(text, 1, len, stdout) != len || fflush(stdout) != 0)) {
    fprintf(stderr, "dsc: error: cannot write the standard output: %s\n", strerror(errno));
    st = DSC_ERR_USER;
  }
  dsc_diag_print(ctx, stderr);
  free(text);
  dsc_shard_free(ctx, ids, n);
  dsc_tokenizer_free(tok);
  dsc_context_free(ctx);
  return cli_exit_code(st);
}

int cli_data(int argc, char **argv) {
  const char *path = NULL, *prefix = NULL, *tok_path = NULL;
  bool decode = false;
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
    if (strcmp(a, "--decode") == 0) {
      decode = true;
      continue;
    }
    if (strcmp(a, "--tokenizer") == 0) {
      if (i + 1 >= argc) return cli_usage_error("data", "%s needs a file", a), CLI_EXIT_USER;
      tok_path = argv[++i];
      continue;
    }
    if (a[0] == '-' && a[1])
      return cli_usage_error("data", "unknown option '%s'", a), CLI_EXIT_USER;
    if (path) return cli_usage_error("data", "one text file at a time"), CLI_EXIT_USER;
    path = a;
  }
  if (decode) {
    if (!path) return cli_usage_error("data", "--decode needs a shard"), CLI_EXIT_USER;
    if (prefix) return cli_usage_error("data", "--decode prints to standard output (no -o)"), CLI_EXIT_USER;
    return decode_shard(path, tok_path);
  }
  if (!path) return cli_usage_error("data", "missing text file"), CLI_EXIT_USER;
  if (!prefix || !*prefix) return cli_usage_error("data", "missing -o PREFIX"), CLI_EXIT_USER;

  dsc_context *ctx = dsc_context_new(NULL, NULL);
  if (!ctx) return fputs("dsc: out of memory\n", stderr), CLI_EXIT_INTERNAL;
  dsc_tokenizer *tok = NULL;
  dsc_status st = tok_path ? dsc_tokenizer_load(ctx, tok_path, &tok) : DSC_OK;
  size_t len = 0;
  char *text = st == DSC_OK ? cli_read_file(path, &len) : NULL;
  if (!text) {
    dsc_diag_print(ctx, stderr);
    dsc_tokenizer_free(tok), dsc_context_free(ctx);
    return st == DSC_OK ? CLI_EXIT_USER : cli_exit_code(st);
  }
  uint32_t *ids = NULL;
  int64_t n = 0, vocab = 256;
  double secs = 0;
  if (tok) {
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    st = dsc_tokenizer_encode(tok, text, len, true, &ids, &n);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    vocab = dsc_tokenizer_vocab_size(tok);
    if (st != DSC_OK) {
      /* the tokenizer's diagnostic names the tokenizer; say which text */
      dsc_diag_print(ctx, stderr);
      fprintf(stderr, "%s: error: cannot encode this file with %s\n", path, tok_path);
      free(text), dsc_tokenizer_free(tok), dsc_context_free(ctx);
      return cli_exit_code(st);
    }
  } else if ((ids = malloc((len ? len : 1) * sizeof *ids))) {
    for (size_t i = 0; i < len; i++) ids[i] = (unsigned char)text[i];
    n = (int64_t)len;
  }
  free(text);
  int64_t n_val = (int64_t)floor((double)n * frac), n_train = n - n_val;
  int rc = CLI_EXIT_OK;
  if (!ids) {
    fputs("dsc: out of memory\n", stderr);
    rc = CLI_EXIT_INTERNAL;
  } else if (n_val < 1 || n_train < 1) {
    fprintf(stderr,
            "%s: error: too short to split: %lld tokens give %lld training and %lld validation "
            "tokens (each needs at least one)\n",
            path, (long long)n, (long long)n_train, (long long)n_val);
    rc = CLI_EXIT_USER;
  } else if (n > INT32_MAX) {
    fprintf(stderr, "%s: error: %lld tokens is more than one shard holds (%d tokens)\n", path,
            (long long)n, INT32_MAX);
    rc = CLI_EXIT_USER;
  }
  bool wide = vocab > 65536;
  uint16_t *narrow = NULL;
  if (rc == CLI_EXIT_OK && !wide) {
    narrow = malloc((size_t)n * sizeof *narrow);
    if (!narrow) fputs("dsc: out of memory\n", stderr), rc = CLI_EXIT_INTERNAL;
    for (int64_t i = 0; narrow && i < n; i++) narrow[i] = (uint16_t)ids[i];
  }
  size_t plen = strlen(prefix) + 32;
  char *out_train = malloc(plen), *out_val = malloc(plen), *out_tok = malloc(plen);
  if (rc == CLI_EXIT_OK && (!out_train || !out_val || !out_tok))
    fputs("dsc: out of memory\n", stderr), rc = CLI_EXIT_INTERNAL;
  if (rc == CLI_EXIT_OK) {
    snprintf(out_train, plen, "%s_train.bin", prefix);
    snprintf(out_val, plen, "%s_val.bin", prefix);
    snprintf(out_tok, plen, "%s_tokenizer.json", prefix);
    st = wide ? dsc_shard_write32(ctx, out_train, ids, n_train)
              : dsc_shard_write(ctx, out_train, narrow, n_train);
    if (st == DSC_OK)
      st = wide ? dsc_shard_write32(ctx, out_val, ids + n_train, n_val)
                : dsc_shard_write(ctx, out_val, narrow + n_train, n_val);
    if (st == DSC_OK && tok) st = dsc_file_copy(ctx, tok_path, out_tok);
    dsc_diag_print(ctx, stderr);
    if (st == DSC_OK) {
      printf("%s: %lld tokens (train)\n", out_train, (long long)n_train);
      printf("%s: %lld tokens (val)\n", out_val, (long long)n_val);
      if (tok)
        printf("vocabulary: %lld (%s, %s tokens; copied to %s); encoded %.2f MB in %.2f s: %.1f MB/s\n",
               (long long)vocab, tok_path, wide ? "32-bit" : "16-bit", out_tok, (double)len / 1e6,
               secs, secs > 0 ? (double)len / 1e6 / secs : 0.0);
      else
        printf("vocabulary: 256 (byte-level)\n");
    }
    rc = cli_exit_code(st);
  }
  free(ids), free(narrow), free(out_train), free(out_val), free(out_tok);
  dsc_tokenizer_free(tok);
  dsc_context_free(ctx);
  return rc;
}
