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
#include "program/program.h"

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
  KIR_SIN,
  KIR_COS,
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
  KIR_RAND24, /* i64: ir_rand24(seed a, counter b), dropout's bits */
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

struct kir_kernel { /* program/program.h holds it opaque */
  const char *name; /* a C identifier, unique within a program */
  int rank, n_outer;
  int64_t dims[KIR_MAX_RANK];
  int n_args;
  kir_arg *args;
  int n_slots;
  dsc_dtype *slot_types;
  int n_stages;
  kir_stage *stages;
  /* Every launch passes pairwise distinct buffers: buffers live at one
   * instruction never share bytes (the lowering's placement), so each
   * argument's memory is reached through that argument alone and the CPU
   * backend marks the pointers noalias (vectorised without runtime overlap
   * checks). The lowering sets it; the CPU executor checks each launch. */
  bool distinct_args;
};

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

/* Stable 64-bit hash of the kernel's name and structure (the kernel table,
 * .dsx entries), and of its structure alone (equal bodies under different
 * names: the JIT compiles them once). */
uint64_t kir_hash(const kir_kernel *k);
uint64_t kir_body_hash(const kir_kernel *k);

/* ======================= codegen/kir_eval.c =======================
 * The kernel IR's reference evaluator: plain loops in double precision,
 * rounding loads and stores to the argument dtypes. args[i] points at the
 * i-th argument's storage. It is the oracle the LLVM and CUDA emitters are
 * tested against. Returns false (status 1 semantics) on a gather out of
 * range, after finishing the kernel. */
bool kir_eval(const kir_kernel *k, void *const *args);


/* ======================= codegen/lower.c =======================
 * Lowers graph g (after passes/fuse.c has set node groups) to a program:
 * one LAUNCH per fusion group, one GEMM per matmul (permutes, slices and
 * reshapes of its operands folded into strides), views for layout ops where
 * possible, buffers placed by liveness. Allocates in arena `a`. */
dsc_status cg_lower_graph(const ir_graph *g, ir_arena *a, cg_program **out);

/* A readable listing of a program (instructions, buffers, kernels). */
char *cg_program_print(ir_arena *a, const cg_program *p);
/* Fills p->kernel_info (the executors' view of p's kernels, program/program.h)
 * from the kernel IR, in arena a: after the last change to the kernels
 * (cg_lower_graph calls it; a program built by hand calls it itself). */
dsc_status cg_program_kernel_table(ir_arena *a, cg_program *p);

/* ======================= codegen/memplan.c =======================
 * The memory plan of one rank's step (dsc plan, the trainer's "memory:"
 * line): the program's arenas split into categories at the instruction where
 * the WORK arena's live bytes peak. The arenas are exactly what the runtime
 * allocates (the same lowering); the file's top comment defines the
 * categories. */
typedef enum {
  CG_MEM_PARAMS,      /* trainable params (STATE) */
  CG_MEM_GRADS,       /* values with role IR_ROLE_GRAD live at the peak */
  CG_MEM_OPTIMIZER,   /* every module state (STATE) */
  CG_MEM_ACTIVATIONS, /* graph inputs and the loss's ancestors live at the peak */
  CG_MEM_WORKSPACE,   /* other live temporaries, alignment, fragmentation, GEMM scratch */
  CG_MEM_COMM,        /* collective src/dst live at the peak (not grads) */
  CG_MEM_COUNT
} cg_mem_kind;

typedef struct {
  int threads; /* CPU executor threads (the GEMM scratch is per thread); <= 0: 1 */
  /* runtime/sgemm.c's rt_sgemm_scratch_floats where the runtime uses it (f32
   * and bf16 GEMMs on AVX2/AVX-512 hosts: rt_sgemm_supported), else NULL */
  int64_t (*gemm_scratch_floats)(const cg_gemm *g);
} cg_memplan_options;

