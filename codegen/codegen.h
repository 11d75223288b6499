/* codegen/: the code generation layer's whole vocabulary, sectioned by file.
 *
 * Data flow (TVM/tinygrad split: renderer, compiler, runtime):
 *   IR graph with fusion groups (passes/fuse.c)
 *     --lower.c-->  cg_program: buffers + a linear list of instructions
 *                   (kernel launches of kernel IR, GEMMs, scatter-adds, copies)
 *     --llvm.c-->   CPU: kernel IR -> LLVM IR -> O3 -> ORC LLJIT function pointers
 *     --cuda.c-->   GPU: kernel IR -> CUDA C -> NVRTC -> PTX + cubin
 *   The runtime (runtime/exec_cpu.c, ...) executes a cg_program.
 *
 * Kernel IR in one paragraph. A kernel iterates a domain of `rank` dims; the
 * first `n_outer` dims are the parallel outer loops (split across threads or
 * CUDA blocks), the remaining ones are the inner dims. For each outer index
 * the kernel runs its stages in order; a stage either reduces an expression
 * over all inner dims into a scalar slot (REDUCE), computes a scalar slot
 * from other slots and outer-only values (LET), or stores an expression
 * (STORE; over all inner dims when `over_inner`, else once per outer index).
 * Expressions are DAGs (a node may be referenced twice: emitters evaluate it
 * once per point); loads are affine in the domain indices (any strides,
 * 0 for broadcast) plus an optional bounds-checked gather term. Softmax is a
 * 3-stage kernel (REDUCE max, REDUCE sum of exp, STORE), an elementwise op a
 * single STORE stage, AdamW one STORE stage per updated tensor. */
#ifndef DSC_CODEGEN_H
#define DSC_CODEGEN_H

#include <stdbool.h>
#include <stdint.h>

#include "dsc/core.h"
#include "ir/ir.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KIR_MAX_RANK 8

/* ======================= codegen/kir.c: kernel IR ======================= */

typedef enum {
  KIR_CONST,  /* value (converted to `type`) */
  KIR_LOAD,   /* access; converts the stored dtype to `type` */
  KIR_INDEX,  /* the current index of domain dim `var` (type i64) */
  KIR_SCALAR, /* the value of scalar slot `slot` of the current outer index */
  KIR_UNARY,  /* op: kir_unary, operand a */
  KIR_BINARY, /* op: kir_binary, operands a, b (same type; result `type`) */
  KIR_SELECT, /* a (bool) ? b : c */
  KIR_CAST,   /* a converted to `type` (float->int truncates; ->bool is != 0) */
} kir_expr_kind;

typedef enum {
  KIR_NEG,
  KIR_EXP,
  KIR_LOG,
  KIR_SQRT,
  KIR_RSQRT,
  KIR_TANH,
  KIR_SIGMOID,
  KIR_ABS,
} kir_unary;

typedef enum {
  KIR_ADD,
  KIR_SUB,
  KIR_MUL,
  KIR_DIV, /* integer: truncates toward zero; the lowering never divides by a possible 0 */
  KIR_MAX,
  KIR_MIN,
  KIR_POW,
  KIR_LT, /* comparisons: result bool */
  KIR_GT,
  KIR_EQ,
  KIR_AND, /* bool */
  KIR_OR,
} kir_binary;

typedef struct kir_expr kir_expr;

/* Element address = offset + sum_d stride[d] * index[d]
 *                   (+ gather_stride * value(gather) when gather != NULL),
 * in elements of the argument's dtype. The gather value (an integer
 * expression, e.g. a token id) must lie in [0, gather_bound): otherwise the
 * kernel sets *status to 1, loads 0 and does not store. */
typedef struct {
  int arg; /* kernel argument index */
  int64_t offset;
  int64_t stride[KIR_MAX_RANK]; /* per domain dim; 0 = broadcast */
  kir_expr *gather;
  int64_t gather_stride, gather_bound;
} kir_access;

struct kir_expr {
  kir_expr_kind kind;
  dsc_dtype type; /* compute type: f32 f64 i32 i64 bool (never bf16/f16: loads widen) */
  int op;         /* kir_unary or kir_binary */
  double value;   /* KIR_CONST */
  int var;        /* KIR_INDEX */
  int slot;       /* KIR_SCALAR */
  kir_access access;
  kir_expr *a, *b, *c;
};

typedef enum { KIR_REDUCE_SUM, KIR_REDUCE_MAX, KIR_REDUCE_MIN } kir_reduce_op;

