/* dsc public API: executing a module's graphs on a backend.
 *
 * An executor owns the values of a module's params and states in the
 * backend's native form (f32 arrays for the CPU backend, device memory for
 * CUDA) and runs any of the module's graphs on them. dsc_params (doubles)
 * stay the canonical host copy used for initialisation and checkpoints:
 * copy them in with dsc_exec_set_params, out with dsc_exec_get_params.
 *
 *   interp  the reference interpreter (include/dsc/interp.h), always built
 *   cpu     LLVM-JIT kernels on a thread pool + oneDNN GEMMs (DSC_HAVE_LLVM)
 *   cuda    NVRTC kernels + cuBLASLt on an NVIDIA GPU (DSC_HAVE_CUDA)
 *
 * The cpu and cuda backends need every graph fused first (the pipeline's
 * "fuse" pass: dsc_run_pipeline without stop_after). */
#ifndef DSC_EXEC_H
#define DSC_EXEC_H

#include "dsc/core.h"
#include "dsc/interp.h"
#include "dsc/ir.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { DSC_BACKEND_INTERP, DSC_BACKEND_CPU, DSC_BACKEND_CUDA } dsc_backend;

/* "interp" "cpu" "cuda"; dsc_backend_from_name returns 0 on success. */
const char *dsc_backend_name(dsc_backend b);
int dsc_backend_from_name(const char *name, dsc_backend *out);
/* Whether this build has the backend (interp: always). */
bool dsc_backend_available(dsc_backend b);
/* The default: cpu where it is built, else interp. */
dsc_backend dsc_backend_default(void);

/* A program file (.dsx) written by `dsc compile`: modules as text IR plus
 * their compiled kernels (see "program files" below). */
typedef struct dsc_program dsc_program;

typedef struct {
  dsc_backend backend;
  int threads;           /* cpu: worker threads; 0 = one per core */
  /* on-disk kernel cache; NULL: $DSC_CACHE_DIR, else $XDG_CACHE_HOME/dsc,
   * else ~/.cache/dsc; "off" (here or in $DSC_CACHE_DIR): none */
  const char *cache_dir;
} dsc_exec_options;

typedef struct dsc_exec dsc_exec;

/* Compiles every graph of m for the backend. Params and states start as
 * zeros: call dsc_exec_set_params before the first run. m must outlive the
 * executor and must not change while it lives. */
dsc_status dsc_exec_new(dsc_module *m, const dsc_exec_options *opts, dsc_exec **out);
/* dsc_exec_new with prebuilt kernels: the cpu backend loads the objects of
 * m's graphs from `program` (its module `program_module`, e.g. "step")
 * instead of compiling them, when they fit this host and dsc version
 * (dsc_program_cpu_usable says why not); kernels the file lacks or that
 * changed are compiled. program NULL: dsc_exec_new. (A separate entry, not
 * an options field, so that positional initialisers of dsc_exec_options
 * stay complete under -Wextra.) */
dsc_status dsc_exec_new_with_program(dsc_module *m, const dsc_exec_options *opts,
                                     const dsc_program *program, const char *program_module,
                                     dsc_exec **out);
void dsc_exec_free(dsc_exec *e);
dsc_backend dsc_exec_backend(const dsc_exec *e);

/* Copies every param and state in (p from dsc_params_init(m, ...)) or out. */
dsc_status dsc_exec_set_params(dsc_exec *e, const dsc_params *p);
dsc_status dsc_exec_get_params(dsc_exec *e, dsc_params *p);
/* Copies the values of src, the params of another module, into this
 * executor's params and states of the same names and types (an error
 * names any that it lacks); the others keep their values. An inference
 * module (driver/infer.c) takes a checkpoint's weights this way without a
 * double copy of its KV cache. */
dsc_status dsc_exec_load_params(dsc_exec *e, const dsc_params *src);

/* Memory tiers (passes/offload.c, module meta tier.<name>; docs/memory.md
 * "Offload"): host-tier values live in an arena of their own; disk-tier
 * values in the file `path` (created, truncated), two slots per value: a
 * run streams them (the cpu backend: the graph's tier_read/tier_write ops,
 * on the file's IO threads; the interpreter: before and after the run) and,
 * when it writes them and completes, the other slot becomes the active one.
 * A module with disk values needs this before dsc_exec_set_params (which
 * writes the file); set/get_params read and write every tier transparently.
 * Nothing (DSC_OK) without disk values. dsc_exec_tier_bytes: the bytes of
 * each tier's arena (disk: the size of a slot of the file; no memory). */
