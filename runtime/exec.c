/* The public executor (include/dsc/exec.h): one front for the reference
 * interpreter and the compiled backends.
 *
 * cpu: every graph of the module is lowered to a cg_program
 * (codegen/lower.c), its kernels JIT-compiled by LLVM (codegen/llvm.c) and
 * the programs run by runtime/exec_cpu.c over one STATE arena that holds
 * every param and state in its native dtype (layout: cg_state_layout). The
 * doubles of dsc_params are converted only when params are set or read
 * (initialisation, checkpoints), never per step. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "codegen/codegen.h"
#include "dsc/exec.h"
#include "runtime/cuda_api.h"
#include "runtime/runtime.h"

struct dsc_exec {
  dsc_context *ctx;
  dsc_module *m;
  dsc_backend backend;
  dsc_params *params; /* interp: the values themselves */
  dsc_comm *comm;     /* collectives go through it (dsc_exec_set_comm); not owned */
  dsc_trace *trace;   /* dsc_exec_set_trace; not owned */
  int trace_pid;
  rt_cuda_exec *cuda; /* backend cuda (runtime/exec_cuda.c) */
  /* Offload tiers (cg_state_layout_tiers): per param its tier and offset in
   * the tier's arena; the disk values (disk_idx: their param indices) live
   * in the file `disk` only: the cpu backend streams them (tier transfer
   * instructions, runtime/exec_cpu.c), the interpreter keeps its doubles
   * and writes the file after each run */
  int *tiers;
  int64_t *tier_offsets;
  int64_t tier_bytes[CG_TIER_COUNT];
  int n_disk;
  int *disk_idx;
  rt_offload *disk;
#ifdef DSC_HAVE_LLVM
  ir_arena arena; /* programs and kernels */
  int n_progs;
  cg_program **progs;
  cg_cpu_kernel_fn **fns;
  cg_llvm_jit *jit;
  rt_cpu_exec *cpu;
  int64_t *state_offsets;
  int64_t state_bytes;
  const dsc_program *program; /* prebuilt kernels (only during creation) */
  const char *program_module;
  int prebuilt;               /* kernels loaded from the program */
#endif
};

static const char *backend_names[] = {"interp", "cpu", "cuda"};

/* Whether a graph of m has nodes placed on the host (passes/offload_host.c). */
static bool host_placed(const dsc_module *m) {
  for (int i = 0; i < m->n_graphs; i++)
    for (int j = 0; j < m->graphs[i]->n_nodes; j++)
      if (m->graphs[i]->nodes[j]->place == IR_PLACE_HOST) return true;
  return false;
}

const char *dsc_backend_name(dsc_backend b) {
  return (unsigned)b < 3 ? backend_names[b] : "?";
}

int dsc_backend_from_name(const char *name, dsc_backend *out) {
  for (int i = 0; i < 3; i++)
    if (strcmp(name, backend_names[i]) == 0) {
      *out = (dsc_backend)i;
      return 0;
    }
  return -1;
}

bool dsc_backend_available(dsc_backend b) {
  switch (b) {
    case DSC_BACKEND_INTERP: return true;
#ifdef DSC_HAVE_LLVM
    case DSC_BACKEND_CPU: return true;
#endif
#ifdef DSC_HAVE_CUDA
    /* built in; whether a driver and a GPU are there is dsc_exec_new's check */
    case DSC_BACKEND_CUDA: return true;
#endif
    default: return false;
  }
}

dsc_backend dsc_backend_default(void) {
  return dsc_backend_available(DSC_BACKEND_CPU) ? DSC_BACKEND_CPU : DSC_BACKEND_INTERP;
}

dsc_backend dsc_exec_backend(const dsc_exec *e) { return e->backend; }

static void free_tiers(dsc_exec *e) {
  int np = dsc_module_param_count(e->m);
  if (e->tiers) ir_free(e->ctx, e->tiers, sizeof(int) * (size_t)(np + 1));
  if (e->tier_offsets) ir_free(e->ctx, e->tier_offsets, sizeof(int64_t) * (size_t)(np + 1));
  if (e->disk_idx) ir_free(e->ctx, e->disk_idx, sizeof(int) * (size_t)(np + 1));
  rt_offload_free(e->disk);
}

