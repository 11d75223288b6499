/* libFuzzer target: the text IR parser on arbitrary bytes.
 * Any input must parse or fail with a diagnostic; never crash, leak or hang.
 * A module that parses must print, and its text must parse back and print
 * the same bytes (the round-trip guarantee of the text form).
 *   ninja -C build-fuzz fuzz_ir_text
 *   build-fuzz/tests/fuzz/fuzz_ir_text -max_total_time=60 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "dsc/ir.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  dsc_context *ctx = dsc_context_new(NULL, NULL);
  if (!ctx) return 0;
  dsc_module *m = NULL;
  dsc_status s = dsc_module_parse(ctx, (const char *)data, size, "fuzz.dsir", &m);
  if (s == DSC_OK && !m) __builtin_trap();
  if (s != DSC_OK && m) __builtin_trap();
  if (s == DSC_ERR_USER && dsc_error_count(ctx) == 0) __builtin_trap();
  if (m) {
    char *t1 = dsc_module_print_string(m);
    if (!t1) __builtin_trap();
    dsc_module *m2 = NULL;
    if (dsc_module_parse(ctx, t1, strlen(t1), "printed.dsir", &m2) != DSC_OK) __builtin_trap();
    char *t2 = dsc_module_print_string(m2);
    if (!t2 || strcmp(t1, t2) != 0) __builtin_trap();
    dsc_string_free(ctx, t2);
    dsc_string_free(ctx, t1);
    dsc_module_free(m2);
    dsc_module_free(m);
  }
  dsc_context_free(ctx);
  return 0;
}
