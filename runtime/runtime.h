/* runtime/: the layer's internal vocabulary, sectioned by source file.
 * The public view is include/dsc/runtime.h. */
#ifndef DSC_RUNTIME_INTERNAL_H
#define DSC_RUNTIME_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dsc/comm.h"
#include "dsc/runtime.h"
#include "ir/ir.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ======================= runtime/fileio.c ======================= */
/* Diagnostics about a file read "path: error: ...". */
dsc_loc rt_loc(const char *path);
/* Reports errno's text for an operation on path; returns DSC_ERR_USER. */
dsc_status rt_io_error(dsc_context *ctx, const char *path, const char *what);

/* A file written under a temporary name in the destination's directory and
 * renamed over it only once everything is on disk. Any failure reports a
 * diagnostic once, removes the temporary and leaves the destination alone. */
typedef struct {
  dsc_context *ctx;
  const char *path; /* destination */
  char *tmp;        /* temporary path (context allocator) */
  size_t tmp_size;
  int fd;
  bool failed;
} rt_atomic_file;

dsc_status rt_atomic_open(dsc_context *ctx, const char *path, rt_atomic_file *f);
bool rt_atomic_write(rt_atomic_file *f, const void *buf, size_t n);
/* fsync, close, rename into place, fsync the directory. */
dsc_status rt_atomic_commit(rt_atomic_file *f);
void rt_atomic_abort(rt_atomic_file *f);
/* Makes a directory entry change (rename, create) durable. */
dsc_status rt_fsync_dir(dsc_context *ctx, const char *dir);
/* The directory holding path ("." when it has no slash), context-allocated;
 * free with ir_free(ctx, p, strlen(p) + 1). */
char *rt_parent_dir(dsc_context *ctx, const char *path);
/* Reads exactly n bytes at offset; false on a short read or an I/O error. */
bool rt_pread_full(int fd, void *buf, size_t n, uint64_t offset);
char *rt_strdup(dsc_context *ctx, const char *s); /* free: ir_free(ctx, s, strlen(s) + 1) */

/* ======================= runtime/data.c ======================= */
typedef struct dsc_loader rt_loader;
struct dsc_loader {
  dsc_context *ctx;
  char *path;
  uint16_t *tokens;
  int64_t n_tokens;
  int64_t B, T, windows;
  uint64_t seed;
  dsc_loader_mode mode;
  int64_t *order;      /* this epoch's window order (shuffle mode) */
  int64_t order_epoch; /* the epoch `order` was drawn for; -1: none */
  dsc_loader_pos pos;
};
/* Fills order[0..windows) with epoch's permutation of the window indices:
 * Fisher-Yates driven by xoshiro256** seeded from (seed, epoch). */
void rt_loader_permutation(uint64_t seed, int64_t epoch, int64_t *order, int64_t windows);

/* ======================= runtime/safetensors.c ======================= */
/* The safetensors dtype name of a dsc dtype ("F32", "BF16", "BOOL", ...). */
const char *rt_st_dtype_name(dsc_dtype dt);
bool rt_st_dtype_from_name(const char *name, dsc_dtype *out);
/* IEEE binary16 and bfloat16 bit patterns, rounded to nearest even directly
 * from the double (no double rounding through f32); NaN stays NaN. */
uint16_t rt_f16_bits(double x);
uint16_t rt_bf16_bits(double x);
double rt_f16_value(uint16_t bits);
double rt_bf16_value(uint16_t bits);
/* A library-owned tensor set: the public part first, then its arena. */
typedef struct {
  dsc_tensor_set pub;
  ir_arena arena; /* names, arrays, metadata strings */
} rt_tensor_set;
rt_tensor_set *rt_tensor_set_new(dsc_context *ctx, int n, int n_meta);

/* ======================= runtime/checkpoint.c ======================= */
typedef struct {
  dsc_checkpoint pub;
  ir_arena arena; /* dir and extra key/values */
} rt_checkpoint;

/* ======================= runtime/comm.c =======================
 * The communicator's backend-independent part: argument checks, collective
 * numbering, messages, blocking wrappers; each backend is one vtable. */
typedef enum {
  RT_COMM_ALL_REDUCE,
  RT_COMM_REDUCE_SCATTER,
  RT_COMM_ALL_GATHER,
  RT_COMM_BROADCAST,
  RT_COMM_BARRIER,
} rt_comm_kind;

/* One collective as a rank started it. count is the caller's count. */
typedef struct {
  rt_comm_kind kind;
  dsc_dtype dtype;
  dsc_comm_op op;
  int64_t count;
  int root;
  int64_t tag;
  const void *send;
  void *recv; /* broadcast: the buffer */
} rt_comm_args;

typedef struct {
  const char *name;
  /* Starts req (args and seq filled in); may set req->impl. On failure the
   * backend has reported the error; the request is then freed by comm.c. */
  dsc_status (*start)(dsc_comm_request *req);
  dsc_status (*wait)(dsc_comm_request *req);
  /* Forgets a request that will never be waited (its comm is being freed). */
  void (*release)(dsc_comm_request *req);
  void (*abort)(dsc_comm *c, const char *reason);
  void (*free)(dsc_comm *c); /* backend state (not the dsc_comm itself) */
} rt_comm_backend;

struct dsc_comm {
  const rt_comm_backend *be;
  dsc_context *ctx;
  int rank, world;
  double timeout; /* seconds */
  int64_t seq;    /* the number of the next collective */
  bool broken;
  int n_pending; /* requests started and not yet waited */
  dsc_comm_request *pending; /* doubly linked, newest first */
  void *impl;
};

struct dsc_comm_request {
  dsc_comm *comm;
  rt_comm_args a;
  int64_t seq;
  dsc_comm_request *prev, *next;
  void *impl;
};

const char *rt_comm_kind_name(rt_comm_kind k);
/* Fills the fields every backend shares; reads DSC_COMM_TIMEOUT (an invalid
 * value is a DSC_ERR_USER diagnostic on ctx). */
dsc_status rt_comm_init(dsc_comm *c, const rt_comm_backend *be, dsc_context *ctx, int rank,
                        int world);
/* Frees every request never waited (through be->release). */
void rt_comm_release_pending(dsc_comm *c);
/* "all_reduce #7 (step 3)" */
void rt_comm_describe(const dsc_comm_request *req, char *buf, size_t n);
/* Elements this rank receives into recv; the reduction's input length. */
int64_t rt_comm_recv_count(const dsc_comm *c, const rt_comm_args *a);
/* dst[i] += src[i] in the dtype's own arithmetic (integers wrap). */
void rt_comm_accumulate(void *dst, const void *src, int64_t count, dsc_dtype dt);
/* buf[i] /= world (float dtypes). */
void rt_comm_divide(void *buf, int64_t count, dsc_dtype dt, int world);
/* Seconds on CLOCK_MONOTONIC. */
double rt_comm_now(void);

/* ======================= runtime/comm_inproc.c ======================= */
extern const rt_comm_backend rt_comm_inproc_backend;

/* ======================= runtime/comm_mpi.c =======================
 * Without DSC_HAVE_MPI only a stub that reports "built without MPI". */
bool rt_comm_mpi_available(void);
dsc_status rt_comm_mpi_new(dsc_context *ctx, dsc_comm **out);

#ifdef __cplusplus
}
#endif
#endif