void dsc_exec_free(dsc_exec *e) {
  if (!e) return;
  free_tiers(e);
  dsc_params_free(e->params);
  rt_cuda_exec_free(e->cuda);
#ifdef DSC_HAVE_LLVM
  rt_cpu_exec_free(e->cpu);
  cg_llvm_jit_free(e->jit);
  if (e->fns)
    for (int i = 0; i < e->n_progs; i++)
      if (e->fns[i]) ir_free(e->ctx, e->fns[i], sizeof(cg_cpu_kernel_fn) * (size_t)e->progs[i]->n_kernels);
  if (e->fns) ir_free(e->ctx, e->fns, sizeof *e->fns * (size_t)e->n_progs);
  if (e->progs) ir_free(e->ctx, e->progs, sizeof *e->progs * (size_t)e->n_progs);
  if (e->state_offsets)
    ir_free(e->ctx, e->state_offsets, sizeof(int64_t) * (size_t)dsc_module_param_count(e->m));
  ir_arena_release(&e->arena);
#endif
  ir_free(e->ctx, e, sizeof *e);
}

#ifdef DSC_HAVE_LLVM
/* Compiles program p's kernels into fns, taking the objects a program file
 * holds for them (section "cpu/<module>/<graph>"; kernels it lacks or that
 * changed are compiled). */
static dsc_status cpu_kernels(dsc_exec *e, const char *graph, cg_program *p,
                              cg_cpu_kernel_fn *fns) {
  const rt_dsx_section *sec = NULL;
  const dsc_program *prog = e->program;
  if (prog && e->program_module) {
    /* Objects for another host or dsc would not load: compile instead (the
     * caller says why with dsc_program_cpu_usable). */
    char host[1024], name[300];
    cg_llvm_host(e->jit, host, sizeof host);
    if (rt_program_cpu_fits(prog, host)) {
      snprintf(name, sizeof name, "cpu/%s/%s", e->program_module, graph);
      sec = rt_dsx_find(rt_program_dsx(prog), name);
    }
  }
  if (!sec) return cg_llvm_compile(e->jit, p->kernels, p->n_kernels, fns);
  size_t n = (size_t)p->n_kernels + 1;
  const void **objs = ir_alloc(e->ctx, sizeof *objs * n);
  size_t *lens = ir_alloc(e->ctx, sizeof *lens * n);
  dsc_status st = objs && lens ? DSC_OK : DSC_ERR_INTERNAL;
  if (st == DSC_OK) {
    int found =
        rt_unpack_kernel_objects(sec->data, sec->size, p->kernel_info, p->n_kernels, objs, lens);
    if (found < 0) {
      ir_error(e->ctx, rt_loc(dsc_program_path(prog)),
               "not a valid .dsx file: section '%s' is malformed", sec->name);
      st = DSC_ERR_USER;
    } else {
      e->prebuilt += found;
      st = cg_llvm_compile_with(e->jit, p->kernels, p->n_kernels, fns,
                                (const void *const *)objs, lens);
    }
  }
  if (objs) ir_free(e->ctx, objs, sizeof *objs * n);
  if (lens) ir_free(e->ctx, lens, sizeof *lens * n);
  return st;
}

static dsc_status cpu_new(dsc_exec *e, const dsc_exec_options *o) {
  dsc_context *ctx = e->ctx;
  ir_arena_init(&e->arena, ctx);
  int np = dsc_module_param_count(e->m);
  e->n_progs = dsc_module_graph_count(e->m);
  e->progs = ir_alloc(ctx, sizeof *e->progs * (size_t)(e->n_progs + 1));
  e->fns = ir_alloc(ctx, sizeof *e->fns * (size_t)(e->n_progs + 1));
  e->state_offsets = ir_alloc(ctx, sizeof(int64_t) * (size_t)(np + 1));
  if (!e->progs || !e->fns || !e->state_offsets) return DSC_ERR_INTERNAL;
  memset(e->progs, 0, sizeof *e->progs * (size_t)e->n_progs);
  memset(e->fns, 0, sizeof *e->fns * (size_t)e->n_progs);
  if (!cg_state_layout(e->m, e->state_offsets, &e->state_bytes)) return DSC_ERR_INTERNAL;
  /* The kernel cache: the option, else $DSC_CACHE_DIR (as ccache's
   * CCACHE_DIR), else none. */
  const char *cache = o && o->cache_dir ? o->cache_dir : getenv("DSC_CACHE_DIR");
  if (cache && !cache[0]) cache = NULL;
  if (!(e->jit = cg_llvm_jit_new(ctx, cache))) return DSC_ERR_INTERNAL;
  for (int i = 0; i < e->n_progs; i++) {
    dsc_status st = cg_lower_graph(dsc_module_graph(e->m, i), &e->arena, &e->progs[i]);
    if (st != DSC_OK) return st;
    cg_program *p = e->progs[i];
    e->fns[i] = ir_alloc(ctx, sizeof(cg_cpu_kernel_fn) * (size_t)(p->n_kernels + 1));
    if (!e->fns[i]) return DSC_ERR_INTERNAL;
    const char *gname = dsc_graph_name(dsc_module_graph(e->m, i));
    if (p->n_kernels > 0 && (st = cpu_kernels(e, gname, p, e->fns[i])) != DSC_OK) return st;
  }
  int threads = o && o->threads > 0 ? o->threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
  if (threads < 1) threads = 1;
  int64_t arenas[CG_TIER_COUNT];
  memcpy(arenas, e->tier_bytes, sizeof arenas);
  arenas[CG_TIER_DISK] = 0; /* streamed: in-flight buffers are WORK buffers */
  e->cpu = rt_cpu_exec_new_tiered(ctx, (const cg_program *const *)e->progs, e->n_progs,
                                  (cg_cpu_kernel_fn *const *)e->fns, threads, arenas);
  return e->cpu ? DSC_OK : DSC_ERR_INTERNAL;
}
#endif

