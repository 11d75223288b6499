/* The CUDA executor (runtime/cuda_api.h): lowered programs on one GPU
 * through the driver API, NVRTC cubins and cuBLASLt.
 *
 * Build, plan, then compute, as runtime/exec_cpu.c: rt_cuda_exec_new lowers
 * and validates every program, compiles its kernels (one NVRTC program per
 * graph, cubins cached on disk), allocates the arenas and the pinned
 * staging buffers and resolves every launch's argument array and every
 * GEMM's cuBLASLt plan; a run converts the inputs into pinned memory,
 * copies them in on the copy stream, enqueues the instructions on the
 * compute stream, copies the kernels' status words and the outputs back
 * and synchronises once (twice when there are assigns to apply).
 *
 * Errors a kernel detects (a gather index out of range) set the int the
 * kernel's `int *status` argument points at: one per instruction, so that
 * the message names the instruction and the kernel, as on the cpu backend.
 * Collectives run on NCCL (runtime/nccl_api.h, opened at run time): the
 * executor's communicator (rt_cuda_exec_set_comm) moves it to its rank's
 * GPU (the rank on its node % devices, or $DSC_CUDA_DEVICE) and, on the first run with
 * collectives, makes an NCCL communicator through it (rank 0's unique id
 * broadcast over the dsc_comm); each COLLECTIVE_START is enqueued on the
 * comm stream after an event of the compute stream, each WAIT makes the
 * compute stream wait on the collective's event, so compute overlaps the
 * communication as the IR's start/wait edges allow. */
#include <stdarg.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/cuda_api.h"
#include "runtime/nccl_api.h"
#include "runtime/runtime.h"

#ifndef DSC_HAVE_CUDA

static dsc_status no_cuda(dsc_context *ctx) {
  ir_error(ctx, ir_no_loc, "backend cuda: this dsc was built without the CUDA toolkit");
  return DSC_ERR_USER;
}
dsc_status rt_cuda_device_arch(dsc_context *ctx, int *arch) {
  *arch = 0;
  return no_cuda(ctx);
}
dsc_status rt_cuda_exec_new(dsc_module *m, const cg_compiled_module *c, rt_cuda_exec **out) {
  (void)c;
  *out = NULL;
  return no_cuda(dsc_module_context(m));
}
void rt_cuda_exec_free(rt_cuda_exec *e) { (void)e; }
dsc_status rt_cuda_exec_set_params(rt_cuda_exec *e, const dsc_params *p) {
  (void)e, (void)p;
  return DSC_ERR_INTERNAL;
}
dsc_status rt_cuda_exec_get_params(rt_cuda_exec *e, dsc_params *p) {
  (void)e, (void)p;
  return DSC_ERR_INTERNAL;
}
dsc_status rt_cuda_exec_set_param(rt_cuda_exec *e, int i, const dsc_tensor *t) {
  (void)e, (void)i, (void)t;
  return DSC_ERR_INTERNAL;
}
dsc_status rt_cuda_exec_run(rt_cuda_exec *e, int gi, const dsc_tensor *const *inputs, int n_inputs,
                            dsc_tensor **outputs) {
  (void)e, (void)gi, (void)inputs, (void)n_inputs, (void)outputs;
  return DSC_ERR_INTERNAL;
}
dsc_status rt_cuda_exec_set_comm(rt_cuda_exec *e, dsc_comm *comm) {
  (void)e, (void)comm;
  return DSC_OK;
}
void rt_cuda_exec_set_profiling(rt_cuda_exec *e, bool on) { (void)e, (void)on; }
dsc_status rt_cuda_exec_print_profile(rt_cuda_exec *e, int gi, int top, FILE *out) {
  (void)e, (void)gi, (void)top, (void)out;
  return DSC_ERR_INTERNAL;
}
dsc_status rt_cuda_exec_phase_times(rt_cuda_exec *e, int gi, dsc_phase_times *out) {
  (void)e, (void)gi, (void)out;
  return DSC_ERR_INTERNAL;
}
int64_t rt_cuda_exec_device_bytes(const rt_cuda_exec *e) {
  (void)e;
  return 0;
}

#else /* DSC_HAVE_CUDA */

#include <cublasLt.h>
#include <pthread.h>
#include <time.h>

/* ---------------- the executor ---------------- */

#define WORKSPACE_BYTES ((size_t)32 << 20) /* cuBLASLt's recommended size on Hopper */
#define HELPER_BLOCK 256u
#define HELPER_GRID_MAX 65535u

typedef struct {
  CUdeviceptr src, dst;
  size_t bytes;
} cu_copy;

typedef struct {
  const cg_program *p;
  int graph;
  CUmodule mod;
  CUfunction *fns;          /* per kernel */
  cg_cuda_launch *launch;   /* per kernel */
  CUdeviceptr **argv;       /* per instruction (LAUNCH): argument values, then status */
  void ***params;           /* per instruction (LAUNCH): kernelParams (pointers into argv) */
  rt_cublaslt_plan *plans;  /* per instruction (GEMM) */
  cu_copy *assigns;         /* non-in-place assigns */
  int n_assigns;
  /* pinned staging: graph inputs, graph outputs, status words */
  char *host;
  size_t host_bytes;
  size_t *in_off, *out_off; /* per graph input / output, bytes into host */
  size_t status_off, badpos_off, status_bytes;
  CUdeviceptr status;       /* int32 per instruction, then uint64 per instruction */
  CUevent *prof;            /* n_instrs + 1 timing events (profiling) */
  CUevent *coll_done;       /* per collective id: its NCCL call done (comm stream) */
  double *prof_ms;
  int64_t runs;
} cu_prog;

struct rt_cuda_exec {
  dsc_context *ctx;
  dsc_module *m;
  const rt_cuda_api *api;
  ir_arena arena;
  CUdevice dev;
  CUcontext cuctx;
  bool ctx_retained;
  int arch;
  char device_name[128];
  CUstream compute, comm_stream, copy;
  CUevent ev_in, ev_done;
  cublasLtHandle_t lt;
  CUmodule helpers;
  CUfunction emb[4][2][2]; /* [src f32 f64 bf16 f16][acc f32 f64][ids i32 i64] */
  CUfunction set_rows[2];  /* [ids i32 i64] */
  CUfunction to_f32[2], from_f32[2]; /* [bf16, f16] */
  int n_progs;
  cu_prog *progs;
  int64_t *state_offsets;
  int64_t state_bytes, work_bytes, scratch_bytes;
  CUdeviceptr state, work, workspace, scratch;
  dsc_comm *comm;
  bool profiling;
  bool broken; /* a sticky CUDA error: the context is unusable */
  char broken_why[300];
  const cg_compiled_module *c; /* the compile step's Programs and cubins (not owned) */
  /* collectives (NCCL): the communicator is made on the first run with
   * collectives, for the dsc_comm bound then (nccl_of) */
  int ordinal; /* the CUDA device */
  const rt_nccl_api *nccl;
  rt_nccl_comm nccl_comm;
  dsc_comm *nccl_of;
  /* a mesh's groups that the programs' collectives name (cg_collective.group):
   * their NCCL communicators, made beside the world's */
  int n_groups;
  char group_name[DSC_MESH_MAX_AXES][8];
  dsc_comm *group_of[DSC_MESH_MAX_AXES];
  rt_nccl_comm group_nccl[DSC_MESH_MAX_AXES];
  CUevent ev_coll; /* compute -> comm before each collective */
};

/* Every NCCL communicator of e: the world's, then the groups'. */
static int nccl_comms(const rt_cuda_exec *e, rt_nccl_comm *out) {
  int n = 0;
  if (e->nccl_comm) out[n++] = e->nccl_comm;
  for (int g = 0; g < e->n_groups; g++)
    if (e->group_nccl[g]) out[n++] = e->group_nccl[g];
  return n;
}

/* Forgets the groups' communicators, destroying (or, after a failure,
 * aborting) them. */
static void drop_groups(rt_cuda_exec *e, bool abort) {
  for (int g = 0; g < e->n_groups; g++)
    if (e->group_nccl[g]) {
      if (abort)
        e->nccl->CommAbort(e->group_nccl[g]);
      else
        e->nccl->CommDestroy(e->group_nccl[g]);
    }
  e->n_groups = 0;
}

#define CU(call, ...) rt_cu_check(e->api, e->ctx, (call), __VA_ARGS__)

static int emb_src_index(dsc_dtype t) {
  switch (t) {
    case DSC_F32: return 0;
    case DSC_F64: return 1;
    case DSC_BF16: return 2;
    case DSC_F16: return 3;
    default: return -1;
  }
}

static const char *instr_op(const cg_instr *in) {
  if (in->op) return in->op;
  switch (in->kind) {
    case CG_INS_LAUNCH: return "kernel";
    case CG_INS_GEMM: return "matmul";
    case CG_INS_EMBEDDING_GRAD: return "embedding gradient";
    case CG_INS_SET_ROWS:
      return "set rows";
    case CG_INS_COPY: return "copy";
    case CG_INS_COLLECTIVE_START: return "collective start";
    case CG_INS_COLLECTIVE_WAIT: return "collective wait";
    default: break; /* kinds this backend refuses at load (offload transfers) */
  }
  return "instruction";
}

