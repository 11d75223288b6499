/* The `dsc` command. Subcommands are rows of one table; each parses its own
 * flags, calls the library and decides what to print and the exit code:
 *   0 success, 1 user error (bad input or arguments), 2 internal error. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dsc/dsc.h"
#include "tools/cli.h"

/* ---------------------------------------------------------------- common */

bool cli_parse_bytes(const char *s, int64_t *out) { return dsc_parse_bytes(s, out); }

bool cli_parse_positive(const char *s, double *out) {
  char *end = NULL;
  errno = 0;
  double v = strtod(s, &end);
  if (!*s || *end || errno || !(v > 0) || !isfinite(v)) return false;
  *out = v;
  return true;
}

void cli_usage_error(const char *cmd, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "dsc %s: ", cmd);
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n(see 'dsc %s --help')\n", cmd);
  va_end(ap);
}

/* ---------------------------------------------------------------- signals */

volatile sig_atomic_t cli_signal = 0;

/* The first signal wins; SA_RESETHAND makes a second one kill at once. */
static void on_signal(int sig) {
  if (!cli_signal) cli_signal = sig;
}

static int signal_seen(void *ud) {
  (void)ud;
  return cli_signal != 0;
}

static struct sigaction saved_int, saved_term;
static bool caught;

void cli_catch_signals(dsc_context *ctx) {
  if (ctx) dsc_context_set_interrupt(ctx, signal_seen, NULL);
  if (caught) return;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESETHAND;
  sigaction(SIGINT, &sa, &saved_int);
  sigaction(SIGTERM, &sa, &saved_term);
  caught = true;
}

/* "\rcompiling 612 kernels: 37%" on a terminal, redrawn when the percentage
 * moves and erased at the end; nothing when standard error is a file. */
static void show_progress(void *ud, const char *what, int64_t done, int64_t total) {
  int *last = ud;
  int pct = total > 0 ? (int)(100 * done / total) : 100;
  if (done >= total) {
    if (*last >= 0) fprintf(stderr, "\r\033[K");
    *last = -1;
    return;
  }
  if (pct == *last) return;
  *last = pct;
  fprintf(stderr, "\r%s: %d%%", what, pct);
  fflush(stderr);
}

void cli_show_progress(dsc_context *ctx) {
  static int last = -1; /* the tool's one progress line */
  if (ctx && isatty(STDERR_FILENO)) dsc_context_set_progress(ctx, show_progress, &last);
}

void cli_release_signals(void) {
  if (!caught) return;
  sigaction(SIGINT, &saved_int, NULL);
  sigaction(SIGTERM, &saved_term, NULL);
  caught = false;
}

int cli_exit_code(dsc_status st) {
  if (st == DSC_OK) return CLI_EXIT_OK;
  /* A failure after a signal is the signal's (a rank or layer may have
   * turned "interrupted" into its own error): 128 + N, as shells report. */
  if (st == DSC_ERR_INTERRUPTED || cli_signal) return 128 + (cli_signal ? cli_signal : SIGINT);
  return st == DSC_ERR_USER ? CLI_EXIT_USER : CLI_EXIT_INTERNAL;
}

static bool ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && strcmp(s + n - m, suffix) == 0;
}

bool cli_parse_i64(const char *s, int64_t *out) {
  if (!s || !*s) return false;
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (errno || *end) return false;
  *out = v;
  return true;
}

