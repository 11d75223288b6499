/* runtime/nccl_api.h: NCCL opened at run time, for the cuda backend's
 * collectives (runtime/exec_cuda.c).
 *
 * Why dlopen, as runtime/cuda_api.h for the driver: dsc must build and run
 * its other paths where NCCL is absent, and NCCL lives in different places
 * (the toolkit's lib64, PyTorch's nvidia-nccl wheel). The types below
 * mirror nccl.h's ABI (stable across NCCL 2.x: enums are ints, the unique
 * id 128 bytes, streams are CUstream), so no nccl.h is needed to build:
 * this file compiles with or without the CUDA toolkit. */
#ifndef DSC_RUNTIME_NCCL_API_H
#define DSC_RUNTIME_NCCL_API_H

#include <stdbool.h>
#include <stddef.h>

#include "program/program.h"
#include "dsc/core.h"

#ifdef __cplusplus
extern "C" {
#endif

#define RT_NCCL_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[RT_NCCL_UNIQUE_ID_BYTES];
} rt_nccl_unique_id;
typedef struct rt_nccl_comm_s *rt_nccl_comm; /* ncclComm_t */
typedef int rt_nccl_result;                  /* ncclResult_t */

/* nccl.h's values */
enum {
  RT_NCCL_SUCCESS = 0,
  RT_NCCL_IN_PROGRESS = 7,
  RT_NCCL_INT8 = 0,
  RT_NCCL_UINT8 = 1,
  RT_NCCL_INT32 = 2,
  RT_NCCL_INT64 = 4,
  RT_NCCL_FLOAT16 = 6,
  RT_NCCL_FLOAT32 = 7,
  RT_NCCL_FLOAT64 = 8,
  RT_NCCL_BFLOAT16 = 9,
  RT_NCCL_SUM = 0,
  RT_NCCL_AVG = 4, /* NCCL >= 2.10 */
};

/* ======================= runtime/nccl_api.c =======================
 * One pointer per NCCL entry point dsc uses (streams as void *: a
 * CUstream). */
typedef struct {
  rt_nccl_result (*GetVersion)(int *);
  rt_nccl_result (*GetUniqueId)(rt_nccl_unique_id *);
  rt_nccl_result (*CommInitRank)(rt_nccl_comm *, int, rt_nccl_unique_id, int);
  rt_nccl_result (*CommDestroy)(rt_nccl_comm);
  rt_nccl_result (*CommAbort)(rt_nccl_comm);
  rt_nccl_result (*AllReduce)(const void *, void *, size_t, int, int, rt_nccl_comm, void *);
  rt_nccl_result (*ReduceScatter)(const void *, void *, size_t, int, int, rt_nccl_comm, void *);
  rt_nccl_result (*AllGather)(const void *, void *, size_t, int, rt_nccl_comm, void *);
  rt_nccl_result (*Broadcast)(const void *, void *, size_t, int, int, rt_nccl_comm, void *);
  rt_nccl_result (*GroupStart)(void);
  rt_nccl_result (*GroupEnd)(void);
  rt_nccl_result (*Send)(const void *, size_t, int, int, rt_nccl_comm, void *); /* >= 2.7 */
  rt_nccl_result (*Recv)(void *, size_t, int, int, rt_nccl_comm, void *);
  const char *(*GetErrorString)(rt_nccl_result);
  rt_nccl_result (*CommGetAsyncError)(rt_nccl_comm, rt_nccl_result *);
  int version; /* ncclGetVersion's, e.g. 22805 */
  char path[512]; /* the library that was opened */
} rt_nccl_api;

/* Opens the library at `path` (a file name dlopen searches for, or a path)
 * into *out and checks it has every symbol: false with why[0..n) ("<path>:
 * <dlerror>", "<path> has no ncclAllReduce (not NCCL, or one too old)")
 * otherwise. Not cached; the handle of a library that loaded stays open. */
bool rt_nccl_api_open(const char *path, rt_nccl_api *out, char *why, size_t n);

/* NCCL for the process, opened on the first success and then kept
 * (thread-safe; a failure is not cached, so a later call retries). Tries
 * $DSC_LIBNCCL alone when it is set; otherwise "libnccl.so.2" (the loader's
 * path), the CUDA toolkit's lib64 ($CUDA_HOME, /usr/local/cuda), then the
 * nvidia/nccl/lib dir of the nvidia-nccl wheel (PyTorch's) in a few fixed
 * python site-packages roots ($VIRTUAL_ENV, /opt/torch/.venv, /usr/local,
 * /usr, ~/.local). NULL when none loads: why[0..n) lists every attempt. */
const rt_nccl_api *rt_nccl_api_get(char *why, size_t n);
/* The same search into *out, never cached (tests: a bad $DSC_LIBNCCL). */
bool rt_nccl_api_find(rt_nccl_api *out, char *why, size_t n);

/* "ncclInvalidUsage: <NCCL's text>" of r into buf (api may be NULL). */
void rt_nccl_error_text(const rt_nccl_api *api, rt_nccl_result r, char *buf, size_t n);
/* Checks one NCCL call: false with "<what>: <error text>" on ctx. */
bool rt_nccl_check(const rt_nccl_api *api, dsc_context *ctx, rt_nccl_result r,
                   const char *what_fmt, ...) __attribute__((format(printf, 4, 5)));

/* NCCL's data type of dt (bool travels as uint8): false for none. */
bool rt_nccl_dtype(dsc_dtype dt, int *out);

/* Whether the collectives of program p (sound: cg_program_verify) can run
 * on NCCL: dtypes NCCL has (a sum of bool: no), ops sum and mean (mean:
 * NCCL >= 2.10), and NCCL loadable (rt_nccl_api_get). A diagnostic
 * "backend cuda: program 'G': instruction I: ..." on ctx otherwise. True
 * for a program without collectives (NCCL is not opened then). */
bool rt_nccl_check_program(dsc_context *ctx, const cg_program *p);

#ifdef __cplusplus
}
#endif
#endif
