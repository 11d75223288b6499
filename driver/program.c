/* dsc_program_compile (include/dsc/trainer.h): the modules a training run
 * builds, with their kernels, into a .dsx program file.
 *
 * The modules are stored as text IR after the pipeline; the lowering to
 * cg_programs is deterministic, so a reader re-lowers them (milliseconds)
 * and takes only the kernels' machine code from the file (the expensive
 * part). Sections: include/dsc/exec.h, docs/codegen.md. */
#define _XOPEN_SOURCE 700 /* realpath */
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "driver/driver.h"

/* Everything written, owned here: sections point into these. */
typedef struct {
  dsc_context *ctx;
  ir_arena arena; /* names, texts, lowered programs */
  rt_dsx_section *s;
  int n, cap;
  int kernels;
} writer;

static bool add(writer *w, const char *name, const void *data, size_t size) {
  if (w->n == w->cap) {
    int ncap = w->cap ? 2 * w->cap : 16;
    rt_dsx_section *ns = ir_arena_alloc(&w->arena, sizeof *ns * (size_t)ncap);
    if (!ns) return false;
    if (w->n) memcpy(ns, w->s, sizeof *ns * (size_t)w->n);
    w->s = ns, w->cap = ncap;
  }
  char *n = ir_arena_strdup(&w->arena, name);
  void *d = ir_arena_alloc(&w->arena, size ? size : 1);
  if (!n || !d) return false;
  memcpy(d, data, size);
  w->s[w->n++] = (rt_dsx_section){n, d, size};
  return true;
}

static dsc_status oom(dsc_context *ctx) {
  ir_error(ctx, ir_no_loc, "out of memory");
  return DSC_ERR_INTERNAL;
}

#ifdef DSC_HAVE_LLVM
/* One section per graph: every kernel's object for this host. */
static dsc_status cpu_kernels(writer *w, cg_llvm_jit *jit, const char *sec, cg_program *p) {
  size_t n = (size_t)p->n_kernels + 1;
  void **objs = calloc(n, sizeof *objs);
  size_t *lens = calloc(n, sizeof *lens);
  dsc_status st = objs && lens ? DSC_OK : oom(w->ctx);
  if (st == DSC_OK) st = cg_llvm_kernel_objects(jit, p->kernels, p->n_kernels, objs, lens);
  size_t len = 0;
  void *packed = st == DSC_OK
                     ? rt_pack_kernel_objects(w->ctx, p->kernel_info, p->n_kernels, objs, lens, &len)
                     : NULL;
  if (st == DSC_OK && (!packed || !add(w, sec, packed, len))) st = oom(w->ctx);
  if (packed) ir_free(w->ctx, packed, len);
  for (size_t k = 0; objs && k < n; k++) free(objs[k]);
  free(objs);
  free(lens);
  w->kernels += p->n_kernels;
  return st;
}
#endif

#ifdef DSC_HAVE_CUDA
/* One translation unit per graph: its CUDA C, PTX and cubin. */
static dsc_status cuda_kernels(writer *w, const char *sec, cg_program *p, int arch) {
  char *src = cg_cuda_program_source(&w->arena, p->kernels, p->n_kernels);
  if (!src) return DSC_ERR_INTERNAL;
  char *ptx = NULL;
  void *cubin = NULL;
  size_t ptx_len = 0, cubin_len = 0;
  /* NVRTC's log goes through a scratch context: every generated unit
   * carries the 16-bit float helpers, so "declared but never referenced"
   * (#177-D) is expected; other warnings and errors are passed on. */
  dsc_context *scratch = dsc_context_new(NULL, NULL);
  if (!scratch) return oom(w->ctx);
  dsc_status st = cg_nvrtc_compile(scratch, src, sec, arch, &ptx, &ptx_len, &cubin, &cubin_len);
  for (int i = 0; i < dsc_diag_count(scratch); i++) {
    const dsc_diag *d = dsc_diag_get(scratch, i);
    bool only_unused = d->severity == DSC_DIAG_WARNING;
    for (const char *p = strstr(d->message, "warning #"); only_unused && p;
         p = strstr(p + 1, "warning #"))
      only_unused = strncmp(p, "warning #177-D", 14) == 0;
    if (!only_unused) ir_diag(w->ctx, d->severity, ir_no_loc, "%s", d->message);
  }
  dsc_context_free(scratch);
  char name[320];
  snprintf(name, sizeof name, "%s.cu", sec);
  if (st == DSC_OK && !add(w, name, src, strlen(src))) st = oom(w->ctx);
  snprintf(name, sizeof name, "%s.ptx", sec);
  if (st == DSC_OK && !add(w, name, ptx, ptx_len)) st = oom(w->ctx);
  snprintf(name, sizeof name, "%s.cubin", sec);
  if (st == DSC_OK && !add(w, name, cubin, cubin_len)) st = oom(w->ctx);
  free(ptx);
  free(cubin);
  w->kernels += p->n_kernels;
  return st;
}
#endif