/* Reads a whole file; NULL with a message on failure. */
char *cli_read_file(const char *path, size_t *len) {
  /* O_NONBLOCK: a FIFO's open returns at once (and is refused below)
   * instead of waiting forever for a writer. */
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) {
    fprintf(stderr, "%s: error: cannot open: %s\n", path, strerror(errno));
    return NULL;
  }
  struct stat sb;
  if (fstat(fd, &sb) == 0 && !S_ISREG(sb.st_mode)) {
    fprintf(stderr, "%s: error: not a regular file (%s)\n", path,
            S_ISDIR(sb.st_mode)    ? "a directory"
            : S_ISFIFO(sb.st_mode) ? "a FIFO"
            : S_ISCHR(sb.st_mode)  ? "a character device"
            : S_ISBLK(sb.st_mode)  ? "a block device"
            : S_ISSOCK(sb.st_mode) ? "a socket"
                                   : "a special file");
    close(fd);
    return NULL;
  }
  int fl = fcntl(fd, F_GETFL);
  FILE *f = fl >= 0 && fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) == 0 ? fdopen(fd, "rb") : NULL;
  if (!f) {
    fprintf(stderr, "%s: error: cannot open: %s\n", path, strerror(errno));
    close(fd);
    return NULL;
  }
  size_t cap = 1 << 16, n = 0;
  char *buf = malloc(cap + 1);
  while (buf) {
    size_t got = fread(buf + n, 1, cap - n, f);
    n += got;
    if (n < cap) break;
    char *nb = realloc(buf, cap * 2 + 1);
    if (!nb) {
      free(buf);
      buf = NULL;
      break;
    }
    buf = nb;
    cap *= 2;
  }
  bool failed = ferror(f);
  fclose(f);
  if (!buf || failed) {
    fprintf(stderr, "%s: error: %s\n", path, buf ? "read failed" : "out of memory");
    free(buf);
    return NULL;
  }
  buf[n] = 0;
  *len = n;
  return buf;
}

/* Loads a model file (.dsm through the frontend) or a text IR file (.dsir). */
dsc_status cli_load_module(dsc_context *ctx, const char *path, const cli_dims *dims,
                           dsc_module **out) {
  /* A program file fed to the frontend would be a wall of lexer errors. */
  if (dsc_program_is_file(path)) {
    fprintf(stderr,
            "%s: error: is a compiled program (.dsx), not a model file; 'dsc compile --list %s' "
            "shows what it holds, 'dsc train' and 'dsc run' take it\n",
            path, path);
    return DSC_ERR_USER;
  }
  if (ends_with(path, ".dsir")) {
    size_t len;
    char *text = cli_read_file(path, &len);
    if (!text) return DSC_ERR_USER;
    dsc_status st = dsc_module_parse(ctx, text, len, path, out);
    free(text);
    return st;
  }
  dsc_frontend_options opts = {dims->dims, dims->n, false};
  return dsc_compile_file(ctx, path, &opts, out);
}

/* --batch, --seq and --dim NAME=V. Returns 1 if consumed (with *i advanced),
 * 0 if not a dim flag, -1 on a bad value (message printed). */
int cli_parse_dim_flag(const char *cmd, int argc, char **argv, int *i, cli_dims *d) {
  const char *a = argv[*i];
  const char *name = NULL, *val = NULL;
  char namebuf[64];
  if (strcmp(a, "--batch") == 0 || strcmp(a, "--seq") == 0) {
    name = a[2] == 'b' ? "B" : "T";
    if (*i + 1 >= argc) return cli_usage_error(cmd, "%s needs a value", a), -1;
    val = argv[++*i];
  } else if (strcmp(a, "--dim") == 0) {
    if (*i + 1 >= argc) return cli_usage_error(cmd, "--dim needs NAME=VALUE"), -1;
    const char *kv = argv[++*i], *eq = strchr(kv, '=');
    if (!eq || eq == kv || (size_t)(eq - kv) >= sizeof namebuf)
      return cli_usage_error(cmd, "--dim needs NAME=VALUE, got '%s'", kv), -1;
    memcpy(namebuf, kv, (size_t)(eq - kv));
    namebuf[eq - kv] = 0;
    name = namebuf;
    val = eq + 1;
  } else {
    return 0;
  }
  int64_t v;
  if (!cli_parse_i64(val, &v) || v <= 0 || v > (1LL << 40))
    return cli_usage_error(cmd, "%s: '%s' is not a positive integer", a, val), -1;
  if (d->n == CLI_MAX_DIMS) return cli_usage_error(cmd, "too many dims"), -1;
  for (int k = 0; k < d->n; k++)
    if (strcmp(d->names[k], name) == 0) {
      d->dims[k].value = v;
      return 1;
    }
  snprintf(d->names[d->n], sizeof d->names[d->n], "%s", name);
  d->dims[d->n].name = d->names[d->n];
  d->dims[d->n].value = v;
  d->n++;
  return 1;
}

/* ------------------------------------------------------------ the table */

typedef struct {
  const char *name;
  int (*fn)(int argc, char **argv);
  const char *summary;
} cli_command;