typedef struct {
  int64_t bytes[CG_MEM_COUNT]; /* they add up to peak */
  int64_t peak;                /* state_arena + work_arena + gemm_scratch */
  int64_t state_arena, work_arena, gemm_scratch;
  int64_t work_live;   /* exact bytes of the WORK buffers live at peak_instr */
  /* the most gradient bytes live at once (max over instructions, exact):
   * the gradients the model holds, the ZeRO paper's "G Psi" (grads above is
   * only what is live at the peak, often less: dsc frees nothing early, but a
   * gradient exists only from its backward op to its update) */
  int64_t grads_held;
  int peak_instr;      /* where the WORK arena's live bytes peak (n_instrs: at the end) */
  int n_instrs;
  int64_t padding;     /* alignment gaps of both arenas + WORK fragmentation (in workspace) */
  int64_t param_count; /* Psi: trainable elements of the whole model (unsharded) */
  int64_t param_elems, state_elems; /* elements this rank holds */
  bool sharded;        /* some param or state is a shard (meta "shard.<name>") */
  int64_t world, stage; /* module meta zero.world, zero.stage (1, 0 when absent) */
  /* Offload tiers (outside peak, which is the device's): the host arena
   * (host-tier values) plus the disk tier's staging arena, and the disk
   * tier's file (a header page plus two slots of the staging layout) */
  int64_t host_bytes, disk_bytes;
  int64_t host_params, host_optimizer; /* of host_bytes: tiered params, tiered states */
  int64_t host_arena, disk_staging;    /* host_bytes = host_arena + disk_staging + host_work;
                                        * disk_staging is 0: the disk tier streams (WORK) */
  int64_t host_work; /* the host work arena: host-placed temporaries (passes/offload_host.c) */
} cg_memplan;

/* The plan of program p, lowered from graph g. */
dsc_status cg_memplan_program(const ir_graph *g, const cg_program *p,
                              const cg_memplan_options *o, cg_memplan *out);
/* Lowers g (cg_lower_graph, in arena a) and plans it; *prog (optional)
 * receives the program. */
dsc_status cg_memplan_graph(const ir_graph *g, ir_arena *a, const cg_memplan_options *o,
                            cg_memplan *out, cg_program **prog);
/* Bytes of zero padding rank `rank` holds in its shards of the trainable
 * params (states false) or of the states (true): shard S of a tensor of n
 * elements holds n - rank*S real ones, clamped to [0, S]. */
int64_t cg_memplan_shard_padding(const ir_module *m, int64_t rank, bool states);
/* "params", "grads", "optimizer", "activations", "workspace", "comm". */
const char *cg_mem_kind_name(cg_mem_kind k);

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
/* (cg_cpu_kernel_fn: program/program.h) */
typedef struct cg_llvm_jit cg_llvm_jit;
/* cache_dir: on-disk object cache keyed by kir_hash + target + dsc version
 * (NULL: no cache). */
cg_llvm_jit *cg_llvm_jit_new(dsc_context *ctx, const char *cache_dir);
void cg_llvm_jit_free(cg_llvm_jit *j);
/* Compiles kernels (one LLVM module) and returns their function pointers,
 * valid until cg_llvm_jit_free. Errors are diagnostics on ctx. */
dsc_status cg_llvm_compile(cg_llvm_jit *j, kir_kernel *const *kernels, int n,
                           cg_cpu_kernel_fn *fns);
/* cg_llvm_compile where objs[i] (when objs and objs[i] are non-NULL) is a
 * prebuilt object of kernel i from cg_llvm_kernel_objects on the same host
 * (a .dsx file): loaded instead of compiled. */
dsc_status cg_llvm_compile_with(cg_llvm_jit *j, kir_kernel *const *kernels, int n,
                                cg_cpu_kernel_fn *fns, const void *const *objs,
                                const size_t *lens);
/* The optimised object files of kernels[0..n) for this host (objs[i]
 * malloc'd, lens[i] set; from the cache when present, the others compiled
 * as cg_llvm_compile does: each distinct one once, in parallel); on
 * failure every objs[i] is NULL and a diagnostic says why. */
dsc_status cg_llvm_kernel_objects(cg_llvm_jit *j, kir_kernel *const *kernels, int n, void **objs,
                                  size_t *lens);
/* "triple cpu features llvm-version": objects only load on an equal host. */
void cg_llvm_host(const cg_llvm_jit *j, char *buf, size_t len);
/* The same string for this process's host, without a JIT (a target machine
 * only); false (a diagnostic) when LLVM cannot make one. */
