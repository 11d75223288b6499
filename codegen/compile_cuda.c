/* CUDA compiling (codegen/codegen.h "codegen/compile_cuda.c"): NVRTC cubins
 * of a Program's kernels and of the executor's own kernels
 * (kernels/helpers.cuh), through the kernel cache (codegen/cache.c, files
 * "<key>.cubin"). Needs no GPU. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/codegen.h"

#ifndef DSC_HAVE_CUDA

static dsc_status no_cuda(dsc_context *ctx) {
  ir_error(ctx, ir_no_loc, "backend cuda: this dsc was built without the CUDA toolkit");
  return DSC_ERR_USER;
}
dsc_status cg_cuda_compile_program(dsc_context *ctx, ir_arena *a, const cg_program *p, int arch,
                                   const char *cache_dir, void **cubin, size_t *len,
                                   bool *from_cache) {
  (void)a, (void)p, (void)arch, (void)cache_dir, (void)from_cache;
  *cubin = NULL, *len = 0;
  return no_cuda(ctx);
}
dsc_status cg_cuda_compile_helpers(dsc_context *ctx, int arch, const char *cache_dir, void **cubin,
                                   size_t *len, bool *from_cache) {
  (void)arch, (void)cache_dir, (void)from_cache;
  *cubin = NULL, *len = 0;
  return no_cuda(ctx);
}
dsc_status cg_cuda_compile_cached(dsc_context *ctx, const char *source, const char *name, int arch,
                                  const char *cache_dir, void **cubin, size_t *len,
                                  bool *from_cache) {
  (void)source, (void)name, (void)arch, (void)cache_dir, (void)from_cache;
  *cubin = NULL, *len = 0;
  return no_cuda(ctx);
}

#else /* DSC_HAVE_CUDA */

#include <nvrtc.h>
#include <pthread.h>

#define CUBIN_MAGIC "DSCCUBN1"

static uint64_t cache_key(const char *source, int arch) {
  int major = 0, minor = 0;
  if (nvrtcVersion(&major, &minor) != NVRTC_SUCCESS) major = minor = -1;
  char tag[128];
  snprintf(tag, sizeof tag, "dsc %s nvrtc %d.%d sm_%d", DSC_VERSION, major, minor, arch);
  uint64_t h = cg_fnv1a(CG_FNV_INIT, tag, strlen(tag));
  return cg_fnv1a(h, source, strlen(source));
}

dsc_status cg_cuda_compile_cached(dsc_context *ctx, const char *source, const char *name, int arch,
                                  const char *cache_dir, void **cubin, size_t *len,
                                  bool *from_cache) {
  *cubin = NULL;
  *len = 0;
  if (from_cache) *from_cache = false;
  uint64_t key = cache_dir ? cache_key(source, arch) : 0;
  if (cache_dir &&
      (*cubin = cg_cache_read(ctx, cache_dir, key, "cubin", CUBIN_MAGIC, (uint64_t)1 << 31, len))) {
    if (from_cache) *from_cache = true;
    return DSC_OK;
  }
  dsc_status st = cg_nvrtc_compile(ctx, source, name, arch, NULL, NULL, cubin, len);
  if (st == DSC_OK && cache_dir) cg_cache_write(ctx, cache_dir, key, "cubin", CUBIN_MAGIC, *cubin, *len);
  return st;
}

dsc_status cg_cuda_compile_program(dsc_context *ctx, ir_arena *a, const cg_program *p, int arch,
                                   const char *cache_dir, void **cubin, size_t *len,
                                   bool *from_cache) {
  *cubin = NULL;
  *len = 0;
  if (from_cache) *from_cache = false;
  if (p->n_kernels == 0) return DSC_OK;
  char *src = cg_cuda_program_source(a, p->kernels, p->n_kernels);
  if (!src) return DSC_ERR_INTERNAL;
  char name[200];
  snprintf(name, sizeof name, "%s.cu", p->graph_name ? p->graph_name : "dsc_program");
  return cg_cuda_compile_cached(ctx, src, name, arch, cache_dir, cubin, len, from_cache);
}

/* The helpers' cubin, kept for the process: every executor loads them, and
 * a program that creates many (dsc_gpu_check) should compile them once. */
static pthread_mutex_t helpers_lock = PTHREAD_MUTEX_INITIALIZER;
static void *helpers_cubin;
static size_t helpers_len;
static int helpers_arch;

dsc_status cg_cuda_compile_helpers(dsc_context *ctx, int arch, const char *cache_dir, void **cubin,
                                   size_t *len, bool *from_cache) {
  pthread_mutex_lock(&helpers_lock);
  dsc_status st = DSC_OK;
  if (helpers_cubin && helpers_arch == arch) {
    *cubin = malloc(helpers_len);
    *len = *cubin ? helpers_len : 0;
    if (*cubin) memcpy(*cubin, helpers_cubin, helpers_len);
    if (from_cache) *from_cache = true;
    if (!*cubin) {
      ir_error(ctx, ir_no_loc, "backend cuda: out of memory");
      st = DSC_ERR_INTERNAL;
    }
  } else {
    /* kernels/helpers.cuh, embedded at build time */
    const char *helpers_source = cg_cuda_kernel_file("helpers.cuh");
    if (!helpers_source) {
      ir_error(ctx, ir_no_loc, "backend cuda: kernels/helpers.cuh is not embedded in this build");
      st = DSC_ERR_INTERNAL;
    } else {
      st = cg_cuda_compile_cached(ctx, helpers_source, "dsc_cuda_helpers.cu", arch, cache_dir,
                                  cubin, len, from_cache);
    }
    void *keep = st == DSC_OK ? malloc(*len) : NULL;
    if (keep) {
      memcpy(keep, *cubin, *len);
      free(helpers_cubin);
      helpers_cubin = keep;
      helpers_len = *len;
      helpers_arch = arch;
    }
  }
  pthread_mutex_unlock(&helpers_lock);
  return st;
}

#endif
