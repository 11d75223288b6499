/* program/: the Program, the contract between code generation and
 * execution, sectioned by source file. codegen/ writes Programs (lowering,
 * compiled kernels), runtime/ reads them; this layer depends on ir/ types
 * only. A Program is a linear list of instructions over planned buffers;
 * its kernels are a table of names, argument shapes and hashes
 * (cg_kernel_info): the kernel IR behind them is the code generator's and
 * opaque here, and no instruction points into the IR graph.
 *
 * The types keep the cg_ prefix they had in codegen/codegen.h (renaming
 * them in every layer at once would collide with the branches in flight). */
#ifndef DSC_PROGRAM_H
#define DSC_PROGRAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "dsc/core.h"
#include "dsc/exec.h"
#include "ir/ir.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The code generator's kernel IR (codegen/codegen.h): only pointed at. */
typedef struct kir_kernel kir_kernel;

/* ======================= the Program (this header) =======================
 * A linear list of instructions over planned buffers. Buffers live in two
 * arenas: STATE (every param and state of the module, in module order,
 * persistent across runs) and WORK (graph inputs, outputs and temporaries,
 * placed by liveness). A view is a buffer plus an element offset. */

typedef enum { CG_ARENA_STATE, CG_ARENA_WORK } cg_arena_kind;

typedef enum {
  CG_BUF_PARAM, /* module param/state `index` (module order); STATE arena */
  CG_BUF_INPUT, /* graph input `index`; WORK arena */
  CG_BUF_TEMP,  /* WORK arena */
} cg_buf_kind;

typedef struct {
  cg_buf_kind kind;
  int index;
  dsc_dtype dtype;
  int64_t numel;
  int64_t offset; /* bytes within its arena (64-byte aligned) */
  int first_use, last_use; /* instruction indices (liveness), -1 for STATE */
  int tier; /* CG_BUF_PARAM: cg_tier of the value (its arena); 0 (device) otherwise */
  /* (CG_BUF_TEMP with tier CG_TIER_HOST: a host work buffer, placed by
   * liveness in the program's host work arena (cg_program.host_work_bytes):
   * to_host results and the values of nodes placed on the host) */
} cg_buffer;

typedef enum {
  CG_INS_LAUNCH,           /* kernel `kernel` with argument buffers args[] */
  CG_INS_GEMM,             /* see cg_gemm */
  CG_INS_EMBEDDING_GRAD,   /* dst[rows, D] = 0 (unless accumulate); dst[ids[i], :] += src[i, :] */
  CG_INS_SET_ROWS,         /* dst[ids[i], :] = src[i, :] where 0 <= ids[i] < rows, i in order */
  CG_INS_COPY,             /* dst = src, `numel` elements, same dtype, contiguous */
  CG_INS_COLLECTIVE_START, /* starts collective `coll` (asynchronous): src -> dst */
  CG_INS_COLLECTIVE_WAIT,  /* completes the collective `coll.id` started earlier */
  CG_INS_TIER_START,       /* starts disk transfer `tier` (asynchronous) of buffer src */
  CG_INS_TIER_WAIT,        /* completes disk transfer `tier.id` started earlier */
} cg_ins_kind;

/* A disk tier transfer (tier_read_start/_wait, tier_write_start/_wait;
 * passes/offload_disk.c): module param/state `param` (disk tier) read from
 * the file's active slot into buffer src (a WORK buffer holding the whole
 * value, contiguous), or written from it into the other slot, which becomes
 * the active one only when the run completes. The buffer belongs to the
 * transfer from its START to its WAIT (liveness covers both; the WAIT
 * repeats the START's fields). Ids 0..cg_program.n_tier_ios-1, in start
 * order; every START has one WAIT later in the program. */
typedef struct {
  int id;
  int param;
  bool write;
} cg_tier_io;

typedef enum {
  CG_COLL_ALL_REDUCE,     /* dst[i] = sum over ranks of src[i], count elements */
  CG_COLL_REDUCE_SCATTER, /* src: count elements; dst: chunk `rank` of the sum (count/world) */
  CG_COLL_ALL_GATHER,     /* src: count elements; dst: world*count, rank r's at r*count */
  CG_COLL_BROADCAST,      /* dst (count elements) = the root's dst; the lowering copies src
                           * into dst before the start */
  CG_COLL_ALL_TO_ALL,     /* src, dst: world chunks of count elements; src's chunk j goes to
                           * rank j, dst's chunk i comes from rank i */
} cg_coll_kind;
/* "all_reduce", ...: the name of a kind in prints, profiles and traces. */
static inline const char *cg_coll_kind_name(cg_coll_kind k) {
  static const char *const names[] = {"all_reduce", "reduce_scatter", "all_gather", "broadcast",
                                      "all_to_all"};
  return (unsigned)k < sizeof names / sizeof *names ? names[k] : "collective";
}