/* The tiers of the module's params and states (passes/offload.c). */
static dsc_status init_tiers(dsc_exec *e) {
  int np = dsc_module_param_count(e->m);
  e->tiers = ir_alloc(e->ctx, sizeof(int) * (size_t)(np + 1));
  e->tier_offsets = ir_alloc(e->ctx, sizeof(int64_t) * (size_t)(np + 1));
  e->disk_idx = ir_alloc(e->ctx, sizeof(int) * (size_t)(np + 1));
  if (!e->tiers || !e->tier_offsets || !e->disk_idx) return DSC_ERR_INTERNAL;
  if (!cg_state_layout_tiers(e->m, e->tier_offsets, e->tiers, e->tier_bytes)) {
    ir_error(e->ctx, ir_no_loc,
             "executor: module '%s': the params do not fit in memory, or a tier.<name> meta is "
             "not host or disk",
             dsc_module_name(e->m));
    return DSC_ERR_USER;
  }
  for (int i = 0; i < np; i++)
    if (e->tiers[i] == CG_TIER_DISK) e->disk_idx[e->n_disk++] = i;
  return DSC_OK;
}

dsc_status dsc_exec_new(dsc_module *m, const dsc_exec_options *opts, dsc_exec **out) {
  return dsc_exec_new_with_program(m, opts, NULL, NULL, out);
}

dsc_status dsc_exec_new_with_program(dsc_module *m, const dsc_exec_options *opts,
                                     const dsc_program *program, const char *program_module,
                                     dsc_exec **out) {
  *out = NULL;
  dsc_context *ctx = dsc_module_context(m);
  dsc_backend b = opts ? opts->backend : dsc_backend_default();
  if (!dsc_backend_available(b)) {
    ir_error(ctx, ir_no_loc,
             b == DSC_BACKEND_CUDA
                 ? "backend cuda is not built in (configure with the CUDA toolkit: "
                   "-DDSC_ENABLE_CUDA=ON)"
                 : "backend %s is not built in (configure with LLVM and oneDNN: "
                   "scripts/install-deps.sh)",
             dsc_backend_name(b));
    return DSC_ERR_USER;
  }
  dsc_exec *e = ir_alloc(ctx, sizeof *e);
  if (!e) return DSC_ERR_INTERNAL;
  memset(e, 0, sizeof *e);
  e->ctx = ctx;
  e->m = m;
  e->backend = b;
#ifdef DSC_HAVE_LLVM
  e->program = program;
  e->program_module = program_module;
#else
  (void)program, (void)program_module;
#endif
  dsc_status st = init_tiers(e);
  if (st == DSC_OK && b == DSC_BACKEND_INTERP) {
    if (!(e->params = dsc_params_init(m, 0))) st = DSC_ERR_INTERNAL;
  } else if (st == DSC_OK && b == DSC_BACKEND_CUDA && host_placed(m)) {
    /* host work (passes/offload_host.c): exec_cuda has no host work arena yet */
    ir_error(m->ctx, ir_no_loc,
             "backend cuda does not run host-placed nodes yet (--offload-optimizer host, "
             "--checkpoint-activations offload): use the cpu backend");
    st = DSC_ERR_USER;
  } else if (st == DSC_OK && b == DSC_BACKEND_CUDA) {
    /* the kernel cache as the cpu backend finds it (option, $DSC_CACHE_DIR) */
    const char *cache = opts && opts->cache_dir ? opts->cache_dir : getenv("DSC_CACHE_DIR");
    st = rt_cuda_exec_new(m, cache && cache[0] ? cache : NULL, &e->cuda);
  }
#ifdef DSC_HAVE_LLVM
  else if (b == DSC_BACKEND_CPU) {
    st = cpu_new(e, opts);
  }
#endif
  if (st != DSC_OK) {
    if (st == DSC_ERR_INTERNAL && dsc_diag_count(ctx) == 0)
      ir_error(ctx, ir_no_loc, "executor: out of memory");
    dsc_exec_free(e);
    return st;
  }
  *out = e;
  return DSC_OK;
}

