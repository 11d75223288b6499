/* runtime/: the layer's internal vocabulary, sectioned by source file.
 * The public view is include/dsc/runtime.h. */
#ifndef DSC_RUNTIME_INTERNAL_H
#define DSC_RUNTIME_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "dsc/comm.h"
#include "dsc/exec.h"
#include "dsc/runtime.h"
#include "dsc/trace.h"
#include "ir/ir.h"
#include "program/program.h"

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
 * diagnostic once, removes the temporary and leaves the destination alone.
 * Renames go only over a regular file or nothing: a symbolic link to a
 * regular file replaces the file it names (the link stays); a character
 * device (/dev/null, a terminal) or a FIFO is written straight into, with no
 * temporary; a directory, block device or socket is refused. */
typedef struct {
  dsc_context *ctx;
  const char *path; /* destination as given (diagnostics) */
  const char *dest; /* what is renamed over: path or a link's target */
  char *tmp;        /* temporary path (context allocator) */
  size_t tmp_size;
  int fd;
  bool failed;
  bool direct; /* a device or FIFO: written in place */
} rt_atomic_file;

dsc_status rt_atomic_open(dsc_context *ctx, const char *path, rt_atomic_file *f);
bool rt_atomic_write(rt_atomic_file *f, const void *buf, size_t n);
/* fsync, close, rename into place, fsync the directory. */
dsc_status rt_atomic_commit(rt_atomic_file *f);
void rt_atomic_abort(rt_atomic_file *f);
/* The whole of a regular file of at most max bytes, NUL-terminated, from
 * the context's allocator (free with ir_free(ctx, *text, *len + 1)). */
dsc_status rt_read_small(dsc_context *ctx, const char *path, uint64_t max, char **text,
                         size_t *len);
/* Makes a directory entry change (rename, create) durable. */
dsc_status rt_fsync_dir(dsc_context *ctx, const char *dir);
/* The directory holding path ("." when it has no slash), context-allocated;
 * free with ir_free(ctx, p, strlen(p) + 1). */
char *rt_parent_dir(dsc_context *ctx, const char *path);
/* "a FIFO", "a directory", "a character device", ... for a st_mode. */
const char *rt_file_kind(unsigned mode);
/* Opens an input read-only (plus flags, e.g. O_NOFOLLOW) only when it is a
 * regular file, probing with O_NONBLOCK so a FIFO never blocks the open.
 * The _fd form returns the descriptor, or -1 with errno set and *kind the
 * kind of file when that was the reason. rt_open_regular reports
 * "path: error: not a regular file (a FIFO)" or errno's text. */
int rt_open_regular_fd(const char *path, int flags, const char **kind);
dsc_status rt_open_regular(dsc_context *ctx, const char *path, int flags, int *fd);
/* Reads exactly n bytes at offset; false on a short read or an I/O error. */
bool rt_pread_full(int fd, void *buf, size_t n, uint64_t offset);
char *rt_strdup(dsc_context *ctx, const char *s); /* free: ir_free(ctx, s, strlen(s) + 1) */

/* ======================= runtime/data.c ======================= */
/* Offset of the first byte of s that is not valid UTF-8; len when all is
 * (runtime/tokenizer.c). */
size_t rt_utf8_valid_prefix(const char *s, size_t len);
/* The token count a shard's header states (false: not a shard, unreadable);
 * the full check is dsc_shard_read's. */