/* A collective instruction (dsc_comm_* of include/dsc/comm.h). Buffers src
 * and dst (contiguous, offset 0; cg_instr.src/.dst) belong to the
 * collective from its START to its WAIT: their liveness covers both, and no
 * instruction in between writes them. Every START has exactly one WAIT,
 * later in the program (the lowering adds waits for starts the graph never
 * waits, at the end). The WAIT repeats the START's fields. */
typedef struct {
  cg_coll_kind kind;
  int id;          /* 0..cg_program.n_collectives-1, in start order */
  dsc_dtype dtype; /* of src and dst */
  int64_t count;   /* elements, as the dsc_comm_*_start count argument */
  int op;          /* dsc_comm_op of a reduction (DSC_COMM_SUM) */
  int root;        /* BROADCAST */
  int64_t world;   /* the op's world attribute: must equal the communicator's */
  int64_t tag;     /* the op's tag attribute (the step label in comm messages) */
  char group[8];   /* the communicator: "" the executor's, else a mesh axis ("ep", ...) */
} cg_collective;

/* A strided matrix operand: element (b0, b1, r, c) is at
 * offset + b0*batch_stride[0] + b1*batch_stride[1] + r*row_stride + c*col_stride
 * (elements of the buffer's dtype). Transposes and permuted or sliced views
 * are strides, never copies. */
typedef struct {
  int buffer;
  int64_t offset;
  int64_t batch_stride[2], row_stride, col_stride;
} cg_matrix;

/* C[b0,b1] = alpha * A[b0,b1] (m x k) . B[b0,b1] (k x n) + beta * C[b0,b1]. */
typedef struct {
  int64_t batch[2]; /* 1 when absent */
  int64_t m, n, k;
  cg_matrix a, b, c;
  double alpha, beta;
} cg_gemm;

typedef struct {
  cg_ins_kind kind;
  /* LAUNCH */
  int kernel;
  int n_args;
  int *args; /* buffer per kernel argument (views: the kir_access offsets) */
  /* GEMM */
  cg_gemm gemm;
  /* EMBEDDING_GRAD, SET_ROWS: ids (n_ids integers), src [n_ids, cols]
   * contiguous, dst [rows, cols] */
  int ids, src, dst;
  int64_t n_ids, rows, cols;
  bool accumulate; /* EMBEDDING_GRAD adds into dst's values (no zero-fill first) */
  /* COPY: src -> dst, numel elements (from src_offset to dst_offset, elements) */
  int64_t numel, src_offset, dst_offset;
  /* COPY of a local_shard: the source range starts at src_offset + rank *
   * numel, rank of the communicator (whose world must be coll.world); the
   * source has src_len elements from src_offset, past them dst gets zeros */
  bool src_rank_chunk;
  int64_t src_len;
  /* COLLECTIVE_START / COLLECTIVE_WAIT (buffers: src, dst) */
  cg_collective coll;
  /* TIER_START / TIER_WAIT (buffer: src; dst == src) */
  cg_tier_io tier;
  const char *op; /* the name of the IR op it came from, for errors and traces (may be NULL) */
  int phase;      /* ir_phase of that node (ir/phase.c): wall_clock_breakdown's forward,
                   * backward or step */
  /* Runs on the executor's host stream, beside the instructions that are
   * not (codegen/lower.c mark_host_stream: a host-placed kernel or copy,
   * or a to_device, when the module's meta offload.overlap is set; see
   * cg_program.host_stream_own_thread for where it runs). An
   * instruction off the stream that touches bytes one on it writes, or
   * writes bytes it reads, waits for it first (runtime/exec_cpu.c). */
  bool host_stream;
  /* When guarded, runs only when buffer `guard` (a bool scalar written by
   * an earlier instruction) holds guard_if (passes/guard.c, ir_node.guard:
   * nothing reads the result of a skipped instruction). An executor may
   * ignore it and run everything (the cuda one does). */
  bool guarded, guard_if;
  int guard;
} cg_instr;

