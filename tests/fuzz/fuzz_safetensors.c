/* libFuzzer target: the safetensors reader (runtime/safetensors.c) on
 * arbitrary bytes. Any input must read or fail with a diagnostic; never
 * crash, leak, hang or take time quadratic in the header. A set that reads
 * and writes back must read again with the same names and types.
 *   ninja -C build-fuzz fuzz_safetensors
 *   build-fuzz/tests/fuzz/fuzz_safetensors -max_total_time=60 tests/crafted/files */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dsc/dsc.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char in_path[64], out_path[64];

static void cleanup(void) {
  unlink(in_path);
  unlink(out_path);
}

static void paths(void) {
  if (in_path[0]) return;
  atexit(cleanup);
  const char *tmp = getenv("TMPDIR");
  snprintf(in_path, sizeof in_path, "%.32s/fuzz_st_%d.in", tmp && *tmp ? tmp : "/tmp",
           (int)getpid());
  snprintf(out_path, sizeof out_path, "%.32s/fuzz_st_%d.out", tmp && *tmp ? tmp : "/tmp",
           (int)getpid());
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  paths();
  FILE *f = fopen(in_path, "wb");
  if (!f) return 0;
  size_t w = fwrite(data, 1, size, f);
  fclose(f);
  if (w != size) return 0;
  dsc_context *ctx = dsc_context_new(NULL, NULL);
  if (!ctx) return 0;
  dsc_tensor_set *s = NULL;
  dsc_status st = dsc_safetensors_read(ctx, in_path, &s);
  if (st == DSC_OK && !s) __builtin_trap();
  if (st != DSC_OK && s) __builtin_trap();
  if (st != DSC_OK && dsc_error_count(ctx) == 0) __builtin_trap();
  /* I64 values beyond 2^53 round in the double and may not fit back: the
   * writer refuses those, with a diagnostic. */
  if (s && dsc_safetensors_write(ctx, out_path, s) == DSC_OK) {
    dsc_tensor_set *again = NULL;
    if (dsc_safetensors_read(ctx, out_path, &again) != DSC_OK || again->n != s->n) __builtin_trap();
    for (int i = 0; i < s->n; i++) {
      const dsc_tensor *t = dsc_tensor_set_find(again, s->names[i]);
      if (!t || !dsc_type_equal(&t->type, &s->tensors[i]->type)) __builtin_trap();
    }
    dsc_tensor_set_free(ctx, again);
  }
  dsc_tensor_set_free(ctx, s);
  dsc_context_free(ctx);
  unlink(out_path);
  return 0;
}