typedef enum {
  KIR_STAGE_REDUCE, /* slot = fold(reduce op, expr over every inner index) */
  KIR_STAGE_LET,    /* slot = expr (expr uses no inner index) */
  KIR_STAGE_STORE,  /* store expr at access (over inner dims when over_inner) */
} kir_stage_kind;

typedef struct {
  kir_stage_kind kind;
  kir_reduce_op reduce;
  int slot;        /* REDUCE, LET */
  bool over_inner; /* STORE */
  kir_access dst;  /* STORE: converts the value to the argument's dtype (bf16/f16: RNE) */
  kir_expr *expr;
} kir_stage;

typedef struct {
  dsc_dtype dtype; /* storage dtype (bf16/f16 allowed) */
  int64_t numel;   /* elements reachable through this argument (bounds) */
  bool read, written;
} kir_arg;

typedef struct {
  const char *name; /* a C identifier, unique within a program */
  int rank, n_outer;
  int64_t dims[KIR_MAX_RANK];
  int n_args;
  kir_arg *args;
  int n_slots;
  dsc_dtype *slot_types;
  int n_stages;
  kir_stage *stages;
} kir_kernel;

/* Construction helpers: every object lives in arena `a` (NULL on failure,
 * and NULL operands give NULL, so a chain needs one check at the end). */
kir_expr *kir_const(ir_arena *a, dsc_dtype type, double value);
kir_expr *kir_load(ir_arena *a, dsc_dtype type, kir_access access);
kir_expr *kir_index(ir_arena *a, int var);
kir_expr *kir_scalar(ir_arena *a, dsc_dtype type, int slot);
kir_expr *kir_un(ir_arena *a, kir_unary op, kir_expr *x);
kir_expr *kir_bin(ir_arena *a, kir_binary op, kir_expr *x, kir_expr *y);
kir_expr *kir_select(ir_arena *a, kir_expr *cond, kir_expr *x, kir_expr *y);
kir_expr *kir_cast(ir_arena *a, dsc_dtype type, kir_expr *x);

/* Checks a kernel's structure: ranks, argument indices, access bounds for
 * every domain point (affine extremes against numel), slot use before
 * definition, types of operands. Writes the first problem into err. */
bool kir_validate(const kir_kernel *k, char *err, size_t errlen);

/* A readable listing of the kernel (for dumps and test failures); returns
 * the text allocated in `a`. */
char *kir_print(ir_arena *a, const kir_kernel *k);

/* Stable 64-bit hash of the kernel's structure (cache keys). */
uint64_t kir_hash(const kir_kernel *k);

/* ======================= codegen/kir_eval.c =======================
 * The kernel IR's reference evaluator: plain loops in double precision,
 * rounding loads and stores to the argument dtypes. args[i] points at the
 * i-th argument's storage. It is the oracle the LLVM and CUDA emitters are
 * tested against. Returns false (status 1 semantics) on a gather out of
 * range, after finishing the kernel. */
bool kir_eval(const kir_kernel *k, void *const *args);

/* Storage conversions shared by the evaluator and the runtimes: a double
 * read from / written to an element of `dtype` at p (bf16/f16 round to
 * nearest even, integers truncate toward zero, bool is != 0). */
double cg_load_elem(dsc_dtype dtype, const void *p);
void cg_store_elem(dsc_dtype dtype, void *p, double v);
uint16_t cg_f32_to_bf16(float x);
float cg_bf16_to_f32(uint16_t h);
uint16_t cg_f32_to_f16(float x);
float cg_f16_to_f32(uint16_t h);

/* ======================= codegen/program.c: the Program =======================
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
} cg_buffer;

typedef enum {
  CG_INS_LAUNCH,         /* kernel `kernel` with argument buffers args[] */
  CG_INS_GEMM,           /* see cg_gemm */
  CG_INS_EMBEDDING_GRAD, /* dst[rows, D] = 0; dst[ids[i], :] += src[i, :] */
  CG_INS_COPY,           /* dst = src, `numel` elements, same dtype, contiguous */
} cg_ins_kind;

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
  /* EMBEDDING_GRAD: ids (n_ids integers), src [n_ids, cols] contiguous, dst [rows, cols] */
  int ids, src, dst;
  int64_t n_ids, rows, cols;
  /* COPY: src -> dst, numel elements (from src_offset to dst_offset, elements) */
  int64_t numel, src_offset, dst_offset;
  const ir_node *node; /* the IR node it came from, for errors and traces (may be NULL) */
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
} cg_assign;

