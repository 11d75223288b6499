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

#include "program/program.h"
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

/* Opens the driver and the device ($DSC_CUDA_DEVICE, else 0), loads the
 * compile step's cubins of c (made for that device's SM, rt_cuda_device_arch;
 * not owned, must outlive the executor) and allocates the arenas. Errors
 * (DSC_ERR_USER for "no CUDA driver", "no CUDA device", a program the
 * backend cannot run, out of device memory) are diagnostics on m's
 * context. */
dsc_status rt_cuda_exec_new(dsc_module *m, const cg_compiled_module *c, rt_cuda_exec **out);
/* The SM (major * 10 + minor) of the device rt_cuda_exec_new would use,
 * with its messages when there is no driver or no such device. */
dsc_status rt_cuda_device_arch(dsc_context *ctx, int *arch);
void rt_cuda_exec_free(rt_cuda_exec *e);
/* Params and states in (doubles -> each one's dtype) and out; p must
 * match the module (the caller checks). */
dsc_status rt_cuda_exec_set_params(rt_cuda_exec *e, const dsc_params *p);
dsc_status rt_cuda_exec_get_params(rt_cuda_exec *e, dsc_params *p);
/* Param or state i alone in. */
dsc_status rt_cuda_exec_set_param(rt_cuda_exec *e, int i, const dsc_tensor *t);
/* Runs graph gi of the module as dsc_exec_run does (graph named `graph`). */
dsc_status rt_cuda_exec_run(rt_cuda_exec *e, int gi, const dsc_tensor *const *inputs, int n_inputs,
                            dsc_tensor **outputs);
/* Binds the communicator of the collectives; moves the executor to the
 * rank's GPU (rank % devices, or $DSC_CUDA_DEVICE) with its params when it
 * is on another: DSC_ERR_USER when that fails. */
dsc_status rt_cuda_exec_set_comm(rt_cuda_exec *e, dsc_comm *comm);
void rt_cuda_exec_set_profiling(rt_cuda_exec *e, bool on);
dsc_status rt_cuda_exec_print_profile(rt_cuda_exec *e, int gi, int top, FILE *out);
dsc_status rt_cuda_exec_phase_times(rt_cuda_exec *e, int gi, dsc_phase_times *out);
/* Bytes allocated on the device: the arenas, the cuBLASLt workspace and
 * the helper kernels' scratch (everything a run uses is allocated up front). */
int64_t rt_cuda_exec_device_bytes(const rt_cuda_exec *e);

/* ======================= runtime/cublaslt.c (DSC_HAVE_CUDA) =======================
 * A cg_gemm as cuBLASLt descriptors. dsc is row-major, cuBLASLt
 * column-major: a row-major X (r x c, row stride ld) read column-major is
 * X^T (c x r, ld). So for a row-major C the plan computes
 *   C^T (n x m) = B^T (n x k) . A^T (k x m)
 * i.e. cuBLASLt's A is dsc's B and its B is dsc's A, no data moved. Per
 * operand, a unit column stride is a column-major X^T (op N), a unit row
 * stride a column-major X (op T); a C with unit row stride is column-major
 * already and the operands are not swapped. The two batch dims collapse to
 * one strided batch when batch_stride[0] == batch[1] * batch_stride[1] for
 * every operand (or one of them is 1); otherwise the plan keeps batch[0] as
 * an outer loop (outer_count > 1) run as separate matmuls. Stride-0 batch
 * strides (broadcast A or B) are kept as cuBLASLt strided batches. */
typedef enum {
  RT_GEMM_F32,  /* f32 in/out, f32 compute */
  RT_GEMM_TF32, /* f32 in/out, TF32 tensor cores */
  RT_GEMM_BF16, /* bf16 A, B; C bf16 or f32; f32 accumulation */
  RT_GEMM_F16,  /* f16 A, B; C f16 or f32; f32 accumulation */
} rt_gemm_precision;

typedef struct {
  void *desc;               /* cublasLtMatmulDesc_t */
  void *layout[3];          /* cublasLtMatrixLayout_t of cuBLASLt's A, B, C (= D) */
  bool swapped;             /* cuBLASLt A = dsc B (row-major C) */
  int trans[2];             /* cublasOperation_t of cuBLASLt's A, B */
  int64_t rows[3], cols[3], ld[3]; /* layouts as created (column-major) */
  int64_t batch_count;      /* the strided batch of each launch */
  int64_t batch_stride[3];  /* cuBLASLt A, B, C, elements */
  int64_t outer_count;      /* matmuls per run (1 when the batch dims collapsed) */
  int64_t outer_stride[3];  /* per outer step: cuBLASLt A, B, C, elements */
  int64_t offset[3];        /* element offsets into the buffers: cuBLASLt A, B, C */
  size_t elem_size[3];
  float alpha, beta;
  uint64_t algo[8];         /* cublasLtMatmulAlgo_t, chosen on the first run */
  bool has_algo;
} rt_cublaslt_plan;

/* Fills plan for g with A, B of dtype ab and C of dtype c (see
 * rt_gemm_precision for the combinations). Needs no GPU. Every cuBLASLt
 * status is checked; the failing call is named in the diagnostic. On
 * failure nothing is left allocated. */
dsc_status rt_cublaslt_plan_init(dsc_context *ctx, const cg_gemm *g, dsc_dtype ab, dsc_dtype c,
                                 rt_gemm_precision prec, rt_cublaslt_plan *plan);
void rt_cublaslt_plan_destroy(rt_cublaslt_plan *plan);
/* Runs the plan (needs a device): handle is a cublasLtHandle_t, stream a
 * cudaStream_t, a/b/c the buffers' base device pointers (the plan adds the
 * operand offsets), workspace optional. Picks the algorithm by heuristic on
 * the first call. */
dsc_status rt_cublaslt_run(dsc_context *ctx, rt_cublaslt_plan *plan, void *handle, void *stream,
                           const void *a, const void *b, void *c, void *workspace,
                           size_t workspace_bytes);

#ifdef __cplusplus
}
#endif
#endif