static bool same_params(const dsc_exec *e, const dsc_params *p) {
  if (dsc_params_count(p) != dsc_module_param_count(e->m)) return false;
  for (int i = 0; i < dsc_params_count(p); i++) {
    dsc_type a = dsc_params_get(p, i)->type, b = dsc_module_param_type(e->m, i);
    if (!dsc_type_equal(&a, &b)) return false;
  }
  return true;
}

static dsc_status copy_params(dsc_exec *e, dsc_params *dst, const dsc_params *src, bool in) {
  if (!same_params(e, in ? src : dst)) {
    ir_error(e->ctx, ir_no_loc, "executor: the params do not match module '%s'",
             dsc_module_name(e->m));
    return DSC_ERR_USER;
  }
  int np = dsc_module_param_count(e->m);
  if (e->cuda)
    return in ? rt_cuda_exec_set_params(e->cuda, src) : rt_cuda_exec_get_params(e->cuda, dst);
  if (e->backend == DSC_BACKEND_INTERP) {
    for (int i = 0; i < np; i++) {
      dsc_tensor *s = dsc_params_get(src, i), *d = dsc_params_get(dst, i);
      memcpy(d->data, s->data, sizeof(double) * (size_t)dsc_type_numel(&s->type));
    }
    return DSC_OK;
  }
#ifdef DSC_HAVE_LLVM
  for (int i = 0; i < np; i++) {
    if (e->tiers[i] == CG_TIER_DISK) continue; /* the file's (disk_xfer) */
    dsc_type ty = dsc_module_param_type(e->m, i);
    size_t es = dsc_dtype_size(ty.dtype);
    char *slot = (char *)rt_cpu_exec_tier(e->cpu, e->tiers[i]) + e->tier_offsets[i];
    dsc_tensor *t = dsc_params_get(in ? src : dst, i);
    int64_t n = dsc_type_numel(&ty);
    if (in)
      for (int64_t j = 0; j < n; j++) cg_store_elem(ty.dtype, slot + j * (int64_t)es, t->data[j]);
    else
      for (int64_t j = 0; j < n; j++) t->data[j] = cg_load_elem(ty.dtype, slot + j * (int64_t)es);
  }
#endif
  return DSC_OK;
}

/* ---- the disk tier: the file <-> doubles (runtime/offload_io.c) ----
 * One value at a time through a buffer of its native dtype, so that only
 * one value is in host memory at once (initialisation, checkpoints, the
 * interpreter's runs). */
static dsc_status no_file(dsc_exec *e) {
  ir_error(e->ctx, ir_no_loc,
           "executor: module '%s' has values on the disk tier but no offload file "
           "(--offload-dir; dsc_exec_set_offload_file)",
           dsc_module_name(e->m));
  return DSC_ERR_USER;
}

/* Disk values of p from the file (write false) or into it, then the flip. */
static dsc_status disk_xfer(dsc_exec *e, dsc_params *p, bool write) {
  if (e->n_disk == 0) return DSC_OK;
  if (!e->disk) return no_file(e);
  char err[1200] = "";
  bool ok = true;
  rt_offload_begin(e->disk);
  for (int k = 0; k < e->n_disk && ok; k++) {
    dsc_tensor *t = dsc_params_get(p, e->disk_idx[k]);
    size_t es = dsc_dtype_size(t->type.dtype);
    int64_t n = dsc_type_numel(&t->type);
    size_t bytes = (size_t)n * es + 1;
    char *buf = ir_alloc(e->ctx, bytes);
    if (!buf) {
      snprintf(err, sizeof err, "executor: out of memory (%zu bytes for a disk value)", bytes);
      ok = false;
      break;
    }
    for (int64_t j = 0; write && j < n; j++)
      cg_store_elem(t->type.dtype, buf + j * (int64_t)es, t->data[j]);
    int id = rt_offload_start(e->disk, k, buf, write, err, sizeof err);
    ok = id >= 0 && rt_offload_wait(e->disk, id, err, sizeof err);
    for (int64_t j = 0; ok && !write && j < n; j++)
      t->data[j] = cg_load_elem(t->type.dtype, buf + j * (int64_t)es);
    ir_free(e->ctx, buf, bytes);
  }
  char msg[1200] = "";
  if (!rt_offload_end(e->disk, ok && write, msg, sizeof msg) && ok) {
    ok = false;
    memcpy(err, msg, sizeof err);
  }
  if (!ok) {
    ir_error(e->ctx, ir_no_loc, "%s", err);
    return DSC_ERR_USER;
  }
  return DSC_OK;
}

