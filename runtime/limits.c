/* Machine limits: what a run asks for (memory, threads, in-process ranks),
 * checked against this host before the work that would exhaust it starts,
 * so that an impossible request is a user error with the numbers, not an
 * allocation failure (exit 2) minutes later. */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <sys/mman.h>
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

int64_t rt_resident_bytes(const void *p, size_t n) {
  if (!p || n == 0) return 0;
  long pg = sysconf(_SC_PAGESIZE);
  if (pg <= 0) return -1;
  uintptr_t lo = (uintptr_t)p & ~((uintptr_t)pg - 1);
  uintptr_t hi = ((uintptr_t)p + n + (uintptr_t)pg - 1) & ~((uintptr_t)pg - 1);
  size_t pages = (hi - lo) / (size_t)pg;
  unsigned char vec[4096];
  int64_t resident = 0;
  for (size_t at = 0; at < pages; at += sizeof vec) { /* in chunks: no allocation */
    size_t k = pages - at < sizeof vec ? pages - at : sizeof vec;
    if (mincore((void *)(lo + at * (size_t)pg), k * (size_t)pg, vec) != 0) return -1;
    for (size_t i = 0; i < k; i++) resident += vec[i] & 1;
  }
  return resident * pg;
}

int64_t rt_rss_bytes(void) {
  FILE *f = fopen("/proc/self/statm", "r");
  long long size = 0, resident = -1;
  if (!f) return -1;
  if (fscanf(f, "%lld %lld", &size, &resident) != 2) resident = -1;
  fclose(f);
  return resident < 0 ? -1 : resident * (int64_t)sysconf(_SC_PAGESIZE);
}

#if defined(__SANITIZE_ADDRESS__)
#define DSC_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DSC_ASAN 1
#endif
#endif

#if defined(DSC_ASAN)
/* AddressSanitizer's allocator serves every malloc: glibc's heap stays
 * empty, and its first mallinfo2 initialises the arena without a lock
 * (two rank threads asking at once read half-built bins). Ask ASan. */
size_t __sanitizer_get_heap_size(void);
int64_t rt_heap_bytes(void) { return (int64_t)__sanitizer_get_heap_size(); }
#elif defined(__GLIBC__)
static pthread_once_t heap_once = PTHREAD_ONCE_INIT;
/* glibc initialises its arena on the first malloc or mallinfo2 call without
 * a lock; under another allocator (LD_PRELOAD) that first call can be ours,
 * from two threads: make it once. */
static void heap_init(void) { (void)mallinfo2(); }
int64_t rt_heap_bytes(void) {
  pthread_once(&heap_once, heap_init);
  struct mallinfo2 mi = mallinfo2();
  return (int64_t)(mi.arena + mi.hblkhd);
}
#else
int64_t rt_heap_bytes(void) { return -1; }
#endif