static bool bad(rt_cuda_exec *e, const cg_program *p, int ins, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static bool bad(rt_cuda_exec *e, const cg_program *p, int ins, const char *fmt, ...) {
  char msg[300];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  const char *name = p->graph_name ? p->graph_name : "?";
  if (ins >= 0)
    ir_error(e->ctx, ir_no_loc, "backend cuda: program '%s': instruction %d: %s", name, ins, msg);
  else
    ir_error(e->ctx, ir_no_loc, "backend cuda: program '%s': %s", name, msg);
  return false;
}

static int64_t buf_numel(const cg_program *p, int b) { return p->buffers[b].numel; }

static CUdeviceptr buf_dev(const rt_cuda_exec *e, const cg_program *p, int b) {
  const cg_buffer *cb = &p->buffers[b];
  return (cb->kind == CG_BUF_PARAM ? e->state : e->work) + (CUdeviceptr)cb->offset;
}

/* cg_program_verify against this backend's arenas (no host or disk tier),
 * plus what it refuses: GEMMs cuBLASLt has no plan for, embedding-gradient
 * dtypes kernels/helpers.cuh lacks. Sizes the embedding-gradient scratch.
 * Needs no device, so a bad program is refused before one is set up. */
static bool check_prog(rt_cuda_exec *e, const cg_program *p) {
  cg_verify_limits lim = {{e->state_bytes, 0, 0}, false, "cuda"};
  if (!cg_program_verify(e->ctx, p, &lim)) return false;
  for (int i = 0; i < p->n_instrs; i++) {
    const cg_instr *in = &p->instrs[i];
    if (in->kind == CG_INS_GEMM) {
      const cg_gemm *g = &in->gemm;
      dsc_dtype ab = p->buffers[g->a.buffer].dtype, c = p->buffers[g->c.buffer].dtype;
      bool ok = (ab == DSC_F32 && c == DSC_F32) ||
                ((ab == DSC_BF16 || ab == DSC_F16) && (c == ab || c == DSC_F32));
      if (!ok)
        return bad(e, p, i, "%s: cuBLASLt has no %s x %s -> %s matmul (f32, bf16, f16 only)",
                   instr_op(in), dsc_dtype_name(ab), dsc_dtype_name(ab), dsc_dtype_name(c));
    } else if (in->kind == CG_INS_EMBEDDING_GRAD) {
      dsc_dtype st = p->buffers[in->src].dtype, dt = p->buffers[in->dst].dtype;
      if (emb_src_index(st) < 0 || emb_src_index(dt) < 0)
        return bad(e, p, i, "embedding gradient: %s -> %s has no kernel (f32, f64, bf16, f16)",
                   dsc_dtype_name(st), dsc_dtype_name(dt));
      if ((dt == DSC_BF16 || dt == DSC_F16) && in->rows * in->cols * 4 > e->scratch_bytes)
        e->scratch_bytes = in->rows * in->cols * 4;
    }
  }
  return true;
}

/* Device memory; the purpose goes into the error. */
static bool dev_alloc(rt_cuda_exec *e, CUdeviceptr *p, int64_t bytes, const char *what) {
  char size[32];
  rt_format_bytes(size, sizeof size, bytes);
  /* cuMemAlloc refuses 0 bytes: an empty arena still gets a valid address */
  return CU(e->api->MemAlloc(p, (size_t)(bytes > 0 ? bytes : 256)), "cuMemAlloc(%s for %s)", size,
            what);
}

static bool get_fn(rt_cuda_exec *e, CUmodule mod, const char *name, CUfunction *f) {
  return CU(e->api->ModuleGetFunction(f, mod, name), "cuModuleGetFunction(%s)", name);
}

static bool load_module(rt_cuda_exec *e, const void *cubin, size_t len, bool cached, const char *what,
                        CUmodule *mod) {
  (void)len;
  CUresult r = e->api->ModuleLoadData(mod, cubin);
  if (r != CUDA_SUCCESS && cached) {
    /* a cubin from the cache that does not load (another driver): it was
     * keyed by sm_XY and the NVRTC version, so this is rare; say so */
    return CU(r, "cuModuleLoadData(%s, from the kernel cache: remove the cache dir to rebuild)",
              what);
  }
  return CU(r, "cuModuleLoadData(%s)", what);
}

/* The driver, the device e->ordinal, its name and SM (e->arch). */
static bool open_device(rt_cuda_exec *e) {
  char why[512];
  if (!(e->api = rt_cuda_api_get(why, sizeof why))) {
    ir_error(e->ctx, ir_no_loc, "backend cuda: no CUDA driver (%s)", why);
    return false;
  }
  const rt_cuda_api *a = e->api;
  CUresult r = a->Init(0);
  int count = 0;
  if (r == CUDA_ERROR_NO_DEVICE || (r == CUDA_SUCCESS && a->DeviceGetCount(&count) == CUDA_SUCCESS &&
                                    count < 1)) {
    ir_error(e->ctx, ir_no_loc, "backend cuda: no CUDA device");
    return false;
  }
  if (r == CUDA_ERROR_STUB_LIBRARY) {
    ir_error(e->ctx, ir_no_loc,
             "backend cuda: no CUDA driver (the library opened is the toolkit's stub, not a "
             "driver)");
    return false;
  }
  if (!CU(r, "backend cuda: cuInit")) return false;
  if (e->ordinal >= count) {
    ir_error(e->ctx, ir_no_loc, "backend cuda: no CUDA device %d (%d device%s)", e->ordinal, count,
             count == 1 ? "" : "s");
    return false;
  }
  if (!CU(a->DeviceGet(&e->dev, e->ordinal), "cuDeviceGet(%d)", e->ordinal)) return false;
  if (a->DeviceGetName(e->device_name, (int)sizeof e->device_name, e->dev) != CUDA_SUCCESS)
    snprintf(e->device_name, sizeof e->device_name, "CUDA device %d", e->ordinal);
  int major = 0, minor = 0;
  if (!CU(a->DeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, e->dev),
          "cuDeviceGetAttribute(compute capability major)") ||
      !CU(a->DeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, e->dev),
          "cuDeviceGetAttribute(compute capability minor)"))
    return false;
  e->arch = major * 10 + minor;
  return true;
}

