/* The compile step (codegen/codegen.h "codegen/compile.c"): every graph of
 * a module lowered to a Program and its kernels compiled for one target,
 * handed to an executor as a cg_compiled_module (program/program.h). The
 * runtime never lowers or compiles: it runs what this step made.
 *
 * cpu: the LLVM JIT compiles each kernel to an object file (the kernel
 * cache keeps them; a program file (.dsx) may hold them prebuilt) and links
 * it into its session; the entries are the linked functions, valid while
 * the session lives, so the session is the compiled module's owner.
 * cuda: NVRTC compiles each Program's kernels into one cubin (cached), plus
 * the executor's own kernels; the executor loads them on its device. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/codegen.h"

typedef struct {
  dsc_context *ctx;
  ir_arena arena; /* Programs, kernel IR, tables */
  cg_compiled_module pub;
  cg_program **progs;
  cg_kernel_objects *objs;
  cg_llvm_jit *jit;       /* cpu */
  void **cubins;          /* cuda: per program (malloc'd) */
  void *helpers;          /* cuda (malloc'd) */
  const dsc_program *program; /* prebuilt cpu kernels (only while compiling) */
  const char *program_module;
} compiled;

static void release(void *owner) {
  compiled *c = owner;
  if (!c) return;
  cg_llvm_jit_free(c->jit);
  for (int i = 0; c->cubins && i < c->pub.n_programs; i++) free(c->cubins[i]);
  free(c->helpers);
  ir_arena_release(&c->arena);
  ir_free(c->ctx, c, sizeof *c);
}

const char *cg_kernel_cache_dir(const char *option, char *buf, size_t len) {
  /* as ccache and PyTorch's inductor: a per-user cache unless told */
  const char *dir = option && option[0] ? option : getenv("DSC_CACHE_DIR");
  if (dir && strcmp(dir, "off") == 0) return NULL;
  if (dir && dir[0]) return snprintf(buf, len, "%s", dir) < (int)len ? buf : NULL;
  const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
  int n = -1;
  if (xdg && xdg[0] == '/')
    n = snprintf(buf, len, "%s/dsc", xdg);
  else if (home && home[0])
    n = snprintf(buf, len, "%s/.cache/dsc", home);
  return n > 0 && n < (int)len ? buf : NULL;
}

/* The objects a program file holds for program p's kernels (section
 * "cpu/<module>/<graph>"; kernels it lacks or that changed get NULL): set in
 * objs/lens[0..p->n_kernels). */
static dsc_status prebuilt_objects(compiled *c, const char *graph, const cg_program *p,
                                   const void **objs, size_t *lens) {
  const dsc_program *prog = c->program;
  if (!prog || !c->program_module) return DSC_OK;
  /* Objects for another host or dsc would not load: compile instead (the
   * caller says why with dsc_program_cpu_usable). */
  char host[1024], name[300];
  cg_llvm_host(c->jit, host, sizeof host);
  if (!rt_program_cpu_fits(prog, host)) return DSC_OK;
  snprintf(name, sizeof name, "cpu/%s/%s", c->program_module, graph);
  const rt_dsx_section *sec = rt_dsx_find(rt_program_dsx(prog), name);
  if (!sec) return DSC_OK;
  int found = rt_unpack_kernel_objects(sec->data, sec->size, p->kernel_info, p->n_kernels, objs, lens);
  if (found < 0) {
    dsc_loc at = {dsc_program_path(prog), 0, 0};
    ir_error(c->ctx, at, "not a valid .dsx file: section '%s' is malformed", sec->name);
    return DSC_ERR_USER;
  }
  c->pub.prebuilt += found;
  return DSC_OK;
}

/* Every program's kernels in one batch, so that the JIT compiles each
 * distinct kernel once and all of them in parallel. */