bool rt_shard_peek(const char *path, int64_t *n_tokens);
typedef struct dsc_loader rt_loader;
struct dsc_loader {
  dsc_context *ctx;
  char *path;
  uint32_t *tokens;
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
/* A library-owned tensor set: the public part first, then its arena. */
typedef struct {
  dsc_tensor_set pub;
  ir_arena arena; /* names, arrays, metadata strings */
  int cap;        /* slots in pub.names / pub.tensors (appends double it) */
} rt_tensor_set;
rt_tensor_set *rt_tensor_set_new(dsc_context *ctx, int n, int n_meta);
/* Adds t (owned by the set from now on) under a copy of name to a set from
 * rt_tensor_set_new or a reader. False when out of memory. */
bool rt_tensor_set_append(dsc_tensor_set *s, const char *name, dsc_tensor *t);
/* at[i] = the index in s of the tensor named names[i] (the first of that
 * name), -1 for none: O((n + s->n) log s->n). False when out of memory. */
bool rt_tensor_set_lookup(dsc_context *ctx, const dsc_tensor_set *s, const char *const *names,
                          int n, int *at);
/* ======================= runtime/hf.c ======================= */
struct cJSON;
/* A JSON object from a file of at most 64 MiB; a syntax error names its line
 * and column. */
dsc_status rt_read_json(dsc_context *ctx, const char *path, struct cJSON **out);
/* j printed (tab-indented, a final newline) into path through rt_atomic_file. */
dsc_status rt_write_json(dsc_context *ctx, const char *path, const struct cJSON *j);

/* A safetensors file opened for reading tensor by tensor: the header read
 * and checked as dsc_safetensors_read checks it, no data read yet (an
 * import reads only the tensors it needs, one at a time). */
typedef struct rt_st_file rt_st_file;
dsc_status rt_st_open(dsc_context *ctx, const char *path, rt_st_file **out);
void rt_st_close(rt_st_file *f); /* NULL: nothing */
int rt_st_count(const rt_st_file *f);
const char *rt_st_name(const rt_st_file *f, int i);
dsc_type rt_st_type(const rt_st_file *f, int i); /* the file's dtype and shape */
const char *rt_st_meta(const rt_st_file *f, const char *key);
int rt_st_find(const rt_st_file *f, const char *name); /* -1: none */
/* Tensor i's values, converted to doubles, into dst (numel of its type). */
dsc_status rt_st_read(rt_st_file *f, int i, double *dst);
/* Its elements [first, first + count) (row-major) only: one pread of their
 * bytes (ZeRO-3 imports read a rank's chunk). */
dsc_status rt_st_read_range(rt_st_file *f, int i, int64_t first, int64_t count, double *dst);
/* The tensor bytes the reads above took from the file so far. */
int64_t rt_st_bytes_read(const rt_st_file *f);

/* ======================= runtime/rundir.c =======================
 * One writer per run directory: flock on RUN/.lock, which holds the
 * holder's pid. The kernel releases it when the holder exits or dies. */
typedef struct rt_run_lock rt_run_lock;
/* Takes the lock or fails with "run directory DIR is in use by dsc (pid N)";
 * then removes every leftover of an interrupted save in dir (no live
 * writer owns one now), with a note for each. */
dsc_status rt_run_lock_take(dsc_context *ctx, const char *dir, rt_run_lock **out);
void rt_run_lock_release(rt_run_lock *l); /* NULL: nothing */
/* DSC_OK when dir is still the directory whose lock l holds (NULL l: no
 * lock, nothing to check); an error naming dir when it was moved, removed
 * or replaced since (a save must not write into a directory it does not own). */
dsc_status rt_run_lock_check(const rt_run_lock *l, const char *dir);
/* Removes dir's ".step-N.tmp-PID" directories and ".latest.tmp-PID" links
 * (all of them, or only those whose process is gone), each with a note;
 * returns how many. */
int rt_run_clean_stale(dsc_context *ctx, const char *dir, bool all);
/* Removes a directory of plain files (never following a symbolic link in
 * its place); true when it is gone (or was never there). */
bool rt_remove_flat_dir(const char *dir);

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
  RT_COMM_ALL_TO_ALL,
  RT_COMM_ALL_TO_ALL_V,
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
  /* all_to_all_v: per peer, in elements (the request's own copy, freed with
   * it): send_counts, send_displs, recv_counts, recv_displs, world each. */
  int64_t *v;
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
  /* Makes this rank's sub-communicator of parent (dsc_comm_split), after
   * comm.c has gathered every rank's (color, key): members[0..n) are the
   * parent ranks of the new group in its rank order (this rank is
   * members[rank]). Called on every rank of parent, also with color < 0
   * (n = 0: no group; *out stays NULL). Fills *out (allocated here). */
  dsc_status (*split)(dsc_comm *parent, int color, int key, const int *members, int n, int rank,
                      const char *name, dsc_comm **out);
} rt_comm_backend;

