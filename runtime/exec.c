/* The public executor (include/dsc/exec.h): a thin dispatcher over the
 * executor backends (runtime/runtime.h rt_executor: the interpreter,
 * runtime/exec_interp.c; cpu, runtime/exec_cpu_backend.c; cuda,
 * runtime/exec_cuda.c). It owns what every backend shares: the params'
 * offload tiers and the disk tier's file, the argument checks, the traces
 * of whole runs, and the compile step's output (cg_compiled_module, made
 * above the runtime: driver/exec_new.c), which it releases with the
 * executor. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsc/exec.h"
#include "runtime/runtime.h"

struct dsc_exec {
  dsc_context *ctx;
  dsc_module *m;
  dsc_backend backend;
  const rt_executor *be;
  void *impl; /* the backend's executor */
  const cg_compiled_module *compiled; /* owned: released by dsc_exec_free */
  dsc_comm *comm;   /* dsc_exec_set_comm; not owned */
  dsc_trace *trace; /* dsc_exec_set_trace; not owned */
  int trace_pid;
  /* Offload tiers (cg_state_layout_tiers): per param its tier and offset in
   * the tier's arena; the disk values (disk_idx: their param indices) live
   * in the file `disk` only: a backend that streams them runs the
   * programs' tier transfers, the others keep their values and exec.c
   * reads and writes the file around each run */
  int *tiers;
  int64_t *tier_offsets;
  int64_t tier_bytes[CG_TIER_COUNT];
  int n_disk;
  int *disk_idx;
  rt_offload *disk;
};

static const rt_executor *const executors[] = {&rt_exec_interp, &rt_exec_cpu, &rt_exec_cuda};
#define N_EXECUTORS ((int)(sizeof executors / sizeof executors[0]))

const rt_executor *rt_executor_of(dsc_backend b) {
  for (int i = 0; i < N_EXECUTORS; i++)
    if (executors[i]->id == b) return executors[i];
  return NULL;
}

const char *dsc_backend_name(dsc_backend b) {
  const rt_executor *be = rt_executor_of(b);
  return be ? be->name : "?";
}

int dsc_backend_from_name(const char *name, dsc_backend *out) {
  for (int i = 0; i < N_EXECUTORS; i++)
    if (strcmp(name, executors[i]->name) == 0) {
      *out = executors[i]->id;
      return 0;
    }
  return -1;
}

bool dsc_backend_available(dsc_backend b) {
  const rt_executor *be = rt_executor_of(b);
  return be && be->available();
}

dsc_backend dsc_backend_default(void) {
  return dsc_backend_available(DSC_BACKEND_CPU) ? DSC_BACKEND_CPU : DSC_BACKEND_INTERP;
}

dsc_backend dsc_exec_backend(const dsc_exec *e) { return e->backend; }

/* The tiers' layout (cg_state_layout_tiers) into offsets and tiers (np + 1
 * each) and bytes; a diagnostic when the meta is malformed. */
static dsc_status tier_layout(dsc_module *m, int64_t *offsets, int *tiers, int64_t *bytes) {
  if (cg_state_layout_tiers(m, offsets, tiers, bytes)) return DSC_OK;
  ir_error(dsc_module_context(m), ir_no_loc,
           "executor: module '%s': the params do not fit in memory, or a tier.<name> meta is "
           "not host or disk",
           dsc_module_name(m));
  return DSC_ERR_USER;
}

dsc_status rt_exec_check(dsc_module *m, dsc_backend b) {
  dsc_context *ctx = dsc_module_context(m);
  const rt_executor *be = rt_executor_of(b);
  if (!be || !be->available()) {
    ir_error(ctx, ir_no_loc, "%s", be ? be->not_built : "unknown backend");
    return DSC_ERR_USER;
  }
  int np = dsc_module_param_count(m);
  int64_t *offsets = ir_alloc(ctx, sizeof(int64_t) * (size_t)(np + 1));
  int *tiers = ir_alloc(ctx, sizeof(int) * (size_t)(np + 1));
  int64_t bytes[CG_TIER_COUNT];
  dsc_status st = offsets && tiers ? tier_layout(m, offsets, tiers, bytes) : DSC_ERR_INTERNAL;
  if (offsets) ir_free(ctx, offsets, sizeof(int64_t) * (size_t)(np + 1));
  if (tiers) ir_free(ctx, tiers, sizeof(int) * (size_t)(np + 1));
  if (st == DSC_ERR_INTERNAL) ir_error(ctx, ir_no_loc, "executor: out of memory");
  if (st != DSC_OK) return st;
  return be->check ? be->check(m) : DSC_OK;
}