dsc_status dsc_exec_set_offload_file(dsc_exec *e, const char *path) {
  if (e->n_disk == 0) return DSC_OK;
#ifdef DSC_HAVE_LLVM
  if (e->cpu) rt_cpu_exec_set_offload(e->cpu, NULL, NULL, 0);
#endif
  rt_offload_free(e->disk);
  e->disk = NULL;
  int64_t *offs = ir_alloc(e->ctx, sizeof(int64_t) * (size_t)e->n_disk);
  int64_t *bytes = ir_alloc(e->ctx, sizeof(int64_t) * (size_t)e->n_disk);
  if (offs && bytes)
    for (int k = 0; k < e->n_disk; k++) {
      dsc_type ty = dsc_module_param_type(e->m, e->disk_idx[k]);
      offs[k] = e->tier_offsets[e->disk_idx[k]];
      bytes[k] = dsc_type_numel(&ty) * (int64_t)dsc_dtype_size(ty.dtype);
    }
  if (offs && bytes)
    e->disk = rt_offload_open(e->ctx, path, e->n_disk, offs, bytes, e->tier_bytes[CG_TIER_DISK]);
  if (offs) ir_free(e->ctx, offs, sizeof(int64_t) * (size_t)e->n_disk);
  if (bytes) ir_free(e->ctx, bytes, sizeof(int64_t) * (size_t)e->n_disk);
  if (!e->disk) return dsc_diag_count(e->ctx) ? DSC_ERR_USER : DSC_ERR_INTERNAL;
  /* the IO threads the offload pass chose (module meta offload.io_threads) */
  const char *th = dsc_module_get_meta(e->m, "offload.io_threads");
  if (th && !rt_offload_set_threads(e->disk, atoi(th))) {
    ir_error(e->ctx, ir_no_loc, "executor: module meta offload.io_threads '%s' is not in [1, 64]",
             th);
    return DSC_ERR_USER;
  }
#ifdef DSC_HAVE_LLVM
  if (e->cpu) {
    int np = dsc_module_param_count(e->m);
    int *value = ir_alloc(e->ctx, sizeof(int) * (size_t)(np + 1));
    if (!value) return DSC_ERR_INTERNAL;
    for (int i = 0; i < np; i++) value[i] = -1;
    for (int k = 0; k < e->n_disk; k++) value[e->disk_idx[k]] = k;
    bool ok = rt_cpu_exec_set_offload(e->cpu, e->disk, value, np);
    ir_free(e->ctx, value, sizeof(int) * (size_t)(np + 1));
    if (!ok) return DSC_ERR_INTERNAL;
  }
#endif
  return DSC_OK;
}

void dsc_exec_tier_bytes(const dsc_exec *e, int64_t *device, int64_t *host, int64_t *disk) {
  if (device) *device = e->tier_bytes[CG_TIER_DEVICE];
  if (host) *host = e->tier_bytes[CG_TIER_HOST];
  if (disk) *disk = e->tier_bytes[CG_TIER_DISK];
}

dsc_status dsc_exec_set_params(dsc_exec *e, const dsc_params *p) {
  if (e->n_disk > 0 && !e->disk) return no_file(e);
  dsc_status st = copy_params(e, e->params, p, true);
  if (st == DSC_OK) st = disk_xfer(e, (dsc_params *)p, true); /* read only: write == true */
  return st;
}

dsc_status dsc_exec_get_params(dsc_exec *e, dsc_params *p) {
  dsc_status st = copy_params(e, p, e->params, false);
  if (st == DSC_OK) st = disk_xfer(e, p, false);
  return st;
}

static dsc_status exec_run(dsc_exec *e, const char *graph, const dsc_tensor *const *inputs,
                           int n_inputs, dsc_tensor **outputs);

/* Whether graph g assigns a disk-tier value (then a run commits the file). */
static bool writes_disk(const dsc_exec *e, const dsc_graph *g) {
  for (int i = 0; i < g->n_nodes; i++) {
    const ir_node *x = g->nodes[i];
    if (x->op != DSC_OP_ASSIGN && x->op != DSC_OP_TIER_WRITE_START) continue;
    const char *name = ir_attr_str(x, "name");
    for (int k = 0; name && k < e->n_disk; k++)
      if (strcmp(e->m->params[e->disk_idx[k]].name, name) == 0) return true;
  }
  return false;
}

/* With disk values: the cpu backend streams them within the run (its
 * program's tier transfers, which commit the file when the run completes).
 * The interpreter keeps every value as doubles: it reads the disk values
 * from the file before the run and, when the run writes them, writes them
 * to the other slot and flips it after; a failed run or write leaves the
 * file's values, and the interpreter takes them back. */