dsc_status dsc_exec_set_offload_file(dsc_exec *e, const char *path);
void dsc_exec_tier_bytes(const dsc_exec *e, int64_t *device, int64_t *host, int64_t *disk);

/* Runs graph `graph` (by name) as dsc_interp_run does: inputs must match
 * the graph's input types, outputs receives one new tensor per graph output
 * (free with dsc_tensor_free), `assign`s update the executor's params and
 * states when the run completed (on an error nothing is updated). */
dsc_status dsc_exec_run(dsc_exec *e, const char *graph, const dsc_tensor *const *inputs,
                        int n_inputs, dsc_tensor **outputs);

/* Runs one training step (dsc_interp_run_step's contract, include/dsc/interp.h):
 * with grad_accum K > 1, "micro_step" on each micro-batch's rows of the
 * data inputs, then "train_step" on lr (the last input); else "train_step"
 * on all inputs. outputs: train_step's. A failure in a micro-batch leaves
 * the params and optimizer states as they were. */
dsc_status dsc_exec_run_step(dsc_exec *e, const dsc_tensor *const *inputs, int n_inputs,
                             dsc_tensor **outputs);

/* The communicator the collective ops (all_reduce_start/wait, ...) of every
 * later dsc_exec_run go through; NULL unsets it; DSC_OK (cuda: see below). Every
 * backend: interp passes it to dsc_interp_run_with; cpu runs each start as
 * the matching asynchronous dsc_comm_*_start (compute continues until the
 * wait) and each wait as dsc_comm_wait. The executor does not own comm: it
 * must outlive the runs that use it (or be unset first).
 * - A graph with collectives run without a communicator, or with one whose
 *   world differs from an op's `world` attribute, fails with DSC_ERR_USER
 *   naming the op before anything is started (as the interpreter does; the
 *   communicator is not aborted).
 * - The tag of each collective is its op's `tag` attribute, as in the
 *   interpreter: there is no per-run step argument (a caller that wants the
 *   training step in comm messages and in-process mismatch checks builds
 *   the graph with the step as the tag).
 * - Any error once the run started (a failed collective, a kernel's index
 *   out of range): dsc_exec_run returns DSC_ERR_USER with the comm's
 *   message on the executor's context; unless the communicator itself
 *   failed it is aborted (dsc_comm_abort: "graph 'G' failed: ...") so that
 *   no other rank hangs; every started collective is waited before the
 *   return. Nothing is assigned then.
 * - dtypes (cpu): sums of f32, f64, i32, i64 go to the communicator as is,
 *   sums of bf16/f16 travel as f32 (widened before the start, summed in f32,
 *   rounded to the dtype after the wait); gather and broadcast move any
 *   dtype.
 * - cuda: collectives run on NCCL (docs/gpu.md "Collectives"); binding a
 *   communicator moves the executor to the rank's GPU (rank % devices, or
 *   $DSC_CUDA_DEVICE), which can fail (DSC_ERR_USER with the message). */
dsc_status dsc_exec_set_comm(dsc_exec *e, dsc_comm *comm);
/* The tag (the step) every collective of a compiled backend carries from
 * now on, so that a failed collective names its step; the interpreter reads
 * the graph's tags (dsc_graph_set_collective_tags). */
void dsc_exec_set_collective_tag(dsc_exec *e, int64_t tag);

/* Chrome trace of every later run (include/dsc/trace.h), as rank pid: the
 * cpu backend traces each instruction (kernels, GEMMs, copies, each
 * collective and its wait); the interpreter one compute event per graph
 * run. NULL: off. Not owned: it must outlive the runs (or be unset).
 * DSC_ERR_INTERNAL when out of memory. */
typedef struct dsc_trace dsc_trace;
dsc_status dsc_exec_set_trace(dsc_exec *e, dsc_trace *trace, int pid);

/* Kernels the executor compiled, and kernels it loaded prebuilt from a
 * program (cpu backend; the interpreter has none). */
void dsc_exec_kernel_counts(const dsc_exec *e, int *compiled, int *prebuilt);
/* Kernels it loaded from the kernel cache (dsc_exec_options.cache_dir). */
int dsc_exec_kernels_cached(const dsc_exec *e);
/* cuda: the bytes the executor holds on the GPU (arenas, GEMM workspace,
 * scratch: all of it allocated when the executor was made, so this is the
 * peak of every run); 0 on the other backends. */