static dsc_status compile_cpu(compiled *c, dsc_module *m, const char *cache) {
  if (!(c->jit = cg_llvm_jit_new(c->ctx, cache))) return DSC_ERR_INTERNAL;
  size_t total = 0;
  for (int i = 0; i < c->pub.n_programs; i++) total += (size_t)c->progs[i]->n_kernels;
  kir_kernel **all = ir_arena_alloc(&c->arena, sizeof *all * (total + 1));
  cg_cpu_kernel_fn *fns = ir_arena_alloc(&c->arena, sizeof *fns * (total + 1));
  const void **objs = ir_arena_alloc(&c->arena, sizeof *objs * (total + 1));
  size_t *lens = ir_arena_alloc(&c->arena, sizeof *lens * (total + 1));
  if (!all || !fns || !objs || !lens) return DSC_ERR_INTERNAL;
  memset(objs, 0, sizeof *objs * (total + 1));
  memset(lens, 0, sizeof *lens * (total + 1));
  size_t at = 0;
  for (int i = 0; i < c->pub.n_programs; i++) {
    cg_program *p = c->progs[i];
    c->objs[i].entries = fns + at;
    for (int k = 0; k < p->n_kernels; k++) all[at + (size_t)k] = p->kernels[k];
    const char *gname = dsc_graph_name(dsc_module_graph(m, i));
    dsc_status st = prebuilt_objects(c, gname, p, objs + at, lens + at);
    if (st != DSC_OK) return st;
    at += (size_t)p->n_kernels;
  }
  dsc_status st = cg_llvm_compile_with(c->jit, all, (int)total, fns, objs, lens);
  if (st != DSC_OK) return st;
  cg_llvm_jit_stats(c->jit, &c->pub.compiled, &c->pub.cached);
  c->pub.code_bytes = cg_llvm_jit_code_bytes(c->jit);
  return DSC_OK;
}

static dsc_status compile_cuda(compiled *c, int arch, const char *cache) {
  c->cubins = ir_arena_alloc(&c->arena, sizeof(void *) * (size_t)(c->pub.n_programs + 1));
  if (!c->cubins) return DSC_ERR_INTERNAL;
  memset(c->cubins, 0, sizeof(void *) * (size_t)(c->pub.n_programs + 1));
  bool cached = false;
  dsc_status st = cg_cuda_compile_helpers(c->ctx, arch, cache, &c->helpers, &c->pub.helpers_len,
                                          &cached);
  if (st != DSC_OK) return st;
  c->pub.helpers = c->helpers;
  cached ? c->pub.cached++ : c->pub.compiled++;
  for (int i = 0; i < c->pub.n_programs; i++) {
    cg_program *p = c->progs[i];
    cg_kernel_objects *o = &c->objs[i];
    cg_cuda_launch *launch =
        ir_arena_alloc(&c->arena, sizeof(cg_cuda_launch) * (size_t)(p->n_kernels + 1));
    if (!launch) return DSC_ERR_INTERNAL;
    o->launch = launch;
    for (int k = 0; k < p->n_kernels; k++)
      if (!cg_cuda_launch_config(c->ctx, p->kernels[k], &launch[k])) return DSC_ERR_INTERNAL;
    if (p->n_kernels == 0) continue;
    ir_arena scratch;
    ir_arena_init(&scratch, c->ctx);
    st = cg_cuda_compile_program(c->ctx, &scratch, p, arch, cache, &c->cubins[i], &o->object_len,
                                 &cached);
    ir_arena_release(&scratch);
    if (st != DSC_OK) return st;
    o->object = c->cubins[i];
    cached ? c->pub.cached++ : (c->pub.compiled += p->n_kernels);
  }
  return DSC_OK;
}

