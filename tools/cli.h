/* tools/: the dsc command, one file per subcommand (cmd_<name>.c). */
#ifndef DSC_CLI_H
#define DSC_CLI_H

#include <stdarg.h>
#include <stdbool.h>

#include "dsc/dsc.h"

enum { CLI_EXIT_OK = 0, CLI_EXIT_USER = 1, CLI_EXIT_INTERNAL = 2 };

#define CLI_MAX_DIMS 16
typedef struct {
  dsc_dim_binding dims[CLI_MAX_DIMS];
  char names[CLI_MAX_DIMS][64];
  int n;
} cli_dims;

/* dsc.c */
void cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int cli_exit_code(dsc_status st);
bool cli_parse_i64(const char *s, int64_t *out);
/* A byte count: a number with an optional K, M or G (powers of 1024; KB, KiB,
 * MB, MiB, ... all accepted), e.g. 0, 4096, 25MB, 1.5GiB. */
bool cli_parse_bytes(const char *s, int64_t *out);
char *cli_read_file(const char *path, size_t *len);
dsc_status cli_load_module(dsc_context *ctx, const char *path, const cli_dims *dims,
                           dsc_module **out);
int cli_parse_dim_flag(const char *cmd, int argc, char **argv, int *i, cli_dims *d);

/* one function per subcommand; argv[0] is the subcommand's name */
int cli_check(int argc, char **argv);
int cli_dump(int argc, char **argv);
int cli_run(int argc, char **argv);
int cli_data(int argc, char **argv);
int cli_train(int argc, char **argv);
int cli_sample(int argc, char **argv);
int cli_compile(int argc, char **argv);
int cli_plan(int argc, char **argv);
int cli_launch(int argc, char **argv);
int cli_export(int argc, char **argv);

#endif
