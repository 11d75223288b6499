// The unit tests' environment, set before any test runs: they never read or
// write the user's kernel cache (~/.cache/dsc, codegen/compile.c), so
// counts of compiled kernels mean what they say. A test that wants a cache
// names its own directory (dsc_exec_options.cache_dir, cg_llvm_jit_new).
#include <stdlib.h>

namespace {
const int kernel_cache_off = setenv("DSC_CACHE_DIR", "off", 1);
}  // namespace
