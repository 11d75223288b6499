/* The executor's front door (include/dsc/exec.h dsc_exec_new): the compile
 * step above the runtime. Checks what the backend can run, compiles every
 * graph of the module for its target (codegen/compile.c; cuda: for the SM
 * of the device the executor will use), then hands the compiled Programs to
 * the runtime (rt_exec_new), which owns them from then on. */
#include "codegen/codegen.h"
#include "driver/driver.h"
#include "runtime/runtime.h"

/* The CPU executor's arenas against this host, after lowering and before
 * the JIT compiles a kernel (cg_compile_options.check_lowered). */
static dsc_status check_cpu_arenas(dsc_context *ctx, cg_program *const *progs, int n) {
  int64_t need = 0; /* the params' tiers are the module's, shared by its graphs */
  if (n > 0) need = progs[0]->tier_bytes[CG_TIER_DEVICE] + progs[0]->tier_bytes[CG_TIER_HOST];
  for (int i = 0; i < n; i++) need += progs[i]->arena_bytes[CG_ARENA_WORK] + progs[i]->host_work_bytes;
  return rt_check_host_memory(ctx, "creating the CPU executor's arenas", need);
}

dsc_status drv_exec_new(dsc_module *m, const dsc_exec_options *opts, const dsc_program *program,
                        const char *program_module, dsc_exec **out) {
  *out = NULL;
  dsc_backend b = opts ? opts->backend : dsc_backend_default();
  dsc_status st = rt_exec_check(m, b);
  if (st == DSC_OK && opts && opts->threads > 0)
    st = rt_check_threads(dsc_module_context(m), opts->threads);
  if (st != DSC_OK) return st;
  const rt_executor *be = rt_executor_of(b);
  cg_compiled_module *c = NULL;
  if (be->compiled) {
    cg_compile_options co = {be->target, 0, opts ? opts->cache_dir : NULL, program,
                             program_module,
                             be->target == CG_TARGET_CPU ? check_cpu_arenas : NULL};
    if (be->target == CG_TARGET_CUDA) st = rt_cuda_device_arch(dsc_module_context(m), &co.cuda_arch);
    /* what the compile leaves resident outside the heap (thread stacks,
     * LLVM's mappings), for dsc_exec_memory_report */
    int64_t rss0 = rt_rss_bytes(), heap0 = rt_heap_bytes();
    if (st == DSC_OK) st = cg_compile_module(m, &co, &c);
    if (st != DSC_OK) return st;
    int64_t rss1 = rt_rss_bytes(), heap1 = rt_heap_bytes();
    c->compile_other = rss0 < 0 || rss1 < 0 || heap0 < 0 || heap1 < 0
                           ? -1
                           : rss1 - rss0 - (heap1 - heap0) - (int64_t)c->code_bytes;
    if (c->compile_other < 0 && rss0 >= 0 && heap0 >= 0) c->compile_other = 0;
  }
  return rt_exec_new(m, opts, c, out);
}

dsc_status dsc_exec_new(dsc_module *m, const dsc_exec_options *opts, dsc_exec **out) {
  return drv_exec_new(m, opts, NULL, NULL, out);
}

dsc_status dsc_exec_new_with_program(dsc_module *m, const dsc_exec_options *opts,
                                     const dsc_program *program, const char *program_module,
                                     dsc_exec **out) {
  return drv_exec_new(m, opts, program, program_module, out);
}
