/* The cpu executor backend (runtime/runtime.h rt_executor): the compile
 * step's Programs and loaded kernel entries run by runtime/exec_cpu.c over
 * one STATE arena that holds every param and state in its native dtype
 * (layout: cg_state_layout). The doubles of dsc_params are converted only
 * when params are set or read (initialisation, checkpoints), never per
 * step; a run converts its inputs and outputs. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "runtime/runtime.h"

typedef struct {
  dsc_context *ctx;
  dsc_module *m;
  const cg_compiled_module *c; /* not owned (the dispatcher's) */
  const int *tiers;            /* per param (the dispatcher's) */
  const int64_t *tier_offsets;
  rt_cpu_exec *cpu;
  cg_cpu_kernel_fn **fns; /* per program: the entries (rt_cpu_exec's shape) */
} cpu_exec;

static bool cpu_available(void) {
#ifdef DSC_HAVE_LLVM
  return true;
#else
  return false;
#endif
}

static void cpu_destroy(void *impl) {
  cpu_exec *x = impl;
  rt_cpu_exec_free(x->cpu);
  if (x->fns) ir_free(x->ctx, x->fns, sizeof *x->fns * (size_t)(x->c->n_programs + 1));
  ir_free(x->ctx, x, sizeof *x);
}

static dsc_status cpu_create(const rt_exec_args *a, void **impl) {
  dsc_context *ctx = dsc_module_context(a->m);
  cpu_exec *x = ir_alloc(ctx, sizeof *x);
  if (!x) return DSC_ERR_INTERNAL;
  memset(x, 0, sizeof *x);
  x->ctx = ctx, x->m = a->m, x->c = a->compiled;
  x->tiers = a->tiers, x->tier_offsets = a->tier_offsets;
  const cg_compiled_module *c = a->compiled;
  x->fns = ir_alloc(ctx, sizeof *x->fns * (size_t)(c->n_programs + 1));
  if (!x->fns) {
    cpu_destroy(x);
    return DSC_ERR_INTERNAL;
  }
  for (int i = 0; i < c->n_programs; i++) x->fns[i] = (cg_cpu_kernel_fn *)c->kernels[i].entries;
  const dsc_exec_options *o = a->opts;
  int threads = o && o->threads > 0 ? o->threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
  if (threads < 1) threads = 1;
  int64_t arenas[CG_TIER_COUNT];
  memcpy(arenas, a->tier_bytes, sizeof arenas);
  arenas[CG_TIER_DISK] = 0; /* streamed: in-flight buffers are WORK buffers */
  x->cpu = rt_cpu_exec_new_tiered(ctx, (const cg_program *const *)c->programs, c->n_programs,
                                  (cg_cpu_kernel_fn *const *)x->fns, threads, arenas);
  if (!x->cpu) {
    cpu_destroy(x);
    return DSC_ERR_INTERNAL;
  }
  *impl = x;
  return DSC_OK;
}

/* Param i in (doubles -> native), t of its type. */
static dsc_status cpu_set_param(void *impl, int i, const dsc_tensor *t) {
  cpu_exec *x = impl;
  size_t es = dsc_dtype_size(t->type.dtype);
  char *slot = (char *)rt_cpu_exec_tier(x->cpu, x->tiers[i]) + x->tier_offsets[i];
  for (int64_t j = 0; j < dsc_type_numel(&t->type); j++)
    cg_store_elem(t->type.dtype, slot + j * (int64_t)es, t->data[j]);
  return DSC_OK;
}

/* Params in (doubles -> native) or out; the disk tier's are the file's. */
static dsc_status copy_params(cpu_exec *x, dsc_params *p, bool in) {
  for (int i = 0; i < dsc_module_param_count(x->m); i++) {
    if (x->tiers[i] == CG_TIER_DISK) continue; /* the file's (exec.c disk_xfer) */
    dsc_tensor *t = dsc_params_get(p, i);
    if (in) {
      cpu_set_param(x, i, t);
      continue;
    }
    dsc_type ty = dsc_module_param_type(x->m, i);
    size_t es = dsc_dtype_size(ty.dtype);
    const char *slot = (const char *)rt_cpu_exec_tier(x->cpu, x->tiers[i]) + x->tier_offsets[i];
    int64_t n = dsc_type_numel(&ty);
    for (int64_t j = 0; j < n; j++) t->data[j] = cg_load_elem(ty.dtype, slot + j * (int64_t)es);
  }
  return DSC_OK;
}

static dsc_status cpu_set_params(void *impl, const dsc_params *p) {
  return copy_params(impl, (dsc_params *)p, true);
}