int64_t dsc_exec_device_bytes(const dsc_exec *e);

/* The host memory the executor holds that it can name (cpu backend; zeros
 * elsewhere): its arenas (STATE, the one WORK arena its programs share, the
 * host tiers and host work arenas) as allocated and as resident now (the
 * pages the runs touched, by mincore), the GEMM packing scratch resident,
 * the object bytes of the kernels it linked (their code and data), and the
 * resident-set growth while its kernels compiled that the malloc heap does
 * not hold (the compile threads' stacks, LLVM's mappings), less that code.
 * -1 in a field it cannot tell. */
typedef struct {
  int64_t arenas, arenas_resident, gemm_scratch_resident, kernel_code, compile_other;
} dsc_exec_memory;
void dsc_exec_memory_report(const dsc_exec *e, dsc_exec_memory *out);

/* Per-instruction timing of the compiled backends (off by default; the
 * interpreter has none). dsc_exec_print_profile prints graph's `top`
 * slowest instructions (kernel launches, GEMMs, ...) with their share of
 * the time, summed over the runs since profiling was switched on, plus a
 * total per instruction kind. */
void dsc_exec_set_profiling(dsc_exec *e, bool on);
dsc_status dsc_exec_print_profile(dsc_exec *e, const char *graph, int top, FILE *out);
/* Where graph's timed runs went, in the terms of DeepSpeed's
 * wall_clock_breakdown (ms summed over the runs since profiling was
 * switched on): fwd, the forward (with stage 3's all-gathers for it); bwd,
 * the backward, split into bwd_allreduce, its gradient all-reduces and
 * reduce-scatters (the start and the wait: what the overlap leaves
 * exposed), and bwd_inner, the rest (recomputation and stage 3's
 * all-gathers included); step, the optimizer step (the gradient norm's
 * reduction excepted, and stages 1-2's all-gather of the updated params
 * included). Phases are read from the step graph (ir/phase.c). */
typedef struct {
  double fwd, bwd, bwd_inner, bwd_allreduce, step;
  int64_t runs;
} dsc_phase_times;
dsc_status dsc_exec_phase_times(dsc_exec *e, const char *graph, dsc_phase_times *out);
/* Whether the backend times instructions (profile, phase times). */
bool dsc_exec_has_profile(const dsc_exec *e);

/* ---- program files (.dsx) ----
 * A checksummed container (program/dsx.c) of named sections: "meta" (text
 * key=value lines: format, target, host, the options the graphs were built
 * with), "module.<name>" (a module's text IR after the pipeline), and per
 * graph the kernels: "cpu/<module>/<graph>" (one object per kernel for the
 * host named in meta) or "cuda/<module>/<graph>.cu|.ptx|.cubin". Written by
 * dsc_program_compile (include/dsc/trainer.h); docs/codegen.md. */
#define DSC_PROGRAM_FORMAT 1
/* dsc's version (`dsc --version`); a .dsx's kernels load only into the
 * dsc that wrote them, since generated code may change between versions. */
#define DSC_VERSION "0.1.0"
/* True when the file starts with the .dsx magic (false if unreadable). */
bool dsc_program_is_file(const char *path);
/* Reads and checks the whole file (checksums, format version, meta). */
dsc_status dsc_program_open(dsc_context *ctx, const char *path, dsc_program **out);
void dsc_program_free(dsc_program *p);
const char *dsc_program_path(const dsc_program *p);
/* A meta value (NULL if absent). */
const char *dsc_program_meta(const dsc_program *p, const char *key);
/* A meta value that must be a positive integer; a diagnostic otherwise. */
dsc_status dsc_program_meta_i64(const dsc_program *p, const char *key, int64_t *out);
/* Parses section "module.<name>" into a new module (on p's context). */
dsc_status dsc_program_module(const dsc_program *p, const char *name, dsc_module **out);
/* Whether the file's cpu kernels can load on this host; if not, why (one
 * line: another target, CPU, LLVM or dsc version) in why[0..n). */
bool dsc_program_cpu_usable(const dsc_program *p, char *why, size_t n);
/* The sections, for listings. */
int dsc_program_section_count(const dsc_program *p);
const char *dsc_program_section_name(const dsc_program *p, int i);
size_t dsc_program_section_size(const dsc_program *p, int i);

#ifdef __cplusplus
}
#endif
#endif
