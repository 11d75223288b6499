/* Calibration of the auto-configuration's cost model (include/dsc/autocfg.h
 * dsc_calibrate): four short measurements on this host, about 1-2 s in all,
 * cached per host in a small text file:
 *   compute  an f32 GEMM 512x768x768 (GPT-2's d) through the CPU backend's
 *            GEMM plans (runtime/gemm_cpu.c; sgemm.c where supported), best
 *            of repeated runs for ~0.4 s
 *   host     memcpy of 64 MiB (the host tier's copies; on CPU runs host
 *            memory is the device), best of a few
 *   disk     32 MiB written to a temp file in the offload dir (or $TMPDIR),
 *            fsync'd, dropped from the page cache and read back: bytes
 *            written + read over the time of both
 *   link     all-reduces of 8 MiB f32 between two in-process ranks
 *            (runtime/comm_inproc.c): the ring's bytes per rank
 *            (dsc_ring_bytes) over the time, as NCCL's "bus bandwidth". */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "dsc/autocfg.h"
#include "codegen/codegen.h"
#include "dsc/comm.h"
#include "runtime/runtime.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int threads_of(const dsc_calibrate_options *o) {
  if (o && o->threads > 0) return o->threads;
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n < 1 ? 1 : (int)n;
}

/* The host's name as a file-name-safe key. */
static void host_key(char *buf, size_t n) {
  char h[256] = "host";
  if (gethostname(h, sizeof h - 1) != 0) strcpy(h, "host");
  h[sizeof h - 1] = 0;
  size_t k = 0;
  for (const char *p = h; *p && k + 1 < n; p++)
    buf[k++] = (char)((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
                              (*p >= '0' && *p <= '9') || *p == '-' || *p == '.'
                          ? *p
                          : '_');
  buf[k] = 0;
}

bool dsc_calibrate_cache_path(const dsc_calibrate_options *o, char *buf, size_t n) {
  if (o && o->cache_path) return snprintf(buf, n, "%s", o->cache_path) < (int)n;
  char host[128];
  host_key(host, sizeof host);
  char dir[4096]; /* the kernel cache's directory (codegen/compile.c) */
  if (!cg_kernel_cache_dir(NULL, dir, sizeof dir)) return false;
  return snprintf(buf, n, "%s/calibration-%s.txt", dir, host) < (int)n;
}

/* ---- the measurements ---- */

static dsc_status measure_compute(dsc_context *ctx, int threads, double *gflops) {
  const int64_t M = 512, N = 768, K = 768;
  rt_pool *pool = rt_pool_new(ctx, threads);
  if (!pool) return DSC_ERR_INTERNAL;
  rt_gemm_engine *e = rt_gemm_engine_new(ctx, pool);
  float *a = malloc(sizeof(float) * (size_t)(M * K)), *b = malloc(sizeof(float) * (size_t)(K * N));
  float *c = malloc(sizeof(float) * (size_t)(M * N));
  dsc_status st = DSC_OK;
  rt_gemm_plan *p = NULL;
  if (!e || !a || !b || !c) {
    if (e) ir_error(ctx, ir_no_loc, "calibration: out of memory");
    st = DSC_ERR_INTERNAL;
    goto done;
  }
  for (int64_t i = 0; i < M * K; i++) a[i] = (float)((i * 7919) % 1000) * 1e-3f - 0.5f;
  for (int64_t i = 0; i < K * N; i++) b[i] = (float)((i * 104729) % 1000) * 1e-3f - 0.5f;
  cg_gemm g;
  memset(&g, 0, sizeof g);
  g.batch[0] = g.batch[1] = 1;
  g.m = M, g.n = N, g.k = K;
  g.a.row_stride = K, g.b.row_stride = N, g.c.row_stride = N;
  g.a.col_stride = g.b.col_stride = g.c.col_stride = 1;
  g.alpha = 1;
  if (!(p = rt_gemm_plan_new(e, &g, DSC_F32, DSC_F32, 0))) {
    st = DSC_ERR_INTERNAL;
    goto done;
  }
  char err[256];
  double best = 1e30, t_end = now_s() + 0.4;
  for (int it = 0; it < 200 && (it < 3 || now_s() < t_end); it++) {
    double t0 = now_s();
    if (!rt_gemm_run(p, a, b, c, err, sizeof err)) {
      ir_error(ctx, ir_no_loc, "calibration: the GEMM failed: %s", err);
      st = DSC_ERR_INTERNAL;
      goto done;
    }
    double t = now_s() - t0;
    if (t < best) best = t;
  }
  *gflops = 2.0 * (double)(M * N * K) / (best > 1e-9 ? best : 1e-9) * 1e-9;
done:
  rt_gemm_plan_free(p);
  free(a), free(b), free(c);
  rt_gemm_engine_free(e);
  rt_pool_free(pool);
  return st;
}

static dsc_status measure_host(dsc_context *ctx, double *gbps) {
  const size_t n = (size_t)64 << 20;
  char *src = malloc(n), *dst = malloc(n);
  if (!src || !dst) {
    free(src), free(dst);
    ir_error(ctx, ir_no_loc, "calibration: out of memory");
    return DSC_ERR_INTERNAL;
  }
  memset(src, 1, n);
  memset(dst, 2, n); /* both touched: page faults are not the copy's */
  double best = 1e30;
  for (int i = 0; i < 4; i++) {
    src[(size_t)i * 4096] = (char)i;
    double t0 = now_s();
    memcpy(dst, src, n);
    double t = now_s() - t0;
    if (t < best) best = t;
  }
  volatile char sink = dst[4096];
  (void)sink;
  free(src), free(dst);
  *gbps = (double)n / (best > 1e-9 ? best : 1e-9) * 1e-9;
  return DSC_OK;
}

static dsc_status measure_disk(dsc_context *ctx, const char *dir, double *gbps) {
  if (!dir || !dir[0]) dir = getenv("TMPDIR");
  if (!dir || !dir[0]) dir = "/tmp";
  char path[4096];
  if (snprintf(path, sizeof path, "%s/dsc-calibrate-XXXXXX", dir) >= (int)sizeof path) {
    ir_error(ctx, ir_no_loc, "calibration: the directory name '%s' is too long", dir);
    return DSC_ERR_USER;
  }
  int fd = mkstemp(path);
  if (fd < 0) {
    ir_error(ctx, rt_loc(dir), "calibration: cannot create a test file in this directory: %s",
             strerror(errno));
    return DSC_ERR_USER;
  }
  const size_t n = (size_t)32 << 20, chunk = (size_t)4 << 20;
  char *buf = malloc(chunk);
  dsc_status st = DSC_OK;
  if (!buf) {
    ir_error(ctx, ir_no_loc, "calibration: out of memory");
    st = DSC_ERR_INTERNAL;
    goto done;
  }
  for (size_t i = 0; i < chunk; i++) buf[i] = (char)(i * 31);
  double t0 = now_s();
  for (size_t off = 0; off < n; off += chunk) {
    size_t done = 0;
    while (done < chunk) {
      ssize_t w = write(fd, buf + done, chunk - done);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        ir_error(ctx, rt_loc(path), "calibration: writing the disk test file failed: %s",
                 w < 0 ? strerror(errno) : "no space");
        st = DSC_ERR_USER;
        goto done;
      }
      done += (size_t)w;
    }
  }
  if (fsync(fd) != 0) {
    ir_error(ctx, rt_loc(path), "calibration: fsync of the disk test file failed: %s",
             strerror(errno));
    st = DSC_ERR_USER;
    goto done;
  }
  double t_write = now_s() - t0;
#ifdef POSIX_FADV_DONTNEED
  (void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED); /* read from the disk, not the cache */
#endif
  t0 = now_s();
  for (size_t off = 0; off < n; off += chunk)
    if (!rt_pread_full(fd, buf, chunk, off)) {
      ir_error(ctx, rt_loc(path), "calibration: reading the disk test file back failed");
      st = DSC_ERR_USER;
      goto done;
    }
  double t = t_write + (now_s() - t0);
  *gbps = 2.0 * (double)n / (t > 1e-9 ? t : 1e-9) * 1e-9;
done:
  free(buf);
  close(fd);
  unlink(path);
  return st;
}