/* A graph output: the buffer (and element offset) holding it after a run. */
typedef struct {
  int buffer;
  int64_t offset;
  dsc_type type;
} cg_output;

/* An `assign`: after the run, param/state `param` holds the value of
 * buffer `buffer` (nothing to do when the lowering wrote it in place). */
typedef struct {
  int param, buffer;
  bool in_place;
  bool guarded, guard_if; /* as cg_instr's: the copy is skipped unless guard holds guard_if */
  int guard;
} cg_assign;

/* A kernel as executors see it (no kernel IR): its entry name, the hash
 * that ties a compiled object to it, its arguments for validation and the
 * shape of its outer loop for splitting it over threads. Filled from the
 * kernel IR by codegen (cg_program_kernel_table). */
typedef struct {
  dsc_dtype dtype; /* storage dtype */
  int64_t numel;   /* elements the kernel may reach through it */
  bool read, written;
} cg_kernel_arg;

typedef struct {
  const char *name; /* entry point: a C identifier, unique within a program */
  uint64_t hash;    /* kir_hash of its kernel IR (cache and .dsx keys) */
  int n_args;
  const cg_kernel_arg *args;
  int64_t outer;      /* outer indices (the kernel ABI's outer_begin/outer_end range) */
  int64_t inner_work; /* inner points times stages per outer index (>= 1) */
  bool distinct_args; /* compiled as if no two arguments overlap (verified per launch) */
} cg_kernel_info;

typedef struct {
  const char *graph_name;
  int n_buffers, cap_buffers;
  cg_buffer *buffers;
  int n_kernels, cap_kernels;
  kir_kernel **kernels;       /* the code generator's kernel IR: opaque to executors */
  cg_kernel_info *kernel_info; /* per kernel: what executors read (cg_program_kernel_table) */
  int n_instrs, cap_instrs;
  cg_instr *instrs;
  int n_outputs;
  cg_output *outputs;
  int n_assigns;
  cg_assign *assigns;
  int64_t arena_bytes[2]; /* STATE, WORK */
  /* per cg_tier, the bytes of the arena holding that tier's params and
   * states ([CG_TIER_DEVICE] == arena_bytes[STATE]; [CG_TIER_DISK]: the
   * size of a slot of the disk tier's file, laid out by
   * cg_state_layout_tiers; no memory: the disk values are streamed through
   * WORK buffers by TIER_START/TIER_WAIT) */
  int64_t tier_bytes[3];
  /* the host work arena (per program, like WORK): CG_BUF_TEMP buffers of
   * tier CG_TIER_HOST (passes/offload_host.c), counted as host memory */
  int64_t host_work_bytes;
  int n_collectives;      /* COLLECTIVE_START instructions (ids 0..n-1) */
  int n_tier_ios;         /* TIER_START instructions (ids 0..n-1) */
  bool needs_rank;        /* has rank-chunk copies (local_shard): needs a communicator */
  /* The host stream's instructions (cg_instr.host_stream) run on a thread
   * of their own whatever the machine (meta offload.overlap "true"); when
   * false, only where the executor's threads leave a core free ("auto"),
   * else in their place in the program. */
  bool host_stream_own_thread;
  /* Per node id of the lowered graph: the buffer holding the node's value
   * contiguously (offset 0), -1 for none (recomputed, a view, fused away).
   * What the memory plan (memplan.c) classifies buffers by. */
  int n_nodes;
  const int *node_buffer;
} cg_program;

/* ======================= compiled kernels (this header) =======================
 * What an executor receives from the compile step (codegen/compile.c): the
 * Program of every graph of a module, in module graph order, and per
 * Program its compiled kernels. Compiled code is opaque here:
 *   cpu   an entry table: entries[k] runs kernel k (loaded by the compile
 *         step's linker, the LLVM JIT session, which lives until release),
 *         with the ABI
 *           void kernel(void *const *args, int64_t outer_begin,
 *                       int64_t outer_end, int32_t *status)
 *         over the outer indices [outer_begin, outer_end), so a thread
 *         pool splits the outer loop;
 *   cuda  one object (a cubin) holding every kernel of the Program under
 *         its cg_kernel_info name, and each kernel's launch shape; plus the
 *         executor's own kernels (kernels/helpers.cuh) as one more object.
 * The executor that takes a cg_compiled_module calls release(owner) when it
 * is freed (or fails to be made). */