dsc_status dsc_exec_run(dsc_exec *e, const char *graph, const dsc_tensor *const *inputs,
                        int n_inputs, dsc_tensor **outputs) {
  dsc_graph *g = dsc_module_find_graph(e->m, graph);
  if (e->n_disk == 0 || !g || e->backend != DSC_BACKEND_INTERP)
    return exec_run(e, graph, inputs, n_inputs, outputs);
  int64_t t0 = e->trace ? dsc_trace_now_ns() : 0;
  dsc_status st = disk_xfer(e, e->params, false);
  if (e->trace && st == DSC_OK)
    dsc_trace_spanf(e->trace, e->trace_pid, DSC_TRACE_COPY, t0, dsc_trace_now_ns(),
                    "offload read (%d values)", e->n_disk);
  if (st == DSC_OK) st = exec_run(e, graph, inputs, n_inputs, outputs);
  if (st == DSC_OK && writes_disk(e, g)) {
    t0 = e->trace ? dsc_trace_now_ns() : 0;
    st = disk_xfer(e, e->params, true);
    if (e->trace && st == DSC_OK)
      dsc_trace_spanf(e->trace, e->trace_pid, DSC_TRACE_COPY, t0, dsc_trace_now_ns(),
                      "offload write (%d values)", e->n_disk);
    if (st != DSC_OK) {
      for (int i = 0; i < dsc_graph_output_count(g); i++) {
        dsc_tensor_free(e->ctx, outputs[i]);
        outputs[i] = NULL;
      }
      int nd = dsc_diag_count(e->ctx);
      (void)disk_xfer(e, e->params, false); /* the values moved on: take the file's back */
      (void)nd;
    }
  }
  return st;
}

static dsc_status exec_run(dsc_exec *e, const char *graph, const dsc_tensor *const *inputs,
                           int n_inputs, dsc_tensor **outputs) {
  dsc_graph *g = dsc_module_find_graph(e->m, graph);
  if (!g) {
    ir_error(e->ctx, ir_no_loc, "executor: module '%s' has no graph '%s'", dsc_module_name(e->m),
             graph);
    return DSC_ERR_USER;
  }
  if (e->backend == DSC_BACKEND_INTERP) {
    dsc_interp_options io = {e->comm};
    int64_t t0 = e->trace ? dsc_trace_now_ns() : 0;
    dsc_status st = dsc_interp_run_with(g, e->params, inputs, n_inputs, outputs, &io);
    if (e->trace)
      dsc_trace_spanf(e->trace, e->trace_pid, DSC_TRACE_COMPUTE, t0, dsc_trace_now_ns(),
                      "%s (interpreter)", graph);
    return st;
  }
  if (e->cuda) {
    int gi = 0;
    while (dsc_module_graph(e->m, gi) != g) gi++;
    int64_t t0 = e->trace ? dsc_trace_now_ns() : 0;
    dsc_status st = rt_cuda_exec_run(e->cuda, gi, inputs, n_inputs, outputs);
    if (e->trace)
      dsc_trace_spanf(e->trace, e->trace_pid, DSC_TRACE_COMPUTE, t0, dsc_trace_now_ns(),
                      "%s (cuda)", graph);
    return st;
  }
#ifdef DSC_HAVE_LLVM
  int gi = 0;
  while (dsc_module_graph(e->m, gi) != g) gi++;
  const cg_program *p = e->progs[gi];
  int n_in = dsc_graph_input_count(g);
  if (n_inputs != n_in) {
    ir_error(e->ctx, ir_no_loc, "executor: graph '%s' takes %d inputs, got %d", graph, n_in,
             n_inputs);
    return DSC_ERR_USER;
  }
  /* Inputs arrive as doubles: convert into per-run native buffers. */
  void **native = ir_alloc(e->ctx, sizeof(void *) * (size_t)(n_in + 1));
  size_t *sizes = ir_alloc(e->ctx, sizeof(size_t) * (size_t)(n_in + 1));
  dsc_status st = native && sizes ? DSC_OK : DSC_ERR_INTERNAL;
  for (int i = 0; native && sizes && i < n_in; i++) native[i] = NULL;
  for (int i = 0; st == DSC_OK && i < n_in; i++) {
    dsc_type want = dsc_node_type(dsc_graph_input_at(g, i));
    if (!dsc_type_equal(&want, &inputs[i]->type)) {
      ir_error(e->ctx, ir_no_loc, "executor: input %d of graph '%s' has the wrong type", i,
               graph);
      st = DSC_ERR_USER;
      break;
    }
    int64_t n = dsc_type_numel(&want);
    size_t es = dsc_dtype_size(want.dtype);
    sizes[i] = (size_t)n * es + 1;
    if (!(native[i] = ir_alloc(e->ctx, sizes[i]))) {
      st = DSC_ERR_INTERNAL;
      break;
    }
    for (int64_t j = 0; j < n; j++)
      cg_store_elem(want.dtype, (char *)native[i] + j * (int64_t)es, inputs[i]->data[j]);
  }
  void **outs = NULL;
  if (st == DSC_OK && !(outs = ir_alloc(e->ctx, sizeof(void *) * (size_t)(p->n_outputs + 1))))
    st = DSC_ERR_INTERNAL;
  char err[512] = "";
  if (st == DSC_OK && !rt_cpu_exec_run(e->cpu, gi, native, outs, err, sizeof err)) {
    ir_error(e->ctx, ir_no_loc, "graph '%s': %s", graph, err);
    st = DSC_ERR_USER;
  }
  for (int i = 0; st == DSC_OK && i < p->n_outputs; i++) {
    const cg_output *o = &p->outputs[i];
    if (!(outputs[i] = dsc_tensor_new(e->ctx, o->type))) {
      st = DSC_ERR_INTERNAL;
      break;
    }
    size_t es = dsc_dtype_size(o->type.dtype);
    int64_t n = dsc_type_numel(&o->type);
    for (int64_t j = 0; j < n; j++)
      outputs[i]->data[j] = cg_load_elem(o->type.dtype, (char *)outs[i] + j * (int64_t)es);
  }
  if (st != DSC_OK && outs)
    for (int i = 0; i < p->n_outputs; i++) {
      dsc_tensor_free(e->ctx, outputs[i]);
      outputs[i] = NULL;
    }
  if (st == DSC_ERR_INTERNAL) ir_error(e->ctx, ir_no_loc, "executor: out of memory");
  for (int i = 0; native && sizes && i < n_in; i++)
    if (native[i]) ir_free(e->ctx, native[i], sizes[i]);
  if (native) ir_free(e->ctx, native, sizeof(void *) * (size_t)(n_in + 1));
  if (sizes) ir_free(e->ctx, sizes, sizeof(size_t) * (size_t)(n_in + 1));
  if (outs) ir_free(e->ctx, outs, sizeof(void *) * (size_t)(p->n_outputs + 1));
  return st;
#else
  return DSC_ERR_INTERNAL;
#endif
}