typedef struct {
  int64_t count;
  double seconds; /* rank 0's best */
} link_job;

static dsc_status link_rank(dsc_comm *c, void *ud) {
  link_job *j = ud;
  float *buf = malloc(sizeof(float) * (size_t)j->count);
  if (!buf) {
    ir_error(dsc_comm_context(c), ir_no_loc, "calibration: out of memory");
    return DSC_ERR_INTERNAL;
  }
  for (int64_t i = 0; i < j->count; i++) buf[i] = 1e-3f * (float)(i % 1000);
  double best = 1e30;
  dsc_status st = DSC_OK;
  for (int it = 0; it < 5 && st == DSC_OK; it++) {
    double t0 = now_s();
    st = dsc_comm_all_reduce(c, buf, buf, j->count, DSC_F32, DSC_COMM_SUM, it);
    double t = now_s() - t0;
    if (t < best) best = t;
  }
  if (dsc_comm_rank(c) == 0) j->seconds = best;
  free(buf);
  return st;
}

static dsc_status measure_link(dsc_context *ctx, double *gbps) {
  link_job j = {(int64_t)2 << 20, 0}; /* 8 MiB of f32 */
  dsc_status st = dsc_comm_inproc_run(ctx, 2, link_rank, &j);
  if (st != DSC_OK) return st;
  /* a ring all-reduce sends 2(N-1)/N of the tensor per rank (dsc_ring_bytes): at N = 2, all */
  double bytes = 4.0 * (double)j.count;
  *gbps = bytes / (j.seconds > 1e-9 ? j.seconds : 1e-9) * 1e-9;
  return DSC_OK;
}