typedef void (*cg_cpu_kernel_fn)(void *const *args, int64_t outer_begin, int64_t outer_end,
                                 int32_t *status);

/* A CUDA launch shape (grid-stride kernels: any grid is correct; the block
 * size is the one the kernel was generated for). */
typedef struct {
  unsigned grid[3], block[3];
  unsigned shared_bytes;
} cg_cuda_launch;

typedef enum { CG_TARGET_CPU, CG_TARGET_CUDA } cg_target;

typedef struct {
  const cg_cpu_kernel_fn *entries; /* cpu: per kernel */
  const void *object;              /* cuda: the cubin (NULL: no kernels) */
  size_t object_len;
  const cg_cuda_launch *launch;    /* cuda: per kernel */
} cg_kernel_objects;

typedef struct {
  cg_target target;
  int cuda_arch; /* cuda: the SM the objects are for (sm_<arch>) */
  int n_programs;
  cg_program *const *programs;      /* per module graph */
  const cg_kernel_objects *kernels; /* per program */
  const void *helpers;              /* cuda: kernels/helpers.cuh compiled */
  size_t helpers_len;
  /* kernels compiled now, loaded from a program file (.dsx), and objects
   * taken from the kernel cache */
  int compiled, prebuilt, cached;
  size_t code_bytes; /* cpu: object bytes of the kernels linked into the process */
  /* the compile's resident-set growth outside the malloc heap (set by the
   * caller that measured it; -1: not measured) */
  int64_t compile_other;
  void *owner;
  void (*release)(void *owner);
} cg_compiled_module;

/* ======================= program/layout.c =======================
 * Where a module's params and states live: the layout every graph of the
 * module shares, so that the code generator plans it and executors allocate
 * it from the module alone. */
/* The STATE arena layout shared by every graph of module m: param/state i
 * (module order) at byte offset offsets[i] (64-byte aligned); *total is the
 * arena size. False when the sizes overflow. */
bool cg_state_layout(const ir_module *m, int64_t *offsets, int64_t *total);

/* Memory tiers (passes/offload.c): param/state i lives on the device
 * (default), in host memory or on disk, by module meta "tier.<name>" =
 * "host" | "disk". cg_param_tier returns the tier, -1 when the meta is
 * malformed. cg_state_layout_tiers lays out each tier's values in its own
 * arena: offsets[i] within tier tiers[i]'s arena of totals[tier] bytes
 * (the device's is the STATE arena; the disk tier's is the layout of a
 * slot of its file, which no memory mirrors: the values are streamed). False when a size
 * overflows or a tier is malformed. */
typedef enum { CG_TIER_DEVICE = 0, CG_TIER_HOST = 1, CG_TIER_DISK = 2, CG_TIER_COUNT = 3 } cg_tier;
int cg_param_tier(const ir_module *m, int i);
bool cg_state_layout_tiers(const ir_module *m, int64_t *offsets, int *tiers, int64_t *totals);

/* ======================= program/verify.c =======================
 * The one check of a Program before an executor trusts it (a .dsx file may
 * come from anyone): every buffer inside its arena, every instruction's
 * indices, ranges and dtypes, each collective and disk transfer started
 * once then waited once, outputs and assigns. Executors add only what their
 * backend cannot do. */
typedef struct {
  /* Bytes of each param tier's arena the executor provides: [CG_TIER_DEVICE]
   * the STATE arena, [CG_TIER_HOST] host memory, [CG_TIER_DISK] a staging
   * copy of the disk tier (0: the disk values are streamed, and no
   * instruction, output or assign may address them). */
  int64_t tier_bytes[CG_TIER_COUNT];
  bool offload;        /* false: a backend without host/disk tiers (every buffer on the device) */
  const char *backend; /* named in each message ("backend cuda: ..."), or NULL */
} cg_verify_limits;
/* True when p is sound under lim; else one error naming the program and
 * the instruction. lim NULL checks the structure only (no arena bounds). */
bool cg_program_verify(dsc_context *ctx, const cg_program *p, const cg_verify_limits *lim);
/* One past the largest element index operand `which` (0 A, 1 B, 2 C) of g
 * reaches, offset included (bounds checks against the buffer). */
int64_t cg_gemm_extent(const cg_gemm *g, int which);
/* Buffer b is a disk-tier value with no memory under lim (streamed); with
 * lim NULL every disk-tier value counts as streamed. */
bool cg_buffer_streamed(const cg_program *p, int b, const cg_verify_limits *lim);
/* The buffer of module param/state `param`, -1 when p has none. */
int cg_param_buffer(const cg_program *p, int param);

