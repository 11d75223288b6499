/* The CUDA driver API opened with dlopen (runtime/cuda_api.h says why). */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/cuda_api.h"

void rt_format_bytes(char *buf, size_t n, int64_t bytes) {
  static const char *units[] = {"KiB", "MiB", "GiB", "TiB"};
  if (bytes < 1024) {
    snprintf(buf, n, "%" PRId64 " bytes", bytes);
    return;
  }
  double v = (double)bytes;
  int u = -1;
  while (v >= 1024 && u < 3) v /= 1024, u++;
  snprintf(buf, n, "%.*f %s", v < 10 ? 1 : 0, v, units[u]);
}

#ifndef DSC_HAVE_CUDA

bool rt_cuda_probe(char *why, size_t n, int *arch) {
  if (arch) *arch = 0;
  snprintf(why, n, "this dsc was built without CUDA");
  return false;
}

#else

#include <dlfcn.h>
#include <pthread.h>

static pthread_mutex_t api_lock = PTHREAD_MUTEX_INITIALIZER;
static bool api_tried;
static rt_cuda_api api_table;
static const rt_cuda_api *api_ptr;
static char api_why[512];

/* Symbol names as cuda.h maps the API names (the legacy default stream:
 * no _ptsz variants). */
static const struct {
  const char *name;
  size_t offset;
} symbols[] = {
#define SYM(field, name) {name, offsetof(rt_cuda_api, field)}
    SYM(Init, "cuInit"),
    SYM(DriverGetVersion, "cuDriverGetVersion"),
    SYM(DeviceGetCount, "cuDeviceGetCount"),
    SYM(DeviceGet, "cuDeviceGet"),
    SYM(DeviceGetName, "cuDeviceGetName"),
    SYM(DeviceGetAttribute, "cuDeviceGetAttribute"),
    SYM(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain"),
    SYM(DevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2"),
    SYM(CtxSetCurrent, "cuCtxSetCurrent"),
    SYM(ModuleLoadData, "cuModuleLoadData"),
    SYM(ModuleUnload, "cuModuleUnload"),
    SYM(ModuleGetFunction, "cuModuleGetFunction"),
    SYM(LaunchKernel, "cuLaunchKernel"),
    SYM(MemAlloc, "cuMemAlloc_v2"),
    SYM(MemFree, "cuMemFree_v2"),
    SYM(MemAllocHost, "cuMemAllocHost_v2"),
    SYM(MemFreeHost, "cuMemFreeHost"),
    SYM(MemGetInfo, "cuMemGetInfo_v2"),
    SYM(MemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2"),
    SYM(MemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2"),
    SYM(MemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2"),
    SYM(MemsetD8Async, "cuMemsetD8Async"),
    SYM(StreamCreate, "cuStreamCreate"),
    SYM(StreamDestroy, "cuStreamDestroy_v2"),
    SYM(StreamSynchronize, "cuStreamSynchronize"),
    SYM(StreamWaitEvent, "cuStreamWaitEvent"),
    SYM(StreamQuery, "cuStreamQuery"),
    SYM(EventCreate, "cuEventCreate"),
    SYM(EventDestroy, "cuEventDestroy_v2"),
    SYM(EventRecord, "cuEventRecord"),
    SYM(EventSynchronize, "cuEventSynchronize"),
    SYM(EventElapsedTime, "cuEventElapsedTime"),
    SYM(GetErrorName, "cuGetErrorName"),
    SYM(GetErrorString, "cuGetErrorString"),
#undef SYM
};

const rt_cuda_api *rt_cuda_api_get(char *why, size_t n) {
  pthread_mutex_lock(&api_lock);
  if (!api_tried) {
    api_tried = true;
    /* $DSC_LIBCUDA names another driver library (tests: a library that is
     * not a driver must fail cleanly). */
    const char *lib = getenv("DSC_LIBCUDA");
    if (!lib || !lib[0]) lib = "libcuda.so.1";
    void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      const char *e = dlerror();
      snprintf(api_why, sizeof api_why, "%s", e ? e : lib);
    } else {
      bool ok = true;
      for (size_t i = 0; i < sizeof symbols / sizeof symbols[0] && ok; i++) {
        void *f = dlsym(h, symbols[i].name);
        if (!f) {
          snprintf(api_why, sizeof api_why, "%s has no %s (not a CUDA driver, or one too old)", lib,
                   symbols[i].name);
          ok = false;
          break;
        }
        /* POSIX guarantees data and function pointers convert via dlsym. */
        memcpy((char *)&api_table + symbols[i].offset, &f, sizeof f);
      }
      if (ok) api_ptr = &api_table;
    }
  }
  const rt_cuda_api *r = api_ptr;
  if (!r && why) snprintf(why, n, "%s", api_why);
  pthread_mutex_unlock(&api_lock);
  return r;
}

void rt_cu_error_text(const rt_cuda_api *a, CUresult r, char *buf, size_t n) {
  const char *name = NULL, *text = NULL;
  if (!a || a->GetErrorName(r, &name) != CUDA_SUCCESS) name = NULL;
  if (!a || a->GetErrorString(r, &text) != CUDA_SUCCESS) text = NULL;
  if (name)
    snprintf(buf, n, "%s: %s", name, text ? text : "(no description)");
  else
    snprintf(buf, n, "CUDA error %d", (int)r);
}

bool rt_cu_check(const rt_cuda_api *a, dsc_context *ctx, CUresult r, const char *what_fmt, ...) {
  if (r == CUDA_SUCCESS) return true;
  char what[400], text[300];
  va_list ap;
  va_start(ap, what_fmt);
  vsnprintf(what, sizeof what, what_fmt, ap);
  va_end(ap);
  rt_cu_error_text(a, r, text, sizeof text);
  ir_error(ctx, ir_no_loc, "%s: %s", what, text);
  return false;
}

bool rt_cuda_probe(char *why, size_t n, int *arch) {
  if (arch) *arch = 0;
  char buf[512];
  const rt_cuda_api *a = rt_cuda_api_get(buf, sizeof buf);
  if (!a) {
    snprintf(why, n, "no CUDA driver (%s)", buf);
    return false;
  }
  CUresult r = a->Init(0);
  int count = 0;
  if (r == CUDA_SUCCESS) r = a->DeviceGetCount(&count);
  if (r != CUDA_SUCCESS || count < 1) {
    if (r != CUDA_SUCCESS) {
      rt_cu_error_text(a, r, buf, sizeof buf);
      snprintf(why, n, "no CUDA device (cuInit: %s)", buf);
    } else {
      snprintf(why, n, "no CUDA device");
    }
    return false;
  }
  CUdevice dev;
  int major = 0, minor = 0;
  if ((r = a->DeviceGet(&dev, 0)) != CUDA_SUCCESS ||
      (r = a->DeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)) !=
          CUDA_SUCCESS ||
      (r = a->DeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)) !=
          CUDA_SUCCESS) {
    rt_cu_error_text(a, r, buf, sizeof buf);
    snprintf(why, n, "CUDA device 0 is not usable (%s)", buf);
    return false;
  }
  if (arch) *arch = major * 10 + minor;
  return true;
}

#endif /* DSC_HAVE_CUDA */