typedef struct {
  const char *graph_name;
  int n_buffers, cap_buffers;
  cg_buffer *buffers;
  int n_kernels, cap_kernels;
  kir_kernel **kernels;
  int n_instrs, cap_instrs;
  cg_instr *instrs;
  int n_outputs;
  cg_output *outputs;
  int n_assigns;
  cg_assign *assigns;
  int64_t arena_bytes[2]; /* STATE, WORK */
} cg_program;

/* ======================= codegen/lower.c =======================
 * Lowers graph g (after passes/fuse.c has set node groups) to a program:
 * one LAUNCH per fusion group, one GEMM per matmul (permutes, slices and
 * reshapes of its operands folded into strides), views for layout ops where
 * possible, buffers placed by liveness. Allocates in arena `a`. */
dsc_status cg_lower_graph(const ir_graph *g, ir_arena *a, cg_program **out);

/* A readable listing of a program (instructions, buffers, kernels). */
char *cg_program_print(ir_arena *a, const cg_program *p);

/* ======================= codegen/program_eval.c =======================
 * Runs a program with kir_eval and plain-loop GEMMs on host memory: the
 * reference for the program builder and for the backends. state and work
 * point at the two arenas (arena_bytes each). Returns false with a message
 * in err on a runtime error (gather out of range). */
bool cg_program_eval(const cg_program *p, void *state, void *work, char *err, size_t errlen);

/* ======================= codegen/llvm.c (DSC_HAVE_LLVM) =======================
 * CPU code generation: kernel IR -> LLVM IR (C API) -> the O3 pipeline for
 * the host CPU (vectorised) -> ORC LLJIT. A compiled kernel has the C ABI
 *   void kernel(void *const *args, int64_t outer_begin, int64_t outer_end,
 *               int32_t *status)
 * and runs the outer indices [outer_begin, outer_end) (flattened row-major
 * over the outer dims), so a thread pool splits the outer loop. */
typedef void (*cg_cpu_kernel_fn)(void *const *args, int64_t outer_begin, int64_t outer_end,
                                 int32_t *status);
typedef struct cg_llvm_jit cg_llvm_jit;
/* cache_dir: on-disk object cache keyed by kir_hash + target + dsc version
 * (NULL: no cache). */
cg_llvm_jit *cg_llvm_jit_new(dsc_context *ctx, const char *cache_dir);
void cg_llvm_jit_free(cg_llvm_jit *j);
/* Compiles kernels (one LLVM module) and returns their function pointers,
 * valid until cg_llvm_jit_free. Errors are diagnostics on ctx. */
dsc_status cg_llvm_compile(cg_llvm_jit *j, kir_kernel *const *kernels, int n,
                           cg_cpu_kernel_fn *fns);
/* The LLVM IR text of kernels before optimisation (for dumps and tests). */
char *cg_llvm_print_ir(dsc_context *ctx, kir_kernel *const *kernels, int n); /* ir_free-able via free() */
/* Bitcode of the kernels' module, for .dsx files (malloc'd; *len set). */
void *cg_llvm_bitcode(dsc_context *ctx, kir_kernel *const *kernels, int n, size_t *len);

/* ======================= codegen/cuda.c (DSC_HAVE_CUDA) =======================
 * GPU code generation: kernel IR -> CUDA C -> NVRTC -> PTX and cubin.
 * Mapping: a kernel with reductions runs one thread block per outer index
 * (threads stride the inner dims, block-wide reductions in shared memory);
 * a kernel without reductions runs one thread per domain point. */
typedef struct {
  unsigned grid[3], block[3];
  unsigned shared_bytes;
} cg_cuda_launch;
/* CUDA C source of one kernel (extern "C" __global__, named k->name), with
 * its launch configuration. The kernel's parameters are the argument
 * pointers in order, then `int *status`. Allocated in `a`. */
char *cg_cuda_source(ir_arena *a, const kir_kernel *k, cg_cuda_launch *launch);
/* NVRTC-compiles source for arch (e.g. 90 for sm_90): PTX text and cubin
 * (malloc'd, caller frees). The NVRTC log is in the diagnostic on failure. */
dsc_status cg_nvrtc_compile(dsc_context *ctx, const char *source, const char *name, int arch,
                            char **ptx, size_t *ptx_len, void **cubin, size_t *cubin_len);

#ifdef __cplusplus
}
#endif
#endif