bool cg_llvm_host_string(dsc_context *ctx, char *buf, size_t len);
/* The LLVM IR text of kernels before optimisation (for dumps and tests). */
char *cg_llvm_print_ir(dsc_context *ctx, kir_kernel *const *kernels, int n); /* ir_free-able via free() */
/* Bitcode of the kernels' module, for .dsx files (malloc'd; *len set). */
void *cg_llvm_bitcode(dsc_context *ctx, kir_kernel *const *kernels, int n, size_t *len);
/* The LLVM IR text after the O3 pipeline for the host CPU (malloc'd): to
 * check vectorisation in tests and dumps. */
char *cg_llvm_print_optimized_ir(dsc_context *ctx, kir_kernel *const *kernels, int n);
/* Threads that compile kernels in parallel (0, the default: the CPUs this
 * process may run on). The result does not depend on it. */
void cg_llvm_jit_set_threads(cg_llvm_jit *j, int threads);
/* Kernels compiled by this JIT so far (equal kernels count once), and
 * kernels loaded from the disk cache or a program file. */
void cg_llvm_jit_stats(const cg_llvm_jit *j, int *compiled, int *cache_hits);
/* The object bytes linked into the JIT so far (the kernels' code and data). */
size_t cg_llvm_jit_code_bytes(const cg_llvm_jit *j);

/* ======================= codegen/cuda.c (DSC_HAVE_CUDA) =======================
 * GPU code generation: kernel IR -> CUDA C -> NVRTC -> PTX and cubin.
 * Mapping: a kernel with reductions runs one thread block per outer index
 * (threads stride the inner dims, block-wide reductions in shared memory);
 * a kernel without reductions runs one thread per domain point. */
/* (cg_cuda_launch: program/program.h) */
/* CUDA C source of one kernel (extern "C" __global__, named k->name), with
 * its launch configuration. The kernel's parameters are the argument
 * pointers in order, then `int *status`. Allocated in `a`. */
char *cg_cuda_source(ir_arena *a, const kir_kernel *k, cg_cuda_launch *launch);
/* The CUDA C of several kernels in one translation unit (names must be
 * distinct): one NVRTC compile per program is much faster than one per
 * kernel. Allocated in `a`; NULL with a diagnostic on a->ctx on failure. */
char *cg_cuda_program_source(ir_arena *a, kir_kernel *const *k, int n);
/* The launch configuration cg_cuda_source reports, without the source. The
 * kernels are correct for any grid size (grid-stride loops); the block size
 * must be the one given (it sizes the reductions). */
bool cg_cuda_launch_config(dsc_context *ctx, const kir_kernel *k, cg_cuda_launch *launch);
/* NVRTC-compiles source for arch (e.g. 90 for sm_90): PTX text and cubin
 * (malloc'd, caller frees). The NVRTC log is in the diagnostic on failure. */
dsc_status cg_nvrtc_compile(dsc_context *ctx, const char *source, const char *name, int arch,
                            char **ptx, size_t *ptx_len, void **cubin, size_t *cubin_len);


/* ======================= codegen/cuda_templates.c =======================
 * Hand-written CUDA kernels for the ops whose kernel IR form would be slow
 * (the kernels/ .cuh files, embedded into the library at build time): fused softmax +
 * cross-entropy, layernorm, flash-style causal attention, multi-tensor
 * AdamW. Each template is C++-templated on the storage type (f32, bf16,
 * f16; compute in f32) and instantiated by text: the source for NVRTC is
 * the template file (includes inlined) plus one DSC_<NAME>_INSTANTIATE line
 * per parameter set, defining extern "C" entry points named
 * dsc_<entry>_<suffix> (e.g. dsc_layernorm_fwd_bf16,
 * dsc_softmax_ce_fwd_f32_i64, dsc_attention_fwd_f32_hd64). The kernels'
 * parameter lists are documented in the .cuh files. Available without
 * DSC_HAVE_CUDA (text only); compiling needs cg_nvrtc_compile. */
typedef enum {
  CG_TPL_SOFTMAX_CE,
  CG_TPL_LAYERNORM,
  CG_TPL_ATTENTION,
  CG_TPL_ADAMW,
  CG_TPL_COUNT
} cg_cuda_template_id;