/* "module.<name>" and the kernels of each of its graphs. */
static dsc_status write_module(writer *w, const char *name, dsc_module *m, bool cuda, int arch,
                               void *jit) {
  char sec[300];
  char *text = dsc_module_print_string(m);
  if (!text) return DSC_ERR_INTERNAL;
  snprintf(sec, sizeof sec, "module.%s", name);
  bool ok = add(w, sec, text, strlen(text));
  dsc_string_free(w->ctx, text);
  if (!ok) return oom(w->ctx);
  for (int i = 0; i < dsc_module_graph_count(m); i++) {
    dsc_graph *g = dsc_module_graph(m, i);
    cg_program *p = NULL;
    dsc_status st = cg_lower_graph(g, &w->arena, &p);
    if (st != DSC_OK) return st;
    snprintf(sec, sizeof sec, "%s/%s/%s", cuda ? "cuda" : "cpu", name, dsc_graph_name(g));
    if (p->n_kernels == 0) continue;
#ifdef DSC_HAVE_CUDA
    if (cuda && (st = cuda_kernels(w, sec, p, arch)) != DSC_OK) return st;
#endif
#ifdef DSC_HAVE_LLVM
    if (!cuda && (st = cpu_kernels(w, jit, sec, p)) != DSC_OK) return st;
#endif
  }
  (void)arch, (void)jit;
  return DSC_OK;
}