/* ======================= program/elem.c ======================= */
/* Storage conversions shared by the evaluator and the runtimes: a double
 * read from / written to an element of `dtype` at p (bf16/f16 round once to
 * nearest even: ir_bf16_bits; integers truncate toward zero; bool is != 0). */
double cg_load_elem(dsc_dtype dtype, const void *p);
void cg_store_elem(dsc_dtype dtype, void *p, double v);
/* v truncated toward zero to a `bits`-bit integer (32 wraps, 64 saturates
 * to INT64_MIN out of range, NaN is 0): the integer stores above. */
int64_t cg_trunc_int(double v, int bits);
/* The fast f32 <-> bf16 pair for the CPU executor's loops (GEMM packing and
 * stores, embedding gradients): widening is exact; narrowing gives the bits
 * of ir_bf16_bits((double)x) (an f32 is exact in double): nearest even,
 * overflow to infinity, subnormals kept, NaN -> sign | 0x7fc0. */
static inline float cg_f32_of_bf16(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}
static inline uint16_t cg_bf16_of_f32(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)(((u >> 16) & 0x8000u) | 0x7fc0u);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* ======================= program/cpu_isa.c =======================
 * The CPU's vector ISA, one answer for the compile step (LLVM target
 * features) and the executor (the GEMM microkernel): the host's best
 * (cg_cpu_isa_host), lowered by $DSC_CPU_ISA = avx512 | avx2 | baseline
 * (an AVX-512 host then runs and tests what an AVX2-only or a baseline
 * x86-64 CPU would). Raising it above the host, or another value, is an
 * error of cg_cpu_isa_resolve (err filled); cg_cpu_isa_get never fails:
 * on such a value it answers baseline (or the host's, for avx512). */
typedef enum { CG_ISA_BASELINE = 0, CG_ISA_AVX2 = 1, CG_ISA_AVX512 = 2 } cg_cpu_isa;
cg_cpu_isa cg_cpu_isa_host(void);
bool cg_cpu_isa_resolve(cg_cpu_isa *out, char *err, size_t errlen);
cg_cpu_isa cg_cpu_isa_get(void);
const char *cg_cpu_isa_name(cg_cpu_isa isa);

/* ======================= program/dsx.c =======================
 * The .dsx container of compiled programs: named sections, each with a
 * checksum, written atomically; reading checks everything against the file. */
/* Little-endian integers in file formats (.dsx and its sections). */
static inline void rt_put_le32(unsigned char *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static inline void rt_put_le64(unsigned char *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static inline uint32_t rt_get_le32(const unsigned char *p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}
static inline uint64_t rt_get_le64(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}
typedef struct {
  char *name; /* writer: const text; reader: owned */
  void *data; /* reader: owned, NUL-terminated past size */
  size_t size;
} rt_dsx_section;
typedef struct {
  rt_dsx_section *sections;
  int n, cap;
} rt_dsx;
dsc_status rt_dsx_write(dsc_context *ctx, const char *path, const rt_dsx_section *s, int n);
dsc_status rt_dsx_read(dsc_context *ctx, const char *path, rt_dsx **out);
void rt_dsx_free(dsc_context *ctx, rt_dsx *d);
const rt_dsx_section *rt_dsx_find(const rt_dsx *d, const char *name);

/* ======================= program/program_file.c =======================
 * Program files (include/dsc/exec.h dsc_program_*). One graph's CPU kernel
 * objects form one section: packed from kernels k[0..n) with their objects;
 * unpacking sets objs[i]/lens[i] (pointers into data) for each kernel i
 * whose name and hash equal the file's entry i, NULL for the others.
 * Returns the number found, or -1 when the section is malformed. */
void *rt_pack_kernel_objects(dsc_context *ctx, const cg_kernel_info *k, int n,
                             void *const *objs, const size_t *lens, size_t *out_len);
int rt_unpack_kernel_objects(const void *data, size_t size, const cg_kernel_info *k, int n,
                             const void **objs, size_t *lens);
const rt_dsx *rt_program_dsx(const dsc_program *p);
dsc_context *rt_program_context(const dsc_program *p);
/* Whether p holds cpu kernels from this dsc version for host (cg_llvm_host). */
bool rt_program_cpu_fits(const dsc_program *p, const char *host);

#ifdef __cplusplus
}
#endif
#endif