static dsc_status cpu_get_params(void *impl, dsc_params *p) { return copy_params(impl, p, false); }

static dsc_status cpu_run(void *impl, int gi, const dsc_tensor *const *inputs, int n_inputs,
                          dsc_tensor **outputs) {
  cpu_exec *x = impl;
  dsc_context *ctx = x->ctx;
  const dsc_graph *g = dsc_module_graph(x->m, gi);
  const char *graph = dsc_graph_name(g);
  const cg_program *p = x->c->programs[gi];
  int n_in = dsc_graph_input_count(g);
  if (n_inputs != n_in) {
    ir_error(ctx, ir_no_loc, "executor: graph '%s' takes %d inputs, got %d", graph, n_in,
             n_inputs);
    return DSC_ERR_USER;
  }
  /* Inputs arrive as doubles: convert into per-run native buffers. */
  void **native = ir_alloc(ctx, sizeof(void *) * (size_t)(n_in + 1));
  size_t *sizes = ir_alloc(ctx, sizeof(size_t) * (size_t)(n_in + 1));
  dsc_status st = native && sizes ? DSC_OK : DSC_ERR_INTERNAL;
  for (int i = 0; native && sizes && i < n_in; i++) native[i] = NULL;
  for (int i = 0; st == DSC_OK && i < n_in; i++) {
    dsc_type want = dsc_node_type(dsc_graph_input_at(g, i));
    if (!dsc_type_equal(&want, &inputs[i]->type)) {
      ir_error(ctx, ir_no_loc, "executor: input %d of graph '%s' has the wrong type", i, graph);
      st = DSC_ERR_USER;
      break;
    }
    int64_t n = dsc_type_numel(&want);
    size_t es = dsc_dtype_size(want.dtype);
    sizes[i] = (size_t)n * es + 1;
    if (!(native[i] = ir_alloc(ctx, sizes[i]))) {
      st = DSC_ERR_INTERNAL;
      break;
    }
    for (int64_t j = 0; j < n; j++)
      cg_store_elem(want.dtype, (char *)native[i] + j * (int64_t)es, inputs[i]->data[j]);
  }
  void **outs = NULL;
  if (st == DSC_OK && !(outs = ir_alloc(ctx, sizeof(void *) * (size_t)(p->n_outputs + 1))))
    st = DSC_ERR_INTERNAL;
  char err[512] = "";
  if (st == DSC_OK && !rt_cpu_exec_run(x->cpu, gi, native, outs, err, sizeof err)) {
    ir_error(ctx, ir_no_loc, "graph '%s': %s", graph, err);
    st = DSC_ERR_USER;
  }
  for (int i = 0; st == DSC_OK && i < p->n_outputs; i++) {
    const cg_output *o = &p->outputs[i];
    if (!(outputs[i] = dsc_tensor_new(ctx, o->type))) {
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
      dsc_tensor_free(ctx, outputs[i]);
      outputs[i] = NULL;
    }
  if (st == DSC_ERR_INTERNAL) ir_error(ctx, ir_no_loc, "executor: out of memory");
  for (int i = 0; native && sizes && i < n_in; i++)
    if (native[i]) ir_free(ctx, native[i], sizes[i]);
  if (native) ir_free(ctx, native, sizeof(void *) * (size_t)(n_in + 1));
  if (sizes) ir_free(ctx, sizes, sizeof(size_t) * (size_t)(n_in + 1));
  if (outs) ir_free(ctx, outs, sizeof(void *) * (size_t)(p->n_outputs + 1));
  return st;
}

static dsc_status cpu_set_comm(void *impl, dsc_comm *comm) {
  rt_cpu_exec_set_comm(((cpu_exec *)impl)->cpu, comm);
  return DSC_OK;
}

static void cpu_set_tag(void *impl, int64_t tag) { rt_cpu_exec_set_tag(((cpu_exec *)impl)->cpu, tag); }

static dsc_status cpu_set_trace(void *impl, dsc_trace *trace, int pid) {
  return rt_cpu_exec_set_trace(((cpu_exec *)impl)->cpu, trace, pid) ? DSC_OK : DSC_ERR_INTERNAL;
}

static dsc_status cpu_set_offload(void *impl, rt_offload *disk, const int *value_of_param, int n) {
  return rt_cpu_exec_set_offload(((cpu_exec *)impl)->cpu, disk, value_of_param, n)
             ? DSC_OK
             : DSC_ERR_INTERNAL;
}

static void cpu_set_profiling(void *impl, bool on) {
  rt_cpu_exec_set_profiling(((cpu_exec *)impl)->cpu, on);
}

#define N_INS_KINDS (CG_INS_TIER_WAIT + 1) /* cg_ins_kind values (the last one + 1) */
static const char *instr_kind_name(cg_ins_kind kind) {
  switch (kind) {
    case CG_INS_LAUNCH: return "kernel";
    case CG_INS_GEMM: return "gemm";
    case CG_INS_EMBEDDING_GRAD: return "embedding_grad";
    case CG_INS_SET_ROWS:
      return "set_rows";
    case CG_INS_COPY: return "copy";
    case CG_INS_COLLECTIVE_START: return "comm_start";
    case CG_INS_COLLECTIVE_WAIT: return "comm_wait"; /* time here = exposed communication */
    case CG_INS_TIER_START: return "disk_start";
    case CG_INS_TIER_WAIT: return "disk_wait"; /* time here = exposed disk IO */
  }
  return "?";
}

/* What instruction in did, for the profile's top list. */
static void instr_what(const cg_program *p, const cg_instr *in, char *what, size_t n) {
  what[0] = '\0';
  if (in->kind == CG_INS_LAUNCH)
    snprintf(what, n, "%s", p->kernel_info[in->kernel].name);
  else if (in->kind == CG_INS_GEMM)
    snprintf(what, n, "%lldx%lld [%lld x %lld x %lld]", (long long)in->gemm.batch[0],
             (long long)in->gemm.batch[1], (long long)in->gemm.m, (long long)in->gemm.n,
             (long long)in->gemm.k);
  else if (in->kind == CG_INS_COLLECTIVE_START || in->kind == CG_INS_COLLECTIVE_WAIT) {
    snprintf(what, n, "%s%s%s #%d %s[%lld] tag %lld", in->coll.group, in->coll.group[0] ? " " : "",
             cg_coll_kind_name(in->coll.kind), in->coll.id, dsc_dtype_name(in->coll.dtype),
             (long long)in->coll.count, (long long)in->coll.tag);
  }
}

/* The bytes a kernel launch moves: each argument's extent (what it may
 * reach) once per direction, read and written: the DRAM traffic of a
 * streaming kernel such as AdamW, a bound for one that re-reads. */
static double launch_bytes(const cg_program *p, const cg_instr *in) {
  const cg_kernel_info *k = &p->kernel_info[in->kernel];
  double bytes = 0;
  for (int a = 0; a < k->n_args; a++)
    bytes += (double)k->args[a].numel * (double)dsc_dtype_size(k->args[a].dtype) *
             (double)(k->args[a].read + k->args[a].written);
  return bytes;
}

/* A launch placed on the host (passes/offload_host.c): it touches a host
 * work buffer or a host-tier param. */
static bool launch_on_host(const cg_program *p, const cg_instr *in) {
  for (int a = 0; a < in->n_args; a++) {
    const cg_buffer *b = &p->buffers[in->args[a]];
    if (b->tier == CG_TIER_HOST) return true;
  }
  return false;
}

static dsc_status cpu_print_profile(void *impl, int gi, int top, FILE *out) {
  cpu_exec *x = impl;
  const char *graph = dsc_graph_name(dsc_module_graph(x->m, gi));
  int n = 0;
  int64_t runs = 0;
  const int64_t *ns = rt_cpu_exec_profile(x->cpu, gi, &n, &runs);
  if (!ns || runs == 0) {
    fprintf(out, "profile of %s: no timed runs\n", graph);
    return DSC_OK;
  }
  const cg_program *p = x->c->programs[gi];
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
      fprintf(out, "  %-15s %5d  %9.3f ms  %5.1f%%\n", instr_kind_name((cg_ins_kind)k),
              count_kind[k], by_kind[k] / 1e6 / (double)runs,
              100 * by_kind[k] / (total > 0 ? total : 1));
  /* the host-placed kernels (the offloaded optimizer step) as a stream */
  double host_ns = 0, host_bytes = 0;
  int host_n = 0;
  for (int i = 0; i < n; i++)
    if (p->instrs[i].kind == CG_INS_LAUNCH && launch_on_host(p, &p->instrs[i]))
      host_n++, host_ns += (double)ns[i], host_bytes += launch_bytes(p, &p->instrs[i]);
  if (host_n)
    fprintf(out, "  %-15s %5d  %9.3f ms  %5.1f%%  %.3f MB per run, %.2f GB/s\n", "(host kernels)",
            host_n, host_ns / 1e6 / (double)runs, 100 * host_ns / (total > 0 ? total : 1),
            host_bytes / 1e6, host_ns > 0 ? host_bytes * (double)runs / host_ns : 0);
  /* the host stream's (--offload-overlap): counted in the total above; on
   * its own thread beside the executor's, or in their place (auto with no
   * core free) */
  double stream_ns = 0;
  int stream_n = 0;
  for (int i = 0; i < n; i++)
    if (p->instrs[i].host_stream) stream_n++, stream_ns += (double)ns[i];
  if (stream_n)
    fprintf(out, "  %-15s %5d  %9.3f ms  %5.1f%%  %s\n", "(host stream)", stream_n,
            stream_ns / 1e6 / (double)runs, 100 * stream_ns / (total > 0 ? total : 1),
            rt_cpu_exec_host_stream_on(x->cpu)
                ? "beside the executor's thread"
                : "in their place (no core free for the stream: --offload-overlap true forces it)");
  /* the guarded ones (passes/guard.c): skipped in the runs that do not
   * need their values (ZenFlow's host update between its steps) */
  const int64_t *skips = rt_cpu_exec_profile_skips(x->cpu, gi);
  double guarded_ns = 0, skipped = 0;
  int guarded_n = 0;
  for (int i = 0; skips && i < n; i++)
    if (p->instrs[i].guarded) guarded_n++, guarded_ns += (double)ns[i], skipped += (double)skips[i];
  if (guarded_n)
    fprintf(out, "  %-15s %5d  %9.3f ms  %5.1f%%  skipped in %.1f%% of their runs\n", "(guarded)",
            guarded_n, guarded_ns / 1e6 / (double)runs, 100 * guarded_ns / (total > 0 ? total : 1),
            100 * skipped / ((double)guarded_n * (double)runs));
  /* The top instructions: repeated selection (n is a few thousand). */
  bool *shown = ir_alloc(x->ctx, (size_t)n + 1);
  if (!shown) return DSC_ERR_INTERNAL;
  memset(shown, 0, (size_t)n + 1);
  for (int t = 0; t < top && t < n; t++) {
    int best = -1;
    for (int i = 0; i < n; i++)
      if (!shown[i] && (best < 0 || ns[i] > ns[best])) best = i;
    shown[best] = true;
    const cg_instr *in = &p->instrs[best];
    char what[160];
    instr_what(p, in, what, sizeof what);
    char rate[48] = "";
    if (in->kind == CG_INS_LAUNCH && ns[best] > 0)
      snprintf(rate, sizeof rate, "  %.2f GB/s%s",
               launch_bytes(p, in) * (double)runs / (double)ns[best],
               launch_on_host(p, in) ? " host" : "");
    fprintf(out, "  #%-5d %-14s %9.3f ms  %5.1f%%  %s%s%s%s\n", best, instr_kind_name(in->kind),
            (double)ns[best] / 1e6 / (double)runs, 100 * (double)ns[best] / (total > 0 ? total : 1),
            what, in->op ? "  from " : "", in->op ? in->op : "", rate);
  }
  ir_free(x->ctx, shown, (size_t)n + 1);
  return DSC_OK;
}

static dsc_status cpu_phase_times(void *impl, int gi, dsc_phase_times *out) {
  cpu_exec *x = impl;
  int n = 0;
  const int64_t *ns = rt_cpu_exec_profile(x->cpu, gi, &n, &out->runs);
  const cg_program *p = x->c->programs[gi];
  for (int i = 0; ns && i < n; i++) rt_phase_add(&p->instrs[i], (double)ns[i] / 1e6, out);
  return DSC_OK;
}

static void cpu_memory(const void *impl, int64_t *arenas, int64_t *resident, int64_t *scratch) {
  const cpu_exec *x = impl;
  rt_cpu_exec_memory(x->cpu, arenas, resident, scratch);
}

const rt_executor rt_exec_cpu = {
    .name = "cpu",
    .id = DSC_BACKEND_CPU,
    .available = cpu_available,
    .not_built =
        "backend cpu is not built in (configure with LLVM and oneDNN: "
        "scripts/install-deps.sh)",
    .compiled = true,
    .target = CG_TARGET_CPU,
    .create = cpu_create,
    .destroy = cpu_destroy,
    .set_params = cpu_set_params,
    .get_params = cpu_get_params,
    .set_param = cpu_set_param,
    .run = cpu_run,
    .set_comm = cpu_set_comm,
    .set_tag = cpu_set_tag,
    .set_trace = cpu_set_trace,
    .set_offload = cpu_set_offload,
    .set_profiling = cpu_set_profiling,
    .print_profile = cpu_print_profile,
    .phase_times = cpu_phase_times,
    .memory = cpu_memory,
};
