/* tools/: the dsc command, one file per subcommand (cmd_<name>.c). */
#ifndef DSC_CLI_H
#define DSC_CLI_H

#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>

#include "dsc/autocfg.h"
#include "dsc/dsc.h"

enum { CLI_EXIT_OK = 0, CLI_EXIT_USER = 1, CLI_EXIT_INTERNAL = 2 };

#define CLI_MAX_DIMS 16
typedef struct {
  dsc_dim_binding dims[CLI_MAX_DIMS];
  char names[CLI_MAX_DIMS][64];
  int n;
} cli_dims;

/* dsc.c */
/* The first SIGINT or SIGTERM seen (0: none). cli_catch_signals installs the
 * handler (once; a second signal of the same kind then kills at once) and
 * makes ctx's long calls stop with DSC_ERR_INTERRUPTED when it is set;
 * cli_exit_code then gives 128 + the signal. */
extern volatile sig_atomic_t cli_signal;
void cli_catch_signals(dsc_context *ctx);
void cli_release_signals(void);
/* A progress line for ctx's long steps (compiling kernels) on standard
 * error when it is a terminal. */
void cli_show_progress(dsc_context *ctx);
void cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int cli_exit_code(dsc_status st);
bool cli_parse_i64(const char *s, int64_t *out);
/* A byte count: a number with an optional K, M or G (powers of 1024; KB, KiB,
 * MB, MiB, ... all accepted), e.g. 0, 4096, 25MB, 1.5GiB. */
bool cli_parse_bytes(const char *s, int64_t *out);
/* A finite number > 0 (e.g. --lr 3e-4); false for anything else. */
bool cli_parse_positive(const char *s, double *out);
char *cli_read_file(const char *path, size_t *len);
dsc_status cli_load_module(dsc_context *ctx, const char *path, const cli_dims *dims,
                           dsc_module **out);
int cli_parse_dim_flag(const char *cmd, int argc, char **argv, int *i, cli_dims *d);

/* knobs.c: a run-knob flag (include/dsc/settings.h) into k. 1: argv[*i]
 * (and its value) was one, 0: not one, -1: a usage error (printed). */
int cli_knob_flag(const char *cmd, int argc, char **argv, int *i, dsc_run_knobs *k);

/* cmd_auto.c: --auto of dsc plan and dsc train (include/dsc/autocfg.h) */
typedef struct {
  bool on, recalibrate;
  int max_plans;       /* 0: the default */
  const char *offload_dir; /* --offload-dir where the command has none of its own */
  dsc_rates rates;     /* the rate flags; 0: calibrate */
} cli_auto;
/* 1: argv[*i] (and its value) was an auto flag, 0: not one, -1: a usage
 * error (printed). */
int cli_auto_flag(const char *cmd, int argc, char **argv, int *i, cli_auto *a);
/* The rates, the search and its report (text to out, or JSON to stdout);
 * an exit code. */
int cli_auto_run(const char *cmd, dsc_context *ctx, const cli_auto *a, dsc_autocfg_options *ao,
                 bool json, FILE *out, dsc_autocfg_result *res);
#define CLI_AUTO_HELP                                                                          \
  "  --auto            search ZeRO stage, offload, activation checkpointing, bucket and\n"      \
  "                    prefetch sizes for the fastest configuration (by a cost model)\n"      \
  "                    whose peak fits --memory-budget (required) and whose offloaded\n"    \
  "                    bytes fit --host-memory-budget (if given); flags given fix their\n"   \
  "                    choice; the disk tier only with --offload-dir DIR\n"                  \
  "                    (docs/memory.md \"Auto-configuration\")\n"                              \
  "  --max-plans N     at most N configurations planned (default 40)\n"                       \
  "  --compute-gflops X, --link-gbps X, --host-gbps X, --disk-gbps X  the cost model's\n"     \
  "                    rates (GFLOP/s; GB/s = 1e9 bytes/s) instead of the calibration run\n"  \
  "                    (about 1.5 s, cached per host in $DSC_CACHE_DIR or ~/.cache/dsc)\n"   \
  "  --recalibrate     measure the rates again instead of reading the cache\n"

/* one function per subcommand; argv[0] is the subcommand's name */
int cli_check(int argc, char **argv);
int cli_import(int argc, char **argv);
int cli_dump(int argc, char **argv);
int cli_run(int argc, char **argv);
int cli_data(int argc, char **argv);
int cli_train(int argc, char **argv);
int cli_generate(int argc, char **argv); /* also dsc sample */
/* The tokenizer.json of the run a checkpoint belongs to (in DIR, or in the
 * run holding step DIR), written into buf; NULL when there is none. */
const char *cli_run_tokenizer(const char *checkpoint, char *buf, size_t n);
int cli_serve(int argc, char **argv);
int cli_compile(int argc, char **argv);
int cli_plan(int argc, char **argv);
int cli_launch(int argc, char **argv);
int cli_export(int argc, char **argv);
int cli_plot(int argc, char **argv);

#endif
