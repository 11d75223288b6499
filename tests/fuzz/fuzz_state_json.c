/* libFuzzer target: a checkpoint's state.json (runtime/checkpoint.c) on
 * arbitrary bytes, loaded as part of a step directory whose model and
 * optimizer files are empty sets. Any input must load or fail with a
 * diagnostic; never crash, leak or hang. A state that loads has its values
 * in range (step, loader position, a nonzero RNG).
 *   ninja -C build-fuzz fuzz_state_json
 *   build-fuzz/tests/fuzz/fuzz_state_json -max_total_time=60 tests/crafted/files */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dsc/dsc.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char dir[96], state[128];

static int write_file(const char *path, const void *p, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f) return 0;
  size_t w = fwrite(p, 1, n, f);
  return fclose(f) == 0 && w == n;
}

static void cleanup(void) {
  char p[160];
  const char *files[] = {"model.safetensors", "optimizer.safetensors", "state.json"};
  for (int i = 0; i < 3; i++) {
    snprintf(p, sizeof p, "%s/%s", dir, files[i]);
    unlink(p);
  }
  rmdir(dir);
}

/* The step directory, once: model.safetensors and optimizer.safetensors
 * hold no tensors ("{}" padded to 8 bytes). */
static int setup(void) {
  if (dir[0]) return 1;
  const char *tmp = getenv("TMPDIR");
  snprintf(dir, sizeof dir, "%.64s/fuzz_state_%d", tmp && *tmp ? tmp : "/tmp", (int)getpid());
  if (mkdir(dir, 0777) != 0) return 0;
  atexit(cleanup);
  static const char empty[16] = {8, 0, 0, 0, 0, 0, 0, 0, '{', '}', ' ', ' ', ' ', ' ', ' ', ' '};
  char p[160];
  snprintf(p, sizeof p, "%s/model.safetensors", dir);
  if (!write_file(p, empty, sizeof empty)) return 0;
  snprintf(p, sizeof p, "%s/optimizer.safetensors", dir);
  if (!write_file(p, empty, sizeof empty)) return 0;
  snprintf(state, sizeof state, "%s/state.json", dir);
  return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!setup() || !write_file(state, data, size)) return 0;
  dsc_context *ctx = dsc_context_new(NULL, NULL);
  if (!ctx) return 0;
  dsc_checkpoint *ck = NULL;
  dsc_status st = dsc_checkpoint_load(ctx, dir, NULL, 0, NULL, 0, &ck);
  if (st == DSC_OK && !ck) __builtin_trap();
  if (st != DSC_OK && ck) __builtin_trap();
  if (st != DSC_OK && dsc_error_count(ctx) == 0) __builtin_trap();
  if (ck) {
    const dsc_checkpoint_state *s = &ck->state;
    if (s->step < 0 || s->loader.epoch < 0 || s->loader.index < 0) __builtin_trap();
    if (!(s->rng[0] | s->rng[1] | s->rng[2] | s->rng[3])) __builtin_trap();
    for (int i = 0; i < s->n_extra; i++)
      if (!s->extra[i].key || !s->extra[i].value) __builtin_trap();
  }
  dsc_checkpoint_free(ctx, ck);
  dsc_context_free(ctx);
  return 0;
}