struct dsc_comm {
  const rt_comm_backend *be;
  dsc_context *ctx;
  int rank, world;
  int local_rank, local_world; /* within this rank's node (dsc_comm_local_rank) */
  /* A group (dsc_comm_split) names itself and its ranks in the job's world:
   * messages say "rank 5 (ep rank 1)"; NULL world_ranks: the world itself. */
  char name[24];
  int *world_ranks; /* [world] */
  dsc_mesh *mesh;   /* its groups by axis name (dsc_mesh_new on this communicator) */
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
/* DSC_COMM_TIMEOUT into *seconds when set; false (unchanged) when invalid. */
bool rt_comm_env_timeout(double *seconds);
/* Frees every request never waited (through be->release). */
void rt_comm_release_pending(dsc_comm *c);
/* "all_reduce #7 (step 3)"; in a group "ep all_to_all #2 (step 3)". */
void rt_comm_describe(const dsc_comm_request *req, char *buf, size_t n);
/* This rank as messages name it: "rank 5", or "rank 5 (ep rank 1)" in a group. */
const char *rt_comm_who(const dsc_comm *c, char *buf, size_t n);
/* The job's rank of group rank r. */
int rt_comm_world_rank(const dsc_comm *c, int r);
/* Fills the shared fields of a group made by a backend's split (name,
 * world_ranks from the parent's, timeout); false when out of memory. */
bool rt_comm_init_group(dsc_comm *g, const dsc_comm *parent, const rt_comm_backend *be,
                        const int *members, int n, int rank, const char *name);
/* Frees what rt_comm_init_group allocated. */
void rt_comm_fini_group(dsc_comm *g);
/* Elements of send this rank's all_to_all(_v) reads (from its start). */
int64_t rt_comm_a2a_send_extent(int world, const rt_comm_args *a);
/* Elements this rank receives into recv; the reduction's input length. */
int64_t rt_comm_recv_count(const dsc_comm *c, const rt_comm_args *a);
/* dst[i] += src[i] in the dtype's own arithmetic (integers wrap). */
void rt_comm_accumulate(void *dst, const void *src, int64_t count, dsc_dtype dt);
/* buf[i] /= world (float dtypes). */
void rt_comm_divide(void *buf, int64_t count, dsc_dtype dt, int world);
/* Seconds on CLOCK_MONOTONIC. */
double rt_comm_now(void);

/* ======================= runtime/interp_comm.c =======================
 * The interpreter's collectives (ir_collectives) over a dsc_comm. */
extern const ir_collectives rt_interp_collectives;

/* ======================= runtime/comm_inproc.c ======================= */
extern const rt_comm_backend rt_comm_inproc_backend;

/* ======================= runtime/comm_mpi.c =======================
 * Without DSC_HAVE_MPI only a stub that reports "built without MPI". */
bool rt_comm_mpi_available(void);
dsc_status rt_comm_mpi_new(dsc_context *ctx, dsc_comm **out);

/* ======================= runtime/threadpool.c =======================
 * A fixed team for parallel loops: the calling thread runs chunk 0 and
 * n_threads - 1 workers run the others. Where the library is built with
 * OpenMP (as oneDNN is), the workers are OpenMP's team, so that oneDNN's
 * GEMMs and our kernels share one team instead of two teams spinning on
 * the same cores; elsewhere a pthread team whose workers spin briefly after
 * a job, then sleep on a condition variable. The split is static and even
 * (the same n, min_chunk and thread count always give the same chunks), so
 * results never depend on timing. A job allocates nothing. Not reentrant:
 * fn must not call rt_pool_parallel_for on the same pool. */
typedef struct rt_pool rt_pool;
/* Runs indices [begin, end); chunk is the chunk's number in
 * [0, rt_pool_threads) (per-chunk scratch and status slots). */
typedef void (*rt_range_fn)(void *arg, int64_t begin, int64_t end, int chunk);
/* n_threads >= 1 (1: everything runs inline). NULL with a diagnostic on
 * failure. */
rt_pool *rt_pool_new(dsc_context *ctx, int n_threads);
/* The pthread team even where OpenMP is available (tests cover both). */
rt_pool *rt_pool_new_pthreads(dsc_context *ctx, int n_threads);
bool rt_pool_is_openmp(const rt_pool *p);
void rt_pool_free(rt_pool *p);
int rt_pool_threads(const rt_pool *p);
/* Splits [0, n) into at most n_threads chunks of at least min_chunk
 * indices (except when n itself is smaller) and returns when all ran. */
void rt_pool_parallel_for(rt_pool *p, int64_t n, int64_t min_chunk, rt_range_fn fn, void *arg);
/* The chunk bounds rt_pool_parallel_for uses: number of chunks for n. */
int rt_pool_chunks(const rt_pool *p, int64_t n, int64_t min_chunk);

/* ======================= runtime/gemm_cpu.c =======================
 * GEMMs of a cg_program (codegen/codegen.h cg_gemm): a plan is built once
 * at program load and run many times. With DSC_HAVE_LLVM the plan is a
 * oneDNN matmul primitive over strided memory descriptors (transposes,
 * slices and broadcast batches are strides; alpha is an output scale, beta
 * a sum post-op); shapes oneDNN refuses, and builds without oneDNN, use a
 * blocked C loop on the pool. Debian's oneDNN 2.6 threads with OpenMP:
 * each run sets the calling thread's OpenMP thread count to the pool's.
 * f32 and bf16 GEMMs on AVX2 and AVX-512 hosts take runtime/sgemm.c
 * instead (any build). */
typedef struct rt_gemm_engine rt_gemm_engine;
typedef struct rt_gemm_plan rt_gemm_plan;
/* One per executor (oneDNN engine and stream); pool must outlive it. */
rt_gemm_engine *rt_gemm_engine_new(dsc_context *ctx, rt_pool *pool);
void rt_gemm_engine_free(rt_gemm_engine *e);
/* Resident bytes of the engine's packing scratch (rt_sgemm's; not oneDNN's own). */
int64_t rt_gemm_engine_scratch_resident(const rt_gemm_engine *e);
/* plan flags: always the C loop (tests); bf16 through vdpbf16ps where the
 * host has AVX512-BF16 (opt-in: on this Sapphire Rapids it runs at
 * 0.55-0.9x of the converting kernel, runtime/sgemm.c) */
enum { RT_GEMM_NO_LIBRARY = 1, RT_GEMM_DPBF16 = 2 };
/* ab: dtype of A and B (f32 f64 bf16 f16), c: dtype of C (float dtypes).
 * NULL with a diagnostic when the GEMM is malformed. */
rt_gemm_plan *rt_gemm_plan_new(rt_gemm_engine *e, const cg_gemm *g, dsc_dtype ab,
                               dsc_dtype c, int flags);
void rt_gemm_plan_free(rt_gemm_plan *p);
/* a, b, c: the operands' buffer base pointers (the plan adds each
 * cg_matrix offset). False (with err) only if the library fails at run. */
bool rt_gemm_run(rt_gemm_plan *p, const void *a, const void *b, void *c, char *err,
                 size_t errlen);
/* "dsc:sgemm-avx512", "dsc:sgemm-avx2" (with "-bf16" for bf16 operands
 * widened to f32), "dsc:sgemm-avx512-dpbf16",
 * "onednn:<implementation>" or "loop" (tests, profiles). */
const char *rt_gemm_plan_impl(const rt_gemm_plan *p);

/* ======================= runtime/sgemm.c =======================
 * dsc's packed GEMM (an AVX-512 12x32 or an AVX2 6x16 f32 microkernel) for
 * any strided cg_gemm with f32 or bf16 operands (widened to f32 while
 * packing) and an f32 or bf16 C (rounded once, to nearest even), threaded
 * on the pool by whole micro-panels or batches, never by K: the result is
 * bitwise identical for any thread count. gemm_cpu.c's plans use it where
 * rt_sgemm_supported() and rt_sgemm_dtypes_supported(). */
bool rt_sgemm_supported(void); /* for cg_cpu_isa_get() ($DSC_CPU_ISA) */
bool rt_sgemm_isa_supported(cg_cpu_isa isa); /* AVX2 and above */
bool rt_sgemm_dtypes_supported(dsc_dtype ab, dsc_dtype c);
/* Floats of packing scratch one thread needs for g (a multiple of 16), the
 * largest over the kernels and dtypes (the memory plan knows neither). */
int64_t rt_sgemm_scratch_floats(const cg_gemm *g);
/* The microkernels: AVX2 6x16, AVX-512 12x32 (f32 FMAs on operands widened
 * to f32), and for bf16 operands on AVX512-BF16 hosts AVX-512 12x32 with
 * vdpbf16ps on bf16 pairs (its sums round as f32 FMAs would, denormals
 * flushed). */
typedef enum { RT_SGEMM_AVX2, RT_SGEMM_AVX512, RT_SGEMM_AVX512_DPBF16 } rt_sgemm_kernel;
/* The kernel for isa (>= AVX2) and ab; dpbf16: the vdpbf16ps kernel where
 * the host has it and ab is bf16 (else the converting sibling). */
rt_sgemm_kernel rt_sgemm_kernel_for(cg_cpu_isa isa, dsc_dtype ab, bool dpbf16);
const char *rt_sgemm_kernel_name(rt_sgemm_kernel k); /* "avx2", "avx512", "avx512-dpbf16" */
/* C = alpha * A . B + beta * C over g's batches (a, b, c: buffer bases of
 * dtypes ab, ab, c_dtype; g's offsets added) with the kernel (from
 * rt_sgemm_kernel_for). scratch: 64-byte aligned, rt_pool_threads(pool)
 * slots of per_thread >= rt_sgemm_scratch_floats(g) floats (per_thread a
 * multiple of 16). Only where rt_sgemm_isa_supported and
 * rt_sgemm_dtypes_supported. */
void rt_sgemm_typed(rt_pool *pool, const cg_gemm *g, rt_sgemm_kernel kernel, dsc_dtype ab,
                    dsc_dtype c_dtype, const void *a, const void *b, void *c, float *scratch,
                    int64_t per_thread);
/* rt_sgemm_typed for f32 operands and C with cg_cpu_isa_get()'s kernel. */
void rt_sgemm(rt_pool *pool, const cg_gemm *g, const float *a, const float *b, float *c,
              float *scratch, int64_t per_thread);

/* ======================= runtime/exec_cpu.c =======================
 * Executes lowered programs (codegen/codegen.h cg_program) on the CPU:
 * kernels (cg_cpu_kernel_fn, e.g. from cg_llvm_compile) split over a
 * thread pool by their outer domain, GEMMs through rt_gemm plans, embedding
 * gradients, copies. Everything is allocated and planned at creation: a run
 * allocates nothing. Not thread-safe: one run at a time. */
typedef struct rt_cpu_exec rt_cpu_exec;
/* progs[i] with fns[i][k] the compiled kernel k of program i. One STATE
 * arena of state_bytes (64-byte aligned, zeroed) is shared by all programs
 * (module params and states, cg_buffer offsets); each program has its own
 * WORK arena of arena_bytes[CG_ARENA_WORK]. The programs and fns must
 * outlive the executor. NULL with a diagnostic when a program is malformed
 * (an index or a view out of range, dtypes that disagree) or out of memory. */
rt_cpu_exec *rt_cpu_exec_new(dsc_context *ctx, const cg_program *const *progs, int n_progs,
                             cg_cpu_kernel_fn *const *fns, int n_threads, int64_t state_bytes);
/* rt_cpu_exec_new with offload tiers (cg_tier): tier_bytes[0] is the STATE
 * arena, [1] the host arena, [2] the disk tier's staging arena (program
 * tier_bytes); PARAM buffers of tier t live in arena t. */
rt_cpu_exec *rt_cpu_exec_new_tiered(dsc_context *ctx, const cg_program *const *progs,
                                    int n_progs, cg_cpu_kernel_fn *const *fns, int n_threads,
                                    const int64_t *tier_bytes);
void rt_cpu_exec_free(rt_cpu_exec *e);
/* The STATE arena's base (params in and out via the buffers' offsets). */
void *rt_cpu_exec_state(rt_cpu_exec *e);
/* Its arenas (STATE, WORK, the host tiers and host work arenas): bytes
 * allocated and resident (touched); the GEMM packing scratch's resident
 * bytes. -1 where mincore cannot tell. */
void rt_cpu_exec_memory(const rt_cpu_exec *e, int64_t *arenas, int64_t *arenas_resident,
                        int64_t *scratch_resident);
/* Tier t's arena (0: STATE), NULL when it has none. release_tier gives its
 * whole pages back to the OS (their contents become zeros): the disk
 * staging between runs. */
void *rt_cpu_exec_tier(rt_cpu_exec *e, int tier);
/* The disk tier's file for the programs' tier transfers (not owned; NULL:
 * none): value_of_param[i] is module param i's value index in it, -1 for
 * a param not on the disk tier. False when out of memory. */
typedef struct rt_offload rt_offload;
bool rt_cpu_exec_set_offload(rt_cpu_exec *e, rt_offload *disk, const int *value_of_param,
                             int n_params);
void rt_cpu_exec_release_tier(rt_cpu_exec *e, int tier);

/* ======================= runtime/offload_io.c =======================
 * The disk tier (docs/memory.md "Offload"): one file per rank holding n
 * values (bytes[i] each, at offsets[i] of a slot of slot_bytes) in two
 * slots after a 4 KiB header that names the active slot. A commit writes
 * every value into the other slot, syncs, then flips the header (one
 * 512-byte write) and syncs: a failed commit (a full disk, an IO error)
 * leaves the active slot, so the values stay those of the last commit.
 * Reads and writes run on a pool of IO threads (pread/pwrite), in chunks of
 * RT_OFFLOAD_CHUNK bytes, RT_OFFLOAD_THREADS in flight. Errors name the
 * file. */
#define RT_OFFLOAD_THREADS 4
#define RT_OFFLOAD_CHUNK ((int64_t)4 << 20)
typedef struct rt_offload rt_offload;
/* Creates (truncates) the file; nothing is readable before the first commit. */
rt_offload *rt_offload_open(dsc_context *ctx, const char *path, int n, const int64_t *offsets,
                            const int64_t *bytes, int64_t slot_bytes);
void rt_offload_free(rt_offload *o);
const char *rt_offload_path(const rt_offload *o);
/* Value i of the active slot into dst[i] (NULL: skipped). */
bool rt_offload_read(rt_offload *o, void *const *dst, char *err, size_t errlen);
/* src[i] into the inactive slot, then the flip. */
bool rt_offload_commit(rt_offload *o, const void *const *src, char *err, size_t errlen);
/* Commits done (the header's generation). */
int64_t rt_offload_generation(const rt_offload *o);
/* Streaming (the disk tier's tier_read/tier_write instructions): transfers
 * of one value each, started asynchronously on the file's IO threads
 * (rt_offload_set_threads, default RT_OFFLOAD_THREADS; started on first use)
 * and waited by their id. Between begin and end: reads come from the
 * active slot, writes go to the other one; end(commit) waits for what is in
 * flight and, when commit is true, no transfer failed and some value was
 * written, copies the values not written from the active slot, syncs and
 * flips the header. end(false), or a failure, leaves the active slot (a
 * failed step changes nothing). start returns the transfer's id, -1 on an
 * immediate failure (message in err). */
bool rt_offload_set_threads(rt_offload *o, int n);
void rt_offload_begin(rt_offload *o);
int rt_offload_start(rt_offload *o, int value, void *buf, bool write, char *err, size_t errlen);
bool rt_offload_wait(rt_offload *o, int id, char *err, size_t errlen);
bool rt_offload_end(rt_offload *o, bool commit, char *err, size_t errlen);
/* Value `value`'s bytes (0 for an index out of range). */
int64_t rt_offload_value_bytes(const rt_offload *o, int value);
/* The host stream (runtime/host_stream.c): a thread that runs posted items
 * (instruction indices) in post order with fn(arg, item, poster, err,
 * errlen), one at a time, beside the thread that posts them. Made with
 * room for max_items posts per run; NULL with a diagnostic when the thread
 * cannot start. begin resets a run's counters (the stream must be idle:
 * every post waited for, or cancelled); post returns false past max_items;
 * wait returns once the first n posted items are done, running the ones
 * not started itself (fn's poster true), false with the first failure's
 * message when one failed (a failure stops the stream until the next
 * begin); cancel lets the running item finish and starts no other.
 * times: this run's time running items, and the poster's time in waits
 * (blocked, or running items). */
typedef struct rt_host_stream rt_host_stream;
typedef bool (*rt_host_item_fn)(void *arg, int item, bool poster, char *err, size_t errlen);
rt_host_stream *rt_host_stream_new(dsc_context *ctx, int max_items, rt_host_item_fn fn,
                                   void *arg);
void rt_host_stream_free(rt_host_stream *s);
void rt_host_stream_begin(rt_host_stream *s);
bool rt_host_stream_post(rt_host_stream *s, int item);
bool rt_host_stream_wait(rt_host_stream *s, int n, char *err, size_t errlen);
void rt_host_stream_cancel(rt_host_stream *s);
void rt_host_stream_times(rt_host_stream *s, int64_t *busy_ns, int64_t *wait_ns);

/* Runs program prog: inputs[i] is graph input i's data in its dtype
 * (copied into the WORK arena); outputs_out[i] receives a pointer to graph
 * output i (into an arena: valid until the next run of any program). The
 * program's non-in-place assigns are applied only when every instruction
 * succeeded. False with a message in err on a runtime error (a kernel's
 * index out of range, a library failure); then no assign is applied. */
bool rt_cpu_exec_run(rt_cpu_exec *e, int prog, void *const *inputs, void **outputs_out, char *err,
                     size_t errlen);
/* Per-instruction timing (off by default; costs two clock reads each).
 * rt_cpu_exec_profile returns the cumulative nanoseconds of each of
 * program prog's instructions since profiling was switched on, sets *n to
 * the instruction count and *runs to the number of runs timed. */
void rt_cpu_exec_set_profiling(rt_cpu_exec *e, bool on);
const int64_t *rt_cpu_exec_profile(const rt_cpu_exec *e, int prog, int *n, int64_t *runs);
/* Per instruction: the timed runs in which its guard skipped it
 * (cg_instr.guarded), as many entries as rt_cpu_exec_profile's. */
const int64_t *rt_cpu_exec_profile_skips(const rt_cpu_exec *e, int prog);
/* Whether the host stream's instructions ran on its own thread (decided at
 * the first run that had any: cg_program.host_stream_own_thread, or a core
 * left free by the executor's threads); false before. */
bool rt_cpu_exec_host_stream_on(const rt_cpu_exec *e);
/* The communicator collective instructions (CG_INS_COLLECTIVE_START/WAIT)
 * run through (NULL: none; a program with collectives then fails naming the
 * op). Not owned. On any error during a run with collectives the
 * communicator is aborted (dsc_comm_abort) and every started collective is
 * waited, so no rank hangs and no buffer stays lent to the comm. */
void rt_cpu_exec_set_comm(rt_cpu_exec *e, dsc_comm *comm);
/* Every collective's tag from now on (>= 0; -1: the compiled ones). */
void rt_cpu_exec_set_tag(rt_cpu_exec *e, int64_t tag);
/* Chrome trace of every later run (include/dsc/trace.h) as rank pid:
 * kernels, GEMMs and embedding gradients on the compute track, copies on
 * the copy track, each collective on the comm track (start to the return of
 * its wait) and each wait on the wait track, plus the run's overlap figures.
 * NULL: off (the run loop then only tests the pointer). False when out of
 * memory (a diagnostic). Not owned. */
bool rt_cpu_exec_set_trace(rt_cpu_exec *e, dsc_trace *trace, int pid);
/* The GEMM plan of instruction ins of program prog (NULL: not a GEMM). */
const rt_gemm_plan *rt_cpu_exec_gemm_plan(const rt_cpu_exec *e, int prog, int ins);

/* ======================= runtime/limits.c ======================= */
/* Requests checked against this host before the work starts; each false
 * case is DSC_ERR_USER with the numbers. */
#define RT_THREADS_PER_CPU 4 /* --threads and in-process ranks: at most 4 x online CPUs */
/* Bytes of memory available now (MemAvailable, else physical; the variable
 * DSC_HOST_MEMORY overrides both); *physical (may be NULL): the RAM. */
int64_t rt_host_memory(int64_t *physical);
int rt_online_cpus(void);
/* "out of memory while <what>: needed N bytes ..." when bytes > available. */
dsc_status rt_check_host_memory(dsc_context *ctx, const char *what, int64_t bytes);
dsc_status rt_check_threads(dsc_context *ctx, int64_t threads);
dsc_status rt_check_inproc_ranks(dsc_context *ctx, int64_t ranks);
/* Bytes of [p, p + n) resident in RAM now (mincore over its whole pages);
 * -1 when it cannot tell. */
int64_t rt_resident_bytes(const void *p, size_t n);
/* The process's resident set, and the bytes its malloc heap holds from the
 * system (glibc: brk'd arenas + mmapped chunks); -1 when unknown. */
int64_t rt_rss_bytes(void);
int64_t rt_heap_bytes(void);

/* ======================= runtime/exec.c: the executor interface =======================
 * One backend of the public executor (include/dsc/exec.h), in the shape of
 * rt_comm_backend: runtime/exec.c dispatches to it and keeps what every
 * backend shares (the params' tiers and the disk tier's file, argument
 * checks, traces of whole runs, the compiled module's lifetime). impl is
 * the backend's own object. An entry a backend lacks is NULL. How to add a
 * backend: docs/architecture.md. */
typedef struct {
  dsc_module *m;
  const dsc_exec_options *opts;
  const cg_compiled_module *compiled; /* the compile step's (compiled backends); not owned */
  const int *tiers;                   /* per param: cg_tier */
  const int64_t *tier_offsets;        /* per param: offset in its tier's arena */
  const int64_t *tier_bytes;          /* per tier: the arena's bytes */
} rt_exec_args;

typedef struct {
  const char *name;        /* dsc_backend_name */
  dsc_backend id;
  bool (*available)(void); /* built in */
  const char *not_built;   /* the diagnostic when it is not */
  bool compiled;           /* runs a cg_compiled_module of `target` */
  cg_target target;
  const char *run_label;   /* traces each whole run as "<graph> (<label>)"; NULL: traces itself */
  dsc_status (*check)(const dsc_module *m); /* what it cannot run, before any compile work */
  dsc_status (*create)(const rt_exec_args *a, void **impl);
  void (*destroy)(void *impl);
  /* params and states in and out, except the disk tier's (exec.c) */
  dsc_status (*set_params)(void *impl, const dsc_params *p);
  dsc_status (*get_params)(void *impl, dsc_params *p);
  /* param or state i alone in (not the disk tier's) */
  dsc_status (*set_param)(void *impl, int i, const dsc_tensor *t);
  /* the doubles it runs on, when it keeps every value itself (then exec.c
   * moves the disk tier's values around each run); NULL: it streams them */
  dsc_params *(*values)(void *impl);
  dsc_status (*run)(void *impl, int graph, const dsc_tensor *const *inputs, int n_inputs,
                    dsc_tensor **outputs);
  dsc_status (*set_comm)(void *impl, dsc_comm *comm);
  void (*set_tag)(void *impl, int64_t tag);
  dsc_status (*set_trace)(void *impl, dsc_trace *trace, int pid);
  dsc_status (*set_offload)(void *impl, rt_offload *disk, const int *value_of_param, int n);
  void (*set_profiling)(void *impl, bool on);
  dsc_status (*print_profile)(void *impl, int graph, int top, FILE *out);
  /* graph's profile summed by phase (rt_phase_add per instruction) */
  dsc_status (*phase_times)(void *impl, int graph, dsc_phase_times *out);
  int64_t (*device_bytes)(const void *impl);
  /* host memory it can name (dsc_exec_memory_report); NULL: none */
  void (*memory)(const void *impl, int64_t *arenas, int64_t *resident, int64_t *scratch);
} rt_executor;

/* Adds instruction in's ms to its phase's total (dsc_exec_phase_times). */
void rt_phase_add(const cg_instr *in, double ms, dsc_phase_times *t);

extern const rt_executor rt_exec_interp; /* runtime/exec_interp.c */
extern const rt_executor rt_exec_cpu;    /* runtime/exec_cpu_backend.c */
extern const rt_executor rt_exec_cuda;   /* runtime/exec_cuda.c */
const rt_executor *rt_executor_of(dsc_backend b); /* NULL: no such backend */
/* Whether m can run on backend b: built in, the params' tiers well formed,
 * the backend's own check; a diagnostic when not. */
dsc_status rt_exec_check(dsc_module *m, dsc_backend b);
/* The executor of m from the compile step's c (NULL for a backend that
 * compiles nothing). Takes c: released with the executor, or here when
 * creation fails. */
dsc_status rt_exec_new(dsc_module *m, const dsc_exec_options *opts, const cg_compiled_module *c,
                       dsc_exec **out);
/* The CUDA device's SM (runtime/exec_cuda.c; see runtime/cuda_api.h). */
dsc_status rt_cuda_device_arch(dsc_context *ctx, int *arch);

#ifdef __cplusplus
}
#endif
#endif
