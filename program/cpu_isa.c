/* The CPU's vector ISA (program/program.h "program/cpu_isa.c"), one answer
 * for the compile step (LLVM's target features) and the executor (which
 * GEMM microkernel runs): the host's best, lowered by $DSC_CPU_ISA so that
 * an AVX-512 machine can run, and test, what an AVX2-only one (AMD Zen 3)
 * or a baseline x86-64 would. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "program/program.h"

static const char *const isa_names[] = {"baseline", "avx2", "avx512"};

const char *cg_cpu_isa_name(cg_cpu_isa isa) {
  return isa >= CG_ISA_BASELINE && isa <= CG_ISA_AVX512 ? isa_names[isa] : "?";
}

cg_cpu_isa cg_cpu_isa_host(void) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  /* the AVX-512 subsets dsc's kernels use (Skylake-X and later; Zen 4) */
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
    return CG_ISA_AVX512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return CG_ISA_AVX2;
#endif
  return CG_ISA_BASELINE;
}

bool cg_cpu_isa_resolve(cg_cpu_isa *out, char *err, size_t errlen) {
  cg_cpu_isa host = cg_cpu_isa_host();
  *out = host;
  const char *env = getenv("DSC_CPU_ISA");
  if (!env || !env[0]) return true;
  for (int i = CG_ISA_BASELINE; i <= CG_ISA_AVX512; i++) {
    if (strcmp(env, isa_names[i]) != 0) continue;
    if ((cg_cpu_isa)i > host) {
      snprintf(err, errlen,
               "DSC_CPU_ISA=%s: this CPU has only %s (DSC_CPU_ISA can lower the ISA, not raise it)",
               env, isa_names[host]);
      return false;
    }
    *out = (cg_cpu_isa)i;
    return true;
  }
  snprintf(err, errlen, "DSC_CPU_ISA=%s: expected avx512, avx2 or baseline", env);
  return false;
}

cg_cpu_isa cg_cpu_isa_get(void) {
  cg_cpu_isa isa;
  char err[160];
  /* an invalid value is reported by the compile step (cg_cpu_isa_resolve);
   * here it falls back to what is safe: the host's, or baseline */
  if (cg_cpu_isa_resolve(&isa, err, sizeof err)) return isa;
  const char *env = getenv("DSC_CPU_ISA");
  return env && strcmp(env, "avx512") == 0 ? cg_cpu_isa_host() : CG_ISA_BASELINE;
}