static dsc_status compile_inner(writer *w, const dsc_compile_options *o, dsc_module **m,
                                dsc_module **fwd, void **jit_out) {
  dsc_context *ctx = w->ctx;
  const char *target = o->target ? o->target : "cpu";
  bool cuda = strcmp(target, "cuda") == 0;
  if (!cuda && strcmp(target, "cpu") != 0) {
    ir_error(ctx, ir_no_loc, "compile: target '%s' is not one of cpu, cuda", target);
    return DSC_ERR_USER;
  }
#ifndef DSC_HAVE_CUDA
  if (cuda) {
    ir_error(ctx, ir_no_loc, "compile: target cuda needs NVRTC, which this dsc is built without");
    return DSC_ERR_USER;
  }
#endif
#ifndef DSC_HAVE_LLVM
  if (!cuda) {
    ir_error(ctx, ir_no_loc,
             "compile: target cpu needs LLVM, which this dsc is built without "
             "(scripts/install-deps.sh)");
    return DSC_ERR_USER;
  }
#endif
  if (!o->model_path || !o->out_path) {
    ir_error(ctx, ir_no_loc, "compile: a model file and an output path are required");
    return DSC_ERR_INTERNAL;
  }
  if (dsc_program_is_file(o->model_path)) {
    ir_error(ctx, rt_loc(o->model_path),
             "is a compiled program (.dsx) already; dsc compile takes the model file (.dsm)");
    return DSC_ERR_USER;
  }
  char abs[PATH_MAX];
  const char *model = realpath(o->model_path, abs) ? abs : o->model_path;
  if (strchr(model, '\n')) {
    ir_error(ctx, rt_loc(o->model_path), "compile: the model path holds a newline");
    return DSC_ERR_USER;
  }

  /* The modules, exactly as dsc_trainer_open builds them. */
  drv_model_facts f;
  dsc_status st = drv_compile_step(ctx, o->model_path, o->batch, o->seq, 1, m, &f);
  if (st != DSC_OK) return st;
  dsc_train_config cfg;
  if ((st = dsc_train_config_from_module(*m, &cfg)) != DSC_OK) return st;
  cfg.batch = f.B, cfg.seq = f.T;
  if (o->lr > 0) cfg.opt.lr = o->lr;
  drv_run_settings rs = {
      .who = "compile", .B = f.B, .grad_accum = o->grad_accum, .precision = o->precision};
  if ((st = drv_apply_run_settings(ctx, &rs, &cfg)) != DSC_OK) return st;
  if ((st = drv_build_graphs(ctx, o->model_path, *m, &cfg, DSC_BACKEND_CPU, true, fwd)) != DSC_OK ||
      (st = drv_check_step(ctx, *m, f.B * cfg.grad_accum, f.T)) != DSC_OK)
    return st;

  char host[1024] = "";
  int arch = o->cuda_arch > 0 ? o->cuda_arch : 90;
  if (cuda) {
    snprintf(host, sizeof host, "sm_%d", arch);
  } else {
#ifdef DSC_HAVE_LLVM
    /* The kernel cache serves here too. */
    char cache_buf[4096];
    cg_llvm_jit *jit = cg_llvm_jit_new(ctx, cg_kernel_cache_dir(NULL, cache_buf, sizeof cache_buf));
    if (!jit) return DSC_ERR_INTERNAL;
    *jit_out = jit;
    cg_llvm_host(jit, host, sizeof host);
#endif
  }

  char *meta = ir_arena_printf(
      &w->arena,
      "format=%d\ndsc_version=%s\ntarget=%s\nhost=%s\nmodel=%s\nmodel_name=%s\nbatch=%" PRId64
      "\nseq=%" PRId64 "\ngrad_accum=%" PRId64 "\nprecision=%s\nvocab=%" PRId64
      "\nlr=%.17g\nmodules=step forward\n",
      DSC_PROGRAM_FORMAT, DSC_VERSION, target, host, model, dsc_module_name(*m), f.B, f.T,
      cfg.grad_accum, dsc_precision_name(cfg.precision), f.vocab, cfg.opt.lr);
  if (!meta || !add(w, "meta", meta, strlen(meta))) return oom(ctx);
  if ((st = write_module(w, "step", *m, cuda, arch, *jit_out)) != DSC_OK ||
      (st = write_module(w, "forward", *fwd, cuda, arch, *jit_out)) != DSC_OK)
    return st;
  return rt_dsx_write(ctx, o->out_path, w->s, w->n);
}

dsc_status dsc_program_compile(dsc_context *ctx, const dsc_compile_options *o,
                               dsc_compile_summary *sum) {
  memset(sum, 0, sizeof *sum);
  writer w;
  memset(&w, 0, sizeof w);
  w.ctx = ctx;
  ir_arena_init(&w.arena, ctx);
  dsc_module *m = NULL, *fwd = NULL;
  void *jit = NULL;
  dsc_status st = compile_inner(&w, o, &m, &fwd, &jit);
  if (st == DSC_OK) {
    sum->graphs = dsc_module_graph_count(m) + dsc_module_graph_count(fwd);
    sum->kernels = w.kernels;
    struct stat sb;
    if (stat(o->out_path, &sb) == 0) sum->bytes = (int64_t)sb.st_size;
  }
#ifdef DSC_HAVE_LLVM
  cg_llvm_jit_free(jit);
#endif
  dsc_module_free(m);
  dsc_module_free(fwd);
  ir_arena_release(&w.arena);
  return st;
}
