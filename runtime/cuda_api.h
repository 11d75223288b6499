/* runtime/cuda_api.h: the CUDA driver API opened at run time, and the CUDA
 * executor (runtime/exec_cuda.c) behind the public executor's "cuda" backend.
 *
 * Why dlopen: dsc must build, link and run its CPU paths on machines that
 * have the CUDA toolkit but no driver (CI, these build machines), so
 * libcuda.so.1 is never on the link line. rt_cuda_api_get() opens it once per
 * process and resolves the symbols the headers map the API names to (the
 * _v2 ones). Everything here needs DSC_HAVE_CUDA (the toolkit's headers);
 * without it only the declarations that report "built without CUDA" exist. */
#ifndef DSC_RUNTIME_CUDA_API_H
#define DSC_RUNTIME_CUDA_API_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "codegen/codegen.h"
#include "dsc/comm.h"
#include "dsc/core.h"
#include "dsc/interp.h"
#include "dsc/ir.h"

#ifdef __cplusplus
extern "C" {
#endif

#ifdef DSC_HAVE_CUDA
#include <cuda.h>

/* ======================= runtime/cuda_api.c =======================
 * One function pointer per driver entry point dsc uses (named without the
 * cu prefix so that cuda.h's #defines of the cu names do not touch them). */
typedef struct {
  CUresult (*Init)(unsigned);
  CUresult (*DriverGetVersion)(int *);
  CUresult (*DeviceGetCount)(int *);
  CUresult (*DeviceGet)(CUdevice *, int);
  CUresult (*DeviceGetName)(char *, int, CUdevice);
  CUresult (*DeviceGetAttribute)(int *, CUdevice_attribute, CUdevice);
  CUresult (*DevicePrimaryCtxRetain)(CUcontext *, CUdevice);
  CUresult (*DevicePrimaryCtxRelease)(CUdevice);
  CUresult (*CtxSetCurrent)(CUcontext);
  CUresult (*ModuleLoadData)(CUmodule *, const void *);
  CUresult (*ModuleUnload)(CUmodule);
  CUresult (*ModuleGetFunction)(CUfunction *, CUmodule, const char *);
  CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                           unsigned, CUstream, void **, void **);
  CUresult (*MemAlloc)(CUdeviceptr *, size_t);
  CUresult (*MemFree)(CUdeviceptr);
  CUresult (*MemAllocHost)(void **, size_t);
  CUresult (*MemFreeHost)(void *);
  CUresult (*MemGetInfo)(size_t *, size_t *);
  CUresult (*MemcpyHtoDAsync)(CUdeviceptr, const void *, size_t, CUstream);
  CUresult (*MemcpyDtoHAsync)(void *, CUdeviceptr, size_t, CUstream);
  CUresult (*MemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
  CUresult (*MemsetD8Async)(CUdeviceptr, unsigned char, size_t, CUstream);
  CUresult (*StreamCreate)(CUstream *, unsigned);
  CUresult (*StreamDestroy)(CUstream);
  CUresult (*StreamSynchronize)(CUstream);
  CUresult (*StreamWaitEvent)(CUstream, CUevent, unsigned);
  CUresult (*StreamQuery)(CUstream); /* collectives: polled, so that no rank hangs */
  CUresult (*EventCreate)(CUevent *, unsigned);
  CUresult (*EventDestroy)(CUevent);
  CUresult (*EventRecord)(CUevent, CUstream);
  CUresult (*EventSynchronize)(CUevent);
  CUresult (*EventElapsedTime)(float *, CUevent, CUevent);
  CUresult (*GetErrorName)(CUresult, const char **);
  CUresult (*GetErrorString)(CUresult, const char **);
} rt_cuda_api;

/* The driver API, opened on first use (thread-safe); NULL when libcuda.so.1
 * cannot be opened or lacks a symbol: then why[0..n) says so (the
 * dlerror text). Never closed. */
const rt_cuda_api *rt_cuda_api_get(char *why, size_t n);

/* Checks one driver call: false with the diagnostic
 * "<what>: <CUDA_ERROR_NAME>: <description>" on ctx when r is not
 * CUDA_SUCCESS. `what` names the call and its purpose, e.g.
 * "cuMemAlloc(1.2 GiB for the WORK arena)". */
bool rt_cu_check(const rt_cuda_api *api, dsc_context *ctx, CUresult r, const char *what_fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* "CUDA_ERROR_X: description" of r into buf. */
void rt_cu_error_text(const rt_cuda_api *api, CUresult r, char *buf, size_t n);
#endif /* DSC_HAVE_CUDA */

/* "1.2 GiB", "512 KiB", "12 bytes". */
void rt_format_bytes(char *buf, size_t n, int64_t bytes);

/* Whether a CUDA device can be used here: false with why[0..n) ("no CUDA
 * driver (...)", "no CUDA device", "built without CUDA"). *arch (optional)
 * receives device 0's compute capability as major*10+minor (90 on H100/H200). */
bool rt_cuda_probe(char *why, size_t n, int *arch);

/* ======================= runtime/exec_cuda.c =======================
 * Runs the lowered programs (codegen/codegen.h) of a module on GPU 0
 * through the driver API: one STATE arena (every param and state, layout
 * cg_state_layout) and one WORK arena (the largest program's; a run's work
 * does not outlive it) allocated with cuMemAlloc as the programs size them;
 * each program's kernels NVRTC-compiled into one cubin (cached on disk by
 * source hash) and loaded as one module; GEMMs through cuBLASLt plans with a
 * 32 MiB workspace; embedding gradients by a small kernel of its own;
 * three streams (compute, comm, copy) with events ordering the input
 * copies, the compute and the output copies. Not thread-safe. */
typedef struct rt_cuda_exec rt_cuda_exec;

/* Compiling, separate from any device (testable without a GPU): the cubin
 * of program p's kernels for sm_<arch> (malloc'd; free()), from the kernel
 * cache in cache_dir when present there (*from_cache), else compiled by
 * NVRTC and stored there (cache_dir NULL: no cache). A program without
 * kernels gives *cubin NULL and DSC_OK. */
dsc_status rt_cuda_compile_program(dsc_context *ctx, ir_arena *a, const cg_program *p, int arch,
                                   const char *cache_dir, void **cubin, size_t *len,
                                   bool *from_cache);
/* The executor's own kernels (embedding gradient accumulation, f32
 * scratch conversions), compiled the same way. */
dsc_status rt_cuda_compile_helpers(dsc_context *ctx, int arch, const char *cache_dir,
                                   void **cubin, size_t *len, bool *from_cache);
/* NVRTC compile of source with the on-disk cache (the key: a hash of the
 * source, the arch and the dsc and NVRTC versions). */
dsc_status rt_cuda_compile_cached(dsc_context *ctx, const char *source, const char *name, int arch,
                                  const char *cache_dir, void **cubin, size_t *len,
                                  bool *from_cache);

/* Lowers every graph of m (fused: see include/dsc/exec.h), opens the
 * driver and device 0, compiles and loads the kernels and allocates the
 * arenas. Errors (DSC_ERR_USER for "no CUDA driver", "no CUDA device", a
 * program the backend cannot run, out of device memory) are diagnostics on
 * m's context. */
dsc_status rt_cuda_exec_new(dsc_module *m, const char *cache_dir, rt_cuda_exec **out);
void rt_cuda_exec_free(rt_cuda_exec *e);
/* Params and states in (doubles -> each one's dtype) and out; p must
 * match the module (the caller checks). */
dsc_status rt_cuda_exec_set_params(rt_cuda_exec *e, const dsc_params *p);
dsc_status rt_cuda_exec_get_params(rt_cuda_exec *e, dsc_params *p);
/* Runs graph gi of the module as dsc_exec_run does (graph named `graph`). */
dsc_status rt_cuda_exec_run(rt_cuda_exec *e, int gi, const dsc_tensor *const *inputs, int n_inputs,
                            dsc_tensor **outputs);
/* Binds the communicator of the collectives; moves the executor to the
 * rank's GPU (rank % devices, or $DSC_CUDA_DEVICE) with its params when it
 * is on another: DSC_ERR_USER when that fails. */
dsc_status rt_cuda_exec_set_comm(rt_cuda_exec *e, dsc_comm *comm);
void rt_cuda_exec_set_profiling(rt_cuda_exec *e, bool on);
dsc_status rt_cuda_exec_print_profile(rt_cuda_exec *e, int gi, int top, FILE *out);
/* Kernels NVRTC compiled (not from the cache) and cubins from the cache. */
void rt_cuda_exec_kernel_counts(const rt_cuda_exec *e, int *compiled, int *cached);
/* Bytes allocated on the device: the arenas, the cuBLASLt workspace and
 * the helper kernels' scratch (everything a run uses is allocated up front). */
int64_t rt_cuda_exec_device_bytes(const rt_cuda_exec *e);

#ifdef __cplusplus
}
#endif
#endif