typedef enum {
  CG_ENTRY_SOFTMAX_CE_FWD, /* grid N: losses, lse, optional probs */
  CG_ENTRY_CE_LOSS_MEAN,   /* grid 1: mean of the N losses */
  CG_ENTRY_SOFTMAX_CE_BWD, /* grid N: dlogits */
  CG_ENTRY_LAYERNORM_FWD,
  CG_ENTRY_LAYERNORM_BWD,      /* dx and per-block dw/db partials */
  CG_ENTRY_LAYERNORM_BWD_DWDB, /* partials -> dw, db */
  CG_ENTRY_ATTENTION_FWD,
  CG_ENTRY_ATTENTION_BWD_PRE, /* D = rowsum(dO * O) */
  CG_ENTRY_ATTENTION_BWD_DQ,
  CG_ENTRY_ATTENTION_BWD_DKDV,
  CG_ENTRY_ADAMW,
  CG_ENTRY_COUNT
} cg_cuda_entry;

typedef struct {
  const char *name;        /* "layernorm" */
  const char *file;        /* "layernorm.cuh" (kernels/) */
  const char *instantiate; /* "DSC_LAYERNORM_INSTANTIATE" */
  cg_cuda_entry first_entry;
  int n_entries;
} cg_cuda_template;

/* Template parameters: dtype is the storage type (f32 bf16 f16; adamw: the
 * gradient and weight-copy type); index_dtype the softmax_ce targets' type
 * (i32 i64); head_dim the attention head size (1..128). */
typedef struct {
  dsc_dtype dtype;
  dsc_dtype index_dtype;
  int head_dim;
} cg_cuda_template_params;

/* Problem sizes for a launch configuration. softmax_ce: rows = N, cols = V;
 * layernorm: rows = N, cols = C; attention: batch, seq, heads (head_dim
 * from the params); adamw: n_tensors, max_numel (largest tensor). */
typedef struct {
  int64_t rows, cols;
  int64_t batch, seq, heads;
  int64_t n_tensors, max_numel;
} cg_cuda_template_sizes;

const cg_cuda_template *cg_cuda_template_info(cg_cuda_template_id id);
cg_cuda_template_id cg_cuda_entry_template(cg_cuda_entry e);
const char *cg_cuda_entry_base(cg_cuda_entry e); /* "layernorm_bwd_dwdb" */
/* The embedded text of kernels/<file> (NULL if there is no such file). */
const char *cg_cuda_kernel_file(const char *file);
/* The entry-name suffix for params ("bf16", "f32_i64", "f16_hd128"); false
 * (and err) when the params are not supported by the template. */
bool cg_cuda_template_suffix(cg_cuda_template_id id, const cg_cuda_template_params *p, char *buf,
                             size_t len, char *err, size_t errlen);
/* The extern "C" name of an entry point: dsc_<base>_<suffix>. */
bool cg_cuda_entry_name(cg_cuda_entry e, const cg_cuda_template_params *p, char *buf, size_t len,
                        char *err, size_t errlen);
/* Self-contained NVRTC source: the template with its includes inlined,
 * then one instantiation per element of params (duplicates once). Several
 * templates' sources may be concatenated into one program (include guards).
 * Allocated in `a`; NULL and err on unsupported params. */
char *cg_cuda_template_source(ir_arena *a, cg_cuda_template_id id,
                              const cg_cuda_template_params *params, int n_params, char *err,
                              size_t errlen);
/* Launch configuration (grid, block, dynamic shared bytes) of an entry for
 * the sizes; false and err when the sizes are out of the kernel's range
 * (non-positive, over int32, shared memory beyond 48 KiB, grid limits). */
bool cg_cuda_template_launch(cg_cuda_entry e, const cg_cuda_template_params *p,
                             const cg_cuda_template_sizes *s, cg_cuda_launch *out, char *err,
                             size_t errlen);
/* layernorm backward: rows are split into n_parts contiguous chunks of
 * rows_per_block (kernel arguments; dw/db partial buffers are
 * n_parts x C floats each). */