dsc_status cg_compile_module(dsc_module *m, const cg_compile_options *o,
                             cg_compiled_module **out) {
  *out = NULL;
  dsc_context *ctx = dsc_module_context(m);
  compiled *c = ir_alloc(ctx, sizeof *c);
  if (!c) {
    ir_error(ctx, ir_no_loc, "compile: out of memory");
    return DSC_ERR_INTERNAL;
  }
  memset(c, 0, sizeof *c);
  c->pub.compile_other = -1; /* the caller measures it (driver/exec_new.c) */
  c->ctx = ctx;
  ir_arena_init(&c->arena, ctx);
  c->program = o->program;
  c->program_module = o->program_module;
  c->pub.target = o->target;
  c->pub.cuda_arch = o->cuda_arch;
  c->pub.owner = c;
  c->pub.release = release;
  int n = dsc_module_graph_count(m);
  c->pub.n_programs = n;
  c->progs = ir_arena_alloc(&c->arena, sizeof *c->progs * (size_t)(n + 1));
  c->objs = ir_arena_alloc(&c->arena, sizeof *c->objs * (size_t)(n + 1));
  dsc_status st = c->progs && c->objs ? DSC_OK : DSC_ERR_INTERNAL;
  if (st == DSC_OK) {
    memset(c->objs, 0, sizeof *c->objs * (size_t)(n + 1));
    c->pub.programs = c->progs;
    c->pub.kernels = c->objs;
  }
  if (st == DSC_OK && o->target == CG_TARGET_CPU) {
    cg_cpu_isa isa;
    char why[160];
    if (!cg_cpu_isa_resolve(&isa, why, sizeof why)) {
      ir_error(ctx, ir_no_loc, "%s", why);
      st = DSC_ERR_USER;
    }
  }
  for (int i = 0; st == DSC_OK && i < n; i++)
    st = cg_lower_graph(dsc_module_graph(m, i), &c->arena, &c->progs[i]);
  if (st == DSC_OK && o->check_lowered) st = o->check_lowered(ctx, c->progs, n);
  char cache_buf[4096];
  const char *cache = cg_kernel_cache_dir(o->cache_dir, cache_buf, sizeof cache_buf);
  if (st == DSC_OK)
    st = o->target == CG_TARGET_CUDA ? compile_cuda(c, o->cuda_arch, cache)
                                     : compile_cpu(c, m, cache);
  c->program = NULL, c->program_module = NULL;
  if (st != DSC_OK) {
    if (st == DSC_ERR_INTERNAL && dsc_diag_count(ctx) == 0)
      ir_error(ctx, ir_no_loc, "compile: out of memory");
    release(c);
    return st;
  }
  *out = &c->pub;
  return DSC_OK;
}

/* ---- program files: whether their cpu kernels fit this host ---- */

bool dsc_program_cpu_usable(const dsc_program *p, char *why, size_t n) {
  const char *target = dsc_program_meta(p, "target");
  if (!target || strcmp(target, "cpu") != 0) {
    snprintf(why, n, "it holds %s kernels (%s), not cpu ones", target ? target : "no",
             dsc_program_meta(p, "host") ? dsc_program_meta(p, "host") : "?");
    return false;
  }
  const char *ver = dsc_program_meta(p, "dsc_version");
  if (!ver || strcmp(ver, DSC_VERSION) != 0) {
    snprintf(why, n, "it was written by dsc %s, this is dsc %s", ver ? ver : "?", DSC_VERSION);
    return false;
  }
#ifdef DSC_HAVE_LLVM
  char here[1024];
  if (!cg_llvm_host_string(rt_program_context(p), here, sizeof here)) {
    snprintf(why, n, "the host CPU cannot be queried");
    return false;
  }
  const char *there = dsc_program_meta(p, "host");
  if (there && strcmp(there, here) == 0) return true;
  /* Name the first part that differs: triple, cpu, features, llvm. */
  char a[1024], b[1024];
  snprintf(a, sizeof a, "%s", there ? there : "");
  snprintf(b, sizeof b, "%s", here);
  static const char *parts[] = {"target triple", "CPU", "CPU features", "LLVM version"};
  char *sa = NULL, *sb = NULL, *ta = strtok_r(a, " ", &sa), *tb = strtok_r(b, " ", &sb);
  int k = 0;
  while (k < 3 && ta && tb && strcmp(ta, tb) == 0)
    ta = strtok_r(NULL, " ", &sa), tb = strtok_r(NULL, " ", &sb), k++;
  if (k == 2)
    snprintf(why, n, "its kernels were compiled for other CPU features than this host's");
  else
    snprintf(why, n, "its kernels were compiled for %s %s, this host is %s", parts[k],
             ta ? ta : "?", tb ? tb : "?");
  return false;
#else
  snprintf(why, n, "this dsc has no cpu backend");
  return false;
#endif
}