static const cli_command commands[] = {
    {"check", cli_check, "check a model file and print its diagnostics"},
    {"dump", cli_dump, "print the IR of a model file or a .dsir file (text or --dot)"},
    {"run", cli_run, "run the forward pass on random inputs (model or .dsx, any backend)"},
    {"data", cli_data, "tokenize a text file (bytes) into train/val token shards"},
    {"plan", cli_plan, "print the memory one rank needs, by category, for ZeRO stages 0-3"},
    {"train", cli_train, "train a model on token shards, with checkpoints and resume"},
    {"compile", cli_compile, "compile a model's training step and kernels into a .dsx program"},
    {"generate", cli_generate, "generate text from a trained checkpoint (KV cache)"},
    {"sample", cli_generate, "the same as generate"},
    {"serve", cli_serve, "serve a checkpoint over HTTP (OpenAI completions, continuous batching)"},
    {"import", cli_import, "show how a Hugging Face model directory maps onto a model (--list)"},
    {"export", cli_export,
     "write a checkpoint's params (ZeRO shards consolidated) to one safetensors file"},
    {"launch", cli_launch, "run 'dsc train' on N MPI ranks (mpirun -np N dsc train ...)"},
    {"plot", cli_plot, "draw a training run's loss and learning-rate curves as an SVG file"},
};
#define N_COMMANDS (int)(sizeof commands / sizeof commands[0])

static void main_help(FILE *out) {
  fprintf(out,
          "usage: dsc <command> [options]\n"
          "\n"
          "dsc is a training compiler for deep-learning models.\n"
          "\n"
          "commands:\n");
  for (int i = 0; i < N_COMMANDS; i++) fprintf(out, "  %-8s %s\n", commands[i].name, commands[i].summary);
  fprintf(out,
          "\n"
          "'dsc <command> --help' describes a command.\n"
          "\n"
          "kernel cache: compiled kernels are kept in $DSC_CACHE_DIR, else\n"
          "            $XDG_CACHE_HOME/dsc, else ~/.cache/dsc, and reused by later runs;\n"
          "            --no-cache (any command) or DSC_CACHE_DIR=off compiles without it\n"
          "\n"
          "exit codes: 0 success, 1 user error (bad model, input or arguments),\n"
          "            2 internal error (a bug in dsc, or out of memory),\n"
          "            130 / 143 stopped by SIGINT / SIGTERM (honoured while loading and\n"
          "            compiling too; a second SIGINT kills at once)\n");
}

/* Output that never reached stdout (a full disk, /dev/full, a closed pipe's
 * reader gone) is an error, not a silent success. */
static int finish_stdout(int rc) {
  int flushed = fflush(stdout);
  int e = errno;
  if (rc != CLI_EXIT_OK || (flushed == 0 && !ferror(stdout))) return rc; /* an error said its own */
  fprintf(stderr, "dsc: error: cannot write the standard output: %s\n",
          flushed != 0 ? strerror(e) : "an earlier write failed");
  return CLI_EXIT_USER;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    main_help(stderr);
    return CLI_EXIT_USER;
  }
  const char *cmd = argv[1];
  if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
    main_help(stdout);
    return finish_stdout(CLI_EXIT_OK);
  }
  if (strcmp(cmd, "--version") == 0) {
    printf("dsc %s\n", DSC_VERSION);
    return finish_stdout(CLI_EXIT_OK);
  }
  /* --no-cache, for every command that compiles: no kernel cache for this
   * process and what it launches (DSC_CACHE_DIR=off, codegen/compile.c) */
  int kept = 1;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--") == 0) {
      while (i < argc) argv[kept++] = argv[i++];
      break;
    }
    if (strcmp(argv[i], "--no-cache") == 0)
      setenv("DSC_CACHE_DIR", "off", 1);
    else
      argv[kept++] = argv[i];
  }
  argc = kept;
  argv[argc] = NULL;
  for (int i = 0; i < N_COMMANDS; i++)
    if (strcmp(cmd, commands[i].name) == 0) return finish_stdout(commands[i].fn(argc - 1, argv + 1));
  fprintf(stderr, "dsc: unknown command '%s' (see 'dsc --help')\n", cmd);
  return CLI_EXIT_USER;
}