void cg_cuda_layernorm_bwd_split(int64_t rows, int64_t *rows_per_block, int64_t *n_parts);

/* The host mirror of kernels/adamw.cuh's dsc_adamw_tensor<T> (the device
 * array the multi-tensor AdamW launch reads): device addresses. */
typedef struct {
  uint64_t w, g, m, v, w_copy; /* f32, T, f32, f32, T (0: no copy) */
  int64_t n;
  float weight_decay;
  float pad_;
} cg_adamw_tensor;

/* ======================= codegen/cache.c =======================
 * The kernel cache, one for both targets: compiled objects in directory
 * dir as <key>.<ext> ("o": LLVM objects, "cubin"), each a header (magic,
 * key, length, FNV-1a of the payload) then the payload. A file absent,
 * short, of another key or corrupt is a miss (NULL); writes are atomic and
 * best effort (a failure only costs a recompile). magic: 8 bytes. */
#define CG_FNV_INIT 0xcbf29ce484222325ull
uint64_t cg_fnv1a(uint64_t h, const void *p, size_t n);
void *cg_cache_read(dsc_context *ctx, const char *dir, uint64_t key, const char *ext,
                    const char *magic, uint64_t max_len, size_t *len); /* malloc'd */
void cg_cache_write(dsc_context *ctx, const char *dir, uint64_t key, const char *ext,
                    const char *magic, const void *data, size_t len);

/* ======================= codegen/compile_cuda.c (DSC_HAVE_CUDA) =======================
 * Compiling, separate from any device (testable without a GPU): the cubin
 * of program p's kernels for sm_<arch> (malloc'd; free()), from the kernel
 * cache in cache_dir when present there (*from_cache), else compiled by
 * NVRTC and stored there (cache_dir NULL: no cache). A program without
 * kernels gives *cubin NULL and DSC_OK. */
dsc_status cg_cuda_compile_program(dsc_context *ctx, ir_arena *a, const cg_program *p, int arch,
                                   const char *cache_dir, void **cubin, size_t *len,
                                   bool *from_cache);
/* The CUDA executor's own kernels (kernels/helpers.cuh: embedding gradient
 * accumulation, f32 scratch conversions), compiled the same way. */
dsc_status cg_cuda_compile_helpers(dsc_context *ctx, int arch, const char *cache_dir,
                                   void **cubin, size_t *len, bool *from_cache);
/* NVRTC compile of source with the kernel cache (the key: a hash of the
 * source, the arch and the dsc and NVRTC versions). */
dsc_status cg_cuda_compile_cached(dsc_context *ctx, const char *source, const char *name, int arch,
                                  const char *cache_dir, void **cubin, size_t *len,
                                  bool *from_cache);

/* ======================= codegen/compile.c =======================
 * The compile step: every graph of m lowered (cg_lower_graph) and its
 * kernels compiled for target (cpu: LLVM objects linked into a JIT session,
 * prebuilt ones taken from `program`'s module `program_module` when they
 * fit this host; cuda: NVRTC cubins for sm_<cuda_arch>), through the kernel
 * cache (cg_kernel_cache_dir(cache_dir)). *out is released with
 * (*out)->release((*out)->owner): by the executor that takes it. */
typedef struct {
  cg_target target;
  int cuda_arch;
  const char *cache_dir; /* NULL: cg_kernel_cache_dir's default */
  const dsc_program *program;
  const char *program_module;
  /* Called (when set) with every lowered Program before any kernel is
   * compiled: a plan the caller refuses (memory this host lacks) fails in
   * milliseconds, not after the JIT. Its error status is returned. */
  dsc_status (*check_lowered)(dsc_context *ctx, cg_program *const *programs, int n);
} cg_compile_options;
dsc_status cg_compile_module(dsc_module *m, const cg_compile_options *o,
                             cg_compiled_module **out);
/* The kernel cache directory, written into buf: option, else
 * $DSC_CACHE_DIR, else $XDG_CACHE_HOME/dsc, else $HOME/.cache/dsc; NULL
 * (no cache) when the one chosen is "off", or none can be named. */
const char *cg_kernel_cache_dir(const char *option, char *buf, size_t len);

#ifdef __cplusplus
}
#endif
#endif