/* ---- the cache: "dsc-calibration 1" then "key value" lines ---- */

static bool read_cache(const char *path, const char *host, int threads, dsc_rates *r) {
  const char *kind;
  int fd = rt_open_regular_fd(path, 0, &kind);
  FILE *f = fd >= 0 ? fdopen(fd, "r") : NULL;
  if (!f) {
    if (fd >= 0) close(fd);
    return false;
  }
  char line[512], key[64], val[256];
  bool ok = fgets(line, sizeof line, f) && strcmp(line, "dsc-calibration 1\n") == 0;
  int seen = 0;
  dsc_rates t;
  memset(&t, 0, sizeof t);
  while (ok && fgets(line, sizeof line, f)) {
    if (sscanf(line, "%63s %255s", key, val) != 2) continue;
    char *end;
    double v = strtod(val, &end);
    bool num = *end == 0 && v > 0;
    if (strcmp(key, "host") == 0)
      ok = strcmp(val, host) == 0, seen |= 1;
    else if (strcmp(key, "threads") == 0)
      ok = num && (int)v == threads, seen |= 2;
    else if (strcmp(key, "compute_gflops") == 0 && num)
      t.compute_gflops = v, seen |= 4;
    else if (strcmp(key, "link_gbps") == 0 && num)
      t.link_gbps = v, seen |= 8;
    else if (strcmp(key, "host_gbps") == 0 && num)
      t.host_gbps = v, seen |= 16;
    else if (strcmp(key, "disk_gbps") == 0 && num)
      t.disk_gbps = v, seen |= 32;
  }
  fclose(f);
  if (!ok || seen != 63) return false;
  *r = t;
  return true;
}

static void mkdirs(char *path) { /* the directories of path (a file) */
  for (char *p = path + 1; *p; p++)
    if (*p == '/') {
      *p = 0;
      mkdir(path, 0755);
      *p = '/';
    }
}

static bool write_cache(const char *path, const char *host, int threads, const dsc_rates *r) {
  char tmp[4200], dirs[4096];
  snprintf(dirs, sizeof dirs, "%s", path);
  mkdirs(dirs);
  if (snprintf(tmp, sizeof tmp, "%s.tmp%ld", path, (long)getpid()) >= (int)sizeof tmp) return false;
  FILE *f = fopen(tmp, "w");
  if (!f) return false;
  fprintf(f,
          "dsc-calibration 1\nhost %s\nthreads %d\ncompute_gflops %.6g\nlink_gbps %.6g\n"
          "host_gbps %.6g\ndisk_gbps %.6g\n",
          host, threads, r->compute_gflops, r->link_gbps, r->host_gbps, r->disk_gbps);
  bool ok = fclose(f) == 0 && rename(tmp, path) == 0; /* readers never see half a file */
  if (!ok) unlink(tmp);
  return ok;
}

bool dsc_calibrate_cached(const dsc_calibrate_options *o, dsc_rates *out) {
  char host[128], path[4096];
  host_key(host, sizeof host);
  if ((o && o->no_cache) || !dsc_calibrate_cache_path(o, path, sizeof path)) return false;
  return read_cache(path, host, threads_of(o), out);
}

dsc_status dsc_calibrate(dsc_context *ctx, const dsc_calibrate_options *o, dsc_rates *out,
                         bool *from_cache) {
  dsc_calibrate_options none;
  memset(&none, 0, sizeof none);
  if (!o) o = &none;
  memset(out, 0, sizeof *out);
  *from_cache = false;
  int threads = threads_of(o);
  char host[128], path[4096];
  host_key(host, sizeof host);
  bool have_path = !o->no_cache && dsc_calibrate_cache_path(o, path, sizeof path);
  if (have_path && !o->recalibrate && read_cache(path, host, threads, out)) {
    *from_cache = true;
    return DSC_OK;
  }
  dsc_status st;
  if ((st = measure_compute(ctx, threads, &out->compute_gflops)) != DSC_OK ||
      (st = measure_host(ctx, &out->host_gbps)) != DSC_OK ||
      (st = measure_disk(ctx, o->disk_dir, &out->disk_gbps)) != DSC_OK ||
      (st = measure_link(ctx, &out->link_gbps)) != DSC_OK)
    return st;
  if (have_path && !write_cache(path, host, threads, out))
    ir_diag(ctx, DSC_DIAG_WARNING, rt_loc(path),
            "calibration: cannot write the cache file (%s); the rates are measured again next time",
            strerror(errno));
  return DSC_OK;
}
