/* dsc launch -n N -- train ARGS...: runs `mpirun -np N <this dsc> train
 * ARGS...` (each process one rank, include/dsc/comm.h) and exits with
 * mpirun's status. */
#define _XOPEN_SOURCE 700 /* readlink, setenv */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tools/cli.h"

static const char launch_help[] =
    "usage: dsc launch -n N [--mpirun PATH] [--dry-run] [--] train ARGS...\n"
    "\n"
    "Runs 'mpirun -np N DSC train ARGS...' with DSC this dsc binary: N processes,\n"
    "one rank each (Open MPI; docs/training.md \"Data parallel\"). The exit status is\n"
    "mpirun's (a failing rank ends the job with its error).\n"
    "  -n N           ranks (processes), 1 to 1024\n"
    "  --mpirun PATH  the launcher (default: mpirun from PATH)\n"
    "  --dry-run      print the command instead of running it\n"
    "For Open MPI it sets, unless already set: OMPI_ALLOW_RUN_AS_ROOT(_CONFIRM)=1\n"
    "when run as root (containers), and OMPI_MCA_rmaps_base_oversubscribe=1 when\n"
    "N exceeds the online CPUs, as the project's MPI tests do.\n"
    "Exit codes: mpirun's; 1 bad arguments, mpirun not found, or no MPI in this dsc.\n";

/* PATH lookup of an executable; the found path in buf, or false. */
static bool find_in_path(const char *name, char *buf, size_t n) {
  if (strchr(name, '/')) {
    snprintf(buf, n, "%s", name);
    return access(buf, X_OK) == 0;
  }
  const char *path = getenv("PATH");
  if (!path || !*path) return false;
  while (*path) {
    const char *end = strchr(path, ':');
    size_t len = end ? (size_t)(end - path) : strlen(path);
    int w = snprintf(buf, n, "%.*s%s%s", (int)len, len ? path : ".", "/", name);
    struct stat sb;
    if (w > 0 && (size_t)w < n && stat(buf, &sb) == 0 && S_ISREG(sb.st_mode) &&
        access(buf, X_OK) == 0)
      return true;
    if (!end) break;
    path = end + 1;
  }
  return false;
}

static void set_default(const char *var, const char *value) {
  if (!getenv(var)) setenv(var, value, 0);
}

int cli_launch(int argc, char **argv) {
  int64_t n = 0;
  const char *mpirun = NULL;
  bool dry = false;
  int i = 1;
  for (; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      fputs(launch_help, stdout);
      return CLI_EXIT_OK;
    } else if (strcmp(a, "-n") == 0 || strcmp(a, "-np") == 0) {
      if (i + 1 >= argc || !cli_parse_i64(argv[i + 1], &n) || n < 1 || n > 1024)
        return cli_usage_error("launch", "-n needs an integer in [1, 1024]"), CLI_EXIT_USER;
      i++;
    } else if (strcmp(a, "--mpirun") == 0) {
      if (i + 1 >= argc || !argv[i + 1][0])
        return cli_usage_error("launch", "--mpirun needs a path"), CLI_EXIT_USER;
      mpirun = argv[++i];
    } else if (strcmp(a, "--dry-run") == 0) {
      dry = true;
    } else if (strcmp(a, "--") == 0) {
      i++;
      break;
    } else if (strcmp(a, "train") == 0) {
      break; /* the '--' is optional before the command */
    } else {
      return cli_usage_error("launch", "unknown option '%s' (the command follows '--')", a),
             CLI_EXIT_USER;
    }
  }
  if (n == 0) return cli_usage_error("launch", "missing -n N (the number of ranks)"), CLI_EXIT_USER;
  if (i >= argc)
    return cli_usage_error("launch",
                           "missing the command after '--' (dsc launch -n N -- train ...)"),
           CLI_EXIT_USER;
  if (strcmp(argv[i], "train") != 0)
    return cli_usage_error("launch",
                           "'%s' does not run on ranks; dsc launch runs 'train' "
                           "(dsc launch -n N -- train ...)",
                           argv[i]),
           CLI_EXIT_USER;
  for (int k = i + 1; k < argc; k++)
    if (strcmp(argv[k], "--ranks") == 0)
      return cli_usage_error("launch",
                             "--ranks runs in-process ranks; under dsc launch each process is a "
                             "rank already (-n gives their number)"),
             CLI_EXIT_USER;
  if (!dsc_comm_have_mpi()) {
    fputs(
        "dsc launch: error: this dsc was built without MPI (rebuild with MPI, or use "
        "'dsc train --ranks N' for in-process ranks)\n",
        stderr);
    return CLI_EXIT_USER;
  }

  /* This binary, by absolute path: mpirun's processes may not share our PATH. */
  char self[PATH_MAX];
  ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
  if (len <= 0) {
    fprintf(stderr, "dsc launch: error: cannot find this dsc binary (/proc/self/exe): %s\n",
            strerror(errno));
    return CLI_EXIT_USER;
  }
  self[len] = 0;
  char launcher[PATH_MAX];
  const char *want = mpirun ? mpirun : "mpirun";
  if (!find_in_path(want, launcher, sizeof launcher)) {
    if (mpirun)
      fprintf(stderr, "dsc launch: error: --mpirun %s: not an executable file\n", mpirun);
    else
      fputs(
          "dsc launch: error: mpirun not found in PATH (install Open MPI, e.g. "
          "apt-get install openmpi-bin, or give --mpirun PATH)\n",
          stderr);
    return CLI_EXIT_USER;
  }

  /* mpirun -np N SELF train ARGS... */
  int n_rest = argc - i;
  char **args = calloc((size_t)n_rest + 5, sizeof *args);
  char np[24];
  if (!args) return fputs("dsc: out of memory\n", stderr), CLI_EXIT_INTERNAL;
  snprintf(np, sizeof np, "%" PRId64, n);
  int k = 0;
  args[k++] = launcher;
  args[k++] = "-np";
  args[k++] = np;
  args[k++] = self;
  for (int j = i; j < argc; j++) args[k++] = argv[j];
  args[k] = NULL;

  /* Open MPI refuses root and more ranks than slots unless told; these
   * variables are its own (other MPIs ignore them), never overriding the user's. */
  if (geteuid() == 0) {
    set_default("OMPI_ALLOW_RUN_AS_ROOT", "1");
    set_default("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
  }
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  if (cpus > 0 && n > cpus) set_default("OMPI_MCA_rmaps_base_oversubscribe", "1");

  if (dry) {
    for (int j = 0; j < k; j++) printf("%s%s", j ? " " : "", args[j]);
    putchar('\n');
    free(args);
    return CLI_EXIT_OK;
  }
  fflush(stdout);
  fflush(stderr);
  execv(launcher, args); /* mpirun's exit status becomes ours */
  fprintf(stderr, "dsc launch: error: cannot run %s: %s\n", launcher, strerror(errno));
  free(args);
  return CLI_EXIT_USER;
}
