/* libFuzzer target: the model language frontend on arbitrary bytes.
 * Any input must compile or fail with a diagnostic; never crash, leak, hang
 * or report an error without a message. Build with -DDSC_FUZZ=ON and clang:
 *   cmake -S . -B build-fuzz -G Ninja -DDSC_FUZZ=ON -DCMAKE_C_COMPILER=clang \
 *         -DCMAKE_CXX_COMPILER=clang++ && ninja -C build-fuzz fuzz_frontend
 *   build-fuzz/tests/fuzz/fuzz_frontend tests/fuzz/corpus -max_total_time=60 */
#include <stddef.h>
#include <stdint.h>

#include "dsc/frontend.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  dsc_context *ctx = dsc_context_new(NULL, NULL);
  if (!ctx) return 0;
  /* small dims keep graphs small; relative imports resolve in a directory
   * that does not exist, so the fuzzer does not read the file system */
  dsc_dim_binding dims[2] = {{"B", 2}, {"T", 8}};
  dsc_frontend_options opts = {dims, 2, false};
  dsc_module *m = NULL;
  dsc_status s = dsc_compile_string(ctx, (const char *)data, size,
                                    "/nonexistent-dsc-fuzz/input.dsm", &opts, &m);
  if (s == DSC_OK && !m) __builtin_trap();
  if (s != DSC_OK && m) __builtin_trap();
  if (s == DSC_ERR_USER && dsc_error_count(ctx) == 0) __builtin_trap();
  dsc_module_free(m);
  dsc_context_free(ctx);
  return 0;
}
