/* Machine limits: what a run asks for (memory, threads, in-process ranks),
 * checked against this host before the work that would exhaust it starts,
 * so that an impossible request is a user error with the numbers, not an
 * allocation failure (exit 2) minutes later. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/runtime.h"

int64_t rt_host_memory(int64_t *physical) {
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  int64_t phys = pages > 0 && page > 0 ? (int64_t)pages * page : 0;
  if (physical) *physical = phys;
  /* $DSC_HOST_MEMORY (bytes) stands in for the machine: tests, containers
   * whose /proc/meminfo shows the host's. */
  const char *env = getenv("DSC_HOST_MEMORY");
  if (env && *env) {
    char *end;
    long long v = strtoll(env, &end, 10);
    if (!*end && v > 0) {
      if (physical) *physical = v;
      return v;
    }
  }
  int64_t avail = 0;
  FILE *f = fopen("/proc/meminfo", "r");
  if (f) {
    char line[128];
    long long kb;
    while (fgets(line, sizeof line, f))
      if (sscanf(line, "MemAvailable: %lld kB", &kb) == 1) {
        avail = (int64_t)kb * 1024;
        break;
      }
    fclose(f);
  }
  return avail > 0 ? avail : phys;
}

int rt_online_cpus(void) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n < 1 ? 1 : (int)n;
}

static double gib(int64_t b) { return (double)b / (1024.0 * 1024.0 * 1024.0); }

dsc_status rt_check_host_memory(dsc_context *ctx, const char *what, int64_t bytes) {
  int64_t phys, avail = rt_host_memory(&phys);
  if (avail <= 0 || bytes <= avail) return DSC_OK;
  ir_error(ctx, ir_no_loc,
           "out of memory while %s: needed %" PRId64 " bytes (%.2f GiB), this host has %" PRId64
           " bytes (%.2f GiB) available of %.2f GiB; use a smaller batch, sequence, model or "
           "fewer ranks, or offload (docs/memory.md)",
           what, bytes, gib(bytes), avail, gib(avail), gib(phys));
  return DSC_ERR_USER;
}

dsc_status rt_check_threads(dsc_context *ctx, int64_t threads) {
  int cpus = rt_online_cpus();
  int64_t cap = (int64_t)RT_THREADS_PER_CPU * cpus;
  if (threads <= cap) return DSC_OK;
  ir_error(ctx, ir_no_loc,
           "%" PRId64 " threads is more than %d x the %d online CPUs (%" PRId64
           "): each thread takes a share of every kernel, so more only adds contention; use "
           "--threads %d (or at most %" PRId64 ")",
           threads, RT_THREADS_PER_CPU, cpus, cap, cpus, cap);
  return DSC_ERR_USER;
}

dsc_status rt_check_inproc_ranks(dsc_context *ctx, int64_t ranks) {
  int cpus = rt_online_cpus();
  int64_t cap = (int64_t)RT_THREADS_PER_CPU * cpus;
  if (ranks <= cap) return DSC_OK;
  ir_error(ctx, ir_no_loc,
           "%" PRId64 " in-process ranks is more than %d x the %d online CPUs (%" PRId64
           "): every rank is a thread with its own compiled step and arenas; use at most %" PRId64
           " (or dsc launch for ranks in processes on more machines)",
           ranks, RT_THREADS_PER_CPU, cpus, cap, cap);
  return DSC_ERR_USER;
}