static bool setup_device(rt_cuda_exec *e) {
  if (!open_device(e)) return false;
  const rt_cuda_api *a = e->api;
  if (!CU(a->DevicePrimaryCtxRetain(&e->cuctx, e->dev), "cuDevicePrimaryCtxRetain(device %d)",
          e->ordinal))
    return false;
  e->ctx_retained = true;
  if (!CU(a->CtxSetCurrent(e->cuctx), "cuCtxSetCurrent")) return false;
  if (!CU(a->StreamCreate(&e->compute, CU_STREAM_NON_BLOCKING), "cuStreamCreate(compute)") ||
      !CU(a->StreamCreate(&e->comm_stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate(comm)") ||
      !CU(a->StreamCreate(&e->copy, CU_STREAM_NON_BLOCKING), "cuStreamCreate(copy)") ||
      !CU(a->EventCreate(&e->ev_in, CU_EVENT_DISABLE_TIMING), "cuEventCreate(inputs copied)") ||
      !CU(a->EventCreate(&e->ev_done, CU_EVENT_DISABLE_TIMING), "cuEventCreate(compute done)"))
    return false;
  cublasStatus_t ls = cublasLtCreate(&e->lt);
  if (ls != CUBLAS_STATUS_SUCCESS) {
    e->lt = NULL;
    ir_error(e->ctx, ir_no_loc, "cublasLtCreate: %s", cublasLtGetStatusName(ls));
    return false;
  }
  return true;
}

static bool load_helpers(rt_cuda_exec *e) {
  if (!load_module(e, e->c->helpers, e->c->helpers_len, e->c->cached > 0,
                   "the executor's helper kernels", &e->helpers))
    return false;
  static const char *src_names[4] = {"f32", "f64", "bf16", "f16"};
  static const char *acc_names[2] = {"f32", "f64"}, *id_names[2] = {"i32", "i64"};
  char name[64];
  for (int s = 0; s < 4; s++)
    for (int a = 0; a < 2; a++)
      for (int i = 0; i < 2; i++) {
        snprintf(name, sizeof name, "dsc_embgrad_%s_%s_%s", src_names[s], acc_names[a],
                 id_names[i]);
        if (!get_fn(e, e->helpers, name, &e->emb[s][a][i])) return false;
      }
  return get_fn(e, e->helpers, "dsc_set_rows_i32", &e->set_rows[0]) &&
         get_fn(e, e->helpers, "dsc_set_rows_i64", &e->set_rows[1]) &&
         get_fn(e, e->helpers, "dsc_bf16_to_f32", &e->to_f32[0]) &&
         get_fn(e, e->helpers, "dsc_f16_to_f32", &e->to_f32[1]) &&
         get_fn(e, e->helpers, "dsc_f32_to_bf16", &e->from_f32[0]) &&
         get_fn(e, e->helpers, "dsc_f32_to_f16", &e->from_f32[1]);
}

static size_t align8(size_t n) { return (n + 7) & ~(size_t)7; }

/* Everything of program pi that needs the device: its module, functions,
 * launch arrays, GEMM plans, pinned staging and status words. */
static bool load_prog(rt_cuda_exec *e, cu_prog *cp) {
  const cg_program *p = cp->p;
  const dsc_graph *g = dsc_module_graph(e->m, cp->graph);
  size_t n = (size_t)(p->n_instrs > 0 ? p->n_instrs : 1), nk = (size_t)(p->n_kernels + 1);
  cp->fns = ir_arena_alloc(&e->arena, sizeof *cp->fns * nk);
  cp->launch = ir_arena_alloc(&e->arena, sizeof *cp->launch * nk);
  cp->argv = ir_arena_alloc(&e->arena, sizeof *cp->argv * n);
  cp->params = ir_arena_alloc(&e->arena, sizeof *cp->params * n);
  cp->plans = ir_arena_alloc(&e->arena, sizeof *cp->plans * n);
  cp->assigns = ir_arena_alloc(&e->arena, sizeof *cp->assigns * (size_t)(p->n_assigns + 1));
  int n_in = dsc_graph_input_count(g);
  cp->in_off = ir_arena_alloc(&e->arena, sizeof(size_t) * (size_t)(n_in + 1));
  cp->out_off = ir_arena_alloc(&e->arena, sizeof(size_t) * (size_t)(p->n_outputs + 1));
  cp->prof_ms = ir_arena_alloc(&e->arena, sizeof(double) * n);
  if (!cp->fns || !cp->launch || !cp->argv || !cp->params || !cp->plans || !cp->assigns ||
      !cp->in_off || !cp->out_off || !cp->prof_ms) {
    ir_error(e->ctx, ir_no_loc, "backend cuda: out of host memory loading '%s'", p->graph_name);
    return false;
  }
  memset(cp->plans, 0, sizeof *cp->plans * n);
  memset(cp->prof_ms, 0, sizeof(double) * n);
  /* kernels: one module per program */
  if (p->n_kernels > 0) {
    const cg_kernel_objects *ko = &e->c->kernels[cp->graph];
    char what[200];
    snprintf(what, sizeof what, "the %d kernels of graph '%s'", p->n_kernels, p->graph_name);
    if (!ko->object || !load_module(e, ko->object, ko->object_len, e->c->cached > 0, what, &cp->mod))
      return false;
    for (int k = 0; k < p->n_kernels; k++) {
      if (!get_fn(e, cp->mod, p->kernel_info[k].name, &cp->fns[k])) return false;
      cp->launch[k] = ko->launch[k];
    }
  }
  /* staging: inputs | outputs | status words */
  size_t off = 0;
  for (int i = 0; i < n_in; i++) {
    dsc_type t = dsc_node_type(dsc_graph_input_at(g, i));
    cp->in_off[i] = off;
    off = align8(off + (size_t)dsc_type_numel(&t) * dsc_dtype_size(t.dtype));
  }
  for (int o = 0; o < p->n_outputs; o++) {
    cp->out_off[o] = off;
    off = align8(off + (size_t)dsc_type_numel(&p->outputs[o].type) *
                           dsc_dtype_size(p->outputs[o].type.dtype));
  }
  cp->status_off = off;
  cp->badpos_off = align8(off + 4 * n);
  cp->status_bytes = cp->badpos_off + 8 * n - cp->status_off;
  cp->host_bytes = cp->badpos_off + 8 * n;
  char size[32];
  rt_format_bytes(size, sizeof size, (int64_t)cp->host_bytes);
  void *host = NULL;
  if (!CU(e->api->MemAllocHost(&host, cp->host_bytes),
          "cuMemAllocHost(%s of pinned staging for graph '%s')", size, p->graph_name))
    return false;
  cp->host = host;
  char what[200];
  snprintf(what, sizeof what, "the status words of graph '%s'", p->graph_name);
  if (!dev_alloc(e, &cp->status, (int64_t)cp->status_bytes, what)) return false;
  /* launches and GEMM plans */
  for (int i = 0; i < p->n_instrs; i++) {
    const cg_instr *in = &p->instrs[i];
    if (in->kind == CG_INS_LAUNCH) {
      int na = in->n_args;
      CUdeviceptr *argv = ir_arena_alloc(&e->arena, sizeof *argv * (size_t)(na + 1));
      void **params = ir_arena_alloc(&e->arena, sizeof *params * (size_t)(na + 1));
      if (!argv || !params) return bad(e, p, i, "out of host memory");
      for (int a = 0; a < na; a++) argv[a] = buf_dev(e, p, in->args[a]);
      argv[na] = cp->status + (CUdeviceptr)(4 * (size_t)i);
      for (int a = 0; a <= na; a++) params[a] = &argv[a];
      cp->argv[i] = argv;
      cp->params[i] = params;
    } else if (in->kind == CG_INS_GEMM) {
      const cg_gemm *gm = &in->gemm;
      dsc_dtype ab = p->buffers[gm->a.buffer].dtype, c = p->buffers[gm->c.buffer].dtype;
      rt_gemm_precision prec = ab == DSC_BF16 ? RT_GEMM_BF16 : ab == DSC_F16 ? RT_GEMM_F16
                                                                             : RT_GEMM_F32;
      if (rt_cublaslt_plan_init(e->ctx, gm, ab, c, prec, &cp->plans[i]) != DSC_OK)
        return bad(e, p, i, "%s: no cuBLASLt plan (see the previous message)", instr_op(in));
    }
  }
  for (int a = 0; a < p->n_assigns; a++) {
    const cg_assign *as = &p->assigns[a];
    if (as->in_place) continue;
    int pb = cg_param_buffer(p, as->param);
    cu_copy *c = &cp->assigns[cp->n_assigns++];
    c->src = buf_dev(e, p, as->buffer);
    c->dst = buf_dev(e, p, pb);
    c->bytes = (size_t)buf_numel(p, pb) * dsc_dtype_size(p->buffers[pb].dtype);
  }
  return true;
}

void rt_cuda_exec_free(rt_cuda_exec *e) {
  if (!e) return;
  const rt_cuda_api *a = e->api;
  if (a && e->ctx_retained) {
    a->CtxSetCurrent(e->cuctx);
    /* finish whatever is in flight before freeing its memory (errors here
     * were reported by the run that caused them) */
    if (e->compute) a->StreamSynchronize(e->compute);
    if (e->copy) a->StreamSynchronize(e->copy);
    if (e->comm_stream) a->StreamSynchronize(e->comm_stream);
    if (e->nccl_comm) e->nccl->CommDestroy(e->nccl_comm);
    drop_groups(e, false);
    if (e->ev_coll) a->EventDestroy(e->ev_coll);
    for (int i = 0; e->progs && i < e->n_progs; i++) {
      cu_prog *cp = &e->progs[i];
      if (cp->plans)
        for (int j = 0; j < cp->p->n_instrs; j++)
          if (cp->p->instrs[j].kind == CG_INS_GEMM) rt_cublaslt_plan_destroy(&cp->plans[j]);
      if (cp->prof)
        for (int j = 0; j <= cp->p->n_instrs; j++)
          if (cp->prof[j]) a->EventDestroy(cp->prof[j]);
      if (cp->coll_done)
        for (int j = 0; j < cp->p->n_collectives; j++)
          if (cp->coll_done[j]) a->EventDestroy(cp->coll_done[j]);
      if (cp->host) a->MemFreeHost(cp->host);
      if (cp->status) a->MemFree(cp->status);
      if (cp->mod) a->ModuleUnload(cp->mod);
    }
    if (e->helpers) a->ModuleUnload(e->helpers);
    if (e->state) a->MemFree(e->state);
    if (e->work) a->MemFree(e->work);
    if (e->workspace) a->MemFree(e->workspace);
    if (e->scratch) a->MemFree(e->scratch);
    if (e->lt) cublasLtDestroy(e->lt);
    if (e->ev_in) a->EventDestroy(e->ev_in);
    if (e->ev_done) a->EventDestroy(e->ev_done);
    if (e->compute) a->StreamDestroy(e->compute);
    if (e->comm_stream) a->StreamDestroy(e->comm_stream);
    if (e->copy) a->StreamDestroy(e->copy);
    a->DevicePrimaryCtxRelease(e->dev);
  } else {
    /* no device was set up: only host-side plans can exist */
    for (int i = 0; e->progs && i < e->n_progs; i++)
      if (e->progs[i].plans)
        for (int j = 0; j < e->progs[i].p->n_instrs; j++)
          if (e->progs[i].p->instrs[j].kind == CG_INS_GEMM)
            rt_cublaslt_plan_destroy(&e->progs[i].plans[j]);
  }
  ir_arena_release(&e->arena);
  ir_free(e->ctx, e, sizeof *e);
}

/* $DSC_CUDA_DEVICE (an ordinal >= 0), or -1 when unset. */
static int env_device(void) {
  const char *s = getenv("DSC_CUDA_DEVICE");
  if (!s || !s[0]) return -1;
  char *end;
  long v = strtol(s, &end, 10);
  return *end == 0 && v >= 0 && v < 1 << 20 ? (int)v : -1;
}

static dsc_status exec_new_on(dsc_module *m, const cg_compiled_module *c, int ordinal,
                              rt_cuda_exec **out) {
  *out = NULL;
  dsc_context *ctx = dsc_module_context(m);
  rt_cuda_exec *e = ir_alloc(ctx, sizeof *e);
  if (!e) {
    ir_error(ctx, ir_no_loc, "backend cuda: out of memory");
    return DSC_ERR_INTERNAL;
  }
  memset(e, 0, sizeof *e);
  e->ctx = ctx;
  e->m = m;
  e->ordinal = ordinal;
  ir_arena_init(&e->arena, ctx);
  e->c = c;
  dsc_status st = DSC_ERR_USER;
  int np = dsc_module_param_count(m);
  e->n_progs = dsc_module_graph_count(m);
  e->progs = ir_arena_alloc(&e->arena, sizeof *e->progs * (size_t)(e->n_progs + 1));
  e->state_offsets = ir_arena_alloc(&e->arena, sizeof(int64_t) * (size_t)(np + 1));
  if (!e->progs || !e->state_offsets) {
    st = DSC_ERR_INTERNAL;
    goto fail;
  }
  memset(e->progs, 0, sizeof *e->progs * (size_t)(e->n_progs + 1));
  if (!cg_state_layout(m, e->state_offsets, &e->state_bytes)) {
    ir_error(ctx, ir_no_loc, "backend cuda: the params' sizes overflow");
    goto fail;
  }
  for (int i = 0; i < np; i++)
    if (cg_param_tier(m, i) != CG_TIER_DEVICE) {
      ir_error(ctx, ir_no_loc,
               "backend cuda: '%s' is offloaded to %s memory: offload is not implemented on the "
               "cuda backend yet (train without offload, or on the cpu backend)",
               dsc_module_param_name(m, i), cg_param_tier(m, i) == CG_TIER_DISK ? "disk" : "host");
      goto fail;
    }
  if (c->n_programs != e->n_progs) {
    ir_error(ctx, ir_no_loc, "backend cuda: %d programs for the module's %d graphs",
             c->n_programs, e->n_progs);
    st = DSC_ERR_INTERNAL;
    goto fail;
  }
  for (int i = 0; i < e->n_progs; i++) {
    const cg_program *p = c->programs[i];
    e->progs[i].p = p;
    e->progs[i].graph = i;
    if (!check_prog(e, p)) goto fail;
    if (p->arena_bytes[CG_ARENA_WORK] > e->work_bytes) e->work_bytes = p->arena_bytes[CG_ARENA_WORK];
  }
  /* The programs are sound: now the device, and what NCCL must support. */
  if (!setup_device(e)) goto fail;
  if (e->arch != c->cuda_arch) {
    ir_error(ctx, ir_no_loc, "backend cuda: %s is sm_%d, the kernels were compiled for sm_%d",
             e->device_name, e->arch, c->cuda_arch);
    goto fail;
  }
  for (int i = 0; i < e->n_progs; i++)
    if (!rt_nccl_check_program(ctx, c->programs[i])) goto fail;
  /* The memory plan against what the device has free, before allocating. */
  size_t free_b = 0, total_b = 0;
  if (!CU(e->api->MemGetInfo(&free_b, &total_b), "cuMemGetInfo")) goto fail;
  int64_t need = e->state_bytes + e->work_bytes + (int64_t)WORKSPACE_BYTES + e->scratch_bytes;
  if (need > (int64_t)free_b) {
    char a[32], b[32], c[32], d[32];
    rt_format_bytes(a, sizeof a, need);
    rt_format_bytes(b, sizeof b, e->state_bytes);
    rt_format_bytes(c, sizeof c, e->work_bytes);
    rt_format_bytes(d, sizeof d, (int64_t)free_b);
    ir_error(ctx, ir_no_loc,
             "backend cuda: the program needs %s of device memory (STATE %s, WORK %s, cuBLASLt "
             "workspace and scratch) but %s has %s free",
             a, b, c, e->device_name, d);
    goto fail;
  }
  if (!dev_alloc(e, &e->state, e->state_bytes, "the STATE arena") ||
      !dev_alloc(e, &e->work, e->work_bytes, "the WORK arena") ||
      !dev_alloc(e, &e->workspace, (int64_t)WORKSPACE_BYTES, "the cuBLASLt workspace") ||
      (e->scratch_bytes > 0 &&
       !dev_alloc(e, &e->scratch, e->scratch_bytes, "the embedding-gradient scratch")))
    goto fail;
  /* params start as zeros (include/dsc/exec.h) */
  if (!CU(e->api->MemsetD8Async(e->state, 0, (size_t)(e->state_bytes > 0 ? e->state_bytes : 256),
                                e->compute),
          "cuMemsetD8Async(STATE arena)") ||
      !CU(e->api->StreamSynchronize(e->compute), "cuStreamSynchronize(compute)"))
    goto fail;
  if (!load_helpers(e)) goto fail;
  for (int i = 0; i < e->n_progs; i++)
    if (!load_prog(e, &e->progs[i])) goto fail;
  *out = e;
  return DSC_OK;
fail:
  if (st == DSC_OK) st = DSC_ERR_USER;
  rt_cuda_exec_free(e);
  return st;
}

dsc_status rt_cuda_exec_new(dsc_module *m, const cg_compiled_module *c, rt_cuda_exec **out) {
  int dev = env_device();
  return exec_new_on(m, c, dev >= 0 ? dev : 0, out);
}

dsc_status rt_cuda_device_arch(dsc_context *ctx, int *arch) {
  /* what setup_device finds, with its messages, and nothing made */
  *arch = 0;
  rt_cuda_exec probe;
  memset(&probe, 0, sizeof probe);
  probe.ctx = ctx;
  int dev = env_device();
  probe.ordinal = dev >= 0 ? dev : 0;
  if (!open_device(&probe)) return DSC_ERR_USER;
  *arch = probe.arch;
  return DSC_OK;
}

/* A failed stream operation may have left the context broken (sticky
 * errors: an illegal address, a launch failure): later calls refuse. */
static void note_sticky(rt_cuda_exec *e, CUresult r) {
  if (r == CUDA_ERROR_ILLEGAL_ADDRESS || r == CUDA_ERROR_LAUNCH_FAILED ||
      r == CUDA_ERROR_MISALIGNED_ADDRESS || r == CUDA_ERROR_ILLEGAL_INSTRUCTION ||
      r == CUDA_ERROR_HARDWARE_STACK_ERROR || r == CUDA_ERROR_INVALID_PC ||
      r == CUDA_ERROR_ASSERT || r == CUDA_ERROR_ECC_UNCORRECTABLE || r == CUDA_ERROR_UNKNOWN) {
    e->broken = true;
    rt_cu_error_text(e->api, r, e->broken_why, sizeof e->broken_why);
  }
}

static bool usable(rt_cuda_exec *e) {
  if (e->broken) {
    ir_error(e->ctx, ir_no_loc,
             "backend cuda: the GPU context failed earlier (%s); the executor cannot run again",
             e->broken_why);
    return false;
  }
  return CU(e->api->CtxSetCurrent(e->cuctx), "cuCtxSetCurrent");
}

static bool sync_stream(rt_cuda_exec *e, CUstream s, const char *what) {
  CUresult r = e->api->StreamSynchronize(s);
  if (r == CUDA_SUCCESS) return true;
  note_sticky(e, r);
  return CU(r, "cuStreamSynchronize(%s)", what);
}

static dsc_status params_io(rt_cuda_exec *e, dsc_params *p, bool in) {
  if (!usable(e)) return DSC_ERR_USER;
  int np = dsc_module_param_count(e->m);
  size_t bytes = (size_t)(e->state_bytes > 0 ? e->state_bytes : 1);
  void *host = NULL;
  char size[32];
  rt_format_bytes(size, sizeof size, (int64_t)bytes);
  if (!CU(e->api->MemAllocHost(&host, bytes), "cuMemAllocHost(%s to copy the params %s)", size,
          in ? "in" : "out"))
    return DSC_ERR_USER;
  char *base = host;
  bool ok = true;
  if (e->state_bytes == 0) {
    /* nothing to copy */
  } else if (in) {
    memset(base, 0, bytes);
    for (int i = 0; i < np; i++) {
      dsc_type ty = dsc_module_param_type(e->m, i);
      size_t es = dsc_dtype_size(ty.dtype);
      const dsc_tensor *t = dsc_params_get(p, i);
      int64_t n = dsc_type_numel(&ty);
      for (int64_t j = 0; j < n; j++)
        cg_store_elem(ty.dtype, base + e->state_offsets[i] + j * (int64_t)es, t->data[j]);
    }
    ok = CU(e->api->MemcpyHtoDAsync(e->state, host, (size_t)e->state_bytes, e->copy),
            "cuMemcpyHtoDAsync(%s of params in)", size) &&
         sync_stream(e, e->copy, "copy: params in");
  } else {
    ok = CU(e->api->MemcpyDtoHAsync(host, e->state, (size_t)e->state_bytes, e->copy),
            "cuMemcpyDtoHAsync(%s of params out)", size) &&
         sync_stream(e, e->copy, "copy: params out");
    for (int i = 0; ok && i < np; i++) {
      dsc_type ty = dsc_module_param_type(e->m, i);
      size_t es = dsc_dtype_size(ty.dtype);
      dsc_tensor *t = dsc_params_get(p, i);
      int64_t n = dsc_type_numel(&ty);
      for (int64_t j = 0; j < n; j++)
        t->data[j] = cg_load_elem(ty.dtype, base + e->state_offsets[i] + j * (int64_t)es);
    }
  }
  if (!ok) e->api->StreamSynchronize(e->copy);
  e->api->MemFreeHost(host);
  return ok ? DSC_OK : DSC_ERR_USER;
}

dsc_status rt_cuda_exec_set_params(rt_cuda_exec *e, const dsc_params *p) {
  return params_io(e, (dsc_params *)p, true);
}

dsc_status rt_cuda_exec_get_params(rt_cuda_exec *e, dsc_params *p) {
  return params_io(e, p, false);
}

dsc_status rt_cuda_exec_set_param(rt_cuda_exec *e, int i, const dsc_tensor *t) {
  if (!usable(e)) return DSC_ERR_USER;
  size_t es = dsc_dtype_size(t->type.dtype);
  int64_t n = dsc_type_numel(&t->type);
  size_t bytes = (size_t)n * es + 1;
  void *host = NULL;
  if (!CU(e->api->MemAllocHost(&host, bytes), "cuMemAllocHost(%zu bytes to copy a param in)",
          bytes))
    return DSC_ERR_USER;
  for (int64_t j = 0; j < n; j++)
    cg_store_elem(t->type.dtype, (char *)host + j * (int64_t)es, t->data[j]);
  bool ok = n == 0 || (CU(e->api->MemcpyHtoDAsync(e->state + (CUdeviceptr)e->state_offsets[i], host,
                                                  (size_t)n * es, e->copy),
                          "cuMemcpyHtoDAsync(param %d in)", i) &&
                       sync_stream(e, e->copy, "copy: a param in"));
  e->api->MemFreeHost(host);
  return ok ? DSC_OK : DSC_ERR_USER;
}

/* The executor, rebuilt on device `ordinal` with the params and states
 * copied over (the device of an executor is fixed when it is made, before
 * the caller binds the rank's communicator). */
static dsc_status move_to_device(rt_cuda_exec *e, int ordinal) {
  rt_cuda_exec *n = NULL;
  dsc_status st = exec_new_on(e->m, e->c, ordinal, &n);
  if (st != DSC_OK) return st;
  dsc_params *p = dsc_params_init(e->m, 0);
  st = p ? rt_cuda_exec_get_params(e, p) : DSC_ERR_INTERNAL;
  if (st == DSC_OK) st = rt_cuda_exec_set_params(n, p);
  dsc_params_free(p);
  if (st != DSC_OK) {
    rt_cuda_exec_free(n);
    return st;
  }
  n->profiling = e->profiling;
  rt_cuda_exec old = *e;
  *e = *n;
  *n = old;
  rt_cuda_exec_free(n); /* the old device's resources, in n's allocation */
  return DSC_OK;
}

dsc_status rt_cuda_exec_set_comm(rt_cuda_exec *e, dsc_comm *comm) {
  if (e->nccl_comm && e->nccl_of != comm) {
    /* made for the ranks of another communicator */
    if (e->comm_stream) e->api->StreamSynchronize(e->comm_stream);
    e->nccl->CommDestroy(e->nccl_comm);
    drop_groups(e, false);
    e->nccl_comm = NULL;
    e->nccl_of = NULL;
  }
  e->comm = comm;
  if (!comm) return DSC_OK;
  int want = env_device(), count = 0;
  if (want < 0 && e->api->DeviceGetCount(&count) == CUDA_SUCCESS && count > 0)
    want = dsc_comm_local_rank(comm) % count; /* global rank % count collides across nodes */
  if (want < 0 || want == e->ordinal) return DSC_OK;
  dsc_status st = move_to_device(e, want);
  e->comm = comm;
  if (st != DSC_OK)
    ir_error(e->ctx, ir_no_loc, "backend cuda: rank %d could not move to CUDA device %d",
             dsc_comm_rank(comm), want);
  return st;
}


int64_t rt_cuda_exec_device_bytes(const rt_cuda_exec *e) {
  return e ? e->state_bytes + e->work_bytes + (int64_t)WORKSPACE_BYTES + e->scratch_bytes : 0;
}

static unsigned helper_grid(int64_t n) {
  int64_t g = (n + HELPER_BLOCK - 1) / HELPER_BLOCK;
  return (unsigned)(g < 1 ? 1 : g > HELPER_GRID_MAX ? HELPER_GRID_MAX : g);
}

static bool launch_helper(rt_cuda_exec *e, CUfunction f, int64_t n, void **params, const char *what,
                          int i) {
  return CU(e->api->LaunchKernel(f, helper_grid(n), 1, 1, HELPER_BLOCK, 1, 1, 0, e->compute,
                                 params, NULL),
            "cuLaunchKernel(%s, instruction %d)", what, i);
}

static bool run_embgrad(rt_cuda_exec *e, cu_prog *cp, int i) {
  const cg_program *p = cp->p;
  const cg_instr *in = &p->instrs[i];
  dsc_dtype dt = p->buffers[in->dst].dtype;
  CUdeviceptr ids = buf_dev(e, p, in->ids), src = buf_dev(e, p, in->src),
              dst = buf_dev(e, p, in->dst);
  int64_t total = in->rows * in->cols;
  bool half = dt == DSC_BF16 || dt == DSC_F16;
  int hi = dt == DSC_F16;
  CUdeviceptr acc = half ? e->scratch : dst;
  size_t acc_bytes = (size_t)total * (dt == DSC_F64 ? 8 : 4);
  long long n_tot = total;
  if (half && in->accumulate) {
    void *cv[] = {&dst, &acc, &n_tot};
    if (!launch_helper(e, e->to_f32[hi], total, cv, "embedding gradient: widen", i)) return false;
  } else if (!in->accumulate || half) {
    if (acc_bytes > 0 &&
        !CU(e->api->MemsetD8Async(acc, 0, acc_bytes, e->compute),
            "cuMemsetD8Async(embedding gradient, instruction %d)", i))
      return false;
  }
  CUdeviceptr status = cp->status + (CUdeviceptr)(4 * (size_t)i);
  CUdeviceptr badpos = cp->status + (CUdeviceptr)(cp->badpos_off - cp->status_off + 8 * (size_t)i);
  long long n_ids = in->n_ids, rows = in->rows, cols = in->cols;
  void *params[] = {&ids, &src, &acc, &n_ids, &rows, &cols, &status, &badpos};
  CUfunction f = e->emb[emb_src_index(p->buffers[in->src].dtype)][dt == DSC_F64]
                       [p->buffers[in->ids].dtype == DSC_I64];
  if (n_ids * cols > 0 && !launch_helper(e, f, n_ids * cols, params, "embedding gradient", i))
    return false;
  if (half) {
    void *cv[] = {&acc, &dst, &n_tot};
    if (!launch_helper(e, e->from_f32[hi], total, cv, "embedding gradient: round", i))
      return false;
  }
  return true;
}

/* set_rows: the rows in place in dst, one block per row */
static bool run_set_rows(rt_cuda_exec *e, cu_prog *cp, int i) {
  const cg_program *p = cp->p;
  const cg_instr *in = &p->instrs[i];
  CUdeviceptr ids = buf_dev(e, p, in->ids), src = buf_dev(e, p, in->src),
              dst = buf_dev(e, p, in->dst);
  long long n_ids = in->n_ids, rows = in->rows;
  long long row_bytes = in->cols * (long long)dsc_dtype_size(p->buffers[in->dst].dtype);
  if (n_ids <= 0 || row_bytes <= 0) return true;
  void *params[] = {&ids, &src, &dst, &n_ids, &rows, &row_bytes};
  unsigned grid = n_ids < 65535 ? (unsigned)n_ids : 65535u;
  return CU(e->api->LaunchKernel(e->set_rows[p->buffers[in->ids].dtype == DSC_I64], grid, 1, 1,
                                 HELPER_BLOCK, 1, 1, 0, e->compute, params, NULL),
            "cuLaunchKernel(set rows, instruction %d)", i);
}

/* ---------------- collectives (NCCL) ---------------- */

#define NCCL(call, ...) rt_nccl_check(e->nccl, e->ctx, (call), __VA_ARGS__)

/* The communicator's last message, when it is on another context. */
static void comm_message(rt_cuda_exec *e, const char *what) {
  dsc_context *cc = dsc_comm_context(e->comm);
  int nd = dsc_diag_count(cc);
  if (cc != e->ctx && nd > 0)
    ir_error(e->ctx, ir_no_loc, "%s: %s", what, dsc_diag_get(cc, nd - 1)->message);
  else
    ir_error(e->ctx, ir_no_loc, "%s failed%s", what, nd > 0 ? " (see the previous message)" : "");
}

/* Every rank's verdict on its part of the setup: true when all are ok. */
static bool all_ranks_ok(rt_cuda_exec *e, bool ok, int64_t tag, const char *stage) {
  int32_t bad_ranks = ok ? 0 : 1;
  if (dsc_comm_all_reduce(e->comm, &bad_ranks, &bad_ranks, 1, DSC_I32, DSC_COMM_SUM, tag) !=
      DSC_OK) {
    comm_message(e, "backend cuda: NCCL setup: dsc_comm_all_reduce");
    return false;
  }
  if (bad_ranks > 0 && ok)
    ir_error(e->ctx, ir_no_loc, "backend cuda: NCCL setup: %d rank%s failed %s", (int)bad_ranks,
             bad_ranks == 1 ? "" : "s", stage);
  return bad_ranks == 0;
}

/* An NCCL communicator over the ranks of c (the world or one of its mesh's
 * groups): c's rank 0's unique id goes to its ranks through c; every rank of
 * the world agrees after each stage. */
static bool nccl_init(rt_cuda_exec *e, dsc_comm *c, int64_t tag, rt_nccl_comm *out) {
  const rt_cuda_api *a = e->api;
  int rank = dsc_comm_rank(c), world = dsc_comm_world(c);
  /* [0]: rank 0's status, then the 128-byte id (as i64s: any dtype moves) */
  int64_t msg[1 + RT_NCCL_UNIQUE_ID_BYTES / 8];
  memset(msg, 0, sizeof msg);
  if (rank == 0) {
    rt_nccl_unique_id id;
    if (NCCL(e->nccl->GetUniqueId(&id), "ncclGetUniqueId (%s)", e->nccl->path))
      memcpy(&msg[1], &id, sizeof id);
    else
      msg[0] = 1;
  }
  if (dsc_comm_broadcast(c, msg, (int64_t)(sizeof msg / 8), DSC_I64, 0, tag) != DSC_OK) {
    comm_message(e, "backend cuda: NCCL setup: dsc_comm_broadcast of the unique id");
    return false;
  }
  if (msg[0] != 0) {
    if (rank != 0)
      ir_error(e->ctx, ir_no_loc, "backend cuda: NCCL setup: ncclGetUniqueId failed on rank 0");
    return false;
  }
  rt_nccl_unique_id id;
  memcpy(&id, &msg[1], sizeof id);
  rt_nccl_comm nc = NULL;
  bool ok = CU(a->CtxSetCurrent(e->cuctx), "cuCtxSetCurrent") &&
            NCCL(e->nccl->CommInitRank(&nc, world, id, rank),
                 "ncclCommInitRank(%s, world %d, rank %d, %s)", dsc_comm_name(c), world, rank,
                 e->device_name);
  if (!ok) nc = NULL;
  if (!all_ranks_ok(e, ok, tag, "ncclCommInitRank")) {
    if (nc) e->nccl->CommAbort(nc);
    return false;
  }
  *out = nc;
  return true;
}

static rt_nccl_comm group_nccl(const rt_cuda_exec *e, const char *group) {
  if (!group[0]) return e->nccl_comm;
  for (int g = 0; g < e->n_groups; g++)
    if (strcmp(e->group_name[g], group) == 0 && e->group_of[g] == dsc_comm_group(e->comm, group))
      return e->group_nccl[g];
  return NULL;
}

/* The NCCL communicator for e->comm (first run with collectives): rank 0's
 * unique id goes to every rank through the dsc_comm, every rank joins on
 * its device. The ranks agree after each stage, so that one rank's failure
 * fails all of them instead of leaving the others waiting in NCCL. */
static bool nccl_setup(rt_cuda_exec *e, cu_prog *cp, int64_t tag) {
  const cg_program *p = cp->p;
  const rt_cuda_api *a = e->api;
  if (!cp->coll_done) {
    CUevent *ev = ir_arena_alloc(&e->arena, sizeof *ev * (size_t)p->n_collectives);
    if (!ev) return bad(e, p, -1, "out of host memory");
    memset(ev, 0, sizeof *ev * (size_t)p->n_collectives);
    for (int c = 0; c < p->n_collectives; c++)
      if (!CU(a->EventCreate(&ev[c], CU_EVENT_DISABLE_TIMING), "cuEventCreate(collective %d)", c)) {
        for (int k = 0; k < c; k++) a->EventDestroy(ev[k]);
        return false;
      }
    cp->coll_done = ev;
  }
  if (!e->ev_coll &&
      !CU(a->EventCreate(&e->ev_coll, CU_EVENT_DISABLE_TIMING), "cuEventCreate(collective start)"))
    return false;
  if (!(e->nccl_comm && e->nccl_of == e->comm)) {
    char why[2400];
    bool ok = (e->nccl = rt_nccl_api_get(why, sizeof why)) != NULL;
    if (!ok) ir_error(e->ctx, ir_no_loc, "backend cuda: %s", why);
    if (!all_ranks_ok(e, ok, tag, "to load NCCL")) return false;
    if (!nccl_init(e, e->comm, tag, &e->nccl_comm)) return false;
    e->nccl_of = e->comm;
  }
  /* The groups this program names that have none yet: every rank runs the
   * same program, so every rank makes its own group's at the same point. */
  for (int i = 0; i < p->n_instrs; i++) {
    const cg_collective *c = &p->instrs[i].coll;
    if (p->instrs[i].kind != CG_INS_COLLECTIVE_START || !c->group[0] || group_nccl(e, c->group))
      continue;
    int g = 0; /* a group of that name made for an earlier mesh is replaced */
    while (g < e->n_groups && strcmp(e->group_name[g], c->group) != 0) g++;
    if (g == DSC_MESH_MAX_AXES) return bad(e, p, i, "more groups than mesh axes");
    if (g < e->n_groups && e->group_nccl[g]) e->nccl->CommDestroy(e->group_nccl[g]);
    snprintf(e->group_name[g], sizeof e->group_name[g], "%s", c->group);
    e->group_of[g] = dsc_comm_group(e->comm, c->group); /* checked at the run's start */
    e->group_nccl[g] = NULL;
    if (g == e->n_groups) e->n_groups++;
    if (!nccl_init(e, e->group_of[g], tag, &e->group_nccl[g])) return false;
  }
  return true;
}

static bool run_collective(rt_cuda_exec *e, cu_prog *cp, int i) {
  const cg_program *p = cp->p;
  const cg_instr *in = &p->instrs[i];
  const cg_collective *c = &in->coll;
  const rt_cuda_api *a = e->api;
  if (in->kind == CG_INS_COLLECTIVE_WAIT)
    return CU(a->StreamWaitEvent(e->compute, cp->coll_done[c->id], 0),
              "cuStreamWaitEvent(compute on collective %d, instruction %d)", c->id, i);
  int dt = 0;
  rt_nccl_dtype(c->dtype, &dt); /* checked at load */
  int op = c->op == DSC_COMM_MEAN ? RT_NCCL_AVG : RT_NCCL_SUM;
  const void *src = (const void *)(uintptr_t)buf_dev(e, p, in->src);
  void *dst = (void *)(uintptr_t)buf_dev(e, p, in->dst);
  void *s = (void *)e->comm_stream;
  size_t n = (size_t)c->count;
  const rt_nccl_api *nc = e->nccl;
  rt_nccl_comm comm = group_nccl(e, c->group);
  if (!comm) return bad(e, p, i, "no NCCL communicator for group '%s'", c->group);
  if (!CU(a->EventRecord(e->ev_coll, e->compute), "cuEventRecord(before collective %d)", c->id) ||
      !CU(a->StreamWaitEvent(e->comm_stream, e->ev_coll, 0),
          "cuStreamWaitEvent(comm before collective %d)", c->id))
    return false;
  bool ok;
  const char *g = p->graph_name ? p->graph_name : "?";
  switch (c->kind) {
    case CG_COLL_ALL_REDUCE:
      ok = NCCL(nc->AllReduce(src, dst, n, dt, op, comm, s),
                "ncclAllReduce(%zu x %s, instruction %d of graph '%s', step %" PRId64 ")", n,
                dsc_dtype_name(c->dtype), i, g, c->tag);
      break;
    case CG_COLL_REDUCE_SCATTER:
      ok = NCCL(nc->ReduceScatter(src, dst, n / (size_t)c->world, dt, op, comm, s),
                "ncclReduceScatter(%zu x %s, instruction %d of graph '%s', step %" PRId64 ")", n,
                dsc_dtype_name(c->dtype), i, g, c->tag);
      break;
    case CG_COLL_ALL_GATHER:
      ok = NCCL(nc->AllGather(src, dst, n, dt, comm, s),
                "ncclAllGather(%zu x %s, instruction %d of graph '%s', step %" PRId64 ")", n,
                dsc_dtype_name(c->dtype), i, g, c->tag);
      break;
    case CG_COLL_BROADCAST: /* in place on dst: the lowering copied src into it */
      ok = NCCL(nc->Broadcast(dst, dst, n, dt, c->root, comm, s),
                "ncclBroadcast(%zu x %s from rank %d, instruction %d of graph '%s', step %" PRId64
                ")",
                n, dsc_dtype_name(c->dtype), c->root, i, g, c->tag);
      break;
    case CG_COLL_ALL_TO_ALL: {
      /* NCCL has no all-to-all: a send and a receive per peer in one group
       * (as torch's all_to_all_single does). */
      size_t bytes = n * dsc_dtype_size(c->dtype);
      ok = NCCL(nc->GroupStart(), "ncclGroupStart");
      for (int64_t r = 0; ok && r < c->world; r++)
        ok = NCCL(nc->Send((const char *)src + (size_t)r * bytes, n, dt, (int)r, comm, s),
                  "ncclSend(%zu x %s to %s rank %d, instruction %d of graph '%s')", n,
                  dsc_dtype_name(c->dtype), c->group[0] ? c->group : "world", (int)r, i, g) &&
             NCCL(nc->Recv((char *)dst + (size_t)r * bytes, n, dt, (int)r, comm, s),
                  "ncclRecv(%zu x %s from %s rank %d, instruction %d of graph '%s')", n,
                  dsc_dtype_name(c->dtype), c->group[0] ? c->group : "world", (int)r, i, g);
      ok = NCCL(nc->GroupEnd(), "ncclGroupEnd (all_to_all, instruction %d of graph '%s')", i, g) &&
           ok;
      break;
    }
    default:
      return bad(e, p, i, "unknown collective kind %d", (int)c->kind);
  }
  return ok && CU(a->EventRecord(cp->coll_done[c->id], e->comm_stream),
                  "cuEventRecord(collective %d done)", c->id);
}

/* Gives up on the job after a failed run with collectives, as the cpu
 * backend does: the NCCL communicator is aborted (its kernels in flight end,
 * so the streams can be synchronised) and so is the dsc_comm, so that the
 * other ranks fail promptly instead of waiting in NCCL. */
static void coll_abort(rt_cuda_exec *e, const char *gname) {
  if (e->nccl_comm) {
    e->nccl->CommAbort(e->nccl_comm);
    e->nccl_comm = NULL;
    e->nccl_of = NULL;
  }
  drop_groups(e, true);
  if (e->comm && !dsc_comm_broken(e->comm)) {
    char reason[700];
    int nd = dsc_diag_count(e->ctx);
    snprintf(reason, sizeof reason, "graph '%s' failed on the cuda backend: %s", gname,
             nd > 0 ? dsc_diag_get(e->ctx, nd - 1)->message : "(no message)");
    dsc_comm_abort(e->comm, reason);
  }
}

/* The end of a run with collectives: waits for the compute and comm
 * streams by polling, so that an NCCL error, a rank that failed (the
 * dsc_comm is broken) or the communicator's timeout ends the wait instead
 * of hanging in NCCL; any of them aborts (coll_abort). */
static bool coll_settle(rt_cuda_exec *e, const char *gname, bool ok) {
  const rt_cuda_api *a = e->api;
  struct timespec t0, now, nap = {0, 50 * 1000};
  clock_gettime(CLOCK_MONOTONIC, &t0);
  double limit = dsc_comm_timeout(e->comm);
  while (ok) {
    CUresult r1 = a->StreamQuery(e->compute), r2 = a->StreamQuery(e->comm_stream);
    if (r1 == CUDA_SUCCESS && r2 == CUDA_SUCCESS) break;
    if ((r1 != CUDA_SUCCESS && r1 != CUDA_ERROR_NOT_READY) ||
        (r2 != CUDA_SUCCESS && r2 != CUDA_ERROR_NOT_READY)) {
      CUresult r = r1 != CUDA_SUCCESS && r1 != CUDA_ERROR_NOT_READY ? r1 : r2;
      note_sticky(e, r);
      ok = CU(r, "cuStreamQuery(%s, graph '%s')", r == r1 ? "compute" : "comm", gname);
      break;
    }
    rt_nccl_result ar = RT_NCCL_SUCCESS;
    rt_nccl_comm all[1 + DSC_MESH_MAX_AXES];
    int n_all = nccl_comms(e, all);
    for (int k = 0; k < n_all && ok; k++)
      if (e->nccl->CommGetAsyncError(all[k], &ar) == RT_NCCL_SUCCESS && ar != RT_NCCL_SUCCESS &&
          ar != RT_NCCL_IN_PROGRESS)
        ok = NCCL(ar, "NCCL (rank %d, graph '%s'): asynchronous error", dsc_comm_rank(e->comm),
                  gname);
    if (!ok) break;
    if (dsc_comm_broken(e->comm)) {
      comm_message(e, "backend cuda: another rank failed while this one waited in NCCL");
      ok = false;
      break;
    }
    clock_gettime(CLOCK_MONOTONIC, &now);
    double waited = (double)(now.tv_sec - t0.tv_sec) + 1e-9 * (double)(now.tv_nsec - t0.tv_nsec);
    if (waited > limit) {
      ir_error(e->ctx, ir_no_loc,
               "backend cuda: graph '%s': rank %d: the collectives did not complete within %.1f s "
               "(the communicator's timeout)",
               gname, dsc_comm_rank(e->comm), limit);
      ok = false;
      break;
    }
    nanosleep(&nap, NULL);
  }
  rt_nccl_comm all[1 + DSC_MESH_MAX_AXES];
  int n_all = ok ? nccl_comms(e, all) : 0;
  for (int k = 0; k < n_all && ok; k++) {
    rt_nccl_result ar = RT_NCCL_SUCCESS;
    ok = NCCL(e->nccl->CommGetAsyncError(all[k], &ar), "ncclCommGetAsyncError") &&
         NCCL(ar, "NCCL (rank %d, graph '%s'): asynchronous error", dsc_comm_rank(e->comm), gname);
  }
  if (!ok) coll_abort(e, gname);
  return ok;
}

static bool run_instr(rt_cuda_exec *e, cu_prog *cp, int i) {
  const cg_program *p = cp->p;
  const cg_instr *in = &p->instrs[i];
  const rt_cuda_api *a = e->api;
  switch (in->kind) {
    case CG_INS_LAUNCH: {
      const cg_cuda_launch *l = &cp->launch[in->kernel];
      return CU(a->LaunchKernel(cp->fns[in->kernel], l->grid[0], l->grid[1], l->grid[2],
                                l->block[0], l->block[1], l->block[2], l->shared_bytes,
                                e->compute, cp->params[i], NULL),
                "cuLaunchKernel(%s, instruction %d of graph '%s')", p->kernel_info[in->kernel].name,
                i, p->graph_name);
    }
    case CG_INS_GEMM: {
      const cg_gemm *g = &in->gemm;
      if (rt_cublaslt_run(e->ctx, &cp->plans[i], e->lt, e->compute,
                          (const void *)(uintptr_t)buf_dev(e, p, g->a.buffer),
                          (const void *)(uintptr_t)buf_dev(e, p, g->b.buffer),
                          (void *)(uintptr_t)buf_dev(e, p, g->c.buffer),
                          (void *)(uintptr_t)e->workspace, WORKSPACE_BYTES) != DSC_OK)
        return bad(e, p, i, "%s: the cuBLASLt matmul failed (see the previous message)",
                   instr_op(in));
      return true;
    }
    case CG_INS_EMBEDDING_GRAD:
      return run_embgrad(e, cp, i);
    case CG_INS_SET_ROWS:
      return run_set_rows(e, cp, i);
    case CG_INS_COPY: {
      size_t es = dsc_dtype_size(p->buffers[in->src].dtype);
      int64_t src_offset = in->src_offset, n = in->numel;
      CUdeviceptr src = buf_dev(e, p, in->src), dst = buf_dev(e, p, in->dst);
      if (in->src_rank_chunk) { /* this rank's chunk, zeros past the source */
        int64_t first = (int64_t)dsc_comm_rank(dsc_comm_group(e->comm, in->coll.group)) * in->numel;
        n = first >= in->src_len ? 0 : in->src_len - first < n ? in->src_len - first : n;
        src_offset += first < in->src_len ? first : 0;
        if (in->numel > n &&
            !CU(a->MemsetD8Async(dst + (CUdeviceptr)((in->dst_offset + n) * (int64_t)es), 0,
                                 (size_t)(in->numel - n) * es, e->compute),
                "cuMemsetD8Async(copy, instruction %d)", i))
          return false;
      }
      if (n <= 0) return true;
      return CU(a->MemcpyDtoDAsync(dst + (CUdeviceptr)(in->dst_offset * (int64_t)es),
                                   src + (CUdeviceptr)(src_offset * (int64_t)es), (size_t)n * es,
                                   e->compute),
                "cuMemcpyDtoDAsync(copy, instruction %d)", i);
    }
    case CG_INS_COLLECTIVE_START:
    case CG_INS_COLLECTIVE_WAIT:
      return run_collective(e, cp, i);
    default:
      break; /* offload transfers are refused at load */
  }
  return bad(e, p, i, "instruction kind %d cannot run on the cuda backend", (int)in->kind);
}

/* The first instruction whose status word is set, as the cpu backend says it. */
static bool status_error(rt_cuda_exec *e, cu_prog *cp) {
  const cg_program *p = cp->p;
  const int32_t *st = (const int32_t *)(cp->host + cp->status_off);
  const uint64_t *pos = (const uint64_t *)(cp->host + cp->badpos_off);
  for (int i = 0; i < p->n_instrs; i++) {
    if (!st[i]) continue;
    const cg_instr *in = &p->instrs[i];
    const char *g = p->graph_name ? p->graph_name : "?";
    if (in->kind == CG_INS_EMBEDDING_GRAD && pos[i] < (uint64_t)in->n_ids) {
      /* the id itself: one element read back */
      size_t es = dsc_dtype_size(p->buffers[in->ids].dtype);
      int64_t id = 0;
      char raw[8];
      CUdeviceptr at = buf_dev(e, p, in->ids) + (CUdeviceptr)(pos[i] * es);
      if (CU(e->api->MemcpyDtoHAsync(raw, at, es, e->copy), "cuMemcpyDtoHAsync(bad id)") &&
          sync_stream(e, e->copy, "copy: bad id"))
        id = es == 8 ? *(int64_t *)raw : *(int32_t *)raw;
      ir_error(e->ctx, ir_no_loc,
               "graph '%s': %s: index out of range: id %" PRId64 " at position %" PRIu64
               " is outside [0, %" PRId64 ") (instruction %d)",
               g, instr_op(in), id, pos[i], in->rows, i);
    } else {
      ir_error(e->ctx, ir_no_loc, "graph '%s': %s: index out of range (instruction %d, kernel %s)",
               g, instr_op(in), i,
               in->kind == CG_INS_LAUNCH ? p->kernel_info[in->kernel].name : "-");
    }
    return true;
  }
  return false;
}

dsc_status rt_cuda_exec_run(rt_cuda_exec *e, int gi, const dsc_tensor *const *inputs, int n_inputs,
                            dsc_tensor **outputs) {
  if (gi < 0 || gi >= e->n_progs) return DSC_ERR_INTERNAL;
  cu_prog *cp = &e->progs[gi];
  const cg_program *p = cp->p;
  const dsc_graph *g = dsc_module_graph(e->m, gi);
  const char *gname = dsc_graph_name(g);
  int n_in = dsc_graph_input_count(g);
  if (n_inputs != n_in) {
    ir_error(e->ctx, ir_no_loc, "executor: graph '%s' takes %d inputs, got %d", gname, n_in,
             n_inputs);
    return DSC_ERR_USER;
  }
  for (int i = 0; i < n_in; i++) {
    dsc_type want = dsc_node_type(dsc_graph_input_at(g, i));
    if (!inputs[i] || !dsc_type_equal(&want, &inputs[i]->type)) {
      ir_error(e->ctx, ir_no_loc, "executor: input %d of graph '%s' has the wrong type", i, gname);
      return DSC_ERR_USER;
    }
  }
  for (int i = 0; i < p->n_instrs; i++)
    if (((p->instrs[i].kind == CG_INS_COPY && p->instrs[i].src_rank_chunk) ||
         p->instrs[i].kind == CG_INS_COLLECTIVE_START)) {
      const char *group = p->instrs[i].coll.group;
      dsc_comm *gc = e->comm ? dsc_comm_group(e->comm, group) : NULL;
      if (gc && dsc_comm_world(gc) == p->instrs[i].coll.world) continue;
      ir_error(e->ctx, ir_no_loc,
               "graph '%s': %s (instruction %d) needs a communicator%s%s of world %" PRId64
               " (dsc_exec_set_comm%s)",
               gname, instr_op(&p->instrs[i]), i, group[0] ? " with group " : "", group,
               p->instrs[i].coll.world, group[0] ? ", dsc_mesh_new" : "");
      return DSC_ERR_USER;
    }
  if (!usable(e)) return DSC_ERR_USER;
  if (p->n_collectives > 0) {
    int64_t tag = 0;
    for (int i = 0; i < p->n_instrs; i++)
      if (p->instrs[i].kind == CG_INS_COLLECTIVE_START) {
        tag = p->instrs[i].coll.tag;
        break;
      }
    if (dsc_comm_broken(e->comm)) {
      comm_message(e, "backend cuda: the communicator failed earlier");
      return DSC_ERR_USER;
    }
    if (!nccl_setup(e, cp, tag)) {
      coll_abort(e, gname);
      return DSC_ERR_USER;
    }
  }
  const rt_cuda_api *a = e->api;
  /* inputs: doubles -> the dtype in pinned memory -> the WORK arena */
  for (int i = 0; i < n_in; i++) {
    dsc_type t = inputs[i]->type;
    size_t es = dsc_dtype_size(t.dtype);
    int64_t n = dsc_type_numel(&t);
    char *dst = cp->host + cp->in_off[i];
    for (int64_t j = 0; j < n; j++) cg_store_elem(t.dtype, dst + j * (int64_t)es, inputs[i]->data[j]);
  }
  bool ok = true;
  for (int b = 0; ok && b < p->n_buffers; b++) {
    const cg_buffer *cb = &p->buffers[b];
    if (cb->kind != CG_BUF_INPUT) continue;
    if (cb->index < 0 || cb->index >= n_in) {
      ok = bad(e, p, -1, "buffer %d is graph input %d, which does not exist", b, cb->index);
      break;
    }
    size_t bytes = (size_t)cb->numel * dsc_dtype_size(cb->dtype);
    if (bytes > 0)
      ok = CU(a->MemcpyHtoDAsync(buf_dev(e, p, b), cp->host + cp->in_off[cb->index], bytes, e->copy),
              "cuMemcpyHtoDAsync(input %d of graph '%s')", cb->index, gname);
  }
  ok = ok && CU(a->EventRecord(e->ev_in, e->copy), "cuEventRecord(inputs copied)") &&
       CU(a->StreamWaitEvent(e->compute, e->ev_in, 0), "cuStreamWaitEvent(compute on inputs)");
  /* status words: 0, and the bad positions all ones (atomicMin) */
  size_t n_ins = (size_t)(p->n_instrs > 0 ? p->n_instrs : 1);
  ok = ok &&
       CU(a->MemsetD8Async(cp->status, 0, 4 * n_ins, e->compute), "cuMemsetD8Async(status)") &&
       CU(a->MemsetD8Async(cp->status + (CUdeviceptr)(cp->badpos_off - cp->status_off), 0xff,
                           8 * n_ins, e->compute),
          "cuMemsetD8Async(status)");
  bool prof = e->profiling && ok;
  if (prof && !cp->prof) {
    cp->prof = ir_arena_alloc(&e->arena, sizeof *cp->prof * (n_ins + 1));
    if (cp->prof) memset(cp->prof, 0, sizeof *cp->prof * (n_ins + 1));
    for (int i = 0; cp->prof && i <= p->n_instrs && ok; i++)
      ok = CU(a->EventCreate(&cp->prof[i], CU_EVENT_DEFAULT), "cuEventCreate(profiling)");
    prof = cp->prof != NULL;
  }
  for (int i = 0; ok && i < p->n_instrs; i++) {
    if (prof) ok = CU(a->EventRecord(cp->prof[i], e->compute), "cuEventRecord(profiling)");
    ok = ok && run_instr(e, cp, i);
  }
  if (ok && prof)
    ok = CU(a->EventRecord(cp->prof[p->n_instrs], e->compute), "cuEventRecord(profiling)");
  /* status words and outputs back on the copy stream, after the compute */
  ok = ok && CU(a->EventRecord(e->ev_done, e->compute), "cuEventRecord(compute done)") &&
       CU(a->StreamWaitEvent(e->copy, e->ev_done, 0), "cuStreamWaitEvent(copy on compute)") &&
       CU(a->MemcpyDtoHAsync(cp->host + cp->status_off, cp->status, cp->status_bytes, e->copy),
          "cuMemcpyDtoHAsync(status words)");
  for (int o = 0; ok && o < p->n_outputs; o++) {
    const cg_output *out = &p->outputs[o];
    size_t es = dsc_dtype_size(out->type.dtype);
    size_t bytes = (size_t)dsc_type_numel(&out->type) * es;
    if (bytes > 0)
      ok = CU(a->MemcpyDtoHAsync(cp->host + cp->out_off[o],
                                 buf_dev(e, p, out->buffer) + (CUdeviceptr)(out->offset * (int64_t)es),
                                 bytes, e->copy),
              "cuMemcpyDtoHAsync(output %d of graph '%s')", o, gname);
  }
  /* collectives: polled to the end (or aborted) before the syncs below */
  if (p->n_collectives > 0) ok = coll_settle(e, gname, ok) && ok;
  /* whatever happened, nothing may stay in flight */
  char what[200];
  snprintf(what, sizeof what, "compute, graph '%s'", gname);
  bool synced = sync_stream(e, e->compute, what);
  snprintf(what, sizeof what, "copy, graph '%s'", gname);
  synced = sync_stream(e, e->copy, what) && synced;
  ok = ok && synced;
  if (ok && status_error(e, cp)) ok = false;
  if (p->n_collectives > 0) {
    snprintf(what, sizeof what, "comm, graph '%s'", gname);
    ok = sync_stream(e, e->comm_stream, what) && ok;
    if (!ok) coll_abort(e, gname);
  }
  if (ok && cp->n_assigns > 0) {
    for (int c = 0; ok && c < cp->n_assigns; c++)
      ok = CU(a->MemcpyDtoDAsync(cp->assigns[c].dst, cp->assigns[c].src, cp->assigns[c].bytes,
                                 e->compute),
              "cuMemcpyDtoDAsync(assign %d of graph '%s')", c, gname);
    snprintf(what, sizeof what, "compute: assigns of graph '%s'", gname);
    ok = sync_stream(e, e->compute, what) && ok;
  }
  if (ok && prof) {
    for (int i = 0; i < p->n_instrs; i++) {
      float ms = 0;
      if (a->EventElapsedTime(&ms, cp->prof[i], cp->prof[i + 1]) == CUDA_SUCCESS)
        cp->prof_ms[i] += ms;
    }
    cp->runs++;
  }
  if (!ok) return DSC_ERR_USER;
  for (int o = 0; o < p->n_outputs; o++) {
    const cg_output *out = &p->outputs[o];
    if (!(outputs[o] = dsc_tensor_new(e->ctx, out->type))) {
      for (int k = 0; k < o; k++) {
        dsc_tensor_free(e->ctx, outputs[k]);
        outputs[k] = NULL;
      }
      ir_error(e->ctx, ir_no_loc, "executor: out of memory");
      return DSC_ERR_INTERNAL;
    }
    size_t es = dsc_dtype_size(out->type.dtype);
    int64_t n = dsc_type_numel(&out->type);
    const char *src = cp->host + cp->out_off[o];
    for (int64_t j = 0; j < n; j++)
      outputs[o]->data[j] = cg_load_elem(out->type.dtype, src + j * (int64_t)es);
  }
  return DSC_OK;
}

void rt_cuda_exec_set_profiling(rt_cuda_exec *e, bool on) {
  if (on && !e->profiling)
    for (int i = 0; i < e->n_progs; i++) {
      int n = e->progs[i].p->n_instrs;
      memset(e->progs[i].prof_ms, 0, sizeof(double) * (size_t)(n > 0 ? n : 1));
      e->progs[i].runs = 0;
    }
  e->profiling = on;
}

static const char *kind_name(cg_ins_kind k) {
  switch (k) {
    case CG_INS_LAUNCH: return "kernel";
    case CG_INS_GEMM: return "gemm";
    case CG_INS_EMBEDDING_GRAD: return "embedding_grad";
    case CG_INS_SET_ROWS:
      return "set_rows";
    case CG_INS_COPY: return "copy";
    case CG_INS_COLLECTIVE_START: return "comm_start";
    case CG_INS_COLLECTIVE_WAIT: return "comm_wait";
    default: return "other";
  }
}

dsc_status rt_cuda_exec_phase_times(rt_cuda_exec *e, int gi, dsc_phase_times *out) {
  if (gi < 0 || gi >= e->n_progs) return DSC_ERR_INTERNAL;
  const cu_prog *cp = &e->progs[gi];
  out->runs = cp->runs;
  for (int i = 0; i < cp->p->n_instrs; i++) rt_phase_add(&cp->p->instrs[i], cp->prof_ms[i], out);
  return DSC_OK;
}

dsc_status rt_cuda_exec_print_profile(rt_cuda_exec *e, int gi, int top, FILE *out) {
  if (gi < 0 || gi >= e->n_progs) return DSC_ERR_INTERNAL;
  cu_prog *cp = &e->progs[gi];
  const cg_program *p = cp->p;
  const char *graph = p->graph_name ? p->graph_name : "?";
  if (cp->runs == 0) {
    fprintf(out, "profile of %s: no timed runs\n", graph);
    return DSC_OK;
  }
  enum { N_KINDS = 16 };
  double total = 0, by_kind[N_KINDS] = {0};
  int count_kind[N_KINDS] = {0};
  for (int i = 0; i < p->n_instrs; i++) {
    int k = (unsigned)p->instrs[i].kind < N_KINDS ? (int)p->instrs[i].kind : N_KINDS - 1;
    total += cp->prof_ms[i];
    by_kind[k] += cp->prof_ms[i];
    count_kind[k]++;
  }
  double runs = (double)cp->runs;
  fprintf(out, "profile of %s on %s (cuda events): %.3f ms per run over %lld runs, %d instructions\n",
          graph, e->device_name, total / runs, (long long)cp->runs, p->n_instrs);
  for (int k = 0; k < N_KINDS; k++)
    if (count_kind[k])
      fprintf(out, "  %-15s %5d  %9.3f ms  %5.1f%%\n", kind_name((cg_ins_kind)k), count_kind[k],
              by_kind[k] / runs, 100 * by_kind[k] / (total > 0 ? total : 1));
  bool *shown = ir_alloc(e->ctx, (size_t)p->n_instrs + 1);
  if (!shown) return DSC_ERR_INTERNAL;
  memset(shown, 0, (size_t)p->n_instrs + 1);
  for (int t = 0; t < top && t < p->n_instrs; t++) {
    int best = -1;
    for (int i = 0; i < p->n_instrs; i++)
      if (!shown[i] && (best < 0 || cp->prof_ms[i] > cp->prof_ms[best])) best = i;
    shown[best] = true;
    const cg_instr *in = &p->instrs[best];
    char what[160] = "";
    if (in->kind == CG_INS_LAUNCH)
      snprintf(what, sizeof what, "%s", p->kernel_info[in->kernel].name);
    else if (in->kind == CG_INS_GEMM)
      snprintf(what, sizeof what, "%lldx%lld [%lld x %lld x %lld]", (long long)in->gemm.batch[0],
               (long long)in->gemm.batch[1], (long long)in->gemm.m, (long long)in->gemm.n,
               (long long)in->gemm.k);
    fprintf(out, "  #%-5d %-14s %9.3f ms  %5.1f%%  %s%s%s\n", best, kind_name(in->kind),
            cp->prof_ms[best] / runs, 100 * cp->prof_ms[best] / (total > 0 ? total : 1), what,
            in->op ? "  from " : "", in->op ? in->op : "");
  }
  ir_free(e->ctx, shown, (size_t)p->n_instrs + 1);
  return DSC_OK;
}

#endif /* DSC_HAVE_CUDA */

/* ---------------- the executor backend (runtime/runtime.h rt_executor) ---------------- */

static bool cuda_available(void) {
#ifdef DSC_HAVE_CUDA
  return true; /* built in; whether a driver and a GPU are there is creation's check */
#else
  return false;
#endif
}

/* Whether a graph of m has nodes placed on the host (passes/offload_host.c). */
static bool host_placed(const dsc_module *m) {
  for (int i = 0; i < m->n_graphs; i++)
    for (int j = 0; j < m->graphs[i]->n_nodes; j++)
      if (m->graphs[i]->nodes[j]->place == IR_PLACE_HOST) return true;
  return false;
}

static dsc_status cuda_check(const dsc_module *m) {
  if (!host_placed(m)) return DSC_OK;
  /* host work (passes/offload_host.c): exec_cuda has no host work arena yet */
  ir_error(m->ctx, ir_no_loc,
           "backend cuda does not run host-placed nodes yet (--offload-optimizer host, "
           "--zenflow true, --checkpoint-activations offload): use the cpu backend");
  return DSC_ERR_USER;
}

static dsc_status cuda_create(const rt_exec_args *a, void **impl) {
  rt_cuda_exec *e = NULL;
  dsc_status st = rt_cuda_exec_new(a->m, a->compiled, &e);
  *impl = e;
  return st;
}

static void cuda_destroy(void *impl) { rt_cuda_exec_free(impl); }
static dsc_status cuda_set_params(void *impl, const dsc_params *p) {
  return rt_cuda_exec_set_params(impl, p);
}
static dsc_status cuda_get_params(void *impl, dsc_params *p) {
  return rt_cuda_exec_get_params(impl, p);
}
static dsc_status cuda_set_param(void *impl, int i, const dsc_tensor *t) {
  return rt_cuda_exec_set_param(impl, i, t);
}
static dsc_status cuda_run(void *impl, int gi, const dsc_tensor *const *inputs, int n_inputs,
                           dsc_tensor **outputs) {
  return rt_cuda_exec_run(impl, gi, inputs, n_inputs, outputs);
}
static dsc_status cuda_set_comm(void *impl, dsc_comm *comm) {
  return rt_cuda_exec_set_comm(impl, comm) != DSC_OK ? DSC_ERR_USER : DSC_OK;
}
static void cuda_set_profiling(void *impl, bool on) { rt_cuda_exec_set_profiling(impl, on); }
static dsc_status cuda_phase_times(void *impl, int gi, dsc_phase_times *out) {
  return rt_cuda_exec_phase_times(impl, gi, out);
}

static dsc_status cuda_print_profile(void *impl, int gi, int top, FILE *out) {
  return rt_cuda_exec_print_profile(impl, gi, top, out);
}
static int64_t cuda_device_bytes(const void *impl) { return rt_cuda_exec_device_bytes(impl); }

const rt_executor rt_exec_cuda = {
    .name = "cuda",
    .id = DSC_BACKEND_CUDA,
    .available = cuda_available,
    .not_built =
        "backend cuda is not built in (configure with the CUDA toolkit: "
        "-DDSC_ENABLE_CUDA=ON)",
    .compiled = true,
    .target = CG_TARGET_CUDA,
    .run_label = "cuda",
    .check = cuda_check,
    .create = cuda_create,
    .destroy = cuda_destroy,
    .set_params = cuda_set_params,
    .get_params = cuda_get_params,
    .set_param = cuda_set_param,
    .run = cuda_run,
    .set_comm = cuda_set_comm,
    .set_profiling = cuda_set_profiling,
    .print_profile = cuda_print_profile,
    .phase_times = cuda_phase_times,
    .device_bytes = cuda_device_bytes,
};