static void free_tiers(dsc_exec *e) {
  int np = dsc_module_param_count(e->m);
  if (e->tiers) ir_free(e->ctx, e->tiers, sizeof(int) * (size_t)(np + 1));
  if (e->tier_offsets) ir_free(e->ctx, e->tier_offsets, sizeof(int64_t) * (size_t)(np + 1));
  if (e->disk_idx) ir_free(e->ctx, e->disk_idx, sizeof(int) * (size_t)(np + 1));
  rt_offload_free(e->disk);
}

static void release_compiled(const cg_compiled_module *c) {
  if (c && c->release) c->release(c->owner);
}

void dsc_exec_free(dsc_exec *e) {
  if (!e) return;
  free_tiers(e);
  if (e->impl) e->be->destroy(e->impl);
  release_compiled(e->compiled);
  ir_free(e->ctx, e, sizeof *e);
}

/* The tiers of the module's params and states (passes/offload.c). */
static dsc_status init_tiers(dsc_exec *e) {
  int np = dsc_module_param_count(e->m);
  e->tiers = ir_alloc(e->ctx, sizeof(int) * (size_t)(np + 1));
  e->tier_offsets = ir_alloc(e->ctx, sizeof(int64_t) * (size_t)(np + 1));
  e->disk_idx = ir_alloc(e->ctx, sizeof(int) * (size_t)(np + 1));
  if (!e->tiers || !e->tier_offsets || !e->disk_idx) return DSC_ERR_INTERNAL;
  dsc_status st = tier_layout(e->m, e->tier_offsets, e->tiers, e->tier_bytes);
  if (st != DSC_OK) return st;
  for (int i = 0; i < np; i++)
    if (e->tiers[i] == CG_TIER_DISK) e->disk_idx[e->n_disk++] = i;
  return DSC_OK;
}

dsc_status rt_exec_new(dsc_module *m, const dsc_exec_options *opts, const cg_compiled_module *c,
                       dsc_exec **out) {
  *out = NULL;
  dsc_context *ctx = dsc_module_context(m);
  dsc_backend b = opts ? opts->backend : dsc_backend_default();
  dsc_status st = rt_exec_check(m, b);
  const rt_executor *be = rt_executor_of(b);
  if (st == DSC_OK && be->compiled && (!c || c->target != be->target)) {
    ir_error(ctx, ir_no_loc, "executor: backend %s needs kernels compiled for it", be->name);
    st = DSC_ERR_INTERNAL;
  }
  dsc_exec *e = st == DSC_OK ? ir_alloc(ctx, sizeof *e) : NULL;
  if (st == DSC_OK && !e) st = DSC_ERR_INTERNAL;
  if (st != DSC_OK) {
    if (st == DSC_ERR_INTERNAL && dsc_diag_count(ctx) == 0)
      ir_error(ctx, ir_no_loc, "executor: out of memory");
    release_compiled(c);
    return st;
  }
  memset(e, 0, sizeof *e);
  e->ctx = ctx;
  e->m = m;
  e->backend = b;
  e->be = be;
  e->compiled = c;
  st = init_tiers(e);
  if (st == DSC_OK) {
    rt_exec_args a = {m, opts, c, e->tiers, e->tier_offsets, e->tier_bytes};
    st = be->create(&a, &e->impl);
  }
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

static dsc_status check_params(dsc_exec *e, const dsc_params *p) {
  if (same_params(e, p)) return DSC_OK;
  ir_error(e->ctx, ir_no_loc, "executor: the params do not match module '%s'",
           dsc_module_name(e->m));
  return DSC_ERR_USER;
}

/* ---- the disk tier: the file <-> doubles (runtime/offload_io.c) ----
 * One value at a time through a buffer of its native dtype, so that only
 * one value is in host memory at once (initialisation, checkpoints, the
 * runs of backends that do not stream). */
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
  if (e->be->set_offload) e->be->set_offload(e->impl, NULL, NULL, 0);
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
  if (e->be->set_offload) {
    int np = dsc_module_param_count(e->m);
    int *value = ir_alloc(e->ctx, sizeof(int) * (size_t)(np + 1));
    if (!value) return DSC_ERR_INTERNAL;
    for (int i = 0; i < np; i++) value[i] = -1;
    for (int k = 0; k < e->n_disk; k++) value[e->disk_idx[k]] = k;
    dsc_status st = e->be->set_offload(e->impl, e->disk, value, np);
    ir_free(e->ctx, value, sizeof(int) * (size_t)(np + 1));
    if (st != DSC_OK) return st;
  }
  return DSC_OK;
}