dsc_status dsc_exec_set_comm(dsc_exec *e, dsc_comm *comm) {
  e->comm = comm;
  if (e->cuda && rt_cuda_exec_set_comm(e->cuda, comm) != DSC_OK) return DSC_ERR_USER;
#ifdef DSC_HAVE_LLVM
  if (e->cpu) rt_cpu_exec_set_comm(e->cpu, comm);
#endif
  return DSC_OK;
}

void dsc_exec_set_collective_tag(dsc_exec *e, int64_t tag) {
#ifdef DSC_HAVE_LLVM
  if (e->cpu) rt_cpu_exec_set_tag(e->cpu, tag);
#endif
  (void)e, (void)tag;
}

dsc_status dsc_exec_set_trace(dsc_exec *e, dsc_trace *trace, int pid) {
#ifdef DSC_HAVE_LLVM
  if (e->cpu && !rt_cpu_exec_set_trace(e->cpu, trace, pid)) return DSC_ERR_INTERNAL;
#endif
  e->trace = trace;
  e->trace_pid = pid;
  return DSC_OK;
}

int64_t dsc_exec_device_bytes(const dsc_exec *e) {
  return e->cuda ? rt_cuda_exec_device_bytes(e->cuda) : 0;
}

void dsc_exec_kernel_counts(const dsc_exec *e, int *compiled, int *prebuilt) {
  *compiled = *prebuilt = 0;
  if (e->cuda) {
    int cached = 0;
    rt_cuda_exec_kernel_counts(e->cuda, compiled, &cached);
    return;
  }
#ifdef DSC_HAVE_LLVM
  cg_llvm_jit_stats(e->jit, compiled, NULL);
  *prebuilt = e->prebuilt;
#else
  (void)e;
#endif
}

void dsc_exec_set_profiling(dsc_exec *e, bool on) {
  if (e->cuda) rt_cuda_exec_set_profiling(e->cuda, on);
#ifdef DSC_HAVE_LLVM
  if (e->cpu) rt_cpu_exec_set_profiling(e->cpu, on);
#else
  (void)e, (void)on;
#endif
}

#ifdef DSC_HAVE_LLVM
#define N_INS_KINDS (CG_INS_TIER_WAIT + 1) /* cg_ins_kind values (the last one + 1) */
static const char *instr_kind_name(cg_ins_kind kind) {
  switch (kind) {
    case CG_INS_LAUNCH: return "kernel";
    case CG_INS_GEMM: return "gemm";
    case CG_INS_EMBEDDING_GRAD: return "embedding_grad";
    case CG_INS_COPY: return "copy";
    case CG_INS_COLLECTIVE_START: return "comm_start";
    case CG_INS_COLLECTIVE_WAIT: return "comm_wait"; /* time here = exposed communication */
    case CG_INS_TIER_START: return "disk_start";
    case CG_INS_TIER_WAIT: return "disk_wait"; /* time here = exposed disk IO */
  }
  return "?";
}
#endif