void dsc_exec_tier_bytes(const dsc_exec *e, int64_t *device, int64_t *host, int64_t *disk) {
  if (device) *device = e->tier_bytes[CG_TIER_DEVICE];
  if (host) *host = e->tier_bytes[CG_TIER_HOST];
  if (disk) *disk = e->tier_bytes[CG_TIER_DISK];
}

dsc_status dsc_exec_set_params(dsc_exec *e, const dsc_params *p) {
  if (e->n_disk > 0 && !e->disk) return no_file(e);
  dsc_status st = check_params(e, p);
  if (st == DSC_OK) st = e->be->set_params(e->impl, p);
  if (st == DSC_OK) st = disk_xfer(e, (dsc_params *)p, true); /* read only: write == true */
  return st;
}

dsc_status dsc_exec_load_params(dsc_exec *e, const dsc_params *src) {
  const dsc_module *sm = dsc_params_module(src);
  for (int k = 0; k < dsc_module_param_count(sm); k++) {
    const char *name = dsc_module_param_name(sm, k);
    int i = dsc_module_find_param(e->m, name);
    if (i < 0) {
      ir_error(e->ctx, ir_no_loc, "executor: module '%s' has no param '%s'", dsc_module_name(e->m),
               name);
      return DSC_ERR_USER;
    }
    dsc_type want = dsc_module_param_type(e->m, i);
    const dsc_tensor *t = dsc_params_get(src, k);
    if (!dsc_type_equal(&want, &t->type)) {
      char t1[96], t2[96];
      dsc_type_format(&want, t1, sizeof t1);
      dsc_type_format(&t->type, t2, sizeof t2);
      ir_error(e->ctx, ir_no_loc, "executor: param '%s' of module '%s' is %s, given %s", name,
               dsc_module_name(e->m), t1, t2);
      return DSC_ERR_USER;
    }
    if (e->tiers && e->tiers[i] == CG_TIER_DISK) {
      ir_error(e->ctx, ir_no_loc,
               "executor: param '%s' is on the disk tier; load it with the others", name);
      return DSC_ERR_USER;
    }
    dsc_status st = e->be->set_param(e->impl, i, t);
    if (st != DSC_OK) return st;
  }
  return DSC_OK;
}

dsc_status dsc_exec_get_params(dsc_exec *e, dsc_params *p) {
  dsc_status st = check_params(e, p);
  if (st == DSC_OK) st = e->be->get_params(e->impl, p);
  if (st == DSC_OK) st = disk_xfer(e, p, false);
  return st;
}

static int graph_index(const dsc_exec *e, const char *graph) {
  for (int i = 0; i < dsc_module_graph_count(e->m); i++)
    if (strcmp(dsc_graph_name(dsc_module_graph(e->m, i)), graph) == 0) return i;
  return -1;
}

static dsc_status exec_run(dsc_exec *e, const char *graph, const dsc_tensor *const *inputs,
                           int n_inputs, dsc_tensor **outputs) {
  dsc_graph *g = dsc_module_find_graph(e->m, graph);
  if (!g) {
    ir_error(e->ctx, ir_no_loc, "executor: module '%s' has no graph '%s'", dsc_module_name(e->m),
             graph);
    return DSC_ERR_USER;
  }
  int gi = 0;
  while (dsc_module_graph(e->m, gi) != g) gi++;
  int64_t t0 = e->trace && e->be->run_label ? dsc_trace_now_ns() : 0;
  dsc_status st = e->be->run(e->impl, gi, inputs, n_inputs, outputs);
  if (e->trace && e->be->run_label) /* backends without traces of their own: the whole run */
    dsc_trace_spanf(e->trace, e->trace_pid, DSC_TRACE_COMPUTE, t0, dsc_trace_now_ns(), "%s (%s)",
                    graph, e->be->run_label);
  return st;
}

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

/* With disk values: a backend that streams them does so within the run
 * (its program's tier transfers, which commit the file when the run
 * completes). One that keeps every value (the interpreter's doubles) has
 * the disk values read from the file before the run and, when the run
 * writes them, written to the other slot and flipped after; a failed run
 * or write leaves the file's values, and the backend takes them back. */
dsc_status dsc_exec_run(dsc_exec *e, const char *graph, const dsc_tensor *const *inputs,
                        int n_inputs, dsc_tensor **outputs) {
  dsc_graph *g = dsc_module_find_graph(e->m, graph);
  dsc_params *values = e->be->values ? e->be->values(e->impl) : NULL;
  if (e->n_disk == 0 || !g || !values) return exec_run(e, graph, inputs, n_inputs, outputs);
  int64_t t0 = e->trace ? dsc_trace_now_ns() : 0;
  dsc_status st = disk_xfer(e, values, false);
  if (e->trace && st == DSC_OK)
    dsc_trace_spanf(e->trace, e->trace_pid, DSC_TRACE_COPY, t0, dsc_trace_now_ns(),
                    "offload read (%d values)", e->n_disk);
  if (st == DSC_OK) st = exec_run(e, graph, inputs, n_inputs, outputs);
  if (st == DSC_OK && writes_disk(e, g)) {
    t0 = e->trace ? dsc_trace_now_ns() : 0;
    st = disk_xfer(e, values, true);
    if (e->trace && st == DSC_OK)
      dsc_trace_spanf(e->trace, e->trace_pid, DSC_TRACE_COPY, t0, dsc_trace_now_ns(),
                      "offload write (%d values)", e->n_disk);
    if (st != DSC_OK) {
      for (int i = 0; i < dsc_graph_output_count(g); i++) {
        dsc_tensor_free(e->ctx, outputs[i]);
        outputs[i] = NULL;
      }
      (void)disk_xfer(e, values, false); /* the values moved on: take the file's back */
    }
  }
  return st;
}

dsc_status dsc_exec_run_step(dsc_exec *e, const dsc_tensor *const *inputs, int n_inputs,
                             dsc_tensor **outputs) {
  int64_t K = dsc_step_micro_batches(e->m);
  if (K == 1) return dsc_exec_run(e, "train_step", inputs, n_inputs, outputs);
  if (n_inputs < 1 || n_inputs > DSC_MAX_STEP_INPUTS) {
    ir_error(e->ctx, ir_no_loc, "training step: %d inputs (1 to %d)", n_inputs,
             DSC_MAX_STEP_INPUTS);
    return DSC_ERR_USER;
  }
  dsc_tensor views[DSC_MAX_STEP_INPUTS];
  const dsc_tensor *vp[DSC_MAX_STEP_INPUTS];
  for (int i = 0; i < n_inputs; i++) vp[i] = &views[i];
  for (int64_t k = 0; k < K; k++) {
    double first;
    dsc_status st = dsc_step_micro_inputs(e->m, inputs, n_inputs, k, views, &first);
    dsc_tensor *loss = NULL;
    if (st == DSC_OK) st = dsc_exec_run(e, "micro_step", vp, n_inputs, &loss);
    dsc_tensor_free(e->ctx, loss);
    if (st != DSC_OK) return st;
  }
  return dsc_exec_run(e, "train_step", &inputs[n_inputs - 1], 1, outputs);
}