dsc_status dsc_exec_print_profile(dsc_exec *e, const char *graph, int top, FILE *out) {
  if (e->cuda) {
    for (int i = 0; i < dsc_module_graph_count(e->m); i++)
      if (strcmp(dsc_graph_name(dsc_module_graph(e->m, i)), graph) == 0)
        return rt_cuda_exec_print_profile(e->cuda, i, top, out);
    ir_error(e->ctx, ir_no_loc, "profile: no compiled graph '%s'", graph);
    return DSC_ERR_USER;
  }
#ifdef DSC_HAVE_LLVM
  int gi = -1;
  for (int i = 0; i < dsc_module_graph_count(e->m); i++)
    if (strcmp(dsc_graph_name(dsc_module_graph(e->m, i)), graph) == 0) gi = i;
  if (!e->cpu || gi < 0) {
    ir_error(e->ctx, ir_no_loc, "profile: no compiled graph '%s'", graph);
    return DSC_ERR_USER;
  }
  int n = 0;
  int64_t runs = 0;
  const int64_t *ns = rt_cpu_exec_profile(e->cpu, gi, &n, &runs);
  if (!ns || runs == 0) {
    fprintf(out, "profile of %s: no timed runs\n", graph);
    return DSC_OK;
  }
  const cg_program *p = e->progs[gi];
  double total = 0, by_kind[N_INS_KINDS] = {0};
  int count_kind[N_INS_KINDS] = {0};
  for (int i = 0; i < n; i++) {
    total += (double)ns[i];
    by_kind[p->instrs[i].kind] += (double)ns[i];
    count_kind[p->instrs[i].kind]++;
  }
  fprintf(out, "profile of %s: %.3f ms per run over %lld runs, %d instructions\n", graph,
          total / 1e6 / (double)runs, (long long)runs, n);
  for (int k = 0; k < N_INS_KINDS; k++)
    if (count_kind[k])
      fprintf(out, "  %-15s %5d  %9.3f ms  %5.1f%%\n",
              instr_kind_name((cg_ins_kind)k), count_kind[k],
              by_kind[k] / 1e6 / (double)runs, 100 * by_kind[k] / (total > 0 ? total : 1));
  /* The top instructions: repeated selection (n is a few thousand). */
  bool *shown = ir_alloc(e->ctx, (size_t)n + 1);
  if (!shown) return DSC_ERR_INTERNAL;
  memset(shown, 0, (size_t)n + 1);
  for (int t = 0; t < top && t < n; t++) {
    int best = -1;
    for (int i = 0; i < n; i++)
      if (!shown[i] && (best < 0 || ns[i] > ns[best])) best = i;
    shown[best] = true;
    const cg_instr *in = &p->instrs[best];
    char what[160] = "";
    if (in->kind == CG_INS_LAUNCH)
      snprintf(what, sizeof what, "%s", p->kernel_info[in->kernel].name);
    else if (in->kind == CG_INS_GEMM)
      snprintf(what, sizeof what, "%lldx%lld [%lld x %lld x %lld]", (long long)in->gemm.batch[0],
               (long long)in->gemm.batch[1], (long long)in->gemm.m, (long long)in->gemm.n,
               (long long)in->gemm.k);
    else if (in->kind == CG_INS_COLLECTIVE_START || in->kind == CG_INS_COLLECTIVE_WAIT) {
      static const char *coll[] = {"all_reduce", "reduce_scatter", "all_gather", "broadcast"};
      snprintf(what, sizeof what, "%s #%d %s[%lld] tag %lld",
               (unsigned)in->coll.kind < 4 ? coll[in->coll.kind] : "?", in->coll.id,
               dsc_dtype_name(in->coll.dtype), (long long)in->coll.count, (long long)in->coll.tag);
    }
    fprintf(out, "  #%-5d %-14s %9.3f ms  %5.1f%%  %s%s%s\n", best, instr_kind_name(in->kind),
            (double)ns[best] / 1e6 / (double)runs, 100 * (double)ns[best] / (total > 0 ? total : 1),
            what, in->op ? "  from " : "", in->op ? in->op : "");
  }
  ir_free(e->ctx, shown, (size_t)n + 1);
  return DSC_OK;
#else
  (void)top, (void)out;
  ir_error(e->ctx, ir_no_loc, "profile: graph '%s' is not compiled (interp backend)", graph);
  return DSC_ERR_USER;
#endif
}