dsc_status dsc_exec_set_comm(dsc_exec *e, dsc_comm *comm) {
  e->comm = comm;
  return e->be->set_comm ? e->be->set_comm(e->impl, comm) : DSC_OK;
}

void dsc_exec_set_collective_tag(dsc_exec *e, int64_t tag) {
  if (e->be->set_tag) e->be->set_tag(e->impl, tag);
}

dsc_status dsc_exec_set_trace(dsc_exec *e, dsc_trace *trace, int pid) {
  if (e->be->set_trace) {
    dsc_status st = e->be->set_trace(e->impl, trace, pid);
    if (st != DSC_OK) return st;
  }
  e->trace = trace;
  e->trace_pid = pid;
  return DSC_OK;
}

void dsc_exec_memory_report(const dsc_exec *e, dsc_exec_memory *out) {
  memset(out, 0, sizeof *out);
  if (e->be->memory)
    e->be->memory(e->impl, &out->arenas, &out->arenas_resident, &out->gemm_scratch_resident);
  out->compile_other = -1;
  if (e->compiled && e->compiled->target == CG_TARGET_CPU) {
    out->kernel_code = (int64_t)e->compiled->code_bytes;
    out->compile_other = e->compiled->compile_other;
  }
}

int64_t dsc_exec_device_bytes(const dsc_exec *e) {
  return e->be->device_bytes ? e->be->device_bytes(e->impl) : 0;
}

int dsc_exec_kernels_cached(const dsc_exec *e) {
  /* the compile step counts prebuilt objects among its cache hits */
  return e->compiled ? e->compiled->cached - e->compiled->prebuilt : 0;
}

void dsc_exec_kernel_counts(const dsc_exec *e, int *compiled, int *prebuilt) {
  *compiled = e->compiled ? e->compiled->compiled : 0;
  *prebuilt = e->compiled ? e->compiled->prebuilt : 0;
}

void dsc_exec_set_profiling(dsc_exec *e, bool on) {
  if (e->be->set_profiling) e->be->set_profiling(e->impl, on);
}

void rt_phase_add(const cg_instr *in, double ms, dsc_phase_times *t) {
  bool comm = in->kind == CG_INS_COLLECTIVE_START || in->kind == CG_INS_COLLECTIVE_WAIT;
  if (in->phase == IR_PHASE_BACKWARD) {
    t->bwd += ms;
    if (comm && (in->coll.kind == CG_COLL_ALL_REDUCE || in->coll.kind == CG_COLL_REDUCE_SCATTER))
      t->bwd_allreduce += ms;
    else
      t->bwd_inner += ms;
  } else if (in->phase == IR_PHASE_STEP) {
    t->step += ms;
  } else {
    t->fwd += ms;
  }
}

bool dsc_exec_has_profile(const dsc_exec *e) { return e->be->phase_times != NULL; }

dsc_status dsc_exec_phase_times(dsc_exec *e, const char *graph, dsc_phase_times *out) {
  memset(out, 0, sizeof *out);
  int gi = graph_index(e, graph);
  if (!e->be->phase_times) {
    ir_error(e->ctx, ir_no_loc,
             "wall_clock_breakdown: graph '%s' is not compiled (%s backend): it times no "
             "instructions",
             graph, e->be->name);
    return DSC_ERR_USER;
  }
  if (gi < 0) {
    ir_error(e->ctx, ir_no_loc, "wall_clock_breakdown: no compiled graph '%s'", graph);
    return DSC_ERR_USER;
  }
  return e->be->phase_times(e->impl, gi, out);
}

dsc_status dsc_exec_print_profile(dsc_exec *e, const char *graph, int top, FILE *out) {
  int gi = graph_index(e, graph);
  if (!e->be->print_profile) {
    ir_error(e->ctx, ir_no_loc, "profile: graph '%s' is not compiled (%s backend)", graph,
             e->be->name);
    return DSC_ERR_USER;
  }
  if (gi < 0) {
    ir_error(e->ctx, ir_no_loc, "profile: no compiled graph '%s'", graph);
    return DSC_ERR_USER;
  }
  return e->be->print_profile(e->impl, gi, top, out);
}
